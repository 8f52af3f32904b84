//! `gpuq activate`'s plan on one node (issue #17, item 1): every
//! allowlisted device as the read-only checks see it — its identity, the
//! signatures on it, a mount — the named systemd units, and the steps an
//! activation would take; computing it changes nothing.
//!
//! Real parts: loop devices (non-rotational, `allow_loop_devices`), a real
//! ext4 made by mkfs.ext4 on one and a real mount of another; the node
//! configuration loaded as the helper loads it. This host has no D-Bus
//! system bus (PID 1 is not systemd, docs/testing.md), so the unit part
//! here is the answer "systemd could not be asked"; the site VM asks a real
//! systemd.

#[path = "../../gpuq-blockdev/tests/common/mod.rs"]
mod common;

use common::{loop_entry, LoopDev, Node, MIB};
use gpuq_nodesvc::profile::ServiceConfig;
use std::io::Write;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_shows_each_device_what_is_on_it_and_the_steps_and_changes_nothing() {
    require!(common::root(), "activation plan");
    require!(
        common::tools(&["losetup", "mkfs.ext4", "mount"]),
        "activation plan"
    );
    let with_fs = LoopDev::new(64 * MIB);
    with_fs.mkfs("mkfs.ext4", &["-q", "-F"]);
    let mut mounted = LoopDev::new(64 * MIB);
    mounted.mkfs("mkfs.ext4", &["-q", "-F"]);
    let mp = mounted.mount();
    let node = Node::new(true, &[loop_entry(&with_fs), loop_entry(&mounted)]);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&node.config)
        .unwrap()
        .write_all(b"\n[activation]\nunits = [\"daos_server.service\"]\n")
        .unwrap();
    let cfg = ServiceConfig::load(&node.config).expect("node.toml");
    let before = (with_fs.edge_hash(), mounted.edge_hash());

    let plan = gpuq_nodesvc::activation::plan(&cfg).await;

    assert_eq!(plan.node, "t1");
    assert_eq!(plan.devices.len(), 2, "{plan:#?}");
    let (a, b) = (&plan.devices[0], &plan.devices[1]);
    assert_eq!(a.path.as_deref(), with_fs.dev.to_str());
    assert!(
        a.identity.contains(&with_fs.backing.display().to_string()),
        "{a:?}"
    );
    assert_eq!(a.size_bytes, Some(64 * MIB));
    assert!(a.signatures.iter().any(|s| s.starts_with("ext4")), "{a:?}");
    assert!(
        a.checks
            .iter()
            .any(|c| c.check == "foreign_signature" && c.verdict == "refuse"),
        "{a:?}"
    );
    assert!(
        b.checks.iter().any(|c| c.check == "mounted"
            && c.verdict == "refuse"
            && c.detail.contains(mp.to_str().unwrap())),
        "{b:?}"
    );
    // The steps: the ext4 is what activation expects to destroy; the mount
    // is a refusal it names.
    let steps = plan.steps.join("\n");
    assert!(
        steps.contains(&format!("discard all of {}", with_fs.dev_str())) && steps.contains("ext4"),
        "{steps}"
    );
    assert!(
        steps.contains(mounted.dev_str()) && steps.contains("activation would refuse: mounted"),
        "{steps}"
    );
    assert!(steps.contains("claim record"), "{steps}");
    // What it would refuse at: the mount, and (here, no system bus) the
    // unit; never the ext4, whose destruction is the point.
    assert!(
        plan.refusals
            .iter()
            .any(|r| r.contains(mounted.dev_str()) && r.contains("mounted")),
        "{:?}",
        plan.refusals
    );
    assert!(
        !plan
            .refusals
            .iter()
            .any(|r| r.contains(&format!("{} ", with_fs.dev_str()))),
        "{:?}",
        plan.refusals
    );
    // The unit: systemd asked over the system bus; here there is none.
    assert_eq!(plan.units.len(), 1);
    let u = &plan.units[0];
    assert_eq!(u.unit, "daos_server.service");
    if std::path::Path::new("/run/dbus/system_bus_socket").exists() {
        assert!(u.error.is_some() || !u.load_state.is_empty(), "{u:?}");
    } else {
        assert!(
            u.error.as_deref().is_some_and(|e| e.contains("system bus")),
            "{u:?}"
        );
        assert!(steps.contains("systemd could not be asked"), "{steps}");
    }

    // Nothing changed: the devices' contents, the mount, no node state.
    assert_eq!((with_fs.edge_hash(), mounted.edge_hash()), before);
    assert!(
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .contains(mp.to_str().unwrap()),
        "still mounted"
    );
    assert!(!node.jobs.exists(), "no record, audit or claim written");
}

#[test]
fn a_unit_that_is_not_a_plain_service_name_is_refused_in_the_config() {
    let node = Node::new(true, &[]);
    for bad in ["../x.service", "daos_server", "a b.service", "*.service"] {
        let text = std::fs::read_to_string(&node.config).unwrap()
            + &format!("\n[activation]\nunits = [{bad:?}]\n");
        let e = ServiceConfig::parse(&node.config, &text).unwrap_err();
        assert!(e.to_string().contains("activation.units"), "{bad}: {e}");
    }
}
