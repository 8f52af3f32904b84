//! A node wipe decides from the lease record alone (issue #13, item 3): a
//! helper restarted on a configuration that no longer agrees with the
//! record — the profile renamed, its mode changed, the allowlist changed, the
//! record missing or without a mode — refuses, touches nothing and keeps the
//! record; once the configuration is restored the same wipe (the broker's
//! `recover`) discards and releases. And the claims of `gpuq activate
//! --execute` (issue #17): an activation discards what the site had (the
//! audited wipe, reason `activation`) and claims the devices; physical mode
//! starts and wipes only claimed devices; a refusal anywhere discards
//! nothing and claims nothing.
//!
//! Real parts: a `podman system service` of its own (preflight and stop ask
//! it), loop devices made non-rotational (the block-device checks, the
//! discard and its verification run on them, `allow_loop_devices`), and each
//! "restart" is a new `NodeService` on the `node.toml` rewritten on disk.
//! Each test runs as its own node in a new network namespace, as in
//! `node_podman.rs` (preflight counts every DAOS process and port of its
//! namespace), and panics — never skips — when root, podman or losetup is
//! missing.
//!
//! Physical mode: a physical server container cannot start on this host
//! (memlock hard limit 8 MiB, and a loop device has no PCI address for
//! `daos_server.yml`'s `bdev_list`), so the physical start here is the real
//! `start`, which runs preflight, writes the lease record with the devices
//! it found and creates the metadata directory, and then fails rendering
//! `daos_server.yml` — a lease whose devices must still be wiped on cleanup,
//! exactly what a start failing later on a real node leaves.

#[path = "../../gpuq-blockdev/tests/common/mod.rs"]
mod common;

use common::{LoopDev, MIB};
use gpuq_nodesvc::profile::ServiceConfig;
use gpuq_nodesvc::service::{NodeError, NodeService};
use gpuq_podman::LibpodClient;
use gpuq_podman_harness::{PodmanService, TestImage};
use gpuq_protocol::node::{ActivationReport, ActivationRequest, StartRequest};
use serde_json::Value;
use std::path::PathBuf;

use gpuq_podman_harness::{as_own_node, as_own_node_env};

/// A server that says what DAOS says when it awaits its format, then idles.
const SERVER: &str =
    "trap 'exit 0' TERM; echo server up; echo 'SCM format required on instance 0'; while :; do sleep 1; done";

/// One storage node: its own directories, Podman service and image.
struct Site {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    podman: PodmanService,
    image: String,
    port: u16,
}

impl Site {
    async fn new() -> Site {
        let podman = PodmanService::start();
        let client = podman.client().await;
        let image = TestImage::build("server", None);
        podman.load_image(&client, &image).await;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Site {
            _tmp: tmp,
            root,
            podman,
            image: image.id.to_string(),
            port,
        }
    }

    /// Write `node.toml` with one profile `name` of `mode` and the
    /// `[[devices]]` tables `devices`, and start a helper on it (a helper
    /// restart: a new service reading the file as it is now).
    async fn helper(
        &self,
        name: &str,
        mode: &str,
        devices: &[&LoopDev],
    ) -> NodeService<LibpodClient> {
        self.helper_with(name, mode, devices, "").await
    }

    /// [`Site::helper`] with `extra` TOML tables after the devices.
    async fn helper_with(
        &self,
        name: &str,
        mode: &str,
        devices: &[&LoopDev],
        extra: &str,
    ) -> NodeService<LibpodClient> {
        let mut text = format!(
            r#"
[node]
name = "da1"
socket = "{root}/node.sock"
podman_socket = "{sock}"
jobs_dir = "{root}/jobs"
test_dir = "{root}/test"
allow_loop_devices = true

[profiles.{name}]
image = "{image}"
daos_version = "2.8.0"
mode = "{mode}"
port = {port}
fabric_iface = "lo"
command = ["sh", "-c", "{script}"]
stop_grace_secs = 5
format_wait_secs = 60
"#,
            root = self.root.display(),
            sock = self.podman.socket.display(),
            image = self.image,
            port = self.port,
            script = SERVER.replace('"', "\\\""),
        );
        for d in devices {
            text.push_str(&format!(
                "\n[[devices]]\nloop_backing_file = \"{}\"\n",
                d.backing.display()
            ));
        }
        text.push_str(extra);
        let path = self.root.join("node.toml");
        std::fs::write(&path, text).unwrap();
        let cfg = ServiceConfig::load(&path).unwrap();
        NodeService::new(cfg, self.podman.client().await)
    }

    /// The names of gpuq's containers on this node's Podman.
    async fn containers(&self) -> Vec<String> {
        use gpuq_podman::Podman;
        self.podman
            .client()
            .await
            .container_list(&gpuq_podman::LabelFilter::ours())
            .await
            .expect("container list")
            .into_iter()
            .flat_map(|c| c.names)
            .collect()
    }

    fn jobs(&self, f: &str) -> PathBuf {
        self.root.join("jobs").join(f)
    }

    /// The names in `jobs_dir`, sorted (what a refused step must not change).
    fn jobs_listing(&self) -> Vec<String> {
        let mut l: Vec<String> = std::fs::read_dir(self.root.join("jobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        l.sort();
        l
    }

    /// `lease.json` as JSON (read as a value: the test also runs against
    /// the helper before the fix, whose record type has no mode).
    fn record(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.jobs("lease.json")).expect("lease.json"))
            .unwrap()
    }

    /// (step, result) of every audit line of `lease`.
    fn audit(&self, lease: &str) -> Vec<String> {
        std::fs::read_to_string(self.jobs(&format!("{lease}/audit.jsonl")))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| {
                format!(
                    "{}:{}",
                    v["step"].as_str().unwrap(),
                    v["result"].as_str().unwrap()
                )
            })
            .collect()
    }
}

/// A start request as the broker sends it: with the lease's certificates.
fn req(profile: &str) -> StartRequest {
    let c = gpuq_leasecert::LeaseCerts::generate("L-test").expect("lease certificates");
    StartRequest {
        profile: profile.into(),
        replicas: vec!["da1".into()],
        tls: Some(gpuq_protocol::node::ServerTls {
            ca_cert: c.ca_cert.clone(),
            cert: c.server.cert.clone(),
            key: c.server.key.clone(),
            agent_cert: c.agent.cert.clone(),
        }),
        dmg: Some(gpuq_protocol::node::DmgAccess {
            system: "daos_server".into(),
            hostlist: vec!["10.99.0.1".into()],
            admin_cert: c.admin.cert.clone(),
            admin_key: c.admin.key.clone(),
        }),
    }
}

/// What a device holds: its edge hashes (first and last MiB of the backing
/// file, the pattern `LoopDev` writes) and its allocated bytes.
fn content(d: &LoopDev) -> ((u64, u64), u64) {
    (d.edge_hash(), d.allocated())
}

/// The refusal the broker holds on: a 409, naming the node and `want`, and
/// telling the operator to recover.
fn assert_refused(e: NodeError, want: &str) -> String {
    let msg = e.to_string();
    assert!(matches!(e, NodeError::Refused(_)), "not a refusal: {msg}");
    assert!(
        msg.contains("node da1") && msg.contains(want) && msg.contains("gpuq recover"),
        "{want:?} not in: {msg}"
    );
    eprintln!("refused, as it must be: {msg}");
    msg
}

/// Claim the allowlisted devices as `gpuq activate --execute` does on a node
/// (the real activation: checks, discard, audit, claim record).
async fn activate(svc: &NodeService<LibpodClient>, name: &str) -> ActivationReport {
    gpuq_nodesvc::activation::execute(
        svc,
        &ActivationRequest {
            activation: name.into(),
        },
    )
    .await
    .expect("activation")
}

/// Start `lease` in physical mode on the allowlisted loop devices, claimed
/// first by an activation: the real start, which fails after the record
/// and the metadata dir are written (see the module comment), then the
/// confirmed stop (nothing to stop); then what the lease left on each
/// device (its first MiB written).
async fn physical_lease(
    svc: &NodeService<LibpodClient>,
    site: &Site,
    lease: &str,
    devices: &[&LoopDev],
) {
    if !site.jobs("claim.json").exists() {
        activate(svc, "activation-1").await;
    }
    let e = svc.start(lease, &req("inst1")).await.unwrap_err();
    assert!(
        e.to_string().contains("PCI address"),
        "the physical start should fail only at daos_server.yml: {e}"
    );
    assert!(site.jobs(&format!("{lease}/control_meta")).is_dir());
    assert_eq!(site.record()["lease"], lease);
    svc.stop(lease).await.unwrap();
    for d in devices {
        d.write_data(0, MIB as usize);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_physical_profile_holds_the_wipe_until_the_config_is_restored() {
    if !as_own_node("a_renamed_physical_profile_holds_the_wipe_until_the_config_is_restored") {
        return;
    }
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    dev.write_data(8 * MIB, 64 * 1024);
    let svc = site.helper("inst1", "physical", &[&dev]).await;
    physical_lease(&svc, &site, "L1", &[&dev]).await;
    // The record says the mode and the device, as found by preflight.
    let rec = site.record();
    assert_eq!(rec["mode"], "physical", "{rec}");
    assert_eq!(rec["devices"].as_array().map(Vec::len), Some(1), "{rec}");
    assert_eq!(
        rec["devices"][0]["loop_backing_file"],
        dev.backing.display().to_string()
    );
    assert_eq!(rec["devices"][0]["size_bytes"], 64 * MIB);
    let before = content(&dev);
    let record_bytes = std::fs::read(site.jobs("lease.json")).unwrap();

    // Restarted with the profile renamed, then with its mode changed to test:
    // both refuse, and neither touches the device, the metadata or the record.
    for (name, mode, want) in [
        ("inst1-renamed", "physical", "profile 'inst1'"),
        ("inst1", "test", "now test mode"),
    ] {
        let restarted = site.helper(name, mode, &[&dev]).await;
        let msg = assert_refused(restarted.wipe("L1").await.unwrap_err(), want);
        assert!(msg.contains("restore profile 'inst1'"), "{msg}");
        assert_eq!(content(&dev), before, "the device was touched");
        assert!(site.jobs("L1/control_meta").is_dir());
        assert_eq!(
            std::fs::read(site.jobs("lease.json")).unwrap(),
            record_bytes
        );
        assert_eq!(
            std::fs::read_to_string(site.jobs("active-lease")).unwrap(),
            "L1"
        );
    }
    assert_eq!(site.audit("L1"), ["wipe:refused", "wipe:refused"]);

    // The operator restores node.toml and restarts the helper: `recover`
    // repeats the wipe, which discards the device and releases the lease.
    let restored = site.helper("inst1", "physical", &[&dev]).await;
    let done = restored.wipe("L1").await.unwrap();
    assert!(
        !done.already_done && done.detail.contains("discarded 1 device"),
        "{done:?}"
    );
    assert!(
        dev.head_is_zero(MIB as usize),
        "the device was not discarded"
    );
    assert_ne!(dev.edge_hash(), before.0);
    assert!(
        dev.allocated() < before.1,
        "{} !< {}",
        dev.allocated(),
        before.1
    );
    assert!(!site.jobs("lease.json").exists() && !site.jobs("active-lease").exists());
    assert!(!site.jobs("L1/control_meta").exists());
    assert!(restored.wipe("L1").await.unwrap().already_done);
    assert_eq!(
        site.audit("L1"),
        [
            "wipe:refused",
            "wipe:refused",
            "wipe:ok",
            "release:ok",
            "wipe:repeat"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_test_profile_keeps_its_test_dir_until_the_config_is_restored() {
    if !as_own_node("a_renamed_test_profile_keeps_its_test_dir_until_the_config_is_restored") {
        return;
    }
    let site = Site::new().await;
    let svc = site.helper("t1", "test", &[]).await;
    let started = svc.start("L2", &req("t1")).await.unwrap();
    assert_eq!(site.record()["mode"], "test");
    let data = PathBuf::from(&started.metadata_dir);
    std::fs::write(data.join("what-the-job-left"), "pool data").unwrap();
    svc.stop("L2").await.unwrap();
    let record_bytes = std::fs::read(site.jobs("lease.json")).unwrap();

    let restarted = site.helper("t1-renamed", "test", &[]).await;
    assert_refused(restarted.wipe("L2").await.unwrap_err(), "profile 't1'");
    assert_eq!(
        std::fs::read_to_string(data.join("what-the-job-left")).unwrap(),
        "pool data",
        "the test dir was touched"
    );
    assert_eq!(
        std::fs::read(site.jobs("lease.json")).unwrap(),
        record_bytes
    );
    assert_eq!(
        std::fs::read_to_string(site.jobs("active-lease")).unwrap(),
        "L2"
    );

    let restored = site.helper("t1", "test", &[]).await;
    let done = restored.wipe("L2").await.unwrap();
    assert!(!done.already_done, "{done:?}");
    assert!(
        !data.exists(),
        "the test dir is removed once the config is back"
    );
    assert!(!site.jobs("lease.json").exists() && !site.jobs("active-lease").exists());
    assert_eq!(
        site.audit("L2"),
        [
            "start:ok",
            "stop:ok",
            "wipe:refused",
            "wipe:ok",
            "release:ok"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_modeless_record_refuses_and_touches_nothing() {
    if !as_own_node("a_missing_or_modeless_record_refuses_and_touches_nothing") {
        return;
    }
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    let svc = site.helper("inst1", "physical", &[&dev]).await;
    physical_lease(&svc, &site, "L3", &[&dev]).await;
    let before = content(&dev);
    let record_bytes = std::fs::read(site.jobs("lease.json")).unwrap();

    // A record in the older helper's format: no mode, no devices.
    let mut old = site.record();
    let o = old.as_object_mut().unwrap();
    o.remove("mode");
    o.remove("devices");
    std::fs::write(site.jobs("lease.json"), serde_json::to_vec(&old).unwrap()).unwrap();
    assert_refused(svc.wipe("L3").await.unwrap_err(), "no wipe mode");
    // A mode this helper does not know.
    old["mode"] = "tape".into();
    std::fs::write(site.jobs("lease.json"), serde_json::to_vec(&old).unwrap()).unwrap();
    assert_refused(svc.wipe("L3").await.unwrap_err(), "unknown wipe mode");
    // Only active-lease left (a record half-written by an older helper).
    std::fs::remove_file(site.jobs("lease.json")).unwrap();
    assert_refused(svc.wipe("L3").await.unwrap_err(), "no wipe mode");
    // No record at all, but the lease's metadata dir is left.
    std::fs::remove_file(site.jobs("active-lease")).unwrap();
    assert_refused(svc.wipe("L3").await.unwrap_err(), "no lease record");
    assert_eq!(content(&dev), before, "the device was touched");
    assert!(site.jobs("L3/control_meta").is_dir());

    // The same for a test-mode lease's directory without a record.
    let test_dir = site.root.join("test/L4");
    std::fs::create_dir_all(&test_dir).unwrap();
    std::fs::write(test_dir.join("bdev0"), "x").unwrap();
    let e = svc.wipe("L4").await.unwrap_err();
    assert_refused(e, "no lease record");
    assert_eq!(
        std::fs::read_to_string(test_dir.join("bdev0")).unwrap(),
        "x"
    );
    std::fs::remove_dir_all(&test_dir).unwrap();

    // The operator puts the record back — only lease.json, which is also
    // what a crash between the release's two removals leaves (active-lease
    // goes first): the wipe discards and releases.
    std::fs::write(site.jobs("lease.json"), &record_bytes).unwrap();
    svc.wipe("L3").await.unwrap();
    assert!(!site.jobs("active-lease").exists());
    assert!(
        dev.head_is_zero(MIB as usize),
        "the device was not discarded"
    );
    assert!(!site.jobs("lease.json").exists() && !site.jobs("L3/control_meta").exists());
    assert_eq!(
        site.audit("L3"),
        [
            "wipe:refused",
            "wipe:refused",
            "wipe:refused",
            "wipe:refused",
            "wipe:ok",
            "release:ok"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_changed_to_other_devices_refuses_and_touches_none() {
    if !as_own_node("an_allowlist_changed_to_other_devices_refuses_and_touches_none") {
        return;
    }
    let site = Site::new().await;
    let mine = LoopDev::new(64 * MIB);
    let other = LoopDev::new(64 * MIB);
    let svc = site.helper("inst1", "physical", &[&mine]).await;
    physical_lease(&svc, &site, "L5", &[&mine]).await;
    let (mine_before, other_before) = (content(&mine), content(&other));

    // Restarted with the allowlist naming another device, then both.
    for (devices, want) in [
        (vec![&other], "not allowlisted now"),
        (vec![&mine, &other], "allowlisted but not the lease's"),
    ] {
        let restarted = site.helper("inst1", "physical", &devices).await;
        let msg = assert_refused(restarted.wipe("L5").await.unwrap_err(), want);
        assert!(msg.contains(&mine.backing.display().to_string()), "{msg}");
        assert_eq!(
            content(&mine),
            mine_before,
            "the lease's device was touched"
        );
        assert_eq!(content(&other), other_before, "another device was touched");
        assert!(site.jobs("lease.json").exists());
    }

    // Restored: exactly the lease's device is discarded.
    let restored = site.helper("inst1", "physical", &[&mine]).await;
    restored.wipe("L5").await.unwrap();
    assert!(
        mine.head_is_zero(MIB as usize),
        "the lease's device was not discarded"
    );
    assert_eq!(content(&other), other_before, "another device was touched");
    assert!(!site.jobs("lease.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physical_profile_without_devices_is_refused_before_anything_is_created() {
    if !as_own_node("a_physical_profile_without_devices_is_refused_before_anything_is_created") {
        return;
    }
    let site = Site::new().await;
    let svc = site.helper("inst1", "physical", &[]).await;
    let report = svc
        .preflight(&gpuq_protocol::node::PreflightRequest {
            lease: "L6".into(),
            profile: "inst1".into(),
        })
        .await
        .unwrap();
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.reason == "device_refused" && f.detail.contains("allowlists no device")),
        "{report:?}"
    );
    let e = svc.start("L6", &req("inst1")).await.unwrap_err();
    assert!(matches!(e, NodeError::Preflight { .. }), "{e}");
    assert!(!site.root.join("jobs").exists(), "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physical_start_without_the_leases_certificates_is_refused_before_anything_is_written() {
    if !as_own_node(
        "a_physical_start_without_the_leases_certificates_is_refused_before_anything_is_written",
    ) {
        return;
    }
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    dev.write_data(8 * MIB, 64 * 1024);
    let before = content(&dev);
    let svc = site.helper("inst1", "physical", &[&dev]).await;
    let insecure = StartRequest {
        tls: None,
        ..req("inst1")
    };
    let e = svc.start("L7", &insecure).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, NodeError::Refused(_)), "not a refusal: {msg}");
    assert!(msg.contains("TLS") && msg.contains("physical"), "{msg}");
    assert!(
        !site.root.join("jobs").exists(),
        "nothing was written: {msg}"
    );
    assert_eq!(content(&dev), before, "the device was touched");
    let made = site.containers().await;
    assert!(made.is_empty(), "a container was made: {made:?}");
}

/// DAOS refuses to start where the node's RAM cannot hold the ram-disk
/// beside its reservation (docs/daos-facts.md): a profile that cannot fit
/// this node (a 1 PiB ram-disk, on any machine) is refused before anything
/// is written or started, and names the node's memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_the_nodes_memory_cannot_hold_is_refused_before_anything_is_written() {
    if !as_own_node("a_profile_the_nodes_memory_cannot_hold_is_refused_before_anything_is_written")
    {
        return;
    }
    let site = Site::new().await;
    let huge = format!(
        "\n[profiles.huge]\nimage = \"{}\"\ndaos_version = \"2.8.0\"\nmode = \"test\"\nport = {}\nfabric_iface = \"lo\"\nscm_size_gib = 1048576\n",
        site.image, site.port
    );
    let svc = site.helper_with("t1", "test", &[], &huge).await;
    let e = svc.start("L9", &req("huge")).await.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, NodeError::Refused(_)), "not a refusal: {msg}");
    assert!(
        msg.contains("does not fit this node's memory") && msg.contains("MiB of RAM"),
        "{msg}"
    );
    assert!(
        !site.root.join("jobs").exists(),
        "nothing was written: {msg}"
    );
    assert!(
        !site.root.join("test").join("L9").exists(),
        "no test dir: {msg}"
    );
    let made = site.containers().await;
    assert!(made.is_empty(), "a container was made: {made:?}");
    // The same node starts a profile that fits.
    svc.start("L10", &req("t1")).await.unwrap();
    svc.stop("L10").await.unwrap();
    svc.wipe("L10").await.unwrap();
}

/// `chattr +i` on a file for as long as it lives (also when the test panics).
struct Immutable(PathBuf);

impl Immutable {
    fn set(p: PathBuf) -> Immutable {
        let ok = std::process::Command::new("chattr")
            .arg("+i")
            .arg(&p)
            .status()
            .expect("run chattr (e2fsprogs)")
            .success();
        assert!(ok, "chattr +i {} failed", p.display());
        Immutable(p)
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_between_its_two_removals_leaves_a_wipe_that_can_be_repeated() {
    if !as_own_node("a_release_cut_between_its_two_removals_leaves_a_wipe_that_can_be_repeated") {
        return;
    }
    let site = Site::new().await;
    let svc = site.helper("t1", "test", &[]).await;
    svc.start("L7", &req("t1")).await.unwrap();
    svc.stop("L7").await.unwrap();
    // The release cannot remove active-lease (immutable): the wipe fails
    // there, and what is left must still say how to wipe — lease.json.
    let pinned = Immutable::set(site.jobs("active-lease"));
    let e = svc.wipe("L7").await.unwrap_err();
    assert!(e.to_string().contains("remove active-lease"), "{e}");
    assert_eq!(site.record()["mode"], "test", "the whole record is left");
    drop(pinned);
    // The broker's retry finishes the wipe and the release.
    let done = svc.wipe("L7").await.unwrap();
    assert!(!done.already_done, "{done:?}");
    assert!(!site.jobs("lease.json").exists() && !site.jobs("active-lease").exists());
}

// ── claims (issue #17): an activation discards, audits and claims; physical
// mode starts and wipes only claimed devices ─────────────────────────────

/// Every audit record the activation wrote for a device, as JSON.
fn activation_records(site: &Site, activation: &str) -> Vec<Value> {
    let mut out: Vec<Value> = std::fs::read_dir(site.jobs(activation))
        .expect("the activation's audit directory")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("wipe-")
        })
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    out.sort_by_key(|v| v["device"]["path"].to_string());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclaimed_device_is_refused_by_preflight_and_start_and_nothing_is_touched() {
    if !as_own_node("an_unclaimed_device_is_refused_by_preflight_and_start_and_nothing_is_touched")
    {
        return;
    }
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    dev.write_data(8 * MIB, 64 * 1024);
    let before = content(&dev);
    let svc = site.helper("inst1", "physical", &[&dev]).await;
    let report = svc
        .preflight(&gpuq_protocol::node::PreflightRequest {
            lease: "L8".into(),
            profile: "inst1".into(),
        })
        .await
        .unwrap();
    assert!(
        !report.ok
            && report.findings.iter().any(|f| f.reason == "unclaimed"
                && f.detail.contains("claim.json")
                && f.detail.contains("gpuq activate")),
        "{report:?}"
    );
    let e = svc.start("L8", &req("inst1")).await.unwrap_err();
    assert!(
        matches!(e, NodeError::Preflight { .. }) && e.to_string().contains("unclaimed"),
        "{e}"
    );
    assert!(!site.root.join("jobs").exists(), "nothing was written");
    assert_eq!(content(&dev), before, "the device was touched");
    assert!(site.containers().await.is_empty());

    // A claim that names another device is no claim for this one.
    let other = LoopDev::new(64 * MIB);
    let claimer = site.helper("inst1", "physical", &[&other]).await;
    activate(&claimer, "activation-other").await;
    let svc = site.helper("inst1", "physical", &[&dev]).await;
    let e = svc.start("L8", &req("inst1")).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("is not claimed (claim of activation-other)")
            && e.to_string().contains(&dev.backing.display().to_string()),
        "{e}"
    );
    assert!(!site.jobs("lease.json").exists(), "no lease record");
    assert_eq!(content(&dev), before, "the device was touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_discards_what_the_site_had_audits_and_claims_and_a_repeat_does_nothing() {
    if !as_own_node(
        "an_activation_discards_what_the_site_had_audits_and_claims_and_a_repeat_does_nothing",
    ) {
        return;
    }
    let site = Site::new().await;
    let with_fs = LoopDev::new(64 * MIB);
    with_fs.mkfs("mkfs.ext4", &["-q", "-F"]);
    let plain = LoopDev::new(64 * MIB);
    let svc = site.helper("inst1", "physical", &[&with_fs, &plain]).await;

    let r = activate(&svc, "activation-7").await;
    assert!(!r.already_claimed, "{r:?}");
    let done = r.done.join("\n");
    assert!(
        done.contains(&format!("discarded {}", with_fs.dev_str())) && done.contains("ext4"),
        "{done}"
    );
    assert!(
        done.contains(&format!("discarded {}", plain.dev_str())),
        "{done}"
    );
    assert!(done.contains("claimed 2 device(s)"), "{done}");
    // Both discarded: the ext4 and the pattern are gone.
    assert!(with_fs.head_is_zero(MIB as usize) && plain.head_is_zero(MIB as usize));
    // Audited per device, reason `activation`, the ext4 named.
    let recs = activation_records(&site, "activation-7");
    assert_eq!(recs.len(), 2, "{recs:?}");
    for v in &recs {
        assert_eq!(v["reason"], "activation", "{v}");
        assert_eq!(v["lease"], "activation-7", "{v}");
        assert_eq!(v["result"], "wiped", "{v}");
    }
    assert!(
        recs.iter().any(|v| v.to_string().contains("ext4")),
        "{recs:?}"
    );
    // The claim: durable, root only, naming both by identity and size.
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(site.jobs("claim.json")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let claim: Value =
        serde_json::from_slice(&std::fs::read(site.jobs("claim.json")).unwrap()).unwrap();
    assert_eq!(claim["activation"], "activation-7");
    let files: Vec<&str> = claim["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["loop_backing_file"].as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            with_fs.backing.to_str().unwrap(),
            plain.backing.to_str().unwrap()
        ]
    );
    let claim_bytes = std::fs::read(site.jobs("claim.json")).unwrap();

    // Run again (a resumed activation): nothing is discarded or rewritten.
    plain.write_data(0, MIB as usize);
    let before = content(&plain);
    let again = activate(&svc, "activation-8").await;
    assert!(again.already_claimed, "{again:?}");
    assert!(again.done[0].contains("already claimed by activation activation-7"));
    assert_eq!(
        content(&plain),
        before,
        "a claimed node was discarded again"
    );
    assert_eq!(std::fs::read(site.jobs("claim.json")).unwrap(), claim_bytes);
    assert!(
        !site.jobs("activation-8").exists(),
        "nothing of a no-op is written"
    );
    // And the plan says so.
    let plan = gpuq_nodesvc::activation::plan(svc.config()).await;
    assert!(
        plan.steps.len() == 1
            && plan.steps[0].contains("already claimed")
            && plan.refusals.is_empty(),
        "{:?}",
        plan.steps
    );
    // Physical mode may use them now.
    let ok = svc
        .preflight(&gpuq_protocol::node::PreflightRequest {
            lease: "L9".into(),
            profile: "inst1".into(),
        })
        .await
        .unwrap();
    assert!(
        !ok.findings.iter().any(|f| f.reason == "unclaimed"),
        "{ok:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_that_would_refuse_anywhere_discards_nothing_and_claims_nothing() {
    // No systemd to ask, on any machine: the child's system bus address
    // leads nowhere (zbus reads DBUS_SYSTEM_BUS_ADDRESS), so the unit
    // sub-check below runs everywhere, D-Bus or not.
    if !as_own_node_env(
        "an_activation_that_would_refuse_anywhere_discards_nothing_and_claims_nothing",
        &[(
            "DBUS_SYSTEM_BUS_ADDRESS",
            "unix:path=/nonexistent/gpuq-test-no-system-bus",
        )],
    ) {
        return;
    }
    let site = Site::new().await;
    let with_fs = LoopDev::new(64 * MIB);
    with_fs.mkfs("mkfs.ext4", &["-q", "-F"]);
    let mut mounted = LoopDev::new(64 * MIB);
    mounted.mkfs("mkfs.ext4", &["-q", "-F"]);
    let mp = mounted.mount();
    let svc = site
        .helper("inst1", "physical", &[&with_fs, &mounted])
        .await;
    let before = (with_fs.edge_hash(), mounted.edge_hash());
    let e = gpuq_nodesvc::activation::execute(
        &svc,
        &ActivationRequest {
            activation: "activation-9".into(),
        },
    )
    .await
    .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, NodeError::Refused(_)), "{msg}");
    assert!(
        msg.contains("mounted") && msg.contains("no claim was written"),
        "{msg}"
    );
    assert_eq!(
        (with_fs.edge_hash(), mounted.edge_hash()),
        before,
        "a device was touched"
    );
    assert!(std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .contains(mp.to_str().unwrap()));
    assert!(!site.jobs("claim.json").exists());
    assert_eq!(site.audit("activation-9"), ["wipe:failed"]);

    // A unit to stop, and no systemd to ask (the system bus address leads
    // nowhere, above): refused before any device is looked at again.
    let text = std::fs::read_to_string(site.root.join("node.toml")).unwrap()
        + "\n[activation]\nunits = [\"daos_server.service\"]\n";
    std::fs::write(site.root.join("node.toml"), text).unwrap();
    let cfg = ServiceConfig::load(&site.root.join("node.toml")).unwrap();
    let svc = NodeService::new(cfg, site.podman.client().await);
    {
        let e = gpuq_nodesvc::activation::execute(
            &svc,
            &ActivationRequest {
                activation: "activation-10".into(),
            },
        )
        .await
        .unwrap_err();
        assert!(
            e.to_string().contains("system bus") && e.to_string().contains("no device was touched"),
            "{e}"
        );
        assert_eq!((with_fs.edge_hash(), mounted.edge_hash()), before);
        assert!(!site.jobs("claim.json").exists());
        assert_eq!(site.audit("activation-10"), ["unit:failed"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_claim_is_gone_is_not_wiped_until_the_claim_is_restored() {
    if !as_own_node("a_lease_whose_claim_is_gone_is_not_wiped_until_the_claim_is_restored") {
        return;
    }
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    let svc = site.helper("inst1", "physical", &[&dev]).await;
    physical_lease(&svc, &site, "L10", &[&dev]).await;
    let before = content(&dev);
    let claim = std::fs::read(site.jobs("claim.json")).unwrap();
    std::fs::remove_file(site.jobs("claim.json")).unwrap();
    let msg = assert_refused(svc.wipe("L10").await.unwrap_err(), "not all claimed");
    assert!(msg.contains("claim.json"), "{msg}");
    assert_eq!(content(&dev), before, "the device was touched");
    assert!(site.jobs("lease.json").exists(), "the record is kept");
    // An activation is refused while the lease is there (it would discard
    // the lease's data outside its cleanup).
    let e = gpuq_nodesvc::activation::execute(
        &svc,
        &ActivationRequest {
            activation: "activation-11".into(),
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("holds lease L10"), "{e}");
    assert_eq!(content(&dev), before, "the device was touched");
    std::fs::write(site.jobs("claim.json"), claim).unwrap();
    svc.wipe("L10").await.unwrap();
    assert!(dev.head_is_zero(MIB as usize));
    assert_eq!(site.audit("L10"), ["wipe:refused", "wipe:ok", "release:ok"]);
}

/// `gpuq e2e`'s evidence on a node (#17 item 3), physical mode: after the
/// lease's wipe every allowlisted device has the lease's wipe record
/// (`wiped`, no signature after); a record removed by hand fails that
/// device's check. (This start fails before any server runs — see the
/// module comment — so no server output exists to keep: that check fails
/// here, as it must.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evidence_of_a_wiped_lease_names_every_device_and_a_missing_record_fails() {
    if !as_own_node("the_evidence_of_a_wiped_lease_names_every_device_and_a_missing_record_fails") {
        return;
    }
    let site = Site::new().await;
    let a = LoopDev::new(64 * MIB);
    let b = LoopDev::new(64 * MIB);
    let svc = site.helper("inst1", "physical", &[&a, &b]).await;
    physical_lease(&svc, &site, "L12", &[&a, &b]).await;
    // Before the wipe: the lease is still held here.
    let e = gpuq_nodesvc::evidence::evidence(&svc, "L12", "inst1")
        .await
        .unwrap();
    let verdict = |e: &gpuq_protocol::node::LeaseEvidence, check: &str| -> Vec<bool> {
        e.checks
            .iter()
            .filter(|c| c.check == check)
            .map(|c| c.ok)
            .collect()
    };
    assert_eq!(verdict(&e, "node_lease_released"), [false], "{e:?}");
    assert_eq!(verdict(&e, "device_discarded"), [false, false], "{e:?}");
    svc.wipe("L12").await.unwrap();

    let e = gpuq_nodesvc::evidence::evidence(&svc, "L12", "inst1")
        .await
        .unwrap();
    assert_eq!(e.mode, "physical");
    for check in [
        "node_lease_released",
        "no_containers",
        "wipe_audited",
        "metadata_removed",
    ] {
        assert_eq!(verdict(&e, check), [true], "{check}: {e:?}");
    }
    assert_eq!(verdict(&e, "device_discarded"), [true, true], "{e:?}");
    assert!(
        e.checks
            .iter()
            .filter(|c| c.check == "device_discarded")
            .all(|c| c.detail.contains("wiped") && c.detail.contains("no signature after")),
        "{e:?}"
    );
    assert_eq!(verdict(&e, "server_output_kept"), [false], "{e:?}");
    assert!(!e.checks.iter().any(|c| c.check == "test_dir_removed"));

    // b's record removed by hand: b's check fails, a's still passes.
    let rec = std::fs::read_dir(site.jobs("L12"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            std::fs::read_to_string(p).is_ok_and(|t| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("wipe-")
                    && t.contains(b.backing.to_str().unwrap())
            })
        })
        .expect("b's wipe record");
    std::fs::remove_file(rec).unwrap();
    let e = gpuq_nodesvc::evidence::evidence(&svc, "L12", "inst1")
        .await
        .unwrap();
    let discarded: Vec<(bool, bool)> = e
        .checks
        .iter()
        .filter(|c| c.check == "device_discarded")
        .map(|c| (c.ok, c.detail.contains("no wipe record")))
        .collect();
    assert_eq!(discarded, [(true, false), (false, true)], "{e:?}");
    // Bad input: one clear error, nothing read.
    assert!(gpuq_nodesvc::evidence::evidence(&svc, "../x", "inst1")
        .await
        .is_err());
    assert!(gpuq_nodesvc::evidence::evidence(&svc, "L12", "nope")
        .await
        .is_err());
}

/// `--stor nvmeof` on a node whose kernel has no NVMe target (this
/// machine's: no module tree, no `/sys/kernel/config/nvmet`): preflight
/// names `nvmet_missing` and nothing else once the device is claimed; the
/// export is refused the same way and writes nothing — no lease record,
/// no lease directory, the device untouched; a malformed host token is
/// refused before any check; an unexport with no record has nothing to
/// do. (The export itself runs in the site VM, scenario 4.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stor_export_without_the_kernel_target_is_refused_and_touches_nothing() {
    if !as_own_node("a_stor_export_without_the_kernel_target_is_refused_and_touches_nothing") {
        return;
    }
    assert!(
        !std::path::Path::new("/sys/kernel/config/nvmet").exists(),
        "this test needs a kernel without nvmet loaded; the site VM tests the export"
    );
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    let stor = "[stor.nvmeof]\nkind = \"nvmeof\"\ntransport = \"tcp\"\naddress = \"10.99.0.1\"\n";
    let svc = site.helper_with("inst1", "physical", &[&dev], stor).await;
    activate(&svc, "activation-1").await;
    dev.write_data(8 * MIB, 64 * 1024);
    let before = content(&dev);
    let listing = || site.jobs_listing();
    let jobs_before = listing();
    let report = svc
        .preflight(&gpuq_protocol::node::PreflightRequest {
            lease: "L9".into(),
            profile: "nvmeof".into(),
        })
        .await
        .unwrap();
    let reasons: Vec<&str> = report.findings.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reasons, ["nvmet_missing"], "{report:?}");
    assert!(
        report.findings[0].detail.contains("nvmet_tcp"),
        "{report:?}"
    );
    let req = |token: &str| gpuq_protocol::node::ExportRequest {
        profile: "nvmeof".into(),
        host_token: token.into(),
    };
    let e = svc.export("L9", &req("not-hex")).await.unwrap_err();
    assert!(matches!(e, NodeError::BadRequest(_)), "{e}");
    let e = svc
        .export("L9", &req("0123456789abcdef0123456789abcdef"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, NodeError::Preflight { .. }) && e.to_string().contains("nvmet_missing"),
        "{e}"
    );
    let e = svc
        .export(
            "L9",
            &gpuq_protocol::node::ExportRequest {
                profile: "nope".into(),
                host_token: "0123456789abcdef0123456789abcdef".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, NodeError::NoProfile(_)), "{e}");
    assert_eq!(
        listing(),
        jobs_before,
        "a lease record or directory was written"
    );
    assert!(!site.jobs("lease.json").exists());
    assert_eq!(content(&dev), before, "the device was touched");
    let r = svc.unexport("L9").await.unwrap();
    assert!(r.already_done, "{r:?}");
    assert_eq!(listing(), jobs_before);
}

/// `--stor nfsrdma` on a node whose kernel has no NFS server loaded and
/// whose Podman lacks the pinned mkfs image: preflight names both; the
/// nfs-export refuses with them, and refuses root as the owner, a bad
/// client address and a profile of the other kind before any check;
/// nothing is written, the device is untouched, no container is made. (The
/// export itself runs in the site VM, scenario 5.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nfs_export_without_nfsd_or_its_mkfs_image_is_refused_and_touches_nothing() {
    if !as_own_node("an_nfs_export_without_nfsd_or_its_mkfs_image_is_refused_and_touches_nothing") {
        return;
    }
    assert!(
        !std::path::Path::new("/proc/self/net/rpc/nfsd.export").exists(),
        "this test needs a kernel without nfsd loaded; the site VM tests the export"
    );
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    let absent = format!("sha256:{}", "ab".repeat(32));
    let stor = format!(
        "[stor.nfs]\nkind = \"nfsrdma\"\ntransport = \"tcp\"\naddress = \"10.99.0.1\"\nmkfs_image = \"{absent}\"\n\
         [stor.nvmeof]\nkind = \"nvmeof\"\ntransport = \"tcp\"\naddress = \"10.99.0.1\"\n"
    );
    let svc = site.helper_with("inst1", "physical", &[&dev], &stor).await;
    activate(&svc, "activation-1").await;
    dev.write_data(8 * MIB, 64 * 1024);
    let before = content(&dev);
    let listing = || site.jobs_listing();
    let jobs_before = listing();
    let report = svc
        .preflight(&gpuq_protocol::node::PreflightRequest {
            lease: "L9".into(),
            profile: "nfs".into(),
        })
        .await
        .unwrap();
    let mut reasons: Vec<&str> = report.findings.iter().map(|f| f.reason.as_str()).collect();
    reasons.sort();
    assert_eq!(reasons, ["image_missing", "nfsd_missing"], "{report:?}");
    let req = |profile: &str, client: &str, uid: u32| gpuq_protocol::node::NfsExportRequest {
        profile: profile.into(),
        client_address: client.into(),
        owner_uid: uid,
        owner_gid: 61001,
    };
    for (r, why) in [
        (req("nfs", "cxl2", 61001), "client_address"),
        (req("nfs", "0.0.0.0", 61001), "owner other than root"),
        (req("nfs", "10.99.0.2", 0), "owner other than root"),
        (
            req("nvmeof", "10.99.0.2", 61001),
            "not a --stor nfsrdma profile",
        ),
    ] {
        let e = svc.nfs_export("L9", &r).await.unwrap_err();
        assert!(
            matches!(e, NodeError::BadRequest(_)) && e.to_string().contains(why),
            "{r:?}: {e}"
        );
    }
    let e = svc
        .export(
            "L9",
            &gpuq_protocol::node::ExportRequest {
                profile: "nfs".into(),
                host_token: "0123456789abcdef0123456789abcdef".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, NodeError::BadRequest(_))
            && e.to_string().contains("not a --stor nvmeof profile"),
        "{e}"
    );
    let e = svc
        .nfs_export("L9", &req("nfs", "10.99.0.2", 61001))
        .await
        .unwrap_err();
    assert!(
        matches!(e, NodeError::Preflight { .. })
            && e.to_string().contains("nfsd_missing")
            && e.to_string().contains("image_missing"),
        "{e}"
    );
    assert_eq!(
        listing(),
        jobs_before,
        "a lease record or directory was written"
    );
    assert!(!site.jobs("lease.json").exists());
    assert_eq!(content(&dev), before, "the device was touched");
    let r = svc.unexport("L9").await.unwrap();
    assert!(r.already_done, "{r:?}");
    assert_eq!(listing(), jobs_before);
}

/// A node helper that died while its `mkfs.xfs` container ran leaves that
/// container (labelled with the lease, role `mkfs`, possibly still holding
/// the device): the lease's `unexport` removes it first and confirms it is
/// gone, then finds nothing else of the export (this kernel has no nfsd
/// and nothing is mounted), and records the unexport. A container of
/// another role or lease is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nfs_unexport_removes_a_mkfs_container_a_crash_left() {
    use gpuq_podman::{lease_labels, ContainerSpec, LabelFilter, Podman, Role};
    if !as_own_node("an_nfs_unexport_removes_a_mkfs_container_a_crash_left") {
        return;
    }
    let site = Site::new().await;
    let dev = LoopDev::new(64 * MIB);
    let stor = format!(
        "[stor.nfs]\nkind = \"nfsrdma\"\ntransport = \"tcp\"\naddress = \"10.99.0.1\"\nmkfs_image = \"{}\"\n",
        site.image
    );
    let svc = site.helper_with("inst1", "physical", &[&dev], &stor).await;
    let client = site.podman.client().await;
    let image = gpuq_podman::ImageId::parse(&site.image).unwrap();
    let run = |name: &str, lease: &str, role: Role| {
        let mut spec = ContainerSpec::new(name, image.clone());
        spec.labels = lease_labels(lease, role);
        spec.command = vec!["sleep".into(), "600".into()];
        spec.network = gpuq_podman::Namespace::None;
        spec
    };
    let crashed = run("gpuq-L7-mkfs-nvme0n1", "L7", Role::Mkfs);
    let other = run("gpuq-L8-mkfs-nvme0n1", "L8", Role::Mkfs);
    for spec in [&crashed, &other] {
        client.container_create(spec).await.unwrap();
        client.container_start(&spec.name).await.unwrap();
    }
    // The record the export wrote before its first mkfs.
    let root = site.root.join("jobs/L7/nfs");
    let rec = gpuq_protocol::node::NodeLease {
        lease: "L7".into(),
        profile: "nfs".into(),
        phase: "exporting".into(),
        metadata_dir: site.root.join("jobs/L7/control_meta").display().to_string(),
        container: None,
        since: 1,
        mode: Some(gpuq_protocol::node::LeaseMode::Physical),
        devices: vec![],
        export: None,
        nfs: Some(gpuq_protocol::node::NfsExport {
            transport: "tcp".into(),
            address: "10.99.0.1".into(),
            port: 2049,
            client_address: "10.99.0.2".into(),
            owner_uid: 61001,
            owner_gid: 61001,
            root: root.display().to_string(),
            volumes: vec![],
        }),
    };
    std::fs::create_dir_all(site.root.join("jobs/L7")).unwrap();
    std::fs::write(site.jobs("lease.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
    let r = svc.unexport("L7").await.unwrap();
    assert!(!r.already_done, "{r:?}");
    assert!(
        r.detail
            .contains("removed mkfs container gpuq-L7-mkfs-nvme0n1"),
        "{r:?}"
    );
    assert!(client
        .container_list(&LabelFilter::lease("L7"))
        .await
        .unwrap()
        .is_empty());
    let others = client
        .container_list(&LabelFilter::lease("L8"))
        .await
        .unwrap();
    assert_eq!(others.len(), 1, "another lease's container was touched");
    assert_eq!(others[0].state, "running");
    let back: Value =
        serde_json::from_slice(&std::fs::read(site.jobs("lease.json")).unwrap()).unwrap();
    assert_eq!(back["phase"], "unexported");
    // Again: nothing left to do.
    let r = svc.unexport("L7").await.unwrap();
    assert!(r.already_done, "{r:?}");
    client.container_delete(&other.name, true).await.unwrap();
}
