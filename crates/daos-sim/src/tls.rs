//! Mutual TLS on the control port, as DAOS's `transport_config` asks for.
//!
//! With `allow_insecure: false` (DAOS's default) every connection to a
//! server's control port is TLS 1.2/1.3 (rustls, ring), and the server
//! requires a client certificate that chains to its `ca_cert`; the client
//! checks the server's certificate against the same CA under the name
//! `server` (DAOS `security/config.go`: `defaultServer`). What a peer may do
//! is decided by its certificate's common name, as DAOS does
//! (`security/grpc_authorization.go`): `admin` (dmg), `agent` (daos_agent),
//! `server` (other servers: join, stop, forwarding). A plain request sent
//! to a TLS port, or a certificate of another CA, is refused.
//!
//! Certificate files are loaded with DAOS's checks (`security/pem.go`): a
//! regular file; a certificate at most 0664, a key at most 0400 (0440 for
//! dmg's admin key). Defaults are DAOS's (`/etc/daos/certs/…`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::config::TransportConfig;
use crate::error::SimError;

/// Who is loading a transport config: decides the default files and how
/// open the key may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Admin,
    Agent,
}

/// The DAOS component a peer's certificate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Admin,
    Agent,
    Server,
    /// Any other common name: allowed nothing.
    Undefined,
}

impl Component {
    pub fn from_cn(cn: &str) -> Self {
        match cn {
            "admin" => Component::Admin,
            "agent" => Component::Agent,
            "server" => Component::Server,
            _ => Component::Undefined,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Component::Admin => "admin",
            Component::Agent => "agent",
            Component::Server => "server",
            Component::Undefined => "undefined",
        }
    }
}

/// How a process talks to the control plane.
#[derive(Clone)]
pub enum Transport {
    /// `allow_insecure: true`: plain TCP, no identity.
    Insecure,
    Tls {
        client: Arc<rustls::ClientConfig>,
        /// Only for a server.
        server: Option<Arc<rustls::ServerConfig>>,
    },
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.insecure() {
            "Transport::Insecure"
        } else {
            "Transport::Tls"
        })
    }
}

const CERT_DIR: &str = "/etc/daos/certs/";
const MAX_CERT_PERM: u32 = 0o664;
const MAX_USER_KEY_PERM: u32 = 0o400;
const MAX_GROUP_KEY_PERM: u32 = 0o440;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> SimError {
    SimError::Usage(format!("transport_config: {what}: {e}"))
}

/// DAOS's `LoadPEMData`: a regular file whose mode allows no more than `max`.
fn load_pem(path: &str, max: u32) -> Result<Vec<u8>, SimError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        SimError::Usage(format!(
            "transport_config: {path}: {e} (certificates are required unless allow_insecure is true)"
        ))
    })?;
    if !meta.is_file() {
        return Err(SimError::Usage(format!(
            "transport_config: {path} is not a regular file"
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & !max & 0o777 != 0 {
        return Err(SimError::Usage(format!(
            "transport_config: {path} has insecure permissions {mode:#o} (suggested: {max:#o})"
        )));
    }
    std::fs::read(path).map_err(|e| tls_err(path, e))
}

fn load_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, SimError> {
    let pem = load_pem(path, MAX_CERT_PERM)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err(path, e))?;
    if certs.is_empty() {
        return Err(tls_err(path, "no certificate in it"));
    }
    Ok(certs)
}

impl Transport {
    pub fn insecure(&self) -> bool {
        matches!(self, Transport::Insecure)
    }

    /// Load `tc` for `role`; with `allow_insecure` nothing is loaded.
    pub fn load(tc: &TransportConfig, role: Role) -> Result<Transport, SimError> {
        if tc.allow_insecure {
            return Ok(Transport::Insecure);
        }
        let (cert_default, key_default, key_max) = match role {
            Role::Server => ("server.crt", "server.key", MAX_USER_KEY_PERM),
            Role::Admin => ("admin.crt", "admin.key", MAX_GROUP_KEY_PERM),
            Role::Agent => ("agent.crt", "agent.key", MAX_USER_KEY_PERM),
        };
        let path = |p: &Option<String>, d: &str| p.clone().unwrap_or(format!("{CERT_DIR}{d}"));
        let ca_path = path(&tc.ca_cert, "daosCA.crt");
        let cert_path = path(&tc.cert, cert_default);
        let key_path = path(&tc.key, key_default);
        if role == Role::Server {
            // DAOS reads client_cert_dir at start (PreLoadCertData), and
            // each `<origin>.crt` in it with LoadCertificate when it checks
            // a credential (server/security_rpc.go): a regular file of at
            // most 0664 holding exactly one certificate ("Only one cert
            // allowed per file", security/pem.go). Real DAOS refuses each
            // credential; the simulator refuses the start.
            let dir = path(&tc.client_cert_dir, "clients");
            let entries = std::fs::read_dir(&dir)
                .map_err(|e| tls_err(format!("client_cert_dir {dir}"), e))?;
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "crt") {
                    let p = p.display().to_string();
                    if load_certs(&p)?.len() != 1 {
                        return Err(tls_err(&p, "Only one cert allowed per file"));
                    }
                }
            }
        }
        let mut roots = rustls::RootCertStore::empty();
        for c in load_certs(&ca_path)? {
            roots.add(c).map_err(|e| tls_err(&ca_path, e))?;
        }
        let roots = Arc::new(roots);
        let chain = load_certs(&cert_path)?;
        let key = PrivateKeyDer::from_pem_slice(&load_pem(&key_path, key_max)?)
            .map_err(|e| tls_err(&key_path, e))?;
        if role == Role::Server && !is_rsa(&key) {
            // DAOS pins its control plane to TLS 1.2 with the one suite
            // TLS_RSA_WITH_AES_256_GCM_SHA384 (security/
            // grpc_cert_configs.go): RSA key exchange, so no client can
            // complete a handshake with a server whose key is not RSA.
            return Err(tls_err(
                &key_path,
                "not an RSA key: DAOS's control plane speaks TLS 1.2 with TLS_RSA_WITH_AES_256_GCM_SHA384 only",
            ));
        }
        if role == Role::Agent && !is_rsa(&key) {
            // DAOS's agent signs every client credential with its key, and
            // its TokenSigner knows RSA only (security/signature.go:
            // UnsupportedKeyError "key contains an unsupported key type").
            // Real DAOS fails each request; the simulator fails at start.
            return Err(tls_err(
                &key_path,
                "key contains an unsupported key type (DAOS's agent signs credentials with RSA keys only)",
            ));
        }

        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("client", e))?
            .with_root_certificates(Arc::clone(&roots))
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(|e| tls_err(&cert_path, e))?;
        let server = if role == Role::Server {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(|e| tls_err(&ca_path, e))?;
            Some(Arc::new(
                rustls::ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .map_err(|e| tls_err("server", e))?
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(chain, key)
                    .map_err(|e| tls_err(&cert_path, e))?,
            ))
        } else {
            None
        };
        Ok(Transport::Tls {
            client: Arc::new(client),
            server,
        })
    }

    /// One request line out, one reply line back, over `s` (connected).
    pub fn exchange(&self, s: TcpStream, line: &[u8], peer: &str) -> Result<String, SimError> {
        let io = |what: &str, e: std::io::Error| SimError::io(format!("{what} {peer}"), e);
        match self {
            Transport::Insecure => {
                let mut w = &s;
                w.write_all(line).map_err(|e| io("send to", e))?;
                let mut reply = String::new();
                BufReader::new(&s)
                    .read_line(&mut reply)
                    .map_err(|e| io("read reply from", e))?;
                Ok(reply)
            }
            Transport::Tls { client, .. } => {
                let name = ServerName::try_from("server").expect("a valid DNS name");
                let conn = rustls::ClientConnection::new(Arc::clone(client), name)
                    .map_err(|e| tls_err("client", e))?;
                let mut tls = rustls::StreamOwned::new(conn, s);
                // A refused handshake or certificate surfaces here or on the
                // read (TLS 1.3: the server checks ours after our Finished).
                let refused = |e: std::io::Error| SimError::Remote {
                    msg: format!(
                        "TLS session with {peer} failed: {e} (the servers accept only \
                             certificates of this DAOS system's CA, and dmg only servers \
                             holding one; check transport_config)"
                    ),
                    status: crate::error::DER_MISC,
                };
                tls.write_all(line).map_err(refused)?;
                tls.flush().map_err(refused)?;
                let mut reply = String::new();
                BufReader::new(&mut tls)
                    .read_line(&mut reply)
                    .map_err(refused)?;
                Ok(reply)
            }
        }
    }
}

/// What the server learned about a connection before reading its request.
pub enum Accepted {
    /// A plain connection on an insecure port.
    Plain(TcpStream),
    /// A TLS session; the peer's component from its certificate.
    Tls(
        Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>,
        Component,
    ),
    /// A plain request on a TLS port: answer it plainly with a refusal.
    PlainOnTls(TcpStream),
    /// Nothing to answer (a failed handshake, a TLS hello on a plain port).
    Drop(String),
}

impl std::fmt::Debug for Accepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Accepted::Plain(_) => f.write_str("Plain"),
            Accepted::Tls(_, c) => write!(f, "Tls({c:?})"),
            Accepted::PlainOnTls(_) => f.write_str("PlainOnTls"),
            Accepted::Drop(w) => write!(f, "Drop({w:?})"),
        }
    }
}

/// Accept one connection per the server's transport.
pub fn accept(tp: &Transport, s: TcpStream) -> Accepted {
    let mut first = [0u8; 1];
    let peeked = s.peek(&mut first).unwrap_or(0);
    // 0x16: a TLS handshake record.
    let hello = peeked == 1 && first[0] == 0x16;
    match tp {
        Transport::Insecure if hello => Accepted::Drop(
            "a TLS client on an insecure control port (allow_insecure: true here)".into(),
        ),
        Transport::Insecure => Accepted::Plain(s),
        Transport::Tls { server: None, .. } => Accepted::Drop("no server credentials".into()),
        Transport::Tls { .. } if !hello => Accepted::PlainOnTls(s),
        Transport::Tls {
            server: Some(cfg), ..
        } => {
            let conn = match rustls::ServerConnection::new(Arc::clone(cfg)) {
                Ok(c) => c,
                Err(e) => return Accepted::Drop(e.to_string()),
            };
            let mut tls = rustls::StreamOwned::new(conn, s);
            while tls.conn.is_handshaking() {
                if let Err(e) = tls.conn.complete_io(&mut tls.sock) {
                    return Accepted::Drop(format!("TLS handshake refused: {e}"));
                }
            }
            let cn = tls
                .conn
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| subject_cn(c.as_ref()))
                .unwrap_or_default();
            Accepted::Tls(Box::new(tls), Component::from_cn(&cn))
        }
    }
}

/// Read one line from an accepted connection.
pub fn read_line(r: impl Read) -> Option<String> {
    let mut line = String::new();
    match BufReader::new(r).read_line(&mut line) {
        Ok(n) if n > 0 => Some(line),
        _ => None,
    }
}

/// Reads the certificate files of `tc` to check them (daos_server and
/// daos_agent do this at start, so a bad file fails the start).
/// An RSA private key: PKCS#1, or PKCS#8 whose algorithm is rsaEncryption
/// (OID 1.2.840.113549.1.1.1, DER `06 09 2a 86 48 86 f7 0d 01 01 01`, in the
/// AlgorithmIdentifier near the start).
fn is_rsa(key: &PrivateKeyDer<'_>) -> bool {
    const RSA_OID: &[u8] = &[
        0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
    ];
    match key {
        PrivateKeyDer::Pkcs1(_) => true,
        PrivateKeyDer::Pkcs8(k) => {
            let der = k.secret_pkcs8_der();
            der[..der.len().min(32)]
                .windows(RSA_OID.len())
                .any(|w| w == RSA_OID)
        }
        _ => false,
    }
}

pub fn check_files(tc: &TransportConfig, role: Role) -> Result<(), SimError> {
    Transport::load(tc, role).map(|_| ())
}

/// The subject's common name of a DER certificate: Certificate →
/// tbsCertificate → [0] version, serial, signature, issuer, validity,
/// subject (RFC 5280 §4.1); the subject's CN (2.5.4.3), UTF8String or
/// PrintableString.
pub fn subject_cn(der: &[u8]) -> Option<String> {
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    let (tag, _, r) = tlv(rest)?;
    if tag == 0xa0 {
        rest = r;
        rest = tlv(rest)?.2; // serial
    } else {
        rest = r; // that was the serial (v1)
    }
    rest = tlv(rest)?.2; // signature algorithm
    rest = tlv(rest)?.2; // issuer
    rest = tlv(rest)?.2; // validity
    let (_, subject, _) = tlv(rest)?;
    let mut rdns = subject;
    let mut cn = None;
    while !rdns.is_empty() {
        let (_, set, r) = tlv(rdns)?;
        rdns = r;
        let (_, atv, _) = tlv(set)?;
        let (_, oid, r) = tlv(atv)?;
        let (vtag, val, _) = tlv(r)?;
        if oid == [0x55, 0x04, 0x03] && (vtag == 0x0c || vtag == 0x13) {
            cn = Some(String::from_utf8_lossy(val).into_owned());
        }
    }
    cn
}

/// One DER TLV: (tag, contents, the bytes after it).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let l0 = *b.get(1)?;
    let (len, hdr) = if l0 < 0x80 {
        (l0 as usize, 2)
    } else {
        let n = (l0 & 0x7f) as usize;
        if n == 0 || n > 4 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | *b.get(2 + i)? as usize;
        }
        (len, 2 + n)
    };
    let end = hdr.checked_add(len)?;
    Some((tag, b.get(hdr..end)?, b.get(end..)?))
}

/// The key mode DAOS's checks allow for `role` (for messages and tests).
pub fn max_key_mode(role: Role) -> u32 {
    match role {
        Role::Admin => MAX_GROUP_KEY_PERM,
        Role::Server | Role::Agent => MAX_USER_KEY_PERM,
    }
}
