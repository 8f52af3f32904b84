//! `GET /v1/activation/plan`: what activating this node's allowlisted
//! devices would find and do (issue #17, item 1). Read-only: the block
//! devices are inspected with the same checks a wipe runs first
//! (`gpuq-blockdev`'s `Inspect`: no audit record, no write), the named
//! systemd units are asked of systemd over D-Bus (`org.freedesktop.systemd1`,
//! properties only), and the DAOS processes of the node are read from
//! `/proc`. Nothing is stopped, written or claimed here.

use crate::audit;
use crate::procscan;
use crate::profile::{Mode, ServiceConfig};
use crate::service::NodeError;
use gpuq_blockdev::report::{DeviceReport, Verdict};
use gpuq_protocol::node::{
    valid_lease, ActivationPlan, ActivationReport, ActivationRequest, Claim, LeaseDevice,
    PlanCheck, PlanDevice, PlanUnit,
};
use std::time::Duration;

/// How long systemd has to answer for all the units.
const SYSTEMD_DEADLINE: Duration = Duration::from_secs(5);

/// The plan of the node `cfg` describes, as of now.
pub async fn plan(cfg: &ServiceConfig) -> ActivationPlan {
    // The device checks block this thread: the node helper runs a plan on
    // its blocking pool (server.rs `run_step`), as it runs a preflight.
    let inspected = gpuq_blockdev::wipe::run(
        &cfg.node,
        &gpuq_blockdev::wipe::Request {
            mode: gpuq_blockdev::wipe::Mode::Inspect,
            lease: None,
            expected_signatures: vec![],
            purpose: gpuq_blockdev::wipe::Purpose::Lease,
        },
    );
    let (devices, devices_error, found) = match inspected {
        Ok(r) => (
            r.devices.iter().map(device).collect(),
            None,
            r.devices
                .iter()
                .filter_map(crate::claim::device_of)
                .collect::<Vec<LeaseDevice>>(),
        ),
        Err(e) => (Vec::new(), Some(e.to_string()), Vec::new()),
    };
    let units = units(&cfg.activation_units).await;
    let foreign_processes = match procscan::scan() {
        Ok(ps) => ps
            .into_iter()
            .filter(|p| p.container.is_none())
            .map(|p| format!("{} (pid {})", p.name, p.pid))
            .collect(),
        Err(e) => vec![format!("cannot scan processes: {e}")],
    };
    let physical_profiles: Vec<String> = cfg
        .profiles
        .values()
        .filter(|p| p.mode == Mode::Physical)
        .map(|p| p.name.clone())
        .collect();
    let (mut steps, mut refusals) = steps(&devices, &units, devices_error.as_deref());
    let claim = match crate::claim::load(&cfg.node.node.jobs_dir) {
        Ok(c) => c,
        Err(e) => {
            let line = format!("{e}; activation would refuse");
            refusals.push(line.clone());
            steps.push(line);
            None
        }
    };
    if let (Some(c), None) = (&claim, &devices_error) {
        if c.is_exactly(&found) {
            // Resuming an activation skips this node.
            steps = vec![format!(
                "already claimed by activation {} at {} ({} device(s)): an activation does nothing here",
                c.activation,
                c.claimed_at,
                c.devices.len()
            )];
            refusals.clear();
        }
    }
    ActivationPlan {
        claim,
        node: cfg.node.node.name.clone(),
        physical_profiles,
        devices,
        devices_error,
        units,
        foreign_processes,
        steps,
        refusals,
        accepted_risks: cfg.accepted_risks(),
    }
}

fn device(d: &DeviceReport) -> PlanDevice {
    let e = &d.entry;
    let mut entry = Vec::new();
    if let Some(s) = &e.serial {
        entry.push(format!("serial {s}"));
    }
    if let Some(p) = &e.pci {
        entry.push(format!("pci {p}"));
    }
    if let Some(n) = e.nsid {
        entry.push(format!("nsid {n}"));
    }
    if let Some(f) = &e.loop_backing_file {
        entry.push(format!("loop {}", f.display()));
    }
    let seen = d.device.as_ref();
    let identity = seen
        .map(|s| {
            [
                s.serial.as_ref().map(|v| format!("serial {v}")),
                s.model.as_ref().map(|v| format!("model {v}")),
                s.pci.as_ref().map(|v| format!("pci {v}")),
                s.nsid.map(|v| format!("nsid {v}")),
                s.loop_backing_file.as_ref().map(|v| format!("loop {v}")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
        })
        .unwrap_or_else(|| "not found on this node".into());
    PlanDevice {
        entry: entry.join(", "),
        path: seen.map(|s| s.path.clone()),
        identity,
        size_bytes: seen.and_then(|s| s.size_bytes),
        signatures: d
            .signatures_before
            .iter()
            .map(|s| {
                let at = s.offset.map(|o| format!(" at {o}")).unwrap_or_default();
                format!("{} {}{at}", s.kind, s.chain)
            })
            .collect(),
        checks: d
            .checks
            .iter()
            .map(|c| PlanCheck {
                check: c.check.code().to_string(),
                verdict: match c.verdict {
                    Verdict::Pass => "pass",
                    Verdict::Refuse => "refuse",
                }
                .to_string(),
                detail: c.detail.clone(),
            })
            .collect(),
    }
}

/// What `--execute` would do on this node, in order, as an operator reads
/// it; and, of those, the ones it would refuse at.
fn steps(
    devices: &[PlanDevice],
    units: &[PlanUnit],
    devices_error: Option<&str>,
) -> (Vec<String>, Vec<String>) {
    let mut out = Vec::new();
    let mut refusals = Vec::new();
    let mut refuse = |out: &mut Vec<String>, line: String| {
        refusals.push(line.clone());
        out.push(line);
    };
    for u in units {
        if let Some(e) = &u.error {
            refuse(
                &mut out,
                format!(
                    "{}: systemd could not be asked ({e}); activation would refuse",
                    u.unit
                ),
            );
            continue;
        }
        out.push(match u.load_state.as_str() {
            "not-found" => format!("{}: not installed here; nothing to stop", u.unit),
            _ => format!(
                "stop {} ({}{}) and disable its start at boot ({})",
                u.unit,
                u.active_state,
                if u.main_pid > 0 {
                    format!(", main PID {}", u.main_pid)
                } else {
                    String::new()
                },
                u.unit_file_state
            ),
        });
    }
    if let Some(e) = devices_error {
        refuse(
            &mut out,
            format!("the devices cannot be inspected ({e}); activation would refuse"),
        );
        return (out, refusals);
    }
    if devices.is_empty() {
        out.push("no device is allowlisted ([[devices]]): nothing to activate here".into());
        return (out, refusals);
    }
    out.push(format!(
        "check the identity and use of {} device(s) again (a signature found now is expected and discarded; any other refusal stops the activation)",
        devices.len()
    ));
    for d in devices {
        let blocking: Vec<&PlanCheck> = d
            .checks
            .iter()
            .filter(|c| c.verdict != "pass" && c.check != "foreign_signature")
            .collect();
        let what = d.path.as_deref().unwrap_or("(not found)");
        if !blocking.is_empty() {
            refuse(
                &mut out,
                format!(
                    "{what} ({}): activation would refuse: {}",
                    d.entry,
                    blocking
                        .iter()
                        .map(|c| format!("{}: {}", c.check, c.detail))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            );
            continue;
        }
        out.push(format!(
            "discard all of {what} ({}, {}) — destroys {}",
            d.identity,
            d.size_bytes
                .map(|b| format!("{b} bytes"))
                .unwrap_or_else(|| "size unknown".into()),
            if d.signatures.is_empty() {
                "whatever is on it (no signature found)".to_string()
            } else {
                d.signatures.join(", ")
            }
        ));
    }
    out.push("write this node's claim record naming the claimed devices by serial".into());
    out.push("enable physical mode on this node".into());
    (out, refusals)
}

/// Each unit's states, asked of systemd over the system bus; a unit whose
/// states cannot be read says why.
async fn units(names: &[String]) -> Vec<PlanUnit> {
    if names.is_empty() {
        return Vec::new();
    }
    let asked = tokio::time::timeout(SYSTEMD_DEADLINE, async {
        let conn = zbus::Connection::system().await?;
        let mut out = Vec::new();
        for name in names {
            out.push(match unit(&conn, name).await {
                Ok(u) => u,
                Err(e) => unit_error(name, e.to_string()),
            });
        }
        Ok::<_, zbus::Error>(out)
    })
    .await;
    match asked {
        Ok(Ok(units)) => units,
        Ok(Err(e)) => names
            .iter()
            .map(|n| unit_error(n, format!("system bus: {e}")))
            .collect(),
        Err(_) => names
            .iter()
            .map(|n| {
                unit_error(
                    n,
                    format!("systemd did not answer within {SYSTEMD_DEADLINE:?}"),
                )
            })
            .collect(),
    }
}

fn unit_error(name: &str, why: String) -> PlanUnit {
    PlanUnit {
        unit: name.to_string(),
        load_state: String::new(),
        active_state: String::new(),
        unit_file_state: String::new(),
        main_pid: 0,
        error: Some(why),
    }
}

async fn unit(conn: &zbus::Connection, name: &str) -> zbus::Result<PlanUnit> {
    const DEST: &str = "org.freedesktop.systemd1";
    let manager = zbus::Proxy::new(
        conn,
        DEST,
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
    )
    .await?;
    // LoadUnit answers for a unit that is not installed too (load state
    // `not-found`); it starts nothing.
    let path: zbus::zvariant::OwnedObjectPath = manager.call("LoadUnit", &(name,)).await?;
    let u = zbus::Proxy::new(conn, DEST, path.clone(), "org.freedesktop.systemd1.Unit").await?;
    let load_state: String = u.get_property("LoadState").await?;
    let active_state: String = u.get_property("ActiveState").await?;
    let unit_file_state: String = u.get_property("UnitFileState").await.unwrap_or_default();
    let main_pid = if name.ends_with(".service") && load_state == "loaded" {
        let s = zbus::Proxy::new(conn, DEST, path, "org.freedesktop.systemd1.Service").await?;
        s.get_property::<u32>("MainPID").await.unwrap_or(0)
    } else {
        0
    };
    Ok(PlanUnit {
        unit: name.to_string(),
        load_state,
        active_state,
        unit_file_state,
        main_pid,
        error: None,
    })
}

/// How long each named unit has to stop once systemd was asked to.
const UNIT_STOP_DEADLINE: Duration = Duration::from_secs(60);

/// `POST /v1/activation/execute`: activate this node for `req.activation`
/// (issue #17, item 2), in this order, each step confirmed before the next:
/// no lease and no container of gpuq's here → every unit `[activation]
/// units` names stopped and its start at boot disabled, through systemd's
/// D-Bus API → no DAOS process left outside a container → every
/// allowlisted device checked and discarded by the same audited wipe a
/// lease gets (audit reason `activation`; a signature is reported and
/// discarded, every other check still refuses, and one refusal anywhere
/// discards nothing) → the claim record written durably. A node already
/// claimed for exactly the devices its allowlist names now answers so and
/// does nothing: running the activation again resumes where it stopped.
///
/// The caller runs it on its blocking pool (the wipe blocks its thread).
pub async fn execute<P: gpuq_podman::Podman>(
    svc: &crate::service::NodeService<P>,
    req: &ActivationRequest,
) -> Result<ActivationReport, NodeError> {
    let cfg = svc.config();
    let jobs_dir = cfg.node.node.jobs_dir.clone();
    let name = cfg.node.node.name.clone();
    if !valid_lease(&req.activation) {
        return Err(NodeError::BadRequest(format!(
            "activation name '{}' is not valid: 1-64 letters, digits, - and _",
            req.activation
        )));
    }
    // Already claimed for exactly what the allowlist resolves to now.
    let now_devices = inspect_devices(cfg)?;
    if let Some(c) = crate::claim::load(&jobs_dir).map_err(NodeError::Failed)? {
        if c.is_exactly(&now_devices) {
            return Ok(ActivationReport {
                node: name,
                activation: req.activation.clone(),
                already_claimed: true,
                done: vec![format!(
                    "already claimed by activation {} at {}: nothing done",
                    c.activation, c.claimed_at
                )],
                claim: c,
            });
        }
    }
    if let Some(rec) = svc.lease_record()? {
        return Err(NodeError::Refused(format!(
            "this node holds lease {} (phase {}): an activation needs none; nothing was changed",
            rec.lease, rec.phase
        )));
    }
    let ours = svc.our_containers(None).await?;
    if !ours.is_empty() {
        return Err(NodeError::Refused(format!(
            "gpuq's containers are here ({}): an activation needs none; nothing was changed",
            ours.iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let dir = jobs_dir.join(&req.activation);
    let audit = |step: &str, result: &str, detail: &str| {
        audit::append(&dir, step, result, detail).map_err(|e| NodeError::Io {
            what: format!("audit line in {}", dir.display()),
            source: e,
        })
    };
    let mut done = Vec::new();

    // 1. The site's own DAOS services: stopped and disabled, by systemd.
    if !cfg.activation_units.is_empty() {
        let stopped = tokio::time::timeout(
            UNIT_STOP_DEADLINE + SYSTEMD_DEADLINE,
            stop_units(&cfg.activation_units),
        )
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "systemd did not stop and disable the units within {:?}",
                UNIT_STOP_DEADLINE + SYSTEMD_DEADLINE
            ))
        });
        match stopped {
            Ok(lines) => {
                for l in &lines {
                    audit("unit", "ok", l)?;
                }
                done.extend(lines);
            }
            Err(e) => {
                audit("unit", "failed", &e)?;
                return Err(NodeError::Failed(format!("{e}; no device was touched")));
            }
        }
    }
    // 2. Nothing of DAOS may still run outside a container.
    let left: Vec<String> = procscan::scan()
        .map_err(|e| NodeError::Failed(format!("cannot scan processes: {e}")))?
        .into_iter()
        .filter(|p| p.container.is_none())
        .map(|p| format!("{} (pid {})", p.name, p.pid))
        .collect();
    if !left.is_empty() {
        let msg = format!(
            "DAOS processes still run outside containers: {}; name their unit in [activation] units of {} (gpuq never kills processes by name); no device was touched",
            left.join(", "),
            cfg.source.display()
        );
        audit("processes", "refused", &msg)?;
        return Err(NodeError::Refused(msg));
    }
    // 3. The devices: checked, discarded, verified, audited.
    let report = gpuq_blockdev::wipe::run(
        &cfg.node,
        &gpuq_blockdev::wipe::Request {
            mode: gpuq_blockdev::wipe::Mode::Wipe,
            lease: Some(req.activation.clone()),
            expected_signatures: vec![],
            purpose: gpuq_blockdev::wipe::Purpose::Activation,
        },
    )
    .map_err(|e| NodeError::Failed(e.to_string()))?;
    if report.result != gpuq_blockdev::report::NodeResult::Ok {
        let why: Vec<String> = report
            .devices
            .iter()
            .flat_map(|d| {
                d.refusals
                    .iter()
                    .map(move |r| format!("{}: {}", d.entry.label(), r.detail))
            })
            .chain(report.audit_errors.iter().cloned())
            .collect();
        let msg = format!(
            "the activation's wipe did not complete ({:?}): {}; no claim was written",
            report.result,
            if why.is_empty() {
                "see the audit records".to_string()
            } else {
                why.join("; ")
            }
        );
        audit("wipe", "failed", &msg)?;
        return Err(
            if report.result == gpuq_blockdev::report::NodeResult::Refused {
                NodeError::Refused(msg)
            } else {
                NodeError::Failed(msg)
            },
        );
    }
    let mut devices = Vec::new();
    for d in &report.devices {
        let Some(ld) = crate::claim::device_of(d) else {
            let msg = format!(
                "{}: discarded, but its identity or size was not read; no claim was written",
                d.entry.label()
            );
            audit("wipe", "failed", &msg)?;
            return Err(NodeError::Failed(msg));
        };
        done.push(format!(
            "discarded {} ({}, {} bytes){}",
            d.device.as_ref().map(|s| s.path.as_str()).unwrap_or("?"),
            crate::claim::label(&ld),
            ld.size_bytes,
            if d.signatures_before.is_empty() {
                String::new()
            } else {
                format!(
                    "; it held {}",
                    d.signatures_before
                        .iter()
                        .map(|s| s.kind.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        ));
        devices.push(ld);
    }
    audit(
        "wipe",
        "ok",
        &format!(
            "discarded {} device(s) (audit reason activation)",
            devices.len()
        ),
    )?;
    // 4. The claim: from now on physical mode may use exactly these.
    let claim = Claim {
        version: 1,
        node: name.clone(),
        activation: req.activation.clone(),
        claimed_at: gpuq_protocol::time::format_utc(gpuq_protocol::time::now()),
        devices,
    };
    crate::claim::write(&jobs_dir, &claim).map_err(NodeError::Failed)?;
    let line = format!(
        "claimed {} device(s) in {}; physical mode may use them",
        claim.devices.len(),
        crate::claim::path(&jobs_dir).display()
    );
    audit("claim", "ok", &line)?;
    done.push(line);
    Ok(ActivationReport {
        node: name,
        activation: req.activation.clone(),
        already_claimed: false,
        done,
        claim,
    })
}

/// The allowlisted devices as they resolve now (read-only checks).
fn inspect_devices(cfg: &ServiceConfig) -> Result<Vec<LeaseDevice>, NodeError> {
    let r = gpuq_blockdev::wipe::run(
        &cfg.node,
        &gpuq_blockdev::wipe::Request {
            mode: gpuq_blockdev::wipe::Mode::Inspect,
            lease: None,
            expected_signatures: vec![],
            purpose: gpuq_blockdev::wipe::Purpose::Activation,
        },
    )
    .map_err(|e| NodeError::Failed(e.to_string()))?;
    Ok(r.devices
        .iter()
        .filter_map(crate::claim::device_of)
        .collect())
}

/// Stop each unit and disable its start at boot; confirmed by systemd's
/// own answer afterwards. One line per thing done.
async fn stop_units(names: &[String]) -> Result<Vec<String>, String> {
    const DEST: &str = "org.freedesktop.systemd1";
    let conn = zbus::Connection::system()
        .await
        .map_err(|e| format!("system bus: {e}"))?;
    let manager = zbus::Proxy::new(
        &conn,
        DEST,
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
    )
    .await
    .map_err(|e| format!("systemd: {e}"))?;
    let mut out = Vec::new();
    for name in names {
        let before = unit(&conn, name)
            .await
            .map_err(|e| format!("{name}: systemd could not be asked: {e}"))?;
        if before.load_state == "not-found" {
            out.push(format!("{name}: not installed here; nothing to stop"));
            continue;
        }
        if !matches!(before.active_state.as_str(), "inactive" | "failed") {
            let _job: zbus::zvariant::OwnedObjectPath = manager
                .call("StopUnit", &(name.as_str(), "replace"))
                .await
                .map_err(|e| format!("{name}: StopUnit: {e}"))?;
            let deadline = tokio::time::Instant::now() + UNIT_STOP_DEADLINE;
            loop {
                let now = unit(&conn, name)
                    .await
                    .map_err(|e| format!("{name}: systemd could not be asked: {e}"))?;
                if matches!(now.active_state.as_str(), "inactive" | "failed") {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!(
                        "{name} is still {} {UNIT_STOP_DEADLINE:?} after systemd was asked to stop it",
                        now.active_state
                    ));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            out.push(format!(
                "stopped {name} (was {}{})",
                before.active_state,
                if before.main_pid > 0 {
                    format!(", main PID {}", before.main_pid)
                } else {
                    String::new()
                }
            ));
        } else {
            out.push(format!("{name} was already {}", before.active_state));
        }
        if matches!(
            before.unit_file_state.as_str(),
            "enabled" | "enabled-runtime" | "linked" | "linked-runtime" | "alias"
        ) {
            let _changes: Vec<(String, String, String)> = manager
                .call("DisableUnitFiles", &(vec![name.as_str()], false))
                .await
                .map_err(|e| format!("{name}: DisableUnitFiles: {e}"))?;
            let () = manager
                .call("Reload", &())
                .await
                .map_err(|e| format!("{name}: Reload: {e}"))?;
        }
        let after = unit(&conn, name)
            .await
            .map_err(|e| format!("{name}: systemd could not be asked: {e}"))?;
        if matches!(
            after.unit_file_state.as_str(),
            "enabled" | "enabled-runtime" | "linked" | "linked-runtime" | "alias"
        ) || !matches!(after.active_state.as_str(), "inactive" | "failed")
        {
            return Err(format!(
                "{name} is {} and {} after stopping and disabling it",
                after.active_state, after.unit_file_state
            ));
        }
        out.push(format!(
            "{name} start at boot: {} (was {})",
            after.unit_file_state, before.unit_file_state
        ));
    }
    Ok(out)
}
