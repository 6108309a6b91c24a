//! Wire → domain: the validated decoding of a Hello and a batch from an agent.

use super::limits::{
    Check, Invalid, Lazy, Limits, at_most, count, invalid, pct, pct_f32, too_large,
};
use crate::sample::*;
use gpufleet_proto::v1 as pb;
/// Validates and converts a Hello's inventory and labels.
pub fn decode_hello(h: pb::Hello, limits: &Limits) -> Result<(HelloInfo, Inventory), Invalid> {
    let c = Check {
        limits,
        now_ms: i64::MAX / 2,
    };
    count(
        "labels",
        &h.labels.iter().collect::<Vec<_>>(),
        limits.max_labels,
    )?;
    let mut labels = std::collections::BTreeMap::new();
    for (k, v) in h.labels {
        let k = c.string("label key", k)?;
        if k.is_empty() {
            return Err(invalid("label key is empty"));
        }
        let v = c.string(format!("label {k}"), v)?;
        labels.insert(k, v);
    }
    let info = HelloInfo {
        node: c.string("node", h.node)?,
        agent_version: c.string("agent_version", h.agent_version)?,
        boot_id: c.string("boot_id", h.boot_id)?,
        labels,
        interval_ms: h.interval_ms,
        source: c.string("source", h.source)?,
    };
    let inv = h.inventory.unwrap_or_default();
    count("GPUs in inventory", &inv.gpus, limits.max_gpus_per_node)?;
    let host = inv.host.unwrap_or_default();
    let mut gpus = Vec::with_capacity(inv.gpus.len());
    let mut seen = std::collections::HashSet::new();
    for g in inv.gpus {
        let uuid = c.string("gpu uuid", g.uuid)?;
        if uuid.is_empty() {
            return Err(invalid(format!("GPU index {} has an empty uuid", g.index)));
        }
        if !seen.insert(uuid.clone()) {
            return Err(invalid(format!(
                "GPU uuid {uuid} appears twice in the inventory"
            )));
        }
        let what = |f: &str| format!("gpu {uuid}: {f}");
        let mut mig_instances = Vec::with_capacity(g.mig_instances.len());
        for m in g.mig_instances {
            mig_instances.push(MigInstance {
                uuid: c.string(what("mig uuid"), m.uuid)?,
                gpu_instance_id: m.gpu_instance_id,
                compute_instance_id: m.compute_instance_id,
                profile: c.opt_string(what("mig profile"), m.profile)?,
                memory_total_bytes: m.memory_total_bytes,
            });
        }
        gpus.push(GpuInfo {
            index: g.index,
            name: c.string(what("name"), g.name)?,
            serial: c.opt_string(what("serial"), g.serial)?,
            pci_bus_id: c.opt_string(what("pci_bus_id"), g.pci_bus_id)?,
            architecture: c.opt_string(what("architecture"), g.architecture)?,
            brand: c.opt_string(what("brand"), g.brand)?,
            memory_total_bytes: at_most(
                what("memory_total_bytes"),
                g.memory_total_bytes,
                limits.max_mem_bytes,
            )?,
            power_limit_default_mw: at_most(
                what("power_limit_default_mw"),
                g.power_limit_default_mw,
                limits.max_power_mw,
            )?,
            power_limit_enforced_mw: at_most(
                what("power_limit_enforced_mw"),
                g.power_limit_enforced_mw,
                limits.max_power_mw,
            )?,
            power_limit_min_mw: at_most(
                what("power_limit_min_mw"),
                g.power_limit_min_mw,
                limits.max_power_mw,
            )?,
            power_limit_max_mw: at_most(
                what("power_limit_max_mw"),
                g.power_limit_max_mw,
                limits.max_power_mw,
            )?,
            max_clock_sm_mhz: at_most(
                what("max_clock_sm_mhz"),
                g.max_clock_sm_mhz,
                limits.max_clock_mhz,
            )?,
            max_clock_mem_mhz: at_most(
                what("max_clock_mem_mhz"),
                g.max_clock_mem_mhz,
                limits.max_clock_mhz,
            )?,
            max_clock_graphics_mhz: at_most(
                what("max_clock_graphics_mhz"),
                g.max_clock_graphics_mhz,
                limits.max_clock_mhz,
            )?,
            nvlink_count: at_most(
                what("nvlink_count"),
                g.nvlink_count,
                limits.max_nvlinks as u32,
            )?,
            mig_enabled: g.mig_enabled,
            compute_mode: c.opt_string(what("compute_mode"), g.compute_mode)?,
            persistence_mode: g.persistence_mode,
            cuda_capability_major: g.cuda_capability_major,
            cuda_capability_minor: g.cuda_capability_minor,
            pcie_link_gen_max: g.pcie_link_gen_max,
            pcie_link_width_max: g.pcie_link_width_max,
            vbios_version: c.opt_string(what("vbios_version"), g.vbios_version)?,
            mig_instances,
            temp_slowdown_c: at_most(
                what("temp_slowdown_c"),
                g.temp_slowdown_c,
                limits.max_temp_c,
            )?,
            temp_shutdown_c: at_most(
                what("temp_shutdown_c"),
                g.temp_shutdown_c,
                limits.max_temp_c,
            )?,
            temp_gpu_max_c: at_most(what("temp_gpu_max_c"), g.temp_gpu_max_c, limits.max_temp_c)?,
            temp_mem_max_c: at_most(what("temp_mem_max_c"), g.temp_mem_max_c, limits.max_temp_c)?,
            uuid,
        });
    }
    let inventory = Inventory {
        driver_version: c.opt_string("driver_version", inv.driver_version)?,
        cuda_driver_version: c.opt_string("cuda_driver_version", inv.cuda_driver_version)?,
        nvml_version: c.opt_string("nvml_version", inv.nvml_version)?,
        gpus,
        host: HostInfo {
            hostname: c.string("hostname", host.hostname)?,
            kernel: c.opt_string("kernel", host.kernel)?,
            os: c.opt_string("os", host.os)?,
            cpu_count: host.cpu_count,
            memory_total_bytes: host.memory_total_bytes,
        },
    };
    Ok((info, inventory))
}

/// The session facts of a Hello other than the inventory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HelloInfo {
    pub node: String,
    pub agent_version: String,
    pub boot_id: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub interval_ms: u32,
    pub source: String,
}

/// Validates and converts a batch. `known_gpus` is the node's inventory: samples for a GPU
/// the node did not declare are refused (a node can only write its own GPUs).
pub fn decode_batch(
    b: pb::Batch,
    limits: &Limits,
    now_ms: i64,
    known_gpus: &dyn Fn(&str) -> bool,
) -> Result<Batch, Invalid> {
    let c = Check { limits, now_ms };
    if b.seq == 0 {
        return Err(invalid("batch seq must start at 1"));
    }
    if b.ticks.is_empty() {
        return Err(invalid(format!("batch {} has no ticks", b.seq)));
    }
    count("ticks in a batch", &b.ticks, limits.max_ticks_per_batch)?;
    let d = b.delivery.unwrap_or_default();
    let mut ticks = Vec::with_capacity(b.ticks.len());
    let mut last_time = i64::MIN;
    for (i, t) in b.ticks.into_iter().enumerate() {
        let tick = decode_tick(&c, i, t, known_gpus)?;
        if tick.time_ms <= last_time {
            return Err(invalid(format!(
                "tick {i}: time_ms {} is not after the previous tick's {last_time}",
                tick.time_ms
            )));
        }
        last_time = tick.time_ms;
        ticks.push(tick);
    }
    Ok(Batch {
        seq: b.seq,
        ticks,
        delivery: DeliveryStats {
            dropped_samples: d.dropped_samples,
            spool_backlog_batches: d.spool_backlog_batches,
            spool_backlog_bytes: d.spool_backlog_bytes,
        },
    })
}

pub(super) fn decode_tick(
    c: &Check<'_>,
    i: usize,
    t: pb::Tick,
    known_gpus: &dyn Fn(&str) -> bool,
) -> Result<Tick, Invalid> {
    let l = c.limits;
    let time_ms = c.time(format_args!("tick {i}"), t.time_ms)?;
    count(
        format_args!("GPU samples in tick {i}"),
        &t.gpus,
        l.max_gpus_per_node,
    )?;
    count(
        format_args!("processes in tick {i}"),
        &t.processes,
        l.max_processes_per_tick,
    )?;
    count(
        format_args!("events in tick {i}"),
        &t.events,
        l.max_events_per_tick,
    )?;
    count(
        format_args!("health samples in tick {i}"),
        &t.health,
        l.max_gpus_per_node,
    )?;
    // Which GPUs the tick names, checked on borrowed UUIDs before the samples are taken
    // apart (no copy of a UUID per sample).
    {
        let mut seen = std::collections::HashSet::with_capacity(t.gpus.len());
        for g in &t.gpus {
            if !known_gpus(&g.gpu_uuid) {
                return Err(invalid(format!(
                    "tick {i}: gpu {:?} is not in this node's inventory",
                    truncate(&g.gpu_uuid)
                )));
            }
            if !seen.insert(g.gpu_uuid.as_str()) {
                return Err(invalid(format!(
                    "tick {i}: gpu {} sampled twice",
                    g.gpu_uuid
                )));
            }
        }
        let mut seen_health = std::collections::HashSet::with_capacity(t.health.len());
        for h in &t.health {
            if !known_gpus(&h.gpu_uuid) {
                return Err(invalid(format!(
                    "tick {i}: health of gpu {:?}, which is not in this node's inventory",
                    truncate(&h.gpu_uuid)
                )));
            }
            if !seen_health.insert(h.gpu_uuid.as_str()) {
                return Err(invalid(format!(
                    "tick {i}: gpu {} has two health samples",
                    h.gpu_uuid
                )));
            }
            // The agent reads health on a tick that samples the GPU (a lost one: its
            // sample with values absent); the store relies on it (a health row comes
            // with its sample).
            if !seen.contains(h.gpu_uuid.as_str()) {
                return Err(invalid(format!(
                    "tick {i}: health of gpu {} without its GPU sample in the tick",
                    h.gpu_uuid
                )));
            }
        }
    }
    let mut gpus = Vec::with_capacity(t.gpus.len());
    for g in t.gpus {
        gpus.push(decode_gpu(c, i, g)?);
    }
    let mut health = Vec::with_capacity(t.health.len());
    for h in t.health {
        health.push(decode_health(i, h)?);
    }
    let mut processes = Vec::with_capacity(t.processes.len());
    for p in t.processes {
        if !known_gpus(&p.gpu_uuid) {
            return Err(invalid(format!(
                "tick {i}: process {} on gpu {:?}, which is not in this node's inventory",
                p.pid,
                truncate(&p.gpu_uuid)
            )));
        }
        processes.push(decode_process(c, i, p)?);
    }
    let host = t.host.map(|h| -> Result<HostSample, Invalid> {
        let w = |f: &'static str| {
            Lazy(move |o: &mut std::fmt::Formatter<'_>| write!(o, "tick {i}: host {f}"))
        };
        Ok(HostSample {
            cpu_util_pct: pct_f32(w("cpu_util_pct"), h.cpu_util_pct)?,
            mem_used_bytes: at_most(w("mem_used_bytes"), h.mem_used_bytes, l.max_mem_bytes)?,
            mem_total_bytes: at_most(w("mem_total_bytes"), h.mem_total_bytes, l.max_mem_bytes)?,
            disk_read_bps: at_most(w("disk_read_bps"), h.disk_read_bps, l.max_link_bps)?,
            disk_write_bps: at_most(w("disk_write_bps"), h.disk_write_bps, l.max_link_bps)?,
            net_rx_bps: at_most(w("net_rx_bps"), h.net_rx_bps, l.max_link_bps)?,
            net_tx_bps: at_most(w("net_tx_bps"), h.net_tx_bps, l.max_link_bps)?,
            load1: match h.load1 {
                Some(x) if !x.is_finite() || x < 0.0 => {
                    return Err(invalid(w("load1 is negative or not finite").to_string()));
                }
                v => v,
            },
        })
    });
    let mut events = Vec::with_capacity(t.events.len());
    for e in t.events {
        if !e.gpu_uuid.is_empty() && !known_gpus(&e.gpu_uuid) {
            return Err(invalid(format!(
                "tick {i}: event for gpu {:?}, which is not in this node's inventory",
                truncate(&e.gpu_uuid)
            )));
        }
        let kind = match pb::EventKind::try_from(e.kind) {
            Ok(pb::EventKind::Xid) => EventKind::Xid,
            Ok(pb::EventKind::EccDoubleBit) => EventKind::EccDoubleBit,
            Ok(pb::EventKind::EccSingleBit) => EventKind::EccSingleBit,
            Ok(pb::EventKind::GpuLost) => EventKind::GpuLost,
            Ok(pb::EventKind::GpuRecovered) => EventKind::GpuRecovered,
            Ok(pb::EventKind::Throttle) => EventKind::Throttle,
            Ok(pb::EventKind::SpoolDrop) => EventKind::SpoolDrop,
            Ok(pb::EventKind::Unspecified) | Err(_) => {
                return Err(invalid(format!(
                    "tick {i}: event kind {} is unknown",
                    e.kind
                )));
            }
        };
        events.push(Event {
            time_ms: c.time(format_args!("tick {i} event"), e.time_ms)?,
            gpu_uuid: e.gpu_uuid,
            kind,
            code: e.code,
            detail: c.string(format_args!("tick {i}: event detail"), e.detail)?,
        });
    }
    Ok(Tick {
        time_ms,
        gpus,
        processes,
        host: host.transpose()?,
        events,
        health,
        cost: t.cost.map(|c| SamplerCost {
            cpu_us: c.cpu_us,
            wall_us: c.wall_us,
            source_us: c.source_us,
            slowest_calls_us: c
                .slowest_calls_us
                .into_iter()
                .filter(|(k, _)| k.len() <= 64)
                .take(16)
                .collect(),
        }),
        name_failures: (t.name_failures.into_iter())
            .take(MAX_NAME_FAILURES)
            .map(|f| {
                Ok(NameFailures {
                    source: c.string(format_args!("tick {i}: name failure source"), f.source)?,
                    cause: c.string(format_args!("tick {i}: name failure cause"), f.cause)?,
                    count: f.count,
                })
            })
            .collect::<Result<_, Invalid>>()?,
    })
}

/// Most (source, cause) pairs of failed name look-ups kept from a tick: there are three
/// sources and five causes.
const MAX_NAME_FAILURES: usize = 32;

pub(super) fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

pub(super) fn decode_gpu(c: &Check<'_>, i: usize, g: pb::GpuSample) -> Result<GpuSample, Invalid> {
    let l = c.limits;
    let uuid = g.gpu_uuid;
    let u = uuid.as_str();
    let w = |f: &'static str| {
        Lazy(move |o: &mut std::fmt::Formatter<'_>| write!(o, "tick {i}: gpu {u}: {f}"))
    };
    count(w("nvlinks"), &g.nvlinks, l.max_nvlinks)?;
    let mut nvlinks = Vec::with_capacity(g.nvlinks.len());
    for n in g.nvlinks {
        nvlinks.push(NvLinkSample {
            link: n.link,
            tx_bps: at_most(w("nvlink tx_bps"), n.tx_bps, l.max_link_bps)?,
            rx_bps: at_most(w("nvlink rx_bps"), n.rx_bps, l.max_link_bps)?,
        });
    }
    if let (Some(used), Some(total)) = (g.mem_used_bytes, g.mem_total_bytes)
        && used > total
    {
        return Err(invalid(format!(
            "tick {i}: gpu {u}: mem_used_bytes {used} exceeds mem_total_bytes {total}"
        )));
    }
    count(w("mig_gpm"), &g.mig_gpm, MAX_MIG_INSTANCES)?;
    let mut mig_gpm = Vec::with_capacity(g.mig_gpm.len());
    for m in g.mig_gpm {
        let mig_uuid = c.string(w("mig_gpm mig_uuid"), m.mig_uuid)?;
        if mig_uuid.is_empty() || mig_gpm.iter().any(|o: &MigGpm| o.mig_uuid == mig_uuid) {
            return Err(invalid(format!(
                "tick {i}: gpu {u}: mig_gpm mig_uuid {mig_uuid:?} is empty or repeated"
            )));
        }
        let gpm = decode_gpm(&w("mig_gpm"), m.gpm, l)?;
        mig_gpm.push(MigGpm {
            mig_uuid,
            gpu_instance_id: m.gpu_instance_id,
            gpm,
        });
    }
    Ok(GpuSample {
        util_gpu_pct: pct(w("util_gpu_pct"), g.util_gpu_pct)?,
        util_mem_pct: pct(w("util_mem_pct"), g.util_mem_pct)?,
        mem_used_bytes: at_most(w("mem_used_bytes"), g.mem_used_bytes, l.max_mem_bytes)?,
        mem_total_bytes: at_most(w("mem_total_bytes"), g.mem_total_bytes, l.max_mem_bytes)?,
        mem_reserved_bytes: at_most(
            w("mem_reserved_bytes"),
            g.mem_reserved_bytes,
            l.max_mem_bytes,
        )?,
        power_mw: at_most(w("power_mw"), g.power_mw, l.max_power_mw)?,
        power_instant_mw: at_most(w("power_instant_mw"), g.power_instant_mw, l.max_power_mw)?,
        power_limit_mw: at_most(w("power_limit_mw"), g.power_limit_mw, l.max_power_mw)?,
        // mJ since driver load: 5 kW for 10 years is 1.6e15 mJ.
        energy_mj: at_most(w("energy_mj"), g.energy_mj, 1 << 53)?,
        temp_gpu_c: at_most(w("temp_gpu_c"), g.temp_gpu_c, l.max_temp_c)?,
        temp_mem_c: at_most(w("temp_mem_c"), g.temp_mem_c, l.max_temp_c)?,
        fan_pct: at_most(w("fan_pct"), g.fan_pct, 100)?,
        clock_sm_mhz: at_most(w("clock_sm_mhz"), g.clock_sm_mhz, l.max_clock_mhz)?,
        clock_mem_mhz: at_most(w("clock_mem_mhz"), g.clock_mem_mhz, l.max_clock_mhz)?,
        clock_graphics_mhz: at_most(
            w("clock_graphics_mhz"),
            g.clock_graphics_mhz,
            l.max_clock_mhz,
        )?,
        pstate: at_most(w("pstate"), g.pstate, 15)?,
        pcie_tx_bps: at_most(w("pcie_tx_bps"), g.pcie_tx_bps, l.max_link_bps)?,
        pcie_rx_bps: at_most(w("pcie_rx_bps"), g.pcie_rx_bps, l.max_link_bps)?,
        nvlink_tx_bps: at_most(w("nvlink_tx_bps"), g.nvlink_tx_bps, l.max_link_bps)?,
        nvlink_rx_bps: at_most(w("nvlink_rx_bps"), g.nvlink_rx_bps, l.max_link_bps)?,
        nvlinks,
        ecc_corrected_volatile: g.ecc_corrected_volatile,
        ecc_uncorrected_volatile: g.ecc_uncorrected_volatile,
        throttle_reasons: g.throttle_reasons,
        enc_util_pct: pct(w("enc_util_pct"), g.enc_util_pct)?,
        dec_util_pct: pct(w("dec_util_pct"), g.dec_util_pct)?,
        gpm: decode_gpm(&w("gpm"), g.gpm, l)?,
        mig_gpm,
        gpu_uuid: uuid,
    })
}

/// Most MIG instances a GPU has (an H100 / H200 makes at most 7).
const MAX_MIG_INSTANCES: usize = 8;
/// A GPM activity is at most 100 %, in hundredths.
const MAX_CPCT: u32 = 10_000;

/// GPM metrics: activities at most 100 %, rates at most a link's plausible maximum.
fn decode_gpm(
    what: &dyn std::fmt::Display,
    g: Option<pb::GpmMetrics>,
    l: &Limits,
) -> Result<GpmMetrics, Invalid> {
    let Some(g) = g else {
        return Ok(GpmMetrics::default());
    };
    let cp = |f: &'static str, v: Option<u32>| at_most(format_args!("{what} {f}"), v, MAX_CPCT);
    let bps =
        |f: &'static str, v: Option<u64>| at_most(format_args!("{what} {f}"), v, l.max_link_bps);
    Ok(GpmMetrics {
        sm_active_cpct: cp("sm_active_cpct", g.sm_active_cpct)?,
        sm_occupancy_cpct: cp("sm_occupancy_cpct", g.sm_occupancy_cpct)?,
        tensor_active_cpct: cp("tensor_active_cpct", g.tensor_active_cpct)?,
        tensor_hmma_cpct: cp("tensor_hmma_cpct", g.tensor_hmma_cpct)?,
        tensor_imma_cpct: cp("tensor_imma_cpct", g.tensor_imma_cpct)?,
        tensor_dfma_cpct: cp("tensor_dfma_cpct", g.tensor_dfma_cpct)?,
        dram_bw_cpct: cp("dram_bw_cpct", g.dram_bw_cpct)?,
        fp64_cpct: cp("fp64_cpct", g.fp64_cpct)?,
        fp32_cpct: cp("fp32_cpct", g.fp32_cpct)?,
        fp16_cpct: cp("fp16_cpct", g.fp16_cpct)?,
        pcie_tx_bps: bps("pcie_tx_bps", g.pcie_tx_bps)?,
        pcie_rx_bps: bps("pcie_rx_bps", g.pcie_rx_bps)?,
        nvlink_tx_bps: bps("nvlink_tx_bps", g.nvlink_tx_bps)?,
        nvlink_rx_bps: bps("nvlink_rx_bps", g.nvlink_rx_bps)?,
    })
}

/// Health counters are cumulative counts, accepted at most 2^53: past it is no real count
/// (and would not survive a JSON number exactly).
const MAX_HEALTH_COUNT: u64 = 1 << 53;
/// NVML retires at most a few hundred pages and remaps a few rows per bank; a million of
/// either is garbage.
const MAX_HEALTH_ROWS: u32 = 1_000_000;

pub(super) fn decode_health(i: usize, h: pb::GpuHealthSample) -> Result<GpuHealthSample, Invalid> {
    let uuid = h.gpu_uuid;
    let u = uuid.as_str();
    let w = |f: &'static str| {
        Lazy(move |o: &mut std::fmt::Formatter<'_>| write!(o, "tick {i}: gpu {u} health: {f}"))
    };
    let rows = |f: &'static str, v: Option<u32>| at_most(w(f), v, MAX_HEALTH_ROWS);
    let counter = |f: &'static str, v: Option<u64>| at_most(w(f), v, MAX_HEALTH_COUNT);
    Ok(GpuHealthSample {
        retired_pages_sbe: rows("retired_pages_sbe", h.retired_pages_sbe)?,
        retired_pages_dbe: rows("retired_pages_dbe", h.retired_pages_dbe)?,
        retired_pages_pending: h.retired_pages_pending,
        remapped_rows_correctable: rows("remapped_rows_correctable", h.remapped_rows_correctable)?,
        remapped_rows_uncorrectable: rows(
            "remapped_rows_uncorrectable",
            h.remapped_rows_uncorrectable,
        )?,
        remapped_rows_pending: h.remapped_rows_pending,
        remapped_rows_failed: h.remapped_rows_failed,
        ecc_corrected_aggregate: counter("ecc_corrected_aggregate", h.ecc_corrected_aggregate)?,
        ecc_uncorrected_aggregate: counter(
            "ecc_uncorrected_aggregate",
            h.ecc_uncorrected_aggregate,
        )?,
        pcie_replay_count: counter("pcie_replay_count", h.pcie_replay_count)?,
        nvlink_crc_errors: counter("nvlink_crc_errors", h.nvlink_crc_errors)?,
        nvlink_replay_errors: counter("nvlink_replay_errors", h.nvlink_replay_errors)?,
        nvlink_recovery_errors: counter("nvlink_recovery_errors", h.nvlink_recovery_errors)?,
        persistence_mode: h.persistence_mode,
        gpu_uuid: uuid,
    })
}

pub(super) fn decode_process(
    c: &Check<'_>,
    i: usize,
    p: pb::ProcessSample,
) -> Result<ProcessSample, Invalid> {
    let l = c.limits;
    let pid = p.pid;
    let w = |f: &'static str| {
        Lazy(move |o: &mut std::fmt::Formatter<'_>| write!(o, "tick {i}: process {pid}: {f}"))
    };
    let process_type = match pb::ProcessType::try_from(p.r#type) {
        Ok(pb::ProcessType::Graphics) => ProcessType::Graphics,
        Ok(pb::ProcessType::ComputeAndGraphics) => ProcessType::ComputeAndGraphics,
        _ => ProcessType::Compute,
    };
    let pw = p.workload.unwrap_or_default();
    let kind = match pb::WorkloadKind::try_from(pw.kind) {
        Ok(pb::WorkloadKind::Container) => WorkloadKind::Container,
        Ok(pb::WorkloadKind::Slurm) => WorkloadKind::Slurm,
        _ => WorkloadKind::Host,
    };
    let workload = Workload {
        kind,
        runtime: c.string(w("runtime"), pw.runtime)?,
        container_id: c.opt_string(w("container_id"), pw.container_id)?,
        pod_uid: c.opt_string(w("pod_uid"), pw.pod_uid)?,
        qos: c.opt_string(w("qos"), pw.qos)?,
        job_id: c.opt_string(w("job_id"), pw.job_id)?,
        step: c.opt_string(w("step"), pw.step)?,
        unit: c.opt_string(w("unit"), pw.unit)?,
        uid: pw.uid,
        container_name: c.opt_string(w("container_name"), pw.container_name)?,
        image: c.opt_string(w("image"), pw.image)?,
        pod_name: c.opt_string(w("pod_name"), pw.pod_name)?,
        namespace: c.opt_string(w("namespace"), pw.namespace)?,
        job_name: c.opt_string(w("job_name"), pw.job_name)?,
        account: c.opt_string(w("account"), pw.account)?,
        partition: c.opt_string(w("partition"), pw.partition)?,
        job_user: c.opt_string(w("job_user"), pw.job_user)?,
        array_task: c.opt_string(w("array_task"), pw.array_task)?,
        het_component: c.opt_string(w("het_component"), pw.het_component)?,
        labels: workload_labels(c, w, pw.labels)?,
    };
    Ok(ProcessSample {
        process_type,
        user: c.opt_string(w("user"), p.user)?,
        command: c.opt_string(w("command"), p.command)?,
        gpu_mem_bytes: at_most(w("gpu_mem_bytes"), p.gpu_mem_bytes, l.max_mem_bytes)?,
        sm_util_pct: pct(w("sm_util_pct"), p.sm_util_pct)?,
        mem_util_pct: pct(w("mem_util_pct"), p.mem_util_pct)?,
        enc_util_pct: pct(w("enc_util_pct"), p.enc_util_pct)?,
        dec_util_pct: pct(w("dec_util_pct"), p.dec_util_pct)?,
        workload,
        mig_uuid: c.opt_string(w("mig_uuid"), p.mig_uuid)?,
        gpu_uuid: p.gpu_uuid,
        pid: p.pid,
    })
}

/// A workload's labels: at most `max_labels`, keys and values checked as every string.
fn workload_labels<D: std::fmt::Display>(
    c: &Check<'_>,
    what: impl Fn(&'static str) -> D,
    labels: std::collections::HashMap<String, String>,
) -> Result<std::collections::BTreeMap<String, String>, Invalid> {
    if labels.len() > c.limits.max_labels {
        return Err(too_large(format!(
            "{}: {} labels, limit {}",
            what("labels"),
            labels.len(),
            c.limits.max_labels
        )));
    }
    let mut out = std::collections::BTreeMap::new();
    for (k, v) in labels {
        let k = c.string(what("label key"), k)?;
        if k.is_empty() {
            return Err(invalid(format!("{} is empty", what("label key"))));
        }
        let v = c.string(what("label value"), v)?;
        out.insert(k, v);
    }
    Ok(out)
}
