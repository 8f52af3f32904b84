//! The records of one site under `[slurm] state_dir`, and the lock.

use crate::{failed, Config, Error};
use gpuq_lease::Lease;
use gpuq_lifecycle::daos::Daos;
use serde::{Deserialize, Serialize};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// The GPU host the job was pinned to at setup, where its lease's
    /// client side (files, agent) is; absent: `agent_host` (a record of
    /// an older gpuq-slurm too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// The lease name of a Slurm job: `slurm<ID>-<unix time>` (unique even
/// when Slurm's job IDs start again).
pub fn lease_name(job: u64, now: i64) -> String {
    format!("slurm{job}-{now}")
}

/// The Slurm job a lease name (`slurm<JOB>-<TIME>`) belongs to.
pub(crate) fn job_of_lease(lease: &str) -> Option<u64> {
    let rest = lease.strip_prefix("slurm")?;
    let (job, time) = rest.split_once('-')?;
    time.parse::<u64>().ok()?;
    job.parse().ok()
}

/// The records under `state_dir`, for one invocation.
#[derive(Debug)]
pub struct State {
    pub(crate) cfg: Config,
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

    pub(crate) fn leases_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("leases")
    }

    pub(crate) fn record_path(&self, job: u64) -> PathBuf {
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

    pub(crate) fn remove_record(&self, job: u64) -> Result<(), Error> {
        gpuq_durable::remove(&self.record_path(job))
            .map(|_| ())
            .map_err(failed(format!("removing the record of job {job}")))
    }

    /// The lease record `lease`, read as it is (no recovery on open).
    pub(crate) fn lease(&self, lease: &str) -> Result<Option<Lease>, Error> {
        match gpuq_lease::LeaseStore::reader(&self.leases_dir()).load(lease) {
            Err(gpuq_lease::LeaseError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Ok(None)
            }
            Err(e) => Err(Error::Failed(format!("{e}; an operator must look"))),
            Ok(l) => Ok(Some(l)),
        }
    }

    /// The site's DAOS side: the lease store (a lease found preparing is
    /// held here: its driver died) and the node links.
    pub(crate) fn daos(&self) -> Result<std::sync::Arc<Daos>, Error> {
        Daos::start(
            self.cfg.daos.clone(),
            &self.leases_dir(),
            gpuq_protocol::time::now(),
        )
        .map_err(|e| Error::Failed(format!("starting the DAOS side: {e}")))
    }
}

pub(crate) fn libc_flags() -> i32 {
    nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_lease_names() {
        let n = lease_name(4_294_967_295, 1_796_390_124);
        assert_eq!(n, "slurm4294967295-1796390124");
        assert!(gpuq_protocol::node::valid_lease(&n));
    }

    #[test]
    fn a_lease_name_gives_its_job_back() {
        assert_eq!(job_of_lease(&lease_name(42, 1_796_400_303)), Some(42));
        for bad in ["slurm42", "slurmx-1", "slurm42-x", "job42-1", "slurm-1", ""] {
            assert_eq!(job_of_lease(bad), None, "{bad}");
        }
    }
}
