//! DAOS jobs end to end on the test cluster: a real broker (in cxl2's
//! network namespace) reaching four real node helpers over real SSH
//! forwards, real Podman on all five hosts, and the DAOS simulator
//! (crates/daos-sim) in place of DAOS.

use gpuq_system_tests::cluster::*;
use gpuq_system_tests::daos_site::*;
use gpuq_system_tests::*;
use std::path::PathBuf;
use std::time::Duration;

/// `--stor`: each node reports what its running kernel offers kernel
/// storage jobs (from its module index; the test cluster's nodes share this
/// machine's kernel, which has no Lustre server — no Debian kernel has);
/// a `--stor lustre` submit is refused in one line naming every node and
/// what its kernel lacks, and nothing is stored: no job, no lease, no
/// container, no job log directory.
#[test]
fn stor_is_refused_in_one_line_naming_what_each_node_s_kernel_lacks_and_nothing_is_stored() {
    require_cluster_env!();
    require_env!();
    // A --stor nfsrdma profile too (below: this host's own rule).
    let s = Site::up_full("dj-stor", None, |d| {
        format!(
            "\n[daos.stor.nfs]\nkind = \"nfsrdma\"\nclient_address = \"{}\"\nmount_dir = \"{}\"\n",
            addr("cxl2"),
            d.join("stor").display()
        )
    });
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = release.trim();
    let mut st = s.b.gpuq(Some(&a), &["daos-status", "--json"]);
    let up = eventually(30, || {
        st = s.b.gpuq(Some(&a), &["daos-status", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&st)).unwrap_or_default();
        v["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 4 && n.iter().all(|n| n["link"] == "up"))
    });
    assert!(up, "{}{}", stdout(&st), stderr(&st));
    let st: serde_json::Value = serde_json::from_str(&stdout(&st)).unwrap();
    for n in st["nodes"].as_array().unwrap() {
        let k = &n["status"]["kernel"];
        assert_eq!(k["release"], release, "{n}");
        assert_eq!(k["lustre_server"]["available"], false, "{n}");
        let why = k["lustre_server"]["missing"].as_str().unwrap();
        assert!(
            why.starts_with(&format!(
                "kernel {release} has no lnet, ptlrpc, mgs, mdt, ofd"
            )),
            "{why}"
        );
        for kind in ["nvmeof_target", "nfs_server"] {
            assert!(k[kind]["available"].is_boolean(), "{n}");
        }
    }
    // For people: a line per node under its pins.
    let human = stdout(&s.b.gpuq(Some(&a), &["daos-status"]));
    let want = format!("      kernel {release}: --stor nvmeof ");
    assert_eq!(human.matches(&want).count(), 4, "{human}");
    assert_eq!(human.matches(", lustre no\n").count(), 4, "{human}");
    let logs = s.b.path("logs");
    let logs_before: Vec<_> = std::fs::read_dir(&logs)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let out = s.b.gpuq_in(
        Some(&a),
        &w,
        &[],
        &["submit", "--stor", "lustre", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "--stor lustre: not every storage node can serve it (da1, da2, da3, da4: kernel {release} has no lnet"
        )),
        "{err}"
    );
    assert!(err.contains("use --inst"), "{err}");
    // nvmeof, nfsrdma: refused too, one line each, saying what the nodes
    // reported (the four share this kernel): what is missing, or — where
    // the kernel has it — that the stand-up is not enabled yet.
    let node0 = &st["nodes"][0]["status"]["kernel"];
    for (kind, field) in [("nvmeof", "nvmeof_target"), ("nfsrdma", "nfs_server")] {
        let out =
            s.b.gpuq_in(Some(&a), &w, &[], &["submit", "--stor", kind, "--", "true"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        let want = match node0[field]["missing"].as_str() {
            Some(missing) => format!(
                "--stor {kind}: not every storage node can serve it (da1, da2, da3, da4: {missing})"
            ),
            None => format!("--stor {kind}) are not enabled on this broker yet"),
        };
        assert!(err.contains(&want), "{want:?} not in {err}");
    }
    // Nothing stored.
    assert_eq!(s.b.job_count(), 0);
    let logs_after: Vec<_> = std::fs::read_dir(&logs)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert_eq!(logs_before, logs_after);
    // --stor nfsrdma where any user of this host could send from a port
    // below 1024 (net.ipv4.ip_unprivileged_port_start in cxl2's network
    // namespace, the broker's): the nodes' exports could not tell their
    // owner's mounts from anyone's, so it is refused first — whatever
    // the nodes' kernels offer — in one line naming the setting, and
    // nothing is stored.
    let ns = format!("/run/netns/{}", s.c.id.namespace("cxl2"));
    let set = |v: u32| {
        let st = std::process::Command::new("nsenter")
            .arg(format!("--net={ns}"))
            .args(["sh", "-c"])
            .arg(format!(
                "echo {v} >/proc/sys/net/ipv4/ip_unprivileged_port_start"
            ))
            .status()
            .unwrap();
        assert!(st.success(), "set ip_unprivileged_port_start in {ns}");
    };
    set(0);
    let out = s.b.gpuq_in(
        Some(&a),
        &w,
        &[],
        &["submit", "--stor", "nfs", "--", "true"],
    );
    set(1024);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains(
            "--stor nfs: this host lets every user send from port 0 up (net.ipv4.ip_unprivileged_port_start = 0)"
        ),
        "{err}"
    );
    assert!(err.contains("set it to 1024"), "{err}");
    assert_eq!(s.b.job_count(), 0);
    assert!(!s.b.path("stor").exists(), "a mount directory was made");
    s.assert_clean();
}

#[test]
fn a_daos_job_gets_four_joined_ranks_and_everything_is_cleaned_before_the_next_job() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-happy");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    // What anyone may see before: four links up, helpers answering, the pin
    // present on every node, no lease.
    // (The links come up in the background after the broker starts.)
    let mut st = s.b.gpuq(Some(&a), &["daos-status", "--json"]);
    let up = eventually(30, || {
        st = s.b.gpuq(Some(&a), &["daos-status", "--json"]);
        st.status.success()
    });
    assert!(up, "{}{}", stdout(&st), stderr(&st));
    let st: serde_json::Value = serde_json::from_str(&stdout(&st)).unwrap();
    let nodes = st["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4, "{st}");
    for n in nodes {
        assert_eq!(n["link"], "up", "{st}");
        assert!(n["status"]["helper_version"].is_string(), "{st}");
        let pins = n["status"]["pins"].as_array().unwrap();
        assert!(
            pins.iter()
                .any(|p| p["image"] == s.image.as_str() && p["present"] == true),
            "{st}"
        );
    }
    assert!(st["lease"].is_null() && st["hold"].is_null(), "{st}");
    let script = format!(
        "while [ ! -e go ]; do sleep 0.2; done; \
         echo SYSTEM=$DAOS_SYSTEM; echo PROFILE_VAR=$GPUQ_TEST_PROFILE_VAR; \
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
    // While the job runs: cxl2 holds the agent and no other container of
    // the lease (`dmg` runs in da1's server container), and only da1 has
    // the lease's dmg access, root's alone.
    s.b.wait_state(id, "running", 60);
    assert!(
        eventually(60, || s.log(id).contains("starting the job")),
        "{}",
        s.log(id)
    );
    let lease = s.active_lease().expect("the job's lease")["lease"]
        .as_str()
        .unwrap()
        .to_string();
    let on_cxl2: Vec<String> =
        s.c.containers("cxl2")
            .into_iter()
            .filter(|(name, _)| name.contains(&lease))
            .map(|(name, state)| format!("{name} {}", state.trim_matches('"')))
            .collect();
    assert_eq!(
        on_cxl2,
        vec![format!("gpuq-{lease}-agent running")],
        "one container of the lease on cxl2"
    );
    // The agent (#31 item 2), as Podman was asked and as the kernel runs
    // it: the job's owner with the overflow group and no other, no
    // capability, no_new_privs, not privileged; in the host's PID
    // namespace (it watches its clients' PIDs), where uid 0 could signal
    // every root process.
    let (code, agent) = s.c.api_json(
        "cxl2",
        "GET",
        &format!("/v4.0.0/libpod/containers/gpuq-{lease}-agent/json"),
        None,
    );
    assert_eq!(code, 200, "{agent}");
    assert_eq!(
        agent["Config"]["User"],
        format!("{}:65534", a.uid),
        "{agent}"
    );
    assert_eq!(agent["HostConfig"]["PidMode"], "host", "{agent}");
    assert_eq!(agent["HostConfig"]["Privileged"], false, "{agent}");
    let pid = agent["State"]["Pid"].as_i64().expect("the agent's PID");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    let u = a.uid.to_string();
    assert_eq!(field("Uid:"), [u.as_str(); 4].join(" "), "{status}");
    assert_eq!(field("Gid:"), ["65534"; 4].join(" "), "{status}");
    // Podman lists the primary group as the one supplementary group.
    assert_eq!(field("Groups:"), "65534", "{status}");
    assert_eq!(field("CapEff:"), "0000000000000000", "{status}");
    assert_eq!(field("CapPrm:"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    // A test-mode server (the simulator): its own PID namespace, not
    // privileged (physical mode's server privileges: docs/security.md).
    let (code, server) = s.c.api_json(
        "da1",
        "GET",
        &format!("/v4.0.0/libpod/containers/gpuq-{lease}-server/json"),
        None,
    );
    assert_eq!(code, 200, "{server}");
    assert_ne!(server["HostConfig"]["PidMode"], "host", "{server}");
    assert_eq!(server["HostConfig"]["Privileged"], false, "{server}");
    let admin_dir = |n: &str| s.c.dir().join(n).join("jobs").join(&lease).join("admin");
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(admin_dir("da1")).expect("da1's dmg access");
    assert!(
        m.is_dir() && m.mode() & 0o7777 == 0o700 && m.uid() == 0,
        "{m:?}"
    );
    let key = std::fs::metadata(admin_dir("da1").join("admin.key")).unwrap();
    assert_eq!(key.mode() & 0o7777, 0o400);
    for n in ["da2", "da3", "da4"] {
        assert!(!admin_dir(n).exists(), "{n} has dmg access");
    }
    std::fs::write(w.join("go"), "").unwrap();
    let j = s.b.wait_state(id, "completed", 120);
    assert_eq!(j["exit_code"], 0);
    s.b.wait_state(next, "completed", 120);
    assert!(
        !admin_dir("da1").exists(),
        "the wipe removes da1's dmg access"
    );
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
    let blocked = s.wait_held(id, 60);
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
    // Deleting blocked.json by hand is no way out: the lease record still
    // holds every job.
    std::fs::remove_file(s.state().join("blocked.json")).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(queued), "queued");
    // Nor is a lease pointer that cannot be read: the gate fails closed.
    let active = s.state().join("active.json");
    let pointer = std::fs::read(&active).unwrap();
    std::fs::write(&active, "{garbage").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(queued), "queued");
    let list = stdout(&s.b.gpuq(ROOT, &["list"]));
    assert!(list.contains("active.json"), "{list}");
    std::fs::write(&active, &pointer).unwrap();
    // A user may not recover.
    let r = s.b.gpuq(Some(&alice()), &["recover"]);
    assert!(!r.status.success());
    assert!(stderr(&r).contains("root"), "{}", stderr(&r));
    // Recover while da3 is still unreachable: still held, nothing runs.
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(!r.status.success(), "{}", stderr(&r));
    assert!(s.state().join("blocked.json").exists());
    assert_eq!(s.b.state(queued), "queued");
    // The fault removed, recover resumes at the server stop and releases
    // (through the original system's entry point, as an operator would).
    std::fs::rename(&off, &sock).unwrap();
    let r = std::process::Command::new(
        gpuq_system_tests::cluster::harness_dir().join("../libexec/gpuqueue-daos"),
    )
    .arg("recover")
    .env("GPUQ_BIN", bin("gpuq"))
    .env("GPUQ_SOCKET", &s.b.socket)
    .output()
    .unwrap();
    assert!(r.status.success(), "{}", stderr(&r));
    s.b.wait_state(queued, "completed", 60);
    s.assert_clean();
}

#[test]
fn a_refused_preflight_touches_nothing_and_releases_the_lease() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-refuse");
    // Bad input first: an unknown profile, and recover with nothing held.
    let out =
        s.b.gpuq(ROOT, &["submit", "--inst", "nosuch", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a DAOS profile here; configured: test"),
        "{}",
        stderr(&out)
    );
    assert_eq!(s.b.job_count(), 0);
    let out = s.b.gpuq(ROOT, &["recover"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("nothing to recover"),
        "{}",
        stderr(&out)
    );
    assert!(s.active_lease().is_none());
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
             $d dmg -o \"$DAOS_CONTROL_CONFIG\" -j pool create shared --size=5G > pool.json; \
             $d daos -j container create shared c-{who} --type=POSIX > cont.json; \
             echo secret-of-{who} > mine",
            dmg = dmg_on_host()
        )
    };
    let ia = s.b.submit(
        Some(&a),
        &wa,
        &["--inst", "test", "--", "bash", "-c", &job("alice")],
    );
    let ib = s.b.submit(
        Some(&b),
        &wb,
        &[
            "--inst",
            "test",
            "--",
            "bash",
            "-c",
            &format!("ls {} > peek 2>&1 || true; {}", wa.display(), job("bob")),
        ],
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

/// The lease of job `id`, from its log.
fn lease_of(s: &Site, id: u64) -> Option<String> {
    s.log(id)
        .lines()
        .find_map(|l| l.split(", lease ").nth(1).and_then(|r| r.split(';').next()))
        .map(str::to_string)
}

fn wait_log(s: &Site, id: u64, needle: &str) {
    assert!(
        eventually(60, || s.log(id).contains(needle)),
        "job {id}: no {needle:?} in its log:\n{}",
        s.log(id)
    );
}

#[test]
fn every_exit_path_ends_in_a_released_lease() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-exits");
    let rw = s.b.workdir(None, "root");
    let submit = |args: &[&str]| {
        let mut a = vec!["--inst", "test"];
        a.extend_from_slice(args);
        s.b.submit(ROOT, &rw, &a)
    };

    // The job fails.
    let id = submit(&["--", "bash", "-c", "exit 3"]);
    let j = s.expect_end(id, "failed", 120);
    assert_eq!(j["exit_code"], 3);
    s.assert_clean();

    // Timeout during the job (the limit covers the preparation too, about
    // 4 s here idle but over 6 s on a loaded machine: leave it room).
    let id = submit(&["--time", "00:00:20", "--", "sleep", "60"]);
    let j = s.expect_end(id, "timeout", 120);
    assert!(
        j["reason"].as_str().unwrap().contains("during the job"),
        "{j}"
    );
    s.assert_clean();

    // Timeout during preparation (a rank never joins; the limit is shorter
    // than the join timeout).
    s.set_fault("da4", "never_join");
    let id = submit(&["--time", "00:00:04", "--", "touch", "ran-1"]);
    let j = s.expect_end(id, "timeout", 120);
    assert!(
        j["reason"].as_str().unwrap().contains("during preparation"),
        "{j}"
    );
    assert!(!rw.join("ran-1").exists());
    s.assert_clean();

    // Cancel while preparing (same fault).
    let id = submit(&["--", "touch", "ran-2"]);
    wait_log(&s, id, "servers started on 4 nodes");
    let c = s.b.gpuq(ROOT, &["cancel", &id.to_string()]);
    assert!(c.status.success(), "{}", stderr(&c));
    let j = s.expect_end(id, "cancelled", 60);
    assert!(
        j["reason"].as_str().unwrap().contains("during preparation"),
        "{j}"
    );
    assert!(!rw.join("ran-2").exists());
    s.assert_clean();
    s.set_fault("da4", "");

    // Cancel while queued (behind a running GPU job): no lease at all.
    let blocker = s.b.submit(ROOT, &rw, &["--", "sleep", "3"]);
    s.b.wait_state(blocker, "running", 30);
    let id = submit(&["--", "touch", "ran-3"]);
    let c = s.b.gpuq(ROOT, &["cancel", &id.to_string()]);
    assert!(c.status.success(), "{}", stderr(&c));
    s.expect_end(id, "cancelled", 30);
    s.expect_end(blocker, "completed", 30);
    assert!(lease_of(&s, id).is_none(), "{}", s.log(id));
    assert!(!rw.join("ran-3").exists());
    s.assert_clean();

    // Cancel while running.
    let id = submit(&["--", "bash", "-c", "touch running-4; sleep 60"]);
    assert!(eventually(60, || rw.join("running-4").exists()));
    let c = s.b.gpuq(ROOT, &["cancel", &id.to_string()]);
    assert!(c.status.success(), "{}", stderr(&c));
    let j = s.expect_end(id, "cancelled", 60);
    assert!(
        j["reason"].as_str().unwrap().contains("while running"),
        "{j}"
    );
    s.assert_clean();

    // Cancel while cleaning: the job has ended; the cleanup goes on and the
    // next job still waits for it (a slow engine stop on da2).
    s.set_fault("da2", "slow_stop=3");
    let id = submit(&["--", "true"]);
    let next = s.b.submit(ROOT, &rw, &["--", "true"]);
    wait_log(&s, id, "cleanup stop_agent");
    let c = s.b.gpuq(ROOT, &["cancel", &id.to_string()]);
    assert!(!c.status.success());
    assert!(stderr(&c).contains("nothing to cancel"), "{}", stderr(&c));
    assert_eq!(
        s.b.state(next),
        "queued",
        "the next job started during the cleanup"
    );
    s.expect_end(next, "completed", 60);
    assert!(s.log(id).contains("released"), "{}", s.log(id));
    s.set_fault("da2", "");
    s.assert_clean();

    // The user's `gpuq follow` killed: the job and its cleanup go on.
    let id = submit(&["--", "bash", "-c", "sleep 2; echo followed-to-the-end"]);
    let mut follow = std::process::Command::new(bin("gpuq"))
        .args(["follow", &id.to_string()])
        .env("GPUQ_SOCKET", &s.b.socket)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_log(&s, id, "DAOS system ready");
    follow.kill().unwrap();
    follow.wait().unwrap();
    s.expect_end(id, "completed", 60);
    assert!(s.log(id).contains("followed-to-the-end"));
    s.assert_clean();
}

#[test]
fn node_faults_end_released_or_held_and_recover_finishes() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-faults");
    let rw = s.b.workdir(None, "root");
    let submit = |args: &[&str]| {
        let mut a = vec!["--inst", "test"];
        a.extend_from_slice(args);
        s.b.submit(ROOT, &rw, &a)
    };

    // A format host error on one node: the job fails before it runs.
    s.set_fault("da2", "format_error");
    let id = submit(&["--", "touch", "ran-1"]);
    let j = s.expect_end(id, "failed", 120);
    assert!(j["reason"].as_str().unwrap().contains("format"), "{j}");
    assert!(!rw.join("ran-1").exists());
    s.set_fault("da2", "");
    s.assert_clean();

    // A server that ignores SIGTERM: the stop escalates to SIGKILL and is
    // confirmed; released.
    s.set_fault("da1", "ignore_sigterm");
    let id = submit(&["--", "true"]);
    s.expect_end(id, "completed", 120);
    s.assert_clean();
    s.set_fault("da1", "");

    // da3's link cut (its veth down) while the job runs: the cleanup cannot
    // reach da3 → held; link back → recover releases.
    let (ns, veth) = (s.c.id.namespace("da3"), "eth0");
    let down = format!("ip -n {ns} link set {veth} down");
    let id = submit(&["--", "bash", "-c", &down]);
    s.expect_end(id, "completed", 120);
    let b = s.wait_held(id, 120);
    assert_eq!(b["node"], "da3", "{b}");
    let queued = s.b.submit(ROOT, &rw, &["--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(queued), "queued");
    let out = std::process::Command::new("ip")
        .args(["-n", &ns, "link", "set", veth, "up"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}\n{}", stderr(&r), s.log(id));
    s.expect_end(queued, "completed", 60);
    s.assert_clean();

    // da4's sshd (listener and sessions) stopped before the cleanup: held;
    // sshd back → recover releases.
    let cfg = s.c.dir().join("da4/etc/sshd_config").display().to_string();
    let id = submit(&["--", "sleep", "30"]);
    wait_log(&s, id, "DAOS system ready");
    let listeners: Vec<i32> = gpuq_system_tests::cluster::pids_mentioning(&cfg)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    let sshds = with_descendants(&listeners);
    assert!(!sshds.is_empty());
    for p in &sshds {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let c = s.b.gpuq(ROOT, &["cancel", &id.to_string()]);
    assert!(c.status.success(), "{}", stderr(&c));
    s.wait_held(id, 120);
    // Start da4's sshd again (ours now: ended by PID at the end).
    let mut sshd = std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", s.c.id.namespace("da4")))
        .args(["/usr/sbin/sshd", "-D", "-f", &cfg])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let r = s.b.gpuq(ROOT, &["recover"]);
    let ok = r.status.success();
    let msg = format!("{}\n{}", stderr(&r), s.log(id));
    s.assert_clean();
    let _ = sshd.kill();
    let _ = sshd.wait();
    assert!(ok, "{msg}");
}

/// `pids` and every process below them (from /proc/*/stat's PPID).
fn with_descendants(pids: &[i32]) -> Vec<i32> {
    let parent = |pid: i32| -> Option<i32> {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        st.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let all: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut out = pids.to_vec();
    loop {
        let more: Vec<i32> = all
            .iter()
            .copied()
            .filter(|p| !out.contains(p) && parent(*p).is_some_and(|pp| out.contains(&pp)))
            .collect();
        if more.is_empty() {
            return out;
        }
        out.extend(more);
    }
}

#[test]
fn verify_pins_finds_a_missing_pin_and_a_container_on_another_image() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-pins");
    // `gpuq activate` (its plan, #17 item 1) asks every node over its link
    // and changes nothing; root only. The test cluster's nodes allowlist no
    // device (test mode), so each says there is nothing to activate.
    let plan = s.b.gpuq(ROOT, &["activate", "--json"]);
    assert!(plan.status.success(), "{}{}", stdout(&plan), stderr(&plan));
    let v: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4, "{v}");
    for (n, name) in nodes.iter().zip(["da1", "da2", "da3", "da4"]) {
        assert_eq!(n["node"], name, "{v}");
        assert_eq!(n["plan"]["node"], name, "{v}");
        let steps = n["plan"]["steps"].to_string();
        assert!(steps.contains("no device is allowlisted"), "{steps}");
    }
    assert!(v["not_idle"].is_null(), "{v}");
    let human = stdout(&s.b.gpuq(ROOT, &["activate"]));
    assert!(
        human.starts_with("Activation plan (nothing has been changed):")
            && human.contains("\nda4:"),
        "{human}"
    );
    let r = s.b.gpuq(Some(&alice()), &["activate"]);
    assert!(!r.status.success());
    assert!(stderr(&r).contains("only root may plan"), "{}", stderr(&r));
    assert!(
        !s.state().join("active.json").exists() && !s.state().join("blocked.json").exists(),
        "a plan made no lease and no hold"
    );
    let pins = |user: Option<&User>| s.b.gpuq(user, &["verify-pins"]);
    let ok = pins(ROOT);
    assert!(ok.status.success(), "{}{}", stdout(&ok), stderr(&ok));
    assert!(stdout(&ok).contains("all pins verified"), "{}", stdout(&ok));
    assert_eq!(stdout(&ok).matches("present").count(), 5, "{}", stdout(&ok));
    // Root only.
    let r = pins(Some(&alice()));
    assert!(!r.status.success());
    assert!(stderr(&r).contains("root"), "{}", stderr(&r));
    // A container of ours on an image no profile pins (a commit of the
    // pinned one has another ID), on da3.
    s.c.run_ok(
        "podman",
        &["da3", "create", "--name", "base", &s.image, "true"],
    );
    s.c.run_ok("podman", &["da3", "commit", "base", "localhost/other:1"]);
    s.c.run_ok(
        "podman",
        &[
            "da3",
            "create",
            "--name",
            "stray",
            "--label",
            "io.gpuq.lease=stray",
            "localhost/other:1",
            "true",
        ],
    );
    // The pinned image gone from da2.
    s.c.run_ok("podman", &["da2", "rmi", &s.image]);
    let bad = pins(ROOT);
    assert!(!bad.status.success());
    let out = stdout(&bad);
    assert!(
        out.contains("da2: profile test") && out.contains("MISSING"),
        "{out}"
    );
    assert!(out.contains("da3: container stray"), "{out}");
    assert!(out.contains("PIN MISMATCH"), "{out}");
    // And a DAOS job is refused by da2's preflight, touching nothing.
    let rw = s.b.workdir(None, "root");
    let id =
        s.b.submit(ROOT, &rw, &["--inst", "test", "--", "touch", "ran"]);
    s.expect_end(id, "failed", 120);
    assert!(s.log(id).contains("da2"), "{}", s.log(id));
    assert!(!rw.join("ran").exists());
}

#[test]
fn verify_pins_checks_the_client_image_on_this_host() {
    require_cluster_env!();
    require_env!();
    let fake = format!("sha256:{}", "ab".repeat(32));
    let f = fake.clone();
    let s = Site::up_full("dj-cpin", None, move |_| {
        format!("client_image = \"{f}\"\n")
    });
    let out = s.b.gpuq(ROOT, &["verify-pins"]);
    assert!(!out.status.success());
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "cxl2 (this host): profile test (client) image {fake}: MISSING"
        )),
        "{text}"
    );
    // The nodes are not asked for the client image.
    assert!(!text.contains("da1: profile test (client)"), "{text}");
}

/// Short step deadlines for the tests of a hung node: generous for this
/// machine under load (a normal stop or wipe takes well under a second),
/// short enough for a quick test.
const SHORT_DEADLINES: &str = "request_timeout_secs = 5\n\
     preflight_timeout_secs = 5\n\
     start_timeout_secs = 60\n\
     format_timeout_secs = 60\n\
     stop_timeout_secs = 8\n\
     wipe_timeout_secs = 8\n";

#[test]
fn a_frozen_node_helper_misses_its_deadline_the_lease_is_held_and_recover_releases() {
    require_cluster_env!();
    require_env!();
    let s = Site::up_with_daos_keys("dj-frozen", None, SHORT_DEADLINES);
    let rw = s.b.workdir(None, "root");

    // During the job: da2's helper stops answering (SIGSTOP); the job ends,
    // the cleanup's server stop gets no answer from da2 within 8 s → held
    // at stop_servers on da2. Without a deadline it would wait for ever.
    let go = rw.join("go");
    let id = s.b.submit(
        ROOT,
        &rw,
        &[
            "--inst",
            "test",
            "--",
            "bash",
            "-c",
            &format!("while [ ! -e {} ]; do sleep 0.1; done", go.display()),
        ],
    );
    wait_log(&s, id, "DAOS system ready");
    let frozen = Frozen::freeze(&s.c, "da2", "node");
    std::fs::write(&go, "").unwrap();
    s.expect_end(id, "completed", 60);
    let b = s.wait_held(id, 60);
    assert_eq!(
        (b["step"].as_str(), b["node"].as_str()),
        (Some("stop_servers"), Some("da2")),
        "{b}"
    );
    let reason = b["reason"].as_str().unwrap();
    assert!(
        reason.contains("da2: no answer from") && reason.contains("within 8s"),
        "{reason}"
    );
    let log = s.log(id);
    assert!(log.contains("cleanup stop_servers FAILED"), "{log}");
    // The next job waits.
    let queued = s.b.submit(ROOT, &rw, &["--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(queued), "queued");
    // recover is not refused as "cleanup running" (that cleanup ended in
    // the hold); while da2 still hangs it fails again at the deadline.
    let t = std::time::Instant::now();
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(!r.status.success(), "recover with da2 still frozen");
    let e = stderr(&r);
    assert!(
        !e.contains("being cleaned") && e.contains("da2") && e.contains("within 8s"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
    assert!(s.state().join("blocked.json").exists());
    assert_eq!(s.b.state(queued), "queued");
    // da2 answers again: recover releases, the queue moves on.
    frozen.thaw();
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}\n{}", stderr(&r), s.log(id));
    s.expect_end(queued, "completed", 60);
    s.assert_clean();

    // During the preparation: da3's helper hangs before the job is
    // submitted, so its preflight gets no answer within 5 s. The job fails
    // and never runs; preflight starts nothing on any node, so nothing is
    // asked of the nodes and the lease is released (no hold).
    let frozen = Frozen::freeze(&s.c, "da3", "node");
    let ran = rw.join("ran");
    let id = s.b.submit(
        ROOT,
        &rw,
        &["--inst", "test", "--", "touch", &ran.display().to_string()],
    );
    let j = s.expect_end(id, "failed", 60);
    let why = j["reason"].as_str().unwrap();
    assert!(
        why.contains("preflight")
            && why.contains("da3: no answer from")
            && why.contains("within 5s"),
        "{j}"
    );
    assert!(!ran.exists());
    assert!(!s.state().join("blocked.json").exists());
    let lease = lease_of(&s, id).expect("lease in the log");
    assert_eq!(s.lease_record(&lease)["phase"], "released");
    frozen.thaw();
    s.assert_clean();
}

/// `gpuq activate --execute --destroy-existing-data` (#17 item 2) on the
/// test cluster: refused for a user, beside a running job and without the
/// agreement, each changing nothing; with da3's helper hung it claims the
/// other three, keeps the `activating` hold (every job waits, `recover`
/// refuses and points at the activation), and run again after da3 answers
/// it finishes da3 only and releases the hold. The cluster's nodes
/// allowlist no device (test mode): their claims name none; the discard
/// itself is proven on real loop devices in gpuq-nodesvc's wipe_record.rs
/// and in the site VM.
#[test]
fn an_activation_holds_every_job_until_all_four_nodes_are_claimed_and_resumes_after_a_hung_node() {
    require_cluster_env!();
    require_env!();
    let s = Site::up_with_daos_keys("dj-activate", None, SHORT_DEADLINES);
    let rw = s.b.workdir(None, "root");
    let claim = |n: &str| s.c.dir().join(n).join("jobs/claim.json");
    let nothing_changed = |what: &str| {
        assert!(!s.state().join("blocked.json").exists(), "{what}: a hold");
        for n in NODES {
            assert!(!claim(n).exists(), "{what}: {n} claimed");
        }
    };
    // Not for a user; not without the agreement; not beside a job.
    let r = s.b.gpuq(
        Some(&alice()),
        &["activate", "--execute", "--destroy-existing-data"],
    );
    assert!(
        !r.status.success() && stderr(&r).contains("only root"),
        "{}",
        stderr(&r)
    );
    nothing_changed("a user's activation");
    let r = s.b.gpuq(ROOT, &["activate", "--execute"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert_eq!(stderr(&r).lines().count(), 1, "{}", stderr(&r));
    assert!(
        stderr(&r).contains("--destroy-existing-data"),
        "{}",
        stderr(&r)
    );
    nothing_changed("no agreement");
    let go = rw.join("go");
    let job = s.b.submit(
        ROOT,
        &rw,
        &[
            "--",
            "sh",
            "-c",
            &format!("while [ ! -e {} ]; do sleep 0.1; done", go.display()),
        ],
    );
    assert!(eventually(30, || s.b.state(job) == "running"));
    let r =
        s.b.gpuq(ROOT, &["activate", "--execute", "--destroy-existing-data"]);
    assert!(
        !r.status.success() && stderr(&r).contains("job(s) running"),
        "{}",
        stderr(&r)
    );
    nothing_changed("beside a running job");
    std::fs::write(&go, "").unwrap();
    s.expect_end(job, "completed", 60);

    // da3's helper hangs: the others are claimed, the site stays held.
    let frozen = Frozen::freeze(&s.c, "da3", "node");
    let r =
        s.b.gpuq(ROOT, &["activate", "--execute", "--destroy-existing-data"]);
    let out = stdout(&r);
    assert_eq!(r.status.code(), Some(1), "{out}{}", stderr(&r));
    assert!(
        out.contains("da3:\n  NOT COMPLETE: ") && out.contains("HELD:"),
        "{out}"
    );
    for n in ["da1", "da2", "da4"] {
        assert!(claim(n).exists(), "{n} not claimed: {out}");
    }
    assert!(!claim("da3").exists());
    let b: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.state().join("blocked.json")).unwrap()).unwrap();
    assert_eq!(b["kind"], "activating", "{b}");
    let name = b["lease"].as_str().unwrap().to_string();
    assert!(b["reason"].as_str().unwrap().contains("da3"), "{b}");
    // Every job waits; the list says why and what the operator runs.
    let queued = s.b.submit(
        Some(&alice()),
        &s.b.workdir(Some(&alice()), "alice"),
        &["--", "true"],
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.b.state(queued), "queued");
    let list = stdout(&s.b.gpuq(Some(&alice()), &["list"]));
    assert!(
        list.contains(&format!("HOLD: activation {name}"))
            && list.contains("gpuq activate --execute --destroy-existing-data"),
        "{list}"
    );
    // recover does not end it, and says what does.
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(!r.status.success());
    assert!(
        stderr(&r).contains(&format!("activation {name} holds the site"))
            && stderr(&r).contains("gpuq activate --execute"),
        "{}",
        stderr(&r)
    );
    assert!(s.state().join("blocked.json").exists());

    // da3 answers again: a second run finishes da3 only, under the first
    // run's name, and the hold goes; the queued job runs.
    frozen.thaw();
    let r = s.b.gpuq(
        ROOT,
        &["activate", "--execute", "--destroy-existing-data", "--json"],
    );
    assert!(r.status.success(), "{}{}", stdout(&r), stderr(&r));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(v["activation"], name.as_str(), "{v}");
    assert!(v["held"].is_null(), "{v}");
    for n in v["nodes"].as_array().unwrap() {
        assert!(n["error"].is_null(), "{v}");
        if n["node"] != "da3" {
            assert_eq!(n["report"]["already_claimed"], true, "{v}");
        }
    }
    for n in NODES {
        let c: serde_json::Value =
            serde_json::from_slice(&std::fs::read(claim(n)).unwrap()).unwrap();
        assert_eq!(c["activation"], name.as_str(), "{n}: {c}");
    }
    assert!(!s.state().join("blocked.json").exists());
    s.expect_end(queued, "completed", 60);
    // The plan now says every node is claimed.
    let plan = stdout(&s.b.gpuq(ROOT, &["activate"]));
    assert_eq!(
        plan.matches("already claimed by activation").count(),
        4,
        "{plan}"
    );
    s.assert_clean();
}

/// `gpuq e2e` (#17 item 3) on the test cluster: refused without the
/// maintenance lock and for a user, submitting nothing; under the lock two
/// rounds pass (a root `--inst` job writes and reads back through `gpuq
/// daos-exec`, and on cxl2 and every node nothing of its lease is left but
/// the audit and the server's output; test mode says so); a node's audit
/// removed by hand afterwards makes the check of that lease fail, naming
/// the node and the check. And the lease's server output, kept on the
/// nodes (`gpuq daos-status --lease`): root's to read, not alice's.
#[test]
fn e2e_passes_twice_under_the_lock_and_fails_on_a_node_whose_audit_is_gone() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-e2e");
    let jobs_before = s.b.job_count();
    let r = s.b.gpuq(ROOT, &["e2e"]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(
        stderr(&r).contains("maintenance lock") && stderr(&r).lines().count() == 1,
        "{}",
        stderr(&r)
    );
    let r = s.b.gpuq(Some(&alice()), &["e2e"]);
    assert!(
        !r.status.success() && stderr(&r).contains("only root"),
        "{}",
        stderr(&r)
    );
    assert_eq!(s.b.job_count(), jobs_before, "nothing was submitted");

    let l = s.b.gpuq(ROOT, &["lock", "--reason", "e2e"]);
    assert!(l.status.success(), "{}", stderr(&l));
    let r = s.b.gpuq(ROOT, &["e2e", "--repeat", "2", "--json"]);
    let out = stdout(&r);
    assert!(r.status.success(), "{out}{}", stderr(&r));
    let rounds: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rounds = rounds.as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{out}");
    let mut leases = Vec::new();
    for round in rounds {
        assert_eq!(round["ok"], true, "{round}");
        let rep = &round["report"];
        leases.push(rep["lease"].as_str().unwrap().to_string());
        let nodes = rep["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 4, "{rep}");
        for n in nodes {
            let checks: Vec<&str> = n["evidence"]["checks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["check"].as_str().unwrap())
                .collect();
            assert_eq!(
                checks,
                [
                    "node_lease_released",
                    "no_containers",
                    "wipe_audited",
                    "test_dir_removed",
                    "metadata_removed",
                    "server_output_kept"
                ],
                "{n}"
            );
        }
        // The job wrote and read back through DAOS.
        let id = round["job"].as_u64().unwrap();
        assert!(
            s.log(id)
                .contains("bytes written and read back through DAOS"),
            "{}",
            s.log(id)
        );
    }
    assert_ne!(leases[0], leases[1]);
    // Its working directories are gone (the rounds passed).
    for round in rounds {
        assert!(!std::path::Path::new(round["workdir"].as_str().unwrap()).exists());
    }
    // The table form of a passed lease, in test mode.
    let r = s.b.gpuq(ROOT, &["e2e", "--lease", &leases[1]]);
    let text = stdout(&r);
    assert!(r.status.success(), "{text}{}", stderr(&r));
    eprintln!("gpuq e2e --lease {}:\n{text}", leases[1]);
    assert!(
        text.contains("test mode") && text.ends_with("PASSED\n"),
        "{text}"
    );
    assert_eq!(text.matches(" ok ").count(), 4 + 4 * 6, "{text}");

    // da2's audit of the second lease removed by hand: that check fails,
    // naming the node; nothing else changes.
    let audit =
        s.c.dir()
            .join("da2/jobs")
            .join(&leases[1])
            .join("audit.jsonl");
    std::fs::remove_file(&audit).unwrap();
    let r = s.b.gpuq(ROOT, &["e2e", "--lease", &leases[1]]);
    let text = stdout(&r);
    assert_eq!(r.status.code(), Some(1), "{text}{}", stderr(&r));
    assert!(
        text.lines()
            .any(|l| l.contains("da2") && l.contains("wipe_audited") && l.contains("FAILED")),
        "{text}"
    );
    assert!(text.ends_with("FAILED\n"), "{text}");
    // The lease's server output, kept on the nodes after the job: root
    // (and the job's owner) may read it; alice may not read root's.
    let r = s.b.gpuq(ROOT, &["daos-status", "--lease", &leases[0]]);
    let text = stdout(&r);
    assert!(r.status.success(), "{text}{}", stderr(&r));
    for n in NODES {
        assert!(
            text.contains(&format!("== {n}: server output of lease {} ==", leases[0])),
            "{text}"
        );
    }
    assert!(text.contains("daos_server"), "{text}");
    // Its end only, from a line start.
    let r = s.b.gpuq(
        ROOT,
        &[
            "daos-status",
            "--lease",
            &leases[0],
            "--tail",
            "200",
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    for n in v.as_array().unwrap() {
        let out = n["output"]["output"].as_str().unwrap();
        assert!(n["output"]["truncated"] == true && out.len() <= 200, "{n}");
        assert!(
            text.contains(out),
            "not a line-aligned end of the whole: {out:?}"
        );
    }
    let r =
        s.b.gpuq(Some(&alice()), &["daos-status", "--lease", &leases[0]]);
    assert!(
        !r.status.success() && stderr(&r).contains("not one of your jobs'"),
        "{}",
        stderr(&r)
    );
    let r = s.b.gpuq(ROOT, &["daos-status", "--lease", "no-such-lease"]);
    assert!(
        !r.status.success() && stderr(&r).contains("no lease no-such-lease"),
        "{}",
        stderr(&r)
    );
    let r = s.b.gpuq(ROOT, &["e2e", "--lease", "no-such-lease"]);
    assert!(
        !r.status.success() && stderr(&r).contains("no lease no-such-lease"),
        "{}",
        stderr(&r)
    );
    s.b.gpuq(ROOT, &["unlock"]);
    s.assert_clean();
}
