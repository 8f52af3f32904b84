//! What can go wrong on the DAOS path, as types: this host's part of a
//! lease ([`HostError`]) and a whole lease as a driver sees it
//! ([`DaosError`]). Each carries the node and the step it concerns as
//! fields; nothing reads them back out of a message. The broker maps these
//! to HTTP statuses in one place (its `error.rs`); their `Display` is the
//! job-log line.

use crate::LifecycleError;
use gpuq_lease::LeaseError;
use thiserror::Error;

/// A failure of the GPU host's part of a lease (`host.rs`): its files,
/// its Podman, the `dmg` it runs and what the DAOS system answered.
#[derive(Debug, Error)]
pub enum HostError {
    /// The preparation was told to stop (the job was cancelled or ran out
    /// of time) and ended between two calls.
    #[error("stopped: the job was cancelled or ran out of time")]
    Stopped,
    /// The lease's client side on this host (files, agent, containers).
    #[error(transparent)]
    Client(gpuq_clienthost::ClientError),
    /// The lease's client side on another GPU host: its helper's answer
    /// to `step`, or why there was none.
    #[error("{step} on {node}: {source}")]
    Remote {
        node: String,
        step: String,
        #[source]
        source: Box<gpuq_client::ClientError>,
    },
    /// The lease's certificates (generated or installed).
    #[error(transparent)]
    Certs(#[from] gpuq_leasecert::CertError),
    /// `dmg ARGS` could not be run on the lease's dmg node `node`.
    #[error("dmg {args} on {node}: {source}")]
    Dmg {
        node: String,
        args: String,
        #[source]
        source: Box<gpuq_client::ClientError>,
    },
    /// A lifecycle without a dmg node was asked to run `dmg ARGS`.
    #[error("dmg {args}: this lifecycle has no dmg node")]
    NoDmgNode { args: String },
    /// `dmg ARGS` ran but printed no JSON envelope.
    #[error("dmg {args} exited {exit} without a JSON envelope ({parse}): {stderr}")]
    DmgOutput {
        args: String,
        exit: i32,
        parse: String,
        stderr: String,
    },
    /// The DAOS system's answer at `step` cannot be used; `node` when it
    /// is one node's doing (a rank that would not stop).
    #[error("{detail}")]
    Daos {
        step: &'static str,
        node: Option<String>,
        detail: String,
    },
}

impl HostError {
    /// The node this failure is one node's doing on, if it is.
    pub fn node(&self) -> Option<&str> {
        match self {
            HostError::Daos { node, .. } => node.as_deref(),
            HostError::Dmg { node, .. } | HostError::Remote { node, .. } => Some(node),
            _ => None,
        }
    }

    pub(crate) fn daos(step: &'static str, detail: impl Into<String>) -> Self {
        HostError::Daos {
            step,
            node: None,
            detail: detail.into(),
        }
    }
}

impl From<gpuq_clienthost::ClientError> for HostError {
    fn from(e: gpuq_clienthost::ClientError) -> Self {
        match e {
            gpuq_clienthost::ClientError::Stopped => HostError::Stopped,
            e => HostError::Client(e),
        }
    }
}

/// A step of a lease's preparation, as the job log and the errors name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareStep {
    Links,
    Preflight,
    Certificates,
    StartServers,
    Files,
    Format,
    Join,
    Agent,
    Running,
}

impl PrepareStep {
    pub fn as_str(self) -> &'static str {
        match self {
            PrepareStep::Links => "links",
            PrepareStep::Preflight => "preflight",
            PrepareStep::Certificates => "certificates",
            PrepareStep::StartServers => "start_servers",
            PrepareStep::Files => "files",
            PrepareStep::Format => "format",
            PrepareStep::Join => "join",
            PrepareStep::Agent => "agent",
            PrepareStep::Running => "running",
        }
    }
}

impl std::fmt::Display for PrepareStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The words the job log has always used.
        f.write_str(match self {
            PrepareStep::Files => "lease files",
            other => other.as_str(),
        })
    }
}

/// A whole lease, as whoever drives it (the broker, `lease-run`) sees it.
#[derive(Debug, Error)]
pub enum DaosError {
    /// The preparation was told to stop (cancel, time limit).
    #[error("stopped: the job was cancelled or ran out of time")]
    Stopped,
    /// The profile is not (or no longer) in `[daos]`.
    #[error("profile '{0}' is not configured")]
    UnknownProfile(String),
    /// The profile's image pin is not a full image ID.
    #[error("profile '{profile}': {source}")]
    BadPin {
        profile: String,
        #[source]
        source: gpuq_podman::Error,
    },
    /// Some node links are not up: (node, why) of each; nothing was started.
    #[error("node links are not up, nothing was started: {}", describe(.down))]
    LinksDown { down: Vec<(String, String)> },
    /// This host's part failed at `step`.
    #[error("{step}: {source}")]
    Host {
        step: PrepareStep,
        #[source]
        source: Box<HostError>,
    },
    /// `--stor`: this host's part (identity, connect, devices) failed.
    #[error("{0}")]
    Stor(String),
    /// The nodes' part (preflight refusals, a failed start, a held cleanup).
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The lease's record.
    #[error("lease {lease}: {source}")]
    Lease {
        lease: String,
        #[source]
        source: LeaseError,
    },
    /// An activation holds the site: `gpuq activate --execute` finishes it.
    #[error("activation {name} holds the site ({reason}): run `sudo gpuq activate --execute --destroy-existing-data` again to finish it (`gpuq recover` does not)")]
    Activating { name: String, reason: String },
    /// A lease whose profile is gone is held, not cleaned.
    #[error("lease {lease} held: cannot clean up: {source}")]
    Unconfigured {
        lease: String,
        #[source]
        source: Box<DaosError>,
    },
}

impl DaosError {
    pub(crate) fn host(step: PrepareStep) -> impl FnOnce(HostError) -> DaosError {
        move |source| match source {
            HostError::Stopped => DaosError::Stopped,
            source => DaosError::Host {
                step,
                source: Box::new(source),
            },
        }
    }
}

fn describe(down: &[(String, String)]) -> String {
    down.iter()
        .map(|(n, e)| format!("{n}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_is_a_stop_whatever_the_step() {
        let e = DaosError::host(PrepareStep::Join)(HostError::Stopped);
        assert!(matches!(e, DaosError::Stopped), "{e:?}");
        let e = DaosError::host(PrepareStep::Join)(HostError::daos("join", "3 of 4 ranks joined"));
        assert_eq!(e.to_string(), "join: 3 of 4 ranks joined");
    }

    #[test]
    fn a_rank_that_would_not_stop_names_its_node_as_a_field() {
        let e = HostError::Daos {
            step: "system_stop",
            node: Some("da3".into()),
            detail: "dmg system stop: da3: rank 2: busy".into(),
        };
        assert_eq!(e.node(), Some("da3"));
        let local = crate::LocalError::from(e);
        assert_eq!(local.node.as_deref(), Some("da3"));
        assert_eq!(HostError::Stopped.node(), None);
    }

    #[test]
    fn a_lease_whose_profile_is_gone_says_it_is_held_and_why() {
        let unconfigured = DaosError::Unconfigured {
            lease: "L".into(),
            source: Box::new(DaosError::UnknownProfile("p".into())),
        };
        assert_eq!(
            unconfigured.to_string(),
            "lease L held: cannot clean up: profile 'p' is not configured"
        );
    }
}
