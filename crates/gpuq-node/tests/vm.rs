//! Block-device checks that this machine's kernel cannot host (no dm, no md,
//! no partition scanning, no NVMe): a small QEMU VM (software emulation)
//! with the Debian cloud kernel, a busybox initramfs and our gpuq-node.
//!
//! The guest (`integration/vm/guest-init.sh`) sets up each scenario on
//! emulated NVMe namespaces, runs gpuq-node and prints the JSON between
//! markers on the serial console; this test boots it, parses the console,
//! and checks the host side of the backing files afterwards.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fs::{self, File};
use std::hash::Hasher;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const MIB: u64 = 1 << 20;
const IMG: u64 = 64 * MIB;
const BIN: &str = env!("CARGO_BIN_EXE_gpuq-node");

/// Fail with the reason (or skip where a developer set GPUQ_ALLOW_SKIP=1).
fn skip(reason: &str) {
    gpuq_test_skip::cannot_run("vm test", reason);
}

fn which(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// The newest Debian cloud kernel with its modules, if installed.
fn cloud_kernel() -> Option<(PathBuf, String)> {
    let mut vers: Vec<String> = fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| {
            let n = e.ok()?.file_name().to_string_lossy().into_owned();
            let v = n.strip_prefix("vmlinuz-")?.to_string();
            (v.ends_with("-cloud-amd64") && Path::new(&format!("/lib/modules/{v}")).is_dir())
                .then_some(v)
        })
        .collect();
    vers.sort();
    let v = vers.pop()?;
    Some((PathBuf::from(format!("/boot/vmlinuz-{v}")), v))
}

fn edge_hash(p: &Path) -> u64 {
    let mut f = File::open(p).unwrap();
    let len = f.metadata().unwrap().len();
    let mut buf = vec![0u8; MIB as usize];
    let mut h = DefaultHasher::new();
    f.read_exact(&mut buf).unwrap();
    h.write(&buf);
    f.seek(SeekFrom::Start(len - MIB)).unwrap();
    f.read_exact(&mut buf).unwrap();
    h.write(&buf);
    h.finish()
}

fn image(dir: &Path, name: &str, pattern: bool) -> PathBuf {
    let p = dir.join(name);
    let mut f = File::create(&p).unwrap();
    f.set_len(IMG).unwrap();
    if pattern {
        let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 253) as u8 | 1).collect();
        for off in [0, 32 * MIB, IMG - 4 * MIB] {
            f.seek(SeekFrom::Start(off)).unwrap();
            f.write_all(&data).unwrap();
        }
    }
    f.sync_all().unwrap();
    p
}

fn run_ok(cmd: &str, args: &[&str], stdin: Option<&str>) {
    let mut c = Command::new(cmd)
        .args(args)
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    if let Some(s) = stdin {
        c.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Scenario name -> (exit code, hashes same, JSON).
fn parse_console(text: &str) -> HashMap<String, (i32, bool, Value)> {
    let mut out = HashMap::new();
    let mut cur: Option<(String, String)> = None;
    for line in text.lines().map(|l| l.trim_end_matches('\r')) {
        if let Some(name) = line.strip_prefix("GPUQ-BEGIN ") {
            cur = Some((name.trim().to_string(), String::new()));
        } else if let Some(rest) = line.strip_prefix("GPUQ-END ") {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let (name, body) = cur.take().expect("END without BEGIN");
            assert_eq!(name, f[0]);
            let v: Value = serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("scenario {name}: bad JSON ({e}):\n{body}"));
            out.insert(name, (f[1].parse().unwrap(), f[2] == "same", v));
        } else if let Some((_, body)) = cur.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

fn reasons(v: &Value) -> Vec<String> {
    v["devices"][0]["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap().to_string())
        .collect()
}

fn details(v: &Value) -> String {
    v["devices"][0]["refusals"].to_string()
}

#[test]
fn nvme_md_dm_partitions_hdd_and_discard_in_a_vm() {
    if !nix::unistd::geteuid().is_root() {
        skip("needs root");
        return;
    }
    for t in [
        "qemu-system-x86_64",
        "cpio",
        "gzip",
        "sfdisk",
        "mkfs.ext4",
        "mdadm",
        "dmsetup",
        "busybox",
    ] {
        if which(t).is_none() {
            skip(&format!(
                "needs `{t}` (qemu-system-x86, cpio, busybox-static, mdadm, dmsetup …)"
            ));
            return;
        }
    }
    let Some((kernel, kver)) = cloud_kernel() else {
        skip("needs linux-image-cloud-amd64 (/boot/vmlinuz-*-cloud-amd64)");
        return;
    };
    let dir = tempfile::Builder::new()
        .prefix("gpuq-vm-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let n1 = image(d, "n1.img", true);
    let n2 = image(d, "n2.img", false);
    run_ok(
        "sfdisk",
        &["--quiet", n2.to_str().unwrap()],
        Some("label: gpt\n,16M\n,16M\n"),
    );
    let n3 = image(d, "n3.img", false);
    let n4 = image(d, "n4.img", false);
    let n5 = image(d, "n5.img", true);
    let n6 = image(d, "n6.img", true);
    let n7 = image(d, "n7.img", false);
    run_ok("mkfs.ext4", &["-q", "-F", n7.to_str().unwrap()], None);
    let hdd = image(d, "hdd.img", true);
    // n9: an ext4 on a drive whose host side ignores discards.
    let n9 = image(d, "n9.img", false);
    run_ok("mkfs.ext4", &["-q", "-F", n9.to_str().unwrap()], None);
    let n9_before = (edge_hash(&n9), fs::metadata(&n9).unwrap().blocks());
    let host_before: Vec<(PathBuf, u64)> = [&n2, &n5, &n6, &hdd]
        .iter()
        .map(|p| ((*p).clone(), edge_hash(p)))
        .collect();
    let n1_alloc = fs::metadata(&n1).unwrap().blocks() * 512;

    // n8 becomes the guest's root filesystem in the second stage; the build
    // script writes the initramfs tree into it.
    // Sized from the helper it carries (a debug build with debuginfo, over
    // 110 MB since the node helper speaks D-Bus): twice that, at least
    // 256 MiB; sparse, so the size costs nothing.
    let n8 = d.join("n8.img");
    let root_size = (2 * fs::metadata(BIN).unwrap().len()).max(256 * MIB);
    File::create(&n8).unwrap().set_len(root_size).unwrap();
    let initrd = d.join("initramfs.cpio.gz");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../integration/vm/build-initramfs.sh");
    run_ok(
        "bash",
        &[
            script.to_str().unwrap(),
            initrd.to_str().unwrap(),
            BIN,
            &kver,
            n8.to_str().unwrap(),
        ],
        None,
    );

    let mut args: Vec<String> = [
        "-accel",
        "tcg",
        "-cpu",
        "qemu64",
        "-machine",
        "q35",
        "-m",
        "1024",
        "-smp",
        "1",
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
        "-monitor",
        "none",
        "-serial",
        "stdio",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend([
        "-kernel".into(),
        kernel.display().to_string(),
        "-initrd".into(),
        initrd.display().to_string(),
        "-append".into(),
        "console=ttyS0 panic=-1 quiet loglevel=1".into(),
    ]);
    for (i, img) in [&n1, &n2, &n3, &n4, &n5, &n6, &n7, &n8].iter().enumerate() {
        let id = format!("n{}", i + 1);
        args.push("-drive".into());
        args.push(format!(
            "file={},if=none,id={id},format=raw,discard=unmap",
            img.display()
        ));
        args.push("-device".into());
        args.push(format!(
            "nvme,serial=SN-GPUQ-000{},drive={id},addr=0x{:x}",
            i + 1,
            0x10 + i
        ));
    }
    args.push("-drive".into());
    args.push(format!(
        "file={},if=none,id=n9,format=raw,discard=ignore",
        n9.display()
    ));
    args.push("-device".into());
    args.push("nvme,serial=SN-GPUQ-0009,drive=n9,addr=0x19".into());
    args.push("-drive".into());
    args.push(format!("file={},if=none,id=h,format=raw", hdd.display()));
    args.push("-device".into());
    args.push("virtio-blk-pci,drive=h,serial=HDD-GPUQ-0001,addr=0x18".into());

    let out = Command::new("timeout")
        .arg("300")
        .arg("qemu-system-x86_64")
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let console = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vm-console.log");
    fs::write(&log, &console).unwrap();
    eprintln!("vm console: {}", log.display());
    assert!(
        console.contains("GPUQ-DONE"),
        "VM did not finish ({}):\n{console}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let r = parse_console(&console);

    // Identity by the real (space-padded) NVMe serial and PCI address.
    let (code, _, v) = &r["inventory"];
    assert_eq!(*code, 0, "{v:#}");
    let seen = &v["devices"][0]["device"];
    assert_eq!(seen["serial"], "SN-GPUQ-0001");
    assert_eq!(seen["pci"], "0000:00:10.0");
    assert_eq!(seen["nsid"], 1);

    let expect = [
        ("serial_mismatch", "identity_mismatch", "SN-WRONG-0009"),
        ("pci_mismatch", "identity_mismatch", "0000:00:11.0"),
        ("partitions", "partitions", "p1"),
        ("md_member", "holders", "md0"),
        ("dm_holder", "holders", "dm-0"),
        ("no_discard", "discard_unsupported", "discard_max_bytes=0"),
        ("os_disk", "os_disk", "holds the root filesystem"),
        ("root_disk", "os_disk", "holds the root filesystem"),
        ("hdd", "rotational", "queue/rotational=1"),
    ];
    // Every refusal names what it saw (a needle, never empty: an empty
    // one would match any text).
    for (name, reason, needle) in expect {
        assert!(!needle.is_empty(), "{name}: no expected text");
        let (code, same, v) = r
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in:\n{console}"));
        assert_eq!(*code, 1, "{name}: {v:#}");
        assert!(reasons(v).iter().any(|x| x == reason), "{name}: {v:#}");
        assert!(details(v).contains(needle), "{name}: {v:#}");
        assert!(*same, "{name}: device changed in the guest after a refusal");
        assert_eq!(v["devices"][0]["bytes_discarded"], 0);
    }
    assert!(reasons(&r["partitions"].2).contains(&"foreign_signature".to_string()));

    // A drive that ignores the deallocate: every check passed (ext4 was
    // expected), BLKDISCARD succeeded, and the verifying probe still found
    // the ext4, so the wipe fails (exit 4) with signature_after_wipe; the
    // audit record in the guest says the same.
    let (code, same, v) = r
        .get("ignored_discard")
        .unwrap_or_else(|| panic!("no ignored_discard in:\n{console}"));
    assert_eq!(*code, 4, "{v:#}");
    assert_eq!(v["result"], "failed", "{v:#}");
    let dev = &v["devices"][0];
    assert_eq!(dev["result"], "failed", "{v:#}");
    assert_eq!(reasons(v), ["signature_after_wipe"], "{v:#}");
    assert!(
        details(v).contains("still found after discard: ext4"),
        "{v:#}"
    );
    assert_eq!(dev["bytes_discarded"], IMG, "{v:#}");
    assert_eq!(dev["signatures_before"][0]["type"], "ext4", "{v:#}");
    assert_eq!(dev["signatures_after"][0]["type"], "ext4", "{v:#}");
    assert_eq!(
        dev["audit"], "/run/jobs/vm-1/wipe-SN-GPUQ-0009.json",
        "{v:#}"
    );
    // The fault is real: the guest read the same edges back, and the
    // host's file kept its data and blocks.
    assert!(
        *same,
        "ignored_discard: the drive did not ignore the discard"
    );
    assert_eq!(
        (edge_hash(&n9), fs::metadata(&n9).unwrap().blocks()),
        n9_before,
        "n9.img changed although QEMU ignores discards on it"
    );
    let (_, _, rec) = r
        .get("ignored_discard_audit")
        .unwrap_or_else(|| panic!("no audit record printed in:\n{console}"));
    assert_eq!(rec["result"], "failed", "{rec:#}");
    assert_eq!(rec["lease"], "vm-1", "{rec:#}");
    assert_eq!(rec["refusals"], dev["refusals"], "{rec:#}");
    assert_eq!(rec["bytes_discarded"], IMG, "{rec:#}");

    // Discard + verify on a real NVMe namespace.
    let (code, _, v) = &r["clean"];
    assert_eq!(*code, 0, "{v:#}");
    assert_eq!(v["devices"][0]["result"], "wiped");
    assert_eq!(v["devices"][0]["bytes_discarded"], IMG);
    let after = fs::metadata(&n1).unwrap().blocks() * 512;
    assert!(
        after < n1_alloc / 4,
        "host backing file not punched: {n1_alloc} -> {after}"
    );

    // Host side: refused devices are byte-for-byte unchanged.
    for (p, h) in host_before {
        assert_eq!(edge_hash(&p), h, "{} changed", p.display());
    }
}
