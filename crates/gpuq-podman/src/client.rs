//! `LibpodClient`: the libpod REST API over a unix socket, on hyper 1.
//!
//! One short-lived HTTP/1.1 connection per request: connecting a unix socket
//! costs microseconds, there is no pool to go stale when Podman restarts, and
//! a long `wait` never blocks other calls. Dropping a call's future (a
//! caller's timeout) closes its connection.
//!
//! Every request has a deadline ([`LibpodClient::with_request_timeout`],
//! [`DEFAULT_REQUEST_TIMEOUT`] unless the caller sets another): a Podman
//! service that hangs (stopped, wedged) fails the call with
//! [`Error::Timeout`] and the connection is closed, instead of the caller
//! waiting for ever. What the deadline covers:
//!
//! - a plain request (inspect, list, create, start, kill, delete, image
//!   load, `_ping`): connect, send, the answer's head and its whole body;
//! - `container_stop`: the same, plus the stop's grace period (Podman waits
//!   it out before it answers);
//! - `container_exec`: each request of it, the output stream included (it
//!   is the start request's body): a command that runs longer than the
//!   deadline fails — give a longer one for long commands
//!   (`with_request_timeout` on a clone);
//! - `container_wait`: none — it waits for the container's exit by purpose;
//!   the caller bounds it;
//! - `container_exec_attach` and `container_logs_follow` (streams): connect,
//!   send and the answer's head (the `101`/`200`); the stream after that has
//!   no deadline here: an interactive session or a quiet server's log may
//!   idle for hours, and its reader decides how long it listens (the node
//!   helper's format wait, the job's own life for `gpuq daos-exec`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, CONNECTION, CONTENT_TYPE, HOST, UPGRADE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::body::{ImageArchive, ReqBody};
use crate::error::{Error, ObjectKind, Result};
use crate::exec::ExecAttach;
use crate::image_id::ImageId;
use crate::logs::{demux, Demuxer, LogChunk, LogOptions, LogStream, Logs};
use crate::types::{
    ContainerInfo, ContainerSpec, ContainerSummary, CreateReply, ExecInspect, ExecOutput, ExecSpec,
    ImageInfo, ImageSummary, LabelFilter, LoadedImages, PingInfo, RawContainerInspect, RmReport,
};
use crate::version::{check_supported, ApiVersion};
use crate::Podman;

/// Every request asks for the v4 API shapes, which Podman 4.3 through 5.x
/// serve (environment.md: Podman ≥ 5.2 keeps the v4 shapes for path versions
/// below 5.0.0).
const API_PREFIX: &str = "/v4.0.0/libpod";

/// The default rootful Podman socket.
pub const DEFAULT_SOCKET: &str = "/run/podman/podman.sock";

/// The deadline of every request unless the caller sets another
/// ([`LibpodClient::with_request_timeout`]): generous for a slow real host
/// (a create or a forced delete takes well under a second here).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A libpod client bound to one socket. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LibpodClient {
    socket: PathBuf,
    version: ApiVersion,
    /// Each request's deadline (see the module's documentation); `None`:
    /// no deadline.
    timeout: Option<Duration>,
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// Aborts the connection task when the request is done or dropped.
struct ConnTask(JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a request is about, for error messages.
#[derive(Clone, Copy)]
struct Target<'a> {
    op: &'static str,
    kind: ObjectKind,
    name: &'a str,
}

impl LibpodClient {
    /// Connects: pings the socket, reads `Libpod-API-Version`, and refuses a
    /// Podman older than [`crate::MIN_API_VERSION`] or a socket that is not
    /// libpod's.
    ///
    /// Every request, the `_ping` of the connect included, has the deadline
    /// [`DEFAULT_REQUEST_TIMEOUT`]; [`LibpodClient::connect_with_timeout`]
    /// or [`LibpodClient::with_request_timeout`] set another.
    pub async fn connect(socket: impl Into<PathBuf>) -> Result<Self> {
        Self::connect_with_timeout(socket, Some(DEFAULT_REQUEST_TIMEOUT)).await
    }

    /// [`LibpodClient::connect`] with the deadline `timeout` for every
    /// request (`None`: none), the connect's `_ping` included.
    pub async fn connect_with_timeout(
        socket: impl Into<PathBuf>,
        timeout: Option<Duration>,
    ) -> Result<Self> {
        let socket = socket.into();
        let ping = ping_socket(&socket, timeout).await?;
        tracing::debug!(socket = %socket.display(), version = %ping.libpod_api_version_raw, "connected to podman");
        Ok(Self {
            socket,
            version: ping.libpod_api_version,
            timeout,
        })
    }

    /// The same client with another deadline for each request (`None`:
    /// none), e.g. a longer one for a long `dmg` exec.
    #[must_use]
    pub fn with_request_timeout(&self, timeout: Option<Duration>) -> Self {
        Self {
            timeout,
            ..self.clone()
        }
    }

    /// Each request's deadline.
    pub fn request_timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn request_within(
        &self,
        timeout: Option<Duration>,
        method: Method,
        path_and_query: &str,
        body: ReqBody,
        content_type: Option<&'static str>,
        t: Target<'_>,
    ) -> Result<Reply> {
        within(
            &self.socket,
            timeout,
            t,
            raw_request(&self.socket, method, path_and_query, body, content_type, t),
        )
        .await
    }

    /// Sends a request and maps error statuses to [`Error`]; returns the reply
    /// of a 2xx or 304.
    async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: ReqBody,
        content_type: Option<&'static str>,
        t: Target<'_>,
    ) -> Result<Reply> {
        self.call_within(self.timeout, method, path_and_query, body, content_type, t)
            .await
    }

    /// [`Self::call`] with the deadline `timeout` instead of the client's.
    async fn call_within(
        &self,
        timeout: Option<Duration>,
        method: Method,
        path_and_query: &str,
        body: ReqBody,
        content_type: Option<&'static str>,
        t: Target<'_>,
    ) -> Result<Reply> {
        let reply = self
            .request_within(timeout, method, path_and_query, body, content_type, t)
            .await?;
        if reply.status.is_success() || reply.status == StatusCode::NOT_MODIFIED {
            return Ok(reply);
        }
        Err(self.status_error(reply.status, &reply.body, t))
    }

    fn status_error(&self, status: StatusCode, body: &Bytes, t: Target<'_>) -> Error {
        let message = error_message(body);
        let socket = self.socket.clone();
        let name = t.name.to_owned();
        // Podman 4.3 answers some conflicts with 500: a duplicate container
        // name (containers/storage's "that name is already in use") and an
        // operation on a container in the wrong state (libpod's
        // `ErrCtrStateInvalid`, "container state improper"). Treat them as
        // the conflicts they are, so callers need not match on text.
        let conflict = status == StatusCode::CONFLICT
            || (t.kind == ObjectKind::Container
                && (message.contains("name is already in use")
                    || message.contains("container state improper")));
        match status {
            _ if conflict => Error::Conflict {
                socket,
                op: t.op,
                kind: t.kind,
                name,
                message,
            },
            StatusCode::NOT_FOUND => Error::NotFound {
                socket,
                kind: t.kind,
                name,
                message,
            },
            status => Error::Api {
                socket,
                op: t.op,
                target: name,
                status: status.as_u16(),
                message,
            },
        }
    }

    /// Creates an exec session; returns its ID.
    async fn exec_create(&self, container: &str, exec: &ExecSpec, stdin: bool) -> Result<String> {
        let t = ctr("container exec", container);
        let path = format!("{API_PREFIX}/containers/{}/exec", encode(container));
        let body = exec.to_libpod_json(stdin).to_string();
        let reply = self
            .call(
                Method::POST,
                &path,
                ReqBody::Full(Some(body.into())),
                Some("application/json"),
                t,
            )
            .await?;
        let created: CreateReply = self.decode(&reply, t)?;
        if created.id.is_empty() {
            return Err(Error::BadResponse {
                socket: self.socket.clone(),
                op: t.op,
                target: container.to_owned(),
                reason: "no exec session ID in the reply".to_owned(),
            });
        }
        Ok(created.id)
    }

    fn decode<T: DeserializeOwned>(&self, reply: &Reply, t: Target<'_>) -> Result<T> {
        serde_json::from_slice(&reply.body).map_err(|e| Error::BadResponse {
            socket: self.socket.clone(),
            op: t.op,
            target: t.name.to_owned(),
            reason: format!("{e}: {}", snippet(&reply.body)),
        })
    }
}

impl Podman for LibpodClient {
    fn version(&self) -> ApiVersion {
        self.version
    }

    async fn ping(&self) -> Result<PingInfo> {
        ping_socket(&self.socket, self.timeout).await
    }

    async fn image_inspect(&self, image: &ImageId) -> Result<ImageInfo> {
        let t = Target {
            op: "image inspect",
            kind: ObjectKind::Image,
            name: &image.to_string(),
        };
        let path = format!("{API_PREFIX}/images/{}/json", image.hex());
        let reply = self
            .call(Method::GET, &path, ReqBody::empty(), None, t)
            .await?;
        let info: ImageInfo = self.decode(&reply, t)?;
        if !image.matches(&info.id) {
            return Err(Error::ImageIdMismatch {
                socket: self.socket.clone(),
                expected: image.clone(),
                found: info.id,
            });
        }
        Ok(info)
    }

    async fn image_list(&self) -> Result<Vec<ImageSummary>> {
        let t = Target {
            op: "image list",
            kind: ObjectKind::Image,
            name: "",
        };
        let path = format!("{API_PREFIX}/images/json");
        let reply = self
            .call(Method::GET, &path, ReqBody::empty(), None, t)
            .await?;
        self.decode(&reply, t)
    }

    async fn image_load(&self, archive: ImageArchive) -> Result<LoadedImages> {
        let t = Target {
            op: "image load",
            kind: ObjectKind::Image,
            name: "",
        };
        let path = format!("{API_PREFIX}/images/load");
        let reply = self
            .call(
                Method::POST,
                &path,
                archive.body,
                Some("application/x-tar"),
                t,
            )
            .await?;
        self.decode(&reply, t)
    }

    async fn container_create(&self, spec: &ContainerSpec) -> Result<String> {
        // The trust rule (architecture.md): inspect the pinned image and
        // compare its ID before creating anything from it. A missing image
        // fails here with a not-found error naming the ID.
        self.image_inspect(&spec.image).await?;
        let t = Target {
            op: "container create",
            kind: ObjectKind::Container,
            name: &spec.name,
        };
        let path = format!("{API_PREFIX}/containers/create");
        let body = serde_json::to_vec(&spec.to_libpod_json()).map_err(|e| Error::BadResponse {
            socket: self.socket.clone(),
            op: t.op,
            target: spec.name.clone(),
            reason: format!("cannot encode the spec: {e}"),
        })?;
        let reply = self
            .call(
                Method::POST,
                &path,
                ReqBody::Full(Some(body.into())),
                Some("application/json"),
                t,
            )
            .await?;
        let created: CreateReply = self.decode(&reply, t)?;
        for w in &created.warnings {
            tracing::warn!(container = %spec.name, warning = %w, "podman warning on create");
        }
        if created.id.is_empty() {
            return Err(Error::BadResponse {
                socket: self.socket.clone(),
                op: t.op,
                target: spec.name.clone(),
                reason: "no container ID in the reply".to_owned(),
            });
        }
        Ok(created.id)
    }

    async fn container_start(&self, container: &str) -> Result<()> {
        let t = ctr("container start", container);
        let path = format!("{API_PREFIX}/containers/{}/start", encode(container));
        // 304: already running. Starting is idempotent for us.
        self.call(Method::POST, &path, ReqBody::empty(), None, t)
            .await?;
        Ok(())
    }

    async fn container_stop(&self, container: &str, grace: Duration) -> Result<()> {
        let t = ctr("container stop", container);
        // Podman sends the stop signal, waits `timeout` seconds, then SIGKILL.
        // Whole seconds only: round a partial second up, never down to 0.
        let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let path = format!(
            "{API_PREFIX}/containers/{}/stop?timeout={secs}",
            encode(container)
        );
        // 304: already stopped. Podman answers after the grace at most:
        // the deadline counts from then.
        let timeout = self.timeout.map(|d| d + Duration::from_secs(secs));
        self.call_within(timeout, Method::POST, &path, ReqBody::empty(), None, t)
            .await?;
        Ok(())
    }

    async fn container_kill(&self, container: &str, signal: &str) -> Result<()> {
        let t = ctr("container kill", container);
        let path = format!(
            "{API_PREFIX}/containers/{}/kill?signal={}",
            encode(container),
            encode(signal)
        );
        self.call(Method::POST, &path, ReqBody::empty(), None, t)
            .await?;
        Ok(())
    }

    async fn container_wait(&self, container: &str) -> Result<i32> {
        let t = ctr("container wait", container);
        let path = format!(
            "{API_PREFIX}/containers/{}/wait?condition=exited",
            encode(container)
        );
        // No deadline: it waits for the exit by purpose (the caller's).
        let reply = self
            .call_within(None, Method::POST, &path, ReqBody::empty(), None, t)
            .await?;
        // The libpod reply is the bare exit code, e.g. `3`.
        let code: i64 = self.decode(&reply, t)?;
        i32::try_from(code).map_err(|_| Error::BadResponse {
            socket: self.socket.clone(),
            op: t.op,
            target: container.to_owned(),
            reason: format!("exit code {code} out of range"),
        })
    }

    async fn container_inspect(&self, container: &str) -> Result<ContainerInfo> {
        let t = ctr("container inspect", container);
        let path = format!("{API_PREFIX}/containers/{}/json", encode(container));
        let reply = self
            .call(Method::GET, &path, ReqBody::empty(), None, t)
            .await?;
        let raw: RawContainerInspect = self.decode(&reply, t)?;
        Ok(raw.into())
    }

    async fn container_list(&self, filter: &LabelFilter) -> Result<Vec<ContainerSummary>> {
        let t = ctr("container list", "");
        let mut path = format!("{API_PREFIX}/containers/json?all=true");
        if !filter.conditions().is_empty() {
            let filters = serde_json::json!({ "label": filter.conditions() }).to_string();
            path.push_str("&filters=");
            path.push_str(&encode(&filters));
        }
        let reply = self
            .call(Method::GET, &path, ReqBody::empty(), None, t)
            .await?;
        let list: Option<Vec<ContainerSummary>> = self.decode(&reply, t)?;
        Ok(list.unwrap_or_default())
    }

    async fn container_logs(&self, container: &str, opts: &LogOptions) -> Result<Logs> {
        let t = ctr("container logs", container);
        let mut path = format!(
            "{API_PREFIX}/containers/{}/logs?stdout={}&stderr={}&timestamps={}",
            encode(container),
            opts.stdout,
            opts.stderr,
            opts.timestamps
        );
        if let Some(n) = opts.tail {
            path.push_str(&format!("&tail={n}"));
        }
        let reply = self
            .call(Method::GET, &path, ReqBody::empty(), None, t)
            .await?;
        Ok(Logs {
            chunks: demux(&reply.body),
        })
    }

    async fn container_logs_follow(
        &self,
        container: &str,
        opts: &LogOptions,
    ) -> Result<mpsc::Receiver<Result<LogChunk>>> {
        let t = ctr("container logs", container);
        let mut path = format!(
            "{API_PREFIX}/containers/{}/logs?follow=true&stdout={}&stderr={}&timestamps={}",
            encode(container),
            opts.stdout,
            opts.stderr,
            opts.timestamps
        );
        if let Some(n) = opts.tail {
            path.push_str(&format!("&tail={n}"));
        }
        // The deadline covers the answer's head (and an error's body); the
        // stream itself is the reader's to bound.
        let (resp, conn) = within(
            &self.socket,
            self.timeout,
            t,
            open(&self.socket, Method::GET, &path, ReqBody::empty(), None, t),
        )
        .await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = self.read_error_body(resp, t).await?;
            return Err(self.status_error(status, &body, t));
        }
        let (tx, rx) = mpsc::channel(64);
        let socket = self.socket.clone();
        let name = container.to_owned();
        tokio::spawn(async move {
            // Owns the connection: it closes when this task ends, which it
            // does when the stream ends or the receiver is dropped.
            let _conn = conn;
            let mut body = resp.into_body();
            let mut demuxer = Demuxer::default();
            loop {
                let frame = tokio::select! {
                    () = tx.closed() => return,
                    f = body.frame() => f,
                };
                match frame {
                    None => break,
                    Some(Err(source)) => {
                        let t = ctr("container logs", &name);
                        let _ = tx.send(Err(http_error(&socket, t, source))).await;
                        return;
                    }
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            demuxer.push(data);
                        }
                        while let Some(chunk) = demuxer.next_chunk() {
                            if tx.send(Ok(chunk)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
            if let Some(chunk) = demuxer.finish() {
                let _ = tx.send(Ok(chunk)).await;
            }
        });
        Ok(rx)
    }

    async fn container_exec(&self, container: &str, exec: &ExecSpec) -> Result<ExecOutput> {
        let t = ctr("container exec", container);
        let session = self.exec_create(container, exec, false).await?;
        // Without an `Upgrade` header Podman still hijacks the connection: it
        // answers `200 OK` (application/vnd.docker.raw-stream), streams the
        // multiplexed output and closes. hyper reads that as a body delimited
        // by the close. Enough for commands without stdin.
        let path = format!("{API_PREFIX}/exec/{session}/start");
        let mut start = serde_json::json!({ "Detach": false, "Tty": exec.tty });
        if let (true, Some((h, w))) = (exec.tty, exec.console_size) {
            start["h"] = h.into();
            start["w"] = w.into();
        }
        let start = start.to_string();
        let reply = self
            .call(
                Method::POST,
                &path,
                ReqBody::Full(Some(start.into())),
                Some("application/json"),
                t,
            )
            .await?;
        let output = Logs {
            chunks: if exec.tty {
                vec![LogChunk {
                    stream: LogStream::Stdout,
                    data: reply.body,
                }]
            } else {
                demux(&reply.body)
            },
        };
        // The stream closes when the process's stdio does; its exit code is
        // recorded just after. Poll briefly for it.
        let mut delay = Duration::from_millis(2);
        for _ in 0..200 {
            if let Some(exit_code) = self.exec_exit_code(&session).await? {
                return Ok(ExecOutput { exit_code, output });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(50));
        }
        Err(Error::BadResponse {
            socket: self.socket.clone(),
            op: t.op,
            target: container.to_owned(),
            reason: format!("exec session {session} still running after its output closed"),
        })
    }

    async fn container_exec_within(
        &self,
        container: &str,
        exec: &ExecSpec,
        within: Duration,
    ) -> Result<ExecOutput> {
        self.with_request_timeout(Some(within))
            .container_exec(container, exec)
            .await
    }

    async fn container_exec_attach(&self, container: &str, exec: &ExecSpec) -> Result<ExecAttach> {
        let t = ctr("container exec", container);
        let session = self.exec_create(container, exec, exec.stdin).await?;
        let path = format!("{API_PREFIX}/exec/{session}/start");
        let mut start = serde_json::json!({ "Detach": false, "Tty": exec.tty });
        if let (true, Some((h, w))) = (exec.tty, exec.console_size) {
            start["h"] = h.into();
            start["w"] = w.into();
        }
        let start = start.to_string();
        // The deadline covers the answer's head and the upgrade; the
        // session after it is the caller's.
        let (mut resp, _conn) = within(
            &self.socket,
            self.timeout,
            t,
            open_with(
                &self.socket,
                Method::POST,
                &path,
                ReqBody::Full(Some(start.into())),
                Some("application/json"),
                true,
                t,
            ),
        )
        .await?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = resp.status();
            let body = self.read_error_body(resp, t).await?;
            if status.is_success() {
                return Err(Error::BadResponse {
                    socket: self.socket.clone(),
                    op: t.op,
                    target: container.to_owned(),
                    reason: format!("podman answered {status} instead of upgrading the connection"),
                });
            }
            return Err(self.status_error(status, &body, t));
        }
        // `_conn` must live until the upgrade has taken the socket over.
        let upgraded = within(&self.socket, self.timeout, t, async {
            hyper::upgrade::on(&mut resp)
                .await
                .map_err(|e| http_error(&self.socket, t, e))
        })
        .await?;
        Ok(ExecAttach::new(session, exec.tty, TokioIo::new(upgraded)))
    }

    async fn exec_resize(&self, session: &str, rows: u16, cols: u16) -> Result<()> {
        let t = Target {
            op: "exec resize",
            kind: ObjectKind::Container,
            name: session,
        };
        let path = format!(
            "{API_PREFIX}/exec/{}/resize?h={rows}&w={cols}",
            encode(session)
        );
        self.call(Method::POST, &path, ReqBody::empty(), None, t)
            .await?;
        Ok(())
    }

    async fn exec_exit_code(&self, session: &str) -> Result<Option<i32>> {
        let t = Target {
            op: "exec inspect",
            kind: ObjectKind::Container,
            name: session,
        };
        let path = format!("{API_PREFIX}/exec/{}/json", encode(session));
        let reply = self
            .call(Method::GET, &path, ReqBody::empty(), None, t)
            .await?;
        let state: ExecInspect = self.decode(&reply, t)?;
        Ok((!state.running).then_some(state.exit_code))
    }

    async fn container_delete(&self, container: &str, force: bool) -> Result<()> {
        let t = ctr("container delete", container);
        // timeout=0: a forced delete kills at once; a graceful stop is
        // `container_stop`'s job.
        let path = format!(
            "{API_PREFIX}/containers/{}?force={force}&timeout=0",
            encode(container)
        );
        let reply = self
            .call(Method::DELETE, &path, ReqBody::empty(), None, t)
            .await?;
        // Podman 4.x answers 200 with `[{"Id": ..., "Err": ...}]`; older and
        // newer versions may answer 204 with no body.
        if reply.body.is_empty() {
            return Ok(());
        }
        let reports: Vec<RmReport> = self.decode(&reply, t)?;
        for r in reports {
            if let Some(err) = r.err.filter(|e| !e.is_empty()) {
                return Err(Error::Api {
                    socket: self.socket.clone(),
                    op: t.op,
                    target: if r.id.is_empty() {
                        container.to_owned()
                    } else {
                        r.id
                    },
                    status: reply.status.as_u16(),
                    message: err,
                });
            }
        }
        Ok(())
    }
}

fn ctr<'a>(op: &'static str, name: &'a str) -> Target<'a> {
    Target {
        op,
        kind: ObjectKind::Container,
        name,
    }
}

/// `f` within `timeout` (`None`: no deadline), else [`Error::Timeout`]:
/// `f` is dropped, and with it the request's connection.
impl LibpodClient {
    /// The body of a response that is not the one asked for (an error
    /// answer of a stream or upgrade request), read within the deadline.
    async fn read_error_body(&self, resp: Response<Incoming>, t: Target<'_>) -> Result<Bytes> {
        within(&self.socket, self.timeout, t, async {
            resp.into_body()
                .collect()
                .await
                .map_err(|e| http_error(&self.socket, t, e))
        })
        .await
        .map(|b| b.to_bytes())
    }
}

async fn within<T>(
    socket: &Path,
    timeout: Option<Duration>,
    t: Target<'_>,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let Some(after) = timeout else {
        return f.await;
    };
    match tokio::time::timeout(after, f).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(socket = %socket.display(), op = t.op, target = t.name, ?after, "podman request abandoned at its deadline");
            Err(Error::Timeout {
                socket: socket.to_owned(),
                op: t.op,
                target: t.name.to_owned(),
                after,
            })
        }
    }
}

async fn ping_socket(socket: &Path, timeout: Option<Duration>) -> Result<PingInfo> {
    let t = Target {
        op: "ping",
        kind: ObjectKind::Container,
        name: "",
    };
    let reply = within(
        socket,
        timeout,
        t,
        raw_request(
            socket,
            Method::GET,
            &format!("{API_PREFIX}/_ping"),
            ReqBody::empty(),
            None,
            t,
        ),
    )
    .await?;
    if !reply.status.is_success() {
        return Err(Error::Api {
            socket: socket.to_owned(),
            op: t.op,
            target: String::new(),
            status: reply.status.as_u16(),
            message: error_message(&reply.body),
        });
    }
    let header = |name: &str| {
        reply
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let raw = header("libpod-api-version");
    let version = check_supported(raw.as_deref(), socket)?;
    Ok(PingInfo {
        libpod_api_version: version,
        libpod_api_version_raw: raw.unwrap_or_default(),
        docker_api_version: header("api-version"),
    })
}

async fn raw_request(
    socket: &Path,
    method: Method,
    path_and_query: &str,
    body: ReqBody,
    content_type: Option<&'static str>,
    t: Target<'_>,
) -> Result<Reply> {
    let started = std::time::Instant::now();
    let (resp, _conn) = open(socket, method, path_and_query, body, content_type, t).await?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|source| http_error(socket, t, source))?
        .to_bytes();
    // One line per call: where a lifecycle step's time goes (GPUQ_LOG=gpuq_podman=debug).
    tracing::debug!(
        op = t.op,
        target = t.name,
        status = status.as_u16(),
        ms = started.elapsed().as_secs_f64() * 1000.0,
        "podman call"
    );
    Ok(Reply {
        status,
        headers,
        body,
    })
}

fn http_error(socket: &Path, t: Target<'_>, source: hyper::Error) -> Error {
    Error::Http {
        socket: socket.to_owned(),
        op: t.op,
        target: t.name.to_owned(),
        source,
    }
}

/// Sends a request on a new connection and returns the response with its
/// body still to be read, and the connection task (aborted when dropped).
async fn open(
    socket: &Path,
    method: Method,
    path_and_query: &str,
    body: ReqBody,
    content_type: Option<&'static str>,
    t: Target<'_>,
) -> Result<(Response<Incoming>, ConnTask)> {
    open_with(socket, method, path_and_query, body, content_type, false, t).await
}

/// [`open`], optionally asking for a connection upgrade (`Upgrade: tcp`, as
/// Podman's attach and exec endpoints expect).
async fn open_with(
    socket: &Path,
    method: Method,
    path_and_query: &str,
    body: ReqBody,
    content_type: Option<&'static str>,
    upgrade: bool,
    t: Target<'_>,
) -> Result<(Response<Incoming>, ConnTask)> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| Error::Connect {
            socket: socket.to_owned(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| http_error(socket, t, e))?;
    let conn = ConnTask(tokio::spawn(async move {
        // `with_upgrades`: after a 101 the socket is handed to the upgrade.
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "podman connection closed with an error");
        }
    }));
    let mut req = Request::builder()
        .method(method)
        .uri(path_and_query)
        // Go's HTTP server rejects HTTP/1.1 requests without a Host header.
        .header(HOST, "d");
    if let Some(ct) = content_type {
        req = req.header(CONTENT_TYPE, ct);
    }
    if upgrade {
        req = req.header(CONNECTION, "Upgrade").header(UPGRADE, "tcp");
    }
    let req = req.body(body).map_err(|e| Error::BadResponse {
        socket: socket.to_owned(),
        op: t.op,
        target: t.name.to_owned(),
        reason: format!("cannot build the request {path_and_query}: {e}"),
    })?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| http_error(socket, t, e))?;
    Ok((resp, conn))
}

/// Podman's error body is `{"cause": ..., "message": ..., "response": N}`;
/// `message` includes the cause. Anything else: the start of the body.
fn error_message(body: &Bytes) -> String {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        #[serde(default)]
        message: String,
        #[serde(default)]
        cause: String,
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) if !e.message.is_empty() => e.message,
        Ok(e) if !e.cause.is_empty() => e.cause,
        _ => snippet(body),
    }
}

fn snippet(body: &Bytes) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let text = text.trim();
    if text.is_empty() {
        "(empty body)".to_owned()
    } else {
        text.to_owned()
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, for path
/// segments and query values.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_keeps_names_and_escapes_the_rest() {
        assert_eq!(encode("gpuq-L1.server_0"), "gpuq-L1.server_0");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
        assert_eq!(
            encode(r#"{"label":["io.gpuq.lease=L1"]}"#),
            "%7B%22label%22%3A%5B%22io.gpuq.lease%3DL1%22%5D%7D"
        );
    }

    #[test]
    fn error_message_prefers_podman_message() {
        let b = Bytes::from_static(
            br#"{"cause":"no such container","message":"no container with name or ID \"x\" found: no such container","response":404}"#,
        );
        assert_eq!(
            error_message(&b),
            "no container with name or ID \"x\" found: no such container"
        );
        assert_eq!(error_message(&Bytes::from_static(b"oops\n")), "oops");
        assert_eq!(error_message(&Bytes::new()), "(empty body)");
    }
}
