//! `<jobs_dir>/claim.json`: the devices an activation discarded and gpuq
//! owns on this node (issue #17). Physical mode starts and wipes only
//! devices named here, so a site's data is destroyed by the audited
//! activation the operator asked for, never silently by the first job's
//! cleanup.

use gpuq_blockdev::report::DeviceReport;
use gpuq_protocol::node::{Claim, LeaseDevice};
use std::path::{Path, PathBuf};

/// Where the claim record lives (a lease name has no '.', so no lease
/// directory can take this name).
pub fn path(jobs_dir: &Path) -> PathBuf {
    jobs_dir.join("claim.json")
}

/// The node's claim: `None` when there is none; an unreadable record is an
/// error (never mistaken for "no claim", never for "claimed").
pub fn load(jobs_dir: &Path) -> Result<Option<Claim>, String> {
    let p = path(jobs_dir);
    match read_nofollow(&p) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| format!("{} is unreadable: {e}", p.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", p.display())),
    }
}

pub(crate) fn read_nofollow(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)?;
    let mut b = Vec::new();
    f.read_to_end(&mut b)?;
    Ok(b)
}

/// Write the claim durably (temporary file, fsync, rename, fsync of the
/// directory), root-only.
pub fn write(jobs_dir: &Path, claim: &Claim) -> Result<(), String> {
    std::fs::create_dir_all(jobs_dir)
        .map_err(|e| format!("cannot create {}: {e}", jobs_dir.display()))?;
    let mut bytes = serde_json::to_vec_pretty(claim).unwrap_or_default();
    bytes.push(b'\n');
    gpuq_durable::write_atomic(&path(jobs_dir), &bytes, 0o600)
        .map_err(|e| format!("cannot write {}: {e}", path(jobs_dir).display()))
}

/// A checked device as a lease (and a claim) names it: how the allowlist
/// identifies it and what was found. `None` when its identity or size was
/// not read.
pub fn device_of(d: &DeviceReport) -> Option<LeaseDevice> {
    let seen = d.device.as_ref()?;
    Some(LeaseDevice {
        serial: d.entry.serial.clone(),
        pci: d.entry.pci.clone(),
        loop_backing_file: d
            .entry
            .loop_backing_file
            .as_ref()
            .map(|p| p.display().to_string()),
        nsid: seen.nsid,
        model: seen.model.clone(),
        size_bytes: seen.size_bytes?,
    })
}

/// Why `devices` may not be used in physical mode here, one line each;
/// empty when every one is claimed.
pub fn unclaimed(jobs_dir: &Path, devices: &[LeaseDevice]) -> Vec<String> {
    let how = "gpuq uses only devices an activation claimed: run `sudo gpuq activate` on the GPU host (it plans; `--execute --destroy-existing-data` claims)";
    match load(jobs_dir) {
        Err(e) => vec![format!("{e}; {how}")],
        Ok(None) => vec![format!(
            "no device of this node is claimed ({} does not exist); {how}",
            path(jobs_dir).display()
        )],
        Ok(Some(c)) => devices
            .iter()
            .filter(|d| !c.covers(d))
            .map(|d| {
                format!(
                    "{} is not claimed (claim of {}); {how}",
                    label(d),
                    c.activation
                )
            })
            .collect(),
    }
}

/// A device as an operator names it.
pub fn label(d: &LeaseDevice) -> String {
    let mut parts = Vec::new();
    if let Some(s) = &d.serial {
        parts.push(format!("serial {s}"));
    }
    if let Some(n) = d.nsid {
        parts.push(format!("nsid {n}"));
    }
    if let Some(f) = &d.loop_backing_file {
        parts.push(format!("loop {f}"));
    }
    if parts.is_empty() {
        "a device without identity".into()
    } else {
        parts.join(", ")
    }
}
