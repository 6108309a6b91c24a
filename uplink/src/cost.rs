//! What sampling costs the agent: thread CPU time and the time spent in individual source
//! calls, reported in every tick's [`SamplerCost`](gpufleet_core::SamplerCost).

use std::collections::BTreeMap;
use std::time::Duration;

/// How many of a tick's slowest calls are reported (the collector keeps at most 16).
pub const SLOWEST_CALLS: usize = 5;

/// CPU time consumed so far by the calling thread (user + system), with nanosecond
/// resolution (`CLOCK_THREAD_CPUTIME_ID`; `/proc/thread-self/stat` only has 10 ms ticks).
pub fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// Microseconds, saturating at `u32::MAX` (71 minutes: far beyond any tick).
pub fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// Accumulates the time of each call a source makes during one tick and remembers the
/// slowest few. Allocation-free while recording; names are formatted once, at the end.
#[derive(Debug, Default)]
pub struct CallTimer {
    /// Sum of all recorded calls: the tick's `source_us`.
    total: Duration,
    /// The slowest calls so far, slowest first: (duration, GPU index, call name).
    slowest: Vec<(Duration, u32, &'static str)>,
}

impl CallTimer {
    /// An empty timer for a new tick.
    pub fn new() -> Self {
        Self {
            total: Duration::ZERO,
            slowest: Vec::with_capacity(SLOWEST_CALLS + 1),
        }
    }

    /// Records that `call` on GPU `gpu` took `d`.
    pub fn record(&mut self, gpu: u32, call: &'static str, d: Duration) {
        self.total += d;
        if self.slowest.len() == SLOWEST_CALLS && self.slowest.last().is_some_and(|s| s.0 >= d) {
            return;
        }
        let at = self.slowest.partition_point(|s| s.0 >= d);
        self.slowest.insert(at, (d, gpu, call));
        self.slowest.truncate(SLOWEST_CALLS);
    }

    /// Adds what `other` recorded (a part of the tick read on another thread).
    pub fn merge(&mut self, other: CallTimer) {
        let total = self.total + other.total;
        for (d, gpu, call) in other.slowest {
            self.record(gpu, call, d);
        }
        self.total = total;
    }

    /// Total time recorded.
    pub fn total(&self) -> Duration {
        self.total
    }

    /// The slowest calls as `gpu<N>.<call>` → microseconds.
    pub fn slowest_us(&self) -> BTreeMap<String, u32> {
        self.slowest
            .iter()
            .map(|(d, gpu, call)| (format!("gpu{gpu}.{call}"), micros(*d)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_slowest_calls_and_the_total() {
        let mut t = CallTimer::new();
        for (i, us) in [5u64, 50, 1, 40, 30, 20, 10, 60].into_iter().enumerate() {
            t.record(i as u32, "power_usage", Duration::from_micros(us));
        }
        assert_eq!(t.total(), Duration::from_micros(216));
        let slow = t.slowest_us();
        assert_eq!(slow.len(), SLOWEST_CALLS);
        assert_eq!(slow.get("gpu7.power_usage"), Some(&60));
        assert_eq!(slow.get("gpu1.power_usage"), Some(&50));
        assert!(
            !slow.contains_key("gpu2.power_usage"),
            "1 µs is not among the slowest"
        );
    }

    #[test]
    fn thread_cpu_time_moves_forward() {
        let a = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_time() >= a);
    }
}
