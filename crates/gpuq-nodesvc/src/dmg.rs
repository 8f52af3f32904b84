//! `dmg` for the broker, in this node's server container of the lease.
//!
//! The broker formats the lease's system, polls its joins and stops it
//! with `dmg`. It runs where a container of the lease already runs — the
//! server container of one node (the first configured), as the original
//! ran `dmg` over ssh on a storage node — so a lease makes no container
//! for it on the GPU host. That node's start request carries a
//! [`DmgAccess`]: the lease's control configuration and admin certificate
//! go to `<lease_dir>/admin/` (0700 root) and are mounted read-only at
//! [`ADMIN_IN`] in the server container; the wipe removes them with the
//! server's certificates. A request names one [`DmgCommand`], never an
//! argument list.

use crate::service::{NodeError, NodeService};
use gpuq_daosconf::{ControlConfig, Transport};
use gpuq_podman::{ExecSpec, LogStream, Podman};
use gpuq_protocol::node::{DmgAccess, DmgReply, DmgRequest, ServerTls};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the server container sees `<lease_dir>/admin/`.
pub const ADMIN_IN: &str = "/etc/daos/admin";
/// The longest `dmg` a request may ask the node to wait for: the longest
/// deadline the broker's configuration accepts (`[daos]` deadlines, 1–86400 s).
pub const MAX_WITHIN_SECS: u64 = 86_400;

/// The access's directory in the lease directory.
const ADMIN_DIR: &str = "admin";

/// `<lease_dir>/admin/`.
pub fn admin_dir(lease_dir: &Path) -> PathBuf {
    lease_dir.join(ADMIN_DIR)
}

/// Write `<lease_dir>/admin/` (0700 root): `daos_control.yml` (0444),
/// `daosCA.crt`, `admin.crt` (0444) and `admin.key` (0400). A directory
/// left by an earlier start of the same lease is replaced.
pub fn write_admin(
    lease_dir: &Path,
    port: u16,
    tls: &ServerTls,
    access: &DmgAccess,
) -> Result<PathBuf, NodeError> {
    let control = ControlConfig {
        system: access.system.clone(),
        port,
        hostlist: access.hostlist.clone(),
        transport: Transport::in_dir(ADMIN_IN, "admin"),
    }
    .render(&format!(
        "Written by gpuq-node for the broker's dmg of lease {}.",
        lease_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ))
    .map_err(|e| NodeError::BadRequest(format!("dmg access: {e}")))?;
    crate::service::write_private_dir(
        lease_dir,
        ADMIN_DIR,
        &[],
        &[
            ("daos_control.yml", control.as_str(), 0o444),
            ("daosCA.crt", tls.ca_cert.as_str(), 0o444),
            ("admin.crt", access.admin_cert.as_str(), 0o444),
            ("admin.key", access.admin_key.as_str(), 0o400),
        ],
    )
}

impl<P: Podman> NodeService<P> {
    /// `POST /v1/leases/{lease}/dmg`: the command in the lease's server
    /// container, within `req.within_secs`. Refused (nothing run) unless
    /// `lease` is this node's lease, was started with dmg access here and
    /// its server container is recorded.
    pub async fn dmg(&self, lease: &str, req: &DmgRequest) -> Result<DmgReply, NodeError> {
        Self::check_lease(lease)?;
        if !(1..=MAX_WITHIN_SECS).contains(&req.within_secs) {
            return Err(NodeError::BadRequest(format!(
                "within_secs {} is out of range (1..={MAX_WITHIN_SECS})",
                req.within_secs
            )));
        }
        let rec = match self.lease_record()? {
            Some(r) if r.lease == lease => r,
            Some(r) => {
                return Err(NodeError::Refused(format!(
                    "lease {lease} is not this node's lease ({} is)",
                    r.lease
                )))
            }
            None => {
                return Err(NodeError::Refused(format!(
                    "no lease on this node, not {lease}"
                )))
            }
        };
        let conf = admin_dir(&self.lease_dir(lease)).join("daos_control.yml");
        if !conf.is_file() {
            return Err(NodeError::Refused(format!(
                "lease {lease} has no dmg access on node {} (not the lease's dmg node, started by an earlier version, or already wiped)",
                self.node_name()
            )));
        }
        let Some(container) = rec.container else {
            return Err(NodeError::Refused(format!(
                "lease {lease} has no server container on node {} (phase {})",
                self.node_name(),
                rec.phase
            )));
        };
        let conf_in = format!("{ADMIN_IN}/daos_control.yml");
        let mut cmd = vec!["dmg", "-o", conf_in.as_str(), "-j"];
        cmd.extend_from_slice(req.command.args());
        let out = self
            .podman()
            .container_exec_within(
                &container,
                &ExecSpec::new(cmd),
                Duration::from_secs(req.within_secs),
            )
            .await
            .map_err(|e| match e {
                // Not there, or not running (Podman answers 409): nothing ran.
                e if e.is_not_found() || matches!(e, gpuq_podman::Error::Conflict { .. }) => {
                    NodeError::Refused(format!(
                        "the server container of lease {lease} on node {} is not running: {e}",
                        self.node_name()
                    ))
                }
                e => NodeError::Podman(e),
            })?;
        let text = |s| String::from_utf8_lossy(&out.output.stream(s)).into_owned();
        Ok(DmgReply {
            node: self.node_name().to_string(),
            exit_code: out.exit_code,
            stdout: text(LogStream::Stdout),
            stderr: text(LogStream::Stderr),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_dmg_access_is_roots_alone_and_its_config_names_the_mounted_files() {
        let tmp = tempfile::tempdir().unwrap();
        let lease_dir = tmp.path().join("L1");
        std::fs::create_dir(&lease_dir).unwrap();
        let tls = ServerTls {
            ca_cert: "CA".into(),
            cert: "C".into(),
            key: "K".into(),
            agent_cert: "A".into(),
        };
        let access = DmgAccess {
            system: "daos_server".into(),
            hostlist: vec!["10.0.0.1".into(), "10.0.0.2".into()],
            admin_cert: "ADMIN-CERT".into(),
            admin_key: "ADMIN-KEY".into(),
        };
        // Twice: a repeated start of the same lease replaces it.
        write_admin(&lease_dir, 10001, &tls, &access).unwrap();
        let dir = write_admin(&lease_dir, 10001, &tls, &access).unwrap();
        assert_eq!(dir, admin_dir(&lease_dir));
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700);
        let mode = |f: &str| std::fs::metadata(dir.join(f)).unwrap().mode() & 0o7777;
        assert_eq!(mode("admin.key"), 0o400);
        assert_eq!(mode("admin.crt"), 0o444);
        assert_eq!(
            std::fs::read_to_string(dir.join("admin.key")).unwrap(),
            "ADMIN-KEY"
        );
        let conf = std::fs::read_to_string(dir.join("daos_control.yml")).unwrap();
        for want in [
            "/etc/daos/admin/admin.key",
            "/etc/daos/admin/admin.crt",
            "/etc/daos/admin/daosCA.crt",
            "10.0.0.2",
            "10001",
        ] {
            assert!(conf.contains(want), "{want}: {conf}");
        }
        // A symlink in its place is refused, not followed.
        std::fs::remove_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(tmp.path(), &dir).unwrap();
        assert!(write_admin(&lease_dir, 10001, &tls, &access).is_err());
    }
}
