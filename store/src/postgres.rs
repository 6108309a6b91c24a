//! The PostgreSQL backend, for sites that run PostgreSQL already and want several
//! collectors on one database. The queries are shared ([`super::SqlStore`]; the store
//! contract tests run against both backends); what is here is the connection, day
//! partitions, advisory-lock leases, and the hand-tuned bulk writes.
//!
//! Sample rows of a group commit: GPU, process and host samples by binary `COPY` (one
//! round trip each); when a copy meets a stored row, the write is redone with arrays, one
//! per column (`INSERT ... SELECT * FROM UNNEST($1::int8[], ...) ON CONFLICT DO
//! NOTHING`), so a group commit of any size is a handful of round trips and the
//! statements' prepared forms never change.
//!
//! The raw sample tables are partitioned by UTC day (`<table>_pYYYYMMDD`). Partitions are
//! created ahead: today's and tomorrow's at open and by any write on a new day, and any
//! other day's before the first write that needs it, each under a transaction-scoped
//! advisory lock so collectors racing to create the same day wait for each other instead
//! of failing. The days known to exist are cached; a write that finds a partition missing
//! anyway (another collector dropped it) clears the cache and is redone once.
//! [`PgStore::drop_raw_before`] is retention: whole partitions are dropped, never rows
//! deleted. [`PgStore::drop_emptied_raw`] drops the process and host partitions of past
//! days that packing emptied (a past day's partition never reuses the space of its
//! deleted rows).

use super::backend::insert_rows;
use super::backend::{Backend, Dialect, Get as _, Table, Value, run, sql};
use super::lease::{self, Lease};
use super::rows::to_i64;
use super::write::sent::{GpuRow, HostTick, NodeUpdate, ProcessRow, Samples, Written};
use super::{
    GpuMetric, NodeBatch, SqlStore, StoreError, WriteOutcome, encode_mig_gpm, encode_nvlinks,
    migrate, migrations, open_error, q,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use gpufleet_core::config::now_ms;
use gpufleet_core::{GpuSample, HostSample, ProcessSample, SamplerCost, UnixMs};
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tracing::debug;

/// One UTC day in ms: the span of one raw partition.
pub const DAY_MS: i64 = 86_400_000;
/// The partitioned raw tables, all partitioned alike.
pub const RAW_TABLES: [&str; 3] = ["gpu_samples", "process_samples", "host_samples"];
/// Connections: the writer holds one, HTTP readers and background jobs the rest.
const MAX_CONNECTIONS: u32 = 8;

/// The store on PostgreSQL.
pub type PgStore = SqlStore<Postgres>;

/// What a PostgreSQL store keeps besides its pool.
#[derive(Debug)]
pub struct PgLocal {
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

impl SqlStore<Postgres> {
    /// Connects to the database `url` names (`postgres://user:password@host:port/db`; a
    /// schema is chosen with `?options=-c%20search_path%3DNAME`), applies the migrations
    /// and creates today's and tomorrow's partitions.
    pub async fn open(url: &str) -> Result<PgStore, StoreError> {
        let open_err = open_error(url);
        let options = PgConnectOptions::from_str(url)
            .map_err(&open_err)?
            .application_name("gpufleet-collector")
            .statement_cache_capacity(256);
        let server_port = options.get_port();
        // test_before_acquire (the default) makes the pool drop connections a database
        // restart broke and open new ones, so the store recovers by itself.
        let pool = PgPoolOptions::new()
            .after_connect(move |conn, _| Box::pin(async move { nodelay(conn, server_port).await }))
            .max_connections(MAX_CONNECTIONS)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .idle_timeout(Some(Duration::from_secs(300)))
            .connect_with(options)
            .await
            .map_err(&open_err)?;
        migrate(&pool, migrations!("postgres")).await?;
        let store = SqlStore::new(
            pool,
            PgLocal {
                days: Mutex::new(HashSet::new()),
            },
        );
        let today = now_ms().div_euclid(DAY_MS);
        store.ensure_days(&[today, today + 1]).await?;
        Ok(store)
    }

    /// Creates the partitions of `days` that are not known to exist (idempotent; safe
    /// when several collectors do it at once).
    pub async fn ensure_days(&self, days: &[i64]) -> Result<(), StoreError> {
        let missing: BTreeSet<i64> = {
            let known = self
                .local
                .days
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
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
        self.local
            .days
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
                let bound: String = row.get("bound")?;
                let (from_ms, to_ms) = parse_bound(&bound)?;
                Ok(RawPartition {
                    table: row.get("parent")?,
                    name: row.get("name")?,
                    from_ms,
                    to_ms,
                })
            })
            .collect()
    }

    /// Drops the raw partitions of days that ended at or before `before_ms`
    /// and that packing emptied (every minute of them packed): the space of rows deleted
    /// from a past day's partition is never reused, so this is how packing frees disk.
    /// Each emptied partition is locked (its parent with it) before it is checked again and
    /// dropped, so rows written into it meanwhile (late data) keep it; a table busy for
    /// more than a moment is left for the next call. Returns the names dropped.
    pub async fn drop_emptied_raw(&self, before_ms: UnixMs) -> Result<Vec<String>, StoreError> {
        let mut dropped = Vec::new();
        let old = self
            .raw_partitions()
            .await?
            .into_iter()
            .filter(|p| p.to_ms.is_some_and(|to| to <= before_ms));
        for p in old {
            let quote = |n: &str| format!("\"{}\"", n.replace('"', "\"\""));
            let (name, parent) = (quote(&p.name), quote(&p.table));
            // Through the primary key: a partition packing emptied is mostly dead pages,
            // which a plain scan would read every time.
            let key = if p.table == "host_samples" {
                "node_id"
            } else {
                "gpu_id"
            };
            let probe = format!("SELECT 1 AS one FROM {name} ORDER BY {key}, ts_ms LIMIT 1");
            let first = sqlx::query(AssertSqlSafe(probe.clone()))
                .fetch_optional(&self.pool)
                .await
                .map_err(q("look into a raw partition"))?;
            if first.is_some() {
                continue;
            }
            let mut tx = self
                .pool
                .begin()
                .await
                .map_err(q("begin dropping an emptied partition"))?;
            lock_partitions(&mut tx).await?;
            // The parent first, as every query locks them (dropping a partition locks its
            // parent anyway); briefly, else the readers and writers queued behind the
            // request would wait: a partition busy now is dropped by a later call.
            let locked = sqlx::raw_sql(AssertSqlSafe(format!(
                "SET LOCAL lock_timeout = '200ms'; LOCK TABLE {parent} IN ACCESS EXCLUSIVE MODE"
            )))
            .execute(&mut *tx)
            .await;
            if locked.is_err() {
                continue; // the transaction rolls back
            }
            let again = sqlx::query(AssertSqlSafe(probe))
                .fetch_optional(&mut *tx)
                .await
                .map_err(q("look into a raw partition"))?;
            if again.is_some() {
                continue;
            }
            sqlx::query(AssertSqlSafe(format!("DROP TABLE {name}")))
                .execute(&mut *tx)
                .await
                .map_err(q("drop an emptied partition"))?;
            tx.commit().await.map_err(q("commit a dropped partition"))?;
            if let Some(from) = p.from_ms {
                (self
                    .local
                    .days
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner))
                .remove(&from.div_euclid(DAY_MS));
            }
            dropped.push(p.name);
        }
        Ok(dropped)
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
        let mut days = self
            .local
            .days
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for p in &old {
            if let Some(from) = p.from_ms {
                days.remove(&from.div_euclid(DAY_MS));
            }
        }
        Ok(old.into_iter().map(|p| p.name).collect())
    }
}

/// Turns Nagle's algorithm off on a new connection's TCP socket (a connection over a
/// Unix socket needs nothing). sqlx 0.9.0 leaves it on (sqlx issue #4335; later
/// versions set `TCP_NODELAY` themselves): a `COPY`'s data and its `CopyDone` are two
/// writes, so the second waits for the server's delayed ACK, ~40 ms per copy, three
/// copies per group commit (measured: 135 ms per small group commit over TCP, 2.8 ms
/// over a Unix socket). sqlx does not hand out its socket, so it is found among this
/// process's descriptors by the client port the server reports, duplicated with
/// `pidfd_getfd(2)` and set. Where that is not allowed (an old kernel, a seccomp
/// profile) the connection works as it is, slower.
async fn nodelay(conn: &mut PgConnection, server_port: u16) -> Result<(), sqlx::Error> {
    let port: Option<i32> = sqlx::query_scalar("SELECT inet_client_port()")
        .fetch_one(&mut *conn)
        .await?;
    // NULL over a Unix socket: nothing to do.
    let Some(port) = port.and_then(|p| u16::try_from(p).ok()) else {
        return Ok(());
    };
    match tcp_socket(port, server_port) {
        Ok(Some(fd)) => {
            if let Err(e) = rustix::net::sockopt::set_tcp_nodelay(&fd, true) {
                debug!(error = %e, "TCP_NODELAY could not be set");
            }
        }
        Ok(None) => debug!("TCP_NODELAY: this connection's socket was not found"),
        Err(e) => debug!(error = %e, "TCP_NODELAY: this process's descriptors cannot be read"),
    }
    Ok(())
}

/// A duplicate of this process's connected socket from local port `local` to remote port
/// `remote`, if any.
fn tcp_socket(local: u16, remote: u16) -> rustix::io::Result<Option<std::os::fd::OwnedFd>> {
    use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};
    let me = pidfd_open(getpid(), PidfdFlags::empty())?;
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Ok(None);
    };
    for entry in dir.flatten() {
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if !is_socket {
            continue;
        }
        let Ok(dup) = pidfd_getfd(&me, fd, PidfdGetfdFlags::empty()) else {
            continue;
        };
        let port = |a: Option<rustix::net::SocketAddrAny>| {
            a.and_then(|a| std::net::SocketAddr::try_from(a).ok())
                .map(|a| a.port())
        };
        let mine = port(rustix::net::getsockname(&dup).ok());
        let theirs = port(rustix::net::getpeername(&dup).ok().flatten());
        if mine == Some(local) && theirs == Some(remote) {
            return Ok(Some(dup));
        }
    }
    Ok(None)
}

/// Takes the lock on the partition list (creating or dropping partitions) for the
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

/// The `op` of a failed [`copy`].
const COPY_OP: &str = "copy samples";

/// Whether a write failed with SQLSTATE `code` and a message containing `says`.
fn db_error(e: &StoreError, code: &str, says: &str) -> bool {
    matches!(e, StoreError::Query { source: sqlx::Error::Database(db), .. }
        if db.code().as_deref() == Some(code) && db.message().contains(says))
}

/// Whether a write failed because [`copy`] met a sample already stored.
fn is_copy_duplicate(e: &StoreError) -> bool {
    matches!(e, StoreError::Query { op: COPY_OP, .. }) && db_error(e, "23505", "")
}

#[async_trait]
impl Backend for Postgres {
    const BACKEND: &'static str = "postgres";
    const DIALECT: Dialect = Dialect::Postgres;
    const BEGIN_WRITE: Option<&'static str> = None;
    const SHARED: bool = true;
    type Local = PgLocal;

    fn write_gate(_: &PgLocal) -> Option<&tokio::sync::Mutex<()>> {
        None
    }

    run!(Postgres, PgArguments, add_pg);

    /// A write's samples go straight into `gpu_samples`, `process_samples` and
    /// `host_samples` (binary `COPY`, no conflict handling: the common case, where nothing
    /// was stored before); if any of them was already stored (a replay after a lost ack,
    /// or a duplicate within the group), the transaction failed whole and the write is
    /// redone (`fallback`) with `INSERT ... ON CONFLICT DO NOTHING`, which skips and counts
    /// the duplicates.
    async fn write_samples(
        conn: &mut PgConnection,
        rows: &Samples<'_>,
        nodes: &mut [NodeUpdate],
        fallback: bool,
    ) -> Result<Written, StoreError> {
        let (processes, hosts) = (process_table(&rows.process)?, host_table(&rows.host)?);
        let gpus = (rows.gpu.iter()).map(|r| gpu_i32(r.gpu));
        let gpus = gpus.collect::<Result<Vec<i32>, _>>()?;
        let gpu_rows = gpu_table(&rows.gpu, &gpus)?;
        let host_rows = hosts.rows() as u64;
        // Rows per GPU given, and (below) how many of them were new.
        let mut given: BTreeMap<i32, (usize, i64)> = BTreeMap::new();
        for (&gpu, r) in gpus.iter().zip(&rows.gpu) {
            given.entry(gpu).or_insert((r.group, 0)).1 += 1;
        }
        let (per_gpu, hosts) = match fallback {
            true => {
                let per_gpu = merge(conn, gpu_rows).await?;
                let (op, new) = ("insert process samples", "ON CONFLICT DO NOTHING");
                insert_rows::<Postgres>(conn, op, "process_samples", processes, new).await?;
                let op = "insert host samples";
                let hosts = insert_rows::<Postgres>(conn, op, "host_samples", hosts, new).await?;
                (per_gpu, hosts)
            }
            false => {
                let tables = [
                    ("gpu_samples", gpu_rows),
                    ("process_samples", processes),
                    ("host_samples", hosts),
                ];
                for (table, rows) in tables {
                    match copy(conn, table, rows).await {
                        Err(e) if is_copy_duplicate(&e) => {
                            debug!(error = %e, "samples already stored; redoing the write with ON CONFLICT DO NOTHING");
                            return Ok(Written::Fallback);
                        }
                        other => other?,
                    }
                }
                let all = given.iter().map(|(&gpu, &(_, n))| (gpu, n)).collect();
                (all, host_rows)
            }
        };
        for (gpu, n) in per_gpu {
            let (group, given) = given.get_mut(&gpu).ok_or_else(|| {
                StoreError::Corrupt(format!("inserted rows of GPU {gpu}, which was not written"))
            })?;
            *given -= n;
            nodes[*group].inserted += u64::try_from(n).unwrap_or(0);
        }
        // GPUs some of whose samples were skipped: replays, or conflicts.
        let short: HashSet<i64> = (given.iter())
            .filter(|(_, (_, short))| *short > 0)
            .map(|(&gpu, _)| i64::from(gpu))
            .collect();
        Ok(Written::Rows {
            skipped: !short.is_empty() || hosts < host_rows,
            gpus: Some(short),
        })
    }

    async fn write_batches(
        store: &PgStore,
        batches: &[NodeBatch],
    ) -> Result<WriteOutcome, StoreError> {
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
        store.ensure_days(&days).await?;
        match store.write_rounds(batches).await {
            Err(e) if db_error(&e, "23514", "no partition") => {
                // Another collector dropped a partition this one thought it had.
                store
                    .local
                    .days
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clear();
                store.ensure_days(&days).await?;
                store.write_rounds(batches).await
            }
            other => other,
        }
    }

    async fn drop_emptied_raw(
        store: &PgStore,
        before_ms: UnixMs,
    ) -> Result<Vec<String>, StoreError> {
        store.drop_emptied_raw(before_ms).await
    }

    async fn try_lead(store: &PgStore, job: &str) -> Result<Option<Lease>, StoreError> {
        lease::postgres(&store.pool, job).await
    }

    /// Drops every raw day partition that ends before the oldest raw row still to be kept
    /// (a GPU keeps its newest sample before its horizon; a series without a horizon keeps
    /// everything).
    async fn drop_expired_raw(store: &PgStore) -> Result<Vec<String>, StoreError> {
        let bound: Option<i64> = sqlx::query_scalar(
            "SELECT min(b) FROM ( \
               SELECT coalesce( \
                 (SELECT max(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = g.id \
                    AND s.ts_ms < h.raw_from_ms), \
                 h.raw_from_ms, \
                 (SELECT min(s.ts_ms) FROM gpu_samples s WHERE s.gpu_id = g.id), \
                 (SELECT min(p.ts_ms) FROM process_samples p WHERE p.gpu_id = g.id)) AS b \
               FROM gpus g LEFT JOIN raw_horizon h ON h.kind = 'gpu' AND h.id = g.id \
               UNION ALL \
               SELECT coalesce(h.raw_from_ms, \
                 (SELECT min(s.ts_ms) FROM host_samples s WHERE s.node_id = n.id)) AS b \
               FROM nodes n LEFT JOIN raw_horizon h ON h.kind = 'host' AND h.id = n.id) x",
        )
        .fetch_one(&mut *store.conn().await?)
        .await
        .map_err(q("find the raw partitions that can be dropped"))?;
        match bound {
            Some(bound) => store.drop_raw_before(bound).await,
            None => Ok(Vec::new()),
        }
    }
}

// ------------------------------------------------------------------ one write's rows

/// The GPU samples of `rows` (GPU ids `gpus`), as the columns `COPY` reads, in its order.
fn gpu_table(rows: &[GpuRow<'_>], gpus: &[i32]) -> Result<Table, StoreError> {
    let s = || rows.iter().map(|r| r.s);
    let big = |f: fn(&GpuSample) -> Option<u64>| s().map(move |s| f(s).map(to_i64));
    let int = |f: fn(&GpuSample) -> Option<u32>| s().map(move |s| bits32(f(s)));
    let small = |f: fn(&GpuSample) -> Option<u32>, what| {
        s().map(|s| small(f(s), what))
            .collect::<Result<Vec<_>, _>>()
    };
    let table = Table::default()
        .int("ts_ms", rows.iter().map(|r| r.ts))
        .int("mem_used_bytes", big(|s| s.mem_used_bytes))
        .int("mem_total_bytes", big(|s| s.mem_total_bytes))
        .int("mem_reserved_bytes", big(|s| s.mem_reserved_bytes))
        .int("energy_mj", big(|s| s.energy_mj))
        .int("pcie_tx_bps", big(|s| s.pcie_tx_bps))
        .int("pcie_rx_bps", big(|s| s.pcie_rx_bps))
        .int("nvlink_tx_bps", big(|s| s.nvlink_tx_bps))
        .int("nvlink_rx_bps", big(|s| s.nvlink_rx_bps))
        .int("ecc_corrected_volatile", big(|s| s.ecc_corrected_volatile))
        .int(
            "ecc_uncorrected_volatile",
            big(|s| s.ecc_uncorrected_volatile),
        )
        .int("throttle_reasons", big(|s| s.throttle_reasons))
        .int4("gpu_id", gpus.iter().copied())
        .int4("power_mw", int(|s| s.power_mw))
        .int4("power_instant_mw", int(|s| s.power_instant_mw))
        .int4("power_limit_mw", int(|s| s.power_limit_mw))
        .int4("temp_gpu_c", int(|s| s.temp_gpu_c))
        .int4("temp_mem_c", int(|s| s.temp_mem_c))
        .int4("clock_sm_mhz", int(|s| s.clock_sm_mhz))
        .int4("clock_mem_mhz", int(|s| s.clock_mem_mhz))
        .int4("clock_graphics_mhz", int(|s| s.clock_graphics_mhz))
        .int2("util_gpu_pct", small(|s| s.util_gpu_pct, "util_gpu_pct")?)
        .int2("util_mem_pct", small(|s| s.util_mem_pct, "util_mem_pct")?)
        .int2("fan_pct", small(|s| s.fan_pct, "fan_pct")?)
        .int2("pstate", small(|s| s.pstate, "pstate")?)
        .int2("enc_util_pct", small(|s| s.enc_util_pct, "enc_util_pct")?)
        .int2("dec_util_pct", small(|s| s.dec_util_pct, "dec_util_pct")?)
        .bytes("nvlinks", s().map(|s| encode_nvlinks(&s.nvlinks)))
        .bytes("mig_gpm", s().map(|s| encode_mig_gpm(&s.mig_gpm)));
    // GPM: the GPU metrics after those every GPU has, in `GpmMetrics::NAMES` order;
    // activities (at most 10 000) as smallints, rates as bigints.
    let gpm: Vec<[Option<u64>; 14]> = s().map(|s| s.gpm.values()).collect();
    let metrics = &GpuMetric::ALL[GpuMetric::ALL.len() - gpm_len()..];
    let mut table = table;
    for (k, m) in metrics.iter().enumerate() {
        let col = gpm.iter().map(|v| v[k]);
        table = if m.unit() == "centipercent" {
            let narrow = |v: Option<u64>| {
                self::small(v.map(|x| u32::try_from(x).unwrap_or(u32::MAX)), m.name())
            };
            table.int2(m.name(), col.map(narrow).collect::<Result<Vec<_>, _>>()?)
        } else {
            table.int(m.name(), col.map(|v| v.map(to_i64)).collect::<Vec<_>>())
        };
    }
    Ok(table)
}

/// How many GPM metrics a sample has.
const fn gpm_len() -> usize {
    gpufleet_core::GpmMetrics::NAMES.len()
}

fn process_table(rows: &[ProcessRow<'_>]) -> Result<Table, StoreError> {
    let p = || rows.iter().map(|r| r.p);
    let gpus = rows
        .iter()
        .map(|r| gpu_i32(r.gpu))
        .collect::<Result<Vec<_>, _>>()?;
    let small = |f: fn(&ProcessSample) -> Option<u32>, what| {
        p().map(|p| small(f(p), what))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(Table::default()
        .int("ts_ms", rows.iter().map(|r| r.ts))
        .int("life_id", rows.iter().map(|r| r.life))
        .int("gpu_mem_bytes", p().map(|p| p.gpu_mem_bytes.map(to_i64)))
        .int4("gpu_id", gpus)
        .int4("pid", p().map(|p| p.pid as i32))
        .int2("sm_util_pct", small(|p| p.sm_util_pct, "sm_util_pct")?)
        .int2("mem_util_pct", small(|p| p.mem_util_pct, "mem_util_pct")?)
        .int2("enc_util_pct", small(|p| p.enc_util_pct, "enc_util_pct")?)
        .int2("dec_util_pct", small(|p| p.dec_util_pct, "dec_util_pct")?))
}

fn host_table(rows: &[HostTick<'_>]) -> Result<Table, StoreError> {
    let hosts: Vec<HostSample> = (rows.iter())
        .map(|r| r.tick.host.clone().unwrap_or_default())
        .collect();
    let big = |f: fn(&HostSample) -> Option<u64>| hosts.iter().map(move |h| f(h).map(to_i64));
    let cost = |f: fn(&SamplerCost) -> Option<u32>| {
        rows.iter()
            .map(move |r| bits32(r.tick.cost.as_ref().and_then(f)))
    };
    let slowest = rows.iter().map(|r| match r.tick.cost.as_ref() {
        Some(c) if !c.slowest_calls_us.is_empty() => serde_json::to_string(&c.slowest_calls_us)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("slowest calls do not serialize: {e}"))),
        _ => Ok(None),
    });
    Ok(Table::default()
        .int("ts_ms", rows.iter().map(|r| r.ts))
        .int("node_id", rows.iter().map(|r| r.node))
        .int("mem_used_bytes", big(|h| h.mem_used_bytes))
        .int("mem_total_bytes", big(|h| h.mem_total_bytes))
        .int("disk_read_bps", big(|h| h.disk_read_bps))
        .int("disk_write_bps", big(|h| h.disk_write_bps))
        .int("net_rx_bps", big(|h| h.net_rx_bps))
        .int("net_tx_bps", big(|h| h.net_tx_bps))
        .real("cpu_util_pct", hosts.iter().map(|h| h.cpu_util_pct))
        .real("load1", hosts.iter().map(|h| h.load1))
        .int4("cost_cpu_us", cost(|c| c.cpu_us))
        .int4("cost_wall_us", cost(|c| c.wall_us))
        .int4("cost_source_us", cost(|c| c.source_us))
        .text(
            "cost_slowest_calls",
            slowest.collect::<Result<Vec<_>, _>>()?,
        ))
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

/// Copies rows into `table`; every row is new, or the copy fails with a unique violation
/// (see [`is_copy_duplicate`]).
async fn copy(conn: &mut PgConnection, table: &str, rows: Table) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let text = format!("COPY {table} ({}) FROM STDIN (FORMAT binary)", rows.names());
    let mut copy = conn.copy_in_raw(&text).await.map_err(q(COPY_OP))?;
    copy.send(rows.copy_binary()).await.map_err(q(COPY_OP))?;
    copy.finish().await.map_err(q(COPY_OP))?;
    Ok(())
}

/// Inserts GPU samples, skipping those already stored; returns how many were new per GPU.
async fn merge(conn: &mut PgConnection, rows: Table) -> Result<Vec<(i32, i64)>, StoreError> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let names = rows.names();
    let inserted = sql::<Postgres>(
        "insert GPU samples",
        format!(
            "WITH ins AS (INSERT INTO gpu_samples ({names}) SELECT {names} FROM {} \
             ON CONFLICT DO NOTHING RETURNING gpu_id) \
             SELECT gpu_id, count(*) AS n FROM ins GROUP BY gpu_id",
            Dialect::Postgres.over(&rows, "v")
        ),
    )
    .bind_table(rows)
    .all(conn)
    .await?;
    (inserted.iter())
        .map(|row| Ok((gpu_i32(row.get("gpu_id")?)?, row.get("n")?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The socket of a live TCP connection is found by its local port and gets
    /// `TCP_NODELAY` (what a new PostgreSQL connection gets, without the server).
    #[test]
    fn a_connection_is_found_by_its_local_port_and_gets_nodelay() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let stream =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let _accepted = listener.accept().expect("accept");
        assert!(
            !stream.nodelay().expect("nodelay"),
            "Nagle is on by default"
        );
        let (local, remote) = (
            stream.local_addr().expect("local").port(),
            stream.peer_addr().expect("peer").port(),
        );
        let fd = tcp_socket(local, remote)
            .expect("pidfd")
            .expect("the connection's socket");
        rustix::net::sockopt::set_tcp_nodelay(&fd, true).expect("set");
        assert!(stream.nodelay().expect("nodelay"), "set on the same socket");
        // Not another socket with one of the ports (the accepted end, the listener).
        assert!(tcp_socket(local, local).expect("pidfd").is_none());
        assert!(tcp_socket(remote, remote).expect("pidfd").is_none());
    }

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
