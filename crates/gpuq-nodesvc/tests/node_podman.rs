//! The node service against a real Podman API service (its own storage, its
//! own socket) with a locally assembled image: start by ID, refusals,
//! stop + wipe of exactly our things, idempotent repeats, restart mid-lease.

use gpuq_nodesvc::profile::ServiceConfig;
use gpuq_nodesvc::service::{NodeError, NodeService};
use gpuq_podman::{lease_labels, ContainerSpec, LibpodClient, Namespace, Podman, Role};
use gpuq_podman_harness::{service_or_skip, PodmanService, TestImage};
use gpuq_protocol::node::{PreflightRequest, StartRequest};
use std::path::Path;

use gpuq_podman_harness::as_own_node;

struct Node {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    cfg_text: String,
    svc: NodeService<LibpodClient>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A server that says what DAOS says when it awaits its format, then idles.
const SERVER: &str =
    "trap 'exit 0' TERM; echo server up; echo 'SCM format required on instance 0'; while :; do sleep 1; done";

async fn node(podman: &PodmanService, image: &str) -> Node {
    node_with(podman, image, SERVER, 120).await
}

/// A node whose test profile runs `script` as its server and gives it
/// `format_wait` seconds to await the format.
async fn node_with(podman: &PodmanService, image: &str, script: &str, format_wait: u64) -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let cfg_text = format!(
        r#"
[node]
name = "da1"
socket = "{root}/node.sock"
podman_socket = "{sock}"
jobs_dir = "{root}/jobs"
test_dir = "{root}/test"

[profiles.test]
image = "{image}"
daos_version = "2.8.0"
mode = "test"
port = {port}
fabric_iface = "lo"
command = ["sh", "-c", "{script}"]
stop_grace_secs = 5
format_wait_secs = {format_wait}
"#,
        root = root.display(),
        sock = podman.socket.display(),
        port = free_port(),
        script = script.replace('\\', "\\\\").replace('"', "\\\""),
    );
    let cfg = ServiceConfig::parse(&root.join("node.toml"), &cfg_text).unwrap();
    let svc = NodeService::new(cfg, podman.client().await);
    Node {
        _tmp: tmp,
        root,
        cfg_text,
        svc,
    }
}

fn start_req() -> StartRequest {
    StartRequest {
        profile: "test".into(),
        replicas: vec!["da1".into()],
        tls: None,
        dmg: None,
    }
}

fn pre(lease: &str) -> PreflightRequest {
    PreflightRequest {
        lease: lease.into(),
        profile: "test".into(),
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_by_id_then_stop_and_wipe_only_what_is_ours() {
    if !as_own_node("start_by_id_then_stop_and_wipe_only_what_is_ours") {
        return;
    }
    let Some(podman) = service_or_skip("start_by_id") else {
        return;
    };
    let client = podman.client().await;
    let image = TestImage::build("server", Some("localhost/gpuq-test:latest"));
    podman.load_image(&client, &image).await;
    let n = node(&podman, &image.id.to_string()).await;

    // Something that is not ours: a container of another role/label-less, and a file beside the test dir.
    let mut other = ContainerSpec::new("not-gpuq", image.id.clone());
    other.command = vec!["sleep".into(), "300".into()];
    other.network = Namespace::Host;
    let other_id = client.container_create(&other).await.unwrap();
    client.container_start(&other_id).await.unwrap();
    std::fs::create_dir_all(n.root.join("test")).unwrap();
    std::fs::write(n.root.join("test/keep-me"), "x").unwrap();

    let report = n.svc.preflight(&pre("L1")).await.unwrap();
    assert!(report.ok, "{report:?}");
    let started = n.svc.start("L1", &start_req()).await.unwrap();
    let info = client.container_inspect(&started.container).await.unwrap();
    assert_eq!(info.image_id, image.id.hex(), "created by the pinned ID");
    assert_eq!(
        info.labels.get("io.gpuq.lease").map(String::as_str),
        Some("L1")
    );
    assert!(Path::new(&started.metadata_dir).is_dir());
    assert_eq!(
        started.metadata_dir,
        n.root.join("test/L1").display().to_string()
    );
    let yml = read(Path::new(&started.config_path));
    assert!(
        yml.contains("\nmgmt_svc_replicas:\n- da1\n") && yml.contains("class: file"),
        "{yml}"
    );
    assert_eq!(read(&n.root.join("jobs/active-lease")), "L1");

    // Wipe before stop is refused and touches nothing.
    let e = n.svc.wipe("L1").await.unwrap_err();
    assert!(matches!(e, NodeError::Refused(_)), "{e}");
    assert!(Path::new(&started.metadata_dir).is_dir());

    let stop = n.svc.stop("L1").await.unwrap();
    assert!(!stop.already_done);
    assert!(
        client.container_inspect(&started.container).await.is_err(),
        "server removed"
    );
    let again = n.svc.stop("L1").await.unwrap();
    assert!(again.already_done, "stop is idempotent");
    // The server's output outlives its container: kept by the stop (root
    // 0600), served by `logs`, and left by the wipe.
    let kept = n.root.join("jobs/L1/server.log");
    assert!(read(&kept).contains("server up"), "{}", read(&kept));
    assert!(
        stop.detail.contains("bytes of output kept in"),
        "{}",
        stop.detail
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&kept).unwrap().mode() & 0o777, 0o600);
    assert_eq!(n.svc.logs("L1").await.unwrap(), read(&kept));

    let wipe = n.svc.wipe("L1").await.unwrap();
    assert!(!wipe.already_done);
    assert!(
        !n.root.join("test/L1").exists(),
        "the lease's test dir is gone"
    );
    assert_eq!(
        read(&n.root.join("test/keep-me")),
        "x",
        "a file beside it survives"
    );
    assert!(!n.root.join("jobs/active-lease").exists() && !n.root.join("jobs/lease.json").exists());
    let again = n.svc.wipe("L1").await.unwrap();
    assert!(again.already_done, "wipe is idempotent");
    assert!(
        read(&kept).contains("server up"),
        "the wipe keeps the server's output"
    );

    // The other container was never touched.
    let o = client.container_inspect(&other_id).await.unwrap();
    assert_eq!(o.state.status, "running");
    client.container_delete(&other_id, true).await.unwrap();

    let audit = read(&n.root.join("jobs/L1/audit.jsonl"));
    let steps: Vec<String> = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| {
            format!(
                "{}:{}",
                v["step"].as_str().unwrap(),
                v["result"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            "start:ok",
            "stop:ok",
            "wipe:ok",
            "release:ok",
            "wipe:repeat"
        ],
        "{audit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_pinned_image_is_refused_before_anything_is_created() {
    if !as_own_node("a_missing_pinned_image_is_refused_before_anything_is_created") {
        return;
    }
    let Some(podman) = service_or_skip("missing_image") else {
        return;
    };
    let absent = TestImage::build("never-loaded", None);
    let n = node(&podman, &absent.id.to_string()).await;
    let report = n.svc.preflight(&pre("L2")).await.unwrap();
    assert!(!report.ok);
    assert!(
        report.findings.iter().any(|f| f.reason == "image_missing"),
        "{report:?}"
    );
    let e = n.svc.start("L2", &start_req()).await.unwrap_err();
    assert!(e.to_string().contains("image_missing"), "{e}");
    assert!(
        !n.root.join("jobs").exists() && !n.root.join("test").exists(),
        "nothing was created"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retagging_another_image_does_not_change_what_runs() {
    if !as_own_node("retagging_another_image_does_not_change_what_runs") {
        return;
    }
    let Some(podman) = service_or_skip("retag") else {
        return;
    };
    let client = podman.client().await;
    let pinned = TestImage::build("pinned", Some("localhost/gpuq-daos:site"));
    let newer = TestImage::build("newer", Some("localhost/gpuq-daos:site"));
    podman.load_image(&client, &pinned).await;
    podman.load_image(&client, &newer).await; // takes the tag away from `pinned`
    let n = node(&podman, &pinned.id.to_string()).await;
    let started = n.svc.start("L3", &start_req()).await.unwrap();
    let info = client.container_inspect(&started.container).await.unwrap();
    assert_eq!(info.image_id, pinned.id.hex());
    n.svc.stop("L3").await.unwrap();
    n.svc.wipe("L3").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_names_every_foreign_thing_and_stops_nothing() {
    if !as_own_node("preflight_names_every_foreign_thing_and_stops_nothing") {
        return;
    }
    let Some(podman) = service_or_skip("preflight_foreign") else {
        return;
    };
    let client = podman.client().await;
    let image = TestImage::build("server", None);
    podman.load_image(&client, &image).await;
    let n = node(&podman, &image.id.to_string()).await;

    // A container labelled for another lease.
    let mut foreign = ContainerSpec::new("gpuq-OTHER-server", image.id.clone());
    foreign.labels = lease_labels("OTHER", Role::Server);
    foreign.command = vec!["sleep".into(), "300".into()];
    foreign.network = Namespace::Host;
    let fid = client.container_create(&foreign).await.unwrap();
    client.container_start(&fid).await.unwrap();
    // A DAOS server that is not ours, in this network namespace.
    let bin = n.root.join("daos_server");
    std::fs::copy("/bin/sleep", &bin).unwrap();
    let mut engine = std::process::Command::new(&bin).arg("300").spawn().unwrap();
    // Another lease's node record, and the control port taken.
    std::fs::create_dir_all(n.root.join("jobs")).unwrap();
    std::fs::write(n.root.join("jobs/active-lease"), "OTHER").unwrap();
    let cfg = ServiceConfig::parse(&n.root.join("node.toml"), &n.cfg_text).unwrap();
    let port = cfg.profiles["test"].port;
    let _listener = std::net::TcpListener::bind(("0.0.0.0", port)).unwrap();

    let report = n.svc.preflight(&pre("L4")).await.unwrap();
    let reasons: Vec<&str> = report.findings.iter().map(|f| f.reason.as_str()).collect();
    for r in [
        "foreign_container",
        "foreign_engine",
        "foreign_lease",
        "port_in_use",
    ] {
        assert!(reasons.contains(&r), "{r} missing: {report:?}");
    }
    let engine_finding = report
        .findings
        .iter()
        .find(|f| f.reason == "foreign_engine")
        .unwrap();
    assert!(
        engine_finding.detail.contains(&engine.id().to_string()),
        "{engine_finding:?}"
    );
    let e = n.svc.start("L4", &start_req()).await.unwrap_err();
    assert!(matches!(e, NodeError::Preflight { .. }), "{e}");
    // Nothing was stopped, nothing was created.
    assert!(
        engine.try_wait().unwrap().is_none(),
        "the foreign daos_server still runs"
    );
    assert_eq!(
        client.container_inspect(&fid).await.unwrap().state.status,
        "running"
    );
    assert!(!n.root.join("test/L4").exists());
    assert_eq!(read(&n.root.join("jobs/active-lease")), "OTHER");
    engine.kill().unwrap();
    engine.wait().unwrap();
    client.container_delete(&fid, true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_helper_reports_the_lease_and_can_clean_it() {
    if !as_own_node("a_restarted_helper_reports_the_lease_and_can_clean_it") {
        return;
    }
    let Some(podman) = service_or_skip("restart") else {
        return;
    };
    let client = podman.client().await;
    let image = TestImage::build("server", None);
    podman.load_image(&client, &image).await;
    let n = node(&podman, &image.id.to_string()).await;
    let started = n.svc.start("L5", &start_req()).await.unwrap();
    // "Restart": a new service from the same configuration file.
    let cfg = ServiceConfig::parse(&n.root.join("node.toml"), &n.cfg_text).unwrap();
    let fresh = NodeService::new(cfg, podman.client().await);
    let status = fresh.status().await.unwrap();
    let lease = status.lease.expect("the lease survives a helper restart");
    assert_eq!(
        (lease.lease.as_str(), lease.phase.as_str()),
        ("L5", "running")
    );
    assert!(status
        .containers
        .iter()
        .any(|c| c.id == started.container && c.role == "server"));
    assert!(status.pins.iter().all(|p| p.present), "{:?}", status.pins);
    // A second start of L5 is refused; its server is untouched.
    let e = fresh.start("L5", &start_req()).await.unwrap_err();
    assert!(e.to_string().contains("already has containers"), "{e}");
    let l5 = client
        .container_list(&gpuq_podman::LabelFilter::lease("L5"))
        .await
        .unwrap();
    assert_eq!(
        l5.iter()
            .map(|c| (c.id.as_str(), c.state.as_str()))
            .collect::<Vec<_>>(),
        vec![(started.container.as_str(), "running")]
    );
    // Another lease is refused while L5 is held.
    let e = fresh.stop("L6").await.unwrap_err();
    assert!(e.to_string().contains("holds lease L5"), "{e}");
    fresh.stop("L5").await.unwrap();
    fresh.wipe("L5").await.unwrap();
    // Starting the same lease again would need a new metadata dir: it is gone now, so a
    // restart reuses nothing; but an existing dir is refused.
    std::fs::create_dir_all(n.root.join("test/L7")).unwrap();
    let e = fresh.start("L7", &start_req()).await.unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    assert!(client
        .container_list(&gpuq_podman::LabelFilter::lease("L7"))
        .await
        .unwrap()
        .is_empty());
}

/// `curl --unix-socket` as an operator would, optionally as another user.
fn curl(
    sock: &Path,
    as_uid: Option<u32>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String) {
    let mut cmd = match as_uid {
        Some(uid) => {
            let mut c = std::process::Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".into(),
                "curl".into(),
            ]);
            c
        }
        None => std::process::Command::new("curl"),
    };
    cmd.args(["-s", "-o", "-", "-w", "\n%{http_code}", "--unix-socket"])
        .arg(sock)
        .args(["-X", method]);
    if let Some(b) = body {
        cmd.args(["-H", "content-type: application/json", "--data-binary", b]);
    }
    cmd.arg(format!("http://node{path}"));
    let out = cmd.output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// How many exec sessions Podman has recorded for `container` (its own
/// inspect's `ExecIDs`, read from the API socket without our client).
async fn podman_execs(podman: &PodmanService, container: &str) -> usize {
    let sock = podman.socket.clone();
    let path = format!("/v4.0.0/libpod/containers/{container}/json");
    let (code, body) = tokio::task::spawn_blocking(move || curl(&sock, None, "GET", &path, None))
        .await
        .unwrap();
    assert_eq!(code, 200, "inspect {container}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("inspect JSON");
    v["ExecIDs"].as_array().map(Vec::len).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_runs_a_lease_and_refuses_bad_input() {
    if !as_own_node("http_api_runs_a_lease_and_refuses_bad_input") {
        return;
    }
    let Some(podman) = service_or_skip("http_api") else {
        return;
    };
    let client = podman.client().await;
    let image = TestImage::build("server", None);
    podman.load_image(&client, &image).await;
    let n = node(&podman, &image.id.to_string()).await;
    let sock = n.root.join("node.sock");
    let listener = gpuq_nodesvc::server::bind(&sock).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    tokio::spawn(gpuq_nodesvc::server::serve(listener, n.svc));
    let s = sock.clone();
    let call = move |m: &'static str, p: &'static str, b: Option<&'static str>| {
        let s = s.clone();
        tokio::task::spawn_blocking(move || curl(&s, None, m, p, b))
    };

    let (code, body) = call("GET", "/v1/status", None).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"node\":\"da1\""), "{body}");
    let (code, body) = call("POST", "/v1/preflight", Some("{\"lease\":"))
        .await
        .unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("malformed request body"), "{body}");
    let (code, body) = call(
        "POST",
        "/v1/leases/../start",
        Some(r#"{"profile":"test","replicas":["da1"]}"#),
    )
    .await
    .unwrap();
    assert!(code == 400 || code == 404, "{code} {body}");
    let big: &'static str =
        Box::leak(format!("{{\"lease\":\"{}\"}}", "x".repeat(100_000)).into_boxed_str());
    let (code, _) = call("POST", "/v1/preflight", Some(big)).await.unwrap();
    assert_eq!(code, 413);
    let (code, body) = call(
        "POST",
        "/v1/leases/L8/start",
        Some(r#"{"profile":"nope","replicas":["da1"]}"#),
    )
    .await
    .unwrap();
    assert_eq!(code, 404, "{body}");
    assert!(
        !n.root.join("jobs/active-lease").exists(),
        "a refused start changes nothing"
    );

    // dmg access without the lease's certificates: refused before anything.
    let (code, body) = call(
        "POST",
        "/v1/leases/L8/start",
        Some(
            r#"{"profile":"test","replicas":["da1"],"dmg":{"system":"daos_server","hostlist":["10.0.0.1"],"admin_cert":"c","admin_key":"k"}}"#,
        ),
    )
    .await
    .unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("dmg access needs the lease's TLS"), "{body}");
    assert!(
        !n.root.join("jobs/active-lease").exists() && !n.root.join("jobs/L8").exists(),
        "a refused start changes nothing"
    );
    let (code, body) = call(
        "POST",
        "/v1/leases/L8/start",
        Some(r#"{"profile":"test","replicas":["da1"]}"#),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, body) = call("GET", "/v1/leases/L8/logs", None).await.unwrap();
    assert_eq!(code, 200);
    // the server's own output arrives (it may take a moment to start)
    let mut logs = body;
    for _ in 0..50 {
        if logs.contains("server up") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        logs = call("GET", "/v1/leases/L8/logs", None).await.unwrap().1;
    }
    assert!(logs.contains("server up"), "{logs}");
    // dmg for the broker: one allowlisted command, for this node's lease,
    // only where the start gave it access; every refusal runs nothing.
    let dmg_refusals: [(&'static str, &'static str, u16, &str); 4] = [
        (
            "/v1/leases/L8/dmg",
            r#"{"command":"system_query","within_secs":5}"#,
            409,
            "has no dmg access on node da1",
        ),
        (
            "/v1/leases/L9/dmg",
            r#"{"command":"system_query","within_secs":5}"#,
            409,
            "not this node's lease (L8 is)",
        ),
        (
            "/v1/leases/L8/dmg",
            r#"{"command":"system_query","within_secs":0}"#,
            400,
            "within_secs 0 is out of range",
        ),
        (
            "/v1/leases/L8/dmg",
            r#"{"command":"pool destroy","within_secs":5}"#,
            400,
            "malformed request body",
        ),
    ];
    for (path, body, want, says) in dmg_refusals {
        let (code, got) = call("POST", path, Some(body)).await.unwrap();
        assert_eq!(code, want, "{path} {body}: {got}");
        assert!(got.contains(says), "{path} {body}: {got}");
    }
    let execs = podman_execs(&podman, "gpuq-L8-server").await;
    assert_eq!(
        execs, 0,
        "a refused dmg runs nothing in the server container"
    );
    let (code, body) = call("POST", "/v1/leases/L8/wipe", None).await.unwrap();
    assert_eq!(code, 409, "wipe before stop: {body}");
    let (code, _) = call("POST", "/v1/leases/L8/stop", None).await.unwrap();
    assert_eq!(code, 200);
    let (code, body) = call("POST", "/v1/leases/L8/wipe", None).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let (code, body) = call("POST", "/v1/leases/L8/wipe", None).await.unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("\"already_done\":true"), "{body}");

    // A non-root peer is refused even when the socket mode would let it in.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let s2 = sock.clone();
    let (code, body) =
        tokio::task::spawn_blocking(move || curl(&s2, Some(65534), "GET", "/v1/status", None))
            .await
            .unwrap();
    assert_eq!(code, 403, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_is_confirmed_only_when_the_server_awaits_its_format() {
    if !as_own_node("a_start_is_confirmed_only_when_the_server_awaits_its_format") {
        return;
    }
    let Some(podman) = service_or_skip("awaits_format") else {
        return;
    };
    let client = podman.client().await;
    let image = TestImage::build("server", Some("localhost/gpuq-test:latest"));
    podman.load_image(&client, &image).await;

    // Says it: confirmed, and the report says so.
    let n = node(&podman, &image.id.to_string()).await;
    let started = n.svc.start("L1", &start_req()).await.unwrap();
    assert!(started.awaiting_format);
    n.svc.stop("L1").await.unwrap();
    n.svc.wipe("L1").await.unwrap();

    // Exits before saying it: the start fails with its last lines, the
    // audit says so, and the usual stop + wipe leave nothing.
    let n = node_with(
        &podman,
        &image.id.to_string(),
        "echo config error: bad key; exit 3",
        120,
    )
    .await;
    let e = n.svc.start("L2", &start_req()).await.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("exited before it awaited format") && msg.contains("config error: bad key"),
        "{msg}"
    );
    let audit = read(&n.root.join("jobs/L2/audit.jsonl"));
    assert!(audit.contains("\"failed\""), "{audit}");
    n.svc.stop("L2").await.unwrap();
    n.svc.wipe("L2").await.unwrap();
    assert!(!n.root.join("test/L2").exists());

    // Never says it: the start fails after format_wait_secs, not before.
    let n = node_with(
        &podman,
        &image.id.to_string(),
        "trap 'exit 0' TERM; echo rejoining with old metadata; while :; do sleep 1; done",
        1,
    )
    .await;
    let t0 = std::time::Instant::now();
    let e = n.svc.start("L3", &start_req()).await.unwrap_err();
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    let msg = e.to_string();
    assert!(
        msg.contains("did not say `format required` within 1s") && msg.contains("rejoining"),
        "{msg}"
    );
    n.svc.stop("L3").await.unwrap();
    n.svc.wipe("L3").await.unwrap();
    let left = client
        .container_list(&gpuq_podman::LabelFilter::ours())
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// A server that ignores SIGTERM: its stop takes the whole grace (5 s).
const STUBBORN: &str =
    "trap '' TERM; echo 'SCM format required on instance 0'; while :; do sleep 1; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_whose_caller_hangs_up_runs_to_its_end_and_the_next_step_waits_for_it() {
    if !as_own_node("a_stop_whose_caller_hangs_up_runs_to_its_end_and_the_next_step_waits_for_it") {
        return;
    }
    let Some(podman) = service_or_skip("caller_hangs_up") else {
        return;
    };
    let client = podman.client().await;
    let image = TestImage::build("server", None);
    podman.load_image(&client, &image).await;
    let n = node_with(&podman, &image.id.to_string(), STUBBORN, 120).await;
    let sock = n.root.join("node.sock");
    let listener = gpuq_nodesvc::server::bind(&sock).unwrap();
    tokio::spawn(gpuq_nodesvc::server::serve(listener, n.svc));
    let s = sock.clone();
    let (code, body) = tokio::task::spawn_blocking(move || {
        curl(
            &s,
            None,
            "POST",
            "/v1/leases/L9/start",
            Some(r#"{"profile":"test","replicas":["da1"]}"#),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let ours = gpuq_podman::LabelFilter::lease("L9");
    assert_eq!(client.container_list(&ours).await.unwrap().len(), 1);
    // The caller (the broker, at its deadline) hangs up after 1 s; the stop
    // needs the 5 s grace and then SIGKILL.
    let s = sock.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["-s", "--max-time", "1", "-X", "POST", "--unix-socket"])
            .arg(&s)
            .arg("http://node/v1/leases/L9/stop")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(28), "curl should time out: {out:?}");
    // The stop goes on without its caller (the server SIGKILLed after the
    // grace, then removed) and keeps the step lock: the wipe asked now
    // waits for it instead of being refused as "stop first".
    let t = std::time::Instant::now();
    let s = sock.clone();
    let (code, body) =
        tokio::task::spawn_blocking(move || curl(&s, None, "POST", "/v1/leases/L9/wipe", None))
            .await
            .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        t.elapsed() >= std::time::Duration::from_secs(2),
        "the wipe did not wait for the stop: {:?}",
        t.elapsed()
    );
    assert!(client.container_list(&ours).await.unwrap().is_empty());
}
