//! A lease's DAOS client side on one GPU host, through that host's own
//! Podman API: the lease's files (control config, the owner's admin
//! certificate, the agent's config and certificate, the agent's socket
//! dir), its agent container, the spec of every `gpuq daos-exec`
//! session's client container, and removing all of it at cleanup.
//!
//! Two callers drive it: gpuq-lifecycle for the host it runs on (the
//! broker's cxl2, gpuq-slurm's `agent_host`), and gpuq-nodesvc for a GPU
//! host that the driver reaches over a node link (a Slurm job placed on
//! another GPU host; docs/slurm.md). Nothing here runs `dmg`: that is the
//! lease driver's, through the dmg node.
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
//! | `agent-etc/` | the job's owner, 0500 | `daos_agent.yml`, `daosCA.crt`, `agent.crt`, `agent.key` (0400) | the agent container at `/etc/daos` (read-only) |
//! | `agent/` | root 0700 + ACL `user:OWNER:-wx` (mode 0730) | the agent's socket (0666, as DAOS makes it): the owner and root reach it, no other user | agent and client containers |
//!
//! The agent runs as the job's owner (uid of `agent-etc/`, group
//! [`AGENT_GID`], no capability, `no_new_privs`; `nobody` for a root-owned
//! lease: [`agent_uid_for`]) in the host's PID namespace, which it needs
//! (below): never uid 0 there, where a process without capabilities could
//! still signal every root process of the host.
//!
//! The certificates are the lease's own (gpuq-leasecert): no other user
//! can enter `user/`, so no other user's dmg can present the admin
//! certificate to this lease's servers.

use gpuq_daosconf::{AgentConfig, ControlConfig, Transport};
use gpuq_podman::{
    lease_labels, ContainerSpec, ImageId, LabelFilter, LibpodClient, Mount, Namespace, Podman, Role,
};
use gpuq_protocol::node::ClientTls;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;

/// A failure of a lease's client side on this host.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The preparation was told to stop (the job was cancelled or ran out
    /// of time) and ended between two calls.
    #[error("stopped: the job was cancelled or ran out of time")]
    Stopped,
    /// This host's Podman API could not be reached.
    #[error("local Podman ({}): {source}", socket.display())]
    Podman {
        socket: PathBuf,
        #[source]
        source: Box<gpuq_podman::Error>,
    },
    /// A Podman request about one container (or one role's containers).
    #[error("{op} {target}: {source}")]
    Container {
        op: &'static str,
        target: String,
        #[source]
        source: Box<gpuq_podman::Error>,
    },
    /// Containers of a role still there after their removal.
    #[error("{count} {role} container(s) still present")]
    Left { role: &'static str, count: usize },
    /// A file or directory of the lease on this host.
    #[error("{}: {source}", path.display())]
    Files {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A DAOS configuration file of the lease that cannot be written as
    /// asked (a value outside what the renderer accepts).
    #[error("{file}: {detail}")]
    Config { file: &'static str, detail: String },
    /// The lease's certificates could not be installed.
    #[error(transparent)]
    Certs(#[from] gpuq_leasecert::CertError),
    /// The agent did not come up.
    #[error("{0}")]
    Agent(String),
    /// A lease's `client.json` that cannot be trusted or read.
    #[error("{}: {detail}", path.display())]
    Record { path: PathBuf, detail: String },
}

/// What the client side needs to know about the DAOS system of a profile.
#[derive(Debug, Clone)]
pub struct ClientProfile {
    /// The profile's pinned image (the agent and client containers).
    pub image: ImageId,
    /// The DAOS system name the servers render (`name:`).
    pub system: String,
    /// The servers' control port.
    pub port: u16,
    /// The addresses dmg reaches the servers at (the control config's
    /// `hostlist`).
    pub hostlist: Vec<String>,
    /// The management-service replicas (the agent's access points).
    pub access_points: Vec<String>,
    /// Every Podman request's deadline.
    pub request: Duration,
}

/// The client side's share of a lease's certificates.
pub fn client_tls(c: &gpuq_leasecert::LeaseCerts) -> ClientTls {
    ClientTls {
        ca_cert: c.ca_cert.clone(),
        admin_cert: c.admin.cert.clone(),
        admin_key: c.admin.key.clone(),
        agent_cert: c.agent.cert.clone(),
        agent_key: c.agent.key.clone(),
    }
}

/// `<run_dir>/<lease>/client.json` (root 0600) on a GPU host whose
/// helper made the client side: whose lease it is, so that this host's
/// broker can serve `gpuq daos-exec` to the job's owner without the
/// driver's records (they are on the Slurm controller).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientRecord {
    pub lease: String,
    pub profile: String,
    pub owner_uid: u32,
}

/// The record's name in the lease's directory.
pub const RECORD: &str = "client.json";

/// A lease's client side on this host, for one profile.
#[derive(Debug, Clone)]
pub struct ClientHost {
    /// The host's Podman API socket.
    pub podman_socket: PathBuf,
    /// Root-owned directory for per-lease files (`<run_dir>/<lease>/`).
    pub run_dir: PathBuf,
    pub profile: ClientProfile,
    /// Set when the job is cancelled or times out while its system is
    /// prepared: the waits end at once, a Podman call in flight completes
    /// (so the cleanup that follows sees what it made).
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// The Podman client, connected (and its API version checked) on first
    /// use; every request opens its own connection to the socket.
    client: std::sync::Arc<tokio::sync::OnceCell<LibpodClient>>,
}

const ETC_IN: &str = "/etc/daos";
const AGENT_CONF_IN: &str = "/etc/daos/daos_agent.yml";
const AGENT_DIR_IN: &str = "/var/run/daos_agent";
/// How long the agent has after SIGTERM before SIGKILL.
const AGENT_GRACE: Duration = Duration::from_secs(10);
/// How long the agent may take to listen on its socket.
const AGENT_UP: Duration = Duration::from_secs(20);
/// The agent's group: `nogroup` (65534, Debian's and EL's overflow
/// group), with no supplementary groups. Its files are its user's (the
/// job's owner); it needs no group's.
pub const AGENT_GID: u32 = 65534;
/// The agent's user for a lease whose owner is root (`gpuq e2e`'s job,
/// under the maintenance lock): `nobody`, never uid 0 in the host's PID
/// namespace.
pub const ROOT_LEASE_AGENT_UID: u32 = 65534;

/// The uid the agent of a lease owned by `owner_uid` runs as: the owner,
/// or `nobody` for root's.
pub fn agent_uid_for(owner_uid: u32) -> u32 {
    if owner_uid == 0 {
        ROOT_LEASE_AGENT_UID
    } else {
        owner_uid
    }
}

fn control_config_in(run_dir: &Path, lease: &str) -> PathBuf {
    run_dir.join(lease).join("daos_control.yml")
}

fn agent_dir_in(run_dir: &Path, lease: &str) -> PathBuf {
    run_dir.join(lease).join("agent")
}

/// The record of `lease` under `run_dir`, if this host's helper wrote one:
/// read only if root alone could have written it (gpuq-conffile's check:
/// no link, root's, not writable by others, in root's directory).
pub fn read_record(run_dir: &Path, lease: &str) -> Result<Option<ClientRecord>, ClientError> {
    let path = run_dir.join(lease).join(RECORD);
    let bad = |detail: String| ClientError::Record {
        path: path.clone(),
        detail,
    };
    let text = match gpuq_conffile::read_trusted(&path) {
        Ok(t) => t,
        Err(gpuq_conffile::ConfFileError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None)
        }
        Err(e) => return Err(bad(e.to_string().replace('\n', "; "))),
    };
    let r: ClientRecord = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if r.lease != lease {
        return Err(bad(format!("names lease {}, not {lease}", r.lease)));
    }
    Ok(Some(r))
}

/// Whether the agent of `lease` under `run_dir` listens on its socket.
pub fn agent_up(run_dir: &Path, lease: &str) -> bool {
    agent_listens(&agent_dir_in(run_dir, lease).join("daos_agent.sock"))
}

/// Whether `stop` (a preparation's stop signal) has turned true.
pub fn stopped(stop: &Option<tokio::sync::watch::Receiver<bool>>) -> bool {
    stop.as_ref().is_some_and(|s| *s.borrow())
}

/// Wait `d`, or less if `stop` turns true meanwhile; whether it is true.
pub async fn pause(stop: &Option<tokio::sync::watch::Receiver<bool>>, d: Duration) -> bool {
    if stopped(stop) {
        return true;
    }
    match stop.clone() {
        None => tokio::time::sleep(d).await,
        Some(mut s) => {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = s.wait_for(|stop| *stop) => {}
            }
        }
    }
    stopped(stop)
}

/// A lease's DAOS variables for its job, from the configuration alone
/// (no link, no container): `DAOS_SYSTEM`, the control config and the
/// agent's socket dir under `run_dir`, then the profile's own `env`.
/// gpuq-lifecycle's `Host::job_env` and gpuq-slurm's `paths` both say exactly this.
pub fn job_env(
    run_dir: &Path,
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

impl ClientHost {
    pub fn new(podman_socket: PathBuf, run_dir: PathBuf, profile: ClientProfile) -> Self {
        ClientHost {
            podman_socket,
            run_dir,
            profile,
            stop: None,
            client: Default::default(),
        }
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

    /// Whether the preparation was told to stop.
    pub fn stopped(&self) -> bool {
        stopped(&self.stop)
    }

    /// An error if told to stop: the preparation ends between two calls.
    pub fn check_stop(&self) -> Result<(), ClientError> {
        if self.stopped() {
            return Err(ClientError::Stopped);
        }
        Ok(())
    }

    /// Wait `d`, or less if told to stop meanwhile (then an error).
    async fn pause(&self, d: Duration) -> Result<(), ClientError> {
        if pause(&self.stop, d).await {
            return Err(ClientError::Stopped);
        }
        Ok(())
    }

    async fn podman(&self) -> Result<LibpodClient, ClientError> {
        self.client
            .get_or_try_init(|| {
                LibpodClient::connect_with_timeout(&self.podman_socket, Some(self.profile.request))
            })
            .await
            .cloned()
            .map_err(|source| ClientError::Podman {
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
        certs: &ClientTls,
        owner_uid: u32,
    ) -> Result<(), ClientError> {
        let dir = self.lease_dir(lease);
        let io = |what: &Path, source: std::io::Error| ClientError::Files {
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
        let comment = format!("Written by gpuq for lease {lease}.");
        let control = |d: &str| {
            ControlConfig {
                system: p.system.clone(),
                port: p.port,
                hostlist: p.hostlist.clone(),
                transport: Transport::in_dir(d, "admin"),
            }
            .render(&comment)
            .map_err(|e| ClientError::Config {
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
        .map_err(|e| ClientError::Config {
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
                    file("admin.crt", certs.admin_cert.as_bytes(), CERT_MODE),
                    file("admin.key", certs.admin_key.as_bytes(), KEY_MODE),
                ],
                (owner_uid, 0),
                0o500,
            ),
            (
                "agent-etc",
                vec![
                    file("daos_agent.yml", agent.as_bytes(), 0o444),
                    file("daosCA.crt", certs.ca_cert.as_bytes(), CERT_MODE),
                    file("agent.crt", certs.agent_cert.as_bytes(), CERT_MODE),
                    file("agent.key", certs.agent_key.as_bytes(), KEY_MODE),
                ],
                // The agent runs as the job's owner (start_agent): it reads
                // these. The agent certificate's methods (GetAttachInfo,
                // PoolEvict, SystemCleanup: DAOS's grpc_authorization.go)
                // are a subset of the admin certificate's, which the owner
                // holds in user/. Root's lease: nobody's (agent_uid_for).
                (agent_uid_for(owner_uid), 0),
                0o500,
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
        // The agent makes its socket there as its own uid; the owner's
        // clients pass (root's pass anyway).
        owner_only_passage(&ad, agent_uid_for(owner_uid)).map_err(|e| io(&ad, e))?;
        Ok(())
    }

    /// The uid the lease's agent runs as: the owner of its `agent-etc/`
    /// (written by [`Self::write_files`] in the lease's root-owned
    /// directory, so nobody else could have made it), read by descriptor
    /// without following a link; never root.
    fn agent_uid(&self, lease: &str) -> Result<u32, ClientError> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let etc = self.lease_dir(lease).join("agent-etc");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags((nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_NOFOLLOW).bits())
            .open(&etc)
            .map_err(|source| ClientError::Files {
                path: etc.clone(),
                source,
            })?;
        let uid = f
            .metadata()
            .map_err(|source| ClientError::Files {
                path: etc.clone(),
                source,
            })?
            .uid();
        if uid == 0 {
            return Err(ClientError::Agent(format!(
                "{} is root's: the agent never runs as root (write the lease's files for its owner first)",
                etc.display()
            )));
        }
        Ok(uid)
    }

    /// Remove `<run_dir>/<lease>/` (after the agent and clients are gone).
    pub fn remove_files(&self, lease: &str) -> Result<(), ClientError> {
        let dir = self.lease_dir(lease);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ClientError::Files { path: dir, source }),
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

    /// Write `record` (see [`ClientRecord`]) into its lease's directory.
    pub fn write_record(&self, record: &ClientRecord) -> Result<(), ClientError> {
        let path = self.lease_dir(&record.lease).join(RECORD);
        let bytes = serde_json::to_vec_pretty(record).unwrap_or_default();
        gpuq_durable::write_atomic(&path, &bytes, 0o600)
            .map_err(|source| ClientError::Files { path, source })
    }

    /// Write the lease's files on this host (see the module's table).
    pub fn prepare_files(
        &self,
        lease: &str,
        certs: &ClientTls,
        owner_uid: u32,
    ) -> Result<String, ClientError> {
        self.check_stop()?;
        self.write_files(lease, certs, owner_uid)?;
        Ok(format!("{} written", self.lease_dir(lease).display()))
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
    pub async fn start_agent(&self, lease: &str) -> Result<String, ClientError> {
        self.check_stop()?;
        // Who it runs as, before Podman is asked anything.
        let uid = self.agent_uid(lease)?;
        let pm = self.podman().await?;
        let name = Self::agent_name(lease);
        let mut spec = self.base_spec(name.clone(), lease, Role::Agent);
        // daos.md: the agent monitors its clients' processes (host PID):
        // their PIDs reach it as the kernel translates a socket peer's PID
        // into the receiver's namespace, and it watches /proc/PID. As the
        // job's owner (the clients' uid), never root: in the host's PID
        // namespace a capless uid 0 could still signal every root process.
        spec.pid = Namespace::Host;
        spec.user = Some(format!("{uid}:{AGENT_GID}"));
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
        let deadline = Instant::now() + AGENT_UP;
        while !agent_listens(&sock) {
            if Instant::now() >= deadline {
                return Err(ClientError::Agent(format!(
                    "the agent did not listen on {} within {} s",
                    sock.display(),
                    AGENT_UP.as_secs()
                )));
            }
            let info = pm
                .container_inspect(&name)
                .await
                .map_err(container("inspect", &name))?;
            if !info.state.running {
                return Err(ClientError::Agent(format!(
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
    ) -> Result<String, ClientError> {
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
            return Err(ClientError::Left {
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
    pub async fn remove_clients(&self, lease: &str) -> Result<String, ClientError> {
        // Their main process is an idle `sleep` (which ignores SIGTERM as
        // PID 1); the user's commands are exec sessions: nothing to stop
        // gracefully, and a stop would only wait out its grace period.
        self.remove_role(lease, Role::Client, None).await
    }

    /// Cleanup step: the agent. SIGTERM while the servers are up (it
    /// evicts its pool handles; daos.md), confirmed by its process leaving
    /// (seen in `/proc`, or Podman's own stop where it cannot be seen). The
    /// stopped container is removed alongside `dmg system stop`
    /// ([`ClientHost::remove_agent`]).
    pub async fn stop_agent(&self, lease: &str) -> Result<String, ClientError> {
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

    /// The agent's container, stopped by [`ClientHost::stop_agent`], removed
    /// while `dmg system stop` runs (stopped first if it runs again, e.g.
    /// after a restart); confirmed like every removal.
    pub async fn remove_agent(&self, lease: &str) -> Result<String, ClientError> {
        self.remove_role(lease, Role::Agent, Some(AGENT_GRACE))
            .await
    }

    /// This host's part of the wipe, while the nodes wipe theirs (the
    /// servers are stopped by then): the lease's files, and the admin
    /// container a lease prepared by an earlier version made (an idle
    /// `sleep`: killed at once; confirmed like every removal).
    pub async fn remove_lease_files(&self, lease: &str) -> Result<String, ClientError> {
        let legacy = self.remove_role(lease, Role::Admin, None).await?;
        self.remove_files(lease)?;
        Ok(if legacy.starts_with("removed") {
            format!("{legacy} (an earlier version's admin container), lease files removed")
        } else {
            "lease files removed".to_string()
        })
    }
}

/// A Podman error about `target` (a container, or a role's containers).
fn container(op: &'static str, target: &str) -> impl FnOnce(gpuq_podman::Error) -> ClientError {
    let target = target.to_string();
    move |source| ClientError::Container {
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

/// The agent's socket directory: root's, and open to the job's owner
/// `uid` alone (`u::rwx, user:uid:-wx, m::-wx`, nothing for group and
/// others: the agent, run as the owner, makes its socket there, the
/// owner's clients pass through, nobody lists it, and the owner cannot
/// change its mode or ACL): DAOS makes the socket 0666, so the directory is the only
/// barrier between another user on this host and an agent that hands out
/// credentials on the owner's running system. Opened by descriptor (no
/// symlink followed), set, read back. A filesystem without POSIX ACLs
/// fails the step: never a wider directory.
fn owner_only_passage(dir: &Path, uid: u32) -> std::io::Result<()> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_NOFOLLOW).bits())
        .open(dir)?;
    std::os::unix::fs::fchown(&f, Some(0), Some(0))?;
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    gpuq_sys::acl::set_access(f.as_fd(), &gpuq_sys::acl::owner_and_user_write_search(uid))
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot limit the agent's socket directory to the job's owner (POSIX ACL): {e}"
                ),
            )
        })?;
    let users = gpuq_sys::acl::named_users(f.as_fd())?;
    let mode = f.metadata()?.mode() & 0o7777;
    if users != [uid] || mode != 0o730 {
        return Err(std::io::Error::other(format!(
            "the agent's socket directory reads back as mode {mode:o}, named users {users:?}; expected 730 and [{uid}]"
        )));
    }
    Ok(())
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
    use super::agent_listens;

    #[test]
    fn a_record_is_read_only_if_root_alone_could_have_written_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path();
        std::fs::set_permissions(run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let lease = run_dir.join("slurm7-100");
        std::fs::create_dir(&lease).unwrap();
        std::fs::set_permissions(&lease, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(super::read_record(run_dir, "slurm7-100").unwrap(), None);
        let rec = lease.join(super::RECORD);
        let good = r#"{"lease":"slurm7-100","profile":"test","owner_uid":61001}"#;
        std::fs::write(&rec, good).unwrap();
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            super::read_record(run_dir, "slurm7-100")
                .unwrap()
                .unwrap()
                .owner_uid,
            61001
        );
        // Writable by others, another user's, a link, another lease's.
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert!(super::read_record(run_dir, "slurm7-100").is_err());
        std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&rec, Some(61001), None).unwrap();
        assert!(super::read_record(run_dir, "slurm7-100").is_err());
        std::fs::remove_file(&rec).unwrap();
        let elsewhere = run_dir.join("other.json");
        std::fs::write(&elsewhere, good).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &rec).unwrap();
        let e = super::read_record(run_dir, "slurm7-100")
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        std::fs::remove_file(&rec).unwrap();
        std::fs::write(&rec, good.replace("slurm7-100", "slurm8-100")).unwrap();
        let e = super::read_record(run_dir, "slurm7-100")
            .unwrap_err()
            .to_string();
        assert!(e.contains("names lease slurm8-100"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn the_agent_socket_is_reached_by_the_job_s_owner_and_root_alone() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        use std::os::unix::process::CommandExt;
        if !nix::unistd::Uid::effective().is_root() {
            gpuq_test_skip::cannot_run(
                "the_agent_socket_is_reached_by_the_job_s_owner_and_root_alone",
                "needs root (chown, processes as other users)",
            );
            return;
        }
        let (owner, other) = (61_093, 61_094);
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ad = dir.path().join("agent");
        std::fs::create_dir(&ad).unwrap();
        std::fs::set_permissions(&ad, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The agent's socket, made 0666 as DAOS's agent makes it.
        let sock = ad.join("daos_agent.sock");
        let _agent = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
        let python_as = |uid: u32, code: &str, arg: &std::path::Path| {
            std::process::Command::new("/usr/bin/python3")
                .args(["-c", code])
                .arg(arg)
                .uid(uid)
                .gid(uid)
                .output()
                .expect("run /usr/bin/python3 (integration/install-deps installs it)")
        };
        let connect_as = |uid: u32| {
            python_as(
                uid,
                "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])",
                &sock,
            )
        };
        // What the agent does at its start, as the job's owner: a socket
        // of its own in the directory.
        let bind_as = |uid: u32| {
            python_as(
                uid,
                "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.bind(sys.argv[1])",
                &ad.join(format!("bound-by-{uid}")),
            )
        };
        let list_as = |uid: u32| python_as(uid, "import os, sys\nos.listdir(sys.argv[1])", &ad);
        // The hole as it was: a 0755 directory lets any user in.
        assert!(connect_as(other).status.success());
        super::owner_only_passage(&ad, owner).unwrap();
        let m = std::fs::metadata(&ad).unwrap();
        assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o730, 0, 0));
        let o = connect_as(owner);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let o = bind_as(owner);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(ad.join(format!("bound-by-{owner}")).exists());
        let refused = |o: std::process::Output| {
            assert!(!o.status.success());
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("PermissionError"),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        // The owner makes names there but does not list it; nobody else
        // connects, makes or lists.
        refused(list_as(owner));
        refused(connect_as(other));
        refused(bind_as(other));
        refused(list_as(other));
        assert!(!ad.join(format!("bound-by-{other}")).exists());
        std::os::unix::net::UnixStream::connect(&sock).expect("root reaches it");
        // Done again (a retried step): the same.
        super::owner_only_passage(&ad, owner).unwrap();
        assert!(!connect_as(other).status.success());
        // A symlink in the directory's place is not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&ad, &link).unwrap();
        assert!(super::owner_only_passage(&link, other).is_err());
        assert_eq!(gpuq_sys_users(&ad), vec![owner]);
    }

    /// A lease whose `agent-etc/` is root's (files written for no owner)
    /// or a symlink: the agent is refused before Podman is asked (the
    /// socket named here does not exist: asking would fail otherwise), and
    /// nothing of the lease changes.
    #[test]
    fn the_agent_never_starts_as_root_and_podman_is_not_asked() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::Uid::effective().is_root() {
            gpuq_test_skip::cannot_run(
                "the_agent_never_starts_as_root_and_podman_is_not_asked",
                "needs root (a root-owned agent-etc/)",
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run");
        let host = test_host(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listing = |lease: &str| {
            let mut v: Vec<String> = std::fs::read_dir(run_dir.join(lease))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        // Root's agent-etc/.
        let etc = run_dir.join("job7-100").join("agent-etc");
        std::fs::create_dir_all(&etc).unwrap();
        assert_eq!(std::fs::metadata(&etc).unwrap().uid(), 0);
        let e = rt.block_on(host.start_agent("job7-100")).unwrap_err();
        assert!(
            matches!(&e, super::ClientError::Agent(m) if m.contains("never runs as root")),
            "{e}"
        );
        assert_eq!(listing("job7-100"), ["agent-etc"]);
        // A symlink in its place (to an owner's directory) is not followed.
        let owners = dir.path().join("owners");
        std::fs::create_dir(&owners).unwrap();
        std::os::unix::fs::chown(&owners, Some(61001), Some(61001)).unwrap();
        std::fs::create_dir_all(run_dir.join("job8-100")).unwrap();
        std::os::unix::fs::symlink(&owners, run_dir.join("job8-100").join("agent-etc")).unwrap();
        let e = rt.block_on(host.start_agent("job8-100")).unwrap_err();
        assert!(matches!(&e, super::ClientError::Files { .. }), "{e}");
        assert_eq!(listing("job8-100"), ["agent-etc"]);
    }

    /// A client host under `dir` (`run/`) whose Podman socket does not
    /// exist: a test that asks Podman fails there.
    fn test_host(dir: &std::path::Path) -> super::ClientHost {
        super::ClientHost::new(
            dir.join("no-podman.sock"),
            dir.join("run"),
            super::ClientProfile {
                image: gpuq_podman::ImageId::parse(&format!("sha256:{}", "a".repeat(64))).unwrap(),
                system: "daos_server".into(),
                port: 10001,
                hostlist: vec!["10.200.0.11".into()],
                access_points: vec!["10.200.0.11".into()],
                request: std::time::Duration::from_secs(5),
            },
        )
    }

    /// Root's lease (`gpuq e2e`'s job): the agent's files and socket
    /// directory are nobody's, the admin certificate root's.
    #[test]
    fn a_root_lease_s_agent_files_are_nobody_s_and_the_owner_s_otherwise() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::Uid::effective().is_root() {
            gpuq_test_skip::cannot_run(
                "a_root_lease_s_agent_files_are_nobody_s_and_the_owner_s_otherwise",
                "needs root (chown)",
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let host = test_host(dir.path());
        let tls = gpuq_protocol::node::ClientTls {
            ca_cert: "CA".into(),
            admin_cert: "ADMIN".into(),
            admin_key: "ADMINKEY".into(),
            agent_cert: "AGENT".into(),
            agent_key: "AGENTKEY".into(),
        };
        for (lease, owner, agent) in [("job9-100", 0, 65534), ("job10-100", 61001, 61001)] {
            host.write_files(lease, &tls, owner).unwrap();
            let l = dir.path().join("run").join(lease);
            let m = |p: &str| {
                let m = std::fs::metadata(l.join(p)).unwrap();
                (m.uid(), m.mode() & 0o7777)
            };
            assert_eq!(m("agent-etc"), (agent, 0o500), "{lease}");
            assert_eq!(m("agent-etc/agent.key"), (agent, 0o400), "{lease}");
            assert_eq!(m("user"), (owner, 0o500), "{lease}");
            assert_eq!(m("agent"), (0, 0o730), "{lease}");
            assert_eq!(gpuq_sys_users(&l.join("agent")), vec![agent], "{lease}");
            assert_eq!(host.agent_uid(lease).unwrap(), agent, "{lease}");
        }
    }

    fn gpuq_sys_users(p: &std::path::Path) -> Vec<u32> {
        use std::os::fd::AsFd;
        let f = std::fs::File::open(p).unwrap();
        gpuq_sys::acl::named_users(f.as_fd()).unwrap()
    }

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
}
