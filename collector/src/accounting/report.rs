//! Reports from the store: what a container, pod, Slurm job or node spent over a
//! range ([`build`]), for `gpufleet-collector report` ([`crate::cli::report`]) and the API
//! ([`crate::api::reports`]). The model and renderers are `gpufleet-report`'s, shared with
//! `gpufleet-agent exec`.
//!
//! Energy comes from the per-minute rollups (the same figures as `/api/v1/containers` and
//! `/api/v1/energy`); the GPU metrics from the raw samples of the GPUs the workload used,
//! at the sample times one of its processes was listed on them (a node: every sample).

use crate::accounting::energy::MINUTE_MS;
use crate::store::carbon::CarbonTotals;
use crate::store::{GpuId, Store, StoreError, TimeRange};
use gpufleet_core::{UnixMs, Workload, WorkloadKind};
use gpufleet_report::{
    CarbonSummary, EnergySummary, GpuRef, IntensityPoint, MetricsBuilder, Report, Subject,
};
use std::collections::{BTreeMap, BTreeSet};

/// Most raw rows read per GPU for the metrics (beyond, the newest are left out and a
/// warning is logged): a week of 1 s samples.
const MAX_ROWS_PER_GPU: usize = 7 * 86_400;
/// The series has at most about this many points per GPU.
const SERIES_POINTS: i64 = 600;

/// What a report is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportSubject {
    /// A workload key (`container:<id>`, `slurm:<job>`, `host:<unit>`); a bare id means
    /// `container:<id>`.
    Container(String),
    /// A Kubernetes pod: its UID (`pod:<uid>` or bare) or its name.
    Pod(String),
    /// A Slurm job as `sacct` writes it (`slurm:` prefix allowed); see [`JobSpec`].
    Job(String),
    /// A node: every GPU's energy, not split by workload.
    Node(String),
}

impl ReportSubject {
    fn kind(&self) -> &'static str {
        match self {
            ReportSubject::Container(_) => "container",
            ReportSubject::Pod(_) => "pod",
            ReportSubject::Job(_) => "job",
            ReportSubject::Node(_) => "node",
        }
    }

    /// Whether workload `w` is (part of) this subject.
    fn matches(&self, w: &Workload) -> bool {
        match self {
            ReportSubject::Container(key) => w.key() == *key,
            ReportSubject::Pod(p) => {
                w.pod_uid.as_deref() == Some(p.as_str()) || w.pod_name.as_deref() == Some(p)
            }
            ReportSubject::Job(j) => {
                w.kind == WorkloadKind::Slurm && JobSpec::parse(j).is_ok_and(|spec| spec.matches(w))
            }
            ReportSubject::Node(_) => true,
        }
    }

    /// Refuses a subject no workload could ever match because it is written wrong.
    fn check(&self) -> Result<(), ReportError> {
        match self {
            ReportSubject::Job(j) => JobSpec::parse(j).map(|_| ()),
            _ => Ok(()),
        }
    }

    /// Normalises the forms users type: bare ids, `pod:` / `slurm:` prefixes.
    pub fn normalized(self) -> ReportSubject {
        match self {
            ReportSubject::Container(k) if !k.contains(':') => {
                ReportSubject::Container(format!("container:{k}"))
            }
            ReportSubject::Pod(p) => {
                ReportSubject::Pod(p.strip_prefix("pod:").unwrap_or(&p).to_owned())
            }
            ReportSubject::Job(j) => {
                ReportSubject::Job(j.strip_prefix("slurm:").unwrap_or(&j).to_owned())
            }
            other => other,
        }
    }
}

/// A Slurm job as users (and `sacct`) write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobSpec {
    /// `123`: the job whose raw id is 123 and, as `sacct -j 123` lists them, every task
    /// of array job 123 and every component of heterogeneous job 123.
    Job(String),
    /// `123_4`: task 4 of array job 123 (whatever raw id the task has).
    ArrayTask(String),
    /// `123+1`: component 1 of heterogeneous job 123.
    HetComponent(String),
}

impl JobSpec {
    /// Parses `N`, `N_T` or `N+K` (decimal numbers of at most 10 digits).
    pub fn parse(s: &str) -> Result<JobSpec, ReportError> {
        let number =
            |p: &str| !p.is_empty() && p.len() <= 10 && p.bytes().all(|b| b.is_ascii_digit());
        let bad = || {
            ReportError::Invalid(format!(
                "job {s:?}: expected a Slurm job id as sacct writes it: N, N_T (array task) or N+K (heterogeneous job component)"
            ))
        };
        if number(s) {
            return Ok(JobSpec::Job(s.to_owned()));
        }
        for (sep, make) in [
            ('_', JobSpec::ArrayTask as fn(String) -> JobSpec),
            ('+', JobSpec::HetComponent),
        ] {
            if let Some((a, b)) = s.split_once(sep) {
                return if number(a) && number(b) {
                    Ok(make(s.to_owned()))
                } else {
                    Err(bad())
                };
            }
        }
        Err(bad())
    }

    /// Whether Slurm workload `w` is (part of) this job.
    pub fn matches(&self, w: &Workload) -> bool {
        let under = |field: &Option<String>, sep: char, id: &str| {
            field
                .as_deref()
                .and_then(|f| f.split_once(sep))
                .is_some_and(|(job, _)| job == id)
        };
        match self {
            JobSpec::Job(id) => {
                w.job_id.as_deref() == Some(id.as_str())
                    || under(&w.array_task, '_', id)
                    || under(&w.het_component, '+', id)
            }
            JobSpec::ArrayTask(t) => w.array_task.as_deref() == Some(t.as_str()),
            JobSpec::HetComponent(c) => w.het_component.as_deref() == Some(c.as_str()),
        }
    }
}

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}")]
    NotFound(String),
    /// The subject is written wrong (a job id that is no Slurm job id).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Builds the report of `subject` over `range` from the store.
pub async fn build(
    store: &dyn Store,
    subject: &ReportSubject,
    range: TimeRange,
) -> Result<Report, ReportError> {
    subject.check()?;
    let energy_gpus = store.energy_gpus().await?;
    let done_to: BTreeMap<String, Option<UnixMs>> = energy_gpus
        .iter()
        .map(|g| (g.uuid.clone(), g.done_to_ms))
        .collect();
    let gpus_by_uuid: BTreeMap<String, (GpuId, u32, String, String)> = energy_gpus
        .into_iter()
        .map(|g| (g.uuid, (g.gpu, g.index, g.name, g.node_name)))
        .collect();
    let not_found = |what: String| {
        ReportError::NotFound(format!(
            "no energy for {what} in {} .. {} (see /api/v1/containers for keys)",
            gpufleet_core::config::format_time(range.from_ms),
            gpufleet_core::config::format_time(range.to_ms)
        ))
    };
    // (counter, trapezoid, idle, provisional) mJ, GPUs, nodes, names, span.
    let (mut counter, mut trapezoid, mut idle, mut provisional) = (0u64, 0u64, 0u64, 0u64);
    let mut gpus: BTreeSet<GpuRef> = BTreeSet::new();
    let mut nodes: BTreeSet<String> = BTreeSet::new();
    let mut name: Option<String> = None;
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    let (mut gpu_ms, mut share_ppm_ms) = (0i64, 0u64);
    // GPM: (tensor ms, Σ cpct·ms, occupancy ms, Σ cpct·ms).
    let mut gpm = (0i64, 0u64, 0i64, 0u64);
    let mut carbon = CarbonTotals::default();
    let key;
    match subject {
        ReportSubject::Node(node) => {
            key = node.clone();
            let rows: Vec<_> = store
                .gpu_energy(range)
                .await?
                .into_iter()
                .filter(|g| &g.node_name == node)
                .collect();
            if rows.is_empty() {
                return Err(not_found(format!("node {node:?}")));
            }
            for c in store.gpu_carbon(range).await? {
                if &c.node_name == node {
                    carbon.add(&c.totals);
                }
            }
            for g in rows {
                counter += g.counter_mj;
                trapezoid += g.trapezoid_mj;
                idle += g.idle_mj;
                provisional += g.provisional_mj;
                nodes.insert(g.node_name.clone());
                gpus.insert(GpuRef {
                    node: g.node_name,
                    index: g.index,
                    uuid: g.uuid,
                    name: g.name,
                });
            }
            (first, last) = (range.from_ms, range.to_ms);
        }
        _ => {
            let key_filter = match subject {
                ReportSubject::Container(k) => Some(k.as_str()),
                _ => None,
            };
            let rows: Vec<_> = store
                .workload_energy(range, None, key_filter)
                .await?
                .into_iter()
                .filter(|r| subject.matches(&r.workload))
                .collect();
            let Some(one) = rows.first() else {
                let what = match subject {
                    ReportSubject::Container(k) => format!("workload {k:?}"),
                    ReportSubject::Pod(p) => format!("pod {p:?}"),
                    ReportSubject::Job(j) => format!("Slurm job {j:?}"),
                    ReportSubject::Node(_) => unreachable!("handled above"),
                };
                return Err(not_found(what));
            };
            let w = &one.workload;
            (key, name) = match subject {
                ReportSubject::Pod(_) => (
                    format!("pod:{}", w.pod_uid.as_deref().unwrap_or("unknown")),
                    w.pod_name.as_ref().map(|p| match &w.namespace {
                        Some(ns) => format!("{ns}/{p}"),
                        None => p.clone(),
                    }),
                ),
                ReportSubject::Job(j) => (
                    format!("slurm:{j}"),
                    Some(match (&w.job_name, &w.account) {
                        (Some(n), Some(a)) => format!("{n} (job {j}, account {a})"),
                        (Some(n), None) => format!("{n} (job {j})"),
                        _ => format!("job {j}"),
                    }),
                ),
                _ => (w.key(), w.container_name.clone().or_else(|| w.unit.clone())),
            };
            let keys: BTreeSet<String> = rows.iter().map(|r| r.workload.key()).collect();
            for c in store.workload_carbon(range, None, key_filter).await? {
                if keys.contains(&c.workload_key) {
                    carbon.add(&c.totals);
                }
            }
            for r in rows {
                counter += r.counter_mj;
                trapezoid += r.trapezoid_mj;
                // The idle energy charged to it (its idle share under `spread`).
                idle += r.energy_mj.saturating_sub(r.active_mj);
                provisional += r.provisional_mj;
                gpu_ms += r.gpu_ms;
                share_ppm_ms += r.share_ppm_ms;
                gpm.0 += r.tensor_ms;
                gpm.1 += r.tensor_cpct_ms;
                gpm.2 += r.occupancy_ms;
                gpm.3 += r.occupancy_cpct_ms;
                first = first.min(r.first_minute_ms);
                last = last.max(r.last_minute_ms + MINUTE_MS);
                nodes.insert(r.node_name.clone());
                gpus.insert(GpuRef {
                    node: r.node_name,
                    index: r.gpu_index,
                    uuid: r.gpu_uuid,
                    name: r.gpu_name,
                });
            }
        }
    }
    let span = TimeRange {
        from_ms: first.max(range.from_ms),
        to_ms: last.min(range.to_ms),
    };
    let mut report = Report::new(
        Subject {
            kind: subject.kind().to_owned(),
            key,
            name,
            nodes: nodes.into_iter().collect(),
            exit_code: None,
        },
        range.from_ms,
        range.to_ms,
    );
    report.elapsed_s = Some((span.to_ms - span.from_ms).max(0) as f64 / 1000.0);
    report.energy = EnergySummary::from_mj(Some(counter), Some(trapezoid));
    report.energy.provisional_j = Some(provisional as f64 / 1000.0);
    if !matches!(subject, ReportSubject::Node(_)) {
        report.energy.idle_j = Some(idle as f64 / 1000.0);
        report.gpu_seconds = Some(gpu_ms as f64 / 1000.0);
        report.avg_share = (gpu_ms > 0).then(|| share_ppm_ms as f64 / gpu_ms as f64 / 1e6);
        report.tensor_active_pct = super::energy::gpm_pct(gpm.1, gpm.0);
        report.sm_occupancy_pct = super::energy::gpm_pct(gpm.3, gpm.2);
    }
    let step = ((span.to_ms - span.from_ms) / SERIES_POINTS / 1000).max(1) * 1000;
    let mut metrics = MetricsBuilder::new(Some(step));
    for g in &gpus {
        let Some((gpu, ..)) = gpus_by_uuid.get(&g.uuid) else {
            continue;
        };
        let samples = store.gpu_samples(*gpu, span, MAX_ROWS_PER_GPU).await?;
        if samples.len() == MAX_ROWS_PER_GPU {
            tracing::warn!(gpu = %g.uuid, rows = MAX_ROWS_PER_GPU, "report: the GPU's metrics use only the first rows of the range");
        }
        let resident: Option<BTreeSet<UnixMs>> = match subject {
            ReportSubject::Node(_) => None,
            _ => Some(
                store
                    .process_samples(*gpu, span, MAX_ROWS_PER_GPU * 4)
                    .await?
                    .into_iter()
                    .filter(|(_, p)| subject.matches(&p.workload))
                    .map(|(t, _)| t)
                    .collect(),
            ),
        };
        let label = format!("{}/{}", g.node, g.index);
        for (t, s) in &samples {
            if resident.as_ref().is_none_or(|r| r.contains(t)) {
                metrics.add(&label, *t, s);
            }
        }
    }
    report.metrics = metrics.summary();
    report.series = metrics.series();
    report.carbon = carbon_summary(counter + trapezoid, &carbon);
    if report.carbon.carbon_g.is_some() {
        report.intensity = intensity_points(store, &gpus, &gpus_by_uuid, span).await?;
    }
    // The oldest watermark of its GPUs (a GPU with none: nothing is final).
    report.accounted_to_ms = gpus
        .iter()
        .map(|g| done_to.get(&g.uuid).copied().flatten())
        .try_fold(i64::MAX, |oldest, d| d.map(|d| oldest.min(d)))
        .filter(|t| *t != i64::MAX);
    report.gpus = gpus.into_iter().collect();
    Ok(report)
}

/// The report's carbon figures from the stored prices; all absent when nothing was priced.
fn carbon_summary(energy_mj: u64, c: &CarbonTotals) -> CarbonSummary {
    // As the energy API: a figure when some energy has a price (0 g of 0 J is a figure).
    if c.priced_mj == 0 && c.sources.is_empty() {
        return CarbonSummary::default();
    }
    let (mut sources, mut regions) = (BTreeSet::new(), BTreeSet::new());
    for s in &c.sources {
        // `provider:region:factor_type`; a region may itself hold ':'.
        let mut parts = s.splitn(2, ':');
        let provider = parts.next().unwrap_or_default();
        let rest = parts.next().unwrap_or_default();
        let region = rest.rsplit_once(':').map_or(rest, |(r, _)| r);
        sources.insert(provider.to_owned());
        regions.insert(region.to_owned());
    }
    let share = |mj: u64| (c.priced_mj > 0).then(|| mj as f64 / c.priced_mj as f64);
    CarbonSummary {
        priced_share: (energy_mj > 0).then(|| c.priced_mj.min(energy_mj) as f64 / energy_mj as f64),
        carbon_g: Some(c.carbon_g),
        avg_intensity_g_per_kwh: c.avg_g_per_kwh(),
        sources: sources.into_iter().collect(),
        regions: regions.into_iter().collect(),
        forecast_share: share(c.forecast_mj),
        estimated_share: share(c.estimated_mj),
        // carbon = Σ kWh × g × PUE, so the energy-weighted PUE is carbon / Σ kWh × g.
        pue: (c.intensity_mj_g > 0.0).then(|| c.carbon_g * 3.6e9 / c.intensity_mj_g),
    }
}

/// The intensity each priced minute of the subject's GPUs used, one point per region and
/// minute, for the plot.
async fn intensity_points(
    store: &dyn Store,
    gpus: &BTreeSet<GpuRef>,
    ids: &BTreeMap<String, (GpuId, u32, String, String)>,
    span: TimeRange,
) -> Result<Vec<IntensityPoint>, StoreError> {
    let mut points: BTreeMap<(String, UnixMs), IntensityPoint> = BTreeMap::new();
    for g in gpus {
        let Some((gpu, ..)) = ids.get(&g.uuid) else {
            continue;
        };
        for m in store.carbon_minutes(Some(*gpu), span).await? {
            points
                .entry((m.region.clone(), m.minute_ms))
                .or_insert_with(|| IntensityPoint {
                    time_ms: m.minute_ms,
                    g_per_kwh: m.g_per_kwh,
                    region: m.region.clone(),
                    kind: if m.estimated {
                        "estimated".to_owned()
                    } else {
                        m.kind.as_str().to_owned()
                    },
                });
        }
    }
    let mut out: Vec<IntensityPoint> = points.into_values().collect();
    out.sort_by_key(|p| p.time_ms);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, array_task: Option<&str>, het: Option<&str>) -> Workload {
        Workload {
            kind: WorkloadKind::Slurm,
            runtime: "slurm".into(),
            job_id: Some(id.into()),
            array_task: array_task.map(Into::into),
            het_component: het.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn a_job_id_takes_the_forms_sacct_writes_and_nothing_else() {
        assert_eq!(JobSpec::parse("123").ok(), Some(JobSpec::Job("123".into())));
        assert_eq!(
            JobSpec::parse("123_4").ok(),
            Some(JobSpec::ArrayTask("123_4".into()))
        );
        assert_eq!(
            JobSpec::parse("123+1").ok(),
            Some(JobSpec::HetComponent("123+1".into()))
        );
        for bad in [
            "",
            "12a",
            "123_",
            "_4",
            "123+",
            "1_2_3",
            "1+2_3",
            "123_[1-4]",
            "12345678901",
        ] {
            assert!(
                matches!(JobSpec::parse(bad), Err(ReportError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_job_is_its_own_id_its_array_tasks_and_its_het_components_as_sacct_lists_them() {
        // Array 100: task 1 has raw id 101, task 2 kept the array's id 100.
        let task1 = job("101", Some("100_1"), None);
        let task2 = job("100", Some("100_2"), None);
        // Heterogeneous job 200: components 200 (+0) and 201 (+1).
        let het0 = job("200", None, Some("200+0"));
        let het1 = job("201", None, Some("200+1"));
        let plain = job("300", None, None);
        let matching = |spec: &str| -> Vec<&str> {
            let spec = JobSpec::parse(spec).expect("spec");
            [&task1, &task2, &het0, &het1, &plain]
                .into_iter()
                .filter(|w| spec.matches(w))
                .map(|w| w.job_id.as_deref().unwrap_or_default())
                .collect()
        };
        assert_eq!(matching("100"), ["101", "100"], "the whole array");
        assert_eq!(matching("100_1"), ["101"]);
        assert_eq!(matching("100_2"), ["100"], "not the raw id's other tasks");
        assert_eq!(matching("101"), ["101"], "a task by its raw id");
        assert_eq!(matching("200"), ["200", "201"], "the whole het job");
        assert_eq!(matching("200+1"), ["201"]);
        assert_eq!(matching("300"), ["300"]);
        assert!(matching("300_1").is_empty());
        // Only Slurm workloads are jobs.
        let container = Workload {
            job_id: Some("300".into()),
            ..Default::default()
        };
        assert!(!ReportSubject::Job("300".into()).matches(&container));
        assert!(ReportSubject::Job("300".into()).matches(&plain));
    }
}
