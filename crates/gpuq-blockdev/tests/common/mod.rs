//! Test harness for real loop devices (shared by the gpuq-blockdev and
//! gpuq-node test binaries through `#[path]`).
//!
//! Rules it enforces:
//! - every loop device is created with `losetup -f --show` on a sparse file
//!   in the test's own temporary directory, and only those are detached
//!   (by the path losetup printed), in `Drop`, also when the test panics;
//! - whatever a test stacks on a device (mounts, swap, partition nodes,
//!   helper processes) is undone in `Drop` before the detach;
//! - a loop device whose discard support was turned off cannot be repaired
//!   (the kernel keeps `discard_max_bytes` as a user limit across the
//!   detach, and with it 0 the granularity is 0 and every new value is
//!   refused) and is removed with `LOOP_CTL_REMOVE` after detaching; the
//!   detach and the remove happen under the same lock as every `losetup
//!   -f` here, so no other test thread can be handed it in between (CI saw
//!   that once); a loop device handed to us with discard off (another
//!   process left it so) is detached, removed and replaced.
#![allow(dead_code)]

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::Hasher;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;

/// A missing requirement fails the calling test with the reason (the suite
/// installs everything: integration/install-deps); a developer may skip
/// knowingly with GPUQ_ALLOW_SKIP=1 (tests/skip).
#[macro_export]
macro_rules! require {
    ($cond:expr, $why:expr) => {
        if let Err(reason) = $cond {
            $crate::common::skip($why, &reason);
            return;
        }
    };
}

/// Fail with the reason (or skip where a developer set GPUQ_ALLOW_SKIP=1).
pub fn skip(why: &str, reason: &str) {
    gpuq_test_skip::cannot_run(why, reason);
}

/// Ok when we are root.
pub fn root() -> Result<(), String> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err("needs root (loop devices)".into())
    }
}

/// Ok when every tool is on PATH.
pub fn tools(names: &[&str]) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    for n in names {
        if !dirs.iter().any(|d| d.join(n).is_file()) {
            return Err(format!("needs `{n}` (not installed)"));
        }
    }
    Ok(())
}

/// Run a command, panic with its output on failure.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh_quiet(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One loop device over a sparse file, torn down on drop.
pub struct LoopDev {
    pub dir: tempfile::TempDir,
    pub backing: PathBuf,
    /// `/dev/loopN` exactly as `losetup --show` printed it.
    pub dev: PathBuf,
    pub name: String,
    pub size: u64,
    children: Vec<Child>,
    mounts: Vec<PathBuf>,
    swap_on: bool,
    partx: bool,
    discard_disabled: bool,
    stacked: Vec<PathBuf>,
}

impl LoopDev {
    /// A sparse file of `size` bytes with a recognisable pattern in its
    /// first and last MiB, attached as a loop device that reports
    /// non-rotational (loop devices say rotational=1 by default).
    pub fn new(size: u64) -> LoopDev {
        Self::with_losetup_args(size, &[])
    }

    /// Like [`LoopDev::new`] with extra `losetup` options (`-r`).
    pub fn with_losetup_args(size: u64, extra: &[&str]) -> LoopDev {
        Self::build(None, size, extra)
    }

    /// Like [`LoopDev::new`], its backing file in a new directory under
    /// `parent` (e.g. on a filesystem another loop device holds).
    pub fn new_in(parent: &Path, size: u64) -> LoopDev {
        Self::build(Some(parent), size, &[])
    }

    fn build(parent: Option<&Path>, size: u64, extra: &[&str]) -> LoopDev {
        let mut b = tempfile::Builder::new();
        b.prefix("gpuq-blk-");
        let dir = match parent {
            Some(p) => b.tempdir_in(p).unwrap(),
            None => b.tempdir().unwrap(),
        };
        let backing = dir.path().join("backing.img");
        let f = File::create(&backing).unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let mut f = fs::OpenOptions::new().write(true).open(&backing).unwrap();
        let pat: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 ^ 0x5a).collect();
        f.write_all(&pat).unwrap();
        f.seek(SeekFrom::Start(size - MIB)).unwrap();
        f.write_all(&pat).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let mut args = vec!["-f", "--show"];
        args.extend_from_slice(extra);
        args.push(backing.to_str().unwrap());
        let (dev, name) = {
            let _g = LOOP_ALLOC.lock().unwrap_or_else(|e| e.into_inner());
            let mut tries = 0;
            loop {
                let out = sh("losetup", &args);
                let dev = PathBuf::from(out.trim());
                let name = dev.file_name().unwrap().to_string_lossy().into_owned();
                if !discard_left_off(&name) {
                    break (dev, name);
                }
                tries += 1;
                assert!(
                    tries < 8,
                    "losetup keeps handing out loop devices with discard off"
                );
                eprintln!(
                    "note: {name} came with discard off (left so by another process): removing it"
                );
                let _ = sh_quiet("losetup", &["-d", dev.to_str().unwrap()]);
                remove_loop(&name);
            }
        };
        let d = LoopDev {
            dir,
            backing,
            dev,
            name,
            size,
            children: Vec::new(),
            mounts: Vec::new(),
            swap_on: false,
            partx: false,
            discard_disabled: false,
            stacked: Vec::new(),
        };
        d.set_rotational(false);
        d
    }

    pub fn dev_str(&self) -> &str {
        self.dev.to_str().unwrap()
    }

    pub fn sys(&self, attr: &str) -> PathBuf {
        PathBuf::from(format!("/sys/block/{}/{attr}", self.name))
    }

    pub fn set_rotational(&self, rot: bool) {
        fs::write(self.sys("queue/rotational"), if rot { "1" } else { "0" }).unwrap();
    }

    /// Turn discard off (`discard_max_bytes=0`): cannot be undone, so the
    /// device is removed with LOOP_CTL_REMOVE on drop.
    pub fn disable_discard(&mut self) {
        self.discard_disabled = true;
        fs::write(self.sys("queue/discard_max_bytes"), "0").unwrap();
    }

    /// Note that discard will be turned off on this device by someone else
    /// (a fault hook writing `discard_max_bytes`): remove it on drop.
    pub fn expect_discard_disabled(&mut self) {
        self.discard_disabled = true;
    }

    /// Hash of the first and last MiB of the backing file (host side).
    pub fn edge_hash(&self) -> (u64, u64) {
        let mut f = File::open(&self.backing).unwrap();
        let mut buf = vec![0u8; MIB as usize];
        f.read_exact(&mut buf).unwrap();
        let mut h1 = DefaultHasher::new();
        h1.write(&buf);
        f.seek(SeekFrom::Start(self.size - MIB)).unwrap();
        f.read_exact(&mut buf).unwrap();
        let mut h2 = DefaultHasher::new();
        h2.write(&buf);
        (h1.finish(), h2.finish())
    }

    /// Allocated bytes of the backing file.
    pub fn allocated(&self) -> u64 {
        fs::metadata(&self.backing).unwrap().blocks() * 512
    }

    /// Write `len` bytes of non-zero data at `off` through the device.
    pub fn write_data(&self, off: u64, len: usize) {
        let mut f = fs::OpenOptions::new().write(true).open(&self.dev).unwrap();
        f.seek(SeekFrom::Start(off)).unwrap();
        f.write_all(&vec![0xa5u8; len]).unwrap();
        f.sync_all().unwrap();
    }

    /// Whether the first `len` bytes of the backing file are zero.
    pub fn head_is_zero(&self, len: usize) -> bool {
        let mut f = File::open(&self.backing).unwrap();
        let mut buf = vec![0u8; len];
        f.read_exact(&mut buf).unwrap();
        buf.iter().all(|b| *b == 0)
    }

    pub fn mkfs(&self, tool: &str, extra: &[&str]) {
        let mut args: Vec<&str> = extra.to_vec();
        args.push(self.dev_str());
        sh(tool, &args);
    }

    /// Mount the device (filesystem already made) under the temp dir.
    pub fn mount(&mut self) -> PathBuf {
        let mp = self.dir.path().join("mnt");
        fs::create_dir_all(&mp).unwrap();
        sh("mount", &[self.dev_str(), mp.to_str().unwrap()]);
        self.mounts.push(mp.clone());
        mp
    }

    pub fn swapon(&mut self) {
        sh("mkswap", &[self.dev_str()]);
        sh("swapon", &[self.dev_str()]);
        self.swap_on = true;
    }

    /// Create partition nodes from the table (`partx -a`; no kernel scan
    /// on this machine).
    pub fn partx_add(&mut self) {
        self.partx = true;
        sh("partx", &["-a", self.dev_str()]);
    }

    /// Keep the device open (plain, read-only) in a child process; returns
    /// its PID. `argv0_copy` names a copy of `sleep` to run instead (to
    /// impersonate an engine by command name).
    pub fn hold_open(&mut self, as_name: Option<&str>) -> u32 {
        let prog = match as_name {
            Some(n) => {
                let p = self.dir.path().join(n);
                fs::copy("/bin/sleep", &p).unwrap();
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
                p
            }
            None => PathBuf::from("/bin/sleep"),
        };
        // A copy just written may still be open for writing in a child that
        // another test thread forked meanwhile (until that child execs):
        // exec then fails with ETXTBSY. Retry briefly.
        let mut tries = 0;
        let child = loop {
            let f = File::open(&self.dev).unwrap();
            match Command::new(&prog)
                .arg("600")
                .stdin(Stdio::from(f))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other.unwrap(),
            }
        };
        let pid = child.id();
        self.children.push(child);
        // Wait until the child has really started with the fd.
        for _ in 0..100 {
            if fs::read_link(format!("/proc/{pid}/fd/0")).is_ok_and(|t| t == self.dev) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        pid
    }

    /// Hold `flock(LOCK_EX)` on the device from a child process (util-linux
    /// `flock --no-fork`, so the child we kill in `Drop` is the process that
    /// holds the lock and the descriptor); returns its PID once the lock is
    /// visible in /proc/locks.
    pub fn hold_flock(&mut self) -> u32 {
        let child = Command::new("flock")
            .args(["--no-fork", "--exclusive", self.dev_str(), "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.children.push(child);
        let needle = format!(" {pid} ");
        for _ in 0..500 {
            let locks = fs::read_to_string("/proc/locks").unwrap_or_default();
            if locks
                .lines()
                .any(|l| l.contains("FLOCK") && l.contains(&needle))
            {
                return pid;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("flock helper {pid} did not take its lock");
    }

    /// A second loop device backed by this block device.
    pub fn stack_loop(&mut self) -> PathBuf {
        let out = {
            let _g = LOOP_ALLOC.lock().unwrap_or_else(|e| e.into_inner());
            sh("losetup", &["-f", "--show", self.dev_str()])
        };
        let p = PathBuf::from(out.trim());
        self.stacked.push(p.clone());
        p
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for m in self.mounts.drain(..).rev() {
            for _ in 0..50 {
                if sh_quiet("umount", &[m.to_str().unwrap()]) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if self.swap_on {
            let _ = sh_quiet("swapoff", &[self.dev.to_str().unwrap()]);
        }
        for s in self.stacked.drain(..) {
            let _ = sh_quiet("losetup", &["-d", s.to_str().unwrap()]);
        }
        if self.partx {
            let _ = sh_quiet("partx", &["-d", self.dev.to_str().unwrap()]);
        }
        let _g = LOOP_ALLOC.lock().unwrap_or_else(|e| e.into_inner());
        let _ = sh_quiet("losetup", &["-d", self.dev.to_str().unwrap()]);
        if self.discard_disabled {
            remove_loop(&self.name);
        }
    }
}

/// Held around every `losetup -f` and around the detach + remove of a
/// loop device whose discard was turned off, so that no thread of this
/// test binary is handed that device between the two.
static LOOP_ALLOC: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The kernel offers discard on this loop device but its queue refuses it
/// (a user limit of 0 that outlived an earlier user's detach).
fn discard_left_off(name: &str) -> bool {
    let read = |attr: &str| {
        fs::read_to_string(format!("/sys/block/{name}/queue/{attr}")).unwrap_or_default()
    };
    read("discard_max_bytes").trim() == "0" && read("discard_max_hw_bytes").trim() != "0"
}

/// LOOP_CTL_REMOVE for a loop device we created and detached; retried
/// while the detach completes.
fn remove_loop(name: &str) {
    let Some(idx) = name
        .strip_prefix("loop")
        .and_then(|n| n.parse::<u32>().ok())
    else {
        return;
    };
    let Ok(ctl) = File::open("/dev/loop-control") else {
        return;
    };
    for _ in 0..100 {
        match gpuq_sys::blk::loop_ctl_remove(ctl.as_fd(), idx) {
            Ok(()) => return,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    eprintln!("warning: could not remove {name} (LOOP_CTL_REMOVE kept failing)");
}

/// A node configuration in a temp dir with the given `[[devices]]` tables.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub jobs: PathBuf,
}

impl Node {
    pub fn new(allow_loop: bool, devices: &[String]) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("gpuq-node-")
            .tempdir()
            .unwrap();
        let jobs = dir.path().join("jobs");
        let mut t = format!(
            "[node]\nname = \"t1\"\nsocket = \"{0}/node.sock\"\npodman_socket = \"{0}/podman.sock\"\n\
             jobs_dir = \"{0}/jobs\"\ntest_dir = \"{0}/test\"\nallow_loop_devices = {allow_loop}\n",
            dir.path().display()
        );
        for d in devices {
            t.push_str("\n[[devices]]\n");
            t.push_str(d);
            t.push('\n');
        }
        let config = dir.path().join("node.toml");
        fs::write(&config, t).unwrap();
        fs::set_permissions(&config, fs::Permissions::from_mode(0o600)).unwrap();
        Node { dir, config, jobs }
    }

    /// A node allowing loop devices, one entry per device.
    pub fn for_loops(devs: &[&LoopDev]) -> Node {
        let entries: Vec<String> = devs.iter().map(|d| loop_entry(d)).collect();
        Node::new(true, &entries)
    }

    pub fn load(&self) -> gpuq_blockdev::NodeConfig {
        gpuq_blockdev::NodeConfig::load(&self.config).unwrap()
    }

    pub fn set_active_lease(&self, lease: &str) {
        fs::create_dir_all(&self.jobs).unwrap();
        fs::write(self.jobs.join("active-lease"), lease).unwrap();
    }
}

/// `loop_backing_file = "..."` for a device.
pub fn loop_entry(d: &LoopDev) -> String {
    format!("loop_backing_file = \"{}\"", d.backing.display())
}

/// The LVM `--config` that works without udev (environment.md), limited to
/// one device so that LVM does not open other tests' loop devices.
pub fn lvm_config(dev: &Path) -> String {
    format!(
        "devices{{obtain_device_list_from_udev=0 use_devicesfile=0 filter=[\"a|^{0}$|\",\"r|.*|\"] global_filter=[\"a|^{0}$|\",\"r|.*|\"]}} activation{{udev_sync=0 udev_rules=0}}",
        dev.display()
    )
}
