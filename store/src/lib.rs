//! The store boundary: everything the collector keeps on disk goes through it, and only
//! this crate knows SQL. It does not depend on the collector; the collector reaches it as
//! `crate::store`.
//!
//! One trait per concept, each beside its types and its SQL: [`IngestWrites`],
//! [`FleetReads`] and [`TokenStore`] (`fleet.rs`), [`EnergyStore`], [`RollupStore`],
//! [`CarbonStore`], [`JobLeases`], [`RemoteWriteStore`], [`AlertStore`]; [`Store`] is all of them. Components take the traits
//! they use and speak in domain types (`gpufleet_core` samples, [`NodeRecord`],
//! [`GpuMetric`]). [`SqlStore`] implements every trait once over a [`Backend`] (the dialect
//! layer, `backend.rs`; rows decoded once in `rows.rs`); [`sqlite`] and [`postgres`] hold
//! what differs: opening, the tuned sample writes (`write.rs`: the group commit), SQLite's
//! write queue, PostgreSQL's day partitions and leases. `tests/it/store_contract.rs` is the
//! contract both backends pass.
//!
//! Invariants every implementation keeps:
//! - **Absent is not zero**: a `None` is stored as NULL and read back as `None`.
//! - **Idempotent writes**: samples are keyed by (GPU, time), (GPU, time, pid), (node, time);
//!   events by (node, time, GPU, kind, code). Writing the same batch twice changes nothing.
//! - **Replays, not conflicts**: a GPU sample or host row whose key is already stored with
//!   the same values is a replay and is skipped; with other values it is a conflict, and its whole
//!   batch is left out of the write and reported in [`WriteOutcome::conflicts`] (never
//!   silently dropped while the batch is acked).
//! - **A GPU belongs to the node that registered it**: another node's Hello naming it is
//!   refused ([`StoreError::GpuOwned`]); only [`IngestWrites::rehome_gpu`] moves it.
//! - **One transaction per [`IngestWrites::write_batches`] call**: either every batch in it is
//!   durable when it returns `Ok`, or none is.
//!
//! Every packed table is described once in `series.rs` (row table, packed table, id
//! column, span, lock); the lifecycle of what they hold follows.
#![doc = include_str!("lifecycle.md")]

pub mod alerts;
mod arrival;
mod backend;
pub mod carbon;
pub mod energy;
mod fleet;
mod follow;
mod health_hours;
mod held;
pub mod lease;
mod merge;
mod packing;
pub mod postgres;
pub mod remote_write;
pub mod rollup;
mod rollup_hours;
mod rows;
mod series;
pub mod sqlite;
mod tiers;
mod write;

pub use alerts::AlertStore;
pub use arrival::PACK_ON_ARRIVAL_AFTER_MS;
pub use backend::{Backend, Dialect};
pub use carbon::CarbonStore;
pub use energy::EnergyStore;
pub use fleet::{FleetReads, IngestWrites, TokenStore};
/// The packed column format, a crate of its own: what the store writes into packed rows.
pub use gpufleet_packed as packed;
pub use gpufleet_packed::HostRow;
pub use lease::JobLeases;
pub use remote_write::RemoteWriteStore;
pub use rollup::RollupStore;
pub use series::PackOutcome;

use async_trait::async_trait;
use gpufleet_core::{
    Batch, DeliveryStats, Event, GpmMetrics, GpuHealthSample, GpuInfo, GpuSample, HostInfo,
    HostSample, Inventory, MigGpm, NvLinkSample, ProcessSample, SamplerCost, Tick, UnixMs,
    Workload,
};
use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use thiserror::Error;

/// A node's id in the store. Issued by the store; opaque to everyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub i64);

/// A GPU's id in the store. Issued by the store; opaque to everyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuId(pub i64);

/// Why a store operation failed. Messages are for the operator's log: they may name
/// tables and database errors, so the edges (gRPC, HTTP) never show them to clients.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("unsupported database URL {url:?}: {why}")]
    UnsupportedUrl { url: String, why: String },
    #[error("cannot open database {url:?}: {source}")]
    Open {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot apply database migrations: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("database error while trying to {op}: {source}")]
    Query {
        op: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    /// A packed value (samples or rollup minutes of one series) that cannot be decoded.
    #[error("a packed value cannot be read: {0}")]
    Unreadable(String),
    #[error("cannot take the lease of job {job:?}: {why}")]
    Lease { job: String, why: String },
    #[error("batch {seq} of node {node:?} names GPU {uuid:?}, which the node did not register")]
    UnknownGpu {
        node: String,
        seq: u64,
        uuid: String,
    },
    /// A node declared a GPU that another node registered.
    #[error(
        "GPU {uuid} belongs to node {owner:?}; if it really moved, re-home it with \
         `gpufleet-collector rehome-gpu --db URL {uuid} --to NODE`"
    )]
    GpuOwned { uuid: String, owner: String },
    /// A batch was not written because stored rows with its keys hold other values.
    #[error("batch {seq} of node {node:?} was not stored: {reason}")]
    Conflict {
        node: String,
        seq: u64,
        reason: String,
    },
}

impl StoreError {
    /// Whether retrying the same operation later may succeed (the database was busy,
    /// unreachable, or out of connections) rather than the request itself being at fault.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Query { source, .. } | StoreError::Open { source, .. } => matches!(
                source,
                sqlx::Error::Io(_)
                    | sqlx::Error::PoolTimedOut
                    | sqlx::Error::PoolClosed
                    | sqlx::Error::WorkerCrashed
                    | sqlx::Error::Database(_)
            ),
            _ => false,
        }
    }
}

/// What a packed value that cannot be read ([`StoreError::Unreadable`]) does to one
/// series' packing or retention: a warning, and `Ok(None)` (the series is left alone this
/// run), so that the job goes on with the other series. Other errors pass.
pub(crate) fn skip_unreadable<T>(
    result: Result<Option<T>, StoreError>,
    table: &'static str,
    id: i64,
) -> Result<Option<T>, StoreError> {
    match result {
        Err(StoreError::Unreadable(e)) => {
            tracing::warn!(table, id, error = %e, "a packed value cannot be read: this series is skipped");
            Ok(None)
        }
        other => other,
    }
}

/// A node as stored: identity, session facts from its latest Hello, delivery state, and
/// inventory with the ids of its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub id: NodeId,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub agent_version: String,
    pub boot_id: String,
    pub source: String,
    pub interval_ms: u32,
    /// Collector clock at the first Hello ever received from this node.
    pub first_seen_ms: UnixMs,
    /// Collector clock at the latest Hello.
    pub last_hello_ms: UnixMs,
    /// Newest tick time stored (agent clock); `None` before the first sample.
    pub last_seen_ms: Option<UnixMs>,
    /// Highest batch seq committed (a maximum, not a contiguous watermark).
    pub last_acked_seq: u64,
    /// Delivery stats as of the highest-seq batch committed.
    pub delivery: DeliveryStats,
    /// GPU samples stored for this node (kept in the inserting transaction).
    pub stored_samples: u64,
    pub driver_version: Option<String>,
    pub cuda_driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub host: HostInfo,
    /// GPUs whose latest registration was on this node, by index then UUID.
    pub gpus: Vec<GpuRecord>,
}

impl NodeRecord {
    /// The keys a session needs to write this node's batches.
    pub fn keys(&self) -> NodeKeys {
        NodeKeys {
            id: self.id,
            name: self.name.clone(),
            gpus: self
                .gpus
                .iter()
                .map(|g| (g.info.uuid.clone(), g.id))
                .collect(),
        }
    }

    /// A node named `name` holding `gpus` (id, UUID), every other fact empty: for tests.
    pub fn with_gpus(id: i64, name: &str, gpus: &[(i64, &str)]) -> NodeRecord {
        NodeRecord {
            id: NodeId(id),
            name: name.into(),
            labels: BTreeMap::new(),
            agent_version: String::new(),
            boot_id: String::new(),
            source: String::new(),
            interval_ms: 1000,
            first_seen_ms: 0,
            last_hello_ms: 0,
            last_seen_ms: None,
            last_acked_seq: 0,
            delivery: DeliveryStats::default(),
            stored_samples: 0,
            driver_version: None,
            cuda_driver_version: None,
            nvml_version: None,
            host: HostInfo::default(),
            gpus: (gpus.iter())
                .map(|&(id, uuid)| GpuRecord {
                    id: GpuId(id),
                    info: GpuInfo {
                        uuid: uuid.into(),
                        ..GpuInfo::default()
                    },
                })
                .collect(),
        }
    }

    /// The inventory as the agent last declared it.
    pub fn inventory(&self) -> Inventory {
        Inventory {
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version.clone(),
            nvml_version: self.nvml_version.clone(),
            gpus: self.gpus.iter().map(|g| g.info.clone()).collect(),
            host: self.host.clone(),
        }
    }
}

/// A GPU as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuRecord {
    pub id: GpuId,
    pub info: GpuInfo,
}

/// A map keyed by GPU UUID, looked up several times per sample on the ingest path:
/// foldhash, seeded per map, not SipHash (the keys are a node's own inventory, bounded).
pub type UuidMap<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// What a session needs to write a node's batches without asking the store: its id and
/// the ids of the GPUs it registered, by UUID (so no per-row lookups on the hot path).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeKeys {
    pub id: NodeId,
    pub name: String,
    pub gpus: UuidMap<GpuId>,
}

/// A validated batch and the node it came from: the unit [`IngestWrites::write_batches`] takes.
#[derive(Debug, Clone)]
pub struct NodeBatch {
    /// Shared by every batch of one session.
    pub keys: Arc<NodeKeys>,
    pub batch: Batch,
}

impl NodeBatch {
    /// Rows this batch will write (GPU, process, host samples and events): what the
    /// group-commit writer budgets transactions by.
    pub fn rows(&self) -> usize {
        self.batch
            .ticks
            .iter()
            .map(|t| t.gpus.len() + t.processes.len() + t.events.len() + 1)
            .sum()
    }
}

/// What a successful [`IngestWrites::write_batches`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteOutcome {
    /// GPU samples newly inserted per node (replayed rows are not counted).
    pub inserted_gpu_samples: HashMap<NodeId, u64>,
    /// Batches left out of the write because they conflict with stored rows; every other
    /// batch was committed.
    pub conflicts: Vec<BatchConflict>,
}

/// A batch [`IngestWrites::write_batches`] did not write: a GPU sample or host row of it has the
/// key of a stored one with other values.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchConflict {
    /// Its index in the slice given to `write_batches`.
    pub index: usize,
    /// What conflicts, for the agent and the log.
    pub reason: String,
}

/// What [`IngestWrites::rehome_gpu`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rehomed {
    /// The GPU now belongs to the node; `from` is the node it belonged to.
    Moved { from: String },
    /// It already belonged to that node.
    Unchanged,
    /// No GPU has that UUID.
    UnknownGpu,
    /// No node has that name.
    UnknownNode,
}

/// The newest stored sample of one GPU, with the processes seen at that tick.
#[derive(Debug, Clone, PartialEq)]
pub struct LatestGpu {
    pub gpu: GpuId,
    pub time_ms: UnixMs,
    pub sample: GpuSample,
    pub processes: Vec<ProcessSample>,
}

/// The newest stored health sample of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct LatestHealth {
    pub gpu: GpuId,
    pub time_ms: UnixMs,
    pub sample: GpuHealthSample,
}

/// The newest stored host sample of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct LatestHost {
    pub node: NodeId,
    pub time_ms: UnixMs,
    pub sample: Option<HostSample>,
    pub cost: Option<SamplerCost>,
}

/// An inclusive time range in Unix ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeRange {
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
}

/// Defines [`GpuMetric`]: each metric's variant, name and unit, in storage order.
macro_rules! gpu_metrics {
    ($count:literal; $($variant:ident $field:ident $unit:literal,)*;
     $($gvariant:ident $gname:ident $gfield:ident $gunit:literal,)*) => {
        /// The numeric per-GPU metrics a time series can be asked for. The names are the
        /// `GpuSample` field names, `gpm_` and the field for its GPM (and the API's
        /// `metric=` values); the mapping to storage is the store's business, so user
        /// input never reaches SQL. `throttle_reasons` is a bit mask and is not a series
        /// (an average of masks means nothing).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum GpuMetric {
            $($variant,)*
            $($gvariant,)*
        }

        impl GpuMetric {
            pub const ALL: [GpuMetric; $count] =
                [$(GpuMetric::$variant,)* $(GpuMetric::$gvariant,)*];

            /// The metric's name: the `GpuSample` field and the API's `metric=` value.
            pub fn name(self) -> &'static str {
                match self {
                    $(GpuMetric::$variant => stringify!($field),)*
                    $(GpuMetric::$gvariant => stringify!($gname),)*
                }
            }

            /// The unit of the metric's values.
            pub fn unit(self) -> &'static str {
                match self {
                    $(GpuMetric::$variant => $unit,)*
                    $(GpuMetric::$gvariant => $gunit,)*
                }
            }

            /// The metric's value in `sample` (`None`: absent).
            pub fn value(self, sample: &GpuSample) -> Option<u64> {
                match self {
                    $(GpuMetric::$variant => sample.$field.map(u64::from),)*
                    $(GpuMetric::$gvariant => sample.gpm.$gfield.map(u64::from),)*
                }
            }
        }
    };
}

gpu_metrics!(38;
    UtilGpuPct util_gpu_pct "percent",
    UtilMemPct util_mem_pct "percent",
    MemUsedBytes mem_used_bytes "bytes",
    MemTotalBytes mem_total_bytes "bytes",
    MemReservedBytes mem_reserved_bytes "bytes",
    PowerMw power_mw "milliwatts",
    PowerInstantMw power_instant_mw "milliwatts",
    PowerLimitMw power_limit_mw "milliwatts",
    EnergyMj energy_mj "millijoules",
    TempGpuC temp_gpu_c "celsius",
    TempMemC temp_mem_c "celsius",
    FanPct fan_pct "percent",
    ClockSmMhz clock_sm_mhz "megahertz",
    ClockMemMhz clock_mem_mhz "megahertz",
    ClockGraphicsMhz clock_graphics_mhz "megahertz",
    Pstate pstate "pstate",
    PcieTxBps pcie_tx_bps "bytes_per_second",
    PcieRxBps pcie_rx_bps "bytes_per_second",
    NvlinkTxBps nvlink_tx_bps "bytes_per_second",
    NvlinkRxBps nvlink_rx_bps "bytes_per_second",
    EccCorrectedVolatile ecc_corrected_volatile "errors",
    EccUncorrectedVolatile ecc_uncorrected_volatile "errors",
    EncUtilPct enc_util_pct "percent",
    DecUtilPct dec_util_pct "percent",;
    // GPM: the name, then the `GpmMetrics` field.
    GpmSmActive gpm_sm_active_cpct sm_active_cpct "centipercent",
    GpmSmOccupancy gpm_sm_occupancy_cpct sm_occupancy_cpct "centipercent",
    GpmTensorActive gpm_tensor_active_cpct tensor_active_cpct "centipercent",
    GpmTensorHmma gpm_tensor_hmma_cpct tensor_hmma_cpct "centipercent",
    GpmTensorImma gpm_tensor_imma_cpct tensor_imma_cpct "centipercent",
    GpmTensorDfma gpm_tensor_dfma_cpct tensor_dfma_cpct "centipercent",
    GpmDramBw gpm_dram_bw_cpct dram_bw_cpct "centipercent",
    GpmFp64 gpm_fp64_cpct fp64_cpct "centipercent",
    GpmFp32 gpm_fp32_cpct fp32_cpct "centipercent",
    GpmFp16 gpm_fp16_cpct fp16_cpct "centipercent",
    GpmPcieTxBps gpm_pcie_tx_bps pcie_tx_bps "bytes_per_second",
    GpmPcieRxBps gpm_pcie_rx_bps pcie_rx_bps "bytes_per_second",
    GpmNvlinkTxBps gpm_nvlink_tx_bps nvlink_tx_bps "bytes_per_second",
    GpmNvlinkRxBps gpm_nvlink_rx_bps nvlink_rx_bps "bytes_per_second",
);

impl GpuMetric {
    /// Looks a metric up by its name.
    pub fn parse(name: &str) -> Option<GpuMetric> {
        GpuMetric::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// One point of a series: time (sample time, or bucket start) and value (`None` when the
/// metric was absent in that sample or in every sample of the bucket).
pub type SeriesPoint = (UnixMs, Option<f64>);

/// A clock, in Unix milliseconds.
pub type ArrivalClock = Arc<dyn Fn() -> UnixMs + Send + Sync>;

/// A store's [`ArrivalClock`], if any.
struct ArrivalClockCell(Mutex<Option<ArrivalClock>>);

impl std::fmt::Debug for ArrivalClockCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.lock().map(|c| c.is_some()).unwrap_or(false);
        f.debug_struct("ArrivalClock").field("set", &set).finish()
    }
}

/// The whole store: every concept's trait, and the store's own lifecycle. `main` opens one
/// ([`open`]) and hands each component the traits it uses (`Arc<dyn IngestWrites>` to the
/// writer, `Arc<dyn EnergyStore>` to the accountant, ...), so a test can fake just those.
/// Implementations: [`sqlite::SqliteStore`], [`postgres::PgStore`].
///
/// All methods are cancel-safe in the sense that dropping a pending write rolls its
/// transaction back; nothing is half-written.
#[async_trait]
pub trait Store:
    IngestWrites
    + FleetReads
    + TokenStore
    + EnergyStore
    + RollupStore
    + CarbonStore
    + JobLeases
    + RemoteWriteStore
    + AlertStore
    + std::fmt::Debug
    + 'static
{
    /// The backend's name as `/api/v1/health` reports it: `"sqlite"`, `"postgres"`.
    fn backend(&self) -> &'static str;

    /// A trivial query, to tell whether the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Flushes and closes connections. Further calls fail.
    async fn close(&self);
}

#[async_trait]
impl<DB: Backend> Store for SqlStore<DB> {
    fn backend(&self) -> &'static str {
        DB::BACKEND
    }

    async fn ping(&self) -> Result<(), StoreError> {
        backend::sql::<DB>("ping the database", "SELECT 1")
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}

/// The store on a SQL database: every query written once over [`Backend`] (SQLite or
/// PostgreSQL), the backends' own hot paths behind its hooks. [`sqlite::SqliteStore`] and
/// [`postgres::PgStore`] are its two instances.
#[derive(Debug)]
pub struct SqlStore<DB: Backend> {
    pool: sqlx::Pool<DB>,
    /// Workload id per workload (all fields, so that a variant carrying new names is
    /// upserted once and its names stored). Only committed ids enter it: an id from a
    /// rolled-back transaction could be reused for another workload.
    workloads: Mutex<HashMap<Workload, i64>>,
    /// Process lifetime id per identity (`process_lives`), committed ids only, like
    /// `workloads`.
    lives: Mutex<HashMap<write::LifeKey, i64>>,
    /// The clock that closes minutes to writes ([`IngestWrites::set_arrival_clock`]).
    arrival_clock: ArrivalClockCell,
    /// What the backend keeps besides (SQLite: its write queue and lease files;
    /// PostgreSQL: the days whose partitions exist).
    local: DB::Local,
}

/// Workload ids kept in memory; the cache is cleared when it grows past this (the ids are
/// then fetched again by the next upsert, so clearing only costs a few statements).
const WORKLOAD_CACHE_MAX: usize = 50_000;
/// Process lifetime ids kept in memory, cleared alike.
const LIFE_CACHE_MAX: usize = 200_000;

/// A write transaction: on SQLite it holds this process's turn in the write queue until
/// it ends (see [`Backend::write_gate`]).
pub(crate) struct WriteTx<'a, DB: Backend> {
    tx: sqlx::Transaction<'static, DB>,
    _turn: Option<tokio::sync::MutexGuard<'a, ()>>,
}

impl<DB: Backend> WriteTx<'_, DB> {
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        &mut self.tx
    }

    pub(crate) async fn commit(self, op: &'static str) -> Result<(), StoreError> {
        self.tx
            .commit()
            .await
            .map_err(|source| StoreError::Query { op, source })
    }

    pub(crate) async fn rollback(self) -> Result<(), StoreError> {
        self.tx
            .rollback()
            .await
            .map_err(|source| StoreError::Query {
                op: "roll back",
                source,
            })
    }
}

impl<DB: Backend> SqlStore<DB> {
    fn new(pool: sqlx::Pool<DB>, local: DB::Local) -> SqlStore<DB> {
        SqlStore {
            pool,
            workloads: Mutex::new(HashMap::new()),
            lives: Mutex::new(HashMap::new()),
            arrival_clock: ArrivalClockCell(Mutex::new(Some(Arc::new(
                gpufleet_core::config::now_ms,
            )))),
            local,
        }
    }

    /// The end of the newest minute closed to writes now: [`arrival::pack_arriving`]
    /// packs the samples and process ticks of minutes ending by then (none without a
    /// clock).
    fn closed_before(&self) -> UnixMs {
        let clock = (self.arrival_clock.0.lock()).unwrap_or_else(PoisonError::into_inner);
        match clock.as_ref() {
            Some(now) => now().saturating_sub(arrival::PACK_ON_ARRIVAL_AFTER_MS),
            None => UnixMs::MIN,
        }
    }

    /// A connection of the pool, for reads.
    pub(crate) async fn conn(&self) -> Result<sqlx::pool::PoolConnection<DB>, StoreError> {
        self.pool
            .acquire()
            .await
            .map_err(|source| StoreError::Query {
                op: "acquire a connection",
                source,
            })
    }

    /// Runs a read on a connection of the pool and decodes its rows.
    pub(crate) async fn fetch<T>(
        &self,
        query: backend::Sql<DB>,
        decode: impl Fn(&DB::Row) -> Result<T, StoreError> + Send,
    ) -> Result<Vec<T>, StoreError> {
        let rows = query.all(&mut *self.conn().await?).await?;
        rows.iter().map(decode).collect()
    }

    /// A read-only transaction whose statements all see one snapshot (PostgreSQL:
    /// `REPEATABLE READ`; SQLite: a read transaction): for reads that merge several
    /// tables, which a write committing between their statements (a packed minute
    /// reopened into rows) must not split.
    pub(crate) async fn read_snapshot(
        &self,
        op: &'static str,
    ) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
        let mut tx =
            (self.pool.begin().await).map_err(|source| StoreError::Query { op, source })?;
        if DB::DIALECT == Dialect::Postgres {
            let text = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY";
            backend::sql::<DB>(op, text).execute(&mut tx).await?;
        }
        Ok(tx)
    }

    /// This process's turn to write, where the backend queues writers.
    async fn turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        Some(DB::write_gate(&self.local)?.lock().await)
    }

    /// Opens a write transaction, after waiting for this process's turn where the backend
    /// queues writers. Every write transaction of the store starts here.
    pub(crate) async fn begin_write(
        &self,
        op: &'static str,
    ) -> Result<WriteTx<'_, DB>, StoreError> {
        let turn = self.turn().await;
        let tx = match DB::BEGIN_WRITE {
            Some(begin) => self.pool.begin_with(begin).await,
            None => self.pool.begin().await,
        }
        .map_err(|source| StoreError::Query { op, source })?;
        Ok(WriteTx { tx, _turn: turn })
    }

    /// Runs one writing statement as its own transaction (tokens, each retention step), in
    /// turn; returns the rows it changed.
    pub(crate) async fn write_one(&self, query: backend::Sql<DB>) -> Result<u64, StoreError> {
        let _turn = self.turn().await;
        query.execute(&mut *self.conn().await?).await
    }

    /// The cached ids of these workloads (`None` where unknown).
    pub(crate) fn cached_workloads(&self) -> std::sync::MutexGuard<'_, HashMap<Workload, i64>> {
        self.workloads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers committed workload ids.
    pub(crate) fn cache_workloads<'w>(
        &self,
        ids: impl Iterator<Item = (&'w Workload, Option<i64>)>,
    ) {
        let mut cache = self.cached_workloads();
        let ids: Vec<_> = ids.collect();
        if cache.len() + ids.len() > WORKLOAD_CACHE_MAX {
            cache.clear();
        }
        for (workload, id) in ids {
            if let Some(id) = id
                && !cache.contains_key(workload)
            {
                cache.insert(workload.clone(), id);
            }
        }
    }

    pub(crate) fn cached_lives(&self) -> std::sync::MutexGuard<'_, HashMap<write::LifeKey, i64>> {
        self.lives.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers committed process lifetime ids.
    pub(crate) fn cache_lives(&self, ids: Vec<(write::LifeKey, i64)>) {
        let mut cache = self.cached_lives();
        if cache.len() + ids.len() > LIFE_CACHE_MAX {
            cache.clear();
        }
        cache.extend(ids);
    }
}

/// Ends a read transaction of [`SqlStore::read_snapshot`].
pub(crate) async fn end_read<DB: Backend>(
    tx: sqlx::Transaction<'static, DB>,
    op: &'static str,
) -> Result<(), StoreError> {
    tx.commit()
        .await
        .map_err(|source| StoreError::Query { op, source })
}

/// The migrations of a backend's folder (`migrations/sqlite`, `migrations/postgres`),
/// embedded so an installed binary needs no files beside it; numbered alike on both
/// backends, so later migrations line up.
macro_rules! migrations {
    ($dir:literal) => {
        migrations!($dir: 1 "init" "0001_init", 6 "energy" "0006_energy",
            9 "agent tokens" "0009_agent_tokens", 10 "carbon" "0010_carbon",
            11 "rollups" "0011_rollups", 20 "energy split" "0020_energy_split",
            21 "remote write" "0021_remote_write", 22 "gpu health" "0022_gpu_health",
            23 "alerts" "0023_alerts", 24 "waste" "0024_waste", 25 "process lives" "0025_process_lives",
            26 "packed minutes" "0026_packed_minutes",
            27 "packed gpu minutes" "0027_packed_gpu_minutes",
            28 "packed rollup hours" "0028_packed_rollup_hours",
            29 "packed gpu health hours" "0029_packed_gpu_health_hours",
            30 "packed hours" "0030_packed_hours",
            31 "workload names" "0031_workload_names",
            32 "slurm array and het" "0032_slurm_array_het",
            33 "gpm" "0033_gpm")
    };
    ($dir:literal: $($version:literal $description:literal $file:literal),*) => {
        &[$((
            $version,
            $description,
            include_str!(concat!("../../migrations/", $dir, "/", $file, ".sql")),
        )),*]
    };
}
pub(crate) use migrations;

/// Applies `migrations` (version, description, SQL) that the database has not seen.
async fn migrate<DB: Backend>(
    pool: &sqlx::Pool<DB>,
    migrations: &[(i64, &'static str, &'static str)],
) -> Result<(), StoreError>
where
    DB::Connection: sqlx::migrate::Migrate,
{
    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};
    let migrations = migrations
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
        .run(pool)
        .await
        .map_err(StoreError::Migrate)
}

/// Creates or upgrades the database `url` names with the migrations up to version `last`
/// and no later one: a database as an older collector left it, for tests of the later
/// migrations. A collector opens its store with [`open`], which applies them all.
#[doc(hidden)]
pub async fn migrate_to(url: &str, last: i64) -> Result<(), StoreError> {
    let open_err = open_error(url);
    if url.starts_with("sqlite:") {
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .map_err(&open_err)?
            .create_if_missing(true);
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(&open_err)?;
        let upto: Vec<_> = (migrations!("sqlite").iter().copied())
            .filter(|m| m.0 <= last)
            .collect();
        let done = migrate(&pool, &upto).await;
        pool.close().await;
        done
    } else {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .map_err(&open_err)?;
        let upto: Vec<_> = (migrations!("postgres").iter().copied())
            .filter(|m| m.0 <= last)
            .collect();
        let done = migrate(&pool, &upto).await;
        pool.close().await;
        done
    }
}

/// Groups a node's rows into ticks by time, oldest first, and keeps the newest `limit`
/// (what [`FleetReads::node_ticks`] returns).
pub fn assemble_ticks(
    gpus: Vec<(UnixMs, GpuSample)>,
    processes: Vec<(UnixMs, ProcessSample)>,
    hosts: Vec<HostRow>,
    events: Vec<Event>,
    health: Vec<(UnixMs, GpuHealthSample)>,
    limit: usize,
) -> Vec<Tick> {
    fn at(ticks: &mut BTreeMap<UnixMs, Tick>, t: UnixMs) -> &mut Tick {
        ticks.entry(t).or_insert_with(|| Tick {
            time_ms: t,
            ..Tick::default()
        })
    }
    let mut ticks: BTreeMap<UnixMs, Tick> = BTreeMap::new();
    for (t, s) in gpus {
        at(&mut ticks, t).gpus.push(s);
    }
    for (t, p) in processes {
        at(&mut ticks, t).processes.push(p);
    }
    for h in hosts {
        let tick = at(&mut ticks, h.time_ms);
        tick.host = h.sample;
        tick.cost = h.cost;
    }
    for e in events {
        at(&mut ticks, e.time_ms).events.push(e);
    }
    for (t, h) in health {
        at(&mut ticks, t).health.push(h);
    }
    let skip = ticks.len().saturating_sub(limit);
    ticks.into_values().skip(skip).collect()
}

/// A stored token (agent, viewer or admin): the secret itself is never stored, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTokenRecord {
    /// Public id (the `<id>` in `gft_<id>_<secret>`).
    pub id: String,
    /// Role `agent`: the node the token writes as; other roles: whom it is for.
    pub node: String,
    /// `agent`, `viewer` (read the dashboard and API) or `admin` (also change things).
    pub role: String,
    /// SHA-256 of the secret part.
    pub secret_hash: Vec<u8>,
    pub created_ms: UnixMs,
    /// When it was revoked; `None` while valid.
    pub revoked_ms: Option<UnixMs>,
}

/// Opens the store a database URL names: `sqlite://PATH` (the file is created if missing),
/// `sqlite::memory:`, or `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (`postgresql://`
/// too). Migrations are applied before it returns.
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(postgres::PgStore::open(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl {
            url: redact_url(url),
            why: "expected sqlite://PATH (e.g. sqlite://gpufleet.db) or \
                  postgres://USER:PASSWORD@HOST:PORT/DATABASE"
                .into(),
        })
    }
}

/// What a failure to open the database `url` becomes (its password left out).
fn open_error(url: &str) -> impl Fn(sqlx::Error) -> StoreError {
    let url = redact_url(url);
    move |source| StoreError::Open {
        url: url.clone(),
        source,
    }
}

/// What a failed query doing `op` becomes.
fn q(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::Query { op, source }
}

/// A URL with any password removed, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

// ------------------------------------------------------------------ NVLink encoding

/// Encodes per-link NVLink samples compactly (`None` for no links): per link, LEB128
/// varints `link << 2 | tx_present | rx_present << 1`, then `tx_bps` and/or `rx_bps` when
/// present. 18 links with both directions at ~25 GB/s take ~200 bytes; typical PCIe GPUs
/// store nothing.
pub fn encode_nvlinks(links: &[NvLinkSample]) -> Option<Vec<u8>> {
    if links.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(links.len() * 8);
    for l in links {
        let flags = u64::from(l.tx_bps.is_some()) | u64::from(l.rx_bps.is_some()) << 1;
        put_varint(&mut out, u64::from(l.link) << 2 | flags);
        if let Some(tx) = l.tx_bps {
            put_varint(&mut out, tx);
        }
        if let Some(rx) = l.rx_bps {
            put_varint(&mut out, rx);
        }
    }
    Some(out)
}

/// Encodes MIG instances' GPM compactly (`None` for none): per instance, its UUID's length
/// and bytes, its GPU instance id, a presence mask of the [`GpmMetrics::NAMES`] and the
/// present values, all LEB128 varints.
pub fn encode_mig_gpm(migs: &[MigGpm]) -> Option<Vec<u8>> {
    if migs.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(migs.len() * 48);
    for m in migs {
        put_varint(&mut out, m.mig_uuid.len() as u64);
        out.extend_from_slice(m.mig_uuid.as_bytes());
        put_varint(&mut out, u64::from(m.gpu_instance_id));
        let values = m.gpm.values();
        let mask = values
            .iter()
            .enumerate()
            .fold(0u64, |a, (k, v)| a | u64::from(v.is_some()) << k);
        put_varint(&mut out, mask);
        for v in values.into_iter().flatten() {
            put_varint(&mut out, v);
        }
    }
    Some(out)
}

/// Decodes what [`encode_mig_gpm`] wrote.
pub fn decode_mig_gpm(mut bytes: &[u8]) -> Result<Vec<MigGpm>, String> {
    let mut migs = Vec::new();
    while !bytes.is_empty() {
        let len = usize::try_from(get_varint(&mut bytes)?).map_err(|_| "length out of range")?;
        if len > bytes.len() {
            return Err("truncated MIG UUID".into());
        }
        let (uuid, rest) = bytes.split_at(len);
        bytes = rest;
        let mig_uuid = String::from_utf8(uuid.to_vec()).map_err(|_| "MIG UUID is not UTF-8")?;
        let gpu_instance_id =
            u32::try_from(get_varint(&mut bytes)?).map_err(|_| "GPU instance id out of range")?;
        let mask = get_varint(&mut bytes)?;
        if mask >> GpmMetrics::NAMES.len() != 0 {
            return Err("unknown GPM metrics in the mask".into());
        }
        let mut values = [None; 14];
        for (k, v) in values.iter_mut().enumerate() {
            if mask >> k & 1 != 0 {
                *v = Some(get_varint(&mut bytes)?);
            }
        }
        let gpm = GpmMetrics::from_values(values).ok_or("a GPM activity out of range")?;
        migs.push(MigGpm {
            mig_uuid,
            gpu_instance_id,
            gpm,
        });
    }
    Ok(migs)
}

/// Decodes what [`encode_nvlinks`] wrote.
pub fn decode_nvlinks(mut bytes: &[u8]) -> Result<Vec<NvLinkSample>, String> {
    let mut links = Vec::new();
    while !bytes.is_empty() {
        let head = get_varint(&mut bytes)?;
        let link = u32::try_from(head >> 2).map_err(|_| "nvlink number out of range")?;
        let tx_bps = (head & 1 != 0)
            .then(|| get_varint(&mut bytes))
            .transpose()?;
        let rx_bps = (head & 2 != 0)
            .then(|| get_varint(&mut bytes))
            .transpose()?;
        links.push(NvLinkSample {
            link,
            tx_bps,
            rx_bps,
        });
    }
    Ok(links)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first().ok_or("truncated varint")?;
        *bytes = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err("nvlink varint longer than 64 bits".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvlinks_round_trip_with_absent_directions() {
        let links = vec![
            NvLinkSample {
                link: 0,
                tx_bps: Some(25_000_000_000),
                rx_bps: Some(0),
            },
            NvLinkSample {
                link: 1,
                tx_bps: None,
                rx_bps: Some(127),
            },
            NvLinkSample {
                link: 17,
                tx_bps: Some(u64::MAX),
                rx_bps: None,
            },
            NvLinkSample {
                link: 5,
                tx_bps: None,
                rx_bps: None,
            },
        ];
        let bytes = encode_nvlinks(&links).expect("links present");
        assert_eq!(decode_nvlinks(&bytes), Ok(links));
        assert_eq!(encode_nvlinks(&[]), None);
        assert!(decode_nvlinks(&[0x81]).is_err(), "truncated");
    }

    #[test]
    fn metric_names_round_trip() {
        for m in GpuMetric::ALL {
            assert_eq!(GpuMetric::parse(m.name()), Some(m));
        }
        assert_eq!(GpuMetric::parse("throttle_reasons"), None);
        assert_eq!(GpuMetric::parse("power_mw; DROP TABLE gpus"), None);
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("sqlite://x.db"), "sqlite://x.db");
    }
}
