//! `gpuq`: the researcher's and operator's command. Thin: parse, one request
//! to the broker, render. Every failure is one line on stderr and a non-zero
//! exit code from [`Exit`]; stdout carries only results (`submit` prints only
//! the job ID, like `sbatch --parsable`).

mod e2e;
mod exec;
mod render;
mod verbs;

use clap::Parser;
use gpuq_cli::{Cli, Verb};
use std::process::ExitCode;

/// Exit codes of `gpuq` (besides `follow`, which exits with the job's code).
#[derive(Debug, Clone, Copy)]
pub enum Exit {
    Ok = 0,
    /// The broker refused or the request failed.
    Refused = 1,
    /// Bad command line (clap's own code).
    Usage = 2,
    /// The broker could not be reached.
    Unreachable = 3,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return ExitCode::from(if usage { Exit::Usage } else { Exit::Ok } as u8);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuq: cannot start: {e}");
            return ExitCode::from(Exit::Refused as u8);
        }
    };
    let client = gpuq_client::Client::new(verbs::socket_path());
    let verb = cli.verb.unwrap_or(Verb::List {
        all: false,
        json: false,
    });
    match rt.block_on(verbs::run(&client, verb)) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            let code = match e {
                gpuq_client::ClientError::Connect { .. } => {
                    eprintln!(
                        "gpuq: the gpuq broker is not reachable: {e}\nhint: is gpuq-broker running? \
                         (`systemctl status gpuq-broker`; set GPUQ_SOCKET to use another socket)"
                    );
                    Exit::Unreachable
                }
                _ => {
                    eprintln!("gpuq: {e}");
                    Exit::Refused
                }
            };
            ExitCode::from(code as u8)
        }
    }
}
