//! SQL of the store follower (issue 8) on SQLite: the new ticks of many nodes in four
//! queries, whatever the number of nodes (one per table: GPU samples, process samples,
//! host samples, events). The requests travel as one JSON array of rows read with
//! `json_each`; each GPU's or node's rows are found through its primary key, and a window
//! keeps each node's `limit` like [`Store::node_ticks`](crate::store::Store::node_ticks).

use super::{
    GPU_COLS, PROCESS_COLS, event_kind, from_i64, get, gpu_sample_from_row, host_from_row,
    limit_i64, process_from_row, q,
};
use crate::store::{HostRow, NodeRecord, StoreError, TimeRange, assemble_ticks};
use gpufleet_core::{Event, GpuSample, ProcessSample, Tick, UnixMs};
use sqlx::AssertSqlSafe;
use sqlx::sqlite::{SqlitePool, SqliteRow};

/// Per request, rows of one kind, oldest first.
type PerNode<T> = Vec<Vec<T>>;

/// The requests as rows `r(req, id, from_ms, to_ms, lim)` (`id`: a GPU's or a node's),
/// from the JSON array bound as the first parameter.
const REQUESTS: &str = "WITH r AS MATERIALIZED ( \
    SELECT json_extract(value, '$[0]') AS req, json_extract(value, '$[1]') AS id, \
      json_extract(value, '$[2]') AS from_ms, json_extract(value, '$[3]') AS to_ms, \
      json_extract(value, '$[4]') AS lim \
    FROM json_each(?1))";

/// What [`Store::nodes_ticks`](crate::store::Store::nodes_ticks) answers.
pub(super) async fn nodes_ticks(
    pool: &SqlitePool,
    wanted: &[(&NodeRecord, TimeRange)],
    limit: usize,
) -> Result<Vec<Vec<Tick>>, StoreError> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    // The GPU rows first: each node's newest `limit` ticks' worth.
    let gpu_limit = |node: &NodeRecord| limit.saturating_mul(node.gpus.len().max(1));
    let ranges: Vec<TimeRange> = wanted.iter().map(|(_, r)| *r).collect();
    let gpus = gpu_rows(
        pool,
        &gpu_requests(wanted, &ranges, &gpu_limit),
        wanted.len(),
    )
    .await?;
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
    // Processes per GPU per tick are few; the range is what bounds the read.
    let process_limit = |node: &NodeRecord| gpu_limit(node).saturating_mul(256);
    let processes = process_rows(
        pool,
        &gpu_requests(wanted, &ranges, &process_limit),
        wanted.len(),
    )
    .await?;
    let nodes = node_requests(wanted, &ranges, limit);
    let hosts = host_rows(pool, &nodes, wanted.len()).await?;
    let events = event_rows(pool, &nodes, wanted.len()).await?;
    Ok(gpus
        .into_iter()
        .zip(processes)
        .zip(hosts)
        .zip(events)
        .map(|(((g, p), h), e)| assemble_ticks(g, p, h, e, limit))
        .collect())
}

/// One request row per (request, GPU), as JSON.
fn gpu_requests(
    wanted: &[(&NodeRecord, TimeRange)],
    ranges: &[TimeRange],
    lim: &dyn Fn(&NodeRecord) -> usize,
) -> String {
    let rows: Vec<[i64; 5]> = wanted
        .iter()
        .zip(ranges)
        .enumerate()
        .flat_map(|(i, ((node, _), range))| {
            node.gpus.iter().map(move |g| {
                [
                    i as i64,
                    g.id.0,
                    range.from_ms,
                    range.to_ms,
                    limit_i64(lim(node)),
                ]
            })
        })
        .collect();
    serde_json::Value::from(rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>()).to_string()
}

/// One request row per node, as JSON.
fn node_requests(
    wanted: &[(&NodeRecord, TimeRange)],
    ranges: &[TimeRange],
    limit: usize,
) -> String {
    let rows: Vec<Vec<i64>> = wanted
        .iter()
        .zip(ranges)
        .enumerate()
        .map(|(i, ((node, _), range))| {
            vec![
                i as i64,
                node.id.0,
                range.from_ms,
                range.to_ms,
                limit_i64(limit),
            ]
        })
        .collect();
    serde_json::Value::from(rows).to_string()
}

/// The request index of a row, as an index into the per-request vectors.
fn request(row: &SqliteRow, n: usize) -> Result<usize, StoreError> {
    let i: i64 = get(row, "req")?;
    usize::try_from(i)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| StoreError::Corrupt(format!("follower read: request {i} out of range")))
}

async fn gpu_rows(
    pool: &SqlitePool,
    requests: &str,
    n: usize,
) -> Result<PerNode<(UnixMs, GpuSample)>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "{REQUESTS} SELECT * FROM ( \
           SELECT r.req, {GPU_COLS}, g.gpu_index AS k_index, r.lim, \
             row_number() OVER (PARTITION BY r.req \
               ORDER BY s.ts_ms DESC, g.gpu_index DESC, g.uuid DESC) AS rn \
           FROM r CROSS JOIN gpu_samples s ON s.gpu_id = r.id \
             AND s.ts_ms BETWEEN r.from_ms AND r.to_ms \
           JOIN gpus g ON g.id = s.gpu_id \
         ) t WHERE t.rn <= t.lim \
         ORDER BY t.req, t.ts_ms, t.k_index, t.gpu_uuid"
    )))
    .bind(requests)
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new GPU samples"))?;
    let mut out: PerNode<(UnixMs, GpuSample)> = vec![Vec::new(); n];
    for row in &rows {
        out[request(row, n)?].push((get(row, "ts_ms")?, gpu_sample_from_row(row)?));
    }
    Ok(out)
}

async fn process_rows(
    pool: &SqlitePool,
    requests: &str,
    n: usize,
) -> Result<PerNode<(UnixMs, ProcessSample)>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "{REQUESTS} SELECT * FROM ( \
           SELECT r.req, {PROCESS_COLS}, r.lim, \
             row_number() OVER (PARTITION BY r.req \
               ORDER BY p.ts_ms, g.gpu_index, g.uuid, p.pid) AS rn \
           FROM r CROSS JOIN process_samples p ON p.gpu_id = r.id \
             AND p.ts_ms BETWEEN r.from_ms AND r.to_ms \
           JOIN gpus g ON g.id = p.gpu_id \
           JOIN workloads w ON w.id = p.workload_id \
         ) t WHERE t.rn <= t.lim \
         ORDER BY t.req, t.rn"
    )))
    .bind(requests)
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new process samples"))?;
    let mut out: PerNode<(UnixMs, ProcessSample)> = vec![Vec::new(); n];
    for row in &rows {
        out[request(row, n)?].push((get(row, "ts_ms")?, process_from_row(row)?));
    }
    Ok(out)
}

async fn host_rows(
    pool: &SqlitePool,
    requests: &str,
    n: usize,
) -> Result<PerNode<HostRow>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "{REQUESTS} SELECT * FROM ( \
           SELECT r.req, r.lim, h.*, \
             row_number() OVER (PARTITION BY r.req ORDER BY h.ts_ms) AS rn \
           FROM r CROSS JOIN host_samples h ON h.node_id = r.id \
             AND h.ts_ms BETWEEN r.from_ms AND r.to_ms \
         ) t WHERE t.rn <= t.lim \
         ORDER BY t.req, t.rn"
    )))
    .bind(requests)
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new host samples"))?;
    let mut out: PerNode<HostRow> = vec![Vec::new(); n];
    for row in &rows {
        out[request(row, n)?].push(host_from_row(row)?);
    }
    Ok(out)
}

async fn event_rows(
    pool: &SqlitePool,
    requests: &str,
    n: usize,
) -> Result<PerNode<Event>, StoreError> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "{REQUESTS} SELECT * FROM ( \
           SELECT r.req, r.lim, e.ts_ms, e.kind, e.code, e.detail, g.uuid AS gpu_uuid, \
             row_number() OVER (PARTITION BY r.req ORDER BY e.ts_ms, e.id) AS rn \
           FROM r CROSS JOIN events e ON e.node_id = r.id \
             AND e.ts_ms BETWEEN r.from_ms AND r.to_ms \
           LEFT JOIN gpus g ON g.id = e.gpu_id \
         ) t WHERE t.rn <= t.lim \
         ORDER BY t.req, t.rn"
    )))
    .bind(requests)
    .fetch_all(pool)
    .await
    .map_err(q("read the followed nodes' new events"))?;
    let mut out: PerNode<Event> = vec![Vec::new(); n];
    for row in &rows {
        let kind: String = get(row, "kind")?;
        out[request(row, n)?].push(Event {
            time_ms: get(row, "ts_ms")?,
            gpu_uuid: get::<Option<String>>(row, "gpu_uuid")?.unwrap_or_default(),
            kind: event_kind(&kind)?,
            code: get::<Option<i64>>(row, "code")?.map(from_i64),
            detail: get(row, "detail")?,
        });
    }
    Ok(out)
}
