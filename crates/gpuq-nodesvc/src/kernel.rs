//! What this node's running kernel offers kernel storage jobs (`--stor`),
//! for `GET /v1/status`: read from the kernel's module index
//! (`/lib/modules/RELEASE/modules.dep`, `modules.builtin`) and the modules
//! already loaded (`/sys/module`). Nothing is loaded or run: a module that
//! is installed can be loaded when a job needs it; one that is not cannot.
//!
//! These are system files of the node (root's, not a user's), read whole;
//! a file that cannot be read counts as listing nothing, and the report
//! says which one.

use std::collections::BTreeSet;
use std::path::PathBuf;

use gpuq_protocol::node::{StorKernel, Support};

/// Where the files are: the real ones in production, a tree of the same
/// shape in tests.
#[derive(Debug, Clone)]
pub struct KernelFiles {
    /// `/proc/sys/kernel/osrelease`.
    pub osrelease: PathBuf,
    /// `/lib/modules`.
    pub modules: PathBuf,
    /// `/sys/module`.
    pub loaded: PathBuf,
}

impl Default for KernelFiles {
    fn default() -> Self {
        Self {
            osrelease: "/proc/sys/kernel/osrelease".into(),
            modules: "/lib/modules".into(),
            loaded: "/sys/module".into(),
        }
    }
}

/// One requirement: a module, or any one of several.
type Need = &'static [&'static str];

const NVMEOF_TARGET: &[Need] = &[&["nvmet"], &["nvmet_tcp", "nvmet_rdma"]];
const NFS_SERVER: &[Need] = &[&["nfsd"], &["xfs"]];
const LUSTRE_SERVER: &[Need] = &[
    &["lnet"],
    &["ptlrpc"],
    &["mgs"],
    &["mdt"],
    &["ofd"],
    &["osd_ldiskfs", "osd_zfs"],
];

/// The modules a kernel has: installed (modules.dep), built in
/// (modules.builtin) or loaded (/sys/module), by name with `-` as `_`.
#[derive(Debug, Default)]
struct Modules {
    names: BTreeSet<String>,
    /// Index files that could not be read, with why.
    unread: Vec<String>,
}

impl Modules {
    fn read(files: &KernelFiles, release: &str) -> Modules {
        let mut m = Modules::default();
        let dir = files.modules.join(release);
        for index in ["modules.dep", "modules.builtin"] {
            let p = dir.join(index);
            match std::fs::read_to_string(&p) {
                Ok(text) => m.names.extend(index_names(&text)),
                Err(e) => m.unread.push(format!("{}: {e}", p.display())),
            }
        }
        if let Ok(rd) = std::fs::read_dir(&files.loaded) {
            m.names.extend(
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().replace('-', "_")),
            );
        }
        m
    }

    fn support(&self, needs: &[Need], release: &str) -> Support {
        let missing: Vec<String> = needs
            .iter()
            .filter(|any| !any.iter().any(|n| self.names.contains(*n)))
            .map(|any| any.join(" or "))
            .collect();
        if missing.is_empty() {
            return Support {
                available: true,
                missing: None,
            };
        }
        let mut line = format!("kernel {release} has no {}", missing.join(", "));
        if !self.unread.is_empty() {
            line.push_str(&format!(" (unread: {})", self.unread.join("; ")));
        }
        Support {
            available: false,
            missing: Some(line),
        }
    }
}

/// Module names in a `modules.dep` (`kernel/fs/xfs/xfs.ko.xz: deps...`) or
/// `modules.builtin` (`kernel/fs/nfsd/nfsd.ko`) text: the file name of the
/// first field, without its `.ko` suffix (and compression), `-` as `_`.
fn index_names(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines().filter_map(|line| {
        let path = line.split(':').next()?.trim();
        let file = path.rsplit('/').next()?;
        let stem = ["", ".xz", ".zst", ".gz"]
            .iter()
            .find_map(|c| file.strip_suffix(&format!(".ko{c}")))?;
        (!stem.is_empty()).then(|| stem.replace('-', "_"))
    })
}

/// The running kernel's support for each `--stor` kind.
pub fn probe(files: &KernelFiles) -> StorKernel {
    let release = std::fs::read_to_string(&files.osrelease)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unknown ({}: {e})", files.osrelease.display()));
    let m = Modules::read(files, &release);
    StorKernel {
        nvmeof_target: m.support(NVMEOF_TARGET, &release),
        nfs_server: m.support(NFS_SERVER, &release),
        lustre_server: m.support(LUSTRE_SERVER, &release),
        release,
    }
}

#[cfg(test)]
impl KernelFiles {
    /// The files under `root` laid out as on a host.
    fn under(root: &std::path::Path) -> KernelFiles {
        KernelFiles {
            osrelease: root.join("proc/sys/kernel/osrelease"),
            modules: root.join("lib/modules"),
            loaded: root.join("sys/module"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host tree: `release`, its modules.dep and modules.builtin lines,
    /// the loaded modules.
    fn host(release: &str, dep: &str, builtin: &str, loaded: &[&str]) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let f = KernelFiles::under(t.path());
        std::fs::create_dir_all(f.osrelease.parent().unwrap()).unwrap();
        std::fs::write(&f.osrelease, format!("{release}\n")).unwrap();
        let dir = f.modules.join(release);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("modules.dep"), dep).unwrap();
        std::fs::write(dir.join("modules.builtin"), builtin).unwrap();
        std::fs::create_dir_all(&f.loaded).unwrap();
        for m in loaded {
            std::fs::create_dir(f.loaded.join(m)).unwrap();
        }
        t
    }

    #[test]
    fn debian_s_cloud_kernel_offers_nvmeof_and_nfs_but_no_lustre_server() {
        // Lines as in Debian 12's 6.1 cloud kernel (compressed modules).
        let dep = "kernel/drivers/nvme/target/nvmet.ko.xz: kernel/drivers/nvme/common/nvme-common.ko.xz\n\
                   kernel/drivers/nvme/target/nvmet-tcp.ko.xz: kernel/drivers/nvme/target/nvmet.ko.xz\n\
                   kernel/fs/nfsd/nfsd.ko.xz: kernel/fs/nfs_common/grace.ko.xz kernel/net/sunrpc/sunrpc.ko.xz\n\
                   kernel/fs/xfs/xfs.ko.xz: kernel/lib/libcrc32c.ko.xz\n";
        let t = host("6.1.0-57-cloud-amd64", dep, "kernel/fs/ext4/ext4.ko\n", &[]);
        let k = probe(&KernelFiles::under(t.path()));
        assert_eq!(k.release, "6.1.0-57-cloud-amd64");
        assert!(k.nvmeof_target.available, "{k:?}");
        assert!(k.nfs_server.available, "{k:?}");
        assert!(!k.lustre_server.available);
        let why = k.lustre_server.missing.unwrap();
        assert_eq!(
            why,
            "kernel 6.1.0-57-cloud-amd64 has no lnet, ptlrpc, mgs, mdt, ofd, osd_ldiskfs or osd_zfs"
        );
    }

    #[test]
    fn a_lustre_server_kernel_is_recognised_from_its_kmod_and_dkms_paths() {
        // The RPMs' layout (extra/lustre, the OSD split out) and DKMS's.
        let dep = "extra/lustre/net/libcfs.ko: \n\
                   extra/lustre/net/lnet.ko: extra/lustre/net/libcfs.ko\n\
                   extra/lustre/fs/ptlrpc.ko: extra/lustre/fs/obdclass.ko\n\
                   extra/lustre/fs/mgs.ko: extra/lustre/fs/ptlrpc.ko\n\
                   extra/lustre/fs/mdt.ko: extra/lustre/fs/ptlrpc.ko\n\
                   updates/dkms/ofd.ko.zst: extra/lustre/fs/ptlrpc.ko\n\
                   extra/lustre-osd-ldiskfs/fs/osd_ldiskfs.ko: extra/lustre-osd-ldiskfs/fs/ldiskfs.ko\n";
        let t = host("4.18.0-513.el8_lustre.x86_64", dep, "", &[]);
        let k = probe(&KernelFiles::under(t.path()));
        assert!(k.lustre_server.available, "{k:?}");
        assert_eq!(k.lustre_server.missing, None);
        // No nvmet, no nfsd listed: said, by name.
        assert_eq!(
            k.nvmeof_target.missing.as_deref(),
            Some("kernel 4.18.0-513.el8_lustre.x86_64 has no nvmet, nvmet_tcp or nvmet_rdma")
        );
    }

    #[test]
    fn built_in_and_loaded_modules_count_and_dashes_are_underscores() {
        // nvmet built in, nvmet-rdma (a dash in the file name) installed,
        // nfsd and xfs already loaded.
        let t = host(
            "6.9.0-custom",
            "kernel/drivers/nvme/target/nvmet-rdma.ko.gz: \n",
            "kernel/drivers/nvme/target/nvmet.ko\n",
            &["nfsd", "xfs"],
        );
        let k = probe(&KernelFiles::under(t.path()));
        assert!(k.nvmeof_target.available, "{k:?}");
        assert!(k.nfs_server.available, "{k:?}");
    }

    #[test]
    fn a_kernel_without_an_index_is_reported_with_the_file_that_was_missing() {
        // As on a host booted from a kernel that has no /lib/modules tree
        // (this test machine's own): nothing installed; what was unread is
        // named.
        let t = tempfile::tempdir().unwrap();
        let f = KernelFiles::under(t.path());
        std::fs::create_dir_all(f.osrelease.parent().unwrap()).unwrap();
        std::fs::write(&f.osrelease, "6.18.44-fc\n").unwrap();
        let k = probe(&f);
        let why = k.lustre_server.missing.unwrap();
        assert!(why.starts_with("kernel 6.18.44-fc has no lnet"), "{why}");
        assert!(
            why.contains("lib/modules/6.18.44-fc/modules.dep: No such file"),
            "{why}"
        );
        assert!(!k.nfs_server.available && !k.nvmeof_target.available);
    }

    #[test]
    fn lines_that_name_no_module_are_ignored() {
        let names: Vec<String> =
            index_names("\n# comment\nkernel/fs/xfs/README\n.ko: x\nkernel/a/b-c.ko: \n").collect();
        assert_eq!(names, vec!["b_c".to_string()]);
    }
}
