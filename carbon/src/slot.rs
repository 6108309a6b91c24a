//! Carbon-intensity domain types: one slot of intensity, how it was obtained, and the
//! error of the provider boundary.

use gpufleet_core::UnixMs;
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// Where intensities come from (`--carbon-provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// One configured g/kWh (`--carbon-g-per-kwh`), at every time.
    Static,
    /// A CSV time series `from,to,g_per_kwh[,kind]` (`--carbon-csv`).
    Csv,
    /// The UK Carbon Intensity API (regional by region id, or national).
    Uk,
    /// Electricity Maps (a zone; needs a token).
    Electricitymaps,
}

impl ProviderKind {
    /// Every provider, in the order the flags list them.
    pub const ALL: [ProviderKind; 4] = [
        ProviderKind::Static,
        ProviderKind::Csv,
        ProviderKind::Uk,
        ProviderKind::Electricitymaps,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Static => "static",
            ProviderKind::Csv => "csv",
            ProviderKind::Uk => "uk",
            ProviderKind::Electricitymaps => "electricitymaps",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "static" => Some(ProviderKind::Static),
            "csv" => Some(ProviderKind::Csv),
            "uk" => Some(ProviderKind::Uk),
            "electricitymaps" => Some(ProviderKind::Electricitymaps),
            _ => None,
        }
    }
}

impl std::str::FromStr for ProviderKind {
    type Err = String;

    /// `static`, `csv`, `uk` or `electricitymaps`.
    fn from_str(s: &str) -> Result<Self, String> {
        ProviderKind::parse(s).ok_or_else(|| {
            format!("unknown carbon provider {s:?}: use static, csv, uk or electricitymaps")
        })
    }
}

impl std::str::FromStr for FactorType {
    type Err = String;

    /// `direct` or `lifecycle`.
    fn from_str(s: &str) -> Result<Self, String> {
        FactorType::parse(s)
            .ok_or_else(|| format!("unknown emission factor type {s:?}: use direct or lifecycle"))
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a slot's value was forecast or measured. A forecast is replaced by the actual
/// when the provider later gives one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IntensityKind {
    Forecast,
    Actual,
}

impl IntensityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            IntensityKind::Forecast => "forecast",
            IntensityKind::Actual => "actual",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "forecast" => Some(IntensityKind::Forecast),
            "actual" => Some(IntensityKind::Actual),
            _ => None,
        }
    }
}

/// Which emissions an intensity counts. Figures of different factor types are never mixed
/// silently: every stored figure records its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FactorType {
    /// Operational (combustion) emissions only; what the UK API reports.
    Direct,
    /// Life-cycle emissions (construction, fuel supply, …); Electricity Maps' default.
    Lifecycle,
}

impl FactorType {
    /// Both factor types, in the order the flags list them.
    pub const ALL: [FactorType; 2] = [FactorType::Direct, FactorType::Lifecycle];

    pub fn as_str(self) -> &'static str {
        match self {
            FactorType::Direct => "direct",
            FactorType::Lifecycle => "lifecycle",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "direct" => Some(FactorType::Direct),
            "lifecycle" => Some(FactorType::Lifecycle),
            _ => None,
        }
    }
}

/// The grid's carbon intensity over one time slot `[from_ms, to_ms)` in one region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntensitySlot {
    /// Start of the slot, Unix ms (inclusive).
    pub from_ms: UnixMs,
    /// End of the slot, Unix ms (exclusive).
    pub to_ms: UnixMs,
    /// gCO2(eq) per kWh.
    pub g_per_kwh: f64,
    /// Forecast or measured.
    pub kind: IntensityKind,
    /// Direct (operational) or life-cycle emissions.
    pub factor_type: FactorType,
    /// Which provider gave it.
    pub provider: ProviderKind,
    /// The provider's region: a UK region id (`13`), `national`, an Electricity Maps zone
    /// (`DE`), or what the configuration names for static / CSV figures.
    pub region: String,
    /// When it was fetched (or read), Unix ms.
    pub fetched_at_ms: UnixMs,
    /// The value is an estimate, not the provider's figure for the slot: the provider said
    /// so (Electricity Maps' `isEstimated`), or it was unreachable and the value is the
    /// last known one or the configured default.
    pub estimated: bool,
}

impl IntensitySlot {
    /// Whether `t_ms` lies in `[from_ms, to_ms)`.
    pub fn contains(&self, t_ms: UnixMs) -> bool {
        self.from_ms <= t_ms && t_ms < self.to_ms
    }
}

/// gCO2 of `energy_mj` (millijoules) at `g_per_kwh` and `pue`: kWh × g/kWh × PUE.
pub fn carbon_g(energy_mj: u64, g_per_kwh: f64, pue: f64) -> f64 {
    energy_mj as f64 / 3.6e9 * g_per_kwh * pue
}

/// The slot holding `t_ms`, if any (slots need not be sorted).
pub fn slot_at(slots: &[IntensitySlot], t_ms: UnixMs) -> Option<&IntensitySlot> {
    slots.iter().find(|s| s.contains(t_ms))
}

/// What can go wrong getting intensities. Messages name the provider and, for HTTP, the
/// URL (never the token).
#[derive(Debug, Error)]
pub enum CarbonError {
    #[error("carbon provider {provider}: cannot reach {url}: {reason}")]
    Unreachable {
        provider: ProviderKind,
        url: String,
        reason: String,
    },
    #[error("carbon provider {provider}: {url} answered HTTP {status}: {message}")]
    Http {
        provider: ProviderKind,
        url: String,
        status: u16,
        message: String,
    },
    #[error(
        "carbon provider {provider}: {url} returned a response that is not what it should be: {reason}"
    )]
    Malformed {
        provider: ProviderKind,
        url: String,
        reason: String,
    },
    #[error("carbon provider {provider}: no intensity for region {region:?} at {at}")]
    NoData {
        provider: ProviderKind,
        region: String,
        at: String,
    },
    #[error("carbon configuration: {0}")]
    Config(String),
    #[error("carbon CSV {path}: {reason}")]
    Csv { path: String, reason: String },
}

impl CarbonError {
    /// Whether trying again later may help (the network, the provider's server); a
    /// malformed answer or a bad configuration will not get better by retrying.
    pub fn is_transient(&self) -> bool {
        match self {
            CarbonError::Unreachable { .. } => true,
            CarbonError::Http { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// Parses the providers' timestamps: RFC 3339 with or without seconds
/// (`2026-11-20T10:00Z`, the UK API's form; `2026-11-20T10:00:00.000Z`), or Unix ms.
pub fn parse_provider_time(s: &str) -> Result<UnixMs, String> {
    let s = s.trim();
    // `YYYY-MM-DDThh:mmZ` lacks seconds, which RFC 3339 requires.
    if s.len() == 17 && s.as_bytes().get(10) == Some(&b'T') && s.ends_with('Z') {
        let with_seconds = format!("{}:00Z", &s[..16]);
        return gpufleet_core::config::parse_time(&with_seconds, 0).map_err(|e| e.to_string());
    }
    if s.starts_with("now") || s.starts_with('-') {
        return Err(format!("invalid time {s:?}"));
    }
    gpufleet_core::config::parse_time(s, 0).map_err(|e| e.to_string())
}

/// Formats Unix ms the way the UK API's paths want it: `2026-11-20T10:00Z`.
pub fn format_minute_utc(ms: UnixMs) -> String {
    let full = gpufleet_core::config::format_time(ms);
    // `2026-11-20T10:00:00.000Z` → `2026-11-20T10:00Z`
    format!("{}Z", &full[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_times() {
        assert_eq!(
            parse_provider_time("2026-11-20T10:00Z"),
            Ok(1_795_168_800_000)
        );
        assert_eq!(
            parse_provider_time("2026-11-20T10:00:00.000Z"),
            Ok(1_795_168_800_000)
        );
        assert_eq!(parse_provider_time("1795168800000"), Ok(1_795_168_800_000));
        assert!(parse_provider_time("now").is_err());
        assert!(parse_provider_time("2026-11-20").is_err());
        assert_eq!(format_minute_utc(1_795_168_800_000), "2026-11-20T10:00Z");
    }

    #[test]
    fn pricing() {
        // 3.6e9 mJ = 1 kWh; at 200 g/kWh and PUE 1.5: 300 g.
        assert!((carbon_g(3_600_000_000, 200.0, 1.5) - 300.0).abs() < 1e-9);
        let s = |from_ms, g| IntensitySlot {
            from_ms,
            to_ms: from_ms + 10,
            g_per_kwh: g,
            kind: IntensityKind::Actual,
            factor_type: FactorType::Direct,
            provider: ProviderKind::Static,
            region: String::new(),
            fetched_at_ms: 0,
            estimated: false,
        };
        let slots = [s(10, 1.0), s(0, 2.0)];
        assert_eq!(slot_at(&slots, 9).map(|x| x.g_per_kwh), Some(2.0));
        assert_eq!(slot_at(&slots, 10).map(|x| x.g_per_kwh), Some(1.0));
        assert!(slot_at(&slots, 20).is_none());
    }

    #[test]
    fn names_round_trip() {
        for k in [
            ProviderKind::Static,
            ProviderKind::Csv,
            ProviderKind::Uk,
            ProviderKind::Electricitymaps,
        ] {
            assert_eq!(ProviderKind::parse(k.as_str()), Some(k));
        }
        for k in [IntensityKind::Forecast, IntensityKind::Actual] {
            assert_eq!(IntensityKind::parse(k.as_str()), Some(k));
        }
        for k in [FactorType::Direct, FactorType::Lifecycle] {
            assert_eq!(FactorType::parse(k.as_str()), Some(k));
        }
    }
}
