//! The simulator's one error type.

use std::path::PathBuf;

/// DER_MISC: the status dmg puts in its JSON envelope for errors that are not
/// a DAOS status (src/control/common/cmdutil/json.go).
pub const DER_MISC: i32 = -1025;
/// DER_INVAL.
pub const DER_INVAL: i32 = -1003;
/// DER_EXIST.
pub const DER_EXIST: i32 = -1004;
/// DER_NONEXIST.
pub const DER_NONEXIST: i32 = -1005;
/// DER_NOSPACE.
pub const DER_NOSPACE: i32 = -1007;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("parse config {path:?}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("resolve {host:?}: {msg}")]
    Resolve { host: String, msg: String },
    #[error("{0}")]
    Usage(String),
    /// An error a remote server returned, with its DER status.
    #[error("{msg}")]
    Remote { msg: String, status: i32 },
    #[error("protocol error talking to {peer}: {msg}")]
    Protocol { peer: String, msg: String },
}

impl SimError {
    /// The status for dmg's JSON envelope.
    pub fn status(&self) -> i32 {
        match self {
            SimError::Remote { status, .. } => *status,
            SimError::Config { .. }
            | SimError::Io { .. }
            | SimError::Resolve { .. }
            | SimError::Usage(_)
            | SimError::Protocol { .. } => DER_MISC,
        }
    }

    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SimError::Io {
            what: what.into(),
            source,
        }
    }

    pub fn remote(msg: impl Into<String>, status: i32) -> Self {
        SimError::Remote {
            msg: msg.into(),
            status,
        }
    }
}
