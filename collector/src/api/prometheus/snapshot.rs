//! What a scrape needs, copied from the live state under its read lock ([`Snapshot::take`])
//! so that encoding happens after the lock is released: a scrape of 1,000 nodes × 8 GPUs
//! holds the lock only for the copy, and commits (which take the write lock) are not
//! stalled by the encoding (BENCHMARKS.md, "/metrics scrape").

use crate::accounting::counters::{Published, WorkloadCounters, WorkloadLabels};
use crate::health::{GpuHealth, HealthPolicy, HealthState};
use crate::live::state::{Live, LiveState};
use crate::live::status::{NodeStatus, StatusPolicy};
use crate::metrics::{COMMIT_BUCKETS, Metrics};
use gpufleet_core::{DeliveryStats, GpuSample, HostSample, ProcessSample, UnixMs};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

/// One GPU: identity, newest sample, its processes.
#[derive(Debug, Clone)]
pub struct GpuSnap {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub sample: GpuSample,
    pub processes: Vec<ProcessSample>,
    /// The GPU's judged health.
    pub health: GpuHealth,
}

/// One node. Offline nodes carry no GPUs or host (their last values are not current),
/// only their GPUs' health as last judged ([`NodeSnap::last_health`]).
#[derive(Debug, Clone)]
pub struct NodeSnap {
    pub name: String,
    pub status: NodeStatus,
    pub connected: bool,
    pub last_seen_ms: Option<UnixMs>,
    pub delivery: DeliveryStats,
    pub rejected_batches: u64,
    pub stored_samples: u64,
    pub host: Option<HostSample>,
    pub gpus: Vec<GpuSnap>,
    /// An offline node's GPUs, judged from what was last known of them (empty sample and
    /// processes): their health series stay, so an alert on a GPU's health does not
    /// resolve because its node went offline.
    pub last_health: Vec<GpuSnap>,
    /// The node's judged health (critical when offline).
    pub health: HealthState,
    /// The agent's failed workload-name look-ups (source, cause, count since it started).
    pub name_failures: Vec<gpufleet_core::NameFailures>,
}

/// The collector's own counters at scrape time.
#[derive(Debug, Clone, Default)]
pub struct CollectorSnap {
    pub batches_acked: u64,
    pub rejected_invalid: u64,
    pub rejected_too_large: u64,
    pub rejected_unavailable: u64,
    pub rejected_conflict: u64,
    pub rejected_seq: u64,
    pub gpu_samples_ingested: u64,
    pub commits: u64,
    pub commit_failures: u64,
    pub streams_active: i64,
    pub writer_queued: usize,
    pub leading: Vec<(&'static str, bool)>,
    /// Cumulative counts per [`COMMIT_BUCKETS`] bound.
    pub commit_buckets: [u64; COMMIT_BUCKETS.len()],
    pub commit_seconds_sum: f64,
    /// Alert notifications sent, given up and dropped (queue full), since start-up.
    pub alerts_sent: u64,
    pub alerts_failed: u64,
    pub alerts_dropped: u64,
    /// The same, per webhook (by name), with its retries.
    pub alerts_by_webhook: Vec<(std::sync::Arc<str>, crate::alerts::notify::HookCounts)>,
    /// Alerts now, while this collector evaluates the rules.
    pub alerts_active: Option<crate::alerts::notify::ActiveAlerts>,
    /// Background passes run here, by task.
    pub passes: Vec<(&'static str, crate::metrics::PassStats)>,
    /// Raw rows moved into packed values here.
    pub packed_rows: u64,
    /// Report and plot requests refused: too many at once.
    pub renders_refused: u64,
}

impl CollectorSnap {
    pub fn take(m: &Metrics, writer_queued: usize) -> CollectorSnap {
        CollectorSnap {
            batches_acked: m.batches_acked.load(Relaxed),
            rejected_invalid: m.batches_rejected_invalid.load(Relaxed),
            rejected_too_large: m.batches_rejected_too_large.load(Relaxed),
            rejected_unavailable: m.batches_rejected_unavailable.load(Relaxed),
            rejected_conflict: m.batches_rejected_conflict.load(Relaxed),
            rejected_seq: m.batches_rejected_seq.load(Relaxed),
            gpu_samples_ingested: m.gpu_samples_ingested.load(Relaxed),
            commits: m.commits.load(Relaxed),
            commit_failures: m.commit_failures.load(Relaxed),
            streams_active: m.streams_active.load(Relaxed),
            writer_queued,
            leading: m.leading(),
            commit_buckets: std::array::from_fn(|i| m.commit_buckets[i].load(Relaxed)),
            commit_seconds_sum: m.commit_micros_sum.load(Relaxed) as f64 / 1e6,
            alerts_sent: m.alerts.sent.load(Relaxed),
            alerts_failed: m.alerts.failed.load(Relaxed),
            alerts_dropped: m.alerts.dropped.load(Relaxed),
            alerts_by_webhook: m.alerts.by_webhook(),
            alerts_active: m.alerts.active(),
            passes: m.passes(),
            packed_rows: m.packed_rows.load(Relaxed),
            renders_refused: m.renders_refused.load(Relaxed),
        }
    }
}

/// Everything one scrape encodes.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub nodes: Vec<NodeSnap>,
    pub collector: CollectorSnap,
    /// The newest refresh of the workload counters (shared, not copied).
    pub workloads: Arc<Published>,
    /// Per (node, GPU, workload): its processes' memory and SM utilization, summed.
    pub processes: Vec<ProcessSeries>,
    /// Per-process series left out by the cap, summed over scrapes.
    pub process_dropped: u64,
}

/// One workload on one GPU (its processes summed, so two processes of a job on a GPU are
/// one series).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSeries {
    pub labels: WorkloadLabels,
    pub gpu: String,
    pub mem_bytes: Option<u64>,
    pub sm_pct: Option<u32>,
}

impl Snapshot {
    /// Copies what the exposition needs; the live state's read lock is held only here.
    pub fn take(
        live: &Live,
        policy: &StatusPolicy,
        now_ms: UnixMs,
        collector: CollectorSnap,
        counters: &WorkloadCounters,
    ) -> Snapshot {
        let nodes = Snapshot::copy_nodes(live, policy, now_ms);
        let (processes, left_out) = process_series(&nodes, counters.max_series());
        let process_dropped = counters.process_dropped.fetch_add(left_out, Relaxed) + left_out;
        Snapshot {
            nodes,
            collector,
            workloads: counters.current(),
            processes,
            process_dropped,
        }
    }
}

impl Snapshot {
    /// The part of [`Snapshot::take`] done under the live state's read lock.
    pub fn copy_nodes(live: &Live, policy: &StatusPolicy, now_ms: UnixMs) -> Vec<NodeSnap> {
        live.read(|s| nodes(s, policy, now_ms))
    }
}

fn nodes(state: &LiveState, policy: &StatusPolicy, now_ms: UnixMs) -> Vec<NodeSnap> {
    state
        .nodes
        .values()
        .map(|n| {
            let status = policy.classify(n.record.last_seen_ms, now_ms);
            let current = status != NodeStatus::Offline;
            let (health, judged) =
                crate::health::judge_live_node(n, status, policy, &HealthPolicy::default(), now_ms);
            let snaps = n.record.gpus.iter().zip(judged).filter_map(|(g, health)| {
                let latest = n.gpus.get(&g.id)?;
                Some(GpuSnap {
                    index: g.info.index,
                    uuid: g.info.uuid.clone(),
                    name: g.info.name.clone(),
                    sample: if current {
                        latest.sample.clone()
                    } else {
                        GpuSample::default()
                    },
                    processes: if current {
                        latest.processes.clone()
                    } else {
                        Vec::new()
                    },
                    health,
                })
            });
            let (gpus, last_health) = if current {
                (snaps.collect(), Vec::new())
            } else {
                (Vec::new(), snaps.collect())
            };
            NodeSnap {
                name: n.record.name.clone(),
                status,
                connected: n.connections > 0,
                last_seen_ms: n.record.last_seen_ms,
                delivery: n.record.delivery,
                rejected_batches: n.rejected_batches,
                stored_samples: n.record.stored_samples,
                host: current
                    .then(|| n.host.as_ref().and_then(|h| h.sample.clone()))
                    .flatten(),
                gpus,
                last_health,
                health: health.state,
                name_failures: n.name_failures.clone(),
            }
        })
        .collect()
}

/// Whether a GPU is allocated but idle: some process holds memory on it while its SM
/// utilization (the GPU's, else its processes' sum) is at most 1 %. `None` when the
/// utilization is unknown.
pub fn idle_allocated(sample: &GpuSample, processes: &[ProcessSample]) -> Option<bool> {
    let holds = processes
        .iter()
        .any(|p| p.gpu_mem_bytes.is_some_and(|b| b > 0));
    let util = sample.util_gpu_pct.or_else(|| {
        processes
            .iter()
            .filter_map(|p| p.sm_util_pct)
            .reduce(|a, b| a.saturating_add(b))
    });
    match util {
        Some(u) => Some(holds && u <= 1),
        None if !holds => Some(false),
        None => None,
    }
}

/// The per-(node, GPU, workload) process series, at most `max`; also how many were left
/// out.
pub fn process_series(nodes: &[NodeSnap], max: usize) -> (Vec<ProcessSeries>, u64) {
    let mut series: BTreeMap<(WorkloadLabels, u32), (Option<u64>, Option<u32>)> = BTreeMap::new();
    for n in nodes {
        for g in &n.gpus {
            for p in &g.processes {
                let key = (WorkloadLabels::new(&n.name, &p.workload), g.index);
                let (mem, sm) = series.entry(key).or_default();
                if let Some(b) = p.gpu_mem_bytes {
                    *mem = Some(mem.unwrap_or(0).saturating_add(b));
                }
                if let Some(u) = p.sm_util_pct {
                    *sm = Some(sm.unwrap_or(0).saturating_add(u));
                }
            }
        }
    }
    let left_out = series.len().saturating_sub(max) as u64;
    let out = series
        .into_iter()
        .take(max)
        .map(|((labels, gpu), (mem_bytes, sm_pct))| ProcessSeries {
            labels,
            gpu: gpu.to_string(),
            mem_bytes,
            sm_pct: sm_pct.map(|u| u.min(100)),
        })
        .collect();
    (out, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::{Workload, WorkloadKind};

    fn process(job: &str, mem: Option<u64>, sm: Option<u32>) -> ProcessSample {
        ProcessSample {
            gpu_mem_bytes: mem,
            sm_util_pct: sm,
            workload: Workload {
                kind: WorkloadKind::Slurm,
                job_id: Some(job.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn sample(util: Option<u32>) -> GpuSample {
        GpuSample {
            util_gpu_pct: util,
            ..Default::default()
        }
    }

    #[test]
    fn idle_allocated_means_memory_held_and_at_most_one_percent() {
        let held = [process("1", Some(1 << 30), Some(0))];
        assert_eq!(idle_allocated(&sample(Some(1)), &held), Some(true));
        assert_eq!(idle_allocated(&sample(Some(2)), &held), Some(false));
        assert_eq!(idle_allocated(&sample(Some(0)), &[]), Some(false));
        // Without the GPU's utilization, its processes' sum decides; without either, absent.
        assert_eq!(idle_allocated(&sample(None), &held), Some(true));
        let unknown = [process("1", Some(1 << 30), None)];
        assert_eq!(idle_allocated(&sample(None), &unknown), None);
    }

    #[test]
    fn a_workloads_processes_on_a_gpu_are_one_series_and_the_cap_counts_the_rest() {
        let node = NodeSnap {
            name: "n1".into(),
            status: NodeStatus::Online,
            connected: true,
            last_seen_ms: None,
            delivery: DeliveryStats::default(),
            rejected_batches: 0,
            stored_samples: 0,
            name_failures: Vec::new(),
            host: None,
            gpus: vec![GpuSnap {
                index: 0,
                uuid: "GPU-0".into(),
                name: "H100".into(),
                sample: sample(Some(90)),
                processes: vec![
                    process("7", Some(100), Some(40)),
                    process("7", Some(50), None),
                    process("8", None, Some(10)),
                ],
                health: GpuHealth::default(),
            }],
            last_health: Vec::new(),
            health: HealthState::Ok,
        };
        let (series, left_out) = process_series(std::slice::from_ref(&node), 10);
        assert_eq!(left_out, 0);
        assert_eq!(series.len(), 2);
        assert_eq!(
            (
                series[0].labels.job.as_str(),
                series[0].mem_bytes,
                series[0].sm_pct
            ),
            ("7", Some(150), Some(40))
        );
        assert_eq!((series[1].mem_bytes, series[1].sm_pct), (None, Some(10)));
        let (series, left_out) = process_series(&[node], 1);
        assert_eq!((series.len(), left_out), (1, 1));
    }
}
