//! The link to a job's own GPU host, when that is not this host
//! (`[[slurm.gpu_hosts]]`): its gpuq-node makes and removes the lease's
//! client side (files, agent) there, asked over an SSH-forwarded socket
//! like the storage nodes'. For a job on `agent_host` there is no link:
//! the client side is this host's own ([`gpuq_lifecycle::daos::Daos::host`]).

use crate::Config;
use gpuq_lifecycle::daos::{link_config, link_timings, Daos};
use gpuq_lifecycle::host::Host;
use gpuq_lifecycle::Node;
use gpuq_nodelink::NodeLinks;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct ClientLink {
    /// The job's host's link and its helper's run dir; `Ok(None)`: the
    /// job is on this host; `Err`: its host cannot be reached as configured.
    remote: Result<Option<(NodeLinks, PathBuf)>, String>,
    timeout: Duration,
}

impl ClientLink {
    /// Start the link to `host` (a job record's; `None`: this host).
    pub(crate) fn start(cfg: &Config, host: Option<&str>) -> ClientLink {
        let timeout = Duration::from_secs(cfg.daos.link_timeout_secs);
        let remote = match host {
            None => Ok(None),
            Some(name) => match cfg.gpu_host(name) {
                None => Err(format!(
                    "the job's GPU host {name} is not in [[slurm.gpu_hosts]] any more; an operator must look"
                )),
                Some(g) => NodeLinks::new(
                    vec![link_config(
                        &cfg.daos,
                        &g.name,
                        &g.host,
                        g.port,
                        g.node_socket.clone(),
                        Some(g.podman_socket.clone()),
                    )],
                    link_timings(&cfg.daos),
                )
                .map(|links| {
                    links.start_all();
                    Some((links, g.run_dir.clone()))
                })
                .map_err(|e| format!("link to {name}: {e}")),
            },
        };
        ClientLink { remote, timeout }
    }

    /// The lease's part on the job's other GPU host, through its helper;
    /// `Ok(None)`: the job is on this host (its part is
    /// [`Daos::host`]'s). A link that is not up yet still gives a host
    /// (its calls then fail, naming the host, and the lease holds); `Err`
    /// when the job's host cannot be named as configured.
    pub(crate) async fn host(&self, daos: &Daos, profile: &str) -> Result<Option<Host>, String> {
        match &self.remote {
            Err(e) => Err(e.clone()),
            Ok(None) => Ok(None),
            Ok(Some((links, run_dir))) => {
                let up = links.ensure_all_up(self.timeout).await;
                for n in &up.nodes {
                    if let Err(e) = &n.result {
                        crate::say(&format!(
                            "gpuq-slurm: the link to {} is not up: {e}",
                            n.node
                        ));
                    }
                }
                let l = links
                    .links()
                    .first()
                    .ok_or_else(|| "no link to the job's host".to_string())?;
                let node = Node::new(l.name(), l.sockets().node_sock);
                daos.remote_host(profile, node, run_dir.clone())
                    .map(Some)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// [`ClientLink::host`] for a cleanup of `lease`: when the job's other
    /// host cannot be named, the lease is held with that reason (a cleanup
    /// on this host instead would confirm nothing of that host's part).
    pub(crate) async fn cleanup_host(
        &self,
        daos: &Daos,
        profile: &str,
        lease: &str,
    ) -> Result<Option<Host>, crate::Error> {
        match self.host(daos, profile).await {
            Ok(h) => Ok(h),
            Err(e) => {
                let reason = format!("cannot clean up the lease's part on its GPU host: {e}");
                let held = daos.hold(lease, &reason);
                Err(crate::Error::Held(format!(
                    "lease {lease}: {reason}{}; an operator runs `gpuq-slurm recover` once it is mended",
                    held.err().map(|e| format!(" (and holding it failed: {e})")).unwrap_or_default()
                )))
            }
        }
    }

    pub(crate) async fn close(&self) {
        if let Ok(Some((links, _))) = &self.remote {
            links.close_all().await;
        }
    }
}
