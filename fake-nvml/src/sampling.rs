//! Per-process utilization samples (`nvmlDeviceGetProcessUtilization`): which a call
//! answers, as pure functions of the GPU's scenario, the clock and the caller's
//! `lastSeenTimeStamp`.
//!
//! With `Gpu::process_sample_ms` > 0 the fake models a real driver's ring buffer: each
//! process with a utilization is sampled at every wall-clock multiple of the period, the
//! samples are kept `Gpu::process_buffer_ms`, and a call answers all of them newer than
//! `lastSeenTimeStamp`. With 0 (the old behaviour) a call answers one fresh sample per
//! process, stamped with the call's own timestamp.

use crate::scenario::{Gpu, Process};
use nvml_wrapper_sys::bindings::nvmlProcessUtilizationSample_t;

/// The most entries one call answers (the oldest beyond it are dropped), so that a long
/// buffer with a short period cannot make a call huge.
pub const MAX_ENTRIES: usize = 4096;

/// The timestamps (µs) of the driver's buffered samples that a call at `now_us` answers:
/// the multiples of `period_ms` ms that are after `last_seen_us`, not after `now_us`, and
/// after `now_us - buffer_ms` ms; oldest first; at most [`MAX_ENTRIES`] of them (the
/// newest). None for a `period_ms` of 0 (the caller's old behaviour).
pub fn buffered_samples(
    now_us: u64,
    last_seen_us: u64,
    period_ms: u64,
    buffer_ms: u64,
) -> impl Iterator<Item = u64> + Clone {
    let period_us = period_ms.saturating_mul(1_000);
    // The exclusive lower bound. When the buffer reaches back before the epoch its bound
    // is below 0, so `last_seen_us` (>= 0) is the bound: saturating to 0 is exact.
    let after = last_seen_us.max(now_us.saturating_sub(buffer_ms.saturating_mul(1_000)));
    // Sample k is at k * period_us: from the first k past `after` to the last one at or
    // before `now_us` (an empty range when there is none, or no period).
    let (first, last) = match (after.checked_div(period_us), now_us.checked_div(period_us)) {
        (Some(a), Some(n)) => {
            let cap = n.saturating_sub(MAX_ENTRIES as u64 - 1);
            (a.saturating_add(1).max(cap), n)
        }
        _ => (1, 0),
    };
    // k <= now_us / period_us, so k * period_us <= now_us: no overflow.
    (first..=last).map(move |k| k * period_us)
}

/// Whether `p` gets utilization samples: it has an `sm_pct`, or (buffered samples only) an
/// `sm_pct_seq`.
fn sampled(p: &Process, period_ms: u64) -> bool {
    p.sm_pct.is_some() || (period_ms > 0 && !p.sm_pct_seq.is_empty())
}

/// `p`'s SM utilization in its sample at `ts_us`: from `sm_pct_seq` when buffered and it
/// has one (`seq[(ts_ms / period_ms) % len]`), else `sm_pct`.
fn sm_at(p: &Process, ts_us: u64, period_ms: u64) -> u32 {
    let seq = &p.sm_pct_seq;
    match (ts_us / 1_000).checked_div(period_ms) {
        Some(k) if !seq.is_empty() => {
            let len = seq.len() as u64;
            usize::try_from(k % len)
                .ok()
                .and_then(|i| seq.get(i))
                .copied()
                .unwrap_or(0)
        }
        _ => p.sm_pct.unwrap_or(0),
    }
}

/// Every sample a call at `now_us` answers, oldest first (grouped by timestamp, then in
/// list order: compute processes, then graphics), and how many. A process with
/// utilization gets one sample per timestamp for its pid's first such entry (a pid on
/// both lists, or twice on one, has one). With `g.process_sample_ms` 0, one sample per
/// process at `now_us` itself (the caller passes a fresh, strictly increasing stamp) when
/// it is after `last_seen_us`; otherwise the buffered samples ([`buffered_samples`]).
/// At most [`MAX_ENTRIES`]: the oldest dropped. Nothing is allocated.
pub fn process_samples(
    g: &Gpu,
    now_us: u64,
    last_seen_us: u64,
) -> (usize, impl Iterator<Item = nvmlProcessUtilizationSample_t>) {
    let period = g.process_sample_ms;
    let fresh = (period == 0 && now_us > last_seen_us).then_some(now_us);
    let times = buffered_samples(now_us, last_seen_us, period, g.process_buffer_ms).chain(fresh);
    let all = move || g.compute_processes.iter().chain(&g.graphics_processes);
    let busy = move || {
        all()
            .enumerate()
            .filter(move |&(k, p)| {
                sampled(p, period) && !all().take(k).any(|q| q.pid == p.pid && sampled(q, period))
            })
            .map(|(_, p)| p)
    };
    let total = times.clone().count().saturating_mul(busy().count());
    let dropped = total.saturating_sub(MAX_ENTRIES);
    let samples = times
        .flat_map(move |ts| {
            busy().map(move |p| nvmlProcessUtilizationSample_t {
                pid: p.pid,
                timeStamp: ts,
                smUtil: sm_at(p, ts, period),
                memUtil: p.mem_pct,
                encUtil: p.enc_pct,
                decUtil: p.dec_pct,
            })
        })
        .skip(dropped);
    (total - dropped, samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-01-01T00:00:00Z in µs: a multiple of every period used here.
    const T0: u64 = 1_704_067_200_000_000;

    fn times(now: u64, last_seen: u64, period_ms: u64, buffer_ms: u64) -> Vec<u64> {
        buffered_samples(now, last_seen, period_ms, buffer_ms).collect()
    }

    #[test]
    fn samples_sit_on_period_boundaries_up_to_now() {
        // Now exactly on a boundary: that sample is answered.
        assert_eq!(
            times(T0 + 3_000_000, T0, 1_000, 20_000),
            [T0 + 1_000_000, T0 + 2_000_000, T0 + 3_000_000]
        );
        // Between boundaries: the last one before now.
        assert_eq!(
            times(T0 + 2_999_999, T0, 1_000, 20_000),
            [T0 + 1_000_000, T0 + 2_000_000]
        );
        // A sub-second period.
        assert_eq!(
            times(T0 + 350_000, T0 + 1, 100, 20_000),
            [T0 + 100_000, T0 + 200_000, T0 + 300_000]
        );
    }

    #[test]
    fn last_seen_is_exclusive() {
        assert_eq!(
            times(T0 + 2_500_000, T0 + 1_000_000, 1_000, 20_000),
            [T0 + 2_000_000]
        );
        assert_eq!(
            times(T0 + 2_500_000, T0 + 999_999, 1_000, 20_000),
            [T0 + 1_000_000, T0 + 2_000_000]
        );
        // Nothing newer than what was seen.
        assert!(times(T0 + 2_500_000, T0 + 2_000_000, 1_000, 20_000).is_empty());
        assert!(times(T0 + 2_500_000, T0 + 2_600_000, 1_000, 20_000).is_empty());
    }

    #[test]
    fn the_buffer_keeps_samples_younger_than_its_length() {
        // 3.5 s of buffer at 3.5 s past T0 + 10 s: samples after T0 + 10 s.
        assert_eq!(
            times(T0 + 13_500_000, 0, 1_000, 3_500),
            [T0 + 11_000_000, T0 + 12_000_000, T0 + 13_000_000]
        );
        // A sample exactly `buffer` old has gone.
        assert_eq!(
            times(T0 + 13_000_000, 0, 1_000, 3_000),
            [T0 + 11_000_000, T0 + 12_000_000, T0 + 13_000_000]
        );
        // A buffer longer than the time since the epoch: `last_seen` bounds it.
        assert_eq!(
            times(3_500_000, 0, 1_000, 20_000),
            [1_000_000, 2_000_000, 3_000_000]
        );
        // No buffer: nothing.
        assert!(times(T0 + 13_000_000, 0, 1_000, 0).is_empty());
    }

    #[test]
    fn no_period_is_left_to_the_caller_and_a_huge_buffer_is_capped() {
        assert!(times(T0, 0, 0, 20_000).is_empty());
        let many = times(T0, 0, 1, u64::MAX);
        assert_eq!(many.len(), MAX_ENTRIES);
        assert_eq!(many.last(), Some(&T0));
        assert_eq!(many.first(), Some(&(T0 - (MAX_ENTRIES as u64 - 1) * 1_000)));
    }

    fn proc_(pid: u32, sm: Option<u32>, seq: &[u32]) -> Process {
        Process {
            pid,
            sm_pct: sm,
            sm_pct_seq: seq.to_vec(),
            mem_pct: 7,
            ..Process::default()
        }
    }

    fn answer(g: &Gpu, now: u64, last_seen: u64) -> Vec<(u32, u64, u32)> {
        let (n, samples) = process_samples(g, now, last_seen);
        let v: Vec<_> = samples.map(|s| (s.pid, s.timeStamp, s.smUtil)).collect();
        assert_eq!(v.len(), n);
        v
    }

    #[test]
    fn without_a_period_one_fresh_sample_per_process() {
        let g = Gpu {
            compute_processes: vec![
                proc_(1, Some(40), &[]),
                proc_(2, None, &[1, 2]),
                proc_(1, Some(99), &[]),
            ],
            graphics_processes: vec![proc_(3, Some(5), &[])],
            ..Gpu::default()
        };
        // pid 2 has only a seq (unused without a period); pid 1's first entry counts.
        assert_eq!(answer(&g, 100, 99), [(1, 100, 40), (3, 100, 5)]);
        assert!(answer(&g, 100, 100).is_empty());
    }

    #[test]
    fn buffered_samples_per_process_in_time_order_with_sequences() {
        let g = Gpu {
            process_sample_ms: 1_000,
            compute_processes: vec![proc_(1, Some(40), &[]), proc_(2, None, &[10, 20, 30])],
            graphics_processes: vec![proc_(1, Some(99), &[]), proc_(4, None, &[])],
            ..Gpu::default()
        };
        // T0 is a multiple of 3 s: seq index (ts_ms / 1000) % 3 is 1 at T0 + 1 s.
        assert_eq!(
            answer(&g, T0 + 2_500_000, T0),
            [
                (1, T0 + 1_000_000, 40),
                (2, T0 + 1_000_000, 20),
                (1, T0 + 2_000_000, 40),
                (2, T0 + 2_000_000, 30),
            ]
        );
        assert!(answer(&g, T0 + 2_500_000, T0 + 2_000_000).is_empty());
    }

    #[test]
    fn a_call_answers_at_most_max_entries_dropping_the_oldest() {
        let g = Gpu {
            process_sample_ms: 1,
            process_buffer_ms: 10_000,
            compute_processes: vec![proc_(1, Some(1), &[]), proc_(2, Some(2), &[])],
            ..Gpu::default()
        };
        let v = answer(&g, T0, 0);
        assert_eq!(v.len(), MAX_ENTRIES);
        // 2048 timestamps of two processes each, the newest last.
        assert_eq!(v.last(), Some(&(2, T0, 2)));
        assert_eq!(v.first(), Some(&(1, T0 - 2_047 * 1_000, 1)));
        // Three processes: the oldest timestamp kept loses its first two entries.
        let g3 = Gpu {
            compute_processes: vec![
                proc_(1, Some(1), &[]),
                proc_(2, Some(2), &[]),
                proc_(3, Some(3), &[]),
            ],
            ..g
        };
        let v = answer(&g3, T0, 0);
        assert_eq!(v.len(), MAX_ENTRIES);
        // ceil(4096 / 3) = 1366 timestamps, 3 * 1366 - 4096 = 2 entries dropped.
        assert_eq!(v.first(), Some(&(3, T0 - 1_365 * 1_000, 3)));
        assert_eq!(v.last(), Some(&(3, T0, 3)));
    }
}
