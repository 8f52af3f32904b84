//! The GPU host's part of a lease: its client side — the lease's files,
//! agent and client containers (gpuq-clienthost), on this host's own
//! Podman ([`ClientSide::Local`]) or on another GPU host's, through that
//! host's helper over a node link ([`ClientSide::Remote`]: a Slurm job
//! placed on that host) — and the lease's `dmg` (format, join poll, system
//! stop), which runs in the server container of the lease's dmg node,
//! asked over that node's link (gpuq-nodesvc's `dmg` module): a lease
//! makes no container of its own on this host for it.
//!
//! The files and containers of the client side are described in
//! gpuq-clienthost. The broker's own copy of the admin certificate goes
//! to the dmg node only (its `<lease_dir>/admin/`, root 0700, mounted
//! read-only in that node's server container).

use crate::error::HostError;
use crate::nodes::{call_one, Node};
use gpuq_clienthost::{client_tls, ClientHost, ClientProfile};
use gpuq_leasecert::LeaseCerts;
use gpuq_podman::ImageId;
use gpuq_protocol::node::{
    ClientFilesRequest, ClientStep, ClientStepRequest, DmgCommand, DmgReply, DmgRequest, StepReport,
};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use gpuq_clienthost::job_env;

/// What the GPU host needs to know about the DAOS system of a profile.
#[derive(Debug, Clone)]
pub struct HostProfile {
    /// The profile's name (a remote client side's helper reads its own
    /// pinned image under it).
    pub name: String,
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

/// Where a lease's client side (files, agent, client containers) is.
#[derive(Debug, Clone)]
pub enum ClientSide {
    /// This host's own Podman and run directory.
    Local(ClientHost),
    /// Another GPU host, through its helper (gpuq-node with `[client]`):
    /// `run_dir` is that helper's, for the job's variables.
    Remote { node: Node, run_dir: PathBuf },
}

/// The GPU host's part of a lease of one profile.
#[derive(Debug, Clone)]
pub struct Host {
    pub client: ClientSide,
    pub profile: HostProfile,
    /// The node whose server container runs the lease's `dmg` (the
    /// first configured); `None`: no `dmg` (a lifecycle of this host alone).
    pub dmg: Option<Node>,
    /// Set when the job is cancelled or times out while its system is
    /// prepared: the waits end at once, a call in flight completes (so the
    /// cleanup that follows sees what it made). See [`Host::set_stop`].
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

/// The pause between two polls of the join (and of "format required").
/// Each poll is one `dmg` exec on the dmg node, itself ~100 ms of Podman
/// and runc on the test machine: the pause only keeps a slow system from
/// being asked back to back.
const POLL: Duration = Duration::from_millis(20);
/// How long a node's answer to a `dmg` may take beyond the command's own
/// deadline (the link, the node's exec set-up).
const DMG_MARGIN: Duration = Duration::from_secs(10);
/// How long a remote client side's step may take beyond the request
/// deadline: the agent's start waits up to 20 s for its socket, a stop
/// up to 10 s for the agent's SIGTERM.
const REMOTE_MARGIN: Duration = Duration::from_secs(30);

impl Host {
    /// The client side on this host's Podman at `podman_socket`, files
    /// under `run_dir`.
    pub fn new(podman_socket: PathBuf, run_dir: PathBuf, profile: HostProfile) -> Self {
        let client = ClientHost::new(podman_socket, run_dir, client_profile(&profile));
        Host {
            client: ClientSide::Local(client),
            profile,
            dmg: None,
            stop: None,
        }
    }

    /// The client side on another GPU host, through its helper `node`
    /// (whose `[client] run_dir` is `run_dir`).
    pub fn remote(node: Node, run_dir: PathBuf, profile: HostProfile) -> Self {
        Host {
            client: ClientSide::Remote { node, run_dir },
            profile,
            dmg: None,
            stop: None,
        }
    }

    /// This host with `node` as the lease's dmg node.
    pub fn with_dmg_node(mut self, node: Node) -> Self {
        self.dmg = Some(node);
        self
    }

    /// Tell the preparation to stop when `stop` turns true.
    pub fn set_stop(&mut self, stop: tokio::sync::watch::Receiver<bool>) {
        if let ClientSide::Local(c) = &mut self.client {
            c.stop = Some(stop.clone());
        }
        self.stop = Some(stop);
    }

    /// This host without its stop signal: what a cleanup uses (a cleanup
    /// is never told to stop).
    pub fn without_stop(&self) -> Host {
        let mut h = self.clone();
        h.stop = None;
        if let ClientSide::Local(c) = &mut h.client {
            c.stop = None;
        }
        h
    }

    /// The client side on this host's own Podman, if it is here.
    pub fn local(&self) -> Option<&ClientHost> {
        match &self.client {
            ClientSide::Local(c) => Some(c),
            ClientSide::Remote { .. } => None,
        }
    }

    /// Where the client side's files are, on whichever host it is.
    pub fn run_dir(&self) -> &std::path::Path {
        match &self.client {
            ClientSide::Local(c) => &c.run_dir,
            ClientSide::Remote { run_dir, .. } => run_dir,
        }
    }

    /// The job's DAOS variables (mission.md §4 step 5).
    pub fn job_env(&self, lease: &str) -> Vec<(String, String)> {
        job_env(
            self.run_dir(),
            &self.profile.system,
            &self.profile.env,
            lease,
        )
    }

    /// Whether the preparation was told to stop.
    pub fn stopped(&self) -> bool {
        gpuq_clienthost::stopped(&self.stop)
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
        if gpuq_clienthost::pause(&self.stop, d).await {
            return Err(HostError::Stopped);
        }
        Ok(())
    }

    /// `step` of the remote client side on `node`, within the request
    /// deadline and [`REMOTE_MARGIN`].
    async fn remote_step(
        &self,
        node: &Node,
        lease: &str,
        step: &str,
        body: Value,
    ) -> Result<String, HostError> {
        let reply = call_one::<StepReport>(
            node,
            self.profile.deadlines.request + REMOTE_MARGIN,
            &format!("/v1/clients/{lease}/{step}"),
            Some(body),
        )
        .await;
        let r = reply.map_err(|source| HostError::Remote {
            node: node.name.clone(),
            step: step.to_string(),
            source: Box::new(source),
        })?;
        Ok(format!("{}: {}", node.name, r.detail))
    }

    /// A [`ClientStep`] here or on the remote host.
    async fn client_step(&self, lease: &str, step: ClientStep) -> Result<String, HostError> {
        match &self.client {
            ClientSide::Local(c) => Ok(match step {
                ClientStep::StartAgent => c.start_agent(lease).await?,
                ClientStep::RemoveClients => c.remove_clients(lease).await?,
                ClientStep::StopAgent => c.stop_agent(lease).await?,
                ClientStep::RemoveAgent => c.remove_agent(lease).await?,
                ClientStep::RemoveFiles => c.remove_lease_files(lease).await?,
            }),
            ClientSide::Remote { node, .. } => {
                let body = serde_json::to_value(ClientStepRequest {
                    profile: self.profile.name.clone(),
                })
                .unwrap_or_default();
                self.remote_step(node, lease, step.as_str(), body).await
            }
        }
    }

    /// Write the lease's client files (see gpuq-clienthost), the admin
    /// certificate for the job's owner `owner_uid` only.
    pub async fn prepare_files(
        &self,
        lease: &str,
        certs: &LeaseCerts,
        owner_uid: u32,
    ) -> Result<String, HostError> {
        self.check_stop()?;
        match &self.client {
            ClientSide::Local(c) => Ok(c.prepare_files(lease, &client_tls(certs), owner_uid)?),
            ClientSide::Remote { node, .. } => {
                let p = &self.profile;
                let body = serde_json::to_value(ClientFilesRequest {
                    profile: p.name.clone(),
                    owner_uid,
                    system: p.system.clone(),
                    port: p.port,
                    hostlist: p.nodes.iter().map(|(_, a)| a.clone()).collect(),
                    access_points: p.access_points.clone(),
                    tls: client_tls(certs),
                })
                .unwrap_or_default();
                self.remote_step(node, lease, "files", body).await
            }
        }
    }

    /// Start the agent and wait for its socket.
    pub async fn start_agent(&self, lease: &str) -> Result<String, HostError> {
        self.check_stop()?;
        self.client_step(lease, ClientStep::StartAgent).await
    }

    /// Cleanup step: client containers (`daos-exec`) of this lease.
    pub async fn remove_clients(&self, lease: &str) -> Result<String, HostError> {
        self.client_step(lease, ClientStep::RemoveClients).await
    }

    /// Cleanup step: the agent, SIGTERMed while the servers are up (it
    /// evicts its pool handles; daos.md), confirmed by its process leaving.
    pub async fn stop_agent(&self, lease: &str) -> Result<String, HostError> {
        self.client_step(lease, ClientStep::StopAgent).await
    }

    /// The stopped agent's container, removed while `dmg system stop` runs.
    pub async fn remove_agent(&self, lease: &str) -> Result<String, HostError> {
        self.client_step(lease, ClientStep::RemoveAgent).await
    }

    /// The client side's part of the wipe: the lease's files.
    pub async fn remove_lease_files(&self, lease: &str) -> Result<String, HostError> {
        self.client_step(lease, ClientStep::RemoveFiles).await
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
        let reply = call_one::<DmgReply>(
            node,
            within + DMG_MARGIN,
            &format!("/v1/leases/{lease}/dmg"),
            body,
        )
        .await;
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

/// The client side's view of a profile.
fn client_profile(p: &HostProfile) -> ClientProfile {
    ClientProfile {
        image: p.image.clone(),
        system: p.system.clone(),
        port: p.port,
        hostlist: p.nodes.iter().map(|(_, a)| a.clone()).collect(),
        access_points: p.access_points.clone(),
        request: p.deadlines.request,
    }
}

#[cfg(test)]
mod tests {
    use super::{format_reply, joined_shape};
    use serde_json::{json, Value};

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
