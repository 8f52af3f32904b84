//! The wipe's failure codes after every check has passed: `size_mismatch`
//! (the size changed between check and discard), `io_error` and
//! `discard_unsupported` from the `BLKDISCARD` itself, and
//! `signature_after_wipe` from the verifying probe.
//!
//! Each fault is real (a loop device resized with `losetup -c`, the
//! filesystem under a backing file shut down, discard turned off in sysfs,
//! a superblock written through a plain descriptor); the window between the
//! checks and the discard is opened by the crate's test-only fault points
//! (`gpuq_blockdev::fault`, cargo feature `fault-points`), which run the
//! fault in the wipe thread of that one device at that step. Each test
//! checks the report, the audit record on disk, and — where the promise is
//! that nothing was destroyed — the first and last MiB of the backing file.

mod common;

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};

use common::{root, sh, tools, LoopDev, Node, MIB};
use gpuq_blockdev::fault::{self, Point};
use gpuq_blockdev::{DeviceReport, DeviceResult, Mode, NodeResult, Reason, Request};

fn wipe_request() -> Request {
    Request {
        mode: Mode::Wipe,
        lease: Some("lease-faults".into()),
        expected_signatures: Vec::new(),
        purpose: gpuq_blockdev::wipe::Purpose::Lease,
    }
}

/// The wipe of one device, after which that device's report is checked to
/// have failed with exactly `reason` (whose detail contains `detail`), and
/// its audit record on disk to say the same.
fn wipe_fails_with(n: &Node, reason: Reason, detail: &str) -> DeviceReport {
    let rep = gpuq_blockdev::run(&n.load(), &wipe_request()).unwrap();
    assert_eq!(rep.result, NodeResult::Failed, "{rep:#?}");
    let dev = rep.devices[0].clone();
    assert_eq!(dev.result, DeviceResult::Failed, "{dev:#?}");
    let refusals: Vec<_> = dev.refusals.iter().map(|r| r.reason).collect();
    assert_eq!(refusals, vec![reason], "{dev:#?}");
    assert!(
        dev.refusals[0].detail.contains(detail),
        "expected {detail:?} in {:?}",
        dev.refusals[0].detail
    );
    // Every check of phase 1 passed: this is the after-the-checks path.
    let before_discard = dev
        .checks
        .iter()
        .take_while(|c| !(c.check == reason && c.verdict == gpuq_blockdev::Verdict::Refuse));
    assert!(
        before_discard
            .clone()
            .all(|c| c.verdict == gpuq_blockdev::Verdict::Pass),
        "{dev:#?}"
    );
    assert!(before_discard.count() >= 10, "{dev:#?}");

    let path = dev.audit.as_ref().expect("audit path in the report");
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("audit record {path}: {e}"));
    let rec: DeviceReport = serde_json::from_str(&text).unwrap();
    assert_eq!(rec.result, DeviceResult::Failed, "{text}");
    assert_eq!(rec.refusals, dev.refusals, "{text}");
    assert_eq!(rec.bytes_discarded, dev.bytes_discarded, "{text}");
    dev
}

#[test]
fn a_size_change_between_check_and_discard_discards_nothing() {
    require!(root(), "size change between check and discard");
    require!(tools(&["losetup"]), "size change between check and discard");
    let d = LoopDev::new(64 * MIB);
    d.write_data(4 * MIB, 2 * MIB as usize);
    let before = d.edge_hash();
    let allocated = d.allocated();
    let n = Node::for_loops(&[&d]);

    // After every check passed: the backing file grows by 16 MiB and the
    // loop device picks up the new size (LOOP_SET_CAPACITY).
    let (backing, dev) = (d.backing.clone(), d.dev_str().to_string());
    let _hook = fault::at(Point::BeforeDiscard, &d.name, move || {
        File::options()
            .write(true)
            .open(&backing)
            .unwrap()
            .set_len(80 * MIB)
            .unwrap();
        sh("losetup", &["-c", &dev]);
    });
    let rep = wipe_fails_with(&n, Reason::SizeMismatch, "size changed since the checks");

    assert_eq!(rep.bytes_discarded, 0);
    assert_eq!(
        fs::metadata(&d.dev).map(|_| ()).ok(),
        Some(()),
        "device still there"
    );
    assert_eq!(
        sh("blockdev", &["--getsize64", d.dev_str()]).trim(),
        (80 * MIB).to_string(),
        "the resize really happened"
    );
    assert_eq!(d.edge_hash(), before, "first/last MiB changed");
    assert!(
        !d.head_is_zero(MIB as usize),
        "head of the device was discarded"
    );
    assert_eq!(d.allocated(), allocated, "blocks of the backing file freed");
}

#[test]
fn blkdiscard_failing_after_the_checks_is_io_error() {
    require!(root(), "BLKDISCARD I/O error");
    require!(
        tools(&["losetup", "mkfs.ext4", "mount", "xfs_io"]),
        "BLKDISCARD I/O error"
    );
    // The device's backing file lives on an ext4 that another loop device
    // holds; once that filesystem is shut down, every hole punch (what a
    // loop device's discard is) fails and the loop driver answers EIO.
    let mut fs_dev = LoopDev::new(128 * MIB);
    fs_dev.mkfs("mkfs.ext4", &["-q", "-F"]);
    let mnt = fs_dev.mount();
    let d = LoopDev::new_in(&mnt, 64 * MIB);
    d.write_data(4 * MIB, 2 * MIB as usize);
    let n = Node::for_loops(&[&d]);

    let shut = mnt.clone();
    let _hook = fault::at(Point::BeforeDiscard, &d.name, move || {
        sh("xfs_io", &["-x", "-c", "shutdown", shut.to_str().unwrap()]);
    });
    let rep = wipe_fails_with(&n, Reason::IoError, "BLKDISCARD: EIO");
    assert_eq!(rep.bytes_discarded, 0);
    assert!(
        rep.signatures_after.is_none(),
        "verified after a failed discard"
    );
    // `d` (its loop device) goes before the filesystem it lives on.
    drop(d);
}

#[test]
fn discard_turned_off_after_the_checks_is_discard_unsupported_and_discards_nothing() {
    require!(root(), "discard turned off after the checks");
    let mut d = LoopDev::new(64 * MIB);
    d.write_data(4 * MIB, 2 * MIB as usize);
    let before = d.edge_hash();
    let allocated = d.allocated();
    let n = Node::for_loops(&[&d]);

    // The sysfs check saw discard_max_bytes > 0; now the queue stops
    // accepting discards (cannot be undone: the device is removed on drop).
    d.expect_discard_disabled();
    let attr = d.sys("queue/discard_max_bytes");
    let _hook = fault::at(Point::BeforeDiscard, &d.name, move || {
        fs::write(&attr, "0").unwrap();
    });
    let rep = wipe_fails_with(
        &n,
        Reason::DiscardUnsupported,
        "BLKDISCARD: operation not supported",
    );
    assert_eq!(rep.bytes_discarded, 0);
    assert_eq!(d.edge_hash(), before, "first/last MiB changed");
    assert_eq!(d.allocated(), allocated, "blocks of the backing file freed");
}

#[test]
fn a_signature_present_after_the_discard_fails_the_wipe() {
    require!(root(), "signature after wipe");
    require!(tools(&["mkfs.ext4"]), "signature after wipe");
    let d = LoopDev::new(64 * MIB);
    d.write_data(4 * MIB, 2 * MIB as usize);
    let n = Node::for_loops(&[&d]);

    // An ext4 made in a plain file; its first 64 KiB (superblock and group
    // descriptors) are written onto the device between the discard and
    // the verify, through a plain descriptor — what a drive whose firmware
    // ignored the deallocate, or a writer racing the wipe, leaves behind.
    let img = d.dir.path().join("ext4.img");
    File::create(&img).unwrap().set_len(8 * MIB).unwrap();
    sh("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]);
    let mut head = vec![0u8; 64 * 1024];
    File::open(&img).unwrap().read_exact(&mut head).unwrap();
    let dev = d.dev.clone();
    let _hook = fault::at(Point::AfterDiscard, &d.name, move || {
        let mut f = File::options().write(true).open(&dev).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(&head).unwrap();
        f.sync_all().unwrap();
    });
    let rep = wipe_fails_with(&n, Reason::SignatureAfterWipe, "still found after discard");
    assert!(rep.refusals[0].detail.contains("ext4"), "{rep:#?}");
    assert_eq!(rep.bytes_discarded, d.size, "the discard itself ran");
    let after = rep.signatures_after.as_ref().expect("signatures_after");
    assert!(after.iter().any(|s| s.kind == "ext4"), "{rep:#?}");
    assert!(rep.signatures_before.is_empty(), "{rep:#?}");
}
