//! DAOS's own checks of `daos_server.yml`, the ones `daos_server start`
//! makes before it touches hardware, reproduced rule by rule with DAOS's
//! fault codes and words. Paths are in daos-stack/daos (v2.6.4, v2.6.5,
//! v2.8.0; a rule that differs between versions says so):
//!
//! - `src/control/server/config/server.go` `Server.Validate`: the
//!   `system_ram_reserved` reservation (code 734), each engine's
//!   validation wrapped as `I/O Engine N failed config validation: …`;
//! - `src/control/server/storage/config.go` `TierConfigs.Validate`,
//!   `validateBdevRoles`, `Config.Validate`: the SCM tier first (216), no
//!   mix of real and emulated NVMe (309), each tier's own fields, the
//!   MD-on-SSD roles (312–319) and `control_metadata.path` (317, 318);
//!   `ScmConfig.Validate`: a ram-disk of at least 4 GiB (730);
//! - `src/control/server/config/server.go` `SetNrHugepages`,
//!   `SetRamdiskSize` and `src/control/server/storage/scm.go`
//!   `CalcRamdiskSize`: whether the host's RAM holds the hugepages, the
//!   engines' reservation, the ram-disk and `system_ram_reserved` (214,
//!   731), and the hugepage switches (726, 737; 2.6 refuses
//!   `disable_hugepages` beside any bdev, 2.8 only beside real NVMe);
//! - `src/control/server/mgmt_pool.go` `calculateCreateStorage`: a pool's
//!   per-rank SCM and NVMe minimums (604, 605; `engine/utils.go`).
//!
//! A fault reads as DAOS's `fault.Fault.Error()` prints it:
//! `storage: code = 317 description = "…"`.
//!
//! Which DAOS version the simulator plays is `$DAOS_SIM_VERSION` (an RPM
//! version, default 2.8.0): the version decides the default reservation,
//! the hugepage rule and which top-level keys exist.

use crate::config::{ServerConfig, TierConfig};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// `storage.MinRamdiskMem` (storage/scm.go).
pub const MIN_RAMDISK: u64 = 4 * GIB;
/// `storage.DefaultTgtMemRsvd`, `DefaultEngineMemRsvd` (storage/scm.go).
const TGT_MEM_RSVD: u64 = 128 * MIB;
const ENGINE_MEM_RSVD: u64 = GIB;
/// `memHugepageMinPerTarget` (storage/bdev.go).
const HUGE_PER_TARGET: u64 = GIB;
/// `engine.ScmMinBytesPerTarget`, `NvmeMinBytesPerTarget` (engine/utils.go).
pub const SCM_MIN_PER_TARGET: u64 = 16 * MIB;
pub const NVME_MIN_PER_TARGET: u64 = GIB;

/// The DAOS version the simulator plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// 2.6.0 – 2.6.4
    V2_6,
    /// 2.6.5: knows `allow_thp`.
    V2_6_5,
    /// 2.8.x: `mgmt_svc_replicas`.
    V2_8,
}

impl Version {
    /// From an RPM version such as `2.6.4-1.el8`.
    pub fn parse(s: &str) -> Option<Self> {
        let core = s.split(['-', '~']).next()?;
        let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
        match (it.next()?, it.next()?, it.next().flatten()) {
            (Some(2), Some(6), Some(p)) if p >= 5 => Some(Version::V2_6_5),
            (Some(2), Some(6), _) => Some(Version::V2_6),
            (Some(2), Some(8), _) => Some(Version::V2_8),
            _ => None,
        }
    }

    /// `$DAOS_SIM_VERSION`, else 2.8.
    pub fn from_env() -> Result<Self, String> {
        match std::env::var("DAOS_SIM_VERSION") {
            Ok(s) => Self::parse(&s).ok_or_else(|| {
                format!("DAOS_SIM_VERSION={s:?}: the simulator plays DAOS 2.6.x or 2.8.x")
            }),
            Err(_) => Ok(Version::V2_8),
        }
    }

    /// `storage.DefaultSysMemRsvd`: 16 GiB in 2.6, 64 GiB in 2.8.
    pub fn default_system_ram_reserved(self) -> u64 {
        match self {
            Version::V2_6 | Version::V2_6_5 => 16 * GIB,
            Version::V2_8 => 64 * GIB,
        }
    }
}

/// A DAOS fault: domain, code and description, printed as DAOS prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub domain: &'static str,
    pub code: u32,
    pub description: String,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: code = {} description = {:?}",
            self.domain, self.code, self.description
        )
    }
}

fn fault(domain: &'static str, code: u32, description: impl Into<String>) -> String {
    Fault {
        domain,
        code,
        description: description.into(),
    }
    .to_string()
}

/// go-humanize's `IBytes`: `16 MiB`, `4.0 GiB`, `1.5 GiB`.
pub fn ibytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 10 {
        return format!("{n} B");
    }
    let e = ((n as f64).ln() / 1024f64.ln()).floor() as usize;
    let val = n as f64 / 1024f64.powi(e as i32);
    let val = (val * 10.0 + 0.5).floor() / 10.0;
    if val < 10.0 {
        format!("{val:.1} {}", UNITS[e])
    } else {
        format!("{val:.0} {}", UNITS[e])
    }
}

/// The keys a version's strict parser does not know: yaml.v2's words.
pub fn check_version_keys(cfg: &ServerConfig, v: Version) -> Result<(), String> {
    let unknown = |k: &str| {
        Err(format!(
            "yaml: unmarshal errors:\n  field {k} not found in type config.Server"
        ))
    };
    if v != Version::V2_8 && cfg.mgmt_svc_replicas.is_some() {
        return unknown("mgmt_svc_replicas");
    }
    if v == Version::V2_6 && cfg.allow_thp {
        return unknown("allow_thp");
    }
    Ok(())
}

fn is_scm(t: &TierConfig) -> bool {
    matches!(t.class.as_str(), "ram" | "dcpm")
}

fn is_bdev(t: &TierConfig) -> bool {
    matches!(t.class.as_str(), "nvme" | "file" | "kdev")
}

/// `0000:5e:00.0`, as DAOS's PCIAddress parser takes it.
fn is_pci(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.char_indices()
            .filter(|(i, _)| ![4, 7, 10].contains(i))
            .all(|(_, c)| c.is_ascii_hexdigit())
}

#[derive(Default, Clone, Copy)]
struct Roles {
    wal: bool,
    meta: bool,
    data: bool,
}

fn roles(t: &TierConfig) -> Result<Roles, String> {
    let mut r = Roles::default();
    for s in &t.bdev_roles {
        match s.to_ascii_lowercase().as_str() {
            "wal" => r.wal = true,
            "meta" => r.meta = true,
            "data" => r.data = true,
            // BdevRoles.fromStrings
            other => return Err(format!("unrecognized bdev role value {other:?}")),
        }
    }
    Ok(r)
}

/// One tier's own fields (`TierConfig.Validate`).
fn validate_tier(t: &TierConfig) -> Result<(), String> {
    if is_scm(t) {
        if t.scm_mount.is_none() {
            return Err("no scm_mount set".into());
        }
        if t.class == "ram" {
            if !t.scm_list.is_empty() {
                return Err("scm_list may not be set when class is ram".into());
            }
            let size = t.scm_size.unwrap_or(0) * GIB;
            if size != 0 && size < MIN_RAMDISK {
                return Err(fault(
                    "storage",
                    730,
                    format!(
                        "configured ram-disk size {} is lower than the minimum ({}) required for SCM",
                        ibytes(size),
                        ibytes(MIN_RAMDISK)
                    ),
                ));
            }
        } else if t.scm_size.is_some() {
            return Err("scm_size may not be set when class is dcpm".into());
        } else if t.scm_list.is_empty() {
            return Err("scm_list must be set when class is dcpm".into());
        }
        return Ok(());
    }
    match t.class.as_str() {
        "file" => {
            if t.bdev_list.is_empty() {
                return Err("class file requires non-empty bdev_list".into());
            }
            if t.bdev_size.unwrap_or(0) == 0 {
                return Err("class file requires non-zero bdev_size".into());
            }
        }
        "kdev" => {
            if t.bdev_list.is_empty() {
                return Err("class kdev requires non-empty bdev_list".into());
            }
        }
        "nvme" => {
            if t.bdev_list.is_empty() || !t.bdev_list.iter().all(|a| is_pci(a)) {
                return Err("class nvme requires valid PCI addresses in bdev_list".into());
            }
        }
        other => {
            return Err(format!(
                "class value {other:?} not supported (valid: nvme/kdev/file)"
            ))
        }
    }
    Ok(())
}

/// An engine's storage (`storage.Config.Validate` with the server's
/// `control_metadata`).
pub fn validate_storage(tiers: &[TierConfig], control_metadata: bool) -> Result<(), String> {
    if tiers.is_empty() {
        return Err("no storage tiers configured".into());
    }
    if !tiers.iter().any(is_scm) {
        return Err(fault(
            "storage",
            216,
            "missing scm storage tier in engine storage config",
        ));
    }
    let real = tiers.iter().any(|t| t.class == "nvme");
    let emulated = tiers
        .iter()
        .any(|t| matches!(t.class.as_str(), "file" | "kdev"));
    if real && emulated {
        return Err(fault(
            "storage",
            309,
            "bdev tiers found with both emulated and non-emulated NVMe types specified in config",
        ));
    }
    for (i, t) in tiers.iter().enumerate() {
        validate_tier(t).map_err(|e| format!("tier {i} failed validation: {e}"))?;
    }
    // validateBdevRoles
    if tiers.iter().filter(|t| is_scm(t)).count() != 1 || !is_scm(&tiers[0]) {
        return Err("first storage tier is not scm".into());
    }
    let bdevs: Vec<&TierConfig> = tiers.iter().filter(|t| is_bdev(t)).collect();
    let (mut wal, mut meta, mut data) = (0, 0, 0);
    for (i, b) in bdevs.iter().enumerate() {
        let r = roles(b)?;
        let any = wal + meta + data > 0;
        if b.bdev_roles.is_empty() {
            if any {
                return Err(roles_missing());
            }
            continue;
        }
        if i != 0 && !any {
            return Err(roles_missing());
        }
        if r.wal && r.data && !r.meta {
            return Err(fault(
                "storage",
                319,
                "WAL and Data MD-on-SSD roles have been specified on a bdev tier without Meta role",
            ));
        }
        wal += usize::from(r.wal);
        meta += usize::from(r.meta);
        data += usize::from(r.data);
    }
    if wal + meta + data == 0 {
        if bdevs.len() > 1 {
            return Err(fault(
                "storage",
                315,
                "multiple bdev tiers but MD-on-SSD roles have not been specified",
            ));
        }
    } else {
        if tiers[0].class == "dcpm" {
            return Err(fault(
                "storage",
                312,
                "MD-on-SSD roles has been specified in config with scm class set to dcpm",
            ));
        }
        if bdevs.len() > 3 {
            return Err(fault(
                "storage",
                316,
                "only 1, 2 or 3 bdev tiers are supported when MD-on-SSD roles are specified",
            ));
        }
        for (role, n) in [("WAL", wal), ("Meta", meta), ("Data", data)] {
            if n != 1 {
                return Err(fault(
                    "storage",
                    313,
                    format!("found {n} {role} tiers, wanted 1"),
                ));
            }
        }
    }
    // storage.Config.Validate
    if bdevs.is_empty() || meta == 0 {
        if control_metadata {
            return Err(fault(
                "storage",
                317,
                "using 'control_metadata.path' requires MD-on-SSD roles",
            ));
        }
    } else if !control_metadata {
        return Err(fault(
            "storage",
            318,
            "'control_metadata.path' is required when MD-on-SSD roles are specified",
        ));
    }
    Ok(())
}

fn roles_missing() -> String {
    fault(
        "storage",
        314,
        "bdev tier MD-on-SSD roles have been specified on some but not all bdev tiers in config",
    )
}

/// `DAOS_SYS_NAME_MAX` (src/include/daos_types.h).
pub const MAX_SYSTEM_NAME: usize = 15;

/// `daos.SystemNameIsValid` (lib/daos/system_prop.go), as daos_server,
/// dmg and daos_agent check their config's `name`.
pub fn check_system_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SYSTEM_NAME {
        return Err(format!("invalid system name: {name:?}"));
    }
    Ok(())
}

/// `fault_path` as `newFaultDomainFromConfig` (server/faultdomain.go)
/// and `system.NewFaultDomainFromString` take it: from the root, one or
/// two levels, none empty and none with `=`.
pub fn check_fault_path(fp: &str) -> Result<(), String> {
    let fp = fp.trim();
    let invalid = |why: &str| fault("serverconfig", 717, format!("invalid fault domain: {why}"));
    if fp.is_empty() || fp == "/" {
        return Err(invalid("at least one domain level is required"));
    }
    let Some(rest) = fp.strip_prefix('/') else {
        return Err(invalid("fault path must start with root (/)"));
    };
    let levels: Vec<&str> = rest.split('/').collect();
    for l in &levels {
        let l = l.trim().trim_matches('"');
        if l.is_empty() {
            return Err(invalid("empty string is an invalid fault domain"));
        }
        if l.contains('=') {
            return Err(invalid("fault domain may not contain '='"));
        }
    }
    if levels.len() > 2 {
        return Err(fault(
            "serverconfig",
            724,
            "the fault domain path may have a maximum of 2 levels below the root",
        ));
    }
    Ok(())
}

/// What `Server.Validate` checks of a parsed config, for `v`.
pub fn validate_server(cfg: &ServerConfig, v: Version) -> Result<(), String> {
    check_version_keys(cfg, v)?;
    check_system_name(&cfg.name)?;
    if let Some(fp) = &cfg.fault_path {
        check_fault_path(fp)?;
    }
    if cfg.system_ram_reserved.is_some_and(|r| r <= 0) {
        return Err(fault(
            "serverconfig",
            734,
            "`system_ram_reserved` is set to zero in server config",
        ));
    }
    for (i, e) in cfg.engines.iter().enumerate() {
        if e.targets == 0 {
            return Err(format!(
                "I/O Engine {i} failed config validation: target count must be nonzero"
            ));
        }
        validate_storage(&e.storage, cfg.control_metadata.is_some())
            .map_err(|err| format!("I/O Engine {i} failed config validation: {err}"))?;
    }
    if cfg
        .nr_hugepages
        .is_some_and(|n| n < 0 || n > i64::from(i32::MAX))
    {
        return Err(fault(
            "serverconfig",
            725,
            format!(
                "number of hugepages specified ({}) is out of range (0 - {})",
                cfg.nr_hugepages.unwrap_or(0),
                i32::MAX
            ),
        ));
    }
    Ok(())
}

/// What `/proc/meminfo` says, as DAOS reads it (`MemTotal`, `Hugepagesize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    pub mem_total: u64,
    pub hugepage_size: u64,
}

impl MemInfo {
    pub fn parse(text: &str) -> Option<Self> {
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|k| k * KIB)
        };
        Some(MemInfo {
            mem_total: field("MemTotal")?,
            hugepage_size: field("Hugepagesize")?,
        })
    }
}

/// `SetNrHugepages` then `SetRamdiskSize`: whether this host's RAM holds
/// what the config asks for. Returns the hugepage count DAOS would set.
pub fn check_memory(cfg: &ServerConfig, v: Version, mem: MemInfo) -> Result<u64, String> {
    let (mut targets, mut sys_xs) = (0u64, 0u64);
    let mut real_nvme = false;
    for e in &cfg.engines {
        let bdevs: Vec<&TierConfig> = e.storage.iter().filter(|t| is_bdev(t)).collect();
        if bdevs.is_empty() {
            continue;
        }
        real_nvme |= bdevs.iter().any(|t| t.class == "nvme");
        targets += u64::from(e.targets);
        if bdevs
            .iter()
            .any(|t| t.bdev_roles.iter().any(|r| r == "meta"))
        {
            sys_xs += 1;
        } else if e.targets == 1 {
            targets += 1;
        }
    }
    let min_huge = if targets == 0 {
        0
    } else {
        (targets + sys_xs) * HUGE_PER_TARGET / mem.hugepage_size
    };
    let configured = cfg.nr_hugepages.unwrap_or(0).max(0) as u64;
    let nr = if cfg.disable_hugepages {
        let refused = match v {
            Version::V2_6 | Version::V2_6_5 => targets > 0,
            Version::V2_8 => real_nvme,
        };
        if refused {
            return Err(match v {
                Version::V2_6 | Version::V2_6_5 => fault(
                    "serverconfig",
                    726,
                    "hugepages cannot be disabled if bdevs have been specified in config",
                ),
                Version::V2_8 => fault(
                    "serverconfig",
                    726,
                    "hugepages cannot be disabled if nvme-bdevs have been specified in config",
                ),
            });
        }
        if configured != 0 && v == Version::V2_8 {
            return Err(fault(
                "serverconfig",
                737,
                "hugepages cannot be disabled if non-zero number has been specified in config",
            ));
        }
        0
    } else if configured == 0 {
        min_huge
    } else {
        configured
    };
    let Some(e0) = cfg.engines.first() else {
        return Ok(nr);
    };
    let Some(scm) = e0.storage.first().filter(|t| t.class == "ram") else {
        return Ok(nr);
    };
    let sys = match cfg.system_ram_reserved {
        Some(g) => g.max(0) as u64 * GIB,
        None => v.default_system_ram_reserved(),
    };
    let engines = cfg.engines.len() as u64;
    let eng = (u64::from(e0.targets) * TGT_MEM_RSVD).max(ENGINE_MEM_RSVD);
    let huge = nr * mem.hugepage_size;
    let rsvd = huge + sys + eng * engines;
    if mem.mem_total < rsvd {
        return Err(format!(
            "calculate ramdisk size: insufficient ram to meet minimum requirements (mem stats: total {} ({}) - (hugepages {} + sys rsvd {} + (engine rsvd {} * nr engines {}), engine rsvd: max({} tgts-per-engine * {}, {}))",
            ibytes(mem.mem_total),
            mem.mem_total,
            ibytes(huge),
            ibytes(sys),
            ibytes(eng),
            engines,
            e0.targets,
            ibytes(TGT_MEM_RSVD),
            ibytes(ENGINE_MEM_RSVD)
        ));
    }
    let max_ramdisk = (mem.mem_total - rsvd) / engines;
    if max_ramdisk < MIN_RAMDISK {
        let need = MIN_RAMDISK * engines + rsvd;
        return Err(fault(
            "storage",
            214,
            format!(
                "Total memory (RAM) insufficient for configured {} ram-disk size, want {} RAM but only have {}",
                ibytes(MIN_RAMDISK),
                ibytes(need),
                ibytes(mem.mem_total)
            ),
        ));
    }
    let conf = scm.scm_size.unwrap_or(0) * GIB;
    if conf > max_ramdisk {
        return Err(fault(
            "serverconfig",
            731,
            format!(
                "configured scm tmpfs size {} is larger than the maximum ({}) that total system memory (RAM) will allow",
                ibytes(conf),
                ibytes(max_ramdisk)
            ),
        ));
    }
    Ok(nr)
}

/// `calculateCreateStorage`'s minimums: each rank's share of a pool of
/// `total` bytes split 6 % SCM / 94 % NVMe (dmg's default tier ratio)
/// over `ranks` ranks of `targets` targets each.
pub fn pool_minimums(total: u64, ranks: u64, targets: u64) -> Result<[u64; 2], String> {
    let scm = (total as f64 * 0.06) as u64 / ranks;
    let nvme = (total as f64 * 0.94) as u64 / ranks;
    let min_scm = targets * SCM_MIN_PER_TARGET;
    let min_nvme = targets * NVME_MIN_PER_TARGET;
    let min_total = (min_scm + min_nvme) * ranks;
    if scm < min_scm {
        return Err(fault(
            "server",
            604,
            format!(
                "requested SCM capacity is too small (min {} per target)",
                ibytes(SCM_MIN_PER_TARGET)
            ),
        ) + &format!(
            ": retry the request with a pool size of at least {}, with at least {} SCM",
            ibytes(min_total + MIB),
            ibytes(min_scm * ranks + MIB)
        ));
    }
    if nvme != 0 && nvme < min_nvme {
        return Err(fault(
            "server",
            605,
            format!(
                "requested NVMe capacity too small (min {} per target)",
                ibytes(NVME_MIN_PER_TARGET)
            ),
        ) + &format!(
            ": retry the request with a pool size of at least {}, with at least {} NVMe",
            ibytes(min_total + MIB),
            ibytes(min_nvme * ranks + MIB)
        ));
    }
    Ok([scm, nvme])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_like_go_humanize() {
        assert_eq!(ibytes(16 * MIB), "16 MiB");
        assert_eq!(ibytes(4 * GIB), "4.0 GiB");
        assert_eq!(ibytes(GIB), "1.0 GiB");
        assert_eq!(ibytes(64 * GIB), "64 GiB");
        assert_eq!(ibytes(3 * GIB / 2), "1.5 GiB");
    }

    #[test]
    fn fault_paths_as_daos_takes_them() {
        assert!(check_fault_path("/da1").is_ok());
        assert!(check_fault_path("/rack1/da1").is_ok());
        assert!(check_fault_path("/a/b/c")
            .unwrap_err()
            .contains("code = 724"));
        assert!(check_fault_path("da1")
            .unwrap_err()
            .contains("must start with root"));
        assert!(check_fault_path("/a//b")
            .unwrap_err()
            .contains("code = 717"));
        assert!(check_fault_path("/")
            .unwrap_err()
            .contains("at least one domain level"));
    }

    #[test]
    fn versions() {
        assert_eq!(Version::parse("2.6.4-1.el8"), Some(Version::V2_6));
        assert_eq!(Version::parse("2.6.5"), Some(Version::V2_6_5));
        assert_eq!(Version::parse("2.8.0"), Some(Version::V2_8));
        assert_eq!(Version::parse("2.4.1"), None);
    }

    #[test]
    fn pool_minimums_per_target() {
        // 1 GiB over 4 ranks of 1 target: 6 % of 1 GiB / 4 = 15.4 MiB of
        // SCM per rank, under 16 MiB.
        let e = pool_minimums(GIB, 4, 1).unwrap_err();
        assert!(e.starts_with("server: code = 604 description = \"requested SCM capacity is too small (min 16 MiB per target)\""), "{e}");
        let e = pool_minimums(2 * GIB, 4, 1).unwrap_err();
        assert!(e.contains("code = 605"), "{e}");
        assert!(pool_minimums(5 * GIB, 4, 1).is_ok());
        assert!(pool_minimums(5 * GIB, 4, 4).is_err());
        assert!(pool_minimums(17 * GIB + GIB / 2, 4, 4).is_ok());
    }
}
