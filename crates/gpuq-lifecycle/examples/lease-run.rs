//! A whole DAOS lease with no broker: prepare, run one command as a user
//! with the lease's DAOS variables, clean up. What the lifecycle needs from
//! whoever drives it is only [`LocalSteps`]: here, ending the command's
//! process and printing the progress lines.
//!
//! ```text
//! lease-run --config broker.toml --state DIR --profile NAME --lease NAME \
//!           --uid UID --gid GID --time LIMIT -- CMD [ARGS...]
//! ```
//!
//! `--time` (e.g. `90s`, `30m`, as `gpuq submit --time`) bounds the
//! command: past it, its process is killed (SIGKILL; what it started
//! itself is not followed: the broker's runners end the job's whole cgroup
//! or unit) and the cleanup runs; the exit status is then 124.
//!
//! Reads `[daos]` of the (root's) configuration, keeps the lease records in
//! `DIR`, and must run where the broker would (its network namespace, as
//! root). Exit status: the command's (124 past `--time`); 70 if the preparation failed (the
//! lease was cleaned up), 75 if the cleanup did not finish (the lease is
//! held in `DIR`; `recover` is the broker's). `tests/lease_run.rs` runs it
//! against the test cluster.

use gpuq_lease::Lease;
use gpuq_lifecycle::config::RawDaos;
use gpuq_lifecycle::daos::Daos;
use gpuq_lifecycle::{LocalError, LocalSteps};
use std::path::PathBuf;
use std::sync::Mutex;

/// The command's process, for the cleanup's `kill_job`.
#[derive(Debug, Default)]
struct Job {
    pid: Mutex<Option<i32>>,
}

#[async_trait::async_trait]
impl LocalSteps for Job {
    async fn kill_job(&self, _lease: &Lease) -> Result<String, LocalError> {
        match *self.pid.lock().unwrap_or_else(|p| p.into_inner()) {
            // The command was waited for: nothing of it is left.
            None => Ok("the command has ended".into()),
            Some(p) => Err(format!("the command (pid {p}) is still running").into()),
        }
    }

    fn note(&self, line: &str) {
        eprintln!("lease-run: {line}");
    }
}

#[derive(Debug, serde::Deserialize)]
struct File {
    daos: RawDaos,
}

fn arg(args: &[String], name: &str) -> Result<String, String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .ok_or_else(|| format!("{name} VALUE is required (see the example's header)"))
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("lease-run: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> Result<u8, String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let split = all
        .iter()
        .position(|a| a == "--")
        .ok_or("no `-- CMD` given")?;
    let (opts, cmd) = (&all[..split], &all[split + 1..]);
    if cmd.is_empty() {
        return Err("no command after `--`".into());
    }
    let config = PathBuf::from(arg(opts, "--config")?);
    let state = PathBuf::from(arg(opts, "--state")?);
    let profile = arg(opts, "--profile")?;
    let lease = arg(opts, "--lease")?;
    let uid: u32 = arg(opts, "--uid")?.parse().map_err(|_| "--uid: a number")?;
    let gid: u32 = arg(opts, "--gid")?.parse().map_err(|_| "--gid: a number")?;
    let limit = std::time::Duration::from_secs(
        gpuq_protocol::duration::parse(&arg(opts, "--time")?)
            .map_err(|e| format!("--time: {e}"))?,
    );
    let text = gpuq_conffile::read_trusted(&config).map_err(|e| e.to_string())?;
    let file: File = gpuq_conffile::parse_toml(&config, &text).map_err(|e| e.to_string())?;
    let cfg = gpuq_lifecycle::config::parse(file.daos)
        .map_err(|e| format!("{}: {}: {}", config.display(), e.key, e.message))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let daos =
            Daos::start(cfg, &state, gpuq_protocol::time::now()).map_err(|e| e.to_string())?;
        let host = daos.host(&profile).map_err(|e| e.to_string())?;
        let job = Job::default();
        let owner = format!("lease-run (uid {uid})");
        let code = match daos
            .prepare(&lease, &owner, uid, &profile, &host, &job)
            .await
        {
            Err(e) => {
                job.note(&format!("preparation failed: {e}"));
                70
            }
            Ok((_lease, env)) => {
                // As the user, with no group of root's: setpriv (the
                // broker's runners drop privileges through gpuq-sys, the
                // one crate allowed raw system calls).
                let mut child = tokio::process::Command::new("setpriv")
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--clear-groups")
                    .arg("--")
                    .args(cmd)
                    .env_clear()
                    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                    .envs(env)
                    .spawn()
                    .map_err(|e| format!("setpriv {}: {e}", cmd[0]))?;
                *job.pid.lock().unwrap_or_else(|p| p.into_inner()) = child.id().map(|p| p as i32);
                let code = match tokio::time::timeout(limit, child.wait()).await {
                    Ok(status) => {
                        let status = status.map_err(|e| e.to_string())?;
                        job.note(&format!("the command ended: {status}"));
                        status.code().unwrap_or(1).clamp(0, 255) as u8
                    }
                    Err(_) => {
                        child.start_kill().map_err(|e| e.to_string())?;
                        let status = child.wait().await.map_err(|e| e.to_string())?;
                        job.note(&format!(
                            "the command ran past --time ({}s): killed ({status})",
                            limit.as_secs()
                        ));
                        124
                    }
                };
                *job.pid.lock().unwrap_or_else(|p| p.into_inner()) = None;
                code
            }
        };
        let code = match daos.cleanup_for(&lease, &job).await {
            Ok(m) => {
                job.note(m.as_deref().unwrap_or("nothing to clean"));
                code
            }
            Err(e) => {
                job.note(&format!("cleanup did not finish, the lease is held: {e}"));
                75
            }
        };
        daos.close().await;
        Ok(code)
    })
}
