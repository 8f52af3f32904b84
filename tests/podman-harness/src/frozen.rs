//! A process stopped with SIGSTOP for as long as a guard lives (a hung
//! service, a node helper that stops answering): SIGCONT on drop, also when
//! the test panics.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// SIGSTOPs a process; SIGCONT when dropped.
#[derive(Debug)]
pub struct Sigstopped {
    pid: i32,
    what: String,
}

impl Sigstopped {
    /// Stops `pid` (`what` names it in messages) and returns once every
    /// thread of it is stopped. `kill` returns when the signal is queued;
    /// until one of the process's threads runs the group stop, the others
    /// go on, and a loaded CI machine answered a request in that window.
    pub fn new(pid: i32, what: &str) -> Sigstopped {
        kill(Pid::from_raw(pid), Signal::SIGSTOP)
            .unwrap_or_else(|e| panic!("SIGSTOP {what} (PID {pid}): {e}"));
        let stopped = Sigstopped {
            pid,
            what: what.to_string(),
        };
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let running = threads_not_stopped(pid);
            if running.is_empty() {
                return stopped;
            }
            assert!(
                Instant::now() < until,
                "{what} (PID {pid}): threads not stopped 10 s after SIGSTOP: {running:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGCONT now (the drop does nothing more).
    pub fn thaw(self) {}
}

impl Drop for Sigstopped {
    fn drop(&mut self) {
        if let Err(e) = kill(Pid::from_raw(self.pid), Signal::SIGCONT) {
            eprintln!("SIGCONT {} (PID {}): {e}", self.what, self.pid);
        }
    }
}

/// The threads of `pid` whose state (field 3 of /proc/PID/task/TID/stat)
/// is not `T` (stopped), as `TID:STATE`. A process that is gone has none.
fn threads_not_stopped(pid: i32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|e| {
            let tid = e.ok()?.file_name().to_string_lossy().into_owned();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
            let state = stat[stat.rfind(')')? + 2..]
                .split_whitespace()
                .next()?
                .to_string();
            (state != "T").then(|| format!("{tid}:{state}"))
        })
        .collect()
}
