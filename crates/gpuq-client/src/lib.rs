//! A client for the gpuq broker API: "reqwest, but for one unix socket".
//!
//! One connection per request (HTTP/1.1 over `AF_UNIX`); the broker learns
//! who we are from the socket itself, so nothing here carries identity.

use bytes::Bytes;
use gpuq_protocol::ErrorBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("cannot connect to {socket}: {source}")]
    Connect {
        socket: PathBuf,
        source: std::io::Error,
    },
    /// The broker refused; its one-line explanation is in `body.error`.
    #[error("{}", .body.error)]
    Api { status: StatusCode, body: ErrorBody },
    #[error("talking to {socket}: {what}")]
    Protocol { socket: PathBuf, what: String },
    /// No whole answer within the call's deadline ([`Client::call_within`]);
    /// the request was abandoned and its connection closed.
    #[error("no answer from {socket} within {}; the request was abandoned", secs(*.after))]
    Timeout { socket: PathBuf, after: Duration },
}

/// `5s`, `1.5s`.
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// Ends a request's connection task when the request is done or dropped,
/// so that an abandoned request's connection is closed at once.
struct ConnTask(tokio::task::JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Client {
            socket: socket.into(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The whole body of an answer.
    async fn body(&self, body: Incoming) -> Result<Bytes, ClientError> {
        Ok(body
            .collect()
            .await
            .map_err(|e| self.protocol(e))?
            .to_bytes())
    }

    fn protocol(&self, what: impl std::fmt::Display) -> ClientError {
        ClientError::Protocol {
            socket: self.socket.clone(),
            what: what.to_string(),
        }
    }

    /// One HTTP/1.1 connection to the broker (`upgrades`: it may be handed
    /// over after a `101`), and the task that drives it.
    async fn connect(
        &self,
        upgrades: bool,
    ) -> Result<
        (
            hyper::client::conn::http1::SendRequest<Full<Bytes>>,
            tokio::task::JoinHandle<()>,
        ),
        ClientError,
    > {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| ClientError::Connect {
                socket: self.socket.clone(),
                source,
            })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.protocol(e))?;
        let task = tokio::spawn(async move {
            let _ = if upgrades {
                conn.with_upgrades().await
            } else {
                conn.await
            };
        });
        Ok((sender, task))
    }

    /// Send one request; returns the response with its body still streaming.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, ClientError> {
        // The connection lives on its own until the answer is read.
        Ok(self.send(method, path, body).await?.0)
    }

    /// [`Client::raw`], and the connection's task.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(Response<Incoming>, tokio::task::JoinHandle<()>), ClientError> {
        let (mut sender, task) = self.connect(false).await?;
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://gpuq{path}"))
            .header("host", "gpuq");
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.protocol(e))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| self.protocol(e))?;
        Ok((resp, task))
    }

    /// Send a JSON request and decode a JSON answer; a non-2xx answer
    /// becomes [`ClientError::Api`] with the broker's message.
    pub async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, ClientError> {
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| self.protocol(e))?;
        let (resp, task) = self.send(method, path, body).await?;
        // Dropped with this call (done, or abandoned by a deadline): the
        // connection closes with it.
        let _conn = ConnTask(task);
        let status = resp.status();
        let bytes = self.body(resp.into_body()).await?;
        if !status.is_success() {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| self.protocol(format!("bad answer: {e}")))
    }

    /// [`Client::call`] with a deadline for the whole exchange (connect,
    /// request, the whole answer): past it the call fails with
    /// [`ClientError::Timeout`] and its connection is closed, so a hung
    /// peer never holds the caller.
    pub async fn call_within<T: serde::de::DeserializeOwned>(
        &self,
        deadline: Duration,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(deadline, self.call(method, path, body)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout {
                socket: self.socket.clone(),
                after: deadline,
            }),
        }
    }

    /// GET `path` and copy the streamed body to `out` as it arrives.
    pub async fn stream_to(
        &self,
        path: &str,
        out: &mut (impl std::io::Write + ?Sized),
    ) -> Result<(), ClientError> {
        let resp = self.raw(Method::GET, path, None).await?;
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            return Err(api_error(status, &self.body(body).await?));
        }
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.protocol(e))?;
            if let Some(data) = frame.data_ref() {
                out.write_all(data).map_err(|e| self.protocol(e))?;
                out.flush().map_err(|e| self.protocol(e))?;
            }
        }
        Ok(())
    }

    /// POST `body` (JSON) asking to switch to `protocol`; on `101` the
    /// connection is handed over (`gpuq daos-exec`). Any other answer is
    /// the broker's refusal, as [`ClientError::Api`].
    pub async fn upgrade(
        &self,
        path: &str,
        protocol: &str,
        body: Vec<u8>,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, ClientError> {
        let (mut sender, _task) = self.connect(true).await?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("http://gpuq{path}"))
            .header("host", "gpuq")
            .header("content-type", "application/json")
            .header(hyper::header::CONNECTION, "Upgrade")
            .header(hyper::header::UPGRADE, protocol)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| self.protocol(e))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| self.protocol(e))?;
        let status = resp.status();
        if status == StatusCode::SWITCHING_PROTOCOLS {
            let up = hyper::upgrade::on(resp)
                .await
                .map_err(|e| self.protocol(e))?;
            return Ok(TokioIo::new(up));
        }
        let bytes = self.body(resp.into_body()).await?;
        Err(api_error(status, &bytes))
    }
}

/// A refusal: the broker's one-line message, or its status if the body is
/// not one of ours.
fn api_error(status: StatusCode, bytes: &[u8]) -> ClientError {
    let body = serde_json::from_slice::<ErrorBody>(bytes).unwrap_or_else(|_| ErrorBody {
        code: gpuq_protocol::ErrorCode::Internal,
        error: format!("broker answered {status}"),
    });
    ClientError::Api { status, body }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A peer that reads the request and never answers (a stopped node
    /// helper behind its socket): the call fails at its deadline and the
    /// peer sees the connection closed.
    #[tokio::test]
    async fn a_call_to_a_peer_that_never_answers_fails_at_its_deadline_and_closes_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("hung.sock");
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        let peer = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            // Read until the client closes: 0 bytes, or a reset.
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        });
        let c = Client::new(&sock);
        let t = std::time::Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            c.call_within::<serde_json::Value>(
                Duration::from_millis(300),
                Method::POST,
                "/v1/leases/L/stop",
                None::<&()>,
            ),
        )
        .await
        .expect("the call hung past the test's 20 s");
        let e = r.unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(
            e.to_string()
                .starts_with(&format!("no answer from {} within 0.3s", sock.display())),
            "{e}"
        );
        tokio::time::timeout(Duration::from_secs(5), peer)
            .await
            .expect("the abandoned connection was left open")
            .unwrap();
    }
}
