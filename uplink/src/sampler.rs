//! The sampler: takes a tick from the source every interval on a dedicated thread, off
//! the async runtime, adds host metrics and what the tick cost, and hands it on.

use crate::cost::{micros, thread_cpu_time};
use gpufleet_core::HostSource;
use gpufleet_core::{GpuSource, SourceError};
use gpufleet_core::{Inventory, Tick, UnixMs};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

/// A source plus the host metrics source, measuring the cost of each tick.
pub struct Sampler {
    /// Where GPU readings come from.
    source: Box<dyn GpuSource>,
    /// Host metrics (the agent's `/proc` reader), used when the source does not provide
    /// them (the simulator does; NVML does not).
    host: Option<Box<dyn HostSource>>,
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
    /// A sampler of `source`, with host metrics from `host` when given.
    pub fn new(source: Box<dyn GpuSource>, host: Option<Box<dyn HostSource>>) -> Self {
        Self { source, host }
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
    /// `cpu_us` of this thread plus what the source reports for its own thread,
    /// `source_us` as the source measured it (else the wall time of the source call).
    pub fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
        let wall = Instant::now();
        let cpu = thread_cpu_time();
        let mut tick = self.source.sample(now_ms)?;
        let source_wall = wall.elapsed();
        if tick.host.is_none()
            && let Some(h) = &mut self.host
        {
            tick.host = Some(h.sample(now_ms));
        }
        let own_cpu = micros(thread_cpu_time().saturating_sub(cpu));
        let cost = tick.cost.get_or_insert_with(Default::default);
        cost.source_us.get_or_insert(micros(source_wall));
        cost.cpu_us = Some(cost.cpu_us.unwrap_or(0).saturating_add(own_cpu));
        cost.wall_us = Some(micros(wall.elapsed()));
        Ok(tick)
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
                match sampler.sample(at) {
                    Ok(tick) => {
                        failures = 0;
                        if !sink(tick) {
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
