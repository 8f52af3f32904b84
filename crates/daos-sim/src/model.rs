//! The JSON shapes dmg prints (field names exactly as in daos.md, which
//! cites src/control/system/member.go, src/control/lib/control/storage.go
//! and src/control/common/cmdutil/json.go) and small helpers: UUIDs, RFC 3339
//! timestamps, host-set compression.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// dmg's `-j` envelope: printed on stdout on success and failure alike.
/// Typed, so fields come out in DAOS's struct order.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub response: Option<T>,
    pub error: Option<String>,
    pub status: i32,
}

/// The responses dmg prints, each serialised as its own struct.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum DmgResponse {
    SystemQuery(SystemQueryResp),
    SystemStop(SystemStopResp),
    StorageFormat(StorageFormatResp),
    StorageUsage(StorageUsageResp),
    PoolCreate(PoolCreateResp),
    ContCreate(ContCreateResp),
    ContWrite(ContWriteResp),
    ContRead(ContReadResp),
}

/// One `members[]` entry of `dmg system query -j`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Member {
    pub addr: String,
    pub state: String,
    pub fault_domain: String,
    pub rank: u32,
    pub incarnation: u64,
    pub uuid: String,
    pub fabric_uri: String,
    pub secondary_fabric_uris: Option<Vec<String>>,
    pub fabric_contexts: u32,
    pub secondary_fabric_contexts: Option<Vec<u32>>,
    pub info: String,
    pub last_update: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SystemQueryResp {
    pub members: Vec<Member>,
    pub providers: Vec<String>,
}

/// `dmg storage format -j` response.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct StorageFormatResp {
    pub host_errors: BTreeMap<String, HostErrorSet>,
    #[serde(rename = "HostStorage")]
    pub host_storage: BTreeMap<String, HostStorageSet>,
}

/// `dmg storage query usage -j` response: each host's `HostStorage` as
/// that host reported it (crate::server's `storage_usage`).
#[derive(Debug, Clone, Serialize, Default)]
pub struct StorageUsageResp {
    pub host_errors: BTreeMap<String, HostErrorSet>,
    #[serde(rename = "HostStorage")]
    pub host_storage: BTreeMap<String, UsageHostSet>,
}

#[derive(Debug, Clone, Serialize)]
pub struct UsageHostSet {
    pub hosts: String,
    pub storage: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostErrorSet {
    pub hosts: String,
    pub error: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostStorageSet {
    pub hosts: String,
    pub storage: HostStorage,
}

/// What one host reports after formatting.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct HostStorage {
    pub scm_mount_points: Vec<ScmMountResult>,
    pub nvme_devices: Vec<NvmeResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct ScmMountResult {
    pub info: String,
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct NvmeResult {
    pub info: String,
    pub pci_addr: String,
}

/// `dmg system stop -j` response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SystemStopResp {
    #[serde(rename = "Results")]
    pub results: Vec<RankResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankResult {
    pub state: String,
    #[serde(rename = "Addr")]
    pub addr: String,
    #[serde(rename = "Rank")]
    pub rank: u32,
    #[serde(rename = "Action")]
    pub action: String,
    #[serde(rename = "Errored")]
    pub errored: bool,
    #[serde(rename = "Msg")]
    pub msg: String,
}

/// `dmg pool create -j` response (control.PoolCreateResp).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolCreateResp {
    pub uuid: String,
    pub svc_ldr: u32,
    pub svc_reps: Vec<u32>,
    pub tgt_ranks: Vec<u32>,
    pub tier_bytes: Vec<u64>,
    pub mem_file_bytes: u64,
    pub md_on_ssd_active: bool,
}

/// `daos container create -j` response (the simulator's own shape).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContCreateResp {
    pub pool_uuid: String,
    pub container_uuid: String,
    pub container_label: String,
    pub container_type: String,
}

/// `daos filesystem copy -j` response (the simulator's own shape): where
/// the bytes went on every bdev of each rank (docs/daos-sim.md, layout).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContWriteResp {
    pub pool_uuid: String,
    pub container_uuid: String,
    pub bytes: u64,
    pub offset: u64,
    pub ranks: Vec<u32>,
}

/// `daos filesystem copy --src daos://POOL/CONT -j` response (the
/// simulator's own shape): what the container holds, read back from every
/// bdev of each of its pool's ranks (they agreed).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContReadResp {
    pub pool_uuid: String,
    pub container_uuid: String,
    pub data: String,
    pub ranks: Vec<u32>,
}

/// A random version-4 UUID from /dev/urandom (falls back to time and PID
/// when that is missing, e.g. a bare chroot).
pub fn new_uuid() -> String {
    let mut b = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok();
    if !ok {
        let n = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ (u128::from(std::process::id()) << 64);
        b = n.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Now as RFC 3339 UTC with nanoseconds, like Go's `time.Time` JSON.
pub fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_nanos())
}

fn rfc3339(secs: u64, nanos: u32) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(secs as i64)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        + time::Duration::nanoseconds(i64::from(nanos));
    t.format(time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:9]Z"
    ))
    .unwrap_or_else(|_| format!("@{secs}.{nanos:09}"))
}

/// Compresses `host:port` names like DAOS's hostlist package:
/// `da1:10001,da2:10001,da3:10001` → `da[1-3]:10001`. Names without a
/// trailing number are listed as they are.
pub fn compress_hosts(hosts: &[String]) -> String {
    let mut groups: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    let mut plain: Vec<String> = Vec::new();
    for h in hosts {
        let (name, port) = match h.rsplit_once(':') {
            Some((n, p)) => (n, format!(":{p}")),
            None => (h.as_str(), String::new()),
        };
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let prefix = &name[..name.len() - digits];
        let is_ip = name.parse::<std::net::IpAddr>().is_ok();
        match name[name.len() - digits..].parse::<u64>() {
            Ok(n)
                if digits > 0
                    && !is_ip
                    && (digits == 1 || !name[prefix.len()..].starts_with('0')) =>
            {
                groups
                    .entry((prefix.to_string(), port))
                    .or_default()
                    .push(n)
            }
            _ => plain.push(h.clone()),
        }
    }
    let mut out: Vec<String> = Vec::new();
    for ((prefix, port), mut nums) in groups {
        nums.sort_unstable();
        nums.dedup();
        if nums.len() == 1 {
            out.push(format!("{prefix}{}{port}", nums[0]));
            continue;
        }
        let ranges = ranges(&nums);
        out.push(format!("{prefix}[{}]{port}", ranges));
    }
    plain.sort();
    out.extend(plain);
    out.join(",")
}

/// `1,2,3,5` → `1-3,5` (input sorted, deduplicated).
fn ranges(nums: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nums.len() {
        let mut j = i;
        while j + 1 < nums.len() && nums[j + 1] == nums[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            nums[i].to_string()
        } else {
            format!("{}-{}", nums[i], nums[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Compresses ranks like dmg's human output: `[0-3]`.
pub fn compress_ranks(ranks: &[u32]) -> String {
    let mut n: Vec<u64> = ranks.iter().map(|r| u64::from(*r)).collect();
    n.sort_unstable();
    n.dedup();
    format!("[{}]", ranges(&n))
}

/// FNV-1a 64 of a string: the key of a `HostStorage` group (DAOS uses a
/// structure hash there; any stable number serves).
pub fn fnv64(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Parses dmg `--size` values: plain bytes or with a K/M/G/T/P suffix
/// (decimal, as go-humanize's ParseBytes; `KiB`/`GiB` ... are binary).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let mult: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "p" | "pb" => 1e15,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        "pib" => 1024f64.powi(5),
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && v >= 1.0).then_some(v as u64)
}

/// The log file named in the config (`control_log_file`, agent `log_file`),
/// written in addition to stderr.
static LOG_FILE: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

/// Opens (appends to) the log file; an error is reported, not fatal.
pub fn set_log_file(path: &str) {
    match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        Ok(f) => {
            let _ = LOG_FILE.set(Mutex::new(f));
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "daos-sim: cannot open log file {path}: {e}"
            );
        }
    }
}

/// One log line: `<RFC 3339> <who>: <msg>` on stderr and in the log file.
/// A line that cannot be written is lost, never fatal: `eprintln!` panics
/// when the write fails, and a server whose log file's disk filled for a
/// moment died with exit 101 in the middle of a line (issue 13; this
/// machine's disk fills now and then while others build).
pub fn log_line(who: &str, msg: &str) {
    let line = format!("{} {who}: {msg}", now_rfc3339());
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Some(f) = LOG_FILE.get() {
        let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_compress_like_dmg() {
        let h = |v: &[&str]| compress_hosts(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            h(&["da1:10001", "da2:10001", "da3:10001", "da4:10001"]),
            "da[1-4]:10001"
        );
        assert_eq!(h(&["da1:10001"]), "da1:10001");
        assert_eq!(h(&["da1:1", "da3:1"]), "da[1,3]:1");
        assert_eq!(
            h(&["127.0.0.1:5", "127.0.0.1:6"]),
            "127.0.0.1:5,127.0.0.1:6"
        );
        assert_eq!(compress_ranks(&[0, 1, 2, 3]), "[0-3]");
        assert_eq!(compress_ranks(&[2]), "[2]");
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(1_798_761_600, 5), "2027-01-01T00:00:00.000000005Z");
    }

    #[test]
    fn uuids_are_v4() {
        let u = new_uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uuid());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10G"), Some(10_000_000_000));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("0"), None);
    }
}
