//! Inventory, checks and the wipe itself.
//!
//! Two phases, so that nothing is destroyed anywhere unless everything is
//! safe everywhere:
//!
//! 1. For every allowlisted device, concurrently: resolve the allowlist entry
//!    to a block device, open it `O_RDWR|O_EXCL`, take `flock(LOCK_EX)`, and
//!    evaluate every check while holding both. The descriptor stays open.
//! 2. Only if every check passed on every device (and this is not a dry
//!    run): on the same descriptors, concurrently, `BLKGETSIZE64`, one
//!    `BLKDISCARD` over the whole device, and a fresh libblkid probe that
//!    must find nothing.
//!
//! The exclusive open is what closes the window between check and discard:
//! while we hold it the kernel refuses mounts, swapon, dm/md/LVM claims and
//! other exclusive openers. Plain opens are not stopped by it, which is why
//! the /proc scan runs after the open.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::audit;
use crate::checks;
use crate::config::{DeviceEntry, NodeConfig};
use crate::probe;
use crate::report::{
    CheckResult, DeviceReport, DeviceResult, NodeReport, NodeResult, Reason, SeenIdentity, Verdict,
};
use crate::system::{self, DevNum, Disk, ProcRef};

/// What the caller wants done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `devices`: checks only, no audit record.
    Inspect,
    /// `wipe --dry-run`: checks, plan and a `dry_run` audit record.
    DryRun,
    /// `wipe`: checks, discard, verify, audit.
    Wipe,
}

/// One request.
#[derive(Debug, Clone)]
pub struct Request {
    pub mode: Mode,
    /// Required for `DryRun` and `Wipe`.
    pub lease: Option<String>,
    /// Signature types (libblkid `TYPE`/`PTTYPE`) this lease is known to
    /// leave behind and that may therefore be discarded.
    pub expected_signatures: Vec<String>,
    /// Why the devices are checked (and discarded): it is written into each
    /// audit record.
    pub purpose: Purpose,
}

/// Why a wipe runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    /// A lease's data (or an operator's `gpuq-node wipe --lease`): any
    /// signature that is not expected refuses.
    Lease,
    /// `gpuq activate --execute --destroy-existing-data`: what the site had
    /// on its devices before gpuq is what this discard is for, so a
    /// signature is reported and discarded; every other check still refuses.
    Activation,
}

/// Errors that prevent producing a report at all.
#[derive(Debug, thiserror::Error)]
pub enum WipeError {
    #[error("a lease is required for wipe")]
    MissingLease,
    #[error("invalid lease name {0:?}: use letters, digits, '.', '_' and '-' (at most 128, not starting with '.')")]
    InvalidLease(String),
}

/// Name of the file in `jobs_dir` that holds the node's active lease. The
/// node daemon writes it when a lease starts and removes it when the lease
/// is released; a wipe for any other lease is refused (`foreign_lease`).
pub const ACTIVE_LEASE_FILE: &str = "active-lease";

/// How long to retry `flock` when someone (udev) holds a short lock.
const FLOCK_TRIES: u32 = 10;
const FLOCK_PAUSE: Duration = Duration::from_millis(100);

/// How long to rescan /proc while another process has the device open.
const SCAN_TRIES: u32 = 10;
const SCAN_PAUSE: Duration = Duration::from_millis(100);

/// Mount points whose disks are the OS disk.
const OS_MOUNTPOINTS: &[&str] = &["/", "/boot", "/boot/efi", "/usr", "/var"];

/// Run checks (and, in `Mode::Wipe`, the wipe) for every allowlisted device
/// of the node.
pub fn run(cfg: &NodeConfig, req: &Request) -> Result<NodeReport, WipeError> {
    if req.mode != Mode::Inspect {
        let lease = req.lease.as_deref().ok_or(WipeError::MissingLease)?;
        if !audit::is_safe_component(lease) {
            return Err(WipeError::InvalidLease(lease.to_string()));
        }
    }
    let disks = system::list_disks().map_err(|e| format!("cannot enumerate block devices: {e}"));
    let os_disks = os_disks();
    let active_lease = active_lease(&cfg.node.jobs_dir);

    // Phase 1: every device, concurrently; descriptors stay open.
    let mut prepared: Vec<Prepared> = std::thread::scope(|s| {
        let handles: Vec<_> = cfg
            .devices
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let (disks, os_disks, active_lease) = (&disks, &os_disks, &active_lease);
                s.spawn(move || prepare(cfg, i, entry, disks, os_disks, active_lease, req))
            })
            .collect();
        handles
            .into_iter()
            .zip(&cfg.devices)
            .map(|(h, entry)| {
                h.join().unwrap_or_else(|_| {
                    // A panic in a check is a bug; it must still refuse.
                    Prepared::failed(
                        entry,
                        CheckResult::refuse(Reason::IoError, "internal error while checking"),
                    )
                })
            })
            .collect()
    });

    let all_passed = prepared.iter().all(|p| p.report.passed());
    if !all_passed {
        for p in &mut prepared {
            if p.report.passed() {
                p.report.result = DeviceResult::Skipped;
            }
        }
    }

    // Phase 2: destroy only when everything everywhere passed.
    if all_passed && req.mode == Mode::Wipe {
        let panicked: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = prepared
                .iter_mut()
                .map(|p| s.spawn(move || p.discard_and_verify()))
                .collect();
            handles.into_iter().map(|h| h.join().is_err()).collect()
        });
        for (p, bad) in prepared.iter_mut().zip(panicked) {
            if bad {
                // The discard may or may not have happened: report failure.
                p.fail(CheckResult::refuse(
                    Reason::IoError,
                    "internal error during discard or verification",
                ));
            }
        }
    }

    // Audit records, one per device, written concurrently (each is fsynced;
    // in parallel the filesystem can commit them together).
    let audit_errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prepared
            .iter_mut()
            .map(|p| s.spawn(move || write_audit(cfg, req, p)))
            .collect();
        handles
            .into_iter()
            .filter_map(|h| {
                h.join()
                    .unwrap_or_else(|_| Some("internal error while writing an audit record".into()))
            })
            .collect()
    });
    // Descriptors (and locks) are released only now, after the audit.
    let devices: Vec<DeviceReport> = prepared.into_iter().map(|p| p.report).collect();

    let failed = devices.iter().any(|d| d.result == DeviceResult::Failed);
    let result = if failed {
        NodeResult::Failed
    } else if !all_passed {
        NodeResult::Refused
    } else if !audit_errors.is_empty() {
        NodeResult::Failed
    } else {
        NodeResult::Ok
    };
    let (inventory, inventory_error) = if req.mode == Mode::Inspect {
        match system::inventory() {
            Ok(i) => (i, None),
            Err(e) => (Vec::new(), Some(format!("cannot read the inventory: {e}"))),
        }
    } else {
        (Vec::new(), None)
    };
    Ok(NodeReport {
        inventory,
        inventory_error,
        node: cfg.node.name.clone(),
        lease: req.lease.clone(),
        dry_run: req.mode == Mode::DryRun,
        result,
        devices,
        audit_errors,
    })
}

/// Stamp the end time and, unless inspecting, write the device's audit
/// record. Returns an error message if the record could not be written.
fn write_audit(cfg: &NodeConfig, req: &Request, p: &mut Prepared) -> Option<String> {
    p.report.finished_at = audit::now_rfc3339();
    if req.mode == Mode::Inspect {
        return None;
    }
    let lease = req.lease.as_deref().unwrap_or_default();
    let path = audit::record_path(
        &cfg.node.jobs_dir,
        lease,
        &p.audit_id,
        req.mode == Mode::DryRun,
    );
    p.report.audit = Some(path.display().to_string());
    let rec = audit::AuditRecord {
        version: 1,
        node: &cfg.node.name,
        lease,
        reason: req.purpose,
        dry_run: req.mode == Mode::DryRun,
        device: &p.report,
    };
    audit::write_atomic(&path, &rec)
        .err()
        .map(|e| format!("cannot write audit record {}: {e}", path.display()))
}

/// A device after phase 1: its report and, if it could be opened, the
/// descriptor (with the flock when taken).
struct Prepared {
    report: DeviceReport,
    held: Option<Held>,
    audit_id: String,
}

enum Held {
    Locked(Flock<File>),
    Plain(File),
}

impl Held {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Held::Locked(l) => l.as_fd(),
            Held::Plain(f) => f.as_fd(),
        }
    }
}

impl Prepared {
    fn failed(entry: &DeviceEntry, check: CheckResult) -> Self {
        let mut report = new_report(entry);
        report.checks.push(check);
        report.collect_refusals();
        report.result = DeviceResult::Refused;
        Prepared {
            report,
            held: None,
            audit_id: entry.label(),
        }
    }

    fn discard_and_verify(&mut self) {
        let Some(held) = &self.held else {
            self.fail(CheckResult::refuse(Reason::IoError, "no descriptor held"));
            return;
        };
        let fd = held.fd();
        fault_point(&self.report, FaultPoint::BeforeDiscard);
        let size = match gpuq_sys::blk::blk_getsize64(fd) {
            Ok(s) => s,
            Err(e) => {
                self.fail(CheckResult::refuse(
                    Reason::IoError,
                    format!("BLKGETSIZE64: {e}"),
                ));
                return;
            }
        };
        let checked = self.report.device.as_ref().and_then(|d| d.size_bytes);
        if checked != Some(size) {
            self.fail(CheckResult::refuse(
                Reason::SizeMismatch,
                format!("size changed since the checks: now {size} bytes"),
            ));
            return;
        }
        match gpuq_sys::blk::blk_discard(fd, 0, size) {
            Ok(()) => {
                self.report.bytes_discarded = size;
                self.report.checks.push(CheckResult::pass(
                    Reason::DiscardUnsupported,
                    format!("BLKDISCARD of {size} bytes succeeded"),
                ));
            }
            Err(Errno::EOPNOTSUPP) => {
                self.fail(CheckResult::refuse(
                    Reason::DiscardUnsupported,
                    "BLKDISCARD: operation not supported; no other wipe method is used",
                ));
                return;
            }
            Err(e) => {
                self.fail(CheckResult::refuse(
                    Reason::IoError,
                    format!("BLKDISCARD: {e}"),
                ));
                return;
            }
        }
        fault_point(&self.report, FaultPoint::AfterDiscard);
        let after = probe::signatures(fd).map_err(|e| e.to_string());
        let check = match &after {
            Ok(s) if s.is_empty() => {
                CheckResult::pass(Reason::SignatureAfterWipe, "no signature after discard")
            }
            Ok(s) => CheckResult::refuse(
                Reason::SignatureAfterWipe,
                format!(
                    "still found after discard: {}",
                    probe::describe(&s.iter().collect::<Vec<_>>())
                ),
            ),
            Err(e) => CheckResult::unknown(Reason::SignatureAfterWipe, e),
        };
        self.report.signatures_after = Some(after.unwrap_or_default());
        if check.verdict == Verdict::Refuse {
            self.fail(check);
        } else {
            self.report.checks.push(check);
            self.report.result = DeviceResult::Wiped;
        }
    }

    fn fail(&mut self, check: CheckResult) {
        self.report.checks.push(check);
        self.report.collect_refusals();
        self.report.result = DeviceResult::Failed;
    }
}

/// Test builds only (`fault-points`): run a test's fault hook for this
/// device; see [`crate::fault`].
#[cfg(feature = "fault-points")]
use crate::fault::Point as FaultPoint;

#[cfg(feature = "fault-points")]
fn fault_point(report: &DeviceReport, point: FaultPoint) {
    if let Some(d) = &report.device {
        crate::fault::reached(point, &d.name);
    }
}

#[cfg(not(feature = "fault-points"))]
enum FaultPoint {
    BeforeDiscard,
    AfterDiscard,
}

#[cfg(not(feature = "fault-points"))]
#[inline(always)]
fn fault_point(_report: &DeviceReport, _point: FaultPoint) {}

fn new_report(entry: &DeviceEntry) -> DeviceReport {
    DeviceReport {
        entry: entry.clone(),
        device: None,
        result: DeviceResult::Ok,
        refusals: Vec::new(),
        checks: Vec::new(),
        signatures_before: Vec::new(),
        signatures_after: None,
        bytes_discarded: 0,
        started_at: audit::now_rfc3339(),
        finished_at: String::new(),
        audit: None,
    }
}

fn err_str(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Phase 1 for one entry.
fn prepare(
    cfg: &NodeConfig,
    index: usize,
    entry: &DeviceEntry,
    disks: &Result<Vec<Disk>, String>,
    os_disks: &Result<BTreeSet<DevNum>, String>,
    active_lease: &Result<Option<String>, String>,
    req: &Request,
) -> Prepared {
    let mut report = new_report(entry);
    let fallback_id = entry
        .serial
        .clone()
        .unwrap_or_else(|| format!("entry{index}"));

    let disks = match disks {
        Ok(d) => d,
        Err(e) => {
            return Prepared::failed(entry, CheckResult::unknown(Reason::IdentityMismatch, e));
        }
    };
    let disk = match resolve(cfg, entry, disks) {
        Ok(d) => d,
        Err(c) => {
            let mut p = Prepared::failed(entry, c);
            p.audit_id = fallback_id;
            return p;
        }
    };
    report.checks.push(CheckResult::pass(
        Reason::NotAllowlisted,
        format!("allowlist entry devices[{index}]"),
    ));

    // Open: exclusive and read-write, or (to still report what is there)
    // read-only without O_EXCL. Nothing is ever written through the latter.
    let path = PathBuf::from("/dev").join(&disk.name);
    let mut excl: Result<(), String> = Ok(());
    let mut rw_open: Result<(), String> = Ok(());
    let file = match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(&path)
    {
        Ok(f) => Some(f),
        Err(e) => {
            match e.raw_os_error() {
                Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM) => {
                    rw_open = Err(format!("read-write open of {}: {e}", path.display()))
                }
                _ => {}
            }
            excl = Err(format!("O_EXCL open of {}: {e}", path.display()));
            fs::File::open(&path).ok()
        }
    };
    let exclusive = excl.is_ok();
    let Some(file) = file else {
        let mut p = Prepared::failed(
            entry,
            CheckResult::refuse(Reason::IoError, format!("cannot open {}", path.display())),
        );
        p.audit_id = disk.name.clone();
        return p;
    };

    // Re-read the identity of what we actually opened (by device number):
    // the name could have been reused between enumeration and open.
    let meta = file.metadata();
    let opened = match &meta {
        Ok(m) if m.file_type().is_block_device() => Some(DevNum::from_rdev(m.rdev())),
        _ => None,
    };
    let fresh = opened.and_then(|dn| {
        fs::canonicalize(system::sys_dev_block(dn))
            .ok()
            .map(|sp| system::disk_from_sysfs(&disk.name, &sp))
    });
    let (disk, devnum) = match (fresh, opened) {
        (Some(f), Some(dn)) if f.devnum == Some(dn) && f.devnum == disk.devnum => (f, dn),
        _ => {
            let mut p = Prepared::failed(
                entry,
                CheckResult::refuse(
                    Reason::IdentityMismatch,
                    format!(
                        "{} is not the block device {} found in sysfs",
                        path.display(),
                        disk.devnum.map(|d| d.to_string()).unwrap_or_default()
                    ),
                ),
            );
            p.audit_id = disk.name.clone();
            return p;
        }
    };
    report.checks.push(checks::identity(entry, &disk));
    let audit_id = audit_id_of(&disk);

    // flock(LOCK_EX|LOCK_NB), retried briefly: udev takes short shared locks.
    let (held, lock) = take_flock(file, &path);
    let fd = held.fd();

    let size_sysfs = system::read_attr(&disk.syspath.join("size"))
        .map_err(err_str)
        .and_then(|s| s.parse::<u64>().map_err(err_str))
        .map(|sectors| sectors * 512);
    let size_ioctl = gpuq_sys::blk::blk_getsize64(fd).map_err(err_str);
    report.device = Some(SeenIdentity {
        name: disk.name.clone(),
        path: path.display().to_string(),
        devnum: devnum.to_string(),
        serial: disk.serial.clone(),
        model: disk.model.clone(),
        pci: disk.pci.clone(),
        nsid: disk.nsid,
        wwid: disk.wwid.clone(),
        loop_backing_file: disk
            .loop_backing_file
            .as_ref()
            .map(|p| p.display().to_string()),
        size_bytes: size_ioctl.as_ref().ok().copied(),
    });
    report
        .checks
        .push(checks::size(size_sysfs, size_ioctl, entry.size_bytes));
    report.checks.push(checks::rotational(
        system::read_attr(&disk.syspath.join("queue/rotational")).map_err(err_str),
    ));
    report.checks.push(checks::read_only(
        system::read_attr(&disk.syspath.join("ro")).map_err(err_str),
        gpuq_sys::blk::blk_roget(fd).map_err(err_str),
        rw_open,
    ));
    report
        .checks
        .push(checks::os_disk(devnum, os_disks.clone()));

    // Everything stacked on the device: partitions and holders, recursively.
    let above = system::stacked_above(&disk.syspath).map_err(err_str);
    let mut involved: BTreeSet<DevNum> = [devnum].into();
    if let Ok(a) = &above {
        involved.extend(a.iter().map(|(_, d)| *d));
    }
    let mounts = system::mounts().map_err(err_str).map(|ms| {
        ms.into_iter()
            .map(|m| {
                let src = system::mount_source_devnum(&m);
                (m, src)
            })
            .collect::<Vec<_>>()
    });
    let mounted = match &above {
        Ok(_) => checks::mounted(&involved, mounts),
        Err(e) => CheckResult::unknown(Reason::Mounted, format!("stacked devices: {e}")),
    };
    let parts = system::partitions(&disk.syspath).map_err(err_str);
    let partitions = checks::partitions(parts.clone());
    let mut holder_names = system::holders(&disk.syspath).map_err(err_str);
    if let (Ok(h), Ok(ps)) = (&mut holder_names, &parts) {
        for (pn, _) in ps {
            match system::holders(&disk.syspath.join(pn)) {
                Ok(more) => h.extend(more.into_iter().map(|m| format!("{m} (on {pn})"))),
                Err(e) => {
                    holder_names = Err(format!("holders of {pn}: {e}"));
                    break;
                }
            }
        }
    }
    let holders = checks::holders(
        holder_names,
        system::loops_backed_by(&involved).map_err(err_str),
    );
    let swap = checks::swap(&involved, system::swaps().map_err(err_str));
    let exported = checks::nvmet_export(system::nvmet_exports(&involved).map_err(err_str));

    let pci = disk.pci.clone().filter(|_| disk.nvme_controller.is_some());
    let pci_ref = pci.clone();
    let matcher = move |p: &Path| {
        pci_ref
            .as_deref()
            .is_some_and(|bdf| system::path_is_pci_function(p, bdf))
    };
    // A short-lived opener (blkid from udev, losetup scanning for a free
    // device) must not fail the wipe; one that keeps the device open must.
    // Every scan is a point-in-time check either way, so a clean scan while
    // we hold O_EXCL + flock is as good as the first one being clean.
    let mut procs = system::processes_holding(&involved, &matcher).map_err(err_str);
    for _ in 1..SCAN_TRIES {
        if !matches!(&procs, Ok(p) if !p.holders.is_empty()) {
            break;
        }
        std::thread::sleep(SCAN_PAUSE);
        procs = system::processes_holding(&involved, &matcher).map_err(err_str);
    }
    let explained = [&mounted, &holders, &swap, &exported]
        .iter()
        .any(|c| c.verdict == Verdict::Refuse);
    let open_by_other = checks::open_by_other(&procs, &excl, explained);
    let locked = checks::locked(lock);

    let (driver, spdk) = match pci.as_deref() {
        Some(bdf) => (
            system::pci_driver(bdf).map_err(err_str),
            system::spdk_lock_holder(bdf).map_err(err_str),
        ),
        None => (Ok(None), Ok(None)),
    };
    let spdk_holder = spdk.as_ref().ok().copied().flatten().map(|pid| ProcRef {
        pid,
        comm: system::comm(pid),
    });
    let userspace = checks::userspace_driver(pci.as_deref(), driver, spdk);

    let sigs = probe::signatures(fd).map_err(err_str);
    report.signatures_before = sigs.clone().unwrap_or_default();
    let foreign = match req.purpose {
        Purpose::Lease => checks::foreign_signature(&sigs, &req.expected_signatures),
        Purpose::Activation => checks::signature_to_destroy(&sigs),
    };
    let engine = checks::external_engine(&procs, spdk_holder);
    let lease = checks::foreign_lease(req.lease.as_deref(), active_lease.clone());
    let discard = checks::discard_supported(
        system::read_attr(&disk.syspath.join("queue/discard_max_bytes")).map_err(err_str),
    );

    report.checks.extend([
        mounted,
        partitions,
        holders,
        exported,
        swap,
        open_by_other,
        locked,
        userspace,
        foreign,
        engine,
        lease,
        discard,
    ]);
    if !exclusive && report.checks.iter().all(|c| c.verdict == Verdict::Pass) {
        // Unreachable by construction (open_by_other refuses), but the
        // discard must never run on a non-exclusive descriptor.
        report.checks.push(CheckResult::refuse(
            Reason::OpenByOther,
            "no exclusive descriptor",
        ));
    }
    report.collect_refusals();
    report.result = if report.passed() {
        DeviceResult::Ok
    } else {
        DeviceResult::Refused
    };
    Prepared {
        report,
        held: Some(held),
        audit_id,
    }
}

/// The audit record's name part: the serial, and for a namespace other
/// than the first its nsid too (`SN-1-ns2`): two namespaces of one
/// controller share the serial, and one record must not replace the
/// other's. The kernel name when there is no serial.
fn audit_id_of(disk: &Disk) -> String {
    match (&disk.serial, disk.nsid) {
        (Some(s), Some(n)) if n != 1 => format!("{s}-ns{n}"),
        (Some(s), _) => s.clone(),
        (None, _) => disk.name.clone(),
    }
}

/// Map an allowlist entry to exactly one whole disk, or refuse.
fn resolve(cfg: &NodeConfig, entry: &DeviceEntry, disks: &[Disk]) -> Result<Disk, CheckResult> {
    if let Some(bf) = &entry.loop_backing_file {
        if !cfg.node.allow_loop_devices {
            return Err(CheckResult::refuse(
                Reason::NotAllowlisted,
                format!(
                    "loop device identity {} is accepted only with [node] allow_loop_devices = true (tests only)",
                    bf.display()
                ),
            ));
        }
        let want = fs::canonicalize(bf).unwrap_or_else(|_| bf.clone());
        let hits: Vec<&Disk> = disks
            .iter()
            .filter(|d| {
                d.loop_backing_file.as_ref().is_some_and(|have| {
                    have == bf || fs::canonicalize(have).is_ok_and(|h| h == want)
                })
            })
            .collect();
        return match hits.as_slice() {
            [d] => Ok((*d).clone()),
            [] => Err(CheckResult::refuse(
                Reason::IdentityMismatch,
                format!("no loop device is backed by {}", bf.display()),
            )),
            many => Err(CheckResult::refuse(
                Reason::IdentityMismatch,
                format!(
                    "ambiguous: {} are all backed by {}",
                    many.iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    bf.display()
                ),
            )),
        };
    }

    let (Some(serial), Some(pci)) = (&entry.serial, &entry.pci) else {
        return Err(CheckResult::refuse(
            Reason::NotAllowlisted,
            "entry has neither serial+pci nor loop_backing_file",
        ));
    };
    let hits: Vec<&Disk> = disks
        .iter()
        // Any disk with that serial, NVMe or not: a non-NVMe match is then
        // refused by the identity check with every other check still
        // reported (an HDD shows both identity_mismatch and rotational).
        .filter(|d| d.serial.as_deref() == Some(serial.as_str()))
        .filter(|d| entry.nsid.is_none() || d.nsid == entry.nsid)
        .collect();
    match hits.as_slice() {
        [d] => Ok((*d).clone()),
        [] => {
            // Not visible as a namespace: bound to a user-space driver, or
            // another drive sits at that address, or it is gone.
            match system::pci_driver(pci) {
                Ok(Some(drv)) if drv != "nvme" => {
                    return Err(CheckResult::refuse(
                        Reason::UserspaceDriver,
                        format!("{pci} is bound to {drv}, not nvme; no block device to check"),
                    ))
                }
                Ok(None) => {
                    return Err(CheckResult::refuse(
                        Reason::UserspaceDriver,
                        format!("{pci} is bound to no driver; no block device to check"),
                    ))
                }
                _ => {}
            }
            let at_pci: Vec<String> = disks
                .iter()
                .filter(|d| d.pci.as_deref() == Some(pci.as_str()))
                .map(|d| {
                    format!(
                        "{} (serial {}, nsid {})",
                        d.name,
                        d.serial.as_deref().unwrap_or("?"),
                        d.nsid.map(|n| n.to_string()).unwrap_or_else(|| "?".into())
                    )
                })
                .collect();
            Err(CheckResult::refuse(
                Reason::IdentityMismatch,
                if at_pci.is_empty() {
                    format!("no NVMe namespace with serial {serial:?} and no block device at {pci}")
                } else {
                    format!(
                        "no NVMe namespace with serial {serial:?}{}; at {pci}: {}",
                        entry
                            .nsid
                            .map(|n| format!(" and nsid {n}"))
                            .unwrap_or_default(),
                        at_pci.join(", ")
                    )
                },
            ))
        }
        many => Err(CheckResult::refuse(
            Reason::IdentityMismatch,
            format!(
                "ambiguous: serial {serial:?} has namespaces {}; set nsid",
                many.iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn take_flock(file: File, path: &Path) -> (Held, Result<(), String>) {
    let mut f = file;
    for attempt in 0..FLOCK_TRIES {
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return (Held::Locked(l), Ok(())),
            Err((file, Errno::EWOULDBLOCK)) => {
                f = file;
                if attempt + 1 < FLOCK_TRIES {
                    std::thread::sleep(FLOCK_PAUSE);
                }
            }
            Err((file, e)) => return (Held::Plain(file), Err(format!("flock: {e}"))),
        }
    }
    let who = flock_holders(path);
    (
        Held::Plain(f),
        Err(format!(
            "{} is locked (flock) by {} for over {} ms",
            path.display(),
            if who.is_empty() {
                "another process".to_string()
            } else {
                who.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            FLOCK_TRIES * FLOCK_PAUSE.as_millis() as u32
        )),
    )
}

/// PIDs holding a flock on the device node, from /proc/locks.
fn flock_holders(path: &Path) -> Vec<ProcRef> {
    let Ok(m) = fs::metadata(path) else {
        return Vec::new();
    };
    let want = format!(
        "{:02x}:{:02x}:{}",
        libc::major(m.dev()),
        libc::minor(m.dev()),
        m.ino()
    );
    let me = std::process::id();
    let Ok(text) = fs::read_to_string("/proc/locks") else {
        return Vec::new();
    };
    let mut out: Vec<ProcRef> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 1234 00:06:567 0 EOF"
            let i = f.iter().position(|x| *x == "FLOCK")?;
            let pid: u32 = f.get(i + 3)?.parse().ok()?;
            (f.get(i + 4)? == &want.as_str() && pid != me).then(|| ProcRef {
                pid,
                comm: system::comm(pid),
            })
        })
        .collect();
    out.dedup();
    out
}

/// Whole disks under the mounts of `/`, `/boot`, `/boot/efi`, `/usr` and
/// `/var` (through partitions, dm/md slaves and loop backing devices).
pub fn os_disks() -> Result<BTreeSet<DevNum>, String> {
    let mounts = system::mounts().map_err(|e| format!("mountinfo: {e}"))?;
    if !mounts.iter().any(|m| m.mountpoint == "/") {
        return Err("no mount for / in mountinfo".into());
    }
    let mut out = BTreeSet::new();
    for m in mounts
        .iter()
        .filter(|m| OS_MOUNTPOINTS.contains(&m.mountpoint.as_str()))
    {
        let dev = if m.devnum.is_anonymous() {
            // overlayfs/tmpfs roots live on no block device of their own;
            // btrfs reports an anonymous number but a device source.
            match system::mount_source_devnum(m) {
                Some(d) => d,
                None => continue,
            }
        } else {
            m.devnum
        };
        let below = system::disks_below(dev)
            .map_err(|e| format!("disks under {} ({dev}): {e}", m.mountpoint))?;
        out.extend(below);
    }
    Ok(out)
}

/// The node's active lease (`<jobs_dir>/active-lease`), if any.
fn active_lease(jobs_dir: &Path) -> Result<Option<String>, String> {
    let p = jobs_dir.join(ACTIVE_LEASE_FILE);
    match fs::read_to_string(&p) {
        Ok(s) => {
            let s = s.trim().to_string();
            if s.is_empty() {
                Err(format!("{} is empty", p.display()))
            } else {
                Ok(Some(s))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", p.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeSection;

    #[test]
    fn two_namespaces_of_one_controller_get_two_audit_records() {
        let ns = |nsid| Disk {
            name: format!("nvme4n{nsid}"),
            serial: Some("SN-SITE-0005".into()),
            nsid: Some(nsid),
            ..Disk::default()
        };
        assert_eq!(audit_id_of(&ns(1)), "SN-SITE-0005");
        assert_eq!(audit_id_of(&ns(2)), "SN-SITE-0005-ns2");
        let bare = Disk {
            name: "loop3".into(),
            ..Disk::default()
        };
        assert_eq!(audit_id_of(&bare), "loop3");
    }

    fn cfg(allow_loop: bool) -> NodeConfig {
        NodeConfig {
            node: NodeSection {
                name: "t".into(),
                socket: "/s".into(),
                podman_socket: "/p".into(),
                jobs_dir: "/j".into(),
                test_dir: "/t".into(),
                allow_loop_devices: allow_loop,
                enabled: None,
            },
            devices: Vec::new(),
        }
    }

    fn ns(name: &str, serial: &str, nsid: u32, pci: &str) -> Disk {
        Disk {
            name: name.into(),
            serial: Some(serial.into()),
            nsid: Some(nsid),
            pci: Some(pci.into()),
            nvme_controller: Some("nvme0".into()),
            ..Disk::default()
        }
    }

    // PCI addresses that do not exist on any machine (domain ffff), so the
    // driver lookup in the no-match path finds nothing.
    const P1: &str = "ffff:00:01.0";

    #[test]
    fn resolves_by_serial_and_nsid() {
        let disks = vec![ns("nvme0n1", "SN1", 1, P1), ns("nvme0n2", "SN1", 2, P1)];
        let e = DeviceEntry {
            serial: Some("SN1".into()),
            pci: Some(P1.into()),
            nsid: Some(2),
            ..DeviceEntry::default()
        };
        assert_eq!(resolve(&cfg(false), &e, &disks).unwrap().name, "nvme0n2");
    }

    #[test]
    fn several_namespaces_without_nsid_is_ambiguous() {
        let disks = vec![ns("nvme0n1", "SN1", 1, P1), ns("nvme0n2", "SN1", 2, P1)];
        let e = DeviceEntry {
            serial: Some("SN1".into()),
            pci: Some(P1.into()),
            ..DeviceEntry::default()
        };
        let c = resolve(&cfg(false), &e, &disks).unwrap_err();
        assert_eq!(c.check, Reason::IdentityMismatch);
        assert!(c.detail.contains("ambiguous"), "{}", c.detail);
    }

    #[test]
    fn unknown_serial_names_what_sits_at_the_address() {
        let disks = vec![ns("nvme0n1", "SN1", 1, P1)];
        let e = DeviceEntry {
            serial: Some("SN9".into()),
            pci: Some(P1.into()),
            ..DeviceEntry::default()
        };
        let c = resolve(&cfg(false), &e, &disks).unwrap_err();
        assert_eq!(c.check, Reason::IdentityMismatch);
        assert!(c.detail.contains("nvme0n1 (serial SN1"), "{}", c.detail);
    }

    #[test]
    fn loop_identity_needs_allow_loop_devices() {
        let disks = vec![Disk {
            name: "loop9".into(),
            loop_backing_file: Some("/x/backing.img".into()),
            ..Disk::default()
        }];
        let e = DeviceEntry {
            loop_backing_file: Some("/x/backing.img".into()),
            ..DeviceEntry::default()
        };
        let c = resolve(&cfg(false), &e, &disks).unwrap_err();
        assert_eq!(c.check, Reason::NotAllowlisted);
        assert_eq!(resolve(&cfg(true), &e, &disks).unwrap().name, "loop9");
    }

    #[test]
    fn two_loops_on_one_file_are_ambiguous() {
        let l = |n: &str| Disk {
            name: n.into(),
            loop_backing_file: Some("/x/b.img".into()),
            ..Disk::default()
        };
        let e = DeviceEntry {
            loop_backing_file: Some("/x/b.img".into()),
            ..DeviceEntry::default()
        };
        let c = resolve(&cfg(true), &e, &[l("loop1"), l("loop2")]).unwrap_err();
        assert!(c.detail.contains("ambiguous"));
    }
}
