//! `[daos]` of `broker.toml`: the storage nodes, how to reach them, the
//! step deadlines and the profiles (`gpuq submit --inst NAME`) — the
//! lease's own configuration, read here so that whatever drives a lease
//! (the broker today) takes it as it is. The broker parses the file (its
//! owner check, unknown keys, `enabled`) and hands `[daos]` over.

use serde::Deserialize;
use std::path::PathBuf;

/// A key of `[daos]` with a value that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The key as the file spells it (`daos.profiles.image`).
    pub key: &'static str,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDaos {
    /// `false`: DAOS jobs are off on this host although the section is
    /// there (the packaged configuration ships so, until an operator fills
    /// in the nodes and turns it on). Missing: on, as before this key
    /// existed, so existing configurations keep working.
    pub enabled: Option<bool>,
    run_dir: Option<PathBuf>,
    podman_socket: Option<PathBuf>,
    forward_dir: Option<PathBuf>,
    ssh_user: Option<String>,
    // Required when enabled (checked in `parse`), optional in the
    // parse so that a disabled section may leave them out.
    identity_file: Option<PathBuf>,
    known_hosts_file: Option<PathBuf>,
    ssh_config_file: Option<PathBuf>,
    node_socket: Option<PathBuf>,
    node_podman_socket: Option<PathBuf>,
    join_timeout_secs: Option<u64>,
    link_timeout_secs: Option<u64>,
    ssh_connect_timeout_secs: Option<u64>,
    request_timeout_secs: Option<u64>,
    preflight_timeout_secs: Option<u64>,
    start_timeout_secs: Option<u64>,
    format_timeout_secs: Option<u64>,
    stop_timeout_secs: Option<u64>,
    wipe_timeout_secs: Option<u64>,
    #[serde(default)]
    nodes: Vec<RawNode>,
    #[serde(default)]
    profiles: std::collections::BTreeMap<String, RawProfile>,
    /// `[daos.stor.NAME]`: kernel storage profiles (`gpuq submit --stor
    /// NAME`) on the same nodes; each node's `[stor.NAME]` says how.
    #[serde(default)]
    stor: std::collections::BTreeMap<String, RawStor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStor {
    kind: String,
    /// `nfsrdma`: this host's storage address, the one client each
    /// node's export admits.
    client_address: Option<std::net::IpAddr>,
    /// `nfsrdma`: where the nodes' exports are mounted on this host
    /// (`<mount_dir>/<lease>/<node>-<volume>`); default `/run/gpuq/stor`.
    mount_dir: Option<std::path::PathBuf>,
}

/// One `[daos.stor.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorProfile {
    pub kind: gpuq_protocol::node::StorKind,
    /// `nfsrdma`: how this host mounts the exports.
    pub nfs: Option<NfsClient>,
}

/// A `--stor nfsrdma` profile's client side (this host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsClient {
    pub client_address: std::net::IpAddr,
    pub mount_dir: std::path::PathBuf,
}

/// Where a `--stor nfsrdma` lease's mounts go by default.
pub const DEFAULT_STOR_MOUNT_DIR: &str = "/run/gpuq/stor";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    host: String,
    port: Option<u16>,
    address: Option<String>,
    node_socket: Option<PathBuf>,
    podman_socket: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    image: String,
    system: Option<String>,
    port: Option<u16>,
    replicas: Vec<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    client_image: Option<String>,
    #[serde(default)]
    client_mounts: Vec<PathBuf>,
}

/// `[daos]`: the storage nodes, how to reach them, and the profiles
/// (`gpuq submit --inst NAME`). Absent: DAOS jobs are not enabled.
#[derive(Debug, Clone)]
pub struct DaosConfig {
    /// Per-lease files on this host (control/agent configs, agent socket).
    pub run_dir: PathBuf,
    /// This host's Podman API socket (admin and agent containers).
    pub podman_socket: PathBuf,
    /// Where the forwarded node sockets live (0700).
    pub forward_dir: PathBuf,
    pub ssh_user: String,
    pub identity_file: PathBuf,
    pub known_hosts_file: PathBuf,
    pub ssh_config_file: Option<PathBuf>,
    /// The gpuq-node socket on every node (remote path).
    pub node_socket: PathBuf,
    /// The Podman socket on every node (remote path).
    pub node_podman_socket: PathBuf,
    pub join_timeout_secs: u64,
    pub link_timeout_secs: u64,
    /// ssh's `ConnectTimeout` for a node link's master (the whole master
    /// start may take 2 s more). 5 by default; raise it for slow links
    /// (the site VM's emulated CPUs need about 7 s for four at once).
    pub ssh_connect_timeout_secs: u64,
    /// Each step's deadline (`*_timeout_secs`; docs/operations.md).
    pub deadlines: crate::Deadlines,
    pub nodes: Vec<DaosNode>,
    pub profiles: std::collections::BTreeMap<String, DaosProfile>,
    /// `[daos.stor.NAME]`: the kernel storage profiles.
    pub stor: std::collections::BTreeMap<String, StorProfile>,
}

#[derive(Debug, Clone)]
pub struct DaosNode {
    pub name: String,
    /// The ssh destination.
    pub host: String,
    pub port: Option<u16>,
    /// How dmg reaches the node's server (default: `host`).
    pub address: String,
    /// This node's gpuq-node socket, if not `[daos] node_socket`.
    pub node_socket: Option<PathBuf>,
    /// This node's Podman socket, if not `[daos] node_podman_socket`.
    pub podman_socket: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct DaosProfile {
    /// `sha256:<64 hex>`: the one image ID servers, admin and agent use.
    pub image: String,
    pub system: String,
    pub port: u16,
    pub replicas: Vec<String>,
    pub env: Vec<(String, String)>,
    /// `gpuq daos-exec`'s image (default: `image`), by full ID.
    pub client_image: String,
    /// Host paths an operator allows in every client container (checked
    /// again at each `daos-exec`: absolute, no `..`, present, and not a
    /// symlink leading outside this set).
    pub client_mounts: Vec<PathBuf>,
}

/// Variables a profile may not set: the ones gpuq sets itself per lease.
const RESERVED_ENV: [&str; 4] = [
    "DAOS_SYSTEM",
    "DAOS_CONTROL_CONFIG",
    "DAOS_AGENT_DRPC_DIR",
    "GPUQ_JOB_ID",
];

/// `p`, else `default`, if it is an absolute path; `key` names it in the
/// refusal. The broker's own keys use the same rule.
pub fn absolute(key: &'static str, p: Option<PathBuf>, default: &str) -> Result<PathBuf, Invalid> {
    let p = p.unwrap_or_else(|| PathBuf::from(default));
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(Invalid {
            key,
            message: format!("expected an absolute path, got '{}'", p.display()),
        })
    }
}

/// Check `[daos]` (enabled) and fill in its defaults.
pub fn parse(d: RawDaos) -> Result<DaosConfig, Invalid> {
    let invalid = |key: &'static str, message: String| Invalid { key, message };
    let abs = absolute;
    let required = |key: &'static str, v: Option<PathBuf>| {
        v.ok_or_else(|| invalid(key, "missing (required while [daos] is enabled)".into()))
    };
    if d.nodes.is_empty() {
        return Err(invalid(
            "daos.nodes",
            "at least one [[daos.nodes]] is needed".into(),
        ));
    }
    let mut nodes: Vec<DaosNode> = Vec::new();
    for n in d.nodes {
        let ok = !n.name.is_empty()
            && n.name.len() <= 32
            && n.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(invalid(
                "daos.nodes.name",
                format!("'{}' is not a node name (letters, digits, - and _)", n.name),
            ));
        }
        if nodes.iter().any(|m| m.name == n.name) {
            return Err(invalid(
                "daos.nodes.name",
                format!("node '{}' is listed twice", n.name),
            ));
        }
        if n.host.is_empty() || n.host.starts_with('-') {
            return Err(invalid(
                "daos.nodes.host",
                format!("'{}' is not an ssh destination", n.host),
            ));
        }
        let node_socket = match n.node_socket {
            Some(p) => Some(abs("daos.nodes.node_socket", Some(p), "")?),
            None => None,
        };
        let podman_socket = match n.podman_socket {
            Some(p) => Some(abs("daos.nodes.podman_socket", Some(p), "")?),
            None => None,
        };
        nodes.push(DaosNode {
            node_socket,
            podman_socket,
            address: n.address.unwrap_or_else(|| n.host.clone()),
            name: n.name,
            host: n.host,
            port: n.port,
        });
    }
    if d.profiles.is_empty() {
        return Err(invalid(
            "daos.profiles",
            "at least one [daos.profiles.NAME] is needed".into(),
        ));
    }
    let mut profiles = std::collections::BTreeMap::new();
    for (name, p) in d.profiles {
        if let Err(e) = gpuq_podman::ImageId::parse(&p.image) {
            return Err(invalid(
                "daos.profiles.image",
                format!("profile '{name}': {e}; images are pinned by full ID only (sha256:<64 lowercase hex>)"),
            ));
        }
        if p.replicas.is_empty() || p.replicas.len() % 2 == 0 {
            return Err(invalid(
                "daos.profiles.replicas",
                format!("profile '{name}': DAOS needs an odd number of management-service replicas, got {}", p.replicas.len()),
            ));
        }
        for k in p.env.keys() {
            if RESERVED_ENV.contains(&k.as_str()) || k == "DAOS_POOL" || k == "DAOS_CONTAINER" {
                return Err(invalid(
                    "daos.profiles.env",
                    format!("profile '{name}': {k} is set by gpuq per lease (or removed); remove it from the profile"),
                ));
            }
        }
        let client_image = p.client_image.unwrap_or_else(|| p.image.clone());
        if let Err(e) = gpuq_podman::ImageId::parse(&client_image) {
            return Err(invalid(
                "daos.profiles.client_image",
                format!("profile '{name}': {e}; images are pinned by full ID only (sha256:<64 lowercase hex>)"),
            ));
        }
        if let Some(sys) = &p.system {
            // DAOS refuses a longer name in every config (DAOS_SYS_NAME_MAX):
            // refused here, at start, not at the first job.
            if let Err(e) = gpuq_daosconf::system_name(sys) {
                return Err(invalid(
                    "daos.profiles.system",
                    format!("profile '{name}': {e}"),
                ));
            }
        }
        for m in &p.client_mounts {
            let bad = !m.is_absolute()
                || m.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir));
            if bad {
                return Err(invalid(
                    "daos.profiles.client_mounts",
                    format!(
                        "profile '{name}': '{}' must be an absolute path without '..'",
                        m.display()
                    ),
                ));
            }
        }
        profiles.insert(
            name,
            DaosProfile {
                client_image,
                client_mounts: p.client_mounts,
                image: p.image,
                system: p.system.unwrap_or_else(|| "daos_server".into()),
                port: p.port.unwrap_or(10001),
                replicas: p.replicas,
                env: p.env.into_iter().collect(),
            },
        );
    }
    let mut stor = std::collections::BTreeMap::new();
    for (name, p) in d.stor {
        if profiles.contains_key(&name) || !gpuq_protocol::node::valid_lease(&name) {
            return Err(invalid(
                "daos.stor",
                format!("'{name}': a kernel storage profile's name uses letters, digits, - and _ and is not also a [daos.profiles] name"),
            ));
        }
        use gpuq_protocol::node::StorKind;
        let kind = match StorKind::parse(&p.kind) {
            Some(k @ (StorKind::Nvmeof | StorKind::Nfsrdma)) => k,
            Some(k) => {
                return Err(invalid(
                    "daos.stor.kind",
                    format!(
                        "'{name}': --stor {} is not built yet; only \"nvmeof\" and \"nfsrdma\"",
                        k.name()
                    ),
                ))
            }
            None => {
                return Err(invalid(
                    "daos.stor.kind",
                    format!(
                        "'{name}': {:?} is not a kind; expected \"nvmeof\" or \"nfsrdma\"",
                        p.kind
                    ),
                ))
            }
        };
        let nfs = match (kind, p.client_address) {
            (StorKind::Nfsrdma, Some(a)) if !a.is_unspecified() => {
                let mount_dir = p
                    .mount_dir
                    .unwrap_or_else(|| DEFAULT_STOR_MOUNT_DIR.into());
                if !mount_dir.is_absolute()
                    || mount_dir.components().count() < 2
                    || mount_dir
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir))
                {
                    return Err(invalid(
                        "daos.stor.mount_dir",
                        format!("'{name}': expected an absolute path below / (e.g. \"/run/gpuq/stor\")"),
                    ));
                }
                Some(NfsClient {
                    client_address: a,
                    mount_dir,
                })
            }
            (StorKind::Nfsrdma, _) => {
                return Err(invalid(
                    "daos.stor.client_address",
                    format!("'{name}': --stor nfsrdma needs this host's storage address (the one client the nodes' exports admit)"),
                ))
            }
            (_, None) if p.mount_dir.is_none() => None,
            _ => {
                return Err(invalid(
                    "daos.stor.client_address",
                    format!("'{name}': client_address and mount_dir are --stor nfsrdma's"),
                ))
            }
        };
        stor.insert(name, StorProfile { kind, nfs });
    }
    let defaults = crate::Deadlines::default();
    let secs = |key: &'static str, v: Option<u64>, default: std::time::Duration| match v {
        None => Ok(default),
        Some(s) if (1..=86_400).contains(&s) => Ok(std::time::Duration::from_secs(s)),
        Some(s) => Err(invalid(
            key,
            format!("{s} is not a deadline in seconds from 1 to 86400"),
        )),
    };
    let deadlines = crate::Deadlines {
        request: secs(
            "daos.request_timeout_secs",
            d.request_timeout_secs,
            defaults.request,
        )?,
        preflight: secs(
            "daos.preflight_timeout_secs",
            d.preflight_timeout_secs,
            defaults.preflight,
        )?,
        start: secs(
            "daos.start_timeout_secs",
            d.start_timeout_secs,
            defaults.start,
        )?,
        format: secs(
            "daos.format_timeout_secs",
            d.format_timeout_secs,
            defaults.format,
        )?,
        stop: secs("daos.stop_timeout_secs", d.stop_timeout_secs, defaults.stop)?,
        wipe: secs("daos.wipe_timeout_secs", d.wipe_timeout_secs, defaults.wipe)?,
    };
    Ok(DaosConfig {
        run_dir: abs("daos.run_dir", d.run_dir, "/run/gpuq/daos")?,
        podman_socket: abs(
            "daos.podman_socket",
            d.podman_socket,
            "/run/podman/podman.sock",
        )?,
        forward_dir: abs("daos.forward_dir", d.forward_dir, "/run/gpuq/links")?,
        ssh_user: d.ssh_user.unwrap_or_else(|| "root".into()),
        identity_file: abs(
            "daos.identity_file",
            Some(required("daos.identity_file", d.identity_file)?),
            "",
        )?,
        known_hosts_file: abs(
            "daos.known_hosts_file",
            Some(required("daos.known_hosts_file", d.known_hosts_file)?),
            "",
        )?,
        ssh_config_file: match d.ssh_config_file {
            Some(p) => Some(abs("daos.ssh_config_file", Some(p), "")?),
            None => None,
        },
        node_socket: abs("daos.node_socket", d.node_socket, "/run/gpuq/node.sock")?,
        node_podman_socket: abs(
            "daos.node_podman_socket",
            d.node_podman_socket,
            "/run/podman/podman.sock",
        )?,
        join_timeout_secs: d.join_timeout_secs.unwrap_or(120),
        link_timeout_secs: d.link_timeout_secs.unwrap_or(15),
        ssh_connect_timeout_secs: match d.ssh_connect_timeout_secs {
            None => 5,
            Some(s) if (1..=600).contains(&s) => s,
            Some(_) => {
                return Err(invalid(
                    "daos.ssh_connect_timeout_secs",
                    "expected seconds, 1 to 600".into(),
                ))
            }
        },
        deadlines,
        nodes,
        profiles,
        stor,
    })
}
