//! One lease on one node: preflight, start, stop, wipe.
//!
//! Every step checks before it acts and confirms after it acted:
//! - `preflight` only reads (processes, ports, containers, the lease
//!   record, the image, and in physical mode the block-device checks);
//! - `start` runs preflight again, writes the node-side lease record
//!   (`<jobs_dir>/active-lease` and `lease.json`: the lease, its profile, its
//!   wipe mode and, in physical mode, exactly the devices it is given, as
//!   found by preflight) durably **before** it creates anything, creates a
//!   **new** metadata directory (an existing one is a
//!   refusal: old DAOS metadata makes a server rejoin the old system),
//!   renders `daos_server.yml` for the pinned image's DAOS version, inspects
//!   the image by its full ID and creates + starts the server container;
//! - `stop` stops our containers of that lease (grace period, then kill),
//!   removes them and confirms that none, and no DAOS process of ours, is left;
//! - `wipe` refuses while any container of the lease exists, and decides
//!   from the lease record alone ([`crate::wipeplan`]): a missing record
//!   with data left, an unknown mode, a profile that is gone or changed mode,
//!   a moved data directory or an allowlist that is not exactly the recorded
//!   devices refuses (audit line, nothing touched, record kept). Test mode
//!   removes only `<test_dir>/<lease>/`; physical mode runs the block-device
//!   crate's checks + BLKDISCARD + verify + audit on exactly the recorded
//!   devices and removes the metadata directory only if all of them passed;
//!   then it releases the lease record.
//!
//! `stop` and `wipe` are idempotent: a repeat for a lease already cleaned
//! succeeds and says so.

use crate::audit;
use crate::dmg;
use crate::procscan;
use crate::profile::{Mode, Profile, ServiceConfig};
use crate::wipeplan::{self, Plan};
use gpuq_daosconf::{Bdev, Engine, MemInfo, MemoryPlan, ServerConfig};
use gpuq_podman::{
    lease_labels, ContainerSpec, LabelFilter, Mount, MountKind, Namespace, Podman, Rlimit, Role,
    LABEL_LEASE, LABEL_ROLE,
};
use gpuq_protocol::node::{
    valid_lease, Finding, LeaseDevice, LeaseMode, NodeLease, NodeStatus, OurContainer, PinStatus,
    PreflightReport, PreflightRequest, ServerTls, StartReport, StartRequest, StepReport,
};
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NodeError {
    #[error("{0}")]
    BadRequest(String),
    #[error("no profile '{0}' on this node")]
    NoProfile(String),
    /// Refused because the node is not in the state the step needs; nothing was changed.
    #[error("{0}")]
    Refused(String),
    #[error("preflight refused lease {lease}: {}", .findings.iter().map(|f| format!("{}: {}", f.reason, f.detail)).collect::<Vec<_>>().join("; "))]
    Preflight {
        lease: String,
        findings: Vec<Finding>,
    },
    #[error("podman: {0}")]
    Podman(#[from] gpuq_podman::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Failed(String),
}

/// This node's memory, as DAOS will read it at start, and what a lease of
/// `profile` leaves to the system (gpuq_daosconf::MemoryPlan).
fn node_memory_plan(profile: &Profile) -> Result<MemoryPlan, String> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("reading /proc/meminfo: {e}"))?;
    let mem = MemInfo::parse(&text).map_err(|e| e.to_string())?;
    MemoryPlan::fit(
        profile.daos_version,
        mem,
        profile.targets,
        profile.scm_size_gib,
        hugepages(profile),
    )
    .map_err(|e| e.to_string())
}

/// Whether the lease's server uses hugepages: always in physical mode;
/// in test mode (file bdevs) only where DAOS refuses to go without them
/// (2.6: `disable_hugepages` beside any bdev is code 726).
fn hugepages(profile: &Profile) -> bool {
    profile.mode == Mode::Physical || profile.daos_version != gpuq_daosconf::DaosVersion::V2_8
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NodeError {
    let what = what.into();
    move |source| NodeError::Io { what, source }
}

pub struct NodeService<P> {
    cfg: ServiceConfig,
    podman: P,
    /// `--stor nfsrdma`: the upcall responder of the lease exported here.
    pub(crate) nfs_responder: std::sync::Mutex<Option<(String, crate::nfsd::Responder)>>,
}

impl<P> std::fmt::Debug for NodeService<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeService")
            .field("node", &self.cfg.node.node.name)
            .finish()
    }
}

/// An allowlisted device as a physical lease's checks found it.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub(crate) device: LeaseDevice,
    /// Its device node, e.g. `/dev/nvme0n1`.
    pub(crate) path: String,
    /// `major:minor`.
    pub(crate) devnum: String,
}

fn server_name(lease: &str) -> String {
    format!("gpuq-{lease}-server")
}

impl<P: Podman> NodeService<P> {
    pub fn new(cfg: ServiceConfig, podman: P) -> Self {
        NodeService {
            cfg,
            podman,
            nfs_responder: std::sync::Mutex::new(None),
        }
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.cfg
    }

    pub fn node_name(&self) -> &str {
        &self.cfg.node.node.name
    }

    /// `GET /v1/install` (verify-install): this node's manifests checked
    /// under its install root, this helper's version and the hash of the
    /// executable it runs. Read-only; hashes files, so blocking. Manifests
    /// must be root's: the helper is root, and a manifest anyone else could
    /// edit could make a changed binary look installed.
    pub fn install(&self) -> gpuq_manifest::report::HostInstall {
        gpuq_manifest::report::inspect_host(
            self.node_name(),
            "gpuq-node",
            env!("CARGO_PKG_VERSION"),
            "gpuq-node",
            &self.cfg.install.manifest_dir,
            &self.cfg.install.prefix,
            0,
        )
    }

    pub(crate) fn jobs_dir(&self) -> &Path {
        &self.cfg.node.node.jobs_dir
    }

    /// `<jobs_dir>/<lease>/`: config, audit records. Kept after the wipe.
    pub fn lease_dir(&self, lease: &str) -> PathBuf {
        self.jobs_dir().join(lease)
    }

    /// The directory the lease's DAOS metadata (and test bdevs) live in;
    /// removed by the wipe.
    pub fn data_dir(&self, lease: &str, mode: Mode) -> PathBuf {
        match mode {
            Mode::Physical => self.lease_dir(lease).join("control_meta"),
            Mode::Test => self.cfg.node.node.test_dir.join(lease),
        }
    }

    fn record_path(&self) -> PathBuf {
        self.jobs_dir().join("lease.json")
    }

    fn active_path(&self) -> PathBuf {
        self.jobs_dir().join(gpuq_blockdev::wipe::ACTIVE_LEASE_FILE)
    }

    /// The node-side lease record. An unreadable record is an error: it
    /// must never be mistaken for "no lease".
    pub fn lease_record(&self) -> Result<Option<NodeLease>, NodeError> {
        match std::fs::read(self.record_path()) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                NodeError::Failed(format!(
                    "{} is unreadable: {e}",
                    self.record_path().display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // active-lease without lease.json: a record half-written by an older helper.
                match std::fs::read_to_string(self.active_path()) {
                    Ok(l) => Ok(Some(NodeLease {
                        lease: l.trim().to_string(),
                        profile: String::new(),
                        phase: "unknown".into(),
                        metadata_dir: String::new(),
                        container: None,
                        since: 0,
                        mode: None,
                        devices: Vec::new(),
                        export: None,
                        nfs: None,
                    })),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io(format!("read {}", self.active_path().display()))(e)),
                }
            }
            Err(e) => Err(io(format!("read {}", self.record_path().display()))(e)),
        }
    }

    /// Durably: each file by temp + fsync + rename + fsync of `jobs_dir`,
    /// and `jobs_dir`'s own entry fsynced in its parent when it is new.
    pub(crate) fn write_record(&self, rec: &NodeLease) -> Result<(), NodeError> {
        if !self.jobs_dir().is_dir() {
            std::fs::create_dir_all(self.jobs_dir()).map_err(io("create jobs_dir"))?;
            if let Some(parent) = self.jobs_dir().parent() {
                gpuq_durable::sync_dir(parent).map_err(io("fsync jobs_dir's parent"))?;
            }
        }
        gpuq_durable::write_atomic(&self.active_path(), rec.lease.as_bytes(), 0o600)
            .map_err(io("write active-lease"))?;
        let bytes = serde_json::to_vec_pretty(rec).unwrap_or_default();
        gpuq_durable::write_atomic(&self.record_path(), &bytes, 0o600)
            .map_err(io("write lease.json"))
    }

    /// `active-lease` first: a crash in between leaves the whole record
    /// (`lease.json`), whose wipe can be repeated; the other order would
    /// leave a bare `active-lease`, which the wipe refuses as modeless.
    fn release_record(&self) -> Result<(), NodeError> {
        gpuq_durable::remove(&self.active_path()).map_err(io("remove active-lease"))?;
        gpuq_durable::remove(&self.record_path())
            .map(|_| ())
            .map_err(io("remove lease.json"))
    }

    fn profile(&self, name: &str) -> Result<&Profile, NodeError> {
        self.cfg
            .profiles
            .get(name)
            .ok_or_else(|| NodeError::NoProfile(name.to_string()))
    }

    pub(crate) fn check_lease(lease: &str) -> Result<(), NodeError> {
        if valid_lease(lease) {
            Ok(())
        } else {
            Err(NodeError::BadRequest(format!(
                "lease name '{lease}' is not valid: 1-64 letters, digits, - and _"
            )))
        }
    }

    /// This node's Podman API.
    pub(crate) fn podman(&self) -> &P {
        &self.podman
    }

    pub(crate) async fn our_containers(
        &self,
        lease: Option<&str>,
    ) -> Result<Vec<OurContainer>, NodeError> {
        let filter = match lease {
            Some(l) => LabelFilter::lease(l),
            None => LabelFilter::ours(),
        };
        Ok(self
            .podman
            .container_list(&filter)
            .await?
            .into_iter()
            .map(|c| OurContainer {
                name: c.names.first().cloned().unwrap_or_default(),
                lease: c.labels.get(LABEL_LEASE).cloned().unwrap_or_default(),
                role: c.labels.get(LABEL_ROLE).cloned().unwrap_or_default(),
                state: c.state.clone(),
                image: c.image_id.clone(),
                id: c.id,
            })
            .collect())
    }

    pub async fn status(&self) -> Result<NodeStatus, NodeError> {
        let images: Vec<String> = self
            .podman
            .image_list()
            .await?
            .into_iter()
            .map(|i| i.id)
            .collect();
        let pins = self
            .cfg
            .profiles
            .values()
            .map(|p| PinStatus {
                profile: p.name.clone(),
                image: p.image.to_string(),
                present: images.iter().any(|i| {
                    p.image
                        .to_string()
                        .ends_with(i.trim_start_matches("sha256:"))
                }),
            })
            .collect();
        Ok(NodeStatus {
            node: self.node_name().to_string(),
            helper_version: env!("CARGO_PKG_VERSION").to_string(),
            podman_api_version: self.podman.version().to_string(),
            // The lease's host NQN is the one thing that admits a host to
            // its export: never in a status (the broker shows statuses).
            lease: self.lease_record()?.map(|mut r| {
                if let Some(e) = r.export.as_mut() {
                    e.host_nqn = "(not shown)".into();
                }
                r
            }),
            containers: self.our_containers(None).await?,
            images,
            pins,
            // The module index is ~100 KiB (Debian 12's): read off the
            // runtime.
            kernel: tokio::task::spawn_blocking(|| {
                crate::kernel::probe(&crate::kernel::KernelFiles::default())
            })
            .await
            .ok(),
            accepted_risks: self.cfg.accepted_risks(),
        })
    }

    /// Read-only: every reason this node cannot take `lease` now.
    pub async fn preflight(&self, req: &PreflightRequest) -> Result<PreflightReport, NodeError> {
        if self.is_stor_profile(&req.profile) {
            return Ok(self.check_stor(&req.lease, &req.profile).await?.0);
        }
        Ok(self.check(req).await?.0)
    }

    /// What of another lease or service is on this node (any lease kind's
    /// preflight): containers labelled for another lease, DAOS processes
    /// not in this lease's containers, the node's record of another lease.
    /// Returns the IDs of this lease's own containers.
    pub(crate) async fn foreign_findings(
        &self,
        lease: &str,
        find: &mut dyn FnMut(&str, String),
    ) -> Result<Vec<String>, NodeError> {
        // Containers labelled for another lease; ours for this lease are
        // fine only if we are re-checking a lease we already started.
        let containers = self.our_containers(None).await?;
        let ours: Vec<String> = containers
            .iter()
            .filter(|c| c.lease == lease)
            .map(|c| c.id.clone())
            .collect();
        for c in containers.iter().filter(|c| c.lease != lease) {
            find(
                "foreign_container",
                format!(
                    "container {} ({}) belongs to lease {}",
                    c.name, c.state, c.lease
                ),
            );
        }
        match procscan::scan() {
            Ok(procs) => {
                for p in procs {
                    if p.container.as_ref().is_some_and(|c| ours.contains(c)) {
                        continue;
                    }
                    find(
                        "foreign_engine",
                        format!(
                            "{} (pid {}) runs on this node{}; gpuq never stops a service it did not start",
                            p.name,
                            p.pid,
                            p.container.map(|c| format!(" in container {}", &c[..12])).unwrap_or_default()
                        ),
                    );
                }
            }
            Err(e) => find("check_failed", format!("cannot scan processes: {e}")),
        }
        match self.lease_record() {
            Ok(Some(rec)) if rec.lease != lease => find(
                "foreign_lease",
                format!("this node holds lease {} (phase {})", rec.lease, rec.phase),
            ),
            Ok(_) => {}
            Err(e) => find("check_failed", e.to_string()),
        }
        Ok(ours)
    }

    /// [`NodeService::preflight`], how many containers `req.lease`
    /// already has here (fine for a preflight, refused by a start), and in
    /// physical mode the allowlisted devices as the checks found them (what
    /// `start` records as the lease's devices).
    async fn check(
        &self,
        req: &PreflightRequest,
    ) -> Result<(PreflightReport, usize, Vec<LeaseDevice>), NodeError> {
        Self::check_lease(&req.lease)?;
        let profile = self.profile(&req.profile)?;
        let mut findings = Vec::new();
        let mut find = |reason: &str, detail: String| {
            findings.push(Finding {
                reason: reason.to_string(),
                detail,
            })
        };
        let ours = self.foreign_findings(&req.lease, &mut find).await?;
        match gpuq_sys::net::tcp_listening_ports() {
            Ok(l) if l.contains(&profile.port) && ours.is_empty() => find(
                "port_in_use",
                format!("control port {} is already listening", profile.port),
            ),
            Ok(_) => {}
            Err(e) => find("check_failed", format!("cannot read listening ports: {e}")),
        }
        match self.podman.image_inspect(&profile.image).await {
            Ok(_) => {}
            Err(gpuq_podman::Error::NotFound { .. }) => find(
                "image_missing",
                format!(
                    "pinned image {} is not in this node's storage",
                    profile.image
                ),
            ),
            Err(e) => find("check_failed", format!("image inspect: {e}")),
        }
        let devices = if profile.mode == Mode::Physical {
            self.check_devices(&req.lease, &profile.name, &mut find)
                .into_iter()
                .map(|f| f.device)
                .collect()
        } else {
            Vec::new()
        };
        let report = PreflightReport {
            node: self.node_name().to_string(),
            lease: req.lease.clone(),
            ok: findings.is_empty(),
            findings,
        };
        Ok((report, ours.len(), devices))
    }

    /// The block-device checks of a physical lease (preflight's, without
    /// touching anything): the allowlisted devices as found, and a finding
    /// for every refusal, an unread identity and an unclaimed device.
    pub(crate) fn check_devices(
        &self,
        lease: &str,
        profile: &str,
        find: &mut dyn FnMut(&str, String),
    ) -> Vec<Found> {
        let mut devices = Vec::new();
        if self.cfg.node.devices.is_empty() {
            // Its wipe would discard nothing and still say `ok`.
            find(
                "device_refused",
                format!(
                    "profile '{}' is physical mode, but {} allowlists no device ([[devices]])",
                    profile,
                    self.cfg.source.display()
                ),
            );
        }
        {
            let report = gpuq_blockdev::wipe::run(
                &self.cfg.node,
                &gpuq_blockdev::wipe::Request {
                    mode: gpuq_blockdev::wipe::Mode::Inspect,
                    lease: Some(lease.to_string()),
                    expected_signatures: vec![],
                    purpose: gpuq_blockdev::wipe::Purpose::Lease,
                },
            );
            match report {
                Ok(r) => {
                    for d in &r.devices {
                        // How the allowlist identifies it, and what it was
                        // found to be.
                        match (crate::claim::device_of(d), d.passed(), &d.device) {
                            (Some(found), true, Some(seen)) => devices.push(Found {
                                device: found,
                                path: seen.path.clone(),
                                devnum: seen.devnum.clone(),
                            }),
                            (_, true, _) => find(
                                "check_failed",
                                format!(
                                    "{}: passed, but its identity was not read",
                                    d.entry.label()
                                ),
                            ),
                            (_, false, _) => {}
                        }
                        for refusal in &d.refusals {
                            find(
                                "device_refused",
                                format!(
                                    "{}: {}: {}",
                                    d.entry.label(),
                                    serde_json::to_value(refusal.reason)
                                        .ok()
                                        .and_then(|v| v.as_str().map(String::from))
                                        .unwrap_or_default(),
                                    refusal.detail
                                ),
                            );
                        }
                    }
                }
                Err(e) => find("check_failed", format!("block devices: {e}")),
            }
        }
        if !devices.is_empty() {
            // Only what an activation discarded and claimed (issue #17).
            let found: Vec<LeaseDevice> = devices.iter().map(|f| f.device.clone()).collect();
            for why in crate::claim::unclaimed(self.jobs_dir(), &found) {
                find("unclaimed", why);
            }
        }
        devices
    }

    pub async fn start(&self, lease: &str, req: &StartRequest) -> Result<StartReport, NodeError> {
        Self::check_lease(lease)?;
        let profile = self.profile(&req.profile)?.clone();
        // A physical server listens on the storage network: without the
        // lease's certificates its control port would take `dmg` from
        // anyone who reaches it (allow_insecure). gpuq's broker always
        // sends them; a request without them is refused before anything
        // is written or started. Test mode (loop files on the test
        // cluster's private addresses) still accepts it.
        if profile.mode == Mode::Physical && req.tls.is_none() {
            return Err(NodeError::Refused(format!(
                "lease {lease}: profile '{}' is physical and the start request carries no TLS                  certificates; a physical DAOS server runs only with the lease's mutual TLS                  (use a broker of this version)",
                profile.name
            )));
        }
        if req.dmg.is_some() && req.tls.is_none() {
            return Err(NodeError::BadRequest(format!(
                "lease {lease}: dmg access needs the lease's TLS certificates in the same request"
            )));
        }
        // DAOS sizes its ram-disk and hugepages from this node's RAM and
        // refuses to start when they do not fit beside its reservation
        // (docs/daos-facts.md): fit the reservation to the node now, or
        // refuse before anything is written.
        let memory = node_memory_plan(&profile).map_err(|e| {
            NodeError::Refused(format!(
                "lease {lease}: profile '{}' does not fit this node's memory: {e}",
                profile.name
            ))
        })?;
        let (pre, ours, devices) = self
            .check(&PreflightRequest {
                lease: lease.to_string(),
                profile: req.profile.clone(),
            })
            .await?;
        if !pre.ok {
            return Err(NodeError::Preflight {
                lease: lease.to_string(),
                findings: pre.findings,
            });
        }
        if ours > 0 {
            return Err(NodeError::Refused(format!(
                "lease {lease} already has containers on this node: stop it first"
            )));
        }
        let lease_dir = self.lease_dir(lease);
        let data_dir = self.data_dir(lease, profile.mode);
        // Write before act: the node records the lease before anything exists.
        let mut rec = NodeLease {
            lease: lease.to_string(),
            profile: profile.name.clone(),
            phase: "starting".into(),
            metadata_dir: data_dir.display().to_string(),
            container: None,
            since: audit::now(),
            mode: Some(match profile.mode {
                Mode::Physical => LeaseMode::Physical,
                Mode::Test => LeaseMode::Test,
            }),
            devices: match profile.mode {
                Mode::Physical => devices,
                Mode::Test => Vec::new(),
            },
            export: None,
            nfs: None,
        };
        self.write_record(&rec)?;
        std::fs::create_dir_all(&lease_dir)
            .map_err(io(format!("create {}", lease_dir.display())))?;
        if let Some(parent) = data_dir.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        // A new directory, or a refusal: never reuse old metadata.
        std::fs::create_dir(&data_dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                NodeError::Refused(format!(
                    "metadata directory {} already exists: a lease needs a new one (wipe the old lease first)",
                    data_dir.display()
                ))
            } else {
                io(format!("create {}", data_dir.display()))(e)
            }
        })?;
        let control_meta = data_dir.join("control_meta");
        let bdev = match profile.mode {
            Mode::Physical => Bdev::Nvme {
                // DAOS's bdev_list names controllers; two namespaces of
                // one controller (nsid 1 and 2) are one entry.
                pci: {
                    let mut pci: Vec<String> = Vec::new();
                    for p in self.cfg.node.devices.iter().filter_map(|d| d.pci.clone()) {
                        if !pci.contains(&p) {
                            pci.push(p);
                        }
                    }
                    pci
                },
            },
            Mode::Test => Bdev::File {
                paths: vec![data_dir.join("bdev0").display().to_string()],
                size_gib: profile.bdev_size_gib,
            },
        };
        let yaml = ServerConfig {
            version: profile.daos_version,
            name: "daos_server".into(),
            port: profile.port,
            replicas: req.replicas.clone(),
            provider: profile.provider.clone(),
            control_metadata: control_meta.display().to_string(),
            engines: vec![Engine {
                targets: profile.targets,
                fabric_iface: profile.fabric_iface.clone(),
                fabric_iface_port: profile.fabric_iface_port,
                scm_mount: "/mnt/daos".into(),
                scm_size_gib: profile.scm_size_gib,
                bdev,
            }],
            disable_hugepages: !hugepages(&profile),
            allow_thp: false,
            system_ram_reserved_gib: memory.system_ram_reserved_gib,
            // One fault domain per node, named after it: the test cluster's
            // nodes share one hostname, and a site's names are clearer anyway.
            fault_path: Some(format!("/{}", self.node_name())),
            cert_dir: req.tls.as_ref().map(|_| CERTS_IN.to_string()),
        }
        .render()
        .map_err(|e| NodeError::BadRequest(e.to_string()))?;
        let config_path = lease_dir.join("daos_server.yml");
        gpuq_durable::write_atomic(&config_path, yaml.as_bytes(), 0o644)
            .map_err(io("write daos_server.yml"))?;
        let certs = match &req.tls {
            Some(tls) => Some(write_server_certs(&lease_dir, tls)?),
            None => None,
        };
        // The broker's dmg node: the lease's control config and admin
        // certificate, for `dmg` in this server container (crate::dmg).
        let admin = match (&req.dmg, &req.tls) {
            (Some(access), Some(tls)) => {
                Some(dmg::write_admin(&lease_dir, profile.port, tls, access)?)
            }
            _ => None,
        };
        let mut spec = server_spec(lease, &profile, &config_path, &data_dir, certs.as_deref());
        if let Some(a) = admin {
            spec.mounts
                .push(Mount::bind(a.display().to_string(), dmg::ADMIN_IN).read_only());
        }
        let result = async {
            let id = self.podman.container_create(&spec).await?;
            self.podman.container_start(&id).await?;
            Ok::<String, NodeError>(id)
        }
        .await;
        let id = match result {
            Ok(id) => id,
            Err(e) => {
                let _ = audit::append(&lease_dir, "start", "failed", &e.to_string());
                return Err(e);
            }
        };
        rec.phase = "running".into();
        rec.container = Some(id.clone());
        self.write_record(&rec)?;
        // Started is not ready: DAOS says when each engine awaits its format.
        let engines = 1;
        if let Err(e) = self
            .await_format_required(&id, engines, Duration::from_secs(profile.format_wait_secs))
            .await
        {
            let _ = audit::append(&lease_dir, "start", "failed", &e.to_string());
            return Err(e);
        }
        audit::append(
            &lease_dir,
            "start",
            "ok",
            &format!(
                "container {id} from image {}, awaiting format",
                profile.image
            ),
        )
        .map_err(io("audit"))?;
        Ok(StartReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            container: id,
            metadata_dir: data_dir.display().to_string(),
            config_path: config_path.display().to_string(),
            awaiting_format: true,
        })
    }

    /// Read the server container's output until each of its `engines`
    /// says "format required on instance N" — DAOS's own line
    /// (`SCM format required on instance 0`, or `Metadata ...`), the one its
    /// operators and test harness wait for. The container ending first, or
    /// `within` passing, fails the start with the last lines it printed.
    /// (Polled: Podman's followed k8s-file logs arrive in 250 ms steps.)
    async fn await_format_required(
        &self,
        container: &str,
        engines: usize,
        within: Duration,
    ) -> Result<(), NodeError> {
        let deadline = tokio::time::Instant::now() + within;
        let opts = gpuq_podman::LogOptions::default();
        loop {
            let logs = self.podman.container_logs(container, &opts).await?;
            let text = String::from_utf8_lossy(&logs.stream(gpuq_podman::LogStream::Stdout))
                .into_owned()
                + &String::from_utf8_lossy(&logs.stream(gpuq_podman::LogStream::Stderr));
            if (0..engines).all(|i| text.lines().any(|l| says_format_required(l, i))) {
                return Ok(());
            }
            let tail = || {
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(5)..].join(" | ")
            };
            if !self
                .podman
                .container_inspect(container)
                .await?
                .state
                .running
            {
                return Err(NodeError::Failed(format!(
                    "the server exited before it awaited format; its last lines: {}",
                    tail()
                )));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(NodeError::Failed(format!(
                    "the server did not say `format required` within {}s; its last lines: {}",
                    within.as_secs(),
                    tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stop and remove our containers of `lease`; confirm none is left.
    pub async fn stop(&self, lease: &str) -> Result<StepReport, NodeError> {
        Self::check_lease(lease)?;
        if let Some(rec) = self.lease_record()? {
            if rec.lease != lease {
                return Err(NodeError::Refused(format!(
                    "this node holds lease {}, not {lease}; nothing was stopped",
                    rec.lease
                )));
            }
        }
        let grace = self
            .lease_record()?
            .and_then(|r| self.cfg.profiles.get(&r.profile).map(|p| p.stop_grace_secs))
            .unwrap_or(30);
        let containers = self.our_containers(Some(lease)).await?;
        if containers.is_empty() {
            return Ok(StepReport {
                node: self.node_name().to_string(),
                lease: lease.to_string(),
                already_done: true,
                detail: "no container of this lease on this node".into(),
            });
        }
        let lease_dir = self.lease_dir(lease);
        let mut stopped = Vec::new();
        for c in &containers {
            let how =
                gpuq_podman::stop_local(&self.podman, &c.id, Duration::from_secs(grace)).await?;
            // The server's own output outlives its container (the
            // original kept it under jobs/<lease>/ too).
            let kept = if c.name == server_name(lease) {
                self.keep_output(lease, &c.id).await
            } else {
                String::new()
            };
            gpuq_podman::remove_stopped(&self.podman, &c.id).await?;
            stopped.push(format!("{} ({how}{kept})", c.name));
        }
        // Confirm: no container of the lease, no DAOS process of those containers.
        let left = self.our_containers(Some(lease)).await?;
        let ids: Vec<&String> = containers.iter().map(|c| &c.id).collect();
        let procs: Vec<_> = procscan::scan()
            .map_err(io("scan processes"))?
            .into_iter()
            .filter(|p| p.container.as_ref().is_some_and(|c| ids.contains(&c)))
            .collect();
        if !left.is_empty() || !procs.is_empty() {
            let msg = format!(
                "stop not confirmed: containers left {:?}, DAOS processes left {:?}",
                left.iter().map(|c| &c.name).collect::<Vec<_>>(),
                procs.iter().map(|p| p.pid).collect::<Vec<_>>()
            );
            let _ = audit::append(&lease_dir, "stop", "failed", &msg);
            return Err(NodeError::Failed(msg));
        }
        if let Some(mut rec) = self.lease_record()? {
            rec.phase = "stopped".into();
            self.write_record(&rec)?;
        }
        let detail = format!("stopped and removed {}", stopped.join(", "));
        audit::append(&lease_dir, "stop", "ok", &detail).map_err(io("audit"))?;
        Ok(StepReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            already_done: false,
            detail,
        })
    }

    /// Wipe what the lease left, then release the node's lease record.
    pub async fn wipe(&self, lease: &str) -> Result<StepReport, NodeError> {
        Self::check_lease(lease)?;
        let rec = self.lease_record()?;
        if let Some(r) = &rec {
            if r.lease != lease {
                return Err(NodeError::Refused(format!(
                    "this node holds lease {}, not {lease}; nothing was wiped",
                    r.lease
                )));
            }
        }
        let left = self.our_containers(Some(lease)).await?;
        if !left.is_empty() {
            return Err(NodeError::Refused(format!(
                "lease {lease} still has containers ({}): stop must be confirmed before a wipe",
                left.iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let lease_dir = self.lease_dir(lease);
        let paths = wipeplan::Paths {
            test_dir: self.data_dir(lease, Mode::Test),
            meta_dir: self.data_dir(lease, Mode::Physical),
        };
        // The lease's data directories (of either mode) that exist.
        let mut data_left = Vec::new();
        for p in [&paths.meta_dir, &paths.test_dir] {
            match std::fs::symlink_metadata(p) {
                Ok(_) => data_left.push(p.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(format!("stat {}", p.display()))(e)),
            }
        }
        let plan = match wipeplan::plan(lease, rec.as_ref(), &self.cfg, &paths, &data_left) {
            Ok(p) => p,
            Err(refusal) => {
                let msg = refusal.message(self.node_name(), lease);
                // The refusal is recorded; if even that fails, say so too.
                if let Err(e) = audit::append(&lease_dir, "wipe", "refused", &msg) {
                    return Err(NodeError::Refused(format!(
                        "{msg} (and its audit line could not be written: {e})"
                    )));
                }
                return Err(NodeError::Refused(msg));
            }
        };
        let detail = match plan {
            Plan::Nothing => {
                // A repeat after a wipe cut short before its end, or after
                // one that ended here while the broker that asked for it
                // died: the audit shows this attempt too (on a node that
                // has this lease's directory; none is made for it).
                remove_server_certs(&lease_dir)?;
                if std::fs::symlink_metadata(&lease_dir).is_ok_and(|m| m.is_dir()) {
                    audit::append(
                        &lease_dir,
                        "wipe",
                        "repeat",
                        "asked again: nothing of this lease is left on this node",
                    )
                    .map_err(io("audit"))?;
                }
                return Ok(StepReport {
                    node: self.node_name().to_string(),
                    lease: lease.to_string(),
                    already_done: true,
                    detail: "nothing of this lease is left on this node".into(),
                });
            }
            Plan::Physical { devices, meta_dir } => {
                // Only devices an activation claimed are ever discarded
                // for a lease (the start checked the same).
                let recorded = rec.as_ref().map(|r| r.devices.as_slice()).unwrap_or(&[]);
                let unclaimed = crate::claim::unclaimed(self.jobs_dir(), recorded);
                if !unclaimed.is_empty() {
                    let msg = format!(
                        "lease {lease}'s devices are not all claimed on node {}: {}; nothing was wiped (restore {} as the activation wrote it, then `gpuq recover`)",
                        self.node_name(),
                        unclaimed.join("; "),
                        crate::claim::path(self.jobs_dir()).display()
                    );
                    if let Err(e) = audit::append(&lease_dir, "wipe", "refused", &msg) {
                        return Err(NodeError::Refused(format!(
                            "{msg} (and its audit line could not be written: {e})"
                        )));
                    }
                    return Err(NodeError::Refused(msg));
                }
                let node = gpuq_blockdev::NodeConfig {
                    node: self.cfg.node.node.clone(),
                    devices,
                };
                let report = gpuq_blockdev::wipe::run(
                    &node,
                    &gpuq_blockdev::wipe::Request {
                        mode: gpuq_blockdev::wipe::Mode::Wipe,
                        lease: Some(lease.to_string()),
                        // A `--stor nfsrdma` lease made an XFS on each
                        // device: that signature is its own (any other
                        // still refuses the wipe).
                        expected_signatures: if rec.as_ref().is_some_and(|r| r.nfs.is_some()) {
                            vec!["xfs".to_string()]
                        } else {
                            vec![]
                        },
                        purpose: gpuq_blockdev::wipe::Purpose::Lease,
                    },
                )
                .map_err(|e| NodeError::Failed(e.to_string()))?;
                if report.result != gpuq_blockdev::report::NodeResult::Ok {
                    let msg = format!(
                        "device wipe failed: {}",
                        serde_json::to_string(&report).unwrap_or_default()
                    );
                    let _ = audit::append(&lease_dir, "wipe", "failed", &msg);
                    return Err(NodeError::Failed(msg));
                }
                remove_dir_within(&meta_dir, &lease_dir)?;
                format!(
                    "discarded {} device(s); removed {}",
                    report.devices.len(),
                    meta_dir.display()
                )
            }
            Plan::Test { dir } => {
                // Test mode may delete only below test_dir, and only this lease's directory.
                remove_dir_within(&dir, &self.cfg.node.node.test_dir)?;
                format!("removed {}", dir.display())
            }
        };
        // The lease's certificates go with its data (the audit stays).
        remove_server_certs(&lease_dir)?;
        audit::append(&lease_dir, "wipe", "ok", &detail).map_err(io("audit"))?;
        self.release_record()?;
        audit::append(&lease_dir, "release", "ok", "node lease record removed")
            .map_err(io("audit"))?;
        Ok(StepReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            already_done: false,
            detail,
        })
    }

    /// The server container's logs (stdout and stderr, in order).
    /// The lease's server output: from its container while it exists,
    /// afterwards from what `stop` kept (`<jobs_dir>/<lease>/server.log`).
    pub async fn logs(&self, lease: &str) -> Result<String, NodeError> {
        Self::check_lease(lease)?;
        let logs = match self
            .podman
            .container_logs(&server_name(lease), &gpuq_podman::LogOptions::default())
            .await
        {
            Err(e) if e.is_not_found() => {
                let kept = self.lease_dir(lease).join(SERVER_LOG);
                return match std::fs::read(&kept) {
                    Ok(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NodeError::Refused(
                        format!("no server output of lease {lease} on this node"),
                    )),
                    Err(e) => Err(io(format!("read {}", kept.display()))(e)),
                };
            }
            r => r?,
        };
        // Frames in the order Podman sent them: stdout and stderr interleaved.
        let bytes: Vec<u8> = logs
            .chunks
            .iter()
            .flat_map(|c| c.data.iter().copied())
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// How much of a server's output `output` answers with by default.
pub const OUTPUT_TAIL_DEFAULT: usize = 64 << 10;

impl<P: Podman> NodeService<P> {
    /// The end of the lease's server output (`gpuq daos-status --lease`):
    /// its last `tail` bytes (at most what is kept), starting at a line.
    pub async fn output(
        &self,
        lease: &str,
        tail: usize,
    ) -> Result<gpuq_protocol::node::ServerOutput, NodeError> {
        let all = self.logs(lease).await?;
        let tail = tail.min(SERVER_LOG_MAX);
        let (output, truncated) = if all.len() > tail {
            let mut start = all.len() - tail;
            while !all.is_char_boundary(start) {
                start += 1;
            }
            let cut = &all[start..];
            // From the next line's start (the first is likely cut).
            let from_line = cut.find('\n').map(|i| &cut[i + 1..]).unwrap_or(cut);
            (from_line.to_string(), true)
        } else {
            (all, false)
        };
        Ok(gpuq_protocol::node::ServerOutput {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            output,
            truncated,
        })
    }
}

/// The server's output kept by `stop` in the lease's directory.
pub const SERVER_LOG: &str = "server.log";
/// At most this much of a server's output is kept (its end)…
pub const SERVER_LOG_MAX: usize = 8 << 20;
/// …read from its last this many lines.
pub const SERVER_LOG_LINES: u64 = 100_000;
/// The server outputs of this many leases are kept; older ones go.
pub const SERVER_LOGS_KEPT: usize = 50;

impl<P: Podman> NodeService<P> {
    /// Write the stopped server container's output (its last
    /// [`SERVER_LOG_MAX`] bytes) to `<jobs_dir>/<lease>/server.log`, root
    /// 0600, durably, and drop the oldest beyond [`SERVER_LOGS_KEPT`]
    /// leases. Diagnostics only: a failure is said in the stop's detail and
    /// never fails the stop.
    async fn keep_output(&self, lease: &str, id: &str) -> String {
        // Its last lines only: a long-running server's whole output is
        // never read into memory (the bytes are cut to the limit below).
        let opts = gpuq_podman::LogOptions {
            tail: Some(SERVER_LOG_LINES),
            ..gpuq_podman::LogOptions::default()
        };
        let logs = match self.podman.container_logs(id, &opts).await {
            Ok(l) => l,
            Err(e) => return format!("; its output was not kept: {e}"),
        };
        let mut bytes: Vec<u8> = logs
            .chunks
            .iter()
            .flat_map(|c| c.data.iter().copied())
            .collect();
        if bytes.len() > SERVER_LOG_MAX {
            bytes.drain(..bytes.len() - SERVER_LOG_MAX);
        }
        let dir = self.lease_dir(lease);
        let path = dir.join(SERVER_LOG);
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| gpuq_durable::write_atomic(&path, &bytes, 0o600));
        if let Err(e) = written {
            return format!("; its output was not kept: {}: {e}", path.display());
        }
        prune_server_logs(self.jobs_dir(), SERVER_LOGS_KEPT);
        format!(
            "; {} bytes of output kept in {}",
            bytes.len(),
            path.display()
        )
    }
}

/// Remove the `server.log` of all but the newest `keep` leases under
/// `jobs_dir` (by modification time). Only those files: the lease
/// directories and their audit records stay.
fn prune_server_logs(jobs_dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(jobs_dir) else {
        return;
    };
    let mut logs: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().join(SERVER_LOG))
        .filter_map(|p| {
            let m = std::fs::symlink_metadata(&p).ok()?;
            (m.file_type().is_file()).then(|| (m.modified().ok(), p))
        })
        .filter_map(|(t, p)| Some((t?, p)))
        .collect();
    logs.sort();
    let excess = logs.len().saturating_sub(keep);
    for (_, p) in logs.into_iter().take(excess) {
        if let Err(e) = std::fs::remove_file(&p) {
            tracing::warn!("removing the old server output {}: {e}", p.display());
        }
    }
}

/// Where the server container sees its lease's certificates.
const CERTS_IN: &str = "/etc/daos/certs";

/// The lease's certificates for this node's server, in `<lease_dir>/certs/`
/// (0700 root): `daosCA.crt`, `server.crt` (0444), `server.key` (0400: DAOS
/// refuses more), `clients/agent.crt`. A directory left by an earlier start
/// of the same lease is replaced. The wipe removes it.
fn write_server_certs(lease_dir: &Path, tls: &ServerTls) -> Result<PathBuf, NodeError> {
    write_private_dir(
        lease_dir,
        "certs",
        &["clients"],
        &[
            ("daosCA.crt", &tls.ca_cert, 0o444),
            ("server.crt", &tls.cert, 0o444),
            ("server.key", &tls.key, 0o400),
            ("clients/agent.crt", &tls.agent_cert, 0o444),
        ],
    )
}

/// `<lease_dir>/<name>/` anew (an earlier one removed, never followed):
/// root 0700, with the 0700 `subdirs` and each (file, contents, mode)
/// written durably. The lease's certificates and the dmg node's access.
pub(crate) fn write_private_dir(
    lease_dir: &Path,
    name: &str,
    subdirs: &[&str],
    files: &[(&str, &str, u32)],
) -> Result<PathBuf, NodeError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = lease_dir.join(name);
    remove_dir_within(&dir, lease_dir)?;
    let mkdir = |d: &Path| {
        std::fs::create_dir(d)
            .and_then(|()| std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)))
            .map_err(io(format!("create {}", d.display())))
    };
    mkdir(&dir)?;
    for sub in subdirs {
        mkdir(&dir.join(sub))?;
    }
    for (file, body, mode) in files {
        gpuq_durable::write_atomic(&dir.join(file), body.as_bytes(), *mode)
            .map_err(io(format!("write {file}")))?;
    }
    Ok(dir)
}

/// Remove the lease's certificates (the server's, and the broker's dmg
/// access on its dmg node) from its (kept) lease directory.
fn remove_server_certs(lease_dir: &Path) -> Result<(), NodeError> {
    remove_dir_within(&lease_dir.join("certs"), lease_dir)?;
    remove_dir_within(&dmg::admin_dir(lease_dir), lease_dir)
}

/// The server container for `lease` under profile `p`.
fn server_spec(
    lease: &str,
    p: &Profile,
    config: &Path,
    data: &Path,
    certs: Option<&Path>,
) -> ContainerSpec {
    let mut spec = ContainerSpec::new(server_name(lease), p.image.clone());
    spec.labels = lease_labels(lease, Role::Server);
    spec.command = p.command.clone();
    spec.network = Namespace::Host;
    spec.stop_timeout = Some(p.stop_grace_secs as u32);
    let bind = |src: &Path, dst: &str, opts: &[&str]| Mount {
        kind: MountKind::Bind,
        source: src.display().to_string(),
        destination: dst.to_string(),
        options: opts.iter().map(|s| s.to_string()).collect(),
    };
    spec.mounts = vec![
        bind(config, "/etc/daos/daos_server.yml", &["ro"]),
        // Same path inside and out: the rendered config names host paths.
        bind(data, &data.display().to_string(), &["rw"]),
    ];
    if let Some(c) = certs {
        spec.mounts.push(bind(c, CERTS_IN, &["ro"]));
    }
    // Podman stops applying containers.conf's ulimits once a spec sets
    // any rlimit, so both are explicit.
    spec.rlimits = vec![
        Rlimit {
            kind: "nofile".into(),
            soft: 4096,
            hard: 4096,
        },
        Rlimit {
            kind: "nproc".into(),
            soft: 4096,
            hard: 4096,
        },
    ];
    if let Some(d) = &p.sim_faults_dir {
        // Test mode only (the profile refuses it otherwise): the simulator's
        // fault switches, re-read at each of its decisions.
        spec.mounts.push(bind(d, "/run/daos-sim", &["ro"]));
        spec.env.insert(
            "DAOS_SIM_FAULTS_FILE".into(),
            "/run/daos-sim/daos-sim-faults".into(),
        );
    }
    if p.mode == Mode::Physical {
        // daos.md "Server container": uio needs privileged; SPDK needs the
        // host's /dev (new nodes appear on rebinding), hugepages and the
        // host PID namespace (it deletes hugepage files of PIDs it cannot see).
        spec.privileged = true;
        spec.ipc = Namespace::Host;
        spec.pid = Namespace::Host;
        spec.cgroup = Namespace::Host;
        spec.mounts
            .push(bind(Path::new("/dev"), "/dev", &["rbind"]));
        spec.mounts.push(bind(
            Path::new("/dev/hugepages"),
            "/dev/hugepages",
            &["rbind"],
        ));
        spec.mounts
            .push(bind(Path::new("/lib/modules"), "/lib/modules", &["ro"]));
        spec.rlimits.push(Rlimit {
            kind: "memlock".into(),
            soft: u64::MAX,
            hard: u64::MAX,
        });
    }
    spec
}

/// Remove `dir` recursively, but only if it is a real directory (not a
/// symlink) directly inside `parent`. A missing `dir` is fine.
pub(crate) fn remove_dir_within(dir: &Path, parent: &Path) -> Result<(), NodeError> {
    if dir.parent() != Some(parent) {
        return Err(NodeError::Refused(format!(
            "refusing to remove {}: not directly inside {}",
            dir.display(),
            parent.display()
        )));
    }
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(format!("stat {}", dir.display()))(e)),
        Ok(m) if !m.file_type().is_dir() => Err(NodeError::Refused(format!(
            "refusing to remove {}: not a directory",
            dir.display()
        ))),
        Ok(_) => std::fs::remove_dir_all(dir).map_err(io(format!("remove {}", dir.display()))),
    }
}

/// `line` is DAOS's "<SCM|Metadata> format required on instance <engine>"
/// (whatever precedes it: a log prefix; whatever follows: not a digit).
fn says_format_required(line: &str, engine: usize) -> bool {
    let needle = format!("format required on instance {engine}");
    line.match_indices(&needle).any(|(at, _)| {
        !line[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_newest_server_outputs_are_kept_and_nothing_else_goes() {
        let jobs = tempfile::tempdir().unwrap();
        for (i, lease) in ["L1", "L2", "L3"].iter().enumerate() {
            let d = jobs.path().join(lease);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join(super::SERVER_LOG), lease).unwrap();
            std::fs::write(d.join("audit.jsonl"), "{}").unwrap();
            let t =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(d.join(super::SERVER_LOG))
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        super::prune_server_logs(jobs.path(), 2);
        assert!(!jobs.path().join("L1").join(super::SERVER_LOG).exists());
        assert!(jobs.path().join("L2").join(super::SERVER_LOG).exists());
        assert!(jobs.path().join("L3").join(super::SERVER_LOG).exists());
        assert!(jobs.path().join("L1/audit.jsonl").exists(), "audits stay");
    }

    use super::*;

    #[test]
    fn daos_format_required_lines_are_recognised_per_engine() {
        assert!(says_format_required("SCM format required on instance 0", 0));
        assert!(says_format_required(
            "daos_server INFO 2026/12/02 10:00:00 Metadata format required on instance 1",
            1
        ));
        assert!(says_format_required(
            "daos-sim: SCM format required on instance 0; awaiting storage format",
            0
        ));
        assert!(!says_format_required(
            "SCM format required on instance 10",
            1
        ));
        assert!(!says_format_required(
            "SCM format required on instance 1",
            0
        ));
        assert!(!says_format_required("superblock found: rejoining", 0));
    }

    fn profile(mode: Mode) -> Profile {
        let cfg = format!(
            "[node]\nname = \"da1\"\nsocket = \"/run/gpuq/node.sock\"\npodman_socket = \"/run/podman/podman.sock\"\n\
             jobs_dir = \"/var/lib/gpuqueue-daos/jobs\"\ntest_dir = \"/var/lib/gpuqueue-daos-test\"\n\
             [profiles.p]\nimage = \"sha256:{}\"\ndaos_version = \"2.6.4\"\nmode = \"{}\"\nport = 10001\n",
            "ab".repeat(32),
            if mode == Mode::Physical { "physical" } else { "test" }
        );
        crate::profile::ServiceConfig::parse(Path::new("/etc/gpuqueue-daos/node.toml"), &cfg)
            .unwrap()
            .profiles["p"]
            .clone()
    }

    // What the helper asks Podman for (the request, not Podman's behaviour:
    // a physical-mode start cannot run on the build machines, which refuse
    // an unlimited memlock and have no NVMe outside the VM).
    #[test]
    fn physical_mode_asks_for_what_spdk_needs() {
        let s = server_spec(
            "L1",
            &profile(Mode::Physical),
            Path::new("/j/L1/daos_server.yml"),
            Path::new("/j/L1/control_meta"),
            None,
        );
        assert!(s.privileged);
        assert_eq!(
            (s.network, s.ipc, s.pid, s.cgroup),
            (
                Namespace::Host,
                Namespace::Host,
                Namespace::Host,
                Namespace::Host
            )
        );
        let m: Vec<(&str, &str, Vec<&str>)> = s
            .mounts
            .iter()
            .map(|m| {
                (
                    m.source.as_str(),
                    m.destination.as_str(),
                    m.options.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert!(m.contains(&("/dev", "/dev", vec!["rbind"])), "{m:?}");
        assert!(
            m.contains(&("/dev/hugepages", "/dev/hugepages", vec!["rbind"])),
            "{m:?}"
        );
        assert!(
            m.contains(&("/lib/modules", "/lib/modules", vec!["ro"])),
            "{m:?}"
        );
        assert!(
            m.contains(&(
                "/j/L1/daos_server.yml",
                "/etc/daos/daos_server.yml",
                vec!["ro"]
            )),
            "{m:?}"
        );
        assert!(s
            .rlimits
            .iter()
            .any(|r| r.kind == "memlock" && r.soft == u64::MAX && r.hard == u64::MAX));
        assert_eq!(s.labels.get(LABEL_ROLE).map(String::as_str), Some("server"));
    }

    #[test]
    fn test_mode_gets_no_host_dev_and_no_privileges() {
        let s = server_spec(
            "L1",
            &profile(Mode::Test),
            Path::new("/j/L1/daos_server.yml"),
            Path::new("/t/L1"),
            None,
        );
        assert!(!s.privileged);
        assert_eq!(
            s.network,
            Namespace::Host,
            "the node's own network namespace"
        );
        assert!(s
            .mounts
            .iter()
            .all(|m| !m.source.starts_with("/dev") && m.source != "/lib/modules"));
        assert!(s.rlimits.iter().all(|r| r.kind != "memlock"));
    }
}
