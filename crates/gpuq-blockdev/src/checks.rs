//! Pure wipe policy: each function turns facts (already read from the
//! system, or the error that prevented reading them) into one
//! [`CheckResult`]. No I/O here, so every rule has unit tests; an `Err` fact
//! always refuses (fail closed).

use std::collections::BTreeSet;

use crate::config::DeviceEntry;
use crate::probe;
use crate::report::{CheckResult, Reason, Signature};
use crate::system::{DevNum, Disk, Mount, ProcRef, ProcScan};

type Fact<T> = Result<T, String>;

/// Compare what the allowlist entry says with what the device is.
pub fn identity(entry: &DeviceEntry, disk: &Disk) -> CheckResult {
    let mut bad = Vec::new();
    let mut good = Vec::new();
    let mut cmp = |key: &str, want: Option<String>, have: Option<String>| {
        if let Some(w) = want {
            match have {
                Some(h) if h == w => good.push(format!("{key}={h}")),
                Some(h) => bad.push(format!("{key} is {h:?}, allowlist says {w:?}")),
                None => bad.push(format!("{key} is unknown, allowlist says {w:?}")),
            }
        }
    };
    cmp("serial", entry.serial.clone(), disk.serial.clone());
    cmp("pci", entry.pci.clone(), disk.pci.clone());
    cmp(
        "nsid",
        entry.nsid.map(|n| n.to_string()),
        disk.nsid.map(|n| n.to_string()),
    );
    cmp("model", entry.model.clone(), disk.model.clone());
    cmp(
        "loop_backing_file",
        entry
            .loop_backing_file
            .as_ref()
            .map(|p| p.display().to_string()),
        disk.loop_backing_file
            .as_ref()
            .map(|p| p.display().to_string()),
    );
    if entry.loop_backing_file.is_none() && disk.nvme_controller.is_none() {
        bad.push(format!("{} is not an NVMe namespace", disk.name));
    }
    if bad.is_empty() {
        CheckResult::pass(Reason::IdentityMismatch, good.join(", "))
    } else {
        CheckResult::refuse(
            Reason::IdentityMismatch,
            format!("{}: {}", disk.name, bad.join("; ")),
        )
    }
}

/// `BLKGETSIZE64`, sysfs and the allowlist must agree.
pub fn size(sysfs: Fact<u64>, ioctl: Fact<u64>, expected: Option<u64>) -> CheckResult {
    let r = Reason::SizeMismatch;
    let sysfs = match sysfs {
        Ok(s) => s,
        Err(e) => return CheckResult::unknown(r, format!("sysfs size: {e}")),
    };
    let ioctl = match ioctl {
        Ok(s) => s,
        Err(e) => return CheckResult::unknown(r, format!("BLKGETSIZE64: {e}")),
    };
    if sysfs != ioctl {
        return CheckResult::refuse(
            r,
            format!("BLKGETSIZE64 says {ioctl} bytes, sysfs says {sysfs}"),
        );
    }
    if ioctl == 0 {
        return CheckResult::refuse(r, "device has size 0");
    }
    match expected {
        Some(e) if e != ioctl => {
            CheckResult::refuse(r, format!("device has {ioctl} bytes, allowlist says {e}"))
        }
        _ => CheckResult::pass(r, format!("{ioctl} bytes")),
    }
}

/// `queue/rotational` must be `0`.
pub fn rotational(v: Fact<String>) -> CheckResult {
    let r = Reason::Rotational;
    match v.as_deref() {
        Ok("0") => CheckResult::pass(r, "queue/rotational=0"),
        Ok("1") => CheckResult::refuse(
            r,
            "queue/rotational=1: a rotating disk (HDD) is never wiped",
        ),
        Ok(other) => CheckResult::unknown(r, format!("queue/rotational={other:?}")),
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// sysfs `ro`, `BLKROGET` and the read-write open must all say writable.
pub fn read_only(sysfs: Fact<String>, ioctl: Fact<bool>, rw_open: Fact<()>) -> CheckResult {
    let r = Reason::ReadOnly;
    match sysfs.as_deref() {
        Ok("0") => {}
        Ok("1") => return CheckResult::refuse(r, "sysfs ro=1"),
        Ok(o) => return CheckResult::unknown(r, format!("sysfs ro={o:?}")),
        Err(e) => return CheckResult::unknown(r, e),
    }
    match ioctl {
        Ok(false) => {}
        Ok(true) => return CheckResult::refuse(r, "BLKROGET reports read-only"),
        Err(e) => return CheckResult::unknown(r, format!("BLKROGET: {e}")),
    }
    match rw_open {
        Ok(()) => CheckResult::pass(r, "writable"),
        Err(e) => CheckResult::refuse(r, e),
    }
}

/// The device must not be (under) the disk holding `/`, `/boot` …
pub fn os_disk(me: DevNum, os_disks: Fact<BTreeSet<DevNum>>) -> CheckResult {
    let r = Reason::OsDisk;
    match os_disks {
        Ok(s) if s.contains(&me) => CheckResult::refuse(
            r,
            "holds the root filesystem, /boot, /usr or /var of this system",
        ),
        Ok(s) => CheckResult::pass(
            r,
            format!(
                "os disks: {}",
                s.iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ),
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// No mount of the device, a partition or anything stacked on it.
pub fn mounted(
    involved: &BTreeSet<DevNum>,
    mounts: Fact<Vec<(Mount, Option<DevNum>)>>,
) -> CheckResult {
    let r = Reason::Mounted;
    match mounts {
        Ok(m) => {
            let hits: Vec<String> = m
                .iter()
                .filter(|(m, src)| {
                    involved.contains(&m.devnum) || src.is_some_and(|s| involved.contains(&s))
                })
                .map(|(m, _)| format!("{} ({} from {})", m.mountpoint, m.fstype, m.source))
                .collect();
            if hits.is_empty() {
                CheckResult::pass(r, "no mounts")
            } else {
                CheckResult::refuse(r, format!("mounted at {}", hits.join(", ")))
            }
        }
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// No partition nodes.
pub fn partitions(parts: Fact<Vec<(String, DevNum)>>) -> CheckResult {
    let r = Reason::Partitions;
    match parts {
        Ok(p) if p.is_empty() => CheckResult::pass(r, "no partitions"),
        Ok(p) => CheckResult::refuse(
            r,
            format!(
                "has partitions {}",
                p.iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// No holders (dm, md, LVM, dm-crypt) on the device or its partitions, and
/// no loop device backed by it.
pub fn holders(holders: Fact<Vec<String>>, loops: Fact<Vec<String>>) -> CheckResult {
    let r = Reason::Holders;
    match (holders, loops) {
        (Ok(h), Ok(l)) if h.is_empty() && l.is_empty() => CheckResult::pass(r, "no holders"),
        (Ok(h), Ok(l)) => {
            let mut parts = Vec::new();
            if !h.is_empty() {
                parts.push(format!("held by {}", h.join(", ")));
            }
            if !l.is_empty() {
                parts.push(format!("backs loop device {}", l.join(", ")));
            }
            CheckResult::refuse(r, parts.join("; "))
        }
        (Err(e), _) | (_, Err(e)) => CheckResult::unknown(r, e),
    }
}

/// Not exported by the kernel NVMe target (a remote host may be writing
/// to it through nvmet, which holds it as no process and without
/// `O_EXCL`).
pub fn nvmet_export(exports: Fact<Vec<String>>) -> CheckResult {
    let r = Reason::NvmetExport;
    match exports {
        Ok(e) if e.is_empty() => CheckResult::pass(r, "not exported over NVMe-oF"),
        Ok(e) => CheckResult::refuse(
            r,
            format!("exported over NVMe-oF by nvmet: {}", e.join("; ")),
        ),
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// Not an active swap area (the device or a partition).
pub fn swap(
    involved: &BTreeSet<DevNum>,
    swaps: Fact<Vec<(String, Option<DevNum>, bool)>>,
) -> CheckResult {
    let r = Reason::Swap;
    match swaps {
        Ok(s) => {
            if let Some((name, _, _)) = s.iter().find(|(_, d, _)| d.is_none()) {
                return CheckResult::unknown(r, format!("swap area {name} cannot be resolved"));
            }
            let hits: Vec<&str> = s
                .iter()
                .filter(|(_, d, is_blk)| *is_blk && d.is_some_and(|d| involved.contains(&d)))
                .map(|(n, _, _)| n.as_str())
                .collect();
            if hits.is_empty() {
                CheckResult::pass(r, "not an active swap area")
            } else {
                CheckResult::refuse(r, format!("active swap: {}", hits.join(", ")))
            }
        }
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// No other process has it open, and our exclusive open succeeded (or its
/// failure is explained by a mount, swap or holder refusal).
pub fn open_by_other(
    scan: &Fact<ProcScan>,
    excl: &Result<(), String>,
    explained: bool,
) -> CheckResult {
    let r = Reason::OpenByOther;
    let (procs, note) = match scan {
        Ok(s) => (&s.holders, uninspected_note(&s.uninspected)),
        Err(e) => return CheckResult::unknown(r, format!("/proc scan: {e}")),
    };
    if !procs.is_empty() {
        return CheckResult::refuse(
            r,
            format!(
                "open by {}",
                procs
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    match excl {
        Ok(()) => CheckResult::pass(
            r,
            format!("exclusive open succeeded; no other process has it open{note}"),
        ),
        Err(_) if explained => CheckResult::pass(
            r,
            format!("exclusive open refused, explained by mount/swap/holder refusals; no process has it open{note}"),
        ),
        Err(e) => CheckResult::refuse(
            r,
            format!("exclusive open refused ({e}) and no process found in /proc: another exclusive user (kernel or another namespace)"),
        ),
    }
}

fn uninspected_note(u: &[ProcRef]) -> String {
    if u.is_empty() {
        String::new()
    } else {
        format!(
            " (descriptors not visible to us: {})",
            u.iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// Our `flock(LOCK_EX|LOCK_NB)` must succeed.
pub fn locked(lock: Fact<()>) -> CheckResult {
    match lock {
        Ok(()) => CheckResult::pass(Reason::Locked, "flock LOCK_EX taken and held"),
        Err(e) => CheckResult::refuse(Reason::Locked, e),
    }
}

/// A PCI function must be bound to the kernel `nvme` driver and not be
/// locked by SPDK.
pub fn userspace_driver(
    pci: Option<&str>,
    driver: Fact<Option<String>>,
    spdk_lock: Fact<Option<u32>>,
) -> CheckResult {
    let r = Reason::UserspaceDriver;
    let Some(pci) = pci else {
        return CheckResult::pass(r, "not a PCI device");
    };
    match driver {
        Ok(Some(d)) if d == "nvme" => {}
        Ok(Some(d)) => return CheckResult::refuse(r, format!("{pci} is bound to {d}, not nvme")),
        Ok(None) => return CheckResult::refuse(r, format!("{pci} is bound to no driver")),
        Err(e) => return CheckResult::unknown(r, format!("driver of {pci}: {e}")),
    }
    match spdk_lock {
        Ok(None) => CheckResult::pass(r, format!("{pci} bound to nvme, no SPDK lock")),
        Ok(Some(pid)) => CheckResult::refuse(
            r,
            format!("/var/tmp/spdk_pci_lock_{pci} is locked by pid {pid}"),
        ),
        Err(e) => CheckResult::unknown(r, format!("SPDK lock file of {pci}: {e}")),
    }
}

/// Every signature must be expected for this lease.
pub fn foreign_signature(found: &Fact<Vec<Signature>>, expected: &[String]) -> CheckResult {
    let r = Reason::ForeignSignature;
    match found {
        Ok(s) => {
            let u = probe::unexpected(s, expected);
            if u.is_empty() {
                CheckResult::pass(
                    r,
                    if s.is_empty() {
                        "no signatures".to_string()
                    } else {
                        format!(
                            "only expected signatures: {}",
                            probe::describe(&s.iter().collect::<Vec<_>>())
                        )
                    },
                )
            } else {
                CheckResult::refuse(r, format!("found {}", probe::describe(&u)))
            }
        }
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// An activation's signature check: what is on the device is named (the
/// operator approved its destruction); only a probe that failed refuses.
pub fn signature_to_destroy(found: &Fact<Vec<Signature>>) -> CheckResult {
    let r = Reason::ForeignSignature;
    match found {
        Ok(s) if s.is_empty() => CheckResult::pass(r, "no signatures".to_string()),
        Ok(s) => CheckResult::pass(
            r,
            format!(
                "found {}; the activation discards it",
                probe::describe(&s.iter().collect::<Vec<_>>())
            ),
        ),
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// No DAOS engine or SPDK application uses the device or its PCI function.
pub fn external_engine(scan: &Fact<ProcScan>, spdk_holder: Option<ProcRef>) -> CheckResult {
    let r = Reason::ExternalEngine;
    match scan {
        Ok(s) => {
            let mut hits: Vec<String> = s
                .holders
                .iter()
                .filter(|p| crate::system::is_engine(&p.comm))
                .map(|p| p.to_string())
                .collect();
            if let Some(h) = spdk_holder.filter(|h| crate::system::is_engine(&h.comm)) {
                hits.push(format!("{h} holds the SPDK lock"));
            }
            if hits.is_empty() {
                CheckResult::pass(r, "no DAOS/SPDK engine uses it")
            } else {
                CheckResult::refuse(r, format!("in use by {}", hits.join(", ")))
            }
        }
        Err(e) => CheckResult::unknown(r, e),
    }
}

/// The node's active lease, if any, must be the caller's.
pub fn foreign_lease(mine: Option<&str>, active: Fact<Option<String>>) -> CheckResult {
    let r = Reason::ForeignLease;
    match (active, mine) {
        (Ok(None), _) => CheckResult::pass(r, "no active lease on this node"),
        (Ok(Some(a)), Some(m)) if a == m => CheckResult::pass(r, format!("active lease is {a}")),
        (Ok(Some(a)), Some(m)) => CheckResult::refuse(r, format!("node is leased to {a}, not {m}")),
        (Ok(Some(a)), None) => CheckResult::refuse(r, format!("node is leased to {a}")),
        (Err(e), _) => CheckResult::unknown(r, e),
    }
}

/// The device must advertise discard (`queue/discard_max_bytes` > 0).
pub fn discard_supported(max: Fact<String>) -> CheckResult {
    let r = Reason::DiscardUnsupported;
    match max.map(|s| s.parse::<u64>()) {
        Ok(Ok(0)) => CheckResult::refuse(
            r,
            "queue/discard_max_bytes=0: no discard support; no other wipe method is used",
        ),
        Ok(Ok(n)) => CheckResult::pass(r, format!("discard_max_bytes={n}")),
        Ok(Err(e)) => CheckResult::unknown(r, format!("queue/discard_max_bytes: {e}")),
        Err(e) => CheckResult::unknown(r, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Verdict;

    fn dn(a: u32, b: u32) -> DevNum {
        DevNum { major: a, minor: b }
    }

    fn nvme_disk() -> Disk {
        Disk {
            name: "nvme0n1".into(),
            serial: Some("SN1".into()),
            pci: Some("0000:00:03.0".into()),
            nsid: Some(1),
            nvme_controller: Some("nvme0".into()),
            ..Disk::default()
        }
    }

    fn nvme_entry() -> DeviceEntry {
        DeviceEntry {
            serial: Some("SN1".into()),
            pci: Some("0000:00:03.0".into()),
            nsid: Some(1),
            ..DeviceEntry::default()
        }
    }

    #[test]
    fn an_nvmet_export_refuses_naming_it_and_an_unreadable_tree_fails_closed() {
        assert_eq!(nvmet_export(Ok(vec![])).verdict, Verdict::Pass);
        let c = nvmet_export(Ok(vec![
            "subsystem nqn.x namespace 1 (enabled): /dev/nvme0n1".into(),
        ]));
        assert_eq!(c.verdict, Verdict::Refuse);
        assert_eq!(
            c.detail,
            "exported over NVMe-oF by nvmet: subsystem nqn.x namespace 1 (enabled): /dev/nvme0n1"
        );
        assert_eq!(
            nvmet_export(Err("nvmet is loaded but ... cannot be read".into())).verdict,
            Verdict::Refuse
        );
    }

    #[test]
    fn identity_matches() {
        assert_eq!(identity(&nvme_entry(), &nvme_disk()).verdict, Verdict::Pass);
    }

    #[test]
    fn identity_pci_mismatch_refuses() {
        let mut e = nvme_entry();
        e.pci = Some("0000:00:04.0".into());
        let c = identity(&e, &nvme_disk());
        assert_eq!(c.verdict, Verdict::Refuse);
        assert!(c.detail.contains("pci"), "{}", c.detail);
    }

    #[test]
    fn identity_non_nvme_refuses() {
        let mut d = nvme_disk();
        d.nvme_controller = None;
        assert_eq!(identity(&nvme_entry(), &d).verdict, Verdict::Refuse);
    }

    #[test]
    fn size_rules() {
        assert_eq!(size(Ok(4096), Ok(4096), None).verdict, Verdict::Pass);
        assert_eq!(size(Ok(4096), Ok(4096), Some(4096)).verdict, Verdict::Pass);
        assert_eq!(size(Ok(4096), Ok(8192), None).verdict, Verdict::Refuse);
        assert_eq!(size(Ok(4096), Ok(4096), Some(1)).verdict, Verdict::Refuse);
        assert_eq!(size(Err("x".into()), Ok(1), None).verdict, Verdict::Refuse);
        assert_eq!(size(Ok(0), Ok(0), None).verdict, Verdict::Refuse);
    }

    #[test]
    fn rotational_fails_closed() {
        assert_eq!(rotational(Ok("0".into())).verdict, Verdict::Pass);
        assert_eq!(rotational(Ok("1".into())).verdict, Verdict::Refuse);
        assert_eq!(rotational(Ok("".into())).verdict, Verdict::Refuse);
        assert_eq!(rotational(Err("eio".into())).verdict, Verdict::Refuse);
    }

    #[test]
    fn read_only_rules() {
        assert_eq!(
            read_only(Ok("0".into()), Ok(false), Ok(())).verdict,
            Verdict::Pass
        );
        assert_eq!(
            read_only(Ok("1".into()), Ok(false), Ok(())).verdict,
            Verdict::Refuse
        );
        assert_eq!(
            read_only(Ok("0".into()), Ok(true), Ok(())).verdict,
            Verdict::Refuse
        );
        assert_eq!(
            read_only(Ok("0".into()), Ok(false), Err("EROFS".into())).verdict,
            Verdict::Refuse
        );
    }

    #[test]
    fn os_disk_rules() {
        let s: BTreeSet<_> = [dn(254, 0)].into();
        assert_eq!(os_disk(dn(254, 0), Ok(s.clone())).verdict, Verdict::Refuse);
        assert_eq!(os_disk(dn(7, 0), Ok(s)).verdict, Verdict::Pass);
        assert_eq!(
            os_disk(dn(7, 0), Err("no /".into())).verdict,
            Verdict::Refuse
        );
    }

    fn mount(d: DevNum, mp: &str) -> Mount {
        Mount {
            devnum: d,
            mountpoint: mp.into(),
            fstype: "ext4".into(),
            source: "/dev/x".into(),
        }
    }

    #[test]
    fn mounted_partition_or_by_source() {
        let inv: BTreeSet<_> = [dn(7, 0), dn(259, 1)].into();
        let c = mounted(&inv, Ok(vec![(mount(dn(259, 1), "/mnt"), None)]));
        assert_eq!(c.verdict, Verdict::Refuse);
        assert!(c.detail.contains("/mnt"));
        let c = mounted(&inv, Ok(vec![(mount(dn(0, 40), "/b"), Some(dn(7, 0)))]));
        assert_eq!(c.verdict, Verdict::Refuse);
        let c = mounted(&inv, Ok(vec![(mount(dn(254, 0), "/"), None)]));
        assert_eq!(c.verdict, Verdict::Pass);
    }

    #[test]
    fn swap_unresolvable_refuses() {
        let inv: BTreeSet<_> = [dn(7, 0)].into();
        assert_eq!(
            swap(&inv, Ok(vec![("/dev/x (deleted)".into(), None, false)])).verdict,
            Verdict::Refuse
        );
        assert_eq!(
            swap(&inv, Ok(vec![("/dev/loop0".into(), Some(dn(7, 0)), true)])).verdict,
            Verdict::Refuse
        );
        // A swap file on another filesystem that happens to be on this device
        // is a mount refusal, not a swap one.
        assert_eq!(
            swap(
                &inv,
                Ok(vec![("/swapfile".into(), Some(dn(254, 0)), false)])
            )
            .verdict,
            Verdict::Pass
        );
    }

    #[test]
    fn open_by_other_names_pids() {
        let p = ProcScan {
            holders: vec![ProcRef {
                pid: 42,
                comm: "sleep".into(),
            }],
            uninspected: vec![],
        };
        let c = open_by_other(&Ok(p), &Ok(()), false);
        assert_eq!(c.verdict, Verdict::Refuse);
        assert!(c.detail.contains("pid 42"));
        let none = Ok(ProcScan::default());
        let c = open_by_other(&none, &Err("EBUSY".into()), false);
        assert_eq!(c.verdict, Verdict::Refuse);
        let c = open_by_other(&none, &Err("EBUSY".into()), true);
        assert_eq!(c.verdict, Verdict::Pass);
        let c = open_by_other(&Err("EACCES".into()), &Ok(()), false);
        assert_eq!(c.verdict, Verdict::Refuse);
    }

    #[test]
    fn userspace_driver_rules() {
        let p = Some("0000:00:03.0");
        assert_eq!(
            userspace_driver(p, Ok(Some("nvme".into())), Ok(None)).verdict,
            Verdict::Pass
        );
        assert_eq!(
            userspace_driver(p, Ok(Some("uio_pci_generic".into())), Ok(None)).verdict,
            Verdict::Refuse
        );
        assert_eq!(
            userspace_driver(p, Ok(Some("nvme".into())), Ok(Some(7))).verdict,
            Verdict::Refuse
        );
        assert_eq!(
            userspace_driver(None, Err("x".into()), Ok(None)).verdict,
            Verdict::Pass
        );
    }

    #[test]
    fn engine_refuses() {
        let p = Ok(ProcScan {
            holders: vec![ProcRef {
                pid: 9,
                comm: "daos_engine".into(),
            }],
            uninspected: vec![],
        });
        assert_eq!(external_engine(&p, None).verdict, Verdict::Refuse);
        assert_eq!(
            external_engine(&Ok(ProcScan::default()), None).verdict,
            Verdict::Pass
        );
        let holder = ProcRef {
            pid: 3,
            comm: "spdk_tgt".into(),
        };
        assert_eq!(
            external_engine(&Ok(ProcScan::default()), Some(holder)).verdict,
            Verdict::Refuse
        );
    }

    #[test]
    fn lease_rules() {
        assert_eq!(foreign_lease(Some("a"), Ok(None)).verdict, Verdict::Pass);
        assert_eq!(
            foreign_lease(Some("a"), Ok(Some("a".into()))).verdict,
            Verdict::Pass
        );
        assert_eq!(
            foreign_lease(Some("a"), Ok(Some("b".into()))).verdict,
            Verdict::Refuse
        );
        assert_eq!(
            foreign_lease(None, Ok(Some("b".into()))).verdict,
            Verdict::Refuse
        );
        assert_eq!(
            foreign_lease(Some("a"), Err("eacces".into())).verdict,
            Verdict::Refuse
        );
    }

    #[test]
    fn discard_support_rules() {
        assert_eq!(discard_supported(Ok("0".into())).verdict, Verdict::Refuse);
        assert_eq!(discard_supported(Ok("4096".into())).verdict, Verdict::Pass);
        assert_eq!(discard_supported(Ok("x".into())).verdict, Verdict::Refuse);
    }
}
