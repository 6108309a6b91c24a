//! Each expensive NVML call at its own cadence, as DCGM watches each field at its own
//! frequency.
//!
//! On a real driver most of a tick's CPU is three calls (H100 / H200, driver 580;
//! BENCHMARKS.md): the total-energy counter (3.4–4.4 ms), per-process utilization
//! (2.3–2.6 ms) and PCIe throughput (0.6–0.9 ms of CPU and 20 ms of waiting per direction).
//! Everything else together is well under a millisecond per GPU. So the cheap values are
//! read every tick and these at slower cadences, without losing what they measure:
//!
//! - **Energy**: the counter is read on the last tick of each `energy` slot of wall time
//!   (slots start at whole multiples of it, and it divides a minute), so every minute's
//!   last tick carries the counter. The ticks between carry none (absent, not repeated):
//!   the collector spreads each delta over them by their power samples and the minute
//!   total stays the counter's delta, exactly.
//! - **Per-process utilization**: the driver keeps samples; they are fetched on the last
//!   tick of each `process_util` slot with the timestamp of the newest one taken, and the
//!   ticks since are completed from them and sent then (a tick with processes waits at
//!   most one slot).
//! - **PCIe throughput** and **volatile ECC counts**: every `pcie` / `ecc` of tick time;
//!   the ticks between carry the last reading (as DCGM reports a field's latest value).
//! - **Per-link NVLink counters**: every `nvlink_links`; they are cumulative, so each
//!   reading's rate covers the whole time since the previous one, carried between. The
//!   sums over all links are read every tick.
//! - **GPM** (Hopper and newer): a sample every `gpm` (5 s), its metrics over the window
//!   since the previous one, carried between; the window never leaves a gap.
//!
//! A cadence no longer than the sampling interval means every tick.

use gpufleet_core::UnixMs;
use std::time::Duration;

/// The cadences of the expensive calls (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// The total-energy counter: must divide a minute.
    pub energy: Duration,
    /// Per-process utilization, from the driver's buffered samples.
    pub process_util: Duration,
    /// PCIe throughput (TX and RX).
    pub pcie: Duration,
    /// Volatile ECC error counts.
    pub ecc: Duration,
    /// Per-link NVLink throughput counters (the sums over the links are read every tick).
    pub nvlink_links: Duration,
    /// GPM samples (Hopper and newer): each reading covers the time since the last.
    pub gpm: Duration,
}

impl Cadence {
    /// Every call every tick (what `snapshot` reads, and what tests compare against).
    pub const EVERY_TICK: Cadence = Cadence {
        energy: Duration::ZERO,
        process_util: Duration::ZERO,
        pcie: Duration::ZERO,
        ecc: Duration::ZERO,
        nvlink_links: Duration::ZERO,
        gpm: Duration::ZERO,
    };

    /// The defaults, chosen from the measured costs: with 8 GPUs at 1 s, energy costs
    /// 8 × 3.6 ms / 30 s ≈ 1.0 ms of CPU per second, per-process utilization
    /// 8 × 2.4 ms / 10 s ≈ 1.9 ms, PCIe 8 × 1.4 ms / 30 s ≈ 0.4 ms, beside ~4.6 ms for
    /// the cheap calls every tick; the per-link NVLink counters are 36 of a batch's 40
    /// entries on an 18-link GPU. 30 s is also dcgm-exporter's default collection
    /// interval for every field.
    pub const DEFAULT: Cadence = Cadence {
        energy: Duration::from_secs(30),
        process_util: Duration::from_secs(10),
        pcie: Duration::from_secs(30),
        ecc: Duration::from_secs(30),
        nvlink_links: Duration::from_secs(30),
        gpm: Duration::from_secs(5),
    };

    /// Why these cadences cannot be used, if they cannot: an energy cadence must put a
    /// reading on every minute's last tick.
    pub fn check(&self) -> Result<(), String> {
        let e = self.energy.as_millis();
        if e == 0 || (e <= 60_000 && 60_000_u128.is_multiple_of(e)) {
            Ok(())
        } else {
            Err(format!(
                "the energy counter's cadence ({}) must divide a minute (1s, 2s, 5s, 10s, 15s, 20s, 30s, 60s), so each minute ends on a counter reading",
                humantime_ms(e)
            ))
        }
    }
}

impl Default for Cadence {
    fn default() -> Self {
        Self::DEFAULT
    }
}

fn humantime_ms(ms: u128) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// When one call is next due, by tick time.
#[derive(Debug, Clone)]
pub(super) struct Due {
    every_ms: i64,
    interval_ms: i64,
    /// Aligned: read on the last tick of each slot of wall time; else on the first.
    aligned: bool,
    /// Slots start this long after the multiples of `every_ms`.
    offset_ms: i64,
    last_ms: Option<UnixMs>,
}

impl Due {
    /// Read on the last tick of each `every` slot (slots start at multiples of `every`),
    /// ticks being `interval` apart.
    pub(super) fn aligned(every: Duration, interval: Duration) -> Self {
        Self {
            every_ms: millis(every),
            interval_ms: millis(interval).max(1),
            aligned: true,
            offset_ms: 0,
            last_ms: None,
        }
    }

    /// As [`Due::aligned`], with the slots shifted by half a slot: its reads never fall
    /// on the tick of an aligned call whose cadence is a multiple of this one (per-process
    /// utilization beside the energy counter), so no tick makes both.
    pub(super) fn aligned_half_slot(every: Duration, interval: Duration) -> Self {
        Self {
            offset_ms: millis(every) / 2,
            ..Self::aligned(every, interval)
        }
    }

    /// Read on the first tick of each `every` slot (slots start at multiples of
    /// `every`): never on the tick an aligned call of the same cadence is made, so the
    /// slow calls of a tick are not all made on the same one.
    pub(super) fn slot_start(every: Duration, interval: Duration) -> Self {
        Self {
            aligned: false,
            ..Self::aligned(every, interval)
        }
    }

    /// Whether the tick at `now_ms` makes the call; if it does, it is noted as made.
    pub(super) fn take(&mut self, now_ms: UnixMs) -> bool {
        let due = self.is_due(now_ms);
        if due {
            self.last_ms = Some(now_ms);
        }
        due
    }

    /// Whether the tick at `now_ms` makes the call: every tick when the cadence is not
    /// longer than the interval; the first tick; a clock that went back; `every` since
    /// the last reading (a missed slot end); or the last tick of a slot (aligned), the
    /// first tick of a new slot (slot start).
    pub(super) fn is_due(&self, now_ms: UnixMs) -> bool {
        if self.every_ms <= self.interval_ms {
            return true;
        }
        let Some(last) = self.last_ms else {
            return true;
        };
        if now_ms < last || now_ms - last >= self.every_ms {
            return true;
        }
        let slot = |t: UnixMs| t.saturating_sub(self.offset_ms).div_euclid(self.every_ms);
        if self.aligned {
            // The next tick may come a little late: one within the slack of the slot's
            // end counts as the next slot's, so a late wake-up cannot skip the reading.
            let slack = (self.interval_ms / 20).min(50);
            slot(now_ms) != slot(now_ms.saturating_add(self.interval_ms + slack))
        } else {
            slot(now_ms) != slot(last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn reads(mut due: Due, ticks: impl IntoIterator<Item = UnixMs>) -> Vec<UnixMs> {
        ticks.into_iter().filter(|t| due.take(*t)).collect()
    }

    #[test]
    fn aligned_reads_fall_on_the_last_tick_of_each_slot_and_the_first() {
        // 1 s ticks, 3 ms past the second, a 10 s cadence: the first tick, then :09, :19 …
        let ticks = (0..35).map(|k| 120_000 + 3 + k * 1000);
        let got = reads(Due::aligned(10 * S, S), ticks);
        assert_eq!(got, [120_003, 129_003, 139_003, 149_003]);
        // Every minute's last tick (:59) is among them.
        let ticks = (0..130).map(|k| 60_000 + 7 + k * 1000);
        let got = reads(Due::aligned(10 * S, S), ticks);
        assert!(got.contains(&119_007) && got.contains(&179_007), "{got:?}");
    }

    #[test]
    fn half_slot_reads_never_fall_with_the_energy_reads() {
        let ticks: Vec<UnixMs> = (0..130).map(|k| 60_000 + 7 + k * 1000).collect();
        let energy = reads(Due::aligned(30 * S, S), ticks.clone());
        let util = reads(Due::aligned_half_slot(10 * S, S), ticks);
        // Slot ends at :04, :14, :24 … (slots from :05, :15, :25 …).
        assert_eq!(util[1..4], [64_007, 74_007, 84_007]);
        assert!(
            util[1..].iter().all(|t| !energy.contains(t)),
            "{util:?} {energy:?}"
        );
    }

    /// Ticks 1 ms before each second: the next may come 2 ms late, in the next slot;
    /// the tick before the slot's end reads, so the slot still ends on a reading.
    #[test]
    fn a_tick_just_before_the_slot_end_reads_whatever_the_next_ones_lateness() {
        let ticks: Vec<UnixMs> = (0..25).map(|k| 999 + k * 1000).collect();
        let got = reads(Due::aligned(10 * S, S), ticks);
        assert_eq!(got, [999, 8_999, 9_999, 18_999, 19_999]);
    }

    #[test]
    fn a_missed_slot_end_is_read_at_the_next_tick_a_cadence_later() {
        // The tick of :09 never came (an overrun): :10 is read (10 s since :00), and the
        // slot after ends at :19 as usual.
        let ticks = [0, 1000, 8000, 10_000, 11_000, 18_000, 19_000, 20_000];
        let got = reads(Due::aligned(10 * S, S), ticks);
        assert_eq!(got, [0, 10_000, 19_000]);
    }

    #[test]
    fn a_cadence_not_longer_than_the_interval_is_every_tick() {
        let ticks = [0, 100, 200, 300];
        assert_eq!(reads(Due::aligned(Duration::ZERO, S / 10), ticks), ticks);
        assert_eq!(reads(Due::slot_start(S / 10, S / 10), ticks), ticks);
    }

    #[test]
    fn slot_starts_are_read_and_never_with_the_slot_ends() {
        // 1 s ticks 3 ms past the second, a 10 s cadence: the first tick, then :10, :20 …
        let ticks = (0..35).map(|k| 120_000 + 3 + k * 1000);
        let starts = reads(Due::slot_start(10 * S, S), ticks.clone());
        assert_eq!(starts, [120_003, 130_003, 140_003, 150_003]);
        let ends = reads(Due::aligned(10 * S, S), ticks);
        assert!(
            starts[1..].iter().all(|t| !ends.contains(t)),
            "{starts:?} {ends:?}"
        );
        // Started mid-slot: the next read is at the next slot's start, not 10 s later.
        let got = reads(
            Due::slot_start(10 * S, S),
            (0..15).map(|k| 4_000 + k * 1000),
        );
        assert_eq!(got, [4_000, 10_000]);
        // A clock that went back reads.
        let got = reads(Due::slot_start(2 * S, S), [500, 1500, 2500, 1000]);
        assert_eq!(got, [500, 2500, 1000]);
    }

    #[test]
    fn an_energy_cadence_must_end_every_minute() {
        for ok in [0, 1, 5, 10, 15, 30, 60] {
            let c = Cadence {
                energy: Duration::from_secs(ok),
                ..Cadence::DEFAULT
            };
            assert!(c.check().is_ok(), "{ok}");
        }
        for bad in [7, 45, 120] {
            let c = Cadence {
                energy: Duration::from_secs(bad),
                ..Cadence::DEFAULT
            };
            assert!(
                c.check().is_err_and(|e| e.contains(&format!("{bad}s"))),
                "{bad}"
            );
        }
    }
}
