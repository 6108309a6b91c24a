//! Energy accounting in the store: what the accountant reads and writes
//! ([`EnergyStore`]), the shapes crossing the boundary, and their SQL, once for both
//! backends. The computing is in `accounting::energy` (collector) (pure) and `accounting::accountant` (collector).

use super::backend::{Backend, Dialect, Get, GetExt, Table, insert_rows, sql};
use super::rows::{self, WORKLOAD_COLS, limit_i64};
use super::{GpuId, NodeId, SqlStore, StoreError, TimeRange};
pub mod records;

use async_trait::async_trait;
use gpufleet_core::{GpuSample, UnixMs, Workload};
use records::{EnergyProcess, EnergySample, GpuMinute, IdlePolicy, IdleSource, WorkloadMinute};
use std::collections::BTreeMap;

/// A GPU as the accountant sees it: where it is, what it is, how far it is accounted.
#[derive(Debug, Clone, PartialEq)]
pub struct EnergyGpu {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    /// The GPU model (`NVIDIA H100 80GB HBM3`), for per-model idle watts.
    pub name: String,
    pub node: NodeId,
    pub node_name: String,
    /// The node's sampling interval (0: unknown).
    pub interval_ms: u32,
    /// The GPU's default power limit (else its enforced one), for the fallback baseline.
    pub power_limit_mw: Option<u32>,
    /// Oldest and newest stored sample; `None` without samples.
    pub first_sample_ms: Option<UnixMs>,
    pub last_sample_ms: Option<UnixMs>,
    /// Every minute before this has been accounted; `None`: nothing yet.
    pub done_to_ms: Option<UnixMs>,
}

/// The raw inputs of a range `[from, to)` of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnergyInputs {
    /// The newest sample before `from` (its processes are not loaded: an interval is
    /// attributed by the processes at its end).
    pub prev: Option<EnergySample>,
    /// The samples in the range, oldest first, each with its processes.
    pub samples: Vec<EnergySample>,
}

/// A GPU and a range `[from_ms, to_ms)` of it, for the batched reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnergyRange {
    pub gpu: GpuId,
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
}

/// What [`super::EnergyStore::replace_energy_minutes`] takes, for
/// one GPU of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteReplacement {
    pub range: EnergyRange,
    pub minutes: Vec<GpuMinute>,
    pub done_to_ms: Option<UnixMs>,
}

/// One workload's energy on one GPU over a range (sums of its minutes).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadEnergy {
    pub workload: Workload,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_name: String,
    pub node_name: String,
    /// Charged to it (active, plus idle under `spread`).
    pub energy_mj: u64,
    pub active_mj: u64,
    /// Its idle share by memory held (charged only under `spread`).
    pub idle_mj: u64,
    /// Of `energy_mj`, the part in minutes still open.
    pub provisional_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    pub gpu_ms: i64,
    pub share_ppm_ms: u64,
    pub sm_ms: i64,
    pub memory_ms: i64,
    pub equal_ms: i64,
    pub idle_memory_ms: i64,
    pub idle_equal_ms: i64,
    /// Its GPM estimate (see [`WorkloadMinute::tensor_cpct_ms`]).
    pub tensor_ms: i64,
    pub tensor_cpct_ms: u64,
    pub occupancy_ms: i64,
    pub occupancy_cpct_ms: u64,
    pub first_minute_ms: UnixMs,
    pub last_minute_ms: UnixMs,
}

/// One GPU's energy over a range (sums of its minutes).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuEnergy {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub node_name: String,
    pub energy_mj: u64,
    pub counter_mj: u64,
    pub trapezoid_mj: u64,
    pub attributed_mj: u64,
    /// The idle bucket (charged to no workload).
    pub idle_mj: u64,
    pub unattributed_mj: u64,
    /// The active part of `energy_mj`; the rest is idle.
    pub active_mj: u64,
    /// Of `energy_mj`, the part in minutes still open.
    pub provisional_mj: u64,
    pub covered_ms: i64,
    pub missing_ms: i64,
}

/// A GPU's idle baseline as its newest energy minute used it, with its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuBaseline {
    pub gpu: GpuId,
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub node_name: String,
    pub idle_mw: u32,
    pub idle_source: IdleSource,
    /// The minute it was used for.
    pub minute_ms: UnixMs,
    /// The evidence its newest minute carries: the most recent seen-idle time (up to an
    /// hour) and its energy.
    pub seen_idle_mj: u64,
    pub seen_idle_ms: i64,
}

/// One minute of one workload (all its GPUs).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadEnergyPoint {
    pub minute_ms: UnixMs,
    pub energy_mj: u64,
    pub active_mj: u64,
    pub idle_mj: u64,
    pub provisional_mj: u64,
    pub gpu_ms: i64,
    pub share_ppm_ms: u64,
}

/// What [`EnergyStore::energy_buckets`] reads: the energy minutes of a range summed per
/// bucket (the minutes whose `minute_ms / bucket_ms` is the same), per workload and per
/// node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnergyBuckets {
    /// Charged to a workload in a bucket, on every GPU it used (its active share, plus
    /// idle under `spread`): what [`EnergyStore::workload_energy`] sums over the range.
    pub workloads: Vec<WorkloadBucket>,
    /// A node's GPUs in a bucket: what [`EnergyStore::gpu_energy`] sums over the range.
    pub nodes: Vec<NodeBucket>,
}

/// One workload's energy in one bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadBucket {
    /// The bucket's start: `minute_ms` rounded down to a multiple of the bucket length.
    pub bucket_ms: UnixMs,
    pub workload: Workload,
    pub energy_mj: u64,
}

/// One node's GPUs in one bucket: their energy, and of it the idle bucket (idle energy
/// charged to no workload) and the unattributed activity (no process listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBucket {
    pub bucket_ms: UnixMs,
    pub node_name: String,
    pub energy_mj: u64,
    pub idle_mj: u64,
    pub unattributed_mj: u64,
}

/// One workload's minute on a GPU whose utilization stayed at or below a threshold, with
/// what waste detection (`accounting::waste` (collector)) judges and sums.
#[derive(Debug, Clone, PartialEq)]
pub struct WasteMinute {
    pub gpu: GpuId,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    pub gpu_name: String,
    pub node_name: String,
    pub workload: Workload,
    pub minute_ms: UnixMs,
    /// The GPU's highest utilization in the minute (`None`: not known for every interval).
    pub util_max_pct: Option<u32>,
    /// The GPU's measured and missing time in the minute.
    pub covered_ms: i64,
    pub missing_ms: i64,
    /// The workload's time resident on the GPU in measured intervals.
    pub gpu_ms: i64,
    /// The most GPU memory it held at one sample of the minute.
    pub mem_max_bytes: Option<u64>,
    /// Charged to it (active, plus idle under `spread`).
    pub energy_mj: u64,
    pub active_mj: u64,
    /// Its idle share, by memory held or equally when memory is unknown (charged only
    /// under `spread`).
    pub idle_mj: u64,
    pub provisional: bool,
    /// The GPU-minute's price (g/kWh, PUE), when priced.
    pub price: Option<(f64, f64)>,
    /// The GPU's newest energy minute (is the episode still going on?).
    pub gpu_last_minute_ms: UnixMs,
    /// The gap limit the minute was computed with (the accountant's grace).
    pub max_gap_ms: i64,
}

/// Which GPUs' minutes [`EnergyStore::waste_minutes`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WasteScope<'a> {
    /// Every GPU (by the minute index).
    Fleet,
    /// One node's GPUs (by their (gpu_id, minute_ms) key).
    Node(&'a str),
    /// One workload on one GPU (`Workload::key()`).
    Series(GpuId, &'a str),
}

/// The per-minute test of waste detection as SQL over `e` (the GPU minute) and `m` (the
/// workload minute); the threshold is `$3`.
const IDLE_ALLOCATED_SQL: &str = "e.util_max_pct <= $3 AND e.missing_ms = 0 \
     AND e.covered_ms > 0 AND m.gpu_ms = e.covered_ms \
     AND (m.mem_max_bytes IS NULL OR m.mem_max_bytes <> 0)";

/// GPU-minute rows (`SELECT *` of `energy_gpu_minutes`) with their workload rows, each
/// ordered by GPU and minute. Workload rows without their GPU row come back under a GPU
/// row that has nothing, so conservation fails visibly.
pub(super) fn minutes_from_rows<R: Get>(
    rows: &[R],
    wrows: &[R],
) -> Result<Vec<(GpuId, GpuMinute)>, StoreError> {
    let mut workloads: BTreeMap<(i64, i64), Vec<WorkloadMinute>> = BTreeMap::new();
    for row in wrows {
        workloads
            .entry((row.get::<i64>("gpu_id")?, row.get::<i64>("minute_ms")?))
            .or_default()
            .push(WorkloadMinute {
                workload: row.get::<i64>("workload_id")?,
                energy_mj: row.nonneg("energy_mj")?,
                active_mj: row.nonneg("active_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                counter_mj: row.nonneg("counter_mj")?,
                trapezoid_mj: row.nonneg("trapezoid_mj")?,
                gpu_ms: row.get::<i64>("gpu_ms")?,
                share_ppm_ms: row.nonneg("share_ppm_ms")?,
                sm_ms: row.get::<i64>("sm_ms")?,
                memory_ms: row.get::<i64>("memory_ms")?,
                equal_ms: row.get::<i64>("equal_ms")?,
                idle_memory_ms: row.get::<i64>("idle_memory_ms")?,
                idle_equal_ms: row.get::<i64>("idle_equal_ms")?,
                mem_max_bytes: row.u64_bits("mem_max_bytes")?,
                tensor_ms: row.get::<i64>("tensor_ms")?,
                tensor_cpct_ms: row.nonneg("tensor_cpct_ms")?,
                occupancy_ms: row.get::<i64>("occupancy_ms")?,
                occupancy_cpct_ms: row.nonneg("occupancy_cpct_ms")?,
            });
    }
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let gpu_id = row.get::<i64>("gpu_id")?;
        let minute_ms = row.get::<i64>("minute_ms")?;
        let policy = row.get::<String>("idle_policy")?;
        let source = row.get::<String>("idle_source")?;
        let samples = row.get::<i64>("samples")?;
        let idle_mw = row.get::<i64>("idle_mw")?;
        out.push((
            GpuId(gpu_id),
            GpuMinute {
                minute_ms,
                energy_mj: row.nonneg("energy_mj")?,
                counter_mj: row.nonneg("counter_mj")?,
                trapezoid_mj: row.nonneg("trapezoid_mj")?,
                attributed_mj: row.nonneg("attributed_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                unattributed_mj: row.nonneg("unattributed_mj")?,
                active_mj: row.nonneg("active_mj")?,
                seen_idle_ms: row.get::<i64>("seen_idle_ms")?,
                seen_idle_mj: row.nonneg("seen_idle_mj")?,
                learned_idle_ms: row.get::<i64>("learned_idle_ms")?,
                learned_idle_mj: row.nonneg("learned_idle_mj")?,
                provisional: row.flag("provisional")?,
                rules: u32::try_from(row.get::<i64>("rules")?)
                    .map_err(|_| StoreError::Corrupt("rules out of range".into()))?,
                covered_ms: row.get::<i64>("covered_ms")?,
                missing_ms: row.get::<i64>("missing_ms")?,
                samples: u32::try_from(samples)
                    .map_err(|_| StoreError::Corrupt(format!("samples {samples}")))?,
                util_max_pct: row.get("util_max_pct")?,
                min_power_mw: row
                    .get::<Option<i64>>("min_power_mw")?
                    .map(u32::try_from)
                    .transpose()
                    .map_err(|_| StoreError::Corrupt("min_power_mw out of range".into()))?,
                idle_mw: u32::try_from(idle_mw)
                    .map_err(|_| StoreError::Corrupt(format!("idle_mw {idle_mw}")))?,
                idle_policy: IdlePolicy::parse(&policy)
                    .ok_or_else(|| StoreError::Corrupt(format!("idle_policy {policy:?}")))?,
                idle_source: IdleSource::parse(&source)
                    .ok_or_else(|| StoreError::Corrupt(format!("idle_source {source:?}")))?,
                max_gap_ms: row.get::<i64>("max_gap_ms")?,
                workloads: workloads.remove(&(gpu_id, minute_ms)).unwrap_or_default(),
            },
        ));
    }
    for ((gpu_id, minute_ms), ws) in workloads {
        out.push((
            GpuId(gpu_id),
            GpuMinute {
                minute_ms,
                workloads: ws,
                ..Default::default()
            },
        ));
    }
    Ok(out)
}

/// What energy accounting reads and writes.
#[async_trait]
pub trait EnergyStore: Send + Sync + std::fmt::Debug {
    /// Every GPU with its node, model, sample span and accounting watermark.
    async fn energy_gpus(&self) -> Result<Vec<EnergyGpu>, StoreError>;

    /// A GPU's samples in `[from_ms, to_ms)` with their processes, and the sample before.
    async fn energy_inputs(
        &self,
        gpu: GpuId,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<EnergyInputs, StoreError>;

    /// [`EnergyStore::energy_inputs`] of many ranges (one per GPU) in a few queries,
    /// whatever their number: the accountant's per-pass reads at fleet scale. Answers in
    /// order.
    async fn energy_inputs_many(
        &self,
        ranges: &[EnergyRange],
    ) -> Result<Vec<EnergyInputs>, StoreError>;

    /// [`EnergyStore::energy_learned_before`] of many GPUs (each before its range's
    /// `from_ms`) in one query. Answers in order.
    async fn energy_learned_before_many(
        &self,
        ranges: &[EnergyRange],
    ) -> Result<Vec<(u64, i64)>, StoreError>;

    /// The time of a GPU's first sample at or after `at_ms`.
    async fn next_sample_ms(&self, gpu: GpuId, at_ms: UnixMs)
    -> Result<Option<UnixMs>, StoreError>;

    /// The idle-baseline evidence (mJ, ms) carried by a GPU's newest stored minute before
    /// `before_ms`; (0, 0) without one.
    async fn energy_learned_before(
        &self,
        gpu: GpuId,
        before_ms: UnixMs,
    ) -> Result<(u64, i64), StoreError>;

    /// Per GPU with energy minutes: the baseline of its newest minute, where it came
    /// from, and the evidence it carries.
    async fn energy_baselines(&self) -> Result<Vec<GpuBaseline>, StoreError>;

    /// In one transaction: replaces a GPU's minutes in `[from_ms, to_ms)` with `minutes`,
    /// and raises its watermark to `done_to_ms` (never lowers it).
    async fn replace_energy_minutes(
        &self,
        gpu: GpuId,
        from_ms: UnixMs,
        to_ms: UnixMs,
        minutes: &[GpuMinute],
        done_to_ms: Option<UnixMs>,
    ) -> Result<(), StoreError>;

    /// [`EnergyStore::replace_energy_minutes`] of many GPUs, all in one transaction.
    async fn replace_energy_minutes_many(
        &self,
        batch: &[MinuteReplacement],
    ) -> Result<(), StoreError>;

    /// Stored minutes (with their workload rows) in `range`, of one GPU or all.
    async fn energy_minutes(
        &self,
        gpu: Option<GpuId>,
        range: TimeRange,
    ) -> Result<Vec<(GpuId, GpuMinute)>, StoreError>;

    /// Minutes before the watermark whose stored sample count differs from the raw
    /// samples' (late or replayed data since they were computed), from `since_ms` on.
    async fn stale_energy_minutes(
        &self,
        since_ms: UnixMs,
    ) -> Result<Vec<(GpuId, UnixMs)>, StoreError>;

    /// Energy per (workload, GPU) over the minutes in `range`; optionally one node's
    /// GPUs, or one workload (by `Workload::key()`).
    async fn workload_energy(
        &self,
        range: TimeRange,
        node: Option<&str>,
        workload_key: Option<&str>,
    ) -> Result<Vec<WorkloadEnergy>, StoreError>;

    /// One workload's energy per minute (all GPUs) in `range`.
    async fn workload_energy_series(
        &self,
        workload_key: &str,
        range: TimeRange,
    ) -> Result<Vec<WorkloadEnergyPoint>, StoreError>;

    /// Energy per GPU over the minutes in `range` (GPUs with stored minutes only).
    async fn gpu_energy(&self, range: TimeRange) -> Result<Vec<GpuEnergy>, StoreError>;

    /// The minutes in `range` (as [`EnergyStore::workload_energy`] and
    /// [`EnergyStore::gpu_energy`] read them) summed per bucket of `bucket_ms` (a positive
    /// number of milliseconds; buckets start at its multiples): per workload, and per
    /// node. Both ordered by bucket, then workload key / node name.
    async fn energy_buckets(
        &self,
        range: TimeRange,
        bucket_ms: i64,
    ) -> Result<EnergyBuckets, StoreError>;

    /// The idle-allocated workload minutes in `range` of `scope`, ordered by GPU, workload
    /// and minute: those passing the whole per-minute test of waste detection
    /// (`accounting::waste::idle_allocated` (collector): utilization known and at most
    /// `util_threshold_pct`, nothing missing, something measured, held the whole measured
    /// time, never at 0 bytes). The test runs in SQL so busy minutes are never read.
    async fn waste_minutes(
        &self,
        range: TimeRange,
        scope: WasteScope<'_>,
        util_threshold_pct: u32,
    ) -> Result<Vec<WasteMinute>, StoreError>;

    /// The first minute of the run of idle-allocated minutes of `workload_key` on `gpu`
    /// that ends with the minute `last_ms` (`None` when `last_ms` is not one), looking no
    /// further back than `horizon_ms`: one indexed query on (gpu_id, minute_ms) that
    /// numbers the idle minutes from `last_ms` backwards (a window function).
    async fn waste_run_start(
        &self,
        gpu: GpuId,
        workload_key: &str,
        last_ms: UnixMs,
        horizon_ms: UnixMs,
        util_threshold_pct: u32,
    ) -> Result<Option<UnixMs>, StoreError>;
}

pub(super) fn u64_to_i64(v: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{what} {v} does not fit")))
}

fn sample_from_row<R: Get>(row: &R) -> Result<EnergySample, StoreError> {
    Ok(EnergySample {
        time_ms: row.get("ts_ms")?,
        power_mw: row.get("power_mw")?,
        energy_mj: row.u64_bits("energy_mj")?,
        util_gpu_pct: row.get("util_gpu_pct")?,
        tensor_cpct: row.get("gpm_tensor_active_cpct")?,
        occupancy_cpct: row.get("gpm_sm_occupancy_cpct")?,
        processes: Vec::new(),
    })
}

/// A packed GPU sample as energy accounting reads it.
fn energy_sample(time_ms: UnixMs, s: &GpuSample) -> EnergySample {
    EnergySample {
        time_ms,
        power_mw: s.power_mw,
        energy_mj: s.energy_mj,
        util_gpu_pct: s.util_gpu_pct,
        tensor_cpct: s.gpm.tensor_active_cpct,
        occupancy_cpct: s.gpm.sm_occupancy_cpct,
        processes: Vec::new(),
    }
}

/// Hangs process rows (ordered by time) on the GPU samples (ordered by time) they were
/// listed with.
fn attach_processes(
    samples: &mut [EnergySample],
    procs: impl IntoIterator<Item = (UnixMs, EnergyProcess)>,
) {
    // Both lists are ordered by time: merge.
    let mut i = 0;
    for (t, p) in procs {
        while i < samples.len() && samples[i].time_ms < t {
            i += 1;
        }
        // A process row without its GPU row cannot be attributed (no interval ends there).
        if i < samples.len() && samples[i].time_ms == t {
            samples[i].processes.push(p);
        }
    }
}

/// A process sample row as accounting reads it: `(time, pid, process)`.
fn energy_process<R: Get>(row: &R) -> Result<(UnixMs, u32, EnergyProcess), StoreError> {
    let process = EnergyProcess {
        workload: row.get("workload_id")?,
        sm_util_pct: row.get("sm_util_pct")?,
        gpu_mem_bytes: row.u64_bits("gpu_mem_bytes")?,
        compute: rows::is_compute(row.get("process_type")?),
    };
    Ok((row.get("ts_ms")?, row.get("pid")?, process))
}

/// The request rows of energy ranges: `(req, id, from_ms, to_ms)`.
fn range_rows(ranges: &[EnergyRange]) -> Table {
    Table::default()
        .int("req", 0..ranges.len() as i64)
        .int("id", ranges.iter().map(|r| r.gpu.0))
        .int("from_ms", ranges.iter().map(|r| r.from_ms))
        .int("to_ms", ranges.iter().map(|r| r.to_ms))
}

/// A join that keeps the request rows `r` as the outer side (SQLite plans `CROSS JOIN`
/// in the order written).
fn join(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "CROSS JOIN",
        Dialect::Postgres => "JOIN",
    }
}

/// The newest row of `table` of request `r`'s GPU before `r.from_ms` (by `time`),
/// aliased `alias`, with the columns `cols` of it.
fn newest_before(dialect: Dialect, table: &str, time: &str, cols: &str, alias: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!(
            "CROSS JOIN {table} {alias} ON {alias}.gpu_id = r.id AND {alias}.{time} = \
               (SELECT max(x.{time}) FROM {table} x WHERE x.gpu_id = r.id AND x.{time} < r.from_ms)"
        ),
        Dialect::Postgres => format!(
            "CROSS JOIN LATERAL (SELECT {cols} FROM {table} x \
               WHERE x.gpu_id = r.id AND x.{time} < r.from_ms ORDER BY x.{time} DESC LIMIT 1) {alias}"
        ),
    }
}

const SAMPLE_COLS: &str =
    "ts_ms, power_mw, energy_mj, util_gpu_pct, gpm_tensor_active_cpct, gpm_sm_occupancy_cpct";

/// The body of [`EnergyStore::replace_energy_minutes`], inside the caller's transaction.
async fn replace_in<DB: Backend>(
    tx: &mut DB::Connection,
    gpu: GpuId,
    from_ms: UnixMs,
    to_ms: UnixMs,
    minutes: &[GpuMinute],
    done_to_ms: Option<UnixMs>,
) -> Result<(), StoreError> {
    // Minutes before the raw horizon (retention) keep their rows: their raw samples are
    // gone, so a recomputation could only lose energy. (Inputs that could miss deleted
    // rows were read after the horizon was raised, so this read sees it.)
    let horizon = sql::<DB>(
        "read a raw horizon",
        "SELECT raw_from_ms FROM raw_horizon WHERE kind = 'gpu' AND id = $1",
    )
    .bind(gpu.0)
    .optional(&mut *tx)
    .await?;
    let horizon: Option<i64> = horizon.map(|r| r.get("raw_from_ms")).transpose()?;
    let from_ms = from_ms.max(horizon.unwrap_or(i64::MIN));
    for table in ["energy_gpu_minutes", "energy_workload_minutes"] {
        sql::<DB>(
            "delete energy minutes being recomputed",
            format!("DELETE FROM {table} WHERE gpu_id = $1 AND minute_ms >= $2 AND minute_ms < $3"),
        )
        .bind(gpu.0)
        .bind(from_ms)
        .bind(to_ms)
        .execute(&mut *tx)
        .await?;
    }
    let kept: Vec<&GpuMinute> = minutes.iter().filter(|m| m.minute_ms >= from_ms).collect();
    let int = |f: fn(&GpuMinute) -> i64| kept.iter().map(move |m| f(m));
    let mj = |what, f: fn(&GpuMinute) -> u64| -> Result<Vec<i64>, StoreError> {
        kept.iter().map(|m| u64_to_i64(f(m), what)).collect()
    };
    let text = |f: fn(&GpuMinute) -> &'static str| kept.iter().map(move |m| f(m).to_owned());
    let table = Table::default()
        .int("gpu_id", kept.iter().map(|_| gpu.0))
        .int("minute_ms", int(|m| m.minute_ms))
        .int("energy_mj", mj("energy_mj", |m| m.energy_mj)?)
        .int("counter_mj", mj("counter_mj", |m| m.counter_mj)?)
        .int("trapezoid_mj", mj("trapezoid_mj", |m| m.trapezoid_mj)?)
        .int("attributed_mj", mj("attributed_mj", |m| m.attributed_mj)?)
        .int("idle_mj", mj("idle_mj", |m| m.idle_mj)?)
        .int(
            "unattributed_mj",
            mj("unattributed_mj", |m| m.unattributed_mj)?,
        )
        .int("covered_ms", int(|m| m.covered_ms))
        .int("missing_ms", int(|m| m.missing_ms))
        .int("samples", int(|m| i64::from(m.samples)))
        .int(
            "min_power_mw",
            kept.iter().map(|m| m.min_power_mw.map(i64::from)),
        )
        .int("idle_mw", int(|m| i64::from(m.idle_mw)))
        .text("idle_source", text(|m| m.idle_source.as_str()))
        .text("idle_policy", text(|m| m.idle_policy.as_str()))
        .int("max_gap_ms", int(|m| m.max_gap_ms))
        .int("active_mj", mj("active_mj", |m| m.active_mj)?)
        .int("seen_idle_ms", int(|m| m.seen_idle_ms))
        .int("seen_idle_mj", mj("seen_idle_mj", |m| m.seen_idle_mj)?)
        .flag("provisional", kept.iter().map(|m| m.provisional))
        .int("rules", int(|m| i64::from(m.rules)))
        .int("learned_idle_ms", int(|m| m.learned_idle_ms))
        .int(
            "learned_idle_mj",
            mj("learned_idle_mj", |m| m.learned_idle_mj)?,
        )
        .int(
            "util_max_pct",
            kept.iter().map(|m| m.util_max_pct.map(i64::from)),
        );
    let op = "insert energy minutes of a GPU";
    insert_rows::<DB>(&mut *tx, op, "energy_gpu_minutes", table, "").await?;
    let ws: Vec<(&GpuMinute, &WorkloadMinute)> = (kept.iter())
        .flat_map(|&m| m.workloads.iter().map(move |w| (m, w)))
        .collect();
    let int = |f: fn(&WorkloadMinute) -> i64| ws.iter().map(move |(_, w)| f(w));
    let mj = |what, f: fn(&WorkloadMinute) -> u64| -> Result<Vec<i64>, StoreError> {
        ws.iter().map(|(_, w)| u64_to_i64(f(w), what)).collect()
    };
    let table = Table::default()
        .int("gpu_id", ws.iter().map(|_| gpu.0))
        .int("minute_ms", ws.iter().map(|(m, _)| m.minute_ms))
        .int("workload_id", int(|w| w.workload))
        .int("energy_mj", mj("energy_mj", |w| w.energy_mj)?)
        .int("idle_mj", mj("idle_mj", |w| w.idle_mj)?)
        .int("counter_mj", mj("counter_mj", |w| w.counter_mj)?)
        .int("trapezoid_mj", mj("trapezoid_mj", |w| w.trapezoid_mj)?)
        .int("gpu_ms", int(|w| w.gpu_ms))
        .int("share_ppm_ms", mj("share_ppm_ms", |w| w.share_ppm_ms)?)
        .int("sm_ms", int(|w| w.sm_ms))
        .int("memory_ms", int(|w| w.memory_ms))
        .int("equal_ms", int(|w| w.equal_ms))
        .int("active_mj", mj("active_mj", |w| w.active_mj)?)
        .int("idle_memory_ms", int(|w| w.idle_memory_ms))
        .int("idle_equal_ms", int(|w| w.idle_equal_ms))
        .int("tensor_ms", int(|w| w.tensor_ms))
        .int(
            "tensor_cpct_ms",
            mj("tensor_cpct_ms", |w| w.tensor_cpct_ms)?,
        )
        .int("occupancy_ms", int(|w| w.occupancy_ms))
        .int(
            "occupancy_cpct_ms",
            mj("occupancy_cpct_ms", |w| w.occupancy_cpct_ms)?,
        )
        .flag("provisional", ws.iter().map(|(m, _)| m.provisional))
        .int(
            "mem_max_bytes",
            ws.iter().map(|(_, w)| w.mem_max_bytes.map(rows::to_i64)),
        );
    let op = "insert energy minutes of workloads";
    insert_rows::<DB>(&mut *tx, op, "energy_workload_minutes", table, "").await?;
    if let Some(done) = done_to_ms {
        let text = DB::DIALECT.raise("energy_progress", "gpu_id", "done_to_ms");
        sql::<DB>("advance the energy watermark", text)
            .bind(gpu.0)
            .bind(done)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// A sum of integer columns, as a bigint on both backends (PostgreSQL sums bigints
/// into numeric).
fn sum(expr: &str, alias: &str) -> String {
    format!("CAST(sum({expr}) AS BIGINT) AS {alias}")
}

fn sums(cols: &[&str]) -> String {
    cols.iter()
        .map(|c| sum(&format!("m.{c}"), c))
        .chain([sum(
            "CASE WHEN m.provisional THEN m.energy_mj ELSE 0 END",
            "provisional_mj",
        )])
        .collect::<Vec<_>>()
        .join(", ")
}

#[async_trait]
impl<DB: Backend> EnergyStore for SqlStore<DB> {
    async fn energy_gpus(&self) -> Result<Vec<EnergyGpu>, StoreError> {
        let query = sql::<DB>(
            "list GPUs for energy accounting",
            format!(
                "SELECT g.id, g.uuid, g.gpu_index, g.name, n.id AS node_id, n.name AS node_name, \
                 n.interval_ms, coalesce(g.power_limit_default_mw, g.power_limit_enforced_mw) AS limit_mw, \
                 {}, p.done_to_ms \
                 FROM gpus g JOIN nodes n ON n.id = g.node_id \
                 LEFT JOIN energy_progress p ON p.gpu_id = g.id ORDER BY g.id",
                super::packing::gpu_sample_span(DB::DIALECT, "g.id")
            ),
        );
        self.fetch(query, |row| {
            Ok(EnergyGpu {
                gpu: GpuId(row.get("id")?),
                uuid: row.get("uuid")?,
                index: row.get("gpu_index")?,
                name: row.get("name")?,
                node: NodeId(row.get("node_id")?),
                node_name: row.get("node_name")?,
                interval_ms: row.get("interval_ms")?,
                power_limit_mw: row.get("limit_mw")?,
                first_sample_ms: row.get("first_ms")?,
                last_sample_ms: row.get("last_ms")?,
                done_to_ms: row.get("done_to_ms")?,
            })
        })
        .await
    }

    async fn energy_inputs(
        &self,
        gpu: GpuId,
        from_ms: UnixMs,
        to_ms: UnixMs,
    ) -> Result<EnergyInputs, StoreError> {
        let range = EnergyRange {
            gpu,
            from_ms,
            to_ms,
        };
        let mut inputs = self.energy_inputs_many(&[range]).await?;
        Ok(inputs.pop().unwrap_or_default())
    }

    async fn energy_inputs_many(
        &self,
        ranges: &[EnergyRange],
    ) -> Result<Vec<EnergyInputs>, StoreError> {
        let n = ranges.len();
        let mut out = vec![EnergyInputs::default(); n];
        if n == 0 {
            return Ok(out);
        }
        let d = DB::DIALECT;
        let cte = d.request_rows(&range_rows(ranges));
        // One snapshot: a write reopening a packed minute between two of these reads
        // must not leave its processes out of both.
        let mut conn = self.read_snapshot("read energy inputs").await?;
        let read = |op, body: String| {
            sql::<DB>(op, format!("{cte} {body}")).bind_table(range_rows(ranges))
        };
        let prev = read(
            "read the samples before energy ranges",
            format!(
                "SELECT r.req, s.ts_ms, s.power_mw, s.energy_mj, s.util_gpu_pct, \
                 s.gpm_tensor_active_cpct, s.gpm_sm_occupancy_cpct FROM r {}",
                newest_before(d, "gpu_samples", "ts_ms", SAMPLE_COLS, "s")
            ),
        )
        .all(&mut conn)
        .await?;
        for row in &prev {
            out[rows::request(row, n, "energy read")?].prev = Some(sample_from_row(row)?);
        }
        let samples = read(
            "read GPU samples for energy",
            format!(
                "SELECT r.req, s.ts_ms, s.power_mw, s.energy_mj, s.util_gpu_pct, \
                 s.gpm_tensor_active_cpct, s.gpm_sm_occupancy_cpct \
                 FROM r {} gpu_samples s ON s.gpu_id = r.id \
                   AND s.ts_ms >= r.from_ms AND s.ts_ms < r.to_ms ORDER BY r.req, s.ts_ms",
                join(d)
            ),
        )
        .all(&mut conn)
        .await?;
        for row in &samples {
            out[rows::request(row, n, "energy read")?]
                .samples
                .push(sample_from_row(row)?);
        }
        // The GPU samples of packed minutes: the newer sample before each range, and the
        // samples in it merged by time.
        let spans: Vec<_> = (ranges.iter().zip(&out))
            .map(|(r, o)| {
                let after = o.prev.as_ref().map_or(UnixMs::MIN, |p| p.time_ms);
                (r.gpu, r.from_ms, r.to_ms, after)
            })
            .collect();
        let packed = super::packing::energy_gpu_samples::<DB>(&mut conn, &spans).await?;
        for (o, p) in out.iter_mut().zip(packed) {
            if let Some((t, s)) = p.prev
                && o.prev.as_ref().is_none_or(|prev| prev.time_ms < t)
            {
                o.prev = Some(energy_sample(t, &s));
            }
            if !p.samples.is_empty() {
                let mut all: BTreeMap<UnixMs, EnergySample> = (p.samples.iter())
                    .map(|(t, s)| (*t, energy_sample(*t, s)))
                    .collect();
                all.extend(o.samples.drain(..).map(|s| (s.time_ms, s)));
                o.samples = all.into_values().collect();
            }
        }
        let procs = read(
            "read process samples for energy",
            format!(
                "SELECT r.req, p.ts_ms, p.pid, l.workload_id, p.sm_util_pct, p.gpu_mem_bytes, \
                 l.process_type FROM r {} process_samples p ON p.gpu_id = r.id \
                   AND p.ts_ms >= r.from_ms AND p.ts_ms < r.to_ms \
                 JOIN process_lives l ON l.id = p.life_id ORDER BY r.req, p.ts_ms, p.pid",
                join(d)
            ),
        )
        .all(&mut conn)
        .await?;
        // And those of packed minutes: per range, both lists by time and pid, merged.
        let spans: Vec<_> = (ranges.iter())
            .map(|r| (r.gpu, r.from_ms, r.to_ms))
            .collect();
        let packed = super::packing::energy_processes::<DB>(&mut conn, &spans).await?;
        // A row stored as both wins as a row (listed first; the sort is stable).
        let mut per_range: Vec<Vec<(UnixMs, u32, EnergyProcess)>> = vec![Vec::new(); n];
        for row in &procs {
            per_range[rows::request(row, n, "energy read")?].push(energy_process(row)?);
        }
        for (i, t, pid, p) in packed {
            per_range[i].push((t, pid, p));
        }
        for (i, mut list) in per_range.into_iter().enumerate() {
            list.sort_by_key(|(t, pid, _)| (*t, *pid));
            list.dedup_by_key(|(t, pid, _)| (*t, *pid));
            attach_processes(
                &mut out[i].samples,
                list.into_iter().map(|(t, _, p)| (t, p)),
            );
        }
        super::end_read(conn, "read energy inputs").await?;
        Ok(out)
    }

    async fn energy_learned_before_many(
        &self,
        ranges: &[EnergyRange],
    ) -> Result<Vec<(u64, i64)>, StoreError> {
        let n = ranges.len();
        let mut out = vec![(0, 0); n];
        if n == 0 {
            return Ok(out);
        }
        let d = DB::DIALECT;
        let rows = sql::<DB>(
            "read GPUs' idle-baseline evidence",
            format!(
                "{} SELECT r.req, m.learned_idle_mj, m.learned_idle_ms FROM r {}",
                d.request_rows(&range_rows(ranges)),
                newest_before(
                    d,
                    "energy_gpu_minutes",
                    "minute_ms",
                    "learned_idle_mj, learned_idle_ms",
                    "m"
                )
            ),
        )
        .bind_table(range_rows(ranges))
        .all(&mut *self.conn().await?)
        .await?;
        for row in &rows {
            out[rows::request(row, n, "energy read")?] =
                (row.nonneg("learned_idle_mj")?, row.get("learned_idle_ms")?);
        }
        Ok(out)
    }

    async fn next_sample_ms(
        &self,
        gpu: GpuId,
        at_ms: UnixMs,
    ) -> Result<Option<UnixMs>, StoreError> {
        let mut tx = self.read_snapshot("find the next GPU sample").await?;
        let row: Option<UnixMs> = sql::<DB>(
            "find the next GPU sample",
            "SELECT ts_ms FROM gpu_samples WHERE gpu_id = $1 AND ts_ms >= $2 \
             ORDER BY ts_ms LIMIT 1",
        )
        .bind(gpu.0)
        .bind(at_ms)
        .optional(&mut *tx)
        .await?
        .map(|row| row.get("ts_ms"))
        .transpose()?;
        let packed = super::packing::next_packed_sample::<DB>(&mut tx, gpu, at_ms).await?;
        super::end_read(tx, "find the next GPU sample").await?;
        Ok(row.into_iter().chain(packed).min())
    }

    async fn energy_learned_before(
        &self,
        gpu: GpuId,
        before_ms: UnixMs,
    ) -> Result<(u64, i64), StoreError> {
        let range = EnergyRange {
            gpu,
            from_ms: before_ms,
            to_ms: before_ms,
        };
        let mut evidence = self.energy_learned_before_many(&[range]).await?;
        Ok(evidence.pop().unwrap_or_default())
    }

    async fn energy_baselines(&self) -> Result<Vec<GpuBaseline>, StoreError> {
        let query = sql::<DB>(
            "read the idle baselines",
            "SELECT g.id, g.uuid, g.gpu_index, g.name, n.name AS node_name, m.idle_mw, \
             m.idle_source, m.minute_ms, m.learned_idle_mj AS seen_mj, \
             m.learned_idle_ms AS seen_ms \
             FROM gpus g JOIN nodes n ON n.id = g.node_id \
             JOIN energy_gpu_minutes m ON m.gpu_id = g.id AND m.minute_ms = \
               (SELECT max(x.minute_ms) FROM energy_gpu_minutes x WHERE x.gpu_id = g.id) \
             ORDER BY n.name, g.gpu_index",
        );
        self.fetch(query, |row| {
            let source: String = row.get("idle_source")?;
            let idle_mw: i64 = row.get("idle_mw")?;
            Ok(GpuBaseline {
                gpu: GpuId(row.get("id")?),
                uuid: row.get("uuid")?,
                index: row.get("gpu_index")?,
                name: row.get("name")?,
                node_name: row.get("node_name")?,
                idle_mw: u32::try_from(idle_mw)
                    .map_err(|_| StoreError::Corrupt(format!("idle_mw {idle_mw}")))?,
                idle_source: IdleSource::parse(&source)
                    .ok_or_else(|| StoreError::Corrupt(format!("idle_source {source:?}")))?,
                minute_ms: row.get("minute_ms")?,
                seen_idle_mj: row.nonneg("seen_mj")?,
                seen_idle_ms: row.get("seen_ms")?,
            })
        })
        .await
    }

    async fn replace_energy_minutes(
        &self,
        gpu: GpuId,
        from_ms: UnixMs,
        to_ms: UnixMs,
        minutes: &[GpuMinute],
        done_to_ms: Option<UnixMs>,
    ) -> Result<(), StoreError> {
        let range = EnergyRange {
            gpu,
            from_ms,
            to_ms,
        };
        let batch = MinuteReplacement {
            range,
            minutes: minutes.to_vec(),
            done_to_ms,
        };
        self.replace_energy_minutes_many(std::slice::from_ref(&batch))
            .await
    }

    async fn replace_energy_minutes_many(
        &self,
        batch: &[MinuteReplacement],
    ) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin_write("begin an energy transaction").await?;
        for b in batch {
            let r = b.range;
            replace_in::<DB>(
                tx.conn(),
                r.gpu,
                r.from_ms,
                r.to_ms,
                &b.minutes,
                b.done_to_ms,
            )
            .await?;
        }
        tx.commit("commit energy minutes").await
    }

    async fn energy_minutes(
        &self,
        gpu: Option<GpuId>,
        range: TimeRange,
    ) -> Result<Vec<(GpuId, GpuMinute)>, StoreError> {
        let filter = "AND (CAST($3 AS BIGINT) IS NULL OR gpu_id = $3)";
        let mut conn = self.conn().await?;
        let rows = sql::<DB>(
            "read energy minutes",
            format!(
                "SELECT * FROM energy_gpu_minutes WHERE minute_ms BETWEEN $1 AND $2 {filter} \
                 ORDER BY gpu_id, minute_ms"
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(gpu.map(|g| g.0))
        .all(&mut conn)
        .await?;
        let wrows = sql::<DB>(
            "read workload energy minutes",
            format!(
                "SELECT * FROM energy_workload_minutes WHERE minute_ms BETWEEN $1 AND $2 \
                 {filter} ORDER BY gpu_id, minute_ms, workload_id"
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(gpu.map(|g| g.0))
        .all(&mut conn)
        .await?;
        minutes_from_rows(&rows, &wrows)
    }

    async fn stale_energy_minutes(
        &self,
        since_ms: UnixMs,
    ) -> Result<Vec<(GpuId, UnixMs)>, StoreError> {
        let query = sql::<DB>(
            "find energy minutes with late samples",
            "SELECT r.gpu_id, r.minute_ms FROM ( \
               SELECT s.gpu_id, (s.ts_ms / 60000) * 60000 AS minute_ms, count(*) AS n \
               FROM gpu_samples s JOIN energy_progress p ON p.gpu_id = s.gpu_id \
               LEFT JOIN raw_horizon h ON h.kind = 'gpu' AND h.id = s.gpu_id \
               WHERE s.ts_ms >= $1 AND s.ts_ms < p.done_to_ms \
                 AND (h.raw_from_ms IS NULL OR s.ts_ms >= h.raw_from_ms) GROUP BY 1, 2) r \
             LEFT JOIN energy_gpu_minutes m ON m.gpu_id = r.gpu_id AND m.minute_ms = r.minute_ms \
             WHERE m.samples IS NULL OR m.samples != r.n ORDER BY 1, 2",
        )
        .bind(since_ms.max(0));
        self.fetch(query, |row| {
            Ok((GpuId(row.get("gpu_id")?), row.get("minute_ms")?))
        })
        .await
    }

    async fn workload_energy(
        &self,
        range: TimeRange,
        node: Option<&str>,
        workload_key: Option<&str>,
    ) -> Result<Vec<WorkloadEnergy>, StoreError> {
        let sums = sums(&[
            "energy_mj",
            "idle_mj",
            "active_mj",
            "idle_memory_ms",
            "idle_equal_ms",
            "counter_mj",
            "trapezoid_mj",
            "gpu_ms",
            "share_ppm_ms",
            "sm_ms",
            "memory_ms",
            "equal_ms",
            "tensor_ms",
            "tensor_cpct_ms",
            "occupancy_ms",
            "occupancy_cpct_ms",
        ]);
        let query = sql::<DB>(
            "sum energy per workload",
            format!(
                "SELECT {WORKLOAD_COLS}, g.uuid, g.gpu_index, g.name AS gpu_name, \
                 n.name AS node_name, {sums}, \
                 min(m.minute_ms) AS first_ms, max(m.minute_ms) AS last_ms \
                 FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
                 JOIN gpus g ON g.id = m.gpu_id JOIN nodes n ON n.id = g.node_id \
                 WHERE m.minute_ms BETWEEN $1 AND $2 \
                   AND (CAST($3 AS TEXT) IS NULL OR n.name = $3) \
                   AND (CAST($4 AS TEXT) IS NULL OR w.key = $4) \
                 GROUP BY w.id, g.id, n.id ORDER BY w.key, n.name, g.gpu_index"
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(node)
        .bind(workload_key);
        self.fetch(query, |row| {
            Ok(WorkloadEnergy {
                workload: rows::workload(row)?,
                gpu_uuid: row.get("uuid")?,
                gpu_index: row.get("gpu_index")?,
                gpu_name: row.get("gpu_name")?,
                node_name: row.get("node_name")?,
                energy_mj: row.nonneg("energy_mj")?,
                active_mj: row.nonneg("active_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                provisional_mj: row.nonneg("provisional_mj")?,
                counter_mj: row.nonneg("counter_mj")?,
                trapezoid_mj: row.nonneg("trapezoid_mj")?,
                gpu_ms: row.get("gpu_ms")?,
                share_ppm_ms: row.nonneg("share_ppm_ms")?,
                sm_ms: row.get("sm_ms")?,
                memory_ms: row.get("memory_ms")?,
                equal_ms: row.get("equal_ms")?,
                idle_memory_ms: row.get("idle_memory_ms")?,
                idle_equal_ms: row.get("idle_equal_ms")?,
                tensor_ms: row.get("tensor_ms")?,
                tensor_cpct_ms: row.nonneg("tensor_cpct_ms")?,
                occupancy_ms: row.get("occupancy_ms")?,
                occupancy_cpct_ms: row.nonneg("occupancy_cpct_ms")?,
                first_minute_ms: row.get("first_ms")?,
                last_minute_ms: row.get("last_ms")?,
            })
        })
        .await
    }

    async fn workload_energy_series(
        &self,
        workload_key: &str,
        range: TimeRange,
    ) -> Result<Vec<WorkloadEnergyPoint>, StoreError> {
        let sums = sums(&[
            "energy_mj",
            "idle_mj",
            "active_mj",
            "gpu_ms",
            "share_ppm_ms",
        ]);
        let query = sql::<DB>(
            "read a workload's energy per minute",
            format!(
                "SELECT m.minute_ms, {sums} \
                 FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
                 WHERE w.key = $1 AND m.minute_ms BETWEEN $2 AND $3 \
                 GROUP BY m.minute_ms ORDER BY m.minute_ms LIMIT $4"
            ),
        )
        .bind(workload_key)
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(1_000_000));
        self.fetch(query, |row| {
            Ok(WorkloadEnergyPoint {
                minute_ms: row.get("minute_ms")?,
                energy_mj: row.nonneg("energy_mj")?,
                active_mj: row.nonneg("active_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                provisional_mj: row.nonneg("provisional_mj")?,
                gpu_ms: row.get("gpu_ms")?,
                share_ppm_ms: row.nonneg("share_ppm_ms")?,
            })
        })
        .await
    }

    async fn waste_minutes(
        &self,
        range: TimeRange,
        scope: WasteScope<'_>,
        util_threshold_pct: u32,
    ) -> Result<Vec<WasteMinute>, StoreError> {
        // The GPU row carries the judgement's inputs (utilization, coverage); the carbon
        // row, when priced, the GPU-minute's price (a workload's carbon is its energy at
        // that price, like every carbon figure). Busy minutes are left out here: they
        // are most minutes, and they break an episode whether read or not.
        // A node's or a GPU's read starts from its GPUs and walks the (gpu_id, minute_ms)
        // key; the fleet's walks the minute index.
        let scope_sql = match scope {
            WasteScope::Fleet => "",
            WasteScope::Node(_) => {
                "AND e.gpu_id IN (SELECT g2.id FROM gpus g2 \
                 JOIN nodes n2 ON n2.id = g2.node_id WHERE n2.name = $4)"
            }
            WasteScope::Series(..) => "AND e.gpu_id = $4 AND w.key = $5",
        };
        let query = sql::<DB>(
            "read idle workload minutes",
            format!(
                "SELECT m.gpu_id, g.uuid, g.gpu_index, g.name AS gpu_name, n.name AS node_name, \
                 m.minute_ms, e.util_max_pct, e.covered_ms, e.missing_ms, e.max_gap_ms, m.gpu_ms, \
                 m.mem_max_bytes, m.energy_mj, m.active_mj, m.idle_mj, m.provisional, \
                 c.g_per_kwh, c.pue, \
                 (SELECT max(x.minute_ms) FROM energy_gpu_minutes x WHERE x.gpu_id = m.gpu_id) \
                   AS gpu_last_minute_ms, {WORKLOAD_COLS} \
                 FROM energy_gpu_minutes e \
                 JOIN energy_workload_minutes m ON m.gpu_id = e.gpu_id AND m.minute_ms = e.minute_ms \
                 JOIN workloads w ON w.id = m.workload_id \
                 JOIN gpus g ON g.id = m.gpu_id JOIN nodes n ON n.id = g.node_id \
                 LEFT JOIN carbon_gpu_minutes c ON c.gpu_id = m.gpu_id AND c.minute_ms = m.minute_ms \
                 WHERE e.minute_ms BETWEEN $1 AND $2 AND {IDLE_ALLOCATED_SQL} {scope_sql} \
                 ORDER BY m.gpu_id, m.workload_id, m.minute_ms"
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(i64::from(util_threshold_pct));
        let query = match scope {
            WasteScope::Fleet => query,
            WasteScope::Node(node) => query.bind(node),
            WasteScope::Series(gpu, key) => query.bind(gpu.0).bind(key),
        };
        self.fetch(query, |row| {
            let price = match (
                row.get::<Option<f64>>("g_per_kwh")?,
                row.get::<Option<f64>>("pue")?,
            ) {
                (Some(g), Some(p)) => Some((g, p)),
                _ => None,
            };
            Ok(WasteMinute {
                gpu: GpuId(row.get("gpu_id")?),
                gpu_uuid: row.get("uuid")?,
                gpu_index: row.get("gpu_index")?,
                gpu_name: row.get("gpu_name")?,
                node_name: row.get("node_name")?,
                workload: rows::workload(row)?,
                minute_ms: row.get("minute_ms")?,
                util_max_pct: row.get("util_max_pct")?,
                covered_ms: row.get("covered_ms")?,
                missing_ms: row.get("missing_ms")?,
                gpu_ms: row.get("gpu_ms")?,
                mem_max_bytes: row.u64_bits("mem_max_bytes")?,
                energy_mj: row.nonneg("energy_mj")?,
                active_mj: row.nonneg("active_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                provisional: row.flag("provisional")?,
                price,
                gpu_last_minute_ms: row.get("gpu_last_minute_ms")?,
                max_gap_ms: row.get("max_gap_ms")?,
            })
        })
        .await
    }

    async fn waste_run_start(
        &self,
        gpu: GpuId,
        workload_key: &str,
        last_ms: UnixMs,
        horizon_ms: UnixMs,
        util_threshold_pct: u32,
    ) -> Result<Option<UnixMs>, StoreError> {
        // Numbered from the newest backwards, the minutes of the run ending at `last_ms`
        // are exactly those with minute + n × 1 min = last + 1 min.
        let query = sql::<DB>(
            "find the start of an idle run",
            format!(
                "SELECT min(t.minute_ms) AS start_ms FROM (\
                   SELECT m.minute_ms, m.minute_ms + 60000 * row_number() \
                     OVER (ORDER BY m.minute_ms DESC) AS k \
                   FROM energy_gpu_minutes e \
                   JOIN energy_workload_minutes m ON m.gpu_id = e.gpu_id AND m.minute_ms = e.minute_ms \
                   JOIN workloads w ON w.id = m.workload_id \
                   WHERE e.minute_ms BETWEEN $1 AND $2 AND {IDLE_ALLOCATED_SQL} \
                     AND e.gpu_id = $4 AND w.key = $5) t \
                 WHERE t.k = $6"
            ),
        )
        .bind(horizon_ms)
        .bind(last_ms)
        .bind(i64::from(util_threshold_pct))
        .bind(gpu.0)
        .bind(workload_key)
        .bind(last_ms.saturating_add(60_000));
        let rows = self
            .fetch(query, |row| row.get::<Option<i64>>("start_ms"))
            .await?;
        Ok(rows.into_iter().flatten().next())
    }

    async fn energy_buckets(
        &self,
        range: TimeRange,
        bucket_ms: i64,
    ) -> Result<EnergyBuckets, StoreError> {
        // A number the server chose, written into the text (not bound) so that both
        // backends see one integer expression to group by.
        let b = bucket_ms.max(1);
        let query = sql::<DB>(
            "sum workload energy per bucket",
            format!(
                "SELECT (m.minute_ms / {b}) * {b} AS bucket_ms, {WORKLOAD_COLS}, \
                 CAST(sum(m.energy_mj) AS BIGINT) AS energy_mj \
                 FROM energy_workload_minutes m JOIN workloads w ON w.id = m.workload_id \
                 WHERE m.minute_ms BETWEEN $1 AND $2 \
                 GROUP BY 1, w.id ORDER BY 1, w.key"
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms);
        let workloads = self
            .fetch(query, |row| {
                Ok(WorkloadBucket {
                    bucket_ms: row.get("bucket_ms")?,
                    workload: rows::workload(row)?,
                    energy_mj: row.nonneg("energy_mj")?,
                })
            })
            .await?;
        let query = sql::<DB>(
            "sum GPU energy per bucket and node",
            format!(
                "SELECT (m.minute_ms / {b}) * {b} AS bucket_ms, n.name AS node_name, \
                 CAST(sum(m.energy_mj) AS BIGINT) AS energy_mj, \
                 CAST(sum(m.idle_mj) AS BIGINT) AS idle_mj, \
                 CAST(sum(m.unattributed_mj) AS BIGINT) AS unattributed_mj \
                 FROM energy_gpu_minutes m JOIN gpus g ON g.id = m.gpu_id \
                 JOIN nodes n ON n.id = g.node_id WHERE m.minute_ms BETWEEN $1 AND $2 \
                 GROUP BY 1, n.id ORDER BY 1, n.name"
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms);
        let nodes = self
            .fetch(query, |row| {
                Ok(NodeBucket {
                    bucket_ms: row.get("bucket_ms")?,
                    node_name: row.get("node_name")?,
                    energy_mj: row.nonneg("energy_mj")?,
                    idle_mj: row.nonneg("idle_mj")?,
                    unattributed_mj: row.nonneg("unattributed_mj")?,
                })
            })
            .await?;
        Ok(EnergyBuckets { workloads, nodes })
    }

    async fn gpu_energy(&self, range: TimeRange) -> Result<Vec<GpuEnergy>, StoreError> {
        let sums = sums(&[
            "energy_mj",
            "counter_mj",
            "trapezoid_mj",
            "attributed_mj",
            "idle_mj",
            "unattributed_mj",
            "covered_ms",
            "missing_ms",
            "active_mj",
        ]);
        let query = sql::<DB>(
            "sum energy per GPU",
            format!(
                "SELECT g.id, g.uuid, g.gpu_index, g.name, n.name AS node_name, {sums} \
                 FROM energy_gpu_minutes m JOIN gpus g ON g.id = m.gpu_id \
                 JOIN nodes n ON n.id = g.node_id WHERE m.minute_ms BETWEEN $1 AND $2 \
                 GROUP BY g.id, n.id ORDER BY n.name, g.gpu_index"
            ),
        )
        .bind(range.from_ms)
        .bind(range.to_ms);
        self.fetch(query, |row| {
            Ok(GpuEnergy {
                gpu: GpuId(row.get("id")?),
                uuid: row.get("uuid")?,
                index: row.get("gpu_index")?,
                name: row.get("name")?,
                node_name: row.get("node_name")?,
                energy_mj: row.nonneg("energy_mj")?,
                counter_mj: row.nonneg("counter_mj")?,
                trapezoid_mj: row.nonneg("trapezoid_mj")?,
                attributed_mj: row.nonneg("attributed_mj")?,
                idle_mj: row.nonneg("idle_mj")?,
                unattributed_mj: row.nonneg("unattributed_mj")?,
                active_mj: row.nonneg("active_mj")?,
                provisional_mj: row.nonneg("provisional_mj")?,
                covered_ms: row.get("covered_ms")?,
                missing_ms: row.get("missing_ms")?,
            })
        })
        .await
    }
}
