//! `GET /v1/activation/plan`: what activating this node's allowlisted
//! devices would find and do (issue #17, item 1). Read-only: the block
//! devices are inspected with the same checks a wipe runs first
//! (`gpuq-blockdev`'s `Inspect`: no audit record, no write), the named
//! systemd units are asked of systemd over D-Bus (`org.freedesktop.systemd1`,
//! properties only), and the DAOS processes of the node are read from
//! `/proc`. Nothing is stopped, written or claimed here.

use crate::procscan;
use crate::profile::{Mode, ServiceConfig};
use gpuq_blockdev::report::{DeviceReport, Verdict};
use gpuq_protocol::node::{ActivationPlan, PlanCheck, PlanDevice, PlanUnit};
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
        },
    );
    let (devices, devices_error) = match inspected {
        Ok(r) => (r.devices.iter().map(device).collect(), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
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
    let (steps, refusals) = steps(&devices, &units, devices_error.as_deref());
    ActivationPlan {
        node: cfg.node.node.name.clone(),
        physical_profiles,
        devices,
        devices_error,
        units,
        foreign_processes,
        steps,
        refusals,
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
