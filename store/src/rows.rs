//! Stored rows → domain types, once for both backends (through [`Get`]), and the column
//! lists the shared queries select for them.

use super::backend::{Backend, Get, GetExt, sql};
use super::{
    AgentTokenRecord, GpuId, GpuRecord, HostRow, NodeId, NodeRecord, StoreError, decode_mig_gpm,
    decode_nvlinks,
};
use gpufleet_core::{
    DeliveryStats, Event, EventKind, GpmMetrics, GpuHealthSample, GpuInfo, GpuSample, HostInfo,
    HostSample, MigInstance, ProcessSample, ProcessType, SamplerCost, Workload, WorkloadKind,
};
use std::collections::BTreeMap;

/// GPU sample columns, for a query joining `gpu_samples s` and `gpus g`.
pub const GPU_COLS: &str = "g.uuid AS gpu_uuid, s.ts_ms, s.util_gpu_pct, s.util_mem_pct, \
    s.mem_used_bytes, s.mem_total_bytes, s.mem_reserved_bytes, s.power_mw, s.power_instant_mw, \
    s.power_limit_mw, s.energy_mj, s.temp_gpu_c, s.temp_mem_c, s.fan_pct, s.clock_sm_mhz, \
    s.clock_mem_mhz, s.clock_graphics_mhz, s.pstate, s.pcie_tx_bps, s.pcie_rx_bps, \
    s.nvlink_tx_bps, s.nvlink_rx_bps, s.nvlinks, s.ecc_corrected_volatile, \
    s.ecc_uncorrected_volatile, s.throttle_reasons, s.enc_util_pct, s.dec_util_pct, \
    s.gpm_sm_active_cpct, s.gpm_sm_occupancy_cpct, s.gpm_tensor_active_cpct, \
    s.gpm_tensor_hmma_cpct, s.gpm_tensor_imma_cpct, s.gpm_tensor_dfma_cpct, s.gpm_dram_bw_cpct, \
    s.gpm_fp64_cpct, s.gpm_fp32_cpct, s.gpm_fp16_cpct, s.gpm_pcie_tx_bps, s.gpm_pcie_rx_bps, \
    s.gpm_nvlink_tx_bps, s.gpm_nvlink_rx_bps, s.mig_gpm";

/// Health columns, for a query joining `gpu_health h` and `gpus g` (read by [`health`]).
pub const HEALTH_COLS: &str = "g.uuid AS gpu_uuid, h.ts_ms, h.retired_pages_sbe, \
    h.retired_pages_dbe, h.retired_pages_pending, h.remapped_rows_correctable, \
    h.remapped_rows_uncorrectable, h.remapped_rows_pending, h.remapped_rows_failed, \
    h.ecc_corrected_aggregate, h.ecc_uncorrected_aggregate, h.pcie_replay_count, \
    h.nvlink_crc_errors, h.nvlink_replay_errors, h.nvlink_recovery_errors, h.persistence_mode";

/// Workload columns, for a query joining `workloads w` (read by [`workload`]).
pub const WORKLOAD_COLS: &str = "w.kind AS w_kind, w.runtime AS w_runtime, \
    w.container_id AS w_container_id, w.pod_uid AS w_pod_uid, w.qos AS w_qos, \
    w.job_id AS w_job_id, w.step AS w_step, w.unit AS w_unit, w.uid AS w_uid, \
    w.container_name AS w_container_name, w.image AS w_image, w.pod_name AS w_pod_name, \
    w.namespace AS w_namespace, w.job_name AS w_job_name, w.account AS w_account, \
    w.partition AS w_partition, w.job_user AS w_job_user, w.labels AS w_labels, \
    w.array_task AS w_array_task, w.het_component AS w_het_component";

/// Process sample columns (without the workload's), for a query joining
/// `process_samples p`, its lifetime `process_lives l` ([`PROCESS_JOINS`]) and `gpus g`;
/// with [`WORKLOAD_COLS`] for [`process`].
pub const PROCESS_ONLY_COLS: &str = "g.uuid AS gpu_uuid, p.ts_ms, p.pid, l.process_type, \
    l.user_name, l.command, p.gpu_mem_bytes, p.sm_util_pct, p.mem_util_pct, p.enc_util_pct, \
    p.dec_util_pct, l.mig_uuid";

/// What a query reading `process_samples p` joins for [`process_cols`]: the sample's
/// lifetime `l` (its identity) and workload `w`.
pub const PROCESS_JOINS: &str =
    "JOIN process_lives l ON l.id = p.life_id JOIN workloads w ON w.id = l.workload_id";

/// Event columns, for a query joining `events e` and (left) `gpus g`.
pub const EVENT_COLS: &str = "e.ts_ms, e.kind, e.code, e.detail, g.uuid AS gpu_uuid";

/// Process sample columns with their workload's, for `process_samples p`, `gpus g` and
/// [`PROCESS_JOINS`].
pub fn process_cols() -> String {
    format!("{PROCESS_ONLY_COLS}, {WORKLOAD_COLS}")
}

/// Stores a u64 as the i64 with the same bits (lossless; see the schema).
pub fn to_i64(v: u64) -> i64 {
    v as i64
}

pub fn limit_i64(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

pub fn node<R: Get>(row: &R) -> Result<NodeRecord, StoreError> {
    let labels: String = row.get("labels")?;
    let labels: BTreeMap<String, String> = serde_json::from_str(&labels)
        .map_err(|e| StoreError::Corrupt(format!("nodes.labels is not a JSON object: {e}")))?;
    let bits = |c: &str| -> Result<u64, StoreError> { Ok(row.get::<i64>(c)? as u64) };
    Ok(NodeRecord {
        id: NodeId(row.get("id")?),
        name: row.get("name")?,
        labels,
        agent_version: row.get("agent_version")?,
        boot_id: row.get("boot_id")?,
        source: row.get("source")?,
        interval_ms: row.get("interval_ms")?,
        first_seen_ms: row.get("first_seen_ms")?,
        last_hello_ms: row.get("last_hello_ms")?,
        last_seen_ms: row.get("last_seen_ms")?,
        last_acked_seq: bits("last_acked_seq")?,
        delivery: DeliveryStats {
            dropped_samples: bits("dropped_samples")?,
            spool_backlog_batches: bits("spool_backlog_batches")?,
            spool_backlog_bytes: bits("spool_backlog_bytes")?,
        },
        stored_samples: bits("stored_samples")?,
        driver_version: row.get("driver_version")?,
        cuda_driver_version: row.get("cuda_driver_version")?,
        nvml_version: row.get("nvml_version")?,
        host: HostInfo {
            hostname: row.get("hostname")?,
            kernel: row.get("kernel")?,
            os: row.get("os")?,
            cpu_count: row.get("cpu_count")?,
            memory_total_bytes: row.u64_bits("memory_total_bytes")?,
        },
        gpus: Vec::new(),
    })
}

pub fn gpu<R: Get>(row: &R) -> Result<GpuRecord, StoreError> {
    let mig: String = row.get("mig_instances")?;
    let mig_instances: Vec<MigInstance> = serde_json::from_str(&mig)
        .map_err(|e| StoreError::Corrupt(format!("gpus.mig_instances is not valid: {e}")))?;
    Ok(GpuRecord {
        id: GpuId(row.get("id")?),
        info: GpuInfo {
            index: row.get("gpu_index")?,
            uuid: row.get("uuid")?,
            name: row.get("name")?,
            serial: row.get("serial")?,
            pci_bus_id: row.get("pci_bus_id")?,
            architecture: row.get("architecture")?,
            brand: row.get("brand")?,
            memory_total_bytes: row.u64_bits("memory_total_bytes")?,
            power_limit_default_mw: row.get("power_limit_default_mw")?,
            power_limit_enforced_mw: row.get("power_limit_enforced_mw")?,
            power_limit_min_mw: row.get("power_limit_min_mw")?,
            power_limit_max_mw: row.get("power_limit_max_mw")?,
            max_clock_sm_mhz: row.get("max_clock_sm_mhz")?,
            max_clock_mem_mhz: row.get("max_clock_mem_mhz")?,
            max_clock_graphics_mhz: row.get("max_clock_graphics_mhz")?,
            nvlink_count: row.get("nvlink_count")?,
            mig_enabled: row.get("mig_enabled")?,
            compute_mode: row.get("compute_mode")?,
            persistence_mode: row.get("persistence_mode")?,
            cuda_capability_major: row.get("cuda_capability_major")?,
            cuda_capability_minor: row.get("cuda_capability_minor")?,
            pcie_link_gen_max: row.get("pcie_link_gen_max")?,
            pcie_link_width_max: row.get("pcie_link_width_max")?,
            vbios_version: row.get("vbios_version")?,
            mig_instances,
            temp_slowdown_c: row.get("temp_slowdown_c")?,
            temp_shutdown_c: row.get("temp_shutdown_c")?,
            temp_gpu_max_c: row.get("temp_gpu_max_c")?,
            temp_mem_max_c: row.get("temp_mem_max_c")?,
        },
    })
}

pub fn gpu_sample<R: Get>(row: &R) -> Result<GpuSample, StoreError> {
    let nvlinks = match row.get::<Option<Vec<u8>>>("nvlinks")? {
        Some(bytes) => decode_nvlinks(&bytes)
            .map_err(|e| StoreError::Corrupt(format!("gpu_samples.nvlinks: {e}")))?,
        None => Vec::new(),
    };
    let mig_gpm = match row.get::<Option<Vec<u8>>>("mig_gpm")? {
        Some(bytes) => decode_mig_gpm(&bytes)
            .map_err(|e| StoreError::Corrupt(format!("gpu_samples.mig_gpm: {e}")))?,
        None => Vec::new(),
    };
    let mut gpm = [None; 14];
    for (v, name) in gpm.iter_mut().zip(GpmMetrics::NAMES) {
        *v = row.u64_bits(&format!("gpm_{name}"))?;
    }
    let gpm = GpmMetrics::from_values(gpm)
        .ok_or_else(|| StoreError::Corrupt("gpu_samples: a GPM activity out of range".into()))?;
    Ok(GpuSample {
        gpu_uuid: row.get("gpu_uuid")?,
        util_gpu_pct: row.get("util_gpu_pct")?,
        util_mem_pct: row.get("util_mem_pct")?,
        mem_used_bytes: row.u64_bits("mem_used_bytes")?,
        mem_total_bytes: row.u64_bits("mem_total_bytes")?,
        mem_reserved_bytes: row.u64_bits("mem_reserved_bytes")?,
        power_mw: row.get("power_mw")?,
        power_instant_mw: row.get("power_instant_mw")?,
        power_limit_mw: row.get("power_limit_mw")?,
        energy_mj: row.u64_bits("energy_mj")?,
        temp_gpu_c: row.get("temp_gpu_c")?,
        temp_mem_c: row.get("temp_mem_c")?,
        fan_pct: row.get("fan_pct")?,
        clock_sm_mhz: row.get("clock_sm_mhz")?,
        clock_mem_mhz: row.get("clock_mem_mhz")?,
        clock_graphics_mhz: row.get("clock_graphics_mhz")?,
        pstate: row.get("pstate")?,
        pcie_tx_bps: row.u64_bits("pcie_tx_bps")?,
        pcie_rx_bps: row.u64_bits("pcie_rx_bps")?,
        nvlink_tx_bps: row.u64_bits("nvlink_tx_bps")?,
        nvlink_rx_bps: row.u64_bits("nvlink_rx_bps")?,
        nvlinks,
        ecc_corrected_volatile: row.u64_bits("ecc_corrected_volatile")?,
        ecc_uncorrected_volatile: row.u64_bits("ecc_uncorrected_volatile")?,
        throttle_reasons: row.u64_bits("throttle_reasons")?,
        enc_util_pct: row.get("enc_util_pct")?,
        dec_util_pct: row.get("dec_util_pct")?,
        gpm,
        mig_gpm,
    })
}

/// A `gpu_health` row ([`HEALTH_COLS`]). Counts are stored as their value (validation keeps
/// them at most 2^53); a negative one means the row was tampered with.
pub fn health<R: Get>(row: &R) -> Result<GpuHealthSample, StoreError> {
    let count = |c: &str| -> Result<Option<u64>, StoreError> {
        row.get::<Option<i64>>(c)?
            .map(|v| {
                u64::try_from(v)
                    .map_err(|_| StoreError::Corrupt(format!("gpu_health.{c} is negative ({v})")))
            })
            .transpose()
    };
    Ok(GpuHealthSample {
        gpu_uuid: row.get("gpu_uuid")?,
        retired_pages_sbe: row.get("retired_pages_sbe")?,
        retired_pages_dbe: row.get("retired_pages_dbe")?,
        retired_pages_pending: row.get("retired_pages_pending")?,
        remapped_rows_correctable: row.get("remapped_rows_correctable")?,
        remapped_rows_uncorrectable: row.get("remapped_rows_uncorrectable")?,
        remapped_rows_pending: row.get("remapped_rows_pending")?,
        remapped_rows_failed: row.get("remapped_rows_failed")?,
        ecc_corrected_aggregate: count("ecc_corrected_aggregate")?,
        ecc_uncorrected_aggregate: count("ecc_uncorrected_aggregate")?,
        pcie_replay_count: count("pcie_replay_count")?,
        nvlink_crc_errors: count("nvlink_crc_errors")?,
        nvlink_replay_errors: count("nvlink_replay_errors")?,
        nvlink_recovery_errors: count("nvlink_recovery_errors")?,
        persistence_mode: row.get("persistence_mode")?,
    })
}

/// How `process_lives.process_type` keeps a process type.
pub fn process_type(t: ProcessType) -> i16 {
    match t {
        ProcessType::Compute => 1,
        ProcessType::Graphics => 2,
        ProcessType::ComputeAndGraphics => 3,
    }
}

pub fn process<R: Get>(row: &R) -> Result<ProcessSample, StoreError> {
    use ProcessType::*;
    let code = row.get::<i64>("process_type")?;
    let process_type = [Compute, Graphics, ComputeAndGraphics]
        .into_iter()
        .find(|&t| i64::from(process_type(t)) == code)
        .ok_or_else(|| StoreError::Corrupt(format!("process_lives.process_type {code}")))?;
    Ok(ProcessSample {
        gpu_uuid: row.get("gpu_uuid")?,
        pid: row.get("pid")?,
        process_type,
        user: row.get("user_name")?,
        command: row.get("command")?,
        gpu_mem_bytes: row.u64_bits("gpu_mem_bytes")?,
        sm_util_pct: row.get("sm_util_pct")?,
        mem_util_pct: row.get("mem_util_pct")?,
        enc_util_pct: row.get("enc_util_pct")?,
        dec_util_pct: row.get("dec_util_pct")?,
        workload: workload(row)?,
        mig_uuid: row.get("mig_uuid")?,
    })
}

/// The workload columns of a row (`w_kind`, `w_runtime`, ... as in [`WORKLOAD_COLS`]).
pub fn workload<R: Get>(row: &R) -> Result<Workload, StoreError> {
    let kind: String = row.get("w_kind")?;
    let kind = WorkloadKind::parse(&kind)
        .ok_or_else(|| StoreError::Corrupt(format!("workloads.kind {kind:?}")))?;
    Ok(Workload {
        kind,
        runtime: row.get("w_runtime")?,
        container_id: row.get("w_container_id")?,
        pod_uid: row.get("w_pod_uid")?,
        qos: row.get("w_qos")?,
        job_id: row.get("w_job_id")?,
        step: row.get("w_step")?,
        unit: row.get("w_unit")?,
        uid: row.get("w_uid")?,
        container_name: row.get("w_container_name")?,
        image: row.get("w_image")?,
        pod_name: row.get("w_pod_name")?,
        namespace: row.get("w_namespace")?,
        job_name: row.get("w_job_name")?,
        account: row.get("w_account")?,
        partition: row.get("w_partition")?,
        job_user: row.get("w_job_user")?,
        array_task: row.get("w_array_task")?,
        het_component: row.get("w_het_component")?,
        labels: match row.get::<Option<String>>("w_labels")? {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| StoreError::Corrupt(format!("workloads.labels: {e}")))?,
            None => Default::default(),
        },
    })
}

pub fn host<R: Get>(row: &R) -> Result<HostRow, StoreError> {
    let sample = HostSample {
        cpu_util_pct: row.get("cpu_util_pct")?,
        mem_used_bytes: row.u64_bits("mem_used_bytes")?,
        mem_total_bytes: row.u64_bits("mem_total_bytes")?,
        disk_read_bps: row.u64_bits("disk_read_bps")?,
        disk_write_bps: row.u64_bits("disk_write_bps")?,
        net_rx_bps: row.u64_bits("net_rx_bps")?,
        net_tx_bps: row.u64_bits("net_tx_bps")?,
        load1: row.get("load1")?,
    };
    let slowest: Option<String> = row.get("cost_slowest_calls")?;
    let slowest_calls_us = match slowest {
        Some(s) => serde_json::from_str(&s).map_err(|e| {
            StoreError::Corrupt(format!("host_samples.cost_slowest_calls is not valid: {e}"))
        })?,
        None => BTreeMap::new(),
    };
    let cost = SamplerCost {
        cpu_us: row.get("cost_cpu_us")?,
        wall_us: row.get("cost_wall_us")?,
        source_us: row.get("cost_source_us")?,
        slowest_calls_us,
    };
    let has_cost = cost.cpu_us.is_some()
        || cost.wall_us.is_some()
        || cost.source_us.is_some()
        || !cost.slowest_calls_us.is_empty();
    Ok(HostRow {
        time_ms: row.get("ts_ms")?,
        sample: (sample != HostSample::default()).then_some(sample),
        cost: has_cost.then_some(cost),
    })
}

/// An event, from [`EVENT_COLS`].
pub fn event<R: Get>(row: &R) -> Result<Event, StoreError> {
    let kind: String = row.get("kind")?;
    Ok(Event {
        time_ms: row.get("ts_ms")?,
        gpu_uuid: row.get::<Option<String>>("gpu_uuid")?.unwrap_or_default(),
        kind: event_kind(&kind)?,
        code: row.u64_bits("code")?,
        detail: row.get("detail")?,
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

pub fn token<R: Get>(row: &R) -> Result<AgentTokenRecord, StoreError> {
    Ok(AgentTokenRecord {
        id: row.get("id")?,
        node: row.get("node")?,
        role: row.get("role")?,
        secret_hash: row.get("secret_hash")?,
        created_ms: row.get("created_ms")?,
        revoked_ms: row.get("revoked_ms")?,
    })
}

/// The request index of a row (its `req` column), checked against the request count.
pub fn request<R: Get>(row: &R, n: usize, what: &str) -> Result<usize, StoreError> {
    let i: i64 = row.get("req")?;
    usize::try_from(i)
        .ok()
        .filter(|&i| i < n)
        .ok_or_else(|| StoreError::Corrupt(format!("{what}: request {i} out of range")))
}

/// Whether a stored process type (1 compute, 2 graphics, 3 both: the proto
/// `ProcessType` numbers) holds a compute context.
pub(crate) fn is_compute(process_type: i64) -> bool {
    process_type & 1 == 1
}

/// The UUID of `gpu`, for what packed values give back without it.
pub(crate) async fn gpu_uuid<DB: Backend>(
    conn: &mut DB::Connection,
    gpu: GpuId,
) -> Result<String, StoreError> {
    sql::<DB>("read a GPU's UUID", "SELECT uuid FROM gpus WHERE id = $1")
        .bind(gpu.0)
        .one(conn)
        .await?
        .get("uuid")
}
