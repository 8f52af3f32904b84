//! Fault switches for tests (issue 5), per simulated server.
//!
//! A switch list is `never_join,format_error,ignore_sigterm,slow_stop=N`
//! (comma or whitespace separated, `#` starts a comment). It is read from
//! - the env var `DAOS_SIM_FAULTS` of the server process, or the same name
//!   in the engine's `env_vars` in `daos_server.yml` (fixed at start), and
//! - a file, re-read at every decision so a test can flip a switch on a
//!   running server: `$DAOS_SIM_FAULTS_FILE` if set, else `daos-sim-faults`
//!   in the directory holding `daos_server.yml` (the node's state dir; the
//!   metadata dir is not used because preflight requires it to be empty).
//!
//! Switches: `never_join` — the engine formats but never joins (its rank
//! never appears); `format_error` — `storage format` reports a host error for
//! this host; `ignore_sigterm` — SIGTERM/SIGINT are logged and ignored (only
//! SIGKILL ends it); `slow_stop=N` — stopping the engine (SIGTERM or `dmg
//! system stop` without `--force`) takes N seconds.

use std::path::PathBuf;

/// The switches in force at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    pub never_join: bool,
    pub format_error: bool,
    pub ignore_sigterm: bool,
    pub slow_stop_secs: Option<u64>,
}

impl Faults {
    /// Parses a switch list; unknown words are reported, not fatal.
    pub fn parse(text: &str) -> (Self, Vec<String>) {
        let mut f = Faults::default();
        let mut unknown = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            for word in line.split(|c: char| c == ',' || c.is_whitespace()) {
                let word = word.trim();
                match word.split_once('=') {
                    _ if word.is_empty() => {}
                    None if word == "never_join" => f.never_join = true,
                    None if word == "format_error" => f.format_error = true,
                    None if word == "ignore_sigterm" => f.ignore_sigterm = true,
                    Some(("slow_stop", n)) if n.parse::<u64>().is_ok() => {
                        f.slow_stop_secs = n.parse().ok();
                    }
                    _ => unknown.push(word.to_string()),
                }
            }
        }
        (f, unknown)
    }

    fn union(mut self, o: Faults) -> Self {
        self.never_join |= o.never_join;
        self.format_error |= o.format_error;
        self.ignore_sigterm |= o.ignore_sigterm;
        self.slow_stop_secs = self.slow_stop_secs.max(o.slow_stop_secs);
        self
    }
}

/// Where a server reads its switches from.
#[derive(Debug, Clone)]
pub struct FaultSource {
    env: Faults,
    file: PathBuf,
}

impl FaultSource {
    /// `config_dir` is the directory of `daos_server.yml`; `engine_env` is
    /// its engine's `env_vars` value for `DAOS_SIM_FAULTS`, if any (so a
    /// rendered config can carry the switches too).
    pub fn new(config_dir: PathBuf, engine_env: Option<&str>) -> Self {
        let mut env_text = std::env::var("DAOS_SIM_FAULTS").unwrap_or_default();
        if let Some(more) = engine_env {
            env_text = format!("{env_text},{more}");
        }
        let (env, unknown) = Faults::parse(&env_text);
        if !unknown.is_empty() {
            crate::model::log_line(
                "daos-sim",
                &format!("ignoring unknown fault switches in DAOS_SIM_FAULTS: {unknown:?}"),
            );
        }
        let file = std::env::var_os("DAOS_SIM_FAULTS_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| config_dir.join("daos-sim-faults"));
        Self { env, file }
    }

    /// The switches now: env ∪ file.
    pub fn current(&self) -> Faults {
        let from_file = std::fs::read_to_string(&self.file)
            .map(|t| Faults::parse(&t).0)
            .unwrap_or_default();
        self.env.clone().union(from_file)
    }

    pub fn file(&self) -> &std::path::Path {
        &self.file
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_switch_lists() {
        let (f, unknown) =
            Faults::parse("never_join, slow_stop=3\n# comment\nignore_sigterm bogus");
        assert!(f.never_join && f.ignore_sigterm && !f.format_error);
        assert_eq!(f.slow_stop_secs, Some(3));
        assert_eq!(unknown, ["bogus"]);
        assert_eq!(Faults::parse("").0, Faults::default());
    }
}
