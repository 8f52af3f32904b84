//! One file per subcommand, each a small adapter over `gpuq-blockdev`.

pub mod devices;
pub mod serve;
pub mod wipe;

use std::path::Path;

use gpuq_nodesvc::profile::ServiceConfig;

/// Load the configuration, refusing one that someone other than root could
/// have written (`gpuq_conffile`: not a link, root's file in root's
/// directory, neither writable by others): the allowlist decides what gets
/// destroyed. The file holds `[node]`, `[[devices]]` and the `[profiles.*]`
/// that only `serve` uses; every verb reads and validates all of it.
pub fn load_config(path: &Path) -> Result<ServiceConfig, String> {
    ServiceConfig::load(path).map_err(|e| e.to_string())
}
