//! gpuq's Podman client.
//!
//! gpuq runs DAOS servers, agents and client containers through Podman's
//! libpod REST API on a unix socket — never through the `podman` binary
//! (architecture.md, "Podman usage"). This crate is that client:
//!
//! - [`Podman`], a trait holding only the operations gpuq uses, so the node
//!   helper can be written and tested against it;
//! - [`LibpodClient`], its implementation: a thin typed client on hyper 1
//!   talking to `/v4.0.0/libpod/...`; it reads `Libpod-API-Version` from
//!   `_ping` when it connects and refuses Podman older than 4.3;
//! - [`ImageId`]: images are referenced by full `sha256:` ID only; a tag or a
//!   short ID is a configuration error raised before any request is made;
//! - the labels [`LABEL_LEASE`] and [`LABEL_ROLE`] that let preflight and
//!   cleanup find exactly our containers and nothing else.
//!
//! ```no_run
//! # async fn demo() -> gpuq_podman::Result<()> {
//! use gpuq_podman::{lease_labels, ContainerSpec, ImageId, LibpodClient, Podman, Role};
//! let podman = LibpodClient::connect("/run/podman/podman.sock").await?;
//! let image = ImageId::parse(
//!     "sha256:38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7",
//! )?;
//! let mut spec = ContainerSpec::new("gpuq-L1-server", image);
//! spec.labels = lease_labels("L1", Role::Server);
//! let id = podman.container_create(&spec).await?;
//! podman.container_start(&id).await?;
//! # Ok(()) }
//! ```

mod body;
mod client;
mod error;
mod exec;
mod image_id;
mod logs;
mod stop;
mod types;
mod version;

use std::future::Future;
use std::time::Duration;

pub use body::ImageArchive;
pub use client::{LibpodClient, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SOCKET};
pub use error::{Error, ObjectKind, Result};
pub use exec::{AttachIo, ExecAttach, ExecOutputReader, ExecStdin};
pub use image_id::ImageId;
pub use logs::{demux, LogChunk, LogOptions, LogStream, Logs};
pub use stop::{remove_stopped, stop_local, Stopped};
pub use types::{
    lease_labels, ContainerInfo, ContainerSpec, ContainerState, ContainerSummary, ExecOutput,
    ExecSpec, ImageInfo, ImageSummary, LabelFilter, LoadedImages, Mount, MountKind, Namespace,
    PingInfo, Rlimit, Role, LABEL_LEASE, LABEL_ROLE,
};
pub use version::{check_supported, ApiVersion, MIN_API_VERSION};

/// The Podman operations gpuq uses.
///
/// Containers are named by name or ID (`container: &str`); images only by
/// [`ImageId`]. Methods return `Send` futures so a daemon can call them from
/// spawned tasks; implement them with `async fn`. [`LibpodClient`] gives
/// each request a deadline (its module documentation says what it covers;
/// `container_wait` has none: it waits as long as the container runs);
/// wrap calls in `tokio::time::timeout` where a step needs its own.
pub trait Podman: Send + Sync {
    /// The libpod API version read from `_ping` when the client connected.
    fn version(&self) -> ApiVersion;

    /// Pings the service again (health check); refuses an unsupported version.
    fn ping(&self) -> impl Future<Output = Result<PingInfo>> + Send;

    /// Inspects an image by ID and checks that Podman reports that same ID.
    /// A missing image is [`Error::NotFound`].
    fn image_inspect(&self, image: &ImageId) -> impl Future<Output = Result<ImageInfo>> + Send;

    /// Lists the images in local storage.
    fn image_list(&self) -> impl Future<Output = Result<Vec<ImageSummary>>> + Send;

    /// Loads a docker-archive or OCI-archive tar, streamed from `archive`.
    fn image_load(
        &self,
        archive: ImageArchive,
    ) -> impl Future<Output = Result<LoadedImages>> + Send;

    /// Creates a container from the pinned image ID after inspecting the image
    /// and comparing its ID. Returns the new container's ID.
    fn container_create(&self, spec: &ContainerSpec)
        -> impl Future<Output = Result<String>> + Send;

    /// Starts a container; already running is success.
    fn container_start(&self, container: &str) -> impl Future<Output = Result<()>> + Send;

    /// Sends the stop signal, waits up to `grace` (rounded up to whole
    /// seconds), then SIGKILL; returns once it has stopped. Already stopped is
    /// success.
    fn container_stop(
        &self,
        container: &str,
        grace: Duration,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Sends `signal` (a name such as `TERM` or `KILL`) to the container's
    /// main process. Returns at once; a stopped container is a conflict.
    fn container_kill(
        &self,
        container: &str,
        signal: &str,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Waits until the container has exited and returns its real exit code
    /// (137 after SIGKILL).
    fn container_wait(&self, container: &str) -> impl Future<Output = Result<i32>> + Send;

    /// Inspects a container: its image ID, labels and state.
    fn container_inspect(
        &self,
        container: &str,
    ) -> impl Future<Output = Result<ContainerInfo>> + Send;

    /// Lists containers (running or not) whose labels match `filter`.
    fn container_list(
        &self,
        filter: &LabelFilter,
    ) -> impl Future<Output = Result<Vec<ContainerSummary>>> + Send;

    /// The container's logs so far, demultiplexed into stdout and stderr.
    fn container_logs(
        &self,
        container: &str,
        opts: &LogOptions,
    ) -> impl Future<Output = Result<Logs>> + Send;

    /// Follows a container's logs: what is there (or the last `tail` lines),
    /// then new output as it is written, until the container stops. The
    /// channel closes when the stream ends; an error ends it too. Dropping
    /// the receiver closes the connection.
    fn container_logs_follow(
        &self,
        container: &str,
        opts: &LogOptions,
    ) -> impl Future<Output = Result<tokio::sync::mpsc::Receiver<Result<LogChunk>>>> + Send;

    /// Runs a command in a running container and returns its exit code and
    /// output (collected in memory: meant for commands with bounded output,
    /// such as `dmg ... -j`). No stdin: interactive exec needs the
    /// connection upgrade, which this client does not do.
    fn container_exec(
        &self,
        container: &str,
        exec: &ExecSpec,
    ) -> impl Future<Output = Result<ExecOutput>> + Send;

    /// [`Podman::container_exec`] with its own deadline `within` instead of
    /// the client's (a `dmg storage format` may take minutes).
    fn container_exec_within(
        &self,
        container: &str,
        exec: &ExecSpec,
        within: std::time::Duration,
    ) -> impl Future<Output = Result<ExecOutput>> + Send;

    /// Starts a command in a running container with stdin attached (set
    /// `exec.stdin`) over an upgraded connection: write its stdin and read
    /// its output as it runs. Then [`Podman::exec_exit_code`].
    fn container_exec_attach(
        &self,
        container: &str,
        exec: &ExecSpec,
    ) -> impl Future<Output = Result<ExecAttach>> + Send;

    /// Resizes an exec session's TTY.
    fn exec_resize(
        &self,
        session: &str,
        rows: u16,
        cols: u16,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The exit code of an exec session, or `None` while it runs.
    fn exec_exit_code(&self, session: &str) -> impl Future<Output = Result<Option<i32>>> + Send;

    /// Removes a container; with `force`, a running one is killed first
    /// (no grace period: stop it first for that). A missing container is
    /// [`Error::NotFound`] (see [`Error::is_not_found`]).
    fn container_delete(
        &self,
        container: &str,
        force: bool,
    ) -> impl Future<Output = Result<()>> + Send;
}
