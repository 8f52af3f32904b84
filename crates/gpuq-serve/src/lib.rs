//! The one accept loop of gpuq's unix-socket APIs: the broker's
//! (`gpuq-broker`'s server.rs) and the node helper's (`gpuq-nodesvc`'s
//! server.rs). Each accepted connection is handed on with its peer as the
//! **kernel** reports it (`SO_PEERCRED`: uid, gid, pid), never as a request
//! says; a connection whose credentials cannot be read is closed unserved.
//! An accept that fails — `EMFILE` when descriptors run out among others —
//! is logged and retried after a short pause, so the loop neither ends nor
//! spins while a limit holds.

use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};

/// Who is at the other end of a connection, as the kernel says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
    /// Absent where the kernel does not say (a peer in another PID
    /// namespace may read as 0, which is also reported as absent).
    pub pid: Option<i32>,
}

/// How long a failed accept waits before the next one.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accept on `listener` until the process ends, handing every connection
/// and its peer to `on_conn` (which must not block: spawn the serving).
/// `what` names the API in the log lines.
pub async fn accept_loop(
    listener: UnixListener,
    what: &'static str,
    mut on_conn: impl FnMut(UnixStream, PeerCred),
) {
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("{what}: accept: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        match stream.peer_cred() {
            Ok(c) => on_conn(
                stream,
                PeerCred {
                    uid: c.uid(),
                    gid: c.gid(),
                    pid: c.pid().filter(|p| *p > 0),
                },
            ),
            Err(e) => tracing::warn!("{what}: peer credentials: {e}; connection closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connections are handed on with the kernel's credentials of the
    /// connecting process (this one).
    #[tokio::test]
    async fn each_connection_comes_with_its_peers_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(accept_loop(listener, "test", move |s, p| {
            let _ = tx.send((s, p));
        }));
        let _a = UnixStream::connect(&path).await.unwrap();
        let _b = UnixStream::connect(&path).await.unwrap();
        for _ in 0..2 {
            let (_, peer) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(peer.uid, own_uid());
            assert_eq!(peer.pid, Some(std::process::id() as i32));
        }
        server.abort();
    }

    fn own_uid() -> u32 {
        // /proc/self belongs to this process's effective uid.
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").unwrap().uid()
    }
}
