//! Ticks held until their per-process utilization is fetched.
//!
//! The driver keeps per-process utilization samples, each with its own timestamp (µs of
//! wall time), and answers those newer than a timestamp the caller gives. Asking costs
//! 2.3–2.6 ms of CPU per GPU on an H100 / H200 whatever it finds, so the reader asks every
//! few seconds ([`super::Cadence::process_util`]) and completes each tick since from the
//! samples of its own window: a tick's window on a GPU runs from the moment the previous
//! tick listed that GPU's processes to the moment this one did. Within a window the newest
//! sample of each process is its value — what asking at every tick answers. NVML
//! documents one sample per process and call, its utilization since the timestamp given:
//! when a fetch answers so (no process twice), a window without a sample of its own takes
//! the first after it, so every tick since the last fetch takes that one (shares at the
//! fetch cadence, not per tick). A listed process without a sample is at 0 (idle). Ticks leave in order: one waiting for
//! samples holds the ticks after it.

use super::mapping::pct;
use gpufleet_core::Tick;
use nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample;
use std::collections::VecDeque;
use std::ops::Range;

/// The window before a GPU's first: its processes' samples of the last second.
const FIRST_WINDOW_US: u64 = 1_000_000;

/// A tick and what it still needs.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) tick: Tick,
    /// Per device (reader order): when its process lists were read (µs of wall time).
    pub(super) listed_us: Vec<u64>,
    /// Per device with processes waiting for utilization: its entries in `tick.processes`.
    pub(super) waiting: Vec<(usize, Range<usize>)>,
}

/// The ticks not yet sent, oldest first.
#[derive(Debug, Default)]
pub(super) struct Holding {
    held: VecDeque<Held>,
}

impl Holding {
    /// Whether no tick is held.
    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub(super) fn push(&mut self, held: Held) {
        self.held.push_back(held);
    }

    /// Whether any held tick waits for device `dev`'s samples.
    pub(super) fn waits_for(&self, dev: usize) -> bool {
        self.held
            .iter()
            .any(|h| h.waiting.iter().any(|(d, _)| *d == dev))
    }

    /// The timestamp to ask device `dev`'s samples after: the start of the oldest window
    /// waiting for them. `seen_us` is where the last completed window ended (0: never).
    pub(super) fn asked_since(&self, dev: usize, seen_us: u64) -> Option<u64> {
        let mut start = seen_us;
        for h in &self.held {
            let end = h.listed_us.get(dev).copied().unwrap_or(0);
            let from = window_start(start, end);
            if h.waiting.iter().any(|(d, _)| *d == dev) {
                return Some(from);
            }
            start = end;
        }
        None
    }

    /// Where the newest held tick's window on device `dev` ends (`seen_us` if none is
    /// held).
    pub(super) fn chain_end(&self, dev: usize, seen_us: u64) -> u64 {
        self.held
            .back()
            .and_then(|h| h.listed_us.get(dev).copied())
            .unwrap_or(seen_us)
    }

    /// Completes device `dev`'s processes in every held tick from `samples` fetched at
    /// `fetched_us` (`None`: the call failed, their utilization stays absent). The newest
    /// tick's window runs to the fetch (or its newest sample, if a clock stamped that
    /// later), as a fetch at every tick would take it. Returns
    /// where that window ends, the `seen_us` of the next call.
    pub(super) fn complete(
        &mut self,
        dev: usize,
        seen_us: u64,
        samples: Option<&[ProcessUtilizationSample]>,
        fetched_us: u64,
    ) -> u64 {
        let mut start = seen_us;
        let newest = self.held.len().saturating_sub(1);
        // A driver answering one sample per process and call gives each its utilization
        // since the timestamp asked (NVML's documented behaviour); one answering several
        // keeps a sample per period, and a window without one was idle.
        let one_per_pid = samples.is_none_or(|all| {
            let mut pids: Vec<u32> = all.iter().map(|s| s.pid).collect();
            pids.sort_unstable();
            pids.windows(2).all(|w| w[0] != w[1])
        });
        // Nothing the driver answered is after the fetch, whatever the clocks say.
        let fetched_us = samples
            .into_iter()
            .flatten()
            .map(|s| s.timestamp)
            .fold(fetched_us, u64::max);
        for (n, h) in self.held.iter_mut().enumerate() {
            let listed = h.listed_us.get(dev).copied().unwrap_or(start);
            let end = if n == newest {
                listed.max(fetched_us)
            } else {
                listed
            };
            let from = window_start(start, end);
            let Some(k) = h.waiting.iter().position(|(d, _)| *d == dev) else {
                start = end;
                continue;
            };
            let (_, range) = h.waiting.swap_remove(k);
            if let Some(samples) = samples {
                let window = samples
                    .iter()
                    .filter(|s| s.timestamp > from && s.timestamp <= end);
                for p in h.tick.processes.get_mut(range).into_iter().flatten() {
                    // The newest sample of the window; else the first after it, which
                    // covers it: NVML documents one sample per process and call, its
                    // utilization since `lastSeenTimeStamp`.
                    let mine = |s: &&ProcessUtilizationSample| s.pid == p.pid;
                    let newest = window
                        .clone()
                        .filter(mine)
                        .max_by_key(|s| s.timestamp)
                        .or_else(|| {
                            samples
                                .iter()
                                .filter(mine)
                                .filter(|s| one_per_pid && s.timestamp > end)
                                .min_by_key(|s| s.timestamp)
                        });
                    let value = |f: fn(&ProcessUtilizationSample) -> u32| {
                        Some(newest.map_or(0, |s| pct(f(s))))
                    };
                    p.sm_util_pct = value(|s| s.sm_util);
                    p.mem_util_pct = value(|s| s.mem_util);
                    p.enc_util_pct = value(|s| s.enc_util);
                    p.dec_util_pct = value(|s| s.dec_util);
                }
            }
            start = end;
        }
        start
    }

    /// The held ticks that wait for nothing, from the oldest up to the first that waits.
    pub(super) fn ready(&mut self) -> Vec<Tick> {
        let n = self
            .held
            .iter()
            .position(|h| !h.waiting.is_empty())
            .unwrap_or(self.held.len());
        self.held.drain(..n).map(|h| h.tick).collect()
    }
}

/// Where a window ending at `end` starts after one that ended at `seen` (0: none did).
pub(super) fn window_start(seen: u64, end: u64) -> u64 {
    if seen == 0 || seen > end {
        end.saturating_sub(FIRST_WINDOW_US)
    } else {
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::ProcessSample;

    fn sample(pid: u32, ts: u64, sm: u32) -> ProcessUtilizationSample {
        ProcessUtilizationSample {
            pid,
            timestamp: ts,
            sm_util: sm,
            mem_util: sm / 2,
            enc_util: 0,
            dec_util: 0,
        }
    }

    fn tick(ms: i64, pids: &[u32]) -> Tick {
        Tick {
            time_ms: ms,
            processes: pids
                .iter()
                .map(|&pid| ProcessSample {
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn held(ms: i64, pids: &[u32]) -> Held {
        Held {
            tick: tick(ms, pids),
            listed_us: vec![ms as u64 * 1000],
            waiting: if pids.is_empty() {
                vec![]
            } else {
                vec![(0, 0..pids.len())]
            },
        }
    }

    fn sm(t: &Tick) -> Vec<Option<u32>> {
        t.processes.iter().map(|p| p.sm_util_pct).collect()
    }

    /// Five 1 s ticks completed from one fetch equal five fetches, one per tick: each
    /// tick takes the newest sample of its own window, a window without a sample is 0.
    #[test]
    fn each_tick_takes_the_newest_sample_of_its_window() {
        let mut h = Holding::default();
        for k in 1..=5 {
            h.push(held(k * 1000, &[7, 8]));
        }
        assert!(h.ready().is_empty(), "all wait");
        // Driver samples every 500 ms for pid 7 (sm = the sample's number), pid 8 only in
        // (2, 3] s; fetched at 5.2 s.
        let mut samples: Vec<_> = (1..=10).map(|k| sample(7, k * 500_000, k as u32)).collect();
        samples.push(sample(8, 2_600_000, 50));
        // The first window starts a second before the first listing: (0, 1] s.
        assert_eq!(h.asked_since(0, 0), Some(0));
        let seen = h.complete(0, 0, Some(&samples), 5_200_000);
        assert_eq!(seen, 5_200_000, "the next call asks after the fetch");
        let ticks = h.ready();
        let got: Vec<_> = ticks.iter().map(sm).collect();
        assert_eq!(
            got,
            [
                [Some(2), Some(0)],
                [Some(4), Some(0)],
                [Some(6), Some(50)],
                [Some(8), Some(0)],
                [Some(10), Some(0)],
            ]
        );
        assert!(h.is_empty());
    }

    /// A driver answering one sample per process and call (its utilization since the
    /// timestamp given, as NVML documents): every held tick takes that sample.
    #[test]
    fn one_sample_per_process_covers_every_held_tick() {
        let mut h = Holding::default();
        for k in 1..=3 {
            h.push(held(k * 1000, &[7, 8]));
        }
        let samples = [sample(7, 3_100_000, 45)];
        h.complete(0, 0, Some(&samples), 3_100_000);
        let got: Vec<_> = h.ready().iter().map(sm).collect();
        assert_eq!(got, [[Some(45), Some(0)]; 3], "pid 8 was idle: no sample");
    }

    #[test]
    fn a_waiting_tick_holds_the_later_ones_and_a_failed_call_leaves_absent() {
        let mut h = Holding::default();
        h.push(held(1000, &[]));
        h.push(held(2000, &[7]));
        h.push(held(3000, &[]));
        let first = h.ready();
        assert_eq!(first.len(), 1, "the tick before the waiting one leaves");
        assert!(h.ready().is_empty(), "the one after waits behind it");
        assert!(h.waits_for(0));
        // The window of the 2 s tick starts where the 1 s tick listed.
        assert_eq!(h.asked_since(0, 1_000_000), Some(1_000_000));
        assert_eq!(h.complete(0, 1_000_000, None, 3_000_000), 3_000_000);
        let rest = h.ready();
        assert_eq!(rest.len(), 2);
        assert_eq!(sm(&rest[0]), [None], "a failed call: absent, not 0");
    }
}
