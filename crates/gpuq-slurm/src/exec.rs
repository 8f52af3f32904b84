//! Which Slurm DAOS job a process belongs to, for `gpuq daos-exec` inside
//! a Slurm job (the broker serves the call; docs/slurm.md).
//!
//! The answer comes from Slurm, never from the caller: each recorded job's
//! slurmstepd on this host lists its processes (`scontrol listpids`), and
//! the caller's PID (from `SO_PEERCRED`) must be among them. The caller's
//! environment (`SLURM_JOB_ID`) is not read: any process can set it.

use crate::{slurmcmd, Config, Error, State};
use gpuq_lease::{Lease, Phase};
use gpuq_lifecycle::config::DaosProfile;
use gpuq_lifecycle::host::Host;

/// A running Slurm DAOS job that a caller's process belongs to, and what
/// a client container of its lease needs.
#[derive(Debug)]
pub struct ExecJob {
    pub job: u64,
    pub uid: u32,
    pub gid: u32,
    /// Slurm's `WorkDir` of the job: text its owner chose.
    pub work_dir: String,
    pub lease: Lease,
    pub profile: DaosProfile,
    /// This host's part of the lease (its Podman, run directory).
    pub host: Host,
}

/// Why a caller gets no Slurm job.
#[derive(Debug)]
pub enum Refusal {
    /// The process is in no recorded Slurm DAOS job on this host.
    NotInJob(String),
    /// It is, but may not use it, or the job's DAOS system is not up.
    Refused(String),
    /// Slurm or gpuq-slurm's records could not be read.
    Failed(String),
}

/// The recorded Slurm DAOS job whose steps on this host include `pid`,
/// if its owner is `uid` and its lease is running.
pub async fn job_of_process(cfg: &Config, pid: u32, uid: u32) -> Result<ExecJob, Refusal> {
    let fail = |e: Error| Refusal::Failed(e.to_string());
    let st = State::reader(cfg).map_err(fail)?;
    let node = &cfg.agent_host;
    let mut found = None;
    for r in st.records().map_err(fail)? {
        let pids = slurmcmd::job_pids(&cfg.scontrol, r.job, node)
            .await
            .map_err(fail)?;
        if pids.contains(&pid) {
            found = Some(r);
            break;
        }
    }
    let Some(r) = found else {
        return Err(Refusal::NotInJob(format!(
            "this process is in no Slurm DAOS job on {node} (run gpuq daos-exec from the job's script)"
        )));
    };
    let job = r.job;
    if r.uid != uid {
        return Err(Refusal::Refused(format!(
            "Slurm job {job} is not yours: daos-exec runs as the job's owner (uid {}), from the job's own processes",
            r.uid
        )));
    }
    let lease = st
        .lease(&r.lease)
        .map_err(fail)?
        .filter(|l| l.phase == Phase::Running)
        .ok_or_else(|| {
            Refusal::Refused(format!(
                "the DAOS system of Slurm job {job} is not up (lease {})",
                r.lease
            ))
        })?;
    let profile =
        cfg.daos.profiles.get(&r.profile).cloned().ok_or_else(|| {
            Refusal::Failed(format!("profile {} is no longer configured", r.profile))
        })?;
    let host = gpuq_lifecycle::daos::host_for(&cfg.daos, &r.profile)
        .map_err(|e| Refusal::Failed(e.to_string()))?;
    let work_dir = slurmcmd::squeue(cfg, job, "%Z")
        .await
        .map_err(fail)?
        .ok_or_else(|| Refusal::Refused(format!("Slurm no longer knows job {job}")))?;
    Ok(ExecJob {
        job,
        uid: r.uid,
        gid: r.gid,
        work_dir,
        lease,
        profile,
        host,
    })
}
