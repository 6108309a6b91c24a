//! What the store keeps and returns for carbon accounting (issue 7). The pricing is in
//! [`crate::accounting::carbon`]; these are the shapes crossing the store boundary.

use super::{GpuId, StoreError};
use gpufleet_carbon::{FactorType, IntensityKind, ProviderKind};
use gpufleet_core::UnixMs;

/// How a minute's intensity was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PriceBasis {
    /// The provider's slot holding the minute.
    Slot,
    /// The provider was unreachable / had no slot: the newest known slot before it
    /// (estimated).
    LastKnown,
    /// Nothing known: the configured `--carbon-g-per-kwh` (estimated).
    Default,
}

impl PriceBasis {
    pub fn as_str(self) -> &'static str {
        match self {
            PriceBasis::Slot => "slot",
            PriceBasis::LastKnown => "last_known",
            PriceBasis::Default => "default",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "slot" => Some(PriceBasis::Slot),
            "last_known" => Some(PriceBasis::LastKnown),
            "default" => Some(PriceBasis::Default),
            _ => None,
        }
    }
}

/// The carbon of one GPU-minute and where its figures came from.
#[derive(Debug, Clone, PartialEq)]
pub struct CarbonMinute {
    pub gpu: GpuId,
    pub minute_ms: UnixMs,
    /// The energy priced (the energy row's `energy_mj` when priced).
    pub energy_mj: u64,
    pub g_per_kwh: f64,
    pub pue: f64,
    /// `energy_mj / 3.6e9 × g_per_kwh × pue`.
    pub carbon_g: f64,
    pub provider: ProviderKind,
    pub region: String,
    pub kind: IntensityKind,
    pub factor_type: FactorType,
    /// Not the provider's own figure for the slot (basis last_known / default, or the
    /// provider marked it estimated).
    pub estimated: bool,
    pub basis: PriceBasis,
    pub priced_at_ms: UnixMs,
}

/// An energy minute that needs (re)pricing: never priced, its energy changed since, or
/// priced with a forecast or an estimate that a later fetch may improve.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCarbonMinute {
    pub gpu: GpuId,
    pub minute_ms: UnixMs,
    pub energy_mj: u64,
    pub node_name: String,
    /// The current price, if any.
    pub priced: Option<CarbonMinute>,
}

/// Carbon over a set of GPU-minutes, with its provenance. `carbon_g` covers the energy in
/// `priced_mj` only; energy without a price is the caller's `energy - priced` (shown, never
/// priced as zero).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CarbonTotals {
    pub carbon_g: f64,
    /// Energy with a price.
    pub priced_mj: u64,
    /// Of which priced with a forecast intensity.
    pub forecast_mj: u64,
    /// Of which priced with an estimate (provider unreachable, or its own estimate).
    pub estimated_mj: u64,
    /// Σ energy_mj × g_per_kwh (for the energy-weighted average intensity).
    pub intensity_mj_g: f64,
    /// `provider:region:factor_type` of every intensity used, sorted.
    pub sources: Vec<String>,
}

impl CarbonTotals {
    pub fn add(&mut self, o: &CarbonTotals) {
        self.carbon_g += o.carbon_g;
        self.priced_mj += o.priced_mj;
        self.forecast_mj += o.forecast_mj;
        self.estimated_mj += o.estimated_mj;
        self.intensity_mj_g += o.intensity_mj_g;
        for s in &o.sources {
            if let Err(i) = self.sources.binary_search(s) {
                self.sources.insert(i, s.clone());
            }
        }
    }

    /// Energy-weighted average intensity (g/kWh, before PUE); `None` without priced energy.
    pub fn avg_g_per_kwh(&self) -> Option<f64> {
        (self.priced_mj > 0).then(|| self.intensity_mj_g / self.priced_mj as f64)
    }
}

/// One workload's carbon on one GPU over a range.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadCarbon {
    /// `Workload::key()`.
    pub workload_key: String,
    pub gpu_uuid: String,
    pub totals: CarbonTotals,
}

/// One GPU's carbon over a range.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuCarbon {
    pub gpu: GpuId,
    pub uuid: String,
    pub node_name: String,
    pub totals: CarbonTotals,
}

/// A text column holding a value its enum does not know: the row was tampered with.
pub(super) fn unknown_value(column: &str, v: &str) -> StoreError {
    StoreError::Corrupt(format!("{column} has an unknown value {v:?}"))
}

/// The columns of `carbon_gpu_minutes c`, prefixed `c_` (so a query joining energy
/// minutes can read both); the same text on both backends.
pub(super) const MINUTE_COLS: &str = "c.gpu_id AS c_gpu_id, c.minute_ms AS c_minute_ms, \
    c.energy_mj AS c_energy_mj, c.g_per_kwh AS c_g_per_kwh, c.pue AS c_pue, \
    c.carbon_g AS c_carbon_g, c.provider AS c_provider, c.region AS c_region, \
    c.kind AS c_kind, c.factor_type AS c_factor_type, c.estimated AS c_estimated, \
    c.basis AS c_basis, c.priced_at_ms AS c_priced_at_ms";
