//! Carbon accounting in the store ([`CarbonStore`]): the intensity cache, per-minute
//! prices and the API's carbon aggregates, with their SQL once for both backends (writes
//! of many rows in one statement, over a [`Table`]). The pricing is in
//! `accounting::carbon` (collector).

use super::backend::{Backend, Get, GetExt, List, Table, sql};
use super::energy::u64_to_i64;
use super::rows::limit_i64;
use super::{GpuId, SqlStore, StoreError, TimeRange};
use async_trait::async_trait;
use gpufleet_carbon::{FactorType, IntensityKind, IntensitySlot, ProviderKind};
use gpufleet_core::UnixMs;
use std::collections::HashMap;
use std::hash::Hash;

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
fn unknown_value(column: &str, v: &str) -> StoreError {
    StoreError::Corrupt(format!("{column} has an unknown value {v:?}"))
}

/// The columns of `carbon_gpu_minutes c`, prefixed `c_` (so a query joining energy
/// minutes can read both).
const MINUTE_COLS: &str = "c.gpu_id AS c_gpu_id, c.minute_ms AS c_minute_ms, \
    c.energy_mj AS c_energy_mj, c.g_per_kwh AS c_g_per_kwh, c.pue AS c_pue, \
    c.carbon_g AS c_carbon_g, c.provider AS c_provider, c.region AS c_region, \
    c.kind AS c_kind, c.factor_type AS c_factor_type, c.estimated AS c_estimated, \
    c.basis AS c_basis, c.priced_at_ms AS c_priced_at_ms";

/// What carbon pricing reads and writes, and what the API reads of it.
#[async_trait]
pub trait CarbonStore: Send + Sync + std::fmt::Debug {
    /// Caches intensity slots (key: provider, region, slot start). An existing actual is
    /// never replaced by a forecast; otherwise the newer fetch wins.
    async fn upsert_intensity(&self, slots: &[IntensitySlot]) -> Result<(), StoreError>;

    /// Cached slots of a provider and region overlapping `range`, oldest first.
    async fn intensity_slots(
        &self,
        provider: ProviderKind,
        region: &str,
        range: TimeRange,
    ) -> Result<Vec<IntensitySlot>, StoreError>;

    /// The newest cached slot of a provider and region starting at or before `at_ms`.
    async fn last_intensity_before(
        &self,
        provider: ProviderKind,
        region: &str,
        at_ms: UnixMs,
    ) -> Result<Option<IntensitySlot>, StoreError>;

    /// Energy minutes from `since_ms` on that need pricing: no price, a price of other
    /// energy, or a forecast / estimated price. Oldest first, at most `limit`.
    async fn pending_carbon_minutes(
        &self,
        since_ms: UnixMs,
        limit: usize,
    ) -> Result<Vec<PendingCarbonMinute>, StoreError>;

    /// Writes (replaces) prices of GPU-minutes, in one transaction.
    async fn replace_carbon_minutes(&self, minutes: &[CarbonMinute]) -> Result<(), StoreError>;

    /// Stored prices in `range`, of one GPU or all, by GPU then minute.
    async fn carbon_minutes(
        &self,
        gpu: Option<GpuId>,
        range: TimeRange,
    ) -> Result<Vec<CarbonMinute>, StoreError>;

    /// Carbon per (workload, GPU) over the minutes in `range`: each workload-minute's
    /// energy priced at its GPU-minute's intensity and PUE. Filters as
    /// [`EnergyStore::workload_energy`](super::EnergyStore::workload_energy).
    async fn workload_carbon(
        &self,
        range: TimeRange,
        node: Option<&str>,
        workload_key: Option<&str>,
    ) -> Result<Vec<WorkloadCarbon>, StoreError>;

    /// Carbon per GPU over the minutes in `range` (GPUs with priced minutes only).
    async fn gpu_carbon(&self, range: TimeRange) -> Result<Vec<GpuCarbon>, StoreError>;
}

fn parsed<R: Get, T>(
    row: &R,
    column: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, StoreError> {
    let v: String = row.get(column)?;
    parse(&v).ok_or_else(|| unknown_value(column, &v))
}

/// A sum that is NULL only when there was nothing to sum (never inside a group).
fn nonneg_sum<R: Get>(row: &R, column: &str) -> Result<u64, StoreError> {
    match row.get::<Option<i64>>(column)? {
        Some(v) => {
            u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} is negative ({v})")))
        }
        None => Ok(0),
    }
}

fn slot_from_row<R: Get>(row: &R) -> Result<IntensitySlot, StoreError> {
    Ok(IntensitySlot {
        from_ms: row.get("from_ms")?,
        to_ms: row.get("to_ms")?,
        g_per_kwh: row.get("g_per_kwh")?,
        kind: parsed(row, "kind", IntensityKind::parse)?,
        factor_type: parsed(row, "factor_type", FactorType::parse)?,
        provider: parsed(row, "provider", ProviderKind::parse)?,
        region: row.get("region")?,
        fetched_at_ms: row.get("fetched_at_ms")?,
        estimated: row.flag("estimated")?,
    })
}

fn minute_from_row<R: Get>(row: &R, prefix: &str) -> Result<CarbonMinute, StoreError> {
    let c = |name: &str| format!("{prefix}{name}");
    Ok(CarbonMinute {
        gpu: GpuId(row.get(&c("gpu_id"))?),
        minute_ms: row.get(&c("minute_ms"))?,
        energy_mj: row.nonneg(&c("energy_mj"))?,
        g_per_kwh: row.get(&c("g_per_kwh"))?,
        pue: row.get(&c("pue"))?,
        carbon_g: row.get(&c("carbon_g"))?,
        provider: parsed(row, &c("provider"), ProviderKind::parse)?,
        region: row.get(&c("region"))?,
        kind: parsed(row, &c("kind"), IntensityKind::parse)?,
        factor_type: parsed(row, &c("factor_type"), FactorType::parse)?,
        estimated: row.flag(&c("estimated"))?,
        basis: parsed(row, &c("basis"), PriceBasis::parse)?,
        priced_at_ms: row.get(&c("priced_at_ms"))?,
    })
}

/// Aggregate columns over `e` (an energy in mJ per row) joined with `c`.
fn totals_cols<DB: Backend>(e: &str) -> String {
    format!(
        "sum({e} * c.g_per_kwh * c.pue) / CAST(3.6e9 AS DOUBLE PRECISION) AS carbon_g, \
         CAST(sum({e}) AS BIGINT) AS priced_mj, \
         CAST(sum(CASE WHEN c.kind = 'forecast' THEN {e} ELSE 0 END) AS BIGINT) AS forecast_mj, \
         CAST(sum(CASE WHEN c.estimated THEN {e} ELSE 0 END) AS BIGINT) AS estimated_mj, \
         sum({e} * c.g_per_kwh) AS intensity_mj_g, {} AS sources",
        DB::DIALECT.distinct_list("c.provider || ':' || c.region || ':' || c.factor_type")
    )
}

fn totals_from_row<R: Get>(row: &R) -> Result<CarbonTotals, StoreError> {
    let List(mut sources) = row.get("sources")?;
    sources.sort();
    sources.dedup();
    Ok(CarbonTotals {
        carbon_g: row.get::<Option<f64>>("carbon_g")?.unwrap_or_default(),
        priced_mj: nonneg_sum(row, "priced_mj")?,
        forecast_mj: nonneg_sum(row, "forecast_mj")?,
        estimated_mj: nonneg_sum(row, "estimated_mj")?,
        intensity_mj_g: row
            .get::<Option<f64>>("intensity_mj_g")?
            .unwrap_or_default(),
        sources,
    })
}

/// What a sequence of single-row upserts would leave, one row per key: a later row
/// replaces the kept one when `replaces(kept, later)`. (One `INSERT ... ON CONFLICT DO
/// UPDATE` may not touch a row twice on PostgreSQL, so a batch is folded first; folding
/// then applying the same rule against the stored row gives what row-by-row writes would.)
fn fold<T, K: Hash + Eq>(
    rows: &[T],
    key: impl Fn(&T) -> K,
    replaces: impl Fn(&T, &T) -> bool,
) -> Vec<&T> {
    let mut at: HashMap<K, usize> = HashMap::new();
    let mut out: Vec<&T> = Vec::with_capacity(rows.len());
    for r in rows {
        match at.get(&key(r)) {
            Some(&i) if replaces(out[i], r) => out[i] = r,
            Some(_) => {}
            None => {
                at.insert(key(r), out.len());
                out.push(r);
            }
        }
    }
    out
}

/// Writes `rows` into `table` in one write transaction: a row whose `key` columns are
/// stored already replaces the stored one (all its other columns), unless `keep` holds.
async fn upsert<DB: Backend>(
    store: &SqlStore<DB>,
    op: &'static str,
    table: &str,
    rows: Table,
    key: &str,
    keep: &str,
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let names = rows.names();
    let set: Vec<String> = (names.split(", "))
        .filter(|c| !key.split(", ").any(|k| k == *c))
        .map(|c| format!("{c} = excluded.{c}"))
        .collect();
    let mut tx = store.begin_write(op).await?;
    sql::<DB>(
        op,
        format!(
            "INSERT INTO {table} ({names}) SELECT {names} FROM {} WHERE true \
             ON CONFLICT ({key}) DO UPDATE SET {} WHERE NOT ({keep})",
            DB::DIALECT.over(&rows, "v"),
            set.join(", "),
        ),
    )
    .bind_table(rows)
    .execute(tx.conn())
    .await?;
    tx.commit(op).await
}

#[async_trait]
impl<DB: Backend> CarbonStore for SqlStore<DB> {
    async fn upsert_intensity(&self, slots: &[IntensitySlot]) -> Result<(), StoreError> {
        let forecast_after_actual = |kept: &IntensitySlot, s: &IntensitySlot| {
            kept.kind == IntensityKind::Actual && s.kind == IntensityKind::Forecast
        };
        let key = |s: &IntensitySlot| (s.provider, s.region.clone(), s.from_ms);
        let s = fold(slots, key, |kept, s| !forecast_after_actual(kept, s));
        let s = &s;
        let rows = Table::default()
            .text("provider", s.iter().map(|s| s.provider.as_str().to_owned()))
            .text("region", s.iter().map(|s| s.region.clone()))
            .int("from_ms", s.iter().map(|s| s.from_ms))
            .int("to_ms", s.iter().map(|s| s.to_ms))
            .float("g_per_kwh", s.iter().map(|s| s.g_per_kwh))
            .text("kind", s.iter().map(|s| s.kind.as_str().to_owned()))
            .text(
                "factor_type",
                s.iter().map(|s| s.factor_type.as_str().to_owned()),
            )
            .int("fetched_at_ms", s.iter().map(|s| s.fetched_at_ms))
            .flag("estimated", s.iter().map(|s| s.estimated));
        let keep = "carbon_intensity.kind = 'actual' AND excluded.kind = 'forecast'";
        let key = "provider, region, from_ms";
        upsert(
            self,
            "cache intensity slots",
            "carbon_intensity",
            rows,
            key,
            keep,
        )
        .await
    }

    async fn intensity_slots(
        &self,
        provider: ProviderKind,
        region: &str,
        range: TimeRange,
    ) -> Result<Vec<IntensitySlot>, StoreError> {
        let query = sql::<DB>(
            "read cached intensities",
            "SELECT * FROM carbon_intensity WHERE provider = $1 AND region = $2 \
             AND to_ms > $3 AND from_ms < $4 ORDER BY from_ms",
        )
        .bind(provider.as_str())
        .bind(region)
        .bind(range.from_ms)
        .bind(range.to_ms);
        self.fetch(query, slot_from_row).await
    }

    async fn last_intensity_before(
        &self,
        provider: ProviderKind,
        region: &str,
        at_ms: UnixMs,
    ) -> Result<Option<IntensitySlot>, StoreError> {
        let row = sql::<DB>(
            "read the last known intensity",
            "SELECT * FROM carbon_intensity WHERE provider = $1 AND region = $2 \
             AND from_ms <= $3 ORDER BY from_ms DESC LIMIT 1",
        )
        .bind(provider.as_str())
        .bind(region)
        .bind(at_ms)
        .optional(&mut *self.conn().await?)
        .await?;
        row.as_ref().map(slot_from_row).transpose()
    }

    async fn pending_carbon_minutes(
        &self,
        since_ms: UnixMs,
        limit: usize,
    ) -> Result<Vec<PendingCarbonMinute>, StoreError> {
        let query = sql::<DB>(
            "list energy minutes to price",
            format!(
                "SELECT m.gpu_id, m.minute_ms, m.energy_mj, n.name AS node_name, {MINUTE_COLS} \
                 FROM energy_gpu_minutes m JOIN gpus g ON g.id = m.gpu_id \
                 JOIN nodes n ON n.id = g.node_id \
                 LEFT JOIN carbon_gpu_minutes c ON c.gpu_id = m.gpu_id \
                   AND c.minute_ms = m.minute_ms \
                 WHERE m.minute_ms >= $1 AND (c.gpu_id IS NULL OR c.energy_mj <> m.energy_mj \
                 OR c.kind = 'forecast' OR c.estimated) \
                 ORDER BY m.minute_ms, m.gpu_id LIMIT $2"
            ),
        )
        .bind(since_ms)
        .bind(limit_i64(limit));
        self.fetch(query, |row| {
            let priced = match row.get::<Option<i64>>("c_gpu_id")? {
                Some(_) => Some(minute_from_row(row, "c_")?),
                None => None,
            };
            Ok(PendingCarbonMinute {
                gpu: GpuId(row.get("gpu_id")?),
                minute_ms: row.get("minute_ms")?,
                energy_mj: row.nonneg("energy_mj")?,
                node_name: row.get("node_name")?,
                priced,
            })
        })
        .await
    }

    async fn replace_carbon_minutes(&self, minutes: &[CarbonMinute]) -> Result<(), StoreError> {
        let m = fold(minutes, |m| (m.gpu, m.minute_ms), |_, _| true);
        let text = |f: fn(&CarbonMinute) -> &str| m.iter().map(move |m| f(m).to_owned());
        let rows = Table::default()
            .int("gpu_id", m.iter().map(|m| m.gpu.0))
            .int("minute_ms", m.iter().map(|m| m.minute_ms))
            .int(
                "energy_mj",
                m.iter()
                    .map(|m| u64_to_i64(m.energy_mj, "energy_mj"))
                    .collect::<Result<Vec<_>, _>>()?,
            )
            .float("g_per_kwh", m.iter().map(|m| m.g_per_kwh))
            .float("pue", m.iter().map(|m| m.pue))
            .float("carbon_g", m.iter().map(|m| m.carbon_g))
            .text("provider", text(|m| m.provider.as_str()))
            .text("region", text(|m| &m.region))
            .text("kind", text(|m| m.kind.as_str()))
            .text("factor_type", text(|m| m.factor_type.as_str()))
            .flag("estimated", m.iter().map(|m| m.estimated))
            .text("basis", text(|m| m.basis.as_str()))
            .int("priced_at_ms", m.iter().map(|m| m.priced_at_ms));
        let op = "store the carbon of GPU-minutes";
        upsert(
            self,
            op,
            "carbon_gpu_minutes",
            rows,
            "gpu_id, minute_ms",
            "false",
        )
        .await
    }

    async fn carbon_minutes(
        &self,
        gpu: Option<GpuId>,
        range: TimeRange,
    ) -> Result<Vec<CarbonMinute>, StoreError> {
        let query = sql::<DB>(
            "read carbon minutes",
            format!(
                "SELECT {MINUTE_COLS} FROM carbon_gpu_minutes c \
                 WHERE (CAST($1 AS BIGINT) IS NULL OR c.gpu_id = $1) \
                   AND c.minute_ms BETWEEN $2 AND $3 \
                 ORDER BY c.gpu_id, c.minute_ms"
            ),
        )
        .bind(gpu.map(|g| g.0))
        .bind(range.from_ms)
        .bind(range.to_ms);
        self.fetch(query, |r| minute_from_row(r, "c_")).await
    }

    async fn workload_carbon(
        &self,
        range: TimeRange,
        node: Option<&str>,
        workload_key: Option<&str>,
    ) -> Result<Vec<WorkloadCarbon>, StoreError> {
        let d = DB::DIALECT;
        let query = sql::<DB>(
            "sum carbon per workload",
            format!(
                "SELECT w.key AS workload_key, g.uuid, {} \
                 FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
                 JOIN carbon_gpu_minutes c ON c.gpu_id = m.gpu_id AND c.minute_ms = m.minute_ms \
                 JOIN gpus g ON g.id = m.gpu_id JOIN nodes n ON n.id = g.node_id \
                 WHERE m.minute_ms BETWEEN $1 AND $2 \
                   AND (CAST($3 AS TEXT) IS NULL OR n.name = $3) \
                   AND (CAST($4 AS TEXT) IS NULL OR w.key = $4) \
                 GROUP BY w.id, g.id ORDER BY {}, {}",
                totals_cols::<DB>("m.energy_mj"),
                d.bytewise("w.key"),
                d.bytewise("g.uuid"),
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(node)
        .bind(workload_key);
        self.fetch(query, |row| {
            Ok(WorkloadCarbon {
                workload_key: row.get("workload_key")?,
                gpu_uuid: row.get("uuid")?,
                totals: totals_from_row(row)?,
            })
        })
        .await
    }

    async fn gpu_carbon(&self, range: TimeRange) -> Result<Vec<GpuCarbon>, StoreError> {
        // Priced at the energy of the GPU row itself (c.energy_mj is what was priced).
        let query = sql::<DB>(
            "sum carbon per GPU",
            format!(
                "SELECT g.id AS gpu_id, g.uuid, n.name AS node_name, {} \
                 FROM carbon_gpu_minutes c JOIN gpus g ON g.id = c.gpu_id \
                 JOIN nodes n ON n.id = g.node_id \
                 WHERE c.minute_ms BETWEEN $1 AND $2 GROUP BY g.id, n.id ORDER BY g.id",
                totals_cols::<DB>("c.energy_mj")
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms);
        self.fetch(query, |row| {
            Ok(GpuCarbon {
                gpu: GpuId(row.get("gpu_id")?),
                uuid: row.get("uuid")?,
                node_name: row.get("node_name")?,
                totals: totals_from_row(row)?,
            })
        })
        .await
    }
}
