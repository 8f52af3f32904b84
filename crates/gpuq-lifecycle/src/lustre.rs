//! `--stor lustre`: the plan of a lease's Lustre file system on the
//! storage nodes — which allowlisted namespace becomes which target, with
//! which index and label, the `mkfs.lustre` each node would run in its
//! pinned image, in which order the targets would be mounted, and what
//! this host would mount.
//!
//! Only the plan. No machine here has Lustre's server modules or its
//! tools (no Debian kernel or package ships them, and nothing else is
//! reachable to build them), so nothing of a Lustre stand-up has run:
//! the broker refuses `--stor lustre` on a site whose nodes lack the
//! modules (their kernel report), and its configuration refuses a
//! `kind = "lustre"` profile until the stand-up has run against a real
//! Lustre server (docs/stor-research.md §11). Pure: no I/O.

use std::net::IpAddr;

/// One node's part: its name, its storage address and how many
/// namespaces its allowlist holds (in allowlist order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNamespaces {
    pub node: String,
    pub address: IpAddr,
    pub namespaces: usize,
}

/// The LNet network of the targets and the client: the profile's
/// transport (`tcp` → `tcp`, `rdma` → `o2ib`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lnet {
    Tcp,
    O2ib,
}

impl Lnet {
    /// From a `[stor.NAME]` transport; `None` for any other word.
    pub fn of_transport(t: &str) -> Option<Lnet> {
        match t {
            "tcp" => Some(Lnet::Tcp),
            "rdma" => Some(Lnet::O2ib),
            _ => None,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Lnet::Tcp => "tcp",
            Lnet::O2ib => "o2ib",
        }
    }
}

/// What a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The management server and the (only) metadata target, together on
    /// one namespace of the metadata node.
    MgsMdt,
    /// An object storage target.
    Ost,
}

/// One target: a namespace of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    /// The namespace's position in the node's allowlist (0 = first).
    pub namespace: usize,
    pub role: Role,
    /// The target's index (the MDT's is 0; the OSTs' 0, 1, … over all
    /// nodes in order).
    pub index: u32,
    /// Its label, as Lustre names it (`FSNAME-MDT0000`, `FSNAME-OST0003`).
    pub label: String,
}

/// A lease's Lustre file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub fsname: String,
    /// The management server's LNet address (`10.0.0.14@tcp`).
    pub mgs_nid: String,
    /// The metadata target first, then the OSTs by index: the order in
    /// which they are mounted (an OST registers with a running MGS).
    pub targets: Vec<Target>,
}

/// Why no plan can be made: the configuration, not the moment, is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the metadata node {0} is not one of the site's nodes")]
    UnknownMdsNode(String),
    #[error(
        "the metadata node {0} has {1} allowlisted namespace(s): its MDT needs one of its own beside at least one OST (allowlist a second namespace, or name another node)"
    )]
    MdsNeedsTwo(String, usize),
    #[error("{0} has no allowlisted namespace: every node serves at least one OST")]
    NoNamespace(String),
}

/// The file system's name for `lease`: `gq` and six hex digits of a hash
/// of the lease ID — within Lustre's eight characters, letters and digits
/// only, and a new name for each lease (a target of an earlier lease that
/// the wipe missed would not join this one).
pub fn fsname(lease: &str) -> String {
    // FNV-1a, 32 bits: a stable name, not a secret.
    let mut h: u32 = 0x811c_9dc5;
    for b in lease.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("gq{:06x}", h & 0x00ff_ffff)
}

/// The plan for `lease` on `nodes` (in the site's order), the MGS and MDT
/// on the first namespace of `mds_node`, an OST on every other namespace.
pub fn plan(
    lease: &str,
    mds_node: &str,
    nodes: &[NodeNamespaces],
    lnet: Lnet,
) -> Result<Plan, PlanError> {
    let mds = nodes
        .iter()
        .find(|n| n.node == mds_node)
        .ok_or_else(|| PlanError::UnknownMdsNode(mds_node.to_string()))?;
    if mds.namespaces < 2 {
        return Err(PlanError::MdsNeedsTwo(mds.node.clone(), mds.namespaces));
    }
    if let Some(n) = nodes.iter().find(|n| n.namespaces == 0) {
        return Err(PlanError::NoNamespace(n.node.clone()));
    }
    let fsname = fsname(lease);
    let mut targets = vec![Target {
        node: mds.node.clone(),
        namespace: 0,
        role: Role::MgsMdt,
        index: 0,
        label: format!("{fsname}-MDT0000"),
    }];
    let mut index = 0u32;
    for n in nodes {
        let first = if n.node == mds.node { 1 } else { 0 };
        for namespace in first..n.namespaces {
            targets.push(Target {
                node: n.node.clone(),
                namespace,
                role: Role::Ost,
                index,
                label: format!("{fsname}-OST{index:04x}"),
            });
            index += 1;
        }
    }
    Ok(Plan {
        mgs_nid: format!("{}@{}", mds.address, lnet.suffix()),
        fsname,
        targets,
    })
}

impl Plan {
    /// The command that formats `target` on `device`, run in the node's
    /// pinned image. Never `--reformat`: `mkfs.lustre` then refuses a
    /// device that already holds a Lustre target (the wipe must have left
    /// none; a device that holds one is not ours to overwrite).
    pub fn mkfs_args(&self, target: &Target, device: &str) -> Vec<String> {
        let mut a = vec![
            "mkfs.lustre".to_string(),
            format!("--fsname={}", self.fsname),
        ];
        match target.role {
            Role::MgsMdt => a.extend(["--mgs".to_string(), "--mdt".to_string()]),
            Role::Ost => a.extend(["--ost".to_string(), format!("--mgsnode={}", self.mgs_nid)]),
        }
        a.extend([
            format!("--index={}", target.index),
            "--backfstype=ldiskfs".to_string(),
            device.to_string(),
        ]);
        a
    }

    /// What this host mounts (`mount -t lustre SOURCE DIR`).
    pub fn client_source(&self) -> String {
        format!("{}:/{}", self.mgs_nid, self.fsname)
    }

    /// The targets of `node`, in mount order.
    pub fn targets_of<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Target> + 'a {
        self.targets.iter().filter(move |t| t.node == node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The site VM's layout: one namespace on da1–da3, two on da4.
    fn site() -> Vec<NodeNamespaces> {
        [
            ("da1", 11, 1),
            ("da2", 12, 1),
            ("da3", 13, 1),
            ("da4", 14, 2),
        ]
        .into_iter()
        .map(|(n, a, k)| NodeNamespaces {
            node: n.into(),
            address: format!("10.200.0.{a}").parse().unwrap(),
            namespaces: k,
        })
        .collect()
    }

    #[test]
    fn the_mdt_takes_the_metadata_nodes_first_namespace_and_every_other_one_is_an_ost() {
        let p = plan("L-20261205-0001", "da4", &site(), Lnet::Tcp).unwrap();
        assert_eq!(p.mgs_nid, "10.200.0.14@tcp");
        let got: Vec<(&str, usize, Role, u32, &str)> = p
            .targets
            .iter()
            .map(|t| {
                (
                    t.node.as_str(),
                    t.namespace,
                    t.role,
                    t.index,
                    t.label.as_str(),
                )
            })
            .collect();
        let f = &p.fsname;
        assert_eq!(
            got,
            vec![
                ("da4", 0, Role::MgsMdt, 0, format!("{f}-MDT0000").as_str()),
                ("da1", 0, Role::Ost, 0, format!("{f}-OST0000").as_str()),
                ("da2", 0, Role::Ost, 1, format!("{f}-OST0001").as_str()),
                ("da3", 0, Role::Ost, 2, format!("{f}-OST0002").as_str()),
                ("da4", 1, Role::Ost, 3, format!("{f}-OST0003").as_str()),
            ]
        );
        assert_eq!(p.client_source(), format!("10.200.0.14@tcp:/{f}"));
        assert_eq!(
            p.targets_of("da4").map(|t| t.role).collect::<Vec<_>>(),
            vec![Role::MgsMdt, Role::Ost]
        );
    }

    #[test]
    fn mkfs_lustre_is_asked_for_exactly_one_target_and_never_to_reformat() {
        let p = plan("L-1", "da4", &site(), Lnet::O2ib).unwrap();
        let f = p.fsname.clone();
        assert_eq!(
            p.mkfs_args(&p.targets[0], "/dev/nvme4n1"),
            [
                "mkfs.lustre".to_string(),
                format!("--fsname={f}"),
                "--mgs".into(),
                "--mdt".into(),
                "--index=0".into(),
                "--backfstype=ldiskfs".into(),
                "/dev/nvme4n1".into(),
            ]
        );
        assert_eq!(
            p.mkfs_args(&p.targets[4], "/dev/nvme4n2"),
            [
                "mkfs.lustre".to_string(),
                format!("--fsname={f}"),
                "--ost".into(),
                "--mgsnode=10.200.0.14@o2ib".into(),
                "--index=3".into(),
                "--backfstype=ldiskfs".into(),
                "/dev/nvme4n2".into(),
            ]
        );
        for t in &p.targets {
            assert!(!p
                .mkfs_args(t, "/dev/x")
                .iter()
                .any(|a| a.contains("reformat")));
        }
    }

    #[test]
    fn a_layout_without_room_for_the_mdt_or_an_ost_is_refused_naming_the_node() {
        let e = plan("L-1", "da1", &site(), Lnet::Tcp).unwrap_err();
        assert_eq!(e, PlanError::MdsNeedsTwo("da1".into(), 1));
        assert!(
            e.to_string().contains("allowlist a second namespace"),
            "{e}"
        );
        assert_eq!(
            plan("L-1", "da9", &site(), Lnet::Tcp).unwrap_err(),
            PlanError::UnknownMdsNode("da9".into())
        );
        let mut s = site();
        s[1].namespaces = 0;
        assert_eq!(
            plan("L-1", "da4", &s, Lnet::Tcp).unwrap_err(),
            PlanError::NoNamespace("da2".into())
        );
    }

    #[test]
    fn the_fsname_fits_lustre_and_differs_between_leases() {
        let a = fsname("L-20261205-0001");
        let b = fsname("L-20261205-0002");
        for f in [&a, &b] {
            assert_eq!(f.len(), 8, "{f}");
            assert!(f.bytes().all(|c| c.is_ascii_alphanumeric()), "{f}");
            assert!(f.as_bytes()[0].is_ascii_alphabetic(), "{f}");
        }
        assert_ne!(a, b);
        assert_eq!(a, fsname("L-20261205-0001"));
        assert_eq!(Lnet::of_transport("rdma"), Some(Lnet::O2ib));
        assert_eq!(Lnet::of_transport("roce"), None);
    }
}
