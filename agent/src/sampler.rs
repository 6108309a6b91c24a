//! The sampler: takes a tick from the source every interval, off the async runtime, adds
//! host metrics and what the tick cost, and hands it to the uplink.

use crate::cost::{micros, thread_cpu_time};
use crate::host::HostReader;
use crate::source::{GpuSource, SourceError};
use gpufleet_core::{Inventory, Tick, UnixMs};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

/// A source plus the host reader, measuring the cost of each tick.
pub struct Sampler {
    /// Where GPU readings come from.
    source: Box<dyn GpuSource>,
    /// Host metrics from `/proc`, used when the source does not provide them (the
    /// simulator does; NVML does not).
    host: Option<HostReader>,
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
    pub fn new(source: Box<dyn GpuSource>, host: Option<HostReader>) -> Self {
        Self { source, host }
    }

    /// The source's name.
    pub fn source_name(&self) -> &'static str {
        self.source.name()
    }

    /// The source's boot id, if it defines one.
    pub fn boot_id(&self) -> Option<String> {
        self.source.boot_id()
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

/// Samples every `interval` until `stop` is cancelled or the receiver is gone. Each tick
/// runs on the blocking pool; timestamps are the system clock in Unix ms, strictly
/// increasing. A tick that fails is skipped and logged (the first failure, then every
/// 60th). If the sampler itself dies, `stop` is cancelled so the agent shuts down.
///
/// Returns the sampler when it stops (so `exec` can take one last reading at the
/// command's exit), `None` if the sampling thread panicked.
pub async fn sample_loop(
    mut sampler: Sampler,
    interval: Duration,
    ticks: mpsc::Sender<Tick>,
    stop: CancellationToken,
) -> Option<Sampler> {
    let mut ticker = tokio::time::interval(interval);
    // A slow tick (NVML stalls) must not cause a burst of catch-up samples.
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut last_ms: UnixMs = 0;
    let mut failures: u64 = 0;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let now = gpufleet_core::config::now_ms().max(last_ms + 1);
        last_ms = now;
        let joined = tokio::task::spawn_blocking(move || {
            let result = sampler.sample(now);
            (sampler, result)
        })
        .await;
        let result = match joined {
            Ok((s, r)) => {
                sampler = s;
                r
            }
            Err(e) => {
                error!(error = %e, "the sampling thread panicked; stopping the agent");
                stop.cancel();
                return None;
            }
        };
        match result {
            Ok(tick) => {
                failures = 0;
                if ticks.send(tick).await.is_err() {
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
    Some(sampler)
}
