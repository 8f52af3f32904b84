//! `node.toml` as the node service reads it: the block-device crate's
//! `[node]` and `[[devices]]` tables plus one `[profiles.NAME]` table per
//! institution profile this node can serve.
//!
//! ```toml
//! [profiles.inst1]
//! image = "sha256:<64 hex>"       # full image ID; a tag is a configuration error
//! daos_version = "2.6.4"          # selects the daos_server.yml dialect
//! mode = "physical"               # or "test": file bdevs, no host /dev, own port
//! port = 10001
//! ```

use gpuq_blockdev::config::{DeviceEntry, NodeConfig, NodeSection};
use gpuq_daosconf::DaosVersion;
use gpuq_podman::ImageId;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ProfileError {
    /// Unreadable, not root's alone, or not TOML.
    #[error(transparent)]
    File(#[from] gpuq_conffile::ConfFileError),
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Real NVMe: privileged, host /dev, BLKDISCARD on wipe.
    Physical,
    /// File-backed bdevs under `test_dir/<lease>/`, no host /dev; wipe
    /// removes only that directory.
    Test,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    image: String,
    daos_version: String,
    mode: Mode,
    port: u16,
    #[serde(default = "default_provider")]
    provider: String,
    #[serde(default = "default_iface")]
    fabric_iface: String,
    #[serde(default = "default_fabric_port")]
    fabric_iface_port: u16,
    #[serde(default = "one")]
    targets: u32,
    /// The `class: ram` SCM tier; DAOS refuses under 4 GiB.
    #[serde(default = "min_ramdisk")]
    scm_size_gib: u32,
    /// Test mode's file bdev; 2 GiB (sparse) holds the smallest pool DAOS
    /// allows over one target per rank (1 GiB of NVMe per target).
    #[serde(default = "two")]
    bdev_size_gib: u32,
    /// The server container's command; the image's DAOS server by default.
    #[serde(default)]
    command: Option<Vec<String>>,
    /// Seconds between SIGTERM and SIGKILL when stopping the server.
    #[serde(default = "default_grace")]
    stop_grace_secs: u64,
    /// Seconds the started server may take to say "format required".
    #[serde(default = "default_format_wait")]
    format_wait_secs: u64,
    /// Test mode only: a host directory mounted read-only into the server
    /// container, where the DAOS simulator reads its fault switches
    /// (`daos-sim-faults`, docs/daos-sim.md). Refused in physical mode.
    #[serde(default)]
    sim_faults_dir: Option<PathBuf>,
}

fn default_provider() -> String {
    "ofi+tcp".into()
}
fn default_iface() -> String {
    "eth0".into()
}
fn default_fabric_port() -> u16 {
    31416
}
fn min_ramdisk() -> u32 {
    gpuq_daosconf::MIN_RAMDISK_GIB
}
fn two() -> u32 {
    2
}
fn one() -> u32 {
    1
}
fn default_grace() -> u64 {
    30
}
fn default_format_wait() -> u64 {
    120
}

/// One validated profile.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: String,
    pub image: ImageId,
    pub daos_version: DaosVersion,
    pub mode: Mode,
    pub port: u16,
    pub provider: String,
    pub fabric_iface: String,
    pub fabric_iface_port: u16,
    pub targets: u32,
    pub scm_size_gib: u32,
    pub bdev_size_gib: u32,
    pub command: Vec<String>,
    pub stop_grace_secs: u64,
    pub format_wait_secs: u64,
    /// Test mode only: where the simulator's fault switches live.
    pub sim_faults_dir: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    node: NodeSection,
    #[serde(default)]
    devices: Vec<DeviceEntry>,
    #[serde(default)]
    profiles: BTreeMap<String, RawProfile>,
    /// Where `GET /v1/install` finds this node's manifests (tests only).
    #[serde(default)]
    install: gpuq_manifest::InstallPaths,
    #[serde(default)]
    activation: RawActivation,
    #[serde(default)]
    client: Option<RawClient>,
    /// `[stor.NAME]`: kernel storage profiles (`gpuq submit --stor`).
    #[serde(default)]
    stor: BTreeMap<String, RawStor>,
}

/// `[stor.NAME]`, e.g. for `--stor nvmeof` and `--stor nfsrdma`:
///
/// ```toml
/// [stor.nvmeof]
/// kind = "nvmeof"
/// transport = "tcp"        # or "rdma"
/// address = "10.0.0.11"    # this node's storage address (the listener's)
/// port = 4420              # default 4420
///
/// [stor.nfsrdma]
/// kind = "nfsrdma"
/// transport = "tcp"        # or "rdma" (an RDMA listener on 20049 too:
///                          # only with the key below)
/// address = "10.0.0.11"
/// port = 2049              # the TCP listener (default 2049)
/// mkfs_image = "sha256:<64 hex>"   # the image whose mkfs.xfs makes each filesystem
/// # rdma_any_client_user_is_owner = true
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStor {
    kind: String,
    transport: String,
    address: std::net::IpAddr,
    port: Option<u16>,
    mkfs_image: Option<String>,
    /// `nfsrdma` over `rdma` only: the operator's acceptance of what NFS
    /// over RDMA with AUTH_SYS means ([`RDMA_AUTH_SYS`]).
    rdma_any_client_user_is_owner: Option<bool>,
}

/// Why `--stor nfsrdma` over RDMA needs the operator's word: the kernel
/// NFS server counts every RPC-over-RDMA request as coming from a
/// privileged port (svc_rdma sets the secure flag for every transport),
/// and AUTH_SYS takes the uid from the client, so any user of the job's
/// host who can open an RDMA connection can act as the lease's owner on
/// its export. gpuq mounts with `sec=sys` (no Kerberos). Said in the
/// refusal, the node's status and the activation plan.
pub const RDMA_AUTH_SYS: &str = "over RDMA the kernel NFS server counts every request as from a privileged port, \
     so any user of the job's host with RDMA access could act as the lease's owner (AUTH_SYS; gpuq has no Kerberos)";

/// One `[stor.NAME]`'s kind-specific part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorDetail {
    Nvmeof,
    /// `--stor nfsrdma`: the pinned image that holds `mkfs.xfs`.
    Nfs {
        mkfs_image: ImageId,
    },
}

/// One `[stor.NAME]`: how this node exports its allowlisted namespaces
/// for a `--stor` lease (always physical: the devices of `[[devices]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorProfile {
    pub name: String,
    pub kind: gpuq_protocol::node::StorKind,
    /// `tcp` or `rdma` (nvmet's `addr_trtype`).
    pub transport: String,
    pub address: std::net::IpAddr,
    pub port: u16,
    pub detail: StorDetail,
    /// `nfsrdma` over `rdma` only: the operator accepted [`RDMA_AUTH_SYS`]
    /// (`rdma_any_client_user_is_owner = true`).
    pub rdma_auth_sys_accepted: bool,
}

impl StorProfile {
    /// What the operator accepted against the default, one line each
    /// (shown in the node's status and the activation plan).
    pub fn accepted_risks(&self) -> Vec<String> {
        if self.rdma_auth_sys_accepted {
            vec![format!(
                "stor.{}: NFS over RDMA with AUTH_SYS: {RDMA_AUTH_SYS} (rdma_any_client_user_is_owner = true)",
                self.name
            )]
        } else {
            Vec::new()
        }
    }
}

/// `[client]`: this host also serves the client side of a lease (a GPU
/// host whose Slurm jobs use the DAOS site: the lease's files under
/// `run_dir`, its agent and client containers on this host's Podman).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    run_dir: PathBuf,
}

/// `[activation]`: what `gpuq activate` looks at besides the devices.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawActivation {
    /// Pre-existing DAOS services of this node (`daos_server.service`):
    /// the plan shows their state; an activation stops and disables them.
    #[serde(default)]
    units: Vec<String>,
}

/// A systemd service unit name: `NAME.service`, NAME of letters, digits
/// and `@ . _ -` (no path, no glob).
fn valid_unit(u: &str) -> bool {
    u.strip_suffix(".service").is_some_and(|n| {
        !n.is_empty()
            && n.len() <= 200
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "@._-".contains(c))
    })
}

/// The node service's whole configuration.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub source: PathBuf,
    /// `[node]` and `[[devices]]`, as the block-device crate uses them.
    pub node: NodeConfig,
    pub profiles: BTreeMap<String, Profile>,
    /// `[install]`: manifests and install root for `GET /v1/install`.
    pub install: gpuq_manifest::InstallPaths,
    /// `[activation] units`: the pre-existing DAOS services (`gpuq activate`).
    pub activation_units: Vec<String>,
    /// `[client] run_dir`: where a lease's client files go on this host;
    /// `None`: this helper serves no client side.
    pub client_run_dir: Option<PathBuf>,
    /// `[stor.NAME]`: kernel storage profiles.
    pub stor: BTreeMap<String, StorProfile>,
}

impl ServiceConfig {
    /// What this node's operator accepted against the default, one line
    /// each (every `[stor.NAME]`'s): for the status and the plan.
    pub fn accepted_risks(&self) -> Vec<String> {
        self.stor
            .values()
            .flat_map(StorProfile::accepted_risks)
            .collect()
    }

    /// Read (only if root alone could have written it: it decides which
    /// devices this node may discard) and parse.
    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let text = gpuq_conffile::read_trusted(path)?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ProfileError> {
        let raw: RawFile = gpuq_conffile::parse_toml(path, text)?;
        let invalid = |key: String, message: String| ProfileError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        };
        if let Some(key) = raw.install.invalid_key() {
            return Err(invalid(key.into(), "expected an absolute path".into()));
        }
        let mut profiles = BTreeMap::new();
        for (name, p) in raw.profiles {
            let key = |k: &str| format!("profiles.{name}.{k}");
            if !gpuq_protocol::node::valid_lease(&name) {
                return Err(invalid(
                    format!("profiles.{name}"),
                    "profile names use letters, digits, - and _".into(),
                ));
            }
            let image =
                ImageId::parse(&p.image).map_err(|e| invalid(key("image"), e.to_string()))?;
            let daos_version = DaosVersion::parse(&p.daos_version)
                .map_err(|e| invalid(key("daos_version"), e.to_string()))?;
            if p.port == 0 {
                return Err(invalid(key("port"), "expected a TCP port (1-65535)".into()));
            }
            let command = p.command.unwrap_or_else(|| {
                ["daos_server", "start", "-o", "/etc/daos/daos_server.yml"]
                    .map(String::from)
                    .to_vec()
            });
            if command.is_empty() {
                return Err(invalid(key("command"), "must not be empty".into()));
            }
            if p.scm_size_gib < gpuq_daosconf::MIN_RAMDISK_GIB {
                // DAOS: server/storage/config.go ScmConfig.Validate, code 730.
                return Err(invalid(
                    key("scm_size_gib"),
                    format!(
                        "{} GiB is below DAOS's minimum ram-disk ({} GiB): DAOS would refuse to start",
                        p.scm_size_gib,
                        gpuq_daosconf::MIN_RAMDISK_GIB
                    ),
                ));
            }
            if p.targets == 0 {
                return Err(invalid(
                    key("targets"),
                    "expected at least one target".into(),
                ));
            }
            if !(1..=3600).contains(&p.format_wait_secs) {
                return Err(invalid(
                    key("format_wait_secs"),
                    "expected seconds, 1 to 3600".into(),
                ));
            }
            if let Some(d) = &p.sim_faults_dir {
                if p.mode != Mode::Test {
                    return Err(invalid(
                        key("sim_faults_dir"),
                        "is a test-mode switch for the DAOS simulator; remove it from physical profiles".into(),
                    ));
                }
                if !d.is_absolute() {
                    return Err(invalid(
                        key("sim_faults_dir"),
                        "expected an absolute path".into(),
                    ));
                }
            }
            profiles.insert(
                name.clone(),
                Profile {
                    name,
                    image,
                    daos_version,
                    mode: p.mode,
                    port: p.port,
                    provider: p.provider,
                    fabric_iface: p.fabric_iface,
                    fabric_iface_port: p.fabric_iface_port,
                    targets: p.targets,
                    scm_size_gib: p.scm_size_gib,
                    bdev_size_gib: p.bdev_size_gib,
                    command,
                    stop_grace_secs: p.stop_grace_secs,
                    format_wait_secs: p.format_wait_secs,
                    sim_faults_dir: p.sim_faults_dir,
                },
            );
        }
        // The [node]/[[devices]] part is validated by the block-device crate itself.
        let node_text = toml::to_string(&NodeConfig {
            node: raw.node,
            devices: raw.devices,
        })
        .map_err(|e| invalid("node".into(), e.to_string()))?;
        let node = NodeConfig::parse(path, &node_text).map_err(|e| ProfileError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        if let Some(u) = raw.activation.units.iter().find(|u| !valid_unit(u)) {
            return Err(invalid(
                "activation.units".into(),
                format!("{u:?} is not a service unit name (e.g. \"daos_server.service\")"),
            ));
        }
        if let Some(c) = &raw.client {
            if !c.run_dir.is_absolute() || c.run_dir.parent().is_none() {
                return Err(invalid(
                    "client.run_dir".into(),
                    "expected an absolute path below / (e.g. \"/run/gpuq/daos\")".into(),
                ));
            }
        }
        let mut stor = BTreeMap::new();
        for (name, p) in raw.stor {
            let key = |k: &str| format!("stor.{name}.{k}");
            if !gpuq_protocol::node::valid_lease(&name) || profiles.contains_key(&name) {
                return Err(invalid(
                    format!("stor.{name}"),
                    "a kernel storage profile's name uses letters, digits, - and _ and is not also a [profiles] name".into(),
                ));
            }
            use gpuq_protocol::node::StorKind;
            let kind = match StorKind::parse(&p.kind) {
                Some(k @ (StorKind::Nvmeof | StorKind::Nfsrdma)) => k,
                Some(k) => {
                    return Err(invalid(
                        key("kind"),
                        format!(
                            "--stor {} is not built into this node helper yet; only \"nvmeof\" and \"nfsrdma\"",
                            k.name()
                        ),
                    ))
                }
                None => {
                    return Err(invalid(
                        key("kind"),
                        format!(
                            "{:?} is not a kind; expected \"nvmeof\" or \"nfsrdma\"",
                            p.kind
                        ),
                    ))
                }
            };
            let detail = match (kind, &p.mkfs_image) {
                (StorKind::Nfsrdma, Some(id)) => StorDetail::Nfs {
                    mkfs_image: ImageId::parse(id)
                        .map_err(|e| invalid(key("mkfs_image"), e.to_string()))?,
                },
                (StorKind::Nfsrdma, None) => {
                    return Err(invalid(
                        key("mkfs_image"),
                        "missing: the full ID (sha256:<64 hex>) of the image whose mkfs.xfs makes the lease's filesystems".into(),
                    ))
                }
                (_, Some(_)) => {
                    return Err(invalid(
                        key("mkfs_image"),
                        "only a --stor nfsrdma profile makes filesystems".into(),
                    ))
                }
                _ => StorDetail::Nvmeof,
            };
            let port = p.port.unwrap_or(match kind {
                StorKind::Nfsrdma => 2049,
                _ => 4420,
            });
            if !matches!(p.transport.as_str(), "tcp" | "rdma") {
                return Err(invalid(
                    key("transport"),
                    format!("{:?}: expected \"tcp\" or \"rdma\"", p.transport),
                ));
            }
            if port == 0 {
                return Err(invalid(key("port"), "expected a TCP port (1-65535)".into()));
            }
            if p.address.is_unspecified() {
                return Err(invalid(
                    key("address"),
                    "expected this node's storage address, not a wildcard".into(),
                ));
            }
            let nfs_over_rdma = kind == StorKind::Nfsrdma && p.transport == "rdma";
            let rdma_auth_sys_accepted = match (nfs_over_rdma, p.rdma_any_client_user_is_owner) {
                (true, Some(true)) => true,
                (true, _) => {
                    return Err(invalid(
                        key("transport"),
                        format!(
                            "\"rdma\": {RDMA_AUTH_SYS}; use \"tcp\", or accept that with rdma_any_client_user_is_owner = true"
                        ),
                    ))
                }
                (false, None) => false,
                (false, Some(_)) => {
                    return Err(invalid(
                        key("rdma_any_client_user_is_owner"),
                        "only a --stor nfsrdma profile over transport = \"rdma\" takes it".into(),
                    ))
                }
            };
            stor.insert(
                name.clone(),
                StorProfile {
                    name,
                    kind,
                    transport: p.transport,
                    address: p.address,
                    port,
                    detail,
                    rdma_auth_sys_accepted,
                },
            );
        }
        if !stor.is_empty() && node.devices.is_empty() {
            return Err(invalid(
                "stor".into(),
                "a kernel storage profile exports the allowlisted devices, and [[devices]] names none".into(),
            ));
        }
        Ok(ServiceConfig {
            source: path.to_path_buf(),
            node,
            profiles,
            stor,
            install: raw.install,
            activation_units: raw.activation.units,
            client_run_dir: raw.client.map(|c| c.run_dir),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[node]
name = "da1"
socket = "/run/gpuq/node.sock"
podman_socket = "/run/podman/podman.sock"
jobs_dir = "/var/lib/gpuqueue-daos/jobs"
test_dir = "/var/lib/gpuqueue-daos-test"
"#;

    fn parse(extra: &str) -> Result<ServiceConfig, ProfileError> {
        ServiceConfig::parse(
            Path::new("/etc/gpuqueue-daos/node.toml"),
            &format!("{BASE}{extra}"),
        )
    }

    #[test]
    fn a_profile_pins_an_image_by_id() {
        let id = format!("sha256:{}", "ab".repeat(32));
        let c = parse(&format!(
            "[profiles.inst1]\nimage = \"{id}\"\ndaos_version = \"2.6.4-1.el8\"\nmode = \"test\"\nport = 10101\n"
        ))
        .unwrap();
        let p = &c.profiles["inst1"];
        assert_eq!(p.image.to_string(), id);
        assert_eq!(p.mode, Mode::Test);
        assert_eq!(p.command[0], "daos_server");
        assert_eq!(c.node.node.name, "da1");
    }

    #[test]
    fn a_tag_in_a_pin_is_a_configuration_error() {
        let e = parse("[profiles.inst1]\nimage = \"localhost/gpuq-daos:2.8.1\"\ndaos_version = \"2.8.0\"\nmode = \"physical\"\nport = 10001\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("profiles.inst1.image") && e.contains("node.toml"),
            "{e}"
        );
    }

    #[test]
    fn a_ram_disk_under_daos_minimum_or_no_targets_is_refused_and_defaults_fit_daos() {
        let id = format!("sha256:{}", "ab".repeat(32));
        let p = |extra: &str| {
            parse(&format!(
                "[profiles.x]\nimage = \"{id}\"\ndaos_version = \"2.8.0\"\nmode = \"test\"\nport = 1\n{extra}"
            ))
        };
        let c = p("").unwrap();
        assert_eq!(c.profiles["x"].scm_size_gib, gpuq_daosconf::MIN_RAMDISK_GIB);
        assert_eq!(c.profiles["x"].bdev_size_gib, 2);
        let e = p("scm_size_gib = 3\n").unwrap_err().to_string();
        assert!(
            e.contains("profiles.x.scm_size_gib") && e.contains("below DAOS's minimum ram-disk"),
            "{e}"
        );
        let e = p("targets = 0\n").unwrap_err().to_string();
        assert!(e.contains("profiles.x.targets"), "{e}");
    }

    #[test]
    fn unknown_keys_and_versions_are_refused() {
        let id = format!("sha256:{}", "ab".repeat(32));
        let e = parse(&format!("[profiles.x]\nimage = \"{id}\"\ndaos_version = \"2.8.0\"\nmode = \"test\"\nport = 1\nprot = 2\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("prot"), "{e}");
        let e = parse(&format!(
            "[profiles.x]\nimage = \"{id}\"\ndaos_version = \"2.4.0\"\nmode = \"test\"\nport = 1\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("profiles.x.daos_version"), "{e}");
    }

    #[test]
    fn an_nfsrdma_profile_pins_its_mkfs_image_and_listens_on_2049() {
        let dev = "[[devices]]\nserial = \"S1\"\npci = \"0000:00:11.0\"\nnsid = 1\nsize_bytes = 1073741824\n";
        let id = format!("sha256:{}", "cd".repeat(32));
        let c = parse(&format!(
            "{dev}[stor.nfs]\nkind = \"nfsrdma\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"\nmkfs_image = \"{id}\"\n"
        ))
        .unwrap();
        let p = &c.stor["nfs"];
        assert_eq!(
            (p.kind, p.port),
            (gpuq_protocol::node::StorKind::Nfsrdma, 2049)
        );
        assert!(p.accepted_risks().is_empty());
        match &p.detail {
            StorDetail::Nfs { mkfs_image } => assert_eq!(mkfs_image.to_string(), id),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn nfs_over_rdma_is_refused_unless_the_operator_accepts_that_any_client_user_may_act_as_the_owner(
    ) {
        let dev = "[[devices]]\nserial = \"S1\"\npci = \"0000:00:11.0\"\nnsid = 1\nsize_bytes = 1073741824\n";
        let id = format!("sha256:{}", "cd".repeat(32));
        let nfs = |extra: &str| {
            parse(&format!(
                "{dev}[stor.nfs]\nkind = \"nfsrdma\"\naddress = \"10.0.0.11\"\nmkfs_image = \"{id}\"\n{extra}\n"
            ))
        };
        // RDMA without the key, or with it false: refused in one line
        // saying why and what to do.
        for extra in [
            "transport = \"rdma\"",
            "transport = \"rdma\"\nrdma_any_client_user_is_owner = false",
        ] {
            let e = nfs(extra).unwrap_err().to_string();
            assert!(e.contains("stor.nfs.transport"), "{e}");
            assert!(
                e.contains("privileged port") && e.contains("use \"tcp\""),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        // Accepted: the profile says so, for the status and the plan.
        let c = nfs("transport = \"rdma\"\nrdma_any_client_user_is_owner = true").unwrap();
        let p = &c.stor["nfs"];
        assert_eq!(p.transport, "rdma");
        let risks = p.accepted_risks();
        assert_eq!(risks.len(), 1);
        assert!(
            risks[0].starts_with("stor.nfs: NFS over RDMA with AUTH_SYS: "),
            "{risks:?}"
        );
        assert_eq!(c.accepted_risks(), risks);
        // The key anywhere else is a mistake, not a no-op.
        let e = nfs("transport = \"tcp\"\nrdma_any_client_user_is_owner = true")
            .unwrap_err()
            .to_string();
        assert!(e.contains("stor.nfs.rdma_any_client_user_is_owner"), "{e}");
        let e = parse(&format!(
            "{dev}[stor.nv]\nkind = \"nvmeof\"\ntransport = \"rdma\"\naddress = \"10.0.0.11\"\nrdma_any_client_user_is_owner = true\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("stor.nv.rdma_any_client_user_is_owner"), "{e}");
    }

    #[test]
    fn a_stor_profile_is_nvmeof_with_a_transport_and_an_address_and_needs_devices() {
        let dev = "[[devices]]\nserial = \"S1\"\npci = \"0000:00:11.0\"\nnsid = 1\nsize_bytes = 1073741824\n";
        let c = parse(&format!(
            "{dev}[stor.nvmeof]\nkind = \"nvmeof\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"\n"
        ))
        .unwrap();
        let p = &c.stor["nvmeof"];
        assert_eq!(
            (p.kind, p.transport.as_str(), p.address.to_string(), p.port),
            (
                gpuq_protocol::node::StorKind::Nvmeof,
                "tcp",
                "10.0.0.11".into(),
                4420
            )
        );
        for (bad, key) in [
            (
                "kind = \"lustre\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"",
                "stor.nvmeof.kind",
            ),
            (
                "kind = \"nfsrdma\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"",
                "stor.nvmeof.mkfs_image",
            ),
            (
                "kind = \"nfsrdma\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"\nmkfs_image = \"debian:12\"",
                "stor.nvmeof.mkfs_image",
            ),
            (
                "kind = \"nvmeof\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"\nmkfs_image = \"sha256:0\"",
                "stor.nvmeof.mkfs_image",
            ),
            (
                "kind = \"nvmeof\"\ntransport = \"fc\"\naddress = \"10.0.0.11\"",
                "stor.nvmeof.transport",
            ),
            (
                "kind = \"nvmeof\"\ntransport = \"tcp\"\naddress = \"0.0.0.0\"",
                "stor.nvmeof.address",
            ),
            (
                "kind = \"nvmeof\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"\nport = 0",
                "stor.nvmeof.port",
            ),
        ] {
            let e = parse(&format!("{dev}[stor.nvmeof]\n{bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
        let e = parse(
            "[stor.nvmeof]\nkind = \"nvmeof\"\ntransport = \"tcp\"\naddress = \"10.0.0.11\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[[devices]]"), "{e}");
    }

    #[test]
    fn install_paths_default_to_the_packages_and_must_be_absolute() {
        let c = parse("").unwrap();
        assert_eq!(c.install, gpuq_manifest::InstallPaths::default());
        assert_eq!(c.install.prefix, Path::new("/"));
        let c = parse("[install]\nmanifest_dir = \"/t/m\"\nprefix = \"/t\"\n").unwrap();
        assert_eq!(c.install.manifest_dir, Path::new("/t/m"));
        let e = parse("[install]\nprefix = \"t\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("install.prefix"), "{e}");
        let e = parse("[install]\nroot = \"/t\"\n").unwrap_err().to_string();
        assert!(e.contains("root"), "{e}");
    }
}
