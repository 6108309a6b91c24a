//! The UK Carbon Intensity API (National Energy System Operator; no key; gCO2/kWh,
//! operational = [`FactorType::Direct`]; half-hour slots).
//!
//! Regions: `national` (Great Britain) or a region id `1`–`17` (13 = London). Keyed on the
//! id, never the name (names differ between endpoints). Endpoints used:
//! - `/intensity`, `/intensity/{from}/{to}`, `/intensity/{from}/fw24h` (national; `data` is
//!   an array of slots with `forecast` and `actual`, which may be `null`);
//! - `/regional/regionid/{id}` (`data` is an array with one region);
//! - `/regional/intensity/{from}/{to}/regionid/{id}` and `…/{from}/fw24h/regionid/{id}`
//!   (`data` is one region object). Regional slots carry a forecast only.
//!
//! A slot with an `actual` is [`IntensityKind::Actual`]; otherwise its forecast.

use crate::http::{HttpOptions, JsonClient};
use crate::provider::IntensityProvider;
use crate::slot::{
    CarbonError, FactorType, IntensityKind, IntensitySlot, ProviderKind, format_minute_utc,
    parse_provider_time,
};
use async_trait::async_trait;
use gpufleet_core::UnixMs;
use serde_json::Value;

/// The public API's base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.carbonintensity.org.uk";

/// A region of the UK API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UkRegion {
    National,
    /// Region id 1–17.
    Regional(u8),
}

impl UkRegion {
    pub fn parse(s: &str) -> Result<Self, CarbonError> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("national") || s.eq_ignore_ascii_case("gb") {
            return Ok(UkRegion::National);
        }
        match s.parse::<u8>() {
            Ok(id @ 1..=17) => Ok(UkRegion::Regional(id)),
            _ => Err(CarbonError::Config(format!(
                "UK carbon region {s:?} is not `national` or a region id 1-17 (13 = London; see README)"
            ))),
        }
    }

    /// The name stored with slots: `national` or the id.
    pub fn key(self) -> String {
        match self {
            UkRegion::National => "national".to_owned(),
            UkRegion::Regional(id) => id.to_string(),
        }
    }
}

/// The UK Carbon Intensity API provider.
#[derive(Debug, Clone)]
pub struct UkProvider {
    client: JsonClient,
}

impl UkProvider {
    pub fn new(options: HttpOptions) -> Result<Self, CarbonError> {
        Ok(UkProvider {
            client: JsonClient::new(ProviderKind::Uk, options, Default::default())?,
        })
    }

    async fn fetch(&self, region: UkRegion, path: &str) -> Result<Vec<IntensitySlot>, CarbonError> {
        let body = self.client.get_json(path).await?;
        parse_response(&body, region, gpufleet_core::config::now_ms()).map_err(|reason| {
            CarbonError::Malformed {
                provider: ProviderKind::Uk,
                url: self.client.url(path),
                reason,
            }
        })
    }
}

#[async_trait]
impl IntensityProvider for UkProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Uk
    }

    async fn slots(
        &self,
        region: &str,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<Vec<IntensitySlot>, CarbonError> {
        let r = UkRegion::parse(region)?;
        if to_ms <= from_ms {
            return Ok(Vec::new());
        }
        let (from, to) = (format_minute_utc(from_ms), format_minute_utc(to_ms));
        let path = match r {
            UkRegion::National => format!("/intensity/{from}/{to}"),
            UkRegion::Regional(id) => format!("/regional/intensity/{from}/{to}/regionid/{id}"),
        };
        let mut slots = self.fetch(r, &path).await?;
        slots.retain(|s| s.to_ms > from_ms && s.from_ms < to_ms);
        Ok(slots)
    }

    async fn forecast_24h(
        &self,
        region: &str,
        from_ms: UnixMs,
    ) -> Result<Vec<IntensitySlot>, CarbonError> {
        let r = UkRegion::parse(region)?;
        let from = format_minute_utc(from_ms);
        let path = match r {
            UkRegion::National => format!("/intensity/{from}/fw24h"),
            UkRegion::Regional(id) => format!("/regional/intensity/{from}/fw24h/regionid/{id}"),
        };
        self.fetch(r, &path).await
    }

    async fn latest(&self, region: &str) -> Result<IntensitySlot, CarbonError> {
        let r = UkRegion::parse(region)?;
        let path = match r {
            UkRegion::National => "/intensity".to_owned(),
            UkRegion::Regional(id) => format!("/regional/regionid/{id}"),
        };
        let slots = self.fetch(r, &path).await?;
        slots
            .into_iter()
            .last()
            .ok_or_else(|| CarbonError::Malformed {
                provider: ProviderKind::Uk,
                url: self.client.url(&path),
                reason: "no slot with a forecast or an actual".into(),
            })
    }
}

/// Parses any of the API's intensity answers into slots of `region`, oldest first.
/// Errors say what is wrong with the body.
pub fn parse_response(
    body: &Value,
    region: UkRegion,
    fetched_at_ms: UnixMs,
) -> Result<Vec<IntensitySlot>, String> {
    let data = body.get("data").ok_or_else(|| match body.get("error") {
        Some(e) => format!("an error instead of data: {e}"),
        None => "no `data` field".to_owned(),
    })?;
    // The slot list: national `data: [slot…]`; `/regional/regionid` `data: [region]`;
    // regional ranges `data: region`.
    let slots: &Vec<Value> = match data {
        Value::Object(_) => region_slots(data, region)?,
        Value::Array(items) => match items.first() {
            Some(first) if first.get("regionid").is_some() || first.get("data").is_some() => {
                if items.len() != 1 {
                    return Err(format!("expected one region, got {}", items.len()));
                }
                region_slots(first, region)?
            }
            _ => items,
        },
        _ => return Err("`data` is neither an array nor an object".to_owned()),
    };
    let mut out = Vec::with_capacity(slots.len());
    for (i, s) in slots.iter().enumerate() {
        if let Some(slot) =
            parse_slot(s, region, fetched_at_ms).map_err(|e| format!("slot {i}: {e}"))?
        {
            out.push(slot);
        }
    }
    out.sort_by_key(|s| s.from_ms);
    Ok(out)
}

fn region_slots(region_obj: &Value, want: UkRegion) -> Result<&Vec<Value>, String> {
    if let UkRegion::Regional(id) = want {
        let got = region_obj.get("regionid").and_then(Value::as_u64);
        if got != Some(u64::from(id)) {
            return Err(format!(
                "asked for region id {id}, the answer is for {got:?}"
            ));
        }
    }
    region_obj
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| "region without a `data` array of slots".to_owned())
}

/// One slot; `None` when it has neither a forecast nor an actual (absent, not zero).
fn parse_slot(
    s: &Value,
    region: UkRegion,
    fetched_at_ms: UnixMs,
) -> Result<Option<IntensitySlot>, String> {
    let time = |k: &str| -> Result<UnixMs, String> {
        let v = s
            .get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("no `{k}` time"))?;
        parse_provider_time(v)
    };
    let from_ms = time("from")?;
    let to_ms = time("to")?;
    if to_ms <= from_ms {
        return Err("`to` is not after `from`".into());
    }
    let intensity = s
        .get("intensity")
        .filter(|v| v.is_object())
        .ok_or("no `intensity` object")?;
    let number = |k: &str| -> Result<Option<f64>, String> {
        match intensity.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|g| g.is_finite() && *g >= 0.0)
                .map(Some)
                .ok_or_else(|| format!("`{k}` is not a number >= 0: {v}")),
        }
    };
    let (g_per_kwh, kind) = match (number("actual")?, number("forecast")?) {
        (Some(a), _) => (a, IntensityKind::Actual),
        (None, Some(f)) => (f, IntensityKind::Forecast),
        (None, None) => return Ok(None),
    };
    Ok(Some(IntensitySlot {
        from_ms,
        to_ms,
        g_per_kwh,
        kind,
        factor_type: FactorType::Direct,
        provider: ProviderKind::Uk,
        region: region.key(),
        fetched_at_ms,
        estimated: false,
    }))
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
    const HALF: i64 = 1_800_000;

    #[test]
    fn national_with_actual() {
        let s =
            parse_response(&sample("uk-intensity.json"), UkRegion::National, 7).expect("parses");
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].from_ms, s[0].to_ms), (T10, T10 + HALF));
        assert_eq!((s[0].g_per_kwh, s[0].kind), (178.0, IntensityKind::Actual));
        assert_eq!(s[0].factor_type, FactorType::Direct);
        assert_eq!((s[0].region.as_str(), s[0].fetched_at_ms), ("national", 7));
    }

    #[test]
    fn national_actual_null_is_the_forecast() {
        let s = parse_response(
            &sample("uk-intensity-actual-null.json"),
            UkRegion::National,
            0,
        )
        .expect("parses");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].from_ms, T10 + HALF);
        assert_eq!(
            (s[0].g_per_kwh, s[0].kind),
            (190.0, IntensityKind::Forecast)
        );
    }

    #[test]
    fn regional_latest_array_of_one_region() {
        let s = parse_response(
            &sample("uk-regional-regionid-13.json"),
            UkRegion::Regional(13),
            0,
        )
        .expect("parses");
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].from_ms, s[0].g_per_kwh), (T10, 199.0));
        assert_eq!(
            (s[0].kind, s[0].region.as_str()),
            (IntensityKind::Forecast, "13")
        );
        let wrong = parse_response(
            &sample("uk-regional-regionid-13.json"),
            UkRegion::Regional(7),
            0,
        );
        assert!(wrong.expect_err("region 7").contains("region id 7"));
    }

    #[test]
    fn regional_fw24h_object_48_slots() {
        let s = parse_response(
            &sample("uk-regional-fw24h-regionid-13.json"),
            UkRegion::Regional(13),
            0,
        )
        .expect("parses");
        assert_eq!(s.len(), 48);
        let day0 = T10 - 10 * 3_600_000;
        assert_eq!((s[0].from_ms, s[0].g_per_kwh), (day0, 82.0));
        assert_eq!(s[1].g_per_kwh, 81.0);
        assert_eq!(s[47].to_ms, day0 + 48 * HALF);
        assert!(s.windows(2).all(|w| w[0].to_ms == w[1].from_ms));
        assert!(s.iter().all(|x| x.kind == IntensityKind::Forecast));
    }

    #[test]
    fn error_and_malformed_bodies() {
        let e = parse_response(&sample("uk-error-400.json"), UkRegion::Regional(13), 0)
            .expect_err("error body");
        assert!(e.contains("valid region ID"), "{e}");
        for (body, needle) in [
            (r#"{"data": 5}"#, "neither an array"),
            (
                r#"{"data": [{"from": "x", "to": "2026-11-20T10:30Z", "intensity": {"forecast": 1}}]}"#,
                "invalid time",
            ),
            (
                r#"{"data": [{"from": "2026-11-20T10:00Z", "to": "2026-11-20T10:30Z", "intensity": {"forecast": "high"}}]}"#,
                "not a number",
            ),
            (
                r#"{"data": [{"from": "2026-11-20T10:00Z", "to": "2026-11-20T10:30Z"}]}"#,
                "no `intensity`",
            ),
            (r#"{}"#, "no `data`"),
        ] {
            let v: Value = serde_json::from_str(body).expect("json");
            let e = parse_response(&v, UkRegion::National, 0).expect_err(body);
            assert!(e.contains(needle), "{body}: {e}");
        }
    }

    #[test]
    fn regions() {
        assert_eq!(UkRegion::parse("13").expect("13"), UkRegion::Regional(13));
        assert_eq!(UkRegion::parse("national").expect("n"), UkRegion::National);
        assert!(UkRegion::parse("18").is_err());
        assert!(UkRegion::parse("London").is_err());
    }
}
