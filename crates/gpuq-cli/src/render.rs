//! Human output, in one place.

use gpuq_protocol::duration::format as dur;
use gpuq_protocol::time::format_utc;
use gpuq_protocol::{JobList, JobState, JobView};
use std::fmt::Write;

fn short_time(t: Option<i64>) -> String {
    // "2026-12-02 12:30:05Z" → "12-02 12:30:05"
    t.map(|t| format_utc(t)[5..19].to_string())
        .unwrap_or_else(|| "-".into())
}

fn what(j: &JobView) -> String {
    let cmd = j.argv.join(" ");
    let s = match &j.name {
        Some(n) => format!("{n}: {cmd}"),
        None => cmd,
    };
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(39).collect::<String>())
    } else {
        s
    }
}

fn elapsed(j: &JobView, now: i64) -> String {
    let used = match (j.started_at, j.ended_at) {
        (Some(s), Some(e)) => dur((e - s).max(0) as u64),
        (Some(s), None) => dur((now - s).max(0) as u64),
        (None, _) => "-".into(),
    };
    format!("{used}/{}", dur(j.time_limit_secs))
}

pub fn list(l: &JobList, now: i64) -> String {
    let mut out = String::new();
    if let Some(h) = &l.broker.hold {
        let _ = writeln!(
            out,
            "HOLD: lease {} was not cleaned up: {}. No job starts until an operator runs `sudo gpuq recover`.",
            h.lease, h.reason
        );
    }
    if let Some(lock) = &l.broker.lock {
        let _ = writeln!(
            out,
            "LOCKED for maintenance by {} since {}: {}. Queued jobs wait; new submissions are refused.",
            lock.by_user,
            format_utc(lock.since),
            lock.reason
        );
    }
    if let Some(why) = &l.broker.gate_closed {
        let _ = writeln!(out, "waiting: {why}");
    }
    let _ = writeln!(
        out,
        "{:>6}  {:<10} {:<9} {:<40} {:<14} {:<14} ELAPSED/LIMIT",
        "ID", "USER", "STATE", "NAME/COMMAND", "SUBMITTED", "STARTED"
    );
    for j in &l.jobs {
        let state = match (j.state, j.exit_code) {
            (JobState::Failed, Some(c)) => format!("failed:{c}"),
            (s, _) => s.to_string(),
        };
        let _ = writeln!(
            out,
            "{:>6}  {:<10} {:<9} {:<40} {:<14} {:<14} {}",
            j.id.0,
            j.user,
            state,
            what(j),
            short_time(Some(j.submitted_at)),
            short_time(j.started_at),
            elapsed(j, now)
        );
    }
    if l.jobs.is_empty() {
        let _ = writeln!(
            out,
            "(no jobs{})",
            if l.broker.queued == 0 { "" } else { " shown" }
        );
    }
    out
}

pub fn job(j: &JobView, now: i64) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "job:       {}", j.id);
    let _ = writeln!(out, "user:      {} (uid {})", j.user, j.uid);
    let _ = writeln!(out, "state:     {}", j.state);
    if let Some(n) = &j.name {
        let _ = writeln!(out, "name:      {n}");
    }
    let _ = writeln!(out, "command:   {}", j.argv.join(" "));
    let _ = writeln!(out, "directory: {}", j.cwd);
    let _ = writeln!(out, "submitted: {}", format_utc(j.submitted_at));
    if let Some(s) = j.started_at {
        let _ = writeln!(out, "started:   {}", format_utc(s));
    }
    if let Some(e) = j.ended_at {
        let _ = writeln!(out, "ended:     {}", format_utc(e));
    }
    let _ = writeln!(out, "elapsed:   {}", elapsed(j, now));
    if let Some(c) = j.exit_code {
        let _ = writeln!(out, "exit code: {c}");
    }
    if let Some(s) = j.signal {
        let _ = writeln!(out, "signal:    {s}");
    }
    if let Some(r) = &j.reason {
        let _ = writeln!(out, "reason:    {r}");
    }
    let _ = writeln!(out, "log:       {}", j.log_path);
    out
}
