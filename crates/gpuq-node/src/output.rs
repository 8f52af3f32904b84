//! Rendering of reports (text or JSON) and the exit code they map to.

use gpuq_blockdev::{DeviceResult, NodeReport, NodeResult, WipeError};

use crate::Exit;

/// Print the report (or the error) and choose the exit code.
pub fn finish(res: Result<NodeReport, WipeError>, json: bool) -> Exit {
    let report = match res {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpuq-node: {e}");
            return match e {
                WipeError::MissingLease | WipeError::InvalidLease(_) => Exit::Usage,
            };
        }
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("gpuq-node: cannot encode report: {e}");
                return Exit::Failed;
            }
        }
    } else {
        print_text(&report);
    }
    for e in &report.audit_errors {
        eprintln!("gpuq-node: {e}");
    }
    match report.result {
        NodeResult::Ok => Exit::Ok,
        NodeResult::Refused => Exit::Refused,
        NodeResult::Failed => Exit::Failed,
    }
}

fn print_text(r: &NodeReport) {
    let what = match (&r.lease, r.dry_run) {
        (Some(l), true) => format!("wipe --dry-run for lease {l}"),
        (Some(l), false) => format!("wipe for lease {l}"),
        (None, _) => "devices".to_string(),
    };
    println!("node {}: {what}", r.node);
    if r.devices.is_empty() {
        println!("  (no [[devices]] in the allowlist)");
    }
    for d in &r.devices {
        let name = d
            .device
            .as_ref()
            .map(|s| format!("{} ({})", s.path, s.devnum))
            .unwrap_or_else(|| "-".to_string());
        let result = match d.result {
            DeviceResult::Ok => "ok",
            DeviceResult::Refused => "refused",
            DeviceResult::Skipped => "skipped (another device refused)",
            DeviceResult::Wiped => "wiped",
            DeviceResult::Failed => "FAILED",
        };
        println!("  {} -> {name}: {result}", d.entry.label());
        if d.result == DeviceResult::Wiped {
            println!(
                "    discarded {} bytes, no signature left",
                d.bytes_discarded
            );
        }
        for f in &d.refusals {
            println!("    {}: {}", f.reason, f.detail);
        }
        if let Some(a) = &d.audit {
            println!("    audit: {a}");
        }
    }
    if !r.inventory.is_empty() {
        println!("inventory:");
        for d in &r.inventory {
            let size = d
                .size_bytes
                .map(|b| format!("{:.1}G", b as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "?".into());
            let kind = match d.rotational {
                Some(true) => "rot",
                Some(false) => "ssd",
                None => "?",
            };
            let mut notes = Vec::new();
            if let Some(s) = &d.serial {
                notes.push(format!("serial {s}"));
            }
            if let Some(p) = &d.pci {
                notes.push(format!("pci {p}"));
            }
            if let Some(b) = &d.loop_backing_file {
                notes.push(format!("file {b}"));
            }
            if !d.partitions.is_empty() {
                notes.push(format!("parts {}", d.partitions.join(",")));
            }
            if !d.holders.is_empty() {
                notes.push(format!("holders {}", d.holders.join(",")));
            }
            if !d.mountpoints.is_empty() {
                notes.push(format!("mounted {}", d.mountpoints.join(",")));
            }
            if !d.swap.is_empty() {
                notes.push("swap".to_string());
            }
            println!(
                "  {:<10} {:>8} {kind:<3} {}",
                d.name,
                size,
                notes.join("; ")
            );
        }
    }
    if let Some(e) = &r.inventory_error {
        println!("inventory: {e}");
    }
    let summary = match r.result {
        NodeResult::Ok if r.lease.is_some() && !r.dry_run => "ok: every device wiped and verified",
        NodeResult::Ok => "ok: every device passed every check",
        NodeResult::Refused => "refused: nothing was destroyed",
        NodeResult::Failed => "failed",
    };
    println!("result: {summary}");
}
