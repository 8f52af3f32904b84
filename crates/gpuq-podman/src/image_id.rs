//! Image references as gpuq accepts them: full `sha256:<64 hex>` IDs only.
//!
//! A tag (`daos:2.8`) or a short ID (`sha256:38b4c6`) can be made to point at
//! different content by anyone who can load or tag an image on the node, so a
//! pin written as either is a configuration error (architecture.md, "Trust
//! boundaries"). Parsing happens before any request is made.

use std::fmt;
use std::str::FromStr;

use crate::error::Error;

/// Length of the hex part of a full image ID.
const HEX_LEN: usize = 64;
const PREFIX: &str = "sha256:";

/// A full image ID, `sha256:` followed by 64 lower-case hex digits.
///
/// `Display` writes the `sha256:` form; [`ImageId::hex`] gives the 64 hex
/// digits, the form Podman reports in `Id` and `Image` fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageId {
    hex: String,
}

impl ImageId {
    /// Parses a pin. Only `sha256:<64 lower-case hex>` is accepted.
    pub fn parse(input: &str) -> Result<Self, Error> {
        let refuse = |reason: &'static str| Error::InvalidImageId {
            input: input.to_owned(),
            reason,
        };
        let Some(hex) = input.strip_prefix(PREFIX) else {
            if is_hex(input) && input.len() == HEX_LEN {
                return Err(refuse("the `sha256:` prefix is missing"));
            }
            if input.contains(':') || input.contains('/') || !is_hex(input) {
                return Err(refuse(
                    "this looks like an image name or tag; pins must be full image IDs",
                ));
            }
            return Err(refuse("this looks like a short image ID"));
        };
        if !is_hex(hex) {
            return Err(refuse(
                "the part after `sha256:` must be lower-case hexadecimal digits",
            ));
        }
        if hex.len() != HEX_LEN {
            return Err(refuse(
                "a short image ID is not enough; give all 64 hex digits",
            ));
        }
        Ok(Self {
            hex: hex.to_owned(),
        })
    }

    /// The 64 hex digits without the `sha256:` prefix.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Whether an ID as Podman reports it (with or without the `sha256:`
    /// prefix) is this one.
    pub fn matches(&self, reported: &str) -> bool {
        reported.strip_prefix(PREFIX).unwrap_or(reported) == self.hex
    }
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl fmt::Display for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", self.hex)
    }
}

impl FromStr for ImageId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

impl serde::Serialize for ImageId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ImageId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = "sha256:38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7";

    #[test]
    fn full_id_is_accepted_and_round_trips() {
        let id = ImageId::parse(FULL).unwrap();
        assert_eq!(id.to_string(), FULL);
        assert_eq!(id.hex(), &FULL[7..]);
        assert!(id.matches(&FULL[7..]));
        assert!(id.matches(FULL));
        assert!(!id.matches("38b4c682e412"));
    }

    #[test]
    fn tags_and_names_are_refused() {
        for bad in [
            "daos:2.8",
            "localhost/daos:latest",
            "docker.io/library/busybox",
            "busybox",
            "registry.example/daos@sha256:38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7",
        ] {
            let err = ImageId::parse(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidImageId { .. }), "{bad}: {err}");
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn short_ids_and_bad_forms_are_refused() {
        for bad in [
            "sha256:38b4c682e412",
            "38b4c682e412",
            "38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7",
            "sha256:38B4C682E41264E6E2287510812230ABF348497F96D258098E120687873AB5D7",
            "sha256:38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d70",
            "sha512:38b4c682e41264e6e2287510812230abf348497f96d258098e120687873ab5d7",
            "",
            "sha256:",
        ] {
            assert!(ImageId::parse(bad).is_err(), "{bad} was accepted");
        }
        let err = ImageId::parse("sha256:38b4c682e412").unwrap_err();
        assert!(err.to_string().contains("64 hex digits"), "{err}");
        let err = ImageId::parse(&FULL[7..]).unwrap_err();
        assert!(err.to_string().contains("prefix"), "{err}");
    }

    #[test]
    fn deserializes_through_the_same_check() {
        let ok: ImageId = serde_json::from_str(&format!("\"{FULL}\"")).unwrap();
        assert_eq!(ok.to_string(), FULL);
        assert!(serde_json::from_str::<ImageId>("\"daos:2.8\"").is_err());
    }
}
