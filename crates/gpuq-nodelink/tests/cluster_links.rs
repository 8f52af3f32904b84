//! Node links against the real five-host test cluster (integration/cluster):
//! real sshd per node, real strict host-key checking, each node's own
//! gpuq-node and Podman behind the forwards.
//!
//! SSH from the root namespace would route off the machine, so each test
//! brings the cluster up here and then re-runs itself (`--exact`) inside
//! cxl2's network namespace (`nsenter --net`), where the ssh master the
//! link starts lives. The child does the link work and checks; the parent
//! owns the cluster, whose Drop runs `down` (also after a panic).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpuq_nodelink::{http, LinkConfig, LinkState, NodeLink, NodeLinks, Timings};
use gpuq_system_tests::cluster::{self, Cluster, NODES};

const CHILD: &str = "GPUQ_NODELINK_CHILD_DIR";
const CHILD_PREFIX: &str = "GPUQ_NODELINK_CHILD_PREFIX";

/// The child's view of the cluster: dir and namespace prefix.
struct Ctx {
    dir: PathBuf,
    prefix: String,
}

impl Ctx {
    fn forward_dir(&self) -> PathBuf {
        self.dir.join("cxl2").join("run").join("links")
    }

    fn config(&self, node: &str, known_hosts: &Path) -> LinkConfig {
        LinkConfig {
            name: node.to_string(),
            // A name the generated ssh_config resolves (HostName 10.200.0.1N).
            host: node.to_string(),
            user: "root".into(),
            port: Some(22),
            identity_file: self.dir.join("cxl2/ssh/id_ed25519"),
            known_hosts_file: known_hosts.to_path_buf(),
            ssh_config_file: Some(self.dir.join("ssh/ssh_config")),
            node_socket: self.dir.join(node).join("run/node.sock"),
            podman_socket: self.dir.join(node).join("run/podman.sock"),
            forward_dir: self.forward_dir(),
        }
    }

    fn known_hosts(&self) -> PathBuf {
        self.dir.join("ssh/known_hosts")
    }

    fn all(&self) -> Vec<LinkConfig> {
        NODES
            .iter()
            .map(|n| self.config(n, &self.known_hosts()))
            .collect()
    }
}

fn timings() -> Timings {
    Timings {
        connect_timeout: Duration::from_secs(3),
        request_timeout: Duration::from_secs(2),
        health_interval: Duration::from_millis(300),
        server_alive_interval: Duration::from_secs(1),
        backoff_initial: Duration::from_millis(200),
        backoff_max: Duration::from_secs(2),
    }
}

/// In the parent: why the cluster tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    let why = cluster::skip_reason().or_else(|| {
        let node = gpuq_system_tests::bin_dir().join("gpuq-node");
        (!node.exists())
            .then(|| format!("needs {} (cargo build -p gpuq-node --bins)", node.display()))
    })?;
    Some(why)
}

/// Parent: cluster up, then this test again inside cxl2's namespace.
/// Child: run `body`.
fn cluster_test(test: &str, body: impl FnOnce(&Ctx)) {
    if let (Some(dir), Some(prefix)) = (std::env::var_os(CHILD), std::env::var_os(CHILD_PREFIX)) {
        let ctx = Ctx {
            dir: dir.into(),
            prefix: prefix.to_string_lossy().into_owned(),
        };
        body(&ctx);
        return;
    }
    if let Some(why) = skip_reason() {
        gpuq_test_skip::cannot_run(test, &why);
        return;
    }
    let c = Cluster::up(&format!("nl{}", &test[..3]));
    eprintln!("cluster up in {:?}", c.up_time);
    let exe = std::env::current_exe().expect("current_exe");
    let out = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", c.id.namespace("cxl2")))
        .arg("--")
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, c.dir())
        .env(CHILD_PREFIX, &c.id.prefix)
        .env("GPUQ_BIN_DIR", gpuq_system_tests::bin_dir())
        .output()
        .expect("run nsenter (util-linux)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "{test} in cxl2's namespace failed");
    assert!(text.contains("1 passed"), "{test} did not run in the child");
    // Nothing of the links may outlive the child: no ssh process naming the
    // forward dir, no socket in it.
    let fwd = c.dir().join("cxl2/run/links");
    let left = cluster::pids_mentioning(&fwd.to_string_lossy());
    assert!(left.is_empty(), "processes left: {left:?}");
    assert_eq!(sockets_in(&fwd), Vec::<PathBuf>::new(), "sockets left");
    drop(c);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn sockets_in(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_socket() {
                out.push(e.path());
            }
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

async fn json(sock: &Path, path: &str) -> serde_json::Value {
    let (st, body) = http::get(sock, path, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("GET {path} via {}: {e}", sock.display()));
    assert!(st.is_success(), "GET {path}: {st}");
    serde_json::from_slice(&body).expect("json")
}

async fn wait_state(link: &NodeLink, want: &str, within: Duration) -> LinkState {
    let mut rx = link.subscribe();
    let got = tokio::time::timeout(within, async {
        rx.wait_for(|s| s.label() == want).await.map(|s| s.clone())
    })
    .await;
    match got {
        Ok(Ok(s)) => s,
        _ => panic!(
            "{}: not {want} within {within:?}; now {}",
            link.name(),
            link.state()
        ),
    }
}

#[test]
fn four_links_reach_each_nodes_own_helper_and_podman_and_close_cleanly() {
    cluster_test(
        "four_links_reach_each_nodes_own_helper_and_podman_and_close_cleanly",
        |ctx| {
            rt().block_on(async {
                let links = NodeLinks::new(ctx.all(), timings()).expect("config");
                let t0 = Instant::now();
                let up = links.ensure_all_up(Duration::from_secs(30)).await;
                let all_up = t0.elapsed();
                let socks = up.into_all().expect("all four links up");
                println!("TIMING all four links up (concurrent): {all_up:?}");
                for l in links.links() {
                    println!(
                        "TIMING {} phases: {:?}",
                        l.name(),
                        l.last_connect().expect("timings")
                    );
                }
                let mut pids = Vec::new();
                for (node, s) in &socks {
                    assert!(links.get(node).expect("link").state().is_up());
                    // Each forward reaches that node's own helper ...
                    let st = json(&s.node_sock, "/v1/status").await;
                    assert_eq!(st["node"], node.as_str(), "{node}: status {st}");
                    // ... and that node's own Podman.
                    let (code, ping) = http::get(&s.podman_sock, "/_ping", Duration::from_secs(5))
                        .await
                        .expect("ping");
                    assert!(code.is_success() && ping.as_ref() == b"OK", "{node}: _ping");
                    let info = json(&s.podman_sock, "/v4.0.0/libpod/info").await;
                    let graph = info["store"]["graphRoot"].as_str().expect("graphRoot");
                    assert_eq!(
                        Path::new(graph),
                        ctx.dir.join(node).join("podman/root"),
                        "{node}: Podman storage is another node's"
                    );
                    // Root-only: the sockets sit in a 0700 dir.
                    use std::os::unix::fs::PermissionsExt;
                    let mode = std::fs::metadata(ctx.forward_dir())
                        .expect("dir")
                        .permissions()
                        .mode();
                    assert_eq!(mode & 0o777, 0o700);
                    let pid = links
                        .get(node)
                        .and_then(NodeLink::master_pid)
                        .expect("master pid");
                    assert!(alive(pid));
                    pids.push(pid);
                }
                // One master per node.
                pids.sort_unstable();
                pids.dedup();
                assert_eq!(pids.len(), 4);

                // A step on all four nodes at once: every node answers.
                let t = Instant::now();
                let report = links
                    .step(Duration::from_secs(5), |s| async move {
                        let v = json(&s.node_sock, "/v1/status").await;
                        Ok::<_, String>(v["node"].as_str().unwrap_or_default().to_string())
                    })
                    .await;
                println!("TIMING a status step on all four: {:?}", t.elapsed());
                let names = report.into_all().expect("step ok");
                assert!(names.iter().all(|(n, v)| n == v));

                // A step one node's part of which fails fails as a whole and
                // says which node and why; the others' results are there too.
                let report = links
                    .step(Duration::from_secs(5), |s| async move {
                        if s.node == "da2" {
                            Err("wipe not confirmed".to_string())
                        } else {
                            Ok(())
                        }
                    })
                    .await;
                assert_eq!(report.failed(), vec!["da2"]);
                assert_eq!(report.nodes.len(), 4);
                let err = report.into_all().expect_err("da2 failed").to_string();
                assert!(
                    err.contains("da2") && err.contains("wipe not confirmed"),
                    "{err}"
                );
                assert!(!err.contains("da1"), "{err}");

                // Closing ends the masters and unlinks the sockets.
                links.close_all().await;
                for (_, s) in &socks {
                    assert!(!s.node_sock.exists(), "{} left", s.node_sock.display());
                    assert!(!s.podman_sock.exists(), "{} left", s.podman_sock.display());
                }
                for pid in pids {
                    let t = Instant::now();
                    while alive(pid) && t.elapsed() < Duration::from_secs(3) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    assert!(!alive(pid), "ssh master {pid} still running after close");
                }
                for (n, s) in links.states() {
                    assert!(!s.is_up(), "{n}: {s}");
                }
            });
        },
    );
}

#[test]
fn wrong_host_key_or_wrong_node_is_refused_and_nothing_is_forwarded() {
    cluster_test(
        "wrong_host_key_or_wrong_node_is_refused_and_nothing_is_forwarded",
        |ctx| {
            // da1's entry carries da2's host key: what a MITM or a reinstalled
            // node looks like.
            let real = std::fs::read_to_string(ctx.known_hosts()).expect("known_hosts");
            let key_of = |n: &str| {
                real.lines()
                    .find(|l| l.split(',').next() == Some(n))
                    .and_then(|l| l.split_once(' '))
                    .map(|(_, k)| k.to_string())
                    .expect("node in known_hosts")
            };
            let wrong = ctx.dir.join("cxl2/wrong_known_hosts");
            std::fs::write(&wrong, format!("da1,10.200.0.11 {}\n", key_of("da2"))).expect("write");
            let empty = ctx.dir.join("cxl2/empty_known_hosts");
            std::fs::write(&empty, "").expect("write");
            rt().block_on(async {
                for (node, kh) in [("da1", &wrong), ("da3", &empty)] {
                    let link = NodeLink::new(ctx.config(node, kh), timings()).expect("config");
                    let err = link
                        .ensure_up(Duration::from_secs(4))
                        .await
                        .expect_err("must be refused");
                    // The supervisor keeps retrying (with backoff) while
                    // ensure_up waits out its timeout, so at that moment the
                    // link may be down or in its next attempt ("not down:
                    // connecting for 0s", issue 13): stop it, then look.
                    // Every failed attempt is in the stats.
                    link.close().await;
                    assert_eq!(link.state().label(), "down", "{node}: {}", link.state());
                    let stats = link.stats();
                    assert_eq!(stats.ups, 0, "{node}: came up with a refused host key");
                    let (_, last_error) = stats.last_error.expect("the refusal is recorded");
                    println!("{node} refused: {last_error}");
                    assert!(last_error.contains(node), "{last_error}");
                    assert!(last_error.contains("host key"), "{last_error}");
                    assert!(
                        last_error.contains(&kh.display().to_string()),
                        "{last_error}"
                    );
                    assert!(err.to_string().contains(node), "{err}");
                    // Nothing forwarded, no master running. An attempt that
                    // close() cut short may leave its refused ssh a moment.
                    let s = link.sockets();
                    assert!(!s.node_sock.exists() && !s.podman_sock.exists());
                    assert_eq!(link.master_pid(), None);
                    let t = Instant::now();
                    let mut masters = Vec::new();
                    while t.elapsed() < Duration::from_secs(3) {
                        masters = cluster::pids_mentioning(&ctx.forward_dir().to_string_lossy());
                        if masters.is_empty() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    assert!(masters.is_empty(), "{masters:?}");
                }
                // The right file works (the refusal was the key, not the setup).
                let link = NodeLink::new(ctx.config("da1", &ctx.known_hosts()), timings())
                    .expect("config");
                link.ensure_up(Duration::from_secs(15))
                    .await
                    .expect("up with the right known_hosts");
                link.close().await;

                // A node_socket that leads to another node's helper (the nodes
                // share a filesystem here) is caught by the status check: the
                // link stays down, the master is ended, nothing stays forwarded.
                let mut cfg = ctx.config("da2", &ctx.known_hosts());
                cfg.node_socket = ctx.dir.join("da4/run/node.sock");
                let link = NodeLink::new(cfg, timings()).expect("config");
                link.ensure_up(Duration::from_secs(4))
                    .await
                    .expect_err("wrong node");
                let (_, e) = link.stats().last_error.expect("error");
                println!("da2 -> da4's socket refused: {e}");
                assert!(e.contains("da2") && e.contains("says it is \"da4\""), "{e}");
                link.close().await;
                let s = link.sockets();
                assert!(!s.node_sock.exists() && !s.podman_sock.exists());
                let t = Instant::now();
                let mut masters = Vec::new();
                while t.elapsed() < Duration::from_secs(3) {
                    masters = cluster::pids_mentioning(&ctx.forward_dir().to_string_lossy());
                    if masters.is_empty() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert!(masters.is_empty(), "{masters:?}");
            });
        },
    );
}

#[test]
fn lost_links_go_down_with_the_error_and_come_back_with_backoff() {
    cluster_test(
        "lost_links_go_down_with_the_error_and_come_back_with_backoff",
        |ctx| {
            rt().block_on(async {
                let links = NodeLinks::new(ctx.all(), timings()).expect("config");
                links
                    .ensure_all_up(Duration::from_secs(30))
                    .await
                    .into_all()
                    .expect("all up");

                // 1. The ssh master of da1 killed (by its PID).
                let da1 = links.get("da1").expect("da1");
                let pid = da1.master_pid().expect("pid");
                // Down and back up can both happen between two looks at the
                // state: the stats count every failure. Counted before the
                // kill: the pidfd watch sees the master's death in ~10 ms,
                // often before kill(1) itself has exited, so a count taken
                // after it already includes this failure and the wait below
                // would wait for another one ("no failure within 5s; now up
                // for 4s", issue 13).
                let before = da1.stats();
                let t = Instant::now();
                kill9(pid);
                let noticed = wait_for_failure(da1, before.failures, Duration::from_secs(5)).await;
                let (_, last_error) = da1.stats().last_error.expect("error recorded");
                println!("da1 after master kill ({noticed:?}): {last_error}");
                assert!(
                    last_error.contains("da1") && last_error.contains("master"),
                    "{last_error}"
                );
                wait_state(da1, "up", Duration::from_secs(15)).await;
                println!(
                    "TIMING master killed -> down {noticed:?} -> up again {:?}",
                    t.elapsed()
                );
                let new_pid = da1.master_pid().expect("new pid");
                assert_ne!(new_pid, pid);
                assert!(!alive(pid));

                // 2. da3's network cut (its veth down): down, and an
                // all-node step fails naming da3 only.
                let ns = format!("{}-da3", ctx.prefix);
                let da3 = links.get("da3").expect("da3");
                let old_pid = da3.master_pid().expect("pid");
                let t = Instant::now();
                let before = da3.stats().failures;
                ip(&ns, "down");
                let noticed = wait_for_failure(da3, before, Duration::from_secs(10)).await;
                let (_, e) = da3.stats().last_error.expect("error");
                println!("TIMING da3 veth down -> link down {noticed:?}: {e}");
                assert!(e.contains("da3"), "{e}");
                assert!(!da3.state().is_up());
                let report = links
                    .step(Duration::from_secs(1), |s| async move {
                        json(&s.node_sock, "/v1/status").await;
                        Ok::<_, String>(())
                    })
                    .await;
                assert_eq!(report.failed(), vec!["da3"], "{:?}", report.nodes);
                let err = report.into_all().expect_err("da3 is down").to_string();
                println!("step with da3 cut: {err}");
                assert!(err.starts_with("step failed on da3:"), "{err}");
                // While down, reconnects keep failing and backing off.
                tokio::time::sleep(Duration::from_secs(3)).await;
                assert!(!da3.state().is_up());
                assert!(!alive(old_pid), "the old master is ended on failure");

                // Link back: up again within the backoff cap + a connect.
                ip(&ns, "up");
                wait_state(da3, "up", Duration::from_secs(20)).await;
                println!("TIMING da3 veth up -> link up {:?}", t.elapsed());
                links
                    .step(Duration::from_secs(5), |s| async move {
                        json(&s.node_sock, "/v1/status").await;
                        Ok::<_, String>(())
                    })
                    .await
                    .into_all()
                    .expect("all four again");
                links.close_all().await;
                assert!(sockets_in(&ctx.forward_dir()).is_empty());

                // 3. A broker that dies (SIGKILL, no cleanup) leaves its
                // detached master and sockets; the next link to that node
                // ends that master first: one master per node.
                let mut broker = Command::new(std::env::current_exe().expect("exe"))
                    .args([
                        DYING_BROKER,
                        "--exact",
                        "--ignored",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env(DYING, "1")
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("spawn the dying broker");
                let mut out = std::io::BufReader::new(broker.stdout.take().expect("stdout"));
                let mut line = String::new();
                let stale = loop {
                    line.clear();
                    let n = std::io::BufRead::read_line(&mut out, &mut line).expect("read");
                    assert!(n > 0, "the dying broker exited early");
                    // libtest prints "test NAME ... " before the test's own output.
                    if let Some((_, p)) = line.trim().split_once("MASTER ") {
                        break p.parse::<u32>().expect("pid");
                    }
                };
                broker.kill().expect("kill -9 the broker");
                broker.wait().expect("reap");
                assert!(
                    alive(stale),
                    "the master outlives its broker (ControlPersist)"
                );
                let link = NodeLink::new(ctx.config("da1", &ctx.known_hosts()), timings())
                    .expect("config");
                link.ensure_up(Duration::from_secs(15))
                    .await
                    .expect("up again");
                let t = Instant::now();
                while alive(stale) && t.elapsed() < Duration::from_secs(3) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert!(!alive(stale), "stale master {stale} still running");
                assert_ne!(link.master_pid(), Some(stale));
                link.close().await;
            });
        },
    );
}

#[test]
fn ensure_up_looks_again_and_never_hands_out_a_dead_master() {
    cluster_test(
        "ensure_up_looks_again_and_never_hands_out_a_dead_master",
        |ctx| {
            rt().block_on(async {
                // Health checks a minute apart: ensure_up's own look (or the
                // watch on the master's exit) must notice the death.
                let slow = slow_health();
                let link =
                    NodeLink::new(ctx.config("da2", &ctx.known_hosts()), slow).expect("config");
                link.ensure_up(Duration::from_secs(15)).await.expect("up");
                let pid = link.master_pid().expect("pid");
                kill9(pid);
                while alive(pid) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // Whether the master's exit (pidfd) or ensure_up's own look
                // sees it first, ensure_up answers only with a new master.
                let socks = link
                    .ensure_up(Duration::from_secs(15))
                    .await
                    .expect("up again");
                let new_pid = link.master_pid().expect("new pid");
                assert_ne!(new_pid, pid, "a dead master's sockets were handed out");
                let status = json(&socks.node_sock, "/v1/status").await;
                assert_eq!(status["node"], "da2", "{status}");
                let (_, e) = link.stats().last_error.expect("the loss is recorded");
                assert!(e.contains("master"), "{e}");
                link.close().await;
            });
        },
    );
}

#[test]
fn a_masters_exit_takes_the_link_down_at_once_and_it_comes_back_by_itself() {
    cluster_test(
        "a_masters_exit_takes_the_link_down_at_once_and_it_comes_back_by_itself",
        |ctx| {
            rt().block_on(async {
                // Health looks a minute apart and nobody calls ensure_up:
                // only the watch on the master's process can see its death.
                let slow = slow_health();
                let link =
                    NodeLink::new(ctx.config("da4", &ctx.known_hosts()), slow).expect("config");
                link.start();
                wait_state(&link, "up", Duration::from_secs(15)).await;
                let pid = link.master_pid().expect("pid");
                let before = link.stats().failures;
                kill9(pid);
                let noticed = wait_for_failure(&link, before, Duration::from_secs(2)).await;
                let (_, e) = link.stats().last_error.expect("the loss is recorded");
                println!("TIMING master killed -> link down {noticed:?}: {e}");
                assert!(e.contains("da4") && e.contains("ssh master exited"), "{e}");
                // Re-made after the backoff, without anyone asking.
                wait_state(&link, "up", Duration::from_secs(15)).await;
                let new_pid = link.master_pid().expect("new pid");
                assert_ne!(new_pid, pid);
                link.close().await;
            });
        },
    );
}

const DYING: &str = "GPUQ_NODELINK_DYING_BROKER";
const DYING_BROKER: &str = "helper_a_broker_that_dies_with_its_link_up";

/// Not a test on its own: run only by the test above (`--ignored`, with
/// `GPUQ_NODELINK_DYING_BROKER` set, inside cxl2's namespace), it brings
/// da1's link up, prints the master's PID and waits to be killed. Ignored
/// in a plain run, so it never counts as a pass; run any other way it fails.
#[test]
#[ignore = "a helper process of lost_links_go_down_with_the_error_and_come_back_with_backoff"]
fn helper_a_broker_that_dies_with_its_link_up() {
    assert!(
        std::env::var_os(DYING).is_some(),
        "{DYING_BROKER} is a helper process, started by lost_links_go_down_with_the_error_and_come_back_with_backoff"
    );
    let ctx = Ctx {
        dir: std::env::var_os(CHILD).expect("dir").into(),
        prefix: String::new(),
    };
    rt().block_on(async {
        let link = NodeLink::new(ctx.config("da1", &ctx.known_hosts()), timings()).expect("config");
        link.ensure_up(Duration::from_secs(15)).await.expect("up");
        println!("MASTER {}", link.master_pid().expect("pid"));
        tokio::time::sleep(Duration::from_secs(60)).await;
        std::process::exit(3);
    });
}

/// Wait until the link has failed more than `failures` times; returns when.
/// Health looks a minute apart: what a test sees sooner, something else
/// noticed.
fn slow_health() -> Timings {
    Timings {
        health_interval: Duration::from_secs(60),
        ..timings()
    }
}

/// SIGKILL a process we know by its PID (an ssh master).
fn kill9(pid: u32) {
    let st = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -9 {pid}");
}

async fn wait_for_failure(link: &NodeLink, failures: u64, within: Duration) -> Duration {
    let t = Instant::now();
    while link.stats().failures <= failures {
        assert!(
            t.elapsed() < within,
            "{}: no failure within {within:?}; now {}",
            link.name(),
            link.state()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t.elapsed()
}

fn ip(ns: &str, updown: &str) {
    let st = Command::new("ip")
        .args(["-n", ns, "link", "set", "eth0", updown])
        .status()
        .expect("ip");
    assert!(st.success(), "ip -n {ns} link set eth0 {updown}");
}

/// A link closed while its ssh master is still being made (the broker
/// stopping, or a lease given up, during a connect) leaves no master behind.
/// The feared leak: ssh goes on authenticating after the connect future is
/// dropped (openssh spawns `ssh -M -f` without kill-on-drop), and with
/// `ControlPersist=yes` its master would outlive the broker. What prevents
/// it: dropping the future also removes openssh's temporary control dir,
/// so that ssh cannot bind its control socket and exits; and `close`, once
/// the supervisor has stopped, ends every root process whose command line
/// names the link's control dir (a master that had bound its socket just
/// before the drop: seen once in a clean-clone rehearsal, closed 200 ms
/// after the start, the master still there 3 s later). This pins
/// that down, closing at several points of the connect (a connect to a
/// test node takes about 150-400 ms); then nothing of the link may run, and
/// the parent checks again once the child has exited.
#[test]
fn a_link_closed_during_its_connect_leaves_no_ssh_master() {
    cluster_test(
        "a_link_closed_during_its_connect_leaves_no_ssh_master",
        |ctx| {
            rt().block_on(async {
                let fwd = ctx.forward_dir();
                for delay_ms in [0u64, 20, 50, 100, 150, 200, 300, 500] {
                    let link = NodeLink::new(ctx.config("da2", &ctx.known_hosts()), timings())
                        .expect("config");
                    link.start();
                    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
                    link.close().await;
                    // Long enough for a connect that went on to finish.
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    let left = cluster::pids_mentioning(&fwd.to_string_lossy());
                    assert!(
                        left.is_empty(),
                        "closed {delay_ms} ms after its start, the link left {left:?}"
                    );
                    assert_eq!(sockets_in(&fwd), Vec::<PathBuf>::new(), "sockets left");
                }
            })
        },
    );
}
