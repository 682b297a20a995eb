//! `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339, UTC) text of a Unix time: server start times in
//! `rlctl discover`, the time of a loadgen report.
//!
//! Owns: the civil-from-days conversion (proleptic Gregorian, UTC). Must not touch:
//! clocks (the time is a parameter; [`now_text`] is the one reading of the wall clock).

use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time in seconds.
pub fn utc_text(unix_s: u64) -> String {
    let days = unix_s / 86_400;
    let secs = unix_s % 86_400;
    // Civil-from-days (H. Hinnant), on days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// [`utc_text`] of the wall clock now (whole seconds).
pub fn now_text() -> String {
    let unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_text(unix_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_formatting() {
        assert_eq!(utc_text(1_735_689_600), "2025-01-01T00:00:00Z");
        assert_eq!(utc_text(1_767_225_600), "2026-01-01T00:00:00Z");
        assert_eq!(utc_text(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_text(86_399), "1970-01-01T23:59:59Z");
        assert!(now_text().starts_with("20") && now_text().ends_with('Z'));
    }
}
