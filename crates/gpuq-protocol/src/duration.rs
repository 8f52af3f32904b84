//! Time limits, in the forms researchers already type for Slurm and for us.
//!
//! Accepted (all mean a positive whole number of seconds):
//! - unit forms: `90m`, `4h`, `1h30m`, `2d`, `45s`, `1d2h3m4s` (units in that order, each at most once)
//! - Slurm's forms (`sbatch --time`): `MM` (plain minutes), `MM:SS`, `HH:MM:SS`,
//!   `D-HH`, `D-HH:MM`, `D-HH:MM:SS`
//!
//! Anything else is an error that lists these forms.

use thiserror::Error;

/// The largest limit we represent: one year. Anything longer is a typo.
pub const MAX_SECS: u64 = 366 * 24 * 3600;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    #[error("time limit '{0}' is not understood: use e.g. 90m, 4h, 1h30m, HH:MM:SS or D-HH:MM:SS")]
    Syntax(String),
    #[error("time limit '{0}' is zero: give a positive duration such as 30m")]
    Zero(String),
    #[error("time limit '{0}' is longer than a year: check the value (e.g. 4h, 2-00:00:00)")]
    TooLong(String),
}

/// Parse a time limit into seconds.
pub fn parse(input: &str) -> Result<u64, DurationError> {
    let s = input.trim();
    let syntax = || DurationError::Syntax(input.to_string());
    if s.is_empty() || !s.is_ascii() {
        return Err(syntax());
    }
    let secs = if s.bytes().any(|b| b.is_ascii_alphabetic()) {
        parse_units(s).ok_or_else(syntax)?
    } else {
        parse_slurm(s).ok_or_else(syntax)?
    };
    if secs == 0 {
        return Err(DurationError::Zero(input.to_string()));
    }
    if secs > MAX_SECS {
        return Err(DurationError::TooLong(input.to_string()));
    }
    Ok(secs)
}

/// Render seconds in the shortest Slurm-like form: `45s`, `1:30:00`, `2-04:00:00`.
pub fn format(secs: u64) -> String {
    let (d, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h}:{m:02}:{s:02}")
    }
}

fn number(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_units(s: &str) -> Option<u64> {
    const UNITS: [(u8, u64); 4] = [(b'd', 86_400), (b'h', 3600), (b'm', 60), (b's', 1)];
    let mut total: u64 = 0;
    let mut next_unit = 0; // index into UNITS: units must come in descending order, once each
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n = number(&rest[..digits])?;
        let unit = *rest.as_bytes().get(digits)?;
        let pos = UNITS.iter().position(|(u, _)| *u == unit)?;
        if pos < next_unit {
            return None;
        }
        next_unit = pos + 1;
        total = total.checked_add(n.checked_mul(UNITS[pos].1)?)?;
        rest = &rest[digits + 1..];
    }
    Some(total)
}

fn parse_slurm(s: &str) -> Option<u64> {
    let (days, clock) = match s.split_once('-') {
        Some((d, c)) => (Some(number(d)?), c),
        None => (None, s),
    };
    let parts: Vec<u64> = clock.split(':').map(number).collect::<Option<_>>()?;
    let hms = match (days.is_some(), parts.as_slice()) {
        // Slurm: "minutes", "minutes:seconds", "hours:minutes:seconds"
        (false, [m]) => m.checked_mul(60)?,
        (false, [m, sec]) if *sec < 60 => m.checked_mul(60)? + sec,
        (false, [h, m, sec]) if *m < 60 && *sec < 60 => h.checked_mul(3600)? + m * 60 + sec,
        // Slurm: "days-hours", "days-hours:minutes", "days-hours:minutes:seconds"
        (true, [h]) if *h < 24 => h * 3600,
        (true, [h, m]) if *h < 24 && *m < 60 => h * 3600 + m * 60,
        (true, [h, m, sec]) if *h < 24 && *m < 60 && *sec < 60 => h * 3600 + m * 60 + sec,
        _ => return None,
    };
    days.unwrap_or(0).checked_mul(86_400)?.checked_add(hms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_forms() {
        assert_eq!(parse("90m"), Ok(5400));
        assert_eq!(parse("4h"), Ok(14_400));
        assert_eq!(parse("1h30m"), Ok(5400));
        assert_eq!(parse("45s"), Ok(45));
        assert_eq!(parse("2d"), Ok(172_800));
        assert_eq!(parse("1d2h3m4s"), Ok(93_784));
        assert_eq!(parse(" 4h "), Ok(14_400));
    }

    #[test]
    fn slurm_forms() {
        assert_eq!(parse("30"), Ok(1800));
        assert_eq!(parse("10:30"), Ok(630));
        assert_eq!(parse("01:30:00"), Ok(5400));
        assert_eq!(parse("100:00:00"), Ok(360_000));
        assert_eq!(parse("2-00"), Ok(172_800));
        assert_eq!(parse("1-12:30"), Ok(131_400));
        assert_eq!(parse("1-02:03:04"), Ok(93_784));
    }

    #[test]
    fn rejects_everything_else_with_the_accepted_forms() {
        for bad in [
            "",
            "h",
            "4x",
            "4hh",
            "1m1h",
            "1h1h",
            "-5",
            "1:60",
            "1:00:60",
            "1:60:00",
            "1-24",
            "1-00:60",
            "1--1",
            "abc",
            "4 h",
            "1.5h",
            "٣h",
            ":",
            "1:",
            "1::2",
            "9999999999h",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(
                matches!(e, DurationError::Syntax(_) | DurationError::TooLong(_)),
                "{bad}: {e}"
            );
        }
        let msg = parse("soon").unwrap_err().to_string();
        assert!(msg.contains("'soon'") && msg.contains("1h30m") && msg.contains("D-HH:MM:SS"));
    }

    #[test]
    fn zero_and_too_long_are_named() {
        assert_eq!(parse("0m"), Err(DurationError::Zero("0m".into())));
        assert_eq!(
            parse("00:00:00"),
            Err(DurationError::Zero("00:00:00".into()))
        );
        assert_eq!(parse("400d"), Err(DurationError::TooLong("400d".into())));
    }

    #[test]
    fn format_round_trips() {
        for secs in [1, 59, 60, 5400, 86_399, 86_400, 93_784, MAX_SECS] {
            assert_eq!(parse(&format(secs)), Ok(secs), "{}", format(secs));
        }
        assert_eq!(format(5400), "1:30:00");
        assert_eq!(format(93_784), "1-02:03:04");
    }
}
