//! Signature probing with libblkid (through `libblkid-rs`).
//!
//! Like `wipefs` without `--all`, we do not stop at the first match:
//! `blkid_do_probe` is called in a loop, and every call runs the next probing
//! function of the superblock chain and then of the partition-table chain, so
//! that stale or overlapping signatures (an old xfs under a new ext4, a GPT
//! plus its protective MBR) are all reported. The probe reads through the
//! descriptor we already hold, so it sees the same device the discard will
//! hit; it never writes (`blkid_do_wipe` is never called).

use std::os::fd::{AsRawFd, BorrowedFd};

use libblkid_rs::{BlkidProbe, BlkidProbeRet, BlkidSublks, BlkidSublksFlags};

use crate::report::Signature;

/// Probing error (fail closed: the caller refuses).
#[derive(Debug, thiserror::Error)]
#[error("libblkid probe failed: {0}")]
pub struct ProbeError(String);

/// Upper bound on probing steps; libblkid has a few dozen probers. Hitting
/// it means something is wrong, and is reported as an error.
const MAX_STEPS: usize = 1024;

/// Every superblock and partition-table signature on the device.
pub fn signatures(fd: BorrowedFd<'_>) -> Result<Vec<Signature>, ProbeError> {
    let err = |e: libblkid_rs::BlkidErr| ProbeError(e.to_string());
    let mut p = BlkidProbe::new().map_err(err)?;
    p.set_device(fd.as_raw_fd(), 0, 0).map_err(err)?;
    p.enable_superblocks(true).map_err(err)?;
    p.set_superblock_flags(BlkidSublksFlags::new(vec![
        BlkidSublks::Type,
        BlkidSublks::Usage,
        BlkidSublks::Magic,
        BlkidSublks::Uuid,
        BlkidSublks::Label,
        // Report damaged superblocks too: a bad checksum is still data.
        BlkidSublks::Badcsum,
    ]))
    .map_err(err)?;
    p.enable_partitions(true).map_err(err)?;

    let mut out = Vec::new();
    for _ in 0..MAX_STEPS {
        match p.do_probe().map_err(err)? {
            BlkidProbeRet::Done => return Ok(out),
            BlkidProbeRet::Success => {}
        }
        // Look up the string values by name: `get_value` over all values
        // fails on binary ones (SBMAGIC is raw bytes, not a C string).
        let get = |k: &str| -> Result<Option<String>, ProbeError> {
            if !p.has_value(k).map_err(err)? {
                return Ok(None);
            }
            Ok(Some(
                p.lookup_value(k)
                    .map_err(err)?
                    .trim_end_matches('\0')
                    .to_string(),
            ))
        };
        let n = p.numof_values().map_err(err)?;
        let sig = if let Some(t) = get("TYPE")? {
            Signature {
                chain: "superblock".into(),
                kind: t,
                usage: get("USAGE")?,
                offset: get("SBMAGIC_OFFSET")?.and_then(|o| o.parse().ok()),
                uuid: get("UUID")?,
                label: get("LABEL")?,
            }
        } else if let Some(t) = get("PTTYPE")? {
            Signature {
                chain: "partition_table".into(),
                kind: t,
                usage: None,
                offset: get("PTMAGIC_OFFSET")?.and_then(|o| o.parse().ok()),
                uuid: get("PTUUID")?,
                label: None,
            }
        } else if n == 0 {
            // An empty result: nothing to report.
            continue;
        } else {
            // A result we do not understand is not "nothing": report it.
            Signature {
                chain: "unknown".into(),
                kind: format!("{n} unnamed values"),
                usage: None,
                offset: None,
                uuid: None,
                label: None,
            }
        };
        if !out.contains(&sig) {
            out.push(sig);
        }
    }
    Err(ProbeError(format!(
        "no end of probing after {MAX_STEPS} steps"
    )))
}

/// Signatures that are not in `expected` (compared by type).
pub fn unexpected<'a>(found: &'a [Signature], expected: &[String]) -> Vec<&'a Signature> {
    found
        .iter()
        .filter(|s| !expected.iter().any(|e| e == &s.kind))
        .collect()
}

/// `ext4 (filesystem) at 1080, gpt at 512`.
pub fn describe(sigs: &[&Signature]) -> String {
    sigs.iter()
        .map(|s| {
            let mut d = s.kind.clone();
            if let Some(u) = &s.usage {
                d.push_str(&format!(" ({u})"));
            }
            if let Some(o) = s.offset {
                d.push_str(&format!(" at byte {o}"));
            }
            d
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(kind: &str) -> Signature {
        Signature {
            chain: "superblock".into(),
            kind: kind.into(),
            usage: Some("filesystem".into()),
            offset: Some(1080),
            uuid: None,
            label: None,
        }
    }

    #[test]
    fn expected_signatures_are_filtered() {
        let found = vec![sig("ext4"), sig("xfs")];
        let u = unexpected(&found, &["ext4".to_string()]);
        assert_eq!(u.len(), 1);
        assert_eq!(u[0].kind, "xfs");
        assert_eq!(describe(&u), "xfs (filesystem) at byte 1080");
    }

    #[test]
    fn zero_filled_file_has_no_signature() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(4 << 20).unwrap();
        use std::os::fd::AsFd;
        assert!(signatures(f.as_fd()).unwrap().is_empty());
    }
}
