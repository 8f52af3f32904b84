//! DAOS jobs (`gpuq submit --inst NAME`): the broker's side of a lease.
//!
//! The nodes are reached through [`gpuq_nodelink`] (one SSH master per node
//! forwarding local sockets to its gpuq-node and Podman); the node steps are
//! [`gpuq_lifecycle::Lifecycle`]'s, the GPU host's containers (admin `dmg`,
//! agent, clients) [`gpuq_lifecycle::host::Host`]'s. The lease records live
//! in the broker's state directory, next to `blocked.json`, which the gate
//! reads on every decision: a lease that is not released holds every job.

use crate::config::{DaosConfig, DaosProfile};
use crate::joblog;
use crate::runner::Runner;
use gpuq_lease::{CleanupStep, Lease, LeaseStore, Phase};
use gpuq_lifecycle::host::{Host, HostProfile};
use gpuq_lifecycle::{Lifecycle, LifecycleError, LocalSteps, Node};
use gpuq_nodelink::{LinkConfig, NodeLinks, Timings};
use gpuq_podman::ImageId;
use gpuq_protocol::node::ServerTls;
use gpuq_protocol::JobId;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The lease name of a job: `job<ID>-<unix time>` (unique, and `recover`
/// finds the job again from it).
pub fn lease_name(job: JobId, now: i64) -> String {
    format!("job{}-{now}", job.0)
}

/// The job a lease serves, from its name.
pub fn job_of_lease(lease: &str) -> Option<JobId> {
    let rest = lease.strip_prefix("job")?;
    let (id, _) = rest.split_once('-')?;
    id.parse().ok().map(JobId)
}

#[derive(Debug)]
pub struct Daos {
    cfg: DaosConfig,
    store: LeaseStore,
    links: NodeLinks,
}

/// Where a lease's job writes its `gpuq:` lines.
#[derive(Debug, Clone)]
pub struct JobLog {
    pub path: PathBuf,
    pub uid: u32,
}

/// The broker-local cleanup steps of one lease, and its progress lines.
#[derive(Debug)]
pub struct Local<'a> {
    pub runner: &'a dyn Runner,
    pub job: Option<JobId>,
    pub host: Host,
    pub log: Option<JobLog>,
}

#[async_trait::async_trait]
impl LocalSteps for Local<'_> {
    async fn run(&self, lease: &Lease, step: CleanupStep) -> Result<String, String> {
        match step {
            CleanupStep::KillJob => match self.job {
                None => Ok("no job recorded for this lease".into()),
                Some(id) => {
                    self.runner
                        .kill(id)
                        .await
                        .map_err(|e| format!("end job {id}: {e}"))?;
                    if self.runner.alive(id).await.map_err(|e| e.to_string())? {
                        return Err(format!("job {id} still has processes after the kill"));
                    }
                    Ok(format!("job {id}: no process left"))
                }
            },
            CleanupStep::RemoveClients => self.host.remove_clients(&lease.lease).await,
            CleanupStep::StopAgent => self.host.stop_agent(&lease.lease).await,
            CleanupStep::SystemStop => self.host.system_stop(&lease.lease).await,
            CleanupStep::StopServers | CleanupStep::Wipe => {
                Err(format!("{step:?} is a node step, not the broker's"))
            }
        }
    }

    async fn alongside(&self, lease: &Lease, step: CleanupStep) -> Result<Option<String>, String> {
        match step {
            // The agent's process is gone (StopAgent confirmed it); its
            // container goes while `dmg system stop` runs.
            CleanupStep::SystemStop => self.host.remove_agent(&lease.lease).await.map(Some),
            // After the servers are stopped (the wipe is light on the nodes;
            // done while they stop, the removal competed with theirs).
            CleanupStep::Wipe => self.host.remove_admin(&lease.lease).await.map(Some),
            _ => Ok(None),
        }
    }

    fn note(&self, line: &str) {
        tracing::info!("{line}");
        if let Some(l) = &self.log {
            joblog::note(&l.path, l.uid, line);
        }
    }

    fn checkpoint(&self, point: &str) {
        crate::broker::crash_point(point);
    }
}

impl Daos {
    /// Open the lease store (an unreleased lease is put on hold here) and
    /// start the node links.
    pub fn start(cfg: DaosConfig, state_dir: &Path, now: i64) -> anyhow::Result<Arc<Self>> {
        let (store, held) = LeaseStore::open(state_dir, now)?;
        if let Some(l) = &held {
            tracing::warn!(lease = %l.lease, "an unreleased DAOS lease is held; run `gpuq recover`");
        }
        let links = NodeLinks::new(
            cfg.nodes
                .iter()
                .map(|n| LinkConfig {
                    name: n.name.clone(),
                    host: n.host.clone(),
                    user: cfg.ssh_user.clone(),
                    port: n.port,
                    identity_file: cfg.identity_file.clone(),
                    known_hosts_file: cfg.known_hosts_file.clone(),
                    ssh_config_file: cfg.ssh_config_file.clone(),
                    node_socket: n
                        .node_socket
                        .clone()
                        .unwrap_or_else(|| cfg.node_socket.clone()),
                    podman_socket: n
                        .podman_socket
                        .clone()
                        .unwrap_or_else(|| cfg.node_podman_socket.clone()),
                    forward_dir: cfg.forward_dir.clone(),
                })
                .collect(),
            Timings {
                connect_timeout: Duration::from_secs(cfg.ssh_connect_timeout_secs),
                ..Timings::default()
            },
        )?;
        links.start_all();
        Ok(Arc::new(Daos { cfg, store, links }))
    }

    pub fn config(&self) -> &DaosConfig {
        &self.cfg
    }

    pub fn profile(&self, name: &str) -> Option<&DaosProfile> {
        self.cfg.profiles.get(name)
    }

    pub fn host(&self, profile: &str) -> Result<Host, String> {
        let p = self
            .profile(profile)
            .ok_or_else(|| format!("profile '{profile}' is not configured"))?;
        Ok(Host::new(
            self.cfg.podman_socket.clone(),
            self.cfg.run_dir.clone(),
            HostProfile {
                image: ImageId::parse(&p.image).map_err(|e| e.to_string())?,
                system: p.system.clone(),
                port: p.port,
                nodes: self
                    .cfg
                    .nodes
                    .iter()
                    .map(|n| (n.name.clone(), n.address.clone()))
                    .collect(),
                access_points: p.replicas.clone(),
                join_timeout: Duration::from_secs(self.cfg.join_timeout_secs),
                env: p.env.clone(),
                deadlines: self.cfg.deadlines,
            },
        ))
    }

    fn lifecycle(&self, profile: &str) -> Lifecycle {
        let replicas = self
            .profile(profile)
            .map(|p| p.replicas.clone())
            .unwrap_or_default();
        Lifecycle {
            store: self.store.clone(),
            nodes: self
                .links
                .links()
                .iter()
                .map(|l| Node::new(l.name(), l.sockets().node_sock))
                .collect(),
            profile: profile.to_string(),
            replicas,
            deadlines: self.cfg.deadlines,
            tls: None,
        }
    }

    fn link_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.link_timeout_secs)
    }

    /// The active lease, if any (preparing, running, cleaning or held).
    pub fn active(&self) -> Option<Lease> {
        let dir = self.store_dir();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("active.json")).ok()?).ok()?;
        self.store.load(v["lease"].as_str()?).ok()
    }

    /// Why the gate stays closed for a lease that is not released, if one
    /// is: its phase, or — when `active.json` exists but it or its lease
    /// record cannot be read — that (fail closed).
    pub fn unreleased(&self) -> Option<String> {
        let pointer = self.store_dir().join("active.json");
        let bytes = match std::fs::read(&pointer) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                return Some(format!(
                    "{} is unreadable ({e}); an operator must look",
                    pointer.display()
                ))
            }
            Ok(b) => b,
        };
        let lease = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v["lease"].as_str().map(str::to_string));
        let Some(name) = lease else {
            return Some(format!(
                "{} names no lease; an operator must look",
                pointer.display()
            ));
        };
        Some(match self.store.load(&name) {
            Err(e) => format!("DAOS lease {name}: {e}; an operator must look"),
            Ok(l) => match &l.phase {
                Phase::Held { reason, .. } => {
                    format!("DAOS lease {name} is held ({reason}); run `sudo gpuq recover`")
                }
                // Released, the pointer about to go.
                Phase::Released => return None,
                _ => format!("DAOS lease {name} is not released; `sudo gpuq recover` cleans it up"),
            },
        })
    }

    fn store_dir(&self) -> PathBuf {
        self.store.dir().to_path_buf()
    }

    /// Steps 2–4 of mission.md §4 for one job: lease (durable first),
    /// preflight and server start on all nodes, format, four joins, agent.
    /// Returns the lease and the job's DAOS variables. On an error the lease
    /// may exist: the caller always runs [`Daos::cleanup_for`].
    pub async fn prepare(
        &self,
        lease: &str,
        owner: &str,
        profile: &str,
        local: &Local<'_>,
    ) -> Result<(Lease, Vec<(String, String)>), String> {
        let t = std::time::Instant::now();
        let host = &local.host;
        let up = unless_stopped(host, self.links.ensure_all_up(self.link_timeout())).await?;
        if !up.all_ok() {
            let why: Vec<String> = up
                .nodes
                .iter()
                .filter_map(|n| n.result.as_ref().err().map(|e| format!("{}: {e}", n.node)))
                .collect();
            return Err(format!(
                "node links are not up, nothing was started: {}",
                why.join("; ")
            ));
        }
        local.note(&format!(
            "links to {} nodes up ({:.2}s)",
            self.links.links().len(),
            t.elapsed().as_secs_f64()
        ));
        let mut lc = self.lifecycle(profile);
        host.check_stop()?;
        let mut l = lc
            .preflight(lease, owner, local)
            .await
            .map_err(|e| e.to_string())?;
        let step = |what: &str, t: std::time::Instant, detail: &str| {
            local.note(&format!(
                "{what}: {detail} ({:.2}s)",
                t.elapsed().as_secs_f64()
            ));
        };
        // The lease's own certificates (issue #13, item 5): its CA's key
        // lives only in this function. The nodes get the server's, cxl2's
        // admin and agent containers theirs, the job's owner the admin's.
        let certs = gpuq_leasecert::LeaseCerts::generate(lease).map_err(|e| e.to_string())?;
        lc.tls = Some(ServerTls {
            ca_cert: certs.ca_cert.clone(),
            cert: certs.server.cert.clone(),
            key: certs.server.key.clone(),
            agent_cert: certs.agent.cert.clone(),
        });
        let owner_uid = local.log.as_ref().map_or(0, |l| l.uid);
        // The admin container (this host) comes up while the nodes start
        // their servers.
        let t = std::time::Instant::now();
        // A stop leaves the nodes' start calls to finish on their own: each
        // node does one step at a time, so the cleanup's stop waits for them.
        let (started, admin) = tokio::join!(
            unless_stopped(host, lc.start_servers(&mut l, local)),
            host.prepare_admin(lease, &certs, owner_uid)
        );
        let awaiting_format = match started.and_then(|r| r.map_err(|e| e.to_string())) {
            Ok(a) => a,
            Err(e) => {
                // The failed start cleaned the lease up; its admin container
                // may have come up after that cleanup looked.
                if let Err(d) = host.discard_admin(lease).await {
                    tracing::warn!(lease, "removing the admin container: {d}");
                }
                return Err(e);
            }
        };
        let a = admin.map_err(|e| format!("admin container: {e}"))?;
        step("admin", t, &format!("{a} up"));
        // The agent starts while the system is formatted and its ranks join:
        // daos_agent contacts the servers only for a client's first
        // GetAttachInfo (DAOS src/control/cmd/daos_agent/start.go), and the
        // job starts only once both are confirmed.
        let n = self.cfg.nodes.len();
        let system = async {
            let t = std::time::Instant::now();
            let f = host
                .format(lease, awaiting_format)
                .await
                .map_err(|e| format!("format: {e}"))?;
            step("format", t, &f);
            local.checkpoint("formatted");
            let t = std::time::Instant::now();
            let j = host
                .wait_joined(lease, n)
                .await
                .map_err(|e| format!("join: {e}"))?;
            step("join", t, &j);
            local.checkpoint("joined");
            Ok::<(), String>(())
        };
        let t = std::time::Instant::now();
        let agent = async {
            let a = host
                .start_agent(lease)
                .await
                .map_err(|e| format!("agent: {e}"));
            (a, t.elapsed())
        };
        // Both run to their end: a failure of one leaves the other's
        // container in a known state for the cleanup that follows.
        let (system, (agent, took)) = tokio::join!(system, agent);
        system?;
        let a = agent?;
        local.note(&format!(
            "agent: {a} (started alongside the format, up after {:.2}s)",
            took.as_secs_f64()
        ));
        local.checkpoint("agent_started");
        lc.mark_running(&mut l).map_err(|e| e.to_string())?;
        Ok((l, host.job_env(lease)))
    }

    /// Clean up `lease` if it is still active and not held: every step,
    /// all nodes; a failure holds it. `Ok(None)`: nothing to clean.
    pub async fn cleanup_for(
        &self,
        lease: &str,
        local: &Local<'_>,
    ) -> Result<Option<String>, String> {
        let Some(mut l) = self.active().filter(|l| l.lease == lease) else {
            return Ok(None);
        };
        if matches!(l.phase, Phase::Held { .. } | Phase::Released) {
            return Ok(None);
        }
        let _ = self.links.ensure_all_up(self.link_timeout()).await;
        let lc = self.lifecycle(&l.profile);
        match lc.cleanup(&mut l, local).await {
            Ok(()) => Ok(Some(format!(
                "lease {lease} cleaned on all nodes and released"
            ))),
            Err(e) => Err(e.to_string()),
        }
    }

    /// `gpuq recover`: the held (or abandoned) lease, from its first
    /// unconfirmed step.
    pub async fn recover(
        &self,
        runner: &dyn Runner,
        log: Option<JobLog>,
    ) -> Result<String, String> {
        let Some(l) = self.active() else {
            return Err(LifecycleError::NothingToRecover.to_string());
        };
        let host = self.host(&l.profile)?;
        let local = Local {
            runner,
            job: job_of_lease(&l.lease),
            host,
            log,
        };
        let _ = self.links.ensure_all_up(self.link_timeout()).await;
        let lc = self.lifecycle(&l.profile);
        let lease = l.lease.clone();
        lc.recover(Some(l), &local)
            .await
            .map_err(|e| e.to_string())?;
        Ok(format!(
            "lease {lease}: every cleanup step confirmed on all nodes; released"
        ))
    }

    /// `gpuq daos-status`: links, every node's helper status, the lease.
    pub async fn status(&self) -> serde_json::Value {
        let states = self.links.states();
        let mut nodes = Vec::new();
        for l in self.links.links() {
            let state = states
                .iter()
                .find(|(n, _)| n == l.name())
                .map(|(_, s)| s.clone());
            let link = state.as_ref().map(|s| s.label()).unwrap_or("unknown");
            let (helper, error) = if state.as_ref().is_some_and(|s| s.is_up()) {
                let c = gpuq_client::Client::new(l.sockets().node_sock);
                // An operator waits for this: at most 5 s per node.
                match c
                    .call_within::<serde_json::Value>(
                        self.cfg.deadlines.request.min(Duration::from_secs(5)),
                        hyper::Method::GET,
                        "/v1/status",
                        None::<&()>,
                    )
                    .await
                {
                    Ok(v) => (v, None),
                    Err(e) => (serde_json::Value::Null, Some(e.to_string())),
                }
            } else {
                let why = match &state {
                    Some(gpuq_nodelink::LinkState::Down { last_error, .. }) => last_error.clone(),
                    _ => "link not up".into(),
                };
                (serde_json::Value::Null, Some(why))
            };
            nodes.push(serde_json::json!({
                "node": l.name(),
                "link": link,
                "status": helper,
                "error": error,
            }));
        }
        let lease = self
            .active()
            .map(|l| serde_json::to_value(l).unwrap_or_default());
        serde_json::json!({
            "nodes": nodes,
            "lease": lease,
            "profiles": self.cfg.profiles.iter().map(|(n, p)| serde_json::json!({"name": n, "image": p.image})).collect::<Vec<_>>(),
        })
    }

    /// `gpuq verify-pins`: on the GPU host and every node, through the
    /// Podman API (the nodes' through their forwarded sockets): each
    /// profile's pinned image is present by its ID, and no container of
    /// ours runs any other image. `ok` only if everything checks out.
    pub async fn verify_pins(&self) -> serde_json::Value {
        let pins: Vec<(String, Result<ImageId, String>)> = self
            .cfg
            .profiles
            .iter()
            .map(|(n, p)| {
                (
                    n.clone(),
                    ImageId::parse(&p.image).map_err(|e| e.to_string()),
                )
            })
            .collect();
        // The client image runs on this host only (`gpuq daos-exec`).
        let mut host_pins = pins.clone();
        for (n, p) in &self.cfg.profiles {
            if p.client_image != p.image {
                host_pins.push((
                    format!("{n} (client)"),
                    ImageId::parse(&p.client_image).map_err(|e| e.to_string()),
                ));
            }
        }
        let mut hosts = vec![(
            "cxl2 (this host)".to_string(),
            Ok(self.cfg.podman_socket.clone()),
        )];
        let up = self.links.ensure_all_up(self.link_timeout()).await;
        for n in up.nodes {
            hosts.push((
                n.node,
                n.result.map(|s| s.podman_sock).map_err(|e| e.to_string()),
            ));
        }
        // Every host at once; results in host order.
        let tasks: Vec<_> = hosts
            .into_iter()
            .enumerate()
            .map(|(i, (host, sock))| {
                let pins = if i == 0 {
                    host_pins.clone()
                } else {
                    pins.clone()
                };
                tokio::spawn(check_host(host, sock, pins, self.cfg.deadlines.request))
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap_or_else(
                |e| serde_json::json!({"host": "?", "ok": false, "error": format!("check failed: {e}")}),
            ));
        }
        let ok = results.iter().all(|r| r["ok"] == true);
        serde_json::json!({ "ok": ok, "hosts": results })
    }

    /// `gpuq verify-install`, the nodes' part: every node's helper asked
    /// for `GET /v1/install` at once, each within the link deadline and then
    /// `request_timeout_secs`; a node that does not answer in time (link
    /// down, helper gone or frozen) is reported unreachable, never waited
    /// for longer. Results in configuration order.
    pub async fn install_nodes(&self) -> Vec<gpuq_manifest::report::HostInstall> {
        use gpuq_manifest::report::HostInstall;
        let unreachable = |host: String, why: String| HostInstall {
            host,
            unreachable: Some(why),
            ..HostInstall::default()
        };
        let deadline = self.cfg.deadlines.request;
        let up = self.links.ensure_all_up(self.link_timeout()).await;
        let tasks: Vec<_> = up
            .nodes
            .into_iter()
            .map(|n| {
                tokio::spawn(async move {
                    let sockets = match n.result {
                        Ok(s) => s,
                        Err(e) => return unreachable(n.node, e.to_string()),
                    };
                    let c = gpuq_client::Client::new(sockets.node_sock);
                    match c
                        .call_within::<HostInstall>(
                            deadline,
                            hyper::Method::GET,
                            "/v1/install",
                            None::<&()>,
                        )
                        .await
                    {
                        // The link checked the helper's name when it came up;
                        // a different name now means the socket was swapped.
                        Ok(h) if h.host != n.node => {
                            let why = format!("the node helper answered as {:?}", h.host);
                            unreachable(n.node, why)
                        }
                        Ok(h) => h,
                        Err(e) => {
                            let why = format!(
                                "{e}; is gpuq-node running there? (`systemctl status gpuq-node`)"
                            );
                            unreachable(n.node, why)
                        }
                    }
                })
            })
            .collect();
        let names: Vec<String> = self
            .links
            .links()
            .iter()
            .map(|l| l.name().to_string())
            .collect();
        let mut out = Vec::new();
        for (t, name) in tasks.into_iter().zip(names) {
            out.push(
                t.await
                    .unwrap_or_else(|e| unreachable(name, format!("check failed: {e}"))),
            );
        }
        out
    }

    pub async fn close(&self) {
        self.links.close_all().await;
    }
}

/// `f`, unless the host's preparation is told to stop first (then `f` is
/// dropped: only for futures that create nothing on this host).
async fn unless_stopped<T>(
    host: &Host,
    f: impl std::future::Future<Output = T>,
) -> Result<T, String> {
    host.check_stop()?;
    let Some(mut stop) = host.stop.clone() else {
        return Ok(f.await);
    };
    tokio::select! {
        r = f => Ok(r),
        _ = stop.wait_for(|s| *s) => Err(host.check_stop().err().unwrap_or_default()),
    }
}

async fn check_host(
    host: String,
    sock: Result<PathBuf, String>,
    pins: Vec<(String, Result<ImageId, String>)>,
    request: Duration,
) -> serde_json::Value {
    use gpuq_podman::{LabelFilter, LibpodClient, Podman};
    let fail = |e: String| serde_json::json!({"host": host, "ok": false, "error": e});
    let sock = match sock {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let pm = match LibpodClient::connect_with_timeout(&sock, Some(request)).await {
        Ok(p) => p,
        Err(e) => return fail(format!("Podman at {}: {e}", sock.display())),
    };
    let mut ok = true;
    let mut images = Vec::new();
    for (profile, id) in &pins {
        let (present, detail) = match id {
            Err(e) => (false, e.clone()),
            Ok(id) => match pm.image_inspect(id).await {
                Ok(_) => (true, "present".to_string()),
                Err(e) => (false, e.to_string()),
            },
        };
        ok &= present;
        images.push(serde_json::json!({
            "profile": profile,
            "image": id.as_ref().map(|i| i.to_string()).unwrap_or_default(),
            "present": present,
            "detail": detail,
        }));
    }
    let mut strays = Vec::new();
    match pm.container_list(&LabelFilter::ours()).await {
        Ok(list) => {
            for c in list {
                let pinned = pins
                    .iter()
                    .any(|(_, id)| id.as_ref().is_ok_and(|id| id.matches(&c.image_id)));
                if !pinned {
                    ok = false;
                    strays.push(serde_json::json!({
                        "container": c.names.first().cloned().unwrap_or(c.id.clone()),
                        "image": c.image_id,
                        "lease": c.lease(),
                    }));
                }
            }
        }
        Err(e) => return fail(format!("list containers: {e}")),
    }
    serde_json::json!({
        "host": host,
        "ok": ok,
        "pins": images,
        "unpinned_containers": strays,
    })
}
