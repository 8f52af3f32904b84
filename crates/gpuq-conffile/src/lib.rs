//! Root's configuration files (`broker.toml`, `node.toml`).
//!
//! Whoever can write such a file decides what runs as root — which devices
//! a node may discard, which images run privileged — so it is read only if
//! root alone could have written it: a regular file (opened with
//! `O_NOFOLLOW`, checked with `fstat` on the descriptor it is then read
//! from, so no swap between check and read), owned by root, not writable
//! by group or others, every directory on its way from `/` owned by root
//! and not writable by group or others (a sticky directory such as `/tmp`
//! is accepted: others cannot replace an entry of root's there), and no
//! symbolic link on the way. sshd's `StrictModes`, for a daemon's own
//! configuration, walked by descriptor.
//!
//! Then TOML, with the parser's message kept on one line (it names the key
//! and the line), as every error of ours is.

use gpuq_sys::fsid::open_at;
use nix::fcntl::OFlag;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfFileError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path} may have been written by someone other than root: {why}\nhint: `chown root:root {path} && chmod go-w {path}` (and the same for its directory)")]
    Unsafe { path: PathBuf, why: String },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

/// The text of `path`, if root alone could have written it (see the crate
/// documentation); otherwise why not, naming the file.
///
/// The path is walked from `/` one component at a time, each directory
/// opened relative to the one before (`O_PATH | O_NOFOLLOW`) and checked
/// on that descriptor: root's, not writable by group or others unless
/// sticky. A symbolic link anywhere on the way is refused, and a `..`
/// goes back to the directory checked before it (issue #31: the
/// parent alone was checked, by a path that followed links, so whoever
/// could write an ancestor could put another directory under the name).
/// The file is then opened relative to its checked directory.
pub fn read_trusted(path: &Path) -> Result<String, ConfFileError> {
    let read_err = |p: &Path| {
        let p = p.to_path_buf();
        move |source| ConfFileError::Read { path: p, source }
    };
    let not_roots = |why: String| ConfFileError::Unsafe {
        path: path.to_path_buf(),
        why,
    };
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(read_err(path))?.join(path)
    };
    let mut names = Vec::new();
    for c in abs.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => names.push(Some(n)),
            // `..` goes back to the directory before, already checked
            // (no link is followed on the way, so that is the kernel's
            // `..` too).
            Component::ParentDir => names.push(None),
            Component::Prefix(_) => return Err(not_roots("not a Unix path".into())),
        }
    }
    let Some(Some(file_name)) = names.pop() else {
        return Err(not_roots("not a regular file".into()));
    };
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root = open_at(None, Path::new("/"), dir_flags).map_err(read_err(Path::new("/")))?;
    trusted_dir(&root, Path::new("/")).map_err(not_roots)?;
    // The checked directories from `/` down, each with its path.
    let mut walked: Vec<(OwnedFd, PathBuf)> = vec![(root, PathBuf::from("/"))];
    for n in names {
        let Some(n) = n else {
            if walked.len() > 1 {
                walked.pop();
            }
            continue;
        };
        let (dir, at) = walked.last().expect("/ is never popped");
        let at = at.join(n);
        let next = open_at(Some(dir.as_fd()), Path::new(n), dir_flags).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => not_roots(format!(
                    "{} on its way is a symbolic link or not a directory (refused: name the file by its real path)",
                    at.display()
                )),
                _ => read_err(&at)(e),
            }
        })?;
        trusted_dir(&next, &at).map_err(not_roots)?;
        walked.push((next, at));
    }
    let (dir, _) = walked.last().expect("/ is never popped");
    let mut f = std::fs::File::from(
        open_at(
            Some(dir.as_fd()),
            Path::new(file_name),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        )
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                not_roots("it is a symbolic link (refused: the file itself must be root's)".into())
            } else {
                read_err(path)(e)
            }
        })?,
    );
    let meta = f.metadata().map_err(read_err(path))?;
    if !meta.file_type().is_file() {
        return Err(not_roots("not a regular file".into()));
    }
    if meta.uid() != 0 {
        return Err(not_roots(format!("owned by uid {}, not root", meta.uid())));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(not_roots(format!(
            "mode {:o} lets group or others write it",
            meta.mode() & 0o7777
        )));
    }
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(read_err(path))?;
    Ok(text)
}

/// A directory on a root file's way, checked on its descriptor: root's,
/// and not writable by group or others unless sticky (as `/tmp`: others
/// cannot replace an entry of root's there).
fn trusted_dir(dir: &OwnedFd, at: &Path) -> Result<(), String> {
    let st = nix::sys::stat::fstat(dir.as_raw_fd())
        .map_err(|e| format!("cannot inspect its directory {}: {e}", at.display()))?;
    let what = if at.as_os_str() == "/" {
        "the root directory".to_string()
    } else {
        format!("its directory {}", at.display())
    };
    if st.st_uid != 0 {
        return Err(format!("{what} is owned by uid {}, not root", st.st_uid));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(format!(
            "{what} (mode {mode:o}) is writable by group or others"
        ));
    }
    Ok(())
}

/// Parse `text` (from `path`, named in the error) as TOML into `T`.
pub fn parse_toml<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, ConfFileError> {
    toml::from_str(text).map_err(|e| ConfFileError::Parse {
        path: path.to_path_buf(),
        // toml's message names the key and the line; keep it on one line.
        message: e
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    /// Root's files can only be made by root: fail (or, knowingly, skip).
    fn root(test: &str) -> bool {
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if !root {
            gpuq_test_skip::cannot_run(test, "needs root (the files must be root's)");
        }
        root
    }

    #[test]
    fn roots_file_is_read_and_others_are_refused_naming_why() {
        let d = dir();
        let p = d.path().join("c.toml");
        std::fs::write(&p, "a = 1\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        if !root("roots_file_is_read_and_others_are_refused_naming_why") {
            return;
        }
        assert_eq!(read_trusted(&p).unwrap(), "a = 1\n");
        // Writable by others: refused, whoever runs this.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_trusted(&p).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("mode 666"), "{e}");
        // A symlink to it: refused as a link, even to a good file.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let l = d.path().join("link.toml");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        let e = read_trusted(&l).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        // A directory, not a file.
        let e = read_trusted(d.path()).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Missing: a read error naming it.
        let e = read_trusted(&d.path().join("none.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot read config") && e.contains("none.toml"),
            "{e}"
        );
    }

    #[test]
    fn a_group_writable_directory_is_refused_unless_sticky() {
        if !root("a_group_writable_directory_is_refused_unless_sticky") {
            return;
        }
        let d = dir();
        let p = d.path().join("c.toml");
        std::fs::write(&p, "a = 1\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = read_trusted(&p).unwrap_err().to_string();
        assert!(e.contains("its directory") && e.contains("775"), "{e}");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(read_trusted(&p).is_ok());
    }

    #[test]
    fn every_directory_on_the_way_is_checked_and_none_may_be_a_link() {
        if !root("every_directory_on_the_way_is_checked_and_none_may_be_a_link") {
            return;
        }
        // d/a (0777: anyone may swap what is under it) / b / c.toml
        let d = dir();
        let b = d.path().join("a/b");
        std::fs::create_dir_all(&b).unwrap();
        for x in [d.path().join("a"), b.clone()] {
            std::fs::set_permissions(&x, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let p = b.join("c.toml");
        std::fs::write(&p, "a = 1\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read_trusted(&p).unwrap(), "a = 1\n");
        // An ancestor anyone may write (not the parent: the old check's).
        std::fs::set_permissions(d.path().join("a"), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        let e = read_trusted(&p).unwrap_err().to_string();
        assert!(
            e.contains("/a (mode 777) is writable by group or others"),
            "{e}"
        );
        std::fs::set_permissions(d.path().join("a"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        // An ancestor that is a link to a good directory: refused all the
        // same (its target is whatever the link's writer chose).
        std::os::unix::fs::symlink(d.path().join("a"), d.path().join("l")).unwrap();
        let e = read_trusted(&d.path().join("l/b/c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/l on its way is a symbolic link"), "{e}");
        // '..' goes back along the checked walk (as a test names
        // CARGO_MANIFEST_DIR/../../config/…); through a link it is refused.
        assert_eq!(
            read_trusted(&d.path().join("a/b/../b/c.toml")).unwrap(),
            "a = 1\n"
        );
        let e = read_trusted(&d.path().join("l/../a/b/c.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/l on its way is a symbolic link"), "{e}");
    }

    #[test]
    fn toml_errors_are_one_line_naming_the_file() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct T {
            a: u32,
        }
        let e = parse_toml::<T>(Path::new("/etc/x.toml"), "a = \"one\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config /etc/x.toml: ") && !e.contains('\n'),
            "{e}"
        );
        assert_eq!(parse_toml::<T>(Path::new("x"), "a = 2").unwrap().a, 2);
    }
}
