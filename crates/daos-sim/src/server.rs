//! `daos_server start`: one simulated control server with one engine.
//!
//! State machine of the engine (names as in src/control/system/member.go):
//! `awaitformat` → (`dmg storage format`) → `starting` → (management service
//! accepts the join) → `joined` → (`dmg system stop` or SIGTERM) →
//! `stopping` → `stopped`.
//!
//! On format the server writes, under `control_metadata.path`,
//! `daos_control/engine0/superblock` (JSON: UUID, system, rank) and the raft
//! dir `daos_control/control_raft/`, and a header into each `class: file`
//! bdev (created sparse with `bdev_size` GiB if missing). If the superblock
//! is already there at start, the engine does not await format: it rejoins
//! under its old UUID and rank, and a later format is refused with
//! `storage format invoked on a running system` — the real DAOS behaviour
//! that makes per-lease metadata paths necessary (daos.md).
//!
//! The first entry of `mgmt_svc_replicas` (or `access_points`) is the
//! management service (MS). It keeps the system's membership, pools and
//! containers in `daos_control/control_raft/daos_system.db` (JSON). Other
//! replicas are plain servers here: no raft, no fail-over. Every server
//! forwards system-level requests to the MS, so dmg pointed at any server
//! sees the whole system.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{resolve, ServerConfig};
use crate::error::{SimError, DER_EXIST, DER_INVAL, DER_MISC, DER_NONEXIST, DER_NOSPACE};
use crate::faults::FaultSource;
use crate::model::{
    new_uuid, now_rfc3339, ContCreateResp, ContReadResp, ContWriteResp, HostStorage, Member,
    NvmeResult, PoolCreateResp, RankResult, ScmMountResult, SystemQueryResp, SystemStopResp,
};
use crate::proto::{call, JoinReq, JoinResp, Reply, Request, Wire};
use crate::tls::{Accepted, Component, Role, Transport};

/// The message of DAOS's system.ErrUninitialized.
pub const ERR_UNINITIALIZED: &str = "system is uninitialized (storage format required?)";
/// The refusal of a second format (daos.md: "contamination: abort").
pub const ERR_RUNNING: &str = "storage format invoked on a running system";
/// The header written at offset 0 of each file bdev.
pub const BDEV_MAGIC: &[u8] = b"DAOS-SIM-BDEV\n";

/// `daos_control/engine0/superblock`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Superblock {
    pub version: u32,
    pub simulator: String,
    pub system: String,
    pub uuid: String,
    pub rank: Option<u32>,
    pub created: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Db {
    members: Vec<Member>,
    pools: Vec<Pool>,
    /// Data extents handed out so far (`daos filesystem copy`).
    #[serde(default)]
    extents: u64,
}

/// The simulator's on-disk layout of every bdev of a rank (a namespace in
/// physical mode, a file in test mode); docs/daos-sim.md. Offset 0: the
/// format's header. Then fixed slots, so that a test (and an operator) can
/// find what a lease wrote and check that the wipe removed it.
pub mod layout {
    /// Pool `n`'s record (`DAOS-SIM-POOL {json}`) at `POOLS + n * RECORD`.
    pub const POOLS: u64 = 1 << 20;
    /// Container `n`'s record (`DAOS-SIM-CONT {json}`), `n` counted over
    /// all pools of the system, at `CONTAINERS + n * RECORD`.
    pub const CONTAINERS: u64 = 2 << 20;
    /// Data extent `n` (`daos filesystem copy`: the file's bytes as they
    /// are) at `DATA + n * EXTENT`.
    pub const DATA: u64 = 4 << 20;
    pub const RECORD: u64 = 4096;
    pub const EXTENT: u64 = 64 << 10;
    /// Slots per area before the next area begins.
    pub const MAX_POOLS: u64 = (CONTAINERS - POOLS) / RECORD;
    pub const MAX_CONTAINERS: u64 = (DATA - CONTAINERS) / RECORD;
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pool {
    uuid: String,
    label: String,
    svc_reps: Vec<u32>,
    tgt_ranks: Vec<u32>,
    tier_bytes: Vec<u64>,
    containers: Vec<Container>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Container {
    uuid: String,
    label: String,
    kind: String,
    /// (offset, bytes) of each data extent written into it, in order.
    #[serde(default)]
    extents: Vec<(u64, u64)>,
}

#[derive(Debug)]
struct Local {
    state: String,
    sb: Option<Superblock>,
}

/// One running simulated server.
#[derive(Debug)]
pub struct Server {
    cfg: ServerConfig,
    md: PathBuf,
    ms_addr: SocketAddr,
    is_ms: bool,
    faults: FaultSource,
    local: Mutex<Local>,
    /// `Some` once the MS is formatted (or restarted formatted).
    db: Mutex<Option<Db>>,
    shutdown: AtomicBool,
    stop_timeout: Duration,
    /// The control port's transport (and this server's client side).
    transport: Transport,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn log(msg: impl AsRef<str>) {
    crate::model::log_line("daos_server", msg.as_ref());
}

impl Server {
    fn sb_path(&self) -> PathBuf {
        self.md.join("daos_control/engine0/superblock")
    }
    fn raft_dir(&self) -> PathBuf {
        self.md.join("daos_control/control_raft")
    }
    fn db_path(&self) -> PathBuf {
        self.raft_dir().join("daos_system.db")
    }

    fn write_json(path: &Path, v: &impl Serialize) -> Result<(), SimError> {
        let tmp = path.with_extension("tmp");
        let data = serde_json::to_vec_pretty(v).map_err(|e| SimError::Protocol {
            peer: "local".into(),
            msg: e.to_string(),
        })?;
        std::fs::write(&tmp, data)
            .map_err(|e| SimError::io(format!("write {}", tmp.display()), e))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| SimError::io(format!("rename to {}", path.display()), e))
    }

    fn save_db(&self, db: &Db) {
        if let Err(e) = Self::write_json(&self.db_path(), db) {
            log(format!("cannot persist system db: {e}"));
        }
    }

    fn set_state(&self, s: &str) {
        let mut l = lock(&self.local);
        if l.state != s {
            log(format!("instance 0: {} -> {s}", l.state));
            l.state = s.to_string();
        }
    }

    fn state(&self) -> String {
        lock(&self.local).state.clone()
    }

    fn wire(&self, req: Request) -> Wire {
        Wire {
            req,
            system: self.cfg.name.clone(),
            insecure: self.transport.insecure(),
        }
    }

    // ---- storage ----------------------------------------------------------

    fn format(self: &Arc<Self>) -> Result<HostStorage, SimError> {
        if self.faults.current().format_error {
            return Err(SimError::remote(
                "simulated storage format failure (daos-sim fault switch format_error)",
                DER_MISC,
            ));
        }
        let mut l = lock(&self.local);
        if l.sb.is_some() || self.sb_path().exists() {
            return Err(SimError::remote(ERR_RUNNING, DER_MISC));
        }
        let engine = &self.cfg.engines[0];
        let uuid = new_uuid();
        let mkdir = |p: &Path| {
            std::fs::create_dir_all(p)
                .map_err(|e| SimError::io(format!("create {}", p.display()), e))
        };
        mkdir(&self.md.join("daos_control/engine0"))?;
        mkdir(&self.raft_dir())?;
        let mut storage = HostStorage {
            scm_mount_points: Vec::new(),
            nvme_devices: Vec::new(),
        };
        for tier in &engine.storage {
            if let Some(m) = &tier.scm_mount {
                storage.scm_mount_points.push(ScmMountResult {
                    info: "CTL_SUCCESS".into(),
                    path: m.clone(),
                });
            }
            for dev in &tier.bdev_list {
                if tier.class == "file" {
                    write_bdev_header(
                        Path::new(dev),
                        tier.bdev_size.unwrap_or(1),
                        &uuid,
                        &self.cfg.name,
                    )?;
                } else if tier.class == "nvme" {
                    // Physical mode: the controller's namespaces, as DAOS
                    // (through SPDK) formats every namespace of each listed
                    // controller. Nothing else is opened.
                    let namespaces = nvme_namespaces(Path::new("/sys"), dev)?;
                    for ns in &namespaces {
                        write_nvme_header(ns, &uuid, &self.cfg.name, dev)?;
                    }
                    log(format!(
                        "instance 0: wrote the simulator's header to {} (controller {dev})",
                        namespaces
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                storage.nvme_devices.push(NvmeResult {
                    info: "CTL_SUCCESS".into(),
                    pci_addr: dev.clone(),
                });
            }
        }
        if self.is_ms {
            let db = Db::default();
            self.save_db(&db);
            *lock(&self.db) = Some(db);
        }
        let sb = Superblock {
            version: 0,
            simulator: "daos-sim (DAOS control-plane simulator, not DAOS)".into(),
            system: self.cfg.name.clone(),
            uuid,
            rank: None,
            created: now_rfc3339(),
        };
        Self::write_json(&self.sb_path(), &sb)?;
        l.sb = Some(sb);
        l.state = "starting".into();
        drop(l);
        log("instance 0: storage formatted, engine starting");
        self.spawn_join();
        Ok(storage)
    }

    /// `dmg storage query usage` on this host: DAOS's `HostStorage` JSON
    /// (lib/control/storage.go; storage/scm.go `ScmMountPoint`,
    /// storage/bdev.go `NvmeController`, `SmdDevice`), for a formatted
    /// engine with a rank only, as DAOS reports storage "assigned to a
    /// currently running rank". Sizes: `scm_size` GiB of SCM; each file
    /// bdev's `bdev_size` GiB, each NVMe namespace's size in sysfs. Free
    /// space is the total: the simulator keeps no capacity account (every
    /// rank holds a whole copy of what is written).
    fn storage_usage(&self) -> Result<serde_json::Value, SimError> {
        let l = lock(&self.local);
        let rank = l.sb.as_ref().and_then(|sb| sb.rank);
        // The device's SMD UUID: stable for the engine (DAOS keeps one per
        // device in its metadata), here the engine's own.
        let smd_uuid = l.sb.as_ref().map(|sb| sb.uuid.clone()).unwrap_or_default();
        drop(l);
        let (mut scm, mut nvme) = (Vec::new(), Vec::new());
        if let Some(rank) = rank {
            let engine = &self.cfg.engines[0];
            let tgt_ids: Vec<u32> = (0..engine.targets).collect();
            let roles = engine
                .storage
                .iter()
                .find(|t| !t.bdev_roles.is_empty())
                .map(|t| {
                    let mut r: Vec<&str> = t.bdev_roles.iter().map(String::as_str).collect();
                    r.sort_unstable();
                    r.join(",")
                })
                .unwrap_or_default();
            for tier in &engine.storage {
                if tier.class == "ram" {
                    let total = tier.scm_size.unwrap_or(0) << 30;
                    scm.push(serde_json::json!({
                        "class": "ram", "device_list": null, "info": "",
                        "path": tier.scm_mount, "rank": rank,
                        "total_bytes": total, "avail_bytes": total, "usable_bytes": total,
                    }));
                }
                for dev in &tier.bdev_list {
                    let total = match tier.class.as_str() {
                        "file" => tier.bdev_size.unwrap_or(0) << 30,
                        // A controller whose namespaces cannot be found is
                        // an error, not a device of 0 bytes.
                        _ => nvme_namespaces(Path::new("/sys"), dev)?
                            .iter()
                            .filter_map(|ns| {
                                let name = ns.file_name()?.to_string_lossy().into_owned();
                                let s = std::fs::read_to_string(format!("/sys/block/{name}/size"))
                                    .ok()?;
                                s.trim().parse::<u64>().ok().map(|sectors| sectors * 512)
                            })
                            .sum(),
                    };
                    nvme.push(serde_json::json!({
                        "info": "", "model": "", "serial": "", "pci_addr": dev,
                        "fw_rev": "", "vendor_id": "", "pci_type": "", "socket_id": 0,
                        "health_stats": null, "namespaces": null,
                        "smd_devices": [{
                            "uuid": smd_uuid, "tgt_ids": tgt_ids, "rank": rank,
                            "total_bytes": total, "avail_bytes": total, "usable_bytes": total,
                            "cluster_size": 32u64 << 20, "meta_size": 0, "meta_wal_size": 0,
                            "rdb_size": 0, "rdb_wal_size": 0, "roles": roles,
                            "has_sys_xs": !roles.is_empty(), "ctrlr_namespace_id": 1,
                        }],
                        "dev_state": "NORMAL", "led_state": "OFF",
                    }));
                }
            }
        }
        Ok(serde_json::json!({
            "nvme_devices": nvme, "scm_modules": null, "scm_namespaces": null,
            "scm_mount_points": scm, "smd_info": null, "reboot_required": false,
            "mem_info": null,
        }))
    }

    /// Registers with the MS in the background, retrying until it answers.
    fn spawn_join(self: &Arc<Self>) {
        let me = Arc::clone(self);
        std::thread::spawn(move || me.join_loop());
    }

    fn join_loop(&self) {
        let mut warned = false;
        loop {
            if self.shutdown.load(Ordering::SeqCst) || self.state() != "starting" {
                return;
            }
            if self.faults.current().never_join {
                if !warned {
                    log("instance 0: not joining (daos-sim fault switch never_join)");
                    warned = true;
                }
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            let Some(sb) = lock(&self.local).sb.clone() else {
                return;
            };
            let req = JoinReq {
                uuid: sb.uuid.clone(),
                rank: sb.rank,
                addr: format!("{}:{}", self.own_ip(), self.cfg.port),
                fault_domain: self.fault_domain(),
                fabric_uri: format!(
                    "{}://{}:{}",
                    self.provider(),
                    self.own_ip(),
                    self.cfg.engines[0].fabric_iface_port
                ),
                fabric_contexts: self.cfg.engines[0].targets * 4 + 1,
            };
            match call(
                self.ms_addr,
                &self.wire(Request::Join(req)),
                Duration::from_secs(5),
                &self.transport,
            )
            .and_then(|v| {
                serde_json::from_value::<JoinResp>(v).map_err(|e| SimError::Protocol {
                    peer: self.ms_addr.to_string(),
                    msg: e.to_string(),
                })
            }) {
                Ok(resp) => {
                    let mut l = lock(&self.local);
                    if let Some(sb) = l.sb.as_mut() {
                        sb.rank = Some(resp.rank);
                        let sb = sb.clone();
                        if let Err(e) = Self::write_json(&self.sb_path(), &sb) {
                            log(format!("cannot update superblock: {e}"));
                        }
                    }
                    if l.state == "starting" {
                        l.state = "joined".into();
                    }
                    drop(l);
                    log(format!(
                        "instance 0: joined as rank {} (incarnation {})",
                        resp.rank, resp.incarnation
                    ));
                    return;
                }
                Err(e) => {
                    if !warned {
                        log(format!(
                            "instance 0: join via {} not accepted yet: {e}; retrying",
                            self.ms_addr
                        ));
                        warned = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// The address other hosts reach us on: the source address the kernel
    /// picks towards the MS (no packet is sent).
    fn own_ip(&self) -> String {
        UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| {
                s.connect(self.ms_addr)?;
                s.local_addr()
            })
            .map(|a| a.ip().to_string())
            .unwrap_or_else(|_| "127.0.0.1".into())
    }

    fn fault_domain(&self) -> String {
        self.cfg
            .fault_path
            .clone()
            .unwrap_or_else(|| format!("/{}", hostname()))
    }

    fn provider(&self) -> String {
        self.cfg
            .engines
            .first()
            .and_then(|e| e.provider.clone())
            .or_else(|| self.cfg.provider.clone())
            .unwrap_or_else(|| "ofi+tcp".into())
    }

    /// Stops the engine (not the control server).
    fn engine_stop(&self, force: bool) -> String {
        if self.state() == "stopped" {
            return "stopped".into();
        }
        self.set_state("stopping");
        if !force {
            if let Some(n) = self.faults.current().slow_stop_secs {
                log(format!(
                    "instance 0: slow stop, {n} s (daos-sim fault switch slow_stop)"
                ));
                std::thread::sleep(Duration::from_secs(n));
            }
        }
        self.set_state("stopped");
        "stopped".into()
    }

    // ---- management service ---------------------------------------------

    fn ms_handle(&self, req: Request) -> Result<serde_json::Value, SimError> {
        match req {
            Request::Join(j) => to_value(&self.ms_join(j)?),
            Request::MemberState { uuid, state } => {
                let mut g = lock(&self.db);
                let db = g
                    .as_mut()
                    .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
                if let Some(m) = db.members.iter_mut().find(|m| m.uuid == uuid) {
                    m.state = state;
                    m.last_update = now_rfc3339();
                }
                self.save_db(db);
                Ok(serde_json::Value::Null)
            }
            Request::SystemQuery => {
                self.exclude_dead_ranks()?;
                let g = lock(&self.db);
                let db = g
                    .as_ref()
                    .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
                let mut members = db.members.clone();
                members.sort_by_key(|m| m.rank);
                to_value(&SystemQueryResp {
                    members,
                    providers: vec![self.provider()],
                })
            }
            Request::SystemStop { force } => to_value(&self.ms_stop(force)?),
            Request::PoolCreate {
                label,
                size,
                nranks,
                nsvc,
            } => {
                let (resp, n) = self.ms_pool_create(label.clone(), size, nranks, nsvc)?;
                let rec = record(
                    "DAOS-SIM-POOL",
                    serde_json::json!({"uuid": resp.uuid, "label": label, "tgt_ranks": resp.tgt_ranks}),
                );
                self.ms_write_ranks(&resp.tgt_ranks, layout::POOLS + n * layout::RECORD, &rec)?;
                to_value(&resp)
            }
            Request::ContWrite { pool, cont, data } => {
                to_value(&self.ms_cont_write(&pool, &cont, data)?)
            }
            Request::ContRead { pool, cont } => to_value(&self.ms_cont_read(&pool, &cont)?),
            Request::ContCreate { pool, label, kind } => {
                let (resp, n, ranks) = self.ms_cont_create(pool, label, kind)?;
                let rec = record(
                    "DAOS-SIM-CONT",
                    serde_json::json!({"pool_uuid": resp.pool_uuid, "uuid": resp.container_uuid,
                        "label": resp.container_label, "type": resp.container_type}),
                );
                self.ms_write_ranks(&ranks, layout::CONTAINERS + n * layout::RECORD, &rec)?;
                to_value(&resp)
            }
            Request::Format
            | Request::StorageUsage
            | Request::EngineStop { .. }
            | Request::BdevWrite { .. }
            | Request::BdevRead { .. } => Err(SimError::remote(
                "not a management service request",
                DER_INVAL,
            )),
        }
    }

    /// Container create on the MS: the response, the container's number
    /// over the whole system (its record slot) and the pool's ranks.
    fn ms_cont_create(
        &self,
        pool: String,
        label: String,
        kind: String,
    ) -> Result<(ContCreateResp, u64, Vec<u32>), SimError> {
        {
            let mut g = lock(&self.db);
            let db = g
                .as_mut()
                .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
            let n = db
                .pools
                .iter()
                .map(|p| p.containers.len() as u64)
                .sum::<u64>();
            let p = db
                    .pools
                    .iter_mut()
                    .find(|p| p.label == pool || p.uuid == pool)
                    .ok_or_else(|| {
                        SimError::remote(
                            format!("pool {pool:?}: DER_NONEXIST(-1005): The specified entity does not exist"),
                            DER_NONEXIST,
                        )
                    })?;
            if p.containers.iter().any(|c| c.label == label) {
                return Err(SimError::remote(
                    format!("container {label:?}: DER_EXIST(-1004): Entity already exists"),
                    DER_EXIST,
                ));
            }
            let c = Container {
                uuid: new_uuid(),
                label: label.clone(),
                kind: kind.clone(),
                extents: Vec::new(),
            };
            if n >= layout::MAX_CONTAINERS {
                return Err(SimError::remote(
                        format!("container {label:?}: DER_NOSPACE(-1007): the simulator keeps at most {} containers per system", layout::MAX_CONTAINERS),
                        DER_NOSPACE,
                    ));
            }
            let ranks = p.tgt_ranks.clone();
            let resp = ContCreateResp {
                pool_uuid: p.uuid.clone(),
                container_uuid: c.uuid.clone(),
                container_label: label,
                container_type: kind,
            };
            p.containers.push(c);
            self.save_db(db);
            Ok((resp, n, ranks))
        }
    }

    /// `daos filesystem copy` on the MS: the next data extent, written to
    /// every bdev of every rank of the pool.
    fn ms_cont_write(
        &self,
        pool: &str,
        cont: &str,
        data: String,
    ) -> Result<ContWriteResp, SimError> {
        if data.len() as u64 > layout::EXTENT {
            return Err(SimError::remote(
                format!(
                    "DER_INVAL(-1003): Invalid parameters: {} bytes; the simulator writes at most {} per copy",
                    data.len(),
                    layout::EXTENT
                ),
                DER_INVAL,
            ));
        }
        let (resp, ranks) = {
            let mut g = lock(&self.db);
            let db = g
                .as_mut()
                .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
            let n = db.extents;
            let (pi, ci) = cont_index(db, pool, cont)?;
            let p = &mut db.pools[pi];
            let (pool_uuid, ranks) = (p.uuid.clone(), p.tgt_ranks.clone());
            let c = &mut p.containers[ci];
            let resp = ContWriteResp {
                pool_uuid,
                container_uuid: c.uuid.clone(),
                bytes: data.len() as u64,
                offset: layout::DATA + n * layout::EXTENT,
                ranks: ranks.clone(),
            };
            c.extents.push((resp.offset, resp.bytes));
            db.extents += 1;
            self.save_db(db);
            (resp, ranks)
        };
        self.ms_write_ranks(&ranks, resp.offset, &data)?;
        Ok(resp)
    }

    /// `daos filesystem copy --src daos://POOL/CONT` on the MS: every extent
    /// written into the container, read back from every rank of the pool;
    /// the ranks must agree byte for byte.
    fn ms_cont_read(&self, pool: &str, cont: &str) -> Result<ContReadResp, SimError> {
        let (pool_uuid, container_uuid, extents, targets) = {
            let g = lock(&self.db);
            let db = g
                .as_ref()
                .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
            let (pi, ci) = cont_index(db, pool, cont)?;
            let p = &db.pools[pi];
            let c = &p.containers[ci];
            let targets: Vec<(u32, String)> = db
                .members
                .iter()
                .filter(|m| p.tgt_ranks.contains(&m.rank))
                .map(|m| (m.rank, m.addr.clone()))
                .collect();
            (p.uuid.clone(), c.uuid.clone(), c.extents.clone(), targets)
        };
        let mut data = String::new();
        for (offset, len) in extents {
            let mut agreed: Option<String> = None;
            for (rank, addr) in &targets {
                let wire = self.wire(Request::BdevRead { offset, len });
                let got = resolve(addr, 0)
                    .and_then(|a| call(a, &wire, Duration::from_secs(30), &self.transport))
                    .and_then(|v| {
                        serde_json::from_value::<String>(v).map_err(|e| SimError::Protocol {
                            peer: addr.clone(),
                            msg: e.to_string(),
                        })
                    })
                    .map_err(|e| {
                        SimError::remote(
                            format!("rank {rank} ({addr}): bdev read failed: {e}"),
                            DER_MISC,
                        )
                    })?;
                match &agreed {
                    Some(a) if *a != got => {
                        return Err(SimError::remote(
                            format!("rank {rank} holds other bytes at offset {offset} than the ranks before it"),
                            DER_MISC,
                        ))
                    }
                    Some(_) => {}
                    None => agreed = Some(got),
                }
            }
            data.push_str(&agreed.unwrap_or_default());
        }
        Ok(ContReadResp {
            pool_uuid,
            container_uuid,
            data,
            ranks: targets.iter().map(|(r, _)| *r).collect(),
        })
    }

    /// Has each of `ranks` write `data` at `offset` of its bdevs.
    fn ms_write_ranks(&self, ranks: &[u32], offset: u64, data: &str) -> Result<(), SimError> {
        let targets: Vec<(u32, String)> = {
            let g = lock(&self.db);
            let db = g
                .as_ref()
                .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
            db.members
                .iter()
                .filter(|m| ranks.contains(&m.rank))
                .map(|m| (m.rank, m.addr.clone()))
                .collect()
        };
        for (rank, addr) in targets {
            let wire = self.wire(Request::BdevWrite {
                offset,
                data: data.to_string(),
            });
            resolve(&addr, 0)
                .and_then(|a| call(a, &wire, Duration::from_secs(30), &self.transport))
                .map_err(|e| {
                    SimError::remote(
                        format!("rank {rank} ({addr}): bdev write failed: {e}"),
                        DER_MISC,
                    )
                })?;
        }
        Ok(())
    }

    /// On a rank: `data` at `offset` of every bdev of its engine (each
    /// namespace of the listed NVMe controllers, or each bdev file),
    /// synced. Only after a format; nothing else is opened.
    fn bdev_write(&self, offset: u64, data: &str) -> Result<serde_json::Value, SimError> {
        if lock(&self.local).sb.is_none() {
            return Err(SimError::remote(ERR_UNINITIALIZED, DER_MISC));
        }
        let mut written = Vec::new();
        for tier in &self.cfg.engines[0].storage {
            for dev in &tier.bdev_list {
                let paths = match tier.class.as_str() {
                    "nvme" => nvme_namespaces(Path::new("/sys"), dev)?,
                    "file" => vec![PathBuf::from(dev)],
                    _ => continue,
                };
                for path in paths {
                    write_at(&path, offset, data.as_bytes(), tier.class == "nvme")?;
                    written.push(path.display().to_string());
                }
            }
        }
        log(format!(
            "instance 0: wrote {} bytes at offset {offset} to {}",
            data.len(),
            written.join(", ")
        ));
        Ok(serde_json::json!(written))
    }

    /// On a rank: `len` bytes at `offset` of every bdev of its engine, as
    /// text; every bdev must hold the same. Only after a format.
    fn bdev_read(&self, offset: u64, len: u64) -> Result<serde_json::Value, SimError> {
        use std::os::unix::fs::FileExt;
        if lock(&self.local).sb.is_none() {
            return Err(SimError::remote(ERR_UNINITIALIZED, DER_MISC));
        }
        if len > layout::EXTENT {
            return Err(SimError::remote(
                format!(
                    "DER_INVAL(-1003): Invalid parameters: {len} bytes; an extent is at most {}",
                    layout::EXTENT
                ),
                DER_INVAL,
            ));
        }
        let mut agreed: Option<Vec<u8>> = None;
        for tier in &self.cfg.engines[0].storage {
            for dev in &tier.bdev_list {
                let paths = match tier.class.as_str() {
                    "nvme" => nvme_namespaces(Path::new("/sys"), dev)?,
                    "file" => vec![PathBuf::from(dev)],
                    _ => continue,
                };
                for path in paths {
                    let io = |e| {
                        SimError::io(
                            format!("read {len} bytes at {offset} of {}", path.display()),
                            e,
                        )
                    };
                    let f = std::fs::File::open(&path).map_err(io)?;
                    let mut buf = vec![0u8; len as usize];
                    f.read_exact_at(&mut buf, offset).map_err(io)?;
                    match &agreed {
                        Some(a) if *a != buf => {
                            return Err(SimError::remote(
                                format!("{} holds other bytes at offset {offset} than this engine's other bdevs", path.display()),
                                DER_MISC,
                            ))
                        }
                        Some(_) => {}
                        None => agreed = Some(buf),
                    }
                }
            }
        }
        let bytes = agreed.unwrap_or_default();
        String::from_utf8(bytes)
            .map(serde_json::Value::String)
            .map_err(|_| SimError::remote("the extent is not the text that was written", DER_MISC))
    }

    /// Stands in for SWIM: a `joined` rank whose control port no longer
    /// accepts connections (its daos_server died without saying so) becomes
    /// `excluded`, as DAOS marks a dead rank.
    fn exclude_dead_ranks(&self) -> Result<(), SimError> {
        let probe: Vec<(String, String)> = {
            let g = lock(&self.db);
            let db = g
                .as_ref()
                .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
            db.members
                .iter()
                .filter(|m| m.state == "joined")
                .map(|m| (m.uuid.clone(), m.addr.clone()))
                .collect()
        };
        let handles: Vec<_> = probe
            .into_iter()
            .map(|(uuid, addr)| {
                std::thread::spawn(move || {
                    let alive = resolve(&addr, 0).is_ok_and(|a| {
                        TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()
                    });
                    (uuid, alive)
                })
            })
            .collect();
        let dead: Vec<String> = handles
            .into_iter()
            .filter_map(|h| h.join().ok())
            .filter(|(_, alive)| !alive)
            .map(|(uuid, _)| uuid)
            .collect();
        if dead.is_empty() {
            return Ok(());
        }
        let mut g = lock(&self.db);
        if let Some(db) = g.as_mut() {
            for m in db.members.iter_mut().filter(|m| dead.contains(&m.uuid)) {
                log(format!(
                    "rank {} ({}) unreachable: excluded",
                    m.rank, m.addr
                ));
                m.state = "excluded".into();
                m.last_update = now_rfc3339();
            }
            self.save_db(db);
        }
        Ok(())
    }

    fn ms_join(&self, j: JoinReq) -> Result<JoinResp, SimError> {
        let mut g = lock(&self.db);
        let db = g
            .as_mut()
            .ok_or_else(|| SimError::remote("management service not formatted yet", DER_MISC))?;
        let now = now_rfc3339();
        let (rank, incarnation) = if let Some(m) = db.members.iter_mut().find(|m| m.uuid == j.uuid)
        {
            m.incarnation += 1;
            m.state = "joined".into();
            m.addr = j.addr;
            m.fault_domain = j.fault_domain;
            m.fabric_uri = j.fabric_uri;
            m.last_update = now;
            (m.rank, m.incarnation)
        } else {
            let taken = |r: u32| db.members.iter().any(|m| m.rank == r);
            let rank = match j.rank {
                Some(r) if !taken(r) => r,
                _ => (0..).find(|r| !taken(*r)).unwrap_or(0),
            };
            let incarnation = 1;
            db.members.push(Member {
                addr: j.addr,
                state: "joined".into(),
                fault_domain: j.fault_domain,
                rank,
                incarnation,
                uuid: j.uuid,
                fabric_uri: j.fabric_uri,
                secondary_fabric_uris: None,
                fabric_contexts: j.fabric_contexts,
                secondary_fabric_contexts: None,
                info: String::new(),
                last_update: now,
            });
            (rank, incarnation)
        };
        self.save_db(db);
        Ok(JoinResp { rank, incarnation })
    }

    fn ms_stop(&self, force: bool) -> Result<SystemStopResp, SimError> {
        let targets: Vec<(u32, String)> = {
            let g = lock(&self.db);
            let db = g
                .as_ref()
                .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
            db.members
                .iter()
                .map(|m| (m.rank, m.addr.clone()))
                .collect()
        };
        let handles: Vec<_> = targets
            .into_iter()
            .map(|(rank, addr)| {
                let wire = self.wire(Request::EngineStop { force });
                let timeout = self.stop_timeout;
                let tp = self.transport.clone();
                std::thread::spawn(move || {
                    let r = resolve(&addr, 0).and_then(|a| call(a, &wire, timeout, &tp));
                    (rank, addr, r)
                })
            })
            .collect();
        let mut results = Vec::new();
        for h in handles {
            let Ok((rank, addr, r)) = h.join() else {
                continue;
            };
            results.push(match r {
                Ok(_) => RankResult {
                    state: "stopped".into(),
                    addr,
                    rank,
                    action: "stop".into(),
                    errored: false,
                    msg: String::new(),
                },
                Err(e) => RankResult {
                    state: if matches!(e, SimError::Io { .. }) {
                        "stopping"
                    } else {
                        "errored"
                    }
                    .into(),
                    addr,
                    rank,
                    action: "stop".into(),
                    errored: true,
                    msg: e.to_string(),
                },
            });
        }
        results.sort_by_key(|r| r.rank);
        let mut g = lock(&self.db);
        if let Some(db) = g.as_mut() {
            for r in &results {
                if let Some(m) = db.members.iter_mut().find(|m| m.rank == r.rank) {
                    m.state = r.state.clone();
                    m.last_update = now_rfc3339();
                }
            }
            self.save_db(db);
        }
        Ok(SystemStopResp { results })
    }

    fn ms_pool_create(
        &self,
        label: String,
        size: u64,
        nranks: Option<u32>,
        nsvc: Option<u32>,
    ) -> Result<(PoolCreateResp, u64), SimError> {
        let mut g = lock(&self.db);
        let db = g
            .as_mut()
            .ok_or_else(|| SimError::remote(ERR_UNINITIALIZED, DER_MISC))?;
        if db.pools.iter().any(|p| p.label == label) {
            return Err(SimError::remote(
                format!(
                    "pool create failed: DER_EXIST(-1004): Entity already exists: pool {label:?}"
                ),
                DER_EXIST,
            ));
        }
        let mut joined: Vec<u32> = db
            .members
            .iter()
            .filter(|m| m.state == "joined")
            .map(|m| m.rank)
            .collect();
        joined.sort_unstable();
        let k = nranks.unwrap_or(joined.len() as u32) as usize;
        if k == 0 || k > joined.len() {
            return Err(SimError::remote(
                format!(
                    "pool create failed: DER_NOSPACE(-1007): No space on storage target: {k} ranks requested, {} joined",
                    joined.len()
                ),
                DER_NOSPACE,
            ));
        }
        let r = nsvc.unwrap_or(3.min(k as u32)) as usize;
        if r == 0 || r > k {
            return Err(SimError::remote(
                format!("pool create failed: DER_INVAL(-1003): Invalid parameters: nsvc {r} with {k} ranks"),
                DER_INVAL,
            ));
        }
        let tgt_ranks: Vec<u32> = joined[..k].to_vec();
        let svc_reps: Vec<u32> = tgt_ranks[..r].to_vec();
        // DAOS's default tier ratio (6 % SCM, the rest NVMe) per rank, and
        // its minimums per target (crate::checks::pool_minimums); a
        // member's targets are in its fabric contexts (targets * 4 + 1).
        let targets = db
            .members
            .iter()
            .filter(|m| tgt_ranks.contains(&m.rank))
            .map(|m| u64::from(m.fabric_contexts.saturating_sub(1) / 4).max(1))
            .max()
            .unwrap_or(1);
        let tier_bytes = crate::checks::pool_minimums(size, k as u64, targets)
            .map_err(|e| SimError::remote(format!("pool create failed: {e}"), DER_MISC))?
            .to_vec();
        let md_on_ssd = self.cfg.engines[0]
            .storage
            .iter()
            .any(|t| t.bdev_roles.iter().any(|r| r == "meta"));
        let pool = Pool {
            uuid: new_uuid(),
            label,
            svc_reps: svc_reps.clone(),
            tgt_ranks: tgt_ranks.clone(),
            tier_bytes: tier_bytes.clone(),
            containers: Vec::new(),
        };
        let resp = PoolCreateResp {
            uuid: pool.uuid.clone(),
            svc_ldr: svc_reps[0],
            svc_reps,
            tgt_ranks,
            tier_bytes,
            // MD-on-SSD: the memory file is the SCM share (DAOS's default
            // mem ratio, 100 %).
            mem_file_bytes: if md_on_ssd { pool.tier_bytes[0] } else { 0 },
            md_on_ssd_active: md_on_ssd,
        };
        let n = db.pools.len() as u64;
        if n >= layout::MAX_POOLS {
            return Err(SimError::remote(
                format!("pool create failed: DER_NOSPACE(-1007): the simulator keeps at most {} pools per system", layout::MAX_POOLS),
                DER_NOSPACE,
            ));
        }
        db.pools.push(pool);
        self.save_db(db);
        Ok((resp, n))
    }

    // ---- connections -------------------------------------------------------

    fn handle_conn(self: &Arc<Self>, stream: TcpStream) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
        let peer = stream
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        match crate::tls::accept(&self.transport, stream) {
            Accepted::Plain(s) => {
                if let Some(line) = crate::tls::read_line(&s) {
                    let mut w = &s;
                    let _ = w.write_all(&self.answer(&line, None));
                }
            }
            Accepted::PlainOnTls(s) => {
                // A client without certificates (allow_insecure, or dmg -i):
                // refused before its request is looked at.
                if crate::tls::read_line(&s).is_some() {
                    log(format!("refused a plain (insecure) request from {peer}: this control port requires TLS"));
                    let reply = Reply::Err {
                        msg: "transport security mismatch: server allow_insecure=false, client allow_insecure=true \
                              (this control port requires TLS with a certificate of the system's CA; \
                              transport_config must match in daos_server.yml, dmg and agent)"
                            .into(),
                        status: DER_MISC,
                    };
                    let mut out = serde_json::to_vec(&reply).unwrap_or_default();
                    out.push(b'\n');
                    let mut w = &s;
                    let _ = w.write_all(&out);
                }
            }
            Accepted::Tls(mut tls, comp) => {
                if let Some(line) = crate::tls::read_line(&mut *tls) {
                    let out = self.answer(&line, Some(comp));
                    let _ = tls.write_all(&out);
                    tls.conn.send_close_notify();
                    let _ = tls.flush();
                }
            }
            Accepted::Drop(why) => log(format!("refused a connection from {peer}: {why}")),
        }
    }

    /// The reply line to one request line; `comp` is the TLS peer's
    /// component (`None` on an insecure port).
    fn answer(self: &Arc<Self>, line: &str, comp: Option<Component>) -> Vec<u8> {
        let reply = match serde_json::from_str::<Wire>(line) {
            Ok(w) => match self.dispatch(w, comp) {
                Ok(v) => Reply::Ok(v),
                Err(e) => Reply::Err {
                    msg: e.to_string(),
                    status: e.status(),
                },
            },
            Err(e) => Reply::Err {
                msg: format!("bad request: {e}"),
                status: DER_INVAL,
            },
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        out
    }

    fn dispatch(
        self: &Arc<Self>,
        w: Wire,
        comp: Option<Component>,
    ) -> Result<serde_json::Value, SimError> {
        if w.system != self.cfg.name {
            return Err(SimError::remote(
                format!(
                    "system name mismatch (request: {:?}, server: {:?})",
                    w.system, self.cfg.name
                ),
                DER_INVAL,
            ));
        }
        if w.insecure != self.cfg.transport_config.allow_insecure {
            return Err(SimError::remote(
                format!(
                    "transport security mismatch: server allow_insecure={}, client allow_insecure={} \
                     (transport_config must match in daos_server.yml, dmg and agent)",
                    self.cfg.transport_config.allow_insecure, w.insecure
                ),
                DER_MISC,
            ));
        }
        if let Some(comp) = comp {
            if !authorized(&w.req, comp) {
                log(format!(
                    "refused {} from a peer with certificate CN {:?}",
                    w.req.name(),
                    comp.name()
                ));
                return Err(SimError::remote(
                    format!(
                        "DER_NO_PERM(-1001): permission denied: component {:?} may not call {} \
                         (the certificate's common name decides, as in DAOS's grpc_authorization.go)",
                        comp.name(),
                        w.req.name()
                    ),
                    DER_NO_PERM,
                ));
            }
        }
        match w.req {
            Request::Format => {
                // A failed format is logged here as well as answered: the
                // reply may never be read (a dmg that timed out) and a
                // server log without it says nothing (issue 13).
                let r = self.format();
                if let Err(e) = &r {
                    log(format!("instance 0: storage format failed: {e}"));
                }
                to_value(&r?)
            }
            Request::StorageUsage => self.storage_usage(),
            Request::EngineStop { force } => Ok(serde_json::Value::String(self.engine_stop(force))),
            Request::BdevWrite { offset, data } => self.bdev_write(offset, &data),
            Request::BdevRead { offset, len } => self.bdev_read(offset, len),
            req if self.is_ms => self.ms_handle(req),
            req => {
                // Forward to the MS; system stop may wait for slow ranks.
                let timeout = self.stop_timeout + Duration::from_secs(10);
                call(self.ms_addr, &self.wire(req), timeout, &self.transport)
            }
        }
    }
}

/// Where container `cont` (label or UUID) of pool `pool` is in `db`:
/// (pool index, container index), or DAOS's `DER_NONEXIST`.
fn cont_index(db: &Db, pool: &str, cont: &str) -> Result<(usize, usize), SimError> {
    let nonexist = |what: String| {
        SimError::remote(
            format!("{what}: DER_NONEXIST(-1005): The specified entity does not exist"),
            DER_NONEXIST,
        )
    };
    let pi = db
        .pools
        .iter()
        .position(|p| p.label == pool || p.uuid == pool)
        .ok_or_else(|| nonexist(format!("pool {pool:?}")))?;
    let ci = db.pools[pi]
        .containers
        .iter()
        .position(|c| c.label == cont || c.uuid == cont)
        .ok_or_else(|| nonexist(format!("container {cont:?}")))?;
    Ok((pi, ci))
}

/// DER_NO_PERM.
pub const DER_NO_PERM: i32 = -1001;

/// What a peer of `comp` may ask (DAOS `security/grpc_authorization.go`,
/// mapped onto the simulator's requests). A server may ask anything: it
/// forwards what its own client was authorised for to the management
/// service, and joins, stops and reports engines. Container create comes
/// from the agent, which forwards its clients' requests (real DAOS has
/// the agent sign its clients' credentials).
pub fn authorized(req: &Request, comp: Component) -> bool {
    matches!(
        (req, comp),
        (_, Component::Server)
            | (
                Request::Format
                    | Request::StorageUsage
                    | Request::SystemQuery
                    | Request::SystemStop { .. }
                    | Request::PoolCreate { .. }
                    | Request::ContCreate { .. }
                    | Request::ContWrite { .. }
                    | Request::ContRead { .. },
                Component::Admin,
            )
            | (
                Request::ContCreate { .. } | Request::ContWrite { .. } | Request::ContRead { .. },
                Component::Agent
            )
    )
}

fn to_value<T: Serialize>(v: &T) -> Result<serde_json::Value, SimError> {
    serde_json::to_value(v).map_err(|e| SimError::Protocol {
        peer: "local".into(),
        msg: e.to_string(),
    })
}

fn write_bdev_header(path: &Path, size_gib: u64, uuid: &str, system: &str) -> Result<(), SimError> {
    use std::io::{Seek, SeekFrom};
    let io = |e| SimError::io(format!("write bdev header {}", path.display()), e);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io)?;
    let want = size_gib << 30;
    if f.metadata().map_err(io)?.len() < want {
        f.set_len(want).map_err(io)?; // sparse
    }
    f.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut hdr = BDEV_MAGIC.to_vec();
    hdr.extend(
        serde_json::json!({"engine": 0, "uuid": uuid, "system": system, "simulator": "daos-sim"})
            .to_string()
            .bytes(),
    );
    hdr.push(b'\n');
    f.write_all(&hdr).map_err(io)?;
    f.sync_all().map_err(io)
}

/// The block devices (`/dev/nvmeXnY`) of the NVMe controller at PCI address
/// `pci`, found in sysfs (`sys`): each `/sys/block/nvme*` whose `device`
/// is that controller (its `address`), or — with native NVMe multipath —
/// a subsystem holding a controller with that address. An address that
/// names no namespace fails the format: the simulator never guesses.
pub fn nvme_namespaces(sys: &Path, pci: &str) -> Result<Vec<PathBuf>, SimError> {
    let io = |e| SimError::io(format!("find the namespaces of NVMe controller {pci}"), e);
    let addr_of = |p: &Path| {
        std::fs::read_to_string(p.join("address"))
            .map(|a| a.trim().to_string())
            .ok()
    };
    let mut found = Vec::new();
    for e in std::fs::read_dir(sys.join("block")).map_err(io)? {
        let name = e.map_err(io)?.file_name().to_string_lossy().into_owned();
        if !name.starts_with("nvme") {
            continue;
        }
        let dev = sys.join("block").join(&name).join("device");
        let ours = addr_of(&dev).as_deref() == Some(pci)
            || std::fs::read_dir(&dev).is_ok_and(|d| {
                d.flatten().any(|c| {
                    let n = c.file_name().to_string_lossy().into_owned();
                    n.starts_with("nvme")
                        && n[4..].chars().all(|ch| ch.is_ascii_digit())
                        && addr_of(&c.path()).as_deref() == Some(pci)
                })
            });
        if ours {
            found.push(PathBuf::from("/dev").join(name));
        }
    }
    found.sort();
    if found.is_empty() {
        return Err(SimError::remote(
            format!("no NVMe namespace of controller {pci} (bdev_list names PCI addresses)"),
            DER_INVAL,
        ));
    }
    Ok(found)
}

/// The simulator's header at offset 0 of a namespace (a block device: it
/// is not created or resized), written through and synced. The wipe must
/// remove it.
fn write_nvme_header(dev: &Path, uuid: &str, system: &str, pci: &str) -> Result<(), SimError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let io = |e| SimError::io(format!("write the bdev header to {}", dev.display()), e);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        // As SPDK claims a device: fail if it is mounted or held.
        .custom_flags(libc::O_EXCL | libc::O_CLOEXEC)
        .open(dev)
        .map_err(io)?;
    if !f.metadata().map_err(io)?.file_type().is_block_device() {
        return Err(SimError::remote(
            format!("{} is not a block device", dev.display()),
            DER_INVAL,
        ));
    }
    let mut hdr = BDEV_MAGIC.to_vec();
    hdr.extend(
        serde_json::json!({"engine": 0, "uuid": uuid, "system": system, "pci_addr": pci, "simulator": "daos-sim"})
            .to_string()
            .bytes(),
    );
    hdr.push(b'\n');
    f.write_all(&hdr).map_err(io)?;
    f.sync_all().map_err(io)
}

/// A record line: `MAGIC {json}\n`.
fn record(magic: &str, v: serde_json::Value) -> String {
    format!("{magic} {v}\n")
}

/// `data` at `offset` of `path` (a bdev file or a namespace), synced. A
/// namespace is opened `O_EXCL` as at the format (SPDK holds it).
fn write_at(path: &Path, offset: u64, data: &[u8], exclusive: bool) -> Result<(), SimError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let io = |e| {
        SimError::io(
            format!(
                "write {} bytes at {offset} of {}",
                data.len(),
                path.display()
            ),
            e,
        )
    };
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    if exclusive {
        o.custom_flags(libc::O_EXCL | libc::O_CLOEXEC);
    }
    let f = o.open(path).map_err(io)?;
    f.write_all_at(data, offset).map_err(io)?;
    f.sync_all().map_err(io)
}

/// The host name (the kernel's; the network namespaces of the test harness
/// all share it, hence `fault_path`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Whether `addr` is one of this host's (namespace's) addresses and our port.
fn is_self(addr: SocketAddr, port: u16) -> bool {
    addr.port() == port && UdpSocket::bind((addr.ip(), 0)).is_ok()
}

/// `daos_server start -o CONFIG`. Returns the exit code.
pub fn run(config_path: &Path) -> Result<i32, SimError> {
    let cfg = ServerConfig::load(config_path)?;
    // DAOS sizes hugepages and the ram-disk from this host's RAM before it
    // starts anything (crate::checks::check_memory).
    let version = crate::checks::Version::from_env().map_err(SimError::Usage)?;
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| SimError::io("read /proc/meminfo", e))?;
    let mem = crate::checks::MemInfo::parse(&meminfo)
        .ok_or_else(|| SimError::Usage("/proc/meminfo: no MemTotal or Hugepagesize".into()))?;
    crate::checks::check_memory(&cfg, version, mem).map_err(|msg| SimError::Config {
        path: config_path.to_path_buf(),
        msg,
    })?;
    let md = cfg.metadata_path().unwrap_or_default();
    let replicas = cfg.replicas();
    let ms_addr = resolve(&replicas[0], cfg.port)?;
    let is_ms = is_self(ms_addr, cfg.port);
    let config_dir = std::fs::canonicalize(config_path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let stop_timeout = std::env::var("DAOS_SIM_STOP_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(10));

    if let Some(f) = &cfg.control_log_file {
        crate::model::set_log_file(f);
    }
    // The handlers go in before the control port is bound: whoever sees the
    // port answer (the node helper, a test) may send SIGTERM at once, and
    // one that arrived before registration killed the process by the
    // default action (exit by signal, no "daos_server stopped", the MS never
    // told) — a test that stopped a server just after `wait_listening` saw
    // that about 1 run in 10 under load (issue 13).
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&term))
            .map_err(|e| SimError::io("install signal handler", e))?;
    }
    // Certificates are read before the port is opened: a bad file fails
    // the start, as in DAOS (PreLoadCertData).
    let transport = Transport::load(&cfg.transport_config, Role::Server)?;
    let listener = TcpListener::bind(("0.0.0.0", cfg.port))
        .map_err(|e| SimError::io(format!("listen on control port {}", cfg.port), e))?;

    let sb_path = md.join("daos_control/engine0/superblock");
    let sb: Option<Superblock> = match std::fs::read(&sb_path) {
        Ok(b) => Some(serde_json::from_slice(&b).map_err(|e| SimError::Config {
            path: sb_path.clone(),
            msg: format!("corrupt superblock: {e}"),
        })?),
        Err(_) => None,
    };
    let server = Arc::new(Server {
        faults: FaultSource::new(
            config_dir,
            crate::config::env_map(&cfg.engines[0].env_vars)
                .get("DAOS_SIM_FAULTS")
                .map(String::as_str),
        ),
        local: Mutex::new(Local {
            state: if sb.is_some() {
                "starting"
            } else {
                "awaitformat"
            }
            .into(),
            sb: sb.clone(),
        }),
        db: Mutex::new(None),
        shutdown: AtomicBool::new(false),
        stop_timeout,
        transport,
        ms_addr,
        is_ms,
        md,
        cfg,
    });
    if is_ms && sb.is_some() {
        let db: Db = std::fs::read(server.db_path())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut db = db;
        // Nobody has rejoined this MS incarnation yet: until they do, their
        // state is unknown (real DAOS would learn it from SWIM).
        for m in &mut db.members {
            m.state = "unknown".into();
        }
        *lock(&server.db) = Some(db);
    }
    log(format!(
        "daos-sim {} (DAOS control-plane simulator, not DAOS), pid {}: listening on 0.0.0.0:{} ({}), system {:?}, management service {}{}, faults file {}",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        server.cfg.port,
        if server.transport.insecure() {
            "insecure"
        } else {
            "mutual TLS"
        },
        server.cfg.name,
        ms_addr,
        if is_ms { " (this server)" } else { "" },
        server.faults.file().display()
    ));
    match &sb {
        Some(sb) => {
            log(format!(
                "instance 0: superblock found (uuid {}, rank {:?}): not awaiting format, rejoining",
                sb.uuid, sb.rank
            ));
            server.spawn_join();
        }
        None => {
            // DAOS's own words (server/instance_storage.go), which gpuq-node waits for.
            log("SCM format required on instance 0; awaiting storage format (dmg storage format)")
        }
    }

    let acceptor = Arc::clone(&server);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            if acceptor.shutdown.load(Ordering::SeqCst) {
                return;
            }
            let s = Arc::clone(&acceptor);
            std::thread::spawn(move || s.handle_conn(conn));
        }
    });

    loop {
        std::thread::sleep(Duration::from_millis(50));
        if !term.swap(false, Ordering::SeqCst) {
            continue;
        }
        if server.faults.current().ignore_sigterm {
            log("caught SIGTERM: ignored (daos-sim fault switch ignore_sigterm)");
            continue;
        }
        log("caught SIGTERM: shutting down");
        let was_joined = server.state() == "joined";
        server.engine_stop(false);
        server.shutdown.store(true, Ordering::SeqCst);
        if was_joined {
            let uuid = lock(&server.local).sb.as_ref().map(|s| s.uuid.clone());
            if let Some(uuid) = uuid {
                let req = Request::MemberState {
                    uuid,
                    state: "stopped".into(),
                };
                let r = if server.is_ms {
                    server.ms_handle(req).map(|_| ())
                } else {
                    call(
                        server.ms_addr,
                        &server.wire(req),
                        Duration::from_secs(2),
                        &server.transport,
                    )
                    .map(|_| ())
                };
                if let Err(e) = r {
                    log(format!("could not tell the management service: {e}"));
                }
            }
        }
        log("daos_server stopped");
        return Ok(0);
    }
}
