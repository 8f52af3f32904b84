//! `gpuq-node serve`: the node daemon. Connects to this node's Podman API
//! (refusing Podman older than 4.3), binds the root-only socket and serves
//! the lease API of `gpuq-nodesvc` until SIGTERM.

use crate::Exit;
use gpuq_nodesvc::profile::ServiceConfig;

pub fn run(cfg: ServiceConfig) -> Exit {
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
