//! Per-workload energy and carbon counters for `/metrics`
//! (`gpufleet_workload_energy_joules_total`, `gpufleet_workload_carbon_grams_total`) and
//! the current carbon intensity per provider and region.
//!
//! A background task reads the store's energy minutes (the accountant's output) every
//! `--metrics-refresh` and publishes the totals since the counters' epoch (the minute the
//! collector started), so a scrape only copies an `Arc`. The counters are **monotonic**:
//! minutes are recomputed when late data arrives and open minutes are provisional, so a
//! total read from the store may go down; a published value never does (it holds until the
//! store's figure passes it again). The read stays small over a long uptime: minutes
//! older than [`SETTLE_AFTER`] are folded once into a per-series base and not read again
//! (a later change to them is not reflected).
//!
//! Cardinality: one series per (node, workload), at most `--metrics-max-workloads`; series
//! already published keep their place, new ones are taken biggest first, the rest are
//! counted in `gpufleet_metrics_series_dropped_total`. A workload without energy for
//! [`EVICT_AFTER`] leaves the exposition.
//!
//! The same refresh publishes the ongoing idle-but-allocated episodes
//! ([`crate::accounting::waste::ongoing`]) for `gpufleet_gpu_idle_allocated_seconds`, at
//! most `--metrics-max-workloads` of them (longest first; the rest counted).

use crate::live::state::Live;
use crate::live::status::Clock;
use crate::store::{Store, StoreError, TimeRange};
use gpufleet_carbon::{CarbonConfig, ProviderKind};
use gpufleet_core::{UnixMs, Workload};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

const MINUTE_MS: i64 = 60_000;
/// Minutes older than this (at a refresh) are folded into the base and not read again.
pub const SETTLE_AFTER: Duration = Duration::from_secs(30 * 60);
/// A settled series without energy for this long is no longer exposed.
pub const EVICT_AFTER: Duration = Duration::from_secs(3600);

/// How the counters are refreshed and bounded (`--metrics-refresh`,
/// `--metrics-max-workloads`).
#[derive(Debug, Clone, Copy)]
pub struct CounterOptions {
    pub refresh: Duration,
    /// Most (node, workload) series exposed; beyond it series are dropped and counted.
    pub max_workloads: usize,
    /// The idle-but-allocated rule of `gpufleet_gpu_idle_allocated_seconds`.
    pub waste: crate::accounting::waste::WasteSettings,
}

impl Default for CounterOptions {
    fn default() -> Self {
        CounterOptions {
            refresh: Duration::from_secs(15),
            max_workloads: 5000,
            waste: crate::accounting::waste::WasteSettings::default(),
        }
    }
}

/// The labels of a workload series: where it ran and who it is. Empty means absent
/// (Prometheus treats an empty label as no label).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadLabels {
    pub node: String,
    /// `Workload::key()`: `container:<id>`, `slurm:<job>`, `host:<unit or uid>`.
    pub workload: String,
    pub kind: &'static str,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub job: String,
    /// The Slurm job's name and account (chargeback by `sum by (account)`).
    pub job_name: String,
    pub account: String,
    pub user: String,
}

impl WorkloadLabels {
    pub fn new(node: &str, w: &Workload) -> WorkloadLabels {
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        WorkloadLabels {
            node: node.to_owned(),
            workload: w.key(),
            kind: w.kind.as_str(),
            namespace: text(&w.namespace),
            pod: w
                .pod_name
                .clone()
                .or_else(|| w.pod_uid.clone())
                .unwrap_or_default(),
            container: w
                .container_name
                .clone()
                .or_else(|| w.container_id.clone())
                .unwrap_or_default(),
            job: text(&w.job_id),
            job_name: text(&w.job_name),
            account: text(&w.account),
            user: w.uid.map(|u| u.to_string()).unwrap_or_default(),
        }
    }
}

/// One series' totals since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub active_mj: u64,
    pub idle_mj: u64,
    /// `None` while none of its energy has a price.
    pub carbon_g: Option<f64>,
    /// Its newest energy minute (for eviction).
    pub last_minute_ms: UnixMs,
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.active_mj = self.active_mj.saturating_add(o.active_mj);
        self.idle_mj = self.idle_mj.saturating_add(o.idle_mj);
        self.carbon_g = match (self.carbon_g, o.carbon_g) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        self.last_minute_ms = self.last_minute_ms.max(o.last_minute_ms);
    }

    /// The larger of each figure: what keeps a published counter from going down.
    fn max(&mut self, o: &Totals) {
        self.active_mj = self.active_mj.max(o.active_mj);
        self.idle_mj = self.idle_mj.max(o.idle_mj);
        self.carbon_g = match (self.carbon_g, o.carbon_g) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.last_minute_ms = self.last_minute_ms.max(o.last_minute_ms);
    }
}

/// What a scrape exposes; replaced whole at each refresh.
#[derive(Debug, Default)]
pub struct Published {
    /// Start of the counters (Unix ms): they count energy minutes from here on.
    pub since_ms: Option<UnixMs>,
    pub series: Vec<(WorkloadLabels, Totals)>,
    /// Intensity now, per provider and region (g/kWh).
    pub intensity: Vec<(ProviderKind, String, f64)>,
    /// Workload series left out by the cap, summed over refreshes.
    pub dropped: u64,
    /// Ongoing idle-but-allocated episodes ([`crate::accounting::waste::ongoing`]), at
    /// most the series cap, longest first.
    pub idle_allocated: Vec<IdleAllocated>,
    /// Episodes left out by the cap, summed over refreshes.
    pub idle_allocated_dropped: u64,
}

/// One ongoing idle-but-allocated episode, for `gpufleet_gpu_idle_allocated_seconds`.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleAllocated {
    pub labels: WorkloadLabels,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    /// Idle so far.
    pub seconds: f64,
}

/// The gauge's series from ongoing episodes: longest first, at most `max`; and how many
/// were left out.
pub fn idle_allocated(
    episodes: &[crate::accounting::waste::Episode],
    max: usize,
) -> (Vec<IdleAllocated>, u64) {
    let mut all: Vec<IdleAllocated> = episodes
        .iter()
        .filter(|e| e.ongoing)
        .map(|e| IdleAllocated {
            labels: WorkloadLabels::new(&e.node, &e.workload),
            gpu_uuid: e.gpu_uuid.clone(),
            gpu_index: e.gpu_index,
            seconds: e.idle_ms() as f64 / 1000.0,
        })
        .collect();
    all.sort_by(|a, b| {
        b.seconds
            .total_cmp(&a.seconds)
            .then_with(|| (&a.labels, &a.gpu_uuid).cmp(&(&b.labels, &b.gpu_uuid)))
    });
    let dropped = all.len().saturating_sub(max) as u64;
    all.truncate(max);
    (all, dropped)
}

/// The published counters, shared by the refresh task and `/metrics`
/// ([`crate::api::router::AppState::workloads`]).
#[derive(Debug, Default)]
pub struct WorkloadCounters {
    current: RwLock<Arc<Published>>,
    /// Per-process series left out of scrapes by the cap, summed over scrapes.
    pub process_dropped: AtomicU64,
    /// The cap on per-workload and per-process series (0: the default).
    max_series: AtomicU64,
}

impl WorkloadCounters {
    pub fn new(max_series: usize) -> WorkloadCounters {
        let c = WorkloadCounters::default();
        c.max_series.store(max_series as u64, Relaxed);
        c
    }

    /// What the newest refresh published.
    pub fn current(&self) -> Arc<Published> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Most series per family (`--metrics-max-workloads`).
    pub fn max_series(&self) -> usize {
        match self.max_series.load(Relaxed) {
            0 => CounterOptions::default().max_workloads,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        }
    }

    fn publish(&self, p: Published) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(p);
    }
}

/// The counters' state between refreshes: pure, so its rules are unit-tested.
#[derive(Debug)]
pub struct Accumulator {
    since_ms: UnixMs,
    /// Minutes before this are in `base`.
    settled_to: UnixMs,
    base: HashMap<WorkloadLabels, Totals>,
    published: HashMap<WorkloadLabels, Totals>,
    dropped: u64,
    max: usize,
}

impl Accumulator {
    /// Counters from the minute holding `start_ms` on.
    pub fn new(start_ms: UnixMs, max: usize) -> Accumulator {
        let since = start_ms - start_ms.rem_euclid(MINUTE_MS);
        Accumulator {
            since_ms: since,
            settled_to: since,
            base: HashMap::new(),
            published: HashMap::new(),
            dropped: 0,
            max,
        }
    }

    /// The range a refresh at `now` reads.
    pub fn window(&self, now: UnixMs) -> TimeRange {
        TimeRange {
            from_ms: self.settled_to,
            to_ms: now.max(self.settled_to),
        }
    }

    /// Merges a refresh's window sums into the published totals: base + window, never
    /// below what was published, at most `max` series.
    pub fn apply(
        &mut self,
        window: &HashMap<WorkloadLabels, Totals>,
    ) -> Vec<(WorkloadLabels, Totals)> {
        let mut totals: HashMap<&WorkloadLabels, Totals> =
            self.base.iter().map(|(k, v)| (k, *v)).collect();
        for (k, v) in window {
            totals.entry(k).or_default().add(v);
        }
        let mut fresh: Vec<(&WorkloadLabels, Totals)> = Vec::new();
        for (k, t) in totals {
            match self.published.get_mut(k) {
                Some(p) => p.max(&t),
                None => fresh.push((k, t)),
            }
        }
        // New series: biggest first, while there is room.
        fresh.sort_by(|a, b| {
            let e = |t: &Totals| t.active_mj + t.idle_mj;
            e(&b.1).cmp(&e(&a.1)).then_with(|| a.0.cmp(b.0))
        });
        let room = self.max.saturating_sub(self.published.len());
        let left_out = fresh.len().saturating_sub(room);
        self.dropped += left_out as u64;
        for (k, t) in fresh.into_iter().take(room) {
            self.published.insert(k.clone(), t);
        }
        let mut out: Vec<(WorkloadLabels, Totals)> = self
            .published
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Whether minutes are old enough at `now` to be folded into the base, and up to when.
    pub fn settle_to(&self, now: UnixMs) -> Option<UnixMs> {
        let settle = SETTLE_AFTER.as_millis() as i64;
        (now - self.settled_to >= settle).then(|| {
            let to = now - settle / 2;
            to - to.rem_euclid(MINUTE_MS)
        })
    }

    /// Folds the sums of `[settled_to, to)` into the base, and forgets series that had no
    /// energy since `EVICT_AFTER` before `to`.
    pub fn settle(&mut self, sums: &HashMap<WorkloadLabels, Totals>, to: UnixMs) {
        for (k, v) in sums {
            self.base.entry(k.clone()).or_default().add(v);
        }
        self.settled_to = to;
        let horizon = to - EVICT_AFTER.as_millis() as i64;
        self.base.retain(|_, t| t.last_minute_ms >= horizon);
        let base = &self.base;
        self.published
            .retain(|k, t| base.contains_key(k) || t.last_minute_ms >= horizon);
    }

    pub fn since_ms(&self) -> UnixMs {
        self.since_ms
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Energy and carbon per (node, workload) over `range`, from the store.
async fn read_sums(
    store: &dyn Store,
    range: TimeRange,
) -> Result<HashMap<WorkloadLabels, Totals>, StoreError> {
    let rows = store.workload_energy(range, None, None).await?;
    let carbon = store.workload_carbon(range, None, None).await?;
    let mut node_of: HashMap<&str, &str> = HashMap::new();
    let mut by_key: HashMap<(String, String), WorkloadLabels> = HashMap::new();
    let mut sums: HashMap<WorkloadLabels, Totals> = HashMap::new();
    for r in &rows {
        node_of.insert(&r.gpu_uuid, &r.node_name);
        let labels = WorkloadLabels::new(&r.node_name, &r.workload);
        sums.entry(labels.clone()).or_default().add(&Totals {
            active_mj: r.active_mj,
            // Idle charged to it: its idle share under `spread`, none under `separate`.
            idle_mj: r.energy_mj.saturating_sub(r.active_mj),
            carbon_g: None,
            last_minute_ms: r.last_minute_ms,
        });
        by_key.insert((r.node_name.clone(), labels.workload.clone()), labels);
    }
    for c in carbon {
        let priced = c.totals.priced_mj > 0 || !c.totals.sources.is_empty();
        let Some(node) = node_of.get(c.gpu_uuid.as_str()) else {
            continue;
        };
        if !priced {
            continue;
        }
        if let Some(labels) = by_key.get(&((*node).to_owned(), c.workload_key.clone()))
            && let Some(t) = sums.get_mut(labels)
        {
            t.carbon_g = Some(t.carbon_g.unwrap_or(0.0) + c.totals.carbon_g);
        }
    }
    Ok(sums)
}

/// The intensity now of every provider and region some node is priced with.
async fn read_intensity(
    store: &dyn Store,
    live: &Live,
    config: &CarbonConfig,
    now: UnixMs,
) -> Vec<(ProviderKind, String, f64)> {
    if !config.enabled() {
        return Vec::new();
    }
    let nodes: Vec<(String, BTreeMap<String, String>)> = live.read(|s| {
        s.nodes
            .values()
            .map(|n| (n.record.name.clone(), n.record.labels.clone()))
            .collect()
    });
    // One provider per (kind, region): local figures (static, CSV) are asked directly,
    // as the carbon job prices them; remote ones are read from the store's cache, never
    // fetched from here.
    let mut pairs = BTreeMap::new();
    for (name, labels) in &nodes {
        if let Ok(Some(nc)) = config.node(name, labels) {
            pairs
                .entry((nc.settings.kind, nc.region.clone()))
                .or_insert(nc);
        }
    }
    let mut out = Vec::new();
    for ((kind, region), nc) in pairs {
        let slot = match kind {
            ProviderKind::Static | ProviderKind::Csv => nc
                .provider
                .slots(&region, now, now + 1)
                .await
                .map(|s| s.into_iter().rfind(|s| s.from_ms <= now))
                .map_err(|e| e.to_string()),
            ProviderKind::Uk | ProviderKind::Electricitymaps => store
                .last_intensity_before(kind, &region, now)
                .await
                .map_err(|e| e.to_string()),
        };
        match slot {
            Ok(Some(slot)) => out.push((kind, region, slot.g_per_kwh)),
            Ok(None) => {}
            Err(e) => warn!(region = %region, error = %e, "reading carbon intensity for /metrics"),
        }
    }
    out
}

/// Refreshes `counters` every `options.refresh` until `stop`.
pub fn spawn(
    store: Arc<dyn Store>,
    live: Arc<Live>,
    carbon: Arc<CarbonConfig>,
    counters: Arc<WorkloadCounters>,
    options: CounterOptions,
    clock: Clock,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut acc = Accumulator::new(clock(), options.max_workloads);
        let mut idle_dropped = 0u64;
        // Keeps the ongoing episodes between refreshes: each reads only the new minutes.
        let mut ongoing = crate::accounting::waste::OngoingTracker::default();
        let mut ticker = tokio::time::interval(options.refresh);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticker.tick() => {}
            }
            let now = clock();
            let sums = match read_sums(store.as_ref(), acc.window(now)).await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "refreshing workload counters failed; retrying next period");
                    continue;
                }
            };
            let series = acc.apply(&sums);
            let intensity = read_intensity(store.as_ref(), &live, &carbon, now).await;
            let idle = match ongoing.refresh(store.as_ref(), options.waste, now).await {
                Ok(episodes) => {
                    let (series, dropped) = idle_allocated(&episodes, options.max_workloads);
                    idle_dropped += dropped;
                    series
                }
                Err(e) => {
                    warn!(error = %e, "reading idle-but-allocated episodes failed; retrying next period");
                    counters.current().idle_allocated.clone()
                }
            };
            counters.publish(Published {
                since_ms: Some(acc.since_ms()),
                series,
                intensity,
                dropped: acc.dropped(),
                idle_allocated: idle,
                idle_allocated_dropped: idle_dropped,
            });
            if let Some(to) = acc.settle_to(now) {
                let range = TimeRange {
                    from_ms: acc.window(now).from_ms,
                    to_ms: to - 1,
                };
                match read_sums(store.as_ref(), range).await {
                    Ok(s) => acc.settle(&s, to),
                    Err(e) => warn!(error = %e, "settling workload counters failed; retrying"),
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::WorkloadKind;

    #[test]
    fn idle_allocated_series_are_the_ongoing_episodes_longest_first_and_capped() {
        use crate::accounting::waste::Episode;
        let ep = |job: &str, minutes: i64, ongoing: bool| Episode {
            node: "n1".into(),
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            gpu_name: "A100".into(),
            workload: Workload {
                kind: WorkloadKind::Slurm,
                job_id: Some(job.into()),
                ..Default::default()
            },
            since_ms: 0,
            until_ms: minutes * MINUTE_MS,
            ongoing,
            minutes: minutes as u32,
            mem_max_bytes: None,
            energy_mj: 0,
            idle_mj: 0,
            charged_mj: 0,
            provisional_mj: 0,
            carbon_g: None,
            priced_mj: 0,
        };
        let all = [
            ep("1", 31, true),
            ep("2", 90, true),
            ep("3", 45, false),
            ep("4", 40, true),
        ];
        let (series, dropped) = idle_allocated(&all, 2);
        let got: Vec<(&str, f64)> = series
            .iter()
            .map(|s| (s.labels.job.as_str(), s.seconds))
            .collect();
        assert_eq!(got, [("2", 5400.0), ("4", 2400.0)]);
        assert_eq!(dropped, 1, "job 1 left out; job 3 is over, not dropped");
    }

    fn labels(key: &str) -> WorkloadLabels {
        let w = Workload {
            kind: WorkloadKind::Container,
            container_id: Some(key.into()),
            ..Default::default()
        };
        WorkloadLabels::new("n1", &w)
    }

    fn t(active: u64, idle: u64, minute: UnixMs) -> Totals {
        Totals {
            active_mj: active,
            idle_mj: idle,
            carbon_g: None,
            last_minute_ms: minute,
        }
    }

    #[test]
    fn published_totals_never_decrease() {
        let mut acc = Accumulator::new(0, 10);
        let a = labels("a");
        let w1 = HashMap::from([(a.clone(), t(1000, 100, 0))]);
        assert_eq!(acc.apply(&w1)[0].1.active_mj, 1000);
        // The provisional minute was recomputed lower: the counter holds.
        let w2 = HashMap::from([(a.clone(), t(900, 50, 0))]);
        let out = acc.apply(&w2);
        assert_eq!((out[0].1.active_mj, out[0].1.idle_mj), (1000, 100));
        // ... until the store's figure passes it again.
        let w3 = HashMap::from([(a.clone(), t(1500, 120, 60_000))]);
        assert_eq!(acc.apply(&w3)[0].1.active_mj, 1500);
        // A refresh that misses the series entirely keeps it too.
        assert_eq!(acc.apply(&HashMap::new())[0].1.active_mj, 1500);
    }

    #[test]
    fn settled_minutes_stay_counted() {
        let mut acc = Accumulator::new(0, 10);
        let a = labels("a");
        acc.apply(&HashMap::from([(a.clone(), t(1000, 0, 0))]));
        let to = acc.settle_to(3 * 3_600_000).expect("old enough to settle");
        acc.settle(
            &HashMap::from([(a.clone(), t(1000, 0, to - MINUTE_MS))]),
            to,
        );
        // The next window holds only newer minutes; the total is base + window.
        let out = acc.apply(&HashMap::from([(a.clone(), t(10, 0, to))]));
        assert_eq!(out[0].1.active_mj, 1010);
    }

    #[test]
    fn series_beyond_the_cap_are_dropped_and_counted() {
        let mut acc = Accumulator::new(0, 2);
        let w = HashMap::from([
            (labels("small"), t(1, 0, 0)),
            (labels("big"), t(100, 0, 0)),
            (labels("mid"), t(50, 0, 0)),
        ]);
        let out = acc.apply(&w);
        let keys: Vec<&str> = out.iter().map(|(l, _)| l.workload.as_str()).collect();
        assert_eq!(keys, ["container:big", "container:mid"]);
        assert_eq!(acc.dropped(), 1);
        // A published series keeps its place even when a newcomer outgrows it.
        let w = HashMap::from([
            (labels("mid"), t(50, 0, 0)),
            (labels("big"), t(100, 0, 0)),
            (labels("huge"), t(1_000_000, 0, 0)),
        ]);
        let out = acc.apply(&w);
        assert!(out.iter().all(|(l, _)| l.workload != "container:huge"));
        assert_eq!(acc.dropped(), 2);
    }
}
