//! The physics of one simulated GPU: power following load between idle and the limit,
//! an energy counter that is exactly the integral of that power, temperatures lagging
//! power, clocks and performance state tracking load, throttling, link traffic, and the
//! GPM reading of what its processes' kernels did (`gpm.rs`).

use super::catalog::GpuModel;
use super::gpm::Activity;
use super::rng::{SimRng, chance, normal};
use gpufleet_core::{Event, EventKind, GpuHealthSample, GpuSample};
use rand::Rng;

/// NVML clock event reason bits (`nvmlClocksEventReason*`).
pub mod reasons {
    /// Nothing is running.
    pub const GPU_IDLE: u64 = 0x1;
    /// Software power capping: the draw would exceed the enforced limit.
    pub const SW_POWER_CAP: u64 = 0x4;
    /// Hardware slowdown (set with hardware thermal slowdown).
    pub const HW_SLOWDOWN: u64 = 0x8;
    /// Software thermal slowdown.
    pub const SW_THERMAL_SLOWDOWN: u64 = 0x20;
    /// Hardware thermal slowdown.
    pub const HW_THERMAL_SLOWDOWN: u64 = 0x40;
}

/// Time constant of the reported power (NVML's power is a 1 s average on Ampere+).
const POWER_TAU_S: f64 = 0.8;
/// Time constant of the die temperature.
const TEMP_TAU_S: f64 = 40.0;
/// Time constant of the memory temperature.
const MEM_TEMP_TAU_S: f64 = 60.0;
/// How long a GPU stays in P0 after its last work.
const P0_HOLD_MS: i64 = 15_000;

/// What the processes on one GPU ask of it this tick.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct GpuLoad {
    /// GPU utilization, percent (already capped and rounded as reported).
    pub util: u32,
    /// Memory-bandwidth utilization, percent.
    pub mem_util: f64,
    /// Memory held by processes.
    pub mem_bytes: u64,
    /// Whether any process holds a context (keeps P0, a floor above idle power).
    pub has_procs: bool,
    /// Power per unit of load relative to nominal (the busiest job's).
    pub intensity: f64,
    /// Host → GPU traffic, bytes/s.
    pub pcie_rx_bps: f64,
    /// GPU → host traffic, bytes/s.
    pub pcie_tx_bps: f64,
    /// Share of NVLink bandwidth in use.
    pub nvlink_frac: f64,
    /// Decoder utilization, percent.
    pub dec: f64,
    /// What the processes' kernels do with the SMs, tensor cores and memory (GPM), summed.
    pub gpm: Activity,
}

/// One simulated GPU's evolving state.
#[derive(Debug, Clone)]
pub(super) struct GpuState {
    /// The board's UUID (`GPU-…`).
    pub uuid: String,
    /// Its product.
    pub model: &'static GpuModel,
    /// This board's idle draw (boards of one model differ by a few percent).
    pub idle_mw: u32,
    /// The enforced power limit.
    pub limit_mw: u32,
    /// Inlet temperature above the scenario's ambient (position in the chassis).
    ambient_offset_c: f64,
    /// This board's thermal resistance, °C per W.
    c_per_w: f64,
    /// Energy counter at the first sample, in half-microjoules: with power in mW and
    /// time in ms, one trapezoid `(p0 + p1) · dt` is an integer number of half-µJ, so the
    /// counter is the exact integral of the piecewise-linear power, with no drift.
    energy_base_half_uj: u64,
    /// Energy integrated since the first sample, half-µJ.
    energy_acc_half_uj: u64,
    /// The previous tick's reported power (`None` before the first sample).
    last_power_mw: Option<u32>,
    /// Die temperature (`None` before the first sample: it starts at steady state).
    temp_c: Option<f64>,
    /// Memory temperature.
    mem_temp_c: f64,
    /// Stays in P0 until then.
    busy_until_ms: i64,
    /// Volatile corrected ECC errors.
    pub ecc_corrected: u64,
    /// Volatile uncorrected ECC errors.
    pub ecc_uncorrected: u64,
    /// A cooling fault (hot inlet) lasts until then.
    cooling_fault_until_ms: i64,
    /// How much hotter the inlet is during the fault.
    cooling_fault_c: f64,
    /// Whether the previous tick was thermally throttled (to emit an event on onset).
    thermal_throttled: bool,
}

impl GpuState {
    /// A board of `model` named `uuid`; its constants are drawn from `rng`.
    pub fn new(rng: &mut SimRng, model: &'static GpuModel, uuid: String) -> Self {
        let idle_w = model.idle_w * rng.random_range(0.93..1.08);
        let uptime_s: f64 = rng.random_range(86_400.0..40.0 * 86_400.0);
        let avg_w = idle_w + 0.3 * (f64::from(model.tdp_w) - idle_w);
        let base_mj = (uptime_s * avg_w * 1000.0) as u64;
        Self {
            uuid,
            model,
            idle_mw: (idle_w * 1000.0).ceil() as u32,
            limit_mw: model.tdp_w * 1000,
            ambient_offset_c: rng.random_range(0.0..6.0),
            c_per_w: model.c_per_w * rng.random_range(0.95..1.05),
            energy_base_half_uj: base_mj * 2000,
            energy_acc_half_uj: 0,
            last_power_mw: None,
            temp_c: None,
            mem_temp_c: 0.0,
            busy_until_ms: i64::MIN,
            ecc_corrected: 0,
            ecc_uncorrected: 0,
            cooling_fault_until_ms: i64::MIN,
            cooling_fault_c: 0.0,
            thermal_throttled: false,
        }
    }

    /// The board's health counters. Every simulated product remaps rows (Ampere and newer),
    /// so page retirement is absent, as NVML reports it there. Lifetime counts start from a
    /// small per-board history (from the UUID: no draw, so the rest of the run is
    /// unchanged) plus what this run added; a double-bit error leaves a remap pending.
    pub fn health(&self) -> GpuHealthSample {
        let history = self.uuid.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let links = self.model.nvlinks > 0;
        GpuHealthSample {
            gpu_uuid: self.uuid.clone(),
            retired_pages_sbe: None,
            retired_pages_dbe: None,
            retired_pages_pending: None,
            remapped_rows_correctable: Some((history % 3) as u32),
            remapped_rows_uncorrectable: Some(
                u32::try_from(self.ecc_uncorrected).unwrap_or(u32::MAX),
            ),
            remapped_rows_pending: Some(self.ecc_uncorrected > 0),
            remapped_rows_failed: Some(false),
            ecc_corrected_aggregate: Some((history >> 8) % 200 + self.ecc_corrected),
            ecc_uncorrected_aggregate: Some(self.ecc_uncorrected),
            pcie_replay_count: Some((history >> 16) % 5),
            nvlink_crc_errors: links.then_some(0),
            nvlink_replay_errors: links.then_some(0),
            nvlink_recovery_errors: links.then_some(0),
            persistence_mode: Some(true),
        }
    }

    /// The energy counter in mJ (what NVML's total energy consumption reports).
    pub fn energy_mj(&self) -> u64 {
        (self.energy_base_half_uj + self.energy_acc_half_uj) / 2000
    }

    /// Advances the board to `now_ms`, `dt_ms` after the previous tick (0 for the first),
    /// under `load`. Returns the sample and a throttle event when thermal slowdown begins.
    pub fn step(
        &mut self,
        rng: &mut SimRng,
        now_ms: i64,
        dt_ms: i64,
        load: &GpuLoad,
        ambient_c: f64,
        thermal_events_per_hour: f64,
    ) -> (GpuSample, Option<Event>) {
        let m = self.model;
        let dt = dt_ms as f64 / 1000.0;
        if now_ms >= self.cooling_fault_until_ms && chance(rng, thermal_events_per_hour, dt_ms) {
            self.cooling_fault_until_ms = now_ms + rng.random_range(240_000..720_000);
            self.cooling_fault_c = rng.random_range(16.0..26.0);
        }
        let fault_c = if now_ms < self.cooling_fault_until_ms {
            self.cooling_fault_c
        } else {
            0.0
        };
        // Throttling reacts to the temperature the board had coming into this tick.
        let hot = self.temp_c.unwrap_or(0.0);
        let thermal = hot >= m.slowdown_c;
        let hw_thermal = hot >= m.slowdown_c + 5.0;

        // Power: from idle to TDP with load, capped at the enforced limit, then averaged
        // over ~1 s like NVML's reading.
        let u = f64::from(load.util) / 100.0;
        let mut activity = (0.8 * u + 0.2 * load.mem_util / 100.0) * load.intensity;
        if load.has_procs {
            activity = activity.max(0.03);
        }
        activity = (activity * (1.0 + 0.015 * normal(rng))).max(0.0);
        let idle_w = f64::from(self.idle_mw) / 1000.0;
        let limit_w = f64::from(self.limit_mw) / 1000.0;
        let mut target_w = idle_w + (f64::from(m.tdp_w) - idle_w) * activity;
        if thermal {
            target_w = idle_w + (target_w - idle_w) * 0.82;
        }
        let capped = target_w > limit_w;
        let target_w = target_w.clamp(idle_w, limit_w);
        let power_w = match self.last_power_mw {
            None => target_w,
            Some(prev) => {
                let prev_w = f64::from(prev) / 1000.0;
                target_w + (prev_w - target_w) * (-dt / POWER_TAU_S).exp()
            }
        };
        let power_mw = ((power_w * 1000.0).round() as i64)
            .clamp(i64::from(self.idle_mw), i64::from(self.limit_mw)) as u32;
        if let Some(prev) = self.last_power_mw {
            self.energy_acc_half_uj += (u64::from(prev) + u64::from(power_mw)) * dt_ms as u64;
        }
        self.last_power_mw = Some(power_mw);
        let power_w = f64::from(power_mw) / 1000.0;

        // Temperatures lag power (first order, exact for any dt).
        let inlet = ambient_c + self.ambient_offset_c + fault_c;
        let temp_ss = inlet + self.c_per_w * power_w;
        let mem_ss = temp_ss + 3.0 + 8.0 * load.mem_util / 100.0;
        let (temp, mem_temp) = match self.temp_c {
            None => (temp_ss, mem_ss),
            Some(t) => (
                temp_ss + (t - temp_ss) * (-dt / TEMP_TAU_S).exp(),
                mem_ss + (self.mem_temp_c - mem_ss) * (-dt / MEM_TEMP_TAU_S).exp(),
            ),
        };
        self.temp_c = Some(temp);
        self.mem_temp_c = mem_temp;

        // Performance state and clocks.
        if load.has_procs || load.util > 0 {
            self.busy_until_ms = now_ms + P0_HOLD_MS;
        }
        let p0 = now_ms < self.busy_until_ms;
        let (sm_mhz, mem_mhz) = if p0 {
            let mut f = (0.6 + 0.8 * u).min(1.0);
            if capped {
                f *= 0.92;
            }
            if thermal {
                f *= 0.8;
            }
            let mhz = ((f64::from(m.max_sm_mhz) * f / 15.0).round() * 15.0) as u32;
            (mhz.clamp(m.idle_sm_mhz, m.max_sm_mhz), m.max_mem_mhz)
        } else {
            (m.idle_sm_mhz, m.idle_mem_mhz)
        };

        let mut bits = 0;
        if load.util == 0 {
            bits |= reasons::GPU_IDLE;
        }
        if capped {
            bits |= reasons::SW_POWER_CAP;
        }
        if thermal {
            bits |= reasons::SW_THERMAL_SLOWDOWN;
        }
        if hw_thermal {
            bits |= reasons::HW_THERMAL_SLOWDOWN | reasons::HW_SLOWDOWN;
        }
        let event = (thermal && !self.thermal_throttled).then(|| Event {
            time_ms: now_ms,
            gpu_uuid: self.uuid.clone(),
            kind: EventKind::Throttle,
            code: None,
            detail: format!(
                "thermal slowdown: GPU at {hot:.0} C (slowdown at {:.0} C), clocks reduced",
                m.slowdown_c
            ),
        });
        self.thermal_throttled = thermal;

        if chance(rng, 0.3, dt_ms) {
            self.ecc_corrected += 1;
        }
        // NVML reports PCIe throughput in whole KB/s, which the agent sends as KiB × 1024.
        let pcie = |bps: f64, rng: &mut SimRng| -> u64 {
            let bps = (bps * (1.0 + 0.05 * normal(rng)) + rng.random_range(2.0e4..2.0e5))
                .clamp(0.0, m.pcie_bps as f64) as u64;
            bps / 1024 * 1024
        };
        let pcie_rx = pcie(load.pcie_rx_bps, rng);
        let pcie_tx = pcie(load.pcie_tx_bps, rng);
        let (nvlink_tx, nvlink_rx) = if m.nvlinks == 0 {
            (None, None)
        } else {
            let full = f64::from(m.nvlinks) * m.nvlink_link_bps as f64;
            let dir = |rng: &mut SimRng| -> u64 {
                let f = if load.nvlink_frac > 0.0 {
                    load.nvlink_frac * (1.0 + 0.04 * normal(rng))
                } else {
                    0.0
                };
                (full * f).clamp(0.0, full) as u64
            };
            (Some(dir(rng)), Some(dir(rng)))
        };
        let instant = m.has_power_instant.then(|| {
            let w = (power_w * (1.0 + 0.04 * normal(rng))).clamp(idle_w, limit_w);
            ((w * 1000.0).round() as u32).clamp(self.idle_mw, self.limit_mw)
        });
        let usable = m.memory_bytes - m.reserved_bytes;
        let mem_used = (load.mem_bytes + (1 << 20)).min(usable);
        let temp_c = temp.round().max(0.0) as u32;
        let sample = GpuSample {
            gpu_uuid: self.uuid.clone(),
            util_gpu_pct: Some(load.util.min(100)),
            util_mem_pct: Some(load.mem_util.round().clamp(0.0, 100.0) as u32),
            mem_used_bytes: Some(mem_used),
            mem_total_bytes: Some(m.memory_bytes),
            mem_reserved_bytes: Some(m.reserved_bytes),
            power_mw: Some(power_mw),
            power_instant_mw: instant,
            power_limit_mw: Some(self.limit_mw),
            energy_mj: Some(self.energy_mj()),
            temp_gpu_c: Some(temp_c),
            temp_mem_c: m.has_mem_temp.then(|| mem_temp.round().max(0.0) as u32),
            fan_pct: m
                .has_fan
                .then(|| (30.0 + (temp - 35.0) * 1.6).clamp(30.0, 100.0).round() as u32),
            clock_sm_mhz: Some(sm_mhz),
            clock_mem_mhz: Some(mem_mhz),
            clock_graphics_mhz: Some(sm_mhz),
            pstate: Some(if p0 { 0 } else { 8 }),
            pcie_tx_bps: Some(pcie_tx),
            pcie_rx_bps: Some(pcie_rx),
            nvlink_tx_bps: nvlink_tx,
            nvlink_rx_bps: nvlink_rx,
            nvlinks: Vec::new(),
            ecc_corrected_volatile: Some(self.ecc_corrected),
            ecc_uncorrected_volatile: Some(self.ecc_uncorrected),
            throttle_reasons: Some(bits),
            enc_util_pct: Some(0),
            dec_util_pct: Some(load.dec.round().clamp(0.0, 100.0) as u32),
            gpm: load
                .gpm
                .metrics(m, (pcie_tx, pcie_rx), (nvlink_tx, nvlink_rx)),
            // The simulator plays no MIG instances (`mig_enabled` is false), so there is no
            // per-instance GPM.
            mig_gpm: Vec::new(),
        };
        (sample, event)
    }
}
