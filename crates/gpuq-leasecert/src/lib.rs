//! Per-lease DAOS certificates.
//!
//! Every DAOS lease gets its own certificate authority, made in memory when
//! the lease is prepared; its private key is dropped as soon as the lease's
//! certificates are signed and is never written anywhere, so nobody — root
//! included — can mint another certificate for that lease later. The
//! certificates are the ones DAOS's `transport_config` expects (DAOS
//! `utils/certs/gen_certificates.sh` and `ca.cnf`):
//!
//! | file | subject | used by |
//! | --- | --- | --- |
//! | `daosCA.crt` | `O=DAOS, CN=DAOS CA (lease L)` | everyone: the root that every peer is checked against |
//! | `server.crt` / `.key` | `CN=server`, SAN `server` | the servers' control port; also their client side when they talk to each other (join) |
//! | `admin.crt` / `.key` | `CN=admin` | `dmg` (the admin container, and the lease owner's job and client containers) |
//! | `agent.crt` / `.key` | `CN=agent` | `daos_agent` (and, in `client_cert_dir` on the servers, its certificate) |
//!
//! DAOS decides what a peer may do from its certificate's common name
//! (`src/control/security/grpc_authorization.go`: `admin`, `agent`,
//! `server`), so the names are fixed. Keys are RSA 2048 (PKCS#8; certificates
//! signed with RSA PKCS#1 v1.5 SHA-256): DAOS signs and verifies agent
//! credentials with RSA only (`security/signature.go`, `pem.go`
//! `LoadPrivateKey`: "unsupported private key type" for anything else), so
//! the ECDSA keys used before would have failed every client request on a
//! real DAOS. DAOS refuses a key file whose mode allows
//! more than 0400 (server, agent) or 0440 (admin) (`security/pem.go`):
//! [`install`] writes keys 0400.
//!
//! [`install`] writes a set of files into a new directory with the owner
//! and mode set on the open descriptor (`O_NOFOLLOW`, `O_EXCL`) before the
//! directory is handed to its owner.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("lease {lease}: generating the {what} certificate: {source}")]
    Generate {
        lease: String,
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: a file name must be one plain component")]
    BadName(String),
    #[error("generating a lease's RSA keys: {0}")]
    Keys(#[source] rcgen::Error),
}

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct CertKey {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for CertKey {
    // Never print a private key (logs, panics).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKey")
            .field("cert", &format!("{} bytes of PEM", self.cert.len()))
            .field("key", &"<private>")
            .finish()
    }
}

/// The certificates of one lease. The CA's key is not among them.
#[derive(Debug, Clone)]
pub struct LeaseCerts {
    /// `daosCA.crt`.
    pub ca_cert: String,
    pub server: CertKey,
    pub admin: CertKey,
    pub agent: CertKey,
}

/// The common names DAOS authorises by.
pub const CN_SERVER: &str = "server";
pub const CN_ADMIN: &str = "admin";
pub const CN_AGENT: &str = "agent";
/// The name a DAOS client expects in the servers' certificate
/// (`security/config.go`: `defaultServer`).
pub const SERVER_NAME: &str = "server";

/// Mode of a private key file (DAOS refuses more than 0400 for server and
/// agent keys, 0440 for the admin key).
pub const KEY_MODE: u32 = 0o400;
/// Mode of a certificate file (public; DAOS allows up to 0664).
pub const CERT_MODE: u32 = 0o444;

impl LeaseCerts {
    /// A new CA for `lease` and the server, admin and agent certificates
    /// signed by it. Valid from the start of this year to the end of the
    /// next (a lease lives hours; the CA key is gone afterwards anyway).
    /// The lease's CA and certificates on four keys made now.
    pub fn generate(lease: &str) -> Result<Self, CertError> {
        Self::issue(lease, LeaseKeys::generate()?)
    }

    /// The lease's CA and certificates on `keys` (made ahead, see
    /// [`KeySupply`]). `keys` is consumed: no key serves two leases.
    pub fn issue(lease: &str, keys: LeaseKeys) -> Result<Self, CertError> {
        let err = |what: &'static str| {
            let lease = lease.to_string();
            move |source| CertError::Generate {
                lease: lease.clone(),
                what,
                source,
            }
        };
        let year = this_year();
        let (from, to) = (
            rcgen::date_time_ymd(year, 1, 1),
            rcgen::date_time_ymd(year + 2, 1, 1),
        );
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err("CA"))?;
        ca.distinguished_name = dn(&format!("DAOS CA (lease {lease})"));
        // ca.cnf: CA:true, pathlen:1 — we sign leaves only: pathlen 0.
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::CrlSign,
        ];
        ca.not_before = from;
        ca.not_after = to;
        let mut keys = keys.der.into_iter();
        let mut next_key = |what: &'static str| {
            let der = keys
                .next()
                .ok_or(rcgen::Error::KeyGenerationUnavailable)
                .map_err(err(what))?;
            KeyPair::from_pkcs8_der_and_sign_algo(
                &rustls_pki_types::PrivatePkcs8KeyDer::from(der.as_slice()),
                &rcgen::PKCS_RSA_SHA256,
            )
            .map_err(err(what))
        };
        let ca_key = next_key("CA")?;
        let ca_cert = ca.self_signed(&ca_key).map_err(err("CA"))?;
        let issuer = Issuer::new(ca, ca_key);

        let mut leaf = |cn: &'static str,
                        sans: Vec<String>,
                        ekus: Vec<ExtendedKeyUsagePurpose>|
         -> Result<CertKey, CertError> {
            let mut p = CertificateParams::new(sans).map_err(err(cn))?;
            p.distinguished_name = dn(cn);
            p.is_ca = IsCa::ExplicitNoCa;
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.extended_key_usages = ekus;
            p.not_before = from;
            p.not_after = to;
            let key = next_key(cn)?;
            let cert = p.signed_by(&key, &issuer).map_err(err(cn))?;
            Ok(CertKey {
                cert: cert.pem(),
                key: key.serialize_pem(),
            })
        };
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        Ok(LeaseCerts {
            ca_cert: ca_cert.pem(),
            // As DAOS's own generator (utils/certs/gen_certificates.sh) gives
            // it: serverAuth and clientAuth, since servers also dial each
            // other (join, forwarding to the management service) with it.
            server: leaf(
                CN_SERVER,
                vec![SERVER_NAME.to_string()],
                vec![ServerAuth, ClientAuth],
            )?,
            admin: leaf(CN_ADMIN, Vec::new(), vec![ClientAuth])?,
            agent: leaf(CN_AGENT, Vec::new(), vec![ClientAuth])?,
        })
    }
}

/// Bits of every lease key (CA and leaves). 2048: a lease's keys live for
/// one job (hours) and are deleted by its wipe; 3072 took four times as
/// long to generate (four keys on four threads: 0.7 s at 2048, 7.7 s at 3072 one after another, 2 loaded cores).
pub const RSA_BITS: usize = 2048;

/// The four RSA keys of one lease (its CA, server, admin and agent), as
/// PKCS#8 DER, made before the lease exists. Only [`LeaseCerts::issue`]
/// takes them, by value: a set serves one lease. Dropped unused (a broker
/// that stops), every key is overwritten with zeros first.
pub struct LeaseKeys {
    der: [zeroize::Zeroizing<Vec<u8>>; 4],
}

impl std::fmt::Debug for LeaseKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseKeys(4 RSA keys, not shown)")
    }
}

impl LeaseKeys {
    /// Four fresh keys, generated on four threads (RSA generation is most
    /// of a lease's certificate work: about 1 CPU-second at 2048 bits).
    pub fn generate() -> Result<Self, CertError> {
        let mut made = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4).map(|_| s.spawn(rsa_key_der)).collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or(Err(rcgen::Error::KeyGenerationUnavailable))
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(CertError::Keys)?
        .into_iter();
        let mut next = || {
            made.next()
                .ok_or(CertError::Keys(rcgen::Error::KeyGenerationUnavailable))
        };
        Ok(LeaseKeys {
            der: [next()?, next()?, next()?, next()?],
        })
    }
}

/// One set of [`LeaseKeys`] made ahead, for the next lease, on a thread of
/// its own while the current job runs: the ~1 CPU-second of key generation
/// leaves the path between a submit and its servers' start. A set is
/// handed out once ([`KeySupply::take`] moves it out); none is ever
/// written to disk; an unused one is zeroed when the supply is dropped.
#[derive(Debug, Default)]
pub struct KeySupply {
    next: std::sync::Mutex<Option<LeaseKeys>>,
    making: std::sync::atomic::AtomicBool,
}

impl KeySupply {
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(KeySupply::default())
    }

    /// Starts making the next set unless one is ready or being made.
    /// Returns at once; a failure leaves the supply empty (the next
    /// [`take`](Self::take) makes its keys itself).
    pub fn refill(self: &std::sync::Arc<Self>) {
        use std::sync::atomic::Ordering;
        if self.ready() || self.making.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = std::sync::Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("lease-keys".into())
            .spawn(move || {
                if let Ok(k) = LeaseKeys::generate() {
                    *me.next.lock().unwrap_or_else(|p| p.into_inner()) = Some(k);
                }
                me.making.store(false, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.making.store(false, Ordering::SeqCst);
        }
    }

    /// Whether a set is ready.
    pub fn ready(&self) -> bool {
        self.next
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// The set made ahead (`true`), or, when none is ready, one made now
    /// (`false`).
    pub fn take(&self) -> Result<(LeaseKeys, bool), CertError> {
        let ready = self.next.lock().unwrap_or_else(|p| p.into_inner()).take();
        match ready {
            Some(k) => Ok((k, true)),
            None => LeaseKeys::generate().map(|k| (k, false)),
        }
    }
}

/// A fresh RSA key, PKCS#8 DER. Certificates sign with RSA PKCS#1 v1.5
/// SHA-256. Real DAOS uses RSA only for its credentials (the agent signs
/// with RSA-PSS SHA-512 and the servers verify with the agent
/// certificate's key): an ECDSA agent key makes every client request fail
/// there.
fn rsa_key_der() -> Result<zeroize::Zeroizing<Vec<u8>>, rcgen::Error> {
    use rsa::pkcs8::EncodePrivateKey;
    let key = rsa::RsaPrivateKey::new(&mut rand_core::OsRng, RSA_BITS)
        .map_err(|_| rcgen::Error::KeyGenerationUnavailable)?;
    let der = key
        .to_pkcs8_der()
        .map_err(|_| rcgen::Error::KeyGenerationUnavailable)?;
    Ok(zeroize::Zeroizing::new(der.as_bytes().to_vec()))
}

fn dn(cn: &str) -> DistinguishedName {
    let mut d = DistinguishedName::new();
    d.push(DnType::OrganizationName, "DAOS");
    d.push(DnType::CommonName, cn);
    d
}

/// This year (UTC).
fn this_year() -> i32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    year_of(secs)
}

/// The UTC year of a Unix time (civil-from-days, H. Hinnant's algorithm).
fn year_of(secs: u64) -> i32 {
    let days = (secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2)) as i32
}

/// One file for [`install`].
#[derive(Debug, Clone, Copy)]
pub struct File<'a> {
    pub name: &'a str,
    pub bytes: &'a [u8],
    pub mode: u32,
}

/// Make `dir` (which must not exist; its parent must be root's and not
/// writable by anyone else), write `files` into it, each created with
/// `O_EXCL | O_NOFOLLOW`, its owner and mode set on the descriptor and
/// synced, then give the directory `owner` and `dir_mode` — last, so its
/// owner never sees it half written.
pub fn install(
    dir: &Path,
    files: &[File<'_>],
    owner: (u32, u32),
    dir_mode: u32,
) -> Result<(), CertError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CertError::Io { path, source }
    };
    std::fs::create_dir(dir).map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    for f in files {
        if f.name.is_empty() || f.name.contains('/') || f.name == "." || f.name == ".." {
            return Err(CertError::BadName(f.name.to_string()));
        }
        let path = dir.join(f.name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io(&path))?;
        std::os::unix::fs::fchown(&file, Some(owner.0), Some(owner.1)).map_err(io(&path))?;
        file.set_permissions(std::fs::Permissions::from_mode(f.mode))
            .map_err(io(&path))?;
        file.write_all(f.bytes).map_err(io(&path))?;
        file.sync_all().map_err(io(&path))?;
    }
    let d = std::fs::File::open(dir).map_err(io(dir))?;
    d.sync_all().map_err(io(dir))?;
    std::os::unix::fs::fchown(&d, Some(owner.0), Some(owner.1)).map_err(io(dir))?;
    d.set_permissions(std::fs::Permissions::from_mode(dir_mode))
        .map_err(io(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_key_supply_hands_each_set_out_once_and_makes_the_next_ahead() {
        let supply = KeySupply::new();
        assert!(!supply.ready());
        // Nothing made ahead: made now.
        let (k1, ahead) = supply.take().unwrap();
        assert!(!ahead);
        supply.refill();
        supply.refill(); // one set at a time
        let t = std::time::Instant::now();
        while !supply.ready() {
            assert!(t.elapsed().as_secs() < 120, "no keys made ahead");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let (k2, ahead) = supply.take().unwrap();
        assert!(ahead);
        assert!(!supply.ready(), "a set is handed out once");
        // Two leases, two sets: no key in common.
        let a = LeaseCerts::issue("L1", k1).unwrap();
        let b = LeaseCerts::issue("L2", k2).unwrap();
        for (x, y) in [
            (&a.server.key, &b.server.key),
            (&a.admin.key, &b.admin.key),
            (&a.agent.key, &b.agent.key),
        ] {
            assert_ne!(x, y);
        }
        assert_ne!(a.server.key, a.admin.key);
        assert_ne!(a.admin.key, a.agent.key);
    }

    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// What real DAOS needs of the keys: RSA in a PKCS#8 "PRIVATE KEY"
    /// block (`security/pem.go` LoadPrivateKey), and an agent key that signs
    /// RSA-PSS SHA-512 verifiable with its certificate's public key
    /// (`security/signature.go` TokenSigner).
    #[test]
    fn every_key_is_rsa_in_pkcs8_and_the_agent_key_signs_as_daos_does() {
        use rsa::pkcs8::DecodePrivateKey;
        use rsa::traits::PublicKeyParts;
        let t = std::time::Instant::now();
        let c = LeaseCerts::generate("L-rsa").unwrap();
        eprintln!("one lease's four RSA keys in {:?}", t.elapsed());
        for (who, k) in [
            ("server", &c.server),
            ("admin", &c.admin),
            ("agent", &c.agent),
        ] {
            assert!(k.key.starts_with("-----BEGIN PRIVATE KEY-----"), "{who}");
            let key = rsa::RsaPrivateKey::from_pkcs8_pem(&k.key)
                .unwrap_or_else(|e| panic!("{who}: not an RSA PKCS#8 key: {e}"));
            assert_eq!(key.size() * 8, RSA_BITS, "{who}");
        }
        let agent = rsa::RsaPrivateKey::from_pkcs8_pem(&c.agent.key).unwrap();
        use sha2::Digest;
        let digest = sha2::Sha512::digest(b"a credential");
        let sig = agent
            .sign_with_rng(
                &mut rand_core::OsRng,
                rsa::Pss::new::<sha2::Sha512>(),
                &digest,
            )
            .unwrap();
        agent
            .to_public_key()
            .verify(rsa::Pss::new::<sha2::Sha512>(), &digest, &sig)
            .unwrap();
    }

    #[test]
    fn year_of_known_dates() {
        assert_eq!(year_of(0), 1970);
        assert_eq!(year_of(951_782_400), 2000); // 2000-02-29
        assert_eq!(year_of(1_798_761_599), 2026); // 2026-12-31T23:59:59Z
        assert_eq!(year_of(1_798_761_600), 2027);
    }

    #[test]
    fn two_leases_get_different_cas_and_keys_are_not_printed() {
        let a = LeaseCerts::generate("job1-1").unwrap();
        let b = LeaseCerts::generate("job2-2").unwrap();
        assert_ne!(a.ca_cert, b.ca_cert);
        assert_ne!(a.admin.key, b.admin.key);
        assert!(a.admin.key.contains("PRIVATE KEY"));
        assert!(!format!("{a:?}").contains("PRIVATE"));
    }

    #[test]
    fn install_sets_owner_and_modes_and_refuses_an_existing_dir() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("certs");
        let files = [
            File {
                name: "admin.key",
                bytes: b"k",
                mode: KEY_MODE,
            },
            File {
                name: "admin.crt",
                bytes: b"c",
                mode: CERT_MODE,
            },
        ];
        install(&d, &files, (61001, 61001), 0o500).unwrap();
        let m = std::fs::metadata(&d).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o7777), (61001, 0o500));
        let k = std::fs::metadata(d.join("admin.key")).unwrap();
        assert_eq!((k.uid(), k.gid(), k.mode() & 0o7777), (61001, 61001, 0o400));
        let c = std::fs::metadata(d.join("admin.crt")).unwrap();
        assert_eq!(c.mode() & 0o7777, 0o444);
        assert!(install(&d, &files, (0, 0), 0o700).is_err());
        let bad = [File {
            name: "../x",
            bytes: b"",
            mode: 0o400,
        }];
        assert!(matches!(
            install(&t.path().join("c2"), &bad, (0, 0), 0o700),
            Err(CertError::BadName(_))
        ));
    }
}
