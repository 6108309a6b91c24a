//! The static provider: one configured g/kWh at every time (`--carbon-g-per-kwh`).

use crate::provider::IntensityProvider;
use crate::slot::{CarbonError, FactorType, IntensityKind, IntensitySlot, ProviderKind};
use async_trait::async_trait;
use gpufleet_core::UnixMs;

/// One intensity for every time. Its slots are `actual` (the figure is what the operator
/// chose, not a forecast) and not `estimated`.
#[derive(Debug, Clone)]
pub struct StaticProvider {
    /// gCO2 per kWh.
    pub g_per_kwh: f64,
    /// What the figure counts; the operator says (`--carbon-factor-type`, default direct).
    pub factor_type: FactorType,
}

impl StaticProvider {
    pub fn new(g_per_kwh: f64, factor_type: FactorType) -> Result<Self, CarbonError> {
        if !g_per_kwh.is_finite() || g_per_kwh < 0.0 {
            return Err(CarbonError::Config(format!(
                "--carbon-g-per-kwh must be a finite number >= 0, got {g_per_kwh}"
            )));
        }
        Ok(StaticProvider {
            g_per_kwh,
            factor_type,
        })
    }

    fn slot(&self, region: &str, from_ms: UnixMs, to_ms: UnixMs) -> IntensitySlot {
        IntensitySlot {
            from_ms,
            to_ms,
            g_per_kwh: self.g_per_kwh,
            kind: IntensityKind::Actual,
            factor_type: self.factor_type,
            provider: ProviderKind::Static,
            region: region.to_owned(),
            fetched_at_ms: gpufleet_core::config::now_ms(),
            estimated: false,
        }
    }
}

#[async_trait]
impl IntensityProvider for StaticProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Static
    }

    async fn slots(
        &self,
        region: &str,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<Vec<IntensitySlot>, CarbonError> {
        if to_ms <= from_ms {
            return Ok(Vec::new());
        }
        Ok(vec![self.slot(region, from_ms, to_ms)])
    }

    async fn latest(&self, region: &str) -> Result<IntensitySlot, CarbonError> {
        let hour = 3_600_000;
        let now = gpufleet_core::config::now_ms();
        let from = now - now.rem_euclid(hour);
        Ok(self.slot(region, from, from + hour))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_slot_covering_the_range() {
        let p = StaticProvider::new(210.5, FactorType::Direct).expect("valid");
        let s = p.slots("lab", 1_000, 61_000).await.expect("slots");
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].from_ms, s[0].to_ms, s[0].g_per_kwh),
            (1_000, 61_000, 210.5)
        );
        assert_eq!(s[0].region, "lab");
        assert!(!s[0].estimated);
        assert!(p.slots("lab", 5, 5).await.expect("empty").is_empty());
        assert!(StaticProvider::new(f64::NAN, FactorType::Direct).is_err());
        assert!(StaticProvider::new(-1.0, FactorType::Direct).is_err());
    }
}
