//! `check-energy`: verifies stored energy rollups — conservation in every GPU-minute, and
//! each minute equal to what the raw samples give with the parameters the minute
//! recorded (idle power, idle policy, gap limit) — and reports every violation.

use crate::accounting::energy::{
    self, GpuMinute, MINUTE_MS, RULES_COMPARED_WITH_RAW, RULES_WITH_WASTE_COLUMNS, WorkloadMinute,
    minute_of,
};
use crate::store::rollup::RollupKey;
use crate::store::{EnergyStore, RollupStore, StoreError, TimeRange};
use gpufleet_core::UnixMs;
use std::collections::{BTreeMap, HashMap};

/// One thing wrong with the stored energy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub node: String,
    pub gpu_uuid: String,
    pub minute_ms: UnixMs,
    pub what: String,
}

/// What a check found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CheckReport {
    /// Stored GPU-minutes checked.
    pub minutes: usize,
    /// Of which compared with raw samples (the others' samples are gone).
    pub compared_with_raw: usize,
    /// Of which computed by attribution rules before [`RULES_COMPARED_WITH_RAW`]: checked for
    /// conservation only (`recompute-energy` rebuilds them).
    pub earlier_rules: usize,
    /// Minutes with samples not yet accounted (at or after a GPU's watermark), or only
    /// provisionally (open minutes: checked for conservation, not against raw).
    pub pending_minutes: usize,
    /// Total GPU energy in the checked minutes, mJ.
    pub energy_mj: u64,
    pub violations: Vec<Violation>,
}

/// Checks every GPU's minutes in `range`.
pub async fn check<S: EnergyStore + RollupStore + ?Sized>(
    store: &S,
    range: TimeRange,
) -> Result<CheckReport, StoreError> {
    let mut report = CheckReport::default();
    let gpus = store.energy_gpus().await?;
    let by_id: HashMap<_, _> = gpus.iter().map(|g| (g.gpu, g)).collect();
    let from = minute_of(range.from_ms);
    let to = minute_of(range.to_ms).saturating_add(MINUTE_MS); // exclusive
    let stored = store
        .energy_minutes(
            None,
            TimeRange {
                from_ms: from,
                to_ms: to - 1,
            },
        )
        .await?;
    // Minutes before a GPU's raw horizon lost their raw samples (retention): they are
    // checked for conservation only.
    let horizons = store.raw_horizons().await?;
    let mut stored_by_gpu: HashMap<_, BTreeMap<UnixMs, GpuMinute>> = HashMap::new();
    for (gpu, m) in stored {
        if !by_id.contains_key(&gpu) {
            report.violations.push(Violation {
                node: String::new(),
                gpu_uuid: format!("(unknown GPU id {})", gpu.0),
                minute_ms: m.minute_ms,
                what: "energy rows for a GPU that does not exist".into(),
            });
            continue;
        }
        stored_by_gpu.entry(gpu).or_default().insert(m.minute_ms, m);
    }
    for gpu in &gpus {
        let mut stored = stored_by_gpu.remove(&gpu.gpu).unwrap_or_default();
        let violation = |minute_ms, what: String| Violation {
            node: gpu.node_name.clone(),
            gpu_uuid: gpu.uuid.clone(),
            minute_ms,
            what,
        };
        for m in stored.values() {
            report.minutes += 1;
            report.energy_mj += m.energy_mj;
            if let Some(e) = m.conservation_error() {
                report.violations.push(violation(m.minute_ms, e));
            }
        }
        // Raw, chunk by chunk.
        let done = gpu.done_to_ms.unwrap_or(i64::MIN);
        let raw_from = horizons.get(&RollupKey::gpu(gpu.gpu)).copied();
        let mut chunk = from.max(raw_from.unwrap_or(i64::MIN));
        while chunk < to {
            // Skip stretches without samples.
            match store.next_sample_ms(gpu.gpu, chunk).await? {
                Some(t) if t < to => chunk = chunk.max(minute_of(t)),
                _ => break,
            }
            let chunk_to = (chunk + 60 * MINUTE_MS).min(to);
            let inputs = store.energy_inputs(gpu.gpu, chunk, chunk_to).await?;
            let mut prev = inputs.prev;
            for (minute, this) in energy::by_minute(&inputs.samples) {
                match stored.remove(&minute) {
                    // An open minute: more samples may have come since it was computed.
                    Some(m) if m.provisional => report.pending_minutes += 1,
                    Some(m) if m.rules < RULES_COMPARED_WITH_RAW => report.earlier_rules += 1,
                    Some(m) => {
                        report.compared_with_raw += 1;
                        let raw = energy::rollup_minute(
                            minute,
                            prev.as_ref(),
                            this,
                            m.max_gap_ms,
                            m.idle_mw,
                            m.idle_source,
                            m.idle_policy,
                        );
                        let diffs = differences(&m, &raw);
                        if !diffs.is_empty() {
                            report.violations.push(violation(
                                minute,
                                format!("stored minute differs from raw samples: {diffs}"),
                            ));
                        }
                    }
                    None if minute < done => report.violations.push(violation(
                        minute,
                        format!("{} samples but no energy rows", this.len()),
                    )),
                    None => report.pending_minutes += 1,
                }
                prev = this.last().cloned();
            }
            chunk = chunk_to;
        }
        // What is left was stored for minutes without raw samples (before the raw
        // horizon): already checked for conservation.
    }
    Ok(report)
}

/// The fields in which a stored minute differs from the raw recomputation.
fn differences(stored: &GpuMinute, raw: &GpuMinute) -> String {
    let mut d = Vec::new();
    macro_rules! cmp {
        ($($f:ident),*) => {$(
            if stored.$f != raw.$f {
                d.push(format!("{} stored {:?} raw {:?}", stringify!($f), stored.$f, raw.$f));
            }
        )*};
    }
    cmp!(
        energy_mj,
        counter_mj,
        trapezoid_mj,
        attributed_mj,
        idle_mj,
        unattributed_mj,
        active_mj,
        seen_idle_ms,
        seen_idle_mj,
        covered_ms,
        missing_ms,
        samples,
        min_power_mw
    );
    // Rows computed before the waste columns existed (earlier rules) hold NULL there
    // (unknown), not a disagreement with the raw samples; newer rows must match.
    let old = stored.rules < RULES_WITH_WASTE_COLUMNS;
    if (!old || stored.util_max_pct.is_some()) && stored.util_max_pct != raw.util_max_pct {
        d.push(format!(
            "util_max_pct stored {:?} raw {:?}",
            stored.util_max_pct, raw.util_max_pct
        ));
    }
    let same_workloads = stored.workloads.len() == raw.workloads.len()
        && stored.workloads.iter().zip(&raw.workloads).all(|(s, r)| {
            let mem_max_bytes = if old {
                s.mem_max_bytes.or(r.mem_max_bytes)
            } else {
                s.mem_max_bytes
            };
            WorkloadMinute {
                mem_max_bytes,
                ..s.clone()
            } == *r
        });
    if !same_workloads {
        let s: Vec<(i64, u64)> = stored
            .workloads
            .iter()
            .map(|w| (w.workload, w.energy_mj))
            .collect();
        let r: Vec<(i64, u64)> = raw
            .workloads
            .iter()
            .map(|w| (w.workload, w.energy_mj))
            .collect();
        d.push(format!(
            "workloads (id, mJ) stored {s:?} raw {r:?} (or their times, shares, methods)"
        ));
    }
    d.join("; ")
}
