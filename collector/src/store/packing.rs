//! The packed tier of host rows: closed minutes of a node's `host_samples` rows kept as one
//! value per node per minute (`packed_host_minutes`, in the format of [`packed::host`]).
//!
//! - **Packing** ([`SqlStore::pack_host_minutes`], run by the rollup task): a minute is
//!   packed once it is older than the caller's horizon, behind the node's rollup watermark,
//!   not the node's newest minute (whose last row seeds the live state), and its rollup row
//!   counts exactly the rows it holds (a minute with late rows waits for its recomputation).
//!   Its rows leave `host_samples` in the same transaction.
//! - **Reopening** ([`reopen_host_minutes`], first thing in every write transaction): a
//!   write whose host rows fall in packed minutes unpacks those minutes back into rows
//!   before it inserts, so replays, conflicts and late data are judged against the stored
//!   rows, and rollups recompute from complete minutes. The minute is packed again later.
//! - **Reading** ([`host_rows`]): the rows and the packed minutes of a range, merged.
//!
//! So a minute is in one form at a time. On PostgreSQL several collectors write: a write
//! and the packer take the node's transaction-scoped advisory lock, so a write cannot add
//! rows to a minute that is being packed (the packer would then delete rows it did not
//! pack, or leave a minute in both forms). SQLite has one writer.

use super::backend::{Backend, Dialect, Get, Table, sql};
use super::packed::{self, PackError};
use super::write::{HostTick, Samples};
use super::{HostRow, NodeBatch, NodeId, SqlStore, StoreError, TimeRange, rows};
use crate::accounting::energy::{MINUTE_MS, minute_of};
use gpufleet_core::{Tick, UnixMs};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Most minutes one packing transaction spans: bounded work while the writers wait.
const SPAN_MINUTES: i64 = 60;
/// Packed minutes read per query while collecting a range.
const READ_PAGE: i64 = 64;

/// What a packing call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackOutcome {
    /// Minutes packed (or merged into their packed value).
    pub minutes: usize,
    /// Host rows moved out of `host_samples`.
    pub rows: u64,
    /// Transactions committed.
    pub transactions: usize,
}

/// Takes the packing lock of `nodes` (PostgreSQL; in id order, so that writers never
/// wait for each other in a cycle) for the rest of the transaction.
async fn lock_nodes<DB: Backend>(
    conn: &mut DB::Connection,
    nodes: &BTreeSet<i64>,
) -> Result<(), StoreError> {
    if DB::DIALECT != Dialect::Postgres || nodes.is_empty() {
        return Ok(());
    }
    let table = Table::default().int("k", nodes.iter().copied());
    sql::<DB>(
        "take the packing lock of nodes",
        format!(
            "SELECT pg_advisory_xact_lock(hashtextextended( \
               'gpufleet:' || current_schema() || ':packed host:' || s.k, 0)) \
             FROM (SELECT v.k FROM {} ORDER BY v.k) s",
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .execute(conn)
    .await?;
    Ok(())
}

fn corrupt(node: i64, minute: UnixMs) -> impl FnOnce(PackError) -> StoreError {
    move |e| {
        StoreError::Corrupt(format!(
            "packed host rows of node {node}, minute {minute}: {e}"
        ))
    }
}

/// The host rows of a packed value.
fn unpack(node: i64, minute: UnixMs, value: &[u8]) -> Result<Vec<HostRow>, StoreError> {
    let rows = packed::host::unpack(value).map_err(corrupt(node, minute))?;
    if rows.iter().any(|r| minute_of(r.time_ms) != minute) {
        return Err(StoreError::Corrupt(format!(
            "packed host rows of node {node}, minute {minute}: a row of another minute"
        )));
    }
    Ok(rows)
}

/// Inserts host rows of one node into `host_samples` (rows already there are kept), as the
/// backend writes a tick's host row.
async fn insert_host_rows<DB: Backend>(
    conn: &mut DB::Connection,
    node: i64,
    host: &[HostRow],
) -> Result<(), StoreError> {
    let ticks: Vec<Tick> = host
        .iter()
        .map(|r| Tick {
            time_ms: r.time_ms,
            host: r.sample.clone(),
            cost: r.cost.clone(),
            ..Tick::default()
        })
        .collect();
    let samples = Samples {
        host: ticks
            .iter()
            .map(|tick| HostTick {
                node,
                ts: tick.time_ms,
                tick,
            })
            .collect(),
        ..Samples::default()
    };
    // The careful way (rows already stored are skipped, not an error).
    DB::write_samples(conn, &samples, &mut [], true).await?;
    Ok(())
}

/// Unpacks back into `host_samples` every packed minute that the host rows of `batches`
/// (except the `skip`ped ones) fall in, and takes the packing lock of their nodes: the
/// first step of a write transaction. Returns the minutes reopened.
pub(crate) async fn reopen_host_minutes<DB: Backend>(
    conn: &mut DB::Connection,
    batches: &[NodeBatch],
    skip: &HashSet<usize>,
) -> Result<usize, StoreError> {
    let mut wanted: BTreeMap<i64, BTreeSet<UnixMs>> = BTreeMap::new();
    for (_, b) in (batches.iter().enumerate()).filter(|(i, _)| !skip.contains(i)) {
        for t in (b.batch.ticks.iter()).filter(|t| t.host.is_some() || t.cost.is_some()) {
            (wanted.entry(b.keys.id.0).or_default()).insert(minute_of(t.time_ms));
        }
    }
    if wanted.is_empty() {
        return Ok(0);
    }
    lock_nodes::<DB>(conn, &wanted.keys().copied().collect()).await?;
    let spans = wanted
        .iter()
        .filter_map(|(node, minutes)| Some((*node, *minutes.first()?, *minutes.last()?)));
    let (mut ids, mut froms, mut tos) = (Vec::new(), Vec::new(), Vec::new());
    for (node, from, to) in spans {
        ids.push(node);
        froms.push(from);
        tos.push(to);
    }
    let table = Table::default()
        .int("id", ids)
        .int("from_ms", froms)
        .int("to_ms", tos);
    let found = sql::<DB>(
        "find packed host minutes a write falls in",
        format!(
            "SELECT p.node_id, p.minute_ms, p.packed FROM {} \
             JOIN packed_host_minutes p ON p.node_id = v.id \
               AND p.minute_ms BETWEEN v.from_ms AND v.to_ms",
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    let mut reopened = 0;
    for row in &found {
        let (node, minute): (i64, UnixMs) = (row.get("node_id")?, row.get("minute_ms")?);
        if !wanted.get(&node).is_some_and(|m| m.contains(&minute)) {
            continue;
        }
        let value: Vec<u8> = row.get("packed")?;
        insert_host_rows::<DB>(conn, node, &unpack(node, minute, &value)?).await?;
        sql::<DB>(
            "delete a reopened packed host minute",
            "DELETE FROM packed_host_minutes WHERE node_id = $1 AND minute_ms = $2",
        )
        .bind(node)
        .bind(minute)
        .execute(&mut *conn)
        .await?;
        reopened += 1;
    }
    Ok(reopened)
}

/// A node's host rows with times in `range`, oldest first, at most `limit`: the rows of
/// `host_samples` and of the packed minutes, merged (a row in both forms once).
pub(crate) async fn host_rows<DB: Backend>(
    conn: &mut DB::Connection,
    node: NodeId,
    range: TimeRange,
    limit: usize,
) -> Result<Vec<HostRow>, StoreError> {
    let stored = sql::<DB>(
        "read host samples",
        "SELECT * FROM host_samples WHERE node_id = $1 AND ts_ms BETWEEN $2 AND $3 \
         ORDER BY ts_ms LIMIT $4",
    )
    .bind(node.0)
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(rows::limit_i64(limit))
    .all(&mut *conn)
    .await?;
    let mut merged: BTreeMap<UnixMs, HostRow> = BTreeMap::new();
    for row in &stored {
        let r = rows::host(row)?;
        merged.insert(r.time_ms, r);
    }
    // Packed minutes in time order, a page at a time, until `limit` of their rows are in
    // the range: later ones could only hold later rows.
    let (mut next, mut from_packed) = (minute_of(range.from_ms), 0);
    while from_packed < limit && next <= range.to_ms {
        let page = sql::<DB>(
            "read packed host minutes",
            "SELECT minute_ms, packed FROM packed_host_minutes \
             WHERE node_id = $1 AND minute_ms >= $2 AND minute_ms <= $3 \
             ORDER BY minute_ms LIMIT $4",
        )
        .bind(node.0)
        .bind(next)
        .bind(range.to_ms)
        .bind(READ_PAGE)
        .all(&mut *conn)
        .await?;
        for row in &page {
            let minute: UnixMs = row.get("minute_ms")?;
            let value: Vec<u8> = row.get("packed")?;
            for r in unpack(node.0, minute, &value)? {
                if (range.from_ms..=range.to_ms).contains(&r.time_ms) {
                    from_packed += 1;
                    merged.entry(r.time_ms).or_insert(r);
                }
            }
            next = minute.saturating_add(MINUTE_MS);
        }
        if page.len() < READ_PAGE as usize {
            break;
        }
    }
    Ok(merged.into_values().take(limit).collect())
}

impl<DB: Backend> SqlStore<DB> {
    /// Packs the closed minutes of every node's host rows that end at or before
    /// `before_ms` (see the module docs for which minutes qualify), oldest first, at most
    /// `budget` minutes per call.
    pub(crate) async fn pack_host_minutes(
        &self,
        before_ms: UnixMs,
        budget: usize,
    ) -> Result<PackOutcome, StoreError> {
        let nodes = sql::<DB>(
            "list the nodes whose host rows may be packed",
            "SELECT n.id, p.done_to_ms, \
               (SELECT max(s.ts_ms) FROM host_samples s WHERE s.node_id = n.id) AS newest \
             FROM nodes n JOIN rollup_progress p ON p.kind = 'host' AND p.id = n.id \
             ORDER BY n.id",
        )
        .all(&mut *self.conn().await?)
        .await?;
        let mut out = PackOutcome::default();
        for row in &nodes {
            let (node, done): (i64, UnixMs) = (row.get("id")?, row.get("done_to_ms")?);
            let Some(newest) = row.get::<Option<i64>>("newest")? else {
                continue;
            };
            let limit = minute_of(before_ms).min(done).min(minute_of(newest));
            let mut from = UnixMs::MIN;
            while out.minutes < budget {
                match self.pack_span(node, from, limit).await? {
                    Some((end, minutes, rows)) => {
                        out.minutes += minutes;
                        out.rows += rows;
                        out.transactions += 1;
                        from = end;
                    }
                    None => break,
                }
            }
        }
        Ok(out)
    }

    /// One transaction of [`SqlStore::pack_host_minutes`]: packs what qualifies of the
    /// node's oldest unpacked minutes at or after `from` (at most [`SPAN_MINUTES`], all
    /// before `limit`). Returns where the span ended, the minutes and rows packed; `None`
    /// when no rows are left before `limit`.
    async fn pack_span(
        &self,
        node: i64,
        from: UnixMs,
        limit: UnixMs,
    ) -> Result<Option<(UnixMs, usize, u64)>, StoreError> {
        let mut tx = self.begin_write("begin packing host minutes").await?;
        lock_nodes::<DB>(tx.conn(), &BTreeSet::from([node])).await?;
        let first: Option<i64> = sql::<DB>(
            "find the oldest unpacked host row",
            "SELECT min(ts_ms) AS first FROM host_samples WHERE node_id = $1 AND ts_ms >= $2",
        )
        .bind(node)
        .bind(from)
        .one(tx.conn())
        .await?
        .get("first")?;
        let Some(start) = first.map(minute_of).filter(|&m| m < limit) else {
            tx.rollback().await?;
            return Ok(None);
        };
        let end = start.saturating_add(SPAN_MINUTES * MINUTE_MS).min(limit);
        let read = |op, text: &str| {
            sql::<DB>(op, text.to_owned())
                .bind(node)
                .bind(start)
                .bind(end)
        };
        let stored = read(
            "read host rows to pack",
            "SELECT * FROM host_samples WHERE node_id = $1 AND ts_ms >= $2 AND ts_ms < $3 \
             ORDER BY ts_ms",
        )
        .all(tx.conn())
        .await?;
        let counted = read(
            "read the rollup counts of host minutes to pack",
            "SELECT minute_ms, samples FROM host_minutes \
             WHERE node_id = $1 AND minute_ms >= $2 AND minute_ms < $3",
        )
        .all(tx.conn())
        .await?;
        let earlier = read(
            "read packed host minutes to merge",
            "SELECT minute_ms, packed FROM packed_host_minutes \
             WHERE node_id = $1 AND minute_ms >= $2 AND minute_ms < $3",
        )
        .all(tx.conn())
        .await?;
        let mut minutes: BTreeMap<UnixMs, Vec<HostRow>> = BTreeMap::new();
        for row in &stored {
            let r = rows::host(row)?;
            minutes.entry(minute_of(r.time_ms)).or_default().push(r);
        }
        let mut counts = HashMap::new();
        for row in &counted {
            counts.insert(row.get::<i64>("minute_ms")?, row.get::<i64>("samples")?);
        }
        let mut packed_before = HashMap::new();
        for row in &earlier {
            let minute: UnixMs = row.get("minute_ms")?;
            packed_before.insert(
                minute,
                unpack(node, minute, &row.get::<Vec<u8>>("packed")?)?,
            );
        }
        let (mut packed_minutes, mut moved) = (0, 0);
        for (minute, rows) in minutes {
            // Only a minute whose rollup agrees with its rows: one with late rows is
            // recomputed first.
            if counts.get(&minute).copied() != i64::try_from(rows.len()).ok() {
                continue;
            }
            let mut all: BTreeMap<UnixMs, HostRow> = BTreeMap::new();
            for r in packed_before
                .remove(&minute)
                .into_iter()
                .flatten()
                .chain(rows)
            {
                all.entry(r.time_ms).or_insert(r);
            }
            let all: Vec<HostRow> = all.into_values().collect();
            let value = match packed::host::pack(&all) {
                Ok(v) => v,
                Err(PackError::TooLarge(_)) => continue, // stays in rows
                Err(e) => return Err(corrupt(node, minute)(e)),
            };
            sql::<DB>(
                "store a packed host minute",
                "INSERT INTO packed_host_minutes (node_id, minute_ms, packed) VALUES ($1, $2, $3) \
                 ON CONFLICT (node_id, minute_ms) DO UPDATE SET packed = excluded.packed",
            )
            .bind(node)
            .bind(minute)
            .bind(&value)
            .execute(tx.conn())
            .await?;
            moved += sql::<DB>(
                "delete packed host rows",
                "DELETE FROM host_samples WHERE node_id = $1 AND ts_ms >= $2 AND ts_ms < $3",
            )
            .bind(node)
            .bind(minute)
            .bind(minute + MINUTE_MS)
            .execute(tx.conn())
            .await?;
            packed_minutes += 1;
        }
        tx.commit("commit packed host minutes").await?;
        Ok(Some((end, packed_minutes, moved)))
    }
}
