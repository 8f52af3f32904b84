//! A lease's client side on a GPU host whose helper has `[client]`: the
//! host a Slurm job was placed on (docs/slurm.md). The lease's driver
//! (gpuq-slurm on the controller) asks, over this host's node link:
//! `files` (the lease's control and agent configs, its certificates, the
//! agent's socket dir under `[client] run_dir`), `start-agent`, and at
//! cleanup `remove-clients`, `stop-agent`, `remove-agent`, `remove-files`
//! — gpuq-clienthost's steps, on this host's Podman, with this helper's
//! own profile's pinned image (never one the request names).
//!
//! `files` also writes `client.json` (gpuq-clienthost's `ClientRecord`):
//! the lease's profile and owner, which this host's broker reads to serve
//! `gpuq daos-exec` inside the job.
//!
//! Every step is idempotent (a repeat finds nothing to do and says so):
//! a driver that died half-way repeats it.

use crate::profile::ServiceConfig;
use crate::service::NodeError;
use gpuq_clienthost::{ClientHost, ClientProfile};
use gpuq_protocol::node::{valid_lease, ClientFilesRequest, ClientStep, StepReport};
use std::time::Duration;

/// Every Podman request of a client step.
const REQUEST: Duration = Duration::from_secs(30);

/// The client side of `profile` on this host; `files`: the request that
/// says what the files hold (the other steps need only the image).
fn host(
    cfg: &ServiceConfig,
    lease: &str,
    profile: &str,
    files: Option<&ClientFilesRequest>,
) -> Result<ClientHost, NodeError> {
    if !valid_lease(lease) {
        return Err(NodeError::BadRequest(format!(
            "lease name {lease:?}: letters, digits, - and _ only"
        )));
    }
    let Some(run_dir) = &cfg.client_run_dir else {
        return Err(NodeError::Refused(format!(
            "{} serves no lease's client side: its node.toml has no [client] run_dir",
            cfg.node.node.name
        )));
    };
    let p = cfg
        .profiles
        .get(profile)
        .ok_or_else(|| NodeError::NoProfile(profile.to_string()))?;
    let (system, port, hostlist, access_points) = match files {
        Some(f) => (
            f.system.clone(),
            f.port,
            f.hostlist.clone(),
            f.access_points.clone(),
        ),
        None => (String::new(), p.port, Vec::new(), Vec::new()),
    };
    Ok(ClientHost::new(
        cfg.node.node.podman_socket.clone(),
        run_dir.clone(),
        ClientProfile {
            image: p.image.clone(),
            system,
            port,
            hostlist,
            access_points,
            request: REQUEST,
        },
    ))
}

fn report(cfg: &ServiceConfig, lease: &str, detail: String) -> StepReport {
    StepReport {
        node: cfg.node.node.name.clone(),
        lease: lease.to_string(),
        already_done: detail.starts_with("no "),
        detail,
    }
}

fn failed(e: gpuq_clienthost::ClientError) -> NodeError {
    NodeError::Failed(e.to_string())
}

/// `POST /v1/clients/{lease}/files`.
pub fn files(
    cfg: &ServiceConfig,
    lease: &str,
    req: &ClientFilesRequest,
) -> Result<StepReport, NodeError> {
    if req.owner_uid == 0 {
        return Err(NodeError::BadRequest(
            "owner_uid 0: a lease's admin certificate is never root's".into(),
        ));
    }
    if req.hostlist.is_empty() || req.access_points.is_empty() {
        return Err(NodeError::BadRequest(
            "hostlist and access_points must name the lease's servers".into(),
        ));
    }
    let h = host(cfg, lease, &req.profile, Some(req))?;
    let d = h
        .prepare_files(lease, &req.tls, req.owner_uid)
        .map_err(failed)?;
    // Whose lease it is, for this host's broker (`gpuq daos-exec`).
    h.write_record(&gpuq_clienthost::ClientRecord {
        lease: lease.to_string(),
        profile: req.profile.clone(),
        owner_uid: req.owner_uid,
    })
    .map_err(failed)?;
    Ok(report(cfg, lease, d))
}

/// `POST /v1/clients/{lease}/{step}`.
pub async fn step(
    cfg: &ServiceConfig,
    lease: &str,
    step: ClientStep,
    profile: &str,
) -> Result<StepReport, NodeError> {
    let h = host(cfg, lease, profile, None)?;
    let d = match step {
        ClientStep::StartAgent => h.start_agent(lease).await,
        ClientStep::RemoveClients => h.remove_clients(lease).await,
        ClientStep::StopAgent => h.stop_agent(lease).await,
        ClientStep::RemoveAgent => h.remove_agent(lease).await,
        ClientStep::RemoveFiles => h.remove_lease_files(lease).await,
    }
    .map_err(failed)?;
    Ok(report(cfg, lease, d))
}
