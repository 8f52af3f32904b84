//! Stopping a container of the Podman service on this host.
//!
//! Podman's own stop (`POST /containers/{id}/stop`) returns ~100 ms after the
//! container's process has exited (its exit is noticed through conmon and
//! synced into Podman's state; measured in docs/benchmarks.md). When the
//! Podman service runs on this host, in our PID namespace, we can watch the
//! process ourselves: signal it through the API, see it go from `/proc`
//! (exited *and* reaped by conmon: before that Podman still takes the
//! container for running), and leave the removal to the caller's forced
//! delete, which then has nothing left to kill. The process is identified by the PID Podman reports *and*
//! the container's ID in its `/proc/<pid>/cgroup`, and pinned by its start
//! time, so a reused PID is never mistaken for it. Where that identification
//! fails (a remote socket, another PID namespace) Podman's own stop does the
//! same thing, only slower. Same semantics either way: SIGTERM, `grace`,
//! then SIGKILL.

use std::time::Duration;

use crate::{Error, Podman, Result};

/// How a [`stop_local`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It was not running.
    NotRunning,
    /// It exited on SIGTERM within the grace period.
    Exited,
    /// It outlived the grace period and was SIGKILLed.
    Killed,
    /// Podman's own stop did it (the process was not visible here).
    ByPodman,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stopped::NotRunning => "was not running",
            Stopped::Exited => "exited on SIGTERM",
            Stopped::Killed => "SIGKILLed",
            Stopped::ByPodman => "stopped by Podman",
        })
    }
}

const POLL: Duration = Duration::from_millis(5);
/// How long a SIGKILLed process may take to go.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// SIGTERM `container`, wait up to `grace` for its process to exit, then
/// SIGKILL (at once for a zero `grace`); returns once the process is gone. The container itself stays
/// (stopped or about to be): remove it with [`remove_stopped`].
pub async fn stop_local<P: Podman>(pm: &P, container: &str, grace: Duration) -> Result<Stopped> {
    let info = pm.container_inspect(container).await?;
    if !info.state.running {
        return Ok(Stopped::NotRunning);
    }
    let Some(process) = Process::of_container(info.state.pid, &info.id) else {
        pm.container_stop(container, grace).await?;
        return Ok(Stopped::ByPodman);
    };
    // No grace: SIGKILL at once (an idle container's `sleep`).
    if !grace.is_zero() {
        if !process.signal(pm, container, "TERM").await? {
            return Ok(Stopped::Exited);
        }
        if process.wait_gone(grace).await {
            return Ok(Stopped::Exited);
        }
    }
    if !process.signal(pm, container, "KILL").await? {
        return Ok(Stopped::Exited);
    }
    if process.wait_gone(KILL_WAIT).await {
        return Ok(Stopped::Killed);
    }
    Err(Error::StillRunning {
        container: container.to_owned(),
        pid: info.state.pid,
        waited: KILL_WAIT,
    })
}

/// Remove a container that [`stop_local`] stopped (force: whatever still
/// runs in it is killed). Podman may not yet have synced the exit it did
/// not watch, and answers a delete in that moment with a conflict
/// ("container state improper"): the same delete is asked again, briefly.
/// Already gone is success.
pub async fn remove_stopped<P: Podman>(pm: &P, container: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + REMOVE_RETRY;
    loop {
        match pm.container_delete(container, true).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e @ Error::Conflict { .. }) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How long [`remove_stopped`] asks again after a conflict.
const REMOVE_RETRY: Duration = Duration::from_secs(5);

/// A container's main process on this host, pinned by its start time.
#[derive(Debug)]
struct Process {
    pid: i64,
    start_time: u64,
}

impl Process {
    /// The process `pid` if it is `container_id`'s (its cgroup path names
    /// the container's full ID) and still alive.
    fn of_container(pid: i64, container_id: &str) -> Option<Process> {
        if pid <= 0 || container_id.len() != 64 {
            return None;
        }
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        if !cgroup.contains(container_id) {
            return None;
        }
        let (state, start_time) = stat(pid)?;
        (state != 'Z').then_some(Process { pid, start_time })
    }

    /// Send `signal` through the API; `Ok(false)`: it had already exited
    /// (Podman answers a conflict for a stopped container).
    async fn signal<P: Podman>(&self, pm: &P, container: &str, signal: &str) -> Result<bool> {
        match pm.container_kill(container, signal).await {
            Ok(()) => Ok(true),
            Err(Error::Conflict { .. }) if self.gone() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Exited and reaped: no such PID any more, or another process now.
    /// A zombie is not gone yet: until conmon reaps it, runc (and so
    /// Podman) still takes the container for running, and a forced delete
    /// in that moment tries to kill it, fails half-way ("container state
    /// improper") and has left the container's cgroups behind (seen in the
    /// crash tests).
    fn gone(&self) -> bool {
        match stat(self.pid) {
            None => true,
            Some((_, start)) => start != self.start_time,
        }
    }

    async fn wait_gone(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.gone() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// State letter and start time (clock ticks since boot) of `pid`, from
/// `/proc/<pid>/stat` (fields 3 and 22; the command name in field 2 may
/// hold spaces and parentheses, so fields are counted after its last `)`).
fn stat(pid: i64) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&s)
}

fn parse_stat(s: &str) -> Option<(char, u64)> {
    let rest = &s[s.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state (field 3), field 22 is the 19th.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615";
        assert_eq!(parse_stat(line), Some(('S', 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_found_alive_and_a_missing_pid_is_gone() {
        let me = std::process::id() as i64;
        let (state, start) = stat(me).unwrap();
        assert_ne!(state, 'Z');
        assert!(!Process {
            pid: me,
            start_time: start
        }
        .gone());
        assert!(
            Process {
                pid: me,
                start_time: start + 1
            }
            .gone(),
            "another start time: another process"
        );
        // PIDs above pid_max do not exist.
        assert!(Process {
            pid: i64::from(i32::MAX),
            start_time: 0
        }
        .gone());
    }

    #[test]
    fn a_process_outside_the_container_cgroup_is_not_taken_for_it() {
        let me = std::process::id() as i64;
        assert!(Process::of_container(me, &"a".repeat(64)).is_none());
        assert!(Process::of_container(0, &"a".repeat(64)).is_none());
    }
}
