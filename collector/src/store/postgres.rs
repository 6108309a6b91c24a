//! The PostgreSQL store: the same behaviour as [`super::sqlite`] (the store contract tests
//! run against both), for sites that run PostgreSQL already and want several collectors
//! on one database.
//!
//! Write path: one transaction per [`Store::write_batches`] call, one statement per table.
//! Rows go in as arrays, one array per column (`INSERT ... SELECT * FROM UNNEST($1::int8[],
//! ...) ON CONFLICT DO NOTHING`), so a group commit of any size is a handful of round trips
//! and the statements' prepared forms never change.
//!
//! The raw sample tables are partitioned by UTC day (`<table>_pYYYYMMDD`). Partitions are
//! created ahead: today's and tomorrow's at open and by any write on a new day, and any
//! other day's before the first write that needs it, each under a transaction-scoped advisory lock so collectors racing
//! to create the same day wait for each other instead of failing. The days known to exist
//! are cached; a write that finds a partition missing anyway (another collector dropped
//! it) clears the cache and is redone once. [`PgStore::drop_raw_before`] is retention:
//! whole partitions are dropped, never rows deleted.

use super::{
    AgentTokenRecord, BatchConflict, GpuId, GpuMetric, GpuRecord, HostRow, LatestGpu, LatestHost,
    NodeBatch, NodeId, NodeRecord, Rehomed, SeriesPoint, Store, StoreError, TimeRange,
    WriteOutcome, decode_nvlinks, encode_nvlinks, redact_url,
};
use async_trait::async_trait;
use gpufleet_core::wire::HelloInfo;
use gpufleet_core::{
    DeliveryStats, Event, EventKind, GpuInfo, GpuSample, HostInfo, HostSample, Inventory,
    MigInstance, ProcessSample, ProcessType, UnixMs, Workload, WorkloadKind,
};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Postgres, Row, SqlSafeStr};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tracing::debug;

mod carbon;
mod energy;
mod follow;
mod rollup;

/// The migrations, embedded; numbered as the SQLite ones so later migrations line up.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../../migrations/postgres/0001_init.sql"),
    ),
    (
        6,
        "energy",
        include_str!("../../../migrations/postgres/0006_energy.sql"),
    ),
    (
        9,
        "agent tokens",
        include_str!("../../../migrations/postgres/0009_agent_tokens.sql"),
    ),
    (
        10,
        "carbon",
        include_str!("../../../migrations/postgres/0010_carbon.sql"),
    ),
    (
        11,
        "rollups",
        include_str!("../../../migrations/postgres/0011_rollups.sql"),
    ),
    (
        20,
        "energy split",
        include_str!("../../../migrations/postgres/0020_energy_split.sql"),
    ),
];

/// One UTC day in ms: the span of one raw partition.
pub const DAY_MS: i64 = 86_400_000;
/// The partitioned raw tables, all partitioned alike.
pub const RAW_TABLES: [&str; 3] = ["gpu_samples", "process_samples", "host_samples"];
/// Workload ids kept in memory (as in SQLite).
const WORKLOAD_CACHE_MAX: usize = 50_000;
/// Connections: the writer holds one, HTTP readers and background jobs the rest.
const MAX_CONNECTIONS: u32 = 8;

/// The PostgreSQL implementation of [`Store`].
#[derive(Debug)]
pub struct PgStore {
    pool: PgPool,
    /// Workload id per workload; only committed ids enter it (see SQLite's).
    workloads: Mutex<HashMap<Workload, i64>>,
    /// UTC days (`ts_ms.div_euclid(DAY_MS)`) whose partitions exist in every raw table, so
    /// the write path asks the database only for days it has not seen.
    days: Mutex<HashSet<i64>>,
}

/// One partition of a raw table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawPartition {
    /// The partitioned table (`gpu_samples` ...).
    pub table: String,
    /// The partition's own table.
    pub name: String,
    /// Its range `[from_ms, to_ms)`; `None` for MINVALUE / MAXVALUE.
    pub from_ms: Option<UnixMs>,
    pub to_ms: Option<UnixMs>,
}

fn q(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { op, source }
}

fn now_ms() -> UnixMs {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl PgStore {
    /// Connects to the database `url` names (`postgres://user:password@host:port/db`; a
    /// schema is chosen with `?options=-c%20search_path%3DNAME`), applies the migrations
    /// and creates today's and tomorrow's partitions.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        let shown = redact_url(url);
        let open_err = |source| StoreError::Open {
            url: shown.clone(),
            source,
        };
        let options = PgConnectOptions::from_str(url)
            .map_err(open_err)?
            .application_name("gpufleet-collector")
            .statement_cache_capacity(256);
        // test_before_acquire (the default) makes the pool drop connections a database
        // restart broke and open new ones, so the store recovers by itself.
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .idle_timeout(Some(Duration::from_secs(300)))
            .connect_with(options)
            .await
            .map_err(open_err)?;
        let migrations = MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    description.into(),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    false,
                )
            })
            .collect();
        Migrator::with_migrations(migrations)
            .run(&pool)
            .await
            .map_err(StoreError::Migrate)?;
        let store = PgStore {
            pool,
            workloads: Mutex::new(HashMap::new()),
            days: Mutex::new(HashSet::new()),
        };
        let today = now_ms().div_euclid(DAY_MS);
        store.ensure_days(&[today, today + 1]).await?;
        Ok(store)
    }

    /// Creates the partitions of `days` that are not known to exist (idempotent; safe
    /// when several collectors do it at once).
    pub async fn ensure_days(&self, days: &[i64]) -> Result<(), StoreError> {
        let missing: BTreeSet<i64> = {
            let known = self.days.lock().unwrap_or_else(PoisonError::into_inner);
            days.iter()
                .filter(|d| !known.contains(d))
                .copied()
                .collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(q("begin creating partitions"))?;
        lock_partitions(&mut tx).await?;
        for &day in &missing {
            let (from, to) = day_bounds(day);
            for table in RAW_TABLES {
                let name = partition_name(table, day);
                sqlx::query(AssertSqlSafe(format!(
                    "CREATE TABLE IF NOT EXISTS \"{name}\" PARTITION OF {table} \
                     FOR VALUES FROM ({from}) TO ({to})"
                )))
                .execute(&mut *tx)
                .await
                .map_err(q("create a partition"))?;
            }
        }
        tx.commit().await.map_err(q("commit new partitions"))?;
        self.days
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(missing);
        Ok(())
    }

    /// Every partition of the raw tables, by table then name.
    pub async fn raw_partitions(&self) -> Result<Vec<RawPartition>, StoreError> {
        let rows = sqlx::query(
            "SELECT p.relname::text AS parent, c.relname::text AS name, \
               pg_get_expr(c.relpartbound, c.oid) AS bound \
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             JOIN pg_class p ON p.oid = i.inhparent \
             WHERE i.inhparent IN ('gpu_samples'::regclass, 'process_samples'::regclass, \
               'host_samples'::regclass) \
             ORDER BY 1, 2",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(q("list raw partitions"))?;
        rows.iter()
            .map(|row| {
                let bound: String = get(row, "bound")?;
                let (from_ms, to_ms) = parse_bound(&bound)?;
                Ok(RawPartition {
                    table: get(row, "parent")?,
                    name: get(row, "name")?,
                    from_ms,
                    to_ms,
                })
            })
            .collect()
    }

    /// Retention of raw samples: drops every raw partition that ends at or before
    /// `cutoff_ms` (so only whole days older than the cutoff go) and returns their names.
    pub async fn drop_raw_before(&self, cutoff_ms: UnixMs) -> Result<Vec<String>, StoreError> {
        let old: Vec<RawPartition> = self
            .raw_partitions()
            .await?
            .into_iter()
            .filter(|p| p.to_ms.is_some_and(|to| to <= cutoff_ms))
            .collect();
        if old.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(q("begin dropping partitions"))?;
        lock_partitions(&mut tx).await?;
        for p in &old {
            sqlx::query(AssertSqlSafe(format!(
                "DROP TABLE IF EXISTS \"{}\"",
                p.name.replace('"', "\"\"")
            )))
            .execute(&mut *tx)
            .await
            .map_err(q("drop a partition"))?;
        }
        tx.commit().await.map_err(q("commit dropped partitions"))?;
        let mut days = self.days.lock().unwrap_or_else(PoisonError::into_inner);
        for p in &old {
            if let Some(from) = p.from_ms {
                days.remove(&from.div_euclid(DAY_MS));
            }
        }
        Ok(old.into_iter().map(|p| p.name).collect())
    }

    /// One write: first with GPU samples copied straight into `gpu_samples` (binary
    /// `COPY`, no conflict handling: the common case, where nothing was stored before);
    /// if any of them was already stored (a replay after a lost ack, or a duplicate within
    /// the group), the transaction failed whole and the write is redone with
    /// `INSERT ... ON CONFLICT DO NOTHING`, which skips and counts the duplicates.
    ///
    /// The `ON CONFLICT` write then tells replays from conflicts: a GPU whose samples were
    /// not all inserted has its rows read back and compared; batches whose samples differ
    /// from the stored ones are left out and the write is redone without them.
    async fn write_any(&self, batches: &[NodeBatch]) -> Result<WriteOutcome, StoreError> {
        let mut path = GpuPath::Copy;
        let mut skip = HashSet::new();
        let mut conflicts = Vec::new();
        let mut checked = false;
        // Copy, then merge, then merge checking conflicts first: only a concurrent writer
        // of the same GPUs could make the checked rounds repeat.
        for _ in 0..=super::MAX_WRITE_ROUNDS {
            match self
                .write_once(batches, path, &mut skip, &mut conflicts, checked)
                .await
            {
                Err(e) if path == GpuPath::Copy && is_copy_duplicate(&e) => {
                    debug!(error = %e, "GPU samples already stored; redoing the write with ON CONFLICT DO NOTHING");
                    path = GpuPath::Merge;
                }
                Err(e) => return Err(e),
                Ok(Attempt::Done(mut outcome)) => {
                    outcome.conflicts = conflicts;
                    return Ok(outcome);
                }
                Ok(Attempt::Recheck) => checked = true,
            }
        }
        Err(StoreError::Corrupt(
            "conflicting GPU samples kept appearing while writing; nothing was written".into(),
        ))
    }

    /// One attempt at [`Store::write_batches`] without the `skip`ped batches, GPU samples
    /// written the `path` way. When `checked`, the stored rows are compared with the
    /// batches' before anything is inserted, and the conflicting ones join `skip` and
    /// `conflicts`.
    async fn write_once(
        &self,
        batches: &[NodeBatch],
        path: GpuPath,
        skip: &mut HashSet<usize>,
        conflicts: &mut Vec<BatchConflict>,
        checked: bool,
    ) -> Result<Attempt, StoreError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(q("begin a write transaction"))?;
        if checked {
            let found = conflicts_of(&mut tx, batches, skip, None).await?;
            skip.extend(found.iter().map(|c| c.index));
            conflicts.extend(found);
        }
        let mut rows = {
            let cache = self
                .workloads
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            Rows::collect(batches, skip, &cache)?
        };
        upsert_workloads(&mut tx, &mut rows.workloads).await?;
        let workload_ids = rows
            .process_slot
            .iter()
            .map(|&slot| {
                rows.workloads[slot].id.ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "workload {} has no id",
                        rows.workloads[slot].workload.key()
                    ))
                })
            })
            .collect::<Result<Vec<i64>, _>>()?;
        // Rows per GPU, to find the ones the merge skipped (a copy inserts all or fails).
        let mut given: HashMap<i32, i64> = HashMap::new();
        if path == GpuPath::Merge {
            for &gpu in &rows.gpu.gpu {
                *given.entry(gpu).or_default() += 1;
            }
        }
        let per_gpu = match path {
            GpuPath::Copy => rows.gpu.copy(&mut tx).await?,
            GpuPath::Merge => rows.gpu.insert(&mut tx).await?,
        };
        // GPUs some of whose samples were skipped: replays, or conflicts.
        for &(gpu, n) in &per_gpu {
            if let Some(g) = given.get_mut(&gpu) {
                *g -= n;
            }
        }
        given.retain(|_, short| *short > 0);
        rows.process.insert(&mut tx, workload_ids).await?;
        let host_rows = rows.host.ts.len() as u64;
        let hosts = rows.host.insert(&mut tx).await?;
        if (!given.is_empty() || hosts < host_rows)
            && !conflicts_of(&mut tx, batches, skip, Some(&given))
                .await?
                .is_empty()
        {
            // Some skipped rows were not replays: decide which batches conflict before
            // inserting, in a new transaction.
            tx.rollback().await.map_err(q("roll back"))?;
            return Ok(Attempt::Recheck);
        }
        rows.events.insert(&mut tx).await?;
        for (gpu, n) in per_gpu {
            let group = rows.gpu_group.get(&gpu).copied().ok_or_else(|| {
                StoreError::Corrupt(format!("inserted rows of GPU {gpu}, which was not written"))
            })?;
            rows.nodes[group].inserted += u64::try_from(n).unwrap_or(0);
        }
        update_nodes(&mut tx, &rows.nodes).await?;
        tx.commit().await.map_err(q("commit"))?;
        self.cache_workloads(&rows.workloads);
        let mut outcome = WriteOutcome::default();
        for node in &rows.nodes {
            *outcome
                .inserted_gpu_samples
                .entry(NodeId(node.id))
                .or_default() += node.inserted;
        }
        Ok(Attempt::Done(outcome))
    }

    fn cache_workloads(&self, slots: &[WorkloadSlot<'_>]) {
        let mut cache = self
            .workloads
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cache.len() + slots.len() > WORKLOAD_CACHE_MAX {
            cache.clear();
        }
        for slot in slots {
            if let Some(id) = slot.id
                && !cache.contains_key(slot.workload)
            {
                cache.insert(slot.workload.clone(), id);
            }
        }
    }

    async fn load_node(conn: &mut PgConnection, id: NodeId) -> Result<NodeRecord, StoreError> {
        let row = sqlx::query("SELECT * FROM nodes WHERE id = $1")
            .bind(id.0)
            .fetch_one(&mut *conn)
            .await
            .map_err(q("read a node"))?;
        let gpus = sqlx::query("SELECT * FROM gpus WHERE node_id = $1 ORDER BY gpu_index, uuid")
            .bind(id.0)
            .fetch_all(&mut *conn)
            .await
            .map_err(q("read a node's GPUs"))?;
        let mut node = node_from_row(&row)?;
        node.gpus = gpus.iter().map(gpu_from_row).collect::<Result<_, _>>()?;
        Ok(node)
    }
}

/// Serializes partition creation and dropping among collectors on this schema, for the
/// rest of the transaction.
async fn lock_partitions(conn: &mut PgConnection) -> Result<(), StoreError> {
    sqlx::query(
        "SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.gpufleet.partitions'))",
    )
    .execute(&mut *conn)
    .await
    .map_err(q("lock the partition list"))?;
    Ok(())
}

/// The range of a day's partition, as SQL bounds.
fn day_bounds(day: i64) -> (String, String) {
    let bound = |d: i64, open: &str| {
        d.checked_mul(DAY_MS)
            .map_or_else(|| open.to_owned(), |ms| ms.to_string())
    };
    (bound(day, "MINVALUE"), bound(day + 1, "MAXVALUE"))
}

/// `<table>_pYYYYMMDD` for days in years 0..=9999, `<table>_d<day>` (`m` for a minus
/// sign) otherwise.
fn partition_name(table: &str, day: i64) -> String {
    let (y, m, d) = civil_from_days(day);
    if (0..=9999).contains(&y) {
        format!("{table}_p{y:04}{m:02}{d:02}")
    } else {
        format!("{table}_d{}", day.to_string().replace('-', "m"))
    }
}

/// The proleptic Gregorian date of a day number (days since 1970-01-01), after Howard
/// Hinnant's `civil_from_days`.
fn civil_from_days(day: i64) -> (i64, u32, u32) {
    let z = day.saturating_add(719_468);
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Parses `FOR VALUES FROM ('1') TO ('2')` (as `pg_get_expr` prints a range bound).
fn parse_bound(bound: &str) -> Result<(Option<i64>, Option<i64>), StoreError> {
    let value = |key: &str| -> Result<Option<i64>, StoreError> {
        let start = bound
            .find(key)
            .ok_or_else(|| StoreError::Corrupt(format!("partition bound {bound:?}")))?
            + key.len();
        let inner = bound[start..].split(')').next().unwrap_or("");
        let inner = inner.trim().trim_matches('\'');
        if inner.eq_ignore_ascii_case("MINVALUE") || inner.eq_ignore_ascii_case("MAXVALUE") {
            return Ok(None);
        }
        inner
            .parse()
            .map(Some)
            .map_err(|_| StoreError::Corrupt(format!("partition bound {bound:?}")))
    };
    Ok((value("FROM (")?, value("TO (")?))
}

/// How one write attempt ended.
enum Attempt {
    Done(WriteOutcome),
    /// Rolled back: skipped GPU samples were not all replays; redo checking first.
    Recheck,
}

/// The batches of a write whose GPU samples (of the GPUs in `only`; all when `None`) or
/// host rows conflict with the stored ones ([`super::find_conflicts`]).
async fn conflicts_of(
    conn: &mut PgConnection,
    batches: &[NodeBatch],
    skip: &HashSet<usize>,
    only: Option<&HashMap<i32, i64>>,
) -> Result<Vec<BatchConflict>, StoreError> {
    let mut check = super::ConflictCheck {
        gpu: super::incoming_gpu_rows(batches, skip, |gpu| {
            only.is_none_or(|only| i32::try_from(gpu).is_ok_and(|g| only.contains_key(&g)))
        }),
        host: super::incoming_host_rows(batches, skip),
        ..Default::default()
    };
    for (gpu, from, to) in super::spans(check.gpu.iter().map(|r| (r.gpu, r.ts))) {
        let rows = sqlx::query(
            "SELECT '' AS gpu_uuid, * FROM gpu_samples \
             WHERE gpu_id = $1 AND ts_ms BETWEEN $2 AND $3",
        )
        .bind(gpu_i32(gpu)?)
        .bind(from)
        .bind(to)
        .fetch_all(&mut *conn)
        .await
        .map_err(q("read back GPU samples"))?;
        for row in &rows {
            check
                .stored_gpu
                .insert((gpu, get(row, "ts_ms")?), gpu_sample_from_row(row)?);
        }
    }
    for (node, from, to) in super::spans(check.host.iter().map(|r| (r.node, r.ts))) {
        let rows = sqlx::query(
            "SELECT * FROM host_samples WHERE node_id = $1 AND ts_ms BETWEEN $2 AND $3",
        )
        .bind(node)
        .bind(from)
        .bind(to)
        .fetch_all(&mut *conn)
        .await
        .map_err(q("read back host samples"))?;
        for row in &rows {
            let host = host_from_row(row)?;
            check.stored_host.insert((node, host.time_ms), host);
        }
    }
    Ok(super::find_conflicts(batches, check))
}

/// How a write stores its GPU samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuPath {
    /// Binary `COPY` into `gpu_samples`: fast, and fails on any duplicate key.
    Copy,
    /// `INSERT ... ON CONFLICT DO NOTHING`: skips the samples already stored.
    Merge,
}

/// The `op` of a failed [`GpuCols::copy`].
const COPY_OP: &str = "copy GPU samples";

/// Whether a write failed because [`GpuCols::copy`] met a GPU sample already stored.
fn is_copy_duplicate(e: &StoreError) -> bool {
    match e {
        StoreError::Query {
            op,
            source: sqlx::Error::Database(db),
        } => *op == COPY_OP && db.code().as_deref() == Some("23505"),
        _ => false,
    }
}

/// Whether a write failed because a partition it needs does not exist.
fn is_missing_partition(e: &StoreError) -> bool {
    match e {
        StoreError::Query {
            source: sqlx::Error::Database(db),
            ..
        } => db.code().as_deref() == Some("23514") && db.message().contains("no partition"),
        _ => false,
    }
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(q("ping the database"))?;
        Ok(())
    }

    async fn register_node(
        &self,
        hello: &HelloInfo,
        inventory: &Inventory,
        now_ms: UnixMs,
    ) -> Result<NodeRecord, StoreError> {
        let labels = serde_json::to_string(&hello.labels)
            .map_err(|e| StoreError::Corrupt(format!("labels do not serialize: {e}")))?;
        let mut tx = self.pool.begin().await.map_err(q("begin a transaction"))?;
        let host = &inventory.host;
        let node_id: i64 = sqlx::query_scalar(
            "INSERT INTO nodes (name, labels, agent_version, boot_id, source, interval_ms, \
               first_seen_ms, last_hello_ms, driver_version, cuda_driver_version, nvml_version, \
               hostname, kernel, os, cpu_count, memory_total_bytes) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
             ON CONFLICT (name) DO UPDATE SET labels = excluded.labels, \
               agent_version = excluded.agent_version, boot_id = excluded.boot_id, \
               source = excluded.source, interval_ms = excluded.interval_ms, \
               last_hello_ms = excluded.last_hello_ms, driver_version = excluded.driver_version, \
               cuda_driver_version = excluded.cuda_driver_version, \
               nvml_version = excluded.nvml_version, hostname = excluded.hostname, \
               kernel = excluded.kernel, os = excluded.os, cpu_count = excluded.cpu_count, \
               memory_total_bytes = excluded.memory_total_bytes \
             RETURNING id",
        )
        .bind(hello.node.as_str())
        .bind(labels)
        .bind(hello.agent_version.as_str())
        .bind(hello.boot_id.as_str())
        .bind(hello.source.as_str())
        .bind(i64::from(hello.interval_ms))
        .bind(now_ms)
        .bind(now_ms)
        .bind(inventory.driver_version.as_deref())
        .bind(inventory.cuda_driver_version.as_deref())
        .bind(inventory.nvml_version.as_deref())
        .bind(host.hostname.as_str())
        .bind(host.kernel.as_deref())
        .bind(host.os.as_deref())
        .bind(host.cpu_count.map(i64::from))
        .bind(host.memory_total_bytes.map(to_i64))
        .fetch_one(&mut *tx)
        .await
        .map_err(q("upsert a node"))?;

        // In UUID order, so that two registrations moving the same GPUs cannot deadlock.
        let mut gpus: Vec<&GpuInfo> = inventory.gpus.iter().collect();
        gpus.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        for g in gpus {
            let mig = serde_json::to_string(&g.mig_instances)
                .map_err(|e| StoreError::Corrupt(format!("MIG instances do not serialize: {e}")))?;
            let u = |v: Option<u32>| v.map(i64::from);
            sqlx::query(
                "INSERT INTO gpus (node_id, uuid, gpu_index, name, serial, pci_bus_id, \
                   architecture, brand, memory_total_bytes, power_limit_default_mw, \
                   power_limit_enforced_mw, power_limit_min_mw, power_limit_max_mw, \
                   max_clock_sm_mhz, max_clock_mem_mhz, max_clock_graphics_mhz, nvlink_count, \
                   mig_enabled, compute_mode, persistence_mode, cuda_capability_major, \
                   cuda_capability_minor, pcie_link_gen_max, pcie_link_width_max, \
                   vbios_version, mig_instances, first_seen_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
                   $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27) \
                 ON CONFLICT (uuid) DO UPDATE SET \
                   gpu_index = excluded.gpu_index, name = excluded.name, \
                   serial = excluded.serial, pci_bus_id = excluded.pci_bus_id, \
                   architecture = excluded.architecture, brand = excluded.brand, \
                   memory_total_bytes = excluded.memory_total_bytes, \
                   power_limit_default_mw = excluded.power_limit_default_mw, \
                   power_limit_enforced_mw = excluded.power_limit_enforced_mw, \
                   power_limit_min_mw = excluded.power_limit_min_mw, \
                   power_limit_max_mw = excluded.power_limit_max_mw, \
                   max_clock_sm_mhz = excluded.max_clock_sm_mhz, \
                   max_clock_mem_mhz = excluded.max_clock_mem_mhz, \
                   max_clock_graphics_mhz = excluded.max_clock_graphics_mhz, \
                   nvlink_count = excluded.nvlink_count, mig_enabled = excluded.mig_enabled, \
                   compute_mode = excluded.compute_mode, \
                   persistence_mode = excluded.persistence_mode, \
                   cuda_capability_major = excluded.cuda_capability_major, \
                   cuda_capability_minor = excluded.cuda_capability_minor, \
                   pcie_link_gen_max = excluded.pcie_link_gen_max, \
                   pcie_link_width_max = excluded.pcie_link_width_max, \
                   vbios_version = excluded.vbios_version, \
                   mig_instances = excluded.mig_instances \
                 WHERE gpus.node_id = excluded.node_id",
            )
            .bind(node_id)
            .bind(g.uuid.as_str())
            .bind(i64::from(g.index))
            .bind(g.name.as_str())
            .bind(g.serial.as_deref())
            .bind(g.pci_bus_id.as_deref())
            .bind(g.architecture.as_deref())
            .bind(g.brand.as_deref())
            .bind(g.memory_total_bytes.map(to_i64))
            .bind(u(g.power_limit_default_mw))
            .bind(u(g.power_limit_enforced_mw))
            .bind(u(g.power_limit_min_mw))
            .bind(u(g.power_limit_max_mw))
            .bind(u(g.max_clock_sm_mhz))
            .bind(u(g.max_clock_mem_mhz))
            .bind(u(g.max_clock_graphics_mhz))
            .bind(u(g.nvlink_count))
            .bind(g.mig_enabled)
            .bind(g.compute_mode.as_deref())
            .bind(g.persistence_mode)
            .bind(u(g.cuda_capability_major))
            .bind(u(g.cuda_capability_minor))
            .bind(u(g.pcie_link_gen_max))
            .bind(u(g.pcie_link_width_max))
            .bind(g.vbios_version.as_deref())
            .bind(mig)
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(q("upsert a GPU"))?;
            let owner: Option<String> = sqlx::query_scalar(
                "SELECT n.name FROM gpus g JOIN nodes n ON n.id = g.node_id \
                 WHERE g.uuid = $1 AND g.node_id <> $2",
            )
            .bind(g.uuid.as_str())
            .bind(node_id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(q("check a GPU's owner"))?;
            if let Some(owner) = owner {
                // Dropping the transaction rolls the node's registration back.
                return Err(StoreError::GpuOwned {
                    uuid: g.uuid.clone(),
                    owner,
                });
            }
        }
        let node = Self::load_node(&mut tx, NodeId(node_id)).await?;
        tx.commit().await.map_err(q("commit a node registration"))?;
        Ok(node)
    }

    async fn write_batches(&self, batches: &[NodeBatch]) -> Result<WriteOutcome, StoreError> {
        if batches.is_empty() {
            return Ok(WriteOutcome::default());
        }
        // The batches' days, and today's and tomorrow's: a collector running for days
        // creates each day's partitions a day ahead (creating a partition locks its
        // table briefly), not when the day's first samples arrive.
        let today = now_ms().div_euclid(DAY_MS);
        let days: Vec<i64> = batches
            .iter()
            .flat_map(|nb| nb.batch.ticks.iter().map(|t| t.time_ms.div_euclid(DAY_MS)))
            .chain([today, today + 1])
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        self.ensure_days(&days).await?;
        match self.write_any(batches).await {
            Err(e) if is_missing_partition(&e) => {
                // Another collector dropped a partition this one thought it had.
                self.days
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clear();
                self.ensure_days(&days).await?;
                self.write_any(batches).await
            }
            other => other,
        }
    }

    async fn rehome_gpu(&self, uuid: &str, to: &str) -> Result<Rehomed, StoreError> {
        let mut tx = self.pool.begin().await.map_err(q("begin a transaction"))?;
        let to_id: Option<i64> = sqlx::query_scalar("SELECT id FROM nodes WHERE name = $1")
            .bind(to)
            .fetch_optional(&mut *tx)
            .await
            .map_err(q("find a node"))?;
        let Some(to_id) = to_id else {
            return Ok(Rehomed::UnknownNode);
        };
        let from: Option<(i64, String)> = sqlx::query_as(
            "SELECT g.node_id, n.name FROM gpus g JOIN nodes n ON n.id = g.node_id \
             WHERE g.uuid = $1 FOR UPDATE OF g",
        )
        .bind(uuid)
        .fetch_optional(&mut *tx)
        .await
        .map_err(q("find a GPU's node"))?;
        let Some((from_id, from)) = from else {
            return Ok(Rehomed::UnknownGpu);
        };
        if from_id == to_id {
            return Ok(Rehomed::Unchanged);
        }
        sqlx::query("UPDATE gpus SET node_id = $1 WHERE uuid = $2")
            .bind(to_id)
            .bind(uuid)
            .execute(&mut *tx)
            .await
            .map_err(q("re-home a GPU"))?;
        tx.commit().await.map_err(q("commit a GPU's move"))?;
        Ok(Rehomed::Moved { from })
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(q("acquire a connection"))?;
        let rows = sqlx::query("SELECT * FROM nodes ORDER BY name")
            .fetch_all(&mut *conn)
            .await
            .map_err(q("list nodes"))?;
        let gpu_rows = sqlx::query("SELECT * FROM gpus ORDER BY node_id, gpu_index, uuid")
            .fetch_all(&mut *conn)
            .await
            .map_err(q("list GPUs"))?;
        let mut gpus: HashMap<i64, Vec<GpuRecord>> = HashMap::new();
        for row in &gpu_rows {
            gpus.entry(get(row, "node_id")?)
                .or_default()
                .push(gpu_from_row(row)?);
        }
        rows.iter()
            .map(|row| {
                let mut node = node_from_row(row)?;
                node.gpus = gpus.remove(&node.id.0).unwrap_or_default();
                Ok(node)
            })
            .collect()
    }

    async fn latest_gpu_samples(&self) -> Result<Vec<LatestGpu>, StoreError> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(q("acquire a connection"))?;
        let newest = "(SELECT max(m.ts_ms) FROM gpu_samples m WHERE m.gpu_id = g.id)";
        let samples = sqlx::query(AssertSqlSafe(format!(
            "SELECT g.id AS gpu_id, {GPU_COLS} FROM gpus g \
             JOIN gpu_samples s ON s.gpu_id = g.id AND s.ts_ms = {newest}"
        )))
        .fetch_all(&mut *conn)
        .await
        .map_err(q("read the newest GPU samples"))?;
        let processes = sqlx::query(AssertSqlSafe(format!(
            "SELECT g.id AS gpu_id, {PROCESS_COLS} FROM gpus g \
             JOIN process_samples p ON p.gpu_id = g.id AND p.ts_ms = {newest} \
             JOIN workloads w ON w.id = p.workload_id ORDER BY p.gpu_id, p.pid"
        )))
        .fetch_all(&mut *conn)
        .await
        .map_err(q("read the newest process samples"))?;
        let mut by_gpu: HashMap<i64, Vec<ProcessSample>> = HashMap::new();
        for row in &processes {
            by_gpu
                .entry(get(row, "gpu_id")?)
                .or_default()
                .push(process_from_row(row)?);
        }
        samples
            .iter()
            .map(|row| {
                let gpu: i64 = get(row, "gpu_id")?;
                Ok(LatestGpu {
                    gpu: GpuId(gpu),
                    time_ms: get(row, "ts_ms")?,
                    sample: gpu_sample_from_row(row)?,
                    processes: by_gpu.remove(&gpu).unwrap_or_default(),
                })
            })
            .collect()
    }

    async fn latest_host_samples(&self) -> Result<Vec<LatestHost>, StoreError> {
        let rows = sqlx::query(
            "SELECT h.* FROM nodes n JOIN host_samples h ON h.node_id = n.id \
               AND h.ts_ms = (SELECT max(m.ts_ms) FROM host_samples m WHERE m.node_id = n.id)",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(q("read the newest host samples"))?;
        rows.iter()
            .map(|row| {
                let h = host_from_row(row)?;
                Ok(LatestHost {
                    node: NodeId(get(row, "node_id")?),
                    time_ms: h.time_ms,
                    sample: h.sample,
                    cost: h.cost,
                })
            })
            .collect()
    }

    async fn gpu_samples(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, GpuSample)>, StoreError> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {GPU_COLS} FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id \
             WHERE s.gpu_id = $1 AND s.ts_ms BETWEEN $2 AND $3 ORDER BY s.ts_ms LIMIT $4"
        )))
        .bind(gpu.0)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(q("read GPU samples"))?;
        rows.iter()
            .map(|row| Ok((get(row, "ts_ms")?, gpu_sample_from_row(row)?)))
            .collect()
    }

    async fn process_samples(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, ProcessSample)>, StoreError> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {PROCESS_COLS} FROM process_samples p JOIN gpus g ON g.id = p.gpu_id \
             JOIN workloads w ON w.id = p.workload_id \
             WHERE p.gpu_id = $1 AND p.ts_ms BETWEEN $2 AND $3 ORDER BY p.ts_ms, p.pid LIMIT $4"
        )))
        .bind(gpu.0)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(q("read process samples"))?;
        rows.iter()
            .map(|row| Ok((get(row, "ts_ms")?, process_from_row(row)?)))
            .collect()
    }

    async fn host_samples(
        &self,
        node: NodeId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<HostRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM host_samples WHERE node_id = $1 AND ts_ms BETWEEN $2 AND $3 \
             ORDER BY ts_ms LIMIT $4",
        )
        .bind(node.0)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(q("read host samples"))?;
        rows.iter().map(host_from_row).collect()
    }

    async fn events(
        &self,
        node: NodeId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let rows = sqlx::query(
            "SELECT e.ts_ms, e.kind, e.code, e.detail, g.uuid AS gpu_uuid FROM events e \
             LEFT JOIN gpus g ON g.id = e.gpu_id \
             WHERE e.node_id = $1 AND e.ts_ms BETWEEN $2 AND $3 ORDER BY e.ts_ms, e.id LIMIT $4",
        )
        .bind(node.0)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(q("read events"))?;
        rows.iter()
            .map(|row| {
                let kind: String = get(row, "kind")?;
                Ok(Event {
                    time_ms: get(row, "ts_ms")?,
                    gpu_uuid: get::<Option<String>>(row, "gpu_uuid")?.unwrap_or_default(),
                    kind: event_kind(&kind)?,
                    code: get::<Option<i64>>(row, "code")?.map(from_i64),
                    detail: get(row, "detail")?,
                })
            })
            .collect()
    }

    async fn gpu_series(
        &self,
        gpu: GpuId,
        metric: GpuMetric,
        range: TimeRange,
        step_ms: Option<i64>,
        limit: usize,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        // The expression is built from the metric's fixed name, never user input.
        let value = metric_expr(metric);
        let rows = match step_ms {
            None => sqlx::query(AssertSqlSafe(format!(
                "SELECT ts_ms AS t, {value} AS v FROM gpu_samples \
                 WHERE gpu_id = $1 AND ts_ms BETWEEN $2 AND $3 ORDER BY ts_ms LIMIT $4"
            )))
            .bind(gpu.0)
            .bind(range.from_ms)
            .bind(range.to_ms)
            .bind(limit_i64(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(q("read a series"))?,
            Some(step) => sqlx::query(AssertSqlSafe(format!(
                "SELECT (ts_ms / $1) * $1 AS t, avg({value})::float8 AS v FROM gpu_samples \
                 WHERE gpu_id = $2 AND ts_ms BETWEEN $3 AND $4 GROUP BY 1 ORDER BY 1 LIMIT $5"
            )))
            .bind(step.max(1))
            .bind(gpu.0)
            .bind(range.from_ms)
            .bind(range.to_ms)
            .bind(limit_i64(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(q("read a downsampled series"))?,
        };
        rows.iter()
            .map(|row| {
                let t: i64 = get(row, "t")?;
                let v = if step_ms.is_some() {
                    get::<Option<f64>>(row, "v")?
                } else {
                    get::<Option<i64>>(row, "v")?.map(|v| from_i64(v) as f64)
                };
                Ok((t, v))
            })
            .collect()
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn add_agent_token(&self, token: &AgentTokenRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO agent_tokens (id, node, role, secret_hash, created_ms, revoked_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&token.id)
        .bind(&token.node)
        .bind(&token.role)
        .bind(&token.secret_hash)
        .bind(token.created_ms)
        .bind(token.revoked_ms)
        .execute(&self.pool)
        .await
        .map_err(q("store an agent token"))?;
        Ok(())
    }

    async fn agent_tokens(&self) -> Result<Vec<AgentTokenRecord>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, node, role, secret_hash, created_ms, revoked_ms FROM agent_tokens \
             ORDER BY created_ms, id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(q("list agent tokens"))?;
        rows.iter().map(token_row).collect()
    }

    async fn agent_token(&self, id: &str) -> Result<Option<AgentTokenRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT id, node, role, secret_hash, created_ms, revoked_ms FROM agent_tokens \
             WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(q("look up an agent token"))?;
        row.as_ref().map(token_row).transpose()
    }

    async fn revoke_agent_token(&self, id: &str, now_ms: UnixMs) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE agent_tokens SET revoked_ms = $1 WHERE id = $2 AND revoked_ms IS NULL",
        )
        .bind(now_ms)
        .bind(id)
        .execute(&self.pool)
        .await
        .map_err(q("revoke an agent token"))?;
        Ok(done.rows_affected() > 0)
    }

    // ---------------------------------------------------------------- energy (issue 6)

    async fn energy_gpus(&self) -> Result<Vec<super::energy::EnergyGpu>, StoreError> {
        energy::energy_gpus(&self.pool).await
    }

    async fn energy_inputs(
        &self,
        gpu: GpuId,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<super::energy::EnergyInputs, StoreError> {
        energy::energy_inputs(&self.pool, gpu, from_ms, to_ms).await
    }

    async fn energy_inputs_many(
        &self,
        ranges: &[super::energy::EnergyRange],
    ) -> Result<Vec<super::energy::EnergyInputs>, StoreError> {
        energy::energy_inputs_many(&self.pool, ranges).await
    }

    async fn energy_learned_before_many(
        &self,
        ranges: &[super::energy::EnergyRange],
    ) -> Result<Vec<(u64, i64)>, StoreError> {
        energy::energy_learned_before_many(&self.pool, ranges).await
    }

    async fn next_sample_ms(
        &self,
        gpu: GpuId,
        at_ms: UnixMs,
    ) -> Result<Option<UnixMs>, StoreError> {
        energy::next_sample_ms(&self.pool, gpu, at_ms).await
    }

    async fn energy_learned_before(
        &self,
        gpu: GpuId,
        before_ms: UnixMs,
    ) -> Result<(u64, i64), StoreError> {
        energy::energy_learned_before(&self.pool, gpu, before_ms).await
    }

    async fn energy_baselines(&self) -> Result<Vec<crate::store::energy::GpuBaseline>, StoreError> {
        energy::energy_baselines(&self.pool).await
    }

    async fn replace_energy_minutes(
        &self,
        gpu: GpuId,
        from_ms: UnixMs,
        to_ms: UnixMs,
        minutes: &[crate::accounting::energy::GpuMinute],
        done_to_ms: Option<UnixMs>,
    ) -> Result<(), StoreError> {
        energy::replace_energy_minutes(&self.pool, gpu, from_ms, to_ms, minutes, done_to_ms).await
    }

    async fn replace_energy_minutes_many(
        &self,
        batch: &[super::energy::MinuteReplacement],
    ) -> Result<(), StoreError> {
        energy::replace_energy_minutes_many(&self.pool, batch).await
    }

    async fn energy_minutes(
        &self,
        gpu: Option<GpuId>,
        range: TimeRange,
    ) -> Result<Vec<(GpuId, crate::accounting::energy::GpuMinute)>, StoreError> {
        energy::energy_minutes(&self.pool, gpu, range).await
    }

    async fn stale_energy_minutes(
        &self,
        since_ms: UnixMs,
    ) -> Result<Vec<(GpuId, UnixMs)>, StoreError> {
        energy::stale_energy_minutes(&self.pool, since_ms).await
    }

    async fn workload_energy(
        &self,
        range: TimeRange,
        node: Option<&str>,
        workload_key: Option<&str>,
    ) -> Result<Vec<super::energy::WorkloadEnergy>, StoreError> {
        energy::workload_energy(&self.pool, range, node, workload_key).await
    }

    async fn workload_energy_series(
        &self,
        workload_key: &str,
        range: TimeRange,
    ) -> Result<Vec<super::energy::WorkloadEnergyPoint>, StoreError> {
        energy::workload_energy_series(&self.pool, workload_key, range).await
    }

    async fn gpu_energy(
        &self,
        range: TimeRange,
    ) -> Result<Vec<super::energy::GpuEnergy>, StoreError> {
        energy::gpu_energy(&self.pool, range).await
    }

    // ---- retention and rollups (issue 8)

    async fn rollup_cursors(&self) -> Result<Vec<super::rollup::RollupCursor>, StoreError> {
        rollup::rollup_cursors(&self.pool).await
    }

    async fn replace_rollups(
        &self,
        key: super::rollup::RollupKey,
        from_ms: UnixMs,
        to_ms: UnixMs,
        done_to_ms: Option<UnixMs>,
    ) -> Result<usize, StoreError> {
        rollup::replace_rollups(&self.pool, key, from_ms, to_ms, done_to_ms).await
    }

    async fn stale_rollup_minutes(
        &self,
        since_ms: UnixMs,
    ) -> Result<Vec<(super::rollup::RollupKey, UnixMs)>, StoreError> {
        rollup::stale_rollup_minutes(&self.pool, since_ms).await
    }

    async fn rollup_minutes(
        &self,
        key: super::rollup::RollupKey,
        range: TimeRange,
    ) -> Result<Vec<super::rollup::RollupMinute>, StoreError> {
        rollup::rollup_minutes(&self.pool, key, range).await
    }

    async fn gpu_rollup_series(
        &self,
        gpu: GpuId,
        metric: GpuMetric,
        range: TimeRange,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        rollup::gpu_rollup_series(&self.pool, gpu, metric, range, step_ms, limit).await
    }

    async fn host_rollup_series(
        &self,
        node: NodeId,
        range: TimeRange,
        step_ms: i64,
        limit: usize,
    ) -> Result<Vec<(UnixMs, Vec<Option<f64>>)>, StoreError> {
        rollup::host_rollup_series(&self.pool, node, range, step_ms, limit).await
    }

    async fn raw_horizons(&self) -> Result<HashMap<super::rollup::RollupKey, UnixMs>, StoreError> {
        rollup::raw_horizons(&self.pool).await
    }

    /// Raises the raw horizons, drops every raw day partition that ends before the oldest
    /// row still to be kept, then deletes the rest behind the horizons in bounded
    /// statements.
    async fn expire_raw_before(
        &self,
        cutoff_ms: UnixMs,
        batch_rows: usize,
    ) -> Result<super::rollup::RetentionOutcome, StoreError> {
        let mut out = super::rollup::RetentionOutcome::default();
        rollup::raise_raw_horizons(&self.pool, cutoff_ms, &mut out).await?;
        if let Some(bound) = rollup::droppable_before(&self.pool).await? {
            out.partitions_dropped = self.drop_raw_before(bound).await?;
        }
        rollup::delete_behind_horizons(&self.pool, batch_rows, &mut out).await?;
        Ok(out)
    }

    async fn expire_rollups_before(
        &self,
        cutoff_ms: UnixMs,
        batch_rows: usize,
    ) -> Result<super::rollup::RetentionOutcome, StoreError> {
        rollup::expire_rollups_before(&self.pool, cutoff_ms, batch_rows).await
    }

    // ---- carbon (issue 7)

    async fn upsert_intensity(
        &self,
        slots: &[gpufleet_carbon::IntensitySlot],
    ) -> Result<(), StoreError> {
        carbon::upsert_intensity(&self.pool, slots).await
    }

    async fn intensity_slots(
        &self,
        provider: gpufleet_carbon::ProviderKind,
        region: &str,
        range: TimeRange,
    ) -> Result<Vec<gpufleet_carbon::IntensitySlot>, StoreError> {
        carbon::intensity_slots(&self.pool, provider, region, range).await
    }

    async fn last_intensity_before(
        &self,
        provider: gpufleet_carbon::ProviderKind,
        region: &str,
        at_ms: UnixMs,
    ) -> Result<Option<gpufleet_carbon::IntensitySlot>, StoreError> {
        carbon::last_intensity_before(&self.pool, provider, region, at_ms).await
    }

    async fn pending_carbon_minutes(
        &self,
        since_ms: UnixMs,
        limit: usize,
    ) -> Result<Vec<super::carbon::PendingCarbonMinute>, StoreError> {
        carbon::pending_carbon_minutes(&self.pool, since_ms, limit).await
    }

    async fn replace_carbon_minutes(
        &self,
        minutes: &[super::carbon::CarbonMinute],
    ) -> Result<(), StoreError> {
        carbon::replace_carbon_minutes(&self.pool, minutes).await
    }

    async fn carbon_minutes(
        &self,
        gpu: Option<GpuId>,
        range: TimeRange,
    ) -> Result<Vec<super::carbon::CarbonMinute>, StoreError> {
        carbon::carbon_minutes(&self.pool, gpu, range).await
    }

    async fn workload_carbon(
        &self,
        range: TimeRange,
        node: Option<&str>,
        workload_key: Option<&str>,
    ) -> Result<Vec<super::carbon::WorkloadCarbon>, StoreError> {
        carbon::workload_carbon(&self.pool, range, node, workload_key).await
    }

    async fn gpu_carbon(
        &self,
        range: TimeRange,
    ) -> Result<Vec<super::carbon::GpuCarbon>, StoreError> {
        carbon::gpu_carbon(&self.pool, range).await
    }

    // ---- several collectors (issue 8)

    fn shared(&self) -> bool {
        true
    }

    async fn try_lead(&self, job: &str) -> Result<Option<super::lease::Lease>, StoreError> {
        super::lease::postgres(&self.pool, job).await
    }

    /// Four queries whatever the node's GPU count (the follower asks every period).
    async fn node_ticks(
        &self,
        node: &NodeRecord,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<gpufleet_core::Tick>, StoreError> {
        let ids: Vec<i64> = node.gpus.iter().map(|g| g.id.0).collect();
        let gpu_limit = limit.saturating_mul(ids.len().max(1));
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {GPU_COLS} FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id \
             WHERE s.gpu_id = ANY($1) AND s.ts_ms BETWEEN $2 AND $3 \
             ORDER BY s.ts_ms DESC, g.gpu_index DESC, g.uuid DESC LIMIT $4"
        )))
        .bind(&ids)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(gpu_limit))
        .fetch_all(&self.pool)
        .await
        .map_err(q("read a node's new GPU samples"))?;
        let gpus = rows
            .iter()
            .rev()
            .map(|row| Ok((get::<UnixMs>(row, "ts_ms")?, gpu_sample_from_row(row)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        // Only the ticks whose GPU rows were kept.
        let from_ms = gpus
            .first()
            .map_or(range.from_ms, |g| g.0.max(range.from_ms));
        let range = TimeRange { from_ms, ..range };
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {PROCESS_COLS} FROM process_samples p JOIN gpus g ON g.id = p.gpu_id \
             JOIN workloads w ON w.id = p.workload_id \
             WHERE p.gpu_id = ANY($1) AND p.ts_ms BETWEEN $2 AND $3 \
             ORDER BY p.ts_ms, g.gpu_index, g.uuid, p.pid LIMIT $4"
        )))
        .bind(&ids)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(gpu_limit.saturating_mul(256)))
        .fetch_all(&self.pool)
        .await
        .map_err(q("read a node's new process samples"))?;
        let processes = rows
            .iter()
            .map(|row| Ok((get::<UnixMs>(row, "ts_ms")?, process_from_row(row)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let hosts = self.host_samples(node.id, range, limit).await?;
        let events = self.events(node.id, range, limit).await?;
        Ok(super::assemble_ticks(gpus, processes, hosts, events, limit))
    }

    /// Four queries whatever the number of nodes (see `postgres/follow.rs`).
    async fn nodes_ticks(
        &self,
        wanted: &[(&NodeRecord, TimeRange)],
        limit: usize,
    ) -> Result<Vec<Vec<gpufleet_core::Tick>>, StoreError> {
        follow::nodes_ticks(&self.pool, wanted, limit).await
    }
}

fn token_row(row: &PgRow) -> Result<AgentTokenRecord, StoreError> {
    Ok(AgentTokenRecord {
        id: get(row, "id")?,
        node: get(row, "node")?,
        role: get(row, "role")?,
        secret_hash: get(row, "secret_hash")?,
        created_ms: get(row, "created_ms")?,
        revoked_ms: get(row, "revoked_ms")?,
    })
}

/// A series value as a bigint holding the u64 bit pattern (as SQLite stores it), from the
/// column's storage type (see the schema).
fn metric_expr(metric: GpuMetric) -> String {
    use GpuMetric::*;
    let column = metric.name();
    match metric {
        UtilGpuPct | UtilMemPct | FanPct | Pstate | EncUtilPct | DecUtilPct => {
            format!("{column}::int8")
        }
        PowerMw | PowerInstantMw | PowerLimitMw | TempGpuC | TempMemC | ClockSmMhz
        | ClockMemMhz | ClockGraphicsMhz => format!("({column}::int8 & 4294967295)"),
        MemUsedBytes
        | MemTotalBytes
        | MemReservedBytes
        | EnergyMj
        | PcieTxBps
        | PcieRxBps
        | NvlinkTxBps
        | NvlinkRxBps
        | EccCorrectedVolatile
        | EccUncorrectedVolatile => column.to_owned(),
    }
}

// ------------------------------------------------------------------ one write's rows

/// One distinct workload of a write.
struct WorkloadSlot<'b> {
    workload: &'b Workload,
    /// The first tick it appears in (`first_seen_ms` of a new workload).
    first_ms: UnixMs,
    /// From the cache, or from the upsert.
    id: Option<i64>,
}

/// The delivery-state update of one node.
struct NodeUpdate {
    id: i64,
    newest_ms: i64,
    seq: u64,
    delivery: DeliveryStats,
    inserted: u64,
}

/// Every row of one write, column by column, ready to be bound as arrays.
struct Rows<'b> {
    gpu: GpuCols,
    /// The node group (index in `nodes`) of each GPU written.
    gpu_group: HashMap<i32, usize>,
    process: ProcessCols,
    /// Per process row: its index in `workloads`.
    process_slot: Vec<usize>,
    host: HostCols,
    events: EventCols,
    nodes: Vec<NodeUpdate>,
    workloads: Vec<WorkloadSlot<'b>>,
}

impl<'b> Rows<'b> {
    fn collect(
        batches: &'b [NodeBatch],
        skip: &HashSet<usize>,
        cache: &HashMap<Workload, i64>,
    ) -> Result<Rows<'b>, StoreError> {
        let mut order: Vec<usize> = (0..batches.len()).filter(|i| !skip.contains(i)).collect();
        order.sort_by_key(|&i| batches[i].keys.id);
        let mut rows = Rows {
            gpu: GpuCols::default(),
            gpu_group: HashMap::new(),
            process: ProcessCols::default(),
            process_slot: Vec::new(),
            host: HostCols::default(),
            events: EventCols::default(),
            nodes: Vec::new(),
            workloads: Vec::new(),
        };
        let mut distinct: HashMap<&'b Workload, usize> = HashMap::new();
        for group in order.chunk_by(|&a, &b| batches[a].keys.id == batches[b].keys.id) {
            let keys = &batches[group[0]].keys;
            let g = rows.nodes.len();
            let mut update = NodeUpdate {
                id: keys.id.0,
                newest_ms: i64::MIN,
                seq: 0,
                delivery: DeliveryStats::default(),
                inserted: 0,
            };
            for &i in group {
                let batch = &batches[i].batch;
                if batch.seq >= update.seq {
                    update.seq = batch.seq;
                    update.delivery = batch.delivery;
                }
                let gpu_id = |uuid: &str| -> Result<i64, StoreError> {
                    keys.gpus
                        .get(uuid)
                        .map(|g| g.0)
                        .ok_or_else(|| StoreError::UnknownGpu {
                            node: keys.name.clone(),
                            seq: batch.seq,
                            uuid: uuid.to_owned(),
                        })
                };
                for t in &batch.ticks {
                    update.newest_ms = update.newest_ms.max(t.time_ms);
                    for s in &t.gpus {
                        let gpu = gpu_i32(gpu_id(&s.gpu_uuid)?)?;
                        rows.gpu_group.entry(gpu).or_insert(g);
                        rows.gpu.push(gpu, t.time_ms, s)?;
                    }
                    for p in &t.processes {
                        let slot = *distinct.entry(&p.workload).or_insert_with(|| {
                            rows.workloads.push(WorkloadSlot {
                                workload: &p.workload,
                                first_ms: t.time_ms,
                                id: cache.get(&p.workload).copied(),
                            });
                            rows.workloads.len() - 1
                        });
                        rows.process_slot.push(slot);
                        rows.process
                            .push(gpu_i32(gpu_id(&p.gpu_uuid)?)?, t.time_ms, p)?;
                    }
                    if t.host.is_some() || t.cost.is_some() {
                        rows.host.push(keys.id.0, t.time_ms, t)?;
                    }
                    for e in &t.events {
                        let gpu = if e.gpu_uuid.is_empty() {
                            None
                        } else {
                            Some(gpu_id(&e.gpu_uuid)?)
                        };
                        rows.events.node.push(keys.id.0);
                        rows.events.ts.push(e.time_ms);
                        rows.events.gpu.push(gpu);
                        rows.events.kind.push(e.kind.as_str().to_owned());
                        rows.events.code.push(e.code.map(to_i64));
                        rows.events.detail.push(e.detail.clone());
                    }
                }
            }
            rows.nodes.push(update);
        }
        Ok(rows)
    }
}

fn gpu_i32(id: i64) -> Result<i32, StoreError> {
    i32::try_from(id).map_err(|_| StoreError::Corrupt(format!("GPU id {id} exceeds 2^31")))
}

/// A u32 as the i32 with the same bits (lossless; see the schema).
fn bits32(v: Option<u32>) -> Option<i32> {
    v.map(|v| v as i32)
}

/// A percentage or P-state as smallint. Batch validation bounds them (<= 100), so a value
/// that does not fit is a caller's bug, reported rather than clipped.
fn small(v: Option<u32>, what: &str) -> Result<Option<i16>, StoreError> {
    v.map(|v| {
        i16::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} {v} is out of range")))
    })
    .transpose()
}

/// GPU sample columns, in the order of [`GPU_INSERT`].
#[derive(Default)]
struct GpuCols {
    ts: Vec<i64>,
    big: [Vec<Option<i64>>; 11],
    gpu: Vec<i32>,
    int: [Vec<Option<i32>>; 8],
    small: [Vec<Option<i16>>; 6],
    nvlinks: Vec<Option<Vec<u8>>>,
}

impl GpuCols {
    fn push(&mut self, gpu: i32, ts: i64, s: &GpuSample) -> Result<(), StoreError> {
        self.ts.push(ts);
        let big = [
            s.mem_used_bytes,
            s.mem_total_bytes,
            s.mem_reserved_bytes,
            s.energy_mj,
            s.pcie_tx_bps,
            s.pcie_rx_bps,
            s.nvlink_tx_bps,
            s.nvlink_rx_bps,
            s.ecc_corrected_volatile,
            s.ecc_uncorrected_volatile,
            s.throttle_reasons,
        ];
        for (col, v) in self.big.iter_mut().zip(big) {
            col.push(v.map(to_i64));
        }
        self.gpu.push(gpu);
        let int = [
            s.power_mw,
            s.power_instant_mw,
            s.power_limit_mw,
            s.temp_gpu_c,
            s.temp_mem_c,
            s.clock_sm_mhz,
            s.clock_mem_mhz,
            s.clock_graphics_mhz,
        ];
        for (col, v) in self.int.iter_mut().zip(int) {
            col.push(bits32(v));
        }
        let smalls = [
            (s.util_gpu_pct, "util_gpu_pct"),
            (s.util_mem_pct, "util_mem_pct"),
            (s.fan_pct, "fan_pct"),
            (s.pstate, "pstate"),
            (s.enc_util_pct, "enc_util_pct"),
            (s.dec_util_pct, "dec_util_pct"),
        ];
        for (col, (v, what)) in self.small.iter_mut().zip(smalls) {
            col.push(small(v, what)?);
        }
        self.nvlinks.push(encode_nvlinks(&s.nvlinks));
        Ok(())
    }

    /// Inserts the rows; returns how many were new per GPU.
    async fn insert(self, conn: &mut PgConnection) -> Result<Vec<(i32, i64)>, StoreError> {
        if self.ts.is_empty() {
            return Ok(Vec::new());
        }
        let mut query = sqlx::query(GPU_INSERT).bind(self.ts);
        for col in self.big {
            query = query.bind(col);
        }
        query = query.bind(self.gpu);
        for col in self.int {
            query = query.bind(col);
        }
        for col in self.small {
            query = query.bind(col);
        }
        let rows = query
            .bind(self.nvlinks)
            .fetch_all(&mut *conn)
            .await
            .map_err(q("insert GPU samples"))?;
        rows.iter()
            .map(|row| Ok((get(row, "gpu_id")?, get(row, "n")?)))
            .collect()
    }
}

/// Writes [`GpuCols`] rows in PostgreSQL's binary `COPY` format
/// (<https://www.postgresql.org/docs/current/sql-copy.html#id-1.9.3.55.9.4>): a header,
/// then per row the field count and per field its length (-1 for NULL) and big-endian
/// bytes, then a -1 trailer.
struct CopyWriter {
    buf: Vec<u8>,
}

impl CopyWriter {
    const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

    fn new(rows: usize, row_bytes: usize) -> CopyWriter {
        let mut buf = Vec::with_capacity(19 + rows * row_bytes + 2);
        buf.extend_from_slice(Self::SIGNATURE);
        buf.extend_from_slice(&0i32.to_be_bytes()); // flags: no OIDs
        buf.extend_from_slice(&0i32.to_be_bytes()); // header extension length
        CopyWriter { buf }
    }

    fn row(&mut self, fields: i16) {
        self.buf.extend_from_slice(&fields.to_be_bytes());
    }

    fn null(&mut self) {
        self.buf.extend_from_slice(&(-1i32).to_be_bytes());
    }

    fn field(&mut self, bytes: &[u8]) {
        // Fields here are numbers and NVLink blobs of a few dozen bytes: far below 2^31.
        let len = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(bytes);
    }

    fn i64(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.field(&v.to_be_bytes()),
            None => self.null(),
        }
    }

    fn i32(&mut self, v: Option<i32>) {
        match v {
            Some(v) => self.field(&v.to_be_bytes()),
            None => self.null(),
        }
    }

    fn i16(&mut self, v: Option<i16>) {
        match v {
            Some(v) => self.field(&v.to_be_bytes()),
            None => self.null(),
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.buf.extend_from_slice(&(-1i16).to_be_bytes());
        self.buf
    }
}

/// `COPY` statement for [`GpuCols::copy`]: the columns of [`GPU_INSERT`], in its order.
const GPU_COPY: &str = "COPY gpu_samples (ts_ms, mem_used_bytes, mem_total_bytes, \
       mem_reserved_bytes, energy_mj, pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps, \
       ecc_corrected_volatile, ecc_uncorrected_volatile, throttle_reasons, gpu_id, power_mw, \
       power_instant_mw, power_limit_mw, temp_gpu_c, temp_mem_c, clock_sm_mhz, clock_mem_mhz, \
       clock_graphics_mhz, util_gpu_pct, util_mem_pct, fan_pct, pstate, enc_util_pct, \
       dec_util_pct, nvlinks) FROM STDIN (FORMAT binary)";

impl GpuCols {
    /// The rows in binary `COPY` format, columns as in [`GPU_COPY`].
    fn copy_data(&self) -> Vec<u8> {
        const FIELDS: i16 = 28;
        // 28 length words, 11 + 1 eight-byte, 9 four-byte and 6 two-byte values.
        let mut w = CopyWriter::new(self.ts.len(), 2 + 28 * 4 + 12 * 8 + 9 * 4 + 6 * 2);
        for (r, &ts) in self.ts.iter().enumerate() {
            w.row(FIELDS);
            w.i64(Some(ts));
            for col in &self.big {
                w.i64(col[r]);
            }
            w.i32(Some(self.gpu[r]));
            for col in &self.int {
                w.i32(col[r]);
            }
            for col in &self.small {
                w.i16(col[r]);
            }
            match &self.nvlinks[r] {
                Some(blob) => w.field(blob),
                None => w.null(),
            }
        }
        w.finish()
    }

    /// Copies the rows into `gpu_samples`; every row is new, or the copy fails with a
    /// unique violation (see [`is_copy_duplicate`]). Returns the rows per GPU.
    async fn copy(self, conn: &mut PgConnection) -> Result<Vec<(i32, i64)>, StoreError> {
        if self.ts.is_empty() {
            return Ok(Vec::new());
        }
        let data = self.copy_data();
        let mut copy = conn.copy_in_raw(GPU_COPY).await.map_err(q(COPY_OP))?;
        copy.send(data).await.map_err(q(COPY_OP))?;
        copy.finish().await.map_err(q(COPY_OP))?;
        let mut per_gpu: BTreeMap<i32, i64> = BTreeMap::new();
        for &gpu in &self.gpu {
            *per_gpu.entry(gpu).or_default() += 1;
        }
        Ok(per_gpu.into_iter().collect())
    }
}

const GPU_INSERT: &str = "WITH ins AS ( \
     INSERT INTO gpu_samples (ts_ms, mem_used_bytes, mem_total_bytes, mem_reserved_bytes, \
       energy_mj, pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps, \
       ecc_corrected_volatile, ecc_uncorrected_volatile, throttle_reasons, gpu_id, power_mw, \
       power_instant_mw, power_limit_mw, temp_gpu_c, temp_mem_c, clock_sm_mhz, clock_mem_mhz, \
       clock_graphics_mhz, util_gpu_pct, util_mem_pct, fan_pct, pstate, enc_util_pct, \
       dec_util_pct, nvlinks) \
     SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], \
       $6::int8[], $7::int8[], $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], \
       $13::int4[], $14::int4[], $15::int4[], $16::int4[], $17::int4[], $18::int4[], \
       $19::int4[], $20::int4[], $21::int4[], $22::int2[], $23::int2[], $24::int2[], \
       $25::int2[], $26::int2[], $27::int2[], $28::bytea[]) \
     ON CONFLICT DO NOTHING RETURNING gpu_id) \
   SELECT gpu_id, count(*) AS n FROM ins GROUP BY gpu_id";

/// Process sample columns.
#[derive(Default)]
struct ProcessCols {
    ts: Vec<i64>,
    gpu_mem: Vec<Option<i64>>,
    gpu: Vec<i32>,
    pid: Vec<i32>,
    process_type: Vec<i16>,
    small: [Vec<Option<i16>>; 4],
    user: Vec<Option<String>>,
    command: Vec<Option<String>>,
    mig_uuid: Vec<Option<String>>,
}

impl ProcessCols {
    fn push(&mut self, gpu: i32, ts: i64, p: &ProcessSample) -> Result<(), StoreError> {
        self.ts.push(ts);
        self.gpu_mem.push(p.gpu_mem_bytes.map(to_i64));
        self.gpu.push(gpu);
        self.pid.push(p.pid as i32);
        self.process_type.push(match p.process_type {
            ProcessType::Compute => 1,
            ProcessType::Graphics => 2,
            ProcessType::ComputeAndGraphics => 3,
        });
        let smalls = [
            (p.sm_util_pct, "sm_util_pct"),
            (p.mem_util_pct, "mem_util_pct"),
            (p.enc_util_pct, "enc_util_pct"),
            (p.dec_util_pct, "dec_util_pct"),
        ];
        for (col, (v, what)) in self.small.iter_mut().zip(smalls) {
            col.push(small(v, what)?);
        }
        self.user.push(p.user.clone());
        self.command.push(p.command.clone());
        self.mig_uuid.push(p.mig_uuid.clone());
        Ok(())
    }

    async fn insert(self, conn: &mut PgConnection, workload: Vec<i64>) -> Result<(), StoreError> {
        if self.ts.is_empty() {
            return Ok(());
        }
        let [sm, mem, enc, dec] = self.small;
        sqlx::query(
            "INSERT INTO process_samples (ts_ms, workload_id, gpu_mem_bytes, gpu_id, pid, \
               process_type, sm_util_pct, mem_util_pct, enc_util_pct, dec_util_pct, user_name, \
               command, mig_uuid) \
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::int4[], $5::int4[], \
               $6::int2[], $7::int2[], $8::int2[], $9::int2[], $10::int2[], $11::text[], \
               $12::text[], $13::text[]) \
             ON CONFLICT DO NOTHING",
        )
        .bind(self.ts)
        .bind(workload)
        .bind(self.gpu_mem)
        .bind(self.gpu)
        .bind(self.pid)
        .bind(self.process_type)
        .bind(sm)
        .bind(mem)
        .bind(enc)
        .bind(dec)
        .bind(self.user)
        .bind(self.command)
        .bind(self.mig_uuid)
        .execute(&mut *conn)
        .await
        .map_err(q("insert process samples"))?;
        Ok(())
    }
}

/// Host sample columns.
#[derive(Default)]
struct HostCols {
    ts: Vec<i64>,
    node: Vec<i64>,
    big: [Vec<Option<i64>>; 6],
    real: [Vec<Option<f32>>; 2],
    cost: [Vec<Option<i32>>; 3],
    slowest: Vec<Option<String>>,
}

impl HostCols {
    fn push(&mut self, node: i64, ts: i64, t: &gpufleet_core::Tick) -> Result<(), StoreError> {
        let h = t.host.clone().unwrap_or_default();
        let c = t.cost.as_ref();
        self.ts.push(ts);
        self.node.push(node);
        let big = [
            h.mem_used_bytes,
            h.mem_total_bytes,
            h.disk_read_bps,
            h.disk_write_bps,
            h.net_rx_bps,
            h.net_tx_bps,
        ];
        for (col, v) in self.big.iter_mut().zip(big) {
            col.push(v.map(to_i64));
        }
        self.real[0].push(h.cpu_util_pct);
        self.real[1].push(h.load1);
        let cost = [
            c.and_then(|c| c.cpu_us),
            c.and_then(|c| c.wall_us),
            c.and_then(|c| c.source_us),
        ];
        for (col, v) in self.cost.iter_mut().zip(cost) {
            col.push(bits32(v));
        }
        let slowest = match c.filter(|c| !c.slowest_calls_us.is_empty()) {
            Some(c) => Some(serde_json::to_string(&c.slowest_calls_us).map_err(|e| {
                StoreError::Corrupt(format!("slowest calls do not serialize: {e}"))
            })?),
            None => None,
        };
        self.slowest.push(slowest);
        Ok(())
    }

    /// Inserts the rows; returns how many were new.
    async fn insert(self, conn: &mut PgConnection) -> Result<u64, StoreError> {
        if self.ts.is_empty() {
            return Ok(0);
        }
        let mut query = sqlx::query(
            "INSERT INTO host_samples (ts_ms, node_id, mem_used_bytes, mem_total_bytes, \
               disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps, cpu_util_pct, load1, \
               cost_cpu_us, cost_wall_us, cost_source_us, cost_slowest_calls) \
             SELECT * FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], \
               $6::int8[], $7::int8[], $8::int8[], $9::float4[], $10::float4[], $11::int4[], \
               $12::int4[], $13::int4[], $14::text[]) \
             ON CONFLICT DO NOTHING",
        )
        .bind(self.ts)
        .bind(self.node);
        for col in self.big {
            query = query.bind(col);
        }
        for col in self.real {
            query = query.bind(col);
        }
        for col in self.cost {
            query = query.bind(col);
        }
        Ok(query
            .bind(self.slowest)
            .execute(&mut *conn)
            .await
            .map_err(q("insert host samples"))?
            .rows_affected())
    }
}

/// Event columns.
#[derive(Default)]
struct EventCols {
    node: Vec<i64>,
    ts: Vec<i64>,
    gpu: Vec<Option<i64>>,
    kind: Vec<String>,
    code: Vec<Option<i64>>,
    detail: Vec<String>,
}

impl EventCols {
    async fn insert(self, conn: &mut PgConnection) -> Result<(), StoreError> {
        if self.ts.is_empty() {
            return Ok(());
        }
        // WITH ORDINALITY: ids follow the batch's order (reads order by time, then id).
        sqlx::query(
            "INSERT INTO events (node_id, ts_ms, gpu_id, kind, code, detail) \
             SELECT n, t, g, k, c, d FROM UNNEST($1::int8[], $2::int8[], $3::int8[], \
               $4::text[], $5::int8[], $6::text[]) WITH ORDINALITY AS v(n, t, g, k, c, d, o) \
             ORDER BY o ON CONFLICT DO NOTHING",
        )
        .bind(self.node)
        .bind(self.ts)
        .bind(self.gpu)
        .bind(self.kind)
        .bind(self.code)
        .bind(self.detail)
        .execute(&mut *conn)
        .await
        .map_err(q("insert events"))?;
        Ok(())
    }
}

/// Upserts the workloads that have no id yet (one row per key, in key order so that
/// concurrent collectors lock rows alike) and fills their ids in.
async fn upsert_workloads(
    conn: &mut PgConnection,
    slots: &mut [WorkloadSlot<'_>],
) -> Result<(), StoreError> {
    // Several variants of one workload (names learned later) share a key: merge them as
    // SQLite's row-by-row upsert would: the first variant's identity, the latest names.
    let mut by_key: BTreeMap<String, (Workload, UnixMs)> = BTreeMap::new();
    for s in slots.iter().filter(|s| s.id.is_none()) {
        match by_key.entry(s.workload.key()) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert((s.workload.clone(), s.first_ms));
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let (w, first) = o.get_mut();
                let n = s.workload;
                w.container_name = n.container_name.clone().or(w.container_name.take());
                w.image = n.image.clone().or(w.image.take());
                w.pod_name = n.pod_name.clone().or(w.pod_name.take());
                w.namespace = n.namespace.clone().or(w.namespace.take());
                *first = (*first).min(s.first_ms);
            }
        }
    }
    if by_key.is_empty() {
        return Ok(());
    }
    let opt = |f: fn(&Workload) -> &Option<String>| -> Vec<Option<String>> {
        by_key.values().map(|(w, _)| f(w).clone()).collect()
    };
    let rows = sqlx::query(
        "INSERT INTO workloads (key, kind, runtime, container_id, pod_uid, qos, job_id, step, \
           unit, uid, container_name, image, pod_name, namespace, first_seen_ms) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
           $6::text[], $7::text[], $8::text[], $9::text[], $10::int8[], $11::text[], \
           $12::text[], $13::text[], $14::text[], $15::int8[]) \
         ON CONFLICT (key) DO UPDATE SET \
           container_name = coalesce(excluded.container_name, workloads.container_name), \
           image = coalesce(excluded.image, workloads.image), \
           pod_name = coalesce(excluded.pod_name, workloads.pod_name), \
           namespace = coalesce(excluded.namespace, workloads.namespace), \
           first_seen_ms = least(workloads.first_seen_ms, excluded.first_seen_ms) \
         RETURNING id, key",
    )
    .bind(by_key.keys().cloned().collect::<Vec<String>>())
    .bind(
        by_key
            .values()
            .map(|(w, _)| w.kind.as_str().to_owned())
            .collect::<Vec<String>>(),
    )
    .bind(
        by_key
            .values()
            .map(|(w, _)| w.runtime.clone())
            .collect::<Vec<String>>(),
    )
    .bind(opt(|w| &w.container_id))
    .bind(opt(|w| &w.pod_uid))
    .bind(opt(|w| &w.qos))
    .bind(opt(|w| &w.job_id))
    .bind(opt(|w| &w.step))
    .bind(opt(|w| &w.unit))
    .bind(
        by_key
            .values()
            .map(|(w, _)| w.uid.map(i64::from))
            .collect::<Vec<Option<i64>>>(),
    )
    .bind(opt(|w| &w.container_name))
    .bind(opt(|w| &w.image))
    .bind(opt(|w| &w.pod_name))
    .bind(opt(|w| &w.namespace))
    .bind(by_key.values().map(|(_, t)| *t).collect::<Vec<i64>>())
    .fetch_all(&mut *conn)
    .await
    .map_err(q("upsert workloads"))?;
    let mut ids: HashMap<String, i64> = HashMap::with_capacity(rows.len());
    for row in &rows {
        ids.insert(get(row, "key")?, get(row, "id")?);
    }
    for s in slots.iter_mut().filter(|s| s.id.is_none()) {
        let key = s.workload.key();
        s.id = Some(*ids.get(&key).ok_or_else(|| {
            StoreError::Corrupt(format!("workload {key} has no id after upsert"))
        })?);
    }
    Ok(())
}

/// Every node's delivery state in one statement (nodes in id order).
async fn update_nodes(conn: &mut PgConnection, nodes: &[NodeUpdate]) -> Result<(), StoreError> {
    let col = |f: fn(&NodeUpdate) -> i64| nodes.iter().map(f).collect::<Vec<i64>>();
    sqlx::query(
        "UPDATE nodes SET \
           last_seen_ms = greatest(coalesce(nodes.last_seen_ms, v.newest), v.newest), \
           dropped_samples = CASE WHEN v.seq >= nodes.last_acked_seq \
             THEN v.dropped ELSE nodes.dropped_samples END, \
           spool_backlog_batches = CASE WHEN v.seq >= nodes.last_acked_seq \
             THEN v.backlog_batches ELSE nodes.spool_backlog_batches END, \
           spool_backlog_bytes = CASE WHEN v.seq >= nodes.last_acked_seq \
             THEN v.backlog_bytes ELSE nodes.spool_backlog_bytes END, \
           last_acked_seq = greatest(nodes.last_acked_seq, v.seq), \
           stored_samples = nodes.stored_samples + v.inserted \
         FROM UNNEST($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], \
           $7::int8[]) AS v(id, newest, seq, dropped, backlog_batches, backlog_bytes, inserted) \
         WHERE nodes.id = v.id",
    )
    .bind(col(|n| n.id))
    .bind(col(|n| n.newest_ms))
    .bind(col(|n| to_i64(n.seq)))
    .bind(col(|n| to_i64(n.delivery.dropped_samples)))
    .bind(col(|n| to_i64(n.delivery.spool_backlog_batches)))
    .bind(col(|n| to_i64(n.delivery.spool_backlog_bytes)))
    .bind(col(|n| to_i64(n.inserted)))
    .execute(&mut *conn)
    .await
    .map_err(q("update the nodes' delivery state"))?;
    Ok(())
}

// ------------------------------------------------------------------ reading rows

/// GPU sample columns, for a query joining `gpu_samples s` and `gpus g`.
const GPU_COLS: &str = "g.uuid AS gpu_uuid, s.ts_ms, s.util_gpu_pct, s.util_mem_pct, \
    s.mem_used_bytes, s.mem_total_bytes, s.mem_reserved_bytes, s.power_mw, s.power_instant_mw, \
    s.power_limit_mw, s.energy_mj, s.temp_gpu_c, s.temp_mem_c, s.fan_pct, s.clock_sm_mhz, \
    s.clock_mem_mhz, s.clock_graphics_mhz, s.pstate, s.pcie_tx_bps, s.pcie_rx_bps, \
    s.nvlink_tx_bps, s.nvlink_rx_bps, s.nvlinks, s.ecc_corrected_volatile, \
    s.ecc_uncorrected_volatile, s.throttle_reasons, s.enc_util_pct, s.dec_util_pct";

/// Process sample columns, for a query joining `process_samples p`, `gpus g`, `workloads w`.
const PROCESS_COLS: &str = "g.uuid AS gpu_uuid, p.ts_ms, p.pid, p.process_type, p.user_name, \
    p.command, p.gpu_mem_bytes, p.sm_util_pct, p.mem_util_pct, p.enc_util_pct, p.dec_util_pct, \
    p.mig_uuid, w.kind AS w_kind, w.runtime AS w_runtime, w.container_id AS w_container_id, \
    w.pod_uid AS w_pod_uid, w.qos AS w_qos, w.job_id AS w_job_id, w.step AS w_step, \
    w.unit AS w_unit, w.uid AS w_uid, w.container_name AS w_container_name, w.image AS w_image, \
    w.pod_name AS w_pod_name, w.namespace AS w_namespace";

/// Reads one column, turning a type mismatch into [`StoreError::Corrupt`].
fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get(column)
        .map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))
}

/// A u64 column (bigint holding the same bits).
fn get_u64(row: &PgRow, column: &str) -> Result<Option<u64>, StoreError> {
    Ok(get::<Option<i64>>(row, column)?.map(from_i64))
}

/// A u32 kept in a bigint (inventory tables): out of range means tampering.
fn get_u32_big(row: &PgRow, column: &str) -> Result<Option<u32>, StoreError> {
    get::<Option<i64>>(row, column)?
        .map(|v| {
            u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} {v} out of range")))
        })
        .transpose()
}

/// A u32 kept in an integer with the same bits (sample tables).
fn get_u32_bits(row: &PgRow, column: &str) -> Result<Option<u32>, StoreError> {
    Ok(get::<Option<i32>>(row, column)?.map(|v| v as u32))
}

/// A percentage or P-state kept in a smallint.
fn get_small(row: &PgRow, column: &str) -> Result<Option<u32>, StoreError> {
    get::<Option<i16>>(row, column)?
        .map(|v| {
            u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{column} is negative ({v})")))
        })
        .transpose()
}

fn required<T>(v: Option<T>, column: &str) -> Result<T, StoreError> {
    v.ok_or_else(|| StoreError::Corrupt(format!("{column} is NULL")))
}

/// Stores a u64 as the i64 with the same bits (lossless; see the schema).
fn to_i64(v: u64) -> i64 {
    v as i64
}

fn from_i64(v: i64) -> u64 {
    v as u64
}

fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn node_from_row(row: &PgRow) -> Result<NodeRecord, StoreError> {
    let labels: String = get(row, "labels")?;
    let labels: BTreeMap<String, String> = serde_json::from_str(&labels)
        .map_err(|e| StoreError::Corrupt(format!("nodes.labels is not a JSON object: {e}")))?;
    Ok(NodeRecord {
        id: NodeId(get(row, "id")?),
        name: get(row, "name")?,
        labels,
        agent_version: get(row, "agent_version")?,
        boot_id: get(row, "boot_id")?,
        source: get(row, "source")?,
        interval_ms: required(get_u32_big(row, "interval_ms")?, "interval_ms")?,
        first_seen_ms: get(row, "first_seen_ms")?,
        last_hello_ms: get(row, "last_hello_ms")?,
        last_seen_ms: get(row, "last_seen_ms")?,
        last_acked_seq: from_i64(get(row, "last_acked_seq")?),
        delivery: DeliveryStats {
            dropped_samples: from_i64(get(row, "dropped_samples")?),
            spool_backlog_batches: from_i64(get(row, "spool_backlog_batches")?),
            spool_backlog_bytes: from_i64(get(row, "spool_backlog_bytes")?),
        },
        stored_samples: from_i64(get(row, "stored_samples")?),
        driver_version: get(row, "driver_version")?,
        cuda_driver_version: get(row, "cuda_driver_version")?,
        nvml_version: get(row, "nvml_version")?,
        host: HostInfo {
            hostname: get(row, "hostname")?,
            kernel: get(row, "kernel")?,
            os: get(row, "os")?,
            cpu_count: get_u32_big(row, "cpu_count")?,
            memory_total_bytes: get_u64(row, "memory_total_bytes")?,
        },
        gpus: Vec::new(),
    })
}

fn gpu_from_row(row: &PgRow) -> Result<GpuRecord, StoreError> {
    let mig: String = get(row, "mig_instances")?;
    let mig_instances: Vec<MigInstance> = serde_json::from_str(&mig)
        .map_err(|e| StoreError::Corrupt(format!("gpus.mig_instances is not valid: {e}")))?;
    let u = |c: &str| get_u32_big(row, c);
    Ok(GpuRecord {
        id: GpuId(get(row, "id")?),
        info: GpuInfo {
            index: required(u("gpu_index")?, "gpu_index")?,
            uuid: get(row, "uuid")?,
            name: get(row, "name")?,
            serial: get(row, "serial")?,
            pci_bus_id: get(row, "pci_bus_id")?,
            architecture: get(row, "architecture")?,
            brand: get(row, "brand")?,
            memory_total_bytes: get_u64(row, "memory_total_bytes")?,
            power_limit_default_mw: u("power_limit_default_mw")?,
            power_limit_enforced_mw: u("power_limit_enforced_mw")?,
            power_limit_min_mw: u("power_limit_min_mw")?,
            power_limit_max_mw: u("power_limit_max_mw")?,
            max_clock_sm_mhz: u("max_clock_sm_mhz")?,
            max_clock_mem_mhz: u("max_clock_mem_mhz")?,
            max_clock_graphics_mhz: u("max_clock_graphics_mhz")?,
            nvlink_count: u("nvlink_count")?,
            mig_enabled: get(row, "mig_enabled")?,
            compute_mode: get(row, "compute_mode")?,
            persistence_mode: get(row, "persistence_mode")?,
            cuda_capability_major: u("cuda_capability_major")?,
            cuda_capability_minor: u("cuda_capability_minor")?,
            pcie_link_gen_max: u("pcie_link_gen_max")?,
            pcie_link_width_max: u("pcie_link_width_max")?,
            vbios_version: get(row, "vbios_version")?,
            mig_instances,
        },
    })
}

fn gpu_sample_from_row(row: &PgRow) -> Result<GpuSample, StoreError> {
    let nvlinks = match get::<Option<Vec<u8>>>(row, "nvlinks")? {
        Some(bytes) => decode_nvlinks(&bytes)
            .map_err(|e| StoreError::Corrupt(format!("gpu_samples.nvlinks: {e}")))?,
        None => Vec::new(),
    };
    let bits = |c: &str| get_u32_bits(row, c);
    let small = |c: &str| get_small(row, c);
    Ok(GpuSample {
        gpu_uuid: get(row, "gpu_uuid")?,
        util_gpu_pct: small("util_gpu_pct")?,
        util_mem_pct: small("util_mem_pct")?,
        mem_used_bytes: get_u64(row, "mem_used_bytes")?,
        mem_total_bytes: get_u64(row, "mem_total_bytes")?,
        mem_reserved_bytes: get_u64(row, "mem_reserved_bytes")?,
        power_mw: bits("power_mw")?,
        power_instant_mw: bits("power_instant_mw")?,
        power_limit_mw: bits("power_limit_mw")?,
        energy_mj: get_u64(row, "energy_mj")?,
        temp_gpu_c: bits("temp_gpu_c")?,
        temp_mem_c: bits("temp_mem_c")?,
        fan_pct: small("fan_pct")?,
        clock_sm_mhz: bits("clock_sm_mhz")?,
        clock_mem_mhz: bits("clock_mem_mhz")?,
        clock_graphics_mhz: bits("clock_graphics_mhz")?,
        pstate: small("pstate")?,
        pcie_tx_bps: get_u64(row, "pcie_tx_bps")?,
        pcie_rx_bps: get_u64(row, "pcie_rx_bps")?,
        nvlink_tx_bps: get_u64(row, "nvlink_tx_bps")?,
        nvlink_rx_bps: get_u64(row, "nvlink_rx_bps")?,
        nvlinks,
        ecc_corrected_volatile: get_u64(row, "ecc_corrected_volatile")?,
        ecc_uncorrected_volatile: get_u64(row, "ecc_uncorrected_volatile")?,
        throttle_reasons: get_u64(row, "throttle_reasons")?,
        enc_util_pct: small("enc_util_pct")?,
        dec_util_pct: small("dec_util_pct")?,
    })
}

fn process_from_row(row: &PgRow) -> Result<ProcessSample, StoreError> {
    let process_type = match get::<i16>(row, "process_type")? {
        1 => ProcessType::Compute,
        2 => ProcessType::Graphics,
        3 => ProcessType::ComputeAndGraphics,
        other => {
            return Err(StoreError::Corrupt(format!(
                "process_samples.process_type {other}"
            )));
        }
    };
    Ok(ProcessSample {
        gpu_uuid: get(row, "gpu_uuid")?,
        pid: get::<i32>(row, "pid")? as u32,
        process_type,
        user: get(row, "user_name")?,
        command: get(row, "command")?,
        gpu_mem_bytes: get_u64(row, "gpu_mem_bytes")?,
        sm_util_pct: get_small(row, "sm_util_pct")?,
        mem_util_pct: get_small(row, "mem_util_pct")?,
        enc_util_pct: get_small(row, "enc_util_pct")?,
        dec_util_pct: get_small(row, "dec_util_pct")?,
        workload: workload_from_row(row)?,
        mig_uuid: get(row, "mig_uuid")?,
    })
}

/// The workload columns of a row (`w_kind`, `w_runtime`, ... as in [`PROCESS_COLS`]).
fn workload_from_row(row: &PgRow) -> Result<Workload, StoreError> {
    let kind: String = get(row, "w_kind")?;
    let kind = WorkloadKind::parse(&kind)
        .ok_or_else(|| StoreError::Corrupt(format!("workloads.kind {kind:?}")))?;
    Ok(Workload {
        kind,
        runtime: get(row, "w_runtime")?,
        container_id: get(row, "w_container_id")?,
        pod_uid: get(row, "w_pod_uid")?,
        qos: get(row, "w_qos")?,
        job_id: get(row, "w_job_id")?,
        step: get(row, "w_step")?,
        unit: get(row, "w_unit")?,
        uid: get_u32_big(row, "w_uid")?,
        container_name: get(row, "w_container_name")?,
        image: get(row, "w_image")?,
        pod_name: get(row, "w_pod_name")?,
        namespace: get(row, "w_namespace")?,
    })
}

fn host_from_row(row: &PgRow) -> Result<HostRow, StoreError> {
    let sample = HostSample {
        cpu_util_pct: get(row, "cpu_util_pct")?,
        mem_used_bytes: get_u64(row, "mem_used_bytes")?,
        mem_total_bytes: get_u64(row, "mem_total_bytes")?,
        disk_read_bps: get_u64(row, "disk_read_bps")?,
        disk_write_bps: get_u64(row, "disk_write_bps")?,
        net_rx_bps: get_u64(row, "net_rx_bps")?,
        net_tx_bps: get_u64(row, "net_tx_bps")?,
        load1: get(row, "load1")?,
    };
    let slowest: Option<String> = get(row, "cost_slowest_calls")?;
    let slowest_calls_us = match slowest {
        Some(s) => serde_json::from_str(&s).map_err(|e| {
            StoreError::Corrupt(format!("host_samples.cost_slowest_calls is not valid: {e}"))
        })?,
        None => BTreeMap::new(),
    };
    let cost = gpufleet_core::SamplerCost {
        cpu_us: get_u32_bits(row, "cost_cpu_us")?,
        wall_us: get_u32_bits(row, "cost_wall_us")?,
        source_us: get_u32_bits(row, "cost_source_us")?,
        slowest_calls_us,
    };
    let has_cost = cost.cpu_us.is_some()
        || cost.wall_us.is_some()
        || cost.source_us.is_some()
        || !cost.slowest_calls_us.is_empty();
    Ok(HostRow {
        time_ms: get(row, "ts_ms")?,
        sample: (sample != HostSample::default()).then_some(sample),
        cost: has_cost.then_some(cost),
    })
}

fn event_kind(s: &str) -> Result<EventKind, StoreError> {
    use EventKind::*;
    [
        Xid,
        EccDoubleBit,
        EccSingleBit,
        GpuLost,
        GpuRecovered,
        Throttle,
        SpoolDrop,
    ]
    .into_iter()
    .find(|k| k.as_str() == s)
    .ok_or_else(|| StoreError::Corrupt(format!("events.kind {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_name_their_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        // T0 of the tests, 1_800_000_000_000 ms.
        let day = 1_800_000_000_000i64.div_euclid(DAY_MS);
        assert_eq!(partition_name("gpu_samples", day), "gpu_samples_p20270115");
        assert_eq!(
            partition_name("host_samples", -800_000),
            "host_samples_dm800000"
        );
        assert_eq!(
            day_bounds(day),
            ("1799971200000".to_owned(), "1800057600000".to_owned())
        );
        assert_eq!(day_bounds(i64::MAX / DAY_MS).1, "MAXVALUE");
    }

    #[test]
    fn partition_bounds_parse() {
        assert_eq!(
            parse_bound("FOR VALUES FROM ('1799971200000') TO ('1800057600000')").ok(),
            Some((Some(1_799_971_200_000), Some(1_800_057_600_000)))
        );
        assert_eq!(
            parse_bound("FOR VALUES FROM (MINVALUE) TO ('-5')").ok(),
            Some((None, Some(-5)))
        );
        assert!(parse_bound("DEFAULT").is_err());
    }

    #[test]
    fn small_columns_refuse_what_does_not_fit() {
        assert_eq!(small(Some(100), "x").ok(), Some(Some(100)));
        assert_eq!(small(None, "x").ok(), Some(None));
        assert!(small(Some(40_000), "x").is_err());
        assert_eq!(bits32(Some(u32::MAX)), Some(-1));
    }
}
