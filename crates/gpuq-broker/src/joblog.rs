//! Job output files: `<log_root>/<UID>/gpuq-<id>.log`, owned by the user,
//! mode 0600, in a 0700 directory owned by the user.
//!
//! The broker writes into a directory the user controls, as root. So every
//! open uses `O_NOFOLLOW` and checks with `fstat` that it got a regular file
//! owned by that user with one link: a symlink or hard link planted in place
//! of a log can never make root append to another file.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{fchown, DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LogError {
    #[error("log directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("refusing log path {path}: {why}; ask the operator to move it aside")]
    Unsafe { path: PathBuf, why: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Make sure `log_root` is safe (root's, 0711, nothing above it writable by
/// others: see dirs.rs) and that the user's directory exists, is a real
/// directory owned by `uid`, mode 0700.
pub fn prepare_user_dir(log_root: &Path, uid: u32, gid: u32) -> Result<PathBuf, LogError> {
    crate::dirs::secure_log_root(log_root).map_err(|e| LogError::Unsafe {
        path: log_root.to_path_buf(),
        why: e.to_string(),
    })?;
    let dir = log_root.join(uid.to_string());
    match DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(&dir)(e)),
    }
    // Hand it over through a descriptor, never by name: nobody but root can
    // write log_root, and a name could still be a symlink planted before.
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&dir)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => LogError::Unsafe {
                path: dir.clone(),
                why: "not a directory".into(),
            },
            _ => io(&dir)(e),
        })?;
    let m = d.metadata().map_err(io(&dir))?;
    if m.uid() == 0 && uid != 0 {
        // Made just now by us: hand it to the user, exactly 0700 (mkdir's
        // mode is filtered by the umask).
        fchown(&d, Some(uid), Some(gid)).map_err(io(&dir))?;
        d.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(io(&dir))?;
    } else if m.uid() != uid {
        return Err(LogError::Unsafe {
            path: dir,
            why: format!("owned by uid {}, expected {uid}", m.uid()),
        });
    } else if uid == 0 {
        d.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(io(&dir))?;
    }
    Ok(dir)
}

fn check_file(path: &Path, f: &File, uid: u32) -> Result<(), LogError> {
    let m = f.metadata().map_err(io(path))?;
    let why = if !m.file_type().is_file() {
        Some("not a regular file".to_string())
    } else if m.uid() != uid {
        Some(format!("owned by uid {}, expected {uid}", m.uid()))
    } else if m.nlink() != 1 {
        Some(format!("has {} hard links", m.nlink()))
    } else {
        None
    };
    match why {
        Some(why) => Err(LogError::Unsafe {
            path: path.to_path_buf(),
            why,
        }),
        None => Ok(()),
    }
}

/// Create (or reopen) the job's log for appending, owned by `uid:gid`, 0600.
pub fn create(path: &Path, uid: u32, gid: u32) -> Result<File, LogError> {
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(io(path))?;
    let m = f.metadata().map_err(io(path))?;
    if m.uid() == 0 && uid != 0 && m.nlink() == 1 && m.file_type().is_file() {
        // We just created it as root: hand it to the user.
        fchown(&f, Some(uid), Some(gid)).map_err(io(path))?;
    }
    check_file(path, &f, uid)?;
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io(path))?;
    Ok(f)
}

/// Open an existing job log for reading (or appending), refusing anything but
/// a regular file of `uid`.
pub fn open_existing(path: &Path, uid: u32, append: bool) -> Result<File, LogError> {
    let f = OpenOptions::new()
        .read(!append)
        .append(append)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(io(path))?;
    check_file(path, &f, uid)?;
    Ok(f)
}

/// Append one broker line (`gpuq: <time> <msg>`) to a job's log.
pub fn note(path: &Path, uid: u32, msg: &str) {
    let line = format!(
        "gpuq: {} {msg}\n",
        gpuq_protocol::time::format_utc(crate::now())
    );
    let res = open_existing(path, uid, true)
        .and_then(|mut f| f.write_all(line.as_bytes()).map_err(io(path)));
    if let Err(e) = res {
        tracing::warn!("cannot write to job log: {e}");
    }
}
