//! The simulator's wire protocol between dmg/daos/agent and the simulated
//! servers, and between servers: one JSON object per line over TCP, one
//! request and one reply per connection. This is the simulator's own design
//! (real DAOS speaks gRPC with TLS); only its JSON output imitates DAOS.
//!
//! A request is `{"req":{"op":...},"system":NAME,"insecure":BOOL}`; a reply
//! is `{"ok":VALUE}` or `{"err":{"msg":...,"status":DER}}`. Without
//! `allow_insecure` both lines travel inside a mutual-TLS session
//! ([`crate::tls`]).

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::SimError;
use crate::tls::Transport;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// dmg → every host: format this host's storage.
    Format,
    /// dmg → every host: this host's storage and what is free
    /// (`dmg storage query usage`).
    StorageUsage,
    /// dmg → any server (forwarded to the MS).
    SystemQuery,
    /// dmg → any server (forwarded to the MS).
    SystemStop { force: bool },
    /// dmg → any server (forwarded to the MS).
    PoolCreate {
        label: String,
        size: u64,
        nranks: Option<u32>,
        nsvc: Option<u32>,
    },
    /// daos → any server (forwarded to the MS).
    ContCreate {
        pool: String,
        label: String,
        kind: String,
    },
    /// server → MS: register a formatted engine.
    Join(JoinReq),
    /// MS → server: stop the engine (system stop).
    EngineStop { force: bool },
    /// server → MS: my engine changed state (stopped on SIGTERM).
    MemberState { uuid: String, state: String },
    /// daos (through the agent) → any server (forwarded to the MS): write
    /// `data` into a container (`daos filesystem copy`).
    ContWrite {
        pool: String,
        cont: String,
        data: String,
    },
    /// MS → server: write `data` at byte `offset` of every bdev of this
    /// engine (the simulator's on-disk layout, docs/daos-sim.md).
    BdevWrite { offset: u64, data: String },
    /// daos (through the agent) → any server (forwarded to the MS): what
    /// a container holds (`daos filesystem copy --src daos://POOL/CONT`).
    ContRead { pool: String, cont: String },
    /// MS → server: `len` bytes at `offset` of every bdev of this engine,
    /// which must all hold the same.
    BdevRead { offset: u64, len: u64 },
}

impl Request {
    /// The request's name in logs and refusals.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Format => "StorageFormat",
            Request::StorageUsage => "StorageScan",
            Request::SystemQuery => "SystemQuery",
            Request::SystemStop { .. } => "SystemStop",
            Request::PoolCreate { .. } => "PoolCreate",
            Request::ContCreate { .. } => "ContCreate",
            Request::Join(_) => "Join",
            Request::EngineStop { .. } => "StopRanks",
            Request::MemberState { .. } => "ClusterEvent",
            Request::ContWrite { .. } => "ContWrite",
            Request::BdevWrite { .. } => "BdevWrite",
            Request::ContRead { .. } => "ContRead",
            Request::BdevRead { .. } => "BdevRead",
        }
    }

    /// Requests a non-MS server passes on to the management service.
    pub fn is_system_level(&self) -> bool {
        matches!(
            self,
            Request::SystemQuery
                | Request::SystemStop { .. }
                | Request::PoolCreate { .. }
                | Request::ContCreate { .. }
                | Request::ContWrite { .. }
                | Request::ContRead { .. }
                | Request::Join(_)
                | Request::MemberState { .. }
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinReq {
    pub uuid: String,
    pub rank: Option<u32>,
    pub addr: String,
    pub fault_domain: String,
    pub fabric_uri: String,
    pub fabric_contexts: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinResp {
    pub rank: u32,
    pub incarnation: u64,
}

/// What goes on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Wire {
    pub req: Request,
    pub system: String,
    pub insecure: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    Ok(serde_json::Value),
    Err { msg: String, status: i32 },
}

/// Sends one request over `tp` and waits up to `timeout` for the reply.
pub fn call(
    addr: SocketAddr,
    wire: &Wire,
    timeout: Duration,
    tp: &Transport,
) -> Result<serde_json::Value, SimError> {
    let peer = addr.to_string();
    let io = |e: std::io::Error| SimError::io(format!("connect to {peer}"), e);
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let mut line = serde_json::to_vec(wire).map_err(|e| SimError::Protocol {
        peer: peer.clone(),
        msg: e.to_string(),
    })?;
    line.push(b'\n');
    let reply = tp.exchange(s, &line, &peer)?;
    if reply.is_empty() {
        return Err(SimError::Protocol {
            peer,
            msg: "connection closed without a reply".into(),
        });
    }
    match serde_json::from_str::<Reply>(&reply) {
        Ok(Reply::Ok(v)) => Ok(v),
        Ok(Reply::Err { msg, status }) => Err(SimError::remote(msg, status)),
        Err(e) => Err(SimError::Protocol {
            peer,
            msg: e.to_string(),
        }),
    }
}
