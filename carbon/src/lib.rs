//! gpufleet's carbon intensity: how clean the grid was (or is forecast to be) at a time, in
//! a region, and where that figure came from.
//!
//! - [`slot`]: the domain types ([`IntensitySlot`], [`IntensityKind`], [`FactorType`],
//!   [`ProviderKind`]), the error of this boundary ([`CarbonError`]), and the pure pricing
//!   ([`carbon_g`]: energy × intensity × PUE; [`slot_at`]).
//! - [`provider`]: the [`IntensityProvider`] trait every source implements.
//! - [`fixed`] and [`csv_series`]: a static g/kWh and a CSV time series (no network).
//! - [`uk`] and [`electricitymaps`]: the UK Carbon Intensity API and Electricity Maps,
//!   over [`http`] (timeouts, retries with exponential backoff, configurable base URL).
//! - [`config`]: what the `--carbon-*` / `--pue` flags set ([`CarbonSettings`]; the flags
//!   themselves are the binaries', in `gpufleet-cli`), the `[carbon]` table of the config
//!   file with per-node overrides, and the resolved per-node settings.
//!
//! Used by the collector (pricing stored energy) and `gpufleet-exec` (one job standalone).
//! Nothing here knows the store; the collector caches slots in it.

pub mod config;
pub mod csv_series;
pub mod electricitymaps;
pub mod fixed;
pub mod http;
pub mod provider;
pub mod slot;
pub mod uk;

pub use config::{CarbonConfig, CarbonSettings, NodeCarbon, NodeOverride, ProviderSettings};
pub use provider::IntensityProvider;
pub use slot::{
    CarbonError, FactorType, IntensityKind, IntensitySlot, ProviderKind, carbon_g, slot_at,
};
