//! The per-tick reader: inventory, one sample per device, lost-GPU probing and the
//! NVML calls' error handling and timing.

use super::NvmlOptions;
use super::cadence::{Cadence, Due};
use super::device::{DeviceState, GpmState, Metric, MetricSet, read, settle, value_of};
use super::events::{Events, same_handle};
use super::fields::{active_nvlinks, read_fields};
use super::gpm::{query_support, read_gpm};
use super::health::{HealthSchedule, read_health};
use super::held::{self, Held, Holding};
use super::lists::{ProcessList, process_utilization, running_processes};
use super::mapping::{
    GpuProcess, brand_name, compute_mode_name, cuda_version_string, field_batch, memory_fields,
    merge_processes, pcie_kib_to_bps, pct, pstate_number, throttle_bits,
};
use super::mig::{discover_migs, mig_processes};
use super::pcie::{self, PCIE, PcieAnswers};
use crate::cgroup::{self, ProcessIdentity, UserNames};
use crate::host;
use gpufleet_core::SourceError;
use gpufleet_core::{
    Event, EventKind, GpuInfo, GpuSample, Inventory, ProcessSample, SamplerCost, Tick, UnixMs,
};
use gpufleet_uplink::cost::{CallTimer, micros, thread_cpu_time};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::struct_wrappers::device::ProcessUtilizationSample;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Everything the NVML source keeps between ticks.
pub(super) struct Reader<'n> {
    /// The library (for system-level queries).
    nvml: &'n Nvml,
    /// One entry per GPU that could be opened, in NVML index order.
    pub(super) devices: Vec<DeviceState<'n>>,
    /// Where `/proc` is.
    proc_root: PathBuf,
    /// Node name, for the inventory.
    hostname: String,
    /// uid → login name, read once.
    users: UserNames,
    /// Identity of each pid seen on a GPU, kept while the pid stays on a GPU (so `/proc`
    /// is read once per process, not once per tick).
    identities: HashMap<u32, ProcessIdentity>,
    /// The Xid / ECC event set, polled at the end of each tick; `None` when no GPU
    /// supports events.
    events: Option<Events<'n>>,
    /// When health counters are read.
    health: HealthSchedule,
    /// When the expensive calls are next made.
    due: Dues,
    /// Ticks waiting for their per-process utilization.
    holding: Holding,
    /// Since when a tick has been held (monotonic).
    held_since: Option<Instant>,
}

/// When each expensive call is made (see `cadence`).
struct Dues {
    energy: Due,
    util: Due,
    /// The last tick of each minute also fetches per-process utilization: no tick of a
    /// minute is held past its end (the collector closes a minute a few intervals after).
    minute_end: Due,
    /// A held tick waits at most this long (a clock stepped back must not hold ticks for
    /// the size of the step).
    util_patience: Duration,
    pcie: Due,
    ecc: Due,
    links: Due,
    gpm: Due,
}

impl Dues {
    fn new(c: Cadence, interval: Duration) -> Self {
        Self {
            energy: Due::aligned(c.energy, interval),
            util: Due::aligned_half_slot(c.process_util, interval),
            minute_end: Due::aligned(Duration::from_secs(60), interval),
            util_patience: c.process_util + interval,
            pcie: Due::slot_start(c.pcie, interval),
            ecc: Due::slot_start(c.ecc, interval),
            links: Due::slot_start(c.nvlink_links, interval),
            gpm: Due::slot_start(c.gpm, interval),
        }
    }
}

impl<'n> Reader<'n> {
    pub(super) fn open(nvml: &'n Nvml, opts: NvmlOptions) -> Result<Self, SourceError> {
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
            let mut unsupported = MetricSet::default();
            // A fanless board (an H200 SXM) answers INVALID_ARGUMENT for fan 0, not
            // NOT_SUPPORTED: its fan count says so once.
            if let Ok(0) = device.num_fans() {
                debug!(gpu = index, "no fans; fan speed stays absent");
                unsupported.insert(Metric::Fan);
            }
            let migs = discover_migs(&device, index);
            let links = active_nvlinks(&device);
            let fields = field_batch(&links);
            devices.push(DeviceState {
                migs,
                device,
                index,
                uuid,
                unsupported,
                warned: MetricSet::default(),
                util_seen_us: 0,
                ecc_last: (None, None),
                pcie_last: [None; 2],
                nvlinks_last: Vec::new(),
                lost: false,
                field_prev: vec![None; fields.len()],
                field_buf: Vec::with_capacity(fields.len()),
                fields,
                links,
                nvlink_unsupported: BTreeMap::new(),
                power_limit: None,
                list_hints: [0; 3],
                pcie_waits: false,
                gpm: GpmState::default(),
            });
            if let Some(dev) = devices.last_mut() {
                query_support(dev);
            }
        }
        Ok(Self {
            nvml,
            devices,
            users: UserNames::for_proc_root(&opts.proc_root),
            proc_root: opts.proc_root,
            hostname: opts.hostname,
            identities: HashMap::new(),
            events: Events::register(nvml, count),
            health: HealthSchedule::new(opts.health_interval),
            due: Dues::new(opts.cadence, opts.interval),
            holding: Holding::default(),
            held_since: None,
        })
    }

    pub(super) fn inventory(&mut self) -> Inventory {
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
                    temp_slowdown_c: d.temperature_threshold(TemperatureThreshold::Slowdown).ok(),
                    temp_shutdown_c: d.temperature_threshold(TemperatureThreshold::Shutdown).ok(),
                    temp_gpu_max_c: d.temperature_threshold(TemperatureThreshold::GpuMax).ok(),
                    temp_mem_max_c: d
                        .temperature_threshold(TemperatureThreshold::MemoryMax)
                        .ok(),
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

    /// Whether no tick waits for its per-process utilization.
    pub(super) fn holds_nothing(&self) -> bool {
        self.holding.is_empty()
    }

    /// The ticks ready at `now_ms`: this one, unless it waits for per-process
    /// utilization (see `held`), and the held ones it completes. `force_util` fetches
    /// the utilization samples now, whatever the cadence (everything held is released).
    pub(super) fn sample(&mut self, now_ms: UnixMs, force_util: bool) -> Vec<Tick> {
        let started = Instant::now();
        let mut timer = CallTimer::new();
        let mut tick = Tick {
            time_ms: now_ms,
            gpus: Vec::with_capacity(self.devices.len()),
            ..Default::default()
        };
        let due = DueNow {
            energy: self.due.energy.take(now_ms),
            util: {
                let on_cadence = self.due.util.take(now_ms);
                let minute_ends = self.due.minute_end.take(now_ms);
                let overdue = self
                    .held_since
                    .is_some_and(|t| t.elapsed() >= self.due.util_patience);
                on_cadence || minute_ends || overdue || force_util
            },
            pcie: self.due.pcie.take(now_ms),
            ecc: self.due.ecc.take(now_ms),
            links: self.due.links.take(now_ms),
            gpm: self.due.gpm.take(now_ms),
        };
        let health_due = self.health.due(now_ms);
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
        }
        let was_lost: Vec<bool> = self.devices.iter().map(|d| d.lost).collect();
        // The PCIe calls that wait are made first, side by side (see `pcie`).
        let pcie = if due.pcie {
            pcie::read_side_by_side(&self.devices)
        } else {
            Vec::new()
        };
        let reads = read_devices(&mut self.devices, &self.holding, now_ms, pcie, due);
        let mut listed_us = Vec::with_capacity(reads.len());
        let mut waiting = Vec::new();
        let mut fetched = Vec::new();
        let mut seen_pids = Vec::new();
        let mut worker_cpu: Option<Duration> = None;
        for (k, (dev, read)) in self.devices.iter_mut().zip(reads).enumerate() {
            timer.merge(read.timer);
            if let Some(cpu) = read.own_thread_cpu {
                worker_cpu = Some(worker_cpu.unwrap_or_default() + cpu);
            }
            // A lost GPU's counters cannot be read: its last health stays the one known.
            // Read before the lost check: a GPU lost during this read is reported too.
            if health_due && !dev.lost {
                tick.health.push(read_health(dev, &mut timer));
                if dev.lost {
                    // As `sample_device` does: nothing cached is reported for a lost GPU.
                    dev.forget_cached();
                }
            }
            if dev.lost && !was_lost[k] {
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
            let first = tick.processes.len();
            for p in read.processes {
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
                    // From the driver's samples of this tick's window, once fetched.
                    sm_util_pct: None,
                    mem_util_pct: None,
                    enc_util_pct: None,
                    dec_util_pct: None,
                    workload: id.workload.clone(),
                    mig_uuid: read.mig_of.get(&p.pid).cloned(),
                });
            }
            if tick.processes.len() > first && read.util_wanted {
                waiting.push((k, first..tick.processes.len()));
            }
            listed_us.push(read.listed_us);
            fetched.push(read.util);
            tick.gpus.push(read.sample);
        }
        self.identities.retain(|pid, _| seen_pids.contains(pid));
        if let Some(events) = &mut self.events {
            let devices = &self.devices;
            tick.events.extend(events.poll(now_ms, |d| {
                devices
                    .iter()
                    .find(|s| same_handle(&s.device, d))
                    .map(|s| s.uuid.clone())
            }));
        }
        if tick.events.iter().any(|e| {
            matches!(
                e.kind,
                EventKind::Xid | EventKind::EccDoubleBit | EventKind::GpuLost
            )
        }) {
            self.health.event_seen();
        }
        tick.cost = Some(SamplerCost {
            // NVML runs on the sampling thread (the sampler measures that thread's CPU),
            // and on a tick of expensive calls on a thread per GPU too: theirs is here.
            cpu_us: worker_cpu.map(micros),
            // Measured here, not around the call that hands the tick out: a held tick
            // leaves with a later one.
            wall_us: Some(micros(started.elapsed())),
            source_us: Some(micros(timer.total())),
            slowest_calls_us: timer.slowest_us(),
        });
        self.holding.push(Held {
            tick,
            listed_us,
            waiting,
        });
        for (k, (dev, util)) in self.devices.iter_mut().zip(fetched).enumerate() {
            match util {
                Some((samples, fetched_us)) => {
                    dev.util_seen_us =
                        self.holding
                            .complete(k, dev.util_seen_us, samples.as_deref(), fetched_us);
                }
                None if !self.holding.waits_for(k) => {
                    // Nothing waits for this GPU: the next window starts at this listing.
                    dev.util_seen_us = self.holding.chain_end(k, dev.util_seen_us);
                }
                None => {}
            }
        }
        let ready = self.holding.ready();
        self.held_since = match (self.holding.is_empty(), self.held_since) {
            (true, _) => None,
            (false, Some(t)) if ready.is_empty() => Some(t),
            (false, _) => Some(Instant::now()),
        };
        ready
    }
}

/// Which of the expensive calls this tick makes (see `cadence`).
#[derive(Debug, Clone, Copy)]
pub(super) struct DueNow {
    pub(super) energy: bool,
    pub(super) util: bool,
    pub(super) pcie: bool,
    pub(super) ecc: bool,
    pub(super) links: bool,
    pub(super) gpm: bool,
}

/// What one device's part of a tick read.
struct DeviceRead {
    sample: GpuSample,
    processes: Vec<GpuProcess>,
    mig_of: HashMap<u32, String>,
    /// When its process lists were read (µs of wall time).
    listed_us: u64,
    /// Its processes wait for utilization samples (it lists some, and answers them).
    util_wanted: bool,
    /// The utilization samples fetched this tick (`None` in it: the call failed), and
    /// when the fetch answered (µs of wall time).
    util: Option<(Option<Vec<ProcessUtilizationSample>>, u64)>,
    timer: CallTimer,
    /// The CPU time of the thread it was read on, when that was a thread of its own.
    own_thread_cpu: Option<Duration>,
}

/// Every device's part of a tick. On a tick that makes an expensive call each GPU is read
/// on a thread of its own, so that no GPU waits for another's slow calls; the other ticks
/// read them in turn (a thread would cost more than the calls).
fn read_devices(
    devices: &mut [DeviceState<'_>],
    holding: &Holding,
    now_ms: UnixMs,
    pcie: Vec<Option<PcieAnswers>>,
    due: DueNow,
) -> Vec<DeviceRead> {
    let mut pcie = pcie.into_iter();
    let work: Vec<_> = devices
        .iter_mut()
        .enumerate()
        .map(|(k, dev)| (k, dev, pcie.next().flatten()))
        .collect();
    let one = |(k, dev, pcie): (usize, &mut DeviceState<'_>, Option<PcieAnswers>)| {
        read_device(k, dev, holding, now_ms, pcie, due)
    };
    if (due.energy || due.util) && work.len() > 1 {
        // One slot per GPU, taken by its thread or, when no thread could be started, by
        // this one afterwards: every GPU is read once and stays at its place.
        let slots: Vec<std::sync::Mutex<Option<_>>> = work
            .into_iter()
            .map(|w| std::sync::Mutex::new(Some(w)))
            .collect();
        let take = |slot: &std::sync::Mutex<Option<_>>| {
            slot.lock().unwrap_or_else(|e| e.into_inner()).take()
        };
        std::thread::scope(|scope| {
            let started: Vec<_> = slots
                .iter()
                .map(|slot| {
                    std::thread::Builder::new()
                        .name("nvml-gpu".into())
                        .spawn_scoped(scope, move || {
                            let cpu = thread_cpu_time();
                            let mut read = take(slot).map(one);
                            if let Some(read) = &mut read {
                                read.own_thread_cpu = Some(thread_cpu_time().saturating_sub(cpu));
                            }
                            read
                        })
                })
                .collect();
            started
                .into_iter()
                .zip(&slots)
                .map(|(started, slot)| {
                    let read = match started {
                        Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                        Err(e) => {
                            warn!(error = %e, "cannot start a thread to read a GPU; reading it here");
                            None
                        }
                    };
                    // Not read by a thread (none started): read here.
                    read.or_else(|| take(slot).map(one))
                        .expect("each GPU's slot is taken once, by its thread or here")
                })
                .collect()
        })
    } else {
        work.into_iter().map(one).collect()
    }
}

/// One device's part of a tick, with its utilization samples when they are due.
fn read_device(
    k: usize,
    dev: &mut DeviceState<'_>,
    holding: &Holding,
    now_ms: UnixMs,
    pcie: Option<PcieAnswers>,
    due: DueNow,
) -> DeviceRead {
    let mut timer = CallTimer::new();
    let (sample, processes, listed_us) = sample_device(dev, &mut timer, now_ms, pcie, due);
    let mig_of = mig_processes(dev, &mut timer);
    let util_wanted =
        !processes.is_empty() && !dev.lost && !dev.unsupported.contains(Metric::ProcessUtil);
    let util = (due.util && (util_wanted || holding.waits_for(k))).then(|| {
        let since = holding.asked_since(k, dev.util_seen_us).unwrap_or_else(|| {
            held::window_start(holding.chain_end(k, dev.util_seen_us), listed_us)
        });
        let mut hint = dev.list_hints[2];
        let samples = read(dev, &mut timer, Metric::ProcessUtil, |d| {
            process_utilization(d, since, &mut hint)
        });
        dev.list_hints[2] = hint;
        (samples, wall_us())
    });
    DeviceRead {
        sample,
        processes,
        mig_of,
        listed_us,
        util_wanted,
        util,
        timer,
        own_thread_cpu: None,
    }
}

/// One device's tick: its sample, its processes (their utilization still absent: see
/// `held`) and when their lists were read (µs of wall time). The expensive calls are
/// made when `due` says; the PCIe rates and ECC counts of the ticks between are the last
/// reading, the energy counter is absent there (the collector spreads each delta).
pub(super) fn sample_device(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    now_ms: UnixMs,
    mut pcie: Option<PcieAnswers>,
    due: DueNow,
) -> (GpuSample, Vec<GpuProcess>, u64) {
    let util = read(dev, timer, Metric::Utilization, |d| d.utilization_rates());
    let mem = read(dev, timer, Metric::Memory, |d| d.memory_info()).map(|m| memory_fields(&m));
    let power_mw = read(dev, timer, Metric::Power, |d| d.power_usage());
    let power_limit_mw = if dev.power_limit_due(now_ms) {
        let limit = read(dev, timer, Metric::PowerLimit, |d| d.enforced_power_limit());
        dev.power_limit = Some((limit, now_ms));
        limit
    } else {
        dev.power_limit.and_then(|(limit, _)| limit)
    };
    let energy_mj = if due.energy {
        read(dev, timer, Metric::Energy, |d| d.total_energy_consumption())
    } else {
        None
    };
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
    let [pcie_tx_bps, pcie_rx_bps] = if due.pcie {
        let rates = read_pcie(dev, timer, pcie.as_mut());
        dev.pcie_last = rates;
        rates
    } else if dev.lost {
        [None; 2]
    } else {
        dev.pcie_last
    };
    let (ecc_corrected, ecc_uncorrected) = if due.ecc {
        let corrected = read(dev, timer, Metric::EccCorrected, |d| {
            d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
        });
        let uncorrected = read(dev, timer, Metric::EccUncorrected, |d| {
            d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        });
        dev.ecc_last = (corrected, uncorrected);
        (corrected, uncorrected)
    } else if dev.lost {
        (None, None)
    } else {
        dev.ecc_last
    };
    let throttle = read(dev, timer, Metric::Throttle, |d| {
        d.current_throttle_reasons()
    })
    .map(throttle_bits);
    let enc =
        read(dev, timer, Metric::Encoder, |d| d.encoder_utilization()).map(|u| pct(u.utilization));
    let dec =
        read(dev, timer, Metric::Decoder, |d| d.decoder_utilization()).map(|u| pct(u.utilization));
    let fields = read_fields(dev, timer, now_ms, due.links);
    let (gpm, mig_gpm) = read_gpm(dev, timer, due.gpm, now_ms);
    let mut hints = dev.list_hints;
    let compute = read(dev, timer, Metric::ComputeProcs, |d| {
        running_processes(d, ProcessList::Compute, &mut hints[0])
    });
    let graphics = read(dev, timer, Metric::GraphicsProcs, |d| {
        running_processes(d, ProcessList::Graphics, &mut hints[1])
    });
    dev.list_hints = hints;
    let listed_us = wall_us();
    let processes = merge_processes(
        compute.as_deref().unwrap_or(&[]),
        graphics.as_deref().unwrap_or(&[]),
    );
    if dev.lost {
        // Nothing cached is reported for a lost GPU; read again once it answers.
        dev.forget_cached();
    }
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
        gpm,
        mig_gpm,
    };
    (sample, processes, listed_us)
}

/// The PCIe rates (TX, RX): answered at the start of the tick (see `pcie`), or asked
/// now; settled alike.
fn read_pcie(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    mut answers: Option<&mut PcieAnswers>,
) -> [Option<u64>; 2] {
    let mut pcie_took = Duration::ZERO;
    let rates = PCIE.map(|(metric, counter)| {
        if dev.lost || dev.unsupported.contains(metric) {
            return None;
        }
        let (result, took) = answers
            .as_mut()
            .and_then(|p| p.take(metric))
            .unwrap_or_else(|| {
                let start = Instant::now();
                (dev.device.pcie_throughput(counter), start.elapsed())
            });
        pcie_took = pcie_took.max(took);
        let reading = settle(dev, timer, metric, result, took);
        value_of(dev, metric, reading).map(pcie_kib_to_bps)
    });
    dev.pcie_waits = pcie_took >= pcie::WAITS;
    rates
}

/// Now, in µs of wall time (the clock the driver stamps its samples with).
fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Asks a lost GPU, through a fresh handle, whether it answers again; on success the
/// handle replaces the old one and the GPU is sampled from this tick on.
pub(super) fn probe_lost<'n>(
    nvml: &'n Nvml,
    dev: &mut DeviceState<'n>,
    timer: &mut CallTimer,
) -> bool {
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
