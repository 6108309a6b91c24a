//! The source boundaries: where ticks come from (NVML on a real node, the simulator in
//! the demo and in tests), and where a real node's host metrics come from.
//!
//! A source is **blocking** and has one job: answer "what does the hardware look like"
//! ([`GpuSource::inventory`]) and "what does it measure now" ([`GpuSource::sample`]).
//! Callers run it off the async runtime (`spawn_blocking` or a dedicated thread).
//!
//! Contract (shared with all-smi's reader trait): a value the source could not read is
//! `None`, never a substituted `0`.

use crate::{HostSample, Inventory, Tick, UnixMs};
use thiserror::Error;

/// A source of GPU readings for one node.
pub trait GpuSource: Send {
    /// What the source is, sent in the Hello: `"nvml"`, `"simulator"`.
    fn name(&self) -> &'static str;

    /// Static facts: driver versions, one entry per GPU, the host. Called once per
    /// connection; a source may cache it.
    fn inventory(&mut self) -> Result<Inventory, SourceError>;

    /// Everything measured at `now_ms` (Unix ms): GPU samples in inventory order, the
    /// processes on them, events since the previous call and, when the source knows it,
    /// the host sample. Callers pass strictly increasing times.
    ///
    /// `Tick::cost` may carry what the source itself measured (time inside NVML, slowest
    /// calls); the sampler completes it with wall and CPU time.
    fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError>;

    /// Measures at `now_ms` and answers the ticks ready to send, oldest first: a source
    /// that completes a tick only later (NVML fetches per-process utilization from the
    /// driver's buffer every few seconds) holds it until then and answers it, with its
    /// own time, at a later call. The sampling loop calls this; the default is
    /// [`GpuSource::sample`].
    fn sample_ready(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        self.sample(now_ms).map(|t| vec![t])
    }

    /// Completes and answers every tick held, measuring at `now_ms` if it must (the
    /// agent stops). None by default.
    fn flush(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        let _ = now_ms;
        Ok(Vec::new())
    }

    /// The node's boot id when the source defines it (the simulator invents one per
    /// simulated node); `None` to read it from the OS.
    fn boot_id(&self) -> Option<String> {
        None
    }
}

/// Host metrics (CPU, memory, disk, network, load) for ticks whose [`GpuSource`] has none:
/// NVML has none, so a real node reads `/proc`; the simulator invents its own. Blocking,
/// like a GPU source, and called on the same thread.
pub trait HostSource: Send + std::fmt::Debug {
    /// The host sample at `now_ms`; a metric that cannot be read is absent, never 0.
    fn sample(&mut self, now_ms: UnixMs) -> HostSample;

    /// The node's boot id, when this source can read it.
    fn boot_id(&self) -> Option<String>;
}

/// Why a source could not produce an inventory or a tick.
#[derive(Debug, Error)]
pub enum SourceError {
    /// NVML could not be loaded or initialised at all.
    #[error(
        "cannot initialise NVML from {lib}: {reason}. Is the NVIDIA driver installed? \
         Point --nvml-lib at libnvidia-ml.so.1, or use --simulate"
    )]
    NvmlInit {
        /// The library that was tried (`libnvidia-ml.so.1` when none was given).
        lib: String,
        /// NVML's error, as text.
        reason: String,
    },
    /// An NVML call the source cannot do without failed (device count, a handle).
    #[error("NVML {call} failed: {reason}")]
    Nvml {
        /// The call that failed.
        call: &'static str,
        /// NVML's error, as text.
        reason: String,
    },
    /// `sample` was called with a time that does not move forward.
    #[error("sample time {now_ms} is not after the previous sample's {last_ms}")]
    TimeNotIncreasing {
        /// The time passed in.
        now_ms: UnixMs,
        /// The previous call's time.
        last_ms: UnixMs,
    },
}
