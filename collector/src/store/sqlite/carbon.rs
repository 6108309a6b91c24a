//! SQL of carbon accounting (issue 7): the intensity cache, per-minute prices and the
//! API's carbon aggregates. Schema: `migrations/sqlite/0010_carbon.sql`.

use super::{get, limit_i64, q};
use crate::store::carbon::{
    CarbonMinute, CarbonTotals, GpuCarbon, PendingCarbonMinute, PriceBasis, WorkloadCarbon,
};
use crate::store::{GpuId, StoreError, TimeRange};
use gpufleet_carbon::{FactorType, IntensityKind, IntensitySlot, ProviderKind};
use gpufleet_core::UnixMs;
use sqlx::sqlite::{SqlitePool, SqliteRow};

fn corrupt(column: &str, v: &str) -> StoreError {
    StoreError::Corrupt(format!("{column} has an unknown value {v:?}"))
}

fn provider(row: &SqliteRow, column: &str) -> Result<ProviderKind, StoreError> {
    let v: String = get(row, column)?;
    ProviderKind::parse(&v).ok_or_else(|| corrupt(column, &v))
}

fn kind(row: &SqliteRow, column: &str) -> Result<IntensityKind, StoreError> {
    let v: String = get(row, column)?;
    IntensityKind::parse(&v).ok_or_else(|| corrupt(column, &v))
}

fn factor(row: &SqliteRow, column: &str) -> Result<FactorType, StoreError> {
    let v: String = get(row, column)?;
    FactorType::parse(&v).ok_or_else(|| corrupt(column, &v))
}

fn nonneg(row: &SqliteRow, column: &str) -> Result<u64, StoreError> {
    let v: i64 = get(row, column)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} is negative ({v})")))
}

fn to_i64(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("energy {v} does not fit")))
}

fn slot_from_row(row: &SqliteRow) -> Result<IntensitySlot, StoreError> {
    Ok(IntensitySlot {
        from_ms: get(row, "from_ms")?,
        to_ms: get(row, "to_ms")?,
        g_per_kwh: get(row, "g_per_kwh")?,
        kind: kind(row, "kind")?,
        factor_type: factor(row, "factor_type")?,
        provider: provider(row, "provider")?,
        region: get(row, "region")?,
        fetched_at_ms: get(row, "fetched_at_ms")?,
        estimated: get::<i64>(row, "estimated")? != 0,
    })
}

pub(super) async fn upsert_intensity(
    pool: &SqlitePool,
    slots: &[IntensitySlot],
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(q("begin caching intensities"))?;
    for s in slots {
        sqlx::query(
            "INSERT INTO carbon_intensity (provider, region, from_ms, to_ms, g_per_kwh, kind, \
             factor_type, fetched_at_ms, estimated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (provider, region, from_ms) DO UPDATE SET to_ms = excluded.to_ms, \
             g_per_kwh = excluded.g_per_kwh, kind = excluded.kind, \
             factor_type = excluded.factor_type, fetched_at_ms = excluded.fetched_at_ms, \
             estimated = excluded.estimated \
             WHERE NOT (carbon_intensity.kind = 'actual' AND excluded.kind = 'forecast')",
        )
        .bind(s.provider.as_str())
        .bind(&s.region)
        .bind(s.from_ms)
        .bind(s.to_ms)
        .bind(s.g_per_kwh)
        .bind(s.kind.as_str())
        .bind(s.factor_type.as_str())
        .bind(s.fetched_at_ms)
        .bind(i64::from(s.estimated))
        .execute(&mut *tx)
        .await
        .map_err(q("cache an intensity slot"))?;
    }
    tx.commit().await.map_err(q("commit cached intensities"))
}

pub(super) async fn intensity_slots(
    pool: &SqlitePool,
    provider: ProviderKind,
    region: &str,
    range: TimeRange,
) -> Result<Vec<IntensitySlot>, StoreError> {
    let rows = sqlx::query(
        "SELECT * FROM carbon_intensity WHERE provider = ? AND region = ? \
         AND to_ms > ? AND from_ms < ? ORDER BY from_ms",
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
    pool: &SqlitePool,
    provider: ProviderKind,
    region: &str,
    at_ms: UnixMs,
) -> Result<Option<IntensitySlot>, StoreError> {
    let row = sqlx::query(
        "SELECT * FROM carbon_intensity WHERE provider = ? AND region = ? AND from_ms <= ? \
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

fn minute_from_row(row: &SqliteRow, prefix: &str) -> Result<CarbonMinute, StoreError> {
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
        estimated: get::<i64>(row, &c("estimated"))? != 0,
        basis: PriceBasis::parse(&basis).ok_or_else(|| corrupt("basis", &basis))?,
        priced_at_ms: get(row, &c("priced_at_ms"))?,
    })
}

const MINUTE_COLS: &str = "c.gpu_id AS c_gpu_id, c.minute_ms AS c_minute_ms, \
    c.energy_mj AS c_energy_mj, c.g_per_kwh AS c_g_per_kwh, c.pue AS c_pue, \
    c.carbon_g AS c_carbon_g, c.provider AS c_provider, c.region AS c_region, \
    c.kind AS c_kind, c.factor_type AS c_factor_type, c.estimated AS c_estimated, \
    c.basis AS c_basis, c.priced_at_ms AS c_priced_at_ms";

pub(super) async fn pending_carbon_minutes(
    pool: &SqlitePool,
    since_ms: UnixMs,
    limit: usize,
) -> Result<Vec<PendingCarbonMinute>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT m.gpu_id, m.minute_ms, m.energy_mj, n.name AS node_name, {MINUTE_COLS} \
         FROM energy_gpu_minutes m JOIN gpus g ON g.id = m.gpu_id \
         JOIN nodes n ON n.id = g.node_id \
         LEFT JOIN carbon_gpu_minutes c ON c.gpu_id = m.gpu_id AND c.minute_ms = m.minute_ms \
         WHERE m.minute_ms >= ? AND (c.gpu_id IS NULL OR c.energy_mj != m.energy_mj \
         OR c.kind = 'forecast' OR c.estimated != 0) \
         ORDER BY m.minute_ms, m.gpu_id LIMIT ?"
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
    pool: &SqlitePool,
    minutes: &[CarbonMinute],
) -> Result<(), StoreError> {
    let mut tx = pool.begin().await.map_err(q("begin storing carbon"))?;
    for m in minutes {
        sqlx::query(
            "INSERT OR REPLACE INTO carbon_gpu_minutes (gpu_id, minute_ms, energy_mj, \
             g_per_kwh, pue, carbon_g, provider, region, kind, factor_type, estimated, basis, \
             priced_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(m.gpu.0)
        .bind(m.minute_ms)
        .bind(to_i64(m.energy_mj)?)
        .bind(m.g_per_kwh)
        .bind(m.pue)
        .bind(m.carbon_g)
        .bind(m.provider.as_str())
        .bind(&m.region)
        .bind(m.kind.as_str())
        .bind(m.factor_type.as_str())
        .bind(i64::from(m.estimated))
        .bind(m.basis.as_str())
        .bind(m.priced_at_ms)
        .execute(&mut *tx)
        .await
        .map_err(q("store the carbon of a GPU-minute"))?;
    }
    tx.commit().await.map_err(q("commit carbon"))
}

pub(super) async fn carbon_minutes(
    pool: &SqlitePool,
    gpu: Option<GpuId>,
    range: TimeRange,
) -> Result<Vec<CarbonMinute>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {MINUTE_COLS} FROM carbon_gpu_minutes c \
         WHERE (?1 IS NULL OR c.gpu_id = ?1) AND c.minute_ms BETWEEN ?2 AND ?3 \
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
        "sum({e} * c.g_per_kwh * c.pue) / 3.6e9 AS carbon_g, sum({e}) AS priced_mj, \
         sum(CASE WHEN c.kind = 'forecast' THEN {e} ELSE 0 END) AS forecast_mj, \
         sum(CASE WHEN c.estimated != 0 THEN {e} ELSE 0 END) AS estimated_mj, \
         sum({e} * c.g_per_kwh) AS intensity_mj_g, \
         group_concat(DISTINCT c.provider || ':' || c.region || ':' || c.factor_type) AS sources"
    )
}

fn totals_from_row(row: &SqliteRow) -> Result<CarbonTotals, StoreError> {
    let sources: Option<String> = get(row, "sources")?;
    let mut sources: Vec<String> = sources
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    sources.sort();
    sources.dedup();
    Ok(CarbonTotals {
        carbon_g: get::<Option<f64>>(row, "carbon_g")?.unwrap_or_default(),
        priced_mj: get::<Option<i64>>(row, "priced_mj")?
            .map_or(0, |v| u64::try_from(v).unwrap_or_default()),
        forecast_mj: get::<Option<i64>>(row, "forecast_mj")?
            .map_or(0, |v| u64::try_from(v).unwrap_or_default()),
        estimated_mj: get::<Option<i64>>(row, "estimated_mj")?
            .map_or(0, |v| u64::try_from(v).unwrap_or_default()),
        intensity_mj_g: get::<Option<f64>>(row, "intensity_mj_g")?.unwrap_or_default(),
        sources,
    })
}

pub(super) async fn workload_carbon(
    pool: &SqlitePool,
    range: TimeRange,
    node: Option<&str>,
    workload_key: Option<&str>,
) -> Result<Vec<WorkloadCarbon>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT w.key AS workload_key, g.uuid, {} \
         FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
         JOIN carbon_gpu_minutes c ON c.gpu_id = m.gpu_id AND c.minute_ms = m.minute_ms \
         JOIN gpus g ON g.id = m.gpu_id JOIN nodes n ON n.id = g.node_id \
         WHERE m.minute_ms BETWEEN ?1 AND ?2 AND (?3 IS NULL OR n.name = ?3) \
         AND (?4 IS NULL OR w.key = ?4) \
         GROUP BY m.workload_id, m.gpu_id ORDER BY w.key, g.uuid",
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
    pool: &SqlitePool,
    range: TimeRange,
) -> Result<Vec<GpuCarbon>, StoreError> {
    // Priced at the energy of the GPU row itself (c.energy_mj is what was priced).
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT c.gpu_id, g.uuid, n.name AS node_name, {} \
         FROM carbon_gpu_minutes c JOIN gpus g ON g.id = c.gpu_id \
         JOIN nodes n ON n.id = g.node_id \
         WHERE c.minute_ms BETWEEN ?1 AND ?2 GROUP BY c.gpu_id ORDER BY c.gpu_id",
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
