//! One node's link: an SSH master and two unix-socket forwards, supervised.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use gpuq_sys::proc::ProcessExit;
use openssh::{ForwardType, KnownHosts, Session, SessionBuilder};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::error::{one_line, Error, Result};
use crate::http;

/// How to reach one node. Everything is explicit: nothing is read from the
/// broker's environment except what `ssh` itself reads (`ssh_config_file`,
/// else the system's and root's ssh config).
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// The node's name in gpuq (`da1`); its gpuq-node must report this name.
    pub name: String,
    /// ssh destination: an address or a name `ssh_config_file` resolves.
    pub host: String,
    /// Remote user (root: the node socket is root-only).
    pub user: String,
    pub port: Option<u16>,
    /// The only key offered (`IdentitiesOnly=yes`).
    pub identity_file: PathBuf,
    /// Host keys are checked strictly against this file only.
    pub known_hosts_file: PathBuf,
    pub ssh_config_file: Option<PathBuf>,
    /// The node's gpuq-node socket (remote path).
    pub node_socket: PathBuf,
    /// The node's Podman API socket (remote path).
    pub podman_socket: PathBuf,
    /// Local directory for the forwarded sockets and the master's control
    /// socket; created 0700, refused if group/world accessible.
    pub forward_dir: PathBuf,
}

/// Timeouts and backoff; the defaults suit production, tests shorten them.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// `ConnectTimeout` for the master, and (+2 s) the limit on the whole
    /// master start.
    pub connect_timeout: Duration,
    /// Each verification or health request.
    pub request_timeout: Duration,
    /// How often the supervisor checks an up link.
    pub health_interval: Duration,
    /// `ServerAliveInterval` of the master (ssh notices a dead peer after
    /// three unanswered keepalives).
    pub server_alive_interval: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            health_interval: Duration::from_secs(2),
            server_alive_interval: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(250),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// What a link is doing now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    Down {
        since: SystemTime,
        last_error: String,
    },
    Connecting {
        since: SystemTime,
    },
    Up {
        since: SystemTime,
        node_sock: PathBuf,
        podman_sock: PathBuf,
    },
}

impl LinkState {
    pub fn is_up(&self) -> bool {
        matches!(self, LinkState::Up { .. })
    }

    /// `up`, `connecting` or `down`.
    pub fn label(&self) -> &'static str {
        match self {
            LinkState::Down { .. } => "down",
            LinkState::Connecting { .. } => "connecting",
            LinkState::Up { .. } => "up",
        }
    }
}

impl std::fmt::Display for LinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ago = |t: &SystemTime| t.elapsed().unwrap_or_default().as_secs();
        match self {
            LinkState::Down { since, last_error } => {
                write!(f, "down for {}s: {last_error}", ago(since))
            }
            LinkState::Connecting { since } => write!(f, "connecting for {}s", ago(since)),
            LinkState::Up { since, .. } => write!(f, "up for {}s", ago(since)),
        }
    }
}

/// The two local sockets of an up link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSockets {
    pub node: String,
    /// Forwarded to the node's gpuq-node socket.
    pub node_sock: PathBuf,
    /// Forwarded to the node's Podman API socket.
    pub podman_sock: PathBuf,
}

/// Counters over the link's life: the state is a snapshot, a failure and
/// its recovery can both happen between two looks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Times the link came up.
    pub ups: u64,
    /// Times an up link was lost or a connect attempt failed.
    pub failures: u64,
    /// The last failure, and when.
    pub last_error: Option<(SystemTime, String)>,
}

/// How long the last successful establishment took, by phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectTimings {
    /// ssh master started and authenticated.
    pub master: Duration,
    /// Both forwards requested through the mux socket.
    pub forward: Duration,
    /// Both HTTP verifications.
    pub verify: Duration,
}

/// One node's link. [`NodeLink::start`] spawns its supervisor; dropping the
/// link (or [`NodeLink::close`]) stops the master and unlinks the sockets.
#[derive(Debug)]
pub struct NodeLink {
    inner: Arc<Inner>,
    task: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Inner {
    cfg: LinkConfig,
    timings: Timings,
    state: watch::Sender<LinkState>,
    /// Skip the rest of the backoff and try now (ensure_up does this).
    kick: Notify,
    /// Look at an up link now instead of at the next health interval
    /// (ensure_up does this: "up" may be an interval old).
    check_now: Notify,
    /// How many health checks of up links have passed.
    checked: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
    master_pid: Mutex<Option<u32>>,
    last_connect: Mutex<Option<ConnectTimings>>,
    stats: Mutex<LinkStats>,
}

impl NodeLink {
    /// Validate the config; connects nothing.
    pub fn new(cfg: LinkConfig, timings: Timings) -> Result<Self> {
        let bad = |what: &str| Error::Config {
            node: cfg.name.clone(),
            what: what.to_string(),
        };
        if cfg.name.is_empty()
            || !cfg
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(bad("name must be non-empty [A-Za-z0-9_-]"));
        }
        if cfg.host.is_empty() || cfg.host.starts_with('-') {
            return Err(bad("host must be an address or ssh_config name"));
        }
        if cfg.user.is_empty() || cfg.user.starts_with('-') {
            return Err(bad("user must be set"));
        }
        for (what, p) in [
            ("identity_file", &cfg.identity_file),
            ("known_hosts_file", &cfg.known_hosts_file),
            ("node_socket", &cfg.node_socket),
            ("podman_socket", &cfg.podman_socket),
            ("forward_dir", &cfg.forward_dir),
        ] {
            if !p.is_absolute() {
                return Err(bad(&format!("{what} must be an absolute path")));
            }
        }
        if let Some(p) = &cfg.ssh_config_file {
            if !p.is_absolute() || p.to_string_lossy().contains(['"', '\n']) {
                return Err(bad(
                    "ssh_config_file must be an absolute path without quotes",
                ));
            }
        }
        // Unix socket paths are limited to 107 bytes; the master's control
        // socket is the longest: <dir>/<name>.ctl/.ssh-connectionXXXXXX/master.<16>.
        let longest = cfg.forward_dir.as_os_str().len() + cfg.name.len() + 48;
        if longest > 107 {
            return Err(bad(
                "forward_dir is too long for unix socket paths (keep it under ~55 bytes)",
            ));
        }
        let (state, _) = watch::channel(LinkState::Down {
            since: SystemTime::now(),
            last_error: "not started".into(),
        });
        let (shutdown, _) = watch::channel(false);
        Ok(NodeLink {
            inner: Arc::new(Inner {
                cfg,
                timings,
                state,
                kick: Notify::new(),
                check_now: Notify::new(),
                checked: watch::channel(0).0,
                shutdown,
                master_pid: Mutex::new(None),
                last_connect: Mutex::new(None),
                stats: Mutex::new(LinkStats::default()),
            }),
            task: Mutex::new(None),
        })
    }

    pub fn name(&self) -> &str {
        &self.inner.cfg.name
    }

    pub fn config(&self) -> &LinkConfig {
        &self.inner.cfg
    }

    /// The local socket paths this link forwards (whether up or not).
    pub fn sockets(&self) -> NodeSockets {
        self.inner.sockets()
    }

    pub fn state(&self) -> LinkState {
        self.inner.state.borrow().clone()
    }

    /// Watch state changes.
    pub fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.inner.state.subscribe()
    }

    /// The PID of the ssh master while the link is up (it runs detached:
    /// `ssh -f`).
    pub fn master_pid(&self) -> Option<u32> {
        *self.inner.master_pid.lock().expect("lock")
    }

    /// Phase timings of the last successful connect.
    pub fn last_connect(&self) -> Option<ConnectTimings> {
        *self.inner.last_connect.lock().expect("lock")
    }

    /// Ups, failures and the last error so far.
    pub fn stats(&self) -> LinkStats {
        self.inner.stats.lock().expect("lock").clone()
    }

    /// Start the supervisor (idempotent): connect, watch, reconnect with
    /// capped exponential backoff until closed.
    pub fn start(&self) {
        let mut task = self.task.lock().expect("lock");
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.inner.shutdown.send_replace(false);
        let inner = self.inner.clone();
        *task = Some(tokio::spawn(async move { inner.supervise().await }));
    }

    /// Wait until the link is up (starting the supervisor if needed and
    /// cutting a running backoff short), at most `timeout`.
    pub async fn ensure_up(&self, timeout: Duration) -> Result<NodeSockets> {
        self.start();
        let mut rx = self.inner.state.subscribe();
        if rx.borrow().is_up() {
            // Up when last looked at, up to a health interval ago: look now
            // (the ssh master and Podman through the forward, a few ms), so
            // a master that died since is found before anyone uses it.
            let mut checked = self.inner.checked.subscribe();
            let seen = *checked.borrow();
            let mut state = self.inner.state.subscribe();
            self.inner.check_now.notify_one();
            let _ = tokio::time::timeout(timeout, async {
                tokio::select! {
                    _ = checked.wait_for(|n| *n > seen) => {}
                    _ = state.wait_for(|s| !s.is_up()) => {}
                }
            })
            .await;
        }
        if !rx.borrow().is_up() {
            self.inner.kick.notify_one();
        }
        let wait = async { rx.wait_for(|s| s.is_up()).await.map(|_| ()) };
        let r = tokio::time::timeout(timeout, wait).await;
        match r {
            Ok(Ok(_)) => Ok(self.sockets()),
            Ok(Err(_)) => Err(Error::Closed {
                node: self.name().to_string(),
            }),
            Err(_) => {
                let state = self.state();
                let state = match (&state, self.stats().last_error) {
                    // Down already carries its error.
                    (LinkState::Down { .. }, _) | (_, None) => state.to_string(),
                    (_, Some((_, e))) => format!("{state}; last error: {e}"),
                };
                Err(Error::NotUp {
                    node: self.name().to_string(),
                    after: timeout,
                    state,
                })
            }
        }
    }

    /// Stop the supervisor, close the master, unlink the local sockets.
    pub async fn close(&self) {
        self.inner.shutdown.send_replace(true);
        let task = self.task.lock().expect("lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
        // A connect dropped by the shutdown may have left its ssh going on
        // (authenticating, or with its master bound in openssh's temporary
        // directory): nothing else would end it.
        end_link_processes(&self.inner.ctl_dir()).await;
        // Also when never started: leave no stale socket behind.
        let s = self.sockets();
        unlink_socket(&s.node_sock);
        unlink_socket(&s.podman_sock);
    }
}

/// End every process of this link that still runs once its supervisor has
/// stopped: root's processes whose command line names this link's control
/// directory (every ssh of the link gets `-S <ctl_dir>/...`; a user cannot
/// make a root process say that). Each is SIGKILLed through a pidfd
/// opened before its command line is read again, so a reused PID is never
/// hit; then waited for, 2 s at most.
async fn end_link_processes(ctl_dir: &Path) {
    let needle = format!("{}/", ctl_dir.display());
    let names_us = |pid: u32| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == 0)
            && std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
    };
    let own = std::process::id();
    let find = || -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| *p != own && names_us(*p))
            .collect()
    };
    let t = Instant::now();
    loop {
        let left = find();
        if left.is_empty() {
            return;
        }
        if t.elapsed() > Duration::from_secs(2) {
            tracing::warn!(ctl = %ctl_dir.display(), ?left, "ssh processes of a closed link did not exit");
            return;
        }
        for pid in left {
            let fd = match gpuq_sys::proc::pidfd_of_listed(pid) {
                Ok(gpuq_sys::proc::Listed::Open(fd)) => fd,
                Ok(gpuq_sys::proc::Listed::Gone) => continue,
                Err(e) => {
                    // Never a kill by PID: the closed link's ssh stays,
                    // said loudly (the next link start tries again).
                    tracing::error!(ctl = %ctl_dir.display(), "ssh processes of a closed link not ended: {e}");
                    return;
                }
            };
            if names_us(pid) {
                use std::os::fd::AsFd;
                tracing::info!(pid, ctl = %ctl_dir.display(), "ending an ssh process of a closed link");
                let _ = gpuq_sys::proc::pidfd_kill(fd.as_fd());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for NodeLink {
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
        if let Some(task) = self.task.lock().expect("lock").take() {
            // Dropping the task's future drops the `Established`, whose Drop
            // tells the master to exit (openssh's Session::drop) and unlinks.
            task.abort();
        }
    }
}

/// An up link: the master session and the two forwarded sockets. Dropping it
/// ends the master and unlinks the sockets.
struct Established {
    session: Option<Session>,
    master_pid: Option<u32>,
    /// Readable once the master has exited (a pidfd): its death is seen at
    /// once, not at the next health look. `None` if its PID was not known.
    master_exit: Option<ProcessExit>,
    node_sock: PathBuf,
    podman_sock: PathBuf,
}

impl Established {
    async fn close(mut self) {
        if let Some(s) = self.session.take() {
            let ctl = s.control_socket().to_path_buf();
            // Asks the master to exit over the control socket; works also
            // when the TCP connection is dead. An already dead master is fine.
            let _ = tokio::time::timeout(Duration::from_secs(5), s.close()).await;
            reap_master(&ctl, self.master_pid).await;
        }
        // Drop unlinks.
    }
}

/// Make sure the master behind control socket `ctl` is gone: ask it to stop
/// (if not done yet), wait up to 2 s, then SIGKILL it by PID — only if that
/// PID's command line still names `ctl`'s directory (PIDs are reused).
async fn reap_master(ctl: &Path, pid: Option<u32>) {
    let pid = match pid {
        Some(p) => Some(p),
        None => match openssh_mux_client::Connection::connect(ctl).await {
            Ok(mut c) => c.send_alive_check().await.ok().map(|p| p.get()),
            Err(_) => None,
        },
    };
    if let Ok(mut c) = openssh_mux_client::Connection::connect(ctl).await {
        let _ = c.request_stop_listening().await;
    }
    let Some(pid) = pid else { return };
    let dir = ctl.parent().unwrap_or(ctl).to_string_lossy().into_owned();
    let ours = || {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains(&dir))
            .unwrap_or(false)
    };
    let t = Instant::now();
    while ours() && t.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if ours() {
        tracing::warn!(pid, ctl = %ctl.display(), "ssh master ignored the exit request; killing it");
        if let Ok(p) = i32::try_from(pid) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::SIGKILL);
        }
    }
}

/// Masters left in this link's control dir by a broker that died (the master
/// runs detached, `ControlPersist=yes`): end them before starting a new one,
/// so there is one master per node.
async fn end_stale_masters(ctl_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(ctl_dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .starts_with(".ssh-connection")
        {
            continue;
        }
        let master = e.path().join("master");
        if std::fs::symlink_metadata(&master).is_ok_and(|m| m.file_type().is_socket()) {
            tracing::info!(ctl = %master.display(), "ending a stale ssh master");
            reap_master(&master, None).await;
        }
    }
}

impl Drop for Established {
    fn drop(&mut self) {
        drop(self.session.take());
        // ssh leaves the listening socket files behind when the master exits.
        unlink_socket(&self.node_sock);
        unlink_socket(&self.podman_sock);
    }
}

fn unlink_socket(p: &Path) {
    if let Ok(m) = std::fs::symlink_metadata(p) {
        if m.file_type().is_socket() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Inner {
    fn node(&self) -> String {
        self.cfg.name.clone()
    }

    /// This link's own directory for its ssh control sockets.
    fn ctl_dir(&self) -> PathBuf {
        self.cfg.forward_dir.join(format!("{}.ctl", self.cfg.name))
    }

    fn sockets(&self) -> NodeSockets {
        NodeSockets {
            node: self.cfg.name.clone(),
            node_sock: self
                .cfg
                .forward_dir
                .join(format!("{}.node.sock", self.cfg.name)),
            podman_sock: self
                .cfg
                .forward_dir
                .join(format!("{}.podman.sock", self.cfg.name)),
        }
    }

    fn dest(&self) -> String {
        match self.cfg.port {
            Some(p) => format!("{}@{}:{p}", self.cfg.user, self.cfg.host),
            None => format!("{}@{}", self.cfg.user, self.cfg.host),
        }
    }

    fn set(&self, s: LinkState) {
        match &s {
            LinkState::Down { last_error, .. } => {
                tracing::warn!(node = %self.cfg.name, error = %last_error, "node link down")
            }
            LinkState::Up { .. } => tracing::info!(node = %self.cfg.name, "node link up"),
            LinkState::Connecting { .. } => {
                tracing::debug!(node = %self.cfg.name, "node link connecting")
            }
        }
        if !s.is_up() {
            *self.master_pid.lock().expect("lock") = None;
        }
        {
            let mut st = self.stats.lock().expect("lock");
            match &s {
                LinkState::Up { .. } => st.ups += 1,
                LinkState::Down { since, last_error } if last_error != "closed" => {
                    st.failures += 1;
                    st.last_error = Some((*since, last_error.clone()));
                }
                _ => {}
            }
        }
        self.state.send_replace(s);
    }

    async fn supervise(self: Arc<Self>) {
        let mut shutdown = self.shutdown.subscribe();
        let mut backoff = self.timings.backoff_initial;
        loop {
            if *shutdown.borrow() {
                break;
            }
            self.set(LinkState::Connecting {
                since: SystemTime::now(),
            });
            let attempt = tokio::select! {
                r = self.establish() => Some(r),
                _ = shutdown.wait_for(|s| *s) => None,
            };
            match attempt {
                None => break,
                Some(Ok(est)) => {
                    let up_at = Instant::now();
                    let s = self.sockets();
                    self.set(LinkState::Up {
                        since: SystemTime::now(),
                        node_sock: s.node_sock,
                        podman_sock: s.podman_sock,
                    });
                    let lost = tokio::select! {
                        e = self.watch(&est) => Some(e),
                        _ = shutdown.wait_for(|s| *s) => None,
                    };
                    est.close().await;
                    // A link that stayed up a while starts its backoff over;
                    // one that flaps (up, lost at once) keeps backing off.
                    if up_at.elapsed() >= self.timings.backoff_max {
                        backoff = self.timings.backoff_initial;
                    }
                    match lost {
                        None => break,
                        Some(e) => self.set(LinkState::Down {
                            since: SystemTime::now(),
                            last_error: e.to_string(),
                        }),
                    }
                }
                Some(Err(e)) => self.set(LinkState::Down {
                    since: SystemTime::now(),
                    last_error: e.to_string(),
                }),
            }
            // Retry after the backoff, or at once when someone calls ensure_up.
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.kick.notified() => {}
                _ = shutdown.wait_for(|s| *s) => break,
            }
            backoff = (backoff * 2).min(self.timings.backoff_max);
        }
        self.set(LinkState::Down {
            since: SystemTime::now(),
            last_error: "closed".into(),
        });
    }

    /// Until the link fails: the master answers on its control socket and
    /// Podman answers `_ping` through the forward (looked at every health
    /// interval, or when asked); the master's exit ends it at once.
    async fn watch(&self, est: &Established) -> Error {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.timings.health_interval) => {}
                _ = self.check_now.notified() => {}
                _ = exited(est.master_exit.as_ref()) => {
                    return Error::Lost {
                        node: self.node(),
                        detail: "ssh master exited".into(),
                    };
                }
            }
            let Some(session) = est.session.as_ref() else {
                return Error::Closed { node: self.node() };
            };
            if let Err(e) = session.check().await {
                return Error::Lost {
                    node: self.node(),
                    detail: format!("ssh master gone ({e})"),
                };
            }
            match http::get(&est.podman_sock, "/_ping", self.timings.request_timeout).await {
                Ok((st, body)) if st.is_success() && body.as_ref() == b"OK" => {}
                Ok((st, _)) => {
                    return Error::Lost {
                        node: self.node(),
                        detail: format!("Podman _ping through the forward answered {st}"),
                    }
                }
                Err(e) => {
                    return Error::Lost {
                        node: self.node(),
                        detail: format!("Podman _ping through the forward: {e}"),
                    }
                }
            }
            self.checked.send_modify(|n| *n += 1);
        }
    }

    fn prepare_dirs(&self) -> Result<PathBuf> {
        let dir = &self.cfg.forward_dir;
        let io = |source| Error::ForwardDir {
            node: self.node(),
            dir: dir.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
        let mode = std::fs::metadata(dir).map_err(io)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Error::ForwardDirUnsafe {
                node: self.node(),
                dir: dir.clone(),
                mode,
            });
        }
        let ctl = self.ctl_dir();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&ctl)
            .or_else(|e| if ctl.is_dir() { Ok(()) } else { Err(e) })
            .map_err(io)?;
        let s = self.sockets();
        for p in [&s.node_sock, &s.podman_sock] {
            match std::fs::symlink_metadata(p) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::StaleSocket {
                        node: self.node(),
                        path: p.clone(),
                        detail: e.to_string(),
                    })
                }
                Ok(m) if m.file_type().is_socket() => {
                    std::fs::remove_file(p).map_err(|e| Error::StaleSocket {
                        node: self.node(),
                        path: p.clone(),
                        detail: e.to_string(),
                    })?
                }
                Ok(_) => {
                    return Err(Error::StaleSocket {
                        node: self.node(),
                        path: p.clone(),
                        detail: "exists and is not a socket".into(),
                    })
                }
            }
        }
        Ok(ctl)
    }

    /// The `-F` file for the master: our options first (ssh takes the
    /// first value it reads for each), then the operator's config, if any,
    /// through `Include`. Without one, neither `/etc/ssh/ssh_config` nor
    /// root's `~/.ssh/config` is read: the link does not depend on them.
    fn write_ssh_config(&self, ctl: &Path) -> Result<PathBuf> {
        let path = ctl.join("ssh_config");
        let mut text = ssh_config_text(&self.cfg);
        if let Some(user) = &self.cfg.ssh_config_file {
            text.push_str(&format!("Include \"{}\"\n", user.display()));
        }
        std::fs::write(&path, text).map_err(|source| Error::ForwardDir {
            node: self.node(),
            dir: ctl.to_path_buf(),
            source,
        })?;
        Ok(path)
    }

    fn connect_error(&self, e: openssh::Error) -> Error {
        let detail = match &e {
            openssh::Error::Connect(io) => one_line(&io.to_string()),
            other => one_line(&format!(
                "{other}: {}",
                std::error::Error::source(other)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            )),
        };
        if detail.contains("Host key verification failed")
            || detail.contains("IDENTIFICATION HAS CHANGED")
            || detail.contains("No ED25519 host key is known")
            || detail.contains("host key is known")
        {
            Error::HostKey {
                node: self.node(),
                dest: self.dest(),
                known_hosts: self.cfg.known_hosts_file.clone(),
                detail,
            }
        } else if detail.contains("Permission denied") {
            Error::Auth {
                node: self.node(),
                dest: self.dest(),
                identity: self.cfg.identity_file.clone(),
                detail,
            }
        } else {
            Error::Connect {
                node: self.node(),
                dest: self.dest(),
                detail,
            }
        }
    }

    /// One attempt: master, forwards, verification. On any failure what was
    /// set up is torn down again (the `Established` drop).
    /// A master, its forwards, verified; on any failure after the master
    /// started, the master is ended and reaped (`Established::close`)
    /// before the error returns — never left to a best-effort drop, which
    /// once let a refused master outlive its link by seconds in CI.
    async fn establish(&self) -> Result<Established> {
        let mut made = None;
        match self.try_establish(&mut made).await {
            Ok(()) => made.ok_or_else(|| Error::Closed { node: self.node() }),
            Err(e) => {
                if let Some(est) = made.take() {
                    est.close().await;
                }
                Err(e)
            }
        }
    }

    async fn try_establish(&self, made: &mut Option<Established>) -> Result<()> {
        let ctl = self.prepare_dirs()?;
        end_stale_masters(&ctl).await;
        let t0 = Instant::now();
        let mut b = SessionBuilder::default();
        b.user(self.cfg.user.clone())
            .keyfile(&self.cfg.identity_file)
            .known_hosts_check(KnownHosts::Strict)
            .user_known_hosts_file(&self.cfg.known_hosts_file)
            .connect_timeout(self.timings.connect_timeout)
            .server_alive_interval(self.timings.server_alive_interval)
            .control_directory(&ctl)
            // Only this link uses `ctl`: a control dir left by a crashed
            // broker is removed before the new master starts.
            .clean_history_control_directory(true);
        if let Some(p) = self.cfg.port {
            b.port(p);
        }
        b.config_file(self.write_ssh_config(&ctl)?);
        // BatchMode=yes is always passed by openssh: no password or
        // passphrase prompt, key auth only.
        let limit = self.timings.connect_timeout + Duration::from_secs(2);
        let session = match tokio::time::timeout(limit, b.connect_mux(&self.cfg.host)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(self.connect_error(e)),
            Err(_) => {
                return Err(Error::ConnectTimeout {
                    node: self.node(),
                    dest: self.dest(),
                    after: limit,
                })
            }
        };
        let s = self.sockets();
        let pid = master_pid(session.control_socket()).await;
        let master_exit = match pid {
            Some(p) => watch_exit(session.control_socket(), p).await,
            None => None,
        };
        let est = made.insert(Established {
            session: Some(session),
            master_pid: pid,
            master_exit,
            node_sock: s.node_sock.clone(),
            podman_sock: s.podman_sock.clone(),
        });
        let Some(session) = est.session.as_ref() else {
            return Err(Error::Closed { node: self.node() });
        };
        let master = t0.elapsed();

        let t1 = Instant::now();
        for (local, remote) in [
            (&s.node_sock, &self.cfg.node_socket),
            (&s.podman_sock, &self.cfg.podman_socket),
        ] {
            session
                .request_port_forward(ForwardType::Local, local.as_path(), remote.as_path())
                .await
                .map_err(|e| Error::Forward {
                    node: self.node(),
                    local: local.clone(),
                    remote: remote.display().to_string(),
                    detail: one_line(&format!(
                        "{e}: {}",
                        std::error::Error::source(&e)
                            .map(|s| s.to_string())
                            .unwrap_or_default()
                    )),
                })?;
        }
        let forward = t1.elapsed();

        let t2 = Instant::now();
        let rt = self.timings.request_timeout;
        let (node_r, podman_r) = tokio::join!(
            http::get(&s.node_sock, gpuq_status_path(), rt),
            http::get(&s.podman_sock, "/_ping", rt)
        );
        let verify_err =
            |what: &'static str, local: &PathBuf, remote: &PathBuf, detail: String| Error::Verify {
                node: self.node(),
                what,
                local: local.clone(),
                remote: remote.display().to_string(),
                detail,
            };
        let (st, body) = node_r.map_err(|d| {
            verify_err(
                "gpuq-node did not answer GET /v1/status",
                &s.node_sock,
                &self.cfg.node_socket,
                d,
            )
        })?;
        if !st.is_success() {
            return Err(verify_err(
                "gpuq-node did not answer GET /v1/status",
                &s.node_sock,
                &self.cfg.node_socket,
                format!("HTTP {st}"),
            ));
        }
        let answered = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("node").and_then(|n| n.as_str()).map(str::to_owned))
            .ok_or_else(|| {
                verify_err(
                    "gpuq-node did not answer GET /v1/status",
                    &s.node_sock,
                    &self.cfg.node_socket,
                    "answer has no \"node\" field".into(),
                )
            })?;
        if answered != self.cfg.name {
            return Err(Error::WrongNode {
                node: self.node(),
                remote: self.cfg.node_socket.display().to_string(),
                answered,
            });
        }
        let (st, body) = podman_r.map_err(|d| {
            verify_err(
                "Podman did not answer GET /_ping",
                &s.podman_sock,
                &self.cfg.podman_socket,
                d,
            )
        })?;
        if !st.is_success() || body.as_ref() != b"OK" {
            return Err(verify_err(
                "Podman did not answer GET /_ping",
                &s.podman_sock,
                &self.cfg.podman_socket,
                format!(
                    "HTTP {st}: {}",
                    String::from_utf8_lossy(&body)
                        .chars()
                        .take(80)
                        .collect::<String>()
                ),
            ));
        }
        let verify = t2.elapsed();
        *self.master_pid.lock().expect("lock") = pid;
        *self.last_connect.lock().expect("lock") = Some(ConnectTimings {
            master,
            forward,
            verify,
        });
        tracing::info!(node = %self.cfg.name, ?master, ?forward, ?verify, "node link established");
        Ok(())
    }
}

/// The master's PID, as it reports it on its control socket.
async fn master_pid(ctl: &Path) -> Option<u32> {
    match openssh_mux_client::Connection::connect(ctl).await {
        Ok(mut c) => c.send_alive_check().await.ok().map(|p| p.get()),
        Err(_) => None,
    }
}

/// A watch on the master `pid`'s exit, kept only if the master still
/// answers with that PID after the watch was opened (so it cannot name a
/// process that reused the PID in between).
async fn watch_exit(ctl: &Path, pid: u32) -> Option<ProcessExit> {
    let exit = ProcessExit::watch(pid).ok()?;
    (master_pid(ctl).await == Some(pid)).then_some(exit)
}

/// Resolves when the watched process has exited; never without a watch
/// (or if the reactor fails: the health looks remain).
async fn exited(watch: Option<&ProcessExit>) {
    match watch {
        Some(w) if w.exited().await.is_ok() => {}
        _ => std::future::pending().await,
    }
}

/// Options every master gets on top of what openssh passes (BatchMode,
/// StrictHostKeyChecking, UserKnownHostsFile, the key, ConnectTimeout,
/// ServerAliveInterval).
fn ssh_config_text(_cfg: &LinkConfig) -> String {
    [
        "# written by gpuq-nodelink for this link's ssh master; rewritten on every connect",
        // Host keys from the configured known_hosts file only.
        "GlobalKnownHostsFile /dev/null",
        "UpdateHostKeys no",
        "CheckHostIP no",
        // Key auth only.
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "GSSAPIAuthentication no",
        "ForwardAgent no",
        "ForwardX11 no",
        "ServerAliveCountMax 3",
        "",
    ]
    .join("\n")
}

/// gpuq-node's status route (gpuq-protocol's `routes::STATUS`; not linked
/// here to keep this crate's dependencies to the transport).
fn gpuq_status_path() -> &'static str {
    "/v1/status"
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn cfg(dir: &Path) -> LinkConfig {
        LinkConfig {
            name: "da1".into(),
            host: "da1".into(),
            user: "root".into(),
            port: None,
            identity_file: dir.join("id"),
            known_hosts_file: dir.join("known_hosts"),
            ssh_config_file: None,
            node_socket: "/run/gpuqueue-daos/node.sock".into(),
            podman_socket: "/run/podman/podman.sock".into(),
            forward_dir: dir.join("fwd"),
        }
    }

    fn fast() -> Timings {
        Timings {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(1),
            health_interval: Duration::from_millis(100),
            server_alive_interval: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(200),
        }
    }

    #[test]
    fn config_is_checked_before_anything_runs() {
        let d = tempfile::tempdir().expect("tmp");
        let ok = cfg(d.path());
        assert!(NodeLink::new(ok.clone(), fast()).is_ok());
        type Edit = Box<dyn Fn(&mut LinkConfig)>;
        let cases: Vec<(&str, Edit)> = vec![
            ("name", Box::new(|c| c.name = "da 1".into())),
            ("host", Box::new(|c| c.host = "-oProxyCommand=x".into())),
            ("user", Box::new(|c| c.user = String::new())),
            ("identity_file", Box::new(|c| c.identity_file = "id".into())),
            (
                "known_hosts_file",
                Box::new(|c| c.known_hosts_file = "kh".into()),
            ),
            (
                "node_socket",
                Box::new(|c| c.node_socket = "node.sock".into()),
            ),
            (
                "forward_dir",
                Box::new(|c| c.forward_dir = PathBuf::from(format!("/{}", "x".repeat(80)))),
            ),
        ];
        for (what, f) in cases {
            let mut c = ok.clone();
            f(&mut c);
            let e = NodeLink::new(c, fast()).expect_err(what).to_string();
            assert!(e.starts_with("da"), "{e}");
            assert!(e.contains(what), "{what}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn forward_dir_must_be_private_and_stale_sockets_are_removed() {
        let d = tempfile::tempdir().expect("tmp");
        let c = cfg(d.path());
        let link = NodeLink::new(c.clone(), fast()).expect("link");
        // Created 0700 when missing.
        link.inner.prepare_dirs().expect("prepare");
        let mode = std::fs::metadata(&c.forward_dir)
            .expect("dir")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // A stale socket (a dead broker's) is removed ...
        let s = link.sockets();
        drop(UnixListener::bind(&s.node_sock).expect("bind"));
        assert!(s.node_sock.exists());
        link.inner.prepare_dirs().expect("prepare");
        assert!(!s.node_sock.exists());
        // ... anything else at that path is not.
        std::fs::write(&s.podman_sock, "data").expect("write");
        let e = link.inner.prepare_dirs().expect_err("not a socket");
        assert!(matches!(e, Error::StaleSocket { .. }), "{e}");
        assert!(s.podman_sock.exists());
        std::fs::remove_file(&s.podman_sock).expect("rm");
        // A group/world-accessible dir is refused: its sockets are root on the node.
        std::fs::set_permissions(&c.forward_dir, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let e = link
            .inner
            .prepare_dirs()
            .expect_err("a group- or world-accessible forward dir must be refused");
        assert!(e.to_string().contains("chmod 700"), "{e}");
    }

    /// No network: a ProxyCommand that fails makes ssh give up at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_node_is_down_with_its_error_and_retried_with_backoff() {
        if std::process::Command::new("ssh")
            .arg("-V")
            .output()
            .is_err()
        {
            gpuq_test_skip::cannot_run(
                "an_unreachable_node_is_down_with_its_error_and_retried_with_backoff",
                "needs the ssh client (openssh-client)",
            );
            return;
        }
        let d = tempfile::tempdir().expect("tmp");
        let mut c = cfg(d.path());
        let conf = d.path().join("ssh_config");
        std::fs::write(&conf, "Host *\n  ProxyCommand /bin/false\n").expect("write");
        c.ssh_config_file = Some(conf);
        std::fs::write(&c.known_hosts_file, "").expect("write");
        let link = NodeLink::new(c, fast()).expect("link");
        let e = link
            .ensure_up(Duration::from_millis(1500))
            .await
            .expect_err("cannot come up");
        assert!(matches!(e, Error::NotUp { .. }), "{e}");
        assert!(e.to_string().starts_with("da1: link not up"), "{e}");
        let st = link.stats();
        assert!(st.failures >= 2, "retried: {st:?}");
        assert_eq!(st.ups, 0);
        let (_, last) = st.last_error.expect("error");
        assert!(last.starts_with("da1: ssh to root@da1 failed"), "{last}");
        assert!(!link.state().is_up());
        link.close().await;
        assert_eq!(link.state().label(), "down");
        let s = link.sockets();
        assert!(!s.node_sock.exists() && !s.podman_sock.exists());
    }

    #[test]
    fn the_master_reads_our_options_before_the_operators_config() {
        let d = tempfile::tempdir().expect("tmp");
        let mut c = cfg(d.path());
        c.ssh_config_file = Some("/etc/gpuqueue-daos/ssh_config".into());
        let link = NodeLink::new(c, fast()).expect("link");
        let ctl = link.inner.prepare_dirs().expect("dirs");
        let f = link.inner.write_ssh_config(&ctl).expect("write");
        let text = std::fs::read_to_string(f).expect("read");
        let global = text.find("GlobalKnownHostsFile /dev/null").expect("global");
        let include = text
            .find("Include \"/etc/gpuqueue-daos/ssh_config\"")
            .expect("include");
        assert!(global < include, "{text}");
        assert!(text.contains("PasswordAuthentication no"), "{text}");
    }

    #[test]
    fn state_display_says_what_and_since() {
        let s = LinkState::Down {
            since: SystemTime::now(),
            last_error: "da1: link lost: x".into(),
        };
        assert_eq!(s.to_string(), "down for 0s: da1: link lost: x");
        assert_eq!(s.label(), "down");
    }
}
