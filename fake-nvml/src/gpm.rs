//! GPM (GPU Performance Monitoring, Hopper and later): a GPU's `gpm` scenario resolved
//! once when the scenario loads (metric names to NVML ids, the support query's answer,
//! the injected sampling failures), its sampling streams, and the sample handles that
//! `nvmlGpmSampleAlloc` gives out. Safe code; `ffi::gpm` converts the pointers.
//!
//! A sampling stream is the whole GPU (`nvmlGpmSampleGet`) or one of its GPU instances
//! (`nvmlGpmMigSampleGet`). Each counts its own sample calls: the attempted ones number
//! the failure window, the successful ones number the samples, and a metrics request
//! answers each metric's scenario [`Value`] at its second sample's number.

use crate::function::NvmlResult;
use crate::scenario::{Gpu, Value, in_window};
use nvml_wrapper_sys::bindings::{
    nvmlGpmMetricId_t, nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL as ANY_TENSOR_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_DFMA_TENSOR_UTIL as DFMA_TENSOR_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL as DRAM_BW_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_FP16_UTIL as FP16_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_FP32_UTIL as FP32_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_FP64_UTIL as FP64_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL as GRAPHICS_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_HMMA_TENSOR_UTIL as HMMA_TENSOR_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_IMMA_TENSOR_UTIL as IMMA_TENSOR_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_INTEGER_UTIL as INTEGER_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC as NVLINK_TOTAL_RX_PER_SEC,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC as NVLINK_TOTAL_TX_PER_SEC,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC as PCIE_RX_PER_SEC,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC as PCIE_TX_PER_SEC,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY as SM_OCCUPANCY,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL as SM_UTIL,
    nvmlReturn_enum_NVML_ERROR_IN_USE as IN_USE,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND as NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_UNKNOWN as UNKNOWN, nvmlReturn_t,
};
use std::collections::BTreeMap;

/// The metric names a scenario may use (NVML's name in lower case without
/// `NVML_GPM_METRIC_`), with their `nvmlGpmMetricId_t`.
pub const METRICS: &[(&str, nvmlGpmMetricId_t)] = &[
    ("graphics_util", GRAPHICS_UTIL),
    ("sm_util", SM_UTIL),
    ("sm_occupancy", SM_OCCUPANCY),
    ("integer_util", INTEGER_UTIL),
    ("any_tensor_util", ANY_TENSOR_UTIL),
    ("dfma_tensor_util", DFMA_TENSOR_UTIL),
    ("hmma_tensor_util", HMMA_TENSOR_UTIL),
    ("imma_tensor_util", IMMA_TENSOR_UTIL),
    ("dram_bw_util", DRAM_BW_UTIL),
    ("fp64_util", FP64_UTIL),
    ("fp32_util", FP32_UTIL),
    ("fp16_util", FP16_UTIL),
    ("pcie_tx_per_sec", PCIE_TX_PER_SEC),
    ("pcie_rx_per_sec", PCIE_RX_PER_SEC),
    ("nvlink_total_rx_per_sec", NVLINK_TOTAL_RX_PER_SEC),
    ("nvlink_total_tx_per_sec", NVLINK_TOTAL_TX_PER_SEC),
];

/// The NVML id of the metric a scenario names `name`.
pub fn metric_id(name: &str) -> Option<nvmlGpmMetricId_t> {
    METRICS.iter().find(|(n, _)| *n == name).map(|(_, id)| *id)
}

/// What `nvmlGpmQueryDeviceSupport` answers for a GPU with GPM (`GpmSpec::support_query`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SupportQuery {
    /// The truth: supported.
    Answer,
    /// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`, whatever the struct's version.
    VersionMismatch,
    /// `isSupportedDevice` 0, although sampling works.
    No,
}

/// One sampling stream: the whole GPU or one GPU instance.
#[derive(Debug)]
struct Stream {
    /// The GPU instance id; `None`: the whole GPU.
    instance: Option<u32>,
    /// What a metrics request over its samples answers: (metric id, thousandths).
    metrics: Vec<(nvmlGpmMetricId_t, Value)>,
    /// Sample calls attempted: the clock of the failure window.
    attempts: u64,
    /// Sample calls that succeeded: the next sample's number.
    taken: u64,
}

impl Stream {
    fn new(instance: Option<u32>, metrics: Vec<(nvmlGpmMetricId_t, Value)>) -> Self {
        Self {
            instance,
            metrics,
            attempts: 0,
            taken: 0,
        }
    }
}

/// A GPU's GPM, resolved from its scenario, with its streams' counts.
#[derive(Debug)]
pub struct Gpm {
    /// What the support query answers.
    pub support: SupportQuery,
    /// The failure window over each stream's attempted sample calls (see
    /// [`in_window`]).
    fail_after: Option<u64>,
    fail_for: Option<u64>,
    /// What a sample call inside the window answers.
    fail_with: nvmlReturn_t,
    /// The whole GPU's stream first, then one per distinct GPU instance of its
    /// `mig_instances`.
    streams: Vec<Stream>,
}

impl Gpm {
    /// GPU `index`'s GPM: `None` without `gpm` (a GPU before Hopper). An error, naming
    /// the GPU and the entry, for an unknown `support_query`, `fail_with` or metric name,
    /// or a `mig_metrics` key that is not the `gpu_instance_id` of one of its
    /// `mig_instances`.
    pub fn of(index: usize, gpu: &Gpu) -> Result<Option<Self>, String> {
        let Some(spec) = &gpu.gpm else {
            return Ok(None);
        };
        let at = |what: &str| format!("gpus[{index}].gpm.{what}");
        let support = match spec.support_query.as_str() {
            "answer" => SupportQuery::Answer,
            "version_mismatch" => SupportQuery::VersionMismatch,
            "no" => SupportQuery::No,
            other => {
                return Err(format!(
                    "{}: unknown {other:?} (known: answer, version_mismatch, no)",
                    at("support_query")
                ));
            }
        };
        let fail_with = match spec.fail_with.as_str() {
            "unknown" => UNKNOWN,
            "in_use" => IN_USE,
            other => {
                return Err(format!(
                    "{}: unknown {other:?} (known: unknown, in_use)",
                    at("fail_with")
                ));
            }
        };
        if let Some(key) = spec.mig_metrics.keys().find(|k| {
            !gpu.mig_instances
                .iter()
                .any(|m| **k == m.gpu_instance_id.to_string())
        }) {
            return Err(format!(
                "{}: {key:?} is not the gpu_instance_id of one of the GPU's mig_instances",
                at("mig_metrics")
            ));
        }
        let whole = resolve(&spec.metrics).map_err(|e| format!("{}: {e}", at("metrics")))?;
        let mut streams = vec![Stream::new(None, whole)];
        for m in &gpu.mig_instances {
            let gi = m.gpu_instance_id;
            if streams.iter().any(|s| s.instance == Some(gi)) {
                continue;
            }
            let metrics = match spec.mig_metrics.get(&gi.to_string()) {
                Some(named) => resolve(named)
                    .map_err(|e| format!("{}: {e}", at(format!("mig_metrics.{gi}").as_str())))?,
                None => Vec::new(),
            };
            streams.push(Stream::new(Some(gi), metrics));
        }
        Ok(Some(Self {
            support,
            fail_after: spec.fail_after_samples,
            fail_for: spec.fail_for_samples,
            fail_with,
            streams,
        }))
    }

    /// One sample call on the stream of `instance` (`None`: the whole GPU): the sample's
    /// number (0-based among the stream's successful calls), or the injected failure when
    /// the call's number among the stream's attempted calls is in the failure window.
    /// NOT_FOUND for a GPU instance the GPU does not have.
    pub fn take_sample(&mut self, instance: Option<u32>) -> NvmlResult<u64> {
        let (after, count, fail_with) = (self.fail_after, self.fail_for, self.fail_with);
        let stream = self
            .streams
            .iter_mut()
            .find(|s| s.instance == instance)
            .ok_or(NOT_FOUND)?;
        let attempt = stream.attempts;
        stream.attempts += 1;
        if in_window(attempt, after, count) {
            return Err(fail_with);
        }
        let n = stream.taken;
        stream.taken += 1;
        Ok(n)
    }

    /// Metric `id` of the stream of `instance` at its sample number `n`, in NVML's unit
    /// (the scenario's thousandths / 1000: %, or MiB/s for the per-second rates); `None`
    /// (NOT_SUPPORTED) for a metric the scenario does not name there.
    pub fn value(&self, instance: Option<u32>, id: nvmlGpmMetricId_t, n: u64) -> Option<f64> {
        let stream = self.streams.iter().find(|s| s.instance == instance)?;
        let (_, v) = stream.metrics.iter().find(|(m, _)| *m == id)?;
        Some(v.at(n) as f64 / 1000.0)
    }
}

/// Metric names to ids; an error names the first unknown name.
fn resolve(named: &BTreeMap<String, Value>) -> Result<Vec<(nvmlGpmMetricId_t, Value)>, String> {
    named
        .iter()
        .map(|(name, v)| {
            metric_id(name).map(|id| (id, v.clone())).ok_or_else(|| {
                let known: Vec<&str> = METRICS.iter().map(|(n, _)| *n).collect();
                format!("unknown metric {name:?} (known: {})", known.join(", "))
            })
        })
        .collect()
}

/// What a sample call recorded into a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Filled {
    /// The GPU's index.
    pub gpu: usize,
    /// The GPU instance id (`nvmlGpmMigSampleGet`); `None`: the whole GPU.
    pub instance: Option<u32>,
    /// The sample's number in its stream.
    pub number: u64,
}

/// The sample handles `nvmlGpmSampleAlloc` gave out and `nvmlGpmSampleFree` did not take
/// back. Handles are 1, 2, …: never null, never reused, never dereferenced. A short list,
/// not a map: a monitor holds a few at a time, and the fake's own cost per call is charged
/// to every monitor measured against it.
#[derive(Debug, Default)]
pub struct Samples {
    /// The last handle given out (0: none yet).
    last: usize,
    /// The live handles, each `None` until a sample call fills it.
    live: Vec<(usize, Option<Filled>)>,
}

impl Samples {
    /// A new, empty handle.
    pub fn alloc(&mut self) -> usize {
        self.last += 1;
        self.live.push((self.last, None));
        self.last
    }

    /// Takes handle `id` back; INVALID_ARGUMENT for one not live.
    pub fn free(&mut self, id: usize) -> NvmlResult<()> {
        let k = self
            .live
            .iter()
            .position(|(h, _)| *h == id)
            .ok_or(INVALID_ARGUMENT)?;
        self.live.swap_remove(k);
        Ok(())
    }

    /// Whether `id` is a live handle.
    pub fn is_live(&self, id: usize) -> bool {
        self.live.iter().any(|(h, _)| *h == id)
    }

    /// Records a sample into handle `id`; INVALID_ARGUMENT for one not live.
    pub fn fill(&mut self, id: usize, sample: Filled) -> NvmlResult<()> {
        let slot = self
            .live
            .iter_mut()
            .find(|(h, _)| *h == id)
            .ok_or(INVALID_ARGUMENT)?;
        slot.1 = Some(sample);
        Ok(())
    }

    /// The sample in handle `id`; INVALID_ARGUMENT for one not live or not filled.
    fn filled(&self, id: usize) -> NvmlResult<Filled> {
        self.live
            .iter()
            .find(|(h, _)| *h == id)
            .and_then(|(_, f)| *f)
            .ok_or(INVALID_ARGUMENT)
    }

    /// The samples of a metrics request: both live and filled, of the same GPU and GPU
    /// instance, the second taken after the first (else INVALID_ARGUMENT). Answers the
    /// second: the metrics are its stream's values at its number.
    pub fn window(&self, first: usize, second: usize) -> NvmlResult<Filled> {
        let (a, b) = (self.filled(first)?, self.filled(second)?);
        if a.gpu != b.gpu || a.instance != b.instance || b.number <= a.number {
            return Err(INVALID_ARGUMENT);
        }
        Ok(b)
    }

    /// How many handles are live.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Whether any handle was ever given out.
    pub fn any_allocated(&self) -> bool {
        self.last > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{GpmSpec, MigSpec};

    fn gpu_with(spec: GpmSpec) -> Gpu {
        Gpu {
            mig_mode: 1,
            mig_instances: vec![
                MigSpec {
                    gpu_instance_id: 1,
                    compute_instance_id: 0,
                    ..MigSpec::default()
                },
                // A second compute instance of GPU instance 1: still one stream.
                MigSpec {
                    gpu_instance_id: 1,
                    compute_instance_id: 1,
                    ..MigSpec::default()
                },
                MigSpec {
                    gpu_instance_id: 2,
                    ..MigSpec::default()
                },
            ],
            gpm: Some(spec),
            ..Gpu::default()
        }
    }

    fn resolved(spec: GpmSpec) -> Gpm {
        Gpm::of(0, &gpu_with(spec))
            .expect("resolves")
            .expect("has GPM")
    }

    #[test]
    fn metric_names_map_to_nvml_ids() {
        let ids: Vec<Option<u32>> = [
            "sm_util",
            "sm_occupancy",
            "any_tensor_util",
            "dfma_tensor_util",
            "hmma_tensor_util",
            "imma_tensor_util",
            "dram_bw_util",
            "fp64_util",
            "fp32_util",
            "fp16_util",
            "pcie_tx_per_sec",
            "pcie_rx_per_sec",
            "nvlink_total_rx_per_sec",
            "nvlink_total_tx_per_sec",
        ]
        .into_iter()
        .map(metric_id)
        .collect();
        let expected: [Option<u32>; 14] =
            [2, 3, 5, 6, 7, 9, 10, 11, 12, 13, 20, 21, 60, 61].map(Some);
        assert_eq!(ids, expected);
        assert_eq!(metric_id("SM_UTIL"), None);
        assert_eq!(metric_id("nvml_gpm_metric_sm_util"), None);
    }

    #[test]
    fn a_gpu_without_gpm_resolves_to_none() {
        assert!(matches!(Gpm::of(0, &Gpu::default()), Ok(None)));
    }

    #[test]
    fn each_stream_numbers_its_own_samples() {
        let mut g = resolved(GpmSpec::default());
        assert_eq!(g.take_sample(None), Ok(0));
        assert_eq!(g.take_sample(Some(1)), Ok(0));
        assert_eq!(g.take_sample(None), Ok(1));
        assert_eq!(g.take_sample(Some(2)), Ok(0));
        assert_eq!(g.take_sample(Some(1)), Ok(1));
        assert_eq!(g.take_sample(Some(3)), Err(NOT_FOUND));
    }

    #[test]
    fn the_failure_window_counts_attempts_and_numbers_only_successes() {
        let mut g = resolved(GpmSpec {
            fail_after_samples: Some(2),
            fail_for_samples: Some(2),
            fail_with: "in_use".into(),
            ..GpmSpec::default()
        });
        let got: Vec<NvmlResult<u64>> = (0..6).map(|_| g.take_sample(None)).collect();
        assert_eq!(got, [Ok(0), Ok(1), Err(IN_USE), Err(IN_USE), Ok(2), Ok(3)]);
        // Another stream has its own attempts.
        assert_eq!(g.take_sample(Some(2)), Ok(0));

        let mut forever = resolved(GpmSpec {
            fail_after_samples: Some(1),
            ..GpmSpec::default()
        });
        assert_eq!(forever.take_sample(None), Ok(0));
        assert!((0..100).all(|_| forever.take_sample(None) == Err(UNKNOWN)));
    }

    #[test]
    fn values_are_thousandths_read_at_the_sample_number() {
        let g = resolved(GpmSpec {
            metrics: [("sm_util".to_owned(), Value::Seq(vec![45_500, 92_000]))]
                .into_iter()
                .collect(),
            mig_metrics: [(
                "2".to_owned(),
                [("pcie_tx_per_sec".to_owned(), Value::Const(12_000))]
                    .into_iter()
                    .collect(),
            )]
            .into_iter()
            .collect(),
            ..GpmSpec::default()
        });
        assert_eq!(g.value(None, SM_UTIL, 0), Some(45.5));
        assert_eq!(g.value(None, SM_UTIL, 1), Some(92.0));
        assert_eq!(g.value(None, PCIE_TX_PER_SEC, 1), None);
        assert_eq!(g.value(Some(2), PCIE_TX_PER_SEC, 5), Some(12.0));
        assert_eq!(g.value(Some(2), SM_UTIL, 1), None);
        assert_eq!(g.value(Some(1), SM_UTIL, 1), None);
    }

    #[test]
    fn bad_names_are_errors_that_name_them() {
        let named = |name: &str| -> BTreeMap<String, Value> {
            [(name.to_owned(), Value::Const(1))].into_iter().collect()
        };
        let bad = [
            (
                GpmSpec {
                    metrics: named("sm_utl"),
                    ..GpmSpec::default()
                },
                "sm_utl",
            ),
            (
                GpmSpec {
                    mig_metrics: [("2".to_owned(), named("tensor"))].into_iter().collect(),
                    ..GpmSpec::default()
                },
                "tensor",
            ),
            (
                GpmSpec {
                    mig_metrics: [("02".to_owned(), named("sm_util"))].into_iter().collect(),
                    ..GpmSpec::default()
                },
                "02",
            ),
            (
                GpmSpec {
                    support_query: "maybe".into(),
                    ..GpmSpec::default()
                },
                "maybe",
            ),
            (
                GpmSpec {
                    fail_with: "busy".into(),
                    ..GpmSpec::default()
                },
                "busy",
            ),
        ];
        for (spec, word) in bad {
            let e = Gpm::of(3, &gpu_with(spec)).expect_err(word);
            assert!(e.contains(word) && e.contains("gpus[3].gpm"), "{e}");
        }
    }

    #[test]
    fn handles_are_never_null_and_free_once() {
        let mut s = Samples::default();
        assert!(!s.any_allocated());
        let (a, b) = (s.alloc(), s.alloc());
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(s.live(), 2);
        assert_eq!(s.free(a), Ok(()));
        assert_eq!(s.free(a), Err(INVALID_ARGUMENT));
        assert_eq!(s.free(0), Err(INVALID_ARGUMENT));
        assert!(!s.is_live(a) && s.is_live(b));
        // Not reused.
        let c = s.alloc();
        assert!(c != a && c != b);
        assert_eq!(s.live(), 2);
        assert!(s.any_allocated());
    }

    #[test]
    fn a_window_needs_two_later_samples_of_one_stream() {
        let mut s = Samples::default();
        let sample = |gpu, instance, number| Filled {
            gpu,
            instance,
            number,
        };
        let h: Vec<usize> = (0..6).map(|_| s.alloc()).collect();
        let fills = [
            sample(0, None, 0),
            sample(0, None, 1),
            sample(1, None, 2),
            sample(0, Some(1), 3),
        ];
        for (id, f) in h.iter().zip(fills) {
            assert_eq!(s.fill(*id, f), Ok(()));
        }
        assert_eq!(s.window(h[0], h[1]), Ok(sample(0, None, 1)));
        // Reversed, the same sample twice, another GPU, another instance.
        assert_eq!(s.window(h[1], h[0]), Err(INVALID_ARGUMENT));
        assert_eq!(s.window(h[1], h[1]), Err(INVALID_ARGUMENT));
        assert_eq!(s.window(h[0], h[2]), Err(INVALID_ARGUMENT));
        assert_eq!(s.window(h[0], h[3]), Err(INVALID_ARGUMENT));
        // Not filled, freed, never given out.
        assert_eq!(s.window(h[0], h[4]), Err(INVALID_ARGUMENT));
        assert_eq!(s.free(h[1]), Ok(()));
        assert_eq!(s.window(h[0], h[1]), Err(INVALID_ARGUMENT));
        assert_eq!(s.window(h[0], 99), Err(INVALID_ARGUMENT));
        assert_eq!(s.fill(99, sample(0, None, 9)), Err(INVALID_ARGUMENT));
    }
}
