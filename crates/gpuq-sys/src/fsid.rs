//! File system work done *as another user*: a thread of its own whose
//! filesystem identity (fsuid, fsgid, supplementary groups) is that user's,
//! so that the kernel itself decides every permission on the way — mode
//! bits, ACLs, LSMs, an NFS server's root squash — exactly as for that user.
//!
//! Linux keeps credentials per thread; it is glibc that makes `setuid` and
//! `setgroups` apply to every thread of a process (its "setxid" broadcast).
//! `setfsuid`/`setfsgid` are not broadcast, and here `setgroups` is made
//! as the raw system call, so only the new thread changes. It runs one
//! closure and ends, and its credentials end with it: the identity never
//! leaks to a thread that does anything else (which is why this is not run
//! on tokio's blocking pool, whose threads are reused). When the fsuid goes
//! from 0 to another UID the kernel also clears the thread's filesystem
//! capabilities (`CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`, `CAP_FOWNER`,
//! …: capabilities(7), "Effect of user ID changes on capabilities").

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// `openat(2)`: `name` relative to `dir` (or to the working directory when
/// `None`; an absolute `name` ignores `dir`). Mode 0 (this is not for
/// creating files). The descriptor comes back owned.
pub fn open_at(
    dir: Option<BorrowedFd<'_>>,
    name: &Path,
    flags: nix::fcntl::OFlag,
) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::openat(
        dir.map(|d| d.as_raw_fd()),
        name,
        flags,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: `fd` was just returned by openat for this call and nothing
    // else owns it; the OwnedFd closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Who to be: UID, primary GID, supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsIdentity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Take `who`'s filesystem identity on the calling thread (groups, then
/// GID, then UID) and check that the kernel took it.
fn become_on_this_thread(who: &FsIdentity) -> io::Result<()> {
    let groups: Vec<libc::gid_t> = who.groups.clone();
    // SAFETY: the raw setgroups system call (not glibc's wrapper, which
    // would apply it to every thread of the process) reads `groups.len()`
    // gids from a live buffer that outlives the call; the result is checked.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // setfsgid/setfsuid return the previous value and never fail visibly:
    // a second call with the same value returns the current one.
    nix::unistd::setfsgid(nix::unistd::Gid::from_raw(who.gid));
    if nix::unistd::setfsgid(nix::unistd::Gid::from_raw(who.gid)).as_raw() != who.gid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("setfsgid({}) did not take", who.gid),
        ));
    }
    nix::unistd::setfsuid(nix::unistd::Uid::from_raw(who.uid));
    if nix::unistd::setfsuid(nix::unistd::Uid::from_raw(who.uid)).as_raw() != who.uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("setfsuid({}) did not take", who.uid),
        ));
    }
    Ok(())
}

/// Run `f` as `who` (filesystem identity only) on a new thread, and wait
/// for it at most `deadline`. Needs `CAP_SETUID`/`CAP_SETGID` (root). On a
/// timeout the thread is left to finish on its own (a hung NFS server, say)
/// and whatever it returns is dropped; the caller gets `TimedOut`.
pub async fn run_as<T, F>(who: FsIdentity, deadline: Duration, f: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("gpuq-as-{}", who.uid))
        .spawn(move || {
            let r = become_on_this_thread(&who).map(|()| f());
            let _ = tx.send(r);
        })?;
    match tokio::time::timeout(deadline, rx).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(io::Error::other("the thread ended without an answer")),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {deadline:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn who(uid: u32) -> FsIdentity {
        FsIdentity {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    #[tokio::test]
    async fn the_thread_opens_as_the_user_and_the_process_stays_root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (it takes another user's identity)"
        );
        let d = tempfile::tempdir().unwrap();
        let private = d.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(private.join("f"), "x").unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = private.join("f");
        let denied = run_as(who(61_077), Duration::from_secs(10), {
            let p = p.clone();
            move || std::fs::read(&p)
        })
        .await
        .expect("the thread ran");
        assert_eq!(
            denied.unwrap_err().kind(),
            io::ErrorKind::PermissionDenied,
            "root's 0700 directory is closed to uid 61077"
        );
        // The same user through a supplementary group that the directory
        // allows: the groups are taken too.
        nix::unistd::chown(&private, None, Some(nix::unistd::Gid::from_raw(61_078))).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o750)).unwrap();
        let mut grouped = who(61_077);
        grouped.groups = vec![61_078];
        let ok = run_as(grouped, Duration::from_secs(10), {
            let p = p.clone();
            move || std::fs::read(&p)
        })
        .await
        .expect("the thread ran");
        assert_eq!(ok.unwrap(), b"x");
        // Nothing of it stayed with the process: this thread's fsuid is 0.
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert_eq!(uids.split_whitespace().nth(4), Some("0"), "{uids}");
    }
}
