//! Block-device ioctls (BLKDISCARD, BLKGETSIZE64). Owned by the block-device work.
//!
//! These are the only raw calls the wipe path makes. Everything that std or
//! nix already offers safely (`O_EXCL` opens, `flock`) is done there, not here.
//!
//! Request numbers come from `include/uapi/linux/fs.h`:
//! `BLKGETSIZE64 = _IOR(0x12, 114, size_t)` and `BLKDISCARD = _IO(0x12, 119)`.
//! BLKDISCARD is declared without a size but takes a pointer to
//! `uint64_t range[2]` (offset, length), hence nix's `_bad` macro form.

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::errno::Errno;

mod ioctls {
    nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
    nix::ioctl_write_ptr_bad!(blkdiscard, nix::request_code_none!(0x12, 119), [u64; 2]);
    nix::ioctl_read_bad!(blkroget, nix::request_code_none!(0x12, 94), libc::c_int);
    // LOOP_CTL_REMOVE from include/uapi/linux/loop.h; takes the device number
    // as the integer argument.
    nix::ioctl_write_int_bad!(loop_ctl_remove, 0x4C81);
}

/// Size of the block device in bytes (`BLKGETSIZE64`).
pub fn blk_getsize64(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    let mut size: u64 = 0;
    // SAFETY: `fd` is a valid open descriptor for the lifetime of the borrow
    // and `size` is a live, properly aligned u64 the kernel writes into.
    unsafe { ioctls::blkgetsize64(fd.as_raw_fd(), &mut size) }?;
    Ok(size)
}

/// Whether the kernel considers the device read-only (`BLKROGET`).
pub fn blk_roget(fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    let mut ro: libc::c_int = 0;
    // SAFETY: `fd` is a valid open descriptor and `ro` is a live c_int the
    // kernel writes into.
    unsafe { ioctls::blkroget(fd.as_raw_fd(), &mut ro) }?;
    Ok(ro != 0)
}

/// Discard `len` bytes starting at `offset` (`BLKDISCARD`).
///
/// Both values must be multiples of the logical block size; the kernel
/// returns `EINVAL` otherwise and `EOPNOTSUPP` when the device has no
/// discard support. Nothing is retried or emulated here.
pub fn blk_discard(fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), Errno> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: `fd` is a valid open descriptor and `range` is a live
    // `[u64; 2]` that the kernel only reads for the duration of the call.
    unsafe { ioctls::blkdiscard(fd.as_raw_fd(), &range) }?;
    Ok(())
}

/// Remove loop device `/dev/loop<index>` through `/dev/loop-control`
/// (`LOOP_CTL_REMOVE`). The device must already be detached.
///
/// Used by tests to retire a loop device whose discard support they turned
/// off: that change cannot be undone on the device.
pub fn loop_ctl_remove(loop_control: BorrowedFd<'_>, index: u32) -> Result<(), Errno> {
    let index = libc::c_int::try_from(index).map_err(|_| Errno::EINVAL)?;
    // SAFETY: `loop_control` is a valid descriptor; the argument is a plain
    // integer, no memory is shared with the kernel.
    unsafe { ioctls::loop_ctl_remove(loop_control.as_raw_fd(), index) }?;
    Ok(())
}

/// Ask whether a POSIX write lock on the whole file could be taken
/// (`fcntl(F_GETLK)`), without taking it. Returns the PID of a conflicting
/// holder, or `None` when nobody holds a conflicting lock.
///
/// SPDK marks a PCI function it drives by holding such a lock on
/// `/var/tmp/spdk_pci_lock_<BDF>`.
pub fn posix_lock_holder(fd: BorrowedFd<'_>) -> Result<Option<libc::pid_t>, Errno> {
    // SAFETY: `libc::flock` is a plain C struct for which all-zero bytes is a
    // valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 0;
    // SAFETY: `fd` is a valid descriptor and `fl` is a live `struct flock`
    // the kernel reads and overwrites during the call.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETLK, &mut fl) };
    Errno::result(rc)?;
    if fl.l_type == libc::F_UNLCK as libc::c_short {
        Ok(None)
    } else {
        Ok(Some(fl.l_pid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn getsize64_on_a_regular_file_is_rejected_by_the_kernel() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(blk_getsize64(f.as_fd()).is_err());
    }

    #[test]
    fn discard_on_a_regular_file_is_rejected_by_the_kernel() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(blk_discard(f.as_fd(), 0, 4096).is_err());
    }

    #[test]
    fn unlocked_file_has_no_posix_lock_holder() {
        let dir = std::env::temp_dir().join(format!("gpuq-sys-lk-{}", std::process::id()));
        std::fs::write(&dir, b"x").unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dir)
            .unwrap();
        assert_eq!(posix_lock_holder(f.as_fd()).unwrap(), None);
        std::fs::remove_file(&dir).unwrap();
    }
}
