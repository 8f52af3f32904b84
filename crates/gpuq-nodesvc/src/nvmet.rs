//! `--stor nvmeof` on a node: the lease's allowlisted namespaces exported
//! through the kernel NVMe target, configured natively in configfs
//! (`/sys/kernel/config/nvmet`; no nvmetcli). docs/stor-research.md §1.
//!
//! Everything is done relative to one descriptor of the nvmet directory
//! (`mkdirat`, `openat(O_NOFOLLOW)`, `symlinkat`, `unlinkat`): configfs is
//! root's, but nothing here follows a name it did not make. The objects
//! of one lease on one node ([`NvmetExport`]) are recorded in the node's
//! lease record before the first is made; [`Nvmet::unexport`] removes
//! them in configfs's order (port link, port, namespaces, host link,
//! subsystem, host) and is idempotent; [`Nvmet::left_of`] confirms that
//! none is left.
//!
//! Several nodes may share one kernel (the site VM's four nodes are
//! network namespaces of one guest): names carry the lease and the node,
//! a port is ours only if it links our subsystem or (made before a crash,
//! never linked) listens on our address, and a host entry another node's
//! subsystem still links (`EBUSY`) is left to that node's unexport.
//!
//! The listener is created in the network namespace of the process that
//! makes the port's subsystem link (verified in the site VM, kernel 6.1):
//! the node helper's, so it listens on the node's storage address.
//!
//! **One change at a time per kernel** ([`Nvmet::lock`]): nvmet's configfs
//! is not safe against concurrent changes. A port's `mkdir` and its
//! release (`rmdir`) add and delete it on nvmet's global port list without
//! `nvmet_config_sem`, while every change that concerns discovery (a host
//! allowed or dropped, a subsystem linked into a port) walks that list
//! under it (`drivers/nvme/target/configfs.c`, `nvmet_ports_make` /
//! `nvmet_port_release`; `discovery.c`, `nvmet_subsys_disc_changed`; so in
//! 6.1 and upstream alike). Two node helpers on one kernel unexporting at
//! once crashed the site VM's kernel in `nvmet_subsys_disc_changed` on a
//! deleted list entry (`dead000000000100`), with `nvmet_config_sem` still
//! held by the dead task: every later nvmet change on that kernel hung.
//! So each export and unexport runs under `flock(LOCK_EX)` on nvmet's
//! configfs root directory — one inode per kernel, whatever the mount or
//! network namespace — taken within a deadline.

use gpuq_protocol::node::{NvmetExport, NQN_PREFIX};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// Where nvmet's configfs tree is (present only while `nvmet` is loaded).
pub const ROOT: &str = "/sys/kernel/config/nvmet";

/// nvmet's configfs tree, held by one descriptor.
#[derive(Debug)]
pub struct Nvmet {
    root: OwnedFd,
    /// Its path, for the symlinks' targets and messages.
    path: String,
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// `openat(at, name)` with `flags | O_NOFOLLOW | O_CLOEXEC`; `at` `None`:
/// an absolute `name`.
fn open(at: Option<BorrowedFd<'_>>, name: &str, flags: OFlag) -> Result<OwnedFd, Errno> {
    gpuq_sys::fsid::open_at(
        at,
        Path::new(name),
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
    )
    .map_err(errno)
}

fn open_dir(at: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    open(Some(at), name, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
}

/// A directory's entries (names only), read through the descriptor
/// (`/proc/self/fd/N` names the directory it holds, not a path anyone
/// could swap).
fn entries(dir: BorrowedFd<'_>) -> Result<Vec<String>, Errno> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())).map_err(errno)? {
        out.push(e.map_err(errno)?.file_name().to_string_lossy().into_owned());
    }
    Ok(out)
}

/// Write `value` to attribute `name` of `dir` in one `write(2)` (configfs
/// takes an attribute in one write).
fn write_attr(dir: BorrowedFd<'_>, name: &str, value: &str) -> Result<(), Errno> {
    let fd = open(Some(dir), name, OFlag::O_WRONLY)?;
    let n = nix::unistd::write(fd.as_fd(), value.as_bytes())?;
    if n != value.len() {
        return Err(Errno::EIO);
    }
    Ok(())
}

fn read_attr(dir: BorrowedFd<'_>, name: &str) -> Result<String, Errno> {
    let fd = open(Some(dir), name, OFlag::O_RDONLY)?;
    let mut buf = [0u8; 4096];
    let n = nix::unistd::read(fd.as_raw_fd(), &mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim_end().to_string())
}

/// `mkdirat`, an existing directory counting as made (every step repeats).
fn mkdir(at: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
    match mkdirat(Some(at.as_raw_fd()), name, Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// `unlinkat`/`rmdir`, a missing entry counting as removed.
fn remove(at: BorrowedFd<'_>, name: &str, dir: bool) -> Result<(), Errno> {
    let flag = if dir {
        UnlinkatFlags::RemoveDir
    } else {
        UnlinkatFlags::NoRemoveDir
    };
    match unlinkat(Some(at.as_raw_fd()), name, flag) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

fn missing(e: Errno) -> bool {
    e == Errno::ENOENT
}

/// A failed configfs step, named.
fn step(what: impl std::fmt::Display) -> impl FnOnce(Errno) -> String {
    move |e| format!("{what}: {}", std::io::Error::from(e))
}

impl Nvmet {
    /// The tree, or `None` when `nvmet` is not loaded (no directory).
    pub fn open() -> Result<Option<Nvmet>, String> {
        Self::open_at(ROOT)
    }

    fn open_at(path: &str) -> Result<Option<Nvmet>, String> {
        match open(None, path, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
            Ok(root) => Ok(Some(Nvmet {
                root,
                path: path.to_string(),
            })),
            Err(e) if missing(e) => Ok(None),
            Err(e) => Err(step(format!("open {path}"))(e)),
        }
    }

    /// Hold nvmet's tree for one export or unexport: `flock(LOCK_EX)` on
    /// its root directory (see the module's doc), waiting at most `wait`
    /// for another node helper on this kernel to end its change. Released
    /// when the guard drops.
    pub async fn lock(&self, wait: std::time::Duration) -> Result<NvmetLock, String> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            let fd = self
                .root
                .try_clone()
                .map_err(|e| format!("{}: dup: {e}", self.path))?;
            match nix::fcntl::Flock::lock(fd, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(held) => return Ok(NvmetLock { _held: held }),
                Err((_, Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err((_, Errno::EWOULDBLOCK)) => {
                    return Err(format!(
                        "{} is locked by another change of the kernel NVMe target (another node helper on this kernel) for more than {}s; nothing was changed",
                        self.path,
                        wait.as_secs()
                    ))
                }
                Err((_, e)) => return Err(step(format!("flock {}", self.path))(e)),
            }
        }
    }

    fn dir(&self, rel: &str) -> Result<OwnedFd, Errno> {
        open_dir(self.root.as_fd(), rel)
    }

    /// Every subsystem's NQN.
    pub fn subsystems(&self) -> Result<Vec<String>, String> {
        self.dir("subsystems")
            .and_then(|d| entries(d.as_fd()))
            .map_err(step(format!("read {}/subsystems", self.path)))
    }

    /// The subsystems that are not `lease`'s (of any node): what a
    /// preflight refuses. Another site's exports, an old lease's left
    /// behind, a hand-made one: gpuq never shares the target.
    pub fn foreign(&self, lease: &str) -> Result<Vec<String>, String> {
        let ours = format!("{NQN_PREFIX}{lease}:");
        Ok(self
            .subsystems()?
            .into_iter()
            .filter(|s| !s.starts_with(&ours))
            .collect())
    }

    /// A port ID no port has now, from `seed` on (nodes sharing a kernel
    /// start at different seeds; a collision at `mkdir` is
    /// [`ExportError::PortTaken`] and the caller picks again).
    pub fn free_port_id(&self, seed: u16) -> Result<u16, String> {
        let taken: Vec<u16> = self
            .dir("ports")
            .and_then(|d| entries(d.as_fd()))
            .map_err(step(format!("read {}/ports", self.path)))?
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect();
        let mut id = seed.max(1);
        for _ in 0..=u16::MAX {
            if !taken.contains(&id) {
                return Ok(id);
            }
            id = id.checked_add(1).unwrap_or(1);
        }
        Err("every nvmet port ID is taken".into())
    }

    /// Make the export: subsystem (no host but ours), namespaces (each
    /// device checked to be still the one preflight found, before and
    /// after it is enabled), host, port; the subsystem's link into the
    /// port starts the listener. Repeatable: an object that exists is
    /// taken as made by an earlier attempt of this lease (its name says
    /// so), a port only if it is ours ([`Nvmet::port_is_ours`]).
    pub fn export(&self, e: &NvmetExport) -> Result<(), ExportError> {
        let f = |what: String| move |err: Errno| ExportError::Failed(step(what)(err));
        let subs = self
            .dir("subsystems")
            .map_err(f("open subsystems".into()))?;
        mkdir(subs.as_fd(), &e.subsystem_nqn)
            .map_err(f(format!("mkdir subsystems/{}", e.subsystem_nqn)))?;
        let sub = open_dir(subs.as_fd(), &e.subsystem_nqn)
            .map_err(f(format!("open subsystems/{}", e.subsystem_nqn)))?;
        write_attr(sub.as_fd(), "attr_allow_any_host", "0")
            .map_err(f("attr_allow_any_host = 0".into()))?;
        let nss = open_dir(sub.as_fd(), "namespaces").map_err(f("open namespaces".into()))?;
        for ns in &e.namespaces {
            let want = &ns.devnum;
            let id = ns.nsid.to_string();
            mkdir(nss.as_fd(), &id).map_err(f(format!("mkdir namespaces/{id}")))?;
            let nsd = open_dir(nss.as_fd(), &id).map_err(f(format!("open namespaces/{id}")))?;
            let same = || devnum_of(&ns.device_path).as_deref() == Some(want.as_str());
            if !same() {
                return Err(ExportError::Failed(format!(
                    "{} is no longer device {want} (as preflight found it); nothing of it was exported",
                    ns.device_path
                )));
            }
            if read_attr(nsd.as_fd(), "enable").as_deref() != Ok("1") {
                write_attr(nsd.as_fd(), "device_path", &ns.device_path)
                    .map_err(f(format!("namespaces/{id}/device_path")))?;
                write_attr(nsd.as_fd(), "enable", "1")
                    .map_err(f(format!("namespaces/{id}/enable")))?;
            }
            if !same() {
                return Err(ExportError::Failed(format!(
                    "{} changed while it was exported; the cleanup unexports it",
                    ns.device_path
                )));
            }
        }
        let hosts = self.dir("hosts").map_err(f("open hosts".into()))?;
        mkdir(hosts.as_fd(), &e.host_nqn).map_err(f("mkdir hosts/<the lease's host>".into()))?;
        let allowed =
            open_dir(sub.as_fd(), "allowed_hosts").map_err(f("open allowed_hosts".into()))?;
        match symlinkat(
            format!("{}/hosts/{}", self.path, e.host_nqn).as_str(),
            Some(allowed.as_raw_fd()),
            e.host_nqn.as_str(),
        ) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(err) => return Err(f("allow the lease's host".into())(err)),
        }
        let ports = self.dir("ports").map_err(f("open ports".into()))?;
        let id = e.port_id.to_string();
        match mkdirat(
            Some(ports.as_raw_fd()),
            id.as_str(),
            Mode::from_bits_truncate(0o755),
        ) {
            Ok(()) => {}
            Err(Errno::EEXIST) => {
                if !self.port_is_ours(e).map_err(ExportError::Failed)? {
                    return Err(ExportError::PortTaken(e.port_id));
                }
            }
            Err(err) => return Err(f(format!("mkdir ports/{id}"))(err)),
        }
        let port = open_dir(ports.as_fd(), &id).map_err(f(format!("open ports/{id}")))?;
        let linked = open_dir(port.as_fd(), "subsystems")
            .map_err(f(format!("open ports/{id}/subsystems")))?;
        if !entries(linked.as_fd())
            .map_err(f(format!("read ports/{id}/subsystems")))?
            .contains(&e.subsystem_nqn)
        {
            // Addresses only while the port is disabled (no link yet).
            for (attr, v) in [
                ("addr_trtype", e.transport.clone()),
                (
                    "addr_adrfam",
                    if e.address.contains(':') {
                        "ipv6".into()
                    } else {
                        "ipv4".into()
                    },
                ),
                ("addr_traddr", e.address.clone()),
                ("addr_trsvcid", e.port.to_string()),
            ] {
                write_attr(port.as_fd(), attr, &v)
                    .map_err(f(format!("ports/{id}/{attr} = {v}")))?;
            }
            symlinkat(
                format!("{}/subsystems/{}", self.path, e.subsystem_nqn).as_str(),
                Some(linked.as_raw_fd()),
                e.subsystem_nqn.as_str(),
            )
            .map_err(f(format!(
                "listen on {} {}:{} (the subsystem's link into ports/{id})",
                e.transport, e.address, e.port
            )))?;
        }
        Ok(())
    }

    /// Port `e.port_id` links only `e`'s subsystem, or links nothing and
    /// has `e`'s address (made by an export of this lease cut short).
    pub fn port_is_ours(&self, e: &NvmetExport) -> Result<bool, String> {
        let id = e.port_id.to_string();
        let port = match self.dir(&format!("ports/{id}")) {
            Ok(p) => p,
            Err(err) if missing(err) => return Ok(false),
            Err(err) => return Err(step(format!("open ports/{id}"))(err)),
        };
        let linked = open_dir(port.as_fd(), "subsystems")
            .and_then(|d| entries(d.as_fd()))
            .map_err(step(format!("read ports/{id}/subsystems")))?;
        if !linked.is_empty() {
            return Ok(linked == [e.subsystem_nqn.clone()]);
        }
        let addr = read_attr(port.as_fd(), "addr_traddr").unwrap_or_default();
        let svc = read_attr(port.as_fd(), "addr_trsvcid").unwrap_or_default();
        Ok(addr == e.address && svc == e.port.to_string())
    }

    /// Remove the export in configfs's order; what was already gone is
    /// skipped. A port that is not ours is never touched; a host entry
    /// another subsystem still admits (`EBUSY`) stays for that one's
    /// unexport. Returns what was removed.
    pub fn unexport(&self, e: &NvmetExport) -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        let id = e.port_id.to_string();
        if self.port_is_ours(e)? {
            let port = self
                .dir(&format!("ports/{id}"))
                .map_err(step(format!("open ports/{id}")))?;
            let linked = open_dir(port.as_fd(), "subsystems")
                .map_err(step(format!("open ports/{id}/subsystems")))?;
            remove(linked.as_fd(), &e.subsystem_nqn, false).map_err(step(format!(
                "stop listening (unlink ports/{id}/subsystems/…)"
            )))?;
            drop(linked);
            drop(port);
            let ports = self.dir("ports").map_err(step("open ports"))?;
            remove(ports.as_fd(), &id, true).map_err(step(format!("rmdir ports/{id}")))?;
            done.push(format!("port {id}"));
        }
        match self.dir(&format!("subsystems/{}", e.subsystem_nqn)) {
            Err(err) if missing(err) => {}
            Err(err) => return Err(step("open the lease's subsystem")(err)),
            Ok(sub) => {
                let nss = open_dir(sub.as_fd(), "namespaces").map_err(step("open namespaces"))?;
                for ns in entries(nss.as_fd()).map_err(step("read namespaces"))? {
                    if let Ok(d) = open_dir(nss.as_fd(), &ns) {
                        // Disabled first: the release does it too, this
                        // says so if it fails.
                        let _ = write_attr(d.as_fd(), "enable", "0");
                    }
                    remove(nss.as_fd(), &ns, true)
                        .map_err(step(format!("rmdir namespaces/{ns}")))?;
                }
                let allowed =
                    open_dir(sub.as_fd(), "allowed_hosts").map_err(step("open allowed_hosts"))?;
                for h in entries(allowed.as_fd()).map_err(step("read allowed_hosts"))? {
                    remove(allowed.as_fd(), &h, false).map_err(step("unlink allowed_hosts/…"))?;
                }
                drop((nss, allowed, sub));
                let subs = self.dir("subsystems").map_err(step("open subsystems"))?;
                remove(subs.as_fd(), &e.subsystem_nqn, true)
                    .map_err(step(format!("rmdir subsystems/{}", e.subsystem_nqn)))?;
                done.push(format!("subsystem {}", e.subsystem_nqn));
            }
        }
        let hosts = self.dir("hosts").map_err(step("open hosts"))?;
        match unlinkat(
            Some(hosts.as_raw_fd()),
            e.host_nqn.as_str(),
            UnlinkatFlags::RemoveDir,
        ) {
            Ok(()) => done.push("the lease's host entry".into()),
            // Another node's subsystem of the lease (shared kernel) still
            // admits it: that node's unexport removes it.
            Err(Errno::ENOENT) | Err(Errno::EBUSY) => {}
            Err(err) => return Err(step("rmdir hosts/<the lease's host>")(err)),
        }
        Ok(done)
    }

    /// What of `e` is still in configfs (empty: the unexport is
    /// confirmed). The host entry counts only while our subsystem exists
    /// (another node's may still admit it).
    pub fn left_of(&self, e: &NvmetExport) -> Result<Vec<String>, String> {
        let mut left = Vec::new();
        if self.subsystems()?.contains(&e.subsystem_nqn) {
            left.push(format!("subsystem {}", e.subsystem_nqn));
        }
        if self.port_is_ours(e)? {
            left.push(format!("port {} ({}:{})", e.port_id, e.address, e.port));
        }
        Ok(left)
    }
}

/// nvmet's tree held for one change ([`Nvmet::lock`]).
#[derive(Debug)]
pub struct NvmetLock {
    _held: nix::fcntl::Flock<OwnedFd>,
}

/// Why an export did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportError {
    /// Another node (sharing this kernel) made port `0` first: pick again.
    PortTaken(u16),
    Failed(String),
}

/// A port-ID seed for `node`: nodes sharing a kernel start apart.
pub fn port_seed(node: &str) -> u16 {
    // FNV-1a, folded into 1..=60000.
    let mut h: u32 = 0x811c_9dc5;
    for b in node.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % 60_000) as u16 + 1
}

/// The devnum (`major:minor`) of the block device at `path`, by `stat`
/// (the kernel opens `device_path` by name; this checks the name still
/// means the device that preflight inspected).
pub fn devnum_of(path: &str) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(Path::new(path)).ok()?;
    if !m.file_type().is_block_device() {
        return None;
    }
    let r = m.rdev();
    Some(format!(
        "{}:{}",
        nix::sys::stat::major(r),
        nix::sys::stat::minor(r)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn port_seeds_are_in_range_and_differ_for_the_test_nodes() {
        let seeds: Vec<u16> = ["da1", "da2", "da3", "da4"]
            .iter()
            .map(|n| port_seed(n))
            .collect();
        assert!(seeds.iter().all(|s| (1..=60_000).contains(s)), "{seeds:?}");
        let mut d = seeds.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), 4, "{seeds:?}");
    }

    #[tokio::test]
    async fn one_change_at_a_time_a_second_waits_within_its_deadline_and_then_refuses() {
        // The lock is flock on the tree's root directory: any directory
        // shows its behaviour (this machine has no nvmet).
        let d = tempfile::tempdir().unwrap();
        let path = d.path().to_str().unwrap();
        let (a, b) = (
            Nvmet::open_at(path).unwrap().unwrap(),
            Nvmet::open_at(path).unwrap().unwrap(),
        );
        let held = a.lock(Duration::from_secs(1)).await.unwrap();
        let t = std::time::Instant::now();
        let e = b.lock(Duration::from_millis(300)).await.unwrap_err();
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert!(
            e.contains("locked by another change") && e.contains("nothing was changed"),
            "{e}"
        );
        // Released when the holder's change ends: the next one waits for it.
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            drop(held);
        });
        let t = std::time::Instant::now();
        let _next = b.lock(Duration::from_secs(5)).await.unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
        release.await.unwrap();
        // A third, from another open of the same directory, waits for it too.
        let c = Nvmet::open_at(path).unwrap().unwrap();
        assert!(c.lock(Duration::from_millis(100)).await.is_err());
    }

    #[test]
    fn without_nvmet_loaded_there_is_no_tree_and_no_error() {
        // This machine's kernel has no nvmet (no module tree): the path is
        // absent, which is "not loaded", not a failure.
        let p = "/sys/kernel/config/nvmet-is-not-here";
        assert!(Nvmet::open_at(p).unwrap().is_none());
    }
}
