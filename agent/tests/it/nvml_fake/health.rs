//! Health counters through the fake: read back with the scenario's values on the first
//! tick and every health interval (not per tick), absent where unsupported, read again
//! on the tick after an Xid; and every bundled `fake-nvml/scenarios/health-*.json`.

use super::events::{events_of, sample_until};
use super::*;
use gpufleet_core::{GpuHealthSample, Inventory};

fn health_of<'t>(tick: &'t Tick, uuid: &str) -> Option<&'t GpuHealthSample> {
    tick.health.iter().find(|h| h.gpu_uuid == uuid)
}

#[test]
fn health_is_read_first_then_every_interval_with_the_scenario_values() {
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            nvlinks: 2,
            retired_pages_sbe: seq(&[0, 2]),
            retired_pages_dbe: seq(&[1, 1]),
            retired_pages_pending: seq(&[0, 1]),
            remapped_rows_correctable: 4.into(),
            remapped_rows_uncorrectable: seq(&[0, 1]),
            remapped_rows_pending: seq(&[0, 1]),
            remapped_rows_failed: 0.into(),
            ecc_corrected_aggregate: seq(&[10, 12]),
            ecc_uncorrected_aggregate: seq(&[0, 1]),
            pcie_replay_count: 7.into(),
            nvlink_crc_flit_errors: vec![1.into(), 2.into()],
            nvlink_crc_data_errors: vec![10.into()],
            nvlink_replay_errors: vec![0.into(), 3.into()],
            nvlink_recovery_errors: vec![],
            persistence_mode: false,
            temp_slowdown_c: 88,
            ..gpu("GPU-h")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open_with_health_every(Duration::from_secs(5));
    let inv = src.inventory().expect("inventory");
    let g = &inv.gpus[0];
    assert_eq!(
        (
            g.temp_slowdown_c,
            g.temp_shutdown_c,
            g.temp_gpu_max_c,
            g.temp_mem_max_c
        ),
        (Some(88), Some(92), Some(87), Some(95))
    );
    let ticks = ticks(&mut src, 11);
    let with: Vec<usize> = (0..ticks.len())
        .filter(|&k| !ticks[k].health.is_empty())
        .collect();
    assert_eq!(with, [0, 5, 10], "first tick, then every 5 s");
    let first = health_of(&ticks[0], "GPU-h").expect("health");
    assert_eq!(
        first,
        &GpuHealthSample {
            gpu_uuid: "GPU-h".into(),
            retired_pages_sbe: Some(0),
            retired_pages_dbe: Some(1),
            retired_pages_pending: Some(false),
            remapped_rows_correctable: Some(4),
            remapped_rows_uncorrectable: Some(0),
            remapped_rows_pending: Some(false),
            remapped_rows_failed: Some(false),
            ecc_corrected_aggregate: Some(10),
            ecc_uncorrected_aggregate: Some(0),
            pcie_replay_count: Some(7),
            nvlink_crc_errors: Some(1 + 10 + 2),
            nvlink_replay_errors: Some(3),
            nvlink_recovery_errors: Some(0),
            persistence_mode: Some(false),
        }
    );
    let second = health_of(&ticks[5], "GPU-h").expect("health");
    assert_eq!(
        (
            second.retired_pages_sbe,
            second.retired_pages_pending,
            second.remapped_rows_pending,
            second.ecc_uncorrected_aggregate
        ),
        (Some(2), Some(true), Some(true), Some(1)),
        "the values change between reads"
    );
    drop(src);
    let c = fake.counts();
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetPcieReplayCounter"),
        3,
        "not per tick"
    );
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetNvLinkErrorCounter"), 3 * 2 * 4);
}

#[test]
fn nvlink_counters_each_keep_their_own_support_per_link() {
    // Hopper: data CRC NOT_SUPPORTED on every link, flit CRC counts; one link without
    // the replay counter leaves the replay count of the others.
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            nvlinks: 2,
            nvlink_crc_flit_errors: vec![2.into(), seq(&[0, 5])],
            nvlink_crc_data_errors: vec![100.into(), 100.into()],
            nvlink_replay_errors: vec![1.into(), 9.into()],
            unsupported: vec![
                "nvmlDeviceGetNvLinkErrorCounter:crc_data".into(),
                "nvmlDeviceGetNvLinkErrorCounter:replay:1".into(),
            ],
            ..gpu("GPU-hopper")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open_with_health_every(Duration::from_secs(5));
    let ticks = ticks(&mut src, 6);
    let read = |k: usize| {
        let h = health_of(&ticks[k], "GPU-hopper").expect("health");
        (
            h.nvlink_crc_errors,
            h.nvlink_replay_errors,
            h.nvlink_recovery_errors,
        )
    };
    assert_eq!(read(0), (Some(2), Some(1), Some(0)), "flit CRC alone");
    assert_eq!(read(5), (Some(2 + 5), Some(1), Some(0)));
    drop(src);
    let c = fake.counts();
    // First read: 4 counters × 2 links; second: data CRC not asked, replay on link 0 only.
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetNvLinkErrorCounter"),
        4 * 2 + 2 + 1 + 2
    );
}

#[test]
fn a_gpu_supporting_no_health_function_reports_every_signal_absent_and_is_asked_once() {
    let unsupported = [
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPages_v2",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetTotalEccErrors:aggregate",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetTemperatureThreshold",
        "field:142",
        "field:143",
        "field:144",
        "field:145",
    ];
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            unsupported: unsupported.iter().map(|s| (*s).to_owned()).collect(),
            ..gpu("GPU-bare")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open_with_health_every(Duration::from_secs(1));
    let inv = src.inventory().expect("inventory");
    assert_eq!(
        (inv.gpus[0].temp_slowdown_c, inv.gpus[0].temp_shutdown_c),
        (None, None)
    );
    let ticks = ticks(&mut src, 3);
    for t in &ticks {
        assert_eq!(
            health_of(t, "GPU-bare"),
            Some(&GpuHealthSample {
                gpu_uuid: "GPU-bare".into(),
                ..Default::default()
            }),
            "every signal absent, none 0"
        );
        assert!(sample(t, "GPU-bare").power_mw.is_some(), "sampling goes on");
    }
    drop(src);
    let c = fake.counts();
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetPcieReplayCounter"), 1, "{c:?}");
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetRetiredPages"),
        2,
        "once per cause"
    );
    assert_eq!(count(&c, "gpu0.field:142:0"), 1);
}

#[test]
fn health_is_read_again_on_the_tick_after_an_xid() {
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            remapped_rows_pending: seq(&[0, 1]),
            events: vec![EventSpec {
                kind: EventKind::Xid,
                code: 94,
                after_calls: 80,
            }],
            ..gpu("GPU-x")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let mut ticks = Vec::new();
    sample_until(&mut src, &mut ticks, "the Xid", |t| {
        !events_of(t, Kind::Xid).is_empty()
    });
    let xid_at = ticks.len() - 1;
    sample_until(&mut src, &mut ticks, "one more tick", |t| {
        t.len() > xid_at + 1
    });
    assert!(xid_at < 30, "before the interval would read it anyway");
    let with: Vec<usize> = (0..ticks.len())
        .filter(|&k| !ticks[k].health.is_empty())
        .collect();
    assert_eq!(with, [0, xid_at + 1]);
    let h = health_of(&ticks[xid_at + 1], "GPU-x").expect("health");
    assert_eq!(h.remapped_rows_pending, Some(true));
}

/// What a bundled health scenario must show through the agent.
fn expect_scenario(name: &str, inv: &Inventory, ticks: &[Tick], uuid: &str) {
    let healths: Vec<&GpuHealthSample> = ticks.iter().filter_map(|t| health_of(t, uuid)).collect();
    let last = healths.last().copied();
    let xids: Vec<Option<u64>> = events_of(ticks, Kind::Xid)
        .into_iter()
        .map(|e| e.1)
        .collect();
    let samples: Vec<&GpuSample> = ticks.iter().map(|t| sample(t, uuid)).collect();
    // No health for the GPU from the tick after its lost event (its counters cannot be
    // read; the last known stays the collector's).
    let no_health_once_lost = || {
        let lost_at = ticks
            .iter()
            .position(|t| t.events.iter().any(|e| e.kind == Kind::GpuLost))
            .expect("a lost event");
        assert!(
            ticks[lost_at + 1..]
                .iter()
                .all(|t| health_of(t, uuid).is_none()),
            "{name}: health after the GPU was lost"
        );
        assert!(lost_at + 1 < ticks.len(), "{name}: ticks after the loss");
    };
    match name {
        "health-xid79.json" => {
            assert_eq!(xids, [Some(79)]);
            assert_eq!(events_of(ticks, Kind::GpuLost).len(), 1, "fell off the bus");
            no_health_once_lost();
        }
        "health-xid48.json" => {
            assert_eq!(xids, [Some(48)]);
            assert!(last.and_then(|h| h.ecc_uncorrected_aggregate) >= Some(1));
        }
        "health-xid94.json" => {
            assert_eq!(xids, [Some(94)]);
            assert_eq!(last.and_then(|h| h.remapped_rows_pending), Some(true));
        }
        "health-ecc-dbe.json" => {
            assert_eq!(events_of(ticks, Kind::EccDoubleBit).len(), 1);
            assert_eq!(last.and_then(|h| h.ecc_uncorrected_aggregate), Some(1));
            assert_eq!(healths[0].ecc_uncorrected_aggregate, Some(0));
        }
        "health-remap-pending.json" => {
            assert_eq!(healths[0].remapped_rows_pending, Some(false));
            assert_eq!(last.and_then(|h| h.remapped_rows_pending), Some(true));
        }
        "health-remap-failed.json" => {
            assert_eq!(last.and_then(|h| h.remapped_rows_failed), Some(true));
        }
        "health-thermal.json" => {
            let s = samples.last().expect("sample");
            // SW (0x20) and HW (0x40) thermal slowdown, 2 °C under the slowdown threshold.
            assert_eq!(s.throttle_reasons.map(|r| r & 0x60), Some(0x60));
            assert_eq!(s.temp_gpu_c, Some(87));
            let g = inv.gpus.iter().find(|g| g.uuid == uuid).expect("inventory");
            assert_eq!(g.temp_slowdown_c, Some(89));
        }
        "health-gpu-lost.json" => {
            assert_eq!(events_of(ticks, Kind::GpuLost).len(), 1);
            assert_eq!(samples.last().and_then(|s| s.power_mw), None);
            no_health_once_lost();
        }
        "health-nvlink-no-data-crc.json" => {
            // Flit CRC of links 0 and 1 (data CRC unsupported); replay without link 17.
            assert_eq!(healths[0].nvlink_crc_errors, Some(2));
            assert_eq!(last.and_then(|h| h.nvlink_crc_errors), Some(2 + 5));
            assert_eq!(last.and_then(|h| h.nvlink_replay_errors), Some(1));
        }
        "health-persistence-off.json" => {
            assert_eq!(last.and_then(|h| h.persistence_mode), Some(false));
        }
        "health-unsupported.json" => {
            assert!(!healths.is_empty());
            for h in &healths {
                assert_eq!(
                    **h,
                    GpuHealthSample {
                        gpu_uuid: uuid.into(),
                        ..Default::default()
                    }
                );
            }
        }
        other => panic!("{other}: a new health scenario needs its expectation here"),
    }
}

#[test]
fn every_bundled_health_scenario_drives_its_signal_through_the_agent() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fake-nvml/scenarios");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("scenarios folder")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("health-") && n.ends_with(".json"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 11, "{names:?}");
    for name in &names {
        let text = std::fs::read_to_string(dir.join(name)).expect("read scenario");
        let scenario: Scenario =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let uuid = scenario.gpus[0].uuid.clone();
        let events = scenario.gpus[0].events.len();
        let fake = Fake::new(scenario);
        let mut src = fake.open_with_health_every(Duration::from_secs(5));
        let inv = src.inventory().expect("inventory");
        assert!(inv.gpus.iter().any(|g| g.uuid == uuid), "{name}");
        let mut ticks = Vec::new();
        // 40 ticks: past every scenario's events (after_calls) and a few health reads.
        sample_until(&mut src, &mut ticks, name, |t| {
            let seen = events_of(t, Kind::Xid).len() + events_of(t, Kind::EccDoubleBit).len();
            t.len() >= 40 && seen == events
        });
        expect_scenario(name, &inv, &ticks, &uuid);
    }
}
