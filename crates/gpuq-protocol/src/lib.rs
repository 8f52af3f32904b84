//! The gpuq broker API: every request and response type, and the pure parsers
//! (durations) that the CLI and the broker must agree on.
//!
//! The broker speaks HTTP/1.1 + JSON on a unix socket, so an operator can also
//! use `curl --unix-socket /run/gpuq/broker.sock http://gpuq/v1/jobs`. The
//! routes are listed in [`routes`]. This crate performs no I/O.

pub mod duration;
pub mod exec;
pub mod metrics;
pub mod node;
pub mod time;

use serde::{Deserialize, Serialize};
use std::fmt;

/// API routes (all under the `/v1` prefix).
pub mod routes {
    /// `POST` a [`super::SubmitRequest`]; `GET` the queue (`?all=1` for finished jobs too).
    pub const JOBS: &str = "/v1/jobs";
    /// `GET` broker-wide state: lock, hold, the gate.
    pub const STATUS: &str = "/v1/status";
    /// `POST` a [`super::LockRequest`] to lock, `DELETE` to unlock, `GET` to read.
    pub const LOCK: &str = "/v1/lock";
    /// `POST` (root): retry the held DAOS lease's cleanup (`gpuq recover`).
    pub const RECOVER: &str = "/v1/recover";
    /// `GET`: links, nodes, lease, hold and lock (`gpuq daos-status`).
    pub const DAOS: &str = "/v1/daos";
    /// `GET` (root): every installed file's SHA-256 against the packages'
    /// manifests, on this host and every node (`gpuq verify-install`).
    pub const INSTALL: &str = "/v1/install";
    /// `GET` (root): a [`super::node::SitePlan`], what activating the
    /// nodes' devices would find and do (`gpuq activate`); read-only.
    /// `POST` (root) an [`super::node::ActivateRequest`]: activate them
    /// (`--execute --destroy-existing-data`), a [`super::node::SiteActivation`].
    pub const ACTIVATE: &str = "/v1/activate";
    /// `GET OUTPUT/LEASE?tail=BYTES` (root, or the owner of the lease's
    /// job): every node's [`super::node::NodeOutput`] (`gpuq daos-status
    /// --lease`).
    pub const OUTPUT: &str = "/v1/daos/output";
    /// `GET` (root): an [`super::node::E2eStart`]; `GET E2E/lease/NAME`
    /// or `E2E/job/ID`: an [`super::node::E2eReport`] (`gpuq e2e`).
    pub const E2E: &str = "/v1/e2e";
    /// `GET` (root): every pinned image present on every host (`gpuq verify-pins`).
    pub const PINS: &str = "/v1/daos/pins";
    /// `POST` an [`super::exec::ExecRequest`] with `Upgrade: gpuq-exec` (`gpuq daos-exec`).
    pub const EXEC: &str = "/v1/exec";
    /// `GET ?since=UNIX&until=UNIX`: a [`super::UsageReport`] (`gpuq stats`):
    /// every user's for root, one's own for anyone else.
    pub const USAGE: &str = "/v1/usage";
}

/// The value of `key` in a request's query string (`a=1&tail=200`), as
/// sent (gpuq's own clients send plain values: numbers, names).
pub fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// `tail=BYTES` of a query string: `default` when absent, an error line
/// when it is not a number.
pub fn tail_param(query: Option<&str>, default: usize) -> Result<usize, String> {
    match query_param(query, "tail") {
        None => Ok(default),
        Some(t) => t
            .parse()
            .map_err(|_| format!("tail={t:?}: give a number of bytes")),
    }
}

/// A job's number, unique for the life of the broker's store, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::str::FromStr for JobId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(JobId(n)),
            _ => Err(format!(
                "'{s}' is not a job ID: use the number that `gpuq submit` printed (see `gpuq list`)"
            )),
        }
    }
}

/// Where a job is in its life. A job moves only forward through these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Accepted and durably stored; waiting for its turn.
    Queued,
    /// Its processes run (or ran until the broker last looked).
    Running,
    /// Its main process exited with status 0.
    Completed,
    /// Its main process exited non-zero or was killed by a signal it did not get from us.
    Failed,
    /// Cancelled by its owner or by root.
    Cancelled,
    /// Killed because it reached its time limit.
    Timeout,
    /// The broker could not tell how it ended (it was not watching when it did).
    /// Such a job is never run again.
    Lost,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Timeout => "timeout",
            JobState::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "completed" => JobState::Completed,
            "failed" => JobState::Failed,
            "cancelled" => JobState::Cancelled,
            "timeout" => JobState::Timeout,
            "lost" => JobState::Lost,
            _ => return None,
        })
    }

    /// True once the job can never run (again).
    pub fn is_finished(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/jobs`. Who submits is not part of the body: the broker takes the
/// UID, GID and groups from the socket (`SO_PEERCRED`, `SO_PEERGROUPS`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The command and its arguments, run without a shell.
    pub argv: Vec<String>,
    /// The submitter's working directory; the job runs there.
    pub cwd: String,
    /// The submitter's environment at submit time (the broker filters it).
    pub env: Vec<(String, String)>,
    /// Time limit in one of the accepted forms (see [`duration`]); the broker's default if absent.
    #[serde(default)]
    pub time: Option<String>,
    /// A short label shown in `gpuq list`.
    #[serde(default)]
    pub name: Option<String>,
    /// DAOS institution profile (`--inst`).
    #[serde(default)]
    pub inst: Option<String>,
    /// Kernel storage kind (`--stor`).
    #[serde(default)]
    pub stor: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitResponse {
    pub id: JobId,
    /// Where the job's output goes.
    pub log_path: String,
    /// Jobs ahead of this one.
    pub position: usize,
}

/// One job as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobView {
    pub id: JobId,
    pub uid: u32,
    pub user: String,
    pub state: JobState,
    pub name: Option<String>,
    pub argv: Vec<String>,
    pub cwd: String,
    pub inst: Option<String>,
    pub stor: Option<String>,
    /// Unix seconds.
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub ended_at: Option<i64>,
    pub time_limit_secs: u64,
    /// Exit status of the main process, when it exited.
    pub exit_code: Option<i32>,
    /// Signal that ended the main process, when one did.
    pub signal: Option<i32>,
    /// Why the job ended as it did, in words (who cancelled, limit hit, ...).
    pub reason: Option<String>,
    pub log_path: String,
    /// Another user's job as a non-root caller sees it: `argv`, `cwd`,
    /// `reason` and `log_path` are left empty (docs/security.md: what others
    /// see of your jobs).
    #[serde(default)]
    pub hidden: bool,
}

impl JobView {
    /// This view as user `uid` may see it: whole for root and the owner; for
    /// anyone else, who, what state and when, but not what runs, where, or
    /// why it ended (an argument or a failure message may hold a secret).
    pub fn as_seen_by(mut self, uid: u32) -> JobView {
        if uid != 0 && uid != self.uid {
            self.argv = Vec::new();
            self.cwd = String::new();
            self.reason = None;
            self.log_path = String::new();
            self.hidden = true;
        }
        self
    }

    /// The exit code `gpuq follow` returns for this job (shell conventions:
    /// 128+N for a signal, 124 for a time limit as timeout(1) does).
    pub fn follow_exit_code(&self) -> i32 {
        match self.state {
            JobState::Completed => 0,
            JobState::Failed => match (self.exit_code, self.signal) {
                (Some(c), _) => c,
                (None, Some(s)) => 128 + s,
                (None, None) => 1,
            },
            JobState::Timeout => 124,
            JobState::Cancelled => 130,
            JobState::Lost | JobState::Queued | JobState::Running => 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobList {
    pub jobs: Vec<JobView>,
    pub broker: BrokerStatus,
}

/// The maintenance lock (`gpuq lock`), as stored and as shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockInfo {
    pub reason: String,
    pub by_uid: u32,
    pub by_user: String,
    /// Unix seconds.
    pub since: i64,
}

/// `POST /v1/lock`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockRequest {
    pub reason: String,
}

/// A recovery hold: a lease whose cleanup did not finish. Blocks every job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldInfo {
    /// The held lease, or the activation that holds the site.
    pub lease: String,
    pub reason: String,
    pub since: i64,
    /// True: `gpuq activate --execute` holds the site (it finishes it, not
    /// `gpuq recover`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub activating: bool,
}

impl HoldInfo {
    /// What an operator runs to end this hold.
    pub fn remedy(&self) -> &'static str {
        if self.activating {
            "sudo gpuq activate --execute --destroy-existing-data"
        } else {
            "sudo gpuq recover"
        }
    }
}

/// Broker-wide state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerStatus {
    pub version: String,
    pub lock: Option<LockInfo>,
    pub hold: Option<HoldInfo>,
    /// Why the next queued job is not starting, if it is not; `None` when the gate is open.
    pub gate_closed: Option<String>,
    pub running: Option<JobId>,
    pub queued: usize,
    pub runner: String,
    pub gpu: String,
}

/// What the queue did for one user (or everyone: `user` = `all`) over a
/// period: the jobs that **ended** in it (`gpuq stats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageRow {
    pub user: String,
    /// `None` for the `all` row.
    pub uid: Option<u32>,
    pub jobs: u64,
    /// Of those, by final state (`completed`, `failed`, `cancelled`, `timeout`, ...).
    pub by_state: std::collections::BTreeMap<String, u64>,
    /// Hours the jobs held the GPU (start to end; a DAOS job's preparation
    /// and cleanup included: the GPU waited for them).
    pub gpu_hours: f64,
    /// Mean time from submission to start, of the jobs that started.
    pub mean_wait_secs: Option<f64>,
    /// Jobs with `--inst` (a DAOS lease), and the medians of their
    /// preparation (lease to job start) and cleanup (job end to release).
    pub daos_jobs: u64,
    pub prepare_median_secs: Option<f64>,
    pub cleanup_median_secs: Option<f64>,
}

/// The answer to `GET /v1/usage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The period, unix seconds: `since` inclusive, `until` exclusive.
    pub since: i64,
    pub until: i64,
    /// `false`: only the caller's own jobs (everyone's is root's).
    pub all_users: bool,
    /// One row per user with a job in the period, by user name.
    pub users: Vec<UsageRow>,
    /// All of `users` together.
    pub total: UsageRow,
}

/// Machine-readable error class; the HTTP status carries the same information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    Forbidden,
    NotFound,
    Conflict,
    Locked,
    PayloadTooLarge,
    NotEnabled,
    Internal,
    /// A per-user limit (connections, queued jobs): wait or cancel some.
    TooManyRequests,
    /// The broker is at its connection limit or shutting down: retry.
    Unavailable,
    /// The request did not arrive within the broker's deadline.
    Timeout,
    /// A code this version does not know (a newer broker): the status and
    /// the message still say what happened.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The code as the API spells it (`bad_request`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Locked => "locked",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::NotEnabled => "not_enabled",
            ErrorCode::Internal => "internal",
            ErrorCode::TooManyRequests => "too_many_requests",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unknown => "unknown",
        }
    }
}

/// Body of every non-2xx response: one line a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub error: String,
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_params_are_found_by_their_whole_key_and_a_bad_tail_is_one_line() {
        use super::{query_param, tail_param};
        let q = Some("mytail=5&tail=200&profile=inst1");
        assert_eq!(query_param(q, "tail"), Some("200"));
        assert_eq!(query_param(q, "profile"), Some("inst1"));
        assert_eq!(query_param(q, "ail"), None);
        assert_eq!(query_param(None, "tail"), None);
        assert_eq!(tail_param(q, 7), Ok(200));
        assert_eq!(tail_param(Some("x=1"), 7), Ok(7));
        let e = tail_param(Some("tail=-1"), 7).unwrap_err();
        assert!(e.contains("number of bytes") && !e.contains('\n'), "{e}");
    }

    use super::*;

    #[test]
    fn an_error_code_from_a_newer_broker_still_decodes() {
        let b: ErrorBody =
            serde_json::from_str(r#"{"code":"some_future_code","error":"one line"}"#).unwrap();
        assert_eq!(b.code, ErrorCode::Unknown);
        assert_eq!(b.error, "one line");
        let b: ErrorBody =
            serde_json::from_str(r#"{"code":"too_many_requests","error":"x"}"#).unwrap();
        assert_eq!(b.code, ErrorCode::TooManyRequests);
        // as_str spells every code as serde does.
        for c in [
            ErrorCode::BadRequest,
            ErrorCode::Forbidden,
            ErrorCode::NotFound,
            ErrorCode::Conflict,
            ErrorCode::Locked,
            ErrorCode::PayloadTooLarge,
            ErrorCode::NotEnabled,
            ErrorCode::Internal,
            ErrorCode::TooManyRequests,
            ErrorCode::Unavailable,
            ErrorCode::Timeout,
        ] {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }

    #[test]
    fn job_id_rejects_garbage_with_a_hint() {
        assert_eq!("42".parse::<JobId>(), Ok(JobId(42)));
        let e = "abc".parse::<JobId>().unwrap_err();
        assert!(e.contains("gpuq list"), "{e}");
        assert!("0".parse::<JobId>().is_err());
        assert!("-1".parse::<JobId>().is_err());
    }

    #[test]
    fn job_state_round_trips_through_its_name() {
        for s in [
            JobState::Queued,
            JobState::Running,
            JobState::Completed,
            JobState::Failed,
            JobState::Cancelled,
            JobState::Timeout,
            JobState::Lost,
        ] {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
        assert_eq!(JobState::parse("done"), None);
    }

    #[test]
    fn submit_request_rejects_unknown_fields() {
        let ok = r#"{"argv":["true"],"cwd":"/","env":[]}"#;
        assert!(serde_json::from_str::<SubmitRequest>(ok).is_ok());
        let bad = r#"{"argv":["true"],"cwd":"/","env":[],"uid":0}"#;
        assert!(serde_json::from_str::<SubmitRequest>(bad).is_err());
    }
}
