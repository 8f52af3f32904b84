//! The NVMe-oF host side of a `--stor nvmeof` lease, natively (no
//! nvme-cli; docs/stor-research.md §2):
//!
//! - [`connect`]: one `write(2)` of the option string to
//!   `/dev/nvme-fabrics`, one `read(2)` of `instance=N,cntlid=M` back. The
//!   queues' sockets are made in the calling process's network namespace
//!   (verified in the site VM, kernel 6.1): the broker's, on the host that
//!   runs the job;
//! - [`namespaces_of`]: the block devices of a subsystem, found by its NQN
//!   in sysfs (`/sys/class/nvme-subsystem/*/subsysnqn`), as they appear
//!   (asynchronously, after the connect);
//! - [`give_to`]: the job's owner gets exactly those devices (a named-user
//!   ACL entry on each device node, opened `O_PATH|O_NOFOLLOW` and checked
//!   to be that block device). The nodes go with the disconnect;
//! - [`controllers_of`] and [`disconnect`]: every controller of the
//!   lease's subsystems, `delete_controller`, confirmed gone.
//!
//! Blocking calls (a connect waits for the target): callers run them off
//! their async runtime, under a deadline.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The fabrics control device (module `nvme_fabrics`).
pub const FABRICS_DEV: &str = "/dev/nvme-fabrics";

/// Where to connect, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `tcp` or `rdma`.
    pub transport: String,
    pub traddr: String,
    pub trsvcid: u16,
    pub subsys_nqn: String,
    pub host_nqn: String,
    /// A UUID, one per host NQN (the kernel refuses a host NQN seen with
    /// another ID).
    pub host_id: String,
}

/// A value of the option string: no separator (`,` `\n`), no `=`, no
/// control byte, not empty.
fn clean(what: &str, v: &str) -> Result<(), String> {
    if v.is_empty()
        || v.bytes()
            .any(|b| b == b',' || b == b'=' || b.is_ascii_control() || b == b' ')
    {
        return Err(format!(
            "{what} {v:?} cannot go into a fabrics option string"
        ));
    }
    Ok(())
}

/// The option string the kernel parses (`drivers/nvme/host/fabrics.c`):
/// the port always explicit (nvme-tcp's default is the discovery port),
/// host NQN and ID always (else a random default of the module).
pub fn options(t: &Target) -> Result<String, String> {
    if !matches!(t.transport.as_str(), "tcp" | "rdma") {
        return Err(format!("transport {:?}: expected tcp or rdma", t.transport));
    }
    clean("address", &t.traddr)?;
    clean("subsystem NQN", &t.subsys_nqn)?;
    clean("host NQN", &t.host_nqn)?;
    clean("host ID", &t.host_id)?;
    Ok(format!(
        "transport={},traddr={},trsvcid={},nqn={},hostnqn={},hostid={}",
        t.transport, t.traddr, t.trsvcid, t.subsys_nqn, t.host_nqn, t.host_id
    ))
}

/// `instance=N,cntlid=M`: the new controller's instance (`nvmeN`).
pub fn parse_reply(s: &str) -> Option<u32> {
    s.trim()
        .split(',')
        .find_map(|kv| kv.strip_prefix("instance="))
        .and_then(|n| n.parse().ok())
}

/// Connect: the controller's name (`nvmeN`).
pub fn connect(t: &Target) -> Result<String, String> {
    let opts = options(t)?;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(FABRICS_DEV)
        .map_err(|e| format!("open {FABRICS_DEV}: {e} (is nvme_fabrics loaded?)"))?;
    // One write: the kernel parses it whole and connects synchronously.
    let n = f.write(opts.as_bytes()).map_err(|e| {
        format!(
            "connect to {} at {} {}:{}: {e} (the target refused or is unreachable; its kernel log says which)",
            t.subsys_nqn, t.transport, t.traddr, t.trsvcid
        )
    })?;
    if n != opts.len() {
        return Err(format!("{FABRICS_DEV} took {n} of {} bytes", opts.len()));
    }
    let mut reply = String::new();
    f.read_to_string(&mut reply)
        .map_err(|e| format!("read {FABRICS_DEV}: {e}"))?;
    parse_reply(&reply)
        .map(|i| format!("nvme{i}"))
        .ok_or_else(|| format!("{FABRICS_DEV} answered {reply:?}, not instance=N"))
}

/// `nvme` + digits (a controller), or `nvme` digits `n` digits (a
/// namespace's disk): names taken from sysfs before they are joined to a
/// path.
fn is_ctrl(n: &str) -> bool {
    n.strip_prefix("nvme")
        .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
}

fn is_disk(n: &str) -> bool {
    n.strip_prefix("nvme")
        .and_then(|r| r.split_once('n'))
        .is_some_and(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        })
}

fn read_trim(p: &Path) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(p)?.trim().to_string())
}

fn list(dir: &Path) -> Result<Vec<String>, String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => Ok(rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("read {}: {e}", dir.display())),
    }
}

/// One namespace's block device on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// `nvme5n1`
    pub name: String,
    /// `/dev/nvme5n1`
    pub path: PathBuf,
    /// The NSID in its subsystem.
    pub nsid: u32,
    /// `major:minor`
    pub devnum: String,
    pub size_bytes: u64,
}

/// sysfs, normally `/sys`.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs {
            root: PathBuf::from("/sys"),
        }
    }
}

impl Sysfs {
    /// The fabrics controllers (not PCIe) whose subsystem NQN starts with
    /// `prefix`: `(nvmeN, its subsystem NQN, its state)`.
    pub fn controllers_of(&self, prefix: &str) -> Result<Vec<(String, String, String)>, String> {
        let class = self.root.join("class/nvme");
        let mut out = Vec::new();
        for c in list(&class)? {
            if !is_ctrl(&c) {
                continue;
            }
            let d = class.join(&c);
            let Ok(nqn) = read_trim(&d.join("subsysnqn")) else {
                continue; // went away meanwhile
            };
            if !nqn.starts_with(prefix) {
                continue;
            }
            let transport = read_trim(&d.join("transport")).unwrap_or_default();
            if transport == "pcie" {
                continue;
            }
            let state = read_trim(&d.join("state")).unwrap_or_default();
            out.push((c, nqn, state));
        }
        out.sort();
        Ok(out)
    }

    /// The namespaces of subsystem `nqn` on this host: the multipath heads
    /// in its `nvme-subsysS/`, else the disks of its controllers.
    pub fn namespaces_of(&self, nqn: &str) -> Result<Vec<Namespace>, String> {
        let class = self.root.join("class/nvme-subsystem");
        let mut disks = Vec::new();
        for s in list(&class)? {
            let d = class.join(&s);
            if read_trim(&d.join("subsysnqn")).ok().as_deref() != Some(nqn) {
                continue;
            }
            let entries = list(&d)?;
            let heads: Vec<String> = entries.iter().filter(|e| is_disk(e)).cloned().collect();
            if heads.is_empty() {
                for c in entries.iter().filter(|e| is_ctrl(e)) {
                    disks.extend(list(&d.join(c))?.into_iter().filter(|e| is_disk(e)));
                }
            } else {
                disks.extend(heads);
            }
        }
        let mut out = Vec::new();
        for name in disks {
            let b = self.root.join("class/block").join(&name);
            let (Ok(nsid), Ok(devnum), Ok(sectors)) = (
                read_trim(&b.join("nsid")).or_else(|_| read_trim(&b.join("device/nsid"))),
                read_trim(&b.join("dev")),
                read_trim(&b.join("size")),
            ) else {
                continue; // not fully there yet
            };
            let (Ok(nsid), Ok(sectors)) = (nsid.parse(), sectors.parse::<u64>()) else {
                continue;
            };
            out.push(Namespace {
                path: PathBuf::from("/dev").join(&name),
                name,
                nsid,
                devnum,
                size_bytes: sectors * 512,
            });
        }
        out.sort_by_key(|n| n.nsid);
        Ok(out)
    }

    /// Delete controller `ctrl` (`nvmeN`): synchronous in the kernel; a
    /// controller already gone counts as deleted.
    pub fn disconnect(&self, ctrl: &str) -> Result<(), String> {
        if !is_ctrl(ctrl) {
            return Err(format!("{ctrl:?} is not a controller name"));
        }
        let p = self
            .root
            .join("class/nvme")
            .join(ctrl)
            .join("delete_controller");
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
        {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("open {}: {e}", p.display())),
            Ok(mut f) => match f.write(b"1") {
                Ok(_) => Ok(()),
                // Deleted while we wrote.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
                Err(e) => Err(format!("delete {ctrl}: {e}")),
            },
        }
    }
}

/// Let `uid` read and write `ns`'s device node, and no one else but root
/// and the `disk` group (as the node is by default): an access ACL with a
/// named-user entry, set through a descriptor of the node
/// (`O_PATH|O_NOFOLLOW`) checked to be the block device `ns.devnum`,
/// never by a name someone could swap meanwhile. Not ownership: udev
/// puts a block node back to `root:disk 0660` on every change event (a
/// writer's close is one), which keeps a named entry (the chmod sets the
/// mask to `rw`). The node goes with the disconnect.
pub fn give_to(ns: &Namespace, uid: u32) -> Result<(), String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&ns.path)
        .map_err(|e| format!("open {}: {e}", ns.path.display()))?;
    let m = f
        .metadata()
        .map_err(|e| format!("fstat {}: {e}", ns.path.display()))?;
    let rdev = m.rdev();
    let found = format!(
        "{}:{}",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    );
    use std::os::unix::fs::FileTypeExt;
    if !m.file_type().is_block_device() || found != ns.devnum {
        return Err(format!(
            "{} is not block device {} (found {found}); nothing was changed",
            ns.path.display(),
            ns.devnum
        ));
    }
    use std::os::fd::AsFd;
    gpuq_sys::acl::set_access(f.as_fd(), &gpuq_sys::acl::owner_user_rw(uid))
        .map_err(|e| format!("give {} to uid {uid} (ACL): {e}", ns.path.display()))?;
    let users = gpuq_sys::acl::named_users(f.as_fd())
        .map_err(|e| format!("read back {}'s ACL: {e}", ns.path.display()))?;
    if users != [uid] {
        return Err(format!(
            "{}'s ACL names {users:?}, not uid {uid} alone",
            ns.path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            transport: "tcp".into(),
            traddr: "10.200.0.11".into(),
            trsvcid: 4420,
            subsys_nqn: "nqn.2026-12.io.gpuq:L1:da1".into(),
            host_nqn: "nqn.2026-12.io.gpuq:host:0123456789abcdef0123456789abcdef".into(),
            host_id: "01234567-89ab-4cde-8f01-23456789abcd".into(),
        }
    }

    #[test]
    fn the_option_string_names_the_port_and_the_host_and_refuses_separators() {
        assert_eq!(
            options(&target()).unwrap(),
            "transport=tcp,traddr=10.200.0.11,trsvcid=4420,nqn=nqn.2026-12.io.gpuq:L1:da1,hostnqn=nqn.2026-12.io.gpuq:host:0123456789abcdef0123456789abcdef,hostid=01234567-89ab-4cde-8f01-23456789abcd"
        );
        for bad in ["a,duplicate_connect", "a\nb", "a=b", ""] {
            let mut t = target();
            t.subsys_nqn = bad.into();
            assert!(options(&t).is_err(), "{bad:?}");
        }
        let mut t = target();
        t.transport = "fc".into();
        assert!(options(&t).is_err());
    }

    #[test]
    fn the_reply_gives_the_instance() {
        assert_eq!(parse_reply("instance=5,cntlid=1\n"), Some(5));
        assert_eq!(parse_reply("cntlid=1"), None);
        assert_eq!(parse_reply("instance=x"), None);
    }

    #[test]
    fn only_controller_and_disk_names_are_joined_to_paths() {
        assert!(is_ctrl("nvme12") && !is_ctrl("nvme") && !is_ctrl("nvme1n1") && !is_ctrl("../x"));
        assert!(
            is_disk("nvme5n1") && !is_disk("nvme5") && !is_disk("nvme5c5n1") && !is_disk("nvmen1")
        );
        assert!(Sysfs::default().disconnect("../../x").is_err());
    }
}
