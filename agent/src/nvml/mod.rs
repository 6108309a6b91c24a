//! The NVML source: the only module that knows NVML (through `nvml-wrapper`).
//!
//! [`NvmlSource`] owns the library handle and the device handles borrowed from it (one
//! self-referential cell), so handles are looked up once, every call runs on the thread
//! that samples (no hop to another thread per tick), and dropping the source shuts NVML
//! down cleanly.
//!
//! Per device it reads utilization, memory (v2), power, enforced limit, total energy,
//! temperature, fan, clocks, performance state, PCIe throughput, volatile ECC counts,
//! clock event (throttle) reasons, encoder/decoder utilization, instant power, memory
//! temperature and NVLink data throughput, summed and per active link (one batched
//! `nvmlDeviceGetFieldValues` call, see `field_values_scoped`) and the processes
//! (compute + graphics, with per-process utilization): the cheap ones every tick, the
//! expensive ones at their own cadence (`cadence`; ticks wait for their per-process
//! utilization in `held`). A call that answers NOT_SUPPORTED makes the value absent and
//! is not asked again for that device (a field value: that entry is dropped from the
//! batch). Every call is timed; the tick's [`SamplerCost`] carries the total and the
//! slowest.
//!
//! Health (`health`): retired pages, row remapping, lifetime ECC, PCIe replays, NVLink
//! error counters and persistence mode, in `Tick::health`, on the first tick, every
//! `health_interval` and on the tick after an Xid / ECC / GPU-lost event; the inventory
//! carries the temperature thresholds (slowdown, shutdown, GPU and memory maximum).
//!
//! Events: an NVML event set (Xid critical errors, ECC double-bit errors) is registered
//! once and polled without waiting at the end of each tick; what it holds is reported in
//! that tick (no thread waits on it). A GPU that answers GPU_IS_LOST is reported once (`GpuLost`), its values are
//! absent, the others keep being sampled, and each tick it is probed once (a fresh
//! handle by UUID): when it answers again it is reported `GpuRecovered` and sampled.
//!
//! GPM (`gpm`): SM activity and occupancy, tensor / FP pipe activity, DRAM bandwidth and
//! PCIe / NVLink traffic over the window between two GPM samples, per GPU and per MIG
//! instance, every `gpm` of tick time (carried between); absent where GPM is not supported.
//!
//! MIG: on a GPU with MIG enabled, its MIG devices are found once (inventory
//! `mig_instances`: UUID, profile, memory) and each tick their compute process lists say
//! which process runs in which (`mig_uuid`). nvml-wrapper 0.13 does not wrap
//! `nvmlDeviceGetGpuInstanceId` / `…ComputeInstanceId`: an instance's ids are taken from
//! a process running in it when it is found, else NVML's "no value" (0xFFFFFFFF).
//!
//! NVLink: NVML's `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX` fields are cumulative KiB
//! counters that take the link in the entry's `scopeId` (`UINT_MAX`: the sum over all
//! links). nvml-wrapper 0.13 always sends `scopeId` 0, so the batch is made by
//! `field_values_scoped` (the agent's `unsafe`, with the one-call lists of `lists`). Rates are the counters' deltas
//! between ticks: absent on the first tick and after a counter went backwards.
//!
//! Layout: `reader` samples each tick (`device` per-GPU state, `mig`, `health`, `fields`
//! for the batched field values, `lists` for the process and utilization lists in one
//! call each, `cadence` for when the expensive calls are made, `held` for the ticks
//! waiting for their per-process utilization), `events` registers and polls the event
//! set, and `mapping` holds the NVML → domain mappings, pure functions tested without
//! NVML.
//!
//! [`SamplerCost`]: gpufleet_core::SamplerCost

mod cadence;
mod device;
mod events;
mod fields;
mod gpm;
mod health;
mod held;
mod lists;
mod mapping;
mod mig;
mod pcie;
mod reader;

pub use cadence::Cadence;
pub use gpm::{gpm_bps, gpm_cpct, gpm_metrics};
pub use health::DEFAULT_HEALTH_INTERVAL;
pub use mapping::*;

use gpufleet_core::{GpuSource, SourceError};
use gpufleet_core::{Inventory, Tick, UnixMs};
use nvml_wrapper::Nvml;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_POWER_INSTANT};
use reader::Reader;
use std::path::PathBuf;
use std::time::Duration;
use tracing::info;

/// The library NVML loads when no `--nvml-lib` is given.
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";
/// NVML's maximum number of NVLink links per GPU.
const MAX_NVLINKS: u32 = 18;
/// Device-wide field values asked in one `nvmlDeviceGetFieldValues` call per tick (the
/// NVLink entries join them, see [`field_batch`]).
const FIELDS: [u32; 2] = [NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_MEMORY_TEMP];
/// The `scopeId` of an NVLink field value that asks for the sum over all links.
pub const ALL_LINKS: u32 = u32::MAX;
/// NVML's "no value" for a GPU / compute instance id.
const NO_INSTANCE_ID: u32 = 0xFFFF_FFFF;
/// How often a process list is asked again when it grew between NVML's size query and
/// the fill (`NVML_ERROR_INSUFFICIENT_SIZE`).
const LIST_ATTEMPTS: usize = 3;

/// How to open NVML.
#[derive(Debug, Clone)]
pub struct NvmlOptions {
    /// The NVML library to load (`--nvml-lib`); the system's `libnvidia-ml.so.1` if `None`.
    pub lib_path: Option<PathBuf>,
    /// Where `/proc` is, to identify processes and read host facts.
    pub proc_root: PathBuf,
    /// The node name reported as the host name.
    pub hostname: String,
    /// How often health counters are read (`--health-interval`); they are also read on
    /// the tick after an Xid / ECC / GPU-lost event.
    pub health_interval: Duration,
    /// The sampling interval (`--interval`): cadences are counted in ticks this apart.
    pub interval: Duration,
    /// How often the expensive calls are made ([`Cadence`]).
    pub cadence: Cadence,
}

self_cell::self_cell!(
    /// NVML and the reader whose device handles and event set borrow it (dropped before
    /// it; dropping NVML shuts it down).
    struct NvmlCell {
        owner: Nvml,
        #[covariant]
        dependent: Reader,
    }
);

/// A [`GpuSource`] reading real GPUs through NVML.
pub struct NvmlSource {
    cell: NvmlCell,
    /// Completed ticks not yet handed out (held ones that a [`GpuSource::sample`]
    /// completed).
    backlog: Vec<Tick>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource").finish_non_exhaustive()
    }
}

impl NvmlSource {
    /// Loads NVML, initialises it, caches a handle per GPU and registers for Xid / ECC
    /// events. Fails when the library cannot be loaded or initialised, or the GPUs cannot
    /// be counted.
    pub fn open(opts: NvmlOptions) -> Result<Self, SourceError> {
        let lib = opts
            .lib_path
            .as_ref()
            .map_or_else(|| DEFAULT_LIB.to_owned(), |p| p.display().to_string());
        let mut builder = Nvml::builder();
        if let Some(path) = &opts.lib_path {
            builder.lib_path(path.as_os_str());
        }
        let nvml = builder.init().map_err(|e| SourceError::NvmlInit {
            lib: lib.clone(),
            reason: e.to_string(),
        })?;
        let cell = NvmlCell::try_new(nvml, |nvml| Reader::open(nvml, opts))?;
        info!(lib = %lib, gpus = cell.borrow_dependent().devices.len(), "NVML initialised");
        Ok(Self {
            cell,
            backlog: Vec::new(),
        })
    }

    fn reader<T>(&mut self, f: impl FnOnce(&mut Reader<'_>) -> T) -> T {
        self.cell.with_dependent_mut(|_, r| f(r))
    }

    /// Every held tick and one at `now_ms`, all completed now.
    fn sample_ready_forced(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        let mut ready = std::mem::take(&mut self.backlog);
        ready.extend(self.reader(|r| r.sample(now_ms, true)));
        Ok(ready)
    }
}

impl GpuSource for NvmlSource {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&mut self) -> Result<Inventory, SourceError> {
        Ok(self.reader(|r| r.inventory()))
    }

    /// A complete tick: per-process utilization is fetched now, whatever its cadence
    /// (`snapshot`, the last reading of `exec`, both without held ticks). Ticks leave
    /// oldest first: with ticks held or completed before, the oldest of them is answered
    /// and the rest, this one last, by the next calls.
    fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
        let ready = self.reader(|r| r.sample(now_ms, true));
        self.backlog.extend(ready);
        if self.backlog.is_empty() {
            return Err(SourceError::Nvml {
                call: "sample",
                reason: "no tick was completed".into(),
            });
        }
        Ok(self.backlog.remove(0))
    }

    fn sample_ready(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        let mut ready = std::mem::take(&mut self.backlog);
        ready.extend(self.reader(|r| r.sample(now_ms, false)));
        Ok(ready)
    }

    fn flush(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        if self.reader(|r| r.holds_nothing()) {
            return Ok(std::mem::take(&mut self.backlog));
        }
        self.sample_ready_forced(now_ms)
    }
}
