//! The systemd runner: one transient unit `gpuq-job-<id>.service` per job,
//! created with `StartTransientUnit` on systemd's D-Bus API (no
//! `systemd-run` subprocess). systemd gives the unit its own cgroup, so
//! `KillUnit(..., "all", SIGKILL)` ends the whole tree.
//!
//! **Nothing of the job's argv or environment is in the unit.** A unit's
//! properties are readable by every local user (`systemctl show`, D-Bus
//! `Properties.GetAll`): an `ExecStart` with the job's argv and an
//! `Environment` with its submitted variables showed one user's tokens to
//! all. `ExecStart` is the broker's own executable with the hidden verb
//! `job-exec` (`[exe, "gpuq-broker", "job-exec"]`), and no `Environment` is
//! set. The argv, environment, user and working directory (for an error
//! line) go as JSON in a sealed memfd passed with the D-Bus message as
//! `StandardInputFileDescriptor`; [`job_exec`], running as the user after
//! systemd has set up the identity, directory and log, reads it from fd 0,
//! puts `/dev/null` on fd 0 and execs the command with the job's
//! environment set over systemd's (what `Environment=` did, for any name
//! execve takes: `BASH_FUNC_module%%` needs no `env(1)` wrapper), looking
//! the command up in the job's `PATH`. The broker's executable is checked
//! at start-up ([`check_job_exec_program`]): root's, not writable by
//! others, executable by all, in directories likewise — a path anyone else
//! could change would run as every job's user. What the unit still shows
//! every user: `User`, `Group`, `SupplementaryGroups`, `WorkingDirectory`.
//!
//! **No path of the user's is handed to systemd as root.** The job's stdout
//! and stderr are the log file the broker already opened safely
//! (`joblog::create`: `O_NOFOLLOW`, fstat checks), passed with the D-Bus
//! message as `StandardOutputFileDescriptor`/`StandardErrorFileDescriptor`
//! (type `h`; `bus_set_transient_std_fd` in systemd's
//! `src/core/dbus-service.c`, what `systemd-run --pty` uses — older than
//! EL8's 239, but tested here on 252 only). The former `StandardOutputFileToAppend=<path>` made
//! systemd open the path as root when it spawned the job, following a
//! symlink the user had put there meanwhile (issue #13). `WorkingDirectory`
//! stays a path: systemd enters it after it has switched to the user
//! (execute.c: "Apply working directory here, because the working directory
//! might be on NFS and only the user running this service might have the
//! correct privilege"), so it reaches only what the user could `cd` to.
//!
//! `RemainAfterExit=yes` keeps the unit — and its
//! `ExecMainCode`/`ExecMainStatus` — after the main process ends, also while
//! the broker is restarting; the broker stops and resets it after reading
//! the status. `Type=notify` (with `job-exec` sending `READY=1` before it
//! execs the command; `Type=exec` would do the same but EL8's systemd 239
//! lacks it) makes the start job fail when systemd cannot set the job up (user, groups, working directory, log file): `start` waits for
//! that job's `JobRemoved` signal and reports such a failure as an error, not
//! as the job's exit code.
//!
//! **Tests:** `tests/tests/systemd_runner.rs` runs the real broker with this
//! runner against a real systemd (PID 1 of a Podman container, see
//! `integration/systemd-box/`), driven by the real CLI.

use super::{JobSpec, Outcome, Runner, RunnerError};
use crate::exec_dirs::shown;
use async_trait::async_trait;
use gpuq_protocol::JobId;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;
use zbus::zvariant::{Fd, OwnedObjectPath, OwnedValue, Value};

const DEST: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// A unit's state is read again when systemd signals a change of it
/// (`PropertiesChanged`, sent once the broker has called `Subscribe`), and
/// at least this often in case a signal was lost (a bus or systemd
/// restart): a job's end is when the DAOS cleanup and the next job start.
const RECHECK: Duration = Duration::from_secs(5);
/// How long `start` waits for systemd to report the start job's result.
const START_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct SystemdRunner {
    conn: zbus::Connection,
    /// The broker's own executable: every job's `ExecStart`.
    exe: PathBuf,
}

fn unit_name(id: JobId) -> String {
    format!("gpuq-job-{id}.service")
}

/// The hidden verb of the broker's executable that each job's unit runs
/// (`gpuq-broker job-exec`, see [`job_exec`]).
pub const JOB_EXEC_VERB: &str = "job-exec";
/// The most `job-exec` reads as its request; the broker's own limits on a
/// submission's argv and environment are far below.
const REQUEST_MAX: u64 = 64 << 20;

/// What the unit's `job-exec` process needs to start the job, handed over
/// in a sealed memfd on its stdin — never in a unit property, which every
/// local user can read (`systemctl show`).
#[derive(Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// Set over what systemd gave the process (in order: a later entry of
    /// the same name wins, as the broker's own entries come last).
    pub env: Vec<(String, String)>,
    /// For the one line a command that cannot be started leaves in the log.
    pub user: String,
    pub cwd: String,
}

/// `ExecStart`'s (path, argv): the broker's own executable and the verb,
/// nothing of the job's. systemd expands `$` only in argv, and these two
/// words have none.
fn exec_start(exe: &Path) -> (String, Vec<String>) {
    (
        exe.to_string_lossy().into_owned(),
        vec!["gpuq-broker".to_string(), JOB_EXEC_VERB.to_string()],
    )
}

/// The job's [`ExecRequest`] as JSON in a memfd, sealed (no write, no
/// resize, no further seals) and read from its start.
fn request_fd(spec: &JobSpec) -> std::io::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use std::io::{Seek, Write};
    let req = ExecRequest {
        argv: spec.argv.clone(),
        env: spec.env.clone(),
        user: spec.user.clone(),
        cwd: spec.cwd.clone(),
    };
    let bytes = serde_json::to_vec(&req).map_err(std::io::Error::other)?;
    let fd = memfd_create(
        c"gpuq-job-exec",
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )?;
    let mut file = File::from(fd);
    file.write_all(&bytes)?;
    fcntl(
        file.as_raw_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_WRITE
                | SealFlag::F_SEAL_SEAL,
        ),
    )?;
    // systemd dup2()s this very file description to the job's fd 0.
    file.rewind()?;
    Ok(file.into())
}

/// Read the request from `fd` (the unit's stdin): a regular file (the
/// memfd), read from offset 0 whatever its position.
fn read_request(fd: BorrowedFd<'_>) -> Result<ExecRequest, String> {
    use std::os::unix::fs::FileExt;
    let file = File::from(fd.try_clone_to_owned().map_err(|e| e.to_string())?);
    let m = file.metadata().map_err(|e| e.to_string())?;
    if !m.file_type().is_file() {
        return Err("stdin is not the job's request (the broker passes a sealed file)".into());
    }
    if m.len() > REQUEST_MAX {
        return Err(format!(
            "the request is {} bytes, over {REQUEST_MAX}",
            m.len()
        ));
    }
    let mut buf = vec![0; m.len() as usize];
    file.read_exact_at(&mut buf, 0).map_err(|e| e.to_string())?;
    serde_json::from_slice(&buf).map_err(|e| format!("the request is not valid: {e}"))
}

/// The `gpuq-broker job-exec` verb, which each job's unit runs as the job's
/// user, in its working directory, with fd 1 and 2 on its log: read the
/// [`ExecRequest`] from fd 0, put `/dev/null` on fd 0 (jobs read no
/// input), and exec the command with the job's environment set over what
/// systemd gave (`USER`, `HOME`, `LOGNAME`, `SHELL` for `User=`, `PATH`,
/// `INVOCATION_ID` …) — what `Environment=` did, but for any name and
/// value execve takes (`BASH_FUNC_module%%` …). The command is looked up in
/// the job's `PATH`. Returns only when it could not be started: 127 when
/// it was not found, else 126 (as a shell does), with one line in the log.
pub fn job_exec() -> i32 {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let fail = |msg: String| {
        // stderr is the job's log: the user sees why their job did not start.
        let _ = writeln!(std::io::stderr(), "gpuq: {msg}");
    };
    let req = match read_request(std::io::stdin().as_fd()) {
        Ok(r) => r,
        Err(e) => {
            fail(format!("job-exec: {e}"));
            return 126;
        }
    };
    let Some((prog, args)) = req.argv.split_first() else {
        fail("job-exec: the request has no command".into());
        return 126;
    };
    // Type=notify: the start job ends "done" only once the unit's set-up
    // (user, groups, working directory, descriptors) has worked and this
    // process runs. Without the notification systemd would end the job at
    // its start timeout, so a job that cannot send it does not start.
    if let Err(e) = notify_ready() {
        fail(format!(
            "job-exec: cannot tell systemd the job started: {e}"
        ));
        return 126;
    }
    let e = std::process::Command::new(prog)
        .args(args)
        .envs(req.env.iter().map(|(k, v)| (k, v)))
        // The job is the unit's main process after exec: it must not speak
        // for the unit (NotifyAccess=main), whatever the submitter's
        // environment named.
        .env_remove("NOTIFY_SOCKET")
        .stdin(std::process::Stdio::null())
        .exec();
    let not_found = e.kind() == std::io::ErrorKind::NotFound;
    let why = if not_found && !prog.contains('/') {
        "command not found".to_string()
    } else {
        e.to_string()
    };
    fail(format!(
        "cannot start `{}` as {} in {}: {why}",
        shown(prog),
        shown(&req.user),
        shown(&req.cwd)
    ));
    if not_found {
        127
    } else {
        126
    }
}

/// Sends `READY=1` to `$NOTIFY_SOCKET` (sd_notify(3): a unix datagram
/// socket, a path or `@` for the abstract namespace).
fn notify_ready() -> std::io::Result<()> {
    notify_ready_to(std::env::var_os("NOTIFY_SOCKET"))
}

fn notify_ready_to(to: Option<std::ffi::OsString>) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(to) = to else {
        return Err(std::io::Error::other("NOTIFY_SOCKET is not set"));
    };
    let addr = match to.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(&to)?,
    };
    UnixDatagram::unbound()?.send_to_addr(b"READY=1", &addr)?;
    Ok(())
}

/// Why `exe` must not be handed to systemd as every job's program, if so.
/// Every job's user runs it: it must be a regular file owned by root that
/// others may execute and nobody else may write, in directories likewise
/// root's, not writable by group or others and searchable by all (no
/// symlink anywhere: the path comes from `/proc/self/exe`, which has none).
pub fn check_job_exec_program(exe: &Path) -> Result<(), RunnerError> {
    let refuse = |why: String| RunnerError::UnsafeProgram {
        path: exe.to_path_buf(),
        why,
    };
    if !exe.is_absolute() || exe.to_str().is_none() {
        return Err(refuse("is not an absolute UTF-8 path".into()));
    }
    let m =
        std::fs::symlink_metadata(exe).map_err(|e| refuse(format!("cannot be examined ({e})")))?;
    if !m.file_type().is_file() {
        return Err(refuse("is not a regular file".into()));
    }
    usable_by_all_writable_by_root(&m).map_err(|w| refuse(format!("itself {w}")))?;
    for dir in exe.ancestors().skip(1) {
        let m = std::fs::symlink_metadata(dir).map_err(|e| {
            refuse(format!(
                "its directory {} cannot be examined ({e})",
                dir.display()
            ))
        })?;
        if !m.file_type().is_dir() {
            return Err(refuse(format!("{} is not a directory", dir.display())));
        }
        usable_by_all_writable_by_root(&m)
            .map_err(|w| refuse(format!("its directory {} {w}", dir.display())))?;
    }
    Ok(())
}

fn usable_by_all_writable_by_root(m: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let mode = m.mode() & 0o7777;
    if m.uid() != 0 {
        return Err(format!("is owned by uid {}, not root", m.uid()));
    }
    if mode & 0o022 != 0 {
        return Err(format!("(mode {mode:o}) is writable by group or others"));
    }
    if mode & 0o001 == 0 {
        return Err(format!("(mode {mode:o}) is not executable by others"));
    }
    Ok(())
}

/// systemd resolves `User=`, `Group=` and `SupplementaryGroups=` in the
/// user database even when they are numeric, and a unit whose IDs have no
/// entry dies before its command runs (status 217/USER or 216/GROUP, which
/// would look like the job's own exit code). Refuse such a job up front with
/// the reason; the broker records it as "could not start".
fn known_ids(spec: &JobSpec) -> Result<(), RunnerError> {
    use nix::unistd::{Gid, Group, Uid, User};
    let refuse = |what: String| RunnerError::State {
        id: spec.id,
        what: format!(
            "{what} has no entry in the user database; \
             systemd runs a unit only as a known user and groups"
        ),
    };
    match User::from_uid(Uid::from_raw(spec.uid)) {
        Ok(Some(_)) => {}
        Ok(None) => return Err(refuse(format!("uid {}", spec.uid))),
        Err(e) => return Err(refuse(format!("uid {} ({e})", spec.uid))),
    }
    for gid in std::iter::once(&spec.gid).chain(spec.groups.iter()) {
        match Group::from_gid(Gid::from_raw(*gid)) {
            Ok(Some(_)) => {}
            Ok(None) => return Err(refuse(format!("gid {gid}"))),
            Err(e) => return Err(refuse(format!("gid {gid} ({e})"))),
        }
    }
    Ok(())
}

/// `ExecMainCode` values (siginfo `si_code`).
const CLD_EXITED: i32 = 1;
const CLD_KILLED: i32 = 2;
const CLD_DUMPED: i32 = 3;
/// The exit statuses systemd's own set-up steps use (EXIT_CHDIR=200 …).
const SYSTEMD_EXIT_CODES: std::ops::RangeInclusive<i32> = 200..=245;

/// Why systemd failed the unit's start job (`result`: the job's result,
/// e.g. "failed"; `status`: the unit's `ExecMainStatus`).
fn start_failure(spec: &JobSpec, exe: &Path, result: &str, status: Option<i32>) -> RunnerError {
    let step = match status {
        Some(200) => format!(" at step CHDIR: cannot enter {}", spec.cwd),
        Some(203) => format!(" at step EXEC: cannot execute {}", exe.display()),
        Some(209) => format!(
            " at step STDOUT: cannot use the log file {}",
            spec.log_path.display()
        ),
        Some(216) => " at step GROUP: cannot set the groups".to_string(),
        Some(217) => " at step USER: cannot become the user".to_string(),
        Some(n) if n > 0 => format!(" (status {n}, see systemd.exec(5), PROCESS EXIT CODES)"),
        _ => String::new(),
    };
    RunnerError::State {
        id: spec.id,
        what: format!(
            "systemd could not start {} (job result {result}){step}",
            unit_name(spec.id)
        ),
    }
}

fn err(e: zbus::Error) -> RunnerError {
    RunnerError::Systemd(e.to_string())
}

impl SystemdRunner {
    /// `exe`: the broker's own executable (from `/proc/self/exe`), which
    /// every job's unit runs as `exe job-exec`; refused unless only root can
    /// change it and every user can run it ([`check_job_exec_program`]).
    pub async fn connect(exe: &Path) -> Result<Self, RunnerError> {
        check_job_exec_program(exe)?;
        let conn = zbus::Connection::system().await.map_err(|e| {
            RunnerError::Systemd(format!(
                "cannot reach the system bus ({e}); on a host without systemd set broker.runner = \"direct\""
            ))
        })?;
        let runner = SystemdRunner {
            conn,
            exe: exe.to_path_buf(),
        };
        // Without a subscriber systemd sends no unit signals on the system
        // bus; with one, the bus daemon passes on only what we match.
        runner
            .manager("Subscribe", &())
            .await
            .map_err(|e| RunnerError::Systemd(format!("systemd refused Subscribe: {e}")))?;
        Ok(runner)
    }

    async fn manager<B>(&self, method: &str, body: &B) -> Result<zbus::Message, zbus::Error>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.conn
            .call_method(Some(DEST), PATH, Some(MANAGER), method, body)
            .await
    }

    /// The unit's object path, or `None` if systemd does not know it.
    async fn unit(&self, id: JobId) -> Result<Option<OwnedObjectPath>, RunnerError> {
        match self.manager("GetUnit", &(unit_name(id),)).await {
            Ok(m) => Ok(Some(m.body().deserialize().map_err(err)?)),
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoSuchUnit" =>
            {
                Ok(None)
            }
            Err(e) => Err(err(e)),
        }
    }

    async fn prop(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<OwnedValue, RunnerError> {
        let m = self
            .conn
            .call_method(
                Some(DEST),
                path.as_str(),
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(iface, name),
            )
            .await
            .map_err(err)?;
        m.body().deserialize::<OwnedValue>().map_err(err)
    }

    async fn string_prop(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<String, RunnerError> {
        let v = self.prop(path, iface, name).await?;
        String::try_from(v).map_err(|e| RunnerError::Systemd(format!("{name}: {e}")))
    }

    async fn int_prop(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<i32, RunnerError> {
        let v = self.prop(path, iface, name).await?;
        i32::try_from(v).map_err(|e| RunnerError::Systemd(format!("{name}: {e}")))
    }

    /// The unit's (ExecMainCode, ExecMainStatus), if systemd has them.
    async fn main_exit(&self, id: JobId) -> Option<(i32, i32)> {
        let path = self.unit(id).await.ok()??;
        let svc = "org.freedesktop.systemd1.Service";
        let code = self.int_prop(&path, svc, "ExecMainCode").await.ok()?;
        let status = self.int_prop(&path, svc, "ExecMainStatus").await.ok()?;
        Some((code, status))
    }

    /// (ActiveState, SubState), or `None` when the unit is gone.
    async fn states(&self, id: JobId) -> Result<Option<(String, String)>, RunnerError> {
        let Some(path) = self.unit(id).await? else {
            return Ok(None);
        };
        let unit = "org.freedesktop.systemd1.Unit";
        Ok(Some((
            self.string_prop(&path, unit, "ActiveState").await?,
            self.string_prop(&path, unit, "SubState").await?,
        )))
    }

    /// Until the unit's (ActiveState, SubState) satisfies `done` — `None`:
    /// the unit is gone — or `within` has passed (`Err(None)`). Woken by
    /// the unit's `PropertiesChanged` signals (listened for before the
    /// first look, so none is missed), and every [`RECHECK`] anyway.
    async fn until(
        &self,
        id: JobId,
        within: Option<Duration>,
        done: impl Fn(&str, &str) -> bool,
    ) -> Result<Option<(String, String)>, Option<RunnerError>> {
        use zbus::export::futures_util::StreamExt;
        let Some(path) = self.unit(id).await.map_err(Some)? else {
            return Ok(None);
        };
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .path(path.as_str())
            .and_then(|b| b.interface("org.freedesktop.DBus.Properties"))
            .and_then(|b| b.member("PropertiesChanged"))
            .map_err(|e| Some(err(e)))?
            .build()
            .to_owned();
        let mut changes = zbus::MessageStream::for_match_rule(rule, &self.conn, Some(64))
            .await
            .map_err(|e| Some(err(e)))?;
        let deadline = within.map(|w| tokio::time::Instant::now() + w);
        loop {
            match self.states(id).await.map_err(Some)? {
                None => return Ok(None),
                Some((active, sub)) if done(&active, &sub) => return Ok(Some((active, sub))),
                Some(_) => {}
            }
            let mut wake = tokio::time::Instant::now() + RECHECK;
            if let Some(d) = deadline {
                if tokio::time::Instant::now() >= d {
                    return Err(None);
                }
                wake = wake.min(d);
            }
            // A signal, or the time to look anyway; a closed stream (the
            // connection is gone) leaves the next look to report it.
            let _ = tokio::time::timeout_at(wake, changes.next()).await;
        }
    }
}

#[async_trait]
impl Runner for SystemdRunner {
    fn name(&self) -> &'static str {
        "systemd"
    }

    async fn start(&self, spec: &JobSpec, log: File) -> Result<(), RunnerError> {
        known_ids(spec)?;
        // The job's argv and environment reach `job-exec` through this
        // descriptor only: a unit's properties (ExecStart, Environment) are
        // readable by every local user over D-Bus.
        let request = request_fd(spec).map_err(|source| RunnerError::Io {
            id: spec.id,
            what: "write the job's request to a memfd".into(),
            source,
        })?;
        let (path, argv) = exec_start(&self.exe);
        let exec: Vec<(String, Vec<String>, bool)> = vec![(path, argv, false)];
        let groups: Vec<String> = spec.groups.iter().map(|g| g.to_string()).collect();
        // A backstop only: the broker enforces the limit itself.
        let runtime_max_usec = (spec.time_limit_secs + 300) * 1_000_000;
        let props: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(format!("gpuq job {}", spec.id))),
            ("ExecStart", Value::from(exec)),
            // Not Type=exec: systemd 239 (EL8) does not know it (added in
            // 240). `job-exec` notifies once it runs, which ends the start
            // job at the same point and fails it on the same set-up errors.
            ("Type", Value::from("notify")),
            ("NotifyAccess", Value::from("main")),
            ("RemainAfterExit", Value::from(true)),
            ("KillMode", Value::from("control-group")),
            ("User", Value::from(spec.uid.to_string())),
            ("Group", Value::from(spec.gid.to_string())),
            ("SupplementaryGroups", Value::from(groups)),
            ("WorkingDirectory", Value::from(spec.cwd.clone())),
            // `job-exec` reads its request from fd 0, then puts /dev/null there.
            (
                "StandardInputFileDescriptor",
                Value::Fd(Fd::from(request.as_fd())),
            ),
            // The broker's own open file description (O_APPEND), sent with
            // the message: systemd dup2()s it to 1 and 2, opening nothing.
            (
                "StandardOutputFileDescriptor",
                Value::Fd(Fd::from(log.as_fd())),
            ),
            (
                "StandardErrorFileDescriptor",
                Value::Fd(Fd::from(log.as_fd())),
            ),
            ("RuntimeMaxUSec", Value::from(runtime_max_usec)),
        ];
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = vec![];
        // With Type=notify systemd finishes the start job once `job-exec`
        // has said READY=1, and fails it when a step before failed (user,
        // groups, working directory, log file). Listen for the job's end
        // before asking, so that the signal cannot be missed.
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .path(PATH)
            .and_then(|b| b.interface(MANAGER))
            .and_then(|b| b.member("JobRemoved"))
            .map_err(err)?
            .build();
        let mut removed = zbus::MessageStream::for_match_rule(rule, &self.conn, Some(256))
            .await
            .map_err(err)?;
        let reply = self
            .manager(
                "StartTransientUnit",
                &(unit_name(spec.id), "fail", props, aux),
            )
            .await
            .map_err(err)?;
        let job: OwnedObjectPath = reply.body().deserialize().map_err(err)?;
        let systemd = reply.header().sender().map(|s| s.to_owned());
        let result = tokio::time::timeout(START_WAIT, async {
            use zbus::export::futures_util::StreamExt;
            while let Some(msg) = removed.next().await {
                let Ok(msg) = msg else { continue };
                if systemd.is_some() && msg.header().sender().map(|s| s.to_owned()) != systemd {
                    continue;
                }
                if let Ok((_, path, _, result)) = msg
                    .body()
                    .deserialize::<(u32, OwnedObjectPath, String, String)>()
                {
                    if path == job {
                        return Some(result);
                    }
                }
            }
            None
        })
        .await;
        match result {
            Ok(Some(r)) if r == "done" => Ok(()),
            // A command that ends at once can also fail the start job: its
            // exit can reach systemd before the news that exec succeeded.
            // Then the status is the job's own (wait() records it); systemd's
            // own set-up failures use 200..=245 (systemd.exec(5)).
            Ok(Some(r)) => match self.main_exit(spec.id).await {
                Some((CLD_EXITED, status)) if !SYSTEMD_EXIT_CODES.contains(&status) => Ok(()),
                Some((CLD_KILLED | CLD_DUMPED, _)) => Ok(()),
                other => Err(start_failure(spec, &self.exe, &r, other.map(|(_, s)| s))),
            },
            // No word from systemd (yet): supervision sees what happens.
            Ok(None) | Err(_) => {
                tracing::warn!(job = %spec.id, "no JobRemoved signal for {}", job.as_str());
                Ok(())
            }
        }
    }

    /// systemd's own answer: the unit `GetUnitByPID` names for `pid` is
    /// the job's unit (a user unit of the same name is another object).
    async fn holds(&self, id: JobId, pid: u32) -> Result<bool, RunnerError> {
        let Some(unit) = self.unit(id).await? else {
            return Ok(false);
        };
        match self.manager("GetUnitByPID", &(pid,)).await {
            Ok(m) => {
                let of_pid: OwnedObjectPath = m.body().deserialize().map_err(err)?;
                Ok(of_pid == unit)
            }
            Err(zbus::Error::MethodError(name, _, _))
                if name.as_str() == "org.freedesktop.systemd1.NoUnitForPID" =>
            {
                Ok(false)
            }
            Err(e) => Err(err(e)),
        }
    }

    async fn alive(&self, id: JobId) -> Result<bool, RunnerError> {
        Ok(match self.states(id).await? {
            None => false,
            Some((active, sub)) => {
                matches!(active.as_str(), "active" | "activating" | "deactivating")
                    && sub != "exited"
            }
        })
    }

    async fn wait(&self, id: JobId) -> Result<Option<Outcome>, RunnerError> {
        let ended = self
            .until(id, None, |active, sub| {
                sub == "exited" || active == "failed" || active == "inactive"
            })
            .await
            .map_err(|e| {
                e.unwrap_or_else(|| RunnerError::State {
                    id,
                    what: "the wait for its end stopped".into(),
                })
            })?;
        if ended.is_none() {
            return Ok(None);
        }
        let outcome = match self.unit(id).await? {
            None => None,
            Some(path) => {
                let svc = "org.freedesktop.systemd1.Service";
                let code = self.int_prop(&path, svc, "ExecMainCode").await?;
                let status = self.int_prop(&path, svc, "ExecMainStatus").await?;
                match code {
                    1 => Some(Outcome {
                        exit_code: Some(status),
                        signal: None,
                    }),
                    2 | 3 => Some(Outcome {
                        exit_code: None,
                        signal: Some(status),
                    }),
                    _ => None,
                }
            }
        };
        // The job's other processes end with its main process.
        self.kill(id).await?;
        Ok(outcome)
    }

    async fn kill(&self, id: JobId) -> Result<(), RunnerError> {
        if self.unit(id).await?.is_none() {
            return Ok(());
        }
        let _ = self
            .manager("KillUnit", &(unit_name(id), "all", libc::SIGKILL))
            .await;
        let _ = self.manager("StopUnit", &(unit_name(id), "replace")).await;
        match self
            .until(id, Some(Duration::from_secs(10)), |active, _| {
                active == "inactive" || active == "failed"
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(Some(e)) => Err(e),
            Err(None) => Err(RunnerError::State {
                id,
                what: format!("{} did not stop within 10s", unit_name(id)),
            }),
        }
    }

    async fn release(&self, id: JobId) -> Result<(), RunnerError> {
        let _ = self.manager("ResetFailedUnit", &(unit_name(id),)).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ready_reaches_a_path_socket_and_an_abstract_one_and_no_socket_is_an_error() {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        super::notify_ready_to(Some(path.into_os_string())).unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let name = format!("gpuq-test-notify-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
            .unwrap();
        super::notify_ready_to(Some(format!("@{name}").into())).unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let e = super::notify_ready_to(None).unwrap_err();
        assert!(e.to_string().contains("NOTIFY_SOCKET"), "{e}");
        let gone = dir.path().join("gone");
        assert!(super::notify_ready_to(Some(gone.into_os_string())).is_err());
    }

    use super::*;

    fn spec(argv: &[&str], env: &[(&str, &str)]) -> JobSpec {
        JobSpec {
            id: JobId(7),
            uid: 0,
            gid: 0,
            groups: vec![],
            user: "alice".into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: "/w/alice".into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log_path: "/dev/null".into(),
            time_limit_secs: 60,
        }
    }

    #[test]
    fn exec_start_is_the_broker_and_its_verb_only() {
        let (path, argv) = exec_start(Path::new("/usr/sbin/gpuq-broker"));
        assert_eq!(path, "/usr/sbin/gpuq-broker");
        assert_eq!(argv, ["gpuq-broker", "job-exec"]);
    }

    #[test]
    fn the_request_is_a_sealed_memfd_read_back_whole() {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        use std::io::Write;
        let env = [
            ("PATH", "/usr/bin:/bin"),
            ("BASH_FUNC_module%%", "() {  eval x\n}"),
            ("with.dot", "1"),
            ("ESC", "a\u{1b}b"),
            ("DOLLAR", "$HOME 100%"),
        ];
        let argv = ["printf", "[%s]\n", "$$", "${HOME}", "a b", "it's"];
        let fd = request_fd(&spec(&argv, &env)).unwrap();
        let seals = fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS).unwrap();
        let want = SealFlag::F_SEAL_SHRINK
            | SealFlag::F_SEAL_GROW
            | SealFlag::F_SEAL_WRITE
            | SealFlag::F_SEAL_SEAL;
        assert_eq!(SealFlag::from_bits_truncate(seals) & want, want);
        // Sealed: nobody holding the descriptor can change it.
        let mut f = File::from(fd.try_clone().unwrap());
        assert_eq!(f.write(b"x").unwrap_err().raw_os_error(), Some(libc::EPERM));
        let req = read_request(fd.as_fd()).unwrap();
        assert_eq!(req.argv, argv);
        let want_env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(req.env, want_env);
        assert_eq!((req.user.as_str(), req.cwd.as_str()), ("alice", "/w/alice"));
    }

    #[test]
    fn a_request_that_is_not_a_file_is_refused() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let e = read_request(r.as_fd()).unwrap_err();
        assert!(e.contains("not the job's request"), "{e}");
    }

    /// A tree `<tmp>/a/b/gpuq-broker` as root with the given modes.
    fn tree(dir_mode: u32, file_mode: u32) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let b = t.path().join("a/b");
        std::fs::create_dir_all(&b).unwrap();
        for d in [t.path().join("a"), b.clone()] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(dir_mode)).unwrap();
        }
        let exe = b.join("gpuq-broker");
        std::fs::write(&exe, b"#!/bin/true\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(file_mode)).unwrap();
        (t, exe)
    }

    #[test]
    fn the_program_handed_to_systemd_must_be_roots_alone_and_usable_by_all() {
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "this test makes root-owned trees: run it as root"
        );
        // Only the tree's own part (the file, b/, a/): the temporary
        // directory's ancestors (/tmp is sticky 1777) are the next test's.
        let check = |exe: &Path| -> Result<(), String> {
            for p in exe.ancestors().take(3) {
                let m = std::fs::symlink_metadata(p).unwrap();
                usable_by_all_writable_by_root(&m).map_err(|w| format!("{} {w}", p.display()))?;
            }
            Ok(())
        };
        let (_t, exe) = tree(0o755, 0o755);
        assert_eq!(check(&exe), Ok(()));
        for (dir, file, want) in [
            (0o775, 0o755, "writable by group or others"),
            (0o757, 0o755, "writable by group or others"),
            (0o750, 0o755, "not executable by others"),
            (0o755, 0o757, "writable by group or others"),
            (0o755, 0o750, "not executable by others"),
        ] {
            let (_t, exe) = tree(dir, file);
            let e = check(&exe).unwrap_err();
            assert!(e.contains(want), "{dir:o}/{file:o}: {e}");
        }
        let (_t, exe) = tree(0o755, 0o755);
        std::os::unix::fs::chown(exe.parent().unwrap(), Some(65534), None).unwrap();
        let e = check(&exe).unwrap_err();
        assert!(e.contains("owned by uid 65534, not root"), "{e}");
    }

    #[test]
    fn the_whole_path_is_checked_up_to_the_root() {
        // A world-writable directory three levels up (whatever is above
        // it): the full check walks that far and names it.
        use std::os::unix::fs::PermissionsExt;
        let (t, exe) = tree(0o755, 0o755);
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let e = check_job_exec_program(&exe).unwrap_err().to_string();
        let want = format!(
            "its directory {} (mode 1777) is writable by group or others",
            t.path().display()
        );
        assert!(e.contains(&want), "{e}");
        assert!(e.contains(&exe.display().to_string()), "{e}");
        let e = check_job_exec_program(Path::new("relative/gpuq-broker"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an absolute"), "{e}");
        let e = check_job_exec_program(Path::new("/usr/sbin/gpuq-broker (deleted)"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be examined"), "{e}");
        // The shell every test machine has is installed as it must be.
        let sh = std::fs::canonicalize("/bin/sh").unwrap();
        assert!(check_job_exec_program(&sh).is_ok(), "{}", sh.display());
    }

    #[test]
    fn ids_without_a_user_database_entry_are_refused_before_systemd() {
        let mut spec = JobSpec {
            id: JobId(7),
            uid: 0,
            gid: 0,
            groups: vec![0],
            user: "root".into(),
            argv: vec!["true".into()],
            cwd: "/".into(),
            env: vec![],
            log_path: "/dev/null".into(),
            time_limit_secs: 60,
        };
        assert!(known_ids(&spec).is_ok());
        // No test machine has these IDs in its user database.
        spec.uid = 3_999_999_001;
        let e = known_ids(&spec).unwrap_err().to_string();
        assert!(e.contains("uid 3999999001 has no entry"), "{e}");
        spec.uid = 0;
        spec.groups = vec![0, 3_999_999_002];
        let e = known_ids(&spec).unwrap_err().to_string();
        assert!(e.contains("gid 3999999002 has no entry"), "{e}");
    }
}
