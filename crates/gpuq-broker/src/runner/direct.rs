//! The direct runner: no systemd needed.
//!
//! ```text
//! broker ──spawn──▶ gpuq-broker job-shim <spec>   (root, already inside cgroup gpuq-job-<id>)
//!                        └─spawn──▶ the user's command (uid/gid/groups dropped, cwd, env)
//! ```
//! The shim enters the job's cgroup v2 directory in `pre_exec` (before it
//! can fork anything), starts the user's command with the submitter's
//! identity, waits for it and writes its exit status to `<run_dir>/<id>.exit.json`
//! (fsynced, atomic). It runs in its own session, so it survives a broker
//! restart; the broker then re-adopts the job by its cgroup and learns how
//! it ended from the exit file. Cancel and timeout write `1` to `cgroup.kill`
//! (or, on kernels before 5.14, SIGKILL every PID in `cgroup.procs` until the
//! cgroup is empty), which ends the shim and everything the job started.

use super::{JobSpec, Outcome, Runner, RunnerError};
use async_trait::async_trait;
use gpuq_protocol::JobId;
use gpuq_sys::proc::{install_child_setup, ChildSetup};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const POLL: Duration = Duration::from_millis(50);
/// How often a running job's end is looked for (a stat and one small read):
/// the job's end is when the DAOS cleanup and the next job can start.
const EXIT_POLL: Duration = Duration::from_millis(10);
/// How long a killed cgroup may take to empty before we call it a failure.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct DirectRunner {
    cgroup_parent: PathBuf,
    run_dir: PathBuf,
    shim: PathBuf,
}

impl DirectRunner {
    /// `cgroup_parent`: a cgroup v2 directory (created if missing);
    /// `run_dir`: root-only directory for spec and exit files;
    /// `shim`: the `gpuq-broker` executable (it has the `job-shim` verb).
    pub fn new(cgroup_parent: PathBuf, run_dir: PathBuf, shim: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&cgroup_parent)?;
        if !cgroup_parent.join("cgroup.procs").exists() {
            return Err(std::io::Error::other(format!(
                "{} is not a cgroup v2 directory (no cgroup.procs); set broker.cgroup_parent to a \
                 directory under a cgroup2 mount (see `grep cgroup2 /proc/mounts`)",
                cgroup_parent.display()
            )));
        }
        std::fs::create_dir_all(&run_dir)?;
        std::fs::set_permissions(
            &run_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )?;
        Ok(DirectRunner {
            cgroup_parent,
            run_dir,
            shim,
        })
    }

    pub fn cgroup(&self, id: JobId) -> PathBuf {
        self.cgroup_parent.join(format!("gpuq-job-{id}"))
    }
    fn spec_file(&self, id: JobId) -> PathBuf {
        self.run_dir.join(format!("{id}.spec.json"))
    }
    fn exit_file(&self, id: JobId) -> PathBuf {
        self.run_dir.join(format!("{id}.exit.json"))
    }

    fn populated(&self, id: JobId) -> Result<bool, RunnerError> {
        let events = self.cgroup(id).join("cgroup.events");
        match std::fs::read_to_string(&events) {
            Ok(text) => Ok(text.lines().any(|l| l.trim() == "populated 1")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(RunnerError::Io {
                id,
                what: format!("read {}", events.display()),
                source,
            }),
        }
    }

    fn read_exit(&self, id: JobId) -> Option<Outcome> {
        let text = std::fs::read(self.exit_file(id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    async fn kill_and_drain(&self, id: JobId) -> Result<(), RunnerError> {
        let cg = self.cgroup(id);
        if !cg.exists() {
            return Ok(());
        }
        let io = |what: String| move |source| RunnerError::Io { id, what, source };
        let kill_file = cg.join("cgroup.kill");
        let has_kill = kill_file.exists();
        let deadline = tokio::time::Instant::now() + KILL_TIMEOUT;
        loop {
            if !self.populated(id)? {
                return Ok(());
            }
            if has_kill {
                std::fs::write(&kill_file, "1")
                    .map_err(io(format!("write {}", kill_file.display())))?;
            } else {
                // Before Linux 5.14: kill what we see, again until nothing is left
                // (a process may fork between our read and our kill).
                let procs = std::fs::read_to_string(cg.join("cgroup.procs"))
                    .map_err(io(format!("read {}/cgroup.procs", cg.display())))?;
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(RunnerError::State {
                    id,
                    what: format!(
                        "processes in {} survive SIGKILL after {:?}",
                        cg.display(),
                        KILL_TIMEOUT
                    ),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

#[async_trait]
impl Runner for DirectRunner {
    fn name(&self) -> &'static str {
        "direct"
    }

    /// Listed in the `cgroup.procs` of the cgroup this runner made (a
    /// job's processes cannot make cgroups below it: it is root's).
    async fn holds(&self, id: JobId, pid: u32) -> Result<bool, RunnerError> {
        let procs = self.cgroup(id).join("cgroup.procs");
        match std::fs::read_to_string(&procs) {
            Ok(text) => Ok(text.lines().any(|l| l.trim().parse() == Ok(pid))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(RunnerError::Io {
                id,
                what: format!("read {}", procs.display()),
                source,
            }),
        }
    }

    async fn start(&self, spec: &JobSpec, log: File) -> Result<(), RunnerError> {
        let id = spec.id;
        let io = |what: String| move |source| RunnerError::Io { id, what, source };
        let cg = self.cgroup(id);
        match std::fs::create_dir(&cg) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if self.populated(id)? {
                    return Err(RunnerError::State {
                        id,
                        what: format!("{} already has processes", cg.display()),
                    });
                }
            }
            Err(e) => return Err(io(format!("create cgroup {}", cg.display()))(e)),
        }
        let _ = std::fs::remove_file(self.exit_file(id));
        let spec_json = serde_json::to_vec(spec).map_err(|e| RunnerError::State {
            id,
            what: format!("encode spec: {e}"),
        })?;
        let spec_file = self.spec_file(id);
        gpuq_durable::write_atomic(&spec_file, &spec_json, 0o600)
            .map_err(io(format!("write {}", spec_file.display())))?;
        let procs: OwnedFd = std::fs::OpenOptions::new()
            .write(true)
            .open(cg.join("cgroup.procs"))
            .map_err(io(format!("open {}/cgroup.procs", cg.display())))?
            .into();
        let out = log.try_clone().map_err(io("dup log fd".into()))?;
        let mut cmd = Command::new(&self.shim);
        cmd.arg("job-shim")
            .arg(&spec_file)
            .arg(self.exit_file(id))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        install_child_setup(
            &mut cmd,
            ChildSetup {
                cgroup_procs: Some(procs),
                new_session: true,
                identity: None,
                cwd: None,
            },
        );
        let mut child = tokio::process::Command::from(cmd)
            .spawn()
            .map_err(io(format!("spawn {}", self.shim.display())))?;
        // Reap the shim when it exits; its status is in the exit file.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        Ok(())
    }

    async fn alive(&self, id: JobId) -> Result<bool, RunnerError> {
        self.populated(id)
    }

    async fn wait(&self, id: JobId) -> Result<Option<Outcome>, RunnerError> {
        // The main process has ended once the shim wrote the exit file, or
        // once nothing is left in the cgroup at all.
        while self.populated(id)? && !self.exit_file(id).exists() {
            tokio::time::sleep(EXIT_POLL).await;
        }
        // Whatever the job left behind (background processes) ends with it.
        self.kill_and_drain(id).await?;
        Ok(self.read_exit(id))
    }

    async fn kill(&self, id: JobId) -> Result<(), RunnerError> {
        self.kill_and_drain(id).await
    }

    async fn release(&self, id: JobId) -> Result<(), RunnerError> {
        let cg = self.cgroup(id);
        if cg.exists() {
            std::fs::remove_dir(&cg).map_err(|source| RunnerError::Io {
                id,
                what: format!("remove cgroup {}", cg.display()),
                source,
            })?;
        }
        for f in [self.spec_file(id), self.exit_file(id)] {
            let _ = std::fs::remove_file(f);
        }
        Ok(())
    }
}

/// The umask a job starts with (the systemd runner's units get systemd's
/// default, the same 022).
pub const JOB_UMASK: u32 = 0o022;

/// The `gpuq-broker job-shim SPEC EXIT` verb: run inside the job's cgroup,
/// start the user's command as the user, record how it ended. Returns the
/// shim's own exit code.
pub fn job_shim(spec_path: &Path, exit_path: &Path) -> i32 {
    use std::io::Write;
    let fail = |msg: String| {
        // stderr is the job's log: the user sees why their job did not start.
        let _ = writeln!(std::io::stderr(), "gpuq: {msg}");
        msg
    };
    let spec: JobSpec = match std::fs::read(spec_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            fail(format!(
                "job shim: cannot read {}: {e}",
                spec_path.display()
            ));
            return 1;
        }
    };
    // The job gets the usual umask (022: Debian's and EL's login default and
    // systemd's for units), not the broker's 077 which the shim inherited.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(JOB_UMASK));
    let outcome = match spawn_user_command(&spec) {
        Ok(mut child) => match child.wait() {
            Ok(status) => {
                use std::os::unix::process::ExitStatusExt;
                Outcome {
                    exit_code: status.code(),
                    signal: status.signal(),
                }
            }
            Err(e) => {
                fail(format!("job shim: wait failed: {e}"));
                Outcome {
                    exit_code: None,
                    signal: None,
                }
            }
        },
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            fail(format!(
                "cannot start `{}` as {} in {}: {e}",
                spec.argv.first().map(String::as_str).unwrap_or(""),
                spec.user,
                spec.cwd
            ));
            Outcome {
                exit_code: Some(code),
                signal: None,
            }
        }
    };
    let bytes = serde_json::to_vec(&outcome).unwrap_or_default();
    if let Err(e) = gpuq_durable::write_atomic(exit_path, &bytes, 0o600) {
        fail(format!("job shim: cannot record exit status: {e}"));
        return 1;
    }
    outcome.exit_code.unwrap_or(1)
}

fn spawn_user_command(spec: &JobSpec) -> std::io::Result<std::process::Child> {
    let (prog, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let cwd = std::ffi::CString::new(spec.cwd.as_bytes())
        .map_err(|_| std::io::Error::other("working directory contains NUL"))?;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    install_child_setup(
        &mut cmd,
        ChildSetup {
            cgroup_procs: None,
            new_session: false,
            identity: Some((spec.uid, spec.gid, spec.groups.clone())),
            cwd: Some(cwd),
        },
    );
    cmd.spawn()
}
