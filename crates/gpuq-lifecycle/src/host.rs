//! The GPU host's part of a lease, through the host's own Podman API: the
//! agent container, the spec of every `gpuq daos-exec` session's client
//! container, and removing client containers at cleanup; and the lease's
//! `dmg` (format, join poll, system stop), which runs in the server
//! container of the lease's dmg node, asked over that node's link
//! (gpuq-nodesvc's `dmg` module): a lease makes no container of its own on
//! this host for it.
//!
//! Every container is created from the profile's pinned image ID and
//! labelled with the lease and its role, so cleanup finds exactly this
//! lease's containers and nothing else. Files of a lease live under
//! `<run_dir>/<lease>/` (0755 root), which cleanup removes:
//!
//! | path | owner, mode | what | mounted in |
//! | --- | --- | --- | --- |
//! | `daos_control.yml` | root 0644 | the job's dmg config (`DAOS_CONTROL_CONFIG`): names the files in `user/` | client containers (same path, read-only) |
//! | `user/` | the job's owner, 0500 | `daosCA.crt`, `admin.crt` (0444), `admin.key` (0400) | client containers (same path, read-only) |
//! | `agent-etc/` | root 0700 | `daos_agent.yml`, `daosCA.crt`, `agent.crt`, `agent.key` (0400) | the agent container at `/etc/daos` (read-only) |
//! | `agent/` | root 0755 | the agent's socket | agent and client containers |
//!
//! The certificates are the lease's own (gpuq-leasecert): no other user
//! can enter `user/`, so no other user's dmg can present the admin
//! certificate to this lease's servers. The broker's own copy of the admin
//! certificate goes to the dmg node only (its `<lease_dir>/admin/`, root
//! 0700, mounted read-only in that node's server container).

use crate::error::HostError;
use crate::nodes::{call_all, Node, Retry};
use gpuq_daosconf::{AgentConfig, ControlConfig, Transport};
use gpuq_leasecert::LeaseCerts;
use gpuq_podman::{
    lease_labels, ContainerSpec, ImageId, LabelFilter, LibpodClient, Mount, Namespace, Podman, Role,
};
use gpuq_protocol::node::{DmgCommand, DmgReply, DmgRequest};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the GPU host needs to know about the DAOS system of a profile.
#[derive(Debug, Clone)]
pub struct HostProfile {
    /// The profile's pinned image (servers and agent use the same).
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
    /// Every Podman request here and every `dmg system query` has
    /// `deadlines.request`; `dmg storage format` has `deadlines.format`,
    /// `dmg system stop` `deadlines.stop`.
    pub deadlines: crate::Deadlines,
}

/// The GPU host's containers of one profile.
#[derive(Debug, Clone)]
pub struct Host {
    /// The host's Podman API socket.
    pub podman_socket: PathBuf,
    /// Root-owned directory for per-lease files (`<run_dir>/<lease>/`).
    pub run_dir: PathBuf,
    pub profile: HostProfile,
    /// The node whose server container runs the lease's `dmg` (the
    /// first configured); `None`: no `dmg` (a lifecycle of this host alone).
    pub dmg: Option<Node>,
    /// Set when the job is cancelled or times out while its system is
    /// prepared: the waits end at once, a Podman call in flight completes
    /// (so the cleanup that follows sees what it made). See [`Host::pause`].
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// The Podman client, connected (and its API version checked) on first
    /// use; every request opens its own connection to the socket.
    client: std::sync::Arc<tokio::sync::OnceCell<LibpodClient>>,
}

const ETC_IN: &str = "/etc/daos";
const AGENT_CONF_IN: &str = "/etc/daos/daos_agent.yml";
const AGENT_DIR_IN: &str = "/var/run/daos_agent";
/// The pause between two polls of the join (and of "format required").
/// Each poll is one `dmg` exec on the dmg node, itself ~100 ms of Podman
/// and runc on the test machine: the pause only keeps a slow system from
/// being asked back to back.
const POLL: Duration = Duration::from_millis(20);
/// How long a node's answer to a `dmg` may take beyond the command's own
/// deadline (the link, the node's exec set-up).
const DMG_MARGIN: Duration = Duration::from_secs(10);
/// How long the agent has after SIGTERM before SIGKILL.
const AGENT_GRACE: Duration = Duration::from_secs(10);

fn control_config_in(run_dir: &std::path::Path, lease: &str) -> PathBuf {
    run_dir.join(lease).join("daos_control.yml")
}

fn agent_dir_in(run_dir: &std::path::Path, lease: &str) -> PathBuf {
    run_dir.join(lease).join("agent")
}

/// A lease's DAOS variables for its job, from the configuration alone
/// (no link, no container): `DAOS_SYSTEM`, the control config and the
/// agent's socket dir under `run_dir`, then the profile's own `env`.
/// [`Host::job_env`] and gpuq-slurm's `paths` both say exactly this.
pub fn job_env(
    run_dir: &std::path::Path,
    system: &str,
    extra: &[(String, String)],
    lease: &str,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("DAOS_SYSTEM".to_string(), system.to_string()),
        (
            "DAOS_CONTROL_CONFIG".to_string(),
            control_config_in(run_dir, lease).display().to_string(),
        ),
        (
            "DAOS_AGENT_DRPC_DIR".to_string(),
            agent_dir_in(run_dir, lease).display().to_string(),
        ),
    ];
    env.extend(extra.iter().cloned());
    env
}

impl Host {
    pub fn new(podman_socket: PathBuf, run_dir: PathBuf, profile: HostProfile) -> Self {
        Host {
            podman_socket,
            run_dir,
            profile,
            dmg: None,
            stop: None,
            client: Default::default(),
        }
    }

    /// This host with `node` as the lease's dmg node.
    pub fn with_dmg_node(mut self, node: Node) -> Self {
        self.dmg = Some(node);
        self
    }

    pub fn lease_dir(&self, lease: &str) -> PathBuf {
        self.run_dir.join(lease)
    }
    /// The control config on the host (for `DAOS_CONTROL_CONFIG`).
    pub fn control_config(&self, lease: &str) -> PathBuf {
        control_config_in(&self.run_dir, lease)
    }
    /// The job owner's copy of the admin certificate and key.
    pub fn user_cert_dir(&self, lease: &str) -> PathBuf {
        self.lease_dir(lease).join("user")
    }
    /// The agent's socket directory on the host (for `DAOS_AGENT_DRPC_DIR`).
    pub fn agent_dir(&self, lease: &str) -> PathBuf {
        agent_dir_in(&self.run_dir, lease)
    }
    fn agent_name(lease: &str) -> String {
        format!("gpuq-{lease}-agent")
    }

    /// The job's DAOS variables (mission.md §4 step 5).
    pub fn job_env(&self, lease: &str) -> Vec<(String, String)> {
        job_env(
            &self.run_dir,
            &self.profile.system,
            &self.profile.env,
            lease,
        )
    }

    /// Whether the preparation was told to stop.
    pub fn stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| *s.borrow())
    }

    /// An error if told to stop: the preparation ends between two calls.
    pub fn check_stop(&self) -> Result<(), HostError> {
        if self.stopped() {
            return Err(HostError::Stopped);
        }
        Ok(())
    }

    /// Wait `d`, or less if told to stop meanwhile (then an error).
    async fn pause(&self, d: Duration) -> Result<(), HostError> {
        self.check_stop()?;
        match self.stop.clone() {
            None => tokio::time::sleep(d).await,
            Some(mut s) => {
                tokio::select! {
                    _ = tokio::time::sleep(d) => {}
                    _ = s.wait_for(|stop| *stop) => {}
                }
            }
        }
        self.check_stop()
    }

    async fn podman(&self) -> Result<LibpodClient, HostError> {
        self.client
            .get_or_try_init(|| {
                LibpodClient::connect_with_timeout(
                    &self.podman_socket,
                    Some(self.profile.deadlines.request),
                )
            })
            .await
            .cloned()
            .map_err(|source| HostError::Podman {
                socket: self.podman_socket.clone(),
                source: Box::new(source),
            })
    }

    /// Write the lease's control and agent configs, its certificates (the
    /// admin key for the job's owner `owner_uid` only) and its agent
    /// directory; see the module's table.
    pub fn write_files(
        &self,
        lease: &str,
        certs: &LeaseCerts,
        owner_uid: u32,
    ) -> Result<(), HostError> {
        let dir = self.lease_dir(lease);
        let io = |what: &Path, source: std::io::Error| HostError::Files {
            path: what.to_path_buf(),
            source,
        };
        if !self.run_dir.exists() {
            // The job's user reaches <run_dir>/<lease>/ through it; mkdir's
            // mode is filtered by the broker's umask (077).
            std::fs::create_dir_all(&self.run_dir).map_err(|e| io(&self.run_dir, e))?;
            set_mode(&self.run_dir, 0o755).map_err(|e| io(&self.run_dir, e))?;
        }
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(&dir, e)),
        }
        set_mode(&dir, 0o755).map_err(|e| io(&dir, e))?;
        let p = &self.profile;
        let comment = format!("Written by gpuq-broker for lease {lease}.");
        let control = |d: &str| {
            ControlConfig {
                system: p.system.clone(),
                port: p.port,
                hostlist: p.nodes.iter().map(|(_, a)| a.clone()).collect(),
                transport: Transport::in_dir(d, "admin"),
            }
            .render(&comment)
            .map_err(|e| HostError::Config {
                file: "daos_control.yml",
                detail: e.to_string(),
            })
        };
        let agent = AgentConfig {
            system: p.system.clone(),
            access_points: p.access_points.clone(),
            port: p.port,
            transport: Transport::in_dir(ETC_IN, "agent"),
            runtime_dir: AGENT_DIR_IN.to_string(),
        }
        .render(&comment)
        .map_err(|e| HostError::Config {
            file: "daos_agent.yml",
            detail: e.to_string(),
        })?;
        let user = self.user_cert_dir(lease);
        let user_control = control(&user.display().to_string())?;
        use gpuq_leasecert::{CERT_MODE, KEY_MODE};
        // A directory left by an earlier attempt is replaced (its parent is
        // root's: nobody else can have put anything in its place).
        for (sub, files, owner, mode) in [
            (
                "user",
                vec![
                    file("daosCA.crt", certs.ca_cert.as_bytes(), CERT_MODE),
                    file("admin.crt", certs.admin.cert.as_bytes(), CERT_MODE),
                    file("admin.key", certs.admin.key.as_bytes(), KEY_MODE),
                ],
                (owner_uid, 0),
                0o500,
            ),
            (
                "agent-etc",
                vec![
                    file("daos_agent.yml", agent.as_bytes(), 0o444),
                    file("daosCA.crt", certs.ca_cert.as_bytes(), CERT_MODE),
                    file("agent.crt", certs.agent.cert.as_bytes(), CERT_MODE),
                    file("agent.key", certs.agent.key.as_bytes(), KEY_MODE),
                ],
                (0, 0),
                0o700,
            ),
        ] {
            let d = dir.join(sub);
            match std::fs::remove_dir_all(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&d, e)),
            }
            gpuq_leasecert::install(&d, &files, owner, mode)?;
        }
        gpuq_durable::write_atomic(&self.control_config(lease), user_control.as_bytes(), 0o644)
            .map_err(|e| io(&self.control_config(lease), e))?;
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
    pub fn remove_files(&self, lease: &str) -> Result<(), HostError> {
        let dir = self.lease_dir(lease);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(HostError::Files { path: dir, source }),
        }
    }

    fn base_spec(&self, name: String, lease: &str, role: Role) -> ContainerSpec {
        let mut spec = ContainerSpec::new(name, self.profile.image.clone());
        spec.labels = lease_labels(lease, role);
        spec.network = Namespace::Host;
        spec.cap_drop = vec!["ALL".into()];
        spec.no_new_privileges = true;
        spec
    }

    /// Write the lease's files on this host (see the module's table).
    pub fn prepare_files(
        &self,
        lease: &str,
        certs: &LeaseCerts,
        owner_uid: u32,
    ) -> Result<String, HostError> {
        self.check_stop()?;
        self.write_files(lease, certs, owner_uid)?;
        Ok(format!("{} written", self.lease_dir(lease).display()))
    }

    /// `dmg -j` with `command` in the dmg node's server container, within
    /// `within`: the JSON envelope it printed.
    async fn dmg(
        &self,
        lease: &str,
        command: DmgCommand,
        within: Duration,
    ) -> Result<Value, HostError> {
        let args = command.args().join(" ");
        let Some(node) = &self.dmg else {
            return Err(HostError::NoDmgNode { args });
        };
        let req = DmgRequest {
            command,
            within_secs: within.as_secs().max(1),
        };
        let body = serde_json::to_value(&req).ok();
        let reply = call_all::<DmgReply>(
            std::slice::from_ref(node),
            within + DMG_MARGIN,
            hyper::Method::POST,
            &format!("/v1/leases/{lease}/dmg"),
            body,
            Retry::Refused,
        )
        .await
        .pop()
        .map(|(_, r)| r)
        .unwrap_or_else(|| {
            Err(gpuq_client::ClientError::Protocol {
                socket: node.client.socket().to_path_buf(),
                what: "no answer".into(),
            })
        });
        let out = reply.map_err(|source| HostError::Dmg {
            node: node.name.clone(),
            args: args.clone(),
            source: Box::new(source),
        })?;
        serde_json::from_str(&out.stdout).map_err(|e| HostError::DmgOutput {
            args,
            exit: out.exit_code,
            parse: e.to_string(),
            stderr: out.stderr.trim().to_string(),
        })
    }

    /// `dmg system query`, a small call.
    async fn query(&self, lease: &str) -> Result<Value, HostError> {
        self.dmg(
            lease,
            DmgCommand::SystemQuery,
            self.profile.deadlines.request,
        )
        .await
    }

    /// `dmg system query` until the system says it needs a format (the
    /// servers need a moment to listen and reach "format required").
    async fn await_format(&self, lease: &str, deadline: Instant) -> Result<(), HostError> {
        loop {
            let q = self.query(lease).await?;
            let err = q["error"].as_str().unwrap_or("");
            if err.contains("format required") || err.contains("uninitialized") {
                return Ok(());
            }
            if q["error"].is_null() {
                return Err(HostError::daos(
                    "format",
                    "the new system is already formatted (old metadata?); refusing to use it",
                ));
            }
            if Instant::now() >= deadline {
                return Err(HostError::daos(
                    "format",
                    format!("servers did not reach `format required`: {err}"),
                ));
            }
            self.pause(POLL).await?;
        }
    }

    /// `dmg storage format`: every host formatted, no host errors. Unless
    /// every node already saw its server await the format
    /// (`awaiting_format`), `dmg system query` is asked first until the
    /// system says it needs one.
    pub async fn format(&self, lease: &str, awaiting_format: bool) -> Result<String, HostError> {
        self.check_stop()?;
        let deadline = Instant::now() + self.profile.join_timeout;
        if !awaiting_format {
            self.await_format(lease, deadline).await?;
        }
        // A real format takes a while (every SCM and NVMe device): its own
        // deadline instead of the small calls'.
        let f = self
            .dmg(
                lease,
                DmgCommand::StorageFormat,
                self.profile.deadlines.format,
            )
            .await?;
        format_reply(&f).map_err(|d| HostError::daos("format", d))
    }

    /// Poll `dmg system query` until exactly `ranks` members are joined.
    pub async fn wait_joined(&self, lease: &str, ranks: usize) -> Result<String, HostError> {
        self.check_stop()?;
        let deadline = Instant::now() + self.profile.join_timeout;
        loop {
            let q = self.query(lease).await?;
            let members = q["response"]["members"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let joined = members
                .iter()
                .filter(|m| m["state"].as_str() == Some("joined"))
                .count();
            if joined == ranks && members.len() == ranks {
                // daos.md: ranks 0..N-1, distinct addresses and fault
                // domains. A joined system of another shape does not heal.
                return joined_shape(&members, ranks)
                    .map(|()| format!("{ranks} ranks joined"))
                    .map_err(|d| HostError::daos("join", d));
            }
            if Instant::now() >= deadline {
                return Err(HostError::daos(
                    "join",
                    format!(
                        "{joined} of {ranks} ranks joined within {}s ({}){}",
                        self.profile.join_timeout.as_secs(),
                        if members.is_empty() {
                            "no members".into()
                        } else {
                            describe(&members, "state")
                        },
                        q["error"]
                            .as_str()
                            .map(|e| format!("; dmg: {e}"))
                            .unwrap_or_default()
                    ),
                ));
            }
            self.pause(POLL).await?;
        }
    }

    /// A `gpuq daos-exec` session's client container, run as the job's
    /// owner (`uid`, `gid`, `groups`) with no capability: the caller's
    /// checked submit directory and the operator's mounts (each a (source,
    /// target) pair: the broker's exec.rs stages the checked directories on
    /// paths only root can reach), the agent's socket directory, the job's
    /// control config and the owner's certificates at their host paths
    /// (read-only), and a private `/tmp`. Idle: the session runs in it by
    /// exec.
    pub fn client_spec(
        &self,
        lease: &str,
        name: &str,
        image: ImageId,
        (uid, gid, groups): (u32, u32, &[u32]),
        submit: (&Path, &Path),
        extra: &[(PathBuf, PathBuf)],
    ) -> ContainerSpec {
        let mut spec = self.base_spec(name.to_string(), lease, Role::Client);
        spec.image = image;
        spec.user = Some(format!("{uid}:{gid}"));
        spec.groups = groups.iter().map(u32::to_string).collect();
        spec.command = vec!["sleep".into(), "2147483647".into()];
        let bind =
            |s: &Path, d: &Path| Mount::bind(s.display().to_string(), d.display().to_string());
        let same = |p: &Path| bind(p, p);
        spec.mounts = vec![
            bind(submit.0, submit.1),
            same(&self.agent_dir(lease)),
            same(&self.control_config(lease)).read_only(),
            // The owner's admin certificate and key (0500, the owner's):
            // the control config names them at these host paths.
            same(&self.user_cert_dir(lease)).read_only(),
            Mount {
                options: vec!["mode=1777".into()],
                ..Mount::tmpfs("/tmp")
            },
        ];
        spec.mounts.extend(extra.iter().map(|(s, d)| bind(s, d)));
        spec
    }

    /// Start the agent and wait for its socket.
    pub async fn start_agent(&self, lease: &str) -> Result<String, HostError> {
        self.check_stop()?;
        let pm = self.podman().await?;
        let name = Self::agent_name(lease);
        let mut spec = self.base_spec(name.clone(), lease, Role::Agent);
        // daos.md: the agent monitors its clients' processes (host PID).
        spec.pid = Namespace::Host;
        spec.command = vec![
            "daos_agent".into(),
            "-o".into(),
            AGENT_CONF_IN.into(),
            "-s".into(),
            AGENT_DIR_IN.into(),
        ];
        // Its config and the agent certificate (root's, 0700).
        spec.mounts.push(
            Mount::bind(
                self.lease_dir(lease)
                    .join("agent-etc")
                    .display()
                    .to_string(),
                ETC_IN,
            )
            .read_only(),
        );
        spec.mounts.push(Mount::bind(
            self.agent_dir(lease).display().to_string(),
            AGENT_DIR_IN,
        ));
        pm.container_create(&spec)
            .await
            .map_err(container("create", &name))?;
        pm.container_start(&name)
            .await
            .map_err(container("start", &name))?;
        let sock = self.agent_dir(lease).join("daos_agent.sock");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !agent_listens(&sock) {
            if Instant::now() >= deadline {
                return Err(HostError::Agent(format!(
                    "the agent did not listen on {} within 20 s",
                    sock.display()
                )));
            }
            let info = pm
                .container_inspect(&name)
                .await
                .map_err(container("inspect", &name))?;
            if !info.state.running {
                return Err(HostError::Agent(format!(
                    "the agent container exited ({})",
                    info.state.status
                )));
            }
            self.pause(Duration::from_millis(10)).await?;
        }
        Ok(format!("agent {name} up, socket {}", sock.display()))
    }

    /// Remove every container of `role` of this lease; confirm none is left.
    async fn remove_role(
        &self,
        lease: &str,
        role: Role,
        grace: Option<Duration>,
    ) -> Result<String, HostError> {
        let pm = self.podman().await?;
        let filter = LabelFilter::lease(lease).eq(gpuq_podman::LABEL_ROLE, role.as_str());
        let what = format!("{} containers", role.as_str());
        let list = pm
            .container_list(&filter)
            .await
            .map_err(container("list", &what))?;
        let mut removed = Vec::new();
        for c in &list {
            let mut name = c.names.first().cloned().unwrap_or_else(|| short(&c.id));
            // Without a grace period: SIGKILL at once.
            if c.state == "running" {
                match gpuq_podman::stop_local(&pm, &c.id, grace.unwrap_or_default()).await {
                    Ok(how) => name = format!("{name} ({how})"),
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(container("stop", &short(&c.id))(e)),
                }
            }
            gpuq_podman::remove_stopped(&pm, &c.id)
                .await
                .map_err(container("remove", &short(&c.id)))?;
            removed.push(name);
        }
        let left = pm
            .container_list(&filter)
            .await
            .map_err(container("list", &what))?;
        if !left.is_empty() {
            return Err(HostError::Left {
                role: role.as_str(),
                count: left.len(),
            });
        }
        Ok(if removed.is_empty() {
            format!("no {} container", role.as_str())
        } else {
            format!("removed {}", removed.join(", "))
        })
    }

    /// Cleanup step: client containers (`daos-exec`) of this lease.
    pub async fn remove_clients(&self, lease: &str) -> Result<String, HostError> {
        // Their main process is an idle `sleep` (which ignores SIGTERM as
        // PID 1); the user's commands are exec sessions: nothing to stop
        // gracefully, and a stop would only wait out its grace period.
        self.remove_role(lease, Role::Client, None).await
    }

    /// Cleanup step: the agent. SIGTERM while the servers are up (it
    /// evicts its pool handles; daos.md), confirmed by its process leaving
    /// (seen in `/proc`, or Podman's own stop where it cannot be seen). The
    /// stopped container is removed alongside `dmg system stop`
    /// ([`Host::remove_agent`]).
    pub async fn stop_agent(&self, lease: &str) -> Result<String, HostError> {
        let pm = self.podman().await?;
        let filter = LabelFilter::lease(lease).eq(gpuq_podman::LABEL_ROLE, Role::Agent.as_str());
        let list = pm
            .container_list(&filter)
            .await
            .map_err(container("list", "agent containers"))?;
        let mut stopped = Vec::new();
        for c in list.iter().filter(|c| c.state == "running") {
            let name = c.names.first().cloned().unwrap_or_else(|| short(&c.id));
            match gpuq_podman::stop_local(&pm, &c.id, AGENT_GRACE).await {
                Ok(how) => stopped.push(format!("{name} ({how})")),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(container("stop", &name)(e)),
            }
        }
        Ok(if stopped.is_empty() {
            "no running agent".to_string()
        } else {
            format!("stopped {}", stopped.join(", "))
        })
    }

    /// The agent's container, stopped by [`Host::stop_agent`], removed
    /// while `dmg system stop` runs (stopped first if it runs again, e.g.
    /// after a restart); confirmed like every removal.
    pub async fn remove_agent(&self, lease: &str) -> Result<String, HostError> {
        self.remove_role(lease, Role::Agent, Some(AGENT_GRACE))
            .await
    }

    /// This host's part of the wipe, while the nodes wipe theirs (the
    /// servers are stopped by then): the lease's files, and the admin
    /// container a lease prepared by an earlier version made (an idle
    /// `sleep`: killed at once; confirmed like every removal).
    pub async fn remove_lease_files(&self, lease: &str) -> Result<String, HostError> {
        let legacy = self.remove_role(lease, Role::Admin, None).await?;
        self.remove_files(lease)?;
        Ok(if legacy.starts_with("removed") {
            format!("{legacy} (an earlier version's admin container), lease files removed")
        } else {
            "lease files removed".to_string()
        })
    }

    /// Cleanup step: `dmg system stop` (again with `--force` if a rank did
    /// not stop). A system that was never formatted, or whose servers no
    /// longer answer, has nothing to stop; so has one whose dmg node
    /// refuses the command (it holds no such lease, or its server
    /// container is not running, or the lease was started without dmg
    /// access there): the nodes' server stop that follows stops and
    /// confirms.
    pub async fn system_stop(&self, lease: &str) -> Result<String, HostError> {
        let mut last = String::new();
        // The node of the first rank that would not stop (the hold names it).
        let mut last_node = None;
        for command in [DmgCommand::SystemStop, DmgCommand::SystemStopForce] {
            let force = command == DmgCommand::SystemStopForce;
            let r = match self.dmg(lease, command, self.profile.deadlines.stop).await {
                Ok(r) => r,
                Err(HostError::NoDmgNode { .. }) => {
                    return Ok(
                        "no dmg node in this lifecycle; the nodes' server stop confirms".into(),
                    )
                }
                Err(HostError::Dmg { node, source, .. }) if refused(&source) => {
                    return Ok(format!(
                        "{node} runs no dmg for this lease ({source}); the nodes' server stop confirms"
                    ))
                }
                Err(e) => return Err(e),
            };
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
                last_node = None;
                continue;
            }
            let results = r["response"]["Results"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let errored: Vec<(Option<String>, String)> = results
                .iter()
                .filter(|x| x["Errored"].as_bool() == Some(true))
                .map(|x| {
                    let node = self
                        .node_of(x["Addr"].as_str().unwrap_or(""))
                        .map(str::to_string);
                    let text = format!(
                        "{}rank {}: {}",
                        node.as_ref().map(|n| format!("{n}: ")).unwrap_or_default(),
                        x["Rank"],
                        x["Msg"].as_str().unwrap_or("")
                    );
                    (node, text)
                })
                .collect();
            if errored.is_empty() {
                return Ok(format!(
                    "{} rank(s) stopped{}",
                    results.len(),
                    if force { " (with --force)" } else { "" }
                ));
            }
            last_node = errored.iter().find_map(|(n, _)| n.clone());
            last = errored
                .into_iter()
                .map(|(_, t)| t)
                .collect::<Vec<_>>()
                .join("; ");
        }
        Err(HostError::Daos {
            step: "system_stop",
            node: last_node,
            detail: format!("dmg system stop: {last}"),
        })
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
    pub async fn containers(&self, lease: &str) -> Result<Vec<String>, HostError> {
        let pm = self.podman().await?;
        let list = pm
            .container_list(&LabelFilter::lease(lease))
            .await
            .map_err(container("list", "the lease's containers"))?;
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

/// `rank R ADDR <field>, ...` of `dmg system query` members.
fn describe(members: &[Value], field: &str) -> String {
    members
        .iter()
        .map(|m| {
            format!(
                "rank {} {} {}",
                m["rank"],
                m["addr"].as_str().unwrap_or("?"),
                m[field].as_str().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `members` (all joined) are ranks `0..ranks`, each once, at distinct
/// addresses in distinct fault domains.
fn joined_shape(members: &[Value], ranks: usize) -> Result<(), String> {
    let mut seen_ranks = std::collections::BTreeSet::new();
    let mut addrs = std::collections::BTreeSet::new();
    let mut domains = std::collections::BTreeSet::new();
    for m in members {
        let rank = m["rank"].as_u64();
        let addr = m["addr"].as_str().unwrap_or("");
        let domain = m["fault_domain"].as_str().unwrap_or("");
        let ok_rank = rank.is_some_and(|r| (r as usize) < ranks && seen_ranks.insert(r));
        if !ok_rank
            || addr.is_empty()
            || !addrs.insert(addr)
            || domain.is_empty()
            || !domains.insert(domain)
        {
            return Err(format!(
                "{ranks} members joined, but not as ranks 0..{} at distinct addresses in distinct fault domains: {}",
                ranks - 1,
                describe(members, "fault_domain")
            ));
        }
    }
    Ok(())
}

/// Reads a `dmg storage format -j` envelope (daos.md, from DAOS's
/// src/control/lib/control/storage.go): success only if the envelope has no
/// error and status 0, `host_errors` is empty and every SCM and NVMe `info`
/// is `CTL_SUCCESS`. dmg answers status 0 when only some hosts failed: their
/// errors are only in `host_errors` (a check of the status alone takes a
/// half-formatted system for a formatted one and fails later, at the join,
/// without the reason). A failure is one line naming every failed host set
/// and its error.
fn format_reply(f: &Value) -> Result<String, String> {
    if let Some(e) = f["error"].as_str() {
        return Err(format!("dmg storage format: {}", one_line(e)));
    }
    if f["status"].as_i64() != Some(0) {
        return Err(format!(
            "dmg storage format: status {} without an error message",
            f["status"]
        ));
    }
    let resp = &f["response"];
    let mut failed: Vec<String> = match &resp["host_errors"] {
        Value::Null => Vec::new(),
        Value::Object(errs) => errs
            .values()
            .map(|v| {
                format!(
                    "{} ({})",
                    one_line(v["hosts"].as_str().unwrap_or("?")),
                    one_line(v["error"].as_str().unwrap_or("no error message"))
                )
            })
            .collect(),
        other => {
            return Err(format!(
                "dmg storage format: host_errors is not a map: {}",
                one_line(&other.to_string())
            ))
        }
    };
    let mut hosts = Vec::new();
    for g in resp["HostStorage"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
    {
        let name = one_line(g["hosts"].as_str().unwrap_or("?"));
        let st = &g["storage"];
        let bad: Vec<String> = st["scm_mount_points"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(st["nvme_devices"].as_array().into_iter().flatten())
            .filter(|i| i["info"].as_str() != Some("CTL_SUCCESS"))
            .map(|i| one_line(&i["info"].to_string()))
            .collect();
        if bad.is_empty() {
            hosts.push(name);
        } else {
            failed.push(format!("{name} ({})", bad.join(", ")));
        }
    }
    if !failed.is_empty() {
        failed.sort();
        return Err(format!(
            "dmg storage format failed on {}",
            failed.join("; ")
        ));
    }
    if hosts.is_empty() {
        return Err("dmg storage format reported no host".into());
    }
    hosts.sort();
    Ok(format!("formatted {}", hosts.join(", ")))
}

/// Text from dmg on one line: control characters (a newline in an error
/// message) shown escaped.
/// The node answered and refused (HTTP 409): it ran nothing.
fn refused(e: &gpuq_client::ClientError) -> bool {
    matches!(e, gpuq_client::ClientError::Api { status, .. } if *status == hyper::StatusCode::CONFLICT)
}

fn one_line(s: &str) -> String {
    let mut out = String::new();
    for c in s.trim().chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// A Podman error about `target` (a container, or a role's containers).
fn container(op: &'static str, target: &str) -> impl FnOnce(gpuq_podman::Error) -> HostError {
    let target = target.to_string();
    move |source| HostError::Container {
        op,
        target,
        source: Box::new(source),
    }
}

fn short(id: &str) -> String {
    id.chars().take(12).collect()
}

fn file<'a>(name: &'a str, bytes: &'a [u8], mode: u32) -> gpuq_leasecert::File<'a> {
    gpuq_leasecert::File { name, bytes, mode }
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

/// The agent is ready when its socket accepts a connection — not when the
/// file exists: bind() makes the file before listen(), and a client that
/// came in between got ECONNREFUSED. DAOS's dRPC socket is SOCK_SEQPACKET
/// (Go's "unixpacket"); the simulator's is SOCK_STREAM; a probe of the
/// wrong type gets EPROTOTYPE and the other type is tried. Only a socket
/// itself counts (no symlink is followed: the directory is shared with the
/// container). The probe does not block: a full backlog (EAGAIN) also
/// means it listens.
fn agent_listens(sock: &Path) -> bool {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(sock) {
        Ok(m) if m.file_type().is_socket() => {}
        _ => return false,
    }
    let Ok(addr) = UnixAddr::new(sock) else {
        return false;
    };
    for ty in [SockType::SeqPacket, SockType::Stream] {
        let Ok(fd) = socket(
            AddressFamily::Unix,
            ty,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        ) else {
            return false;
        };
        match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
            Ok(()) | Err(Errno::EAGAIN) => return true,
            Err(Errno::EPROTOTYPE) => continue,
            Err(_) => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::{agent_listens, format_reply, joined_shape};
    use serde_json::{json, Value};

    #[test]
    fn an_agent_socket_is_ready_only_once_it_listens_of_either_type_and_never_through_a_symlink() {
        use nix::sys::socket::{
            bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
        };
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("daos_agent.sock");
        assert!(!agent_listens(&sock), "no file");
        for ty in [SockType::SeqPacket, SockType::Stream] {
            let _ = std::fs::remove_file(&sock);
            let fd = socket(AddressFamily::Unix, ty, SockFlag::SOCK_CLOEXEC, None).unwrap();
            bind(fd.as_raw_fd(), &UnixAddr::new(&sock).unwrap()).unwrap();
            assert!(!agent_listens(&sock), "{ty:?}: bound, not listening");
            listen(&fd, Backlog::new(4).unwrap()).unwrap();
            assert!(agent_listens(&sock), "{ty:?}: listening");
            let link = dir.path().join("link.sock");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&sock, &link).unwrap();
            assert!(!agent_listens(&link), "{ty:?}: through a symlink");
        }
        let plain = dir.path().join("plain");
        std::fs::write(&plain, b"").unwrap();
        assert!(!agent_listens(&plain), "a regular file");
    }

    /// daos.md's `dmg storage format -j` success, field for field.
    fn formatted() -> Value {
        json!({"response":{"host_errors":{},
          "HostStorage":{"8417135911734931024":{"hosts":"da[1-4]:10001","storage":{
            "scm_mount_points":[{"info":"CTL_SUCCESS","path":"/mnt/daos"}],
            "nvme_devices":[{"info":"CTL_SUCCESS","pci_addr":"0000:5e:00.0"}]}}}},
         "error":null,"status":0})
    }

    #[test]
    fn a_format_of_every_host_passes() {
        assert_eq!(
            format_reply(&formatted()),
            Ok("formatted da[1-4]:10001".into())
        );
    }

    /// Issue 13: status 0, no error, but two hosts failed — the format
    /// fails, naming each host set with its own error, on one line.
    #[test]
    fn host_errors_fail_the_format_naming_the_hosts_even_with_status_0() {
        let v = json!({"response":{"host_errors":{
            "111":{"hosts":"da2:10001","error":"storage format invoked on a running system"},
            "222":{"hosts":"da[3-4]:10001","error":"write bdev header: No space left on device\n(os error 28)"}},
          "HostStorage":{"333":{"hosts":"da1:10001","storage":{
            "scm_mount_points":[{"info":"CTL_SUCCESS","path":"/mnt/daos"}],
            "nvme_devices":[{"info":"CTL_SUCCESS","pci_addr":"0000:5e:00.0"}]}}}},
         "error":null,"status":0});
        let e = format_reply(&v).unwrap_err();
        assert_eq!(
            e,
            "dmg storage format failed on da2:10001 (storage format invoked on a running system); \
             da[3-4]:10001 (write bdev header: No space left on device\\n(os error 28))"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn a_device_not_ctl_success_fails_the_format_naming_its_hosts() {
        let mut v = formatted();
        v["response"]["HostStorage"]["8417135911734931024"]["storage"]["nvme_devices"][0]["info"] =
            json!("SPDK format failed");
        let e = format_reply(&v).unwrap_err();
        assert_eq!(
            e,
            "dmg storage format failed on da[1-4]:10001 (\"SPDK format failed\")"
        );
    }

    #[test]
    fn an_error_envelope_a_bad_status_or_no_host_fails_the_format() {
        let v = json!({"response":null,"error":"system name mismatch","status":-1025});
        assert_eq!(
            format_reply(&v).unwrap_err(),
            "dmg storage format: system name mismatch"
        );
        let mut v = formatted();
        v["status"] = json!(-1025);
        assert!(format_reply(&v).unwrap_err().contains("status -1025"));
        let v = json!({"response":{"host_errors":{},"HostStorage":{}},"error":null,"status":0});
        assert_eq!(
            format_reply(&v).unwrap_err(),
            "dmg storage format reported no host"
        );
        let mut v = formatted();
        v["response"]["host_errors"] = json!(["da2"]);
        assert!(format_reply(&v).unwrap_err().contains("not a map"));
    }

    fn member(rank: u64, addr: &str, domain: &str) -> Value {
        json!({"rank": rank, "addr": addr, "fault_domain": domain, "state": "joined"})
    }

    fn four() -> Vec<Value> {
        (0..4)
            .map(|r| member(r, &format!("10.0.0.1{r}:10001"), &format!("/da{}", r + 1)))
            .collect()
    }

    #[test]
    fn four_distinct_ranks_addresses_and_domains_pass() {
        assert_eq!(joined_shape(&four(), 4), Ok(()));
    }

    #[test]
    fn a_repeated_rank_address_or_domain_or_a_rank_out_of_range_is_refused() {
        let cases: [(usize, Value); 4] = [
            (3, member(2, "10.0.0.13:10001", "/da4")),
            (3, member(3, "10.0.0.10:10001", "/da4")),
            (3, member(3, "10.0.0.13:10001", "/da1")),
            (3, member(4, "10.0.0.13:10001", "/da4")),
        ];
        for (i, m) in cases {
            let mut ms = four();
            ms[i] = m;
            let e = joined_shape(&ms, 4).unwrap_err();
            assert!(e.contains("not as ranks 0..3"), "{e}");
        }
    }

    #[test]
    fn a_member_without_address_or_domain_is_refused() {
        let mut ms = four();
        ms[1] = json!({"rank": 1, "state": "joined"});
        assert!(joined_shape(&ms, 4).is_err());
    }
}
