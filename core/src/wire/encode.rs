//! Domain → wire: infallible conversions into the prost messages the agent sends.

use crate::sample::*;
use gpufleet_proto::v1 as pb;

/// Copies the same-named fields of `$src` into a new wire message `pb::$T`, plus the listed extra fields.
macro_rules! same_fields {
    ($src:expr => $T:ident { $($f:ident),* $(,)? } $(; $($extra:ident : $val:expr),* $(,)?)?) => {
        pb::$T { $($f: $src.$f,)* $($($extra: $val,)*)? }
    };
}

impl From<Inventory> for pb::Inventory {
    fn from(i: Inventory) -> Self {
        pb::Inventory {
            driver_version: i.driver_version,
            cuda_driver_version: i.cuda_driver_version,
            nvml_version: i.nvml_version,
            gpus: i.gpus.into_iter().map(Into::into).collect(),
            host: Some(same_fields!(i.host => HostInfo {
                hostname, kernel, os, cpu_count, memory_total_bytes
            })),
        }
    }
}

impl From<GpuInfo> for pb::GpuInfo {
    fn from(g: GpuInfo) -> Self {
        let mig = g.mig_instances.into_iter().map(|m| {
            same_fields!(m => MigInstance {
                uuid, gpu_instance_id, compute_instance_id, profile, memory_total_bytes
            })
        });
        same_fields!(g => GpuInfo {
            index, uuid, name, serial, pci_bus_id, architecture, brand, memory_total_bytes,
            power_limit_default_mw, power_limit_enforced_mw, power_limit_min_mw,
            power_limit_max_mw, max_clock_sm_mhz, max_clock_mem_mhz, max_clock_graphics_mhz,
            nvlink_count, mig_enabled, compute_mode, persistence_mode, cuda_capability_major,
            cuda_capability_minor, pcie_link_gen_max, pcie_link_width_max, vbios_version,
            temp_slowdown_c, temp_shutdown_c, temp_gpu_max_c, temp_mem_max_c,
        }; mig_instances: mig.collect())
    }
}

impl From<Batch> for pb::Batch {
    fn from(b: Batch) -> Self {
        pb::Batch {
            seq: b.seq,
            ticks: b.ticks.into_iter().map(Into::into).collect(),
            delivery: Some(same_fields!(b.delivery => DeliveryStats {
                dropped_samples, spool_backlog_batches, spool_backlog_bytes
            })),
        }
    }
}

impl From<Tick> for pb::Tick {
    fn from(t: Tick) -> Self {
        pb::Tick {
            time_ms: t.time_ms,
            gpus: t.gpus.into_iter().map(Into::into).collect(),
            processes: t.processes.into_iter().map(Into::into).collect(),
            host: t.host.map(|h| {
                same_fields!(h => HostSample {
                    cpu_util_pct, mem_used_bytes, mem_total_bytes, disk_read_bps,
                    disk_write_bps, net_rx_bps, net_tx_bps, load1,
                })
            }),
            events: t.events.into_iter().map(Into::into).collect(),
            cost: t.cost.map(|c| {
                same_fields!(c => SamplerCost { cpu_us, wall_us, source_us };
                    slowest_calls_us: c.slowest_calls_us.into_iter().collect())
            }),
            health: t.health.into_iter().map(Into::into).collect(),
            name_failures: (t.name_failures.into_iter())
                .map(|f| same_fields!(f => NameFailures { source, cause, count }))
                .collect(),
        }
    }
}

impl From<GpuSample> for pb::GpuSample {
    fn from(g: GpuSample) -> Self {
        let links = g
            .nvlinks
            .into_iter()
            .map(|l| same_fields!(l => NvLinkSample { link, tx_bps, rx_bps }));
        same_fields!(g => GpuSample {
            gpu_uuid, util_gpu_pct, util_mem_pct, mem_used_bytes, mem_total_bytes,
            mem_reserved_bytes, power_mw, power_instant_mw, power_limit_mw, energy_mj,
            temp_gpu_c, temp_mem_c, fan_pct, clock_sm_mhz, clock_mem_mhz, clock_graphics_mhz,
            pstate, pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps,
            ecc_corrected_volatile, ecc_uncorrected_volatile, throttle_reasons, enc_util_pct,
            dec_util_pct,
        }; nvlinks: links.collect(), gpm: gpm_pb(g.gpm), mig_gpm: g.mig_gpm.into_iter().map(|m| {
            same_fields!(m => MigGpm { mig_uuid, gpu_instance_id }; gpm: gpm_pb(m.gpm))
        }).collect())
    }
}

/// GPM metrics on the wire: none present sends no message.
fn gpm_pb(g: GpmMetrics) -> Option<pb::GpmMetrics> {
    (!g.is_empty()).then_some({
        same_fields!(g => GpmMetrics {
            sm_active_cpct, sm_occupancy_cpct, tensor_active_cpct, tensor_hmma_cpct,
            tensor_imma_cpct, tensor_dfma_cpct, dram_bw_cpct, fp64_cpct, fp32_cpct, fp16_cpct,
            pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps,
        })
    })
}

impl From<GpuHealthSample> for pb::GpuHealthSample {
    fn from(h: GpuHealthSample) -> Self {
        same_fields!(h => GpuHealthSample {
            gpu_uuid, retired_pages_sbe, retired_pages_dbe, retired_pages_pending,
            remapped_rows_correctable, remapped_rows_uncorrectable, remapped_rows_pending,
            remapped_rows_failed, ecc_corrected_aggregate, ecc_uncorrected_aggregate,
            pcie_replay_count, nvlink_crc_errors, nvlink_replay_errors, nvlink_recovery_errors,
            persistence_mode,
        })
    }
}

impl From<ProcessSample> for pb::ProcessSample {
    fn from(p: ProcessSample) -> Self {
        let process_type = match p.process_type {
            ProcessType::Compute => pb::ProcessType::Compute,
            ProcessType::Graphics => pb::ProcessType::Graphics,
            ProcessType::ComputeAndGraphics => pb::ProcessType::ComputeAndGraphics,
        };
        let w = p.workload;
        let kind = match w.kind {
            WorkloadKind::Host => pb::WorkloadKind::Host,
            WorkloadKind::Container => pb::WorkloadKind::Container,
            WorkloadKind::Slurm => pb::WorkloadKind::Slurm,
        };
        let workload = same_fields!(w => Workload {
            runtime, container_id, pod_uid, qos, job_id, step, unit, uid, container_name,
            image, pod_name, namespace, job_name, account, partition, job_user, array_task,
            het_component,
        }; kind: kind as i32, labels: w.labels.into_iter().collect());
        same_fields!(p => ProcessSample {
            gpu_uuid, pid, user, command, gpu_mem_bytes, sm_util_pct, mem_util_pct,
            enc_util_pct, dec_util_pct, mig_uuid,
        }; r#type: process_type as i32, workload: Some(workload))
    }
}

impl From<Event> for pb::Event {
    fn from(e: Event) -> Self {
        let kind = match e.kind {
            EventKind::Xid => pb::EventKind::Xid,
            EventKind::EccDoubleBit => pb::EventKind::EccDoubleBit,
            EventKind::EccSingleBit => pb::EventKind::EccSingleBit,
            EventKind::GpuLost => pb::EventKind::GpuLost,
            EventKind::GpuRecovered => pb::EventKind::GpuRecovered,
            EventKind::Throttle => pb::EventKind::Throttle,
            EventKind::SpoolDrop => pb::EventKind::SpoolDrop,
        };
        same_fields!(e => Event { time_ms, gpu_uuid, code, detail }; kind: kind as i32)
    }
}
