//! The gpuq broker as a library: the queue, its store and policy, the job
//! runners, the GPU gate and the HTTP API. The `gpuq-broker` binary only
//! parses its flags and calls [`run`].

pub mod broker;
pub mod config;
pub mod crash;
pub mod daos;
pub mod dirs;
pub mod error;
pub mod exec;
pub mod exec_dirs;
pub mod gpu;
pub mod joblog;
pub mod limits;
pub mod metrics;
pub mod policy;
pub mod runner;
pub mod server;
pub mod store;
pub mod submit;
pub mod usage;

use anyhow::Context;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;

pub use gpuq_protocol::time::now;

/// Bring the broker up on `cfg` and serve until the process is stopped.
/// `shim` is the broker's own executable (`/proc/self/exe`): the direct
/// runner's `job-shim` and every systemd unit's `job-exec`.
pub async fn run(cfg: config::BrokerConfig, shim: PathBuf) -> anyhow::Result<()> {
    // What the broker makes without an explicit mode is root's alone
    // (SQLite's -wal and -shm among them); see dirs.rs.
    dirs::set_umask();
    // Before anything is made (directories, the store, links to the nodes):
    // an address that cannot be served refuses the start and leaves nothing.
    let metrics = match cfg.metrics_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!(
                "[metrics] listen = \"{addr}\" in {}: cannot listen there (another service on that port? change it or remove [metrics])",
                cfg.source.display()
            )
        })?),
        None => None,
    };
    // Before anything is made: gpuq-slurm's configuration, when named.
    let slurm = match &cfg.slurm_config {
        Some(p) => {
            let s = gpuq_slurm::load(p)
                .map_err(|e| anyhow::anyhow!("slurm.config in {}: {e}", cfg.source.display()))?;
            if let Some(n) = cfg.slurm_node.as_deref() {
                if !s.daos_hosts().contains(&n) {
                    anyhow::bail!(
                        "slurm.node in {}: `{n}` is neither agent_host nor one of [[slurm.gpu_hosts]] in {} ({})",
                        cfg.source.display(),
                        p.display(),
                        s.daos_hosts().join(", ")
                    );
                }
            }
            Some(s)
        }
        None => None,
    };
    // Before anything is made: the systemd runner hands this path to every
    // job's unit (see runner/systemd.rs).
    if matches!(cfg.runner, config::RunnerKind::Systemd) {
        runner::systemd::check_job_exec_program(&shim)?;
    }
    dirs::preflight(&cfg.state_dir, &cfg.log_root)?;
    dirs::secure_state_dir(&cfg.state_dir)?;
    dirs::secure_log_root(&cfg.log_root)?;
    let store = store::Store::open(&cfg.state_dir.join("queue.db"))?;
    let runner: Arc<dyn runner::Runner> = match cfg.runner {
        config::RunnerKind::Direct => Arc::new(
            runner::direct::DirectRunner::new(
                cfg.cgroup_parent.clone(),
                cfg.state_dir.join("run"),
                shim,
            )
            .with_context(|| format!("broker.cgroup_parent in {}", cfg.source.display()))?,
        ),
        config::RunnerKind::Systemd => {
            Arc::new(runner::systemd::SystemdRunner::connect(&shim).await?)
        }
    };
    let gpu: Arc<dyn gpu::GpuProbe> = match cfg.gpu {
        config::GpuKind::None => Arc::new(gpu::NoGpu),
        config::GpuKind::Nvml => Arc::new(gpu::Nvml::new()),
    };
    // SIGTERM is a clean stop from the moment a client can connect.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    // An unreleased lease is held (blocked.json) before anyone can connect.
    let daos = match cfg.daos.clone() {
        Some(d) => {
            let daos = daos::Daos::start(d, &cfg.state_dir, now())?;
            // The broker outlives its leases: each job's run makes the
            // next lease's keys (docs/security.md).
            daos.make_keys_ahead();
            Some(daos)
        }
        None => None,
    };
    // Bound under a name no client dials, published under the real one
    // only once start-up recovery has succeeded: a client never waits in
    // the backlog of a broker that may still fail and reset it (issue 30,
    // the "connection error" after a restart), and a failed start leaves
    // no socket behind.
    let pending = bind(&cfg.socket)?;
    let broker = broker::Broker::new(cfg, store, runner, gpu, daos, slurm);
    if let Err(e) = broker.recover().await {
        pending.abandon();
        return Err(e.into());
    }
    let listener = pending.publish()?;
    tokio::spawn(Arc::clone(&broker).run_scheduler());
    if let Some(m) = metrics {
        tracing::info!(address = ?m.local_addr().ok(), "serving GET /metrics");
        let b = Arc::clone(&broker);
        let scrape: metrics::Scrape = Arc::new(move || {
            let b = Arc::clone(&b);
            Box::pin(async move { b.scrape().await })
        });
        tokio::spawn(metrics::serve(m, scrape));
    }
    tracing::info!(socket = %broker.config().socket.display(), "gpuq-broker ready");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
    let socket = broker.config().socket.clone();
    let running = Arc::clone(&broker);
    tokio::select! {
        _ = server::serve(listener, broker) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    // Jobs are in cgroups/units of their own and keep running; the next
    // broker re-adopts them. Nothing is cancelled by a restart.
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    tracing::info!(
        running = running
            .status()
            .map(|s| s.running.is_some())
            .unwrap_or(false),
        "gpuq-broker stopping; running jobs continue and are re-adopted at the next start"
    );
    if let Some(d) = running.daos() {
        // The ssh masters are daemons of their own; end them with us.
        d.close().await;
    }
    let _ = std::fs::remove_file(&socket);
    Ok(())
}

/// Bind the world-connectable API socket (authorisation is per request, by
/// the peer's credentials). A stale socket file is replaced; anything else
/// at that path is an error.
/// A listening socket not yet under its public name.
struct PendingSocket {
    listener: tokio::net::UnixListener,
    tmp: PathBuf,
    path: PathBuf,
}

impl PendingSocket {
    /// Renames the socket to its public name (atomically: a client finds
    /// either nothing or a socket that is served).
    fn publish(self) -> anyhow::Result<tokio::net::UnixListener> {
        std::fs::rename(&self.tmp, &self.path)
            .with_context(|| format!("rename {} to {}", self.tmp.display(), self.path.display()))?;
        Ok(self.listener)
    }

    /// Removes the socket after a failed start.
    fn abandon(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// `path` with `.starting` appended: where the socket is bound until the
/// broker can serve it.
fn starting_name(path: &std::path::Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".starting");
    PathBuf::from(s)
}

/// Refuses a start where another broker serves (or is starting on) `path`;
/// removes a stale socket a dead broker left.
fn clear_stale(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                anyhow::bail!(
                    "{} is in use: another gpuq-broker is running on it",
                    path.display()
                );
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => anyhow::bail!(
            "{} exists and is not a socket; refusing to replace it",
            path.display()
        ),
        Err(_) => {}
    }
    Ok(())
}

fn bind(path: &std::path::Path) -> anyhow::Result<PendingSocket> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            // Every user connects: the directory must let them through
            // (mkdir's mode is filtered by our umask 077).
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    let tmp = starting_name(path);
    clear_stale(path)?;
    clear_stale(&tmp)?;
    let l =
        tokio::net::UnixListener::bind(&tmp).with_context(|| format!("bind {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666))?;
    Ok(PendingSocket {
        listener: l,
        tmp,
        path: path.to_path_buf(),
    })
}
