//! The energy records the store keeps: the samples accounting reads, and the minutes it
//! writes (one row per GPU and minute, one per workload on it). The rules that compute them
//! are the collector's (`accounting::energy`); the store only holds them.

use gpufleet_core::UnixMs;

/// A workload's id in the store (`workloads.id`); ties in a split go to the lowest.
pub type WorkloadRef = i64;

/// One process on a GPU at one sample, as accounting needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct EnergyProcess {
    pub workload: WorkloadRef,
    pub sm_util_pct: Option<u32>,
    pub gpu_mem_bytes: Option<u64>,
    /// A compute (or compute + graphics) context: a GPU with one is not seen idle.
    pub compute: bool,
}

/// One GPU sample, as accounting needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct EnergySample {
    pub time_ms: UnixMs,
    pub power_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub util_gpu_pct: Option<u32>,
    /// GPM's tensor activity and SM occupancy (hundredths of a percent), where the GPU
    /// has GPM.
    pub tensor_cpct: Option<u32>,
    pub occupancy_cpct: Option<u32>,
    pub processes: Vec<EnergyProcess>,
}

/// Where idle energy goes when workloads are resident on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdlePolicy {
    /// Split equally over the workloads resident on the GPU: whoever holds a GPU pays for
    /// keeping it powered (the default: a GPU allocated but idle is the waste operators
    /// hunt, and its owner should see it).
    #[default]
    Spread,
    /// Into a per-GPU (per-node) `idle` bucket: workloads pay only for their active share.
    Separate,
}

impl IdlePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            IdlePolicy::Spread => "spread",
            IdlePolicy::Separate => "separate",
        }
    }

    pub fn parse(s: &str) -> Option<IdlePolicy> {
        match s {
            "spread" => Some(IdlePolicy::Spread),
            "separate" => Some(IdlePolicy::Separate),
            _ => None,
        }
    }
}

/// One workload's energy on one GPU in one minute (intervals ending in that minute).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkloadMinute {
    pub workload: WorkloadRef,
    /// Charged: active, plus idle under `spread`.
    pub energy_mj: u64,
    /// Its active share.
    pub active_mj: u64,
    /// Its idle share by memory held (charged only under `spread`).
    pub idle_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    /// Time it was resident (had a process) in measured intervals.
    pub gpu_ms: i64,
    /// Σ share_ppm × interval ms: average share = share_ppm_ms / gpu_ms / 1e6.
    pub share_ppm_ms: u64,
    pub sm_ms: i64,
    pub memory_ms: i64,
    pub equal_ms: i64,
    /// Time its idle share was split by GPU memory held, or equally.
    pub idle_memory_ms: i64,
    pub idle_equal_ms: i64,
    /// The most GPU memory its processes held together at the end of one of its
    /// intervals of the minute; `None` when none of them reported memory. (Waste
    /// detection reports it: `accounting::waste` in the collector.)
    pub mem_max_bytes: Option<u64>,
    /// GPM estimate: the time it was resident in intervals whose GPU reported tensor
    /// activity, and Σ share × tensor activity (hundredths of a percent) × interval ms
    /// over them, so its time-weighted tensor activity is `tensor_cpct_ms / tensor_ms`
    /// hundredths of a percent (its share of the GPU's, on a shared GPU: an estimate).
    pub tensor_ms: i64,
    pub tensor_cpct_ms: u64,
    /// The same for SM occupancy.
    pub occupancy_ms: i64,
    pub occupancy_cpct_ms: u64,
}

/// One GPU's energy in one minute, and the policy that split it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuMinute {
    pub minute_ms: UnixMs,
    pub energy_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    pub attributed_mj: u64,
    /// The idle bucket: idle energy charged to no workload.
    pub idle_mj: u64,
    pub unattributed_mj: u64,
    /// The active part of `energy_mj` (the rest is idle, charged or in the bucket).
    pub active_mj: u64,
    /// Intervals in which the GPU did no work: their length and energy (the idle
    /// baseline is learned from these).
    pub seen_idle_ms: i64,
    pub seen_idle_mj: u64,
    /// The learning's evidence after this minute: the most recent seen-idle time of the
    /// GPU (up to `accounting::energy::baseline::LEARN_HORIZON_MS`) and its energy, carried from minute to
    /// minute (`accounting::energy::baseline::carry`).
    pub learned_idle_ms: i64,
    pub learned_idle_mj: u64,
    /// Computed from an open minute (more samples may come): replaced once closed.
    pub provisional: bool,
    /// The attribution rules it was computed with (the collector's `accounting::energy::RULES`).
    pub rules: u32,
    /// Measured time (counter or trapezoid intervals).
    pub covered_ms: i64,
    /// Time in missing intervals (gaps; no energy).
    pub missing_ms: i64,
    /// Samples of this GPU in the minute.
    pub samples: u32,
    /// The highest GPU utilization reported at the end of the minute's measured
    /// intervals; `None` when one of them did not report it (or none was measured), so a
    /// minute is known to be idle only when every interval says so
    /// (`accounting::waste` in the collector).
    pub util_max_pct: Option<u32>,
    /// Lowest power reported in the minute.
    pub min_power_mw: Option<u32>,
    /// The idle power used for this minute.
    pub idle_mw: u32,
    pub idle_policy: IdlePolicy,
    /// Where `idle_mw` came from.
    pub idle_source: IdleSource,
    /// The gap limit used: longer intervals are missing.
    pub max_gap_ms: i64,
    pub workloads: Vec<WorkloadMinute>,
}

/// Where an idle power came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum IdleSource {
    /// The lowest power of the last 24 h (rows computed before the learned baseline; the
    /// rule that mistook a busy GPU's working power for idle).
    Min,
    /// Configured (`--energy-idle`).
    Watts,
    /// Learned from intervals in which this GPU did no work.
    #[default]
    Learned,
    /// The per-model default table (`accounting::energy::baseline::MODELS`).
    Model,
    /// Neither learned nor a known model: the conservative fallback
    /// (`accounting::energy::baseline::fallback_mw`).
    Fallback,
}

impl IdleSource {
    pub fn as_str(self) -> &'static str {
        match self {
            IdleSource::Min => "min",
            IdleSource::Watts => "watts",
            IdleSource::Learned => "learned",
            IdleSource::Model => "model",
            IdleSource::Fallback => "fallback",
        }
    }

    pub fn parse(s: &str) -> Option<IdleSource> {
        match s {
            "min" => Some(IdleSource::Min),
            "watts" => Some(IdleSource::Watts),
            "learned" => Some(IdleSource::Learned),
            "model" => Some(IdleSource::Model),
            "fallback" => Some(IdleSource::Fallback),
            _ => None,
        }
    }
}

impl GpuMinute {
    /// Violations of conservation in this row, if any (for `check-energy`).
    pub fn conservation_error(&self) -> Option<String> {
        let workloads: u64 = self.workloads.iter().map(|w| w.energy_mj).sum();
        let accounted = workloads + self.idle_mj + self.unattributed_mj;
        if accounted != self.energy_mj {
            return Some(format!(
                "workloads {workloads} + idle {} + unattributed {} = {accounted} mJ, but the GPU spent {} mJ",
                self.idle_mj, self.unattributed_mj, self.energy_mj
            ));
        }
        if workloads != self.attributed_mj {
            return Some(format!(
                "workload rows sum to {workloads} mJ, but attributed_mj says {}",
                self.attributed_mj
            ));
        }
        let active: u64 = self.workloads.iter().map(|w| w.active_mj).sum();
        if active + self.unattributed_mj != self.active_mj || self.active_mj > self.energy_mj {
            return Some(format!(
                "workloads' active {active} + unattributed {} mJ != active {} mJ (of {} mJ)",
                self.unattributed_mj, self.active_mj, self.energy_mj
            ));
        }
        let charged = self.idle_policy == IdlePolicy::Spread;
        if let Some(w) = self
            .workloads
            .iter()
            .find(|w| w.energy_mj != w.active_mj + if charged { w.idle_mj } else { 0 })
        {
            return Some(format!(
                "workload {} was charged {} mJ, but its active {} + idle {} mJ under {} differ",
                w.workload,
                w.energy_mj,
                w.active_mj,
                w.idle_mj,
                self.idle_policy.as_str()
            ));
        }
        if self.counter_mj + self.trapezoid_mj != self.energy_mj {
            return Some(format!(
                "counter {} + trapezoid {} mJ != energy {} mJ",
                self.counter_mj, self.trapezoid_mj, self.energy_mj
            ));
        }
        None
    }
}
