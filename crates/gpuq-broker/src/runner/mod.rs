//! Job runners: how a job's processes are started, watched and ended.
//!
//! Each job lives in its own cgroup so that cancel and timeout end the whole
//! process tree, whatever the job forked or daemonised. Two runners sit
//! behind [`Runner`]:
//! - [`systemd::SystemdRunner`]: a transient unit `gpuq-job-<id>.service`
//!   created through systemd's D-Bus API (production);
//! - [`direct::DirectRunner`]: fork, own cgroup v2 directory, drop
//!   privileges (hosts without systemd as PID 1: tests and the demo).
//!
//! A runner can re-adopt a job after a broker restart: the job's processes
//! keep running while the broker is away, and how it ended is recorded
//! outside the broker's memory (the direct runner's shim writes an exit
//! file; systemd keeps the unit's exit status).

pub mod direct;
pub mod systemd;

use async_trait::async_trait;
use gpuq_protocol::JobId;
use std::fs::File;
use std::path::PathBuf;
use thiserror::Error;

/// Everything needed to run one job as its submitter.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobSpec {
    pub id: JobId,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub user: String,
    pub argv: Vec<String>,
    pub cwd: String,
    /// Already filtered (see [`crate::policy::filter_env`]).
    pub env: Vec<(String, String)>,
    pub log_path: PathBuf,
    pub time_limit_secs: u64,
}

/// How the job's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

#[derive(Debug, Error)]
pub enum RunnerError {
    #[error("job {id}: {what}: {source}")]
    Io {
        id: JobId,
        what: String,
        source: std::io::Error,
    },
    #[error("job {id}: {0}", .what)]
    State { id: JobId, what: String },
    #[error("systemd: {0}")]
    Systemd(String),
    /// The program every job's unit would run is not root's alone.
    #[error(
        "refusing runner = \"systemd\": the broker's executable {} {why}; every job runs \
         it as its user, so it must be root's, mode 0755, in directories only root can write \
         (install it in /usr/sbin or /usr/libexec, or chown root and chmod go-w the one named)",
        .path.display()
    )]
    UnsafeProgram { path: PathBuf, why: String },
}

#[async_trait]
pub trait Runner: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    /// Start the job; its stdout and stderr both go to `log` (one file
    /// description, so the two streams interleave in the order written).
    async fn start(&self, spec: &JobSpec, log: File) -> Result<(), RunnerError>;
    /// Whether any process of the job is still alive.
    async fn alive(&self, id: JobId) -> Result<bool, RunnerError>;
    /// Wait until the job's main process has ended, end whatever else it
    /// left running, and say how the main process ended (`None`: unknown,
    /// e.g. it ended while nobody was watching and left no record).
    async fn wait(&self, id: JobId) -> Result<Option<Outcome>, RunnerError>;
    /// End every process of the job; returns once none is left.
    async fn kill(&self, id: JobId) -> Result<(), RunnerError>;
    /// Forget the job (cgroup, unit, records). Only after it has ended.
    async fn release(&self, id: JobId) -> Result<(), RunnerError>;
    /// Whether process `pid` is one of the job's, as this runner placed
    /// it (the cgroup it made, the unit systemd made for it): a cgroup
    /// path that merely *names* the job is not enough (a user can make one
    /// in a delegated subtree, or a user unit of that name).
    async fn holds(&self, id: JobId, pid: u32) -> Result<bool, RunnerError>;
}
