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

/// `s` safe to print on a terminal: control characters (ESC, CR, BS, C1
/// controls such as CSI) and the bidirectional overrides are shown escaped
/// (`\u{1b}`), never sent. Every string a user chose (command, directory,
/// name, reasons that quote them) passes through here: an operator running
/// `gpuq list` must not have their terminal driven by someone's argv.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || bidi {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn what(j: &JobView) -> String {
    let cmd = if j.hidden {
        "(another user's)".to_string()
    } else {
        j.argv.join(" ")
    };
    let s = match &j.name {
        Some(n) => format!("{n}: {cmd}"),
        None => cmd,
    };
    let s = esc(&s);
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
        let _ = if h.activating {
            writeln!(
                out,
                "HOLD: activation {} of the storage nodes is not finished: {}. No job starts until an operator runs `{}`.",
                h.lease,
                esc(&h.reason),
                h.remedy()
            )
        } else {
            writeln!(
                out,
                "HOLD: lease {} was not cleaned up: {}. No job starts until an operator runs `{}`.",
                h.lease,
                esc(&h.reason),
                h.remedy()
            )
        };
    }
    if let Some(lock) = &l.broker.lock {
        let _ = writeln!(
            out,
            "LOCKED for maintenance by {} since {}: {}. Queued jobs wait; new submissions are refused.",
            esc(&lock.by_user),
            format_utc(lock.since),
            esc(&lock.reason)
        );
    }
    if let Some(why) = &l.broker.gate_closed {
        let _ = writeln!(out, "waiting: {}", esc(why));
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
            esc(&j.user),
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
    let _ = writeln!(out, "user:      {} (uid {})", esc(&j.user), j.uid);
    let _ = writeln!(out, "state:     {}", j.state);
    if let Some(n) = &j.name {
        let _ = writeln!(out, "name:      {}", esc(n));
    }
    if j.hidden {
        let _ = writeln!(
            out,
            "command:   (another user's job: only they and root see its command, directory, log and reason)"
        );
    } else {
        let argv: Vec<String> = j.argv.iter().map(|a| esc(a)).collect();
        let _ = writeln!(out, "command:   {}", argv.join(" "));
        let _ = writeln!(out, "directory: {}", esc(&j.cwd));
    }
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
        let _ = writeln!(out, "reason:    {}", esc(r));
    }
    if !j.hidden {
        let _ = writeln!(out, "log:       {}", esc(&j.log_path));
    }
    out
}

/// `gpuq activate` for people: per node its devices (identity, size, what
/// is on them, every check that did not pass), its units and its steps;
/// then whether an activation would proceed.
pub fn activation_plan(p: &gpuq_protocol::node::SitePlan) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "Activation plan (nothing has been changed):");
    for n in &p.nodes {
        let _ = writeln!(o, "\n{}:", esc(&n.node));
        let Some(plan) = &n.plan else {
            let _ = writeln!(
                o,
                "  no plan: {}",
                esc(n.error.as_deref().unwrap_or("no answer"))
            );
            continue;
        };
        if let Some(e) = &plan.devices_error {
            let _ = writeln!(o, "  devices: cannot be inspected: {}", esc(e));
        }
        for d in &plan.devices {
            let _ = writeln!(
                o,
                "  device {} — {}{}",
                esc(d.path.as_deref().unwrap_or("(not found)")),
                esc(&d.identity),
                d.size_bytes
                    .map(|b| format!(", {b} bytes"))
                    .unwrap_or_default()
            );
            let _ = writeln!(o, "    allowlisted as: {}", esc(&d.entry));
            let _ = writeln!(
                o,
                "    on it now: {}",
                if d.signatures.is_empty() {
                    "no signature found".to_string()
                } else {
                    esc(&d.signatures.join(", "))
                }
            );
            for c in d.checks.iter().filter(|c| c.verdict != "pass") {
                let _ = writeln!(o, "    {}: {}", esc(&c.check), esc(&c.detail));
            }
        }
        for u in &plan.units {
            match &u.error {
                Some(e) => {
                    let _ = writeln!(o, "  unit {}: cannot be asked: {}", esc(&u.unit), esc(e));
                }
                None if u.load_state == "not-found" => {
                    let _ = writeln!(o, "  unit {}: not installed", esc(&u.unit));
                }
                None => {
                    let _ = writeln!(
                        o,
                        "  unit {}: {} {} ({}){}",
                        esc(&u.unit),
                        esc(&u.load_state),
                        esc(&u.active_state),
                        esc(&u.unit_file_state),
                        if u.main_pid > 0 {
                            format!(", main PID {}", u.main_pid)
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
        for f in &plan.foreign_processes {
            let _ = writeln!(o, "  DAOS process outside gpuq's containers: {}", esc(f));
        }
        for r in &plan.accepted_risks {
            let _ = writeln!(o, "  ACCEPTED RISK (this node's configuration): {}", esc(r));
        }
        let _ = writeln!(o, "  an activation would, in order:");
        for (i, s) in plan.steps.iter().enumerate() {
            let _ = writeln!(o, "    {}. {}", i + 1, esc(s));
        }
    }
    let refusals = p.refusals();
    if refusals.is_empty() {
        let _ = writeln!(
            o,
            "\nAn activation would proceed now; it destroys everything on the devices above."
        );
    } else {
        let _ = writeln!(o, "\nAn activation would refuse now:");
        for r in refusals {
            let _ = writeln!(o, "  - {}", esc(&r));
        }
    }
    o
}

/// `gpuq activate --execute` for people: per node what it did (or why it did
/// not complete), then whether the site is claimed or still held.
pub fn activation(a: &gpuq_protocol::node::SiteActivation) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "Activation {}:", esc(&a.activation));
    for n in &a.nodes {
        let _ = writeln!(o, "\n{}:", esc(&n.node));
        match (&n.report, &n.error) {
            (_, Some(e)) => {
                let _ = writeln!(o, "  NOT COMPLETE: {}", esc(e));
            }
            (Some(r), None) => {
                for line in &r.done {
                    let _ = writeln!(o, "  {}", esc(line));
                }
            }
            (None, None) => {
                let _ = writeln!(o, "  NOT COMPLETE: no answer");
            }
        }
    }
    match &a.held {
        None => {
            let _ = writeln!(
                o,
                "\nEvery node is claimed; the hold is released and physical-mode DAOS jobs may run."
            );
        }
        Some(why) => {
            let _ = writeln!(
                o,
                "\nHELD: {}\nNo job starts. Fix what is named above, then run `sudo gpuq activate --execute --destroy-existing-data` again: it finishes only what is left.",
                esc(why)
            );
        }
    }
    o
}

/// `gpuq daos-status --lease` for people: each node's server output under
/// a header, control characters shown escaped.
pub fn server_output(v: &[gpuq_protocol::node::NodeOutput]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for n in v {
        match (&n.output, &n.error) {
            (Some(out), None) => {
                let _ = writeln!(
                    o,
                    "== {}: server output of lease {}{} ==",
                    esc(&n.node),
                    esc(&out.lease),
                    if out.truncated { " (its end)" } else { "" }
                );
                for line in out.output.lines() {
                    let _ = writeln!(o, "{}", esc(line));
                }
            }
            (_, e) => {
                let _ = writeln!(
                    o,
                    "== {}: no server output: {} ==",
                    esc(&n.node),
                    esc(e.as_deref().unwrap_or("no answer"))
                );
            }
        }
    }
    o
}

/// `gpuq daos-status` for people: the lease and hold first, then a line per
/// node, then the profiles' pins.
pub fn daos_status(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let s = |x: &serde_json::Value| esc(x.as_str().unwrap_or("-"));
    if let Some(h) = v["hold"]
        .as_object()
        .filter(|h| h.get("activating") == Some(&true.into()))
    {
        let _ = writeln!(
            o,
            "HELD: activation {} is not finished: {}\n  fix the cause, then run `sudo gpuq activate --execute --destroy-existing-data` again",
            s(&h["lease"].clone()),
            h.get("reason").map(s).unwrap_or_default()
        );
    } else if let Some(h) = v["hold"].as_object() {
        let _ = writeln!(
            o,
            "HELD: lease {} at step {} on {}: {}\n  fix the cause, then run `sudo gpuq recover`",
            s(&h["lease"].clone()),
            h.get("step").map(s).unwrap_or_else(|| "-".into()),
            h.get("node").map(s).unwrap_or_else(|| "-".into()),
            h.get("reason").map(s).unwrap_or_default()
        );
    }
    match v["lease"].as_object() {
        Some(l) => {
            let _ = writeln!(
                o,
                "lease {} ({}) for {}, profile {}{}",
                s(&l["lease"]),
                s(&l["phase"]),
                s(&l["owner"]),
                s(&l["profile"]),
                // A --stor lease says its kind; a DAOS one (or an older
                // record) says nothing more.
                match l.get("kind").and_then(|k| k.as_str()) {
                    Some(k) if k != "daos" => format!(" (--stor {})", esc(k)),
                    _ => String::new(),
                }
            );
        }
        None => {
            let _ = writeln!(o, "no DAOS lease");
        }
    }
    if let Some(l) = v["lock"].as_object() {
        let _ = writeln!(o, "LOCKED: {}", s(&l["reason"]));
    }
    let _ = writeln!(
        o,
        "NODE  LINK        HELPER      PODMAN   LEASE            CONTAINERS"
    );
    for n in v["nodes"].as_array().into_iter().flatten() {
        let st = &n["status"];
        let containers: Vec<String> = st["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| format!("{}:{}", s(&c["name"]), s(&c["state"])))
            .collect();
        let lease = st["lease"]["lease"].as_str().unwrap_or("-");
        let _ = writeln!(
            o,
            "{:<5} {:<11} {:<11} {:<8} {:<16} {}",
            s(&n["node"]),
            s(&n["link"]),
            st["helper_version"].as_str().unwrap_or("-"),
            st["podman_api_version"].as_str().unwrap_or("-"),
            lease,
            if containers.is_empty() {
                "-".into()
            } else {
                containers.join(" ")
            }
        );
        if let Some(e) = n["error"].as_str() {
            let _ = writeln!(o, "      error: {}", esc(e));
        }
        for p in st["pins"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "      profile {}: pinned image {} {}",
                s(&p["profile"]),
                s(&p["image"]),
                if p["present"].as_bool() == Some(true) {
                    "present"
                } else {
                    "NOT PRESENT"
                }
            );
        }
        // What its kernel offers --stor (the missing modules: --json).
        let k = &st["kernel"];
        if k.is_object() {
            let yes = |f: &str| {
                if k[f]["available"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                }
            };
            let _ = writeln!(
                o,
                "      kernel {}: --stor nvmeof {}, nfsrdma {}, lustre {}",
                s(&k["release"]),
                yes("nvmeof_target"),
                yes("nfs_server"),
                yes("lustre_server")
            );
        }
        for r in st["accepted_risks"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "      ACCEPTED RISK (this node's configuration): {}",
                s(r)
            );
        }
    }
    o
}

/// `gpuq verify-pins` for people: one line per host and pin, then strays.
pub fn pins(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let s = |x: &serde_json::Value| esc(x.as_str().unwrap_or("-"));
    for h in v["hosts"].as_array().into_iter().flatten() {
        let host = s(&h["host"]);
        if let Some(e) = h["error"].as_str() {
            let _ = writeln!(o, "{host}: CANNOT CHECK: {}", esc(e));
            continue;
        }
        for p in h["pins"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "{host}: profile {} image {}: {}",
                s(&p["profile"]),
                s(&p["image"]),
                if p["present"] == true {
                    "present".to_string()
                } else {
                    format!("MISSING ({})", s(&p["detail"]))
                }
            );
        }
        for c in h["unpinned_containers"].as_array().into_iter().flatten() {
            let _ = writeln!(
                o,
                "{host}: container {} (lease {}) runs image {}, which no profile pins",
                s(&c["container"]),
                s(&c["lease"]),
                s(&c["image"])
            );
        }
    }
    let _ = writeln!(
        o,
        "{}",
        if v["ok"] == true {
            "all pins verified"
        } else {
            "PIN MISMATCH: see above"
        }
    );
    o
}

/// `gpuq verify-install`: failures first, then configuration changes, then
/// one line per host and the summary. Everything a host sent is escaped.
pub fn install(v: &gpuq_manifest::report::Verdict) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for l in &v.findings {
        let _ = writeln!(
            o,
            "{}: {}: {}: {}",
            esc(&l.host),
            esc(&l.subject),
            l.status.label(),
            esc(&l.detail)
        );
    }
    let mut failed = Vec::new();
    for h in &v.hosts {
        let mut line = format!("{}: {} files ok", esc(&h.host), h.files_ok);
        if h.failures > 0 {
            let _ = write!(line, ", {} FAILED", h.failures);
        }
        if h.config_changed > 0 {
            let _ = write!(line, ", {} configuration files changed", h.config_changed);
        }
        let _ = writeln!(o, "{line}");
    }
    let failures = v.findings.iter().filter(|l| l.status.is_failure()).count();
    // Named from the findings: the PATH check's is no host report's.
    for l in v.findings.iter().filter(|l| l.status.is_failure()) {
        if !failed.contains(&esc(&l.host)) {
            failed.push(esc(&l.host));
        }
    }
    let _ = if v.ok {
        writeln!(
            o,
            "verify-install: all ok on {} hosts (gpuq {})",
            v.hosts.len(),
            v.cli_version
        )
    } else {
        writeln!(
            o,
            "verify-install: FAILED: {failures} finding(s){} (gpuq {})",
            if failed.is_empty() {
                String::new()
            } else {
                format!(" on {}", failed.join(", "))
            },
            v.cli_version
        )
    };
    o
}

/// The `gpuq` root runs when it types `gpuq`: the first one in PATH. If that
/// is not this program (e.g. the original system's `/usr/local/bin/gpuq`
/// ahead of ours), every `sudo gpuq …` an operator types goes elsewhere.
pub fn path_shadow(host: &str) -> Option<gpuq_manifest::report::Line> {
    let own = std::env::current_exe().ok()?.canonicalize().ok()?;
    let path = std::env::var_os("PATH")?;
    first_in_path(&path, "gpuq").and_then(|first| {
        let resolved = first.canonicalize().unwrap_or_else(|_| first.clone());
        (resolved != own).then(|| gpuq_manifest::report::Line {
            host: host.to_string(),
            subject: first.display().to_string(),
            status: gpuq_manifest::report::Status::Shadowed,
            detail: format!(
                "comes before this gpuq ({}) in PATH: `gpuq` runs that one; remove it or reorder PATH",
                own.display()
            ),
        })
    })
}

/// The first executable regular file `name` in a PATH value, as a shell finds it.
fn first_in_path(path: &std::ffi::OsStr, name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// `gpuq stats`: one line per user, then the total.
pub fn usage(r: &gpuq_protocol::UsageReport) -> String {
    let secs = |v: Option<f64>| {
        v.map(|s| dur(s.round().max(0.0) as u64))
            .unwrap_or_else(|| "-".into())
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "jobs that ended from {} to {}{}",
        format_utc(r.since),
        format_utc(r.until),
        if r.all_users {
            ""
        } else {
            " (yours only: everyone's is root's)"
        }
    );
    let _ = writeln!(
        out,
        "{:<16} {:>6} {:>6} {:>6} {:>6} {:>10} {:>10} {:>6} {:>12} {:>12}",
        "USER",
        "JOBS",
        "DONE",
        "FAILED",
        "OTHER",
        "GPU-HOURS",
        "MEAN-WAIT",
        "DAOS",
        "PREP-MEDIAN",
        "CLEAN-MEDIAN"
    );
    let rows = r.users.iter().chain(std::iter::once(&r.total));
    for u in rows {
        let get = |k: &str| u.by_state.get(k).copied().unwrap_or(0);
        let (done, failed) = (get("completed"), get("failed"));
        let _ = writeln!(
            out,
            "{:<16} {:>6} {:>6} {:>6} {:>6} {:>10.2} {:>10} {:>6} {:>12} {:>12}",
            esc(&u.user),
            u.jobs,
            done,
            failed,
            u.jobs - done - failed,
            u.gpu_hours,
            secs(u.mean_wait_secs),
            u.daos_jobs,
            secs(u.prepare_median_secs),
            secs(u.cleanup_median_secs),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{activation, activation_plan, daos_status, esc};

    #[test]
    fn stats_print_a_row_per_user_and_the_total_with_names_escaped() {
        let mut alice = gpuq_protocol::UsageRow {
            user: "ali\u{1b}[2Jce".into(),
            uid: Some(1000),
            jobs: 3,
            gpu_hours: 1.5,
            mean_wait_secs: Some(90.0),
            daos_jobs: 1,
            prepare_median_secs: Some(42.4),
            ..Default::default()
        };
        alice.by_state.insert("completed".into(), 2);
        alice.by_state.insert("cancelled".into(), 1);
        let r = gpuq_protocol::UsageReport {
            since: 1_796_169_600,
            until: 1_796_256_000,
            all_users: false,
            total: gpuq_protocol::UsageRow {
                user: "all".into(),
                ..alice.clone()
            },
            users: vec![alice],
        };
        let text = super::usage(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].contains("2026-12-02 00:00:00Z") && lines[0].contains("yours only"));
        assert!(!text.contains('\u{1b}'), "{text}");
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "ali\\u{1b}[2Jce",
                "3",
                "2",
                "0",
                "1",
                "1.50",
                "0:01:30",
                "1",
                "0:00:42",
                "-"
            ]
        );
        assert!(lines[3].starts_with("all "));
    }

    #[test]
    fn the_first_executable_in_path_is_found_and_others_are_skipped() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        for (sub, mode) in [("a", 0o644), ("b", 0o755), ("c", 0o755)] {
            std::fs::create_dir(d.path().join(sub)).unwrap();
            let f = d.path().join(sub).join("gpuq");
            std::fs::write(&f, b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let path = std::env::join_paths(
            ["relative", "/nonexistent"]
                .iter()
                .map(std::path::PathBuf::from)
                .chain(["a", "b", "c"].iter().map(|s| d.path().join(s))),
        )
        .unwrap();
        assert_eq!(
            super::first_in_path(&path, "gpuq"),
            Some(d.path().join("b/gpuq"))
        );
    }

    #[test]
    fn a_hosts_strings_are_escaped_in_the_report() {
        use gpuq_manifest::report::{Line, Status, Verdict};
        let v = Verdict {
            ok: false,
            cli_version: "0.1.0".into(),
            findings: vec![Line {
                host: "da3".into(),
                subject: "/usr/sbin/\u{1b}[2Jgpuq-node".into(),
                status: Status::Modified,
                detail: "x".into(),
            }],
            hosts: vec![],
        };
        let text = super::install(&v);
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(
            text.contains("MODIFIED") && text.contains("FAILED"),
            "{text}"
        );
    }

    #[test]
    fn controls_and_bidi_overrides_are_shown_escaped_and_text_is_kept() {
        assert_eq!(esc("plain ünïcode"), "plain ünïcode");
        assert_eq!(esc("\u{1b}[2Jx"), "\\u{1b}[2Jx");
        assert_eq!(esc("a\rb\nc\u{9b}"), "a\\rb\\nc\\u{9b}");
        assert_eq!(esc("\u{202e}exe.txt"), "\\u{202e}exe.txt");
    }

    #[test]
    fn an_activation_says_what_each_node_did_and_what_holds_with_node_text_escaped() {
        use gpuq_protocol::node::{ActivationReport, Claim, NodeActivation, SiteActivation};
        let done = NodeActivation {
            node: "da1".into(),
            report: Some(ActivationReport {
                node: "da1".into(),
                activation: "activation-1".into(),
                already_claimed: false,
                done: vec!["stopped daos_server.service\u{1b}[2J".into()],
                claim: Claim {
                    version: 1,
                    node: "da1".into(),
                    activation: "activation-1".into(),
                    claimed_at: "2026-12-04T00:00:00Z".into(),
                    devices: vec![],
                },
            }),
            error: None,
        };
        let held = SiteActivation {
            activation: "activation-1".into(),
            nodes: vec![
                done.clone(),
                NodeActivation {
                    node: "da3".into(),
                    report: None,
                    error: Some("no answer within 16s".into()),
                },
            ],
            held: Some("activation activation-1 did not complete on 1 node(s)".into()),
        };
        let text = activation(&held);
        assert!(
            text.contains("da1:\n  stopped daos_server.service"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(
            text.contains("da3:\n  NOT COMPLETE: no answer within 16s"),
            "{text}"
        );
        assert!(
            text.contains("HELD: activation activation-1 did not complete")
                && text
                    .contains("run `sudo gpuq activate --execute --destroy-existing-data` again"),
            "{text}"
        );
        let ok = SiteActivation {
            nodes: vec![done],
            held: None,
            ..held
        };
        assert!(activation(&ok).contains("Every node is claimed; the hold is released"));
    }

    #[test]
    fn an_activation_plan_shows_what_is_destroyed_and_what_refuses_with_node_text_escaped() {
        use gpuq_protocol::node::{ActivationPlan, NodePlan, PlanCheck, PlanDevice, SitePlan};
        let dev = PlanDevice {
            entry: "serial SN-1, nsid 1".into(),
            path: Some("/dev/nvme0n1".into()),
            identity: "serial SN-1, model \u{1b}[2Jevil".into(),
            size_bytes: Some(1 << 30),
            signatures: vec!["xfs superblock at 0".into()],
            checks: vec![PlanCheck {
                check: "foreign_signature".into(),
                verdict: "refuse".into(),
                detail: "xfs".into(),
            }],
        };
        let plan = SitePlan {
            not_idle: None,
            nodes: vec![
                NodePlan {
                    node: "da1".into(),
                    plan: Some(ActivationPlan {
                        node: "da1".into(),
                        physical_profiles: vec!["inst1".into()],
                        devices: vec![dev],
                        devices_error: None,
                        units: vec![],
                        foreign_processes: vec![],
                        steps: vec!["discard all of /dev/nvme0n1".into()],
                        claim: None,
                        refusals: vec![],
                        accepted_risks: vec!["stor.nfs: NFS over RDMA with AUTH_SYS: …".into()],
                    }),
                    error: None,
                },
                NodePlan {
                    node: "da2".into(),
                    plan: None,
                    error: Some("link: ssh refused".into()),
                },
            ],
        };
        let text = activation_plan(&plan);
        assert!(
            text.contains(
                "device /dev/nvme0n1 — serial SN-1, model \\u{1b}[2Jevil, 1073741824 bytes"
            ),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("on it now: xfs superblock at 0"), "{text}");
        assert!(text.contains("1. discard all of /dev/nvme0n1"), "{text}");
        assert!(
            text.contains(
                "  ACCEPTED RISK (this node's configuration): stor.nfs: NFS over RDMA with AUTH_SYS: …\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("da2:\n  no plan: link: ssh refused"),
            "{text}"
        );
        assert!(
            text.contains("An activation would refuse now:\n  - da2: link: ssh refused"),
            "{text}"
        );
        assert_eq!(plan.refusals(), vec!["da2: link: ssh refused".to_string()]);
    }

    #[test]
    fn daos_status_shows_each_node_s_accepted_risks_escaped() {
        let v = serde_json::json!({
            "lease": null,
            "nodes": [
                {"node": "da1", "link": "up", "status": {
                    "helper_version": "0.1.0", "podman_api_version": "4.3.1",
                    "containers": [], "pins": [],
                    "accepted_risks": ["stor.nfs: NFS over RDMA \u{1b}[2J with AUTH_SYS"]}},
                {"node": "da2", "link": "up", "status": {
                    "helper_version": "0.1.0", "podman_api_version": "4.3.1",
                    "containers": [], "pins": []}}
            ]
        });
        let text = daos_status(&v);
        assert_eq!(text.matches("ACCEPTED RISK").count(), 1, "{text}");
        assert!(
            text.contains(
                "      ACCEPTED RISK (this node's configuration): stor.nfs: NFS over RDMA \\u{1b}[2J with AUTH_SYS\n"
            ),
            "{text}"
        );
    }
}
