//! The NVML source: the only module that knows NVML (through `nvml-wrapper`).
//!
//! [`NvmlSource`] owns the library handle and the device handles borrowed from it (one
//! self-referential cell), so handles are looked up once, every call runs on the thread
//! that samples (no hop to another thread per tick), and dropping the source shuts NVML
//! down cleanly.
//!
//! Per tick and device it reads utilization, memory (v2), power, enforced limit, total
//! energy, temperature, fan, clocks, performance state, PCIe throughput, volatile ECC
//! counts, clock event (throttle) reasons, encoder/decoder utilization, instant power,
//! memory temperature and NVLink data throughput, summed and per active link (one batched
//! `nvmlDeviceGetFieldValues` call, see `field_values_scoped`) and the processes
//! (compute + graphics, with per-process utilization since the last call). A call that
//! answers NOT_SUPPORTED makes the value absent and is not asked again for that device
//! (a field value: that entry is dropped from the batch). Every call is timed; the tick's
//! [`SamplerCost`] carries the total and the slowest.
//!
//! Events: a second thread, `nvml-events`, waits on an NVML event set (Xid critical
//! errors, ECC double-bit errors) with a timeout; what it receives is reported in the
//! next tick. A GPU that answers GPU_IS_LOST is reported once (`GpuLost`), its values are
//! absent, the others keep being sampled, and each tick it is probed once (a fresh
//! handle by UUID): when it answers again it is reported `GpuRecovered` and sampled.
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
//! `field_values_scoped` (the agent's only `unsafe`). Rates are the counters' deltas
//! between ticks: absent on the first tick and after a counter went backwards.
//!
//! The NVML → domain mappings are pure functions at the bottom of this file, tested
//! without NVML.

use crate::cgroup::{self, ProcessIdentity, UserNames};
use crate::host;
use gpufleet_core::{
    Event, EventKind, GpuInfo, GpuSample, Inventory, MigInstance, NvLinkSample, ProcessSample,
    ProcessType, SamplerCost, Tick, UnixMs,
};
use gpufleet_core::{GpuSource, SourceError};
use gpufleet_uplink::cost::{CallTimer, micros, thread_cpu_time};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Brand, Clock, ComputeMode, EccCounter, MemoryError, PcieUtilCounter, PerformanceState,
    TemperatureSensor,
};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::{
    FieldValueSample, MemoryInfo, ProcessInfo, ProcessUtilizationSample,
};
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_POWER_INSTANT,
};
use nvml_wrapper::{Device, EventSet, Nvml};
use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlValue_t};
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The library NVML loads when no `--nvml-lib` is given.
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";
/// NVML's maximum number of NVLink links per GPU.
const MAX_NVLINKS: u32 = 18;
/// How long the event thread waits per `nvmlEventSetWait` before checking for shutdown
/// (so dropping the source takes at most this long; each wake-up costs the agent CPU).
const EVENT_WAIT: Duration = Duration::from_secs(1);
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
}

self_cell::self_cell!(
    /// NVML and the reader whose device handles borrow it.
    struct NvmlCell {
        owner: Arc<Nvml>,
        #[covariant]
        dependent: Reader,
    }
);

/// A [`GpuSource`] reading real GPUs through NVML.
pub struct NvmlSource {
    /// NVML and the per-GPU state; `None` only while dropping.
    cell: Option<NvmlCell>,
    /// Tells the event thread to stop.
    stop: Arc<AtomicBool>,
    /// The event thread, joined on drop before NVML shuts down.
    events: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource").finish_non_exhaustive()
    }
}

impl NvmlSource {
    /// Loads NVML, initialises it and caches a handle per GPU. Fails when the library
    /// cannot be loaded or initialised, or the GPUs cannot be counted.
    pub fn open(opts: NvmlOptions) -> Result<Self, SourceError> {
        let lib = opts
            .lib_path
            .as_ref()
            .map_or_else(|| DEFAULT_LIB.to_owned(), |p| p.display().to_string());
        let mut builder = Nvml::builder();
        if let Some(path) = &opts.lib_path {
            builder.lib_path(path.as_os_str());
        }
        let nvml = Arc::new(builder.init().map_err(|e| SourceError::NvmlInit {
            lib: lib.clone(),
            reason: e.to_string(),
        })?);
        let (event_tx, event_rx) = mpsc::channel();
        let cell = NvmlCell::try_new(Arc::clone(&nvml), |nvml| Reader::open(nvml, opts, event_rx))?;
        let gpus = cell
            .borrow_dependent()
            .devices
            .iter()
            .map(|d| d.index + 1)
            .max()
            .unwrap_or(0);
        info!(lib = %lib, gpus = cell.borrow_dependent().devices.len(), "NVML initialised");
        let stop = Arc::new(AtomicBool::new(false));
        let events = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("nvml-events".into())
                .spawn(move || watch_events(&nvml, gpus, &event_tx, &stop))
        };
        let events = match events {
            Ok(t) => Some(t),
            Err(e) => {
                warn!(error = %e, "cannot start the NVML event thread; Xid and ECC events will not be reported");
                None
            }
        };
        Ok(Self {
            cell: Some(cell),
            stop,
            events,
        })
    }

    fn reader<T>(&mut self, f: impl FnOnce(&mut Reader<'_>) -> T) -> Result<T, SourceError> {
        let cell = self.cell.as_mut().ok_or(SourceError::WorkerGone)?;
        Ok(cell.with_dependent_mut(|_, r| f(r)))
    }
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        // The event thread ends first (it holds NVML too); then the device handles drop
        // before NVML, whose last reference shuts it down.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.events.take() {
            let _ = t.join();
        }
        self.cell.take();
    }
}

impl GpuSource for NvmlSource {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&mut self) -> Result<Inventory, SourceError> {
        self.reader(|r| r.inventory())
    }

    fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
        self.reader(|r| r.sample(now_ms))
    }
}

/// The event thread: registers every GPU that supports them for Xid and ECC double-bit
/// events, then waits on the set (with a timeout, to notice `stop`) and forwards what
/// arrives to the sampler.
fn watch_events(nvml: &Nvml, gpus: u32, tx: &mpsc::Sender<Event>, stop: &AtomicBool) {
    let Some(set) = register_events(nvml, gpus) else {
        return;
    };
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        let timeout_ms = u32::try_from(EVENT_WAIT.as_millis()).unwrap_or(u32::MAX);
        match set.wait(timeout_ms) {
            Ok(data) => {
                let event = event_from(&data, gpufleet_core::config::now_ms());
                debug!(gpu = %event.gpu_uuid, kind = event.kind.as_str(), code = ?event.code, "NVML event");
                if tx.send(event).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                if !warned {
                    warned = true;
                    warn!(error = %e, "waiting for NVML events failed; retrying (further failures logged at debug)");
                } else {
                    debug!(error = %e, "waiting for NVML events failed");
                }
                std::thread::sleep(EVENT_WAIT);
            }
        }
    }
}

/// An event set with every GPU that supports Xid / double-bit ECC events registered;
/// `None` when no GPU does. (nvml-wrapper frees the set when a registration fails, so a
/// GPU that refuses is left out and the set is built again without it.)
fn register_events(nvml: &Nvml, gpus: u32) -> Option<EventSet<'_>> {
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut refused: Vec<u32> = Vec::new();
    'build: loop {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                info!(error = %e, "NVML events are not available; Xid and ECC events will not be reported");
                return None;
            }
        };
        let mut registered = 0;
        for index in (0..gpus).filter(|i| !refused.contains(i)) {
            let Ok(device) = nvml.device_by_index(index) else {
                continue;
            };
            let types = match device.supported_event_types() {
                Ok(t) => t & wanted,
                Err(_) => continue,
            };
            if types.is_empty() {
                continue;
            }
            match device.register_events(types, set) {
                Ok(s) => {
                    set = s;
                    registered += 1;
                }
                Err(e) => {
                    warn!(gpu = index, error = %e.error, "cannot register for NVML events; this GPU's Xid and ECC events will not be reported");
                    refused.push(index);
                    continue 'build;
                }
            }
        }
        if registered == 0 {
            info!("no GPU supports Xid / ECC events");
            return None;
        }
        return Some(set);
    }
}

/// The domain event for what an event set delivered.
fn event_from(data: &EventData<'_>, now_ms: UnixMs) -> Event {
    let gpu_uuid = data.device.uuid().unwrap_or_default();
    let (kind, code, detail) = if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
        let code = match data.event_data {
            Some(XidError::Value(v)) => Some(v),
            _ => None,
        };
        let detail = code.map_or_else(
            || "Xid critical error (unknown code)".to_owned(),
            |c| format!("Xid {c}"),
        );
        (EventKind::Xid, code, detail)
    } else if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        (
            EventKind::EccDoubleBit,
            None,
            "ECC double-bit (uncorrectable) memory error".to_owned(),
        )
    } else {
        (
            EventKind::EccSingleBit,
            None,
            format!("NVML event {:#x}", data.event_type.bits()),
        )
    };
    Event {
        time_ms: now_ms,
        gpu_uuid,
        kind,
        code,
        detail,
    }
}

/// A per-tick NVML query; the unit of "unsupported, don't ask again".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    Utilization,
    Memory,
    Power,
    PowerLimit,
    Energy,
    TempGpu,
    Fan,
    ClockSm,
    ClockMem,
    ClockGraphics,
    Pstate,
    PcieTx,
    PcieRx,
    EccCorrected,
    EccUncorrected,
    Throttle,
    Encoder,
    Decoder,
    ComputeProcs,
    GraphicsProcs,
    ProcessUtil,
    FieldValues,
}

impl Metric {
    /// The call's name, as it appears in logs and in `slowest_calls_us`.
    fn call(self) -> &'static str {
        match self {
            Self::Utilization => "utilization_rates",
            Self::Memory => "memory_info",
            Self::Power => "power_usage",
            Self::PowerLimit => "enforced_power_limit",
            Self::Energy => "total_energy_consumption",
            Self::TempGpu => "temperature",
            Self::Fan => "fan_speed",
            Self::ClockSm => "clock_info.sm",
            Self::ClockMem => "clock_info.mem",
            Self::ClockGraphics => "clock_info.graphics",
            Self::Pstate => "performance_state",
            Self::PcieTx => "pcie_throughput.tx",
            Self::PcieRx => "pcie_throughput.rx",
            Self::EccCorrected => "total_ecc_errors.corrected",
            Self::EccUncorrected => "total_ecc_errors.uncorrected",
            Self::Throttle => "current_throttle_reasons",
            Self::Encoder => "encoder_utilization",
            Self::Decoder => "decoder_utilization",
            Self::ComputeProcs => "running_compute_processes",
            Self::GraphicsProcs => "running_graphics_processes",
            Self::ProcessUtil => "process_utilization_stats",
            Self::FieldValues => "field_values",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// A set of [`Metric`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct MetricSet(u32);

impl MetricSet {
    fn contains(self, m: Metric) -> bool {
        self.0 & m.bit() != 0
    }

    fn insert(&mut self, m: Metric) {
        self.0 |= m.bit();
    }
}

/// One GPU: its cached handle and what we learned about it.
struct DeviceState<'n> {
    /// The handle, looked up once.
    device: Device<'n>,
    /// NVML index.
    index: u32,
    /// UUID: the key of all its samples.
    uuid: String,
    /// Metrics this device answered NOT_SUPPORTED (or no permission) for: never asked again.
    unsupported: MetricSet,
    /// Metrics whose transient failure was already logged at `warn` (later ones: `debug`).
    warned: MetricSet,
    /// Timestamp (µs) of the newest per-process utilization sample seen, passed to the next
    /// call so it returns only newer samples (0 would return a long-window average).
    last_util_ts: u64,
    /// The device fell off the bus: its values are absent; a `GpuLost` event was sent.
    /// Probed once per tick until it answers again.
    lost: bool,
    /// Entries still asked in the batched field-value call (an entry the device answers
    /// NOT_SUPPORTED for is removed).
    fields: Vec<FieldKey>,
    /// Its active NVLink links, found once.
    links: Vec<u32>,
    /// The previous reading (KiB, tick time) of each NVLink counter, for its rate.
    nvlink_prev: BTreeMap<FieldKey, (u64, UnixMs)>,
    /// Its MIG devices (MIG enabled), found once.
    migs: Vec<MigDevice<'n>>,
}

/// A MIG device of a GPU.
struct MigDevice<'n> {
    /// Its handle, for its process list.
    device: Device<'n>,
    /// What the inventory reports.
    info: MigInstance,
}

/// The MIG devices of a GPU with MIG enabled (none otherwise).
fn discover_migs<'n>(device: &Device<'n>, index: u32) -> Vec<MigDevice<'n>> {
    if !device.mig_mode().is_ok_and(|m| m.current == 1) {
        return Vec::new();
    }
    let max = match device.mig_device_count() {
        Ok(n) => n,
        Err(e) => {
            warn!(gpu = index, error = %e, "MIG is enabled but its devices cannot be counted");
            return Vec::new();
        }
    };
    let mut migs = Vec::new();
    for k in 0..max {
        let mig = match device.mig_device_by_index(k) {
            Ok(m) => m,
            // An empty slot.
            Err(NvmlError::NotFound) => continue,
            Err(e) => {
                debug!(gpu = index, mig = k, error = %e, "cannot open MIG device");
                continue;
            }
        };
        let Ok(uuid) = mig.uuid() else { continue };
        let ids = mig.running_compute_processes().ok().and_then(|ps| {
            ps.iter()
                .find_map(|p| Some((p.gpu_instance_id?, p.compute_instance_id?)))
        });
        let info = MigInstance {
            uuid,
            gpu_instance_id: ids.map_or(NO_INSTANCE_ID, |i| i.0),
            compute_instance_id: ids.map_or(NO_INSTANCE_ID, |i| i.1),
            profile: mig.name().ok().as_deref().and_then(mig_profile),
            memory_total_bytes: mig.memory_info().ok().map(|m| m.total),
        };
        migs.push(MigDevice { device: mig, info });
    }
    info!(gpu = index, mig_devices = migs.len(), "MIG enabled");
    migs
}

/// pid → MIG device UUID for the processes in a GPU's MIG devices (one compute process
/// list per MIG device and tick).
fn mig_processes(dev: &DeviceState<'_>, timer: &mut CallTimer) -> HashMap<u32, String> {
    let mut by_pid = HashMap::new();
    if dev.lost {
        return by_pid;
    }
    for mig in &dev.migs {
        let start = Instant::now();
        let listed = retry_grown(|| mig.device.running_compute_processes());
        timer.record(dev.index, "mig.running_compute_processes", start.elapsed());
        match listed {
            Ok(procs) => {
                for p in procs {
                    by_pid.insert(p.pid, mig.info.uuid.clone());
                }
            }
            Err(e) => {
                debug!(gpu = dev.index, mig = %mig.info.uuid, error = %e, "MIG process list failed")
            }
        }
    }
    by_pid
}

/// Everything the NVML source keeps between ticks.
struct Reader<'n> {
    /// The library (for system-level queries).
    nvml: &'n Nvml,
    /// One entry per GPU that could be opened, in NVML index order.
    devices: Vec<DeviceState<'n>>,
    /// Where `/proc` is.
    proc_root: PathBuf,
    /// Node name, for the inventory.
    hostname: String,
    /// uid → login name, read once.
    users: UserNames,
    /// Identity of each pid seen on a GPU, kept while the pid stays on a GPU (so `/proc`
    /// is read once per process, not once per tick).
    identities: HashMap<u32, ProcessIdentity>,
    /// Events from the event thread, reported in the next tick.
    events: mpsc::Receiver<Event>,
}

impl<'n> Reader<'n> {
    fn open(
        nvml: &'n Nvml,
        opts: NvmlOptions,
        events: mpsc::Receiver<Event>,
    ) -> Result<Self, SourceError> {
        let count = nvml.device_count().map_err(|e| SourceError::Nvml {
            call: "device_count",
            reason: e.to_string(),
        })?;
        let mut devices = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    warn!(gpu = index, error = %e, "cannot open GPU; it will not be monitored");
                    continue;
                }
            };
            let uuid = match device.uuid() {
                Ok(u) => u,
                Err(e) => {
                    warn!(gpu = index, error = %e, "cannot read GPU UUID; it will not be monitored");
                    continue;
                }
            };
            let migs = discover_migs(&device, index);
            let links = active_nvlinks(&device);
            devices.push(DeviceState {
                migs,
                device,
                index,
                uuid,
                unsupported: MetricSet::default(),
                warned: MetricSet::default(),
                last_util_ts: 0,
                lost: false,
                fields: field_batch(&links),
                links,
                nvlink_prev: BTreeMap::new(),
            });
        }
        Ok(Self {
            nvml,
            devices,
            users: UserNames::for_proc_root(&opts.proc_root),
            proc_root: opts.proc_root,
            hostname: opts.hostname,
            identities: HashMap::new(),
            events,
        })
    }

    fn inventory(&mut self) -> Inventory {
        let gpus = self
            .devices
            .iter()
            .map(|s| {
                let d = &s.device;
                let limits = d.power_management_limit_constraints().ok();
                let cc = d.cuda_compute_capability().ok();
                GpuInfo {
                    index: s.index,
                    uuid: s.uuid.clone(),
                    name: d.name().unwrap_or_else(|_| "unknown NVIDIA GPU".into()),
                    serial: d.serial().ok(),
                    pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
                    architecture: d.architecture().ok().map(|a| a.to_string()),
                    brand: d.brand().ok().map(brand_name),
                    memory_total_bytes: d.memory_info().ok().map(|m| m.total),
                    power_limit_default_mw: d.power_management_limit_default().ok(),
                    power_limit_enforced_mw: d.enforced_power_limit().ok(),
                    power_limit_min_mw: limits.as_ref().map(|l| l.min_limit),
                    power_limit_max_mw: limits.as_ref().map(|l| l.max_limit),
                    max_clock_sm_mhz: d.max_clock_info(Clock::SM).ok(),
                    max_clock_mem_mhz: d.max_clock_info(Clock::Memory).ok(),
                    max_clock_graphics_mhz: d.max_clock_info(Clock::Graphics).ok(),
                    nvlink_count: u32::try_from(s.links.len()).ok(),
                    mig_enabled: d.mig_mode().ok().map(|m| m.current == 1),
                    compute_mode: d
                        .compute_mode()
                        .ok()
                        .map(|m| compute_mode_name(m).to_owned()),
                    persistence_mode: d.is_in_persistent_mode().ok(),
                    cuda_capability_major: cc.as_ref().and_then(|c| u32::try_from(c.major).ok()),
                    cuda_capability_minor: cc.as_ref().and_then(|c| u32::try_from(c.minor).ok()),
                    pcie_link_gen_max: d.max_pcie_link_gen().ok(),
                    pcie_link_width_max: d.max_pcie_link_width().ok(),
                    vbios_version: d.vbios_version().ok(),
                    mig_instances: s.migs.iter().map(|m| m.info.clone()).collect(),
                }
            })
            .collect();
        Inventory {
            driver_version: self.nvml.sys_driver_version().ok(),
            cuda_driver_version: self
                .nvml
                .sys_cuda_driver_version()
                .ok()
                .map(cuda_version_string),
            nvml_version: self.nvml.sys_nvml_version().ok(),
            gpus,
            host: host::host_info(&self.proc_root, &self.hostname),
        }
    }

    fn sample(&mut self, now_ms: UnixMs) -> Tick {
        let cpu_start = thread_cpu_time();
        let mut timer = CallTimer::new();
        let mut tick = Tick {
            time_ms: now_ms,
            gpus: Vec::with_capacity(self.devices.len()),
            ..Default::default()
        };
        let mut seen_pids = Vec::new();
        for dev in &mut self.devices {
            if dev.lost && probe_lost(self.nvml, dev, &mut timer) {
                info!(gpu = dev.index, uuid = %dev.uuid, "GPU answers again; sampling it");
                tick.events.push(Event {
                    time_ms: now_ms,
                    gpu_uuid: dev.uuid.clone(),
                    kind: EventKind::GpuRecovered,
                    code: None,
                    detail: format!("GPU {} answers again", dev.index),
                });
            }
            let was_lost = dev.lost;
            let (sample, procs) = sample_device(dev, &mut timer, now_ms);
            let mig_of = mig_processes(dev, &mut timer);
            if dev.lost && !was_lost {
                tick.events.push(Event {
                    time_ms: now_ms,
                    gpu_uuid: dev.uuid.clone(),
                    kind: EventKind::GpuLost,
                    code: None,
                    detail: format!(
                        "GPU {} has fallen off the bus or is otherwise inaccessible",
                        dev.index
                    ),
                });
            }
            for p in procs {
                seen_pids.push(p.pid);
                let id = self
                    .identities
                    .entry(p.pid)
                    .or_insert_with(|| cgroup::identify_with(&self.proc_root, p.pid, &self.users));
                tick.processes.push(ProcessSample {
                    gpu_uuid: dev.uuid.clone(),
                    pid: p.pid,
                    process_type: p.process_type,
                    user: id.user.clone(),
                    command: id.command.clone(),
                    gpu_mem_bytes: p.used_bytes,
                    sm_util_pct: p.sm_pct,
                    mem_util_pct: p.mem_pct,
                    enc_util_pct: p.enc_pct,
                    dec_util_pct: p.dec_pct,
                    workload: id.workload.clone(),
                    mig_uuid: mig_of.get(&p.pid).cloned(),
                });
            }
            tick.gpus.push(sample);
        }
        self.identities.retain(|pid, _| seen_pids.contains(pid));
        tick.events.extend(self.events.try_iter().map(|mut e| {
            e.time_ms = e.time_ms.min(now_ms);
            e
        }));
        tick.cost = Some(SamplerCost {
            cpu_us: Some(micros(thread_cpu_time().saturating_sub(cpu_start))),
            wall_us: None,
            source_us: Some(micros(timer.total())),
            slowest_calls_us: timer.slowest_us(),
        });
        tick
    }
}

/// Calls NVML for `metric` unless the device said it does not support it; times the call
/// and turns its error into an absent value (remembering NOT_SUPPORTED).
fn read<'n, T>(
    dev: &mut DeviceState<'n>,
    timer: &mut CallTimer,
    metric: Metric,
    call: impl FnOnce(&Device<'n>) -> Result<T, NvmlError>,
) -> Option<T> {
    if dev.lost || dev.unsupported.contains(metric) {
        return None;
    }
    let start = Instant::now();
    let result = call(&dev.device);
    timer.record(dev.index, metric.call(), start.elapsed());
    match classify(result) {
        Reading::Value(v) => Some(v),
        Reading::Unsupported(why) => {
            dev.unsupported.insert(metric);
            debug!(gpu = dev.index, call = metric.call(), reason = %why, "not supported; the value stays absent");
            None
        }
        Reading::Lost => {
            dev.lost = true;
            warn!(gpu = dev.index, uuid = %dev.uuid, call = metric.call(), "GPU lost; its values are absent from now on");
            None
        }
        Reading::Failed(why) => {
            if dev.warned.contains(metric) {
                debug!(gpu = dev.index, call = metric.call(), error = %why, "NVML call failed");
            } else {
                dev.warned.insert(metric);
                warn!(gpu = dev.index, call = metric.call(), error = %why, "NVML call failed; the value is absent this tick (further failures logged at debug)");
            }
            None
        }
    }
}

/// One device's tick: its sample and its processes.
fn sample_device(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    now_ms: UnixMs,
) -> (GpuSample, Vec<GpuProcess>) {
    let util = read(dev, timer, Metric::Utilization, |d| d.utilization_rates());
    let mem = read(dev, timer, Metric::Memory, |d| d.memory_info()).map(|m| memory_fields(&m));
    let power_mw = read(dev, timer, Metric::Power, |d| d.power_usage());
    let power_limit_mw = read(dev, timer, Metric::PowerLimit, |d| d.enforced_power_limit());
    let energy_mj = read(dev, timer, Metric::Energy, |d| d.total_energy_consumption());
    let temp_gpu_c = read(dev, timer, Metric::TempGpu, |d| {
        d.temperature(TemperatureSensor::Gpu)
    });
    let fan_pct = read(dev, timer, Metric::Fan, |d| d.fan_speed(0)).map(pct);
    let clock_sm_mhz = read(dev, timer, Metric::ClockSm, |d| d.clock_info(Clock::SM));
    let clock_mem_mhz = read(dev, timer, Metric::ClockMem, |d| {
        d.clock_info(Clock::Memory)
    });
    let clock_graphics_mhz = read(dev, timer, Metric::ClockGraphics, |d| {
        d.clock_info(Clock::Graphics)
    });
    let pstate =
        read(dev, timer, Metric::Pstate, |d| d.performance_state()).and_then(pstate_number);
    let pcie_tx_bps = read(dev, timer, Metric::PcieTx, |d| {
        d.pcie_throughput(PcieUtilCounter::Send)
    })
    .map(pcie_kib_to_bps);
    let pcie_rx_bps = read(dev, timer, Metric::PcieRx, |d| {
        d.pcie_throughput(PcieUtilCounter::Receive)
    })
    .map(pcie_kib_to_bps);
    let ecc_corrected = read(dev, timer, Metric::EccCorrected, |d| {
        d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
    });
    let ecc_uncorrected = read(dev, timer, Metric::EccUncorrected, |d| {
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
    });
    let throttle = read(dev, timer, Metric::Throttle, |d| {
        d.current_throttle_reasons()
    })
    .map(throttle_bits);
    let enc =
        read(dev, timer, Metric::Encoder, |d| d.encoder_utilization()).map(|u| pct(u.utilization));
    let dec =
        read(dev, timer, Metric::Decoder, |d| d.decoder_utilization()).map(|u| pct(u.utilization));
    let fields = read_fields(dev, timer, now_ms);
    let compute = read(dev, timer, Metric::ComputeProcs, |d| {
        retry_grown(|| d.running_compute_processes())
    });
    let graphics = read(dev, timer, Metric::GraphicsProcs, |d| {
        retry_grown(|| d.running_graphics_processes())
    });
    let since = if dev.last_util_ts == 0 {
        // First call: the last second, not the driver's whole buffer.
        (now_ms.max(1000) as u64 - 1000) * 1000
    } else {
        dev.last_util_ts
    };
    let util_samples = read(dev, timer, Metric::ProcessUtil, |d| {
        match d.process_utilization_stats(since) {
            // NOT_FOUND: no process had a sample since `since`.
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            other => other,
        }
    });
    if let Some(newest) = util_samples
        .as_ref()
        .and_then(|s| s.iter().map(|u| u.timestamp).max())
    {
        dev.last_util_ts = newest.max(dev.last_util_ts);
    }
    let processes = merge_processes(
        compute.as_deref().unwrap_or(&[]),
        graphics.as_deref().unwrap_or(&[]),
        util_samples.as_deref(),
    );
    let sample = GpuSample {
        gpu_uuid: dev.uuid.clone(),
        util_gpu_pct: util.as_ref().map(|u| pct(u.gpu)),
        util_mem_pct: util.as_ref().map(|u| pct(u.memory)),
        mem_used_bytes: mem.map(|m| m.used),
        mem_total_bytes: mem.map(|m| m.total),
        mem_reserved_bytes: mem.map(|m| m.reserved),
        power_mw,
        power_instant_mw: fields.power_instant_mw,
        power_limit_mw,
        energy_mj,
        temp_gpu_c,
        temp_mem_c: fields.temp_mem_c,
        fan_pct,
        clock_sm_mhz,
        clock_mem_mhz,
        clock_graphics_mhz,
        pstate,
        pcie_tx_bps,
        pcie_rx_bps,
        nvlink_tx_bps: fields.nvlink_tx_bps,
        nvlink_rx_bps: fields.nvlink_rx_bps,
        nvlinks: fields.nvlinks,
        ecc_corrected_volatile: ecc_corrected,
        ecc_uncorrected_volatile: ecc_uncorrected,
        throttle_reasons: throttle,
        enc_util_pct: enc,
        dec_util_pct: dec,
    };
    (sample, processes)
}

/// Asks a lost GPU, through a fresh handle, whether it answers again; on success the
/// handle replaces the old one and the GPU is sampled from this tick on.
fn probe_lost<'n>(nvml: &'n Nvml, dev: &mut DeviceState<'n>, timer: &mut CallTimer) -> bool {
    let start = Instant::now();
    let fresh = nvml
        .device_by_uuid(dev.uuid.as_str())
        .and_then(|d| d.uuid().map(|_| d));
    timer.record(dev.index, "probe_lost", start.elapsed());
    match fresh {
        Ok(device) => {
            dev.device = device;
            dev.lost = false;
            true
        }
        Err(e) => {
            debug!(gpu = dev.index, error = %e, "GPU still lost");
            false
        }
    }
}

/// A process list asked again (up to [`LIST_ATTEMPTS`] times) when it grew between
/// NVML's size query and the fill.
fn retry_grown<T>(
    mut list: impl FnMut() -> Result<Vec<T>, NvmlError>,
) -> Result<Vec<T>, NvmlError> {
    let mut result = list();
    for _ in 1..LIST_ATTEMPTS {
        if !matches!(result, Err(NvmlError::InsufficientSize(_))) {
            break;
        }
        result = list();
    }
    result
}

/// What the batched field values gave this tick.
#[derive(Debug, Default)]
struct FieldValues {
    power_instant_mw: Option<u32>,
    temp_mem_c: Option<u32>,
    nvlink_tx_bps: Option<u64>,
    nvlink_rx_bps: Option<u64>,
    nvlinks: Vec<NvLinkSample>,
}

/// The batched field values: instant power (mW), memory temperature (°C) and the NVLink
/// data counters (summed and per active link), turned into rates. Entries the device
/// does not support are dropped from the batch; once none is left, the call is not made
/// again.
fn read_fields(dev: &mut DeviceState<'_>, timer: &mut CallTimer, now_ms: UnixMs) -> FieldValues {
    if dev.fields.is_empty() {
        return FieldValues::default();
    }
    let keys = dev.fields.clone();
    let Some(samples) = read(dev, timer, Metric::FieldValues, |d| {
        field_values_scoped(d, &keys)
    }) else {
        if dev.unsupported.contains(Metric::FieldValues) {
            dev.fields.clear();
        }
        return FieldValues::default();
    };
    let (values, unsupported) = field_readings(&keys, &samples);
    if !unsupported.is_empty() {
        debug!(gpu = dev.index, fields = ?unsupported, "field values not supported; not asked again");
        dev.fields.retain(|f| !unsupported.contains(f));
    }
    let rates = counter_rates(&mut dev.nvlink_prev, &values, now_ms);
    let (nvlink_tx_bps, nvlink_rx_bps, nvlinks) = nvlink_samples(&dev.links, &rates);
    let scalar = |field| {
        values
            .get(&FieldKey { field, scope: 0 })
            .and_then(|v| u32::try_from(*v).ok())
    };
    FieldValues {
        power_instant_mw: scalar(NVML_FI_DEV_POWER_INSTANT),
        temp_mem_c: scalar(NVML_FI_DEV_MEMORY_TEMP),
        nvlink_tx_bps,
        nvlink_rx_bps,
        nvlinks,
    }
}

/// `nvmlDeviceGetFieldValues` with each entry's `scopeId` set: nvml-wrapper 0.13's
/// `Device::field_values_for` always sends 0, and NVLink fields take the link there. The
/// answers are in the order of `keys`; a failure of the whole call is the error, and each
/// entry carries its own result (as in nvml-wrapper). The ids are sent as they are:
/// nvml-wrapper's driver-dependent id remapping touches only ids 251–273, none of ours.
#[allow(unsafe_code)]
fn field_values_scoped(
    device: &Device<'_>,
    keys: &[FieldKey],
) -> Result<Vec<Result<FieldValueSample, NvmlError>>, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetFieldValues.as_ref())?;
    let count = c_int::try_from(keys.len()).map_err(|_| NvmlError::InvalidArg)?;
    let mut raw: Vec<nvmlFieldValue_t> = keys
        .iter()
        .map(|k| nvmlFieldValue_t {
            fieldId: k.field,
            scopeId: k.scope,
            timestamp: 0,
            latencyUsec: 0,
            valueType: 0,
            nvmlReturn: 0,
            value: nvmlValue_t { ullVal: 0 },
        })
        .collect();
    // SAFETY: `sym` is `nvmlDeviceGetFieldValues` from the library `device`'s `Nvml`
    // loaded and initialised, and its signature is nvml-wrapper-sys's binding of nvml.h
    // (the same one nvml-wrapper calls). `device.handle()` is valid: `Device<'_>` borrows
    // that `Nvml`, so NVML is not shut down while the handle lives. `raw` is a live,
    // exclusively borrowed array of exactly `count` `nvmlFieldValue_t` (nvml-wrapper-sys's
    // `#[repr(C)]` layout of the C struct), which NVML reads and writes only within those
    // `count` entries; nothing else aliases it during the call.
    let code = unsafe { sym(device.handle(), count, raw.as_mut_ptr()) };
    nvml_try(code)?;
    Ok(raw.into_iter().map(FieldValueSample::try_from).collect())
}

/// The active NVLink links (none on boards without NVLink).
fn active_nvlinks(d: &Device<'_>) -> Vec<u32> {
    let mut links = Vec::new();
    for link in 0..MAX_NVLINKS {
        match d.link_wrapper_for(link).is_active() {
            Ok(true) => links.push(link),
            Ok(false) => {}
            Err(_) => break,
        }
    }
    links
}

// ------------------------------------------------------------------ pure mappings

/// What an NVML call's result means for the value.
#[derive(Debug, PartialEq)]
pub enum Reading<T> {
    /// A value.
    Value(T),
    /// The device (or this driver / library) cannot report it: absent, and not asked again.
    Unsupported(String),
    /// The GPU fell off the bus.
    Lost,
    /// A transient failure: absent this tick, asked again next tick.
    Failed(String),
}

/// Classifies an NVML result. NOT_SUPPORTED, a function missing from the driver or the
/// library, and no permission do not change at run time: they make the value absent for
/// good. GPU_LOST is its own case. Anything else is transient.
pub fn classify<T>(r: Result<T, NvmlError>) -> Reading<T> {
    match r {
        Ok(v) => Reading::Value(v),
        Err(
            e @ (NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::NoPermission),
        ) => Reading::Unsupported(e.to_string()),
        Err(NvmlError::GpuLost) => Reading::Lost,
        Err(e) => Reading::Failed(e.to_string()),
    }
}

/// P-state number (0 = highest performance); `None` for NVML's "unknown".
pub fn pstate_number(p: PerformanceState) -> Option<u32> {
    use PerformanceState as P;
    Some(match p {
        P::Zero => 0,
        P::One => 1,
        P::Two => 2,
        P::Three => 3,
        P::Four => 4,
        P::Five => 5,
        P::Six => 6,
        P::Seven => 7,
        P::Eight => 8,
        P::Nine => 9,
        P::Ten => 10,
        P::Eleven => 11,
        P::Twelve => 12,
        P::Thirteen => 13,
        P::Fourteen => 14,
        P::Fifteen => 15,
        P::Unknown => return None,
    })
}

/// One entry of the field-value batch: NVML field id and `scopeId` (the link for NVLink
/// fields, [`ALL_LINKS`] for their sum, 0 for device-wide fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldKey {
    /// `NVML_FI_*`.
    pub field: u32,
    /// `scopeId`.
    pub scope: u32,
}

/// The batch for a GPU with these active NVLink links: instant power, memory
/// temperature and, with links, NVLink data TX and RX summed and per link.
pub fn field_batch(links: &[u32]) -> Vec<FieldKey> {
    let mut keys: Vec<FieldKey> = FIELDS
        .iter()
        .map(|&field| FieldKey { field, scope: 0 })
        .collect();
    if !links.is_empty() {
        for scope in std::iter::once(ALL_LINKS).chain(links.iter().copied()) {
            for field in [
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            ] {
                keys.push(FieldKey { field, scope });
            }
        }
    }
    keys
}

/// The values of a field-value batch (entry → value; `samples[k]` answers `keys[k]`) and
/// the entries the device answered NOT_SUPPORTED (or no permission) for. Other per-entry
/// failures are absent this tick and asked again.
pub fn field_readings(
    keys: &[FieldKey],
    samples: &[Result<FieldValueSample, NvmlError>],
) -> (BTreeMap<FieldKey, u64>, Vec<FieldKey>) {
    let mut values = BTreeMap::new();
    let mut unsupported = Vec::new();
    for (key, s) in keys.iter().zip(samples) {
        let Ok(s) = s else { continue };
        match &s.value {
            Ok(v) => {
                if let Some(v) = sample_u64(v) {
                    values.insert(*key, v);
                }
            }
            Err(NvmlError::NotSupported | NvmlError::NoPermission) => unsupported.push(*key),
            Err(_) => {}
        }
    }
    (values, unsupported)
}

/// A field value as an unsigned number, if it is one (negative, NaN and out-of-range
/// values are absent).
pub fn sample_u64(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        // `u64::MAX as f64` is 2^64, the first value past u64's range.
        SampleValue::F64(v) if v.is_finite() && (0.0..u64::MAX as f64).contains(&v) => {
            Some(v.round() as u64)
        }
        SampleValue::F64(_) => None,
    }
}

/// A field value as an unsigned 32-bit number, if it is one.
pub fn sample_u32(v: &SampleValue) -> Option<u32> {
    sample_u64(v).and_then(|v| u32::try_from(v).ok())
}

/// The byte rate of a KiB counter read `kib` at `now_ms`, from its previous reading;
/// `None` on the first reading, when no time passed, or when the counter went backwards
/// (reset): a rate is never made up.
pub fn counter_rate_bps(prev: Option<(u64, UnixMs)>, kib: u64, now_ms: UnixMs) -> Option<u64> {
    let (prev_kib, prev_ms) = prev?;
    let dt_ms = u64::try_from(now_ms.checked_sub(prev_ms)?)
        .ok()
        .filter(|d| *d > 0)?;
    let delta = kib.checked_sub(prev_kib)?;
    u64::try_from(u128::from(delta) * 1024 * 1000 / u128::from(dt_ms)).ok()
}

/// The rates of this tick's NVLink counter readings (bytes/s), remembering each reading
/// in `prev` for the next tick. A counter not read this tick keeps its older reading, so
/// its next rate spans both ticks.
pub fn counter_rates(
    prev: &mut BTreeMap<FieldKey, (u64, UnixMs)>,
    values: &BTreeMap<FieldKey, u64>,
    now_ms: UnixMs,
) -> BTreeMap<FieldKey, u64> {
    let mut rates = BTreeMap::new();
    for (key, kib) in values.iter().filter(|(k, _)| {
        k.field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
            || k.field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    }) {
        if let Some(bps) = counter_rate_bps(prev.get(key).copied(), *kib, now_ms) {
            rates.insert(*key, bps);
        }
        prev.insert(*key, (*kib, now_ms));
    }
    rates
}

/// The summed NVLink TX / RX rates and one sample per link that has a rate (a link with
/// neither is left out: absent, not zero).
pub fn nvlink_samples(
    links: &[u32],
    rates: &BTreeMap<FieldKey, u64>,
) -> (Option<u64>, Option<u64>, Vec<NvLinkSample>) {
    let rate = |field, scope| rates.get(&FieldKey { field, scope }).copied();
    let (tx, rx) = (
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    );
    let per_link = links
        .iter()
        .filter_map(|&link| {
            let (tx_bps, rx_bps) = (rate(tx, link), rate(rx, link));
            (tx_bps.is_some() || rx_bps.is_some()).then_some(NvLinkSample {
                link,
                tx_bps,
                rx_bps,
            })
        })
        .collect();
    (rate(tx, ALL_LINKS), rate(rx, ALL_LINKS), per_link)
}

/// A MIG device's profile from its name: `NVIDIA A100-SXM4-80GB MIG 3g.40gb` → `3g.40gb`.
pub fn mig_profile(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then(|| profile.to_owned())
}

/// The clock event (throttle) reason bit mask, as NVML defines the bits.
pub fn throttle_bits(r: ThrottleReasons) -> u64 {
    r.bits()
}

/// The process type from which lists the pid appeared in.
pub fn process_type(in_compute: bool, in_graphics: bool) -> ProcessType {
    match (in_compute, in_graphics) {
        (true, true) => ProcessType::ComputeAndGraphics,
        (false, true) => ProcessType::Graphics,
        _ => ProcessType::Compute,
    }
}

/// Memory as reported: used / total / reserved bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemFields {
    /// Allocated by processes and the driver (v2: excludes reserved).
    pub used: u64,
    /// Installed.
    pub total: u64,
    /// Reserved by the driver, never allocatable.
    pub reserved: u64,
}

/// The fields of NVML's v2 memory info.
pub fn memory_fields(m: &MemoryInfo) -> MemFields {
    MemFields {
        used: m.used.min(m.total),
        total: m.total,
        reserved: m.reserved,
    }
}

/// A process's GPU memory; `None` when NVML says it is not available (e.g. under WDDM).
pub fn used_memory(m: &UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(*b),
        UsedGpuMemory::Unavailable => None,
    }
}

/// PCIe throughput: NVML reports KiB/s over the last 20 ms.
pub fn pcie_kib_to_bps(kib: u32) -> u64 {
    u64::from(kib) * 1024
}

/// A percentage clamped to 100 (a few boards report fan speeds above 100 %).
pub fn pct(v: u32) -> u32 {
    v.min(100)
}

/// `12040` → `"12.4"`.
pub fn cuda_version_string(v: i32) -> String {
    format!(
        "{}.{}",
        nvml_wrapper::cuda_driver_version_major(v),
        nvml_wrapper::cuda_driver_version_minor(v)
    )
}

/// The brand as users know it.
pub fn brand_name(b: Brand) -> String {
    match b {
        Brand::Nvidia => "NVIDIA".into(),
        Brand::Tesla => "Tesla".into(),
        Brand::Quadro => "Quadro".into(),
        Brand::GeForce => "GeForce".into(),
        Brand::NvidiaRTX => "NVIDIA RTX".into(),
        Brand::Titan => "Titan".into(),
        Brand::Unknown => "Unknown".into(),
        other => format!("{other:?}"),
    }
}

/// The compute mode's name.
pub fn compute_mode_name(m: ComputeMode) -> &'static str {
    match m {
        ComputeMode::Default => "Default",
        ComputeMode::ExclusiveThread => "Exclusive_Thread",
        ComputeMode::Prohibited => "Prohibited",
        ComputeMode::ExclusiveProcess => "Exclusive_Process",
    }
}

/// One process on one GPU, merged from NVML's lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u32,
    /// Which lists it was in.
    pub process_type: ProcessType,
    /// GPU memory it holds.
    pub used_bytes: Option<u64>,
    /// SM utilization since the last call.
    pub sm_pct: Option<u32>,
    /// Memory-bandwidth utilization since the last call.
    pub mem_pct: Option<u32>,
    /// Encoder utilization since the last call.
    pub enc_pct: Option<u32>,
    /// Decoder utilization since the last call.
    pub dec_pct: Option<u32>,
}

/// Merges the compute and graphics process lists (a pid in both is
/// compute-and-graphics) with the per-process utilization samples, ordered by pid.
///
/// `util` is `None` when utilization could not be read: utilizations are then absent.
/// When it was read, NVML lists only processes that were busy during the period, so a
/// process missing from it was idle: 0. Several samples of one pid: the newest wins.
pub fn merge_processes(
    compute: &[ProcessInfo],
    graphics: &[ProcessInfo],
    util: Option<&[ProcessUtilizationSample]>,
) -> Vec<GpuProcess> {
    let mut by_pid: BTreeMap<u32, (bool, bool, Option<u64>)> = BTreeMap::new();
    for (list, is_compute) in [(compute, true), (graphics, false)] {
        for p in list {
            let e = by_pid.entry(p.pid).or_insert((false, false, None));
            if is_compute {
                e.0 = true;
            } else {
                e.1 = true;
            }
            e.2 = match (e.2, used_memory(&p.used_gpu_memory)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
    }
    let mut newest: BTreeMap<u32, &ProcessUtilizationSample> = BTreeMap::new();
    for s in util.unwrap_or(&[]) {
        let e = newest.entry(s.pid).or_insert(s);
        if s.timestamp > e.timestamp {
            *e = s;
        }
    }
    by_pid
        .into_iter()
        .map(|(pid, (c, g, used))| {
            let u = newest.get(&pid);
            let field = |f: fn(&ProcessUtilizationSample) -> u32| -> Option<u32> {
                util.map(|_| u.map_or(0, |s| pct(f(s))))
            };
            GpuProcess {
                pid,
                process_type: process_type(c, g),
                used_bytes: used,
                sm_pct: field(|s| s.sm_util),
                mem_pct: field(|s| s.mem_util),
                enc_pct: field(|s| s.enc_util),
                dec_pct: field(|s| s.dec_util),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper::structs::device::FieldId;

    fn proc_info(pid: u32, used: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used.map_or(UsedGpuMemory::Unavailable, UsedGpuMemory::Used),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn util(pid: u32, ts: u64, sm: u32) -> ProcessUtilizationSample {
        ProcessUtilizationSample {
            pid,
            timestamp: ts,
            sm_util: sm,
            mem_util: sm / 2,
            enc_util: 0,
            dec_util: 7,
        }
    }

    #[test]
    fn errors_classify_into_absent_for_good_lost_or_transient() {
        assert_eq!(classify(Ok(5)), Reading::Value(5));
        for e in [
            NvmlError::NotSupported,
            NvmlError::FunctionNotFound,
            NvmlError::FailedToLoadSymbol("nvmlDeviceGetFanSpeed_v2".into()),
            NvmlError::NoPermission,
        ] {
            assert!(matches!(classify::<u32>(Err(e)), Reading::Unsupported(_)));
        }
        assert_eq!(classify::<u32>(Err(NvmlError::GpuLost)), Reading::Lost);
        for e in [
            NvmlError::Unknown,
            NvmlError::Timeout,
            NvmlError::InsufficientSize(None),
        ] {
            assert!(matches!(classify::<u32>(Err(e)), Reading::Failed(_)));
        }
    }

    #[test]
    fn field_values_map_to_numbers_and_unsupported_entries() {
        let sample = |id: u32, value: Result<SampleValue, NvmlError>| {
            Ok(FieldValueSample {
                field: FieldId(id),
                timestamp: 0,
                latency: 0,
                value,
            })
        };
        let key = |field, scope| FieldKey { field, scope };
        let keys = [
            key(186, 0),
            key(82, 0),
            key(90, 0),
            key(91, 0),
            key(92, 0),
            key(138, ALL_LINKS),
            key(138, 3),
            key(139, 3),
        ];
        let samples = [
            sample(186, Ok(SampleValue::U32(231_000))),
            sample(82, Err(NvmlError::NotSupported)),
            sample(90, Err(NvmlError::Unknown)),
            sample(91, Ok(SampleValue::I64(-1))),
            Err(NvmlError::UnexpectedVariant(9)),
            sample(138, Ok(SampleValue::U64(1 << 40))),
            sample(138, Ok(SampleValue::U64(7))),
            sample(139, Err(NvmlError::NotSupported)),
        ];
        let (values, unsupported) = field_readings(&keys, &samples);
        assert_eq!(
            values.into_iter().collect::<Vec<_>>(),
            [
                (key(138, 3), 7),
                (key(138, ALL_LINKS), 1 << 40),
                (key(186, 0), 231_000)
            ],
            "keyed by field and scope, 64-bit counters kept whole"
        );
        assert_eq!(
            unsupported,
            [key(82, 0), key(139, 3)],
            "transient failures are asked again"
        );
        assert_eq!(sample_u32(&SampleValue::U64(7)), Some(7));
        assert_eq!(sample_u32(&SampleValue::U64(u64::MAX)), None);
        assert_eq!(sample_u64(&SampleValue::U64(u64::MAX)), Some(u64::MAX));
        assert_eq!(sample_u32(&SampleValue::F64(41.6)), Some(42));
        assert_eq!(sample_u32(&SampleValue::F64(f64::NAN)), None);
        assert_eq!(sample_u64(&SampleValue::F64(-1.0)), None);
    }

    #[test]
    fn the_batch_asks_nvlink_summed_and_per_active_link() {
        let keys = field_batch(&[0, 2]);
        let pairs: Vec<(u32, u32)> = keys.iter().map(|k| (k.field, k.scope)).collect();
        assert_eq!(
            pairs,
            [
                (NVML_FI_DEV_POWER_INSTANT, 0),
                (NVML_FI_DEV_MEMORY_TEMP, 0),
                (138, ALL_LINKS),
                (139, ALL_LINKS),
                (138, 0),
                (139, 0),
                (138, 2),
                (139, 2),
            ]
        );
        assert_eq!(field_batch(&[]).len(), 2, "no links: no NVLink entries");
    }

    #[test]
    fn counter_rates_come_from_deltas_and_are_never_made_up() {
        assert_eq!(counter_rate_bps(None, 500, 1000), None, "first reading");
        assert_eq!(
            counter_rate_bps(Some((1000, 1000)), 3000, 3000),
            Some(1024 * 1000),
            "2000 KiB over 2 s"
        );
        assert_eq!(counter_rate_bps(Some((1000, 1000)), 1000, 2000), Some(0));
        assert_eq!(
            counter_rate_bps(Some((5000, 1000)), 10, 2000),
            None,
            "reset"
        );
        assert_eq!(counter_rate_bps(Some((1, 2000)), 9, 2000), None, "no time");
        assert_eq!(
            counter_rate_bps(Some((1, 3000)), 9, 2000),
            None,
            "clock back"
        );
        assert_eq!(
            counter_rate_bps(Some((0, 0)), u64::MAX, 1),
            None,
            "out of range"
        );

        let tx = |scope| FieldKey {
            field: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            scope,
        };
        let rx = |scope| FieldKey {
            field: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            scope,
        };
        let power = FieldKey {
            field: NVML_FI_DEV_POWER_INSTANT,
            scope: 0,
        };
        let mut prev = BTreeMap::new();
        let first = BTreeMap::from([(tx(ALL_LINKS), 100), (tx(1), 60), (rx(1), 10), (power, 5)]);
        assert!(counter_rates(&mut prev, &first, 1000).is_empty());
        assert!(!prev.contains_key(&power), "not a counter");
        // rx(1) not read this tick: its next rate spans two ticks.
        let second = BTreeMap::from([(tx(ALL_LINKS), 300), (tx(1), 160)]);
        let rates = counter_rates(&mut prev, &second, 2000);
        assert_eq!(rates.get(&tx(ALL_LINKS)), Some(&(200 * 1024)));
        let third = BTreeMap::from([(rx(1), 2010)]);
        let rates = counter_rates(&mut prev, &third, 3000);
        assert_eq!(rates.get(&rx(1)), Some(&(1000 * 1024)), "2000 KiB over 2 s");

        let rates = BTreeMap::from([(tx(ALL_LINKS), 9), (tx(1), 4), (rx(1), 5), (rx(2), 6)]);
        let (sum_tx, sum_rx, links) = nvlink_samples(&[0, 1, 2], &rates);
        assert_eq!((sum_tx, sum_rx), (Some(9), None));
        assert_eq!(
            links,
            [
                NvLinkSample {
                    link: 1,
                    tx_bps: Some(4),
                    rx_bps: Some(5)
                },
                NvLinkSample {
                    link: 2,
                    tx_bps: None,
                    rx_bps: Some(6)
                },
            ],
            "link 0 has no rate: left out, not zero"
        );
    }

    #[test]
    fn mig_profiles_come_from_the_device_name() {
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-80GB MIG 3g.40gb").as_deref(),
            Some("3g.40gb")
        );
        assert_eq!(
            mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me").as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(mig_profile("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(mig_profile("X MIG "), None);
    }

    #[test]
    fn process_lists_are_asked_again_when_they_grew() {
        let mut calls = 0;
        let r = retry_grown(|| {
            calls += 1;
            if calls < 3 {
                Err(NvmlError::InsufficientSize(None))
            } else {
                Ok(vec![1])
            }
        });
        assert_eq!((r.ok(), calls), (Some(vec![1]), 3));
        let mut calls = 0;
        let r: Result<Vec<u32>, _> = retry_grown(|| {
            calls += 1;
            Err(NvmlError::InsufficientSize(None))
        });
        assert!(r.is_err());
        assert_eq!(calls, LIST_ATTEMPTS, "bounded");
    }

    #[test]
    fn pstates_map_to_numbers_and_unknown_to_absent() {
        assert_eq!(pstate_number(PerformanceState::Zero), Some(0));
        assert_eq!(pstate_number(PerformanceState::Eight), Some(8));
        assert_eq!(pstate_number(PerformanceState::Fifteen), Some(15));
        assert_eq!(pstate_number(PerformanceState::Unknown), None);
    }

    #[test]
    fn throttle_reasons_keep_nvml_bits() {
        let r = ThrottleReasons::GPU_IDLE
            | ThrottleReasons::SW_POWER_CAP
            | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        assert_eq!(throttle_bits(r), 0x1 | 0x4 | 0x40);
        assert_eq!(throttle_bits(ThrottleReasons::empty()), 0);
        assert_eq!(
            throttle_bits(ThrottleReasons::SW_THERMAL_SLOWDOWN),
            gpufleet_sim::reasons::SW_THERMAL_SLOWDOWN,
            "the simulator uses the same bits"
        );
    }

    #[test]
    fn memory_and_small_conversions() {
        let m = MemoryInfo {
            free: 70,
            reserved: 5,
            total: 100,
            used: 25,
            version: 0,
        };
        assert_eq!(
            memory_fields(&m),
            MemFields {
                used: 25,
                total: 100,
                reserved: 5
            }
        );
        assert_eq!(used_memory(&UsedGpuMemory::Used(42)), Some(42));
        assert_eq!(used_memory(&UsedGpuMemory::Unavailable), None);
        assert_eq!(pcie_kib_to_bps(1000), 1_024_000);
        assert_eq!(pct(130), 100);
        assert_eq!(cuda_version_string(12040), "12.4");
        assert_eq!(cuda_version_string(11080), "11.8");
        assert_eq!(brand_name(Brand::Nvidia), "NVIDIA");
        assert_eq!(
            compute_mode_name(ComputeMode::ExclusiveProcess),
            "Exclusive_Process"
        );
        assert_eq!(process_type(true, false), ProcessType::Compute);
        assert_eq!(process_type(false, true), ProcessType::Graphics);
        assert_eq!(process_type(true, true), ProcessType::ComputeAndGraphics);
    }

    #[test]
    fn processes_merge_by_pid_with_the_newest_utilization() {
        let compute = [proc_info(300, Some(4 << 30)), proc_info(100, Some(1 << 30))];
        let graphics = [proc_info(100, Some(2 << 30)), proc_info(200, None)];
        let samples = [util(300, 10, 40), util(300, 20, 60), util(200, 15, 5)];
        let merged = merge_processes(&compute, &graphics, Some(&samples));
        let pids: Vec<u32> = merged.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [100, 200, 300]);
        assert_eq!(merged[0].process_type, ProcessType::ComputeAndGraphics);
        assert_eq!(merged[0].used_bytes, Some(2 << 30));
        assert_eq!(
            merged[0].sm_pct,
            Some(0),
            "not in the samples: idle during the period"
        );
        assert_eq!(merged[1].process_type, ProcessType::Graphics);
        assert_eq!(
            merged[1].used_bytes, None,
            "memory not available stays absent"
        );
        assert_eq!(merged[2].sm_pct, Some(60), "newest sample wins");
        assert_eq!(merged[2].dec_pct, Some(7));

        let no_util = merge_processes(&compute, &[], None);
        assert!(
            no_util
                .iter()
                .all(|p| p.sm_pct.is_none() && p.mem_pct.is_none())
        );
    }

    #[test]
    fn metric_sets_remember_members() {
        let mut s = MetricSet::default();
        assert!(!s.contains(Metric::Fan));
        s.insert(Metric::Fan);
        s.insert(Metric::ProcessUtil);
        assert!(s.contains(Metric::Fan) && s.contains(Metric::ProcessUtil));
        assert!(!s.contains(Metric::Power));
    }
}
