//! Which Slurm DAOS job a process belongs to, for `gpuq daos-exec` inside
//! a Slurm job (the broker serves the call; docs/slurm.md).
//!
//! The answer comes from Slurm, never from the caller: a DAOS job's
//! slurmstepd on this host lists its processes (`scontrol listpids`), and
//! the caller's PID (from `SO_PEERCRED`) must be among them. The caller's
//! environment (`SLURM_JOB_ID`) is not read: any process can set it.
//!
//! Which jobs are DAOS jobs: on `agent_host`, gpuq-slurm's own records
//! (and the lease must be `running`); on another GPU host
//! (`[[slurm.gpu_hosts]]`), whose broker cannot see the controller's
//! records, the leases whose client side that host's helper made (their
//! `client.json` under the host's run dir, root's; the lease name gives
//! the job), with the owner both there and in Slurm, and the lease's
//! agent listening.

use crate::{slurmcmd, state, Config, Error, State};
use gpuq_lease::Phase;
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
    /// The lease's name and its profile's.
    pub lease: String,
    pub profile_name: String,
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

/// The Slurm DAOS job whose steps on this host, `node` (its Slurm
/// NodeName), include `pid`, if its owner is `uid` and its DAOS system is up.
pub async fn job_of_process(
    cfg: &Config,
    node: &str,
    pid: u32,
    uid: u32,
) -> Result<ExecJob, Refusal> {
    if node == cfg.agent_host {
        on_agent_host(cfg, pid, uid).await
    } else {
        on_gpu_host(cfg, node, pid, uid).await
    }
}

fn not_in_job(node: &str) -> Refusal {
    Refusal::NotInJob(format!(
        "this process is in no Slurm DAOS job on {node} (run gpuq daos-exec from the job's script)"
    ))
}

fn not_yours(job: u64, owner: u32) -> Refusal {
    Refusal::Refused(format!(
        "Slurm job {job} is not yours: daos-exec runs as the job's owner (uid {owner}), from the job's own processes"
    ))
}

async fn on_agent_host(cfg: &Config, pid: u32, uid: u32) -> Result<ExecJob, Refusal> {
    let fail = |e: Error| Refusal::Failed(e.to_string());
    let st = State::reader(cfg).map_err(fail)?;
    let node = &cfg.agent_host;
    let mut found = None;
    for r in st.records().map_err(fail)? {
        if r.host.as_deref().is_some_and(|h| h != node) {
            continue; // its steps run on that host
        }
        let pids = slurmcmd::job_pids(&cfg.scontrol, r.job, node)
            .await
            .map_err(fail)?;
        if pids.contains(&pid) {
            found = Some(r);
            break;
        }
    }
    let Some(r) = found else {
        return Err(not_in_job(node));
    };
    let job = r.job;
    if r.uid != uid {
        return Err(not_yours(job, r.uid));
    }
    st.lease(&r.lease)
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
    let work_dir = work_dir(cfg, job).await?;
    Ok(ExecJob {
        job,
        uid: r.uid,
        gid: r.gid,
        work_dir,
        lease: r.lease,
        profile_name: r.profile,
        profile,
        host,
    })
}

async fn on_gpu_host(cfg: &Config, node: &str, pid: u32, uid: u32) -> Result<ExecJob, Refusal> {
    let fail = |e: Error| Refusal::Failed(e.to_string());
    let g = cfg.gpu_host(node).ok_or_else(|| {
        Refusal::Failed(format!(
            "{node} is neither agent_host nor one of [[slurm.gpu_hosts]]"
        ))
    })?;
    let entries = match std::fs::read_dir(&g.run_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_in_job(node)),
        Err(e) => return Err(Refusal::Failed(format!("{}: {e}", g.run_dir.display()))),
    };
    let mut found = None;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(job) = state::job_of_lease(&name) else {
            continue;
        };
        let pids = slurmcmd::job_pids(&cfg.scontrol, job, node)
            .await
            .map_err(fail)?;
        if pids.contains(&pid) {
            found = Some((name, job));
            break;
        }
    }
    let Some((lease, job)) = found else {
        return Err(not_in_job(node));
    };
    let record = gpuq_clienthost::read_record(&g.run_dir, &lease)
        .map_err(|e| Refusal::Failed(e.to_string()))?
        .ok_or_else(|| {
            Refusal::Refused(format!(
                "the DAOS system of Slurm job {job} is not up (lease {lease} has no client side on {node})"
            ))
        })?;
    // The owner as the helper recorded it and as Slurm has it, and the
    // job's WorkDir (last: it is the owner's text and may hold a `|`).
    let fields = slurmcmd::squeue(cfg, job, "%U|%G|%Z")
        .await
        .map_err(fail)?
        .ok_or_else(|| Refusal::Refused(format!("Slurm no longer knows job {job}")))?;
    let mut f = fields.splitn(3, '|');
    let (owner, gid, work_dir) = match (f.next(), f.next(), f.next()) {
        (Some(u), Some(g), Some(w)) => match (u.parse::<u32>(), g.parse::<u32>()) {
            (Ok(u), Ok(g)) => (u, g, w.to_string()),
            _ => return Err(Refusal::Failed(format!("squeue: job {job}: {fields:?}"))),
        },
        _ => return Err(Refusal::Failed(format!("squeue: job {job}: {fields:?}"))),
    };
    if record.owner_uid != owner {
        return Err(Refusal::Failed(format!(
            "lease {lease} on {node} is recorded for uid {}, but Slurm job {job} is uid {owner}'s; an operator must look",
            record.owner_uid
        )));
    }
    if owner != uid {
        return Err(not_yours(job, owner));
    }
    if !gpuq_clienthost::agent_up(&g.run_dir, &lease) {
        return Err(Refusal::Refused(format!(
            "the DAOS system of Slurm job {job} is not up (lease {lease}'s agent is not listening on {node})"
        )));
    }
    let profile = cfg
        .daos
        .profiles
        .get(&record.profile)
        .cloned()
        .ok_or_else(|| {
            Refusal::Failed(format!(
                "profile {} is no longer configured",
                record.profile
            ))
        })?;
    // This host's client side: its own Podman and run dir.
    let h = gpuq_lifecycle::daos::host_for(&cfg.daos, &record.profile)
        .map_err(|e| Refusal::Failed(e.to_string()))?;
    let host = Host::new(g.podman_socket.clone(), g.run_dir.clone(), h.profile);
    Ok(ExecJob {
        job,
        uid: owner,
        gid,
        work_dir,
        lease,
        profile_name: record.profile,
        profile,
        host,
    })
}

/// The job's `WorkDir` as Slurm has it (`squeue %Z`).
async fn work_dir(cfg: &Config, job: u64) -> Result<String, Refusal> {
    slurmcmd::squeue(cfg, job, "%Z")
        .await
        .map_err(|e| Refusal::Failed(e.to_string()))?
        .ok_or_else(|| Refusal::Refused(format!("Slurm no longer knows job {job}")))
}
