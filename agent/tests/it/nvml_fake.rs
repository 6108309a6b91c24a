//! The agent's real NVML source, through nvml-wrapper, against the fake libnvidia-ml
//! (`fake-nvml`): every metric read back with the scenario's values, unsupported ones
//! absent and asked once, process lists growing under NVML's INSUFFICIENT_SIZE protocol,
//! the fixture pids mapped to their containers, an Xid event delivered once, a GPU lost
//! and recovered, and `gpufleet-agent snapshot --nvml-lib`.
//!
//! Each test copies the built library into its own temporary folder beside its scenario,
//! so each test has its own fake machine (the loader loads each copy separately).

use crate::common::cgroup_fixtures;
use fake_nvml::{EventKind, EventSpec, Gpu, MigSpec, Process, Scenario, Value};
use gpufleet_agent::nvml::{NvmlOptions, NvmlSource};
use gpufleet_core::GpuSource;
use gpufleet_core::{EventKind as Kind, GpuSample, ProcessType, Tick};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Unix ms of the first tick; ticks are 1 s apart.
const T0: i64 = 1_790_000_000_000;
const GIB: u64 = 1 << 30;

/// The fake library cargo built for this test binary (a dev-dependency: it sits in
/// `target/<profile>/deps` next to this test executable).
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    fake_nvml::built_library(&exe).unwrap_or_else(|| {
        panic!(
            "{} not found next to {}: build the workspace (`cargo test --workspace`)",
            fake_nvml::LIBRARY_FILE,
            exe.display()
        )
    })
}

/// One fake machine: a private copy of the library, its scenario and its counts file.
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new(mut scenario: Scenario) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::copy(built_library(), dir.path().join("libnvidia-ml.so.1")).expect("copy lib");
        scenario.counts_file = Some(dir.path().join("counts.json"));
        let json = serde_json::to_string_pretty(&scenario).expect("scenario serializes");
        std::fs::write(dir.path().join(fake_nvml::SCENARIO_FILE), json).expect("write scenario");
        Self { dir }
    }

    fn lib(&self) -> PathBuf {
        self.dir.path().join("libnvidia-ml.so.1")
    }

    fn open(&self) -> NvmlSource {
        NvmlSource::open(NvmlOptions {
            lib_path: Some(self.lib()),
            proc_root: cgroup_fixtures().join("proc"),
            hostname: "fake-node".into(),
        })
        .expect("the agent opens the fake NVML")
    }

    /// Per-function call counts, written by `nvmlShutdown` (drop the source first).
    fn counts(&self) -> BTreeMap<String, u64> {
        let path = self.dir.path().join("counts.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} (was the source dropped?): {e}", path.display()));
        serde_json::from_str(&text).expect("counts are JSON")
    }
}

fn count(counts: &BTreeMap<String, u64>, key: &str) -> u64 {
    counts.get(key).copied().unwrap_or(0)
}

fn gpu(uuid: &str) -> Gpu {
    Gpu {
        uuid: uuid.into(),
        ..Gpu::default()
    }
}

fn proc_(pid: u32, used_gib: u64, sm: Option<u32>) -> Process {
    Process {
        pid,
        used_bytes: Some(used_gib * GIB),
        sm_pct: sm,
        mem_pct: sm.map_or(0, |s| s / 2),
        ..Process::default()
    }
}

fn seq(v: &[u64]) -> Value {
    Value::Seq(v.to_vec())
}

fn ticks(src: &mut NvmlSource, n: usize) -> Vec<Tick> {
    (0..n)
        .map(|k| src.sample(T0 + k as i64 * 1000).expect("tick"))
        .collect()
}

fn sample<'t>(tick: &'t Tick, uuid: &str) -> &'t GpuSample {
    tick.gpus
        .iter()
        .find(|g| g.gpu_uuid == uuid)
        .unwrap_or_else(|| panic!("{uuid} missing from {tick:?}"))
}

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
    assert!(cost.source_us.is_some() && cost.cpu_us.is_some());
    assert!(!cost.slowest_calls_us.is_empty());
    drop(src);
    let counts = fake.counts();
    assert_eq!(
        count(&counts, "nvmlShutdown"),
        1,
        "dropping the source shuts NVML down"
    );
    assert_eq!(
        count(&counts, "gpu0.nvmlDeviceGetFieldValues"),
        2,
        "instant power, memory temperature and NVLink: one batched call per tick"
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
            N as u64,
            "gpu{g}: one field-value call per tick: {c:?}"
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
        2,
        "corrected and uncorrected, once each"
    );
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetDecoderUtilization"), N as u64);
    assert_eq!(count(&c, "gpu0.nvmlDeviceGetFieldValues"), N as u64);
    assert_eq!(
        count(&c, "gpu1.nvmlDeviceGetFieldValues"),
        1,
        "no field left: the call is not made again"
    );
    assert_eq!(count(&c, "gpu1.nvmlDeviceGetFanSpeed_v2"), N as u64);
}

/// The identity fields `expected.json` may list; any it does not list must be absent
/// (`runtime` is compared only where it is listed).
const IDENTITY_FIELDS: &[&str] = &[
    "kind",
    "container_id",
    "pod_uid",
    "qos",
    "job_id",
    "step",
    "unit",
    "uid",
];

#[test]
fn all_fixture_pids_map_to_their_containers_through_a_growing_process_list() {
    let expected: BTreeMap<String, Json> = serde_json::from_str(
        &std::fs::read_to_string(cgroup_fixtures().join("expected.json")).expect("expected.json"),
    )
    .expect("expected.json is an object");
    assert_eq!(expected.len(), 11);
    // 3 processes at the size query, 11 at the fill: more than nvml-wrapper's headroom
    // of 5, so the fill answers INSUFFICIENT_SIZE and the list is asked again.
    let compute: Vec<Process> = (1101..=1111)
        .map(|pid| Process {
            from_call: if pid <= 1103 { 0 } else { 1 },
            ..proc_(pid, 1, Some(pid % 100))
        })
        .collect();
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            compute_processes: compute,
            ..gpu("GPU-busy")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let tick = src.sample(T0).expect("tick");
    let pids: Vec<u32> = tick.processes.iter().map(|p| p.pid).collect();
    assert_eq!(
        pids,
        (1101..=1111).collect::<Vec<_>>(),
        "all 11 in the first tick"
    );
    for p in &tick.processes {
        let want = &expected[&p.pid.to_string()];
        let got = serde_json::to_value(&p.workload).expect("workload serializes");
        if let Some(runtime) = want.get("runtime") {
            assert_eq!(got.get("runtime"), Some(runtime), "pid {}: runtime", p.pid);
        }
        for field in IDENTITY_FIELDS {
            assert_eq!(
                got.get(*field),
                want.get(*field),
                "pid {}: {field}\n got {got}\nwant {want}",
                p.pid
            );
        }
        assert_eq!(p.sm_util_pct, Some(p.pid % 100));
    }
    assert!(tick.processes.iter().all(|p| p.command.is_some()));
    drop(src);
    assert_eq!(
        count(
            &fake.counts(),
            "gpu0.nvmlDeviceGetComputeRunningProcesses_v3"
        ),
        4,
        "size query + INSUFFICIENT_SIZE fill, then size query + fill"
    );
}

/// Samples (1 s of simulated time apart, 10 ms of real time) until `done` holds for the
/// ticks so far, or fails after a deadline.
fn sample_until(
    src: &mut NvmlSource,
    ticks: &mut Vec<Tick>,
    what: &str,
    done: impl Fn(&[Tick]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(ticks) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {ticks:#?}"
        );
        let t = T0 + ticks.len() as i64 * 1000;
        ticks.push(src.sample(t).expect("tick"));
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn events_of(ticks: &[Tick], kind: Kind) -> Vec<(String, Option<u64>)> {
    ticks
        .iter()
        .flat_map(|t| &t.events)
        .filter(|e| e.kind == kind)
        .map(|e| (e.gpu_uuid.clone(), e.code))
        .collect()
}

#[test]
fn xid_and_double_bit_ecc_events_are_delivered_once() {
    let fake = Fake::new(Scenario {
        gpus: vec![
            gpu("GPU-quiet"),
            Gpu {
                events: vec![
                    EventSpec {
                        kind: EventKind::Xid,
                        code: 79,
                        after_calls: 60,
                    },
                    EventSpec {
                        kind: EventKind::EccDoubleBit,
                        code: 0,
                        after_calls: 60,
                    },
                ],
                ..gpu("GPU-xid")
            },
        ],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let mut ticks = Vec::new();
    sample_until(&mut src, &mut ticks, "the Xid and ECC events", |t| {
        !events_of(t, Kind::Xid).is_empty() && !events_of(t, Kind::EccDoubleBit).is_empty()
    });
    let seen = ticks.len();
    sample_until(&mut src, &mut ticks, "five more ticks", |t| {
        t.len() >= seen + 5
    });
    assert_eq!(
        events_of(&ticks, Kind::Xid),
        [("GPU-xid".to_owned(), Some(79))]
    );
    assert_eq!(
        events_of(&ticks, Kind::EccDoubleBit),
        [("GPU-xid".to_owned(), None)]
    );
    for t in &ticks {
        for e in &t.events {
            assert!(
                e.time_ms <= t.time_ms,
                "an event is not from the future: {e:?}"
            );
        }
    }
    drop(src);
    let c = fake.counts();
    assert_eq!(count(&c, "gpu0.nvmlDeviceRegisterEvents"), 1);
    assert_eq!(count(&c, "gpu1.nvmlDeviceRegisterEvents"), 1);
    assert!(
        count(&c, "nvmlEventSetFree") >= 1,
        "the set is freed: {c:?}"
    );
}

#[test]
fn a_lost_gpu_is_reported_the_others_keep_sampling_and_it_recovers() {
    let fake = Fake::new(Scenario {
        gpus: vec![
            Gpu {
                lost_after_calls: Some(60),
                lost_for_calls: Some(3),
                power_mw: 300_000.into(),
                ..gpu("GPU-flaky")
            },
            gpu("GPU-steady"),
        ],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let mut ticks = Vec::new();
    sample_until(&mut src, &mut ticks, "the GPU to be lost", |t| {
        !events_of(t, Kind::GpuLost).is_empty()
    });
    let lost_at = ticks.len() - 1;
    sample_until(&mut src, &mut ticks, "the GPU to recover", |t| {
        !events_of(t, Kind::GpuRecovered).is_empty()
    });
    let back_at = ticks.len() - 1;
    assert!(back_at > lost_at + 1, "lost for at least one whole tick");
    for t in &ticks[lost_at + 1..back_at] {
        let s = sample(t, "GPU-flaky");
        assert_eq!(
            (s.power_mw, s.util_gpu_pct, s.energy_mj),
            (None, None, None),
            "a lost GPU's values are absent"
        );
        assert_eq!(
            sample(t, "GPU-steady").power_mw,
            Some(60_000),
            "others keep sampling"
        );
    }
    assert_eq!(sample(&ticks[back_at], "GPU-flaky").power_mw, Some(300_000));
    sample_until(&mut src, &mut ticks, "two more ticks", |t| {
        t.len() >= back_at + 3
    });
    assert_eq!(events_of(&ticks, Kind::GpuLost).len(), 1);
    assert_eq!(
        events_of(&ticks, Kind::GpuRecovered),
        [("GPU-flaky".to_owned(), None)]
    );
    assert_eq!(
        sample(ticks.last().expect("ticks"), "GPU-flaky").power_mw,
        Some(300_000)
    );
}

#[test]
fn mig_devices_are_in_the_inventory_and_their_processes_carry_the_mig_uuid() {
    let mig = |uuid: &str, profile: &str, gi: u32, gib: u64| MigSpec {
        uuid: uuid.into(),
        profile: profile.into(),
        memory_total_bytes: gib * GIB,
        gpu_instance_id: gi,
        compute_instance_id: 0,
    };
    let in_mig = |pid: u32, m: usize| Process {
        mig: Some(m),
        ..proc_(pid, 2, None)
    };
    let fake = Fake::new(Scenario {
        gpus: vec![
            Gpu {
                mig_mode: 1,
                mig_instances: vec![
                    mig("MIG-aaaa", "3g.40gb", 1, 40),
                    mig("MIG-bbbb", "2g.20gb", 2, 20),
                    mig("MIG-empty", "1g.10gb", 5, 10),
                ],
                compute_processes: vec![in_mig(1103, 0), in_mig(1104, 1), in_mig(1105, 1)],
                unsupported: vec!["nvmlDeviceGetUtilizationRates".into()],
                ..gpu("GPU-mig")
            },
            Gpu {
                compute_processes: vec![proc_(1101, 1, None)],
                ..gpu("GPU-plain")
            },
        ],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let inv = src.inventory().expect("inventory");
    assert_eq!(inv.gpus[0].mig_enabled, Some(true));
    let migs: Vec<_> = inv.gpus[0]
        .mig_instances
        .iter()
        .map(|m| {
            (
                m.uuid.as_str(),
                m.profile.as_deref(),
                m.memory_total_bytes,
                m.gpu_instance_id,
                m.compute_instance_id,
            )
        })
        .collect();
    assert_eq!(
        migs,
        [
            ("MIG-aaaa", Some("3g.40gb"), Some(40 * GIB), 1, 0),
            ("MIG-bbbb", Some("2g.20gb"), Some(20 * GIB), 2, 0),
            (
                "MIG-empty",
                Some("1g.10gb"),
                Some(10 * GIB),
                0xFFFF_FFFF,
                0xFFFF_FFFF
            ),
        ],
        "ids from a process in the instance; NVML's no-value when it has none"
    );
    assert_eq!(inv.gpus[1].mig_enabled, Some(false));
    assert!(inv.gpus[1].mig_instances.is_empty());
    let tick = &ticks(&mut src, 2)[1];
    let by_pid: Vec<_> = tick
        .processes
        .iter()
        .map(|p| (p.pid, p.gpu_uuid.as_str(), p.mig_uuid.as_deref()))
        .collect();
    assert_eq!(
        by_pid,
        [
            (1103, "GPU-mig", Some("MIG-aaaa")),
            (1104, "GPU-mig", Some("MIG-bbbb")),
            (1105, "GPU-mig", Some("MIG-bbbb")),
            (1101, "GPU-plain", None),
        ]
    );
    assert_eq!(sample(tick, "GPU-mig").util_gpu_pct, None);
}

#[test]
fn a_library_that_cannot_load_its_scenario_fails_with_a_clear_error() {
    let fake = Fake::new(Scenario::default());
    std::fs::write(fake.dir.path().join(fake_nvml::SCENARIO_FILE), "{not json").expect("write");
    let err = NvmlSource::open(NvmlOptions {
        lib_path: Some(fake.lib()),
        proc_root: cgroup_fixtures().join("proc"),
        hostname: "x".into(),
    })
    .expect_err("init fails");
    assert!(
        err.to_string().contains("cannot initialise NVML from"),
        "{err}"
    );
}

fn snapshot_scenario() -> Scenario {
    Scenario {
        gpus: vec![
            Gpu {
                util_gpu_pct: 93.into(),
                mem_used_bytes: (61 * GIB).into(),
                power_mw: 388_000.into(),
                temp_gpu_c: 67.into(),
                compute_processes: (1101..=1106).map(|p| proc_(p, 10, Some(15))).collect(),
                ..gpu("GPU-0")
            },
            Gpu {
                util_gpu_pct: 41.into(),
                pci_bus_id: "00000000:0B:00.0".into(),
                unsupported: vec!["nvmlDeviceGetTemperature".into()],
                compute_processes: (1107..=1111).map(|p| proc_(p, 5, Some(8))).collect(),
                ..gpu("GPU-1")
            },
        ],
        ..Scenario::default()
    }
}

fn snapshot(fake: &Fake, json: bool) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
    cmd.arg("snapshot")
        .arg("--nvml-lib")
        .arg(fake.lib())
        .arg("--proc-root")
        .arg(cgroup_fixtures().join("proc"))
        .args(["--node", "fake-node"]);
    if json {
        cmd.arg("--json");
    }
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUFLEET_") {
            cmd.env_remove(&k);
        }
    }
    let out = cmd.output().expect("the agent binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn snapshot_with_nvml_lib_shows_gpus_and_processes_with_containers() {
    let fake = Fake::new(snapshot_scenario());
    let table = snapshot(&fake, false);
    assert!(
        table.starts_with("fake-node  driver 550.54.15  CUDA 12.4"),
        "{table}"
    );
    let rows: Vec<&str> = table.lines().filter(|l| l.contains("A100-SXM4")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].contains("67C") && rows[0].contains("93%"),
        "{table}"
    );
    assert!(
        rows[1].contains(" n/a ") && rows[1].contains("41%"),
        "{table}"
    );
    for shown in [
        "container 5e6f7a8b5e6f",
        "slurm job 48213 step 0",
        "container a1b2c3d4a1b2",
        "host session-3.scope",
    ] {
        assert!(table.contains(shown), "{shown:?} missing:\n{table}");
    }
    assert_eq!(
        table
            .lines()
            .filter(|l| l.contains("MiB") && !l.contains("MEMORY"))
            .count(),
        11,
        "one row per process:\n{table}"
    );

    let v: Json = serde_json::from_str(&snapshot(&fake, true)).expect("JSON");
    assert_eq!(v["inventory"]["gpus"].as_array().map(Vec::len), Some(2));
    assert!(
        v["tick"]["gpus"][1]["temp_gpu_c"].is_null(),
        "absent, not 0"
    );
    let procs = v["tick"]["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 11);
    assert_eq!(procs[0]["workload"]["runtime"], "docker");
}
