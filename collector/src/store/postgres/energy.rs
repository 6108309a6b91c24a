//! SQL of energy accounting (issue 6) on PostgreSQL: the queries of `sqlite/energy.rs`
//! with PostgreSQL's placeholders and types (sums of bigints come back as numeric and are
//! cast to bigint). Schema: `migrations/postgres/0006_energy.sql`.

use super::{
    from_i64, get, get_small, get_u32_big, get_u32_bits, limit_i64, q, required, workload_from_row,
};
use crate::accounting::energy::{EnergyProcess, EnergySample, GpuMinute};
use crate::store::energy::{
    EnergyGpu, EnergyInputs, EnergyRange, GpuBaseline, GpuEnergy, MinuteColumns, MinuteReplacement,
    WorkloadEnergy, WorkloadEnergyPoint, minutes_from_rows,
};
use crate::store::{GpuId, NodeId, StoreError, TimeRange};
use gpufleet_core::UnixMs;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnection, PgPool, PgRow};

/// Workload columns, for a query joining `workloads w` (read by `workload_from_row`).
const WORKLOAD_COLS: &str = "w.kind AS w_kind, w.runtime AS w_runtime, \
    w.container_id AS w_container_id, w.pod_uid AS w_pod_uid, w.qos AS w_qos, \
    w.job_id AS w_job_id, w.step AS w_step, w.unit AS w_unit, w.uid AS w_uid, \
    w.container_name AS w_container_name, w.image AS w_image, w.pod_name AS w_pod_name, \
    w.namespace AS w_namespace";

/// A non-negative integer column as u64 (sums and energies are never negative).
fn get_nonneg(row: &PgRow, column: &str) -> Result<u64, StoreError> {
    row.nonneg(column)
}

impl MinuteColumns for PgRow {
    fn int(&self, column: &str) -> Result<i64, StoreError> {
        get(self, column)
    }
    fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        get(self, column)
    }
    fn text(&self, column: &str) -> Result<String, StoreError> {
        get(self, column)
    }
    fn flag(&self, column: &str) -> Result<bool, StoreError> {
        get(self, column)
    }
}

fn u64_to_i64(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} {v} does not fit")))
}

fn sample_from_row(row: &PgRow) -> Result<EnergySample, StoreError> {
    Ok(EnergySample {
        time_ms: get(row, "ts_ms")?,
        power_mw: get_u32_bits(row, "power_mw")?,
        energy_mj: get::<Option<i64>>(row, "energy_mj")?.map(from_i64),
        util_gpu_pct: get_small(row, "util_gpu_pct")?,
        processes: Vec::new(),
    })
}

pub(super) async fn energy_gpus(pool: &PgPool) -> Result<Vec<EnergyGpu>, StoreError> {
    let rows = sqlx::query(
        "SELECT g.id, g.uuid, g.gpu_index, g.name, n.id AS node_id, n.name AS node_name, \
         n.interval_ms, coalesce(g.power_limit_default_mw, g.power_limit_enforced_mw) AS limit_mw, \
         (SELECT min(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = g.id) AS first_ms, \
         (SELECT max(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = g.id) AS last_ms, \
         p.done_to_ms \
         FROM gpus g JOIN nodes n ON n.id = g.node_id \
         LEFT JOIN energy_progress p ON p.gpu_id = g.id ORDER BY g.id",
    )
    .fetch_all(pool)
    .await
    .map_err(q("list GPUs for energy accounting"))?;
    rows.iter()
        .map(|row| {
            Ok(EnergyGpu {
                gpu: GpuId(get(row, "id")?),
                uuid: get(row, "uuid")?,
                index: required(get_u32_big(row, "gpu_index")?, "gpu_index")?,
                name: get(row, "name")?,
                node: NodeId(get(row, "node_id")?),
                node_name: get(row, "node_name")?,
                interval_ms: required(get_u32_big(row, "interval_ms")?, "interval_ms")?,
                power_limit_mw: get_u32_big(row, "limit_mw")?,
                first_sample_ms: get(row, "first_ms")?,
                last_sample_ms: get(row, "last_ms")?,
                done_to_ms: get(row, "done_to_ms")?,
            })
        })
        .collect()
}

pub(super) async fn energy_inputs(
    pool: &PgPool,
    gpu: GpuId,
    from_ms: UnixMs,
    to_ms: UnixMs,
) -> Result<EnergyInputs, StoreError> {
    let mut conn = pool.acquire().await.map_err(q("acquire a connection"))?;
    let prev = sqlx::query(
        "SELECT ts_ms, power_mw, energy_mj, util_gpu_pct FROM gpu_samples \
         WHERE gpu_id = $1 AND ts_ms < $2 ORDER BY ts_ms DESC LIMIT 1",
    )
    .bind(gpu.0)
    .bind(from_ms)
    .fetch_optional(&mut *conn)
    .await
    .map_err(q("read the sample before an energy range"))?
    .map(|row| sample_from_row(&row))
    .transpose()?;
    let rows = sqlx::query(
        "SELECT ts_ms, power_mw, energy_mj, util_gpu_pct FROM gpu_samples \
         WHERE gpu_id = $1 AND ts_ms >= $2 AND ts_ms < $3 ORDER BY ts_ms",
    )
    .bind(gpu.0)
    .bind(from_ms)
    .bind(to_ms)
    .fetch_all(&mut *conn)
    .await
    .map_err(q("read GPU samples for energy"))?;
    let mut samples = rows
        .iter()
        .map(sample_from_row)
        .collect::<Result<Vec<_>, _>>()?;
    let procs = sqlx::query(
        "SELECT ts_ms, workload_id, sm_util_pct, gpu_mem_bytes, process_type FROM process_samples \
         WHERE gpu_id = $1 AND ts_ms >= $2 AND ts_ms < $3 ORDER BY ts_ms, pid",
    )
    .bind(gpu.0)
    .bind(from_ms)
    .bind(to_ms)
    .fetch_all(&mut *conn)
    .await
    .map_err(q("read process samples for energy"))?;
    attach_processes(&mut samples, &procs)?;
    Ok(EnergyInputs { prev, samples })
}

/// Hangs process rows (ordered by time) on the GPU samples (ordered by time) they were
/// listed with.
fn attach_processes<'r>(
    samples: &mut [EnergySample],
    procs: impl IntoIterator<Item = &'r PgRow>,
) -> Result<(), StoreError> {
    // Both lists are ordered by time: merge.
    let mut i = 0;
    for row in procs {
        let t: i64 = get(row, "ts_ms")?;
        while i < samples.len() && samples[i].time_ms < t {
            i += 1;
        }
        // A process row without its GPU row cannot be attributed (no interval ends there).
        if i < samples.len() && samples[i].time_ms == t {
            samples[i].processes.push(EnergyProcess {
                workload: get(row, "workload_id")?,
                sm_util_pct: get_small(row, "sm_util_pct")?,
                gpu_mem_bytes: get::<Option<i64>>(row, "gpu_mem_bytes")?.map(from_i64),
                // 1 compute, 2 graphics, 3 both (the proto ProcessType numbers).
                compute: get::<i16>(row, "process_type")? & 1 == 1,
            });
        }
    }
    Ok(())
}

/// The ranges as rows `r(req, id, from_ms, to_ms)`, from three parallel arrays bound as
/// `$1..$3` (`req`: the range's index).
const RANGES: &str = "WITH r AS ( \
    SELECT (o - 1) AS req, id, from_ms, to_ms \
    FROM UNNEST($1::int8[], $2::int8[], $3::int8[]) WITH ORDINALITY AS u(id, from_ms, to_ms, o))";

/// The ranges as the three arrays [`RANGES`] reads.
fn range_arrays(ranges: &[EnergyRange]) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
    (
        ranges.iter().map(|r| r.gpu.0).collect(),
        ranges.iter().map(|r| r.from_ms).collect(),
        ranges.iter().map(|r| r.to_ms).collect(),
    )
}

/// The range index of a row.
fn req(row: &PgRow, n: usize) -> Result<usize, StoreError> {
    let i: i64 = get(row, "req")?;
    usize::try_from(i)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| StoreError::Corrupt(format!("energy read: range {i} out of range")))
}

pub(super) async fn energy_inputs_many(
    pool: &PgPool,
    ranges: &[EnergyRange],
) -> Result<Vec<EnergyInputs>, StoreError> {
    let n = ranges.len();
    let mut out = vec![EnergyInputs::default(); n];
    if n == 0 {
        return Ok(out);
    }
    let (ids, froms, tos) = range_arrays(ranges);
    let mut conn = pool.acquire().await.map_err(q("acquire a connection"))?;
    let prev = sqlx::query(AssertSqlSafe(format!(
        "{RANGES} SELECT r.req, s.ts_ms, s.power_mw, s.energy_mj, s.util_gpu_pct \
         FROM r CROSS JOIN LATERAL (SELECT x.ts_ms, x.power_mw, x.energy_mj, x.util_gpu_pct \
           FROM gpu_samples x WHERE x.gpu_id = r.id AND x.ts_ms < r.from_ms \
           ORDER BY x.ts_ms DESC LIMIT 1) s"
    )))
    .bind(&ids)
    .bind(&froms)
    .bind(&tos)
    .fetch_all(&mut *conn)
    .await
    .map_err(q("read the samples before energy ranges"))?;
    for row in &prev {
        out[req(row, n)?].prev = Some(sample_from_row(row)?);
    }
    let rows = sqlx::query(AssertSqlSafe(format!(
        "{RANGES} SELECT r.req, s.ts_ms, s.power_mw, s.energy_mj, s.util_gpu_pct \
         FROM r JOIN gpu_samples s ON s.gpu_id = r.id \
           AND s.ts_ms >= r.from_ms AND s.ts_ms < r.to_ms ORDER BY r.req, s.ts_ms"
    )))
    .bind(&ids)
    .bind(&froms)
    .bind(&tos)
    .fetch_all(&mut *conn)
    .await
    .map_err(q("read GPU samples for energy"))?;
    for row in &rows {
        out[req(row, n)?].samples.push(sample_from_row(row)?);
    }
    let procs = sqlx::query(AssertSqlSafe(format!(
        "{RANGES} SELECT r.req, p.ts_ms, p.workload_id, p.sm_util_pct, p.gpu_mem_bytes, \
         p.process_type FROM r JOIN process_samples p ON p.gpu_id = r.id \
           AND p.ts_ms >= r.from_ms AND p.ts_ms < r.to_ms ORDER BY r.req, p.ts_ms, p.pid"
    )))
    .bind(&ids)
    .bind(&froms)
    .bind(&tos)
    .fetch_all(&mut *conn)
    .await
    .map_err(q("read process samples for energy"))?;
    // Rows come grouped by range: hang each group on its range's samples.
    let mut start = 0;
    while start < procs.len() {
        let i = req(&procs[start], n)?;
        let mut end = start + 1;
        while end < procs.len() && req(&procs[end], n)? == i {
            end += 1;
        }
        attach_processes(&mut out[i].samples, &procs[start..end])?;
        start = end;
    }
    Ok(out)
}

pub(super) async fn energy_learned_before_many(
    pool: &PgPool,
    ranges: &[EnergyRange],
) -> Result<Vec<(u64, i64)>, StoreError> {
    let n = ranges.len();
    let mut out = vec![(0, 0); n];
    if n == 0 {
        return Ok(out);
    }
    let (ids, froms, tos) = range_arrays(ranges);
    let rows = sqlx::query(AssertSqlSafe(format!(
        "{RANGES} SELECT r.req, m.learned_idle_mj, m.learned_idle_ms \
         FROM r CROSS JOIN LATERAL (SELECT x.learned_idle_mj, x.learned_idle_ms \
           FROM energy_gpu_minutes x WHERE x.gpu_id = r.id AND x.minute_ms < r.from_ms \
           ORDER BY x.minute_ms DESC LIMIT 1) m"
    )))
    .bind(&ids)
    .bind(&froms)
    .bind(&tos)
    .fetch_all(pool)
    .await
    .map_err(q("read GPUs' idle-baseline evidence"))?;
    for row in &rows {
        out[req(row, n)?] = (
            get_nonneg(row, "learned_idle_mj")?,
            get(row, "learned_idle_ms")?,
        );
    }
    Ok(out)
}

pub(super) async fn next_sample_ms(
    pool: &PgPool,
    gpu: GpuId,
    at_ms: UnixMs,
) -> Result<Option<UnixMs>, StoreError> {
    sqlx::query_scalar(
        "SELECT ts_ms FROM gpu_samples WHERE gpu_id = $1 AND ts_ms >= $2 ORDER BY ts_ms LIMIT 1",
    )
    .bind(gpu.0)
    .bind(at_ms)
    .fetch_optional(pool)
    .await
    .map_err(q("find the next GPU sample"))
}

pub(super) async fn energy_learned_before(
    pool: &PgPool,
    gpu: GpuId,
    before_ms: UnixMs,
) -> Result<(u64, i64), StoreError> {
    let row = sqlx::query(
        "SELECT learned_idle_mj, learned_idle_ms FROM energy_gpu_minutes \
         WHERE gpu_id = $1 AND minute_ms < $2 ORDER BY minute_ms DESC LIMIT 1",
    )
    .bind(gpu.0)
    .bind(before_ms)
    .fetch_optional(pool)
    .await
    .map_err(q("read a GPU's idle-baseline evidence"))?;
    match row {
        Some(row) => Ok((
            get_nonneg(&row, "learned_idle_mj")?,
            get(&row, "learned_idle_ms")?,
        )),
        None => Ok((0, 0)),
    }
}

pub(super) async fn energy_baselines(pool: &PgPool) -> Result<Vec<GpuBaseline>, StoreError> {
    let rows = sqlx::query(
        "SELECT g.id, g.uuid, g.gpu_index, g.name, n.name AS node_name, m.idle_mw, \
         m.idle_source, m.minute_ms, m.learned_idle_mj AS seen_mj, \
         m.learned_idle_ms AS seen_ms \
         FROM gpus g JOIN nodes n ON n.id = g.node_id \
         JOIN energy_gpu_minutes m ON m.gpu_id = g.id AND m.minute_ms = \
           (SELECT max(x.minute_ms) FROM energy_gpu_minutes x WHERE x.gpu_id = g.id) \
         ORDER BY n.name, g.gpu_index",
    )
    .fetch_all(pool)
    .await
    .map_err(q("read the idle baselines"))?;
    rows.iter()
        .map(|row| {
            let source: String = get(row, "idle_source")?;
            let idle_mw: i64 = get(row, "idle_mw")?;
            Ok(GpuBaseline {
                gpu: GpuId(get(row, "id")?),
                uuid: get(row, "uuid")?,
                index: required(get_u32_big(row, "gpu_index")?, "gpu_index")?,
                name: get(row, "name")?,
                node_name: get(row, "node_name")?,
                idle_mw: u32::try_from(idle_mw)
                    .map_err(|_| StoreError::Corrupt(format!("idle_mw {idle_mw}")))?,
                idle_source: crate::accounting::energy::IdleSource::parse(&source)
                    .ok_or_else(|| StoreError::Corrupt(format!("idle_source {source:?}")))?,
                minute_ms: get(row, "minute_ms")?,
                seen_idle_mj: get_nonneg(row, "seen_mj")?,
                seen_idle_ms: get(row, "seen_ms")?,
            })
        })
        .collect()
}

pub(super) async fn replace_energy_minutes(
    pool: &PgPool,
    gpu: GpuId,
    from_ms: UnixMs,
    to_ms: UnixMs,
    minutes: &[GpuMinute],
    done_to_ms: Option<UnixMs>,
) -> Result<(), StoreError> {
    let mut tx = pool
        .begin()
        .await
        .map_err(q("begin an energy transaction"))?;
    replace_in(&mut tx, gpu, from_ms, to_ms, minutes, done_to_ms).await?;
    tx.commit().await.map_err(q("commit energy minutes"))
}

pub(super) async fn replace_energy_minutes_many(
    pool: &PgPool,
    batch: &[MinuteReplacement],
) -> Result<(), StoreError> {
    if batch.is_empty() {
        return Ok(());
    }
    let mut tx = pool
        .begin()
        .await
        .map_err(q("begin an energy transaction"))?;
    for b in batch {
        let r = b.range;
        replace_in(&mut tx, r.gpu, r.from_ms, r.to_ms, &b.minutes, b.done_to_ms).await?;
    }
    tx.commit().await.map_err(q("commit energy minutes"))
}

/// The body of [`replace_energy_minutes`], inside the caller's transaction.
async fn replace_in(
    tx: &mut PgConnection,
    gpu: GpuId,
    from_ms: UnixMs,
    to_ms: UnixMs,
    minutes: &[GpuMinute],
    done_to_ms: Option<UnixMs>,
) -> Result<(), StoreError> {
    // Minutes before the raw horizon (retention, issue 8) keep their rows: their raw
    // samples are gone, so a recomputation could only lose energy. (Inputs that could miss
    // deleted rows were read after the horizon was raised, so this read sees it.)
    let horizon: Option<i64> =
        sqlx::query_scalar("SELECT raw_from_ms FROM raw_horizon WHERE kind = 'gpu' AND id = $1")
            .bind(gpu.0)
            .fetch_optional(&mut *tx)
            .await
            .map_err(q("read a raw horizon"))?;
    let from_ms = from_ms.max(horizon.unwrap_or(i64::MIN));
    for table in ["energy_gpu_minutes", "energy_workload_minutes"] {
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {table} WHERE gpu_id = $1 AND minute_ms >= $2 AND minute_ms < $3"
        )))
        .bind(gpu.0)
        .bind(from_ms)
        .bind(to_ms)
        .execute(&mut *tx)
        .await
        .map_err(q("delete energy minutes being recomputed"))?;
    }
    for m in minutes.iter().filter(|m| m.minute_ms >= from_ms) {
        sqlx::query(
            "INSERT INTO energy_gpu_minutes (gpu_id, minute_ms, energy_mj, counter_mj, \
             trapezoid_mj, attributed_mj, idle_mj, unattributed_mj, covered_ms, missing_ms, \
             samples, min_power_mw, idle_mw, idle_source, idle_policy, max_gap_ms, active_mj, \
             seen_idle_ms, seen_idle_mj, provisional, rules, learned_idle_ms, \
             learned_idle_mj) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19, $20, $21, $22, $23)",
        )
        .bind(gpu.0)
        .bind(m.minute_ms)
        .bind(u64_to_i64(m.energy_mj, "energy_mj")?)
        .bind(u64_to_i64(m.counter_mj, "counter_mj")?)
        .bind(u64_to_i64(m.trapezoid_mj, "trapezoid_mj")?)
        .bind(u64_to_i64(m.attributed_mj, "attributed_mj")?)
        .bind(u64_to_i64(m.idle_mj, "idle_mj")?)
        .bind(u64_to_i64(m.unattributed_mj, "unattributed_mj")?)
        .bind(m.covered_ms)
        .bind(m.missing_ms)
        .bind(i64::from(m.samples))
        .bind(m.min_power_mw.map(i64::from))
        .bind(i64::from(m.idle_mw))
        .bind(m.idle_source.as_str())
        .bind(m.idle_policy.as_str())
        .bind(m.max_gap_ms)
        .bind(u64_to_i64(m.active_mj, "active_mj")?)
        .bind(m.seen_idle_ms)
        .bind(u64_to_i64(m.seen_idle_mj, "seen_idle_mj")?)
        .bind(m.provisional)
        .bind(i64::from(m.rules))
        .bind(m.learned_idle_ms)
        .bind(u64_to_i64(m.learned_idle_mj, "learned_idle_mj")?)
        .execute(&mut *tx)
        .await
        .map_err(q("insert an energy minute of a GPU"))?;
        for w in &m.workloads {
            sqlx::query(
                "INSERT INTO energy_workload_minutes (gpu_id, minute_ms, workload_id, energy_mj, \
                 idle_mj, counter_mj, trapezoid_mj, gpu_ms, share_ppm_ms, sm_ms, memory_ms, \
                 equal_ms, active_mj, idle_memory_ms, idle_equal_ms, provisional) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
                 $13, $14, $15, $16)",
            )
            .bind(gpu.0)
            .bind(m.minute_ms)
            .bind(w.workload)
            .bind(u64_to_i64(w.energy_mj, "energy_mj")?)
            .bind(u64_to_i64(w.idle_mj, "idle_mj")?)
            .bind(u64_to_i64(w.counter_mj, "counter_mj")?)
            .bind(u64_to_i64(w.trapezoid_mj, "trapezoid_mj")?)
            .bind(w.gpu_ms)
            .bind(u64_to_i64(w.share_ppm_ms, "share_ppm_ms")?)
            .bind(w.sm_ms)
            .bind(w.memory_ms)
            .bind(w.equal_ms)
            .bind(u64_to_i64(w.active_mj, "active_mj")?)
            .bind(w.idle_memory_ms)
            .bind(w.idle_equal_ms)
            .bind(m.provisional)
            .execute(&mut *tx)
            .await
            .map_err(q("insert an energy minute of a workload"))?;
        }
    }
    if let Some(done) = done_to_ms {
        sqlx::query(
            "INSERT INTO energy_progress (gpu_id, done_to_ms) VALUES ($1, $2) \
             ON CONFLICT (gpu_id) DO UPDATE SET done_to_ms = greatest(energy_progress.done_to_ms, excluded.done_to_ms)",
        )
        .bind(gpu.0)
        .bind(done)
        .execute(&mut *tx)
        .await
        .map_err(q("advance the energy watermark"))?;
    }
    Ok(())
}

pub(super) async fn energy_minutes(
    pool: &PgPool,
    gpu: Option<GpuId>,
    range: TimeRange,
) -> Result<Vec<(GpuId, GpuMinute)>, StoreError> {
    let filter = "AND ($3::int8 IS NULL OR gpu_id = $3)";
    let mut conn = pool.acquire().await.map_err(q("acquire a connection"))?;
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM energy_gpu_minutes WHERE minute_ms BETWEEN $1 AND $2 {filter} \
         ORDER BY gpu_id, minute_ms"
    )))
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(gpu.map(|g| g.0))
    .fetch_all(&mut *conn)
    .await
    .map_err(q("read energy minutes"))?;
    let wrows = sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM energy_workload_minutes WHERE minute_ms BETWEEN $1 AND $2 {filter} \
         ORDER BY gpu_id, minute_ms, workload_id"
    )))
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(gpu.map(|g| g.0))
    .fetch_all(&mut *conn)
    .await
    .map_err(q("read workload energy minutes"))?;
    minutes_from_rows(&rows, &wrows)
}

pub(super) async fn stale_energy_minutes(
    pool: &PgPool,
    since_ms: UnixMs,
) -> Result<Vec<(GpuId, UnixMs)>, StoreError> {
    let rows = sqlx::query(
        "SELECT r.gpu_id, r.minute_ms FROM ( \
           SELECT s.gpu_id, (s.ts_ms / 60000) * 60000 AS minute_ms, count(*) AS n \
           FROM gpu_samples s JOIN energy_progress p ON p.gpu_id = s.gpu_id \
           LEFT JOIN raw_horizon h ON h.kind = 'gpu' AND h.id = s.gpu_id \
           WHERE s.ts_ms >= $1 AND s.ts_ms < p.done_to_ms \
             AND (h.raw_from_ms IS NULL OR s.ts_ms >= h.raw_from_ms) GROUP BY 1, 2) r \
         LEFT JOIN energy_gpu_minutes m ON m.gpu_id = r.gpu_id AND m.minute_ms = r.minute_ms \
         WHERE m.samples IS NULL OR m.samples != r.n ORDER BY 1, 2",
    )
    .bind(since_ms.max(0))
    .fetch_all(pool)
    .await
    .map_err(q("find energy minutes with late samples"))?;
    rows.iter()
        .map(|row| Ok((GpuId(get(row, "gpu_id")?), get(row, "minute_ms")?)))
        .collect()
}

pub(super) async fn workload_energy(
    pool: &PgPool,
    range: TimeRange,
    node: Option<&str>,
    workload_key: Option<&str>,
) -> Result<Vec<WorkloadEnergy>, StoreError> {
    let node_filter = "AND ($3::text IS NULL OR n.name = $3)";
    let key_filter = "AND ($4::text IS NULL OR w.key = $4)";
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT {WORKLOAD_COLS}, g.uuid, g.gpu_index, g.name AS gpu_name, n.name AS node_name, \
         sum(m.energy_mj)::int8 AS energy_mj, sum(m.idle_mj)::int8 AS idle_mj, \
         sum(m.active_mj)::int8 AS active_mj, sum(CASE WHEN m.provisional THEN m.energy_mj ELSE 0 END)::int8 AS provisional_mj, \
         sum(m.idle_memory_ms)::int8 AS idle_memory_ms, sum(m.idle_equal_ms)::int8 AS idle_equal_ms, \
         sum(m.counter_mj)::int8 AS counter_mj, sum(m.trapezoid_mj)::int8 AS trapezoid_mj, \
         sum(m.gpu_ms)::int8 AS gpu_ms, sum(m.share_ppm_ms)::int8 AS share_ppm_ms, sum(m.sm_ms)::int8 AS sm_ms, \
         sum(m.memory_ms)::int8 AS memory_ms, sum(m.equal_ms)::int8 AS equal_ms, \
         min(m.minute_ms) AS first_ms, max(m.minute_ms) AS last_ms \
         FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
         JOIN gpus g ON g.id = m.gpu_id JOIN nodes n ON n.id = g.node_id \
         WHERE m.minute_ms BETWEEN $1 AND $2 {node_filter} {key_filter} \
         GROUP BY w.id, g.id, n.id ORDER BY w.key, n.name, g.gpu_index"
    )))
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(node)
    .bind(workload_key)
    .fetch_all(pool)
    .await
    .map_err(q("sum energy per workload"))?;
    rows.iter()
        .map(|row| {
            Ok(WorkloadEnergy {
                workload: workload_from_row(row)?,
                gpu_uuid: get(row, "uuid")?,
                gpu_index: required(get_u32_big(row, "gpu_index")?, "gpu_index")?,
                gpu_name: get(row, "gpu_name")?,
                node_name: get(row, "node_name")?,
                energy_mj: get_nonneg(row, "energy_mj")?,
                active_mj: get_nonneg(row, "active_mj")?,
                idle_mj: get_nonneg(row, "idle_mj")?,
                provisional_mj: get_nonneg(row, "provisional_mj")?,
                counter_mj: get_nonneg(row, "counter_mj")?,
                trapezoid_mj: get_nonneg(row, "trapezoid_mj")?,
                gpu_ms: get(row, "gpu_ms")?,
                share_ppm_ms: get_nonneg(row, "share_ppm_ms")?,
                sm_ms: get(row, "sm_ms")?,
                memory_ms: get(row, "memory_ms")?,
                equal_ms: get(row, "equal_ms")?,
                idle_memory_ms: get(row, "idle_memory_ms")?,
                idle_equal_ms: get(row, "idle_equal_ms")?,
                first_minute_ms: get(row, "first_ms")?,
                last_minute_ms: get(row, "last_ms")?,
            })
        })
        .collect()
}

pub(super) async fn workload_energy_series(
    pool: &PgPool,
    workload_key: &str,
    range: TimeRange,
) -> Result<Vec<WorkloadEnergyPoint>, StoreError> {
    let rows = sqlx::query(
        "SELECT m.minute_ms, sum(m.energy_mj)::int8 AS energy_mj, sum(m.idle_mj)::int8 AS idle_mj, \
         sum(m.active_mj)::int8 AS active_mj, sum(CASE WHEN m.provisional THEN m.energy_mj ELSE 0 END)::int8 AS provisional_mj, \
         sum(m.gpu_ms)::int8 AS gpu_ms, sum(m.share_ppm_ms)::int8 AS share_ppm_ms \
         FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
         WHERE w.key = $1 AND m.minute_ms BETWEEN $2 AND $3 \
         GROUP BY m.minute_ms ORDER BY m.minute_ms LIMIT $4",
    )
    .bind(workload_key)
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(limit_i64(1_000_000))
    .fetch_all(pool)
    .await
    .map_err(q("read a workload's energy per minute"))?;
    rows.iter()
        .map(|row| {
            Ok(WorkloadEnergyPoint {
                minute_ms: get(row, "minute_ms")?,
                energy_mj: get_nonneg(row, "energy_mj")?,
                active_mj: get_nonneg(row, "active_mj")?,
                idle_mj: get_nonneg(row, "idle_mj")?,
                provisional_mj: get_nonneg(row, "provisional_mj")?,
                gpu_ms: get(row, "gpu_ms")?,
                share_ppm_ms: get_nonneg(row, "share_ppm_ms")?,
            })
        })
        .collect()
}

pub(super) async fn gpu_energy(
    pool: &PgPool,
    range: TimeRange,
) -> Result<Vec<GpuEnergy>, StoreError> {
    let rows = sqlx::query(
        "SELECT g.id, g.uuid, g.gpu_index, g.name, n.name AS node_name, \
         sum(m.energy_mj)::int8 AS energy_mj, sum(m.counter_mj)::int8 AS counter_mj, \
         sum(m.trapezoid_mj)::int8 AS trapezoid_mj, sum(m.attributed_mj)::int8 AS attributed_mj, \
         sum(m.idle_mj)::int8 AS idle_mj, sum(m.unattributed_mj)::int8 AS unattributed_mj, \
         sum(m.covered_ms)::int8 AS covered_ms, sum(m.missing_ms)::int8 AS missing_ms, \
         sum(m.active_mj)::int8 AS active_mj, sum(CASE WHEN m.provisional THEN m.energy_mj ELSE 0 END)::int8 AS provisional_mj \
         FROM energy_gpu_minutes m JOIN gpus g ON g.id = m.gpu_id \
         JOIN nodes n ON n.id = g.node_id WHERE m.minute_ms BETWEEN $1 AND $2 \
         GROUP BY g.id, n.id ORDER BY n.name, g.gpu_index",
    )
    .bind(range.from_ms)
    .bind(range.to_ms)
    .fetch_all(pool)
    .await
    .map_err(q("sum energy per GPU"))?;
    rows.iter()
        .map(|row| {
            Ok(GpuEnergy {
                gpu: GpuId(get(row, "id")?),
                uuid: get(row, "uuid")?,
                index: required(get_u32_big(row, "gpu_index")?, "gpu_index")?,
                name: get(row, "name")?,
                node_name: get(row, "node_name")?,
                energy_mj: get_nonneg(row, "energy_mj")?,
                counter_mj: get_nonneg(row, "counter_mj")?,
                trapezoid_mj: get_nonneg(row, "trapezoid_mj")?,
                attributed_mj: get_nonneg(row, "attributed_mj")?,
                idle_mj: get_nonneg(row, "idle_mj")?,
                unattributed_mj: get_nonneg(row, "unattributed_mj")?,
                active_mj: get_nonneg(row, "active_mj")?,
                provisional_mj: get_nonneg(row, "provisional_mj")?,
                covered_ms: get(row, "covered_ms")?,
                missing_ms: get(row, "missing_ms")?,
            })
        })
        .collect()
}
