//! One site's DAOS leases: the lease store, the links to the nodes, the
//! `[daos]` configuration, and what a lease does from start to end —
//! [`Daos::prepare`] (links, lease, preflight, servers, admin, format,
//! joins, agent), [`Daos::cleanup_for`] and [`Daos::recover`] (every
//! cleanup step, all nodes, held on any failure), and what an operator
//! asks of it (status, pins, installed files, node metrics). Whatever
//! drives a lease (the broker today) passes in its own part through
//! [`LocalSteps`]: ending the job's processes, its log lines, its step
//! times and its checkpoints.

use crate::config::{DaosConfig, DaosProfile};
use crate::error::{DaosError, PrepareStep};
use crate::host::{Host, HostProfile};
use crate::nodes::{call_all, Retry};
use crate::{Lifecycle, LifecycleError, LocalSteps, Node};
use gpuq_lease::{Lease, LeaseError, LeaseStore, Phase};
use gpuq_nodelink::{LinkConfig, NodeLinks, Timings};
use gpuq_podman::ImageId;
use gpuq_protocol::node::{DmgAccess, ServerTls};
use hyper::Method;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// Why a site's DAOS side cannot start.
#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Links(#[from] gpuq_nodelink::Error),
}

#[derive(Debug)]
pub struct Daos {
    cfg: DaosConfig,
    store: LeaseStore,
    links: NodeLinks,
    /// The next lease's keys, made while the current job runs.
    keys: std::sync::Arc<gpuq_leasecert::KeySupply>,
    /// Whether to make them ahead: only a process that outlives its lease
    /// (the broker) does; a short-lived one (gpuq-slurm's data-in) would
    /// make a set and exit with it unused ([`Daos::make_keys_ahead`]).
    keys_ahead: std::sync::atomic::AtomicBool,
}

impl Daos {
    /// Open the lease store (a lease that was preparing is put on hold
    /// here; one that was running or cleaning is found as it was) and start
    /// the node links.
    pub fn start(cfg: DaosConfig, state_dir: &Path, now: i64) -> Result<Arc<Self>, StartError> {
        let (store, found) = LeaseStore::open(state_dir, now)?;
        match &found {
            Some(l) if matches!(l.phase, Phase::Held { .. }) => {
                tracing::warn!(lease = %l.lease, "an unreleased DAOS lease is held; run `gpuq recover`")
            }
            Some(l) => tracing::info!(
                lease = %l.lease,
                phase = ?l.phase,
                "an unreleased DAOS lease: re-adopting it (its job, then its cleanup)"
            ),
            None => {}
        }
        let links = NodeLinks::new(
            cfg.nodes
                .iter()
                .map(|n| {
                    link_config(
                        &cfg,
                        &n.name,
                        &n.host,
                        n.port,
                        n.node_socket.clone(),
                        n.podman_socket.clone(),
                    )
                })
                .collect(),
            link_timings(&cfg),
        )?;
        links.start_all();
        Ok(Arc::new(Daos {
            cfg,
            store,
            links,
            keys: gpuq_leasecert::KeySupply::new(),
            keys_ahead: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    pub fn config(&self) -> &DaosConfig {
        &self.cfg
    }

    /// From now on, once a lease's job runs, make the next lease's keys
    /// (for a long-lived process: the broker).
    pub fn make_keys_ahead(&self) {
        self.keys_ahead
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn profile(&self, name: &str) -> Option<&DaosProfile> {
        self.cfg.profiles.get(name)
    }

    /// The part of a lease of `profile` whose client side is on another
    /// GPU host, through that host's helper `node` (its `[client]
    /// run_dir` is `run_dir`).
    pub fn remote_host(
        &self,
        profile: &str,
        node: Node,
        run_dir: PathBuf,
    ) -> Result<Host, DaosError> {
        let local = host_for(&self.cfg, profile)?;
        Ok(self.with_dmg(Host::remote(node, run_dir, local.profile)))
    }

    /// `host` with this site's dmg node, if it has one.
    fn with_dmg(&self, host: Host) -> Host {
        match self.dmg_node() {
            Some(n) => host.with_dmg_node(n),
            None => host,
        }
    }

    pub fn host(&self, profile: &str) -> Result<Host, DaosError> {
        Ok(self.with_dmg(host_for(&self.cfg, profile)?))
    }

    /// The node whose server container runs the lease's `dmg`: the first
    /// configured (as the original ran `dmg` over ssh on a storage node).
    fn dmg_node(&self) -> Option<Node> {
        self.links
            .links()
            .first()
            .map(|l| Node::new(l.name(), l.sockets().node_sock))
    }

    /// The lifecycle of a lease of `profile`: its nodes, replicas,
    /// deadlines and this host's part. A profile no longer configured is
    /// an error: nothing is done with a configuration that does not say how.
    fn lifecycle(&self, profile: &str, client: Option<Host>) -> Result<Lifecycle, DaosError> {
        let nodes = self
            .links
            .links()
            .iter()
            .map(|l| Node::new(l.name(), l.sockets().node_sock))
            .collect();
        if let Some(p) = self.cfg.stor.get(profile) {
            // `--stor`: nodes and this host's kernel; no containers here.
            use gpuq_protocol::node::StorKind;
            return Ok(Lifecycle {
                store: self.store.clone(),
                nodes,
                profile: profile.to_string(),
                replicas: Vec::new(),
                deadlines: self.cfg.deadlines,
                tls: None,
                dmg: None,
                host: None,
                kind: match p.kind {
                    StorKind::Nvmeof => gpuq_lease::LeaseKind::Nvmeof,
                    StorKind::Nfsrdma => gpuq_lease::LeaseKind::Nfsrdma,
                    // Refused by the configuration's parse.
                    StorKind::Lustre => {
                        return Err(DaosError::Stor("--stor lustre is not built yet".into()))
                    }
                },
                nfs: p.nfs.clone(),
            });
        }
        let host = match client {
            Some(h) => self.with_dmg(h),
            None => self.host(profile)?,
        };
        let replicas = self
            .profile(profile)
            .map(|p| p.replicas.clone())
            .unwrap_or_default();
        Ok(Lifecycle {
            store: self.store.clone(),
            nodes,
            profile: profile.to_string(),
            replicas,
            deadlines: self.cfg.deadlines,
            tls: None,
            dmg: None,
            host: Some(host),
            kind: gpuq_lease::LeaseKind::Daos,
            nfs: None,
        })
    }

    fn link_timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.link_timeout_secs)
    }

    /// The active lease, if any (preparing, running, cleaning or held).
    pub fn active(&self) -> Option<Lease> {
        self.store.current().ok().flatten()
    }

    /// Hold the active lease (`lease`) with `reason`: a restarted broker
    /// that cannot re-adopt it. Nothing else is done to it.
    pub fn hold(&self, lease: &str, reason: &str) -> Result<(), DaosError> {
        let in_lease = |source| DaosError::Lease {
            lease: lease.to_string(),
            source,
        };
        let mut l = self.store.load(lease).map_err(in_lease)?;
        if matches!(l.phase, Phase::Held { .. } | Phase::Released) {
            return Ok(());
        }
        self.store
            .hold(&mut l, None, None, reason, gpuq_protocol::time::now())
            .map_err(in_lease)
    }

    /// Why the gate stays closed for a lease that is not released, if one
    /// is: its phase, or — when `active.json` exists but it or its lease
    /// record cannot be read — that (fail closed).
    pub fn unreleased(&self) -> Option<String> {
        Some(match self.store.current() {
            Ok(None) => return None,
            Err(e) => format!("{e}; an operator must look"),
            Ok(Some(l)) => match &l.phase {
                Phase::Held { reason, .. } => format!(
                    "DAOS lease {} is held ({reason}); run `sudo gpuq recover`",
                    l.lease
                ),
                // Released, the pointer about to go.
                Phase::Released => return None,
                _ => format!(
                    "DAOS lease {} is not released; `sudo gpuq recover` cleans it up",
                    l.lease
                ),
            },
        })
    }

    /// Steps 2–4 of mission.md §4 for one job: lease (durable first),
    /// preflight and server start on all nodes, format, four joins, agent.
    /// Returns the lease and the job's DAOS variables. On an error the lease
    /// may exist: the caller always runs [`Daos::cleanup_for`].
    /// `owner` names the job for the records, `owner_uid` gets the lease's
    /// admin certificate; `host` is this host's part (its stop signal
    /// included), `local` the caller's steps, lines and times.
    #[allow(clippy::too_many_arguments)]
    pub async fn prepare(
        &self,
        lease: &str,
        owner: &str,
        owner_uid: u32,
        profile: &str,
        host: &Host,
        local: &dyn LocalSteps,
    ) -> Result<(Lease, Vec<(String, String)>), DaosError> {
        if host.stopped() {
            return Err(DaosError::Stopped);
        }
        self.links_up(&host.stop, local).await?;
        // The lifecycle's own host (its cleanup on a failure) is never told
        // to stop.
        let mut lc = self.lifecycle(profile, Some(host.without_stop()))?;
        host.check_stop()
            .map_err(DaosError::host(PrepareStep::Preflight))?;
        let mut l = lc.preflight(lease, owner, local).await?;
        let step = |what: &str, t: std::time::Instant, detail: &str| {
            local.note(&format!(
                "{what}: {detail} ({:.2}s)",
                t.elapsed().as_secs_f64()
            ));
        };
        // The lease's own certificates (issue #13, item 5): its CA's key
        // lives only in this function. The nodes get the server's, cxl2's
        // admin and agent containers theirs, the job's owner the admin's.
        // Its keys were made ahead while the last job ran, or are made now
        // (the first lease after a start, or one right after another).
        let t = std::time::Instant::now();
        let (keys, ahead) = self
            .keys
            .take()
            .map_err(|e| DaosError::host(PrepareStep::Certificates)(e.into()))?;
        let certs = gpuq_leasecert::LeaseCerts::issue(lease, keys)
            .map_err(|e| DaosError::host(PrepareStep::Certificates)(e.into()))?;
        local.timed("prepare", "certificates", t.elapsed().as_secs_f64(), true);
        step(
            "certificates",
            t,
            if ahead {
                "the lease's CA and certificates on keys made ahead"
            } else {
                "the lease's CA and certificates on keys made now"
            },
        );
        lc.tls = Some(ServerTls {
            ca_cert: certs.ca_cert.clone(),
            cert: certs.server.cert.clone(),
            key: certs.server.key.clone(),
            agent_cert: certs.agent.cert.clone(),
        });
        // The dmg node's server container runs the lease's `dmg`: it gets
        // the lease's control config and admin certificate with its start.
        let dmg_node = host.dmg.as_ref().map(|n| n.name.clone());
        if let (Some(node), Some(p)) = (dmg_node, self.profile(profile)) {
            lc.dmg = Some((
                node,
                DmgAccess {
                    system: p.system.clone(),
                    hostlist: self.cfg.nodes.iter().map(|n| n.address.clone()).collect(),
                    admin_cert: certs.admin.cert.clone(),
                    admin_key: certs.admin.key.clone(),
                },
            ));
        }
        // This host's files (configs, the owner's certificates, the
        // agent's directory) before the servers start: nothing waits on
        // them but the agent.
        let t = std::time::Instant::now();
        let files = host.prepare_files(lease, &certs, owner_uid).await;
        local.timed("prepare", "files", t.elapsed().as_secs_f64(), files.is_ok());
        let f = files.map_err(DaosError::host(PrepareStep::Files))?;
        step("files", t, &f);
        // A stop leaves the nodes' start calls to finish on their own: each
        // node does one step at a time, so the cleanup's stop waits for them.
        let awaiting_format = unless_stopped(host, lc.start_servers(&mut l, local)).await??;
        // The agent starts while the system is formatted and its ranks join:
        // daos_agent contacts the servers only for a client's first
        // GetAttachInfo (DAOS src/control/cmd/daos_agent/start.go), and the
        // job starts only once both are confirmed.
        let n = self.cfg.nodes.len();
        let system = async {
            let t = std::time::Instant::now();
            let f = host.format(lease, awaiting_format).await;
            local.timed("prepare", "format", t.elapsed().as_secs_f64(), f.is_ok());
            let f = f.map_err(DaosError::host(PrepareStep::Format))?;
            step("format", t, &f);
            local.checkpoint("formatted");
            let t = std::time::Instant::now();
            let j = host.wait_joined(lease, n).await;
            local.timed("prepare", "join", t.elapsed().as_secs_f64(), j.is_ok());
            let j = j.map_err(DaosError::host(PrepareStep::Join))?;
            step("join", t, &j);
            local.checkpoint("joined");
            Ok::<(), DaosError>(())
        };
        let t = std::time::Instant::now();
        let agent = async {
            let a = host
                .start_agent(lease)
                .await
                .map_err(DaosError::host(PrepareStep::Agent));
            (a, t.elapsed())
        };
        // Both run to their end: a failure of one leaves the other's
        // container in a known state for the cleanup that follows.
        let (system, (agent, took)) = tokio::join!(system, agent);
        local.timed("prepare", "agent", took.as_secs_f64(), agent.is_ok());
        system?;
        let a = agent?;
        local.note(&format!(
            "agent: {a} (started alongside the format, up after {:.2}s)",
            took.as_secs_f64()
        ));
        local.checkpoint("agent_started");
        lc.mark_running(&mut l)?;
        // The next lease's keys, made while this job runs.
        if self.keys_ahead.load(std::sync::atomic::Ordering::SeqCst) {
            self.keys.refill();
        }
        Ok((l, host.job_env(lease)))
    }

    /// Every node link up (made again where one is down), or the nodes
    /// that are not; `stop` (cancel, time limit) ends the wait.
    async fn links_up(
        &self,
        stop: &Option<tokio::sync::watch::Receiver<bool>>,
        local: &dyn LocalSteps,
    ) -> Result<(), DaosError> {
        let t = std::time::Instant::now();
        let up = until(stop, self.links.ensure_all_up(self.link_timeout())).await?;
        local.timed("prepare", "links", t.elapsed().as_secs_f64(), up.all_ok());
        if !up.all_ok() {
            let down = up
                .nodes
                .iter()
                .filter_map(|n| {
                    let e = n.result.as_ref().err()?;
                    Some((n.node.clone(), e.to_string()))
                })
                .collect();
            return Err(DaosError::LinksDown { down });
        }
        local.note(&format!(
            "links to {} nodes up ({:.2}s)",
            self.links.links().len(),
            t.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    /// A `--stor nvmeof` lease for one job: links, lease (durable first),
    /// preflight and export on all nodes, then this host connects to every
    /// export and hands the namespaces' devices to `uid` (an ACL entry). Returns
    /// the lease and the job's variables ([`crate::stor::job_env`]). On an
    /// error the lease may exist: the caller always runs
    /// [`Daos::cleanup_for`]. `stop` (cancel, time limit) ends the
    /// preparation between steps; the connect, once begun, runs to its
    /// end so that the cleanup's disconnect finds what it made.
    #[allow(clippy::too_many_arguments)]
    pub async fn prepare_stor(
        &self,
        lease: &str,
        owner: &str,
        (uid, gid): (u32, u32),
        profile: &str,
        stop: Option<tokio::sync::watch::Receiver<bool>>,
        local: &dyn LocalSteps,
    ) -> Result<(Lease, Vec<(String, String)>), DaosError> {
        let stopped = |stop: &Option<tokio::sync::watch::Receiver<bool>>| {
            stop.as_ref().is_some_and(|s| *s.borrow())
        };
        self.links_up(&stop, local).await?;
        let lc = self.lifecycle(profile, None)?;
        if stopped(&stop) {
            return Err(DaosError::Stopped);
        }
        let mut l = lc.preflight(lease, owner, local).await?;
        if let Some(nfs) = lc.nfs.clone() {
            let env = self
                .stand_up_nfs(&lc, &mut l, &nfs, (uid, gid), &stop, local)
                .await?;
            if stopped(&stop) {
                return Err(DaosError::Stopped);
            }
            lc.mark_running(&mut l)?;
            return Ok((l, env));
        }
        let who = crate::stor::HostIdentity::generate().map_err(DaosError::Stor)?;
        let exports = until(&stop, lc.export_all(&mut l, &who.token, local)).await??;
        if stopped(&stop) {
            return Err(DaosError::Stopped);
        }
        // No unprivileged user of this host may reach a listener (the
        // target cannot tell them from the lease's host): checked at once
        // on every node, before anything is connected.
        let t = std::time::Instant::now();
        let probes = exports.iter().map(|r| {
            let (node, address, port) = (r.node.clone(), r.export.address.clone(), r.export.port);
            tokio::spawn(async move {
                crate::stor::unprivileged_cannot_reach(&node, &address, port).await
            })
        });
        let reachable: Vec<String> = futures_join(probes)
            .await
            .into_iter()
            .filter_map(|j| match j {
                Ok(r) => r.err(),
                Err(e) => Some(format!("a reachability check ended without an answer: {e}")),
            })
            .collect();
        local.timed(
            "prepare",
            "reach",
            t.elapsed().as_secs_f64(),
            reachable.is_empty(),
        );
        if !reachable.is_empty() {
            return Err(DaosError::Stor(reachable.join("; ")));
        }
        // Every node at once; each connect waits for its target. The
        // write to /dev/nvme-fabrics is bounded by the kernel (TCP's SYN
        // retries, then the admin queue's connect timeout), not by us: a
        // connect cut short here would leave a controller that the
        // cleanup's disconnect could miss; the wait for the namespaces
        // after it has `within`.
        let t = std::time::Instant::now();
        let within = self.cfg.deadlines.start;
        let connects = exports.into_iter().map(|r| {
            let who = who.clone();
            tokio::task::spawn_blocking(move || crate::stor::connect_one(&r, &who, uid, within))
        });
        let mut connected = Vec::new();
        let mut failures = Vec::new();
        for j in futures_join(connects).await {
            match j {
                Ok(Ok(c)) => connected.push(c),
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("a connect ended without an answer: {e}")),
            }
        }
        local.timed(
            "prepare",
            "connect",
            t.elapsed().as_secs_f64(),
            failures.is_empty(),
        );
        if !failures.is_empty() {
            return Err(DaosError::Stor(format!(
                "connect on this host failed: {}",
                failures.join("; ")
            )));
        }
        connected.sort_by(|a, b| a.node.cmp(&b.node));
        local.note(&format!(
            "connected to {} nodes and gave their devices to uid {uid}: {} ({:.2}s)",
            connected.len(),
            connected
                .iter()
                .map(|c| format!(
                    "{} {} ({})",
                    c.node,
                    c.controller,
                    c.namespaces
                        .iter()
                        .map(|n| n.path.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                ))
                .collect::<Vec<_>>()
                .join(", "),
            t.elapsed().as_secs_f64()
        ));
        local.checkpoint("connected");
        if stopped(&stop) {
            return Err(DaosError::Stopped);
        }
        lc.mark_running(&mut l)?;
        Ok((l, crate::stor::job_env(&connected)))
    }

    /// `--stor nfsrdma` after the preflight: every node makes, mounts and
    /// exports its filesystems; this host mounts them all at once (each
    /// within the start deadline) and checks each is the owner's, 0700.
    async fn stand_up_nfs(
        &self,
        lc: &Lifecycle,
        l: &mut Lease,
        nfs: &crate::config::NfsClient,
        (uid, gid): (u32, u32),
        stop: &Option<tokio::sync::watch::Receiver<bool>>,
        local: &dyn LocalSteps,
    ) -> Result<Vec<(String, String)>, DaosError> {
        let client = nfs.client_address.to_string();
        // Checked at submit; again here, before any node makes anything
        // (the setting may have changed while the job waited).
        crate::nfs::privileged_ports_hold().map_err(DaosError::Stor)?;
        let exports = until(stop, lc.nfs_export_all(l, &client, uid, gid, local)).await??;
        if stop.as_ref().is_some_and(|s| *s.borrow()) {
            return Err(DaosError::Stopped);
        }
        let rdma = crate::nfs::has_rdma();
        let wants_rdma = exports.iter().any(|r| r.nfs.transport == "rdma");
        if wants_rdma && !rdma {
            local.note(
                "this host has no RDMA device (/sys/class/infiniband is empty): NFS over TCP",
            );
        }
        let t = std::time::Instant::now();
        let within = self.cfg.deadlines.start;
        {
            let (dir, lease) = (nfs.mount_dir.clone(), l.lease.clone());
            tokio::task::spawn_blocking(move || crate::nfs::make_lease_dir(&dir, &lease, uid))
                .await
                .map_err(|e| DaosError::Stor(format!("the mount directory: {e}")))?
                .map_err(DaosError::Stor)?;
        }
        let mounts = exports.into_iter().map(|r| {
            let (dir, lease, client) = (nfs.mount_dir.clone(), l.lease.clone(), client.clone());
            let node = r.node.clone();
            async move {
                let job = tokio::task::spawn_blocking(move || {
                    crate::nfs::mount_one(&r, &dir, &lease, &client, rdma, uid)
                });
                match tokio::time::timeout(within, job).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => Err(format!("{node}: the mount ended without an answer: {e}")),
                    Err(_) => Err(format!(
                        "{node}: the mount did not end within {}s (the cleanup's unmount forces it)",
                        within.as_secs()
                    )),
                }
            }
        });
        let mut mounted = Vec::new();
        let mut failures = Vec::new();
        for r in futures_join(mounts.map(tokio::spawn)).await {
            match r {
                Ok(Ok(m)) => mounted.extend(m),
                Ok(Err(e)) => failures.push(e),
                Err(e) => failures.push(format!("a mount ended without an answer: {e}")),
            }
        }
        local.timed(
            "prepare",
            "mount",
            t.elapsed().as_secs_f64(),
            failures.is_empty(),
        );
        if !failures.is_empty() {
            return Err(DaosError::Stor(format!(
                "mount on this host failed: {}",
                failures.join("; ")
            )));
        }
        mounted.sort_by(|a, b| (&a.node, &a.volume).cmp(&(&b.node, &b.volume)));
        local.note(&format!(
            "mounted {} filesystem(s) of {} nodes, NFS over {}, each uid {uid}'s alone: {} ({:.2}s)",
            mounted.len(),
            {
                let mut n: Vec<&str> = mounted.iter().map(|m| m.node.as_str()).collect();
                n.dedup();
                n.len()
            },
            if wants_rdma && rdma { "RDMA" } else { "TCP" },
            mounted
                .iter()
                .map(|m| m.path.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            t.elapsed().as_secs_f64()
        ));
        local.checkpoint("mounted");
        Ok(crate::nfs::job_env(&mounted))
    }

    /// Whether `name` is a `[daos.stor.NAME]` profile.
    pub fn is_stor_profile(&self, name: &str) -> bool {
        self.cfg.stor.contains_key(name)
    }

    /// Clean up `lease` if it is still active and not held: every step,
    /// all nodes; a failure holds it. `Ok(None)`: nothing to clean.
    pub async fn cleanup_for(
        &self,
        lease: &str,
        local: &dyn LocalSteps,
    ) -> Result<Option<String>, DaosError> {
        self.cleanup_on(lease, None, local).await
    }

    /// [`Daos::cleanup_for`] with the lease's client side on `client`
    /// (`None`: this host's, from the configuration).
    pub async fn cleanup_on(
        &self,
        lease: &str,
        client: Option<Host>,
        local: &dyn LocalSteps,
    ) -> Result<Option<String>, DaosError> {
        let Some(mut l) = self.active().filter(|l| l.lease == lease) else {
            return Ok(None);
        };
        if matches!(l.phase, Phase::Held { .. } | Phase::Released) {
            return Ok(None);
        }
        let _ = self.links.ensure_all_up(self.link_timeout()).await;
        let lc = match self.lifecycle(&l.profile, client) {
            Ok(lc) => lc,
            Err(e) => {
                self.hold(lease, &format!("cannot clean up: {e}"))?;
                return Err(DaosError::Unconfigured {
                    lease: lease.to_string(),
                    source: Box::new(e),
                });
            }
        };
        lc.cleanup(&mut l, local).await?;
        Ok(Some(format!(
            "lease {lease} cleaned on all nodes and released"
        )))
    }

    /// `gpuq recover`: the held (or abandoned) lease, from its first
    /// unconfirmed step; `local` is the caller's part of that lease (see
    /// [`Daos::host`] for this host's).
    pub async fn recover(&self, local: &dyn LocalSteps) -> Result<String, DaosError> {
        self.recover_on(None, local).await
    }

    /// [`Daos::recover`] with the held lease's client side on `client`
    /// (`None`: this host's, from the configuration).
    pub async fn recover_on(
        &self,
        client: Option<Host>,
        local: &dyn LocalSteps,
    ) -> Result<String, DaosError> {
        if let Ok(Some(b)) = self.store.blocked() {
            if b.kind == gpuq_lease::HoldKind::Activating {
                return Err(DaosError::Activating {
                    name: b.lease,
                    reason: b.reason,
                });
            }
        }
        let Some(l) = self.active() else {
            return Err(LifecycleError::NothingToRecover.into());
        };
        let _ = self.links.ensure_all_up(self.link_timeout()).await;
        let lc = self.lifecycle(&l.profile, client)?;
        let lease = l.lease.clone();
        lc.recover(Some(l), local).await?;
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
        self.ask_all::<HostInstall>(self.cfg.deadlines.request, Method::GET, "/v1/install", None)
            .await
            .into_iter()
            .map(|(node, asked)| match asked {
                Asked::Answer(h) if h.host == node => h,
                // The link checked the helper's name when it came up; a
                // different name now means the socket was swapped.
                Asked::Answer(h) => {
                    let why = format!("the node helper answered as {:?}", h.host);
                    unreachable(node, why)
                }
                Asked::LinkDown(e) => unreachable(node, e),
                Asked::Failed(e) => unreachable(
                    node,
                    format!("{e}; is gpuq-node running there? (`systemctl status gpuq-node`)"),
                ),
            })
            .collect()
    }

    /// `method path` (with `body`) on every node over its link, at once
    /// (the links made first, within the link deadline), each within
    /// `deadline`; in configuration order.
    async fn ask_all<T>(
        &self,
        deadline: Duration,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Vec<(String, Asked<T>)>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let up = self.links.ensure_all_up(self.link_timeout()).await;
        let reachable: Vec<Node> = up
            .nodes
            .iter()
            .filter_map(|n| {
                let s = n.result.as_ref().ok()?;
                Some(Node::new(n.node.clone(), s.node_sock.clone()))
            })
            .collect();
        let mut answers: std::collections::HashMap<String, _> =
            call_all::<T>(&reachable, deadline, method, path, body, Retry::Refused)
                .await
                .into_iter()
                .collect();
        up.nodes
            .into_iter()
            .map(|n| {
                let asked = match (n.result, answers.remove(&n.node)) {
                    (Err(e), _) => Asked::LinkDown(e.to_string()),
                    (Ok(_), Some(Ok(v))) => Asked::Answer(v),
                    (Ok(_), Some(Err(e))) => Asked::Failed(e.to_string()),
                    (Ok(_), None) => Asked::Failed("no answer".into()),
                };
                (n.node, asked)
            })
            .collect()
    }

    /// `gpuq activate`'s plan: every node's `GET /v1/activation/plan`, at
    /// once, each within the preflight deadline (it inspects every
    /// allowlisted device as a preflight does). Results in configuration
    /// order; a node without a plan says why. Read-only everywhere.
    pub async fn activation_plan(&self) -> Vec<gpuq_protocol::node::NodePlan> {
        use gpuq_protocol::node::{ActivationPlan, NodePlan};
        let failed = |node: String, why: String| NodePlan {
            node,
            plan: None,
            error: Some(why),
        };
        self.ask_all::<ActivationPlan>(
            self.cfg.deadlines.preflight,
            Method::GET,
            "/v1/activation/plan",
            None,
        )
        .await
        .into_iter()
        .map(|(node, asked)| match asked {
            Asked::Answer(p) if p.node == node => NodePlan {
                node,
                plan: Some(p),
                error: None,
            },
            // The link checked the helper's name when it came up.
            Asked::Answer(p) => {
                let why = format!("the node helper answered as {:?}", p.node);
                failed(node, why)
            }
            Asked::LinkDown(e) => failed(node, format!("link: {e}")),
            Asked::Failed(e) => failed(node, e),
        })
        .collect()
    }

    /// `gpuq e2e`'s check of `lease` (issue #17, item 3): on this host its
    /// record says released, the active pointer is not it, no container
    /// labelled with it is left on this host's Podman and its run directory
    /// is gone; on every node, over
    /// its link (at once, within the request deadline), the node's own
    /// evidence (`GET /v1/leases/{lease}/evidence`: node record gone, no
    /// containers, the wipe audited, every allowlisted device discarded
    /// with no signature after — or in test mode the test directory gone —,
    /// metadata gone, server output kept). Read-only everywhere.
    pub async fn e2e(&self, lease: &str) -> Result<gpuq_protocol::node::E2eReport, DaosError> {
        use gpuq_protocol::node::{E2eReport, EvidenceCheck, LeaseEvidence, NodeEvidence};
        let l = self.store.load(lease).map_err(|source| DaosError::Lease {
            lease: lease.to_string(),
            source,
        })?;
        let released = l.phase == Phase::Released;
        let mut host = vec![EvidenceCheck {
            check: "lease_released".into(),
            ok: released,
            detail: format!(
                "the lease record says {}",
                l.history
                    .last()
                    .map(|e| e.what.clone())
                    .unwrap_or_else(|| format!("{:?}", l.phase))
            ),
        }];
        let active = self.store.current().ok().flatten().map(|a| a.lease);
        host.push(EvidenceCheck {
            check: "not_active".into(),
            ok: active.as_deref() != Some(lease),
            detail: match &active {
                Some(a) if a == lease => "it is still the active lease".into(),
                Some(a) => format!("the active lease is {a}"),
                None => "no lease is active".into(),
            },
        });
        host.push(
            match host_containers(&self.cfg.podman_socket, lease, self.cfg.deadlines.request).await
            {
                Ok(left) if left.is_empty() => EvidenceCheck {
                    check: "no_host_containers".into(),
                    ok: true,
                    detail: "none of its containers is left on this host".into(),
                },
                Ok(left) => EvidenceCheck {
                    check: "no_host_containers".into(),
                    ok: false,
                    detail: format!("left on this host: {}", left.join(", ")),
                },
                Err(e) => EvidenceCheck {
                    check: "no_host_containers".into(),
                    ok: false,
                    detail: e,
                },
            },
        );
        // The lease's files on this host (certificates, agent and client
        // configuration, the agent's socket directory).
        let run = self.cfg.run_dir.join(lease);
        let gone = std::fs::symlink_metadata(&run).is_err();
        host.push(EvidenceCheck {
            check: "host_files_removed".into(),
            ok: gone,
            detail: format!(
                "{} {}",
                run.display(),
                if gone { "is gone" } else { "is still there" }
            ),
        });
        let path = format!("/v1/leases/{lease}/evidence?profile={}", l.profile);
        let nodes = self
            .ask_all::<LeaseEvidence>(self.cfg.deadlines.request, Method::GET, &path, None)
            .await
            .into_iter()
            .map(|(node, asked)| {
                let (evidence, error) = match asked {
                    Asked::Answer(e) if e.node == node && e.lease == lease => (Some(e), None),
                    Asked::Answer(e) => (
                        None,
                        Some(format!(
                            "the node helper answered as {:?} for lease {:?}",
                            e.node, e.lease
                        )),
                    ),
                    Asked::LinkDown(e) => (None, Some(format!("link: {e}"))),
                    Asked::Failed(e) => (None, Some(e)),
                };
                NodeEvidence {
                    node,
                    evidence,
                    error,
                }
            })
            .collect();
        Ok(E2eReport {
            lease: lease.to_string(),
            profile: l.profile,
            released,
            host,
            nodes,
        })
    }

    /// `gpuq daos-status --lease`: the end (`tail` bytes) of the lease's
    /// server output on every node, at once, within the request deadline.
    pub async fn server_output(
        &self,
        lease: &str,
        tail: usize,
    ) -> Vec<gpuq_protocol::node::NodeOutput> {
        use gpuq_protocol::node::{NodeOutput, ServerOutput};
        let path = format!("/v1/leases/{lease}/output?tail={tail}");
        self.ask_all::<ServerOutput>(self.cfg.deadlines.request, Method::GET, &path, None)
            .await
            .into_iter()
            .map(|(node, asked)| {
                let (output, error) = match asked {
                    Asked::Answer(o) if o.node == node && o.lease == lease => (Some(o), None),
                    Asked::Answer(o) => (
                        None,
                        Some(format!(
                            "the node helper answered as {:?} for lease {:?}",
                            o.node, o.lease
                        )),
                    ),
                    Asked::LinkDown(e) => (None, Some(format!("link: {e}"))),
                    Asked::Failed(e) => (None, Some(e)),
                };
                NodeOutput {
                    node,
                    output,
                    error,
                }
            })
            .collect()
    }

    /// Whether the store has a record of `lease`.
    pub fn has_lease(&self, lease: &str) -> bool {
        gpuq_protocol::node::valid_lease(lease)
            && self.store.dir().join(format!("{lease}.json")).is_file()
    }

    /// The lease records of job `job` (`job<ID>-<time>`), newest first.
    pub fn leases_of_job(&self, job: u64) -> Vec<String> {
        let prefix = format!("job{job}-");
        let mut found: Vec<(i64, String)> = std::fs::read_dir(self.store.dir())
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let lease = name.strip_suffix(".json")?.to_string();
                let time: i64 = lease.strip_prefix(&prefix)?.parse().ok()?;
                Some((time, lease))
            })
            .collect();
        found.sort_by(|a, b| b.cmp(a));
        found.into_iter().map(|(_, l)| l).collect()
    }

    /// `gpuq activate --execute`, first step: the activation's hold,
    /// durable before any node is touched (refused beside a lease or a
    /// cleanup's hold; an unfinished activation's hold is returned, to be
    /// resumed under its first name). The caller has checked that no job
    /// runs, and starts none while a hold is there.
    pub fn begin_activation(&self, name: &str) -> Result<gpuq_lease::Blocked, DaosError> {
        self.store
            .begin_activation(name, gpuq_protocol::time::now())
            .map_err(|source| DaosError::Lease {
                lease: name.to_string(),
                source,
            })
    }

    /// `gpuq activate --execute --destroy-existing-data` under `hold`
    /// ([`Daos::begin_activation`]): every node's `POST
    /// /v1/activation/execute` at once, each within the stop and wipe
    /// deadlines together (it stops units, then discards). The hold goes
    /// only when every node answered with its claim; otherwise it stays,
    /// naming the nodes that did not.
    pub async fn activate(
        &self,
        hold: &gpuq_lease::Blocked,
    ) -> Result<gpuq_protocol::node::SiteActivation, DaosError> {
        use gpuq_protocol::node::{
            ActivationReport, ActivationRequest, NodeActivation, SiteActivation,
        };
        let in_lease = |source| DaosError::Lease {
            lease: hold.lease.clone(),
            source,
        };
        let body = serde_json::to_value(ActivationRequest {
            activation: hold.lease.clone(),
        })
        .unwrap_or_default();
        let deadline = self.cfg.deadlines.stop + self.cfg.deadlines.wipe;
        let failed = |node: String, why: String| NodeActivation {
            node,
            report: None,
            error: Some(why),
        };
        let nodes: Vec<NodeActivation> = self
            .ask_all::<ActivationReport>(
                deadline,
                Method::POST,
                "/v1/activation/execute",
                Some(body),
            )
            .await
            .into_iter()
            .map(|(node, asked)| match asked {
                Asked::Answer(r) if r.node == node && r.activation == hold.lease => {
                    NodeActivation {
                        node,
                        report: Some(r),
                        error: None,
                    }
                }
                Asked::Answer(r) => {
                    let why = format!(
                        "the node helper answered as {:?} for activation {:?}",
                        r.node, r.activation
                    );
                    failed(node, why)
                }
                Asked::LinkDown(e) => failed(node, format!("link: {e}")),
                Asked::Failed(e) => failed(node, e),
            })
            .collect();
        let unfinished: Vec<String> = nodes
            .iter()
            .filter_map(|n| n.error.as_ref().map(|e| format!("{}: {e}", n.node)))
            .collect();
        let held = if unfinished.is_empty() {
            self.store.end_activation(&hold.lease).map_err(in_lease)?;
            None
        } else {
            let reason = format!(
                "activation {} did not complete on {} node(s): {}",
                hold.lease,
                unfinished.len(),
                unfinished.join("; ")
            );
            self.store
                .activation_failed(hold, &reason)
                .map_err(in_lease)?;
            Some(reason)
        };
        Ok(SiteActivation {
            activation: hold.lease.clone(),
            nodes,
            held,
        })
    }

    /// What every node's kernel offers `--stor` jobs (each helper's
    /// `GET /v1/status`), at once, each within the request deadline (at
    /// most 5 s: a submit waits for this). Results in configuration order;
    /// `Err` says why a node has no answer.
    pub async fn stor_kernels(
        &self,
    ) -> Vec<(String, Result<gpuq_protocol::node::StorKernel, String>)> {
        use gpuq_protocol::node::NodeStatus;
        self.ask_all::<NodeStatus>(
            self.cfg.deadlines.request.min(Duration::from_secs(5)),
            Method::GET,
            "/v1/status",
            None,
        )
        .await
        .into_iter()
        .map(|(node, asked)| {
            let r = match asked {
                Asked::Answer(st) if st.node != node => {
                    Err(format!("the node helper answered as {:?}", st.node))
                }
                Asked::Answer(st) => st.kernel.ok_or_else(|| {
                    "its gpuq-node does not report its kernel (older than this broker)".to_string()
                }),
                Asked::LinkDown(e) => Err(format!("not reachable: {e}")),
                Asked::Failed(e) => Err(e),
            };
            (node, r)
        })
        .collect()
    }

    /// Every node helper's `GET /v1/metrics`, at once, for a scrape of the
    /// broker's metrics endpoint: only over links that are up now (a scrape
    /// never re-makes a link), each within 2 s. Results in configuration
    /// order; `Err` says why a node has none.
    pub async fn node_metrics(
        &self,
    ) -> Vec<(String, Result<gpuq_protocol::metrics::NodeMetrics, String>)> {
        use gpuq_protocol::metrics::NodeMetrics;
        const SCRAPE: Duration = Duration::from_secs(2);
        let states = self.links.states();
        let is_up = |name: &str| states.iter().any(|(n, s)| n == name && s.is_up());
        let up: Vec<Node> = self
            .links
            .links()
            .iter()
            .filter(|l| is_up(l.name()))
            .map(|l| Node::new(l.name(), l.sockets().node_sock))
            .collect();
        let mut answers: std::collections::HashMap<String, _> = call_all::<NodeMetrics>(
            &up,
            SCRAPE,
            hyper::Method::GET,
            "/v1/metrics",
            None,
            Retry::Never,
        )
        .await
        .into_iter()
        .collect();
        self.links
            .links()
            .iter()
            .map(|l| {
                let name = l.name().to_string();
                let r = match answers.remove(&name) {
                    None => Err("link not up".to_string()),
                    Some(Err(e)) => Err(e.to_string()),
                    // The link checked the helper's name when it came up;
                    // another name now means the socket was swapped.
                    Some(Ok(m)) if m.node != name => {
                        Err(format!("the node helper answered as {:?}", m.node))
                    }
                    Some(Ok(m)) => Ok(m),
                };
                (name, r)
            })
            .collect()
    }

    pub async fn close(&self) {
        self.links.close_all().await;
    }
}

/// What asking one node over its link gave.
enum Asked<T> {
    Answer(T),
    /// The link could not be made: why.
    LinkDown(String),
    /// The call failed (deadline, refused, an error answer): why.
    Failed(String),
}

/// `f`, unless the host's preparation is told to stop first (then `f` is
/// dropped: only for futures that create nothing on this host).
async fn unless_stopped<T>(
    host: &Host,
    f: impl std::future::Future<Output = T>,
) -> Result<T, DaosError> {
    if host.stopped() {
        return Err(DaosError::Stopped);
    }
    until(&host.stop, f).await
}

/// `f`, unless `stop` is set first (then [`DaosError::Stopped`]; `f` is
/// dropped).
async fn until<T>(
    stop: &Option<tokio::sync::watch::Receiver<bool>>,
    f: impl std::future::Future<Output = T>,
) -> Result<T, DaosError> {
    let Some(mut s) = stop.clone() else {
        return Ok(f.await);
    };
    tokio::select! {
        r = f => Ok(r),
        _ = s.wait_for(|s| *s) => Err(DaosError::Stopped),
    }
}

/// Every task's answer, in order (all run at once).
async fn futures_join<T>(
    tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>,
) -> Vec<Result<T, tokio::task::JoinError>> {
    let tasks: Vec<_> = tasks.collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await);
    }
    out
}

/// The names of the containers labelled with `lease` on the Podman at `sock`.
async fn host_containers(
    sock: &Path,
    lease: &str,
    request: Duration,
) -> Result<Vec<String>, String> {
    use gpuq_podman::{LabelFilter, LibpodClient, Podman};
    let pm = LibpodClient::connect_with_timeout(sock, Some(request))
        .await
        .map_err(|e| format!("Podman at {}: {e}", sock.display()))?;
    let list = pm
        .container_list(&LabelFilter::lease(lease))
        .await
        .map_err(|e| format!("Podman at {}: {e}", sock.display()))?;
    Ok(list
        .into_iter()
        .map(|c| format!("{} ({})", c.names.first().cloned().unwrap_or(c.id), c.state))
        .collect())
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

/// The link to a host named `name` at ssh destination `host` (`port`),
/// with the `[daos]` ssh settings; its helper's socket `node_socket` and
/// Podman socket `podman_socket` there, else `[daos]`'s.
pub fn link_config(
    cfg: &DaosConfig,
    name: &str,
    host: &str,
    port: Option<u16>,
    node_socket: Option<PathBuf>,
    podman_socket: Option<PathBuf>,
) -> LinkConfig {
    LinkConfig {
        name: name.to_string(),
        host: host.to_string(),
        user: cfg.ssh_user.clone(),
        port,
        identity_file: cfg.identity_file.clone(),
        known_hosts_file: cfg.known_hosts_file.clone(),
        ssh_config_file: cfg.ssh_config_file.clone(),
        node_socket: node_socket.unwrap_or_else(|| cfg.node_socket.clone()),
        podman_socket: podman_socket.unwrap_or_else(|| cfg.node_podman_socket.clone()),
        forward_dir: cfg.forward_dir.clone(),
    }
}

/// The links' timings under `cfg`.
pub fn link_timings(cfg: &DaosConfig) -> Timings {
    Timings {
        connect_timeout: Duration::from_secs(cfg.ssh_connect_timeout_secs),
        ..Timings::default()
    }
}

/// This host's part of a lease of `profile` (its Podman, run directory,
/// the profile's image and deadlines), from the configuration alone: what
/// a process that does not drive the lease (the broker's `daos-exec` for
/// a Slurm job) needs to reach the lease's files and agent.
pub fn host_for(cfg: &DaosConfig, profile: &str) -> Result<Host, DaosError> {
    let p = cfg
        .profiles
        .get(profile)
        .ok_or_else(|| DaosError::UnknownProfile(profile.to_string()))?;
    Ok(Host::new(
        cfg.podman_socket.clone(),
        cfg.run_dir.clone(),
        HostProfile {
            name: profile.to_string(),
            image: ImageId::parse(&p.image).map_err(|source| DaosError::BadPin {
                profile: profile.to_string(),
                source,
            })?,
            system: p.system.clone(),
            port: p.port,
            nodes: cfg
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.address.clone()))
                .collect(),
            access_points: p.replicas.clone(),
            join_timeout: Duration::from_secs(cfg.join_timeout_secs),
            env: p.env.clone(),
            deadlines: cfg.deadlines,
        },
    ))
}
