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
    pub daos: DaosConfig,
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
    Ok(Config {
        state_dir,
        pool,
        default_profile,
        agent_host: s.agent_host,
        squeue,
        scontrol,
        lock_wait,
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
