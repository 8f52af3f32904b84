//! The queue core, end to end: a real `gpuq-broker` process, the real `gpuq`
//! CLI as root and as other users, jobs in real cgroups.

use gpuq_system_tests::*;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

fn alice() -> User {
    User::new(61001, 61001, &[61001, 61010])
}
fn bob() -> User {
    User::new(61002, 61002, &[])
}

fn read(p: &std::path::Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn log_of(b: &TestBroker, id: u64) -> String {
    let j = b.job(id);
    read(std::path::Path::new(j["log_path"].as_str().unwrap()))
}

#[test]
fn jobs_run_one_at_a_time_in_fifo_order() {
    require_env!();
    let b = TestBroker::start();
    let w = b.workdir(None, "w");
    let trace = w.join("trace");
    let t = trace.display().to_string();
    let ids: Vec<u64> = (1..=3)
        .map(|n| {
            let script = format!("echo start {n} >> {t}; sleep 0.3; echo end {n} >> {t}");
            b.submit(ROOT, &w, &["--", "bash", "-c", &script])
        })
        .collect();
    for id in &ids {
        b.wait_state(*id, "completed", 30);
    }
    assert_eq!(
        read(&trace),
        "start 1\nend 1\nstart 2\nend 2\nstart 3\nend 3\n",
        "strict FIFO, never two at once"
    );
}

#[test]
fn job_runs_as_submitter_with_groups_cwd_and_filtered_env() {
    require_env!();
    let b = TestBroker::start();
    let a = alice();
    let w = b.workdir(Some(&a), "alice");
    let out = b.gpuq_in(
        Some(&a),
        &w,
        &[
            ("DAOS_POOL", "oldpool"),
            ("DAOS_CONTAINER", "oldcont"),
            ("DAOS_SYSTEM", "old"),
            ("GPUQ_JOB_ID", "999"),
            ("MY_SETTING", "kept value"),
        ],
        &[
            "submit",
            "--",
            "bash",
            "-c",
            "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); echo cwd=$PWD; env | sort",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id: u64 = stdout(&out)
        .trim()
        .parse()
        .expect("stdout is only the job ID");
    b.wait_state(id, "completed", 30);
    let log = log_of(&b, id);
    assert!(
        log.contains("uid=61001 gid=61001 groups=61001 61010"),
        "{log}"
    );
    assert!(log.contains(&format!("cwd={}", w.display())), "{log}");
    assert!(log.contains("MY_SETTING=kept value"), "{log}");
    assert!(log.contains(&format!("GPUQ_JOB_ID={id}\n")), "{log}");
    assert!(!log.contains("DAOS_"), "old DAOS settings leaked: {log}");
    assert!(!log.contains("999"), "{log}");
}

#[test]
fn log_file_belongs_to_the_user_and_has_lifecycle_lines() {
    require_env!();
    let b = TestBroker::start();
    let a = alice();
    let w = b.workdir(Some(&a), "alice");
    let id = b.submit(
        Some(&a),
        &w,
        &["--", "bash", "-c", "echo to-out; echo to-err >&2; exit 4"],
    );
    let j = b.wait_state(id, "failed", 30);
    assert_eq!(j["exit_code"], 4);
    let path = std::path::PathBuf::from(j["log_path"].as_str().unwrap());
    assert_eq!(path, b.path(&format!("logs/61001/gpuq-{id}.log")));
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (61001, 61001, 0o600));
    let d = std::fs::metadata(path.parent().unwrap()).unwrap();
    assert_eq!((d.uid(), d.mode() & 0o777), (61001, 0o700));
    let log = read(&path);
    let order: Vec<&str> = log.lines().collect();
    assert!(
        order[0].starts_with("gpuq: ") && order[0].contains("queued"),
        "{log}"
    );
    assert!(
        order[1].starts_with("gpuq: ") && order[1].contains("started"),
        "{log}"
    );
    assert_eq!(
        &order[2..4],
        &["to-out", "to-err"],
        "stdout and stderr interleave in order"
    );
    assert!(
        order[4].starts_with("gpuq: ") && order[4].contains("exit status 4"),
        "{log}"
    );
    // The user reads it through the CLI; another user may not.
    let own = b.gpuq(Some(&a), &["log", &id.to_string()]);
    assert!(stdout(&own).contains("to-err"));
    let other = b.gpuq(Some(&bob()), &["log", &id.to_string()]);
    assert_eq!(other.status.code(), Some(1));
    assert!(stderr(&other).contains("belongs to"), "{}", stderr(&other));
}

/// The PIDs a job wrote into `dir/pids` (one per line).
fn pids(dir: &std::path::Path) -> Vec<i32> {
    read(&dir.join("pids"))
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

const TREE: &str = "sleep 1000 & echo $! >> pids; setsid sleep 1000 & echo $! >> pids; \
                    (trap '' TERM HUP; exec sleep 1000) & echo $! >> pids; echo $$ >> pids; wait";

#[test]
fn cancel_of_a_running_job_ends_its_whole_process_tree() {
    require_env!();
    let b = TestBroker::start();
    let a = alice();
    let w = b.workdir(Some(&a), "alice");
    let id = b.submit(Some(&a), &w, &["--", "bash", "-c", TREE]);
    b.wait_state(id, "running", 30);
    assert!(
        eventually(10, || pids(&w).len() == 4),
        "job did not start its tree"
    );
    let tree = pids(&w);
    assert!(tree.iter().all(|p| alive(*p)));
    let out = b.gpuq(Some(&a), &["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // cancel returns once the processes are gone
    let survivors: Vec<i32> = tree.iter().copied().filter(|p| alive(*p)).collect();
    assert!(survivors.is_empty(), "survived cancel: {survivors:?}");
    let j = b.job(id);
    assert_eq!(j["state"], "cancelled");
    assert!(j["reason"].as_str().unwrap().contains("uid 61001"), "{j}");
    assert!(log_of(&b, id).contains("cancelled by"));
}

#[test]
fn cancel_of_a_queued_job_means_it_never_runs() {
    require_env!();
    let b = TestBroker::start();
    let w = b.workdir(None, "w");
    let first = b.submit(ROOT, &w, &["--", "sleep", "1.5"]);
    let second = b.submit(ROOT, &w, &["--", "touch", "ran"]);
    b.wait_state(first, "running", 30);
    let out = b.gpuq(ROOT, &["cancel", &second.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    b.wait_state(first, "completed", 30);
    let third = b.submit(ROOT, &w, &["--", "true"]);
    b.wait_state(third, "completed", 30);
    assert_eq!(b.state(second), "cancelled");
    assert!(!w.join("ran").exists(), "a cancelled queued job ran");
    // Cancelling it again is a clear conflict, not a silent success.
    let again = b.gpuq(ROOT, &["cancel", &second.to_string()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("already cancelled"),
        "{}",
        stderr(&again)
    );
}

#[test]
fn time_limit_kills_the_whole_tree_and_follow_exits_124() {
    require_env!();
    let b = TestBroker::start();
    let a = alice();
    let w = b.workdir(Some(&a), "alice");
    let id = b.submit(Some(&a), &w, &["--time", "2s", "--", "bash", "-c", TREE]);
    let follow = b.gpuq(Some(&a), &["follow", &id.to_string()]);
    assert_eq!(follow.status.code(), Some(124), "{}", stderr(&follow));
    assert!(stdout(&follow).contains("reached its time limit 0:00:02"));
    let j = b.job(id);
    assert_eq!(j["state"], "timeout");
    let tree = pids(&w);
    assert_eq!(tree.len(), 4);
    assert!(tree.iter().all(|p| !alive(*p)), "survived the time limit");
}

#[test]
fn follow_streams_until_the_end_and_returns_the_exit_code() {
    require_env!();
    let b = TestBroker::start();
    let w = b.workdir(None, "w");
    let id = b.submit(
        ROOT,
        &w,
        &[
            "--",
            "bash",
            "-c",
            "for i in 1 2 3; do echo line$i; sleep 0.2; done; exit 7",
        ],
    );
    let out = b.gpuq(ROOT, &["follow", &id.to_string()]);
    assert_eq!(out.status.code(), Some(7));
    let text = stdout(&out);
    assert!(text.contains("line1\nline2\nline3\n"), "{text}");
    assert!(
        text.trim_end().ends_with("exit status 7 after 0:00:00") || text.contains("exit status 7"),
        "{text}"
    );
}

#[test]
fn another_users_cancel_is_refused_and_changes_nothing() {
    require_env!();
    let b = TestBroker::start();
    let a = alice();
    let w = b.workdir(Some(&a), "alice");
    let running = b.submit(Some(&a), &w, &["--", "sleep", "30"]);
    let queued = b.submit(Some(&a), &w, &["--", "sleep", "30"]);
    b.wait_state(running, "running", 30);
    for id in [running, queued] {
        let out = b.gpuq(Some(&bob()), &["cancel", &id.to_string()]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(
            stderr(&out).trim(),
            format!("gpuq: job {id} belongs to uid61001; you may cancel only your own jobs")
        );
    }
    assert_eq!(b.state(running), "running");
    assert_eq!(b.state(queued), "queued");
    // root may
    assert!(b
        .gpuq(ROOT, &["cancel", &running.to_string()])
        .status
        .success());
    assert!(b
        .gpuq(ROOT, &["cancel", &queued.to_string()])
        .status
        .success());
}

#[test]
fn maintenance_lock_refuses_users_lets_root_run_and_survives_restart() {
    require_env!();
    let mut b = TestBroker::start();
    let a = alice();
    let w = b.workdir(Some(&a), "alice");
    let rw = b.workdir(None, "root");
    // A blocker keeps the gate busy so that alice's job is queued when the lock comes.
    let blocker = b.submit(ROOT, &rw, &["--", "bash", "-c", "touch started; sleep 1"]);
    // The blocker must really be running (not between "running" and its
    // spawn, which a kill turns into `lost`) so that the five stay queued.
    assert!(eventually(30, || rw.join("started").exists()));
    let waiting = b.submit(Some(&a), &w, &["--", "touch", "alice-ran"]);
    // Only root may lock.
    let denied = b.gpuq(Some(&a), &["lock", "--reason", "mine"]);
    assert_eq!(denied.status.code(), Some(1));
    assert!(stderr(&denied).contains("only root"));
    let out = b.gpuq(ROOT, &["lock", "--reason", "DAOS maintenance until 15:00"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let before = b.job_count();
    let refused = b.gpuq_in(Some(&a), &w, &[], &["submit", "--", "true"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("DAOS maintenance until 15:00"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(stdout(&refused), "");
    assert_eq!(b.job_count(), before, "a refused submit stored nothing");
    b.wait_state(blocker, "completed", 30);
    // Root's verification job runs past alice's queued one.
    let verify = b.submit(ROOT, &rw, &["--", "touch", "root-ran"]);
    b.wait_state(verify, "completed", 30);
    assert!(rw.join("root-ran").exists());
    assert_eq!(b.state(waiting), "queued");
    let list = stdout(&b.gpuq(Some(&a), &["list"]));
    assert!(
        list.contains("LOCKED") && list.contains("DAOS maintenance until 15:00"),
        "{list}"
    );
    // The lock survives a broker restart.
    b.kill9();
    b.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(b.state(waiting), "queued");
    assert!(b.gpuq(ROOT, &["unlock"]).status.success());
    b.wait_state(waiting, "completed", 30);
    assert!(w.join("alice-ran").exists());
}

#[test]
fn kill_9_of_the_broker_loses_nothing_and_runs_nothing_twice() {
    require_env!();
    let mut b = TestBroker::start();
    let w = b.workdir(None, "w");
    let t = w.join("trace").display().to_string();
    let long = format!("echo start 1 >> {t}; sleep 2; echo end 1 >> {t}; exit 5");
    let first = b.submit(ROOT, &w, &["--", "bash", "-c", &long]);
    let second = b.submit(
        ROOT,
        &w,
        &["--", "bash", "-c", &format!("echo run 2 >> {t}")],
    );
    let third = b.submit(
        ROOT,
        &w,
        &["--", "bash", "-c", &format!("echo run 3 >> {t}")],
    );
    b.wait_state(first, "running", 30);
    assert!(eventually(10, || read(&w.join("trace")).contains("start 1")));
    b.kill9();
    // The job keeps running without the broker...
    std::thread::sleep(Duration::from_millis(300));
    assert!(!read(&w.join("trace")).contains("end 1"));
    b.spawn();
    // ...is re-adopted, and its real exit status is recorded.
    let j = b.wait_state(first, "failed", 30);
    assert_eq!(j["exit_code"], 5);
    b.wait_state(second, "completed", 30);
    b.wait_state(third, "completed", 30);
    assert_eq!(read(&w.join("trace")), "start 1\nend 1\nrun 2\nrun 3\n");
    assert!(log_of(&b, first).contains("re-adopted"));
    assert_eq!(b.job_count(), 3);
}

#[test]
fn a_job_that_ends_while_the_broker_is_down_is_settled_from_its_exit_record() {
    require_env!();
    let mut b = TestBroker::start();
    let w = b.workdir(None, "w");
    let id = b.submit(
        ROOT,
        &w,
        &["--", "bash", "-c", "touch started; sleep 0.5; exit 9"],
    );
    // "running" is recorded before the spawn (write before act); a kill in
    // between is the `lost` case, so wait until the job itself has begun.
    b.wait_state(id, "running", 30);
    assert!(eventually(30, || w.join("started").exists()));
    b.kill9();
    // The job really ends while no broker runs: its shim has written the
    // exit record (not a guess by sleeping).
    let record = b.path(&format!("state/run/{id}.exit.json"));
    assert!(
        eventually(30, || record.exists()),
        "no exit record at {}",
        record.display()
    );
    b.spawn();
    let j = b.wait_state(id, "failed", 30);
    assert_eq!(j["exit_code"], 9);
    // ... and it was settled from that record, not re-adopted as running.
    assert!(!log_of(&b, id).contains("re-adopted"), "{}", log_of(&b, id));
}

#[test]
fn submit_ack_survives_kill_9_right_after() {
    require_env!();
    let mut b = TestBroker::start();
    let w = b.workdir(None, "w");
    let rw = b.workdir(None, "r");
    let blocker = b.submit(ROOT, &rw, &["--", "bash", "-c", "touch started; sleep 1"]);
    // The blocker must really be running (not between "running" and its
    // spawn, which a kill turns into `lost`) so that the five stay queued.
    assert!(eventually(30, || rw.join("started").exists()));
    let ids: Vec<u64> = (0..5)
        .map(|i| b.submit(ROOT, &w, &["--", "bash", "-c", &format!("echo {i} >> out")]))
        .collect();
    b.kill9();
    b.spawn();
    b.wait_state(blocker, "completed", 30);
    for id in &ids {
        b.wait_state(*id, "completed", 30);
    }
    assert_eq!(read(&w.join("out")), "0\n1\n2\n3\n4\n");
}

#[test]
fn graceful_restart_keeps_the_running_job_and_re_adopts_it() {
    require_env!();
    let mut b = TestBroker::start();
    let w = b.workdir(None, "w");
    let id = b.submit(
        ROOT,
        &w,
        &[
            "--",
            "bash",
            "-c",
            "touch started; sleep 1.5; echo done > marker",
        ],
    );
    b.wait_state(id, "running", 30);
    assert!(eventually(30, || w.join("started").exists()));
    let status = b.terminate();
    assert!(status.success(), "broker exits 0 on SIGTERM: {status}");
    assert!(!b.socket.exists(), "the socket is removed on a clean stop");
    b.spawn();
    b.wait_state(id, "completed", 30);
    assert_eq!(
        read(&w.join("marker")),
        "done\n",
        "the job ran exactly once, to its end"
    );
}
