//! What decoding accepts: [`Limits`], the [`Invalid`] error, and the checks that enforce
//! them with a precise message.

use thiserror::Error;

/// Bounds on what one agent may send. Defaults are generous for real hardware and tight
/// enough that a hostile or broken agent cannot exhaust the collector.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_ticks_per_batch: usize,
    pub max_gpus_per_node: usize,
    pub max_processes_per_tick: usize,
    pub max_events_per_tick: usize,
    pub max_string_len: usize,
    pub max_labels: usize,
    pub max_nvlinks: usize,
    /// Samples further than this in the future (agent clock ahead) are refused.
    pub max_future_skew_ms: i64,
    /// Samples older than this are refused (the retention window).
    pub max_age_ms: i64,
    /// No single GPU draws more than this (absurd values are refused).
    pub max_power_mw: u32,
    pub max_temp_c: u32,
    pub max_clock_mhz: u32,
    pub max_mem_bytes: u64,
    pub max_link_bps: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_ticks_per_batch: 1_000,
            max_gpus_per_node: 64,
            max_processes_per_tick: 4_096,
            max_events_per_tick: 256,
            max_string_len: 512,
            max_labels: 64,
            max_nvlinks: 18,
            max_future_skew_ms: 5 * 60 * 1000,
            max_age_ms: 30 * 24 * 3600 * 1000,
            // 5 kW: ~3x the highest-power accelerators shipping today.
            max_power_mw: 5_000_000,
            max_temp_c: 200,
            max_clock_mhz: 20_000,
            max_mem_bytes: 64 << 40,
            max_link_bps: 10 << 40,
        }
    }
}

/// Why an agent message was refused. The message names the offending field.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum Invalid {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooLarge(String),
}

pub(super) fn invalid(msg: impl Into<String>) -> Invalid {
    Invalid::Invalid(msg.into())
}

pub(super) fn too_large(msg: impl Into<String>) -> Invalid {
    Invalid::TooLarge(msg.into())
}

pub(super) struct Check<'a> {
    pub(super) limits: &'a Limits,
    pub(super) now_ms: i64,
}

/// Names a field in an error message, formatted only when a check fails: validating a
/// valid batch must not allocate a string per field (this runs for every ingested sample).
pub(super) struct Lazy<F>(pub(super) F);

impl<F: Fn(&mut std::fmt::Formatter<'_>) -> std::fmt::Result> std::fmt::Display for Lazy<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (self.0)(f)
    }
}

/// Whether `s` holds a control character other than tab: `char::is_control` (U+0000 to
/// U+001F, U+007F to U+009F) read off the UTF-8 bytes, without decoding each character
/// (every string of every process sample passes here). U+0080 to U+009F are encoded as
/// 0xC2 followed by 0x80 to 0x9F, and 0xC2 is never a continuation byte.
pub(super) fn has_control(s: &str) -> bool {
    let b = s.as_bytes();
    // Nearly every string is printable ASCII: one pass without an early exit (which the
    // compiler vectorises) clears it, and only the rest takes the exact test.
    if !(b.iter()).fold(false, |other, &c| other | !(0x20..0x7f).contains(&c)) {
        return false;
    }
    b.iter().enumerate().any(|(i, &c)| {
        (c < 0x20 && c != b'\t')
            || c == 0x7f
            || (c == 0xc2 && b.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n)))
    })
}

impl Check<'_> {
    pub(super) fn string(
        &self,
        what: impl std::fmt::Display,
        s: String,
    ) -> Result<String, Invalid> {
        if s.len() > self.limits.max_string_len {
            return Err(too_large(format!(
                "{what} is {} bytes, limit {}",
                s.len(),
                self.limits.max_string_len
            )));
        }
        if has_control(&s) {
            return Err(invalid(format!("{what} contains control characters")));
        }
        Ok(s)
    }

    pub(super) fn opt_string(
        &self,
        what: impl std::fmt::Display,
        s: Option<String>,
    ) -> Result<Option<String>, Invalid> {
        s.map(|s| self.string(what, s)).transpose()
    }

    pub(super) fn time(&self, what: impl std::fmt::Display, t: i64) -> Result<i64, Invalid> {
        if t <= 0 {
            return Err(invalid(format!(
                "{what}: time_ms {t} is not a Unix time in ms"
            )));
        }
        if t > self.now_ms + self.limits.max_future_skew_ms {
            return Err(invalid(format!(
                "{what}: time_ms {t} is {} s in the future (limit {} s); check the node's clock",
                (t - self.now_ms) / 1000,
                self.limits.max_future_skew_ms / 1000
            )));
        }
        if t < self.now_ms - self.limits.max_age_ms {
            return Err(invalid(format!(
                "{what}: time_ms {t} is older than the retention window ({} days)",
                self.limits.max_age_ms / 86_400_000
            )));
        }
        Ok(t)
    }
}

pub(super) fn at_most<T: PartialOrd + Copy + std::fmt::Display>(
    what: impl std::fmt::Display,
    v: Option<T>,
    max: T,
) -> Result<Option<T>, Invalid> {
    match v {
        Some(x) if x > max => Err(invalid(format!(
            "{what} = {x} exceeds the plausible maximum {max}"
        ))),
        _ => Ok(v),
    }
}

pub(super) fn pct(what: impl std::fmt::Display, v: Option<u32>) -> Result<Option<u32>, Invalid> {
    at_most(what, v, 100)
}

pub(super) fn pct_f32(
    what: impl std::fmt::Display,
    v: Option<f32>,
) -> Result<Option<f32>, Invalid> {
    match v {
        Some(x) if !x.is_finite() => Err(invalid(format!("{what} is not a finite number"))),
        Some(x) if !(0.0..=100.0).contains(&x) => {
            Err(invalid(format!("{what} = {x} is outside 0..100")))
        }
        _ => Ok(v),
    }
}

pub(super) fn count<T>(
    what: impl std::fmt::Display,
    items: &[T],
    max: usize,
) -> Result<(), Invalid> {
    if items.len() > max {
        return Err(too_large(format!("{} {what}, limit {max}", items.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::has_control;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn control_characters_are_found_as_char_is_control_finds_them(s in "\\PC{0,8}[\\x00-\\x{a0}\\t]?\\PC{0,8}", t in any::<String>()) {
            for s in [&s, &t] {
                prop_assert_eq!(has_control(s), s.chars().any(|c| c.is_control() && c != '\t'), "{:?}", s);
            }
        }
    }

    #[test]
    fn edges_of_the_control_ranges() {
        for (s, control) in [
            ("\u{1f}", true),
            ("\t", false),
            (" ", false),
            ("\u{7f}", true),
            ("\u{80}", true),
            ("\u{9f}", true),
            ("\u{a0}", false),
            ("é", false),
            ("Ā", false),
        ] {
            assert_eq!(has_control(s), control, "{s:?}");
        }
    }
}
