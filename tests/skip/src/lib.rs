//! The one skip helper of gpuq's tests.
//!
//! A test that cannot reach the real component it needs (root, Podman,
//! sshd, the systemd box, the VM's kernel...) calls [`cannot_run`]. By
//! default that **fails** the test with the reason: a test that returns early
//! and passes proves nothing, and `./tests/run` (CI) installs everything, so
//! a missing part there is a defect of the suite. A developer who knowingly
//! runs a part of the suite on a machine without it sets
//! `GPUQ_ALLOW_SKIP=1`; the test then prints `SKIPPED: <reason>` and the
//! caller returns. `tests/run` says so loudly at its start; CI never sets it.

/// The environment variable that lets a developer skip instead of fail.
pub const ALLOW_SKIP: &str = "GPUQ_ALLOW_SKIP";

/// Is skipping allowed in this run?
pub fn skip_allowed() -> bool {
    std::env::var_os(ALLOW_SKIP).is_some_and(|v| v == "1")
}

/// `test` cannot run here because of `reason`. Panics (the test fails)
/// unless [`ALLOW_SKIP`] is `1`; then prints the reason and returns, and the
/// caller must return at once.
#[track_caller]
pub fn cannot_run(test: &str, reason: &str) {
    if skip_allowed() {
        eprintln!("SKIPPED: {test}: {reason}");
        return;
    }
    panic!(
        "{test} cannot run here: {reason}. Install what it needs (integration/install-deps \
         does) and run it as root, or set {ALLOW_SKIP}=1 to skip it knowingly"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cannot_run_fails_unless_skipping_was_asked_for() {
        if skip_allowed() {
            cannot_run("t", "r");
            return;
        }
        let r = std::panic::catch_unwind(|| cannot_run("t", "no podman"));
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("t cannot run here: no podman"), "{msg}");
    }
}
