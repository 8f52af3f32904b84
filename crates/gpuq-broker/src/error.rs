//! API errors and their HTTP status: one `match`, no catch-all arm, so a new
//! variant forces a decision here at compile time (bottlerocket's apiserver
//! does the same).

use gpuq_protocol::{ErrorBody, ErrorCode, JobId};
use hyper::StatusCode;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("no job {0}: see `gpuq list --all`")]
    NoSuchJob(JobId),
    #[error("no such endpoint: {0}")]
    NoRoute(String),
    /// Something named in the request does not exist (a lease).
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error(
        "the queue is locked for maintenance: {0}; try again after the operator runs `gpuq unlock`"
    )]
    Locked(String),
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    #[error("{0}")]
    NotEnabled(String),
    /// Over one of the caller's own limits (connections, queued jobs).
    #[error("{0}")]
    TooMany(String),
    /// Over the broker's overall connection cap.
    #[error("{0}")]
    Busy(String),
    /// The request body did not arrive within `broker.request_timeout`.
    #[error("the request body did not arrive within {0}s (broker.request_timeout)")]
    Timeout(u64),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Log(#[from] crate::joblog::LogError),
    #[error(transparent)]
    Runner(#[from] crate::runner::RunnerError),
    #[error("maintenance file: {0}")]
    LockFile(std::io::Error),
    /// The DAOS lease (`gpuq recover`, `gpuq daos-exec`'s host part).
    #[error(transparent)]
    Daos(#[from] gpuq_lifecycle::DaosError),
}

impl ApiError {
    pub fn status_and_code(&self) -> (StatusCode, ErrorCode) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::BadRequest),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
            ApiError::NoSuchJob(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::NoRoute(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, ErrorCode::Conflict),
            ApiError::Locked(_) => (StatusCode::LOCKED, ErrorCode::Locked),
            ApiError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge),
            ApiError::NotEnabled(_) => (StatusCode::NOT_IMPLEMENTED, ErrorCode::NotEnabled),
            ApiError::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, ErrorCode::TooManyRequests),
            ApiError::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable),
            ApiError::Timeout(_) => (StatusCode::REQUEST_TIMEOUT, ErrorCode::Timeout),
            ApiError::Store(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
            ApiError::Log(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
            ApiError::Runner(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
            ApiError::LockFile(_) => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
            ApiError::Daos(e) => daos_status(e),
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.status_and_code().1,
            // One line: the client prints it as is.
            error: self.to_string().replace('\n', "; "),
        }
    }
}

/// A DAOS failure's status: the lease's state forbids what was asked
/// (conflict), a node cannot be reached now (unavailable), or this host's
/// own records or Podman failed (internal).
fn daos_status(e: &gpuq_lifecycle::DaosError) -> (StatusCode, ErrorCode) {
    use gpuq_lifecycle::{DaosError as D, LifecycleError as L};
    let conflict = (StatusCode::CONFLICT, ErrorCode::Conflict);
    let internal = (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal);
    match e {
        D::Stopped
        | D::UnknownProfile(_)
        | D::BadPin { .. }
        | D::Unconfigured { .. }
        | D::Activating { .. } => conflict,
        D::LinksDown { .. } => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable),
        // Another lease or hold is in the way: the caller can wait or recover.
        D::Lease {
            source: gpuq_lease::LeaseError::Busy { .. } | gpuq_lease::LeaseError::Held { .. },
            ..
        } => conflict,
        D::Host { .. } | D::Lease { .. } | D::Stor(_) => internal,
        D::Lifecycle(l) => match l {
            L::Refused { .. } | L::Held { .. } | L::NothingToRecover => conflict,
            L::Lease(_) => internal,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuq_lifecycle::{DaosError, LifecycleError};

    #[test]
    fn daos_failures_map_to_the_status_of_what_the_caller_can_do() {
        let status = |e: DaosError| ApiError::from(e).status_and_code().0;
        assert_eq!(
            status(LifecycleError::NothingToRecover.into()),
            StatusCode::CONFLICT
        );
        assert_eq!(
            status(DaosError::UnknownProfile("gone".into())),
            StatusCode::CONFLICT
        );
        let held = LifecycleError::Held {
            lease: "L1".into(),
            step: "wipe".into(),
            failures: vec!["da3: down".into()],
        };
        assert_eq!(status(held.into()), StatusCode::CONFLICT);
        let down = DaosError::LinksDown {
            down: vec![("da2".into(), "ssh: connect refused".into())],
        };
        assert_eq!(status(down), StatusCode::SERVICE_UNAVAILABLE);
        let activating = DaosError::Activating {
            name: "activation-1".into(),
            reason: "da3: no answer".into(),
        };
        assert!(activating.to_string().contains("gpuq activate --execute"));
        assert_eq!(status(activating), StatusCode::CONFLICT);
        let held = DaosError::Lease {
            lease: "activation-2".into(),
            source: gpuq_lease::LeaseError::Held {
                lease: "L1".into(),
                reason: "wipe failed".into(),
            },
        };
        assert_eq!(status(held), StatusCode::CONFLICT);
        let host = DaosError::Host {
            step: gpuq_lifecycle::PrepareStep::Format,
            source: Box::new(gpuq_lifecycle::HostError::Client(
                gpuq_lifecycle::ClientError::Agent("x".into()),
            )),
        };
        assert_eq!(status(host), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn a_daos_failure_is_one_line_naming_the_step_and_node() {
        let e = ApiError::from(DaosError::LinksDown {
            down: vec![
                ("da2".into(), "refused".into()),
                ("da4".into(), "timed out".into()),
            ],
        });
        assert_eq!(
            e.body().error,
            "node links are not up, nothing was started: da2: refused; da4: timed out"
        );
        let e = ApiError::from(DaosError::Host {
            step: gpuq_lifecycle::PrepareStep::Files,
            source: Box::new(gpuq_lifecycle::HostError::Stopped),
        });
        assert!(
            e.body().error.starts_with("lease files: stopped"),
            "{}",
            e.body().error
        );
    }
}
