//! One file per subcommand, each a small adapter over `gpuq-blockdev`.

pub mod devices;
pub mod serve;
pub mod wipe;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use gpuq_nodesvc::profile::ServiceConfig;

/// Load the configuration, refusing one that someone other than root could
/// have changed when we run as root (sshd StrictModes style): the allowlist
/// decides what gets destroyed.
/// The file holds `[node]`, `[[devices]]` and the `[profiles.*]` that only
/// `serve` uses; every verb reads and validates all of it.
pub fn load_config(path: &Path) -> Result<ServiceConfig, String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
    if nix::unistd::geteuid().is_root() {
        if meta.uid() != 0 {
            return Err(format!(
                "config {} is owned by uid {}, not root; refusing to use it",
                path.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "config {} is group- or world-writable (mode {:o}); refusing to use it\nhint: chmod go-w {}",
                path.display(),
                meta.mode() & 0o7777,
                path.display()
            ));
        }
    }
    ServiceConfig::load(path).map_err(|e| e.to_string())
}
