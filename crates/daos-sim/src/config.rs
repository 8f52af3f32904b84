//! Strict parsers for `daos_server.yml`, dmg's `control.yml` and
//! `daos_agent.yml`.
//!
//! DAOS parses its configs with `yaml.UnmarshalStrict`
//! (src/control/server/config/server.go): a key it does not know is fatal.
//! Every struct here is `deny_unknown_fields` and accepts exactly the keys of
//! daos.md's 2.8 template, DAOS 2.6's `access_points` as the alternative, and
//! the few further real DAOS keys that its minimal test config
//! (`utils/config/examples/daos_server_local.yml`) or a test node needs
//! (`disable_hugepages`, `allow_thp`, `fault_path`, ...). The error message
//! imitates yaml.v2's: `yaml: unmarshal errors:\n  line N: field K not found
//! in type config.Server`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::SimError;

/// DAOS's default control port.
pub const DEFAULT_PORT: u16 = 10001;

/// `daos_server.yml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// 2.8 (and 2.6.x late releases).
    #[serde(default)]
    pub mgmt_svc_replicas: Option<Vec<String>>,
    /// 2.6; deprecated in 2.8. Both together is an error.
    #[serde(default)]
    pub access_points: Option<Vec<String>>,
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub transport_config: TransportConfig,
    #[serde(default)]
    pub control_metadata: Option<ControlMetadata>,
    #[serde(default)]
    pub disable_vfio: bool,
    #[serde(default)]
    pub disable_hugepages: bool,
    #[serde(default)]
    pub allow_thp: bool,
    #[serde(default)]
    pub nr_hugepages: Option<i64>,
    /// GiB; absent: the version's default (crate::checks).
    #[serde(default)]
    pub system_ram_reserved: Option<i64>,
    /// Real DAOS key: the fault domain of this host (default `/<hostname>`).
    #[serde(default)]
    pub fault_path: Option<String>,
    #[serde(default)]
    pub control_log_file: Option<String>,
    #[serde(default)]
    pub control_log_mask: Option<String>,
    #[serde(default)]
    pub helper_log_file: Option<String>,
    #[serde(default)]
    pub socket_dir: Option<String>,
    #[serde(default)]
    pub telemetry_port: Option<u16>,
    #[serde(default)]
    pub engines: Vec<EngineConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlMetadata {
    pub path: PathBuf,
    #[serde(default)]
    pub device: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportConfig {
    #[serde(default)]
    pub allow_insecure: bool,
    #[serde(default)]
    pub client_cert_dir: Option<String>,
    #[serde(default)]
    pub ca_cert: Option<String>,
    #[serde(default)]
    pub cert: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub server_name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    #[serde(default = "default_targets")]
    pub targets: u32,
    #[serde(default)]
    pub nr_xs_helpers: Option<u32>,
    #[serde(default)]
    pub first_core: Option<u32>,
    #[serde(default)]
    pub pinned_numa_node: Option<u32>,
    #[serde(default)]
    pub fabric_iface: Option<String>,
    #[serde(default = "default_fabric_port")]
    pub fabric_iface_port: u16,
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub log_file: Option<String>,
    #[serde(default)]
    pub log_mask: Option<String>,
    #[serde(default)]
    pub env_vars: Vec<String>,
    #[serde(default)]
    pub storage: Vec<TierConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    pub class: String,
    #[serde(default)]
    pub scm_mount: Option<String>,
    #[serde(default)]
    pub scm_size: Option<u64>,
    #[serde(default)]
    pub scm_list: Vec<String>,
    #[serde(default)]
    pub scm_hugepages_disabled: Option<bool>,
    #[serde(default)]
    pub bdev_list: Vec<String>,
    /// GiB, for `class: file`.
    #[serde(default)]
    pub bdev_size: Option<u64>,
    #[serde(default)]
    pub bdev_roles: Vec<String>,
    #[serde(default)]
    pub bdev_busid_range: Option<String>,
}

fn default_name() -> String {
    "daos_server".into()
}
fn default_port() -> u16 {
    DEFAULT_PORT
}
fn default_targets() -> u32 {
    4
}
fn default_fabric_port() -> u16 {
    31416
}

/// dmg's `daos_control.yml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default = "default_hostlist")]
    pub hostlist: Vec<String>,
    #[serde(default)]
    pub transport_config: TransportConfig,
}

fn default_hostlist() -> Vec<String> {
    vec!["localhost".into()]
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            name: default_name(),
            port: DEFAULT_PORT,
            hostlist: default_hostlist(),
            transport_config: TransportConfig::default(),
        }
    }
}

/// `daos_agent.yml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    #[serde(default = "default_name")]
    pub name: String,
    #[serde(default)]
    pub access_points: Vec<String>,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default)]
    pub runtime_dir: Option<PathBuf>,
    #[serde(default)]
    pub log_file: Option<String>,
    #[serde(default)]
    pub control_log_mask: Option<String>,
    #[serde(default)]
    pub transport_config: TransportConfig,
    #[serde(default)]
    pub fabric_ifaces: Option<serde_norway::Value>,
    #[serde(default)]
    pub exclude_fabric_ifaces: Vec<String>,
    #[serde(default)]
    pub disable_caching: bool,
    #[serde(default)]
    pub cache_expiration: Option<u64>,
    #[serde(default)]
    pub disable_auto_evict: bool,
    #[serde(default)]
    pub telemetry_port: Option<u16>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            name: default_name(),
            access_points: vec!["localhost".into()],
            port: DEFAULT_PORT,
            runtime_dir: None,
            log_file: None,
            control_log_mask: None,
            transport_config: TransportConfig::default(),
            fabric_ifaces: None,
            exclude_fabric_ifaces: Vec::new(),
            disable_caching: false,
            cache_expiration: None,
            disable_auto_evict: false,
            telemetry_port: None,
        }
    }
}

/// Parses YAML text strictly into `T`; `path` is only for messages.
pub fn parse_strict<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &Path,
) -> Result<T, SimError> {
    serde_norway::from_str(text).map_err(|e| SimError::Config {
        path: path.to_path_buf(),
        msg: yaml_v2_message(&e),
    })
}

fn read(path: &Path) -> Result<String, SimError> {
    std::fs::read_to_string(path).map_err(|source| SimError::Io {
        what: format!("read config {}", path.display()),
        source,
    })
}

/// Reshapes serde's "unknown field `x`, expected one of ..." into yaml.v2's
/// strict-mode wording, with the Go type DAOS would name.
fn yaml_v2_message(e: &serde_norway::Error) -> String {
    let msg = e.to_string();
    let line = e.location().map(|l| l.line()).unwrap_or(0);
    if let Some((_, rest)) = msg.split_once("unknown field `") {
        let field = rest.split('`').next().unwrap_or("");
        // Name the Go type from the list of fields it expected.
        let msg = rest.split_once("expected").map(|(_, e)| e).unwrap_or("");
        let go_type = if msg.contains("`mgmt_svc_replicas`") {
            "config.Server"
        } else if msg.contains("`fabric_iface_port`") {
            "engine.Config"
        } else if msg.contains("`bdev_list`") {
            "storage.TierConfig"
        } else if msg.contains("`allow_insecure`") {
            "security.TransportConfig"
        } else if msg.contains("`hostlist`") {
            "control.Config"
        } else if msg.contains("`runtime_dir`") {
            "main.Config"
        } else if msg.contains("`device`") {
            "storage.ControlMetadata"
        } else {
            "config"
        };
        return format!(
            "yaml: unmarshal errors:\n  line {line}: field {field} not found in type {go_type}"
        );
    }
    format!("yaml: {msg}")
}

impl ServerConfig {
    /// Reads and validates `daos_server.yml`.
    pub fn load(path: &Path) -> Result<Self, SimError> {
        let cfg: Self = parse_strict(&read(path)?, path)?;
        cfg.validate().map_err(|msg| SimError::Config {
            path: path.to_path_buf(),
            msg,
        })?;
        Ok(cfg)
    }

    /// The checks DAOS makes after parsing (crate::checks, for the version
    /// the simulator plays), then the simulator's own limits.
    pub fn validate(&self) -> Result<(), String> {
        let v = crate::checks::Version::from_env()?;
        crate::checks::validate_server(self, v)?;
        if self.mgmt_svc_replicas.is_some() && self.access_points.is_some() {
            return Err("mgmt_svc_replicas and access_points are both set; \
                        access_points is deprecated, use only mgmt_svc_replicas"
                .into());
        }
        let reps = self.replicas();
        if reps.is_empty() {
            return Err("no mgmt_svc_replicas specified in config".into());
        }
        if reps.len() % 2 == 0 {
            return Err(format!(
                "the number of mgmt_svc_replicas must be odd (got {})",
                reps.len()
            ));
        }
        if self.engines.len() != 1 {
            return Err(format!(
                "the simulator runs exactly one engine per server (config has {})",
                self.engines.len()
            ));
        }
        for tier in &self.engines[0].storage {
            match tier.class.as_str() {
                "ram" | "dcpm" => {
                    if tier.scm_mount.is_none() {
                        return Err(format!(
                            "storage class {}: scm_mount is required",
                            tier.class
                        ));
                    }
                }
                "file" => {
                    if tier.bdev_size.is_none() {
                        return Err("storage class file: bdev_size is required".into());
                    }
                }
                "nvme" | "kdev" => {}
                other => return Err(format!("unsupported storage class {other:?}")),
            }
        }
        if self.metadata_path().is_none() {
            return Err("control_metadata.path or an scm_mount is required".into());
        }
        Ok(())
    }

    /// `mgmt_svc_replicas`, or 2.6's `access_points`.
    pub fn replicas(&self) -> Vec<String> {
        self.mgmt_svc_replicas
            .clone()
            .or_else(|| self.access_points.clone())
            .unwrap_or_default()
    }

    /// Where the control metadata lives: `control_metadata.path`, else (as in
    /// DAOS without MD-on-SSD) the first SCM mount.
    pub fn metadata_path(&self) -> Option<PathBuf> {
        if let Some(m) = &self.control_metadata {
            return Some(m.path.clone());
        }
        self.engines
            .first()?
            .storage
            .iter()
            .find_map(|t| t.scm_mount.as_ref().map(PathBuf::from))
    }
}

/// Reads a client config (dmg's or the agent's) strictly and refuses a
/// system name DAOS refuses (lib/control/config.go, cmd/daos_agent/
/// config.go `Validate`).
fn load_client<T: serde::de::DeserializeOwned>(
    path: &Path,
    name: impl Fn(&T) -> &str,
) -> Result<T, SimError> {
    let c: T = parse_strict(&read(path)?, path)?;
    crate::checks::check_system_name(name(&c)).map_err(|msg| SimError::Config {
        path: path.to_path_buf(),
        msg,
    })?;
    Ok(c)
}

impl ControlConfig {
    pub fn load(path: &Path) -> Result<Self, SimError> {
        load_client(path, |c: &Self| &c.name)
    }
}

impl AgentConfig {
    pub fn load(path: &Path) -> Result<Self, SimError> {
        load_client(path, |c: &Self| &c.name)
    }
}

/// Resolves `host[:port]` with `default_port`. Names are looked up in
/// `/etc/hosts` first: the static binary runs in a FROM-scratch image, where
/// glibc's NSS modules cannot be loaded, and the test cluster names its hosts
/// there. Then the system resolver.
pub fn resolve(host: &str, default_port: u16) -> Result<SocketAddr, SimError> {
    let (name, port) = match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse::<u16>() {
            Ok(p) => (h, p),
            Err(_) => {
                return Err(SimError::Resolve {
                    host: host.to_string(),
                    msg: format!("invalid port {p:?}"),
                })
            }
        },
        _ => (host, default_port),
    };
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if let Ok(text) = std::fs::read_to_string("/etc/hosts") {
        if let Some(ip) = lookup_hosts(&text, name) {
            return Ok(SocketAddr::new(ip, port));
        }
    }
    (name, port)
        .to_socket_addrs()
        .map_err(|e| SimError::Resolve {
            host: host.to_string(),
            msg: e.to_string(),
        })?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| SimError::Resolve {
            host: host.to_string(),
            msg: "no IPv4 address".into(),
        })
}

/// The first IPv4 address for `name` in hosts-file text.
fn lookup_hosts(text: &str, name: &str) -> Option<std::net::IpAddr> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let ip: std::net::IpAddr = words.next()?.parse().ok()?;
            (ip.is_ipv4() && words.any(|w| w.eq_ignore_ascii_case(name))).then_some(ip)
        })
        .next()
}

/// Parses the `env_vars` list (`K=V`) into a map.
pub fn env_map(vars: &[String]) -> BTreeMap<String, String> {
    vars.iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "
name: daos_server
port: 10001
mgmt_svc_replicas: ['da1', 'da2', 'da3']
provider: ofi+tcp
transport_config: {allow_insecure: true}
control_metadata: {path: /tmp/x/control_meta}
disable_vfio: true
engines:
  - targets: 4
    fabric_iface: eth0
    fabric_iface_port: 31416
    storage:
      - {class: ram, scm_mount: /mnt/daos, scm_size: 16}
      - {class: file, bdev_list: [/tmp/x/bdev0], bdev_size: 16, bdev_roles: [wal, meta, data]}
";

    fn parse(text: &str) -> Result<ServerConfig, String> {
        let c: ServerConfig = parse_strict(text, Path::new("t.yml")).map_err(|e| e.to_string())?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn the_daos_md_template_parses() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.replicas(), ["da1", "da2", "da3"]);
        assert!(c.transport_config.allow_insecure);
        assert_eq!(c.metadata_path().unwrap(), Path::new("/tmp/x/control_meta"));
    }

    /// DAOS 2.6.4–2.8.0 refused the template daos.md had before 2026-12-07
    /// (and every render gpuq made from it): control_metadata.path without
    /// MD-on-SSD roles.
    #[test]
    fn control_metadata_without_bdev_roles_is_refused_like_daos() {
        let e = parse(&GOOD.replace(", bdev_roles: [wal, meta, data]", "")).unwrap_err();
        assert_eq!(
            e,
            "I/O Engine 0 failed config validation: storage: code = 317 description = \"using 'control_metadata.path' requires MD-on-SSD roles\""
        );
        let e = parse(&GOOD.replace("control_metadata: {path: /tmp/x/control_meta}\n", ""))
            .unwrap_err();
        assert!(e.contains("code = 318"), "{e}");
        let e = parse(&GOOD.replace("[wal, meta, data]", "[wal, data]")).unwrap_err();
        assert!(e.contains("code = 319"), "{e}");
        let e = parse(&GOOD.replace("scm_size: 16", "scm_size: 1")).unwrap_err();
        assert!(
            e.ends_with("code = 730 description = \"configured ram-disk size 1.0 GiB is lower than the minimum (4.0 GiB) required for SCM\""),
            "{e}"
        );
        let e = parse(&format!("{GOOD}system_ram_reserved: 0\n")).unwrap_err();
        assert!(e.contains("code = 734"), "{e}");
        let e = parse(&GOOD.replace("name: daos_server", "name: daos_server_16chr")).unwrap_err();
        assert_eq!(e, "invalid system name: \"daos_server_16chr\"");
    }

    #[test]
    fn memory_must_hold_hugepages_reservation_and_ram_disk() {
        use crate::checks::{check_memory, MemInfo, Version};
        let mem = MemInfo {
            mem_total: 24 << 30,
            hugepage_size: 2 << 20,
        };
        let c = parse(GOOD).unwrap();
        // 2.8 keeps 64 GiB for the system by default: a 24 GiB host fails.
        let e = check_memory(&c, Version::V2_8, mem).unwrap_err();
        assert!(
            e.contains("insufficient ram to meet minimum requirements"),
            "{e}"
        );
        // 2.6's 16 GiB + 5 GiB of hugepages (4 targets + 1) + 1 GiB leaves
        // 2 GiB, under the 4 GiB minimum ram-disk.
        let e = check_memory(&c, Version::V2_6, mem).unwrap_err();
        assert!(e.starts_with("storage: code = 214"), "{e}");
        // A reservation that fits, but a ram-disk larger than what is left.
        let fits = parse(&format!("{GOOD}system_ram_reserved: 4\n")).unwrap();
        let e = check_memory(&fits, Version::V2_8, mem).unwrap_err();
        assert!(e.contains("code = 731"), "{e}");
        let ok = parse(
            &format!("{GOOD}system_ram_reserved: 2\n").replace("scm_size: 16", "scm_size: 4"),
        )
        .unwrap();
        assert_eq!(check_memory(&ok, Version::V2_8, mem), Ok(2560));
        // Test mode: no hugepages beside file bdevs is 2.8's rule; 2.6
        // refuses it beside any bdev.
        let nohuge = parse(
            &format!("{GOOD}system_ram_reserved: 2\ndisable_hugepages: true\n")
                .replace("scm_size: 16", "scm_size: 4"),
        )
        .unwrap();
        assert_eq!(check_memory(&nohuge, Version::V2_8, mem), Ok(0));
        let e = check_memory(&nohuge, Version::V2_6, mem).unwrap_err();
        assert!(e.contains("code = 726"), "{e}");
    }

    #[test]
    fn unknown_top_level_key_is_fatal_like_unmarshal_strict() {
        let e = parse(&format!("{GOOD}bogus_key: 1\n")).unwrap_err();
        assert!(
            e.contains("field bogus_key not found in type config.Server"),
            "{e}"
        );
        assert!(e.contains("line 16"), "{e}");
    }

    #[test]
    fn unknown_nested_key_is_fatal() {
        let e = parse(&GOOD.replace("targets: 4", "targets: 4\n    tragets: 4")).unwrap_err();
        assert!(
            e.contains("field tragets not found in type engine.Config"),
            "{e}"
        );
    }

    #[test]
    fn access_points_alone_is_accepted_but_not_with_replicas() {
        let v26 = GOOD.replace("mgmt_svc_replicas", "access_points");
        assert_eq!(parse(&v26).unwrap().replicas().len(), 3);
        let both = format!("{GOOD}access_points: ['da1']\n");
        assert!(parse(&both).unwrap_err().contains("both set"));
    }

    #[test]
    fn replica_count_must_be_odd() {
        let e = parse(&GOOD.replace("['da1', 'da2', 'da3']", "['da1', 'da2']")).unwrap_err();
        assert!(e.contains("must be odd"), "{e}");
    }

    #[test]
    fn control_yml_is_strict_too() {
        let ok: ControlConfig =
            parse_strict("name: daos_server\nport: 10001\nhostlist: [da1]\ntransport_config: {allow_insecure: true}\n", Path::new("c")).unwrap();
        assert_eq!(ok.hostlist, ["da1"]);
        let e =
            parse_strict::<ControlConfig>("hostlist: [a]\nextra: 1\n", Path::new("c")).unwrap_err();
        assert!(
            e.to_string()
                .contains("field extra not found in type control.Config"),
            "{e}"
        );
    }

    #[test]
    fn agent_yml_is_strict_too() {
        let ok: AgentConfig = parse_strict(
            "name: daos_server\naccess_points: [da1]\nport: 10001\ntransport_config: {allow_insecure: true}\nfabric_ifaces: []\n",
            Path::new("a"),
        )
        .unwrap();
        assert_eq!(ok.access_points, ["da1"]);
        let e = parse_strict::<AgentConfig>(
            "access_points: [da1]\nmgmt_svc_replicas: [da1]\n",
            Path::new("a"),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("field mgmt_svc_replicas not found in type main.Config"),
            "{e}"
        );
    }

    #[test]
    fn resolve_keeps_explicit_ports() {
        assert_eq!(resolve("127.0.0.1:4242", 1).unwrap().port(), 4242);
        assert_eq!(resolve("127.0.0.1", 10001).unwrap().port(), 10001);
        assert!(resolve("127.0.0.1:x", 1).is_err());
        let hosts = "127.0.0.1 localhost\n# c\n::1 da1\n10.200.0.2 da1 da1.local # x\n";
        assert_eq!(
            lookup_hosts(hosts, "da1"),
            Some("10.200.0.2".parse().unwrap())
        );
        assert_eq!(lookup_hosts(hosts, "da2"), None);
    }
}
