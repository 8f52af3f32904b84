//! `gpuq-slurm`: what Slurm's burst_buffer/lua plugin calls (through
//! gpuq's `burst_buffer.lua`), and the operator's `status` and `recover`.
//! Thin: parse, call `gpuq_slurm`, print one line, exit with its code.
//! Docs: docs/slurm.md.

use clap::{Parser, Subcommand};
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
    match run(cli) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("gpuq-slurm: {e}");
            ExitCode::from(e.code())
        }
    }
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
        Verb::DataIn { job } => {
            let st = State::lock(&cfg)?;
            runtime()?.block_on(data_in(&st, job))
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
