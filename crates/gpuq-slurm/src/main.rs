//! `gpuq-slurm`: what Slurm's burst_buffer/lua plugin calls (through
//! gpuq's `burst_buffer.lua`), and the operator's `status` and `recover`.
//! Thin: parse, call `gpuq_slurm`, print one line, exit with its code.
//! Docs: docs/slurm.md.

use clap::{Parser, Subcommand};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "gpuq-slurm",
    version,
    about = "gpuq's DAOS site as Slurm's per-job storage"
)]
struct Cli {
    /// Configuration ([slurm] and the site's [daos]).
    #[arg(long, global = true, value_name = "FILE", default_value = gpuq_slurm::DEFAULT_CONFIG)]
    config: PathBuf,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// slurm_bb_job_process: is the script's `#BB_LUA daos` line valid?
    JobProcess { script: PathBuf },
    /// slurm_bb_pools: the pool as JSON (one unit; none while held).
    Pools,
    /// slurm_bb_setup: record the job's lease.
    Setup {
        job: u64,
        uid: u32,
        gid: u32,
        script: PathBuf,
    },
    /// slurm_bb_data_in: prepare the lease (servers, format, joins, agent).
    DataIn { job: u64 },
    /// The data-in's worker, outside Slurm's process group (started by
    /// `data-in`; its stdin's end says that Slurm gave the data-in up).
    #[command(hide = true)]
    DataInWorker { job: u64 },
    /// slurm_bb_paths: append the job's DAOS variables to Slurm's file.
    Paths { job: u64, path_file: PathBuf },
    /// slurm_bb_pre_run: the job runs where the lease's agent runs.
    PreRun { job: u64 },
    /// slurm_bb_job_teardown: clean up, wipe and release (held on failure).
    Teardown { job: u64 },
    /// Operator: finish a held lease's cleanup and release the site.
    Recover,
    /// Operator (and `scontrol show bbstat`): pool, hold, lease, jobs.
    Status {
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Verb::DataIn { job } = cli.verb {
        return supervise(&cli.config, job);
    }
    // Once Slurm has killed whoever reads it, stdout is gone: say it, never
    // panic on it.
    let (line, code) = match run(cli) {
        Ok(line) => (line, ExitCode::SUCCESS),
        Err(e) => (format!("gpuq-slurm: {e}"), ExitCode::from(e.code())),
    };
    let _ = writeln!(std::io::stdout(), "{line}");
    code
}

/// `data-in`: Slurm SIGKILLs the process group of a data-in it gives up
/// (`scancel`, `StageInTimeout`) and, in 22.05, the teardown it starts for
/// it too. So the work runs in a worker in its own process group, whose
/// stdin is a pipe from here: when this process is killed, the worker
/// reads the end of it, stops the preparation and cleans the lease up at
/// once (`gpuq_slurm::data_in`). Its output (progress and the last line)
/// comes back through one pipe and is printed here in order; its exit
/// status is this one's.
fn supervise(config: &std::path::Path, job: u64) -> ExitCode {
    let fail = |why: String| {
        let _ = writeln!(std::io::stdout(), "gpuq-slurm: data-in job {job}: {why}");
        ExitCode::from(1)
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(format!("cannot find this program ({e})")),
    };
    let (read, write) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return fail(format!("pipe: {e}")),
    };
    let write2 = match write.try_clone() {
        Ok(w) => w,
        Err(e) => return fail(format!("pipe: {e}")),
    };
    let child = std::process::Command::new(exe)
        .arg("--config")
        .arg(config)
        .arg("data-in-worker")
        .arg(job.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::from(write2))
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot start the worker ({e})")),
    };
    // Held open until the worker has ended: its end is the worker's sign.
    let _alive = child.stdin.take();
    let mut out = std::io::BufReader::new(std::fs::File::from(read));
    let mut line = String::new();
    use std::io::BufRead;
    // The write ends are the worker's alone now (the Command's copies are
    // closed once it is spawned): EOF here is its exit.
    while matches!(out.read_line(&mut line), Ok(n) if n > 0) {
        let _ = write!(std::io::stdout(), "{line}");
        line.clear();
    }
    match child.wait() {
        Ok(st) => ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => fail(format!("waiting for the worker: {e}")),
    }
}

/// `data-in` is handled by [`supervise`] before `run`.
fn unreachable_data_in() -> Result<String, gpuq_slurm::Error> {
    Err(gpuq_slurm::Error::Failed(
        "data-in runs through its worker".into(),
    ))
}

fn runtime() -> Result<tokio::runtime::Runtime, gpuq_slurm::Error> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| gpuq_slurm::Error::Failed(format!("tokio: {e}")))
}

fn run(cli: Cli) -> Result<String, gpuq_slurm::Error> {
    use gpuq_slurm::*;
    let cfg = load(&cli.config)?;
    match cli.verb {
        Verb::JobProcess { script } => job_process(&cfg, &read_script(&script)?),
        Verb::Pools => Ok(pools(&cfg)),
        Verb::Setup {
            job,
            uid,
            gid,
            script,
        } => {
            let text = read_script(&script)?;
            let st = State::lock(&cfg)?;
            runtime()?.block_on(setup(&st, job, uid, gid, &text))
        }
        Verb::DataIn { .. } => unreachable_data_in(),
        Verb::DataInWorker { job } => {
            let st = State::lock(&cfg)?;
            let (gone, abandoned) = tokio::sync::watch::channel(false);
            // The supervisor's end of stdin: it was killed (or ended).
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 64];
                while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
                let _ = gone.send(true);
            });
            runtime()?.block_on(data_in(&st, job, abandoned))
        }
        Verb::Paths { job, path_file } => paths(&State::reader(&cfg)?, job, &path_file),
        Verb::PreRun { job } => {
            let st = State::lock(&cfg)?;
            runtime()?.block_on(pre_run(&st, job))
        }
        Verb::Teardown { job } => {
            let st = State::lock(&cfg)?;
            runtime()?.block_on(teardown(&st, job))
        }
        Verb::Recover => {
            let st = State::lock(&cfg)?;
            runtime()?.block_on(recover(&st))
        }
        Verb::Status { json } => {
            let st = State::reader(&cfg)?;
            let v = status(&st)?;
            Ok(if json {
                v.to_string()
            } else {
                render_status(&v)
            })
        }
    }
}

fn render_status(v: &serde_json::Value) -> String {
    let mut out = format!(
        "pool {}: {}",
        v["pool"].as_str().unwrap_or("?"),
        if v["free"] == true { "free" } else { "in use" }
    );
    if let Some(h) = v["held"].as_object() {
        out.push_str(&format!(
            "\nHELD: lease {} ({}) — `gpuq-slurm recover` after fixing it",
            h.get("lease").and_then(|x| x.as_str()).unwrap_or("?"),
            h.get("reason").and_then(|x| x.as_str()).unwrap_or("?")
        ));
    }
    for j in v["jobs"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\njob {} uid {}: lease {} ({}), profile {}",
            j["job"],
            j["uid"],
            j["lease"].as_str().unwrap_or("?"),
            j["phase"].as_str().unwrap_or("?"),
            j["profile"].as_str().unwrap_or("?")
        ));
    }
    out
}
