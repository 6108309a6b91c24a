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
                gpm: GpmMetrics {
                    sm_active_cpct: Some(9_150),
                    tensor_active_cpct: Some(0),
                    nvlink_rx_bps: Some(4 << 30),
                    ..Default::default()
                },
                mig_gpm: vec![MigGpm {
                    mig_uuid: "MIG-1".into(),
                    gpu_instance_id: 1,
                    gpm: GpmMetrics {
                        sm_occupancy_cpct: Some(10_000),
                        ..Default::default()
                    },
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
            health: vec![GpuHealthSample {
                gpu_uuid: "GPU-a".into(),
                retired_pages_sbe: None,
                retired_pages_dbe: None,
                retired_pages_pending: None,
                remapped_rows_correctable: Some(2),
                remapped_rows_uncorrectable: Some(0),
                remapped_rows_pending: Some(true),
                remapped_rows_failed: Some(false),
                ecc_corrected_aggregate: Some(17),
                ecc_uncorrected_aggregate: Some(0),
                pcie_replay_count: Some(3),
                nvlink_crc_errors: None,
                nvlink_replay_errors: Some(0),
                nvlink_recovery_errors: None,
                persistence_mode: Some(false),
            }],
            name_failures: vec![NameFailures {
                source: "kubernetes".into(),
                cause: "forbidden".into(),
                count: 3,
            }],
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
fn health_and_thresholds_round_trip_with_absence_and_false_kept() {
    let b = sample_batch();
    let back = decode(b.clone().into()).expect("valid batch");
    let h = &back.ticks[0].health[0];
    assert_eq!(h, &b.ticks[0].health[0]);
    assert_eq!(h.retired_pages_sbe, None, "unsupported stays absent");
    assert_eq!(h.remapped_rows_uncorrectable, Some(0), "zero stays zero");
    assert_eq!(h.persistence_mode, Some(false), "false is not absent");
    // A tick without health decodes to none (not to an empty sample).
    let mut b = sample_batch();
    b.ticks[0].health.clear();
    assert!(decode(b.into()).expect("valid").ticks[0].health.is_empty());

    let info = GpuInfo {
        index: 0,
        uuid: "GPU-a".into(),
        name: "H100".into(),
        temp_slowdown_c: Some(87),
        temp_shutdown_c: Some(92),
        temp_gpu_max_c: None,
        temp_mem_max_c: Some(95),
        ..Default::default()
    };
    let hello = pb::Hello {
        node: "n".into(),
        inventory: Some(pb::Inventory {
            gpus: vec![info.clone().into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let (_, inv) = decode_hello(hello, &Limits::default()).expect("valid hello");
    assert_eq!(inv.gpus[0], info);
}

#[test]
fn a_gpu_sampled_twice_in_a_tick_is_refused() {
    let mut b = sample_batch();
    let again = b.ticks[0].gpus[0].clone();
    b.ticks[0].gpus.push(again);
    let err = decode(b.into()).expect_err("a GPU sampled twice");
    assert!(
        err.to_string().contains("tick 0: gpu GPU-a sampled twice"),
        "{err}"
    );
}

#[test]
fn health_is_validated() {
    let refused = |f: &dyn Fn(&mut Tick), what: &str| {
        let mut b = sample_batch();
        f(&mut b.ticks[0]);
        let err = decode(b.into()).expect_err(what);
        assert!(err.to_string().contains(what), "{err}");
    };
    refused(
        &|t| t.health[0].gpu_uuid = "GPU-other".into(),
        "health of gpu \"GPU-other\", which is not in this node's inventory",
    );
    refused(
        &|t| t.health.push(t.health[0].clone()),
        "gpu GPU-a has two health samples",
    );
    refused(
        &|t| t.gpus.clear(),
        "tick 0: health of gpu GPU-a without its GPU sample in the tick",
    );
    refused(
        &|t| t.health[0].pcie_replay_count = Some(u64::MAX),
        "pcie_replay_count = 18446744073709551615 exceeds",
    );
    refused(
        &|t| t.health[0].retired_pages_dbe = Some(u32::MAX),
        "retired_pages_dbe = 4294967295 exceeds",
    );
    refused(
        &|t| t.health = vec![t.health[0].clone(); 65],
        "65 health samples in tick 0, limit 64",
    );
    let mut b = sample_batch();
    b.ticks[0].health[0].ecc_corrected_aggregate = Some(1 << 53);
    decode(b.into()).expect("2^53 is the largest count accepted");
}

#[test]
fn absurd_power_is_refused_with_the_field_named() {
    let mut b = sample_batch();
    b.ticks[0].gpus[0].power_mw = Some(90_000_000);
    let err = decode(b.into()).expect_err("90 kW is absurd");
    assert!(err.to_string().contains("power_mw = 90000000"), "{err}");
}

#[test]
fn gpm_past_100_percent_or_a_repeated_mig_is_refused() {
    let mut b = sample_batch();
    b.ticks[0].gpus[0].gpm.fp16_cpct = Some(10_001);
    let err = decode(b.into()).expect_err("more than 100 %");
    assert!(err.to_string().contains("gpm fp16_cpct = 10001"), "{err}");
    let mut b = sample_batch();
    b.ticks[0].gpus[0].mig_gpm[0].gpm.tensor_active_cpct = Some(20_000);
    let err = decode(b.into()).expect_err("more than 100 %");
    assert!(
        err.to_string().contains("mig_gpm tensor_active_cpct"),
        "{err}"
    );
    let mut b = sample_batch();
    let again = b.ticks[0].gpus[0].mig_gpm[0].clone();
    b.ticks[0].gpus[0].mig_gpm.push(again);
    let err = decode(b.into()).expect_err("one MIG instance twice");
    assert!(err.to_string().contains("repeated"), "{err}");
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
