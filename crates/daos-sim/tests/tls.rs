//! Mutual TLS on the simulator's control port (`allow_insecure: false`):
//! four real servers with one lease's certificates (gpuq-leasecert); dmg
//! with that lease's admin certificate is served, everyone else is refused
//! and changes nothing.

mod harness;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use harness::{write_lease_certs, Cluster};
use serde_json::Value;

/// dmg -j with a control config carrying `tc` (a transport_config value).
fn dmg_with(c: &Cluster, name: &str, tc: &str, extra: &[&str], args: &[&str]) -> (Value, i32) {
    let hosts: Vec<String> = c
        .servers
        .iter()
        .map(|s| format!("'127.0.0.1:{}'", s.port))
        .collect();
    let cfg = c.tmp.path().join(format!("{name}.yml"));
    fs::write(
        &cfg,
        format!(
            "name: daos_server\nport: 10001\nhostlist: [{}]\ntransport_config: {tc}\n",
            hosts.join(", ")
        ),
    )
    .unwrap();
    let mut a = vec!["-o", cfg.to_str().unwrap(), "-j"];
    a.extend_from_slice(extra);
    a.extend_from_slice(args);
    let out = c.run("dmg", &a);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dmg printed no JSON ({e}): {:?} {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v, out.status.code().unwrap_or(-1))
}

fn refused(v: &Value, code: i32, want: &str) {
    assert_eq!(code, 1, "{v}");
    assert!(v["response"].is_null(), "{v}");
    let e = v["error"].as_str().unwrap_or_default();
    assert!(e.contains(want), "wanted {want:?} in {v}");
}

fn joined(c: &Cluster) -> usize {
    let (v, code) = c.dmg(&["system", "query"]);
    assert_eq!(code, 0, "{v}");
    v["response"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] == "joined")
        .count()
}

#[test]
fn mutual_tls_serves_the_lease_admin_and_refuses_every_other_client() {
    let mut c = Cluster::start_tls(4);
    for i in 0..4 {
        let log = c.log_saying(i, "(mutual TLS)", 30);
        assert!(log.contains("(mutual TLS)"), "{log}");
    }
    // The lease's admin certificate: format, four joins (the servers join
    // the management service with the server certificate).
    let (v, code) = c.dmg(&["storage", "format"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["response"]["host_errors"], serde_json::json!({}), "{v}");
    c.wait_members(Duration::from_secs(20), |m| {
        m.len() == 4 && m.iter().all(|m| m["state"] == "joined")
    });

    let certs = c.tmp.path().join("certs");
    let a = certs.display().to_string();
    // Another user's dmg: no certificate (-i, or allow_insecure).
    let (v, code) = dmg_with(
        &c,
        "plain",
        "{allow_insecure: true}",
        &[],
        &["system", "stop"],
    );
    refused(&v, code, "transport security mismatch");
    let (v, code) = dmg_with(
        &c,
        "plain-i",
        "{allow_insecure: false}",
        &["-i"],
        &["system", "query"],
    );
    refused(&v, code, "transport security mismatch");
    // A self-made admin certificate (its own CA, CN=admin), trusting the
    // lease's CA (public: every handshake shows the server's chain).
    let other = c.tmp.path().join("other");
    write_lease_certs(&other, "lease-b");
    let o = other.display().to_string();
    let (v, code) = dmg_with(
        &c,
        "selfmade",
        &format!("{{ca_cert: {a}/daosCA.crt, cert: {o}/admin.crt, key: {o}/admin.key}}"),
        &[],
        &["system", "stop", "--force"],
    );
    refused(&v, code, "TLS session with");
    assert!(
        (0..4).any(|i| c.log(i).contains("TLS handshake refused")),
        "no server logged the refused handshake"
    );
    // The same with its own CA: dmg does not trust the lease's servers.
    let (v, code) = dmg_with(
        &c,
        "selfmade-ca",
        &format!("{{ca_cert: {o}/daosCA.crt, cert: {o}/admin.crt, key: {o}/admin.key}}"),
        &[],
        &["system", "query"],
    );
    refused(&v, code, "TLS session with");
    // The lease's own agent certificate is not an admin's.
    let (v, code) = dmg_with(
        &c,
        "agentcert",
        &format!("{{ca_cert: {a}/daosCA.crt, cert: {a}/agent.crt, key: {a}/agent.key}}"),
        &[],
        &["system", "stop"],
    );
    refused(
        &v,
        code,
        "permission denied: component \"agent\" may not call SystemStop",
    );
    assert_eq!(v["status"], -1001, "{v}");
    // Nothing of that stopped anything.
    assert_eq!(joined(&c), 4);

    // The agent (agent certificate) sends its clients' container create.
    let (v, code) = c.dmg(&["pool", "create", "tank", "--size=25G"]);
    assert_eq!(code, 0, "{v}");
    let agent_dir = c.tmp.path().join("agent");
    let agent_yml = c.tmp.path().join("daos_agent.yml");
    fs::write(
        &agent_yml,
        format!(
            "name: daos_server\naccess_points: ['127.0.0.1:{}']\nport: 10001\ntransport_config: {{allow_insecure: false, ca_cert: {a}/daosCA.crt, cert: {a}/agent.crt, key: {a}/agent.key}}\nfabric_ifaces: []\n",
            c.servers[0].port
        ),
    )
    .unwrap();
    let env = [("DAOS_AGENT_DRPC_DIR", agent_dir.as_path())];
    c.spawn_other("daos_agent", &["-o", agent_yml.to_str().unwrap()], &env);
    harness::wait_for(Duration::from_secs(10), || {
        agent_dir.join("daos_agent.sock").exists()
    });
    let out = c.run_env(
        "daos",
        &["container", "create", "tank", "c1", "--type=POSIX"],
        &env,
    );
    assert!(out.status.success(), "{out:?}");

    // The lease's admin stops the system.
    let (v, code) = c.dmg(&["system", "stop"]);
    assert_eq!(code, 0, "{v}");
}

#[test]
fn certificate_files_are_checked_like_daos_before_anything_is_sent() {
    let c = Cluster::start_tls(1);
    let a = c.tmp.path().join("certs").display().to_string();
    // No certificate files configured: DAOS's defaults, missing here.
    let (v, code) = dmg_with(
        &c,
        "none",
        "{allow_insecure: false}",
        &[],
        &["system", "query"],
    );
    refused(&v, code, "/etc/daos/certs/daosCA.crt");
    // An admin key readable by others (DAOS allows at most 0440).
    let key = c.tmp.path().join("admin-open.key");
    fs::copy(Path::new(&a).join("admin.key"), &key).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let (v, code) = dmg_with(
        &c,
        "openkey",
        &format!(
            "{{ca_cert: {a}/daosCA.crt, cert: {a}/admin.crt, key: {}}}",
            key.display()
        ),
        &[],
        &["system", "query"],
    );
    refused(&v, code, "insecure permissions 0o644");
    // A server with TLS refuses to start on an open server key.
    let mut c2 = Cluster::start_tls(1);
    c2.signal(0, "KILL");
    assert!(c2.wait_exit(0, Duration::from_secs(5)).is_some());
    let skey = c2.tmp.path().join("certs/server.key");
    fs::set_permissions(&skey, fs::Permissions::from_mode(0o440)).unwrap();
    c2.start_server(0);
    assert_eq!(c2.wait_exit(0, Duration::from_secs(10)), Some(1));
    assert!(
        c2.log(0).contains("insecure permissions 0o440"),
        "{}",
        c2.log(0)
    );
}

#[test]
fn a_tls_client_on_an_insecure_port_is_refused() {
    let c = Cluster::start(1);
    let certs = c.tmp.path().join("certs");
    let [_, admin, _] = write_lease_certs(&certs, "lease-x");
    let (v, code) = dmg_with(&c, "tls", &admin, &[], &["system", "query"]);
    refused(&v, code, "TLS session with");
    assert!(
        c.log(0)
            .contains("a TLS client on an insecure control port"),
        "{}",
        c.log(0)
    );
}

/// DAOS's agent signs client credentials with RSA only
/// (security/signature.go): the simulator's agent refuses an ECDSA agent
/// key at start, and starts with the lease's (RSA) one.
#[test]
fn an_agent_with_an_ecdsa_key_is_refused_like_daos_and_the_lease_key_works() {
    let c = Cluster::new(0);
    let dir = c.tmp.path().join("certs");
    let [_, _, agent_tc] = write_lease_certs(&dir, "lease-rsa");
    let ec = rcgen::KeyPair::generate().unwrap(); // ECDSA P-256
    let cert = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .self_signed(&ec)
        .unwrap();
    for (name, body, mode) in [
        ("ec-agent.crt", cert.pem(), 0o444),
        ("ec-agent.key", ec.serialize_pem(), 0o400),
    ] {
        fs::write(dir.join(name), body).unwrap();
        fs::set_permissions(dir.join(name), fs::Permissions::from_mode(mode)).unwrap();
    }
    let d = dir.display();
    let ec_tc = format!(
        "{{allow_insecure: false, ca_cert: {d}/daosCA.crt, cert: {d}/ec-agent.crt, key: {d}/ec-agent.key}}"
    );
    let run = |tag: &str, tc: &str| {
        let yml = c.tmp.path().join(format!("agent-{tag}.yml"));
        fs::write(
            &yml,
            format!("name: daos_server\naccess_points: ['127.0.0.1:1']\nport: 10001\ntransport_config: {tc}\nfabric_ifaces: []\n"),
        )
        .unwrap();
        let sock_dir = c.tmp.path().join(format!("agent-{tag}"));
        let mut child = std::process::Command::new(c.bin.join("daos_agent"))
            .args(["-o", yml.to_str().unwrap()])
            .env("DAOS_AGENT_DRPC_DIR", &sock_dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn daos_agent");
        let t = std::time::Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                let out = child.wait_with_output().unwrap();
                return (Some(st), String::from_utf8_lossy(&out.stderr).into_owned());
            }
            if sock_dir.join("daos_agent.sock").exists() {
                let _ = child.kill();
                let _ = child.wait();
                return (None, String::new());
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{tag}: neither up nor exited"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let (exit, err) = run("ec", &ec_tc);
    assert!(
        exit.is_some_and(|s| !s.success()),
        "an ECDSA agent started: {err}"
    );
    assert!(err.contains("unsupported key type"), "{err}");
    assert!(!c.tmp.path().join("agent-ec/daos_agent.sock").exists());
    let (exit, err) = run("rsa", &agent_tc);
    assert!(exit.is_none(), "the lease's RSA agent did not start: {err}");
}

/// The server's key must be RSA (DAOS's one cipher suite is RSA key
/// exchange), and each certificate in `client_cert_dir` is one
/// certificate (security/pem.go LoadCertificate): the simulator refuses to
/// start on either, with DAOS's words.
#[test]
fn a_server_with_an_ecdsa_key_or_two_certificates_in_one_client_file_does_not_start() {
    let mut c = Cluster::start_tls(1);
    c.signal(0, "KILL");
    assert!(c.wait_exit(0, Duration::from_secs(5)).is_some());
    let dir = c.tmp.path().join("certs");
    let put = |name: &str, body: &str, mode: u32| {
        let p = dir.join(name);
        let _ = fs::remove_file(&p);
        fs::write(&p, body).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    };
    let rsa_key = fs::read_to_string(dir.join("server.key")).unwrap();
    let rsa_crt = fs::read_to_string(dir.join("server.crt")).unwrap();
    let agent_crt = fs::read_to_string(dir.join("agent.crt")).unwrap();

    // Two certificates in clients/agent.crt.
    put(
        "clients/agent.crt",
        &format!("{agent_crt}{agent_crt}"),
        0o444,
    );
    c.start_server(0);
    assert_eq!(c.wait_exit(0, Duration::from_secs(10)), Some(1));
    assert!(
        c.log(0).contains("Only one cert allowed per file"),
        "{}",
        c.log(0)
    );
    // One is fine.
    put("clients/agent.crt", &agent_crt, 0o444);

    // An ECDSA server key.
    let ec = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["server".to_string()])
        .unwrap()
        .self_signed(&ec)
        .unwrap();
    put("server.crt", &cert.pem(), 0o444);
    put("server.key", &ec.serialize_pem(), 0o400);
    c.start_server(0);
    assert_eq!(c.wait_exit(0, Duration::from_secs(10)), Some(1));
    assert!(c.log(0).contains("not an RSA key"), "{}", c.log(0));

    // The lease's own (RSA) pair: the server starts and answers.
    put("server.crt", &rsa_crt, 0o444);
    put("server.key", &rsa_key, 0o400);
    c.start_server(0);
    c.wait_listening();
}
