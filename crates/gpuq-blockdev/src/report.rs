//! Result types shared by `devices`, `wipe` and the audit records.
//!
//! The reason codes are a fixed vocabulary that scripts and the broker rely
//! on (issue 3); adding one is a deliberate, reviewed change.

use serde::{Deserialize, Serialize};

/// Why a device must not be wiped (or why its wipe failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    NotAllowlisted,
    IdentityMismatch,
    SizeMismatch,
    Rotational,
    ReadOnly,
    OsDisk,
    Mounted,
    Partitions,
    Holders,
    NvmetExport,
    Swap,
    OpenByOther,
    Locked,
    UserspaceDriver,
    ForeignSignature,
    ExternalEngine,
    ForeignLease,
    DiscardUnsupported,
    SignatureAfterWipe,
    IoError,
}

impl Reason {
    /// The code as it appears in JSON.
    pub fn code(self) -> &'static str {
        match self {
            Reason::NotAllowlisted => "not_allowlisted",
            Reason::IdentityMismatch => "identity_mismatch",
            Reason::SizeMismatch => "size_mismatch",
            Reason::Rotational => "rotational",
            Reason::ReadOnly => "read_only",
            Reason::OsDisk => "os_disk",
            Reason::Mounted => "mounted",
            Reason::Partitions => "partitions",
            Reason::Holders => "holders",
            Reason::NvmetExport => "nvmet_export",
            Reason::Swap => "swap",
            Reason::OpenByOther => "open_by_other",
            Reason::Locked => "locked",
            Reason::UserspaceDriver => "userspace_driver",
            Reason::ForeignSignature => "foreign_signature",
            Reason::ExternalEngine => "external_engine",
            Reason::ForeignLease => "foreign_lease",
            Reason::DiscardUnsupported => "discard_unsupported",
            Reason::SignatureAfterWipe => "signature_after_wipe",
            Reason::IoError => "io_error",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

/// One refusal: a reason code plus a sentence for humans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub reason: Reason,
    pub detail: String,
}

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Refuse,
}

/// One check as recorded in the report and the audit record. `check` is the
/// reason code the check refuses with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub check: Reason,
    pub verdict: Verdict,
    pub detail: String,
}

impl CheckResult {
    pub fn pass(check: Reason, detail: impl Into<String>) -> Self {
        CheckResult {
            check,
            verdict: Verdict::Pass,
            detail: detail.into(),
        }
    }

    pub fn refuse(check: Reason, detail: impl Into<String>) -> Self {
        CheckResult {
            check,
            verdict: Verdict::Refuse,
            detail: detail.into(),
        }
    }

    /// Fail closed: the check could not be evaluated, so it refuses.
    pub fn unknown(check: Reason, what: impl std::fmt::Display) -> Self {
        Self::refuse(check, format!("cannot be evaluated: {what}"))
    }
}

/// A signature found by libblkid (superblock or partition table).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// `superblock` or `partition_table`.
    pub chain: String,
    /// libblkid `TYPE` / `PTTYPE` (`ext4`, `LVM2_member`, `gpt` …).
    #[serde(rename = "type")]
    pub kind: String,
    /// libblkid `USAGE` (`filesystem`, `raid`, `crypto`, `other`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<String>,
    /// Byte offset of the magic, if libblkid reported it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// What happened to one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceResult {
    /// Every check passed (`devices`, or `wipe --dry-run`).
    Ok,
    /// At least one check refused; nothing was destroyed.
    Refused,
    /// Every check passed here, but another device of the node refused, so
    /// nothing was destroyed anywhere.
    Skipped,
    /// Discarded and verified.
    Wiped,
    /// Discard or verification failed.
    Failed,
}

/// Identity of the block device as seen on the system.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenIdentity {
    pub name: String,
    pub path: String,
    pub devnum: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wwid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loop_backing_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

/// The report for one allowlisted device.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceReport {
    /// The allowlist entry, as configured.
    pub entry: crate::config::DeviceEntry,
    /// The device the entry resolved to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<SeenIdentity>,
    pub result: DeviceResult,
    pub refusals: Vec<Refusal>,
    pub checks: Vec<CheckResult>,
    pub signatures_before: Vec<Signature>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signatures_after: Option<Vec<Signature>>,
    pub bytes_discarded: u64,
    pub started_at: String,
    pub finished_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<String>,
}

impl DeviceReport {
    /// Refusals derived from the checks.
    pub fn collect_refusals(&mut self) {
        self.refusals = self
            .checks
            .iter()
            .filter(|c| c.verdict == Verdict::Refuse)
            .map(|c| Refusal {
                reason: c.check,
                detail: c.detail.clone(),
            })
            .collect();
    }

    pub fn passed(&self) -> bool {
        self.refusals.is_empty()
    }
}

/// Node-level summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeResult {
    /// Every device passed every check (and, for a real wipe, was wiped).
    Ok,
    /// At least one device refused; nothing was destroyed.
    Refused,
    /// A discard or verification failed after checks had passed.
    Failed,
}

/// What `devices` and `wipe` print with `--json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeReport {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    pub dry_run: bool,
    pub result: NodeResult,
    pub devices: Vec<DeviceReport>,
    /// `devices` only: every whole disk on the node (allowlisted or not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<crate::system::InventoryEntry>,
    /// `devices` only: why the inventory could not be read, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory_error: Option<String>,
    /// Audit files that could not be written (the node result is then not ok).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audit_errors: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_codes_match_serde() {
        for r in [
            Reason::NotAllowlisted,
            Reason::IdentityMismatch,
            Reason::SizeMismatch,
            Reason::Rotational,
            Reason::ReadOnly,
            Reason::OsDisk,
            Reason::Mounted,
            Reason::Partitions,
            Reason::Holders,
            Reason::Swap,
            Reason::OpenByOther,
            Reason::Locked,
            Reason::UserspaceDriver,
            Reason::ForeignSignature,
            Reason::ExternalEngine,
            Reason::ForeignLease,
            Reason::DiscardUnsupported,
            Reason::SignatureAfterWipe,
            Reason::IoError,
        ] {
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", r.code())
            );
        }
    }

    #[test]
    fn unknown_check_refuses() {
        let c = CheckResult::unknown(Reason::Rotational, "read failed");
        assert_eq!(c.verdict, Verdict::Refuse);
    }
}
