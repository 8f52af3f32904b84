//! `<jobs_dir>/<lease>/audit.jsonl`: one JSON line per destructive or
//! state-changing step (what, when, result), fsynced before the call returns.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Append one record to `<lease_dir>/audit.jsonl` and fsync it.
pub fn append(lease_dir: &Path, step: &str, result: &str, detail: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(lease_dir)?;
    let rec = serde_json::json!({
        "time": now(),
        "step": step,
        "result": result,
        "detail": detail,
    });
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(lease_dir.join("audit.jsonl"))?;
    let mut line = rec.to_string();
    line.push('\n');
    f.write_all(line.as_bytes())?;
    f.sync_all()
}

pub use gpuq_protocol::time::now;
