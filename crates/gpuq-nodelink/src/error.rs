//! The crate's one error type. Every message is one line, names the node and
//! says what to check.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{node}: invalid link config: {what}")]
    Config { node: String, what: String },

    #[error("{node}: cannot prepare the forward dir {}: {source}; check that it is a root-owned directory on a local filesystem", dir.display())]
    ForwardDir {
        node: String,
        dir: PathBuf,
        source: std::io::Error,
    },

    #[error("{node}: forward dir {} has mode {mode:o}; it must not be group/world accessible (its sockets give root on the node): chmod 700 it", dir.display())]
    ForwardDirUnsafe {
        node: String,
        dir: PathBuf,
        mode: u32,
    },

    #[error("{node}: cannot remove the stale local socket {}: {detail}; remove it by hand if nothing uses it", path.display())]
    StaleSocket {
        node: String,
        path: PathBuf,
        detail: String,
    },

    #[error("{node}: host key of {dest} refused: {detail}; check {} holds the node's current host key (ssh-keyscan on a trusted path, then compare)", known_hosts.display())]
    HostKey {
        node: String,
        dest: String,
        known_hosts: PathBuf,
        detail: String,
    },

    #[error("{node}: {dest} refused key login: {detail}; check that {} is the key in the node's authorized_keys (and its from= address)", identity.display())]
    Auth {
        node: String,
        dest: String,
        identity: PathBuf,
        detail: String,
    },

    #[error("{node}: ssh to {dest} failed: {detail}; check the node is up, sshd runs and the address/port are right")]
    Connect {
        node: String,
        dest: String,
        detail: String,
    },

    #[error(
        "{node}: ssh to {dest} did not finish within {after:?}; check the network path to the node"
    )]
    ConnectTimeout {
        node: String,
        dest: String,
        after: Duration,
    },

    #[error("{node}: forward {} -> {remote} refused: {detail}; check AllowStreamLocalForwarding in the node's sshd_config", local.display())]
    Forward {
        node: String,
        local: PathBuf,
        remote: String,
        detail: String,
    },

    #[error("{node}: {what} through {}: {detail}; check that it runs on the node at {remote}", local.display())]
    Verify {
        node: String,
        /// e.g. `gpuq-node did not answer GET /v1/status`
        what: &'static str,
        local: PathBuf,
        remote: String,
        detail: String,
    },

    #[error("{node}: the gpuq-node behind {remote} says it is {answered:?}; check node_socket in the config for {node}")]
    WrongNode {
        node: String,
        remote: String,
        answered: String,
    },

    #[error("{node}: link lost: {detail}; check the node's sshd, network and Podman service")]
    Lost { node: String, detail: String },

    #[error("{node}: link not up after {after:?} ({state}); check `gpuq daos-status` and the node's sshd log")]
    NotUp {
        node: String,
        after: Duration,
        state: String,
    },

    #[error("{node}: link closed")]
    Closed { node: String },

    #[error("{node}: {detail}")]
    Step { node: String, detail: String },

    #[error("step failed on {nodes}: {details}")]
    StepFailed { nodes: String, details: String },
}

impl Error {
    /// The node this error is about (a comma list for [`Error::StepFailed`]).
    pub fn node(&self) -> &str {
        match self {
            Error::Config { node, .. }
            | Error::ForwardDir { node, .. }
            | Error::ForwardDirUnsafe { node, .. }
            | Error::StaleSocket { node, .. }
            | Error::HostKey { node, .. }
            | Error::Auth { node, .. }
            | Error::Connect { node, .. }
            | Error::ConnectTimeout { node, .. }
            | Error::Forward { node, .. }
            | Error::Verify { node, .. }
            | Error::WrongNode { node, .. }
            | Error::Lost { node, .. }
            | Error::NotUp { node, .. }
            | Error::Closed { node }
            | Error::Step { node, .. } => node,
            Error::StepFailed { nodes, .. } => nodes,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// ssh's stderr is several lines (the MITM banner for a changed host key):
/// keep the lines that say what happened, on one line.
pub(crate) fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.trim().trim_matches('@').trim())
        .filter(|l| {
            !l.is_empty() && !l.starts_with("@@@") && !l.starts_with("Warning: Permanently")
        })
        .collect();
    let key: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.contains("IDENTIFICATION HAS CHANGED")
                || l.contains("Host key verification failed")
                || l.contains("No ")
                || l.contains("Permission denied")
                || l.contains("Offending")
                || l.contains("Connection")
                || l.contains("connect to")
                || l.contains("timed out")
        })
        .collect();
    let pick = if key.is_empty() { lines } else { key };
    pick.join(" / ").chars().take(400).collect()
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn ssh_banner_becomes_one_line_with_the_reason() {
        let text = "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n\
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n\
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\n\
Someone could be eavesdropping on you right now (man-in-the-middle attack)!\n\
Offending ED25519 key in /etc/gpuqueue-daos/known_hosts:1\n\
Host key verification failed.\n";
        let l = one_line(text);
        assert!(!l.contains('\n') && !l.contains('@'), "{l}");
        assert!(l.contains("IDENTIFICATION HAS CHANGED"), "{l}");
        assert!(l.ends_with("Host key verification failed."), "{l}");
        assert!(!l.contains("NASTY"), "{l}");
    }
}
