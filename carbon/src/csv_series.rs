//! The CSV provider: a time series `from,to,g_per_kwh[,kind]` read from a file, e.g. a
//! utility's published figures or a site's own meter. Times are RFC 3339 or Unix ms;
//! `kind` is `forecast` or `actual` (default `actual`). A first line `from,to,…` is a
//! header and skipped. Rows are sorted by `from`; overlapping rows are an error.

use crate::provider::IntensityProvider;
use crate::slot::{
    CarbonError, FactorType, IntensityKind, IntensitySlot, ProviderKind, parse_provider_time,
};
use async_trait::async_trait;
use gpufleet_core::UnixMs;
use std::path::{Path, PathBuf};

/// A CSV series, read once at start.
#[derive(Debug, Clone)]
pub struct CsvProvider {
    /// The file it was read from (for messages).
    pub path: PathBuf,
    /// Sorted by `from_ms`, not overlapping. Their `region` is empty: the series applies
    /// to whichever region the node is configured with.
    slots: Vec<IntensitySlot>,
}

impl CsvProvider {
    /// Reads and checks the file.
    pub fn open(path: &Path, factor_type: FactorType) -> Result<Self, CarbonError> {
        let text = std::fs::read_to_string(path).map_err(|e| CarbonError::Csv {
            path: path.display().to_string(),
            reason: format!("cannot read it: {e}"),
        })?;
        Self::parse(path, &text, factor_type)
    }

    /// Parses a series from `text` (`path` is for messages).
    pub fn parse(path: &Path, text: &str, factor_type: FactorType) -> Result<Self, CarbonError> {
        let err = |line: u64, reason: String| CarbonError::Csv {
            path: path.display().to_string(),
            reason: format!("line {line}: {reason}"),
        };
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .comment(Some(b'#'))
            .from_reader(text.as_bytes());
        let fetched_at_ms = gpufleet_core::config::now_ms();
        let mut slots: Vec<IntensitySlot> = Vec::new();
        for (i, record) in reader.records().enumerate() {
            let record = record.map_err(|e| CarbonError::Csv {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            let line = record.position().map_or(i as u64 + 1, |p| p.line());
            if i == 0
                && record
                    .get(0)
                    .is_some_and(|f| f.eq_ignore_ascii_case("from"))
            {
                continue;
            }
            if record.len() < 3 || record.len() > 4 {
                return Err(err(
                    line,
                    format!(
                        "expected from,to,g_per_kwh[,kind], got {} fields",
                        record.len()
                    ),
                ));
            }
            let field = |n: usize| record.get(n).unwrap_or_default();
            let from_ms = parse_provider_time(field(0)).map_err(|e| err(line, e))?;
            let to_ms = parse_provider_time(field(1)).map_err(|e| err(line, e))?;
            if to_ms <= from_ms {
                return Err(err(line, "`to` must be after `from`".into()));
            }
            let g_per_kwh: f64 = field(2)
                .parse()
                .ok()
                .filter(|g: &f64| g.is_finite() && *g >= 0.0)
                .ok_or_else(|| {
                    err(
                        line,
                        format!("g_per_kwh {:?} is not a number >= 0", field(2)),
                    )
                })?;
            let kind = match record.get(3) {
                None | Some("") => IntensityKind::Actual,
                Some(k) => IntensityKind::parse(&k.to_ascii_lowercase()).ok_or_else(|| {
                    err(line, format!("kind {k:?} is neither forecast nor actual"))
                })?,
            };
            slots.push(IntensitySlot {
                from_ms,
                to_ms,
                g_per_kwh,
                kind,
                factor_type,
                provider: ProviderKind::Csv,
                region: String::new(),
                fetched_at_ms,
                estimated: false,
            });
        }
        slots.sort_by_key(|s| s.from_ms);
        for w in slots.windows(2) {
            if w[1].from_ms < w[0].to_ms {
                return Err(CarbonError::Csv {
                    path: path.display().to_string(),
                    reason: format!(
                        "rows overlap: one ends at {} after the next starts at {}",
                        gpufleet_core::config::format_time(w[0].to_ms),
                        gpufleet_core::config::format_time(w[1].from_ms)
                    ),
                });
            }
        }
        Ok(CsvProvider {
            path: path.to_owned(),
            slots,
        })
    }
}

#[async_trait]
impl IntensityProvider for CsvProvider {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Csv
    }

    async fn slots(
        &self,
        region: &str,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<Vec<IntensitySlot>, CarbonError> {
        Ok(self
            .slots
            .iter()
            .filter(|s| s.to_ms > from_ms && s.from_ms < to_ms)
            .map(|s| IntensitySlot {
                region: region.to_owned(),
                ..s.clone()
            })
            .collect())
    }

    async fn latest(&self, region: &str) -> Result<IntensitySlot, CarbonError> {
        let now = gpufleet_core::config::now_ms();
        self.slots
            .iter()
            .find(|s| s.contains(now))
            .map(|s| IntensitySlot {
                region: region.to_owned(),
                ..s.clone()
            })
            .ok_or_else(|| CarbonError::NoData {
                provider: ProviderKind::Csv,
                region: region.to_owned(),
                at: gpufleet_core::config::format_time(now),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERIES: &str = "from,to,g_per_kwh,kind\n\
        2026-11-20T10:00:00Z,2026-11-20T10:30:00Z,183,actual\n\
        # a comment\n\
        1795170600000,1795172400000,190.5,forecast\n\
        2026-11-20T11:00Z,2026-11-20T11:30Z,200\n";

    #[tokio::test]
    async fn parses_rfc3339_ms_kinds_and_filters_by_range() {
        let p = CsvProvider::parse(Path::new("s.csv"), SERIES, FactorType::Direct).expect("parses");
        let all = p.slots("lon", 0, i64::MAX).await.expect("slots");
        let got: Vec<(i64, i64, f64, IntensityKind)> = all
            .iter()
            .map(|s| (s.from_ms, s.to_ms, s.g_per_kwh, s.kind))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    1_795_168_800_000,
                    1_795_170_600_000,
                    183.0,
                    IntensityKind::Actual
                ),
                (
                    1_795_170_600_000,
                    1_795_172_400_000,
                    190.5,
                    IntensityKind::Forecast
                ),
                (
                    1_795_172_400_000,
                    1_795_174_200_000,
                    200.0,
                    IntensityKind::Actual
                ),
            ]
        );
        assert!(
            all.iter()
                .all(|s| s.region == "lon" && s.provider == ProviderKind::Csv)
        );
        // [10:29, 10:31) overlaps the first two rows only.
        let some = p
            .slots("lon", 1_795_170_540_000, 1_795_170_660_000)
            .await
            .expect("slots");
        assert_eq!(some.len(), 2);
    }

    #[test]
    fn bad_rows_are_clear_errors() {
        for (text, needle) in [
            (
                "2026-11-20T10:00Z,2026-11-20T10:30Z,-5\n",
                "not a number >= 0",
            ),
            ("2026-11-20T10:00Z,2026-11-20T10:30Z,abc\n", "not a number"),
            (
                "2026-11-20T10:30Z,2026-11-20T10:00Z,5\n",
                "`to` must be after",
            ),
            ("2026-11-20T10:00Z,2026-11-20T10:30Z\n", "expected from,to"),
            ("yesterday,2026-11-20T10:30Z,5\n", "invalid time"),
            (
                "2026-11-20T10:00Z,2026-11-20T10:30Z,5,guess\n",
                "neither forecast",
            ),
            (
                "2026-11-20T10:00Z,2026-11-20T10:30Z,5\n2026-11-20T10:15Z,2026-11-20T10:45Z,5\n",
                "overlap",
            ),
        ] {
            let e = CsvProvider::parse(Path::new("x.csv"), text, FactorType::Direct)
                .expect_err(text)
                .to_string();
            assert!(e.contains(needle) && e.contains("x.csv"), "{text}: {e}");
        }
    }
}
