//! The node helper's HTTP/1.1 + JSON API on a root-only unix socket.
//!
//! The broker reaches it through an SSH unix-socket forward, so the peer the
//! kernel reports is the node's sshd (root); a non-root peer is refused even
//! if the socket's mode (0600) were ever loosened. State-changing requests
//! are serialised: one lease step at a time on a node.
//!
//! Each lease step (preflight, start, stop, wipe) runs on tokio's blocking
//! pool ([`run_step`]): its device checks, BLKDISCARD, `/proc` scans and
//! file I/O block a thread, never one of the two async workers that serve
//! the socket. And it runs to its end even when its caller hangs up (the
//! broker abandons a call at its deadline): a step is never cut short at
//! an arbitrary point, and the next step waits for it (the step lock is
//! held by the step, not by the connection).

use crate::service::{NodeError, NodeService};
use bytes::Bytes;
use gpuq_podman::Podman;
use gpuq_protocol::metrics::NodeMetrics;
use gpuq_protocol::node::{
    ActivationReport, ActivationRequest, DmgRequest, Finding, PreflightReport, PreflightRequest,
    StartReport, StartRequest, StepReport,
};
use gpuq_protocol::{ErrorBody, ErrorCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::sync::Mutex;

/// Requests are small (a lease name, a profile, replica names).
pub const MAX_BODY: usize = 64 * 1024;

enum ApiError {
    Node(NodeError),
    /// A step's task ended without an answer (it panicked).
    Task(String),
    Forbidden(String),
    BadRequest(String),
    TooLarge,
    NoRoute(String),
}

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        ApiError::Node(e)
    }
}

fn status_of(e: &ApiError) -> (StatusCode, ErrorCode) {
    match e {
        ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
        ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::BadRequest),
        ApiError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge),
        ApiError::NoRoute(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
        ApiError::Task(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
        ApiError::Node(n) => match n {
            NodeError::BadRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::BadRequest),
            NodeError::NoProfile(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            NodeError::Refused(_) => (StatusCode::CONFLICT, ErrorCode::Conflict),
            NodeError::Preflight { .. } => (StatusCode::CONFLICT, ErrorCode::Conflict),
            NodeError::Podman(_) => (StatusCode::BAD_GATEWAY, ErrorCode::Internal),
            NodeError::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
            NodeError::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
        },
    }
}

fn message(e: &ApiError) -> String {
    match e {
        ApiError::Node(n) => n.to_string(),
        ApiError::Forbidden(m)
        | ApiError::BadRequest(m)
        | ApiError::NoRoute(m)
        | ApiError::Task(m) => m.clone(),
        ApiError::TooLarge => format!("request body larger than {MAX_BODY} bytes"),
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn json<T: serde::Serialize>(status: StatusCode, v: &T) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap_or_default())).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

struct Shared<P> {
    service: NodeService<P>,
    one_step: Mutex<()>,
    /// Every lease step's outcome and duration since this helper started
    /// (`GET /v1/metrics`; the broker re-exposes them per node).
    metrics: std::sync::Mutex<NodeMetrics>,
}

impl<P> Shared<P> {
    fn metrics(&self) -> std::sync::MutexGuard<'_, NodeMetrics> {
        // Plain counters: a panic mid-update leaves them usable.
        self.metrics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count one step: `ok`, `refused` (nothing was done: the node's state
    /// or the request said no) or `failed`; a preflight's findings by reason.
    fn record<T>(&self, step: &str, secs: f64, r: &Result<T, NodeError>, findings: &[Finding]) {
        let outcome = match r {
            Ok(_) if findings.is_empty() => "ok",
            Ok(_) => "refused",
            Err(
                NodeError::Refused(_)
                | NodeError::Preflight { .. }
                | NodeError::BadRequest(_)
                | NodeError::NoProfile(_),
            ) => "refused",
            Err(_) => "failed",
        };
        let mut m = self.metrics();
        m.step(step, outcome, secs);
        let found = match r {
            Err(NodeError::Preflight { findings, .. }) => findings.as_slice(),
            _ => findings,
        };
        for f in found {
            m.refused(&f.reason);
        }
        if matches!(r, Err(NodeError::Refused(_))) {
            m.refused(&format!("{step}_refused"));
        }
    }
}

/// Serve `service` on an already bound listener until the process ends.
pub async fn serve<P: Podman + 'static>(listener: UnixListener, service: NodeService<P>) {
    let metrics = NodeMetrics {
        node: service.node_name().to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        ..NodeMetrics::default()
    };
    let shared = Arc::new(Shared {
        service,
        one_step: Mutex::new(()),
        metrics: std::sync::Mutex::new(metrics),
    });
    gpuq_serve::accept_loop(listener, "node API", move |stream, peer| {
        let uid = peer.uid;
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let shared = Arc::clone(&shared);
                async move {
                    let resp = match route(&shared, uid, req).await {
                        Ok(r) => r,
                        Err(e) => {
                            let (status, code) = status_of(&e);
                            let mut body = serde_json::to_value(ErrorBody {
                                code,
                                error: message(&e).replace('\n', "; "),
                            })
                            .unwrap_or_default();
                            if let ApiError::Node(NodeError::Preflight { findings, .. }) = &e {
                                body["findings"] =
                                    serde_json::to_value(findings).unwrap_or_default();
                            }
                            json(status, &body)
                        }
                    };
                    Ok::<_, Infallible>(resp)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!("connection: {e}");
            }
        });
    })
    .await
}

async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, ApiError> {
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|_| ApiError::TooLarge)?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::BadRequest(format!("malformed request body: {e}")))
}

/// Run one lease step on the blocking pool, to its end whatever happens to
/// the connection that asked for it; `lock`: under the one-step lock.
/// `metric`: the step's name in `GET /v1/metrics` (counted when it ends,
/// also when its caller has gone; the time includes waiting for the lock).
async fn run_step<P, T, F, Fut>(
    shared: &Arc<Shared<P>>,
    lock: bool,
    metric: Option<&'static str>,
    f: F,
) -> Result<T, ApiError>
where
    P: Podman + 'static,
    T: Findings + Send + 'static,
    F: FnOnce(Arc<Shared<P>>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, NodeError>>,
{
    let shared = Arc::clone(shared);
    let rt = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        rt.block_on(async move {
            let _one = if lock {
                Some(shared.one_step.lock().await)
            } else {
                None
            };
            let t = std::time::Instant::now();
            let r = f(Arc::clone(&shared)).await;
            if let Some(step) = metric {
                let found = r.as_ref().map(|v| v.findings()).unwrap_or_default();
                shared.record(step, t.elapsed().as_secs_f64(), &r, found);
            }
            r
        })
    })
    .await
    .map_err(|e| ApiError::Task(format!("the step ended without an answer: {e}")))?
    .map_err(ApiError::from)
}

/// What in a step's answer refused the lease (a preflight's findings).
trait Findings {
    fn findings(&self) -> &[Finding] {
        &[]
    }
}
impl Findings for PreflightReport {
    fn findings(&self) -> &[Finding] {
        if self.ok {
            &[]
        } else {
            &self.findings
        }
    }
}
impl Findings for StartReport {}
impl Findings for gpuq_protocol::node::ExportReport {}
impl Findings for gpuq_protocol::node::NfsExportReport {}
impl Findings for gpuq_protocol::node::DmgReply {}
impl Findings for StepReport {}
impl Findings for gpuq_manifest::report::HostInstall {}
impl Findings for gpuq_protocol::node::ActivationPlan {}
impl Findings for ActivationReport {}
impl Findings for gpuq_protocol::node::LeaseEvidence {}

async fn route<P: Podman + 'static>(
    shared: &Arc<Shared<P>>,
    uid: u32,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    if uid != 0 {
        return Err(ApiError::Forbidden(
            "the node helper serves root only (the broker reaches it over SSH as root)".into(),
        ));
    }
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let seg: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let svc = &shared.service;
    match (method, seg.as_slice()) {
        (Method::GET, ["v1", "status"]) => Ok(json(StatusCode::OK, &svc.status().await?)),
        (Method::GET, ["v1", "metrics"]) => {
            let m = shared.metrics().clone();
            Ok(json(StatusCode::OK, &m))
        }
        (Method::GET, ["v1", "install"]) => {
            // Read-only, so no step lock; it hashes every installed file
            // (tens of MB), which belongs on the blocking pool.
            let r = run_step(
                shared,
                false,
                None,
                |s| async move { Ok(s.service.install()) },
            )
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::GET, ["v1", "activation", "plan"]) => {
            // Read-only (gpuq activate's plan), but it inspects every
            // allowlisted device: one at a time with the lease steps, so
            // a plan never sees a device half-way through a wipe.
            let r = run_step(shared, true, None, |s| async move {
                Ok(crate::activation::plan(s.service.config()).await)
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "activation", "execute"]) => {
            // gpuq activate --execute --destroy-existing-data: one at a
            // time with the lease steps (it stops units and discards).
            let body: ActivationRequest = read_json(req).await?;
            let r = run_step(shared, true, None, move |s| async move {
                crate::activation::execute(&s.service, &body).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "preflight"]) => {
            let body: PreflightRequest = read_json(req).await?;
            let r = run_step(shared, false, Some("preflight"), move |s| async move {
                s.service.preflight(&body).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "leases", lease, "start"]) => {
            let lease = lease.to_string();
            let body: StartRequest = read_json(req).await?;
            let r = run_step(shared, true, Some("start"), move |s| async move {
                s.service.start(&lease, &body).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "leases", lease, "stop"]) => {
            let lease = lease.to_string();
            let r = run_step(shared, true, Some("stop"), move |s| async move {
                s.service.stop(&lease).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "leases", lease, "export"]) => {
            // --stor nvmeof: one step at a time, like a start.
            let lease = lease.to_string();
            let body: gpuq_protocol::node::ExportRequest = read_json(req).await?;
            let r = run_step(shared, true, Some("export"), move |s| async move {
                s.service.export(&lease, &body).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "leases", lease, "nfs-export"]) => {
            // --stor nfsrdma: one step at a time, like a start.
            let lease = lease.to_string();
            let body: gpuq_protocol::node::NfsExportRequest = read_json(req).await?;
            let r = run_step(shared, true, Some("nfs-export"), move |s| async move {
                s.service.nfs_export(&lease, &body).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "leases", lease, "unexport"]) => {
            let lease = lease.to_string();
            let r = run_step(shared, true, Some("unexport"), move |s| async move {
                s.service.unexport(&lease).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "leases", lease, "dmg"]) => {
            let lease = lease.to_string();
            let body: DmgRequest = read_json(req).await?;
            // One step at a time: never while this node starts, stops or
            // wipes.
            let r = run_step(shared, true, None, move |s| async move {
                s.service.dmg(&lease, &body).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "leases", lease, "wipe"]) => {
            let lease = lease.to_string();
            let r = run_step(shared, true, Some("wipe"), move |s| async move {
                s.service.wipe(&lease).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "clients", lease, "files"]) => {
            // A GPU host's client side (crate::client): one step at a time.
            let lease = lease.to_string();
            let body: gpuq_protocol::node::ClientFilesRequest = read_json(req).await?;
            let r = run_step(shared, true, Some("client_files"), move |s| async move {
                crate::client::files(s.service.config(), &lease, &body)
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::POST, ["v1", "clients", lease, step]) => {
            let Some(step) = gpuq_protocol::node::ClientStep::parse(step) else {
                return Err(ApiError::NoRoute(format!("no such endpoint: POST {path}")));
            };
            let lease = lease.to_string();
            let body: gpuq_protocol::node::ClientStepRequest = read_json(req).await?;
            let r = run_step(shared, true, Some("client_step"), move |s| async move {
                crate::client::step(s.service.config(), &lease, step, &body.profile).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::GET, ["v1", "leases", lease, "evidence"]) => {
            // gpuq e2e: read-only, but one at a time with the lease steps
            // (never half-way through a wipe's records).
            let lease = lease.to_string();
            let profile = gpuq_protocol::query_param(req.uri().query(), "profile")
                .unwrap_or_default()
                .to_string();
            let r = run_step(shared, true, None, move |s| async move {
                crate::evidence::evidence(&s.service, &lease, &profile).await
            })
            .await?;
            Ok(json(StatusCode::OK, &r))
        }
        (Method::GET, ["v1", "leases", lease, "output"]) => {
            let tail =
                gpuq_protocol::tail_param(req.uri().query(), crate::service::OUTPUT_TAIL_DEFAULT)
                    .map_err(ApiError::BadRequest)?;
            Ok(json(StatusCode::OK, &svc.output(lease, tail).await?))
        }
        (Method::GET, ["v1", "leases", lease, "logs"]) => {
            let text = svc.logs(lease).await?;
            Ok(Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/plain; charset=utf-8")
                .body(Full::new(Bytes::from(text)).boxed())
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())))
        }
        (m, _) => Err(ApiError::NoRoute(format!("no such endpoint: {m} {path}"))),
    }
}

/// Bind the root-only socket (mode 0600), replacing a stale socket file.
pub fn bind(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(std::io::Error::other(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::other(format!(
                "{} is in use: another gpuq-node is serving it",
                path.display()
            )));
        }
        std::fs::remove_file(path)?;
    }
    // Created 0600 from the start: no window in which others could connect.
    let old = nix_umask(0o177);
    let l = UnixListener::bind(path);
    nix_umask(old);
    let l = l?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

fn nix_umask(mask: u32) -> u32 {
    // umask(2) is always successful and takes no pointers; nix wraps it safely.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(mask)).bits()
}
