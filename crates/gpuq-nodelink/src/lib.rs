//! The broker's links to the storage nodes.
//!
//! The node helper (`gpuq-node`) listens on a root-only unix socket on each
//! node, next to the node's Podman API socket. The broker on cxl2 reaches
//! both through SSH (docs/node-links.md, architecture.md "Trust
//! boundaries"): per node one ssh master connection (the `openssh` crate,
//! native mux: the system `ssh` runs the master, requests to it go over its
//! control socket), strict host-key checking against a known_hosts file,
//! key auth only, and two unix-socket forwards from a root-only local dir:
//! `<forward_dir>/<node>.node.sock` → the node's gpuq-node socket and
//! `<forward_dir>/<node>.podman.sock` → its Podman socket. Each forward is
//! verified by a request (`GET /v1/status` must name this node; `GET
//! /_ping` must answer `OK`) before the link is reported up.
//!
//! API: [`NodeLink`] is one node; its supervisor task ([`NodeLink::start`])
//! keeps the link up, reconnecting with capped exponential backoff, and
//! publishes a [`LinkState`]. Callers use [`NodeLink::ensure_up`] before
//! talking to the node over the sockets with any HTTP client ([`http`] has
//! a small one). [`NodeLinks`] holds all nodes and runs a step on every node
//! concurrently ([`NodeLinks::step`]); the step succeeds only when every
//! node's part does, and every node's result is returned.

mod error;
pub mod http;
mod link;
mod links;

pub use error::{Error, Result};
pub use link::{ConnectTimings, LinkConfig, LinkState, LinkStats, NodeLink, NodeSockets, Timings};
pub use links::{NodeLinks, NodeResult, StepReport};
