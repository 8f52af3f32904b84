//! A real systemd to test the systemd runner against: a Podman container
//! whose PID 1 is systemd (Debian 12 root filesystem built by
//! `integration/systemd-box/build.sh`, cached under `target/systemd-box/`).
//!
//! [`SystemdBox::boot`] starts the container (rootful Podman with its own
//! `--root/--runroot/--tmpdir` in a temporary directory, runc + cgroupfs,
//! no network) on an overlay of the cached tree, installs the workspace's
//! `gpuq-broker` and `gpuq` binaries and the shipped `gpuq-broker.service`
//! inside, and starts the broker as that systemd service with
//! `runner = "systemd"`. The broker then creates its jobs' transient units
//! through the D-Bus API of the container's systemd, exactly as on a
//! production host. Tests drive it with the real `gpuq` CLI inside the box
//! (`podman exec`), as root or as users created in the box's user database.
//!
//! On drop — also when a test panicked — the container it started is
//! removed by its ID (which ends every process in it), whatever is still
//! mounted under its temporary directory is unmounted, and the directory is
//! deleted. Only the test harness runs the Podman CLI; product code never
//! does.

use crate::{bin, stderr, stdout, User};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The stamp `build.sh` writes last; a cache with another stamp is rebuilt.
const STAMP: &str = "systemd-box v1: bookworm minbase + systemd systemd-sysv dbus procps passwd";

/// Where the box's files come from and go to.
pub const BROKER_CONFIG: &str = "/etc/gpuqueue-daos/broker.toml";
pub const LOG_ROOT: &str = "/var/log/gpuq";

const CONTAINERS_CONF: &str = "[containers]\n\
default_ulimits = [\"nofile=4096:4096\", \"nproc=4096:4096\"]\n\
[engine]\n\
runtime = \"runc\"\n\
cgroup_manager = \"cgroupfs\"\n\
events_logger = \"file\"\n";

use crate::which;

/// The workspace root (this crate lives in `<root>/tests`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The rootfs cache: `<target>/systemd-box` (next to `target/debug`).
pub fn cache_dir() -> PathBuf {
    crate::bin_dir()
        .parent()
        .map(|t| t.join("systemd-box"))
        .unwrap_or_else(|| workspace_root().join("target/systemd-box"))
}

fn cache_ready(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("rootfs.stamp")).is_ok_and(|s| s == STAMP)
        && dir.join("rootfs/sbin/init").exists()
}

/// Why the systemd box cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root (rootful Podman boots systemd in a container)".into());
    }
    if which("podman").is_none() {
        return Some("needs podman and runc (apt-get install podman runc)".into());
    }
    if !cache_ready(&cache_dir()) && which("debootstrap").is_none() {
        return Some(format!(
            "no cached systemd-box rootfs in {} and no debootstrap to build one (apt-get install debootstrap)",
            cache_dir().display()
        ));
    }
    None
}

#[macro_export]
macro_rules! require_systemd_box {
    () => {
        if let Some(why) = $crate::systemd_box::skip_reason() {
            $crate::cannot_run(module_path!(), &why);
            return;
        }
    };
}

/// The cached rootfs directory, built first if missing (once, under a lock).
pub fn rootfs() -> PathBuf {
    let dir = cache_dir();
    if !cache_ready(&dir) {
        let script = workspace_root().join("integration/systemd-box/build.sh");
        let t0 = Instant::now();
        let out = Command::new("bash")
            .arg(&script)
            .arg(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("run integration/systemd-box/build.sh");
        assert!(
            out.status.success(),
            "{} {} failed:\n{}{}",
            script.display(),
            dir.display(),
            stdout(&out),
            stderr(&out)
        );
        eprintln!(
            "systemd-box: rootfs ready after {:.0?} ({})",
            t0.elapsed(),
            stderr(&out).trim()
        );
        assert!(
            cache_ready(&dir),
            "build.sh left no usable rootfs in {}",
            dir.display()
        );
    }
    dir.join("rootfs")
}

/// A booted container with systemd as PID 1 and the broker as a service.
#[derive(Debug)]
pub struct SystemdBox {
    dir: tempfile::TempDir,
    id: Option<String>,
}

impl SystemdBox {
    /// Boot the box, install the binaries, write the broker's config
    /// (`runner = "systemd"`, `gpu = "none"`) and start `gpuq-broker.service`.
    pub fn boot() -> Self {
        let b = Self::boot_bare();
        b.install_broker();
        b.start_broker();
        b
    }

    /// Boot the box and wait for its systemd, installing nothing (the
    /// package tests install the debs themselves). Files put in
    /// [`SystemdBox::host_files`] appear in the box under `/host`.
    pub fn boot_bare() -> Self {
        v1_systemd_dirs_before();
        LIVE_BOXES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let rootfs = rootfs();
        let dir = tempfile::Builder::new()
            .prefix("gpuq-systemd-box-")
            .tempdir()
            .expect("tempdir");
        let mut b = SystemdBox { dir, id: None };
        for sub in ["root", "runroot", "tmp", "files"] {
            std::fs::create_dir_all(b.dir.path().join(sub)).unwrap();
        }
        std::fs::write(b.dir.path().join("containers.conf"), CONTAINERS_CONF).unwrap();
        // Private copies: a rebuild of the workspace while the test runs
        // does not change what runs in the box.
        let files = b.dir.path().join("files");
        for name in ["gpuq-broker", "gpuq"] {
            std::fs::copy(bin(name), files.join(name)).expect("copy binary");
        }
        std::fs::copy(
            workspace_root().join("integration/systemd-box/init.sh"),
            files.join("init.sh"),
        )
        .expect("copy integration/systemd-box/init.sh");
        let out = b
            .podman()
            .args(["run", "-d", "--systemd=always", "--network=none"])
            .args(["--hostname", "gpuq-box", "--cgroupns=private"])
            // init.sh mounts the container's cgroup2 hierarchy on v1 hosts.
            .args([
                "--cap-add",
                "SYS_ADMIN",
                "--security-opt",
                "apparmor=unconfined",
            ])
            .arg("-v")
            .arg(format!("{}:/host:ro", files.display()))
            .arg("--rootfs")
            .arg(format!("{}:O", rootfs.display()))
            .arg("/host/init.sh")
            .output()
            .expect("run podman");
        assert!(
            out.status.success(),
            "podman run (systemd as PID 1) failed: {}",
            stderr(&out)
        );
        let id = stdout(&out).trim().to_string();
        assert!(
            id.len() == 64 && id.bytes().all(|c| c.is_ascii_hexdigit()),
            "podman run printed {id:?}, not a container ID"
        );
        eprintln!(
            "systemd box: container {id} (storage {})",
            b.dir.path().display()
        );
        b.id = Some(id);
        // Until the manager answers, systemctl prints nothing (or
        // "offline"); then `--wait` returns once start-up is over.
        let mut state = String::new();
        let up = crate::eventually(30, || {
            state = stdout(&b.sh("systemctl is-system-running --wait 2>&1 || true"))
                .trim()
                .to_string();
            state == "running" || state == "degraded"
        });
        assert!(
            up,
            "systemd in the box is {state:?}:\n{}",
            stdout(&b.sh("systemctl --failed --no-pager; journalctl -b --no-pager | tail -n 50"))
        );
        b
    }

    /// The host directory the box sees read-only at `/host`.
    pub fn host_files(&self) -> PathBuf {
        self.dir.path().join("files")
    }

    /// The host's PID of the box's PID 1 (systemd).
    pub fn init_host_pid(&self) -> i32 {
        let out = self
            .podman()
            .args(["inspect", "--format", "{{.State.Pid}}", self.id()])
            .output()
            .expect("podman inspect");
        let pid: i32 = stdout(&out)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("podman inspect: {}{}", stdout(&out), stderr(&out)));
        assert!(pid > 1, "podman says PID 1 of the box is host PID {pid}");
        pid
    }

    /// Stop the box's systemd (SIGSTOP from the host, which the kernel lets
    /// through to a namespace's PID 1) until the guard is dropped (SIGCONT,
    /// also when the test panics). Whatever the broker asks systemd
    /// meanwhile waits in the bus: this is how a test holds systemd before
    /// it acts on a request, as a busy host would. Do not call `systemctl`
    /// while it is held.
    pub fn hold_systemd(&self) -> HeldSystemd {
        HeldSystemd {
            _stopped: gpuq_podman_harness::Sigstopped::new(
                self.init_host_pid(),
                "the box's systemd",
            ),
        }
    }

    /// `podman` with this box's storage and configuration.
    pub fn podman(&self) -> Command {
        let d = self.dir.path();
        let mut c = Command::new("podman");
        c.env("CONTAINERS_CONF", d.join("containers.conf"))
            .arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .stdin(Stdio::null());
        c
    }

    pub fn id(&self) -> &str {
        self.id.as_deref().expect("box is up")
    }

    /// Run `argv` in the box as root, in `cwd`, with extra environment.
    pub fn exec(&self, cwd: &str, env: &[(&str, &str)], argv: &[&str]) -> Output {
        let mut c = self.podman();
        c.arg("exec").arg("-w").arg(cwd);
        for (k, v) in env {
            c.arg("-e").arg(format!("{k}={v}"));
        }
        c.arg(self.id()).args(argv);
        c.output().expect("podman exec")
    }

    /// `sh -c SCRIPT` in the box as root.
    pub fn sh(&self, script: &str) -> Output {
        self.exec("/", &[], &["sh", "-c", script])
    }

    /// `sh -c SCRIPT` in the box as root; panics unless it succeeds; stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "in the box: {script}\nexit {:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    }

    /// Put `text` into `path` in the box (root-owned, mode `mode`).
    pub fn write_file(&self, path: &str, text: &str, mode: u32) {
        let host = self.dir.path().join("files/.write");
        std::fs::write(&host, text).unwrap();
        self.sh_ok(&format!(
            "mkdir -p \"$(dirname {path})\" && install -o root -g root -m {mode:o} /host/.write {path}"
        ));
    }

    fn install_broker(&self) {
        self.sh_ok(
            "install -m 755 /host/gpuq-broker /usr/local/sbin/gpuq-broker && \
             install -m 755 /host/gpuq /usr/local/bin/gpuq",
        );
        let unit = std::fs::read_to_string(workspace_root().join("systemd/gpuq-broker.service"))
            .expect("systemd/gpuq-broker.service");
        self.write_file("/etc/systemd/system/gpuq-broker.service", &unit, 0o644);
        // The shipped unit as is, except: the test restarts the broker
        // itself (no automatic restart) and wants debug logs.
        self.write_file(
            "/etc/systemd/system/gpuq-broker.service.d/test.conf",
            "[Service]\nRestart=no\nEnvironment=GPUQ_LOG=debug\n",
            0o644,
        );
        let config = format!(
            "[broker]\n\
             socket = \"/run/gpuq/broker.sock\"\n\
             state_dir = \"/var/lib/gpuqueue-daos\"\n\
             log_root = \"{LOG_ROOT}\"\n\
             maintenance_file = \"/etc/gpuqueue-daos/maintenance.json\"\n\
             runner = \"systemd\"\n\
             gpu = \"none\"\n\
             default_time = \"10m\"\n\
             max_time = \"1h\"\n"
        );
        self.write_file(BROKER_CONFIG, &config, 0o644);
        self.sh_ok("systemctl daemon-reload");
    }

    /// `systemctl start gpuq-broker` (Type=notify: returns once it is ready).
    pub fn start_broker(&self) {
        let out = self.sh("systemctl start gpuq-broker.service");
        assert!(
            out.status.success(),
            "gpuq-broker.service did not start: {}\n{}",
            stderr(&out),
            self.broker_log()
        );
    }

    /// The broker's main PID in the box (0 when it is not running).
    pub fn broker_pid(&self) -> u32 {
        self.sh_ok("systemctl show -P MainPID gpuq-broker.service")
            .trim()
            .parse()
            .unwrap_or(0)
    }

    /// `kill -9` the broker's main process (only it: the jobs are units of
    /// their own) and wait until systemd has noticed.
    pub fn kill9_broker(&self) {
        let pid = self.broker_pid();
        assert!(pid > 0, "no broker running");
        self.sh_ok(&format!("kill -9 {pid}"));
        assert!(
            crate::eventually(10, || self
                .sh_ok("systemctl show -P ActiveState gpuq-broker.service")
                .trim()
                == "failed"),
            "gpuq-broker.service did not fail after kill -9"
        );
    }

    pub fn broker_log(&self) -> String {
        stdout(&self.sh("journalctl --no-pager -o short-monotonic -u gpuq-broker.service"))
    }

    /// A user in the box's user database (group per GID in `u.groups` too),
    /// with a work directory `/w/<name>` it owns (mode 0700).
    pub fn add_user(&self, name: &str, u: &User) -> String {
        let mut script = String::new();
        let mut gids = vec![u.gid];
        gids.extend(u.groups.iter().copied().filter(|g| *g != u.gid));
        for g in &gids {
            script.push_str(&format!(
                "getent group {g} >/dev/null || groupadd -g {g} g{g}; "
            ));
        }
        let extra: Vec<String> = gids[1..].iter().map(u32::to_string).collect();
        let dir = format!("/w/{name}");
        script.push_str(&format!(
            "useradd -K UID_MAX=99999 -K GID_MAX=99999 -u {} -g {} {} -M -d {dir} -s /bin/bash {name} && \
             mkdir -p {dir} && chown {}:{} {dir} && chmod 700 {dir}",
            u.uid,
            u.gid,
            if extra.is_empty() {
                String::new()
            } else {
                format!("-G {}", extra.join(","))
            },
            u.uid,
            u.gid
        ));
        self.sh_ok(&script);
        dir
    }

    /// Run the real `gpuq ARGS` in the box as `user` (root when `None`), in
    /// `cwd`, with extra environment; the CLI finds the broker's socket in
    /// its default config, as on the host.
    pub fn gpuq_in(
        &self,
        user: Option<&User>,
        cwd: &str,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Output {
        let mut argv: Vec<String> = Vec::new();
        if let Some(u) = user {
            argv.push("setpriv".into());
            argv.push(format!("--reuid={}", u.uid));
            argv.push(format!("--regid={}", u.gid));
            if u.groups.is_empty() {
                argv.push("--clear-groups".into());
            } else {
                argv.push(format!(
                    "--groups={}",
                    u.groups
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ));
            }
        }
        argv.push("/usr/local/bin/gpuq".into());
        argv.extend(args.iter().map(|s| s.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.exec(cwd, env, &argv)
    }

    pub fn gpuq(&self, user: Option<&User>, args: &[&str]) -> Output {
        self.gpuq_in(user, "/", &[], args)
    }

    /// Submit and return the job ID.
    pub fn submit(&self, user: Option<&User>, cwd: &str, args: &[&str]) -> u64 {
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
        let out = self.gpuq(None, &["status", &id.to_string(), "--json"]);
        assert!(out.status.success(), "status: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("status json")
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
                "job {id} is {} after {secs}s, expected {state}\n{j}\nbroker log:\n{}",
                j["state"],
                self.broker_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A file's content in the box ("" if unreadable).
    pub fn read(&self, path: &str) -> String {
        stdout(&self.exec("/", &[], &["cat", path]))
    }

    /// The job's log file, read in the box.
    pub fn log_of(&self, id: u64) -> String {
        let j = self.job(id);
        self.read(j["log_path"].as_str().expect("log_path"))
    }

    /// A property of the job's unit (`systemctl show -P`); "" if unknown.
    pub fn unit_prop(&self, id: u64, prop: &str) -> String {
        stdout(&self.sh(&format!("systemctl show -P {prop} gpuq-job-{id}.service")))
            .trim()
            .to_string()
    }

    /// Whether systemd still has the job's unit loaded.
    pub fn unit_loaded(&self, id: u64) -> bool {
        self.unit_prop(id, "LoadState") == "loaded"
    }

    /// PIDs (in the box) that are alive and not zombies, out of `pids`.
    pub fn alive_of(&self, pids: &[i32]) -> Vec<i32> {
        pids.iter()
            .copied()
            .filter(|p| {
                let stat = self.read(&format!("/proc/{p}/stat"));
                let state = stat
                    .rsplit(')')
                    .next()
                    .and_then(|r| r.split_whitespace().next());
                !stat.is_empty() && !matches!(state, Some("Z") | Some("X"))
            })
            .collect()
    }

    /// The processes in the unit's cgroup (from its `cgroup.procs`, in
    /// whichever hierarchy systemd runs on: v2 or the v1 name=systemd one);
    /// `None` when the cgroup does not exist.
    pub fn unit_cgroup_procs(&self, cgroup: &str) -> Option<Vec<i32>> {
        let out = self.sh(&format!(
            "for r in /sys/fs/cgroup/unified /sys/fs/cgroup/systemd /sys/fs/cgroup; do \
               if [ -f \"$r{cgroup}/cgroup.procs\" ]; then cat \"$r{cgroup}/cgroup.procs\"; exit 0; fi; \
             done; exit 3"
        ));
        out.status.success().then(|| {
            stdout(&out)
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        })
    }

    /// PIDs of processes whose command line names this box's directory
    /// (conmon, podman cleanup: they were started for this box only).
    fn storage_users(&self) -> Vec<i32> {
        let needle = self.dir.path().as_os_str().as_encoded_bytes().to_vec();
        let me = std::process::id() as i32;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return vec![];
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| *pid != me && crate::alive(*pid))
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_slice()))
            })
            .collect()
    }

    fn end_storage_users(&self) {
        if crate::eventually(10, || self.storage_users().is_empty()) {
            return;
        }
        for pid in self.storage_users() {
            eprintln!("systemd box: killing leftover pid {pid}");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        crate::eventually(5, || self.storage_users().is_empty());
    }

    fn unmount_leftovers(&self) {
        let root = self.dir.path().to_path_buf();
        let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let mut points: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .map(|p| PathBuf::from(p.replace("\\040", " ")))
            .filter(|p| p.starts_with(&root))
            .collect();
        // Deepest first.
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in points {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&p)
                .stdin(Stdio::null())
                .output();
        }
    }
}

/// The box's systemd stopped; dropping this lets it go on.
#[derive(Debug)]
pub struct HeldSystemd {
    _stopped: gpuq_podman_harness::Sigstopped,
}

impl Drop for SystemdBox {
    fn drop(&mut self) {
        if let Some(id) = self.id.clone() {
            if std::thread::panicking() {
                eprintln!(
                    "--- systemd box: journal ---\n{}",
                    stdout(&self.sh("journalctl --no-pager -o short-monotonic | tail -n 150"))
                );
            }
            let out = self.podman().args(["rm", "-f", "-t", "0", &id]).output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!("systemd box: podman rm {id}: {}", stderr(&o)),
                Err(e) => eprintln!("systemd box: podman rm {id}: {e}"),
            }
            self.id = None;
        }
        // conmon, and the `podman container cleanup` it runs when the
        // container exits, use this box's storage: let them finish (they
        // would recreate directories in it), then end any left by PID.
        self.end_storage_users();
        self.unmount_leftovers();
        // The boxes of this test process share that hierarchy's root: the
        // last one to go removes what they made there.
        if LIVE_BOXES.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            remove_new_v1_systemd_dirs();
        }
        let root = self.dir.path().to_path_buf();
        for _ in 0..50 {
            match std::fs::remove_dir_all(&root) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                _ => break,
            }
        }
        if root.exists() {
            eprintln!("systemd box: could not remove {}", root.display());
        }
    }
}

/// The host's named v1 `systemd` hierarchy, on a v1/hybrid host. The box's
/// systemd sees its root there (Podman's cgroupfs manager gives it no cgroup
/// of its own in that hierarchy) and makes `system.slice/*.service`
/// directories in it.
const V1_SYSTEMD: &str = "/sys/fs/cgroup/systemd";

/// Boxes of this test process not yet dropped.
static LIVE_BOXES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn dirs_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        if let Ok(rd) = std::fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(e.path());
                    out.push(e.path());
                }
            }
        }
    }
    out
}

/// What existed in that hierarchy before this test process booted a box.
fn v1_systemd_dirs_before() -> &'static Vec<PathBuf> {
    static BEFORE: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    BEFORE.get_or_init(|| dirs_under(Path::new(V1_SYSTEMD)))
}

/// Remove the directories the boxes' systemd made there, deepest first
/// (only when no box of this process runs any more).
fn remove_new_v1_systemd_dirs() {
    let before = v1_systemd_dirs_before();
    let mut new: Vec<PathBuf> = dirs_under(Path::new(V1_SYSTEMD))
        .into_iter()
        .filter(|d| !before.contains(d))
        .collect();
    new.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in new {
        let _ = std::fs::remove_dir(&d);
    }
}
