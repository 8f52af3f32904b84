//! `GET /v1/leases/{lease}/evidence?profile=NAME`: what is left on this
//! node of a lease that was released, as `gpuq e2e` checks it (issue #17,
//! item 3). Read-only: it reads the lease's audit records and looks at
//! what should be gone.
//!
//! Checks, each with its evidence: the node holds no lease record for it;
//! no container of it is left; its `audit.jsonl` has the wipe's `ok` line;
//! physical mode: every device the allowlist names now has a wipe record
//! for the lease (`wipe-<serial>.json`: discarded, and the probe after the
//! discard found no signature); test mode: the lease's test directory is
//! gone; the metadata directory is gone; the server's own output was kept
//! (`server.log`).

use crate::claim::read_nofollow;
use crate::profile::Mode;
use crate::service::{NodeError, NodeService};
use gpuq_protocol::node::{valid_lease, EvidenceCheck, LeaseEvidence};
use std::path::Path;

/// The evidence of `lease` (of profile `profile`, which says its mode).
pub async fn evidence<P: gpuq_podman::Podman>(
    svc: &NodeService<P>,
    lease: &str,
    profile: &str,
) -> Result<LeaseEvidence, NodeError> {
    if !valid_lease(lease) {
        return Err(NodeError::BadRequest(format!(
            "lease name '{lease}' is not valid: 1-64 letters, digits, - and _"
        )));
    }
    let cfg = svc.config();
    let mode = cfg
        .profiles
        .get(profile)
        .map(|p| p.mode)
        .ok_or_else(|| NodeError::NoProfile(profile.to_string()))?;
    let dir = svc.lease_dir(lease);
    let mut checks = Vec::new();
    let mut check = |name: &str, ok: bool, detail: String| {
        checks.push(EvidenceCheck {
            check: name.to_string(),
            ok,
            detail,
        })
    };

    match svc.lease_record()? {
        Some(r) if r.lease == lease => check(
            "node_lease_released",
            false,
            format!("the node still holds it (phase {})", r.phase),
        ),
        _ => check(
            "node_lease_released",
            true,
            "no node lease record names it".into(),
        ),
    }
    let left = svc.our_containers(Some(lease)).await?;
    check(
        "no_containers",
        left.is_empty(),
        if left.is_empty() {
            "none of its containers is left".into()
        } else {
            format!(
                "left: {}",
                left.iter()
                    .map(|c| format!("{} ({})", c.name, c.state))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    );
    let audit_path = dir.join("audit.jsonl");
    let lines: Vec<serde_json::Value> = read_nofollow(&audit_path)
        .map(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default();
    let wipe_ok = lines
        .iter()
        .rev()
        .find(|v| v["step"] == "wipe" && v["result"] == "ok");
    check(
        "wipe_audited",
        wipe_ok.is_some(),
        match wipe_ok {
            Some(v) => format!(
                "{} at {}",
                v["detail"].as_str().unwrap_or_default(),
                v["time"]
                    .as_i64()
                    .map(gpuq_protocol::time::format_utc)
                    .unwrap_or_else(|| "an unknown time".into())
            ),
            None => format!("no `wipe ok` line in {}", audit_path.display()),
        },
    );
    match mode {
        Mode::Physical => {
            let records = wipe_records(&dir);
            if cfg.node.devices.is_empty() {
                check(
                    "devices_discarded",
                    false,
                    "the profile is physical mode but no device is allowlisted".into(),
                );
            }
            for entry in &cfg.node.devices {
                let label = entry.label();
                match records.iter().find(|r| same_device(entry, &r["entry"])) {
                    None => check(
                        "device_discarded",
                        false,
                        format!("{label}: no wipe record of this lease in {}", dir.display()),
                    ),
                    Some(r) => {
                        let wiped = r["result"] == "wiped" && r["dry_run"] == false;
                        let clean = r["signatures_after"]
                            .as_array()
                            .is_some_and(|a| a.is_empty());
                        check(
                            "device_discarded",
                            wiped && clean,
                            format!(
                                "{label}: {} {} bytes discarded, {}",
                                r["result"].as_str().unwrap_or("?"),
                                r["bytes_discarded"],
                                if clean {
                                    "no signature after the discard".to_string()
                                } else {
                                    format!("after the discard: {}", r["signatures_after"])
                                }
                            ),
                        );
                    }
                }
            }
        }
        Mode::Test => {
            let test_dir = svc.data_dir(lease, Mode::Test);
            let gone = !exists(&test_dir);
            check(
                "test_dir_removed",
                gone,
                format!(
                    "test mode: {} {}",
                    test_dir.display(),
                    if gone { "is gone" } else { "is still there" }
                ),
            );
        }
    }
    let meta = svc.data_dir(lease, Mode::Physical);
    let gone = !exists(&meta);
    check(
        "metadata_removed",
        gone,
        format!(
            "{} {}",
            meta.display(),
            if gone { "is gone" } else { "is still there" }
        ),
    );
    let log = dir.join("server.log");
    let kept = std::fs::symlink_metadata(&log)
        .map(|m| m.is_file() && m.len() > 0)
        .unwrap_or(false);
    check(
        "server_output_kept",
        kept,
        format!(
            "{} {}",
            log.display(),
            if kept { "kept" } else { "is missing or empty" }
        ),
    );
    Ok(LeaseEvidence {
        node: svc.node_name().to_string(),
        lease: lease.to_string(),
        mode: match mode {
            Mode::Physical => "physical",
            Mode::Test => "test",
        }
        .to_string(),
        checks,
    })
}

/// Whether a wipe record's entry (the lease's recorded device, pinned
/// with what was found at start: namespace, model, size) is the device the
/// allowlist entry names: the same serial, PCI address and loop file where
/// the allowlist gives them, and the same namespace when it names one.
fn same_device(entry: &gpuq_blockdev::config::DeviceEntry, rec: &serde_json::Value) -> bool {
    let text = |v: &Option<String>, key: &str| {
        v.as_deref()
            .is_none_or(|want| rec[key].as_str() == Some(want))
    };
    let loop_file = entry
        .loop_backing_file
        .as_ref()
        .map(|p| p.display().to_string());
    (entry.serial.is_some() || entry.pci.is_some() || loop_file.is_some())
        && text(&entry.serial, "serial")
        && text(&entry.pci, "pci")
        && text(&loop_file, "loop_backing_file")
        && entry
            .nsid
            .is_none_or(|n| rec["nsid"].as_u64() == Some(u64::from(n)))
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// The lease's per-device wipe records (not the dry runs).
fn wipe_records(dir: &Path) -> Vec<serde_json::Value> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("wipe-") && n.ends_with(".json") && !n.ends_with(".dry-run.json")
        })
        .filter_map(|e| read_nofollow(&e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect()
}
