//! Research-NVMe wipe for gpuq: identify the node's research namespaces by
//! their allowlist, refuse anything that is not provably safe, discard the
//! whole namespace with one `BLKDISCARD`, verify with libblkid, and write an
//! audit record.
//!
//! This is the code in gpuq that destroys data on purpose. Its rules:
//!
//! - Every check is evaluated on every allowlisted device before anything is
//!   destroyed on any device; one refusal anywhere means nothing is wiped.
//! - A check that cannot be evaluated refuses (fail closed). Each refusal has
//!   its own reason code ([`Reason`]).
//! - The device is held open `O_EXCL` with `flock(LOCK_EX)` from the first
//!   check through the discard and the verification.
//! - The only write to a device is the `BLKDISCARD` ioctl. If it is not
//!   supported that is a failure; there is no fallback of any kind.
//!
//! API: [`NodeConfig::load`] reads the node configuration (allowlist);
//! [`run`] with a [`Request`] produces a [`NodeReport`] (`devices`, `wipe
//! --dry-run` and `wipe` are the three [`Mode`]s).

pub mod audit;
pub mod checks;
pub mod config;
#[cfg(feature = "fault-points")]
pub mod fault;
pub mod probe;
pub mod report;
pub mod system;
pub mod wipe;

pub use config::{ConfigError, DeviceEntry, NodeConfig, NodeSection};
pub use report::{
    CheckResult, DeviceReport, DeviceResult, NodeReport, NodeResult, Reason, Refusal, Signature,
    Verdict,
};
pub use wipe::{run, Mode, Request, WipeError, ACTIVE_LEASE_FILE};
