//! A `--stor nvmeof` lease on the job's host: the lease's random host
//! identity, the connect to every node's export, the devices handed to
//! the job's owner, and the cleanup's `disconnect` (gpuq-fabrics does the
//! kernel's part).

use gpuq_fabrics::{Namespace, Sysfs, Target};
use gpuq_protocol::node::{nvmeof_host_nqn, ExportReport, NQN_PREFIX};
use std::time::{Duration, Instant};

/// The lease's host identity: a token (its host NQN is
/// [`nvmeof_host_nqn`] of it) and a host ID (a version-4 UUID), both
/// random, never written where a user can read them.
#[derive(Clone, PartialEq, Eq)]
pub struct HostIdentity {
    pub token: String,
    pub host_id: String,
}

impl std::fmt::Debug for HostIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostIdentity(…)")
    }
}

impl HostIdentity {
    pub fn generate() -> Result<HostIdentity, String> {
        let mut b = [0u8; 32];
        getrandom::getrandom(&mut b).map_err(|e| format!("no randomness for the host NQN: {e}"))?;
        let hex = |s: &[u8]| s.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let mut u = [0u8; 16];
        u.copy_from_slice(&b[16..]);
        u[6] = (u[6] & 0x0f) | 0x40;
        u[8] = (u[8] & 0x3f) | 0x80;
        let u = hex(&u);
        Ok(HostIdentity {
            token: hex(&b[..16]),
            host_id: format!(
                "{}-{}-{}-{}-{}",
                &u[..8],
                &u[8..12],
                &u[12..16],
                &u[16..20],
                &u[20..]
            ),
        })
    }

    pub fn host_nqn(&self) -> String {
        nvmeof_host_nqn(&self.token).unwrap_or_default()
    }
}

/// One node's namespaces as the job's host sees them.
#[derive(Debug, Clone)]
pub struct Connected {
    pub node: String,
    pub controller: String,
    pub namespaces: Vec<Namespace>,
}

/// Connect to one node's export and wait (until `deadline`) for all its
/// namespaces' block devices; then give each to `uid`. Blocking.
pub fn connect_one(
    r: &ExportReport,
    who: &HostIdentity,
    uid: u32,
    within: Duration,
) -> Result<Connected, String> {
    let t0 = Instant::now();
    let e = &r.export;
    let target = Target {
        transport: e.transport.clone(),
        traddr: e.address.clone(),
        trsvcid: e.port,
        subsys_nqn: e.subsystem_nqn.clone(),
        host_nqn: who.host_nqn(),
        host_id: who.host_id.clone(),
    };
    let controller = gpuq_fabrics::connect(&target).map_err(|m| format!("{}: {m}", r.node))?;
    let sys = Sysfs::default();
    let namespaces = loop {
        let found = sys
            .namespaces_of(&e.subsystem_nqn)
            .map_err(|m| format!("{}: {m}", r.node))?;
        if found.len() >= e.namespaces.len() {
            break found;
        }
        if t0.elapsed() >= within {
            return Err(format!(
                "{}: {} of {} namespace(s) of {} appeared on this host within {}s",
                r.node,
                found.len(),
                e.namespaces.len(),
                e.subsystem_nqn,
                within.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for ns in &namespaces {
        gpuq_fabrics::give_to(ns, uid).map_err(|m| format!("{}: {m}", r.node))?;
    }
    Ok(Connected {
        node: r.node.clone(),
        controller,
        namespaces,
    })
}

/// Whether an unprivileged user of this host could reach a node's NVMe/TCP
/// listener: a TCP connect to `address:port` from a thread whose
/// filesystem identity is `nobody` (65534; the socket's owner, as the
/// firewall's owner match sees it). The kernel's target has no
/// authentication here (Debian 12's kernel is built without NVMe
/// DH-CHAP), and the lease's host NQN is readable by anyone on this host
/// (`/sys/class/nvme/nvmeN/hostnqn`, 0444): a user who reached the port
/// could speak NVMe/TCP from user space as the lease's host and read or
/// write another user's namespaces. The operator's firewall rule
/// (docs/operations.md) rejects it; this checks that it does, before any
/// device is connected. `Ok(())`: refused, unreachable or timed out.
pub async fn unprivileged_cannot_reach(node: &str, address: &str, port: u16) -> Result<(), String> {
    let ip: std::net::IpAddr = address
        .parse()
        .map_err(|e| format!("{node}: export address {address:?}: {e}"))?;
    let to = std::net::SocketAddr::new(ip, port);
    let nobody = gpuq_sys::fsid::FsIdentity {
        uid: 65534,
        gid: 65534,
        groups: Vec::new(),
    };
    let r = gpuq_sys::fsid::run_as(nobody, Duration::from_secs(10), move || {
        std::net::TcpStream::connect_timeout(&to, Duration::from_secs(3)).map(|_| ())
    })
    .await;
    match r {
        Ok(Ok(())) => Err(format!(
            "{node}: an unprivileged user of this host can connect to its NVMe/TCP listener {to}, \
             and NVMe/TCP has no authentication here: add the firewall rule that rejects \
             non-root sockets to port {port} (docs/operations.md, \"Kernel storage jobs\") and submit again"
        )),
        Ok(Err(_)) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(()),
        Err(e) => Err(format!("{node}: cannot check who reaches {to}: {e}")),
    }
}

/// The subsystem-NQN prefix of every node's export of `lease`.
pub fn lease_prefix(lease: &str) -> String {
    format!("{NQN_PREFIX}{lease}:")
}

/// The cleanup's `disconnect`: every controller of the lease's subsystems
/// on this host deleted, confirmed by sysfs (none left, none of their
/// block devices left). Idempotent. Blocking.
pub fn disconnect_lease(lease: &str) -> Result<String, String> {
    let sys = Sysfs::default();
    let prefix = lease_prefix(lease);
    let ctrls = sys.controllers_of(&prefix)?;
    for (c, _, _) in &ctrls {
        sys.disconnect(c)?;
    }
    let left = sys.controllers_of(&prefix)?;
    let mut disks = Vec::new();
    for (_, nqn, _) in &ctrls {
        disks.extend(sys.namespaces_of(nqn)?.into_iter().map(|n| n.name));
    }
    if !left.is_empty() || !disks.is_empty() {
        return Err(format!(
            "disconnect not confirmed: controllers left {:?}, devices left {:?}",
            left.iter().map(|c| &c.0).collect::<Vec<_>>(),
            disks
        ));
    }
    Ok(if ctrls.is_empty() {
        "no controller of this lease on this host".into()
    } else {
        format!(
            "deleted {}; none is left",
            ctrls
                .iter()
                .map(|(c, n, _)| format!("{c} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The job's variables: `GPUQ_STOR_KIND`, `GPUQ_STOR_DEVICES` (every
/// device, space-separated, in node order) and `GPUQ_STOR_DEVICES_<NODE>`
/// (the node's name upper-cased, other than letters and digits `_`).
pub fn job_env(connected: &[Connected]) -> Vec<(String, String)> {
    let paths = |c: &Connected| {
        c.namespaces
            .iter()
            .map(|n| n.path.display().to_string())
            .collect::<Vec<_>>()
    };
    let mut env = vec![
        ("GPUQ_STOR_KIND".to_string(), "nvmeof".to_string()),
        (
            "GPUQ_STOR_DEVICES".to_string(),
            connected
                .iter()
                .flat_map(paths)
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ];
    for c in connected {
        env.push((
            format!("GPUQ_STOR_DEVICES_{}", env_name(&c.node)),
            paths(c).join(" "),
        ));
    }
    env
}

/// A node's name in a variable's: upper-cased, other than letters and
/// digits `_`.
pub fn env_name(node: &str) -> String {
    node.chars()
        .map(|ch| {
            if ch.is_ascii_alphanumeric() {
                ch.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_identity_is_random_hex_and_a_v4_uuid() {
        let a = HostIdentity::generate().unwrap();
        let b = HostIdentity::generate().unwrap();
        assert_ne!(a, b);
        assert!(
            a.host_nqn().starts_with("nqn.2026-12.io.gpuq:host:"),
            "{}",
            a.host_nqn()
        );
        assert_eq!(a.host_id.len(), 36);
        assert_eq!(&a.host_id[14..15], "4");
        assert!(
            format!("{a:?}").find(&a.token).is_none(),
            "the token is not logged"
        );
    }

    #[test]
    fn the_job_gets_every_device_and_each_node_s() {
        let ns = |n: &str| Namespace {
            name: n.into(),
            path: format!("/dev/{n}").into(),
            nsid: 1,
            devnum: "259:9".into(),
            size_bytes: 1,
        };
        let c = vec![
            Connected {
                node: "da1".into(),
                controller: "nvme5".into(),
                namespaces: vec![ns("nvme5n1")],
            },
            Connected {
                node: "da-4".into(),
                controller: "nvme8".into(),
                namespaces: vec![ns("nvme8n1"), ns("nvme8n2")],
            },
        ];
        let env = job_env(&c);
        let get = |k: &str| env.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("GPUQ_STOR_DEVICES"),
            Some("/dev/nvme5n1 /dev/nvme8n1 /dev/nvme8n2")
        );
        assert_eq!(get("GPUQ_STOR_DEVICES_DA1"), Some("/dev/nvme5n1"));
        assert_eq!(
            get("GPUQ_STOR_DEVICES_DA_4"),
            Some("/dev/nvme8n1 /dev/nvme8n2")
        );
    }
}
