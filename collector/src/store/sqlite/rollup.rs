//! SQL of per-minute rollups and retention (issue 8). Schema:
//! `migrations/sqlite/0011_rollups.sql`.
//!
//! Rollups are computed in SQL (`INSERT ... SELECT ... GROUP BY minute`) from the raw
//! tables, so a minute costs one pass over its rows inside the database. Retention deletes
//! in statements of a bounded number of rows, each its own short transaction, so the
//! group-commit writer never waits long behind it.

use super::{from_i64, get, q};
use crate::accounting::energy::{MINUTE_MS, minute_of};
use crate::store::rollup::spec;
use crate::store::rollup::{
    HOST_METRICS, MetricStats, RetentionOutcome, RollupCursor, RollupKey, RollupKind, RollupMinute,
};
use crate::store::{GpuId, GpuMetric, NodeId, SeriesPoint, StoreError, TimeRange};
use gpufleet_core::UnixMs;
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{SqlitePool, SqliteRow};
use std::collections::HashMap;
use tokio::sync::Mutex;

fn stats_from_row(row: &SqliteRow, col: &str, real: bool) -> Result<MetricStats, StoreError> {
    let n: i64 = get(row, &format!("{col}_n"))?;
    let ext = |suffix: &str| -> Result<Option<f64>, StoreError> {
        let name = format!("{col}_{suffix}");
        Ok(if real {
            get::<Option<f64>>(row, &name)?
        } else {
            get::<Option<i64>>(row, &name)?.map(|v| from_i64(v) as f64)
        })
    };
    Ok(MetricStats {
        n: u32::try_from(n).map_err(|_| StoreError::Corrupt(format!("{col}_n {n}")))?,
        avg: get(row, &format!("{col}_avg"))?,
        min: ext("min")?,
        max: ext("max")?,
    })
}

pub(super) async fn rollup_cursors(pool: &SqlitePool) -> Result<Vec<RollupCursor>, StoreError> {
    let mut out = Vec::new();
    for (kind, parent) in [(RollupKind::Gpu, "gpus"), (RollupKind::Host, "nodes")] {
        let s = spec(kind);
        let (raw, id) = (s.raw, s.id);
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT x.id, (SELECT min(r.ts_ms) FROM {raw} r WHERE r.{id} = x.id) AS first_ms, \
             (SELECT max(r.ts_ms) FROM {raw} r WHERE r.{id} = x.id) AS last_ms, p.done_to_ms \
             FROM {parent} x LEFT JOIN rollup_progress p ON p.kind = ? AND p.id = x.id \
             ORDER BY x.id"
        )))
        .bind(kind.as_str())
        .fetch_all(pool)
        .await
        .map_err(q("list series for rollups"))?;
        for row in &rows {
            out.push(RollupCursor {
                key: RollupKey {
                    kind,
                    id: get(row, "id")?,
                },
                first_sample_ms: get(row, "first_ms")?,
                last_sample_ms: get(row, "last_ms")?,
                done_to_ms: get(row, "done_to_ms")?,
            });
        }
    }
    Ok(out)
}

pub(super) async fn replace_rollups(
    pool: &SqlitePool,
    key: RollupKey,
    from_ms: UnixMs,
    to_ms: UnixMs,
    done_to_ms: Option<UnixMs>,
) -> Result<usize, StoreError> {
    let s = spec(key.kind);
    let (raw, id, minutes) = (s.raw, s.id, s.minutes);
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(q("begin a rollup transaction"))?;
    // Minutes before the raw horizon keep their rows: their raw samples are gone.
    let horizon: Option<i64> =
        sqlx::query_scalar("SELECT raw_from_ms FROM raw_horizon WHERE kind = ? AND id = ?")
            .bind(key.kind.as_str())
            .bind(key.id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(q("read a raw horizon"))?;
    let from_ms = from_ms.max(horizon.unwrap_or(i64::MIN));
    let mut written = 0;
    if from_ms < to_ms {
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {minutes} WHERE {id} = ? AND minute_ms >= ? AND minute_ms < ?"
        )))
        .bind(key.id)
        .bind(from_ms)
        .bind(to_ms)
        .execute(&mut *tx)
        .await
        .map_err(q("delete rollup minutes being recomputed"))?;
        let mut names = Vec::new();
        let mut aggs = Vec::new();
        for (c, _) in &s.cols {
            names.push(format!("{c}_n, {c}_avg, {c}_min, {c}_max"));
            aggs.push(format!("count({c}), avg({c}), min({c}), max({c})"));
        }
        let (names, aggs) = (names.join(", "), aggs.join(", "));
        written = sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {minutes} ({id}, minute_ms, samples, {names}) \
             SELECT {id}, (ts_ms / {MINUTE_MS}) * {MINUTE_MS} AS m, count(*), {aggs} \
             FROM {raw} WHERE {id} = ? AND ts_ms >= ? AND ts_ms < ? GROUP BY m"
        )))
        .bind(key.id)
        .bind(from_ms)
        .bind(to_ms)
        .execute(&mut *tx)
        .await
        .map_err(q("compute rollup minutes"))?
        .rows_affected();
    }
    if let Some(done) = done_to_ms {
        sqlx::query(
            "INSERT INTO rollup_progress (kind, id, done_to_ms) VALUES (?, ?, ?) \
             ON CONFLICT (kind, id) DO UPDATE SET done_to_ms = max(done_to_ms, excluded.done_to_ms)",
        )
        .bind(key.kind.as_str())
        .bind(key.id)
        .bind(done)
        .execute(&mut *tx)
        .await
        .map_err(q("advance the rollup watermark"))?;
    }
    tx.commit().await.map_err(q("commit rollup minutes"))?;
    Ok(usize::try_from(written).unwrap_or(usize::MAX))
}

pub(super) async fn stale_rollup_minutes(
    pool: &SqlitePool,
    since_ms: UnixMs,
) -> Result<Vec<(RollupKey, UnixMs)>, StoreError> {
    let mut out = Vec::new();
    for kind in [RollupKind::Gpu, RollupKind::Host] {
        let s = spec(kind);
        let (raw, id, minutes) = (s.raw, s.id, s.minutes);
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT r.id, r.minute_ms FROM ( \
               SELECT s.{id} AS id, (s.ts_ms / {MINUTE_MS}) * {MINUTE_MS} AS minute_ms, \
                 count(*) AS n \
               FROM {raw} s JOIN rollup_progress p ON p.kind = ?2 AND p.id = s.{id} \
               LEFT JOIN raw_horizon h ON h.kind = ?2 AND h.id = s.{id} \
               WHERE s.ts_ms >= ?1 AND s.ts_ms < p.done_to_ms \
                 AND (h.raw_from_ms IS NULL OR s.ts_ms >= h.raw_from_ms) GROUP BY 1, 2) r \
             LEFT JOIN {minutes} m ON m.{id} = r.id AND m.minute_ms = r.minute_ms \
             WHERE m.samples IS NULL OR m.samples != r.n ORDER BY 1, 2"
        )))
        .bind(since_ms.max(0))
        .bind(kind.as_str())
        .fetch_all(pool)
        .await
        .map_err(q("find rollup minutes with late samples"))?;
        for row in &rows {
            out.push((
                RollupKey {
                    kind,
                    id: get(row, "id")?,
                },
                get(row, "minute_ms")?,
            ));
        }
    }
    Ok(out)
}

pub(super) async fn rollup_minutes(
    pool: &SqlitePool,
    key: RollupKey,
    range: TimeRange,
) -> Result<Vec<RollupMinute>, StoreError> {
    let s = spec(key.kind);
    let (id, minutes) = (s.id, s.minutes);
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM {minutes} WHERE {id} = ? AND minute_ms BETWEEN ? AND ? ORDER BY minute_ms"
    )))
    .bind(key.id)
    .bind(range.from_ms)
    .bind(range.to_ms)
    .fetch_all(pool)
    .await
    .map_err(q("read rollup minutes"))?;
    rows.iter()
        .map(|row| {
            let samples: i64 = get(row, "samples")?;
            Ok(RollupMinute {
                minute_ms: get(row, "minute_ms")?,
                samples: u32::try_from(samples)
                    .map_err(|_| StoreError::Corrupt(format!("samples {samples}")))?,
                metrics: s
                    .cols
                    .iter()
                    .map(|&(c, real)| stats_from_row(row, c, real))
                    .collect::<Result<_, _>>()?,
            })
        })
        .collect()
}

/// `(bucket start, weighted averages)` of some columns of one series.
async fn bucket_series(
    pool: &SqlitePool,
    kind: RollupKind,
    id_value: i64,
    cols: &[&str],
    range: TimeRange,
    step_ms: i64,
    limit: usize,
) -> Result<Vec<(UnixMs, Vec<Option<f64>>)>, StoreError> {
    let s = spec(kind);
    let (id, minutes) = (s.id, s.minutes);
    // The average over the raw samples that had the metric: each minute weighs by its
    // count; a bucket where no sample had it divides by 0, which SQLite answers NULL.
    let exprs: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| format!("sum({c}_avg * {c}_n) / sum({c}_n) AS v{i}"))
        .collect();
    let exprs = exprs.join(", ");
    let step = step_ms.max(MINUTE_MS);
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT (minute_ms / ?1) * ?1 AS t, {exprs} FROM {minutes} \
         WHERE {id} = ?2 AND minute_ms BETWEEN ?3 AND ?4 GROUP BY t ORDER BY t LIMIT ?5"
    )))
    .bind(step)
    .bind(id_value)
    .bind(minute_of(range.from_ms))
    .bind(range.to_ms)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await
    .map_err(q("read a rollup series"))?;
    rows.iter()
        .map(|row| {
            let values = (0..cols.len())
                .map(|i| get::<Option<f64>>(row, &format!("v{i}")))
                .collect::<Result<_, _>>()?;
            Ok((get(row, "t")?, values))
        })
        .collect()
}

pub(super) async fn gpu_rollup_series(
    pool: &SqlitePool,
    gpu: GpuId,
    metric: GpuMetric,
    range: TimeRange,
    step_ms: i64,
    limit: usize,
) -> Result<Vec<SeriesPoint>, StoreError> {
    let rows = bucket_series(
        pool,
        RollupKind::Gpu,
        gpu.0,
        &[metric.name()],
        range,
        step_ms,
        limit,
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|(t, v)| (t, v.first().copied().flatten()))
        .collect())
}

pub(super) async fn host_rollup_series(
    pool: &SqlitePool,
    node: NodeId,
    range: TimeRange,
    step_ms: i64,
    limit: usize,
) -> Result<Vec<(UnixMs, Vec<Option<f64>>)>, StoreError> {
    bucket_series(
        pool,
        RollupKind::Host,
        node.0,
        &HOST_METRICS,
        range,
        step_ms,
        limit,
    )
    .await
}

pub(super) async fn raw_horizons(
    pool: &SqlitePool,
) -> Result<HashMap<RollupKey, UnixMs>, StoreError> {
    let rows = sqlx::query("SELECT kind, id, raw_from_ms FROM raw_horizon")
        .fetch_all(pool)
        .await
        .map_err(q("read raw horizons"))?;
    rows.iter()
        .map(|row| {
            let kind: String = get(row, "kind")?;
            let kind = RollupKind::parse(&kind)
                .ok_or_else(|| StoreError::Corrupt(format!("raw_horizon.kind {kind:?}")))?;
            Ok((
                RollupKey {
                    kind,
                    id: get(row, "id")?,
                },
                get(row, "raw_from_ms")?,
            ))
        })
        .collect()
}

/// Deletes the rows of `table` with `time_col < before` (of one id, or all), a bounded
/// number per statement: up to and including the time of the `batch`-th oldest row (so a
/// statement deletes at least `batch` rows while more remain, and at most `batch` plus the
/// rows sharing that time). Each statement is its own transaction, taken in turn with the
/// other writers of this process (`gate`, see `SqliteStore::write_gate`).
#[allow(clippy::too_many_arguments)]
async fn delete_before(
    pool: &SqlitePool,
    gate: &Mutex<()>,
    table: &'static str,
    time_col: &str,
    id: Option<(&str, i64)>,
    before: UnixMs,
    batch: usize,
    out: &mut RetentionOutcome,
) -> Result<(), StoreError> {
    let (filter, id_value) = match id {
        Some((col, v)) => (format!("{col} = ?3 AND"), v),
        None => ("?3 = ?3 AND".to_owned(), 0),
    };
    let sql = format!(
        "DELETE FROM {table} WHERE {filter} {time_col} < ?1 AND {time_col} <= coalesce(( \
           SELECT {time_col} FROM {table} WHERE {filter} {time_col} < ?1 \
           ORDER BY {time_col} LIMIT 1 OFFSET ?2), ?1)"
    );
    let offset = i64::try_from(batch.max(1) - 1).unwrap_or(i64::MAX);
    loop {
        let turn = gate.lock().await;
        let n = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(before)
            .bind(offset)
            .bind(id_value)
            .execute(pool)
            .await
            .map_err(q("delete expired rows"))?
            .rows_affected();
        drop(turn);
        out.transactions += 1;
        if n == 0 {
            return Ok(());
        }
        *out.deleted.entry(table).or_default() += n;
    }
}

/// Raises a series' raw horizon to `to` (never lowers it); returns the horizon now stored.
async fn raise_horizon(
    pool: &SqlitePool,
    key: RollupKey,
    to: UnixMs,
    old: Option<UnixMs>,
    out: &mut RetentionOutcome,
) -> Result<UnixMs, StoreError> {
    if old.is_some_and(|o| o >= to) {
        return Ok(old.unwrap_or(to));
    }
    sqlx::query(
        "INSERT INTO raw_horizon (kind, id, raw_from_ms) VALUES (?, ?, ?) \
         ON CONFLICT (kind, id) DO UPDATE SET raw_from_ms = max(raw_from_ms, excluded.raw_from_ms)",
    )
    .bind(key.kind.as_str())
    .bind(key.id)
    .bind(to)
    .execute(pool)
    .await
    .map_err(q("raise a raw horizon"))?;
    out.horizons_raised += 1;
    out.transactions += 1;
    Ok(to)
}

pub(super) async fn expire_raw_before(
    pool: &SqlitePool,
    gate: &Mutex<()>,
    cutoff_ms: UnixMs,
    batch: usize,
) -> Result<RetentionOutcome, StoreError> {
    let mut out = RetentionOutcome::default();
    let cutoff = minute_of(cutoff_ms);
    // GPUs: behind both watermarks (rollups and energy). The horizon is raised (committed)
    // before anything is deleted, so a recomputation that could read a half-deleted minute
    // finds the horizon raised when it writes, and leaves the minute alone.
    let gpus = sqlx::query(
        "SELECT g.id, r.done_to_ms AS rollup_done, e.done_to_ms AS energy_done, \
           h.raw_from_ms FROM gpus g \
         JOIN rollup_progress r ON r.kind = 'gpu' AND r.id = g.id \
         JOIN energy_progress e ON e.gpu_id = g.id \
         LEFT JOIN raw_horizon h ON h.kind = 'gpu' AND h.id = g.id ORDER BY g.id",
    )
    .fetch_all(pool)
    .await
    .map_err(q("read the watermarks for retention"))?;
    for row in &gpus {
        let id: i64 = get(row, "id")?;
        let rollup_done: i64 = get(row, "rollup_done")?;
        let energy_done: i64 = get(row, "energy_done")?;
        let old: Option<i64> = get(row, "raw_from_ms")?;
        let target = minute_of(cutoff.min(rollup_done).min(energy_done));
        let key = RollupKey::gpu(GpuId(id));
        let horizon = raise_horizon(pool, key, target, old, &mut out).await?;
        // Keep the newest sample before the horizon: the first interval of the horizon's
        // minute starts there.
        let keep: Option<i64> =
            sqlx::query_scalar("SELECT max(ts_ms) FROM gpu_samples WHERE gpu_id = ? AND ts_ms < ?")
                .bind(id)
                .bind(horizon)
                .fetch_one(pool)
                .await
                .map_err(q("find the sample before a raw horizon"))?;
        if let Some(keep) = keep {
            delete_before(
                pool,
                gate,
                "gpu_samples",
                "ts_ms",
                Some(("gpu_id", id)),
                keep,
                batch,
                &mut out,
            )
            .await?;
        }
        delete_before(
            pool,
            gate,
            "process_samples",
            "ts_ms",
            Some(("gpu_id", id)),
            horizon,
            batch,
            &mut out,
        )
        .await?;
    }
    let hosts = sqlx::query(
        "SELECT n.id, r.done_to_ms AS rollup_done, h.raw_from_ms FROM nodes n \
         JOIN rollup_progress r ON r.kind = 'host' AND r.id = n.id \
         LEFT JOIN raw_horizon h ON h.kind = 'host' AND h.id = n.id ORDER BY n.id",
    )
    .fetch_all(pool)
    .await
    .map_err(q("read the host watermarks for retention"))?;
    for row in &hosts {
        let id: i64 = get(row, "id")?;
        let rollup_done: i64 = get(row, "rollup_done")?;
        let old: Option<i64> = get(row, "raw_from_ms")?;
        let target = minute_of(cutoff.min(rollup_done));
        let horizon =
            raise_horizon(pool, RollupKey::host(NodeId(id)), target, old, &mut out).await?;
        delete_before(
            pool,
            gate,
            "host_samples",
            "ts_ms",
            Some(("node_id", id)),
            horizon,
            batch,
            &mut out,
        )
        .await?;
    }
    Ok(out)
}

pub(super) async fn expire_rollups_before(
    pool: &SqlitePool,
    gate: &Mutex<()>,
    cutoff_ms: UnixMs,
    batch: usize,
) -> Result<RetentionOutcome, StoreError> {
    let mut out = RetentionOutcome::default();
    let cutoff = minute_of(cutoff_ms);
    let gpus: Vec<i64> = sqlx::query_scalar("SELECT id FROM gpus ORDER BY id")
        .fetch_all(pool)
        .await
        .map_err(q("list GPUs for retention"))?;
    for id in gpus {
        for table in [
            "gpu_minutes",
            "energy_gpu_minutes",
            "energy_workload_minutes",
            "carbon_gpu_minutes",
        ] {
            let key = Some(("gpu_id", id));
            delete_before(pool, gate, table, "minute_ms", key, cutoff, batch, &mut out).await?;
        }
    }
    let nodes: Vec<i64> = sqlx::query_scalar("SELECT id FROM nodes ORDER BY id")
        .fetch_all(pool)
        .await
        .map_err(q("list nodes for retention"))?;
    for id in nodes {
        let key = Some(("node_id", id));
        delete_before(
            pool,
            gate,
            "host_minutes",
            "minute_ms",
            key,
            cutoff,
            batch,
            &mut out,
        )
        .await?;
    }
    delete_before(pool, gate, "events", "ts_ms", None, cutoff, batch, &mut out).await?;
    // Cached intensity slots price energy minutes only: they go with them.
    let slots = "carbon_intensity";
    delete_before(pool, gate, slots, "to_ms", None, cutoff, batch, &mut out).await?;
    Ok(out)
}
