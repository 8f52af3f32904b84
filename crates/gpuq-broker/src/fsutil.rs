//! Durable small-file writes: temp file in the same directory, fsync,
//! rename over the target, fsync the directory. After a crash the target is
//! either the old or the new content, never a mix.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub fn atomic_write(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
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

/// Remove a file durably (the directory entry's removal is fsynced).
pub fn durable_remove(path: &Path) -> std::io::Result<()> {
    std::fs::remove_file(path)?;
    sync_dir(path.parent().unwrap_or(Path::new("/")))
}

pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}
