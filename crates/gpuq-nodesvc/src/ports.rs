//! Is a TCP port listening in this network namespace? (`/proc/net/tcp{,6}`
//! show the sockets of the reader's network namespace.)

/// The ports in LISTEN state (IPv4 and IPv6) in our network namespace.
pub fn listening() -> std::io::Result<Vec<u16>> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match std::fs::read_to_string(f) {
            Ok(text) => out.extend(parse(&text)),
            // A kernel without IPv6 has no tcp6.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && f.ends_with('6') => {}
            Err(e) => return Err(e),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Parse one `/proc/net/tcp` table: `sl local_address rem_address st ...`,
/// addresses as `HEXADDR:HEXPORT`, state `0A` = LISTEN.
pub fn parse(text: &str) -> Vec<u16> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 || f[3] != "0A" {
                return None;
            }
            let port = f[1].rsplit(':').next()?;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_listeners_only() {
        let t = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                 0: 00000000:2711 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
                 1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1\n";
        assert_eq!(super::parse(t), vec![10001]);
    }

    #[test]
    fn sees_a_real_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(super::listening().unwrap().contains(&port));
    }
}
