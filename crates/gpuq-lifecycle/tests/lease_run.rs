//! A whole DAOS lease with no broker (issue #15): `examples/lease-run.rs`
//! prepares a lease on the real test cluster (four node helpers, the
//! simulator image, real SSH links from cxl2's namespace), runs one command
//! as an ordinary user with the lease's DAOS variables — the simulator's
//! `dmg system query` through the lease's own TLS — and cleans up; nothing
//! of the broker runs.

use gpuq_system_tests::cluster::*;
use gpuq_system_tests::daos_site::{daos_tables, dmg_on_host};
use gpuq_system_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

fn example() -> std::path::PathBuf {
    let p = bin_dir().join("examples/lease-run");
    assert!(
        p.exists(),
        "{} is missing: `cargo test` builds the examples (cargo build -p gpuq-lifecycle --examples)",
        p.display()
    );
    p
}

#[test]
fn a_lease_prepares_runs_a_users_command_and_cleans_up_without_a_broker() {
    require_cluster_env!();
    require_env!();
    let (archive, image) = sim_image();
    let c = Cluster::up_with(
        "lr",
        &[
            ("GPUQ_CLUSTER_IMAGE", &archive),
            ("GPUQ_CLUSTER_PROFILE_IMAGE", &image),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.path().join("broker.toml");
    std::fs::write(&config, daos_tables(&c, dir.path(), &image)).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    // The user's own directory for the command's output.
    let out = dir.path().join("alice");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::chown(&out, Some(61001), Some(61001)).unwrap();
    let script = format!(
        "id -u > {o}/uid; id -G > {o}/groups; {dmg} dmg -o \"$DAOS_CONTROL_CONFIG\" -j system query > {o}/query.json; exec sleep 600",
        o = out.display(),
        dmg = dmg_on_host()
    );
    let run = std::process::Command::new("timeout")
        .arg("300")
        .arg("nsenter")
        .arg(format!("--net=/run/netns/{}", c.id.namespace("cxl2")))
        .arg(example())
        .args(["--config", &config.display().to_string()])
        .args(["--state", &state.display().to_string()])
        .args(["--profile", "test", "--lease", "lr-1"])
        .args(["--uid", "61001", "--gid", "61001"])
        // The command ends in a long sleep: the limit ends it, then the
        // cleanup runs.
        .args(["--time", "30s"])
        .args(["--", "bash", "-c", &script])
        .output()
        .unwrap();
    // Whatever happened, its ssh masters end with the test.
    for (pid, _) in pids_mentioning(&c.dir().join("cxl2/run/links").display().to_string()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let log = stderr(&run);
    assert_eq!(run.status.code(), Some(124), "{}\n{log}", run.status);
    assert!(
        log.contains("the command ran past --time (30s): killed"),
        "{log}"
    );
    // The command ran as alice, with none of root's groups, against the
    // lease's four joined ranks.
    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap_or_default();
    assert_eq!(read("uid").trim(), "61001");
    assert_eq!(read("groups").trim(), "61001");
    let q: serde_json::Value = serde_json::from_str(&read("query.json")).unwrap_or_default();
    let members = q["response"]["members"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(members.len(), 4, "{q}\n{log}");
    assert!(members.iter().all(|m| m["state"] == "joined"), "{q}");
    // Every step, then the release: nothing left anywhere.
    for step in [
        "kill_job",
        "remove_clients",
        "stop_agent",
        "system_stop",
        "stop_servers",
        "wipe",
    ] {
        assert!(log.contains(&format!("cleanup {step}: ")), "{step}: {log}");
    }
    assert!(log.contains("lease lr-1 released"), "{log}");
    assert!(!state.join("active.json").exists() && !state.join("blocked.json").exists());
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("lr-1.json")).unwrap()).unwrap();
    assert_eq!(record["phase"], "released", "{record}");
    for host in ["cxl2", "da1", "da2", "da3", "da4"] {
        assert!(
            eventually(10, || c.containers(host).is_empty()),
            "{host}: {:?}",
            c.containers(host)
        );
    }
    for n in NODES {
        let (code, body) = c.http(&c.node_sock(n), "GET", "/v1/status", None);
        assert_eq!(code, 200, "{body}");
        let st: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(st["lease"].is_null(), "{n} still holds a lease: {st}");
    }
    std::thread::sleep(Duration::from_millis(10));
    c.down();
}
