//! Timestamps as users type them and as the API writes them: one parsing and one
//! formatting path, on the `time` crate, for every binary and route.
//!
//! Accepted times lie in [`MIN_TIME_MS`] ..= [`MAX_TIME_MS`] (1970-01-01T00:00:00Z to
//! 9999-12-31T23:59:59.999Z): everything outside is refused with [`TimeError::OutOfRange`]
//! before any arithmetic, so code downstream of [`parse_time`] can add and subtract spans of
//! days without overflowing. [`format_time`] is total: it never panics, whatever the `i64`.

use std::time::Duration;
use thiserror::Error;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{OffsetDateTime, PrimitiveDateTime};

/// The earliest accepted time: 1970-01-01T00:00:00.000Z (Unix ms).
pub const MIN_TIME_MS: i64 = 0;
/// The latest accepted time: 9999-12-31T23:59:59.999Z (Unix ms), the last instant RFC 3339
/// can write.
pub const MAX_TIME_MS: i64 = 253_402_300_799_999;
/// The earliest instant RFC 3339 can write: 0000-01-01T00:00:00.000Z (Unix ms). Formatting
/// clamps to it (a default such as "15 minutes before `to=0`" may fall before 1970).
const RFC3339_MIN_MS: i64 = -62_167_219_200_000;

/// Most characters of a refused input that an error message repeats.
const ECHO_CHARS: usize = 64;

/// Why a time was refused. The message says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TimeError {
    #[error(
        "invalid time {0:?}: use RFC 3339 (2026-11-20T10:00:00Z), Unix ms, now, now-15m or now+1h"
    )]
    Syntax(String),
    #[error(
        "time {0:?} is out of range: times must lie between 1970-01-01T00:00:00Z and \
         9999-12-31T23:59:59.999Z (Unix ms 0 to 253402300799999)"
    )]
    OutOfRange(String),
}

/// The start of `s`, for error messages (a hostile input can be long).
fn echo(s: &str) -> String {
    let mut out: String = s.chars().take(ECHO_CHARS).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Parses a timestamp: RFC 3339 (`2026-11-20T10:00:00Z`, also with a space for `T` or
/// without an offset, meaning UTC), Unix milliseconds (`1795000000000`), `now`, or
/// `now-15m` / `-15m` / `now+1h` relative to `now_ms`. Refuses anything outside
/// [`MIN_TIME_MS`] ..= [`MAX_TIME_MS`].
pub fn parse_time(s: &str, now_ms: i64) -> Result<i64, TimeError> {
    let s = s.trim();
    let out_of_range = || TimeError::OutOfRange(echo(s));
    let ms = parse_unchecked(s, now_ms).ok_or_else(|| TimeError::Syntax(echo(s)))?;
    let ms = ms.ok_or_else(out_of_range)?;
    if (MIN_TIME_MS..=MAX_TIME_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(out_of_range())
    }
}

/// `None`: not a time at all; `Some(None)`: a time that `i64` milliseconds cannot hold.
fn parse_unchecked(s: &str, now_ms: i64) -> Option<Option<i64>> {
    if s == "now" {
        return Some(Some(now_ms));
    }
    if let Some(rel) = s.strip_prefix("now-").or_else(|| s.strip_prefix('-'))
        && let Ok(d) = humantime::parse_duration(rel)
    {
        return Some(span_ms(d).and_then(|d| now_ms.checked_sub(d)));
    }
    if let Some(rel) = s.strip_prefix("now+")
        && let Ok(d) = humantime::parse_duration(rel)
    {
        return Some(span_ms(d).and_then(|d| now_ms.checked_add(d)));
    }
    if let Ok(ms) = s.parse::<i64>() {
        return Some(Some(ms));
    }
    // A number too long for i64 is a time out of range, not a typo.
    let digits = s.strip_prefix('-').unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Some(None);
    }
    rfc3339_ms(s).map(|ns| i64::try_from(ns.div_euclid(1_000_000)).ok())
}

fn span_ms(d: Duration) -> Option<i64> {
    i64::try_from(d.as_millis()).ok()
}

/// Unix nanoseconds of an RFC 3339 time. Also taken: `t` / `z` in lower case and a space
/// for `T` (RFC 3339 allows both), and no offset at all, meaning UTC.
fn rfc3339_ms(s: &str) -> Option<i128> {
    let mut s = s.to_ascii_uppercase();
    if s.get(10..11) == Some(" ") {
        s.replace_range(10..11, "T");
    }
    if let Ok(t) = OffsetDateTime::parse(&s, &Rfc3339) {
        return Some(t.unix_timestamp_nanos());
    }
    let no_offset = format_description!(
        version = 2,
        "[year]-[month]-[day]T[hour]:[minute]:[second][optional [.[subsecond]]]"
    );
    PrimitiveDateTime::parse(&s, &no_offset)
        .ok()
        .map(|t| t.assume_utc().unix_timestamp_nanos())
}

/// Formats Unix milliseconds as RFC 3339 UTC with millisecond precision
/// (`2026-11-20T10:00:00.000Z`). Total: a value RFC 3339 cannot write (before year 0 or
/// after year 9999) is clamped to the nearest one it can.
pub fn format_time(ms: i64) -> String {
    let ms = ms.clamp(RFC3339_MIN_MS, MAX_TIME_MS);
    let fmt = format_description!(
        version = 2,
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&fmt).ok())
        // Unreachable after the clamp; a fixed, valid RFC 3339 text rather than a panic.
        .unwrap_or_else(|| "1970-01-01T00:00:00.000Z".to_owned())
}

/// A minute in Unix ms: the unit of energy accounting and rollups.
pub const MINUTE_MS: i64 = 60_000;
/// An hour in Unix ms: the span of a packed value.
pub const HOUR_MS: i64 = 3_600_000;

/// The start of the minute holding `t` (`i64::MIN` for the minute before the first whole
/// one).
pub fn minute_of(t: i64) -> i64 {
    t.div_euclid(MINUTE_MS).saturating_mul(MINUTE_MS)
}

/// The start of the hour holding `t`.
pub fn hour_of(t: i64) -> i64 {
    t.div_euclid(HOUR_MS).saturating_mul(HOUR_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn accepted_forms() {
        assert_eq!(parse_time("now", NOW), Ok(NOW));
        assert_eq!(parse_time("now-15m", NOW), Ok(NOW - 900_000));
        assert_eq!(parse_time("-15m", NOW), Ok(NOW - 900_000));
        assert_eq!(parse_time("now+1h", NOW), Ok(NOW + 3_600_000));
        assert_eq!(parse_time("1795000000000", NOW), Ok(1_795_000_000_000));
        assert_eq!(parse_time(" 0 ", NOW), Ok(0));
        assert_eq!(
            parse_time("2026-11-20T10:00:00Z", NOW),
            Ok(1_795_168_800_000)
        );
        assert_eq!(
            parse_time("2026-11-20T11:00:00.5+01:00", NOW),
            Ok(1_795_168_800_500)
        );
        assert_eq!(
            parse_time("2026-11-20 10:00:00", NOW),
            Ok(1_795_168_800_000)
        );
        assert_eq!(
            parse_time("2026-11-20t10:00:00.123456789z", NOW),
            Ok(1_795_168_800_123)
        );
        assert_eq!(parse_time("1970-01-01T00:00:00Z", NOW), Ok(MIN_TIME_MS));
        assert_eq!(parse_time("9999-12-31T23:59:59.999Z", NOW), Ok(MAX_TIME_MS));
    }

    #[test]
    fn hostile_values_are_refused_not_wrapped() {
        for s in [
            "300000000000000",
            "9223372036854775807",
            "-9223372036854775808",
            "99999999999999999999999",
            "-1",
            "now-1000000000y",
            "now-100y",
            "now+10000y",
            "now-584942417y",
            "1969-12-31T23:59:59.999Z",
            "9999-12-31T23:59:59.999-01:00",
            "0000-01-01T00:00:00Z",
        ] {
            assert!(
                matches!(parse_time(s, NOW), Err(TimeError::OutOfRange(_))),
                "{s}: {:?}",
                parse_time(s, NOW)
            );
        }
        for s in [
            "",
            "yesterday",
            "now-",
            "now-15",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-11-20T25:00:00Z",
            "+1795000000000x",
            "10000-01-01T00:00:00Z",
        ] {
            assert!(
                matches!(parse_time(s, NOW), Err(TimeError::Syntax(_))),
                "{s}: {:?}",
                parse_time(s, NOW)
            );
        }
        // Relative to a clock at the edge: checked, not wrapped.
        assert!(parse_time("now-1ms", i64::MIN).is_err());
        assert!(parse_time("now+1ms", i64::MAX).is_err());
    }

    #[test]
    fn errors_echo_a_bounded_part_of_the_input() {
        let long = "x".repeat(10_000);
        let msg = parse_time(&long, NOW).expect_err("garbage").to_string();
        assert!(msg.len() < 300, "{}", msg.len());
    }

    #[test]
    fn format_is_rfc3339_with_millis_and_clamps() {
        assert_eq!(format_time(1_795_168_800_000), "2026-11-20T10:00:00.000Z");
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_time(MAX_TIME_MS), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_time(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_time(i64::MIN), "0000-01-01T00:00:00.000Z");
    }

    proptest! {
        #[test]
        fn format_never_panics_and_is_24_chars(ms in any::<i64>()) {
            let s = format_time(ms);
            prop_assert_eq!(s.len(), 24, "{}", s);
        }

        #[test]
        fn format_then_parse_is_identity(ms in MIN_TIME_MS..=MAX_TIME_MS) {
            prop_assert_eq!(parse_time(&format_time(ms), NOW), Ok(ms));
            prop_assert_eq!(parse_time(&ms.to_string(), NOW), Ok(ms));
        }

        #[test]
        fn parse_never_panics_and_stays_in_range(s in ".{0,40}", now in any::<i64>()) {
            if let Ok(ms) = parse_time(&s, now) {
                prop_assert!((MIN_TIME_MS..=MAX_TIME_MS).contains(&ms));
            }
        }

        #[test]
        fn relative_times_never_panic(n in any::<u64>(), unit in "(ms|s|m|h|d|w|y)", now in any::<i64>()) {
            for sign in ["now-", "-", "now+"] {
                if let Ok(ms) = parse_time(&format!("{sign}{n}{unit}"), now) {
                    prop_assert!((MIN_TIME_MS..=MAX_TIME_MS).contains(&ms));
                }
            }
        }

        #[test]
        fn integers_out_of_range_are_refused(ms in any::<i64>()) {
            let got = parse_time(&ms.to_string(), NOW);
            if (MIN_TIME_MS..=MAX_TIME_MS).contains(&ms) {
                prop_assert_eq!(got, Ok(ms));
            } else {
                prop_assert!(matches!(got, Err(TimeError::OutOfRange(_))));
            }
        }
    }
}
