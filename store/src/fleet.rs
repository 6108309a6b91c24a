//! The fleet in the store: node registration and ingest writes ([`IngestWrites`]), what
//! the API and the live state read back ([`FleetReads`]), and agent tokens
//! ([`TokenStore`]); each written once over [`Backend`].

use super::backend::{Backend, Dialect, Get, sql};
use super::rollup_hours::HOUR_MS;
use super::rows::{
    self, EVENT_COLS, GPU_COLS, HEALTH_COLS, PROCESS_JOINS, limit_i64, process_cols, to_i64,
};
use super::{
    AgentTokenRecord, GpuId, GpuMetric, GpuRecord, HostRow, LatestGpu, LatestHealth, LatestHost,
    NodeBatch, NodeId, NodeRecord, Rehomed, SeriesPoint, SqlStore, StoreError, TimeRange,
    WriteOutcome, assemble_ticks, follow,
};
use async_trait::async_trait;
use gpufleet_core::times::{MINUTE_MS, minute_of};
use gpufleet_core::wire::HelloInfo;
use gpufleet_core::{
    Event, GpuHealthSample, GpuInfo, GpuSample, Inventory, ProcessSample, Tick, UnixMs,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, PoisonError};

/// What ingest writes: node registrations and validated batches.
#[async_trait]
pub trait IngestWrites: Send + Sync + std::fmt::Debug {
    /// Creates or updates a node and its GPUs from a Hello (`now_ms` is the collector's
    /// clock) and returns the node as stored. A GPU UUID registered by another node is
    /// refused with [`StoreError::GpuOwned`] and nothing is changed: a GPU moves only by
    /// [`IngestWrites::rehome_gpu`].
    async fn register_node(
        &self,
        hello: &HelloInfo,
        inventory: &Inventory,
        now_ms: UnixMs,
    ) -> Result<NodeRecord, StoreError>;

    /// Writes validated batches in one transaction and commits. Rows already stored with
    /// the same values (a replay) are left as they are; a batch with a GPU sample or host
    /// row whose key is stored with other values is left out whole and listed in
    /// [`WriteOutcome::conflicts`]. Per node, `last_seen_ms` and `last_acked_seq` become
    /// the maximum of the stored and the new values, and the delivery stats are taken from
    /// the highest seq.
    async fn write_batches(&self, batches: &[NodeBatch]) -> Result<WriteOutcome, StoreError>;

    /// Whether write transactions of this store run side by side (PostgreSQL: yes, as
    /// those of several collectors do; SQLite takes one writer at a time).
    fn concurrent_writes(&self) -> bool {
        false
    }

    /// Sets the clock that closes minutes to writes: the GPU samples and process ticks a
    /// write brings for a minute that ended
    /// [`PACK_ON_ARRIVAL_AFTER_MS`](super::PACK_ON_ARRIVAL_AFTER_MS) or more before it (a
    /// replay after an outage) go straight into the minute's packed values instead of
    /// rows. `None`: everything is written as rows, as an open minute's are. A store opens
    /// with the wall clock.
    fn set_arrival_clock(&self, clock: Option<super::ArrivalClock>);

    /// Gives the GPU `uuid` (and its stored history) to node `to` (the admin command
    /// `rehome-gpu`, for a GPU that really moved). Sessions already open keep the GPU
    /// list of their Hello: the new owner's agent writes it from its next Hello.
    async fn rehome_gpu(&self, uuid: &str, to: &str) -> Result<Rehomed, StoreError>;
}

/// What the API, the live state and the follower read of the fleet.
#[async_trait]
pub trait FleetReads: Send + Sync + std::fmt::Debug {
    /// Every node with its inventory, by name.
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError>;

    /// The newest sample of every GPU that has one (seeds the live state at start-up).
    async fn latest_gpu_samples(&self) -> Result<Vec<LatestGpu>, StoreError>;

    /// The newest host row of every node that has one.
    async fn latest_host_samples(&self) -> Result<Vec<LatestHost>, StoreError>;

    /// The newest health sample of every GPU that has one (seeds the live state).
    async fn latest_gpu_health(&self) -> Result<Vec<LatestHealth>, StoreError>;

    /// A GPU's health samples in `range`, oldest first, at most `limit`.
    async fn gpu_health(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, GpuHealthSample)>, StoreError>;

    /// A GPU's samples in `range`, oldest first, at most `limit`.
    async fn gpu_samples(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, GpuSample)>, StoreError>;

    /// A GPU's process samples in `range`, by time then pid, at most `limit`.
    async fn process_samples(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, ProcessSample)>, StoreError>;

    /// A node's host rows in `range`, oldest first, at most `limit`.
    async fn host_samples(
        &self,
        node: NodeId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<HostRow>, StoreError>;

    /// A node's events in `range`, oldest first, at most `limit`.
    async fn events(
        &self,
        node: NodeId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError>;

    /// One metric of one GPU over `range`. Without `step_ms`: every sample, oldest first.
    /// With it: the average per bucket `[k*step, (k+1)*step)`, timestamped with the bucket
    /// start; buckets without samples are omitted. At most `limit` points (callers ask for
    /// one more than they accept, to detect "too many").
    async fn gpu_series(
        &self,
        gpu: GpuId,
        metric: GpuMetric,
        range: TimeRange,
        step_ms: Option<i64>,
        limit: usize,
    ) -> Result<Vec<SeriesPoint>, StoreError>;

    /// A node's stored ticks in `range` (GPU samples with their processes, host row,
    /// events, health), oldest first, the newest `limit` at most: what another collector committed,
    /// for the live state (`live::follow` (collector)).
    async fn node_ticks(
        &self,
        node: &NodeRecord,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<Tick>, StoreError>;

    /// Many nodes' stored ticks at once: for each `(node, range)` of `wanted`, in order,
    /// what [`FleetReads::node_ticks`] answers for it. The follower asks this every period
    /// for all the nodes other collectors wrote; it takes five queries whatever the number
    /// of nodes.
    async fn nodes_ticks(
        &self,
        wanted: &[(&NodeRecord, TimeRange)],
        limit: usize,
    ) -> Result<Vec<Vec<Tick>>, StoreError>;
}

/// Agent, viewer and admin tokens.
#[async_trait]
pub trait TokenStore: Send + Sync + std::fmt::Debug {
    /// Stores a new agent token (its id, node and secret hash).
    async fn add_agent_token(&self, token: &AgentTokenRecord) -> Result<(), StoreError>;

    /// Every agent token, revoked ones included, oldest first.
    async fn agent_tokens(&self) -> Result<Vec<AgentTokenRecord>, StoreError>;

    /// The agent token with this id, if any.
    async fn agent_token(&self, id: &str) -> Result<Option<AgentTokenRecord>, StoreError>;

    /// Marks a token revoked at `now_ms`. Returns false when no valid token has this id.
    async fn revoke_agent_token(&self, id: &str, now_ms: UnixMs) -> Result<bool, StoreError>;
}

/// `INSERT INTO table (columns) VALUES ($1, ...) ON CONFLICT (key) DO UPDATE SET` every
/// column but the key and `keep` to the new value, then `tail`.
fn upsert(table: &str, columns: &str, key: &str, keep: &[&str], tail: &str) -> String {
    let columns: Vec<&str> = columns.split(", ").collect();
    let params: Vec<String> = (1..=columns.len()).map(|i| format!("${i}")).collect();
    let set: Vec<String> = columns
        .iter()
        .filter(|c| **c != key && !keep.contains(c))
        .map(|c| format!("{c} = excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO {table} ({}) VALUES ({}) ON CONFLICT ({key}) DO UPDATE SET {} {tail}",
        columns.join(", "),
        params.join(", "),
        set.join(", ")
    )
}

/// A node's registration: everything but its first sighting follows the latest Hello.
static NODE_UPSERT: LazyLock<String> = LazyLock::new(|| {
    let columns = "name, labels, agent_version, boot_id, source, interval_ms, first_seen_ms, \
        last_hello_ms, driver_version, cuda_driver_version, nvml_version, hostname, kernel, os, \
        cpu_count, memory_total_bytes";
    upsert("nodes", columns, "name", &["first_seen_ms"], "RETURNING id")
});

/// A GPU's registration: its inventory follows the latest Hello of the node that owns it
/// (a GPU another node owns is left alone; the caller then refuses the registration).
static GPU_UPSERT: LazyLock<String> = LazyLock::new(|| {
    let columns = "node_id, uuid, gpu_index, name, serial, pci_bus_id, architecture, brand, \
        memory_total_bytes, power_limit_default_mw, power_limit_enforced_mw, power_limit_min_mw, \
        power_limit_max_mw, max_clock_sm_mhz, max_clock_mem_mhz, max_clock_graphics_mhz, \
        nvlink_count, mig_enabled, compute_mode, persistence_mode, cuda_capability_major, \
        cuda_capability_minor, pcie_link_gen_max, pcie_link_width_max, vbios_version, \
        mig_instances, first_seen_ms, temp_slowdown_c, temp_shutdown_c, temp_gpu_max_c, \
        temp_mem_max_c";
    let keep = ["node_id", "first_seen_ms"];
    upsert(
        "gpus",
        columns,
        "uuid",
        &keep,
        "WHERE gpus.node_id = excluded.node_id",
    )
});

impl<DB: Backend> SqlStore<DB> {
    async fn load_node(conn: &mut DB::Connection, id: NodeId) -> Result<NodeRecord, StoreError> {
        let row = sql::<DB>("read a node", "SELECT * FROM nodes WHERE id = $1")
            .bind(id.0)
            .one(&mut *conn)
            .await?;
        let gpus = sql::<DB>(
            "read a node's GPUs",
            "SELECT * FROM gpus WHERE node_id = $1 ORDER BY gpu_index, uuid",
        )
        .bind(id.0)
        .all(&mut *conn)
        .await?;
        let mut node = rows::node(&row)?;
        node.gpus = gpus.iter().map(rows::gpu).collect::<Result<_, _>>()?;
        Ok(node)
    }
}

#[async_trait]
impl<DB: Backend> IngestWrites for SqlStore<DB> {
    async fn register_node(
        &self,
        hello: &HelloInfo,
        inventory: &Inventory,
        now_ms: UnixMs,
    ) -> Result<NodeRecord, StoreError> {
        let labels = serde_json::to_string(&hello.labels)
            .map_err(|e| StoreError::Corrupt(format!("labels do not serialize: {e}")))?;
        let host = &inventory.host;
        let mut tx = self.begin_write("begin a transaction").await?;
        let row = sql::<DB>("upsert a node", NODE_UPSERT.as_str())
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
            .one(tx.conn())
            .await?;
        let node_id: i64 = row.get("id")?;
        let mut gpus: Vec<&GpuInfo> = inventory.gpus.iter().collect();
        if DB::DIALECT == Dialect::Postgres {
            // In UUID order, so that two registrations moving the same GPUs cannot
            // deadlock (SQLite has one writer at a time).
            gpus.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        }
        for g in gpus {
            let mig = serde_json::to_string(&g.mig_instances)
                .map_err(|e| StoreError::Corrupt(format!("MIG instances do not serialize: {e}")))?;
            let u = |v: Option<u32>| v.map(i64::from);
            sql::<DB>("upsert a GPU", GPU_UPSERT.as_str())
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
                .bind(u(g.temp_slowdown_c))
                .bind(u(g.temp_shutdown_c))
                .bind(u(g.temp_gpu_max_c))
                .bind(u(g.temp_mem_max_c))
                .execute(tx.conn())
                .await?;
            let owner = sql::<DB>(
                "check a GPU's owner",
                "SELECT n.name FROM gpus g JOIN nodes n ON n.id = g.node_id \
                 WHERE g.uuid = $1 AND g.node_id <> $2",
            )
            .bind(g.uuid.as_str())
            .bind(node_id)
            .optional(tx.conn())
            .await?;
            if let Some(owner) = owner {
                // Dropping the transaction rolls the node's registration back.
                return Err(StoreError::GpuOwned {
                    uuid: g.uuid.clone(),
                    owner: owner.get("name")?,
                });
            }
        }
        let node = Self::load_node(tx.conn(), NodeId(node_id)).await?;
        tx.commit("commit a node registration").await?;
        Ok(node)
    }

    async fn write_batches(&self, batches: &[NodeBatch]) -> Result<WriteOutcome, StoreError> {
        if batches.is_empty() {
            return Ok(WriteOutcome::default());
        }
        DB::write_batches(self, batches).await
    }

    fn concurrent_writes(&self) -> bool {
        DB::SHARED
    }

    fn set_arrival_clock(&self, clock: Option<super::ArrivalClock>) {
        *(self.arrival_clock.0.lock()).unwrap_or_else(PoisonError::into_inner) = clock;
    }

    async fn rehome_gpu(&self, uuid: &str, to: &str) -> Result<Rehomed, StoreError> {
        let mut tx = self.begin_write("begin a transaction").await?;
        let to_id = sql::<DB>("find a node", "SELECT id FROM nodes WHERE name = $1")
            .bind(to)
            .optional(tx.conn())
            .await?;
        let Some(to_id) = to_id else {
            return Ok(Rehomed::UnknownNode);
        };
        let to_id: i64 = to_id.get("id")?;
        let lock = match DB::DIALECT {
            Dialect::Postgres => " FOR UPDATE OF g",
            Dialect::Sqlite => "",
        };
        let from = sql::<DB>(
            "find a GPU's node",
            format!(
                "SELECT g.node_id, n.name FROM gpus g JOIN nodes n ON n.id = g.node_id \
                 WHERE g.uuid = $1{lock}"
            ),
        )
        .bind(uuid)
        .optional(tx.conn())
        .await?;
        let Some(from) = from else {
            return Ok(Rehomed::UnknownGpu);
        };
        let (from_id, from): (i64, String) = (from.get("node_id")?, from.get("name")?);
        if from_id == to_id {
            return Ok(Rehomed::Unchanged);
        }
        sql::<DB>(
            "re-home a GPU",
            "UPDATE gpus SET node_id = $1 WHERE uuid = $2",
        )
        .bind(to_id)
        .bind(uuid)
        .execute(tx.conn())
        .await?;
        tx.commit("commit a GPU's move").await?;
        Ok(Rehomed::Moved { from })
    }
}

/// A series value as an integer holding the u64 bit pattern, from the column's storage
/// type: SQLite keeps the value itself; PostgreSQL keeps u32s as the bits of an `int4`
/// and small numbers in `int2` (see the schemas).
fn metric_expr(dialect: Dialect, metric: GpuMetric) -> String {
    use GpuMetric::*;
    let column = metric.name();
    if dialect == Dialect::Sqlite {
        return column.to_owned();
    }
    match metric {
        UtilGpuPct | UtilMemPct | FanPct | Pstate | EncUtilPct | DecUtilPct => {
            format!("{column}::int8")
        }
        PowerMw | PowerInstantMw | PowerLimitMw | TempGpuC | TempMemC | ClockSmMhz
        | ClockMemMhz | ClockGraphicsMhz => format!("({column}::int8 & 4294967295)"),
        _ => column.to_owned(),
    }
}

/// GPU `gpu`'s processes at `time_ms`, rows and packed ticks merged.
async fn processes_at<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: i64,
    time_ms: UnixMs,
) -> Result<Vec<ProcessSample>, StoreError> {
    let at = TimeRange {
        from_ms: time_ms,
        to_ms: time_ms,
    };
    let ticks = super::packing::process_rows::<DB>(conn, GpuId(gpu), at, usize::MAX).await?;
    Ok(ticks.into_iter().map(|(_, p)| p).collect())
}

/// [`FleetReads::gpu_series`] over a range of rows only: in SQL.
async fn row_series<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    metric: GpuMetric,
    range: TimeRange,
    step_ms: Option<i64>,
    limit: usize,
) -> Result<Vec<SeriesPoint>, StoreError> {
    // The expression is built from the metric's fixed name, never user input.
    let value = metric_expr(DB::DIALECT, metric);
    let query = match step_ms {
        None => sql::<DB>(
            "read a series",
            format!(
                "SELECT ts_ms AS t, {value} AS v FROM gpu_samples \
                 WHERE gpu_id = $1 AND ts_ms BETWEEN $2 AND $3 ORDER BY ts_ms LIMIT $4"
            ),
        ),
        Some(_) => sql::<DB>(
            "read a downsampled series",
            format!(
                "SELECT (ts_ms / $5) * $5 AS t, CAST(avg({value}) AS DOUBLE PRECISION) AS v \
                 FROM gpu_samples WHERE gpu_id = $1 AND ts_ms BETWEEN $2 AND $3 \
                 GROUP BY 1 ORDER BY 1 LIMIT $4"
            ),
        ),
    };
    let mut query = query
        .bind(gpu.0)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(limit));
    if let Some(step) = step_ms {
        query = query.bind(step.max(1));
    }
    let rows = query.all(conn).await?;
    rows.iter()
        .map(|row| {
            let t: i64 = row.get("t")?;
            let v = if step_ms.is_some() {
                row.get::<Option<f64>>("v")?
            } else {
                // Stored integers are u64 bit patterns (see the schema).
                row.get::<Option<i64>>("v")?.map(|v| v as u64 as f64)
            };
            Ok((t, v))
        })
        .collect()
}

/// [`FleetReads::gpu_series`] over a range with packed minutes: the raw samples merged
/// ([`super::packing::gpu_rows`]), or per bucket the sum and count of the rows' values (in
/// SQL) and of the packed samples' (unpacked minute by minute), averaged.
async fn packed_series<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
    metric: GpuMetric,
    range: TimeRange,
    step_ms: Option<i64>,
    limit: usize,
) -> Result<Vec<SeriesPoint>, StoreError> {
    let Some(step) = step_ms.map(|s| s.max(1)) else {
        let samples = super::packing::gpu_rows::<DB>(conn, gpu, range, limit).await?;
        return Ok((samples.iter())
            .map(|(t, s)| (*t, metric.value(s).map(|v| v as f64)))
            .collect());
    };
    let value = metric_expr(DB::DIALECT, metric);
    let rows = sql::<DB>(
        "read a downsampled series's sums",
        format!(
            "SELECT (ts_ms / $4) * $4 AS t, CAST(sum({value}) AS DOUBLE PRECISION) AS s, \
             count({value}) AS n FROM gpu_samples \
             WHERE gpu_id = $1 AND ts_ms BETWEEN $2 AND $3 GROUP BY 1"
        ),
    )
    .bind(gpu.0)
    .bind(range.from_ms)
    .bind(range.to_ms)
    .bind(step)
    .all(&mut *conn)
    .await?;
    let mut buckets: BTreeMap<UnixMs, (f64, i64)> = BTreeMap::new();
    for row in &rows {
        let sum: Option<f64> = row.get("s")?;
        buckets.insert(row.get("t")?, (sum.unwrap_or(0.0), row.get("n")?));
    }
    super::packing::each_packed_gpu_sample::<DB>(conn, gpu, range, |t, s| {
        let b = buckets.entry((t / step) * step).or_default();
        if let Some(v) = metric.value(s) {
            b.0 += v as f64;
            b.1 += 1;
        }
    })
    .await?;
    Ok((buckets.into_iter().take(limit))
        .map(|(t, (sum, n))| (t, (n > 0).then(|| sum / n as f64)))
        .collect())
}

#[async_trait]
impl<DB: Backend> FleetReads for SqlStore<DB> {
    async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let rows = sql::<DB>("list nodes", "SELECT * FROM nodes ORDER BY name")
            .all(&mut conn)
            .await?;
        let gpu_rows = sql::<DB>(
            "list GPUs",
            "SELECT * FROM gpus ORDER BY node_id, gpu_index, uuid",
        )
        .all(&mut conn)
        .await?;
        let mut gpus: HashMap<i64, Vec<GpuRecord>> = HashMap::new();
        for row in &gpu_rows {
            gpus.entry(row.get("node_id")?)
                .or_default()
                .push(rows::gpu(row)?);
        }
        rows.iter()
            .map(|row| {
                let mut node = rows::node(row)?;
                node.gpus = gpus.remove(&node.id.0).unwrap_or_default();
                Ok(node)
            })
            .collect()
    }

    async fn latest_gpu_samples(&self) -> Result<Vec<LatestGpu>, StoreError> {
        let mut conn = self.conn().await?;
        let newest = "(SELECT max(m.ts_ms) FROM gpu_samples m WHERE m.gpu_id = g.id)";
        let samples = sql::<DB>(
            "read the newest GPU samples",
            format!(
                "SELECT g.id AS gpu_id, {GPU_COLS} FROM gpus g \
                 JOIN gpu_samples s ON s.gpu_id = g.id AND s.ts_ms = {newest}"
            ),
        )
        .all(&mut conn)
        .await?;
        let processes = sql::<DB>(
            "read the newest process samples",
            format!(
                "SELECT g.id AS gpu_id, {} FROM gpus g \
                 JOIN process_samples p ON p.gpu_id = g.id AND p.ts_ms = {newest} \
                 {PROCESS_JOINS} ORDER BY p.gpu_id, p.pid",
                process_cols()
            ),
        )
        .all(&mut conn)
        .await?;
        let mut by_gpu: HashMap<i64, Vec<ProcessSample>> = HashMap::new();
        for row in &processes {
            by_gpu
                .entry(row.get("gpu_id")?)
                .or_default()
                .push(rows::process(row)?);
        }
        // A closed minute's process ticks may have been packed as they arrived (a
        // replay): those of such a newest sample come from its packed value.
        let packed = sql::<DB>(
            "find the newest GPU samples whose process ticks are packed",
            format!(
                "SELECT g.id AS gpu_id, s.ts_ms FROM gpus g \
                 JOIN gpu_samples s ON s.gpu_id = g.id AND s.ts_ms = {newest} \
                 WHERE EXISTS (SELECT 1 FROM packed_process_minutes p WHERE p.gpu_id = g.id \
                   AND p.minute_ms IN ((s.ts_ms / {MINUTE_MS}) * {MINUTE_MS}, \
                     (s.ts_ms / {HOUR_MS}) * {HOUR_MS}) \
                   AND p.minute_ms + p.span_ms > s.ts_ms)"
            ),
        )
        .all(&mut conn)
        .await?;
        for row in &packed {
            let (gpu, ts): (i64, UnixMs) = (row.get("gpu_id")?, row.get("ts_ms")?);
            by_gpu.insert(gpu, processes_at::<DB>(&mut conn, gpu, ts).await?);
        }
        let mut latest: BTreeMap<i64, LatestGpu> = BTreeMap::new();
        for row in &samples {
            let gpu: i64 = row.get("gpu_id")?;
            let sample = LatestGpu {
                gpu: GpuId(gpu),
                time_ms: row.get("ts_ms")?,
                sample: rows::gpu_sample(row)?,
                processes: by_gpu.remove(&gpu).unwrap_or_default(),
            };
            latest.insert(gpu, sample);
        }
        // A GPU's newest samples may have been packed as they arrived (a node catching
        // up): its newest packed value's last sample, where newer than its rows'.
        for (gpu, time_ms, sample) in
            super::packing::newest_packed_gpu_samples::<DB>(&mut conn).await?
        {
            if latest.get(&gpu).is_some_and(|l| l.time_ms >= time_ms) {
                continue;
            }
            let processes = processes_at::<DB>(&mut conn, gpu, time_ms).await?;
            latest.insert(
                gpu,
                LatestGpu {
                    gpu: GpuId(gpu),
                    time_ms,
                    sample,
                    processes,
                },
            );
        }
        Ok(latest.into_values().collect())
    }

    async fn latest_host_samples(&self) -> Result<Vec<LatestHost>, StoreError> {
        let query = sql::<DB>(
            "read the newest host samples",
            "SELECT h.* FROM nodes n JOIN host_samples h ON h.node_id = n.id \
               AND h.ts_ms = (SELECT max(m.ts_ms) FROM host_samples m WHERE m.node_id = n.id)",
        );
        self.fetch(query, |row| {
            let h = rows::host(row)?;
            Ok(LatestHost {
                node: NodeId(row.get("node_id")?),
                time_ms: h.time_ms,
                sample: h.sample,
                cost: h.cost,
            })
        })
        .await
    }

    async fn latest_gpu_health(&self) -> Result<Vec<LatestHealth>, StoreError> {
        let query = sql::<DB>(
            "read the newest GPU health samples",
            format!(
                "SELECT g.id AS gpu_id, {HEALTH_COLS} FROM gpus g \
                 JOIN gpu_health h ON h.gpu_id = g.id \
                   AND h.ts_ms = (SELECT max(m.ts_ms) FROM gpu_health m WHERE m.gpu_id = g.id)"
            ),
        );
        self.fetch(query, |row| {
            Ok(LatestHealth {
                gpu: GpuId(row.get("gpu_id")?),
                time_ms: row.get("ts_ms")?,
                sample: rows::health(row)?,
            })
        })
        .await
    }

    async fn gpu_health(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, GpuHealthSample)>, StoreError> {
        let mut tx = self.read_snapshot("read GPU health samples").await?;
        let rows = super::health_hours::readings::<DB>(&mut tx, gpu, range, limit).await?;
        super::end_read(tx, "read GPU health samples").await?;
        Ok(rows)
    }

    async fn gpu_samples(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, GpuSample)>, StoreError> {
        let mut tx = self.read_snapshot("read GPU samples").await?;
        let rows = super::packing::gpu_rows::<DB>(&mut tx, gpu, range, limit).await?;
        super::end_read(tx, "read GPU samples").await?;
        Ok(rows)
    }

    async fn process_samples(
        &self,
        gpu: GpuId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<(UnixMs, ProcessSample)>, StoreError> {
        let mut tx = self.read_snapshot("read process samples").await?;
        let rows = super::packing::process_rows::<DB>(&mut tx, gpu, range, limit).await?;
        super::end_read(tx, "read process samples").await?;
        Ok(rows)
    }

    async fn host_samples(
        &self,
        node: NodeId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<HostRow>, StoreError> {
        let mut tx = self.read_snapshot("read host samples").await?;
        let rows = super::packing::host_rows::<DB>(&mut tx, node, range, limit).await?;
        super::end_read(tx, "read host samples").await?;
        Ok(rows)
    }

    async fn events(
        &self,
        node: NodeId,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let query = sql::<DB>(
            "read events",
            format!(
                "SELECT {EVENT_COLS} FROM events e LEFT JOIN gpus g ON g.id = e.gpu_id \
                 WHERE e.node_id = $1 AND e.ts_ms BETWEEN $2 AND $3 \
                 ORDER BY e.ts_ms, e.id LIMIT $4"
            ),
        )
        .bind(node.0)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(limit));
        self.fetch(query, rows::event).await
    }

    async fn gpu_series(
        &self,
        gpu: GpuId,
        metric: GpuMetric,
        range: TimeRange,
        step_ms: Option<i64>,
        limit: usize,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        // One snapshot: a minute packed between the two reads must not be missed.
        let mut tx = self.read_snapshot("read a series").await?;
        let points = if super::packing::gpu_packed_in::<DB>(&mut tx, gpu, range).await? {
            packed_series::<DB>(&mut tx, gpu, metric, range, step_ms, limit).await?
        } else {
            row_series::<DB>(&mut tx, gpu, metric, range, step_ms, limit).await?
        };
        super::end_read(tx, "read a series").await?;
        Ok(points)
    }

    async fn node_ticks(
        &self,
        node: &NodeRecord,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<Tick>, StoreError> {
        // The follower's five queries (a collector sharing the database asks often); they
        // read rows only, so not over packed minutes. One snapshot: a minute packed between
        // the look and the read would lose its rows from the answer.
        if DB::SHARED {
            let op = "read a node's ticks";
            let mut tx = self.read_snapshot(op).await?;
            if !super::packing::any_packed::<DB>(&mut tx, node, range).await? {
                let mut ticks = follow::nodes_ticks::<DB>(&mut tx, &[(node, range)], limit).await?;
                super::end_read(tx, op).await?;
                return Ok(ticks.pop().unwrap_or_default());
            }
            super::end_read(tx, op).await?;
        }
        let mut gpus = Vec::new();
        for g in &node.gpus {
            gpus.push(self.gpu_samples(g.id, range, limit).await?);
        }
        // Then the other rows of only the ticks whose GPU rows were kept: a GPU read that
        // stopped at `limit` ends the range at its last row. Health (and events) are
        // sparser than GPU rows, so their first `limit` reach past it, and ticks holding
        // only those would push real ticks out of the newest `limit`.
        let to_ms = gpus
            .iter()
            .filter(|rows| rows.len() >= limit)
            .filter_map(|rows| rows.last().map(|(t, _)| *t))
            .fold(range.to_ms, i64::min);
        let kept = TimeRange { to_ms, ..range };
        let mut processes = Vec::new();
        let mut health = Vec::new();
        for g in &node.gpus {
            health.extend(self.gpu_health(g.id, kept, limit).await?);
            // Processes per GPU per tick are few; the range is what bounds the read.
            processes.extend(
                self.process_samples(g.id, kept, limit.saturating_mul(256))
                    .await?,
            );
        }
        let gpus = gpus.into_iter().flatten().collect();
        let hosts = self.host_samples(node.id, kept, limit).await?;
        let events = self.events(node.id, kept, limit).await?;
        Ok(assemble_ticks(
            gpus, processes, hosts, events, health, limit,
        ))
    }

    async fn nodes_ticks(
        &self,
        wanted: &[(&NodeRecord, TimeRange)],
        limit: usize,
    ) -> Result<Vec<Vec<Tick>>, StoreError> {
        // A follower asks on every pass, mostly for nothing: no connection for that.
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn().await?;
        let mut ticks = follow::nodes_ticks::<DB>(&mut conn, wanted, limit).await?;
        // A node catching up may have samples and process ticks packed as they arrived
        // (in minutes closed to writes): if it does, it is read again, both forms merged.
        // Live nodes' ticks and ranges are in open minutes, so a live fleet costs no query
        // more.
        let closed_before = self.closed_before();
        let closed = |t: UnixMs| minute_of(t).saturating_add(MINUTE_MS) <= closed_before;
        let catching_up: Vec<usize> = (ticks.iter().enumerate())
            .filter(|(i, t)| {
                wanted.get(*i).is_some_and(|(_, r)| closed(r.from_ms))
                    || t.iter().any(|t| closed(t.time_ms))
            })
            .map(|(i, _)| i)
            .collect();
        if catching_up.is_empty() {
            return Ok(ticks);
        }
        let asked: Vec<(&NodeRecord, TimeRange)> = catching_up.iter().map(|&i| wanted[i]).collect();
        let packed = follow::with_packed_ticks::<DB>(&mut conn, &asked).await?;
        drop(conn);
        for i in packed
            .into_iter()
            .filter_map(|k| catching_up.get(k).copied())
        {
            let (node, range) = wanted[i];
            if let Some(t) = ticks.get_mut(i) {
                *t = self.node_ticks(node, range, limit).await?;
            }
        }
        Ok(ticks)
    }
}

const TOKEN_COLS: &str = "id, node, role, secret_hash, created_ms, revoked_ms";

#[async_trait]
impl<DB: Backend> TokenStore for SqlStore<DB> {
    async fn add_agent_token(&self, token: &AgentTokenRecord) -> Result<(), StoreError> {
        let query = sql::<DB>(
            "store an agent token",
            format!("INSERT INTO agent_tokens ({TOKEN_COLS}) VALUES ($1, $2, $3, $4, $5, $6)"),
        )
        .bind(token.id.as_str())
        .bind(token.node.as_str())
        .bind(token.role.as_str())
        .bind(&token.secret_hash)
        .bind(token.created_ms)
        .bind(token.revoked_ms);
        self.write_one(query).await?;
        Ok(())
    }

    async fn agent_tokens(&self) -> Result<Vec<AgentTokenRecord>, StoreError> {
        let query = sql::<DB>(
            "list agent tokens",
            format!("SELECT {TOKEN_COLS} FROM agent_tokens ORDER BY created_ms, id"),
        );
        self.fetch(query, rows::token).await
    }

    async fn agent_token(&self, id: &str) -> Result<Option<AgentTokenRecord>, StoreError> {
        let row = sql::<DB>(
            "look up an agent token",
            format!("SELECT {TOKEN_COLS} FROM agent_tokens WHERE id = $1"),
        )
        .bind(id)
        .optional(&mut *self.conn().await?)
        .await?;
        row.as_ref().map(rows::token).transpose()
    }

    async fn revoke_agent_token(&self, id: &str, now_ms: UnixMs) -> Result<bool, StoreError> {
        let query = sql::<DB>(
            "revoke an agent token",
            "UPDATE agent_tokens SET revoked_ms = $1 WHERE id = $2 AND revoked_ms IS NULL",
        )
        .bind(now_ms)
        .bind(id);
        let n = self.write_one(query).await?;
        Ok(n > 0)
    }
}
