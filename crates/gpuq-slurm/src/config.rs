//! `slurm.toml`: `[slurm]` and the site's `[daos]`.

use crate::Error;
use gpuq_lifecycle::config::{DaosConfig, RawDaos};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The default configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/gpuq/slurm.toml";

/// `slurm.toml`: `[slurm]` and the site's `[daos]` (the same table as the
/// broker's `broker.toml`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    slurm: RawSlurm,
    daos: RawDaos,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlurm {
    state_dir: Option<PathBuf>,
    pool: Option<String>,
    default_profile: Option<String>,
    agent_host: String,
    squeue: Option<PathBuf>,
    scontrol: Option<PathBuf>,
    lock_wait_secs: Option<u64>,
    #[serde(default)]
    gpu_hosts: Vec<RawGpuHost>,
}

/// `[[slurm.gpu_hosts]]`: another GPU host whose DAOS jobs get the
/// lease's client side (files, agent) from its own gpuq-node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpuHost {
    name: String,
    host: String,
    port: Option<u16>,
    node_socket: Option<PathBuf>,
    podman_socket: Option<PathBuf>,
    run_dir: Option<PathBuf>,
}

/// A GPU host other than `agent_host` that serves DAOS jobs: its
/// gpuq-node (with `[client]`) writes the lease's files and runs its agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHost {
    /// Its Slurm NodeName (and its link's name).
    pub name: String,
    /// The ssh destination (the `[daos]` ssh settings apply).
    pub host: String,
    pub port: Option<u16>,
    /// Its gpuq-node socket there, if not `[daos] node_socket`.
    pub node_socket: Option<PathBuf>,
    /// Its Podman socket there (for its broker's `daos-exec`), if not
    /// `[daos] podman_socket`.
    pub podman_socket: PathBuf,
    /// Its helper's `[client] run_dir`, if not `[daos] run_dir`: the
    /// job's variables name files there.
    pub run_dir: PathBuf,
}

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Root's, 0700: `leases/` (the lease store), `jobs/` (one record per
    /// Slurm job between setup and teardown), `lock`.
    pub state_dir: PathBuf,
    /// The burst buffer pool's name (one unit: one DAOS job at a time).
    pub pool: String,
    /// The profile of a request without `profile=`.
    pub default_profile: String,
    /// The Slurm node (`NodeName`) that is this host: the lease's agent
    /// runs on its Podman, so a DAOS job must run there.
    pub agent_host: String,
    /// Slurm's `squeue`, for a job's state and nodes.
    pub squeue: PathBuf,
    /// Slurm's `scontrol`, to pin a DAOS job to `agent_host` at its setup.
    pub scontrol: PathBuf,
    /// How long a verb waits for another one's lock.
    pub lock_wait: Duration,
    /// The other GPU hosts a DAOS job may ask for (`--nodelist`).
    pub gpu_hosts: Vec<GpuHost>,
    pub daos: DaosConfig,
}

impl Config {
    /// The configured GPU host `name` other than `agent_host`.
    pub fn gpu_host(&self, name: &str) -> Option<&GpuHost> {
        self.gpu_hosts.iter().find(|h| h.name == name)
    }

    /// Every host a DAOS job may run on: `agent_host`, then the others.
    pub fn daos_hosts(&self) -> Vec<&str> {
        std::iter::once(self.agent_host.as_str())
            .chain(self.gpu_hosts.iter().map(|h| h.name.as_str()))
            .collect()
    }
}

/// Read and check `path` (root's, not writable by others: `read_trusted`).
pub fn load(path: &Path) -> Result<Config, Error> {
    let text = gpuq_conffile::read_trusted(path).map_err(|e| Error::Config(e.to_string()))?;
    parse(path, &text)
}

/// The configuration in `text` (read from `path`, named in errors).
pub fn parse(path: &Path, text: &str) -> Result<Config, Error> {
    let raw: RawFile =
        gpuq_conffile::parse_toml(path, text).map_err(|e| Error::Config(e.to_string()))?;
    let bad = |key: &str, why: &str| Error::Config(format!("{}: {key}: {why}", path.display()));
    let daos = gpuq_lifecycle::config::parse(raw.daos).map_err(|e| bad(e.key, &e.message))?;
    let s = raw.slurm;
    let state_dir =
        gpuq_lifecycle::config::absolute("slurm.state_dir", s.state_dir, "/var/lib/gpuq/slurm")
            .map_err(|e| bad(e.key, &e.message))?;
    let pool = s.pool.unwrap_or_else(|| "daos".into());
    if !gpuq_protocol::node::valid_lease(&pool) {
        return Err(bad("slurm.pool", "letters, digits, - and _"));
    }
    let default_profile = match s.default_profile {
        Some(p) => p,
        None if daos.profiles.len() == 1 => {
            daos.profiles.keys().next().cloned().unwrap_or_default()
        }
        None => {
            return Err(bad(
                "slurm.default_profile",
                "required when [daos] has more than one profile",
            ))
        }
    };
    if !daos.profiles.contains_key(&default_profile) {
        return Err(bad(
            "slurm.default_profile",
            &format!("`{default_profile}` is not a [daos.profiles] entry"),
        ));
    }
    if s.agent_host.is_empty() || s.agent_host.contains(char::is_whitespace) {
        return Err(bad("slurm.agent_host", "a Slurm NodeName"));
    }
    let squeue = gpuq_lifecycle::config::absolute("slurm.squeue", s.squeue, "/usr/bin/squeue")
        .map_err(|e| bad(e.key, &e.message))?;
    let scontrol =
        gpuq_lifecycle::config::absolute("slurm.scontrol", s.scontrol, "/usr/bin/scontrol")
            .map_err(|e| bad(e.key, &e.message))?;
    let lock_wait = Duration::from_secs(s.lock_wait_secs.unwrap_or(600).clamp(1, 86400));
    let mut gpu_hosts: Vec<GpuHost> = Vec::new();
    for g in s.gpu_hosts {
        if !gpuq_protocol::node::valid_lease(&g.name)
            || g.name == s.agent_host
            || gpu_hosts.iter().any(|h| h.name == g.name)
            || daos.nodes.iter().any(|n| n.name == g.name)
        {
            return Err(bad(
                "slurm.gpu_hosts.name",
                &format!("`{}`: a Slurm NodeName (letters, digits, - and _), once, not agent_host, not a storage node", g.name),
            ));
        }
        if g.host.is_empty() || g.host.contains(char::is_whitespace) || g.host.starts_with('-') {
            return Err(bad("slurm.gpu_hosts.host", "an ssh destination"));
        }
        let path = |key: &'static str, p: Option<PathBuf>, default: &Path| match p {
            None => Ok(default.to_path_buf()),
            Some(p) => gpuq_lifecycle::config::absolute(key, Some(p), "")
                .map_err(|e| bad(e.key, &e.message)),
        };
        gpu_hosts.push(GpuHost {
            run_dir: path("slurm.gpu_hosts.run_dir", g.run_dir, &daos.run_dir)?,
            podman_socket: path(
                "slurm.gpu_hosts.podman_socket",
                g.podman_socket,
                &daos.podman_socket,
            )?,
            node_socket: match g.node_socket {
                None => None,
                Some(p) => Some(path("slurm.gpu_hosts.node_socket", Some(p), &daos.run_dir)?),
            },
            name: g.name,
            host: g.host,
            port: g.port,
        });
    }
    Ok(Config {
        state_dir,
        pool,
        default_profile,
        agent_host: s.agent_host,
        squeue,
        scontrol,
        lock_wait,
        gpu_hosts,
        daos,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const DAOS: &str = r#"
[daos]
run_dir = "/run/gpuq/daos"
podman_socket = "/run/podman/podman.sock"
forward_dir = "/run/gpuq/links"
identity_file = "/etc/gpuq/id"
known_hosts_file = "/etc/gpuq/known_hosts"
[[daos.nodes]]
name = "da1"
host = "da1"
[daos.profiles.test]
image = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
replicas = ["da1"]
"#;

    pub(crate) fn cfg(slurm: &str, daos: &str) -> Result<Config, Error> {
        parse(
            Path::new("/etc/gpuq/slurm.toml"),
            &format!("{slurm}\n{daos}"),
        )
    }

    #[test]
    fn defaults_and_the_one_profile() {
        let c = cfg("[slurm]\nagent_host = \"cxl2\"", DAOS).unwrap();
        assert_eq!(c.state_dir, Path::new("/var/lib/gpuq/slurm"));
        assert_eq!(c.pool, "daos");
        assert_eq!(c.default_profile, "test");
        assert_eq!(c.squeue, Path::new("/usr/bin/squeue"));
        assert_eq!(c.scontrol, Path::new("/usr/bin/scontrol"));
        assert_eq!(c.lock_wait, Duration::from_secs(600));
    }

    #[test]
    fn other_gpu_hosts_take_the_daos_defaults_and_bad_ones_are_named() {
        let c = cfg(
            "[slurm]\nagent_host = \"cxl2\"\n[[slurm.gpu_hosts]]\nname = \"gpu2\"\nhost = \"10.0.0.2\"\n[[slurm.gpu_hosts]]\nname = \"gpu3\"\nhost = \"gpu3\"\nrun_dir = \"/run/x\"\npodman_socket = \"/run/p.sock\"",
            DAOS,
        )
        .unwrap();
        assert_eq!(c.daos_hosts(), vec!["cxl2", "gpu2", "gpu3"]);
        let g = c.gpu_host("gpu2").unwrap();
        assert_eq!(
            (g.run_dir.as_path(), g.podman_socket.as_path(), g.port),
            (
                Path::new("/run/gpuq/daos"),
                Path::new("/run/podman/podman.sock"),
                None
            )
        );
        let g = c.gpu_host("gpu3").unwrap();
        assert_eq!(g.run_dir, Path::new("/run/x"));
        assert_eq!(g.podman_socket, Path::new("/run/p.sock"));
        assert!(c.gpu_host("cxl2").is_none());
        for (table, key) in [
            ("name = \"cxl2\"\nhost = \"h\"", "slurm.gpu_hosts.name"),
            ("name = \"da1\"\nhost = \"h\"", "slurm.gpu_hosts.name"),
            ("name = \"a b\"\nhost = \"h\"", "slurm.gpu_hosts.name"),
            (
                "name = \"g\"\nhost = \"-oProxyCommand=x\"",
                "slurm.gpu_hosts.host",
            ),
            (
                "name = \"g\"\nhost = \"h\"\nrun_dir = \"rel\"",
                "slurm.gpu_hosts.run_dir",
            ),
        ] {
            let e = cfg(
                &format!("[slurm]\nagent_host = \"cxl2\"\n[[slurm.gpu_hosts]]\n{table}"),
                DAOS,
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains(key), "{table}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn every_bad_value_is_one_line_naming_its_key() {
        let two = format!(
            "{DAOS}[daos.profiles.other]\nimage = \"sha256:{}\"\nreplicas = [\"da1\"]\n",
            "1".repeat(64)
        );
        let cases: Vec<(String, &str, &str)> = vec![
            ("[slurm]".into(), DAOS, "agent_host"),
            (
                "[slurm]\nagent_host = \"cxl2\"\nstate = 1".into(),
                DAOS,
                "state",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"\nstate_dir = \"rel\"".into(),
                DAOS,
                "slurm.state_dir",
            ),
            (
                "[slurm]\nagent_host = \"a b\"".into(),
                DAOS,
                "slurm.agent_host",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"\npool = \"a/b\"".into(),
                DAOS,
                "slurm.pool",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"\ndefault_profile = \"nope\"".into(),
                DAOS,
                "slurm.default_profile",
            ),
            (
                "[slurm]\nagent_host = \"cxl2\"".into(),
                &two,
                "slurm.default_profile",
            ),
        ];
        for (slurm, daos, key) in cases {
            let e = cfg(&slurm, daos).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{slurm}: {e}");
            let e = e.to_string();
            assert!(e.contains(key) && !e.contains('\n'), "{slurm}: {e}");
        }
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../../config/slurm/slurm.toml");
        let c = parse(Path::new("config/slurm/slurm.toml"), text).unwrap();
        assert_eq!(c.agent_host, "cxl2");
        assert_eq!(c.default_profile, "inst1");
        assert_eq!(c.daos.nodes.len(), 4);
    }
}
