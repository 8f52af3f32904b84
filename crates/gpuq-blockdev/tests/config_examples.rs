//! The shipped example configs (`config/da1.toml` … `da4.toml`) parse, name
//! distinct fake devices, never enable loop devices, and ship the node
//! helper disabled (`enabled = false`: the packaged node.toml is da1.toml).

use std::path::PathBuf;

#[test]
fn example_configs_parse_and_never_allow_loop_devices() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config");
    let mut serials = Vec::new();
    for i in 1..=4 {
        let p = dir.join(format!("da{i}.toml"));
        let c = gpuq_blockdev::NodeConfig::load(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.node.name, format!("da{i}"));
        assert!(
            !c.node.allow_loop_devices,
            "{} allows loop devices",
            p.display()
        );
        assert_eq!(
            c.node.enabled,
            Some(false),
            "{} is not shipped disabled",
            p.display()
        );
        assert!(!c.devices.is_empty());
        for d in &c.devices {
            assert!(d.loop_backing_file.is_none());
            let s = d.serial.clone().unwrap();
            assert!(s.starts_with("FAKE-"), "serial {s} does not look fake");
            serials.push(s);
        }
    }
    let n = serials.len();
    serials.sort();
    serials.dedup();
    assert_eq!(serials.len(), n, "duplicate serials across nodes");
}
