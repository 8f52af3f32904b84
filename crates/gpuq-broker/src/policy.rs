//! Pure queue policy: no I/O, all decisions that tests must pin down.
//!
//! - which job runs next (strict FIFO; under a maintenance lock only root's);
//! - whether the gate is open (no hold, no running job, GPU idle);
//! - what of the submitter's environment a job receives;
//! - who may act on which job.

use gpuq_protocol::{HoldInfo, LockInfo};

/// Environment variables never passed from the submitting shell to a job.
/// `DAOS_*` belonged to the old per-institution systems (`DAOS_POOL`,
/// `DAOS_CONTAINER`, ...): a new job must get its own DAOS system's settings,
/// never a stale one. `GPUQ_*` is ours to set.
pub fn filter_env(env: &[(String, String)], job_id: u64) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| !k.starts_with("DAOS_") && !k.starts_with("GPUQ_"))
        .filter(|(k, _)| !k.is_empty() && !k.contains('=') && !k.contains('\0'))
        .cloned()
        .collect();
    out.push(("GPUQ_JOB_ID".into(), job_id.to_string()));
    out
}

/// A queued job as the gate sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueEntry {
    pub id: gpuq_protocol::JobId,
    pub uid: u32,
}

/// What the gate sees. Built from broker state, the lock file, the hold and the GPU probe.
#[derive(Debug, Clone)]
pub struct GateInputs<'a> {
    pub hold: Option<&'a HoldInfo>,
    pub lock: Option<&'a LockInfo>,
    pub running: bool,
    /// `Ok(None)`: GPU idle. `Ok(Some(what))`: busy. `Err(why)`: could not ask.
    pub gpu: Result<Option<String>, String>,
}

/// The gate's answer for the queue as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Start this job now.
    Start(gpuq_protocol::JobId),
    /// Nothing to start; `Some(why)` when something is waiting.
    Wait(Option<String>),
}

/// Pick the job to start, or say why none starts. `queued` must be oldest first.
pub fn decide(queued: &[QueueEntry], inputs: &GateInputs<'_>) -> Gate {
    if let Some(h) = inputs.hold {
        return Gate::Wait(Some(if h.activating {
            format!(
                "activation {} holds every job: {} (operator: `{}`)",
                h.lease,
                h.reason,
                h.remedy()
            )
        } else {
            format!(
                "recovery hold on lease {}: {} (operator: `{}`)",
                h.lease,
                h.reason,
                h.remedy()
            )
        }));
    }
    if inputs.running {
        return Gate::Wait(None);
    }
    // Strict FIFO; while locked, ordinary users' jobs wait at the gate and
    // the oldest of root's jobs (verification) may run.
    let next = match inputs.lock {
        None => queued.first(),
        Some(_) => queued.iter().find(|j| j.uid == 0),
    };
    let Some(next) = next else {
        return Gate::Wait(inputs.lock.and_then(|l| {
            (!queued.is_empty()).then(|| format!("maintenance lock: {}", l.reason))
        }));
    };
    match &inputs.gpu {
        Ok(None) => Gate::Start(next.id),
        Ok(Some(busy)) => Gate::Wait(Some(format!("GPU busy: {busy}"))),
        Err(e) => Gate::Wait(Some(format!("cannot tell whether the GPU is idle: {e}"))),
    }
}

/// May `uid` cancel, read the log of, or follow a job of `owner`'s?
pub fn may_act_on(uid: u32, owner: u32) -> bool {
    uid == 0 || uid == owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Job;
    use gpuq_protocol::{JobId, JobState};
    use std::path::PathBuf;

    fn job(id: u64, uid: u32) -> Job {
        Job {
            id: JobId(id),
            uid,
            gid: uid,
            groups: vec![],
            user: format!("u{uid}"),
            argv: vec!["true".into()],
            cwd: "/".into(),
            env: vec![],
            name: None,
            inst: None,
            stor: None,
            time_limit_secs: 60,
            state: JobState::Queued,
            submitted_at: 0,
            started_at: None,
            ended_at: None,
            exit_code: None,
            signal: None,
            reason: None,
            log_path: PathBuf::new(),
        }
    }

    fn q(id: u64, uid: u32) -> QueueEntry {
        QueueEntry { id: JobId(id), uid }
    }

    fn idle() -> GateInputs<'static> {
        GateInputs {
            hold: None,
            lock: None,
            running: false,
            gpu: Ok(None),
        }
    }

    fn lock() -> LockInfo {
        LockInfo {
            reason: "DAOS maintenance".into(),
            by_uid: 0,
            by_user: "root".into(),
            since: 0,
        }
    }

    #[test]
    fn strict_fifo() {
        let queue = [q(3, 1000), q(4, 0), q(7, 1001)];
        assert_eq!(decide(&queue, &idle()), Gate::Start(JobId(3)));
        assert_eq!(decide(&[], &idle()), Gate::Wait(None));
    }

    #[test]
    fn one_job_at_a_time() {
        let queue = [q(3, 1000)];
        let g = GateInputs {
            running: true,
            ..idle()
        };
        assert_eq!(decide(&queue, &g), Gate::Wait(None));
    }

    #[test]
    fn lock_lets_only_root_jobs_through() {
        let l = lock();
        let g = GateInputs {
            lock: Some(&l),
            ..idle()
        };
        assert_eq!(decide(&[q(3, 1000), q(4, 0)], &g), Gate::Start(JobId(4)));
        match decide(&[q(3, 1000)], &g) {
            Gate::Wait(Some(why)) => assert!(why.contains("DAOS maintenance"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hold_blocks_everyone_including_root() {
        let h = HoldInfo {
            lease: "L1".into(),
            reason: "wipe failed on da3".into(),
            since: 0,
            activating: false,
        };
        let g = GateInputs {
            hold: Some(&h),
            ..idle()
        };
        match decide(&[q(1, 0)], &g) {
            Gate::Wait(Some(why)) => assert!(why.contains("L1") && why.contains("recover")),
            other => panic!("{other:?}"),
        }
        let a = HoldInfo {
            lease: "activation-1".into(),
            reason: "da3: no answer".into(),
            since: 0,
            activating: true,
        };
        let g = GateInputs {
            hold: Some(&a),
            ..idle()
        };
        match decide(&[q(1, 0)], &g) {
            Gate::Wait(Some(why)) => assert!(
                why.contains("activation-1")
                    && why.contains("gpuq activate --execute")
                    && !why.contains("recover"),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn busy_or_unknown_gpu_keeps_the_gate_closed() {
        let busy = GateInputs {
            gpu: Ok(Some("pid 42 (python)".into())),
            ..idle()
        };
        assert!(matches!(decide(&[q(1, 5)], &busy), Gate::Wait(Some(w)) if w.contains("pid 42")));
        let unknown = GateInputs {
            gpu: Err("libnvidia-ml.so.1 not found".into()),
            ..idle()
        };
        assert!(
            matches!(decide(&[q(1, 5)], &unknown), Gate::Wait(Some(w)) if w.contains("libnvidia"))
        );
    }

    #[test]
    fn env_drops_old_daos_settings_and_sets_job_id() {
        let env = vec![
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("DAOS_POOL".to_string(), "old".to_string()),
            ("DAOS_CONTAINER".to_string(), "old".to_string()),
            ("DAOS_SYSTEM".to_string(), "inst1".to_string()),
            ("GPUQ_JOB_ID".to_string(), "999".to_string()),
            ("HOME".to_string(), "/home/a".to_string()),
        ];
        let out = filter_env(&env, 12);
        assert_eq!(
            out,
            vec![
                ("PATH".to_string(), "/usr/bin".to_string()),
                ("HOME".to_string(), "/home/a".to_string()),
                ("GPUQ_JOB_ID".to_string(), "12".to_string()),
            ]
        );
    }

    #[test]
    fn only_owner_or_root_may_act() {
        let j = job(1, 1000);
        assert!(may_act_on(1000, j.uid));
        assert!(may_act_on(0, j.uid));
        assert!(!may_act_on(1001, j.uid));
    }
}
