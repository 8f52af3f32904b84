//! The harness for the whole-system tests in `tests/tests/`.
//!
//! [`TestBroker`] starts the real `gpuq-broker` binary as a child process on
//! a fresh temporary configuration (its own socket, state, logs, lock file
//! and a cgroup v2 parent of its own), and [`TestBroker::gpuq`] runs the real
//! `gpuq` binary as root or as any UID/GID (through `setpriv`). Test users
//! are plain numeric UIDs without a passwd entry, so nothing is added to the
//! machine's user database.
//!
//! On drop — also when the test panicked — the harness kills exactly the
//! broker process it started (by PID), kills every process left in its
//! cgroups, removes those cgroups and deletes its temporary directory.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
pub mod daos_site;
pub mod systemd_box;

/// Where the workspace's binaries are: `$GPUQ_BIN_DIR`, else the target
/// directory this test binary was built into.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("GPUQ_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> → target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} not found: build the workspace binaries first (`cargo build --workspace --bins`)",
        p.display()
    );
    p
}

pub use gpuq_test_skip::cannot_run;

/// Why a test cannot run here, if it cannot ([`require_env!`] fails the test
/// with it, or skips where a developer set `GPUQ_ALLOW_SKIP=1`).
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root (the broker drops privileges and manages cgroups)".into());
    }
    if cgroup2_root().is_none() {
        return Some("no cgroup2 mount in /proc/mounts".into());
    }
    if which("setpriv").is_none() {
        return Some("needs setpriv (util-linux)".into());
    }
    None
}

#[macro_export]
macro_rules! require_env {
    () => {
        if let Some(why) = $crate::skip_reason() {
            $crate::cannot_run(module_path!(), &why);
            return;
        }
    };
}

/// `tool`'s path on `PATH`, if it is there.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join(tool))
        .find(|p| p.exists())
}

/// The cgroup2 mount point (`/sys/fs/cgroup` on pure v2 hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones).
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1]))
}

/// A user to run the CLI as: a UID/GID pair (and extra groups).
#[derive(Debug, Clone)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

pub const ROOT: Option<&User> = None;

impl User {
    pub fn new(uid: u32, gid: u32, groups: &[u32]) -> Self {
        User {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

#[derive(Debug)]
pub struct TestBroker {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub cgroup_parent: PathBuf,
    child: Option<Child>,
    extra_config: String,
    /// Tables appended after `[broker]` (e.g. `[daos]`).
    pub tables: String,
    /// Run the broker inside this network namespace (`/run/netns/NAME`).
    pub netns: Option<String>,
    /// The broker executable (default: the workspace's `gpuq-broker`).
    pub broker_bin: Option<PathBuf>,
    /// Extra environment for the broker process (e.g. `GPUQ_CRASH_AT`).
    pub env: Vec<(String, String)>,
    /// Files the broker must not see: it runs in a private mount namespace
    /// where each reads as `/dev/null` (e.g. the NVIDIA driver's NVML on a
    /// GPU machine, for the path where NVML cannot be loaded).
    pub hide_files: Vec<PathBuf>,
}

impl TestBroker {
    /// A broker with the direct runner and no GPU.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// `extra`: lines appended to the `[broker]` table (overriding nothing
    /// that is already set — pass keys not in the base config).
    pub fn start_with(extra: &str) -> Self {
        let b = Self::prepare(extra);
        Self::launch(b)
    }

    /// Write the config and start: `b` from [`TestBroker::prepare`], with
    /// `tables`, `netns`, `broker_bin` or `env` set as needed.
    pub fn launch(mut b: Self) -> Self {
        b.write_config();
        b.spawn();
        b
    }

    /// A broker not started yet (see [`TestBroker::launch`]).
    pub fn prepare(extra: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpuq-test-")
            .tempdir()
            .expect("tempdir");
        // Other users must reach the socket and their work dirs inside.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let cgroup_parent = cgroup2_root()
            .expect("cgroup2")
            .join(format!("gpuq-test-{}-{n}", std::process::id()));
        let socket = dir.path().join("broker.sock");
        let config = dir.path().join("broker.toml");
        TestBroker {
            config,
            socket,
            cgroup_parent,
            child: None,
            extra_config: extra.to_string(),
            tables: String::new(),
            netns: None,
            broker_bin: None,
            env: Vec::new(),
            hide_files: Vec::new(),
            dir,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Write `broker.toml` from the fields as they are now (a test that
    /// changes `tables` between two starts calls this before `spawn`).
    pub fn write_config(&self) {
        let d = self.dir.path();
        let mut text = format!(
            "[broker]\n\
             socket = \"{}\"\n\
             state_dir = \"{}/state\"\n\
             log_root = \"{}/logs\"\n\
             maintenance_file = \"{}/etc/maintenance.json\"\n\
             runner = \"direct\"\n\
             cgroup_parent = \"{}\"\n\
             default_time = \"10m\"\n\
             max_time = \"1h\"\n",
            self.socket.display(),
            d.display(),
            d.display(),
            d.display(),
            self.cgroup_parent.display()
        );
        if !self.extra_config.contains("gpu =") {
            text.push_str("gpu = \"none\"\n");
        }
        text.push_str(&self.extra_config);
        text.push('\n');
        text.push_str(&self.tables);
        std::fs::write(&self.config, text).unwrap();
        std::fs::set_permissions(&self.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// Start the broker process and wait until its socket answers.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("broker.log"))
            .unwrap();
        let broker = self
            .broker_bin
            .clone()
            .unwrap_or_else(|| bin("gpuq-broker"));
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(broker);
                c
            }
            None if !self.hide_files.is_empty() => {
                // unshare(1) makes the mount namespace private; sh binds
                // /dev/null over each file, then execs the broker in it.
                let mut c = Command::new("unshare");
                c.args(["--mount", "--propagation", "private", "sh", "-euc"])
                    .arg(
                        "for f in $GPUQ_TEST_HIDE; do mount --bind /dev/null \"$f\"; done; exec \"$0\" \"$@\"",
                    )
                    .arg(broker)
                    .env(
                        "GPUQ_TEST_HIDE",
                        self.hide_files
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(" "),
                    );
                c
            }
            None => Command::new(broker),
        };
        let child = cmd
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("--config")
            .arg(&self.config)
            .env("GPUQ_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn gpuq-broker");
        self.child = Some(child);
        // Started means an HTTP answer (any status), not an accepting
        // socket: the socket takes connections from its bind on, before the
        // broker's start-up recovery. A connection that is accepted and then
        // fails before an answer is said on stderr, so a broker that drops
        // connections at start-up stays visible (seen once in a rehearsal,
        // under load: a submit right after a restart ended in "connection
        // error").
        let t0 = Instant::now();
        let mut tries = 0;
        loop {
            let e = match http_answer(&self.socket) {
                Ok(()) => break,
                Err(e) => e,
            };
            let listening = !matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            );
            if listening {
                tries += 1;
                eprintln!("gpuq-broker accepted but did not answer (try {tries}): {e}");
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "gpuq-broker exited with {status} during start-up:\n{}",
                    self.broker_log()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "broker did not {} within 20 s:\n{}",
                if listening { "answer" } else { "come up" },
                self.broker_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Write the config and run the broker expecting it to refuse to start:
    /// its output once it exited (it must within 20 s).
    pub fn start_refused(&self) -> Output {
        self.write_config();
        let mut child = Command::new(bin("gpuq-broker"))
            .arg("--config")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gpuq-broker");
        let t0 = Instant::now();
        while child.try_wait().expect("wait").is_none() {
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let out = child.wait_with_output().expect("reap");
                panic!("gpuq-broker did not refuse to start: {}", stderr(&out));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("reap")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9` the broker (by the PID we started) and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop the broker the way systemd does (SIGTERM) and wait for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("broker is running");
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        c.wait().expect("wait for broker")
    }

    pub fn broker_log(&self) -> String {
        std::fs::read_to_string(self.path("broker.log")).unwrap_or_default()
    }

    /// `gpuq ARGS` as `user` (root when `None`) in `cwd`, with
    /// `GPUQ_SOCKET` set (not run yet).
    fn gpuq_cmd(&self, user: Option<&User>, cwd: &Path, args: &[&str]) -> Command {
        let gpuq = bin("gpuq");
        let mut cmd = match user {
            None => Command::new(&gpuq),
            Some(u) => {
                let mut c = Command::new("/usr/bin/setpriv");
                c.arg(format!("--reuid={}", u.uid))
                    .arg(format!("--regid={}", u.gid));
                if u.groups.is_empty() {
                    c.arg("--clear-groups");
                } else {
                    c.arg(format!(
                        "--groups={}",
                        u.groups
                            .iter()
                            .map(u32::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    ));
                }
                c.arg(&gpuq);
                c
            }
        };
        cmd.args(args)
            .current_dir(cwd)
            .env("GPUQ_SOCKET", &self.socket)
            .stdin(Stdio::null());
        cmd
    }

    /// Run `gpuq ARGS` as `user` (root when `None`) in `cwd` with extra env.
    pub fn gpuq_in(
        &self,
        user: Option<&User>,
        cwd: &Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Output {
        let mut cmd = self.gpuq_cmd(user, cwd, args);
        cmd.envs(env.iter().copied());
        cmd.output().expect("run gpuq")
    }

    /// `gpuq_in` with nothing of the test runner's environment: only
    /// `PATH=/usr/bin:/bin`, `GPUQ_SOCKET` and `env`. A submit carries the
    /// caller's whole environment, so a test whose verdict depends on the
    /// size of the request uses this (issue 30: CI's larger environment
    /// pushed an "under the limit" submit over it).
    pub fn gpuq_env_only(
        &self,
        user: Option<&User>,
        cwd: &Path,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Output {
        let mut cmd = self.gpuq_cmd(user, cwd, args);
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("GPUQ_SOCKET", &self.socket)
            .envs(env.iter().copied());
        cmd.output().expect("run gpuq")
    }

    pub fn gpuq(&self, user: Option<&User>, args: &[&str]) -> Output {
        self.gpuq_in(user, self.dir.path(), &[], args)
    }

    /// A work directory owned by `user` (mode 0700), for jobs to run in.
    pub fn workdir(&self, user: Option<&User>, name: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::create_dir_all(&p).unwrap();
        if let Some(u) = user {
            std::os::unix::fs::chown(&p, Some(u.uid), Some(u.gid)).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        p
    }

    /// Submit and return the job ID (panics with the CLI's stderr on failure).
    pub fn submit(&self, user: Option<&User>, cwd: &Path, args: &[&str]) -> u64 {
        let mut full = vec!["submit"];
        full.extend_from_slice(args);
        let out = self.gpuq_in(user, cwd, &[], &full);
        assert!(out.status.success(), "submit failed: {}", stderr(&out));
        stdout(&out)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("submit printed more than the ID: {:?}", stdout(&out)))
    }

    /// The job as `gpuq status --json` shows it (as root).
    pub fn job(&self, id: u64) -> serde_json::Value {
        let out = self.gpuq(ROOT, &["status", &id.to_string(), "--json"]);
        assert!(out.status.success(), "status: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("status json")
    }

    pub fn state(&self, id: u64) -> String {
        self.job(id)["state"].as_str().unwrap_or("").to_string()
    }

    /// Poll until job `id` is in `state` (or panic after `secs`).
    pub fn wait_state(&self, id: u64, state: &str, secs: u64) -> serde_json::Value {
        let t0 = Instant::now();
        loop {
            let j = self.job(id);
            if j["state"] == state {
                return j;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "job {id} is {} after {secs}s, expected {state}\nbroker log:\n{}",
                j["state"],
                self.broker_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send raw bytes to the socket and return the raw HTTP answer.
    pub fn raw_http(&self, request: &[u8]) -> String {
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server may answer (413) and close before it has read everything.
        // No half-close: hyper drops a connection whose read side closed.
        // Requests carry `connection: close`, so the server ends the stream.
        let _ = s.write_all(request);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Number of jobs the broker knows, counted as root.
    pub fn job_count(&self) -> usize {
        let out = self.gpuq(ROOT, &["list", "--all", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list json");
        v["jobs"].as_array().map_or(0, Vec::len)
    }

    fn kill_cgroups(&self) {
        let Ok(entries) = std::fs::read_dir(&self.cgroup_parent) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                let _ = std::fs::write(p.join("cgroup.kill"), "1");
                for _ in 0..100 {
                    if std::fs::remove_dir(&p).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        let _ = std::fs::remove_dir(&self.cgroup_parent);
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.kill9();
        self.kill_cgroups();
        if std::thread::panicking() {
            eprintln!("--- broker log ---\n{}", self.broker_log());
        }
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Is a process with this PID alive (and not a zombie)?
/// One `GET /v1/lock` (the cheapest route: no store query) on the broker's
/// socket: Ok once a whole HTTP answer arrived (read to the close, within
/// 5 s), so the connection is over on both sides when it returns.
fn http_answer(socket: &Path) -> std::io::Result<()> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /v1/lock HTTP/1.1\r\nHost: gpuq\r\nConnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    if answer.starts_with(b"HTTP/1.1 ") {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "not an HTTP answer: {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(40)])
        )))
    }
}

pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            // state is the field after "(comm)"
            let state = s
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

/// Poll `f` until it returns true or `secs` pass.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}
pub mod cluster;
