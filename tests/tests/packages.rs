//! The packages `integration/package` builds (tests/run builds them before
//! the tests), checked with the real tools: `rpmlint`; `rpm -qp` for modes,
//! owners, config flags, scriptlets and requirements; `rpm --root` installs
//! into an empty root (never this machine's database) and upgrades over a
//! changed configuration; the debs installed and upgraded for real with
//! `dpkg` inside the systemd box (integration/systemd-box), where systemd
//! is PID 1. A missing tool, package or box fails the test (tests/skip).
//!
//! The upgrade needs a second release whose packaged configuration
//! differs: `integration/package --no-build --release 2
//! --test-config-change` makes it from the same binaries, once per run,
//! into `target/packages-upgrade-test/`.

use gpuq_system_tests::systemd_box::SystemdBox;
use gpuq_system_tests::{bin_dir, cannot_run, require_systemd_box, stderr, stdout, which};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    bin_dir()
        .parent()
        .expect("bin dir is target/<profile>")
        .to_path_buf()
}

/// Fails (or skips, with GPUQ_ALLOW_SKIP=1) unless root and every tool is
/// here; `false` means: return now.
fn have(test: &str, tools: &[&str]) -> bool {
    if !nix::unistd::Uid::effective().is_root() {
        cannot_run(test, "needs root (rpm --root, podman)");
        return false;
    }
    for t in tools {
        if which(t).is_none() {
            cannot_run(
                test,
                &format!("needs {t} (integration/install-deps installs rpm, rpmlint, dpkg-dev, busybox-static)"),
            );
            return false;
        }
    }
    true
}

/// The packages of one build directory.
#[derive(Debug, Clone)]
struct Pkgs {
    dir: PathBuf,
}

impl Pkgs {
    /// The one file in `dir` whose name starts with `prefix` and ends with
    /// `suffix` (the version is not spelled out here).
    fn find(&self, prefix: &str, suffix: &str) -> PathBuf {
        let hits: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy().to_string();
                n.starts_with(prefix) && n.ends_with(suffix)
            })
            .collect();
        assert_eq!(
            hits.len(),
            1,
            "{prefix}*{suffix} in {}: {hits:?}",
            self.dir.display()
        );
        hits[0].clone()
    }
    /// `gpuq` or `gpuq-node`, `el8` or `el9`.
    fn rpm(&self, package: &str, dist: &str) -> PathBuf {
        // `gpuq-0` so that gpuq does not match gpuq-node.
        self.find(&format!("{package}-0"), &format!(".{dist}.x86_64.rpm"))
    }
    fn deb(&self, package: &str) -> PathBuf {
        self.find(&format!("{package}_"), "_amd64.deb")
    }
    fn staged(&self, rel: &str) -> PathBuf {
        self.dir.join("build/stage").join(rel)
    }
}

/// Release 1, as `tests/run` built it (`integration/package`).
fn release1(test: &str) -> Option<Pkgs> {
    let dir = target_dir().join("packages");
    let p = Pkgs { dir: dir.clone() };
    let complete = dir.is_dir()
        && ["gpuq", "gpuq-node"].iter().all(|n| {
            std::fs::read_dir(&dir).unwrap().any(|e| {
                let f = e.unwrap().file_name().to_string_lossy().to_string();
                f.starts_with(&format!("{n}_")) && f.ends_with(".deb")
            })
        });
    if !complete {
        cannot_run(
            test,
            &format!(
                "no packages in {}: run integration/package first (tests/run does)",
                dir.display()
            ),
        );
        return None;
    }
    Some(p)
}

/// Release 2 with a changed packaged configuration, built once per run.
fn release2() -> Pkgs {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = target_dir().join("packages-upgrade-test");
        let _ = std::fs::remove_dir_all(&dir);
        let out = Command::new(workspace_root().join("integration/package"))
            .args([
                "--no-build",
                "--release",
                "2",
                "--test-config-change",
                "--out",
            ])
            .arg(&dir)
            .output()
            .expect("run integration/package");
        assert!(
            out.status.success(),
            "integration/package --release 2 failed:\n{}",
            stderr(&out)
        );
        dir
    });
    Pkgs { dir: dir.clone() }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

fn rpm_q(pkg: &Path, args: &[&str]) -> String {
    run_ok(Command::new("rpm").arg("-qp").args(args).arg(pkg))
}

#[test]
fn rpmlint_reports_no_errors_in_any_rpm() {
    if !have("rpmlint_reports_no_errors_in_any_rpm", &["rpmlint"]) {
        return;
    }
    let Some(p) = release1("rpmlint_reports_no_errors_in_any_rpm") else {
        return;
    };
    for dist in ["el8", "el9"] {
        for pkg in ["gpuq", "gpuq-node"] {
            let rpm = p.rpm(pkg, dist);
            let out = run(Command::new("rpmlint")
                .arg("-c")
                .arg(workspace_root().join("packaging/rpmlint.toml"))
                .arg(&rpm));
            let text = format!("{}{}", stdout(&out), stderr(&out));
            // rpmlint 2 ends with "N packages and M specfiles checked; E
            // errors, W warnings"; warnings (no %license file, ...) are
            // allowed, errors are not.
            assert!(
                text.contains(" 0 errors"),
                "rpmlint {}:\n{text}",
                rpm.display()
            );
        }
    }
}

/// What each file is, from the RPM's own header: modes and owners, the
/// configuration flagged `%config(noreplace)`, scriptlets that only print,
/// and the C library the binaries really need declared.
#[test]
fn rpm_headers_declare_modes_owners_noreplace_config_print_only_scripts_and_glibc() {
    let test = "rpm_headers_declare_modes_owners_noreplace_config_print_only_scripts_and_glibc";
    if !have(test, &["rpm", "objdump"]) {
        return;
    }
    let Some(p) = release1(test) else { return };
    for dist in ["el8", "el9"] {
        let gpuq = p.rpm("gpuq", dist);
        let node = p.rpm("gpuq-node", dist);
        // --dump: path size mtime digest mode owner group isconfig isdoc rdev symlink
        let dump = rpm_q(&gpuq, &["--dump"]) + &rpm_q(&node, &["--dump"]);
        let field = |path: &str| -> Vec<String> {
            dump.lines()
                .find(|l| l.split(' ').next() == Some(path))
                .unwrap_or_else(|| panic!("{path} not in the {dist} rpms:\n{dump}"))
                .split(' ')
                .map(String::from)
                .collect()
        };
        for (path, mode, config) in [
            ("/usr/bin/gpuq", "0100755", "0"),
            ("/usr/sbin/gpuq-broker", "0100755", "0"),
            ("/usr/sbin/gpuq-node", "0100755", "0"),
            ("/usr/libexec/gpuqueue-daos", "0100755", "0"),
            ("/usr/libexec/gpuq/gpuq-slurm", "0100755", "0"),
            (
                "/usr/share/doc/gpuq/examples/slurm/burst_buffer.lua",
                "0100644",
                "0",
            ),
            (
                "/usr/lib/systemd/system/gpuq-broker.service",
                "0100644",
                "0",
            ),
            ("/usr/lib/systemd/system/gpuq-node.service", "0100644", "0"),
            (
                "/usr/lib/udev/rules.d/59-gpuq-lease-devices.rules",
                "0100644",
                "0",
            ),
            ("/etc/gpuqueue-daos/broker.toml", "0100644", "1"),
            ("/etc/gpuqueue-daos/node.toml", "0100644", "1"),
            ("/usr/share/gpuq/manifests/gpuq.json", "0100644", "0"),
            ("/usr/share/gpuq/manifests/gpuq-node.json", "0100644", "0"),
            (
                "/usr/share/bash-completion/completions/gpuq",
                "0100644",
                "0",
            ),
            ("/usr/share/man/man1/gpuq-submit.1.gz", "0100644", "0"),
            ("/etc/gpuqueue-daos", "040755", "0"),
        ] {
            let f = field(path);
            assert_eq!(
                (f[4].as_str(), f[5].as_str(), f[6].as_str(), f[7].as_str()),
                (mode, "root", "root", config),
                "{dist} {path}: {f:?}"
            );
        }
        // Every file is root's; nothing setuid or writable by others.
        for l in dump.lines() {
            let f: Vec<&str> = l.split(' ').collect();
            let mode = u32::from_str_radix(f[4], 8).unwrap();
            assert!(
                f[5] == "root" && f[6] == "root" && mode & 0o6022 == 0,
                "{dist}: {l}"
            );
        }
        // %config(noreplace): rpm's flags say c(onfig) and n(oreplace).
        for (pkg, conf) in [
            (&gpuq, "/etc/gpuqueue-daos/broker.toml"),
            (&node, "/etc/gpuqueue-daos/node.toml"),
        ] {
            let flags = rpm_q(pkg, &["--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\\n]"]);
            let line = flags
                .lines()
                .find(|l| l.starts_with(&format!("{conf} ")))
                .unwrap();
            let fl = line.rsplit(' ').next().unwrap();
            assert!(fl.contains('c') && fl.contains('n'), "{line}");
            assert_eq!(
                rpm_q(pkg, &["--configfiles"]).trim(),
                conf,
                "only the configuration is %config"
            );
        }
        // Scriptlets only print: no systemctl call, no restart, no stop.
        for pkg in [&gpuq, &node] {
            let scripts = rpm_q(pkg, &["--scripts"]);
            assert!(scripts.contains("NOT restarted"), "{scripts}");
            for l in scripts.lines().map(str::trim) {
                let ok = l.is_empty()
                    || l.ends_with("scriptlet (using /bin/sh):")
                    || l.starts_with("if [ \"$1\" -eq")
                    || l == "else"
                    || l == "fi"
                    || l == "exit 0"
                    || (l.starts_with("echo \"")
                        && l.ends_with('"')
                        && l.matches('"').count() == 2);
                assert!(
                    ok,
                    "{dist}: a scriptlet line that does more than print: {l:?}"
                );
            }
        }
        // The binaries' real C library need is declared (rpm's automatic
        // ELF requirements): the newest GLIBC_ symbol version in the
        // packaged binary is a Requires. It is at most EL8's 2.28 (the
        // binaries are linked against it with cargo-zigbuild).
        for bin in [
            "gpuq/usr/bin/gpuq",
            "gpuq/usr/sbin/gpuq-broker",
            "gpuq/usr/libexec/gpuq/gpuq-slurm",
            "gpuq-node/usr/sbin/gpuq-node",
        ] {
            let (_, v) = glibc_needed(&p.staged(bin));
            assert!(
                v <= (2, 28),
                "{bin} needs glibc {v:?}, more than EL8's 2.28"
            );
        }
        let (needed, _) = glibc_needed(&p.staged("gpuq/usr/sbin/gpuq-broker"));
        let requires = rpm_q(&gpuq, &["--requires"]);
        assert!(
            requires.contains(&format!("libc.so.6({needed})(64bit)")),
            "{dist}: {needed} not required:\n{requires}"
        );
        let requires = rpm_q(&node, &["--requires"]);
        for lib in ["libc.so.6(", "libudev.so.1", "libblkid.so.1"] {
            assert!(
                requires.contains(lib),
                "{dist} gpuq-node: {lib}:\n{requires}"
            );
        }
    }
}

/// The newest `GLIBC_x.y` a binary needs, by `objdump -T`.
fn glibc_needed(binary: &Path) -> (String, (u32, u32)) {
    let dump = run_ok(Command::new("objdump").arg("-T").arg(binary));
    let mut best = (0u32, 0u32);
    for w in dump.split(|c: char| c.is_whitespace() || c == '(' || c == ')') {
        if let Some(v) = w.strip_prefix("GLIBC_") {
            let mut it = v.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
            let ver = (it.next().unwrap_or(0), it.next().unwrap_or(0));
            best = best.max(ver);
        }
    }
    (format!("GLIBC_{}.{}", best.0, best.1), best)
}

/// A throw-away root for `rpm --root` (its database inside it), removed on
/// drop, also after a failed assertion.
struct RpmRoot(tempfile::TempDir);

impl RpmRoot {
    fn new() -> Self {
        let d = tempfile::Builder::new()
            .prefix("gpuq-rpm-root-")
            .tempdir()
            .unwrap();
        // rpm runs the scriptlets chrooted in the root with /bin/sh: a
        // static busybox is the whole shell the empty root gets.
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        std::fs::copy("/bin/busybox", d.path().join("bin/busybox")).expect("copy /bin/busybox");
        std::os::unix::fs::symlink("busybox", d.path().join("bin/sh")).unwrap();
        let r = RpmRoot(d);
        run_ok(r.rpm().arg("--initdb"));
        r
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.0.path().join(rel.trim_start_matches('/'))
    }
    /// `rpm --root ROOT --dbpath /var/lib/rpm` (inside the root).
    fn rpm(&self) -> Command {
        let mut c = Command::new("rpm");
        c.arg("--root")
            .arg(self.0.path())
            .args(["--dbpath", "/var/lib/rpm"]);
        c
    }
}

#[test]
fn rpms_install_into_an_empty_root_and_an_upgrade_keeps_a_changed_config() {
    let test = "rpms_install_into_an_empty_root_and_an_upgrade_keeps_a_changed_config";
    if !have(test, &["rpm", "rpmbuild", "dpkg-deb", "/bin/busybox"]) {
        return;
    }
    let Some(p1) = release1(test) else { return };
    let p2 = release2();
    let root = RpmRoot::new();
    let v1 = [p1.rpm("gpuq", "el9"), p1.rpm("gpuq-node", "el9")];

    // The empty root has no C library: rpm refuses, naming the need.
    let out = run(root.rpm().arg("-i").args(&v1));
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("libc.so.6(GLIBC_"),
        "{}",
        stderr(&out)
    );
    assert!(!root.path("/usr/bin/gpuq").exists());

    // Without the dependency check, everything lands with its modes.
    let out = run_ok(root.rpm().args(["-i", "--nodeps"]).args(&v1));
    assert!(out.contains("gpuq: installed, not enabled"), "{out}");
    assert!(out.contains("gpuq-node: installed, not enabled"), "{out}");
    for (path, mode) in [
        ("/usr/bin/gpuq", 0o755),
        ("/usr/sbin/gpuq-broker", 0o755),
        ("/usr/sbin/gpuq-node", 0o755),
        ("/usr/libexec/gpuq/gpuq-slurm", 0o755),
        ("/etc/gpuqueue-daos/broker.toml", 0o644),
        ("/etc/gpuqueue-daos/node.toml", 0o644),
    ] {
        let m = std::fs::metadata(root.path(path)).unwrap();
        assert_eq!(
            (m.mode() & 0o7777, m.uid(), m.gid()),
            (mode, 0, 0),
            "{path}"
        );
    }
    // rpm -V: nothing differs from the package (--nodeps: the root has
    // no C library, which was proven above).
    let v = run(root.rpm().args(["-V", "--nodeps", "gpuq", "gpuq-node"]));
    assert!(
        v.status.success() && stdout(&v).is_empty(),
        "{}",
        stdout(&v)
    );
    // The shipped manifests agree with what was installed, file for file.
    for pkg in ["gpuq", "gpuq-node"] {
        let m = gpuq_manifest::Manifest::load(
            &root.path(&format!("/usr/share/gpuq/manifests/{pkg}.json")),
        )
        .unwrap();
        let bad: Vec<_> = m
            .check(root.0.path())
            .into_iter()
            .filter(|r| r.finding != gpuq_manifest::Finding::Ok)
            .collect();
        assert!(bad.is_empty(), "{pkg}: {bad:?}");
        assert!(m.files.iter().any(|f| f.config));
    }
    // Nothing was enabled: no unit links anywhere under /etc/systemd.
    assert!(!root.path("/etc/systemd").exists());
    // The shipped configuration has DAOS off.
    let broker = std::fs::read_to_string(root.path("/etc/gpuqueue-daos/broker.toml")).unwrap();
    assert!(broker.contains("\n[daos]\nenabled = false\n"), "{broker}");
    let node = std::fs::read_to_string(root.path("/etc/gpuqueue-daos/node.toml")).unwrap();
    assert!(node.contains("\nenabled = false\n"));

    // The operator changes broker.toml; rpm -V says so (5 = digest, c = config).
    let site = format!("{broker}\n# site change\n");
    std::fs::write(root.path("/etc/gpuqueue-daos/broker.toml"), &site).unwrap();
    let v = stdout(&run(root.rpm().args(["-V", "--nodeps", "gpuq"])));
    assert!(
        v.lines().any(|l| l.contains('5')
            && l.contains(" c ")
            && l.ends_with("/etc/gpuqueue-daos/broker.toml")),
        "{v}"
    );

    // Release 2 (its packaged configuration changed): kept, .rpmnew beside.
    let v2 = [p2.rpm("gpuq", "el9"), p2.rpm("gpuq-node", "el9")];
    let out = run(root.rpm().args(["-U", "--nodeps"]).args(&v2));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "/etc/gpuqueue-daos/broker.toml created as /etc/gpuqueue-daos/broker.toml.rpmnew"
        ),
        "{}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("gpuq: upgraded; the running broker was NOT restarted"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        std::fs::read_to_string(root.path("/etc/gpuqueue-daos/broker.toml")).unwrap(),
        site
    );
    let new = std::fs::read_to_string(root.path("/etc/gpuqueue-daos/broker.toml.rpmnew")).unwrap();
    assert!(new.contains("packaged configuration changed in release 2"));
    // An unchanged configuration is simply replaced by the new default.
    let node = std::fs::read_to_string(root.path("/etc/gpuqueue-daos/node.toml")).unwrap();
    assert!(node.contains("packaged configuration changed in release 2"));
    assert!(!root.path("/etc/gpuqueue-daos/node.toml.rpmnew").exists());
    let q = run_ok(root.rpm().args(["-q", "gpuq", "gpuq-node"]));
    assert!(q.contains("-2.el9") && !q.contains("-1.el9"), "{q}");

    // Erase: the files go, the changed configuration is kept as .rpmsave.
    let out = run_ok(root.rpm().args(["-e", "gpuq", "gpuq-node"]));
    assert!(out.contains("is NOT stopped"), "{out}");
    assert!(!root.path("/usr/bin/gpuq").exists());
    assert!(!root.path("/usr/sbin/gpuq-node").exists());
    assert_eq!(
        std::fs::read_to_string(root.path("/etc/gpuqueue-daos/broker.toml.rpmsave")).unwrap(),
        site
    );
}

/// The shipped completions and man pages come from the CLI's clap
/// definitions: every verb `gpuq help` lists is completed by bash, zsh and
/// fish and has a page, and every page renders without a warning.
#[test]
fn completions_name_every_verb_and_every_man_page_renders_cleanly() {
    let test = "completions_name_every_verb_and_every_man_page_renders_cleanly";
    if !have(test, &["man"]) {
        return;
    }
    let Some(p) = release1(test) else { return };
    let help = run_ok(Command::new(p.staged("gpuq/usr/bin/gpuq")).arg("help"));
    let verbs: Vec<String> = help
        .split("Commands:")
        .nth(1)
        .expect("gpuq help lists its commands")
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .filter(|v| v != "help")
        .collect();
    assert!(
        verbs.len() >= 12 && verbs.contains(&"daos-status".into()),
        "{verbs:?}"
    );
    let bash = std::fs::read_to_string(p.staged("gpuq/usr/share/bash-completion/completions/gpuq"))
        .unwrap();
    let zsh = std::fs::read_to_string(p.staged("gpuq/usr/share/zsh/site-functions/_gpuq")).unwrap();
    let fish =
        std::fs::read_to_string(p.staged("gpuq/usr/share/fish/vendor_completions.d/gpuq.fish"))
            .unwrap();
    let man = p.staged("gpuq/usr/share/man/man1");
    for v in &verbs {
        assert!(bash.contains(v), "bash completion lacks {v}");
        assert!(zsh.contains(&format!("'{v}:")), "zsh completion lacks {v}");
        assert!(
            fish.contains(&format!("-a \"{v}\"")),
            "fish completion lacks {v}"
        );
        assert!(
            man.join(format!("gpuq-{v}.1.gz")).exists(),
            "no man page for {v}"
        );
    }
    let mut pages = 0;
    for e in std::fs::read_dir(&man).unwrap() {
        let page = e.unwrap().path();
        let out = run(Command::new("man")
            .args(["--warnings", "-l"])
            .arg(&page)
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "0"));
        assert!(out.status.success(), "{}: {}", page.display(), stderr(&out));
        assert!(
            stderr(&out).trim().is_empty(),
            "{}: {}",
            page.display(),
            stderr(&out)
        );
        // Bold is overstruck (X BACKSPACE X) when man writes to a pipe.
        let mut text = String::new();
        for c in stdout(&out).chars() {
            if c == '\u{8}' {
                text.pop();
            } else {
                text.push(c);
            }
        }
        assert!(text.contains("SYNOPSIS"), "{}: {text}", page.display());
        pages += 1;
    }
    assert_eq!(pages, verbs.len() + 1, "gpuq.1 and one page per verb");
}

/// The debs on a real Debian 12 with systemd as PID 1: installed, the
/// services present and disabled and not started, `dpkg --verify` clean;
/// once enabled the broker also answers to gpuqueue-daos (systemctl and
/// journalctl) and, with the shipped configuration, refuses a DAOS job in
/// one line; an upgrade keeps a changed conffile (new one as .dpkg-dist)
/// and does not restart the running broker; the node helper refuses to
/// serve with its shipped configuration.
#[test]
fn debs_install_and_upgrade_in_the_systemd_box() {
    let test = "debs_install_and_upgrade_in_the_systemd_box";
    require_systemd_box!();
    if !have(test, &["rpmbuild", "dpkg-deb"]) {
        return;
    }
    let Some(p1) = release1(test) else { return };
    let p2 = release2();
    let b = SystemdBox::boot_bare();
    let files = b.host_files();
    for (name, src) in [
        ("v1-gpuq.deb", p1.deb("gpuq")),
        ("v1-gpuq-node.deb", p1.deb("gpuq-node")),
        ("v2-gpuq.deb", p2.deb("gpuq")),
        ("v2-gpuq-node.deb", p2.deb("gpuq-node")),
    ] {
        std::fs::copy(&src, files.join(name)).unwrap();
    }
    let out = b.sh_ok("dpkg -i /host/v1-gpuq.deb /host/v1-gpuq-node.deb 2>&1");
    assert!(out.contains("gpuq: installed, not enabled"), "{out}");
    assert!(out.contains("gpuq-node: installed, not enabled"), "{out}");
    // Present, disabled, not running.
    for unit in ["gpuq-broker", "gpuq-node"] {
        let state = stdout(&b.sh(&format!(
            "systemctl is-enabled {unit}; systemctl is-active {unit}"
        )));
        assert_eq!(
            state.split_whitespace().collect::<Vec<_>>(),
            ["disabled", "inactive"],
            "{unit}"
        );
    }
    assert_eq!(b.sh_ok("dpkg --verify gpuq gpuq-node"), "");
    assert_eq!(
        b.sh_ok("systemctl show -P ExecStart gpuq-broker | grep -o 'path=[^ ;]*'")
            .trim(),
        "path=/usr/sbin/gpuq-broker"
    );
    // The node helper with its shipped configuration: one line, exit 3.
    let out = b.sh("gpuq-node --config /etc/gpuqueue-daos/node.toml serve");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("DAOS is disabled on this node (enabled = false in [node] of /etc/gpuqueue-daos/node.toml)")
            && stderr(&out).trim_end().lines().count() == 1,
        "{}",
        stderr(&out)
    );
    // The operator turns the broker on with the shipped configuration
    // (this box has no GPU: gpu = "none").
    b.sh_ok("sed -i 's/^#\\?gpu = .*/gpu = \"none\"/' /etc/gpuqueue-daos/broker.toml && grep -q '^gpu = \"none\"' /etc/gpuqueue-daos/broker.toml");
    b.sh_ok("systemctl enable --now gpuq-broker 2>&1");
    let ready = gpuq_system_tests::eventually(30, || {
        stdout(&b.sh("journalctl --no-pager -u gpuqueue-daos")).contains("gpuq-broker ready")
    });
    assert!(
        ready,
        "journalctl -u gpuqueue-daos:\n{}\njournalctl -u gpuq-broker:\n{}",
        stdout(&b.sh("journalctl --no-pager -u gpuqueue-daos")),
        stdout(&b.sh("journalctl --no-pager -u gpuq-broker"))
    );
    assert_eq!(
        b.sh_ok("systemctl is-active gpuqueue-daos").trim(),
        "active"
    );
    let out = b.sh("gpuq submit --inst inst1 -- true");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("DAOS is disabled on this host (enabled = false in [daos] of /etc/gpuqueue-daos/broker.toml); ask the operator")
            && stderr(&out).trim_end().lines().count() == 1,
        "{}",
        stderr(&out)
    );
    let pid = b.sh_ok("systemctl show -P MainPID gpuq-broker");
    // A site change, then release 2 over it (dpkg keeps the admin's file
    // with --force-confold, as unattended upgrades do).
    b.sh_ok("echo '# site change' >> /etc/gpuqueue-daos/broker.toml");
    let site = b.read("/etc/gpuqueue-daos/broker.toml");
    let out = b.sh_ok("dpkg -i --force-confold /host/v2-gpuq.deb /host/v2-gpuq-node.deb 2>&1");
    assert!(
        out.contains("gpuq: upgraded; the running gpuq-broker was NOT restarted"),
        "{out}"
    );
    assert_eq!(b.read("/etc/gpuqueue-daos/broker.toml"), site);
    assert!(b
        .read("/etc/gpuqueue-daos/broker.toml.dpkg-dist")
        .contains("packaged configuration changed in release 2"));
    assert!(b
        .read("/etc/gpuqueue-daos/node.toml")
        .contains("packaged configuration changed in release 2"));
    assert_eq!(
        b.sh_ok("dpkg-query -W -f '${Version} ' gpuq gpuq-node"),
        format!("{v}-2 {v}-2 ", v = env!("CARGO_PKG_VERSION"))
    );
    // The running broker was not restarted; gpuq-node is still not enabled.
    assert_eq!(b.sh_ok("systemctl show -P MainPID gpuq-broker"), pid);
    assert_eq!(
        stdout(&b.sh("systemctl is-enabled gpuq-node")).trim(),
        "disabled"
    );
}
