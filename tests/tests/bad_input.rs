//! Bad input gets one clear line and changes no state.

use gpuq_system_tests::*;

#[test]
fn bad_durations_are_refused_with_the_accepted_forms() {
    require_env!();
    let b = TestBroker::start();
    for bad in ["soon", "0m", "1h1h", "25:99:00", "400d"] {
        let out = b.gpuq(ROOT, &["submit", "--time", bad, "--", "true"]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(bad), "{err}");
        assert_eq!(stdout(&out), "");
    }
    let too_long = b.gpuq(ROOT, &["submit", "--time", "2h", "--", "true"]);
    assert!(stderr(&too_long).contains("longer than this host's maximum 1:00:00"));
    assert_eq!(b.job_count(), 0, "no refused submission was stored");
}

#[test]
fn malformed_and_oversize_bodies_get_one_clear_error() {
    require_env!();
    let b = TestBroker::start();
    let bad_json = b"POST /v1/jobs HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n{\"argv\":[";
    let resp = b.raw_http(bad_json);
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(
        resp.contains("\"code\":\"bad_request\"") && resp.contains("malformed request body"),
        "{resp}"
    );

    let unknown = br#"{"argv":["true"],"cwd":"/","env":[],"uid":0}"#;
    let req = format!(
        "POST /v1/jobs HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        unknown.len()
    );
    let resp = b.raw_http(&[req.as_bytes(), unknown].concat());
    assert!(
        resp.starts_with("HTTP/1.1 400") && resp.contains("unknown field"),
        "{resp}"
    );

    let big = vec![b'x'; 2 * 1024 * 1024];
    let req = format!(
        "POST /v1/jobs HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        big.len()
    );
    let resp = b.raw_http(&[req.as_bytes(), &big].concat());
    assert!(
        resp.starts_with("HTTP/1.1 413"),
        "{}",
        &resp[..resp.len().min(200)]
    );

    let chunked_big = {
        let mut r = b"POST /v1/jobs HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
        for _ in 0..40 {
            r.extend_from_slice(format!("{:x}\r\n", 65536).as_bytes());
            r.extend_from_slice(&vec![b'y'; 65536]);
            r.extend_from_slice(b"\r\n");
        }
        r.extend_from_slice(b"0\r\n\r\n");
        r
    };
    let resp = b.raw_http(&chunked_big);
    assert!(
        resp.starts_with("HTTP/1.1 413"),
        "{}",
        &resp[..resp.len().min(200)]
    );

    let resp = b.raw_http(b"GET /v1/nothing HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
    let resp = b.raw_http(b"GET /v1/jobs/abc HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(
        resp.starts_with("HTTP/1.1 400") && resp.contains("not a job ID"),
        "{resp}"
    );
    let resp = b.raw_http(b"garbage\r\n\r\n");
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 400"),
        "{resp}"
    );
    assert_eq!(b.job_count(), 0);
    // The broker is still serving.
    assert!(b.gpuq(ROOT, &["list"]).status.success());
}

#[test]
fn non_root_lock_over_raw_http_is_refused_before_reading_the_body() {
    require_env!();
    let b = TestBroker::start();
    let out = b.gpuq(Some(&User::new(61003, 61003, &[])), &["unlock"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("only root"));
    assert!(!b.path("etc/maintenance.json").exists());
}

#[test]
fn bad_command_lines_are_usage_errors_without_panics() {
    require_env!();
    let b = TestBroker::start();
    for args in [
        vec!["submit"],
        vec!["cancel", "abc"],
        vec!["frobnicate"],
        vec!["submit", "--inst", "x", "--stor", "lustre", "--", "true"],
    ] {
        let out = b.gpuq(ROOT, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    let out = b.gpuq(ROOT, &["submit", "--stor", "ceph", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("lustre, nfsrdma, nvmeof"),
        "{}",
        stderr(&out)
    );
    let out = b.gpuq(ROOT, &["submit", "--inst", "inst1", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("not enabled"), "{}", stderr(&out));
    assert_eq!(b.job_count(), 0);
}

/// The packaged configuration's `[daos] enabled = false`: GPU-only jobs run,
/// a DAOS job is refused in one line naming the key and the file, and
/// nothing is stored (no job, no lease record, no log file).
#[test]
fn a_broker_with_daos_disabled_runs_gpu_jobs_and_refuses_inst_in_one_line() {
    require_env!();
    let mut b = TestBroker::prepare("");
    b.tables = "[daos]\nenabled = false\n".into();
    let b = TestBroker::launch(b);
    let out = b.gpuq(ROOT, &["submit", "--inst", "inst1", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("DAOS is disabled on this host (enabled = false in [daos] of")
            && err.contains("ask the operator")
            && err.trim_end().lines().count() == 1,
        "{err}"
    );
    assert_eq!(b.job_count(), 0);
    assert!(!b.path("state/active.json").exists());
    let out = b.gpuq(ROOT, &["daos-status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("DAOS is disabled on this host"));
    // A GPU-only job runs.
    let id = b.submit(ROOT, &b.workdir(ROOT, "w"), &["--", "true"]);
    b.wait_state(id, "completed", 30);
}

#[test]
fn unreachable_broker_is_exit_3_with_a_hint() {
    let out = std::process::Command::new(bin("gpuq"))
        .arg("list")
        .env("GPUQ_SOCKET", "/nonexistent/gpuq.sock")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = stderr(&out);
    assert!(
        err.contains("/nonexistent/gpuq.sock") && err.contains("gpuq-broker running"),
        "{err}"
    );
}

fn broker_with_config(text: &str, mode: u32) -> (std::process::Output, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("broker.toml");
    std::fs::write(
        &cfg,
        text.replace("@DIR@", &dir.path().display().to_string()),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(mode)).unwrap();
    let out = std::process::Command::new(bin("gpuq-broker"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    (out, dir)
}

#[test]
fn broker_refuses_unknown_keys_bad_values_and_unsafe_config_files() {
    require_env!();
    let base = "[broker]\nsocket = \"@DIR@/s.sock\"\nstate_dir = \"@DIR@/state\"\nrunner = \"direct\"\ngpu = \"none\"\n";
    let cases = [
        (format!("{base}max_tim = \"1h\"\n"), 0o644, "max_tim"),
        (
            format!("{base}default_time = \"fortnight\"\n"),
            0o644,
            "broker.default_time",
        ),
        (base.replace("direct", "tsp"), 0o644, "runner"),
        (base.to_string(), 0o666, "lets group or others write it"),
        (
            format!("{base}[slurm]\nconfig = \"@DIR@/no-slurm.toml\"\n"),
            0o644,
            "slurm.config",
        ),
    ];
    for (text, mode, expect) in cases {
        let (out, dir) = broker_with_config(&text, mode);
        assert_eq!(out.status.code(), Some(1));
        let err = stderr(&out);
        assert!(
            err.contains("broker.toml") && err.contains(expect),
            "{expect}: {err}"
        );
        assert!(!err.contains("panicked"));
        assert!(
            !dir.path().join("s.sock").exists() && !dir.path().join("state").exists(),
            "no state was created"
        );
    }
}

#[test]
fn a_slurm_node_that_serves_no_daos_job_is_one_line_and_no_state() {
    require_env!();
    use std::os::unix::fs::PermissionsExt;
    let base = "[broker]\nsocket = \"@DIR@/s.sock\"\nstate_dir = \"@DIR@/state\"\nrunner = \"direct\"\ngpu = \"none\"\n[slurm]\nconfig = \"@DIR@/slurm.toml\"\nnode = \"gpu9\"\n";
    let dir = tempfile::tempdir().unwrap();
    let slurm = dir.path().join("slurm.toml");
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/slurm/slurm.toml"),
        &slurm,
    )
    .unwrap();
    std::fs::set_permissions(&slurm, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = dir.path().join("broker.toml");
    std::fs::write(
        &cfg,
        base.replace("@DIR@", &dir.path().display().to_string()),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new(bin("gpuq-broker"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("slurm.node")
            && err.contains("`gpu9` is neither agent_host nor one of [[slurm.gpu_hosts]]"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        !dir.path().join("s.sock").exists() && !dir.path().join("state").exists(),
        "no state was created"
    );
}

#[test]
fn an_unknown_gpu_state_keeps_the_gate_closed_and_says_why() {
    require_env!();
    // On a machine with the NVIDIA driver, the broker runs where its NVML
    // library reads as /dev/null: loading it fails, as on a host without
    // the driver (the state this test is about), and the test runs on GPU
    // machines too.
    let mut b = TestBroker::prepare("gpu = \"nvml\"\n");
    b.hide_files = nvml_libraries();
    let b = TestBroker::launch(b);
    let w = b.workdir(None, "w");
    let id = b.submit(ROOT, &w, &["--", "touch", "ran"]);
    assert!(eventually(5, || stdout(&b.gpuq(ROOT, &["list"]))
        .contains("cannot tell whether the GPU is idle")));
    assert_eq!(b.state(id), "queued");
    assert!(!w.join("ran").exists());
}

#[test]
fn a_log_directory_owned_by_someone_else_refuses_the_submit_and_stores_nothing() {
    require_env!();
    let b = TestBroker::start();
    let alice = User::new(61001, 61001, &[]);
    let w = b.workdir(Some(&alice), "alice");
    // Someone else's directory where alice's logs would go.
    let dir = b.path("logs/61001");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(61002), Some(61002)).unwrap();
    let out = b.gpuq_in(Some(&alice), &w, &[], &["submit", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("owned by uid 61002"),
        "{}",
        stderr(&out)
    );
    assert_eq!(b.job_count(), 0);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing written into it"
    );
}

#[test]
fn a_symlink_planted_as_the_log_never_makes_root_write_through_it() {
    require_env!();
    use std::os::unix::fs::MetadataExt;
    let b = TestBroker::start();
    let alice = User::new(61001, 61001, &[]);
    let w = b.workdir(Some(&alice), "alice");
    // The first job creates alice's log dir; she then plants a symlink
    // where the next job's log will be.
    let first = b.submit(Some(&alice), &w, &["--", "true"]);
    b.wait_state(first, "completed", 30);
    let victim = b.path("victim");
    std::fs::write(&victim, "root's data\n").unwrap();
    let before = std::fs::metadata(&victim).unwrap();
    let next = b.path(&format!("logs/61001/gpuq-{}.log", first + 1));
    std::os::unix::fs::symlink(&victim, &next).unwrap();
    let out = b.gpuq_in(Some(&alice), &w, &[], &["submit", "--", "touch", "ran"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's data\n");
    let after = std::fs::metadata(&victim).unwrap();
    assert_eq!(
        (after.uid(), after.mode(), after.len()),
        (before.uid(), before.mode(), before.len())
    );
    // The job is on record as failed, with the reason, and never ran.
    let j = b.job(first + 1);
    assert_eq!(j["state"], "failed", "{j}");
    assert!(
        j["reason"].as_str().unwrap().contains("cannot create log"),
        "{j}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(!w.join("ran").exists());
}

#[test]
fn daos_verbs_on_a_broker_without_daos_refuse_in_one_line_and_store_nothing() {
    require_env!();
    let b = TestBroker::start();
    for args in [
        vec!["daos-status"],
        vec!["verify-pins"],
        vec!["activate"],
        vec!["activate", "--execute", "--destroy-existing-data"],
        vec!["recover"],
        vec!["daos-exec", "--", "true"],
    ] {
        let out = b.gpuq(ROOT, &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("not enabled") && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
    // daos-exec's own input is checked first, with a clear line each.
    let out = b.gpuq(ROOT, &["daos-exec", "--env", "DAOS_SYSTEM=x", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("gpuq sets the DAOS system's variables itself"),
        "{}",
        stderr(&out)
    );
    let out = b.gpuq(ROOT, &["daos-exec", "--env", "NOVALUE", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("expected NAME=VALUE"),
        "{}",
        stderr(&out)
    );
    // The activation's two flags go together; alone, each is one line
    // (exit 2), and nothing reaches the broker.
    for args in [
        vec!["activate", "--execute"],
        vec!["activate", "--destroy-existing-data"],
    ] {
        let out = b.gpuq(ROOT, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.lines().count() == 1
                && err.contains("--execute")
                && err.contains("--destroy-existing-data"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(b.job_count(), 0);
    assert!(!b.path("state/active.json").exists() && !b.path("state/blocked.json").exists());
}

#[test]
fn a_submit_directory_with_dotdot_or_too_long_is_refused_and_nothing_stored() {
    require_env!();
    let b = TestBroker::start();
    let long = format!("/{}", "a".repeat(5000));
    for (cwd, expect) in [
        ("/tmp/../etc", "contains '..'"),
        ("relative/dir", "is not an absolute path"),
        (long.as_str(), "longer than 4095 bytes"),
    ] {
        let body = serde_json::json!({"argv": ["true"], "cwd": cwd, "env": []}).to_string();
        let req = format!(
            "POST /v1/jobs HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let resp = b.raw_http(req.as_bytes());
        assert!(
            resp.starts_with("HTTP/1.1 400") && resp.contains(expect),
            "{cwd}: {}",
            &resp[..resp.len().min(300)]
        );
    }
    assert_eq!(b.job_count(), 0, "no refused submission was stored");
}

/// Where the dynamic loader would find `libnvidia-ml.so.1` on this machine
/// (the loader's cache, and Debian's and EL's library directories).
fn nvml_libraries() -> Vec<std::path::PathBuf> {
    let mut found: Vec<std::path::PathBuf> = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.trim_start().starts_with("libnvidia-ml.so.1 "))
        .filter_map(|l| l.rsplit("=> ").next())
        .map(|p| std::path::PathBuf::from(p.trim()))
        .collect();
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"] {
        let p = std::path::Path::new(d).join("libnvidia-ml.so.1");
        if p.exists() && !found.contains(&p) {
            found.push(p);
        }
    }
    found.retain(|p| p.exists());
    found
}
