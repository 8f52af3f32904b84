//! Listening TCP ports of the caller's network namespace, asked of the
//! kernel's `sock_diag` netlink interface for listeners only.
//!
//! `/proc/net/tcp` answers the same question, but the kernel walks its whole
//! established-connection hash table to produce it (~1.5 ms per file on the
//! test machine, twice per node and lease); a dump that asks for the LISTEN
//! state alone walks the listening table only. No `unsafe`: nix's socket
//! calls, and the messages are built and read as bytes.

use nix::sys::socket::{
    recv, sendto, socket, AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType,
};
use std::io;
use std::os::fd::AsRawFd;

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `TCP_LISTEN` (include/net/tcp_states.h).
const TCP_LISTEN: u8 = 10;
const NLMSG_HDRLEN: usize = 16;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, and a
/// zeroed `inet_diag_sockid` (48 bytes: any address, any port).
const REQ_LEN: usize = 8 + 48;

/// The TCP ports in LISTEN state (IPv4 and IPv6), sorted, each once.
pub fn tcp_listening_ports() -> io::Result<Vec<u16>> {
    let mut ports = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        match dump(family as u8, &mut ports) {
            Ok(()) => {}
            // A kernel without IPv6 has no inet6 diag handler.
            Err(e)
                if family == libc::AF_INET6
                    && matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EAFNOSUPPORT)) => {}
            Err(e) => return Err(e),
        }
    }
    ports.sort_unstable();
    ports.dedup();
    Ok(ports)
}

/// The dump request for `family`'s TCP listeners.
fn request(family: u8) -> Vec<u8> {
    let len = NLMSG_HDRLEN + REQ_LEN;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port ID: the kernel fills it
    m.extend_from_slice(&[family, libc::IPPROTO_TCP as u8, 0, 0]);
    m.extend_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    m.extend_from_slice(&[0u8; 48]);
    m
}

fn dump(family: u8, ports: &mut Vec<u16>) -> io::Result<()> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    sendto(
        fd.as_raw_fd(),
        &request(family),
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "sock_diag: the kernel closed the dump",
            ));
        }
        if parse(&buf[..n], ports)? {
            return Ok(());
        }
    }
}

/// Read one datagram of the dump into `ports`; `Ok(true)` at its end.
fn parse(mut buf: &[u8], ports: &mut Vec<u16>) -> io::Result<bool> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: {what}"));
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(buf[4..6].try_into().expect("2 bytes"));
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(bad(&format!("message length {len} of {} bytes", buf.len())));
        }
        let payload = &buf[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = payload
                    .get(0..4)
                    .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
                    .ok_or_else(|| bad("short error message"))?;
                return Err(io::Error::from_raw_os_error(-errno));
            }
            SOCK_DIAG_BY_FAMILY => {
                // struct inet_diag_msg: family, state, timer, retrans, then
                // the socket ID, whose source port (big-endian) comes first.
                let (state, port) = match payload {
                    [_, state, _, _, p0, p1, ..] => (*state, u16::from_be_bytes([*p0, *p1])),
                    _ => return Err(bad("short inet_diag_msg")),
                };
                if state == TCP_LISTEN {
                    ports.push(port);
                }
            }
            other => return Err(bad(&format!("unexpected message type {other}"))),
        }
        buf = &buf[((len + 3) & !3).min(buf.len())..];
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut m = ((NLMSG_HDRLEN + payload.len()) as u32)
            .to_ne_bytes()
            .to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(payload);
        while !m.len().is_multiple_of(4) {
            m.push(0);
        }
        m
    }

    #[test]
    fn reads_listeners_and_the_end_of_the_dump() {
        let mut d = msg(
            SOCK_DIAG_BY_FAMILY,
            &[2, TCP_LISTEN, 0, 0, 0x27, 0x11, 0, 0],
        );
        d.extend(msg(SOCK_DIAG_BY_FAMILY, &[2, 1, 0, 0, 0x1f, 0x90, 0, 0]));
        let mut ports = Vec::new();
        assert!(!parse(&d, &mut ports).unwrap());
        assert_eq!(ports, vec![10001]);
        assert!(parse(&msg(NLMSG_DONE, &[0; 4]), &mut ports).unwrap());
    }

    #[test]
    fn a_kernel_error_or_a_torn_message_is_an_error() {
        let e = parse(
            &msg(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes()),
            &mut Vec::new(),
        );
        assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EPERM));
        let mut torn = msg(SOCK_DIAG_BY_FAMILY, &[2, TCP_LISTEN, 0, 0, 0, 1, 0, 0]);
        torn.truncate(18);
        torn[0..4].copy_from_slice(&24u32.to_ne_bytes());
        assert!(parse(&torn, &mut Vec::new()).is_err());
    }

    #[test]
    fn sees_real_listeners_and_not_connections() {
        let l4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p4 = l4.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", p4)).unwrap();
        let (_server, _) = l4.accept().unwrap();
        let ephemeral = client.local_addr().unwrap().port();
        let l6 = std::net::TcpListener::bind("[::1]:0").ok();
        let ports = tcp_listening_ports().unwrap();
        assert!(ports.contains(&p4), "{p4} not in {ports:?}");
        assert!(
            !ports.contains(&ephemeral),
            "{ephemeral} (a connection) in {ports:?}"
        );
        if let Some(l6) = l6 {
            let p6 = l6.local_addr().unwrap().port();
            assert!(ports.contains(&p6), "{p6} not in {ports:?}");
        }
        drop(l4);
        // Gone once the last descriptor of it closes: a test of this
        // binary that forks (proc.rs) holds a copy until its child execs,
        // so the listener may outlive the drop by that moment.
        let t = std::time::Instant::now();
        while tcp_listening_ports().unwrap().contains(&p4) {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(5),
                "{p4} still listening 5 s after its only listener was dropped"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
