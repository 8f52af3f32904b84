//! Process helpers: the peer's supplementary groups from a unix socket, a
//! pidfd that says when a process (not our child) exits, and the `pre_exec`
//! hook that places a child in its cgroup, drops it to the submitter's
//! identity and lets it keep no descriptor but 0, 1 and 2 across `exec`.

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

/// What a [`pidfd_of_listed`] found.
#[derive(Debug)]
pub enum Listed {
    /// The process, held: its PID can no longer come to name another.
    Open(OwnedFd),
    /// It exited after it was listed (`ESRCH`).
    Gone,
}

/// [`pidfd_open`] of a PID read from a listing (`/proc`, `scontrol
/// listpids`). A process that exited since is [`Listed::Gone`]; any other
/// failure is an error that says what it means — above all `ENOSYS`, a
/// kernel without `pidfd_open` (before 5.3): the caller refuses rather
/// than signal by PID, which could hit a process that reused it.
pub fn pidfd_of_listed(pid: u32) -> Result<Listed, String> {
    match pidfd_open(pid) {
        Ok(fd) => Ok(Listed::Open(fd)),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(Listed::Gone),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Err(format!(
            "cannot hold process {pid}: this kernel has no pidfd_open (Linux 5.3 or later needed); a process is never signalled by its PID alone"
        )),
        Err(e) => Err(format!("cannot hold process {pid}: pidfd_open: {e}")),
    }
}

/// SIGKILL the process a pidfd names (`pidfd_send_signal(2)`, Linux ≥ 5.1):
/// never another process, whatever became of its PID. `ESRCH` (it has
/// exited) is success: the process is gone either way.
pub fn pidfd_kill(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: pidfd_send_signal takes a descriptor, a signal number, a null
    // siginfo pointer (the kernel fills one in as kill(2) would) and flags,
    // all by value; no memory is shared with the kernel.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(err);
        }
    }
    Ok(())
}

/// Whether the process a pidfd names has exited (a pidfd polls readable
/// from its exit on, zombie included): asked after a check made by PID,
/// to know the PID still named that process all through the check.
pub fn pidfd_exited(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let n = poll(&mut fds, PollTimeout::ZERO).map_err(io::Error::from)?;
    Ok(n > 0)
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

/// The highest descriptor number the fallback of [`cloexec_above_stdio`]
/// looks at when the soft `RLIMIT_NOFILE` is unlimited (the kernel's default
/// `fs.nr_open` is 2^20).
const FALLBACK_FD_CEILING: u64 = 1 << 20;

/// Mark every descriptor above 2 close-on-exec, in the calling process.
///
/// Meant for the child between `fork` and `exec` (it is async-signal-safe:
/// two raw syscalls, no allocation). The descriptors stay usable until the
/// `exec` — std's own pipe that reports a failed `exec` keeps working — and
/// none of them reaches the new program: a descriptor the parent holds
/// without `O_CLOEXEC` (one it inherited from whoever started it, or one a
/// library such as NVML opened) never reaches a user's job.
///
/// `close_range(3, ~0, CLOSE_RANGE_CLOEXEC)` (Linux ≥ 5.11); on an older
/// kernel (EL8's 4.18 answers `ENOSYS`, 5.9/5.10 `EINVAL` for the flag)
/// `fcntl(FD_CLOEXEC)` on every number below the soft `RLIMIT_NOFILE`.
pub fn cloexec_above_stdio() -> io::Result<()> {
    // SAFETY: close_range takes three integers and no pointers; with
    // CLOSE_RANGE_CLOEXEC it only sets a flag on descriptors. The result is
    // checked below. Called as a raw syscall so that the binary does not
    // need glibc 2.34's wrapper (EL8 has glibc 2.28).
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EINVAL)) {
        return Err(e);
    }
    cloexec_by_fcntl()
}

/// [`cloexec_above_stdio`] for kernels without `close_range`'s
/// `CLOSE_RANGE_CLOEXEC`: one `fcntl` per possible descriptor number.
fn cloexec_by_fcntl() -> io::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let ceiling = if lim.rlim_cur == libc::RLIM_INFINITY {
        FALLBACK_FD_CEILING
    } else {
        lim.rlim_cur.min(FALLBACK_FD_CEILING)
    };
    for fd in 3..ceiling as libc::c_int {
        // SAFETY: fcntl(F_SETFD) on a number that may not be open: EBADF is
        // the only effect then, and it is ignored on purpose.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

/// Install `setup` as a `pre_exec` hook on `cmd`.
///
/// The hook only makes async-signal-safe syscalls on data prepared before
/// the fork (no allocation, no locks), as `fork` in a threaded process
/// requires. Do not combine with `Command::uid`/`gid`/`current_dir`: std runs
/// those *before* this hook, and its `uid` resets the supplementary groups.
///
/// Whatever `setup` says, the new program gets no descriptor but the 0, 1
/// and 2 that `cmd`'s stdio settings gave it ([`cloexec_above_stdio`]).
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
        // std has already put the child's stdio on 0, 1 and 2.
        cloexec_above_stdio()?;
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
    // (close_range or fcntl and getrlimit, write, setsid, setgroups,
    // setresgid, setresuid, chdir) on memory that
    // was allocated before the fork; it allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(hook);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_pidfd_says_its_process_exited_once_it_has_and_not_before() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let fd = match pidfd_of_listed(child.id()).unwrap() {
            Listed::Open(fd) => fd,
            Listed::Gone => panic!("a running child is gone"),
        };
        assert!(!pidfd_exited(fd.as_fd()).unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(pidfd_exited(fd.as_fd()).unwrap());
    }

    #[test]
    fn a_listed_process_is_held_gone_or_a_refusal_that_says_why() {
        let me = std::process::id();
        assert!(matches!(pidfd_of_listed(me), Ok(Listed::Open(_))));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        // Reaped: the PID names no process (unless reused at once, which
        // would be Open: either is right, never an error).
        assert!(pidfd_of_listed(pid).is_ok());
        let e = pidfd_of_listed(0).unwrap_err();
        assert!(e.contains("cannot hold process 0"), "{e}");
    }
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

    fn readable(fd: &OwnedFd, ms: u16) -> bool {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::from(ms)).expect("poll") == 1
    }

    #[test]
    fn pidfd_kill_ends_that_process_and_an_exited_one_is_no_error() {
        use std::os::fd::AsFd;
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("spawn sleep");
        let fd = pidfd_open(child.id()).expect("pidfd_open");
        pidfd_kill(fd.as_fd()).expect("pidfd_kill");
        let st = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGKILL));
        // Reaped: the pidfd names no process any more.
        pidfd_kill(fd.as_fd()).expect("pidfd_kill of an exited process");
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

    /// The descriptor numbers a child started with `install_child_setup`
    /// has open: the child is `sh`, its own child `ls` lists sh's table
    /// (`; true` keeps sh from exec'ing ls in its place).
    fn fds_of_child(setup: ChildSetup) -> Vec<String> {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "ls /proc/$$/fd; true"])
            .stdin(std::process::Stdio::null());
        install_child_setup(&mut cmd, setup);
        let out = cmd.output().expect("run sh");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_child_keeps_only_stdio_even_of_descriptors_opened_without_cloexec() {
        // A descriptor without O_CLOEXEC, as one inherited by the broker or
        // opened by a C library would be.
        // SAFETY: open with a static NUL-terminated path; checked.
        let raw = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
        assert!(raw > 2, "open /dev/null: {}", io::Error::last_os_error());
        // SAFETY: `raw` was just opened and is owned only here.
        let leaky = unsafe { OwnedFd::from_raw_fd(raw) };
        // Without the hook the child would see it (the control case).
        let mut plain = Command::new("sh");
        plain.args(["-c", "ls /proc/$$/fd; true"]);
        let out = plain.output().expect("run sh");
        let seen: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert!(seen.contains(&raw.to_string()), "control: {seen:?}");
        // With it, only 0, 1, 2 (the pipe std uses to report a failed exec
        // is close-on-exec and gone too).
        let fds = fds_of_child(ChildSetup {
            cgroup_procs: None,
            new_session: true,
            identity: None,
            cwd: None,
        });
        assert_eq!(fds, ["0", "1", "2"], "leaked: {fds:?}");
        drop(leaky);
    }

    #[test]
    fn the_fallback_for_old_kernels_marks_the_same_descriptors() {
        // SAFETY: open with a static NUL-terminated path; checked.
        let raw = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
        assert!(raw > 2, "open /dev/null: {}", io::Error::last_os_error());
        // SAFETY: `raw` was just opened and is owned only here.
        let leaky = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "ls /proc/$$/fd; true"])
            .stdin(std::process::Stdio::null());
        // SAFETY: the hook makes only getrlimit and fcntl calls, both
        // async-signal-safe, and allocates nothing.
        unsafe {
            cmd.pre_exec(cloexec_by_fcntl);
        }
        let out = cmd.output().expect("run sh");
        let fds: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(fds, ["0", "1", "2"], "leaked: {fds:?}");
        drop(leaky);
    }

    #[test]
    fn a_failed_exec_is_still_reported_after_the_cloexec_step() {
        let mut cmd = Command::new("/nonexistent/gpuq-no-such-program");
        install_child_setup(
            &mut cmd,
            ChildSetup {
                cgroup_procs: None,
                new_session: false,
                identity: None,
                cwd: None,
            },
        );
        let e = cmd.spawn().expect_err("spawn of a missing program");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
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
