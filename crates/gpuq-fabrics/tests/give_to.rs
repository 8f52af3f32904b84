//! `give_to` on a real block device node (a loop device: the NVMe-oF
//! devices exist only in the site VM, whose scenario 4 runs the rest):
//! the owner gets exactly one named-user ACL entry, which the chmod udev
//! does on a change event keeps; a node that is not the expected block
//! device (another device number, a symlink to it, a regular file) is
//! refused and left exactly as it was. Needs root and losetup; fails
//! (never skips) without them.

#[path = "../../gpuq-blockdev/tests/common/mod.rs"]
mod common;

use common::{LoopDev, MIB};
use gpuq_fabrics::{give_to, Namespace};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn devnum(p: &Path) -> String {
    let r = std::fs::metadata(p).unwrap().rdev();
    format!("{}:{}", nix::sys::stat::major(r), nix::sys::stat::minor(r))
}

fn users(p: &Path) -> Vec<u32> {
    let f = std::fs::File::open(p).unwrap();
    gpuq_sys::acl::named_users(f.as_fd()).unwrap()
}

/// Mode, owner, group and ACL of `p`: what a refusal must leave alone.
fn state(p: &Path) -> (u32, u32, u32, Vec<u32>) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.mode(), m.uid(), m.gid(), users(p))
}

#[test]
fn the_owner_gets_one_acl_entry_and_anything_but_the_expected_device_is_refused_untouched() {
    if let Err(why) = common::root().and(common::tools(&["losetup"])) {
        common::skip("give_to", &why);
        return;
    }
    let a = LoopDev::new(8 * MIB);
    let b = LoopDev::new(8 * MIB);
    let ns = |path: PathBuf, devnum: String| Namespace {
        name: "x".into(),
        path,
        nsid: 1,
        devnum,
        size_bytes: 8 * MIB,
    };
    // Another device's number: refused, nothing changed.
    let before = state(&a.dev);
    let e = give_to(&ns(a.dev.clone(), devnum(&b.dev)), 61_001).unwrap_err();
    assert!(
        e.contains("is not block device") && e.contains("nothing was changed"),
        "{e}"
    );
    assert_eq!(state(&a.dev), before);
    // A symlink to the right device: refused (O_NOFOLLOW), nothing changed.
    let d = tempfile::tempdir().unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&a.dev, &link).unwrap();
    let e = give_to(&ns(link, devnum(&a.dev)), 61_001).unwrap_err();
    assert!(e.contains("is not block device"), "{e}");
    assert_eq!(state(&a.dev), before);
    // A regular file: refused, unchanged.
    let file = d.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let fbefore = state(&file);
    assert!(give_to(&ns(file.clone(), devnum(&a.dev)), 61_001).is_err());
    assert_eq!(state(&file), fbefore);
    // The right device: exactly one named user; owner and group unchanged,
    // others nothing.
    give_to(&ns(a.dev.clone(), devnum(&a.dev)), 61_001).unwrap();
    let after = state(&a.dev);
    assert_eq!(after.3, vec![61_001]);
    assert_eq!(
        (after.1, after.2),
        (before.1, before.2),
        "owner and group stay"
    );
    assert_eq!(after.0 & 0o007, 0, "others get nothing");
    // What udev does on a change event keeps the entry.
    std::fs::set_permissions(&a.dev, std::fs::Permissions::from_mode(0o660)).unwrap();
    assert_eq!(users(&a.dev), vec![61_001]);
    // b was never touched.
    assert!(users(&b.dev).is_empty());
}
