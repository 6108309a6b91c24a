//! The SQLite backend: one file, WAL, `synchronous=NORMAL` (a commit survives a crash of
//! the collector; a power loss may lose the last commits, never corrupt the file). The
//! queries are shared ([`super::SqlStore`]); what is here is opening the file, the write
//! queue, lease files and the group-commit write path.
//!
//! The sample rows of a group commit are written for throughput with multi-row
//! `INSERT ... VALUES (...),(...)` statements. Statement texts exist for power-of-two row
//! counts only, so a batch of any size is written with a few statements whose prepared
//! form sqlx keeps cached (it caches by SQL text), and the statement cache never churns.
//! GPU rows of several nodes share statements (see [`insert_gpu_rows`]).
//!
//! The sample tables are written with `INSERT OR IGNORE` (SQLite's `ON CONFLICT DO
//! NOTHING` for every constraint): a statement that cannot abort needs no statement
//! journal, which saves copying every page it touches. Nothing else can conflict: keys
//! and types are bound by this module.

use super::backend::{Backend, Dialect, Value, run};
use super::lease::{self, Lease, LocalLeases};
use super::rows::to_i64;
use super::write::sent::{GpuRow, HostTick, NodeUpdate, ProcessRow, Samples, Written};
use super::{
    NodeBatch, SqlStore, StoreError, WriteOutcome, encode_mig_gpm, encode_nvlinks, migrate,
    migrations, open_error, q,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use sqlx::error::BoxDynError;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Arguments, AssertSqlSafe, Sqlite};
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

impl SqlStore<Sqlite> {
    /// Opens (creating if missing) the database `url` names (`sqlite://PATH`,
    /// `sqlite::memory:`) and applies the migrations.
    pub async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let open_err = open_error(url);
        let options = SqliteConnectOptions::from_str(url)
            .map_err(&open_err)?
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
            .map_err(&open_err)?;
        migrate(&pool, migrations!("sqlite")).await?;
        let local = SqliteLocal {
            leases,
            write_gate: tokio::sync::Mutex::new(()),
        };
        Ok(SqlStore::new(pool, local))
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

    async fn write_samples(
        conn: &mut SqliteConnection,
        rows: &Samples<'_>,
        nodes: &mut [NodeUpdate],
        fallback: bool,
    ) -> Result<Written, StoreError> {
        let mut inserted = vec![0u64; nodes.len()];
        if !insert_gpu_rows(conn, &rows.gpu, &mut inserted, fallback).await? {
            return Ok(Written::Fallback);
        }
        insert_rows(conn, &PROCESS_SAMPLES, &rows.process, bind_process)
            .await
            .map_err(q("insert process samples"))?;
        let hosts = insert_rows(conn, &HOST_SAMPLES, &rows.host, bind_host)
            .await
            .map_err(q("insert host samples"))?;
        for (node, n) in nodes.iter_mut().zip(&inserted) {
            node.inserted = *n;
        }
        let gpus = inserted.iter().sum::<u64>();
        Ok(Written::Rows {
            skipped: gpus < rows.gpu.len() as u64 || hosts < rows.host.len() as u64,
            gpus: None,
        })
    }

    async fn write_batches(
        store: &SqliteStore,
        batches: &[NodeBatch],
    ) -> Result<WriteOutcome, StoreError> {
        store.write_rounds(batches).await
    }

    async fn drop_emptied_raw(
        _: &SqliteStore,
        _: gpufleet_core::UnixMs,
    ) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
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
}

// ------------------------------------------------------------------ one write's rows

/// Inserts GPU rows and counts, per node group, how many were new. Rows of several nodes
/// share statements (the fewest statements when many nodes send small batches), unless
/// `per_node`. A shared statement's inserted-row count can be split per node only when it
/// inserted all its rows: when it met rows already stored (a replay), this returns
/// `false`, and the write is rolled back and redone `per_node`, where every statement
/// holds one node's rows.
async fn insert_gpu_rows(
    conn: &mut SqliteConnection,
    rows: &[GpuRow<'_>],
    inserted: &mut [u64],
    per_node: bool,
) -> Result<bool, StoreError> {
    match per_node {
        true => {
            for run in rows.chunk_by(|a, b| a.group == b.group) {
                inserted[run[0].group] += insert_rows(conn, &GPU_SAMPLES, run, bind_gpu)
                    .await
                    .map_err(q("insert GPU samples"))?;
            }
        }
        false => {
            let mut counted = true;
            execute_chunks(conn, &GPU_SAMPLES, rows, bind_gpu, |chunk, new| {
                let (first, last) = (chunk[0].group, chunk[chunk.len() - 1].group);
                if new == chunk.len() as u64 {
                    for r in chunk {
                        inserted[r.group] += 1;
                    }
                } else if first == last {
                    inserted[first] += new;
                } else {
                    counted = false;
                }
                counted
            })
            .await
            .map_err(q("insert GPU samples"))?;
            return Ok(counted);
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

/// One statement of `rows.len()` rows (a power of two up to `max_rows`), bound.
fn bound<'q, R>(
    sql: &InsertSql,
    rows: &[R],
    bind: for<'a> fn(SqliteQuery<'a>, &R) -> SqliteQuery<'a>,
) -> SqliteQuery<'q> {
    let mut query = sql.query(rows.len());
    for r in rows {
        query = bind(query, r);
    }
    query
}

/// Writes `rows` with as few statements as [`chunk_sizes`] allows, binding each statement
/// while SQLite's worker thread runs the one before it (otherwise the writer task and the
/// worker would take turns, each idle while the other works). After each
/// statement `each(its rows, rows it inserted)` is told; it returns whether to go on.
async fn execute_chunks<R>(
    conn: &mut SqliteConnection,
    sql: &InsertSql,
    rows: &[R],
    bind: for<'a> fn(SqliteQuery<'a>, &R) -> SqliteQuery<'a>,
    mut each: impl FnMut(&[R], u64) -> bool,
) -> Result<(), sqlx::Error> {
    let mut sizes = chunk_sizes(rows.len(), sql.max_rows());
    let mut rest = rows;
    let mut take = || {
        sizes.next().map(|n| {
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            (chunk, bound(sql, chunk, bind))
        })
    };
    let mut next = take();
    while let Some((chunk, query)) = next {
        // The statement is sent to the worker on its first poll, before the next binds.
        let (done, following) = futures::join!(query.execute(&mut *conn), async { take() });
        next = following;
        if !each(chunk, done?.rows_affected()) {
            break;
        }
    }
    Ok(())
}

/// Writes `rows` (see [`execute_chunks`]); returns how many rows were new (conflicting
/// rows, i.e. replays, are skipped by the statement's tail).
async fn insert_rows<R>(
    conn: &mut SqliteConnection,
    sql: &InsertSql,
    rows: &[R],
    bind: for<'q> fn(SqliteQuery<'q>, &R) -> SqliteQuery<'q>,
) -> Result<u64, sqlx::Error> {
    let mut inserted = 0;
    execute_chunks(conn, sql, rows, bind, |_, new| {
        inserted += new;
        true
    })
    .await?;
    Ok(inserted)
}

static GPU_SAMPLES: InsertSql = InsertSql::new(
    "INSERT OR IGNORE INTO gpu_samples (gpu_id, ts_ms, util_gpu_pct, util_mem_pct, mem_used_bytes, \
     mem_total_bytes, mem_reserved_bytes, power_mw, power_instant_mw, power_limit_mw, energy_mj, \
     temp_gpu_c, temp_mem_c, fan_pct, clock_sm_mhz, clock_mem_mhz, clock_graphics_mhz, pstate, \
     pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps, nvlinks, ecc_corrected_volatile, \
     ecc_uncorrected_volatile, throttle_reasons, enc_util_pct, dec_util_pct, mig_gpm, \
     gpm_sm_active_cpct, gpm_sm_occupancy_cpct, gpm_tensor_active_cpct, gpm_tensor_hmma_cpct, gpm_tensor_imma_cpct, \
     gpm_tensor_dfma_cpct, gpm_dram_bw_cpct, gpm_fp64_cpct, gpm_fp32_cpct, gpm_fp16_cpct, \
     gpm_pcie_tx_bps, gpm_pcie_rx_bps, gpm_nvlink_tx_bps, gpm_nvlink_rx_bps)",
    "",
    43,
);

static PROCESS_SAMPLES: InsertSql = InsertSql::new(
    "INSERT OR IGNORE INTO process_samples (gpu_id, ts_ms, pid, life_id, gpu_mem_bytes, \
     sm_util_pct, mem_util_pct, enc_util_pct, dec_util_pct)",
    "",
    9,
);

static HOST_SAMPLES: InsertSql = InsertSql::new(
    "INSERT OR IGNORE INTO host_samples (node_id, ts_ms, cpu_util_pct, mem_used_bytes, mem_total_bytes, \
     disk_read_bps, disk_write_bps, net_rx_bps, net_tx_bps, load1, cost_cpu_us, cost_wall_us, \
     cost_source_us, cost_slowest_calls)",
    "",
    14,
);

fn bind_gpu<'q>(q: SqliteQuery<'q>, r: &GpuRow<'_>) -> SqliteQuery<'q> {
    let s = r.s;
    let q = q
        .bind(r.gpu)
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
        .bind(encode_mig_gpm(&s.mig_gpm));
    // GPM, in `GpmMetrics::NAMES` order (the statement's columns).
    s.gpm
        .values()
        .into_iter()
        .fold(q, |q, v| q.bind(v.map(to_i64)))
}

fn bind_process<'q>(q: SqliteQuery<'q>, r: &ProcessRow<'_>) -> SqliteQuery<'q> {
    let p = r.p;
    q.bind(r.gpu)
        .bind(r.ts)
        .bind(p.pid)
        .bind(r.life)
        .bind(p.gpu_mem_bytes.map(to_i64))
        .bind(p.sm_util_pct)
        .bind(p.mem_util_pct)
        .bind(p.enc_util_pct)
        .bind(p.dec_util_pct)
}

fn bind_host<'q>(q: SqliteQuery<'q>, r: &HostTick<'_>) -> SqliteQuery<'q> {
    let h = r.tick.host.clone().unwrap_or_default();
    let c = r.tick.cost.as_ref();
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
        for sql in [&GPU_SAMPLES, &PROCESS_SAMPLES, &HOST_SAMPLES] {
            let rows = sql.max_rows();
            assert!(rows.is_power_of_two() && rows * sql.columns <= MAX_PARAMS);
            let head_columns = sql.head.matches(',').count() + 1;
            assert_eq!(head_columns, sql.columns, "{}", sql.head);
        }
    }
}
