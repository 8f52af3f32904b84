//! `gpuq daos-exec`: the caller's terminal joined to a client container of
//! their running `--inst` job, over the broker's upgraded connection
//! (framing: [`gpuq_protocol::exec`]). Output is written as it arrives, a
//! frame at a time, so any amount streams in bounded memory.

use gpuq_client::{Client, ClientError};
use gpuq_protocol::exec::{self as wire, to_broker, to_cli, ExecRequest};
use gpuq_protocol::routes;
use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

pub async fn run(
    client: &Client,
    workdir: Option<String>,
    env: Vec<String>,
    argv: Vec<String>,
) -> Result<i32, ClientError> {
    let mut pairs = Vec::new();
    for e in env {
        match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => pairs.push((k.to_string(), v.to_string())),
            _ => {
                eprintln!("gpuq: --env '{e}': expected NAME=VALUE");
                return Ok(crate::Exit::Usage as i32);
            }
        }
    }
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal() && std::io::stdout().is_terminal();
    let size = if tty {
        gpuq_sys::term::window_size(stdin.as_fd())
    } else {
        None
    };
    let req = ExecRequest {
        argv,
        workdir,
        env: pairs,
        tty,
        rows: size.map(|s| s.0),
        cols: size.map(|s| s.1),
    };
    let body = serde_json::to_vec(&req).map_err(|e| ClientError::Protocol {
        socket: client.socket().to_path_buf(),
        what: e.to_string(),
    })?;
    // SIGTERM and SIGINT are ours from before the request: one that comes
    // while the broker sets the session up ends the CLI with the same exit
    // code as later, and the dropped connection tells the broker to remove
    // what it made (rather than the signal's default action killing the
    // CLI at some point of the set-up).
    let signal_error = |e: std::io::Error| ClientError::Protocol {
        socket: client.socket().to_path_buf(),
        what: e.to_string(),
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(signal_error)?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(signal_error)?;
    let io = tokio::select! {
        r = client.upgrade(routes::EXEC, wire::UPGRADE, body) => r?,
        _ = term.recv() => return Ok(143),
        _ = int.recv() => return Ok(130),
    };
    // Raw mode only once the session exists (a refusal leaves the terminal
    // as it was); restored when `_raw` drops, on every path out.
    let _raw = if tty {
        gpuq_sys::term::RawMode::enter(stdin.as_fd()).ok()
    } else {
        None
    };
    let (mut rd, mut wr) = tokio::io::split(io);

    // stdin: a thread of its own (a blocking read), frames to the broker.
    let (tx, mut rx) = mpsc::channel::<Option<Vec<u8>>>(4);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 32 * 1024];
        let mut input = std::io::stdin().lock();
        loop {
            match input.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if tx.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .map_err(signal_error)?;
    let sender = async move {
        // The terminal's size once more, now that the command runs (the
        // size sent with the request may have reached it too early).
        if let Some((r, c)) = size {
            let mut p = r.to_be_bytes().to_vec();
            p.extend_from_slice(&c.to_be_bytes());
            if frame(&mut wr, to_broker::RESIZE, &p).await.is_err() {
                return;
            }
        }
        let mut stdin_open = true;
        loop {
            tokio::select! {
                m = rx.recv(), if stdin_open => {
                    let r = match m.flatten() {
                        Some(data) => frame(&mut wr, to_broker::STDIN, &data).await,
                        None => {
                            stdin_open = false;
                            frame(&mut wr, to_broker::STDIN_EOF, &[]).await
                        }
                    };
                    if r.is_err() {
                        return;
                    }
                }
                _ = winch.recv(), if tty => {
                    if let Some((r, c)) = gpuq_sys::term::window_size(std::io::stdin().as_fd()) {
                        let mut p = r.to_be_bytes().to_vec();
                        p.extend_from_slice(&c.to_be_bytes());
                        if frame(&mut wr, to_broker::RESIZE, &p).await.is_err() {
                            return;
                        }
                    }
                }
                // stdin ended and no terminal to watch: only the output
                // side has anything left to do.
                else => std::future::pending::<()>().await,
            }
        }
    };
    let receiver = async move {
        let mut out = std::io::stdout().lock();
        let mut err = std::io::stderr();
        let mut buf = vec![0u8; wire::MAX_FRAME];
        loop {
            let mut h = [0u8; 8];
            if rd.read_exact(&mut h).await.is_err() {
                return Err("the broker ended the session without an exit status".to_string());
            }
            let Some((kind, len)) = wire::parse_header(&h) else {
                return Err("the broker sent a malformed frame".to_string());
            };
            if rd.read_exact(&mut buf[..len]).await.is_err() {
                return Err("the session was cut".to_string());
            }
            let data = &buf[..len];
            match kind {
                to_cli::STDOUT => {
                    // A closed stdout (`| head`) ends the session: the
                    // container is removed when we go.
                    if out.write_all(data).and_then(|_| out.flush()).is_err() {
                        return Ok(141);
                    }
                }
                to_cli::STDERR => {
                    let _ = err.write_all(data);
                }
                to_cli::EXIT if len == 4 => {
                    return Ok(i32::from_be_bytes([data[0], data[1], data[2], data[3]]));
                }
                to_cli::ERROR => return Err(String::from_utf8_lossy(data).into_owned()),
                _ => return Err(format!("the broker sent an unknown frame ({kind})")),
            }
        }
    };
    tokio::pin!(receiver);
    let outcome = tokio::select! {
        r = &mut receiver => r,
        _ = sender => receiver.await,
        _ = term.recv() => Ok(143),
        _ = int.recv() => Ok(130),
    };
    drop(_raw);
    match outcome {
        Ok(code) => Ok(code),
        Err(msg) => {
            eprintln!("gpuq: daos-exec: {msg}");
            Ok(crate::Exit::Refused as i32)
        }
    }
}

async fn frame<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    kind: u8,
    data: &[u8],
) -> std::io::Result<()> {
    w.write_all(&wire::header(kind, data.len())).await?;
    w.write_all(data).await?;
    w.flush().await
}
