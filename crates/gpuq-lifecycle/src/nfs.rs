//! A `--stor nfsrdma` lease on the job's host: every node's export
//! mounted with `mount(2)` (the kernel parses the NFS options itself; no
//! mount.nfs), each mount checked to be the owner's, the job's variables,
//! and the cleanup's `unmount` (never lazy).
//!
//! Mounts go to `<mount_dir>/<lease>/<node>-<volume>`: `mount_dir` and
//! the lease's directory are root's (0755), so no user can put anything
//! in the path; each mount's root is the job owner's, 0700 (the node made
//! it so), which this host checks before the job starts.

use gpuq_protocol::node::NfsExportReport;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One mount the job gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub node: String,
    pub volume: String,
    pub path: PathBuf,
}

/// Whether this host has an RDMA device (`/sys/class/infiniband`).
pub fn has_rdma() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

/// From which port up any user of this host may bind, in this network
/// namespace (the broker's: where the mounts start).
const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";

/// Whether this host can keep a lease's exports to its owner. The nodes'
/// exports are secure (never `insecure`: the kernel server takes AUTH_SYS
/// only from a source port below 1024) and admit this host's address
/// alone; what tells the owner's mounts (made by root, from a reserved
/// port) from any other user's is that no user here can send from a port
/// below 1024. Where `net.ipv4.ip_unprivileged_port_start` is lowered, any
/// user could reach an export as the owner: refused, with what to do.
pub fn privileged_ports_hold() -> Result<(), String> {
    match std::fs::read_to_string(UNPRIVILEGED_PORT_START) {
        Ok(text) => privileged_ports_rule(&text),
        // Kernels before 4.11 have no such setting: 1024, fixed.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!(
            "cannot read {UNPRIVILEGED_PORT_START} ({e}), so whether any user here can send from a port below 1024 is unknown"
        )),
    }
}

/// [`privileged_ports_hold`] for the setting's text.
fn privileged_ports_rule(text: &str) -> Result<(), String> {
    match text.trim().parse::<u32>() {
        Ok(n) if n >= 1024 => Ok(()),
        Ok(n) => Err(format!(
            "this host lets every user send from port {n} up (net.ipv4.ip_unprivileged_port_start = {n}), \
             so the nodes' NFS servers could not tell another user's requests from the owner's; \
             ask the operator to set it to 1024 (sysctl, and in /etc/sysctl.d)"
        )),
        Err(_) => Err(format!(
            "{UNPRIVILEGED_PORT_START} holds {:?}, not a port number",
            text.trim()
        )),
    }
}

/// The lease's directory of mounts.
pub fn lease_dir(mount_dir: &Path, lease: &str) -> PathBuf {
    mount_dir.join(lease)
}

/// The `mount(2)` data of one export: NFSv4.2 over `proto`, to the
/// node's address (the kernel never resolves a name), from this host's.
pub fn options(server: &str, port: u16, proto: &str, client: &str) -> String {
    format!(
        "vers=4.2,proto={proto},port={port},addr={server},clientaddr={client},hard,timeo=600,retrans=2,sec=sys"
    )
}

/// `<address>:/<volume>` (an IPv6 address in brackets).
pub fn source(server: &str, volume: &str) -> String {
    if server.contains(':') {
        format!("[{server}]:/{volume}")
    } else {
        format!("{server}:/{volume}")
    }
}

/// The lease's directory of mounts (and `mount_dir` above it), made and
/// checked once, before the nodes' mounts run at once: made by several
/// at a time, one would see another's directory between its `mkdir` and
/// its `chmod` (tried in the site VM).
///
/// The job owner's uid is written there too (`owner`, root's, durable):
/// the cleanup's `unmount` ends that uid's processes still holding a
/// mount, and no one else's.
pub fn make_lease_dir(mount_dir: &Path, lease: &str, owner_uid: u32) -> Result<(), String> {
    make_root_dir(mount_dir)?;
    let dir = lease_dir(mount_dir, lease);
    make_root_dir(&dir)?;
    let owner = dir.join(OWNER);
    gpuq_durable::write_atomic(&owner, format!("{owner_uid}\n").as_bytes(), 0o644)
        .map_err(|e| format!("write {}: {e}", owner.display()))
}

/// In the lease's directory of mounts: the job owner's uid.
const OWNER: &str = "owner";

/// The uid [`make_lease_dir`] wrote for `dir`'s lease; `None` when there
/// is none (a crash before it), or it is not a uid other than root's.
fn owner_of(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(OWNER))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|u| *u != 0)
}

/// Mount every volume of one node's export and check each is `uid`'s,
/// 0700; [`make_lease_dir`] first. Blocking (a mount waits for the
/// server: the caller bounds it).
pub fn mount_one(
    r: &NfsExportReport,
    mount_dir: &Path,
    lease: &str,
    client: &str,
    rdma: bool,
    uid: u32,
) -> Result<Vec<Mounted>, String> {
    let dir = lease_dir(mount_dir, lease);
    let (proto, port) = if rdma && r.nfs.transport == "rdma" {
        ("rdma", 20049)
    } else {
        ("tcp", r.nfs.port)
    };
    let mut out = Vec::new();
    for v in &r.nfs.volumes {
        let at = dir.join(format!("{}-{}", r.node, v.name));
        let src = source(&r.nfs.address, &v.name);
        if mount_of(&at)?.is_none() {
            make_root_dir(&at)?;
            mount(
                Some(src.as_str()),
                &at,
                Some("nfs4"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(options(&r.nfs.address, port, proto, client).as_str()),
            )
            .map_err(|e| format!("{}: mount {src} on {}: {e}", r.node, at.display()))?;
        }
        // Verify after: an NFS mount of that export, the owner's alone.
        match mount_of(&at)? {
            Some(m) if m.fstype.starts_with("nfs") && m.source == src => {}
            m => {
                return Err(format!(
                    "{}: {} is not the mount of {src} after its mount ({m:?})",
                    r.node,
                    at.display()
                ))
            }
        }
        let st = nix::sys::stat::stat(&at).map_err(|e| format!("stat {}: {e}", at.display()))?;
        if st.st_uid != uid || st.st_mode & 0o777 != 0o700 {
            return Err(format!(
                "{}: {} is uid {} mode {:o}, not uid {uid} 0700",
                r.node,
                at.display(),
                st.st_uid,
                st.st_mode & 0o777
            ));
        }
        out.push(Mounted {
            node: r.node.clone(),
            volume: v.name.clone(),
            path: at,
        });
    }
    Ok(out)
}

/// A directory root's, not writable by others, that every user can
/// reach: each missing component made root's, 0755 (set explicitly: the
/// broker's umask does not decide), then the whole path checked.
fn make_root_dir(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut cur = PathBuf::new();
    for c in p.components() {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match std::fs::create_dir(&cur) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(format!("create {}: {e}", cur.display())),
                }
                let m = std::fs::symlink_metadata(&cur)
                    .map_err(|e| format!("stat {}: {e}", cur.display()))?;
                if m.is_dir() && m.uid() == 0 {
                    std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(0o755))
                        .map_err(|e| format!("chmod {}: {e}", cur.display()))?;
                }
            }
            Err(e) => return Err(format!("stat {}: {e}", cur.display())),
        }
    }
    let m = std::fs::symlink_metadata(p).map_err(|e| format!("stat {}: {e}", p.display()))?;
    if !m.is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory only root can write (uid {}, mode {:o})",
            p.display(),
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    for a in p.ancestors() {
        let m = std::fs::metadata(a).map_err(|e| format!("stat {}: {e}", a.display()))?;
        if m.mode() & 0o001 == 0 {
            return Err(format!(
                "{} (mode {:o}) is not searchable by others: the job's owner could not reach the mounts below it",
                a.display(),
                m.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// The cleanup's `unmount`: every mount under the lease's directory gone
/// (deepest first), never lazily — a busy one is retried, then forced
/// (`MNT_FORCE` aborts the NFS requests in flight; the mount is still
/// really gone or the step fails); confirmed by mountinfo; then the
/// empty directories removed. Idempotent. Blocking.
pub fn unmount_lease(mount_dir: &Path, lease: &str) -> Result<String, String> {
    let dir = lease_dir(mount_dir, lease);
    let mut ours: Vec<MountInfo> = mounts()?
        .into_iter()
        .filter(|m| Path::new(&m.mountpoint).starts_with(&dir))
        .collect();
    ours.sort_by_key(|m| std::cmp::Reverse(m.mountpoint.len()));
    // The job's processes were ended by `kill_job`; the owner's outside
    // it may still hold a mount (a shell `cd`'d into it, a `tail -f` of a
    // result): ended too. Anyone else's (root's; a daemon the owner sent
    // a descriptor to) makes the unmount below fail and the step hold,
    // naming it.
    let points: Vec<PathBuf> = ours.iter().map(|m| PathBuf::from(&m.mountpoint)).collect();
    let ended = match owner_of(&dir) {
        Some(uid) if !points.is_empty() => end_owner_holders(&points, uid)?,
        _ => Vec::new(),
    };
    let mut did = Vec::new();
    for m in &ours {
        let at = Path::new(&m.mountpoint);
        let mut t = std::time::Instant::now();
        let mut forced = false;
        loop {
            let flags = if forced {
                MntFlags::MNT_FORCE
            } else {
                MntFlags::empty()
            };
            let e = match umount2(at, flags) {
                Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => break,
                Err(e) => e,
            };
            if t.elapsed() > Duration::from_secs(5) {
                if forced {
                    let held = holders(std::slice::from_ref(&PathBuf::from(&m.mountpoint)))
                        .iter()
                        .map(|h| h.to_string())
                        .collect::<Vec<_>>();
                    return Err(format!(
                        "unmount {}: {e} (never lazily: the job's data is behind it){}",
                        m.mountpoint,
                        if held.is_empty() {
                            String::new()
                        } else {
                            format!("; held open by {}", held.join(", "))
                        }
                    ));
                }
                forced = true;
                t = std::time::Instant::now();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        did.push(format!(
            "{} ({}){}",
            m.mountpoint,
            m.source,
            if forced { ", forced" } else { "" }
        ));
    }
    let left: Vec<String> = mounts()?
        .into_iter()
        .filter(|m| Path::new(&m.mountpoint).starts_with(&dir))
        .map(|m| m.mountpoint)
        .collect();
    if !left.is_empty() {
        return Err(format!(
            "unmount not confirmed: still mounted: {}",
            left.join(", ")
        ));
    }
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let _ = std::fs::remove_file(dir.join(OWNER));
        for e in rd.flatten() {
            let _ = std::fs::remove_dir(e.path());
        }
        let _ = std::fs::remove_dir(&dir);
    }
    let ended = if ended.is_empty() {
        String::new()
    } else {
        format!(" (ended what still held them: {})", ended.join(", "))
    };
    Ok(if did.is_empty() {
        "no mount of this lease on this host".into()
    } else {
        format!("unmounted {}; none is left{ended}", did.join(", "))
    })
}

/// A process that holds something under one of a lease's mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    pid: u32,
    uid: u32,
    comm: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({}, uid {})", self.pid, self.comm, self.uid)
    }
}

/// Whether process `pid` holds anything under one of `points`: its
/// working or root directory, an open file, a mapped file. Read from
/// /proc (the names the kernel keeps: nothing asks the NFS server).
fn holds(pid: u32, points: &[PathBuf]) -> bool {
    let under = |p: &Path| points.iter().any(|m| p.starts_with(m));
    let link = |name: &str| std::fs::read_link(format!("/proc/{pid}/{name}"));
    if ["cwd", "root"]
        .iter()
        .any(|n| link(n).is_ok_and(|p| under(&p)))
    {
        return true;
    }
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        if fds
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|p| under(&p)))
        {
            return true;
        }
    }
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
        maps.lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .any(|p| under(Path::new(p)))
    })
}

/// Process `pid`'s real UID, from `/proc/PID/status` (`Uid:` real,
/// effective, saved, filesystem). Not the owner of `/proc/PID`: a process
/// that made itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`, or one
/// that changed its credentials) shows there as root's.
fn real_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Every process (but this one) holding something under `points`.
fn holders(points: &[PathBuf]) -> Vec<Holder> {
    let own = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own && holds(*pid, points))
        .filter_map(|pid| {
            let uid = real_uid(pid)?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            Some(Holder {
                pid,
                uid,
                // The process's own name (its owner chose it): shown
                // only as printable ASCII.
                comm: comm
                    .trim_end()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_graphic() || c == ' ' {
                            c
                        } else {
                            '?'
                        }
                    })
                    .collect(),
            })
        })
        .collect()
}

/// End (SIGKILL) every process whose real UID is `uid` (the job's owner)
/// that holds something under `points` — a non-dumpable one included —,
/// each through a pidfd opened before it is looked at again (a reused PID
/// is never hit), and wait for them (2 s at most; a process the kernel has
/// not let go by then is named by the unmount's failure). Returns the
/// ones ended.
fn end_owner_holders(points: &[PathBuf], uid: u32) -> Result<Vec<String>, String> {
    use std::os::fd::AsFd;
    let mut ended = Vec::new();
    let t = std::time::Instant::now();
    loop {
        let left: Vec<Holder> = holders(points)
            .into_iter()
            .filter(|h| h.uid == uid)
            .collect();
        if left.is_empty() || t.elapsed() > Duration::from_secs(2) {
            return Ok(ended);
        }
        for h in left {
            let fd = match gpuq_sys::proc::pidfd_of_listed(h.pid)
                .map_err(|e| format!("ending {h}, which holds a mount of the lease: {e}"))?
            {
                gpuq_sys::proc::Listed::Open(fd) => fd,
                gpuq_sys::proc::Listed::Gone => continue,
            };
            let same = real_uid(h.pid) == Some(h.uid) && holds(h.pid, points);
            if same && gpuq_sys::proc::pidfd_kill(fd.as_fd()).is_ok() {
                let said = h.to_string();
                if !ended.contains(&said) {
                    ended.push(said);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The job's variables: `GPUQ_STOR_KIND`, `GPUQ_STOR_MOUNTS` (every
/// mount, space-separated, in node order) and `GPUQ_STOR_MOUNTS_<NODE>`.
pub fn job_env(mounted: &[Mounted]) -> Vec<(String, String)> {
    let mut env = vec![
        ("GPUQ_STOR_KIND".to_string(), "nfsrdma".to_string()),
        (
            "GPUQ_STOR_MOUNTS".to_string(),
            mounted
                .iter()
                .map(|m| m.path.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ];
    let mut nodes: Vec<&str> = mounted.iter().map(|m| m.node.as_str()).collect();
    nodes.dedup();
    for n in nodes {
        env.push((
            format!("GPUQ_STOR_MOUNTS_{}", crate::stor::env_name(n)),
            mounted
                .iter()
                .filter(|m| m.node == n)
                .map(|m| m.path.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
        ));
    }
    env
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct MountInfo {
    mountpoint: String,
    fstype: String,
    source: String,
}

fn mount_of(at: &Path) -> Result<Option<MountInfo>, String> {
    Ok(mounts()?
        .into_iter()
        .rev()
        .find(|m| Path::new(&m.mountpoint) == at))
}

fn mounts() -> Result<Vec<MountInfo>, String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    Ok(parse_mountinfo(&text))
}

/// proc(5): field 5 is the mount point; after ` - `, the type and source.
fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(" - ")?;
            let mountpoint = unescape(a.split(' ').nth(4)?);
            let mut b = b.split(' ');
            let fstype = b.next()?.to_string();
            let source = unescape(b.next()?);
            Some(MountInfo {
                mountpoint,
                fstype,
                source,
            })
        })
        .collect()
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Some(c) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(c);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process working in `dir` that runs python3's `code` (its ctypes
    /// and os reach prctl and setresuid, so this crate stays free of raw calls),
    /// started as `uid` (root if `None`), once it says it is ready.
    fn holder_in(dir: &Path, uid: Option<u32>, code: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("/usr/bin/python3");
        cmd.arg("-c")
            .arg(format!(
                "import ctypes, os, time\n{code}\nopen('ready', 'w').close()\ntime.sleep(120)"
            ))
            .current_dir(dir);
        if let Some(u) = uid {
            cmd.uid(u).gid(u);
        }
        let child = cmd
            .spawn()
            .expect("run /usr/bin/python3 (integration/install-deps installs it)");
        let ready = dir.join("ready");
        let t = std::time::Instant::now();
        while !ready.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the holder did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    #[test]
    fn the_owner_s_processes_are_known_by_their_real_uid_whatever_proc_pid_shows() {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::process::ExitStatusExt;
        if !nix::unistd::Uid::effective().is_root() {
            gpuq_test_skip::cannot_run(
                "nfs::tests::the_owner_s_processes_are_known_by_their_real_uid_whatever_proc_pid_shows",
                "needs root (starts processes as other users)",
            );
            return;
        }
        let (owner, other) = (61_091, 61_092);
        let d = tempfile::tempdir().unwrap();
        let mount = d.path().join("mnt");
        let dirs: Vec<PathBuf> = ["a", "b", "c"].iter().map(|n| mount.join(n)).collect();
        for (p, uid) in dirs.iter().zip([owner, owner, other]) {
            std::fs::create_dir_all(p).unwrap();
            std::os::unix::fs::chown(p, Some(uid), Some(uid)).unwrap();
        }
        // Modes set, not left to the umask: it is the process's, and
        // `mount_directories_are_made_reachable_whatever_the_umask` sets
        // 077 for a moment on another thread (a clean-clone run made
        // `mnt` 0700 so, and the owner's holder could not start in it).
        for p in [d.path(), mount.as_path()] {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        // The owner's process running a set-user-ID program (real uid the
        // owner's, effective root's, as `su` or `mount.nfs` would be).
        let mut setuid = holder_in(&dirs[0], None, &format!("os.setresuid({owner}, 0, 0)"));
        // The owner's process that made itself non-dumpable.
        let prctl = "assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0";
        let mut hidden = holder_in(&dirs[1], Some(owner), prctl);
        // Another user's, non-dumpable too.
        let mut theirs = holder_in(&dirs[2], Some(other), prctl);
        // What the old rule read, the owner of /proc/PID (the task's
        // effective uid; fs/proc/base.c, task_dump_owner): root for the
        // first, so it was never ended and the owner could hold the site.
        let shown = std::fs::metadata(format!("/proc/{}", setuid.id()))
            .unwrap()
            .uid();
        assert_eq!(shown, 0);
        assert_eq!(real_uid(setuid.id()), Some(owner));
        assert_eq!(real_uid(hidden.id()), Some(owner));
        let ended = end_owner_holders(std::slice::from_ref(&mount), owner).unwrap();
        assert_eq!(ended.len(), 2, "{ended:?}");
        for c in [&mut setuid, &mut hidden] {
            let id = c.id();
            assert!(
                ended.iter().any(|e| e.contains(&format!("pid {id} "))),
                "{id}: {ended:?}"
            );
            assert_eq!(c.wait().unwrap().signal(), Some(9));
        }
        // Another user's holder is not the owner's to end: it stays (the
        // unmount's failure names it).
        assert!(
            theirs.try_wait().unwrap().is_none(),
            "another user's process was ended"
        );
        let left = holders(std::slice::from_ref(&mount));
        assert!(
            left.iter().any(|h| h.pid == theirs.id() && h.uid == other),
            "{left:?}"
        );
        theirs.kill().unwrap();
        theirs.wait().unwrap();
    }

    #[test]
    fn only_a_host_where_no_user_can_send_from_below_1024_keeps_an_export_to_its_owner() {
        assert_eq!(privileged_ports_rule("1024\n"), Ok(()));
        assert_eq!(privileged_ports_rule("2000\n"), Ok(()));
        for low in ["0\n", "80\n", "1023\n"] {
            let e = privileged_ports_rule(low).unwrap_err();
            assert!(
                e.contains(&format!(
                    "net.ipv4.ip_unprivileged_port_start = {}",
                    low.trim()
                )),
                "{e}"
            );
            assert!(e.contains("set it to 1024"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(privileged_ports_rule("x")
            .unwrap_err()
            .contains("not a port number"));
        // This machine's own setting is read and judged (whatever it is).
        let here = std::fs::read_to_string(UNPRIVILEGED_PORT_START).unwrap();
        assert_eq!(privileged_ports_hold(), privileged_ports_rule(&here));
    }

    #[test]
    fn the_mount_data_names_the_server_and_never_a_host_name() {
        assert_eq!(
            options("10.0.0.11", 2049, "tcp", "10.0.0.2"),
            "vers=4.2,proto=tcp,port=2049,addr=10.0.0.11,clientaddr=10.0.0.2,hard,timeo=600,retrans=2,sec=sys"
        );
        assert_eq!(source("10.0.0.11", "nvme0n1"), "10.0.0.11:/nvme0n1");
        assert_eq!(source("fd00::11", "nvme0n1"), "[fd00::11]:/nvme0n1");
    }

    #[test]
    fn mountinfo_gives_the_point_the_type_and_the_source() {
        let t = "36 35 98:0 / /run/gpuq/stor/L1/da1-nvme0n1 rw,nosuid,nodev shared:1 - nfs4 10.0.0.11:/nvme0n1 rw,vers=4.2\n\
                 37 35 98:0 / /a\\040b rw - tmpfs tmpfs rw\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mountpoint, "/run/gpuq/stor/L1/da1-nvme0n1");
        assert_eq!(
            (m[0].fstype.as_str(), m[0].source.as_str()),
            ("nfs4", "10.0.0.11:/nvme0n1")
        );
        assert_eq!(m[1].mountpoint, "/a b");
    }

    #[test]
    fn the_job_gets_every_mount_and_each_node_s() {
        let m = |n: &str, v: &str| Mounted {
            node: n.into(),
            volume: v.into(),
            path: format!("/run/gpuq/stor/L1/{n}-{v}").into(),
        };
        let env = job_env(&[
            m("da1", "nvme0n1"),
            m("da-4", "nvme3n1"),
            m("da-4", "nvme3n2"),
        ]);
        let get = |k: &str| env.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        assert_eq!(get("GPUQ_STOR_KIND"), Some("nfsrdma"));
        assert_eq!(
            get("GPUQ_STOR_MOUNTS_DA_4"),
            Some("/run/gpuq/stor/L1/da-4-nvme3n1 /run/gpuq/stor/L1/da-4-nvme3n2")
        );
        assert_eq!(
            get("GPUQ_STOR_MOUNTS_DA1"),
            Some("/run/gpuq/stor/L1/da1-nvme0n1")
        );
    }

    #[test]
    fn mount_directories_are_made_reachable_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        // The umask is the process's: set for this one call.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        let p = d.path().join("run/gpuq/stor/L1");
        let r = make_root_dir(&p);
        nix::sys::stat::umask(old);
        r.unwrap();
        use std::os::unix::fs::PermissionsExt;
        for a in [
            d.path().join("run"),
            d.path().join("run/gpuq/stor"),
            p.clone(),
        ] {
            assert_eq!(
                std::fs::metadata(&a).unwrap().permissions().mode() & 0o777,
                0o755,
                "{}",
                a.display()
            );
        }
        // A parent others cannot search is refused, naming it.
        std::fs::set_permissions(d.path().join("run/gpuq"), PermissionsExt::from_mode(0o700))
            .unwrap();
        let e = make_root_dir(&p).unwrap_err();
        assert!(e.contains("run/gpuq (mode 700) is not searchable"), "{e}");
    }

    /// A mount of the lease's on this host for the test (tmpfs: the
    /// unmount goes by the path, whatever the type), and the processes
    /// started to hold it: all undone at drop, also when the test fails.
    struct Held {
        at: PathBuf,
        children: Vec<std::process::Child>,
    }

    impl Held {
        fn mount(at: PathBuf) -> Held {
            std::fs::create_dir_all(&at).unwrap();
            mount(
                Some("gpuq-test"),
                &at,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("size=1m"),
            )
            .expect("mount a tmpfs (the test runs as root)");
            std::fs::write(at.join("result"), b"x").unwrap();
            Held {
                at,
                children: Vec::new(),
            }
        }

        /// `sleep` as `uid`, its stdin a file of the mount.
        fn hold_as(&mut self, uid: u32) -> u32 {
            use std::os::unix::process::CommandExt;
            let f = std::fs::File::open(self.at.join("result")).unwrap();
            let c = std::process::Command::new("sleep")
                .arg("600")
                .uid(uid)
                .gid(uid)
                .stdin(f)
                .spawn()
                .unwrap();
            let pid = c.id();
            self.children.push(c);
            // Until the child has exec'd (its uid and name are sleep's)
            // and its fd is there to be seen.
            let t = std::time::Instant::now();
            while !(std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end() == "sleep")
                && holds(pid, std::slice::from_ref(&self.at)))
            {
                assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "child {pid} never held the mount"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            pid
        }
    }

    impl Drop for Held {
        fn drop(&mut self) {
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            if mount_of(&self.at).ok().flatten().is_some() {
                let _ = umount2(&self.at, MntFlags::MNT_DETACH);
            }
        }
    }

    #[test]
    fn the_owners_process_still_holding_a_mount_is_ended_and_anyone_elses_holds_the_unmount() {
        use std::os::unix::process::ExitStatusExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        make_lease_dir(d.path(), "L7", 61001).unwrap();
        let at = lease_dir(d.path(), "L7").join("da1-v1");
        let mut m = Held::mount(at.clone());
        // The owner's process outside the job: ended, then the mount goes.
        let pid = m.hold_as(61001);
        let said = unmount_lease(d.path(), "L7").unwrap();
        assert!(
            said.contains(&format!(
                "ended what still held them: pid {pid} (sleep, uid 61001)"
            )),
            "{said}"
        );
        let st = m.children[0].wait().unwrap();
        assert_eq!(st.signal(), Some(9), "{st:?}");
        assert_eq!(mount_of(&at).unwrap(), None);
        drop(m);

        // The directory and its owner record went with the last mount.
        assert!(!lease_dir(d.path(), "L7").exists());

        // Root's process and another user's (a daemon the owner handed a
        // descriptor to): left alone; the unmount fails (after its forced
        // try) naming both, and the mount is still there.
        make_lease_dir(d.path(), "L7", 61001).unwrap();
        let mut m = Held::mount(at.clone());
        let root = m.hold_as(0);
        let other = m.hold_as(61002);
        let e = unmount_lease(d.path(), "L7").unwrap_err();
        assert!(e.contains(&format!("pid {root} (sleep, uid 0)")), "{e}");
        assert!(
            e.contains(&format!("pid {other} (sleep, uid 61002)")),
            "{e}"
        );
        assert!(
            e.contains("never lazily") && e.contains("held open by"),
            "{e}"
        );
        assert!(mount_of(&at).unwrap().is_some());
        for c in &mut m.children {
            assert!(
                c.try_wait().unwrap().is_none(),
                "a process not the owner's was ended"
            );
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert!(unmount_lease(d.path(), "L7")
            .unwrap()
            .starts_with("unmounted "));
        assert_eq!(mount_of(&at).unwrap(), None);
    }

    #[test]
    fn a_lease_without_mounts_unmounts_nothing_and_says_so() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(
            unmount_lease(d.path(), "L9").unwrap(),
            "no mount of this lease on this host"
        );
    }
}
