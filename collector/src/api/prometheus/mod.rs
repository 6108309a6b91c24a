//! `/metrics`: the OpenMetrics exposition (`application/openmetrics-text`, ending in
//! `# EOF`), encoded by `prometheus-client` from a [`snapshot::Snapshot`] taken under the
//! live state's read lock and encoded after it is released. Nothing here queries the
//! store: the per-workload counters come from [`crate::accounting::counters`], refreshed
//! in the background.
//!
//! - GPU families carry labels `node`, `gpu` (index), `uuid`, `name`; host families `node`.
//!   A metric the GPU did not report is not emitted (absent is not zero), and nodes that
//!   are `offline` emit no GPU, host or process samples, so a dead node's last values do
//!   not look current. Node families (`gpufleet_node_*`) are emitted for every node.
//! - Workload families (`gpufleet_workload_*`, `gpufleet_process_*`) carry `node`,
//!   `workload` (its key), `kind`, `namespace`, `pod`, `container`, `job`, `user`
//!   (process families also `gpu`), at most `--metrics-max-workloads` series each; the
//!   rest are counted in `gpufleet_metrics_series_dropped_total{family}`.
//! - Units are Prometheus base units: ratios 0..1, watts, joules, bytes, hertz, seconds.
//!
//! Other parts of the collector add families with [`render`]'s `extra` hook (a function
//! that registers a collector on the [`Registry`]).

pub mod connections;
pub mod snapshot;

use crate::accounting::counters::WorkloadLabels;
use crate::api::state::AppState;
use crate::families::{GPU_FAMILIES, MIG_GPM_FAMILIES, Num, num, value};
use crate::ingest::writer::WriterHandle;
use crate::live::status::NodeStatus;
use crate::metrics::COMMIT_BUCKETS;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use gpufleet_core::HostSample;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelValueEncoder, MetricEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use snapshot::{CollectorSnap, NodeSnap, Snapshot};
use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A label value, escaped as the text format requires (backslash, double quote, line
/// feed): `prometheus-client` writes `&str` values as they are, and node, GPU and
/// workload names come from agents.
#[derive(Debug, Clone, Copy)]
pub struct Text<'a>(pub &'a str);

impl EncodeLabelValue for Text<'_> {
    fn encode(&self, e: &mut LabelValueEncoder) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['\\', '"', '\n']) {
            e.write_str(&rest[..i])?;
            e.write_str(match rest.as_bytes()[i] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[i + 1..];
        }
        e.write_str(rest)
    }
}

/// A workload's label pairs, in exposition order.
pub fn workload_pairs(l: &WorkloadLabels) -> [(&'static str, Text<'_>); 10] {
    [
        ("node", Text(&l.node)),
        ("workload", Text(&l.workload)),
        ("kind", Text(l.kind)),
        ("namespace", Text(&l.namespace)),
        ("pod", Text(&l.pod)),
        ("container", Text(&l.container)),
        ("job", Text(&l.job)),
        ("job_name", Text(&l.job_name)),
        ("account", Text(&l.account)),
        ("user", Text(&l.user)),
    ]
}

type HostValue = fn(&HostSample) -> Option<Num>;

const HOST_FAMILIES: &[(&str, &str, HostValue)] = &[
    (
        "gpufleet_host_cpu_utilization_ratio",
        "CPU utilization over the last interval, all CPUs, 0..1.",
        |h| h.cpu_util_pct.map(|v| Num::F(f64::from(v) / 100.0)),
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
        h.load1.map(|v| Num::F(f64::from(v)))
    }),
];

type NodeValue = fn(&NodeSnap) -> Option<Num>;

const NODE_FAMILIES: &[(&str, MetricType, &str, NodeValue)] = &[
    (
        "gpufleet_node_last_seen_timestamp_seconds",
        MetricType::Gauge,
        "Time of the newest sample stored for the node (agent clock).",
        |n| n.last_seen_ms.map(|t| Num::F(t as f64 / 1000.0)),
    ),
    (
        "gpufleet_node_connected",
        MetricType::Gauge,
        "1 while the node has an open ingest stream to this collector.",
        |n| Some(Num::U(u64::from(n.connected))),
    ),
    (
        "gpufleet_node_dropped_samples",
        MetricType::Counter,
        "GPU samples the agent dropped because its spool was full.",
        |n| Some(Num::U(n.delivery.dropped_samples)),
    ),
    (
        "gpufleet_node_spool_backlog_batches",
        MetricType::Gauge,
        "Batches in the agent's spool not yet acknowledged.",
        |n| Some(Num::U(n.delivery.spool_backlog_batches)),
    ),
    (
        "gpufleet_node_spool_backlog_bytes",
        MetricType::Gauge,
        "Bytes in the agent's spool not yet acknowledged.",
        |n| Some(Num::U(n.delivery.spool_backlog_bytes)),
    ),
    (
        "gpufleet_node_rejected_batches",
        MetricType::Counter,
        "Batches from the node refused as invalid since the collector started.",
        |n| Some(Num::U(n.rejected_batches)),
    ),
    (
        "gpufleet_node_stored_gpu_samples",
        MetricType::Gauge,
        "GPU samples stored for the node.",
        |n| Some(Num::U(n.stored_samples)),
    ),
];

/// Encodes one sample of a family (gauge or counter) with `labels`.
pub(crate) fn put(
    m: &mut MetricEncoder,
    labels: &impl EncodeLabelSet,
    kind: MetricType,
    v: Num,
) -> fmt::Result {
    let mut e = m.encode_family(labels)?;
    value(&mut e, kind, v)
}

/// The fleet, the workloads and the collector's own counters, from one snapshot.
#[derive(Debug)]
pub struct FleetCollector(pub Arc<Snapshot>);

impl Collector for FleetCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        encode_nodes(&mut enc, &s.nodes)?;
        encode_gpus(&mut enc, &s.nodes)?;
        encode_workloads(&mut enc, s)?;
        encode_collector(&mut enc, &s.collector)
    }
}

fn encode_nodes(enc: &mut DescriptorEncoder, nodes: &[NodeSnap]) -> fmt::Result {
    let help = "1 if the node is online (newest sample within --stale-after).";
    let mut m = enc.encode_descriptor("gpufleet_node_up", help, None, MetricType::Gauge)?;
    for n in nodes {
        let up = u64::from(n.status == NodeStatus::Online);
        put(
            &mut m,
            &[("node", Text(n.name.as_str()))],
            MetricType::Gauge,
            Num::U(up),
        )?;
    }
    let help = "1 for the node's current status (online, stale, offline), 0 for the others.";
    let mut m = enc.encode_descriptor("gpufleet_node_status", help, None, MetricType::Gauge)?;
    for n in nodes {
        for s in NodeStatus::ALL {
            let labels = [
                ("node", Text(n.name.as_str())),
                ("status", Text(s.as_str())),
            ];
            put(
                &mut m,
                &labels,
                MetricType::Gauge,
                Num::U(u64::from(n.status == s)),
            )?;
        }
    }
    let help = "The node's health: 0 ok, 1 warning, 2 critical (its worst GPU; critical when \
                offline, warning when stale).";
    let mut m = enc.encode_descriptor("gpufleet_node_health", help, None, MetricType::Gauge)?;
    for n in nodes {
        let labels = [("node", Text(n.name.as_str()))];
        put(&mut m, &labels, MetricType::Gauge, Num::U(n.health.level()))?;
    }
    for (name, kind, help, get) in NODE_FAMILIES {
        let mut m = enc.encode_descriptor(name, help, None, *kind)?;
        for n in nodes {
            if let Some(v) = get(n) {
                put(&mut m, &[("node", Text(n.name.as_str()))], *kind, v)?;
            }
        }
    }
    let help = "Workload-name look-ups the node's agent could not make since it started, by \
                source (kubernetes, docker, slurm) and cause (unreachable, forbidden, \
                not_found, malformed, timeout); its workloads keep their ids meanwhile.";
    let mut m = enc.encode_descriptor(
        "gpufleet_agent_name_lookup_failures",
        help,
        None,
        MetricType::Counter,
    )?;
    for n in nodes {
        for f in &n.name_failures {
            let labels = [
                ("node", Text(n.name.as_str())),
                ("source", Text(f.source.as_str())),
                ("cause", Text(f.cause.as_str())),
            ];
            put(&mut m, &labels, MetricType::Counter, Num::U(f.count))?;
        }
    }
    Ok(())
}

fn encode_gpus(enc: &mut DescriptorEncoder, nodes: &[NodeSnap]) -> fmt::Result {
    // Each GPU's labels once, for every family.
    let indexes: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| n.gpus.iter().map(|g| g.index.to_string()).collect())
        .collect();
    let last_indexes: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| n.last_health.iter().map(|g| g.index.to_string()).collect())
        .collect();
    let labelled = |current: bool| {
        let ix = if current { &indexes } else { &last_indexes };
        nodes.iter().zip(ix).flat_map(move |(n, ix)| {
            let list = if current { &n.gpus } else { &n.last_health };
            list.iter().zip(ix).map(move |(g, i)| {
                let labels = [
                    ("node", Text(n.name.as_str())),
                    ("gpu", Text(i)),
                    ("uuid", Text(g.uuid.as_str())),
                    ("name", Text(g.name.as_str())),
                ];
                (labels, g)
            })
        })
    };
    let gpus = || labelled(true);
    // The health families also cover offline nodes' GPUs, as last judged.
    let judged = || labelled(true).chain(labelled(false));
    for (name, kind, help, get) in GPU_FAMILIES {
        let kind = if *kind == "counter" {
            MetricType::Counter
        } else {
            MetricType::Gauge
        };
        let mut m = enc.encode_descriptor(name, help, None, kind)?;
        for (labels, g) in gpus() {
            if let Some(v) = get(&g.sample) {
                put(&mut m, &labels, kind, v)?;
            }
        }
    }
    for (name, help, get) in MIG_GPM_FAMILIES {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, g) in gpus() {
            for mig in &g.sample.mig_gpm {
                if let Some(v) = get(&mig.gpm) {
                    let instance = mig.gpu_instance_id.to_string();
                    let [a, b, c, d] = &labels;
                    let labels = [
                        *a,
                        *b,
                        *c,
                        *d,
                        ("mig_uuid", Text(mig.mig_uuid.as_str())),
                        ("gpu_instance", Text(instance.as_str())),
                    ];
                    put(&mut m, &labels, MetricType::Gauge, v)?;
                }
            }
        }
    }
    let help = "1 while a workload holds memory on the GPU and its SM utilization is at most \
                1 % (allocated but idle), 0 otherwise; absent when utilization is unknown.";
    let mut m =
        enc.encode_descriptor("gpufleet_gpu_idle_allocated", help, None, MetricType::Gauge)?;
    for (labels, g) in gpus() {
        if let Some(idle) = snapshot::idle_allocated(&g.sample, &g.processes) {
            put(&mut m, &labels, MetricType::Gauge, Num::U(u64::from(idle)))?;
        }
    }
    encode_gpu_health(enc, judged, gpus)?;
    for (name, help, get) in HOST_FAMILIES {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for n in nodes {
            if let Some(v) = n.host.as_ref().and_then(get) {
                put(
                    &mut m,
                    &[("node", Text(n.name.as_str()))],
                    MetricType::Gauge,
                    v,
                )?;
            }
        }
    }
    Ok(())
}

/// The health families: state and active reasons (of `judged`: current GPUs and offline
/// nodes' GPUs as last judged), decoded throttle reasons (of `gpus`: current samples).
fn encode_gpu_health<'a, L, I, J>(
    enc: &mut DescriptorEncoder,
    judged: impl Fn() -> J,
    gpus: impl Fn() -> I,
) -> fmt::Result
where
    L: EncodeLabelSet + Clone,
    I: Iterator<Item = (L, &'a snapshot::GpuSnap)>,
    J: Iterator<Item = (L, &'a snapshot::GpuSnap)>,
{
    let help = "The GPU's health: 0 ok, 1 warning, 2 critical (see gpufleet_gpu_health_reason).";
    let mut m = enc.encode_descriptor("gpufleet_gpu_health", help, None, MetricType::Gauge)?;
    for (labels, g) in judged() {
        put(
            &mut m,
            &labels,
            MetricType::Gauge,
            Num::U(g.health.state.level()),
        )?;
    }
    let help = "1 for each reason the GPU is not (entirely) ok, with its severity (ok: \
                informational); absent when the reason does not hold.";
    let mut m =
        enc.encode_descriptor("gpufleet_gpu_health_reason", help, None, MetricType::Gauge)?;
    for (labels, g) in judged() {
        for r in &g.health.reasons {
            let extra = [
                ("reason", Text(r.code.as_str())),
                ("severity", Text(r.severity.as_str())),
            ];
            put(
                &mut m,
                &(labels.clone(), extra),
                MetricType::Gauge,
                Num::U(1),
            )?;
        }
    }
    let help = "1 for each clock-event (throttle) reason set in the GPU's newest sample \
                (gpu_idle, sw_power_cap, hw_slowdown, sw_thermal, hw_thermal, hw_power_brake, \
                …); absent when not set or unknown.";
    let mut m = enc.encode_descriptor(
        "gpufleet_gpu_throttle_reason",
        help,
        None,
        MetricType::Gauge,
    )?;
    for (labels, g) in gpus() {
        let Some(mask) = g.sample.throttle_reasons else {
            continue;
        };
        for reason in crate::health::decode_throttle(mask) {
            let extra = [("reason", Text(reason))];
            put(
                &mut m,
                &(labels.clone(), extra),
                MetricType::Gauge,
                Num::U(1),
            )?;
        }
    }
    Ok(())
}

fn encode_workloads(enc: &mut DescriptorEncoder, s: &Snapshot) -> fmt::Result {
    let w = &s.workloads;
    let help = "GPU energy charged to the workload since the collector started (energy \
                accounting minutes; state: active, or idle charged to it under --idle-policy \
                spread).";
    let mut m = enc.encode_descriptor(
        "gpufleet_workload_energy_joules",
        help,
        None,
        MetricType::Counter,
    )?;
    for (labels, t) in &w.series {
        let pairs = workload_pairs(labels);
        for (state, mj) in [("active", t.active_mj), ("idle", t.idle_mj)] {
            let v = Num::F(mj as f64 / 1000.0);
            put(
                &mut m,
                &(pairs, [("state", Text(state))]),
                MetricType::Counter,
                v,
            )?;
        }
    }
    let help = "gCO2 of the workload's priced energy since the collector started (energy × \
                intensity × PUE per GPU-minute); absent until some of it has a price.";
    let mut m = enc.encode_descriptor(
        "gpufleet_workload_carbon_grams",
        help,
        None,
        MetricType::Counter,
    )?;
    for (labels, t) in &w.series {
        if let Some(g) = t.carbon_g {
            put(
                &mut m,
                &workload_pairs(labels),
                MetricType::Counter,
                Num::F(g),
            )?;
        }
    }
    if let Some(since) = w.since_ms {
        let help = "Start of the workload counters: they count energy minutes from here on.";
        let mut m = enc.encode_descriptor(
            "gpufleet_workload_counters_start_timestamp_seconds",
            help,
            None,
            MetricType::Gauge,
        )?;
        value(&mut m, MetricType::Gauge, Num::F(since as f64 / 1000.0))?;
    }
    let help = "GPU memory held by the workload's processes on the GPU.";
    let mut m = enc.encode_descriptor(
        "gpufleet_process_gpu_memory_used_bytes",
        help,
        None,
        MetricType::Gauge,
    )?;
    for p in &s.processes {
        if let Some(v) = p.mem_bytes {
            put(
                &mut m,
                &(workload_pairs(&p.labels), [("gpu", Text(p.gpu.as_str()))]),
                MetricType::Gauge,
                Num::U(v),
            )?;
        }
    }
    let help = "SM utilization of the workload's processes on the GPU, 0..1.";
    let mut m = enc.encode_descriptor(
        "gpufleet_process_sm_utilization_ratio",
        help,
        None,
        MetricType::Gauge,
    )?;
    for p in &s.processes {
        if let Some(v) = p.sm_pct {
            let v = Num::F(f64::from(v) / 100.0);
            put(
                &mut m,
                &(workload_pairs(&p.labels), [("gpu", Text(p.gpu.as_str()))]),
                MetricType::Gauge,
                v,
            )?;
        }
    }
    let help = "How long the workload has held GPU memory on a GPU that does no work \
                (utilization at or below --waste-util-threshold), for ongoing episodes at \
                least --waste-min-idle long (/api/v1/waste).";
    let mut m = enc.encode_descriptor(
        "gpufleet_gpu_idle_allocated_seconds",
        help,
        None,
        MetricType::Gauge,
    )?;
    for e in &w.idle_allocated {
        put(
            &mut m,
            &(
                workload_pairs(&e.labels),
                [("gpu", Text(e.gpu_uuid.as_str()))],
            ),
            MetricType::Gauge,
            Num::F(e.seconds),
        )?;
    }
    let help = "Carbon intensity now (gCO2/kWh), per provider and region some node is priced with.";
    let mut m = enc.encode_descriptor(
        "gpufleet_carbon_intensity_grams_per_kwh",
        help,
        None,
        MetricType::Gauge,
    )?;
    for (provider, region, g) in &w.intensity {
        let labels = [
            ("provider", Text(provider.as_str())),
            ("region", Text(region)),
        ];
        put(&mut m, &labels, MetricType::Gauge, Num::F(*g))?;
    }
    let help = "Series left out of /metrics by --metrics-max-workloads, summed over refreshes \
                (family: workload, process).";
    let mut m = enc.encode_descriptor(
        "gpufleet_metrics_series_dropped",
        help,
        None,
        MetricType::Counter,
    )?;
    for (family, n) in [
        ("workload", w.dropped),
        ("process", s.process_dropped),
        ("idle_allocated", w.idle_allocated_dropped),
    ] {
        put(
            &mut m,
            &[("family", Text(family))],
            MetricType::Counter,
            Num::U(n),
        )?;
    }
    Ok(())
}

fn encode_collector(enc: &mut DescriptorEncoder, c: &CollectorSnap) -> fmt::Result {
    let plain: [(&str, &str, u64); 6] = [
        (
            "gpufleet_collector_batches_acked",
            "Batches acknowledged (committed).",
            c.batches_acked,
        ),
        (
            "gpufleet_collector_gpu_samples_ingested",
            "GPU samples newly stored (replays excluded).",
            c.gpu_samples_ingested,
        ),
        (
            "gpufleet_collector_commits",
            "Transactions committed by the group-commit writer.",
            c.commits,
        ),
        (
            "gpufleet_collector_commit_failures",
            "Transactions that failed.",
            c.commit_failures,
        ),
        (
            "gpufleet_collector_packed_rows",
            "Raw rows (GPU samples, process ticks, host rows) this collector moved into \
             packed values.",
            c.packed_rows,
        ),
        (
            "gpufleet_http_renders_refused",
            "Report and plot requests answered 503: more than --max-renders at once and \
             --render-queue waiting, or waiting longer than --render-wait.",
            c.renders_refused,
        ),
    ];
    for (name, help, v) in plain {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        value(&mut m, MetricType::Counter, Num::U(v))?;
    }
    let mut m = enc.encode_descriptor(
        "gpufleet_collector_batches_rejected",
        "Batches refused, by reason.",
        None,
        MetricType::Counter,
    )?;
    for (reason, v) in [
        ("invalid", c.rejected_invalid),
        ("too_large", c.rejected_too_large),
        ("unavailable", c.rejected_unavailable),
        ("conflict", c.rejected_conflict),
        ("seq_out_of_range", c.rejected_seq),
    ] {
        put(
            &mut m,
            &[("reason", Text(reason))],
            MetricType::Counter,
            Num::U(v),
        )?;
    }
    let gauges: [(&str, &str, Num); 2] = [
        (
            "gpufleet_collector_streams_active",
            "Ingest streams open now.",
            Num::I(c.streams_active),
        ),
        (
            "gpufleet_collector_writer_queue_batches",
            "Batches waiting for the group-commit writer.",
            Num::U(c.writer_queued as u64),
        ),
    ];
    for (name, help, v) in gauges {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
        value(&mut m, MetricType::Gauge, v)?;
    }
    if !c.leading.is_empty() {
        let help = "1 if this collector runs the background job now (it holds the job's lease).";
        let mut m = enc.encode_descriptor(
            "gpufleet_collector_job_leader",
            help,
            None,
            MetricType::Gauge,
        )?;
        for (job, leading) in &c.leading {
            put(
                &mut m,
                &[("job", Text(job))],
                MetricType::Gauge,
                Num::U(u64::from(*leading)),
            )?;
        }
    }
    encode_passes(enc, &c.passes)?;
    let mut m = enc.encode_descriptor(
        "gpufleet_alert_notifications",
        "Alert notifications to webhooks since start-up, by result: sent (accepted), \
         failed (refused or out of attempts), dropped (the webhook's queue was full).",
        None,
        MetricType::Counter,
    )?;
    for (result, v) in [
        ("sent", c.alerts_sent),
        ("failed", c.alerts_failed),
        ("dropped", c.alerts_dropped),
    ] {
        put(
            &mut m,
            &[("result", Text(result))],
            MetricType::Counter,
            Num::U(v),
        )?;
    }
    let mut m = enc.encode_descriptor(
        "gpufleet_alert_webhook_notifications",
        "Alert notifications per webhook (its name) since start-up, by result: sent, \
         failed, dropped (queue full), retried (attempts sent again).",
        None,
        MetricType::Counter,
    )?;
    for (hook, n) in &c.alerts_by_webhook {
        for (result, v) in [
            ("sent", n.sent),
            ("failed", n.failed),
            ("dropped", n.dropped),
            ("retried", n.retries),
        ] {
            put(
                &mut m,
                &[("webhook", Text(hook)), ("result", Text(result))],
                MetricType::Counter,
                Num::U(v),
            )?;
        }
    }
    // Only the collector evaluating the rules knows the alerts; the others leave it out.
    if let Some(active) = &c.alerts_active {
        let mut m = enc.encode_descriptor(
            "gpufleet_alerts",
            "Alerts now, by state and severity (on the collector evaluating the rules).",
            None,
            MetricType::Gauge,
        )?;
        for (state, counts) in [("firing", &active.firing), ("pending", &active.pending)] {
            for (severity, n) in crate::alerts::rules::Severity::ALL.iter().zip(counts) {
                put(
                    &mut m,
                    &[
                        ("state", Text(state)),
                        ("severity", Text(severity.as_str())),
                    ],
                    MetricType::Gauge,
                    Num::U(*n),
                )?;
            }
        }
    }
    // The histogram: per-bucket counts (the encoder accumulates), `+Inf` last.
    let mut buckets: Vec<(f64, u64)> = Vec::with_capacity(COMMIT_BUCKETS.len() + 1);
    let mut below = 0;
    for (bound, cumulative) in COMMIT_BUCKETS.iter().zip(c.commit_buckets) {
        buckets.push((*bound, cumulative.saturating_sub(below)));
        below = below.max(cumulative);
    }
    buckets.push((f64::MAX, c.commits.saturating_sub(below)));
    let mut m = enc.encode_descriptor(
        "gpufleet_collector_commit_duration_seconds",
        "Time to write and commit one group of batches.",
        None,
        MetricType::Histogram,
    )?;
    m.encode_histogram::<NoLabelSet>(c.commit_seconds_sum, c.commits, &buckets, None)
}

/// The background tasks' passes on this collector: how many, and the time they took (its
/// rate is the share of time a task is busy; near 1, the task no longer keeps up). The
/// label is `task`, not `job`, which Prometheus keeps for the scrape job (a scraped `job`
/// label is stored as `exported_job`).
fn encode_passes(
    enc: &mut DescriptorEncoder,
    passes: &[(&'static str, crate::metrics::PassStats)],
) -> fmt::Result {
    if passes.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(
        "gpufleet_collector_background_passes",
        "Background passes run on this collector, by task (energy, rollups, retention, \
         packing) and result (ok, failed).",
        None,
        MetricType::Counter,
    )?;
    for (task, p) in passes {
        for (result, n) in [("ok", p.ok), ("failed", p.failed)] {
            let labels = [("task", Text(task)), ("result", Text(result))];
            put(&mut m, &labels, MetricType::Counter, Num::U(n))?;
        }
    }
    let mut m = enc.encode_descriptor(
        "gpufleet_collector_background_pass_seconds",
        "Seconds this collector spent in each background task's passes; its rate is the \
         share of time the task is busy (near 1, it no longer keeps up).",
        None,
        MetricType::Counter,
    )?;
    for (task, p) in passes {
        let labels = [("task", Text(task))];
        put(&mut m, &labels, MetricType::Counter, Num::F(p.seconds))?;
    }
    Ok(())
}

/// Encodes `snapshot`, then whatever `extra` registers (other parts' families), and
/// `# EOF`.
pub fn render(snapshot: Snapshot, extra: impl FnOnce(&mut Registry)) -> String {
    let mut registry = Registry::default();
    let size = 4096 + snapshot.nodes.len() * 4096 + snapshot.workloads.series.len() * 600;
    registry.register_collector(Box::new(FleetCollector(Arc::new(snapshot))));
    extra(&mut registry);
    let mut out = String::with_capacity(size);
    // Writing into a String cannot fail; a collector that fails leaves what it wrote.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// `GET /metrics`: the snapshot is copied under the live state's read lock, and encoded
/// after it is released.
pub(crate) async fn metrics(State(st): State<AppState>) -> Response {
    let now = (st.clock)();
    let queued = st.writer.as_ref().map_or(0, WriterHandle::queued);
    let collector = CollectorSnap::take(&st.metrics, queued);
    let snapshot = Snapshot::take(&st.live, &st.status, now, collector, &st.workloads);
    let body = render(snapshot, |registry| {
        crate::remote_write::register(&st.metrics.remote_write, registry);
        connections::register(&st.metrics.connections, registry);
    });
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::counters::{Published, Totals};
    use gpufleet_core::{Workload, WorkloadKind};

    fn snapshot(published: Published) -> Snapshot {
        Snapshot {
            nodes: Vec::new(),
            collector: CollectorSnap::default(),
            workloads: Arc::new(published),
            processes: Vec::new(),
            process_dropped: 0,
        }
    }

    #[test]
    fn label_values_are_escaped_and_the_text_ends_with_eof() {
        let w = Workload {
            kind: WorkloadKind::Container,
            container_id: Some("a\"b\\c\nd".into()),
            ..Default::default()
        };
        let labels = WorkloadLabels::new("n", &w);
        let out = render(
            snapshot(Published {
                series: vec![(
                    labels,
                    Totals {
                        active_mj: 1500,
                        ..Default::default()
                    },
                )],
                ..Default::default()
            }),
            |_| {},
        );
        assert!(out.contains(r#"workload="container:a\"b\\c\nd""#), "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
    }

    #[test]
    fn alerts_by_state_and_severity_and_notification_counters() {
        let mut s = snapshot(Published::default());
        s.collector = CollectorSnap {
            alerts_sent: 4,
            alerts_failed: 1,
            alerts_dropped: 2,
            alerts_by_webhook: vec![(
                "am.example:9093".into(),
                crate::alerts::notify::HookCounts {
                    sent: 4,
                    failed: 1,
                    dropped: 2,
                    retries: 7,
                },
            )],
            alerts_active: Some(crate::alerts::notify::ActiveAlerts {
                firing: [0, 2, 1],
                pending: [0, 0, 3],
            }),
            ..Default::default()
        };
        let out = render(s, |_| {});
        let lines: Vec<&str> = (out.lines())
            .filter(|l| l.starts_with("gpufleet_alert"))
            .collect();
        assert_eq!(
            lines,
            [
                r#"gpufleet_alert_notifications_total{result="sent"} 4"#,
                r#"gpufleet_alert_notifications_total{result="failed"} 1"#,
                r#"gpufleet_alert_notifications_total{result="dropped"} 2"#,
                r#"gpufleet_alert_webhook_notifications_total{webhook="am.example:9093",result="sent"} 4"#,
                r#"gpufleet_alert_webhook_notifications_total{webhook="am.example:9093",result="failed"} 1"#,
                r#"gpufleet_alert_webhook_notifications_total{webhook="am.example:9093",result="dropped"} 2"#,
                r#"gpufleet_alert_webhook_notifications_total{webhook="am.example:9093",result="retried"} 7"#,
                r#"gpufleet_alerts{state="firing",severity="info"} 0"#,
                r#"gpufleet_alerts{state="firing",severity="warning"} 2"#,
                r#"gpufleet_alerts{state="firing",severity="critical"} 1"#,
                r#"gpufleet_alerts{state="pending",severity="info"} 0"#,
                r#"gpufleet_alerts{state="pending",severity="warning"} 0"#,
                r#"gpufleet_alerts{state="pending",severity="critical"} 3"#,
            ],
            "{out}"
        );
        // A collector that does not evaluate the rules does not know the alerts.
        let out = render(snapshot(Published::default()), |_| {});
        assert!(!out.contains("gpufleet_alerts{"), "{out}");
        assert!(out.contains(r#"gpufleet_alert_notifications_total{result="sent"} 0"#));
    }

    #[test]
    fn background_passes_their_time_and_packed_rows() {
        let m = crate::metrics::Metrics::default();
        let long_ago = std::time::Instant::now() - std::time::Duration::from_millis(1500);
        m.observe_pass("packing", long_ago, true);
        m.observe_pass("energy", std::time::Instant::now(), true);
        m.observe_pass("energy", std::time::Instant::now(), false);
        (m.packed_rows).fetch_add(11_062_500, std::sync::atomic::Ordering::Relaxed);
        let mut s = snapshot(Published::default());
        s.collector = CollectorSnap::take(&m, 0);
        let out = render(s, |_| {});
        let lines: Vec<&str> = (out.lines())
            .filter(|l| l.starts_with("gpufleet_collector_background_pass"))
            .collect();
        assert_eq!(
            lines[..4],
            [
                r#"gpufleet_collector_background_passes_total{task="energy",result="ok"} 1"#,
                r#"gpufleet_collector_background_passes_total{task="energy",result="failed"} 1"#,
                r#"gpufleet_collector_background_passes_total{task="packing",result="ok"} 1"#,
                r#"gpufleet_collector_background_passes_total{task="packing",result="failed"} 0"#,
            ],
            "{out}"
        );
        let seconds = |task: &str| -> f64 {
            let prefix =
                format!("gpufleet_collector_background_pass_seconds_total{{task=\"{task}\"}} ");
            (out.lines().find_map(|l| l.strip_prefix(prefix.as_str())))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {prefix}in {out}"))
        };
        assert!((1.5..60.0).contains(&seconds("packing")), "{out}");
        assert!(seconds("energy") < 1.5, "{out}");
        assert!(
            out.lines()
                .any(|l| l == "gpufleet_collector_packed_rows_total 11062500"),
            "{out}"
        );
        // A collector that ran no pass yet says nothing of passes.
        let out = render(snapshot(Published::default()), |_| {});
        assert!(!out.contains("gpufleet_collector_background_pass"), "{out}");
    }

    #[test]
    fn gauges_beyond_i64_are_still_encoded() {
        let mut s = snapshot(Published::default());
        s.collector = CollectorSnap {
            writer_queued: usize::MAX,
            ..Default::default()
        };
        let out = render(s, |_| {});
        assert!(
            out.contains("gpufleet_collector_writer_queue_batches 18446744073709553000.0"),
            "{out}"
        );
        assert!(
            out.contains("gpufleet_collector_commit_duration_seconds_count 0"),
            "{out}"
        );
    }

    #[test]
    fn workload_counters_carry_state_and_every_workload_label() {
        let w = Workload {
            kind: WorkloadKind::Container,
            container_id: Some("c1".into()),
            container_name: Some("trainer".into()),
            pod_name: Some("train-0".into()),
            namespace: Some("ml".into()),
            uid: Some(1000),
            ..Default::default()
        };
        let out = render(
            snapshot(Published {
                series: vec![(
                    WorkloadLabels::new("n1", &w),
                    Totals {
                        active_mj: 1500,
                        idle_mj: 250,
                        carbon_g: Some(0.5),
                        last_minute_ms: 0,
                    },
                )],
                ..Default::default()
            }),
            |_| {},
        );
        let l = r#"node="n1",workload="container:c1",kind="container",namespace="ml",pod="train-0",container="trainer",job="",job_name="",account="",user="1000""#;
        for line in [
            format!("gpufleet_workload_energy_joules_total{{{l},state=\"active\"}} 1.5"),
            format!("gpufleet_workload_energy_joules_total{{{l},state=\"idle\"}} 0.25"),
            format!("gpufleet_workload_carbon_grams_total{{{l}}} 0.5"),
            "# TYPE gpufleet_workload_energy_joules counter".to_owned(),
        ] {
            assert!(out.lines().any(|x| x == line), "missing {line} in\n{out}");
        }
    }

    #[test]
    fn ongoing_idle_allocated_episodes_are_a_gauge_per_workload_and_gpu() {
        use crate::accounting::counters::IdleAllocated;
        let w = Workload {
            kind: WorkloadKind::Slurm,
            job_id: Some("4242".into()),
            uid: Some(1000),
            ..Default::default()
        };
        let out = render(
            snapshot(Published {
                idle_allocated: vec![IdleAllocated {
                    labels: WorkloadLabels::new("n1", &w),
                    gpu_uuid: "GPU-w".into(),
                    gpu_index: 0,
                    seconds: 1905.0,
                }],
                idle_allocated_dropped: 3,
                ..Default::default()
            }),
            |_| {},
        );
        let l = r#"node="n1",workload="slurm:4242",kind="slurm",namespace="",pod="",container="",job="4242",job_name="",account="",user="1000""#;
        for line in [
            "# TYPE gpufleet_gpu_idle_allocated_seconds gauge".to_owned(),
            format!("gpufleet_gpu_idle_allocated_seconds{{{l},gpu=\"GPU-w\"}} 1905.0"),
            "gpufleet_metrics_series_dropped_total{family=\"idle_allocated\"} 3".to_owned(),
        ] {
            assert!(out.lines().any(|x| x == line), "missing {line} in\n{out}");
        }
    }
}
