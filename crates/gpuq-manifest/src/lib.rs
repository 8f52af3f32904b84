//! The install manifest: what one gpuq package put on a host, file by file,
//! with each file's SHA-256.
//!
//! The original system was checked after each deployment by comparing the
//! SHA-256 sums of the installed code on all five hosts. Here the sums are
//! taken once, from the staged tree the packages are built from
//! (`integration/package` runs `gpuq-manifest gen`), and the manifest is
//! shipped inside the package at [`INSTALL_DIR`]`/<package>.json`. On a host,
//! [`Manifest::check`] hashes what is installed now and says, per file, ok /
//! modified / missing; configuration files (`config: true`) are reported as
//! changed from the packaged default, which is information, not a failure.
//!
//! Files are opened with `O_NOFOLLOW` and must be regular files: a symlink
//! where the package installed a file is a finding, never followed.
//!
//! The format is versioned ([`FORMAT`]); a manifest of another format is
//! refused rather than half-read.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub mod report;

/// The version of the manifest format this crate reads and writes.
pub const FORMAT: u32 = 1;

/// Where the packages install their manifests (one file per package).
pub const INSTALL_DIR: &str = "/usr/share/gpuq/manifests";

/// `[install]` of `broker.toml` and `node.toml`: where this host's manifests
/// are and the root their paths are relative to. Only the tests set it (an
/// "installed tree" in a temporary directory); both files are root's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstallPaths {
    pub manifest_dir: PathBuf,
    pub prefix: PathBuf,
}

impl Default for InstallPaths {
    fn default() -> Self {
        InstallPaths {
            manifest_dir: PathBuf::from(INSTALL_DIR),
            prefix: PathBuf::from("/"),
        }
    }
}

impl InstallPaths {
    /// The key (`install.manifest_dir`, `install.prefix`) that is not an
    /// absolute path, if one is not.
    pub fn invalid_key(&self) -> Option<&'static str> {
        if !self.manifest_dir.is_absolute() {
            Some("install.manifest_dir")
        } else if !self.prefix.is_absolute() {
            Some("install.prefix")
        } else {
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a regular file (a package installs regular files only; symlinks are not followed)")]
    NotRegular { path: PathBuf },
    #[error("{path}: not a gpuq manifest: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: manifest format {found}, this gpuq reads format {FORMAT}; use the gpuq that came with the package")]
    Format { path: PathBuf, found: u32 },
    #[error("{path}: listed as configuration but not in the staged tree")]
    UnknownConfig { path: String },
    #[error("{path}: not trusted: {why}")]
    Untrusted { path: PathBuf, why: String },
    #[error("{path}: manifest paths must be absolute and plain (no '.', '..' or '//')")]
    BadPath { path: String },
}

pub type Result<T> = std::result::Result<T, Error>;

/// One package's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The package name (`gpuq`, `gpuq-node`).
    pub package: String,
    /// The package version (the workspace version at build time).
    pub version: String,
    /// Sorted by path.
    pub files: Vec<Entry>,
}

/// One installed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Absolute path on the installed host.
    pub path: String,
    /// Lower-case hex SHA-256 of the content.
    pub sha256: String,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// A configuration file: the operator may change it.
    #[serde(default)]
    pub config: bool,
}

/// What [`Manifest::check`] found for one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Finding {
    Ok,
    /// Content differs from the package's.
    Modified {
        found: String,
    },
    Missing,
    /// Present but not a regular file (a symlink, a directory, ...).
    NotRegular,
    /// A configuration file that differs from the packaged default.
    ConfigChanged {
        found: String,
    },
    /// Could not be read (permissions, I/O error).
    Unreadable {
        error: String,
    },
    /// The content is the package's, but not its owner or mode: not
    /// root's, or another mode than the package's (a configuration file:
    /// writable by group or others). Whoever could write it could change
    /// what root runs or reads.
    Permissions {
        found: String,
    },
}

impl Finding {
    /// A failure of the installation (configuration changes are not).
    pub fn is_failure(&self) -> bool {
        !matches!(self, Finding::Ok | Finding::ConfigChanged { .. })
    }
}

/// One line of a check's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileReport {
    pub path: String,
    pub config: bool,
    #[serde(flatten)]
    pub finding: Finding,
}

/// Lower-case hex SHA-256 of a regular file, opened without following a
/// final symlink.
pub fn sha256_file(path: &Path) -> Result<String> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let (mut file, _) = open_regular(path)?;
    sha256_reader(&mut file).map_err(io)
}

/// `path` opened read-only without following a final symlink, and its
/// metadata; anything but a regular file is [`Error::NotRegular`].
pub(crate) fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata)> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::NotRegular {
                    path: path.to_path_buf(),
                }
            } else {
                io(e)
            }
        })?;
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(Error::NotRegular {
            path: path.to_path_buf(),
        });
    }
    Ok((file, meta))
}

/// Lower-case hex SHA-256 of everything `r` yields.
pub fn sha256_reader(r: &mut impl Read) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn plain_abs(path: &str) -> bool {
    path.starts_with('/')
        && path.len() > 1
        && !path.ends_with('/')
        && path[1..]
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

impl Manifest {
    /// The manifest of a staged tree: every regular file under `root`,
    /// recorded at the path it will have once installed (`root` stripped).
    /// `config` names (installed, absolute) paths that are configuration;
    /// each must be in the tree. Symlinks and other non-regular entries in
    /// the tree are refused: what a package installs is files.
    pub fn from_tree(
        root: &Path,
        package: &str,
        version: &str,
        config: &[String],
    ) -> Result<Manifest> {
        let mut files = Vec::new();
        walk(root, root, &mut files)?;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let known: BTreeSet<&str> = files.iter().map(|e| e.path.as_str()).collect();
        for c in config {
            if !plain_abs(c) {
                return Err(Error::BadPath { path: c.clone() });
            }
            if !known.contains(c.as_str()) {
                return Err(Error::UnknownConfig { path: c.clone() });
            }
        }
        for e in &mut files {
            e.config = config.contains(&e.path);
        }
        Ok(Manifest {
            format: FORMAT,
            package: package.to_string(),
            version: version.to_string(),
            files,
        })
    }

    /// Reads and validates a manifest file (format, plain absolute paths,
    /// 64-hex sums).
    pub fn load(path: &Path) -> Result<Manifest> {
        let bytes = fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &bytes)
    }

    /// Parses manifest bytes; `path` is only used in messages.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Manifest> {
        #[derive(Deserialize)]
        struct Head {
            format: u32,
        }
        let parse = |source| Error::Parse {
            path: path.to_path_buf(),
            source,
        };
        let head: Head = serde_json::from_slice(bytes).map_err(parse)?;
        if head.format != FORMAT {
            return Err(Error::Format {
                path: path.to_path_buf(),
                found: head.format,
            });
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(parse)?;
        for e in &m.files {
            let hex_ok = e.sha256.len() == 64
                && e.sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !plain_abs(&e.path) || !hex_ok {
                return Err(Error::BadPath {
                    path: e.path.clone(),
                });
            }
        }
        Ok(m)
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a manifest always serialises");
        s.push('\n');
        s
    }

    /// Hashes each listed file under `prefix` (`/` on a real host; an
    /// install root in tests) and reports what it found, in manifest order.
    pub fn check(&self, prefix: &Path) -> Vec<FileReport> {
        self.files
            .iter()
            .map(|e| {
                let on_host = prefix.join(e.path.trim_start_matches('/'));
                let hashed = open_regular(&on_host).and_then(|(mut f, meta)| {
                    let sum = sha256_reader(&mut f).map_err(|source| Error::Io {
                        path: on_host.clone(),
                        source,
                    })?;
                    Ok((sum, meta))
                });
                let finding = match hashed {
                    Ok((sum, meta)) if sum == e.sha256 || e.config => {
                        match permissions(e, meta.uid(), meta.gid(), meta.mode() & 0o7777) {
                            Some(found) => Finding::Permissions { found },
                            None if sum == e.sha256 => Finding::Ok,
                            None => Finding::ConfigChanged { found: sum },
                        }
                    }
                    Ok((sum, _)) => Finding::Modified { found: sum },
                    Err(Error::NotRegular { .. }) => Finding::NotRegular,
                    Err(Error::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        Finding::Missing
                    }
                    Err(err) => Finding::Unreadable {
                        error: err.to_string(),
                    },
                };
                FileReport {
                    path: e.path.clone(),
                    config: e.config,
                    finding,
                }
            })
            .collect()
    }
}

/// What is wrong with an installed file's owner and mode (read from the
/// descriptor that was hashed), if anything: every packaged file is
/// root's (uid and gid 0, as dpkg and rpm install them) with the
/// package's mode; a configuration file's mode is the operator's to
/// narrow, but never writable by group or others.
fn permissions(e: &Entry, uid: u32, gid: u32, mode: u32) -> Option<String> {
    let wrong_mode = if e.config {
        mode & 0o022 != 0
    } else {
        mode != e.mode
    };
    (uid != 0 || gid != 0 || wrong_mode).then(|| {
        format!(
            "owner {uid}:{gid} mode {mode:04o}; the package's: 0:0 mode {:04o}{}",
            e.mode,
            if e.config {
                " (a configuration file may be narrower, never writable by group or others)"
            } else {
                ""
            }
        )
    })
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Entry>) -> Result<()> {
    let io = |path: &Path, source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut names: Vec<_> = fs::read_dir(dir)
        .map_err(|e| io(dir, e))?
        .map(|d| d.map(|d| d.path()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| io(dir, e))?;
    names.sort();
    for path in names {
        let meta = fs::symlink_metadata(&path).map_err(|e| io(&path, e))?;
        if meta.file_type().is_dir() {
            walk(root, &path, out)?;
        } else if meta.file_type().is_file() {
            let rel = path.strip_prefix(root).expect("walked under root");
            let installed = format!("/{}", rel.display());
            if !plain_abs(&installed) {
                return Err(Error::BadPath { path: installed });
            }
            let sha256 = sha256_file(&path)?;
            out.push(Entry {
                path: installed,
                sha256,
                mode: meta.mode() & 0o7777,
                config: false,
            });
        } else {
            return Err(Error::NotRegular { path });
        }
    }
    Ok(())
}

/// Reads the sum of an open file (e.g. `/proc/self/exe` opened by the
/// caller): for the helpers' own executables.
pub fn sha256_open(file: &mut File) -> std::io::Result<String> {
    sha256_reader(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn staged() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("usr/bin")).unwrap();
        fs::create_dir_all(d.path().join("etc/gpuqueue-daos")).unwrap();
        fs::write(d.path().join("usr/bin/gpuq"), b"abc").unwrap();
        fs::set_permissions(
            d.path().join("usr/bin/gpuq"),
            fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        fs::write(d.path().join("etc/gpuqueue-daos/broker.toml"), b"x = 1\n").unwrap();
        d
    }

    /// The `gpuq` manifest of a [`staged`] tree, broker.toml its config.
    fn manifest_of(d: &tempfile::TempDir) -> Manifest {
        Manifest::from_tree(
            d.path(),
            "gpuq",
            "0.1.0",
            &["/etc/gpuqueue-daos/broker.toml".into()],
        )
        .unwrap()
    }

    #[test]
    fn a_staged_tree_becomes_a_sorted_manifest_with_known_sums() {
        let d = staged();
        let m = manifest_of(&d);
        assert_eq!(m.files.len(), 2);
        assert_eq!(m.files[0].path, "/etc/gpuqueue-daos/broker.toml");
        assert!(m.files[0].config);
        assert_eq!(m.files[1].path, "/usr/bin/gpuq");
        // sha256("abc"), FIPS 180-2 appendix B.1
        assert_eq!(
            m.files[1].sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(m.files[1].mode, 0o755);
        let back = Manifest::parse(Path::new("m"), m.to_json().as_bytes()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn check_reports_ok_modified_missing_symlinked_and_changed_config() {
        let d = staged();
        fs::write(d.path().join("usr/bin/gpuq-broker"), b"broker").unwrap();
        let m = manifest_of(&d);
        assert!(m.check(d.path()).iter().all(|r| r.finding == Finding::Ok));

        fs::write(d.path().join("usr/bin/gpuq"), b"abd").unwrap();
        fs::write(d.path().join("etc/gpuqueue-daos/broker.toml"), b"x = 2\n").unwrap();
        fs::remove_file(d.path().join("usr/bin/gpuq-broker")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join("usr/bin/gpuq-broker")).unwrap();
        let r = m.check(d.path());
        assert!(matches!(r[0].finding, Finding::ConfigChanged { .. }));
        assert!(!r[0].finding.is_failure());
        assert!(matches!(r[1].finding, Finding::Modified { .. }), "{r:?}");
        assert_eq!(r[2].finding, Finding::NotRegular);
        fs::remove_file(d.path().join("usr/bin/gpuq-broker")).unwrap();
        let r = m.check(d.path());
        assert_eq!(r[2].finding, Finding::Missing);
        assert!(r[2].finding.is_failure());
    }

    #[test]
    fn a_file_not_root_s_or_not_the_package_s_mode_is_named_and_a_config_may_only_narrow() {
        let bin = Entry {
            path: "/usr/sbin/gpuq-node".into(),
            sha256: String::new(),
            mode: 0o755,
            config: false,
        };
        let conf = Entry {
            path: "/etc/gpuqueue-daos/node.toml".into(),
            mode: 0o644,
            config: true,
            ..bin.clone()
        };
        assert_eq!(permissions(&bin, 0, 0, 0o755), None);
        assert_eq!(permissions(&conf, 0, 0, 0o644), None);
        assert_eq!(permissions(&conf, 0, 0, 0o600), None);
        for (e, uid, gid, mode) in [
            (&bin, 61002, 0, 0o755),
            (&bin, 0, 61002, 0o755),
            (&bin, 0, 0, 0o775),
            (&bin, 0, 0, 0o4755),
            (&bin, 0, 0, 0o700),
            (&conf, 0, 0, 0o664),
            (&conf, 0, 0, 0o646),
            (&conf, 61002, 0, 0o600),
        ] {
            let why = permissions(e, uid, gid, mode).expect("a finding");
            assert!(
                why.starts_with(&format!(
                    "owner {uid}:{gid} mode {mode:04o}; the package's: 0:0 mode "
                )),
                "{why}"
            );
        }
    }

    #[test]
    fn check_reads_owner_and_mode_from_the_file_it_hashed() {
        // chown needs root (tests/run runs as root).
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "this test chowns files: run it as root (tests/run does)"
        );
        let d = staged();
        let m = manifest_of(&d);
        let bin = d.path().join("usr/bin/gpuq");
        let conf = d.path().join("etc/gpuqueue-daos/broker.toml");
        std::os::unix::fs::chown(&bin, Some(61002), None).unwrap();
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o666)).unwrap();
        let r = m.check(d.path());
        for f in &r {
            assert!(matches!(f.finding, Finding::Permissions { .. }), "{r:?}");
            assert!(f.finding.is_failure());
        }
        std::os::unix::fs::chown(&bin, Some(0), Some(0)).unwrap();
        fs::set_permissions(&conf, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(m.check(d.path()).iter().all(|f| f.finding == Finding::Ok));
    }

    #[test]
    fn another_format_or_a_relative_path_is_refused() {
        let e = Manifest::parse(
            Path::new("m"),
            br#"{"format":2,"package":"gpuq","version":"9","files":[]}"#,
        )
        .unwrap_err();
        assert!(matches!(e, Error::Format { found: 2, .. }), "{e}");
        let bad = br#"{"format":1,"package":"gpuq","version":"1","files":[{"path":"usr/../etc/shadow","sha256":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad","mode":420}]}"#;
        assert!(matches!(
            Manifest::parse(Path::new("m"), bad).unwrap_err(),
            Error::BadPath { .. }
        ));
    }

    #[test]
    fn a_symlink_in_the_staged_tree_or_an_unknown_config_is_refused() {
        let d = staged();
        let e = Manifest::from_tree(d.path(), "gpuq", "1", &["/etc/nope.toml".into()]).unwrap_err();
        assert!(matches!(e, Error::UnknownConfig { .. }), "{e}");
        std::os::unix::fs::symlink("gpuq", d.path().join("usr/bin/gq")).unwrap();
        let e = Manifest::from_tree(d.path(), "gpuq", "1", &[]).unwrap_err();
        assert!(matches!(e, Error::NotRegular { .. }), "{e}");
    }
}
