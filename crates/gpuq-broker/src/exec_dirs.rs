//! The host directories a `daos-exec` client container gets, and how they
//! reach Podman without a window in which a user could swap them.
//!
//! The job's submit directory is a path the user chose (at submit time),
//! and root's Podman bind-mounts it: handed over as a path, a symlink put
//! in its place — before the call, or between any check and Podman's own
//! lookup — would mount any directory of the host. So no path of the
//! user's is ever handed to Podman:
//!
//! 1. The text is checked first ([`plain_abs_path`]): absolute, no `..`,
//!    no NUL, at most [`MAX_PATH`] bytes.
//! 2. It is opened from `/` one component at a time with
//!    `O_PATH|O_NOFOLLOW` ([`open_dir_nofollow`]): a symlink anywhere on the
//!    way is refused (none is followed, also not `/proc`'s magic links), and
//!    every component must be a directory. For the submit directory this
//!    walk runs **as the job's owner** ([`open_as_owner`] on a thread with
//!    the owner's filesystem identity, `gpuq_sys::fsid`), and the owner must
//!    also be able to list and enter the directory: the kernel decides, as
//!    it would for the user (mode bits, ACLs, root-squashing NFS), so nobody
//!    gets a mount of a directory they could not open themselves.
//! 3. The open descriptor — the directory checked, whatever happens to the
//!    path afterwards — is bind-mounted by the broker itself onto a staging
//!    directory in a root-only tree ([`Staged`]), `<run_dir>/client-mounts/
//!    <container>/…`, through `/proc/self/fd/N`. Podman gets that staging
//!    path: root's, no user can change any component of it.
//! 4. Once the container has started (runc has made its mounts: copies in
//!    the container's own mount namespace), the staging mounts are detached
//!    and their directories removed.
//!
//! Why not hand Podman `/proc/<broker>/fd/N` directly: runc makes the bind
//! mount inside the container's new mount namespace, and the kernel refuses
//! (`EINVAL`) to bind a mount that belongs to another namespace, which is
//! what that magic link names (tried: Podman 4.3.1, runc 1.1.5).
//!
//! The staging tree is never removed recursively (a leftover bind mount
//! there is a user's directory): each entry is unmounted, then `rmdir`ed.
//! Entries a crashed broker left behind are swept the same way at the first
//! staging of the next broker process.

use gpuq_sys::fsid::open_at;
use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{fstat, SFlag};
use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

/// The longest path accepted (`PATH_MAX` less the NUL).
pub const MAX_PATH: usize = 4095;

/// A user-given absolute path, checked as text and normalised (`.` and
/// repeated `/` dropped). The error says what is wrong with it.
pub fn plain_abs_path(s: &str) -> Result<PathBuf, &'static str> {
    if s.contains('\0') {
        return Err("contains a NUL byte");
    }
    if s.len() > MAX_PATH {
        return Err("is longer than 4095 bytes");
    }
    if !s.starts_with('/') {
        return Err("is not an absolute path");
    }
    let p = Path::new(s);
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err("contains '..' (give the directory itself)");
    }
    Ok(p.components().collect())
}

/// A path for a one-line message: as it is, or quoted and escaped when it
/// holds control characters (a newline must not split the line).
pub fn shown(s: &str) -> String {
    if s.chars().any(char::is_control) {
        format!("{s:?}")
    } else {
        s.to_string()
    }
}

/// What stopped a walk, and where.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("{} is a symbolic link (none is followed: use the real directory)", .0.display())]
    Symlink(PathBuf),
    #[error("{} is not a directory", .0.display())]
    NotDir(PathBuf),
    #[error("{}: {}", .0.display(), .1)]
    Io(PathBuf, #[source] io::Error),
}

fn errno(at: &Path, e: nix::Error) -> WalkError {
    io_at(at, io::Error::from(e))
}

fn io_at(at: &Path, e: io::Error) -> WalkError {
    WalkError::Io(at.to_path_buf(), e)
}

/// Open the directory `p` (absolute, without `..`) from `/`, one component
/// at a time with `O_PATH|O_NOFOLLOW`: no symlink on the way is followed,
/// and each component must be a directory. The permission checks are the
/// calling thread's.
pub fn open_dir_nofollow(p: &Path) -> Result<OwnedFd, WalkError> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root = Path::new("/");
    let mut cur = open_at(None, root, flags | OFlag::O_DIRECTORY).map_err(|e| io_at(root, e))?;
    let mut at = PathBuf::from("/");
    for c in p.components() {
        let name = match c {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => n,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(WalkError::Io(
                    p.to_path_buf(),
                    io::Error::new(io::ErrorKind::InvalidInput, "'..' in the path"),
                ))
            }
        };
        at.push(name);
        let next = open_at(Some(cur.as_fd()), Path::new(name), flags).map_err(|e| io_at(&at, e))?;
        // O_PATH|O_NOFOLLOW opens a symlink itself: look at what it is.
        let st = fstat(next.as_raw_fd()).map_err(|e| errno(&at, e))?;
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => cur = next,
            SFlag::S_IFLNK => return Err(WalkError::Symlink(at)),
            _ => return Err(WalkError::NotDir(at)),
        }
    }
    Ok(cur)
}

/// [`open_dir_nofollow`], and the caller must be able to list the
/// directory and enter it (`openat(fd, ".", O_RDONLY|O_DIRECTORY)` needs
/// both read and search permission), as `cd DIR && ls` would. Run it on a
/// thread that has the job owner's filesystem identity.
pub fn open_as_owner(p: &Path) -> Result<OwnedFd, WalkError> {
    let fd = open_dir_nofollow(p)?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    open_at(Some(fd.as_fd()), Path::new("."), flags).map_err(|e| io_at(p, e))?;
    Ok(fd)
}

/// The (device, inode) of an open file.
pub fn identity(fd: impl AsFd) -> io::Result<(u64, u64)> {
    let st = fstat(fd.as_fd().as_raw_fd())?;
    Ok((st.st_dev, st.st_ino))
}

/// Bind mounts of checked directories on root-only staging directories,
/// detached and removed on drop. See the module's documentation.
#[derive(Debug)]
pub struct Staged {
    dir: PathBuf,
    points: Vec<PathBuf>,
}

static SWEPT: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

fn mkdir_private(p: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new().mode(0o700).create(p)
}

/// Detach the mount at `p` if there is one, then remove the (empty)
/// directory. Never removes anything that is not empty.
fn unstage(p: &Path) -> io::Result<()> {
    match umount2(p, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) => {}
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    match std::fs::remove_dir(p) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Unmount and remove what a previous broker left under `base`.
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let dir = e.path();
        if let Ok(points) = std::fs::read_dir(&dir) {
            for p in points.flatten() {
                if let Err(err) = unstage(&p.path()) {
                    tracing::warn!(path = %p.path().display(), "left staging mount: {err}");
                }
            }
        }
        if let Err(err) = unstage(&dir) {
            tracing::warn!(path = %dir.display(), "left staging directory: {err}");
        }
    }
}

impl Staged {
    /// `base/name/`, root-only; `base` itself is made (0700) if missing and
    /// must be a root-owned directory closed to everyone else. The first
    /// call for a `base` in this process sweeps it.
    pub fn new(base: &Path, name: &str) -> io::Result<Staged> {
        match mkdir_private(base) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let m = std::fs::symlink_metadata(base)?;
        if !m.is_dir() || m.uid() != 0 || m.mode() & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} must be a directory of root's, closed to others (mode 0700)",
                    base.display()
                ),
            ));
        }
        {
            let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
            let set = swept.get_or_insert_with(HashSet::new);
            if set.insert(base.to_path_buf()) {
                sweep(base);
            }
        }
        let dir = base.join(name);
        mkdir_private(&dir)?;
        Ok(Staged {
            dir,
            points: Vec::new(),
        })
    }

    /// Bind-mount the directory `fd` is open on at `<dir>/<label>` (through
    /// `/proc/self/fd/N`: the directory itself, not any path to it) and
    /// return that path.
    pub fn bind(&mut self, fd: &OwnedFd, label: &str) -> io::Result<PathBuf> {
        let point = self.dir.join(label);
        mkdir_private(&point)?;
        self.points.push(point.clone());
        let src = format!("/proc/self/fd/{}", fd.as_raw_fd());
        mount(
            Some(src.as_str()),
            &point,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )?;
        Ok(point)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for p in self.points.iter().rev() {
            if let Err(e) = unstage(p) {
                tracing::warn!(path = %p.display(), "staging mount: {e}");
            }
        }
        if let Err(e) = unstage(&self.dir) {
            tracing::warn!(path = %self.dir.display(), "staging directory: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test needs root (it mounts, and opens as another user)"
        );
    }

    #[test]
    fn hostile_path_text_is_refused_with_the_reason() {
        assert_eq!(plain_abs_path("/a/./b//c").unwrap(), Path::new("/a/b/c"));
        assert_eq!(plain_abs_path("/").unwrap(), Path::new("/"));
        assert_eq!(plain_abs_path("a/b"), Err("is not an absolute path"));
        assert_eq!(plain_abs_path(""), Err("is not an absolute path"));
        assert_eq!(
            plain_abs_path("/a/../etc"),
            Err("contains '..' (give the directory itself)")
        );
        assert_eq!(plain_abs_path("/a/b/.."), plain_abs_path("/a/../etc"));
        assert_eq!(plain_abs_path("/a\0b"), Err("contains a NUL byte"));
        let long = format!("/{}", "x".repeat(MAX_PATH));
        assert_eq!(plain_abs_path(&long), Err("is longer than 4095 bytes"));
        assert!(plain_abs_path(&long[..MAX_PATH]).is_ok());
        assert_eq!(shown("/a b"), "/a b");
        assert_eq!(shown("/a\nb"), "\"/a\\nb\"");
    }

    #[test]
    fn the_walk_refuses_a_symlink_anywhere_and_a_file() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real/sub");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink(d.path().join("real"), d.path().join("link")).unwrap();
        std::fs::write(d.path().join("file"), "").unwrap();
        let fd = open_dir_nofollow(&real).unwrap();
        assert_eq!(
            identity(&fd).unwrap(),
            identity(std::fs::File::open(&real).unwrap()).unwrap()
        );
        // In the middle and at the end.
        for p in [d.path().join("link/sub"), d.path().join("link")] {
            match open_dir_nofollow(&p) {
                Err(WalkError::Symlink(at)) => assert_eq!(at, d.path().join("link")),
                other => panic!("{p:?}: {other:?}"),
            }
        }
        assert!(matches!(
            open_dir_nofollow(&d.path().join("file")),
            Err(WalkError::NotDir(_))
        ));
        assert!(matches!(
            open_dir_nofollow(&d.path().join("missing")),
            Err(WalkError::Io(_, e)) if e.kind() == io::ErrorKind::NotFound
        ));
        // /proc's magic links are symlinks too.
        assert!(matches!(
            open_dir_nofollow(Path::new("/proc/self/root")),
            Err(WalkError::Symlink(_))
        ));
    }

    #[tokio::test]
    async fn the_owner_must_be_able_to_open_the_directory() {
        root();
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mine = d.path().join("mine");
        let theirs = d.path().join("theirs");
        let closed = d.path().join("closed");
        for p in [&mine, &theirs, &closed] {
            std::fs::create_dir(p).unwrap();
        }
        std::os::unix::fs::chown(&mine, Some(61_101), Some(61_101)).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(61_102), Some(61_102)).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Root's 0700 directory with an open one inside: reachable by path
        // only for root.
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(closed.join("open")).unwrap();
        let who = gpuq_sys::fsid::FsIdentity {
            uid: 61_101,
            gid: 61_101,
            groups: vec![],
        };
        let try_as = |p: PathBuf| {
            gpuq_sys::fsid::run_as(who.clone(), std::time::Duration::from_secs(10), move || {
                open_as_owner(&p).map(|_| ())
            })
        };
        try_as(mine.clone()).await.unwrap().unwrap();
        for p in [theirs.clone(), closed.join("open")] {
            match try_as(p.clone()).await.unwrap() {
                Err(WalkError::Io(_, e)) => {
                    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{p:?}")
                }
                other => panic!("{p:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn staging_mounts_the_checked_directory_even_after_a_swap_and_leaves_nothing() {
        root();
        let d = tempfile::tempdir().unwrap();
        let work = d.path().join("work");
        let target = d.path().join("secret");
        std::fs::create_dir(&work).unwrap();
        std::fs::create_dir(&target).unwrap();
        std::fs::write(work.join("mine"), "mine").unwrap();
        std::fs::write(target.join("secret"), "secret").unwrap();
        let fd = open_dir_nofollow(&work).unwrap();
        // The user swaps the path for a symlink after the check.
        std::fs::rename(&work, d.path().join("work.orig")).unwrap();
        std::os::unix::fs::symlink(&target, &work).unwrap();
        let base = d.path().join("client-mounts");
        let mut s = Staged::new(&base, "c-1").unwrap();
        let point = s.bind(&fd, "submit").unwrap();
        assert_eq!(std::fs::read_to_string(point.join("mine")).unwrap(), "mine");
        assert!(!point.join("secret").exists());
        let m = std::fs::symlink_metadata(&base).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o700));
        drop(s);
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0);
        // Nothing was written through to either directory.
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 1);
        assert_eq!(
            std::fs::read_dir(d.path().join("work.orig"))
                .unwrap()
                .count(),
            1
        );
    }

    #[test]
    fn a_leftover_staging_mount_is_unmounted_never_emptied() {
        root();
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("keep"), "keep").unwrap();
        let base = d.path().join("client-mounts");
        // What a broker killed between staging and unstaging leaves.
        let old = base.join("gpuq-old-client-0");
        std::fs::create_dir_all(old.join("submit")).unwrap();
        let fd = open_dir_nofollow(&data).unwrap();
        mount(
            Some(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str()),
            &old.join("submit"),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
        let s = Staged::new(&base, "gpuq-new-client-0").unwrap();
        assert!(!old.exists(), "the old entry is swept");
        assert_eq!(std::fs::read_to_string(data.join("keep")).unwrap(), "keep");
        drop(s);
    }
}
