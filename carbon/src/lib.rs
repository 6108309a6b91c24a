//! gpufleet's carbon intensity: how clean the grid was (or is forecast to be) at a time, in
//! a region, and where that figure came from.
//!
//! - [`slot`]: the domain types ([`IntensitySlot`], [`IntensityKind`], [`FactorType`],
//!   [`ProviderKind`]) and the error of this boundary ([`CarbonError`]).
//! - [`provider`]: the [`IntensityProvider`] trait every source implements.
//! - [`fixed`] and [`csv_series`]: a static g/kWh and a CSV time series (no network).
//! - [`uk`] and [`electricitymaps`]: the UK Carbon Intensity API and Electricity Maps,
//!   over [`http`] (timeouts, retries with exponential backoff, configurable base URL).
//! - [`config`]: the `--carbon-*` / `--pue` flags ([`CarbonArgs`]), the `[carbon]` table of
//!   the config file with per-node overrides, and the resolved per-node settings.
//!
//! Used by the collector (pricing stored energy) and the agent (`exec`, one job standalone).
//! Nothing here knows the store; the collector caches slots in it.

pub mod config;
pub mod csv_series;
pub mod electricitymaps;
pub mod fixed;
pub mod http;
pub mod provider;
pub mod slot;
pub mod uk;

pub use config::{CarbonArgs, CarbonConfig, NodeCarbon, NodeOverride, ProviderSettings};
pub use provider::IntensityProvider;
pub use slot::{CarbonError, FactorType, IntensityKind, IntensitySlot, ProviderKind};
