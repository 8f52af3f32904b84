//! The node helper's API (`gpuq-node serve`), spoken by the broker through
//! an SSH-forwarded unix socket. Nothing here may assume the caller is local.
//!
//! Routes: `GET /v1/status`, `POST /v1/preflight`,
//! `POST /v1/leases/{lease}/start`, `POST /v1/leases/{lease}/stop`,
//! `POST /v1/leases/{lease}/wipe`, `GET /v1/leases/{lease}/logs`.

use serde::{Deserialize, Serialize};

/// A lease name: 1–64 of `[A-Za-z0-9_-]`, not starting with `-`. It becomes
/// a directory name and a container label, so nothing else is accepted.
pub fn valid_lease(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The node-side lease record (`<state_dir>/lease.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLease {
    pub lease: String,
    pub profile: String,
    /// `starting`, `running`, `stopped`, `wiping`.
    pub phase: String,
    pub metadata_dir: String,
    pub container: Option<String>,
    pub since: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OurContainer {
    pub id: String,
    pub name: String,
    pub lease: String,
    pub role: String,
    pub state: String,
    pub image: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinStatus {
    pub profile: String,
    pub image: String,
    pub present: bool,
}

/// `GET /v1/status`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub node: String,
    pub helper_version: String,
    pub podman_api_version: String,
    pub lease: Option<NodeLease>,
    pub containers: Vec<OurContainer>,
    pub images: Vec<String>,
    pub pins: Vec<PinStatus>,
}

/// `POST /v1/preflight`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreflightRequest {
    pub lease: String,
    pub profile: String,
}

/// One reason a node is not ready for a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// `foreign_engine`, `foreign_container`, `foreign_lease`, `port_in_use`,
    /// `image_missing`, `device_refused`, `check_failed`.
    pub reason: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightReport {
    pub node: String,
    pub lease: String,
    pub ok: bool,
    pub findings: Vec<Finding>,
}

/// `POST /v1/leases/{lease}/start`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    pub profile: String,
    /// Host names of the management-service replicas (1 or 3).
    pub replicas: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartReport {
    pub node: String,
    pub lease: String,
    pub container: String,
    pub metadata_dir: String,
    pub config_path: String,
    /// Every engine of the server said "format required" (its log line)
    /// before the node answered. Absent from an older helper: false.
    #[serde(default)]
    pub awaiting_format: bool,
}

/// `POST /v1/leases/{lease}/stop` and `/wipe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepReport {
    pub node: String,
    pub lease: String,
    /// True when there was nothing left to do (idempotent repeat).
    pub already_done: bool,
    pub detail: String,
}
