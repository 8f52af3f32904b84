//! Audit records: one JSON file per device and lease under
//! `<jobs_dir>/<lease>/wipe-<serial-or-name>.json`, written atomically
//! (temporary file, fsync, rename, fsync of the directory), so that a crash
//! leaves either the old record or the new one, never half of one.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::report::DeviceReport;

/// The record as written: the device report plus its context.
#[derive(Debug, Serialize)]
pub struct AuditRecord<'a> {
    pub version: u32,
    pub node: &'a str,
    pub lease: &'a str,
    /// `lease` or `activation`.
    pub reason: crate::wipe::Purpose,
    pub dry_run: bool,
    #[serde(flatten)]
    pub device: &'a DeviceReport,
}

/// Whether `s` is safe as one path component (lease names, serials).
pub fn is_safe_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Make an arbitrary string (a serial) safe as a file-name part.
pub fn sanitize(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let t = t.trim_start_matches('.').to_string();
    if t.is_empty() {
        "device".into()
    } else {
        t.chars().take(100).collect()
    }
}

/// Path of the record for `id` (a sanitized serial or kernel name).
pub fn record_path(jobs_dir: &Path, lease: &str, id: &str, dry_run: bool) -> PathBuf {
    let suffix = if dry_run { ".dry-run.json" } else { ".json" };
    jobs_dir
        .join(lease)
        .join(format!("wipe-{}{suffix}", sanitize(id)))
}

/// Write `value` as pretty JSON to `path` atomically.
pub fn write_atomic(path: &Path, value: &impl Serialize) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "record path has no parent"))?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if path.file_name().is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "record path has no name",
        ));
    }
    let mut body = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    body.push(b'\n');
    gpuq_durable::write_atomic(path, &body, 0o600)
}

/// RFC 3339 UTC timestamp with milliseconds.
pub fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_rfc3339(d.as_secs(), d.subsec_millis())
}

fn format_rfc3339(secs: u64, millis: u32) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        + time::Duration::milliseconds(i64::from(millis));
    t.format(time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .unwrap_or_else(|_| format!("@{secs}.{millis:03}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_values() {
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(format_rfc3339(1_796_256_000, 0), "2026-12-03T00:00:00.000Z");
    }

    #[test]
    fn components() {
        assert!(is_safe_component("lease-42.a_b"));
        assert!(!is_safe_component("../x"));
        assert!(!is_safe_component(".hidden"));
        assert!(!is_safe_component(""));
        assert_eq!(sanitize("SN 1/2"), "SN_1_2");
        assert_eq!(sanitize(".."), "device");
    }

    #[test]
    fn atomic_write_replaces() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("l1").join("wipe-x.json");
        write_atomic(&p, &serde_json::json!({"a": 1})).unwrap();
        write_atomic(&p, &serde_json::json!({"a": 2})).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
        assert_eq!(v["a"], 2);
        assert_eq!(fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }
}
