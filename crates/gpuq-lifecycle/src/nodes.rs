//! The storage nodes, called at once: the one fan-out of the DAOS path.
//!
//! Every node step (preflight, start, stop, wipe) and every operator's
//! question to all nodes (install, metrics) goes through [`call_all`]:
//! one task per node, each within the call's deadline, results in node
//! order. A node whose socket **refused the connection** — its SSH link is
//! being re-made (a master can die between the links check and the call) —
//! is asked again, alone, a few times ([`Retry::Refused`]): a refused
//! connection delivered nothing, so asking again is safe for every call,
//! idempotent or not. Every other error is the node's answer and is
//! returned as it is.

use gpuq_client::{Client, ClientError};
use hyper::Method;
use std::path::PathBuf;
use std::time::Duration;

/// One storage node's gpuq-node API.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub client: Client,
}

impl Node {
    pub fn new(name: impl Into<String>, socket: impl Into<PathBuf>) -> Self {
        Node {
            name: name.into(),
            client: Client::new(socket.into()),
        }
    }
}

/// Whether a node whose socket refused the connection is asked again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Up to [`CONNECT_RETRIES`] more times, [`CONNECT_RETRY_DELAY`] apart
    /// (the lease's steps: a link being re-made must not hold a lease).
    Refused,
    /// Once only (a metrics scrape, which must answer at once).
    Never,
}

/// How often, and how far apart, a refused node is asked again.
pub const CONNECT_RETRIES: usize = 4;
pub const CONNECT_RETRY_DELAY: Duration = Duration::from_millis(1500);

/// `method path` with `body` on every node at once, each within
/// `deadline`; (node, result) in node order.
pub async fn call_all<T>(
    nodes: &[Node],
    deadline: Duration,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
    retry: Retry,
) -> Vec<(String, Result<T, ClientError>)>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    call_each(nodes, deadline, method, path, &|_| body.clone(), retry).await
}

/// `POST path` with `body` on `node` alone, within `deadline`, asked
/// again while its socket refuses ([`Retry::Refused`]).
pub async fn call_one<T>(
    node: &Node,
    deadline: Duration,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<T, ClientError>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    call_all(
        std::slice::from_ref(node),
        deadline,
        Method::POST,
        path,
        body,
        Retry::Refused,
    )
    .await
    .pop()
    .map(|(_, r)| r)
    .unwrap_or_else(|| {
        Err(ClientError::Protocol {
            socket: node.client.socket().to_path_buf(),
            what: "no answer".into(),
        })
    })
}

/// [`call_all`] with each node's own body, `body_of(node name)` (the
/// start: only the broker's dmg node gets the lease's dmg access).
pub async fn call_each<T>(
    nodes: &[Node],
    deadline: Duration,
    method: Method,
    path: &str,
    body_of: &(dyn Fn(&str) -> Option<serde_json::Value> + Sync),
    retry: Retry,
) -> Vec<(String, Result<T, ClientError>)>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    let mut res = once(nodes, deadline, &method, path, body_of).await;
    if retry == Retry::Never {
        return res;
    }
    for _ in 0..CONNECT_RETRIES {
        let refused: Vec<Node> = nodes
            .iter()
            .filter(|n| res.iter().any(|(name, r)| name == &n.name && is_refused(r)))
            .cloned()
            .collect();
        if refused.is_empty() {
            break;
        }
        tokio::time::sleep(CONNECT_RETRY_DELAY).await;
        for (name, r) in once(&refused, deadline, &method, path, body_of).await {
            if let Some(slot) = res.iter_mut().find(|(n, _)| *n == name) {
                slot.1 = r;
            }
        }
    }
    res
}

fn is_refused<T>(r: &Result<T, ClientError>) -> bool {
    matches!(r, Err(ClientError::Connect { .. }))
}

async fn once<T>(
    nodes: &[Node],
    deadline: Duration,
    method: &Method,
    path: &str,
    body_of: &(dyn Fn(&str) -> Option<serde_json::Value> + Sync),
) -> Vec<(String, Result<T, ClientError>)>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    let handles: Vec<_> = nodes
        .iter()
        .map(|n| {
            let (client, method, path, body) = (
                n.client.clone(),
                method.clone(),
                path.to_string(),
                body_of(&n.name),
            );
            let call = async move {
                client
                    .call_within::<T>(deadline, method, &path, body.as_ref())
                    .await
            };
            (n.name.clone(), tokio::spawn(call))
        })
        .collect();
    let mut out = Vec::new();
    for (name, h) in handles {
        let r = match h.await {
            Ok(r) => r,
            Err(e) => Err(ClientError::Protocol {
                socket: PathBuf::new(),
                what: format!("task failed: {e}"),
            }),
        };
        out.push((name, r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose socket is not there yet (its link is being re-made)
    /// is asked again and answers; one that never comes is reported as
    /// refused after the retries, in node order.
    #[tokio::test]
    async fn a_refused_node_is_asked_again_and_an_absent_one_reported() {
        let dir = tempfile::tempdir().unwrap();
        let late = dir.path().join("late.sock");
        let never = dir.path().join("never.sock");
        let nodes = vec![Node::new("late", &late), Node::new("never", &never)];
        // The late node's socket appears after the first round.
        let serve = {
            let late = late.clone();
            tokio::spawn(async move {
                tokio::time::sleep(CONNECT_RETRY_DELAY / 2).await;
                let l = tokio::net::UnixListener::bind(&late).unwrap();
                let (s, _) = l.accept().await.unwrap();
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(hyper::body::Bytes::from("{\"ok\":true}")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            })
        };
        let t = std::time::Instant::now();
        let res: Vec<(String, Result<serde_json::Value, ClientError>)> = call_all(
            &nodes,
            Duration::from_secs(5),
            Method::GET,
            "/v1/status",
            None,
            Retry::Refused,
        )
        .await;
        serve.abort();
        assert_eq!(res[0].0, "late");
        assert_eq!(res[0].1.as_ref().unwrap()["ok"], true);
        assert_eq!(res[1].0, "never");
        assert!(is_refused(&res[1].1), "{:?}", res[1].1);
        // Every retry round ran for the absent one.
        assert!(t.elapsed() >= CONNECT_RETRY_DELAY * CONNECT_RETRIES as u32);
    }

    #[tokio::test]
    async fn without_retry_a_refused_node_is_reported_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let nodes = vec![Node::new("gone", dir.path().join("gone.sock"))];
        let t = std::time::Instant::now();
        let res: Vec<(String, Result<serde_json::Value, ClientError>)> = call_all(
            &nodes,
            Duration::from_secs(5),
            Method::GET,
            "/v1/metrics",
            None,
            Retry::Never,
        )
        .await;
        assert!(is_refused(&res[0].1));
        assert!(t.elapsed() < CONNECT_RETRY_DELAY);
    }
}
