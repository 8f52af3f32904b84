//! `daos_agent` and the `daos` client tool.
//!
//! The agent listens on `daos_agent.sock` in its socket dir (`-s DIR`, else
//! `$DAOS_AGENT_DRPC_DIR`, else `runtime_dir` from its config, else
//! `/var/run/daos_agent`) and answers one request, `get_attach_info`, with
//! the system name, access points and transport setting — the role the real
//! agent plays for clients (dRPC GetAttachInfo). `daos` asks the agent found
//! through `$DAOS_AGENT_DRPC_DIR` (default `/var/run/daos_agent`), then has
//! the agent send its request to the access points (`cont_create`): the
//! agent holds the agent certificate, clients hold none (real DAOS clients
//! reach the engines over the fabric with credentials the agent signs). So
//! a client container needs the agent's socket dir mounted, as with real
//! DAOS.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{AgentConfig, DEFAULT_PORT};
use crate::dmg::{print_envelope, system_call, Args};
use crate::error::{SimError, DER_INVAL};
use crate::model::{ContCreateResp, ContReadResp, ContWriteResp, DmgResponse};
use crate::proto::{Reply, Request, Wire};
use crate::tls::{Role, Transport};

pub const SOCKET_NAME: &str = "daos_agent.sock";
pub const DEFAULT_DIR: &str = "/var/run/daos_agent";
/// DER_AGENT_COMM: what libdaos reports when it cannot reach the agent.
pub const DER_AGENT_COMM: i32 = -1028;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachInfo {
    pub system: String,
    pub access_points: Vec<String>,
    pub port: u16,
    pub insecure: bool,
}

fn log(msg: impl AsRef<str>) {
    crate::model::log_line("daos_agent", msg.as_ref());
}

/// `daos_agent [-o CONFIG] [-i] [-s DIR] [start]`; returns the exit code.
pub fn agent_main(argv: &[String]) -> i32 {
    match agent(argv) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ERROR: daos_agent: {e}");
            1
        }
    }
}

fn agent(argv: &[String]) -> Result<i32, SimError> {
    let args = Args::parse(
        argv,
        &["o", "config-path", "s", "runtime_dir", "l", "logfile"],
    )?;
    if args.has(&["h", "help"]) {
        println!("Usage: daos_agent [-o CONFIG] [-i] [-s RUNTIME_DIR] [start]\n\ndaos-sim: DAOS control-plane simulator for tests; not DAOS.");
        return Ok(0);
    }
    let mut cfg = match args.get(&["o", "config-path"]) {
        Some(p) => AgentConfig::load(Path::new(p))?,
        None => AgentConfig::default(),
    };
    if args.has(&["i", "insecure"]) {
        cfg.transport_config.allow_insecure = true;
    }
    let dir = args
        .get(&["s", "runtime_dir"])
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("DAOS_AGENT_DRPC_DIR").map(PathBuf::from))
        .or_else(|| cfg.runtime_dir.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    if let Some(f) = &cfg.log_file {
        crate::model::set_log_file(f);
    }
    // The agent certificate is read at start: a bad file fails the start.
    let transport = Transport::load(&cfg.transport_config, Role::Agent)?;
    std::fs::create_dir_all(&dir)
        .map_err(|e| SimError::io(format!("create socket dir {}", dir.display()), e))?;
    let sock = dir.join(SOCKET_NAME);
    let _ = std::fs::remove_file(&sock);
    // Before the socket exists: whoever sees it may stop us at once (the
    // server's run() says why).
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&term))
            .map_err(|e| SimError::io("install signal handler", e))?;
    }
    // The socket is made under a temporary name and renamed into place once
    // it listens: bind() creates the file before listen(), and a client that
    // took the file for "agent ready" got ECONNREFUSED in between (a sim
    // test, about 1 run in 40 under load, issue 13).
    let tmp = dir.join(format!(".{SOCKET_NAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)
        .map_err(|e| SimError::io(format!("listen on {}", tmp.display()), e))?;
    // Like DAOS's agent (v2.8.0 src/control/cmd/daos_agent/start.go:
    // NewDomainSocketServer(..., sockPath, 0666), which chmods the socket):
    // every local user's client library may talk to the agent; the agent
    // checks who they are. gpuq's barrier is the directory (clienthost).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| SimError::io(format!("chmod {}", tmp.display()), e))?;
    }
    std::fs::rename(&tmp, &sock)
        .map_err(|e| SimError::io(format!("rename {} to {}", tmp.display(), sock.display()), e))?;
    let info = AttachInfo {
        system: cfg.name.clone(),
        access_points: cfg.access_points.clone(),
        port: cfg.port,
        insecure: cfg.transport_config.allow_insecure,
    };
    log(format!(
        "daos-sim (DAOS control-plane simulator, not DAOS), pid {}: listening on {}, system {:?}, access points {:?}",
        std::process::id(),
        sock.display(),
        info.system,
        info.access_points
    ));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let info = info.clone();
            let tp = transport.clone();
            std::thread::spawn(move || serve(conn, &info, &tp));
        }
    });
    while !term.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    log("caught SIGTERM: evicting pool handles of local clients (simulated) and exiting");
    let _ = std::fs::remove_file(&sock);
    Ok(0)
}

/// What a client asks the agent.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum AgentRequest {
    GetAttachInfo,
    /// Sent on to the access points with the agent's certificate.
    ContCreate {
        pool: String,
        label: String,
        kind: String,
    },
    /// `daos filesystem copy`: sent on like `ContCreate`.
    ContWrite {
        pool: String,
        cont: String,
        data: String,
    },
    /// `daos filesystem copy --src daos://…`: sent on like `ContCreate`.
    ContRead {
        pool: String,
        cont: String,
    },
}

fn serve(conn: UnixStream, info: &AttachInfo, tp: &Transport) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    if BufReader::new(&conn).read_line(&mut line).is_err() {
        return;
    }
    let mut out = match serde_json::from_str::<AgentRequest>(&line) {
        Ok(AgentRequest::GetAttachInfo) => serde_json::to_vec(info).unwrap_or_default(),
        Ok(
            r @ (AgentRequest::ContCreate { .. }
            | AgentRequest::ContWrite { .. }
            | AgentRequest::ContRead { .. }),
        ) => {
            let req = match r {
                AgentRequest::ContRead { pool, cont } => Request::ContRead { pool, cont },
                AgentRequest::ContWrite { pool, cont, data } => {
                    Request::ContWrite { pool, cont, data }
                }
                AgentRequest::ContCreate { pool, label, kind } => {
                    Request::ContCreate { pool, label, kind }
                }
                AgentRequest::GetAttachInfo => unreachable!("matched above"),
            };
            let wire = Wire {
                req,
                system: info.system.clone(),
                insecure: tp.insecure(),
            };
            let port = if info.port == 0 {
                DEFAULT_PORT
            } else {
                info.port
            };
            let reply = match system_call(
                &info.access_points,
                port,
                &wire,
                Duration::from_secs(30),
                tp,
            ) {
                Ok(v) => Reply::Ok(v),
                Err(e) => Reply::Err {
                    msg: e.to_string(),
                    status: e.status(),
                },
            };
            serde_json::to_vec(&reply).unwrap_or_default()
        }
        Err(e) => serde_json::to_vec(&Reply::Err {
            msg: format!("bad request to the agent: {e}"),
            status: DER_INVAL,
        })
        .unwrap_or_default(),
    };
    out.push(b'\n');
    let mut c = &conn;
    let _ = c.write_all(&out);
}

fn attach_info() -> Result<AttachInfo, SimError> {
    let line = agent_call(b"{\"op\":\"get_attach_info\"}\n", Duration::from_secs(5))?;
    serde_json::from_str(&line).map_err(|e| SimError::Protocol {
        peer: "daos_agent".into(),
        msg: e.to_string(),
    })
}

/// One request line to the agent, its reply line back.
fn agent_call(req: &[u8], timeout: Duration) -> Result<String, SimError> {
    let dir = std::env::var_os("DAOS_AGENT_DRPC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR));
    let sock = dir.join(SOCKET_NAME);
    let agent_err = |e: std::io::Error| {
        SimError::remote(
            format!(
                "DER_AGENT_COMM(-1028): Agent communication error: {}: {e}",
                sock.display()
            ),
            DER_AGENT_COMM,
        )
    };
    let mut c = UnixStream::connect(&sock).map_err(agent_err)?;
    c.set_read_timeout(Some(timeout)).map_err(agent_err)?;
    c.write_all(req).map_err(agent_err)?;
    let mut line = String::new();
    BufReader::new(&c).read_line(&mut line).map_err(agent_err)?;
    Ok(line)
}

/// `daos [-G SYSTEM] [-j] container create POOL LABEL --type=POSIX`.
pub fn daos_main(argv: &[String]) -> i32 {
    let args = match Args::parse(
        argv,
        &["G", "sys-name", "type", "t", "pool", "label", "src", "dst"],
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ERROR: daos: {e}");
            return 1;
        }
    };
    if args.has(&["h", "help"]) || args.pos.is_empty() {
        println!("Usage: daos [-G SYSTEM] [-j] container create POOL LABEL --type=POSIX\n       daos [-G SYSTEM] [-j] filesystem copy --src FILE --dst daos://POOL/CONT\n       daos [-G SYSTEM] [-j] filesystem copy --src daos://POOL/CONT --dst FILE\n\ndaos-sim: DAOS control-plane simulator for tests; not DAOS.");
        return if args.pos.is_empty() && !args.has(&["h", "help"]) {
            1
        } else {
            0
        };
    }
    let json = args.has(&["j", "json"]);
    if matches!(
        args.pos.first().map(String::as_str),
        Some("filesystem" | "fs")
    ) {
        if args.get(&["src"]).is_some_and(|s| s.starts_with("daos://")) {
            return match fs_copy_out(&args) {
                Ok(resp) => {
                    if json {
                        print_envelope(Some(DmgResponse::ContRead(resp)), None);
                    } else {
                        println!(
                            "Successfully copied from DAOS: {} bytes, the same on every bdev of ranks {:?}",
                            resp.data.len(),
                            resp.ranks
                        );
                    }
                    0
                }
                Err(e) => {
                    if json {
                        print_envelope(None, Some(&e));
                    } else {
                        eprintln!("ERROR: daos: {e}");
                    }
                    1
                }
            };
        }
        return match fs_copy(&args) {
            Ok(resp) => {
                if json {
                    print_envelope(Some(DmgResponse::ContWrite(resp)), None);
                } else {
                    println!(
                        "Successfully copied to DAOS: {} bytes at offset {} of each bdev of ranks {:?}",
                        resp.bytes, resp.offset, resp.ranks
                    );
                }
                0
            }
            Err(e) => {
                if json {
                    print_envelope(None, Some(&e));
                } else {
                    eprintln!("ERROR: daos: {e}");
                }
                1
            }
        };
    }
    match cont_create(&args) {
        Ok(resp) => {
            if json {
                print_envelope(Some(DmgResponse::ContCreate(resp)), None);
            } else {
                println!(
                    "Successfully created container {} type {}",
                    resp.container_uuid, resp.container_type
                );
            }
            0
        }
        Err(e) => {
            if json {
                print_envelope(None, Some(&e));
            } else {
                eprintln!("ERROR: daos: {e}");
            }
            1
        }
    }
}

/// `filesystem copy` is the only `filesystem` command the simulator has.
fn copy_words(args: &Args) -> Result<(), SimError> {
    let words: Vec<&str> = args.pos.iter().map(String::as_str).collect();
    if matches!(words.as_slice(), ["filesystem" | "fs", "copy"]) {
        Ok(())
    } else {
        Err(SimError::Usage(format!(
            "unsupported command {:?} (daos-sim supports: filesystem copy --src FILE --dst daos://POOL/CONT, and back)",
            words.join(" ")
        )))
    }
}

/// `POOL` and `CONT` of `daos://POOL/CONT[/PATH]`.
fn daos_path(what: &str, v: &str) -> Result<(String, String), SimError> {
    v.strip_prefix("daos://")
        .and_then(|r| {
            let mut it = r.splitn(3, '/');
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .filter(|(p, c)| !p.is_empty() && !c.is_empty())
        .ok_or_else(|| SimError::Usage(format!("{what} {v:?}: expected daos://POOL/CONT")))
}

/// `daos filesystem copy --src daos://POOL/CONT --dst FILE`: everything
/// copied into the container, read back through the servers (every rank
/// of the pool must hold the same), written to FILE (created, not
/// replaced).
fn fs_copy_out(args: &Args) -> Result<ContReadResp, SimError> {
    copy_words(args)?;
    let (pool, cont) = daos_path("--src", args.get(&["src"]).unwrap_or_default())?;
    let dst = args
        .get(&["dst"])
        .ok_or_else(|| SimError::Usage("filesystem copy needs --dst FILE".into()))?;
    let resp: ContReadResp = ask_agent(
        args,
        serde_json::json!({"op": "cont_read", "pool": pool, "cont": cont}),
    )?;
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .and_then(|mut f| f.write_all(resp.data.as_bytes()))
        .map_err(|e| SimError::io(format!("write {dst}"), e))?;
    Ok(resp)
}

/// `daos filesystem copy --src FILE --dst daos://POOL/CONT[/PATH]`: the
/// file's bytes (UTF-8 text, at most 64 KiB: the simulator's extent) go to
/// the next data extent of every rank of the pool (docs/daos-sim.md).
fn fs_copy(args: &Args) -> Result<ContWriteResp, SimError> {
    copy_words(args)?;
    let src = args
        .get(&["src"])
        .ok_or_else(|| SimError::Usage("filesystem copy needs --src FILE".into()))?;
    let (pool, cont) = daos_path("--dst", args.get(&["dst"]).unwrap_or_default())?;
    let data = std::fs::read_to_string(src).map_err(|e| SimError::io(format!("read {src}"), e))?;
    ask_agent(
        args,
        serde_json::json!({"op": "cont_write", "pool": pool, "cont": cont, "data": data}),
    )
}

fn cont_create(args: &Args) -> Result<ContCreateResp, SimError> {
    let words: Vec<&str> = args.pos.iter().map(String::as_str).collect();
    let (pool, label) = match words.as_slice() {
        ["container" | "cont", "create", pool, label] => (pool.to_string(), label.to_string()),
        ["container" | "cont", "create", pool] if args.get(&["label"]).is_some() => {
            (pool.to_string(), args.get(&["label"]).unwrap_or_default().to_string())
        }
        _ => {
            return Err(SimError::Usage(format!(
                "unsupported command {:?} (daos-sim supports: container create POOL LABEL --type=POSIX)",
                words.join(" ")
            )))
        }
    };
    let kind = args
        .get(&["type", "t"])
        .unwrap_or("POSIX")
        .to_ascii_uppercase();
    ask_agent(
        args,
        serde_json::json!({"op": "cont_create", "pool": pool, "label": label, "kind": kind}),
    )
}

/// Send `req` to the agent of the system `-G` names (it must be the
/// agent's) and read its answer.
fn ask_agent<T: serde::de::DeserializeOwned>(
    args: &Args,
    req: serde_json::Value,
) -> Result<T, SimError> {
    let info = attach_info()?;
    let system = args.get(&["G", "sys-name"]).unwrap_or("daos_server");
    if system != info.system {
        return Err(SimError::remote(
            format!(
                "DER_INVAL(-1003): Invalid parameters: system {system:?} is not the agent's system {:?}",
                info.system
            ),
            DER_INVAL,
        ));
    }
    let mut req = serde_json::to_vec(&req).unwrap_or_default();
    req.push(b'\n');
    let line = agent_call(&req, Duration::from_secs(35))?;
    let proto = |e: serde_json::Error| SimError::Protocol {
        peer: "daos_agent".into(),
        msg: e.to_string(),
    };
    match serde_json::from_str::<Reply>(&line).map_err(proto)? {
        Reply::Ok(v) => serde_json::from_value(v).map_err(proto),
        Reply::Err { msg, status } => Err(SimError::remote(msg, status)),
    }
}
