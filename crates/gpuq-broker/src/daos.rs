//! DAOS jobs (`gpuq submit --inst NAME`): the broker's side of a lease.
//!
//! The lease itself — its store, the node links, preparation, cleanup,
//! recovery, status — is [`gpuq_lifecycle::daos::Daos`]'s. What the broker
//! adds is [`Local`]: ending the job's processes through its runner, the
//! job's `gpuq:` log lines, the step times for its metrics and the test
//! build's crash points. The lease records live in the broker's state
//! directory, next to `blocked.json`, which the gate reads on every
//! decision: a lease that is not released holds every job.

use crate::joblog;
use crate::metrics::Metrics;
use crate::runner::Runner;
use gpuq_lease::Lease;
use gpuq_lifecycle::{LocalError, LocalSteps};
use gpuq_protocol::JobId;
use std::path::PathBuf;

pub use gpuq_lifecycle::daos::Daos;

/// The lease name of a job: `job<ID>-<unix time>` (unique, and `recover`
/// finds the job again from it).
pub fn lease_name(job: JobId, now: i64) -> String {
    format!("job{}-{now}", job.0)
}

/// The job a lease serves, from its name.
pub fn job_of_lease(lease: &str) -> Option<JobId> {
    let rest = lease.strip_prefix("job")?;
    let (id, _) = rest.split_once('-')?;
    id.parse().ok().map(JobId)
}

/// Where a lease's job writes its `gpuq:` lines.
#[derive(Debug, Clone)]
pub struct JobLog {
    pub path: PathBuf,
    pub uid: u32,
}

/// The broker-local cleanup steps of one lease, its progress lines and
/// its step times.
#[derive(Debug)]
pub struct Local<'a> {
    pub runner: &'a dyn Runner,
    pub job: Option<JobId>,
    pub log: Option<JobLog>,
    pub metrics: &'a Metrics,
}

#[async_trait::async_trait]
impl LocalSteps for Local<'_> {
    async fn kill_job(&self, _lease: &Lease) -> Result<String, LocalError> {
        let Some(id) = self.job else {
            return Ok("no job recorded for this lease".into());
        };
        self.runner
            .kill(id)
            .await
            .map_err(|e| format!("end job {id}: {e}"))?;
        if self.runner.alive(id).await.map_err(|e| e.to_string())? {
            return Err(format!("job {id} still has processes after the kill").into());
        }
        Ok(format!("job {id}: no process left"))
    }

    fn timed(&self, phase: &str, step: &str, secs: f64, ok: bool) {
        self.metrics.step(phase, step, secs, ok);
    }

    fn note(&self, line: &str) {
        tracing::info!("{line}");
        if let Some(l) = &self.log {
            joblog::note(&l.path, l.uid, line);
        }
    }

    fn checkpoint(&self, point: &str) {
        crate::crash::crash_point(point);
    }
}
