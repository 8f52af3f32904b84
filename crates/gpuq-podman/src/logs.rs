//! Container logs and the multiplexed stream format.
//!
//! For a container without a TTY, libpod's `logs` (and attach/exec) body is a
//! sequence of frames, each with an 8-byte header: byte 0 is the stream
//! (0 stdin, 1 stdout, 2 stderr), bytes 1–3 are zero, bytes 4–7 are the
//! payload length, big-endian (Docker's "stream format", which libpod reuses).
//! A TTY container's output may come raw; [`demux`] falls back to treating
//! what does not look like a frame header as stdout.

use bytes::Bytes;

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
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < body.len() {
        let rest = &body[pos..];
        let header_ok = rest.len() >= HEADER_LEN && rest[0] <= 2 && rest[1..4] == [0, 0, 0];
        if !header_ok {
            out.push(LogChunk {
                stream: LogStream::Stdout,
                data: body.slice(pos..),
            });
            break;
        }
        let stream = match rest[0] {
            0 => LogStream::Stdin,
            1 => LogStream::Stdout,
            _ => LogStream::Stderr,
        };
        let len = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
        let start = pos + HEADER_LEN;
        let end = start.saturating_add(len).min(body.len());
        out.push(LogChunk {
            stream,
            data: body.slice(start..end),
        });
        pos = end;
    }
    out
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
    fn raw_tty_output_falls_back_to_stdout() {
        let chunks = demux(&Bytes::from_static(b"plain tty text\r\n"));
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].stream, LogStream::Stdout);
        assert_eq!(&chunks[0].data[..], b"plain tty text\r\n");
    }
}
