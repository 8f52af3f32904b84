//! `gpuq-node devices|wipe` end to end on real loop devices, as root.
//!
//! Each test builds its own loop devices and node config in temp dirs and
//! runs the real binary. Every refusal test proves the device is unchanged
//! by hashing the first and last MiB of the backing file before and after.

#[path = "../../gpuq-blockdev/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{loop_entry, lvm_config, root, sh, tools, LoopDev, Node, MIB};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_gpuq-node");

/// Run `gpuq-node --config CFG ARGS...`; returns (exit code, stdout JSON or
/// text, stderr).
fn node(cfg: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("--config")
        .arg(cfg)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn wipe_json(n: &Node, lease: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["wipe", "--lease", lease, "--json"];
    args.extend_from_slice(extra);
    let (code, out, err) = node(&n.config, &args);
    let v: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {out}\nstderr: {err}"));
    (code, v)
}

fn reasons(dev: &Value) -> Vec<String> {
    dev["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap().to_string())
        .collect()
}

fn detail(dev: &Value, reason: &str) -> String {
    dev["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["reason"] == reason)
        .map(|r| r["detail"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Run a wipe that must be refused with `reason`, and prove nothing changed.
fn assert_refused(d: &LoopDev, n: &Node, reason: &str) -> Value {
    let before = d.edge_hash();
    let (code, v) = wipe_json(n, "lease-1", &[]);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["result"], "refused");
    let dev = v["devices"][0].clone();
    assert!(
        reasons(&dev).iter().any(|r| r == reason),
        "expected {reason} in {:?}: {dev:#}",
        reasons(&dev)
    );
    assert_eq!(dev["bytes_discarded"], 0);
    assert_eq!(d.edge_hash(), before, "device changed after a refusal");
    dev
}

#[test]
fn clean_device_is_discarded_and_backing_blocks_drop() {
    require!(root(), "clean_device_is_discarded");
    let d = LoopDev::new(64 * MIB);
    d.write_data(0, 4 * MIB as usize);
    d.write_data(32 * MIB, 4 * MIB as usize);
    let before = d.allocated();
    assert!(before >= 8 * MIB, "allocated {before}");
    let n = Node::for_loops(&[&d]);
    let (code, v) = wipe_json(&n, "lease-1", &[]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["result"], "ok");
    let dev = &v["devices"][0];
    assert_eq!(dev["result"], "wiped");
    assert_eq!(dev["bytes_discarded"], d.size);
    assert_eq!(dev["refusals"].as_array().unwrap().len(), 0);
    assert_eq!(dev["signatures_after"].as_array().unwrap().len(), 0);
    let after = d.allocated();
    assert!(
        after < 64 * 1024,
        "allocated blocks did not drop: {before} -> {after}"
    );
    assert!(d.head_is_zero(MIB as usize));
    // Audit record: atomic file with the same content.
    let audit = n.jobs.join("lease-1").join(format!("wipe-{}.json", d.name));
    let a: Value = serde_json::from_slice(&std::fs::read(&audit).unwrap()).unwrap();
    assert_eq!(a["result"], "wiped");
    assert_eq!(a["lease"], "lease-1");
    assert_eq!(a["dry_run"], false);
    assert_eq!(a["device"]["size_bytes"], d.size);
    assert!(a["started_at"].as_str().unwrap().ends_with('Z'));
    assert!(a["checks"].as_array().unwrap().len() >= 17);
}

#[test]
fn dry_run_checks_everything_and_destroys_nothing() {
    require!(root(), "dry_run");
    let d = LoopDev::new(64 * MIB);
    let n = Node::for_loops(&[&d]);
    let before = (d.edge_hash(), d.allocated());
    let (code, v) = wipe_json(&n, "lease-1", &["--dry-run"]);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["devices"][0]["result"], "ok");
    assert_eq!(v["devices"][0]["bytes_discarded"], 0);
    assert_eq!((d.edge_hash(), d.allocated()), before);
    let audit = n
        .jobs
        .join("lease-1")
        .join(format!("wipe-{}.dry-run.json", d.name));
    let a: Value = serde_json::from_slice(&std::fs::read(audit).unwrap()).unwrap();
    assert_eq!(a["dry_run"], true);
    assert!(!n
        .jobs
        .join("lease-1")
        .join(format!("wipe-{}.json", d.name))
        .exists());
}

#[test]
fn devices_lists_every_check_per_device() {
    require!(root(), "devices");
    let d = LoopDev::new(64 * MIB);
    let n = Node::for_loops(&[&d]);
    let (code, out, err) = node(&n.config, &["devices", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let dev = &v["devices"][0];
    assert_eq!(dev["device"]["path"], d.dev_str());
    assert_eq!(dev["device"]["size_bytes"], d.size);
    let checks: Vec<&str> = dev["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    for c in [
        "not_allowlisted",
        "identity_mismatch",
        "size_mismatch",
        "rotational",
        "read_only",
        "os_disk",
        "mounted",
        "partitions",
        "holders",
        "nvmet_export",
        "swap",
        "open_by_other",
        "locked",
        "userspace_driver",
        "foreign_signature",
        "external_engine",
        "foreign_lease",
        "discard_unsupported",
    ] {
        assert!(checks.contains(&c), "missing check {c}: {checks:?}");
    }
    // The inventory lists every disk, ours with its attributes.
    let inv = v["inventory"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == d.name.as_str())
        .unwrap_or_else(|| panic!("{} not in inventory: {v:#}", d.name))
        .clone();
    assert_eq!(inv["size_bytes"], d.size);
    assert_eq!(inv["rotational"], false);
    assert_eq!(inv["loop_backing_file"], d.backing.to_str().unwrap());
    assert_eq!(inv["partitions"].as_array().unwrap().len(), 0);
    // Text form too.
    let (code, out, _) = node(&n.config, &["devices"]);
    assert_eq!(code, 0);
    assert!(out.contains(d.dev_str()) && out.contains("ok"), "{out}");
}

#[test]
fn identity_mismatch_is_refused() {
    require!(root(), "identity_mismatch");
    let d = LoopDev::new(64 * MIB);
    let n = Node::new(
        true,
        &[format!("{}\nserial = \"FAKE-SERIAL-0001\"", loop_entry(&d))],
    );
    let dev = assert_refused(&d, &n, "identity_mismatch");
    assert!(detail(&dev, "identity_mismatch").contains("FAKE-SERIAL-0001"));
}

#[test]
fn missing_device_is_an_identity_mismatch() {
    require!(root(), "missing device");
    let d = LoopDev::new(64 * MIB);
    let n = Node::new(
        true,
        &[
            loop_entry(&d),
            "loop_backing_file = \"/nonexistent/gpuq-test.img\"".to_string(),
        ],
    );
    let before = d.edge_hash();
    let (code, v) = wipe_json(&n, "lease-1", &[]);
    assert_eq!(code, 1);
    assert_eq!(reasons(&v["devices"][1]), vec!["identity_mismatch"]);
    // The healthy device is not wiped either: nothing is destroyed unless
    // everything passes.
    assert_eq!(v["devices"][0]["result"], "skipped");
    assert_eq!(d.edge_hash(), before);
}

#[test]
fn loop_identity_without_allow_loop_devices_is_not_allowlisted() {
    require!(root(), "not_allowlisted");
    let d = LoopDev::new(64 * MIB);
    let n = Node::new(false, &[loop_entry(&d)]);
    assert_refused(&d, &n, "not_allowlisted");
}

#[test]
fn size_mismatch_is_refused() {
    require!(root(), "size_mismatch");
    let d = LoopDev::new(64 * MIB);
    let n = Node::new(true, &[format!("{}\nsize_bytes = 4096", loop_entry(&d))]);
    assert_refused(&d, &n, "size_mismatch");
}

#[test]
fn rotational_device_is_refused() {
    require!(root(), "rotational");
    let d = LoopDev::new(64 * MIB);
    d.set_rotational(true);
    let n = Node::for_loops(&[&d]);
    assert_refused(&d, &n, "rotational");
}

#[test]
fn ext4_signature_is_refused() {
    require!(root(), "ext4");
    require!(tools(&["mkfs.ext4"]), "ext4");
    let d = LoopDev::new(64 * MIB);
    d.mkfs("mkfs.ext4", &["-q", "-F", "-E", "nodiscard"]);
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "foreign_signature");
    assert!(detail(&dev, "foreign_signature").contains("ext4"));
}

#[test]
fn xfs_signature_is_refused() {
    require!(root(), "xfs");
    require!(tools(&["mkfs.xfs"]), "xfs");
    let d = LoopDev::new(320 * MIB);
    d.mkfs("mkfs.xfs", &["-q", "-f", "-K"]);
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "foreign_signature");
    assert!(detail(&dev, "foreign_signature").contains("xfs"));
}

#[test]
fn swap_signature_is_refused() {
    require!(root(), "swap signature");
    require!(tools(&["mkswap"]), "swap signature");
    let d = LoopDev::new(64 * MIB);
    d.mkfs("mkswap", &[]);
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "foreign_signature");
    assert!(detail(&dev, "foreign_signature").contains("swap"));
}

#[test]
fn lvm_pv_signature_is_refused() {
    require!(root(), "lvm");
    require!(tools(&["pvcreate"]), "lvm");
    let d = LoopDev::new(64 * MIB);
    let cfg = lvm_config(&d.dev);
    sh("pvcreate", &["-qq", "--config", &cfg, "-y", d.dev_str()]);
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "foreign_signature");
    assert!(detail(&dev, "foreign_signature").contains("LVM2_member"));
}

#[test]
fn luks_signature_is_refused() {
    require!(root(), "luks");
    require!(tools(&["cryptsetup"]), "luks");
    let d = LoopDev::new(64 * MIB);
    let key = d.dir.path().join("key");
    std::fs::write(&key, "not-a-secret-test-key").unwrap();
    sh(
        "cryptsetup",
        &[
            "luksFormat",
            "--batch-mode",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            key.to_str().unwrap(),
            d.dev_str(),
        ],
    );
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "foreign_signature");
    assert!(detail(&dev, "foreign_signature").contains("crypto_LUKS"));
}

fn partitioned(label: &str) -> LoopDev {
    let mut d = LoopDev::new(64 * MIB);
    let script = format!("label: {label}\n,16M\n,16M\n");
    let mut c = std::process::Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel", d.dev_str()])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    c.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success());
    d.partx_add();
    d
}

#[test]
fn gpt_partitions_are_refused() {
    require!(root(), "gpt");
    require!(tools(&["sfdisk", "partx"]), "gpt");
    let d = partitioned("gpt");
    assert!(Path::new(&format!("/sys/block/{0}/{0}p1", d.name)).exists());
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "partitions");
    assert!(detail(&dev, "partitions").contains(&format!("{}p1", d.name)));
    assert!(detail(&dev, "foreign_signature").contains("gpt"));
}

#[test]
fn mbr_partitions_are_refused() {
    require!(root(), "mbr");
    require!(tools(&["sfdisk", "partx"]), "mbr");
    let d = partitioned("dos");
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "partitions");
    assert!(detail(&dev, "foreign_signature").contains("dos"));
}

#[test]
fn mounted_filesystem_is_refused() {
    require!(root(), "mounted");
    require!(tools(&["mkfs.ext4", "mount", "umount"]), "mounted");
    let mut d = LoopDev::new(64 * MIB);
    // Inode tables and journal initialised now: otherwise the kernel's
    // ext4lazyinit thread writes them after the mount, and the bytes
    // compared below change without the wipe (a loaded run saw it).
    d.mkfs(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
        ],
    );
    let mp = d.mount();
    let n = Node::for_loops(&[&d]);
    // Even when the caller says ext4 is expected, a mounted one is refused.
    let before = d.edge_hash();
    let (code, v) = wipe_json(&n, "lease-1", &["--expect-signature", "ext4"]);
    assert_eq!(code, 1);
    let dev = &v["devices"][0];
    assert!(reasons(dev).contains(&"mounted".to_string()), "{dev:#}");
    assert!(detail(dev, "mounted").contains(mp.to_str().unwrap()));
    assert_eq!(d.edge_hash(), before);
    // `devices` shows the mount in the inventory.
    let (_, out, _) = node(&n.config, &["devices", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let inv = v["inventory"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == d.name.as_str())
        .unwrap()
        .clone();
    assert_eq!(inv["mountpoints"][0], mp.to_str().unwrap());
}

#[test]
fn device_open_by_another_process_is_refused_with_its_pid() {
    require!(root(), "open_by_other");
    let mut d = LoopDev::new(64 * MIB);
    let pid = d.hold_open(None);
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "open_by_other");
    assert!(
        detail(&dev, "open_by_other").contains(&format!("pid {pid}")),
        "{dev:#}"
    );
}

#[test]
fn daos_engine_holding_the_device_is_an_external_engine() {
    require!(root(), "external_engine");
    let mut d = LoopDev::new(64 * MIB);
    let pid = d.hold_open(Some("daos_engine"));
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "external_engine");
    assert!(detail(&dev, "external_engine").contains(&format!("pid {pid} (daos_engine)")));
}

#[test]
fn active_swap_is_refused() {
    require!(root(), "swap");
    require!(tools(&["mkswap", "swapon", "swapoff"]), "swap");
    let mut d = LoopDev::new(64 * MIB);
    d.swapon();
    let n = Node::for_loops(&[&d]);
    let before = d.edge_hash();
    let (code, v) = wipe_json(&n, "lease-1", &["--expect-signature", "swap"]);
    assert_eq!(code, 1);
    let dev = &v["devices"][0];
    assert!(reasons(dev).contains(&"swap".to_string()), "{dev:#}");
    assert_eq!(d.edge_hash(), before);
}

#[test]
fn flock_held_by_another_process_is_refused() {
    require!(root(), "locked");
    require!(tools(&["flock"]), "locked");
    let mut d = LoopDev::new(64 * MIB);
    let pid = d.hold_flock();
    let n = Node::for_loops(&[&d]);
    let dev = assert_refused(&d, &n, "locked");
    assert!(
        detail(&dev, "locked").contains(&format!("pid {pid}")),
        "{dev:#}"
    );
}

#[test]
fn discard_unsupported_is_a_failure_without_fallback() {
    require!(root(), "discard_unsupported");
    let mut d = LoopDev::new(64 * MIB);
    d.disable_discard();
    let n = Node::for_loops(&[&d]);
    let before = d.allocated();
    assert_refused(&d, &n, "discard_unsupported");
    assert_eq!(d.allocated(), before, "something was written");
}

#[test]
fn foreign_lease_is_refused() {
    require!(root(), "foreign_lease");
    let d = LoopDev::new(64 * MIB);
    let n = Node::for_loops(&[&d]);
    n.set_active_lease("someone-else");
    let dev = assert_refused(&d, &n, "foreign_lease");
    assert!(detail(&dev, "foreign_lease").contains("someone-else"));
    // The node's own lease is fine.
    n.set_active_lease("lease-1");
    let (code, v) = wipe_json(&n, "lease-1", &["--dry-run"]);
    assert_eq!(code, 0, "{v:#}");
}

#[test]
fn expected_signature_is_wiped_and_verified_gone() {
    require!(root(), "expected signature");
    require!(tools(&["mkfs.ext4"]), "expected signature");
    let d = LoopDev::new(64 * MIB);
    d.mkfs("mkfs.ext4", &["-q", "-F", "-E", "nodiscard"]);
    let n = Node::for_loops(&[&d]);
    let (code, v) = wipe_json(&n, "lease-1", &["--expect-signature", "ext4"]);
    assert_eq!(code, 0, "{v:#}");
    let dev = &v["devices"][0];
    assert_eq!(dev["signatures_before"][0]["type"], "ext4");
    assert_eq!(dev["signatures_after"].as_array().unwrap().len(), 0);
    assert_eq!(dev["result"], "wiped");
}

#[test]
fn four_devices_are_wiped_in_one_call() {
    require!(root(), "four devices");
    let devs: Vec<LoopDev> = (0..4).map(|_| LoopDev::new(64 * MIB)).collect();
    for d in &devs {
        d.write_data(MIB, MIB as usize);
    }
    let n = Node::for_loops(&devs.iter().collect::<Vec<_>>());
    let (code, v) = wipe_json(&n, "lease-4", &[]);
    assert_eq!(code, 0, "{v:#}");
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(v["devices"][i]["result"], "wiped");
        assert!(d.allocated() < 64 * 1024);
        assert!(n
            .jobs
            .join("lease-4")
            .join(format!("wipe-{}.json", d.name))
            .exists());
    }
}

#[test]
fn one_refusal_stops_every_wipe_but_all_are_reported() {
    require!(root(), "one refusal");
    let good = LoopDev::new(64 * MIB);
    let bad = LoopDev::new(64 * MIB);
    bad.set_rotational(true);
    let n = Node::for_loops(&[&good, &bad]);
    let before = (good.edge_hash(), good.allocated());
    let (code, v) = wipe_json(&n, "lease-1", &[]);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["devices"][0]["result"], "skipped");
    assert_eq!(v["devices"][1]["result"], "refused");
    assert_eq!(reasons(&v["devices"][1]), vec!["rotational"]);
    assert_eq!((good.edge_hash(), good.allocated()), before);
}

#[test]
fn bad_config_names_file_and_key_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("node.toml");
    std::fs::write(
        &cfg,
        "[node]\nname = \"x\"\nsocket = \"/a\"\npodman_socket = \"/b\"\njobs_dir = \"/c\"\ntest_dir = \"/d\"\nallow_loop_device = true\n",
    )
    .unwrap();
    let (code, out, err) = node(&cfg, &["devices"]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        err.contains("node.toml") && err.contains("allow_loop_device"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn invalid_lease_name_is_a_usage_error() {
    let n = Node::new(true, &[]);
    let (code, _, err) = node(&n.config, &["wipe", "--lease", "../etc"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid lease name"));
}

#[test]
fn missing_lease_argument_is_a_usage_error() {
    let n = Node::new(true, &[]);
    let (code, _, _) = node(&n.config, &["wipe"]);
    assert_eq!(code, 2);
}

#[test]
fn a_config_that_others_could_have_written_is_refused_and_nothing_is_wiped() {
    require!(root(), "a_config_that_others_could_have_written");
    use std::os::unix::fs::PermissionsExt;
    let d = LoopDev::new(16 * MIB);
    d.write_data(0, MIB as usize);
    let n = Node::for_loops(&[&d]);
    let before = d.edge_hash();
    let wipe = ["wipe", "--lease", "lease-1", "--json"];
    // Writable by others: whoever wrote it could have allowlisted any disk.
    std::fs::set_permissions(&n.config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, out, err) = node(&n.config, &wipe);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("may have been written by someone other than root") && err.contains("666"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(d.edge_hash(), before, "device changed after a refusal");
    // A symlink to a good config: refused as a link.
    std::fs::set_permissions(&n.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = n.config.with_file_name("link.toml");
    std::os::unix::fs::symlink(&n.config, &link).unwrap();
    let (code, _, err) = node(&link, &wipe);
    assert_ne!(code, 0);
    assert!(err.contains("symbolic link"), "{err}");
    // Owned by another user.
    std::os::unix::fs::chown(&n.config, Some(61002), None).unwrap();
    let (code, _, err) = node(&n.config, &wipe);
    assert_ne!(code, 0);
    assert!(err.contains("owned by uid 61002"), "{err}");
    assert_eq!(d.edge_hash(), before, "device changed after a refusal");
    assert!(
        !n.jobs.join("lease-1").exists(),
        "an audit directory was made for a refused config"
    );
    // Root's again: the same config works (it was the file, not its content).
    std::os::unix::fs::chown(&n.config, Some(0), None).unwrap();
    let (code, v) = wipe_json(&n, "lease-1", &[]);
    assert_eq!(code, 0, "{v:#}");
}
