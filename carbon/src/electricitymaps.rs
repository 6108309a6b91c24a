//! Electricity Maps (`/v3/carbon-intensity/latest` and `/history`, header `auth-token`,
//! gCO2eq/kWh, hourly). Regions are zones (`DE`, `FR`, `US-CAL-CISO`). Each answer says its
//! `emissionFactorType` (`lifecycle` by default, or `direct`); every slot records it, and a
//! slot of another type than configured is an error rather than a silent mix.
//! `isEstimated` marks the slot `estimated`. History covers the last 24 hours; there is no
//! forecast here (the free tier has none), so the forecast of a future range is empty.

use crate::http::{HttpOptions, JsonClient};
use crate::provider::IntensityProvider;
use crate::slot::{
    CarbonError, FactorType, IntensityKind, IntensitySlot, ProviderKind, parse_provider_time,
};
use async_trait::async_trait;
use gpufleet_core::UnixMs;
use serde_json::Value;

/// The public API's base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.electricitymap.org";

const HOUR_MS: i64 = 3_600_000;

/// The Electricity Maps provider.
#[derive(Debug, Clone)]
pub struct ElectricityMapsProvider {
    client: JsonClient,
    /// The factor type asked for (`emissionFactorType` query parameter).
    factor_type: FactorType,
}

impl ElectricityMapsProvider {
    /// `token` is sent as the `auth-token` header (marked sensitive; never logged).
    pub fn new(
        options: HttpOptions,
        token: &str,
        factor_type: FactorType,
    ) -> Result<Self, CarbonError> {
        let mut headers = reqwest::header::HeaderMap::new();
        let mut value = reqwest::header::HeaderValue::from_str(token.trim()).map_err(|_| {
            CarbonError::Config(
                "the Electricity Maps token (--carbon-token-file) has characters a header cannot carry"
                    .into(),
            )
        })?;
        value.set_sensitive(true);
        headers.insert("auth-token", value);
        Ok(ElectricityMapsProvider {
            client: JsonClient::new(ProviderKind::Electricitymaps, options, headers)?,
            factor_type,
        })
    }

    fn path(&self, what: &str, zone: &str) -> Result<String, CarbonError> {
        let zone = zone.trim();
        if zone.is_empty()
            || !zone
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(CarbonError::Config(format!(
                "Electricity Maps zone {zone:?} is not a zone code like DE or US-CAL-CISO (--carbon-region)"
            )));
        }
        Ok(format!(
            "/v3/carbon-intensity/{what}?zone={zone}&emissionFactorType={}",
            self.factor_type.as_str()
        ))
    }

    async fn fetch(
        &self,
        path: &str,
        zone: &str,
        history: bool,
    ) -> Result<Vec<IntensitySlot>, CarbonError> {
        let body = self.client.get_json(path).await?;
        let now = gpufleet_core::config::now_ms();
        let parsed = if history {
            parse_history(&body, zone, now)
        } else {
            parse_latest(&body, zone, now).map(|s| vec![s])
        };
        let malformed = |reason: String| CarbonError::Malformed {
            provider: ProviderKind::Electricitymaps,
            url: self.client.url(path),
            reason,
        };
        let slots = parsed.map_err(malformed)?;
        if let Some(s) = slots.iter().find(|s| s.factor_type != self.factor_type) {
            return Err(malformed(format!(
                "asked for {} emission factors, got {}",
                self.factor_type.as_str(),
                s.factor_type.as_str()
            )));
        }
        Ok(slots)
    }
}

#[async_trait]
impl IntensityProvider for ElectricityMapsProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Electricitymaps
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
        let path = self.path("history", region)?;
        let mut slots = self.fetch(&path, region, true).await?;
        // The current hour is not in the history yet.
        let newest = slots.last().map(|s| s.to_ms);
        if newest.is_none_or(|t| t < to_ms) {
            let latest = self.latest(region).await?;
            if newest.is_none_or(|t| latest.from_ms >= t) {
                slots.push(latest);
            }
        }
        slots.retain(|s| s.to_ms > from_ms && s.from_ms < to_ms);
        Ok(slots)
    }

    async fn forecast_24h(
        &self,
        _region: &str,
        _from_ms: UnixMs,
    ) -> Result<Vec<IntensitySlot>, CarbonError> {
        Ok(Vec::new())
    }

    async fn latest(&self, region: &str) -> Result<IntensitySlot, CarbonError> {
        let path = self.path("latest", region)?;
        let mut slots = self.fetch(&path, region, false).await?;
        slots.pop().ok_or_else(|| CarbonError::NoData {
            provider: ProviderKind::Electricitymaps,
            region: region.to_owned(),
            at: "now".into(),
        })
    }
}

/// Parses `/v3/carbon-intensity/latest`.
pub fn parse_latest(
    body: &Value,
    zone: &str,
    fetched_at_ms: UnixMs,
) -> Result<IntensitySlot, String> {
    parse_point(body, zone, fetched_at_ms)
}

/// Parses `/v3/carbon-intensity/history` (`{"zone", "history": [point…]}`), oldest first.
/// Points without a `carbonIntensity` are left out (absent, not zero).
pub fn parse_history(
    body: &Value,
    zone: &str,
    fetched_at_ms: UnixMs,
) -> Result<Vec<IntensitySlot>, String> {
    let history = body
        .get("history")
        .and_then(Value::as_array)
        .ok_or_else(|| match body.get("error").or_else(|| body.get("message")) {
            Some(e) => format!("an error instead of history: {e}"),
            None => "no `history` array".to_owned(),
        })?;
    let mut out = Vec::with_capacity(history.len());
    for (i, p) in history.iter().enumerate() {
        if matches!(p.get("carbonIntensity"), None | Some(Value::Null)) {
            continue;
        }
        out.push(parse_point(p, zone, fetched_at_ms).map_err(|e| format!("history[{i}]: {e}"))?);
    }
    out.sort_by_key(|s| s.from_ms);
    Ok(out)
}

fn parse_point(p: &Value, zone: &str, fetched_at_ms: UnixMs) -> Result<IntensitySlot, String> {
    if let Some(z) = p.get("zone").and_then(Value::as_str)
        && !z.eq_ignore_ascii_case(zone)
    {
        return Err(format!("asked for zone {zone}, the answer is for {z}"));
    }
    let g_per_kwh = match p.get("carbonIntensity") {
        Some(v) => v
            .as_f64()
            .filter(|g| g.is_finite() && *g >= 0.0)
            .ok_or_else(|| format!("`carbonIntensity` is not a number >= 0: {v}"))?,
        None => {
            return Err(match p.get("error").or_else(|| p.get("message")) {
                Some(e) => format!("an error instead of an intensity: {e}"),
                None => "no `carbonIntensity`".to_owned(),
            });
        }
    };
    let from_ms = p
        .get("datetime")
        .and_then(Value::as_str)
        .ok_or("no `datetime`")
        .map_err(str::to_owned)
        .and_then(parse_provider_time)?;
    let factor_type = match p.get("emissionFactorType").and_then(Value::as_str) {
        None => FactorType::Lifecycle, // the API's default
        Some(t) => {
            FactorType::parse(t).ok_or_else(|| format!("unknown emissionFactorType {t:?}"))?
        }
    };
    Ok(IntensitySlot {
        from_ms,
        to_ms: from_ms + HOUR_MS,
        g_per_kwh,
        kind: IntensityKind::Actual,
        factor_type,
        provider: ProviderKind::Electricitymaps,
        region: zone.to_owned(),
        fetched_at_ms,
        estimated: p
            .get("isEstimated")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> Value {
        let path = format!("{}/../../shared/carbon/{name}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    const T10: i64 = 1_795_168_800_000; // 2026-11-20T10:00Z

    #[test]
    fn latest_de() {
        let s = parse_latest(&sample("em-v3-latest-DE.json"), "DE", 3).expect("parses");
        assert_eq!(
            (s.from_ms, s.to_ms, s.g_per_kwh),
            (T10, T10 + HOUR_MS, 302.0)
        );
        assert_eq!(
            (s.factor_type, s.kind, s.estimated),
            (FactorType::Lifecycle, IntensityKind::Actual, false)
        );
        assert_eq!((s.region.as_str(), s.fetched_at_ms), ("DE", 3));
        assert!(parse_latest(&sample("em-v3-latest-DE.json"), "FR", 0).is_err());
    }

    #[test]
    fn history_de() {
        let s = parse_history(&sample("em-v3-history-DE.json"), "DE", 0).expect("parses");
        assert!(s.len() >= 3, "{}", s.len());
        let day0 = T10 - 10 * HOUR_MS;
        assert_eq!((s[0].from_ms, s[0].g_per_kwh), (day0, 280.0));
        assert_eq!((s[1].from_ms, s[1].g_per_kwh), (day0 + HOUR_MS, 295.0));
        assert_eq!(s[2].g_per_kwh, 310.0);
        assert!(s.windows(2).all(|w| w[0].to_ms <= w[1].from_ms));
        assert!(s.iter().all(|x| x.factor_type == FactorType::Lifecycle));
    }

    #[test]
    fn malformed() {
        for (body, needle) in [
            (r#"{"zone":"DE"}"#, "no `history`"),
            (
                r#"{"history":[{"zone":"DE","carbonIntensity":"x","datetime":"2026-11-20T00:00:00.000Z"}]}"#,
                "not a number",
            ),
            (
                r#"{"history":[{"zone":"DE","carbonIntensity":5,"datetime":"2026-11-20T00:00:00.000Z","emissionFactorType":"magic"}]}"#,
                "unknown emissionFactorType",
            ),
            (
                r#"{"history":[{"zone":"DE","carbonIntensity":5}]}"#,
                "no `datetime`",
            ),
        ] {
            let v: Value = serde_json::from_str(body).expect("json");
            let e = parse_history(&v, "DE", 0).expect_err(body);
            assert!(e.contains(needle), "{body}: {e}");
        }
    }
}
