//! Read-only views of the running system: sysfs block devices (through
//! libudev, with sysfs fallback), `/proc/self/mountinfo`, `/proc/swaps`,
//! open descriptors of every process, loop devices and SPDK lock files.
//!
//! Nothing here writes anywhere. Every reader returns an error rather than a
//! guess, so that the checks can fail closed.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A block device number (`major:minor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub fn from_rdev(rdev: u64) -> Self {
        DevNum {
            major: libc::major(rdev),
            minor: libc::minor(rdev),
        }
    }

    /// Parse `8:0` as found in sysfs `dev` files and mountinfo.
    pub fn parse(s: &str) -> Option<Self> {
        let (a, b) = s.trim().split_once(':')?;
        Some(DevNum {
            major: a.parse().ok()?,
            minor: b.parse().ok()?,
        })
    }

    /// `major == 0` marks anonymous devices (tmpfs, overlayfs, proc …).
    pub fn is_anonymous(self) -> bool {
        self.major == 0
    }
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Read a sysfs attribute, trimmed.
pub fn read_attr(path: &Path) -> io::Result<String> {
    Ok(fs::read_to_string(path)?.trim().to_string())
}

fn read_attr_opt(path: &Path) -> Option<String> {
    read_attr(path).ok().filter(|s| !s.is_empty())
}

/// The sysfs directory of a block device by number.
pub fn sys_dev_block(dev: DevNum) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{dev}"))
}

/// A whole-disk block device as found in sysfs.
#[derive(Debug, Clone, Default)]
pub struct Disk {
    /// Kernel name, `nvme0n1`, `loop3`.
    pub name: String,
    pub syspath: PathBuf,
    pub devnum: Option<DevNum>,
    pub serial: Option<String>,
    pub model: Option<String>,
    pub wwid: Option<String>,
    /// NVMe EUI-64 or NGUID of the namespace.
    pub eui: Option<String>,
    pub nsid: Option<u32>,
    /// NVMe controller name (`nvme0`), when the disk is an NVMe namespace.
    pub nvme_controller: Option<String>,
    /// PCI address of the controller.
    pub pci: Option<String>,
    pub loop_backing_file: Option<PathBuf>,
}

/// Enumerate whole disks. Uses libudev for enumeration and properties;
/// where libudev has no property (no udevd, no udev database) the sysfs
/// attribute is read instead.
pub fn list_disks() -> io::Result<Vec<Disk>> {
    match list_disks_udev() {
        Ok(v) => Ok(v),
        // libudev failing to enumerate is unusual; /sys/block is the same
        // data without it.
        Err(_) => list_disks_sysfs(),
    }
}

fn list_disks_udev() -> io::Result<Vec<Disk>> {
    let mut en = udev::Enumerator::new()?;
    en.match_subsystem("block")?;
    let mut out = Vec::new();
    for dev in en.scan_devices()? {
        if dev.devtype().and_then(|t| t.to_str()) != Some("disk") {
            continue;
        }
        let name = dev.sysname().to_string_lossy().into_owned();
        let prop = |k: &str| {
            dev.property_value(k)
                .map(|v| v.to_string_lossy().trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let mut d = disk_from_sysfs(&name, dev.syspath());
        if d.devnum.is_none() {
            d.devnum = dev.devnum().map(DevNum::from_rdev);
        }
        // NVMe: the sysfs attributes are authoritative (the udev ID_SERIAL of
        // an NVMe namespace is model_serial); udev only fills gaps.
        if d.serial.is_none() {
            d.serial = prop("ID_SERIAL_SHORT");
        }
        if d.model.is_none() {
            d.model = prop("ID_MODEL");
        }
        if d.wwid.is_none() {
            d.wwid = prop("ID_WWN");
        }
        out.push(d);
    }
    Ok(out)
}

fn list_disks_sysfs() -> io::Result<Vec<Disk>> {
    let mut out = Vec::new();
    for e in fs::read_dir("/sys/block")? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let syspath = fs::canonicalize(e.path())?;
        out.push(disk_from_sysfs(&name, &syspath));
    }
    Ok(out)
}

/// One whole disk as `gpuq-node devices` lists it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InventoryEntry {
    pub name: String,
    pub path: String,
    pub devnum: Option<String>,
    pub size_bytes: Option<u64>,
    pub rotational: Option<bool>,
    pub removable: Option<bool>,
    pub read_only: Option<bool>,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub wwid: Option<String>,
    pub eui: Option<String>,
    pub nvme_controller: Option<String>,
    pub nsid: Option<u32>,
    pub pci: Option<String>,
    pub loop_backing_file: Option<String>,
    pub partitions: Vec<String>,
    pub holders: Vec<String>,
    /// Mount points of the disk, its partitions and anything stacked on them.
    pub mountpoints: Vec<String>,
    /// Active swap areas on the disk or its partitions.
    pub swap: Vec<String>,
}

/// Every whole disk with its attributes, partitions, holders, mounts and
/// swap use. Attributes that cannot be read are `null`.
pub fn inventory() -> io::Result<Vec<InventoryEntry>> {
    let mounts = mounts()?;
    let swaps = swaps()?;
    let mut out = Vec::new();
    for d in list_disks()? {
        let flag = |a: &str| read_attr(&d.syspath.join(a)).ok().map(|v| v == "1");
        let above = stacked_above(&d.syspath).unwrap_or_default();
        let mut involved: BTreeSet<DevNum> = above.iter().map(|(_, n)| *n).collect();
        involved.extend(d.devnum);
        let parts: Vec<String> = partitions(&d.syspath)
            .unwrap_or_default()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let holders: Vec<String> = above
            .iter()
            .filter(|(n, _)| !parts.contains(n))
            .map(|(n, _)| n.clone())
            .collect();
        out.push(InventoryEntry {
            path: format!("/dev/{}", d.name),
            devnum: d.devnum.map(|n| n.to_string()),
            size_bytes: read_attr(&d.syspath.join("size"))
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .map(|s| s * 512),
            rotational: flag("queue/rotational"),
            removable: flag("removable"),
            read_only: flag("ro"),
            mountpoints: mounts
                .iter()
                .filter(|m| {
                    involved.contains(&m.devnum)
                        || mount_source_devnum(m).is_some_and(|s| involved.contains(&s))
                })
                .map(|m| m.mountpoint.clone())
                .collect(),
            swap: swaps
                .iter()
                .filter(|(_, n, blk)| *blk && n.is_some_and(|n| involved.contains(&n)))
                .map(|(f, _, _)| f.clone())
                .collect(),
            partitions: parts,
            holders,
            name: d.name,
            model: d.model,
            serial: d.serial,
            wwid: d.wwid,
            eui: d.eui,
            nvme_controller: d.nvme_controller,
            nsid: d.nsid,
            pci: d.pci,
            loop_backing_file: d.loop_backing_file.map(|p| p.display().to_string()),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Build a [`Disk`] from sysfs attributes alone.
pub fn disk_from_sysfs(name: &str, syspath: &Path) -> Disk {
    let attr = |rel: &str| read_attr_opt(&syspath.join(rel));
    let mut d = Disk {
        name: name.to_string(),
        syspath: syspath.to_path_buf(),
        devnum: attr("dev").and_then(|s| DevNum::parse(&s)),
        wwid: attr("wwid").or_else(|| attr("device/wwid")),
        eui: attr("eui").or_else(|| attr("nguid")),
        nsid: attr("nsid").and_then(|s| s.parse().ok()),
        loop_backing_file: attr("loop/backing_file").map(PathBuf::from),
        ..Disk::default()
    };
    // `device` is the NVMe controller (`nvmeX`) on current kernels; older
    // ones link the PCI function directly. Handle both.
    if let Ok(dev) = fs::canonicalize(syspath.join("device")) {
        let is_ctrl = dev.join("serial").exists() && dev.join("address").exists();
        if is_ctrl {
            d.nvme_controller = dev.file_name().map(|n| n.to_string_lossy().into_owned());
            d.serial = read_attr_opt(&dev.join("serial"));
            d.model = read_attr_opt(&dev.join("model"));
            d.pci = read_attr_opt(&dev.join("address"));
        } else {
            d.serial = read_attr_opt(&dev.join("serial"));
            d.model = read_attr_opt(&dev.join("model"));
            d.pci = pci_of(&dev);
        }
    }
    if d.serial.is_none() {
        d.serial = attr("serial");
    }
    d
}

/// The PCI function a sysfs device path sits under (nearest `dddd:bb:dd.f`
/// component), if any.
fn pci_of(path: &Path) -> Option<String> {
    path.components()
        .rev()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| crate::config::is_pci_address(c))
        .map(str::to_string)
}

/// Partitions of a disk: subdirectories of its syspath with a `partition`
/// attribute.
pub fn partitions(syspath: &Path) -> io::Result<Vec<(String, DevNum)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(syspath)? {
        let e = e?;
        let p = e.path();
        if p.join("partition").exists() {
            let dev = read_attr(&p.join("dev"))?;
            let num = DevNum::parse(&dev).ok_or_else(|| bad(format!("bad dev {dev}")))?;
            out.push((e.file_name().to_string_lossy().into_owned(), num));
        }
    }
    out.sort();
    Ok(out)
}

/// Holders (`holders/` entries) of a sysfs block device, e.g. `dm-0`, `md0`.
pub fn holders(syspath: &Path) -> io::Result<Vec<String>> {
    let mut out: Vec<String> = fs::read_dir(syspath.join("holders"))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<io::Result<_>>()?;
    out.sort();
    Ok(out)
}

/// Every device stacked on `syspath`: its partitions, their holders, and
/// holders of holders, by name and number (the device itself excluded).
pub fn stacked_above(syspath: &Path) -> io::Result<Vec<(String, DevNum)>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = vec![syspath.to_path_buf()];
    for (name, num) in partitions(syspath)? {
        out.push((name.clone(), num));
        todo.push(syspath.join(&name));
    }
    while let Some(p) = todo.pop() {
        for h in holders(&p)? {
            if !seen.insert(h.clone()) {
                continue;
            }
            let hp = PathBuf::from("/sys/class/block").join(&h);
            let num = DevNum::parse(&read_attr(&hp.join("dev"))?)
                .ok_or_else(|| bad(format!("bad dev of holder {h}")))?;
            out.push((h, num));
            todo.push(hp);
        }
    }
    Ok(out)
}

/// The whole disks a block device lives on: the disk of a partition, the
/// slaves of dm/md devices (recursively) and the block device behind a loop
/// device.
pub fn disks_below(dev: DevNum) -> io::Result<BTreeSet<DevNum>> {
    let mut out = BTreeSet::new();
    let mut todo = vec![dev];
    let mut seen = BTreeSet::new();
    while let Some(d) = todo.pop() {
        if !seen.insert(d) {
            continue;
        }
        let sys = fs::canonicalize(sys_dev_block(d))?;
        let sys = if sys.join("partition").exists() {
            sys.parent()
                .ok_or_else(|| bad("partition without parent".into()))?
                .to_path_buf()
        } else {
            sys
        };
        let disk = DevNum::parse(&read_attr(&sys.join("dev"))?)
            .ok_or_else(|| bad("bad dev attribute".into()))?;
        let mut lower = Vec::new();
        if let Ok(rd) = fs::read_dir(sys.join("slaves")) {
            for e in rd {
                let e = e?;
                let p = PathBuf::from("/sys/class/block").join(e.file_name());
                if let Some(n) = DevNum::parse(&read_attr(&p.join("dev"))?) {
                    lower.push(n);
                }
            }
        }
        if let Some(bf) = read_attr_opt(&sys.join("loop/backing_file")) {
            if let Ok(m) = fs::metadata(&bf) {
                if m.file_type().is_block_device() {
                    lower.push(DevNum::from_rdev(m.rdev()));
                }
            }
        }
        if lower.is_empty() {
            out.insert(disk);
        } else {
            todo.extend(lower);
        }
    }
    Ok(out)
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
pub struct Mount {
    pub devnum: DevNum,
    pub mountpoint: String,
    pub fstype: String,
    pub source: String,
}

/// Parse `/proc/self/mountinfo`.
pub fn mounts() -> io::Result<Vec<Mount>> {
    parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo")?)
}

/// Parse mountinfo text (see proc(5)).
pub fn parse_mountinfo(text: &str) -> io::Result<Vec<Mount>> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(' ').collect();
        let sep = f
            .iter()
            .position(|x| *x == "-")
            .ok_or_else(|| bad(format!("mountinfo line without separator: {line}")))?;
        if f.len() < 5 || f.len() < sep + 3 {
            return Err(bad(format!("short mountinfo line: {line}")));
        }
        out.push(Mount {
            devnum: DevNum::parse(f[2]).ok_or_else(|| bad(format!("bad devnum in {line}")))?,
            mountpoint: unescape_octal(f[4]),
            fstype: f[sep + 1].to_string(),
            source: unescape_octal(f[sep + 2]),
        });
    }
    Ok(out)
}

/// mountinfo and /proc/swaps escape space, tab, newline and backslash as `\ooo`.
pub fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Block devices (by number) of mounts whose source is a block device path,
/// for filesystems that report an anonymous device number (btrfs).
pub fn mount_source_devnum(m: &Mount) -> Option<DevNum> {
    if !m.source.starts_with('/') {
        return None;
    }
    let md = fs::metadata(&m.source).ok()?;
    md.file_type()
        .is_block_device()
        .then(|| DevNum::from_rdev(md.rdev()))
}

/// Active swap areas from `/proc/swaps`: (filename, device number of the
/// swap device, or of the filesystem holding a swap file).
pub fn swaps() -> io::Result<Vec<(String, Option<DevNum>, bool)>> {
    let text = fs::read_to_string("/proc/swaps")?;
    let mut out = Vec::new();
    for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let name = unescape_octal(
            line.split_whitespace()
                .next()
                .ok_or_else(|| bad(format!("bad /proc/swaps line {line}")))?,
        );
        // A swap device that no longer has a path ("(deleted)") cannot be
        // matched: report it without a number so callers fail closed.
        match fs::metadata(&name) {
            Ok(m) if m.file_type().is_block_device() => {
                out.push((name, Some(DevNum::from_rdev(m.rdev())), true))
            }
            Ok(m) => out.push((name, Some(DevNum::from_rdev(m.dev())), false)),
            Err(_) => out.push((name, None, false)),
        }
    }
    Ok(out)
}

/// A process, for refusal messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcRef {
    pub pid: u32,
    pub comm: String,
}

impl std::fmt::Display for ProcRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.comm)
    }
}

/// Command name of a process.
pub fn comm(pid: u32) -> String {
    read_attr(Path::new(&format!("/proc/{pid}/comm"))).unwrap_or_else(|_| "?".into())
}

/// Processes other than ours with an open descriptor on any block device
/// in `devs`, or on a path for which `path_match` returns true (used for
/// `/dev/uio*`, `/dev/vfio/*` and PCI resource files). Processes that exit
/// during the scan are ignored; any other error is returned (fail closed).
pub fn processes_holding(
    devs: &BTreeSet<DevNum>,
    path_match: &dyn Fn(&Path) -> bool,
) -> io::Result<ProcScan> {
    let me = std::process::id();
    let mut out = Vec::new();
    let mut uninspected = Vec::new();
    for e in fs::read_dir("/proc")? {
        let e = e?;
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let fd_dir = e.path().join("fd");
        let rd = match fs::read_dir(&fd_dir) {
            Ok(rd) => rd,
            Err(err) if gone(&err) => continue,
            // PID 1 of a sandbox (container init) can be more privileged
            // than root inside it, so the kernel hides its descriptors.
            // It is recorded, not trusted blindly: any other process we
            // cannot inspect refuses.
            Err(err) if pid == 1 && err.kind() == io::ErrorKind::PermissionDenied => {
                uninspected.push(ProcRef {
                    pid,
                    comm: comm(pid),
                });
                continue;
            }
            Err(err) => {
                return Err(io::Error::new(
                    err.kind(),
                    format!("cannot scan {}: {err}", fd_dir.display()),
                ))
            }
        };
        let mut hit = false;
        for fd in rd {
            let fd = match fd {
                Ok(fd) => fd,
                Err(err) if gone(&err) => break,
                Err(err) => return Err(err),
            };
            let target = match fs::read_link(fd.path()) {
                Ok(t) => t,
                Err(err) if gone(&err) => continue,
                Err(err) if pid == 1 && err.kind() == io::ErrorKind::PermissionDenied => {
                    uninspected.push(ProcRef {
                        pid,
                        comm: comm(pid),
                    });
                    break;
                }
                Err(err) => {
                    return Err(io::Error::new(
                        err.kind(),
                        format!("cannot inspect {}: {err}", fd.path().display()),
                    ))
                }
            };
            let ts = target.to_string_lossy();
            if ts.starts_with("socket:") || ts.starts_with("pipe:") || ts.starts_with("anon_inode:")
            {
                continue;
            }
            if path_match(&target) {
                hit = true;
                break;
            }
            // stat() through the magic link finds the device even when it
            // was opened through another node name.
            match fs::metadata(fd.path()) {
                Ok(m) if m.file_type().is_block_device() => {
                    if devs.contains(&DevNum::from_rdev(m.rdev())) {
                        hit = true;
                        break;
                    }
                }
                Ok(_) => {}
                Err(err) if gone(&err) => {}
                // e.g. a descriptor on a hung network filesystem: we cannot
                // tell, but it is not a block device opened through /dev.
                Err(_) if !ts.starts_with("/dev") => {}
                Err(err) => return Err(err),
            }
        }
        if !hit {
            // Memory mappings of the device (mmap of a block device, PCI BARs).
            if let Ok(maps) = fs::read_to_string(e.path().join("maps")) {
                hit = maps.lines().any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    if f.len() >= 6 {
                        let p = Path::new(f[5]);
                        if path_match(p) {
                            return true;
                        }
                        // Only device nodes can map a block device; stat'ing
                        // every mapped library of every process would cost
                        // thousands of calls per scan.
                        if !f[5].starts_with("/dev/") {
                            return false;
                        }
                        if let Ok(m) = fs::metadata(p) {
                            return m.file_type().is_block_device()
                                && devs.contains(&DevNum::from_rdev(m.rdev()));
                        }
                    }
                    false
                });
            }
        }
        if hit {
            out.push(ProcRef {
                pid,
                comm: comm(pid),
            });
        }
    }
    out.sort_by_key(|p| p.pid);
    Ok(ProcScan {
        holders: out,
        uninspected,
    })
}

/// Result of [`processes_holding`].
#[derive(Debug, Clone, Default)]
pub struct ProcScan {
    /// Processes with the device (or its PCI function) open or mapped.
    pub holders: Vec<ProcRef>,
    /// Processes whose descriptors the kernel would not show us (only PID 1
    /// is tolerated; see [`processes_holding`]).
    pub uninspected: Vec<ProcRef>,
}

fn gone(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ESRCH)
}

/// Command names of processes that drive NVMe from user space (DAOS engine
/// and SPDK applications).
pub const ENGINE_COMMS: &[&str] = &[
    "daos_engine",
    "daos_server",
    "daos_server_hel",
    "spdk_tgt",
    "nvmf_tgt",
    "iscsi_tgt",
    "vhost",
    "spdk_nvme_perf",
];

/// Whether a process name is a known user-space NVMe engine.
pub fn is_engine(comm: &str) -> bool {
    ENGINE_COMMS.contains(&comm) || comm.starts_with("reactor_")
}

/// Loop devices whose backing file is one of `devs` (a loop device stacked
/// on this device). Returns their names.
pub fn loops_backed_by(devs: &BTreeSet<DevNum>) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    for e in fs::read_dir("/sys/block")? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Some(bf) = read_attr_opt(&e.path().join("loop/backing_file")) else {
            continue;
        };
        if let Ok(m) = fs::metadata(bf.trim_end_matches(" (deleted)")) {
            if m.file_type().is_block_device() && devs.contains(&DevNum::from_rdev(m.rdev())) {
                out.push(name);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Where the kernel NVMe target (nvmet) is configured, and the module's
/// directory that says it is loaded.
pub const NVMET_CONFIGFS: &str = "/sys/kernel/config/nvmet";
pub const NVMET_MODULE: &str = "/sys/module/nvmet";

/// Namespaces of the kernel NVMe target that export one of `devs` (or
/// whose device cannot be told while enabled), as `subsystem NQN namespace
/// N (enabled|disabled): PATH`. nvmet opens a device without `O_EXCL` and
/// as no process, so neither the exclusive open nor the descriptor scan
/// sees it: only its configfs tree does. nvmet not loaded: none. nvmet
/// loaded but its tree unreadable (configfs not mounted): an error.
pub fn nvmet_exports(devs: &BTreeSet<DevNum>) -> io::Result<Vec<String>> {
    nvmet_exports_in(Path::new(NVMET_CONFIGFS), Path::new(NVMET_MODULE), devs)
}

fn nvmet_exports_in(
    configfs: &Path,
    module: &Path,
    devs: &BTreeSet<DevNum>,
) -> io::Result<Vec<String>> {
    let subsystems = match fs::read_dir(configfs.join("subsystems")) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound && !module.exists() => return Ok(Vec::new()),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "nvmet is loaded but {} cannot be read: {e}",
                    configfs.join("subsystems").display()
                ),
            ))
        }
    };
    let mut out = Vec::new();
    for sub in subsystems {
        let sub = sub?;
        let nqn = sub.file_name().to_string_lossy().into_owned();
        for ns in fs::read_dir(sub.path().join("namespaces"))? {
            let ns = ns?;
            let nsid = ns.file_name().to_string_lossy().into_owned();
            let path = read_attr(&ns.path().join("device_path"))?;
            let enabled = read_attr(&ns.path().join("enable"))? == "1";
            let state = if enabled { "enabled" } else { "disabled" };
            let what = format!("subsystem {nqn} namespace {nsid} ({state}): {path}");
            match fs::metadata(&path) {
                Ok(m) if m.file_type().is_block_device() => {
                    if devs.contains(&DevNum::from_rdev(m.rdev())) {
                        out.push(what);
                    }
                }
                // A file-backed namespace, or none set yet: not a device.
                Ok(_) => {}
                Err(_) if path.is_empty() || !enabled => {}
                // Enabled, on a path that no longer names anything: the
                // kernel holds some device; which one cannot be told.
                Err(e) => out.push(format!("{what} (cannot tell which device: {e})")),
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The kernel driver bound to a PCI function, if any.
pub fn pci_driver(bdf: &str) -> io::Result<Option<String>> {
    match fs::read_link(format!("/sys/bus/pci/devices/{bdf}/driver")) {
        Ok(p) => Ok(p.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if Path::new(&format!("/sys/bus/pci/devices/{bdf}")).exists() {
                Ok(None)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no PCI function {bdf}"),
                ))
            }
        }
        Err(e) => Err(e),
    }
}

/// If SPDK's per-function lock file exists and is locked, the PID holding it.
pub fn spdk_lock_holder(bdf: &str) -> io::Result<Option<u32>> {
    let p = format!("/var/tmp/spdk_pci_lock_{bdf}");
    let f = match fs::OpenOptions::new().read(true).write(true).open(&p) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    use std::os::fd::AsFd;
    let holder = gpuq_sys::blk::posix_lock_holder(f.as_fd()).map_err(io::Error::from)?;
    Ok(holder.map(|p| p as u32))
}

/// Whether `path` belongs to PCI function `bdf`: its sysfs files, or a
/// `/dev/uioN` / `/dev/vfio/N` bound to it.
pub fn path_is_pci_function(path: &Path, bdf: &str) -> bool {
    let s = path.to_string_lossy();
    if s.starts_with("/sys/") && s.contains(&format!("/{bdf}/")) {
        return true;
    }
    if let Some(n) = s.strip_prefix("/dev/uio") {
        let dev = format!("/sys/class/uio/uio{n}/device");
        return fs::canonicalize(dev)
            .map(|p| p.file_name().and_then(|f| f.to_str()) == Some(bdf))
            .unwrap_or(false);
    }
    if let Some(group) = s.strip_prefix("/dev/vfio/") {
        return Path::new(&format!("/sys/kernel/iommu_groups/{group}/devices/{bdf}")).exists();
    }
    false
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_nvmet_nothing_is_exported_and_with_it_an_unreadable_tree_is_an_error() {
        // (What nvmet's configfs tree holds is read in the site VM, whose
        // kernel has nvmet: integration/vm/site/guest/site-physical.sh.)
        let t = tempfile::tempdir().unwrap();
        let absent = t.path().join("absent");
        let devs = BTreeSet::new();
        assert!(nvmet_exports_in(&absent, &absent, &devs)
            .unwrap()
            .is_empty());
        // The module is loaded (its /sys/module directory exists) but the
        // tree is not there (configfs not mounted): not a guess of "none".
        let e = nvmet_exports_in(&absent, t.path(), &devs).unwrap_err();
        assert!(e.to_string().contains("nvmet is loaded but"), "{e}");
    }

    #[test]
    fn parses_mountinfo_with_escapes() {
        let t = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
                 40 27 7:3 / /mnt/a\\040b rw shared:1 - xfs /dev/loop3 rw\n";
        let m = parse_mountinfo(t).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].mountpoint, "/mnt/a b");
        assert_eq!(m[1].devnum, DevNum { major: 7, minor: 3 });
        assert_eq!(m[1].fstype, "xfs");
        assert_eq!(m[1].source, "/dev/loop3");
    }

    #[test]
    fn bad_mountinfo_is_an_error() {
        assert!(parse_mountinfo("garbage line\n").is_err());
    }

    #[test]
    fn devnum_parse_and_anonymous() {
        let d = DevNum::parse("0:25").unwrap();
        assert!(d.is_anonymous());
        assert_eq!(DevNum::parse("259:1").unwrap().to_string(), "259:1");
        assert!(DevNum::parse("x").is_none());
    }

    #[test]
    fn engine_names() {
        assert!(is_engine("daos_engine"));
        assert!(is_engine("reactor_3"));
        assert!(!is_engine("bash"));
    }

    #[test]
    fn pci_of_finds_nearest_function() {
        let p = Path::new("/sys/devices/pci0000:00/0000:00:03.0/nvme/nvme0");
        assert_eq!(pci_of(p).as_deref(), Some("0000:00:03.0"));
    }
}
