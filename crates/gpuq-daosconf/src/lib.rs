//! `daos_server.yml`, rendered for exactly one DAOS version.
//!
//! DAOS parses its server configuration strictly (`yaml.UnmarshalStrict`): an
//! unknown key is fatal, so what we write must match the pinned image's
//! version (docs/daos-facts.md, "Versions"):
//! - 2.8 names the management-service replicas `mgmt_svc_replicas`
//!   (`access_points` is deprecated there; giving both is an error);
//! - 2.6 only knows `access_points`;
//! - the replica count must be odd (1 or 3 here);
//! - 2.8 (and 2.6.5) refuse to start while transparent hugepages are not
//!   `[never]` unless `allow_thp: true`.
//!
//! Only keys listed in docs/daos-facts.md are written, plus `fault_path`
//! (a documented server key) where hosts share a hostname; server logs go
//! to the container's output, which the node helper keeps per lease.
//!
//! Every value is validated to a small character set before it is written,
//! so the output needs no YAML quoting rules beyond single quotes, and no
//! input can inject a key. Each lease renders its own file with its own
//! `control_metadata.path`: a server that finds old metadata rejoins the old
//! system instead of waiting for a format (daos.md "Why a fresh metadata
//! path per job").

use std::fmt::Write;
use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DaosVersion {
    /// 2.6.0 – 2.6.4
    V2_6,
    /// 2.6.5 (knows `allow_thp`)
    V2_6_5,
    /// 2.8.x
    V2_8,
}

impl DaosVersion {
    /// From an RPM version such as `2.6.4-1.el8` or `2.8.0`.
    pub fn parse(s: &str) -> Result<Self, RenderError> {
        let core = s.split(['-', '~']).next().unwrap_or("");
        let mut it = core.split('.').map(|p| p.parse::<u32>());
        match (it.next(), it.next(), it.next()) {
            (Some(Ok(2)), Some(Ok(6)), Some(Ok(p))) if p >= 5 => Ok(DaosVersion::V2_6_5),
            (Some(Ok(2)), Some(Ok(6)), _) => Ok(DaosVersion::V2_6),
            (Some(Ok(2)), Some(Ok(8)), _) => Ok(DaosVersion::V2_8),
            _ => Err(RenderError::Version(s.to_string())),
        }
    }
}

/// Where an engine's bulk storage lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bdev {
    /// Physical NVMe namespaces by PCI address (physical mode).
    Nvme { pci: Vec<String> },
    /// File-backed bdevs (test mode), `size_gib` each.
    File { paths: Vec<String>, size_gib: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    pub targets: u32,
    pub fabric_iface: String,
    pub fabric_iface_port: u16,
    pub scm_mount: String,
    pub scm_size_gib: u32,
    pub bdev: Bdev,
}

/// Everything a rendered `daos_server.yml` depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub version: DaosVersion,
    pub name: String,
    pub port: u16,
    /// Host names of the management-service replicas (1 or 3).
    pub replicas: Vec<String>,
    pub provider: String,
    /// The lease's own, new metadata directory.
    pub control_metadata: String,
    pub engines: Vec<Engine>,
    /// Test mode: no hugepages (file bdevs, ram SCM).
    pub disable_hugepages: bool,
    /// Only where the host cannot set THP to `[never]`.
    pub allow_thp: bool,
    /// The server's fault domain, e.g. `/da1`. DAOS derives it from the
    /// hostname when absent; set it where hosts share one hostname.
    pub fault_path: Option<String>,
    /// Where the server finds its lease's certificates (`daosCA.crt`,
    /// `server.crt`, `server.key`, `clients/`) inside its container:
    /// `transport_config` then requires mutual TLS. `None`:
    /// `allow_insecure: true`.
    pub cert_dir: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RenderError {
    #[error(
        "DAOS version '{0}' is not supported: gpuq renders configurations for 2.6.x and 2.8.x"
    )]
    Version(String),
    #[error("{field} '{value}' is not allowed: {why}")]
    Invalid {
        field: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("{0}")]
    Shape(String),
}

fn check(
    field: &'static str,
    value: &str,
    ok: fn(char) -> bool,
    why: &'static str,
) -> Result<(), RenderError> {
    if value.is_empty() || value.len() > 255 || !value.chars().all(ok) {
        return Err(RenderError::Invalid {
            field,
            value: value.to_string(),
            why,
        });
    }
    Ok(())
}

fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.".contains(c)
}

fn path(field: &'static str, value: &str) -> Result<(), RenderError> {
    check(
        field,
        value,
        |c| c.is_ascii_alphanumeric() || "-_./".contains(c),
        "use an absolute path of letters, digits, - _ . /",
    )?;
    if !value.starts_with('/') || value.split('/').any(|s| s == "..") {
        return Err(RenderError::Invalid {
            field,
            value: value.to_string(),
            why: "must be absolute and must not contain '..'",
        });
    }
    Ok(())
}

/// `0000:5e:00.0`
pub fn is_pci_address(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.char_indices()
            .filter(|(i, _)| ![4, 7, 10].contains(i))
            .all(|(_, c)| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

impl ServerConfig {
    fn validate(&self) -> Result<(), RenderError> {
        check("name", &self.name, name_char, "use letters, digits, - _ .")?;
        check(
            "provider",
            &self.provider,
            |c| c.is_ascii_alphanumeric() || "+_-;".contains(c),
            "e.g. ofi+tcp",
        )?;
        if !(1..=5).contains(&self.replicas.len()) || self.replicas.len() & 1 == 0 {
            return Err(RenderError::Shape(format!(
                "{} management-service replicas: DAOS needs an odd number (1 or 3)",
                self.replicas.len()
            )));
        }
        for r in &self.replicas {
            check("replica", r, name_char, "use a host name")?;
        }
        if self.port == 0 {
            return Err(RenderError::Shape("port 0 is not a control port".into()));
        }
        path("control_metadata", &self.control_metadata)?;
        if let Some(d) = &self.cert_dir {
            path("cert_dir", d)?;
        }
        if let Some(fp) = &self.fault_path {
            path("fault_path", fp)?;
        }
        if self.engines.is_empty() {
            return Err(RenderError::Shape("no engines".into()));
        }
        if self.allow_thp && self.version == DaosVersion::V2_6 {
            return Err(RenderError::Shape(
                "allow_thp is not a key before DAOS 2.6.5 (the strict parser would refuse the file)".into(),
            ));
        }
        for e in &self.engines {
            check(
                "fabric_iface",
                &e.fabric_iface,
                name_char,
                "use an interface name",
            )?;
            path("scm_mount", &e.scm_mount)?;
            if e.targets == 0 || e.scm_size_gib == 0 {
                return Err(RenderError::Shape(
                    "targets and scm_size must be positive".into(),
                ));
            }
            match &e.bdev {
                Bdev::Nvme { pci } => {
                    if pci.is_empty() {
                        return Err(RenderError::Shape(
                            "an nvme bdev needs at least one PCI address".into(),
                        ));
                    }
                    for p in pci {
                        if !is_pci_address(p) {
                            return Err(RenderError::Invalid {
                                field: "bdev_list",
                                value: p.clone(),
                                why: "expected a PCI address such as 0000:5e:00.0",
                            });
                        }
                    }
                }
                Bdev::File { paths, size_gib } => {
                    if paths.is_empty() || *size_gib == 0 {
                        return Err(RenderError::Shape(
                            "a file bdev needs paths and a positive size".into(),
                        ));
                    }
                    for p in paths {
                        path("bdev_list", p)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The YAML text for this configuration.
    pub fn render(&self) -> Result<String, RenderError> {
        self.validate()?;
        let mut y = String::new();
        let _ = writeln!(
            y,
            "# Rendered by gpuq for DAOS {:?}; do not edit.",
            self.version
        );
        let _ = writeln!(y, "name: {}", self.name);
        let _ = writeln!(y, "port: {}", self.port);
        let key = match self.version {
            DaosVersion::V2_8 => "mgmt_svc_replicas",
            DaosVersion::V2_6 | DaosVersion::V2_6_5 => "access_points",
        };
        let _ = writeln!(y, "{key}: {}", list(&self.replicas));
        let _ = writeln!(y, "provider: {}", self.provider);
        match &self.cert_dir {
            // DAOS's keys (security/config.go); client_cert_dir holds the
            // agent's certificate (utils/config/daos_server.yml).
            Some(d) => {
                let _ = writeln!(
                    y,
                    "transport_config:\n  allow_insecure: false\n  client_cert_dir: {d}/clients\n  ca_cert: {d}/daosCA.crt\n  cert: {d}/server.crt\n  key: {d}/server.key"
                );
            }
            None => {
                let _ = writeln!(y, "transport_config:\n  allow_insecure: true");
            }
        }
        let _ = writeln!(y, "control_metadata:\n  path: {}", self.control_metadata);
        let _ = writeln!(y, "disable_vfio: true");
        if let Some(fp) = &self.fault_path {
            let _ = writeln!(y, "fault_path: {fp}");
        }
        if self.disable_hugepages {
            let _ = writeln!(y, "disable_hugepages: true");
        }
        if self.allow_thp {
            let _ = writeln!(y, "allow_thp: true");
        }
        let _ = writeln!(y, "engines:");
        for e in &self.engines {
            let _ = writeln!(y, "  - targets: {}", e.targets);
            let _ = writeln!(y, "    fabric_iface: {}", e.fabric_iface);
            let _ = writeln!(y, "    fabric_iface_port: {}", e.fabric_iface_port);
            let _ = writeln!(y, "    storage:");
            let _ = writeln!(
                y,
                "      - class: ram\n        scm_mount: {}\n        scm_size: {}",
                e.scm_mount, e.scm_size_gib
            );
            match &e.bdev {
                Bdev::Nvme { pci } => {
                    let _ = writeln!(y, "      - class: nvme\n        bdev_list: {}", list(pci));
                }
                Bdev::File { paths, size_gib } => {
                    let _ = writeln!(
                        y,
                        "      - class: file\n        bdev_list: {}\n        bdev_size: {size_gib}",
                        list(paths)
                    );
                }
            }
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(version: DaosVersion) -> ServerConfig {
        ServerConfig {
            version,
            name: "daos_server".into(),
            port: 10001,
            replicas: vec!["da1".into(), "da2".into(), "da3".into()],
            provider: "ofi+tcp".into(),
            control_metadata: "/var/lib/gpuqueue-daos/jobs/L42/control_meta".into(),
            engines: vec![Engine {
                targets: 4,
                fabric_iface: "eth0".into(),
                fabric_iface_port: 31416,
                scm_mount: "/mnt/daos".into(),
                scm_size_gib: 16,
                bdev: Bdev::Nvme {
                    pci: vec!["0000:5e:00.0".into()],
                },
            }],
            disable_hugepages: false,
            allow_thp: false,
            fault_path: None,
            cert_dir: None,
        }
    }

    #[test]
    fn a_cert_dir_turns_on_mutual_tls() {
        let y = cfg(DaosVersion::V2_8).render().unwrap();
        assert!(
            y.contains("transport_config:\n  allow_insecure: true\n"),
            "{y}"
        );
        let mut c = cfg(DaosVersion::V2_8);
        c.cert_dir = Some("/etc/daos/certs".into());
        let y = c.render().unwrap();
        assert!(
            y.contains(
                "transport_config:\n  allow_insecure: false\n  client_cert_dir: /etc/daos/certs/clients\n  ca_cert: /etc/daos/certs/daosCA.crt\n  cert: /etc/daos/certs/server.crt\n  key: /etc/daos/certs/server.key\n"
            ),
            "{y}"
        );
        c.cert_dir = Some("/etc/daos/certs\nallow_insecure: true".into());
        assert!(c.render().is_err());
    }

    #[test]
    fn version_picks_the_replica_key() {
        let y28 = cfg(DaosVersion::V2_8).render().unwrap();
        assert!(
            y28.contains("\nmgmt_svc_replicas: ['da1', 'da2', 'da3']\n"),
            "{y28}"
        );
        assert!(!y28.contains("access_points"));
        let y26 = cfg(DaosVersion::V2_6).render().unwrap();
        assert!(
            y26.contains("\naccess_points: ['da1', 'da2', 'da3']\n"),
            "{y26}"
        );
        assert!(!y26.contains("mgmt_svc_replicas"));
    }

    #[test]
    fn physical_and_test_storage() {
        let y = cfg(DaosVersion::V2_8).render().unwrap();
        assert!(
            y.contains("class: nvme\n        bdev_list: ['0000:5e:00.0']\n"),
            "{y}"
        );
        let mut t = cfg(DaosVersion::V2_8);
        t.disable_hugepages = true;
        t.engines[0].bdev = Bdev::File {
            paths: vec!["/var/lib/gpuqueue-daos-test/L42/bdev0".into()],
            size_gib: 16,
        };
        let y = t.render().unwrap();
        assert!(y.contains("class: file\n        bdev_list: ['/var/lib/gpuqueue-daos-test/L42/bdev0']\n        bdev_size: 16\n"), "{y}");
        assert!(y.contains("\ndisable_hugepages: true\n"));
        t.fault_path = Some("/da3".into());
        assert!(t.render().unwrap().contains("\nfault_path: /da3\n"));
        t.fault_path = Some("da3".into());
        assert!(t.render().is_err(), "a fault path is absolute");
    }

    #[test]
    fn refuses_what_daos_would_refuse() {
        let mut even = cfg(DaosVersion::V2_8);
        even.replicas.pop();
        assert!(even.render().unwrap_err().to_string().contains("odd"));
        let mut thp = cfg(DaosVersion::V2_6);
        thp.allow_thp = true;
        assert!(thp.render().is_err());
        thp.version = DaosVersion::V2_6_5;
        assert!(thp.render().unwrap().contains("\nallow_thp: true\n"));
    }

    #[test]
    fn refuses_values_that_could_inject_keys() {
        let mut c = cfg(DaosVersion::V2_8);
        c.name = "x\nport: 1".into();
        assert!(c.render().is_err());
        let mut c = cfg(DaosVersion::V2_8);
        c.control_metadata = "/var/lib/../etc".into();
        assert!(c.render().is_err());
        let mut c = cfg(DaosVersion::V2_8);
        c.engines[0].bdev = Bdev::Nvme {
            pci: vec!["0000:5E:00.0".into()],
        };
        assert!(c.render().is_err());
        let mut c = cfg(DaosVersion::V2_8);
        c.replicas[0] = "da1'".into();
        assert!(c.render().is_err());
    }

    #[test]
    fn versions_parse_from_rpm_strings() {
        assert_eq!(DaosVersion::parse("2.6.4-1.el8"), Ok(DaosVersion::V2_6));
        assert_eq!(DaosVersion::parse("2.6.5-2.el9"), Ok(DaosVersion::V2_6_5));
        assert_eq!(DaosVersion::parse("2.8.0"), Ok(DaosVersion::V2_8));
        assert!(DaosVersion::parse("2.4.1").is_err());
        assert!(DaosVersion::parse("latest").is_err());
    }
}
