//! The node configuration file (`/etc/gpuqueue-daos/node.toml`, examples in
//! `config/da1.toml` …): a `[node]` table and one `[[devices]]` table per
//! research NVMe namespace that this node may wipe.
//!
//! Unknown keys are errors (`deny_unknown_fields`): a typo such as `seriall`
//! must never silently widen or narrow the allowlist. Every error names the
//! file and the key.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors while loading or validating a node configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unreadable, not root's alone, or not TOML.
    #[error(transparent)]
    File(#[from] gpuq_conffile::ConfFileError),
    #[error("invalid config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// The whole node configuration file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    pub node: NodeSection,
    #[serde(default)]
    pub devices: Vec<DeviceEntry>,
}

/// `[node]`: who this node is and where it keeps its state.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Node name as the broker knows it (`da1` …).
    pub name: String,
    /// Root-only unix socket of the node daemon.
    pub socket: PathBuf,
    /// Podman API socket on this node.
    pub podman_socket: PathBuf,
    /// Per-lease metadata and wipe audit records: `<jobs_dir>/<lease>/`.
    pub jobs_dir: PathBuf,
    /// The only directory test mode may delete in.
    pub test_dir: PathBuf,
    /// Accept `loop_backing_file` identities. Tests only; never in production.
    #[serde(default)]
    pub allow_loop_devices: bool,
    /// `false`: `gpuq-node serve` refuses to start (the packaged
    /// configuration ships so until an operator fills in this node's
    /// devices and profiles). Missing: enabled, as before this key existed.
    /// `devices` and `wipe` are operator tools and do not look at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `[[devices]]`: one research namespace this node may wipe.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DeviceEntry {
    /// NVMe controller serial (as in `/sys/class/nvme/nvmeX/serial`, trimmed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// PCI address of the controller, `dddd:bb:dd.f`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    /// Namespace ID; required when the controller has several namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    /// Expected model string (trimmed), optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Expected size in bytes, optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Tests only: a loop device identified by its backing file. Needs
    /// `[node] allow_loop_devices = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_backing_file: Option<PathBuf>,
}

impl DeviceEntry {
    /// A short human label for messages and audit file names.
    pub fn label(&self) -> String {
        if let Some(s) = &self.serial {
            return s.clone();
        }
        if let Some(p) = &self.loop_backing_file {
            return p.display().to_string();
        }
        "<unnamed>".to_string()
    }
}

impl NodeConfig {
    /// Read, parse and validate `path`.
    /// Read (only if root alone could have written it: it decides which
    /// devices may be discarded) and parse.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = gpuq_conffile::read_trusted(path)?;
        Self::parse(path, &text)
    }

    /// Parse and validate `text`; `path` is only used in error messages.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let cfg: NodeConfig = gpuq_conffile::parse_toml(path, text)?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: String, message: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message: message.to_string(),
        };
        if self.node.name.trim().is_empty() {
            return Err(invalid("node.name".into(), "must not be empty"));
        }
        for (key, p) in [
            ("node.socket", &self.node.socket),
            ("node.podman_socket", &self.node.podman_socket),
            ("node.jobs_dir", &self.node.jobs_dir),
            ("node.test_dir", &self.node.test_dir),
        ] {
            if !p.is_absolute() {
                return Err(invalid(key.into(), "must be an absolute path"));
            }
        }
        for (i, d) in self.devices.iter().enumerate() {
            let key = |k: &str| format!("devices[{i}].{k}");
            match (&d.serial, &d.pci, &d.loop_backing_file) {
                (_, _, Some(f)) => {
                    if !f.is_absolute() {
                        return Err(invalid(
                            key("loop_backing_file"),
                            "must be an absolute path",
                        ));
                    }
                }
                (Some(_), Some(_), None) => {}
                (None, _, None) => {
                    return Err(invalid(key("serial"), "is required (with `pci`)"));
                }
                (Some(_), None, None) => {
                    return Err(invalid(key("pci"), "is required (with `serial`)"));
                }
            }
            if let Some(s) = &d.serial {
                if s.trim().is_empty() || s.trim() != s {
                    return Err(invalid(
                        key("serial"),
                        "must be non-empty without surrounding spaces",
                    ));
                }
            }
            if let Some(p) = &d.pci {
                if !is_pci_address(p) {
                    return Err(invalid(
                        key("pci"),
                        "must be a full PCI address like 0000:5e:00.0",
                    ));
                }
            }
            if d.nsid == Some(0) {
                return Err(invalid(key("nsid"), "must be 1 or more"));
            }
            if d.size_bytes == Some(0) {
                return Err(invalid(key("size_bytes"), "must be more than 0"));
            }
            for (j, other) in self.devices.iter().enumerate().take(i) {
                let same_ns = d.serial.is_some()
                    && d.serial == other.serial
                    && (d.nsid == other.nsid || d.nsid.is_none() || other.nsid.is_none());
                let same_file =
                    d.loop_backing_file.is_some() && d.loop_backing_file == other.loop_backing_file;
                if same_ns || same_file {
                    return Err(invalid(
                        key("serial"),
                        &format!("names the same device as devices[{j}]"),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `dddd:bb:dd.f` in lower-case hex, as sysfs spells PCI addresses.
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    b.len() == 12
        && hex(0..4)
        && b[4] == b':'
        && hex(5..7)
        && b[7] == b':'
        && hex(8..10)
        && b[10] == b'.'
        && (b'0'..=b'7').contains(&b[11])
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[node]
name = "da1"
socket = "/run/gpuq-node.sock"
podman_socket = "/run/podman/podman.sock"
jobs_dir = "/var/lib/gpuqueue-daos/jobs"
test_dir = "/var/lib/gpuqueue-daos-test"
"#;

    fn parse(extra: &str) -> Result<NodeConfig, ConfigError> {
        NodeConfig::parse(Path::new("/etc/x.toml"), &format!("{BASE}{extra}"))
    }

    #[test]
    fn accepts_nvme_entry() {
        let c = parse(
            "[[devices]]\nserial = \"FAKE-1\"\npci = \"0000:5e:00.0\"\nnsid = 1\nsize_bytes = 4096\n",
        )
        .unwrap();
        assert_eq!(c.devices.len(), 1);
        assert!(!c.node.allow_loop_devices);
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let e = parse("[[devices]]\nseriall = \"X\"\npci = \"0000:5e:00.0\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/x.toml") && e.contains("seriall"), "{e}");
    }

    #[test]
    fn missing_pci_is_named() {
        let e = parse("[[devices]]\nserial = \"X\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("devices[0].pci"), "{e}");
    }

    #[test]
    fn bad_pci_is_refused() {
        let e = parse("[[devices]]\nserial = \"X\"\npci = \"5e:00.0\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("devices[0].pci"), "{e}");
    }

    #[test]
    fn duplicate_serial_is_refused() {
        let e = parse(
            "[[devices]]\nserial = \"X\"\npci = \"0000:5e:00.0\"\n[[devices]]\nserial = \"X\"\npci = \"0000:5f:00.0\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("devices[1]"), "{e}");
    }

    #[test]
    fn relative_jobs_dir_is_refused() {
        let t = BASE.replace("/var/lib/gpuqueue-daos/jobs", "jobs");
        let e = NodeConfig::parse(Path::new("/x.toml"), &t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("node.jobs_dir"), "{e}");
    }

    #[test]
    fn pci_address_shape() {
        assert!(is_pci_address("0000:5e:00.0"));
        assert!(!is_pci_address("0000:5E:00.0"));
        assert!(!is_pci_address("0000:5e:00.8"));
        assert!(!is_pci_address("0000:5e:0.0"));
    }
}
