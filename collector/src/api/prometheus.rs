//! `/metrics`: the Prometheus text exposition (format 0.0.4), rendered from the live state
//! and the collector's own counters. Nothing here queries the store.
//!
//! - GPU families carry labels `node`, `gpu` (index), `uuid`, `name`; host families `node`.
//!   A metric the GPU did not report is not emitted (absent is not zero), and nodes that
//!   are `offline` emit no GPU or host samples, so a dead node's last values do not look
//!   current. Node families (`gpufleet_node_*`) are emitted for every node.
//! - Units are Prometheus base units: ratios 0..1, watts, joules, bytes, hertz, seconds.

use crate::api::router::AppState;
use crate::ingest::writer::WriterHandle;
use crate::live::state::{LiveNode, LiveState};
use crate::live::status::{NodeStatus, StatusPolicy};
use crate::metrics::{COMMIT_BUCKETS, Metrics};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use gpufleet_core::{GpuSample, HostSample, UnixMs};
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;

type GpuValue = fn(&GpuSample) -> Option<f64>;

fn pct(v: Option<u32>) -> Option<f64> {
    v.map(|v| f64::from(v) / 100.0)
}

fn milli(v: Option<u32>) -> Option<f64> {
    v.map(|v| f64::from(v) / 1000.0)
}

fn mhz(v: Option<u32>) -> Option<f64> {
    v.map(|v| f64::from(v) * 1e6)
}

fn num(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

/// Per-GPU families: name, type, help, value.
const GPU_FAMILIES: &[(&str, &str, &str, GpuValue)] = &[
    (
        "gpufleet_gpu_utilization_ratio",
        "gauge",
        "GPU (SM) utilization, 0..1.",
        |s| pct(s.util_gpu_pct),
    ),
    (
        "gpufleet_gpu_memory_utilization_ratio",
        "gauge",
        "Memory controller utilization, 0..1.",
        |s| pct(s.util_mem_pct),
    ),
    (
        "gpufleet_gpu_memory_used_bytes",
        "gauge",
        "GPU memory in use.",
        |s| num(s.mem_used_bytes),
    ),
    (
        "gpufleet_gpu_memory_total_bytes",
        "gauge",
        "GPU memory in total.",
        |s| num(s.mem_total_bytes),
    ),
    (
        "gpufleet_gpu_power_watts",
        "gauge",
        "Power draw as NVML reports it (a 1 s average on Ampere and newer).",
        |s| milli(s.power_mw),
    ),
    (
        "gpufleet_gpu_power_instant_watts",
        "gauge",
        "Instantaneous power draw.",
        |s| milli(s.power_instant_mw),
    ),
    (
        "gpufleet_gpu_power_limit_watts",
        "gauge",
        "Enforced power limit.",
        |s| milli(s.power_limit_mw),
    ),
    (
        "gpufleet_gpu_energy_joules_total",
        "counter",
        "Energy since the driver loaded (resets with it).",
        |s| s.energy_mj.map(|v| v as f64 / 1000.0),
    ),
    (
        "gpufleet_gpu_temperature_celsius",
        "gauge",
        "GPU temperature.",
        |s| s.temp_gpu_c.map(f64::from),
    ),
    (
        "gpufleet_gpu_memory_temperature_celsius",
        "gauge",
        "Memory temperature.",
        |s| s.temp_mem_c.map(f64::from),
    ),
    (
        "gpufleet_gpu_fan_speed_ratio",
        "gauge",
        "Fan speed, 0..1.",
        |s| pct(s.fan_pct),
    ),
    ("gpufleet_gpu_sm_clock_hertz", "gauge", "SM clock.", |s| {
        mhz(s.clock_sm_mhz)
    }),
    (
        "gpufleet_gpu_memory_clock_hertz",
        "gauge",
        "Memory clock.",
        |s| mhz(s.clock_mem_mhz),
    ),
    (
        "gpufleet_gpu_graphics_clock_hertz",
        "gauge",
        "Graphics clock.",
        |s| mhz(s.clock_graphics_mhz),
    ),
    (
        "gpufleet_gpu_pstate",
        "gauge",
        "Performance state (0 = P0, fastest).",
        |s| s.pstate.map(f64::from),
    ),
    (
        "gpufleet_gpu_pcie_transmit_bytes_per_second",
        "gauge",
        "PCIe transmit throughput.",
        |s| num(s.pcie_tx_bps),
    ),
    (
        "gpufleet_gpu_pcie_receive_bytes_per_second",
        "gauge",
        "PCIe receive throughput.",
        |s| num(s.pcie_rx_bps),
    ),
    (
        "gpufleet_gpu_nvlink_transmit_bytes_per_second",
        "gauge",
        "NVLink transmit throughput, all links.",
        |s| num(s.nvlink_tx_bps),
    ),
    (
        "gpufleet_gpu_nvlink_receive_bytes_per_second",
        "gauge",
        "NVLink receive throughput, all links.",
        |s| num(s.nvlink_rx_bps),
    ),
    (
        "gpufleet_gpu_ecc_corrected_errors",
        "gauge",
        "Volatile corrected ECC errors (since the driver loaded).",
        |s| num(s.ecc_corrected_volatile),
    ),
    (
        "gpufleet_gpu_ecc_uncorrected_errors",
        "gauge",
        "Volatile uncorrected ECC errors (since the driver loaded).",
        |s| num(s.ecc_uncorrected_volatile),
    ),
    (
        "gpufleet_gpu_throttle_reasons",
        "gauge",
        "NVML clock event (throttle) reason bit mask.",
        |s| num(s.throttle_reasons),
    ),
    (
        "gpufleet_gpu_encoder_utilization_ratio",
        "gauge",
        "Video encoder utilization, 0..1.",
        |s| pct(s.enc_util_pct),
    ),
    (
        "gpufleet_gpu_decoder_utilization_ratio",
        "gauge",
        "Video decoder utilization, 0..1.",
        |s| pct(s.dec_util_pct),
    ),
];

type HostValue = fn(&HostSample) -> Option<f64>;

const HOST_FAMILIES: &[(&str, &str, HostValue)] = &[
    (
        "gpufleet_host_cpu_utilization_ratio",
        "CPU utilization over the last interval, all CPUs, 0..1.",
        |h| h.cpu_util_pct.map(|v| f64::from(v) / 100.0),
    ),
    (
        "gpufleet_host_memory_used_bytes",
        "Host memory in use.",
        |h| num(h.mem_used_bytes),
    ),
    (
        "gpufleet_host_memory_total_bytes",
        "Host memory in total.",
        |h| num(h.mem_total_bytes),
    ),
    (
        "gpufleet_host_disk_read_bytes_per_second",
        "Disk read throughput.",
        |h| num(h.disk_read_bps),
    ),
    (
        "gpufleet_host_disk_write_bytes_per_second",
        "Disk write throughput.",
        |h| num(h.disk_write_bps),
    ),
    (
        "gpufleet_host_network_receive_bytes_per_second",
        "Network receive throughput.",
        |h| num(h.net_rx_bps),
    ),
    (
        "gpufleet_host_network_transmit_bytes_per_second",
        "Network transmit throughput.",
        |h| num(h.net_tx_bps),
    ),
    ("gpufleet_host_load1", "One-minute load average.", |h| {
        h.load1.map(f64::from)
    }),
];

type NodeValue = fn(&LiveNode) -> Option<f64>;

const NODE_FAMILIES: &[(&str, &str, &str, NodeValue)] = &[
    (
        "gpufleet_node_last_seen_timestamp_seconds",
        "gauge",
        "Time of the newest sample stored for the node (agent clock).",
        |n| n.record.last_seen_ms.map(|t| t as f64 / 1000.0),
    ),
    (
        "gpufleet_node_connected",
        "gauge",
        "1 while the node has an open ingest stream to this collector.",
        |n| Some(f64::from(u8::from(n.connections > 0))),
    ),
    (
        "gpufleet_node_dropped_samples_total",
        "counter",
        "GPU samples the agent dropped because its spool was full.",
        |n| Some(n.record.delivery.dropped_samples as f64),
    ),
    (
        "gpufleet_node_spool_backlog_batches",
        "gauge",
        "Batches in the agent's spool not yet acknowledged.",
        |n| Some(n.record.delivery.spool_backlog_batches as f64),
    ),
    (
        "gpufleet_node_spool_backlog_bytes",
        "gauge",
        "Bytes in the agent's spool not yet acknowledged.",
        |n| Some(n.record.delivery.spool_backlog_bytes as f64),
    ),
    (
        "gpufleet_node_rejected_batches_total",
        "counter",
        "Batches from the node refused as invalid since the collector started.",
        |n| Some(n.rejected_batches as f64),
    ),
    (
        "gpufleet_node_stored_gpu_samples",
        "gauge",
        "GPU samples stored for the node.",
        |n| Some(n.record.stored_samples as f64),
    ),
];

/// Renders the exposition at `now_ms`; `writer_queued` is the writer's queue depth.
pub fn render(
    state: &LiveState,
    metrics: &Metrics,
    policy: &StatusPolicy,
    now_ms: UnixMs,
    writer_queued: usize,
) -> String {
    let mut out = String::with_capacity(4096 + state.nodes.len() * 4096);
    let statuses: Vec<(&LiveNode, NodeStatus)> = state
        .nodes
        .values()
        .map(|n| (n, policy.classify(n.record.last_seen_ms, now_ms)))
        .collect();

    family(
        &mut out,
        "gpufleet_node_up",
        "gauge",
        "1 if the node is online (newest sample within --stale-after).",
    );
    for (n, status) in &statuses {
        let up = f64::from(u8::from(*status == NodeStatus::Online));
        sample(
            &mut out,
            "gpufleet_node_up",
            &[("node", &n.record.name)],
            up,
        );
    }
    family(
        &mut out,
        "gpufleet_node_status",
        "gauge",
        "1 for the node's current status (online, stale, offline), 0 for the others.",
    );
    for (n, status) in &statuses {
        for s in NodeStatus::ALL {
            let v = f64::from(u8::from(*status == s));
            sample(
                &mut out,
                "gpufleet_node_status",
                &[("node", &n.record.name), ("status", s.as_str())],
                v,
            );
        }
    }
    for (name, kind, help, value) in NODE_FAMILIES {
        family(&mut out, name, kind, help);
        for (n, _) in &statuses {
            if let Some(v) = value(n) {
                sample(&mut out, name, &[("node", &n.record.name)], v);
            }
        }
    }

    let current: Vec<&LiveNode> = statuses
        .iter()
        .filter(|(_, s)| *s != NodeStatus::Offline)
        .map(|(n, _)| *n)
        .collect();
    for (name, kind, help, value) in GPU_FAMILIES {
        family(&mut out, name, kind, help);
        for n in &current {
            for g in &n.record.gpus {
                let Some(latest) = n.gpus.get(&g.id) else {
                    continue;
                };
                if let Some(v) = value(&latest.sample) {
                    let index = g.info.index.to_string();
                    let labels = [
                        ("node", n.record.name.as_str()),
                        ("gpu", &index),
                        ("uuid", &g.info.uuid),
                        ("name", &g.info.name),
                    ];
                    sample(&mut out, name, &labels, v);
                }
            }
        }
    }
    for (name, help, value) in HOST_FAMILIES {
        family(&mut out, name, "gauge", help);
        for n in &current {
            if let Some(v) = n
                .host
                .as_ref()
                .and_then(|h| h.sample.as_ref())
                .and_then(value)
            {
                sample(&mut out, name, &[("node", &n.record.name)], v);
            }
        }
    }

    type Counter<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], u64);
    let counters: [Counter<'_>; 9] = [
        (
            "gpufleet_collector_batches_acked_total",
            "Batches acknowledged (committed).",
            &[],
            metrics.batches_acked.load(Relaxed),
        ),
        (
            "gpufleet_collector_batches_rejected_total",
            "Batches refused, by reason.",
            &[("reason", "invalid")],
            metrics.batches_rejected_invalid.load(Relaxed),
        ),
        (
            "gpufleet_collector_batches_rejected_total",
            "",
            &[("reason", "too_large")],
            metrics.batches_rejected_too_large.load(Relaxed),
        ),
        (
            "gpufleet_collector_batches_rejected_total",
            "",
            &[("reason", "unavailable")],
            metrics.batches_rejected_unavailable.load(Relaxed),
        ),
        (
            "gpufleet_collector_batches_rejected_total",
            "",
            &[("reason", "conflict")],
            metrics.batches_rejected_conflict.load(Relaxed),
        ),
        (
            "gpufleet_collector_batches_rejected_total",
            "",
            &[("reason", "seq_out_of_range")],
            metrics.batches_rejected_seq.load(Relaxed),
        ),
        (
            "gpufleet_collector_gpu_samples_ingested_total",
            "GPU samples newly stored (replays excluded).",
            &[],
            metrics.gpu_samples_ingested.load(Relaxed),
        ),
        (
            "gpufleet_collector_commits_total",
            "Transactions committed by the group-commit writer.",
            &[],
            metrics.commits.load(Relaxed),
        ),
        (
            "gpufleet_collector_commit_failures_total",
            "Transactions that failed.",
            &[],
            metrics.commit_failures.load(Relaxed),
        ),
    ];
    for (name, help, labels, v) in counters {
        if !help.is_empty() {
            family(&mut out, name, "counter", help);
        }
        sample(&mut out, name, labels, v as f64);
    }
    family(
        &mut out,
        "gpufleet_collector_streams_active",
        "gauge",
        "Ingest streams open now.",
    );
    sample(
        &mut out,
        "gpufleet_collector_streams_active",
        &[],
        metrics.streams_active.load(Relaxed) as f64,
    );
    family(
        &mut out,
        "gpufleet_collector_writer_queue_batches",
        "gauge",
        "Batches waiting for the group-commit writer.",
    );
    sample(
        &mut out,
        "gpufleet_collector_writer_queue_batches",
        &[],
        writer_queued as f64,
    );

    let jobs = metrics.leading();
    if !jobs.is_empty() {
        family(
            &mut out,
            "gpufleet_collector_job_leader",
            "gauge",
            "1 if this collector runs the background job now (it holds the job's lease).",
        );
        for (job, leading) in jobs {
            sample(
                &mut out,
                "gpufleet_collector_job_leader",
                &[("job", job)],
                f64::from(u8::from(leading)),
            );
        }
    }

    let h = "gpufleet_collector_commit_duration_seconds";
    family(
        &mut out,
        h,
        "histogram",
        "Time to write and commit one group of batches.",
    );
    let bucket = format!("{h}_bucket");
    for (bound, count) in COMMIT_BUCKETS.iter().zip(&metrics.commit_buckets) {
        sample(
            &mut out,
            &bucket,
            &[("le", &bound.to_string())],
            count.load(Relaxed) as f64,
        );
    }
    let commits = metrics.commits.load(Relaxed) as f64;
    sample(&mut out, &bucket, &[("le", "+Inf")], commits);
    let sum = metrics.commit_micros_sum.load(Relaxed) as f64 / 1e6;
    sample(&mut out, &format!("{h}_sum"), &[], sum);
    sample(&mut out, &format!("{h}_count"), &[], commits);
    crate::remote_write::render(&metrics.remote_write, &mut out);
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            escape_label(out, v);
            out.push('"');
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// Escapes a label value: backslash, double quote and line feed.
fn escape_label(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// `GET /metrics`: the exposition, rendered under the live state's read lock.
pub(crate) async fn metrics(State(st): State<AppState>) -> Response {
    let now = (st.clock)();
    let queued = st.writer.as_ref().map_or(0, WriterHandle::queued);
    let body = st
        .live
        .read(|s| render(s, &st.metrics, &st.status, now, queued));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = String::new();
        sample(&mut out, "m", &[("node", "a\"b\\c\nd")], 1.5);
        assert_eq!(out, "m{node=\"a\\\"b\\\\c\\nd\"} 1.5\n");
    }
}
