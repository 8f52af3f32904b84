//! Library-level tests on real loop devices, as root: the API the node
//! daemon will call (`gpuq_blockdev::run`), inventory, and the checks that
//! are easiest to set up from Rust.

mod common;

use std::os::unix::fs::MetadataExt;

use common::{root, LoopDev, Node, MIB};
use gpuq_blockdev::system::{self, DevNum};
use gpuq_blockdev::{DeviceResult, Mode, NodeResult, Reason, Request};

fn request(mode: Mode) -> Request {
    Request {
        mode,
        lease: Some("lease-lib".into()),
        expected_signatures: Vec::new(),
        purpose: gpuq_blockdev::wipe::Purpose::Lease,
    }
}

fn reasons(r: &gpuq_blockdev::DeviceReport) -> Vec<Reason> {
    r.refusals.iter().map(|f| f.reason).collect()
}

#[test]
fn library_wipe_discards_and_reports() {
    require!(root(), "library wipe");
    let d = LoopDev::new(64 * MIB);
    d.write_data(0, 2 * MIB as usize);
    let n = Node::for_loops(&[&d]);
    let rep = gpuq_blockdev::run(&n.load(), &request(Mode::Wipe)).unwrap();
    assert_eq!(rep.result, NodeResult::Ok, "{rep:#?}");
    let dev = &rep.devices[0];
    assert_eq!(dev.result, DeviceResult::Wiped);
    assert_eq!(dev.bytes_discarded, d.size);
    assert_eq!(dev.device.as_ref().unwrap().name, d.name);
    assert!(d.head_is_zero(2 * MIB as usize));
    assert!(d.allocated() < 64 * 1024);
}

#[test]
fn inventory_sees_the_loop_device_without_udevd() {
    require!(root(), "inventory");
    let d = LoopDev::new(64 * MIB);
    let disks = system::list_disks().unwrap();
    let me = disks
        .iter()
        .find(|x| x.name == d.name)
        .expect("loop device listed");
    assert_eq!(me.loop_backing_file.as_deref(), Some(d.backing.as_path()));
    let rdev = std::fs::metadata(&d.dev).unwrap().rdev();
    assert_eq!(me.devnum, Some(DevNum::from_rdev(rdev)));
    assert!(me.nvme_controller.is_none());
}

#[test]
fn loop_device_stacked_on_it_is_a_holder() {
    require!(root(), "stacked loop");
    let mut d = LoopDev::new(64 * MIB);
    let upper = d.stack_loop();
    let before = d.edge_hash();
    let n = Node::for_loops(&[&d]);
    let rep = gpuq_blockdev::run(&n.load(), &request(Mode::Wipe)).unwrap();
    let dev = &rep.devices[0];
    assert!(reasons(dev).contains(&Reason::Holders), "{dev:#?}");
    let upper_name = upper.file_name().unwrap().to_string_lossy().into_owned();
    assert!(dev.refusals.iter().any(|r| r.detail.contains(&upper_name)));
    assert_eq!(d.edge_hash(), before);
}

#[test]
fn read_only_device_is_refused() {
    require!(root(), "read-only");
    let d = LoopDev::with_losetup_args(64 * MIB, &["-r"]);
    let before = d.edge_hash();
    let n = Node::for_loops(&[&d]);
    let rep = gpuq_blockdev::run(&n.load(), &request(Mode::Wipe)).unwrap();
    let dev = &rep.devices[0];
    assert!(reasons(dev).contains(&Reason::ReadOnly), "{dev:#?}");
    assert_eq!(rep.result, NodeResult::Refused);
    assert_eq!(d.edge_hash(), before);
}

#[test]
fn inspect_mode_writes_no_audit_record() {
    require!(root(), "inspect");
    let d = LoopDev::new(64 * MIB);
    let n = Node::for_loops(&[&d]);
    let rep = gpuq_blockdev::run(
        &n.load(),
        &Request {
            mode: Mode::Inspect,
            lease: None,
            expected_signatures: Vec::new(),
            purpose: gpuq_blockdev::wipe::Purpose::Lease,
        },
    )
    .unwrap();
    assert_eq!(rep.result, NodeResult::Ok, "{rep:#?}");
    assert!(rep.devices[0].audit.is_none());
    assert!(!n.jobs.exists());
}

#[test]
fn root_filesystem_disk_is_an_os_disk() {
    // Where / is on a block device, its whole disk must be in the set.
    let dev = DevNum::from_rdev(std::fs::metadata("/").unwrap().dev());
    let os = gpuq_blockdev::wipe::os_disks().unwrap();
    if dev.is_anonymous() {
        common::skip(
            "root_filesystem_disk_is_an_os_disk",
            &format!("/ is not on a block device here ({dev})"),
        );
        return;
    }
    let below = system::disks_below(dev).unwrap();
    assert!(!below.is_empty());
    assert!(below.is_subset(&os), "{below:?} not in {os:?}");
}

#[test]
fn wipe_without_lease_is_rejected() {
    let n = Node::new(true, &[]);
    let err = gpuq_blockdev::run(
        &n.load(),
        &Request {
            mode: Mode::Wipe,
            lease: None,
            expected_signatures: Vec::new(),
            purpose: gpuq_blockdev::wipe::Purpose::Lease,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("lease"));
}
