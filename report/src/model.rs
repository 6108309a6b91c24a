//! The report: what one subject (a container, pod, Slurm job, node, or one command run by
//! `gpufleet-agent exec`) spent over a range, and what the GPUs it used looked like.
//!
//! Every measured figure is an `Option`: `None` when nothing measured it (no energy
//! minutes, no carbon intensity, a metric the GPU does not report). Renderers show it as
//! `n/a` (table), `null` (JSON / YAML) or an empty cell (CSV); nothing becomes 0.

use gpufleet_core::config::format_time;
use gpufleet_core::{GpuSample, UnixMs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What the report is about.
    pub subject: Subject,
    /// The range, RFC 3339 (UTC) and Unix ms.
    pub from: String,
    pub to: String,
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
    /// Seconds the subject was measured: the command's run time (`exec`), the span of the
    /// workload's energy minutes, or the range (node).
    pub elapsed_s: Option<f64>,
    /// GPU time the workload held, summed over its GPUs (collector reports of workloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_seconds: Option<f64>,
    /// Its average share of its GPUs while it held them (0..1): the share energy was split
    /// by (SM time, else memory, else equal), weighted by time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avg_share: Option<f64>,
    /// Its time-weighted tensor-core activity and SM occupancy (percent, GPM), each
    /// interval's GPU figure times its share: exact alone on a GPU, an estimate on a
    /// shared one; `None` where its GPUs report no GPM (collector reports of workloads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_active_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_occupancy_pct: Option<f64>,
    /// Every minute of its GPUs before this time is accounted (the oldest of their
    /// accounting watermarks; collector reports): figures before it are final, later
    /// ones may still change or arrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounted_to_ms: Option<UnixMs>,
    /// The GPUs it used.
    pub gpus: Vec<GpuRef>,
    pub energy: EnergySummary,
    pub carbon: CarbonSummary,
    pub metrics: MetricSummary,
    /// Per-GPU time series (bucket averages) for the plot; empty when not asked for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<GpuSeries>,
    /// Carbon intensity over the range (one point per slot start), for the plot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intensity: Vec<IntensityPoint>,
}

/// What a report is about.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Subject {
    /// `container`, `pod`, `job`, `node` or `command`.
    pub kind: String,
    /// The key: a `Workload::key()` (`container:<id>`, `slurm:<job>`), `pod:<uid>`, a node
    /// name, or the command line.
    pub key: String,
    /// A human name when known: container name, `namespace/pod`, job id.
    pub name: Option<String>,
    /// The nodes its GPUs are on.
    pub nodes: Vec<String>,
    /// `exec` only: the command's exit code (`None`: killed by a signal, or not a command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// A GPU the subject used.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuRef {
    pub node: String,
    pub index: u32,
    pub uuid: String,
    pub name: String,
}

/// Energy, and how it was measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnergySummary {
    /// GPU energy; `None` when no interval was measured.
    pub energy_j: Option<f64>,
    pub energy_kwh: Option<f64>,
    /// Of which read from the GPUs' energy counters.
    pub counter_j: Option<f64>,
    /// Of which integrated from reported power (trapezoid: counter absent or reset).
    pub trapezoid_j: Option<f64>,
    /// `counter_j / energy_j` (0..1).
    pub counter_share: Option<f64>,
    /// Of which idle energy charged to the subject (collector, idle policy `spread`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_j: Option<f64>,
    /// Of which in minutes still open (collector): computed from the samples so far and
    /// replaced when the minute closes, so it may still change. `None` where minutes do
    /// not apply (`exec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisional_j: Option<f64>,
}

impl EnergySummary {
    /// From exact millijoule sums; `None` everywhere when nothing was measured.
    pub fn from_mj(counter_mj: Option<u64>, trapezoid_mj: Option<u64>) -> Self {
        if counter_mj.is_none() && trapezoid_mj.is_none() {
            return Self::default();
        }
        let (c, t) = (counter_mj.unwrap_or(0), trapezoid_mj.unwrap_or(0));
        let total = c + t;
        Self {
            energy_j: Some(total as f64 / 1000.0),
            energy_kwh: Some(total as f64 / 3.6e9),
            counter_j: Some(c as f64 / 1000.0),
            trapezoid_j: Some(t as f64 / 1000.0),
            counter_share: (total > 0).then(|| c as f64 / total as f64),
            idle_j: None,
            provisional_j: None,
        }
    }
}

/// Carbon, and where its intensity came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CarbonSummary {
    /// gCO2 (energy × intensity × PUE, per interval); `None` without any intensity.
    pub carbon_g: Option<f64>,
    /// Energy-weighted average intensity, gCO2/kWh (before PUE).
    pub avg_intensity_g_per_kwh: Option<f64>,
    /// Share of the energy that has a price (0..1); `carbon_g` covers that share only
    /// (the collector prices minutes as intensities arrive).
    pub priced_share: Option<f64>,
    /// Providers the intensities came from (`static`, `csv`, `uk`, `electricitymaps`).
    pub sources: Vec<String>,
    /// Regions / zones.
    pub regions: Vec<String>,
    /// Share of the energy priced at a forecast (not yet an actual), 0..1.
    pub forecast_share: Option<f64>,
    /// Share priced at an estimate (provider unreachable: last known or default), 0..1.
    pub estimated_share: Option<f64>,
    /// Power usage effectiveness applied (energy-weighted when it varied).
    pub pue: Option<f64>,
}

/// The GPUs' metrics while the subject used them. Averages and maxima are over
/// GPU-samples (each GPU at each sample time), so they are per GPU; `None` when no sample
/// reported the metric.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricSummary {
    /// GPU-samples the figures are made of.
    pub samples: u64,
    pub util_gpu_avg_pct: Option<f64>,
    pub util_gpu_max_pct: Option<f64>,
    pub power_avg_w: Option<f64>,
    pub power_max_w: Option<f64>,
    /// The highest enforced power limit seen.
    pub power_limit_w: Option<f64>,
    pub temp_gpu_avg_c: Option<f64>,
    pub temp_gpu_max_c: Option<f64>,
    pub mem_used_avg_bytes: Option<f64>,
    pub mem_used_max_bytes: Option<f64>,
    /// The largest total memory seen.
    pub mem_total_bytes: Option<f64>,
    /// GPM averages of the GPUs (Hopper and newer; `None` without GPM), percent: SMs
    /// active, SM occupancy, tensor-core activity, DRAM bandwidth.
    #[serde(default)]
    pub sm_active_avg_pct: Option<f64>,
    #[serde(default)]
    pub sm_occupancy_avg_pct: Option<f64>,
    #[serde(default)]
    pub tensor_active_avg_pct: Option<f64>,
    #[serde(default)]
    pub dram_bw_avg_pct: Option<f64>,
}

/// One GPU's series.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSeries {
    /// `node/index` (`uuid`).
    pub gpu: String,
    pub points: Vec<SeriesPoint>,
}

/// One bucket (or sample) of a GPU: averages of what was reported in it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    pub time_ms: UnixMs,
    pub util_gpu_pct: Option<f64>,
    pub power_w: Option<f64>,
    pub mem_used_bytes: Option<f64>,
    pub temp_gpu_c: Option<f64>,
}

/// The carbon intensity from `time_ms` on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IntensityPoint {
    pub time_ms: UnixMs,
    pub g_per_kwh: f64,
    /// Region / zone.
    pub region: String,
    /// `forecast`, `actual`, `estimated`, `static` …
    pub kind: String,
}

impl Report {
    /// A report on `subject` over `[from_ms, to_ms]` with nothing measured yet.
    pub fn new(subject: Subject, from_ms: UnixMs, to_ms: UnixMs) -> Self {
        Self {
            subject,
            from: format_time(from_ms),
            to: format_time(to_ms),
            from_ms,
            to_ms,
            ..Default::default()
        }
    }

    /// The report without its time series and intensities (the summary only).
    pub fn without_series(mut self) -> Self {
        self.series.clear();
        self.intensity.clear();
        self
    }

    /// The distinct GPU model names, with counts (`2 × NVIDIA H100 80GB HBM3`).
    pub fn gpu_names(&self) -> Vec<String> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for g in &self.gpus {
            *counts.entry(g.name.as_str()).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|(name, n)| format!("{n} × {name}"))
            .collect()
    }
}

/// Running sum / count / max of one metric.
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    sum: f64,
    n: u64,
    max: Option<f64>,
}

impl Acc {
    fn add(&mut self, v: Option<f64>) {
        if let Some(v) = v {
            self.sum += v;
            self.n += 1;
            self.max = Some(self.max.map_or(v, |m| m.max(v)));
        }
    }
    fn avg(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct PointAcc {
    util: Acc,
    power: Acc,
    mem: Acc,
    temp: Acc,
}

/// Builds [`MetricSummary`] and the per-GPU series from GPU samples: the agent feeds it
/// its ticks, the collector the stored samples. Samples are bucketed by `step_ms` for the
/// series (every sample is its own point with `None`).
#[derive(Debug, Clone, Default)]
pub struct MetricsBuilder {
    step_ms: Option<i64>,
    samples: u64,
    util: Acc,
    power: Acc,
    limit: Acc,
    temp: Acc,
    mem: Acc,
    total: Acc,
    /// GPM: SMs active, occupancy, tensor, DRAM (percent).
    gpm: [Acc; 4],
    /// GPU label → bucket start → accumulators.
    series: BTreeMap<String, BTreeMap<UnixMs, PointAcc>>,
}

fn mw(v: Option<u32>) -> Option<f64> {
    v.map(|p| f64::from(p) / 1000.0)
}

impl MetricsBuilder {
    /// A builder whose series has one point per `step_ms` bucket (`None`: per sample).
    pub fn new(step_ms: Option<i64>) -> Self {
        Self {
            step_ms: step_ms.filter(|s| *s > 0),
            ..Default::default()
        }
    }

    /// Adds one GPU's sample at `time_ms`; `gpu` labels its series.
    pub fn add(&mut self, gpu: &str, time_ms: UnixMs, s: &GpuSample) {
        self.samples += 1;
        let util = s.util_gpu_pct.map(f64::from);
        let power = mw(s.power_mw);
        let temp = s.temp_gpu_c.map(f64::from);
        let mem = s.mem_used_bytes.map(|b| b as f64);
        self.util.add(util);
        self.power.add(power);
        self.limit.add(mw(s.power_limit_mw));
        self.temp.add(temp);
        self.mem.add(mem);
        self.total.add(s.mem_total_bytes.map(|b| b as f64));
        let g = &s.gpm;
        let gpm = [
            g.sm_active_cpct,
            g.sm_occupancy_cpct,
            g.tensor_active_cpct,
            g.dram_bw_cpct,
        ];
        for (acc, v) in self.gpm.iter_mut().zip(gpm) {
            acc.add(v.map(|c| f64::from(c) / 100.0));
        }
        let bucket = match self.step_ms {
            Some(step) => time_ms.div_euclid(step) * step,
            None => time_ms,
        };
        let p = self
            .series
            .entry(gpu.to_owned())
            .or_default()
            .entry(bucket)
            .or_default();
        p.util.add(util);
        p.power.add(power);
        p.mem.add(mem);
        p.temp.add(temp);
    }

    /// The summary.
    pub fn summary(&self) -> MetricSummary {
        MetricSummary {
            samples: self.samples,
            util_gpu_avg_pct: self.util.avg(),
            util_gpu_max_pct: self.util.max,
            power_avg_w: self.power.avg(),
            power_max_w: self.power.max,
            power_limit_w: self.limit.max,
            temp_gpu_avg_c: self.temp.avg(),
            temp_gpu_max_c: self.temp.max,
            mem_used_avg_bytes: self.mem.avg(),
            mem_used_max_bytes: self.mem.max,
            mem_total_bytes: self.total.max,
            sm_active_avg_pct: self.gpm[0].avg(),
            sm_occupancy_avg_pct: self.gpm[1].avg(),
            tensor_active_avg_pct: self.gpm[2].avg(),
            dram_bw_avg_pct: self.gpm[3].avg(),
        }
    }

    /// The per-GPU series, by label.
    pub fn series(&self) -> Vec<GpuSeries> {
        self.series
            .iter()
            .map(|(gpu, points)| GpuSeries {
                gpu: gpu.clone(),
                points: points
                    .iter()
                    .map(|(t, p)| SeriesPoint {
                        time_ms: *t,
                        util_gpu_pct: p.util.avg(),
                        power_w: p.power.avg(),
                        mem_used_bytes: p.mem.avg(),
                        temp_gpu_c: p.temp.avg(),
                    })
                    .collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_metrics_stay_absent() {
        let mut b = MetricsBuilder::new(None);
        b.add(
            "n/0",
            1000,
            &GpuSample {
                util_gpu_pct: Some(50),
                ..Default::default()
            },
        );
        b.add(
            "n/0",
            2000,
            &GpuSample {
                util_gpu_pct: Some(100),
                power_mw: Some(300_000),
                ..Default::default()
            },
        );
        let s = b.summary();
        assert_eq!(s.samples, 2);
        assert_eq!(s.util_gpu_avg_pct, Some(75.0));
        // One sample reported power: the average is over that one, not over two.
        assert_eq!(s.power_avg_w, Some(300.0));
        assert_eq!(s.temp_gpu_avg_c, None);
        assert_eq!(s.mem_total_bytes, None);
        let series = b.series();
        assert_eq!(series[0].points[0].power_w, None);
    }

    #[test]
    fn buckets_average_their_samples() {
        let mut b = MetricsBuilder::new(Some(10_000));
        for (t, u) in [(1000, 10), (9000, 30), (12_000, 50)] {
            b.add(
                "n/0",
                t,
                &GpuSample {
                    util_gpu_pct: Some(u),
                    ..Default::default()
                },
            );
        }
        let pts = &b.series()[0].points;
        assert_eq!(pts.len(), 2);
        assert_eq!((pts[0].time_ms, pts[0].util_gpu_pct), (0, Some(20.0)));
        assert_eq!((pts[1].time_ms, pts[1].util_gpu_pct), (10_000, Some(50.0)));
    }

    #[test]
    fn energy_from_nothing_is_absent() {
        assert_eq!(EnergySummary::from_mj(None, None), EnergySummary::default());
        let e = EnergySummary::from_mj(Some(3_000), Some(1_000));
        assert_eq!(e.energy_j, Some(4.0));
        assert_eq!(e.counter_share, Some(0.75));
    }
}
