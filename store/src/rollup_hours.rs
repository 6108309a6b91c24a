//! The packed tier of rollups: closed hours of a GPU's `gpu_minutes` rows or a node's
//! `host_minutes` rows, kept as one value per series per hour (`packed_gpu_rollup_hours`,
//! `packed_host_rollup_hours`; the format of [`packed::rollup`]). Rollups are kept far
//! longer than raw samples (`--retain-rollups`, 400 days by default), and an hour of a
//! GPU's minutes packed takes a few percent of its rows.
//!
//! - **Packing** ([`SqlStore::pack_rollup_hours`], run with the raw tiers' packing): an
//!   hour is packed once it ends at or before the caller's horizon and the series' rollup
//!   watermark, and no raw row of the series is left in it (its raw minutes are packed or
//!   expired, so only late data recomputes its minutes). Its rows leave their table in the
//!   same transaction.
//! - **Reopening** ([`reopen`], first thing in [`super::RollupStore::replace_rollups`]):
//!   recomputing a minute unpacks its hour back into rows first, so a minute is in one
//!   form at a time. The hour is packed again later.
//! - **Reading** ([`minutes`], [`bucket_sums`]): rows and packed hours of a range, merged,
//!   in one read snapshot.
//! - **Retention** ([`expire`]): hours wholly before the cutoff go; the hour holding the
//!   cutoff keeps its minutes from the cutoff on.
//!
//! On PostgreSQL the packer, a recomputation and retention take the series' advisory
//! lock: the rollup job runs once across collectors, but its lease is not a fence.

use super::backend::{Backend, Get, sql};
use super::merge::{Merged, Prefer};
use super::packed::{self, PackError, rollup::RollupRow, rollup::Stats};
use super::rollup::kinds::{MetricStats, RollupKey, RollupKind, RollupMinute, Spec, spec};
use super::series::{HourCodec, PackOutcome};
use super::{SqlStore, StoreError, TimeRange};
use gpufleet_core::UnixMs;
use gpufleet_core::times::minute_of;
use std::collections::BTreeMap;

/// One packed value's span, and the hour a time falls in.
pub(crate) use gpufleet_core::times::{HOUR_MS, hour_of};

/// The packed table of a kind of series.
pub(crate) fn table(kind: RollupKind) -> &'static str {
    kind.series().packed
}

/// Takes `key`'s lock for the rest of the transaction (PostgreSQL).
pub(crate) async fn lock<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
) -> Result<(), StoreError> {
    key.kind.series().lock::<DB>(conn, [key.id]).await
}

fn corrupt(key: RollupKey, hour: UnixMs) -> impl FnOnce(PackError) -> StoreError {
    key.kind.series().corrupt(key.id, hour)
}

/// A rollup row as stored (see [`packed::rollup`] for how min and max are kept).
fn stored_row<R: Get>(row: &R, s: &Spec) -> Result<RollupRow, StoreError> {
    let count = |name: &str| -> Result<u32, StoreError> {
        let v: i64 = row.get(name)?;
        u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{name} {v}")))
    };
    let mut metrics = Vec::with_capacity(s.cols.len());
    for &(c, real) in &s.cols {
        let bits = |suffix: &str| -> Result<Option<u64>, StoreError> {
            let name = format!("{c}_{suffix}");
            Ok(if real {
                row.get::<Option<f64>>(&name)?.map(f64::to_bits)
            } else {
                row.get::<Option<i64>>(&name)?.map(|v| v as u64)
            })
        };
        metrics.push(Stats {
            n: count(&format!("{c}_n"))?,
            avg: row.get(&format!("{c}_avg"))?,
            min: bits("min")?,
            max: bits("max")?,
        });
    }
    Ok(RollupRow {
        minute_ms: row.get("minute_ms")?,
        samples: count("samples")?,
        metrics,
    })
}

/// What the API reads of a stored rollup row.
pub(crate) fn minute(r: &RollupRow, s: &Spec) -> RollupMinute {
    let metrics = (r.metrics.iter().zip(&s.cols))
        .map(|(m, &(_, real))| {
            let value = |b: u64| if real { f64::from_bits(b) } else { b as f64 };
            MetricStats {
                n: m.n,
                avg: m.avg,
                min: m.min.map(value),
                max: m.max.map(value),
            }
        })
        .collect();
    RollupMinute {
        minute_ms: r.minute_ms,
        samples: r.samples,
        metrics,
    }
}

/// A packed hour's minutes, checked to lie in it: all metrics of the series' shape, or
/// only those at `wanted`. Metrics the series gained after the hour was packed are absent.
fn unpack(
    key: RollupKey,
    hour: UnixMs,
    value: &[u8],
    wanted: Option<&[usize]>,
) -> Result<Vec<RollupRow>, StoreError> {
    let all: Vec<usize>;
    let wanted = match wanted {
        Some(w) => w,
        None => {
            all = (0..spec(key.kind).cols.len()).collect();
            &all
        }
    };
    let rows = packed::rollup::unpack_metrics(value, wanted).map_err(corrupt(key, hour))?;
    let width = wanted.len();
    if rows
        .iter()
        .any(|r| hour_of(r.minute_ms) != hour || r.metrics.len() != width)
    {
        return Err(StoreError::Unreadable(format!(
            "{} of {}, hour {hour}: a minute of another hour or shape",
            table(key.kind),
            key.id
        )));
    }
    Ok(rows)
}

/// The rollup rows of `key` with minutes in `[from, to)`, oldest first.
async fn stored_rows<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    from: UnixMs,
    to: UnixMs,
) -> Result<Vec<RollupRow>, StoreError> {
    let s = spec(key.kind);
    let rows = sql::<DB>(
        "read rollup minutes",
        format!(
            "SELECT * FROM {} WHERE {} = $1 AND minute_ms >= $2 AND minute_ms < $3 \
             ORDER BY minute_ms",
            s.minutes, s.id
        ),
    )
    .bind(key.id)
    .bind(from)
    .bind(to)
    .all(conn)
    .await?;
    rows.iter().map(|r| stored_row(r, &s)).collect()
}

/// `key`'s packed hours that start in `[from, to)`, oldest first, unpacked.
async fn packed_hours<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    from: UnixMs,
    to: UnixMs,
) -> Result<Vec<(UnixMs, Vec<RollupRow>)>, StoreError> {
    let values = key
        .kind
        .series()
        .values::<DB>(conn, key.id, (from, to), None);
    (values.await?)
        .into_iter()
        .map(|(hour, value)| Ok((hour, unpack(key, hour, &value, None)?)))
        .collect()
}

/// The sample counts of `key`'s rollup minutes in `[from, to)`, rows and packed hours.
pub(crate) async fn counts<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    from: UnixMs,
    to: UnixMs,
) -> Result<BTreeMap<UnixMs, i64>, StoreError> {
    let s = spec(key.kind);
    let rows = sql::<DB>(
        "read rollup counts",
        format!(
            "SELECT minute_ms, CAST(samples AS BIGINT) AS n FROM {} \
             WHERE {} = $1 AND minute_ms >= $2 AND minute_ms < $3",
            s.minutes, s.id
        ),
    )
    .bind(key.id)
    .bind(from)
    .bind(to)
    .all(&mut *conn)
    .await?;
    let mut out = BTreeMap::new();
    for row in &rows {
        out.insert(row.get("minute_ms")?, row.get("n")?);
    }
    for (_, hour) in packed_hours::<DB>(conn, key, hour_of(from), to).await? {
        for r in hour
            .into_iter()
            .filter(|r| (from..to).contains(&r.minute_ms))
        {
            out.entry(r.minute_ms).or_insert(i64::from(r.samples));
        }
    }
    Ok(out)
}

/// Inserts `rows` into `key`'s rollup table (a row already there stays).
async fn insert_rows<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    rows: &[RollupRow],
) -> Result<(), StoreError> {
    let s = spec(key.kind);
    let mut names = vec![format!("{}, minute_ms, samples", s.id)];
    let mut params = vec!["$1, $2, CAST($3 AS INTEGER)".to_owned()];
    for (i, &(c, _)) in s.cols.iter().enumerate() {
        let p = 4 + 4 * i;
        names.push(format!("{c}_n, {c}_avg, {c}_min, {c}_max"));
        params.push(format!(
            "CAST(${p} AS INTEGER), ${}, ${}, ${}",
            p + 1,
            p + 2,
            p + 3
        ));
    }
    let text = format!(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}, minute_ms) DO NOTHING",
        s.minutes,
        names.join(", "),
        params.join(", "),
        s.id
    );
    for r in rows {
        let mut q = sql::<DB>("reopen rollup minutes", text.clone())
            .bind(key.id)
            .bind(r.minute_ms)
            .bind(i64::from(r.samples));
        for (m, &(_, real)) in r.metrics.iter().zip(&s.cols) {
            q = q.bind(i64::from(m.n)).bind(m.avg);
            for v in [m.min, m.max] {
                q = if real {
                    q.bind(v.map(f64::from_bits))
                } else {
                    q.bind(v.map(|b| b as i64))
                };
            }
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}

/// Unpacks back into rows every packed hour of `key` that `[from, to)` touches (inside a
/// write transaction holding `key`'s lock). Returns the hours reopened.
pub(crate) async fn reopen<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    from: UnixMs,
    to: UnixMs,
) -> Result<usize, StoreError> {
    let hours = packed_hours::<DB>(conn, key, hour_of(from), to).await?;
    for (hour, rows) in &hours {
        insert_rows::<DB>(conn, key, rows).await?;
        delete_hour::<DB>(conn, key, *hour).await?;
    }
    Ok(hours.len())
}

async fn delete_hour<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    hour: UnixMs,
) -> Result<(), StoreError> {
    let span = (hour, hour.saturating_add(1));
    key.kind
        .series()
        .delete_values::<DB>(conn, key.id, span)
        .await?;
    Ok(())
}

/// The stored rollup minutes of `key` with starts in `range`, oldest first: rows and
/// packed hours merged.
pub(crate) async fn minutes<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    range: TimeRange,
) -> Result<Vec<RollupMinute>, StoreError> {
    let s = spec(key.kind);
    let to = range.to_ms.saturating_add(1);
    let mut merged = Merged::new(range, Prefer::Rows);
    let rows = stored_rows::<DB>(conn, key, range.from_ms, to).await?;
    merged.rows(rows.into_iter().map(|r| (r.minute_ms, r)));
    for (_, rows) in packed_hours::<DB>(conn, key, hour_of(range.from_ms), to).await? {
        merged.packed(rows.into_iter().map(|r| (r.minute_ms, r)), |t| *t);
    }
    Ok(merged
        .take(usize::MAX)
        .map(|(_, r)| minute(&r, &s))
        .collect())
}

/// Per bucket start, per column: the sum of `avg × n` over the minutes that had the
/// metric (`None`: none had it) and the sum of `n`.
pub(crate) type BucketSums = BTreeMap<UnixMs, Vec<(Option<f64>, i64)>>;

/// Adds the packed minutes of `key` in `[from, to]` to `sums` (bucket `(minute / step) ×
/// step`), columns `cols` (indexes into the series' metrics), reading hours in order and
/// stopping once more than `limit` buckets are known (the first `limit` are complete: a
/// later hour adds only to the last bucket or later ones).
pub(crate) async fn bucket_sums<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    cols: &[usize],
    (from, to): (UnixMs, UnixMs),
    step_ms: i64,
    limit: usize,
    sums: &mut BucketSums,
) -> Result<(), StoreError> {
    const PAGE: i64 = 48;
    let s = spec(key.kind);
    let mut next = hour_of(from);
    // Distinct buckets seen so far, across pages: a bucket may span many of them.
    let (mut packed_buckets, mut last_bucket) = (0usize, None);
    while next <= to && packed_buckets <= limit {
        let page = sql::<DB>(
            "read packed rollup hours",
            format!(
                "SELECT hour_ms, packed FROM {} WHERE {} = $1 AND hour_ms >= $2 \
                 AND hour_ms <= $3 ORDER BY hour_ms LIMIT $4",
                table(key.kind),
                s.id
            ),
        )
        .bind(key.id)
        .bind(next)
        .bind(to)
        .bind(PAGE)
        .all(&mut *conn)
        .await?;
        for row in &page {
            let hour: UnixMs = row.get("hour_ms")?;
            let value = row.get::<Vec<u8>>("packed")?;
            for r in unpack(key, hour, &value, Some(cols))? {
                if r.minute_ms < from || r.minute_ms > to {
                    continue;
                }
                let t = (r.minute_ms / step_ms) * step_ms;
                if last_bucket != Some(t) {
                    packed_buckets += 1;
                    last_bucket = Some(t);
                }
                let cells = sums.entry(t).or_insert_with(|| vec![(None, 0); cols.len()]);
                for (cell, m) in cells.iter_mut().zip(&r.metrics) {
                    if let Some(avg) = m.avg {
                        cell.0 = Some(cell.0.unwrap_or(0.0) + avg * f64::from(m.n));
                    }
                    cell.1 += i64::from(m.n);
                }
            }
            next = hour.saturating_add(HOUR_MS);
        }
        if page.len() < PAGE as usize {
            break;
        }
    }
    Ok(())
}

/// Deletes `key`'s packed rollup minutes before `cutoff` (a minute start): whole hours
/// before its hour, and the minutes before it of the hour holding it. Returns the hours
/// deleted or rewritten, `None` if there was nothing to look at (no transaction ran).
pub(crate) async fn expire<DB: Backend>(
    store: &SqlStore<DB>,
    key: RollupKey,
    cutoff: UnixMs,
) -> Result<Option<u64>, StoreError> {
    let unpack = |_: i64, hour: UnixMs, value: &[u8]| unpack(key, hour, value, None);
    let codec = HourCodec::new(unpack, packed::rollup::pack, |r: &RollupRow| r.minute_ms);
    key.kind
        .series()
        .expire_hours(store, key.id, cutoff, codec)
        .await
}

/// Whether a raw row of `key`'s series is in the hour starting at `hour`.
async fn raw_left<DB: Backend>(
    conn: &mut DB::Connection,
    key: RollupKey,
    hour: UnixMs,
) -> Result<bool, StoreError> {
    let s = spec(key.kind);
    let row = sql::<DB>(
        "look for raw rows in a rollup hour",
        format!(
            "SELECT ts_ms FROM {} WHERE {} = $1 AND ts_ms >= $2 AND ts_ms < $3 LIMIT 1",
            s.raw, s.id
        ),
    )
    .bind(key.id)
    .bind(hour)
    .bind(hour.saturating_add(HOUR_MS))
    .optional(conn)
    .await?;
    Ok(row.is_some())
}

impl<DB: Backend> SqlStore<DB> {
    /// Packs the closed rollup hours of every GPU and node that end at or before
    /// `before_ms` and the series' rollup watermark and hold no raw row of the series,
    /// each series' oldest first (passing over hours that must wait), at most `budget`
    /// hours per kind per call (one transaction each).
    pub(crate) async fn pack_rollup_hours(
        &self,
        before_ms: UnixMs,
        budget: usize,
    ) -> Result<PackOutcome, StoreError> {
        let mut out = PackOutcome::default();
        for kind in [RollupKind::Gpu, RollupKind::Host] {
            let series = sql::<DB>(
                "list the series whose rollup minutes may be packed",
                "SELECT id, done_to_ms FROM rollup_progress WHERE kind = $1 ORDER BY id",
            )
            .bind(kind.as_str())
            .all(&mut *self.conn().await?)
            .await?;
            let (mut hours, mut passed_over) = (0, 0);
            for row in &series {
                let key = RollupKey {
                    kind,
                    id: row.get("id")?,
                };
                let done: UnixMs = row.get("done_to_ms")?;
                let limit = minute_of(before_ms).min(done);
                let mut from = UnixMs::MIN;
                // Hours passed over (raw rows still in them, or a value that cannot be
                // read) cost the budget nothing: a series' backlog would otherwise spend it
                // on every pass and starve the series after it. Each series may pass over
                // one; more come out of a second allowance of `budget` per kind, and at
                // most a day of them per series.
                let mut passed = 0;
                while hours < budget {
                    match self.pack_hour(key, from, limit).await? {
                        Some(HourStep::Packed(end, packed)) => {
                            hours += 1;
                            out.rollup_minutes += packed.rollup_minutes;
                            out.transactions += packed.transactions;
                            from = end;
                        }
                        Some(HourStep::Unpackable(end)) => {
                            hours += 1;
                            from = end;
                        }
                        Some(HourStep::Passed(end)) => {
                            passed += 1;
                            if passed > 1 {
                                passed_over += 1;
                            }
                            if passed >= HOURS_PASSED_PER_SERIES || passed_over >= budget {
                                break;
                            }
                            from = end;
                        }
                        None => break,
                    }
                }
            }
        }
        Ok(out)
    }

    /// One transaction of [`SqlStore::pack_rollup_hours`]: packs the hour holding `key`'s
    /// oldest rollup row at or after `from`, if it ends by `limit` and no raw row of the
    /// series is left in it. `None` when no such hour is left.
    async fn pack_hour(
        &self,
        key: RollupKey,
        from: UnixMs,
        limit: UnixMs,
    ) -> Result<Option<HourStep>, StoreError> {
        let s = spec(key.kind);
        // Which hour, and whether its raw minutes are all packed, read before taking a turn
        // to write: most calls find nothing to pack.
        let first: Option<i64> = sql::<DB>(
            "find the oldest rollup row",
            format!(
                "SELECT min(minute_ms) AS first FROM {} WHERE {} = $1 AND minute_ms >= $2",
                s.minutes, s.id
            ),
        )
        .bind(key.id)
        .bind(from)
        .one(&mut *self.conn().await?)
        .await?
        .get("first")?;
        let Some(hour) = first
            .map(hour_of)
            .filter(|h| h.saturating_add(HOUR_MS) <= limit)
        else {
            return Ok(None);
        };
        let end = hour.saturating_add(HOUR_MS);
        if raw_left::<DB>(&mut *self.conn().await?, key, hour).await? {
            return Ok(Some(HourStep::Passed(end)));
        }
        match self.pack_found_hour(key, hour, end).await {
            Err(StoreError::Unreadable(e)) => {
                tracing::warn!(table = table(key.kind), id = key.id, hour_ms = hour, error = %e,
                    "a packed rollup hour cannot be read: it is left as it is");
                Ok(Some(HourStep::Passed(end)))
            }
            other => other.map(Some),
        }
    }

    /// The transaction of [`SqlStore::pack_hour`], for the hour `[hour, end)`.
    async fn pack_found_hour(
        &self,
        key: RollupKey,
        hour: UnixMs,
        end: UnixMs,
    ) -> Result<HourStep, StoreError> {
        let s = spec(key.kind);
        let mut tx = self.begin_write("begin packing rollup minutes").await?;
        lock::<DB>(tx.conn(), key).await?;
        // A write may have reopened one of the hour's raw minutes since.
        if raw_left::<DB>(tx.conn(), key, hour).await? {
            tx.rollback().await?;
            return Ok(HourStep::Passed(end));
        }
        let rows = stored_rows::<DB>(tx.conn(), key, hour, end).await?;
        let n = rows.len();
        // Retention may have deleted them since they were found.
        if n == 0 {
            tx.rollback().await?;
            return Ok(HourStep::Unpackable(end));
        }
        let unpack = |_: i64, at: UnixMs, value: &[u8]| unpack(key, at, value, None);
        let codec = HourCodec::new(unpack, packed::rollup::pack, |r: &RollupRow| r.minute_ms);
        let series = key.kind.series();
        let packed = (series.pack_into_hour::<DB, _, _, _>(
            tx.conn(),
            key.id,
            hour,
            rows,
            &codec,
            Prefer::Rows,
        ))
        .await?;
        if !packed {
            tx.rollback().await?;
            return Ok(HourStep::Unpackable(end));
        }
        let moved = sql::<DB>(
            "delete packed rollup rows",
            format!(
                "DELETE FROM {} WHERE {} = $1 AND minute_ms >= $2 AND minute_ms < $3",
                s.minutes, s.id
            ),
        )
        .bind(key.id)
        .bind(hour)
        .bind(end)
        .execute(tx.conn())
        .await?;
        if moved != n as u64 {
            return Err(StoreError::Corrupt(format!(
                "{}: {moved} rows of {} in hour {hour} deleted, {} packed",
                s.minutes, key.id, n
            )));
        }
        tx.commit("commit a packed rollup hour").await?;
        let out = PackOutcome {
            rollup_minutes: n,
            transactions: 1,
            ..PackOutcome::default()
        };
        Ok(HourStep::Packed(end, out))
    }
}

/// What [`SqlStore::pack_hour`] did with the hour it found.
enum HourStep {
    /// Packed; the hour ends at the time given.
    Packed(UnixMs, PackOutcome),
    /// Left as rows for good (the hour ends at the time given): its minutes do not fit a
    /// packed value, or they are gone.
    Unpackable(UnixMs),
    /// Passed over for now (the hour ends at the time given): raw rows of the series are
    /// still in it, or its packed value cannot be read.
    Passed(UnixMs),
}

/// Most hours [`SqlStore::pack_rollup_hours`] passes over per series per call.
const HOURS_PASSED_PER_SERIES: usize = 24;

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::times::MINUTE_MS;

    #[test]
    fn hours_start_on_the_hour() {
        assert_eq!(hour_of(0), 0);
        assert_eq!(hour_of(HOUR_MS - 1), 0);
        assert_eq!(hour_of(HOUR_MS), HOUR_MS);
        assert_eq!(hour_of(-1), -HOUR_MS);
        assert_eq!(hour_of(i64::MIN), i64::MIN);
        assert_eq!(hour_of(i64::MAX) % HOUR_MS, 0);
        assert_eq!(hour_of(1_700_000_123_456) % HOUR_MS, 0);
        assert_eq!(MINUTE_MS * 60, HOUR_MS);
    }

    #[test]
    fn an_hour_packed_before_a_metric_was_added_reads_it_as_absent() {
        let key = RollupKey::gpu(super::super::GpuId(7));
        let hour = 100 * HOUR_MS;
        let stats = |n: u32| Stats {
            n,
            avg: Some(f64::from(n)),
            min: Some(1),
            max: Some(u64::from(n)),
        };
        // An hour of a series that had three metrics then.
        let rows: Vec<RollupRow> = (0..3)
            .map(|i| RollupRow {
                minute_ms: hour + i * MINUTE_MS,
                samples: 60,
                metrics: vec![stats(1), stats(2), stats(3)],
            })
            .collect();
        let value = packed::rollup::pack(&rows).expect("packs");
        let width = spec(key.kind).cols.len();
        assert!(width > 3);
        let read = unpack(key, hour, &value, None).expect("reads");
        assert_eq!(read.len(), 3);
        for (r, packed) in read.iter().zip(&rows) {
            assert_eq!(&r.metrics[..3], &packed.metrics[..]);
            assert!(r.metrics[3..].iter().all(|s| *s == Stats::default()));
            assert_eq!(r.metrics.len(), width);
        }
        let chart = unpack(key, hour, &value, Some(&[width - 1, 2])).expect("reads");
        assert_eq!(chart[0].metrics, vec![Stats::default(), stats(3)]);
        // A value from another hour is refused.
        assert!(unpack(key, hour + HOUR_MS, &value, None).is_err());
    }
}
