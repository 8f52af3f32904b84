//! The lease lifecycle against the real test cluster: four real node
//! helpers, four simulated DAOS servers, a real broker reading the hold.

use gpuq_lease::{CleanupStep, Lease, LeaseStore};
use gpuq_lifecycle::{Lifecycle, LifecycleError, LocalError, LocalSteps, Node};
use gpuq_system_tests::cluster::*;
use gpuq_system_tests::*;
use std::path::{Path, PathBuf};

/// This version has no job unit, clients or agent of a DAOS job yet: the
/// broker-local steps have nothing to end, and say so in the lease record.
struct NothingLocal;

#[async_trait::async_trait]
impl LocalSteps for NothingLocal {
    async fn kill_job(&self, _lease: &Lease) -> Result<String, LocalError> {
        Ok("no job of this lease runs on the broker host in this test".into())
    }
}

fn lifecycle(c: &Cluster, state: &Path) -> Lifecycle {
    let (store, held) = LeaseStore::open(state, 0).unwrap();
    assert!(held.is_none());
    Lifecycle {
        tls: None,
        dmg: None,
        store,
        nodes: NODES
            .iter()
            .map(|n| Node::new(*n, c.node_sock(n)))
            .collect(),
        profile: "test".into(),
        replicas: vec![addr("da1").to_string()],
        deadlines: Default::default(),
        host: None,
        kind: Default::default(),
        nfs: None,
    }
}

fn node_lease(c: &Cluster, n: &str) -> serde_json::Value {
    let (code, body) = c.http(&c.node_sock(n), "GET", "/v1/status", None);
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["lease"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_prepares_on_all_four_nodes_and_cleanup_releases_it() {
    require_cluster_env!();
    let (archive, image) = sim_image();
    let c = Cluster::up_with(
        "lc",
        &[
            ("GPUQ_CLUSTER_IMAGE", &archive),
            ("GPUQ_CLUSTER_PROFILE_IMAGE", &image),
        ],
    );
    let state = tempfile::tempdir().unwrap();
    let lc = lifecycle(&c, state.path());
    let mut lease = lc.prepare("L1", "job 1", &NothingLocal).await.unwrap();
    assert!(state.path().join("active.json").exists());
    for n in NODES {
        assert_eq!(node_lease(&c, n)["lease"], "L1", "{n}");
    }
    lc.cleanup(&mut lease, &NothingLocal).await.unwrap();
    assert!(
        !state.path().join("active.json").exists() && !state.path().join("blocked.json").exists()
    );
    for n in NODES {
        assert!(node_lease(&c, n).is_null(), "{n} still holds the lease");
        assert!(!c.dir().join(n).join("test/L1").exists());
    }
    let record = lc.store.load("L1").unwrap();
    assert_eq!(record.done, CleanupStep::ALL);
    c.down();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_preflight_names_every_node_and_starts_nothing() {
    require_cluster_env!();
    // The pin exists nowhere: every node refuses with image_missing.
    let pin = format!("sha256:{}", "cd".repeat(32));
    let c = Cluster::up_with("lcref", &[("GPUQ_CLUSTER_PROFILE_IMAGE", &pin)]);
    let state = tempfile::tempdir().unwrap();
    let lc = lifecycle(&c, state.path());
    let e = lc.prepare("L2", "job 2", &NothingLocal).await.unwrap_err();
    let LifecycleError::Refused { reasons, .. } = &e else {
        panic!("{e}")
    };
    for n in NODES {
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with(&format!("{n}: image_missing"))),
            "{reasons:?}"
        );
        assert!(node_lease(&c, n).is_null(), "{n} got a lease record");
    }
    assert!(!state.path().join("active.json").exists(), "released");
    assert!(
        !state.path().join("blocked.json").exists(),
        "not held: nothing was started"
    );
    c.down();
}

fn start_node_helper(c: &Cluster, n: &str) -> std::process::Child {
    // The killed helper left its socket file behind; the new one replaces it.
    let child = std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", c.id.namespace(n)))
        .arg(bin("gpuq-node"))
        .arg("--config")
        .arg(c.dir().join(n).join("etc/node.toml"))
        .arg("serve")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(10, || c.http(&c.node_sock(n), "GET", "/v1/status", None).0
            == 200),
        "{n}'s helper did not come back"
    );
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_stop_holds_every_job_until_recover() {
    require_cluster_env!();
    let (archive, image) = sim_image();
    let c = Cluster::up_with(
        "lchold",
        &[
            ("GPUQ_CLUSTER_IMAGE", &archive),
            ("GPUQ_CLUSTER_PROFILE_IMAGE", &image),
        ],
    );
    // The broker's state dir is where the lease records go: its gate reads blocked.json.
    let broker = TestBroker::start();
    let state: PathBuf = broker.path("state");
    let lc = lifecycle(&c, &state);
    let mut lease = lc.prepare("L3", "job 3", &NothingLocal).await.unwrap();

    // da3's helper dies: its server can no longer be stopped through it.
    let pid = c.recorded_pid("da3", "node").expect("da3's helper pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(10, || !alive(pid)));
    let e = lc.cleanup(&mut lease, &NothingLocal).await.unwrap_err();
    assert!(
        matches!(&e, LifecycleError::Held { step, failures, .. }
        if step == "stop_servers" && failures.iter().any(|f| f.starts_with("da3: "))),
        "{e}"
    );
    let blocked = lc.store.blocked().unwrap().expect("held");
    assert_eq!(
        (blocked.lease.as_str(), blocked.node.as_deref()),
        ("L3", Some("da3"))
    );

    // No job of any kind starts while held; `gpuq list` says why.
    let w = broker.workdir(None, "w");
    let job = broker.submit(ROOT, &w, &["--", "touch", "ran"]);
    let list = || stdout(&broker.gpuq(ROOT, &["list"]));
    assert!(
        eventually(5, || list().contains("HOLD: lease L3")),
        "{}",
        list()
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert_eq!(broker.state(job), "queued");
    assert!(!w.join("ran").exists());

    // Recover while da3 is still down: still held.
    let again = lc.recover(None, &NothingLocal).await.unwrap_err();
    assert!(matches!(again, LifecycleError::Held { .. }), "{again}");
    // da3's helper comes back; recover resumes at StopServers and releases.
    let mut helper = start_node_helper(&c, "da3");
    let released = lc.recover(None, &NothingLocal).await.unwrap();
    assert_eq!(released, "L3");
    assert!(lc.store.blocked().unwrap().is_none());
    for n in NODES {
        assert!(node_lease(&c, n).is_null(), "{n}");
    }
    broker.wait_state(job, "completed", 30);
    assert!(w.join("ran").exists());
    let _ = helper.kill();
    let _ = helper.wait();
    c.down();
}
