//! The node helper's API (`gpuq-node serve`), spoken by the broker through
//! an SSH-forwarded unix socket. Nothing here may assume the caller is local.
//!
//! Routes: `GET /v1/status`, `POST /v1/preflight`,
//! `POST /v1/leases/{lease}/start`, `POST /v1/leases/{lease}/stop`,
//! `POST /v1/leases/{lease}/wipe`, `POST /v1/leases/{lease}/dmg`,
//! `GET /v1/leases/{lease}/logs`, `GET /v1/install`, `GET /v1/metrics`;
//! on a GPU host's helper `POST /v1/clients/{lease}/files` and
//! `POST /v1/clients/{lease}/{step}` ([`ClientStep`]).

use serde::{Deserialize, Serialize};

/// A lease name: 1–64 of `[A-Za-z0-9_-]`, not starting with `-`. It becomes
/// a directory name and a container label, so nothing else is accepted.
pub fn valid_lease(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The node-side lease record (`<state_dir>/lease.json`). Written durably
/// by `start` before anything of the lease exists; the wipe decides from it
/// alone (never from the profile as configured now), so it carries the wipe
/// mode and, in physical mode, exactly the devices the lease was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    pub lease: String,
    pub profile: String,
    /// `starting`, `running`, `stopped`, `wiping`.
    pub phase: String,
    pub metadata_dir: String,
    pub container: Option<String>,
    pub since: i64,
    /// How the lease's data is wiped, fixed at start. `None`: a record of an
    /// older helper (or a bare `active-lease`), which the wipe refuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LeaseMode>,
    /// Physical mode: the block devices the lease was given, as found at
    /// start. The wipe discards exactly these, and only while the node's
    /// allowlist still names exactly these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<LeaseDevice>,
    /// `--stor nvmeof`: the kernel NVMe target objects of the lease on this
    /// node, recorded **before** any of them is made (so a crash between
    /// the record and the last `mkdir` leaves something `unexport` finds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<NvmetExport>,
    /// `--stor nfsrdma`: the filesystems, mounts and NFS exports of the
    /// lease on this node, recorded **before** the first is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfs: Option<NfsExport>,
}

/// One lease's NFS export on one node: an XFS on each allowlisted
/// namespace, mounted under a read-only pseudo-root (a tmpfs of the
/// lease's), served by the node's kernel NFS server (NFSv4.2) to the
/// lease's client address alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsExport {
    /// `tcp` or `rdma` (the listeners the node made).
    pub transport: String,
    /// The node's storage address and the NFS port (2049; RDMA: 20049).
    pub address: String,
    pub port: u16,
    /// The one client address the export admits (the job's host).
    pub client_address: String,
    /// The job owner: each filesystem's root is theirs, mode 0700.
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// The pseudo-root (NFSv4 `/`, fsid 0): a tmpfs mounted here.
    pub root: String,
    pub volumes: Vec<NfsVolume>,
}

/// One exported filesystem: `/<name>` under the pseudo-root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsVolume {
    /// The export's name (the client mounts `<address>:/<name>`).
    pub name: String,
    /// Its NFS fsid (1, 2, … in allowlist order; 0 is the pseudo-root).
    pub fsid: u32,
    /// The node's device (`/dev/nvmeXnY`) as found at export.
    pub device_path: String,
    /// Its device number (`major:minor`) as preflight found it: what the
    /// mount is checked against.
    pub devnum: String,
    pub device: LeaseDevice,
}

/// `POST /v1/leases/{lease}/nfs-export` (`--stor nfsrdma`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsExportRequest {
    /// The node's `[stor.NAME]`.
    pub profile: String,
    /// The job's host address, the only client admitted.
    pub client_address: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
}

/// What a node exported for `--stor nfsrdma`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsExportReport {
    pub node: String,
    pub lease: String,
    pub nfs: NfsExport,
}

/// The configfs objects (`/sys/kernel/config/nvmet`) of one lease's export
/// on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmetExport {
    /// `subsystems/<NQN>`: [`nvmeof_subsystem_nqn`].
    pub subsystem_nqn: String,
    /// `hosts/<NQN>` and the subsystem's only `allowed_hosts` link.
    pub host_nqn: String,
    /// `ports/<ID>`.
    pub port_id: u16,
    pub transport: String,
    pub address: String,
    pub port: u16,
    /// The namespaces, `namespaces/<NSID>` (1, 2, … in allowlist order),
    /// each with the device it exports.
    pub namespaces: Vec<ExportedNamespace>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedNamespace {
    /// The NSID in the exported subsystem.
    pub nsid: u32,
    /// The node's device (`/dev/nvmeXnY`) as found at export.
    pub device_path: String,
    /// Its device number (`major:minor`) as preflight found it: what the
    /// export checks the path against (empty in an older record).
    #[serde(default)]
    pub devnum: String,
    /// The node's namespace behind it, as the allowlist names it.
    pub device: LeaseDevice,
}

/// The prefix of every NQN gpuq makes (subsystems and hosts).
pub const NQN_PREFIX: &str = "nqn.2026-12.io.gpuq:";

/// The subsystem a node exports for `lease`: named for the lease and the
/// node, so that several nodes sharing one kernel (a test VM) tell theirs
/// apart and a node tells a foreign subsystem from the lease's own.
pub fn nvmeof_subsystem_nqn(lease: &str, node: &str) -> String {
    format!("{NQN_PREFIX}{lease}:{node}")
}

/// The host NQN of a lease's connection: random per lease (the broker
/// makes `token`, 32 lowercase hex digits, and sends it only to the
/// nodes): the subsystems admit this host alone, and nothing a user can
/// learn names it.
pub fn nvmeof_host_nqn(token: &str) -> Option<String> {
    (token.len() == 32
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| format!("{NQN_PREFIX}host:{token}"))
}

/// `POST /v1/leases/{lease}/export` (`--stor nvmeof`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRequest {
    /// The node's `[stor.NAME]`.
    pub profile: String,
    /// The lease's host token ([`nvmeof_host_nqn`]).
    pub host_token: String,
}

/// What a node exported: where the lease's host connects, and what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportReport {
    pub node: String,
    pub lease: String,
    pub export: NvmetExport,
}

/// A lease's wipe mode, as its node record spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseMode {
    /// Real NVMe: the wipe discards the recorded devices.
    Physical,
    /// File bdevs under the test dir: the wipe removes that directory.
    Test,
    /// Anything else a record may say; the wipe refuses it.
    #[serde(other)]
    Unknown,
}

impl LeaseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Physical => "physical",
            LeaseMode::Test => "test",
            LeaseMode::Unknown => "unknown",
        }
    }
}

/// One block device of a physical-mode lease: how the allowlist identifies
/// it (serial + PCI address of an NVMe controller, or a test loop device's
/// backing file) and what was found at start (namespace ID, size, model).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseDevice {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loop_backing_file: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OurContainer {
    pub id: String,
    pub name: String,
    pub lease: String,
    pub role: String,
    pub state: String,
    pub image: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinStatus {
    pub profile: String,
    pub image: String,
    pub present: bool,
}

/// `GET /v1/status`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    pub helper_version: String,
    pub podman_api_version: String,
    pub lease: Option<NodeLease>,
    pub containers: Vec<OurContainer>,
    pub images: Vec<String>,
    pub pins: Vec<PinStatus>,
    /// What this node's kernel offers kernel storage jobs (`--stor`);
    /// absent from a helper older than the report.
    #[serde(default)]
    pub kernel: Option<StorKernel>,
    /// What the node's operator accepted against the default, one line
    /// each (NFS over RDMA with AUTH_SYS); absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_risks: Vec<String>,
}

/// What the running kernel of a node offers each `--stor` kind, from its
/// `modules.dep`, `modules.builtin` and `/sys/module` (read, never loaded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorKernel {
    /// `/proc/sys/kernel/osrelease`.
    pub release: String,
    /// `--stor nvmeof`: the NVMe target (`nvmet`) and a transport for it
    /// (`nvmet_tcp` or `nvmet_rdma`).
    pub nvmeof_target: Support,
    /// `--stor nfsrdma`: the NFS server (`nfsd`) and XFS.
    pub nfs_server: Support,
    /// `--stor lustre`: LNet, PtlRPC, the MGS, MDT and OST servers and an
    /// OSD backend (ldiskfs or ZFS). No Debian kernel ships them.
    pub lustre_server: Support,
}

impl StorKernel {
    /// What `kind` needs of this kernel.
    pub fn support(&self, kind: StorKind) -> &Support {
        match kind {
            StorKind::Nvmeof => &self.nvmeof_target,
            StorKind::Nfsrdma => &self.nfs_server,
            StorKind::Lustre => &self.lustre_server,
        }
    }
}

/// A kernel storage kind (`gpuq submit --stor KIND`; mission.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorKind {
    Lustre,
    Nfsrdma,
    Nvmeof,
}

impl StorKind {
    pub const ALL: [StorKind; 3] = [StorKind::Lustre, StorKind::Nfsrdma, StorKind::Nvmeof];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            StorKind::Lustre => "lustre",
            StorKind::Nfsrdma => "nfsrdma",
            StorKind::Nvmeof => "nvmeof",
        }
    }

    pub fn parse(s: &str) -> Option<StorKind> {
        StorKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// Whether a kind is available, and if not what is missing (one line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Support {
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

/// `POST /v1/preflight`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreflightRequest {
    pub lease: String,
    pub profile: String,
}

/// One reason a node is not ready for a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// `foreign_engine`, `foreign_container`, `foreign_lease`, `port_in_use`,
    /// `image_missing`, `device_refused`, `check_failed`.
    pub reason: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightReport {
    pub node: String,
    pub lease: String,
    pub ok: bool,
    pub findings: Vec<Finding>,
}

/// `POST /v1/leases/{lease}/start`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    pub profile: String,
    /// Host names of the management-service replicas (1 or 3).
    pub replicas: Vec<String>,
    /// The lease's certificates for this node's server (the control port
    /// then requires mutual TLS). Absent: `allow_insecure: true`, accepted
    /// for test-mode profiles only; a physical start without them is
    /// refused (gpuq's own broker always sends them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
    /// Sent to one node of the lease only (the broker's `dmg` node): what
    /// its server container needs to run the broker's allowlisted `dmg`
    /// commands ([`DmgCommand`]) for this lease. Needs `tls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dmg: Option<DmgAccess>,
}

/// What `dmg` needs on the node that runs it for the broker: the lease's
/// control configuration (system name, every server's address) and its
/// admin certificate and key. Written to `<lease_dir>/admin/` (0700 root),
/// mounted read-only into that node's server container only, removed by
/// the wipe.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DmgAccess {
    /// The DAOS system name (`name:` of the control config).
    pub system: String,
    /// Every server's address, in node order (`hostlist:`).
    pub hostlist: Vec<String>,
    /// `admin.crt`.
    pub admin_cert: String,
    /// `admin.key`.
    pub admin_key: String,
}

impl std::fmt::Debug for DmgAccess {
    // Never print the key (logs, panics).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DmgAccess {{ system: {:?}, hostlist: {:?}, admin_cert, admin_key: <private> }}",
            self.system, self.hostlist
        )
    }
}

/// The `dmg` commands a node runs for the broker, and nothing else: a
/// request names one of these, never an argument list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DmgCommand {
    /// `dmg system query` (the format and join polls).
    SystemQuery,
    /// `dmg storage format`.
    StorageFormat,
    /// `dmg system stop`.
    SystemStop,
    /// `dmg system stop --force`.
    SystemStopForce,
}

impl DmgCommand {
    /// The arguments after `dmg -o CONFIG -j`.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            DmgCommand::SystemQuery => &["system", "query"],
            DmgCommand::StorageFormat => &["storage", "format"],
            DmgCommand::SystemStop => &["system", "stop"],
            DmgCommand::SystemStopForce => &["system", "stop", "--force"],
        }
    }
}

/// `POST /v1/leases/{lease}/dmg`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DmgRequest {
    pub command: DmgCommand,
    /// How long the node lets the command run (1..=3600 s): the broker's
    /// deadline for this step.
    pub within_secs: u64,
}

/// What `dmg -j` printed in the lease's server container, and its exit
/// status: the broker reads the JSON envelope from `stdout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmgReply {
    pub node: String,
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// What a node's server needs of its lease's certificates (PEM). The
/// lease's CA key is not among them: it never leaves the broker's memory.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// `daosCA.crt`.
    pub ca_cert: String,
    /// `server.crt`.
    pub cert: String,
    /// `server.key`.
    pub key: String,
    /// `agent.crt`, for `client_cert_dir`.
    pub agent_cert: String,
}

impl std::fmt::Debug for ServerTls {
    // Never print the key (logs, panics).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls { ca_cert, cert, key: <private>, agent_cert }")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartReport {
    pub node: String,
    pub lease: String,
    pub container: String,
    pub metadata_dir: String,
    pub config_path: String,
    /// Every engine of the server said "format required" (its log line)
    /// before the node answered. Absent from an older helper: false.
    #[serde(default)]
    pub awaiting_format: bool,
}

/// The lease's certificates a GPU host's client side gets (PEM): the CA's,
/// the job owner's admin pair, the agent's pair. Never the CA's key or
/// the servers' pair.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// `daosCA.crt`.
    pub ca_cert: String,
    /// `admin.crt`, `admin.key`: the job owner's.
    pub admin_cert: String,
    pub admin_key: String,
    /// `agent.crt`, `agent.key`: the lease's agent's.
    pub agent_cert: String,
    pub agent_key: String,
}

impl std::fmt::Debug for ClientTls {
    // Never print the keys (logs, panics).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls { ca_cert, admin_cert, admin_key: <private>, agent_cert, agent_key: <private> }")
    }
}

/// `POST /v1/clients/{lease}/files` on a GPU host's helper (a Slurm job
/// placed on that host): write the lease's client files under the
/// helper's `[client] run_dir`, the admin pair for `owner_uid` alone.
/// The image of the agent and client containers is the helper's own
/// profile's, never the request's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientFilesRequest {
    pub profile: String,
    /// The job's owner: never 0.
    pub owner_uid: u32,
    /// The DAOS system name (`name:`).
    pub system: String,
    /// The servers' control port.
    pub port: u16,
    /// Every server's address, in node order (`hostlist:`).
    pub hostlist: Vec<String>,
    /// The management-service replicas (the agent's access points).
    pub access_points: Vec<String>,
    pub tls: ClientTls,
}

/// The other steps of a GPU host's client side, each
/// `POST /v1/clients/{lease}/{step}` with a [`ClientStepRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientStep {
    /// Start the lease's agent and wait for its socket.
    StartAgent,
    /// Remove the lease's client (`daos-exec`) containers.
    RemoveClients,
    /// SIGTERM the agent, confirmed by its process leaving.
    StopAgent,
    /// Remove the stopped agent's container.
    RemoveAgent,
    /// Remove `<run_dir>/<lease>/`.
    RemoveFiles,
}

impl ClientStep {
    pub const ALL: [ClientStep; 5] = [
        ClientStep::StartAgent,
        ClientStep::RemoveClients,
        ClientStep::StopAgent,
        ClientStep::RemoveAgent,
        ClientStep::RemoveFiles,
    ];

    /// The step's path segment.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientStep::StartAgent => "start-agent",
            ClientStep::RemoveClients => "remove-clients",
            ClientStep::StopAgent => "stop-agent",
            ClientStep::RemoveAgent => "remove-agent",
            ClientStep::RemoveFiles => "remove-files",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// The body of every [`ClientStep`]: the lease's profile (its image).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientStepRequest {
    pub profile: String,
}

/// `POST /v1/leases/{lease}/stop` and `/wipe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReport {
    pub node: String,
    pub lease: String,
    /// True when there was nothing left to do (idempotent repeat).
    pub already_done: bool,
    pub detail: String,
}

/// `GET /v1/activate` on the broker: the whole site's activation plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SitePlan {
    /// Why the queue is not idle now (a job running, a lease, a hold), if
    /// it is not: an activation would refuse until it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_idle: Option<String>,
    /// Every configured node, in configuration order.
    pub nodes: Vec<NodePlan>,
}

/// One node's plan, or why it has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlan {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<ActivationPlan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl SitePlan {
    /// What an activation would refuse for, as lines; empty: it would
    /// proceed.
    pub fn refusals(&self) -> Vec<String> {
        let mut out: Vec<String> = self.not_idle.iter().cloned().collect();
        for n in &self.nodes {
            match (&n.plan, &n.error) {
                (_, Some(e)) => out.push(format!("{}: {e}", n.node)),
                (None, None) => out.push(format!("{}: no plan", n.node)),
                (Some(p), None) => {
                    out.extend(p.refusals.iter().map(|s| format!("{}: {s}", n.node)))
                }
            }
        }
        out
    }
}

/// `GET /v1/activation/plan`: what an activation would find and do on this
/// node (`gpuq activate` without `--execute`). Read-only: computing it
/// changes nothing on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivationPlan {
    pub node: String,
    /// Profiles of this node in physical mode (the ones activation is for).
    pub physical_profiles: Vec<String>,
    /// Every allowlisted device as the read-only checks see it now.
    pub devices: Vec<PlanDevice>,
    /// Why the devices could not be inspected at all, if they could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices_error: Option<String>,
    /// The pre-existing DAOS services the node's `[activation] units` names.
    pub units: Vec<PlanUnit>,
    /// DAOS processes running on the node now that are not gpuq's.
    pub foreign_processes: Vec<String>,
    /// What `--execute` would do here, in order.
    pub steps: Vec<String>,
    /// The node's claim record, if an activation wrote one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
    /// The steps of those it would refuse at now (a unit systemd could not
    /// be asked about, devices that cannot be inspected, a device another
    /// check than its signature refuses); empty: it would proceed here.
    pub refusals: Vec<String>,
    /// What the node's operator accepted against the default, one line
    /// each (as in its status); absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_risks: Vec<String>,
}

/// One allowlisted device in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDevice {
    /// The allowlist entry, as configured.
    pub entry: String,
    /// The device it resolved to (`/dev/nvme0n1`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Serial, model, PCI address, nsid as seen on the system.
    pub identity: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Signatures libblkid finds on it now (`ext4`, `xfs`, a partition table).
    pub signatures: Vec<String>,
    /// Every read-only check: what an activation would refuse besides the
    /// signatures it expects.
    pub checks: Vec<PlanCheck>,
}

/// One read-only check of a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanCheck {
    pub check: String,
    /// `pass`, `refuse` or `unknown`.
    pub verdict: String,
    pub detail: String,
}

/// A systemd unit named in `[activation] units`, as systemd reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanUnit {
    pub unit: String,
    /// `loaded`, `not-found`, …; empty when systemd could not be asked.
    pub load_state: String,
    /// `active`, `inactive`, `failed`, …
    pub active_state: String,
    /// `enabled`, `disabled`, …
    pub unit_file_state: String,
    /// 0 when none.
    pub main_pid: u32,
    /// Why systemd could not be asked, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `POST /v1/activation/execute` on a node: activate it for `activation`
/// (`gpuq activate --execute --destroy-existing-data`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivationRequest {
    /// The activation's name: its audit records go to
    /// `<jobs_dir>/<activation>/` (a valid lease name).
    pub activation: String,
}

/// `<jobs_dir>/claim.json`: the devices an activation discarded and gpuq
/// now owns on this node. Physical mode starts and wipes only devices named
/// here (a device is the same when its serial, namespace ID and loop
/// backing file are). Written durably after the activation's discard
/// succeeded on every allowlisted device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub version: u32,
    pub node: String,
    /// The activation that claimed them (its audit directory).
    pub activation: String,
    /// RFC 3339, UTC.
    pub claimed_at: String,
    pub devices: Vec<LeaseDevice>,
}

impl Claim {
    /// Whether the claim names exactly `found` (an activation has nothing
    /// left to do on the node).
    pub fn is_exactly(&self, found: &[LeaseDevice]) -> bool {
        self.devices.len() == found.len() && found.iter().all(|d| self.covers(d))
    }

    /// Whether `d` is one of the claimed devices.
    pub fn covers(&self, d: &LeaseDevice) -> bool {
        self.devices.iter().any(|c| {
            c.serial == d.serial && c.nsid == d.nsid && c.loop_backing_file == d.loop_backing_file
        })
    }
}

/// What one node's activation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivationReport {
    pub node: String,
    pub activation: String,
    /// True when the node was already claimed for exactly its allowlisted
    /// devices: nothing was stopped, discarded or written this time.
    pub already_claimed: bool,
    /// What was done, in order, as an operator reads it.
    pub done: Vec<String>,
    pub claim: Claim,
}

/// `POST /v1/activate` on the broker: the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActivateRequest {
    /// Must be true: the operator said `--destroy-existing-data`.
    pub destroy_existing_data: bool,
}

/// `POST /v1/activate` on the broker: every node's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteActivation {
    pub activation: String,
    pub nodes: Vec<NodeActivation>,
    /// Why the site stays held (`activating`), if it does; `None`: every
    /// node is claimed and the hold is released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

/// One node's activation, or why it did not complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeActivation {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<ActivationReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/leases/{lease}/output?tail=BYTES` on a node: the end of the
/// lease's server output (from its container while it exists, then what
/// `stop` kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerOutput {
    pub node: String,
    pub lease: String,
    /// Its last `tail` bytes (from a line start), lossily UTF-8.
    pub output: String,
    /// True when earlier output was left out.
    pub truncated: bool,
}

/// `GET /v1/daos/output/{lease}` on the broker: every node's
/// [`ServerOutput`] of the lease, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOutput {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<ServerOutput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/leases/{lease}/evidence?profile=NAME` on a node: what is left
/// of a released lease there (`gpuq e2e`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseEvidence {
    pub node: String,
    pub lease: String,
    /// `physical` or `test` (the profile's mode on this node).
    pub mode: String,
    pub checks: Vec<EvidenceCheck>,
}

/// One check of `gpuq e2e`, with what it found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceCheck {
    pub check: String,
    pub ok: bool,
    pub detail: String,
}

/// `GET /v1/e2e/lease/{lease}` or `/v1/e2e/job/{id}` on the broker (root):
/// the lease's evidence on this host and on every node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct E2eReport {
    pub lease: String,
    pub profile: String,
    /// The lease's record says it is released.
    pub released: bool,
    /// This host (cxl2): the lease record, the pointer, containers.
    pub host: Vec<EvidenceCheck>,
    pub nodes: Vec<NodeEvidence>,
}

/// One node's evidence, or why there is none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvidence {
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<LeaseEvidence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl E2eReport {
    /// Every check on every host passed, and every node answered.
    pub fn ok(&self) -> bool {
        self.host.iter().all(|c| c.ok)
            && self.nodes.iter().all(|n| {
                n.error.is_none()
                    && n.evidence
                        .as_ref()
                        .is_some_and(|e| e.checks.iter().all(|c| c.ok))
            })
    }
}

/// `GET /v1/e2e` on the broker (root): what `gpuq e2e` needs before it
/// submits its job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct E2eStart {
    /// The maintenance lock, if held (`gpuq e2e` runs only under it).
    pub locked: bool,
    /// The `[daos.profiles]` names.
    pub profiles: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_host_s_udev_rule_names_the_lease_nqn_prefix() {
        // systemd/59-gpuq-lease-devices.rules matches a lease's NVMe-oF
        // namespaces by it: the two must not drift apart.
        let rule = include_str!("../../../systemd/59-gpuq-lease-devices.rules");
        assert!(
            rule.contains(&format!("ATTRS{{subsysnqn}}==\"{NQN_PREFIX}*\"")),
            "{rule}"
        );
    }

    fn record(extra: &str) -> NodeLease {
        serde_json::from_str(&format!(
            r#"{{"lease":"L1","profile":"inst1","phase":"running","metadata_dir":"/t/L1","container":null,"since":1{extra}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_record_of_an_older_helper_has_no_mode() {
        let r = record("");
        assert_eq!((r.mode, r.devices.len()), (None, 0));
    }

    #[test]
    fn an_unknown_mode_is_read_as_unknown_not_as_an_error() {
        assert_eq!(record(r#","mode":"tape""#).mode, Some(LeaseMode::Unknown));
        assert_eq!(record(r#","mode":"test""#).mode, Some(LeaseMode::Test));
    }

    #[test]
    fn the_device_set_round_trips() {
        let mut r = record(r#","mode":"physical""#);
        r.devices = vec![LeaseDevice {
            serial: Some("S1".into()),
            pci: Some("0000:5e:00.0".into()),
            nsid: Some(1),
            model: None,
            size_bytes: 4096,
            loop_backing_file: None,
        }];
        let back: NodeLease = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_dmg_request_names_one_allowlisted_command_and_nothing_else() {
        let r: DmgRequest =
            serde_json::from_str(r#"{"command":"system_stop_force","within_secs":600}"#).unwrap();
        assert_eq!(r.command.args(), ["system", "stop", "--force"]);
        for bad in [
            r#"{"command":"pool destroy","within_secs":5}"#,
            r#"{"command":["system","query"],"within_secs":5}"#,
            r#"{"command":"system_query","within_secs":5,"args":["-o","/x"]}"#,
            r#"{"command":"system_query"}"#,
        ] {
            assert!(serde_json::from_str::<DmgRequest>(bad).is_err(), "{bad}");
        }
        let a = DmgAccess {
            system: "daos_server".into(),
            hostlist: vec!["10.0.0.1".into()],
            admin_cert: "CERT".into(),
            admin_key: "SECRET-KEY".into(),
        };
        assert!(!format!("{a:?}").contains("SECRET-KEY"));
    }
}
