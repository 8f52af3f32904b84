//! Typed requests and replies.
//!
//! Replies deserialize leniently: only the fields gpuq uses, unknown fields
//! ignored, missing or `null` fields defaulted. That is how long-lived libpod
//! clients survive Podman 4.3 → 5.x, whose replies grow fields every release.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Map, Value};

use crate::image_id::ImageId;

/// Label naming the lease a container belongs to.
pub const LABEL_LEASE: &str = "io.gpuq.lease";
/// Label naming the container's role; values from [`Role`].
pub const LABEL_ROLE: &str = "io.gpuq.role";

/// The role of one of our containers (the value of [`LABEL_ROLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A DAOS server (engines + control plane).
    Server,
    /// A DAOS agent.
    Agent,
    /// A user's client container (`daos-exec`).
    Client,
    /// An admin container (`dmg`).
    Admin,
    /// A node's one-shot `mkfs.xfs` of a `--stor nfsrdma` lease.
    Mkfs,
}

impl Role {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Agent => "agent",
            Role::Client => "client",
            Role::Admin => "admin",
            Role::Mkfs => "mkfs",
        }
    }

    /// Parses a label value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "server" => Some(Role::Server),
            "agent" => Some(Role::Agent),
            "client" => Some(Role::Client),
            "admin" => Some(Role::Admin),
            "mkfs" => Some(Role::Mkfs),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The labels every container of a lease carries.
pub fn lease_labels(lease: &str, role: Role) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_LEASE.to_owned(), lease.to_owned()),
        (LABEL_ROLE.to_owned(), role.as_str().to_owned()),
    ])
}

/// A container list filter: every condition must hold (Podman ANDs label
/// filters). An empty filter matches every container on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelFilter {
    conditions: Vec<String>,
}

impl LabelFilter {
    /// No condition.
    pub fn new() -> Self {
        Self::default()
    }

    /// Containers of a lease, any role.
    pub fn lease(lease: &str) -> Self {
        Self::new().eq(LABEL_LEASE, lease)
    }

    /// Every container gpuq made (any lease).
    pub fn ours() -> Self {
        Self::new().has(LABEL_LEASE)
    }

    /// Label `key` equals `value`.
    pub fn eq(mut self, key: &str, value: &str) -> Self {
        self.conditions.push(format!("{key}={value}"));
        self
    }

    /// Label `key` is present, any value.
    pub fn has(mut self, key: &str) -> Self {
        self.conditions.push(key.to_owned());
        self
    }

    /// The conditions in Podman's `key[=value]` form.
    pub fn conditions(&self) -> &[String] {
        &self.conditions
    }
}

/// A namespace choice for a new container.
///
/// For the network, `Default` and `Private` mean Podman's default network:
/// on rootful Podman a bridge (CNI or netavark) that creates a host
/// interface (`cni-podman0`/`podman0`), iptables chains and enables
/// `ip_forward` on the node. gpuq's containers use `Host` (DAOS) and
/// otherwise `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Namespace {
    /// Podman's default (a private namespace; see above for the network).
    #[default]
    Default,
    /// Share the host's (the node's) namespace.
    Host,
    /// A new private namespace.
    Private,
    /// Network only: a namespace with loopback only.
    None,
}

impl Namespace {
    fn to_json(self) -> Option<Value> {
        let mode = match self {
            Namespace::Default => return None,
            Namespace::Host => "host",
            Namespace::Private => "private",
            Namespace::None => "none",
        };
        Some(json!({ "nsmode": mode }))
    }
}

/// A mount for a new container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `bind` or `tmpfs`.
    pub kind: MountKind,
    /// Host path (bind) — ignored for tmpfs.
    pub source: String,
    /// Path in the container.
    pub destination: String,
    /// Mount options, e.g. `ro`, `rbind`, `size=64m`.
    pub options: Vec<String>,
}

/// The kind of a [`Mount`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountKind {
    /// A bind mount of a host path.
    Bind,
    /// A fresh tmpfs.
    Tmpfs,
}

impl Mount {
    /// A read-write bind mount.
    pub fn bind(source: impl Into<String>, destination: impl Into<String>) -> Self {
        Self {
            kind: MountKind::Bind,
            source: source.into(),
            destination: destination.into(),
            options: vec!["bind".to_owned()],
        }
    }

    /// A recursive bind mount (submounts included), e.g. the host `/dev`.
    pub fn rbind(source: impl Into<String>, destination: impl Into<String>) -> Self {
        Self {
            options: vec!["rbind".to_owned()],
            ..Self::bind(source, destination)
        }
    }

    /// A tmpfs at `destination`.
    pub fn tmpfs(destination: impl Into<String>) -> Self {
        Self {
            kind: MountKind::Tmpfs,
            source: "tmpfs".to_owned(),
            destination: destination.into(),
            options: Vec::new(),
        }
    }

    /// Makes the mount read-only.
    pub fn read_only(mut self) -> Self {
        self.options.push("ro".to_owned());
        self
    }

    fn to_json(&self) -> Value {
        json!({
            "type": match self.kind { MountKind::Bind => "bind", MountKind::Tmpfs => "tmpfs" },
            "source": self.source,
            "destination": self.destination,
            "options": self.options,
        })
    }
}

/// A resource limit for the container's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rlimit {
    /// Lower-case name without `RLIMIT_`: `nofile`, `memlock`, `nproc`.
    pub kind: String,
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

impl Rlimit {
    /// `RLIM_INFINITY` in the OCI runtime spec.
    pub const UNLIMITED: u64 = u64::MAX;

    /// Soft = hard = `value`.
    pub fn new(kind: &str, value: u64) -> Self {
        Self {
            kind: kind.to_owned(),
            soft: value,
            hard: value,
        }
    }
}

/// What to create. Built in code by the node helper from its configuration;
/// every field maps to one field of libpod's `SpecGenerator`.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Container name (unique per node).
    pub name: String,
    /// The image, by full ID only.
    pub image: ImageId,
    /// Command (arguments to the entrypoint); empty = the image's.
    pub command: Vec<String>,
    /// Replaces the image's entrypoint when set.
    pub entrypoint: Option<Vec<String>>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Labels; use [`lease_labels`].
    pub labels: BTreeMap<String, String>,
    /// `UID:GID` (numeric) or a user name from the image.
    pub user: Option<String>,
    /// Supplementary groups (numeric GIDs) of the container's processes,
    /// exec sessions included.
    pub groups: Vec<String>,
    /// Working directory.
    pub work_dir: Option<String>,
    /// Hostname (not with a host UTS/network namespace).
    pub hostname: Option<String>,
    /// Privileged (all devices, all capabilities). DAOS servers need it.
    pub privileged: bool,
    /// Network namespace.
    pub network: Namespace,
    /// PID namespace.
    pub pid: Namespace,
    /// IPC namespace.
    pub ipc: Namespace,
    /// Cgroup namespace (DAOS servers: host).
    pub cgroup: Namespace,
    /// Mounts, in order.
    pub mounts: Vec<Mount>,
    /// Host device paths to pass in (`/dev/fuse`).
    pub devices: Vec<String>,
    /// Resource limits.
    pub rlimits: Vec<Rlimit>,
    /// Capabilities to drop (`ALL` drops every one).
    pub cap_drop: Vec<String>,
    /// Capabilities to add.
    pub cap_add: Vec<String>,
    /// Set `no_new_privs` for the container's processes.
    pub no_new_privileges: bool,
    /// Mount the image's root filesystem read-only.
    pub read_only_rootfs: bool,
    /// Seconds between SIGTERM and SIGKILL when Podman stops it on its own
    /// (e.g. `podman stop` without a time); [`crate::Podman::container_stop`]
    /// passes its own grace period.
    pub stop_timeout: Option<u32>,
}

impl ContainerSpec {
    /// A spec with the image's command and Podman's defaults otherwise.
    pub fn new(name: impl Into<String>, image: ImageId) -> Self {
        Self {
            name: name.into(),
            image,
            command: Vec::new(),
            entrypoint: None,
            env: BTreeMap::new(),
            labels: BTreeMap::new(),
            user: None,
            work_dir: None,
            hostname: None,
            privileged: false,
            network: Namespace::Default,
            pid: Namespace::Default,
            ipc: Namespace::Default,
            cgroup: Namespace::Default,
            mounts: Vec::new(),
            devices: Vec::new(),
            rlimits: Vec::new(),
            cap_drop: Vec::new(),
            cap_add: Vec::new(),
            no_new_privileges: false,
            groups: Vec::new(),
            read_only_rootfs: false,
            stop_timeout: None,
        }
    }

    /// The libpod `SpecGenerator` JSON. The image is given as its 64 hex
    /// digits, which Podman resolves as an ID and never as a name (a
    /// repository name may not be 64 hex digits).
    pub fn to_libpod_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), json!(self.name));
        m.insert("image".into(), json!(self.image.hex()));
        if !self.command.is_empty() {
            m.insert("command".into(), json!(self.command));
        }
        if let Some(ep) = &self.entrypoint {
            m.insert("entrypoint".into(), json!(ep));
        }
        if !self.env.is_empty() {
            m.insert("env".into(), json!(self.env));
        }
        if !self.labels.is_empty() {
            m.insert("labels".into(), json!(self.labels));
        }
        if let Some(u) = &self.user {
            m.insert("user".into(), json!(u));
        }
        if !self.groups.is_empty() {
            m.insert("groups".into(), json!(self.groups));
        }
        if let Some(w) = &self.work_dir {
            m.insert("work_dir".into(), json!(w));
        }
        if let Some(h) = &self.hostname {
            m.insert("hostname".into(), json!(h));
        }
        if self.privileged {
            m.insert("privileged".into(), json!(true));
        }
        for (key, ns) in [
            ("netns", self.network),
            ("pidns", self.pid),
            ("ipcns", self.ipc),
            ("cgroupns", self.cgroup),
        ] {
            if let Some(v) = ns.to_json() {
                m.insert(key.into(), v);
            }
        }
        if !self.mounts.is_empty() {
            let mounts: Vec<Value> = self.mounts.iter().map(Mount::to_json).collect();
            m.insert("mounts".into(), Value::Array(mounts));
        }
        if !self.devices.is_empty() {
            let devs: Vec<Value> = self.devices.iter().map(|p| json!({ "path": p })).collect();
            m.insert("devices".into(), Value::Array(devs));
        }
        if !self.rlimits.is_empty() {
            let rl: Vec<Value> = self
                .rlimits
                .iter()
                .map(|r| json!({ "type": r.kind, "soft": r.soft, "hard": r.hard }))
                .collect();
            m.insert("r_limits".into(), Value::Array(rl));
        }
        if !self.cap_drop.is_empty() {
            m.insert("cap_drop".into(), json!(self.cap_drop));
        }
        if !self.cap_add.is_empty() {
            m.insert("cap_add".into(), json!(self.cap_add));
        }
        if self.no_new_privileges {
            m.insert("no_new_privileges".into(), json!(true));
        }
        if self.read_only_rootfs {
            m.insert("read_only_filesystem".into(), json!(true));
        }
        if let Some(t) = self.stop_timeout {
            m.insert("stop_timeout".into(), json!(t));
        }
        Value::Object(m)
    }
}

/// `null` → `T::default()`; Podman sends `"Labels": null` for an empty map.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The `_ping` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PingInfo {
    /// `Libpod-API-Version`, parsed (the Podman version).
    pub libpod_api_version: crate::ApiVersion,
    /// `Libpod-API-Version` as sent (`4.9.4-rhel`).
    pub libpod_api_version_raw: String,
    /// `API-Version`, the Docker-compatible API version (`1.41`).
    pub docker_api_version: Option<String>,
}

/// An image, as `images/{id}/json` reports it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ImageInfo {
    /// 64 hex digits.
    pub id: String,
    /// Tags pointing at it.
    #[serde(deserialize_with = "null_default")]
    pub repo_tags: Vec<String>,
    /// Size in bytes.
    pub size: u64,
    /// Image labels (`Labels`, from the image config).
    #[serde(deserialize_with = "null_default")]
    pub labels: BTreeMap<String, String>,
}

/// An image in `images/json`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ImageSummary {
    /// 64 hex digits.
    pub id: String,
    /// Tags pointing at it.
    #[serde(deserialize_with = "null_default")]
    pub repo_tags: Vec<String>,
    /// Size in bytes.
    pub size: u64,
}

/// What `images/load` reports.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct LoadedImages {
    /// The names (tags) loaded; for an untagged archive, the image ID.
    #[serde(deserialize_with = "null_default")]
    pub names: Vec<String>,
}

/// The state part of a container inspect.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerState {
    /// `created`, `running`, `exited`, `stopped`, `paused`, ...
    pub status: String,
    /// Whether it is running.
    pub running: bool,
    /// Exit code of the last run (0 if it never ran).
    pub exit_code: i32,
    /// Host PID of the container's init (0 if not running).
    pub pid: i64,
    /// Killed by the OOM killer.
    #[serde(rename = "OOMKilled")]
    pub oom_killed: bool,
    /// Podman's error for the last start, if any.
    pub error: String,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339.
    pub finished_at: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
struct InspectConfig {
    #[serde(deserialize_with = "null_default")]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub(crate) struct RawContainerInspect {
    id: String,
    name: String,
    image: String,
    image_name: String,
    state: ContainerState,
    config: InspectConfig,
}

/// A container, as `containers/{name}/json` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    /// 64 hex digits.
    pub id: String,
    /// Name.
    pub name: String,
    /// The image it was created from, 64 hex digits. Compare with the pin.
    pub image_id: String,
    /// The name the image had at creation (informational only).
    pub image_name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// State.
    pub state: ContainerState,
}

impl From<RawContainerInspect> for ContainerInfo {
    fn from(r: RawContainerInspect) -> Self {
        Self {
            id: r.id,
            name: r.name,
            image_id: r.image,
            image_name: r.image_name,
            labels: r.config.labels,
            state: r.state,
        }
    }
}

/// A container in `containers/json`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerSummary {
    /// 64 hex digits.
    pub id: String,
    /// Names (one for a plain container).
    #[serde(deserialize_with = "null_default")]
    pub names: Vec<String>,
    /// The image it was created from, 64 hex digits.
    #[serde(rename = "ImageID")]
    pub image_id: String,
    /// Labels.
    #[serde(deserialize_with = "null_default")]
    pub labels: BTreeMap<String, String>,
    /// `created`, `running`, `exited`, ...
    pub state: String,
    /// Exit code of the last run.
    pub exit_code: i32,
}

impl ContainerSummary {
    /// The lease label, if any.
    pub fn lease(&self) -> Option<&str> {
        self.labels.get(LABEL_LEASE).map(String::as_str)
    }

    /// The role label, if it is one of ours.
    pub fn role(&self) -> Option<Role> {
        self.labels.get(LABEL_ROLE).and_then(|r| Role::parse(r))
    }
}

/// A command to run in a running container (`podman exec`, without stdin).
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    /// Program and arguments.
    pub cmd: Vec<String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// `UID:GID` or a user name; default: the container's user.
    pub user: Option<String>,
    /// Working directory.
    pub work_dir: Option<String>,
    /// Run with all capabilities (never for user commands).
    pub privileged: bool,
    /// Allocate a TTY (output then comes back raw, as stdout).
    pub tty: bool,
    /// Attach stdin ([`crate::Podman::container_exec_attach`] only).
    pub stdin: bool,
    /// With `tty`: the terminal's (rows, columns) from the start, so the
    /// command never sees a 0x0 terminal (libpod's exec start `h`/`w`).
    pub console_size: Option<(u16, u16)>,
}

impl ExecSpec {
    /// A plain command.
    pub fn new<I, S>(cmd: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            cmd: cmd.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// The exec-create JSON (libpod takes Docker's `ExecConfig` shape).
    pub(crate) fn to_libpod_json(&self, attach_stdin: bool) -> Value {
        let mut m = Map::new();
        m.insert("AttachStdout".into(), json!(true));
        m.insert("AttachStderr".into(), json!(true));
        m.insert("AttachStdin".into(), json!(attach_stdin));
        m.insert("Cmd".into(), json!(self.cmd));
        m.insert("Tty".into(), json!(self.tty));
        if !self.env.is_empty() {
            let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            m.insert("Env".into(), json!(env));
        }
        if let Some(u) = &self.user {
            m.insert("User".into(), json!(u));
        }
        if let Some(w) = &self.work_dir {
            m.insert("WorkingDir".into(), json!(w));
        }
        if self.privileged {
            m.insert("Privileged".into(), json!(true));
        }
        Value::Object(m)
    }
}

/// What an exec produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The command's exit code.
    pub exit_code: i32,
    /// Its stdout and stderr.
    pub output: crate::Logs,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub(crate) struct ExecInspect {
    pub(crate) running: bool,
    pub(crate) exit_code: i32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub(crate) struct CreateReply {
    pub(crate) id: String,
    #[serde(deserialize_with = "null_default")]
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub(crate) struct RmReport {
    pub(crate) id: String,
    #[serde(deserialize_with = "null_default")]
    pub(crate) err: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sha256:38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7";

    #[test]
    fn spec_json_has_only_what_was_set() {
        let spec = ContainerSpec::new("c1", ImageId::parse(ID).unwrap());
        let v = spec.to_libpod_json();
        assert_eq!(
            v,
            json!({"name": "c1", "image": &ID[7..]}),
            "defaults must not be sent"
        );
    }

    #[test]
    fn spec_json_for_a_client_container() {
        let mut spec = ContainerSpec::new("c2", ImageId::parse(ID).unwrap());
        spec.labels = lease_labels("L1", Role::Client);
        spec.user = Some("1000:1000".into());
        spec.network = Namespace::Host;
        spec.cap_drop = vec!["ALL".into()];
        spec.no_new_privileges = true;
        spec.mounts = vec![Mount::bind("/etc/daos", "/etc/daos").read_only()];
        spec.rlimits = vec![Rlimit::new("memlock", Rlimit::UNLIMITED)];
        let v = spec.to_libpod_json();
        assert_eq!(v["labels"]["io.gpuq.lease"], "L1");
        assert_eq!(v["labels"]["io.gpuq.role"], "client");
        assert_eq!(v["netns"], json!({"nsmode": "host"}));
        assert!(v.get("pidns").is_none());
        assert_eq!(v["mounts"][0]["options"], json!(["bind", "ro"]));
        assert_eq!(v["r_limits"][0]["hard"], json!(u64::MAX));
        assert_eq!(v["no_new_privileges"], true);
    }

    #[test]
    fn replies_ignore_unknown_fields_and_nulls() {
        let s: ContainerSummary = serde_json::from_str(
            r#"{"Id":"ab","Names":["x"],"ImageID":"cd","Labels":null,"State":"exited",
                "ExitCode":3,"SomethingNewInPodman6":{"a":1}}"#,
        )
        .unwrap();
        assert_eq!(s.exit_code, 3);
        assert!(s.labels.is_empty());
        let i: ImageInfo = serde_json::from_str(r#"{"Id":"ab","RepoTags":null}"#).unwrap();
        assert!(i.repo_tags.is_empty());
        let c: RawContainerInspect = serde_json::from_str(
            r#"{"Id":"ab","Name":"n","Image":"cd","State":{"Status":"running","Running":true,
                "Pid":42,"OOMKilled":false,"Health":{}},"Config":{"Labels":{"io.gpuq.role":"server"}}}"#,
        )
        .unwrap();
        let c = ContainerInfo::from(c);
        assert_eq!(c.state.pid, 42);
        assert_eq!(c.image_id, "cd");
        assert_eq!(c.labels["io.gpuq.role"], "server");
    }

    #[test]
    fn filters_and_roles() {
        let f = LabelFilter::lease("L1").eq(LABEL_ROLE, "server");
        assert_eq!(f.conditions(), ["io.gpuq.lease=L1", "io.gpuq.role=server"]);
        assert_eq!(LabelFilter::ours().conditions(), ["io.gpuq.lease"]);
        for r in [Role::Server, Role::Agent, Role::Client, Role::Admin] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("other"), None);
    }
}
