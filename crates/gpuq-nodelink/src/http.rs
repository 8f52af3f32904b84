//! One HTTP/1.1 request over a unix socket (a forwarded one, usually), with
//! a deadline. hyper, no connection pool: the forwards are local and a
//! connection costs one SSH channel open (a round trip to the node).

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// Send `method path` (with an optional JSON body) to the socket; returns the
/// status and the whole body, or a one-line reason.
pub async fn request(
    socket: &Path,
    method: Method,
    path: &str,
    json: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), String> {
    match tokio::time::timeout(timeout, request_inner(socket, method, path, json)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// `GET path`.
pub async fn get(
    socket: &Path,
    path: &str,
    timeout: Duration,
) -> Result<(StatusCode, Bytes), String> {
    request(socket, Method::GET, path, None, timeout).await
}

async fn request_inner(
    socket: &Path,
    method: Method,
    path: &str,
    json: Option<Vec<u8>>,
) -> Result<(StatusCode, Bytes), String> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    // Go's HTTP server (Podman) rejects HTTP/1.1 requests without Host.
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, "d");
    if json.is_some() {
        req = req.header(CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(json.unwrap_or_default())))
        .map_err(|e| format!("request: {e}"))?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            // A forward whose far end is not listening accepts the local
            // connection, then closes it: hyper sees an incomplete message.
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    conn.abort();
    result
}
