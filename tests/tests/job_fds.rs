//! What a job inherits from the broker in open file descriptors: nothing but
//! its stdin (/dev/null) and its log on stdout and stderr — with the direct
//! runner here (the systemd runner's side is in `systemd_runner.rs`).
//!
//! A broker may hold descriptors without `O_CLOEXEC` that it never opened
//! itself: inherited from whoever started it, or opened by a C library it
//! loads (NVML). Each would pass through the job shim (root) into the
//! user's command unless every exec closes it.

use gpuq_system_tests::*;
use std::os::unix::fs::PermissionsExt;

fn alice() -> User {
    User::new(61001, 61001, &[61001])
}

/// The job prints its shell's descriptor numbers between two markers (`ls`
/// is the shell's child, so ls's own directory descriptor is not listed),
/// then tries to read a root-only file through descriptor 7.
const SHOW_FDS: &str = "echo fds-begin; ls /proc/$$/fd; echo fds-end; \
                        cat <&7 2>/dev/null || echo no-fd-7";

/// The descriptor numbers the job listed.
fn listed_fds(log: &str) -> Vec<String> {
    let start = log
        .lines()
        .position(|l| l == "fds-begin")
        .unwrap_or_else(|| panic!("no fds-begin in the log:\n{log}"));
    log.lines()
        .skip(start + 1)
        .take_while(|l| *l != "fds-end")
        .map(str::to_string)
        .collect()
}

#[test]
fn a_descriptor_the_broker_inherited_never_reaches_a_users_job() {
    require_env!();
    let mut b = TestBroker::prepare("");
    // A root-only secret, and a start script that hands the broker an open
    // descriptor to it without close-on-exec (what a shell's `7<file` or a
    // careless supervisor does).
    let secret_dir = b.path("root-only");
    std::fs::create_dir(&secret_dir).unwrap();
    std::fs::set_permissions(&secret_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = secret_dir.join("secret");
    std::fs::write(&secret, "root-secret-7c1f\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let wrapper = b.path("start-broker");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec 7<'{}'\nexec '{}' \"$@\"\n",
            secret.display(),
            bin("gpuq-broker").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    b.broker_bin = Some(wrapper);
    let b = TestBroker::launch(b);
    // The broker really holds it (else this test would prove nothing).
    let pid = b.pid().expect("broker pid");
    let held = std::fs::read_link(format!("/proc/{pid}/fd/7"))
        .unwrap_or_else(|e| panic!("the broker has no fd 7 ({e}): the set-up failed"));
    assert_eq!(held, secret, "fd 7 of the broker");

    let a = alice();
    let w = b.workdir(Some(&a), "w");
    for user in [Some(&a), ROOT] {
        let id = b.submit(user, &w, &["--", "bash", "-c", SHOW_FDS]);
        b.wait_state(id, "completed", 30);
        let log = std::fs::read_to_string(b.job(id)["log_path"].as_str().unwrap()).unwrap();
        assert_eq!(listed_fds(&log), ["0", "1", "2"], "{log}");
        assert!(!log.contains("root-secret"), "the job read it:\n{log}");
        assert!(log.contains("no-fd-7"), "{log}");
    }
}
