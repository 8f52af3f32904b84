//! Each DAOS lease has its own certificates (issue #13, item 5): during a
//! user's `--inst` job another user on cxl2 can neither read the lease's
//! admin key nor reach its control plane without it (no certificate, a
//! self-made one), while the owner's job and `gpuq daos-exec` are served;
//! after the cleanup no certificate or key of the lease is left anywhere.

use gpuq_system_tests::cluster::*;
use gpuq_system_tests::daos_site::*;
use gpuq_system_tests::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Every file under `dir` (not following symlinks) whose name matches.
fn find(dir: &Path, pred: &dyn Fn(&str) -> bool, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            find(&p, pred, out);
        } else if pred(&e.file_name().to_string_lossy()) {
            out.push(p);
        }
    }
}

fn cert_files(dirs: &[&Path]) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in dirs {
        find(
            d,
            &|n| n.ends_with(".key") && n != "id_ed25519.key" || n == "daosCA.crt",
            &mut v,
        );
    }
    v
}

/// `prog ARGS` as `u` in cxl2's network namespace (where jobs run).
fn as_user(s: &Site, u: &User, prog: &Path, args: &[&str]) -> Output {
    Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", s.c.id.namespace("cxl2")))
        .arg("setpriv")
        .arg(format!("--reuid={}", u.uid))
        .arg(format!("--regid={}", u.gid))
        .arg("--clear-groups")
        .arg(prog)
        .args(args)
        .output()
        .expect("run setpriv")
}

fn envelope(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("no JSON envelope ({e}): {} {}", stdout(o), stderr(o)))
}

#[test]
fn another_users_dmg_is_refused_the_owners_is_served_and_no_certificate_is_left() {
    require_cluster_env!();
    require_env!();
    let s = Site::up("dj-tls");
    let (a, b) = (alice(), bob());
    let wa = s.b.workdir(Some(&a), "alice");
    let wb = s.b.workdir(Some(&b), "bob");
    let dmg = dmg_on_host();
    let g = bin("gpuq").display().to_string();
    // The job says where its config is, then waits for the test's "go".
    let script = format!(
        "echo \"$DAOS_CONTROL_CONFIG\" > cc; touch ready; \
         while [ ! -e go ]; do sleep 0.1; done; \
         {dmg} dmg -o \"$DAOS_CONTROL_CONFIG\" -j system query > after.json; \
         {g} daos-exec -- dmg -o \"$DAOS_CONTROL_CONFIG\" -j system query > exec.json"
    );
    let id = s.b.submit(
        Some(&a),
        &wa,
        &["--inst", "test", "--", "bash", "-c", &script],
    );
    assert!(
        eventually(180, || wa.join("ready").exists()),
        "the job did not start: {}",
        s.log(id)
    );
    let control = PathBuf::from(std::fs::read_to_string(wa.join("cc")).unwrap().trim());
    let lease_dir = control.parent().unwrap().to_path_buf();
    let user_dir = lease_dir.join("user");

    // The lease's keys: alice's admin key (hers, 0400, in her 0500 dir);
    // every node's server key (root's, 0400).
    let k = std::fs::metadata(user_dir.join("admin.key")).unwrap();
    assert_eq!((k.uid(), k.mode() & 0o777), (a.uid, 0o400));
    let d = std::fs::metadata(&user_dir).unwrap();
    assert_eq!((d.uid(), d.mode() & 0o777), (a.uid, 0o500));
    let mut server_keys = Vec::new();
    find(s.c.dir(), &|n| n == "server.key", &mut server_keys);
    assert_eq!(server_keys.len(), 4, "{server_keys:?}");
    for p in &server_keys {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o400), "{}", p.display());
    }

    // Bob cannot read the admin key (neither alice's nor the admin
    // container's copy) ...
    let cat = Path::new("/bin/cat");
    for p in [
        user_dir.join("admin.key"),
        lease_dir.join("admin/admin.key"),
    ] {
        let o = as_user(&s, &b, cat, &[p.to_str().unwrap()]);
        assert!(!o.status.success(), "bob read {}", p.display());
        assert!(stdout(&o).is_empty());
    }
    // Nor reach her agent, which would hand his client credentials on her
    // running system: its socket is 0666, as DAOS makes it, but its
    // directory lets only alice (and root) through (issue #31).
    let agent_sock = lease_dir.join("agent/daos_agent.sock");
    let py = Path::new("/usr/bin/python3");
    let connect = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])";
    let o = as_user(&s, &b, py, &["-c", connect, agent_sock.to_str().unwrap()]);
    assert!(
        !o.status.success() && stderr(&o).contains("PermissionError"),
        "bob reached alice's agent: {} {}",
        stdout(&o),
        stderr(&o)
    );
    let o = as_user(&s, &a, py, &["-c", connect, agent_sock.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "alice cannot reach her agent: {}",
        stderr(&o)
    );
    // ... so alice's config does not work for him,
    let sim = PathBuf::from(&dmg);
    let c = control.to_str().unwrap();
    let o = as_user(
        &s,
        &b,
        &sim,
        &["dmg", "-o", c, "-j", "system", "stop", "--force"],
    );
    let v = envelope(&o);
    assert!(!o.status.success(), "{v}");
    // (dmg reads the CA certificate first: the owner's directory is shut.)
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains(&user_dir.display().to_string()) && e.contains("Permission denied"),
        "{v}"
    );
    // without a certificate he is refused,
    let o = as_user(
        &s,
        &b,
        &sim,
        &["dmg", "-o", c, "-i", "-j", "system", "stop", "--force"],
    );
    let v = envelope(&o);
    assert!(!o.status.success(), "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("transport security mismatch"),
        "{v}"
    );
    // and so with an admin certificate of his own CA (trusting the
    // lease's CA certificate, which is public).
    let own = gpuq_leasecert::LeaseCerts::generate("bobs-own").unwrap();
    let bd = wb.join("certs");
    std::fs::create_dir_all(&bd).unwrap();
    std::fs::copy(user_dir.join("daosCA.crt"), bd.join("daosCA.crt")).unwrap();
    std::fs::write(bd.join("admin.crt"), &own.admin.cert).unwrap();
    std::fs::write(bd.join("admin.key"), &own.admin.key).unwrap();
    Command::new("chmod")
        .args(["0400"])
        .arg(bd.join("admin.key"))
        .status()
        .unwrap();
    Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", b.uid, b.gid))
        .arg(&bd)
        .status()
        .unwrap();
    let hosts: Vec<String> = NODES.iter().map(|n| format!("'{}'", addr(n))).collect();
    let bob_yml = wb.join("bob.yml");
    std::fs::write(
        &bob_yml,
        format!(
            "name: daos_server\nport: 10001\nhostlist: [{}]\ntransport_config:\n  allow_insecure: false\n  ca_cert: {d}/daosCA.crt\n  cert: {d}/admin.crt\n  key: {d}/admin.key\n",
            hosts.join(", "),
            d = bd.display()
        ),
    )
    .unwrap();
    let o = as_user(
        &s,
        &b,
        &sim,
        &[
            "dmg",
            "-o",
            bob_yml.to_str().unwrap(),
            "-j",
            "system",
            "stop",
            "--force",
        ],
    );
    let v = envelope(&o);
    assert!(!o.status.success(), "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("TLS session with"),
        "{v}"
    );

    // Alice's job: still four joined ranks (nothing was stopped), and her
    // `gpuq daos-exec` is served.
    std::fs::write(wa.join("go"), "").unwrap();
    s.expect_end(id, "completed", 120);
    for f in ["after.json", "exec.json"] {
        let b = std::fs::read(wa.join(f)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b)
            .unwrap_or_else(|e| panic!("{f}: {e}: {}", String::from_utf8_lossy(&b)));
        assert_eq!(v["status"], 0, "{f}: {v}");
        let joined = v["response"]["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["state"] == "joined")
            .count();
        assert_eq!(joined, 4, "{f}: {v}");
    }
    eventually(60, || s.active_lease().is_none());
    s.assert_clean();
    // No certificate or key of the lease is left on cxl2 or any node.
    assert!(!lease_dir.exists(), "{} is left", lease_dir.display());
    // (Bob's self-made files are the test's own.)
    std::fs::remove_dir_all(&bd).unwrap();
    let left = cert_files(&[s.c.dir(), s.b.dir.path()]);
    assert!(left.is_empty(), "left after the cleanup: {left:?}");
}
