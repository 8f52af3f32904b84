//! The broker's OpenMetrics endpoint (`[metrics] listen`) and `gpuq stats`,
//! on real brokers: a GPU-only one on this host's loopback, and a DAOS one
//! in the test cluster's cxl2 namespace with its four real node helpers
//! (their `GET /v1/metrics` aggregated per node), scraped during and after
//! real DAOS jobs.

use gpuq_system_tests::cluster::*;
use gpuq_system_tests::daos_site::*;
use gpuq_system_tests::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A port nobody listens on now (the kernel's choice, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over plain TCP; the whole answer (head and body).
fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the answer");
    out
}

/// The value of one series (`name{labels}` exactly as encoded), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("a number"))
}

fn must(text: &str, series: &str) -> f64 {
    value(text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// The socket inodes in LISTEN state on this namespace's TCP tables.
fn listening_inodes() -> Vec<String> {
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            // st 0A = LISTEN; the inode is the tenth field.
            if f.len() > 9 && f[3] == "0A" {
                out.push(f[9].to_string());
            }
        }
    }
    out
}

/// TCP sockets that `pid` listens on.
fn listens(pid: u32) -> usize {
    let inodes = listening_inodes();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_string_lossy().to_string();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .filter(|i| inodes.contains(i))
        .count()
}

#[test]
fn without_metrics_listen_the_broker_opens_no_tcp_port() {
    require_env!();
    let b = TestBroker::start();
    assert_eq!(listens(b.pid().unwrap()), 0);
    // The table alone does not turn it on either.
    let mut b2 = TestBroker::prepare("");
    b2.tables = "[metrics]\n".into();
    let b2 = TestBroker::launch(b2);
    assert_eq!(listens(b2.pid().unwrap()), 0);
}

#[test]
fn a_metrics_address_that_cannot_be_served_refuses_the_start_and_makes_nothing() {
    require_env!();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut b = TestBroker::prepare("");
    b.tables = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let out = b.start_refused();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("[metrics] listen") && err.contains(&port.to_string()),
        "{err}"
    );
    // Refused before anything was made: no state, logs or socket.
    for p in ["state", "logs", "broker.sock"] {
        assert!(!b.path(p).exists(), "{p} was made");
    }
    // And not a fallback to another address: an address of no interface
    // here is refused the same way.
    b.tables = "[metrics]\nlisten = \"192.0.2.1:9464\"\n".into();
    let err = stderr(&b.start_refused());
    assert!(err.contains("192.0.2.1:9464"), "{err}");
    assert!(!b.path("state").exists());
    drop(taken);
}

#[test]
fn gpu_jobs_waits_and_refusals_are_counted_and_nothing_names_a_user() {
    require_env!();
    let port = free_port();
    let mut b = TestBroker::prepare("");
    b.tables = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let b = TestBroker::launch(b);
    let a = alice();
    let w = b.workdir(Some(&a), "alice");
    // The positive control of the test above: this one listens, once.
    assert_eq!(listens(b.pid().unwrap()), 1);

    let before = http_get(port, "/metrics");
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    assert!(
        before.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{before}"
    );
    assert!(before.trim_end().ends_with("# EOF"), "{before}");
    assert_eq!(must(&before, "gpuq_queue_jobs{state=\"queued\"}"), 0.0);
    assert_eq!(must(&before, "gpuq_lease_held"), 0.0);
    // No DAOS on this broker: no node families at all.
    assert!(!before.contains("gpuq_node_"), "{before}");

    let marker = "metrics-marker-6d1f";
    let id = b.submit(Some(&a), &w, &["--name", marker, "--", "echo", marker]);
    b.wait_state(id, "completed", 30);
    // Alice may not lock the queue: a refusal, by code.
    let r = b.gpuq(Some(&a), &["lock", "--reason", "x"]);
    assert!(!r.status.success());

    let text = http_get(port, "/metrics");
    assert_eq!(
        must(&text, "gpuq_jobs_ended_total{state=\"completed\"}"),
        1.0
    );
    assert_eq!(
        must(&text, "gpuq_job_wait_seconds_count{kind=\"gpu\"}"),
        1.0
    );
    assert_eq!(must(&text, "gpuq_refusals_total{code=\"forbidden\"}"), 1.0);
    assert_eq!(must(&text, "gpuq_queue_jobs{state=\"running\"}"), 0.0);
    // Counts and durations only: not the job's name or command, not the user.
    let user = b.job(id)["user"].as_str().unwrap().to_string();
    assert!(!text.contains(marker), "{text}");
    assert!(!text.contains(&user), "{user} in:\n{text}");

    // Only GET /metrics.
    let other = http_get(port, "/v1/jobs");
    assert!(other.starts_with("HTTP/1.1 404"), "{other}");
    assert!(!other.contains(marker), "{other}");

    // gpuq stats: root sees everyone's, alice her own, bob nobody's.
    let st = b.gpuq(ROOT, &["stats", "--json"]);
    assert!(st.status.success(), "{}", stderr(&st));
    let st: serde_json::Value = serde_json::from_str(&stdout(&st)).unwrap();
    assert_eq!(st["all_users"], true, "{st}");
    assert_eq!(st["total"]["jobs"], 1, "{st}");
    assert_eq!(st["users"][0]["user"], user.as_str(), "{st}");
    assert_eq!(st["users"][0]["by_state"]["completed"], 1, "{st}");
    assert_eq!(st["users"][0]["daos_jobs"], 0, "{st}");
    assert!(st["users"][0]["mean_wait_secs"].is_number(), "{st}");
    let mine = b.gpuq(Some(&a), &["stats"]);
    assert!(mine.status.success(), "{}", stderr(&mine));
    let mine = stdout(&mine);
    assert!(
        mine.contains("yours only") && mine.contains(&user),
        "{mine}"
    );
    let theirs = stdout(&b.gpuq(Some(&bob()), &["stats", "--json"]));
    let theirs: serde_json::Value = serde_json::from_str(&theirs).unwrap();
    assert_eq!(theirs["all_users"], false);
    assert_eq!(theirs["users"].as_array().unwrap().len(), 0, "{theirs}");
    assert_eq!(theirs["total"]["jobs"], 0, "{theirs}");
    // A period that ended before the job: nothing in it.
    let old = stdout(&b.gpuq(
        ROOT,
        &[
            "stats",
            "--json",
            "--since",
            "2020-01-01",
            "--until",
            "2020-01-31",
        ],
    ));
    let old: serde_json::Value = serde_json::from_str(&old).unwrap();
    assert_eq!(old["total"]["jobs"], 0, "{old}");
    // Bad input: one line, nothing asked of the broker.
    let queries = b.gpuq(ROOT, &["stats", "--since", "2026-02-30"]);
    assert_eq!(queries.status.code(), Some(2));
    assert!(
        stderr(&queries).contains("YYYY-MM-DD"),
        "{}",
        stderr(&queries)
    );
    let empty = b.gpuq(
        ROOT,
        &["stats", "--since", "2026-12-02", "--until", "2026-12-01"],
    );
    assert_eq!(empty.status.code(), Some(1));
    let e = stderr(&empty);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("the period is empty"), "{e}");
}

#[test]
fn clients_that_send_nothing_are_dropped_and_never_hold_the_queue() {
    require_env!();
    let port = free_port();
    let mut b = TestBroker::prepare("");
    b.tables = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let b = TestBroker::launch(b);
    let w = b.workdir(None, "root");
    // More idle connections than the endpoint serves at once.
    let idle: Vec<TcpStream> = (0..12)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // The queue does not notice.
    let t = Instant::now();
    let id = b.submit(ROOT, &w, &["--", "true"]);
    b.wait_state(id, "completed", 30);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // Each idle connection is closed by the broker at the head deadline
    // (5 s), not kept: a read sees the end, well before our own timeout.
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 512];
        let t = Instant::now();
        let n = s.read(&mut buf).unwrap_or(0);
        assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
        let head = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(n == 0 || head.starts_with("HTTP/1.1 408"), "{head}");
    }
    // And a scrape works again.
    let text = http_get(port, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(
        must(&text, "gpuq_jobs_ended_total{state=\"completed\"}"),
        1.0
    );
}

/// `curl` inside cxl2's namespace, where the DAOS broker listens.
fn scrape_in(s: &Site, port: u16) -> String {
    let out = s.c.in_host(
        "cxl2",
        &[
            "curl",
            "-sS",
            "--max-time",
            "20",
            &format!("http://127.0.0.1:{port}/metrics"),
        ],
    );
    assert!(out.status.success(), "curl: {}", stderr(&out));
    stdout(&out)
}

#[test]
fn a_daos_jobs_steps_move_the_histograms_and_the_nodes_report_their_own() {
    require_cluster_env!();
    require_env!();
    let port = 9464;
    let s = Site::up_full("metrics", None, |_| {
        format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n")
    });
    let a = alice();
    let w = s.b.workdir(Some(&a), "alice");
    let go = w.join("go");
    let id = s.submit_inst_until_go(Some(&a), &w, "");
    s.b.wait_state(id, "running", 30);
    assert!(
        eventually(120, || s.log(id).contains("starting the job")),
        "{}",
        s.log(id)
    );

    // During the job: every preparation step once, no cleanup step yet,
    // and each node's start counted by the node itself.
    let during = scrape_in(&s, port);
    for step in [
        "links",
        "preflight",
        "start_servers",
        "certificates",
        "files",
        "format",
        "join",
        "agent",
    ] {
        let series = format!("gpuq_daos_step_seconds_count{{phase=\"prepare\",step=\"{step}\"}}");
        assert_eq!(must(&during, &series), 1.0, "{series}");
    }
    assert_eq!(
        must(&during, "gpuq_daos_phase_seconds_count{phase=\"prepare\"}"),
        1.0
    );
    assert_eq!(must(&during, "gpuq_queue_jobs{state=\"running\"}"), 1.0);
    assert_eq!(
        must(&during, "gpuq_job_wait_seconds_count{kind=\"daos\"}"),
        1.0
    );
    assert!(!during.contains("phase=\"cleanup\""), "{during}");
    for n in NODES {
        assert_eq!(must(&during, &format!("gpuq_node_up{{node=\"{n}\"}}")), 1.0);
        for step in ["preflight", "start"] {
            let series =
                format!("gpuq_node_steps_total{{node=\"{n}\",step=\"{step}\",outcome=\"ok\"}}");
            // The lifecycle's preflight, and start's own re-check, are
            // both preflights on the node: at least one.
            assert!(must(&during, &series) >= 1.0, "{series}");
        }
        assert!(
            !during.contains(&format!("node=\"{n}\",step=\"wipe\"")),
            "{during}"
        );
    }

    // The job ends; its cleanup runs to the release.
    std::fs::write(&go, "").unwrap();
    s.b.wait_state(id, "completed", 30);
    let mut after = String::new();
    assert!(
        eventually(120, || {
            after = scrape_in(&s, port);
            value(&after, "gpuq_daos_phase_seconds_count{phase=\"cleanup\"}") == Some(1.0)
        }),
        "{after}\n{}",
        s.log(id)
    );
    for step in [
        "kill_job",
        "remove_clients",
        "stop_agent",
        "system_stop",
        "stop_servers",
        "wipe",
    ] {
        let series = format!("gpuq_daos_step_seconds_count{{phase=\"cleanup\",step=\"{step}\"}}");
        assert_eq!(must(&after, &series), 1.0, "{series}");
    }
    assert_eq!(must(&after, "gpuq_daos_wipes_total{outcome=\"ok\"}"), 1.0);
    assert!(!after.contains("gpuq_daos_holds_total{"), "{after}");
    assert_eq!(must(&after, "gpuq_lease_held"), 0.0);
    for n in NODES {
        for step in ["stop", "wipe"] {
            let series =
                format!("gpuq_node_steps_total{{node=\"{n}\",step=\"{step}\",outcome=\"ok\"}}");
            assert_eq!(must(&after, &series), 1.0, "{series}");
            let series = format!("gpuq_node_step_seconds_count{{node=\"{n}\",step=\"{step}\"}}");
            assert_eq!(must(&after, &series), 1.0, "{series}");
        }
    }

    // A second job (root's) takes da3's helper away before its cleanup:
    // held at stop_servers on da3; the scrape says so, and da3 is down.
    let rw = s.b.workdir(None, "root");
    let sock = s.c.node_sock("da3");
    let off = sock.with_extension("off");
    let held = s.b.submit(
        ROOT,
        &rw,
        &[
            "--inst",
            "test",
            "--",
            "mv",
            &sock.display().to_string(),
            &off.display().to_string(),
        ],
    );
    s.b.wait_state(held, "completed", 120);
    let blocked = s.wait_held(held, 60);
    assert_eq!(blocked["step"], "stop_servers", "{blocked}");
    let text = scrape_in(&s, port);
    assert_eq!(must(&text, "gpuq_lease_held"), 1.0);
    assert_eq!(
        must(&text, "gpuq_daos_holds_total{step=\"stop_servers\"}"),
        1.0
    );
    assert_eq!(must(&text, "gpuq_node_up{node=\"da3\"}"), 0.0);
    assert_eq!(must(&text, "gpuq_node_up{node=\"da1\"}"), 1.0);
    assert!(!text.contains("node=\"da3\",step"), "{text}");
    // Put it back; recover finishes the cleanup: two wipes now, not held.
    std::fs::rename(&off, &sock).unwrap();
    let r = s.b.gpuq(ROOT, &["recover"]);
    assert!(r.status.success(), "{}\n{}", stderr(&r), s.log(held));
    let text = scrape_in(&s, port);
    assert_eq!(must(&text, "gpuq_lease_held"), 0.0);
    assert_eq!(must(&text, "gpuq_daos_wipes_total{outcome=\"ok\"}"), 2.0);
    assert_eq!(must(&text, "gpuq_node_up{node=\"da3\"}"), 1.0);

    // gpuq stats: alice's job has both times, root's (held, recovered by
    // the operator) only its preparation; the medians are the recorded
    // phase times, which the histogram's sum also holds.
    let st = stdout(&s.b.gpuq(ROOT, &["stats", "--json"]));
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    let rows = st["users"].as_array().unwrap();
    let alice_row = rows
        .iter()
        .find(|r| r["uid"] == a.uid)
        .unwrap_or_else(|| panic!("{st}"));
    assert_eq!(alice_row["daos_jobs"], 1, "{st}");
    let cleanup = alice_row["cleanup_median_secs"].as_f64().unwrap();
    let phase_sum = must(&after, "gpuq_daos_phase_seconds_sum{phase=\"cleanup\"}");
    assert!(
        (cleanup - phase_sum).abs() < 0.01,
        "{cleanup} vs {phase_sum}"
    );
    assert!(
        alice_row["prepare_median_secs"].as_f64().unwrap() > 0.0,
        "{st}"
    );
    let root_row = rows
        .iter()
        .find(|r| r["uid"] == 0)
        .unwrap_or_else(|| panic!("{st}"));
    assert_eq!(root_row["daos_jobs"], 1, "{st}");
    assert!(root_row["prepare_median_secs"].is_number(), "{st}");
    assert!(root_row["cleanup_median_secs"].is_null(), "{st}");
    assert_eq!(st["total"]["daos_jobs"], 2, "{st}");
    s.assert_clean();
}
