//! Every packed table of the store, described once: where its rows and its packed values
//! live, what a value spans, which lock guards a series, and when a value goes back to
//! rows. The packers, readers and retention of [`packing`](super::packing),
//! [`rollup_hours`](super::rollup_hours) and [`health_hours`](super::health_hours) take
//! table names, lock names and corrupt-value errors from here, so a table is named in one
//! place; reading, storing and deleting values, packing an hour's rows into its value and
//! the retention of hour-long values are written here once, over the description and the
//! table's [`HourCodec`]. Range reads merge both forms through [`merge`](super::merge).
//!
//! | series | rows | packed | id | a value spans | lock | reopened |
//! |---|---|---|---|---|---|---|
//! | a node's host rows | `host_samples` | `packed_host_minutes` | `node_id` | a minute, or a merged hour | `host:ID` | by a write into it |
//! | a GPU's process ticks | `process_samples` | `packed_process_minutes` | `gpu_id` | a minute, or a merged hour | `gpu:ID` | by a write into it |
//! | a GPU's samples | `gpu_samples` | `packed_gpu_minutes` | `gpu_id` | a minute, or a merged hour | `gpu:ID` | by a write into it |
//! | a GPU's rollup minutes | `gpu_minutes` | `packed_gpu_rollup_hours` | `gpu_id` | an hour | `rollup-gpu:ID` | by a recomputation |
//! | a node's rollup minutes | `host_minutes` | `packed_host_rollup_hours` | `node_id` | an hour | `rollup-host:ID` | by a recomputation |
//! | a GPU's health readings | `gpu_health` | `packed_gpu_health_hours` | `gpu_id` | an hour | `health:ID` | never: late readings stay rows |
//!
//! A GPU's process ticks and samples share one lock: a write reopens both. Each table's
//! codec is the [`packed`](super::packed) module of the same name, typed at its readers.

use super::backend::{Backend, Dialect, Get, Table, sql};
use super::merge::{Merged, Prefer};
use super::packed::PackError;
use super::{SqlStore, StoreError, TimeRange};
use gpufleet_core::UnixMs;
use gpufleet_core::times::{HOUR_MS, hour_of};
use std::collections::BTreeSet;

/// What one packed value spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpanRule {
    /// A minute (`minute_ms`); a closed hour of packed minutes merges into one value an
    /// hour long (`span_ms`).
    MinuteOrHour,
    /// An hour (`hour_ms`).
    Hour,
}

/// One packed table and the row table it packs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Series {
    /// The row table.
    pub rows: &'static str,
    /// The packed table.
    pub packed: &'static str,
    /// The column naming the series (node or GPU) in both tables.
    pub id: &'static str,
    pub span: SpanRule,
    /// The lock's name before `:ID`.
    pub lock: &'static str,
}

pub(crate) const HOST: Series = Series {
    rows: "host_samples",
    packed: "packed_host_minutes",
    id: "node_id",
    span: SpanRule::MinuteOrHour,
    lock: "host",
};

pub(crate) const PROCESS: Series = Series {
    rows: "process_samples",
    packed: "packed_process_minutes",
    id: "gpu_id",
    span: SpanRule::MinuteOrHour,
    lock: "gpu",
};

pub(crate) const GPU: Series = Series {
    rows: "gpu_samples",
    packed: "packed_gpu_minutes",
    id: "gpu_id",
    span: SpanRule::MinuteOrHour,
    lock: "gpu",
};

pub(crate) const GPU_ROLLUP: Series = Series {
    rows: "gpu_minutes",
    packed: "packed_gpu_rollup_hours",
    id: "gpu_id",
    span: SpanRule::Hour,
    lock: "rollup-gpu",
};

pub(crate) const HOST_ROLLUP: Series = Series {
    rows: "host_minutes",
    packed: "packed_host_rollup_hours",
    id: "node_id",
    span: SpanRule::Hour,
    lock: "rollup-host",
};

pub(crate) const HEALTH: Series = Series {
    rows: "gpu_health",
    packed: "packed_gpu_health_hours",
    id: "gpu_id",
    span: SpanRule::Hour,
    lock: "health",
};

/// What a packing call did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackOutcome {
    /// Minutes of raw rows packed (or merged into their packed value).
    pub minutes: usize,
    /// Closed hours of packed minutes merged into one value an hour long.
    pub hours: usize,
    /// Rollup minutes packed into their series' hour (or merged into it).
    pub rollup_minutes: usize,
    /// GPU health readings packed into their GPU's hour (or merged into it).
    pub health_readings: usize,
    /// Rows moved out of the raw row tables.
    pub rows: u64,
    /// Transactions committed.
    pub transactions: usize,
    /// Raw partitions packing emptied, dropped (PostgreSQL).
    pub partitions_dropped: Vec<String>,
}

impl PackOutcome {
    pub(crate) fn add(&mut self, other: &PackOutcome) {
        self.minutes += other.minutes;
        self.hours += other.hours;
        self.rows += other.rows;
        self.transactions += other.transactions;
    }
}

/// Every packed table.
#[cfg(test)]
pub(crate) const ALL: [&Series; 6] = [&HOST, &PROCESS, &GPU, &GPU_ROLLUP, &HOST_ROLLUP, &HEALTH];

impl Series {
    /// The packed table's time column.
    pub(crate) fn packed_time(&self) -> &'static str {
        match self.span {
            SpanRule::MinuteOrHour => "minute_ms",
            SpanRule::Hour => "hour_ms",
        }
    }

    /// The name of the lock that guards series `id`'s packed values.
    pub(crate) fn lock_name(&self, id: i64) -> String {
        format!("{}:{id}", self.lock)
    }

    /// Takes the locks of series `ids` for the rest of the transaction (PostgreSQL).
    pub(crate) async fn lock<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        ids: impl IntoIterator<Item = i64>,
    ) -> Result<(), StoreError> {
        lock_names::<DB>(conn, ids.into_iter().map(|id| self.lock_name(id)).collect()).await
    }

    /// The error of a value of series `id` starting at `at` that does not decode.
    pub(crate) fn corrupt(
        &'static self,
        id: i64,
        at: UnixMs,
    ) -> impl FnOnce(PackError) -> StoreError {
        move |e| self.unreadable(id, at, &e.to_string())
    }

    /// A value of series `id` starting at `at` that decodes but cannot be right.
    pub(crate) fn unreadable(&self, id: i64, at: UnixMs, why: &str) -> StoreError {
        let unit = match self.span {
            SpanRule::MinuteOrHour => "minute",
            SpanRule::Hour => "hour",
        };
        StoreError::Unreadable(format!("{} of {id}, {unit} {at}: {why}", self.packed))
    }
}

/// Reads, stores and deletes packed values of series with one value per hour.
impl Series {
    /// Series `id`'s packed values starting in `[from, to)`, oldest first, at most `limit`.
    pub(crate) async fn values<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        id: i64,
        (from, to): (UnixMs, UnixMs),
        limit: Option<i64>,
    ) -> Result<Vec<(UnixMs, Vec<u8>)>, StoreError> {
        let (time, table, key) = (self.packed_time(), self.packed, self.id);
        let rows = sql::<DB>(
            "read packed values",
            format!(
                "SELECT {time}, packed FROM {table} WHERE {key} = $1 AND {time} >= $2 \
                 AND {time} < $3 ORDER BY {time} LIMIT $4"
            ),
        )
        .bind(id)
        .bind(from)
        .bind(to)
        .bind(limit.unwrap_or(i64::MAX))
        .all(conn)
        .await?;
        rows.iter()
            .map(|r| Ok((r.get(time)?, r.get::<Vec<u8>>("packed")?)))
            .collect()
    }

    /// Stores series `id`'s value starting at `at`, replacing one there.
    pub(crate) async fn store_value<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        id: i64,
        at: UnixMs,
        value: &[u8],
    ) -> Result<(), StoreError> {
        let (time, table, key) = (self.packed_time(), self.packed, self.id);
        sql::<DB>(
            "store a packed value",
            format!(
                "INSERT INTO {table} ({key}, {time}, packed) VALUES ($1, $2, $3) \
                 ON CONFLICT ({key}, {time}) DO UPDATE SET packed = excluded.packed"
            ),
        )
        .bind(id)
        .bind(at)
        .bind(value)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Deletes series `id`'s values starting in `[from, to)`; returns how many.
    pub(crate) async fn delete_values<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        id: i64,
        (from, to): (UnixMs, UnixMs),
    ) -> Result<u64, StoreError> {
        let (time, table, key) = (self.packed_time(), self.packed, self.id);
        sql::<DB>(
            "delete packed values",
            format!("DELETE FROM {table} WHERE {key} = $1 AND {time} >= $2 AND {time} < $3"),
        )
        .bind(id)
        .bind(from)
        .bind(to)
        .execute(conn)
        .await
    }
}

/// How the items of an hour-long packed value are decoded, encoded and dated.
pub(crate) struct HourCodec<T, U, P> {
    /// A value of series `id` starting at `hour`, decoded and checked to lie in it.
    pub unpack: U,
    pub pack: P,
    pub time: fn(&T) -> UnixMs,
    pub _items: std::marker::PhantomData<T>,
}

impl<T, U, P> HourCodec<T, U, P>
where
    U: Fn(i64, UnixMs, &[u8]) -> Result<Vec<T>, StoreError>,
    P: Fn(&[T]) -> Result<Vec<u8>, PackError>,
{
    pub(crate) fn new(unpack: U, pack: P, time: fn(&T) -> UnixMs) -> Self {
        HourCodec {
            unpack,
            pack,
            time,
            _items: std::marker::PhantomData,
        }
    }
}

impl Series {
    /// Inside a write holding series `id`'s lock: packs `rows` (the rows of the hour
    /// starting at `hour`, as read) into the hour's value, merged with what it holds
    /// already under the table's rule for a time held in both forms, and stores it.
    /// `Ok(false)` when they do not fit one value: the rows stay rows. Deleting the rows
    /// is the caller's, which knows how to check it deletes what it packed.
    pub(crate) async fn pack_into_hour<DB: Backend, T, U, P>(
        &'static self,
        conn: &mut DB::Connection,
        id: i64,
        hour: UnixMs,
        rows: Vec<T>,
        codec: &HourCodec<T, U, P>,
        prefer: Prefer,
    ) -> Result<bool, StoreError>
    where
        U: Fn(i64, UnixMs, &[u8]) -> Result<Vec<T>, StoreError>,
        P: Fn(&[T]) -> Result<Vec<u8>, PackError>,
    {
        let range = TimeRange {
            from_ms: hour,
            to_ms: hour.saturating_add(HOUR_MS - 1),
        };
        let mut all = Merged::new(range, prefer);
        all.rows(rows.into_iter().map(|r| ((codec.time)(&r), r)));
        let span = (hour, hour.saturating_add(1));
        for (at, value) in self.values::<DB>(&mut *conn, id, span, Some(1)).await? {
            all.packed(
                (codec.unpack)(id, at, &value)?
                    .into_iter()
                    .map(|r| ((codec.time)(&r), r)),
                |t| *t,
            );
        }
        let items: Vec<T> = all.take(usize::MAX).map(|(_, r)| r).collect();
        let value = match (codec.pack)(&items) {
            Ok(v) => v,
            Err(PackError::TooLarge(_)) => return Ok(false),
            Err(e) => return Err(self.corrupt(id, hour)(e)),
        };
        self.store_value::<DB>(conn, id, hour, &value).await?;
        Ok(true)
    }

    /// Retention of series `id`'s hour-long packed values: deletes the items before
    /// `cutoff`, whole values before the hour holding it and, in that hour's value, the
    /// items before it (the value packed again, or deleted when nothing is left), in one
    /// transaction under the series' lock. Returns the values deleted or rewritten; `None`
    /// when nothing was there to expire (looked for before taking a turn to write, as
    /// most runs find nothing).
    pub(crate) async fn expire_hours<DB: Backend, T: Clone, U, P>(
        &'static self,
        store: &SqlStore<DB>,
        id: i64,
        cutoff: UnixMs,
        codec: HourCodec<T, U, P>,
    ) -> Result<Option<u64>, StoreError>
    where
        U: Fn(i64, UnixMs, &[u8]) -> Result<Vec<T>, StoreError>,
        P: Fn(&[T]) -> Result<Vec<u8>, PackError>,
    {
        let hour = hour_of(cutoff);
        let cut_hour = (hour, hour.saturating_add(1));
        let older = self
            .values::<DB>(&mut *store.conn().await?, id, (UnixMs::MIN, hour), Some(1))
            .await?;
        let mut due = !older.is_empty();
        if !due {
            // An unreadable value is an error here too, as it is in the transaction below:
            // retention reports it instead of passing over it in silence.
            let mut conn = store.conn().await?;
            for (at, value) in self.values::<DB>(&mut conn, id, cut_hour, Some(1)).await? {
                let items = (codec.unpack)(id, at, &value)?;
                due = items.first().is_some_and(|i| (codec.time)(i) < cutoff);
            }
        }
        if !due {
            return Ok(None);
        }
        let mut tx = store.begin_write("begin expiring packed hours").await?;
        self.lock::<DB>(tx.conn(), [id]).await?;
        let mut changed = self
            .delete_values::<DB>(tx.conn(), id, (UnixMs::MIN, hour))
            .await?;
        for (at, value) in self.values::<DB>(tx.conn(), id, cut_hour, Some(1)).await? {
            let items = (codec.unpack)(id, at, &value)?;
            let kept: Vec<T> = (items.iter())
                .filter(|i| (codec.time)(i) >= cutoff)
                .cloned()
                .collect();
            if kept.len() == items.len() {
                continue;
            }
            changed += 1;
            if kept.is_empty() {
                self.delete_values::<DB>(tx.conn(), id, cut_hour).await?;
            } else {
                let value = (codec.pack)(&kept).map_err(self.corrupt(id, at))?;
                self.store_value::<DB>(tx.conn(), id, at, &value).await?;
            }
        }
        tx.commit("commit expired packed hours").await?;
        Ok(Some(changed))
    }
}

/// Takes the locks named `names` (PostgreSQL transaction-scoped advisory locks of this
/// schema, in name order, so that writers never wait for each other in a cycle) for the
/// rest of the transaction; nothing on SQLite, which has one writer.
pub(crate) async fn lock_names<DB: Backend>(
    conn: &mut DB::Connection,
    names: BTreeSet<String>,
) -> Result<(), StoreError> {
    if DB::DIALECT != Dialect::Postgres || names.is_empty() {
        return Ok(());
    }
    let table = Table::default().text("k", names);
    sql::<DB>(
        "take the packing locks",
        format!(
            "SELECT pg_advisory_xact_lock(hashtextextended( \
               'gpufleet:' || current_schema() || ':packed ' || s.k, 0)) \
             FROM (SELECT v.k FROM {} ORDER BY v.k) s",
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteStore;

    /// The columns of `table` in a freshly migrated in-memory SQLite store.
    async fn columns(store: &SqliteStore, table: &str) -> BTreeSet<String> {
        let mut conn = store.conn().await.expect("a connection");
        let rows = sql::<sqlx::Sqlite>(
            "read a table's columns",
            format!("PRAGMA table_info({table})"),
        )
        .all(&mut *conn)
        .await
        .expect("table_info");
        rows.iter()
            .map(|r| r.get::<String>("name").expect("a column name"))
            .collect()
    }

    #[tokio::test]
    async fn every_description_names_the_migrated_tables_and_columns() {
        let store = SqliteStore::open("sqlite::memory:").await.expect("opens");
        for s in ALL {
            let rows = columns(&store, s.rows).await;
            assert!(
                rows.contains(s.id),
                "{}: {} missing in {rows:?}",
                s.rows,
                s.id
            );
            let packed = columns(&store, s.packed).await;
            let mut wanted = vec![s.id, s.packed_time(), "packed"];
            if s.span == SpanRule::MinuteOrHour {
                wanted.push("span_ms");
            }
            for c in wanted {
                assert!(
                    packed.contains(c),
                    "{}: {c} missing in {packed:?}",
                    s.packed
                );
            }
        }
    }

    #[test]
    fn tables_are_described_once_and_only_a_gpus_raw_tiers_share_a_lock() {
        let packed: BTreeSet<_> = ALL.iter().map(|s| s.packed).collect();
        let rows: BTreeSet<_> = ALL.iter().map(|s| s.rows).collect();
        assert_eq!((packed.len(), rows.len()), (ALL.len(), ALL.len()));
        let locks: BTreeSet<_> = ALL.iter().map(|s| s.lock_name(7)).collect();
        assert_eq!(locks.len(), ALL.len() - 1);
        assert_eq!(PROCESS.lock_name(7), GPU.lock_name(7));
        assert_eq!(HOST_ROLLUP.lock_name(3), "rollup-host:3");
        assert_eq!(
            HEALTH.unreadable(4, 3_600_000, "empty").to_string(),
            StoreError::Unreadable("packed_gpu_health_hours of 4, hour 3600000: empty".into())
                .to_string()
        );
    }

    /// Retention over hour-long values, on the health tier: three hours of readings, the
    /// cutoff inside the second.
    #[tokio::test]
    async fn expiring_hours_deletes_older_values_and_trims_the_cutoffs_hour() {
        use crate::packed::health;
        use gpufleet_core::GpuHealthSample;
        let store = SqliteStore::open("sqlite::memory:").await.expect("opens");
        let hour = 3_600_000;
        let reading = |t: UnixMs| (t, GpuHealthSample::default());
        for h in 1..=3 {
            let readings: Vec<_> = (0..4).map(|k| reading(h * hour + k * 900_000)).collect();
            let value = health::pack(&readings).expect("packs");
            let mut conn = store.conn().await.expect("a connection");
            HEALTH
                .store_value::<sqlx::Sqlite>(&mut conn, 9, h * hour, &value)
                .await
                .expect("stores");
        }
        let codec = || {
            let unpack = |_: i64, _: UnixMs, v: &[u8]| {
                health::unpack(v).map_err(|e| StoreError::Unreadable(e.to_string()))
            };
            HourCodec::new(unpack, health::pack, |r: &(UnixMs, GpuHealthSample)| r.0)
        };
        let cutoff = 2 * hour + 1_800_000;
        let changed = HEALTH
            .expire_hours(&store, 9, cutoff, codec())
            .await
            .expect("expires");
        assert_eq!(changed, Some(2), "hour 1 deleted, hour 2 trimmed");
        let mut conn = store.conn().await.expect("a connection");
        let left = HEALTH
            .values::<sqlx::Sqlite>(&mut conn, 9, (UnixMs::MIN, UnixMs::MAX), None)
            .await
            .expect("reads");
        drop(conn);
        let times: Vec<Vec<UnixMs>> = left
            .iter()
            .map(|(_, v)| {
                health::unpack(v)
                    .expect("unpacks")
                    .iter()
                    .map(|r| r.0)
                    .collect()
            })
            .collect();
        assert_eq!(
            times,
            [
                vec![cutoff, cutoff + 900_000],
                (0..4).map(|k| 3 * hour + k * 900_000).collect()
            ]
        );
        // Nothing left before the cutoff: no transaction.
        assert_eq!(
            HEALTH
                .expire_hours(&store, 9, cutoff, codec())
                .await
                .expect("expires"),
            None
        );
        // Another series is untouched by this one's retention.
        assert_eq!(
            HEALTH
                .expire_hours(&store, 8, cutoff, codec())
                .await
                .expect("expires"),
            None
        );
    }
}
