//! All four nodes at once: connect concurrently, run a step on every node
//! concurrently; the step succeeds only when every node's part does.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::link::{LinkConfig, LinkState, NodeLink, NodeSockets, Timings};

/// The links to every storage node, in config order.
#[derive(Debug)]
pub struct NodeLinks {
    links: Vec<NodeLink>,
}

/// One node's part of a step.
#[derive(Debug)]
pub struct NodeResult<T> {
    pub node: String,
    pub result: Result<T>,
}

/// Every node's result of a step, in config order.
#[derive(Debug)]
pub struct StepReport<T> {
    pub nodes: Vec<NodeResult<T>>,
}

impl<T> StepReport<T> {
    pub fn all_ok(&self) -> bool {
        self.nodes.iter().all(|n| n.result.is_ok())
    }

    /// The names of the nodes whose part failed.
    pub fn failed(&self) -> Vec<&str> {
        self.nodes
            .iter()
            .filter(|n| n.result.is_err())
            .map(|n| n.node.as_str())
            .collect()
    }

    /// Every node's value, or one error naming every node that failed and why.
    pub fn into_all(self) -> Result<Vec<(String, T)>> {
        if self.all_ok() {
            return Ok(self
                .nodes
                .into_iter()
                .filter_map(|n| n.result.ok().map(|v| (n.node, v)))
                .collect());
        }
        let failed: Vec<(String, String)> = self
            .nodes
            .into_iter()
            .filter_map(|n| n.result.err().map(|e| (n.node, e.to_string())))
            .collect();
        Err(Error::StepFailed {
            nodes: failed
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            details: failed
                .iter()
                .map(|(_, e)| e.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}

impl NodeLinks {
    pub fn new(configs: Vec<LinkConfig>, timings: Timings) -> Result<Self> {
        let mut links = Vec::with_capacity(configs.len());
        for c in configs {
            if links.iter().any(|l: &NodeLink| l.name() == c.name) {
                return Err(Error::Config {
                    node: c.name,
                    what: "node listed twice".into(),
                });
            }
            links.push(NodeLink::new(c, timings)?);
        }
        Ok(NodeLinks { links })
    }

    pub fn links(&self) -> &[NodeLink] {
        &self.links
    }

    pub fn get(&self, node: &str) -> Option<&NodeLink> {
        self.links.iter().find(|l| l.name() == node)
    }

    /// Start every supervisor (they connect concurrently).
    pub fn start_all(&self) {
        for l in &self.links {
            l.start();
        }
    }

    pub fn states(&self) -> Vec<(String, LinkState)> {
        self.links
            .iter()
            .map(|l| (l.name().to_string(), l.state()))
            .collect()
    }

    /// Wait (concurrently, at most `timeout` each) until every link is up.
    pub async fn ensure_all_up(&self, timeout: Duration) -> StepReport<NodeSockets> {
        let results = join_all(self.links.iter().map(|l| l.ensure_up(timeout))).await;
        self.report(results)
    }

    /// Run `f` on every node concurrently with that node's local sockets.
    /// A node whose link does not come up within `link_timeout` fails with
    /// the link's error and `f` is not called for it; the step succeeds only
    /// if every node's part does ([`StepReport::into_all`]).
    pub async fn step<T, E, F, Fut>(&self, link_timeout: Duration, f: F) -> StepReport<T>
    where
        F: Fn(NodeSockets) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: std::fmt::Display,
    {
        let f = &f;
        let results = join_all(self.links.iter().map(|l| async move {
            let socks = l.ensure_up(link_timeout).await?;
            f(socks).await.map_err(|e| Error::Step {
                node: l.name().to_string(),
                detail: e.to_string(),
            })
        }))
        .await;
        self.report(results)
    }

    fn report<T>(&self, results: Vec<Result<T>>) -> StepReport<T> {
        StepReport {
            nodes: self
                .links
                .iter()
                .zip(results)
                .map(|(l, result)| NodeResult {
                    node: l.name().to_string(),
                    result,
                })
                .collect(),
        }
    }

    /// Close every link concurrently (masters ended, sockets unlinked).
    pub async fn close_all(&self) {
        join_all(self.links.iter().map(|l| l.close())).await;
    }
}

/// Poll every future concurrently on this task (no spawn: the futures borrow
/// the links), results in input order.
async fn join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter()
        .map(|o| o.expect("every future finished"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(parts: Vec<(&str, std::result::Result<u32, &str>)>) -> StepReport<u32> {
        StepReport {
            nodes: parts
                .into_iter()
                .map(|(n, r)| NodeResult {
                    node: n.to_string(),
                    result: r.map_err(|d| Error::Step {
                        node: n.to_string(),
                        detail: d.to_string(),
                    }),
                })
                .collect(),
        }
    }

    #[test]
    fn a_step_succeeds_only_when_every_node_does_and_names_the_failed_ones() {
        let ok = report(vec![
            ("da1", Ok(1)),
            ("da2", Ok(2)),
            ("da3", Ok(3)),
            ("da4", Ok(4)),
        ]);
        assert!(ok.all_ok());
        assert_eq!(ok.into_all().expect("ok").len(), 4);

        let bad = report(vec![
            ("da1", Ok(1)),
            ("da2", Err("wipe not confirmed")),
            ("da3", Ok(3)),
            ("da4", Err("server still running")),
        ]);
        assert_eq!(bad.failed(), vec!["da2", "da4"]);
        let e = bad.into_all().expect_err("two failed").to_string();
        assert_eq!(
            e,
            "step failed on da2, da4: da2: wipe not confirmed; da4: server still running"
        );
    }

    #[tokio::test]
    async fn join_all_runs_concurrently_and_keeps_order() {
        let t = std::time::Instant::now();
        let out = join_all([300u64, 100, 200].map(|ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ms
        }))
        .await;
        assert_eq!(out, vec![300, 100, 200]);
        assert!(
            t.elapsed() < Duration::from_millis(550),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_node_listed_twice_is_refused() {
        let c = LinkConfig {
            name: "da1".into(),
            host: "da1".into(),
            user: "root".into(),
            port: None,
            identity_file: "/id".into(),
            known_hosts_file: "/kh".into(),
            ssh_config_file: None,
            node_socket: "/n.sock".into(),
            podman_socket: "/p.sock".into(),
            forward_dir: "/run/x".into(),
        };
        let e = NodeLinks::new(vec![c.clone(), c], Timings::default()).expect_err("dup");
        assert_eq!(e.to_string(), "da1: invalid link config: node listed twice");
    }
}
