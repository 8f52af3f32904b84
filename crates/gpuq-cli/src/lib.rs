//! The `gpuq` command line, as data: the clap definitions of every verb.
//!
//! Kept apart from `main.rs` so that the build-time generator
//! (`examples/gpuq-gen-docs.rs`: shell completions and man pages for the
//! packages) reads the very same definitions the command parses with.

use clap::{Parser, Subcommand};
use gpuq_protocol::JobId;

#[derive(Debug, Parser)]
#[command(
    name = "gpuq",
    version,
    about = "Queue jobs for the shared GPU (and DAOS) host",
    after_help = "A bare `gpuq` is `gpuq list`. Socket: $GPUQ_SOCKET, else [broker] socket in $GPUQ_CONFIG \
                  or /etc/gpuqueue-daos/broker.toml, else /run/gpuq/broker.sock."
)]
pub struct Cli {
    #[command(subcommand)]
    pub verb: Option<Verb>,
}

#[derive(Debug, Subcommand)]
pub enum Verb {
    /// Queue a command; prints only the job ID.
    Submit {
        /// Time limit: 90m, 4h, 1h30m, HH:MM:SS or D-HH:MM:SS (default: the host's).
        #[arg(long)]
        time: Option<String>,
        /// A short label shown in `gpuq list`.
        #[arg(long)]
        name: Option<String>,
        /// DAOS institution profile: gives the job a fresh DAOS system.
        #[arg(long, conflicts_with = "stor")]
        inst: Option<String>,
        /// Kernel storage on the same NVMe: lustre, nfsrdma or nvmeof.
        #[arg(long)]
        stor: Option<String>,
        /// Print the whole answer as JSON instead of the ID.
        #[arg(long)]
        json: bool,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Show the queue (add --all for finished jobs).
    List {
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Status {
        job: JobId,
        #[arg(long)]
        json: bool,
    },
    /// Print a job's output so far.
    Log { job: JobId },
    /// Print a job's output as it grows; exit with the job's exit code.
    Follow { job: JobId },
    /// Cancel a queued or running job (all its processes end).
    Cancel {
        job: JobId,
        #[arg(long)]
        json: bool,
    },
    /// Lock the queue for maintenance (root).
    Lock {
        #[arg(long)]
        reason: String,
        #[arg(long)]
        json: bool,
    },
    /// Release the maintenance lock (root). Never releases a recovery hold.
    Unlock {
        #[arg(long)]
        json: bool,
    },
    /// Retry the cleanup of the held DAOS lease from its first unconfirmed
    /// step (root); the hold goes only when every node confirms.
    Recover {
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a client container of your running --inst job (from
    /// inside the job): its DAOS system, your UID, your submit directory.
    /// Exits with the command's exit code.
    DaosExec {
        /// Working directory in the container (default: yours if it is
        /// mounted there, else the job's submit directory).
        #[arg(long)]
        workdir: Option<String>,
        /// NAME=VALUE for the command's environment (repeatable); nothing
        /// else of yours is passed.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Check (root) that every profile's pinned image ID is present on this
    /// host and on every node, and that no container of ours runs another
    /// image; exits non-zero on any mismatch.
    VerifyPins {
        #[arg(long)]
        json: bool,
    },
    /// Check (root) every file the gpuq packages installed, on this host and
    /// on every node, against the packages' SHA-256 manifests; the versions
    /// of this CLI, the broker, the node helpers and the manifests must
    /// match. Changed configuration files are shown as information. Exits
    /// non-zero on any failure.
    VerifyInstall {
        #[arg(long)]
        json: bool,
    },
    /// Plan (root) the activation of the storage nodes' NVMe: per node,
    /// every allowlisted device with its identity and what is on it now
    /// (signatures, mounts, holders — every read-only check), the
    /// pre-existing DAOS services the node's `[activation] units` names,
    /// and each step an activation would take. Changes nothing. Exits
    /// non-zero when an activation would refuse now.
    ///
    /// With `--execute --destroy-existing-data` (the queue idle): hold every
    /// job, stop and disable those units on each node, discard every
    /// allowlisted device (audited), and claim them for gpuq's physical
    /// mode; the hold goes when all nodes are claimed. Run it again to
    /// finish an activation that stopped half-way.
    Activate {
        #[arg(long)]
        json: bool,
        /// Carry the plan out (needs --destroy-existing-data).
        #[arg(long)]
        execute: bool,
        /// Agree that everything on the allowlisted devices is destroyed.
        #[arg(long)]
        destroy_existing_data: bool,
    },
    /// Verify (root, under `gpuq lock`) that a DAOS job works end to end and
    /// leaves nothing: each round submits a root `--inst` job that creates a
    /// pool and a POSIX container and writes and reads back data through
    /// `gpuq daos-exec`, waits for its lease's release, then checks on cxl2
    /// and every node that the wipe audit names every allowlisted device
    /// discarded with no signature after (test mode: the test directory is
    /// gone), the metadata and the node's lease record are gone, the
    /// server's output was kept, and no container is left. Exit 1 on any
    /// failure.
    E2e {
        /// The DAOS profile (default: the only one configured).
        #[arg(long)]
        profile: Option<String>,
        /// Rounds, each a new job and lease (1-100).
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Only check an earlier lease (no job is submitted).
        #[arg(long)]
        lease: Option<String>,
        #[arg(long)]
        json: bool,
        /// Internal (the e2e job runs it): print the pool size, in bytes,
        /// that `dmg -j storage query usage` output in FILE allows, or say
        /// in one line why the site is too small.
        #[arg(long, hide = true, value_name = "FILE")]
        pool_size_from: Option<std::path::PathBuf>,
    },
    /// The DAOS side: node links, helpers, Podman, images, lease, hold, lock.
    /// With `--lease LEASE` (its name is in the job's log): the end of that
    /// lease's server output on every node (the lease's job owner or root),
    /// kept on the nodes after the job.
    DaosStatus {
        #[arg(long)]
        json: bool,
        /// Show this lease's server output instead.
        #[arg(long)]
        lease: Option<String>,
        /// How much of each node's output (bytes, from a line start).
        #[arg(long, default_value_t = 65536)]
        tail: usize,
    },
    /// Per user: jobs, GPU hours, mean wait, DAOS jobs and the medians of
    /// their preparation and cleanup, over the jobs that ended in a period
    /// (default: the last 30 days). Everyone's for root, your own for
    /// anyone else.
    Stats {
        /// First day of the period, YYYY-MM-DD (UTC).
        #[arg(long, value_name = "DATE", value_parser = day)]
        since: Option<i64>,
        /// Last day of the period, YYYY-MM-DD (UTC), included.
        #[arg(long, value_name = "DATE", value_parser = day)]
        until: Option<i64>,
        #[arg(long)]
        json: bool,
    },
}

/// A `YYYY-MM-DD` argument: unix seconds at that day's start (UTC).
fn day(s: &str) -> Result<i64, String> {
    gpuq_protocol::time::parse_date(s)
}
