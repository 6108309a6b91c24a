//! What is pushed and how it is encoded: stored GPU samples and per-workload energy turned
//! into remote-write `TimeSeries` (the same metric names and labels as `/metrics`), and
//! a `WriteRequest` as the wire wants it (protobuf, then snappy's block format).

use crate::families::{GPU_FAMILIES, GpuValue, MIG_GPM_FAMILIES, Num};
use crate::store::GpuRecord;
use crate::store::remote_write::WorkloadNodeEnergy;
use gpufleet_core::{GpuSample, UnixMs, Workload};
use gpufleet_proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};
use prost::Message;
use std::collections::BTreeMap;

/// The per-GPU families pushed: `/metrics`' own table (names, units, absent values), with
/// a counter's `_total` as the exposition writes it. One list, so the two never differ.
fn gpu_families() -> impl Iterator<Item = (String, GpuValue)> {
    GPU_FAMILIES.iter().map(|(name, kind, _, value)| {
        let name = if *kind == "counter" {
            format!("{name}_total")
        } else {
            (*name).to_owned()
        };
        (name, *value)
    })
}

/// How many per-GPU families a sample can give.
pub fn gpu_family_count() -> usize {
    GPU_FAMILIES.len()
}

/// The per-workload energy counter: cumulative joules per workload and node, `state`
/// `active` or `idle`.
pub const WORKLOAD_ENERGY: &str = "gpufleet_workload_energy_joules_total";

/// Labels as the spec wants them: `__name__` first, then sorted by name, empty values
/// left out (an empty label is no label to Prometheus).
fn labels(name: &str, mut pairs: Vec<(&'static str, String)>) -> Vec<Label> {
    pairs.retain(|(_, v)| !v.is_empty());
    pairs.sort_by(|a, b| a.0.cmp(b.0));
    std::iter::once(Label {
        name: "__name__".into(),
        value: name.into(),
    })
    .chain(pairs.into_iter().map(|(name, value)| Label {
        name: name.into(),
        value,
    }))
    .collect()
}

/// One GPU's stored samples (oldest first) as one series per family that has a value.
pub fn gpu_series(node: &str, gpu: &GpuRecord, samples: &[(UnixMs, GpuSample)]) -> Vec<TimeSeries> {
    let mut out = Vec::new();
    for (name, value) in gpu_families() {
        let points: Vec<Sample> = samples
            .iter()
            .filter_map(|(t, s)| {
                value(s)
                    .map(Num::to_f64)
                    .filter(|v| v.is_finite())
                    .map(|value| Sample {
                        value,
                        timestamp: *t,
                    })
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        out.push(TimeSeries {
            labels: labels(
                &name,
                vec![
                    ("node", node.to_owned()),
                    ("gpu", gpu.info.index.to_string()),
                    ("uuid", gpu.info.uuid.clone()),
                    ("name", gpu.info.name.clone()),
                ],
            ),
            samples: points,
        });
    }
    out.extend(mig_series(node, gpu, samples));
    out
}

/// A GPU's MIG instances' GPM, one series per instance and family that has a value.
fn mig_series<'a>(
    node: &'a str,
    gpu: &'a GpuRecord,
    samples: &'a [(UnixMs, GpuSample)],
) -> impl Iterator<Item = TimeSeries> + 'a {
    let mut by: BTreeMap<(&str, &str, u32), Vec<Sample>> = BTreeMap::new();
    for (name, _, value) in MIG_GPM_FAMILIES {
        for (t, s) in samples {
            for m in &s.mig_gpm {
                if let Some(v) = value(&m.gpm).map(Num::to_f64).filter(|v| v.is_finite()) {
                    by.entry((name, m.mig_uuid.as_str(), m.gpu_instance_id))
                        .or_default()
                        .push(Sample {
                            value: v,
                            timestamp: *t,
                        });
                }
            }
        }
    }
    by.into_iter()
        .map(move |((name, mig, instance), points)| TimeSeries {
            labels: labels(
                name,
                vec![
                    ("node", node.to_owned()),
                    ("gpu", gpu.info.index.to_string()),
                    ("uuid", gpu.info.uuid.clone()),
                    ("name", gpu.info.name.clone()),
                    ("mig_uuid", mig.to_owned()),
                    ("gpu_instance", instance.to_string()),
                ],
            ),
            samples: points,
        })
}

/// The workload labels `/metrics` uses: `workload` (its key), `kind`, `namespace`, `pod`,
/// `container`, `job`, `job_name`, `account`, `user`, each only when known.
fn workload_labels(w: &Workload) -> Vec<(&'static str, String)> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    vec![
        ("workload", w.key()),
        ("kind", w.kind.as_str().to_owned()),
        ("namespace", opt(&w.namespace)),
        ("pod", opt(&w.pod_name)),
        (
            "container",
            w.container_name
                .clone()
                .or_else(|| w.container_id.clone())
                .unwrap_or_default(),
        ),
        ("job", opt(&w.job_id)),
        ("job_name", opt(&w.job_name)),
        ("account", opt(&w.account)),
        ("user", w.uid.map(|u| u.to_string()).unwrap_or_default()),
    ]
}

/// A workload's cumulative energy on a node at `time_ms`: two series (`state` `active`
/// and `idle`), in joules.
pub fn energy_series(total: &WorkloadNodeEnergy, time_ms: UnixMs) -> [TimeSeries; 2] {
    let series = |state: &str, mj: u64| {
        let mut pairs = workload_labels(&total.workload);
        pairs.push(("node", total.node.clone()));
        pairs.push(("state", state.to_owned()));
        TimeSeries {
            labels: labels(WORKLOAD_ENERGY, pairs),
            samples: vec![Sample {
                value: mj as f64 / 1000.0,
                timestamp: time_ms,
            }],
        }
    };
    [
        series("active", total.active_mj),
        series("idle", total.idle_mj),
    ]
}

/// Samples in a request.
pub fn sample_count(series: &[TimeSeries]) -> usize {
    series.iter().map(|s| s.samples.len()).sum()
}

/// The request body: protobuf, compressed with snappy's block format (not its framed
/// stream format), as remote-write 1.0 requires.
pub fn encode(request: &WriteRequest) -> Vec<u8> {
    let raw = request.encode_to_vec();
    // Compressing a Vec in memory fails only for inputs above ~4 GiB; requests are far
    // below (a few thousand samples), so an error here would be a bug.
    snap::raw::Encoder::new()
        .compress_vec(&raw)
        .unwrap_or_else(|e| unreachable!("snappy cannot compress {} bytes: {e}", raw.len()))
}

/// Why a body could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not snappy block data: {0}")]
    Snappy(#[from] snap::Error),
    #[error("not a WriteRequest: {0}")]
    Protobuf(#[from] prost::DecodeError),
}

/// The inverse of [`encode`] (what a receiver does; used by tests).
pub fn decode(body: &[u8]) -> Result<WriteRequest, DecodeError> {
    let raw = snap::raw::Decoder::new().decompress_vec(body)?;
    Ok(WriteRequest::decode(raw.as_slice())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::GpuId;
    use gpufleet_core::{GpuInfo, WorkloadKind};

    /// A series' labels as (name, value) pairs, in order.
    fn pairs(t: &TimeSeries) -> Vec<(&str, &str)> {
        t.labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect()
    }

    fn gpu() -> GpuRecord {
        GpuRecord {
            id: GpuId(7),
            info: GpuInfo {
                index: 3,
                uuid: "GPU-abc".into(),
                name: "NVIDIA H100".into(),
                ..GpuInfo::default()
            },
        }
    }

    #[test]
    fn samples_round_trip_through_protobuf_and_snappy() {
        let s1 = GpuSample {
            gpu_uuid: "GPU-abc".into(),
            power_mw: Some(250_500),
            util_gpu_pct: Some(87),
            ..GpuSample::default()
        };
        let s2 = GpuSample {
            power_mw: Some(251_000),
            // Absent at this tick: no sample, never a 0.
            util_gpu_pct: None,
            ..s1.clone()
        };
        let series = gpu_series("node-a", &gpu(), &[(1_000, s1), (2_000, s2)]);
        let request = WriteRequest { timeseries: series };
        let body = encode(&request);
        // Snappy block format starts with the uncompressed length as a varint.
        let raw_len = request.encoded_len();
        assert_eq!(
            snap::raw::decompress_len(&body).expect("snappy header"),
            raw_len
        );
        let back = decode(&body).expect("decodes");
        assert_eq!(back, request);

        let power = back
            .timeseries
            .iter()
            .find(|t| t.labels[0].value == "gpufleet_gpu_power_watts")
            .expect("power series");
        let names = pairs(power);
        assert_eq!(
            names,
            [
                ("__name__", "gpufleet_gpu_power_watts"),
                ("gpu", "3"),
                ("name", "NVIDIA H100"),
                ("node", "node-a"),
                ("uuid", "GPU-abc"),
            ]
        );
        let points: Vec<(i64, f64)> = power
            .samples
            .iter()
            .map(|s| (s.timestamp, s.value))
            .collect();
        assert_eq!(points, [(1_000, 250.5), (2_000, 251.0)]);
        let util = back
            .timeseries
            .iter()
            .find(|t| t.labels[0].value == "gpufleet_gpu_utilization_ratio")
            .expect("util series");
        assert_eq!(util.samples.len(), 1, "the absent value is not sent");
        assert_eq!(
            back.timeseries.len(),
            2,
            "families without any value are not sent"
        );
        assert!(decode(b"not snappy").is_err());
    }

    #[test]
    fn gpm_is_pushed_per_gpu_and_per_mig_instance_where_present() {
        use gpufleet_core::{GpmMetrics, MigGpm};
        let s = GpuSample {
            gpu_uuid: "GPU-abc".into(),
            gpm: GpmMetrics {
                tensor_active_cpct: Some(6_250),
                ..GpmMetrics::default()
            },
            mig_gpm: vec![MigGpm {
                mig_uuid: "MIG-1".into(),
                gpu_instance_id: 2,
                gpm: GpmMetrics {
                    sm_occupancy_cpct: Some(0),
                    ..GpmMetrics::default()
                },
            }],
            ..GpuSample::default()
        };
        let series = gpu_series("node-a", &gpu(), &[(1_000, s)]);
        let find = |name: &str| {
            series
                .iter()
                .find(|t| t.labels[0].value == name)
                .unwrap_or_else(|| panic!("{name} in {series:?}"))
        };
        let tensor = find("gpufleet_gpu_tensor_active_ratio");
        assert_eq!(tensor.samples[0].value, 0.625);
        let mig = find("gpufleet_mig_sm_occupancy_ratio");
        let labels = pairs(mig);
        assert_eq!(
            labels,
            [
                ("__name__", "gpufleet_mig_sm_occupancy_ratio"),
                ("gpu", "3"),
                ("gpu_instance", "2"),
                ("mig_uuid", "MIG-1"),
                ("name", "NVIDIA H100"),
                ("node", "node-a"),
                ("uuid", "GPU-abc"),
            ]
        );
        assert_eq!(mig.samples[0].value, 0.0, "a present 0 is sent");
        assert_eq!(series.len(), 2, "nothing for absent GPM metrics");
    }

    #[test]
    fn workload_energy_has_the_workload_labels_and_joules() {
        let total = WorkloadNodeEnergy {
            minute_ms: 60_000,
            workload: Workload {
                kind: WorkloadKind::Container,
                runtime: "containerd".into(),
                container_id: Some("c0ffee".into()),
                container_name: Some("trainer".into()),
                pod_name: Some("train-0".into()),
                namespace: Some("ml".into()),
                ..Workload::default()
            },
            node: "node-a".into(),
            active_mj: 1_500,
            idle_mj: 0,
        };
        let [active, idle] = energy_series(&total, 120_000);
        let labels = pairs(&active);
        assert_eq!(
            labels,
            [
                ("__name__", WORKLOAD_ENERGY),
                ("container", "trainer"),
                ("kind", "container"),
                ("namespace", "ml"),
                ("node", "node-a"),
                ("pod", "train-0"),
                ("state", "active"),
                ("workload", total.workload.key().as_str()),
            ]
        );
        assert_eq!(active.samples[0].value, 1.5);
        assert_eq!(active.samples[0].timestamp, 120_000);
        assert_eq!(idle.samples[0].value, 0.0, "a known zero is sent as zero");
    }
}
