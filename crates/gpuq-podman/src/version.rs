//! The libpod API version read from `_ping`, and the oldest one we accept.
//!
//! Podman sends `Libpod-API-Version: 4.3.1` (the Podman version) on every
//! reply. 4.3 is the oldest we test against (Debian 12 ships 4.3.1); EL8 sites
//! run 4.9 and EL9 sites 5.x. Podman ≥ 5.2 answers requests whose path version
//! is below 5.0.0 with the v4 JSON shapes, which is why we always ask for
//! `/v4.0.0/libpod/...`.

use std::fmt;
use std::path::Path;

use crate::error::Error;

/// A `major.minor.patch` version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

/// The oldest Podman whose libpod API gpuq accepts.
pub const MIN_API_VERSION: ApiVersion = ApiVersion {
    major: 4,
    minor: 3,
    patch: 0,
};

impl ApiVersion {
    /// Parses `4.3.1`, `5.2.0-dev`, `4.9.4-rhel`, `5.0`: numeric parts before
    /// any `-` or `+` suffix; a missing patch is 0.
    pub fn parse(s: &str) -> Option<Self> {
        let core = s.trim().split(['-', '+', '~']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Checks the `Libpod-API-Version` header of a `_ping` reply: absent means
/// not a libpod socket; unparsable or older than [`MIN_API_VERSION`] is
/// refused.
pub fn check_supported(header: Option<&str>, socket: &Path) -> Result<ApiVersion, Error> {
    let Some(raw) = header else {
        return Err(Error::NotLibpod {
            socket: socket.to_owned(),
        });
    };
    match ApiVersion::parse(raw) {
        Some(v) if v >= MIN_API_VERSION => Ok(v),
        _ => Err(Error::UnsupportedVersion {
            socket: socket.to_owned(),
            found: raw.to_owned(),
            minimum: MIN_API_VERSION,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> ApiVersion {
        ApiVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn parses_release_and_distro_forms() {
        assert_eq!(ApiVersion::parse("4.3.1"), Some(v(4, 3, 1)));
        assert_eq!(ApiVersion::parse("5.2.0-dev"), Some(v(5, 2, 0)));
        assert_eq!(ApiVersion::parse("4.9.4-rhel"), Some(v(4, 9, 4)));
        assert_eq!(ApiVersion::parse("5.0"), Some(v(5, 0, 0)));
        assert_eq!(ApiVersion::parse(" 4.4.0 "), Some(v(4, 4, 0)));
        assert_eq!(ApiVersion::parse("1.41"), Some(v(1, 41, 0)));
        for bad in ["", "4", "four.3.1", "4.3.1.2", "v4.3.1"] {
            assert_eq!(ApiVersion::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn supported_versions_pass() {
        let sock = Path::new("/run/podman/podman.sock");
        for ok in ["4.3.0", "4.3.1", "4.9.4-rhel", "5.0.0", "5.4.2", "6.0.0"] {
            assert!(check_supported(Some(ok), sock).is_ok(), "{ok}");
        }
    }

    #[test]
    fn old_api_version_is_refused_with_a_clear_message() {
        let sock = Path::new("/run/podman/podman.sock");
        for old in ["4.2.9", "3.4.4", "2.0.0", "1.41"] {
            let err = check_supported(Some(old), sock).unwrap_err();
            assert!(matches!(err, Error::UnsupportedVersion { .. }), "{old}");
            let msg = err.to_string();
            assert!(msg.contains(old), "{msg}");
            assert!(msg.contains("4.3.0 or newer"), "{msg}");
            assert!(msg.contains("/run/podman/podman.sock"), "{msg}");
        }
        let err = check_supported(Some("garbage"), sock).unwrap_err();
        assert!(matches!(err, Error::UnsupportedVersion { .. }));
    }

    #[test]
    fn missing_header_means_not_libpod() {
        let err = check_supported(None, Path::new("/x.sock")).unwrap_err();
        assert!(matches!(err, Error::NotLibpod { .. }), "{err}");
    }
}
