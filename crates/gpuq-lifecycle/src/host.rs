//! The GPU host's part of a lease, through the host's own Podman API:
//! the admin container that runs `dmg` (format, join poll, system stop),
//! the agent container, and removing client containers at cleanup.
//!
//! Every container is created from the profile's pinned image ID and
//! labelled with the lease and its role, so cleanup finds exactly this
//! lease's containers and nothing else. Files of a lease (the control and
//! agent configs, the agent's socket directory) live under
//! `<run_dir>/<lease>/`, which cleanup removes.

use gpuq_podman::{
    lease_labels, ContainerSpec, ExecSpec, ImageId, LabelFilter, LibpodClient, LogStream, Mount,
    Namespace, Podman, Role,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the GPU host needs to know about the DAOS system of a profile.
#[derive(Debug, Clone)]
pub struct HostProfile {
    /// The profile's pinned image (servers, admin and agent use the same).
    pub image: ImageId,
    /// The DAOS system name the servers render (`name:`).
    pub system: String,
    /// The servers' control port.
    pub port: u16,
    /// The storage nodes: (name, address dmg reaches its server at).
    pub nodes: Vec<(String, String)>,
    /// The management-service replicas (the agent's access points).
    pub access_points: Vec<String>,
    /// How long the ranks may take to join after the format.
    pub join_timeout: Duration,
    /// Extra variables for the job's environment.
    pub env: Vec<(String, String)>,
}

/// The GPU host's containers of one profile.
#[derive(Debug, Clone)]
pub struct Host {
    /// The host's Podman API socket.
    pub podman_socket: PathBuf,
    /// Root-owned directory for per-lease files (`<run_dir>/<lease>/`).
    pub run_dir: PathBuf,
    pub profile: HostProfile,
}

const CONTROL_IN: &str = "/etc/daos/daos_control.yml";
const AGENT_CONF_IN: &str = "/etc/daos/daos_agent.yml";
const AGENT_DIR_IN: &str = "/var/run/daos_agent";
/// How often the join (and "format required") is polled: each poll is one
/// `dmg` exec (~50 ms); the join is seen at most this late.
const POLL: Duration = Duration::from_millis(100);

fn yaml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    format!("[{}]", quoted.join(", "))
}

impl Host {
    pub fn lease_dir(&self, lease: &str) -> PathBuf {
        self.run_dir.join(lease)
    }
    /// The control config on the host (for `DAOS_CONTROL_CONFIG`).
    pub fn control_config(&self, lease: &str) -> PathBuf {
        self.lease_dir(lease).join("daos_control.yml")
    }
    /// The agent's socket directory on the host (for `DAOS_AGENT_DRPC_DIR`).
    pub fn agent_dir(&self, lease: &str) -> PathBuf {
        self.lease_dir(lease).join("agent")
    }
    fn admin_name(lease: &str) -> String {
        format!("gpuq-{lease}-admin")
    }
    fn agent_name(lease: &str) -> String {
        format!("gpuq-{lease}-agent")
    }

    /// The job's DAOS variables (mission.md §4 step 5).
    pub fn job_env(&self, lease: &str) -> Vec<(String, String)> {
        let mut env = vec![
            ("DAOS_SYSTEM".to_string(), self.profile.system.clone()),
            (
                "DAOS_CONTROL_CONFIG".to_string(),
                self.control_config(lease).display().to_string(),
            ),
            (
                "DAOS_AGENT_DRPC_DIR".to_string(),
                self.agent_dir(lease).display().to_string(),
            ),
        ];
        env.extend(self.profile.env.iter().cloned());
        env
    }

    async fn podman(&self) -> Result<LibpodClient, String> {
        LibpodClient::connect(&self.podman_socket)
            .await
            .map_err(|e| format!("local Podman ({}): {e}", self.podman_socket.display()))
    }

    /// Write the lease's control and agent configs (readable by the job's
    /// user: the client containers mount them) and its agent directory.
    pub fn write_files(&self, lease: &str) -> Result<(), String> {
        let dir = self.lease_dir(lease);
        let io = |what: &Path, e: std::io::Error| format!("{}: {e}", what.display());
        std::fs::create_dir_all(&self.run_dir).map_err(|e| io(&self.run_dir, e))?;
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&dir, e)),
        }
        set_mode(&dir, 0o755).map_err(|e| io(&dir, e))?;
        let p = &self.profile;
        let control = format!(
            "# Written by gpuq-broker for lease {lease}.\nname: {}\nport: {}\nhostlist: {}\ntransport_config:\n  allow_insecure: true\n",
            p.system,
            p.port,
            yaml_list(&p.nodes.iter().map(|(_, a)| a.clone()).collect::<Vec<_>>())
        );
        gpuq_durable::write_atomic(&self.control_config(lease), control.as_bytes(), 0o644)
            .map_err(|e| io(&self.control_config(lease), e))?;
        let agent = format!(
            "# Written by gpuq-broker for lease {lease}.\nname: {}\naccess_points: {}\nport: {}\ntransport_config:\n  allow_insecure: true\nruntime_dir: {AGENT_DIR_IN}\n",
            p.system,
            yaml_list(&p.access_points),
            p.port
        );
        let agent_conf = dir.join("daos_agent.yml");
        gpuq_durable::write_atomic(&agent_conf, agent.as_bytes(), 0o644)
            .map_err(|e| io(&agent_conf, e))?;
        let ad = self.agent_dir(lease);
        match std::fs::create_dir(&ad) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&ad, e)),
        }
        set_mode(&ad, 0o755).map_err(|e| io(&ad, e))?;
        Ok(())
    }

    /// Remove `<run_dir>/<lease>/` (after the agent and clients are gone).
    pub fn remove_files(&self, lease: &str) -> Result<(), String> {
        let dir = self.lease_dir(lease);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{}: {e}", dir.display())),
        }
    }

    fn base_spec(&self, name: String, lease: &str, role: Role) -> ContainerSpec {
        let mut spec = ContainerSpec::new(name, self.profile.image.clone());
        spec.labels = lease_labels(lease, role);
        spec.network = Namespace::Host;
        spec.cap_drop = vec!["ALL".into()];
        spec.no_new_privileges = true;
        spec.mounts =
            vec![
                Mount::bind(self.control_config(lease).display().to_string(), CONTROL_IN)
                    .read_only(),
            ];
        spec
    }

    /// The admin container (idle; `dmg` runs in it by exec). Created if
    /// missing, started if stopped.
    async fn admin(&self, pm: &LibpodClient, lease: &str) -> Result<String, String> {
        let name = Self::admin_name(lease);
        match pm.container_inspect(&name).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {
                let mut spec = self.base_spec(name.clone(), lease, Role::Admin);
                // Neither image has an entrypoint: the command is the program.
                spec.command = vec!["sleep".into(), "2147483647".into()];
                pm.container_create(&spec)
                    .await
                    .map_err(|e| format!("create {name}: {e}"))?;
            }
            Err(e) => return Err(format!("inspect {name}: {e}")),
        }
        pm.container_start(&name)
            .await
            .map_err(|e| format!("start {name}: {e}"))?;
        Ok(name)
    }

    /// Write the lease's files and create and start its admin container
    /// (while the servers start: it does not need them).
    pub async fn prepare_admin(&self, lease: &str) -> Result<String, String> {
        self.write_files(lease)?;
        let pm = self.podman().await?;
        self.admin(&pm, lease).await
    }

    /// Remove the admin container and the lease's files (a preparation that
    /// failed after [`Host::prepare_admin`]).
    pub async fn discard_admin(&self, lease: &str) -> Result<String, String> {
        let r = self.remove_role(lease, Role::Admin, None).await?;
        self.remove_files(lease)?;
        Ok(r)
    }

    /// `dmg -j ARGS` in the admin container: the JSON envelope.
    async fn dmg(&self, pm: &LibpodClient, lease: &str, args: &[&str]) -> Result<Value, String> {
        let admin = self.admin(pm, lease).await?;
        let mut cmd = vec!["dmg", "-o", CONTROL_IN, "-j"];
        cmd.extend_from_slice(args);
        let out = pm
            .container_exec(&admin, &ExecSpec::new(cmd))
            .await
            .map_err(|e| format!("dmg {}: {e}", args.join(" ")))?;
        let stdout = out.output.stream(LogStream::Stdout);
        serde_json::from_slice(&stdout).map_err(|e| {
            let stderr = String::from_utf8_lossy(&out.output.stream(LogStream::Stderr))
                .trim()
                .to_string();
            format!(
                "dmg {} exited {} without a JSON envelope ({e}): {stderr}",
                args.join(" "),
                out.exit_code
            )
        })
    }

    /// `dmg storage format`: every host formatted, no host errors.
    pub async fn format(&self, lease: &str) -> Result<String, String> {
        let pm = self.podman().await?;
        let deadline = Instant::now() + self.profile.join_timeout;
        // The servers need a moment to listen and reach "format required".
        loop {
            let q = self.dmg(&pm, lease, &["system", "query"]).await?;
            let err = q["error"].as_str().unwrap_or("");
            if err.contains("format required") || err.contains("uninitialized") {
                break;
            }
            if q["error"].is_null() {
                return Err(
                    "the new system is already formatted (old metadata?); refusing to use it"
                        .into(),
                );
            }
            if Instant::now() >= deadline {
                return Err(format!("servers did not reach `format required`: {err}"));
            }
            tokio::time::sleep(POLL).await;
        }
        let f = self.dmg(&pm, lease, &["storage", "format"]).await?;
        if let Some(e) = f["error"].as_str() {
            return Err(format!("dmg storage format: {e}"));
        }
        let resp = &f["response"];
        if let Some(errs) = resp["host_errors"].as_object() {
            if !errs.is_empty() {
                let list: Vec<String> = errs
                    .values()
                    .map(|v| {
                        format!(
                            "{}: {}",
                            v["hosts"].as_str().unwrap_or("?"),
                            v["error"].as_str().unwrap_or("?")
                        )
                    })
                    .collect();
                return Err(format!(
                    "dmg storage format host errors: {}",
                    list.join("; ")
                ));
            }
        }
        let mut hosts = Vec::new();
        for (_, g) in resp["HostStorage"].as_object().into_iter().flatten() {
            let st = &g["storage"];
            let infos = st["scm_mount_points"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(st["nvme_devices"].as_array().into_iter().flatten());
            for i in infos {
                if i["info"].as_str() != Some("CTL_SUCCESS") {
                    return Err(format!(
                        "dmg storage format: {} reports {}",
                        g["hosts"].as_str().unwrap_or("?"),
                        i["info"]
                    ));
                }
            }
            hosts.push(g["hosts"].as_str().unwrap_or("?").to_string());
        }
        if hosts.is_empty() {
            return Err("dmg storage format reported no host".into());
        }
        Ok(format!("formatted {}", hosts.join(", ")))
    }

    /// Poll `dmg system query` until exactly `ranks` members are joined.
    pub async fn wait_joined(&self, lease: &str, ranks: usize) -> Result<String, String> {
        let pm = self.podman().await?;
        let deadline = Instant::now() + self.profile.join_timeout;
        loop {
            let q = self.dmg(&pm, lease, &["system", "query"]).await?;
            let members = q["response"]["members"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let joined = members
                .iter()
                .filter(|m| m["state"].as_str() == Some("joined"))
                .count();
            if joined == ranks && members.len() == ranks {
                return Ok(format!("{ranks} ranks joined"));
            }
            if Instant::now() >= deadline {
                let states: Vec<String> = members
                    .iter()
                    .map(|m| {
                        format!(
                            "rank {} {} {}",
                            m["rank"],
                            m["addr"].as_str().unwrap_or("?"),
                            m["state"].as_str().unwrap_or("?")
                        )
                    })
                    .collect();
                return Err(format!(
                    "{joined} of {ranks} ranks joined within {}s ({}){}",
                    self.profile.join_timeout.as_secs(),
                    if states.is_empty() {
                        "no members".into()
                    } else {
                        states.join(", ")
                    },
                    q["error"]
                        .as_str()
                        .map(|e| format!("; dmg: {e}"))
                        .unwrap_or_default()
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Start the agent and wait for its socket.
    pub async fn start_agent(&self, lease: &str) -> Result<String, String> {
        let pm = self.podman().await?;
        let name = Self::agent_name(lease);
        let mut spec = self.base_spec(name.clone(), lease, Role::Agent);
        spec.command = vec![
            "daos_agent".into(),
            "-o".into(),
            AGENT_CONF_IN.into(),
            "-s".into(),
            AGENT_DIR_IN.into(),
        ];
        spec.mounts.push(
            Mount::bind(
                self.lease_dir(lease)
                    .join("daos_agent.yml")
                    .display()
                    .to_string(),
                AGENT_CONF_IN,
            )
            .read_only(),
        );
        spec.mounts.push(Mount::bind(
            self.agent_dir(lease).display().to_string(),
            AGENT_DIR_IN,
        ));
        pm.container_create(&spec)
            .await
            .map_err(|e| format!("create {name}: {e}"))?;
        pm.container_start(&name)
            .await
            .map_err(|e| format!("start {name}: {e}"))?;
        let sock = self.agent_dir(lease).join("daos_agent.sock");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sock.exists() {
            if Instant::now() >= deadline {
                return Err(format!("the agent did not create {}", sock.display()));
            }
            let info = pm
                .container_inspect(&name)
                .await
                .map_err(|e| format!("inspect {name}: {e}"))?;
            if !info.state.running {
                return Err(format!(
                    "the agent container exited ({})",
                    info.state.status
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(format!("agent {name} up, socket {}", sock.display()))
    }

    /// Remove every container of `role` of this lease; confirm none is left.
    async fn remove_role(
        &self,
        lease: &str,
        role: Role,
        grace: Option<Duration>,
    ) -> Result<String, String> {
        let pm = self.podman().await?;
        let filter = LabelFilter::lease(lease).eq(gpuq_podman::LABEL_ROLE, role.as_str());
        let list = pm
            .container_list(&filter)
            .await
            .map_err(|e| format!("list {} containers: {e}", role.as_str()))?;
        let mut removed = Vec::new();
        for c in &list {
            // Without a grace period the forced delete kills at once.
            if let (true, Some(grace)) = (c.state == "running", grace) {
                pm.container_stop(&c.id, grace)
                    .await
                    .map_err(|e| format!("stop {}: {e}", short(&c.id)))?;
            }
            match pm.container_delete(&c.id, true).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(format!("remove {}: {e}", short(&c.id))),
            }
            removed.push(c.names.first().cloned().unwrap_or_else(|| short(&c.id)));
        }
        let left = pm
            .container_list(&filter)
            .await
            .map_err(|e| format!("list {} containers: {e}", role.as_str()))?;
        if !left.is_empty() {
            return Err(format!(
                "{} {} container(s) still present",
                left.len(),
                role.as_str()
            ));
        }
        Ok(if removed.is_empty() {
            format!("no {} container", role.as_str())
        } else {
            format!("removed {}", removed.join(", "))
        })
    }

    /// Cleanup step: client containers (`daos-exec`) of this lease.
    pub async fn remove_clients(&self, lease: &str) -> Result<String, String> {
        // Their main process is an idle `sleep` (which ignores SIGTERM as
        // PID 1); the user's commands are exec sessions: nothing to stop
        // gracefully, and a stop would only wait out its grace period.
        self.remove_role(lease, Role::Client, None).await
    }

    /// Cleanup step: the agent.
    pub async fn stop_agent(&self, lease: &str) -> Result<String, String> {
        self.remove_role(lease, Role::Agent, Some(Duration::from_secs(10)))
            .await
    }

    /// Cleanup step: `dmg system stop` (again with `--force` if a rank did
    /// not stop), then the admin container and the lease's files go.
    /// A system that was never formatted, or whose servers no longer
    /// answer, has nothing to stop: the server stop that follows confirms.
    pub async fn system_stop(&self, lease: &str) -> Result<String, String> {
        let pm = self.podman().await?;
        let outcome = if self.control_config(lease).exists() {
            self.stop_system(&pm, lease).await
        } else {
            Ok("no control config: the system was never set up".into())
        };
        let outcome = outcome?;
        // An idle `sleep` too: killed at once.
        self.remove_role(lease, Role::Admin, None).await?;
        self.remove_files(lease)?;
        Ok(outcome)
    }

    async fn stop_system(&self, pm: &LibpodClient, lease: &str) -> Result<String, String> {
        let mut last = String::new();
        for force in [false, true] {
            let args: &[&str] = if force {
                &["system", "stop", "--force"]
            } else {
                &["system", "stop"]
            };
            let r = self.dmg(pm, lease, args).await?;
            if let Some(e) = r["error"].as_str() {
                if e.contains("uninitialized") || e.contains("format required") {
                    return Ok("never formatted: nothing to stop".into());
                }
                if e.contains("connect")
                    || e.contains("refused")
                    || e.contains("no host")
                    || e.contains("unreachable")
                {
                    return Ok(format!("no server answers ({e}); the server stop confirms"));
                }
                last = e.to_string();
                continue;
            }
            let results = r["response"]["Results"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let errored: Vec<String> = results
                .iter()
                .filter(|x| x["Errored"].as_bool() == Some(true))
                .map(|x| {
                    format!(
                        "{}rank {}: {}",
                        self.node_of(x["Addr"].as_str().unwrap_or(""))
                            .map(|n| format!("{n}: "))
                            .unwrap_or_default(),
                        x["Rank"],
                        x["Msg"].as_str().unwrap_or("")
                    )
                })
                .collect();
            if errored.is_empty() {
                return Ok(format!(
                    "{} rank(s) stopped{}",
                    results.len(),
                    if force { " (with --force)" } else { "" }
                ));
            }
            last = errored.join("; ");
        }
        Err(format!("dmg system stop: {last}"))
    }

    /// The node whose server listens at `addr` (`host:port` or `host`).
    fn node_of(&self, addr: &str) -> Option<&str> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        self.profile
            .nodes
            .iter()
            .find(|(_, a)| a == host)
            .map(|(n, _)| n.as_str())
    }

    /// Names of this lease's containers on the host (for status).
    pub async fn containers(&self, lease: &str) -> Result<Vec<String>, String> {
        let pm = self.podman().await?;
        let list = pm
            .container_list(&LabelFilter::lease(lease))
            .await
            .map_err(|e| e.to_string())?;
        Ok(list
            .iter()
            .map(|c| {
                format!(
                    "{} {}",
                    c.names.first().cloned().unwrap_or_default(),
                    c.state
                )
            })
            .collect())
    }
}

fn short(id: &str) -> String {
    id.chars().take(12).collect()
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}
