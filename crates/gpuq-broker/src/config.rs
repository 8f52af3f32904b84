//! `broker.toml`: the broker's configuration.
//!
//! Every key is named in `config/cxl2.toml`, which documents it. Unknown keys
//! are errors (a typo must not silently fall back to a default), and every
//! error names the file, the key and what was expected. The file must be
//! owned by root and not writable by group or others (sshd's StrictModes
//! rule): whoever can write it decides what runs as root.

use gpuq_protocol::duration;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use thiserror::Error;

pub use gpuq_lifecycle::config::{DaosConfig, DaosNode, DaosProfile};

pub const DEFAULT_CONFIG: &str = "/etc/gpuqueue-daos/broker.toml";
pub const DEFAULT_SOCKET: &str = "/run/gpuq/broker.sock";

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
    #[error("config {path} may have been written by someone other than root: {why}\nhint: `chown root:root {path} && chmod go-w {path}` (and the same for its directory)")]
    Unsafe { path: PathBuf, why: String },
}

impl From<gpuq_conffile::ConfFileError> for ConfigError {
    fn from(e: gpuq_conffile::ConfFileError) -> Self {
        use gpuq_conffile::ConfFileError as E;
        match e {
            E::Read { path, source } => ConfigError::Read { path, source },
            E::Unsafe { path, why } => ConfigError::Unsafe { path, why },
            E::Parse { path, message } => ConfigError::Parse { path, message },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunnerKind {
    /// A transient systemd unit per job, through systemd's D-Bus API.
    Systemd,
    /// Fork + own cgroup v2 directory, for hosts without systemd (tests, demo).
    Direct,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuKind {
    /// Ask NVML (libnvidia-ml, loaded at run time) for compute processes.
    Nvml,
    /// No GPU on this host: the GPU is always idle.
    None,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    broker: RawBroker,
    daos: Option<gpuq_lifecycle::config::RawDaos>,
    #[serde(default)]
    install: gpuq_manifest::InstallPaths,
    metrics: Option<RawMetrics>,
    slurm: Option<RawSlurm>,
}

/// `[slurm]`: where gpuq-slurm's configuration is, so that `gpuq
/// daos-exec` also serves the Slurm DAOS jobs it runs on this host
/// (docs/slurm.md). Off unless `config` is set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlurm {
    config: Option<PathBuf>,
    /// This host's Slurm NodeName: `agent_host` (the default) or one of
    /// gpuq-slurm's `[[slurm.gpu_hosts]]`.
    node: Option<String>,
}

/// `[metrics]`: the OpenMetrics endpoint (src/metrics.rs). Off unless
/// `listen` is set.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBroker {
    socket: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    log_root: Option<PathBuf>,
    maintenance_file: Option<PathBuf>,
    runner: Option<RunnerKind>,
    cgroup_parent: Option<PathBuf>,
    gpu: Option<GpuKind>,
    default_time: Option<String>,
    max_time: Option<String>,
    max_connections: Option<usize>,
    max_connections_per_user: Option<usize>,
    request_timeout: Option<String>,
    write_timeout: Option<String>,
    max_request_bytes: Option<usize>,
    max_queued_per_user: Option<usize>,
}

/// What one user may take of the broker (`[broker]` keys of the same names;
/// config/cxl2.toml documents them, docs/design.md says why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Open API connections of all users but root together.
    pub max_connections: usize,
    /// Open API connections of one UID (root's too; root does not count
    /// against `max_connections`, so a flood never locks the operator out).
    pub max_connections_per_user: usize,
    /// The request head, and then its body, must each arrive within this;
    /// an idle keep-alive connection is closed after it.
    pub request_timeout_secs: u64,
    /// An answer (not a `follow` or `daos-exec` stream) that the client
    /// does not read for this long ends the connection.
    pub write_timeout_secs: u64,
    /// Largest request body.
    pub max_request_bytes: usize,
    /// Queued jobs of one user (root is not limited).
    pub max_queued_per_user: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 512,
            max_connections_per_user: 64,
            request_timeout_secs: 10,
            write_timeout_secs: 30,
            max_request_bytes: 1024 * 1024,
            max_queued_per_user: 1000,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Where this configuration came from (for messages).
    pub source: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub log_root: PathBuf,
    pub maintenance_file: PathBuf,
    pub runner: RunnerKind,
    pub cgroup_parent: PathBuf,
    pub gpu: GpuKind,
    pub default_time_secs: u64,
    pub max_time_secs: u64,
    pub limits: Limits,
    pub daos: Option<DaosConfig>,
    /// `[install]`: this host's manifests and install root, for
    /// `gpuq verify-install` (defaults: the packages'; tests set both).
    pub install: gpuq_manifest::InstallPaths,
    /// `[daos] enabled = false`: the section is there but DAOS jobs are
    /// off (then `daos` is `None`). Only for the messages.
    pub daos_disabled: bool,
    /// `[metrics] listen`: where `GET /metrics` is served (TCP); `None`: off.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `[slurm] config`: gpuq-slurm's configuration; `None`: `daos-exec`
    /// serves gpuq's own jobs only.
    pub slurm_config: Option<PathBuf>,
    /// `[slurm] node`: this host's Slurm NodeName; `None`: gpuq-slurm's
    /// `agent_host`.
    pub slurm_node: Option<String>,
}

impl BrokerConfig {
    /// Why DAOS requests are refused when there is no enabled `[daos]`:
    /// one line, `what` saying what was asked for.
    pub fn daos_off(&self, what: &str) -> String {
        if self.daos_disabled {
            format!(
                "{what}: DAOS is disabled on this host (enabled = false in [daos] of {}); ask the operator",
                self.source.display()
            )
        } else {
            format!(
                "{what}: DAOS jobs are not enabled on this broker (no [daos] in {})",
                self.source.display()
            )
        }
    }

    /// Read, check ownership/permissions, parse and validate.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = gpuq_conffile::read_trusted(path)?;
        Self::parse(path, &text)
    }

    /// Parse and validate text that came from `path` (no file-system checks).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let raw: RawFile = gpuq_conffile::parse_toml(path, text)?;
        let b = raw.broker;
        let invalid = |key, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        };
        let abs = |key: &'static str, p: Option<PathBuf>, default: &str| {
            gpuq_lifecycle::config::absolute(key, p, default).map_err(|e| invalid(e.key, e.message))
        };
        let dur = |key: &'static str, v: Option<String>, default: &str| {
            let v = v.unwrap_or_else(|| default.to_string());
            duration::parse(&v).map_err(|e| invalid(key, e.to_string()))
        };
        let cfg = BrokerConfig {
            source: path.to_path_buf(),
            socket: abs("broker.socket", b.socket, DEFAULT_SOCKET)?,
            state_dir: abs("broker.state_dir", b.state_dir, "/var/lib/gpuqueue-daos")?,
            log_root: abs("broker.log_root", b.log_root, "/mnt/nvme1/gpuqueue/logs")?,
            maintenance_file: abs(
                "broker.maintenance_file",
                b.maintenance_file,
                "/etc/gpuqueue-daos/maintenance.json",
            )?,
            runner: b.runner.unwrap_or(RunnerKind::Systemd),
            cgroup_parent: abs(
                "broker.cgroup_parent",
                b.cgroup_parent,
                "/sys/fs/cgroup/gpuq",
            )?,
            gpu: b.gpu.unwrap_or(GpuKind::Nvml),
            default_time_secs: dur("broker.default_time", b.default_time, "4h")?,
            max_time_secs: dur("broker.max_time", b.max_time, "7d")?,
            limits: {
                let d = Limits::default();
                let count = |key: &'static str, v: Option<usize>, default: usize, max: usize| {
                    let v = v.unwrap_or(default);
                    if v == 0 || v > max {
                        Err(invalid(key, format!("expected 1 to {max}, got {v}")))
                    } else {
                        Ok(v)
                    }
                };
                let secs = |key: &'static str, v: Option<String>, default: u64| match v {
                    None => Ok(default),
                    Some(v) => dur(key, Some(v), "").and_then(|s| {
                        if s > 3600 {
                            Err(invalid(
                                key,
                                format!("expected at most 1h, got {}", duration::format(s)),
                            ))
                        } else {
                            Ok(s)
                        }
                    }),
                };
                Limits {
                    max_connections: count(
                        "broker.max_connections",
                        b.max_connections,
                        d.max_connections,
                        1 << 20,
                    )?,
                    max_connections_per_user: count(
                        "broker.max_connections_per_user",
                        b.max_connections_per_user,
                        d.max_connections_per_user,
                        1 << 20,
                    )?,
                    request_timeout_secs: secs(
                        "broker.request_timeout",
                        b.request_timeout,
                        d.request_timeout_secs,
                    )?,
                    write_timeout_secs: secs(
                        "broker.write_timeout",
                        b.write_timeout,
                        d.write_timeout_secs,
                    )?,
                    max_request_bytes: count(
                        "broker.max_request_bytes",
                        b.max_request_bytes,
                        d.max_request_bytes,
                        64 << 20,
                    )?,
                    max_queued_per_user: count(
                        "broker.max_queued_per_user",
                        b.max_queued_per_user,
                        d.max_queued_per_user,
                        1 << 30,
                    )?,
                }
            },
            daos: None,
            install: raw.install,
            daos_disabled: false,
            slurm_node: raw.slurm.as_ref().and_then(|s| s.node.clone()),
            slurm_config: match raw.slurm.and_then(|s| s.config) {
                None => None,
                Some(p) => Some(abs("slurm.config", Some(p), "")?),
            },
            metrics_listen: match raw.metrics.and_then(|m| m.listen) {
                None => None,
                Some(a) => Some(a.parse().map_err(|_| {
                    invalid(
                        "metrics.listen",
                        format!(
                            "expected an IP address and port such as \"127.0.0.1:9464\", got '{a}'"
                        ),
                    )
                })?),
            },
        };
        if let Some(key) = cfg.install.invalid_key() {
            return Err(invalid(key, "expected an absolute path".into()));
        }
        let mut cfg = cfg;
        match raw.daos {
            // Disabled: the other keys were read (types, unknown keys) but
            // are not checked: an operator fills them in while it is off.
            Some(d) if d.enabled == Some(false) => cfg.daos_disabled = true,
            Some(d) => {
                cfg.daos =
                    Some(gpuq_lifecycle::config::parse(d).map_err(|e| invalid(e.key, e.message))?)
            }
            None => {}
        }
        if cfg.default_time_secs > cfg.max_time_secs {
            return Err(invalid(
                "broker.default_time",
                format!(
                    "{} is longer than broker.max_time {}",
                    duration::format(cfg.default_time_secs),
                    duration::format(cfg.max_time_secs)
                ),
            ));
        }
        Ok(cfg)
    }
}

/// Refuse a config file that someone other than root could have written
/// (see `gpuq_conffile`).
pub fn check_ownership(path: &Path) -> Result<(), ConfigError> {
    gpuq_conffile::read_trusted(path).map(|_| ())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BrokerConfig, ConfigError> {
        BrokerConfig::parse(Path::new("/etc/gpuqueue-daos/broker.toml"), text)
    }

    #[test]
    fn defaults_fill_missing_keys() {
        let c = parse("[broker]\n").unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/gpuq/broker.sock"));
        assert_eq!(c.log_root, PathBuf::from("/mnt/nvme1/gpuqueue/logs"));
        assert_eq!(c.runner, RunnerKind::Systemd);
        assert_eq!(c.gpu, GpuKind::Nvml);
        assert_eq!(c.default_time_secs, 4 * 3600);
    }

    #[test]
    fn install_paths_default_to_the_packages_and_must_be_absolute() {
        let c = parse("[broker]\n").unwrap();
        assert_eq!(
            c.install.manifest_dir,
            PathBuf::from("/usr/share/gpuq/manifests")
        );
        assert_eq!(c.install.prefix, PathBuf::from("/"));
        let e = parse("[broker]\n[install]\nmanifest_dir = \"m\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("install.manifest_dir") && e.contains("absolute"),
            "{e}"
        );
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let e = parse("[broker]\nsokcet = \"/x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/etc/gpuqueue-daos/broker.toml"), "{e}");
        assert!(e.contains("sokcet"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key_and_the_expectation() {
        let e = parse("[broker]\ndefault_time = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("broker.default_time") && e.contains("1h30m"),
            "{e}"
        );
        let e = parse("[broker]\nstate_dir = \"var/lib\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("broker.state_dir") && e.contains("absolute"),
            "{e}"
        );
        let e = parse("[broker]\nrunner = \"ts\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("runner") && e.contains("systemd"), "{e}");
        let e = parse("[broker]\ndefault_time = \"8d\"\nmax_time=\"1d\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_time"), "{e}");
    }

    #[test]
    fn limits_have_defaults_and_bad_ones_name_the_key() {
        let c = parse("[broker]\n").unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.limits.max_request_bytes, 1024 * 1024);
        let c = parse(
            "[broker]\nmax_connections = 10\nmax_connections_per_user = 2\nrequest_timeout = \"2s\"\n\
             write_timeout = \"1m\"\nmax_request_bytes = 4096\nmax_queued_per_user = 3\n",
        )
        .unwrap();
        assert_eq!(
            c.limits,
            Limits {
                max_connections: 10,
                max_connections_per_user: 2,
                request_timeout_secs: 2,
                write_timeout_secs: 60,
                max_request_bytes: 4096,
                max_queued_per_user: 3,
            }
        );
        for (text, key) in [
            ("max_connections = 0", "broker.max_connections"),
            (
                "max_connections_per_user = 0",
                "broker.max_connections_per_user",
            ),
            ("max_queued_per_user = 0", "broker.max_queued_per_user"),
            ("max_request_bytes = 0", "broker.max_request_bytes"),
            ("max_request_bytes = 1000000000", "broker.max_request_bytes"),
            ("request_timeout = \"soon\"", "broker.request_timeout"),
            ("write_timeout = \"2h\"", "broker.write_timeout"),
        ] {
            let e = parse(&format!("[broker]\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        let e = parse("[broker]\nmax_connection = 5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_connection"), "{e}");
    }

    const DAOS: &str = r#"
[broker]
[daos]
identity_file = "/etc/gpuqueue-daos/id_ed25519"
known_hosts_file = "/etc/gpuqueue-daos/known_hosts"
[[daos.nodes]]
name = "da1"
host = "da1.example"
[daos.profiles.inst1]
image = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
replicas = ["da1.example"]
env = { FI_PROVIDER = "tcp" }
"#;

    #[test]
    fn enabled_false_turns_daos_off_and_leaves_the_rest_unchecked() {
        // The packaged configuration: the section, explicitly off, with
        // nothing filled in yet.
        let c = parse("[broker]\n[daos]\nenabled = false\n").unwrap();
        assert!(c.daos.is_none() && c.daos_disabled);
        let why = c.daos_off("--inst inst1");
        assert!(
            why.contains("DAOS is disabled on this host (enabled = false in [daos] of /etc/gpuqueue-daos/broker.toml); ask the operator"),
            "{why}"
        );
        // A filled-in section stays off while enabled = false ...
        let off = DAOS.replace("[daos]\n", "[daos]\nenabled = false\n");
        let c = parse(&off).unwrap();
        assert!(c.daos.is_none() && c.daos_disabled);
        // ... and unknown keys are still errors.
        let e = parse("[broker]\n[daos]\nenabled = false\nnodez = []\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodez"), "{e}");
        // enabled = true and a missing key: as before, DAOS is on.
        let on = DAOS.replace("[daos]\n", "[daos]\nenabled = true\n");
        assert!(parse(&on).unwrap().daos.is_some());
        assert!(parse(DAOS).unwrap().daos.is_some());
        // Enabled without the required keys names the key.
        let no_key = on.replace("identity_file = \"/etc/gpuqueue-daos/id_ed25519\"\n", "");
        let e = parse(&no_key).unwrap_err().to_string();
        assert!(
            e.contains("daos.identity_file") && e.contains("required"),
            "{e}"
        );
        // Without any [daos], the message says so.
        let c = parse("[broker]\n").unwrap();
        assert!(!c.daos_disabled);
        assert!(c.daos_off("x").contains("no [daos] in"));
    }

    #[test]
    fn metrics_are_off_unless_an_address_is_given() {
        assert_eq!(parse("[broker]\n").unwrap().metrics_listen, None);
        assert_eq!(parse("[broker]\n[metrics]\n").unwrap().metrics_listen, None);
        let c = parse("[broker]\n[metrics]\nlisten = \"127.0.0.1:9464\"\n").unwrap();
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        let c = parse("[broker]\n[metrics]\nlisten = \"[::1]:9464\"\n").unwrap();
        assert_eq!(c.metrics_listen, Some("[::1]:9464".parse().unwrap()));
        for bad in ["localhost:9464", "127.0.0.1", "9464", ""] {
            let e = parse(&format!("[broker]\n[metrics]\nlisten = \"{bad}\"\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("metrics.listen") && e.contains("127.0.0.1:9464") && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
        let e = parse("[broker]\n[metrics]\nlisen = \"127.0.0.1:1\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lisen"), "{e}");
    }

    #[test]
    fn slurm_daos_exec_is_off_unless_gpuq_slurms_config_is_named() {
        assert_eq!(parse("[broker]\n").unwrap().slurm_config, None);
        assert_eq!(parse("[broker]\n[slurm]\n").unwrap().slurm_config, None);
        let c = parse("[broker]\n[slurm]\nconfig = \"/etc/gpuq/slurm.toml\"\n").unwrap();
        assert_eq!(c.slurm_config, Some(PathBuf::from("/etc/gpuq/slurm.toml")));
        let e = parse("[broker]\n[slurm]\nconfig = \"slurm.toml\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("slurm.config") && !e.contains('\n'), "{e}");
        let e = parse("[broker]\n[slurm]\nstate_dir = \"/x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("state_dir"), "{e}");
    }

    /// The example that the package installs as broker.toml parses, and
    /// leaves DAOS off explicitly.
    #[test]
    fn the_shipped_example_parses_with_daos_disabled() {
        let c = parse(include_str!("../../../config/cxl2.toml")).unwrap();
        assert!(c.daos.is_none() && c.daos_disabled);
    }

    #[test]
    fn a_daos_section_is_parsed_with_defaults() {
        let c = parse(DAOS).unwrap();
        let d = c.daos.unwrap();
        assert_eq!(d.nodes[0].address, "da1.example");
        assert_eq!(d.node_socket, PathBuf::from("/run/gpuq/node.sock"));
        assert_eq!(d.profiles["inst1"].system, "daos_server");
        assert_eq!(d.profiles["inst1"].port, 10001);
        assert_eq!(
            d.profiles["inst1"].env,
            vec![("FI_PROVIDER".into(), "tcp".into())]
        );
        assert!(parse("[broker]\n").unwrap().daos.is_none());
        assert_eq!(d.deadlines, gpuq_lifecycle::Deadlines::default());
    }

    #[test]
    fn step_deadlines_are_read_and_a_zero_or_unknown_one_is_refused() {
        let keys = [
            "request_timeout_secs = 7",
            "preflight_timeout_secs = 8",
            "start_timeout_secs = 9",
            "format_timeout_secs = 10",
            "stop_timeout_secs = 11",
            "wipe_timeout_secs = 12",
        ];
        let text = DAOS.replace("[daos]\n", &format!("[daos]\n{}\n", keys.join("\n")));
        let d = parse(&text).unwrap().daos.unwrap().deadlines;
        let s = std::time::Duration::from_secs;
        assert_eq!(
            d,
            gpuq_lifecycle::Deadlines {
                request: s(7),
                preflight: s(8),
                start: s(9),
                format: s(10),
                stop: s(11),
                wipe: s(12),
            }
        );
        let e = parse(&DAOS.replace("[daos]\n", "[daos]\nstop_timeout_secs = 0\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("daos.stop_timeout_secs") && e.contains("1 to 86400"),
            "{e}"
        );
        let e = parse(&DAOS.replace("[daos]\n", "[daos]\nstop_timeout = 5\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("stop_timeout"), "{e}");
    }

    #[test]
    fn a_stor_profile_names_its_kind_and_nfsrdma_this_host_s_address() {
        let c = parse(&format!(
            "{DAOS}[daos.stor.nvme]\nkind = \"nvmeof\"\n[daos.stor.nfs]\nkind = \"nfsrdma\"\nclient_address = \"10.0.0.2\"\n"
        ))
        .unwrap();
        let d = c.daos.as_ref().unwrap();
        assert_eq!(d.stor["nvme"].nfs, None);
        let nfs = d.stor["nfs"].nfs.as_ref().unwrap();
        assert_eq!(nfs.client_address.to_string(), "10.0.0.2");
        assert_eq!(nfs.mount_dir, std::path::Path::new("/run/gpuq/stor"));
        for (bad, key) in [
            ("kind = \"nfsrdma\"", "daos.stor.client_address"),
            (
                "kind = \"nfsrdma\"\nclient_address = \"0.0.0.0\"",
                "daos.stor.client_address",
            ),
            (
                "kind = \"nvmeof\"\nclient_address = \"10.0.0.2\"",
                "daos.stor.client_address",
            ),
            (
                "kind = \"nfsrdma\"\nclient_address = \"10.0.0.2\"\nmount_dir = \"run/x\"",
                "daos.stor.mount_dir",
            ),
            (
                "kind = \"nfsrdma\"\nclient_address = \"10.0.0.2\"\nmount_dir = \"/run/../etc\"",
                "daos.stor.mount_dir",
            ),
            ("kind = \"lustre\"", "daos.stor.kind"),
        ] {
            let e = parse(&format!("{DAOS}[daos.stor.s]\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_daos_values_name_the_key() {
        let cases = [
            (
                "sha256:0000000000000000000000000000000000000000000000000000000000000001",
                "busybox:latest",
                "daos.profiles.image",
            ),
            (
                "replicas = [\"da1.example\"]",
                "replicas = [\"a\", \"b\"]",
                "odd number",
            ),
            (
                "env = { FI_PROVIDER = \"tcp\" }",
                "env = { DAOS_POOL = \"x\" }",
                "DAOS_POOL",
            ),
            (
                "env = { FI_PROVIDER = \"tcp\" }",
                "env = { DAOS_SYSTEM = \"x\" }",
                "set by gpuq",
            ),
            ("name = \"da1\"", "name = \"da 1\"", "daos.nodes.name"),
            (
                "host = \"da1.example\"",
                "host = \"-oProxyCommand=x\"",
                "ssh destination",
            ),
            (
                "identity_file = \"/etc/gpuqueue-daos/id_ed25519\"",
                "identity_file = \"id\"",
                "absolute",
            ),
            ("[daos]\n", "[daos]\nsurprise = 1\n", "surprise"),
            (
                "env = { FI_PROVIDER = \"tcp\" }",
                "env = { FI_PROVIDER = \"tcp\" }\nsystem = \"daos_server_1234\"",
                "daos.profiles.system",
            ),
        ];
        for (from, to, want) in cases {
            assert!(DAOS.contains(from), "{from}");
            let e = parse(&DAOS.replace(from, to)).unwrap_err().to_string();
            assert!(e.contains(want), "{to}: {e}");
        }
        let twice = DAOS.replace(
            "[daos.profiles",
            "[[daos.nodes]]\nname = \"da1\"\nhost = \"x\"\n[daos.profiles",
        );
        assert!(parse(&twice)
            .unwrap_err()
            .to_string()
            .contains("listed twice"));
    }
}
