//! Slurm's own commands, for what its lua calls do not pass: a job's
//! state and nodes (`squeue`), its node list (`scontrol update`), and the
//! processes its steps have on this host (`scontrol listpids`).

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

/// Make `job` run on one host that serves DAOS jobs: the one it asked
/// for (`agent_host` or a `[[slurm.gpu_hosts]]` entry); with no node list,
/// the first of them that Slurm says is idle, else `agent_host`. Refused if
/// it asks for any other node list. `(what was done, host)`.
pub(crate) async fn pin(cfg: &Config, job: u64) -> Result<(String, String), Error> {
    let asked = squeue(cfg, job, "%n")
        .await?
        .ok_or_else(|| Error::Failed(format!("Slurm does not know job {job}")))?;
    let hosts = cfg.daos_hosts();
    if let Some(h) = hosts.iter().find(|h| **h == asked) {
        return Ok((format!("it asked for {h}"), h.to_string()));
    }
    if !asked.is_empty() && asked != "(null)" {
        return Err(Error::Refused(format!(
            "job {job} asks for nodes {asked:?}, but a DAOS job runs on one host that serves them: submit it with --nodelist={} or without a node list (docs/slurm.md)",
            hosts.join(" or --nodelist=")
        )));
    }
    let (host, why) = if hosts.len() == 1 {
        (cfg.agent_host.clone(), "where its agent runs".to_string())
    } else {
        match node_states(cfg).await {
            Ok(states) => match hosts
                .iter()
                .find(|h| states.iter().any(|(n, st)| n == *h && st == "IDLE"))
            {
                Some(h) => (
                    h.to_string(),
                    "the first idle host that serves DAOS jobs".into(),
                ),
                None => (
                    cfg.agent_host.clone(),
                    "no host that serves DAOS jobs is idle".into(),
                ),
            },
            Err(e) => (
                cfg.agent_host.clone(),
                format!("Slurm's node states could not be read ({e})"),
            ),
        }
    };
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
    Ok((format!("pinned to {host}, {why}"), host))
}

/// Every node's (NodeName, State) as `scontrol --oneliner show nodes`
/// says (`IDLE`, `MIXED`, `ALLOCATED`, `IDLE+DRAIN`, `DOWN*`, ...).
async fn node_states(cfg: &Config) -> Result<Vec<(String, String)>, Error> {
    let out = slurm_cmd(&cfg.scontrol, &["--oneliner", "show", "nodes"]).await?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "{} show nodes: {} {}",
            cfg.scontrol.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(parse_node_states(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_node_states(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(k))
                    .map(str::to_string)
            };
            Some((field("NodeName=")?, field("State=")?))
        })
        .collect()
}

/// The PIDs of `job`'s processes on this host, `node` (its Slurm
/// NodeName), as the job's own slurmstepd tracks them: `scontrol listpids`
/// asks each step's slurmstepd through its socket in the spool directory,
/// not slurmd, so it answers also when this node's slurmd is gone. Empty
/// when no step of the job is left here.
pub(crate) async fn job_pids(scontrol: &Path, job: u64, node: &str) -> Result<Vec<u32>, Error> {
    let id = job.to_string();
    let out = slurm_cmd(scontrol, &["listpids", &id, node]).await?;
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if text.contains("does not exist on node") || err.contains("does not exist on node") {
            return Ok(Vec::new());
        }
        return Err(Error::Failed(format!(
            "{} listpids {job} {node}: {} {}{}",
            scontrol.display(),
            out.status,
            text.trim(),
            err.trim()
        )));
    }
    parse_listpids(&text, job)
}

/// `PID JOBID STEPID ...` lines after a header; only lines of `job`.
fn parse_listpids(text: &str, job: u64) -> Result<Vec<u32>, Error> {
    let mut pids = Vec::new();
    for line in text.lines().skip(1) {
        let mut f = line.split_whitespace();
        let (Some(pid), Some(j)) = (f.next(), f.next()) else {
            continue;
        };
        if j != job.to_string() {
            continue;
        }
        let pid = pid
            .parse::<u32>()
            .ok()
            .filter(|p| *p > 1)
            .ok_or_else(|| Error::Failed(format!("scontrol listpids: not a PID: {line:?}")))?;
        pids.push(pid);
    }
    Ok(pids)
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

#[cfg(test)]
mod tests {
    #[test]
    fn node_states_are_read_from_scontrols_one_line_per_node() {
        let text = "NodeName=cxl2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 State=ALLOCATED ThreadsPerCore=1\n\
                    NodeName=gpu2 Arch=x86_64 CPUAlloc=0 State=IDLE ThreadsPerCore=1\n\
                    NodeName=gpu3 State=IDLE+DRAIN\n\
                    garbage line\n";
        assert_eq!(
            super::parse_node_states(text),
            vec![
                ("cxl2".to_string(), "ALLOCATED".to_string()),
                ("gpu2".to_string(), "IDLE".to_string()),
                ("gpu3".to_string(), "IDLE+DRAIN".to_string()),
            ]
        );
    }

    use super::parse_listpids;

    #[test]
    fn listpids_output_gives_the_jobs_pids_only() {
        let text = "PID      JOBID    STEPID   LOCALID GLOBALID\n26085    1        batch    0       0       \n26101    1        batch    -       -       \n 77 2 0 - -\n";
        assert_eq!(parse_listpids(text, 1).unwrap(), vec![26085, 26101]);
        assert_eq!(
            parse_listpids("PID JOBID STEPID\n", 1).unwrap(),
            Vec::<u32>::new()
        );
        assert!(parse_listpids("PID JOBID\nx 1\n", 1).is_err());
        assert!(parse_listpids("PID JOBID\n1 1\n", 1).is_err());
    }
}
