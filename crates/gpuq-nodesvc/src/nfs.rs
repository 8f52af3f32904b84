//! A `--stor nfsrdma` lease on one node: an XFS made on each allowlisted
//! namespace, mounted under the lease's pseudo-root and exported by the
//! node's kernel NFS server to the lease's client alone. The wipe is the
//! physical lease's: it refuses a mounted device, so it can only follow a
//! confirmed unexport; XFS is the one signature it accepts from such a
//! lease.
//!
//! - preflight (read-only): no other lease's record or container here;
//!   nfsd loaded and exporting nothing; the mkfs image present; the NFS
//!   port free; the block-device checks and the claim of every device;
//! - export: preflight again, the record (every volume, mount and the
//!   server) written durably **before** anything is made; each XFS made
//!   by `mkfs.xfs` in the pinned image through Podman (xfsprogs has no
//!   library that makes a filesystem, stor-research §5; the container
//!   sees that one device, no network, CAP_SYS_ADMIN alone); the pseudo-root
//!   (a small tmpfs, so no file handle reaches the node's own
//!   filesystems) and each XFS mounted with `mount(2)` and checked by
//!   device number; each volume's root given to the job owner, 0700;
//!   then the upcall responder and the server ([`crate::nfsd`]);
//! - unexport: any mkfs container of the lease (a crash's) removed,
//!   responder stopped, server stopped, caches flushed, every
//!   mount of the lease unmounted (never lazily) and confirmed gone from
//!   mountinfo, the export cache confirmed empty of the lease. Idempotent.

use crate::audit;
use crate::nfsd::{self, Nfsd, Responder, Table};
use crate::profile::StorDetail;
use crate::service::{io, NodeError, NodeService};
use gpuq_podman::{lease_labels, ContainerSpec, ImageId, Namespace, Podman, Role};
use gpuq_protocol::node::{
    NfsExport, NfsExportReport, NfsExportRequest, NfsVolume, NodeLease, StepReport,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long one `mkfs.xfs` may take (it writes only metadata: `-K`).
const MKFS_DEADLINE: Duration = Duration::from_secs(180);
/// How many nfsd threads serve a lease.
const THREADS: u32 = 8;

impl<P: Podman> NodeService<P> {
    /// The nfsd control mount of `lease`.
    fn nfsd_dir(&self, lease: &str) -> PathBuf {
        self.lease_dir(lease).join("nfsd")
    }

    /// Preflight's `--stor nfsrdma` part.
    pub(crate) async fn check_nfs(
        &self,
        lease: &str,
        mkfs_image: &ImageId,
        find: &mut (dyn FnMut(&str, String) + Send),
    ) {
        if !nfsd::loaded() {
            find(
                "nfsd_missing",
                format!(
                    "the kernel NFS server is not loaded ({}/nfsd.export is absent): load nfsd at boot (docs/operations.md, --stor nfsrdma)",
                    nfsd::RPC
                ),
            );
        } else {
            let ours = self.lease_dir(lease).join("nfs");
            match nfsd::exported_paths() {
                Ok(paths) => {
                    for p in paths.iter().filter(|p| !Path::new(p).starts_with(&ours)) {
                        find(
                            "foreign_export",
                            format!("the kernel NFS server of this node already exports {p}, which is not this lease's; gpuq never shares the server"),
                        );
                    }
                }
                Err(e) => find("check_failed", e),
            }
        }
        match self.podman().image_inspect(mkfs_image).await {
            Ok(_) => {}
            Err(gpuq_podman::Error::NotFound { .. }) => find(
                "image_missing",
                format!("the pinned mkfs image {mkfs_image} is not in this node's storage"),
            ),
            Err(e) => find("check_failed", format!("image inspect: {e}")),
        }
    }

    /// `POST /v1/leases/{lease}/nfs-export`.
    pub async fn nfs_export(
        &self,
        lease: &str,
        req: &NfsExportRequest,
    ) -> Result<NfsExportReport, NodeError> {
        Self::check_lease(lease)?;
        let profile = self
            .config()
            .stor
            .get(&req.profile)
            .ok_or_else(|| NodeError::NoProfile(req.profile.clone()))?
            .clone();
        let StorDetail::Nfs { mkfs_image } = profile.detail.clone() else {
            return Err(NodeError::BadRequest(format!(
                "[stor.{}] is not a --stor nfsrdma profile",
                profile.name
            )));
        };
        let client: std::net::IpAddr = req.client_address.parse().map_err(|_| {
            NodeError::BadRequest(format!(
                "client_address: {:?} is not an IP address",
                req.client_address
            ))
        })?;
        if client.is_unspecified() || req.owner_uid == 0 {
            return Err(NodeError::BadRequest(
                "an export is for one client address and an owner other than root".into(),
            ));
        }
        if let Some(rec) = self.lease_record()?.filter(|r| r.lease == lease) {
            return match (rec.phase.as_str(), rec.nfs) {
                ("exported", Some(nfs))
                    if nfs.client_address == req.client_address
                        && nfs.owner_uid == req.owner_uid =>
                {
                    Ok(NfsExportReport {
                        node: self.node_name().to_string(),
                        lease: lease.to_string(),
                        nfs,
                    })
                }
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
        let lease_dir = self.lease_dir(lease);
        let nfs = NfsExport {
            transport: profile.transport.clone(),
            address: profile.address.to_string(),
            port: profile.port,
            client_address: client.to_string(),
            owner_uid: req.owner_uid,
            owner_gid: req.owner_gid,
            root: lease_dir.join("nfs").display().to_string(),
            volumes: found
                .iter()
                .zip(1u32..)
                .map(|(f, fsid)| NfsVolume {
                    name: Path::new(&f.path)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| format!("vol{fsid}")),
                    fsid,
                    device_path: f.path.clone(),
                    devnum: f.devnum.clone(),
                    device: f.device.clone(),
                })
                .collect(),
        };
        // Write before act: every volume, mount and the server are named
        // in the record before the first exists.
        let mut rec =
            self.begin_stor_lease(lease, &profile.name, &found, None, Some(nfs.clone()))?;
        let fail = |step: &str, why: String| {
            let _ = audit::append(&lease_dir, step, "failed", &why);
            NodeError::Failed(format!(
                "{step} of lease {lease} failed: {why} (the cleanup unexports what was made)"
            ))
        };
        // The filesystems, one container each (one after the other: the
        // four nodes make theirs at once).
        let t = std::time::Instant::now();
        let mut failed = Vec::new();
        for v in &nfs.volumes {
            if let Err(e) = self.mkfs(lease, &mkfs_image, v).await {
                failed.push(e);
            }
        }
        if !failed.is_empty() {
            return Err(fail("mkfs", failed.join("; ")));
        }
        audit::append(
            &lease_dir,
            "mkfs",
            "ok",
            &format!(
                "xfs on {} ({:.1}s)",
                nfs.volumes
                    .iter()
                    .map(|v| v.device_path.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                t.elapsed().as_secs_f64()
            ),
        )
        .map_err(io("audit"))?;
        let mounted = {
            let nfs = nfs.clone();
            tokio::task::spawn_blocking(move || mount_all(&nfs))
                .await
                .map_err(|e| {
                    NodeError::Failed(format!("the mounts ended without an answer: {e}"))
                })?
        };
        mounted.map_err(|e| fail("mount", e))?;
        // The responder first: the server's first upcall finds it.
        let table = Table::of(
            client,
            lease,
            Path::new(&nfs.root),
            &nfs.volumes
                .iter()
                .map(|v| (v.fsid, Path::new(&nfs.root).join(&v.name)))
                .collect::<Vec<_>>(),
        );
        let responder = Responder::start(table).map_err(|e| fail("export", e))?;
        *self.nfs_responder.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((lease.to_string(), responder));
        let ctl = Nfsd::mount(&self.nfsd_dir(lease)).map_err(|e| fail("export", e))?;
        ctl.start(
            std::net::SocketAddr::new(profile.address, profile.port),
            profile.transport == "rdma",
            THREADS,
        )
        .map_err(|e| fail("export", e))?;
        rec.phase = "exported".into();
        self.write_record(&rec)?;
        audit::append(
            &lease_dir,
            "export",
            "ok",
            &format!(
                "NFSv4.2 on {} {}:{} for {} alone: {}",
                nfs.transport,
                nfs.address,
                nfs.port,
                nfs.client_address,
                nfs.volumes
                    .iter()
                    .map(|v| format!("/{} = {} (fsid {})", v.name, v.device_path, v.fsid))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .map_err(io("audit"))?;
        Ok(NfsExportReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            nfs,
        })
    }

    /// One volume's `mkfs.xfs`, in the pinned image, through Podman: the
    /// container sees its one device, no network and one capability
    /// (CAP_SYS_ADMIN, for the block-size ioctl); it
    /// is removed whatever happens. `-K`: no discard (the wipe discards).
    /// Without `-f`, mkfs.xfs refuses a device that holds a signature.
    async fn mkfs(&self, lease: &str, image: &ImageId, v: &NfsVolume) -> Result<(), String> {
        let name = format!("gpuq-{lease}-mkfs-{}", v.name);
        let podman = self.podman();
        // A leftover of an earlier try of this lease (a crash).
        let _ = podman.container_delete(&name, true).await;
        let mut spec = ContainerSpec::new(name.clone(), image.clone());
        spec.labels = lease_labels(lease, Role::Mkfs);
        spec.command = vec!["mkfs.xfs".into(), "-K".into(), v.device_path.clone()];
        spec.network = Namespace::None;
        spec.devices = vec![v.device_path.clone()];
        // mkfs.xfs sets the device's block size to the sector size it
        // formats with (BLKBSZSET, fatal when refused), which takes
        // CAP_SYS_ADMIN; nothing else is kept (tried in the site VM:
        // without it, "cannot set blocksize 512 … Permission denied").
        spec.cap_drop = vec!["ALL".into()];
        spec.cap_add = vec!["SYS_ADMIN".into()];
        spec.no_new_privileges = true;
        spec.read_only_rootfs = true;
        let node = self.node_name();
        let run = async {
            podman
                .container_create(&spec)
                .await
                .map_err(|e| format!("create {name}: {e}"))?;
            podman
                .container_start(&name)
                .await
                .map_err(|e| format!("start {name}: {e}"))?;
            podman
                .container_wait(&name)
                .await
                .map_err(|e| format!("wait {name}: {e}"))
        };
        let code = tokio::time::timeout(MKFS_DEADLINE, run).await;
        let logs = podman
            .container_logs(&name, &gpuq_podman::LogOptions::default())
            .await
            .map(|l| {
                String::from_utf8_lossy(&l.stream(gpuq_podman::LogStream::Stderr))
                    .lines()
                    .last()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_default();
        let removed = podman.container_delete(&name, true).await;
        let r = match code {
            Err(_) => Err(format!(
                "{node}: mkfs.xfs {} did not end within {}s",
                v.device_path,
                MKFS_DEADLINE.as_secs()
            )),
            Ok(Err(e)) => Err(format!("{node}: {e}")),
            Ok(Ok(0)) => Ok(()),
            Ok(Ok(c)) => Err(format!(
                "{node}: mkfs.xfs {} exited {c}: {logs}",
                v.device_path
            )),
        };
        r?;
        removed.map_err(|e| format!("{node}: remove {name}: {e}"))
    }

    /// The `--stor nfsrdma` part of `unexport`.
    pub(crate) async fn nfs_unexport(
        &self,
        lease: &str,
        mut rec: NodeLease,
        nfs: NfsExport,
    ) -> Result<StepReport, NodeError> {
        let lease_dir = self.lease_dir(lease);
        let fail = |msg: String| {
            let _ = audit::append(&lease_dir, "unexport", "failed", &msg);
            NodeError::Failed(msg)
        };
        // A mkfs container a crash left (it may still hold a device):
        // removed (killed first) and confirmed gone before anything else.
        let filter =
            gpuq_podman::LabelFilter::lease(lease).eq(gpuq_podman::LABEL_ROLE, Role::Mkfs.as_str());
        let mut removed_mkfs = Vec::new();
        for c in self
            .podman()
            .container_list(&filter)
            .await
            .map_err(|e| fail(format!("list the lease's mkfs containers: {e}")))?
        {
            self.podman()
                .container_delete(&c.id, true)
                .await
                .map_err(|e| fail(format!("remove mkfs container {}: {e}", c.names.join(","))))?;
            removed_mkfs.push(format!("removed mkfs container {}", c.names.join(",")));
        }
        let left = self
            .podman()
            .container_list(&filter)
            .await
            .map_err(|e| fail(format!("list the lease's mkfs containers: {e}")))?;
        if !left.is_empty() {
            return Err(fail(format!(
                "mkfs containers of the lease are still there: {}",
                left.iter()
                    .map(|c| c.names.join(","))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let responder = self
            .nfs_responder
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take_if(|(l, _)| l == lease);
        let nfsd_dir = self.nfsd_dir(lease);
        let done = tokio::task::spawn_blocking(move || -> Result<Vec<String>, String> {
            let mut did = removed_mkfs;
            if let Some(ctl) = Nfsd::at(&nfsd_dir) {
                ctl.stop()?;
                ctl.unmount()?;
                did.push("the NFS server stopped".to_string());
            }
            if let Some((_, r)) = responder {
                drop(r);
                did.push("the upcall responder stopped".into());
            }
            if nfsd::loaded() {
                nfsd::flush_caches()?;
            }
            did.extend(unmount_all(&nfs)?);
            if nfsd::loaded() {
                let root = Path::new(&nfs.root);
                let left: Vec<String> = nfsd::exported_paths()?
                    .into_iter()
                    .filter(|p| Path::new(p).starts_with(root))
                    .collect();
                if !left.is_empty() {
                    return Err(format!("still in the export cache: {}", left.join(", ")));
                }
            }
            Ok(did)
        })
        .await
        .map_err(|e| fail(format!("the unexport ended without an answer: {e}")))?
        .map_err(|e| fail(format!("unexport not confirmed: {e}")))?;
        let already = done.is_empty();
        if rec.phase != "unexported" {
            rec.phase = "unexported".into();
            self.write_record(&rec)?;
        }
        let detail = if already {
            "nothing of the lease's NFS export is left".to_string()
        } else {
            format!("{}; nothing of it is left", done.join(", "))
        };
        audit::append(&lease_dir, "unexport", "ok", &detail).map_err(io("audit"))?;
        Ok(StepReport {
            node: self.node_name().to_string(),
            lease: lease.to_string(),
            already_done: already,
            detail,
        })
    }

    /// After a restart of this helper: answer the upcalls of the lease
    /// exported here again (its server and mounts outlived the helper).
    pub fn resume_nfs(&self) -> Result<Option<String>, NodeError> {
        let Some(rec) = self.lease_record()? else {
            return Ok(None);
        };
        let Some(nfs) = rec.nfs.as_ref().filter(|_| rec.phase == "exported") else {
            return Ok(None);
        };
        let client = nfs
            .client_address
            .parse()
            .map_err(|_| NodeError::Failed("the record's client address is not one".into()))?;
        let table = Table::of(
            client,
            &rec.lease,
            Path::new(&nfs.root),
            &nfs.volumes
                .iter()
                .map(|v| (v.fsid, Path::new(&nfs.root).join(&v.name)))
                .collect::<Vec<_>>(),
        );
        let r = Responder::start(table).map_err(NodeError::Failed)?;
        *self.nfs_responder.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((rec.lease.clone(), r));
        Ok(Some(rec.lease))
    }
}

/// The pseudo-root and every volume mounted, each volume's root the
/// owner's (0700). Blocking.
fn mount_all(nfs: &NfsExport) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    let root = Path::new(&nfs.root);
    match std::fs::create_dir(root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("create {}: {e}", root.display())),
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if !is_mountpoint(root)? {
        mount(
            Some("gpuq-nfs-root"),
            root,
            Some("tmpfs"),
            flags | MsFlags::MS_NOEXEC,
            Some("size=64k,nr_inodes=64,mode=0755"),
        )
        .map_err(|e| format!("mount the pseudo-root on {}: {e}", root.display()))?;
    }
    for v in &nfs.volumes {
        let devnum = &v.devnum;
        let at = root.join(&v.name);
        match std::fs::create_dir(&at) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("create {}: {e}", at.display())),
        }
        if !is_mountpoint(&at)? {
            mount(
                Some(v.device_path.as_str()),
                &at,
                Some("xfs"),
                flags,
                None::<&str>,
            )
            .map_err(|e| format!("mount {} (xfs) on {}: {e}", v.device_path, at.display()))?;
        }
        // Verify after: the filesystem there is the recorded device's.
        let m = mount_at(&at)?
            .ok_or_else(|| format!("{} is not mounted after its mount", at.display()))?;
        if m.devnum.to_string() != *devnum || m.fstype != "xfs" {
            return Err(format!(
                "{} holds {} {} , not the xfs of {} ({devnum})",
                at.display(),
                m.fstype,
                m.devnum,
                v.device_path
            ));
        }
        give_root(&at, nfs.owner_uid, nfs.owner_gid, m.devnum)?;
    }
    Ok(())
}

/// The volume's root directory, opened without following a link and
/// checked to be on the volume, made the owner's, 0700.
fn give_root(
    at: &Path,
    uid: u32,
    gid: u32,
    dev: gpuq_blockdev::system::DevNum,
) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(at)
        .map_err(|e| format!("open {}: {e}", at.display()))?;
    let st = dir
        .metadata()
        .map_err(|e| format!("fstat {}: {e}", at.display()))?;
    if gpuq_blockdev::system::DevNum::from_rdev(st.dev()) != dev {
        return Err(format!(
            "{} is not the root of the mounted volume",
            at.display()
        ));
    }
    std::os::unix::fs::fchown(&dir, Some(uid), Some(gid))
        .map_err(|e| format!("chown {}: {e}", at.display()))?;
    dir.set_permissions(std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("chmod {}: {e}", at.display()))
}

/// Every mount of the lease gone (volumes, then the pseudo-root), never
/// lazily: a busy one is retried for a while, then an error. Returns what
/// it unmounted. Blocking.
fn unmount_all(nfs: &NfsExport) -> Result<Vec<String>, String> {
    let root = Path::new(&nfs.root);
    let mut did = Vec::new();
    let mut targets: Vec<PathBuf> = nfs.volumes.iter().map(|v| root.join(&v.name)).collect();
    targets.push(root.to_path_buf());
    for at in targets {
        if !is_mountpoint(&at)? {
            continue;
        }
        let mut last = None;
        let ok = nfsd::eventually(Duration::from_secs(10), || {
            match nix::mount::umount2(&at, nix::mount::MntFlags::empty()) {
                Ok(()) => true,
                Err(e) => {
                    last = Some(e);
                    false
                }
            }
        });
        if !ok {
            return Err(format!(
                "unmount {}: {} (not lazily: it holds the lease's data)",
                at.display(),
                last.map(|e| e.to_string()).unwrap_or_default()
            ));
        }
        did.push(format!("unmounted {}", at.display()));
    }
    let left: Vec<String> = gpuq_blockdev::system::mounts()
        .map_err(|e| format!("read mountinfo: {e}"))?
        .into_iter()
        .filter(|m| Path::new(&m.mountpoint).starts_with(root))
        .map(|m| m.mountpoint)
        .collect();
    if !left.is_empty() {
        return Err(format!("still mounted: {}", left.join(", ")));
    }
    Ok(did)
}

fn mount_at(at: &Path) -> Result<Option<gpuq_blockdev::system::Mount>, String> {
    Ok(gpuq_blockdev::system::mounts()
        .map_err(|e| format!("read mountinfo: {e}"))?
        .into_iter()
        .rev()
        .find(|m| Path::new(&m.mountpoint) == at))
}

fn is_mountpoint(at: &Path) -> Result<bool, String> {
    Ok(mount_at(at)?.is_some())
}
