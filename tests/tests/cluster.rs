//! The five-host test cluster (`integration/cluster/`, docs/test-cluster.md):
//! it brings up real hosts (network namespaces on a private bridge, one sshd
//! and one Podman API service per storage node) and `down` leaves nothing
//! behind, also after `up` crashed or daemons died.
//!
//! Each test has its own cluster dir and namespace prefix, so they run in
//! parallel. Run as root; they fail with the reason otherwise (tests/skip).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuq_system_tests::cluster::{addr, root_links, Cluster, ClusterId, Leftovers, HOSTS, NODES};
use gpuq_system_tests::{eventually, require_cluster_env, stderr, stdout};

fn assert_clean(id: &ClusterId, links_before: &[String]) {
    let left = Leftovers::of(id, links_before);
    assert!(left.is_empty(), "left behind after down: {left:#?}");
}

fn assert_down_ok(out: &std::process::Output) {
    // Shown with --nocapture (and by the test harness on failure).
    eprintln!("--- down ---\n{}", stderr(out));
    assert!(
        out.status.success(),
        "down failed ({}):\n{}",
        out.status,
        stderr(out)
    );
}

/// Build the busybox test image (integration/cluster/test-image) and load
/// it into `nodes`; returns the full image ID.
fn load_test_image(c: &Cluster, nodes: &[&str]) -> String {
    let archive = c.dir().join("busybox.tar");
    let archive = archive.to_str().unwrap();
    c.run_ok("test-image", &[archive]);
    let mut args = vec![archive];
    args.extend_from_slice(nodes);
    let out = c.run_ok("load-image", &args);
    // One line per node: `NODE sha256:<id> NAMES`; the same ID everywhere.
    let ids: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(ids.len(), nodes.len(), "load-image output: {out}");
    assert!(ids.iter().all(|i| *i == ids[0]), "IDs differ: {out}");
    let id = ids[0].strip_prefix("sha256:").unwrap().to_string();
    assert_eq!(id.len(), 64, "not a full image ID: {out}");
    id
}

/// Create and start a container on `node` (host network of that node).
fn run_container(c: &Cluster, node: &str, image: &str, name: &str, cmd: &[&str]) -> String {
    let spec = serde_json::json!({
        "image": image,
        "name": name,
        "command": cmd,
        "netns": { "nsmode": "host" },
    });
    let (code, v) = c.api_json(
        node,
        "POST",
        "/v4.0.0/libpod/containers/create",
        Some(&spec.to_string()),
    );
    assert_eq!(code, 201, "create on {node}: {v}");
    let id = v["Id"].as_str().expect("container Id").to_string();
    let (code, body) = c.http(
        &c.podman_sock(node),
        "POST",
        &format!("/v4.0.0/libpod/containers/{id}/start"),
        None,
    );
    assert_eq!(code, 204, "start on {node}: {body}");
    id
}

#[test]
fn harness_self_test() {
    require_cluster_env!();
    let links_before = root_links();
    let c = Cluster::up("selftest");
    let id = c.id.clone();

    // 1. Every storage node is reachable by name over SSH from cxl2, with
    //    strict host key checking against the generated known_hosts, and
    //    the session really lands on that node's address.
    for n in NODES {
        let out = c.ssh(n, &["echo", "$SSH_CONNECTION"]);
        assert!(out.status.success(), "ssh {n}: {}", stderr(&out));
        let conn = stdout(&out);
        let f: Vec<&str> = conn.split_whitespace().collect();
        assert_eq!(f.len(), 4, "SSH_CONNECTION on {n}: {conn:?}");
        assert_eq!(f[0], addr("cxl2"), "client address seen by {n}");
        assert_eq!(f[2], addr(n), "server address of {n}");
    }
    // Strict: without the generated known_hosts, the same ssh is refused.
    let out = c.ssh("da1", &["-o", "UserKnownHostsFile=/dev/null", "true"]);
    assert!(!out.status.success(), "ssh accepted an unknown host key");
    assert!(
        stderr(&out).contains("Host key verification failed"),
        "{}",
        stderr(&out)
    );
    // The broker's links' key (what the ssh config names) runs no command
    // on a node (`restrict,port-forwarding,command="/bin/false"`); it only
    // forwards unix sockets, which every DAOS test's links do.
    let cfg = c.ssh_config();
    let links_key = c.dir().join("cxl2/ssh/id_ed25519");
    let out = c.in_host(
        "cxl2",
        &[
            "ssh",
            "-F",
            cfg.to_str().unwrap(),
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            links_key.to_str().unwrap(),
            "da1",
            "echo",
            "ran-a-command",
        ],
    );
    assert!(
        !out.status.success() && !stdout(&out).contains("ran-a-command"),
        "the links' key ran a command on da1: {} {}",
        stdout(&out),
        stderr(&out)
    );
    // Root key auth from cxl2 only: cxl2's own key, used from da2, is refused.
    let out = c.in_host("da2", &["ssh", "-F", cfg.to_str().unwrap(), "da1", "true"]);
    assert!(!out.status.success(), "da1 accepted a login from da2");
    // The root namespace has no address or route in the cluster's subnet.
    for what in [&["-o", "addr"][..], &["route", "show", "table", "all"][..]] {
        let out = Command::new("ip").args(what).output().unwrap();
        assert!(
            !stdout(&out).contains("10.200.0."),
            "root namespace: ip {what:?}: {}",
            stdout(&out)
        );
    }

    // 2. Each node's Podman API answers on its own socket and reports its
    //    own storage; nothing listens on TCP in a node but its sshd.
    for n in NODES {
        let (code, info) = c.api_json(n, "GET", "/v4.0.0/libpod/info", None);
        assert_eq!(code, 200, "{n} info: {info}");
        let root = c.dir().join(n).join("podman").join("root");
        assert_eq!(
            info["store"]["graphRoot"],
            root.to_str().unwrap(),
            "{n} graphRoot"
        );
        let run = c.dir().join(n).join("podman").join("run");
        assert_eq!(
            info["store"]["runRoot"],
            run.to_str().unwrap(),
            "{n} runRoot"
        );
        let ss = c.in_host(n, &["ss", "-Hltn"]);
        let listeners: Vec<String> = stdout(&ss)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3).map(str::to_owned))
            .collect();
        assert_eq!(
            listeners,
            vec![format!("{}:22", addr(n))],
            "TCP listeners in {n}"
        );
    }

    // 3. Images are per node: loaded into da1, absent from da2..da4.
    let image = load_test_image(&c, &["da1"]);
    let exists = |n: &str| {
        c.http(
            &c.podman_sock(n),
            "GET",
            &format!("/v4.0.0/libpod/images/{image}/exists"),
            None,
        )
        .0
    };
    assert_eq!(exists("da1"), 204, "image missing on da1");
    for n in ["da2", "da3", "da4"] {
        assert_eq!(exists(n), 404, "da1's image visible on {n}");
    }

    // 4. A container with the host network on da1 sees da1's address only.
    let ctr = run_container(&c, "da1", &image, "probe", &["cat", "/proc/net/fib_trie"]);
    let (code, v) = c.api_json(
        "da1",
        "POST",
        &format!("/v4.0.0/libpod/containers/{ctr}/wait?condition=exited"),
        None,
    );
    assert_eq!((code, v.as_i64()), (200, Some(0)), "wait: {v}");
    let (_, logs) = c.http(
        &c.podman_sock("da1"),
        "GET",
        &format!("/v4.0.0/libpod/containers/{ctr}/logs?stdout=true&stderr=true"),
        None,
    );
    assert!(
        logs.contains(addr("da1")),
        "da1's address not in the container: {logs}"
    );
    for other in ["cxl2", "da2", "da3", "da4"] {
        assert!(
            !logs.contains(&format!("|-- {}\n", addr(other))),
            "{other}'s address inside da1's container"
        );
    }

    // 5. Unix-socket forwarding from cxl2 to da1's Podman socket (what the
    //    broker does with the openssh crate), and the API through it.
    let local = c.dir().join("cxl2").join("run").join("da1-podman.sock");
    let mut fwd = c.forward("da1", &local, &c.podman_sock("da1"));
    let up = eventually(10, || local.exists());
    if !up {
        let _ = fwd.kill();
        let out = fwd.wait_with_output().unwrap();
        panic!("forward socket never appeared: {}", stderr(&out));
    }
    let (code, body) = c.http(&local, "GET", "/_ping", None);
    assert_eq!(
        (code, body.as_str()),
        (200, "OK"),
        "_ping through the forward"
    );
    let (code, body) = c.http(&local, "GET", "/v4.0.0/libpod/info", None);
    assert_eq!(code, 200);
    let info: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        info["store"]["graphRoot"],
        c.dir().join("da1/podman/root").to_str().unwrap(),
        "the forward reaches da1's own Podman"
    );
    let _ = fwd.kill();
    let _ = fwd.wait();
    let _ = std::fs::remove_file(&local);

    // 6. Each node runs its own gpuq-node in test mode; the broker's path to
    //    it is an SSH unix-socket forward from cxl2, and the helper answers
    //    for its own node only.
    for n in NODES {
        let local = c
            .dir()
            .join("cxl2")
            .join("run")
            .join(format!("{n}-node.sock"));
        let mut fwd = c.forward(n, &local, &c.node_sock(n));
        let up = eventually(10, || local.exists());
        if !up {
            let _ = fwd.kill();
            let out = fwd.wait_with_output().unwrap();
            panic!("node forward for {n} never appeared: {}", stderr(&out));
        }
        let (code, body) = c.http(&local, "GET", "/v1/status", None);
        assert_eq!(code, 200, "gpuq-node status on {n}: {body}");
        let st: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(st["node"], n, "{st}");
        assert!(st["lease"].is_null(), "{st}");
        let _ = fwd.kill();
        let _ = fwd.wait();
        let _ = std::fs::remove_file(&local);
    }

    // 7. Status says all is well.
    let status = c.id.command("status").output().unwrap();
    assert!(
        status.status.success(),
        "status: {}{}",
        stdout(&status),
        stderr(&status)
    );
    for h in HOSTS {
        assert!(stdout(&status).contains(addr(h)), "status lacks {h}");
    }

    let up_time = c.up_time;
    let (out, down_time) = c.down();
    assert_down_ok(&out);
    assert_clean(&id, &links_before);
    eprintln!(
        "cluster timing: up {:.2} s, down {:.2} s",
        up_time.as_secs_f64(),
        down_time.as_secs_f64()
    );
}

/// A busy cluster — a running container on every node (one ignoring
/// SIGTERM), an SSH session, a process started in a node with `shell`, a
/// live forward — leaves nothing behind after `down`, and a second `down`
/// is a no-op.
#[test]
fn leftover_state_after_down_is_empty() {
    require_cluster_env!();
    let links_before = root_links();
    let c = Cluster::up("leftover");
    let id = c.id.clone();
    let image = load_test_image(&c, &NODES);
    for n in NODES {
        run_container(
            &c,
            n,
            &image,
            "busy",
            &["sh", "-c", "trap '' TERM; sleep 1000"],
        );
    }
    let mut session =
        c.id.command("ssh")
            .args(["da3", "sleep", "1000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let mut in_node =
        c.id.command("shell")
            .args(["da2", "sleep", "1000"])
            .spawn()
            .unwrap();
    let local = c.dir().join("cxl2/run/fwd.sock");
    let mut fwd = c.forward("da4", &local, &c.podman_sock("da4"));
    assert!(eventually(10, || local.exists()), "forward did not start");
    // Wait until the session's remote command runs on da3.
    assert!(
        eventually(10, || {
            let out = c.in_host("da3", &["ss", "-Htn", "state", "established"]);
            stdout(&out).contains(&format!("{}:22", addr("da3")))
        }),
        "ssh session to da3 not established"
    );

    let (out, took) = c.down();
    assert_down_ok(&out);
    for child in [&mut session, &mut in_node, &mut fwd] {
        let _ = child.wait(); // reap: down ended them
    }
    assert_clean(&id, &links_before);
    eprintln!("busy cluster down in {:.2} s", took.as_secs_f64());

    let (again, _) = id.down();
    assert_down_ok(&again);
    assert!(
        stderr(&again).contains("nothing to tear down"),
        "{}",
        stderr(&again)
    );
}

/// `up` killed half-way (SIGKILL to its whole process group, daemons
/// already running in their own sessions): `down` still removes everything
/// from the partial manifest.
#[test]
fn down_cleans_up_after_up_was_killed_midway() {
    require_cluster_env!();
    let links_before = root_links();
    let id = ClusterId::unique("crash");
    let mut up = id
        .command("up")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let manifest = id.dir.join("manifest");
    let midway = eventually(60, || {
        std::fs::read_to_string(&manifest).is_ok_and(|m| m.contains("pid da3 podman"))
    });
    let pgid = nix::unistd::Pid::from_raw(-(up.id() as i32));
    let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
    let _ = up.wait();
    assert!(midway, "up never got to da3's podman");
    let m = std::fs::read_to_string(&manifest).unwrap();
    assert!(
        !m.contains("\nready "),
        "up finished before it was killed:\n{m}"
    );

    let (out, _) = id.down();
    assert_down_ok(&out);
    assert_clean(&id, &links_before);
}

/// Half of the recorded daemons die (killed by PID); `status` reports it,
/// `down` still removes everything, and is idempotent.
#[test]
fn down_cleans_up_after_daemons_died() {
    require_cluster_env!();
    let links_before = root_links();
    let c = Cluster::up("died");
    let id = c.id.clone();
    for (host, role) in [
        ("da1", "podman"),
        ("da2", "podman"),
        ("da3", "sshd"),
        ("da4", "sshd"),
    ] {
        let pid = c.recorded_pid(host, role).expect("recorded pid");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    let status = c.id.command("status").output().unwrap();
    assert!(!status.status.success(), "status ok with dead daemons");
    assert!(stdout(&status).contains("DEAD"), "{}", stdout(&status));

    let t0 = Instant::now();
    let (out, _) = c.down();
    assert_down_ok(&out);
    assert_clean(&id, &links_before);
    let (again, _) = id.down();
    assert_down_ok(&again);
    assert_clean(&id, &links_before);
    eprintln!(
        "down after dead daemons: {:.2} s",
        t0.elapsed().as_secs_f64()
    );
}

/// The scripts refuse a cluster dir they could not safely remove, and
/// `down` never sweeps a dir that holds anything but a cluster.
#[test]
fn refuses_dangerous_cluster_dirs() {
    require_cluster_env!();
    let down = gpuq_system_tests::cluster::harness_dir().join("down");
    for dir in ["/", "/tmp", "/etc/x", "/tmp/a b", "relative/dir", "/x"] {
        let out = Command::new(&down)
            .env("GPUQ_CLUSTER_DIR", dir)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "down accepted GPUQ_CLUSTER_DIR={dir}: {}",
            stderr(&out)
        );
    }
    // A dir with someone's data and no manifest: refused, left as it was.
    let id = ClusterId::unique("foreign");
    std::fs::create_dir_all(&id.dir).unwrap();
    let precious = id.dir.join("precious.txt");
    std::fs::write(&precious, "keep me").unwrap();
    let (out, _) = id.down();
    let kept = std::fs::read_to_string(&precious);
    let _ = std::fs::remove_dir_all(&id.dir);
    assert_eq!(out.status.code(), Some(1), "down: {}", stderr(&out));
    assert!(
        stderr(&out).contains("not a test cluster dir"),
        "{}",
        stderr(&out)
    );
    assert_eq!(kept.unwrap(), "keep me");
}

/// A fake `daos_server` (a copy of sleep) started inside `host`'s network
/// namespace; killed by PID on drop.
struct FakeEngine(std::process::Child);

impl FakeEngine {
    fn start(c: &Cluster, host: &str) -> Self {
        let bin = c.dir().join(host).join("daos_server");
        if !bin.exists() {
            std::fs::copy("/bin/sleep", &bin).unwrap();
        }
        let mut tries = 0;
        loop {
            match std::process::Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", c.id.namespace(host)))
                .arg(&bin)
                .arg("300")
                .spawn()
            {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => {
                    let child = other.unwrap();
                    // nsenter execs the command: wait until it has.
                    let pid = child.id();
                    assert!(eventually(10, || std::fs::read_to_string(format!(
                        "/proc/{pid}/cmdline"
                    ))
                    .is_ok_and(|c| c.contains("daos_server"))));
                    return FakeEngine(child);
                }
            }
        }
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The five hosts share one kernel and one /proc: a node's preflight must
/// count only the DAOS processes of its own network namespace. da1 does not
/// take da2's server for a foreign engine, and does refuse one in its own.
#[test]
fn preflight_sees_only_its_own_nodes_engines() {
    require_cluster_env!();
    let pin = format!("sha256:{}", "ab".repeat(32));
    let c = Cluster::up_with("scope", &[("GPUQ_CLUSTER_PROFILE_IMAGE", &pin)]);
    let preflight = |node: &str| -> Vec<(String, String)> {
        let (code, body) = c.http(
            &c.node_sock(node),
            "POST",
            "/v1/preflight",
            Some(r#"{"lease":"L1","profile":"test"}"#),
        );
        assert_eq!(code, 200, "{node}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["reason"].as_str().unwrap().to_string(),
                    f["detail"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    // The pin is not loaded anywhere: every node reports that, and nothing else.
    for n in NODES {
        let f = preflight(n);
        assert_eq!(
            f.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
            ["image_missing"],
            "{n}: {f:?}"
        );
    }
    let on_da2 = FakeEngine::start(&c, "da2");
    let da1 = preflight("da1");
    assert!(
        !da1.iter().any(|(r, _)| r == "foreign_engine"),
        "da1 took da2's server for its own: {da1:?}"
    );
    let da2 = preflight("da2");
    assert!(
        da2.iter()
            .any(|(r, d)| r == "foreign_engine" && d.contains(&format!("pid {}", on_da2.pid()))),
        "{da2:?}"
    );
    let on_da1 = FakeEngine::start(&c, "da1");
    let da1 = preflight("da1");
    let engines: Vec<&String> = da1
        .iter()
        .filter(|(r, _)| r == "foreign_engine")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(engines.len(), 1, "{da1:?}");
    assert!(
        engines[0].contains(&format!("pid {}", on_da1.pid())),
        "{da1:?}"
    );
    drop(on_da1);
    drop(on_da2);
    let (out, _) = c.down();
    assert!(out.status.success(), "{}", stderr(&out));
}
