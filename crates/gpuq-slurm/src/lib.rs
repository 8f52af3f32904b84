//! gpuq's DAOS site as Slurm's per-job storage (issue #19).
//!
//! Slurm's `burst_buffer/lua` plugin calls the functions of the
//! `burst_buffer.lua` shipped with gpuq (config/slurm/); each calls one
//! verb of `gpuq-slurm` (a thin binary over this crate), as root, in
//! slurmctld's host:
//!
//! | lua function | verb | what |
//! | --- | --- | --- |
//! | `slurm_bb_job_process` | `job-process` | the script's `#BB_LUA daos` line is valid (sbatch refuses otherwise) |
//! | `slurm_bb_pools` | `pools` | the pool: one unit, none while the site is held |
//! | `slurm_bb_setup` | `setup` | the job's record (durable): its lease name, owner, profile |
//! | `slurm_bb_data_in` | `data-in` | the lease: preflight, servers, format, joins, agent ([`gpuq_lifecycle::daos::Daos::prepare`]) |
//! | `slurm_bb_paths` | `paths` | the job's DAOS variables |
//! | `slurm_bb_pre_run` | `pre-run` | the job landed where the agent runs |
//! | `slurm_bb_job_teardown` | `teardown` | every cleanup step on all nodes, wipe, release; a failure holds |
//! | `slurm_bb_get_status` | `status` | `scontrol show bbstat` |
//!
//! One lease at a time: Slurm gives the pool's one unit to one job from
//! its setup to the end of its teardown; gpuq's lease store refuses a
//! second lease anyway. Every verb that changes the records takes
//! `<state_dir>/lock` (flock, bounded wait) first: Slurm may call a job's
//! teardown while its data-in is being killed; `paths`, `status`, `pools`
//! and `job-process` only read (records are replaced by atomic renames)
//! and never wait. A verb killed by Slurm (it SIGKILLs the lua call's
//! process group on `scancel` or a timeout) leaves a durable record of how
//! far it got; the data-in's worker (outside that process group) cleans a
//! given-up preparation at once, and a teardown or the next setup cleans
//! whatever else is left (docs/slurm.md).

mod clientlink;
pub mod config;
pub mod directive;
pub mod exec;
mod slurmcmd;
pub mod state;

use clientlink::ClientLink;
pub use config::{load, parse, Config, DEFAULT_CONFIG};
use slurmcmd::{ended, pin, squeue};
use state::libc_flags;
pub use state::{lease_name, JobRecord, State};

use gpuq_lease::{Lease, Phase};
use gpuq_lifecycle::{LocalError, LocalSteps};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use thiserror::Error;

/// Why a verb did not do its work: one line, with what to do.
#[derive(Debug, Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
    /// The lease is held: nothing starts until `gpuq-slurm recover`.
    #[error("{0}")]
    Held(String),
}

impl Error {
    /// The process exit status for this error.
    pub fn code(&self) -> u8 {
        match self {
            Error::Refused(_) | Error::Failed(_) => 1,
            Error::Config(_) => 3,
            Error::Held(_) => 75,
        }
    }
}

pub(crate) fn failed(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.to_string();
    move |e| Error::Failed(format!("{what}: {e}"))
}

/// What the lifecycle needs from a Slurm-driven lease; progress lines go
/// to stderr, which the lua script passes to slurmctld's log.
#[derive(Debug)]
pub struct SlurmSteps {
    /// `scontrol`, which asks a job's slurmstepd for its processes.
    pub scontrol: std::path::PathBuf,
    /// This host's Slurm NodeName (`agent_host`).
    pub node: String,
    /// The job's host when it is another GPU host: its processes are not
    /// this host's to list or kill.
    pub remote: Option<String>,
}

impl SlurmSteps {
    pub fn new(cfg: &Config) -> SlurmSteps {
        SlurmSteps {
            scontrol: cfg.scontrol.clone(),
            node: cfg.agent_host.clone(),
            remote: None,
        }
    }

    /// The steps of the job of record `r`.
    pub fn for_job(cfg: &Config, r: &JobRecord) -> SlurmSteps {
        SlurmSteps {
            remote: r.host.clone().filter(|h| *h != cfg.agent_host),
            ..SlurmSteps::new(cfg)
        }
    }
}

/// How long the job's processes have to be gone after SIGKILL.
const KILL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(15);

#[async_trait::async_trait]
impl LocalSteps for SlurmSteps {
    /// Slurm normally ends a job's processes before it calls the teardown,
    /// but not always: when the job's node fails (its slurmd gone) Slurm
    /// requeues or ends the job and tears it down while its steps still run
    /// here. So the teardown asks the job's slurmstepd (`scontrol
    /// listpids`) for what is left on this host, SIGKILLs each through a
    /// pidfd (taken before a second listing confirms the PID is still the
    /// job's), and goes on only once none is left; otherwise the step
    /// fails and the lease is held.
    async fn kill_job(&self, lease: &Lease) -> Result<String, LocalError> {
        let Some(job) = state::job_of_lease(&lease.lease) else {
            return Err(format!("lease {}: not a Slurm job's lease name", lease.lease).into());
        };
        if let Some(h) = &self.remote {
            // slurmstepd's socket and the processes are on that host: Slurm
            // ends them there (a job whose slurmd died keeps them until
            // that host's slurmd returns; docs/slurm.md). The lease's agent
            // and files there go in the next steps, through its helper.
            return Ok(format!(
                "job {job} ran on {h}: its processes are Slurm's to end there"
            ));
        }
        let fail = |e: Error| LocalError::from(e.to_string());
        let node = &self.node;
        let t0 = std::time::Instant::now();
        let (mut listed, mut killed) = (0, std::collections::BTreeSet::new());
        loop {
            let pids = slurmcmd::job_pids(&self.scontrol, job, node)
                .await
                .map_err(fail)?;
            if pids.is_empty() {
                break;
            }
            listed = listed.max(pids.len());
            let mut fds: Vec<(u32, std::os::fd::OwnedFd)> = Vec::new();
            for p in pids {
                match gpuq_sys::proc::pidfd_of_listed(p)
                    .map_err(|e| format!("ending job {job}'s processes on {node}: {e}"))?
                {
                    gpuq_sys::proc::Listed::Open(fd) => fds.push((p, fd)),
                    gpuq_sys::proc::Listed::Gone => {}
                }
            }
            // The PIDs are the job's now that each pidfd is held.
            let still = slurmcmd::job_pids(&self.scontrol, job, node)
                .await
                .map_err(fail)?;
            for (pid, fd) in &fds {
                if still.contains(pid) {
                    use std::os::fd::AsFd;
                    gpuq_sys::proc::pidfd_kill(fd.as_fd()).map_err(|e| {
                        LocalError::from(format!("SIGKILL of job {job}'s process {pid}: {e}"))
                    })?;
                    killed.insert(*pid);
                }
            }
            if t0.elapsed() > KILL_DEADLINE {
                return Err(format!(
                    "job {job}'s processes {still:?} on {node} still run {}s after SIGKILL",
                    KILL_DEADLINE.as_secs()
                )
                .into());
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Ok(match (listed, killed.len()) {
            (0, _) => format!("no process of job {job} is left on {node} (its slurmstepd)"),
            (n, 0) => format!(
                "no process of job {job} is left on {node} (the {n} its slurmstepd listed have exited)"
            ),
            (_, k) => format!(
                "killed {k} process(es) of job {job} still running on {node} after Slurm had ended the job (its node failed?): {killed:?}"
            ),
        })
    }

    fn note(&self, line: &str) {
        say(&format!("gpuq-slurm: {line}"));
    }
}

/// One line on stderr, never a panic: once Slurm has killed the process
/// that reads it, writing fails (EPIPE) and the work goes on.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// `job-process`: the script's request is valid and names a configured
/// profile.
pub fn job_process(cfg: &Config, script: &str) -> Result<String, Error> {
    let req = directive::parse(script, &cfg.pool).map_err(|e| Error::Refused(e.to_string()))?;
    let profile = profile_of(cfg, &req)?;
    Ok(format!("a DAOS site with profile {profile} for this job"))
}

fn profile_of(cfg: &Config, req: &directive::Request) -> Result<String, Error> {
    let p = req
        .profile
        .clone()
        .unwrap_or_else(|| cfg.default_profile.clone());
    if !cfg.daos.profiles.contains_key(&p) {
        return Err(Error::Refused(format!(
            "`{} daos`: profile={p} is not one of this site's profiles ({})",
            directive::PREFIX,
            cfg.daos
                .profiles
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(p)
}

/// `pools`: the JSON slurm_bb_pools returns. One unit; none while the site
/// is held (or its hold cannot be read: fail closed), so that no DAOS job
/// is set up until `recover`. Reads only; never waits for the lock (Slurm
/// calls it from slurmctld and it must return at once).
pub fn pools(cfg: &Config) -> String {
    let store = gpuq_lease::LeaseStore::reader(&cfg.state_dir.join("leases"));
    let free = hold_of(&store).is_none();
    serde_json::json!({
        "pools": [{"id": cfg.pool, "quantity": u32::from(free), "granularity": 1}]
    })
    .to_string()
}

/// The site's hold as every reader decides it, failing closed: the hold
/// (`blocked.json`), else an active lease whose record says held (the hold
/// file removed by hand is no way out), else either unreadable. `(lease,
/// reason)`.
fn hold_of(store: &gpuq_lease::LeaseStore) -> Option<(String, String)> {
    let unreadable =
        |e: gpuq_lease::LeaseError| Some(("?".to_string(), format!("{e}; an operator must look")));
    match store.blocked() {
        Ok(Some(b)) => return Some((b.lease, b.reason)),
        Err(e) => return unreadable(e),
        Ok(None) => {}
    }
    match store.current() {
        Ok(Some(Lease {
            lease,
            phase: Phase::Held { reason, .. },
            ..
        })) => Some((lease, reason)),
        Ok(_) => None,
        Err(e) => unreadable(e),
    }
}

/// `setup JOB UID GID SCRIPT`: the job's record, durable before Slurm goes
/// on. Refused while the site is held or serves another job.
pub async fn setup(
    st: &State,
    job: u64,
    uid: u32,
    gid: u32,
    script: &str,
) -> Result<String, Error> {
    let req = directive::parse(script, &st.cfg.pool).map_err(|e| Error::Refused(e.to_string()))?;
    let profile = profile_of(&st.cfg, &req)?;
    if uid == 0 {
        return Err(Error::Refused(format!(
            "job {job} runs as root: a DAOS site is set up for a user's job only"
        )));
    }
    if let Some(r) = st.record(job)? {
        return Ok(format!("job {job}: lease {} already recorded", r.lease));
    }
    if let Some(b) = gpuq_lease::blocked_in(&st.leases_dir())
        .map_err(|e| Error::Failed(format!("{e}; an operator must look")))?
    {
        return Err(Error::Held(format!(
            "the DAOS site is held for lease {} ({}); an operator runs `gpuq-slurm recover`",
            b.lease, b.reason
        )));
    }
    // Another job's record: its teardown has not ended. Slurm 22.05 can
    // lose that teardown (a `scancel` during stage-in kills the data-in and
    // the teardown it has just started, and starts no other); once Slurm
    // says the job has ended, its teardown is done here, before this job.
    let mut healed = Vec::new();
    for other in st.records()?.into_iter().filter(|r| r.job != job) {
        match squeue(&st.cfg, other.job, "%T").await? {
            Some(state) if !ended(&state) => {
                return Err(Error::Refused(format!(
                    "the DAOS site serves job {} (lease {}, {state}) until its teardown ends",
                    other.job, other.lease
                )))
            }
            state => {
                let m = teardown(st, other.job).await?;
                healed.push(format!(
                    "job {} had ended ({}) without its teardown: {m}",
                    other.job,
                    state.as_deref().unwrap_or("no longer known to Slurm")
                ));
            }
        }
    }
    // The lease's client side (files, agent) is on the job's host, known
    // and recorded before the data-in makes it: a job that asks for one
    // host that serves DAOS jobs stays there, one that asks for none is
    // pinned to the first idle one (else this host), one that asks for any
    // other node list is refused — all before Slurm allocates it (setup
    // runs while the job is pending).
    let (pinned, host) = pin(&st.cfg, job).await?;
    let now = gpuq_protocol::time::now();
    let r = JobRecord {
        job,
        uid,
        gid,
        profile,
        lease: lease_name(job, now),
        setup_at: now,
        host: (host != st.cfg.agent_host).then_some(host),
    };
    let bytes = serde_json::to_vec_pretty(&r).map_err(|e| Error::Failed(e.to_string()))?;
    gpuq_durable::write_atomic(&st.record_path(job), &bytes, 0o600)
        .map_err(failed(format!("recording job {job}")))?;
    healed.push(format!(
        "job {job} (uid {uid}): lease {} with profile {} recorded; {pinned}",
        r.lease, r.profile
    ));
    Ok(healed.join("; "))
}

fn need_record(st: &State, job: u64) -> Result<JobRecord, Error> {
    st.record(job)?.ok_or_else(|| {
        Error::Refused(format!(
            "job {job} has no DAOS record (its setup did not run or was refused)"
        ))
    })
}

/// `data-in JOB`: the whole preparation. On a failure the lease is cleaned
/// up here (and released, or held if that fails).
///
/// `abandoned` turns true when Slurm has given this data-in up (it
/// SIGKILLs the process group Slurm started on `scancel` or past
/// `StageInTimeout`, and in 22.05 starts no teardown that lives): the
/// preparation stops between two steps, the lease is cleaned up and
/// released at once and the job's record removed, as the teardown would
/// have done. `gpuq-slurm data-in` runs this in a worker outside Slurm's
/// process group for that reason (main.rs).
pub async fn data_in(
    st: &State,
    job: u64,
    abandoned: tokio::sync::watch::Receiver<bool>,
) -> Result<String, Error> {
    let r = need_record(st, job)?;
    let daos = st.daos()?;
    let steps = SlurmSteps::for_job(&st.cfg, &r);
    let client = ClientLink::start(&st.cfg, r.host.as_deref());
    let out = async {
        let mut host = match client.host(&daos, &r.profile).await.map_err(Error::Failed)? {
            Some(h) => h,
            None => daos
                .host(&r.profile)
                .map_err(|e| Error::Failed(e.to_string()))?,
        };
        host.set_stop(abandoned.clone());
        let owner = format!("slurm job {job} (uid {})", r.uid);
        let prepared = daos
            .prepare(&r.lease, &owner, r.uid, &r.profile, &host, &steps)
            .await;
        let gone = *abandoned.borrow();
        let why = match prepared {
            Ok(_) if !gone => {
                return Ok(format!(
                    "job {job}: lease {} ready: 4 ranks joined, agent up",
                    r.lease
                ))
            }
            Ok(_) => "Slurm gave this data-in up as it ended".to_string(),
            Err(_) if gone => "Slurm gave this data-in up (scancel or StageInTimeout)".to_string(),
            Err(e) => e.to_string(),
        };
        let here = client.cleanup_host(&daos, &r.profile, &r.lease).await?;
        match daos.cleanup_on(&r.lease, here, &steps).await {
            Ok(_) if gone => {
                st.remove_record(job)?;
                Err(Error::Failed(format!(
                    "job {job}: {why}; lease {} cleaned up and released, record removed",
                    r.lease
                )))
            }
            Ok(_) => Err(Error::Failed(format!(
                "job {job}: the DAOS site could not be prepared ({why}); it was cleaned up and released"
            ))),
            Err(c) => Err(Error::Held(format!(
                "job {job}: the DAOS site could not be prepared ({why}), and its cleanup did not finish ({c}); the site is held: `gpuq-slurm recover`"
            ))),
        }
    }
    .await;
    client.close().await;
    daos.close().await;
    out
}

/// `paths JOB FILE`: the job's DAOS variables, one `NAME=value` line each,
/// appended to Slurm's file — only for the job's own running lease.
pub fn paths(st: &State, job: u64, path_file: &Path) -> Result<String, Error> {
    let r = need_record(st, job)?;
    match st.lease(&r.lease)? {
        Some(l) if l.phase == Phase::Running => {}
        other => {
            return Err(Error::Refused(format!(
                "job {job}: lease {} is {} , not running; no DAOS variables",
                r.lease,
                other
                    .map(|l| gpuq_lease::phase_name(&l.phase))
                    .unwrap_or("missing")
            )))
        }
    }
    let p =
        st.cfg.daos.profiles.get(&r.profile).ok_or_else(|| {
            Error::Failed(format!("profile {} is no longer configured", r.profile))
        })?;
    let run_dir = match r.host.as_deref().and_then(|h| st.cfg.gpu_host(h)) {
        Some(g) => &g.run_dir,
        None => &st.cfg.daos.run_dir,
    };
    let env = gpuq_lifecycle::host::job_env(run_dir, &p.system, &p.env, &r.lease);
    let mut text = String::new();
    for (k, v) in &env {
        if v.contains(['\n', '\0']) {
            return Err(Error::Failed(format!("{k}: a value with a newline")));
        }
        text.push_str(&format!("{k}={v}\n"));
    }
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc_flags())
        .open(path_file)
        .map_err(failed(path_file.display()))?;
    f.write_all(text.as_bytes())
        .map_err(failed(path_file.display()))?;
    Ok(format!(
        "job {job}: {} variables of lease {}",
        env.len(),
        r.lease
    ))
}

/// `pre-run JOB`: the job's nodes, as Slurm gave them, are this host: the
/// agent's socket exists nowhere else.
pub async fn pre_run(st: &State, job: u64) -> Result<String, Error> {
    let r = need_record(st, job)?;
    let nodes = squeue(&st.cfg, job, "%N")
        .await?
        .ok_or_else(|| Error::Failed(format!("Slurm does not know job {job}")))?;
    let host = r.host.as_deref().unwrap_or(&st.cfg.agent_host);
    if nodes != host {
        return Err(Error::Refused(format!(
            "job {job} was given {nodes:?}, but lease {}'s DAOS agent runs on {host} only: submit DAOS jobs with --nodelist={host} (docs/slurm.md)",
            r.lease
        )));
    }
    Ok(format!(
        "job {job} runs on {nodes}, with lease {}'s agent",
        r.lease
    ))
}

/// `teardown JOB`: every cleanup step on all nodes, then the record goes.
///
/// - no record: nothing of this job was set up;
/// - the job's lease released (an earlier try got there): the record goes;
/// - its lease held because its driver died while preparing (Slurm killed
///   the data-in on `scancel`): the cleanup runs from the start — that
///   hold is this teardown's to clear;
/// - its lease held at a cleanup step that a node did not confirm: refused,
///   the hold stays (Slurm retries twice, then gives the buffer up; the
///   pool stays empty until an operator's `recover`);
/// - otherwise (running, cleaning): the cleanup; a failure holds.
pub async fn teardown(st: &State, job: u64) -> Result<String, Error> {
    let Some(r) = st.record(job)? else {
        return Ok(format!("job {job}: nothing of a DAOS site was set up"));
    };
    match st.lease(&r.lease)? {
        None => {
            st.remove_record(job)?;
            return Ok(format!(
                "job {job}: lease {} was never started; record removed",
                r.lease
            ));
        }
        Some(l) if l.phase == Phase::Released => {
            st.remove_record(job)?;
            return Ok(format!("job {job}: lease {} was already released", r.lease));
        }
        Some(_) => {}
    }
    let daos = st.daos()?;
    let steps = SlurmSteps::for_job(&st.cfg, &r);
    let client = ClientLink::start(&st.cfg, r.host.as_deref());
    let out = async {
        let here = client.cleanup_host(&daos, &r.profile, &r.lease).await?;
        let active = daos.active().filter(|l| l.lease == r.lease);
        let Some(l) = active else {
            return Err(Error::Failed(format!(
                "job {job}: lease {} is not released and not the site's active lease; an operator must look (`gpuq-slurm status`)",
                r.lease
            )));
        };
        let res = match &l.phase {
            Phase::Held {
                step: Some(step),
                node,
                reason,
            } => {
                return Err(Error::Held(format!(
                    "job {job}: lease {} is held at {} ({}{reason}); an operator runs `gpuq-slurm recover`",
                    r.lease,
                    gpuq_lifecycle::step_name(*step),
                    node.as_deref().map(|n| format!("{n}: ")).unwrap_or_default()
                )))
            }
            Phase::Held { step: None, .. } => {
                daos.recover_on(here, &steps).await.map(Some)
            }
            _ => daos.cleanup_on(&r.lease, here, &steps).await,
        };
        match res {
            Ok(m) => {
                st.remove_record(job)?;
                Ok(format!(
                    "job {job}: {}",
                    m.unwrap_or_else(|| format!("lease {} had nothing to clean", r.lease))
                ))
            }
            Err(e) => Err(Error::Held(format!(
                "job {job}: the cleanup of lease {} did not finish: {e}; the site is held until `gpuq-slurm recover`",
                r.lease
            ))),
        }
    }
    .await;
    client.close().await;
    daos.close().await;
    out
}

/// `recover` (an operator, as root): the active lease's cleanup from its
/// first unconfirmed step, then every record whose lease is released or
/// gone.
pub async fn recover(st: &State) -> Result<String, Error> {
    let daos = st.daos()?;
    // The held lease's job record says where its client side is.
    let record = daos
        .active()
        .and_then(|l| st.records().ok()?.into_iter().find(|r| r.lease == l.lease));
    let steps = match &record {
        Some(r) => SlurmSteps::for_job(&st.cfg, r),
        None => SlurmSteps::new(&st.cfg),
    };
    let client = ClientLink::start(&st.cfg, record.as_ref().and_then(|r| r.host.as_deref()));
    let out = async {
        let mut lines = Vec::new();
        if daos.active().is_some() {
            let here = match &record {
                Some(r) => client.cleanup_host(&daos, &r.profile, &r.lease).await?,
                None => None,
            };
            let m = daos
                .recover_on(here, &steps)
                .await
                .map_err(|e| Error::Held(format!("recover did not finish: {e}")))?;
            lines.push(m);
        } else {
            lines.push("no unreleased lease".to_string());
        }
        for r in st.records()? {
            let done = match st.lease(&r.lease)? {
                None => true,
                Some(l) => l.phase == Phase::Released,
            };
            if done {
                st.remove_record(r.job)?;
                lines.push(format!(
                    "record of job {} removed (lease {})",
                    r.job, r.lease
                ));
            }
        }
        Ok(lines.join("; "))
    }
    .await;
    client.close().await;
    daos.close().await;
    out
}

/// `status`: the pool, the hold, the active lease and the job records,
/// from the records alone (no node is asked; `scontrol show bbstat`).
pub fn status(st: &State) -> Result<serde_json::Value, Error> {
    let store = gpuq_lease::LeaseStore::reader(&st.leases_dir());
    let held = hold_of(&store);
    let active =
        store.current().ok().flatten().map(
            |l| serde_json::json!({"lease": l.lease, "phase": gpuq_lease::phase_name(&l.phase)}),
        );
    let jobs = st
        .records()?
        .into_iter()
        .map(|r| {
            let phase = st
                .lease(&r.lease)
                .ok()
                .flatten()
                .map(|l| gpuq_lease::phase_name(&l.phase))
                .unwrap_or("not started");
            serde_json::json!({"job": r.job, "uid": r.uid, "lease": r.lease, "profile": r.profile, "phase": phase})
        })
        .collect::<Vec<_>>();
    Ok(serde_json::json!({
        "pool": st.cfg.pool,
        "free": held.is_none() && jobs.is_empty(),
        "held": held.map(|(lease, reason)| serde_json::json!({"lease": lease, "reason": reason})),
        "active": active,
        "jobs": jobs,
    }))
}

/// The job script Slurm keeps for `job` (a path under its
/// StateSaveLocation, root's): read with the same checks as a
/// configuration file, since its content is the user's.
pub fn read_script(path: &Path) -> Result<String, Error> {
    gpuq_conffile::read_trusted(path).map_err(|e| Error::Refused(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{cfg, DAOS};

    #[test]
    fn the_pool_is_empty_while_the_site_is_held_or_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cfg("[slurm]\nagent_host = \"cxl2\"", DAOS).unwrap();
        c.state_dir = dir.path().to_path_buf();
        let leases = dir.path().join("leases");
        std::fs::create_dir(&leases).unwrap();
        let quantity = |c: &Config| -> u64 {
            let v: serde_json::Value = serde_json::from_str(&pools(c)).unwrap();
            assert_eq!(v["pools"][0]["id"], "daos");
            v["pools"][0]["quantity"].as_u64().unwrap()
        };
        assert_eq!(quantity(&c), 1);
        // A lease that is running: its job has the unit; the pool's size
        // stays 1.
        let (store, _) = gpuq_lease::LeaseStore::open(&leases, 1).unwrap();
        let mut l = store.create("slurm7-1", "slurm job 7", "test", 1).unwrap();
        assert_eq!(quantity(&c), 1);
        // Held: none.
        store
            .hold(&mut l, None, None, "a node did not confirm", 2)
            .unwrap();
        assert_eq!(quantity(&c), 0);
        // blocked.json removed by hand: the lease record still says held.
        std::fs::remove_file(leases.join("blocked.json")).unwrap();
        assert_eq!(quantity(&c), 0);
        // An unreadable pointer: fail closed.
        std::fs::write(leases.join("active.json"), "{garbage").unwrap();
        assert_eq!(quantity(&c), 0);
    }
}
