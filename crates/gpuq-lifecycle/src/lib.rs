//! The lease lifecycle on the four storage nodes (mission.md §4–§5).
//!
//! Every node step runs on all four nodes at once and succeeds only when all
//! four confirm it; every step is recorded in the lease ([`gpuq_lease`])
//! before the next one starts. A node that refuses or fails leaves the lease
//! **held** with the step and the node named (`blocked.json`), and no job of
//! any kind starts until [`Lifecycle::recover`] confirms every remaining step.
//!
//! The broker-local cleanup steps (end the job's unit, remove client
//! containers, stop the agent, `dmg system stop`) are the caller's, through
//! [`LocalSteps`]; this crate drives the nodes. Nodes are reached through
//! their gpuq-node sockets — in production the SSH-forwarded local sockets
//! of the node links.

pub mod config;
pub mod daos;
pub mod error;
pub mod host;
pub mod lustre;
pub mod nfs;
pub mod nodes;
pub mod stor;

pub use error::{DaosError, HostError, PrepareStep};
pub use gpuq_clienthost::ClientError;
pub use nodes::Node;
use nodes::{call_all, call_each, Retry};

use gpuq_lease::{CleanupStep, Lease, LeaseError, LeaseStore, Phase};
use gpuq_protocol::node::{
    DmgAccess, PreflightReport, PreflightRequest, ServerTls, StartReport, StartRequest, StepReport,
};
use hyper::Method;
use std::time::Duration;
use thiserror::Error;

/// How long each step of a lease may take before it fails (`[daos]` in the
/// broker's configuration; defaults generous for a slow real site). A node
/// call that misses its deadline is abandoned (its connection closed) and
/// fails naming the node: during the preparation that fails the job and
/// the cleanup runs; during the cleanup the lease is held at that step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadlines {
    /// Every small call: each Podman request on this host, a node's status.
    pub request: Duration,
    /// A node's preflight.
    pub preflight: Duration,
    /// A node's server start, which includes the node's own wait for
    /// "format required" (its profile's `format_wait_secs`, 120 s).
    pub start: Duration,
    /// `dmg storage format`.
    pub format: Duration,
    /// A node's server stop (its profile's `stop_grace_secs` included), and
    /// each of the broker's cleanup steps (kill_job, remove_clients,
    /// stop_agent, system_stop).
    pub stop: Duration,
    /// A node's wipe (BLKDISCARD of every allowlisted device, verify,
    /// audit), and this host's part of that step.
    pub wipe: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            request: Duration::from_secs(60),
            preflight: Duration::from_secs(120),
            start: Duration::from_secs(600),
            format: Duration::from_secs(900),
            stop: Duration::from_secs(600),
            wipe: Duration::from_secs(3600),
        }
    }
}

/// A failure of this host's part of a step: what happened and, when it is
/// one node's doing (a rank that would not stop in `dmg system stop`),
/// that node: the hold names it. Never parsed back out of the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalError {
    pub node: Option<String>,
    pub message: String,
}

impl LocalError {
    pub fn on(node: impl Into<String>, message: impl Into<String>) -> Self {
        LocalError {
            node: Some(node.into()),
            message: message.into(),
        }
    }
}

impl From<String> for LocalError {
    fn from(message: String) -> Self {
        LocalError {
            node: None,
            message,
        }
    }
}

impl From<HostError> for LocalError {
    fn from(e: HostError) -> Self {
        LocalError {
            node: e.node().map(str::to_string),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for LocalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// `f`, or past `deadline` an error saying so (`f` is dropped: whatever it
/// waited for is abandoned).
async fn within<T, E: From<String>>(
    deadline: Duration,
    what: impl std::fmt::Display,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    match tokio::time::timeout(deadline, f).await {
        Ok(r) => r,
        Err(_) => Err(E::from(format!(
            "{what} did not finish within {}s (the deadline); abandoned",
            deadline.as_secs_f64()
        ))),
    }
}

/// One node's (or this host's: `node` is `None`) failure in a cleanup step.
#[derive(Debug, Clone)]
struct Failure {
    /// Who failed: a node, or this host (`broker`).
    host: Option<String>,
    /// The node the failure names, if any (the host's, or the one a broker
    /// step's error names).
    node: Option<String>,
    message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            self.host.as_deref().unwrap_or("broker"),
            self.message
        )
    }
}

/// What the caller of a lease (the broker, a test, an example) does for
/// it — the narrow interface: end the job's processes, take its progress
/// lines, its step times and its checkpoints. Everything else of a lease,
/// this host's containers included, is the lifecycle's.
#[async_trait::async_trait]
pub trait LocalSteps: Send + Sync {
    /// The cleanup's `kill_job`: end every process of the lease's job and
    /// confirm that none is left; an error holds the lease.
    async fn kill_job(&self, lease: &Lease) -> Result<String, LocalError>;

    /// A progress line for whoever watches (the broker writes it into the
    /// job's log as a `gpuq:` line).
    fn note(&self, _line: &str) {}

    /// One step of the lease ended after `secs`: `phase` is `prepare` or
    /// `cleanup`, `step` its name (`preflight`, `start_servers`, a cleanup
    /// step's record name), `ok` whether it was confirmed (a cleanup step
    /// that was not holds the lease). The broker's metrics count these.
    fn timed(&self, _phase: &str, _step: &str, _secs: f64, _ok: bool) {}

    /// Called when the lifecycle reaches a named point (after the state of
    /// that point is durable). The broker's test build can abort there
    /// (crash tests); otherwise nothing happens.
    fn checkpoint(&self, _point: &str) {}
}

fn secs(t: std::time::Instant) -> String {
    format!("{:.2}s", t.elapsed().as_secs_f64())
}

#[derive(Debug, Error)]
pub enum LifecycleError {
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("preflight refused lease {lease}: {}", .reasons.join("; "))]
    Refused { lease: String, reasons: Vec<String> },
    #[error("lease {lease}: {step} failed on {}; the lease is held (run `gpuq recover` after fixing it)", .failures.join("; "))]
    Held {
        lease: String,
        step: String,
        failures: Vec<String>,
    },
    #[error("no lease is held; nothing to recover")]
    NothingToRecover,
}

use gpuq_protocol::time::now;

#[derive(Debug)]
pub struct Lifecycle {
    pub store: LeaseStore,
    pub nodes: Vec<Node>,
    pub profile: String,
    /// Management-service replicas passed to every node's start.
    pub replicas: Vec<String>,
    /// Each step's deadline.
    pub deadlines: Deadlines,
    /// The lease's server certificate, key, CA and agent certificate,
    /// passed to every node's start (its control port then requires mutual
    /// TLS); see gpuq-leasecert.
    pub tls: Option<ServerTls>,
    /// The node that runs the broker's `dmg` in its server container, and
    /// what it needs for that (sent in that node's start only; see
    /// gpuq-nodesvc's `dmg` module).
    pub dmg: Option<(String, DmgAccess)>,
    /// This host's part of the lease (agent and client containers,
    /// the lease's files): the cleanup's `remove_clients`, `stop_agent`,
    /// `system_stop` and its part of `wipe`. `None`: a lifecycle of the
    /// nodes alone (its host steps confirm that there is nothing).
    pub host: Option<host::Host>,
    /// What a lease this lifecycle creates stands up (a lease it cleans
    /// says so itself, in its record).
    pub kind: gpuq_lease::LeaseKind,
    /// `--stor nfsrdma`: this host's side (its address, where it mounts).
    pub nfs: Option<config::NfsClient>,
}

impl Lifecycle {
    /// Create the lease (durable first) and preflight all nodes; the lease
    /// stays `preparing` (the caller starts the servers, formats, waits for
    /// the joins, then [`Lifecycle::mark_running`]). On a refusal nothing
    /// was started, so nothing needs wiping, but the lease still goes
    /// cleaning → released, and the error names every node's reasons.
    pub async fn preflight(
        &self,
        lease: &str,
        owner: &str,
        local: &dyn LocalSteps,
    ) -> Result<Lease, LifecycleError> {
        let mut l = self
            .store
            .create_kind(lease, owner, &self.profile, self.kind, now())?;
        local.note(&format!(
            "lease {lease} created (durable) for profile {}",
            self.profile
        ));
        local.checkpoint("lease_created");
        let t = std::time::Instant::now();
        let req = PreflightRequest {
            lease: lease.to_string(),
            profile: self.profile.clone(),
        };
        let pre = call_all::<PreflightReport>(
            &self.nodes,
            self.deadlines.preflight,
            Method::POST,
            "/v1/preflight",
            Some(json(&req)),
            Retry::Refused,
        )
        .await;
        let mut reasons = Vec::new();
        for (node, r) in &pre {
            match r {
                Ok(rep) => reasons.extend(
                    rep.findings
                        .iter()
                        .map(|f| format!("{node}: {}: {}", f.reason, f.detail)),
                ),
                Err(e) => reasons.push(format!("{node}: {e}")),
            }
        }
        local.timed(
            "prepare",
            "preflight",
            t.elapsed().as_secs_f64(),
            reasons.is_empty(),
        );
        if !reasons.is_empty() {
            local.note(&format!(
                "preflight refused ({}): {}",
                secs(t),
                reasons.join("; ")
            ));
            // Nothing was started anywhere: every step is confirmed as such
            // without calling the nodes (a node holding another lease would
            // rightly refuse a stop for this one), and the lease is released.
            self.store.transition(&mut l, Phase::Cleaning, now())?;
            for &step in self.kind.steps() {
                self.store.step_done(
                    &mut l,
                    step,
                    "nothing was started: preflight refused",
                    now(),
                )?;
            }
            self.store.release(&mut l, now())?;
            return Err(LifecycleError::Refused {
                lease: lease.to_string(),
                reasons,
            });
        }
        local.note(&format!(
            "preflight passed on {} nodes ({})",
            self.nodes.len(),
            secs(t)
        ));
        local.checkpoint("preflight_passed");
        Ok(l)
    }

    /// Create the lease (durable first), preflight all nodes, start all
    /// servers: [`Lifecycle::preflight`] then [`Lifecycle::start_servers`].
    pub async fn prepare(
        &self,
        lease: &str,
        owner: &str,
        local: &dyn LocalSteps,
    ) -> Result<Lease, LifecycleError> {
        let mut l = self.preflight(lease, owner, local).await?;
        self.start_servers(&mut l, local).await?;
        Ok(l)
    }

    /// Start the servers of a preflighted lease on all nodes at once. A
    /// failure cleans the lease up (and holds it if that fails too).
    /// `Ok(true)`: every node saw its server await the format.
    pub async fn start_servers(
        &self,
        l: &mut Lease,
        local: &dyn LocalSteps,
    ) -> Result<bool, LifecycleError> {
        let t = std::time::Instant::now();
        let start = |node: &str| {
            let dmg = self
                .dmg
                .as_ref()
                .filter(|(n, _)| n == node)
                .map(|(_, a)| a.clone());
            Some(json(&StartRequest {
                profile: self.profile.clone(),
                replicas: self.replicas.clone(),
                tls: self.tls.clone(),
                dmg,
            }))
        };
        let started: Vec<StartReport> = self
            .on_all_nodes(l, "start", &start, local, "start_servers", "server start")
            .await?;
        let awaiting = started.iter().all(|s| s.awaiting_format);
        local.note(&format!(
            "servers started on {} nodes{} ({})",
            self.nodes.len(),
            if awaiting {
                ", all awaiting format"
            } else {
                ""
            },
            secs(t)
        ));
        local.checkpoint("servers_started");
        Ok(awaiting)
    }

    /// `--stor nvmeof`: export the lease's namespaces on all nodes at
    /// once, for the host NQN of `host_token`. A failure cleans the lease
    /// up (and holds it if that fails too).
    pub async fn export_all(
        &self,
        l: &mut Lease,
        host_token: &str,
        local: &dyn LocalSteps,
    ) -> Result<Vec<gpuq_protocol::node::ExportReport>, LifecycleError> {
        let req = json(&gpuq_protocol::node::ExportRequest {
            profile: self.profile.clone(),
            host_token: host_token.to_string(),
        });
        self.export_on_all_nodes(
            l,
            "export",
            req,
            local,
            |r: &gpuq_protocol::node::ExportReport| {
                format!(
                    "{} {} namespace(s) on {} {}:{}",
                    r.node,
                    r.export.namespaces.len(),
                    r.export.transport,
                    r.export.address,
                    r.export.port
                )
            },
        )
        .await
    }

    /// `--stor nfsrdma`: export the lease's filesystems on all nodes at
    /// once, for this host's address and the job owner. A failure cleans
    /// the lease up (and holds it if that fails too).
    pub async fn nfs_export_all(
        &self,
        l: &mut Lease,
        client_address: &str,
        uid: u32,
        gid: u32,
        local: &dyn LocalSteps,
    ) -> Result<Vec<gpuq_protocol::node::NfsExportReport>, LifecycleError> {
        let req = json(&gpuq_protocol::node::NfsExportRequest {
            profile: self.profile.clone(),
            client_address: client_address.to_string(),
            owner_uid: uid,
            owner_gid: gid,
        });
        self.export_on_all_nodes(
            l,
            "nfs-export",
            req,
            local,
            |r: &gpuq_protocol::node::NfsExportReport| {
                format!(
                    "{} {} xfs on {} {}:{}",
                    r.node,
                    r.nfs.volumes.len(),
                    r.nfs.transport,
                    r.nfs.address,
                    r.nfs.port
                )
            },
        )
        .await
    }

    /// `POST /v1/leases/L/<verb>` with `req` on all nodes at once,
    /// described in the job's log (`exported on N nodes: …`, checkpoint
    /// `exported`): [`Lifecycle::on_all_nodes`] timed as `export`.
    async fn export_on_all_nodes<T>(
        &self,
        l: &mut Lease,
        verb: &str,
        req: serde_json::Value,
        local: &dyn LocalSteps,
        describe: impl Fn(&T) -> String,
    ) -> Result<Vec<T>, LifecycleError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let t = std::time::Instant::now();
        let reports: Vec<T> = self
            .on_all_nodes(l, verb, &|_| Some(req.clone()), local, "export", "export")
            .await?;
        local.note(&format!(
            "exported on {} nodes: {} ({})",
            reports.len(),
            reports.iter().map(&describe).collect::<Vec<_>>().join(", "),
            secs(t)
        ));
        local.checkpoint("exported");
        Ok(reports)
    }

    /// A preparation step on every node at once: `POST
    /// /v1/leases/L/<verb>`, each node's body from `body_of` (the start
    /// deadline; a node whose link is re-made is asked again), timed as
    /// the preparation's `step`. All must answer: on any failure the job
    /// log says `<what> failed` with each node's reason, the lease is
    /// cleaned up (and held if that fails too) and the start refused,
    /// naming the nodes. The reports in the nodes' order.
    async fn on_all_nodes<T>(
        &self,
        l: &mut Lease,
        verb: &str,
        body_of: &(dyn Fn(&str) -> Option<serde_json::Value> + Sync),
        local: &dyn LocalSteps,
        step: &str,
        what: &str,
    ) -> Result<Vec<T>, LifecycleError>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let lease = l.lease.clone();
        let t = std::time::Instant::now();
        let answers = call_each::<T>(
            &self.nodes,
            self.deadlines.start,
            Method::POST,
            &format!("/v1/leases/{lease}/{verb}"),
            body_of,
            Retry::Refused,
        )
        .await;
        let failures: Vec<String> = answers
            .iter()
            .filter_map(|(node, r)| r.as_ref().err().map(|e| format!("{node}: {e}")))
            .collect();
        local.timed(
            "prepare",
            step,
            t.elapsed().as_secs_f64(),
            failures.is_empty(),
        );
        if !failures.is_empty() {
            local.note(&format!(
                "{what} failed ({}): {}",
                secs(t),
                failures.join("; ")
            ));
            self.store.transition(l, Phase::Cleaning, now())?;
            self.cleanup(l, local).await?;
            return Err(LifecycleError::Refused {
                lease,
                reasons: failures,
            });
        }
        Ok(answers.into_iter().filter_map(|(_, r)| r.ok()).collect())
    }

    /// This host's cleanup steps: the caller's `kill_job`, then this
    /// host's containers (none without [`Lifecycle::host`]).
    async fn host_step(
        &self,
        local: &dyn LocalSteps,
        l: &Lease,
        step: CleanupStep,
    ) -> Result<String, LocalError> {
        let lease = l.lease.as_str();
        let Some(host) = &self.host else {
            return match step {
                CleanupStep::KillJob => local.kill_job(l).await,
                _ => Ok("no host part in this lifecycle".into()),
            };
        };
        match step {
            CleanupStep::KillJob => local.kill_job(l).await,
            CleanupStep::RemoveClients => Ok(host.remove_clients(lease).await?),
            CleanupStep::StopAgent => Ok(host.stop_agent(lease).await?),
            CleanupStep::SystemStop => Ok(host.system_stop(lease).await?),
            CleanupStep::StopServers
            | CleanupStep::Wipe
            | CleanupStep::Disconnect
            | CleanupStep::Unexport
            | CleanupStep::Unmount => {
                Err(format!("{step:?} is not this host's container step").into())
            }
        }
    }

    /// What this host does while a step runs: the agent's container goes
    /// while `dmg system stop` runs (its process is gone: `stop_agent`
    /// confirmed it), the lease's files while the nodes wipe (after the servers are stopped: the removal competed
    /// with theirs).
    async fn host_alongside(
        &self,
        l: &Lease,
        step: CleanupStep,
    ) -> Result<Option<String>, LocalError> {
        let Some(host) = &self.host else {
            return Ok(None);
        };
        match step {
            CleanupStep::SystemStop => Ok(Some(host.remove_agent(&l.lease).await?)),
            CleanupStep::Wipe => Ok(Some(host.remove_lease_files(&l.lease).await?)),
            _ => Ok(None),
        }
    }

    /// The system is ready (formatted, joined, agent up): the job may run.
    pub fn mark_running(&self, l: &mut Lease) -> Result<(), LifecycleError> {
        self.store.transition(l, Phase::Running, now())?;
        Ok(())
    }

    /// From the first unconfirmed step to the release; any failure holds.
    pub async fn cleanup(
        &self,
        l: &mut Lease,
        local: &dyn LocalSteps,
    ) -> Result<(), LifecycleError> {
        if matches!(
            l.phase,
            Phase::Preparing | Phase::Running | Phase::Held { .. }
        ) {
            self.store.transition(l, Phase::Cleaning, now())?;
        }
        while let Some(step) = l.next_step() {
            local.checkpoint(&format!("before_{}", step_name(step)));
            let t = std::time::Instant::now();
            let result: Result<String, Vec<Failure>> = match step {
                CleanupStep::KillJob
                | CleanupStep::RemoveClients
                | CleanupStep::StopAgent
                | CleanupStep::SystemStop => {
                    // This host's work (the runner, this host's Podman)
                    // has the stop deadline too.
                    let d = self.deadlines.stop;
                    let name = step_name(step);
                    let (done, here) = tokio::join!(
                        within(d, &name, self.host_step(local, l, step)),
                        within(
                            d,
                            format!("{name} (alongside)"),
                            self.host_alongside(l, step)
                        ),
                    );
                    match (done, here) {
                        (Ok(d), Ok(None)) => Ok(d),
                        (Ok(d), Ok(Some(h))) => Ok(format!("{d}; {h}")),
                        (d, h) => Err(d
                            .err()
                            .into_iter()
                            .chain(h.err())
                            .map(|e| Failure {
                                host: None,
                                node: e.node,
                                message: e.message,
                            })
                            .collect()),
                    }
                }
                CleanupStep::Disconnect => {
                    // This host's NVMe-oF controllers of the lease.
                    let lease = l.lease.clone();
                    within(self.deadlines.stop, "disconnect", async move {
                        tokio::task::spawn_blocking(move || crate::stor::disconnect_lease(&lease))
                            .await
                            .map_err(|e| format!("the disconnect ended without an answer: {e}"))?
                    })
                    .await
                    .map_err(|message: String| {
                        vec![Failure {
                            host: None,
                            node: None,
                            message,
                        }]
                    })
                }
                CleanupStep::Unmount => {
                    // This host's NFS mounts of the lease.
                    let lease = l.lease.clone();
                    let dir = self
                        .nfs
                        .as_ref()
                        .map(|n| n.mount_dir.clone())
                        .unwrap_or_else(|| config::DEFAULT_STOR_MOUNT_DIR.into());
                    within(self.deadlines.stop, "unmount", async move {
                        tokio::task::spawn_blocking(move || crate::nfs::unmount_lease(&dir, &lease))
                            .await
                            .map_err(|e| format!("the unmount ended without an answer: {e}"))?
                    })
                    .await
                    .map_err(|message: String| {
                        vec![Failure {
                            host: None,
                            node: None,
                            message,
                        }]
                    })
                }
                CleanupStep::StopServers | CleanupStep::Wipe | CleanupStep::Unexport => {
                    let verb = match step {
                        CleanupStep::Wipe => "wipe",
                        CleanupStep::Unexport => "unexport",
                        _ => "stop",
                    };
                    let path = format!("/v1/leases/{}/{verb}", l.lease);
                    let d = if step == CleanupStep::Wipe {
                        self.deadlines.wipe
                    } else {
                        self.deadlines.stop
                    };
                    // Every node at once, each within the step's deadline
                    // (a node that misses it fails the step: held); a node
                    // whose link is being re-made is asked again
                    // (nodes.rs). The steps are idempotent; any other
                    // error holds at once.
                    let (res, here) = tokio::join!(
                        call_all::<StepReport>(
                            &self.nodes,
                            d,
                            Method::POST,
                            &path,
                            None,
                            Retry::Refused
                        ),
                        within(
                            d,
                            format!("{} on this host", step_name(step)),
                            self.host_alongside(l, step)
                        )
                    );
                    let mut failures: Vec<Failure> = res
                        .iter()
                        .filter_map(|(node, r)| {
                            r.as_ref().err().map(|e| Failure {
                                host: Some(node.clone()),
                                node: Some(node.clone()),
                                message: e.to_string(),
                            })
                        })
                        .collect();
                    if let Err(e) = &here {
                        failures.push(Failure {
                            host: None,
                            node: e.node.clone(),
                            message: e.message.clone(),
                        });
                    }
                    if failures.is_empty() {
                        let mut done: Vec<String> = res
                            .into_iter()
                            .filter_map(|(node, r)| r.ok().map(|s| format!("{node}: {}", s.detail)))
                            .collect();
                        if let Ok(Some(d)) = here {
                            done.push(format!("broker: {d}"));
                        }
                        Ok(done.join("; "))
                    } else {
                        Err(failures)
                    }
                }
            };
            local.timed(
                "cleanup",
                &step_name(step),
                t.elapsed().as_secs_f64(),
                result.is_ok(),
            );
            match result {
                Ok(detail) => {
                    let detail = format!("{detail} ({})", secs(t));
                    local.note(&format!("cleanup {}: {detail}", step_name(step)));
                    self.store.step_done(l, step, &detail, now())?
                }
                Err(failures) => {
                    let failures_text: Vec<String> =
                        failures.iter().map(|f| f.to_string()).collect();
                    local.note(&format!(
                        "cleanup {} FAILED ({}): {}",
                        step_name(step),
                        secs(t),
                        failures_text.join("; ")
                    ));
                    // The hold names the first failure's node: a node's own,
                    // or the one a broker step's error names, else `broker`.
                    let node = failures
                        .first()
                        .map(|f| f.node.clone().unwrap_or_else(|| "broker".to_string()));
                    let failures = failures_text;
                    let reason = format!("{} failed: {}", step_name(step), failures.join("; "));
                    self.store
                        .hold(l, Some(step), node.as_deref(), &reason, now())?;
                    return Err(LifecycleError::Held {
                        lease: l.lease.clone(),
                        step: step_name(step),
                        failures,
                    });
                }
            }
        }
        local.checkpoint("before_release");
        self.store.release(l, now())?;
        local.note(&format!("lease {} released", l.lease));
        Ok(())
    }

    /// `gpuq recover`: retry the held lease's cleanup from its first
    /// unconfirmed step; the hold goes only when every step is confirmed.
    pub async fn recover(
        &self,
        held: Option<Lease>,
        local: &dyn LocalSteps,
    ) -> Result<String, LifecycleError> {
        let mut l = match held {
            Some(l) => l,
            None => {
                let b = self
                    .store
                    .blocked()?
                    .ok_or(LifecycleError::NothingToRecover)?;
                self.store.load(&b.lease)?
            }
        };
        self.cleanup(&mut l, local).await?;
        Ok(l.lease)
    }
}

/// A request body as JSON (every node gets the same).
fn json(v: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// The step's name as the lease record spells it (`kill_job`, `wipe`, ...).
pub fn step_name(step: CleanupStep) -> String {
    serde_json::to_value(step)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{step:?}"))
}
