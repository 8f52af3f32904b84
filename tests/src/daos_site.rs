//! A DAOS site on the test cluster for the DAOS job tests: the cluster
//! with the simulator image on all five hosts, and a broker in cxl2's
//! network namespace whose `[daos]` section names the four nodes.

use crate::cluster::*;
use crate::*;
use std::path::{Path, PathBuf};

pub fn alice() -> User {
    User::new(61001, 61001, &[61001])
}
pub fn bob() -> User {
    User::new(61002, 61002, &[])
}

/// A cluster with the simulator image on every host, and a broker on cxl2
/// whose `[daos]` section names the four nodes. Field order: the broker
/// goes first (it ends its ssh masters), then the cluster.
#[derive(Debug)]
pub struct Site {
    pub b: TestBroker,
    pub c: Cluster,
    pub image: String,
}

impl Drop for Site {
    fn drop(&mut self) {
        // A clean stop ends the ssh masters; a broker killed earlier left
        // them to the next one, which ended them at its start.
        if self.b.pid().is_some() {
            let _ = self.b.terminate();
        }
        for (pid, _) in pids_mentioning(&self.forward_dir().display().to_string()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Site {
    pub fn up(name: &str) -> Site {
        Self::up_with(name, None)
    }

    /// With `broker_bin` (e.g. the crash-points build) instead of the
    /// workspace's `gpuq-broker`.
    pub fn up_with(name: &str, broker_bin: Option<PathBuf>) -> Site {
        Self::up_full(name, broker_bin, |_| String::new())
    }

    /// `profile_extra(broker_dir)`: more lines for `[daos.profiles.test]`.
    pub fn up_full(
        name: &str,
        broker_bin: Option<PathBuf>,
        profile_extra: impl Fn(&Path) -> String,
    ) -> Site {
        Self::up_keys(name, broker_bin, "", profile_extra)
    }

    /// `daos_keys`: more lines for `[daos]` itself (e.g. short step
    /// deadlines: `stop_timeout_secs = 8`).
    pub fn up_with_daos_keys(name: &str, broker_bin: Option<PathBuf>, daos_keys: &str) -> Site {
        Self::up_keys(name, broker_bin, daos_keys, |_| String::new())
    }

    fn up_keys(
        name: &str,
        broker_bin: Option<PathBuf>,
        daos_keys: &str,
        profile_extra: impl Fn(&Path) -> String,
    ) -> Site {
        let (archive, image) = sim_image();
        let c = Cluster::up_with(
            name,
            &[
                ("GPUQ_CLUSTER_IMAGE", &archive),
                ("GPUQ_CLUSTER_PROFILE_IMAGE", &image),
            ],
        );
        let mut b = TestBroker::prepare("");
        b.tables = daos_tables(&c, b.dir.path(), &image).replacen(
            "[daos]\n",
            &format!("[daos]\n{daos_keys}\n"),
            1,
        );
        b.tables.push_str(&profile_extra(b.dir.path()));
        b.netns = Some(c.id.namespace("cxl2"));
        b.broker_bin = broker_bin;
        let b = TestBroker::launch(b);
        Site { b, c, image }
    }

    pub fn forward_dir(&self) -> PathBuf {
        self.c.dir().join("cxl2/run/links")
    }

    pub fn state(&self) -> PathBuf {
        self.b.path("state")
    }

    pub fn active_lease(&self) -> Option<serde_json::Value> {
        let a = std::fs::read(self.state().join("active.json")).ok()?;
        let a: serde_json::Value = serde_json::from_slice(&a).unwrap();
        let l = std::fs::read(self.state().join(format!("{}.json", a["lease"].as_str()?))).ok()?;
        Some(serde_json::from_slice(&l).unwrap())
    }

    pub fn lease_record(&self, lease: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.state().join(format!("{lease}.json"))).unwrap())
            .unwrap()
    }

    /// Every container on `host`'s own Podman (names and state).
    pub fn containers(&self, host: &str) -> Vec<String> {
        self.c
            .containers(host)
            .into_iter()
            .map(|(name, state)| format!("{name} {state}"))
            .collect()
    }

    pub fn node_lease(&self, node: &str) -> serde_json::Value {
        let (code, body) = self
            .c
            .http(&self.c.node_sock(node), "GET", "/v1/status", None);
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["lease"].clone()
    }

    /// No lease, no container on any host, no lease on any node.
    pub fn assert_clean(&self) {
        // A job's end is recorded before its lease's cleanup finishes.
        eventually(60, || self.active_lease().is_none());
        assert!(
            self.active_lease().is_none(),
            "lease still active: {:?}",
            self.active_lease()
        );
        assert!(!self.state().join("blocked.json").exists());
        for h in HOSTS {
            assert_eq!(
                self.containers(h),
                Vec::<String>::new(),
                "containers left on {h}"
            );
        }
        for n in NODES {
            assert!(self.node_lease(n).is_null(), "{n} still has a lease");
        }
    }

    /// Wait up to `secs` for the hold, then its `blocked.json` (`job`'s
    /// log in the failure message).
    pub fn wait_held(&self, job: u64, secs: u64) -> serde_json::Value {
        let path = self.state().join("blocked.json");
        assert!(
            eventually(secs, || path.exists()),
            "no hold: {}",
            self.log(job)
        );
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }

    pub fn log(&self, id: u64) -> String {
        stdout(&self.b.gpuq(ROOT, &["log", &id.to_string()]))
    }

    /// Wait for `id` to end; assert it ended in `state`, showing its log if not.
    pub fn expect_end(&self, id: u64, state: &str, secs: u64) -> serde_json::Value {
        let mut last = String::new();
        let ended = eventually(secs, || {
            last = self.b.state(id);
            !matches!(last.as_str(), "queued" | "running")
        });
        assert!(
            ended,
            "job {id} still {last} after {secs}s:\n{}",
            self.log(id)
        );
        assert_eq!(last, state, "job {id}:\n{}", self.log(id));
        self.b.job(id)
    }

    /// Submit, as `user` in `dir`, a job on profile `test` that waits for
    /// `dir/go` and then runs the shell line `then` (empty: nothing).
    pub fn submit_inst_until_go(&self, user: Option<&User>, dir: &Path, then: &str) -> u64 {
        let script = format!("while [ ! -e go ]; do sleep 0.2; done; {then}");
        self.b
            .submit(user, dir, &["--inst", "test", "--", "sh", "-c", &script])
    }

    pub fn set_fault(&self, node: &str, faults: &str) {
        std::fs::write(
            self.c.dir().join(node).join("faults/daos-sim-faults"),
            faults,
        )
        .unwrap();
    }
}

/// A process of the test cluster stopped with SIGSTOP (a hung node helper
/// or Podman service) for as long as this lives: SIGCONT on drop, also when
/// the test fails. By the PID the cluster's manifest recorded.
#[derive(Debug)]
pub struct Frozen {
    _stopped: gpuq_podman_harness::Sigstopped,
}

impl Frozen {
    /// SIGSTOP `host`'s `role` (`node`: the helper, `podman`: the Podman
    /// service), by the PID the harness recorded for it; returns once it is
    /// stopped.
    pub fn freeze(c: &Cluster, host: &str, role: &str) -> Frozen {
        let pid = c
            .recorded_pid(host, role)
            .unwrap_or_else(|| panic!("no PID recorded for {host}'s {role}"));
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let want = if role == "node" {
            "gpuq-node"
        } else {
            "podman"
        };
        assert_eq!(comm.trim(), want, "PID {pid} recorded for {host}'s {role}");
        Frozen {
            _stopped: gpuq_podman_harness::Sigstopped::new(pid, &format!("{host}'s {role}")),
        }
    }

    /// SIGCONT now (the drop does nothing more).
    pub fn thaw(self) {}
}

pub fn daos_tables(c: &Cluster, broker_dir: &Path, image: &str) -> String {
    let d = c.dir();
    let mut t = format!(
        "[daos]\n\
         run_dir = \"{}/daos\"\n\
         podman_socket = \"{}\"\n\
         forward_dir = \"{}\"\n\
         identity_file = \"{}\"\n\
         known_hosts_file = \"{}\"\n\
         ssh_config_file = \"{}\"\n\
         join_timeout_secs = 15\n\
         link_timeout_secs = 10\n",
        broker_dir.display(),
        c.podman_sock("cxl2").display(),
        d.join("cxl2/run/links").display(),
        d.join("cxl2/ssh/id_ed25519").display(),
        d.join("ssh/known_hosts").display(),
        d.join("ssh/ssh_config").display(),
    );
    for n in NODES {
        t.push_str(&format!(
            "\n[[daos.nodes]]\nname = \"{n}\"\nhost = \"{n}\"\naddress = \"{}\"\nnode_socket = \"{}\"\npodman_socket = \"{}\"\n",
            addr(n),
            c.node_sock(n).display(),
            c.podman_sock(n).display()
        ));
    }
    t.push_str(&format!(
        "\n[daos.profiles.test]\nimage = \"{image}\"\nreplicas = [\"{}\"]\nenv = {{ GPUQ_TEST_PROFILE_VAR = \"from-profile\" }}\n",
        addr("da1")
    ));
    t
}

/// The simulator's `dmg` on the GPU host, as a job would run a DAOS tool.
pub fn dmg_on_host() -> String {
    bin("daos-sim").display().to_string()
}
