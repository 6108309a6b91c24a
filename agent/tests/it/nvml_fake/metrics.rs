//! Every metric read back, NVLink throughput per link and summed, unsupported metrics
//! absent and asked once.

use super::*;

#[test]
fn every_metric_reads_back_the_scenario_values() {
    let h100 = Gpu {
        uuid: "GPU-h100".into(),
        name: "NVIDIA H100 80GB HBM3".into(),
        serial: "1650123456789".into(),
        pci_bus_id: "00000000:1B:00.0".into(),
        architecture: 9,
        vbios_version: "96.00.74.00.01".into(),
        memory_total_bytes: 80 * GIB,
        memory_reserved_bytes: GIB / 2,
        power_limit_default_mw: 700_000,
        power_limit_enforced_mw: 650_000,
        power_limit_min_mw: 200_000,
        power_limit_max_mw: 700_000,
        max_clock_sm_mhz: 1980,
        max_clock_mem_mhz: 2619,
        max_clock_graphics_mhz: 1980,
        nvlinks: 18,
        cuda_capability: (9, 0),
        pcie_link_gen_max: 5,
        util_gpu_pct: seq(&[10, 97]),
        util_mem_pct: seq(&[5, 61]),
        // The inventory reads memory info once (for the total) before the ticks.
        mem_used_bytes: seq(&[GIB, GIB, 70 * GIB]),
        power_mw: seq(&[120_000, 610_000]),
        power_instant_mw: seq(&[130_000, 655_000]),
        energy_mj: Value::Ramp {
            start: 5_000_000,
            step: 610_000,
        },
        temp_gpu_c: seq(&[35, 71]),
        temp_mem_c: seq(&[40, 83]),
        fan_pct: 130.into(),
        clock_sm_mhz: seq(&[345, 1980]),
        clock_mem_mhz: 2619.into(),
        clock_graphics_mhz: seq(&[345, 1975]),
        pstate: seq(&[8, 0]),
        pcie_tx_kib: seq(&[100, 2000]),
        pcie_rx_kib: seq(&[200, 3000]),
        ecc_corrected: seq(&[0, 3]),
        ecc_uncorrected: 0.into(),
        throttle_reasons: seq(&[0x1, 0x4]),
        enc_util_pct: seq(&[0, 12]),
        dec_util_pct: seq(&[0, 34]),
        compute_processes: vec![proc_(1103, 40, Some(88)), proc_(1108, 20, Some(9))],
        graphics_processes: vec![proc_(1103, 41, None)],
        ..Gpu::default()
    };
    let fake = Fake::new(Scenario {
        gpus: vec![h100, gpu("GPU-idle")],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let inv = src.inventory().expect("inventory");
    assert_eq!(inv.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(inv.cuda_driver_version.as_deref(), Some("12.4"));
    assert_eq!(inv.nvml_version.as_deref(), Some("12.550.54.15"));
    assert_eq!(inv.gpus.len(), 2);
    let g = &inv.gpus[0];
    assert_eq!(
        (g.index, g.uuid.as_str(), g.name.as_str()),
        (0, "GPU-h100", "NVIDIA H100 80GB HBM3")
    );
    assert_eq!(g.serial.as_deref(), Some("1650123456789"));
    assert_eq!(g.pci_bus_id.as_deref(), Some("00000000:1B:00.0"));
    assert_eq!(g.architecture.as_deref(), Some("Hopper"));
    assert_eq!(g.memory_total_bytes, Some(80 * GIB));
    assert_eq!(
        (
            g.power_limit_default_mw,
            g.power_limit_enforced_mw,
            g.power_limit_min_mw,
            g.power_limit_max_mw
        ),
        (Some(700_000), Some(650_000), Some(200_000), Some(700_000))
    );
    assert_eq!(
        (
            g.max_clock_sm_mhz,
            g.max_clock_mem_mhz,
            g.max_clock_graphics_mhz
        ),
        (Some(1980), Some(2619), Some(1980))
    );
    assert_eq!(g.nvlink_count, Some(18));
    assert_eq!(g.mig_enabled, Some(false));
    assert_eq!(g.compute_mode.as_deref(), Some("Default"));
    assert_eq!(g.persistence_mode, Some(true));
    assert_eq!(
        (g.cuda_capability_major, g.cuda_capability_minor),
        (Some(9), Some(0))
    );
    assert_eq!(
        (g.pcie_link_gen_max, g.pcie_link_width_max),
        (Some(5), Some(16))
    );
    assert_eq!(g.vbios_version.as_deref(), Some("96.00.74.00.01"));

    let t = ticks(&mut src, 2);
    for (k, tick) in t.iter().enumerate() {
        let s = sample(tick, "GPU-h100");
        let pick = |a: u64, b: u64| if k == 0 { a } else { b };
        assert_eq!(s.util_gpu_pct, Some(pick(10, 97) as u32), "tick {k}");
        assert_eq!(s.util_mem_pct, Some(pick(5, 61) as u32));
        assert_eq!(s.mem_used_bytes, Some(pick(GIB, 70 * GIB)));
        assert_eq!(s.mem_total_bytes, Some(80 * GIB));
        assert_eq!(s.mem_reserved_bytes, Some(GIB / 2));
        assert_eq!(s.power_mw, Some(pick(120_000, 610_000) as u32));
        assert_eq!(s.power_instant_mw, Some(pick(130_000, 655_000) as u32));
        assert_eq!(s.power_limit_mw, Some(650_000));
        assert_eq!(s.energy_mj, Some(5_000_000 + k as u64 * 610_000));
        assert_eq!(s.temp_gpu_c, Some(pick(35, 71) as u32));
        assert_eq!(s.temp_mem_c, Some(pick(40, 83) as u32));
        assert_eq!(s.fan_pct, Some(100), "clamped to 100 %");
        assert_eq!(s.clock_sm_mhz, Some(pick(345, 1980) as u32));
        assert_eq!(s.clock_mem_mhz, Some(2619));
        assert_eq!(s.clock_graphics_mhz, Some(pick(345, 1975) as u32));
        assert_eq!(s.pstate, Some(pick(8, 0) as u32));
        assert_eq!(s.pcie_tx_bps, Some(pick(100, 2000) * 1024));
        assert_eq!(s.pcie_rx_bps, Some(pick(200, 3000) * 1024));
        assert_eq!(s.ecc_corrected_volatile, Some(pick(0, 3)));
        assert_eq!(s.ecc_uncorrected_volatile, Some(0));
        assert_eq!(s.throttle_reasons, Some(pick(0x1, 0x4)));
        assert_eq!(s.enc_util_pct, Some(pick(0, 12) as u32));
        assert_eq!(s.dec_util_pct, Some(pick(0, 34) as u32));
        let idle_links = (k > 0).then_some(0);
        assert_eq!(
            (s.nvlink_tx_bps, s.nvlink_rx_bps),
            (idle_links, idle_links),
            "idle links: 0 once two readings make a rate"
        );
    }
    let idle = sample(&t[1], "GPU-idle");
    assert_eq!(idle.power_mw, Some(60_000));
    assert_eq!(
        idle.energy_mj,
        Some(1_060_000),
        "its own counter, read twice"
    );

    let procs: Vec<_> = t[1]
        .processes
        .iter()
        .map(|p| (p.pid, p.process_type))
        .collect();
    assert_eq!(
        procs,
        [
            (1103, ProcessType::ComputeAndGraphics),
            (1108, ProcessType::Compute)
        ]
    );
    let p = &t[1].processes[0];
    assert_eq!(p.gpu_uuid, "GPU-h100");
    assert_eq!(
        p.gpu_mem_bytes,
        Some(41 * GIB),
        "the larger of the two lists"
    );
    assert_eq!((p.sm_util_pct, p.mem_util_pct), (Some(88), Some(44)));
    assert_eq!(
        p.workload.pod_uid.as_deref(),
        Some("3f1c2a9e-77b4-4c1e-9a0d-5b6e7f8a9b0c")
    );
    assert_eq!(t[1].processes[1].workload.job_id.as_deref(), Some("48213"));

    let cost = t[1].cost.as_ref().expect("the source reports its cost");
    assert!(cost.source_us.is_some() && !cost.slowest_calls_us.is_empty());
    assert!(
        cost.cpu_us.is_some() && cost.wall_us.is_some(),
        "every call every tick: each GPU is read on a thread of its own, whose CPU the \
         source reports (the sampler adds its own thread's): {cost:?}"
    );
    drop(src);
    let counts = fake.counts();
    assert_eq!(
        count(&counts, "nvmlShutdown"),
        1,
        "dropping the source shuts NVML down"
    );
    assert_eq!(
        count(&counts, "gpu0.nvmlDeviceGetFieldValues"),
        2 + 1,
        "instant power, memory temperature and NVLink: one batched call per tick \
         (and the first tick's health read, the remapped rows)"
    );
}

/// A KiB counter that grows by `kib_per_s` each tick (ticks are 1 s apart).
fn counter(start: u64, kib_per_s: u64) -> Value {
    Value::Ramp {
        start,
        step: kib_per_s,
    }
}

#[test]
fn nvlink_throughput_is_read_per_link_and_summed_in_the_one_field_value_call() {
    const TX: u32 = 138;
    const RX: u32 = 139;
    const ALL: u32 = u32::MAX;
    let nvl = Gpu {
        nvlinks: 4,
        nvlink_tx_kib: vec![
            counter(1000, 1000),
            counter(5000, 2000),
            seq(&[0, 0, 300, 600]),
        ],
        nvlink_rx_kib: (1..=4).map(|l| counter(0, l * 100)).collect(),
        // Link 3's TX alone is unsupported (its counter is not in the scenario: 0 in the sum).
        unsupported: vec![format!("field:{TX}:3")],
        ..gpu("GPU-nvl")
    };
    let no_rx = Gpu {
        nvlinks: 2,
        nvlink_tx_kib: vec![counter(0, 50), counter(10, 150)],
        nvlink_rx_kib: vec![counter(0, 1), counter(0, 1)],
        unsupported: vec![format!("field:{RX}")],
        ..gpu("GPU-norx")
    };
    let pcie = Gpu {
        nvlinks: 0,
        ..gpu("GPU-pcie")
    };
    let fake = Fake::new(Scenario {
        gpus: vec![nvl, no_rx, pcie],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let inv = src.inventory().expect("inventory");
    let links: Vec<_> = inv.gpus.iter().map(|g| g.nvlink_count).collect();
    assert_eq!(links, [Some(4), Some(2), Some(0)]);
    const N: usize = 4;
    let t = ticks(&mut src, N);
    for g in &t[0].gpus {
        assert_eq!(
            (g.nvlink_tx_bps, g.nvlink_rx_bps, g.nvlinks.len()),
            (None, None, 0),
            "{}: a rate needs two readings",
            g.gpu_uuid
        );
    }
    const KIB: u64 = 1024;
    let link = |link, tx: Option<u64>, rx: Option<u64>| gpufleet_core::NvLinkSample {
        link,
        tx_bps: tx.map(|v| v * KIB),
        rx_bps: rx.map(|v| v * KIB),
    };
    for (k, tick) in t.iter().enumerate().skip(1) {
        let s = sample(tick, "GPU-nvl");
        let link2 = [0, 300, 300][k - 1];
        assert_eq!(
            s.nvlinks,
            [
                link(0, Some(1000), Some(100)),
                link(1, Some(2000), Some(200)),
                link(2, Some(link2), Some(300)),
                link(3, None, Some(400)),
            ],
            "tick {k}: per link, from the counters' deltas"
        );
        assert_eq!(s.nvlink_tx_bps, Some((3000 + link2) * KIB), "tick {k}: sum");
        assert_eq!(s.nvlink_rx_bps, Some(1000 * KIB), "tick {k}: sum");

        let s = sample(tick, "GPU-norx");
        assert_eq!(
            s.nvlinks,
            [link(0, Some(50), None), link(1, Some(150), None)],
            "tick {k}: unsupported RX is absent, not zero"
        );
        assert_eq!((s.nvlink_tx_bps, s.nvlink_rx_bps), (Some(200 * KIB), None));

        let s = sample(tick, "GPU-pcie");
        assert_eq!(
            (s.nvlink_tx_bps, s.nvlink_rx_bps, s.nvlinks.len()),
            (None, None, 0)
        );
        assert_eq!(s.power_instant_mw, Some(60_000), "the rest of the batch");
    }
    drop(src);
    let c = fake.counts();
    for g in 0..3 {
        assert_eq!(
            count(&c, &format!("gpu{g}.nvmlDeviceGetFieldValues")),
            N as u64 + 1,
            "gpu{g}: one field-value call per tick (and the first tick's health read): {c:?}"
        );
    }
    let asked =
        |g: u32, field: u32, scope: u32| count(&c, &format!("gpu{g}.field:{field}:{scope}"));
    assert_eq!(asked(0, TX, 3), 1, "unsupported link entry asked once");
    for scope in [ALL, 0, 1, 2] {
        assert_eq!(asked(0, TX, scope), N as u64, "gpu0 TX scope {scope}");
    }
    for scope in [ALL, 0, 1, 2, 3] {
        assert_eq!(asked(0, RX, scope), N as u64, "gpu0 RX scope {scope}");
    }
    for scope in [ALL, 0, 1] {
        assert_eq!(asked(1, RX, scope), 1, "unsupported field asked once");
        assert_eq!(asked(1, TX, scope), N as u64);
    }
    assert!(
        !c.keys().any(|k| k.starts_with(&format!("gpu2.field:{TX}"))
            || k.starts_with(&format!("gpu2.field:{RX}"))),
        "no links: no NVLink entries asked: {c:?}"
    );
}

#[test]
fn unsupported_metrics_are_absent_and_asked_once() {
    let unsupported: Vec<String> = [
        "nvmlDeviceGetFanSpeed_v2",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetProcessUtilization",
        "field:186",
    ]
    .map(String::from)
    .to_vec();
    let partly = Gpu {
        unsupported,
        compute_processes: vec![proc_(1101, 1, Some(50))],
        ..gpu("GPU-partly")
    };
    let no_fields = Gpu {
        // Every entry of its batch: instant power, memory temperature, NVLink TX / RX.
        unsupported: ["field:186", "field:82", "field:138", "field:139"]
            .map(String::from)
            .to_vec(),
        ..gpu("GPU-nofields")
    };
    let fake = Fake::new(Scenario {
        gpus: vec![partly, no_fields],
        ..Scenario::default()
    });
    let mut src = fake.open();
    const N: usize = 5;
    for tick in ticks(&mut src, N) {
        let s = sample(&tick, "GPU-partly");
        assert_eq!(
            (s.fan_pct, s.energy_mj, s.power_instant_mw, s.enc_util_pct),
            (None, None, None, None)
        );
        assert_eq!(
            (s.ecc_corrected_volatile, s.ecc_uncorrected_volatile),
            (None, None)
        );
        assert_eq!(
            s.temp_mem_c,
            Some(35),
            "the other field of the batch is still read"
        );
        assert_eq!(s.dec_util_pct, Some(0), "supported zero stays zero");
        assert_eq!(s.power_mw, Some(60_000));
        let p = &tick.processes[0];
        assert_eq!(
            (p.pid, p.sm_util_pct),
            (1101, None),
            "no utilization: absent"
        );
        let other = sample(&tick, "GPU-nofields");
        assert_eq!((other.power_instant_mw, other.temp_mem_c), (None, None));
        assert_eq!((other.nvlink_tx_bps, other.nvlink_rx_bps), (None, None));
        assert!(other.nvlinks.is_empty());
        assert_eq!(other.fan_pct, Some(0));
    }
    drop(src);
    let c = fake.counts();
    for f in [
        "nvmlDeviceGetFanSpeed_v2",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetProcessUtilization",
    ] {
        assert_eq!(count(&c, &format!("gpu0.{f}")), 1, "{f} asked once: {c:?}");
    }
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetTotalEccErrors"),
        4,
        "corrected and uncorrected, volatile and (health) aggregate, once each"
    );
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetDecoderUtilization"), N as u64);
    // Each also made the first tick's health read (the remapped-row fields).
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetFieldValues"), N as u64 + 1);
    assert_eq!(
        count(&c, "gpu1.nvmlDeviceGetFieldValues"),
        1 + 1,
        "no field left: the call is not made again"
    );
    assert_eq!(count(&c, "gpu1.nvmlDeviceGetFanSpeed_v2"), N as u64);
}

/// Calls a real driver makes expensive are not made when their answer is known: a
/// fanless board's fan (its fan 0 answers INVALID_ARGUMENT, which would otherwise be a
/// failure every tick) and the per-process utilization of a GPU with no process (it only
/// annotates listed processes, and costs milliseconds of CPU on an H200).
#[test]
fn a_fanless_or_idle_gpu_is_not_asked_what_it_cannot_have() {
    let fanless = Gpu {
        fans: 0,
        fan_pct: 40.into(),
        ..gpu("GPU-fanless")
    };
    let busy = Gpu {
        compute_processes: vec![proc_(1101, 1, Some(50))],
        ..gpu("GPU-busy")
    };
    let fake = Fake::new(Scenario {
        gpus: vec![fanless, busy],
        ..Scenario::default()
    });
    let mut src = fake.open();
    const N: usize = 4;
    for tick in ticks(&mut src, N) {
        let idle = sample(&tick, "GPU-fanless");
        assert_eq!(idle.fan_pct, None, "no fan: absent, not 0");
        assert_eq!(idle.power_mw, Some(60_000), "the rest is read");
        assert_eq!(sample(&tick, "GPU-busy").fan_pct, Some(0));
        let procs: Vec<_> = tick
            .processes
            .iter()
            .map(|p| (p.gpu_uuid.as_str(), p.pid, p.sm_util_pct))
            .collect();
        assert_eq!(procs, [("GPU-busy", 1101, Some(50))]);
    }
    drop(src);
    let c = fake.counts();
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetFanSpeed_v2"), 0, "{c:?}");
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetProcessUtilization"),
        0,
        "{c:?}"
    );
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetComputeRunningProcesses_v3"),
        N as u64,
        "the lists are still read every tick"
    );
    assert_eq!(count(&c, "gpu1.nvmlDeviceGetFanSpeed_v2"), N as u64);
    assert_eq!(count(&c, "gpu1.nvmlDeviceGetProcessUtilization"), N as u64);
}

/// PCIe throughput calls that wait (a real driver samples the link for ~20 ms each) are
/// made side by side from the tick after they were first seen to wait, every GPU's at
/// once; calls that answer at once stay inline. The values are the same either way.
#[test]
fn pcie_calls_that_wait_are_made_side_by_side() {
    let waiting = |uuid: &str| Gpu {
        pcie_sample_ms: 25,
        pcie_tx_kib: seq(&[1, 2, 3, 4]),
        pcie_rx_kib: seq(&[10, 20, 30, 40]),
        ..gpu(uuid)
    };
    let prompt = Gpu {
        pcie_tx_kib: seq(&[5, 6, 7, 8]),
        ..gpu("GPU-prompt")
    };
    let fake = Fake::new(Scenario {
        gpus: vec![waiting("GPU-a"), waiting("GPU-b"), prompt],
        ..Scenario::default()
    });
    let mut src = fake.open();
    for (k, tick) in (0u64..).zip(ticks(&mut src, 4)) {
        for uuid in ["GPU-a", "GPU-b"] {
            let s = sample(&tick, uuid);
            assert_eq!(
                (s.pcie_tx_bps, s.pcie_rx_bps),
                (Some((k + 1) * 1024), Some((k + 1) * 10 * 1024)),
                "tick {k}, {uuid}"
            );
        }
        let s = sample(&tick, "GPU-prompt");
        assert_eq!(
            (s.pcie_tx_bps, s.pcie_rx_bps),
            (Some((k + 5) * 1024), Some(0))
        );
    }
    drop(src);
    let c = fake.counts();
    for g in 0..3 {
        let key = format!("gpu{g}.nvmlDeviceGetPcieThroughput");
        assert_eq!(count(&c, &key), 8, "TX and RX once per tick: {c:?}");
    }
    // One tick inline finds they wait; then four calls (two GPUs, TX and RX) wait together.
    assert!(
        count(&c, "pcie_in_flight_max") >= 2,
        "the waiting calls overlapped: {c:?}"
    );
}

#[test]
fn the_power_limit_is_read_every_30_s_and_reported_every_tick() {
    let fake = Fake::new(Scenario {
        gpus: vec![
            gpu("GPU-limited"),
            Gpu {
                unsupported: vec!["nvmlDeviceGetEnforcedPowerLimit".into()],
                ..gpu("GPU-nolimit")
            },
        ],
        ..Scenario::default()
    });
    let mut src = fake.open();
    // Ticks 1 s apart: read at 0 s and 30 s.
    for tick in ticks(&mut src, 35) {
        assert_eq!(sample(&tick, "GPU-limited").power_limit_mw, Some(400_000));
        assert_eq!(
            sample(&tick, "GPU-nolimit").power_limit_mw,
            None,
            "absent stays absent"
        );
    }
    drop(src);
    let c = fake.counts();
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetEnforcedPowerLimit"),
        2,
        "{c:?}"
    );
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetPowerUsage"), 35);
}

#[test]
fn the_sampler_counts_the_sampling_threads_cpu_once() {
    // NVML runs on the sampling thread: the tick's CPU time is that thread's, measured
    // once, so it can never exceed the tick's wall time (counted by the source and again
    // by the sampler, a busy tick's CPU came out near twice its wall time). One GPU: with
    // several, a tick of expensive calls reads each on a thread of its own, and their CPU
    // together may exceed the wall time.
    let fake = Fake::new(Scenario {
        gpus: vec![gpu("GPU-cpu-0")],
        ..Scenario::default()
    });
    let mut sampler = gpufleet_uplink::sampler::Sampler::new(Box::new(fake.open()), None);
    sampler.inventory().expect("inventory");
    for t in 0..50 {
        let tick = sampler.sample(T0 + t * 1000).expect("tick");
        let cost = tick.cost.expect("cost");
        let (cpu, wall) = (cost.cpu_us.expect("cpu"), cost.wall_us.expect("wall"));
        assert!(cpu <= wall, "tick {t}: {cpu} µs of CPU in {wall} µs");
    }
}
