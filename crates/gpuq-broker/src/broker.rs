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
use crate::crash::crash_point;
use crate::daos::{self as daosjob, Daos, JobLog, Local};
use crate::error::ApiError;
use crate::gpu::GpuProbe;
use crate::joblog;
use crate::limits::Connections;
use crate::metrics::Metrics;
use crate::now;
use crate::policy::{self, Gate, GateInputs};
use crate::runner::{JobSpec, Outcome, Runner};
use crate::store::{DaosPhase, Ending, Job, NewJob, Store};
use bytes::Bytes;
use gpuq_lease::{Lease, Phase as LeasePhase};
use gpuq_lifecycle::LocalSteps;
use gpuq_protocol::duration;
use gpuq_protocol::{
    BrokerStatus, HoldInfo, JobId, JobList, JobState, JobView, LockInfo, SubmitRequest,
    SubmitResponse,
};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch, Notify};

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
    /// The sender is taken by the first cancel; the entry stays until the
    /// job (and a DAOS job's cleanup) is over.
    running: Mutex<HashMap<JobId, Option<oneshot::Sender<CancelReq>>>>,
    gate_reason: Mutex<Option<String>>,
    /// DAOS jobs (`--inst`), when `[daos]` is configured.
    daos: Option<Arc<Daos>>,
    /// gpuq-slurm's configuration (`[slurm] config`): `daos-exec` also
    /// serves the Slurm DAOS jobs on this host.
    slurm: Option<gpuq_slurm::Config>,
    /// Open API connections by UID (the server admits through it).
    conns: Arc<Connections>,
    /// A job's end, for its `follow`ers: fired by [`Broker::finish_job`]
    /// right after the end is stored, so a follower never asks SQLite.
    /// An entry exists only while someone follows a job that has not ended.
    ends: Mutex<HashMap<JobId, watch::Sender<bool>>>,
    /// Serialises the per-user queue count with the insert it allows.
    submits: Mutex<()>,
    /// The last `jobs` array of `GET /v1/jobs` per (viewer UID, all), with
    /// the store generation it was read at: a user who lists in a loop
    /// costs a copy, not a pass over SQLite under the store's lock that
    /// every other request waits for (issue 13, the hostile-clients
    /// benchmark).
    lists: Mutex<HashMap<(u32, bool), CachedList>>,
    /// (generation, running job, queued count) of the last status: the
    /// same for every viewer until the store changes.
    counts: Mutex<Option<(u64, Option<JobId>, usize)>>,
    /// What `[metrics] listen` serves (kept whether or not it is served).
    metrics: Metrics,
    /// Held while `gpuq activate --execute` runs (one at a time).
    activation: tokio::sync::Mutex<()>,
}

/// A viewer's `jobs` array and the store generation it was read at.
type CachedList = (u64, Arc<Vec<u8>>);

/// Cached list views at most (one per recent viewer); past it the cache
/// starts over. Each is one user's view of the queue.
const LIST_CACHE_ENTRIES: usize = 16;

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
        daos: Option<Arc<Daos>>,
        slurm: Option<gpuq_slurm::Config>,
    ) -> Arc<Self> {
        let cfg_limits = cfg.limits.clone();
        Arc::new(Broker {
            cfg,
            store,
            runner,
            gpu,
            wake: Notify::new(),
            running: Mutex::new(HashMap::new()),
            gate_reason: Mutex::new(None),
            daos,
            slurm,
            conns: Connections::new(cfg_limits),
            ends: Mutex::new(HashMap::new()),
            submits: Mutex::new(()),
            lists: Mutex::new(HashMap::new()),
            counts: Mutex::new(None),
            metrics: Metrics::new(),
            activation: tokio::sync::Mutex::new(()),
        })
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// One scrape of `[metrics] listen`: the queue now, and every node
    /// helper's metrics over the links that are up (each within 2 s).
    pub async fn scrape(&self) -> String {
        let (running, queued) = self.counts().unwrap_or((None, 0));
        let nodes = match &self.daos {
            Some(d) => Some(d.node_metrics().await),
            None => None,
        };
        self.metrics.encode(
            queued,
            usize::from(running.is_some()),
            self.hold_state().is_some(),
            nodes,
        )
    }

    pub fn connections(&self) -> &Arc<Connections> {
        &self.conns
    }

    /// `GET /v1/stats` (root): open connections by UID, jobs being
    /// followed, and how many calls into SQLite the broker has made.
    pub fn stats(&self, peer: &Peer) -> Result<serde_json::Value, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may read the broker's statistics: run it with sudo".into(),
            ));
        }
        let (others, per_uid) = self.conns.snapshot();
        let followed = self.ends_guard().len();
        Ok(serde_json::json!({
            "connections": {
                "others": others,
                "per_uid": per_uid
                    .into_iter()
                    .map(|(u, n)| (u.to_string(), serde_json::Value::from(n)))
                    .collect::<serde_json::Map<_, _>>(),
            },
            "followed_jobs": followed,
            "store_queries": self.store.queries(),
        }))
    }

    /// `GET /v1/usage` (`gpuq stats`): the jobs that ended in
    /// `[since, until)` (default: the last 30 days), everyone's for root,
    /// the caller's own for anyone else.
    pub fn usage(
        &self,
        peer: &Peer,
        since: Option<i64>,
        until: Option<i64>,
    ) -> Result<gpuq_protocol::UsageReport, ApiError> {
        let until = until.unwrap_or_else(|| now() + 1);
        let since = since.unwrap_or(until - crate::usage::DEFAULT_DAYS * 86_400);
        if since >= until {
            return Err(ApiError::BadRequest(format!(
                "the period is empty: since ({}) is not before until ({})",
                gpuq_protocol::time::format_utc(since),
                gpuq_protocol::time::format_utc(until)
            )));
        }
        let all = peer.is_root();
        let uid = if all { None } else { Some(peer.uid) };
        let jobs = self.store.ended_between(since, until, uid)?;
        Ok(crate::usage::report(since, until, all, &jobs))
    }

    fn ends_guard(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, watch::Sender<bool>>> {
        self.ends.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record a job's end in the store (if it was in `from`) and wake its
    /// followers.
    fn finish_job(
        &self,
        id: JobId,
        from: JobState,
        end: &Ending,
    ) -> Result<bool, crate::store::StoreError> {
        let done = self.store.finish(id, from, end)?;
        if done {
            self.metrics.ended(&end.state.to_string());
            if let Some(tx) = self.ends_guard().remove(&id) {
                tx.send_replace(true);
            }
        }
        Ok(done)
    }

    pub(crate) fn runner(&self) -> &dyn Runner {
        &*self.runner
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub fn daos(&self) -> Option<&Arc<Daos>> {
        self.daos.as_ref()
    }

    pub fn slurm(&self) -> Option<&gpuq_slurm::Config> {
        self.slurm.as_ref()
    }

    /// This host's Slurm NodeName (`[slurm] node`, else gpuq-slurm's
    /// `agent_host`), when `[slurm] config` is set.
    pub fn slurm_node(&self) -> Option<&str> {
        let s = self.slurm.as_ref()?;
        Some(self.cfg.slurm_node.as_deref().unwrap_or(&s.agent_host))
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.cfg
    }

    fn running_guard(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<JobId, Option<oneshot::Sender<CancelReq>>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    // ── lock and hold ────────────────────────────────────────────────────

    /// The maintenance lock; an unreadable lock file counts as locked.
    pub fn lock_state(&self) -> Option<LockInfo> {
        read_lock(&self.cfg.maintenance_file)
    }

    /// The recovery hold (`<state_dir>/blocked.json`); an unreadable file holds.
    pub fn hold_state(&self) -> Option<HoldInfo> {
        read_hold(&self.cfg.state_dir)
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

    /// For a `--stor` submit (of a known kind, with `[daos]` on, its other
    /// fields valid), what each storage node's kernel offers; `None` for
    /// any other (which [`Broker::submit`] refuses without asking a node).
    pub async fn stor_nodes(
        &self,
        req: &SubmitRequest,
    ) -> Option<Vec<(String, Result<gpuq_protocol::node::StorKernel, String>)>> {
        let name = req.stor.as_deref()?;
        let daos = self.daos.as_ref()?;
        if !daos.is_stor_profile(name) {
            gpuq_protocol::node::StorKind::parse(name)?;
        }
        if req.inst.is_some() {
            return None;
        }
        crate::submit::fields(req, &self.cfg).ok()?;
        Some(self.daos.as_ref()?.stor_kernels().await)
    }

    /// Check and store a job. `stor_nodes`: [`Broker::stor_nodes`].
    pub fn submit(
        &self,
        peer: &Peer,
        req: SubmitRequest,
        stor_nodes: Option<&crate::submit::StorNodes>,
    ) -> Result<SubmitResponse, ApiError> {
        let daos = match &self.daos {
            None => crate::submit::Daos::Off(&self.cfg),
            Some(d) => crate::submit::Daos::Profiles(
                d.config().profiles.keys().cloned().collect(),
                d.config()
                    .stor
                    .iter()
                    .map(|(n, p)| (n.clone(), p.kind))
                    .collect(),
            ),
        };
        let limit = crate::submit::check(
            &req,
            &self.cfg,
            &daos,
            stor_nodes,
            &gpuq_lifecycle::nfs::privileged_ports_hold,
        )?;
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
        // The count and the insert it allows are one step: two submits at
        // once must not both pass at the limit.
        let _one_at_a_time = self.submits.lock().unwrap_or_else(|p| p.into_inner());
        let cap = self.cfg.limits.max_queued_per_user;
        if !peer.is_root() {
            let mine = self
                .store
                .queue()?
                .iter()
                .filter(|q| q.uid == peer.uid)
                .count();
            if mine >= cap {
                return Err(ApiError::TooMany(format!(
                    "you have {mine} jobs queued, the most one user may have \
                     (broker.max_queued_per_user = {cap}); wait for some to start or cancel some (`gpuq list`)"
                )));
            }
        }
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
            self.finish_job(job.id, JobState::Queued, &end)?;
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

    pub fn list(&self, peer: &Peer, all: bool) -> Result<JobList, ApiError> {
        let mut jobs = Vec::new();
        self.list_each(peer, all, |v| jobs.push(v))?;
        Ok(JobList {
            jobs,
            broker: self.status()?,
        })
    }

    /// The same list as [`Broker::list`], as JSON, encoded row by row. The
    /// `jobs` array comes from the cache when the store has not changed
    /// since this viewer's last list; the broker's status is always fresh.
    pub fn list_json(&self, peer: &Peer, all: bool) -> Result<Vec<u8>, ApiError> {
        let key = (peer.uid, all);
        let cached = {
            let lists = self.lists.lock().unwrap_or_else(|p| p.into_inner());
            lists
                .get(&key)
                .filter(|(generation, _)| *generation == self.store.generation())
                .map(|(_, jobs)| Arc::clone(jobs))
        };
        let jobs = match cached {
            Some(jobs) => jobs,
            None => {
                let mut jobs = Vec::new();
                let mut first = true;
                let generation = self.list_each(peer, all, |v| {
                    if !first {
                        jobs.push(b',');
                    }
                    first = false;
                    // Serialising our own plain structs into a Vec cannot fail.
                    let _ = serde_json::to_writer(&mut jobs, &v);
                })?;
                let jobs = Arc::new(jobs);
                let mut lists = self.lists.lock().unwrap_or_else(|p| p.into_inner());
                if lists.len() >= LIST_CACHE_ENTRIES && !lists.contains_key(&key) {
                    lists.clear();
                }
                lists.insert(key, (generation, Arc::clone(&jobs)));
                jobs
            }
        };
        let mut out = Vec::with_capacity(jobs.len() + 512);
        out.extend_from_slice(b"{\"jobs\":[");
        out.extend_from_slice(&jobs);
        out.extend_from_slice(b"],\"broker\":");
        let _ = serde_json::to_writer(&mut out, &self.status()?);
        out.push(b'}');
        Ok(out)
    }

    /// Each job of the list as `peer` sees it; returns the store generation
    /// read at.
    fn list_each(
        &self,
        peer: &Peer,
        all: bool,
        mut f: impl FnMut(JobView),
    ) -> Result<u64, ApiError> {
        let states = [JobState::Queued, JobState::Running];
        Ok(self
            .store
            .for_each_view_at((!all).then_some(&states[..]), |v| f(v.as_seen_by(peer.uid)))?)
    }

    pub fn status(&self) -> Result<BrokerStatus, ApiError> {
        let (running, queued) = self.counts()?;
        Ok(BrokerStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            lock: self.lock_state(),
            hold: self.hold_state(),
            gate_closed: self
                .gate_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            running,
            queued,
            runner: self.runner.name().to_string(),
            gpu: self.gpu.name().to_string(),
        })
    }

    /// The running job and the number queued, from the store only when it
    /// changed since they were last read. The generation is taken before
    /// the reads: a write in between leaves a stale generation behind,
    /// which only makes the next call read again.
    fn counts(&self) -> Result<(Option<JobId>, usize), ApiError> {
        let generation = self.store.generation();
        if let Some((g, running, queued)) = *self.counts.lock().unwrap_or_else(|p| p.into_inner()) {
            if g == generation {
                return Ok((running, queued));
            }
        }
        let running = self
            .store
            .jobs(Some(&[JobState::Running]), false)?
            .first()
            .map(|j| j.id);
        let queued = self.store.count(&[JobState::Queued], None)?;
        *self.counts.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((generation, running, queued));
        Ok((running, queued))
    }

    fn job_for(&self, peer: &Peer, id: JobId, verb: &str) -> Result<Job, ApiError> {
        let job = self.store.get(id)?.ok_or(ApiError::NoSuchJob(id))?;
        if !policy::may_act_on(peer.uid, job.uid) {
            return Err(ApiError::Forbidden(format!(
                "job {id} belongs to {}; you may {verb} only your own jobs",
                job.user
            )));
        }
        Ok(job)
    }

    pub fn job(&self, peer: &Peer, id: JobId) -> Result<JobView, ApiError> {
        Ok(self
            .store
            .get(id)?
            .ok_or(ApiError::NoSuchJob(id))?
            .into_view()
            .as_seen_by(peer.uid))
    }

    /// Cancel a queued or running job. Returns once its processes are gone.
    pub async fn cancel(&self, peer: &Peer, id: JobId) -> Result<JobView, ApiError> {
        let job = self.job_for(peer, id, "cancel")?;
        let by = who(peer);
        let waiter = {
            let mut running = self.running_guard();
            if let Some(slot) = running.get_mut(&id) {
                // Ended already (a DAOS job's lease may still be cleaning),
                // or a cancel is under way: nothing more to do.
                let state = self.store.get(id)?.map(|j| j.state).unwrap_or(job.state);
                let tx = match (state, slot.take()) {
                    (JobState::Running, Some(tx)) => tx,
                    (JobState::Running, None) => {
                        return Err(ApiError::Conflict(format!(
                            "job {id} is being cancelled already"
                        )))
                    }
                    (state, _) => {
                        return Err(ApiError::Conflict(format!(
                            "job {id} is already {state}; nothing to cancel{}",
                            if job.leased() {
                                " (its DAOS lease is still being cleaned up; see `gpuq daos-status`)"
                            } else {
                                ""
                            }
                        )))
                    }
                };
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
                if !self.finish_job(id, JobState::Queued, &end)? {
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
        self.job(peer, id)
    }

    /// Stream a job's log; with `follow`, until the job has ended.
    ///
    /// A follower asks SQLite nothing after the first look: the job's end
    /// reaches it through [`Broker::finish_job`] (a watch channel), and new
    /// output through a read of its own descriptor of the log every 200 ms.
    /// That read is a syscall on an open file (about a microsecond at the
    /// end of the file), not a query; inotify would save it, but costs an
    /// instance or watch against the kernel's per-user limits
    /// (`fs.inotify.max_user_instances` is 128 by default) for every
    /// follower, and a path in a directory the user owns.
    pub fn log_stream(
        self: &Arc<Self>,
        peer: &Peer,
        id: JobId,
        follow: bool,
    ) -> Result<mpsc::Receiver<Bytes>, ApiError> {
        // Subscribe before the look at the job's state: an end stored in
        // between would otherwise be missed.
        let mut watch = follow.then(|| EndWatch::new(self, id));
        let job = self.job_for(peer, id, "read the log of")?;
        let mut file = joblog::open_existing(&job.log_path, job.uid, false)?;
        let mut ended = !follow || job.state.is_finished();
        let (tx, rx) = mpsc::channel::<Bytes>(8);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                // Look at the state *before* draining: the broker writes its
                // last line before it records the end, so after a drain that
                // started at "ended" nothing more will come.
                if let Some(w) = &watch {
                    ended |= w.ended();
                }
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
                if ended {
                    return;
                }
                let changed = async {
                    match watch.as_mut() {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = changed => {}
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
        // An unreleased lease that was running or cleaning when the broker
        // stopped (one that was preparing was held when the store opened).
        let lease = self
            .daos
            .as_ref()
            .and_then(|d| d.active())
            .filter(|l| matches!(l.phase, LeasePhase::Running | LeasePhase::Cleaning));
        let mut resume = lease.clone();
        for job in self.store.by_state(&[JobState::Running])? {
            if job.leased() {
                let ours = lease
                    .as_ref()
                    .filter(|l| daosjob::job_of_lease(&l.lease) == Some(job.id));
                match ours {
                    Some(l) if l.phase == LeasePhase::Running => {
                        // Its system is up and its job was left running (or
                        // ended meanwhile): carry on where it was.
                        tracing::info!(job = %job.id, lease = %l.lease, "re-adopting a DAOS job");
                        self.end_stale_sessions(&job, l).await;
                        let (tx, rx) = oneshot::channel();
                        self.running_guard().insert(job.id, Some(tx));
                        tokio::spawn(Arc::clone(self).adopt_daos(job, rx, l.lease.clone()));
                        resume = None;
                    }
                    Some(_) => {
                        // Its preparation failed and was being cleaned up:
                        // the job never started; the cleanup resumes below.
                        let _ = self.runner.kill(job.id).await;
                        let end = lost(
                            "the broker stopped while this DAOS job's failed preparation was being cleaned up; the cleanup resumes".into(),
                        );
                        self.record_state(&job, &end);
                    }
                    None => {
                        // Its lease was held when the lease store opened
                        // (it was preparing, or held already): the
                        // experiment cannot go on on a system that must be
                        // cleaned.
                        let _ = self.runner.kill(job.id).await;
                        let end = lost(
                            "the broker stopped during this DAOS job's preparation; its processes were ended and its lease is held until an operator runs `sudo gpuq recover`".into(),
                        );
                        self.record_end(&job, &end);
                    }
                }
                continue;
            }
            if self.runner.alive(job.id).await? {
                tracing::info!(job = %job.id, "re-adopting running job");
                joblog::note(
                    &job.log_path,
                    job.uid,
                    &format!("job {} re-adopted by a restarted broker", job.id),
                );
                let (tx, rx) = oneshot::channel();
                self.running_guard().insert(job.id, Some(tx));
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
        if let Some(l) = resume {
            // Its job had ended: the cleanup, from its first unconfirmed step.
            match daosjob::job_of_lease(&l.lease).and_then(|id| self.store.get(id).ok().flatten()) {
                Some(job) => {
                    tokio::spawn(Arc::clone(self).resume_cleanup(job, l.lease.clone()));
                }
                None => {
                    if let Some(d) = &self.daos {
                        let reason = "a restarted broker found this lease unreleased but not its job in the queue";
                        if let Err(e) = d.hold(&l.lease, reason) {
                            tracing::error!(lease = %l.lease, "holding the lease: {e}");
                        }
                    }
                }
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
        // One look at each input: the whole decision is made on it (a hold
        // file deleted between two looks must not open the gate).
        let hold = self.hold_state();
        let running = !self.running_guard().is_empty();
        if !running && hold.is_none() {
            // An unreleased lease closes the gate even if `blocked.json` is
            // missing (deleted by hand is not a way out), and so does a lease
            // pointer that cannot be read: fail closed. Only the lease's own
            // supervisor or `recover` moves it on.
            if let Some(why) = self.daos.as_ref().and_then(|d| d.unreleased()) {
                *self.gate_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                return Ok(());
            }
        }
        let queued = self.store.queue()?;
        let lock = self.lock_state();
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
            // A hold written since the gate looked (`gpuq activate
            // --execute` writes its own under this lock): not now.
            if self.hold_state().is_some() {
                return Ok(());
            }
            // Write before act: `running` is durable before anything is spawned.
            let started = now();
            if !self.store.mark_running(job.id, started)? {
                return Ok(()); // cancelled meanwhile
            }
            job.state = JobState::Running;
            job.started_at = Some(started);
            running.insert(job.id, Some(tx));
        }
        self.metrics.started(
            job.leased(),
            (job.started_at.unwrap_or_else(now) - job.submitted_at) as f64,
        );
        if job.leased() {
            tokio::spawn(Arc::clone(self).supervise_daos(job, rx));
            return Ok(());
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

    /// A job's time limit, counted from its start (a DAOS job's preparation
    /// inside it), as an instant of this process.
    fn deadline_of(job: &Job) -> tokio::time::Instant {
        let started = job.started_at.unwrap_or_else(now);
        let left = (started + job.time_limit_secs as i64 - now()).max(0) as u64;
        tokio::time::Instant::now() + Duration::from_secs(left)
    }

    /// Wait for a started job: its end, its time limit or a cancel.
    async fn wait_job(
        &self,
        id: JobId,
        deadline: tokio::time::Instant,
        cancel: &mut oneshot::Receiver<CancelReq>,
    ) -> Why {
        tokio::select! {
            r = self.runner.wait(id) => Why::Exited(r),
            _ = tokio::time::sleep_until(deadline) => Why::Timeout(When::Running),
            Ok(req) = cancel => Why::Cancelled(req, When::Running),
        }
    }

    /// How a job ended, from why its wait ended; a timed-out or cancelled
    /// job's processes are ended first. `daos`: its lease's cleanup comes
    /// next (the log says so). Also the cancel's waiter, to be told once the
    /// end is stored.
    async fn ending(
        &self,
        job: &Job,
        why: Why,
        daos: bool,
    ) -> (Ending, Option<oneshot::Sender<()>>) {
        let id = job.id;
        let note = |line: &str| joblog::note(&job.log_path, job.uid, line);
        let then = if daos {
            "ending it and cleaning up"
        } else {
            "ending all its processes"
        };
        let killed = |r: Result<(), crate::runner::RunnerError>| match r {
            Ok(()) => String::new(),
            Err(e) => format!("; killing failed: {e}"),
        };
        let limit = duration::format(job.time_limit_secs);
        match why {
            Why::Exited(r) => (self.exit_ending(id, r).await, None),
            Why::Failed(e) => {
                note(&e);
                (
                    Ending {
                        state: JobState::Failed,
                        exit_code: None,
                        signal: None,
                        reason: Some(e),
                        ended_at: now(),
                    },
                    None,
                )
            }
            Why::Timeout(when) => {
                let when = when.text(daos, " during the job");
                note(&format!(
                    "job {id} reached its time limit {limit}{when}: {then}"
                ));
                let k = killed(self.runner.kill(id).await);
                (
                    Ending {
                        state: JobState::Timeout,
                        exit_code: None,
                        signal: Some(libc::SIGKILL),
                        reason: Some(format!("time limit {limit} reached{when}{k}")),
                        ended_at: now(),
                    },
                    None,
                )
            }
            Why::Cancelled(req, when) => {
                let when = when.text(daos, " while running");
                note(&format!("job {id} cancelled by {}{when}: {then}", req.by));
                let k = killed(self.runner.kill(id).await);
                (
                    Ending {
                        state: JobState::Cancelled,
                        exit_code: None,
                        signal: Some(libc::SIGKILL),
                        reason: Some(format!("cancelled by {}{when}{k}", req.by)),
                        ended_at: now(),
                    },
                    Some(req.done),
                )
            }
        }
    }

    /// A GPU-only job, started or re-adopted: wait, then record its end.
    async fn supervise(self: Arc<Self>, job: Job, mut cancel: oneshot::Receiver<CancelReq>) {
        let why = self
            .wait_job(job.id, Self::deadline_of(&job), &mut cancel)
            .await;
        let (end, done) = self.ending(&job, why, false).await;
        self.record_end(&job, &end);
        if let Some(done) = done {
            let _ = done.send(());
        }
    }

    /// The lease's steps for `job` on this host (runner, containers, log).
    fn local_for<'a>(&'a self, job: &Job) -> Local<'a> {
        Local {
            runner: &*self.runner,
            job: Some(job.id),
            log: Some(JobLog {
                path: job.log_path.clone(),
                uid: job.uid,
            }),
            metrics: &self.metrics,
        }
    }

    /// A DAOS job (`--inst`): the lease and its preparation (inside the
    /// job's time limit), the experiment with the lease's variables, then
    /// the cleanup, on every exit path. The job stays in `running` (the
    /// gate stays closed) until its lease is released or held.
    async fn supervise_daos(self: Arc<Self>, job: Job, mut cancel: oneshot::Receiver<CancelReq>) {
        let id = job.id;
        let note = |line: &str| joblog::note(&job.log_path, job.uid, line);
        let fail_early = |why: String| Ending {
            state: JobState::Failed,
            exit_code: None,
            signal: None,
            reason: Some(why),
            ended_at: now(),
        };
        // `--inst NAME` (DAOS) or `--stor NAME` (kernel storage).
        let stor = job.stor.is_some();
        let profile = job
            .inst
            .clone()
            .or_else(|| job.stor.clone())
            .unwrap_or_default();
        let Some(daos) = self.daos.as_ref().map(Arc::clone) else {
            return self.record_end(
                &job,
                &fail_early("storage jobs are no longer enabled on this broker".into()),
            );
        };
        let host = if stor {
            if !daos.is_stor_profile(&profile) {
                return self.record_end(
                    &job,
                    &fail_early(format!(
                        "--stor {profile} is no longer a profile of this broker ([daos.stor])"
                    )),
                );
            }
            None
        } else {
            match daos.host(&profile) {
                Ok(h) => Some(h),
                Err(e) => return self.record_end(&job, &fail_early(e.to_string())),
            }
        };
        // Opened once: the preparation's lines go in by path, the job's
        // output through this handle.
        let log = match joblog::create(&job.log_path, job.uid, job.gid) {
            Ok(f) => f,
            Err(e) => return self.record_end(&job, &fail_early(format!("cannot create log: {e}"))),
        };
        let deadline = Self::deadline_of(&job);
        let lease = daosjob::lease_name(id, now());
        // A cancel or timeout during the preparation tells it to stop and
        // waits for it: a container being created when the cancel came must
        // exist before the cleanup looks for it.
        let (stop_prep, stop_rx) = tokio::sync::watch::channel(false);
        let host = host.map(|mut h| {
            h.set_stop(stop_rx.clone());
            h
        });
        let local = self.local_for(&job);
        note(&format!(
            "job {id} started as {} (uid {}) in {}: {} profile {profile}, lease {lease}; the limit {} covers preparation and the job",
            job.user,
            job.uid,
            job.cwd,
            if stor { "--stor" } else { "DAOS" },
            duration::format(job.time_limit_secs)
        ));
        let owner = format!("job {id} ({}, uid {})", job.user, job.uid);
        let t0 = std::time::Instant::now();
        let prepare = async {
            match &host {
                Some(h) => {
                    daos.prepare(&lease, &owner, job.uid, &profile, h, &local)
                        .await
                }
                None => {
                    daos.prepare_stor(
                        &lease,
                        &owner,
                        (job.uid, job.gid),
                        &profile,
                        Some(stop_rx),
                        &local,
                    )
                    .await
                }
            }
        };
        tokio::pin!(prepare);
        let prepared = tokio::select! {
            r = &mut prepare => Ok(r),
            _ = tokio::time::sleep_until(deadline) => Err(Why::Timeout(When::Preparing)),
            Ok(req) = &mut cancel => Err(Why::Cancelled(req, When::Preparing)),
        };
        if prepared.is_err() {
            let _ = stop_prep.send(true);
            if let Err(e) = prepare.await {
                tracing::info!(job = %id, "preparation stopped: {e}");
            }
        }
        if prepared.is_ok() {
            // The whole preparation, to its end (a cancelled or timed-out
            // one is not a preparation time).
            let secs = t0.elapsed().as_secs_f64();
            self.metrics.phase("prepare", secs);
            if let Err(e) = self.store.daos_time(id, DaosPhase::Prepare, secs) {
                tracing::warn!(job = %id, "recording the preparation time: {e}");
            }
        }
        let why = match prepared {
            Err(w) => w,
            Ok(Err(e)) => Why::Failed(format!(
                "{} preparation failed: {e}",
                if stor { "--stor" } else { "DAOS" }
            )),
            Ok(Ok((_lease, daos_env))) => {
                note(&format!(
                    "{} ready in {:.2}s; starting the job",
                    if stor { "storage" } else { "DAOS system" },
                    t0.elapsed().as_secs_f64()
                ));
                let mut env = policy::filter_env(&job.env, id.0);
                env.extend(daos_env);
                // `gpuq daos-exec` in the job reaches this broker (a
                // `--stor` job has no DAOS; its variable is harmless).
                env.push(("GPUQ_SOCKET".into(), self.cfg.socket.display().to_string()));
                let spec = JobSpec {
                    id,
                    uid: job.uid,
                    gid: job.gid,
                    groups: job.groups.clone(),
                    user: job.user.clone(),
                    argv: job.argv.clone(),
                    cwd: job.cwd.clone(),
                    env,
                    log_path: job.log_path.clone(),
                    time_limit_secs: job.time_limit_secs,
                };
                match self.runner.start(&spec, log).await {
                    Err(e) => Why::Failed(format!("could not start: {e}")),
                    Ok(()) => {
                        crash_point("job_started");
                        self.wait_job(id, deadline, &mut cancel).await
                    }
                }
            }
        };
        self.end_daos_job(&job, why, &daos, &lease, &local).await;
    }

    /// A DAOS job whose lease was running when the broker stopped: the job
    /// was left running (its cgroup or unit), its lease's system up. Wait
    /// for it as if this broker had started it — time limit and cancel
    /// included — then clean the lease up. A job that ended meanwhile is
    /// settled at once.
    async fn adopt_daos(
        self: Arc<Self>,
        job: Job,
        mut cancel: oneshot::Receiver<CancelReq>,
        lease: String,
    ) {
        let Some(daos) = self.daos_for(&lease) else {
            // Held: the experiment cannot go on on a system this broker can
            // no longer clean; its processes end now, not unsupervised.
            let _ = self.runner.kill(job.id).await;
            return self.record_end(&job, &lost(format!("lease {lease}: cannot re-adopt it; it is held until an operator runs `sudo gpuq recover`")));
        };
        let local = self.local_for(&job);
        local.note(&format!(
            "job {} re-adopted by a restarted broker: its lease {lease} is still up",
            job.id
        ));
        let why = self
            .wait_job(job.id, Self::deadline_of(&job), &mut cancel)
            .await;
        self.end_daos_job(&job, why, &daos, &lease, &local).await;
    }

    /// Before a client can connect: the `daos-exec` sessions the previous
    /// broker ran ended with it (their callers were told so), so their
    /// client containers go now, not at cleanup, and nothing runs in them
    /// unsupervised. A failure is noted; the cleanup removes them anyway.
    async fn end_stale_sessions(&self, job: &Job, lease: &Lease) {
        let Some(daos) = self.daos.as_ref() else {
            return;
        };
        if daos.is_stor_profile(&lease.profile) {
            return; // no daos-exec sessions on a --stor lease
        }
        let local = self.local_for(job);
        let what = match daos.host(&lease.profile) {
            Ok(host) => match host.remove_clients(&lease.lease).await {
                Ok(what) => what,
                Err(e) => format!("their client containers stay until cleanup: {e}"),
            },
            Err(e) => e.to_string(),
        };
        local.note(&format!(
            "daos-exec sessions of the previous broker (ended with it): {what}"
        ));
    }

    /// The DAOS side, if `lease`'s profile (from its record) is still in
    /// `[daos]`; otherwise the lease is held (nothing is cleaned with a
    /// configuration that no longer says how).
    fn daos_for(&self, lease: &str) -> Option<Arc<Daos>> {
        let daos = Arc::clone(self.daos.as_ref()?);
        let profile = daos.active().map(|l| l.profile).unwrap_or_default();
        if daos.is_stor_profile(&profile) {
            // A --stor lease: nodes and this host's kernel, no containers.
            return Some(daos);
        }
        match daos.host(&profile) {
            Ok(_) => Some(daos),
            Err(e) => {
                let reason = format!("a restarted broker cannot re-adopt the lease: {e}");
                if let Err(h) = daos.hold(lease, &reason) {
                    tracing::error!(lease, "holding the lease: {h}");
                }
                None
            }
        }
    }

    /// The end of a DAOS job, however it came: record it, tell a canceller,
    /// then clean the lease up (held if that fails) and let the queue move.
    async fn end_daos_job(
        self: &Arc<Self>,
        job: &Job,
        why: Why,
        daos: &Arc<Daos>,
        lease: &str,
        local: &Local<'_>,
    ) {
        let (end, done) = self.ending(job, why, true).await;
        // The job's own end is recorded now; the next job still waits for
        // the lease (this job stays in `running` until `forget`).
        self.record_state(job, &end);
        if let Some(done) = done {
            let _ = done.send(());
        }
        crash_point("job_ended");
        self.clean_lease(job.id, daos, lease, local).await;
        self.forget(job);
    }

    /// Clean `lease` up to its release (its time recorded), or say in the
    /// job's log that it is held.
    async fn clean_lease(&self, id: JobId, daos: &Daos, lease: &str, local: &Local<'_>) {
        let t = std::time::Instant::now();
        match daos.cleanup_for(lease, local).await {
            Ok(Some(m)) => {
                // Only a cleanup that released the lease has a time; a
                // held one ends with `gpuq recover`.
                let secs = t.elapsed().as_secs_f64();
                self.metrics.phase("cleanup", secs);
                if let Err(e) = self.store.daos_time(id, DaosPhase::Cleanup, secs) {
                    tracing::warn!(job = %id, "recording the cleanup time: {e}");
                }
                tracing::info!(job = %id, "{m}")
            }
            Ok(None) => {}
            Err(e) => local.note(&format!(
                "cleanup of lease {lease} did not finish: {e}. No job starts until an operator runs `sudo gpuq recover`"
            )),
        }
    }

    /// A lease whose job had already ended when the broker stopped (it was
    /// running or cleaning): its cleanup, from the first unconfirmed step.
    /// Its job stays in `running` meanwhile, so `gpuq recover` waits for it.
    async fn resume_cleanup(self: Arc<Self>, job: Job, lease: String) {
        let Some(daos) = self.daos_for(&lease) else {
            return;
        };
        self.running_guard().insert(job.id, None);
        let local = self.local_for(&job);
        local.note(&format!(
            "a restarted broker resumes the cleanup of lease {lease} from its first unconfirmed step"
        ));
        self.clean_lease(job.id, &daos, &lease, &local).await;
        self.forget(&job);
    }

    /// `gpuq recover` (root): retry the held lease's cleanup.
    pub async fn recover_lease(self: &Arc<Self>, peer: &Peer) -> Result<String, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may recover a held lease: run `sudo gpuq recover`".into(),
            ));
        }
        let Some(daos) = self.daos.clone() else {
            return Err(ApiError::NotEnabled(
                self.cfg.daos_off("nothing to recover"),
            ));
        };
        if let Some(h) = self.hold_state().filter(|h| h.activating) {
            // Not a lease's cleanup: the activation finishes it.
            return Err(gpuq_lifecycle::DaosError::Activating {
                name: h.lease,
                reason: h.reason,
            }
            .into());
        }
        if !self.running_guard().is_empty()
            && daos
                .active()
                .is_some_and(|l| !matches!(l.phase, gpuq_lease::Phase::Held { .. }))
        {
            return Err(ApiError::Conflict(
                "the lease is being cleaned by its job right now; wait for it (see `gpuq daos-status`)".into(),
            ));
        }
        let log = daos
            .active()
            .and_then(|l| daosjob::job_of_lease(&l.lease))
            .and_then(|id| self.store.get(id).ok().flatten())
            .map(|j| JobLog {
                path: j.log_path,
                uid: j.uid,
            });
        let Some(l) = daos.active() else {
            return Err(ApiError::Conflict(
                gpuq_lifecycle::LifecycleError::NothingToRecover.to_string(),
            ));
        };
        let local = Local {
            runner: &*self.runner,
            job: daosjob::job_of_lease(&l.lease),
            log,
            metrics: &self.metrics,
        };
        let r = daos.recover(&local).await.map_err(ApiError::from);
        self.wake.notify_one();
        r
    }

    /// `gpuq activate` (root), the plan: what activating every node's
    /// allowlisted devices would find and do, and whether the queue is idle
    /// enough for it. Read-only on every host.
    pub async fn activation_plan(
        &self,
        peer: &Peer,
    ) -> Result<gpuq_protocol::node::SitePlan, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may plan an activation: run `sudo gpuq activate`".into(),
            ));
        }
        let Some(daos) = self.daos.clone() else {
            return Err(ApiError::NotEnabled(
                self.cfg.daos_off("no storage nodes to activate"),
            ));
        };
        let running = self.running_guard().len();
        let not_idle = if running > 0 {
            Some(format!(
                "{running} job(s) running: activation needs an idle queue (`gpuq list`)"
            ))
        } else if let Some(l) = daos.active() {
            Some(format!(
                "DAOS lease {} is not released ({:?}): activation needs none (`gpuq daos-status`)",
                l.lease, l.phase
            ))
        } else {
            None
        };
        Ok(gpuq_protocol::node::SitePlan {
            not_idle,
            nodes: daos.activation_plan().await,
        })
    }

    /// `gpuq activate --execute --destroy-existing-data` (root): with the
    /// queue idle (no job running, no lease, no cleanup hold), the
    /// activation's hold is written under the lock every job start takes,
    /// then every node stops its named DAOS units, discards its allowlisted
    /// devices (audited) and writes its claim; the hold goes only when all
    /// four claims are complete. Run again, it resumes an unfinished one.
    pub async fn activate(
        &self,
        peer: &Peer,
        req: &gpuq_protocol::node::ActivateRequest,
    ) -> Result<gpuq_protocol::node::SiteActivation, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may activate the storage nodes: run `sudo gpuq activate --execute --destroy-existing-data`".into(),
            ));
        }
        if !req.destroy_existing_data {
            return Err(ApiError::BadRequest(
                "an activation destroys everything on the nodes' allowlisted devices: say so with --destroy-existing-data (read the plan first: `sudo gpuq activate`)".into(),
            ));
        }
        let Some(daos) = self.daos.clone() else {
            return Err(ApiError::NotEnabled(
                self.cfg.daos_off("no storage nodes to activate"),
            ));
        };
        let Ok(_one) = self.activation.try_lock() else {
            return Err(ApiError::Conflict(
                "an activation is running now; wait for its answer".into(),
            ));
        };
        let hold = {
            // No job starts while this guard is held, and none after the
            // hold is written (start() looks at it under the same lock).
            let running = self.running_guard();
            if !running.is_empty() {
                return Err(ApiError::Conflict(format!(
                    "{} job(s) running: activation needs an idle queue (`gpuq list`); nothing was changed",
                    running.len()
                )));
            }
            if let Some(why) = daos.unreleased() {
                return Err(ApiError::Conflict(format!(
                    "{why}: activation needs no lease; nothing was changed"
                )));
            }
            daos.begin_activation(&format!("activation-{}", now()))?
        };
        crash_point("activation_held");
        tracing::warn!(activation = %hold.lease, by = %who(peer), "activation: stopping the nodes' DAOS units and discarding their devices");
        let r = daos.activate(&hold).await;
        self.wake.notify_one();
        match &r {
            Ok(a) if a.held.is_none() => {
                tracing::info!(activation = %a.activation, "activation: every node claimed; hold released")
            }
            Ok(a) => {
                tracing::error!(activation = %a.activation, "activation held: {}", a.held.as_deref().unwrap_or_default())
            }
            Err(e) => tracing::error!(activation = %hold.lease, "activation: {e}"),
        }
        Ok(r?)
    }

    /// `gpuq e2e` (root), before it submits: whether the maintenance lock
    /// is held (it runs only under it) and the profiles it may use.
    pub fn e2e_start(&self, peer: &Peer) -> Result<gpuq_protocol::node::E2eStart, ApiError> {
        let daos = self.e2e_daos(peer)?;
        Ok(gpuq_protocol::node::E2eStart {
            locked: self.lock_state().is_some(),
            profiles: daos.config().profiles.keys().cloned().collect(),
        })
    }

    /// `gpuq e2e` (root): the evidence of a lease (`lease`), or of the
    /// newest lease of job `job`, on this host and every node. Read-only.
    pub async fn e2e_report(
        &self,
        peer: &Peer,
        lease: Option<&str>,
        job: Option<u64>,
    ) -> Result<gpuq_protocol::node::E2eReport, ApiError> {
        let daos = self.e2e_daos(peer)?;
        let lease = match (lease, job) {
            (Some(l), _) => {
                if !gpuq_protocol::node::valid_lease(l) {
                    return Err(ApiError::BadRequest(format!(
                        "lease name '{l}' is not valid: 1-64 letters, digits, - and _"
                    )));
                }
                l.to_string()
            }
            (None, Some(id)) => daos.leases_of_job(id).into_iter().next().ok_or_else(|| {
                ApiError::NotFound(format!("job {id} has no DAOS lease (was it a --inst job?)"))
            })?,
            (None, None) => return Err(ApiError::BadRequest("a lease or a job is needed".into())),
        };
        if !daos.has_lease(&lease) {
            return Err(ApiError::NotFound(format!(
                "no lease {lease} in the broker's records (`gpuq daos-status`)"
            )));
        }
        Ok(daos.e2e(&lease).await?)
    }

    /// `gpuq daos-status --lease LEASE`: the end of the lease's server
    /// output on every node. Root, or the owner of the lease's job (it is
    /// that job's DAOS system; it can name its pools and containers).
    pub async fn server_output(
        &self,
        peer: &Peer,
        lease: &str,
        tail: usize,
    ) -> Result<Vec<gpuq_protocol::node::NodeOutput>, ApiError> {
        let Some(daos) = self.daos.clone() else {
            return Err(ApiError::NotEnabled(self.cfg.daos_off("no server output")));
        };
        if !daos.has_lease(lease) {
            return Err(ApiError::NotFound(format!(
                "no lease {lease} in the broker's records (its name is in the job's log: `lease … created`)"
            )));
        }
        let owner = daosjob::job_of_lease(lease)
            .and_then(|id| self.store.get(id).ok().flatten())
            .map(|j| j.uid);
        if !peer.is_root() && owner != Some(peer.uid) {
            return Err(ApiError::Forbidden(format!(
                "lease {lease} is not one of your jobs': only its owner and root see its servers' output"
            )));
        }
        Ok(daos.server_output(lease, tail).await)
    }

    fn e2e_daos(&self, peer: &Peer) -> Result<Arc<Daos>, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may run the end-to-end verification: run `sudo gpuq e2e`".into(),
            ));
        }
        self.daos
            .clone()
            .ok_or_else(|| ApiError::NotEnabled(self.cfg.daos_off("nothing to verify")))
    }

    /// `gpuq verify-pins` (root).
    pub async fn verify_pins(&self, peer: &Peer) -> Result<serde_json::Value, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may verify the image pins: run `sudo gpuq verify-pins`".into(),
            ));
        }
        let Some(daos) = self.daos.clone() else {
            return Err(ApiError::NotEnabled(self.cfg.daos_off("no pins to verify")));
        };
        Ok(daos.verify_pins().await)
    }

    /// `gpuq verify-install` (root): this host's manifests and running
    /// broker, then every node's (when `[daos]` names nodes). Read-only.
    pub async fn verify_install(
        &self,
        peer: &Peer,
    ) -> Result<gpuq_manifest::report::InstallReport, ApiError> {
        if !peer.is_root() {
            return Err(ApiError::Forbidden(
                "only root may verify the installation: run `sudo gpuq verify-install`".into(),
            ));
        }
        let paths = self.cfg.install.clone();
        // The host's own name, as the kernel has it (no resolver involved).
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "this host".into());
        let own = tokio::task::spawn_blocking(move || {
            gpuq_manifest::report::inspect_host(
                &host,
                "gpuq-broker",
                env!("CARGO_PKG_VERSION"),
                "gpuq",
                &paths.manifest_dir,
                &paths.prefix,
                0,
            )
        });
        let nodes = async {
            match self.daos.clone() {
                Some(d) => d.install_nodes().await,
                None => Vec::new(),
            }
        };
        let (own, nodes) = tokio::join!(own, nodes);
        let own = own.map_err(|e| ApiError::Conflict(format!("checking this host failed: {e}")))?;
        let mut hosts = vec![own];
        hosts.extend(nodes);
        Ok(gpuq_manifest::report::InstallReport { hosts })
    }

    /// `gpuq daos-status`: links, nodes, the lease; plus hold and lock.
    pub async fn daos_status(&self) -> Result<serde_json::Value, ApiError> {
        let Some(daos) = self.daos.clone() else {
            return Err(ApiError::NotEnabled(self.cfg.daos_off("no DAOS status")));
        };
        let mut v = daos.status().await;
        v["hold"] = serde_json::to_value(self.hold_state()).unwrap_or_default();
        v["lock"] = serde_json::to_value(self.lock_state()).unwrap_or_default();
        Ok(v)
    }

    /// Log line and the durable end of the job.
    fn record_state(self: &Arc<Self>, job: &Job, end: &Ending) {
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
        if let Err(e) = self.finish_job(job.id, JobState::Running, end) {
            tracing::error!(job = %job.id, "cannot record the end: {e}");
        }
        tracing::info!(job = %job.id, state = %end.state, "ended");
    }

    /// Log line, then the durable end, then forget the job's runtime state.
    fn record_end(self: &Arc<Self>, job: &Job, end: &Ending) {
        self.record_state(job, end);
        self.forget(job);
    }

    /// Release the job's runner state and let the scheduler move on.
    fn forget(self: &Arc<Self>, job: &Job) {
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
    }

    /// How a job whose runner's wait returned `r` ended. A wait that lost
    /// track of the job ends whatever is left of it first.
    async fn exit_ending(
        &self,
        id: JobId,
        r: Result<Option<Outcome>, crate::runner::RunnerError>,
    ) -> Ending {
        match r {
            Ok(Some(o)) => ending_from(o),
            Ok(None) => lost("the job's processes ended without an exit status".into()),
            Err(e) => {
                let _ = self.runner.kill(id).await;
                lost(format!("lost track of the job: {e}"))
            }
        }
    }
}

/// Why a job's wait (or its lease's preparation) ended.
enum Why {
    Exited(Result<Option<Outcome>, crate::runner::RunnerError>),
    Timeout(When),
    Cancelled(CancelReq, When),
    Failed(String),
}

/// When a time limit or a cancel came.
#[derive(Debug, Clone, Copy)]
enum When {
    Preparing,
    Running,
}

impl When {
    /// As the job's log says it: a GPU-only job's log says nothing while it
    /// runs, a DAOS job's `running` (what it was doing then).
    fn text(self, daos: bool, running: &'static str) -> &'static str {
        match self {
            When::Preparing => " during preparation",
            When::Running if daos => running,
            When::Running => "",
        }
    }
}

/// A follower's subscription to one job's end; the broker's entry goes
/// when the job ends or its last follower leaves.
struct EndWatch {
    broker: Arc<Broker>,
    id: JobId,
    rx: Option<watch::Receiver<bool>>,
}

impl EndWatch {
    fn new(broker: &Arc<Broker>, id: JobId) -> Self {
        let rx = broker
            .ends_guard()
            .entry(id)
            .or_insert_with(|| watch::channel(false).0)
            .subscribe();
        EndWatch {
            broker: Arc::clone(broker),
            id,
            rx: Some(rx),
        }
    }

    /// Has the end been stored? (A sender gone without a value: the entry
    /// was taken by the end, too.)
    fn ended(&self) -> bool {
        self.rx
            .as_ref()
            .is_none_or(|rx| *rx.borrow() || rx.has_changed().is_err())
    }

    async fn changed(&mut self) {
        match self.rx.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    // The sender is gone: nothing will come on this one.
                    std::future::pending::<()>().await
                }
            }
            None => std::future::pending().await,
        }
    }
}

impl Drop for EndWatch {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut ends = self.broker.ends_guard();
        if ends
            .get(&self.id)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            ends.remove(&self.id);
        }
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

fn read_hold(dir: &Path) -> Option<HoldInfo> {
    match gpuq_lease::blocked_in(dir) {
        Ok(None) => None,
        Ok(Some(b)) => Some(HoldInfo {
            activating: b.kind == gpuq_lease::HoldKind::Activating,
            lease: b.lease,
            reason: b.reason,
            since: b.since,
        }),
        // Present but unreadable or not a hold record: it holds (fail
        // closed), saying why.
        Err(e) => Some(HoldInfo {
            lease: "?".into(),
            reason: format!("{e}; an operator must look"),
            since: 0,
            activating: false,
        }),
    }
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
