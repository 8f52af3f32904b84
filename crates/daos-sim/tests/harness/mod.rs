//! A four-server simulated DAOS system on 127.0.0.1 for tests: real
//! `daos-sim` processes behind argv[0] symlinks in a temp dir, each server
//! with its own port, config, metadata dir, bdev file and log. Every process
//! is killed by PID on drop, also when the test panics.

#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_daos-sim");

#[derive(Debug)]
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    pub cfg: PathBuf,
    pub md: PathBuf,
    pub bdev: PathBuf,
    pub log: PathBuf,
    pub env: Vec<(String, String)>,
    pub child: Option<Child>,
}

#[derive(Debug)]
pub struct Cluster {
    pub tmp: tempfile::TempDir,
    pub bin: PathBuf,
    pub servers: Vec<Server>,
    pub control: PathBuf,
    pub others: Vec<Child>,
}

/// `n` ports the kernel just handed out (bound on 0.0.0.0 like the servers,
/// then released), so parallel tests do not collide.
pub fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("0.0.0.0:0").expect("bind port 0"))
        .collect();
    ls.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

pub fn server_yml(
    name: &str,
    port: u16,
    ms_port: u16,
    idx: usize,
    md: &Path,
    bdev: &Path,
) -> String {
    format!(
        "name: {name}
port: {port}
mgmt_svc_replicas: ['127.0.0.1:{ms_port}']
provider: ofi+tcp
transport_config: {transport}
control_metadata: {{path: {md}}}
control_log_file: {log}
disable_vfio: true
disable_hugepages: true
system_ram_reserved: 2
fault_path: /da{n}
engines:
  - targets: 4
    fabric_iface: lo
    fabric_iface_port: {fport}
    storage:
      - {{class: ram, scm_mount: /mnt/daos, scm_size: 4}}
      - {{class: file, bdev_list: [{bdev}], bdev_size: 1, bdev_roles: [wal, meta, data]}}
",
        md = md.display(),
        log = md.with_file_name("control.log").display(),
        bdev = bdev.display(),
        n = idx + 1,
        fport = 31416 + idx,
        transport = "{allow_insecure: true}",
    )
}

/// One lease's certificates (gpuq-leasecert) written under `dir` with
/// DAOS's modes: `daosCA.crt`, `server.*`, `admin.*`, `agent.*` and an empty
/// `clients/`. Returns the transport_config lines for server, dmg, agent.
pub fn write_lease_certs(dir: &Path, lease: &str) -> [String; 3] {
    use std::os::unix::fs::PermissionsExt;
    let c = gpuq_leasecert::LeaseCerts::generate(lease).unwrap();
    fs::create_dir_all(dir.join("clients")).unwrap();
    let put = |name: &str, body: &str, mode: u32| {
        let p = dir.join(name);
        fs::write(&p, body).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    put("daosCA.crt", &c.ca_cert, 0o444);
    for (n, ck) in [
        ("server", &c.server),
        ("admin", &c.admin),
        ("agent", &c.agent),
    ] {
        put(&format!("{n}.crt"), &ck.cert, 0o444);
        put(&format!("{n}.key"), &ck.key, 0o400);
    }
    let d = dir.display();
    let tc = |who: &str, extra: &str| {
        format!(
            "{{allow_insecure: false, ca_cert: {d}/daosCA.crt, cert: {d}/{who}.crt, key: {d}/{who}.key{extra}}}"
        )
    };
    [
        tc("server", &format!(", client_cert_dir: {d}/clients")),
        tc("admin", ""),
        tc("agent", ""),
    ]
}

impl Cluster {
    /// Writes configs for `n` servers (not started).
    pub fn new(n: usize) -> Self {
        Self::with_transport(n, None)
    }

    /// `n` servers requiring mutual TLS with one lease's certificates
    /// (under `<tmp>/certs`); the cluster's control.yml presents the admin
    /// certificate. Started.
    pub fn start_tls(n: usize) -> Self {
        let mut c = Self::with_transport(n, Some("lease-a"));
        for i in 0..n {
            c.start_server(i);
        }
        c.wait_listening();
        c
    }

    fn with_transport(n: usize, lease: Option<&str>) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("daos-sim-test")
            .tempdir()
            .unwrap();
        let bin = tmp.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        for name in ["daos_server", "daos_agent", "dmg", "daos"] {
            std::os::unix::fs::symlink(BIN, bin.join(name)).unwrap();
        }
        let ports = free_ports(n);
        let tcs = lease.map(|l| write_lease_certs(&tmp.path().join("certs"), l));
        let insecure = "{allow_insecure: true}".to_string();
        let server_tc = tcs.as_ref().map_or(insecure.clone(), |t| t[0].clone());
        let control_tc = tcs.as_ref().map_or(insecure, |t| t[1].clone());
        let servers: Vec<Server> = ports
            .iter()
            .enumerate()
            .map(|(i, &port)| {
                let dir = tmp.path().join(format!("da{}", i + 1));
                fs::create_dir_all(&dir).unwrap();
                let md = dir.join("control_meta");
                let bdev = dir.join("bdev0");
                let cfg = dir.join("daos_server.yml");
                fs::write(
                    &cfg,
                    server_yml("daos_server", port, ports[0], i, &md, &bdev).replace(
                        "transport_config: {allow_insecure: true}",
                        &format!("transport_config: {server_tc}"),
                    ),
                )
                .unwrap();
                Server {
                    port,
                    log: dir.join("server.log"),
                    dir,
                    cfg,
                    md,
                    bdev,
                    env: Vec::new(),
                    child: None,
                }
            })
            .collect();
        let control = tmp.path().join("daos_control.yml");
        let hosts: Vec<String> = ports.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        fs::write(
            &control,
            format!(
                "name: daos_server\nport: 10001\nhostlist: [{}]\ntransport_config: {control_tc}\n",
                hosts.join(", ")
            ),
        )
        .unwrap();
        Cluster {
            tmp,
            bin,
            servers,
            control,
            others: Vec::new(),
        }
    }

    pub fn start(n: usize) -> Self {
        let mut c = Self::new(n);
        for i in 0..n {
            c.start_server(i);
        }
        c.wait_listening();
        c
    }

    pub fn start_server(&mut self, i: usize) {
        let s = &mut self.servers[i];
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&s.log)
            .unwrap();
        let mut cmd = Command::new(self.bin.join("daos_server"));
        cmd.args(["start", "-o"])
            .arg(&s.cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .env_remove("DAOS_SIM_FAULTS")
            .env_remove("DAOS_SIM_FAULTS_FILE")
            .env_remove("DAOS_SIM_STOP_TIMEOUT");
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        s.child = Some(cmd.spawn().expect("spawn daos_server"));
    }

    /// Waits until every started server accepts connections; panics with
    /// its log if one exited instead (e.g. its port was taken meanwhile).
    pub fn wait_listening(&mut self) {
        for i in 0..self.servers.len() {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let s = &mut self.servers[i];
                let Some(child) = s.child.as_mut() else { break };
                if let Some(st) = child.try_wait().unwrap() {
                    panic!(
                        "server {i} exited ({st}) while starting:\n{}",
                        fs::read_to_string(&s.log).unwrap_or_default()
                    );
                }
                if std::net::TcpStream::connect(("127.0.0.1", s.port)).is_ok() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "server {i} not listening on {}",
                    s.port
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.servers[i].child.as_ref().expect("running").id()
    }

    pub fn signal(&self, i: usize, sig: &str) {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid(i).to_string())
            .status()
            .unwrap();
        assert!(st.success());
    }

    /// Waits for server `i` to exit; returns its exit code (None: still running).
    pub fn wait_exit(&mut self, i: usize, timeout: Duration) -> Option<i32> {
        let child = self.servers[i].child.as_mut()?;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(st) = child.try_wait().unwrap() {
                self.servers[i].child = None;
                return Some(st.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn log(&self, i: usize) -> String {
        fs::read_to_string(&self.servers[i].log).unwrap_or_default()
    }

    /// Server `i`'s log once it says `needle` (at most `secs`; the log as
    /// it is then otherwise). A server may listen before it has written
    /// the line that says so: a loaded run read the log in between.
    pub fn log_saying(&self, i: usize, needle: &str, secs: u64) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let log = self.log(i);
            if log.contains(needle) || std::time::Instant::now() >= deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn run(&self, tool: &str, args: &[&str]) -> Output {
        self.run_env(tool, args, &[])
    }

    pub fn run_env(&self, tool: &str, args: &[&str], env: &[(&str, &Path)]) -> Output {
        let mut cmd = Command::new(self.bin.join(tool));
        cmd.args(args).stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run tool")
    }

    /// `dmg -o control.yml -j ARGS`: (parsed stdout, exit code).
    pub fn dmg(&self, args: &[&str]) -> (Value, i32) {
        let mut a = vec!["-o", self.control.to_str().unwrap(), "-j"];
        a.extend_from_slice(args);
        let out = self.run("dmg", &a);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "dmg {args:?} printed no JSON ({e}): stdout {:?} stderr {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (v, out.status.code().unwrap_or(-1))
    }

    /// Polls `system query` until `pred` holds for its members.
    pub fn wait_members(&self, timeout: Duration, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let (v, _) = self.dmg(&["system", "query"]);
            let members = v["response"]["members"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if pred(&members) {
                return members;
            }
            assert!(Instant::now() < deadline, "timed out; last query: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_all_joined(&self, n: usize) -> Vec<Value> {
        self.wait_members(Duration::from_secs(20), |m| {
            m.len() == n && m.iter().all(|m| m["state"] == "joined")
        })
    }

    pub fn spawn_other(&mut self, tool: &str, args: &[&str], env: &[(&str, &Path)]) {
        let mut cmd = Command::new(self.bin.join(tool));
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.others.push(cmd.spawn().unwrap());
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            if let Some(mut c) = s.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        for c in &mut self.others {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            for (i, s) in self.servers.iter().enumerate() {
                eprintln!(
                    "--- server {i} log ---\n{}",
                    fs::read_to_string(&s.log).unwrap_or_default()
                );
            }
        }
    }
}

pub fn wait_for(timeout: Duration, f: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "condition not met in {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts `actual` has exactly the field names and JSON types of
/// `expected`, recursively. Arrays: every element matches the fixture's
/// first. Object keys written `<...>` in a fixture stand for any key.
pub fn assert_same_shape(expected: &Value, actual: &Value, path: &str) {
    use Value::*;
    match (expected, actual) {
        (Null, Null) | (Bool(_), Bool(_)) | (String(_), String(_)) => {}
        (Number(e), Number(a)) => assert_eq!(
            e.is_f64(),
            a.is_f64(),
            "{path}: number kind differs: fixture {e}, got {a}"
        ),
        (Array(e), Array(a)) => {
            if let Some(first) = e.first() {
                for (i, x) in a.iter().enumerate() {
                    assert_same_shape(first, x, &format!("{path}[{i}]"));
                }
            }
        }
        (Object(e), Object(a)) => {
            if let Some((k, wild)) = e.iter().find(|(k, _)| k.starts_with('<')) {
                assert_eq!(e.len(), 1, "{path}: fixture mixes {k} with other keys");
                assert!(!a.is_empty(), "{path}: expected entries like {k}, got none");
                for (ak, av) in a {
                    assert_same_shape(wild, av, &format!("{path}.{ak}"));
                }
                return;
            }
            let ek: Vec<&std::string::String> = e.keys().collect();
            let ak: Vec<&std::string::String> = a.keys().collect();
            assert_eq!(ek, ak, "{path}: field names differ");
            for (k, ev) in e {
                assert_same_shape(ev, &a[k], &format!("{path}.{k}"));
            }
        }
        _ => panic!("{path}: JSON type differs: fixture {expected}, got {actual}"),
    }
}

pub fn fixture(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap()
}
