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
/// The pool is sized from what the system reports (`storage query
/// usage`, then [`pool_size`]): the smallest DAOS allows on this site's
/// ranks and targets, or one line saying why the site is too small.
const SCRIPT: &str = r#"set -eu
gpuq daos-exec -- sh -euc 'dmg -o "$DAOS_CONTROL_CONFIG" -j storage query usage > usage.json'
size=$(gpuq e2e --pool-size-from usage.json)
gpuq daos-exec -- sh -euc '
dmg -o "$DAOS_CONTROL_CONFIG" -j pool create --size='"$size"' --nranks=4 e2e > pool.json
daos -G "$DAOS_SYSTEM" -j container create --type=POSIX e2e data > container.json
daos -G "$DAOS_SYSTEM" -j filesystem copy --src payload --dst daos://e2e/data > write.json
daos -G "$DAOS_SYSTEM" -j filesystem copy --src daos://e2e/data --dst back > read.json
'
cmp payload back
echo "gpuq e2e: $(wc -c < payload) bytes written and read back through DAOS"
"#;

/// The ranks the e2e pool spans (`--nranks=4`: one per storage node).
const POOL_RANKS: u64 = 4;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The smallest pool DAOS creates over [`POOL_RANKS`] ranks, from `dmg -j
/// storage query usage` (DAOS's `HostStorage` per host: ranked SCM mount
/// points, NVMe controllers' SMD devices with their targets): dmg's
/// default tier ratio (6 % SCM, 94 % NVMe, `cmd/dmg/pool.go`) must give
/// each rank at least 16 MiB of SCM and 1 GiB of NVMe per target
/// (`server/mgmt_pool.go`, `engine/utils.go`), rounded up to whole GiB.
/// Refused, in one line, when fewer ranks report storage or a rank has
/// too little free for it.
pub fn pool_size(usage: &str) -> Result<u64, String> {
    use std::collections::BTreeMap;
    let v: serde_json::Value = serde_json::from_str(usage)
        .map_err(|e| format!("storage query usage: not dmg's JSON ({e})"))?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("storage query usage failed: {e}"));
    }
    let r = &v["response"];
    if let Some(errs) = r["host_errors"].as_object().filter(|m| !m.is_empty()) {
        let first = errs.values().next().cloned().unwrap_or_default();
        return Err(format!(
            "storage query usage: {} host(s) failed, e.g. {}: {}",
            errs.len(),
            first["hosts"].as_str().unwrap_or("?"),
            first["error"].as_str().unwrap_or("?")
        ));
    }
    // rank -> (targets, free SCM, free NVMe)
    let mut ranks: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    for set in r["HostStorage"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
    {
        let st = &set["storage"];
        for m in st["scm_mount_points"].as_array().into_iter().flatten() {
            if let Some(rank) = m["rank"].as_u64() {
                ranks.entry(rank).or_default().1 += m["avail_bytes"].as_u64().unwrap_or(0);
            }
        }
        for c in st["nvme_devices"].as_array().into_iter().flatten() {
            for d in c["smd_devices"].as_array().into_iter().flatten() {
                if let Some(rank) = d["rank"].as_u64() {
                    let e = ranks.entry(rank).or_default();
                    e.0 =
                        e.0.max(d["tgt_ids"].as_array().map_or(0, |t| t.len() as u64));
                    e.2 += d["avail_bytes"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    if (ranks.len() as u64) < POOL_RANKS {
        return Err(format!(
            "the system reports storage on {} rank(s); the e2e pool needs {POOL_RANKS}",
            ranks.len()
        ));
    }
    let targets = ranks.values().map(|r| r.0).max().unwrap_or(0).max(1);
    // Per rank: 6 % of the pool over the ranks >= targets x 16 MiB, and
    // 94 % >= targets x 1 GiB; plus 1 MiB, as DAOS's own advice adds.
    let need_scm = (POOL_RANKS * targets * 16 * MIB) * 100 / 6;
    let need_nvme = (POOL_RANKS * targets * GIB) * 100 / 94;
    let size = (need_scm.max(need_nvme) + MIB).div_ceil(GIB) * GIB;
    let (scm_share, nvme_share) = (size * 6 / 100 / POOL_RANKS, size * 94 / 100 / POOL_RANKS);
    for (rank, (_, scm, nvme)) in &ranks {
        if *scm < scm_share || *nvme < nvme_share {
            return Err(format!(
                "the site is too small for the smallest pool DAOS allows: rank {rank} has {} MiB of SCM and {} MiB of NVMe free; a {} GiB pool over {POOL_RANKS} ranks of {targets} target(s) needs {} MiB and {} MiB on each",
                scm / MIB,
                nvme / MIB,
                size / GIB,
                scm_share.div_ceil(MIB),
                nvme_share.div_ceil(MIB)
            ));
        }
    }
    Ok(size)
}

/// `gpuq e2e --pool-size-from FILE`: [`pool_size`] on stdout, or its
/// refusal on stderr and exit 1.
pub fn print_pool_size(file: &Path) -> i32 {
    match std::fs::read_to_string(file)
        .map_err(|e| format!("{}: {e}", file.display()))
        .and_then(|t| pool_size(&t))
    {
        Ok(n) => {
            println!("{n}");
            Exit::Ok as i32
        }
        Err(e) => {
            eprintln!("gpuq e2e: {e}");
            Exit::Refused as i32
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// `dmg -j storage query usage` as DAOS prints it (lib/control/
    /// storage.go HostStorage; storage/scm.go ScmMountPoint; storage/
    /// bdev.go NvmeController, SmdDevice), fields not read left out: four
    /// hosts of one rank each, `targets` targets, the given free bytes.
    fn usage(targets: u32, scm_free: u64, nvme_free: u64) -> String {
        let hosts: serde_json::Map<String, serde_json::Value> = (0..4u32)
            .map(|rank| {
                (
                    format!("{}", 1000 + rank),
                    serde_json::json!({
                        "hosts": format!("da{}:10001", rank + 1),
                        "storage": {
                            "nvme_devices": [{
                                "pci_addr": "0000:5e:00.0",
                                "smd_devices": [{
                                    "uuid": "u", "rank": rank,
                                    "tgt_ids": (0..targets).collect::<Vec<_>>(),
                                    "total_bytes": nvme_free, "avail_bytes": nvme_free,
                                    "usable_bytes": nvme_free, "roles": "data,meta,wal",
                                }],
                            }],
                            "scm_modules": null, "scm_namespaces": null,
                            "scm_mount_points": [{
                                "class": "ram", "path": "/mnt/daos", "rank": rank,
                                "total_bytes": scm_free, "avail_bytes": scm_free,
                            }],
                            "smd_info": null, "reboot_required": false, "mem_info": null,
                        }
                    }),
                )
            })
            .collect();
        serde_json::json!({
            "response": {"host_errors": {}, "HostStorage": hosts},
            "error": null,
            "status": 0,
        })
        .to_string()
    }

    #[test]
    fn the_pool_is_the_smallest_daos_allows_for_the_targets_reported() {
        // One target per rank: 4 x 1 GiB / 0.94 = 4.26 GiB -> 5 GiB.
        assert_eq!(pool_size(&usage(1, 4 * GIB, 2 * GIB)), Ok(5 * GIB));
        // Sixteen: 4 x 16 GiB / 0.94 = 68.1 GiB -> 69 GiB.
        assert_eq!(pool_size(&usage(16, 64 * GIB, 3000 * GIB)), Ok(69 * GIB));
        // Each rank's share passes DAOS's minimums per target.
        for t in [1u64, 4, 8, 16, 24] {
            let size = pool_size(&usage(t as u32, 1 << 40, 1 << 42)).unwrap();
            assert!(size * 6 / 100 / 4 >= t * 16 * MIB, "{t}");
            assert!(size * 94 / 100 / 4 >= t * GIB, "{t}");
            assert!(
                size - GIB < (4 * t * GIB) * 100 / 94 + MIB,
                "{t}: not the smallest"
            );
        }
    }

    #[test]
    fn a_site_too_small_is_refused_in_one_line_naming_the_rank() {
        let e = pool_size(&usage(1, 4 * GIB, GIB)).unwrap_err();
        assert!(e.starts_with("the site is too small for the smallest pool DAOS allows: rank 0 has 4096 MiB of SCM and 1024 MiB of NVMe free; a 5 GiB pool"), "{e}");
        assert_eq!(e.lines().count(), 1);
        let e = pool_size(&usage(4, 16 * MIB, 1 << 40)).unwrap_err();
        assert!(e.contains("16 MiB of SCM"), "{e}");
    }

    #[test]
    fn errors_and_missing_ranks_are_refused() {
        let e = pool_size(r#"{"response":null,"error":"system is uninitialized","status":-1025}"#)
            .unwrap_err();
        assert_eq!(e, "storage query usage failed: system is uninitialized");
        let mut v: serde_json::Value = serde_json::from_str(&usage(1, GIB, GIB)).unwrap();
        v["response"]["host_errors"] =
            serde_json::json!({"1": {"hosts": "da3:10001", "error": "connection refused"}});
        let e = pool_size(&v.to_string()).unwrap_err();
        assert!(e.contains("da3:10001: connection refused"), "{e}");
        let mut v: serde_json::Value = serde_json::from_str(&usage(1, GIB, GIB)).unwrap();
        v["response"]["HostStorage"]
            .as_object_mut()
            .unwrap()
            .remove("1003");
        let e = pool_size(&v.to_string()).unwrap_err();
        assert!(e.contains("storage on 3 rank(s)"), "{e}");
        assert!(pool_size("not json").is_err());
    }
}
