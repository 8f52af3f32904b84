//! The broker's core: the queue's single source of truth.
//!
//! The scheduler decides (through [`crate::policy::decide`]) when the next
//! job may start; a supervisor task per running job waits for it, enforces
//! its time limit and carries out cancels. Every transition is committed to
//! the store before it is acted upon: `running` is written before the job is
//! spawned (a crash in between leaves a job that is reported `lost`, never
//! one that runs twice), and a job's end is written only after its processes
//! are gone.

use crate::config::BrokerConfig;
use crate::error::ApiError;
use crate::gpu::GpuProbe;
use crate::joblog;
use crate::now;
use crate::policy::{self, Gate, GateInputs};
use crate::runner::{JobSpec, Outcome, Runner};
use crate::store::{Ending, Job, NewJob, Store};
use bytes::Bytes;
use gpuq_protocol::duration;
use gpuq_protocol::{
    BrokerStatus, HoldInfo, JobId, JobList, JobState, JobView, LockInfo, SubmitRequest,
    SubmitResponse,
};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Notify};

/// Who is asking, as the kernel says (`SO_PEERCRED`, `SO_PEERGROUPS`).
#[derive(Debug, Clone)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    pub groups: Vec<u32>,
}

impl Peer {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// `--stor` kinds the product knows (mission.md §1).
pub const STOR_KINDS: [&str; 3] = ["lustre", "nfsrdma", "nvmeof"];
const MAX_NAME: usize = 64;

#[derive(Debug)]
struct CancelReq {
    by: String,
    done: oneshot::Sender<()>,
}

#[derive(Debug)]
pub struct Broker {
    cfg: BrokerConfig,
    store: Store,
    runner: Arc<dyn Runner>,
    gpu: Arc<dyn GpuProbe>,
    wake: Notify,
    /// Running jobs and the channel to their supervisor. Also serialises
    /// every queued → running/cancelled transition.
    running: Mutex<HashMap<JobId, oneshot::Sender<CancelReq>>>,
    gate_reason: Mutex<Option<String>>,
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| format!("uid{uid}"))
}

fn who(peer: &Peer) -> String {
    format!("{} (uid {})", user_name(peer.uid), peer.uid)
}

impl Broker {
    pub fn new(
        cfg: BrokerConfig,
        store: Store,
        runner: Arc<dyn Runner>,
        gpu: Arc<dyn GpuProbe>,
    ) -> Arc<Self> {
        Arc::new(Broker {
            cfg,
            store,
            runner,
            gpu,
            wake: Notify::new(),
            running: Mutex::new(HashMap::new()),
            gate_reason: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.cfg
    }

    fn running_guard(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<JobId, oneshot::Sender<CancelReq>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ── lock and hold ────────────────────────────────────────────────────

    /// The maintenance lock; an unreadable lock file counts as locked.
    pub fn lock_state(&self) -> Option<LockInfo> {
        read_lock(&self.cfg.maintenance_file)
    }

    /// The recovery hold (`<state_dir>/blocked.json`); an unreadable file holds.
    pub fn hold_state(&self) -> Option<HoldInfo> {
        read_hold(&self.cfg.state_dir.join("blocked.json"))
    }

    pub fn lock(&self, peer: &Peer, reason: &str) -> Result<LockInfo, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may lock the queue: run `sudo gpuq lock --reason ...`".into(),
            ));
        }
        let reason = reason.trim();
        if reason.is_empty() || reason.len() > 500 || reason.chars().any(char::is_control) {
            return Err(ApiError::BadRequest(
                "lock reason must be 1-500 characters of plain text, e.g. --reason 'DAOS maintenance'"
                    .into(),
            ));
        }
        let info = LockInfo {
            reason: reason.to_string(),
            by_uid: peer.uid,
            by_user: user_name(peer.uid),
            since: now(),
        };
        let path = &self.cfg.maintenance_file;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(ApiError::LockFile)?;
        }
        let bytes = serde_json::to_vec_pretty(&info).unwrap_or_default();
        gpuq_durable::write_atomic(path, &bytes, 0o644).map_err(ApiError::LockFile)?;
        tracing::info!(
            by = info.by_user,
            reason = info.reason,
            "maintenance lock set"
        );
        Ok(info)
    }

    pub fn unlock(&self, peer: &Peer) -> Result<Option<LockInfo>, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may unlock the queue: run `sudo gpuq unlock`".into(),
            ));
        }
        let old = self.lock_state();
        gpuq_durable::remove(&self.cfg.maintenance_file).map_err(ApiError::LockFile)?;
        tracing::info!(by = %who(peer), "maintenance lock released");
        self.wake.notify_one();
        Ok(old)
    }

    // ── submit, list, status, cancel ─────────────────────────────────────

    pub fn submit(&self, peer: &Peer, req: SubmitRequest) -> Result<SubmitResponse, ApiError> {
        let bad = |m: String| Err(ApiError::BadRequest(m));
        if req.argv.is_empty() || req.argv[0].is_empty() {
            return bad("no command given: use `gpuq submit -- CMD [ARGS...]`".into());
        }
        let has_nul = |s: &str| s.contains('\0');
        if req.argv.iter().any(|a| has_nul(a))
            || has_nul(&req.cwd)
            || req.env.iter().any(|(k, v)| has_nul(k) || has_nul(v))
        {
            return bad("command, directory and environment must not contain NUL bytes".into());
        }
        if !req.cwd.starts_with('/') {
            return bad(format!("working directory '{}' is not absolute", req.cwd));
        }
        if let Some(name) = &req.name {
            if name.is_empty()
                || name.chars().count() > MAX_NAME
                || name.chars().any(char::is_control)
            {
                return bad(format!("--name must be 1-{MAX_NAME} printable characters"));
            }
        }
        let limit = match &req.time {
            None => self.cfg.default_time_secs,
            Some(t) => duration::parse(t).map_err(|e| ApiError::BadRequest(e.to_string()))?,
        };
        if limit > self.cfg.max_time_secs {
            return bad(format!(
                "time limit {} is longer than this host's maximum {}",
                duration::format(limit),
                duration::format(self.cfg.max_time_secs)
            ));
        }
        if let Some(kind) = &req.stor {
            if !STOR_KINDS.contains(&kind.as_str()) {
                return bad(format!(
                    "--stor '{kind}' is not a storage kind: use one of {}",
                    STOR_KINDS.join(", ")
                ));
            }
            return Err(ApiError::NotEnabled(format!(
                "kernel storage jobs (--stor {kind}) are not enabled on this broker"
            )));
        }
        if let Some(inst) = &req.inst {
            return Err(ApiError::NotEnabled(format!(
                "DAOS profile '{inst}' is not configured on this broker: DAOS jobs (--inst) are not enabled here yet"
            )));
        }
        if !peer.is_root() {
            if let Some(l) = self.lock_state() {
                return Err(ApiError::Locked(format!(
                    "{} (locked by {} since {})",
                    l.reason,
                    l.by_user,
                    gpuq_protocol::time::format_utc(l.since)
                )));
            }
        }
        joblog::prepare_user_dir(&self.cfg.log_root, peer.uid, peer.gid)?;
        let new = NewJob {
            uid: peer.uid,
            gid: peer.gid,
            groups: peer.groups.clone(),
            user: user_name(peer.uid),
            argv: req.argv,
            cwd: req.cwd,
            env: req.env,
            name: req.name,
            inst: req.inst,
            stor: req.stor,
            time_limit_secs: limit,
            submitted_at: now(),
        };
        let job = self.store.insert(&new, &self.cfg.log_root)?;
        // The job is durable from here on. Its log belongs to the user.
        if let Err(e) = joblog::create(&job.log_path, job.uid, job.gid) {
            let end = Ending {
                state: JobState::Failed,
                exit_code: None,
                signal: None,
                reason: Some(format!("cannot create log: {e}")),
                ended_at: now(),
            };
            let _guard = self.running_guard();
            self.store.finish(job.id, JobState::Queued, &end)?;
            return Err(e.into());
        }
        joblog::note(
            &job.log_path,
            job.uid,
            &format!(
                "job {} queued by {}: {} (limit {})",
                job.id,
                who(peer),
                shell_words(&job.argv),
                duration::format(limit)
            ),
        );
        let position = self
            .store
            .count(&[JobState::Queued, JobState::Running], Some(job.id))?;
        tracing::info!(job = %job.id, uid = job.uid, "queued");
        self.wake.notify_one();
        Ok(SubmitResponse {
            id: job.id,
            log_path: job.log_path.display().to_string(),
            position,
        })
    }

    pub fn list(&self, all: bool) -> Result<JobList, ApiError> {
        let mut jobs = Vec::new();
        self.list_each(all, |v| jobs.push(v))?;
        Ok(JobList {
            jobs,
            broker: self.status()?,
        })
    }

    /// The same list as [`Broker::list`], as JSON, encoded row by row.
    pub fn list_json(&self, all: bool) -> Result<Vec<u8>, ApiError> {
        let mut out = b"{\"jobs\":[".to_vec();
        let mut first = true;
        self.list_each(all, |v| {
            if !first {
                out.push(b',');
            }
            first = false;
            // Serialising our own plain structs into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut out, &v);
        })?;
        out.extend_from_slice(b"],\"broker\":");
        let _ = serde_json::to_writer(&mut out, &self.status()?);
        out.push(b'}');
        Ok(out)
    }

    fn list_each(&self, all: bool, f: impl FnMut(JobView)) -> Result<(), ApiError> {
        let states = [JobState::Queued, JobState::Running];
        Ok(self.store.for_each_view((!all).then_some(&states[..]), f)?)
    }

    pub fn status(&self) -> Result<BrokerStatus, ApiError> {
        let running = self.store.jobs(Some(&[JobState::Running]), false)?;
        let queued = self.store.count(&[JobState::Queued], None)?;
        Ok(BrokerStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            lock: self.lock_state(),
            hold: self.hold_state(),
            gate_closed: self
                .gate_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            running: running.first().map(|j| j.id),
            queued,
            runner: self.runner.name().to_string(),
            gpu: self.gpu.name().to_string(),
        })
    }

    fn job_for(&self, peer: &Peer, id: JobId, verb: &str) -> Result<Job, ApiError> {
        let job = self.store.get(id)?.ok_or(ApiError::NoSuchJob(id))?;
        if !policy::may_act_on(peer.uid, &job) {
            return Err(ApiError::Forbidden(format!(
                "job {id} belongs to {}; you may {verb} only your own jobs",
                job.user
            )));
        }
        Ok(job)
    }

    pub fn job(&self, id: JobId) -> Result<JobView, ApiError> {
        Ok(self.store.get(id)?.ok_or(ApiError::NoSuchJob(id))?.view())
    }

    /// Cancel a queued or running job. Returns once its processes are gone.
    pub async fn cancel(&self, peer: &Peer, id: JobId) -> Result<JobView, ApiError> {
        let job = self.job_for(peer, id, "cancel")?;
        let by = who(peer);
        let waiter = {
            let mut running = self.running_guard();
            if let Some(tx) = running.remove(&id) {
                let (done_tx, done_rx) = oneshot::channel();
                // If the supervisor is already finishing, the send fails and
                // the job ends as it ends.
                let _ = tx.send(CancelReq {
                    by: by.clone(),
                    done: done_tx,
                });
                Some(done_rx)
            } else {
                let end = Ending {
                    state: JobState::Cancelled,
                    exit_code: None,
                    signal: None,
                    reason: Some(format!("cancelled by {by} before it started")),
                    ended_at: now(),
                };
                if !self.store.finish(id, JobState::Queued, &end)? {
                    return Err(ApiError::Conflict(format!(
                        "job {id} is already {}; nothing to cancel",
                        self.store.get(id)?.map(|j| j.state).unwrap_or(job.state)
                    )));
                }
                joblog::note(
                    &job.log_path,
                    job.uid,
                    &format!("job {id} cancelled by {by} before it started"),
                );
                None
            }
        };
        if let Some(rx) = waiter {
            let _ = rx.await;
        }
        self.wake.notify_one();
        self.job(id)
    }

    /// Stream a job's log; with `follow`, until the job has ended.
    pub fn log_stream(
        self: &Arc<Self>,
        peer: &Peer,
        id: JobId,
        follow: bool,
    ) -> Result<mpsc::Receiver<Bytes>, ApiError> {
        let job = self.job_for(peer, id, "read the log of")?;
        let mut file = joblog::open_existing(&job.log_path, job.uid, false)?;
        let (tx, rx) = mpsc::channel::<Bytes>(8);
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                // Look at the state *before* draining: the broker writes its
                // last line before it records the end, so after a drain that
                // started at "finished" nothing more will come.
                let finished = !follow
                    || me
                        .store
                        .get(id)
                        .ok()
                        .flatten()
                        .is_none_or(|j| j.state.is_finished());
                loop {
                    match file.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => return,
                    }
                }
                if finished {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(rx)
    }

    // ── scheduling and supervision ───────────────────────────────────────

    /// On start-up: re-adopt jobs whose processes still run; settle the
    /// others from what the runner recorded. Never starts a job again.
    pub async fn recover(self: &Arc<Self>) -> Result<(), ApiError> {
        for job in self.store.by_state(&[JobState::Running])? {
            if self.runner.alive(job.id).await? {
                tracing::info!(job = %job.id, "re-adopting running job");
                joblog::note(
                    &job.log_path,
                    job.uid,
                    &format!("job {} re-adopted by a restarted broker", job.id),
                );
                let (tx, rx) = oneshot::channel();
                self.running_guard().insert(job.id, tx);
                tokio::spawn(Arc::clone(self).supervise(job, rx));
            } else {
                let outcome = self.runner.wait(job.id).await;
                let end = match outcome {
                    Ok(Some(o)) => ending_from(o),
                    Ok(None) => Ending {
                        state: JobState::Lost,
                        exit_code: None,
                        signal: None,
                        reason: Some(
                            "the broker stopped while this job was starting or running and no exit status was recorded; it was not run again".into(),
                        ),
                        ended_at: now(),
                    },
                    Err(e) => lost(format!("cannot settle after restart: {e}")),
                };
                self.record_end(&job, &end);
            }
        }
        Ok(())
    }

    /// The scheduler: evaluate the gate whenever something changed, and at
    /// least once a second (the GPU and the lock file change behind our back).
    pub async fn run_scheduler(self: Arc<Self>) {
        loop {
            if let Err(e) = self.tick().await {
                tracing::error!("scheduler: {e}");
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn tick(self: &Arc<Self>) -> Result<(), ApiError> {
        let queued = self.store.queue()?;
        let lock = self.lock_state();
        let hold = self.hold_state();
        let running = !self.running_guard().is_empty();
        // Ask the GPU only when its answer matters.
        let gpu = if queued.is_empty() || running || hold.is_some() {
            Ok(None)
        } else {
            self.gpu.busy()
        };
        let gate = policy::decide(
            &queued,
            &GateInputs {
                hold: hold.as_ref(),
                lock: lock.as_ref(),
                running,
                gpu,
            },
        );
        match gate {
            Gate::Wait(why) => {
                *self.gate_reason.lock().unwrap_or_else(|p| p.into_inner()) = why;
            }
            Gate::Start(id) => {
                *self.gate_reason.lock().unwrap_or_else(|p| p.into_inner()) = None;
                if let Some(job) = self.store.get(id)? {
                    self.start(job).await?;
                }
            }
        }
        Ok(())
    }

    async fn start(self: &Arc<Self>, mut job: Job) -> Result<(), ApiError> {
        let (tx, rx) = oneshot::channel();
        {
            let mut running = self.running_guard();
            // Write before act: `running` is durable before anything is spawned.
            let started = now();
            if !self.store.mark_running(job.id, started)? {
                return Ok(()); // cancelled meanwhile
            }
            job.state = JobState::Running;
            job.started_at = Some(started);
            running.insert(job.id, tx);
        }
        let spec = JobSpec {
            id: job.id,
            uid: job.uid,
            gid: job.gid,
            groups: job.groups.clone(),
            user: job.user.clone(),
            argv: job.argv.clone(),
            cwd: job.cwd.clone(),
            env: policy::filter_env(&job.env, job.id.0),
            log_path: job.log_path.clone(),
            time_limit_secs: job.time_limit_secs,
        };
        let started = async {
            let log = joblog::create(&job.log_path, job.uid, job.gid)?;
            joblog::note(
                &job.log_path,
                job.uid,
                &format!(
                    "job {} started as {} (uid {}) in {} with the {} runner, limit {}",
                    job.id,
                    job.user,
                    job.uid,
                    job.cwd,
                    self.runner.name(),
                    duration::format(job.time_limit_secs)
                ),
            );
            self.runner.start(&spec, log).await?;
            Ok::<(), ApiError>(())
        }
        .await;
        match started {
            Ok(()) => {
                tracing::info!(job = %job.id, "started");
                tokio::spawn(Arc::clone(self).supervise(job, rx));
            }
            Err(e) => {
                let _ = self.runner.kill(job.id).await;
                let end = Ending {
                    state: JobState::Failed,
                    exit_code: None,
                    signal: None,
                    reason: Some(format!("could not start: {e}")),
                    ended_at: now(),
                };
                self.record_end(&job, &end);
            }
        }
        Ok(())
    }

    async fn supervise(self: Arc<Self>, job: Job, mut cancel: oneshot::Receiver<CancelReq>) {
        let id = job.id;
        let started = job.started_at.unwrap_or_else(now);
        let left = (started + job.time_limit_secs as i64 - now()).max(0) as u64;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(left);
        enum Why {
            Exited(Result<Option<Outcome>, crate::runner::RunnerError>),
            Timeout,
            Cancelled(CancelReq),
        }
        let why = tokio::select! {
            r = self.runner.wait(id) => Why::Exited(r),
            _ = tokio::time::sleep_until(deadline) => Why::Timeout,
            Ok(req) = &mut cancel => Why::Cancelled(req),
        };
        let mut done = None;
        let end = match why {
            Why::Exited(Ok(Some(o))) => ending_from(o),
            Why::Exited(Ok(None)) => {
                lost("the job's processes ended without an exit status".into())
            }
            Why::Exited(Err(e)) => {
                let _ = self.runner.kill(id).await;
                lost(format!("lost track of the job: {e}"))
            }
            Why::Timeout => {
                joblog::note(
                    &job.log_path,
                    job.uid,
                    &format!(
                        "job {id} reached its time limit {}: ending all its processes",
                        duration::format(job.time_limit_secs)
                    ),
                );
                let killed = self.runner.kill(id).await;
                Ending {
                    state: JobState::Timeout,
                    exit_code: None,
                    signal: Some(libc::SIGKILL),
                    reason: Some(match killed {
                        Ok(()) => format!(
                            "time limit {} reached",
                            duration::format(job.time_limit_secs)
                        ),
                        Err(e) => format!("time limit reached; killing failed: {e}"),
                    }),
                    ended_at: now(),
                }
            }
            Why::Cancelled(req) => {
                joblog::note(
                    &job.log_path,
                    job.uid,
                    &format!("job {id} cancelled by {}: ending all its processes", req.by),
                );
                let killed = self.runner.kill(id).await;
                done = Some(req.done);
                Ending {
                    state: JobState::Cancelled,
                    exit_code: None,
                    signal: Some(libc::SIGKILL),
                    reason: Some(match killed {
                        Ok(()) => format!("cancelled by {}", req.by),
                        Err(e) => format!("cancelled by {}; killing failed: {e}", req.by),
                    }),
                    ended_at: now(),
                }
            }
        };
        self.record_end(&job, &end);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    /// Log line, then the durable end, then forget the job's runtime state.
    fn record_end(self: &Arc<Self>, job: &Job, end: &Ending) {
        let elapsed = job
            .started_at
            .map(|s| duration::format((end.ended_at - s).max(0) as u64))
            .unwrap_or_else(|| "-".into());
        let status = match (end.exit_code, end.signal) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            (None, None) => "no exit status".into(),
        };
        let reason = end
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        joblog::note(
            &job.log_path,
            job.uid,
            &format!(
                "job {} ended {} with {status} after {elapsed}{reason}",
                job.id, end.state
            ),
        );
        if let Err(e) = self.store.finish(job.id, JobState::Running, end) {
            tracing::error!(job = %job.id, "cannot record the end: {e}");
        }
        let runner = Arc::clone(&self.runner);
        let id = job.id;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(e) = runner.release(id).await {
                tracing::warn!(job = %id, "release: {e}");
            }
            me.running_guard().remove(&id);
            me.wake.notify_one();
        });
        tracing::info!(job = %job.id, state = %end.state, "ended");
    }
}

fn ending_from(o: Outcome) -> Ending {
    let state = if o.exit_code == Some(0) {
        JobState::Completed
    } else {
        JobState::Failed
    };
    Ending {
        state,
        exit_code: o.exit_code,
        signal: o.signal,
        reason: None,
        ended_at: now(),
    }
}

fn lost(reason: String) -> Ending {
    Ending {
        state: JobState::Lost,
        exit_code: None,
        signal: None,
        reason: Some(reason),
        ended_at: now(),
    }
}

fn read_lock(path: &Path) -> Option<LockInfo> {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(unreadable(path, &e.to_string())),
        Ok(bytes) => Some(
            serde_json::from_slice::<LockInfo>(&bytes)
                .unwrap_or_else(|e| unreadable(path, &e.to_string())),
        ),
    }
}

fn unreadable(path: &Path, e: &str) -> LockInfo {
    LockInfo {
        reason: format!(
            "maintenance file {} is unreadable ({e}); the queue stays locked until root fixes it or runs `gpuq unlock`",
            path.display()
        ),
        by_uid: 0,
        by_user: "root".into(),
        since: 0,
    }
}

fn read_hold(path: &PathBuf) -> Option<HoldInfo> {
    let bytes = match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            return Some(HoldInfo {
                lease: "?".into(),
                reason: format!("{} unreadable: {e}", path.display()),
                since: 0,
            })
        }
        Ok(b) => b,
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    Some(HoldInfo {
        lease: s("lease").unwrap_or_else(|| "?".into()),
        reason: s("reason").unwrap_or_else(|| format!("{} is present", path.display())),
        since: v.get("since").and_then(|x| x.as_i64()).unwrap_or(0),
    })
}

/// Render argv for a log line (quotes only where needed).
pub fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
