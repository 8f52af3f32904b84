//! HTTP/1.1 + JSON on a unix socket. Every request is attributed to the
//! peer's UID/GID/groups as the kernel reports them for the connection; the
//! request body never says who is asking.
//!
//! What one user may take of it (connections, deadlines, request size) is
//! bounded by `[broker]`'s limits: see [`crate::limits`].

use crate::broker::{Broker, Peer};
use crate::error::ApiError;
use crate::limits::{Refusing, Slot, Stalling, REFUSAL_TIMEOUT};
use bytes::Bytes;
use gpuq_protocol::{routes, JobId, LockRequest, SubmitRequest};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};

/// One connection as the handlers see it.
#[derive(Debug, Clone)]
struct Conn {
    peer: Peer,
    /// The connection's place in the caps; also its UID's turns.
    slot: Arc<Slot>,
    /// Set by a handler whose answer is a stream (`follow`, `daos-exec`):
    /// its writes may wait on the reader without a deadline.
    streaming: Arc<AtomicBool>,
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(body))
        .unwrap_or_else(|_| Response::new(full("")))
}

fn error(e: &ApiError) -> Response<Body> {
    let (status, _) = e.status_and_code();
    json(status, &e.body())
}

/// Accept connections until the process ends. Takes a bound listener (so
/// tests and socket activation can hand one in).
pub async fn serve(listener: UnixListener, broker: Arc<Broker>) {
    let conns = Arc::clone(broker.connections());
    gpuq_serve::accept_loop(listener, "broker API", move |stream, cred| {
        let peer = Peer {
            uid: cred.uid,
            gid: cred.gid,
            pid: cred.pid,
            groups: gpuq_sys::proc::peer_groups(stream.as_raw_fd()).unwrap_or_default(),
        };
        match conns.admit(peer.uid) {
            Ok(slot) => {
                tokio::spawn(serve_connection(stream, Arc::clone(&broker), peer, slot));
            }
            Err(e) => match conns.refusing() {
                Some(place) => {
                    tokio::spawn(refuse(stream, e, place));
                }
                None => {
                    tracing::debug!(uid = peer.uid, "{e}; closed without an answer");
                }
            },
        }
    })
    .await
}

async fn serve_connection(stream: UnixStream, broker: Arc<Broker>, peer: Peer, slot: Slot) {
    let limits = &broker.config().limits;
    let streaming = Arc::new(AtomicBool::new(false));
    let io = Stalling::new(
        stream,
        Duration::from_secs(limits.write_timeout_secs),
        Arc::clone(&streaming),
    );
    let slot = Arc::new(slot);
    let conn = Conn {
        peer,
        streaming,
        slot: Arc::clone(&slot),
    };
    let request_timeout = Duration::from_secs(limits.request_timeout_secs);
    let b = Arc::clone(&broker);
    let svc = hyper::service::service_fn(move |req| {
        let broker = Arc::clone(&b);
        let conn = conn.clone();
        async move { Ok::<_, Infallible>(handle(&broker, &conn, req).await) }
    });
    // hyper's header timer starts whenever a request head is awaited,
    // so it also closes an idle keep-alive connection.
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(request_timeout)
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    if let Err(e) = served.await {
        tracing::debug!("connection: {e}");
    }
    // The slot is held until the connection (or its upgrade) is gone.
    drop(slot);
}

/// Answer an over-cap connection with its one-line error and close it.
async fn refuse(stream: UnixStream, e: ApiError, place: Refusing) {
    tracing::debug!("refused a connection: {e}");
    let answer = Arc::new(e);
    let svc = hyper::service::service_fn(move |_req| {
        let answer = Arc::clone(&answer);
        async move {
            let mut resp = error(&answer);
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
            Ok::<_, Infallible>(resp)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(REFUSAL_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), svc);
    let _ = tokio::time::timeout(REFUSAL_TIMEOUT, served).await;
    drop(place);
}

async fn read_json<T: serde::de::DeserializeOwned>(
    broker: &Broker,
    req: Request<Incoming>,
) -> Result<T, ApiError> {
    let limits = &broker.config().limits;
    let max = limits.max_request_bytes;
    if let Some(len) = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > max {
            return Err(ApiError::TooLarge(max));
        }
    }
    // The head arrived within hyper's deadline; the body gets one of its own
    // (a client that sends a byte a second must not hold the connection).
    let secs = limits.request_timeout_secs;
    let bytes = tokio::time::timeout(
        Duration::from_secs(secs),
        Limited::new(req.into_body(), max).collect(),
    )
    .await
    .map_err(|_| ApiError::Timeout(secs))?
    .map_err(|_| ApiError::TooLarge(max))?
    .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("malformed request body: {e}")))
}

fn query_flag(req: &Request<Incoming>, name: &str) -> bool {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == name || kv == format!("{name}=1") || kv == format!("{name}=true"))
}

/// `name=N` from the query (`None` if absent); anything else than an
/// integer is a bad request.
fn query_i64(req: &Request<Incoming>, name: &str) -> Result<Option<i64>, ApiError> {
    let q = req.uri().query().unwrap_or("");
    for kv in q.split('&') {
        if let Some(v) = kv.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            return v.parse().map(Some).map_err(|_| {
                ApiError::BadRequest(format!("{name}: expected unix seconds, got {v:?}"))
            });
        }
    }
    Ok(None)
}

async fn handle(broker: &Arc<Broker>, conn: &Conn, req: Request<Incoming>) -> Response<Body> {
    let peer = &conn.peer;
    // Held until the answer (or a stream's head) is ready.
    let _turn = conn.slot.turn().await;
    match route(broker, conn, req).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::debug!(uid = peer.uid, "refused: {e}");
            broker.metrics().refused(e.status_and_code().1.as_str());
            let mut resp = error(&e);
            if matches!(e, ApiError::Timeout(_) | ApiError::TooLarge(_)) {
                // The rest of that body is not wanted: end the connection
                // instead of waiting for it.
                resp.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            }
            resp
        }
    }
}

async fn route(
    broker: &Arc<Broker>,
    conn: &Conn,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let peer = &conn.peer;
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let job_id = |s: &str| s.parse::<JobId>().map_err(ApiError::BadRequest);
    match (method, segments.as_slice()) {
        (Method::GET, ["v1", "jobs"]) => {
            let all = query_flag(&req, "all");
            let body = broker.list_json(peer, all)?;
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(full(body))
                .unwrap_or_else(|_| Response::new(full(""))))
        }
        (Method::POST, ["v1", "jobs"]) => {
            let body: SubmitRequest = read_json(broker, req).await?;
            let stor = broker.stor_nodes(&body).await;
            Ok(json(
                StatusCode::CREATED,
                &broker.submit(peer, body, stor.as_deref())?,
            ))
        }
        (Method::GET, ["v1", "jobs", id]) => {
            Ok(json(StatusCode::OK, &broker.job(peer, job_id(id)?)?))
        }
        (Method::POST, ["v1", "jobs", id, "cancel"]) => {
            let id = job_id(id)?;
            Ok(json(StatusCode::OK, &broker.cancel(peer, id).await?))
        }
        (Method::GET, ["v1", "jobs", id, "log"]) => {
            let follow = query_flag(&req, "follow");
            let rx = broker.log_stream(peer, job_id(id)?, follow)?;
            conn.streaming.store(true, Ordering::Relaxed);
            let body = BodyExt::boxed(ChunkBody(rx));
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/plain; charset=utf-8")
                .body(body)
                .unwrap_or_else(|_| Response::new(full(""))))
        }
        (Method::GET, ["v1", "status"]) => Ok(json(StatusCode::OK, &broker.status()?)),
        (Method::GET, ["v1", "lock"]) => Ok(json(StatusCode::OK, &broker.lock_state())),
        (Method::POST, ["v1", "lock"]) => {
            if !peer.is_root() {
                // Refuse before reading the body.
                return Err(ApiError::Forbidden(
                    "only root may lock the queue: run `sudo gpuq lock --reason ...`".into(),
                ));
            }
            let body: LockRequest = read_json(broker, req).await?;
            Ok(json(StatusCode::OK, &broker.lock(peer, &body.reason)?))
        }
        (Method::DELETE, ["v1", "lock"]) => Ok(json(StatusCode::OK, &broker.unlock(peer)?)),
        (Method::POST, ["v1", "exec"]) => exec(broker, conn, req).await,
        (Method::GET, ["v1", "stats"]) => Ok(json(StatusCode::OK, &broker.stats(peer)?)),
        (Method::GET, ["v1", "usage"]) => {
            let since = query_i64(&req, "since")?;
            let until = query_i64(&req, "until")?;
            Ok(json(StatusCode::OK, &broker.usage(peer, since, until)?))
        }
        (Method::POST, ["v1", "recover"]) => {
            let msg = broker.recover_lease(peer).await?;
            Ok(json(StatusCode::OK, &serde_json::json!({ "message": msg })))
        }
        (Method::GET, ["v1", "daos"]) => Ok(json(StatusCode::OK, &broker.daos_status().await?)),
        (Method::GET, ["v1", "install"]) => {
            Ok(json(StatusCode::OK, &broker.verify_install(peer).await?))
        }
        (Method::GET, ["v1", "activate"]) => {
            Ok(json(StatusCode::OK, &broker.activation_plan(peer).await?))
        }
        (Method::GET, ["v1", "daos", "output", lease]) => {
            let tail = gpuq_protocol::tail_param(req.uri().query(), 64 << 10)
                .map_err(ApiError::BadRequest)?;
            Ok(json(
                StatusCode::OK,
                &broker.server_output(peer, lease, tail).await?,
            ))
        }
        (Method::GET, ["v1", "e2e"]) => Ok(json(StatusCode::OK, &broker.e2e_start(peer)?)),
        (Method::GET, ["v1", "e2e", "lease", lease]) => Ok(json(
            StatusCode::OK,
            &broker.e2e_report(peer, Some(lease), None).await?,
        )),
        (Method::GET, ["v1", "e2e", "job", id]) => {
            let id: u64 = id
                .parse()
                .map_err(|_| ApiError::BadRequest(format!("job ID {id:?} is not a number")))?;
            Ok(json(
                StatusCode::OK,
                &broker.e2e_report(peer, None, Some(id)).await?,
            ))
        }
        (Method::POST, ["v1", "activate"]) => {
            let body: gpuq_protocol::node::ActivateRequest = read_json(broker, req).await?;
            Ok(json(StatusCode::OK, &broker.activate(peer, &body).await?))
        }
        (Method::GET, ["v1", "daos", "pins"]) => {
            Ok(json(StatusCode::OK, &broker.verify_pins(peer).await?))
        }
        (m, _) => Err(ApiError::NoRoute(format!(
            "{m} {path} (see {})",
            routes::JOBS
        ))),
    }
}

/// A response body fed chunk by chunk from a channel (log streaming): the
/// broker never holds more than a few chunks of a log in memory.
struct ChunkBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChunkBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// `gpuq daos-exec`: refusals are JSON errors; on success `101` and the
/// session runs on the upgraded connection.
async fn exec(
    broker: &Arc<Broker>,
    conn: &Conn,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let peer = &conn.peer;
    let wants = req
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(gpuq_protocol::exec::UPGRADE));
    if !wants {
        return Err(ApiError::BadRequest(format!(
            "{} needs `Connection: Upgrade` and `Upgrade: {}` (use `gpuq daos-exec`)",
            routes::EXEC,
            gpuq_protocol::exec::UPGRADE
        )));
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let body: gpuq_protocol::exec::ExecRequest = read_json(broker, req).await?;
    // Started in a task of its own: if the caller goes away meanwhile,
    // hyper drops this request's future, and a container half made here
    // would be left behind; the task finishes and removes it instead.
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (b, p) = (Arc::clone(broker), peer.clone());
    tokio::spawn(async move {
        match b.exec_start(&p, body).await {
            Ok(session) => {
                if let Err(Ok(session)) = tx.send(Ok(session)) {
                    crate::exec::abandon(session).await;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    let session = rx
        .await
        .map_err(|_| ApiError::Conflict("daos-exec: the session could not be set up".into()))??;
    // The session's pump waits on its reader as long as the reader waits.
    conn.streaming.store(true, Ordering::Relaxed);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(up) => crate::exec::pump(session, TokioIo::new(up)).await,
            Err(e) => {
                tracing::warn!("daos-exec upgrade failed: {e}");
                crate::exec::abandon(session).await
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(hyper::header::CONNECTION, "Upgrade")
        .header(hyper::header::UPGRADE, gpuq_protocol::exec::UPGRADE)
        .body(full(""))
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}
