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
}

impl ApiError {
    pub fn status_and_code(&self) -> (StatusCode, ErrorCode) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, ErrorCode::BadRequest),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
            ApiError::NoSuchJob(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
            ApiError::NoRoute(_) => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
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
