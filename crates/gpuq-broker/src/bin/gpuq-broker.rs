//! `gpuq-broker`: the root daemon that owns the gpuq queue.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "gpuq-broker",
    version,
    about = "The gpuq queue daemon (runs as root)"
)]
struct Cli {
    /// Configuration file [env: GPUQ_CONFIG] [default: /etc/gpuqueue-daos/broker.toml]
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    verb: Option<Verb>,
}

#[derive(Subcommand)]
enum Verb {
    /// Serve (the default).
    Serve,
    /// Check the configuration and exit.
    CheckConfig,
    /// Internal: run one job inside its cgroup (started by the direct runner).
    #[command(hide = true)]
    JobShim { spec: PathBuf, exit: PathBuf },
    /// Internal: what each job's systemd unit runs, as the job's user: the
    /// job's argv and environment come on fd 0, not in the unit.
    #[command(hide = true)]
    JobExec,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Verb::JobShim { spec, exit }) = &cli.verb {
        let code = gpuq_broker::runner::direct::job_shim(spec, exit);
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    if let Some(Verb::JobExec) = &cli.verb {
        // Returns only when the job's command could not be started.
        let code = gpuq_broker::runner::systemd::job_exec();
        return ExitCode::from(code.clamp(0, 255) as u8);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPUQ_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuq-broker: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let path = cli
        .config
        .or_else(|| std::env::var_os("GPUQ_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(gpuq_broker::config::DEFAULT_CONFIG));
    let cfg = gpuq_broker::config::BrokerConfig::load(&path)?;
    if let Some(Verb::CheckConfig) = cli.verb {
        println!("{}: ok", path.display());
        return Ok(());
    }
    if !nix::unistd::Uid::effective().is_root() {
        anyhow::bail!("gpuq-broker must run as root (it starts jobs as their submitters)");
    }
    // /proc/self/exe, resolved once: the path every job's unit runs.
    let shim = std::fs::read_link("/proc/self/exe")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Named for `top -H` and profiles (default: tokio-rt-worker).
        .thread_name("gpuq-broker")
        .enable_all()
        .build()?;
    rt.block_on(gpuq_broker::run(cfg, shim))
}
