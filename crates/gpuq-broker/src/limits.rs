//! What one user may take of the broker: open connections (per UID and
//! overall) and how long a connection may stall the broker's answer.
//!
//! The socket is world-connectable, so anyone on the host can open as many
//! connections as their own file-descriptor limit allows. Each one costs the
//! broker a descriptor, a task and buffers. The peer's UID is known at
//! `accept` (`SO_PEERCRED`), before a byte is read, so the caps are applied
//! there: a connection over a cap is answered with one JSON error (429 for
//! the UID's own cap, 503 for the overall one) and closed. Root's
//! connections count only against root's per-UID cap, never the overall one:
//! however many connections other users hold, `sudo gpuq recover` and
//! `sudo gpuq lock` still get through.
//!
//! Deadlines for reading a request are hyper's (`header_read_timeout`, which
//! also closes idle keep-alive connections) and the body's own
//! (`server::read_json`). [`Stalling`] adds the other direction: an answer
//! the client does not read ends the connection after `write_timeout`,
//! except on streams (`follow`, `daos-exec`), whose memory is bounded by
//! their channels and whose readers may legitimately pause.

use crate::config::Limits;
use crate::error::ApiError;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Refusals being answered at once, at most; beyond that an over-cap
/// connection is closed without an answer (a flood must not turn the
/// refusals themselves into the exhaustion).
pub const MAX_REFUSING: usize = 64;

/// How long a refusal may take to be written (the client may not read).
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(2);

/// Requests of one UID (not root) the broker works on at once; the others
/// wait, without using CPU, for one of these to finish. The store is one
/// connection behind a mutex: without this, a user's many `list`s each
/// take the mutex in turn and another user's request waits behind all of
/// them. Streams hold a permit only until their answer starts.
pub const REQUESTS_IN_FLIGHT_PER_USER: usize = 4;

#[derive(Debug, Default)]
struct Counts {
    /// Connections of every UID but root.
    others: usize,
    per_uid: HashMap<u32, usize>,
    refusing: usize,
    /// Each UID's requests in flight (see [`REQUESTS_IN_FLIGHT_PER_USER`]),
    /// while it has a connection open.
    work: HashMap<u32, Arc<tokio::sync::Semaphore>>,
}

/// The broker's open connections, by UID.
#[derive(Debug)]
pub struct Connections {
    limits: Limits,
    counts: Mutex<Counts>,
}

/// One admitted connection; dropping it gives its slot back.
#[derive(Debug)]
pub struct Slot {
    conns: Arc<Connections>,
    uid: u32,
    work: Arc<tokio::sync::Semaphore>,
}

impl Slot {
    /// Wait for a turn to work on one request of this connection's UID
    /// (root's requests never wait).
    pub async fn turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if self.uid == 0 {
            return None;
        }
        // The semaphore is never closed.
        Arc::clone(&self.work).acquire_owned().await.ok()
    }
}

/// One refusal being answered; dropping it gives its place back.
#[derive(Debug)]
pub struct Refusing {
    conns: Arc<Connections>,
}

impl Connections {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Connections {
            limits,
            counts: Mutex::new(Counts::default()),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a slot for a connection of `uid`, or say which cap it is over.
    pub fn admit(self: &Arc<Self>, uid: u32) -> Result<Slot, ApiError> {
        let mut c = self.counts();
        let mine = c.per_uid.get(&uid).copied().unwrap_or(0);
        let per_user = self.limits.max_connections_per_user;
        if mine >= per_user {
            return Err(ApiError::TooMany(format!(
                "too many connections from uid {uid}: {mine} open, the most one user may have \
                 (broker.max_connections_per_user = {per_user}); close some (running `gpuq follow`s?) and try again"
            )));
        }
        if uid != 0 && c.others >= self.limits.max_connections {
            return Err(ApiError::Busy(format!(
                "the broker has {} connections open, the most it takes (broker.max_connections = {}); try again shortly",
                c.others, self.limits.max_connections
            )));
        }
        *c.per_uid.entry(uid).or_insert(0) += 1;
        if uid != 0 {
            c.others += 1;
        }
        let work =
            Arc::clone(c.work.entry(uid).or_insert_with(|| {
                Arc::new(tokio::sync::Semaphore::new(REQUESTS_IN_FLIGHT_PER_USER))
            }));
        Ok(Slot {
            conns: Arc::clone(self),
            uid,
            work,
        })
    }

    /// A place to answer one refusal, if fewer than [`MAX_REFUSING`] are
    /// being answered.
    pub fn refusing(self: &Arc<Self>) -> Option<Refusing> {
        let mut c = self.counts();
        if c.refusing >= MAX_REFUSING {
            return None;
        }
        c.refusing += 1;
        Some(Refusing {
            conns: Arc::clone(self),
        })
    }

    /// Open connections: all users but root, and per UID.
    pub fn snapshot(&self) -> (usize, Vec<(u32, usize)>) {
        let c = self.counts();
        let mut per: Vec<(u32, usize)> = c.per_uid.iter().map(|(u, n)| (*u, *n)).collect();
        per.sort_unstable();
        (c.others, per)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.conns.counts();
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.per_uid.remove(&self.uid);
                c.work.remove(&self.uid);
            }
        }
        if self.uid != 0 {
            c.others = c.others.saturating_sub(1);
        }
    }
}

impl Drop for Refusing {
    fn drop(&mut self) {
        let mut c = self.conns.counts();
        c.refusing = c.refusing.saturating_sub(1);
    }
}

/// A connection whose writes may not stall for longer than `timeout`
/// (the client not reading the answer), unless `streaming` is set.
#[derive(Debug)]
pub struct Stalling<S> {
    inner: S,
    timeout: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
    streaming: Arc<AtomicBool>,
}

impl<S> Stalling<S> {
    pub fn new(inner: S, timeout: Duration, streaming: Arc<AtomicBool>) -> Self {
        Stalling {
            inner,
            timeout,
            stalled: None,
            streaming,
        }
    }

    /// After the inner write said `Pending`: has it been pending too long?
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.streaming.load(Ordering::Relaxed) {
            self.stalled = None;
            return Poll::Pending;
        }
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client did not read the answer for {}s",
                    timeout.as_secs()
                ),
            )));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Stalling<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Stalling<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(others: usize, per_user: usize) -> Limits {
        Limits {
            max_connections: others,
            max_connections_per_user: per_user,
            ..Limits::default()
        }
    }

    #[test]
    fn per_uid_and_overall_caps_and_root_is_never_locked_out_by_others() {
        let c = Connections::new(limits(3, 2));
        let a1 = c.admit(1000).unwrap();
        let _a2 = c.admit(1000).unwrap();
        let e = c.admit(1000).unwrap_err();
        assert!(matches!(e, ApiError::TooMany(_)), "{e}");
        assert!(
            e.to_string().contains("max_connections_per_user = 2"),
            "{e}"
        );
        let _b1 = c.admit(1001).unwrap();
        let e = c.admit(1002).unwrap_err();
        assert!(matches!(e, ApiError::Busy(_)), "{e}");
        assert!(e.to_string().contains("max_connections = 3"), "{e}");
        // Root: over the overall cap, but within its own.
        let r1 = c.admit(0).unwrap();
        let _r2 = c.admit(0).unwrap();
        assert!(matches!(c.admit(0), Err(ApiError::TooMany(_))));
        assert_eq!(c.snapshot(), (3, vec![(0, 2), (1000, 2), (1001, 1)]));
        drop(a1);
        drop(r1);
        let _a3 = c.admit(1002).unwrap();
        let _r3 = c.admit(0).unwrap();
        assert_eq!(
            c.snapshot(),
            (3, vec![(0, 2), (1000, 1), (1001, 1), (1002, 1)])
        );
    }

    #[test]
    fn refusals_in_flight_are_bounded() {
        let c = Connections::new(limits(1, 1));
        let held: Vec<_> = (0..MAX_REFUSING).map(|_| c.refusing().unwrap()).collect();
        assert!(c.refusing().is_none());
        drop(held);
        assert!(c.refusing().is_some());
    }
}
