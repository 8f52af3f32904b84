//! DAOS's YAML configuration files, as gpuq writes them:
//! - [`ServerConfig`]: a storage node's `daos_server.yml`, for exactly one
//!   DAOS version;
//! - [`ControlConfig`]: dmg's `daos_control.yml` on the GPU host;
//! - [`AgentConfig`]: `daos_agent.yml` on the GPU host;
//!
//! the latter two with the client certificates of a [`Transport`].
//!
//! DAOS parses its configuration strictly (`yaml.UnmarshalStrict`): an
//! unknown key is fatal, so what we write must match the pinned image's
//! version (docs/daos-facts.md, "Versions"):
//! - 2.8 names the management-service replicas `mgmt_svc_replicas`
//!   (`access_points` is deprecated there; giving both is an error);
//! - 2.6 only knows `access_points`;
//! - the replica count must be odd (1 or 3 here);
//! - 2.8 (and 2.6.5) refuse to start while transparent hugepages are not
//!   `[never]` unless `allow_thp: true`.
//!
//! Only keys listed in docs/daos-facts.md are written, plus `fault_path`
//! (a documented server key) where hosts share a hostname; server logs go
//! to the container's output, which the node helper keeps per lease.
//!
//! Each `render` first validates every value to a small character set
//! (names, host names and addresses, absolute paths, PCI addresses), then
//! copies the configuration into private `#[derive(Serialize)]` structs
//! whose field order is the key order of DAOS's templates, and serialises
//! them with `serde_norway` (the YAML library daos-sim reads the same files
//! with). The serialiser quotes whatever YAML needs quoted; the validation
//! stays all the same: no input can inject a key, no value is one DAOS
//! would read differently from what was meant, and a refusal names the
//! field at fault. Each lease renders its own server file with its own
//! `control_metadata.path`: a server that finds old metadata rejoins the old
//! system instead of waiting for a format (daos.md "Why a fresh metadata
//! path per job").
//!
//! DAOS's own validation (`daos_server start`, before it touches hardware)
//! is what a render must pass, for each version (docs/daos-facts.md, "What
//! DAOS checks before it starts"):
//! - with `control_metadata.path` set, DAOS runs MD-on-SSD and refuses a
//!   bdev tier without `bdev_roles` (server/storage/config.go,
//!   `Config.Validate`, code 317): one bdev tier carries all three roles,
//!   `[wal, meta, data]`, the co-located layout DAOS allows;
//! - a `class: ram` SCM tier of under 4 GiB is refused (storage/scm.go
//!   `MinRamdiskMem`, code 730);
//! - the host's RAM must hold the hugepages, each engine's reservation,
//!   the ram-disk and `system_ram_reserved` (2.6: 16 GiB, 2.8: 64 GiB by
//!   default; config/server.go `SetRamdiskSize`, codes 214 and 731):
//!   [`MemoryPlan`] sizes the reservation from the node's real memory and
//!   refuses a node that is too small, in one line.
//!
//! The crate is pure: `render` returns the text, the caller writes the file.

use serde::Serialize;
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaosVersion {
    /// 2.6.0 – 2.6.4
    V2_6,
    /// 2.6.5 (knows `allow_thp`)
    V2_6_5,
    /// 2.8.x
    V2_8,
}

impl DaosVersion {
    /// From an RPM version such as `2.6.4-1.el8` or `2.8.0`.
    pub fn parse(s: &str) -> Result<Self, RenderError> {
        let core = s.split(['-', '~']).next().unwrap_or("");
        let mut it = core.split('.').map(|p| p.parse::<u32>());
        match (it.next(), it.next(), it.next()) {
            (Some(Ok(2)), Some(Ok(6)), Some(Ok(p))) if p >= 5 => Ok(DaosVersion::V2_6_5),
            (Some(Ok(2)), Some(Ok(6)), _) => Ok(DaosVersion::V2_6),
            (Some(Ok(2)), Some(Ok(8)), _) => Ok(DaosVersion::V2_8),
            _ => Err(RenderError::Version(s.to_string())),
        }
    }
}

impl DaosVersion {
    /// `system_ram_reserved` when a config leaves it out
    /// (server/storage/scm.go `DefaultSysMemRsvd`: 16 GiB in 2.6, 64 GiB
    /// in 2.8).
    pub fn default_system_ram_reserved_gib(self) -> u64 {
        match self {
            DaosVersion::V2_6 | DaosVersion::V2_6_5 => 16,
            DaosVersion::V2_8 => 64,
        }
    }
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

impl DaosVersion {
    /// Whether DAOS starts with `disable_hugepages: true` beside these
    /// engines' bdevs (server/config/server.go `SetNrHugepages`, code 726):
    /// 2.6 refuses it beside any bdev, 2.8 beside real NVMe only.
    pub fn may_disable_hugepages(self, engines: &[Engine]) -> bool {
        match self {
            DaosVersion::V2_6 | DaosVersion::V2_6_5 => false,
            DaosVersion::V2_8 => engines.iter().all(|e| matches!(e.bdev, Bdev::File { .. })),
        }
    }
}

/// The smallest `class: ram` SCM tier DAOS starts with, GiB
/// (server/storage/scm.go `MinRamdiskMem`).
pub const MIN_RAMDISK_GIB: u32 = 4;

/// The least host RAM gpuq leaves to the system (the OS, Podman, sshd,
/// the node helper) when it lowers DAOS's default reservation to fit a
/// node, GiB. DAOS itself only refuses zero (code 734).
pub const MIN_SYSTEM_RAM_RESERVED_GIB: u64 = 2;

/// What `/proc/meminfo` says of a node, as DAOS reads it
/// (common.SysMemInfo: `MemTotal`, `Hugepagesize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub mem_total_kib: u64,
    pub hugepage_size_kib: u64,
}

impl MemInfo {
    /// From the text of `/proc/meminfo`.
    pub fn parse(text: &str) -> Result<Self, RenderError> {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        match (field("MemTotal"), field("Hugepagesize")) {
            (Some(mem_total_kib), Some(hugepage_size_kib))
                if mem_total_kib > 0 && hugepage_size_kib > 0 =>
            {
                Ok(MemInfo {
                    mem_total_kib,
                    hugepage_size_kib,
                })
            }
            _ => Err(RenderError::Shape(
                "/proc/meminfo has no MemTotal or Hugepagesize line in kB".into(),
            )),
        }
    }
}

/// How a node's RAM is shared between DAOS and the rest of the host, as
/// DAOS computes it at start (server/config/server.go `SetNrHugepages`,
/// `SetRamdiskSize`; server/storage/scm.go `CalcRamdiskSize`;
/// server/storage/bdev.go `CalcMinHugepages`), for one engine in
/// MD-on-SSD mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The hugepages DAOS sets aside (its own minimum: 1 GiB per target
    /// plus one for the MD-on-SSD system xstream); 0 with hugepages off.
    pub nr_hugepages: u64,
    /// What the render writes as `system_ram_reserved`, GiB: DAOS's
    /// default for the version, lowered to what the node has left.
    pub system_ram_reserved_gib: u64,
}

impl MemoryPlan {
    /// Fits one engine of `targets` targets and a `scm_size_gib` ram-disk
    /// on a node with `mem`; `hugepages`: false in test mode
    /// (`disable_hugepages: true`). Refuses, naming every figure, when the
    /// node cannot also keep [`MIN_SYSTEM_RAM_RESERVED_GIB`] for itself.
    pub fn fit(
        version: DaosVersion,
        mem: MemInfo,
        targets: u32,
        scm_size_gib: u32,
        hugepages: bool,
    ) -> Result<Self, RenderError> {
        if targets == 0 {
            return Err(RenderError::Shape("targets must be positive".into()));
        }
        let hp_bytes = mem.hugepage_size_kib * 1024;
        // MD-on-SSD adds one system xstream to the hugepage count.
        let nr_hugepages = if hugepages {
            (u64::from(targets) + 1) * GIB / hp_bytes
        } else {
            0
        };
        let huge = nr_hugepages * hp_bytes;
        let engine = (u64::from(targets) * 128 * MIB).max(GIB);
        let scm = u64::from(scm_size_gib) * GIB;
        let total = mem.mem_total_kib * 1024;
        let left_gib = total.saturating_sub(huge + engine + scm) / GIB;
        let reserved = left_gib.min(version.default_system_ram_reserved_gib());
        if reserved < MIN_SYSTEM_RAM_RESERVED_GIB {
            return Err(RenderError::Memory(format!(
                "the node has {} MiB of RAM; DAOS needs {} MiB of hugepages + {} MiB for its engine + the {} GiB ram-disk (scm_size_gib), and gpuq leaves at least {} GiB to the system: lower scm_size_gib (DAOS's minimum is {}) or targets in the profile, or give the node more memory",
                total / MIB,
                huge / MIB,
                engine / MIB,
                scm_size_gib,
                MIN_SYSTEM_RAM_RESERVED_GIB,
                MIN_RAMDISK_GIB,
            )));
        }
        Ok(MemoryPlan {
            nr_hugepages,
            system_ram_reserved_gib: reserved,
        })
    }
}

/// Where an engine's bulk storage lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bdev {
    /// Physical NVMe namespaces by PCI address (physical mode).
    Nvme { pci: Vec<String> },
    /// File-backed bdevs (test mode), `size_gib` each.
    File { paths: Vec<String>, size_gib: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub targets: u32,
    pub fabric_iface: String,
    pub fabric_iface_port: u16,
    pub scm_mount: String,
    pub scm_size_gib: u32,
    pub bdev: Bdev,
}

/// Everything a rendered `daos_server.yml` depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub version: DaosVersion,
    pub name: String,
    pub port: u16,
    /// Host names of the management-service replicas (1 or 3).
    pub replicas: Vec<String>,
    pub provider: String,
    /// The lease's own, new metadata directory.
    pub control_metadata: String,
    pub engines: Vec<Engine>,
    /// Test mode: no hugepages (file bdevs, ram SCM).
    pub disable_hugepages: bool,
    /// Only where the host cannot set THP to `[never]`.
    pub allow_thp: bool,
    /// `system_ram_reserved`, GiB: from a [`MemoryPlan`] of the node.
    pub system_ram_reserved_gib: u64,
    /// The server's fault domain, e.g. `/da1`. DAOS derives it from the
    /// hostname when absent; set it where hosts share one hostname.
    pub fault_path: Option<String>,
    /// Where the server finds its lease's certificates (`daosCA.crt`,
    /// `server.crt`, `server.key`, `clients/`) inside its container:
    /// `transport_config` then requires mutual TLS. `None`:
    /// `allow_insecure: true`.
    pub cert_dir: Option<String>,
}

/// A DAOS client's certificate paths (dmg's or the agent's), as the client
/// sees them: the system's CA certificate and the client's own certificate
/// and key. The GPU host's clients always use mutual TLS, so their
/// `transport_config` has `allow_insecure: false` and these three.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transport {
    pub ca_cert: String,
    pub cert: String,
    pub key: String,
}

impl Transport {
    /// `<dir>/daosCA.crt`, `<dir>/<who>.crt`, `<dir>/<who>.key`: the
    /// layout gpuq-leasecert installs (`who` is `admin` or `agent`).
    pub fn in_dir(dir: &str, who: &str) -> Self {
        Transport {
            ca_cert: format!("{dir}/daosCA.crt"),
            cert: format!("{dir}/{who}.crt"),
            key: format!("{dir}/{who}.key"),
        }
    }

    fn validate(&self) -> Result<(), RenderError> {
        path("ca_cert", &self.ca_cert)?;
        path("cert", &self.cert)?;
        path("key", &self.key)
    }

    fn yaml(&self) -> TransportYaml {
        TransportYaml {
            allow_insecure: false,
            client_cert_dir: None,
            ca_cert: Some(self.ca_cert.clone()),
            cert: Some(self.cert.clone()),
            key: Some(self.key.clone()),
        }
    }
}

/// dmg's `daos_control.yml` on the GPU host: which system, where its
/// servers listen, and the admin certificate to present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// The DAOS system name (the servers' `name`).
    pub system: String,
    /// The servers' control port.
    pub port: u16,
    /// Where dmg reaches the servers: host names or addresses, each
    /// optionally with `:port`.
    pub hostlist: Vec<String>,
    pub transport: Transport,
}

/// `daos_agent.yml` on the GPU host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The DAOS system name (the servers' `name`).
    pub system: String,
    /// The management-service replicas the agent asks for the system's
    /// attach info: host names or addresses, each optionally with `:port`.
    pub access_points: Vec<String>,
    /// The servers' control port.
    pub port: u16,
    pub transport: Transport,
    /// Where the agent makes its socket, as the agent sees it.
    pub runtime_dir: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RenderError {
    #[error(
        "DAOS version '{0}' is not supported: gpuq renders configurations for 2.6.x and 2.8.x"
    )]
    Version(String),
    #[error("{field} '{value}' is not allowed: {why}")]
    Invalid {
        field: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("{0}")]
    Shape(String),
    /// The node's RAM cannot hold what DAOS needs (one line, with figures).
    #[error("{0}")]
    Memory(String),
    /// The serialiser refused a document (a bug here: the documents are
    /// plain structs of strings, numbers and lists).
    #[error("serialising the YAML failed: {0}")]
    Serialise(String),
}

fn check(
    field: &'static str,
    value: &str,
    ok: fn(char) -> bool,
    why: &'static str,
) -> Result<(), RenderError> {
    if value.is_empty() || value.len() > 255 || !value.chars().all(ok) {
        return Err(RenderError::Invalid {
            field,
            value: value.to_string(),
            why,
        });
    }
    Ok(())
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.".contains(c)
}

/// A host name, an IPv4 or IPv6 address, each optionally with `:port`
/// (DAOS's hostlist and access_points take all of these).
fn address(field: &'static str, value: &str) -> Result<(), RenderError> {
    check(
        field,
        value,
        |c| name_char(c) || c == ':',
        "use a host name or address, optionally with :port",
    )
}

fn path(field: &'static str, value: &str) -> Result<(), RenderError> {
    check(
        field,
        value,
        |c| c.is_ascii_alphanumeric() || "-_./".contains(c),
        "use an absolute path of letters, digits, - _ . /",
    )?;
    if !value.starts_with('/') || value.split('/').any(|s| s == "..") {
        return Err(RenderError::Invalid {
            field,
            value: value.to_string(),
            why: "must be absolute and must not contain '..'",
        });
    }
    Ok(())
}

/// `0000:5e:00.0`
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.char_indices()
            .filter(|(i, _)| ![4, 7, 10].contains(i))
            .all(|(_, c)| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

/// DAOS's system names: at most `DAOS_SYS_NAME_MAX` (15) bytes
/// (src/include/daos_types.h; lib/daos/system_prop.go
/// `SystemNameIsValid`, checked by daos_server, dmg and daos_agent alike).
pub const MAX_SYSTEM_NAME: usize = 15;

/// A DAOS system name gpuq renders: letters, digits, `-`, `_`, `.`, at
/// most [`MAX_SYSTEM_NAME`] bytes.
pub fn system_name(value: &str) -> Result<(), RenderError> {
    check("name", value, name_char, "use letters, digits, - _ .")?;
    if value.len() > MAX_SYSTEM_NAME {
        return Err(RenderError::Invalid {
            field: "name",
            value: value.to_string(),
            why: "DAOS system names are at most 15 characters (DAOS_SYS_NAME_MAX)",
        });
    }
    Ok(())
}

impl ServerConfig {
    fn validate(&self) -> Result<(), RenderError> {
        system_name(&self.name)?;
        check(
            "provider",
            &self.provider,
            |c| c.is_ascii_alphanumeric() || "+_-;".contains(c),
            "e.g. ofi+tcp",
        )?;
        if !(1..=5).contains(&self.replicas.len()) || self.replicas.len() & 1 == 0 {
            return Err(RenderError::Shape(format!(
                "{} management-service replicas: DAOS needs an odd number (1 or 3)",
                self.replicas.len()
            )));
        }
        for r in &self.replicas {
            check("replica", r, name_char, "use a host name")?;
        }
        if self.port == 0 {
            return Err(RenderError::Shape("port 0 is not a control port".into()));
        }
        path("control_metadata", &self.control_metadata)?;
        if let Some(d) = &self.cert_dir {
            path("cert_dir", d)?;
        }
        if let Some(fp) = &self.fault_path {
            path("fault_path", fp)?;
            // server/faultdomain.go newFaultDomainFromConfig: one or two
            // levels below the root (code 724), none empty (717).
            let levels: Vec<&str> = fp[1..].split('/').collect();
            if levels.iter().any(|l| l.is_empty()) || levels.len() > 2 {
                return Err(RenderError::Invalid {
                    field: "fault_path",
                    value: fp.clone(),
                    why: "DAOS takes one or two non-empty levels below the root, e.g. /da1 or /rack1/da1",
                });
            }
        }
        if self.engines.is_empty() {
            return Err(RenderError::Shape("no engines".into()));
        }
        if self.system_ram_reserved_gib == 0 {
            // server/config/server.go Validate, code 734.
            return Err(RenderError::Shape(
                "system_ram_reserved must be positive (DAOS refuses zero)".into(),
            ));
        }
        if self.disable_hugepages && !self.version.may_disable_hugepages(&self.engines) {
            // server/config/server.go SetNrHugepages, code 726.
            return Err(RenderError::Shape(
                "disable_hugepages beside these bdevs: DAOS refuses it (2.6: beside any bdev; 2.8: beside nvme)".into(),
            ));
        }
        if self.allow_thp && self.version == DaosVersion::V2_6 {
            return Err(RenderError::Shape(
                "allow_thp is not a key before DAOS 2.6.5 (the strict parser would refuse the file)".into(),
            ));
        }
        for e in &self.engines {
            check(
                "fabric_iface",
                &e.fabric_iface,
                name_char,
                "use an interface name",
            )?;
            path("scm_mount", &e.scm_mount)?;
            if e.targets == 0 {
                return Err(RenderError::Shape("targets must be positive".into()));
            }
            if e.scm_size_gib < MIN_RAMDISK_GIB {
                // server/storage/config.go ScmConfig.Validate, code 730.
                return Err(RenderError::Shape(format!(
                    "scm_size {} GiB is below DAOS's minimum ram-disk of {MIN_RAMDISK_GIB} GiB",
                    e.scm_size_gib
                )));
            }
            match &e.bdev {
                Bdev::Nvme { pci } => {
                    if pci.is_empty() {
                        return Err(RenderError::Shape(
                            "an nvme bdev needs at least one PCI address".into(),
                        ));
                    }
                    for p in pci {
                        if !is_pci_address(p) {
                            return Err(RenderError::Invalid {
                                field: "bdev_list",
                                value: p.clone(),
                                why: "expected a PCI address such as 0000:5e:00.0",
                            });
                        }
                    }
                }
                Bdev::File { paths, size_gib } => {
                    if paths.is_empty() || *size_gib == 0 {
                        return Err(RenderError::Shape(
                            "a file bdev needs paths and a positive size".into(),
                        ));
                    }
                    for p in paths {
                        path("bdev_list", p)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The YAML text for this configuration: a comment line naming the
    /// DAOS version, then the keys in the order DAOS's template has them.
    pub fn render(&self) -> Result<String, RenderError> {
        self.validate()?;
        // 2.8 refuses `access_points` next to `mgmt_svc_replicas`, 2.6
        // does not know `mgmt_svc_replicas`: exactly one is written.
        let (mgmt_svc_replicas, access_points) = match self.version {
            DaosVersion::V2_8 => (Some(&self.replicas[..]), None),
            DaosVersion::V2_6 | DaosVersion::V2_6_5 => (None, Some(&self.replicas[..])),
        };
        let doc = ServerYaml {
            name: &self.name,
            port: self.port,
            mgmt_svc_replicas,
            access_points,
            provider: &self.provider,
            transport_config: match &self.cert_dir {
                Some(d) => TransportYaml::server(d),
                None => TransportYaml::insecure(),
            },
            control_metadata: ControlMetadataYaml {
                path: &self.control_metadata,
            },
            disable_vfio: true,
            fault_path: self.fault_path.as_deref(),
            system_ram_reserved: self.system_ram_reserved_gib,
            disable_hugepages: self.disable_hugepages,
            allow_thp: self.allow_thp,
            engines: self.engines.iter().map(EngineYaml::from).collect(),
        };
        to_yaml(
            &format!(
                "# Rendered by gpuq for DAOS {:?}; do not edit.\n",
                self.version
            ),
            &doc,
        )
    }
}

/// The system name and control port, as the server config checks them.
fn system_and_port(system: &str, port: u16) -> Result<(), RenderError> {
    system_name(system)?;
    if port == 0 {
        return Err(RenderError::Shape("port 0 is not a control port".into()));
    }
    Ok(())
}

fn addresses(field: &'static str, list: &[String]) -> Result<(), RenderError> {
    if list.is_empty() {
        return Err(RenderError::Shape(format!("{field} is empty")));
    }
    list.iter().try_for_each(|a| address(field, a))
}

/// `# <comment>` and a newline. One line of text: a line break would end
/// the comment and let the rest be read as keys.
fn comment_line(comment: &str) -> Result<String, RenderError> {
    if comment.chars().any(char::is_control) {
        return Err(RenderError::Invalid {
            field: "comment",
            value: comment.to_string(),
            why: "one line of text without control characters",
        });
    }
    Ok(format!("{}\n", format!("# {comment}").trim_end()))
}

impl ControlConfig {
    fn validate(&self) -> Result<(), RenderError> {
        system_and_port(&self.system, self.port)?;
        addresses("hostlist", &self.hostlist)?;
        self.transport.validate()
    }

    /// The YAML text: `# <comment>` (one line, e.g. which lease it is
    /// for), then `name`, `port`, `hostlist` and `transport_config`.
    pub fn render(&self, comment: &str) -> Result<String, RenderError> {
        let head = comment_line(comment)?;
        self.validate()?;
        to_yaml(
            &head,
            &ControlYaml {
                name: &self.system,
                port: self.port,
                hostlist: &self.hostlist,
                transport_config: self.transport.yaml(),
            },
        )
    }
}

impl AgentConfig {
    fn validate(&self) -> Result<(), RenderError> {
        system_and_port(&self.system, self.port)?;
        addresses("access_points", &self.access_points)?;
        self.transport.validate()?;
        path("runtime_dir", &self.runtime_dir)
    }

    /// The YAML text: `# <comment>` (one line, e.g. which lease it is
    /// for), then `name`, `access_points`, `port`, `transport_config` and
    /// `runtime_dir`.
    pub fn render(&self, comment: &str) -> Result<String, RenderError> {
        let head = comment_line(comment)?;
        self.validate()?;
        to_yaml(
            &head,
            &AgentYaml {
                name: &self.system,
                access_points: &self.access_points,
                port: self.port,
                transport_config: self.transport.yaml(),
                runtime_dir: &self.runtime_dir,
            },
        )
    }
}

// The files as serde sees them. Field order is key order in the output;
// it follows DAOS's templates (utils/config/daos_server.yml,
// docs/daos-facts.md). Keys a version or a mode does not have are skipped,
// not written empty: the strict parser refuses an unknown key, and an
// empty one can mean something else than an absent one.

#[derive(Serialize)]
struct ServerYaml<'a> {
    name: &'a str,
    port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    mgmt_svc_replicas: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    access_points: Option<&'a [String]>,
    provider: &'a str,
    transport_config: TransportYaml,
    control_metadata: ControlMetadataYaml<'a>,
    disable_vfio: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    fault_path: Option<&'a str>,
    /// GiB (config/server.go); in 2.6 and 2.8 alike.
    system_ram_reserved: u64,
    #[serde(skip_serializing_if = "is_false")]
    disable_hugepages: bool,
    /// Before 2.6.5 not a key at all (validate refuses it there).
    #[serde(skip_serializing_if = "is_false")]
    allow_thp: bool,
    engines: Vec<EngineYaml<'a>>,
}

/// DAOS's keys (security/config.go). Without certificates only
/// `allow_insecure: true`.
#[derive(Serialize)]
struct TransportYaml {
    allow_insecure: bool,
    /// Server only: where the agent's certificate is
    /// (utils/config/daos_server.yml).
    #[serde(skip_serializing_if = "Option::is_none")]
    client_cert_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

impl TransportYaml {
    fn insecure() -> Self {
        TransportYaml {
            allow_insecure: true,
            client_cert_dir: None,
            ca_cert: None,
            cert: None,
            key: None,
        }
    }

    /// The server's files in its certificate directory.
    fn server(d: &str) -> Self {
        TransportYaml {
            allow_insecure: false,
            client_cert_dir: Some(format!("{d}/clients")),
            ca_cert: Some(format!("{d}/daosCA.crt")),
            cert: Some(format!("{d}/server.crt")),
            key: Some(format!("{d}/server.key")),
        }
    }
}

#[derive(Serialize)]
struct ControlMetadataYaml<'a> {
    path: &'a str,
}

#[derive(Serialize)]
struct EngineYaml<'a> {
    targets: u32,
    fabric_iface: &'a str,
    fabric_iface_port: u16,
    /// The `ram` SCM tier first, then the bdev tier (DAOS wants SCM first).
    storage: [TierYaml<'a>; 2],
}

impl<'a> From<&'a Engine> for EngineYaml<'a> {
    fn from(e: &'a Engine) -> Self {
        EngineYaml {
            targets: e.targets,
            fabric_iface: &e.fabric_iface,
            fabric_iface_port: e.fabric_iface_port,
            storage: [
                TierYaml::Ram {
                    scm_mount: &e.scm_mount,
                    scm_size: e.scm_size_gib,
                },
                match &e.bdev {
                    Bdev::Nvme { pci } => TierYaml::Nvme {
                        bdev_list: pci,
                        bdev_roles: ALL_ROLES,
                    },
                    Bdev::File { paths, size_gib } => TierYaml::File {
                        bdev_list: paths,
                        bdev_size: *size_gib,
                        bdev_roles: ALL_ROLES,
                    },
                },
            ],
        }
    }
}

/// The MD-on-SSD roles of the one bdev tier: all three co-located, as
/// DAOS allows (server/storage/config.go `validateBdevRoles`); without
/// them a config with `control_metadata.path` is refused (code 317).
const ALL_ROLES: [&str; 3] = ["wal", "meta", "data"];

/// One `storage` tier; `class` is written first, as the tag.
#[derive(Serialize)]
#[serde(tag = "class", rename_all = "lowercase")]
enum TierYaml<'a> {
    Ram {
        scm_mount: &'a str,
        scm_size: u32,
    },
    Nvme {
        bdev_list: &'a [String],
        bdev_roles: [&'static str; 3],
    },
    File {
        bdev_list: &'a [String],
        bdev_size: u32,
        bdev_roles: [&'static str; 3],
    },
}

/// dmg's keys (utils/config/daos_control.yml).
#[derive(Serialize)]
struct ControlYaml<'a> {
    name: &'a str,
    port: u16,
    hostlist: &'a [String],
    transport_config: TransportYaml,
}

/// The agent's keys (utils/config/daos_agent.yml); `access_points` in 2.8
/// as in 2.6.
#[derive(Serialize)]
struct AgentYaml<'a> {
    name: &'a str,
    access_points: &'a [String],
    port: u16,
    transport_config: TransportYaml,
    runtime_dir: &'a str,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `head` (comment lines, each ending in a newline), then `doc` as YAML.
fn to_yaml<T: Serialize>(head: &str, doc: &T) -> Result<String, RenderError> {
    let body = serde_norway::to_string(doc).map_err(|e| RenderError::Serialise(e.to_string()))?;
    Ok(format!("{head}{body}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_norway::Value;

    fn cfg(version: DaosVersion) -> ServerConfig {
        ServerConfig {
            version,
            name: "daos_server".into(),
            port: 10001,
            replicas: vec!["da1".into(), "da2".into(), "da3".into()],
            provider: "ofi+tcp".into(),
            control_metadata: "/var/lib/gpuqueue-daos/jobs/L42/control_meta".into(),
            engines: vec![Engine {
                targets: 4,
                fabric_iface: "eth0".into(),
                fabric_iface_port: 31416,
                scm_mount: "/mnt/daos".into(),
                scm_size_gib: 16,
                bdev: Bdev::Nvme {
                    pci: vec!["0000:5e:00.0".into()],
                },
            }],
            disable_hugepages: false,
            allow_thp: false,
            system_ram_reserved_gib: 16,
            fault_path: None,
            cert_dir: None,
        }
    }

    fn parse(y: &str) -> Value {
        serde_norway::from_str(y).unwrap_or_else(|e| panic!("{e}\n{y}"))
    }

    /// A mapping's keys, in the order written.
    fn keys(v: &Value) -> Vec<&str> {
        v.as_mapping()
            .unwrap_or_else(|| panic!("not a mapping: {v:?}"))
            .keys()
            .map(|k| k.as_str().unwrap())
            .collect()
    }

    fn strings(v: &Value) -> Vec<&str> {
        v.as_sequence()
            .unwrap_or_else(|| panic!("not a sequence: {v:?}"))
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect()
    }

    #[test]
    fn keys_come_in_daos_order_with_their_values() {
        let y = cfg(DaosVersion::V2_8).render().unwrap();
        assert_eq!(
            y.lines().next(),
            Some("# Rendered by gpuq for DAOS V2_8; do not edit."),
            "{y}"
        );
        let v = parse(&y);
        assert_eq!(
            keys(&v),
            [
                "name",
                "port",
                "mgmt_svc_replicas",
                "provider",
                "transport_config",
                "control_metadata",
                "disable_vfio",
                "system_ram_reserved",
                "engines"
            ],
            "{y}"
        );
        assert_eq!(v["system_ram_reserved"], 16);
        assert_eq!(v["name"], "daos_server");
        assert_eq!(v["port"], 10001);
        assert_eq!(v["provider"], "ofi+tcp");
        assert_eq!(keys(&v["control_metadata"]), ["path"]);
        assert_eq!(
            v["control_metadata"]["path"],
            "/var/lib/gpuqueue-daos/jobs/L42/control_meta"
        );
        assert_eq!(v["disable_vfio"], true);
        let engines = v["engines"].as_sequence().unwrap();
        assert_eq!(engines.len(), 1);
        let e = &engines[0];
        assert_eq!(
            keys(e),
            ["targets", "fabric_iface", "fabric_iface_port", "storage"]
        );
        assert_eq!(e["targets"], 4);
        assert_eq!(e["fabric_iface"], "eth0");
        assert_eq!(e["fabric_iface_port"], 31416);
        let ram = &e["storage"][0];
        assert_eq!(keys(ram), ["class", "scm_mount", "scm_size"]);
        assert_eq!(ram["class"], "ram");
        assert_eq!(ram["scm_mount"], "/mnt/daos");
        assert_eq!(ram["scm_size"], 16);

        // Every optional key, where it goes (2.8 knows allow_thp, and
        // takes disable_hugepages beside file bdevs).
        let mut all = cfg(DaosVersion::V2_8);
        all.engines[0].bdev = Bdev::File {
            paths: vec!["/var/lib/gpuqueue-daos-test/L42/bdev0".into()],
            size_gib: 16,
        };
        all.fault_path = Some("/da1".into());
        all.disable_hugepages = true;
        all.allow_thp = true;
        let y = all.render().unwrap();
        assert_eq!(
            keys(&parse(&y)),
            [
                "name",
                "port",
                "mgmt_svc_replicas",
                "provider",
                "transport_config",
                "control_metadata",
                "disable_vfio",
                "fault_path",
                "system_ram_reserved",
                "disable_hugepages",
                "allow_thp",
                "engines"
            ],
            "{y}"
        );
    }

    #[test]
    fn a_cert_dir_turns_on_mutual_tls() {
        let y = cfg(DaosVersion::V2_8).render().unwrap();
        let t = &parse(&y)["transport_config"];
        assert_eq!(keys(t), ["allow_insecure"], "{y}");
        assert_eq!(t["allow_insecure"], true);
        let mut c = cfg(DaosVersion::V2_8);
        c.cert_dir = Some("/etc/daos/certs".into());
        let y = c.render().unwrap();
        let t = &parse(&y)["transport_config"];
        assert_eq!(
            keys(t),
            [
                "allow_insecure",
                "client_cert_dir",
                "ca_cert",
                "cert",
                "key"
            ],
            "{y}"
        );
        assert_eq!(t["allow_insecure"], false);
        assert_eq!(t["client_cert_dir"], "/etc/daos/certs/clients");
        assert_eq!(t["ca_cert"], "/etc/daos/certs/daosCA.crt");
        assert_eq!(t["cert"], "/etc/daos/certs/server.crt");
        assert_eq!(t["key"], "/etc/daos/certs/server.key");
        c.cert_dir = Some("/etc/daos/certs\nallow_insecure: true".into());
        assert!(c.render().is_err());
    }

    #[test]
    fn version_picks_the_replica_key() {
        let y28 = cfg(DaosVersion::V2_8).render().unwrap();
        let v = parse(&y28);
        assert_eq!(strings(&v["mgmt_svc_replicas"]), ["da1", "da2", "da3"]);
        assert!(v.get("access_points").is_none(), "{y28}");
        for old in [DaosVersion::V2_6, DaosVersion::V2_6_5] {
            let y26 = cfg(old).render().unwrap();
            let v = parse(&y26);
            assert_eq!(strings(&v["access_points"]), ["da1", "da2", "da3"]);
            assert!(v.get("mgmt_svc_replicas").is_none(), "{y26}");
        }
    }

    #[test]
    fn physical_and_test_storage() {
        let y = cfg(DaosVersion::V2_8).render().unwrap();
        let v = parse(&y);
        let nvme = &v["engines"][0]["storage"][1];
        assert_eq!(keys(nvme), ["class", "bdev_list", "bdev_roles"], "{y}");
        assert_eq!(nvme["class"], "nvme");
        assert_eq!(strings(&nvme["bdev_roles"]), ["wal", "meta", "data"]);
        assert_eq!(strings(&nvme["bdev_list"]), ["0000:5e:00.0"]);
        assert!(v.get("disable_hugepages").is_none(), "only when set: {y}");
        assert!(v.get("fault_path").is_none(), "only when set: {y}");

        let mut t = cfg(DaosVersion::V2_8);
        t.disable_hugepages = true;
        t.engines[0].bdev = Bdev::File {
            paths: vec!["/var/lib/gpuqueue-daos-test/L42/bdev0".into()],
            size_gib: 16,
        };
        let y = t.render().unwrap();
        let v = parse(&y);
        let file = &v["engines"][0]["storage"][1];
        assert_eq!(
            keys(file),
            ["class", "bdev_list", "bdev_size", "bdev_roles"],
            "{y}"
        );
        assert_eq!(strings(&file["bdev_roles"]), ["wal", "meta", "data"]);
        assert_eq!(file["class"], "file");
        assert_eq!(
            strings(&file["bdev_list"]),
            ["/var/lib/gpuqueue-daos-test/L42/bdev0"]
        );
        assert_eq!(file["bdev_size"], 16);
        assert_eq!(v["disable_hugepages"], true);
        t.fault_path = Some("/da3".into());
        assert_eq!(parse(&t.render().unwrap())["fault_path"], "/da3");
        t.fault_path = Some("da3".into());
        assert!(t.render().is_err(), "a fault path is absolute");
        for bad in ["/", "/a//b", "/a/b/c", "/da3/"] {
            t.fault_path = Some(bad.into());
            assert!(t.render().is_err(), "{bad}");
        }
        t.fault_path = Some("/rack1/da3".into());
        assert!(t.render().is_ok());
    }

    #[test]
    fn refuses_what_daos_would_refuse() {
        let mut even = cfg(DaosVersion::V2_8);
        even.replicas.pop();
        assert!(even.render().unwrap_err().to_string().contains("odd"));
        let mut thp = cfg(DaosVersion::V2_6);
        assert!(parse(&thp.render().unwrap()).get("allow_thp").is_none());
        thp.allow_thp = true;
        assert!(thp.render().is_err());
        thp.version = DaosVersion::V2_6_5;
        assert_eq!(parse(&thp.render().unwrap())["allow_thp"], true);
        // Hugepages: 2.6 refuses disable_hugepages beside any bdev, 2.8
        // beside nvme (code 726).
        let mut huge = cfg(DaosVersion::V2_8);
        huge.disable_hugepages = true;
        assert!(huge.render().is_err(), "2.8, nvme");
        huge.engines[0].bdev = Bdev::File {
            paths: vec!["/x/bdev0".into()],
            size_gib: 16,
        };
        assert!(huge.render().is_ok(), "2.8, file");
        huge.version = DaosVersion::V2_6_5;
        assert!(huge.render().is_err(), "2.6, file");
    }

    #[test]
    fn refuses_a_ram_disk_under_daos_minimum_and_a_zero_reservation() {
        let mut c = cfg(DaosVersion::V2_8);
        c.engines[0].scm_size_gib = MIN_RAMDISK_GIB - 1;
        let e = c.render().unwrap_err().to_string();
        assert!(e.contains("below DAOS's minimum ram-disk of 4 GiB"), "{e}");
        c.engines[0].scm_size_gib = MIN_RAMDISK_GIB;
        assert!(c.render().is_ok());
        c.system_ram_reserved_gib = 0;
        assert!(c
            .render()
            .unwrap_err()
            .to_string()
            .contains("system_ram_reserved"));
    }

    const MEMINFO_24G: &str = "MemTotal:       24604636 kB\nMemFree:        22000000 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n";

    #[test]
    fn meminfo_parses_what_daos_reads() {
        let m = MemInfo::parse(MEMINFO_24G).unwrap();
        assert_eq!(m.mem_total_kib, 24604636);
        assert_eq!(m.hugepage_size_kib, 2048);
        assert!(MemInfo::parse("MemFree: 1 kB\n").is_err());
        assert!(MemInfo::parse("MemTotal: x kB\nHugepagesize: 2048 kB\n").is_err());
    }

    #[test]
    fn memory_plan_lowers_the_reservation_to_fit_and_refuses_a_small_node() {
        let m = MemInfo::parse(MEMINFO_24G).unwrap();
        // Test mode (no hugepages), 1 target, 4 GiB ram-disk: 24604636 kB
        // is 23.46 GiB; minus 1 GiB engine and 4 GiB SCM leaves 18.
        let p = MemoryPlan::fit(DaosVersion::V2_8, m, 1, 4, false).unwrap();
        assert_eq!(p.nr_hugepages, 0);
        assert_eq!(p.system_ram_reserved_gib, 18, "2.8's 64 GiB lowered");
        // 2.6's default of 16 fits as it is.
        let p = MemoryPlan::fit(DaosVersion::V2_6, m, 1, 4, false).unwrap();
        assert_eq!(p.system_ram_reserved_gib, 16);
        // Physical mode: (4 targets + 1) GiB of 2 MiB pages.
        let p = MemoryPlan::fit(DaosVersion::V2_8, m, 4, 4, true).unwrap();
        assert_eq!(p.nr_hugepages, 2560);
        assert_eq!(p.system_ram_reserved_gib, 13);
        // A 6 GiB node cannot hold 2 GiB of hugepages, 1 GiB for the
        // engine, a 4 GiB ram-disk and 2 GiB for itself.
        let small = MemInfo {
            mem_total_kib: 6 << 20,
            hugepage_size_kib: 2048,
        };
        let e = MemoryPlan::fit(DaosVersion::V2_8, small, 1, 4, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the node has 6144 MiB of RAM"), "{e}");
        assert!(e.contains("2048 MiB of hugepages"), "{e}");
        assert!(e.contains("lower scm_size_gib"), "{e}");
        assert!(MemoryPlan::fit(DaosVersion::V2_8, m, 0, 4, false).is_err());
    }

    #[test]
    fn system_names_longer_than_daos_allows_are_refused_everywhere() {
        let mut c = cfg(DaosVersion::V2_8);
        c.name = "a".repeat(MAX_SYSTEM_NAME);
        assert!(c.render().is_ok());
        c.name.push('a');
        assert!(c
            .render()
            .unwrap_err()
            .to_string()
            .contains("DAOS_SYS_NAME_MAX"));
        let mut ctl = control();
        ctl.system = "a".repeat(16);
        assert!(ctl.render("x").is_err());
        let mut a = agent();
        a.system = "a".repeat(16);
        assert!(a.render("x").is_err());
    }

    #[test]
    fn refuses_values_that_could_inject_keys() {
        let mut c = cfg(DaosVersion::V2_8);
        c.name = "x\nport: 1".into();
        assert!(c.render().is_err());
        let mut c = cfg(DaosVersion::V2_8);
        c.control_metadata = "/var/lib/../etc".into();
        assert!(c.render().is_err());
        let mut c = cfg(DaosVersion::V2_8);
        c.engines[0].bdev = Bdev::Nvme {
            pci: vec!["0000:5E:00.0".into()],
        };
        assert!(c.render().is_err());
        let mut c = cfg(DaosVersion::V2_8);
        c.replicas[0] = "da1'".into();
        assert!(c.render().is_err());
    }

    /// The serialiser would quote these; they are refused anyway, before
    /// anything is rendered: none is a name, a path or a provider DAOS
    /// knows, and a refusal names the field.
    #[test]
    fn yaml_special_characters_are_refused_not_quoted() {
        for bad in [
            "a: b", "a #b", "'a'", "\"a\"", "[a]", "{a}", "*a", "&a", "!a", "- a", "|", ">", "a,b",
            "%a", "@a", "`a`", "a\tb", "a\rb",
        ] {
            type Set = fn(&mut ServerConfig, &str);
            let fields: [(&str, Set); 8] = [
                ("name", |c, v| c.name = v.into()),
                ("provider", |c, v| c.provider = v.into()),
                ("replica", |c, v| c.replicas[0] = v.into()),
                ("fabric_iface", |c, v| c.engines[0].fabric_iface = v.into()),
                ("control_metadata", |c, v| {
                    c.control_metadata = format!("/x/{v}")
                }),
                ("scm_mount", |c, v| {
                    c.engines[0].scm_mount = format!("/x/{v}")
                }),
                ("cert_dir", |c, v| c.cert_dir = Some(format!("/x/{v}"))),
                ("fault_path", |c, v| c.fault_path = Some(format!("/{v}"))),
            ];
            for (field, set) in fields {
                let mut c = cfg(DaosVersion::V2_8);
                set(&mut c, bad);
                match c.render() {
                    Err(RenderError::Invalid { field: f, .. }) => assert_eq!(f, field, "{bad:?}"),
                    other => panic!("{field} = {bad:?}: {other:?}"),
                }
            }
        }
    }

    fn control() -> ControlConfig {
        ControlConfig {
            system: "daos_server".into(),
            port: 10001,
            hostlist: vec!["10.200.0.11".into(), "da2:10001".into()],
            transport: Transport::in_dir("/etc/daos", "admin"),
        }
    }

    fn agent() -> AgentConfig {
        AgentConfig {
            system: "daos_server".into(),
            access_points: vec!["da1".into(), "da2".into(), "da3".into()],
            port: 10001,
            transport: Transport::in_dir("/etc/daos", "agent"),
            runtime_dir: "/var/run/daos_agent".into(),
        }
    }

    fn assert_client_transport(t: &Value, who: &str) {
        assert_eq!(keys(t), ["allow_insecure", "ca_cert", "cert", "key"]);
        assert_eq!(t["allow_insecure"], false);
        assert_eq!(t["ca_cert"], "/etc/daos/daosCA.crt");
        assert_eq!(t["cert"], format!("/etc/daos/{who}.crt"));
        assert_eq!(t["key"], format!("/etc/daos/{who}.key"));
    }

    #[test]
    fn control_config_renders_dmg_keys() {
        let y = control()
            .render("Written by gpuq-broker for lease L42.")
            .unwrap();
        assert_eq!(
            y.lines().next(),
            Some("# Written by gpuq-broker for lease L42."),
            "{y}"
        );
        let v = parse(&y);
        assert_eq!(
            keys(&v),
            ["name", "port", "hostlist", "transport_config"],
            "{y}"
        );
        assert_eq!(v["name"], "daos_server");
        assert_eq!(v["port"], 10001);
        assert_eq!(strings(&v["hostlist"]), ["10.200.0.11", "da2:10001"]);
        assert_client_transport(&v["transport_config"], "admin");
        let bare = control().render("").unwrap();
        assert_eq!(bare.lines().next(), Some("#"), "{bare}");
    }

    #[test]
    fn agent_config_renders_agent_keys() {
        let y = agent()
            .render("Written by gpuq-broker for lease L42.")
            .unwrap();
        assert_eq!(
            y.lines().next(),
            Some("# Written by gpuq-broker for lease L42."),
            "{y}"
        );
        let v = parse(&y);
        assert_eq!(
            keys(&v),
            [
                "name",
                "access_points",
                "port",
                "transport_config",
                "runtime_dir"
            ],
            "{y}"
        );
        assert_eq!(v["name"], "daos_server");
        assert_eq!(strings(&v["access_points"]), ["da1", "da2", "da3"]);
        assert_eq!(v["port"], 10001);
        assert_client_transport(&v["transport_config"], "agent");
        assert_eq!(v["runtime_dir"], "/var/run/daos_agent");
    }

    #[test]
    fn client_configs_refuse_bad_values() {
        let refused = |c: &ControlConfig, a: &AgentConfig, what: &str| {
            assert!(c.render("x").is_err(), "control: {what}");
            assert!(a.render("x").is_err(), "agent: {what}");
        };
        let (mut c, mut a) = (control(), agent());
        c.system = "daos\nport: 1".into();
        a.system = c.system.clone();
        refused(&c, &a, "a newline in the name");
        let (mut c, mut a) = (control(), agent());
        c.system = "daos:server".into();
        a.system = c.system.clone();
        refused(&c, &a, "a colon in the name");
        let (mut c, mut a) = (control(), agent());
        c.transport.key = "etc/daos/admin.key".into();
        a.transport.ca_cert = "daosCA.crt".into();
        refused(&c, &a, "a relative certificate path");
        let (mut c, mut a) = (control(), agent());
        c.transport.cert = "/etc/daos/../admin.crt".into();
        a.transport = Transport::in_dir("/etc/daos", "agent\nallow_insecure: true");
        refused(&c, &a, "'..' or a newline in a certificate path");
        let (mut c, mut a) = (control(), agent());
        c.port = 0;
        a.port = 0;
        refused(&c, &a, "port 0");
        let (mut c, mut a) = (control(), agent());
        c.hostlist.clear();
        a.access_points.clear();
        refused(&c, &a, "no servers");
        let (mut c, mut a) = (control(), agent());
        c.hostlist[1] = "da2 da3".into();
        a.access_points[1] = "[da2]".into();
        refused(&c, &a, "a space or brackets in an address");

        let mut a = agent();
        a.runtime_dir = "var/run/daos_agent".into();
        assert!(a.render("x").is_err(), "a relative runtime_dir");
        let e = control().render("lease L42\nname: other").unwrap_err();
        assert!(
            matches!(
                e,
                RenderError::Invalid {
                    field: "comment",
                    ..
                }
            ),
            "{e}"
        );
        assert!(agent().render("lease L42\r").is_err());
    }

    #[test]
    fn versions_parse_from_rpm_strings() {
        assert_eq!(DaosVersion::parse("2.6.4-1.el8"), Ok(DaosVersion::V2_6));
        assert_eq!(DaosVersion::parse("2.6.5-2.el9"), Ok(DaosVersion::V2_6_5));
        assert_eq!(DaosVersion::parse("2.8.0"), Ok(DaosVersion::V2_8));
        assert!(DaosVersion::parse("2.4.1").is_err());
        assert!(DaosVersion::parse("latest").is_err());
    }
}
