//! GPM through the real agent on the fake library: a Hopper GPU's metrics over each window
//! (absent on the first tick, which only opens one), an Ampere GPU's all absent and asked
//! once, a sample call failing mid-run (the rest of the tick intact, GPM back after a new
//! window), a profiler holding the counters (absent, asked again a minute later), MIG
//! instances, and a support query that says otherwise than sampling.

use super::*;
use fake_nvml::GpmSpec;
use gpufleet_core::{GpmMetrics, MigGpm};

const MIB: u64 = 1 << 20;

/// A Hopper GPU with GPM: each metric's n-th sample window reads the n-th value.
fn hopper(uuid: &str, gpm: GpmSpec) -> Gpu {
    Gpu {
        name: "NVIDIA H100 80GB HBM3".into(),
        architecture: 9,
        cuda_capability: (9, 0),
        gpm: Some(gpm),
        ..gpu(uuid)
    }
}

fn metrics(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

/// Training-like GPM: tensor activity 62.5 % then 70 %, …; FP64 not given by this GPU.
fn training() -> GpmSpec {
    GpmSpec {
        metrics: metrics(&[
            ("sm_util", seq(&[0, 92_000, 94_000])),
            ("sm_occupancy", seq(&[0, 48_250, 50_000])),
            ("any_tensor_util", seq(&[0, 62_500, 70_000])),
            ("hmma_tensor_util", seq(&[0, 60_000, 68_000])),
            ("imma_tensor_util", Value::Const(0)),
            ("dfma_tensor_util", Value::Const(0)),
            ("dram_bw_util", seq(&[0, 55_555, 56_000])),
            ("fp32_util", Value::Const(20_000)),
            ("fp16_util", Value::Const(35_000)),
            ("pcie_tx_per_sec", Value::Const(1_500)),
            ("pcie_rx_per_sec", Value::Const(3_000_000)),
            ("nvlink_total_tx_per_sec", Value::Const(4_096_000)),
            ("nvlink_total_rx_per_sec", Value::Const(0)),
        ]),
        ..GpmSpec::default()
    }
}

fn every_tick_gpm() -> Cadence {
    Cadence {
        gpm: Duration::ZERO,
        ..Cadence::EVERY_TICK
    }
}

fn gpm_of(tick: &Tick, uuid: &str) -> GpmMetrics {
    sample(tick, uuid).gpm
}

#[test]
fn hopper_reads_gpm_over_each_window_and_ampere_has_none() {
    let fake = Fake::new(Scenario {
        gpus: vec![
            hopper("GPU-h100", training()),
            Gpu {
                power_mw: 90_000.into(),
                ..gpu("GPU-a100")
            },
        ],
        ..Scenario::default()
    });
    let mut src = fake.open_with_cadence(Duration::from_secs(1), every_tick_gpm());
    let t = ticks(&mut src, 3);
    // The first tick only takes the window's first sample.
    assert!(gpm_of(&t[0], "GPU-h100").is_empty(), "{:?}", t[0]);
    let g = gpm_of(&t[1], "GPU-h100");
    assert_eq!(
        g,
        GpmMetrics {
            sm_active_cpct: Some(9_200),
            sm_occupancy_cpct: Some(4_825),
            tensor_active_cpct: Some(6_250),
            tensor_hmma_cpct: Some(6_000),
            tensor_imma_cpct: Some(0),
            tensor_dfma_cpct: Some(0),
            dram_bw_cpct: Some(5_556),
            // Not given by this GPU: absent, not 0.
            fp64_cpct: None,
            fp32_cpct: Some(2_000),
            fp16_cpct: Some(3_500),
            // MiB/s (1.5, 3000, 4000) as bytes/s.
            pcie_tx_bps: Some(3 * MIB / 2),
            pcie_rx_bps: Some(3_000 * MIB),
            nvlink_tx_bps: Some(4_096 * MIB),
            nvlink_rx_bps: Some(0),
        }
    );
    assert_eq!(gpm_of(&t[2], "GPU-h100").tensor_active_cpct, Some(7_000));
    for tick in &t {
        assert_eq!(gpm_of(tick, "GPU-a100"), GpmMetrics::default(), "absent");
        assert!(sample(tick, "GPU-a100").mig_gpm.is_empty());
        assert_eq!(sample(tick, "GPU-a100").power_mw, Some(90_000));
    }
    drop(src);
    let counts = fake.counts();
    assert_eq!(count(&counts, "gpu1.nvmlGpmSampleGet"), 1, "asked once");
    assert_eq!(count(&counts, "gpu0.nvmlGpmSampleGet"), 3);
    assert_eq!(
        counts.get("gpm_samples_live"),
        Some(&0),
        "every sample freed"
    );
}

#[test]
fn gpm_is_read_on_its_cadence_and_carried_between() {
    let fake = Fake::new(Scenario {
        gpus: vec![hopper("GPU-h100", training())],
        ..Scenario::default()
    });
    let cadence = Cadence {
        gpm: Duration::from_secs(5),
        ..Cadence::EVERY_TICK
    };
    let mut src = fake.open_with_cadence(Duration::from_secs(1), cadence);
    // Ticks at T0 … T0 + 11 s: reads at the first tick and each 5 s slot's first.
    let t = ticks(&mut src, 12);
    let tensor: Vec<Option<u32>> = t
        .iter()
        .map(|k| gpm_of(k, "GPU-h100").tensor_active_cpct)
        .collect();
    let first_read = (0..12)
        .find(|&k| (T0 + k * 1000) % 5000 < 1000 && k > 0)
        .expect("a slot starts");
    assert!(tensor[..first_read as usize].iter().all(Option::is_none));
    // From the second read on, each reading is carried until the next.
    assert_eq!(tensor[first_read as usize], Some(6_250), "{tensor:?}");
    assert_eq!(tensor[first_read as usize + 4], Some(6_250), "{tensor:?}");
    assert_eq!(tensor[first_read as usize + 5], Some(7_000), "{tensor:?}");
    drop(src);
    assert_eq!(count(&fake.counts(), "gpu0.nvmlGpmSampleGet"), 3);
}

#[test]
fn a_gpm_failure_mid_run_costs_only_gpm_and_a_new_window() {
    let fake = Fake::new(Scenario {
        gpus: vec![hopper(
            "GPU-h100",
            GpmSpec {
                // Sample calls 2 and 3 fail.
                fail_after_samples: Some(2),
                fail_for_samples: Some(2),
                metrics: metrics(&[("any_tensor_util", Value::Const(50_000))]),
                ..GpmSpec::default()
            },
        )],
        ..Scenario::default()
    });
    let mut src = fake.open_with_cadence(Duration::from_secs(1), every_tick_gpm());
    let t = ticks(&mut src, 7);
    let tensor: Vec<Option<u32>> = t
        .iter()
        .map(|k| gpm_of(k, "GPU-h100").tensor_active_cpct)
        .collect();
    // 0 opens a window, 1 reads; 2 and 3 fail; 4 opens a new window, 5 and 6 read.
    assert_eq!(
        tensor,
        [
            None,
            Some(5_000),
            None,
            None,
            None,
            Some(5_000),
            Some(5_000)
        ]
    );
    for tick in &t {
        let s = sample(tick, "GPU-h100");
        assert!(s.power_mw.is_some() && s.util_gpu_pct.is_some(), "{s:?}");
    }
}

#[test]
fn a_profiler_holding_the_counters_leaves_gpm_absent_and_it_is_asked_a_minute_later() {
    let fake = Fake::new(Scenario {
        gpus: vec![hopper(
            "GPU-h100",
            GpmSpec {
                fail_after_samples: Some(2),
                fail_for_samples: Some(1),
                fail_with: "in_use".into(),
                metrics: metrics(&[("sm_occupancy", Value::Const(40_000))]),
                ..GpmSpec::default()
            },
        )],
        ..Scenario::default()
    });
    let mut src = fake.open_with_cadence(Duration::from_secs(1), every_tick_gpm());
    let t = ticks(&mut src, 66);
    let occ: Vec<Option<u32>> = t
        .iter()
        .map(|k| gpm_of(k, "GPU-h100").sm_occupancy_cpct)
        .collect();
    assert_eq!(occ[1], Some(4_000));
    // Held at tick 2: not asked again before tick 62, a minute of tick time later.
    assert!(occ[2..63].iter().all(Option::is_none), "{occ:?}");
    assert_eq!(occ[63..], [Some(4_000); 3]);
    drop(src);
    // Ticks 0, 1, 2 (held), then 62 on.
    assert_eq!(count(&fake.counts(), "gpu0.nvmlGpmSampleGet"), 3 + 4);
}

#[test]
fn mig_instances_have_their_own_gpm() {
    let mig = |uuid: &str, gi: u32| MigSpec {
        uuid: uuid.into(),
        profile: "3g.40gb".into(),
        memory_total_bytes: 40 * GIB,
        gpu_instance_id: gi,
        compute_instance_id: 0,
    };
    let in_mig = |pid: u32, m: usize| Process {
        mig: Some(m),
        ..proc_(pid, 2, None)
    };
    let mut spec = training();
    spec.mig_metrics = [
        (
            "1".to_owned(),
            metrics(&[("any_tensor_util", Value::Const(80_000))]),
        ),
        (
            "2".to_owned(),
            metrics(&[("any_tensor_util", Value::Const(1_000))]),
        ),
    ]
    .into_iter()
    .collect();
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            mig_mode: 1,
            mig_instances: vec![mig("MIG-train", 1), mig("MIG-notebook", 2)],
            compute_processes: vec![in_mig(1103, 0), in_mig(1104, 1)],
            ..hopper("GPU-h100", spec)
        }],
        ..Scenario::default()
    });
    let mut src = fake.open_with_cadence(Duration::from_secs(1), every_tick_gpm());
    let t = ticks(&mut src, 2);
    assert!(sample(&t[0], "GPU-h100").mig_gpm.is_empty());
    let migs = &sample(&t[1], "GPU-h100").mig_gpm;
    let tensor = |a: u32| GpmMetrics {
        tensor_active_cpct: Some(a),
        ..GpmMetrics::default()
    };
    assert_eq!(
        migs,
        &[
            MigGpm {
                mig_uuid: "MIG-train".into(),
                gpu_instance_id: 1,
                gpm: tensor(8_000),
            },
            MigGpm {
                mig_uuid: "MIG-notebook".into(),
                gpu_instance_id: 2,
                gpm: tensor(100),
            },
        ]
    );
    assert_eq!(gpm_of(&t[1], "GPU-h100").tensor_active_cpct, Some(6_250));
    drop(src);
    // Read every 5 s: the ticks between carry each instance's reading, ids and all.
    let cadence = Cadence {
        gpm: Duration::from_secs(5),
        ..Cadence::EVERY_TICK
    };
    let mut src = fake.open_with_cadence(Duration::from_secs(1), cadence);
    let t = ticks(&mut src, 12);
    let carried: Vec<&Vec<MigGpm>> = t
        .iter()
        .map(|k| &sample(k, "GPU-h100").mig_gpm)
        .filter(|m| !m.is_empty())
        .collect();
    assert!(carried.len() >= 5, "{carried:?}");
    for m in carried {
        let ids: Vec<(&str, u32)> = m
            .iter()
            .map(|g| (g.mig_uuid.as_str(), g.gpu_instance_id))
            .collect();
        assert_eq!(ids, [("MIG-train", 1), ("MIG-notebook", 2)]);
    }
}

#[test]
fn sampling_decides_support_whatever_the_support_query_says() {
    for query in ["version_mismatch", "no"] {
        let fake = Fake::new(Scenario {
            gpus: vec![hopper(
                "GPU-h100",
                GpmSpec {
                    support_query: query.into(),
                    ..training()
                },
            )],
            ..Scenario::default()
        });
        let mut src = fake.open_with_cadence(Duration::from_secs(1), every_tick_gpm());
        let t = ticks(&mut src, 2);
        assert_eq!(
            gpm_of(&t[1], "GPU-h100").tensor_active_cpct,
            Some(6_250),
            "support query {query:?}"
        );
    }
}
