//! Prometheus remote-write in the store ([`RemoteWriteStore`]): the delivered positions
//! (`remote_write_positions`) and the per-workload energy the pusher sends, with their SQL
//! once for both backends, and the GPU samples after each GPU's position, many GPUs in
//! one query. The pushing is in `remote_write` (collector).

use super::backend::{Backend, Get, GetExt, Table, sql};
use super::rows::{self, GPU_COLS, WORKLOAD_COLS, limit_i64};
use super::{GpuId, SqlStore, StoreError, TimeRange};
use async_trait::async_trait;
use gpufleet_core::{GpuSample, UnixMs, Workload};
use std::collections::BTreeMap;

/// The stream of per-GPU positions (series: the GPU's UUID).
pub const STREAM_GPU: &str = "gpu";
/// The stream of the energy position (series `""`: the newest energy minute delivered).
pub const STREAM_ENERGY: &str = "energy";

/// One workload's closed energy on one node: in one minute (from
/// [`RemoteWriteStore::workload_energy_minutes`]) or summed up to a minute (from
/// [`RemoteWriteStore::workload_energy_totals`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadNodeEnergy {
    /// The minute (its start), or for totals the minute they run to.
    pub minute_ms: UnixMs,
    pub workload: Workload,
    pub node: String,
    /// Its active share, in mJ.
    pub active_mj: u64,
    /// Its idle share by memory held (charged to it only under `spread`), in mJ.
    pub idle_mj: u64,
}

/// What the remote-write pusher keeps and reads.
#[async_trait]
pub trait RemoteWriteStore: Send + Sync + std::fmt::Debug {
    /// The delivered positions of `stream`, by series.
    async fn remote_write_positions(
        &self,
        stream: &str,
    ) -> Result<BTreeMap<String, UnixMs>, StoreError>;

    /// Records delivered positions of `stream` in one statement. A position never moves
    /// back: an older one than the stored one (or than another of the same series in
    /// `positions`) is ignored.
    async fn save_remote_write_positions(
        &self,
        stream: &str,
        positions: &[(String, UnixMs)],
    ) -> Result<(), StoreError>;

    /// For each `(gpu, after_ms)` of `wanted`, in order: the GPU's samples after
    /// `after_ms`, oldest first, in one query whatever the number of GPUs. Each GPU gets
    /// the oldest of them, at most `per_gpu`, and all together at most `total`, shared
    /// out oldest-first round by round (every GPU's first sample before any GPU's
    /// second), so each answer is the start of what follows its position and nothing is
    /// skipped by reading on from its newest sample.
    async fn gpu_samples_after(
        &self,
        wanted: &[(GpuId, UnixMs)],
        per_gpu: usize,
        total: usize,
    ) -> Result<Vec<Vec<(UnixMs, GpuSample)>>, StoreError>;

    /// Per minute in `(after_ms, to_ms]`, per workload and node: the energy of closed
    /// (not provisional) minutes, by minute.
    async fn workload_energy_minutes(
        &self,
        after_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<Vec<WorkloadNodeEnergy>, StoreError>;

    /// Per workload and node: the energy of every closed minute up to `to_ms` (inclusive),
    /// each with `minute_ms` = `to_ms`.
    async fn workload_energy_totals(
        &self,
        to_ms: UnixMs,
    ) -> Result<Vec<WorkloadNodeEnergy>, StoreError>;

    /// How far the accountant has closed every GPU that has samples at or after
    /// `from_ms`: the lowest energy watermark among them (`from_ms` itself for one never
    /// accounted); `None` when no GPU has such samples. A GPU that went away stops
    /// counting once `from_ms` passes its last sample, so it never holds this back.
    async fn energy_closed_to(&self, from_ms: UnixMs) -> Result<Option<UnixMs>, StoreError>;

    /// The cumulative energy last pushed per workload and node (saved by
    /// [`Self::save_remote_write_energy`]), each with `minute_ms` = the energy position;
    /// a workload no longer in the store is left out.
    async fn remote_write_energy_totals(&self) -> Result<Vec<WorkloadNodeEnergy>, StoreError>;

    /// Records the delivered energy position and the cumulative totals pushed up to it,
    /// in one transaction. Neither moves back: an older position or a lower total than
    /// the stored one is ignored.
    async fn save_remote_write_energy(
        &self,
        position_ms: UnixMs,
        totals: &[WorkloadNodeEnergy],
    ) -> Result<(), StoreError>;
}

/// Raises one stored position (never lowering it).
async fn save_position<DB: Backend>(
    tx: &mut super::WriteTx<'_, DB>,
    stream: &str,
    series: &str,
    position_ms: UnixMs,
) -> Result<(), StoreError> {
    sql::<DB>(
        "save a remote-write position",
        "INSERT INTO remote_write_positions (stream, series, position_ms) \
         VALUES ($1, $2, $3) ON CONFLICT (stream, series) DO UPDATE SET position_ms = \
         CASE WHEN excluded.position_ms > remote_write_positions.position_ms \
         THEN excluded.position_ms ELSE remote_write_positions.position_ms END",
    )
    .bind(stream)
    .bind(series)
    .bind(position_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

fn energy_row<R: Get>(
    row: &R,
    minute_ms: Option<UnixMs>,
) -> Result<WorkloadNodeEnergy, StoreError> {
    Ok(WorkloadNodeEnergy {
        minute_ms: match minute_ms {
            Some(m) => m,
            None => row.get("minute_ms")?,
        },
        workload: rows::workload(row)?,
        node: row.get("node_name")?,
        active_mj: row.nonneg("active_mj")?,
        idle_mj: row.nonneg("idle_mj")?,
    })
}

/// Closed workload minutes joined to their workload and node; `{cols}` and the grouping
/// are the caller's.
const ENERGY_FROM: &str = "FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
     JOIN gpus g ON g.id = m.gpu_id JOIN nodes n ON n.id = g.node_id";

#[async_trait]
impl<DB: Backend> RemoteWriteStore for SqlStore<DB> {
    async fn remote_write_positions(
        &self,
        stream: &str,
    ) -> Result<BTreeMap<String, UnixMs>, StoreError> {
        let query = sql::<DB>(
            "read remote-write positions",
            "SELECT series, position_ms FROM remote_write_positions WHERE stream = $1",
        )
        .bind(stream);
        let rows = self
            .fetch(query, |row| {
                Ok((row.get("series")?, row.get("position_ms")?))
            })
            .await?;
        Ok(rows.into_iter().collect())
    }

    async fn save_remote_write_positions(
        &self,
        stream: &str,
        positions: &[(String, UnixMs)],
    ) -> Result<(), StoreError> {
        // One row per series (an upsert may touch a row once): its newest position.
        let mut newest: BTreeMap<&str, UnixMs> = BTreeMap::new();
        for (series, position_ms) in positions {
            let p = newest.entry(series.as_str()).or_insert(*position_ms);
            *p = (*p).max(*position_ms);
        }
        if newest.is_empty() {
            return Ok(());
        }
        let table = Table::default()
            .text("series", newest.keys().map(|s| (*s).to_owned()))
            .int("position_ms", newest.values().copied());
        let d = DB::DIALECT;
        let query = sql::<DB>(
            "save remote-write positions",
            format!(
                "INSERT INTO remote_write_positions (stream, series, position_ms) \
                 SELECT ${}, v.series, v.position_ms FROM {} WHERE true ORDER BY v.o \
                 ON CONFLICT (stream, series) DO UPDATE SET position_ms = {}",
                d.param_after(&table),
                d.over(&table, "v"),
                d.greatest("remote_write_positions.position_ms", "excluded.position_ms"),
            ),
        )
        .bind_table(table)
        .bind(stream);
        self.write_one(query).await?;
        Ok(())
    }

    async fn gpu_samples_after(
        &self,
        wanted: &[(GpuId, UnixMs)],
        per_gpu: usize,
        total: usize,
    ) -> Result<Vec<Vec<(UnixMs, GpuSample)>>, StoreError> {
        let n = wanted.len();
        let mut out = vec![Vec::new(); n];
        if n == 0 || per_gpu == 0 || total == 0 {
            return Ok(out);
        }
        // One snapshot: a minute packed or reopened meanwhile must not be missed. A
        // position more than an hour behind (a backfill, an outage) may be in packed
        // minutes: those GPUs' samples are read merged (none of their rows in SQL), and
        // every GPU's ranked in Rust. The SQL's first `total` of the others still hold all
        // of theirs that the whole ranking keeps: leaving GPUs out moves no row later.
        let mut tx = self
            .read_snapshot("read GPU samples after their positions")
            .await?;
        let behind = super::packing::packed_after::<DB>(&mut tx, wanted).await?;
        let requests: Vec<Vec<i64>> = (wanted.iter().enumerate())
            .map(|(i, (gpu, after))| {
                let req = i64::try_from(i).unwrap_or(i64::MAX);
                vec![
                    req,
                    gpu.0,
                    after.saturating_add(1),
                    UnixMs::MAX,
                    limit_i64(if behind.contains(&i) { 0 } else { per_gpu }),
                ]
            })
            .collect();
        let table = Table::ints(&["req", "id", "from_ms", "to_ms", "lim"], &requests);
        let d = DB::DIALECT;
        // `rn`: a sample's place in its GPU's answer; ranked by (rn, req), the first
        // `total` hold every GPU's oldest before any GPU's next. The ranking carries the
        // keys only; the samples are joined to the kept ones.
        let query = sql::<DB>(
            "read GPU samples after their positions",
            format!(
                "{} SELECT t.req, {GPU_COLS} FROM ( \
                   SELECT p.req, p.gpu_id, p.ts_ms, \
                     row_number() OVER (ORDER BY p.rn, p.req) AS taken FROM ( \
                     SELECT r.req, r.lim, k.gpu_id, k.ts_ms, \
                       row_number() OVER (PARTITION BY r.req ORDER BY k.ts_ms) AS rn \
                     FROM r {} \
                   ) p WHERE p.rn <= p.lim \
                 ) t JOIN gpu_samples s ON s.gpu_id = t.gpu_id AND s.ts_ms = t.ts_ms \
                 JOIN gpus g ON g.id = s.gpu_id \
                 WHERE t.taken <= ${} ORDER BY t.taken",
                d.request_rows(&table),
                d.rows_per_request("gpu_samples", "k", "gpu_id", "x.ts_ms", "r.lim"),
                d.param_after(&table),
            ),
        )
        .bind_table(table)
        .bind(limit_i64(total));
        for row in &query.all(&mut *tx).await? {
            let req = rows::request(row, n, "remote-write read")?;
            out[req].push((row.get("ts_ms")?, rows::gpu_sample(row)?));
        }
        for &i in &behind {
            let range = TimeRange {
                from_ms: wanted[i].1.saturating_add(1),
                to_ms: UnixMs::MAX,
            };
            out[i] = super::packing::gpu_rows::<DB>(&mut tx, wanted[i].0, range, per_gpu).await?;
        }
        super::end_read(tx, "read GPU samples after their positions").await?;
        if !behind.is_empty() {
            // Every GPU's oldest before any GPU's next, `total` in all.
            let mut left = total;
            let mut keep = vec![0; n];
            for rank in 0..per_gpu {
                for (k, o) in keep.iter_mut().zip(&out) {
                    if left > 0 && rank < o.len() {
                        *k += 1;
                        left -= 1;
                    }
                }
            }
            for (o, k) in out.iter_mut().zip(keep) {
                o.truncate(k);
            }
        }
        Ok(out)
    }

    async fn workload_energy_minutes(
        &self,
        after_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<Vec<WorkloadNodeEnergy>, StoreError> {
        let query = sql::<DB>(
            "read closed workload energy minutes",
            format!(
                "SELECT m.minute_ms, {WORKLOAD_COLS}, n.name AS node_name, \
                 CAST(sum(m.active_mj) AS BIGINT) AS active_mj, \
                 CAST(sum(m.idle_mj) AS BIGINT) AS idle_mj {ENERGY_FROM} \
                 WHERE m.minute_ms > $1 AND m.minute_ms <= $2 AND NOT m.provisional \
                 GROUP BY m.minute_ms, w.id, n.id ORDER BY m.minute_ms, w.key, n.name"
            ),
        )
        .bind(after_ms)
        .bind(to_ms);
        self.fetch(query, |row| energy_row(row, None)).await
    }

    async fn workload_energy_totals(
        &self,
        to_ms: UnixMs,
    ) -> Result<Vec<WorkloadNodeEnergy>, StoreError> {
        let query = sql::<DB>(
            "sum closed workload energy",
            format!(
                "SELECT {WORKLOAD_COLS}, n.name AS node_name, \
                 CAST(sum(m.active_mj) AS BIGINT) AS active_mj, \
                 CAST(sum(m.idle_mj) AS BIGINT) AS idle_mj {ENERGY_FROM} \
                 WHERE m.minute_ms <= $1 AND NOT m.provisional \
                 GROUP BY w.id, n.id ORDER BY w.key, n.name"
            ),
        )
        .bind(to_ms);
        self.fetch(query, |row| energy_row(row, Some(to_ms))).await
    }

    async fn energy_closed_to(&self, from_ms: UnixMs) -> Result<Option<UnixMs>, StoreError> {
        let query = sql::<DB>(
            "read the energy watermark of GPUs with newer samples",
            "SELECT min(COALESCE(p.done_to_ms, $1)) AS done_to_ms FROM gpus g \
             LEFT JOIN energy_progress p ON p.gpu_id = g.id \
             WHERE EXISTS (SELECT 1 FROM gpu_samples s WHERE s.gpu_id = g.id AND s.ts_ms >= $2) \
               OR EXISTS (SELECT 1 FROM packed_gpu_minutes k WHERE k.gpu_id = g.id \
                 AND k.minute_ms > $2 - 3600000 AND k.minute_ms + k.span_ms > $2)",
        )
        .bind(from_ms)
        .bind(from_ms);
        let rows = self
            .fetch(query, |row| row.get::<Option<UnixMs>>("done_to_ms"))
            .await?;
        Ok(rows.into_iter().flatten().min())
    }

    async fn remote_write_energy_totals(&self) -> Result<Vec<WorkloadNodeEnergy>, StoreError> {
        let query = sql::<DB>(
            "read the remote-write energy totals",
            format!(
                "SELECT COALESCE(p.position_ms, 0) AS minute_ms, {WORKLOAD_COLS}, \
                 t.node_name, t.active_mj, t.idle_mj FROM remote_write_energy_totals t \
                 JOIN workloads w ON w.key = t.workload_key \
                 LEFT JOIN remote_write_positions p ON p.stream = $1 AND p.series = '' \
                 ORDER BY w.key, t.node_name"
            ),
        )
        .bind(STREAM_ENERGY);
        self.fetch(query, |row| energy_row(row, None)).await
    }

    async fn save_remote_write_energy(
        &self,
        position_ms: UnixMs,
        totals: &[WorkloadNodeEnergy],
    ) -> Result<(), StoreError> {
        let op = "save the remote-write energy position";
        let mut tx = self.begin_write(op).await?;
        save_position::<DB>(&mut tx, STREAM_ENERGY, "", position_ms).await?;
        let (active, idle) = (
            DB::DIALECT.greatest("t.active_mj", "excluded.active_mj"),
            DB::DIALECT.greatest("t.idle_mj", "excluded.idle_mj"),
        );
        for total in totals {
            sql::<DB>(
                "save a remote-write energy total",
                format!(
                    "INSERT INTO remote_write_energy_totals AS t \
                     (workload_key, node_name, active_mj, idle_mj) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (workload_key, node_name) DO UPDATE SET \
                     active_mj = {active}, idle_mj = {idle}"
                ),
            )
            .bind(total.workload.key())
            .bind(total.node.as_str())
            .bind(rows::to_i64(total.active_mj))
            .bind(rows::to_i64(total.idle_mj))
            .execute(tx.conn())
            .await?;
        }
        tx.commit(op).await
    }
}
