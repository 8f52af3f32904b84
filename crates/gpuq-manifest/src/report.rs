//! `gpuq verify-install`: what each host says about its installation, and
//! the verdict over all of them.
//!
//! Each daemon inspects its own host ([`inspect_host`]): the broker on the
//! GPU host, each node helper on its node (`GET /v1/install`). It hashes
//! every file its host's manifests list, and the executable it is running
//! (`/proc/self/exe`, which still opens the file the process started from
//! after a package replaced it). The broker gathers the hosts into an
//! [`InstallReport`]; the CLI, which knows its own version, judges it
//! ([`assess`], pure): every host's daemon and every manifest must carry the
//! CLI's version, every listed file must be what the package installed, and
//! a running daemon must be the binary its manifest lists (else it was
//! upgraded on disk and not restarted). Changed configuration files are
//! information, not failures.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, FileReport, Finding, Manifest, Result};

/// A manifest is at most this big (a package lists tens of files).
const MAX_MANIFEST: u64 = 16 * 1024 * 1024;

/// The broker's answer to `GET /v1/install`: its own host first, then each
/// node in configuration order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallReport {
    pub hosts: Vec<HostInstall>,
}

/// What one host says about its installation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInstall {
    pub host: String,
    /// The host could not be asked (link down, helper not answering within
    /// its deadline): nothing else about it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
    /// The daemon that answered (`gpuq-broker`, `gpuq-node`) and its version.
    #[serde(default)]
    pub program: String,
    #[serde(default)]
    pub version: String,
    /// The package that installs that daemon: its manifest must be there.
    #[serde(default)]
    pub own_package: String,
    #[serde(default)]
    pub exe: Option<RunningExe>,
    #[serde(default)]
    pub manifest_dir: String,
    #[serde(default)]
    pub prefix: String,
    /// The manifest directory could not be listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifests_error: Option<String>,
    #[serde(default)]
    pub packages: Vec<PackageCheck>,
}

/// The executable the daemon is running, against its manifest entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningExe {
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The manifest entry named like the program (`…/gpuq-node`), if one is.
    #[serde(default)]
    pub listed_path: Option<String>,
    #[serde(default)]
    pub listed_sha256: Option<String>,
}

/// One manifest of the host and what its check found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageCheck {
    /// The manifest file.
    pub manifest: String,
    #[serde(default)]
    pub package: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub files: Vec<FileReport>,
    /// The manifest could not be read, was not root's, or not a manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Reads a manifest only if `owner` owns it and nobody else may write it:
/// whoever can edit the manifest can make a changed binary look installed.
/// Opened with `O_NOFOLLOW`; must be a regular file.
pub fn load_trusted(path: &Path, owner: u32) -> Result<Manifest> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let (file, meta) = crate::open_regular(path)?;
    if meta.uid() != owner || meta.mode() & 0o022 != 0 {
        return Err(Error::Untrusted {
            path: path.to_path_buf(),
            why: format!(
                "owned by uid {}, mode {:o}; a manifest must be uid {owner}'s and not writable by group or others",
                meta.uid(),
                meta.mode() & 0o7777
            ),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    Manifest::parse(path, &bytes)
}

/// Inspect this host: every `*.json` manifest in `manifest_dir` (each must
/// be `owner`'s, [`load_trusted`]), its files checked under `prefix`, and the
/// running executable of `program`. Blocking (hashes files): call it off the
/// async workers.
pub fn inspect_host(
    host: &str,
    program: &str,
    version: &str,
    own_package: &str,
    manifest_dir: &Path,
    prefix: &Path,
    owner: u32,
) -> HostInstall {
    let mut out = HostInstall {
        host: host.to_string(),
        program: program.to_string(),
        version: version.to_string(),
        own_package: own_package.to_string(),
        manifest_dir: manifest_dir.display().to_string(),
        prefix: prefix.display().to_string(),
        ..HostInstall::default()
    };
    let mut names: Vec<_> = match std::fs::read_dir(manifest_dir) {
        Ok(rd) => rd
            .filter_map(|d| d.ok().map(|d| d.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect(),
        Err(e) => {
            out.manifests_error = Some(format!(
                "cannot list manifests in {}: {e}",
                manifest_dir.display()
            ));
            Vec::new()
        }
    };
    names.sort();
    let mut listed = None;
    for path in names {
        let manifest = path.display().to_string();
        match load_trusted(&path, owner) {
            Ok(m) => {
                if listed.is_none() {
                    listed = m
                        .files
                        .iter()
                        .find(|e| Path::new(&e.path).file_name() == Some(program.as_ref()))
                        .map(|e| (e.path.clone(), e.sha256.clone()));
                }
                out.packages.push(PackageCheck {
                    manifest,
                    files: m.check(prefix),
                    package: m.package,
                    version: m.version,
                    error: None,
                });
            }
            Err(e) => out.packages.push(PackageCheck {
                manifest,
                error: Some(e.to_string()),
                ..PackageCheck::default()
            }),
        }
    }
    let (sha256, error) =
        match File::open("/proc/self/exe").and_then(|mut f| crate::sha256_open(&mut f)) {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(format!("/proc/self/exe: {e}"))),
        };
    out.exe = Some(RunningExe {
        sha256,
        error,
        listed_path: listed.as_ref().map(|l| l.0.clone()),
        listed_sha256: listed.map(|l| l.1),
    });
    out
}

/// What `verify-install` reports for one host and subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Modified,
    /// The package's content, but not root's or not the package's mode.
    Permissions,
    Missing,
    NotRegular,
    Unreadable,
    /// A configuration file differs from the packaged default (information).
    ConfigChanged,
    /// A daemon or a manifest of another version than the CLI's.
    VersionSkew,
    /// The daemon runs another binary than its manifest lists: installed
    /// anew and not restarted.
    RunningDiffers,
    Unreachable,
    /// No manifest at all, or none of the package that installs the daemon.
    NoManifest,
    ManifestUnreadable,
    /// Another `gpuq` comes first in root's PATH.
    Shadowed,
}

impl Status {
    pub fn is_failure(self) -> bool {
        match self {
            Status::ConfigChanged => false,
            Status::Modified
            | Status::Permissions
            | Status::Missing
            | Status::NotRegular
            | Status::Unreadable
            | Status::VersionSkew
            | Status::RunningDiffers
            | Status::Unreachable
            | Status::NoManifest
            | Status::ManifestUnreadable
            | Status::Shadowed => true,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Status::Modified => "MODIFIED",
            Status::Permissions => "WRONG OWNER OR MODE",
            Status::Missing => "MISSING",
            Status::NotRegular => "NOT A REGULAR FILE",
            Status::Unreadable => "UNREADABLE",
            Status::ConfigChanged => "changed from the packaged default (information)",
            Status::VersionSkew => "VERSION SKEW",
            Status::RunningDiffers => "RUNNING BINARY DIFFERS",
            Status::Unreachable => "UNREACHABLE",
            Status::NoManifest => "NO MANIFEST",
            Status::ManifestUnreadable => "MANIFEST UNREADABLE",
            Status::Shadowed => "SHADOWED",
        }
    }
}

/// One finding: a host, what on it (a path, a daemon, a manifest), what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    pub host: String,
    pub subject: String,
    pub status: Status,
    pub detail: String,
}

/// Per host: how many listed files are as installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSummary {
    pub host: String,
    pub files_ok: usize,
    pub failures: usize,
    pub config_changed: usize,
}

/// The verdict: failures first, then information; `ok` when no failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub ok: bool,
    pub cli_version: String,
    pub findings: Vec<Line>,
    pub hosts: Vec<HostSummary>,
}

/// Judge the hosts' reports against the CLI's own version; `extra`: findings
/// the caller made itself (the PATH check).
pub fn assess(cli_version: &str, hosts: &[HostInstall], extra: Vec<Line>) -> Verdict {
    let mut lines = extra;
    let mut summaries = Vec::new();
    for h in hosts {
        let before = lines.len();
        let mut files_ok = 0;
        let mut add = |subject: &str, status: Status, detail: String| {
            lines.push(Line {
                host: h.host.clone(),
                subject: subject.to_string(),
                status,
                detail,
            })
        };
        if let Some(why) = &h.unreachable {
            add("node helper", Status::Unreachable, why.clone());
        } else {
            if h.version != cli_version {
                add(
                    &h.program,
                    Status::VersionSkew,
                    format!(
                        "{} {} is running; this gpuq is {cli_version}",
                        h.program, h.version
                    ),
                );
            }
            if let Some(exe) = &h.exe {
                if let Some(e) = &exe.error {
                    add(
                        &format!("running {}", h.program),
                        Status::Unreadable,
                        e.clone(),
                    );
                }
                if let (Some(run), Some(path), Some(listed)) =
                    (&exe.sha256, &exe.listed_path, &exe.listed_sha256)
                {
                    if run != listed {
                        add(
                            path,
                            Status::RunningDiffers,
                            format!(
                                "the running {} (sha256 {}) is not the one the manifest lists ({}): restart it",
                                h.program,
                                short(run),
                                short(listed)
                            ),
                        );
                    }
                }
            }
            if let Some(e) = &h.manifests_error {
                add(&h.manifest_dir, Status::ManifestUnreadable, e.clone());
            } else if h.packages.is_empty() {
                add(
                    &h.manifest_dir,
                    Status::NoManifest,
                    "no manifest here: was gpuq installed from its package?".into(),
                );
            } else if !h.own_package.is_empty()
                && !h.packages.iter().any(|p| p.package == h.own_package)
            {
                add(
                    &h.own_package,
                    Status::NoManifest,
                    format!(
                        "no manifest of package {} in {}",
                        h.own_package, h.manifest_dir
                    ),
                );
            }
            for p in &h.packages {
                if let Some(e) = &p.error {
                    add(&p.manifest, Status::ManifestUnreadable, e.clone());
                    continue;
                }
                if p.version != cli_version {
                    add(
                        &format!("package {}", p.package),
                        Status::VersionSkew,
                        format!(
                            "{} lists version {}; this gpuq is {cli_version}",
                            p.manifest, p.version
                        ),
                    );
                }
                for f in &p.files {
                    let (status, detail) = match &f.finding {
                        Finding::Ok => {
                            files_ok += 1;
                            continue;
                        }
                        Finding::Modified { found } => (
                            Status::Modified,
                            format!(
                                "sha256 {} (package {} {})",
                                short(found),
                                p.package,
                                p.version
                            ),
                        ),
                        Finding::Missing => (Status::Missing, format!("package {}", p.package)),
                        Finding::NotRegular => (
                            Status::NotRegular,
                            "a symlink or other non-file where the package installed a file".into(),
                        ),
                        Finding::ConfigChanged { found } => {
                            (Status::ConfigChanged, format!("sha256 {}", short(found)))
                        }
                        Finding::Unreadable { error } => (Status::Unreadable, error.clone()),
                        Finding::Permissions { found } => (Status::Permissions, found.clone()),
                    };
                    add(&f.path, status, detail);
                }
            }
        }
        let mine = &lines[before..];
        summaries.push(HostSummary {
            host: h.host.clone(),
            files_ok,
            failures: mine.iter().filter(|l| l.status.is_failure()).count(),
            config_changed: mine.iter().filter(|l| !l.status.is_failure()).count(),
        });
    }
    // Failures first; otherwise host order (stable sort).
    lines.sort_by_key(|l| !l.status.is_failure());
    Verdict {
        ok: !lines.iter().any(|l| l.status.is_failure()),
        cli_version: cli_version.to_string(),
        findings: lines,
        hosts: summaries,
    }
}

/// The first 12 hex digits: enough to tell sums apart in a report.
fn short(sum: &str) -> &str {
    sum.get(..12).unwrap_or(sum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn tree() -> (tempfile::TempDir, u32) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        fs::create_dir_all(root.join("usr/sbin")).unwrap();
        fs::create_dir_all(root.join("etc/gpuqueue-daos")).unwrap();
        fs::write(root.join("usr/sbin/gpuq-node"), b"helper").unwrap();
        fs::write(root.join("etc/gpuqueue-daos/node.toml"), b"[node]\n").unwrap();
        let m = Manifest::from_tree(
            &root,
            "gpuq-node",
            "0.1.0",
            &["/etc/gpuqueue-daos/node.toml".into()],
        )
        .unwrap();
        let dir = d.path().join("manifests");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("gpuq-node.json"), m.to_json()).unwrap();
        fs::set_permissions(
            dir.join("gpuq-node.json"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let owner = fs::metadata(dir.join("gpuq-node.json")).unwrap().uid();
        (d, owner)
    }

    fn inspect(d: &Path, owner: u32) -> HostInstall {
        inspect_host(
            "da3",
            "gpuq-node",
            "0.1.0",
            "gpuq-node",
            &d.join("manifests"),
            &d.join("root"),
            owner,
        )
    }

    #[test]
    fn an_intact_host_is_ok_and_a_changed_config_is_only_information() {
        let (d, owner) = tree();
        let mut h = inspect(d.path(), owner);
        let exe = h.exe.as_mut().unwrap();
        assert_eq!(exe.listed_path.as_deref(), Some("/usr/sbin/gpuq-node"));
        // This test binary is not the listed helper: it differs, and says so.
        let v = assess("0.1.0", std::slice::from_ref(&h), vec![]);
        assert_eq!(v.findings[0].status, Status::RunningDiffers, "{v:?}");
        let exe = h.exe.as_mut().unwrap();
        exe.sha256 = exe.listed_sha256.clone();
        let v = assess("0.1.0", std::slice::from_ref(&h), vec![]);
        assert!(v.ok, "{v:?}");
        assert_eq!(v.hosts[0].files_ok, 2);
        fs::write(d.path().join("root/etc/gpuqueue-daos/node.toml"), b"x").unwrap();
        let mut h = inspect(d.path(), owner);
        h.exe = None;
        let v = assess("0.1.0", &[h], vec![]);
        assert!(v.ok, "{v:?}");
        assert_eq!(v.findings.len(), 1);
        assert_eq!(v.findings[0].status, Status::ConfigChanged);
    }

    #[test]
    fn a_flipped_byte_names_that_host_and_file_and_fails() {
        let (d, owner) = tree();
        fs::write(d.path().join("root/usr/sbin/gpuq-node"), b"helpes").unwrap();
        let mut h = inspect(d.path(), owner);
        h.exe = None;
        let v = assess("0.1.0", &[h], vec![]);
        assert!(!v.ok);
        assert_eq!(v.findings.len(), 1, "{v:?}");
        assert_eq!(v.findings[0].host, "da3");
        assert_eq!(v.findings[0].subject, "/usr/sbin/gpuq-node");
        assert_eq!(v.findings[0].status, Status::Modified);
    }

    #[test]
    fn another_version_anywhere_is_skew_and_a_stale_running_binary_is_named() {
        let (d, owner) = tree();
        let mut h = inspect(d.path(), owner);
        // The helper runs the binary the manifest lists.
        let listed = h.exe.as_ref().unwrap().listed_sha256.clone();
        h.exe.as_mut().unwrap().sha256 = listed;
        let v = assess("0.2.0", std::slice::from_ref(&h), vec![]);
        let skews: Vec<_> = v
            .findings
            .iter()
            .filter(|l| l.status == Status::VersionSkew)
            .collect();
        assert_eq!(skews.len(), 2, "daemon and manifest: {v:?}");
        h.exe.as_mut().unwrap().sha256 = Some("0".repeat(64));
        let v = assess("0.1.0", &[h], vec![]);
        assert_eq!(v.findings.len(), 1, "{v:?}");
        assert_eq!(v.findings[0].status, Status::RunningDiffers);
        assert_eq!(v.findings[0].subject, "/usr/sbin/gpuq-node");
    }

    #[test]
    fn a_manifest_others_may_write_is_not_trusted_and_no_manifest_is_a_failure() {
        let (d, owner) = tree();
        let m = d.path().join("manifests/gpuq-node.json");
        fs::set_permissions(&m, fs::Permissions::from_mode(0o666)).unwrap();
        let v = assess("0.1.0", &[inspect(d.path(), owner)], vec![]);
        assert!(!v.ok);
        assert!(v
            .findings
            .iter()
            .any(|l| l.status == Status::ManifestUnreadable && l.detail.contains("not writable")));
        fs::remove_file(&m).unwrap();
        let v = assess("0.1.0", &[inspect(d.path(), owner)], vec![]);
        assert_eq!(v.findings[0].status, Status::NoManifest, "{v:?}");
        let v = assess(
            "0.1.0",
            &[HostInstall {
                host: "da2".into(),
                unreachable: Some("no answer within 5s".into()),
                ..HostInstall::default()
            }],
            vec![],
        );
        assert_eq!(v.findings[0].status, Status::Unreachable);
        assert_eq!(v.hosts[0].failures, 1);
    }

    #[test]
    fn a_report_survives_json_both_ways() {
        let (d, owner) = tree();
        fs::write(d.path().join("root/usr/sbin/gpuq-node"), b"x").unwrap();
        let r = InstallReport {
            hosts: vec![inspect(d.path(), owner)],
        };
        let back: InstallReport =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
