//! What a wipe may do, decided from the node's lease record alone.
//!
//! The record (`lease.json`, written by `start` before anything of the lease
//! exists) says how the lease's data must be wiped: its mode and, in
//! physical mode, exactly the devices it was given. The configuration as it
//! is *now* is only checked for agreement with the record: a renamed or
//! removed profile, a profile whose mode changed, a moved data directory or
//! an allowlist that no longer names exactly the recorded devices is a
//! refusal — never a fall-back to another way of wiping, which once removed
//! a test directory, said `ok`, released the lease and left the NVMe as the
//! last job wrote it (issue #13, item 3).
//!
//! No I/O here: the service passes in the record, the configuration and
//! which of the lease's data directories exist.

use crate::profile::{Mode, ServiceConfig};
use gpuq_blockdev::config::DeviceEntry;
use gpuq_protocol::node::{LeaseDevice, LeaseMode, NodeLease};
use std::path::{Path, PathBuf};

/// What the wipe is allowed to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// No record and nothing of the lease on this node: a repeat.
    Nothing,
    /// Remove the lease's test directory (directly inside `test_dir`).
    Test { dir: PathBuf },
    /// Discard exactly `devices` (the recorded ones, pinned to the
    /// namespace ID and size found at start), then remove `meta_dir`.
    Physical {
        devices: Vec<DeviceEntry>,
        meta_dir: PathBuf,
    },
}

/// Where the lease's data lives under the configuration as it is now.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `<test_dir>/<lease>`
    pub test_dir: PathBuf,
    /// `<jobs_dir>/<lease>/control_meta`
    pub meta_dir: PathBuf,
}

/// A refusal: nothing may be removed or discarded; the record stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why, for the audit line and the message.
    pub why: String,
    /// What the operator should do.
    pub todo: String,
}

impl Refusal {
    /// The one line the broker's hold shows.
    pub fn message(&self, node: &str, lease: &str) -> String {
        format!(
            "node {node} refuses to wipe lease {lease}: {}; nothing was removed or discarded and the node's lease record is kept — {}",
            self.why, self.todo
        )
    }
}

/// The wipe of `lease` given its record `rec` (`None`: no record), the
/// configuration `cfg`, the lease's data paths under that configuration,
/// and `left`: those of the lease's data directories (from either mode)
/// that exist.
pub fn plan(
    lease: &str,
    rec: Option<&NodeLease>,
    cfg: &ServiceConfig,
    paths: &Paths,
    left: &[PathBuf],
) -> Result<Plan, Refusal> {
    let source = cfg.source.display();
    let by_hand = |what: &str| Refusal {
        why: what.to_string(),
        todo: format!(
            "how its data must be wiped is unknown: wipe it by hand \
             (`gpuq-node wipe --lease {lease}` discards the allowlisted devices; \
             remove {} or {}), remove {jobs}/lease.json and {jobs}/active-lease \
             if present, then run `sudo gpuq recover`",
            paths.meta_dir.display(),
            paths.test_dir.display(),
            jobs = cfg.node.node.jobs_dir.display(),
        ),
    };
    let Some(rec) = rec else {
        if left.is_empty() {
            return Ok(Plan::Nothing);
        }
        return Err(by_hand(&format!(
            "there is no lease record for it, but {} is left",
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        )));
    };
    let mode = match rec.mode {
        Some(LeaseMode::Physical) => Mode::Physical,
        Some(LeaseMode::Test) => Mode::Test,
        Some(LeaseMode::Unknown) => {
            return Err(by_hand("its lease record names an unknown wipe mode"))
        }
        None => {
            return Err(by_hand(
                "its lease record has no wipe mode (written by an older helper, or only active-lease is left)",
            ))
        }
    };
    let restore = |why: String, what: String| Refusal {
        why,
        todo: format!(
            "restore {what} in {source}, restart gpuq-node, then run `sudo gpuq recover`"
        ),
    };
    let the_profile = || {
        format!(
            "profile '{}' with mode = \"{}\"",
            rec.profile,
            mode_str(mode)
        )
    };
    // A `[stor.NAME]` profile exports the physical devices: always physical.
    let profile_mode = cfg
        .profiles
        .get(&rec.profile)
        .map(|p| p.mode)
        .or_else(|| cfg.stor.get(&rec.profile).map(|_| Mode::Physical));
    let Some(profile_mode) = profile_mode else {
        return Err(restore(
            format!(
                "its record names profile '{}' ({} mode), which {source} no longer has",
                rec.profile,
                mode_str(mode)
            ),
            the_profile(),
        ));
    };
    if profile_mode != mode {
        return Err(restore(
            format!(
                "profile '{}' is now {} mode, but the lease started in {} mode",
                rec.profile,
                mode_str(profile_mode),
                mode_str(mode)
            ),
            the_profile(),
        ));
    }
    let dir = match mode {
        Mode::Physical => &paths.meta_dir,
        Mode::Test => &paths.test_dir,
    };
    if Path::new(&rec.metadata_dir) != dir {
        return Err(restore(
            format!(
                "its record puts its data in {}, but {source} now puts it in {}",
                rec.metadata_dir,
                dir.display()
            ),
            "the [node] jobs_dir and test_dir the lease started with".into(),
        ));
    }
    match mode {
        Mode::Test => Ok(Plan::Test { dir: dir.clone() }),
        Mode::Physical => {
            if rec.devices.is_empty() {
                return Err(by_hand("its physical-mode record names no device"));
            }
            let (missing, extra) = differences(&rec.devices, &cfg.node.devices);
            if !missing.is_empty() || !extra.is_empty() {
                let mut why = format!(
                    "the allowlist in {source} no longer names exactly its devices ({})",
                    rec.devices.iter().map(label).collect::<Vec<_>>().join(", ")
                );
                if !missing.is_empty() {
                    why.push_str(&format!("; not allowlisted now: {}", missing.join(", ")));
                }
                if !extra.is_empty() {
                    why.push_str(&format!(
                        "; allowlisted but not the lease's: {}",
                        extra.join(", ")
                    ));
                }
                return Err(restore(
                    why,
                    "the [[devices]] tables the lease started with".into(),
                ));
            }
            Ok(Plan::Physical {
                devices: rec.devices.iter().map(pinned).collect(),
                meta_dir: dir.clone(),
            })
        }
    }
}

fn mode_str(m: Mode) -> &'static str {
    match m {
        Mode::Physical => "physical",
        Mode::Test => "test",
    }
}

/// The recorded device as found at start, in allowlist form: the wipe's
/// identity and size checks then verify it is still that device.
fn pinned(d: &LeaseDevice) -> DeviceEntry {
    DeviceEntry {
        serial: d.serial.clone(),
        pci: d.pci.clone(),
        nsid: d.nsid,
        model: d.model.clone(),
        size_bytes: Some(d.size_bytes),
        loop_backing_file: d.loop_backing_file.as_ref().map(PathBuf::from),
    }
}

/// A recorded device for the messages.
pub fn label(d: &LeaseDevice) -> String {
    match (&d.serial, &d.pci, &d.loop_backing_file) {
        (Some(s), Some(p), _) => format!(
            "serial {s} at {p}{}, {} bytes",
            d.nsid.map(|n| format!(" nsid {n}")).unwrap_or_default(),
            d.size_bytes
        ),
        (_, _, Some(f)) => format!("loop device on {f}, {} bytes", d.size_bytes),
        _ => format!("{d:?}"),
    }
}

fn entry_label(e: &DeviceEntry) -> String {
    match (&e.serial, &e.pci, &e.loop_backing_file) {
        (Some(s), Some(p), _) => format!(
            "serial {s} at {p}{}",
            e.nsid.map(|n| format!(" nsid {n}")).unwrap_or_default()
        ),
        (_, _, Some(f)) => format!("loop device on {}", f.display()),
        _ => e.label(),
    }
}

/// Whether allowlist entry `e` names recorded device `d`: the same
/// identity (serial, PCI address, loop backing file), and whatever else the
/// entry pins (namespace ID, size, model) as found at start.
fn names(e: &DeviceEntry, d: &LeaseDevice) -> bool {
    e.serial == d.serial
        && e.pci == d.pci
        && e.loop_backing_file
            .as_ref()
            .map(|p| p.display().to_string())
            == d.loop_backing_file
        && e.nsid.is_none_or(|n| Some(n) == d.nsid)
        && e.size_bytes.is_none_or(|s| s == d.size_bytes)
        && e.model.as_ref().is_none_or(|m| Some(m) == d.model.as_ref())
}

/// Recorded devices no allowlist entry names, and allowlist entries that
/// name no recorded device (or one that another entry names too).
fn differences(recorded: &[LeaseDevice], allow: &[DeviceEntry]) -> (Vec<String>, Vec<String>) {
    let mut taken = vec![false; recorded.len()];
    let mut extra = Vec::new();
    for e in allow {
        match (0..recorded.len()).find(|&i| !taken[i] && names(e, &recorded[i])) {
            Some(i) => taken[i] = true,
            None => extra.push(entry_label(e)),
        }
    }
    let missing = recorded
        .iter()
        .zip(&taken)
        .filter(|(_, t)| !**t)
        .map(|(d, _)| label(d))
        .collect();
    (missing, extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(profiles: &str, devices: &str) -> ServiceConfig {
        let text = format!(
            "[node]\nname = \"da1\"\nsocket = \"/run/gpuq/node.sock\"\npodman_socket = \"/run/podman/podman.sock\"\n\
             jobs_dir = \"/j\"\ntest_dir = \"/t\"\n{devices}\n{profiles}"
        );
        ServiceConfig::parse(Path::new("/etc/gpuqueue-daos/node.toml"), &text).unwrap()
    }

    fn profile(name: &str, mode: &str) -> String {
        format!(
            "[profiles.{name}]\nimage = \"sha256:{}\"\ndaos_version = \"2.6.4\"\nmode = \"{mode}\"\nport = 10001\n",
            "ab".repeat(32)
        )
    }

    const TWO: &str = "[[devices]]\nserial = \"S1\"\npci = \"0000:5e:00.0\"\n[[devices]]\nserial = \"S2\"\npci = \"0000:5f:00.0\"\nnsid = 1\n";

    fn dev(serial: &str, pci: &str) -> LeaseDevice {
        LeaseDevice {
            serial: Some(serial.into()),
            pci: Some(pci.into()),
            nsid: Some(1),
            model: Some("M".into()),
            size_bytes: 4096,
            loop_backing_file: None,
        }
    }

    fn rec(profile: &str, mode: Option<LeaseMode>, devices: Vec<LeaseDevice>) -> NodeLease {
        NodeLease {
            lease: "L1".into(),
            profile: profile.into(),
            phase: "stopped".into(),
            metadata_dir: match mode {
                Some(LeaseMode::Physical) => "/j/L1/control_meta".into(),
                _ => "/t/L1".into(),
            },
            container: None,
            export: None,
            nfs: None,
            since: 1,
            mode,
            devices,
        }
    }

    fn paths() -> Paths {
        Paths {
            test_dir: "/t/L1".into(),
            meta_dir: "/j/L1/control_meta".into(),
        }
    }

    fn both() -> Vec<LeaseDevice> {
        vec![dev("S1", "0000:5e:00.0"), dev("S2", "0000:5f:00.0")]
    }

    #[test]
    fn a_physical_lease_discards_exactly_its_recorded_devices_pinned() {
        let c = cfg(&profile("inst1", "physical"), TWO);
        let r = rec("inst1", Some(LeaseMode::Physical), both());
        let Plan::Physical { devices, meta_dir } = plan("L1", Some(&r), &c, &paths(), &[]).unwrap()
        else {
            panic!("not a physical plan")
        };
        assert_eq!(meta_dir, PathBuf::from("/j/L1/control_meta"));
        assert_eq!(devices.len(), 2);
        assert!(devices.iter().all(|d| d.nsid == Some(1)
            && d.size_bytes == Some(4096)
            && d.model.as_deref() == Some("M")));
    }

    #[test]
    fn a_test_lease_removes_its_recorded_test_dir() {
        let c = cfg(&profile("t", "test"), "");
        let r = rec("t", Some(LeaseMode::Test), vec![]);
        assert_eq!(
            plan("L1", Some(&r), &c, &paths(), &[]).unwrap(),
            Plan::Test {
                dir: "/t/L1".into()
            }
        );
    }

    #[test]
    fn no_record_and_nothing_left_is_a_repeat_but_anything_left_refuses() {
        let c = cfg(&profile("t", "test"), "");
        assert_eq!(plan("L1", None, &c, &paths(), &[]).unwrap(), Plan::Nothing);
        let e = plan("L1", None, &c, &paths(), &["/t/L1".into()]).unwrap_err();
        assert!(
            e.why.contains("no lease record") && e.why.contains("/t/L1"),
            "{e:?}"
        );
        let m = e.message("da1", "L1");
        assert!(
            m.starts_with("node da1 refuses to wipe lease L1: ")
                && m.contains("nothing was removed or discarded")
                && m.contains("gpuq recover"),
            "{m}"
        );
    }

    #[test]
    fn a_record_without_a_known_mode_refuses() {
        let c = cfg(&profile("t", "test"), "");
        for mode in [None, Some(LeaseMode::Unknown)] {
            let e = plan("L1", Some(&rec("t", mode, vec![])), &c, &paths(), &[]).unwrap_err();
            assert!(e.why.contains("mode"), "{e:?}");
        }
    }

    #[test]
    fn a_renamed_or_removed_profile_refuses_naming_it() {
        let c = cfg(&profile("inst1-new", "physical"), TWO);
        for mode in [LeaseMode::Physical, LeaseMode::Test] {
            let r = rec("inst1", Some(mode), both());
            let e = plan("L1", Some(&r), &c, &paths(), &[]).unwrap_err();
            assert!(
                e.why.contains("profile 'inst1'") && e.todo.contains("restore profile 'inst1'"),
                "{e:?}"
            );
        }
    }

    #[test]
    fn a_profile_whose_mode_changed_refuses() {
        let c = cfg(&profile("inst1", "test"), TWO);
        let r = rec("inst1", Some(LeaseMode::Physical), both());
        let e = plan("L1", Some(&r), &c, &paths(), &[]).unwrap_err();
        assert!(e.why.contains("now test mode"), "{e:?}");
        let c = cfg(&profile("inst1", "physical"), TWO);
        let r = rec("inst1", Some(LeaseMode::Test), vec![]);
        assert!(plan("L1", Some(&r), &c, &paths(), &[]).is_err());
    }

    #[test]
    fn a_moved_data_directory_refuses() {
        let c = cfg(&profile("t", "test"), "");
        let mut r = rec("t", Some(LeaseMode::Test), vec![]);
        r.metadata_dir = "/old-test-dir/L1".into();
        let e = plan("L1", Some(&r), &c, &paths(), &[]).unwrap_err();
        assert!(e.why.contains("/old-test-dir/L1"), "{e:?}");
    }

    #[test]
    fn an_allowlist_that_is_not_exactly_the_recorded_set_refuses() {
        let p = profile("inst1", "physical");
        let one = "[[devices]]\nserial = \"S1\"\npci = \"0000:5e:00.0\"\n";
        let other = "[[devices]]\nserial = \"S3\"\npci = \"0000:60:00.0\"\n";
        let swapped = format!("{one}{other}");
        let resized = "[[devices]]\nserial = \"S1\"\npci = \"0000:5e:00.0\"\nsize_bytes = 8192\n[[devices]]\nserial = \"S2\"\npci = \"0000:5f:00.0\"\n";
        for (devices, want) in [
            (one, "not allowlisted now: serial S2"),
            (
                swapped.as_str(),
                "allowlisted but not the lease's: serial S3",
            ),
            (resized, "allowlisted but not the lease's: serial S1"),
        ] {
            let c = cfg(&p, devices);
            let r = rec("inst1", Some(LeaseMode::Physical), both());
            let e = plan("L1", Some(&r), &c, &paths(), &[]).unwrap_err();
            assert!(e.why.contains(want), "{want}: {e:?}");
        }
        // The allowlist order does not matter.
        let reordered = "[[devices]]\nserial = \"S2\"\npci = \"0000:5f:00.0\"\n[[devices]]\nserial = \"S1\"\npci = \"0000:5e:00.0\"\n";
        let c = cfg(&p, reordered);
        let r = rec("inst1", Some(LeaseMode::Physical), both());
        assert!(plan("L1", Some(&r), &c, &paths(), &[]).is_ok());
    }

    #[test]
    fn a_physical_record_with_no_device_refuses() {
        let c = cfg(&profile("inst1", "physical"), "");
        let r = rec("inst1", Some(LeaseMode::Physical), vec![]);
        let e = plan("L1", Some(&r), &c, &paths(), &[]).unwrap_err();
        assert!(e.why.contains("names no device"), "{e:?}");
    }
}
