//! `gpuq daos-exec`: the request, and the framing on the upgraded
//! connection.
//!
//! The CLI sends `POST /v1/exec` with `Connection: Upgrade` and
//! `Upgrade: gpuq-exec` and an [`ExecRequest`]. Refusals are ordinary JSON
//! errors; on success the broker answers `101 Switching Protocols` and both
//! sides speak frames: an 8-byte header — kind (1 byte), 3 zero bytes, the
//! payload length (u32, big-endian), as Docker's attach stream — then the
//! payload. The socket closing (without a final frame) is simply
//! the CLI going away (killed, Ctrl-C): the broker then removes the
//! container.

use serde::{Deserialize, Serialize};

/// The `Upgrade:` protocol name.
pub const UPGRADE: &str = "gpuq-exec";
/// Largest payload a frame may carry.
pub const MAX_FRAME: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// `--workdir`: the working directory inside the container.
    pub workdir: Option<String>,
    /// `--env K=V` given on the command line (nothing else of the caller's
    /// environment is passed).
    pub env: Vec<(String, String)>,
    /// Whether the caller has a terminal (then the command gets a TTY).
    pub tty: bool,
    /// The terminal's size, when `tty`.
    pub rows: Option<u16>,
    pub cols: Option<u16>,
}

/// Frame kinds from the CLI.
pub mod to_broker {
    /// Bytes for the command's stdin.
    pub const STDIN: u8 = 0;
    /// The caller's stdin ended.
    pub const STDIN_EOF: u8 = 1;
    /// The terminal was resized: rows (u16 BE), cols (u16 BE).
    pub const RESIZE: u8 = 2;
}

/// Frame kinds from the broker.
pub mod to_cli {
    pub const STDOUT: u8 = 1;
    pub const STDERR: u8 = 2;
    /// The command ended: its exit code (i32 BE). Last frame.
    pub const EXIT: u8 = 3;
    /// The session failed: a one-line message (UTF-8). Last frame.
    pub const ERROR: u8 = 4;
}

/// The 8-byte header of a frame.
pub fn header(kind: u8, len: usize) -> [u8; 8] {
    let l = (len as u32).to_be_bytes();
    [kind, 0, 0, 0, l[0], l[1], l[2], l[3]]
}

/// Kind and payload length from a header; `None` if it is not one.
pub fn parse_header(h: &[u8; 8]) -> Option<(u8, usize)> {
    if h[1..4] != [0, 0, 0] {
        return None;
    }
    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
    (len <= MAX_FRAME).then_some((h[0], len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_oversize_is_refused() {
        let h = header(to_cli::STDERR, 70);
        assert_eq!(parse_header(&h), Some((to_cli::STDERR, 70)));
        assert_eq!(parse_header(&header(0, MAX_FRAME + 1)), None);
        assert_eq!(parse_header(&[1, 1, 0, 0, 0, 0, 0, 0]), None);
    }
}
