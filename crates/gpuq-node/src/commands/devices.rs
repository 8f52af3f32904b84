//! `gpuq-node devices [--json]`.

use gpuq_blockdev::{Mode, NodeConfig, Request};

use crate::{output, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cfg: &NodeConfig, args: &Args) -> Exit {
    let req = Request {
        mode: Mode::Inspect,
        lease: None,
        expected_signatures: Vec::new(),
        purpose: gpuq_blockdev::wipe::Purpose::Lease,
    };
    output::finish(gpuq_blockdev::run(cfg, &req), args.json)
}
