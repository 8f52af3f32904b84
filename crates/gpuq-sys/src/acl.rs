//! A POSIX access ACL written as the kernel stores it
//! (`system.posix_acl_access`, `include/uapi/linux/posix_acl_xattr.h`),
//! through a descriptor: `--stor nvmeof` gives the job's owner a device
//! node by a named-user entry, which outlives what udev does to the node
//! on every change event (`chown root:disk`, `chmod 0660`: the chmod sets
//! the mask, which keeps `rw`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;
const NAME: &str = "system.posix_acl_access";

/// The xattr value of `u::P, user:uid:P, g::P, m::P, o::P` with the
/// permissions `perms` in that order (the kernel wants the entries sorted
/// by tag).
fn encode(uid: u32, perms: [u16; 5]) -> Vec<u8> {
    let mut v = VERSION.to_le_bytes().to_vec();
    let tags = [
        (USER_OBJ, UNDEFINED_ID),
        (USER, uid),
        (GROUP_OBJ, UNDEFINED_ID),
        (MASK, UNDEFINED_ID),
        (OTHER, UNDEFINED_ID),
    ];
    for ((tag, id), perm) in tags.into_iter().zip(perms) {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// The xattr value of `u::rw, user:uid:rw, g::rw, m::rw, o::---`.
pub fn owner_user_rw(uid: u32) -> Vec<u8> {
    encode(uid, [6, 6, 6, 6, 0])
}

/// The xattr value of `u::rwx, user:uid:-wx, g::---, m::-wx, o::---`: a
/// directory its owner (root) keeps, which only `uid` besides may pass
/// through and make or remove names in (never list) — the lease's agent
/// socket directory: the agent, run as the job's owner, makes its socket
/// there (DAOS makes it 0666: `daos_agent`'s `NewDomainSocketServer(...,
/// 0666)`), and no other user reaches it.
pub fn owner_and_user_write_search(uid: u32) -> Vec<u8> {
    encode(uid, [7, 3, 0, 3, 0])
}

/// The named users the access ACL of the file `fd` holds (by an
/// `O_PATH` descriptor too: read through `/proc/self/fd/N`, the
/// descriptor's own inode).
pub fn named_users(fd: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let name = CString::new(NAME)?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: `path` and `name` are NUL-terminated and live across the
    // call; `buf` is a writable buffer of the length passed.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(Vec::new()),
            _ => Err(e),
        };
    }
    let v = &buf[..n as usize];
    Ok(v.get(4..)
        .unwrap_or_default()
        .chunks_exact(8)
        .filter(|e| u16::from_le_bytes([e[0], e[1]]) == USER)
        .map(|e| u32::from_le_bytes([e[4], e[5], e[6], e[7]]))
        .collect())
}

/// Set the access ACL of the file `fd` (an `O_PATH` descriptor works) to
/// `value` ([`owner_user_rw`]).
pub fn set_access(fd: BorrowedFd<'_>, value: &[u8]) -> io::Result<()> {
    let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let name = CString::new(NAME)?;
    // SAFETY: `path` and `name` are NUL-terminated and live across the
    // call; `value` is a readable buffer of the length passed.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_named_user_entry_is_written_and_read_back_and_survives_chmod() {
        // A real file on this machine's file system (tmpfs or ext4 both
        // keep POSIX ACLs).
        let d = tempfile::tempdir_in(
            std::env::var_os("CARGO_TARGET_TMPDIR").unwrap_or_else(|| "/var/tmp".into()),
        )
        .unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let f = std::fs::File::open(&p).unwrap();
        set_access(f.as_fd(), &owner_user_rw(61001)).unwrap();
        assert_eq!(named_users(f.as_fd()).unwrap(), vec![61001]);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o660)).unwrap();
        assert_eq!(
            named_users(f.as_fd()).unwrap(),
            vec![61001],
            "chmod keeps the entry"
        );
    }
}
