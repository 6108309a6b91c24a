//! The packed tier of GPU health: closed hours of a GPU's `gpu_health` rows kept as one
//! value per GPU per hour (`packed_gpu_health_hours`; the format of [`packed::health`]).
//! The agent reads health every 30 s and the counters rarely change: on PostgreSQL a
//! reading as a row costs about 170 bytes, an hour of them packed a few dozen.
//!
//! - **Packing** ([`SqlStore::pack_health_hours`], run with the raw tiers' packing): an
//!   hour is packed once it ends at or before the caller's horizon and the GPU has a
//!   reading after it, so the GPU's newest reading is always a row (it seeds the live
//!   state, [`super::FleetReads::latest_gpu_health`]). Its rows leave their table in the
//!   same transaction.
//! - **Late readings** are written as rows, as any other: a reading into a packed hour
//!   stays a row until the next pass packs it in. A time held both packed and as a row
//!   reads as the packed reading, the one written first (a second insert of a stored time
//!   changes nothing), and packing keeps it. Health feeds no rollup or energy minute, so
//!   nothing has to be recomputed and a write never reopens an hour.
//! - **Reading** ([`readings`]): rows and packed hours of a range, merged, in one read
//!   snapshot.
//! - **Retention** ([`newest_before`], [`expire`]): a GPU keeps its newest reading before
//!   the raw horizon; packed hours before its hour go, and the hour holding it keeps the
//!   readings from it on.
//!
//! On PostgreSQL the packer and retention take the GPU's advisory lock, as both rewrite
//! packed values; a writer adds rows only, and a packing transaction commits only if the
//! rows it deletes are the rows it packed.

use super::backend::{Backend, Get, sql};
use super::merge::{Merged, Prefer};
use super::packed::{self, PackError};
use super::rows::gpu_uuid;
use super::rows::{self, HEALTH_COLS, limit_i64};
use super::series::PackOutcome;
use super::series::{HEALTH, HourCodec};
use super::{GpuId, SqlStore, StoreError, TimeRange};
use gpufleet_core::times::{HOUR_MS, hour_of};
use gpufleet_core::{GpuHealthSample, UnixMs};

pub(crate) const TABLE: &str = HEALTH.packed;

/// Takes `gpu`'s health packing lock for the rest of the transaction (PostgreSQL).
async fn lock<DB: Backend>(conn: &mut DB::Connection, gpu: i64) -> Result<(), StoreError> {
    HEALTH.lock::<DB>(conn, [gpu]).await
}

fn corrupt(gpu: i64, hour: UnixMs) -> impl FnOnce(PackError) -> StoreError {
    HEALTH.corrupt(gpu, hour)
}

/// A packed hour's readings, checked to lie in it.
fn unpack(
    gpu: i64,
    hour: UnixMs,
    value: &[u8],
) -> Result<Vec<(UnixMs, GpuHealthSample)>, StoreError> {
    let readings = packed::health::unpack(value).map_err(corrupt(gpu, hour))?;
    if readings.is_empty() || readings.iter().any(|(t, _)| hour_of(*t) != hour) {
        return Err(HEALTH.unreadable(gpu, hour, "empty, or a reading of another hour"));
    }
    Ok(readings)
}

/// `gpu`'s packed hours that start in `[from, to]`, oldest first, at most `limit`,
/// unpacked.
async fn packed_hours<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: i64,
    (from, to): (UnixMs, UnixMs),
    limit: i64,
) -> Result<Vec<(UnixMs, Vec<(UnixMs, GpuHealthSample)>)>, StoreError> {
    let span = (from, to.saturating_add(1));
    (HEALTH.values::<DB>(conn, gpu, span, Some(limit)).await?)
        .into_iter()
        .map(|(hour, value)| Ok((hour, unpack(gpu, hour, &value)?)))
        .collect()
}

/// `gpu`'s health rows with times in `[from, to]`, oldest first, at most `limit`.
async fn stored_rows<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: i64,
    (from, to): (UnixMs, UnixMs),
    limit: i64,
) -> Result<Vec<(UnixMs, GpuHealthSample)>, StoreError> {
    let rows = sql::<DB>(
        "read GPU health samples",
        format!(
            "SELECT {HEALTH_COLS} FROM gpu_health h JOIN gpus g ON g.id = h.gpu_id \
             WHERE h.gpu_id = $1 AND h.ts_ms BETWEEN $2 AND $3 ORDER BY h.ts_ms LIMIT $4"
        ),
    )
    .bind(gpu)
    .bind(from)
    .bind(to)
    .bind(limit)
    .all(conn)
    .await?;
    rows.iter()
        .map(|r| Ok((r.get("ts_ms")?, rows::health(r)?)))
        .collect()
}

/// `gpu`'s health readings with times in `range` (both ends included), oldest first, at
/// most `limit`: rows and packed hours merged, the packed reading where both hold a time.
pub(crate) async fn readings<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    range: TimeRange,
    limit: usize,
) -> Result<Vec<(UnixMs, GpuHealthSample)>, StoreError> {
    let span = (range.from_ms, range.to_ms);
    let rows = stored_rows::<DB>(conn, gpu.0, span, limit_i64(limit)).await?;
    // Every hour but the first and the last lies wholly in the range and holds a reading:
    // `limit` + 2 hours hold the first `limit` packed readings of the range.
    let hours_from = hour_of(range.from_ms);
    let hours = limit_i64(limit).saturating_add(2);
    let packed = packed_hours::<DB>(conn, gpu.0, (hours_from, range.to_ms), hours).await?;
    if packed.is_empty() {
        return Ok(rows);
    }
    let uuid = gpu_uuid::<DB>(conn, gpu).await?;
    let mut merged = Merged::new(range, Prefer::Packed);
    merged.rows(rows);
    let named = packed.into_iter().flat_map(|(_, r)| r).map(|(t, mut h)| {
        h.gpu_uuid.clone_from(&uuid);
        (t, h)
    });
    merged.packed(named, |t| *t);
    Ok(merged.take(limit).collect())
}

/// The time of `gpu`'s newest health reading before `before`, row or packed.
pub(crate) async fn newest_before<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: i64,
    before: UnixMs,
) -> Result<Option<UnixMs>, StoreError> {
    let row: Option<UnixMs> = sql::<DB>(
        "find the health row before a raw horizon",
        "SELECT max(ts_ms) AS t FROM gpu_health WHERE gpu_id = $1 AND ts_ms < $2",
    )
    .bind(gpu)
    .bind(before)
    .one(&mut *conn)
    .await?
    .get("t")?;
    // The hour holding `before` may have no reading before it; every reading of the hour
    // before that one is.
    let hours = sql::<DB>(
        "find the packed health hours before a raw horizon",
        format!(
            "SELECT hour_ms, packed FROM {TABLE} WHERE gpu_id = $1 AND hour_ms < $2 \
             ORDER BY hour_ms DESC LIMIT 2"
        ),
    )
    .bind(gpu)
    .bind(before)
    .all(conn)
    .await?;
    let mut packed = None;
    for r in &hours {
        let hour: UnixMs = r.get("hour_ms")?;
        let readings = unpack(gpu, hour, &r.get::<Vec<u8>>("packed")?)?;
        packed = readings
            .iter()
            .map(|(t, _)| *t)
            .filter(|t| *t < before)
            .max();
        if packed.is_some() {
            break;
        }
    }
    Ok(row.max(packed))
}

/// Deletes `gpu`'s packed readings before `keep` (a reading's time): whole hours before
/// its hour, and the readings before it of the hour holding it. Returns the hours deleted
/// or rewritten, `None` if there was nothing to look at (no transaction ran).
pub(crate) async fn expire<DB: Backend>(
    store: &SqlStore<DB>,
    gpu: i64,
    keep: UnixMs,
) -> Result<Option<u64>, StoreError> {
    let codec = HourCodec::new(unpack, packed::health::pack, |r: &(UnixMs, _)| r.0);
    HEALTH.expire_hours(store, gpu, keep, codec).await
}

/// Most hours [`SqlStore::pack_health_hours`] passes over per GPU per call.
const HOURS_PASSED_PER_GPU: usize = 24;

/// What [`SqlStore::pack_health_hour`] did with the hour it was given.
enum HourStep {
    /// Packed, with the rows moved.
    Packed(usize),
    /// Nothing packed: no row left in it, too many to pack, or rows written meanwhile
    /// (packed by a later pass).
    Left,
}

impl<DB: Backend> SqlStore<DB> {
    /// Packs the closed hours of every GPU's health rows that end at or before `before_ms`
    /// and before the GPU's newest reading, each GPU's oldest first, at most `budget`
    /// hours packed per call (one transaction each).
    pub(crate) async fn pack_health_hours(
        &self,
        before_ms: UnixMs,
        budget: usize,
    ) -> Result<PackOutcome, StoreError> {
        let mut out = PackOutcome::default();
        // Each GPU's oldest and newest row (two index lookups per GPU), read before taking
        // a turn to write: most GPUs have nothing to pack.
        let gpus = sql::<DB>(
            "list the GPUs whose health may be packed",
            "SELECT g.id, \
               (SELECT min(h.ts_ms) FROM gpu_health h WHERE h.gpu_id = g.id) AS oldest, \
               (SELECT max(h.ts_ms) FROM gpu_health h WHERE h.gpu_id = g.id) AS newest \
             FROM gpus g ORDER BY g.id",
        )
        .all(&mut *self.conn().await?)
        .await?;
        // Hours left as they are (an unreadable value, too many readings, rows changed
        // meanwhile) cost the budget nothing, as in the rollup tier: else a GPU stuck on
        // them would spend it on every pass and starve the GPUs after it. They come out
        // of a second allowance of `budget`, at most a day of them per GPU.
        let (mut hours, mut passed_over) = (0, 0);
        for row in &gpus {
            let (Some(oldest), Some(newest)) = (
                row.get::<Option<UnixMs>>("oldest")?,
                row.get::<Option<UnixMs>>("newest")?,
            ) else {
                continue;
            };
            let gpu: i64 = row.get("id")?;
            let limit = before_ms.min(newest);
            let (mut from, mut passed) = (oldest, 0);
            while hours < budget && passed_over < budget && passed < HOURS_PASSED_PER_GPU {
                let hour = hour_of(from);
                let end = hour.saturating_add(HOUR_MS);
                if end > limit {
                    break;
                }
                match self.pack_health_hour(gpu, hour).await {
                    Ok(HourStep::Packed(n)) => {
                        hours += 1;
                        out.health_readings += n;
                        out.transactions += 1;
                    }
                    Ok(HourStep::Left) => {
                        passed += 1;
                        passed_over += 1;
                    }
                    Err(StoreError::Unreadable(e)) => {
                        passed += 1;
                        passed_over += 1;
                        tracing::warn!(table = TABLE, gpu, hour_ms = hour, error = %e,
                            "a packed health hour cannot be read: it is left as it is");
                    }
                    Err(e) => return Err(e),
                }
                // The next hour holding a row.
                let next: Option<UnixMs> = sql::<DB>(
                    "find the next health row",
                    "SELECT min(ts_ms) AS t FROM gpu_health WHERE gpu_id = $1 AND ts_ms >= $2",
                )
                .bind(gpu)
                .bind(end)
                .one(&mut *self.conn().await?)
                .await?
                .get("t")?;
                match next {
                    Some(t) => from = t,
                    None => break,
                }
            }
        }
        Ok(out)
    }

    /// One transaction of [`SqlStore::pack_health_hours`]: packs `gpu`'s health rows of
    /// the hour starting at `hour` into its packed value (merged with what it holds).
    async fn pack_health_hour(&self, gpu: i64, hour: UnixMs) -> Result<HourStep, StoreError> {
        let end = hour.saturating_add(HOUR_MS);
        let mut tx = self.begin_write("begin packing health rows").await?;
        lock::<DB>(tx.conn(), gpu).await?;
        // More than a packed value holds are left as rows, and not read whole.
        let most = limit_i64(packed::MAX_ROWS).saturating_add(1);
        let rows = stored_rows::<DB>(tx.conn(), gpu, (hour, end - 1), most).await?;
        let n = rows.len();
        // Retention may have deleted them since they were found.
        if n == 0 || n > packed::MAX_ROWS {
            tx.rollback().await?;
            return Ok(HourStep::Left);
        }
        let read: Vec<UnixMs> = rows.iter().map(|(t, _)| *t).collect();
        let codec = HourCodec::new(unpack, packed::health::pack, |r: &(UnixMs, _)| r.0);
        // A time held both as a row and packed keeps its packed reading (module docs).
        let packed = (HEALTH.pack_into_hour::<DB, _, _, _>(
            tx.conn(),
            gpu,
            hour,
            rows,
            &codec,
            Prefer::Packed,
        ))
        .await?;
        if !packed {
            tx.rollback().await?;
            return Ok(HourStep::Left);
        }
        let moved = sql::<DB>(
            "delete packed health rows",
            "DELETE FROM gpu_health WHERE gpu_id = $1 AND ts_ms >= $2 AND ts_ms < $3 \
             RETURNING ts_ms",
        )
        .bind(gpu)
        .bind(hour)
        .bind(end)
        .all(tx.conn())
        .await?;
        let mut moved = moved
            .iter()
            .map(|r| r.get::<UnixMs>("ts_ms"))
            .collect::<Result<Vec<_>, _>>()?;
        moved.sort_unstable();
        // The rows deleted must be the rows packed. On PostgreSQL another transaction may
        // have committed since they were read: a writer's late reading (it would go
        // unpacked) or another collector's retention. The next pass packs the hour as it
        // is then.
        if moved != read {
            tx.rollback().await?;
            return Ok(HourStep::Left);
        }
        tx.commit("commit a packed health hour").await?;
        Ok(HourStep::Packed(n))
    }
}
