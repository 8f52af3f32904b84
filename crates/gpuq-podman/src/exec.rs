//! Interactive exec: a command in a running container with stdin attached,
//! over an upgraded connection.
//!
//! `POST /exec/{id}/start` with `Connection: Upgrade` / `Upgrade: tcp` makes
//! Podman answer `101` and hand the socket over to the session: what we write
//! is the command's stdin, raw; what we read is its output, in the 8-byte
//! frame format (or raw with a TTY). Shutting down our write side closes the
//! command's stdin (verified with Podman 4.3.1).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};

use crate::logs::{Demuxer, LogChunk};

/// Anything that reads and writes: the upgraded connection, or a
/// `tokio::io::duplex` end in a test double.
trait Duplex: AsyncRead + AsyncWrite + Send {}
impl<T: AsyncRead + AsyncWrite + Send> Duplex for T {}

/// The byte stream of an attached session.
pub struct AttachIo(Pin<Box<dyn Duplex>>);

impl fmt::Debug for AttachIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AttachIo")
    }
}

impl AsyncRead for AttachIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for AttachIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.as_mut().poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.as_mut().poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.as_mut().poll_shutdown(cx)
    }
}

/// An exec session with stdin attached. Split it to write stdin and read
/// output concurrently; get the exit code with
/// [`crate::Podman::exec_exit_code`] once the output has ended.
#[derive(Debug)]
pub struct ExecAttach {
    /// The exec session ID.
    pub session: String,
    tty: bool,
    io: AttachIo,
}

impl ExecAttach {
    /// Wraps a byte stream (for test doubles: one end of
    /// `tokio::io::duplex`). With `tty`, output is raw; otherwise framed.
    pub fn new(
        session: impl Into<String>,
        tty: bool,
        io: impl AsyncRead + AsyncWrite + Send + 'static,
    ) -> Self {
        Self {
            session: session.into(),
            tty,
            io: AttachIo(Box::pin(io)),
        }
    }

    /// Splits into the command's stdin and its output.
    pub fn split(self) -> (ExecStdin, ExecOutputReader) {
        let (rd, wr) = tokio::io::split(self.io);
        let demuxer = if self.tty {
            Demuxer::raw()
        } else {
            Demuxer::default()
        };
        (
            ExecStdin { wr },
            ExecOutputReader {
                rd,
                demuxer: Some(demuxer),
                buf: vec![0; 16 * 1024],
            },
        )
    }
}

/// The command's stdin.
#[derive(Debug)]
pub struct ExecStdin {
    wr: WriteHalf<AttachIo>,
}

impl ExecStdin {
    /// Writes bytes to the command's stdin.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.wr.write_all(data).await?;
        self.wr.flush().await
    }

    /// Closes the command's stdin (it reads end-of-file).
    pub async fn close(mut self) -> io::Result<()> {
        self.wr.shutdown().await
    }
}

/// The command's output, demultiplexed.
#[derive(Debug)]
pub struct ExecOutputReader {
    rd: ReadHalf<AttachIo>,
    demuxer: Option<Demuxer>,
    buf: Vec<u8>,
}

impl ExecOutputReader {
    /// The next chunk of output, or `None` once the command's output has
    /// ended.
    pub async fn next_chunk(&mut self) -> io::Result<Option<LogChunk>> {
        loop {
            let Some(demuxer) = self.demuxer.as_mut() else {
                return Ok(None);
            };
            if let Some(c) = demuxer.next_chunk() {
                return Ok(Some(c));
            }
            let n = self.rd.read(&mut self.buf).await?;
            if n == 0 {
                return Ok(self.demuxer.take().and_then(Demuxer::finish));
            }
            demuxer.push(&self.buf[..n]);
        }
    }
}
