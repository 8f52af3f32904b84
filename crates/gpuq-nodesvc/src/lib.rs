//! The node helper's service (`gpuq-node serve`): everything that happens on
//! one storage node for one DAOS lease.
//!
//! - [`procscan`] and [`gpuq_sys::net`]: what runs and listens in *this
//!   node's* network namespace (on the test cluster several nodes share one kernel,
//!   so a node only looks at processes whose network namespace is its own —
//!   in production that is the host's, so the rule is the same there);
//! - [`profile`]: the `[profiles.NAME]` tables of `node.toml`;
//! - [`service::NodeService`]: preflight (read-only), start, stop, wipe,
//!   each verified, each destructive step written to the lease's
//!   `audit.jsonl` (fsync) — generic over [`gpuq_podman::Podman`];
//! - [`kernel`]: what the running kernel offers `--stor` jobs (status);
//! - [`wipeplan`]: what a wipe may do, decided from the lease record alone;
//! - [`client`]: on a GPU host (`[client]`), a lease's client side: its
//!   files, agent and client containers (gpuq-clienthost).

pub mod activation;
pub mod audit;
pub mod claim;
pub mod client;
pub mod dmg;
pub mod evidence;
pub mod kernel;
pub mod nfs;
pub mod nfsd;
pub mod nvmet;
pub mod procscan;
pub mod profile;
pub mod server;
pub mod service;
pub mod stor;
pub mod wipeplan;
