//! **daos-sim: a DAOS control-plane simulator for tests; not DAOS.**
//!
//! DAOS cannot be installed on gpuq's build machines, so the test cluster
//! runs this instead: one multi-call binary that answers as `daos_server`,
//! `daos_agent`, `dmg` and `daos` (by `argv[0]`, or `daos-sim <name> ...`)
//! and reproduces what gpuq relies on — the strict config parser, the
//! `awaitformat` → `joined` state machine, the superblock that makes a
//! restarted server rejoin instead of awaiting format, and dmg's JSON shapes
//! as recorded in `docs/daos-facts.md`. It stores nothing but small JSON
//! files and bdev headers, moves no data and has no engines, fabric,
//! hugepages or SPDK. See `docs/daos-sim.md`.
//!
//! Modules: [`config`] (strict YAML), [`server`] (daos_server and the
//! management service), [`dmg`], [`agent`] (daos_agent and daos),
//! [`proto`] (the simulator's own JSON-lines TCP protocol), [`tls`] (mutual
//! TLS on the control port, authorisation by certificate), [`model`] (the
//! JSON shapes), [`faults`] (fault switches for tests).

pub mod agent;
pub mod checks;
pub mod config;
pub mod dmg;
pub mod error;
pub mod faults;
pub mod model;
pub mod proto;
pub mod server;
pub mod tls;

pub use error::SimError;

/// The names the binary answers to.
pub const PERSONALITIES: &[&str] = &["daos_server", "daos_agent", "dmg", "daos"];

/// Dispatches on `argv[0]`'s basename, or on the first argument when called
/// as `daos-sim`. Returns the exit code.
pub fn main_with(argv: Vec<String>) -> i32 {
    let name = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string())
        .unwrap_or_default();
    let (name, rest) = if PERSONALITIES.contains(&name.as_str()) {
        (name, argv.get(1..).unwrap_or_default().to_vec())
    } else {
        match argv.get(1) {
            Some(n) if PERSONALITIES.contains(&n.as_str()) => (n.clone(), argv[2..].to_vec()),
            Some(v) if v == "--version" || v == "version" => {
                println!(
                    "daos-sim {} (DAOS control-plane simulator for tests; not DAOS)",
                    env!("CARGO_PKG_VERSION")
                );
                return 0;
            }
            _ => {
                eprintln!(
                    "daos-sim {}: DAOS control-plane simulator for tests; not DAOS.\n\
                     usage: daos-sim {{daos_server|daos_agent|dmg|daos}} ARGS...\n\
                     (or call it through a symlink of one of those names)",
                    env!("CARGO_PKG_VERSION")
                );
                return 2;
            }
        }
    };
    match name.as_str() {
        "daos_server" => server_main(&rest),
        "daos_agent" => agent::agent_main(&rest),
        "dmg" => dmg::main(&rest),
        _ => agent::daos_main(&rest),
    }
}

fn server_main(argv: &[String]) -> i32 {
    let args = match dmg::Args::parse(argv, &["o", "config"]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ERROR: daos_server: {e}");
            return 1;
        }
    };
    if args.has(&["h", "help"]) || args.pos.first().map(String::as_str) != Some("start") {
        println!(
            "Usage: daos_server start -o daos_server.yml\n\n\
             daos-sim: DAOS control-plane simulator for tests; not DAOS."
        );
        return if args.has(&["h", "help"]) { 0 } else { 1 };
    }
    let path = std::path::PathBuf::from(
        args.get(&["o", "config"])
            .unwrap_or("/etc/daos/daos_server.yml"),
    );
    match server::run(&path) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ERROR: daos_server: {e}");
            1
        }
    }
}
