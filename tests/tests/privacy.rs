//! What one user can see of another's jobs, on disk and through the CLI
//! (docs/security.md, "What others see of your jobs").

use gpuq_system_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const ALICE: u32 = 61011;
const BOB: u32 = 61012;

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                out.push(e.unwrap().path());
            }
        }
        i += 1;
    }
    out
}

/// Can `uid` open `p` for reading (a file) or list it (a directory)?
fn readable_by(uid: u32, p: &Path) -> bool {
    let tool = if p.is_dir() { "ls" } else { "cat" };
    std::process::Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg(tool)
        .arg(p)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[test]
fn another_user_can_read_nothing_of_what_a_user_submitted() {
    require_env!();
    let b = TestBroker::start();
    let alice = User::new(ALICE, ALICE, &[]);
    let w = b.workdir(Some(&alice), "alice");
    let token = format!("tok-{}-{}", std::process::id(), gpuq_protocol_nonce());
    let out = b.gpuq_in(
        Some(&alice),
        &w,
        &[("MY_API_TOKEN", &token)],
        &[
            "submit",
            "--",
            "sh",
            "-c",
            "exit 0",
            &format!("arg-{token}"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id: u64 = stdout(&out).trim().parse().unwrap();
    b.wait_state(id, "completed", 30);

    let state = b.path("state");
    assert_eq!(
        std::fs::metadata(&state).unwrap().mode() & 0o7777,
        0o700,
        "state_dir"
    );
    // The token really is stored there (as root we find it): the checks
    // below are about files that hold it.
    let holders: Vec<PathBuf> = files_under(&state)
        .into_iter()
        .filter(|p| p.is_file())
        .filter(|p| {
            let bytes = std::fs::read(p).unwrap_or_default();
            bytes.windows(token.len()).any(|w| w == token.as_bytes())
        })
        .collect();
    assert!(
        !holders.is_empty(),
        "the submitted token is in none of {:?}",
        files_under(&state)
    );
    for p in files_under(&state) {
        assert!(
            !readable_by(BOB, &p),
            "uid {BOB} can read {} (mode {:o})",
            p.display(),
            std::fs::metadata(&p).unwrap().mode() & 0o7777
        );
        if p.is_file() {
            assert_eq!(
                std::fs::metadata(&p).unwrap().mode() & 0o077,
                0,
                "{} is open to group or others",
                p.display()
            );
        }
    }
    // Nor can bob list log_root or reach alice's log.
    let logs = b.path("logs");
    assert_eq!(std::fs::metadata(&logs).unwrap().mode() & 0o7777, 0o711);
    assert!(!readable_by(BOB, &logs), "log_root is listable by others");
    assert!(!readable_by(BOB, &logs.join(ALICE.to_string())));
    // ... while alice reads her own.
    assert!(readable_by(
        ALICE,
        &logs.join(format!("{ALICE}/gpuq-{id}.log"))
    ));
}

fn gpuq_protocol_nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn others_see_who_and_when_of_a_job_but_not_its_command_directory_or_log() {
    require_env!();
    let b = TestBroker::start();
    let alice = User::new(ALICE, ALICE, &[]);
    let bob = User::new(BOB, BOB, &[]);
    let w = b.workdir(Some(&alice), "alice-secret-project");
    let id = b.submit(
        Some(&alice),
        &w,
        &[
            "--name",
            "train",
            "--",
            "sh",
            "-c",
            "sleep 30",
            "--password=hunter2",
        ],
    );
    b.wait_state(id, "running", 30);

    // Bob: the job, its owner, state and name — nothing of what or where.
    let out = b.gpuq(Some(&bob), &["list", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains("hunter2") && !text.contains("alice-secret-project"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let j = &v["jobs"][0];
    assert!(j.is_object(), "{text}");
    assert_eq!(j["id"], id);
    assert_eq!(j["uid"], ALICE);
    assert_eq!(j["state"], "running");
    assert_eq!(j["name"], "train");
    assert_eq!(j["hidden"], true);
    assert_eq!(j["argv"], serde_json::json!([]));
    for args in [vec!["list"], vec!["status", &id.to_string()]] {
        let out = b.gpuq(Some(&bob), &args);
        let text = stdout(&out);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert!(
            !text.contains("hunter2") && !text.contains("alice-secret-project"),
            "{args:?}: {text}"
        );
    }
    assert!(
        stdout(&b.gpuq(Some(&bob), &["status", &id.to_string()])).contains("another user's job")
    );

    // Alice and root see all of it.
    for who in [Some(&alice), ROOT] {
        let out = b.gpuq(who, &["status", &id.to_string(), "--json"]);
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["hidden"], false);
        assert!(j["argv"].to_string().contains("hunter2"), "{j}");
        assert!(j["cwd"].as_str().unwrap().ends_with("alice-secret-project"));
    }
    let out = b.gpuq(Some(&alice), &["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_command_line_with_terminal_escapes_reaches_no_terminal_raw() {
    require_env!();
    let b = TestBroker::start();
    let alice = User::new(ALICE, ALICE, &[]);
    let w = b.workdir(Some(&alice), "alice");
    // Set the window title, clear the screen, move the cursor, a CSI in its
    // one-byte C1 form, and a bidi override.
    let nasty = "\u{1b}]0;owned\u{7}\u{1b}[2J\u{1b}[1;1H\u{9b}31m\u{202e}txt.exe\r";
    let id = b.submit(Some(&alice), &w, &["--", "sh", "-c", "exit 3", nasty]);
    b.wait_state(id, "failed", 30);
    for args in [vec!["list", "--all"], vec!["status", &id.to_string()]] {
        let out = b.gpuq(ROOT, &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        for bad in ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}', '\r'] {
            assert!(
                !stdout(&out).contains(bad),
                "{args:?} printed {bad:?} raw: {:?}",
                stdout(&out)
            );
        }
        assert!(
            stdout(&out).contains("\\u{1b}]0;owned"),
            "{args:?}: {}",
            stdout(&out)
        );
    }
    // --json keeps the exact bytes (JSON escapes them itself).
    let j = b.job(id);
    assert_eq!(j["argv"][3], nasty);
}

/// A broker whose state_dir / log_root is unsafe exits with one line naming
/// it, and creates nothing.
#[test]
fn a_state_dir_or_log_root_others_own_or_may_write_is_refused_and_nothing_is_made() {
    require_env!();
    let run = |setup: &dyn Fn(&Path), state: &str, logs: &str| {
        let dir = tempfile::tempdir().unwrap();
        setup(dir.path());
        let cfg = dir.path().join("broker.toml");
        let d = dir.path().display().to_string();
        std::fs::write(
            &cfg,
            format!(
                "[broker]\nsocket = \"{d}/s.sock\"\nstate_dir = \"{d}/{state}\"\nlog_root = \"{d}/{logs}\"\nrunner = \"direct\"\ngpu = \"none\"\ncgroup_parent = \"{}/gpuq-never-{}\"\n",
                cgroup2_root().unwrap().display(),
                std::process::id()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
        let before = files_under(dir.path());
        // A broker that does not refuse would serve for ever: give it 15 s.
        let mut child = std::process::Command::new(bin("gpuq-broker"))
            .arg("--config")
            .arg(&cfg)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = eventually(15, || matches!(child.try_wait(), Ok(Some(_))));
        if !started {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            started,
            "the broker did not refuse: it was still running after 15 s"
        );
        let after = files_under(dir.path());
        (out, before, after, dir)
    };
    type Case = (
        &'static str,
        Box<dyn Fn(&Path)>,
        &'static str,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "state_dir owned by a user",
            Box::new(|d: &Path| {
                std::fs::create_dir(d.join("state")).unwrap();
                std::os::unix::fs::chown(d.join("state"), Some(ALICE), Some(ALICE)).unwrap();
            }),
            "state",
            "logs",
            "broker.state_dir",
        ),
        (
            "state_dir world-writable",
            Box::new(|d: &Path| {
                std::fs::create_dir(d.join("state")).unwrap();
                std::fs::set_permissions(d.join("state"), std::fs::Permissions::from_mode(0o777))
                    .unwrap();
            }),
            "state",
            "logs",
            "broker.state_dir",
        ),
        (
            "log_root below a world-writable directory",
            Box::new(|d: &Path| {
                std::fs::create_dir(d.join("open")).unwrap();
                std::fs::set_permissions(d.join("open"), std::fs::Permissions::from_mode(0o777))
                    .unwrap();
            }),
            "state",
            "open/logs",
            "broker.log_root",
        ),
        (
            "state_dir a symlink",
            Box::new(|d: &Path| {
                std::fs::create_dir(d.join("real")).unwrap();
                std::os::unix::fs::symlink(d.join("real"), d.join("state")).unwrap();
            }),
            "state",
            "logs",
            "broker.state_dir",
        ),
    ];
    for (what, setup, state, logs, expect) in cases {
        let (out, before, after, dir) = run(&*setup, state, logs);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
        assert!(err.contains(expect), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        // Nothing made: no socket, no queue, nothing new anywhere.
        assert_eq!(before, after, "{what}: something was made");
        assert!(!dir.path().join("s.sock").exists());
    }
}

#[test]
fn a_state_dir_from_an_older_gpuq_is_narrowed_and_the_queue_kept() {
    require_env!();
    let mut b = TestBroker::start();
    let alice = User::new(ALICE, ALICE, &[]);
    let w = b.workdir(Some(&alice), "alice");
    let id = b.submit(Some(&alice), &w, &["--", "true"]);
    b.wait_state(id, "completed", 30);
    b.terminate();
    // What gpuq made before: 0755 and 0644.
    let state = b.path("state");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    for f in std::fs::read_dir(&state).unwrap() {
        let p = f.unwrap().path();
        if p.is_file() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    b.spawn();
    assert_eq!(std::fs::metadata(&state).unwrap().mode() & 0o7777, 0o700);
    for f in std::fs::read_dir(&state).unwrap() {
        let p = f.unwrap().path();
        if p.is_file() {
            assert_eq!(
                std::fs::metadata(&p).unwrap().mode() & 0o7777,
                0o600,
                "{}",
                p.display()
            );
        }
    }
    assert_eq!(b.state(id), "completed", "the queue is kept");
    assert!(b.broker_log().contains("narrowing"), "{}", b.broker_log());
}

#[test]
fn a_job_starts_with_the_usual_umask_not_the_brokers() {
    require_env!();
    let b = TestBroker::start();
    let alice = User::new(ALICE, ALICE, &[]);
    let w = b.workdir(Some(&alice), "alice");
    let id = b.submit(
        Some(&alice),
        &w,
        &["--", "sh", "-c", "umask > umask.txt; touch made"],
    );
    b.wait_state(id, "completed", 30);
    assert_eq!(
        std::fs::read_to_string(w.join("umask.txt")).unwrap().trim(),
        "0022"
    );
    assert_eq!(
        std::fs::metadata(w.join("made")).unwrap().mode() & 0o777,
        0o644
    );
}
