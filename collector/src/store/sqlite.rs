//! The SQLite store: one file, WAL, `synchronous=NORMAL` (a commit survives a crash of the
//! collector; a power loss may lose the last commits, never corrupt the file).
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

use super::{
    AgentTokenRecord, BatchConflict, GpuId, GpuMetric, GpuRecord, HostRow, LatestGpu, LatestHost,
    NodeBatch, NodeId, NodeRecord, Rehomed, SeriesPoint, Store, StoreError, TimeRange,
    WriteOutcome, decode_nvlinks, encode_nvlinks, redact_url,
};
use async_trait::async_trait;
use gpufleet_core::wire::HelloInfo;
use gpufleet_core::{
    DeliveryStats, Event, EventKind, GpuInfo, GpuSample, HostInfo, HostSample, Inventory,
    MigInstance, ProcessSample, ProcessType, SamplerCost, UnixMs, Workload, WorkloadKind,
};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool,
    SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Arguments, AssertSqlSafe, Row, SqlSafeStr, Sqlite};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// The migrations, embedded so an installed binary needs no files beside it.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "init",
        include_str!("../../../migrations/sqlite/0001_init.sql"),
    ),
    (
        6,
        "energy",
        include_str!("../../../migrations/sqlite/0006_energy.sql"),
    ),
    (
        9,
        "agent tokens",
        include_str!("../../../migrations/sqlite/0009_agent_tokens.sql"),
    ),
    (
        10,
        "carbon",
        include_str!("../../../migrations/sqlite/0010_carbon.sql"),
    ),
    (
        11,
        "rollups",
        include_str!("../../../migrations/sqlite/0011_rollups.sql"),
    ),
    (
        20,
        "energy split",
        include_str!("../../../migrations/sqlite/0020_energy_split.sql"),
    ),
];

/// SQLite's default limit on bound parameters per statement (SQLITE_MAX_VARIABLE_NUMBER).
const MAX_PARAMS: usize = 32_766;
/// Most rows per INSERT statement. Measured here (release, 28-column GPU rows): 512 and
/// 1024 are within noise of each other, 128 is ~15% slower.
const MAX_ROWS_PER_STATEMENT: usize = 512;
/// Workload ids kept in memory; the cache is cleared when it grows past this (the ids are
/// then fetched again by the next upsert, so clearing only costs a few statements).
const WORKLOAD_CACHE_MAX: usize = 50_000;

mod carbon;
mod energy;
mod follow;
mod rollup;

type SqliteQuery<'q> = sqlx::query::Query<'q, Sqlite, SqliteArguments>;

/// The SQLite implementation of [`Store`].
#[derive(Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// Workload id per workload (all fields, so that a variant carrying new names is
    /// upserted once and its names stored). Only committed ids enter it: an id from a
    /// rolled-back transaction could be reused by SQLite for another workload.
    workloads: Mutex<HashMap<Workload, i64>>,
    /// Job leases ([`super::lease`]): a lock file beside the database file, or in-process
    /// locks for an in-memory database.
    leases: Leases,
    /// Taken by each of this process's write transactions that can be large or frequent
    /// (group commits, node registrations, rollups, energy minutes, carbon prices and
    /// cached intensities, each retention delete) for its duration. SQLite admits one writer
    /// at a time and makes the others poll with sleeps (the busy timeout), which is not
    /// fair: back-to-back retention deletes won nearly every race and the group-commit
    /// writer waited seconds. This queue is first come, first served, so a commit waits
    /// for at most the transaction ahead of it.
    write_gate: tokio::sync::Mutex<()>,
}

/// Where a SQLite store's job leases live.
#[derive(Debug)]
enum Leases {
    /// `flock` on `<file>.lead-<job>`: exclusive across the processes of one host.
    File(std::path::PathBuf),
    Local(super::lease::LocalLeases),
}

fn q(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { op, source }
}

impl SqliteStore {
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
            Leases::Local(super::lease::LocalLeases::default())
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
        Ok(SqliteStore {
            pool,
            workloads: Mutex::new(HashMap::new()),
            leases,
            write_gate: tokio::sync::Mutex::new(()),
        })
    }

    /// One attempt at [`Store::write_batches`]: one transaction, GPU rows packed as
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
        let _turn = self.write_gate.lock().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(q("begin a write transaction"))?;
        if checked {
            let found = conflicts_of(&mut tx, batches, skip).await?;
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
        for r in &mut rows.process {
            r.workload = rows.workloads[r.slot].id.ok_or_else(|| {
                StoreError::Corrupt(format!(
                    "workload {} has no id",
                    rows.workloads[r.slot].workload.key()
                ))
            })?;
        }
        let mut inserted = vec![0u64; rows.nodes.len()];
        if !insert_gpu_rows(&mut tx, &rows.gpu, &mut inserted, packing).await? {
            tx.rollback().await.map_err(q("roll back"))?;
            return Err(WriteFail::Ambiguous);
        }
        insert_rows(&mut tx, &PROCESS_SAMPLES, &rows.process, bind_process)
            .await
            .map_err(q("insert process samples"))?;
        let hosts = insert_rows(&mut tx, &HOST_SAMPLES, &rows.host, bind_host)
            .await
            .map_err(q("insert host samples"))?;
        let skipped =
            inserted.iter().sum::<u64>() < rows.gpu.len() as u64 || hosts < rows.host.len() as u64;
        if skipped && !conflicts_of(&mut tx, batches, skip).await?.is_empty() {
            // Some skipped rows were not replays: decide which batches conflict before
            // inserting, in a new transaction.
            tx.rollback().await.map_err(q("roll back"))?;
            return Err(WriteFail::Recheck);
        }
        insert_rows(&mut tx, &EVENTS, &rows.events, bind_event)
            .await
            .map_err(q("insert events"))?;
        for (node, n) in rows.nodes.iter_mut().zip(&inserted) {
            node.inserted = *n;
        }
        insert_rows(&mut tx, &NODE_UPDATES, &rows.nodes, bind_node_update)
            .await
            .map_err(q("update the nodes' delivery state"))?;
        tx.commit().await.map_err(q("commit"))?;
        self.cache_workloads(&rows.workloads);
        let mut outcome = WriteOutcome::default();
        for node in &rows.nodes {
            *outcome
                .inserted_gpu_samples
                .entry(NodeId(node.id))
                .or_default() += node.inserted;
        }
        Ok(outcome)
    }

    /// Remembers committed workload ids.
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

    async fn load_node(conn: &mut SqliteConnection, id: NodeId) -> Result<NodeRecord, StoreError> {
        let row = sqlx::query("SELECT * FROM nodes WHERE id = ?")
            .bind(id.0)
            .fetch_one(&mut *conn)
            .await
            .map_err(q("read a node"))?;
        let gpus = sqlx::query("SELECT * FROM gpus WHERE node_id = ? ORDER BY gpu_index, uuid")
            .bind(id.0)
            .fetch_all(&mut *conn)
            .await
            .map_err(q("read a node's GPUs"))?;
        let mut node = node_from_row(&row)?;
        node.gpus = gpus.iter().map(gpu_from_row).collect::<Result<_, _>>()?;
        Ok(node)
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
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
        let _turn = self.write_gate.lock().await;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(q("begin a transaction"))?;
        let host = &inventory.host;
        let node_id: i64 = sqlx::query_scalar(
            "INSERT INTO nodes (name, labels, agent_version, boot_id, source, interval_ms, \
               first_seen_ms, last_hello_ms, driver_version, cuda_driver_version, nvml_version, \
               hostname, kernel, os, cpu_count, memory_total_bytes) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
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
        .bind(hello.interval_ms)
        .bind(now_ms)
        .bind(now_ms)
        .bind(inventory.driver_version.as_deref())
        .bind(inventory.cuda_driver_version.as_deref())
        .bind(inventory.nvml_version.as_deref())
        .bind(host.hostname.as_str())
        .bind(host.kernel.as_deref())
        .bind(host.os.as_deref())
        .bind(host.cpu_count)
        .bind(host.memory_total_bytes.map(to_i64))
        .fetch_one(&mut *tx)
        .await
        .map_err(q("upsert a node"))?;

        for g in &inventory.gpus {
            let mig = serde_json::to_string(&g.mig_instances)
                .map_err(|e| StoreError::Corrupt(format!("MIG instances do not serialize: {e}")))?;
            sqlx::query(
                "INSERT INTO gpus (node_id, uuid, gpu_index, name, serial, pci_bus_id, \
                   architecture, brand, memory_total_bytes, power_limit_default_mw, \
                   power_limit_enforced_mw, power_limit_min_mw, power_limit_max_mw, \
                   max_clock_sm_mhz, max_clock_mem_mhz, max_clock_graphics_mhz, nvlink_count, \
                   mig_enabled, compute_mode, persistence_mode, cuda_capability_major, \
                   cuda_capability_minor, pcie_link_gen_max, pcie_link_width_max, \
                   vbios_version, mig_instances, first_seen_ms) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, \
                   ?, ?, ?) \
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
            .bind(g.index)
            .bind(g.name.as_str())
            .bind(g.serial.as_deref())
            .bind(g.pci_bus_id.as_deref())
            .bind(g.architecture.as_deref())
            .bind(g.brand.as_deref())
            .bind(g.memory_total_bytes.map(to_i64))
            .bind(g.power_limit_default_mw)
            .bind(g.power_limit_enforced_mw)
            .bind(g.power_limit_min_mw)
            .bind(g.power_limit_max_mw)
            .bind(g.max_clock_sm_mhz)
            .bind(g.max_clock_mem_mhz)
            .bind(g.max_clock_graphics_mhz)
            .bind(g.nvlink_count)
            .bind(g.mig_enabled)
            .bind(g.compute_mode.as_deref())
            .bind(g.persistence_mode)
            .bind(g.cuda_capability_major)
            .bind(g.cuda_capability_minor)
            .bind(g.pcie_link_gen_max)
            .bind(g.pcie_link_width_max)
            .bind(g.vbios_version.as_deref())
            .bind(mig)
            .bind(now_ms)
            .execute(&mut *tx)
            .await
            .map_err(q("upsert a GPU"))?;
            let owner: Option<String> = sqlx::query_scalar(
                "SELECT n.name FROM gpus g JOIN nodes n ON n.id = g.node_id \
                 WHERE g.uuid = ? AND g.node_id <> ?",
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
        let mut packing = Packing::AcrossNodes;
        let mut skip = HashSet::new();
        let mut conflicts = Vec::new();
        let mut checked = false;
        // A round commits, or switches to per-node statements (once), or to checking
        // conflicts first: only a concurrent writer could make the checked rounds repeat.
        for _ in 0..super::MAX_WRITE_ROUNDS {
            match self
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

    async fn rehome_gpu(&self, uuid: &str, to: &str) -> Result<Rehomed, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(q("begin a transaction"))?;
        let to_id: Option<i64> = sqlx::query_scalar("SELECT id FROM nodes WHERE name = ?")
            .bind(to)
            .fetch_optional(&mut *tx)
            .await
            .map_err(q("find a node"))?;
        let Some(to_id) = to_id else {
            return Ok(Rehomed::UnknownNode);
        };
        let from: Option<(i64, String)> = sqlx::query_as(
            "SELECT g.node_id, n.name FROM gpus g JOIN nodes n ON n.id = g.node_id \
             WHERE g.uuid = ?",
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
        sqlx::query("UPDATE gpus SET node_id = ? WHERE uuid = ?")
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
             WHERE s.gpu_id = ? AND s.ts_ms BETWEEN ? AND ? ORDER BY s.ts_ms LIMIT ?"
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
             WHERE p.gpu_id = ? AND p.ts_ms BETWEEN ? AND ? ORDER BY p.ts_ms, p.pid LIMIT ?"
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
            "SELECT * FROM host_samples WHERE node_id = ? AND ts_ms BETWEEN ? AND ? \
             ORDER BY ts_ms LIMIT ?",
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
             WHERE e.node_id = ? AND e.ts_ms BETWEEN ? AND ? ORDER BY e.ts_ms, e.id LIMIT ?",
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
        // The column is the metric's fixed name from the allow-list, never user input.
        let column = metric.name();
        let rows = match step_ms {
            None => sqlx::query(AssertSqlSafe(format!(
                "SELECT ts_ms AS t, {column} AS v FROM gpu_samples \
                 WHERE gpu_id = ? AND ts_ms BETWEEN ? AND ? ORDER BY ts_ms LIMIT ?"
            )))
            .bind(gpu.0)
            .bind(range.from_ms)
            .bind(range.to_ms)
            .bind(limit_i64(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(q("read a series"))?,
            Some(step) => sqlx::query(AssertSqlSafe(format!(
                "SELECT (ts_ms / ?1) * ?1 AS t, avg({column}) AS v FROM gpu_samples \
                 WHERE gpu_id = ?2 AND ts_ms BETWEEN ?3 AND ?4 GROUP BY t ORDER BY t LIMIT ?5"
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
                    // Stored integers are u64 bit patterns (see the schema).
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
             VALUES (?, ?, ?, ?, ?, ?)",
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
            "SELECT id, node, role, secret_hash, created_ms, revoked_ms FROM agent_tokens WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(q("look up an agent token"))?;
        row.as_ref().map(token_row).transpose()
    }

    async fn revoke_agent_token(&self, id: &str, now_ms: UnixMs) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE agent_tokens SET revoked_ms = ? WHERE id = ? AND revoked_ms IS NULL",
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
        let _turn = self.write_gate.lock().await;
        energy::replace_energy_minutes(&self.pool, gpu, from_ms, to_ms, minutes, done_to_ms).await
    }

    async fn replace_energy_minutes_many(
        &self,
        batch: &[super::energy::MinuteReplacement],
    ) -> Result<(), StoreError> {
        let _turn = self.write_gate.lock().await;
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
        let _turn = self.write_gate.lock().await;
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

    async fn expire_raw_before(
        &self,
        cutoff_ms: UnixMs,
        batch_rows: usize,
    ) -> Result<super::rollup::RetentionOutcome, StoreError> {
        rollup::expire_raw_before(&self.pool, &self.write_gate, cutoff_ms, batch_rows).await
    }

    async fn expire_rollups_before(
        &self,
        cutoff_ms: UnixMs,
        batch_rows: usize,
    ) -> Result<super::rollup::RetentionOutcome, StoreError> {
        rollup::expire_rollups_before(&self.pool, &self.write_gate, cutoff_ms, batch_rows).await
    }

    // ---- carbon (issue 7)

    async fn upsert_intensity(
        &self,
        slots: &[gpufleet_carbon::IntensitySlot],
    ) -> Result<(), StoreError> {
        let _turn = self.write_gate.lock().await;
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
        let _turn = self.write_gate.lock().await;
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
        false
    }

    async fn try_lead(&self, job: &str) -> Result<Option<super::lease::Lease>, StoreError> {
        match &self.leases {
            Leases::File(db) => super::lease::file(db, job),
            Leases::Local(local) => Ok(local.try_lead(job)),
        }
    }

    /// Four queries whatever the number of nodes (see `sqlite/follow.rs`).
    async fn nodes_ticks(
        &self,
        wanted: &[(&NodeRecord, TimeRange)],
        limit: usize,
    ) -> Result<Vec<Vec<gpufleet_core::Tick>>, StoreError> {
        follow::nodes_ticks(&self.pool, wanted, limit).await
    }
}

fn token_row(row: &SqliteRow) -> Result<AgentTokenRecord, StoreError> {
    let get = |e: sqlx::Error| StoreError::Query {
        op: "read an agent token",
        source: e,
    };
    Ok(AgentTokenRecord {
        id: row.try_get("id").map_err(get)?,
        node: row.try_get("node").map_err(get)?,
        role: row.try_get("role").map_err(get)?,
        secret_hash: row.try_get("secret_hash").map_err(get)?,
        created_ms: row.try_get("created_ms").map_err(get)?,
        revoked_ms: row.try_get("revoked_ms").map_err(get)?,
    })
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

/// One distinct workload of a write.
struct WorkloadSlot<'b> {
    workload: &'b Workload,
    /// The first tick it appears in (recorded as `first_seen_ms` for a new workload).
    first_ms: UnixMs,
    /// Its id: from the cache, or from the upsert.
    id: Option<i64>,
}

/// The delivery-state update of one node.
struct NodeUpdate {
    id: i64,
    newest_ms: i64,
    /// The highest seq written for the node, and that batch's delivery stats.
    seq: u64,
    delivery: DeliveryStats,
    /// GPU samples newly inserted.
    inserted: u64,
}

/// Every row of one write, grouped by node (a node's batches keep their order).
struct Rows<'b> {
    gpu: Vec<GpuRow<'b>>,
    process: Vec<ProcessRow<'b>>,
    host: Vec<HostRowRef<'b>>,
    events: Vec<EventRow<'b>>,
    /// One per node, in group order (`GpuRow::group` indexes it).
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
        let (mut gpu_rows, mut process_rows) = (0, 0);
        for nb in batches {
            for t in &nb.batch.ticks {
                gpu_rows += t.gpus.len();
                process_rows += t.processes.len();
            }
        }
        let mut rows = Rows {
            gpu: Vec::with_capacity(gpu_rows),
            process: Vec::with_capacity(process_rows),
            host: Vec::new(),
            events: Vec::new(),
            nodes: Vec::new(),
            workloads: Vec::new(),
        };
        let mut distinct: HashMap<&'b Workload, usize> = HashMap::new();
        let (mut prev_slots, mut slots): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
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
                let gpu_id = |uuid: &str| {
                    keys.gpus
                        .get(uuid)
                        .map(|g| g.0)
                        .ok_or_else(|| StoreError::UnknownGpu {
                            node: keys.name.clone(),
                            seq: batch.seq,
                            uuid: uuid.to_owned(),
                        })
                };
                // Processes usually repeat tick after tick: comparing with the process at
                // the same position in the previous tick avoids hashing the workload.
                let mut prev: &[ProcessSample] = &[];
                for t in &batch.ticks {
                    update.newest_ms = update.newest_ms.max(t.time_ms);
                    for s in &t.gpus {
                        rows.gpu.push(GpuRow {
                            group: g,
                            gpu: gpu_id(&s.gpu_uuid)?,
                            ts: t.time_ms,
                            s,
                        });
                    }
                    slots.clear();
                    for (j, p) in t.processes.iter().enumerate() {
                        let slot = match prev.get(j) {
                            Some(q) if q.workload == p.workload => prev_slots[j],
                            _ => *distinct.entry(&p.workload).or_insert_with(|| {
                                rows.workloads.push(WorkloadSlot {
                                    workload: &p.workload,
                                    first_ms: t.time_ms,
                                    id: cache.get(&p.workload).copied(),
                                });
                                rows.workloads.len() - 1
                            }),
                        };
                        slots.push(slot);
                        rows.process.push(ProcessRow {
                            gpu: gpu_id(&p.gpu_uuid)?,
                            ts: t.time_ms,
                            slot,
                            workload: 0,
                            p,
                        });
                    }
                    prev = &t.processes;
                    std::mem::swap(&mut prev_slots, &mut slots);
                    if t.host.is_some() || t.cost.is_some() {
                        rows.host.push(HostRowRef {
                            node: keys.id.0,
                            ts: t.time_ms,
                            host: t.host.as_ref(),
                            cost: t.cost.as_ref(),
                        });
                    }
                    for e in &t.events {
                        let gpu = if e.gpu_uuid.is_empty() {
                            None
                        } else {
                            Some(gpu_id(&e.gpu_uuid)?)
                        };
                        rows.events.push(EventRow {
                            node: keys.id.0,
                            gpu,
                            e,
                        });
                    }
                }
            }
            rows.nodes.push(update);
        }
        Ok(rows)
    }
}

/// The batches of a write whose GPU samples or host rows conflict with the stored ones
/// ([`super::find_conflicts`]): every GPU's and node's rows are read back over the span
/// the write covers.
async fn conflicts_of(
    conn: &mut SqliteConnection,
    batches: &[NodeBatch],
    skip: &HashSet<usize>,
) -> Result<Vec<BatchConflict>, StoreError> {
    let mut check = super::ConflictCheck {
        gpu: super::incoming_gpu_rows(batches, skip, |_| true),
        host: super::incoming_host_rows(batches, skip),
        ..Default::default()
    };
    for (gpu, from, to) in super::spans(check.gpu.iter().map(|r| (r.gpu, r.ts))) {
        let rows = sqlx::query(
            "SELECT '' AS gpu_uuid, * FROM gpu_samples \
             WHERE gpu_id = ? AND ts_ms BETWEEN ? AND ?",
        )
        .bind(gpu)
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
        let rows =
            sqlx::query("SELECT * FROM host_samples WHERE node_id = ? AND ts_ms BETWEEN ? AND ?")
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
            by_key.insert(get(&row, "key")?, get(&row, "id")?);
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
fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get(column)
        .map_err(|e| StoreError::Corrupt(format!("column {column}: {e}")))
}

/// An unsigned 64-bit column (stored as the i64 with the same bits).
fn get_u64(row: &SqliteRow, column: &str) -> Result<Option<u64>, StoreError> {
    Ok(get::<Option<i64>>(row, column)?.map(from_i64))
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

fn node_from_row(row: &SqliteRow) -> Result<NodeRecord, StoreError> {
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
        interval_ms: get(row, "interval_ms")?,
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
            cpu_count: get(row, "cpu_count")?,
            memory_total_bytes: get_u64(row, "memory_total_bytes")?,
        },
        gpus: Vec::new(),
    })
}

fn gpu_from_row(row: &SqliteRow) -> Result<GpuRecord, StoreError> {
    let mig: String = get(row, "mig_instances")?;
    let mig_instances: Vec<MigInstance> = serde_json::from_str(&mig)
        .map_err(|e| StoreError::Corrupt(format!("gpus.mig_instances is not valid: {e}")))?;
    Ok(GpuRecord {
        id: GpuId(get(row, "id")?),
        info: GpuInfo {
            index: get(row, "gpu_index")?,
            uuid: get(row, "uuid")?,
            name: get(row, "name")?,
            serial: get(row, "serial")?,
            pci_bus_id: get(row, "pci_bus_id")?,
            architecture: get(row, "architecture")?,
            brand: get(row, "brand")?,
            memory_total_bytes: get_u64(row, "memory_total_bytes")?,
            power_limit_default_mw: get(row, "power_limit_default_mw")?,
            power_limit_enforced_mw: get(row, "power_limit_enforced_mw")?,
            power_limit_min_mw: get(row, "power_limit_min_mw")?,
            power_limit_max_mw: get(row, "power_limit_max_mw")?,
            max_clock_sm_mhz: get(row, "max_clock_sm_mhz")?,
            max_clock_mem_mhz: get(row, "max_clock_mem_mhz")?,
            max_clock_graphics_mhz: get(row, "max_clock_graphics_mhz")?,
            nvlink_count: get(row, "nvlink_count")?,
            mig_enabled: get(row, "mig_enabled")?,
            compute_mode: get(row, "compute_mode")?,
            persistence_mode: get(row, "persistence_mode")?,
            cuda_capability_major: get(row, "cuda_capability_major")?,
            cuda_capability_minor: get(row, "cuda_capability_minor")?,
            pcie_link_gen_max: get(row, "pcie_link_gen_max")?,
            pcie_link_width_max: get(row, "pcie_link_width_max")?,
            vbios_version: get(row, "vbios_version")?,
            mig_instances,
        },
    })
}

fn gpu_sample_from_row(row: &SqliteRow) -> Result<GpuSample, StoreError> {
    let nvlinks = match get::<Option<Vec<u8>>>(row, "nvlinks")? {
        Some(bytes) => decode_nvlinks(&bytes)
            .map_err(|e| StoreError::Corrupt(format!("gpu_samples.nvlinks: {e}")))?,
        None => Vec::new(),
    };
    Ok(GpuSample {
        gpu_uuid: get(row, "gpu_uuid")?,
        util_gpu_pct: get(row, "util_gpu_pct")?,
        util_mem_pct: get(row, "util_mem_pct")?,
        mem_used_bytes: get_u64(row, "mem_used_bytes")?,
        mem_total_bytes: get_u64(row, "mem_total_bytes")?,
        mem_reserved_bytes: get_u64(row, "mem_reserved_bytes")?,
        power_mw: get(row, "power_mw")?,
        power_instant_mw: get(row, "power_instant_mw")?,
        power_limit_mw: get(row, "power_limit_mw")?,
        energy_mj: get_u64(row, "energy_mj")?,
        temp_gpu_c: get(row, "temp_gpu_c")?,
        temp_mem_c: get(row, "temp_mem_c")?,
        fan_pct: get(row, "fan_pct")?,
        clock_sm_mhz: get(row, "clock_sm_mhz")?,
        clock_mem_mhz: get(row, "clock_mem_mhz")?,
        clock_graphics_mhz: get(row, "clock_graphics_mhz")?,
        pstate: get(row, "pstate")?,
        pcie_tx_bps: get_u64(row, "pcie_tx_bps")?,
        pcie_rx_bps: get_u64(row, "pcie_rx_bps")?,
        nvlink_tx_bps: get_u64(row, "nvlink_tx_bps")?,
        nvlink_rx_bps: get_u64(row, "nvlink_rx_bps")?,
        nvlinks,
        ecc_corrected_volatile: get_u64(row, "ecc_corrected_volatile")?,
        ecc_uncorrected_volatile: get_u64(row, "ecc_uncorrected_volatile")?,
        throttle_reasons: get_u64(row, "throttle_reasons")?,
        enc_util_pct: get(row, "enc_util_pct")?,
        dec_util_pct: get(row, "dec_util_pct")?,
    })
}

fn process_from_row(row: &SqliteRow) -> Result<ProcessSample, StoreError> {
    let process_type = match get::<i64>(row, "process_type")? {
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
        pid: get(row, "pid")?,
        process_type,
        user: get(row, "user_name")?,
        command: get(row, "command")?,
        gpu_mem_bytes: get_u64(row, "gpu_mem_bytes")?,
        sm_util_pct: get(row, "sm_util_pct")?,
        mem_util_pct: get(row, "mem_util_pct")?,
        enc_util_pct: get(row, "enc_util_pct")?,
        dec_util_pct: get(row, "dec_util_pct")?,
        workload: workload_from_row(row)?,
        mig_uuid: get(row, "mig_uuid")?,
    })
}

/// The workload columns of a row (`w_kind`, `w_runtime`, ... as in [`PROCESS_COLS`]).
fn workload_from_row(row: &SqliteRow) -> Result<Workload, StoreError> {
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
        uid: get(row, "w_uid")?,
        container_name: get(row, "w_container_name")?,
        image: get(row, "w_image")?,
        pod_name: get(row, "w_pod_name")?,
        namespace: get(row, "w_namespace")?,
    })
}

fn host_from_row(row: &SqliteRow) -> Result<HostRow, StoreError> {
    let sample = HostSample {
        cpu_util_pct: get::<Option<f64>>(row, "cpu_util_pct")?.map(|v| v as f32),
        mem_used_bytes: get_u64(row, "mem_used_bytes")?,
        mem_total_bytes: get_u64(row, "mem_total_bytes")?,
        disk_read_bps: get_u64(row, "disk_read_bps")?,
        disk_write_bps: get_u64(row, "disk_write_bps")?,
        net_rx_bps: get_u64(row, "net_rx_bps")?,
        net_tx_bps: get_u64(row, "net_tx_bps")?,
        load1: get::<Option<f64>>(row, "load1")?.map(|v| v as f32),
    };
    let slowest: Option<String> = get(row, "cost_slowest_calls")?;
    let slowest_calls_us = match slowest {
        Some(s) => serde_json::from_str(&s).map_err(|e| {
            StoreError::Corrupt(format!("host_samples.cost_slowest_calls is not valid: {e}"))
        })?,
        None => BTreeMap::new(),
    };
    let cost = SamplerCost {
        cpu_us: get(row, "cost_cpu_us")?,
        wall_us: get(row, "cost_wall_us")?,
        source_us: get(row, "cost_source_us")?,
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
