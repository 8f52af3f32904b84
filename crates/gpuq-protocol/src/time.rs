//! Time as gpuq shows and reads it: unix seconds inside, UTC outside
//! (`2026-12-02 12:30:05Z`; dates as `YYYY-MM-DD`). The calendar is the
//! `time` crate's, not ours.

use time::macros::format_description;
use time::{Date, OffsetDateTime};

/// Seconds since the epoch, now (0 if the clock is before 1970).
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Format unix seconds as `YYYY-MM-DD HH:MM:SSZ` in UTC.
pub fn format_utc(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(format_description!(
                "[year]-[month]-[day] [hour]:[minute]:[second]Z"
            ))
            .ok()
        })
        .unwrap_or_else(|| format!("@{unix}"))
}

/// `YYYY-MM-DD` (a UTC day, 1970 or later) to unix seconds at its midnight.
pub fn parse_date(s: &str) -> Result<i64, String> {
    let bad = || format!("'{s}' is not a date: use YYYY-MM-DD (UTC), e.g. 2026-11-01");
    let t = s.trim();
    // `time` also reads a sign or more year digits; a date here is exactly
    // ten characters, digits and two dashes.
    let shape = t.len() == 10
        && t.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    if !shape {
        return Err(bad());
    }
    let d = Date::parse(t, format_description!("[year]-[month]-[day]")).map_err(|_| bad())?;
    let unix = d.midnight().assume_utc().unix_timestamp();
    if unix < 0 {
        return Err(bad());
    }
    Ok(unix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00Z");
        assert_eq!(format_utc(1_796_214_605), "2026-12-02 12:30:05Z");
    }

    #[test]
    fn dates_parse_to_their_midnight_and_nonsense_is_refused() {
        assert_eq!(parse_date("1970-01-01"), Ok(0));
        assert_eq!(parse_date("2000-02-29"), Ok(951_782_400));
        assert_eq!(parse_date("2026-12-02"), Ok(1_796_169_600));
        for bad in [
            "2026-02-30",
            "2025-02-29",
            "2026-13-01",
            "2026-1-01",
            "26-01-01",
            "2026-01-01x",
            "",
            "1969-12-31",
            "+202-01-01",
            "2026/01/01",
        ] {
            let e = parse_date(bad).unwrap_err();
            assert!(e.contains("YYYY-MM-DD"), "{bad}: {e}");
        }
        for unix in [0i64, 86_399, 951_782_400, 1_796_214_605] {
            let day = &format_utc(unix)[..10];
            assert_eq!(parse_date(day), Ok(unix - unix % 86_400), "{day}");
        }
    }
}
