//! The renders matrix: every `daos_server.yml`, `daos_control.yml` and
//! `daos_agent.yml` shape gpuq ships (gpuq-daosconf, as the node helper and
//! the broker fill it in: physical and test mode, each DAOS version, with
//! and without the lease's certificates), checked by the simulator's
//! copy of DAOS's own validation for that version (src/checks.rs). A
//! change to a render that DAOS would refuse fails here.
//!
//! The simulator's rules are held to DAOS's documented examples first
//! (`documented_examples_*`): the fixtures below are written from the
//! shapes DAOS documents (utils/config/examples/daos_server_mdonssd.yml,
//! daos_server_local.yml; docs/admin/deployment.md), not from our renders.

use std::path::Path;

use daos_sim::checks::{self, MemInfo, Version};
use daos_sim::config::{parse_strict, AgentConfig, ControlConfig, ServerConfig as SimServer};
use gpuq_daosconf::{
    AgentConfig as Agent, Bdev, ControlConfig as Control, DaosVersion, Engine, MemInfo as GpuqMem,
    MemoryPlan, ServerConfig, Transport,
};

const VERSIONS: [(DaosVersion, Version); 3] = [
    (DaosVersion::V2_6, Version::V2_6),
    (DaosVersion::V2_6_5, Version::V2_6_5),
    (DaosVersion::V2_8, Version::V2_8),
];

/// Node sizes to render for: the test machines' (24 GiB), a small site
/// node (16 GiB) and a large one (512 GiB); 2 MiB hugepages.
const NODES_GIB: [u64; 3] = [16, 24, 512];

fn sim_check(yaml: &str, v: Version, mem: MemInfo) -> Result<(), String> {
    let cfg: SimServer =
        parse_strict(yaml, Path::new("daos_server.yml")).map_err(|e| e.to_string())?;
    checks::validate_server(&cfg, v)?;
    checks::check_memory(&cfg, v, mem).map(|_| ())
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Physical,
    Test,
}

/// The server config as gpuq-nodesvc's `start` fills it in.
fn render(
    version: DaosVersion,
    mode: Mode,
    node_gib: u64,
    targets: u32,
    tls: bool,
) -> Result<String, String> {
    let mem = GpuqMem {
        mem_total_kib: node_gib << 20,
        hugepage_size_kib: 2048,
    };
    let hugepages = matches!(mode, Mode::Physical) || version != DaosVersion::V2_8;
    let plan = MemoryPlan::fit(version, mem, targets, 4, hugepages).map_err(|e| e.to_string())?;
    ServerConfig {
        version,
        name: "daos_server".into(),
        port: 10001,
        replicas: vec!["da1".into(), "da2".into(), "da3".into()],
        provider: "ofi+tcp".into(),
        control_metadata: "/var/lib/gpuqueue-daos/jobs/L42/data/control_meta".into(),
        engines: vec![Engine {
            targets,
            fabric_iface: "eth0".into(),
            fabric_iface_port: 31416,
            scm_mount: "/mnt/daos".into(),
            scm_size_gib: 4,
            bdev: match mode {
                Mode::Physical => Bdev::Nvme {
                    pci: vec!["0000:5e:00.0".into(), "0000:5f:00.0".into()],
                },
                Mode::Test => Bdev::File {
                    paths: vec!["/var/lib/gpuqueue-daos-test/L42/bdev0".into()],
                    size_gib: 1,
                },
            },
        }],
        disable_hugepages: !hugepages,
        allow_thp: false,
        system_ram_reserved_gib: plan.system_ram_reserved_gib,
        fault_path: Some("/da1".into()),
        cert_dir: tls.then(|| "/etc/daos/certs".to_string()),
    }
    .render()
    .map_err(|e| e.to_string())
}

#[test]
fn every_server_render_passes_daos_checks_for_its_version() {
    let mut n = 0;
    for (dv, sv) in VERSIONS {
        for mode in [Mode::Physical, Mode::Test] {
            for node in NODES_GIB {
                for targets in [1, 4, 8] {
                    for tls in [false, true] {
                        let mem = MemInfo {
                            mem_total: node << 30,
                            hugepage_size: 2 << 20,
                        };
                        match render(dv, mode, node, targets, tls) {
                            Ok(y) => {
                                sim_check(&y, sv, mem).unwrap_or_else(|e| {
                                    panic!("{dv:?} {mode:?} {node} GiB {targets} targets: DAOS refuses: {e}\n{y}")
                                });
                                n += 1;
                            }
                            // gpuq refused to render: DAOS must refuse the
                            // same node too (the plan is not stricter than
                            // DAOS by more than the system floor).
                            Err(e) => {
                                assert!(
                                    e.contains("does not fit") || e.contains("the node has"),
                                    "{e}"
                                );
                                assert!(
                                    node <= 16,
                                    "{dv:?} {mode:?} {node} GiB {targets} targets refused: {e}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(n >= 60, "only {n} renders checked");
}

#[test]
fn a_render_for_one_version_is_refused_by_another_where_daos_differs() {
    let mem = MemInfo {
        mem_total: 24 << 30,
        hugepage_size: 2 << 20,
    };
    // 2.8's replicas key is unknown to 2.6's strict parser.
    let y28 = render(DaosVersion::V2_8, Mode::Test, 24, 1, false).unwrap();
    let e = sim_check(&y28, Version::V2_6, mem).unwrap_err();
    assert!(
        e.contains("field mgmt_svc_replicas not found in type config.Server"),
        "{e}"
    );
    // A test-mode 2.8 render (no hugepages beside file bdevs) is refused
    // by 2.6 (code 726) even with its replicas key renamed.
    let e = sim_check(
        &y28.replace("mgmt_svc_replicas", "access_points"),
        Version::V2_6,
        mem,
    )
    .unwrap_err();
    assert!(e.contains("code = 726"), "{e}");
}

#[test]
fn client_renders_pass_the_strict_parsers() {
    let c = Control {
        system: "daos_server".into(),
        port: 10001,
        hostlist: vec!["10.200.0.11:10001".into(), "da2".into()],
        transport: Transport::in_dir("/etc/daos/certs", "admin"),
    }
    .render("lease L42")
    .unwrap();
    let c: ControlConfig = parse_strict(&c, Path::new("daos_control.yml")).unwrap();
    assert!(!c.transport_config.allow_insecure);
    let a = Agent {
        system: "daos_server".into(),
        access_points: vec!["da1".into(), "da2".into(), "da3".into()],
        port: 10001,
        transport: Transport::in_dir("/etc/daos/certs", "agent"),
        runtime_dir: "/var/run/daos_agent".into(),
    }
    .render("lease L42")
    .unwrap();
    let a: AgentConfig = parse_strict(&a, Path::new("daos_agent.yml")).unwrap();
    assert_eq!(a.access_points.len(), 3);
}

/// The MD-on-SSD example's shape (utils/config/examples/
/// daos_server_mdonssd.yml): a ram tier, then NVMe tiers with explicit
/// roles, and control_metadata.
const MDONSSD_3_TIERS: &str = "
name: daos_server
mgmt_svc_replicas: ['hostX']
port: 10001
provider: ofi+tcp
control_metadata:
  path: /var/daos/config
transport_config: {allow_insecure: false}
engines:
  - targets: 16
    storage:
      - {class: ram, scm_mount: /mnt/daos}
      - {class: nvme, bdev_list: ['0000:81:00.0'], bdev_roles: [wal]}
      - {class: nvme, bdev_list: ['0000:82:00.0'], bdev_roles: [meta]}
      - {class: nvme, bdev_list: ['0000:83:00.0'], bdev_roles: [data]}
";

/// The local example's shape (utils/config/examples/
/// daos_server_local.yml): ram SCM and a file bdev, no MD-on-SSD.
const LOCAL_FILE: &str = "
name: daos_server
mgmt_svc_replicas: ['localhost']
port: 10001
provider: ofi+tcp
transport_config: {allow_insecure: true}
disable_hugepages: true
engines:
  - targets: 1
    storage:
      - {class: ram, scm_mount: /mnt/daos, scm_size: 4}
      - {class: file, bdev_list: [/tmp/daos-bdev], bdev_size: 4}
";

fn validate(yaml: &str, v: Version) -> Result<(), String> {
    let cfg: SimServer = parse_strict(yaml, Path::new("example.yml")).map_err(|e| e.to_string())?;
    checks::validate_server(&cfg, v)
}

#[test]
fn documented_examples_pass_and_their_documented_mistakes_are_refused() {
    for v in [Version::V2_6, Version::V2_6_5, Version::V2_8] {
        // 2.6 names the replicas access_points.
        let dialect = |y: &str| match v {
            Version::V2_8 => y.to_string(),
            Version::V2_6 | Version::V2_6_5 => y.replace("mgmt_svc_replicas", "access_points"),
        };
        validate(&dialect(MDONSSD_3_TIERS), v).unwrap();
        validate(&dialect(LOCAL_FILE), v).unwrap();
    }
    // The two-tier alternative the example documents: wal+meta, data.
    let two = MDONSSD_3_TIERS
        .replace("bdev_roles: [wal]}", "bdev_roles: [wal, meta]}")
        .replace(
            "      - {class: nvme, bdev_list: ['0000:82:00.0'], bdev_roles: [meta]}\n",
            "",
        );
    validate(&two, Version::V2_8).unwrap();
    // "bdev_roles must be specified on each NVMe storage tier".
    let some = MDONSSD_3_TIERS.replace(", bdev_roles: [meta]", "");
    assert!(validate(&some, Version::V2_8)
        .unwrap_err()
        .contains("code = 314"));
    // The only co-location the example forbids: wal+data.
    let wal_data = MDONSSD_3_TIERS
        .replace("bdev_roles: [wal]}", "bdev_roles: [wal, data]}")
        .replace("bdev_roles: [data]}", "bdev_roles: [meta]}");
    assert!(validate(&wal_data, Version::V2_8)
        .unwrap_err()
        .contains("code = 319"));
    // "these roles can only be applied when the first storage tier is of
    // class ram".
    let no_md = MDONSSD_3_TIERS.replace("control_metadata:\n  path: /var/daos/config\n", "");
    assert!(validate(&no_md, Version::V2_8)
        .unwrap_err()
        .contains("code = 318"));
    // The local example with control_metadata (what gpuq rendered before
    // 2026-12-07): code 317.
    let md_no_roles = format!("{LOCAL_FILE}control_metadata: {{path: /tmp/md}}\n");
    let e = validate(&md_no_roles, Version::V2_8).unwrap_err();
    assert!(
        e.contains(
            "code = 317 description = \"using 'control_metadata.path' requires MD-on-SSD roles\""
        ),
        "{e}"
    );
    // Four bdev tiers with roles.
    let four = MDONSSD_3_TIERS.replace(
        "      - {class: nvme, bdev_list: ['0000:83:00.0'], bdev_roles: [data]}\n",
        "      - {class: nvme, bdev_list: ['0000:83:00.0'], bdev_roles: [data]}\n      - {class: nvme, bdev_list: ['0000:84:00.0'], bdev_roles: [data]}\n",
    );
    assert!(validate(&four, Version::V2_8)
        .unwrap_err()
        .contains("code = 316"));
}
