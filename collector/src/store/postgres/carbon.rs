//! SQL of carbon accounting (issue 7) on PostgreSQL: the queries of `sqlite/carbon.rs`
//! with PostgreSQL's placeholders and types. Writes of many rows go in as one array per
//! column (`UNNEST`), one statement per call; sums of bigints come back as numeric and are
//! cast to bigint. Schema: `migrations/postgres/0010_carbon.sql`.

use super::{get, limit_i64, q};
use crate::store::carbon::{
    CarbonMinute, CarbonTotals, GpuCarbon, MINUTE_COLS, PendingCarbonMinute, PriceBasis,
    WorkloadCarbon, unknown_value,
};
use crate::store::{GpuId, StoreError, TimeRange};
use gpufleet_carbon::{FactorType, IntensityKind, IntensitySlot, ProviderKind};
use gpufleet_core::UnixMs;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgRow};
use std::collections::HashMap;

fn provider(row: &PgRow, column: &str) -> Result<ProviderKind, StoreError> {
    let v: String = get(row, column)?;
    ProviderKind::parse(&v).ok_or_else(|| unknown_value(column, &v))
}

fn kind(row: &PgRow, column: &str) -> Result<IntensityKind, StoreError> {
    let v: String = get(row, column)?;
    IntensityKind::parse(&v).ok_or_else(|| unknown_value(column, &v))
}

fn factor(row: &PgRow, column: &str) -> Result<FactorType, StoreError> {
    let v: String = get(row, column)?;
    FactorType::parse(&v).ok_or_else(|| unknown_value(column, &v))
}

fn nonneg(row: &PgRow, column: &str) -> Result<u64, StoreError> {
    let v: i64 = get(row, column)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} is negative ({v})")))
}

/// A sum that is NULL only when there was nothing to sum (never inside a group).
fn nonneg_sum(row: &PgRow, column: &str) -> Result<u64, StoreError> {
    match get::<Option<i64>>(row, column)? {
        Some(v) => {
            u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} is negative ({v})")))
        }
        None => Ok(0),
    }
}

fn to_i64(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("energy {v} does not fit")))
}

fn slot_from_row(row: &PgRow) -> Result<IntensitySlot, StoreError> {
    Ok(IntensitySlot {
        from_ms: get(row, "from_ms")?,
        to_ms: get(row, "to_ms")?,
        g_per_kwh: get(row, "g_per_kwh")?,
        kind: kind(row, "kind")?,
        factor_type: factor(row, "factor_type")?,
        provider: provider(row, "provider")?,
        region: get(row, "region")?,
        fetched_at_ms: get(row, "fetched_at_ms")?,
        estimated: get(row, "estimated")?,
    })
}

/// The slots a sequence of single-row upserts would leave, one per key: a later slot of
/// the same key wins unless it is a forecast after an actual. (One `INSERT ... ON
/// CONFLICT DO UPDATE` may not touch a row twice, so a batch is folded first; folding then
/// applying the same rule against the stored row gives what row-by-row writes would.)
fn fold_slots(slots: &[IntensitySlot]) -> Vec<&IntensitySlot> {
    let mut at: HashMap<(ProviderKind, &str, UnixMs), usize> = HashMap::new();
    let mut out: Vec<&IntensitySlot> = Vec::with_capacity(slots.len());
    for s in slots {
        match at.get(&(s.provider, s.region.as_str(), s.from_ms)) {
            Some(&i) => {
                let kept = out[i];
                if !(kept.kind == IntensityKind::Actual && s.kind == IntensityKind::Forecast) {
                    out[i] = s;
                }
            }
            None => {
                at.insert((s.provider, s.region.as_str(), s.from_ms), out.len());
                out.push(s);
            }
        }
    }
    out
}

pub(super) async fn upsert_intensity(
    pool: &PgPool,
    slots: &[IntensitySlot],
) -> Result<(), StoreError> {
    let slots = fold_slots(slots);
    if slots.is_empty() {
        return Ok(());
    }
    let col = |f: fn(&IntensitySlot) -> String| slots.iter().map(|s| f(s)).collect::<Vec<_>>();
    let providers = col(|s| s.provider.as_str().to_owned());
    let regions = col(|s| s.region.clone());
    let kinds = col(|s| s.kind.as_str().to_owned());
    let factors = col(|s| s.factor_type.as_str().to_owned());
    let from: Vec<i64> = slots.iter().map(|s| s.from_ms).collect();
    let to: Vec<i64> = slots.iter().map(|s| s.to_ms).collect();
    let g: Vec<f64> = slots.iter().map(|s| s.g_per_kwh).collect();
    let fetched: Vec<i64> = slots.iter().map(|s| s.fetched_at_ms).collect();
    let estimated: Vec<bool> = slots.iter().map(|s| s.estimated).collect();
    sqlx::query(
        "INSERT INTO carbon_intensity (provider, region, from_ms, to_ms, g_per_kwh, kind, \
         factor_type, fetched_at_ms, estimated) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::float8[], \
         $6::text[], $7::text[], $8::int8[], $9::bool[]) \
         ON CONFLICT (provider, region, from_ms) DO UPDATE SET to_ms = excluded.to_ms, \
         g_per_kwh = excluded.g_per_kwh, kind = excluded.kind, \
         factor_type = excluded.factor_type, fetched_at_ms = excluded.fetched_at_ms, \
         estimated = excluded.estimated \
         WHERE NOT (carbon_intensity.kind = 'actual' AND excluded.kind = 'forecast')",
    )
    .bind(providers)
    .bind(regions)
    .bind(from)
    .bind(to)
    .bind(g)
    .bind(kinds)
    .bind(factors)
    .bind(fetched)
    .bind(estimated)
    .execute(pool)
    .await
    .map_err(q("cache intensity slots"))?;
    Ok(())
}

pub(super) async fn intensity_slots(
    pool: &PgPool,
    provider: ProviderKind,
    region: &str,
    range: TimeRange,
) -> Result<Vec<IntensitySlot>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM carbon_intensity WHERE provider = $1 AND region = $2 \
         AND to_ms > $3 AND from_ms < $4 ORDER BY from_ms",
    )
    .bind(provider.as_str())
    .bind(region)
    .bind(range.from_ms)
    .bind(range.to_ms)
    .fetch_all(pool)
    .await
    .map_err(q("read cached intensities"))?;
    rows.iter().map(slot_from_row).collect()
}

pub(super) async fn last_intensity_before(
    pool: &PgPool,
    provider: ProviderKind,
    region: &str,
    at_ms: UnixMs,
) -> Result<Option<IntensitySlot>, StoreError> {
    let row = sqlx::query(
        "SELECT * FROM carbon_intensity WHERE provider = $1 AND region = $2 AND from_ms <= $3 \
         ORDER BY from_ms DESC LIMIT 1",
    )
    .bind(provider.as_str())
    .bind(region)
    .bind(at_ms)
    .fetch_optional(pool)
    .await
    .map_err(q("read the last known intensity"))?;
    row.as_ref().map(slot_from_row).transpose()
}

fn minute_from_row(row: &PgRow, prefix: &str) -> Result<CarbonMinute, StoreError> {
    let c = |name: &str| format!("{prefix}{name}");
    let basis: String = get(row, &c("basis"))?;
    Ok(CarbonMinute {
        gpu: GpuId(get(row, &c("gpu_id"))?),
        minute_ms: get(row, &c("minute_ms"))?,
        energy_mj: nonneg(row, &c("energy_mj"))?,
        g_per_kwh: get(row, &c("g_per_kwh"))?,
        pue: get(row, &c("pue"))?,
        carbon_g: get(row, &c("carbon_g"))?,
        provider: provider(row, &c("provider"))?,
        region: get(row, &c("region"))?,
        kind: kind(row, &c("kind"))?,
        factor_type: factor(row, &c("factor_type"))?,
        estimated: get(row, &c("estimated"))?,
        basis: PriceBasis::parse(&basis).ok_or_else(|| unknown_value("basis", &basis))?,
        priced_at_ms: get(row, &c("priced_at_ms"))?,
    })
}

pub(super) async fn pending_carbon_minutes(
    pool: &PgPool,
    since_ms: UnixMs,
    limit: usize,
) -> Result<Vec<PendingCarbonMinute>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT m.gpu_id, m.minute_ms, m.energy_mj, n.name AS node_name, {MINUTE_COLS} \
         FROM energy_gpu_minutes m JOIN gpus g ON g.id = m.gpu_id \
         JOIN nodes n ON n.id = g.node_id \
         LEFT JOIN carbon_gpu_minutes c ON c.gpu_id = m.gpu_id AND c.minute_ms = m.minute_ms \
         WHERE m.minute_ms >= $1 AND (c.gpu_id IS NULL OR c.energy_mj <> m.energy_mj \
         OR c.kind = 'forecast' OR c.estimated) \
         ORDER BY m.minute_ms, m.gpu_id LIMIT $2"
    )))
    .bind(since_ms)
    .bind(limit_i64(limit))
    .fetch_all(pool)
    .await
    .map_err(q("list energy minutes to price"))?;
    rows.iter()
        .map(|row| {
            let priced = match get::<Option<i64>>(row, "c_gpu_id")? {
                Some(_) => Some(minute_from_row(row, "c_")?),
                None => None,
            };
            Ok(PendingCarbonMinute {
                gpu: GpuId(get(row, "gpu_id")?),
                minute_ms: get(row, "minute_ms")?,
                energy_mj: nonneg(row, "energy_mj")?,
                node_name: get(row, "node_name")?,
                priced,
            })
        })
        .collect()
}

pub(super) async fn replace_carbon_minutes(
    pool: &PgPool,
    minutes: &[CarbonMinute],
) -> Result<(), StoreError> {
    // Row by row, a later price of the same GPU-minute replaces an earlier one; one
    // statement may not touch a row twice, so keep only the last of each.
    let mut at: HashMap<(GpuId, UnixMs), usize> = HashMap::new();
    let mut rows: Vec<&CarbonMinute> = Vec::with_capacity(minutes.len());
    for m in minutes {
        match at.get(&(m.gpu, m.minute_ms)) {
            Some(&i) => rows[i] = m,
            None => {
                at.insert((m.gpu, m.minute_ms), rows.len());
                rows.push(m);
            }
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&CarbonMinute) -> String| rows.iter().map(|m| f(m)).collect::<Vec<_>>();
    let float = |f: fn(&CarbonMinute) -> f64| rows.iter().map(|m| f(m)).collect::<Vec<_>>();
    let gpu: Vec<i64> = rows.iter().map(|m| m.gpu.0).collect();
    let minute: Vec<i64> = rows.iter().map(|m| m.minute_ms).collect();
    let energy = rows
        .iter()
        .map(|m| to_i64(m.energy_mj))
        .collect::<Result<Vec<_>, _>>()?;
    let estimated: Vec<bool> = rows.iter().map(|m| m.estimated).collect();
    let priced_at: Vec<i64> = rows.iter().map(|m| m.priced_at_ms).collect();
    sqlx::query(
        "INSERT INTO carbon_gpu_minutes (gpu_id, minute_ms, energy_mj, g_per_kwh, pue, \
         carbon_g, provider, region, kind, factor_type, estimated, basis, priced_at_ms) \
         SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::float8[], $5::float8[], \
         $6::float8[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bool[], \
         $12::text[], $13::int8[]) \
         ON CONFLICT (gpu_id, minute_ms) DO UPDATE SET energy_mj = excluded.energy_mj, \
         g_per_kwh = excluded.g_per_kwh, pue = excluded.pue, carbon_g = excluded.carbon_g, \
         provider = excluded.provider, region = excluded.region, kind = excluded.kind, \
         factor_type = excluded.factor_type, estimated = excluded.estimated, \
         basis = excluded.basis, priced_at_ms = excluded.priced_at_ms",
    )
    .bind(gpu)
    .bind(minute)
    .bind(energy)
    .bind(float(|m| m.g_per_kwh))
    .bind(float(|m| m.pue))
    .bind(float(|m| m.carbon_g))
    .bind(text(|m| m.provider.as_str().to_owned()))
    .bind(text(|m| m.region.clone()))
    .bind(text(|m| m.kind.as_str().to_owned()))
    .bind(text(|m| m.factor_type.as_str().to_owned()))
    .bind(estimated)
    .bind(text(|m| m.basis.as_str().to_owned()))
    .bind(priced_at)
    .execute(pool)
    .await
    .map_err(q("store the carbon of GPU-minutes"))?;
    Ok(())
}

pub(super) async fn carbon_minutes(
    pool: &PgPool,
    gpu: Option<GpuId>,
    range: TimeRange,
) -> Result<Vec<CarbonMinute>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {MINUTE_COLS} FROM carbon_gpu_minutes c \
         WHERE ($1::int8 IS NULL OR c.gpu_id = $1) AND c.minute_ms BETWEEN $2 AND $3 \
         ORDER BY c.gpu_id, c.minute_ms"
    )))
    .bind(gpu.map(|g| g.0))
    .bind(range.from_ms)
    .bind(range.to_ms)
    .fetch_all(pool)
    .await
    .map_err(q("read carbon minutes"))?;
    rows.iter().map(|r| minute_from_row(r, "c_")).collect()
}

/// Aggregate columns over `e` (an energy in mJ per row) joined with `c`.
fn totals_cols(e: &str) -> String {
    format!(
        "sum({e} * c.g_per_kwh * c.pue) / 3.6e9::float8 AS carbon_g, \
         sum({e})::int8 AS priced_mj, \
         sum(CASE WHEN c.kind = 'forecast' THEN {e} ELSE 0 END)::int8 AS forecast_mj, \
         sum(CASE WHEN c.estimated THEN {e} ELSE 0 END)::int8 AS estimated_mj, \
         sum({e} * c.g_per_kwh) AS intensity_mj_g, \
         array_agg(DISTINCT c.provider || ':' || c.region || ':' || c.factor_type) AS sources"
    )
}

fn totals_from_row(row: &PgRow) -> Result<CarbonTotals, StoreError> {
    let mut sources: Vec<String> = get::<Option<Vec<String>>>(row, "sources")?.unwrap_or_default();
    sources.sort();
    sources.dedup();
    Ok(CarbonTotals {
        carbon_g: get::<Option<f64>>(row, "carbon_g")?.unwrap_or_default(),
        priced_mj: nonneg_sum(row, "priced_mj")?,
        forecast_mj: nonneg_sum(row, "forecast_mj")?,
        estimated_mj: nonneg_sum(row, "estimated_mj")?,
        intensity_mj_g: get::<Option<f64>>(row, "intensity_mj_g")?.unwrap_or_default(),
        sources,
    })
}

pub(super) async fn workload_carbon(
    pool: &PgPool,
    range: TimeRange,
    node: Option<&str>,
    workload_key: Option<&str>,
) -> Result<Vec<WorkloadCarbon>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT w.key AS workload_key, g.uuid, {} \
         FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
         JOIN carbon_gpu_minutes c ON c.gpu_id = m.gpu_id AND c.minute_ms = m.minute_ms \
         JOIN gpus g ON g.id = m.gpu_id JOIN nodes n ON n.id = g.node_id \
         WHERE m.minute_ms BETWEEN $1 AND $2 AND ($3::text IS NULL OR n.name = $3) \
         AND ($4::text IS NULL OR w.key = $4) \
         GROUP BY w.id, g.id ORDER BY w.key COLLATE \"C\", g.uuid COLLATE \"C\"",
        totals_cols("m.energy_mj")
    )))
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(node)
    .bind(workload_key)
    .fetch_all(pool)
    .await
    .map_err(q("sum carbon per workload"))?;
    rows.iter()
        .map(|row| {
            Ok(WorkloadCarbon {
                workload_key: get(row, "workload_key")?,
                gpu_uuid: get(row, "uuid")?,
                totals: totals_from_row(row)?,
            })
        })
        .collect()
}

pub(super) async fn gpu_carbon(
    pool: &PgPool,
    range: TimeRange,
) -> Result<Vec<GpuCarbon>, StoreError> {
    // Priced at the energy of the GPU row itself (c.energy_mj is what was priced).
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT g.id AS gpu_id, g.uuid, n.name AS node_name, {} \
         FROM carbon_gpu_minutes c JOIN gpus g ON g.id = c.gpu_id \
         JOIN nodes n ON n.id = g.node_id \
         WHERE c.minute_ms BETWEEN $1 AND $2 GROUP BY g.id, n.id ORDER BY g.id",
        totals_cols("c.energy_mj")
    )))
    .bind(range.from_ms)
    .bind(range.to_ms)
    .fetch_all(pool)
    .await
    .map_err(q("sum carbon per GPU"))?;
    rows.iter()
        .map(|row| {
            Ok(GpuCarbon {
                gpu: GpuId(get(row, "gpu_id")?),
                uuid: get(row, "uuid")?,
                node_name: get(row, "node_name")?,
                totals: totals_from_row(row)?,
            })
        })
        .collect()
}
