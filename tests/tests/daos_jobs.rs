//! DAOS jobs end to end on the test cluster: a real broker (in cxl2's
//! network namespace) reaching four real node helpers over real SSH
//! forwards, real Podman on all five hosts, and the DAOS simulator
//! (crates/daos-sim) in place of DAOS.

use gpuq_system_tests::cluster::*;
use gpuq_system_tests::daos_site::*;
use gpuq_system_tests::*;
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn a_daos_job_gets_four_joined_ranks_and_everything_is_cleaned_before_the_next_job() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-happy");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let script = format!(
        "echo SYSTEM=$DAOS_SYSTEM; echo PROFILE_VAR=$GPUQ_TEST_PROFILE_VAR; \
         echo POOL=${{DAOS_POOL:-unset}}; echo AGENT=$DAOS_AGENT_DRPC_DIR; \
         test -S \"$DAOS_AGENT_DRPC_DIR/daos_agent.sock\" && echo AGENT_SOCKET=yes; \
         {} dmg -o \"$DAOS_CONTROL_CONFIG\" -j system query > query.json",
        dmg_on_host()
    );
    let out = s.b.gpuq_in(
        Some(&a),
        &w,
        &[("DAOS_POOL", "old-pool"), ("DAOS_CONTAINER", "old-cont")],
        &["submit", "--inst", "test", "--", "bash", "-c", &script],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id: u64 = stdout(&out).trim().parse().unwrap();
    // A plain GPU job queued behind it: it must not start before the
    // lease is released (it looks for active.json at its start).
    let rw = s.b.workdir(None, "root");
    let state = s.state().display().to_string();
    let next = s.b.submit(
        ROOT,
        &rw,
        &[
            "--",
            "bash",
            "-c",
            &format!("test -e {state}/active.json && echo DIRTY || echo CLEAN"),
        ],
    );
    let j = s.b.wait_state(id, "completed", 120);
    assert_eq!(j["exit_code"], 0);
    s.b.wait_state(next, "completed", 120);
    assert!(
        s.log(next).contains("CLEAN"),
        "the next job started before the release: {}",
        s.log(next)
    );
    let log = s.log(id);
    eprintln!("--- job log ---\n{log}");
    for want in [
        "SYSTEM=daos_server",
        "PROFILE_VAR=from-profile",
        "POOL=unset",
        "AGENT_SOCKET=yes",
        "preflight passed on 4 nodes",
        "servers started on 4 nodes",
        "format: formatted",
        "join: 4 ranks joined",
        "cleanup kill_job",
        "cleanup remove_clients",
        "cleanup stop_agent",
        "cleanup system_stop",
        "cleanup stop_servers",
        "cleanup wipe",
        "released",
    ] {
        assert!(log.contains(want), "log lacks {want:?}:\n{log}");
    }
    let q: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.join("query.json")).unwrap()).unwrap();
    let members = q["response"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 4, "{q}");
    assert!(members.iter().all(|m| m["state"] == "joined"), "{q}");
    s.assert_clean();
    // The lease record: every step confirmed, with the audits on all four.
    let lease = log
        .lines()
        .find_map(|l| {
            l.split("lease ")
                .nth(1)
                .and_then(|r| r.split([' ', ';']).next())
        })
        .unwrap()
        .to_string();
    let rec = s.lease_record(&lease);
    assert_eq!(rec["phase"], "released", "{rec}");
    assert_eq!(rec["done"].as_array().unwrap().len(), 6, "{rec}");
    for n in NODES {
        let audit = std::fs::read_to_string(
            s.c.dir()
                .join(n)
                .join("jobs")
                .join(&lease)
                .join("audit.jsonl"),
        )
        .unwrap_or_else(|e| panic!("{n}: no audit: {e}"));
        assert!(
            audit.contains("\"wipe\"") && audit.contains("\"ok\""),
            "{n}: {audit}"
        );
    }
}

#[test]
fn a_cleanup_failure_holds_every_job_until_recover_succeeds() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-hold");
    let rw = s.b.workdir(None, "root");
    // The job itself makes da3's helper unreachable before the cleanup.
    let sock = s.c.node_sock("da3");
    let off = sock.with_extension("off");
    let id = s.b.submit(
        ROOT,
        &rw,
        &[
            "--inst",
            "test",
            "--",
            "mv",
            &sock.display().to_string(),
            &off.display().to_string(),
        ],
    );
    s.b.wait_state(id, "completed", 120);
    assert!(
        eventually(60, || s.state().join("blocked.json").exists()),
        "no hold: {}",
        s.log(id)
    );
    let blocked: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.state().join("blocked.json")).unwrap()).unwrap();
    assert_eq!(blocked["step"], "stop_servers", "{blocked}");
    assert_eq!(blocked["node"], "da3", "{blocked}");
    // Every job waits: a plain GPU job too.
    let queued = s.b.submit(ROOT, &rw, &["--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(queued), "queued");
    let list = stdout(&s.b.gpuq(ROOT, &["list"]));
    assert!(
        list.contains("HOLD") && list.contains("gpuq recover"),
        "{list}"
    );
    let ds = s.b.gpuq(ROOT, &["daos-status"]);
    assert!(!ds.status.success());
    let ds = stdout(&ds);
    assert!(
        ds.contains("HELD") && ds.contains("da3") && ds.contains("gpuq recover"),
        "{ds}"
    );
    // unlock never clears a hold.
    let _ = s.b.gpuq(ROOT, &["unlock"]);
    assert!(s.state().join("blocked.json").exists());
    // A user may not recover.
    let r = s.b.gpuq(Some(&alice()), &["recover"]);
    assert!(!r.status.success());
    assert!(stderr(&r).contains("root"), "{}", stderr(&r));
    // Recover while da3 is still unreachable: still held, nothing runs.
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(!r.status.success(), "{}", stderr(&r));
    assert!(s.state().join("blocked.json").exists());
    assert_eq!(s.b.state(queued), "queued");
    // The fault removed, recover resumes at the server stop and releases.
    std::fs::rename(&off, &sock).unwrap();
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}", stderr(&r));
    s.b.wait_state(queued, "completed", 60);
    s.assert_clean();
}

#[test]
fn a_refused_preflight_touches_nothing_and_releases_the_lease() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-refuse");
    // A container of another lease on da2 (what preflight must refuse).
    let out = s.c.run_ok(
        "podman",
        &[
            "da2",
            "create",
            "--name",
            "foreign",
            "--label",
            "io.gpuq.lease=someone-else",
            &s.image,
            "sleep",
            "1",
        ],
    );
    let _ = out;
    let rw = s.b.workdir(None, "root");
    let id =
        s.b.submit(ROOT, &rw, &["--inst", "test", "--", "touch", "ran"]);
    let j = s.b.wait_state(id, "failed", 120);
    assert!(!rw.join("ran").exists(), "the job must not run");
    let log = s.log(id);
    assert!(
        log.contains("preflight refused") && log.contains("da2"),
        "{log}"
    );
    assert!(j["reason"].as_str().unwrap_or("").contains("da2"), "{j}");
    // Nothing was started anywhere; the foreign container is untouched.
    assert_eq!(s.containers("da2"), vec!["foreign \"created\"".to_string()]);
    for h in ["cxl2", "da1", "da3", "da4"] {
        assert_eq!(s.containers(h), Vec::<String>::new(), "{h}");
    }
    assert!(s.active_lease().is_none());
    assert!(!s.state().join("blocked.json").exists());
    // The queue moves on.
    let next = s.b.submit(ROOT, &rw, &["--", "true"]);
    s.b.wait_state(next, "completed", 30);
}

#[test]
fn a_rank_that_never_joins_fails_the_job_and_cleanup_releases() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-join");
    s.set_fault("da4", "never_join");
    let rw = s.b.workdir(None, "root");
    let id =
        s.b.submit(ROOT, &rw, &["--inst", "test", "--", "touch", "ran"]);
    let j = s.b.wait_state(id, "failed", 120);
    assert!(!rw.join("ran").exists());
    assert!(
        j["reason"]
            .as_str()
            .unwrap_or("")
            .contains("3 of 4 ranks joined"),
        "{j}"
    );
    assert!(
        eventually(60, || s.active_lease().is_none()),
        "{}",
        s.log(id)
    );
    s.assert_clean();
}

#[test]
fn the_second_users_job_sees_nothing_of_the_firsts_system() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-two");
    let (a, b) = (alice(), bob());
    let wa = s.b.workdir(Some(&a), "alice");
    let wb = s.b.workdir(Some(&b), "bob");
    // Each job creates a pool with the same label: with metadata left from
    // the first job, the second's create would fail with DER_EXIST.
    let job = |who: &str| {
        format!(
            "d={dmg}; $d dmg -o \"$DAOS_CONTROL_CONFIG\" -j system query > query.json; \
             $d dmg -o \"$DAOS_CONTROL_CONFIG\" -j pool create shared --size=1G > pool.json; \
             $d daos -j container create shared c-{who} --type=POSIX > cont.json; \
             echo secret-of-{who} > mine",
            dmg = dmg_on_host()
        )
    };
    let ja = s.b.gpuq_in(
        Some(&a),
        &wa,
        &[],
        &[
            "submit",
            "--inst",
            "test",
            "--",
            "bash",
            "-c",
            &job("alice"),
        ],
    );
    assert!(ja.status.success(), "{}", stderr(&ja));
    let jb = s.b.gpuq_in(
        Some(&b),
        &wb,
        &[],
        &[
            "submit",
            "--inst",
            "test",
            "--",
            "bash",
            "-c",
            &format!("ls {} > peek 2>&1 || true; {}", wa.display(), job("bob")),
        ],
    );
    assert!(jb.status.success(), "{}", stderr(&jb));
    let (ia, ib): (u64, u64) = (
        stdout(&ja).trim().parse().unwrap(),
        stdout(&jb).trim().parse().unwrap(),
    );
    s.expect_end(ia, "completed", 120);
    s.expect_end(ib, "completed", 120);
    let read_json = |p: PathBuf| -> serde_json::Value {
        let b = std::fs::read(&p).unwrap();
        serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("{}: {e}: {}", p.display(), String::from_utf8_lossy(&b)))
    };
    for w in [&wa, &wb] {
        let c = read_json(w.join("cont.json"));
        assert_eq!(c["status"], 0, "container create: {c}");
    }
    let (pa, pb) = (
        read_json(wa.join("pool.json")),
        read_json(wb.join("pool.json")),
    );
    assert_eq!(pa["status"], 0, "{pa}");
    assert_eq!(
        pb["status"], 0,
        "bob's pool create found alice's pool: {pb}"
    );
    assert_ne!(pa["response"]["uuid"], pb["response"]["uuid"]);
    let uuids = |q: serde_json::Value| -> Vec<String> {
        q["response"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["uuid"].as_str().unwrap().to_string())
            .collect()
    };
    let (ua, ub) = (
        uuids(read_json(wa.join("query.json"))),
        uuids(read_json(wb.join("query.json"))),
    );
    assert_eq!((ua.len(), ub.len()), (4, 4));
    assert!(
        ua.iter().all(|u| !ub.contains(u)),
        "bob's ranks reuse alice's: {ua:?} {ub:?}"
    );
    assert!(
        std::fs::read_to_string(wb.join("peek"))
            .unwrap()
            .contains("Permission denied"),
        "bob could list alice's directory"
    );
    s.assert_clean();
}
