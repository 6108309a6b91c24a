//! The boundary every carbon-intensity source sits behind.

use crate::slot::{CarbonError, IntensitySlot, ProviderKind};
use async_trait::async_trait;
use gpufleet_core::UnixMs;

/// Twenty-four hours in ms: the forecast horizon the collector prefetches.
pub const DAY_MS: i64 = 24 * 3600 * 1000;

/// A source of carbon intensities.
///
/// Contract: an implementation never substitutes a value it does not have. A region or a
/// time it has nothing for is an error or an absent slot, never `0`. Falling back to the
/// last known value or a configured default is the caller's decision, and the caller marks
/// such figures `estimated`.
#[async_trait]
pub trait IntensityProvider: Send + Sync + std::fmt::Debug {
    /// Which provider this is (recorded with every slot).
    fn kind(&self) -> ProviderKind;

    /// The slots overlapping `[from_ms, to_ms)` in `region`, oldest first. Past slots are
    /// actual where the provider has measured them, otherwise forecast; future slots are
    /// forecast. A slot may start before `from_ms` or end after `to_ms`.
    async fn slots(
        &self,
        region: &str,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<Vec<IntensitySlot>, CarbonError>;

    /// The forecast for the 24 hours from `from_ms` (the UK API's `fw24h`). Providers
    /// without a forecast return what `slots` gives for that range.
    async fn forecast_24h(
        &self,
        region: &str,
        from_ms: UnixMs,
    ) -> Result<Vec<IntensitySlot>, CarbonError> {
        self.slots(region, from_ms, from_ms + DAY_MS).await
    }

    /// The current slot in `region`.
    async fn latest(&self, region: &str) -> Result<IntensitySlot, CarbonError>;
}
