//! Container logs and the multiplexed stream format.
//!
//! For a container without a TTY, libpod's `logs` (and attach/exec) body is a
//! sequence of frames, each with an 8-byte header: byte 0 is the stream
//! (0 stdin, 1 stdout, 2 stderr), bytes 1–3 are zero, bytes 4–7 are the
//! payload length, big-endian (Docker's "stream format", which libpod reuses).
//! A TTY container's output may come raw; [`demux`] falls back to treating
//! what does not look like a frame header as stdout.

use bytes::{Bytes, BytesMut};

/// Which stream a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    /// Standard input (echoed; rare).
    Stdin,
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One frame of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    /// The stream.
    pub stream: LogStream,
    /// The bytes, as the container wrote them (a line per frame for logs).
    pub data: Bytes,
}

/// A container's logs, in the order Podman sent them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Logs {
    /// The frames.
    pub chunks: Vec<LogChunk>,
}

impl Logs {
    /// All bytes of one stream, concatenated.
    pub fn stream(&self, which: LogStream) -> Vec<u8> {
        let mut out = Vec::new();
        for c in self.chunks.iter().filter(|c| c.stream == which) {
            out.extend_from_slice(&c.data);
        }
        out
    }

    /// Standard output as text (invalid UTF-8 replaced).
    pub fn stdout_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stream(LogStream::Stdout)).into_owned()
    }

    /// Standard error as text (invalid UTF-8 replaced).
    pub fn stderr_lossy(&self) -> String {
        String::from_utf8_lossy(&self.stream(LogStream::Stderr)).into_owned()
    }
}

/// Options of a logs request.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Include standard output.
    pub stdout: bool,
    /// Include standard error.
    pub stderr: bool,
    /// Only the last N lines.
    pub tail: Option<u64>,
    /// Prefix each line with its RFC 3339 timestamp.
    pub timestamps: bool,
}

impl Default for LogOptions {
    fn default() -> Self {
        Self {
            stdout: true,
            stderr: true,
            tail: None,
            timestamps: false,
        }
    }
}

const HEADER_LEN: usize = 8;

/// Splits a multiplexed body into frames.
///
/// Lenient by design: if bytes at a frame boundary do not form a valid header
/// (stream byte above 2 or non-zero padding), everything from there on is
/// returned as one stdout chunk, which is what a TTY container's raw output
/// is. A frame cut short at the end of the body is returned with the bytes
/// that arrived.
pub fn demux(body: &Bytes) -> Vec<LogChunk> {
    let mut d = Demuxer::default();
    d.push(body);
    let mut out = Vec::new();
    while let Some(c) = d.next_chunk() {
        out.push(c);
    }
    out.extend(d.finish());
    out
}

/// Incremental [`demux`] for a body that arrives in pieces (followed logs).
#[derive(Debug, Default)]
pub(crate) struct Demuxer {
    buf: BytesMut,
    raw: bool,
}

impl Demuxer {
    /// A demuxer for a TTY's raw output: every byte is stdout.
    pub(crate) fn raw() -> Self {
        Self {
            buf: BytesMut::new(),
            raw: true,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame (or, in raw mode, whatever arrived).
    pub(crate) fn next_chunk(&mut self) -> Option<LogChunk> {
        if self.buf.is_empty() {
            return None;
        }
        if !self.raw && self.buf.len() >= HEADER_LEN {
            self.raw = !(self.buf[0] <= 2 && self.buf[1..4] == [0, 0, 0]);
        }
        if self.raw {
            return Some(LogChunk {
                stream: LogStream::Stdout,
                data: self.buf.split().freeze(),
            });
        }
        if self.buf.len() < HEADER_LEN {
            return None;
        }
        let len = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if self.buf.len() - HEADER_LEN < len {
            return None;
        }
        let stream = stream_of(self.buf[0]);
        let _header = self.buf.split_to(HEADER_LEN);
        Some(LogChunk {
            stream,
            data: self.buf.split_to(len).freeze(),
        })
    }

    /// What is left when the body ends: a truncated frame's payload, or
    /// bytes too short to be a header (kept as stdout).
    pub(crate) fn finish(mut self) -> Option<LogChunk> {
        if let Some(c) = self.next_chunk() {
            return Some(c);
        }
        if self.buf.is_empty() {
            return None;
        }
        if self.buf.len() < HEADER_LEN {
            return Some(LogChunk {
                stream: LogStream::Stdout,
                data: self.buf.split().freeze(),
            });
        }
        let stream = stream_of(self.buf[0]);
        let _header = self.buf.split_to(HEADER_LEN);
        Some(LogChunk {
            stream,
            data: self.buf.split().freeze(),
        })
    }
}

fn stream_of(b: u8) -> LogStream {
    match b {
        0 => LogStream::Stdin,
        1 => LogStream::Stdout,
        _ => LogStream::Stderr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stream: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![stream, 0, 0, 0];
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn splits_stdout_and_stderr_frames_in_order() {
        let mut body = frame(1, b"out\n");
        body.extend(frame(2, b"err\n"));
        body.extend(frame(1, b"more\n"));
        let chunks = demux(&Bytes::from(body));
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].stream, LogStream::Stdout);
        assert_eq!(chunks[1].stream, LogStream::Stderr);
        let logs = Logs { chunks };
        assert_eq!(logs.stdout_lossy(), "out\nmore\n");
        assert_eq!(logs.stderr_lossy(), "err\n");
    }

    #[test]
    fn empty_and_zero_length_frames() {
        assert!(demux(&Bytes::new()).is_empty());
        let chunks = demux(&Bytes::from(frame(1, b"")));
        assert_eq!(chunks.len(), 1);
        assert!(chunks[0].data.is_empty());
    }

    #[test]
    fn payload_may_contain_header_like_bytes() {
        let payload = [1u8, 0, 0, 0, 0, 0, 0, 9, b'x'];
        let chunks = demux(&Bytes::from(frame(2, &payload)));
        assert_eq!(chunks.len(), 1);
        assert_eq!(&chunks[0].data[..], &payload);
    }

    #[test]
    fn truncated_frame_keeps_what_arrived() {
        let mut body = frame(1, b"hello");
        body.truncate(body.len() - 2);
        let chunks = demux(&Bytes::from(body));
        assert_eq!(&chunks[0].data[..], b"hel");
    }

    #[test]
    fn incremental_demux_waits_for_whole_frames() {
        let mut body = frame(1, b"one\n");
        body.extend(frame(2, b"two\n"));
        let mut d = Demuxer::default();
        let mut got = Vec::new();
        // Feed one byte at a time: frames come out only when complete.
        for b in &body {
            d.push(std::slice::from_ref(b));
            while let Some(c) = d.next_chunk() {
                got.push(c);
            }
        }
        assert!(d.finish().is_none());
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].stream, &got[0].data[..]),
            (LogStream::Stdout, &b"one\n"[..])
        );
        assert_eq!(
            (got[1].stream, &got[1].data[..]),
            (LogStream::Stderr, &b"two\n"[..])
        );
    }

    #[test]
    fn raw_tty_output_falls_back_to_stdout() {
        let chunks = demux(&Bytes::from_static(b"plain tty text\r\n"));
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].stream, LogStream::Stdout);
        assert_eq!(&chunks[0].data[..], b"plain tty text\r\n");
    }
}
