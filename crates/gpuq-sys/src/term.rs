//! The caller's terminal, for `gpuq daos-exec`: its size, and raw mode for
//! as long as a session runs (restored on drop, also on an early return).

use nix::sys::termios::{self, SetArg, Termios};
use std::os::fd::BorrowedFd;

/// Rows and columns of the terminal on `fd`, if it is one.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    use std::os::fd::AsRawFd;
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `struct winsize` to the pointer, which
    // points to a live, properly aligned `libc::winsize` we own; `fd` is a
    // valid descriptor for the duration of the call (borrowed).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// Raw mode on a terminal until dropped.
#[derive(Debug)]
pub struct RawMode<'fd> {
    fd: BorrowedFd<'fd>,
    saved: Termios,
}

impl<'fd> RawMode<'fd> {
    pub fn enter(fd: BorrowedFd<'fd>) -> nix::Result<Self> {
        let saved = termios::tcgetattr(fd)?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(fd, SetArg::TCSANOW, &raw)?;
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode<'_> {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(self.fd, SetArg::TCSANOW, &self.saved);
    }
}
