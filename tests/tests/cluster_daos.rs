//! The test cluster with the DAOS simulator: the simulator image (built
//! locally, no registry) is loaded into every node's own Podman storage and
//! pinned by its full ID in each node's test profile; the four node helpers
//! start the four servers of one lease, `dmg` formats them into one system of
//! four joined ranks, and stop + wipe on every node leave nothing of the
//! lease but its audit records.

use gpuq_system_tests::cluster::*;
use gpuq_system_tests::*;
use std::path::PathBuf;

/// Build the simulator image with the repository's script; (archive, ID).
fn sim_image() -> (PathBuf, String) {
    let repo = harness_dir().join("../..").canonicalize().unwrap();
    let out_dir = bin_dir().join("../daos-sim-image");
    let out = std::process::Command::new(repo.join("integration/daos-sim-image/build.sh"))
        .arg("--out")
        .arg(&out_dir)
        .current_dir(&repo)
        .output()
        .expect("run integration/daos-sim-image/build.sh");
    assert!(
        out.status.success(),
        "image build failed:\n{}",
        stderr(&out)
    );
    let text = stdout(&out);
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("image: "))
        .expect("build.sh prints the image ID")
        .trim()
        .to_string();
    let archive = text
        .lines()
        .find_map(|l| l.strip_prefix("archive: "))
        .expect("build.sh prints the archive path")
        .trim()
        .into();
    (archive, id)
}

fn post(c: &Cluster, node: &str, path: &str, body: Option<&str>) -> serde_json::Value {
    let (code, text) = c.http(&c.node_sock(node), "POST", path, body);
    assert_eq!(code, 200, "{node} {path}: {text}");
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

#[test]
fn four_simulated_servers_form_one_system_through_the_node_helpers() {
    require_cluster_env!();
    let (archive, image) = sim_image();
    let archive = archive.display().to_string();
    let c = Cluster::up_with(
        "daos",
        &[
            ("GPUQ_CLUSTER_IMAGE", archive.as_str()),
            ("GPUQ_CLUSTER_PROFILE_IMAGE", image.as_str()),
        ],
    );
    let lease = "L1";
    for n in NODES {
        let v = post(
            &c,
            n,
            "/v1/preflight",
            Some(r#"{"lease":"L1","profile":"test"}"#),
        );
        assert_eq!(v["ok"], true, "{n}: {v}");
    }
    // The management service replica: da1, by address (the nodes share
    // the machine's /etc/hosts, which the harness leaves alone).
    let start = format!(r#"{{"profile":"test","replicas":["{}"]}}"#, addr("da1"));
    // All four at once, as the broker will.
    std::thread::scope(|s| {
        for n in NODES {
            let (c, start) = (&c, &start);
            s.spawn(move || post(c, n, &format!("/v1/leases/{lease}/start"), Some(start)));
        }
    });
    for n in NODES {
        let st = post_get_status(&c, n);
        assert_eq!(st["lease"]["lease"], lease, "{n}: {st}");
        assert!(st["pins"][0]["present"] == true, "{n}: {st}");
        let server = &st["containers"][0];
        assert_eq!(server["role"], "server");
        assert!(
            image.ends_with(server["image"].as_str().unwrap()),
            "{server} runs the pin"
        );
    }

    // dmg, from da1's server container, against all four.
    let control = c
        .dir()
        .join("da1/test")
        .join(lease)
        .join("daos_control.yml");
    let hosts: Vec<String> = NODES.iter().map(|n| format!("'{}'", addr(n))).collect();
    std::fs::write(
        &control,
        format!(
            "name: daos_server\nport: 10001\nhostlist: [{}]\ntransport_config:\n  allow_insecure: true\n",
            hosts.join(", ")
        ),
    )
    .unwrap();
    let control = control.display().to_string();
    let server = format!("gpuq-{lease}-server");
    let dmg = |args: &[&str]| -> serde_json::Value {
        let mut full = vec![
            "da1",
            "exec",
            server.as_str(),
            "dmg",
            "-o",
            control.as_str(),
            "-j",
        ];
        full.extend_from_slice(args);
        let out = c.id.command("podman").args(&full).output().unwrap();
        // dmg prints its envelope on stdout even when it fails.
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("dmg {args:?}: {e}: {}{}", stdout(&out), stderr(&out)))
    };
    // The servers need a moment to listen; then the system awaits its format.
    let mut before = serde_json::Value::Null;
    let ready = eventually(20, || {
        before = dmg(&["system", "query"]);
        before["error"]
            .as_str()
            .unwrap_or("")
            .contains("storage format required")
    });
    if !ready {
        let (_, logs) = c.http(
            &c.node_sock("da1"),
            "GET",
            &format!("/v1/leases/{lease}/logs"),
            None,
        );
        panic!("the system does not await its format: {before}\nda1 server log:\n{logs}");
    }
    let format = dmg(&["storage", "format"]);
    assert_eq!(format["status"], 0, "{format}");
    assert_eq!(
        format["response"]["host_errors"],
        serde_json::json!({}),
        "{format}"
    );
    let mut members = Vec::new();
    assert!(
        eventually(30, || {
            let q = dmg(&["system", "query"]);
            members = q["response"]["members"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            members.len() == 4 && members.iter().all(|m| m["state"] == "joined")
        }),
        "4 joined ranks expected: {members:?}"
    );
    let mut ranks: Vec<u64> = members
        .iter()
        .map(|m| m["rank"].as_u64().unwrap())
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3]);
    let mut domains: Vec<&str> = members
        .iter()
        .map(|m| m["fault_domain"].as_str().unwrap())
        .collect();
    domains.sort_unstable();
    assert_eq!(domains, ["/da1", "/da2", "/da3", "/da4"]);

    // Cleanup on all four: stop (confirmed), wipe (test dir only), release.
    std::thread::scope(|s| {
        for n in NODES {
            let c = &c;
            s.spawn(move || post(c, n, &format!("/v1/leases/{lease}/stop"), None));
        }
    });
    for n in NODES {
        let v = post(&c, n, &format!("/v1/leases/{lease}/wipe"), None);
        assert_eq!(v["already_done"], false, "{n}: {v}");
        assert!(
            !c.dir().join(n).join("test").join(lease).exists(),
            "{n}: test dir left"
        );
        let st = post_get_status(&c, n);
        assert!(
            st["lease"].is_null() && st["containers"] == serde_json::json!([]),
            "{n}: {st}"
        );
        let audit =
            std::fs::read_to_string(c.dir().join(n).join("jobs").join(lease).join("audit.jsonl"))
                .unwrap();
        let steps: Vec<String> = audit
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(steps, ["start", "stop", "wipe", "release"], "{n}");
    }
    let (out, _) = c.down();
    assert!(out.status.success(), "{}", stderr(&out));
}

fn post_get_status(c: &Cluster, node: &str) -> serde_json::Value {
    let (code, text) = c.http(&c.node_sock(node), "GET", "/v1/status", None);
    assert_eq!(code, 200, "{node}: {text}");
    serde_json::from_str(&text).unwrap()
}
