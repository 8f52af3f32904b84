//! The systemd runner against a real systemd: each test boots a Podman
//! container whose PID 1 is systemd (see `integration/systemd-box/`), runs
//! the real `gpuq-broker` in it as the shipped `gpuq-broker.service` with
//! `runner = "systemd"`, and drives it with the real `gpuq` CLI in the box.
//! Every job is then a transient unit `gpuq-job-<id>.service` that the
//! broker created through systemd's D-Bus API; `systemctl` in the box is
//! the independent witness of what systemd did.

use gpuq_system_tests::systemd_box::SystemdBox;
use gpuq_system_tests::{eventually, require_systemd_box, stderr, stdout, User};
use std::time::Duration;

fn alice() -> User {
    User::new(61001, 61001, &[61001, 61010])
}

/// The PIDs (in the box) a job wrote into `dir/pids`, one per line.
fn pids(b: &SystemdBox, dir: &str) -> Vec<i32> {
    b.read(&format!("{dir}/pids"))
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A job that leaves a plain background child, a setsid'd one in its own
/// session, and one that ignores SIGTERM/SIGHUP, then waits.
const TREE: &str = "sleep 1000 & echo $! >> pids; setsid sleep 1000 & echo $! >> pids; \
                    (trap '' TERM HUP; exec sleep 1000) & echo $! >> pids; echo $$ >> pids; wait";

#[test]
fn job_unit_runs_as_the_user_with_groups_cwd_filtered_env_and_appends_its_log() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    let script = "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); echo cwd=$PWD; env | sort; \
                  echo to-err >&2; while [ ! -e release ]; do sleep 0.1; done; exit 3";
    let out = b.gpuq_in(
        Some(&a),
        &w,
        &[
            ("DAOS_POOL", "oldpool"),
            ("DAOS_CONTAINER", "oldcont"),
            ("GPUQ_JOB_ID", "999"),
            ("MY_SETTING", "kept value"),
        ],
        &["submit", "--", "bash", "-c", script],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id: u64 = stdout(&out).trim().parse().expect("stdout is the job ID");
    b.wait_state(id, "running", 30);
    // systemd's view of the unit the broker created over D-Bus.
    let unit = format!("gpuq-job-{id}.service");
    assert!(
        eventually(10, || b.unit_prop(id, "ActiveState") == "active"),
        "{unit} is not active"
    );
    assert_eq!(b.unit_prop(id, "User"), "61001");
    assert_eq!(b.unit_prop(id, "Group"), "61001");
    assert_eq!(b.unit_prop(id, "SupplementaryGroups"), "61001 61010");
    assert_eq!(b.unit_prop(id, "WorkingDirectory"), w);
    assert_eq!(b.unit_prop(id, "KillMode"), "control-group");
    assert_eq!(b.unit_prop(id, "RemainAfterExit"), "yes");
    // Type=notify (job-exec says READY=1), not exec: EL8's systemd 239
    // refuses Type=exec.
    assert_eq!(b.unit_prop(id, "Type"), "notify");
    assert_eq!(b.unit_prop(id, "NotifyAccess"), "main");
    let main: i32 = b.unit_prop(id, "MainPID").parse().unwrap();
    assert!(main > 0);
    let status = b.read(&format!("/proc/{main}/status"));
    assert!(
        status.contains("Uid:\t61001\t61001\t61001\t61001")
            && status.contains("Gid:\t61001\t61001\t61001\t61001")
            && status.contains("Groups:\t61001 61010"),
        "{status}"
    );
    let ctl = b.sh_ok(&format!("systemctl status --no-pager {unit} || true"));
    assert!(ctl.contains("Transient: yes"), "{ctl}");
    // Let it finish with exit 3.
    b.sh_ok(&format!("touch {w}/release"));
    let j = b.wait_state(id, "failed", 30);
    assert_eq!(j["exit_code"], 3, "{j}");
    assert!(j["signal"].is_null(), "{j}");
    let log_path = j["log_path"].as_str().unwrap().to_string();
    assert_eq!(log_path, format!("/var/log/gpuq/61001/gpuq-{id}.log"));
    assert_eq!(
        b.sh_ok(&format!("stat -c '%u %g %a' {log_path}")).trim(),
        "61001 61001 600"
    );
    let log = b.read(&log_path);
    assert!(
        log.contains("uid=61001 gid=61001 groups=61001 61010"),
        "{log}"
    );
    assert!(log.contains(&format!("cwd={w}\n")), "{log}");
    assert!(log.contains("MY_SETTING=kept value\n"), "{log}");
    assert!(log.contains(&format!("GPUQ_JOB_ID={id}\n")), "{log}");
    assert!(!log.contains("DAOS_"), "old DAOS settings leaked: {log}");
    assert!(!log.contains("999"), "{log}");
    // Appended: the broker's own lines before and after the job's output
    // (the job writes through the broker's O_APPEND file description,
    // passed to systemd as StandardOutputFileDescriptor).
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        lines[0].starts_with("gpuq: ") && lines[0].contains("queued"),
        "{log}"
    );
    assert!(
        lines[1].starts_with("gpuq: ") && lines[1].contains("with the systemd runner"),
        "{log}"
    );
    assert!(lines[2].starts_with("uid=61001"), "{log}");
    assert!(
        lines.contains(&"to-err"),
        "stderr goes to the same log: {log}"
    );
    assert!(
        lines.last().unwrap().starts_with("gpuq: ")
            && lines
                .last()
                .unwrap()
                .contains("ended failed with exit status 3"),
        "{log}"
    );
    // The broker released the unit after recording the end.
    assert!(
        eventually(10, || !b.unit_loaded(id)),
        "{unit} still loaded after the job ended: {}",
        b.sh_ok(&format!("systemctl status --no-pager {unit} || true"))
    );
    // The CLI's follow reports the recorded exit code.
    let follow = b.gpuq(Some(&a), &["follow", &id.to_string()]);
    assert_eq!(follow.status.code(), Some(3), "{}", stderr(&follow));
}

#[test]
fn exit_0_completes_argv_reaches_the_job_unexpanded_and_a_missing_command_is_127() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    // systemd expands $NAME, ${NAME} and $$ in ExecStart: none of that may
    // happen to the user's argv.
    let words = ["$$", "${HOME}", "$HOME", "$@", "100%n%%", "a b", "it's"];
    let mut args = vec!["--", "printf", "[%s]\n"];
    args.extend(words);
    let ok = b.submit(Some(&a), &w, &args);
    let pid = b.submit(
        Some(&a),
        &w,
        &["--", "bash", "-c", "echo pid=$$ home=$HOME"],
    );
    let missing = b.submit(Some(&a), &w, &["--", "no-such-command-gpuq"]);
    b.sh_ok(&format!(
        "printf 'echo ran\\n' > {w}/not-exec && chown 61001:61001 {w}/not-exec && chmod 644 {w}/not-exec"
    ));
    let not_exec = b.submit(Some(&a), &w, &["--", "./not-exec"]);
    // Commands that end at once (their exit can reach systemd before the
    // news that exec succeeded): still the job's own exit status.
    let quick: Vec<u64> = (0..3)
        .map(|_| b.submit(Some(&a), &w, &["--", "false"]))
        .collect();
    let j = b.wait_state(ok, "completed", 30);
    assert_eq!(j["exit_code"], 0);
    let log = b.log_of(ok);
    let expected: String = words.iter().map(|w| format!("[{w}]\n")).collect();
    assert!(log.contains(&expected), "argv changed on the way:\n{log}");
    b.wait_state(pid, "completed", 30);
    let log = b.log_of(pid);
    let line = log.lines().find(|l| l.starts_with("pid=")).unwrap_or("");
    let n: i32 = line
        .trim_start_matches("pid=")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("$$ did not reach bash: {log}"));
    assert!(n > 1, "{log}");
    // HOME is the submitter's (podman exec's root environment), passed on
    // as filtered env, not systemd's value for the unit's user.
    assert!(line.ends_with(" home=/root"), "{log}");
    let j = b.wait_state(missing, "failed", 30);
    assert_eq!(j["exit_code"], 127, "{j}");
    // One line says why, in the job's log.
    let log = b.log_of(missing);
    let why: Vec<&str> = log.lines().filter(|l| l.contains("not found")).collect();
    assert_eq!(why.len(), 1, "{log}");
    let j = b.wait_state(not_exec, "failed", 30);
    assert_eq!(j["exit_code"], 126, "{j}");
    let log = b.log_of(not_exec);
    let why: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("./not-exec") && l.contains("Permission denied"))
        .collect();
    assert_eq!(why.len(), 1, "{log}");
    assert!(!log.lines().any(|l| l == "ran"), "{log}");
    for id in quick {
        let j = b.wait_state(id, "failed", 30);
        assert_eq!(j["exit_code"], 1, "{j}");
        assert!(j["reason"].is_null(), "{j}");
    }
}

#[test]
fn a_jobs_end_is_seen_when_systemd_signals_it() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    // The broker reads the unit's state on its PropertiesChanged signals and
    // otherwise only every 5 s (RECHECK): without the signal this 2 s job
    // would be seen ended 5 s or more after its start.
    let id = b.submit(Some(&a), &w, &["--", "sleep", "2"]);
    let j = b.wait_state(id, "completed", 30);
    let took = j["ended_at"].as_i64().unwrap() - j["started_at"].as_i64().unwrap();
    assert!(
        (2..=3).contains(&took),
        "ended {took} s after its start: {j}"
    );
}

#[test]
fn jobs_systemd_cannot_start_fail_with_a_reason_not_an_exit_code() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    b.sh_ok("mkdir -m 1777 /w/shared");
    // 61077 has no passwd entry; alice in a group without a group entry.
    let ghost = User::new(61077, 61077, &[]);
    let id1 = b.submit(
        Some(&ghost),
        "/w/shared",
        &["--", "touch", "/w/shared/ghost-ran"],
    );
    let odd = User::new(61001, 61001, &[61001, 61099]);
    let id2 = b.submit(Some(&odd), &w, &["--", "touch", "odd-ran"]);
    let j1 = b.wait_state(id1, "failed", 30);
    let j2 = b.wait_state(id2, "failed", 30);
    for (j, what) in [(&j1, "uid 61077"), (&j2, "gid 61099")] {
        let reason = j["reason"].as_str().unwrap_or("");
        assert!(
            reason.contains("could not start") && reason.contains(&format!("{what} has no entry")),
            "{j}"
        );
        assert!(j["exit_code"].is_null(), "no made-up exit code: {j}");
    }
    assert_eq!(b.read("/w/shared/ghost-ran"), "");
    assert!(!b.sh("test -e /w/alice/odd-ran").status.success());
    assert!(!b.unit_loaded(id1) && !b.unit_loaded(id2));
    // A working directory that is gone when the job starts: systemd fails
    // the start job (step CHDIR) and the broker says so.
    b.sh_ok(&format!("mkdir {w}/sub && chown 61001:61001 {w}/sub"));
    let blocker = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "while [ ! -e release ]; do sleep 0.1; done",
        ],
    );
    let gone = b.submit(
        Some(&a),
        &format!("{w}/sub"),
        &["--", "touch", "../gone-ran"],
    );
    b.wait_state(blocker, "running", 30);
    b.sh_ok(&format!("rmdir {w}/sub && touch {w}/release"));
    b.wait_state(blocker, "completed", 30);
    let j = b.wait_state(gone, "failed", 30);
    let reason = j["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("could not start")
            && reason.contains(&format!("gpuq-job-{gone}.service"))
            && reason.contains(&format!("step CHDIR: cannot enter {w}/sub")),
        "{j}"
    );
    assert!(j["exit_code"].is_null(), "no made-up exit code: {j}");
    assert!(!b.sh(&format!("test -e {w}/gone-ran")).status.success());
    assert!(
        b.log_of(gone).contains("could not start"),
        "{}",
        b.log_of(gone)
    );
    assert!(eventually(10, || !b.unit_loaded(gone)), "unit not released");
    // A known user right after runs normally.
    let id3 = b.submit(Some(&a), &w, &["--", "true"]);
    b.wait_state(id3, "completed", 30);
}

#[test]
fn cancel_ends_the_whole_tree_in_the_units_cgroup() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    let id = b.submit(Some(&a), &w, &["--", "bash", "-c", TREE]);
    b.wait_state(id, "running", 30);
    assert!(
        eventually(10, || pids(&b, &w).len() == 4),
        "job did not start its tree"
    );
    let tree = pids(&b, &w);
    assert_eq!(b.alive_of(&tree), tree, "whole tree alive before cancel");
    // systemd has every process, the setsid'd one too, in the unit's cgroup.
    let cgroup = b.unit_prop(id, "ControlGroup");
    assert!(
        cgroup.ends_with(&format!("/gpuq-job-{id}.service")),
        "{cgroup}"
    );
    let procs = b.unit_cgroup_procs(&cgroup).expect("unit cgroup exists");
    for p in &tree {
        assert!(procs.contains(p), "pid {p} not in {cgroup}: {procs:?}");
    }
    let out = b.gpuq(Some(&a), &["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    // cancel returns once the processes are gone
    assert_eq!(b.alive_of(&tree), Vec::<i32>::new(), "survived cancel");
    let j = b.job(id);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert!(j["reason"].as_str().unwrap().contains("uid 61001"), "{j}");
    assert!(b.log_of(id).contains("cancelled by"));
    // The unit's cgroup is empty or gone, and the unit is released.
    assert!(
        eventually(10, || b
            .unit_cgroup_procs(&cgroup)
            .is_none_or(|p| p.is_empty())),
        "processes left in {cgroup}"
    );
    assert!(eventually(10, || !b.unit_loaded(id)), "unit not released");
    // The queue goes on: the next job runs.
    let next = b.submit(Some(&a), &w, &["--", "true"]);
    b.wait_state(next, "completed", 30);
}

#[test]
fn time_limit_ends_the_unit_and_its_tree_as_timeout() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    let id = b.submit(Some(&a), &w, &["--time", "2s", "--", "bash", "-c", TREE]);
    b.wait_state(id, "running", 30);
    // systemd's own limit is only a backstop, well past the broker's.
    let max = b.unit_prop(id, "RuntimeMaxUSec");
    assert!(
        max == "5min 2s" || max == "302000000",
        "RuntimeMaxUSec={max}"
    );
    let follow = b.gpuq(Some(&a), &["follow", &id.to_string()]);
    assert_eq!(follow.status.code(), Some(124), "{}", stderr(&follow));
    assert!(stdout(&follow).contains("reached its time limit 0:00:02"));
    let j = b.job(id);
    assert_eq!(j["state"], "timeout", "{j}");
    let tree = pids(&b, &w);
    assert_eq!(tree.len(), 4);
    assert_eq!(
        b.alive_of(&tree),
        Vec::<i32>::new(),
        "survived the time limit"
    );
    assert!(eventually(10, || !b.unit_loaded(id)), "unit not released");
}

#[test]
fn broker_kill_9_and_restart_re_adopts_the_running_unit() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    let id = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "echo start >> trace; while [ ! -e release ]; do sleep 0.1; done; echo end >> trace; exit 5",
        ],
    );
    b.wait_state(id, "running", 30);
    assert!(eventually(10, || b.read(&format!("{w}/trace")) == "start\n"));
    let main = b.unit_prop(id, "MainPID");
    b.kill9_broker();
    // The job's unit is not the broker's: it keeps running without it.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(b.unit_prop(id, "ActiveState"), "active");
    assert_eq!(b.unit_prop(id, "SubState"), "running");
    assert_eq!(b.unit_prop(id, "MainPID"), main);
    b.start_broker();
    assert!(
        eventually(10, || b.log_of(id).contains("re-adopted")),
        "{}",
        b.log_of(id)
    );
    assert_eq!(b.job(id)["state"], "running");
    b.sh_ok(&format!("touch {w}/release"));
    let j = b.wait_state(id, "failed", 30);
    assert_eq!(j["exit_code"], 5, "{j}");
    assert_eq!(b.read(&format!("{w}/trace")), "start\nend\n", "ran once");
    assert!(eventually(10, || !b.unit_loaded(id)), "unit not released");
}

#[test]
fn a_unit_that_ends_while_the_broker_is_down_is_settled_from_systemds_record() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    let id = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "while [ ! -e release ]; do sleep 0.1; done; exit 9",
        ],
    );
    b.wait_state(id, "running", 30);
    b.kill9_broker();
    b.sh_ok(&format!("touch {w}/release"));
    // systemd keeps the unit and its exit status while nobody watches.
    assert!(
        eventually(10, || b.unit_prop(id, "ActiveState") == "failed"),
        "unit state {}",
        b.unit_prop(id, "ActiveState")
    );
    assert_eq!(b.unit_prop(id, "ExecMainCode"), "1");
    assert_eq!(b.unit_prop(id, "ExecMainStatus"), "9");
    let busctl = b.sh_ok(&format!(
        "busctl get-property org.freedesktop.systemd1 \
         /org/freedesktop/systemd1/unit/gpuq_2djob_2d{id}_2eservice \
         org.freedesktop.systemd1.Service ExecMainStatus"
    ));
    assert_eq!(busctl.trim(), "i 9");
    b.start_broker();
    let j = b.wait_state(id, "failed", 30);
    assert_eq!(j["exit_code"], 9, "{j}");
    assert!(eventually(10, || !b.unit_loaded(id)), "unit not released");
    // Exit 0 while the broker is down: completed (the unit stays active/exited).
    let ok = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "while [ ! -e release2 ]; do sleep 0.1; done",
        ],
    );
    b.wait_state(ok, "running", 30);
    b.kill9_broker();
    b.sh_ok(&format!("touch {w}/release2"));
    assert!(
        eventually(10, || b.unit_prop(ok, "SubState") == "exited"),
        "unit substate {}",
        b.unit_prop(ok, "SubState")
    );
    b.start_broker();
    let j = b.wait_state(ok, "completed", 30);
    assert_eq!(j["exit_code"], 0, "{j}");
    assert!(eventually(10, || !b.unit_loaded(ok)), "unit not released");
}

/// `sh -c SCRIPT` in the box as `u` (its groups too).
fn sh_as(b: &SystemdBox, u: &User, cwd: &str, script: &str) -> std::process::Output {
    let reuid = format!("--reuid={}", u.uid);
    let regid = format!("--regid={}", u.gid);
    let groups = format!(
        "--groups={}",
        u.groups
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    b.exec(
        cwd,
        &[],
        &["setpriv", &reuid, &regid, &groups, "sh", "-c", script],
    )
}

#[test]
fn a_log_swapped_for_a_symlink_before_systemd_starts_the_unit_leaves_the_target_untouched() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    // A root-only file the user cannot touch, with an old mtime.
    b.sh_ok(
        "mkdir -m 700 /root-only && printf 'root data\\n' > /root-only/precious && \
         chmod 600 /root-only/precious && touch -d '2020-01-02 03:04:05' /root-only/precious",
    );
    let stat = "stat -c '%s %Y %Z %i' /root-only/precious";
    let before = b.sh_ok(stat);
    // Hold systemd: the broker creates the log (opened safely, by fd), then
    // its StartTransientUnit waits in the bus until systemd goes on — the
    // window an `--inst` job's preparation, or a busy systemd, gives a user.
    let held = b.hold_systemd();
    let id = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "echo job-output-1; sleep 1; echo job-output-2",
        ],
    );
    let log = format!("/var/log/gpuq/61001/gpuq-{id}.log");
    assert!(
        eventually(15, || b.read(&log).contains("with the systemd runner")),
        "the broker did not create {log}: {}",
        b.read(&log)
    );
    // The user puts a symlink to the root-only file where the log was.
    let swap = sh_as(
        &b,
        &a,
        "/",
        &format!("mv {log} {log}.moved && ln -s /root-only/precious {log}"),
    );
    assert!(swap.status.success(), "swap: {}", stderr(&swap));
    drop(held);
    let j = b.wait_state(id, "completed", 30);
    assert_eq!(j["exit_code"], 0, "{j}");
    assert_eq!(
        b.sh_ok("cat /root-only/precious"),
        "root data\n",
        "root's file was written through the user's symlink"
    );
    assert_eq!(
        b.sh_ok(stat),
        before,
        "root's file changed (size, mtime, ctime, inode)"
    );
    // The job wrote into the file the broker opened (the user moved it).
    let moved = b.read(&format!("{log}.moved"));
    assert!(
        moved.contains("job-output-1\njob-output-2\n"),
        "output not in the broker-opened log:\n{moved}"
    );
    // No path of a user-writable place is in a unit's properties (a
    // finished job's unit is gone: look at a running one's).
    let id2 = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "while [ ! -e release ]; do sleep 0.1; done",
        ],
    );
    b.wait_state(id2, "running", 30);
    assert!(eventually(10, || b.unit_prop(id2, "ActiveState") == "active"));
    let props = b.sh_ok(&format!("systemctl show gpuq-job-{id2}.service"));
    assert!(
        !props.contains("/var/log/gpuq"),
        "a log path in the unit:\n{}",
        props
            .lines()
            .filter(|l| l.contains("/var/log/gpuq"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    b.sh_ok(&format!("touch {w}/release"));
    b.wait_state(id2, "completed", 30);
}

#[test]
fn environment_names_systemd_refuses_still_reach_the_job() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    // Lmod exports its `module` function as BASH_FUNC_module%%; names with
    // `.`, `-`, `%` or a leading digit, and a value with a control
    // character, are refused by systemd's Environment= (env_name_is_valid,
    // env_value_is_valid). The job must start with all of them.
    let env = [
        ("BASH_FUNC_module%%", "() {  echo module-ran \"$@\"\n}"),
        ("with.dot", "dot value"),
        ("with-dash", "dash value"),
        ("9LIVES", "nine"),
        ("PCT%NAME", "pct"),
        ("ESC_VALUE", "a\u{1b}b"),
        ("NEWLINE_VALUE", "line1\nline2"),
        ("PLAIN_NAME", "plain $HOME value"),
        // The unit is Type=notify: the job must not get a way to speak for
        // it, whatever the submitter's environment says.
        ("NOTIFY_SOCKET", "/run/systemd/notify"),
    ];
    let out = b.gpuq_in(
        Some(&a),
        &w,
        &env,
        &[
            "submit",
            "--",
            "bash",
            "-c",
            "module load cuda; env -0 | sort -z | tr '\\0' '\\036'; echo",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id: u64 = stdout(&out).trim().parse().expect("job ID");
    let j = b.wait_state(id, "completed", 30);
    assert_eq!(j["exit_code"], 0, "{j}");
    let log = b.log_of(id);
    assert!(log.contains("module-ran load cuda\n"), "{log}");
    let job_env: Vec<&str> = log
        .lines()
        .find(|l| l.contains('\u{1e}'))
        .unwrap_or_else(|| panic!("no environment dump in the log:\n{log}"))
        .split('\u{1e}')
        .collect();
    for (k, v) in env {
        if k.starts_with("BASH_FUNC_") {
            continue; // bash re-exports the function in its own format
        }
        if k == "NOTIFY_SOCKET" {
            assert!(
                !job_env.iter().any(|e| e.starts_with("NOTIFY_SOCKET=")),
                "the job got NOTIFY_SOCKET: {job_env:?}"
            );
            continue;
        }
        let want = format!("{k}={v}");
        assert!(
            log.contains(&want),
            "{k} did not reach the job as {want:?}:\n{job_env:?}"
        );
    }
}

#[test]
fn a_jobs_process_has_only_stdin_and_its_log_open() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    // `ls` is the shell's child: its own directory descriptor is not listed.
    let id = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "echo fds-begin; ls /proc/$$/fd; echo fds-end; \
             readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2",
        ],
    );
    let j = b.wait_state(id, "completed", 30);
    assert_eq!(j["exit_code"], 0, "{j}");
    let log = b.log_of(id);
    let lines: Vec<&str> = log.lines().collect();
    let start = lines
        .iter()
        .position(|l| *l == "fds-begin")
        .unwrap_or_else(|| panic!("{log}"));
    let fds: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| **l != "fds-end")
        .copied()
        .collect();
    assert_eq!(fds, ["0", "1", "2"], "{log}");
    let log_path = j["log_path"].as_str().unwrap();
    let links = format!("/dev/null\n{log_path}\n{log_path}\n");
    assert!(log.contains(&links), "stdin, stdout, stderr:\n{log}");
}

/// `systemctl show` (every property, empty ones too) and busctl's
/// introspection of the unit as `u`: what any local user can read of it.
fn unit_as_seen_by(b: &SystemdBox, u: &User, id: u64) -> String {
    let script = format!(
        "systemctl show --all gpuq-job-{id}.service && \
         busctl --system introspect org.freedesktop.systemd1 \
         /org/freedesktop/systemd1/unit/gpuq_2djob_2d{id}_2eservice"
    );
    let out = sh_as(b, u, "/", &script);
    assert!(
        out.status.success(),
        "{script}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

#[test]
fn another_user_reads_neither_argv_nor_environment_of_a_job_in_its_unit() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    let bob = User::new(61002, 61002, &[61002]);
    b.add_user("bob", &bob);
    let env_token = "env-tok-3f9a1c55";
    let argv_token = "argv-tok-77d2e0aa";
    let script = "printf '[%s]\\n' \"$0\" \"$@\" > argv.out; env -0 > env.out; \
                  while [ ! -e release ]; do sleep 0.1; done";
    let out = b.gpuq_in(
        Some(&a),
        &w,
        &[("MY_API_TOKEN", env_token)],
        &[
            "submit", "--", "bash", "-c", script, "job", argv_token, "a b",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id: u64 = stdout(&out).trim().parse().expect("job ID");
    b.wait_state(id, "running", 30);
    assert!(eventually(10, || b.unit_prop(id, "ActiveState") == "active"));
    assert!(
        eventually(10, || b.read(&format!("{w}/env.out")).contains('\0')),
        "the job did not start"
    );
    // What bob sees of alice's running job's unit: it is there (the right
    // unit, readable), but nothing of the job's command or environment.
    let seen = unit_as_seen_by(&b, &bob, id);
    assert!(seen.contains("User=61001"), "{seen}");
    assert!(seen.contains(".Service"), "no introspection: {seen}");
    for token in [env_token, argv_token] {
        let lines: Vec<&str> = seen.lines().filter(|l| l.contains(token)).collect();
        assert!(
            lines.is_empty(),
            "another user reads {token} in the unit:\n{}",
            lines.join("\n")
        );
    }
    assert!(!seen.contains("MY_API_TOKEN"), "{seen}");
    // The unit runs the broker's own verb; no environment is set in it.
    let exec = b.unit_prop(id, "ExecStart");
    assert!(
        exec.contains("path=/usr/local/sbin/gpuq-broker ; argv[]=gpuq-broker job-exec ;"),
        "{exec}"
    );
    assert_eq!(b.unit_prop(id, "Environment"), "");
    // The job itself got both, exactly as submitted.
    assert_eq!(
        b.read(&format!("{w}/argv.out")),
        format!("[job]\n[{argv_token}]\n[a b]\n")
    );
    let env = b.read(&format!("{w}/env.out"));
    assert!(
        env.split('\0')
            .any(|e| e == format!("MY_API_TOKEN={env_token}")),
        "{env:?}"
    );
    // Its environment file is the user's alone (the job reads its own).
    assert!(!sh_as(&b, &bob, "/", "cat /proc/*/environ 2>/dev/null")
        .stdout
        .windows(env_token.len())
        .any(|x| x == env_token.as_bytes()));
    b.sh_ok(&format!("touch {w}/release"));
    let j = b.wait_state(id, "completed", 30);
    assert_eq!(j["exit_code"], 0, "{j}");
}

#[test]
fn the_broker_refuses_the_systemd_runner_when_others_can_change_its_executable() {
    require_systemd_box!();
    let b = SystemdBox::boot();
    let a = alice();
    let w = b.add_user("alice", &a);
    let id = b.submit(
        Some(&a),
        &w,
        &[
            "--",
            "bash",
            "-c",
            "while [ ! -e release ]; do sleep 0.1; done",
        ],
    );
    b.wait_state(id, "running", 30);
    let main = b.unit_prop(id, "MainPID");
    // The broker stops (its job's unit stays), and its directory becomes
    // writable by others: every job would run a file others can replace.
    b.sh_ok("systemctl stop gpuq-broker.service && chmod 0777 /usr/local/sbin");
    let units_before = b.sh_ok("systemctl list-units --all --plain --no-legend 'gpuq-job-*'");
    let start = b.sh("systemctl start gpuq-broker.service");
    assert!(!start.status.success(), "the broker started");
    let log = b.broker_log();
    let line = log
        .lines()
        .find(|l| l.contains("refusing runner = \"systemd\""))
        .unwrap_or_else(|| panic!("no refusal in the broker's log:\n{log}"));
    assert!(
        line.contains("/usr/local/sbin/gpuq-broker its directory /usr/local/sbin (mode 777) is writable by group or others"),
        "{line}"
    );
    // Nothing was touched: the running job's unit is as it was, no unit
    // was made or removed, and the job is still running when the broker
    // comes back on a safe path.
    assert_eq!(b.unit_prop(id, "ActiveState"), "active");
    assert_eq!(b.unit_prop(id, "MainPID"), main);
    assert_eq!(
        b.sh_ok("systemctl list-units --all --plain --no-legend 'gpuq-job-*'"),
        units_before
    );
    b.sh_ok("chmod 0755 /usr/local/sbin && systemctl reset-failed gpuq-broker.service");
    b.start_broker();
    assert_eq!(b.job(id)["state"], "running");
    b.sh_ok(&format!("touch {w}/release"));
    b.wait_state(id, "completed", 30);
}
