//! The lease state machine (architecture.md, "The lease state machine").
//!
//! ```text
//!  gated ─▶ preparing ─▶ running ─▶ cleaning ─▶ released
//!              │            │          │
//!              └────────────┴──────────┘ fail/timeout/cancel → cleaning
//!  cleaning fails, broker killed while preparing ─▶ held (blocks ALL jobs)
//!  broker restarted while running/cleaning ─▶ re-adopted as it was
//!  held ─ recover ─▶ cleaning (from the first unconfirmed step)
//! ```
//!
//! Every transition is written durably (temp + fsync + rename + fsync dir)
//! **before** the caller acts on it: [`LeaseStore::create`] writes
//! `<lease>.json` and `active.json` before any node is touched; a cleanup
//! step is recorded as confirmed only after all four nodes confirmed it.
//! On start, [`LeaseStore::open`] finds an unreleased lease. One that was
//! **preparing** is held: what was half set up cannot be confirmed. One
//! that was **running** or **cleaning** is handed to the caller as it is,
//! to re-adopt (the job still runs; its cleanup follows) or to resume its
//! cleanup from the first unconfirmed step (every step is idempotent) —
//! and the caller holds it if it cannot. Either way it stays unreleased,
//! so no next job starts meanwhile. The hold is `blocked.json`, which the
//! broker's gate reads on every decision; only a cleanup that confirms
//! every remaining step ([`LeaseStore::release`]) removes it — `unlock`
//! cannot.
//!
//! Nothing here knows gpuq's queue: a Slurm prolog/epilog can drive the
//! same records.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The cleanup steps, in the order mission.md §4 step 7 fixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CleanupStep {
    /// End the experiment's cgroup (its unit).
    KillJob,
    /// Remove client containers (daos-exec) still running.
    RemoveClients,
    /// Stop the agent (it evicts pool handles while servers are up).
    StopAgent,
    /// `dmg system stop` (retry with --force).
    SystemStop,
    /// Stop all four server containers and confirm.
    StopServers,
    /// Wipe all four nodes (devices or test dirs) and confirm.
    Wipe,
    /// `--stor nvmeof`: disconnect this host from the lease's subsystems
    /// and confirm their block devices are gone.
    Disconnect,
    /// `--stor nvmeof`: remove the lease's NVMe-oF export on all four
    /// nodes and confirm nothing of it is left in their nvmet trees.
    /// `--stor nfsrdma`: stop each node's NFS server and unmount its
    /// filesystems, confirmed.
    Unexport,
    /// `--stor nfsrdma`: unmount the nodes' exports on this host (never
    /// lazily) and confirm none is left.
    Unmount,
}

impl CleanupStep {
    /// A DAOS lease's steps, in order.
    pub const ALL: [CleanupStep; 6] = [
        CleanupStep::KillJob,
        CleanupStep::RemoveClients,
        CleanupStep::StopAgent,
        CleanupStep::SystemStop,
        CleanupStep::StopServers,
        CleanupStep::Wipe,
    ];
    /// A `--stor nvmeof` lease's steps, in order: the job ends, this host
    /// lets go of the devices, the nodes stop exporting them, then wipe.
    pub const NVMEOF: [CleanupStep; 4] = [
        CleanupStep::KillJob,
        CleanupStep::Disconnect,
        CleanupStep::Unexport,
        CleanupStep::Wipe,
    ];
    /// A `--stor nfsrdma` lease's steps, in order: the job ends, this
    /// host unmounts, the nodes stop serving and unmount, then wipe.
    pub const NFSRDMA: [CleanupStep; 4] = [
        CleanupStep::KillJob,
        CleanupStep::Unmount,
        CleanupStep::Unexport,
        CleanupStep::Wipe,
    ];
}

/// What a lease stands up on the four nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseKind {
    /// `--inst`: a DAOS system in containers. A record without `kind` (of
    /// an older broker) is one.
    #[default]
    Daos,
    /// `--stor nvmeof`: the nodes' namespaces exported by the kernel NVMe
    /// target, connected on the job's host.
    Nvmeof,
    /// `--stor nfsrdma`: an XFS on each namespace, exported by the
    /// nodes' kernel NFS servers, mounted on the job's host.
    Nfsrdma,
}

impl LeaseKind {
    /// Its cleanup steps, in order.
    pub fn steps(self) -> &'static [CleanupStep] {
        match self {
            LeaseKind::Daos => &CleanupStep::ALL,
            LeaseKind::Nvmeof => &CleanupStep::NVMEOF,
            LeaseKind::Nfsrdma => &CleanupStep::NFSRDMA,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LeaseKind::Daos => "daos",
            LeaseKind::Nvmeof => "nvmeof",
            LeaseKind::Nfsrdma => "nfsrdma",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Preflight, server start, format, join.
    Preparing,
    /// The experiment runs.
    Running,
    /// Tearing down; `done` holds the confirmed steps.
    Cleaning,
    /// Cleanup did not finish: every job waits until `recover` succeeds.
    Held {
        step: Option<CleanupStep>,
        node: Option<String>,
        reason: String,
    },
    /// All steps confirmed on all nodes; the lease is over.
    Released,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub time: i64,
    pub what: String,
}

/// `<state_dir>/<lease>.json`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lease: String,
    /// The job (or Slurm job) the lease serves.
    pub owner: String,
    pub profile: String,
    /// What the lease stands up (missing in an older record: DAOS).
    #[serde(default)]
    pub kind: LeaseKind,
    pub created_at: i64,
    #[serde(flatten)]
    pub phase: Phase,
    /// Cleanup steps confirmed on all nodes.
    pub done: Vec<CleanupStep>,
    pub history: Vec<Event>,
}

impl Lease {
    /// The first cleanup step not yet confirmed (where `recover` resumes).
    pub fn next_step(&self) -> Option<CleanupStep> {
        self.kind
            .steps()
            .iter()
            .copied()
            .find(|s| !self.done.contains(s))
    }
}

/// `blocked.json`: the hold, as the broker's gate reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocked {
    /// The held lease, or the activation holding the site.
    pub lease: String,
    pub reason: String,
    pub since: i64,
    pub step: Option<CleanupStep>,
    pub node: Option<String>,
    /// What holds: a lease's cleanup (`recover` finishes it) or an
    /// activation (`gpuq activate --execute` finishes it). Missing in a
    /// record of an older broker: a cleanup.
    #[serde(default)]
    pub kind: HoldKind,
}

/// What a hold is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldKind {
    /// A lease whose cleanup did not finish.
    #[default]
    Cleanup,
    /// `gpuq activate --execute`: written before any node is touched,
    /// removed only when every node's claim is complete.
    Activating,
}

#[derive(Debug, Error)]
pub enum LeaseError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is unreadable ({why}); the lease stays held — fix the file, do not delete it")]
    Corrupt { path: PathBuf, why: String },
    #[error("lease {active} is still active; a new lease needs it released first")]
    Busy { active: String },
    #[error("lease {lease}: cannot go from {from} to {to}")]
    Transition {
        lease: String,
        from: String,
        to: String,
    },
    #[error("lease name '{0}' is not valid: 1-64 letters, digits, - and _")]
    Name(String),
    #[error("the site is held for lease {lease} ({reason}): `gpuq recover` first")]
    Held { lease: String, reason: String },
}

/// The phase as records and messages spell it.
pub fn phase_name(p: &Phase) -> &'static str {
    match p {
        Phase::Preparing => "preparing",
        Phase::Running => "running",
        Phase::Cleaning => "cleaning",
        Phase::Held { .. } => "held",
        Phase::Released => "released",
    }
}

/// The lease records under one state directory.
#[derive(Debug, Clone)]
pub struct LeaseStore {
    dir: PathBuf,
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The hold in `dir` (`blocked.json`), read without opening the store (the
/// broker's gate reads it on every decision, also without `[daos]`).
pub fn blocked_in(dir: &Path) -> Result<Option<Blocked>, LeaseError> {
    let p = dir.join("blocked.json");
    match std::fs::read(&p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LeaseError::Io { path: p, source }),
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| LeaseError::Corrupt {
                path: p,
                why: e.to_string(),
            }),
    }
}

impl LeaseStore {
    /// Open the store, and return the active lease if it is not released
    /// (the broker died or was restarted, the host rebooted). One that was
    /// preparing is put on hold here, before the caller can start anything;
    /// one that was running or cleaning is returned as it is, for the
    /// caller to re-adopt or resume (it is still unreleased: the gate stays
    /// closed) or to [`LeaseStore::hold`].
    pub fn open(dir: &Path, now: i64) -> Result<(Self, Option<Lease>), LeaseError> {
        let store = LeaseStore {
            dir: dir.to_path_buf(),
        };
        let Some(active) = store.active()? else {
            return Ok((store, None));
        };
        let mut lease = store.load(&active)?;
        match lease.phase {
            Phase::Released => {
                // Released but the pointer survived a crash: finish the release.
                store.remove(&store.dir.join("active.json"))?;
                return Ok((store, None));
            }
            Phase::Held { .. } | Phase::Running | Phase::Cleaning => {}
            Phase::Preparing => {
                let reason = format!(
                    "the broker stopped while the lease was {}; cleanup must be confirmed",
                    phase_name(&lease.phase)
                );
                store.hold(&mut lease, None, None, &reason, now)?;
            }
        }
        Ok((store, Some(lease)))
    }

    /// The records in `dir` as they are, for a reader that must change
    /// nothing (a status, a pool's size): no recovery, unlike
    /// [`LeaseStore::open`], which holds a lease found preparing.
    pub fn reader(dir: &Path) -> Self {
        LeaseStore {
            dir: dir.to_path_buf(),
        }
    }

    /// The directory holding the records.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, lease: &str) -> PathBuf {
        self.dir.join(format!("{lease}.json"))
    }

    fn active(&self) -> Result<Option<String>, LeaseError> {
        let p = self.dir.join("active.json");
        match std::fs::read(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(LeaseError::Io { path: p, source }),
            Ok(b) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&b).map_err(|e| LeaseError::Corrupt {
                        path: p.clone(),
                        why: e.to_string(),
                    })?;
                v.get("lease")
                    .and_then(|l| l.as_str())
                    .map(|l| Some(l.to_string()))
                    .ok_or(LeaseError::Corrupt {
                        path: p,
                        why: "no lease name".into(),
                    })
            }
        }
    }

    pub fn load(&self, lease: &str) -> Result<Lease, LeaseError> {
        let p = self.path(lease);
        let b = std::fs::read(&p).map_err(|source| LeaseError::Io {
            path: p.clone(),
            source,
        })?;
        serde_json::from_slice(&b).map_err(|e| LeaseError::Corrupt {
            path: p,
            why: e.to_string(),
        })
    }

    /// The hold, if any (`blocked.json`).
    pub fn blocked(&self) -> Result<Option<Blocked>, LeaseError> {
        blocked_in(&self.dir)
    }

    /// The active lease's record: `None` when no lease is active; an error
    /// when `active.json` or the record it names cannot be read (the caller
    /// fails closed).
    pub fn current(&self) -> Result<Option<Lease>, LeaseError> {
        match self.active()? {
            None => Ok(None),
            Some(name) => self.load(&name).map(Some),
        }
    }

    /// A new lease in `preparing`, durable (with `active.json`) before the
    /// caller touches any node. Refused while another lease is active.
    pub fn create(
        &self,
        lease: &str,
        owner: &str,
        profile: &str,
        now: i64,
    ) -> Result<Lease, LeaseError> {
        self.create_kind(lease, owner, profile, LeaseKind::Daos, now)
    }

    /// [`LeaseStore::create`] of a lease of `kind`.
    pub fn create_kind(
        &self,
        lease: &str,
        owner: &str,
        profile: &str,
        kind: LeaseKind,
        now: i64,
    ) -> Result<Lease, LeaseError> {
        if !valid_name(lease) {
            return Err(LeaseError::Name(lease.to_string()));
        }
        if let Some(active) = self.active()? {
            return Err(LeaseError::Busy { active });
        }
        std::fs::create_dir_all(&self.dir).map_err(|source| LeaseError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let l = Lease {
            lease: lease.to_string(),
            owner: owner.to_string(),
            profile: profile.to_string(),
            kind,
            created_at: now,
            phase: Phase::Preparing,
            done: vec![],
            history: vec![Event {
                time: now,
                what: "created".into(),
            }],
        };
        self.save(&l)?;
        self.write(
            &self.dir.join("active.json"),
            &serde_json::json!({"lease": lease, "since": now}),
        )?;
        Ok(l)
    }

    /// Move to `to`, durably, if the state machine allows it.
    pub fn transition(&self, l: &mut Lease, to: Phase, now: i64) -> Result<(), LeaseError> {
        let ok = matches!(
            (&l.phase, &to),
            (Phase::Preparing, Phase::Running)
                | (Phase::Preparing, Phase::Cleaning)
                | (Phase::Running, Phase::Cleaning)
                | (Phase::Held { .. }, Phase::Cleaning)
        );
        if !ok {
            return Err(LeaseError::Transition {
                lease: l.lease.clone(),
                from: phase_name(&l.phase).into(),
                to: phase_name(&to).into(),
            });
        }
        l.history.push(Event {
            time: now,
            what: format!("{} -> {}", phase_name(&l.phase), phase_name(&to)),
        });
        l.phase = to;
        self.save(l)
    }

    /// Record that `step` was confirmed on every node.
    pub fn step_done(
        &self,
        l: &mut Lease,
        step: CleanupStep,
        detail: &str,
        now: i64,
    ) -> Result<(), LeaseError> {
        if l.phase != Phase::Cleaning {
            return Err(LeaseError::Transition {
                lease: l.lease.clone(),
                from: phase_name(&l.phase).into(),
                to: format!("{step:?} done"),
            });
        }
        if !l.done.contains(&step) {
            l.done.push(step);
            l.done.sort();
        }
        l.history.push(Event {
            time: now,
            what: format!("{step:?} confirmed: {detail}"),
        });
        self.save(l)
    }

    /// Hold: `blocked.json` first (it is what stops every job), then the lease.
    pub fn hold(
        &self,
        l: &mut Lease,
        step: Option<CleanupStep>,
        node: Option<&str>,
        reason: &str,
        now: i64,
    ) -> Result<(), LeaseError> {
        let b = Blocked {
            lease: l.lease.clone(),
            reason: reason.to_string(),
            since: now,
            step,
            node: node.map(str::to_string),
            kind: HoldKind::Cleanup,
        };
        self.write(&self.dir.join("blocked.json"), &b)?;
        l.history.push(Event {
            time: now,
            what: format!("held: {reason}"),
        });
        l.phase = Phase::Held {
            step,
            node: node.map(str::to_string),
            reason: reason.to_string(),
        };
        self.save(l)
    }

    /// Released: only when every cleanup step is confirmed. Removes
    /// `active.json` and the hold; the lease record stays as history.
    pub fn release(&self, l: &mut Lease, now: i64) -> Result<(), LeaseError> {
        if l.phase != Phase::Cleaning || l.next_step().is_some() {
            return Err(LeaseError::Transition {
                lease: l.lease.clone(),
                from: format!(
                    "{} with {:?} unconfirmed",
                    phase_name(&l.phase),
                    l.next_step()
                ),
                to: "released".into(),
            });
        }
        l.phase = Phase::Released;
        l.history.push(Event {
            time: now,
            what: "released".into(),
        });
        self.save(l)?;
        self.remove(&self.dir.join("blocked.json"))?;
        self.remove(&self.dir.join("active.json"))
    }

    /// An activation's hold (`gpuq activate --execute`), durable before the
    /// caller touches any node: refused while a lease is active or a
    /// cleanup holds; an activation hold already there is returned as it
    /// is (running the activation again resumes it, under its first name).
    pub fn begin_activation(&self, name: &str, now: i64) -> Result<Blocked, LeaseError> {
        if !valid_name(name) {
            return Err(LeaseError::Name(name.to_string()));
        }
        if let Some(active) = self.active()? {
            return Err(LeaseError::Busy { active });
        }
        match self.blocked()? {
            Some(b) if b.kind == HoldKind::Activating => Ok(b),
            Some(b) => Err(LeaseError::Held {
                lease: b.lease,
                reason: b.reason,
            }),
            None => {
                std::fs::create_dir_all(&self.dir).map_err(|source| LeaseError::Io {
                    path: self.dir.clone(),
                    source,
                })?;
                let b = Blocked {
                    lease: name.to_string(),
                    reason: format!(
                        "activation {name} is stopping the nodes' DAOS services and discarding their devices"
                    ),
                    since: now,
                    step: None,
                    node: None,
                    kind: HoldKind::Activating,
                };
                self.write(&self.dir.join("blocked.json"), &b)?;
                Ok(b)
            }
        }
    }

    /// The activation `b` did not complete: the hold stays, saying why.
    pub fn activation_failed(&self, b: &Blocked, reason: &str) -> Result<(), LeaseError> {
        let mut b = b.clone();
        b.reason = reason.to_string();
        self.write(&self.dir.join("blocked.json"), &b)
    }

    /// Every node's claim is complete: the activation's hold goes. Nothing
    /// else is removed (a cleanup's hold is `release`'s alone).
    pub fn end_activation(&self, name: &str) -> Result<(), LeaseError> {
        match self.blocked()? {
            Some(b) if b.kind == HoldKind::Activating && b.lease == name => {
                self.remove(&self.dir.join("blocked.json"))
            }
            Some(b) => Err(LeaseError::Held {
                lease: b.lease,
                reason: b.reason,
            }),
            None => Ok(()),
        }
    }

    fn save(&self, l: &Lease) -> Result<(), LeaseError> {
        self.write(&self.path(&l.lease), l)
    }

    fn write<T: Serialize>(&self, path: &Path, v: &T) -> Result<(), LeaseError> {
        let bytes = serde_json::to_vec_pretty(v).unwrap_or_default();
        gpuq_durable::write_atomic(path, &bytes, 0o600).map_err(|source| LeaseError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    fn remove(&self, path: &Path) -> Result<(), LeaseError> {
        gpuq_durable::remove(path)
            .map(|_| ())
            .map_err(|source| LeaseError::Io {
                path: path.to_path_buf(),
                source,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, LeaseStore) {
        let d = tempfile::tempdir().unwrap();
        let (s, held) = LeaseStore::open(d.path(), 1).unwrap();
        assert!(held.is_none());
        (d, s)
    }

    #[test]
    fn an_nvmeof_lease_cleans_in_its_own_steps_and_an_older_record_is_daos() {
        let (d, s) = store();
        let mut l = s
            .create_kind("L1", "job 7", "nvmeof", LeaseKind::Nvmeof, 10)
            .unwrap();
        s.transition(&mut l, Phase::Cleaning, 11).unwrap();
        let mut order = Vec::new();
        while let Some(step) = l.next_step() {
            order.push(step);
            s.step_done(&mut l, step, "ok", 12).unwrap();
        }
        assert_eq!(order, CleanupStep::NVMEOF);
        let back = s.load("L1").unwrap();
        assert_eq!((back.kind, back.done.len()), (LeaseKind::Nvmeof, 4));
        // A record written before `kind` existed.
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join("L1.json")).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("kind");
        let old: Lease = serde_json::from_value(v).unwrap();
        assert_eq!(old.kind, LeaseKind::Daos);
        assert_eq!(old.next_step(), Some(CleanupStep::RemoveClients));
    }

    #[test]
    fn an_activation_holds_everything_until_it_ends_and_resumes_under_its_first_name() {
        let (d, s) = store();
        let b = s.begin_activation("activation-1", 5).unwrap();
        assert_eq!(b.kind, HoldKind::Activating);
        let on_disk = blocked_in(d.path()).unwrap().unwrap();
        assert_eq!(on_disk, b, "durable before any node is touched");
        s.end_activation("activation-1").unwrap();
        // Never beside an active lease.
        s.create("L1", "job 7", "inst1", 6).unwrap();
        assert!(matches!(
            s.begin_activation("activation-2", 7),
            Err(LeaseError::Busy { .. })
        ));
        assert!(blocked_in(d.path()).unwrap().is_none(), "nothing written");
        let (d, s) = store();
        let b = s.begin_activation("activation-1", 5).unwrap();
        s.activation_failed(&b, "da3: no answer").unwrap();
        let again = s.begin_activation("activation-2", 8).unwrap();
        assert_eq!(
            (again.lease.as_str(), again.reason.as_str()),
            ("activation-1", "da3: no answer"),
            "a second run resumes the first"
        );
        assert!(matches!(
            s.end_activation("activation-2"),
            Err(LeaseError::Held { .. })
        ));
        s.end_activation("activation-1").unwrap();
        assert!(blocked_in(d.path()).unwrap().is_none());
    }

    #[test]
    fn an_activation_never_starts_over_or_ends_a_cleanup_hold() {
        let (d, s) = store();
        let mut l = s.create("L1", "job 7", "inst1", 10).unwrap();
        s.hold(
            &mut l,
            Some(CleanupStep::Wipe),
            Some("da2"),
            "wipe failed",
            11,
        )
        .unwrap();
        let before = std::fs::read(d.path().join("blocked.json")).unwrap();
        assert!(matches!(
            s.begin_activation("activation-1", 12),
            Err(LeaseError::Busy { .. })
        ));
        // Even with the lease pointer gone by hand, the cleanup hold stays.
        std::fs::remove_file(d.path().join("active.json")).unwrap();
        assert!(matches!(
            s.begin_activation("activation-1", 12),
            Err(LeaseError::Held { .. })
        ));
        assert!(matches!(
            s.end_activation("L1"),
            Err(LeaseError::Held { .. })
        ));
        assert_eq!(
            std::fs::read(d.path().join("blocked.json")).unwrap(),
            before
        );
        // An older broker's record (no kind) is a cleanup hold.
        let old: Blocked = serde_json::from_str(
            r#"{"lease":"L0","reason":"r","since":1,"step":null,"node":null}"#,
        )
        .unwrap();
        assert_eq!(old.kind, HoldKind::Cleanup);
    }

    #[test]
    fn the_lease_is_durable_before_any_node_is_touched() {
        let (d, s) = store();
        let l = s.create("L1", "job 7", "inst1", 10).unwrap();
        assert_eq!(l.phase, Phase::Preparing);
        assert!(d.path().join("L1.json").exists() && d.path().join("active.json").exists());
        assert!(
            matches!(s.create("L2", "job 8", "inst1", 11), Err(LeaseError::Busy { active }) if active == "L1")
        );
    }

    #[test]
    fn a_full_lifecycle_releases_only_when_every_step_is_confirmed() {
        let (d, s) = store();
        let mut l = s.create("L1", "job 7", "inst1", 10).unwrap();
        s.transition(&mut l, Phase::Running, 11).unwrap();
        s.transition(&mut l, Phase::Cleaning, 12).unwrap();
        for step in &CleanupStep::ALL[..5] {
            s.step_done(&mut l, *step, "all four nodes", 13).unwrap();
            assert!(
                s.release(&mut l, 14).is_err(),
                "released before {:?}",
                l.next_step()
            );
        }
        assert_eq!(l.next_step(), Some(CleanupStep::Wipe));
        s.step_done(&mut l, CleanupStep::Wipe, "all four nodes", 15)
            .unwrap();
        s.release(&mut l, 16).unwrap();
        assert!(!d.path().join("active.json").exists());
        assert_eq!(s.load("L1").unwrap().phase, Phase::Released);
        // A new lease may start now.
        s.create("L2", "job 8", "inst1", 17).unwrap();
    }

    #[test]
    fn illegal_transitions_are_refused_and_change_nothing() {
        let (_d, s) = store();
        let mut l = s.create("L1", "job", "p", 1).unwrap();
        assert!(s.transition(&mut l, Phase::Released, 2).is_err());
        assert!(s.step_done(&mut l, CleanupStep::KillJob, "x", 2).is_err());
        assert_eq!(s.load("L1").unwrap(), l);
        assert!(matches!(
            s.create("../x", "j", "p", 1),
            Err(LeaseError::Name(_))
        ));
    }

    #[test]
    fn a_broker_that_dies_while_running_or_cleaning_finds_the_lease_as_it_was() {
        for phase in [Phase::Running, Phase::Cleaning] {
            let d = tempfile::tempdir().unwrap();
            {
                let (s, _) = LeaseStore::open(d.path(), 1).unwrap();
                let mut l = s.create("L1", "job 7", "inst1", 10).unwrap();
                s.transition(&mut l, phase.clone(), 11).unwrap();
            } // "kill -9"
            let (s, found) = LeaseStore::open(d.path(), 20).unwrap();
            let found = found.expect("the unreleased lease is found");
            assert_eq!(found.phase, phase);
            // Not held, and still not released: no next lease may start.
            assert!(s.blocked().unwrap().is_none());
            assert!(matches!(
                s.create("L2", "job 8", "inst1", 21),
                Err(LeaseError::Busy { .. })
            ));
        }
    }

    #[test]
    fn the_current_lease_is_read_through_its_pointer_and_a_bad_pointer_is_an_error() {
        let (d, s) = store();
        assert!(s.current().unwrap().is_none());
        assert!(blocked_in(d.path()).unwrap().is_none());
        s.create("L1", "job 7", "inst1", 10).unwrap();
        assert_eq!(s.current().unwrap().unwrap().lease, "L1");
        std::fs::write(d.path().join("active.json"), "{garbage").unwrap();
        let e = s.current().unwrap_err().to_string();
        assert!(e.contains("active.json"), "{e}");
        std::fs::write(d.path().join("blocked.json"), "[]").unwrap();
        assert!(blocked_in(d.path()).is_err());
    }

    #[test]
    fn a_broker_that_dies_while_preparing_comes_back_held() {
        let d = tempfile::tempdir().unwrap();
        {
            let (s, _) = LeaseStore::open(d.path(), 1).unwrap();
            s.create("L1", "job 7", "inst1", 10).unwrap();
        } // "kill -9"
        let (s, held) = LeaseStore::open(d.path(), 20).unwrap();
        let held = held.expect("the unreleased lease is found");
        assert!(matches!(held.phase, Phase::Held { .. }));
        let b = s.blocked().unwrap().expect("blocked.json written");
        assert_eq!(b.lease, "L1");
        assert!(b.reason.contains("preparing"), "{}", b.reason);
        // The broker's gate reads the same file with these keys.
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.path().join("blocked.json")).unwrap()).unwrap();
        assert_eq!(
            (raw["lease"].as_str(), raw["since"].as_i64()),
            (Some("L1"), Some(20))
        );
    }

    #[test]
    fn recover_resumes_at_the_first_unconfirmed_step_and_only_then_releases() {
        let (d, s) = store();
        let mut l = s.create("L1", "job 7", "inst1", 10).unwrap();
        s.transition(&mut l, Phase::Cleaning, 11).unwrap();
        for step in &CleanupStep::ALL[..4] {
            s.step_done(&mut l, *step, "ok", 12).unwrap();
        }
        s.hold(
            &mut l,
            Some(CleanupStep::StopServers),
            Some("da3"),
            "da3 did not confirm stop",
            13,
        )
        .unwrap();
        assert!(
            s.release(&mut l, 14).is_err(),
            "a hold is not released without cleanup"
        );
        // recover
        let mut l = s.load("L1").unwrap();
        s.transition(&mut l, Phase::Cleaning, 20).unwrap();
        assert_eq!(l.next_step(), Some(CleanupStep::StopServers));
        assert!(
            d.path().join("blocked.json").exists(),
            "still held while recovering"
        );
        s.step_done(&mut l, CleanupStep::StopServers, "ok", 21)
            .unwrap();
        s.step_done(&mut l, CleanupStep::Wipe, "ok", 22).unwrap();
        s.release(&mut l, 23).unwrap();
        assert!(!d.path().join("blocked.json").exists());
    }

    #[test]
    fn a_corrupt_record_is_reported_never_taken_as_no_lease() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("active.json"), "{garbage").unwrap();
        let e = LeaseStore::open(d.path(), 1).unwrap_err();
        assert!(e.to_string().contains("do not delete"), "{e}");
    }
}
