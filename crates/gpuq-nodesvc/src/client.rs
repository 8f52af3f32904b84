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

#[cfg(test)]
mod tests {
    use super::*;
    use gpuq_protocol::node::ClientTls;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    fn cfg(dir: &Path, client: bool) -> ServiceConfig {
        let mut text = format!(
            "[node]\nname = \"gpu2\"\nsocket = \"{d}/node.sock\"\npodman_socket = \"{d}/podman.sock\"\njobs_dir = \"{d}/jobs\"\ntest_dir = \"{d}/test\"\n\n[profiles.test]\nimage = \"sha256:{z}\"\ndaos_version = \"2.8.0\"\nmode = \"test\"\nport = 10001\n",
            d = dir.display(),
            z = "0".repeat(64)
        );
        if client {
            text.push_str(&format!(
                "\n[client]\nrun_dir = \"{}/client\"\n",
                dir.display()
            ));
        }
        ServiceConfig::parse(&dir.join("node.toml"), &text).unwrap()
    }

    fn req(owner_uid: u32, profile: &str) -> ClientFilesRequest {
        ClientFilesRequest {
            profile: profile.into(),
            owner_uid,
            system: "daos_server".into(),
            port: 10001,
            hostlist: vec!["10.200.0.11".into()],
            access_points: vec!["10.200.0.11".into()],
            tls: ClientTls {
                ca_cert: "CA".into(),
                admin_cert: "ADMIN".into(),
                admin_key: "ADMINKEY".into(),
                agent_cert: "AGENT".into(),
                agent_key: "AGENTKEY".into(),
            },
        }
    }

    #[test]
    fn files_are_written_for_the_owner_alone_with_the_record_this_hosts_broker_reads() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path(), true);
        let r = files(&c, "slurm7-100", &req(61001, "test")).unwrap();
        assert_eq!((r.node.as_str(), r.lease.as_str()), ("gpu2", "slurm7-100"));
        let lease = dir.path().join("client/slurm7-100");
        let user = std::fs::metadata(lease.join("user")).unwrap();
        assert_eq!((user.uid(), user.mode() & 0o777), (61001, 0o500));
        let key = std::fs::metadata(lease.join("user/admin.key")).unwrap();
        assert_eq!((key.uid(), key.mode() & 0o777), (61001, 0o400));
        // The agent runs as the owner and reads its own files.
        let etc = std::fs::metadata(lease.join("agent-etc")).unwrap();
        assert_eq!((etc.uid(), etc.mode() & 0o777), (61001, 0o500));
        let key = std::fs::metadata(lease.join("agent-etc/agent.key")).unwrap();
        assert_eq!((key.uid(), key.mode() & 0o777), (61001, 0o400));
        let rec = std::fs::metadata(lease.join(gpuq_clienthost::RECORD)).unwrap();
        assert_eq!((rec.uid(), rec.mode() & 0o777), (0, 0o600));
        let run_dir = dir.path().join("client");
        assert_eq!(
            gpuq_clienthost::read_record(&run_dir, "slurm7-100").unwrap(),
            Some(gpuq_clienthost::ClientRecord {
                lease: "slurm7-100".into(),
                profile: "test".into(),
                owner_uid: 61001,
            })
        );
        assert_eq!(
            gpuq_clienthost::read_record(&run_dir, "slurm8-100").unwrap(),
            None
        );
        // A repeat (a driver that died half-way) gives the same files.
        files(&c, "slurm7-100", &req(61001, "test")).unwrap();
        assert!(
            !gpuq_clienthost::agent_up(&run_dir, "slurm7-100"),
            "no agent was started"
        );
    }

    #[test]
    fn a_request_this_host_cannot_serve_is_refused_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let without = cfg(dir.path(), false);
        let e = files(&without, "slurm7-100", &req(61001, "test")).unwrap_err();
        assert!(matches!(e, NodeError::Refused(_)), "{e}");
        assert!(e.to_string().contains("no [client] run_dir"), "{e}");
        let c = cfg(dir.path(), true);
        let cases: [(&str, ClientFilesRequest, &str); 4] = [
            ("slurm7-100", req(0, "test"), "owner_uid 0"),
            ("../x", req(61001, "test"), "lease name"),
            ("slurm7-100", req(61001, "nope"), "no profile 'nope'"),
            (
                "slurm7-100",
                ClientFilesRequest {
                    hostlist: vec![],
                    ..req(61001, "test")
                },
                "hostlist",
            ),
        ];
        for (lease, r, want) in cases {
            let e = files(&c, lease, &r).unwrap_err();
            assert!(e.to_string().contains(want), "{want}: {e}");
        }
        assert!(
            !dir.path().join("client").exists(),
            "nothing was written under the run dir"
        );
    }

    #[tokio::test]
    async fn a_step_without_client_or_with_an_unknown_profile_is_refused_before_podman() {
        let dir = tempfile::tempdir().unwrap();
        let e = step(
            &cfg(dir.path(), false),
            "slurm7-100",
            ClientStep::StopAgent,
            "test",
        )
        .await
        .unwrap_err();
        assert!(matches!(e, NodeError::Refused(_)), "{e}");
        let e = step(
            &cfg(dir.path(), true),
            "slurm7-100",
            ClientStep::StopAgent,
            "nope",
        )
        .await
        .unwrap_err();
        assert!(matches!(e, NodeError::NoProfile(_)), "{e}");
    }
}
