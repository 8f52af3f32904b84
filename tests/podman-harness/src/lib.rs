//! Test harness (feature `testing`): a real `podman system service` per
//! test, on its own socket and storage, and a test image assembled here
//! without a registry.
//!
//! Each [`PodmanService`] lives in a fresh temp dir under `/tmp`:
//! `root/` (`--root`), `runroot/` (`--runroot`), `tmp/` (`--tmpdir`, libpod's
//! state and events), `vartmp/` (`TMPDIR`: where `images/load` spools the
//! archive), `containers.conf` (the settings environment.md says this host
//! needs: runc, cgroupfs, explicit ulimits, file events) and `podman.sock`.
//! Tests therefore run in parallel without sharing anything.
//!
//! On drop (also when a test panics) it removes the containers it made with
//! the podman CLI pointed at the same storage, kills exactly the PID it
//! started, ends the conmon processes whose command line names its unique
//! temp dir (exec sessions' conmons otherwise linger 300 s and then run a
//! cleanup command that recreates the storage), unmounts whatever
//! containers/storage left mounted under its temp dir (the overlay driver
//! bind-mounts `root/overlay` onto itself; each container has a `shm`
//! tmpfs), by path, deepest first, and removes the dir.
//! Only the harness runs the podman binary; the crate under test never does.
//!
//! [`PodmanService::start_in_own_pid_namespace`] runs the service as PID 1
//! of a new PID and mount namespace (`unshare --pid --fork --kill-child
//! --mount-proc`): the PIDs it reports are not ours, as with a Podman on
//! another host or in another container. Its drop removes the containers
//! from inside that namespace (`nsenter`), then SIGKILLs the `unshare` it
//! started, whose `--kill-child` SIGKILLs the service; the kernel ends
//! whatever else lived in the namespace with it, and its mounts go with it.
//!
//! Other crates' tests (the node helper's) use it too:
//! `gpuq-podman = { path = "../gpuq-podman", features = ["testing"] }` under
//! `[dev-dependencies]`. Never enable it in a production build: it runs the
//! podman binary.

mod frozen;
pub use frozen::Sigstopped;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuq_podman::{ImageArchive, ImageId, LibpodClient, Podman};
use sha2::{Digest, Sha256};

/// The settings from shared/testing/environment.md ("Podman (rootful)"):
/// crun fails here and Podman's default rlimits exceed the sandbox's.
const CONTAINERS_CONF: &str = r#"[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"#;

/// Where the busybox-static package puts its binary.
const BUSYBOX: &str = "/bin/busybox";

/// The applets linked into the test image.
const APPLETS: &[&str] = &[
    "sh", "sleep", "cat", "echo", "true", "false", "readlink", "id", "touch", "grep", "tr",
    "hostname",
];

pub use gpuq_test_skip::cannot_run;

/// Run the calling test as its own storage node: in the parent, re-execute
/// this test binary for `test` alone in a new network namespace (loopback
/// up), as the test cluster runs one node per namespace, and check it
/// passed; return `false` (the parent's test body must return). In that
/// child, return `true` (run the body). Needs root; otherwise the test
/// fails with the reason (tests/skip).
pub fn as_own_node(test: &str) -> bool {
    as_own_node_env(test, &[])
}

/// [`as_own_node`], the child with `env` set too (e.g. a system bus address
/// that leads nowhere, for a test of what happens without systemd).
pub fn as_own_node_env(test: &str, env: &[(&str, &str)]) -> bool {
    if std::env::var_os("GPUQ_NODE_TEST_CHILD").is_some() {
        return true;
    }
    if !is_root() {
        cannot_run(test, "needs root (network namespace, rootful Podman)");
        return false;
    }
    let out = std::process::Command::new("unshare")
        .args([
            "--net",
            "--",
            "sh",
            "-c",
            "ip link set lo up && exec \"$@\"",
            "sh",
        ])
        .arg(std::env::current_exe().expect("this test's executable"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("GPUQ_NODE_TEST_CHILD", "1")
        .envs(env.iter().copied())
        .output()
        .expect("run unshare (util-linux)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{test} in its own network namespace failed:\n{text}"
    );
    assert!(text.contains("1 passed"), "{test} did not run:\n{text}");
    false
}

/// Run the calling test alone in a process of its own: in the parent,
/// re-execute this test binary for `test` only and check it passed; return
/// `false` (the parent's body must return). In that child, return `true`.
/// For tests that look at the whole process (its open descriptors), which
/// the other tests of the binary, running in parallel threads, would
/// otherwise disturb.
pub fn alone(test: &str) -> bool {
    if std::env::var_os("GPUQ_TEST_ALONE").is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("this test's executable"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("GPUQ_TEST_ALONE", "1")
        .output()
        .expect("run this test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{test}, run alone, failed:\n{text}");
    assert!(text.contains("1 passed"), "{test} did not run:\n{text}");
    false
}

/// Returns a reason to skip when podman is not installed (CI installs it).
pub fn skip_reason() -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("podman").is_file()))
        .unwrap_or(false);
    if found {
        None
    } else {
        Some("podman is not installed (apt-get install podman runc busybox-static)".to_owned())
    }
}

/// Starts a service, or prints why not and returns `None` when podman is not
/// installed. Any other failure panics: a broken setup must not pass.
pub fn service_or_skip(test: &str) -> Option<PodmanService> {
    if let Some(reason) = skip_reason() {
        cannot_run(test, &reason);
        return None;
    }
    assert!(
        is_root(),
        "{test}: these tests drive rootful podman and must run as root"
    );
    Some(PodmanService::start())
}

fn is_root() -> bool {
    // No libc in this crate's dependencies; /proc tells us.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// A running `podman system service` with its own storage.
#[derive(Debug)]
pub struct PodmanService {
    dir: Option<tempfile::TempDir>,
    child: Option<Child>,
    /// The service's API socket.
    pub socket: PathBuf,
    /// Run under `unshare`, in its own PID and mount namespace.
    own_pid_ns: bool,
}

impl PodmanService {
    /// Starts a service in a fresh temp dir and waits for its socket.
    /// Panics (with the service's log) if it does not come up.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Like [`PodmanService::start`], with the service as PID 1 of its own
    /// PID (and mount) namespace: the container PIDs it reports do not
    /// name the containers' processes in ours.
    pub fn start_in_own_pid_namespace() -> Self {
        Self::start_with(true)
    }

    fn start_with(own_pid_ns: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("gpuq-podman-test-")
            .tempdir_in("/tmp")
            .expect("create temp dir");
        for sub in ["root", "runroot", "tmp", "vartmp"] {
            std::fs::create_dir(dir.path().join(sub)).expect("create storage dirs");
        }
        std::fs::write(dir.path().join("containers.conf"), CONTAINERS_CONF)
            .expect("write containers.conf");
        let socket = dir.path().join("podman.sock");
        let log = std::fs::File::create(dir.path().join("service.log")).expect("service log");
        let mut svc = Self {
            child: None,
            socket: socket.clone(),
            dir: Some(dir),
            own_pid_ns,
        };
        let mut cmd = if own_pid_ns {
            // unshare ignores SIGTERM while it waits; drop SIGKILLs it and
            // --kill-child passes that on to the service.
            let mut c = Command::new("unshare");
            c.args(["--pid", "--fork", "--kill-child", "--mount-proc", "podman"]);
            c
        } else {
            Command::new("podman")
        };
        svc.podman_args(&mut cmd);
        let child = cmd
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn podman system service");
        svc.child = Some(child);
        svc.wait_ready();
        svc
    }

    /// The temp dir holding everything of this service.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("dir lives until drop").path()
    }

    /// A `podman` command on this service's storage (harness use only), in
    /// the service's namespaces when it has its own.
    fn podman(&self) -> Command {
        let mut c = match self.service_pid() {
            Some(pid) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--target={pid}"))
                    .args(["--pid", "--mount", "podman"]);
                c
            }
            None => Command::new("podman"),
        };
        self.podman_args(&mut c);
        c
    }

    /// The PID of the `podman system service` process (of `unshare` when it
    /// runs in its own PID namespace).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("child lives until drop").id()
    }

    /// The service's PID (in ours) when it runs under `unshare`: the one
    /// child of the `unshare` we started.
    fn service_pid(&self) -> Option<u32> {
        if !self.own_pid_ns {
            return None;
        }
        let unshare = self.child.as_ref()?.id();
        std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn podman_args(&self, c: &mut Command) {
        let d = self.dir();
        c.arg("--root")
            .arg(d.join("root"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .arg("--tmpdir")
            .arg(d.join("tmp"))
            .env("CONTAINERS_CONF", d.join("containers.conf"))
            .env("TMPDIR", d.join("vartmp"));
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "podman system service exited with {status} before its socket came up:\n{}",
                    self.service_log()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "podman system service did not create {} within 30 s:\n{}",
                    self.socket.display(),
                    self.service_log()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// What the service wrote to stderr.
    pub fn service_log(&self) -> String {
        std::fs::read_to_string(self.dir().join("service.log")).unwrap_or_default()
    }

    /// A connected client (panics if connecting fails).
    pub async fn client(&self) -> LibpodClient {
        LibpodClient::connect(&self.socket)
            .await
            .expect("connect to the test podman service")
    }

    /// Builds the test image and loads it through the client under test.
    pub async fn load_image(&self, client: &LibpodClient, image: &TestImage) {
        let loaded = client
            .image_load(ImageArchive::from_bytes(image.archive.clone()))
            .await
            .expect("load the test image");
        assert!(!loaded.names.is_empty(), "load reported no names");
    }

    /// Mount points under our temp dir, deepest first.
    fn our_mounts(&self) -> Vec<String> {
        let prefix = self.dir().to_string_lossy().into_owned();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut mounts: Vec<String> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(unescape_mountinfo)
            .filter(|m| m == &prefix || m.starts_with(&format!("{prefix}/")))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        mounts.dedup();
        mounts
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl PodmanService {
    /// PIDs of processes whose command line names our temp dir: conmon
    /// (one per container, and one per exec session, which lingers for its
    /// `--exit-delay` of 300 s) and the `podman container cleanup` exit
    /// commands they run. Our dir's name is unique, so this matches only
    /// what this service started.
    fn our_processes(&self) -> Vec<i32> {
        let needle = format!("{}/", self.dir().display());
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| {
                        String::from_utf8_lossy(&c)
                            .replace('\0', " ")
                            .contains(&needle)
                    })
                    .unwrap_or(false)
            })
            .collect()
    }

    /// Lets our stragglers exit on their own for a moment, then SIGKILLs
    /// each by PID.
    fn end_our_processes(&self) {
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let pids = self.our_processes();
            if pids.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                for pid in pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
                if self.our_processes().is_empty() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn unmount_ours(&self) {
        for m in self.our_mounts() {
            let ok = Command::new("umount")
                .arg(&m)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&m).status();
            }
        }
    }
}

impl Drop for PodmanService {
    fn drop(&mut self) {
        // 1. Remove every container of this storage (kills running ones).
        let out = self
            .podman()
            .args(["rm", "--all", "--force", "--time", "0"])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "harness: podman rm -af failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("harness: cannot run podman rm -af: {e}"),
        }
        // 2. Kill exactly the service we started, and reap it. Under
        //    unshare: SIGKILL to unshare, which SIGKILLs the service (PID 1
        //    of its namespace: the kernel ends the rest of the namespace).
        let inner = self.service_pid();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(pid) = inner {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // 3. conmon processes and their cleanup commands: left alone, an exec
        //    session's conmon would run `podman --root <our dir> container
        //    cleanup` 300 s from now and recreate (and mount) our storage.
        // 4. Unmount what containers/storage left mounted under our dir, by
        //    path, deepest first, then remove the dir. Twice if needed: a
        //    cleanup command that was mid-way can remount.
        for attempt in 0..3 {
            self.end_our_processes();
            self.unmount_ours();
            let dir = self.dir().to_owned();
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => break,
                Err(e) if attempt == 2 => {
                    eprintln!("harness: cannot remove {}: {e}", dir.display());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        let left = self.our_mounts();
        if !left.is_empty() {
            eprintln!("harness: mounts left behind: {left:?}");
        }
        // The TempDir's own drop finds the dir gone, which is fine.
        drop(self.dir.take());
    }
}

/// A docker-archive image assembled in memory: one layer with a static
/// busybox and applet symlinks, a config whose `Env` carries `WHICH=<variant>`
/// so two variants have different IDs and say which one runs.
#[derive(Debug, Clone)]
pub struct TestImage {
    /// Its image ID (the SHA-256 of its config), known before loading.
    pub id: ImageId,
    /// The docker-archive tar.
    pub archive: Vec<u8>,
}

impl TestImage {
    /// Assembles the image; `variant` goes into `WHICH=` and a label, `tag`
    /// into the archive's `RepoTags`.
    pub fn build(variant: &str, tag: Option<&str>) -> Self {
        let busybox = std::fs::read(BUSYBOX)
            .unwrap_or_else(|e| panic!("read {BUSYBOX} (install busybox-static): {e}"));
        let layer = layer_tar(&busybox);
        let layer_hex = sha256_hex(&layer);
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let config = serde_json::json!({
            "architecture": arch,
            "os": "linux",
            "created": "2026-01-01T00:00:00Z",
            "config": {
                "Env": ["PATH=/bin", format!("WHICH={variant}")],
                "Cmd": ["sh"],
                "Labels": {"io.gpuq.test-image": variant},
            },
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_hex}")]},
            "history": [{"created": "2026-01-01T00:00:00Z", "created_by": "gpuq-podman test harness"}],
        });
        let config = serde_json::to_vec(&config).expect("encode config");
        let config_hex = sha256_hex(&config);
        let repo_tags: Vec<&str> = tag.into_iter().collect();
        let manifest = serde_json::to_vec(&serde_json::json!([{
            "Config": format!("{config_hex}.json"),
            "RepoTags": repo_tags,
            "Layers": [format!("{layer_hex}.tar")],
        }]))
        .expect("encode manifest");

        let mut outer = tar::Builder::new(Vec::new());
        append_file(&mut outer, &format!("{config_hex}.json"), &config, 0o644);
        append_file(&mut outer, &format!("{layer_hex}.tar"), &layer, 0o644);
        append_file(&mut outer, "manifest.json", &manifest, 0o644);
        let archive = outer.into_inner().expect("finish archive");
        Self {
            // The image ID of a docker-archive image is the digest of its config.
            id: ImageId::parse(&format!("sha256:{config_hex}")).expect("valid id"),
            archive,
        }
    }
}

fn layer_tar(busybox: &[u8]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    dir.set_mtime(0);
    b.append_data(&mut dir, "bin/", std::io::empty())
        .expect("layer dir");
    append_file(&mut b, "bin/busybox", busybox, 0o755);
    for applet in APPLETS {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        h.set_mtime(0);
        b.append_link(&mut h, format!("bin/{applet}"), "busybox")
            .expect("layer symlink");
    }
    b.into_inner().expect("finish layer")
}

fn append_file<W: Write>(b: &mut tar::Builder<W>, path: &str, data: &[u8], mode: u32) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    h.set_mtime(0);
    b.append_data(&mut h, path, data).expect("append to tar");
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
