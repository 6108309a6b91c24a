//! The store follower's read: the new ticks of many nodes in five queries, whatever the
//! number of nodes (one per table: GPU samples, process samples, host samples, events,
//! GPU health).
//! The requests travel as request rows ([`Dialect::request_rows`](super::backend::Dialect::request_rows));
//! each GPU's or node's rows are found through its primary key, and a window keeps each
//! node's `limit` like [`FleetReads::node_ticks`](super::FleetReads::node_ticks).
//! It reads the row tables only: the live follower asks for the newest ticks, and minutes
//! are packed 15 minutes after they close by default (`node_ticks` reads packed ranges
//! another way).
//! Samples and process ticks packed as they arrived (a node catching up on closed
//! minutes) are the exception: [`with_packed_ticks`] finds the nodes that have them in
//! range, and those are read both forms merged.

use super::backend::{Backend, Get, Table, sql};
use super::rollup_hours::HOUR_MS;
use super::rows::{
    self, EVENT_COLS, GPU_COLS, HEALTH_COLS, PROCESS_JOINS, limit_i64, process_cols,
};
use super::{HostRow, NodeRecord, StoreError, TimeRange, assemble_ticks};
use gpufleet_core::{Event, GpuHealthSample, GpuSample, ProcessSample, Tick, UnixMs};

/// Per request, rows of one kind, oldest first.
type PerNode<T> = Vec<Vec<T>>;

const REQUEST_COLS: [&str; 5] = ["req", "id", "from_ms", "to_ms", "lim"];

/// What [`FleetReads::nodes_ticks`](super::FleetReads::nodes_ticks) answers, for at least
/// one node. On `conn`: a pooled connection, or a read snapshot where what else is read
/// with it must agree.
pub(super) async fn nodes_ticks<DB: Backend>(
    conn: &mut DB::Connection,
    wanted: &[(&NodeRecord, TimeRange)],
    limit: usize,
) -> Result<Vec<Vec<Tick>>, StoreError> {
    let n = wanted.len();
    // The GPU rows first: each node's newest `limit` ticks' worth.
    let gpu_limit = |node: &NodeRecord| limit.saturating_mul(node.gpus.len().max(1));
    let ranges: Vec<TimeRange> = wanted.iter().map(|(_, r)| *r).collect();
    let requests = gpu_requests(wanted, &ranges, &gpu_limit);
    let rows = read::<DB>(
        &mut *conn,
        "read the followed nodes' new GPU samples",
        &requests,
        &format!(
            "SELECT * FROM ( \
               SELECT r.req, {GPU_COLS}, g.gpu_index AS k_index, r.lim, \
                 row_number() OVER (PARTITION BY r.req \
                   ORDER BY s.ts_ms DESC, g.gpu_index DESC, g.uuid DESC) AS rn \
               FROM r {} JOIN gpus g ON g.id = s.gpu_id \
             ) t WHERE t.rn <= t.lim \
             ORDER BY t.req, t.ts_ms, t.k_index, t.gpu_uuid",
            DB::DIALECT.rows_per_request("gpu_samples", "s", "gpu_id", "x.ts_ms DESC", "r.lim")
        ),
    )
    .await?;
    let mut gpus: PerNode<(UnixMs, GpuSample)> = vec![Vec::new(); n];
    for row in &rows {
        gpus[rows::request(row, n, "follower read")?]
            .push((row.get("ts_ms")?, rows::gpu_sample(row)?));
    }
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
    let rows = read::<DB>(
        &mut *conn,
        "read the followed nodes' new process samples",
        &gpu_requests(wanted, &ranges, &process_limit),
        &format!(
            "SELECT * FROM ( \
               SELECT r.req, {}, r.lim, \
                 row_number() OVER (PARTITION BY r.req \
                   ORDER BY p.ts_ms, g.gpu_index, g.uuid, p.pid) AS rn \
               FROM r {} JOIN gpus g ON g.id = p.gpu_id {PROCESS_JOINS} \
             ) t WHERE t.rn <= t.lim \
             ORDER BY t.req, t.rn",
            process_cols(),
            DB::DIALECT.rows_per_request(
                "process_samples",
                "p",
                "gpu_id",
                "x.ts_ms, x.pid",
                "r.lim"
            )
        ),
    )
    .await?;
    let mut processes: PerNode<(UnixMs, ProcessSample)> = vec![Vec::new(); n];
    for row in &rows {
        processes[rows::request(row, n, "follower read")?]
            .push((row.get("ts_ms")?, rows::process(row)?));
    }
    // At most one health row per GPU per tick.
    let rows = read::<DB>(
        &mut *conn,
        "read the followed nodes' new GPU health samples",
        &gpu_requests(wanted, &ranges, &gpu_limit),
        &format!(
            "SELECT * FROM ( \
               SELECT r.req, {HEALTH_COLS}, g.gpu_index AS k_index, r.lim, \
                 row_number() OVER (PARTITION BY r.req \
                   ORDER BY h.ts_ms, g.gpu_index, g.uuid) AS rn \
               FROM r {} JOIN gpus g ON g.id = h.gpu_id \
             ) t WHERE t.rn <= t.lim \
             ORDER BY t.req, t.rn",
            DB::DIALECT.rows_per_request("gpu_health", "h", "gpu_id", "x.ts_ms", "r.lim")
        ),
    )
    .await?;
    let mut health: PerNode<(UnixMs, GpuHealthSample)> = vec![Vec::new(); n];
    for row in &rows {
        health[rows::request(row, n, "follower read")?]
            .push((row.get("ts_ms")?, rows::health(row)?));
    }
    let nodes: Vec<Vec<i64>> = wanted
        .iter()
        .zip(&ranges)
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
    let rows = read::<DB>(
        &mut *conn,
        "read the followed nodes' new host samples",
        &nodes,
        &format!(
            "SELECT * FROM ( \
               SELECT r.req, r.lim, h.*, \
                 row_number() OVER (PARTITION BY r.req ORDER BY h.ts_ms) AS rn \
               FROM r {} \
             ) t WHERE t.rn <= t.lim \
             ORDER BY t.req, t.rn",
            DB::DIALECT.rows_per_request("host_samples", "h", "node_id", "x.ts_ms", "r.lim")
        ),
    )
    .await?;
    let mut hosts: PerNode<HostRow> = vec![Vec::new(); n];
    for row in &rows {
        hosts[rows::request(row, n, "follower read")?].push(rows::host(row)?);
    }
    let rows = read::<DB>(
        &mut *conn,
        "read the followed nodes' new events",
        &nodes,
        &format!(
            "SELECT * FROM ( \
               SELECT r.req, r.lim, e.id AS e_id, {EVENT_COLS}, \
                 row_number() OVER (PARTITION BY r.req ORDER BY e.ts_ms, e.id) AS rn \
               FROM r {} LEFT JOIN gpus g ON g.id = e.gpu_id \
             ) t WHERE t.rn <= t.lim \
             ORDER BY t.req, t.rn",
            DB::DIALECT.rows_per_request("events", "e", "node_id", "x.ts_ms, x.id", "r.lim")
        ),
    )
    .await?;
    let mut events: PerNode<Event> = vec![Vec::new(); n];
    for row in &rows {
        events[rows::request(row, n, "follower read")?].push(rows::event(row)?);
    }
    Ok(gpus
        .into_iter()
        .zip(processes)
        .zip(hosts)
        .zip(events)
        .zip(health)
        .map(|((((g, p), h), e), x)| assemble_ticks(g, p, h, e, x, limit))
        .collect())
}

/// The indexes in `wanted` of the nodes with GPU samples or process ticks packed in their
/// range (a write packed them as they arrived), which [`nodes_ticks`] does not read: one
/// query.
pub(super) async fn with_packed_ticks<DB: Backend>(
    conn: &mut DB::Connection,
    wanted: &[(&NodeRecord, TimeRange)],
) -> Result<Vec<usize>, StoreError> {
    let ranges: Vec<TimeRange> = wanted.iter().map(|(_, r)| *r).collect();
    let requests = gpu_requests(wanted, &ranges, &|_| 0);
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    // A value starts at most an hour before a time it holds.
    let overlap = |table: &str| {
        format!(
            "SELECT r.req FROM r JOIN {table} p ON p.gpu_id = r.id \
               AND p.minute_ms >= r.from_ms - {HOUR_MS} AND p.minute_ms <= r.to_ms \
               AND p.minute_ms + p.span_ms > r.from_ms"
        )
    };
    let rows = read::<DB>(
        conn,
        "find the followed nodes' packed samples and process ticks",
        &requests,
        &format!(
            "SELECT DISTINCT x.req FROM ({} UNION ALL {}) x ORDER BY x.req",
            overlap("packed_process_minutes"),
            overlap("packed_gpu_minutes")
        ),
    )
    .await?;
    let n = wanted.len();
    rows.iter()
        .map(|row| rows::request(row, n, "follower read"))
        .collect()
}

/// Runs one of the follower's queries over its request rows.
async fn read<DB: Backend>(
    conn: &mut DB::Connection,
    op: &'static str,
    requests: &[Vec<i64>],
    body: &str,
) -> Result<Vec<DB::Row>, StoreError> {
    let table = Table::ints(&REQUEST_COLS, requests);
    let cte = DB::DIALECT.request_rows(&table);
    sql::<DB>(op, format!("{cte} {body}"))
        .bind_table(table)
        .all(conn)
        .await
}

/// One request row per (request, GPU).
fn gpu_requests(
    wanted: &[(&NodeRecord, TimeRange)],
    ranges: &[TimeRange],
    lim: &dyn Fn(&NodeRecord) -> usize,
) -> Vec<Vec<i64>> {
    wanted
        .iter()
        .zip(ranges)
        .enumerate()
        .flat_map(|(i, ((node, _), range))| {
            node.gpus.iter().map(move |g| {
                vec![
                    i as i64,
                    g.id.0,
                    range.from_ms,
                    range.to_ms,
                    limit_i64(lim(node)),
                ]
            })
        })
        .collect()
}
