//! `gpuq verify-install` on the five-host test cluster: a real broker in
//! cxl2's namespace, real SSH links, the four real node helpers.
//!
//! Each host gets an "installed tree" as its package would leave it: the
//! node helper's binary (a copy of the one the cluster runs) at
//! `usr/sbin/gpuq-node` and its `node.toml`, and on cxl2 the broker, the
//! CLI and `broker.toml`; each with its manifest made by
//! `Manifest::from_tree`, as `integration/package` does when the packages are
//! built. The helpers read theirs through `[install]` in their `node.toml`
//! (the cluster writes it), the broker through `[install]` in its own.

use gpuq_manifest::Manifest;
use gpuq_system_tests::cluster::*;
use gpuq_system_tests::daos_site::{alice, daos_tables, Frozen};
use gpuq_system_tests::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// No `gpuq` in it: the PATH check finds nothing unless a test adds one.
const PLAIN_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// A cluster and a broker on cxl2 whose `[daos]` names the four nodes.
/// Field order: the broker goes first (it ends its ssh masters).
struct Site {
    b: TestBroker,
    c: Cluster,
}

impl Drop for Site {
    fn drop(&mut self) {
        if self.b.pid().is_some() {
            let _ = self.b.terminate();
        }
        let forward = self.c.dir().join("cxl2/run/links");
        for (pid, _) in pids_mentioning(&forward.display().to_string()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Write `files` (installed path → source file) under `root`, then the
/// manifest of exactly those files at `root/usr/share/gpuq/manifests/`.
fn install(root: &Path, package: &str, version: &str, files: &[(&str, &Path)], config: &[&str]) {
    for (path, src) in files {
        let dst = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        // A copy, never a link: the tests change these files.
        std::fs::copy(src, &dst).unwrap();
    }
    write_manifest(root, package, version, config);
}

fn write_manifest(root: &Path, package: &str, version: &str, config: &[&str]) {
    let dir = root.join("usr/share/gpuq/manifests");
    let _ = std::fs::remove_dir_all(&dir);
    let config: Vec<String> = config.iter().map(|s| s.to_string()).collect();
    let m = Manifest::from_tree(root, package, version, &config).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{package}.json"));
    std::fs::write(&file, m.to_json()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn node_root(c: &Cluster, node: &str) -> PathBuf {
    // Where integration/cluster's [install] points this node's helper.
    c.dir().join(node).join("install")
}

fn up(name: &str, daos_keys: &str) -> Site {
    let c = Cluster::up(name);
    for n in NODES {
        install(
            &node_root(&c, n),
            "gpuq-node",
            VERSION,
            &[
                ("/usr/sbin/gpuq-node", &bin("gpuq-node")),
                (
                    "/etc/gpuqueue-daos/node.toml",
                    &c.dir().join(n).join("etc/node.toml"),
                ),
            ],
            &["/etc/gpuqueue-daos/node.toml"],
        );
    }
    let mut b = TestBroker::prepare("");
    let root = b.path("installed");
    let image = format!("sha256:{}", "ab".repeat(32));
    b.tables = daos_tables(&c, b.dir.path(), &image).replacen(
        "[daos]\n",
        &format!("[daos]\n{daos_keys}\n"),
        1,
    );
    b.tables.push_str(&format!(
        "\n[install]\nmanifest_dir = \"{}/usr/share/gpuq/manifests\"\nprefix = \"{}\"\n",
        root.display(),
        root.display()
    ));
    b.netns = Some(c.id.namespace("cxl2"));
    // The broker's config as the package would ship it (written by launch;
    // the installed copy stands for the packaged default).
    std::fs::create_dir_all(root.join("etc/gpuqueue-daos")).unwrap();
    std::fs::write(
        root.join("etc/gpuqueue-daos/broker.toml"),
        "# packaged default\n",
    )
    .unwrap();
    install(
        &root,
        "gpuq",
        VERSION,
        &[
            ("/usr/sbin/gpuq-broker", &bin("gpuq-broker")),
            ("/usr/bin/gpuq", &bin("gpuq")),
        ],
        &["/etc/gpuqueue-daos/broker.toml"],
    );
    let b = TestBroker::launch(b);
    Site { b, c }
}

/// `gpuq verify-install --json` as root (or `user`), with `path` as PATH.
fn verify(s: &Site, user: Option<&User>, path: &str) -> (Output, serde_json::Value) {
    let out = match user {
        Some(u) => s.b.gpuq_in(
            Some(u),
            s.b.dir.path(),
            &[("PATH", path)],
            &["verify-install", "--json"],
        ),
        None => root_verify_within(s, path, Duration::from_secs(60)),
    };
    let v = serde_json::from_str(&stdout(&out)).unwrap_or(serde_json::Value::Null);
    (out, v)
}

/// Root's `gpuq verify-install --json`, killed and failed if it has not
/// ended within `limit`: a hang is what these tests must catch, not wait out.
fn root_verify_within(s: &Site, path: &str, limit: Duration) -> Output {
    use std::io::Read;
    let mut child = std::process::Command::new(bin("gpuq"))
        .args(["verify-install", "--json"])
        .current_dir(s.b.dir.path())
        .env("GPUQ_SOCKET", &s.b.socket)
        .env("PATH", path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run gpuq");
    // The report is a few KiB, well inside a pipe's buffer: reading after
    // the exit cannot block the child.
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gpuq verify-install did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_end(&mut err).unwrap();
    Output {
        status,
        stdout: out,
        stderr: err,
    }
}

/// (host, subject, status) of every finding.
fn findings(v: &serde_json::Value) -> Vec<(String, String, String)> {
    v["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings in {v}"))
        .iter()
        .map(|f| {
            (
                f["host"].as_str().unwrap().to_string(),
                f["subject"].as_str().unwrap().to_string(),
                f["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn verify_install_is_ok_then_names_exactly_the_changed_file_the_skewed_node_and_a_shadowing_gpuq() {
    require_cluster_env!();
    let s = up("vinst", "");

    // All as installed: exit 0, five hosts, every file ok.
    let t0 = Instant::now();
    let (out, v) = verify(&s, None, PLAIN_PATH);
    eprintln!(
        "TIMING verify-install, five hosts all ok: {:?}",
        t0.elapsed()
    );
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(findings(&v), vec![], "{v}");
    let hosts: Vec<_> = v["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["host"].as_str().unwrap().to_string(),
                h["files_ok"].as_u64().unwrap(),
            )
        })
        .collect();
    let me = host_name();
    assert_eq!(
        hosts,
        vec![
            (me.clone(), 3),
            ("da1".into(), 2),
            ("da2".into(), 2),
            ("da3".into(), 2),
            ("da4".into(), 2)
        ]
    );
    // The text form says so in one line.
    let t0 = Instant::now();
    let text = s.b.gpuq_in(
        None,
        s.b.dir.path(),
        &[("PATH", PLAIN_PATH)],
        &["verify-install"],
    );
    eprintln!("TIMING verify-install again, links up: {:?}", t0.elapsed());
    assert!(text.status.success());
    assert!(
        stdout(&text).contains(&format!(
            "verify-install: all ok on 5 hosts (gpuq {VERSION})"
        )),
        "{}",
        stdout(&text)
    );

    // One byte flipped in da3's installed helper: exactly da3 and that file.
    let helper = node_root(&s.c, "da3").join("usr/sbin/gpuq-node");
    let original = std::fs::read(&helper).unwrap();
    let mut flipped = original.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x01;
    std::fs::write(&helper, &flipped).unwrap();
    let (out, v) = verify(&s, None, PLAIN_PATH);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(
        findings(&v),
        vec![(
            "da3".into(),
            "/usr/sbin/gpuq-node".into(),
            "modified".into()
        )],
        "{v}"
    );
    let text = s.b.gpuq_in(
        None,
        s.b.dir.path(),
        &[("PATH", PLAIN_PATH)],
        &["verify-install"],
    );
    assert_eq!(text.status.code(), Some(1));
    let t = stdout(&text);
    assert!(
        t.starts_with("da3: /usr/sbin/gpuq-node: MODIFIED: sha256 "),
        "{t}"
    );
    assert!(
        t.contains("verify-install: FAILED: 1 finding(s) on da3"),
        "{t}"
    );
    std::fs::write(&helper, &original).unwrap();

    // The package's bytes, but da4's helper another user's, and da1's
    // node.toml writable by all: each named, exit 1 (whoever could write
    // them could change what root runs or reads).
    let helper4 = node_root(&s.c, "da4").join("usr/sbin/gpuq-node");
    let conf1 = node_root(&s.c, "da1").join("etc/gpuqueue-daos/node.toml");
    let conf1_mode = std::fs::metadata(&conf1).unwrap().permissions();
    std::os::unix::fs::chown(&helper4, Some(61002), None).unwrap();
    std::fs::set_permissions(&conf1, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (out, v) = verify(&s, None, PLAIN_PATH);
    std::os::unix::fs::chown(&helper4, Some(0), None).unwrap();
    std::fs::set_permissions(&conf1, conf1_mode).unwrap();
    assert_eq!(out.status.code(), Some(1), "{v}");
    let mut f = findings(&v);
    f.sort();
    assert_eq!(
        f,
        vec![
            (
                "da1".into(),
                "/etc/gpuqueue-daos/node.toml".into(),
                "permissions".into()
            ),
            (
                "da4".into(),
                "/usr/sbin/gpuq-node".into(),
                "permissions".into()
            ),
        ],
        "{v}"
    );
    let (out, v) = verify(&s, None, PLAIN_PATH);
    assert!(out.status.success(), "{v}");

    // da2's manifest says another version: skew on da2, nothing else.
    write_manifest(
        &node_root(&s.c, "da2"),
        "gpuq-node",
        "0.0.9",
        &["/etc/gpuqueue-daos/node.toml"],
    );
    let (out, v) = verify(&s, None, PLAIN_PATH);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(
        findings(&v),
        vec![(
            "da2".into(),
            "package gpuq-node".into(),
            "version_skew".into()
        )],
        "{v}"
    );
    write_manifest(
        &node_root(&s.c, "da2"),
        "gpuq-node",
        VERSION,
        &["/etc/gpuqueue-daos/node.toml"],
    );

    // A changed node.toml on da1 is information: listed, exit 0.
    let conf = node_root(&s.c, "da1").join("etc/gpuqueue-daos/node.toml");
    std::fs::write(&conf, "# the operator's own\n").unwrap();
    let (out, v) = verify(&s, None, PLAIN_PATH);
    assert!(out.status.success(), "{v}");
    assert_eq!(
        findings(&v),
        vec![(
            "da1".into(),
            "/etc/gpuqueue-daos/node.toml".into(),
            "config_changed".into()
        )],
        "{v}"
    );

    // Another gpuq first in root's PATH (the original's /usr/local/bin/gpuq):
    // a finding on this host, listed before the configuration change.
    let shadow = s.b.path("old-bin");
    std::fs::create_dir_all(&shadow).unwrap();
    std::fs::write(shadow.join("gpuq"), "#!/bin/sh\necho old gpuq\n").unwrap();
    std::fs::set_permissions(shadow.join("gpuq"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}:{PLAIN_PATH}", shadow.display(), bin_dir().display());
    let (out, v) = verify(&s, None, &path);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(
        findings(&v),
        vec![
            (
                me.clone(),
                shadow.join("gpuq").display().to_string(),
                "shadowed".into()
            ),
            (
                "da1".into(),
                "/etc/gpuqueue-daos/node.toml".into(),
                "config_changed".into()
            )
        ],
        "{v}"
    );
    // Ours first: no finding.
    let path = format!("{}:{}:{PLAIN_PATH}", bin_dir().display(), shadow.display());
    let (out, v) = verify(&s, None, &path);
    assert!(out.status.success(), "{v}");
}

#[test]
fn verify_install_refuses_users_and_reports_a_dead_or_frozen_helper_unreachable_in_bounded_time() {
    require_cluster_env!();
    // Short node deadline: a frozen helper costs 5 s, not the default 60.
    let s = up("vinst-down", "request_timeout_secs = 5");
    let (out, v) = verify(&s, None, PLAIN_PATH);
    assert!(out.status.success(), "{v}\n{}", s.b.broker_log());

    // da2's helper frozen, da4's killed.
    let frozen = Frozen::freeze(&s.c, "da2", "node");
    let pid = s.c.recorded_pid("da4", "node").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(5, || !alive(pid)));

    // A user is refused at once, before any node is asked: with da2 frozen,
    // asking it would take the 5 s deadline.
    let t0 = Instant::now();
    let (out, _) = verify(&s, Some(&alice()), PLAIN_PATH);
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).contains("only root may verify the installation"),
        "{}",
        stderr(&out)
    );
    assert!(took < Duration::from_secs(2), "refusal took {took:?}");

    // Root: both named unreachable, the others checked, within the deadline.
    let t0 = Instant::now();
    let (out, v) = verify(&s, None, PLAIN_PATH);
    let took = t0.elapsed();
    eprintln!("TIMING verify-install with one frozen and one dead helper: {took:?}");
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(
        findings(&v),
        vec![
            ("da2".into(), "node helper".into(), "unreachable".into()),
            ("da4".into(), "node helper".into(), "unreachable".into())
        ],
        "{v}"
    );
    let why = v["findings"][0]["detail"].as_str().unwrap();
    assert!(why.contains("within 5s"), "{why}");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(15),
        "took {took:?}"
    );
    let hosts = v["hosts"].as_array().unwrap();
    assert_eq!(hosts[1]["files_ok"], 2, "{v}");
    assert_eq!(hosts[3]["files_ok"], 2, "{v}");

    // Thawed, da2 answers again; da4 stays unreachable.
    frozen.thaw();
    let (_, v) = verify(&s, None, PLAIN_PATH);
    assert_eq!(
        findings(&v),
        vec![("da4".into(), "node helper".into(), "unreachable".into())],
        "{v}"
    );
}

#[test]
fn an_upgraded_helper_that_was_not_restarted_is_named_until_it_is() {
    require_cluster_env!();
    let s = up("vinst-run", "");
    // An "upgrade" on da1: a new helper binary and its manifest installed,
    // the old helper still running. (A trailing byte makes it another file
    // that still runs: the ELF loader ignores what follows the last segment.)
    let root = node_root(&s.c, "da1");
    let installed = root.join("usr/sbin/gpuq-node");
    let mut new = std::fs::read(&installed).unwrap();
    new.push(0);
    std::fs::write(&installed, &new).unwrap();
    write_manifest(
        &root,
        "gpuq-node",
        VERSION,
        &["/etc/gpuqueue-daos/node.toml"],
    );
    let (out, v) = verify(&s, None, PLAIN_PATH);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(
        findings(&v),
        vec![(
            "da1".into(),
            "/usr/sbin/gpuq-node".into(),
            "running_differs".into()
        )],
        "{v}"
    );
    assert!(
        v["findings"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("restart it"),
        "{v}"
    );

    // Restarted from the installed binary (as systemd would): ok. Its command
    // line names the cluster dir, so the cluster's `down` ends it.
    let old = s.c.recorded_pid("da1", "node").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(eventually(10, || !alive(old)));
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(s.c.dir().join("logs/da1-node.log"))
        .unwrap();
    // setsid and nsenter exec: this child is the new helper itself.
    let mut helper = std::process::Command::new("setsid")
        .arg("nsenter")
        .arg(format!("--net=/run/netns/{}", s.c.id.namespace("da1")))
        .arg(&installed)
        .arg("--config")
        .arg(s.c.dir().join("da1/etc/node.toml"))
        .arg("serve")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    assert!(eventually(10, || std::os::unix::net::UnixStream::connect(
        s.c.node_sock("da1")
    )
    .is_ok()));
    let (out, v) = verify(&s, None, PLAIN_PATH);
    assert!(out.status.success(), "{v}");
    assert_eq!(findings(&v), vec![], "{v}");
    // Ended and reaped here; after a failure the cluster's `down` ends it.
    let _ = helper.kill();
    let _ = helper.wait();
}
