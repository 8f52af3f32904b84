//! The crash and pause points of the broker's test build (cargo feature
//! `crash-points`; docs/lifecycle.md lists the points). A leaf: it calls
//! nothing of the broker's, so the lifecycle's checkpoints and the
//! supervisors reach it without a circle.

/// Test builds only (`--features crash-points`): abort the broker at the
/// named lifecycle step when `GPUQ_CRASH_AT` names it; or hold still there
/// while `GPUQ_PAUSE_AT` names it, until the file `GPUQ_PAUSE_FILE` exists
/// (so a test can inject a fault at an exact step). Release builds have no
/// such code.
#[cfg(feature = "crash-points")]
pub fn crash_point(step: &str) {
    if std::env::var("GPUQ_CRASH_AT").is_ok_and(|s| s == step) {
        eprintln!("gpuq-broker: crash point {step}: aborting (test build)");
        std::process::abort();
    }
    if std::env::var("GPUQ_PAUSE_AT").is_ok_and(|s| s == step) {
        if let Some(resume) = std::env::var_os("GPUQ_PAUSE_FILE") {
            eprintln!("gpuq-broker: pause point {step}: waiting for {resume:?} (test build)");
            let wait = || {
                while !std::path::Path::new(&resume).exists() {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            };
            // Called from a task: the worker's other tasks (its LIFO slot
            // cannot be stolen) go to another thread while this one
            // sleeps — a plain sleep here once left `gpuq log` unanswered
            // for as long as the pause lasted.
            match tokio::runtime::Handle::try_current() {
                Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                    tokio::task::block_in_place(wait)
                }
                _ => wait(),
            }
        }
    }
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn crash_point(_step: &str) {}
