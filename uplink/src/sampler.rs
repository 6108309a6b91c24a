//! The sampler: takes a tick from the source every interval on a dedicated thread, off
//! the async runtime, adds host metrics and what the tick cost, and hands it on.

use crate::cost::{micros, thread_cpu_time};
use gpufleet_core::{GpuSource, SourceError};
use gpufleet_core::{HostSample, HostSource};
use gpufleet_core::{Inventory, Tick, UnixMs};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

/// Host metrics (`/proc`) are read at most this often by default (the agent's
/// `--host-interval`), whatever the sampling interval: reading them costs more than the
/// GPU samples of a tick (the kernel formats `stat`, `diskstats`, `net/dev`, `meminfo`)
/// and they are the node's context, not what energy is attributed from; the ticks between
/// carry none (the collector keeps the last reading as the node's latest).
pub const DEFAULT_HOST_INTERVAL: Duration = Duration::from_secs(5);
/// How early a tick may come and still take the host reading due at the next mark
/// (wake-up jitter must not skip every other reading when the two intervals are equal).
const HOST_SLACK: Duration = Duration::from_millis(50);

/// A source plus the host metrics source, measuring the cost of each tick.
pub struct Sampler {
    /// Where GPU readings come from.
    source: Box<dyn GpuSource>,
    /// Host metrics (the agent's `/proc` reader), used when the source does not provide
    /// them (the simulator does; NVML does not).
    host: Option<Box<dyn HostSource>>,
    /// Host metrics are read at most this often.
    host_every: Duration,
    /// When the next host reading is due (`None`: at the next tick).
    host_due: Option<Instant>,
    /// CPU of calls that answered no tick (the source held it), charged to the next.
    unreported_cpu: Duration,
    /// Host readings taken while the source held their tick, by tick time.
    host_held: Vec<(UnixMs, HostSample)>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("source", &self.source.name())
            .field("host", &self.host)
            .finish()
    }
}

impl Sampler {
    /// A sampler of `source`, with host metrics from `host` when given, read at most every
    /// [`DEFAULT_HOST_INTERVAL`].
    pub fn new(source: Box<dyn GpuSource>, host: Option<Box<dyn HostSource>>) -> Self {
        Self {
            source,
            host,
            host_every: DEFAULT_HOST_INTERVAL,
            host_due: None,
            unreported_cpu: Duration::ZERO,
            host_held: Vec::new(),
        }
    }

    /// Reads host metrics at most every `every` (zero: at every tick).
    #[must_use]
    pub fn with_host_interval(mut self, every: Duration) -> Self {
        self.host_every = every;
        self
    }

    /// The source's name.
    pub fn source_name(&self) -> &'static str {
        self.source.name()
    }

    /// The node's boot id: the source's if it defines one, else the host source's.
    pub fn boot_id(&self) -> Option<String> {
        self.source
            .boot_id()
            .or_else(|| self.host.as_ref().and_then(|h| h.boot_id()))
    }

    /// The source's inventory.
    pub fn inventory(&mut self) -> Result<Inventory, SourceError> {
        self.source.inventory()
    }

    /// One tick at `now_ms`, with host metrics and its cost: `wall_us` for the whole tick,
    /// `cpu_us` of this thread (the source runs on it) plus what the source reports for a
    /// thread of its own, if it has one,
    /// `source_us` as the source measured it (else the wall time of the source call).
    /// Host metrics are added at most every host interval.
    pub fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
        self.sample_at(now_ms, Instant::now())
    }

    /// [`Self::sample`] with the tick starting at `wall`.
    fn sample_at(&mut self, now_ms: UnixMs, wall: Instant) -> Result<Tick, SourceError> {
        let cpu = thread_cpu_time();
        let mut tick = self.source.sample(now_ms)?;
        self.complete(&mut tick, now_ms, wall, cpu);
        Ok(tick)
    }

    /// The ticks ready at `now_ms` ([`GpuSource::sample_ready`]), oldest first: a source
    /// may hold a tick and answer it later. The newest carries the host metrics and this
    /// call's cost, plus the CPU of the calls that answered none.
    pub fn sample_ready(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        self.sample_ready_at(now_ms, Instant::now())
    }

    /// [`Self::sample_ready`] with the call starting at `wall`.
    fn sample_ready_at(&mut self, now_ms: UnixMs, wall: Instant) -> Result<Vec<Tick>, SourceError> {
        let cpu = thread_cpu_time();
        let mut ticks = self.source.sample_ready(now_ms)?;
        // Host metrics are read when due whether or not the source answered a tick now,
        // and go with the tick of their time when it is handed out.
        if let Some(host) = self.host_reading(now_ms, wall) {
            self.host_held.push((now_ms, host));
        }
        for t in &mut ticks {
            if let Some(k) = self.host_held.iter().position(|(ms, _)| *ms == t.time_ms) {
                let (_, host) = self.host_held.remove(k);
                t.host.get_or_insert(host);
            }
        }
        if let Some(newest) = ticks.last().map(|t| t.time_ms) {
            // A reading whose tick left without it (the source had its own) is dropped.
            self.host_held.retain(|(ms, _)| *ms > newest);
        }
        match ticks.last_mut() {
            Some(newest) => self.complete(newest, now_ms, wall, cpu),
            None => {
                self.unreported_cpu += thread_cpu_time().saturating_sub(cpu);
            }
        }
        Ok(ticks)
    }

    /// A host reading at `now_ms`, when one is due (at most every host interval).
    fn host_reading(&mut self, now_ms: UnixMs, wall: Instant) -> Option<HostSample> {
        let h = self.host.as_mut()?;
        if self.host_due.is_some_and(|due| wall + HOST_SLACK < due) {
            return None;
        }
        // On the grid of host interval marks (a late tick does not shift it), never
        // closer than half a period after this reading.
        let due = self.host_due.map_or(wall, |d| d) + self.host_every;
        self.host_due = Some(due.max(wall + self.host_every / 2));
        Some(h.sample(now_ms))
    }

    /// Every tick the source holds, completed now (the sampling stops).
    pub fn flush(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        let wall = Instant::now();
        let cpu = thread_cpu_time();
        let mut ticks = self.source.flush(now_ms)?;
        if let Some(newest) = ticks.last_mut() {
            self.complete(newest, now_ms, wall, cpu);
        }
        Ok(ticks)
    }

    /// Adds host metrics (when due and the tick has none) and the cost of the call that
    /// started at `wall` with this thread's CPU time at `cpu`.
    fn complete(&mut self, tick: &mut Tick, now_ms: UnixMs, wall: Instant, cpu: Duration) {
        let source_wall = wall.elapsed();
        if tick.host.is_none() {
            tick.host = self.host_reading(now_ms, wall);
        }
        let spent =
            thread_cpu_time().saturating_sub(cpu) + std::mem::take(&mut self.unreported_cpu);
        let own_cpu = micros(spent);
        let cost = tick.cost.get_or_insert_with(Default::default);
        cost.source_us.get_or_insert(micros(source_wall));
        cost.cpu_us = Some(cost.cpu_us.unwrap_or(0).saturating_add(own_cpu));
        // A source that measured its tick's wall time itself (one it may hand out with a
        // later call) keeps it, unless this call (which measured the tick too) took longer.
        let call_us = micros(wall.elapsed());
        cost.wall_us = Some(cost.wall_us.map_or(call_us, |w| w.max(call_us)));
    }
}

/// The sampling thread of an agent (or of `exec`): see [`spawn_sampling`].
#[derive(Debug)]
pub struct Sampling {
    /// The thread; it hands the sampler back when it ends.
    thread: Option<std::thread::JoinHandle<Sampler>>,
    /// Cancelled when the thread ends, however it ends.
    done: CancellationToken,
}

impl Sampling {
    /// A token cancelled once the thread has ended (no tick will come after it).
    pub fn done(&self) -> CancellationToken {
        self.done.clone()
    }

    /// Waits for the thread to end (cancel the `stop` token first); returns the sampler,
    /// so `exec` can take one last reading at the command's exit; `None` if it panicked.
    pub async fn join(mut self) -> Option<Sampler> {
        let thread = self.thread.take()?;
        tokio::task::spawn_blocking(move || thread.join().ok())
            .await
            .ok()
            .flatten()
    }
}

/// Cancels `done` when the sampling thread ends, and `stop` too if it ends by a panic
/// (the agent then shuts down rather than run without samples).
struct ExitGuard {
    done: CancellationToken,
    stop: CancellationToken,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            error!("the sampling thread panicked; stopping the agent");
            self.stop.cancel();
        }
        self.done.cancel();
    }
}

/// Starts the sampling thread: one dedicated thread that owns `sampler` (the source and
/// its NVML handles, the host source) and, every `interval`, takes a tick and hands it to
/// `sink` on that same thread — no hop to another thread per tick. The agent's sink
/// encodes the tick and appends it to the outbox (the spool's disk write and fsync happen
/// here, off the async runtime).
///
/// Timestamps are the system clock in Unix ms, strictly increasing; a slow tick (NVML
/// stalls) does not cause a burst of catch-up ticks. A tick that fails is skipped and
/// logged (the first failure, then every 60th). The thread ends when `stop` is cancelled
/// or `sink` returns `false`. Must be called inside a Tokio runtime (it watches `stop`
/// from a small task).
pub fn spawn_sampling(
    mut sampler: Sampler,
    interval: Duration,
    mut sink: impl FnMut(Tick) -> bool + Send + 'static,
    stop: CancellationToken,
) -> std::io::Result<Sampling> {
    let done = CancellationToken::new();
    // The thread sleeps in `recv_timeout`; dropping the sender wakes it to stop.
    let (wake, sleep) = std::sync::mpsc::channel::<()>();
    let guard = ExitGuard {
        done: done.clone(),
        stop: stop.clone(),
    };
    let thread = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || {
            let _guard = guard;
            let mut next = Instant::now();
            let mut last_ms: UnixMs = 0;
            let mut failures: u64 = 0;
            let mut stopped_by_sink = false;
            loop {
                let wait = next.saturating_duration_since(Instant::now());
                if !matches!(
                    sleep.recv_timeout(wait),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                ) {
                    break;
                }
                let now = Instant::now();
                while next <= now {
                    next += interval;
                }
                let at = gpufleet_core::config::now_ms().max(last_ms + 1);
                last_ms = at;
                match sampler.sample_ready(at) {
                    Ok(ticks) => {
                        failures = 0;
                        if !ticks.into_iter().all(&mut sink) {
                            stopped_by_sink = true;
                            break;
                        }
                    }
                    Err(e) => {
                        if failures.is_multiple_of(60) {
                            warn!(error = %e, consecutive_failures = failures + 1, "sampling failed; skipping this tick");
                        }
                        failures += 1;
                    }
                }
            }
            // Ticks the source still holds are completed and handed on: stopping loses
            // none of what was measured.
            if !stopped_by_sink {
                let at = gpufleet_core::config::now_ms().max(last_ms + 1);
                match sampler.flush(at) {
                    Ok(ticks) => {
                        for tick in ticks {
                            if !sink(tick) {
                                break;
                            }
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot complete the ticks held at stop"),
                }
            }
            sampler
        })?;
    let thread_done = done.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = thread_done.cancelled() => {}
        }
        drop(wake);
    });
    Ok(Sampling {
        thread: Some(thread),
        done,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::HostSample;

    struct NoGpus;

    impl GpuSource for NoGpus {
        fn name(&self) -> &'static str {
            "none"
        }
        fn inventory(&mut self) -> Result<Inventory, SourceError> {
            Ok(Inventory::default())
        }
        fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
            Ok(Tick {
                time_ms: now_ms,
                ..Tick::default()
            })
        }
    }

    #[derive(Debug)]
    struct Host;

    impl HostSource for Host {
        fn sample(&mut self, _: UnixMs) -> HostSample {
            HostSample {
                load1: Some(1.0),
                ..HostSample::default()
            }
        }
        fn boot_id(&self) -> Option<String> {
            None
        }
    }

    /// Which of the ticks at `offsets_ms` (from one start) carry host metrics.
    fn host_ticks(every: Duration, offsets_ms: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut s = Sampler::new(Box::new(NoGpus), Some(Box::new(Host))).with_host_interval(every);
        let start = Instant::now();
        offsets_ms
            .into_iter()
            .filter(|&ms| {
                let at = start + Duration::from_millis(ms);
                let tick = s.sample_at(ms as i64 + 1, at).expect("tick");
                tick.host.is_some()
            })
            .collect()
    }

    /// A source that hands out its ticks five at a time (as NVML does while ticks wait
    /// for per-process utilization).
    struct FiveAtATime(Vec<Tick>);

    impl GpuSource for FiveAtATime {
        fn name(&self) -> &'static str {
            "batches"
        }
        fn inventory(&mut self) -> Result<Inventory, SourceError> {
            Ok(Inventory::default())
        }
        fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
            NoGpus.sample(now_ms)
        }
        fn sample_ready(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
            let tick = self.sample(now_ms)?;
            self.0.push(tick);
            Ok(if self.0.len() == 5 {
                std::mem::take(&mut self.0)
            } else {
                Vec::new()
            })
        }
    }

    /// Host metrics keep their interval while the source holds ticks: each reading goes
    /// with the tick of its time when that tick is handed out.
    #[test]
    fn host_metrics_go_with_their_tick_when_the_source_holds_ticks() {
        let mut s = Sampler::new(Box::new(FiveAtATime(Vec::new())), Some(Box::new(Host)))
            .with_host_interval(Duration::from_secs(2));
        let start = Instant::now();
        let mut with_host = Vec::new();
        let mut handed = 0;
        for k in 0..10u64 {
            let at = start + Duration::from_secs(k);
            for t in s
                .sample_ready_at(1_000 + k as i64 * 1000, at)
                .expect("ticks")
            {
                handed += 1;
                if t.host.is_some() {
                    with_host.push(t.time_ms);
                }
            }
        }
        assert_eq!(handed, 10);
        assert_eq!(
            with_host,
            [1_000, 3_000, 5_000, 7_000, 9_000],
            "every 2 s, not every 5"
        );
    }

    #[test]
    fn host_metrics_are_read_at_most_once_per_host_interval_whatever_the_interval() {
        let second = Duration::from_secs(1);
        assert_eq!(
            host_ticks(second, (0..=30).map(|i| i * 100)),
            [0, 1000, 2000, 3000],
            "100 ms: one tick in ten"
        );
        // 1 s, each wake-up up to 20 ms early or late: every tick still reads them.
        let jittered = [0, 980, 2020, 3000, 3980, 5020, 6000];
        assert_eq!(host_ticks(second, jittered), jittered);
        assert_eq!(
            host_ticks(second, [0, 300, 600, 900, 1200, 1500, 1800, 2100, 2400]),
            [0, 1200, 2100],
            "300 ms: the first tick at or after each second mark"
        );
        // The default, 5 s, at a 1 s interval with jitter: one tick in five.
        let jittered = [
            0, 1020, 2000, 2980, 4000, 5020, 6000, 6980, 8000, 9020, 10000, 10980, 12000,
        ];
        assert_eq!(
            host_ticks(DEFAULT_HOST_INTERVAL, jittered),
            [0, 5020, 10000]
        );
        assert_eq!(
            host_ticks(Duration::ZERO, [0, 10, 20, 30]),
            [0, 10, 20, 30],
            "zero: every tick"
        );
    }
}
