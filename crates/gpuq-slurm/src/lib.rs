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
//! second lease anyway. Every verb that reads or changes the records
//! takes `<state_dir>/lock` (flock, bounded wait) first: Slurm may call a
//! job's teardown while its data-in is being killed. A verb killed by
//! Slurm (it SIGKILLs the lua call's process group on `scancel` or a
//! timeout) leaves a durable record of how far it got; the job's
//! teardown cleans from there.

pub mod directive;

use gpuq_lease::{Lease, Phase};
use gpuq_lifecycle::config::{DaosConfig, RawDaos};
use gpuq_lifecycle::daos::Daos;
use gpuq_lifecycle::{LocalError, LocalSteps};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// The default configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/gpuq/slurm.toml";

/// `slurm.toml`: `[slurm]` and the site's `[daos]` (the same table as the
/// broker's `broker.toml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    slurm: RawSlurm,
    daos: RawDaos,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlurm {
    state_dir: Option<PathBuf>,
    pool: Option<String>,
    default_profile: Option<String>,
    agent_host: String,
    squeue: Option<PathBuf>,
    scontrol: Option<PathBuf>,
    lock_wait_secs: Option<u64>,
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Root's, 0700: `leases/` (the lease store), `jobs/` (one record per
    /// Slurm job between setup and teardown), `lock`.
    pub state_dir: PathBuf,
    /// The burst buffer pool's name (one unit: one DAOS job at a time).
    pub pool: String,
    /// The profile of a request without `profile=`.
    pub default_profile: String,
    /// The Slurm node (`NodeName`) that is this host: the lease's agent
    /// runs on its Podman, so a DAOS job must run there.
    pub agent_host: String,
    /// Slurm's `squeue`, for a job's state and nodes.
    pub squeue: PathBuf,
    /// Slurm's `scontrol`, to pin a DAOS job to `agent_host` at its setup.
    pub scontrol: PathBuf,
    /// How long a verb waits for another one's lock.
    pub lock_wait: Duration,
    pub daos: DaosConfig,
}

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

fn failed(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.to_string();
    move |e| Error::Failed(format!("{what}: {e}"))
}

/// Read and check `path` (root's, not writable by others: `read_trusted`).
pub fn load(path: &Path) -> Result<Config, Error> {
    let text = gpuq_conffile::read_trusted(path).map_err(|e| Error::Config(e.to_string()))?;
    parse(path, &text)
}

/// The configuration in `text` (read from `path`, named in errors).
pub fn parse(path: &Path, text: &str) -> Result<Config, Error> {
    let raw: RawFile =
        gpuq_conffile::parse_toml(path, text).map_err(|e| Error::Config(e.to_string()))?;
    let bad = |key: &str, why: &str| Error::Config(format!("{}: {key}: {why}", path.display()));
    let daos = gpuq_lifecycle::config::parse(raw.daos).map_err(|e| bad(e.key, &e.message))?;
    let s = raw.slurm;
    let state_dir =
        gpuq_lifecycle::config::absolute("slurm.state_dir", s.state_dir, "/var/lib/gpuq/slurm")
            .map_err(|e| bad(e.key, &e.message))?;
    let pool = s.pool.unwrap_or_else(|| "daos".into());
    if !gpuq_protocol::node::valid_lease(&pool) {
        return Err(bad("slurm.pool", "letters, digits, - and _"));
    }
    let default_profile = match s.default_profile {
        Some(p) => p,
        None if daos.profiles.len() == 1 => {
            daos.profiles.keys().next().cloned().unwrap_or_default()
        }
        None => {
            return Err(bad(
                "slurm.default_profile",
                "required when [daos] has more than one profile",
            ))
        }
    };
    if !daos.profiles.contains_key(&default_profile) {
        return Err(bad(
            "slurm.default_profile",
            &format!("`{default_profile}` is not a [daos.profiles] entry"),
        ));
    }
    if s.agent_host.is_empty() || s.agent_host.contains(char::is_whitespace) {
        return Err(bad("slurm.agent_host", "a Slurm NodeName"));
    }
    let squeue = gpuq_lifecycle::config::absolute("slurm.squeue", s.squeue, "/usr/bin/squeue")
        .map_err(|e| bad(e.key, &e.message))?;
    let scontrol =
        gpuq_lifecycle::config::absolute("slurm.scontrol", s.scontrol, "/usr/bin/scontrol")
            .map_err(|e| bad(e.key, &e.message))?;
    let lock_wait = Duration::from_secs(s.lock_wait_secs.unwrap_or(600).clamp(1, 86400));
    Ok(Config {
        state_dir,
        pool,
        default_profile,
        agent_host: s.agent_host,
        squeue,
        scontrol,
        lock_wait,
        daos,
    })
}

/// What `setup` records for a job, `<state_dir>/jobs/<job>.json` (root,
/// 0600); removed when its teardown (or `recover`) has released the lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRecord {
    pub job: u64,
    pub uid: u32,
    pub gid: u32,
    pub profile: String,
    pub lease: String,
    pub setup_at: i64,
}

/// The lease name of a Slurm job: `slurm<ID>-<unix time>` (unique even
/// when Slurm's job IDs start again).
pub fn lease_name(job: u64, now: i64) -> String {
    format!("slurm{job}-{now}")
}

/// The records under `state_dir`, for one invocation.
#[derive(Debug)]
pub struct State {
    cfg: Config,
    /// Held for the whole invocation; released by the kernel however the
    /// process ends. `None`: a reader ([`State::reader`]).
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

/// `dir` as root's own directory (created 0700 if missing): not a link,
/// owned by root, writable by nobody else.
fn own_dir(dir: &Path) -> Result<(), Error> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(failed(format!("creating {}", dir.display())))?;
        }
        Err(e) => return Err(failed(dir.display())(e)),
        Ok(_) => {}
    }
    let m = std::fs::symlink_metadata(dir).map_err(failed(dir.display()))?;
    if !m.file_type().is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(Error::Refused(format!(
            "{}: must be a directory of root's that nobody else can write (refusing to keep records there)",
            dir.display()
        )));
    }
    Ok(())
}

use std::os::unix::fs::DirBuilderExt;

impl State {
    /// Take `<state_dir>/lock`, waiting at most `cfg.lock_wait`.
    pub fn lock(cfg: &Config) -> Result<State, Error> {
        own_dir(&cfg.state_dir)?;
        own_dir(&cfg.state_dir.join("jobs"))?;
        own_dir(&cfg.state_dir.join("leases"))?;
        let path = cfg.state_dir.join("lock");
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc_flags())
            .open(&path)
            .map_err(failed(path.display()))?;
        let deadline = std::time::Instant::now() + cfg.lock_wait;
        loop {
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(State {
                        cfg: cfg.clone(),
                        _lock: Some(lock),
                    })
                }
                Err((f, nix::errno::Errno::EWOULDBLOCK)) => {
                    if std::time::Instant::now() >= deadline {
                        return Err(Error::Failed(format!(
                            "{} is held by another gpuq-slurm for more than {}s; nothing was done (see `gpuq-slurm status`)",
                            path.display(),
                            cfg.lock_wait.as_secs()
                        )));
                    }
                    file = f;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err((_, e)) => {
                    return Err(Error::Failed(format!("{}: flock: {e}", path.display())))
                }
            }
        }
    }

    /// The records without the lock, for the verbs that only read and
    /// must never wait: `paths` (Slurm runs it inside slurmctld itself,
    /// with no timeout) and `status` (`scontrol show bbstat`, any user's).
    /// Every record is replaced by an atomic rename, so a reader sees the
    /// old one or the new one.
    pub fn reader(cfg: &Config) -> Result<State, Error> {
        for d in [
            cfg.state_dir.clone(),
            cfg.state_dir.join("jobs"),
            cfg.state_dir.join("leases"),
        ] {
            // Made (0700) if missing, as by the first locked verb; checked.
            own_dir(&d)?;
        }
        Ok(State {
            cfg: cfg.clone(),
            _lock: None,
        })
    }

    fn leases_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("leases")
    }

    fn record_path(&self, job: u64) -> PathBuf {
        self.cfg.state_dir.join("jobs").join(format!("{job}.json"))
    }

    /// The record of `job`, if its setup ran.
    pub fn record(&self, job: u64) -> Result<Option<JobRecord>, Error> {
        let p = self.record_path(job);
        match std::fs::read(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed(p.display())(e)),
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                Error::Failed(format!(
                    "{}: unreadable ({e}); an operator must look",
                    p.display()
                ))
            }),
        }
    }

    /// Every job record, by job ID.
    pub fn records(&self) -> Result<Vec<JobRecord>, Error> {
        let dir = self.cfg.state_dir.join("jobs");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(failed(dir.display()))? {
            let e = e.map_err(failed(dir.display()))?;
            let name = e.file_name();
            let Some(job) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".json"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            if let Some(r) = self.record(job)? {
                out.push(r);
            }
        }
        out.sort_by_key(|r| r.job);
        Ok(out)
    }

    fn remove_record(&self, job: u64) -> Result<(), Error> {
        gpuq_durable::remove(&self.record_path(job))
            .map(|_| ())
            .map_err(failed(format!("removing the record of job {job}")))
    }

    /// The lease record `lease`, read as it is (no recovery on open).
    fn lease(&self, lease: &str) -> Result<Option<Lease>, Error> {
        let p = self.leases_dir().join(format!("{lease}.json"));
        match std::fs::read(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed(p.display())(e)),
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                Error::Failed(format!(
                    "{}: unreadable ({e}); an operator must look",
                    p.display()
                ))
            }),
        }
    }

    /// The site's DAOS side: the lease store (a lease found preparing is
    /// held here: its driver died) and the node links.
    fn daos(&self) -> Result<std::sync::Arc<Daos>, Error> {
        Daos::start(
            self.cfg.daos.clone(),
            &self.leases_dir(),
            gpuq_protocol::time::now(),
        )
        .map_err(|e| Error::Failed(format!("starting the DAOS side: {e}")))
    }
}

fn libc_flags() -> i32 {
    nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC
}

/// What the lifecycle needs from a Slurm-driven lease: Slurm ends the job's
/// processes itself before it calls the teardown; progress lines go to
/// stderr, which the lua script passes to slurmctld's log.
#[derive(Debug)]
pub struct SlurmSteps {
    pub job: Option<u64>,
}

#[async_trait::async_trait]
impl LocalSteps for SlurmSteps {
    async fn kill_job(&self, _lease: &Lease) -> Result<String, LocalError> {
        Ok(match self.job {
            Some(j) => format!("Slurm ended job {j}'s processes before its teardown"),
            None => "the lease's Slurm job has ended (its teardown was called or given up)".into(),
        })
    }

    fn note(&self, line: &str) {
        eprintln!("gpuq-slurm: {line}");
    }
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
    let dir = cfg.state_dir.join("leases");
    // Held: `blocked.json`, or an active lease whose record says so (the
    // hold file alone removed by hand is no way out), or either unreadable.
    let active_held = || -> Result<bool, ()> {
        let a = match std::fs::read(dir.join("active.json")) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(_) => return Err(()),
            Ok(b) => b,
        };
        let v: serde_json::Value = serde_json::from_slice(&a).map_err(|_| ())?;
        let name = v["lease"].as_str().ok_or(())?;
        if !gpuq_protocol::node::valid_lease(name) {
            return Err(());
        }
        let b = std::fs::read(dir.join(format!("{name}.json"))).map_err(|_| ())?;
        let l: Lease = serde_json::from_slice(&b).map_err(|_| ())?;
        Ok(matches!(l.phase, Phase::Held { .. }))
    };
    let free = matches!(gpuq_lease::blocked_in(&dir), Ok(None)) && active_held() == Ok(false);
    serde_json::json!({
        "pools": [{"id": cfg.pool, "quantity": u32::from(free), "granularity": 1}]
    })
    .to_string()
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
    // The lease's agent runs on this host only: a job that asks for other
    // nodes is refused; one that asks for none is pinned here, before
    // Slurm allocates it (setup runs while the job is pending).
    let pinned = pin(&st.cfg, job).await?;
    let now = gpuq_protocol::time::now();
    let r = JobRecord {
        job,
        uid,
        gid,
        profile,
        lease: lease_name(job, now),
        setup_at: now,
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
pub async fn data_in(st: &State, job: u64) -> Result<String, Error> {
    let r = need_record(st, job)?;
    let daos = st.daos()?;
    let steps = SlurmSteps { job: Some(job) };
    let out = async {
        let host = daos
            .host(&r.profile)
            .map_err(|e| Error::Failed(e.to_string()))?;
        let owner = format!("slurm job {job} (uid {})", r.uid);
        match daos.prepare(&r.lease, &owner, r.uid, &r.profile, &host, &steps).await {
            Ok(_) => Ok(format!(
                "job {job}: lease {} ready: 4 ranks joined, agent up",
                r.lease
            )),
            Err(e) => {
                let why = e.to_string();
                match daos.cleanup_for(&r.lease, &steps).await {
                    Ok(_) => Err(Error::Failed(format!(
                        "job {job}: the DAOS site could not be prepared ({why}); it was cleaned up and released"
                    ))),
                    Err(c) => Err(Error::Held(format!(
                        "job {job}: the DAOS site could not be prepared ({why}), and its cleanup did not finish ({c}); the site is held: `gpuq-slurm recover`"
                    ))),
                }
            }
        }
    }
    .await;
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
    let env = gpuq_lifecycle::host::job_env(&st.cfg.daos.run_dir, &p.system, &p.env, &r.lease);
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

/// A Slurm command (`squeue`, `scontrol`) with `args`, within 30 s (its
/// process killed past that): its output, whatever its exit status.
async fn slurm_cmd(cmd: &Path, args: &[&str]) -> Result<std::process::Output, Error> {
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(cmd)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| Error::Failed(format!("{} did not answer within 30s", cmd.display())))?
    .map_err(failed(cmd.display()))
}

/// `squeue` about one job: the field `format` of `job` (any state), or
/// `None` once Slurm no longer knows the job (it ended long ago).
async fn squeue(cfg: &Config, job: u64, format: &str) -> Result<Option<String>, Error> {
    let (id, fields) = (job.to_string(), format!("%i|{format}"));
    let args = [
        "--noheader",
        "--states=all",
        "--jobs",
        &id,
        "--format",
        &fields,
    ];
    let out = slurm_cmd(&cfg.squeue, &args).await?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if err.contains("Invalid job id") {
            return Ok(None);
        }
        return Err(Error::Failed(format!(
            "{} for job {job}: {} {}",
            cfg.squeue.display(),
            out.status,
            err.trim()
        )));
    }
    // `ID|field` (the field may be empty: no node list asked for).
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{job}|")))
        .map(|f| f.trim().to_string()))
}

/// Make `job` run on `agent_host`: refused if it asks for other nodes.
async fn pin(cfg: &Config, job: u64) -> Result<String, Error> {
    let asked = squeue(cfg, job, "%n")
        .await?
        .ok_or_else(|| Error::Failed(format!("Slurm does not know job {job}")))?;
    let host = &cfg.agent_host;
    if asked == *host {
        return Ok(format!("it asked for {host}"));
    }
    if !asked.is_empty() && asked != "(null)" {
        return Err(Error::Refused(format!(
            "job {job} asks for nodes {asked:?}, but the DAOS site's agent runs on {host} only: submit DAOS jobs with --nodelist={host} or without a node list (docs/slurm.md)"
        )));
    }
    let (id, nodes) = (format!("JobId={job}"), format!("ReqNodeList={host}"));
    let out = slurm_cmd(&cfg.scontrol, &["update", &id, &nodes]).await?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "{} update JobId={job} ReqNodeList={host}: {} {}",
            cfg.scontrol.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(format!("pinned to {host}, where its agent runs"))
}

/// Slurm job states after which no teardown of the job comes any more.
fn ended(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "CONFIGURING"
            | "RUNNING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_FED"
            | "REQUEUE_HOLD"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
            | "RESV_DEL_HOLD"
            | "SPECIAL_EXIT"
    )
}

/// `pre-run JOB`: the job's nodes, as Slurm gave them, are this host: the
/// agent's socket exists nowhere else.
pub async fn pre_run(st: &State, job: u64) -> Result<String, Error> {
    let r = need_record(st, job)?;
    let nodes = squeue(&st.cfg, job, "%N")
        .await?
        .ok_or_else(|| Error::Failed(format!("Slurm does not know job {job}")))?;
    if nodes != st.cfg.agent_host {
        return Err(Error::Refused(format!(
            "job {job} was given {nodes:?}, but lease {}'s DAOS agent runs on {} only: submit DAOS jobs with --nodelist={} (docs/slurm.md)",
            r.lease, st.cfg.agent_host, st.cfg.agent_host
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
    let steps = SlurmSteps { job: Some(job) };
    let out = async {
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
            Phase::Held { step: None, .. } => daos.recover(&steps).await.map(Some),
            _ => daos.cleanup_for(&r.lease, &steps).await,
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
    daos.close().await;
    out
}

/// `recover` (an operator, as root): the active lease's cleanup from its
/// first unconfirmed step, then every record whose lease is released or
/// gone.
pub async fn recover(st: &State) -> Result<String, Error> {
    let daos = st.daos()?;
    let steps = SlurmSteps { job: None };
    let out = async {
        let mut lines = Vec::new();
        if daos.active().is_some() {
            let m = daos
                .recover(&steps)
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
    daos.close().await;
    out
}

/// `status`: the pool, the hold, the active lease and the job records,
/// from the records alone (no node is asked; `scontrol show bbstat`).
pub fn status(st: &State) -> Result<serde_json::Value, Error> {
    let blocked =
        gpuq_lease::blocked_in(&st.leases_dir()).map_err(|e| Error::Failed(e.to_string()))?;
    let store_active = std::fs::read(st.leases_dir().join("active.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
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
        "free": blocked.is_none() && jobs.is_empty(),
        "held": blocked.map(|b| serde_json::json!({"lease": b.lease, "reason": b.reason})),
        "active": store_active,
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

    const DAOS: &str = r#"
[daos]
run_dir = "/run/gpuq/daos"
podman_socket = "/run/podman/podman.sock"
forward_dir = "/run/gpuq/links"
identity_file = "/etc/gpuq/id"
known_hosts_file = "/etc/gpuq/known_hosts"
[[daos.nodes]]
name = "da1"
host = "da1"
[daos.profiles.test]
image = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
replicas = ["da1"]
"#;

    fn cfg(slurm: &str, daos: &str) -> Result<Config, Error> {
        parse(
            Path::new("/etc/gpuq/slurm.toml"),
            &format!("{slurm}\n{daos}"),
        )
    }

    #[test]
    fn defaults_and_the_one_profile() {
        let c = cfg("[slurm]\nagent_host = \"cxl2\"", DAOS).unwrap();
        assert_eq!(c.state_dir, Path::new("/var/lib/gpuq/slurm"));
        assert_eq!(c.pool, "daos");
        assert_eq!(c.default_profile, "test");
        assert_eq!(c.squeue, Path::new("/usr/bin/squeue"));
        assert_eq!(c.scontrol, Path::new("/usr/bin/scontrol"));
        assert_eq!(c.lock_wait, Duration::from_secs(600));
    }

    #[test]
    fn every_bad_value_is_one_line_naming_its_key() {
        let two = format!(
            "{DAOS}[daos.profiles.other]\nimage = \"sha256:{}\"\nreplicas = [\"da1\"]\n",
            "1".repeat(64)
        );
        let cases: Vec<(String, &str, &str)> = vec![
            ("[slurm]".into(), DAOS, "agent_host"),
            (
                "[slurm]\nagent_host = \"cxl2\"\nstate = 1".into(),
                DAOS,
                "state",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"\nstate_dir = \"rel\"".into(),
                DAOS,
                "slurm.state_dir",
            ),
            (
                "[slurm]\nagent_host = \"a b\"".into(),
                DAOS,
                "slurm.agent_host",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"\npool = \"a/b\"".into(),
                DAOS,
                "slurm.pool",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"\ndefault_profile = \"nope\"".into(),
                DAOS,
                "slurm.default_profile",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"".into(),
                &two,
                "slurm.default_profile",
            ),
        ];
        for (slurm, daos, key) in cases {
            let e = cfg(&slurm, daos).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{slurm}: {e}");
            let e = e.to_string();
            assert!(e.contains(key) && !e.contains('\n'), "{slurm}: {e}");
        }
    }

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

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../../config/slurm/slurm.toml");
        let c = parse(Path::new("config/slurm/slurm.toml"), text).unwrap();
        assert_eq!(c.agent_host, "cxl2");
        assert_eq!(c.default_profile, "inst1");
        assert_eq!(c.daos.nodes.len(), 4);
    }

    #[test]
    fn lease_names_are_valid_lease_names() {
        let n = lease_name(4_294_967_295, 1_796_390_124);
        assert_eq!(n, "slurm4294967295-1796390124");
        assert!(gpuq_protocol::node::valid_lease(&n));
    }
}
