//! Round trips through the wire types and what decoding refuses.

use super::*;
use crate::sample::*;
use gpufleet_proto::v1 as pb;

const NOW: i64 = 1_800_000_000_000;

fn sample_batch() -> Batch {
    Batch {
        seq: 7,
        ticks: vec![Tick {
            time_ms: NOW - 1000,
            gpus: vec![GpuSample {
                gpu_uuid: "GPU-a".into(),
                util_gpu_pct: Some(55),
                power_mw: Some(250_000),
                energy_mj: Some(123_456),
                nvlinks: vec![NvLinkSample {
                    link: 0,
                    tx_bps: Some(1),
                    rx_bps: None,
                }],
                ..Default::default()
            }],
            processes: vec![ProcessSample {
                gpu_uuid: "GPU-a".into(),
                pid: 42,
                sm_util_pct: Some(30),
                workload: Workload {
                    kind: WorkloadKind::Container,
                    runtime: "docker".into(),
                    container_id: Some("ab".repeat(32)),
                    ..Default::default()
                },
                ..Default::default()
            }],
            host: Some(HostSample {
                cpu_util_pct: Some(12.5),
                ..Default::default()
            }),
            events: vec![Event {
                time_ms: NOW - 1000,
                gpu_uuid: "GPU-a".into(),
                kind: EventKind::Xid,
                code: Some(79),
                detail: "fell off the bus".into(),
            }],
            cost: None,
        }],
        delivery: DeliveryStats {
            dropped_samples: 3,
            ..Default::default()
        },
    }
}

fn decode(b: pb::Batch) -> Result<Batch, Invalid> {
    decode_batch(b, &Limits::default(), NOW, &|u: &str| u == "GPU-a")
}

#[test]
fn round_trip_keeps_every_field_and_absence() {
    let b = sample_batch();
    let back = decode(b.clone().into()).expect("valid batch");
    assert_eq!(back, b);
    assert_eq!(
        back.ticks[0].gpus[0].temp_gpu_c, None,
        "absent stays absent"
    );
}

#[test]
fn absurd_power_is_refused_with_the_field_named() {
    let mut b = sample_batch();
    b.ticks[0].gpus[0].power_mw = Some(90_000_000);
    let err = decode(b.into()).expect_err("90 kW is absurd");
    assert!(err.to_string().contains("power_mw = 90000000"), "{err}");
}

#[test]
fn unknown_gpu_is_refused() {
    let mut b = sample_batch();
    b.ticks[0].gpus[0].gpu_uuid = "GPU-other".into();
    let err = decode(b.into()).expect_err("not in inventory");
    assert!(
        err.to_string().contains("not in this node's inventory"),
        "{err}"
    );
}

#[test]
fn future_and_nan_are_refused() {
    let mut b = sample_batch();
    b.ticks[0].time_ms = NOW + 3_600_000;
    assert!(
        decode(b.into())
            .expect_err("future")
            .to_string()
            .contains("future")
    );
    let mut b = sample_batch();
    b.ticks[0].host = Some(HostSample {
        cpu_util_pct: Some(f32::NAN),
        ..Default::default()
    });
    assert!(
        decode(b.into())
            .expect_err("nan")
            .to_string()
            .contains("finite")
    );
}

#[test]
fn too_many_ticks_is_too_large() {
    let mut b = sample_batch();
    let t = b.ticks[0].clone();
    b.ticks = (0..1001)
        .map(|k| Tick {
            time_ms: NOW - 10_000_000 + k,
            ..t.clone()
        })
        .collect();
    assert!(matches!(decode(b.into()), Err(Invalid::TooLarge(_))));
}
