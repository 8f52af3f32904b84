//! Slurm's own commands, for what its lua calls do not pass: a job's
//! state and nodes (`squeue`), and its node list (`scontrol update`).

use crate::{failed, Config, Error};
use std::path::Path;
use std::time::Duration;

/// A Slurm command (`squeue`, `scontrol`) with `args`, within 30 s (its
/// process killed past that): its output, whatever its exit status.
pub(crate) async fn slurm_cmd(cmd: &Path, args: &[&str]) -> Result<std::process::Output, Error> {
    tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(cmd)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| Error::Failed(format!("{} did not answer within 30s", cmd.display())))?
    .map_err(failed(cmd.display()))
}

/// `squeue` about one job: the field `format` of `job` (any state), or
/// `None` once Slurm no longer knows the job (it ended long ago).
pub(crate) async fn squeue(cfg: &Config, job: u64, format: &str) -> Result<Option<String>, Error> {
    let (id, fields) = (job.to_string(), format!("%i|{format}"));
    let args = [
        "--noheader",
        "--states=all",
        "--jobs",
        &id,
        "--format",
        &fields,
    ];
    let out = slurm_cmd(&cfg.squeue, &args).await?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if err.contains("Invalid job id") {
            return Ok(None);
        }
        return Err(Error::Failed(format!(
            "{} for job {job}: {} {}",
            cfg.squeue.display(),
            out.status,
            err.trim()
        )));
    }
    // `ID|field` (the field may be empty: no node list asked for).
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{job}|")))
        .map(|f| f.trim().to_string()))
}

/// Make `job` run on `agent_host`: refused if it asks for other nodes.
pub(crate) async fn pin(cfg: &Config, job: u64) -> Result<String, Error> {
    let asked = squeue(cfg, job, "%n")
        .await?
        .ok_or_else(|| Error::Failed(format!("Slurm does not know job {job}")))?;
    let host = &cfg.agent_host;
    if asked == *host {
        return Ok(format!("it asked for {host}"));
    }
    if !asked.is_empty() && asked != "(null)" {
        return Err(Error::Refused(format!(
            "job {job} asks for nodes {asked:?}, but the DAOS site's agent runs on {host} only: submit DAOS jobs with --nodelist={host} or without a node list (docs/slurm.md)"
        )));
    }
    let (id, nodes) = (format!("JobId={job}"), format!("ReqNodeList={host}"));
    let out = slurm_cmd(&cfg.scontrol, &["update", &id, &nodes]).await?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "{} update JobId={job} ReqNodeList={host}: {} {}",
            cfg.scontrol.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(format!("pinned to {host}, where its agent runs"))
}

/// Slurm job states after which no teardown of the job comes any more.
pub(crate) fn ended(state: &str) -> bool {
    !matches!(
        state,
        "PENDING"
            | "CONFIGURING"
            | "RUNNING"
            | "COMPLETING"
            | "SUSPENDED"
            | "REQUEUED"
            | "REQUEUE_FED"
            | "REQUEUE_HOLD"
            | "RESIZING"
            | "SIGNALING"
            | "STAGE_OUT"
            | "STOPPED"
            | "RESV_DEL_HOLD"
            | "SPECIAL_EXIT"
    )
}
