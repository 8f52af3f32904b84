//! Process helpers: the peer's supplementary groups from a unix socket, a
//! pidfd that says when a process (not our child) exits, and the `pre_exec`
//! hook that places a child in its cgroup and drops it to the submitter's
//! identity before `exec`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The supplementary groups of the process at the other end of a connected
/// unix socket, as the kernel recorded them at `connect()` (`SO_PEERGROUPS`,
/// Linux ≥ 4.13). Unlike reading `/proc/<pid>/status`, this cannot race with
/// the peer exiting and its PID being reused.
pub fn peer_groups(fd: RawFd) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is a live, writable buffer of exactly `len` bytes;
        // the kernel writes at most `len` bytes and updates `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        // ERANGE: the buffer was too small and `len` now holds the size needed.
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 65_536 {
            groups.resize(n, 0);
            continue;
        }
        return Err(err);
    }
}

/// A pidfd for the process `pid` (`pidfd_open(2)`, Linux ≥ 5.3). It turns
/// readable (poll, epoll) when that process exits, also when it is not our
/// child, and unlike the PID it never comes to name another process. Who
/// got the PID from elsewhere must check afterwards that it is still the
/// process meant: the PID may have been reused before the open.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: pidfd_open takes a PID and flags by value and returns a new
    // file descriptor or -1; no memory is shared with the kernel.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: `fd` was just returned by the kernel for us and nothing else
    // owns it; the OwnedFd closes it once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits, on the tokio runtime, for a process to exit: a [`pidfd_open`]
/// registered with the runtime's reactor.
#[derive(Debug)]
pub struct ProcessExit(tokio::io::unix::AsyncFd<OwnedFd>);

impl ProcessExit {
    /// Watch `pid` (call within a tokio runtime). The same caveat as
    /// [`pidfd_open`]: check afterwards that the PID still names the
    /// process meant.
    pub fn watch(pid: u32) -> io::Result<Self> {
        let fd = pidfd_open(pid)?;
        // SAFETY: an `OwnedFd` owns its descriptor: `as_raw_fd` returns the
        // same open descriptor until the value is dropped, which happens only
        // when the `AsyncFd` (having deregistered it) drops or gives it back.
        let fd = unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(ProcessExit(fd))
    }

    /// Resolves once the process has exited (it may still be a zombie).
    /// An error from the reactor is returned as is.
    pub async fn exited(&self) -> io::Result<()> {
        self.0.readable().await.map(|_| ())
    }
}

/// What the child becomes between `fork` and `exec`.
#[derive(Debug)]
pub struct ChildSetup {
    /// An open `cgroup.procs` of the job's cgroup (v2). The child writes "0"
    /// to it, which moves the writing process itself: it is in the cgroup
    /// before it can run or fork anything.
    pub cgroup_procs: Option<OwnedFd>,
    /// Start a new session (and process group), detached from the broker's.
    pub new_session: bool,
    /// Drop to this identity: (uid, primary gid, supplementary groups).
    pub identity: Option<(u32, u32, Vec<u32>)>,
    /// Change to this directory *after* dropping privileges, so that the
    /// user's own permissions decide whether it may.
    pub cwd: Option<CString>,
}

/// Install `setup` as a `pre_exec` hook on `cmd`.
///
/// The hook only makes async-signal-safe syscalls on data prepared before
/// the fork (no allocation, no locks), as `fork` in a threaded process
/// requires. Do not combine with `Command::uid`/`gid`/`current_dir`: std runs
/// those *before* this hook, and its `uid` resets the supplementary groups.
pub fn install_child_setup(cmd: &mut Command, setup: ChildSetup) {
    let ChildSetup {
        cgroup_procs,
        new_session,
        identity,
        cwd,
    } = setup;
    let cgroup_fd = cgroup_procs;
    let ident: Option<(libc::uid_t, libc::gid_t, Vec<libc::gid_t>)> = identity;
    let hook = move || -> io::Result<()> {
        if let Some(fd) = &cgroup_fd {
            let zero = b"0";
            // SAFETY: writes 1 byte from a static buffer to an fd we own.
            let n = unsafe { libc::write(fd.as_raw_fd(), zero.as_ptr().cast(), zero.len()) };
            if n != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        if new_session {
            // SAFETY: setsid takes no arguments; the result is checked.
            if unsafe { libc::setsid() } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some((uid, gid, groups)) = &ident {
            // Order matters: groups and gid while we still are root, uid last.
            // SAFETY: `groups` outlives the call; its length is passed with it.
            if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: plain integer argument; result checked.
            if unsafe { libc::setresgid(*gid, *gid, *gid) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: plain integer argument; result checked.
            if unsafe { libc::setresuid(*uid, *uid, *uid) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(dir) = &cwd {
            // SAFETY: `dir` is a valid NUL-terminated string owned by the closure.
            if unsafe { libc::chdir(dir.as_ptr()) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook above only performs async-signal-safe syscalls
    // (write, setsid, setgroups, setresgid, setresuid, chdir) on memory that
    // was allocated before the fork; it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(hook);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;

    fn readable(fd: &OwnedFd, ms: u16) -> bool {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(ms)).expect("poll") == 1
    }

    #[test]
    fn a_pidfd_turns_readable_when_its_process_exits() {
        let mut child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let fd = pidfd_open(child.id()).expect("pidfd_open");
        assert!(!readable(&fd, 50), "readable while the process runs");
        child.kill().expect("kill");
        assert!(readable(&fd, 5_000), "not readable after the exit");
        child.wait().expect("reap");
    }

    #[tokio::test]
    async fn process_exit_resolves_when_the_process_exits_and_not_before() {
        let mut child = Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let exit = ProcessExit::watch(child.id()).expect("watch");
        let early =
            tokio::time::timeout(std::time::Duration::from_millis(100), exit.exited()).await;
        assert!(early.is_err(), "resolved while the process runs");
        child.kill().expect("kill");
        tokio::time::timeout(std::time::Duration::from_secs(5), exit.exited())
            .await
            .expect("not resolved after the exit")
            .expect("reactor");
        child.wait().expect("reap");
    }

    #[test]
    fn no_process_or_an_impossible_pid_is_an_error() {
        // PIDs above pid_max (at most 2^22) never exist.
        let e = pidfd_open(i32::MAX as u32).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
        assert_eq!(
            pidfd_open(0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            pidfd_open(u32::MAX).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
