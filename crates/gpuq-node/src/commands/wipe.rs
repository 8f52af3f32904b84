//! `gpuq-node wipe --lease LEASE [--dry-run] [--json]`.

use gpuq_blockdev::{Mode, NodeConfig, Request};

use crate::{output, Exit};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The lease whose devices are wiped; audit records go to
    /// <jobs_dir>/<LEASE>/.
    #[arg(long, value_name = "LEASE")]
    lease: String,
    /// Run every check and write a dry-run audit record; destroy nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// A signature type (libblkid TYPE or PTTYPE) this lease is known to
    /// leave behind and that may be discarded. Repeatable.
    #[arg(long = "expect-signature", value_name = "TYPE")]
    expect_signature: Vec<String>,
}

pub fn run(cfg: &NodeConfig, args: &Args) -> Exit {
    let req = Request {
        mode: if args.dry_run {
            Mode::DryRun
        } else {
            Mode::Wipe
        },
        lease: Some(args.lease.clone()),
        expected_signatures: args.expect_signature.clone(),
        purpose: gpuq_blockdev::wipe::Purpose::Lease,
    };
    output::finish(gpuq_blockdev::run(cfg, &req), args.json)
}
