//! DAOS server and engine processes in this node's network namespace.
//!
//! A process counts when its command name (`/proc/PID/comm`) is
//! `daos_server` or `daos_engine` (or the simulator's multi-call binary
//! invoked under those names) and its network namespace
//! (`/proc/PID/ns/net`) is ours. Which container it belongs to is read from
//! `/proc/PID/cgroup` (Podman's cgroup paths carry `libpod-<id>`), so the
//! caller can tell its own containers' processes from foreign ones.

use std::path::Path;

pub const DAOS_NAMES: [&str; 2] = ["daos_server", "daos_engine"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaosProcess {
    pub pid: i32,
    pub name: String,
    /// The 64-hex Podman container ID from its cgroup path, if any.
    pub container: Option<String>,
}

fn ns_of(pid: &str) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
}

/// The command name as the process was started (argv[0]'s base name), which
/// for a multi-call binary is the applet name; falls back to `comm`.
fn name_of(dir: &Path) -> Option<String> {
    let cmdline = std::fs::read(dir.join("cmdline")).ok()?;
    let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let base = String::from_utf8_lossy(argv0)
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    if !base.is_empty() {
        return Some(base);
    }
    std::fs::read_to_string(dir.join("comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The container ID in a `/proc/PID/cgroup` text, if any.
pub fn container_of(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|l| {
        let i = l.find("libpod-")?;
        let id: String = l[i + 7..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit())
            .collect();
        (id.len() == 64).then_some(id)
    })
}

/// Every DAOS server/engine process in our network namespace.
pub fn scan() -> std::io::Result<Vec<DaosProcess>> {
    let me = ns_of("self").ok_or_else(|| std::io::Error::other("cannot read /proc/self/ns/net"))?;
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let dir = entry.path();
        let Some(name) = name_of(&dir) else { continue };
        if !DAOS_NAMES.contains(&name.as_str()) {
            continue;
        }
        // A process that vanished between the reads is simply gone.
        if ns_of(pid).as_ref() != Some(&me) {
            continue;
        }
        let container = std::fs::read_to_string(dir.join("cgroup"))
            .ok()
            .and_then(|c| container_of(&c));
        out.push(DaosProcess {
            pid: pid.parse().unwrap_or(0),
            name,
            container,
        });
    }
    out.sort_by_key(|p| p.pid);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_id_from_cgroup_paths() {
        let id = "a".repeat(64);
        let v1 = format!("4:memory:/machine.slice/libpod-{id}.scope\n0::/\n");
        assert_eq!(container_of(&v1), Some(id.clone()));
        let cgfs = format!("0::/libpod_parent/libpod-{id}\n");
        assert_eq!(container_of(&cgfs), Some(id));
        assert_eq!(container_of("0::/user.slice\n"), None);
    }

    #[test]
    fn finds_a_process_named_daos_server_in_our_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("daos_server");
        std::fs::copy("/bin/sleep", &fake).unwrap();
        // Retry ETXTBSY: a child forked by another test thread may briefly
        // hold the copy open for writing.
        let mut tries = 0;
        let mut child = loop {
            match std::process::Command::new(&fake).arg("30").spawn() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => break other.unwrap(),
            }
        };
        let found = (0..50).find_map(|_| {
            let s = scan().unwrap();
            let hit = s.into_iter().find(|p| p.pid == child.id() as i32);
            if hit.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            hit
        });
        child.kill().unwrap();
        child.wait().unwrap();
        let found = found.expect("the fake daos_server was not found");
        assert_eq!(found.name, "daos_server");
    }
}
