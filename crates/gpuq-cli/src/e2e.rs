//! `gpuq e2e` (root, under the maintenance lock): the end-to-end
//! verification of a DAOS site (issue #17, item 3). Each round submits a
//! root `--inst` job that creates a pool and a POSIX container, writes a
//! payload and reads it back through `gpuq daos-exec`, waits for the job
//! and then for its lease's release, and asks the broker for the lease's
//! evidence on cxl2 and every node (`GET /v1/e2e/job/ID`). `--lease NAME`
//! checks an earlier lease only. A table per node and check, or `--json`;
//! exit 1 when any check of any round failed.

use crate::Exit;
use gpuq_client::{Client, ClientError};
use gpuq_protocol::node::{E2eReport, E2eStart, EvidenceCheck};
use gpuq_protocol::{routes, JobState, JobView, SubmitRequest, SubmitResponse};
use hyper::Method;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long a round's job may take (preparation, the job, its cleanup).
const JOB_DEADLINE: Duration = Duration::from_secs(45 * 60);
/// How long the lease may take to be released after the job ended.
const RELEASE_DEADLINE: Duration = Duration::from_secs(15 * 60);

/// What the job runs in its own directory: pool, container, the payload
/// written and read back through DAOS, compared byte for byte.
const SCRIPT: &str = r#"set -eu
gpuq daos-exec -- sh -euc '
dmg -o "$DAOS_CONTROL_CONFIG" -j pool create --size=5G --nranks=4 e2e > pool.json
daos -G "$DAOS_SYSTEM" -j container create --type=POSIX e2e data > container.json
daos -G "$DAOS_SYSTEM" -j filesystem copy --src payload --dst daos://e2e/data > write.json
daos -G "$DAOS_SYSTEM" -j filesystem copy --src daos://e2e/data --dst back > read.json
'
cmp payload back
echo "gpuq e2e: $(wc -c < payload) bytes written and read back through DAOS"
"#;

/// One round's outcome, as `--json` prints it.
#[derive(Debug, serde::Serialize)]
struct Round {
    round: u32,
    job: Option<u64>,
    /// The job's own checks (it ran and completed), then the lease's.
    job_checks: Vec<EvidenceCheck>,
    report: Option<E2eReport>,
    /// Where the job ran (kept when the round failed).
    workdir: String,
    ok: bool,
}

pub async fn run(
    client: &Client,
    profile: Option<String>,
    repeat: u32,
    lease: Option<String>,
    json: bool,
) -> Result<i32, ClientError> {
    if !(1..=100).contains(&repeat) {
        eprintln!("gpuq: --repeat {repeat}: give 1 to 100 rounds");
        return Ok(Exit::Usage as i32);
    }
    if let Some(l) = lease {
        let r: E2eReport = client
            .call(
                Method::GET,
                &format!("{}/lease/{l}", routes::E2E),
                None::<&()>,
            )
            .await?;
        let ok = r.ok();
        if json {
            println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
        } else {
            print!("{}", render(&r, &[]));
        }
        return Ok(if ok { Exit::Ok } else { Exit::Refused } as i32);
    }
    let start: E2eStart = client.call(Method::GET, routes::E2E, None::<&()>).await?;
    if !start.locked {
        eprintln!("gpuq: e2e runs under the maintenance lock, so that no researcher's job runs between its rounds: `sudo gpuq lock --reason 'e2e'` first, `sudo gpuq unlock` after; nothing was submitted");
        return Ok(Exit::Refused as i32);
    }
    let profile = match (profile, start.profiles.as_slice()) {
        (Some(p), ps) if ps.contains(&p) => p,
        (Some(p), ps) => {
            eprintln!(
                "gpuq: no DAOS profile '{p}' (configured: {}); nothing was submitted",
                ps.join(", ")
            );
            return Ok(Exit::Usage as i32);
        }
        (None, [one]) => one.clone(),
        (None, ps) => {
            eprintln!(
                "gpuq: say which DAOS profile with --profile (configured: {}); nothing was submitted",
                ps.join(", ")
            );
            return Ok(Exit::Usage as i32);
        }
    };
    let mut rounds = Vec::new();
    for round in 1..=repeat {
        let r = one_round(client, &profile, round).await?;
        if !json {
            print!("{}", render_round(&r));
        }
        rounds.push(r);
    }
    let failed = rounds.iter().filter(|r| !r.ok).count();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rounds).unwrap_or_default()
        );
    } else if repeat > 1 {
        println!("\n{} of {repeat} rounds passed", repeat as usize - failed);
    }
    Ok(if failed == 0 { Exit::Ok } else { Exit::Refused } as i32)
}

async fn one_round(client: &Client, profile: &str, round: u32) -> Result<Round, ClientError> {
    let dir = match workdir(round) {
        Ok(d) => d,
        Err(why) => {
            return Ok(Round {
                round,
                job: None,
                job_checks: vec![failed("job_completed", why)],
                report: None,
                workdir: String::new(),
                ok: false,
            })
        }
    };
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k != "PATH")
        .collect();
    // The job finds this very `gpuq` first.
    let own = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .map(|p| format!("{}:", p.display()))
        .unwrap_or_default();
    env.push((
        "PATH".into(),
        format!("{own}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ));
    let req = SubmitRequest {
        argv: vec!["sh".into(), "-c".into(), SCRIPT.into()],
        cwd: dir.display().to_string(),
        env,
        time: Some("30m".into()),
        name: Some(format!("gpuq-e2e-{round}")),
        inst: Some(profile.to_string()),
        stor: None,
    };
    let sub: SubmitResponse = client.call(Method::POST, routes::JOBS, Some(&req)).await?;
    let job = sub.id.0;
    // The job's end.
    let t = Instant::now();
    let view = loop {
        let v: JobView = client
            .call(Method::GET, &format!("{}/{job}", routes::JOBS), None::<&()>)
            .await?;
        if !matches!(v.state, JobState::Queued | JobState::Running) || t.elapsed() > JOB_DEADLINE {
            break v;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let completed = view.state == JobState::Completed;
    let job_check = EvidenceCheck {
        check: "job_completed".into(),
        ok: completed,
        detail: format!(
            "job {job} {}{}; log {}",
            serde_json::to_value(view.state)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            view.reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default(),
            view.log_path
        ),
    };
    // The lease's release, then its evidence.
    let t = Instant::now();
    let report = loop {
        let r: Result<E2eReport, ClientError> = client
            .call(
                Method::GET,
                &format!("{}/job/{job}", routes::E2E),
                None::<&()>,
            )
            .await;
        match r {
            Ok(r) if r.released || t.elapsed() > RELEASE_DEADLINE => break Some(r),
            Ok(_) => {}
            // A job refused before its lease existed has none to check.
            Err(e) if t.elapsed() > Duration::from_secs(10) => {
                return Ok(Round {
                    round,
                    job: Some(job),
                    job_checks: vec![job_check, failed("lease_found", e.to_string())],
                    report: None,
                    workdir: dir.display().to_string(),
                    ok: false,
                });
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let ok = completed && report.as_ref().is_some_and(E2eReport::ok);
    if ok {
        // Nothing of a passed round is left on this host.
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(Round {
        round,
        job: Some(job),
        job_checks: vec![job_check],
        report,
        workdir: dir.display().to_string(),
        ok,
    })
}

fn failed(check: &str, detail: String) -> EvidenceCheck {
    EvidenceCheck {
        check: check.into(),
        ok: false,
        detail,
    }
}

/// A new root-only directory for a round, with its payload.
fn workdir(round: u32) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = PathBuf::from(format!(
        "/var/tmp/gpuq-e2e-{}-{nanos}-{round}",
        std::process::id()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut payload = format!("gpuq e2e round {round} at {nanos}\n");
    for i in 0..64 {
        payload.push_str(&format!("{i:04} {}\n", "0123456789abcdef".repeat(3)));
    }
    std::fs::write(dir.join("payload"), payload)
        .map_err(|e| format!("cannot write {}/payload: {e}", dir.display()))?;
    Ok(dir)
}

fn render_round(r: &Round) -> String {
    let mut o = format!(
        "round {}{}:\n",
        r.round,
        r.job.map(|j| format!(" (job {j})")).unwrap_or_default()
    );
    match &r.report {
        Some(rep) => o.push_str(&render(rep, &r.job_checks)),
        None => {
            for c in &r.job_checks {
                o.push_str(&line("cxl2", c));
            }
            o.push_str("FAILED\n");
        }
    }
    if !r.ok && !r.workdir.is_empty() {
        o.push_str(&format!("  (the job's directory is kept: {})\n", r.workdir));
    }
    o
}

/// The table: host, check, result, what was found.
fn render(r: &E2eReport, job_checks: &[EvidenceCheck]) -> String {
    let esc = crate::render::esc;
    let mut o = format!("lease {} (profile {}):\n", esc(&r.lease), esc(&r.profile));
    let mut test_mode = false;
    for c in job_checks.iter().chain(&r.host) {
        o.push_str(&line("cxl2", c));
    }
    for n in &r.nodes {
        match (&n.evidence, &n.error) {
            (Some(e), None) => {
                test_mode |= e.mode == "test";
                for c in &e.checks {
                    o.push_str(&line(&n.node, c));
                }
            }
            (_, e) => o.push_str(&line(
                &n.node,
                &failed("answered", e.clone().unwrap_or_else(|| "no answer".into())),
            )),
        }
    }
    if test_mode {
        o.push_str("  (test mode: the lease's test directories were checked, not NVMe devices)\n");
    }
    o.push_str(if r.ok() && job_checks.iter().all(|c| c.ok) {
        "PASSED\n"
    } else {
        "FAILED\n"
    });
    o
}

fn line(host: &str, c: &EvidenceCheck) -> String {
    let esc = crate::render::esc;
    format!(
        "  {:<5} {:<20} {:<6} {}\n",
        esc(host),
        esc(&c.check),
        if c.ok { "ok" } else { "FAILED" },
        esc(&c.detail)
    )
}
