//! `kill -9`-like deaths of the broker at every lifecycle step of a DAOS
//! job (the broker's test build aborts at a named step: cargo feature
//! `crash-points`, `GPUQ_CRASH_AT=<step>`; docs/lifecycle.md lists them).
//! During the preparation each must end held — never with a next job on
//! dirty nodes — and `recover` must then clean up and let the queue move
//! on. From the job's start on, the restarted broker carries on: the job
//! runs to its end, the cleanup runs or resumes, the next job follows.

use gpuq_system_tests::cluster::NODES;
use gpuq_system_tests::daos_site::*;
use gpuq_system_tests::*;
use std::time::Duration;

/// Every crash point, in lifecycle order.
const STEPS: [&str; 15] = [
    "lease_created",
    "preflight_passed",
    "servers_started",
    "formatted",
    "joined",
    "agent_started",
    "job_started",
    "job_ended",
    "before_kill_job",
    "before_remove_clients",
    "before_stop_agent",
    "before_system_stop",
    "before_stop_servers",
    "before_wipe",
    "before_release",
];

fn crash_broker() -> std::path::PathBuf {
    let p = bin_dir().join("gpuq-broker-crash-points");
    assert!(
        p.exists(),
        "{} is missing: tests/run builds it (cargo build -p gpuq-broker --features crash-points, \
         copied to that name)",
        p.display()
    );
    p
}

/// The crash points during the preparation: what was half set up cannot be
/// confirmed, so the restarted broker holds the lease.
const PREPARING: usize = 6;

#[test]
fn a_broker_that_dies_at_any_lifecycle_step_holds_or_carries_on_and_the_nodes_end_clean() {
    require_cluster_env!();
    require_env!();
    let mut s = Site::up_with("dj-crash", Some(crash_broker()));
    let rw = s.b.workdir(None, "root");
    for (i, step) in STEPS.iter().enumerate() {
        // Restart the broker armed for this step.
        if s.b.pid().is_some() {
            let _ = s.b.terminate();
        }
        s.b.env = vec![("GPUQ_CRASH_AT".into(), step.to_string())];
        s.b.spawn();
        let marker = rw.join(format!("ran-{i}"));
        let daos = s.b.submit(
            ROOT,
            &rw,
            &[
                "--inst",
                "test",
                "--",
                "bash",
                "-c",
                &format!("sleep 2; touch {}", marker.display()),
            ],
        );
        let next = s.b.submit(ROOT, &rw, &["--", "true"]);
        let died = eventually(90, || s.b.pid().is_none_or(|p| !alive(p as i32)));
        assert!(
            died,
            "{step}: the broker did not abort:\n{}",
            s.b.broker_log()
        );
        s.b.kill9(); // only reaps it: it is gone already
                     // Before `dmg system stop`, cxl2's files of the lease go
                     // while no broker runs (as its /run would in a reboot):
                     // `dmg` runs on the dmg node, which keeps what it needs.
        let files_gone = matches!(*step, "before_stop_agent" | "before_system_stop");
        if files_gone {
            lose_host_files(&s);
        }
        // Back without the crash point.
        s.b.env.clear();
        s.b.spawn();
        if i < PREPARING {
            // Held, and nothing else runs until recover.
            assert!(
                s.state().join("blocked.json").exists(),
                "{step}: no hold after the crash:\n{}",
                s.log(daos)
            );
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(
                s.b.state(next),
                "queued",
                "{step}: a job started on a held lease"
            );
            let st = s.b.state(daos);
            assert_eq!(st, "lost", "{step}: the DAOS job is {st}");
            let list = stdout(&s.b.gpuq(ROOT, &["list"]));
            assert!(list.contains("HOLD"), "{step}: {list}");
            assert!(!marker.exists(), "{step}: the job ran");
            let r = s.b.gpuq(ROOT, &["recover"]);
            assert!(
                r.status.success(),
                "{step}: recover failed: {}\n{}",
                stderr(&r),
                s.log(daos)
            );
        } else {
            // Re-adopted: the job (left running, or already ended) is
            // settled as it really ended, the cleanup runs or resumes on its
            // own, and the next job follows — no hold, no operator.
            s.expect_end(daos, "completed", 90);
            assert!(marker.exists(), "{step}: the job did not run to its end");
            s.expect_end(next, "completed", 120);
            assert!(
                !s.state().join("blocked.json").exists(),
                "{step}: held:\n{}",
                s.log(daos)
            );
            let log = s.log(daos);
            let said = if *step == "job_started" {
                "re-adopted by a restarted broker"
            } else {
                "resumes the cleanup of lease"
            };
            assert!(log.contains(said), "{step}: {log}");
            assert!(log.contains("released"), "{step}: {log}");
        }
        // The plain job ran only after the lease was released. (`recover`
        // answers once the lease is released; the scheduler starts the
        // next job after that, on its own: wait for its end first — a
        // loaded run read its start time before it had one.)
        s.expect_end(next, "completed", 60);
        let ended = |id: u64| s.b.job(id)["ended_at"].as_i64().unwrap();
        let started = s.b.job(next)["started_at"].as_i64().unwrap();
        assert!(
            started >= ended(daos),
            "{step}: next started before the DAOS job ended"
        );
        if files_gone {
            let log = s.log(daos);
            assert!(
                log.contains("cleanup system_stop: 4 rank(s) stopped"),
                "{step}: cxl2's lease files gone: {log}"
            );
        }
        s.assert_clean();
        eprintln!(
            "{step}: {} after the crash, nodes clean",
            if i < PREPARING {
                "held, recovered"
            } else {
                "carried on"
            }
        );
    }
}

#[test]
fn a_broker_restarted_during_a_daos_job_keeps_the_job_and_its_daos_system() {
    require_cluster_env!();
    require_env!();
    let mut s = Site::up("dj-restart");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let g = bin("gpuq").display().to_string();
    // The job queries its DAOS system before and after the restart, through
    // the broker each time (daos-exec), and waits for `go` in between; a
    // third session is still running in its client container when the
    // broker stops (`in-session` appears once it runs there).
    let script = format!(
        r#"{g} daos-exec -- dmg -o "$DAOS_CONTROL_CONFIG" -j system query > before.json
{g} daos-exec -- sh -c 'touch in-session; exec sleep 600' > session.out 2>&1 &
while [ ! -e go ]; do sleep 0.2; done
{g} daos-exec -- dmg -o "$DAOS_CONTROL_CONFIG" -j system query > after.json
"#
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    assert!(
        eventually(180, || std::fs::metadata(w.join("before.json"))
            .is_ok_and(|m| m.len() > 0)),
        "{}",
        s.log(id)
    );
    assert!(
        eventually(60, || w.join("in-session").exists()),
        "{}",
        s.log(id)
    );
    let lease = s.active_lease().unwrap()["lease"]
        .as_str()
        .unwrap()
        .to_string();
    let clients = |s: &Site| -> Vec<String> {
        s.containers("cxl2")
            .into_iter()
            .filter(|c| c.starts_with(&format!("gpuq-{lease}-client-")))
            .collect()
    };
    let before = clients(&s);
    assert_eq!(before.len(), 1, "{before:?}");
    // A restart as systemd (or a package upgrade followed by one) does it,
    // here with a `daos-exec` session running.
    let st = s.b.terminate();
    assert!(st.success(), "{st}");
    s.b.spawn();
    let next = s.b.submit(ROOT, &w, &["--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(id), "running", "{}", s.log(id));
    assert_eq!(
        s.b.state(next),
        "queued",
        "the next job ran beside the lease"
    );
    assert!(
        !s.state().join("blocked.json").exists(),
        "held:\n{}",
        s.log(id)
    );
    // That session ended with the broker that ran it: its caller was told,
    // and the restarted broker removed its container before serving.
    assert!(
        eventually(30, || std::fs::read_to_string(w.join("session.out"))
            .is_ok_and(|o| o.contains("ended the session"))),
        "{:?}",
        std::fs::read_to_string(w.join("session.out"))
    );
    assert_eq!(clients(&s), Vec::<String>::new(), "{}", s.log(id));
    let name = before[0].split(' ').next().unwrap();
    assert!(
        s.log(id).contains(&format!(
            "daos-exec sessions of the previous broker (ended with it): removed {name}"
        )),
        "{}",
        s.log(id)
    );
    std::fs::write(w.join("go"), "").unwrap();
    s.expect_end(id, "completed", 120);
    let q: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(w.join("after.json")).unwrap()).unwrap();
    let members = q["response"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 4, "{q}");
    assert!(members.iter().all(|m| m["state"] == "joined"), "{q}");
    let log = s.log(id);
    assert!(
        log.contains(&format!(
            "re-adopted by a restarted broker: its lease {lease}"
        )),
        "{log}"
    );
    s.expect_end(next, "completed", 120);
    assert!(
        s.log(id).contains(&format!("lease {lease} released")),
        "{}",
        s.log(id)
    );
    assert!(!s.state().join("blocked.json").exists());
    s.assert_clean();
}

#[test]
fn a_restarted_broker_whose_config_lost_the_leases_profile_holds_it_and_touches_nothing() {
    require_cluster_env!();
    require_env!();
    let mut s = Site::up("dj-noprof");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let id = s.submit_inst_until_go(Some(&a), &w, "touch ran");
    assert!(
        eventually(120, || s.log(id).contains("starting the job")),
        "{}",
        s.log(id)
    );
    let lease = s.active_lease().unwrap()["lease"]
        .as_str()
        .unwrap()
        .to_string();
    let hosts = ["cxl2", "da1", "da2", "da3", "da4"];
    let before: Vec<Vec<String>> = hosts.iter().map(|h| s.containers(h)).collect();
    // Restarted with a configuration that no longer has the lease's profile.
    assert!(s.b.terminate().success());
    let orig = s.b.tables.clone();
    s.b.tables = orig.replace("[daos.profiles.test]", "[daos.profiles.renamed]");
    assert_ne!(s.b.tables, orig);
    s.b.write_config();
    s.b.spawn();
    let b = s.wait_held(id, 30);
    let reason = b["reason"].as_str().unwrap();
    assert!(
        reason.contains("cannot re-adopt") && reason.contains("'test'"),
        "{reason}"
    );
    // The hold is written first, then the job's processes end and it is
    // recorded lost.
    assert!(
        eventually(20, || s.b.state(id) == "lost"),
        "{}: {}",
        s.b.state(id),
        s.log(id)
    );
    // The job's processes were ended: released now, it does not go on.
    std::fs::write(w.join("go"), "").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!w.join("ran").exists(), "the job ran on after the hold");
    // Nothing of the lease was touched: every node still holds it, every
    // host's containers are as they were.
    for n in NODES {
        assert_eq!(s.node_lease(n)["lease"], lease.as_str(), "{n}");
    }
    let after: Vec<Vec<String>> = hosts.iter().map(|h| s.containers(h)).collect();
    assert_eq!(before, after);
    // The profile back: recover cleans it all up.
    assert!(s.b.terminate().success());
    s.b.tables = orig;
    s.b.write_config();
    s.b.spawn();
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}\n{}", stderr(&r), s.log(id));
    s.assert_clean();
}

/// Remove cxl2's directory of the active lease (`<run_dir>/<lease>/`).
fn lose_host_files(s: &Site) {
    let lease = s.active_lease().expect("an active lease")["lease"]
        .as_str()
        .expect("its name")
        .to_string();
    let dir = s.b.path("daos").join(&lease);
    assert!(dir.is_dir(), "no {}", dir.display());
    std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("remove {}: {e}", dir.display()));
}

#[test]
fn a_link_cut_during_the_wipe_holds_the_lease_until_recover() {
    require_cluster_env!();
    require_env!();
    let mut s = Site::up_with("dj-wipecut", Some(crash_broker()));
    let rw = s.b.workdir(None, "root");
    let resume = s.b.path("resume");
    // Restart the broker so that it stops just before the wipe.
    let _ = s.b.terminate();
    s.b.env = vec![
        ("GPUQ_PAUSE_AT".into(), "before_wipe".into()),
        ("GPUQ_PAUSE_FILE".into(), resume.display().to_string()),
    ];
    s.b.spawn();
    let id = s.b.submit(ROOT, &rw, &["--inst", "test", "--", "true"]);
    assert!(
        eventually(120, || s.log(id).contains("cleanup stop_servers")),
        "{}",
        s.log(id)
    );
    // The servers are stopped; now da2's link goes down, and the wipe runs.
    let ns = s.c.id.namespace("da2");
    let ip = |state: &str| {
        let out = std::process::Command::new("ip")
            .args(["-n", &ns, "link", "set", "eth0", state])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    };
    ip("down");
    std::fs::write(&resume, "").unwrap();
    let b = s.wait_held(id, 120);
    assert_eq!(
        (b["step"].as_str(), b["node"].as_str()),
        (Some("wipe"), Some("da2")),
        "{b}"
    );
    // The other three were wiped or not — either way the hold stays until
    // all four confirm.
    let next = s.b.submit(ROOT, &rw, &["--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(next), "queued");
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(
        !r.status.success(),
        "recover must fail while da2 is cut off"
    );
    ip("up");
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}\n{}", stderr(&r), s.log(id));
    s.expect_end(next, "completed", 60);
    s.assert_clean();
}

/// Short step deadlines (as in daos_jobs.rs's frozen-helper test).
const SHORT_DEADLINES: &str = "request_timeout_secs = 5\n\
     preflight_timeout_secs = 5\n\
     start_timeout_secs = 60\n\
     format_timeout_secs = 60\n\
     stop_timeout_secs = 8\n\
     wipe_timeout_secs = 8\n";

/// Restart `s`'s broker paused at `point` until `resume` exists.
fn paused_at(s: &mut Site, point: &str, resume: &std::path::Path) {
    if s.b.pid().is_some() {
        let _ = s.b.terminate();
    }
    let _ = std::fs::remove_file(resume);
    s.b.env = vec![
        ("GPUQ_PAUSE_AT".into(), point.into()),
        ("GPUQ_PAUSE_FILE".into(), resume.display().to_string()),
    ];
    s.b.spawn();
}

#[test]
fn a_frozen_podman_service_during_cleanup_holds_the_lease_naming_host_and_step_until_recover() {
    require_cluster_env!();
    require_env!();
    let mut s = Site::up_with_daos_keys("dj-frozenpm", Some(crash_broker()), SHORT_DEADLINES);
    let rw = s.b.workdir(None, "root");
    let resume = s.b.path("resume");

    // cxl2's own Podman (the broker's client, agent and admin containers)
    // hangs just before the cleanup's remove_clients: its first request
    // gets no answer within 5 s → held at remove_clients on this host.
    paused_at(&mut s, "before_remove_clients", &resume);
    let id = s.b.submit(ROOT, &rw, &["--inst", "test", "--", "true"]);
    assert!(
        eventually(120, || s.log(id).contains("cleanup kill_job")),
        "{}",
        s.log(id)
    );
    let frozen = Frozen::freeze(&s.c, "cxl2", "podman");
    std::fs::write(&resume, "").unwrap();
    let b = s.wait_held(id, 60);
    assert_eq!(
        (b["step"].as_str(), b["node"].as_str()),
        (Some("remove_clients"), Some("broker")),
        "{b}"
    );
    let reason = b["reason"].as_str().unwrap();
    let sock = s.c.podman_sock("cxl2").display().to_string();
    assert!(
        reason.contains(&format!("podman at {sock} did not answer")) && reason.contains("5s"),
        "{reason}"
    );
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(!r.status.success(), "recover with cxl2's Podman frozen");
    assert!(!stderr(&r).contains("being cleaned"), "{}", stderr(&r));
    frozen.thaw();
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}\n{}", stderr(&r), s.log(id));
    s.assert_clean();

    // da2's Podman hangs just before the servers are stopped: da2's helper
    // cannot stop its server, the broker gets no answer for da2 → held at
    // stop_servers on da2; SIGCONT → recover releases.
    paused_at(&mut s, "before_stop_servers", &resume);
    let id = s.b.submit(ROOT, &rw, &["--inst", "test", "--", "true"]);
    assert!(
        eventually(120, || s.log(id).contains("cleanup system_stop")),
        "{}",
        s.log(id)
    );
    let frozen = Frozen::freeze(&s.c, "da2", "podman");
    std::fs::write(&resume, "").unwrap();
    let b = s.wait_held(id, 60);
    assert_eq!(
        (b["step"].as_str(), b["node"].as_str()),
        (Some("stop_servers"), Some("da2")),
        "{b}"
    );
    let next = s.b.submit(ROOT, &rw, &["--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(next), "queued");
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(!r.status.success(), "recover with da2's Podman frozen");
    assert!(!stderr(&r).contains("being cleaned"), "{}", stderr(&r));
    frozen.thaw();
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}\n{}", stderr(&r), s.log(id));
    s.expect_end(next, "completed", 60);
    s.assert_clean();
}

/// `gpuq activate --execute` (#17): the broker dies (`abort`, as `kill -9`)
/// right after it wrote the `activating` hold and before any node was
/// asked. The restarted broker keeps the hold — a plain job stays queued,
/// `recover` refuses and points at the activation — no node was claimed,
/// and running the activation again resumes it under its first name,
/// claims all four and releases the hold; the queued job then runs.
#[test]
fn a_broker_that_dies_after_writing_the_activation_hold_keeps_it_until_the_activation_is_run_again()
{
    require_cluster_env!();
    require_env!();
    let mut s = Site::up_with("dj-actcrash", Some(crash_broker()));
    let rw = s.b.workdir(None, "root");
    let claim = |n: &str| s.c.dir().join(n).join("jobs/claim.json");
    let _ = s.b.terminate();
    s.b.env = vec![("GPUQ_CRASH_AT".into(), "activation_held".to_string())];
    s.b.spawn();
    let r =
        s.b.gpuq(ROOT, &["activate", "--execute", "--destroy-existing-data"]);
    assert!(!r.status.success(), "{}", stdout(&r));
    let died = eventually(30, || s.b.pid().is_none_or(|p| !alive(p as i32)));
    assert!(died, "the broker did not abort:\n{}", s.b.broker_log());
    s.b.kill9();
    let b: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.state().join("blocked.json")).unwrap()).unwrap();
    assert_eq!(b["kind"], "activating", "{b}");
    let name = b["lease"].as_str().unwrap().to_string();
    for n in NODES {
        assert!(!claim(n).exists(), "{n} claimed before any node was asked");
    }
    // Restarted: the hold stays, every job waits, recover refuses.
    s.b.env.clear();
    s.b.spawn();
    let next = s.b.submit(ROOT, &rw, &["--", "true"]);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.b.state(next), "queued");
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(
        !r.status.success() && stderr(&r).contains("gpuq activate --execute"),
        "{}",
        stderr(&r)
    );
    // Run again: the same activation, finished.
    let r = s.b.gpuq(
        ROOT,
        &["activate", "--execute", "--destroy-existing-data", "--json"],
    );
    assert!(r.status.success(), "{}{}", stdout(&r), stderr(&r));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["activation"], name.as_str(), "{v}");
    for n in NODES {
        assert!(claim(n).exists(), "{n} not claimed: {v}");
    }
    assert!(!s.state().join("blocked.json").exists());
    s.expect_end(next, "completed", 60);
}
