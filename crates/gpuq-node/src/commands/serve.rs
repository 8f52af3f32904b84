//! `gpuq-node serve`: the node daemon. Connects to this node's Podman API
//! (refusing Podman older than 4.3), binds the root-only socket and serves
//! the lease API of `gpuq-nodesvc` until SIGTERM.

use crate::Exit;
use gpuq_nodesvc::profile::ServiceConfig;

pub fn run(cfg: ServiceConfig) -> Exit {
    // Before anything else (log set-up, Podman, the socket): a disabled
    // node starts nothing at all.
    if let Err(why) = refuse_if_disabled(&cfg) {
        eprintln!("gpuq-node: {why}");
        return Exit::Config;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPUQ_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("gpuq-node: serve must run as root (it drives rootful Podman and block devices)");
        return Exit::Usage;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Named for `top -H` and profiles (default: tokio-rt-worker).
        .thread_name("gpuq-node")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuq-node: cannot start: {e}");
            return Exit::Failed;
        }
    };
    match rt.block_on(serve(cfg)) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            eprintln!("gpuq-node: {e}");
            Exit::Failed
        }
    }
}

/// `[node] enabled = false`: one line saying so and what to do.
fn refuse_if_disabled(cfg: &ServiceConfig) -> Result<(), String> {
    if cfg.node.node.enabled == Some(false) {
        return Err(format!(
            "DAOS is disabled on this node (enabled = false in [node] of {}); serve does not start. \
             Fill in this node's [[devices]] and [profiles], set enabled = true, then start gpuq-node",
            cfg.source.display()
        ));
    }
    Ok(())
}

async fn serve(cfg: ServiceConfig) -> Result<(), String> {
    let podman_socket = cfg.node.node.podman_socket.clone();
    let socket = cfg.node.node.socket.clone();
    let podman = gpuq_podman::LibpodClient::connect(&podman_socket)
        .await
        .map_err(|e| e.to_string())?;
    let listener = gpuq_nodesvc::server::bind(&socket)
        .map_err(|e| format!("cannot bind {}: {e}", socket.display()))?;
    let name = cfg.node.node.name.clone();
    let service = gpuq_nodesvc::service::NodeService::new(cfg, podman);
    // A --stor nfsrdma lease exported before a restart: its kernel server
    // and mounts outlived the helper; answer its upcalls again.
    match service.resume_nfs() {
        Ok(Some(lease)) => {
            tracing::info!(lease = %lease, "answering the NFS upcalls of the lease exported here again")
        }
        Ok(None) => {}
        Err(e) => {
            tracing::error!(error = %e, "cannot answer the NFS upcalls of the lease exported here")
        }
    }
    tracing::info!(node = %name, socket = %socket.display(), "gpuq-node serving");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        _ = gpuq_nodesvc::server::serve(listener, service) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    // Lease state lives on disk and in Podman; nothing is stopped here.
    let _ = std::fs::remove_file(&socket);
    tracing::info!("gpuq-node stopping; containers of the current lease keep running");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A disabled node refuses before it binds its socket or asks Podman
    /// anything: the socket does not appear and a listening "Podman" gets
    /// no connection.
    #[test]
    fn a_disabled_node_starts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("node.sock");
        let podman = dir.path().join("podman.sock");
        let fake_podman = UnixListener::bind(&podman).unwrap();
        fake_podman.set_nonblocking(true).unwrap();
        let text = format!(
            "[node]\nname = \"da1\"\nenabled = false\nsocket = \"{}\"\npodman_socket = \"{}\"\n\
             jobs_dir = \"{}/jobs\"\ntest_dir = \"{}/test\"\n",
            sock.display(),
            podman.display(),
            dir.path().display(),
            dir.path().display()
        );
        let path = dir.path().join("node.toml");
        let cfg = ServiceConfig::parse(&path, &text).unwrap();
        let why = refuse_if_disabled(&cfg).unwrap_err();
        assert!(
            why.contains("DAOS is disabled on this node (enabled = false in [node] of")
                && !why.contains('\n'),
            "{why}"
        );
        assert!(matches!(run(cfg), Exit::Config));
        assert!(!sock.exists(), "a disabled node bound its socket");
        assert!(
            fake_podman.accept().is_err(),
            "a disabled node connected to Podman"
        );
        assert!(!dir.path().join("jobs").exists());

        // enabled = true and a missing key: serve goes on.
        for line in ["enabled = true\n", ""] {
            let t = text.replace("enabled = false\n", line);
            let cfg = ServiceConfig::parse(&path, &t).unwrap();
            assert!(refuse_if_disabled(&cfg).is_ok());
        }
    }
}
