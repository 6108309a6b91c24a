//! `gpufleet-exec` (run as `gpufleet-agent exec -- COMMAND ARGS…`): runs one command,
//! measures the GPUs its process tree uses while it runs, and makes a [`Report`] of it —
//! what iris-gpubench does for a benchmark container, without a collector. Its own binary,
//! so that the long-running agent links neither the carbon providers' HTTP client nor the
//! plotting.
//!
//! The sampling is the agent's own ([`spawn_sampling`] over a [`Sampler`]); this crate only
//! runs the child, forwards SIGINT / SIGTERM to it, and folds the ticks into a
//! [`Measure`]. A GPU counts from the tick at which one of the command's processes (the
//! child or a descendant, from `/proc`) is first listed on it until the command exits
//! (`--all-gpus`: every GPU, the whole run). Energy per interval is the GPU's energy
//! counter delta; where the counter is absent or went backwards, the trapezoid of the
//! reported power.
//!
//! - [`proctree`]: a process and its descendants, from `/proc`.

pub mod proctree;

use gpufleet_carbon::{IntensityKind, IntensitySlot, NodeCarbon};
use gpufleet_core::config::now_ms;
use gpufleet_core::{GpuSource, SourceError};
use gpufleet_core::{Inventory, Tick, UnixMs};
use gpufleet_report::{
    CarbonSummary, EnergySummary, GpuRef, IntensityPoint, MetricsBuilder, Report, Subject,
};
use gpufleet_uplink::sampler::{Sampler, spawn_sampling};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How to run and measure a command.
#[derive(Debug, Clone)]
pub struct ExecOptions {
    /// The node name written in the report.
    pub node: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Sampling interval.
    pub interval: Duration,
    /// Measure every GPU for the whole run instead of those the command's processes use.
    pub all_gpus: bool,
    /// Where `/proc` is (the command's process tree).
    pub proc_root: PathBuf,
    /// Bucket of the report's series (`None`: one point per sample).
    pub series_step: Option<Duration>,
    /// The carbon intensity provider, region and PUE to price the energy with; `None`:
    /// no carbon figures (absent, not 0).
    pub carbon: Option<NodeCarbon>,
}

/// Why a command could not be measured.
#[derive(Debug, Error)]
pub enum ExecError {
    #[error("no command given: write `gpufleet-agent exec [OPTIONS] -- COMMAND [ARGS…]`")]
    NoCommand,
    #[error("the interval must be positive")]
    Interval,
    #[error("cannot read the GPU inventory: {0}")]
    Inventory(#[source] SourceError),
    #[error("the GPU source panicked")]
    SourcePanicked,
    #[error("cannot run {program:?}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot wait for the command: {0}")]
    Wait(#[source] std::io::Error),
    #[error("cannot listen for signals: {0}")]
    Signals(#[source] std::io::Error),
    #[error("cannot start the sampling thread: {0}")]
    SamplerThread(#[source] std::io::Error),
}

/// A finished run: the report and how the command ended.
#[derive(Debug, Clone)]
pub struct ExecOutcome {
    pub report: Report,
    /// The exit code to leave with: the command's, or 128 + the signal that killed it.
    pub exit_code: i32,
}

/// One GPU's last reading, for the next interval.
#[derive(Debug, Clone, Copy)]
struct Last {
    time_ms: UnixMs,
    energy_mj: Option<u64>,
    power_mw: Option<u32>,
}

/// The energy of one interval of one GPU: the counter delta when both ends have it and it
/// did not go backwards, else the trapezoid of the power at both ends, else unknown.
/// Returns (mJ, measured by the counter).
pub fn interval_energy(
    prev: (UnixMs, Option<u64>, Option<u32>),
    cur: (UnixMs, Option<u64>, Option<u32>),
) -> Option<(u64, bool)> {
    if let (Some(a), Some(b)) = (prev.1, cur.1)
        && b >= a
    {
        return Some((b - a, true));
    }
    match (prev.2, cur.2) {
        (Some(p0), Some(p1)) if cur.0 > prev.0 => {
            // mW × ms = µJ; / 1000 = mJ.
            let uj = (u64::from(p0) + u64::from(p1)) * (cur.0 - prev.0) as u64 / 2;
            Some(((uj + 500) / 1000, false))
        }
        _ => None,
    }
}

/// Folds ticks into the figures of a report.
#[derive(Debug)]
pub struct Measure {
    all_gpus: bool,
    node: String,
    inventory: Inventory,
    last: BTreeMap<String, Last>,
    /// GPUs (uuid) the command has used, from the tick they were first seen on.
    used: BTreeSet<String>,
    counter_mj: Option<u64>,
    trapezoid_mj: Option<u64>,
    /// Energy per (GPU, interval end): what a carbon price is applied to.
    pub intervals: Vec<(String, UnixMs, UnixMs, u64)>,
    metrics: MetricsBuilder,
    first_ms: Option<UnixMs>,
    last_ms: Option<UnixMs>,
}

impl Measure {
    pub fn new(node: &str, inventory: Inventory, all_gpus: bool, step: Option<Duration>) -> Self {
        Self {
            all_gpus,
            node: node.to_owned(),
            inventory,
            last: BTreeMap::new(),
            used: BTreeSet::new(),
            counter_mj: None,
            trapezoid_mj: None,
            intervals: Vec::new(),
            metrics: MetricsBuilder::new(step.map(|s| s.as_millis() as i64)),
            first_ms: None,
            last_ms: None,
        }
    }

    fn label(&self, uuid: &str) -> String {
        match self.inventory.gpus.iter().find(|g| g.uuid == uuid) {
            Some(g) => format!("{}/{}", self.node, g.index),
            None => format!("{}/{uuid}", self.node),
        }
    }

    /// Adds a tick; `tree` holds the command's pids (ignored with `--all-gpus`).
    pub fn add(&mut self, tick: &Tick, tree: &BTreeSet<u32>) {
        self.first_ms.get_or_insert(tick.time_ms);
        self.last_ms = Some(tick.time_ms);
        if !self.all_gpus {
            for p in &tick.processes {
                if tree.contains(&p.pid) && !self.used.contains(&p.gpu_uuid) {
                    info!(gpu = %p.gpu_uuid, pid = p.pid, "the command uses this GPU");
                    self.used.insert(p.gpu_uuid.clone());
                }
            }
        }
        for g in &tick.gpus {
            let counted = self.all_gpus || self.used.contains(&g.gpu_uuid);
            let cur = Last {
                time_ms: tick.time_ms,
                energy_mj: g.energy_mj,
                power_mw: g.power_mw,
            };
            if counted {
                self.used.insert(g.gpu_uuid.clone());
                if let Some(prev) = self.last.get(&g.gpu_uuid)
                    && let Some((mj, counter)) = interval_energy(
                        (prev.time_ms, prev.energy_mj, prev.power_mw),
                        (cur.time_ms, cur.energy_mj, cur.power_mw),
                    )
                {
                    let sum = if counter {
                        &mut self.counter_mj
                    } else {
                        &mut self.trapezoid_mj
                    };
                    *sum = Some(sum.unwrap_or(0) + mj);
                    self.intervals
                        .push((g.gpu_uuid.clone(), prev.time_ms, cur.time_ms, mj));
                }
                let label = self.label(&g.gpu_uuid);
                self.metrics.add(&label, tick.time_ms, g);
            }
            self.last.insert(g.gpu_uuid.clone(), cur);
        }
    }

    /// The report so far, on `subject`.
    pub fn report(&self, subject: Subject, elapsed: Option<Duration>) -> Report {
        let from = self.first_ms.unwrap_or_else(now_ms);
        let to = self.last_ms.unwrap_or(from);
        let mut r = Report::new(subject, from, to);
        r.elapsed_s = elapsed.map(|d| d.as_secs_f64());
        r.gpus = self
            .inventory
            .gpus
            .iter()
            .filter(|g| self.used.contains(&g.uuid))
            .map(|g| GpuRef {
                node: self.node.clone(),
                index: g.index,
                uuid: g.uuid.clone(),
                name: g.name.clone(),
            })
            .collect();
        r.energy = EnergySummary::from_mj(self.counter_mj, self.trapezoid_mj);
        r.metrics = self.metrics.summary();
        r.series = self.metrics.series();
        r
    }
}

/// The exit code of a finished child: its own, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Runs the command under measurement: see the module documentation.
pub async fn run_exec(
    opts: ExecOptions,
    source: Box<dyn GpuSource>,
) -> Result<ExecOutcome, ExecError> {
    use tokio::signal::unix::{SignalKind, signal};
    let (program, args) = opts.command.split_first().ok_or(ExecError::NoCommand)?;
    if opts.interval.is_zero() {
        return Err(ExecError::Interval);
    }
    let mut sampler = Sampler::new(source, None);
    let (sampler, inventory) = tokio::task::spawn_blocking(move || {
        let inv = sampler.inventory();
        (sampler, inv)
    })
    .await
    .map_err(|_| ExecError::SourcePanicked)?;
    let inventory = inventory.map_err(ExecError::Inventory)?;
    let mut term = signal(SignalKind::terminate()).map_err(ExecError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ExecError::Signals)?;

    let mut measure = Measure::new(&opts.node, inventory, opts.all_gpus, opts.series_step);
    let started = Instant::now();
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env_remove(gpufleet_agent::cli::AGENT_VERSION_ENV)
        .spawn()
        .map_err(|source| ExecError::Spawn {
            program: program.clone(),
            source,
        })?;
    let pid = child.id();
    info!(pid, command = %opts.command.join(" "), "command started");
    let stop = CancellationToken::new();
    let (tx, mut rx) = mpsc::channel::<Tick>(16);
    let sampling = spawn_sampling(
        sampler,
        opts.interval,
        move |tick| tx.blocking_send(tick).is_ok(),
        stop.clone(),
    )
    .map_err(ExecError::SamplerThread)?;
    // Every pid ever seen in the tree: a process that left it (reparented, or exited
    // before its GPU listing caught up) still counts as the command's.
    let mut known: BTreeSet<u32> = pid.into_iter().collect();
    let observe = |measure: &mut Measure, tick: &Tick, known: &mut BTreeSet<u32>| {
        if !opts.all_gpus
            && let Some(root) = pid
            && !tick.processes.is_empty()
        {
            known.extend(proctree::descendants(&opts.proc_root, root));
        }
        measure.add(tick, known);
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(ExecError::Wait)?,
            Some(tick) = rx.recv() => observe(&mut measure, &tick, &mut known),
            _ = term.recv() => forward(pid, rustix::process::Signal::TERM),
            _ = int.recv() => forward(pid, rustix::process::Signal::INT),
        }
    };
    let elapsed = started.elapsed();
    stop.cancel();
    while let Some(tick) = rx.recv().await {
        observe(&mut measure, &tick, &mut known);
    }
    // One last reading at the exit, so the run's last interval counts.
    if let Some(mut sampler) = sampling.join().await {
        let at = now_ms().max(measure.last_ms.unwrap_or(0) + 1);
        match tokio::task::spawn_blocking(move || sampler.sample(at)).await {
            Ok(Ok(tick)) => observe(&mut measure, &tick, &mut known),
            Ok(Err(e)) => warn!(error = %e, "the last reading failed"),
            Err(e) => warn!(error = %e, "the last reading panicked"),
        }
    }
    let code = exit_code(status);
    let subject = Subject {
        kind: "command".into(),
        key: opts.command.join(" "),
        name: Some(program.clone()),
        nodes: vec![opts.node.clone()],
        exit_code: status.code(),
    };
    info!(exit_code = code, elapsed = ?elapsed, "command finished");
    let mut report = measure.report(subject, Some(elapsed));
    if let Some(carbon) = &opts.carbon {
        price_report(&mut report, &measure.intervals, carbon).await;
    }
    Ok(ExecOutcome {
        report,
        exit_code: code,
    })
}

/// Fetches the intensity over the report's range and prices its intervals. When the
/// provider fails, the latest figure it gives is used and every interval is marked
/// estimated; when that fails too, carbon stays absent (never 0) and a warning says why.
async fn price_report(
    report: &mut Report,
    intervals: &[(String, UnixMs, UnixMs, u64)],
    carbon: &NodeCarbon,
) {
    let (from, to) = (report.from_ms, report.to_ms.max(report.from_ms + 1));
    let slots = match carbon.provider.slots(&carbon.region, from, to).await {
        Ok(slots) if !slots.is_empty() => slots,
        first => {
            if let Err(e) = &first {
                warn!(error = %e, "no carbon intensity for the run; trying the latest figure");
            }
            match carbon.provider.latest(&carbon.region).await {
                Ok(mut latest) => {
                    latest.estimated = true;
                    vec![latest]
                }
                Err(e) => {
                    warn!(error = %e, "no carbon intensity at all: the report has no carbon figures");
                    return;
                }
            }
        }
    };
    let (summary, points) = price(intervals, &slots, carbon.pue);
    report.carbon = summary;
    report.intensity = points;
}

/// Prices energy intervals `(gpu, from, to, mJ)` with intensity slots: each interval's
/// energy is split over the slots it overlaps, in proportion to the overlap; a part that no
/// slot covers is priced at the nearest slot before it (else the first one) and counted
/// as estimated. Returns the carbon summary and the slots as plot points.
pub fn price(
    intervals: &[(String, UnixMs, UnixMs, u64)],
    slots: &[IntensitySlot],
    pue: f64,
) -> (CarbonSummary, Vec<IntensityPoint>) {
    let mut slots: Vec<&IntensitySlot> = slots.iter().collect();
    slots.sort_by_key(|s| s.from_ms);
    let points = slots
        .iter()
        .map(|s| IntensityPoint {
            time_ms: s.from_ms,
            g_per_kwh: s.g_per_kwh,
            region: s.region.clone(),
            kind: if s.estimated {
                "estimated".to_owned()
            } else {
                s.kind.as_str().to_owned()
            },
        })
        .collect();
    let Some(&first) = slots.first() else {
        return (CarbonSummary::default(), points);
    };
    let (mut kwh, mut weighted, mut forecast, mut estimated) = (0.0, 0.0, 0.0, 0.0);
    let mut add = |part_kwh: f64, s: &IntensitySlot, est: bool| {
        kwh += part_kwh;
        weighted += part_kwh * s.g_per_kwh;
        if s.kind == IntensityKind::Forecast {
            forecast += part_kwh;
        }
        if est || s.estimated {
            estimated += part_kwh;
        }
    };
    for (_, a, b, mj) in intervals {
        let dur = (b - a).max(1) as f64;
        let e_kwh = *mj as f64 / 3.6e9;
        let mut covered = 0i64;
        for s in &slots {
            let ov = s.to_ms.min(*b) - s.from_ms.max(*a);
            if ov > 0 {
                covered += ov;
                add(e_kwh * ov as f64 / dur, s, false);
            }
        }
        let rest = (b - a).max(1) - covered;
        if rest > 0 {
            let s = slots
                .iter()
                .rev()
                .find(|s| s.from_ms <= *a)
                .copied()
                .unwrap_or(first);
            add(e_kwh * rest as f64 / dur, s, true);
        }
    }
    let mut sources: Vec<String> = slots
        .iter()
        .map(|s| s.provider.as_str().to_owned())
        .collect();
    sources.sort();
    sources.dedup();
    let mut regions: Vec<String> = slots.iter().map(|s| s.region.clone()).collect();
    regions.sort();
    regions.dedup();
    let share = |x: f64| (kwh > 0.0).then(|| x / kwh);
    let summary = CarbonSummary {
        carbon_g: (!intervals.is_empty()).then_some(weighted * pue),
        avg_intensity_g_per_kwh: share(weighted),
        priced_share: share(kwh),
        sources,
        regions,
        forecast_share: share(forecast),
        estimated_share: share(estimated),
        pue: Some(pue),
    };
    (summary, points)
}

fn forward(pid: Option<u32>, sig: rustix::process::Signal) {
    let Some(pid) = pid.and_then(|p| rustix::process::Pid::from_raw(p as i32)) else {
        return;
    };
    info!(
        pid = pid.as_raw_nonzero().get(),
        signal = sig.as_raw(),
        "forwarding the signal to the command"
    );
    if let Err(e) = rustix::process::kill_process(pid, sig) {
        warn!(error = %e, "cannot forward the signal (the command already exited?)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::{GpuInfo, GpuSample, ProcessSample};

    #[test]
    fn interval_energy_prefers_the_counter_and_falls_back_to_power() {
        assert_eq!(
            interval_energy(
                (0, Some(1000), Some(100_000)),
                (1000, Some(1500), Some(300_000))
            ),
            Some((500, true))
        );
        // Counter reset: 200 W average over 1 s = 200 J.
        assert_eq!(
            interval_energy(
                (0, Some(9000), Some(100_000)),
                (1000, Some(10), Some(300_000))
            ),
            Some((200_000, false))
        );
        assert_eq!(
            interval_energy((0, None, Some(100_000)), (500, None, Some(100_000))),
            Some((50_000, false))
        );
        assert_eq!(
            interval_energy((0, None, None), (1000, Some(5), Some(1))),
            None
        );
    }

    fn inv() -> Inventory {
        Inventory {
            gpus: (0..2)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    name: "sim".into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn tick(t: UnixMs, energy: [u64; 2], pids: &[(u32, u32)]) -> Tick {
        Tick {
            time_ms: t,
            gpus: (0..2)
                .map(|i| GpuSample {
                    gpu_uuid: format!("GPU-{i}"),
                    energy_mj: Some(energy[i]),
                    power_mw: Some(100_000),
                    ..Default::default()
                })
                .collect(),
            processes: pids
                .iter()
                .map(|&(gpu, pid)| ProcessSample {
                    gpu_uuid: format!("GPU-{gpu}"),
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn only_gpus_the_tree_uses_count_from_when_they_are_seen() {
        let tree = BTreeSet::from([42]);
        let mut m = Measure::new("n", inv(), false, None);
        // GPU 1 runs someone else's process throughout; ours appears on GPU 0 at t=2000.
        m.add(&tick(0, [0, 0], &[(1, 7)]), &tree);
        m.add(&tick(1000, [100, 1000], &[(1, 7)]), &tree);
        m.add(&tick(2000, [300, 2000], &[(0, 42), (1, 7)]), &tree);
        m.add(&tick(3000, [600, 3000], &[(1, 7)]), &tree);
        let r = m.report(Subject::default(), None);
        assert_eq!(r.gpus.len(), 1);
        assert_eq!(r.gpus[0].uuid, "GPU-0");
        // Intervals ending at 2000 and 3000: 200 + 300 mJ; none of GPU 1's.
        assert_eq!(r.energy.energy_j, Some(0.5));
        assert_eq!(r.energy.counter_share, Some(1.0));
        assert_eq!(r.metrics.samples, 2);

        let mut all = Measure::new("n", inv(), true, None);
        all.add(&tick(0, [0, 0], &[]), &BTreeSet::new());
        all.add(&tick(1000, [100, 1000], &[]), &BTreeSet::new());
        assert_eq!(
            all.report(Subject::default(), None).energy.energy_j,
            Some(1.1)
        );
    }

    fn slot(from: UnixMs, to: UnixMs, g: f64, kind: IntensityKind) -> IntensitySlot {
        IntensitySlot {
            from_ms: from,
            to_ms: to,
            g_per_kwh: g,
            kind,
            factor_type: gpufleet_carbon::FactorType::Direct,
            provider: gpufleet_carbon::ProviderKind::Uk,
            region: "13".into(),
            fetched_at_ms: 0,
            estimated: false,
        }
    }

    #[test]
    fn each_interval_is_priced_at_the_slots_it_overlaps() {
        const KWH: u64 = 3_600_000_000; // mJ
        let slots = [
            slot(1000, 2000, 100.0, IntensityKind::Actual),
            slot(2000, 3000, 300.0, IntensityKind::Forecast),
        ];
        // 1 kWh inside slot 1; 1 kWh half in each; 1 kWh past the last slot (estimated).
        let intervals = vec![
            ("g".to_owned(), 1000, 1500, KWH),
            ("g".to_owned(), 1500, 2500, KWH),
            ("g".to_owned(), 3000, 3500, KWH),
        ];
        let (c, points) = price(&intervals, &slots, 1.5);
        let g = 100.0 + (50.0 + 150.0) + 300.0;
        assert!(
            (c.carbon_g.expect("carbon") - g * 1.5).abs() < 1e-6,
            "{c:?}"
        );
        assert!((c.avg_intensity_g_per_kwh.expect("avg") - g / 3.0).abs() < 1e-9);
        assert!((c.forecast_share.expect("forecast") - 1.5 / 3.0).abs() < 1e-9);
        assert!((c.estimated_share.expect("estimated") - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(c.sources, ["uk"]);
        assert_eq!(c.regions, ["13"]);
        assert_eq!(c.pue, Some(1.5));
        assert_eq!(points.len(), 2);
        // No slots: absent, not zero.
        let (none, _) = price(&intervals, &[], 1.0);
        assert_eq!(none.carbon_g, None);
    }

    #[test]
    fn nothing_used_is_absent_not_zero() {
        let mut m = Measure::new("n", inv(), false, None);
        m.add(&tick(0, [0, 0], &[(1, 7)]), &BTreeSet::from([42]));
        m.add(&tick(1000, [5, 5], &[(1, 7)]), &BTreeSet::from([42]));
        let r = m.report(Subject::default(), None);
        assert!(r.gpus.is_empty());
        assert_eq!(r.energy.energy_j, None);
        assert_eq!(r.metrics.power_avg_w, None);
    }
}
