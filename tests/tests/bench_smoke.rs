//! Benchmarks that do not rot (issue 30, item 4): every benchmark script
//! that runs in seconds is run here once, with one iteration and the debug
//! binaries this run built, and must end with exit 0 and its summary line.
//! A script a change broke fails the suite (as
//! `daos-lifecycle-sequential.sh` once broke silently). Figures are not
//! looked at: one iteration on a busy machine measures nothing (the
//! figures are in docs/benchmarks.md, from full runs).
//!
//! Not run here, and why: `queue.sh` (a release build and 10,000 jobs),
//! `stor-nfs.sh` and `stor-nvmeof.sh` (each boots the site VM: minutes of
//! TCG; the site VM's own scenarios run their guest side in `site_vm.rs`).

use gpuq_system_tests::*;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// One benchmark at a time: each brings up what it measures (a cluster,
/// a broker, a Podman service) and they would only slow one another.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// Runs `integration/bench/SCRIPT ARGS` with `env` and checks it ended
/// well and printed `summary`.
fn smoke(script: &str, env: &[(&str, String)], args: &[&str], summary: &str) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new("bash")
        .arg(repo().join("integration/bench").join(script))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(repo())
        .output()
        .expect("run bash");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{text}",
        out.status
    );
    assert!(
        text.contains(summary),
        "{script} ended without its summary ({summary:?}):\n{text}"
    );
}

fn debug_bins() -> String {
    bin_dir().display().to_string()
}

#[test]
fn daos_lifecycle_runs_one_job() {
    require_env!();
    smoke(
        "daos-lifecycle.sh",
        &[("N", "1".into()), ("GPUQ_BIN_DIR", debug_bins())],
        &[],
        "median  total",
    );
}

#[test]
fn daos_lifecycle_sequential_baseline_runs_once() {
    require_env!();
    smoke(
        "daos-lifecycle-sequential.sh",
        &[("N", "1".into()), ("GPUQ_BIN_DIR", debug_bins())],
        &[],
        "median  total",
    );
}

#[test]
fn daos_exec_runs_once() {
    require_env!();
    smoke(
        "daos-exec.sh",
        &[("N", "1".into()), ("GPUQ_BIN_DIR", debug_bins())],
        &[],
        "== total",
    );
}

#[test]
fn slurm_vs_queue_runs_once() {
    require_env!();
    smoke(
        "slurm-vs-queue.sh",
        &[("N", "1".into()), ("GPUQ_BIN_DIR", debug_bins())],
        &[],
        "queue median",
    );
}

#[test]
fn node_and_podman_start_stop_run_once() {
    require_env!();
    smoke(
        "node-start-stop.sh",
        &[("RUNS", "1".into()), ("GPUQ_BIN_DIR", debug_bins())],
        &[],
        "median  podman CLI",
    );
    smoke(
        "podman-start-stop.sh",
        &[
            ("RUNS", "1".into()),
            (
                "START_STOP_BIN",
                bin_dir().join("examples/start_stop").display().to_string(),
            ),
        ],
        &[],
        "ratio ours/cli",
    );
}

#[test]
fn discard_runs_once_on_small_devices() {
    require_env!();
    let node = bin_dir().join("gpuq-node").display().to_string();
    smoke(
        "discard.sh",
        &[
            ("RUNS", "1".into()),
            ("DATA_MIB", "16".into()),
            ("SIZE_GIB", "1".into()),
        ],
        &[&node],
        "gpuq-node wipe",
    );
}

#[test]
fn hostile_clients_runs_a_small_flood() {
    require_env!();
    smoke(
        "hostile-clients.sh",
        &[
            ("N", "20".into()),
            ("SAMPLES", "5".into()),
            ("GPUQ_BIN_DIR", debug_bins()),
        ],
        &[],
        "submit under the flood",
    );
}
