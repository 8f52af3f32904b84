//! A `--stor nvmeof` lease on one node: preflight, export, unexport. The
//! wipe is the physical lease's ([`NodeService::wipe`]): its block-device
//! checks refuse a device nvmet still exports (`nvmet_export`), so it can
//! only follow a confirmed unexport.
//!
//! - preflight (read-only): no other lease's record, container or DAOS
//!   engine here; nvmet loaded; **no subsystem but this lease's** in its
//!   tree (gpuq never shares the target); the listener's port free; the
//!   block-device checks and the claim of every allowlisted device;
//! - export: preflight again, then the lease record — devices, and every
//!   configfs object it will make ([`NvmetExport`]) — written durably
//!   **before** the first `mkdir`; then [`Nvmet::export`]. The listener is
//!   on the profile's address, the subsystem admits the lease's host NQN
//!   alone (random per lease, from the broker);
//! - unexport: [`Nvmet::unexport`] of what the record names, confirmed by
//!   reading the tree back ([`Nvmet::left_of`]); idempotent.

use crate::audit;
use crate::nvmet::{self, ExportError, Nvmet};

/// How long an export or unexport waits for another node helper's change
/// of the same kernel's NVMe target (each takes seconds).
const NVMET_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
use crate::profile::{Mode, StorDetail, StorProfile};
use crate::service::{io, Found, NodeError, NodeService};
use gpuq_podman::Podman;
use gpuq_protocol::node::StorKind;
use gpuq_protocol::node::{
    nvmeof_host_nqn, nvmeof_subsystem_nqn, ExportReport, ExportRequest, ExportedNamespace, Finding,
    LeaseMode, NodeLease, NvmetExport, PreflightReport, StepReport,
};

impl<P: Podman> NodeService<P> {
    fn stor_profile(&self, name: &str) -> Result<&StorProfile, NodeError> {
        self.config()
            .stor
            .get(name)
            .ok_or_else(|| NodeError::NoProfile(name.to_string()))
    }

    /// Whether `name` is a `[stor.NAME]` profile of this node.
    pub fn is_stor_profile(&self, name: &str) -> bool {
        self.config().stor.contains_key(name)
    }

    /// Preflight of a `--stor` lease (read-only), and the devices found.
    pub(crate) async fn check_stor(
        &self,
        lease: &str,
        profile: &str,
    ) -> Result<(PreflightReport, Vec<Found>), NodeError> {
        Self::check_lease(lease)?;
        let profile = self.stor_profile(profile)?.clone();
        let mut findings = Vec::new();
        let mut find = |reason: &str, detail: String| {
            findings.push(Finding {
                reason: reason.to_string(),
                detail,
            })
        };
        self.foreign_findings(lease, &mut find).await?;
        if let StorDetail::Nfs { mkfs_image } = &profile.detail {
            self.check_nfs(lease, mkfs_image, &mut find).await;
        } else {
            self.check_nvmet(lease, &profile, &mut find);
        }
        match gpuq_sys::net::tcp_listening_ports() {
            Ok(l) if l.contains(&profile.port) => find(
                "port_in_use",
                format!(
                    "port {} (the {} listener's) is already listening",
                    profile.port,
                    if profile.kind == StorKind::Nfsrdma {
                        "NFS"
                    } else {
                        "NVMe-oF"
                    }
                ),
            ),
            Ok(_) => {}
            Err(e) => find("check_failed", format!("cannot read listening ports: {e}")),
        }
        let devices = self.check_devices(lease, &profile.name, &mut find);
        let report = PreflightReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            ok: findings.is_empty(),
            findings,
        };
        Ok((report, devices))
    }

    /// nvmet loaded, and no subsystem in it but this lease's.
    fn check_nvmet(&self, lease: &str, profile: &StorProfile, find: &mut dyn FnMut(&str, String)) {
        match Nvmet::open() {
            Ok(None) => find(
                "nvmet_missing",
                format!(
                    "the kernel NVMe target is not loaded ({} is absent): load nvmet and nvmet_{} at boot (docs/operations.md, --stor nvmeof)",
                    nvmet::ROOT,
                    profile.transport
                ),
            ),
            Ok(Some(t)) => match t.foreign(lease) {
                Ok(f) => {
                    for s in f {
                        find(
                            "foreign_subsystem",
                            format!("the kernel NVMe target already exports subsystem {s}, which is not this lease's; gpuq never shares the target"),
                        );
                    }
                }
                Err(e) => find("check_failed", e),
            },
            Err(e) => find("check_failed", e),
        }
    }

    /// `POST /v1/leases/{lease}/export`.
    pub async fn export(
        &self,
        lease: &str,
        req: &ExportRequest,
    ) -> Result<ExportReport, NodeError> {
        Self::check_lease(lease)?;
        let profile = self.stor_profile(&req.profile)?.clone();
        if profile.kind != StorKind::Nvmeof {
            return Err(NodeError::BadRequest(format!(
                "[stor.{}] is not a --stor nvmeof profile",
                profile.name
            )));
        }
        let host_nqn = nvmeof_host_nqn(&req.host_token).ok_or_else(|| {
            NodeError::BadRequest("host_token: expected 32 lowercase hex digits".into())
        })?;
        if let Some(rec) = self.lease_record()?.filter(|r| r.lease == lease) {
            return match (rec.phase.as_str(), rec.export) {
                // Asked again (a link re-made mid-call): the same answer.
                ("exported", Some(export)) if export.host_nqn == host_nqn => Ok(ExportReport {
                    node: self.node_name().to_string(),
                    lease: lease.to_string(),
                    export,
                }),
                (phase, _) => Err(NodeError::Refused(format!(
                    "lease {lease} is already {phase} on this node; an export is made once (the cleanup unexports it)"
                ))),
            };
        }
        let (pre, found) = self.check_stor(lease, &profile.name).await?;
        if !pre.ok {
            return Err(NodeError::Preflight {
                lease: lease.to_string(),
                findings: pre.findings,
            });
        }
        let target = Nvmet::open()
            .map_err(NodeError::Failed)?
            .ok_or_else(|| NodeError::Failed("nvmet was unloaded during the export".into()))?;
        // From the port ID's pick to the listener: no other change of this
        // kernel's target between (nvmet's own race, nvmet.rs).
        let _one_change = target
            .lock(NVMET_LOCK_WAIT)
            .await
            .map_err(NodeError::Failed)?;
        let mut export = NvmetExport {
            subsystem_nqn: nvmeof_subsystem_nqn(lease, self.node_name()),
            host_nqn,
            port_id: target
                .free_port_id(nvmet::port_seed(self.node_name()))
                .map_err(NodeError::Failed)?,
            transport: profile.transport.clone(),
            address: profile.address.to_string(),
            port: profile.port,
            namespaces: found
                .iter()
                .zip(1u32..)
                .map(|(f, nsid)| ExportedNamespace {
                    nsid,
                    device_path: f.path.clone(),
                    devnum: f.devnum.clone(),
                    device: f.device.clone(),
                })
                .collect(),
        };
        let lease_dir = self.lease_dir(lease);
        // Write before act: every object this export makes is named in the
        // record before the first exists.
        let mut rec =
            self.begin_stor_lease(lease, &profile.name, &found, Some(export.clone()), None)?;
        let mut tries = 0;
        loop {
            match target.export(&export) {
                Ok(()) => break,
                Err(ExportError::PortTaken(id)) if tries < 16 => {
                    // Another node sharing this kernel took the ID first.
                    tries += 1;
                    export.port_id = target
                        .free_port_id(id.wrapping_add(1).max(1))
                        .map_err(NodeError::Failed)?;
                    rec.export = Some(export.clone());
                    self.write_record(&rec)?;
                }
                Err(ExportError::PortTaken(id)) => {
                    return Err(NodeError::Failed(format!(
                        "no free nvmet port ID after {tries} tries (last {id})"
                    )))
                }
                Err(ExportError::Failed(why)) => {
                    let _ = audit::append(&lease_dir, "export", "failed", &why);
                    return Err(NodeError::Failed(format!(
                        "export of lease {lease} failed: {why} (the cleanup unexports what was made)"
                    )));
                }
            }
        }
        rec.phase = "exported".into();
        self.write_record(&rec)?;
        let detail = format!(
            "subsystem {} with {} namespace(s) ({}) on {} {}:{} (port {}), for the lease's host only",
            export.subsystem_nqn,
            export.namespaces.len(),
            export
                .namespaces
                .iter()
                .map(|n| format!("{} = {}", n.nsid, n.device_path))
                .collect::<Vec<_>>()
                .join(", "),
            export.transport,
            export.address,
            export.port,
            export.port_id
        );
        audit::append(&lease_dir, "export", "ok", &detail).map_err(io("audit"))?;
        Ok(ExportReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            export,
        })
    }

    /// The first durable step of a `--stor` export: the node's lease
    /// record (physical mode, the devices found, and what the export will
    /// make), then the lease's directory and its empty data directory (the
    /// physical wipe removes it after the devices, as for a DAOS lease; one
    /// already there is refused).
    pub(crate) fn begin_stor_lease(
        &self,
        lease: &str,
        profile: &str,
        found: &[Found],
        export: Option<NvmetExport>,
        nfs: Option<gpuq_protocol::node::NfsExport>,
    ) -> Result<NodeLease, NodeError> {
        let lease_dir = self.lease_dir(lease);
        let data_dir = self.data_dir(lease, Mode::Physical);
        let rec = NodeLease {
            lease: lease.to_string(),
            profile: profile.to_string(),
            phase: "exporting".into(),
            metadata_dir: data_dir.display().to_string(),
            container: None,
            since: audit::now(),
            mode: Some(LeaseMode::Physical),
            devices: found.iter().map(|f| f.device.clone()).collect(),
            export,
            nfs,
        };
        self.write_record(&rec)?;
        std::fs::create_dir_all(&lease_dir)
            .map_err(io(format!("create {}", lease_dir.display())))?;
        std::fs::create_dir(&data_dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                NodeError::Refused(format!(
                    "{} already exists: a lease needs a new one (wipe the old lease first)",
                    data_dir.display()
                ))
            } else {
                io(format!("create {}", data_dir.display()))(e)
            }
        })?;
        Ok(rec)
    }

    /// `POST /v1/leases/{lease}/unexport`: remove the lease's export and
    /// confirm that nothing of it is left in nvmet's tree.
    pub async fn unexport(&self, lease: &str) -> Result<StepReport, NodeError> {
        Self::check_lease(lease)?;
        let rec = self.lease_record()?;
        let report = |already_done: bool, detail: String| StepReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            already_done,
            detail,
        };
        let mut rec = match rec {
            Some(r) if r.lease != lease => {
                return Err(NodeError::Refused(format!(
                    "this node holds lease {}, not {lease}; nothing was unexported",
                    r.lease
                )))
            }
            Some(r) => r,
            None => return Ok(report(true, "no record of this lease on this node".into())),
        };
        if let Some(nfs) = rec.nfs.clone() {
            return self.nfs_unexport(lease, rec, nfs).await;
        }
        let Some(export) = rec.export.clone() else {
            return Ok(report(
                true,
                "this lease exported nothing on this node".into(),
            ));
        };
        let lease_dir = self.lease_dir(lease);
        let fail = |msg: String| {
            let _ = audit::append(&lease_dir, "unexport", "failed", &msg);
            NodeError::Failed(msg)
        };
        // `None`: nvmet is not loaded, so nothing of anyone's is exported.
        let target = Nvmet::open().map_err(&fail)?;
        let _one_change = match &target {
            Some(t) => Some(t.lock(NVMET_LOCK_WAIT).await.map_err(&fail)?),
            None => None,
        };
        let removed = match &target {
            Some(t) => t
                .unexport(&export)
                .map_err(|e| fail(format!("unexport: {e}")))?,
            None => Vec::new(),
        };
        let left = match &target {
            Some(t) => t
                .left_of(&export)
                .map_err(|e| fail(format!("confirm: {e}")))?,
            None => Vec::new(),
        };
        if !left.is_empty() {
            return Err(fail(format!(
                "unexport not confirmed: still in nvmet: {}",
                left.join(", ")
            )));
        }
        let already = removed.is_empty();
        if rec.phase != "unexported" {
            rec.phase = "unexported".into();
            self.write_record(&rec)?;
        }
        let detail = if already {
            format!("nothing of subsystem {} is left", export.subsystem_nqn)
        } else {
            format!("removed {}; nothing of it is left", removed.join(", "))
        };
        audit::append(&lease_dir, "unexport", "ok", &detail).map_err(io("audit"))?;
        Ok(report(already, detail))
    }
}
