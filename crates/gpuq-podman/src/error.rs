//! The one error type of this crate.
//!
//! Every variant that comes from talking to Podman names the socket, and where
//! there is one, the container or image and Podman's own message from its
//! JSON error body (`{"cause": ..., "message": ..., "response": 404}`).

use std::fmt;
use std::path::PathBuf;

use crate::image_id::ImageId;
use crate::version::ApiVersion;

/// What a request was about, for not-found and conflict errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A container, by name or ID.
    Container,
    /// An image, by ID.
    Image,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Container => "container",
            ObjectKind::Image => "image",
        })
    }
}

/// Errors of the Podman client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configured image reference is not a full `sha256:` image ID. This is
    /// a configuration error: it is raised before any request is made.
    #[error(
        "invalid image pin {input:?}: {reason}\nHint: pin images by full ID \
         (`sha256:` and 64 hex digits, as `podman images --no-trunc` prints them)"
    )]
    InvalidImageId {
        /// The reference as given.
        input: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// The unix socket could not be connected.
    #[error(
        "cannot connect to the podman API socket {socket}: {source}\nHint: is \
         podman.socket (or `podman system service`) running on this node?"
    )]
    Connect {
        /// The socket path.
        socket: PathBuf,
        /// The connect error.
        #[source]
        source: std::io::Error,
    },

    /// The HTTP exchange failed (connection reset, malformed reply, the
    /// request body's reader failed).
    #[error("http exchange with podman at {socket} failed during {op} {target}: {source}")]
    Http {
        /// The socket path.
        socket: PathBuf,
        /// The operation, e.g. `container start`.
        op: &'static str,
        /// The container or image the operation was about (may be empty).
        target: String,
        /// hyper's error.
        #[source]
        source: hyper::Error,
    },

    /// Podman did not answer within the request's deadline
    /// ([`crate::LibpodClient::with_request_timeout`]); the request was
    /// abandoned and its connection closed.
    #[error(
        "podman at {socket} did not answer {op}{} within {after:?}; the request was \
         abandoned\nHint: is the podman service on that host stopped or hung?",
        if target.is_empty() { String::new() } else { format!(" {target}") }
    )]
    Timeout {
        /// The socket path.
        socket: PathBuf,
        /// The operation.
        op: &'static str,
        /// The container or image (may be empty).
        target: String,
        /// The deadline that passed.
        after: std::time::Duration,
    },

    /// `_ping` answered without a `Libpod-API-Version` header: this is not a
    /// libpod socket (a Docker daemon, or something else).
    #[error(
        "the service at {socket} answered _ping without a Libpod-API-Version \
         header; it is not a podman API socket"
    )]
    NotLibpod {
        /// The socket path.
        socket: PathBuf,
    },

    /// Podman is older than the oldest version gpuq supports.
    #[error(
        "podman at {socket} reports libpod API version {found:?}; gpuq needs \
         {minimum} or newer\nHint: upgrade podman on this node (EL8: 4.9, EL9: 5.x)"
    )]
    UnsupportedVersion {
        /// The socket path.
        socket: PathBuf,
        /// The version header as sent.
        found: String,
        /// The oldest supported version.
        minimum: ApiVersion,
    },

    /// Podman answered 404 for a container or image.
    #[error("{kind} {name} not found at {socket}: {message}")]
    NotFound {
        /// The socket path.
        socket: PathBuf,
        /// Container or image.
        kind: ObjectKind,
        /// The name or ID asked for.
        name: String,
        /// Podman's message.
        message: String,
    },

    /// Podman answered 409, or (Podman 4.3 says these with a 500) a
    /// container name is already in use or the container is in the wrong
    /// state for the operation (exec in a stopped container).
    #[error("podman at {socket} refused {op} of {kind} {name} (conflict): {message}")]
    Conflict {
        /// The socket path.
        socket: PathBuf,
        /// The operation.
        op: &'static str,
        /// Container or image.
        kind: ObjectKind,
        /// The name or ID.
        name: String,
        /// Podman's message.
        message: String,
    },

    /// The image found under an ID reports another ID. Never expected from a
    /// content-addressed store; refused rather than trusted.
    #[error("image {expected} at {socket}: podman reports ID {found}; refusing to use it")]
    ImageIdMismatch {
        /// The socket path.
        socket: PathBuf,
        /// The pinned ID.
        expected: ImageId,
        /// The ID Podman reported.
        found: String,
    },

    /// Any other error status from Podman.
    #[error("podman at {socket} failed {op} {target} (HTTP {status}): {message}")]
    Api {
        /// The socket path.
        socket: PathBuf,
        /// The operation.
        op: &'static str,
        /// The container or image (may be empty).
        target: String,
        /// The HTTP status code.
        status: u16,
        /// Podman's message (or the start of the body if it was not JSON).
        message: String,
    },

    /// A container's main process outlived SIGKILL (see [`crate::stop_local`]).
    #[error("container {container}: its process {pid} still runs {waited:?} after SIGKILL")]
    StillRunning {
        /// The container.
        container: String,
        /// Its main process on this host.
        pid: i64,
        /// How long we waited after the SIGKILL.
        waited: std::time::Duration,
    },

    /// A success reply that we could not understand.
    #[error("unexpected reply from podman at {socket} to {op} {target}: {reason}")]
    BadResponse {
        /// The socket path.
        socket: PathBuf,
        /// The operation.
        op: &'static str,
        /// The container or image (may be empty).
        target: String,
        /// What was wrong with it.
        reason: String,
    },
}

impl Error {
    /// Whether this is a 404 for a container or image. Cleanup code uses it to
    /// treat "already gone" as done.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Whether Podman did not answer within the request's deadline.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// Whether this is a configuration error (a bad image pin) rather than a
    /// runtime failure.
    pub fn is_config_error(&self) -> bool {
        matches!(self, Error::InvalidImageId { .. })
    }
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
