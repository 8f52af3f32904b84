//! `--stor nfsrdma` on a node: the kernel NFS server of the node helper's
//! network namespace, driven natively (no exportfs, rpc.nfsd or
//! rpc.mountd; docs/stor-research.md §3 and §10).
//!
//! - **Control**: the `nfsd` filesystem, mounted by the helper in the
//!   lease's directory (its instance is the mounting process's network
//!   namespace's, so four nodes sharing one kernel keep four servers):
//!   `versions` (NFSv4.2 only, before the server starts), `portlist` (the
//!   descriptor of a TCP socket the helper bound to the node's storage
//!   address and port, so nothing listens on another address; `rdma
//!   20049` for an RDMA listener), `threads`, `v4_end_grace`.
//! - **Exports**: the kernel asks user space for them through the sunrpc
//!   caches' channels (`/proc/self/net/rpc/{auth.unix.ip,nfsd.fh,
//!   nfsd.export}/channel`), which rpc.mountd answers from
//!   `/etc/exports`. Here a [`Responder`] thread answers them from the
//!   lease's [`Table`] alone: the lease's client address is the only one
//!   given a domain; the pseudo-root (fsid 0, read-only) and each volume
//!   (fsid 1, 2, …) are the only filesystems; everything else is a
//!   negative answer. While no one holds a channel open the kernel fails
//!   its upcalls at once, so a stopped responder denies, never hangs.
//! - **Stop**: `threads` 0 (the server, its listeners and its NFSv4
//!   state go), then every cache flushed, so that nothing of the kernel
//!   holds the lease's mounts.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The sunrpc caches the responder answers, in the order exportfs
/// flushes them.
pub const CACHES: [&str; 3] = ["auth.unix.ip", "nfsd.fh", "nfsd.export"];

/// Where this network namespace's caches are (present once nfsd is
/// loaded).
pub const RPC: &str = "/proc/self/net/rpc";

/// Whether the kernel NFS server is loaded (its export cache exists in
/// this network namespace).
pub fn loaded() -> bool {
    Path::new(RPC).join("nfsd.export").is_dir()
}

// include/uapi/linux/nfsd/export.h
pub const NFSEXP_READONLY: u32 = 0x0001;
pub const NFSEXP_ROOTSQUASH: u32 = 0x0004;
pub const NFSEXP_NOSUBTREECHECK: u32 = 0x0400;
pub const NFSEXP_FSID: u32 = 0x2000;
pub const NFSEXP_CROSSMOUNT: u32 = 0x4000;
/// `secinfo`'s AUTH_UNIX.
const RPC_AUTH_UNIX: u32 = 1;
/// The NFSv4 grace period after a start (the kernel's minimum).
pub const GRACE_SECS: u32 = 10;
/// nobody/nogroup: what root on the client is squashed to.
pub const ANON: u32 = 65534;

/// How long an answer stands in the kernel's cache. The responder
/// answers again when it expires; should the helper be gone, the lease
/// goes on this long (docs/stor-research.md §10).
const TTL_SECS: u64 = 3600;
/// A negative answer's lifetime (an unknown client or filesystem).
const NEGATIVE_TTL_SECS: u64 = 10;

/// What one lease exports on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// The only client given a domain.
    pub client: IpAddr,
    /// The auth domain's name.
    pub domain: String,
    /// fsid → (path, flags). fsid 0 is the pseudo-root.
    pub exports: BTreeMap<u32, (PathBuf, u32)>,
}

impl Table {
    /// The lease's table: `root` read-only as fsid 0, each volume
    /// read-write (root squashed) as its fsid.
    pub fn of(client: IpAddr, lease: &str, root: &Path, volumes: &[(u32, PathBuf)]) -> Table {
        let mut exports = BTreeMap::new();
        exports.insert(
            0,
            (
                root.to_path_buf(),
                NFSEXP_READONLY
                    | NFSEXP_ROOTSQUASH
                    | NFSEXP_NOSUBTREECHECK
                    | NFSEXP_FSID
                    | NFSEXP_CROSSMOUNT,
            ),
        );
        for (fsid, path) in volumes {
            exports.insert(
                *fsid,
                (
                    path.clone(),
                    NFSEXP_ROOTSQUASH | NFSEXP_NOSUBTREECHECK | NFSEXP_FSID,
                ),
            );
        }
        Table {
            client,
            domain: format!("gpuq-{lease}"),
            exports,
        }
    }

    /// The reply to one upcall `request` (one line, without its newline)
    /// of `cache`, at wall-clock `now`; `None`: not a request we read.
    pub fn answer(&self, cache: &str, request: &str, now: u64) -> Option<String> {
        let words: Vec<&str> = request.split_ascii_whitespace().collect();
        let pos = now + TTL_SECS;
        let neg = now + NEGATIVE_TTL_SECS;
        match (cache, words.as_slice()) {
            // `nfsd <address>` → the lease's domain for its client alone.
            ("auth.unix.ip", [class, addr]) => {
                let ip = unquote(addr)
                    .and_then(|a| String::from_utf8(a).ok())
                    .and_then(|a| a.parse::<IpAddr>().ok());
                let ours = ip.is_some_and(|ip| same_ip(ip, self.client));
                Some(if ours {
                    format!("{class} {addr} {pos} {}", quote(self.domain.as_bytes()))
                } else {
                    format!("{class} {addr} {neg}")
                })
            }
            // `<domain> <fsidtype> <fsid>` → the path of our fsid (type 1,
            // FSID_NUM: a 4-byte number, as NFSEXP_FSID makes them).
            ("nfsd.fh", [domain, ty, fsid]) => {
                let path = (unquote(domain)? == self.domain.as_bytes() && *ty == "1")
                    .then(|| unquote(fsid))
                    .flatten()
                    .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
                    .and_then(|b| self.exports.get(&u32::from_ne_bytes(b)));
                Some(match path {
                    Some((p, _)) => format!(
                        "{domain} {ty} {fsid} {pos} {}",
                        quote(p.as_os_str().as_encoded_bytes())
                    ),
                    None => format!("{domain} {ty} {fsid} {neg}"),
                })
            }
            // `<domain> <path>` → its flags, anonymous ids, fsid, secinfo.
            ("nfsd.export", [domain, path]) => {
                let found = (unquote(domain)? == self.domain.as_bytes())
                    .then(|| unquote(path))
                    .flatten()
                    .and_then(|p| {
                        self.exports
                            .iter()
                            .find(|(_, (e, _))| e.as_os_str().as_encoded_bytes() == p.as_slice())
                    });
                Some(match found {
                    Some((fsid, (_, flags))) => format!(
                        "{domain} {path} {pos} {flags} {ANON} {ANON} {fsid} secinfo 1 {RPC_AUTH_UNIX} {flags}"
                    ),
                    None => format!("{domain} {path} {neg}"),
                })
            }
            _ => None,
        }
    }
}

/// An IPv4 address and its IPv4-mapped IPv6 form are one client.
fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    canon(a) == canon(b)
}

/// The sunrpc caches' word quoting (the kernel's `qword_add`): space, tab,
/// newline and backslash as `\ooo`.
pub fn quote(b: &[u8]) -> String {
    let mut s = String::new();
    for &c in b {
        if c == b' ' || c == b'\t' || c == b'\n' || c == b'\\' || !(0x21..0x7f).contains(&c) {
            s.push_str(&format!("\\{c:03o}"));
        } else {
            s.push(c as char);
        }
    }
    s
}

/// One word of a request (the kernel's `qword_get`): `\x<hex>` or octal
/// escapes. `None`: malformed.
pub fn unquote(w: &str) -> Option<Vec<u8>> {
    let b = w.as_bytes();
    if let Some(hex) = w.strip_prefix("\\x") {
        if hex.len() % 2 != 0 {
            return None;
        }
        return (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
            .collect();
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            let oct = std::str::from_utf8(b.get(i + 1..i + 4)?).ok()?;
            out.push(u8::from_str_radix(oct, 8).ok()?);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

fn wall_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The thread that answers the kernel's export upcalls for one lease.
/// Dropping it stops the thread and closes the channels.
#[derive(Debug)]
pub struct Responder {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Responder {
    /// Open the three channels (this thread's network namespace's: the
    /// helper's) and answer from `table` until dropped.
    pub fn start(table: Table) -> Result<Responder, String> {
        let mut channels = Vec::new();
        for cache in CACHES {
            let p = Path::new(RPC).join(cache).join("channel");
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(|e| format!("open {}: {e}", p.display()))?;
            channels.push((cache, f));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nfsd-upcalls".into())
            .spawn(move || serve(table, channels, s))
            .map_err(|e| format!("cannot start the upcall responder: {e}"))?;
        Ok(Responder {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(table: Table, mut channels: Vec<(&'static str, std::fs::File)>, stop: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 8192];
    while !stop.load(Ordering::Relaxed) {
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd> = channels
                .iter()
                .map(|(_, f)| PollFd::new(f.as_fd(), PollFlags::POLLIN))
                .collect();
            match poll(&mut fds, PollTimeout::from(200u16)) {
                Ok(0) => continue,
                Ok(_) => fds
                    .iter()
                    .map(|p| p.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
                    .collect(),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "nfsd upcalls: poll failed; the responder stops");
                    return;
                }
            }
        };
        for ((cache, f), ready) in channels.iter_mut().zip(ready) {
            if !ready {
                continue;
            }
            // One read, one request (the channel's record boundary).
            let n = match f.read(&mut buf) {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(cache, error = %e, fd = f.as_raw_fd(), "nfsd upcall: read failed");
                    continue;
                }
            };
            let req = String::from_utf8_lossy(&buf[..n]);
            let req = req.trim_end_matches('\n');
            if req.is_empty() {
                continue;
            }
            match table.answer(cache, req, wall_now()) {
                Some(reply) => {
                    if let Err(e) = f.write_all(format!("{reply}\n").as_bytes()) {
                        tracing::warn!(cache, request = req, error = %e, "nfsd upcall: the kernel refused the answer");
                    } else {
                        tracing::debug!(cache, request = req, reply, "nfsd upcall answered");
                    }
                }
                None => tracing::warn!(cache, request = req, "nfsd upcall: not understood"),
            }
        }
    }
}

/// Flush the caches (after the server stopped, before the mounts go):
/// every entry older than now is dropped, and with it its path.
pub fn flush_caches() -> Result<(), String> {
    let now = format!("{}\n", wall_now());
    for cache in CACHES {
        let p = Path::new(RPC).join(cache).join("flush");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|mut f| f.write_all(now.as_bytes()))
            .map_err(|e| format!("flush {}: {e}", p.display()))?;
    }
    Ok(())
}

/// The paths the export cache holds now (`nfsd.export/content`; comment
/// lines skipped): what a foreign server exports, or what a stop left.
pub fn exported_paths() -> Result<Vec<String>, String> {
    let p = Path::new(RPC).join("nfsd.export").join("content");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("read {}: {e}", p.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split_ascii_whitespace().next())
        .filter_map(|w| unquote(w).map(|b| String::from_utf8_lossy(&b).into_owned()))
        .collect())
}

/// The nfsd control filesystem of this network namespace, mounted at
/// `dir`.
#[derive(Debug)]
pub struct Nfsd {
    dir: PathBuf,
}

impl Nfsd {
    /// Mount it at `dir` (made, root's, 0700) unless it is mounted there.
    pub fn mount(dir: &Path) -> Result<Nfsd, String> {
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("create {}: {e}", dir.display())),
        }
        let n = Nfsd {
            dir: dir.to_path_buf(),
        };
        if !n.dir.join("threads").exists() {
            nix::mount::mount(
                Some("nfsd"),
                dir,
                Some("nfsd"),
                nix::mount::MsFlags::MS_NOSUID
                    | nix::mount::MsFlags::MS_NODEV
                    | nix::mount::MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .map_err(|e| format!("mount nfsd on {}: {e}", dir.display()))?;
        }
        Ok(n)
    }

    /// The one mounted at `dir`, if any.
    pub fn at(dir: &Path) -> Option<Nfsd> {
        dir.join("threads").exists().then(|| Nfsd {
            dir: dir.to_path_buf(),
        })
    }

    fn write(&self, file: &str, what: &str) -> Result<(), String> {
        let p = self.dir.join(file);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|mut f| f.write_all(what.as_bytes()))
            .map_err(|e| format!("write {what:?} to {}: {e}", p.display()))
    }

    fn read(&self, file: &str) -> Result<String, String> {
        let p = self.dir.join(file);
        std::fs::read_to_string(&p).map_err(|e| format!("read {}: {e}", p.display()))
    }

    /// How many server threads run (0: stopped).
    pub fn threads(&self) -> Result<u32, String> {
        let t = self.read("threads")?;
        t.trim()
            .parse()
            .map_err(|_| format!("nfsd threads: {t:?} is not a number"))
    }

    /// Start the server: NFSv4.2 only, listening on `tcp` (a bound,
    /// listening socket: this address and port alone) and, with `rdma`,
    /// on RDMA port 20049; `threads` threads; the shortest grace period
    /// ([`GRACE_SECS`]: the job's first open may wait that long).
    pub fn start(&self, tcp: std::net::SocketAddr, rdma: bool, threads: u32) -> Result<(), String> {
        if self.threads()? != 0 {
            return Err("the NFS server of this node already runs".into());
        }
        // v2 may be compiled out; v3 would need no mountd to be reached by
        // a guessed file handle: both off, what is left must be 4.2.
        let _ = self.write("versions", "-2\n");
        let _ = self.write("versions", "-3\n");
        self.write("versions", "+4 +4.1 +4.2\n")?;
        let v = self.read("versions")?;
        if v.split_ascii_whitespace().any(|w| w == "+3" || w == "+2") {
            return Err(format!("NFSv2/3 could not be turned off: versions {v:?}"));
        }
        // The shortest grace period the kernel takes (there is no earlier
        // client state to reclaim on new filesystems; `v4_end_grace`
        // answers EIO on Debian 12's 6.1 without client tracking).
        // Before the first listener: that creates the server (EBUSY).
        self.write("nfsv4gracetime", &format!("{GRACE_SECS}\n"))?;
        let listener =
            std::net::TcpListener::bind(tcp).map_err(|e| format!("cannot listen on {tcp}: {e}"))?;
        self.write("portlist", &format!("{}\n", listener.as_raw_fd()))?;
        // nfsd holds its own reference to the socket now.
        drop(listener);
        if rdma {
            self.write("portlist", "rdma 20049\n")?;
        }
        self.write("threads", &format!("{threads}\n"))?;
        if self.threads()? == 0 {
            return Err("the NFS server did not start (threads is 0)".into());
        }
        Ok(())
    }

    /// Stop the server (threads 0: its listeners and NFSv4 state go) and
    /// confirm.
    /// Also when no thread runs: a listener given to `portlist` keeps the
    /// server (and its socket) until `threads` is written.
    pub fn stop(&self) -> Result<(), String> {
        self.write("threads", "0\n")?;
        let t = self.threads()?;
        if t != 0 {
            return Err(format!("the NFS server still runs {t} thread(s)"));
        }
        let l = self.read("portlist")?;
        if !l.trim().is_empty() {
            return Err(format!(
                "the NFS server still listens: {}",
                l.split_whitespace().collect::<Vec<_>>().join(" ")
            ));
        }
        Ok(())
    }

    /// Unmount the control filesystem (not lazily).
    pub fn unmount(self) -> Result<(), String> {
        nix::mount::umount2(&self.dir, nix::mount::MntFlags::empty())
            .map_err(|e| format!("unmount {}: {e}", self.dir.display()))?;
        let _ = std::fs::remove_dir(&self.dir);
        Ok(())
    }
}

/// Wait until `f` holds or `within` has passed.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = std::time::Instant::now();
    loop {
        if f() {
            return true;
        }
        if t.elapsed() >= within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        Table::of(
            "10.0.0.2".parse().unwrap(),
            "L1",
            Path::new("/var/lib/gpuq/jobs/L1/nfs"),
            &[
                (1, "/var/lib/gpuq/jobs/L1/nfs/nvme0n1".into()),
                (2, "/var/lib/gpuq/jobs/L1/nfs/nvme1n1".into()),
            ],
        )
    }

    #[test]
    fn the_client_alone_gets_the_lease_s_domain() {
        let t = table();
        assert_eq!(
            t.answer("auth.unix.ip", "nfsd 10.0.0.2", 100).unwrap(),
            "nfsd 10.0.0.2 3700 gpuq-L1"
        );
        assert_eq!(
            t.answer("auth.unix.ip", "nfsd ::ffff:10.0.0.2", 100)
                .unwrap(),
            "nfsd ::ffff:10.0.0.2 3700 gpuq-L1"
        );
        // Another address: negative (no domain).
        assert_eq!(
            t.answer("auth.unix.ip", "nfsd 10.0.0.3", 100).unwrap(),
            "nfsd 10.0.0.3 110"
        );
        assert_eq!(t.answer("auth.unix.ip", "nfsd", 100), None);
    }

    #[test]
    fn an_fsid_maps_to_its_path_and_nothing_else_does() {
        let t = table();
        let zero = "\\x00000000";
        assert_eq!(
            t.answer("nfsd.fh", &format!("gpuq-L1 1 {zero}"), 100)
                .unwrap(),
            format!("gpuq-L1 1 {zero} 3700 /var/lib/gpuq/jobs/L1/nfs")
        );
        let two = format!("\\x{}", "02000000");
        let two = if cfg!(target_endian = "little") {
            two
        } else {
            "\\x00000002".into()
        };
        assert!(t
            .answer("nfsd.fh", &format!("gpuq-L1 1 {two}"), 100)
            .unwrap()
            .ends_with(" 3700 /var/lib/gpuq/jobs/L1/nfs/nvme1n1"));
        // Unknown fsid, another domain, another fsid type: negative.
        for req in [
            "gpuq-L1 1 \\x09000000",
            "other 1 \\x00000000",
            "gpuq-L1 6 \\x0000000000000000",
        ] {
            let a = t.answer("nfsd.fh", req, 100).unwrap();
            assert_eq!(a, format!("{req} 110"));
        }
    }

    #[test]
    fn an_export_s_flags_are_the_root_s_or_a_volume_s() {
        let t = table();
        let root = t
            .answer("nfsd.export", "gpuq-L1 /var/lib/gpuq/jobs/L1/nfs", 100)
            .unwrap();
        let f = NFSEXP_READONLY
            | NFSEXP_ROOTSQUASH
            | NFSEXP_NOSUBTREECHECK
            | NFSEXP_FSID
            | NFSEXP_CROSSMOUNT;
        assert_eq!(
            root,
            format!("gpuq-L1 /var/lib/gpuq/jobs/L1/nfs 3700 {f} 65534 65534 0 secinfo 1 1 {f}")
        );
        let vol = t
            .answer(
                "nfsd.export",
                "gpuq-L1 /var/lib/gpuq/jobs/L1/nfs/nvme0n1",
                100,
            )
            .unwrap();
        let f = NFSEXP_ROOTSQUASH | NFSEXP_NOSUBTREECHECK | NFSEXP_FSID;
        assert!(
            vol.ends_with(&format!(" 3700 {f} 65534 65534 1 secinfo 1 1 {f}")),
            "{vol}"
        );
        // The node's own root, a parent, another lease: negative.
        for p in ["/", "/var/lib/gpuq/jobs/L1", "/var/lib/gpuq/jobs/L2/nfs"] {
            assert_eq!(
                t.answer("nfsd.export", &format!("gpuq-L1 {p}"), 100)
                    .unwrap(),
                format!("gpuq-L1 {p} 110")
            );
        }
    }

    #[test]
    fn words_are_quoted_as_the_kernel_quotes_them() {
        assert_eq!(quote(b"/a b\\c"), "/a\\040b\\134c");
        assert_eq!(unquote("/a\\040b\\134c").unwrap(), b"/a b\\c");
        assert_eq!(unquote("\\x0a0B").unwrap(), vec![10, 11]);
        assert_eq!(unquote("\\x0"), None);
        assert_eq!(unquote("a\\09"), None);
    }
}
