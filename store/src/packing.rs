//! The packed tier: closed minutes of a node's `host_samples` rows, and of a GPU's
//! `process_samples` and `gpu_samples` rows, each kept as one value per minute
//! (`packed_host_minutes`, `packed_process_minutes`, `packed_gpu_minutes`; the formats of
//! [`packed::host`], [`packed::process`] and [`packed::gpu`]).
//!
//! - **Packing** ([`SqlStore::pack_minutes`], run by the rollup task): a minute is packed
//!   once it is older than the caller's horizon, not the series' newest minute (whose last
//!   rows seed the live state), and nothing will recompute from its rows: a host minute is
//!   behind the node's rollup watermark and its rollup row counts exactly its rows; a
//!   process minute is behind the GPU's energy watermark and its energy minute counts
//!   exactly the GPU's samples in it; a GPU minute is behind both the GPU's watermarks,
//!   its rollup and energy minutes both count exactly its rows, and its process ticks are
//!   packed already (a minute with late rows waits for its recomputation). Its rows leave
//!   their table in the same transaction.
//! - **Merging hours** ([`SqlStore::merge_hours`], after packing): a closed hour whose
//!   minutes are all packed (no row of the tier left in it), at or after the series' raw
//!   horizon, becomes one value an hour long in the same table (`span_ms`): one deflate
//!   stream and one row instead of sixty.
//! - **Reopening** ([`reopen_minutes`], first thing in every write transaction): a write
//!   unpacks back into rows every packed minute it falls in (a node's host minute for its
//!   host rows; a GPU's process and sample minutes for its GPU samples and process rows)
//!   before it inserts, so replays, conflicts and late data are judged against the stored
//!   rows, and rollups and energy recompute from complete minutes. An hour-long value it
//!   falls in is split back into minute values first. The minute is packed again later,
//!   and its hour merged again.
//! - **Packing on arrival** ([`super::arrival`], in the same transaction): a GPU's samples
//!   and process ticks for a minute the store's clock has closed (a replay after an
//!   outage, a spool emptied) go straight into the minute's packed values, which
//!   reopening left packed (held) for them, unless the minute holds rows; the write
//!   computes the minute's rollup row itself. The open minutes of live agents stay rows.
//! - **Reading** ([`host_rows`], [`process_rows`], [`gpu_rows`], [`energy_processes`],
//!   [`energy_gpu_samples`], [`next_packed_sample`], [`each_packed_gpu_sample`]): the rows
//!   and the packed values that overlap a range (by start and span), merged, in one read
//!   snapshot.
//! - **Retention** splits the hour-long value that holds the raw horizon into minutes
//!   ([`split_at_horizon`]), then deletes packed values behind it; a GPU keeps its newest
//!   sample before it ([`expire_packed_gpu`]).
//!
//! So a minute is in one form at a time, and an hour-long value's hour holds nothing else.
//! On PostgreSQL several collectors write: a write, the packer and the merger take the
//! series' transaction-scoped advisory lock, so a write cannot add rows to a minute that
//! is being packed (the packer would then delete rows it did not pack, or leave a minute
//! in both forms). SQLite has one writer.

use super::backend::{Backend, Dialect, Get, GetExt, Table, sql};
use super::held::Held;
use super::merge::{Merged, Prefer};
use super::packed::{self, PackError, process::ProcessTick};
use super::rollup::kinds::{RollupKey, RollupKind};
use super::rollup_hours;
use super::rows::{self, GPU_COLS, PROCESS_JOINS, gpu_uuid, process_cols, to_i64};
use super::series::{PackOutcome, lock_names};
use super::tiers::{Span, Tier, corrupt, unpack_gpu, unpack_host, unpack_process};
use super::write::sent::{GpuRow, HostTick, NodeUpdate, ProcessRow, Samples};
use super::{
    GpuId, HostRow, NodeBatch, NodeId, NodeRecord, SqlStore, StoreError, TimeRange, skip_unreadable,
};
use crate::energy::records::EnergyProcess;
use gpufleet_core::times::{HOUR_MS, hour_of};
use gpufleet_core::times::{MINUTE_MS, minute_of};
use gpufleet_core::{DeliveryStats, GpuSample, ProcessSample, Tick, UnixMs};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Most minutes one packing transaction spans: bounded work while the writers wait.
const SPAN_MINUTES: i64 = 60;
/// Packed values read per query while collecting a range: the first page is small (a
/// value may be an hour long), later ones larger, up to the largest.
const FIRST_PAGE: i64 = 2;
const READ_PAGE: i64 = 64;

/// Takes the packing lock of `series` (PostgreSQL; in name order, so that writers never
/// wait for each other in a cycle) for the rest of the transaction.
async fn lock<DB: Backend>(
    conn: &mut DB::Connection,
    series: impl Iterator<Item = (Tier, i64)>,
) -> Result<(), StoreError> {
    lock_names::<DB>(
        conn,
        series.map(|(t, id)| t.series().lock_name(id)).collect(),
    )
    .await
}

/// A `process_samples` row as a packed tick.
fn process_tick<R: Get>(row: &R) -> Result<ProcessTick, StoreError> {
    Ok(ProcessTick {
        ts_ms: row.get("ts_ms")?,
        pid: row.get("pid")?,
        life_id: row.get("life_id")?,
        gpu_mem_bytes: row.u64_bits("gpu_mem_bytes")?,
        sm_util_pct: row.get("sm_util_pct")?,
        mem_util_pct: row.get("mem_util_pct")?,
        enc_util_pct: row.get("enc_util_pct")?,
        dec_util_pct: row.get("dec_util_pct")?,
    })
}

/// Inserts unpacked rows back into their tables (rows already there are kept), as the
/// backend writes a tick's rows.
pub(super) async fn insert_unpacked<DB: Backend>(
    conn: &mut DB::Connection,
    host: &[(i64, HostRow)],
    process: &[(i64, ProcessTick)],
    gpu: &[(i64, UnixMs, GpuSample)],
) -> Result<(), StoreError> {
    let ticks: Vec<Tick> = host
        .iter()
        .map(|(_, r)| Tick {
            time_ms: r.time_ms,
            host: r.sample.clone(),
            cost: r.cost.clone(),
            ..Tick::default()
        })
        .collect();
    // Only what process_samples keeps: the identity is the lifetime's.
    let samples: Vec<ProcessSample> = process
        .iter()
        .map(|(_, t)| ProcessSample {
            pid: t.pid,
            gpu_mem_bytes: t.gpu_mem_bytes,
            sm_util_pct: t.sm_util_pct,
            mem_util_pct: t.mem_util_pct,
            enc_util_pct: t.enc_util_pct,
            dec_util_pct: t.dec_util_pct,
            ..ProcessSample::default()
        })
        .collect();
    let rows = Samples {
        gpu: (gpu.iter())
            .map(|(id, ts, s)| GpuRow {
                group: 0,
                gpu: *id,
                ts: *ts,
                s,
            })
            .collect(),
        host: (host.iter().zip(&ticks))
            .map(|((node, _), tick)| HostTick {
                node: *node,
                ts: tick.time_ms,
                tick,
            })
            .collect(),
        process: (process.iter().zip(&samples))
            .map(|((gpu, t), p)| ProcessRow {
                gpu: *gpu,
                ts: t.ts_ms,
                slot: 0,
                life: t.life_id,
                p,
            })
            .collect(),
    };
    // The careful way (rows already stored are skipped, not an error); what it counts as
    // inserted was stored before, so it goes to no node's count.
    let mut uncounted = [NodeUpdate {
        id: 0,
        newest_ms: 0,
        seq: 0,
        delivery: DeliveryStats::default(),
        inserted: 0,
    }];
    DB::write_samples(conn, &rows, &mut uncounted, true).await?;
    Ok(())
}

/// The tier whose key stands for `tier`'s in a write's wanted minutes: a GPU's samples
/// and process ticks are reopened together.
fn wanted_as(tier: Tier) -> Tier {
    match tier {
        Tier::Gpu => Tier::Process,
        t => t,
    }
}

/// Each GPU's newest packed sample, where its newest packed value ends after its newest
/// row (or it has no rows): (GPU, time, sample). Values the packer wrote never do (it
/// leaves a GPU's newest minute as rows); values packed as they arrived may.
pub(crate) async fn newest_packed_gpu_samples<DB: Backend>(
    conn: &mut DB::Connection,
) -> Result<Vec<(i64, UnixMs, GpuSample)>, StoreError> {
    let found = sql::<DB>(
        "find the GPUs whose newest samples are packed",
        "SELECT x.gpu_id, x.minute_ms, x.span_ms, x.packed FROM ( \
           SELECT p.gpu_id, p.minute_ms, p.span_ms, p.packed, \
             (SELECT max(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = g.id) AS newest \
           FROM gpus g JOIN packed_gpu_minutes p ON p.gpu_id = g.id AND p.minute_ms = \
             (SELECT max(q.minute_ms) FROM packed_gpu_minutes q WHERE q.gpu_id = g.id) \
         ) x WHERE x.newest IS NULL OR x.minute_ms + x.span_ms > x.newest ORDER BY x.gpu_id",
    )
    .all(&mut *conn)
    .await?;
    let mut out = Vec::with_capacity(found.len());
    for row in &found {
        let gpu: i64 = row.get("gpu_id")?;
        let value: Vec<u8> = row.get("packed")?;
        let samples = Span::of(Tier::Gpu, gpu, row).and_then(|span| unpack_gpu(gpu, span, &value));
        // An unreadable value leaves the GPU's newest row as its newest sample.
        let newest = samples.map(|s| s.into_iter().max_by_key(|(t, _)| *t));
        if let Some((t, s)) = skip_unreadable(newest, Tier::Gpu.packed(), gpu)? {
            out.push((gpu, t, s));
        }
    }
    Ok(out)
}

/// SQL for the time span of GPU `gpu`'s samples (an expression naming its id), rows and
/// packed values both, as `first_ms` and `last_ms` columns: a packed value stands for
/// its span (from its first minute's start; to its end less 1 ms), which is all a
/// caller that counts in minutes needs.
pub(crate) fn gpu_sample_span(dialect: Dialect, gpu: &str) -> String {
    let either = |a: &str, b: &str, pick: fn(Dialect, &str, &str) -> String| {
        pick(
            dialect,
            &format!("coalesce({a}, {b})"),
            &format!("coalesce({b}, {a})"),
        )
    };
    let rows = |f: &str| format!("(SELECT {f}(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = {gpu})");
    let first =
        format!("(SELECT min(p.minute_ms) FROM packed_gpu_minutes p WHERE p.gpu_id = {gpu})");
    let last = format!(
        "(SELECT p.minute_ms + p.span_ms - 1 FROM packed_gpu_minutes p WHERE p.gpu_id = {gpu} \
         ORDER BY p.minute_ms DESC LIMIT 1)"
    );
    format!(
        "{} AS first_ms, {} AS last_ms",
        either(&rows("min"), &first, Dialect::least),
        either(&rows("max"), &last, Dialect::greatest)
    )
}

/// Unpacks back into rows every packed minute that `batches` (except the `skip`ped ones)
/// fall in, an hour-long value split back into minute values first, and takes the packing
/// lock of every series they write: the first step of a write transaction. A GPU's minute
/// of samples or process ticks that ends at or before `closed_before` is held instead
/// (returned decoded, left packed): [`super::arrival::pack_arriving`] adds the write's
/// to it.
pub(crate) async fn reopen_minutes<DB: Backend>(
    conn: &mut DB::Connection,
    batches: &[NodeBatch],
    skip: &HashSet<usize>,
    closed_before: UnixMs,
) -> Result<Held, StoreError> {
    let mut wanted: BTreeMap<(Tier, i64), BTreeSet<UnixMs>> = BTreeMap::new();
    for (_, b) in (batches.iter().enumerate()).filter(|(i, _)| !skip.contains(i)) {
        // The series already noted for the minute of the batch's previous tick: a batch's
        // ticks mostly share their minute, and each names the same GPUs.
        let mut noted: HashSet<(Tier, i64), foldhash::fast::RandomState> = HashSet::default();
        let mut noted_minute = None;
        for t in &b.batch.ticks {
            let minute = minute_of(t.time_ms);
            if noted_minute != Some(minute) {
                noted_minute = Some(minute);
                noted.clear();
            }
            let mut note = |key: (Tier, i64)| {
                if noted.insert(key) {
                    wanted.entry(key).or_default().insert(minute);
                }
            };
            if t.host.is_some() || t.cost.is_some() {
                note((Tier::Host, b.keys.id.0));
            }
            let uuids =
                (t.gpus.iter().map(|g| &g.gpu_uuid)).chain(t.processes.iter().map(|p| &p.gpu_uuid));
            // A GPU's samples and process ticks: both its tiers (keyed as Process).
            for gpu in uuids.filter_map(|u| b.keys.gpus.get(u)) {
                note((Tier::Process, gpu.0));
            }
        }
    }
    let mut held = Held::default();
    if wanted.is_empty() {
        return Ok(held);
    }
    lock::<DB>(conn, wanted.keys().copied()).await?;
    let holds = |tier: Tier, minute: UnixMs| {
        tier != Tier::Host && minute.saturating_add(MINUTE_MS) <= closed_before
    };
    let mut host = Vec::new();
    let mut process = Vec::new();
    let mut gpu = Vec::new();
    let mut reopened = Vec::new();
    let mut split_minutes = 0;
    // Every tier in one statement: per series the span of minutes written.
    let spans: Vec<(Tier, i64, UnixMs, UnixMs)> = (wanted.iter())
        .filter_map(|((tier, id), m)| Some((*tier, *id, *m.first()?, *m.last()?)))
        .collect();
    let table = Table::default()
        .int("tier", spans.iter().map(|s| s.0 as i64))
        .int("id", spans.iter().map(|s| s.1))
        .int("from_ms", spans.iter().map(|s| s.2))
        .int("to_ms", spans.iter().map(|s| s.3))
        .int("from_hour", spans.iter().map(|s| hour_of(s.2)));
    // Values that start in the span, and the hour-long value that starts before it and
    // holds its first minute (a lookup by key, not a scan).
    let select = |tier: Tier| {
        format!(
            "SELECT {t} AS tier, p.{id} AS id, p.minute_ms, p.span_ms, p.packed FROM {v} \
             JOIN {packed} p ON v.tier = {k} AND p.{id} = v.id \
               AND p.minute_ms BETWEEN v.from_ms AND v.to_ms \
             UNION ALL SELECT {t} AS tier, p.{id} AS id, p.minute_ms, p.span_ms, p.packed \
             FROM {v} JOIN {packed} p ON v.tier = {k} AND p.{id} = v.id \
               AND p.minute_ms = v.from_hour AND p.minute_ms < v.from_ms \
               AND p.span_ms > {MINUTE_MS}",
            t = tier as i64,
            k = wanted_as(tier) as i64,
            v = DB::DIALECT.over(&table, "v"),
            id = tier.id(),
            packed = tier.packed(),
        )
    };
    let text = format!(
        "{} UNION ALL {} UNION ALL {}",
        select(Tier::Host),
        select(Tier::Process),
        select(Tier::Gpu)
    );
    let found = sql::<DB>("find packed minutes a write falls in", text)
        .bind_table(table)
        .all(&mut *conn)
        .await?;
    for row in &found {
        let tier = match row.get::<i64>("tier")? {
            t if t == Tier::Host as i64 => Tier::Host,
            t if t == Tier::Process as i64 => Tier::Process,
            _ => Tier::Gpu,
        };
        let id: i64 = row.get("id")?;
        let span = Span::of(tier, id, row)?;
        let Some(written) = wanted.get(&(wanted_as(tier), id)) else {
            continue;
        };
        if written.range(span.start..span.end()).next().is_none() {
            continue;
        }
        let value: Vec<u8> = row.get("packed")?;
        let mut unpack = |span: Span, value: &[u8]| -> Result<(), StoreError> {
            match tier {
                Tier::Host => {
                    let rows = unpack_host(id, span, value)?;
                    host.extend(rows.into_iter().map(|r| (id, r)));
                }
                Tier::Process => {
                    let ticks = unpack_process(id, span, value)?;
                    process.extend(ticks.into_iter().map(|t| (id, t)));
                }
                Tier::Gpu => {
                    let samples = unpack_gpu(id, span, value)?;
                    gpu.extend(samples.into_iter().map(|(t, s)| (id, t, s)));
                }
            }
            Ok(())
        };
        if span.len == MINUTE_MS {
            if holds(tier, span.start) {
                held.hold(tier, id, span, value, true)?;
                continue;
            }
            unpack(span, &value)?;
            reopened.push((tier, id, span.start));
            continue;
        }
        // An hour-long value is split back into minute values and the written minutes
        // are reopened, as if it had never been merged.
        let split = regroup(tier, id, &[(span, value)], minute_of)?
            .ok_or_else(|| corrupt(tier, id, span.start)(PackError::TooLarge("a minute")))?;
        delete_value::<DB>(conn, tier, id, span.start).await?;
        let (open, keep): (Vec<_>, Vec<_>) =
            split.into_iter().partition(|(m, _)| written.contains(m));
        for (minute, value) in open {
            let span = Span::minute(minute);
            if holds(tier, minute) {
                held.hold(tier, id, span, value, false)?;
            } else {
                unpack(span, &value)?;
                split_minutes += 1;
            }
        }
        insert_values::<DB>(conn, tier, id, MINUTE_MS, &keep).await?;
    }
    if reopened.is_empty() && split_minutes == 0 {
        return Ok(held);
    }
    insert_unpacked::<DB>(conn, &host, &process, &gpu).await?;
    for (tier, id, minute) in &reopened {
        delete_value::<DB>(conn, *tier, *id, *minute).await?;
    }
    Ok(held)
}

/// Deletes the packed value of series `id` of `tier` that starts at `start`.
pub(super) async fn delete_value<DB: Backend>(
    conn: &mut DB::Connection,
    tier: Tier,
    id: i64,
    start: UnixMs,
) -> Result<u64, StoreError> {
    sql::<DB>(
        "delete a packed value",
        format!(
            "DELETE FROM {} WHERE {} = $1 AND minute_ms = $2",
            tier.packed(),
            tier.id()
        ),
    )
    .bind(id)
    .bind(start)
    .execute(conn)
    .await
}

/// The packed values of series `id` of `tier` that overlap `range`, oldest first, a page
/// at a time: `each` gets every page's (span, value) and says how many of its rows were
/// in the range; it stops once `limit` were (later values hold later rows).
async fn packed_pages<DB: Backend>(
    conn: &mut DB::Connection,
    tier: Tier,
    id: i64,
    range: TimeRange,
    limit: usize,
    mut each: impl FnMut(Span, &[u8]) -> Result<usize, StoreError>,
) -> Result<(), StoreError> {
    // Values do not overlap: the first page starts at the hour that may hold `from_ms`
    // in an hour-long value, the next ones where the last value read ended.
    let (mut lowest, mut next, mut seen) = (hour_of(range.from_ms), range.from_ms, 0);
    let mut page_len = FIRST_PAGE;
    while seen < limit && next <= range.to_ms {
        let page = sql::<DB>(
            "read packed minutes",
            format!(
                "SELECT minute_ms, span_ms, packed FROM {} WHERE {} = $1 AND minute_ms >= $2 \
                 AND minute_ms <= $3 AND minute_ms + span_ms > $5 ORDER BY minute_ms LIMIT $4",
                tier.packed(),
                tier.id()
            ),
        )
        .bind(id)
        .bind(lowest)
        .bind(range.to_ms)
        .bind(page_len)
        .bind(next)
        .all(&mut *conn)
        .await?;
        for row in &page {
            if seen >= limit {
                return Ok(());
            }
            let span = Span::of(tier, id, row)?;
            seen += each(span, &row.get::<Vec<u8>>("packed")?)?;
            next = span.end();
            lowest = next;
        }
        if page.len() < page_len as usize {
            break;
        }
        page_len = (page_len * 4).min(READ_PAGE);
    }
    Ok(())
}

fn in_range(range: TimeRange, t: UnixMs) -> bool {
    (range.from_ms..=range.to_ms).contains(&t)
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
    let mut merged = Merged::new(range, Prefer::Rows);
    merged.rows(
        stored
            .iter()
            .map(|row| rows::host(row).map(|r| (r.time_ms, r)))
            .collect::<Result<Vec<_>, _>>()?,
    );
    packed_pages::<DB>(conn, Tier::Host, node.0, range, limit, |span, value| {
        let items = unpack_host(node.0, span, value)?
            .into_iter()
            .map(|r| (r.time_ms, r));
        Ok(merged.packed(items, |t| *t))
    })
    .await?;
    Ok(merged.take(limit).map(|(_, r)| r).collect())
}

/// Sets the UUID of `gpu`'s samples that came from packed minutes (which keep none).
async fn name_samples<'s, DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    samples: impl Iterator<Item = &'s mut GpuSample>,
) -> Result<(), StoreError> {
    let unnamed: Vec<&mut GpuSample> = samples.filter(|s| s.gpu_uuid.is_empty()).collect();
    if unnamed.is_empty() {
        return Ok(());
    }
    let uuid = gpu_uuid::<DB>(conn, gpu).await?;
    for s in unnamed {
        s.gpu_uuid.clone_from(&uuid);
    }
    Ok(())
}

/// A GPU's samples with times in `range`, oldest first, at most `limit`: the rows of
/// `gpu_samples` and of the packed minutes, merged.
pub(crate) async fn gpu_rows<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    range: TimeRange,
    limit: usize,
) -> Result<Vec<(UnixMs, GpuSample)>, StoreError> {
    let stored = sql::<DB>(
        "read GPU samples",
        format!(
            "SELECT {GPU_COLS} FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id \
             WHERE s.gpu_id = $1 AND s.ts_ms BETWEEN $2 AND $3 ORDER BY s.ts_ms LIMIT $4"
        ),
    )
    .bind(gpu.0)
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(rows::limit_i64(limit))
    .all(&mut *conn)
    .await?;
    let mut merged = Merged::new(range, Prefer::Rows);
    merged.rows(
        stored
            .iter()
            .map(|row| Ok((row.get("ts_ms")?, rows::gpu_sample(row)?)))
            .collect::<Result<Vec<_>, StoreError>>()?,
    );
    packed_pages::<DB>(conn, Tier::Gpu, gpu.0, range, limit, |span, value| {
        Ok(merged.packed(unpack_gpu(gpu.0, span, value)?, |t| *t))
    })
    .await?;
    let mut out: Vec<(UnixMs, GpuSample)> = merged.take(limit).collect();
    name_samples::<DB>(conn, gpu, out.iter_mut().map(|(_, s)| s)).await?;
    Ok(out)
}

/// Whether any of `gpu`'s samples in `range` may be packed (a packed value overlaps it).
pub(crate) async fn gpu_packed_in<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    range: TimeRange,
) -> Result<bool, StoreError> {
    let found = sql::<DB>(
        "look for packed minutes of a GPU",
        "SELECT 1 AS found FROM packed_gpu_minutes \
         WHERE gpu_id = $1 AND minute_ms >= $2 AND minute_ms <= $3 \
           AND minute_ms + span_ms > $4 LIMIT 1",
    )
    .bind(gpu.0)
    .bind(hour_of(range.from_ms))
    .bind(range.to_ms)
    .bind(range.from_ms)
    .all(conn)
    .await?;
    Ok(!found.is_empty())
}

/// Feeds `each` every sample of `gpu`'s packed minutes with a time in `range`, minute by
/// minute, oldest first (without their UUID).
pub(crate) async fn each_packed_gpu_sample<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    range: TimeRange,
    mut each: impl FnMut(UnixMs, &GpuSample),
) -> Result<(), StoreError> {
    packed_pages::<DB>(conn, Tier::Gpu, gpu.0, range, usize::MAX, |span, value| {
        for (t, s) in unpack_gpu(gpu.0, span, value)? {
            if in_range(range, t) {
                each(t, &s);
            }
        }
        Ok(0) // counted as none: every page of the range is read
    })
    .await
}

/// The GPU samples of packed minutes for energy ranges (`(GPU id, from_ms, to_ms,
/// after_ms)`): per range, the newest packed sample before `from_ms` in a minute at or
/// after `after_ms` (the minute of the newest row before `from_ms`: no older packed
/// sample can be newer), and the packed samples in `[from_ms, to_ms)`, by time.
pub(crate) async fn energy_gpu_samples<DB: Backend>(
    conn: &mut DB::Connection,
    ranges: &[(GpuId, UnixMs, UnixMs, UnixMs)],
) -> Result<Vec<EnergyPacked>, StoreError> {
    let mut out = vec![EnergyPacked::default(); ranges.len()];
    let table = Table::default()
        .int("req", 0..ranges.len() as i64)
        .int("id", ranges.iter().map(|r| r.0.0))
        .int("from_ms", ranges.iter().map(|r| r.1))
        .int("to_ms", ranges.iter().map(|r| r.2))
        .int("first_minute", ranges.iter().map(|r| minute_of(r.1)))
        .int("first_hour", ranges.iter().map(|r| hour_of(r.1)))
        .int("after_minute", ranges.iter().map(|r| minute_of(r.3)));
    // The values the ranges overlap, and each range's newest value wholly before its
    // first minute (no value but an hour-long one overlapping the range starts between).
    let found = sql::<DB>(
        "find packed GPU minutes for energy",
        format!(
            "SELECT v.req, p.gpu_id, p.minute_ms, p.span_ms, p.packed FROM {v} \
             JOIN packed_gpu_minutes p ON p.gpu_id = v.id AND p.minute_ms >= v.first_hour \
               AND p.minute_ms + p.span_ms > v.from_ms AND p.minute_ms < v.to_ms \
             UNION ALL SELECT v.req, p.gpu_id, p.minute_ms, p.span_ms, p.packed FROM {v} \
             JOIN packed_gpu_minutes p ON p.gpu_id = v.id AND p.minute_ms = ( \
               SELECT max(x.minute_ms) FROM packed_gpu_minutes x \
               WHERE x.gpu_id = v.id AND x.minute_ms < v.first_minute \
                 AND x.minute_ms + x.span_ms <= v.first_minute \
                 AND x.minute_ms >= v.after_minute)",
            v = DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    for row in &found {
        let req = rows::request(row, ranges.len(), "packed energy read")?;
        let gpu: i64 = row.get("gpu_id")?;
        let span = Span::of(Tier::Gpu, gpu, row)?;
        let (_, from, to, _) = ranges[req];
        let o = &mut out[req];
        for (t, s) in unpack_gpu(gpu, span, &row.get::<Vec<u8>>("packed")?)? {
            if (from..to).contains(&t) {
                o.samples.push((t, s));
            } else if t < from && o.prev.as_ref().is_none_or(|p| p.0 < t) {
                o.prev = Some((t, s));
            }
        }
    }
    for o in &mut out {
        o.samples.sort_by_key(|(t, _)| *t);
        o.samples.dedup_by_key(|(t, _)| *t);
    }
    Ok(out)
}

/// What the packed minutes hold for one energy range.
#[derive(Debug, Clone, Default)]
pub(crate) struct EnergyPacked {
    pub prev: Option<(UnixMs, GpuSample)>,
    pub samples: Vec<(UnixMs, GpuSample)>,
}

/// The time of `gpu`'s first packed sample at or after `at_ms`.
pub(crate) async fn next_packed_sample<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    at_ms: UnixMs,
) -> Result<Option<UnixMs>, StoreError> {
    // The value holding `at_ms` may hold no sample after it; the next one does.
    let found = sql::<DB>(
        "find the next packed GPU minutes",
        "SELECT minute_ms, span_ms, packed FROM packed_gpu_minutes WHERE gpu_id = $1 \
         AND minute_ms >= $2 AND minute_ms + span_ms > $3 ORDER BY minute_ms LIMIT 2",
    )
    .bind(gpu.0)
    .bind(hour_of(at_ms))
    .bind(at_ms)
    .all(conn)
    .await?;
    for row in &found {
        let span = Span::of(Tier::Gpu, gpu.0, row)?;
        let samples = unpack_gpu(gpu.0, span, &row.get::<Vec<u8>>("packed")?)?;
        if let Some(t) = samples
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| *t >= at_ms)
            .min()
        {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

/// Of `wanted` (GPU, position), the indexes of the GPUs with a packed value that ends
/// after the minute of their position.
pub(crate) async fn packed_after<DB: Backend>(
    conn: &mut DB::Connection,
    wanted: &[(GpuId, UnixMs)],
) -> Result<BTreeSet<usize>, StoreError> {
    let table = Table::default()
        .int("req", 0..wanted.len() as i64)
        .int("id", wanted.iter().map(|w| w.0.0))
        .int("from_minute", wanted.iter().map(|w| minute_of(w.1)))
        .int("from_hour", wanted.iter().map(|w| hour_of(w.1)));
    let found = sql::<DB>(
        "look for packed minutes after remote-write positions",
        format!(
            "SELECT v.req FROM {} WHERE EXISTS (SELECT 1 FROM packed_gpu_minutes p \
               WHERE p.gpu_id = v.id AND p.minute_ms >= v.from_hour \
                 AND p.minute_ms + p.span_ms > v.from_minute)",
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .all(conn)
    .await?;
    found
        .iter()
        .map(|row| rows::request(row, wanted.len(), "remote-write read"))
        .collect()
}

/// Retention of a GPU's packed minutes behind its raw `horizon` (a minute boundary), after
/// its rows there were deleted but the newest: the GPU keeps its newest sample before
/// the horizon (the horizon minute's first interval starts there). When that is a packed
/// one, its minute is packed again holding only it, and the row left goes; else every
/// packed minute before the horizon goes. Returns the packed minutes and rows deleted.
pub(crate) async fn expire_packed_gpu<DB: Backend>(
    store: &SqlStore<DB>,
    gpu: i64,
    horizon: UnixMs,
) -> Result<(u64, u64), StoreError> {
    // Most runs find it done: only the newest sample left, packed alone (or nothing).
    {
        let mut conn = store.conn().await?;
        let packed = sql::<DB>(
            "look for packed GPU minutes before the horizon",
            "SELECT minute_ms, span_ms, packed FROM packed_gpu_minutes WHERE gpu_id = $1 \
             AND minute_ms < $2 ORDER BY minute_ms DESC LIMIT 2",
        )
        .bind(gpu)
        .bind(horizon)
        .all(&mut *conn)
        .await?;
        let alone = match packed.as_slice() {
            [] => return Ok((0, 0)),
            [one] => {
                let span = Span::of(Tier::Gpu, gpu, one)?;
                span.end() <= horizon
                    && unpack_gpu(gpu, span, &one.get::<Vec<u8>>("packed")?)?.len() == 1
            }
            _ => false,
        };
        let row = sql::<DB>(
            "look for GPU rows before the horizon",
            "SELECT 1 AS found FROM gpu_samples WHERE gpu_id = $1 AND ts_ms < $2 LIMIT 1",
        )
        .bind(gpu)
        .bind(horizon)
        .all(&mut *conn)
        .await?;
        if alone && row.is_empty() {
            return Ok((0, 0));
        }
    }
    let mut tx = store
        .begin_write("begin expiring packed GPU minutes")
        .await?;
    lock::<DB>(tx.conn(), std::iter::once((Tier::Gpu, gpu))).await?;
    // An hour-long value holding the horizon is split first: every value before the
    // horizon then ends at or before it.
    split_hour::<DB>(tx.conn(), Tier::Gpu, gpu, horizon).await?;
    let newest = sql::<DB>(
        "read the newest packed GPU minute before the horizon",
        "SELECT minute_ms, span_ms, packed FROM packed_gpu_minutes WHERE gpu_id = $1 \
         AND minute_ms < $2 ORDER BY minute_ms DESC LIMIT 1",
    )
    .bind(gpu)
    .bind(horizon)
    .optional(tx.conn())
    .await?;
    let Some(newest) = newest else {
        tx.rollback().await?;
        return Ok((0, 0));
    };
    let span = Span::of(Tier::Gpu, gpu, &newest)?;
    let minute = span.start;
    let mut samples = unpack_gpu(gpu, span, &newest.get::<Vec<u8>>("packed")?)?;
    samples.sort_by_key(|(t, _)| *t);
    let row: Option<UnixMs> = sql::<DB>(
        "read the newest GPU row before the horizon",
        "SELECT max(ts_ms) AS t FROM gpu_samples WHERE gpu_id = $1 AND ts_ms < $2",
    )
    .bind(gpu)
    .bind(horizon)
    .one(tx.conn())
    .await?
    .get("t")?;
    let (mut keep_from, mut rows) = (horizon, 0);
    if let Some(last) = samples.pop().filter(|(t, _)| row.is_none_or(|r| r < *t)) {
        if !samples.is_empty() {
            let value = packed::gpu::pack(std::slice::from_ref(&last)).map_err(corrupt(
                Tier::Gpu,
                gpu,
                minute,
            ))?;
            sql::<DB>(
                "pack a GPU's newest minute before the horizon again",
                "UPDATE packed_gpu_minutes SET packed = $3 WHERE gpu_id = $1 AND minute_ms = $2",
            )
            .bind(gpu)
            .bind(minute)
            .bind(&value)
            .execute(tx.conn())
            .await?;
        }
        keep_from = minute;
        rows = sql::<DB>(
            "delete the GPU row before the horizon",
            "DELETE FROM gpu_samples WHERE gpu_id = $1 AND ts_ms < $2",
        )
        .bind(gpu)
        .bind(horizon)
        .execute(tx.conn())
        .await?;
    }
    let deleted = sql::<DB>(
        "delete packed GPU minutes behind the horizon",
        "DELETE FROM packed_gpu_minutes WHERE gpu_id = $1 AND minute_ms < $2",
    )
    .bind(gpu)
    .bind(keep_from)
    .execute(tx.conn())
    .await?;
    tx.commit("commit expired packed GPU minutes").await?;
    Ok((deleted, rows))
}

/// Whether any minute of `node`'s host rows or of its GPUs' process ticks or samples in
/// `range` is packed, or any hour of its GPUs' health.
pub(crate) async fn any_packed<DB: Backend>(
    conn: &mut DB::Connection,
    node: &NodeRecord,
    range: TimeRange,
) -> Result<bool, StoreError> {
    let found = sql::<DB>(
        "look for packed minutes of a node",
        "SELECT 1 AS found FROM packed_host_minutes \
           WHERE node_id = $1 AND minute_ms >= $2 AND minute_ms <= $3 \
             AND minute_ms + span_ms > $4 \
         UNION ALL SELECT 1 AS found FROM packed_process_minutes p JOIN gpus g ON g.id = p.gpu_id \
           WHERE g.node_id = $1 AND p.minute_ms >= $2 AND p.minute_ms <= $3 \
             AND p.minute_ms + p.span_ms > $4 \
         UNION ALL SELECT 1 AS found FROM packed_gpu_minutes p JOIN gpus g ON g.id = p.gpu_id \
           WHERE g.node_id = $1 AND p.minute_ms >= $2 AND p.minute_ms <= $3 \
             AND p.minute_ms + p.span_ms > $4 \
         UNION ALL SELECT 1 AS found FROM packed_gpu_health_hours p JOIN gpus g ON g.id = p.gpu_id \
           WHERE g.node_id = $1 AND p.hour_ms >= $2 AND p.hour_ms <= $3 LIMIT 1",
    )
    .bind(node.id.0)
    .bind(hour_of(range.from_ms))
    .bind(range.to_ms)
    .bind(range.from_ms)
    .all(conn)
    .await?;
    Ok(!found.is_empty())
}

/// Packed ticks as a FROM item `p` with `process_samples`' columns (and `req`: each
/// tick's request index), for the queries that join lifetimes and workloads.
fn ticks_table(ticks: &[(usize, i64, ProcessTick)]) -> Table {
    let col =
        |f: fn(&ProcessTick) -> Option<u32>| ticks.iter().map(move |t| f(&t.2).map(i64::from));
    Table::default()
        .int("req", ticks.iter().map(|t| t.0 as i64))
        .int("gpu_id", ticks.iter().map(|t| t.1))
        .int("ts_ms", ticks.iter().map(|t| t.2.ts_ms))
        .int("pid", ticks.iter().map(|t| i64::from(t.2.pid)))
        .int("life_id", ticks.iter().map(|t| t.2.life_id))
        .int(
            "gpu_mem_bytes",
            ticks.iter().map(|t| t.2.gpu_mem_bytes.map(to_i64)),
        )
        .int("sm_util_pct", col(|t| t.sm_util_pct))
        .int("mem_util_pct", col(|t| t.mem_util_pct))
        .int("enc_util_pct", col(|t| t.enc_util_pct))
        .int("dec_util_pct", col(|t| t.dec_util_pct))
}

/// A GPU's process samples with times in `range`, by time then pid, at most `limit`: the
/// rows of `process_samples` and of the packed minutes (identities joined back alike).
pub(crate) async fn process_rows<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    range: TimeRange,
    limit: usize,
) -> Result<Vec<(UnixMs, ProcessSample)>, StoreError> {
    let stored = sql::<DB>(
        "read process samples",
        format!(
            "SELECT {} FROM process_samples p JOIN gpus g ON g.id = p.gpu_id {PROCESS_JOINS} \
             WHERE p.gpu_id = $1 AND p.ts_ms BETWEEN $2 AND $3 \
             ORDER BY p.ts_ms, p.pid LIMIT $4",
            process_cols()
        ),
    )
    .bind(gpu.0)
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(rows::limit_i64(limit))
    .all(&mut *conn)
    .await?;
    let mut merged = Merged::new(range, Prefer::Rows);
    merged.rows(
        stored
            .iter()
            .map(|row| {
                let p = rows::process(row)?;
                Ok(((row.get("ts_ms")?, p.pid), p))
            })
            .collect::<Result<Vec<_>, StoreError>>()?,
    );
    let mut ticks = Vec::new();
    packed_pages::<DB>(conn, Tier::Process, gpu.0, range, limit, |span, value| {
        let before = ticks.len();
        ticks.extend(
            (unpack_process(gpu.0, span, value)?.into_iter())
                .filter(|t| in_range(range, t.ts_ms))
                .map(|t| (0, gpu.0, t)),
        );
        Ok(ticks.len() - before)
    })
    .await?;
    if !ticks.is_empty() {
        let table = ticks_table(&ticks);
        let unpacked = sql::<DB>(
            "join packed process ticks with their identities",
            format!(
                "SELECT {} FROM {} JOIN gpus g ON g.id = p.gpu_id {PROCESS_JOINS}",
                process_cols(),
                DB::DIALECT.over(&table, "p")
            ),
        )
        .bind_table(table)
        .all(&mut *conn)
        .await?;
        if unpacked.len() != ticks.len() {
            return Err(StoreError::Corrupt(format!(
                "packed process ticks of GPU {}: a lifetime is missing",
                gpu.0
            )));
        }
        let items = unpacked.iter().map(|row| {
            let p = rows::process(row)?;
            Ok(((row.get("ts_ms")?, p.pid), p))
        });
        merged.packed(items.collect::<Result<Vec<_>, StoreError>>()?, |(t, _)| *t);
    }
    Ok(merged.take(limit).map(|((t, _), p)| (t, p)).collect())
}

/// The packed process ticks of energy ranges (`(GPU id, from_ms, to_ms)`, times in
/// `[from_ms, to_ms)`), as accounting reads them: `(range index, time, pid, process)`,
/// in no particular order. A tick's workload and type are its lifetime's, read once per
/// lifetime (a lifetime's identity never changes) and joined here: a join in SQL would
/// send every tick to the database and back.
pub(crate) async fn energy_processes<DB: Backend>(
    conn: &mut DB::Connection,
    ranges: &[(GpuId, UnixMs, UnixMs)],
) -> Result<Vec<(usize, UnixMs, u32, EnergyProcess)>, StoreError> {
    let table = Table::default()
        .int("req", 0..ranges.len() as i64)
        .int("id", ranges.iter().map(|r| r.0.0))
        .int("from_ms", ranges.iter().map(|r| r.1))
        .int("from_hour", ranges.iter().map(|r| hour_of(r.1)))
        .int("to_ms", ranges.iter().map(|r| r.2));
    let found = sql::<DB>(
        "find packed process minutes for energy",
        format!(
            "SELECT v.req, p.gpu_id, p.minute_ms, p.span_ms, p.packed FROM {} \
             JOIN packed_process_minutes p ON p.gpu_id = v.id AND p.minute_ms >= v.from_hour \
               AND p.minute_ms + p.span_ms > v.from_ms AND p.minute_ms < v.to_ms",
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    let mut ticks = Vec::new();
    for row in &found {
        let req = rows::request(row, ranges.len(), "packed energy read")?;
        let gpu: i64 = row.get("gpu_id")?;
        let span = Span::of(Tier::Process, gpu, row)?;
        let (_, from, to) = ranges[req];
        let value: Vec<u8> = row.get("packed")?;
        ticks.extend(
            (unpack_process(gpu, span, &value)?.into_iter())
                .filter(|t| (from..to).contains(&t.ts_ms))
                .map(|t| (req, t)),
        );
    }
    if ticks.is_empty() {
        return Ok(Vec::new());
    }
    let lives: BTreeSet<i64> = ticks.iter().map(|(_, t)| t.life_id).collect();
    let table = Table::default().int("id", lives.iter().copied());
    let found = sql::<DB>(
        "read the lifetimes of packed process ticks",
        format!(
            "SELECT l.id, l.workload_id, l.process_type FROM {} \
             JOIN process_lives l ON l.id = v.id",
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    let mut life: HashMap<i64, (i64, i64)> = HashMap::with_capacity(found.len());
    for row in &found {
        life.insert(
            row.get("id")?,
            (row.get("workload_id")?, row.get("process_type")?),
        );
    }
    (ticks.into_iter())
        .map(|(req, t)| {
            let &(workload, process_type) = life.get(&t.life_id).ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "packed process ticks: lifetime {} is missing",
                    t.life_id
                ))
            })?;
            let p = EnergyProcess {
                workload,
                sm_util_pct: t.sm_util_pct,
                gpu_mem_bytes: t.gpu_mem_bytes,
                compute: rows::is_compute(process_type),
            };
            Ok((req, t.ts_ms, t.pid, p))
        })
        .collect()
}

/// The minute values of `rows` (`minute_ms`, `span_ms`, `packed`), unpacked, by minute.
fn decode_packed<R: Get, T>(
    tier: Tier,
    id: i64,
    rows: &[R],
    unpack: impl Fn(Span, &[u8]) -> Result<Vec<T>, StoreError>,
) -> Result<HashMap<UnixMs, Vec<T>>, StoreError> {
    let mut out = HashMap::new();
    for row in rows {
        let span = Span::of(tier, id, row)?;
        if span.len == MINUTE_MS {
            out.insert(span.start, unpack(span, &row.get::<Vec<u8>>("packed")?)?);
        }
    }
    Ok(out)
}

/// A packed value to store: where it starts, and its bytes.
pub(super) type Value = (UnixMs, Vec<u8>);

/// The rows of series `id`'s packed `values` (oldest first, not overlapping; read with
/// `unpack`), packed again into one value per key of `group` (the minute or the hour of
/// their `time`), oldest first; `None` when one would be too large to pack.
#[allow(clippy::too_many_arguments)]
fn regroup_rows<T>(
    tier: Tier,
    id: i64,
    values: &[(Span, Vec<u8>)],
    unpack: impl Fn(Span, &[u8]) -> Result<Vec<T>, StoreError>,
    time: impl Fn(&T) -> UnixMs,
    group: fn(UnixMs) -> UnixMs,
    pack: fn(&[T]) -> Result<Vec<u8>, PackError>,
) -> Result<Option<Vec<Value>>, StoreError> {
    let mut groups: BTreeMap<UnixMs, Vec<T>> = BTreeMap::new();
    for (span, v) in values {
        for r in unpack(*span, v)? {
            groups.entry(group(time(&r))).or_default().push(r);
        }
    }
    let mut out = Vec::with_capacity(groups.len());
    for (start, rows) in groups {
        match pack(&rows) {
            Ok(v) => out.push((start, v)),
            Err(PackError::TooLarge(_)) => return Ok(None),
            Err(e) => return Err(corrupt(tier, id, start)(e)),
        }
    }
    Ok(Some(out))
}

/// [`regroup_rows`] of `tier`: into one value per minute (`group` = `minute_of`) or per
/// hour (`hour_of`).
fn regroup(
    tier: Tier,
    id: i64,
    values: &[(Span, Vec<u8>)],
    group: fn(UnixMs) -> UnixMs,
) -> Result<Option<Vec<Value>>, StoreError> {
    let (v, g) = (values, group);
    match tier {
        Tier::Host => {
            let unpack = |s, b: &[u8]| unpack_host(id, s, b);
            regroup_rows(tier, id, v, unpack, |r| r.time_ms, g, packed::host::pack)
        }
        Tier::Process => {
            let unpack = |s, b: &[u8]| unpack_process(id, s, b);
            regroup_rows(tier, id, v, unpack, |t| t.ts_ms, g, packed::process::pack)
        }
        Tier::Gpu => {
            let unpack = |s, b: &[u8]| unpack_gpu(id, s, b);
            regroup_rows(tier, id, v, unpack, |(t, _)| *t, g, packed::gpu::pack)
        }
    }
}

/// Inserts packed values of series `id` of `tier`, each `span_ms` long.
async fn insert_values<DB: Backend>(
    conn: &mut DB::Connection,
    tier: Tier,
    id: i64,
    span_ms: i64,
    values: &[Value],
) -> Result<(), StoreError> {
    for (start, value) in values {
        sql::<DB>(
            "store a packed value",
            format!(
                "INSERT INTO {} ({}, minute_ms, span_ms, packed) VALUES ($1, $2, $3, $4)",
                tier.packed(),
                tier.id()
            ),
        )
        .bind(id)
        .bind(*start)
        .bind(span_ms)
        .bind(value)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Splits series `id`'s hour-long value of `tier` that holds `at` after its start back
/// into minute values, so that what is behind `at` goes by whole values; in a write
/// transaction holding the series' lock. Returns whether there was one.
async fn split_hour<DB: Backend>(
    conn: &mut DB::Connection,
    tier: Tier,
    id: i64,
    at: UnixMs,
) -> Result<bool, StoreError> {
    let row = sql::<DB>(
        "read an hour-long packed value to split",
        format!(
            "SELECT minute_ms, span_ms, packed FROM {} WHERE {} = $1 AND minute_ms = $2 \
             AND minute_ms < $3 AND span_ms > {MINUTE_MS}",
            tier.packed(),
            tier.id()
        ),
    )
    .bind(id)
    .bind(hour_of(at))
    .bind(at)
    .optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(false);
    };
    let span = Span::of(tier, id, &row)?;
    let minutes = regroup(tier, id, &[(span, row.get("packed")?)], minute_of)?
        .ok_or_else(|| corrupt(tier, id, span.start)(PackError::TooLarge("a minute")))?;
    delete_value::<DB>(conn, tier, id, span.start).await?;
    insert_values::<DB>(conn, tier, id, MINUTE_MS, &minutes).await?;
    Ok(true)
}

/// Before retention deletes packed values behind a series' raw `horizon`: splits the
/// hour-long value that holds the horizon after its start back into minutes, for a node's
/// host rows or a GPU's process ticks (a GPU's samples are split by [`expire_packed_gpu`],
/// which keeps the newest before the horizon). Returns whether there was one.
pub(crate) async fn split_at_horizon<DB: Backend>(
    store: &SqlStore<DB>,
    kind: RollupKind,
    id: i64,
    horizon: UnixMs,
) -> Result<bool, StoreError> {
    let tier = match kind {
        RollupKind::Host => Tier::Host,
        RollupKind::Gpu => Tier::Process,
    };
    if hour_of(horizon) == horizon {
        return Ok(false);
    }
    // Most runs find none: looked for before a write transaction is taken.
    let found = sql::<DB>(
        "look for an hour-long packed value at the horizon",
        format!(
            "SELECT 1 AS found FROM {} WHERE {} = $1 AND minute_ms = $2 \
             AND span_ms > {MINUTE_MS}",
            tier.packed(),
            tier.id()
        ),
    )
    .bind(id)
    .bind(hour_of(horizon))
    .all(&mut *store.conn().await?)
    .await?;
    if found.is_empty() {
        return Ok(false);
    }
    let mut tx = store.begin_write("begin splitting packed hours").await?;
    lock::<DB>(tx.conn(), std::iter::once((tier, id))).await?;
    let split = split_hour::<DB>(tx.conn(), tier, id, horizon).await?;
    tx.commit("commit split packed hours").await?;
    Ok(split)
}

/// Packs the minutes of `rows` (by `time`) that `qualifies` admits (minute, rows), each
/// merged with its `earlier` packed rows, which win at the same `key`. Returns (minute,
/// value, rows of `rows` in it); a minute too large to pack stays in rows.
#[allow(clippy::too_many_arguments)]
fn pack_rows<T, K: Ord>(
    tier: Tier,
    id: i64,
    rows: Vec<T>,
    mut earlier: HashMap<UnixMs, Vec<T>>,
    key: impl Fn(&T) -> K,
    time: impl Fn(&T) -> UnixMs,
    pack: fn(&[T]) -> Result<Vec<u8>, PackError>,
    qualifies: impl Fn(UnixMs, usize) -> bool,
) -> Result<Vec<(UnixMs, Vec<u8>, u64)>, StoreError> {
    let mut minutes: BTreeMap<UnixMs, Vec<T>> = BTreeMap::new();
    for r in rows {
        minutes.entry(minute_of(time(&r))).or_default().push(r);
    }
    let mut out = Vec::new();
    for (minute, rows) in minutes {
        if !qualifies(minute, rows.len()) {
            continue;
        }
        let n = rows.len() as u64;
        let mut all: BTreeMap<K, T> = BTreeMap::new();
        for r in earlier.remove(&minute).into_iter().flatten().chain(rows) {
            all.entry(key(&r)).or_insert(r);
        }
        match pack(&all.into_values().collect::<Vec<T>>()) {
            Ok(v) => out.push((minute, v, n)),
            Err(PackError::TooLarge(_)) => {}
            Err(e) => return Err(corrupt(tier, id, minute)(e)),
        }
    }
    Ok(out)
}

/// The minutes of a span that may be packed, each with the number of rows it must hold
/// (`None`: any).
type Ready = HashMap<UnixMs, Option<i64>>;

impl<DB: Backend> SqlStore<DB> {
    /// Packs the closed minutes of every node's host rows and every GPU's process ticks
    /// and samples that end at or before `before_ms` (see the module docs for which
    /// minutes qualify), oldest first, at most about `budget` minutes per tier per call.
    pub(crate) async fn pack_minutes(
        &self,
        before_ms: UnixMs,
        budget: usize,
    ) -> Result<PackOutcome, StoreError> {
        let mut out = PackOutcome::default();
        // A GPU's process minute before its samples' (a GPU minute waits for its process
        // ticks: their readiness is judged against the GPU rows).
        for tier in [Tier::Host, Tier::Process, Tier::Gpu] {
            let (op, text) = match tier {
                Tier::Host => (
                    "list the nodes whose host rows may be packed",
                    "SELECT n.id, p.done_to_ms, \
                       (SELECT max(s.ts_ms) FROM host_samples s WHERE s.node_id = n.id) AS newest \
                     FROM nodes n JOIN rollup_progress p ON p.kind = 'host' AND p.id = n.id \
                     ORDER BY n.id",
                ),
                Tier::Process => (
                    "list the GPUs whose process ticks may be packed",
                    "SELECT g.id, e.done_to_ms, \
                       (SELECT max(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = g.id) AS newest \
                     FROM gpus g JOIN energy_progress e ON e.gpu_id = g.id ORDER BY g.id",
                ),
                Tier::Gpu => (
                    "list the GPUs whose samples may be packed",
                    "SELECT g.id, CASE WHEN e.done_to_ms < r.done_to_ms THEN e.done_to_ms \
                       ELSE r.done_to_ms END AS done_to_ms, \
                       (SELECT max(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = g.id) AS newest \
                     FROM gpus g JOIN energy_progress e ON e.gpu_id = g.id \
                     JOIN rollup_progress r ON r.kind = 'gpu' AND r.id = g.id ORDER BY g.id",
                ),
            };
            let series = sql::<DB>(op, text).all(&mut *self.conn().await?).await?;
            // A budget per tier: a fleet's host and process minutes must not starve its
            // GPU samples'.
            let mut tier_out = PackOutcome::default();
            for row in &series {
                let (id, done): (i64, UnixMs) = (row.get("id")?, row.get("done_to_ms")?);
                let Some(newest) = row.get::<Option<i64>>("newest")? else {
                    continue;
                };
                let limit = minute_of(before_ms).min(done).min(minute_of(newest));
                let mut from = UnixMs::MIN;
                while tier_out.minutes < budget {
                    let span = self.pack_span(tier, id, from, limit).await;
                    let Some((end, packed)) = skip_unreadable(span, tier.packed(), id)? else {
                        break;
                    };
                    tier_out.add(&packed);
                    from = end;
                }
            }
            out.add(&tier_out);
        }
        out.add(&self.merge_hours(before_ms, budget).await?);
        out.partitions_dropped = DB::drop_emptied_raw(self, minute_of(before_ms)).await?;
        Ok(out)
    }

    /// Merges the closed hours of every series' packed minutes into one value an hour
    /// long, oldest first, at most about `budget` minutes per tier: an hour that ends at
    /// or before `before_ms`, starts at or after the series' raw horizon (retention splits
    /// the hour holding it) and holds at least two minute values and no row of the tier
    /// (its minutes are all packed; a write into it splits it back into minutes).
    async fn merge_hours(
        &self,
        before_ms: UnixMs,
        budget: usize,
    ) -> Result<PackOutcome, StoreError> {
        let mut out = PackOutcome::default();
        for tier in [Tier::Host, Tier::Process, Tier::Gpu] {
            // The hours of minute values only (a partial index holds those), at or after
            // the series' horizon, oldest first.
            let found = sql::<DB>(
                "list the closed hours of packed minutes",
                format!(
                    "SELECT p.{id} AS id, p.minute_ms - p.minute_ms % {HOUR_MS} AS hour, \
                       count(*) AS n FROM {packed} p \
                     LEFT JOIN raw_horizon h ON h.kind = '{kind}' AND h.id = p.{id} \
                     WHERE p.span_ms = {MINUTE_MS} AND p.minute_ms < $1 \
                       AND (h.raw_from_ms IS NULL \
                         OR p.minute_ms - p.minute_ms % {HOUR_MS} >= h.raw_from_ms) \
                     GROUP BY p.{id}, p.minute_ms - p.minute_ms % {HOUR_MS} \
                     HAVING count(*) >= 2 ORDER BY hour, id LIMIT $2",
                    id = tier.id(),
                    packed = tier.packed(),
                    kind = tier.kind().as_str(),
                ),
            )
            .bind(hour_of(before_ms))
            .bind(i64::try_from(budget).unwrap_or(i64::MAX))
            .all(&mut *self.conn().await?)
            .await?;
            // Every hour tried counts against the budget, merged or not (one that cannot
            // be merged yet is tried again on a later pass).
            let mut tried = 0;
            for row in &found {
                let (id, hour, n): (i64, UnixMs, i64) =
                    (row.get("id")?, row.get("hour")?, row.get("n")?);
                if tried >= budget {
                    break;
                }
                tried += usize::try_from(n).unwrap_or(usize::MAX);
                let hour_out = self.merge_hour(tier, id, hour).await.map(Some);
                if let Some(m) = skip_unreadable(hour_out, tier.packed(), id)? {
                    out.transactions += 1;
                    out.hours += usize::from(m > 0);
                }
            }
        }
        Ok(out)
    }

    /// One transaction of [`SqlStore::merge_hours`]: merges the minute values of series
    /// `id`'s `hour` of `tier` into one, once checked under the series' lock. Returns the
    /// minute values merged (0: the hour does not qualify any more).
    async fn merge_hour(&self, tier: Tier, id: i64, hour: UnixMs) -> Result<usize, StoreError> {
        let end = hour.saturating_add(HOUR_MS);
        let mut tx = self.begin_write("begin merging a packed hour").await?;
        lock::<DB>(tx.conn(), std::iter::once((tier, id))).await?;
        let horizon: Option<UnixMs> = sql::<DB>(
            "read a raw horizon",
            "SELECT raw_from_ms FROM raw_horizon WHERE kind = $1 AND id = $2",
        )
        .bind(tier.kind().as_str())
        .bind(id)
        .optional(tx.conn())
        .await?
        .map(|row| row.get("raw_from_ms"))
        .transpose()?;
        let in_hour = |op, text: String| sql::<DB>(op, text).bind(id).bind(hour).bind(end);
        let (rows, packed, key) = (tier.rows(), tier.packed(), tier.id());
        let rows = in_hour(
            "look for rows in a packed hour",
            format!("SELECT 1 AS found FROM {rows} WHERE {key} = $1 AND ts_ms >= $2 AND ts_ms < $3 LIMIT 1"),
        )
        .all(tx.conn())
        .await?;
        let values = in_hour(
            "read the packed minutes of an hour",
            format!(
                "SELECT minute_ms, span_ms, packed FROM {packed} WHERE {key} = $1 \
                 AND minute_ms >= $2 AND minute_ms < $3 ORDER BY minute_ms"
            ),
        )
        .all(tx.conn())
        .await?;
        let mut minutes = Vec::with_capacity(values.len());
        for row in &values {
            minutes.push((Span::of(tier, id, row)?, row.get::<Vec<u8>>("packed")?));
        }
        let qualifies = horizon.is_none_or(|h| hour >= h)
            && rows.is_empty()
            && minutes.len() >= 2
            && minutes.iter().all(|(span, _)| span.len == MINUTE_MS);
        let value = match qualifies {
            true => regroup(tier, id, &minutes, hour_of)?,
            false => None,
        };
        let Some(merged @ [_]) = value.as_deref() else {
            tx.rollback().await?;
            return Ok(0);
        };
        let deleted = in_hour(
            "delete the merged packed minutes",
            format!("DELETE FROM {packed} WHERE {key} = $1 AND minute_ms >= $2 AND minute_ms < $3"),
        )
        .execute(tx.conn())
        .await?;
        if deleted != minutes.len() as u64 {
            return Err(StoreError::Corrupt(format!(
                "{}: {deleted} values of {id} in hour {hour} deleted, {} merged",
                tier.packed(),
                minutes.len()
            )));
        }
        insert_values::<DB>(tx.conn(), tier, id, HOUR_MS, merged).await?;
        tx.commit("commit a merged packed hour").await?;
        Ok(minutes.len())
    }

    /// One transaction of [`SqlStore::pack_minutes`]: packs what qualifies of the series'
    /// oldest unpacked minutes at or after `from` (at most [`SPAN_MINUTES`], all before
    /// `limit`). Returns where the span ended and what was packed; `None` when no rows are
    /// left before `limit`.
    async fn pack_span(
        &self,
        tier: Tier,
        id: i64,
        from: UnixMs,
        limit: UnixMs,
    ) -> Result<Option<(UnixMs, PackOutcome)>, StoreError> {
        let mut tx = self.begin_write("begin packing minutes").await?;
        lock::<DB>(tx.conn(), std::iter::once((tier, id))).await?;
        let first: Option<i64> = sql::<DB>(
            "find the oldest unpacked row",
            format!(
                "SELECT min(ts_ms) AS first FROM {} WHERE {} = $1 AND ts_ms >= $2",
                tier.rows(),
                tier.id()
            ),
        )
        .bind(id)
        .bind(from)
        .one(tx.conn())
        .await?
        .get("first")?;
        let Some(start) = first.map(minute_of).filter(|&m| m < limit) else {
            tx.rollback().await?;
            return Ok(None);
        };
        let end = start.saturating_add(SPAN_MINUTES * MINUTE_MS).min(limit);
        let read = |op, text: String| sql::<DB>(op, text).bind(id).bind(start).bind(end);
        // The minutes that may be packed, with the number of rows each must hold (host:
        // the rollup's count; process: any, once the energy minute counts the GPU
        // samples the minute holds now; GPU: the count its rollup and energy minutes
        // agree on, once no process row is left in it). A rollup minute counts in either
        // form: a write that changed nothing (a replay, a conflict) reopens a raw minute
        // under a packed rollup hour.
        let ready: Ready = match tier {
            Tier::Host => {
                let key = RollupKey::host(NodeId(id));
                let counts = rollup_hours::counts::<DB>(tx.conn(), key, start, end).await?;
                counts.into_iter().map(|(m, n)| (m, Some(n))).collect()
            }
            Tier::Process => {
                let text = format!(
                    "SELECT e.minute_ms FROM energy_gpu_minutes e \
                     WHERE e.gpu_id = $1 AND e.minute_ms >= $2 AND e.minute_ms < $3 \
                       AND e.samples = (SELECT count(*) FROM gpu_samples s \
                         WHERE s.gpu_id = e.gpu_id \
                           AND s.ts_ms >= e.minute_ms AND s.ts_ms < e.minute_ms + {MINUTE_MS})"
                );
                let rows = read("read which minutes may be packed", text)
                    .all(tx.conn())
                    .await?;
                (rows.iter())
                    .map(|row| Ok((row.get("minute_ms")?, None)))
                    .collect::<Result<_, StoreError>>()?
            }
            Tier::Gpu => {
                let key = RollupKey::gpu(GpuId(id));
                let rollup = rollup_hours::counts::<DB>(tx.conn(), key, start, end).await?;
                let text = format!(
                    "SELECT e.minute_ms, CAST(e.samples AS BIGINT) AS n FROM energy_gpu_minutes e \
                     WHERE e.gpu_id = $1 AND e.minute_ms >= $2 AND e.minute_ms < $3 \
                       AND NOT EXISTS (SELECT 1 FROM process_samples p WHERE p.gpu_id = e.gpu_id \
                         AND p.ts_ms >= e.minute_ms AND p.ts_ms < e.minute_ms + {MINUTE_MS})"
                );
                let mut ready = Ready::new();
                for row in &read("read which minutes may be packed", text)
                    .all(tx.conn())
                    .await?
                {
                    let (minute, n): (UnixMs, i64) = (row.get("minute_ms")?, row.get("n")?);
                    if rollup.get(&minute) == Some(&n) {
                        ready.insert(minute, Some(n));
                    }
                }
                ready
            }
        };
        let qualifies = |minute: UnixMs, rows: usize| match ready.get(&minute) {
            Some(Some(want)) => i64::try_from(rows).ok() == Some(*want),
            Some(None) => true,
            None => false,
        };
        let (order, uuid) = match tier {
            Tier::Host => ("ts_ms", ""),
            Tier::Process => ("ts_ms, pid", ""),
            // Read as GPU samples are; the UUID is not packed.
            Tier::Gpu => ("ts_ms", "'' AS gpu_uuid, "),
        };
        let stored = read(
            "read rows to pack",
            format!(
                "SELECT {uuid}* FROM {} WHERE {} = $1 AND ts_ms >= $2 AND ts_ms < $3 \
                 ORDER BY {order}",
                tier.rows(),
                tier.id()
            ),
        )
        .all(tx.conn())
        .await?;
        let earlier = sql::<DB>(
            "read packed minutes to merge",
            format!(
                "SELECT minute_ms, span_ms, packed FROM {} WHERE {} = $1 AND minute_ms >= $2 \
                 AND minute_ms < $3 AND (minute_ms >= $4 OR span_ms > {MINUTE_MS})",
                tier.packed(),
                tier.id()
            ),
        )
        .bind(id)
        .bind(hour_of(start))
        .bind(end)
        .bind(start)
        .all(tx.conn())
        .await?;
        // A write into an hour-long value splits it back into minutes first, so its hour
        // holds no rows; were it to, they stay rows rather than make a minute's value in
        // its place.
        let mut hours = Vec::new();
        for row in &earlier {
            let span = Span::of(tier, id, row)?;
            if span.len != MINUTE_MS {
                hours.push(span);
            }
        }
        let qualifies = |minute: UnixMs, rows: usize| {
            !hours.iter().any(|h| h.contains(minute)) && qualifies(minute, rows)
        };
        // Only a minute that agrees with what was computed from it: one with late rows is
        // recomputed first.
        let values = match tier {
            Tier::Host => pack_rows(
                tier,
                id,
                stored.iter().map(rows::host).collect::<Result<_, _>>()?,
                decode_packed(tier, id, &earlier, |m, v| unpack_host(id, m, v))?,
                |r| r.time_ms,
                |r| r.time_ms,
                packed::host::pack,
                qualifies,
            )?,
            Tier::Process => pack_rows(
                tier,
                id,
                stored.iter().map(process_tick).collect::<Result<_, _>>()?,
                decode_packed(tier, id, &earlier, |m, v| unpack_process(id, m, v))?,
                |t| (t.ts_ms, t.pid),
                |t| t.ts_ms,
                packed::process::pack,
                qualifies,
            )?,
            Tier::Gpu => pack_rows(
                tier,
                id,
                (stored.iter())
                    .map(|row| Ok((row.get("ts_ms")?, rows::gpu_sample(row)?)))
                    .collect::<Result<_, StoreError>>()?,
                decode_packed(tier, id, &earlier, |m, v| unpack_gpu(id, m, v))?,
                |(t, _)| *t,
                |(t, _)| *t,
                packed::gpu::pack,
                qualifies,
            )?,
        };
        let mut out = PackOutcome {
            transactions: 1,
            ..PackOutcome::default()
        };
        for (minute, value, n) in values {
            sql::<DB>(
                "store a packed minute",
                format!(
                    "INSERT INTO {} ({}, minute_ms, packed) VALUES ($1, $2, $3) \
                     ON CONFLICT ({}, minute_ms) DO UPDATE SET packed = excluded.packed",
                    tier.packed(),
                    tier.id(),
                    tier.id()
                ),
            )
            .bind(id)
            .bind(minute)
            .bind(&value)
            .execute(tx.conn())
            .await?;
            let moved = sql::<DB>(
                "delete packed rows",
                format!(
                    "DELETE FROM {} WHERE {} = $1 AND ts_ms >= $2 AND ts_ms < $3",
                    tier.rows(),
                    tier.id()
                ),
            )
            .bind(id)
            .bind(minute)
            .bind(minute + MINUTE_MS)
            .execute(tx.conn())
            .await?;
            if moved != n {
                return Err(StoreError::Corrupt(format!(
                    "{}: {moved} rows of {id} at minute {minute} deleted, {n} packed",
                    tier.rows()
                )));
            }
            out.minutes += 1;
            out.rows += moved;
        }
        tx.commit("commit packed minutes").await?;
        Ok(Some((end, out)))
    }
}
