//! `daos-sim`: DAOS control-plane simulator for tests; not DAOS. See the
//! library docs and docs/daos-sim.md.

fn main() {
    std::process::exit(daos_sim::main_with(std::env::args().collect()));
}
