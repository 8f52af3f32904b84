//! Durable small-file writes, the one way gpuq writes a record (job exit
//! status, maintenance lock, lease records, node lease, audit files, rendered
//! configs): a temp file next to the target (unique per process and call,
//! created exclusively and without following symlinks), fsync, rename over
//! the target, fsync the directory. After a crash the target holds the old
//! or the new content, never a mix; two concurrent writers of the same path
//! never share a temp file.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Replace `path` with `bytes` (file mode `mode`) atomically and durably.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = parent(path);
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{} has no file name", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        // Exactly `mode`: open's is filtered by the umask (the broker's is 077).
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Remove `path` durably. `Ok(false)` when it did not exist.
pub fn remove(path: &Path) -> std::io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_dir(parent(path)).map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// fsync a directory, so that renames and removals in it are on disk.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_with_the_mode_and_leaves_no_temp_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rec.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn concurrent_writers_of_one_path_do_not_collide() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("rec");
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(p, &[i; 64], 0o644).unwrap();
                    }
                });
            }
        });
        let v = std::fs::read(&p).unwrap();
        assert_eq!(v.len(), 64);
        assert!(v.iter().all(|b| *b == v[0]), "a torn write");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn remove_says_whether_there_was_something() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        assert!(!remove(&p).unwrap());
        std::fs::write(&p, "x").unwrap();
        assert!(remove(&p).unwrap());
        assert!(!p.exists());
    }
}
