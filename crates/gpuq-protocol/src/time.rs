//! Timestamps as people read them: `2026-12-02 12:30:05Z` (UTC, always).

/// Format unix seconds as `YYYY-MM-DD HH:MM:SSZ` in UTC.
pub fn format_utc(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// `YYYY-MM-DD` (a UTC day) to unix seconds at its midnight.
pub fn parse_date(s: &str) -> Result<i64, String> {
    let bad = || format!("'{s}' is not a date: use YYYY-MM-DD (UTC), e.g. 2026-11-01");
    let mut it = s.trim().splitn(3, '-');
    let (Some(y), Some(m), Some(d)) = (it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return Err(bad());
    }
    let num = |t: &str| {
        if t.bytes().all(|b| b.is_ascii_digit()) {
            t.parse::<i64>().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let (y, m, d) = (num(y)?, num(m)?, num(d)?);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || d < 1 {
        return Err(bad());
    }
    let days = days_from_civil(y, m as u32, d as u32);
    // 2026-02-30 would silently be March 2nd: the round trip must agree.
    if civil_from_days(days) != (y, m as u32, d as u32) {
        return Err(bad());
    }
    Ok(days * 86_400)
}

/// A proleptic Gregorian date to days since 1970-01-01 (Howard Hinnant's
/// `days_from_civil`, public domain algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`, public domain algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
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
        ] {
            let e = parse_date(bad).unwrap_err();
            assert!(e.contains("YYYY-MM-DD"), "{bad}: {e}");
        }
        for day in [-1000i64, 0, 59, 60, 10_957, 20_789, 2_932_896] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }
}
