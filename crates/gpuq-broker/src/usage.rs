//! `gpuq stats`: what the queue did for each user over a period, from the
//! store alone (the jobs that ended in it, and the DAOS jobs' recorded
//! preparation and cleanup times).

use crate::store::EndedJob;
use gpuq_protocol::{UsageReport, UsageRow};
use std::collections::BTreeMap;

/// The period a report covers when none is asked for: 30 days to now.
pub const DEFAULT_DAYS: i64 = 30;

/// Add up `jobs` (all ended in `[since, until)`) per user and in total;
/// users by name, then UID.
pub fn report(since: i64, until: i64, all_users: bool, jobs: &[EndedJob]) -> UsageReport {
    let mut per: BTreeMap<u32, Vec<&EndedJob>> = BTreeMap::new();
    for j in jobs {
        per.entry(j.uid).or_default().push(j);
    }
    let mut users: Vec<UsageRow> = per
        .iter()
        .map(|(uid, js)| {
            // The name of the user's latest job: a renamed account shows
            // its name now.
            let name = js.last().map(|j| j.user.clone()).unwrap_or_default();
            row(name, Some(*uid), js)
        })
        .collect();
    users.sort_by(|a, b| a.user.cmp(&b.user).then(a.uid.cmp(&b.uid)));
    let all: Vec<&EndedJob> = jobs.iter().collect();
    UsageReport {
        since,
        until,
        all_users,
        users,
        total: row("all".into(), None, &all),
    }
}

fn row(user: String, uid: Option<u32>, jobs: &[&EndedJob]) -> UsageRow {
    let mut by_state = BTreeMap::new();
    let mut gpu_secs = 0i64;
    let mut waits = Vec::new();
    let mut prepares = Vec::new();
    let mut cleanups = Vec::new();
    let mut daos_jobs = 0;
    for j in jobs {
        *by_state.entry(j.state.clone()).or_insert(0u64) += 1;
        if let Some(s) = j.started_at {
            gpu_secs += (j.ended_at - s).max(0);
            waits.push((s - j.submitted_at).max(0) as f64);
        }
        if j.daos {
            daos_jobs += 1;
            prepares.extend(j.prepare_secs);
            cleanups.extend(j.cleanup_secs);
        }
    }
    UsageRow {
        user,
        uid,
        jobs: jobs.len() as u64,
        by_state,
        gpu_hours: gpu_secs as f64 / 3600.0,
        mean_wait_secs: (!waits.is_empty()).then(|| waits.iter().sum::<f64>() / waits.len() as f64),
        daos_jobs,
        prepare_median_secs: median(&mut prepares),
        cleanup_median_secs: median(&mut cleanups),
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(uid: u32, user: &str, state: &str, sub: i64, start: Option<i64>, end: i64) -> EndedJob {
        EndedJob {
            uid,
            user: user.into(),
            state: state.into(),
            submitted_at: sub,
            started_at: start,
            ended_at: end,
            daos: false,
            prepare_secs: None,
            cleanup_secs: None,
        }
    }

    #[test]
    fn rows_per_user_and_in_total() {
        let mut d1 = job(1001, "bob", "completed", 0, Some(60), 3660);
        d1.daos = true;
        d1.prepare_secs = Some(30.0);
        d1.cleanup_secs = Some(10.0);
        let mut d2 = job(1001, "bob", "failed", 100, Some(100), 200);
        d2.daos = true;
        d2.prepare_secs = Some(50.0);
        // Its cleanup was held: no cleanup time.
        let mut d3 = job(1000, "alice", "completed", 0, Some(0), 7200);
        d3.daos = true;
        d3.prepare_secs = Some(20.0);
        d3.cleanup_secs = Some(14.0);
        let jobs = vec![
            job(1000, "alice", "completed", 0, Some(10), 3610),
            // Cancelled while queued: counted, no GPU time, no wait.
            job(1000, "alice", "cancelled", 0, None, 500),
            d1,
            d2,
            d3,
        ];
        let r = report(0, 10_000, true, &jobs);
        assert_eq!(r.users.len(), 2);
        let (a, b) = (&r.users[0], &r.users[1]);
        assert_eq!((a.user.as_str(), a.uid), ("alice", Some(1000)));
        assert_eq!(a.jobs, 3);
        assert_eq!(a.by_state["completed"], 2);
        assert_eq!(a.by_state["cancelled"], 1);
        assert!((a.gpu_hours - 3.0).abs() < 1e-9, "{}", a.gpu_hours);
        assert_eq!(a.mean_wait_secs, Some(5.0));
        assert_eq!(a.daos_jobs, 1);
        assert_eq!(a.prepare_median_secs, Some(20.0));
        assert_eq!(b.user, "bob");
        assert_eq!(b.daos_jobs, 2);
        assert_eq!(b.prepare_median_secs, Some(40.0));
        assert_eq!(b.cleanup_median_secs, Some(10.0));
        assert_eq!(b.mean_wait_secs, Some(30.0));
        let t = &r.total;
        assert_eq!((t.user.as_str(), t.uid, t.jobs), ("all", None, 5));
        assert_eq!(t.daos_jobs, 3);
        assert_eq!(t.prepare_median_secs, Some(30.0));
        assert_eq!(t.cleanup_median_secs, Some(12.0));
        assert!((t.gpu_hours - (3600.0 + 100.0 + 3600.0 + 7200.0) / 3600.0).abs() < 1e-9);
    }

    #[test]
    fn an_empty_period_has_a_zero_total_and_no_means() {
        let r = report(5, 6, false, &[]);
        assert!(r.users.is_empty());
        assert_eq!(r.total.jobs, 0);
        assert_eq!(r.total.mean_wait_secs, None);
        assert_eq!(r.total.prepare_median_secs, None);
        assert!(!r.all_users);
    }
}
