//! `gpuq daos-exec` on the test cluster: from inside a running `--inst`
//! job, a client container on cxl2's Podman, as the job's owner, with the
//! job's DAOS system (the simulator) — and every refusal.

use gpuq_system_tests::daos_site::*;
use gpuq_system_tests::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn gpuq() -> String {
    bin("gpuq").display().to_string()
}

#[test]
fn the_seed_example_runs_as_the_job_owner_and_streams_both_ways() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dx-seed");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let g = gpuq();
    // The seed README's example, then the stream and exit-code checks.
    let script = format!(
        r#"
{g} daos-exec -- bash -euc '
  dmg -o "$DAOS_CONTROL_CONFIG" system query
  dmg -o "$DAOS_CONTROL_CONFIG" pool create --size=32G --nsvc=1 --nranks=4 my-pool
  daos -G "$DAOS_SYSTEM" container create --type=POSIX my-pool my-data
' > seed.out 2>&1; echo "seed=$?" >> codes
{g} daos-exec -- dmg -o "$DAOS_CONTROL_CONFIG" -j system query > query.json
{g} daos-exec -- sh -c 'id -u; id -g; pwd; echo $HOME; echo written > from-container' > ids
{g} daos-exec -- sh -c 'exit 3'; echo "three=$?" >> codes
{g} daos-exec -- sh -c 'kill -9 $$'; echo "killed=$?" >> codes
{g} daos-exec -- true; echo "zero=$?" >> codes
echo piped-in | {g} daos-exec -- cat > piped
{g} daos-exec -- sh -c 'echo to-err >&2' 2> err
/usr/bin/time -f %M -o rss {g} daos-exec -- head -c 1073741824 /dev/zero | wc -c > gib
"#
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    s.expect_end(id, "completed", 300);
    let read = |f: &str| std::fs::read_to_string(w.join(f)).unwrap_or_default();
    let seed = read("seed.out");
    eprintln!(
        "--- seed example ---\n{seed}--- codes ---\n{}--- CLI peak RSS (KiB) for 1 GiB: {}",
        read("codes"),
        read("rss")
    );
    assert!(
        seed.matches("Joined").count() + seed.matches("joined").count() >= 1,
        "{seed}"
    );
    assert!(
        seed.contains("my-data") || seed.contains("Successfully created container"),
        "{seed}"
    );
    let q: serde_json::Value = serde_json::from_str(&read("query.json")).unwrap();
    let members = q["response"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 4, "{q}");
    assert!(members.iter().all(|m| m["state"] == "joined"), "{q}");
    let codes = read("codes");
    for want in ["seed=0", "three=3", "killed=137", "zero=0"] {
        assert!(codes.contains(want), "{want} in {codes}");
    }
    let ids: Vec<String> = read("ids").lines().map(str::to_string).collect();
    assert_eq!(
        ids[..2],
        ["61001".to_string(), "61001".to_string()],
        "{ids:?}"
    );
    assert_eq!(
        ids[2],
        w.display().to_string(),
        "the caller's cwd, mounted at the same path"
    );
    assert_eq!(ids[3], "/tmp");
    let m = std::fs::metadata(w.join("from-container")).unwrap();
    assert_eq!(
        (m.uid(), m.gid()),
        (61001, 61001),
        "files belong to the job owner"
    );
    assert_eq!(read("piped"), "piped-in\n");
    assert_eq!(read("err"), "to-err\n");
    assert_eq!(read("gib").trim(), "1073741824");
    let rss_kib: u64 = read("rss").trim().parse().unwrap();
    assert!(rss_kib < 50 * 1024, "the CLI's peak RSS was {rss_kib} KiB");
    // Every client container is gone; and the lease cleans up as usual.
    s.assert_clean();
}

#[test]
fn daos_exec_refuses_callers_outside_their_own_running_daos_job() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dx-refuse");
    let (a, b) = (alice(), bob());
    let wa = s.b.workdir(Some(&a), "alice");
    let wb = s.b.workdir(Some(&b), "bob");
    let g = gpuq();
    // Outside any job.
    let out =
        s.b.gpuq_in(Some(&a), &wa, &[], &["daos-exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("only inside a running --inst job"),
        "{}",
        stderr(&out)
    );
    // A plain (not --inst) job.
    // (Plain jobs do not get GPUQ_SOCKET from the broker; the script names it.)
    let plain = s.b.submit(
        Some(&a),
        &wa,
        &[
            "--",
            "bash",
            "-c",
            &format!(
                "GPUQ_SOCKET={} {g} daos-exec -- true 2> plain.err; echo $? > plain.rc",
                s.b.socket.display()
            ),
        ],
    );
    s.expect_end(plain, "completed", 60);
    let err = std::fs::read_to_string(wa.join("plain.err")).unwrap();
    assert!(err.contains("not a DAOS job"), "{err}");
    // Alice's DAOS job runs; bob (his own shell, and his own plain job)
    // cannot use it; a policy mount that escapes by symlink is refused.
    let id = s.b.submit(
        Some(&a),
        &wa,
        &[
            "--inst",
            "test",
            "--",
            "bash",
            "-c",
            &format!("{g} daos-exec --workdir /etc -- true 2> wd.err; touch up; sleep 60"),
        ],
    );

    assert!(eventually(120, || wa.join("up").exists()), "{}", s.log(id));
    // From inside the job, a working directory outside the mounts.
    let wd = std::fs::read_to_string(wa.join("wd.err")).unwrap();
    assert!(
        wd.contains("--workdir /etc: not under a mounted directory"),
        "{wd}"
    );
    let out =
        s.b.gpuq_in(Some(&b), &wb, &[], &["daos-exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("only inside a running --inst job"),
        "{}",
        stderr(&out)
    );
    // Alice's own shell outside the job is refused too.
    let out =
        s.b.gpuq_in(Some(&a), &wa, &[], &["daos-exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    // And so is her shell in a cgroup *named* like her job's that its
    // runner did not make (as a user can make one in a delegated subtree,
    // or a user unit of that name): the name alone once let it in.
    let fake = FakeJobCgroup::new(id);
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            "echo $$ >\"$0\" && exec setpriv --reuid=61001 --regid=61001 --groups=61001 \"$@\"",
        ])
        .arg(fake.procs())
        .arg(gpuq())
        .args(["daos-exec", "--", "true"])
        .current_dir(&wa)
        .env("GPUQ_SOCKET", &s.b.socket)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only inside a running --inst job"),
        "{}",
        stderr(&out)
    );
    drop(fake);
    // No client container was made for any of these.
    assert!(
        !s.containers("cxl2").iter().any(|c| c.contains("-client-")),
        "{:?}",
        s.containers("cxl2")
    );
    let c = s.b.gpuq(ROOT, &["cancel", &id.to_string()]);
    assert!(c.status.success());
    s.expect_end(id, "cancelled", 60);
    // A job that has finished: its processes are gone, and so is its
    // system; a late caller (root, from outside) finds no running job.
    let out = s.b.gpuq(ROOT, &["daos-exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no --inst job is running"),
        "{}",
        stderr(&out)
    );
    s.assert_clean();
}

#[test]
fn operator_mounts_are_checked_and_one_escaping_by_symlink_is_refused() {
    require_cluster_env!();
    require_env!();
    let s = Site::up_full("dx-mounts", None, |d| {
        format!(
            "client_mounts = [\"{}/shared\", \"{}/sneaky\"]\n",
            d.display(),
            d.display()
        )
    });
    let shared = s.b.path("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("dataset"), "data\n").unwrap();
    // Not yet a symlink: a plain directory, fine.
    std::fs::create_dir(s.b.path("sneaky")).unwrap();
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let g = gpuq();
    let script = format!(
        "{g} daos-exec -- cat {}/dataset > seen; echo $? > rc1; \
         while [ ! -e go ]; do sleep 0.1; done; \
         {g} daos-exec -- true 2> refused; echo $? > rc2",
        shared.display()
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    assert!(eventually(120, || w.join("rc1").exists()), "{}", s.log(id));
    assert_eq!(std::fs::read_to_string(w.join("seen")).unwrap(), "data\n");
    // Now the operator path becomes a symlink to /etc: refused, nothing made.
    std::fs::remove_dir(s.b.path("sneaky")).unwrap();
    std::os::unix::fs::symlink("/etc", s.b.path("sneaky")).unwrap();
    std::fs::write(w.join("go"), "").unwrap();
    s.expect_end(id, "completed", 120);
    let err = std::fs::read_to_string(w.join("refused")).unwrap();
    assert!(
        err.contains("sneaky") && err.contains("outside the allowed client mounts"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(w.join("rc2")).unwrap().trim(), "1");
    s.assert_clean();
}

#[test]
fn a_stopped_cli_or_the_jobs_end_removes_its_client_container() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dx-stop");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let g = gpuq();
    // SIGTERM to the CLI once its command runs: its container goes. Then
    // SIGTERM at moments of the set-up (before the request, while the
    // broker makes the container, just after): the same exit code, and
    // nothing is left. Then one left running when the job's script ends.
    let script = format!(
        "{g} daos-exec -- sleep 300 & pid=$!; touch first; \
         while [ ! -e go1 ]; do sleep 0.1; done; kill -TERM $pid; wait $pid; echo $? > rc; \
         for d in 0 0.05 0.1 0.2 0.4 0.8; do \
           {g} daos-exec -- sleep 300 2>> early.err & p=$!; sleep $d; kill -TERM $p; wait $p; echo $? >> early; \
         done; \
         while [ ! -e go2 ]; do sleep 0.1; done; \
         touch second; {g} daos-exec -- sleep 300 2> second.err & \
         while [ ! -e go3 ]; do sleep 0.1; done; exit 0"
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    let clients = || {
        s.containers("cxl2")
            .into_iter()
            .filter(|c| c.contains("-client-"))
            .count()
    };
    // What a failure shows: the job's log, cxl2's containers, the broker's.
    let why = || {
        format!(
            "job log:\n{}\ncxl2: {:?}\nearly.err: {}\nbroker:\n{}",
            s.log(id),
            s.containers("cxl2"),
            std::fs::read_to_string(w.join("early.err")).unwrap_or_default(),
            s.b.broker_log()
        )
    };
    assert!(
        eventually(120, || w.join("first").exists() && clients() == 1),
        "{}",
        why()
    );
    std::fs::write(w.join("go1"), "").unwrap();
    let rc = || std::fs::read_to_string(w.join("rc")).unwrap_or_default();
    assert!(eventually(30, || rc().ends_with('\n')), "{}", why());
    assert_eq!(rc().trim(), "143", "{}", why());
    let early = || std::fs::read_to_string(w.join("early")).unwrap_or_default();
    assert!(
        eventually(60, || early().lines().count() == 6),
        "{:?}\n{}",
        early(),
        why()
    );
    assert!(
        early().lines().all(|l| l == "143"),
        "{:?}\n{}",
        early(),
        why()
    );
    // None of the seven sessions' containers is left.
    assert!(eventually(30, || clients() == 0), "{}", why());
    std::fs::write(w.join("go2"), "").unwrap();
    assert!(
        eventually(60, || w.join("second").exists() && clients() == 1),
        "second.err: {}\n{}",
        std::fs::read_to_string(w.join("second.err")).unwrap_or_default(),
        why()
    );
    std::fs::write(w.join("go3"), "").unwrap();
    s.expect_end(id, "completed", 120);
    s.assert_clean();
    assert!(s.log(id).contains("cleanup remove_clients"), "{}", why());
}

#[test]
fn a_caller_with_a_terminal_gets_a_tty_of_its_size() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dx-tty");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let g = gpuq();
    // `script` gives the job's command a pseudo-terminal of 40x100.
    let inner = format!(
        "stty rows 40 cols 100; {g} daos-exec -- sh -c 'test -t 0 && test -t 1 && echo TTY; busybox stty size'"
    );
    let script = format!(
        "script -qec \"{inner}\" /dev/null > tty.out; {g} daos-exec -- sh -c 'test -t 1 || echo NO-TTY' > notty.out"
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    s.expect_end(id, "completed", 120);
    let out = std::fs::read_to_string(w.join("tty.out")).unwrap();
    assert!(out.contains("TTY"), "{out:?}");
    assert!(out.contains("40 100"), "{out:?}");
    let out = std::fs::read_to_string(w.join("notty.out")).unwrap();
    assert_eq!(out, "NO-TTY\n");
    s.assert_clean();
}

#[test]
fn ctrl_c_at_a_terminal_goes_to_the_command_like_ssh() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dx-int");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let g = gpuq();
    // With a terminal the CLI puts it in raw mode: a typed ^C is a byte for
    // the container's terminal, whose line discipline makes it SIGINT for
    // the command (its trap answers). Without raw mode the CLI itself would
    // get the SIGINT, end the session and answer 130.
    let ready = w.join("ready");
    let inner = format!(
        "{g} daos-exec -- sh -c 'trap \\\"echo GOT-INT; exit 5\\\" INT; touch {r}; while :; do sleep 1; done'",
        r = ready.display()
    );
    let script = format!(
        "(while [ ! -e {r} ]; do sleep 0.1; done; sleep 0.5; printf '\\003'; sleep 10) \
         | script -qec \"{inner}\" /dev/null > int.out; echo $? > rc",
        r = ready.display()
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    s.expect_end(id, "completed", 120);
    let out = std::fs::read_to_string(w.join("int.out")).unwrap_or_default();
    let rc = std::fs::read_to_string(w.join("rc")).unwrap_or_default();
    assert!(out.contains("GOT-INT"), "{out:?}\n{}", s.log(id));
    assert_eq!(rc.trim(), "5", "{out:?}");
    s.assert_clean();
}

/// Every container-create event on cxl2's Podman so far (names), read from
/// Podman's own event log: a refused call must never have made one, even
/// briefly.
fn created_on_cxl2(s: &Site) -> Vec<String> {
    // filters={"type":["container"],"event":["create"]}
    let (code, body) = s.c.http(
        &s.c.podman_sock("cxl2"),
        "GET",
        "/v4.0.0/libpod/events?stream=false&filters=%7B%22type%22%3A%5B%22container%22%5D%2C%22event%22%3A%5B%22create%22%5D%7D",
        None,
    );
    assert_eq!(code, 200, "{body}");
    body.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            v["Actor"]["Attributes"]["name"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

#[test]
fn a_submit_dir_swapped_after_submit_or_a_workdir_with_dotdot_mounts_nothing() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dx-swap");
    let (a, b) = (alice(), bob());
    // Alice's home (hers, 0700) and her work directory in it, from which
    // she submits; she may rename and replace things in her home.
    let home = s.b.workdir(Some(&a), "a-home");
    let w = home.join("work");
    let orig = home.join("work.orig");
    std::fs::create_dir(&w).unwrap();
    std::os::unix::fs::chown(&w, Some(a.uid), Some(a.gid)).unwrap();
    // Root's vault: a 0700 directory with an open one inside holding a
    // secret. Alice cannot reach it by any path.
    let vault = s.b.path("vault");
    let inner = vault.join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::set_permissions(&vault, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(inner.join("secret"), "top secret\n").unwrap();
    std::fs::set_permissions(inner.join("secret"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let secret_before = std::fs::metadata(inner.join("secret")).unwrap();
    let g = gpuq();
    // (2) a --workdir with '..' (it would be the submit directory's
    // grandparent in the container); then, after each swap below,
    // a plain daos-exec. The script's own files land in its cwd, the
    // original directory (renamed to work.orig by the first swap).
    let script = format!(
        "{g} daos-exec --workdir {w}/../.. -- pwd > dotdot.out 2> dotdot.err; echo $? > dotdot.rc; \
         touch ready1; while [ ! -e go1 ]; do sleep 0.1; done; \
         {g} daos-exec -- sh -c 'ls -la; touch mine' > bob.out 2> bob.err; echo $? > bob.rc; \
         touch ready2; while [ ! -e go2 ]; do sleep 0.1; done; \
         ln -s {inner} {w}; \
         {g} daos-exec -- sh -c 'cat secret; echo planted > planted' > vault.out 2> vault.err; echo $? > vault.rc",
        w = w.display(),
        inner = inner.display(),
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    assert!(
        eventually(120, || w.join("ready1").exists()),
        "{}",
        s.log(id)
    );
    // (3) the submit directory becomes bob's, closed to alice.
    std::fs::rename(&w, &orig).unwrap();
    std::fs::create_dir(&w).unwrap();
    std::os::unix::fs::chown(&w, Some(b.uid), Some(b.gid)).unwrap();
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(w.join("bobs"), "bob's\n").unwrap();
    std::fs::write(orig.join("go1"), "").unwrap();
    assert!(
        eventually(60, || orig.join("ready2").exists()),
        "{}",
        s.log(id)
    );
    let bobs: Vec<_> = std::fs::read_dir(&w)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    std::fs::remove_file(w.join("bobs")).unwrap();
    std::fs::remove_dir(&w).unwrap();
    // (1) alice herself puts a symlink to root's vault in its place.
    std::fs::write(orig.join("go2"), "").unwrap();
    s.expect_end(id, "completed", 120);
    let read = |f: &str| std::fs::read_to_string(orig.join(f)).unwrap_or_default();
    eprintln!(
        "--- the three refusals ---\n{}{}{}",
        read("dotdot.err"),
        read("bob.err"),
        read("vault.err")
    );
    let mut wrong = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            wrong.push(what)
        }
    };
    check(
        read("dotdot.rc").trim() == "1"
            && read("dotdot.err").contains("--workdir")
            && read("dotdot.err").contains("contains '..'")
            && read("dotdot.err").lines().count() == 1
            && read("dotdot.out").is_empty(),
        format!(
            "--workdir with '..': rc {:?} err {:?} out {:?}",
            read("dotdot.rc"),
            read("dotdot.err"),
            read("dotdot.out")
        ),
    );
    check(
        read("bob.rc").trim() == "1"
            && read("bob.err").contains("cannot be mounted")
            && read("bob.err").contains("Permission denied")
            && read("bob.err").lines().count() == 1
            && read("bob.out").is_empty(),
        format!(
            "bob's directory: rc {:?} err {:?} out {:?}",
            read("bob.rc"),
            read("bob.err"),
            read("bob.out")
        ),
    );
    check(
        bobs == vec![std::ffi::OsString::from("bobs")],
        format!("bob's directory was written to: {bobs:?}"),
    );
    check(
        read("vault.rc").trim() == "1"
            && read("vault.err").contains("is a symbolic link")
            && read("vault.err").lines().count() == 1
            && !read("vault.out").contains("top secret"),
        format!(
            "symlink to root's vault: rc {:?} err {:?} out {:?}",
            read("vault.rc"),
            read("vault.err"),
            read("vault.out")
        ),
    );
    // The vault is untouched.
    let names: Vec<_> = std::fs::read_dir(&inner)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    check(
        names == vec![std::ffi::OsString::from("secret")],
        format!("the vault now holds {names:?}"),
    );
    let secret_after = std::fs::metadata(inner.join("secret")).unwrap();
    check(
        std::fs::read_to_string(inner.join("secret")).unwrap() == "top secret\n"
            && secret_after.mtime() == secret_before.mtime()
            && secret_after.ino() == secret_before.ino(),
        "the secret changed".into(),
    );
    // No client container was ever made (Podman's own event log; that it
    // is read at all shows in the agent's create event).
    let created = created_on_cxl2(&s);
    check(
        created.iter().any(|n| n.contains("-agent"))
            && !created.iter().any(|n| n.contains("-client-")),
        format!("containers created on cxl2: {created:?}"),
    );
    // And no staging mount is left behind.
    let staging = s.b.path("daos/client-mounts");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    check(
        left.is_empty(),
        format!("left in {}: {left:?}", staging.display()),
    );
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", s.log(id));
    s.assert_clean();
}

#[test]
fn a_hostile_submit_directory_string_mounts_nothing() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dx-cwd");
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let g = gpuq();
    // Job 1: submitted over the API (not the CLI, which sends its real
    // cwd) with a directory that has '..' in it: refused at the submit,
    // one line, nothing stored. (daos-exec applies the same rule to a job
    // stored before the submit check existed: exec_dirs unit tests.)
    let name = w.file_name().unwrap().to_str().unwrap();
    let dotted = format!("{}/../{name}", w.display());
    let req = serde_json::json!({
        "argv": ["bash", "-c", format!("{g} daos-exec -- true")],
        "cwd": dotted,
        "env": [],
        "inst": "test",
    });
    let before = s.b.job_count();
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=61001",
            "--regid=61001",
            "--groups=61001",
            "curl",
            "-sS",
        ])
        .arg("--unix-socket")
        .arg(&s.b.socket)
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(req.to_string())
        .arg("http://d/v1/jobs")
        .output()
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(answer["code"], "bad_request", "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap_or("")
            .contains("contains '..'"),
        "{answer}"
    );
    assert_eq!(s.b.job_count(), before, "the refused submit stored nothing");
    // Job 2: alice submits from / (the CLI, as she would).
    let script = format!(
        "{g} daos-exec -- true 2> {w}/root.err; echo $? > {w}/root.rc",
        w = w.display()
    );
    let id2 = s.b.submit(
        Some(&a),
        std::path::Path::new("/"),
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    s.expect_end(id2, "completed", 120);
    let read = |f: &str| std::fs::read_to_string(w.join(f)).unwrap_or_default();
    eprintln!("--- refusal ---\n{}", read("root.err"));
    let mut wrong = Vec::new();
    if !(read("root.rc").trim() == "1"
        && read("root.err").contains("submit directory is /")
        && read("root.err").lines().count() == 1)
    {
        wrong.push(format!(
            "cwd /: rc {:?} err {:?}",
            read("root.rc"),
            read("root.err")
        ));
    }
    let created = created_on_cxl2(&s);
    let agent_seen = created.iter().any(|n| n.contains("-agent"));
    let client_made = created.iter().any(|n| n.contains("-client-"));
    if !agent_seen || client_made {
        wrong.push(format!("containers created on cxl2: {created:?}"));
    }
    assert!(wrong.is_empty(), "{wrong:#?}\n{}", s.log(id2));
    s.assert_clean();
}

#[test]
fn a_swap_between_the_check_and_the_mount_changes_nothing_that_is_mounted() {
    require_cluster_env!();
    require_env!();
    let crash_bin = bin_dir().join("gpuq-broker-crash-points");
    assert!(
        crash_bin.exists(),
        "{} is missing: tests/run builds it (cargo build -p gpuq-broker --features crash-points, \
         copied to that name)",
        crash_bin.display()
    );
    let mut s = Site::up_full("dx-race", Some(crash_bin), |d| {
        format!("client_mounts = [\"{}/shared\"]\n", d.display())
    });
    // An operator mount, swapped in the same window.
    let shared = s.b.path("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("dataset"), "dataset\n").unwrap();
    // The broker holds still in daos-exec once the directories are checked
    // and opened, before anything is staged or created.
    let resume = s.b.path("resume");
    let _ = s.b.terminate();
    s.b.env = vec![
        ("GPUQ_PAUSE_AT".into(), "exec_checked".into()),
        ("GPUQ_PAUSE_FILE".into(), resume.display().to_string()),
    ];
    s.b.spawn();
    let a = alice();
    let home = s.b.workdir(Some(&a), "a-home");
    let w = home.join("work");
    let orig = home.join("work.orig");
    std::fs::create_dir(&w).unwrap();
    std::os::unix::fs::chown(&w, Some(a.uid), Some(a.gid)).unwrap();
    std::fs::write(w.join("mine"), "mine\n").unwrap();
    let vault = s.b.path("vault");
    let inner = vault.join("inner");
    std::fs::create_dir_all(&inner).unwrap();
    std::fs::set_permissions(&vault, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(inner.join("secret"), "top secret\n").unwrap();
    let g = gpuq();
    let script = format!(
        "{g} daos-exec -- sh -c 'cat {w}/mine {w}/secret {sh}/dataset {sh}/secret 2>&1; \
         echo written > {w}/from-container' > race.out 2> race.err; echo $? > race.rc",
        w = w.display(),
        sh = shared.display(),
    );
    let id = s.b.submit(
        Some(&a),
        &w,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    assert!(
        eventually(120, || s
            .b
            .broker_log()
            .contains("pause point exec_checked")),
        "{}\n{}",
        s.log(id),
        s.b.broker_log()
    );
    // Now both paths lead to root's vault.
    std::fs::rename(&w, &orig).unwrap();
    std::os::unix::fs::symlink(&inner, &w).unwrap();
    std::fs::rename(&shared, s.b.path("shared.orig")).unwrap();
    std::os::unix::fs::symlink(&inner, &shared).unwrap();
    std::fs::write(&resume, "").unwrap();
    s.expect_end(id, "completed", 120);
    let read = |f: &str| std::fs::read_to_string(orig.join(f)).unwrap_or_default();
    eprintln!(
        "--- in the container: {w}/mine, {w}/secret, {sh}/dataset, {sh}/secret ---\n{}{}",
        read("race.out"),
        read("race.err"),
        w = w.display(),
        sh = shared.display(),
    );
    // The container had the directory that was checked, not the vault.
    assert_eq!(read("race.rc").trim(), "0", "{}", read("race.err"));
    assert!(
        read("race.out").starts_with("mine\n"),
        "{}",
        read("race.out")
    );
    assert!(
        read("race.out").contains("\ndataset\n"),
        "{}",
        read("race.out")
    );
    assert!(
        !read("race.out").contains("top secret"),
        "{}",
        read("race.out")
    );
    let m = std::fs::metadata(orig.join("from-container")).unwrap();
    assert_eq!((m.uid(), m.gid()), (a.uid, a.gid));
    let names: Vec<_> = std::fs::read_dir(&inner)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("secret")]);
    let staging = s.b.path("daos/client-mounts");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", staging.display());
    s.assert_clean();
}

/// A cgroup `<cgroup2>/gpuq-test-fake-<pid>/gpuq-job-<id>`, made by the
/// test (not by any runner); removed on drop (its processes have ended).
struct FakeJobCgroup(std::path::PathBuf);

impl FakeJobCgroup {
    fn new(id: u64) -> Self {
        let top = cgroup2_root()
            .expect("a cgroup2 mount")
            .join(format!("gpuq-test-fake-{}", std::process::id()));
        let leaf = top.join(format!("gpuq-job-{id}"));
        std::fs::create_dir_all(&leaf).expect("make the fake job cgroup");
        FakeJobCgroup(leaf)
    }

    fn procs(&self) -> std::path::PathBuf {
        self.0.join("cgroup.procs")
    }
}

impl Drop for FakeJobCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
        if let Some(top) = self.0.parent() {
            let _ = std::fs::remove_dir(top);
        }
    }
}
