//! The job script's request for the site: one line
//!
//! ```text
//! #BB_LUA daos pool=daos capacity=1 [profile=NAME]
//! ```
//!
//! `pool=` and `capacity=1` are Slurm's own words: Slurm takes one unit of
//! the pool for the job from `slurm_bb_setup` until its teardown ends, and
//! the pool has one unit, so one DAOS job at a time holds the site (the
//! others wait with the reason `BurstBufferResources`). A request without
//! them would take nothing from the pool and is refused at submission.
//! The script is the user's: everything in it is checked, nothing of it
//! reaches a shell or a path.

use thiserror::Error;

/// The directive prefix (`Directive=` in burst_buffer.conf; the lua
/// plugin's default).
pub const PREFIX: &str = "#BB_LUA";

/// A job's request, as its script says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The profile (`[daos.profiles.NAME]`); `None`: the configured default.
    pub profile: Option<String>,
}

/// Why a script's request is refused: one line for the user (sbatch shows
/// it), with what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refused {
    #[error(
        "the script has no `{PREFIX} daos` line; write `{PREFIX} daos pool={pool} capacity=1`"
    )]
    Missing { pool: String },
    #[error("`{PREFIX} {first}`: this site serves only `{PREFIX} daos pool={pool} capacity=1 [profile=NAME]`")]
    Unknown { first: String, pool: String },
    #[error("more than one `{PREFIX}` line: a job gets one DAOS system; keep one `{PREFIX} daos ...` line")]
    Twice,
    #[error("`{PREFIX} daos`: `{word}` is not understood; the words are pool={pool}, capacity=1 and profile=NAME")]
    Word { word: String, pool: String },
    #[error("`{PREFIX} daos`: pool={given}: the site's pool is `{pool}`; write pool={pool}")]
    Pool { given: String, pool: String },
    #[error("`{PREFIX} daos`: pool= is missing: write pool={pool} capacity=1 (without them Slurm does not keep other DAOS jobs off the site)")]
    NoPool { pool: String },
    #[error("`{PREFIX} daos`: capacity={given}: a job takes the whole site; write capacity=1")]
    Capacity { given: String },
    #[error("`{PREFIX} daos`: capacity= is missing: write capacity=1")]
    NoCapacity,
    #[error(
        "`{PREFIX} daos`: profile={given} is not a valid profile name (letters, digits, - and _)"
    )]
    BadProfile { given: String },
}

/// The request in `script` (the whole job script), for a site whose pool
/// is `pool`. Only lines that start with [`PREFIX`] are read.
pub fn parse(script: &str, pool: &str) -> Result<Request, Refused> {
    let mut lines = script
        .lines()
        .filter_map(|l| l.strip_prefix(PREFIX))
        // `#BB_LUAX` is not ours: the prefix must end at a space.
        .filter(|rest| rest.is_empty() || rest.starts_with([' ', '\t']));
    let Some(line) = lines.next() else {
        return Err(Refused::Missing { pool: pool.into() });
    };
    if lines.next().is_some() {
        return Err(Refused::Twice);
    }
    let mut words = line.split_whitespace();
    match words.next() {
        Some("daos") => {}
        Some(w) => {
            return Err(Refused::Unknown {
                first: clip(w),
                pool: pool.into(),
            })
        }
        None => return Err(Refused::Missing { pool: pool.into() }),
    }
    let (mut got_pool, mut capacity, mut profile) = (None, None, None);
    for w in words {
        let word = || Refused::Word {
            word: clip(w),
            pool: pool.into(),
        };
        let (k, v) = w.split_once('=').ok_or_else(word)?;
        let slot = match k {
            "pool" => &mut got_pool,
            "capacity" => &mut capacity,
            "profile" => &mut profile,
            _ => return Err(word()),
        };
        if slot.replace(v.to_string()).is_some() {
            return Err(word());
        }
    }
    match got_pool {
        None => return Err(Refused::NoPool { pool: pool.into() }),
        Some(p) if p != pool => {
            return Err(Refused::Pool {
                given: clip(&p),
                pool: pool.into(),
            })
        }
        Some(_) => {}
    }
    match capacity.as_deref() {
        None => return Err(Refused::NoCapacity),
        Some("1") => {}
        Some(c) => return Err(Refused::Capacity { given: clip(c) }),
    }
    if let Some(p) = &profile {
        if !gpuq_protocol::node::valid_lease(p) {
            return Err(Refused::BadProfile { given: clip(p) });
        }
    }
    Ok(Request { profile })
}

/// A user's word, shortened for a one-line message.
fn clip(s: &str) -> String {
    let s: String = s.chars().filter(|c| !c.is_control()).take(40).collect();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "#!/bin/bash\n#SBATCH -t 10\n#BB_LUA daos pool=daos capacity=1\nsrun x\n";

    #[test]
    fn the_one_line_is_read_with_its_profile() {
        assert_eq!(parse(OK, "daos"), Ok(Request { profile: None }));
        let s = "#BB_LUA daos capacity=1 pool=daos profile=small\n";
        assert_eq!(
            parse(s, "daos"),
            Ok(Request {
                profile: Some("small".into())
            })
        );
    }

    #[test]
    fn every_other_request_is_refused_with_what_to_write() {
        let cases: &[(&str, &str)] = &[
            ("#!/bin/bash\necho\n", "no `#BB_LUA daos` line"),
            ("#BB_LUA lustre pool=daos capacity=1\n", "serves only"),
            ("#BB_LUA\n", "no `#BB_LUA daos` line"),
            (
                "#BB_LUA daos pool=daos capacity=1\n#BB_LUA daos pool=daos capacity=1\n",
                "more than one",
            ),
            ("#BB_LUA daos capacity=1\n", "pool= is missing"),
            ("#BB_LUA daos pool=fast capacity=1\n", "pool=fast"),
            ("#BB_LUA daos pool=daos\n", "capacity= is missing"),
            ("#BB_LUA daos pool=daos capacity=4\n", "capacity=4"),
            ("#BB_LUA daos pool=daos capacity=1 size=9\n", "`size=9`"),
            (
                "#BB_LUA daos pool=daos capacity=1 capacity=1\n",
                "`capacity=1`",
            ),
            ("#BB_LUA daos pool=daos capacity=1 x\n", "`x`"),
            (
                "#BB_LUA daos pool=daos capacity=1 profile=../x\n",
                "profile=../x",
            ),
        ];
        for (script, want) in cases {
            let e = parse(script, "daos").unwrap_err().to_string();
            assert!(e.contains(want), "{script:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn a_longer_prefix_is_not_ours() {
        assert!(matches!(
            parse("#BB_LUAX daos pool=daos capacity=1\n", "daos"),
            Err(Refused::Missing { .. })
        ));
    }
}
