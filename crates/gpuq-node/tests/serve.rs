//! `gpuq-node serve` as a real process: it connects to a real Podman API
//! service, serves the lease API on a 0600 socket, and stops on SIGTERM
//! leaving nothing behind but what a lease owns.

use gpuq_podman_harness::{skip_reason, PodmanService};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn curl(sock: &std::path::Path, path: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(sock)
        .arg(format!("http://node{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn serve_answers_on_a_root_only_socket_and_stops_cleanly() {
    if let Some(why) = skip_reason() {
        gpuq_podman_harness::cannot_run(
            "serve_answers_on_a_root_only_socket_and_stops_cleanly",
            &why,
        );
        return;
    }
    let podman = PodmanService::start();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = root.join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[node]\nname = \"da1\"\nsocket = \"{r}/node.sock\"\npodman_socket = \"{p}\"\njobs_dir = \"{r}/jobs\"\ntest_dir = \"{r}/test\"\n\n\
             [profiles.test]\nimage = \"sha256:{h}\"\ndaos_version = \"2.8.0\"\nmode = \"test\"\nport = 10101\n",
            r = root.display(),
            p = podman.socket.display(),
            h = "ab".repeat(32)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuq-node"))
        .args(["--config"])
        .arg(&cfg)
        .arg("serve")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = root.join("node.sock");
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "gpuq-node did not bind its socket"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "gpuq-node exited early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let (code, body) = curl(&sock, "/v1/status");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["node"], "da1");
    assert_eq!(v["pins"][0]["present"], false, "{v}");
    assert!(v["lease"].is_null());
    // SIGTERM: a clean exit, the socket removed.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!sock.exists());
}

#[test]
fn serve_refuses_an_unreachable_podman_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(
        &cfg,
        format!(
            "[node]\nname = \"da1\"\nsocket = \"{r}/node.sock\"\npodman_socket = \"{r}/missing.sock\"\njobs_dir = \"{r}/jobs\"\ntest_dir = \"{r}/test\"\n",
            r = dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuq-node"))
        .arg("--config")
        .arg(&cfg)
        .arg("serve")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if !nix::unistd::geteuid().is_root() {
        assert!(err.contains("must run as root"), "{err}");
        return;
    }
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("missing.sock"), "{err}");
    assert!(!err.contains("panicked"));
    assert!(!dir.path().join("node.sock").exists(), "nothing was bound");
}
