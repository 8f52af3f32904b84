//! `gpuq-node`: the root helper on each storage node.
//!
//! Thin by design (ripgrep/youki style): parse the command line, call the
//! library, render, exit with a code from [`Exit`]. The device work lives in
//! `gpuq-blockdev`; the daemon (`serve`) in `gpuq-nodesvc`.

mod commands;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Default location of the node configuration.
const DEFAULT_CONFIG: &str = "/etc/gpuqueue-daos/node.toml";

#[derive(Debug, Parser)]
#[command(name = "gpuq-node", version, about = "gpuq storage-node helper")]
struct Cli {
    /// Node configuration file (TOML: [node], [[devices]], [profiles.NAME]).
    #[arg(long, global = true, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inventory and verdict for every allowlisted device (destroys nothing).
    Devices(commands::devices::Args),
    /// Check, discard and verify every allowlisted device for a lease.
    Wipe(commands::wipe::Args),
    /// Run the node daemon: the lease API on the root-only socket.
    Serve,
}

/// Process exit codes. Scripts rely on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Every device passed every check (and was wiped, for `wipe`).
    Ok = 0,
    /// At least one check refused; nothing was destroyed.
    Refused = 1,
    /// Command-line usage error (clap also exits with 2).
    Usage = 2,
    /// The configuration file is missing, unreadable or invalid.
    Config = 3,
    /// A discard, verification or audit write failed after checks passed.
    Failed = 4,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cfg = match commands::load_config(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gpuq-node: {e}");
            return Exit::Config.into();
        }
    };
    let exit = match cli.command {
        Command::Devices(a) => commands::devices::run(&cfg.node, &a),
        Command::Wipe(a) => commands::wipe::run(&cfg.node, &a),
        Command::Serve => commands::serve::run(cfg),
    };
    exit.into()
}
