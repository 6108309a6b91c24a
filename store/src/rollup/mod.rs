//! Per-minute rollups and retention in the store ([`RollupStore`]): the shapes crossing
//! the boundary and their SQL, once for both backends. The task that drives them is
//! `accounting::rollups` (collector).
//!
//! Rollups are computed in SQL (`INSERT ... SELECT ... GROUP BY minute`) from the raw
//! tables, so a minute costs one pass over its rows inside the database. Retention deletes
//! in statements of a bounded number of rows, each its own short transaction, so the
//! group-commit writer never waits long behind it.

pub(crate) mod kinds;

pub use kinds::{
    HOST_METRICS, MetricStats, RetentionOutcome, RollupCursor, RollupKey, RollupKind, RollupMinute,
};
pub(crate) use kinds::{rollup_series, spec};

use super::backend::{Backend, Get, sql};
use super::{
    GpuId, GpuMetric, NodeId, SeriesPoint, SqlStore, StoreError, TimeRange, skip_unreadable,
};
use super::{health_hours, rollup_hours};
use async_trait::async_trait;
use gpufleet_core::UnixMs;
use gpufleet_core::times::{MINUTE_MS, minute_of};
use std::collections::{BTreeSet, HashMap};

/// What the rollup and retention task reads and writes, and what the API reads of
/// rollups.
#[async_trait]
pub trait RollupStore: Send + Sync + std::fmt::Debug {
    /// Every GPU and every node's host series, with its raw sample span and rollup
    /// watermark.
    async fn rollup_cursors(&self) -> Result<Vec<RollupCursor>, StoreError>;

    /// In one transaction: recomputes the rollup minutes of `key` in `[from_ms, to_ms)`
    /// (minute-aligned) from the raw rows (a minute without rows keeps its rollup row: its
    /// samples may be packed, or behind the raw horizon), and
    /// raises the watermark to `done_to_ms` (never lowers it). Minutes before the series'
    /// raw horizon are left as they are. Returns the minutes written.
    async fn replace_rollups(
        &self,
        key: RollupKey,
        from_ms: UnixMs,
        to_ms: UnixMs,
        done_to_ms: Option<UnixMs>,
    ) -> Result<usize, StoreError>;

    /// Minutes before the rollup watermark, and at or after the raw horizon, whose stored
    /// sample count differs from the raw samples' (late data), from `since_ms` on.
    async fn stale_rollup_minutes(
        &self,
        since_ms: UnixMs,
    ) -> Result<Vec<(RollupKey, UnixMs)>, StoreError>;

    /// The stored rollup minutes of one series whose start is in `range`, oldest first.
    async fn rollup_minutes(
        &self,
        key: RollupKey,
        range: TimeRange,
    ) -> Result<Vec<RollupMinute>, StoreError>;

    /// One metric of one GPU from the rollups: per bucket `[k*step, (k+1)*step)` of whole
    /// minutes (`step_ms` is at least 60 s; the minutes from the one holding `from` to
    /// `to`), the average over the raw samples that had the metric (`None` if none had
    /// it); buckets without minutes are omitted. At most `limit` points.
    async fn gpu_rollup_series(
        &self,
        gpu: GpuId,
        metric: GpuMetric,
        range: TimeRange,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<SeriesPoint>, StoreError>;

    /// A node's host metrics from the rollups, bucketed like
    /// [`RollupStore::gpu_rollup_series`]: `(bucket start, values in HOST_METRICS order)`.
    async fn host_rollup_series(
        &self,
        node: NodeId,
        range: TimeRange,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<(UnixMs, Vec<Option<f64>>)>, StoreError>;

    /// The raw horizon of every series that has one: its raw samples are complete from
    /// there on; minutes before it are never recomputed (rollups, energy, checks).
    async fn raw_horizons(&self) -> Result<HashMap<RollupKey, UnixMs>, StoreError>;

    /// Retention of raw data: deletes GPU, process and host samples older than
    /// `cutoff_ms`, per series only behind its rollup watermark and (GPUs) its energy
    /// watermark, at a minute boundary (the raw horizon, raised and committed before
    /// anything is deleted). A GPU keeps its newest sample before the horizon (the start
    /// of the horizon minute's first interval). At most about `batch_rows` rows per
    /// transaction. PostgreSQL drops whole day partitions first.
    async fn expire_raw_before(
        &self,
        cutoff_ms: UnixMs,
        batch_rows: usize,
    ) -> Result<RetentionOutcome, StoreError>;

    /// Packs the closed minutes of host rows, process ticks and GPU samples that end at or
    /// before `before_ms`, behind the rollup (host), energy (process) or both (GPU)
    /// watermarks, at most about `budget` minutes per tier per call (see
    /// `store::packing`); then the closed hours of rollup minutes that hold no raw row any
    /// more, at most `budget` hours per kind (see `store::rollup_hours`): what was stored
    /// stays answerable, row for row.
    async fn pack_closed_minutes(
        &self,
        before_ms: UnixMs,
        budget: usize,
    ) -> Result<super::PackOutcome, StoreError>;

    /// Retention of rollups: deletes rollup minutes, energy minutes and events older than
    /// `cutoff_ms`, at most about `batch_rows` rows per transaction.
    async fn expire_rollups_before(
        &self,
        cutoff_ms: UnixMs,
        batch_rows: usize,
    ) -> Result<RetentionOutcome, StoreError>;
}

/// Packed raw values go only when they end at or before the horizon (`$1`): the one that
/// holds it is split first, or (merged meanwhile by another collector) kept whole.
const PACKED_WHOLLY_BEHIND: &str = "minute_ms + span_ms <= $1";

impl<DB: Backend> SqlStore<DB> {
    /// `(bucket start, weighted averages)` of some columns of one series: rows and packed
    /// hours, in one read snapshot.
    async fn bucket_series(
        &self,
        key: RollupKey,
        cols: &[&str],
        range: TimeRange,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<(UnixMs, Vec<Option<f64>>)>, StoreError> {
        let s = spec(key.kind);
        let (id, minutes) = (s.id, s.minutes);
        let indexes = (cols.iter())
            .map(|c| s.cols.iter().position(|(name, _)| name == c))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| StoreError::Corrupt(format!("no rolled-up metric among {cols:?}")))?;
        let step = step_ms.max(MINUTE_MS);
        let (from, to) = (minute_of(range.from_ms), range.to_ms);
        // The average over the raw samples that had the metric: each minute weighs by its
        // count. Per bucket the sums of `avg × n` and of `n` (a metric no sample had sums
        // to NULL and 0); the first `limit` buckets of the rows hold every row of the
        // first `limit` buckets of rows and packed hours together.
        let exprs: Vec<String> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| format!("sum({c}_avg * {c}_n) AS s{i}, sum({c}_n) AS n{i}"))
            .collect();
        let exprs = exprs.join(", ");
        let op = "read a rollup series";
        let mut tx = self.read_snapshot(op).await?;
        let rows = sql::<DB>(
            op,
            format!(
                "SELECT (minute_ms / $1) * $1 AS t, {exprs} FROM {minutes} \
                 WHERE {id} = $2 AND minute_ms BETWEEN $3 AND $4 GROUP BY 1 ORDER BY 1 LIMIT $5"
            ),
        )
        .bind(step)
        .bind(key.id)
        .bind(from)
        .bind(to)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .all(&mut tx)
        .await?;
        let mut sums = rollup_hours::BucketSums::new();
        for row in &rows {
            let cells = (0..cols.len())
                .map(|i| {
                    let n: Option<i64> = row.get(&format!("n{i}"))?;
                    Ok((row.get(&format!("s{i}"))?, n.unwrap_or(0)))
                })
                .collect::<Result<_, StoreError>>()?;
            sums.insert(row.get("t")?, cells);
        }
        rollup_hours::bucket_sums::<DB>(&mut tx, key, &indexes, (from, to), step, limit, &mut sums)
            .await?;
        super::end_read(tx, op).await?;
        Ok(sums
            .into_iter()
            .take(limit)
            .map(|(t, cells)| {
                let values = cells
                    .into_iter()
                    .map(|(sum, n)| sum.filter(|_| n != 0).map(|sum| sum / n as f64))
                    .collect();
                (t, values)
            })
            .collect())
    }

    /// Deletes GPU `gpu_id`'s rows of `table` before `horizon` except the newest of them.
    async fn delete_keeping_newest(
        &self,
        table: &'static str,
        gpu_id: i64,
        horizon: UnixMs,
        batch: usize,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        let keep: Option<i64> = sql::<DB>(
            "find the row before a raw horizon",
            format!("SELECT max(ts_ms) AS keep FROM {table} WHERE gpu_id = $1 AND ts_ms < $2"),
        )
        .bind(gpu_id)
        .bind(horizon)
        .one(&mut *self.conn().await?)
        .await?
        .get("keep")?;
        match keep {
            Some(keep) => {
                self.delete_before(table, "ts_ms", Some(("gpu_id", gpu_id)), keep, batch, out)
                    .await
            }
            None => Ok(()),
        }
    }

    /// Deletes GPU `gpu_id`'s health readings before `horizon` except the newest of them,
    /// rows and packed hours alike.
    async fn expire_health(
        &self,
        gpu_id: i64,
        horizon: UnixMs,
        batch: usize,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        let keep =
            health_hours::newest_before::<DB>(&mut *self.conn().await?, gpu_id, horizon).await;
        let Some(keep) = skip_unreadable(keep, health_hours::TABLE, gpu_id)? else {
            return Ok(());
        };
        let id = Some(("gpu_id", gpu_id));
        self.delete_before("gpu_health", "ts_ms", id, keep, batch, out)
            .await?;
        let expired = health_hours::expire(self, gpu_id, keep).await;
        if let Some(n) = skip_unreadable(expired, health_hours::TABLE, gpu_id)? {
            out.transactions += 1;
            if n > 0 {
                *out.deleted.entry(health_hours::TABLE).or_default() += n;
            }
        }
        Ok(())
    }

    /// Deletes the rows of `table` with `time_col < before` (of one id, or all), a bounded
    /// number per statement: up to and including the time of the `batch`-th oldest row (so
    /// a statement deletes at least `batch` rows while more remain, and at most `batch`
    /// plus the rows sharing that time). Each statement is its own transaction, taken in
    /// turn with the other writers of this process where the backend queues them.
    async fn delete_before(
        &self,
        table: &'static str,
        time_col: &str,
        id: Option<(&str, i64)>,
        before: UnixMs,
        batch: usize,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        self.delete_before_where(table, time_col, "", id, before, batch, out)
            .await
    }

    /// [`Self::delete_before`] of the rows that also meet `also` (SQL after `AND`, with
    /// `$1` the cutoff; empty: none more).
    #[allow(clippy::too_many_arguments)]
    async fn delete_before_where(
        &self,
        table: &'static str,
        time_col: &str,
        also: &str,
        id: Option<(&str, i64)>,
        before: UnixMs,
        batch: usize,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        // A series' rollup rows go under its rollup lock: the packer moves them under it,
        // and must find them all where it read them (PostgreSQL).
        let lock = id.and_then(|(_, v)| rollup_series(table, v));
        let (filter, id_value) = match id {
            Some((col, v)) => (format!("{col} = $3 AND"), v),
            None => ("CAST($3 AS BIGINT) IS NOT NULL AND".to_owned(), 0),
        };
        let also = if also.is_empty() {
            String::new()
        } else {
            format!(" AND {also}")
        };
        let text = format!(
            "DELETE FROM {table} WHERE {filter} {time_col} < $1 AND {time_col} <= coalesce(( \
               SELECT {time_col} FROM {table} WHERE {filter} {time_col} < $1 \
               ORDER BY {time_col} LIMIT 1 OFFSET $2), $1){also}"
        );
        let offset = i64::try_from(batch.max(1) - 1).unwrap_or(i64::MAX);
        loop {
            let query = sql::<DB>("delete expired rows", text.clone())
                .bind(before)
                .bind(offset)
                .bind(id_value);
            let n = match lock {
                None => self.write_one(query).await?,
                Some(key) => {
                    let mut tx = self.begin_write("begin deleting expired rows").await?;
                    rollup_hours::lock::<DB>(tx.conn(), key).await?;
                    let n = query.execute(tx.conn()).await?;
                    tx.commit("commit deleting expired rows").await?;
                    n
                }
            };
            out.transactions += 1;
            if n == 0 {
                return Ok(());
            }
            *out.deleted.entry(table).or_default() += n;
        }
    }

    /// Raises a series' raw horizon to `to` (never lowers it).
    async fn raise_horizon(
        &self,
        key: RollupKey,
        to: UnixMs,
        old: Option<UnixMs>,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        if old.is_some_and(|o| o >= to) {
            return Ok(());
        }
        self.write_one(
            sql::<DB>(
                "raise a raw horizon",
                DB::DIALECT.raise("raw_horizon", "kind, id", "raw_from_ms"),
            )
            .bind(key.kind.as_str())
            .bind(key.id)
            .bind(to),
        )
        .await?;
        out.horizons_raised += 1;
        out.transactions += 1;
        Ok(())
    }

    /// Step one of raw retention: raises every series' raw horizon to where its raw
    /// samples may go (behind the rollup and, for GPUs, the energy watermark; at most
    /// `cutoff_ms`). Each horizon is committed before anything is deleted, so a
    /// recomputation that could read a half-deleted minute finds the horizon raised when
    /// it writes, and leaves the minute alone.
    async fn raise_raw_horizons(
        &self,
        cutoff_ms: UnixMs,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        let cutoff = minute_of(cutoff_ms);
        let gpus = sql::<DB>(
            "read the watermarks for retention",
            "SELECT g.id, r.done_to_ms AS rollup_done, e.done_to_ms AS energy_done, \
               h.raw_from_ms FROM gpus g \
             JOIN rollup_progress r ON r.kind = 'gpu' AND r.id = g.id \
             JOIN energy_progress e ON e.gpu_id = g.id \
             LEFT JOIN raw_horizon h ON h.kind = 'gpu' AND h.id = g.id ORDER BY g.id",
        )
        .all(&mut *self.conn().await?)
        .await?;
        for row in &gpus {
            let rollup_done: i64 = row.get("rollup_done")?;
            let energy_done: i64 = row.get("energy_done")?;
            let target = minute_of(cutoff.min(rollup_done).min(energy_done));
            let key = RollupKey::gpu(GpuId(row.get("id")?));
            self.raise_horizon(key, target, row.get("raw_from_ms")?, out)
                .await?;
        }
        let hosts = sql::<DB>(
            "read the host watermarks for retention",
            "SELECT n.id, r.done_to_ms AS rollup_done, h.raw_from_ms FROM nodes n \
             JOIN rollup_progress r ON r.kind = 'host' AND r.id = n.id \
             LEFT JOIN raw_horizon h ON h.kind = 'host' AND h.id = n.id ORDER BY n.id",
        )
        .all(&mut *self.conn().await?)
        .await?;
        for row in &hosts {
            let rollup_done: i64 = row.get("rollup_done")?;
            let target = minute_of(cutoff.min(rollup_done));
            let key = RollupKey::host(NodeId(row.get("id")?));
            self.raise_horizon(key, target, row.get("raw_from_ms")?, out)
                .await?;
        }
        Ok(())
    }

    /// Step three of raw retention (after the backend dropped what it drops whole):
    /// deletes what is left behind the horizons, in bounded statements.
    async fn delete_behind_horizons(
        &self,
        batch: usize,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        let horizons: BTreeSet<(RollupKind, i64, UnixMs)> = self
            .raw_horizons()
            .await?
            .into_iter()
            .map(|(k, h)| (k.kind, k.id, h))
            .collect();
        for (kind, id_value, horizon) in horizons {
            // Packed values go whole: an hour-long host or process value holding the horizon
            // is split into minutes first (a GPU's samples: in `expire_packed_gpu`). One
            // merged by another collector meanwhile (it read the horizon before it was
            // raised) is left whole, and split on the next pass.
            let split = super::packing::split_at_horizon(self, kind, id_value, horizon)
                .await
                .map(Some);
            let table = match kind {
                RollupKind::Gpu => "packed_process_minutes",
                RollupKind::Host => "packed_host_minutes",
            };
            if let Some(split) = skip_unreadable(split, table, id_value)? {
                out.transactions += usize::from(split);
            }
            match kind {
                RollupKind::Gpu => {
                    // Keep the newest sample before the horizon: the first interval of the
                    // horizon's minute starts there.
                    self.delete_keeping_newest("gpu_samples", id_value, horizon, batch, out)
                        .await?;
                    let expired = super::packing::expire_packed_gpu(self, id_value, horizon)
                        .await
                        .map(Some);
                    if let Some((packed, rows)) =
                        skip_unreadable(expired, "packed_gpu_minutes", id_value)?
                    {
                        out.transactions += 1;
                        for (table, n) in [("packed_gpu_minutes", packed), ("gpu_samples", rows)] {
                            if n > 0 {
                                *out.deleted.entry(table).or_default() += n;
                            }
                        }
                    }
                    let id = Some(("gpu_id", id_value));
                    self.delete_before("process_samples", "ts_ms", id, horizon, batch, out)
                        .await?;
                    self.delete_before_where(
                        "packed_process_minutes",
                        "minute_ms",
                        PACKED_WHOLLY_BEHIND,
                        id,
                        horizon,
                        batch,
                        out,
                    )
                    .await?;
                    // Health rows go with the raw samples; the newest before the horizon
                    // stays, so the live state is seeded with the GPU's last health.
                    self.expire_health(id_value, horizon, batch, out).await?;
                }
                RollupKind::Host => {
                    let id = Some(("node_id", id_value));
                    self.delete_before("host_samples", "ts_ms", id, horizon, batch, out)
                        .await?;
                    self.delete_before_where(
                        "packed_host_minutes",
                        "minute_ms",
                        PACKED_WHOLLY_BEHIND,
                        id,
                        horizon,
                        batch,
                        out,
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// Retention of one series' packed rollup hours (see [`rollup_hours::expire`]).
    async fn expire_packed_rollups(
        &self,
        key: RollupKey,
        cutoff: UnixMs,
        out: &mut RetentionOutcome,
    ) -> Result<(), StoreError> {
        let expired = rollup_hours::expire(self, key, cutoff).await;
        let Some(n) = skip_unreadable(expired, rollup_hours::table(key.kind), key.id)? else {
            return Ok(());
        };
        out.transactions += 1;
        if n > 0 {
            *out.deleted
                .entry(rollup_hours::table(key.kind))
                .or_default() += n;
        }
        Ok(())
    }

    /// All ids of `table` (`gpus`, `nodes`), in order.
    async fn ids(&self, op: &'static str, table: &str) -> Result<Vec<i64>, StoreError> {
        let query = sql::<DB>(op, format!("SELECT id FROM {table} ORDER BY id"));
        self.fetch(query, |row| row.get("id")).await
    }
}

#[async_trait]
impl<DB: Backend> RollupStore for SqlStore<DB> {
    async fn rollup_cursors(&self) -> Result<Vec<RollupCursor>, StoreError> {
        let mut out = Vec::new();
        let mut conn = self.conn().await?;
        for (kind, parent) in [(RollupKind::Gpu, "gpus"), (RollupKind::Host, "nodes")] {
            let s = spec(kind);
            let (raw, id) = (s.raw, s.id);
            // A GPU's samples packed as they arrived have their rollup rows already; the
            // watermark passes over them.
            let span = match kind {
                RollupKind::Gpu => super::packing::gpu_sample_span(DB::DIALECT, "x.id"),
                RollupKind::Host => format!(
                    "(SELECT min(r.ts_ms) FROM {raw} r WHERE r.{id} = x.id) AS first_ms, \
                     (SELECT max(r.ts_ms) FROM {raw} r WHERE r.{id} = x.id) AS last_ms"
                ),
            };
            let rows = sql::<DB>(
                "list series for rollups",
                format!(
                    "SELECT x.id, {span}, p.done_to_ms \
                     FROM {parent} x LEFT JOIN rollup_progress p ON p.kind = $1 AND p.id = x.id \
                     ORDER BY x.id"
                ),
            )
            .bind(kind.as_str())
            .all(&mut conn)
            .await?;
            for row in &rows {
                out.push(RollupCursor {
                    key: RollupKey {
                        kind,
                        id: row.get("id")?,
                    },
                    first_sample_ms: row.get("first_ms")?,
                    last_sample_ms: row.get("last_ms")?,
                    done_to_ms: row.get("done_to_ms")?,
                });
            }
        }
        Ok(out)
    }

    async fn replace_rollups(
        &self,
        key: RollupKey,
        from_ms: UnixMs,
        to_ms: UnixMs,
        done_to_ms: Option<UnixMs>,
    ) -> Result<usize, StoreError> {
        let s = spec(key.kind);
        let (raw, id, minutes) = (s.raw, s.id, s.minutes);
        let mut names = Vec::new();
        let mut aggs = Vec::new();
        let mut updates = vec!["samples = excluded.samples".to_owned()];
        for &(c, real) in &s.cols {
            names.push(format!("{c}_n, {c}_avg, {c}_min, {c}_max"));
            let ext = if real { "DOUBLE PRECISION" } else { "BIGINT" };
            aggs.push(format!(
                "CAST(count({c}) AS INTEGER), CAST(avg({c}) AS DOUBLE PRECISION), \
                 CAST(min({c}) AS {ext}), CAST(max({c}) AS {ext})"
            ));
            for suffix in ["n", "avg", "min", "max"] {
                updates.push(format!("{c}_{suffix} = excluded.{c}_{suffix}"));
            }
        }
        let (names, aggs, updates) = (names.join(", "), aggs.join(", "), updates.join(", "));
        let mut tx = self.begin_write("begin a rollup transaction").await?;
        // A minute is in one form at a time: a packed hour the range touches is rows again
        // before its minutes are recomputed.
        rollup_hours::lock::<DB>(tx.conn(), key).await?;
        rollup_hours::reopen::<DB>(tx.conn(), key, from_ms, to_ms).await?;
        // One statement that reads the raw horizon itself (minutes before it keep their
        // rows: their raw samples are gone), so the horizon and the raw rows come from one
        // snapshot (under PostgreSQL's READ COMMITTED a separate read could miss a horizon
        // raised just before a deletion). No minute in the range loses its samples (raw
        // goes only behind the horizon), so an upsert replaces every row the range had.
        let written = sql::<DB>(
            "compute rollup minutes",
            format!(
                "INSERT INTO {minutes} ({id}, minute_ms, samples, {names}) \
                 SELECT {id}, (ts_ms / {MINUTE_MS}) * {MINUTE_MS} AS m, \
                 CAST(count(*) AS INTEGER), {aggs} FROM {raw} WHERE {id} = $1 AND ts_ms < $3 \
                 AND ts_ms >= {} GROUP BY {id}, m \
                 ON CONFLICT ({id}, minute_ms) DO UPDATE SET {updates}",
                DB::DIALECT.greatest(
                    "$2",
                    "coalesce((SELECT raw_from_ms FROM raw_horizon WHERE kind = $4 AND id = $1), $2)"
                ),
            ),
        )
        .bind(key.id)
        .bind(from_ms)
        .bind(to_ms)
        .bind(key.kind.as_str())
        .execute(tx.conn())
        .await?;
        if let Some(done) = done_to_ms {
            let text = DB::DIALECT.raise("rollup_progress", "kind, id", "done_to_ms");
            sql::<DB>("advance the rollup watermark", text)
                .bind(key.kind.as_str())
                .bind(key.id)
                .bind(done)
                .execute(tx.conn())
                .await?;
        }
        tx.commit("commit rollup minutes").await?;
        Ok(usize::try_from(written).unwrap_or(usize::MAX))
    }

    async fn stale_rollup_minutes(
        &self,
        since_ms: UnixMs,
    ) -> Result<Vec<(RollupKey, UnixMs)>, StoreError> {
        let mut out = Vec::new();
        let mut conn = self.conn().await?;
        for kind in [RollupKind::Gpu, RollupKind::Host] {
            let s = spec(kind);
            let (raw, id, minutes) = (s.raw, s.id, s.minutes);
            let rows = sql::<DB>(
                "find rollup minutes with late samples",
                format!(
                    "SELECT r.id, r.minute_ms FROM ( \
                       SELECT s.{id} AS id, (s.ts_ms / {MINUTE_MS}) * {MINUTE_MS} AS minute_ms, \
                         count(*) AS n \
                       FROM {raw} s JOIN rollup_progress p ON p.kind = $2 AND p.id = s.{id} \
                       LEFT JOIN raw_horizon h ON h.kind = $2 AND h.id = s.{id} \
                       WHERE s.ts_ms >= $1 AND s.ts_ms < p.done_to_ms \
                         AND (h.raw_from_ms IS NULL OR s.ts_ms >= h.raw_from_ms) GROUP BY 1, 2) r \
                     LEFT JOIN {minutes} m ON m.{id} = r.id AND m.minute_ms = r.minute_ms \
                     WHERE m.samples IS NULL OR m.samples != r.n ORDER BY 1, 2"
                ),
            )
            .bind(since_ms.max(0))
            .bind(kind.as_str())
            .all(&mut conn)
            .await?;
            for row in &rows {
                out.push((
                    RollupKey {
                        kind,
                        id: row.get("id")?,
                    },
                    row.get("minute_ms")?,
                ));
            }
        }
        Ok(out)
    }

    async fn rollup_minutes(
        &self,
        key: RollupKey,
        range: TimeRange,
    ) -> Result<Vec<RollupMinute>, StoreError> {
        let op = "read rollup minutes";
        let mut tx = self.read_snapshot(op).await?;
        let minutes = rollup_hours::minutes::<DB>(&mut tx, key, range).await?;
        super::end_read(tx, op).await?;
        Ok(minutes)
    }

    async fn gpu_rollup_series(
        &self,
        gpu: GpuId,
        metric: GpuMetric,
        range: TimeRange,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        let cols = [metric.name()];
        let rows = self
            .bucket_series(RollupKey::gpu(gpu), &cols, range, step_ms, limit)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(t, v)| (t, v.first().copied().flatten()))
            .collect())
    }

    async fn host_rollup_series(
        &self,
        node: NodeId,
        range: TimeRange,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<(UnixMs, Vec<Option<f64>>)>, StoreError> {
        (self.bucket_series(RollupKey::host(node), &HOST_METRICS, range, step_ms, limit)).await
    }

    async fn pack_closed_minutes(
        &self,
        before_ms: UnixMs,
        budget: usize,
    ) -> Result<super::PackOutcome, StoreError> {
        let mut out = self.pack_minutes(before_ms, budget).await?;
        // After the raw tiers: an hour's rollups are packed once its raw minutes are.
        let hours = self.pack_rollup_hours(before_ms, budget).await?;
        out.rollup_minutes += hours.rollup_minutes;
        out.transactions += hours.transactions;
        let health = self.pack_health_hours(before_ms, budget).await?;
        out.health_readings += health.health_readings;
        out.transactions += health.transactions;
        Ok(out)
    }

    async fn raw_horizons(&self) -> Result<HashMap<RollupKey, UnixMs>, StoreError> {
        let query = sql::<DB>(
            "read raw horizons",
            "SELECT kind, id, raw_from_ms FROM raw_horizon",
        );
        let horizons = self.fetch(query, |row| {
            let kind: String = row.get("kind")?;
            let kind = RollupKind::parse(&kind)
                .ok_or_else(|| StoreError::Corrupt(format!("raw_horizon.kind {kind:?}")))?;
            Ok((
                RollupKey {
                    kind,
                    id: row.get("id")?,
                },
                row.get("raw_from_ms")?,
            ))
        });
        Ok(horizons.await?.into_iter().collect())
    }

    /// Raises the raw horizons, lets the backend drop what it can drop whole (PostgreSQL:
    /// every raw day partition that ends before the oldest row still to be kept), then
    /// deletes the rest behind the horizons in bounded statements.
    async fn expire_raw_before(
        &self,
        cutoff_ms: UnixMs,
        batch_rows: usize,
    ) -> Result<RetentionOutcome, StoreError> {
        let mut out = RetentionOutcome::default();
        self.raise_raw_horizons(cutoff_ms, &mut out).await?;
        out.partitions_dropped = DB::drop_expired_raw(self).await?;
        self.delete_behind_horizons(batch_rows, &mut out).await?;
        Ok(out)
    }

    async fn expire_rollups_before(
        &self,
        cutoff_ms: UnixMs,
        batch: usize,
    ) -> Result<RetentionOutcome, StoreError> {
        let mut out = RetentionOutcome::default();
        let cutoff = minute_of(cutoff_ms);
        for id in self.ids("list GPUs for retention", "gpus").await? {
            let series = RollupKey::gpu(GpuId(id));
            for table in [
                "gpu_minutes",
                "energy_gpu_minutes",
                "energy_workload_minutes",
                "carbon_gpu_minutes",
            ] {
                let key = Some(("gpu_id", id));
                self.delete_before(table, "minute_ms", key, cutoff, batch, &mut out)
                    .await?;
            }
            self.expire_packed_rollups(series, cutoff, &mut out).await?;
        }
        for id in self.ids("list nodes for retention", "nodes").await? {
            let series = RollupKey::host(NodeId(id));
            let key = Some(("node_id", id));
            self.delete_before("host_minutes", "minute_ms", key, cutoff, batch, &mut out)
                .await?;
            self.expire_packed_rollups(series, cutoff, &mut out).await?;
        }
        self.delete_before("events", "ts_ms", None, cutoff, batch, &mut out)
            .await?;
        // Cached intensity slots price energy minutes only: they go with them.
        self.delete_before("carbon_intensity", "to_ms", None, cutoff, batch, &mut out)
            .await?;
        Ok(out)
    }
}
