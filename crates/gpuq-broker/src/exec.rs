//! `gpuq daos-exec`: a client container of the caller's running `--inst`
//! job, through this host's Podman API, as the job's owner.
//!
//! Who may: the caller's PID (from `SO_PEERCRED`) must be inside a running
//! DAOS job's cgroup and the caller must own it (root may use any running
//! DAOS job, from anywhere). What the container gets: the profile's pinned
//! client image, the owner's UID, GID and groups, no capabilities,
//! `no-new-privileges`, the host network, and exactly these mounts: the
//! job's submit directory (same path, read-write), the lease's agent socket
//! directory and control config (same paths; the config read-only), the
//! operator's `client_mounts` (each checked now), and a private `/tmp`
//! (`HOME`). The user's command runs in it as an exec session with stdin
//! attached; the caller's terminal and the session are joined by
//! [`pump`] over the upgraded connection ([`gpuq_protocol::exec`]).

use crate::broker::{Broker, Peer};
use crate::daos::job_of_lease;
use crate::error::ApiError;
use crate::exec_dirs::{open_as_owner, open_dir_nofollow, plain_abs_path, shown, Staged};
use crate::store::Job;
use gpuq_lease::Phase;
use gpuq_lifecycle::config::DaosProfile;
use gpuq_lifecycle::host::Host;
use gpuq_podman::{ExecAttach, ExecSpec, ImageId, LibpodClient, LogStream, Podman};
use gpuq_protocol::exec::{self as wire, to_broker, to_cli, ExecRequest};
use gpuq_protocol::{JobId, JobState};
use gpuq_sys::fsid::{self, FsIdentity};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A started client container with the command attached.
#[derive(Debug)]
pub struct Session {
    pm: LibpodClient,
    container: String,
    attach: ExecAttach,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Whose DAOS system a `daos-exec` call uses.
struct Target {
    /// `job 5` or `Slurm job 5`, in messages.
    what: String,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    /// The directory mounted as the job's own: its submit directory
    /// (gpuq) or `WorkDir` (Slurm). Text its owner chose.
    cwd: String,
    /// The lease's name and its profile's.
    lease: String,
    profile_name: String,
    profile: DaosProfile,
    host: Host,
    /// The job's ID in the command's environment.
    id_var: (&'static str, String),
}

/// How long opening a directory to mount may take (a hung NFS server).
const DIR_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// The job whose cgroup holds `pid` (direct runner `gpuq-job-<id>`,
/// systemd `gpuq-job-<id>.service`).
pub fn job_of_pid(pid: u32) -> Option<JobId> {
    job_in_proc_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?)
}

/// The job named by a `/proc/PID/cgroup` text. The unified hierarchy's
/// `0::` line when there is one (cgroup v2, and v1 "hybrid"); on a
/// cgroup-v1-only host (EL8's default) there is none, and systemd's own
/// hierarchy (`N:name=systemd:PATH`) places the unit instead. The other v1
/// controller lines are not read: where a process sits in them does not say
/// which unit it belongs to.
fn job_in_proc_cgroup(text: &str) -> Option<JobId> {
    let unified = text.lines().find_map(|l| l.strip_prefix("0::"));
    let path = unified.or_else(|| {
        text.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
            (ctl == "name=systemd").then_some(path)
        })
    })?;
    path.split('/').find_map(|c| {
        let rest = c.strip_prefix("gpuq-job-")?;
        let id = rest.strip_suffix(".service").unwrap_or(rest);
        id.parse().ok().map(JobId)
    })
}

fn refuse(msg: String) -> ApiError {
    ApiError::Forbidden(msg)
}

/// `p` lies under `dir` (both absolute and normalised).
fn under(p: &Path, dir: &Path) -> bool {
    p.starts_with(dir)
}

/// Check an operator mount: absolute, no `..`, present, and its real path
/// inside the allowed set (a symlink may not lead outside it).
fn check_mount(m: &Path, allowed: &[PathBuf]) -> Result<PathBuf, String> {
    if !m.is_absolute() || m.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!(
            "{}: not an absolute path without '..'",
            m.display()
        ));
    }
    let real = std::fs::canonicalize(m).map_err(|e| format!("{}: {e}", m.display()))?;
    if !allowed.iter().any(|a| under(&real, a)) {
        return Err(format!(
            "{} resolves to {}, outside the allowed client mounts",
            m.display(),
            real.display()
        ));
    }
    Ok(real)
}

impl Broker {
    /// Authorise the caller and start the client container and the command;
    /// every refusal is a one-line error and leaves nothing behind.
    pub async fn exec_start(&self, peer: &Peer, req: ExecRequest) -> Result<Session, ApiError> {
        if req.argv.is_empty() || req.argv.iter().any(|a| a.contains('\0')) {
            return Err(ApiError::BadRequest(
                "give the command after `--`: gpuq daos-exec -- CMD [ARGS...]".into(),
            ));
        }
        for (k, v) in &req.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(ApiError::BadRequest(format!(
                    "--env '{k}': expected NAME=VALUE"
                )));
            }
            if k.starts_with("DAOS_") && k != "DAOS_POOL" && k != "DAOS_CONTAINER" {
                return Err(ApiError::BadRequest(format!(
                    "--env {k}: gpuq sets the DAOS system's variables itself"
                )));
            }
        }
        let t = self.exec_target(peer).await?;
        let (lease, profile, host) = (&t.lease, &t.profile, &t.host);
        let profile_name = &t.profile_name;
        // The job's submit directory: text the user gave at submit time.
        let submit = plain_abs_path(&t.cwd).map_err(|why| {
            refuse(format!(
                "{}'s submit directory {} {why}; nothing is mounted",
                t.what,
                shown(&t.cwd)
            ))
        })?;
        if submit == Path::new("/") {
            return Err(refuse(format!(
                "{}'s submit directory is /: the host's root is never mounted (submit from a directory of yours)",
                t.what
            )));
        }
        // The operator's mounts, each checked now; mounted at their real path.
        let allowed: Vec<PathBuf> = profile.client_mounts.clone();
        let mut extra = Vec::new();
        for m in &profile.client_mounts {
            extra.push(check_mount(m, &allowed).map_err(|e| {
                ApiError::Conflict(format!(
                    "client mount policy of profile {}: {e}",
                    profile_name
                ))
            })?);
        }
        // Where the container has host directories: the work dir must be
        // under one of them.
        let mounted: Vec<PathBuf> = std::iter::once(submit.clone())
            .chain(extra.iter().cloned())
            .collect();
        let under_mounted = |w: &Path| mounted.iter().any(|a| under(w, a));
        // Working directory: --workdir, else the caller's, if mounted.
        let work_dir = match &req.workdir {
            Some(text) => {
                let w = plain_abs_path(text).map_err(|why| {
                    ApiError::BadRequest(format!("--workdir {} {why}", shown(text)))
                })?;
                if !under_mounted(&w) {
                    return Err(ApiError::BadRequest(format!(
                        "--workdir {}: not under a mounted directory ({})",
                        shown(text),
                        mounted
                            .iter()
                            .map(|a| a.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
                w
            }
            None => peer
                .pid
                .and_then(|p| std::fs::read_link(format!("/proc/{p}/cwd")).ok())
                .and_then(|c| plain_abs_path(c.to_str()?).ok())
                .filter(|c| under_mounted(c))
                .unwrap_or_else(|| submit.clone()),
        };
        // Open each directory to mount, without following any symlink: the
        // submit directory as the job's owner (who must be able to open it),
        // the operator's as root. These descriptors, not the paths, are what
        // gets mounted (crate::exec_dirs).
        let owner = FsIdentity {
            uid: t.uid,
            gid: t.gid,
            groups: t.groups.clone(),
        };
        let submit_fd = {
            let p = submit.clone();
            fsid::run_as(owner, DIR_DEADLINE, move || open_as_owner(&p))
                .await
                .map_err(|e| {
                    ApiError::Conflict(format!(
                        "{}'s submit directory {}: could not be checked as uid {}: {e}",
                        t.what,
                        submit.display(),
                        t.uid
                    ))
                })?
                .map_err(|e| {
                    refuse(format!(
                        "{}'s submit directory {} cannot be mounted (checked as its owner, uid {}): {e}",
                        t.what,
                        submit.display(),
                        t.uid
                    ))
                })?
        };
        let mut extra_fds = Vec::new();
        for m in &extra {
            let p = m.clone();
            let fd = tokio::time::timeout(
                DIR_DEADLINE,
                tokio::task::spawn_blocking(move || open_dir_nofollow(&p)),
            )
            .await
            .map_err(|_| format!("no answer within {DIR_DEADLINE:?}"))
            .and_then(|j| j.map_err(|e| e.to_string()))
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| {
                ApiError::Conflict(format!(
                    "client mount policy of profile {}: {e}",
                    profile_name
                ))
            })?;
            extra_fds.push(fd);
        }
        // Test builds: hold here, so a test can swap the paths checked
        // above before anything is mounted (what is mounted must not change).
        crate::crash::crash_point("exec_checked");
        let image = ImageId::parse(&profile.client_image)
            .map_err(|e| ApiError::Conflict(format!("client image: {e}")))?;
        // Unique across broker restarts too: a broker that died during a
        // session may have left its container behind (removed when the
        // lease is re-adopted or cleaned), and a new one must not collide.
        let name = format!(
            "gpuq-{}-client-{}-{}",
            lease,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        // Every check has passed. The checked directories are bind-mounted
        // on root-only staging paths, which Podman gets; they are detached
        // once the container has started (its own copies stay).
        // The lease's client side is on this host (the broker serves the
        // jobs of this host only).
        let Some(here) = host.local() else {
            return Err(ApiError::Conflict(format!(
                "lease {}: its DAOS client side is on another GPU host",
                lease
            )));
        };
        let staging = || -> std::io::Result<(Staged, PathBuf, Vec<PathBuf>)> {
            let mut st = Staged::new(&here.run_dir.join("client-mounts"), &name)?;
            let s = st.bind(&submit_fd, "submit")?;
            let mut e = Vec::new();
            for (i, fd) in extra_fds.iter().enumerate() {
                e.push(st.bind(fd, &format!("mount-{i}"))?);
            }
            Ok((st, s, e))
        };
        let (staged, submit_src, extra_src) = staging().map_err(|e| {
            ApiError::Conflict(format!("client container: staging its mounts: {e}"))
        })?;
        let user = format!("{}:{}", t.uid, t.gid);
        let extra: Vec<(PathBuf, PathBuf)> = extra_src.into_iter().zip(extra).collect();
        let spec = here.client_spec(
            lease,
            &name,
            image,
            (t.uid, t.gid, &t.groups),
            (&submit_src, &submit),
            &extra,
        );
        let mut env: std::collections::BTreeMap<String, String> =
            host.job_env(lease).into_iter().collect();
        env.insert("HOME".into(), "/tmp".into());
        env.insert(t.id_var.0.into(), t.id_var.1.clone());
        env.extend(req.env.iter().cloned());
        let pm = LibpodClient::connect(&here.podman_socket)
            .await
            .map_err(|e| ApiError::Conflict(format!("this host's Podman: {e}")))?;
        pm.container_create(&spec)
            .await
            .map_err(|e| ApiError::Conflict(format!("client container: {e}")))?;
        let started = async {
            pm.container_start(&name).await?;
            // runc has made the container's mounts: the staging ones go.
            drop(staged);
            let exec = ExecSpec {
                env,
                user: Some(user),
                work_dir: Some(work_dir.display().to_string()),
                tty: req.tty,
                stdin: true,
                console_size: req.rows.zip(req.cols),
                ..ExecSpec::new(req.argv.clone())
            };
            let attach = pm.container_exec_attach(&name, &exec).await?;
            Ok::<_, gpuq_podman::Error>(attach)
        }
        .await;
        match started {
            Ok(attach) => {
                tracing::info!(job = %t.what, container = %name, "daos-exec started");
                Ok(Session {
                    pm,
                    container: name,
                    attach,
                })
            }
            Err(e) => {
                let _ = pm.container_delete(&name, true).await;
                Err(ApiError::Conflict(format!("client container: {e}")))
            }
        }
    }

    /// The gpuq job the calling process belongs to, as its runner placed
    /// it: the job its cgroup names ([`job_of_pid`]), confirmed by the
    /// runner (a cgroup or user unit merely *named* like the job's is
    /// another). The process is held by a pidfd from before its cgroup is
    /// read until the runner has answered; should it end meanwhile, its
    /// PID could have come to name another process, and the call is
    /// refused. (Its PID is the kernel's record of who connected; a PID
    /// reused between the connect and the pidfd is left: only the same
    /// user's own process could gain, and then only their own job.)
    async fn caller_job(&self, peer: &Peer) -> Result<Option<JobId>, ApiError> {
        let Some(pid) = peer.pid.and_then(|p| u32::try_from(p).ok()) else {
            return Ok(None);
        };
        let held = match gpuq_sys::proc::pidfd_of_listed(pid) {
            Ok(gpuq_sys::proc::Listed::Open(fd)) => fd,
            Ok(gpuq_sys::proc::Listed::Gone) => {
                return Err(refuse("the calling process has ended".into()))
            }
            // Without pidfds (before Linux 5.3) the caller cannot be held:
            // refused, never decided on a PID alone.
            Err(why) => return Err(ApiError::Conflict(format!("daos-exec: {why}"))),
        };
        let Some(id) = job_of_pid(pid) else {
            return Ok(None);
        };
        let ours = self.runner().holds(id, pid).await?;
        let ended = gpuq_sys::proc::pidfd_exited(std::os::fd::AsFd::as_fd(&held)).unwrap_or(true);
        if ended {
            return Err(refuse(
                "the calling process ended while it was checked; run daos-exec again".into(),
            ));
        }
        if !ours {
            tracing::warn!(
                pid,
                job = %id,
                "daos-exec: the caller's cgroup is named like job {id}'s, but the job's runner did not put it there: taken as outside any job"
            );
            return Ok(None);
        }
        Ok(Some(id))
    }

    /// The running DAOS job the caller may exec into.
    /// The job whose DAOS system the caller's command gets: a Slurm DAOS
    /// job the caller's process belongs to (when `[slurm] config` is set;
    /// Slurm's slurmstepd says so, not the caller), else gpuq's own
    /// running `--inst` job as before.
    async fn exec_target(&self, peer: &Peer) -> Result<Target, ApiError> {
        let in_job = self.caller_job(peer).await?;
        if let (None, Some(cfg), Some(pid)) = (
            in_job,
            self.slurm(),
            peer.pid.and_then(|p| u32::try_from(p).ok()),
        ) {
            use gpuq_slurm::exec::Refusal;
            let node = self.slurm_node().unwrap_or(&cfg.agent_host);
            match gpuq_slurm::exec::job_of_process(cfg, node, pid, peer.uid).await {
                Ok(j) => {
                    return Ok(Target {
                        what: format!("Slurm job {}", j.job),
                        uid: j.uid,
                        gid: j.gid,
                        // The caller is the job's own process (its owner's
                        // uid): its groups, as the kernel recorded them.
                        groups: peer.groups.clone(),
                        cwd: j.work_dir,
                        lease: j.lease,
                        profile_name: j.profile_name,
                        profile: j.profile,
                        host: j.host,
                        id_var: ("SLURM_JOB_ID", j.job.to_string()),
                    })
                }
                Err(Refusal::Refused(m)) => return Err(refuse(m)),
                Err(Refusal::Failed(m)) => {
                    return Err(ApiError::Conflict(format!("Slurm DAOS jobs: {m}")))
                }
                Err(Refusal::NotInJob(m)) if self.daos().is_none() => return Err(refuse(m)),
                Err(Refusal::NotInJob(_)) if !peer.is_root() => {
                    return Err(refuse(
                        "gpuq daos-exec works only inside a running --inst job or Slurm DAOS job (run it from the job's script); this process is in neither".into(),
                    ))
                }
                Err(Refusal::NotInJob(_)) => {}
            }
        }
        let Some(daos) = self.daos() else {
            return Err(ApiError::NotEnabled(
                self.config().daos_off("no DAOS system to exec into"),
            ));
        };
        let job = self.exec_job(peer, in_job)?;
        let lease = daos
            .active()
            .filter(|l| job_of_lease(&l.lease) == Some(job.id))
            .ok_or_else(|| {
                ApiError::Conflict(format!("job {} has no DAOS system (yet)", job.id))
            })?;
        if lease.phase != Phase::Running {
            return Err(ApiError::Conflict(format!(
                "the DAOS system of job {} is not up (lease {} is {:?})",
                job.id, lease.lease, lease.phase
            )));
        }
        let profile = daos
            .profile(&lease.profile)
            .ok_or_else(|| ApiError::Conflict(format!("profile {} is gone", lease.profile)))?
            .clone();
        let host = daos.host(&lease.profile)?;
        Ok(Target {
            what: format!("job {}", job.id),
            uid: job.uid,
            gid: job.gid,
            groups: job.groups,
            cwd: job.cwd,
            profile_name: lease.profile.clone(),
            lease: lease.lease,
            profile,
            host,
            id_var: ("GPUQ_JOB_ID", job.id.to_string()),
        })
    }

    /// `in_job`: the gpuq job whose cgroup holds the caller's PID.
    fn exec_job(&self, peer: &Peer, in_job: Option<JobId>) -> Result<Job, ApiError> {
        let job = match in_job {
            Some(id) => self
                .store()
                .get(id)?
                .ok_or_else(|| refuse(format!("no job {id}")))?,
            None if peer.is_root() => {
                let running: Vec<Job> = self
                    .store()
                    .by_state(&[JobState::Running])?
                    .into_iter()
                    .filter(|j| j.inst.is_some())
                    .collect();
                match running.len() {
                    1 => running.into_iter().next().ok_or_else(|| refuse(String::new()))?,
                    0 => return Err(refuse("no --inst job is running".into())),
                    _ => return Err(refuse("more than one --inst job runs; run daos-exec from inside the one you mean".into())),
                }
            }
            None => {
                return Err(refuse(
                    "gpuq daos-exec works only inside a running --inst job (run it from the job's script); this process is in no gpuq job".into(),
                ))
            }
        };
        if job.uid != peer.uid && !peer.is_root() {
            return Err(refuse(format!("job {} is not yours", job.id)));
        }
        if job.inst.is_none() {
            return Err(refuse(format!(
                "job {} is not a DAOS job (submit it with --inst PROFILE to get a DAOS system)",
                job.id
            )));
        }
        if job.state != JobState::Running {
            return Err(refuse(format!(
                "job {} has finished ({})",
                job.id, job.state
            )));
        }
        Ok(job)
    }
}

/// The caller never took the session: remove its container.
pub async fn abandon(s: Session) {
    let _ = s.pm.container_delete(&s.container, true).await;
}

async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u8,
    data: &[u8],
) -> std::io::Result<()> {
    for part in data
        .chunks(wire::MAX_FRAME)
        .chain(data.is_empty().then_some(&[][..]))
    {
        w.write_all(&wire::header(kind, part.len())).await?;
        w.write_all(part).await?;
    }
    w.flush().await
}

/// Join the caller's connection and the session until the command ends
/// (then its exit code is the last frame) or the caller goes away (then the
/// container is killed). The container is removed either way.
pub async fn pump<IO>(s: Session, io: IO)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let Session {
        pm,
        container,
        attach,
    } = s;
    let session = attach.session.clone();
    let (mut rd, mut wr) = tokio::io::split(io);
    let (stdin, mut out) = attach.split();
    // Caller → command. Returns when the caller's connection ends.
    let from_caller = async {
        let mut stdin = Some(stdin);
        let mut buf = vec![0u8; wire::MAX_FRAME];
        loop {
            let mut h = [0u8; 8];
            if let Err(e) = rd.read_exact(&mut h).await {
                tracing::debug!("daos-exec caller: {e}");
                return;
            }
            let Some((kind, len)) = wire::parse_header(&h) else {
                tracing::debug!("daos-exec caller: bad frame header {h:?}");
                return;
            };
            if let Err(e) = rd.read_exact(&mut buf[..len]).await {
                tracing::debug!("daos-exec caller: {e}");
                return;
            }
            match kind {
                to_broker::STDIN => {
                    if let Some(s) = stdin.as_mut() {
                        if s.write_all(&buf[..len]).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                to_broker::STDIN_EOF => {
                    if let Some(s) = stdin.take() {
                        let _ = s.close().await;
                    }
                }
                to_broker::RESIZE if len == 4 => {
                    let rows = u16::from_be_bytes([buf[0], buf[1]]);
                    let cols = u16::from_be_bytes([buf[2], buf[3]]);
                    let _ = pm.exec_resize(&session, rows, cols).await;
                }
                other => {
                    tracing::debug!(
                        "daos-exec caller: unexpected frame kind {other} ({len} bytes)"
                    );
                    return;
                }
            }
        }
    };
    // Command → caller, as it comes (nothing is buffered beyond a frame).
    let to_caller = async {
        loop {
            match out.next_chunk().await {
                Ok(Some(c)) => {
                    let kind = match c.stream {
                        LogStream::Stderr => to_cli::STDERR,
                        _ => to_cli::STDOUT,
                    };
                    if write_frame(&mut wr, kind, &c.data).await.is_err() {
                        return Err(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(_) => return Ok(()),
            }
        }
    };
    let ended = tokio::select! {
        r = to_caller => r.is_ok(),
        _ = from_caller => false,
    };
    if ended {
        let mut code = None;
        for _ in 0..100 {
            match pm.exec_exit_code(&session).await {
                Ok(Some(c)) => {
                    code = Some(c);
                    break;
                }
                Ok(None) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                Err(_) => break,
            }
        }
        let _ = match code {
            Some(c) => write_frame(&mut wr, to_cli::EXIT, &c.to_be_bytes()).await,
            None => {
                write_frame(
                    &mut wr,
                    to_cli::ERROR,
                    b"the command's exit status is unknown",
                )
                .await
            }
        };
        let _ = wr.shutdown().await;
    } else {
        tracing::info!(container = %container, "daos-exec caller went away; removing the container");
    }
    if let Err(e) = pm.container_delete(&container, true).await {
        if !e.is_not_found() {
            tracing::warn!(container = %container, "remove client container: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::job_in_proc_cgroup;
    use gpuq_protocol::JobId;

    #[test]
    fn a_job_is_found_on_cgroup_v2_v1_hybrid_and_v1_only_hosts() {
        // cgroup v2 (Debian 12, EL9): systemd runner and direct runner.
        assert_eq!(
            job_in_proc_cgroup("0::/system.slice/gpuq-job-7.service\n"),
            Some(JobId(7))
        );
        assert_eq!(
            job_in_proc_cgroup("0::/gpuq.slice/gpuq-job-12\n"),
            Some(JobId(12))
        );
        // cgroup v1 only (EL8's default, systemd 239): no 0:: line.
        let v1 = "12:pids:/system.slice/gpuq-job-7.service\n\
                  11:memory:/system.slice/gpuq-job-7.service\n\
                  10:cpuset:/\n\
                  4:cpu,cpuacct:/system.slice/gpuq-job-7.service\n\
                  1:name=systemd:/system.slice/gpuq-job-7.service\n";
        assert_eq!(job_in_proc_cgroup(v1), Some(JobId(7)));
        // Hybrid: the unified line decides.
        let hybrid = "5:memory:/system.slice/gpuq-job-7.service\n\
                      1:name=systemd:/system.slice/gpuq-job-7.service\n\
                      0::/system.slice/gpuq-job-7.service\n";
        assert_eq!(job_in_proc_cgroup(hybrid), Some(JobId(7)));
        // A v1 controller line alone names no unit.
        assert_eq!(
            job_in_proc_cgroup("12:pids:/system.slice/gpuq-job-7.service\n1:name=systemd:/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(
            job_in_proc_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(job_in_proc_cgroup(""), None);
    }
}
