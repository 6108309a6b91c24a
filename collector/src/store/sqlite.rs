//! The SQLite backend: one file, WAL, `synchronous=NORMAL` (a commit survives a crash of
//! the collector; a power loss may lose the last commits, never corrupt the file). The
//! queries are shared ([`super::SqlStore`]); what is here is opening the file, the write
//! queue, lease files and the group-commit write path.
//!
//! The write path is built for throughput: every table is written with multi-row
//! `INSERT ... VALUES (...),(...)` statements, one transaction per group commit. Statement
//! texts exist for power-of-two row counts only, so a batch of any size is written with a
//! few statements whose prepared form sqlx keeps cached (it caches by SQL text), and the
//! statement cache never churns. GPU rows of several nodes share statements (see
//! [`Packing`]); all nodes' delivery state is one `UPDATE ... FROM (VALUES ...)`.
//! Workload ids are cached in memory after commit, so process rows need no lookups.
//!
//! The sample tables are written with `INSERT OR IGNORE` (SQLite's `ON CONFLICT DO
//! NOTHING` for every constraint): a statement that cannot abort needs no statement
//! journal, which saves copying every page it touches. Nothing else can conflict: keys
//! and types are bound by this module.

use super::backend::Get as _;
use super::backend::{Backend, Dialect, Value, run};
use super::carbon::{self, CarbonMinute};
use super::lease::{self, Lease, LocalLeases};
use super::rows::to_i64;
use super::write::{
    Collected, NodeUpdate, RowSink, WorkloadSlot, collect_rows, conflicts_of, outcome, workload_id,
};
use super::{
    BatchConflict, NodeBatch, SqlStore, StoreError, WriteOutcome, encode_nvlinks, migrate,
    migrations, redact_url,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use gpufleet_carbon::IntensitySlot;
use gpufleet_core::{
    Event, GpuSample, HostSample, ProcessSample, ProcessType, SamplerCost, Tick, UnixMs,
};
use sqlx::error::BoxDynError;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Arguments, AssertSqlSafe, Sqlite};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// SQLite's default limit on bound parameters per statement (SQLITE_MAX_VARIABLE_NUMBER).
const MAX_PARAMS: usize = 32_766;
/// Most rows per INSERT statement. Measured here (release, 28-column GPU rows): 512 and
/// 1024 are within noise of each other, 128 is ~15% slower.
const MAX_ROWS_PER_STATEMENT: usize = 512;

type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments>;

/// The store on SQLite.
pub type SqliteStore = SqlStore<Sqlite>;

/// What a SQLite store keeps besides its pool.
#[derive(Debug)]
pub struct SqliteLocal {
    /// Job leases ([`super::lease`]): a lock file beside the database file, or in-process
    /// locks for an in-memory database.
    leases: Leases,
    /// Taken by each of this process's write transactions (group commits, node
    /// registrations, rollups, energy minutes, carbon prices and cached intensities, tokens
    /// excepted, each retention statement) for its duration. SQLite admits one writer at a
    /// time and makes the others poll with sleeps (the busy timeout), which is not fair:
    /// back-to-back retention deletes won nearly every race and the group-commit writer
    /// waited seconds. This queue is first come, first served, so a commit waits for at
    /// most the transaction ahead of it.
    write_gate: tokio::sync::Mutex<()>,
}

/// Where a SQLite store's job leases live.
#[derive(Debug)]
enum Leases {
    /// `flock` on `<file>.lead-<job>`: exclusive across the processes of one host.
    File(PathBuf),
    Local(LocalLeases),
}

fn q(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { op, source }
}

impl SqlStore<Sqlite> {
    /// Opens (creating if missing) the database `url` names (`sqlite://PATH`,
    /// `sqlite::memory:`) and applies the migrations.
    pub async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let shown = redact_url(url);
        let open_err = |source| StoreError::Open {
            url: shown.clone(),
            source,
        };
        let options = SqliteConnectOptions::from_str(url)
            .map_err(open_err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true)
            .statement_cache_capacity(256);
        // An in-memory database is shared between connections through SQLite's shared
        // cache, whose table locks are not covered by the busy timeout: use one connection.
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let leases = if in_memory {
            Leases::Local(LocalLeases::default())
        } else {
            Leases::File(options.get_filename().to_owned())
        };
        let pool = SqlitePoolOptions::new()
            .max_connections(if in_memory { 1 } else { 4 })
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(open_err)?;
        migrate(&pool, migrations!("sqlite")).await?;
        let local = SqliteLocal {
            leases,
            write_gate: tokio::sync::Mutex::new(()),
        };
        Ok(SqlStore::new(pool, local))
    }

    /// One attempt at a group commit: one transaction, GPU rows packed as
    /// `packing` says, without the `skip`ped batches. When `checked`, the stored rows are
    /// compared with the batches' before anything is inserted, and the conflicting ones
    /// join `skip` and `conflicts`.
    async fn write_once(
        &self,
        batches: &[NodeBatch],
        packing: Packing,
        skip: &mut HashSet<usize>,
        conflicts: &mut Vec<BatchConflict>,
        checked: bool,
    ) -> Result<WriteOutcome, WriteFail> {
        let mut tx = self.begin_group(batches, skip, conflicts, checked).await?;
        let mut rows = Rows::with_capacity(batches);
        let Collected {
            mut nodes,
            mut workloads,
        } = collect_rows(batches, skip, &self.cached_workloads(), &mut rows)?;
        upsert_workloads(tx.conn(), &mut workloads).await?;
        for r in &mut rows.process {
            r.workload = workload_id(&workloads[r.slot])?;
        }
        let mut inserted = vec![0u64; nodes.len()];
        if !insert_gpu_rows(tx.conn(), &rows.gpu, &mut inserted, packing).await? {
            tx.rollback().await?;
            return Err(WriteFail::Ambiguous);
        }
        insert_rows(tx.conn(), &PROCESS_SAMPLES, &rows.process, bind_process)
            .await
            .map_err(q("insert process samples"))?;
        let hosts = insert_rows(tx.conn(), &HOST_SAMPLES, &rows.host, bind_host)
            .await
            .map_err(q("insert host samples"))?;
        let skipped =
            inserted.iter().sum::<u64>() < rows.gpu.len() as u64 || hosts < rows.host.len() as u64;
        if skipped
            && !conflicts_of::<Sqlite>(tx.conn(), batches, skip, None)
                .await?
                .is_empty()
        {
            // Some skipped rows were not replays: decide which batches conflict before
            // inserting, in a new transaction.
            tx.rollback().await?;
            return Err(WriteFail::Recheck);
        }
        insert_rows(tx.conn(), &EVENTS, &rows.events, bind_event)
            .await
            .map_err(q("insert events"))?;
        for (node, n) in nodes.iter_mut().zip(&inserted) {
            node.inserted = *n;
        }
        insert_rows(tx.conn(), &NODE_UPDATES, &nodes, bind_node_update)
            .await
            .map_err(q("update the nodes' delivery state"))?;
        tx.commit("commit").await?;
        self.cache_workloads(workloads.iter().map(|s| (s.workload, s.id)));
        Ok(outcome(&nodes))
    }
}

#[async_trait]
impl Backend for Sqlite {
    const BACKEND: &'static str = "sqlite";
    const DIALECT: Dialect = Dialect::Sqlite;
    const BEGIN_WRITE: Option<&'static str> = Some("BEGIN IMMEDIATE");
    const SHARED: bool = false;
    type Local = SqliteLocal;

    fn write_gate(local: &SqliteLocal) -> Option<&tokio::sync::Mutex<()>> {
        Some(&local.write_gate)
    }

    run!(Sqlite, SqliteArguments, add_sqlite);

    async fn write_batches(
        store: &SqliteStore,
        batches: &[NodeBatch],
    ) -> Result<WriteOutcome, StoreError> {
        let mut packing = Packing::AcrossNodes;
        let mut skip = HashSet::new();
        let mut conflicts = Vec::new();
        let mut checked = false;
        // A round commits, or switches to per-node statements (once), or to checking
        // conflicts first: only a concurrent writer could make the checked rounds repeat.
        for _ in 0..super::write::MAX_WRITE_ROUNDS {
            match store
                .write_once(batches, packing, &mut skip, &mut conflicts, checked)
                .await
            {
                Ok(mut outcome) => {
                    outcome.conflicts = conflicts;
                    return Ok(outcome);
                }
                Err(WriteFail::Store(e)) => return Err(e),
                Err(WriteFail::Ambiguous) if packing == Packing::AcrossNodes => {
                    packing = Packing::PerNode;
                }
                Err(WriteFail::Ambiguous) => {
                    return Err(StoreError::Corrupt(
                        "per-node statements reported shared rows".into(),
                    ));
                }
                Err(WriteFail::Recheck) => checked = true,
            }
        }
        Err(StoreError::Corrupt(
            "conflicting GPU samples kept appearing while writing; nothing was written".into(),
        ))
    }

    async fn try_lead(store: &SqliteStore, job: &str) -> Result<Option<Lease>, StoreError> {
        match &store.local.leases {
            Leases::File(db) => lease::file(db, job),
            Leases::Local(local) => Ok(local.try_lead(job)),
        }
    }

    async fn drop_expired_raw(_: &SqliteStore) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    async fn upsert_intensity(
        store: &SqliteStore,
        slots: &[IntensitySlot],
    ) -> Result<(), StoreError> {
        carbon::upsert_intensity_rows(store, slots).await
    }

    async fn replace_carbon_minutes(
        store: &SqliteStore,
        minutes: &[CarbonMinute],
    ) -> Result<(), StoreError> {
        carbon::replace_carbon_rows(store, minutes).await
    }
}

// ------------------------------------------------------------------ one write's rows

/// How GPU sample rows are packed into statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packing {
    /// Rows of several nodes share statements: the fewest statements when many nodes send
    /// small batches. A shared statement's inserted-row count can be split per node only
    /// when it inserted all its rows; when it met rows already stored (a replay), the
    /// transaction is rolled back and redone with `PerNode`.
    AcrossNodes,
    /// Every statement holds one node's rows, so its inserted-row count is that node's.
    PerNode,
}

/// Why one write attempt did not commit.
enum WriteFail {
    Store(StoreError),
    /// A statement shared by several nodes met replayed rows (see [`Packing`]).
    Ambiguous,
    /// Skipped GPU samples were not all replays: redo the write checking first.
    Recheck,
}

impl From<StoreError> for WriteFail {
    fn from(e: StoreError) -> Self {
        WriteFail::Store(e)
    }
}

/// A write's sample rows, as the multi-row statements bind them (see
/// [`super::write::collect_rows`]).
struct Rows<'b> {
    gpu: Vec<GpuRow<'b>>,
    process: Vec<ProcessRow<'b>>,
    host: Vec<HostRowRef<'b>>,
    events: Vec<EventRow<'b>>,
}

impl<'b> Rows<'b> {
    fn with_capacity(batches: &[NodeBatch]) -> Rows<'b> {
        let (mut gpu_rows, mut process_rows) = (0, 0);
        for nb in batches {
            for t in &nb.batch.ticks {
                gpu_rows += t.gpus.len();
                process_rows += t.processes.len();
            }
        }
        Rows {
            gpu: Vec::with_capacity(gpu_rows),
            process: Vec::with_capacity(process_rows),
            host: Vec::new(),
            events: Vec::new(),
        }
    }
}

impl<'b> RowSink<'b> for Rows<'b> {
    fn gpu(
        &mut self,
        group: usize,
        gpu: i64,
        ts: UnixMs,
        s: &'b GpuSample,
    ) -> Result<(), StoreError> {
        self.gpu.push(GpuRow { group, gpu, ts, s });
        Ok(())
    }

    fn process(
        &mut self,
        gpu: i64,
        ts: UnixMs,
        slot: usize,
        p: &'b ProcessSample,
    ) -> Result<(), StoreError> {
        self.process.push(ProcessRow {
            gpu,
            ts,
            slot,
            workload: 0,
            p,
        });
        Ok(())
    }

    fn host(&mut self, node: i64, ts: UnixMs, t: &'b Tick) -> Result<(), StoreError> {
        self.host.push(HostRowRef {
            node,
            ts,
            host: t.host.as_ref(),
            cost: t.cost.as_ref(),
        });
        Ok(())
    }

    fn event(&mut self, node: i64, gpu: Option<i64>, e: &'b Event) -> Result<(), StoreError> {
        self.events.push(EventRow { node, gpu, e });
        Ok(())
    }
}

/// Upserts the workloads that have no id yet and fills their ids in.
async fn upsert_workloads(
    conn: &mut SqliteConnection,
    slots: &mut [WorkloadSlot<'_>],
) -> Result<(), StoreError> {
    let missing: Vec<(usize, String)> = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.id.is_none())
        .map(|(i, s)| (i, s.workload.key()))
        .collect();
    let mut by_key: HashMap<String, i64> = HashMap::with_capacity(missing.len());
    let mut rest = &missing[..];
    for n in chunk_sizes(missing.len(), WORKLOADS.max_rows()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut query = WORKLOADS.query(n);
        for (i, key) in chunk {
            let (w, t) = (slots[*i].workload, slots[*i].first_ms);
            query = query
                .bind(key.as_str())
                .bind(w.kind.as_str())
                .bind(w.runtime.as_str())
                .bind(w.container_id.as_deref())
                .bind(w.pod_uid.as_deref())
                .bind(w.qos.as_deref())
                .bind(w.job_id.as_deref())
                .bind(w.step.as_deref())
                .bind(w.unit.as_deref())
                .bind(w.uid)
                .bind(w.container_name.as_deref())
                .bind(w.image.as_deref())
                .bind(w.pod_name.as_deref())
                .bind(w.namespace.as_deref())
                .bind(t);
        }
        // Rows come back in no particular order: match them by key.
        for row in query
            .fetch_all(&mut *conn)
            .await
            .map_err(q("upsert workloads"))?
        {
            by_key.insert(row.get("key")?, row.get("id")?);
        }
    }
    for (i, key) in missing {
        let id = by_key
            .get(&key)
            .ok_or_else(|| StoreError::Corrupt(format!("workload {key} has no id after upsert")))?;
        slots[i].id = Some(*id);
    }
    Ok(())
}

/// Inserts GPU rows and counts, per node group, how many were new. Returns `false` when a
/// statement shared by several nodes met replayed rows (the caller redoes the write with
/// [`Packing::PerNode`]).
async fn insert_gpu_rows(
    conn: &mut SqliteConnection,
    rows: &[GpuRow<'_>],
    inserted: &mut [u64],
    packing: Packing,
) -> Result<bool, StoreError> {
    match packing {
        Packing::PerNode => {
            for run in rows.chunk_by(|a, b| a.group == b.group) {
                inserted[run[0].group] += insert_rows(conn, &GPU_SAMPLES, run, bind_gpu)
                    .await
                    .map_err(q("insert GPU samples"))?;
            }
        }
        Packing::AcrossNodes => {
            let mut rest = rows;
            for n in chunk_sizes(rows.len(), GPU_SAMPLES.max_rows()) {
                let (chunk, tail) = rest.split_at(n);
                rest = tail;
                let new = execute_chunk(conn, &GPU_SAMPLES, chunk, bind_gpu)
                    .await
                    .map_err(q("insert GPU samples"))?;
                let (first, last) = (chunk[0].group, chunk[n - 1].group);
                if new == n as u64 {
                    for r in chunk {
                        inserted[r.group] += 1;
                    }
                } else if first == last {
                    inserted[first] += new;
                } else {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

// ------------------------------------------------------------------ multi-row inserts

/// One table's multi-row INSERT: `{head} VALUES (?, ...), (?, ...) {tail}`.
struct InsertSql {
    head: &'static str,
    tail: &'static str,
    columns: usize,
    /// Statement text per power-of-two row count (index k: 2^k rows), built on first use.
    texts: [OnceLock<Arc<str>>; 16],
}

impl InsertSql {
    const fn new(head: &'static str, tail: &'static str, columns: usize) -> InsertSql {
        InsertSql {
            head,
            tail,
            columns,
            texts: [const { OnceLock::new() }; 16],
        }
    }

    /// Most rows per statement: a power of two, within SQLite's bound-parameter limit.
    fn max_rows(&self) -> usize {
        let fit = MAX_PARAMS / self.columns;
        let pow = 1usize << (usize::BITS - 1 - fit.leading_zeros());
        pow.min(MAX_ROWS_PER_STATEMENT)
    }

    /// A query for `rows` rows (a power of two up to [`Self::max_rows`]), with room for
    /// its arguments reserved.
    fn query(&self, rows: usize) -> SqliteQuery<'static> {
        let k = rows.trailing_zeros() as usize;
        let text = self.texts[k.min(15)].get_or_init(|| {
            let mut one = String::with_capacity(self.columns * 3 + 2);
            one.push('(');
            for c in 0..self.columns {
                one.push_str(if c == 0 { "?" } else { ", ?" });
            }
            one.push(')');
            let mut sql = String::with_capacity(self.head.len() + rows * (one.len() + 2) + 64);
            sql.push_str(self.head);
            sql.push_str(" VALUES ");
            for r in 0..rows {
                if r > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&one);
            }
            sql.push(' ');
            sql.push_str(self.tail);
            Arc::from(sql)
        });
        let mut args = SqliteArguments::default();
        args.reserve(rows * self.columns, 0);
        sqlx::query_with(AssertSqlSafe(Arc::clone(text)), args)
    }
}

/// Splits `n` rows into statement sizes: full statements of `max` rows, then the rest as
/// descending powers of two (e.g. 1300 with max 512: 512, 512, 256, 16, 4).
fn chunk_sizes(n: usize, max: usize) -> impl Iterator<Item = usize> {
    let full = n / max;
    let rest = n % max;
    std::iter::repeat_n(max, full).chain(
        (0..usize::BITS)
            .rev()
            .map(|b| 1usize << b)
            .filter(move |&p| rest & p != 0),
    )
}

/// Executes one statement of `rows.len()` rows (a power of two up to `max_rows`);
/// returns how many rows it inserted.
async fn execute_chunk<R>(
    conn: &mut SqliteConnection,
    sql: &InsertSql,
    rows: &[R],
    bind: for<'q> fn(SqliteQuery<'q>, &R) -> SqliteQuery<'q>,
) -> Result<u64, sqlx::Error> {
    let mut query = sql.query(rows.len());
    for r in rows {
        query = bind(query, r);
    }
    Ok(query.execute(&mut *conn).await?.rows_affected())
}

/// Writes `rows` with as few statements as [`chunk_sizes`] allows; returns how many rows
/// were new (conflicting rows, i.e. replays, are skipped by the statement's tail).
async fn insert_rows<R>(
    conn: &mut SqliteConnection,
    sql: &InsertSql,
    rows: &[R],
    bind: for<'q> fn(SqliteQuery<'q>, &R) -> SqliteQuery<'q>,
) -> Result<u64, sqlx::Error> {
    let mut inserted = 0;
    let mut rest = rows;
    for n in chunk_sizes(rows.len(), sql.max_rows()) {
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        inserted += execute_chunk(conn, sql, chunk, bind).await?;
    }
    Ok(inserted)
}

static GPU_SAMPLES: InsertSql = InsertSql::new(
    "INSERT OR IGNORE INTO gpu_samples (gpu_id, ts_ms, util_gpu_pct, util_mem_pct, mem_used_bytes, \
     mem_total_bytes, mem_reserved_bytes, power_mw, power_instant_mw, power_limit_mw, energy_mj, \
     temp_gpu_c, temp_mem_c, fan_pct, clock_sm_mhz, clock_mem_mhz, clock_graphics_mhz, pstate, \
     pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps, nvlinks, ecc_corrected_volatile, \
     ecc_uncorrected_volatile, throttle_reasons, enc_util_pct, dec_util_pct)",
    "",
    28,
);

static PROCESS_SAMPLES: InsertSql = InsertSql::new(
    "INSERT OR IGNORE INTO process_samples (gpu_id, ts_ms, pid, workload_id, process_type, user_name, \
     command, gpu_mem_bytes, sm_util_pct, mem_util_pct, enc_util_pct, dec_util_pct, mig_uuid)",
    "",
    13,
);

static HOST_SAMPLES: InsertSql = InsertSql::new(
    "INSERT OR IGNORE INTO host_samples (node_id, ts_ms, cpu_util_pct, mem_used_bytes, mem_total_bytes, \
     disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps, load1, cost_cpu_us, cost_wall_us, \
     cost_source_us, cost_slowest_calls)",
    "",
    14,
);

static EVENTS: InsertSql = InsertSql::new(
    "INSERT INTO events (node_id, ts_ms, gpu_id, kind, code, detail)",
    "ON CONFLICT DO NOTHING",
    6,
);

static WORKLOADS: InsertSql = InsertSql::new(
    "INSERT INTO workloads (key, kind, runtime, container_id, pod_uid, qos, job_id, step, unit, \
     uid, container_name, image, pod_name, namespace, first_seen_ms)",
    "ON CONFLICT (key) DO UPDATE SET \
     container_name = coalesce(excluded.container_name, container_name), \
     image = coalesce(excluded.image, image), \
     pod_name = coalesce(excluded.pod_name, pod_name), \
     namespace = coalesce(excluded.namespace, namespace), \
     first_seen_ms = min(first_seen_ms, excluded.first_seen_ms) \
     RETURNING id, key",
    15,
);

/// Every node's delivery state in one statement. Right-hand sides see each row as it was
/// before the UPDATE. VALUES columns: id, newest tick time, highest seq, its dropped
/// samples, spool backlog batches and bytes, GPU samples inserted.
static NODE_UPDATES: InsertSql = InsertSql::new(
    "UPDATE nodes SET \
       last_seen_ms = max(coalesce(nodes.last_seen_ms, v.column2), v.column2), \
       dropped_samples = CASE WHEN v.column3 >= nodes.last_acked_seq \
         THEN v.column4 ELSE nodes.dropped_samples END, \
       spool_backlog_batches = CASE WHEN v.column3 >= nodes.last_acked_seq \
         THEN v.column5 ELSE nodes.spool_backlog_batches END, \
       spool_backlog_bytes = CASE WHEN v.column3 >= nodes.last_acked_seq \
         THEN v.column6 ELSE nodes.spool_backlog_bytes END, \
       last_acked_seq = max(nodes.last_acked_seq, v.column3), \
       stored_samples = nodes.stored_samples + v.column7 \
     FROM (",
    ") AS v WHERE nodes.id = v.column1",
    7,
);

fn bind_node_update<'q>(q: SqliteQuery<'q>, n: &NodeUpdate) -> SqliteQuery<'q> {
    q.bind(n.id)
        .bind(n.newest_ms)
        .bind(to_i64(n.seq))
        .bind(to_i64(n.delivery.dropped_samples))
        .bind(to_i64(n.delivery.spool_backlog_batches))
        .bind(to_i64(n.delivery.spool_backlog_bytes))
        .bind(to_i64(n.inserted))
}

struct GpuRow<'a> {
    /// Index of the node's group in [`Rows::nodes`].
    group: usize,
    gpu: i64,
    ts: i64,
    s: &'a GpuSample,
}

fn bind_gpu<'q>(q: SqliteQuery<'q>, r: &GpuRow<'_>) -> SqliteQuery<'q> {
    let s = r.s;
    q.bind(r.gpu)
        .bind(r.ts)
        .bind(s.util_gpu_pct)
        .bind(s.util_mem_pct)
        .bind(s.mem_used_bytes.map(to_i64))
        .bind(s.mem_total_bytes.map(to_i64))
        .bind(s.mem_reserved_bytes.map(to_i64))
        .bind(s.power_mw)
        .bind(s.power_instant_mw)
        .bind(s.power_limit_mw)
        .bind(s.energy_mj.map(to_i64))
        .bind(s.temp_gpu_c)
        .bind(s.temp_mem_c)
        .bind(s.fan_pct)
        .bind(s.clock_sm_mhz)
        .bind(s.clock_mem_mhz)
        .bind(s.clock_graphics_mhz)
        .bind(s.pstate)
        .bind(s.pcie_tx_bps.map(to_i64))
        .bind(s.pcie_rx_bps.map(to_i64))
        .bind(s.nvlink_tx_bps.map(to_i64))
        .bind(s.nvlink_rx_bps.map(to_i64))
        .bind(encode_nvlinks(&s.nvlinks))
        .bind(s.ecc_corrected_volatile.map(to_i64))
        .bind(s.ecc_uncorrected_volatile.map(to_i64))
        .bind(s.throttle_reasons.map(to_i64))
        .bind(s.enc_util_pct)
        .bind(s.dec_util_pct)
}

struct ProcessRow<'a> {
    gpu: i64,
    ts: i64,
    /// Index in [`Rows::workloads`]; resolved to `workload` once ids are known.
    slot: usize,
    workload: i64,
    p: &'a ProcessSample,
}

fn bind_process<'q>(q: SqliteQuery<'q>, r: &ProcessRow<'_>) -> SqliteQuery<'q> {
    let p = r.p;
    let process_type: i64 = match p.process_type {
        ProcessType::Compute => 1,
        ProcessType::Graphics => 2,
        ProcessType::ComputeAndGraphics => 3,
    };
    q.bind(r.gpu)
        .bind(r.ts)
        .bind(p.pid)
        .bind(r.workload)
        .bind(process_type)
        .bind(p.user.as_deref())
        .bind(p.command.as_deref())
        .bind(p.gpu_mem_bytes.map(to_i64))
        .bind(p.sm_util_pct)
        .bind(p.mem_util_pct)
        .bind(p.enc_util_pct)
        .bind(p.dec_util_pct)
        .bind(p.mig_uuid.as_deref())
}

struct HostRowRef<'a> {
    node: i64,
    ts: i64,
    host: Option<&'a HostSample>,
    cost: Option<&'a SamplerCost>,
}

fn bind_host<'q>(q: SqliteQuery<'q>, r: &HostRowRef<'_>) -> SqliteQuery<'q> {
    let h = r.host.cloned().unwrap_or_default();
    let c = r.cost;
    let slowest = c
        .filter(|c| !c.slowest_calls_us.is_empty())
        .and_then(|c| serde_json::to_string(&c.slowest_calls_us).ok());
    q.bind(r.node)
        .bind(r.ts)
        .bind(h.cpu_util_pct.map(f64::from))
        .bind(h.mem_used_bytes.map(to_i64))
        .bind(h.mem_total_bytes.map(to_i64))
        .bind(h.disk_read_bps.map(to_i64))
        .bind(h.disk_write_bps.map(to_i64))
        .bind(h.net_rx_bps.map(to_i64))
        .bind(h.net_tx_bps.map(to_i64))
        .bind(h.load1.map(f64::from))
        .bind(c.and_then(|c| c.cpu_us))
        .bind(c.and_then(|c| c.wall_us))
        .bind(c.and_then(|c| c.source_us))
        .bind(slowest)
}

struct EventRow<'a> {
    node: i64,
    gpu: Option<i64>,
    e: &'a Event,
}

fn bind_event<'q>(q: SqliteQuery<'q>, r: &EventRow<'_>) -> SqliteQuery<'q> {
    q.bind(r.node)
        .bind(r.e.time_ms)
        .bind(r.gpu)
        .bind(r.e.kind.as_str())
        .bind(r.e.code.map(to_i64))
        .bind(r.e.detail.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_sizes_cover_every_row_with_cached_sizes() {
        for n in [0, 1, 7, 8, 511, 512, 513, 1300, 5000] {
            let sizes: Vec<usize> = chunk_sizes(n, 512).collect();
            assert_eq!(sizes.iter().sum::<usize>(), n, "{n}: {sizes:?}");
            assert!(
                sizes.iter().all(|s| s.is_power_of_two() && *s <= 512),
                "{sizes:?}"
            );
        }
        assert_eq!(
            chunk_sizes(1300, 512).collect::<Vec<_>>(),
            vec![512, 512, 256, 16, 4]
        );
    }

    #[test]
    fn statements_stay_within_the_parameter_limit() {
        for sql in [
            &GPU_SAMPLES,
            &PROCESS_SAMPLES,
            &HOST_SAMPLES,
            &EVENTS,
            &WORKLOADS,
        ] {
            let rows = sql.max_rows();
            assert!(rows.is_power_of_two() && rows * sql.columns <= MAX_PARAMS);
            let head_columns = sql.head.matches(',').count() + 1;
            assert_eq!(head_columns, sql.columns, "{}", sql.head);
        }
    }
}
