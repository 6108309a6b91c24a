//! SQL of the store follower (issue 8) on PostgreSQL: the new ticks of many nodes in four
//! queries per pass, whatever the number of nodes (one per table: GPU samples, process
//! samples, host samples, events). The requests travel as parallel arrays, `unnest`ed
//! into rows; each GPU's or node's rows are found through its primary key, and a window
//! keeps each node's `limit` like [`Store::node_ticks`](crate::store::Store::node_ticks).

use super::{
    GPU_COLS, PROCESS_COLS, event_kind, from_i64, get, gpu_sample_from_row, host_from_row,
    limit_i64, process_from_row, q,
};
use crate::store::{HostRow, NodeRecord, StoreError, TimeRange, assemble_ticks};
use gpufleet_core::{Event, GpuSample, ProcessSample, Tick, UnixMs};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgPool, PgRow};

/// Per request, rows of one kind, oldest first.
type PerNode<T> = Vec<Vec<T>>;

/// What [`Store::nodes_ticks`](crate::store::Store::nodes_ticks) answers.
pub(super) async fn nodes_ticks(
    pool: &PgPool,
    wanted: &[(&NodeRecord, TimeRange)],
    limit: usize,
) -> Result<Vec<Vec<Tick>>, StoreError> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    // The GPU rows first: each node's newest `limit` ticks' worth.
    let gpu_limit = |node: &NodeRecord| limit.saturating_mul(node.gpus.len().max(1));
    let gpus = gpu_rows(pool, wanted, &gpu_limit).await?;
    // Then the other rows of only the ticks whose GPU rows were kept.
    let ranges: Vec<TimeRange> = wanted
        .iter()
        .zip(&gpus)
        .map(|((_, range), rows)| TimeRange {
            from_ms: rows
                .first()
                .map_or(range.from_ms, |g| g.0.max(range.from_ms)),
            ..*range
        })
        .collect();
    let processes = process_rows(pool, wanted, &ranges, &gpu_limit).await?;
    let hosts = host_rows(pool, wanted, &ranges, limit).await?;
    let events = event_rows(pool, wanted, &ranges, limit).await?;
    Ok(gpus
        .into_iter()
        .zip(processes)
        .zip(hosts)
        .zip(events)
        .map(|(((g, p), h), e)| assemble_ticks(g, p, h, e, limit))
        .collect())
}

/// The request index of a row, as an index into the per-request vectors.
fn request(row: &PgRow, n: usize) -> Result<usize, StoreError> {
    let i: i64 = get(row, "req")?;
    usize::try_from(i)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| StoreError::Corrupt(format!("follower read: request {i} out of range")))
}

/// One row per (request, GPU): `(req, gpu_id, from_ms, to_ms, lim)` as parallel arrays.
struct GpuRequests {
    req: Vec<i64>,
    gpu: Vec<i64>,
    from: Vec<i64>,
    to: Vec<i64>,
    lim: Vec<i64>,
}

impl GpuRequests {
    fn new(
        wanted: &[(&NodeRecord, TimeRange)],
        ranges: &[TimeRange],
        lim: &(dyn Fn(&NodeRecord) -> usize + Sync),
    ) -> GpuRequests {
        let mut r = GpuRequests {
            req: Vec::new(),
            gpu: Vec::new(),
            from: Vec::new(),
            to: Vec::new(),
            lim: Vec::new(),
        };
        for (i, ((node, _), range)) in wanted.iter().zip(ranges).enumerate() {
            for g in &node.gpus {
                r.req.push(i as i64);
                r.gpu.push(g.id.0);
                r.from.push(range.from_ms);
                r.to.push(range.to_ms);
                r.lim.push(limit_i64(lim(node)));
            }
        }
        r
    }
}

async fn gpu_rows(
    pool: &PgPool,
    wanted: &[(&NodeRecord, TimeRange)],
    lim: &(dyn Fn(&NodeRecord) -> usize + Sync),
) -> Result<PerNode<(UnixMs, GpuSample)>, StoreError> {
    let ranges: Vec<TimeRange> = wanted.iter().map(|(_, r)| *r).collect();
    let r = GpuRequests::new(wanted, &ranges, lim);
    // Per GPU its newest `lim` rows (LIMIT keeps the lateral a per-GPU index scan), then
    // per node the newest `lim` of those.
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM ( \
           SELECT r.req, {GPU_COLS}, g.gpu_index AS k_index, r.lim, \
             row_number() OVER (PARTITION BY r.req \
               ORDER BY s.ts_ms DESC, g.gpu_index DESC, g.uuid DESC) AS rn \
           FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[]) \
             AS r(req, gpu_id, from_ms, to_ms, lim) \
           CROSS JOIN LATERAL ( \
             SELECT * FROM gpu_samples x \
             WHERE x.gpu_id = r.gpu_id AND x.ts_ms BETWEEN r.from_ms AND r.to_ms \
             ORDER BY x.ts_ms DESC LIMIT r.lim) s \
           JOIN gpus g ON g.id = s.gpu_id \
         ) t WHERE t.rn <= t.lim \
         ORDER BY t.req, t.ts_ms, t.k_index, t.gpu_uuid"
    )))
    .bind(&r.req)
    .bind(&r.gpu)
    .bind(&r.from)
    .bind(&r.to)
    .bind(&r.lim)
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new GPU samples"))?;
    let mut out: PerNode<(UnixMs, GpuSample)> = vec![Vec::new(); wanted.len()];
    for row in &rows {
        out[request(row, wanted.len())?].push((get(row, "ts_ms")?, gpu_sample_from_row(row)?));
    }
    Ok(out)
}

async fn process_rows(
    pool: &PgPool,
    wanted: &[(&NodeRecord, TimeRange)],
    ranges: &[TimeRange],
    gpu_lim: &(dyn Fn(&NodeRecord) -> usize + Sync),
) -> Result<PerNode<(UnixMs, ProcessSample)>, StoreError> {
    // Processes per GPU per tick are few; the range is what bounds the read.
    let lim = |node: &NodeRecord| gpu_lim(node).saturating_mul(256);
    let r = GpuRequests::new(wanted, ranges, &lim);
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT * FROM ( \
           SELECT r.req, {PROCESS_COLS}, g.gpu_index AS k_index, r.lim, \
             row_number() OVER (PARTITION BY r.req \
               ORDER BY p.ts_ms, g.gpu_index, g.uuid, p.pid) AS rn \
           FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[]) \
             AS r(req, gpu_id, from_ms, to_ms, lim) \
           CROSS JOIN LATERAL ( \
             SELECT * FROM process_samples x \
             WHERE x.gpu_id = r.gpu_id AND x.ts_ms BETWEEN r.from_ms AND r.to_ms \
             ORDER BY x.ts_ms, x.pid LIMIT r.lim) p \
           JOIN gpus g ON g.id = p.gpu_id \
           JOIN workloads w ON w.id = p.workload_id \
         ) t WHERE t.rn <= t.lim \
         ORDER BY t.req, t.rn"
    )))
    .bind(&r.req)
    .bind(&r.gpu)
    .bind(&r.from)
    .bind(&r.to)
    .bind(&r.lim)
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new process samples"))?;
    let mut out: PerNode<(UnixMs, ProcessSample)> = vec![Vec::new(); wanted.len()];
    for row in &rows {
        out[request(row, wanted.len())?].push((get(row, "ts_ms")?, process_from_row(row)?));
    }
    Ok(out)
}

/// One row per request: `(req, node_id, from_ms, to_ms)` as parallel arrays.
fn node_requests(
    wanted: &[(&NodeRecord, TimeRange)],
    ranges: &[TimeRange],
) -> (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>) {
    let req = (0..wanted.len() as i64).collect();
    let node = wanted.iter().map(|(n, _)| n.id.0).collect();
    let from = ranges.iter().map(|r| r.from_ms).collect();
    let to = ranges.iter().map(|r| r.to_ms).collect();
    (req, node, from, to)
}

async fn host_rows(
    pool: &PgPool,
    wanted: &[(&NodeRecord, TimeRange)],
    ranges: &[TimeRange],
    limit: usize,
) -> Result<PerNode<HostRow>, StoreError> {
    let (req, node, from, to) = node_requests(wanted, ranges);
    let rows = sqlx::query(
        "SELECT r.req, h.* \
         FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[]) \
           AS r(req, node_id, from_ms, to_ms) \
         CROSS JOIN LATERAL ( \
           SELECT * FROM host_samples x \
           WHERE x.node_id = r.node_id AND x.ts_ms BETWEEN r.from_ms AND r.to_ms \
           ORDER BY x.ts_ms LIMIT $5) h \
         ORDER BY r.req, h.ts_ms",
    )
    .bind(&req)
    .bind(&node)
    .bind(&from)
    .bind(&to)
    .bind(limit_i64(limit))
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new host samples"))?;
    let mut out: PerNode<HostRow> = vec![Vec::new(); wanted.len()];
    for row in &rows {
        out[request(row, wanted.len())?].push(host_from_row(row)?);
    }
    Ok(out)
}

async fn event_rows(
    pool: &PgPool,
    wanted: &[(&NodeRecord, TimeRange)],
    ranges: &[TimeRange],
    limit: usize,
) -> Result<PerNode<Event>, StoreError> {
    let (req, node, from, to) = node_requests(wanted, ranges);
    let rows = sqlx::query(
        "SELECT r.req, e.ts_ms, e.kind, e.code, e.detail, g.uuid AS gpu_uuid \
         FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[]) \
           AS r(req, node_id, from_ms, to_ms) \
         CROSS JOIN LATERAL ( \
           SELECT * FROM events x \
           WHERE x.node_id = r.node_id AND x.ts_ms BETWEEN r.from_ms AND r.to_ms \
           ORDER BY x.ts_ms, x.id LIMIT $5) e \
         LEFT JOIN gpus g ON g.id = e.gpu_id \
         ORDER BY r.req, e.ts_ms, e.id",
    )
    .bind(&req)
    .bind(&node)
    .bind(&from)
    .bind(&to)
    .bind(limit_i64(limit))
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new events"))?;
    let mut out: PerNode<Event> = vec![Vec::new(); wanted.len()];
    for row in &rows {
        let kind: String = get(row, "kind")?;
        out[request(row, wanted.len())?].push(Event {
            time_ms: get(row, "ts_ms")?,
            gpu_uuid: get::<Option<String>>(row, "gpu_uuid")?.unwrap_or_default(),
            kind: event_kind(&kind)?,
            code: get::<Option<i64>>(row, "code")?.map(from_i64),
            detail: get(row, "detail")?,
        });
    }
    Ok(out)
}
