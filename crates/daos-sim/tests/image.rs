//! The simulator image: `integration/daos-sim-image/build.sh` assembles a
//! docker-archive from scratch, a throwaway Podman API service loads it, and
//! containers started by its full image ID run `dmg --help` and a
//! one-server system (format → joined → clean SIGTERM stop).
//!
//! Needs root and podman; otherwise it fails with the reason (tests/skip). It runs the
//! documented static build (`RUSTFLAGS="-C target-feature=+crt-static" cargo
//! build -p daos-sim --release --target x86_64-unknown-linux-gnu`, through
//! build.sh, about 2 minutes cold on 2 cores, cached afterwards) and checks
//! the result is static. `DAOS_SIM_IMAGE_BIN=PATH` packs that binary instead
//! (a dynamic one gets its ldd libraries copied in).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpuq_podman::{
    ContainerSpec, ExecSpec, ImageId, LibpodClient, LogOptions, LogStream, Mount, Namespace, Podman,
};
use gpuq_podman_harness::{PodmanService, TestImage};

fn skip_reason() -> Option<String> {
    if let Some(r) = gpuq_podman_harness::skip_reason() {
        return Some(r);
    }
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        return Some("needs root for rootful podman".into());
    }
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox missing (apt-get install busybox-static)".into());
    }
    None
}

/// Runs build.sh. By default it does the documented static build, in the
/// workspace's target dir (`target/x86_64-unknown-linux-gnu/release`):
/// the same one build that the cluster tests and the site VM use, made once
/// (cargo's own lock orders concurrent builds); `DAOS_SIM_IMAGE_BIN` packs
/// that binary instead.
fn build_image(out: &Path) -> TestImage {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/daos-sim-image/build.sh");
    let test_bin = Path::new(env!("CARGO_BIN_EXE_daos-sim"));
    let target = test_bin
        .parent()
        .and_then(Path::parent)
        .expect("target dir");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg("--out").arg(out);
    match std::env::var("DAOS_SIM_IMAGE_BIN") {
        Ok(bin) => {
            cmd.args(["--bin", &bin]);
        }
        Err(_) => {
            cmd.env("CARGO_TARGET_DIR", target);
            if let Some(cargo) = option_env!("CARGO") {
                cmd.env("CARGO", cargo);
            }
        }
    }
    let o = cmd.output().expect("run build.sh");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "build.sh failed: {stdout} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    if std::env::var_os("DAOS_SIM_IMAGE_BIN").is_none() {
        let bin = target.join("x86_64-unknown-linux-gnu/release/daos-sim");
        let ldd = Command::new("ldd").arg(&bin).output().expect("ldd");
        let ldd = String::from_utf8_lossy(&ldd.stdout).into_owned()
            + &String::from_utf8_lossy(&ldd.stderr);
        assert!(
            ldd.contains("statically linked") || ldd.contains("not a dynamic executable"),
            "the documented build is not static: {ldd}"
        );
    }
    let id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("image: "))
        .expect("build.sh prints the image ID");
    let archive = std::fs::read(out.join("daos-sim-image.tar")).expect("archive");
    TestImage {
        id: ImageId::parse(id).expect("valid image id"),
        archive,
    }
}

async fn exec(client: &LibpodClient, ctr: &str, cmd: &[&str]) -> (i32, String, String) {
    let out = client
        .container_exec(ctr, &ExecSpec::new(cmd.iter().copied()))
        .await
        .expect("exec");
    (
        out.exit_code,
        String::from_utf8_lossy(&out.output.stream(LogStream::Stdout)).into_owned(),
        String::from_utf8_lossy(&out.output.stream(LogStream::Stderr)).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_loads_and_runs_a_simulated_server_by_full_id() {
    if let Some(reason) = skip_reason() {
        gpuq_podman_harness::cannot_run(
            "image_loads_and_runs_a_simulated_server_by_full_id",
            &reason,
        );
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("daos-sim-image")
        .tempdir()
        .unwrap();
    let image = build_image(&work.path().join("out"));
    // Same input, same ID: the archive is reproducible.
    assert_eq!(build_image(&work.path().join("out2")).id, image.id);

    let svc = PodmanService::start();
    let client = svc.client().await;
    svc.load_image(&client, &image).await;

    // dmg --help in a container made by full image ID.
    let mut help = ContainerSpec::new("daos-sim-help", image.id.clone());
    help.command = vec!["dmg".into(), "--help".into()];
    help.network = Namespace::Host;
    let id = client.container_create(&help).await.expect("create");
    client.container_start(&id).await.expect("start");
    let code = tokio::time::timeout(Duration::from_secs(60), client.container_wait(&id))
        .await
        .expect("dmg --help exits")
        .expect("wait");
    let logs = client
        .container_logs(&id, &LogOptions::default())
        .await
        .expect("logs");
    let text = String::from_utf8_lossy(&logs.stream(LogStream::Stdout)).into_owned();
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("not DAOS"), "{text}");

    // A one-server system: daos_server in a container, dmg through exec.
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg_dir = work.path().join("cfg");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    std::fs::write(
        cfg_dir.join("daos_server.yml"),
        format!(
            "name: daos_server\nport: {port}\nmgmt_svc_replicas: ['127.0.0.1:{port}']\nprovider: ofi+tcp\n\
             transport_config: {{allow_insecure: true}}\ncontrol_metadata: {{path: /cfg/control_meta}}\n\
             disable_vfio: true\ndisable_hugepages: true\nsystem_ram_reserved: 2\nfault_path: /da1\nengines:\n  - targets: 4\n    fabric_iface: lo\n    storage:\n\
             \x20     - {{class: ram, scm_mount: /mnt/daos, scm_size: 4}}\n\
             \x20     - {{class: file, bdev_list: [/cfg/bdev0], bdev_size: 1, bdev_roles: [wal, meta, data]}}\n"
        ),
    )
    .unwrap();
    let mut server = ContainerSpec::new("daos-sim-server", image.id.clone());
    server.command = vec![
        "daos_server".into(),
        "start".into(),
        "-o".into(),
        "/cfg/daos_server.yml".into(),
    ];
    server.network = Namespace::Host;
    server.mounts = vec![Mount::bind(cfg_dir.to_string_lossy().into_owned(), "/cfg")];
    let sid = client
        .container_create(&server)
        .await
        .expect("create server");
    client.container_start(&sid).await.expect("start server");

    let host = format!("127.0.0.1:{port}");
    let dmg = |args: &'static [&'static str]| {
        let mut v = vec!["dmg", "-i", "-j", "-l", host.as_str()];
        v.extend_from_slice(args);
        v
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, out, _) = exec(&client, &sid, &dmg(&["system", "query"])).await;
        if out.contains("storage format required") {
            break;
        }
        assert!(Instant::now() < deadline, "server never answered: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, out, err) = exec(&client, &sid, &dmg(&["storage", "format"])).await;
    assert_eq!(code, 0, "{out} {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("format JSON");
    assert!(
        v["response"]["host_errors"].as_object().unwrap().is_empty(),
        "{v}"
    );
    loop {
        let (_, out, _) = exec(&client, &sid, &dmg(&["system", "query"])).await;
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        if v["response"]["members"][0]["state"] == "joined" {
            assert_eq!(v["response"]["members"][0]["rank"], 0);
            break;
        }
        assert!(Instant::now() < deadline, "never joined: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cfg_dir
        .join("control_meta/daos_control/engine0/superblock")
        .is_file());

    // podman stop sends SIGTERM: the simulator exits 0, well within the grace.
    let t = Instant::now();
    client
        .container_stop(&sid, Duration::from_secs(10))
        .await
        .expect("stop");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    let code = client.container_wait(&sid).await.expect("wait server");
    let logs = client
        .container_logs(&sid, &LogOptions::default())
        .await
        .expect("logs");
    let text = String::from_utf8_lossy(&logs.stream(LogStream::Stderr)).into_owned();
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("daos_server stopped"), "{text}");
    for c in [&id, &sid] {
        client.container_delete(c, true).await.expect("delete");
    }
}
