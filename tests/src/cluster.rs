//! The five-host test cluster (`integration/cluster/`) from Rust tests.
//!
//! [`Cluster::up`] runs `integration/cluster/up` on a cluster dir and
//! namespace prefix of its own (so tests run in parallel), and on drop —
//! also when the test panicked — runs `integration/cluster/down`, which
//! removes exactly what `up` recorded. [`Leftovers`] is what a test checks
//! after `down`: namespaces, processes, mounts, links and the dir.
//!
//! The scripts do the privileged work; this module only drives them and
//! looks at the result through the same interfaces an operator would:
//! `ssh` from cxl2's namespace, `curl --unix-socket` on a node's Podman API,
//! `ip`, `/proc`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The five hosts, and the storage nodes among them.
pub const HOSTS: [&str; 5] = ["cxl2", "da1", "da2", "da3", "da4"];
pub const NODES: [&str; 4] = ["da1", "da2", "da3", "da4"];

/// Each host's address on the cluster's private bridge (see
/// docs/test-cluster.md; defined in integration/cluster/lib.sh).
pub fn addr(host: &str) -> &'static str {
    match host {
        "cxl2" => "10.200.0.10",
        "da1" => "10.200.0.11",
        "da2" => "10.200.0.12",
        "da3" => "10.200.0.13",
        "da4" => "10.200.0.14",
        other => panic!("no host {other} in the test cluster"),
    }
}

/// `integration/cluster/` in this checkout.
pub fn harness_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("integration")
        .join("cluster")
}

/// Why the cluster tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Some("needs root (network namespaces, sshd, rootful podman)".into());
    }
    for tool in [
        "ip",
        "nsenter",
        "setsid",
        "ssh",
        "ssh-keygen",
        "curl",
        "podman",
        "flock",
        "ss",
    ] {
        if which(tool).is_none() {
            return Some(format!(
                "needs {tool} (integration/install-deps installs it)"
            ));
        }
    }
    for file in ["/usr/sbin/sshd", "/bin/busybox"] {
        if !Path::new(file).exists() {
            return Some(format!(
                "needs {file} (openssh-server, busybox-static: integration/install-deps)"
            ));
        }
    }
    None
}

#[macro_export]
macro_rules! require_cluster_env {
    () => {
        if let Some(why) = $crate::cluster::skip_reason() {
            $crate::cannot_run(module_path!(), &why);
            return;
        }
    };
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Where a cluster lives and what its namespaces are called; enough to tear
/// it down or look for its leftovers without anything else.
#[derive(Debug, Clone)]
pub struct ClusterId {
    pub dir: PathBuf,
    pub prefix: String,
}

impl ClusterId {
    /// A fresh, unique dir under /tmp and a matching namespace prefix.
    pub fn unique(name: &str) -> Self {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        ClusterId {
            // Short: Podman limits the nodes' run roots to 50 characters.
            dir: PathBuf::from(format!("/tmp/gpuqc-{name}-{}-{n}", pid % 100_000)),
            prefix: format!("gpuqt{}-{n}", pid % 100_000),
        }
    }

    /// A harness command (`up`, `down`, `status`, `shell`, …) for this cluster.
    pub fn command(&self, verb: &str) -> Command {
        let mut c = Command::new(harness_dir().join(verb));
        c.env("GPUQ_CLUSTER_DIR", &self.dir)
            .env("GPUQ_CLUSTER_PREFIX", &self.prefix)
            .env("GPUQ_BIN_DIR", crate::bin_dir())
            .stdin(Stdio::null());
        c
    }

    pub fn namespace(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    /// Run `down`; returns its output (stderr is the step log).
    pub fn down(&self) -> (Output, Duration) {
        let t0 = Instant::now();
        let out = self
            .command("down")
            .output()
            .expect("run integration/cluster/down");
        (out, t0.elapsed())
    }
}

/// A running cluster; torn down on drop.
#[derive(Debug)]
pub struct Cluster {
    pub id: ClusterId,
    /// How long `up` took.
    pub up_time: Duration,
    torn_down: bool,
}

impl Cluster {
    /// Bring a cluster up (panics with `up`'s log if it fails, after
    /// tearing down whatever it created).
    pub fn up(name: &str) -> Self {
        Self::up_with(name, &[])
    }

    /// `up` with extra environment (e.g. `GPUQ_CLUSTER_PROFILE_IMAGE`).
    pub fn up_with(name: &str, env: &[(&str, &str)]) -> Self {
        let id = ClusterId::unique(name);
        let t0 = Instant::now();
        let out = id
            .command("up")
            .envs(env.iter().copied())
            .output()
            .expect("run integration/cluster/up");
        let up_time = t0.elapsed();
        let c = Cluster {
            id,
            up_time,
            torn_down: false,
        };
        assert!(
            out.status.success(),
            "integration/cluster/up failed ({}):\n{}\n{}",
            out.status,
            crate::stdout(&out),
            crate::stderr(&out)
        );
        c
    }

    pub fn dir(&self) -> &Path {
        &self.id.dir
    }

    /// A host's Podman API socket: a node's, or cxl2's own (the broker's).
    pub fn podman_sock(&self, node: &str) -> PathBuf {
        self.dir().join(node).join("run").join("podman.sock")
    }

    /// A node's gpuq-node API socket.
    pub fn node_sock(&self, node: &str) -> PathBuf {
        self.dir().join(node).join("run").join("node.sock")
    }

    pub fn ssh_config(&self) -> PathBuf {
        self.dir().join("ssh").join("ssh_config")
    }

    /// `ssh HOST ARGS…` from cxl2's namespace with the cluster's config.
    pub fn ssh(&self, host: &str, args: &[&str]) -> Output {
        self.id
            .command("ssh")
            .arg(host)
            .args(args)
            .output()
            .expect("run integration/cluster/ssh")
    }

    /// Every container on `host`'s Podman, running or not: (name, state),
    /// through its API socket.
    pub fn containers(&self, host: &str) -> Vec<(String, String)> {
        let (code, body) = self.http(
            &self.podman_sock(host),
            "GET",
            "/v4.0.0/libpod/containers/json?all=true",
            None,
        );
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["Names"][0].as_str().unwrap_or("?").to_string(),
                    c["State"].to_string(),
                )
            })
            .collect()
    }

    /// Run a command inside a host's network namespace.
    pub fn in_host(&self, host: &str, args: &[&str]) -> Output {
        self.id
            .command("shell")
            .arg(host)
            .args(args)
            .output()
            .expect("run integration/cluster/shell")
    }

    /// A harness verb with arguments; panics with its output on failure.
    pub fn run_ok(&self, verb: &str, args: &[&str]) -> String {
        let out = self
            .id
            .command(verb)
            .args(args)
            .output()
            .expect("run harness");
        assert!(
            out.status.success(),
            "integration/cluster/{verb} {args:?} failed:\n{}\n{}",
            crate::stdout(&out),
            crate::stderr(&out)
        );
        crate::stdout(&out)
    }

    /// One HTTP request to a unix socket (curl, as an operator would);
    /// returns the status code and the body.
    pub fn http(&self, sock: &Path, method: &str, path: &str, json: Option<&str>) -> (u16, String) {
        let mut c = Command::new("curl");
        c.args([
            "-sS",
            "--max-time",
            "60",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ])
        .arg("--unix-socket")
        .arg(sock);
        if let Some(body) = json {
            c.args([
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                body,
            ]);
        }
        c.arg(format!("http://d{path}"));
        let out = c.output().expect("run curl");
        let text = crate::stdout(&out);
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// `http` on a node's own Podman socket, expecting JSON.
    pub fn api_json(
        &self,
        node: &str,
        method: &str,
        path: &str,
        json: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let (code, body) = self.http(&self.podman_sock(node), method, path, json);
        let v = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
        (code, v)
    }

    /// PIDs `up` recorded for a host and role (`sshd`, `podman`).
    pub fn recorded_pid(&self, host: &str, role: &str) -> Option<i32> {
        let manifest = std::fs::read_to_string(self.dir().join("manifest")).ok()?;
        manifest.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[0] == "pid" && f[1] == host && f[2] == role)
                .then(|| f[3].parse().ok())
                .flatten()
        })
    }

    /// Start `ssh -N -L LOCAL:REMOTE node` from cxl2's namespace.
    pub fn forward(&self, node: &str, local: &Path, remote: &Path) -> Child {
        self.id
            .command("ssh")
            .args(["-N", "-o", "ExitOnForwardFailure=yes", "-L"])
            .arg(format!("{}:{}", local.display(), remote.display()))
            .arg(node)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ssh -L")
    }

    /// Tear down now (instead of on drop) and return `down`'s output and time.
    pub fn down(mut self) -> (Output, Duration) {
        self.torn_down = true;
        self.id.down()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        let (out, _) = self.id.down();
        if std::thread::panicking() || !out.status.success() {
            eprintln!(
                "--- integration/cluster/down ({}) ---\n{}",
                out.status,
                crate::stderr(&out)
            );
        }
    }
}

/// What a cluster may have left on the machine; all empty after `down`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    pub namespaces: Vec<String>,
    pub processes: Vec<String>,
    pub mounts: Vec<String>,
    pub root_links: Vec<String>,
    pub dir_exists: bool,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        *self == Leftovers::default()
    }

    /// Look for anything of cluster `id`. `links_before`: the root
    /// namespace's link names before `up` ([`root_links`]).
    pub fn of(id: &ClusterId, links_before: &[String]) -> Self {
        let dir = id.dir.to_string_lossy().into_owned();
        let ip = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        let namespaces = crate::stdout(&ip)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&format!("{}-", id.prefix)))
            .map(str::to_owned)
            .collect();
        let processes = pids_mentioning(&dir)
            .into_iter()
            .map(|(pid, cmd)| format!("{pid}: {cmd}"))
            .collect();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| *m == dir || m.starts_with(&format!("{dir}/")))
            .map(str::to_owned)
            .collect();
        // Every link is created inside the cluster's namespaces, so none of
        // ours may ever show up here: no new veth, nothing named like ours.
        let ours = ["cxl2", "da1", "da2", "da3", "da4", "br0"];
        let root_links = root_links()
            .into_iter()
            .filter(|l| !links_before.contains(l))
            .filter(|l| {
                let name = l.split('@').next().unwrap_or(l);
                ours.contains(&name) || l.contains('@')
            })
            .collect();
        Leftovers {
            namespaces,
            processes,
            mounts,
            root_links,
            dir_exists: id.dir.exists(),
        }
    }
}

/// Link names (`name` or `name@peer`) in the root network namespace.
pub fn root_links() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    crate::stdout(&out)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(str::to_owned)
        .collect()
}

/// Live processes whose command line names the path `needle`, except this one.
pub fn pids_mentioning(needle: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me && crate::alive(pid))
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
            // `dir/…` or `dir` as a whole word: /tmp/x-1 must not match /tmp/x-10.
            let hit = cmd.contains(&format!("{needle}/")) || cmd.contains(&format!("{needle} "));
            hit.then_some((pid, cmd))
        })
        .collect()
}

/// The DAOS simulator image (`integration/daos-sim-image/build.sh`), built
/// once per test binary: (archive path, `sha256:` image ID). Concurrent
/// builds by other test binaries are safe (the script is).
pub fn sim_image() -> (String, String) {
    static IMAGE: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let repo = harness_dir().join("../..").canonicalize().unwrap();
            let out = Command::new(repo.join("integration/daos-sim-image/build.sh"))
                .arg("--out")
                .arg(crate::bin_dir().join("../daos-sim-image"))
                .current_dir(&repo)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", crate::stderr(&out));
            let t = crate::stdout(&out);
            let get = |k: &str| {
                t.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .unwrap()
                    .trim()
                    .to_string()
            };
            (get("archive: "), get("image: "))
        })
        .clone()
}
