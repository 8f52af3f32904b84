//! The broker's own directories, and who may see into them.
//!
//! - `state_dir` holds every user's submitted argv, working directory and
//!   environment (`queue.db` and its `-wal`/`-shm`, which SQLite writes in
//!   clear), the lease records and the direct runner's job specs. Root only:
//!   the directory 0700, its files 0600.
//! - `log_root` holds one 0700 directory per user, owned by that user.
//!   Others may pass through it (0711) to reach their own, never list it or
//!   write it.
//!
//! At start-up the broker makes each of them (and any missing parents, 0755)
//! or checks the one it finds. A directory — or any directory above it —
//! that someone other than root owns or may write is refused, sshd
//! `StrictModes` style: whoever can write there can swap what the broker
//! opens for a symlink, or plant files it will trust. A root-owned directory
//! that is merely readable by others (what gpuq before 0.2 made) is narrowed
//! to the mode above, and so are the files directly inside `state_dir`; the
//! broker says so in its log.
//!
//! The process umask is 077 ([`set_umask`]), so whatever the broker creates
//! without an explicit mode is root's alone; what users must read (the job
//! log, the DAOS lease's client files) is given its mode explicitly.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum DirError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {path}: {why}; {hint}")]
    Unsafe {
        what: &'static str,
        path: PathBuf,
        why: String,
        hint: String,
    },
}

/// The mode `state_dir` is kept at.
pub const STATE_DIR_MODE: u32 = 0o700;
/// The mode `log_root` is kept at: users pass through to their own directory.
pub const LOG_ROOT_MODE: u32 = 0o711;

/// Set the process umask to 077 and return the one it replaces.
pub fn set_umask() -> u32 {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077)).bits()
}

/// Make or check `state_dir` (see the module docs), then narrow the files
/// directly in it to 0600.
pub fn secure_state_dir(path: &Path) -> Result<(), DirError> {
    const WHAT: &str = "broker.state_dir";
    let dir = secure_dir(WHAT, path, STATE_DIR_MODE)?;
    // The directory is root's and 0700 from here on: nobody else can swap
    // what is in it, so its entries can be handled by name.
    let entries = std::fs::read_dir(path).map_err(io(WHAT, path))?;
    for entry in entries {
        let entry = entry.map_err(io(WHAT, path))?;
        let p = entry.path();
        let m = std::fs::symlink_metadata(&p).map_err(io(WHAT, &p))?;
        if m.file_type().is_file() && m.mode() & 0o077 != 0 {
            tracing::warn!(
                path = %p.display(),
                mode = format!("{:o}", m.mode() & 0o7777),
                "narrowing a state file to 0600 (it may hold users' submitted environments)"
            );
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                .map_err(io(WHAT, &p))?;
        }
    }
    drop(dir);
    Ok(())
}

/// Make or check `log_root` (see the module docs).
pub fn secure_log_root(path: &Path) -> Result<(), DirError> {
    secure_dir("broker.log_root", path, LOG_ROOT_MODE).map(drop)
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DirError + 'a {
    move |source| DirError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Check `state_dir` and `log_root` as far as they exist, making nothing:
/// run before [`secure_state_dir`] / [`secure_log_root`] so that a refusal
/// of either leaves no trace of the other.
pub fn preflight(state_dir: &Path, log_root: &Path) -> Result<(), DirError> {
    for (what, p) in [
        ("broker.state_dir", state_dir),
        ("broker.log_root", log_root),
    ] {
        let unsafe_err = |at: &Path, why: String| unsafe_dir(what, at, why);
        if !p.is_absolute() {
            return Err(unsafe_err(p, "not an absolute path".into()));
        }
        let mut cur = PathBuf::from("/");
        check_ancestor(&cur).map_err(|why| unsafe_err(&cur, why))?;
        for c in p.components().skip(1) {
            cur.push(c);
            match std::fs::symlink_metadata(&cur) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => return Err(io(what, &cur)(e)),
                Ok(m) if cur == p => {
                    if m.file_type().is_symlink() || !m.is_dir() {
                        return Err(unsafe_err(
                            p,
                            "not a directory (symlinks are refused)".into(),
                        ));
                    }
                    check_own(&m).map_err(|why| unsafe_err(p, why))?;
                }
                Ok(_) => check_ancestor(&cur).map_err(|why| unsafe_err(&cur, why))?,
            }
        }
    }
    Ok(())
}

fn unsafe_dir(what: &'static str, p: &Path, why: String) -> DirError {
    DirError::Unsafe {
        what,
        path: p.to_path_buf(),
        why,
        hint: format!(
            "check what is in it, then make it root's and not writable by others \
             (chown root:root; chmod go-w), or set {what} elsewhere"
        ),
    }
}

/// Our directory itself: root's, and not writable by group or others.
fn check_own(m: &std::fs::Metadata) -> Result<(), String> {
    if m.uid() != 0 {
        return Err(format!("owned by uid {}, not root", m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "mode {:o} lets group or others write it",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Make `path` (missing parents 0755, itself `mode`) or check it; return it
/// open. Every directory above it must be root's and not writable by others
/// (a sticky one such as /tmp is accepted); the directory itself must be a
/// real directory (not a symlink) owned by root and not writable by others.
fn secure_dir(what: &'static str, path: &Path, mode: u32) -> Result<File, DirError> {
    let unsafe_err = |p: &Path, why: String| unsafe_dir(what, p, why);
    if !path.is_absolute() {
        return Err(unsafe_err(path, "not an absolute path".into()));
    }
    // Walk down from `/`: check each existing ancestor, make the missing ones.
    let mut cur = PathBuf::from("/");
    let parents: Vec<_> = path
        .parent()
        .map(|p| p.components().skip(1).collect())
        .unwrap_or_default();
    check_ancestor(&cur).map_err(|why| unsafe_err(&cur, why))?;
    for c in parents {
        cur.push(c);
        make_if_missing(&cur, 0o755).map_err(io(what, &cur))?;
        check_ancestor(&cur).map_err(|why| unsafe_err(&cur, why))?;
    }
    let created = make_if_missing(path, mode).map_err(io(what, path))?;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
                unsafe_err(path, "not a directory (symlinks are refused)".into())
            } else {
                io(what, path)(e)
            }
        })?;
    let m = dir.metadata().map_err(io(what, path))?;
    check_own(&m).map_err(|why| unsafe_err(path, why))?;
    if m.mode() & 0o7777 != mode {
        if !created {
            tracing::warn!(
                path = %path.display(),
                from = format!("{:o}", m.mode() & 0o7777),
                to = format!("{mode:o}"),
                "narrowing {what}"
            );
        }
        dir.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io(what, path))?;
    }
    Ok(dir)
}

/// A directory above ours: root's, and not writable by others unless sticky.
fn check_ancestor(p: &Path) -> Result<(), String> {
    // Following a symlink here is fine: whoever could change the link could
    // change the directory it sits in, and that one was checked already.
    let m = std::fs::metadata(p).map_err(|e| e.to_string())?;
    if !m.is_dir() {
        return Err("not a directory".into());
    }
    if m.uid() != 0 {
        return Err(format!(
            "a directory above it is owned by uid {}, not root",
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
        return Err(format!(
            "a directory above it (mode {:o}) is writable by group or others",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// mkdir with exactly `mode` (not filtered by the umask); `Ok(true)` if made.
fn make_if_missing(p: &Path, mode: u32) -> std::io::Result<bool> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(mode).create(p) {
        Ok(()) => {
            // Made just now by us, in a directory only root can write.
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn tmp() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("gpuq-dirs-")
            .tempdir()
            .unwrap()
    }

    #[test]
    fn a_missing_state_dir_is_made_0700_with_parents_0755() {
        if !nix::unistd::Uid::effective().is_root() {
            panic!("this test needs root (it checks root ownership); run it through tests/run");
        }
        let t = tmp();
        let p = t.path().join("a/b/state");
        secure_state_dir(&p).unwrap();
        assert_eq!(mode(&p), 0o700);
        assert_eq!(mode(&t.path().join("a/b")), 0o755);
        let l = t.path().join("logs");
        secure_log_root(&l).unwrap();
        assert_eq!(mode(&l), 0o711);
    }

    #[test]
    fn an_old_readable_state_dir_and_its_files_are_narrowed() {
        if !nix::unistd::Uid::effective().is_root() {
            panic!("this test needs root (it checks root ownership); run it through tests/run");
        }
        let t = tmp();
        let p = t.path().join("state");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        for f in ["queue.db", "queue.db-wal", "queue.db-shm"] {
            std::fs::write(p.join(f), "x").unwrap();
            std::fs::set_permissions(p.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        secure_state_dir(&p).unwrap();
        assert_eq!(mode(&p), 0o700);
        for f in ["queue.db", "queue.db-wal", "queue.db-shm"] {
            assert_eq!(mode(&p.join(f)), 0o600, "{f}");
        }
    }

    #[test]
    fn writable_by_others_owned_by_others_or_a_symlink_is_refused_and_left_alone() {
        if !nix::unistd::Uid::effective().is_root() {
            panic!("this test needs root (it checks root ownership); run it through tests/run");
        }
        let t = tmp();
        // World-writable (not sticky).
        let w = t.path().join("w");
        std::fs::create_dir(&w).unwrap();
        std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = secure_state_dir(&w).unwrap_err().to_string();
        assert!(e.contains("lets group or others write"), "{e}");
        assert_eq!(mode(&w), 0o777, "a refusal changes nothing");
        // Below a world-writable parent: refused before anything is made.
        let below = w.join("state");
        let e = secure_state_dir(&below).unwrap_err().to_string();
        assert!(e.contains("writable by group or others"), "{e}");
        assert!(
            !below.exists(),
            "nothing made below a parent others may write"
        );
        // Owned by another user.
        let o = t.path().join("o");
        std::fs::create_dir(&o).unwrap();
        std::os::unix::fs::chown(&o, Some(61001), Some(61001)).unwrap();
        let e = secure_log_root(&o).unwrap_err().to_string();
        assert!(e.contains("owned by uid 61001"), "{e}");
        // A symlink to a root directory.
        let target = t.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let l = t.path().join("link");
        std::os::unix::fs::symlink(&target, &l).unwrap();
        let e = secure_state_dir(&l).unwrap_err().to_string();
        assert!(e.contains("symlinks are refused"), "{e}");
        assert_eq!(mode(&target), 0o755, "the link's target is untouched");
    }
}
