//! The signals rules are written over: each one a name and a function of a [`LiveState`]
//! snapshot giving its series (labels → value). A flag signal gives 1 (set) or 0.
//!
//! A series is left out when its value is unknown (absent is not zero: a GPU that cannot
//! report its temperature has no `gpu_temp_c` series, so no rule over it holds), and
//! per-GPU series only come from samples newer than the status policy's `stale_after`
//! (a node that stopped reporting resolves its GPUs' alerts; `node_offline` takes over).
//!
//! Adding a signal is one entry of [`SIGNALS`].

use crate::accounting::counters::IdleAllocated;
use crate::health::fleet_health;
use crate::health::judge::{GpuHealth, HealthPolicy, HealthState};
use crate::live::state::{LiveGpu, LiveNode, LiveState};
use crate::live::status::{NodeStatus, StatusPolicy};
use crate::store::GpuRecord;
use gpufleet_core::{GpuHealthSample, UnixMs};
use std::collections::BTreeMap;

/// A signal's labels → value.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// What a signal reads.
pub struct Snapshot<'a> {
    pub state: &'a LiveState,
    pub now_ms: UnixMs,
    pub status: StatusPolicy,
    /// The ongoing idle-but-allocated episodes, as last published for `/metrics`
    /// (`--metrics-refresh`; those at least `--waste-min-idle` long, capped by
    /// `--metrics-max-workloads`).
    pub idle_allocated: &'a [IdleAllocated],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKind {
    /// A number, compared with a threshold.
    Number,
    /// 1 (set) or 0, used alone.
    Flag,
}

/// One signal.
pub struct Signal {
    pub name: &'static str,
    pub kind: SignalKind,
    /// The unit of its values (`celsius`, `percent`, ...; `flag`).
    pub unit: &'static str,
    pub help: &'static str,
    /// The labels of its series.
    pub labels: &'static [&'static str],
    pub eval: fn(&Snapshot<'_>) -> Vec<Series>,
}

/// A per-GPU signal's labels.
const GPU_LABELS: &[&str] = &["node", "gpu", "gpu_index", "gpu_name"];

/// Every signal.
pub const SIGNALS: &[Signal] = &[
    Signal {
        name: "node_offline",
        kind: SignalKind::Flag,
        unit: "flag",
        help: "the node's newest sample is older than the offline threshold (--offline-after)",
        labels: &["node"],
        eval: |s| {
            (s.state.nodes.values())
                .map(|n| Series {
                    labels: BTreeMap::from([("node".to_owned(), n.record.name.clone())]),
                    value: flag(
                        s.status.classify(n.record.last_seen_ms, s.now_ms) == NodeStatus::Offline,
                    ),
                })
                .collect()
        },
    },
    Signal {
        name: "gpu_lost",
        kind: SignalKind::Flag,
        unit: "flag",
        help: "the node reports (online), but this GPU of its inventory was reported lost \
               by its agent (until reported recovered) or has had no sample for longer than \
               --stale-after",
        labels: GPU_LABELS,
        eval: gpu_lost,
    },
    Signal {
        name: "gpu_temp_c",
        kind: SignalKind::Number,
        unit: "celsius",
        help: "GPU temperature",
        labels: GPU_LABELS,
        eval: |s| per_gpu(s, |g, _| g.sample.temp_gpu_c.map(f64::from)),
    },
    Signal {
        name: "gpu_temp_margin_c",
        kind: SignalKind::Number,
        unit: "celsius",
        help: "how far the GPU's temperature is below its own slowdown threshold (NVML's \
               SLOWDOWN); negative past it",
        labels: GPU_LABELS,
        eval: |s| {
            per_gpu(s, |g, info| {
                let (limit, t) = (info.info.temp_slowdown_c?, g.sample.temp_gpu_c?);
                Some(f64::from(limit) - f64::from(t))
            })
        },
    },
    Signal {
        name: "gpu_row_remap_failed",
        kind: SignalKind::Flag,
        unit: "flag",
        help: "a memory row remap failed: the GPU needs service (from its last health reading)",
        labels: GPU_LABELS,
        eval: |s| health_flag(s, |h| h.remapped_rows_failed),
    },
    Signal {
        name: "gpu_row_remap_pending",
        kind: SignalKind::Flag,
        unit: "flag",
        help: "a memory row remap waits for a GPU reset (from its last health reading)",
        labels: GPU_LABELS,
        eval: |s| health_flag(s, |h| h.remapped_rows_pending),
    },
    Signal {
        name: "gpu_retired_pages_pending",
        kind: SignalKind::Flag,
        unit: "flag",
        help: "a page retirement waits for a reboot (from its last health reading)",
        labels: GPU_LABELS,
        eval: |s| health_flag(s, |h| h.retired_pages_pending),
    },
    Signal {
        name: "gpu_health",
        kind: SignalKind::Number,
        unit: "state",
        help: "the GPU's judged health (crate::health): 0 ok, 1 warning, 2 critical",
        labels: GPU_LABELS,
        eval: |s| {
            judged(s, |h| {
                Some(match h.state {
                    HealthState::Ok => 0.0,
                    HealthState::Warning => 1.0,
                    HealthState::Critical => 2.0,
                })
            })
        },
    },
    Signal {
        name: "xid_critical",
        kind: SignalKind::Flag,
        unit: "flag",
        help: "the GPU reported an Xid the health judge rates critical (kept critical for a \
               day, or until the GPU is reported recovered)",
        labels: GPU_LABELS,
        eval: |s| {
            judged(s, |h| {
                Some(flag(h.reasons.iter().any(|r| {
                    r.code.starts_with("xid_") && r.severity == HealthState::Critical
                })))
            })
        },
    },
    Signal {
        name: "gpu_mem_temp_c",
        kind: SignalKind::Number,
        unit: "celsius",
        help: "GPU memory temperature",
        labels: GPU_LABELS,
        eval: |s| per_gpu(s, |g, _| g.sample.temp_mem_c.map(f64::from)),
    },
    Signal {
        name: "gpu_power_w",
        kind: SignalKind::Number,
        unit: "watts",
        help: "GPU power draw",
        labels: GPU_LABELS,
        eval: |s| per_gpu(s, |g, _| g.sample.power_mw.map(|mw| f64::from(mw) / 1000.0)),
    },
    Signal {
        name: "gpu_power_limit_pct",
        kind: SignalKind::Number,
        unit: "percent",
        help: "GPU power draw as a share of its enforced power limit",
        labels: GPU_LABELS,
        eval: |s| {
            per_gpu(s, |g, _| {
                let (p, l) = (g.sample.power_mw?, g.sample.power_limit_mw?);
                (l > 0).then(|| 100.0 * f64::from(p) / f64::from(l))
            })
        },
    },
    Signal {
        name: "gpu_util_pct",
        kind: SignalKind::Number,
        unit: "percent",
        help: "GPU (SM) utilization",
        labels: GPU_LABELS,
        eval: |s| per_gpu(s, |g, _| g.sample.util_gpu_pct.map(f64::from)),
    },
    Signal {
        name: "gpu_mem_used_pct",
        kind: SignalKind::Number,
        unit: "percent",
        help: "GPU memory used, as a share of its total",
        labels: GPU_LABELS,
        eval: |s| {
            per_gpu(s, |g, info| {
                let used = g.sample.mem_used_bytes?;
                let total = g.sample.mem_total_bytes.or(info.info.memory_total_bytes)?;
                (total > 0).then(|| 100.0 * used as f64 / total as f64)
            })
        },
    },
    Signal {
        name: "gpu_idle_allocated_min",
        kind: SignalKind::Number,
        unit: "minutes",
        help: "how long a workload has held memory on a GPU that does no work (an ongoing \
               idle-but-allocated episode, /api/v1/waste), per workload and GPU",
        labels: &[
            "node",
            "gpu",
            "gpu_index",
            "workload",
            "kind",
            "namespace",
            "pod",
            "container",
            "job",
            "user",
        ],
        eval: |s| {
            (s.idle_allocated.iter())
                .filter(|e| e.seconds.is_finite())
                .map(|e| {
                    let l = &e.labels;
                    let mut labels = BTreeMap::from([
                        ("node".to_owned(), l.node.clone()),
                        ("gpu".to_owned(), e.gpu_uuid.clone()),
                        ("gpu_index".to_owned(), e.gpu_index.to_string()),
                        ("workload".to_owned(), l.workload.clone()),
                        ("kind".to_owned(), l.kind.to_owned()),
                    ]);
                    // Identity labels the workload has (absent ones are left out).
                    for (k, v) in [
                        ("namespace", &l.namespace),
                        ("pod", &l.pod),
                        ("container", &l.container),
                        ("job", &l.job),
                        ("user", &l.user),
                    ] {
                        if !v.is_empty() {
                            labels.insert(k.to_owned(), v.clone());
                        }
                    }
                    Series {
                        labels,
                        value: e.seconds / 60.0,
                    }
                })
                .collect()
        },
    },
    Signal {
        name: "gpu_ecc_uncorrected",
        kind: SignalKind::Number,
        unit: "errors",
        help: "uncorrected ECC errors since the driver loaded (volatile)",
        labels: GPU_LABELS,
        eval: |s| {
            per_gpu(s, |g, _| {
                g.sample.ecc_uncorrected_volatile.map(|v| v as f64)
            })
        },
    },
];

/// The signal named `name`.
pub fn find(name: &str) -> Option<&'static Signal> {
    SIGNALS.iter().find(|s| s.name == name)
}

fn flag(set: bool) -> f64 {
    if set { 1.0 } else { 0.0 }
}

/// A flag of the GPU's last health reading (absent while it has none or the GPU does not
/// report it).
fn health_flag(s: &Snapshot<'_>, field: fn(&GpuHealthSample) -> Option<bool>) -> Vec<Series> {
    per_gpu(s, |g, _| field(&g.health.as_ref()?.sample).map(flag))
}

fn gpu_labels(node: &LiveNode, gpu: &GpuRecord) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("node".to_owned(), node.record.name.clone()),
        ("gpu".to_owned(), gpu.info.uuid.clone()),
        ("gpu_index".to_owned(), gpu.info.index.to_string()),
        ("gpu_name".to_owned(), gpu.info.name.clone()),
    ])
}

/// Whether a sample taken at `time_ms` is fresh at `now_ms`.
fn fresh(s: &Snapshot<'_>, time_ms: UnixMs) -> bool {
    s.status.classify(Some(time_ms), s.now_ms) == NodeStatus::Online
}

/// One series per GPU with a fresh sample for which `value` knows a value.
fn per_gpu(s: &Snapshot<'_>, value: impl Fn(&LiveGpu, &GpuRecord) -> Option<f64>) -> Vec<Series> {
    let mut out = Vec::new();
    for node in s.state.nodes.values() {
        for gpu in &node.record.gpus {
            if let Some(live) = node.gpus.get(&gpu.id)
                && fresh(s, live.time_ms)
                && let Some(v) = value(live, gpu).filter(|v| v.is_finite())
            {
                out.push(Series {
                    labels: gpu_labels(node, gpu),
                    value: v,
                });
            }
        }
    }
    out
}

/// One series per GPU of every node that is not offline, from its judged health
/// ([`crate::health::fleet_health`]).
fn judged(s: &Snapshot<'_>, value: impl Fn(&GpuHealth) -> Option<f64>) -> Vec<Series> {
    fleet_health(s.state, &s.status, &HealthPolicy::default(), s.now_ms)
        .into_iter()
        .filter(|g| g.node_status != NodeStatus::Offline)
        .filter_map(|g| {
            let v = value(&g.health)?;
            Some(Series {
                labels: BTreeMap::from([
                    ("node".to_owned(), g.node),
                    ("gpu".to_owned(), g.uuid),
                    ("gpu_index".to_owned(), g.index.to_string()),
                    ("gpu_name".to_owned(), g.name),
                ]),
                value: v,
            })
        })
        .collect()
}

/// Per GPU of every online node: set when its newest sample (if any) is not fresh while
/// the node's is.
fn gpu_lost(s: &Snapshot<'_>) -> Vec<Series> {
    let mut out = Vec::new();
    for node in s.state.nodes.values() {
        if !node.record.last_seen_ms.is_some_and(|t| fresh(s, t)) {
            continue;
        }
        for gpu in &node.record.gpus {
            let sampled = node.gpus.get(&gpu.id).map(|g| g.time_ms);
            // The agent keeps sending a lost GPU's (empty) sample and reports the loss
            // as an event: lost until a recovery is reported after it.
            let reported_lost =
                (node.memory.get(&gpu.id)).is_some_and(|m| m.events.lost_since().is_some());
            out.push(Series {
                labels: gpu_labels(node, gpu),
                value: flag(reported_lost || !sampled.is_some_and(|t| fresh(s, t))),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::state::Live;
    use crate::store::{GpuId, LatestGpu, LatestHealth, NodeRecord};
    use gpufleet_core::{GpuHealthSample, GpuInfo, GpuSample};

    const NOW: UnixMs = 1_800_000_000_000;

    fn record(id: i64, name: &str, last_seen_ms: UnixMs, gpus: &[(i64, u32)]) -> NodeRecord {
        let mut r = NodeRecord::with_gpus(id, name, &[]);
        r.last_seen_ms = Some(last_seen_ms);
        r.gpus = (gpus.iter())
            .map(|&(id, index)| GpuRecord {
                id: GpuId(id),
                info: GpuInfo {
                    index,
                    uuid: format!("GPU-{id}"),
                    name: "H100".into(),
                    temp_slowdown_c: Some(90),
                    ..GpuInfo::default()
                },
            })
            .collect();
        r
    }

    fn latest(id: i64, time_ms: UnixMs, temp: Option<u32>) -> LatestGpu {
        LatestGpu {
            gpu: GpuId(id),
            time_ms,
            sample: GpuSample {
                gpu_uuid: format!("GPU-{id}"),
                temp_gpu_c: temp,
                ..GpuSample::default()
            },
            processes: Vec::new(),
        }
    }

    /// Node `n` reports now: GPU 1 at 87 °C with a failed row remap, GPU 2 silent for a
    /// minute (lost), GPU 3 without a temperature reading. Node `old` went silent an hour
    /// ago with its GPU 4.
    fn state() -> Live {
        let live = Live::new();
        live.seed(
            vec![
                record(1, "n", NOW - 500, &[(1, 0), (2, 1), (3, 2)]),
                record(2, "old", NOW - 3_600_000, &[(4, 0)]),
            ],
            vec![
                latest(1, NOW - 500, Some(87)),
                latest(2, NOW - 60_000, Some(50)),
                latest(3, NOW - 500, None),
                latest(4, NOW - 3_600_000, Some(95)),
            ],
            Vec::new(),
            vec![LatestHealth {
                gpu: GpuId(1),
                time_ms: NOW - 20_000,
                sample: GpuHealthSample {
                    gpu_uuid: "GPU-1".into(),
                    remapped_rows_failed: Some(true),
                    ..GpuHealthSample::default()
                },
            }],
        );
        live
    }

    fn values(live: &Live, name: &str) -> Vec<(String, f64)> {
        let signal = find(name).expect("signal");
        live.read(|state| {
            let snap = Snapshot {
                state,
                now_ms: NOW,
                status: StatusPolicy::default(),
                idle_allocated: &[],
            };
            (signal.eval)(&snap)
                .into_iter()
                .map(|s| {
                    let key = s.labels.get("gpu").unwrap_or(&s.labels["node"]).clone();
                    (key, s.value)
                })
                .collect()
        })
    }

    fn v(key: &str, value: f64) -> (String, f64) {
        (key.to_owned(), value)
    }

    #[test]
    fn signals_read_the_live_state_and_leave_out_what_is_unknown_or_stale() {
        let live = state();
        assert_eq!(values(&live, "node_offline"), [v("n", 0.0), v("old", 1.0)]);
        assert_eq!(
            values(&live, "gpu_temp_c"),
            [v("GPU-1", 87.0)],
            "no reading (GPU-3) and stale readings (GPU-2, GPU-4) give no series"
        );
        assert_eq!(values(&live, "gpu_temp_margin_c"), [v("GPU-1", 3.0)]);
        assert_eq!(values(&live, "gpu_row_remap_failed"), [v("GPU-1", 1.0)]);
        assert_eq!(values(&live, "gpu_row_remap_pending"), [], "not reported");
        let health = values(&live, "gpu_health");
        assert_eq!(health.len(), 3, "every GPU of the online node: {health:?}");
        assert_eq!(health[0], v("GPU-1", 2.0), "a failed row remap is critical");
        assert_eq!(values(&live, "xid_critical")[0], v("GPU-1", 0.0), "no Xid");
        assert_eq!(
            values(&live, "gpu_lost"),
            [v("GPU-1", 0.0), v("GPU-2", 1.0), v("GPU-3", 0.0)],
            "only an online node's GPUs can be lost"
        );
        let labels = live.read(|state| {
            let snap = Snapshot {
                state,
                now_ms: NOW,
                status: StatusPolicy::default(),
                idle_allocated: &[],
            };
            (find("gpu_temp_c").expect("signal").eval)(&snap)[0]
                .labels
                .clone()
        });
        let names: Vec<&str> = labels.keys().map(String::as_str).collect();
        assert_eq!(names, ["gpu", "gpu_index", "gpu_name", "node"]);
        assert_eq!(labels["gpu_index"], "0");
        assert_eq!(labels["gpu_name"], "H100");
    }

    #[test]
    fn a_gpu_its_agent_reports_lost_is_lost_until_reported_recovered() {
        let live = state();
        let event = |time_ms, kind| gpufleet_core::Event {
            time_ms,
            gpu_uuid: "GPU-1".into(),
            kind,
            code: None,
            detail: String::new(),
        };
        // The agent still sends GPU-1's (fresh) sample, but reported it lost.
        live.seed_events(
            "n",
            &[event(NOW - 2_000, gpufleet_core::EventKind::GpuLost)],
        );
        assert_eq!(values(&live, "gpu_lost")[0], v("GPU-1", 1.0));
        live.seed_events(
            "n",
            &[event(NOW - 1_000, gpufleet_core::EventKind::GpuRecovered)],
        );
        assert_eq!(values(&live, "gpu_lost")[0], v("GPU-1", 0.0), "recovered");
    }

    #[test]
    fn idle_but_allocated_reads_the_published_episodes_and_the_default_rule_holds_past_30_min() {
        use crate::accounting::counters::WorkloadLabels;
        let episode = |workload: &str, pod: &str, seconds| IdleAllocated {
            labels: WorkloadLabels {
                node: "n".into(),
                workload: workload.into(),
                kind: "container",
                namespace: "ml".into(),
                pod: pod.into(),
                container: String::new(),
                job: String::new(),
                job_name: String::new(),
                account: String::new(),
                user: "1000".into(),
            },
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            seconds,
        };
        let published = [
            episode("container:a", "train-0", 1_905.0),
            episode("container:b", "", 600.0),
        ];
        let live = state();
        let series = live.read(|state| {
            let snap = Snapshot {
                state,
                now_ms: NOW,
                status: StatusPolicy::default(),
                idle_allocated: &published,
            };
            (find("gpu_idle_allocated_min").expect("signal").eval)(&snap)
        });
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].value, 31.75, "1905 s idle");
        let l = &series[0].labels;
        let pairs: Vec<(&str, &str)> = l.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("gpu", "GPU-1"),
                ("gpu_index", "0"),
                ("kind", "container"),
                ("namespace", "ml"),
                ("node", "n"),
                ("pod", "train-0"),
                ("user", "1000"),
                ("workload", "container:a"),
            ],
            "absent identity labels are left out"
        );
        assert!(!series[1].labels.contains_key("pod"));
        // The default rule: over 30 minutes only.
        let rule = (crate::alerts::rules::default_rules().into_iter())
            .find(|r| r.name == "GpuIdleButAllocated")
            .expect("a default rule");
        assert_eq!(rule.condition.signal(), "gpu_idle_allocated_min");
        let held: Vec<bool> = series
            .iter()
            .map(|s| rule.condition.holds(s.value))
            .collect();
        assert_eq!(held, [true, false]);
    }

    #[test]
    fn signal_names_are_unique_and_labels_known() {
        let mut names: Vec<&str> = SIGNALS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SIGNALS.len());
        let empty = LiveState::default();
        for s in SIGNALS {
            assert!(s.labels.contains(&"node"), "{}", s.name);
            let snap = Snapshot {
                state: &empty,
                now_ms: 0,
                status: StatusPolicy::default(),
                idle_allocated: &[],
            };
            assert!((s.eval)(&snap).is_empty(), "{}: no node, no series", s.name);
        }
    }
}
