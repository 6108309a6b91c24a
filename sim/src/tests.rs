//! The simulator's laws: determinism, energy = ∫ power, power within [idle, limit],
//! absent metrics stay absent, per-process shares fit the GPU totals, workloads behave,
//! GPM fits the utilization.

use super::*;
use gpufleet_core::{GpmMetrics, WorkloadKind};
use proptest::prelude::*;

const T0: i64 = 1_790_000_000_000;

fn sim(node: &str, gpus: u32, scenario: Scenario) -> Simulator {
    simulator(SimOptions {
        node: node.into(),
        gpus,
        seed: None,
        scenario,
    })
    .expect("valid options")
}

fn scenario(toml: &str) -> Scenario {
    Scenario::parse(toml, "test").expect("valid scenario")
}

/// Samples at T0 + each cumulative offset.
fn run(s: &mut Simulator, intervals: &[i64]) -> Vec<Tick> {
    let mut t = T0;
    let mut out = vec![s.sample(t).expect("first sample")];
    for dt in intervals {
        t += dt;
        out.push(s.sample(t).expect("sample"));
    }
    out
}

#[test]
fn same_options_and_calls_give_the_same_ticks() {
    let intervals: Vec<i64> = (0..400).map(|i| 200 + (i * 7919) % 4_000).collect();
    let mut a = sim("gpu-node-03", 8, Scenario::default());
    let mut b = sim("gpu-node-03", 8, Scenario::default());
    assert_eq!(a.inventory().expect("inv"), b.inventory().expect("inv"));
    assert_eq!(a.boot_id(), b.boot_id());
    let (ta, tb) = (run(&mut a, &intervals), run(&mut b, &intervals));
    assert_eq!(ta, tb);
    assert!(
        ta.iter().any(|t| !t.processes.is_empty()),
        "a default node runs something"
    );

    let mut other = sim("gpu-node-04", 8, Scenario::default());
    let inv_other = other.inventory().expect("inv");
    let inv_a = a.inventory().expect("inv");
    assert_ne!(inv_other.gpus[0].uuid, inv_a.gpus[0].uuid, "nodes differ");
    assert_ne!(run(&mut other, &intervals[..10]), ta[..11].to_vec());
}

#[test]
fn an_explicit_seed_changes_the_node_but_keeps_it_reproducible() {
    let opts = |seed| SimOptions {
        seed: Some(seed),
        ..SimOptions::new("n1", 2)
    };
    let mut a = simulator(opts(7)).expect("ok");
    let mut b = simulator(opts(7)).expect("ok");
    let mut c = simulator(opts(8)).expect("ok");
    assert_eq!(a.seed(), 7);
    assert_eq!(a.inventory().expect("inv"), b.inventory().expect("inv"));
    assert_ne!(
        a.inventory().expect("inv").gpus[0].uuid,
        c.inventory().expect("inv").gpus[0].uuid
    );
    assert_eq!(sim("n1", 2, Scenario::default()).seed(), node_seed("n1"));
}

#[test]
fn time_must_move_forward() {
    let mut s = sim("n", 1, Scenario::default());
    s.sample(T0).expect("first");
    assert!(matches!(
        s.sample(T0),
        Err(SourceError::TimeNotIncreasing { .. })
    ));
    assert!(s.sample(T0 - 5).is_err());
    assert!(s.sample(T0 + 1).is_ok());
}

#[test]
fn bad_options_are_refused() {
    assert!(matches!(
        simulator(SimOptions::new("n", 0)),
        Err(SimError::Gpus(0))
    ));
    assert!(matches!(
        simulator(SimOptions::new("n", 65)),
        Err(SimError::Gpus(65))
    ));
    let bad = SimOptions {
        scenario: scenario("model = \"v100\"\n"),
        ..SimOptions::new("n", 1)
    };
    assert!(simulator(bad).is_err());
}

/// Energy between two ticks, in half-µJ: the exact trapezoid of the reported power.
fn trapezoid_half_uj(a: &Tick, b: &Tick, g: usize) -> u128 {
    let (pa, pb) = (
        a.gpus[g].power_mw.expect("power"),
        b.gpus[g].power_mw.expect("power"),
    );
    u128::from(pa + pb) * (b.time_ms - a.time_ms) as u128
}

fn check_energy_and_power(s: &Simulator, ticks: &[Tick]) -> Result<(), TestCaseError> {
    for g in 0..ticks[0].gpus.len() {
        let (idle, limit) = (s.gpus[g].idle_mw, s.gpus[g].limit_mw);
        let first = ticks[0].gpus[g].energy_mj.expect("energy");
        prop_assert!(first > 0, "a driver loaded days ago has a non-zero counter");
        let mut integral: u128 = 0;
        for w in ticks.windows(2) {
            integral += trapezoid_half_uj(&w[0], &w[1], g);
            let counter = w[1].gpus[g].energy_mj.expect("energy");
            prop_assert!(
                counter >= w[0].gpus[g].energy_mj.expect("energy"),
                "counter never decreases"
            );
            // counter - first == floor-differences of an exact integer accumulation, so it
            // is within 1 mJ of the exact integral.
            let exact_mj = integral as f64 / 2000.0;
            let delta = (counter - first) as f64;
            prop_assert!(
                (delta - exact_mj).abs() < 1.0,
                "gpu {g}: counter delta {delta} vs integral {exact_mj}"
            );
        }
        for t in ticks {
            let gs = &t.gpus[g];
            let p = gs.power_mw.expect("power");
            prop_assert!(
                p >= idle && p <= limit,
                "power {p} outside [{idle}, {limit}]"
            );
            prop_assert_eq!(gs.power_limit_mw, Some(limit));
            if let Some(i) = gs.power_instant_mw {
                prop_assert!(
                    i >= idle && i <= limit,
                    "instant power {i} outside [{idle}, {limit}]"
                );
            }
        }
    }
    Ok(())
}

fn check_shares(ticks: &[Tick]) -> Result<(), TestCaseError> {
    for t in ticks {
        for g in &t.gpus {
            let procs: Vec<_> = t
                .processes
                .iter()
                .filter(|p| p.gpu_uuid == g.gpu_uuid)
                .collect();
            let sm: u32 = procs.iter().map(|p| p.sm_util_pct.unwrap_or(0)).sum();
            let mem: u64 = procs.iter().map(|p| p.gpu_mem_bytes.unwrap_or(0)).sum();
            let util = g.util_gpu_pct.expect("util");
            let used = g.mem_used_bytes.expect("used");
            let total = g.mem_total_bytes.expect("total");
            let reserved = g.mem_reserved_bytes.expect("reserved");
            prop_assert!(util <= 100);
            prop_assert!(sm <= util, "process SM {sm} > GPU util {util}");
            prop_assert!(mem <= used, "process memory {mem} > used {used}");
            prop_assert!(
                used + reserved <= total,
                "used {used} + reserved {reserved} > total {total}"
            );
            if procs.is_empty() {
                prop_assert_eq!(util, 0);
            }
        }
    }
    Ok(())
}

/// GPM: absent on a product without it; otherwise every activity present (0 is a real
/// reading there) and within 0..=10 000, SM activity within the utilization, each pipe
/// within SM activity (each tensor pipe within any-tensor), the links as the board counts
/// them. No MIG instances, so no per-instance GPM.
fn check_gpm(model: &GpuModel, ticks: &[Tick]) -> Result<(), TestCaseError> {
    let present = |v: Option<u32>| v.expect("GPM present on a product that has it");
    for t in ticks {
        for g in &t.gpus {
            let m = &g.gpm;
            prop_assert!(g.mig_gpm.is_empty(), "no MIG instances: {:?}", g.mig_gpm);
            if !model.gpm {
                prop_assert!(m.is_empty(), "{}: GPM without GPM: {m:?}", model.key);
                continue;
            }
            let all = [
                m.sm_active_cpct,
                m.sm_occupancy_cpct,
                m.tensor_active_cpct,
                m.tensor_hmma_cpct,
                m.tensor_imma_cpct,
                m.tensor_dfma_cpct,
                m.dram_bw_cpct,
                m.fp64_cpct,
                m.fp32_cpct,
                m.fp16_cpct,
            ];
            for a in all {
                prop_assert!(present(a) <= 10_000, "{m:?}");
            }
            let (sm, tensor) = (present(m.sm_active_cpct), present(m.tensor_active_cpct));
            let util = g.util_gpu_pct.expect("util");
            prop_assert!(
                sm <= util * 100,
                "SM activity {sm} above utilization {util} %"
            );
            for pipe in [
                m.sm_occupancy_cpct,
                m.tensor_active_cpct,
                m.fp64_cpct,
                m.fp32_cpct,
                m.fp16_cpct,
            ] {
                prop_assert!(present(pipe) <= sm, "{m:?}");
            }
            for pipe in [m.tensor_hmma_cpct, m.tensor_imma_cpct, m.tensor_dfma_cpct] {
                prop_assert!(present(pipe) <= tensor, "{m:?}");
            }
            prop_assert_eq!(
                (m.pcie_tx_bps, m.pcie_rx_bps),
                (g.pcie_tx_bps, g.pcie_rx_bps)
            );
            prop_assert_eq!(
                (m.nvlink_tx_bps, m.nvlink_rx_bps),
                (g.nvlink_tx_bps, g.nvlink_rx_bps)
            );
        }
    }
    Ok(())
}

/// The mean of one GPM metric of GPU `g` over `ticks`.
fn gpm_mean(ticks: &[Tick], g: usize, metric: fn(&GpmMetrics) -> Option<u32>) -> f64 {
    let sum: f64 = ticks
        .iter()
        .map(|t| f64::from(metric(&t.gpus[g].gpm).expect("GPM present")))
        .sum();
    sum / ticks.len() as f64
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn energy_is_the_integral_of_power_and_power_stays_in_range(
        seed in any::<u64>(),
        model in 0usize..catalog::MODELS.len(),
        intervals in proptest::collection::vec(1i64..20_000, 1..150),
    ) {
        let opts = SimOptions {
            seed: Some(seed),
            scenario: Scenario { model: Some(catalog::MODELS[model].key.into()), ..Scenario::default() },
            ..SimOptions::new("prop-node", 4)
        };
        let mut s = simulator(opts).expect("valid");
        let ticks = run(&mut s, &intervals);
        check_energy_and_power(&s, &ticks)?;
        check_shares(&ticks)?;
        check_gpm(s.model(), &ticks)?;
    }

    #[test]
    fn replaying_the_same_times_reproduces_every_value(
        seed in any::<u64>(),
        intervals in proptest::collection::vec(1i64..60_000, 1..60),
    ) {
        let opts = SimOptions { seed: Some(seed), ..SimOptions::new("replay", 3) };
        let mut a = simulator(opts.clone()).expect("valid");
        let mut b = simulator(opts).expect("valid");
        prop_assert_eq!(run(&mut a, &intervals), run(&mut b, &intervals));
    }
}

#[test]
fn absent_metrics_are_absent_and_present_ones_present() {
    let first = |model: &str| {
        let mut s = sim("absent", 2, scenario(&format!("model = \"{model}\"\n")));
        s.sample(T0).expect("sample").gpus.remove(0)
    };
    let h100 = first("h100-sxm");
    assert_eq!(h100.fan_pct, None, "passively cooled SXM: no fan");
    assert!(h100.power_instant_mw.is_some() && h100.temp_mem_c.is_some());
    assert!(h100.nvlink_tx_bps.is_some());
    let a100 = first("a100-sxm4-40gb");
    assert_eq!(a100.power_instant_mw, None);
    assert_eq!(a100.fan_pct, None);
    assert!(a100.temp_mem_c.is_some());
    let l40s = first("l40s");
    assert_eq!(l40s.temp_mem_c, None, "GDDR board: no memory sensor");
    assert_eq!(
        (l40s.nvlink_tx_bps, l40s.nvlink_rx_bps),
        (None, None),
        "no NVLink"
    );
    assert_eq!(l40s.fan_pct, None);
    let a6000 = first("rtx-a6000");
    assert!(
        a6000.fan_pct.is_some(),
        "an actively cooled board reports its fan"
    );
    for g in [&h100, &a100, &l40s, &a6000] {
        assert!(g.power_mw.is_some() && g.energy_mj.is_some() && g.temp_gpu_c.is_some());
        assert!(g.pstate.is_some() && g.clock_sm_mhz.is_some() && g.throttle_reasons.is_some());
    }
    let mut s = sim("absent", 2, scenario("model = \"l40s\"\n"));
    let inv = s.inventory().expect("inv");
    assert_eq!(inv.gpus[0].mig_enabled, None, "no MIG on L40S");
    assert_eq!(inv.driver_version.as_deref(), Some("550.54.15"));
    assert_eq!(inv.cuda_driver_version.as_deref(), Some("12.4"));
    assert!(inv.gpus[0].uuid.starts_with("GPU-") && inv.gpus[0].uuid.len() == 40);
}

#[test]
fn pcie_throughput_comes_in_whole_kib_as_nvml_reports_it() {
    let mut s = sim("pcie", 4, Scenario::default());
    let intervals = vec![1000; 120];
    let ticks = run(&mut s, &intervals);
    let rates: Vec<u64> = (ticks.iter().flat_map(|t| &t.gpus))
        .flat_map(|g| [g.pcie_rx_bps, g.pcie_tx_bps])
        .map(|r| r.expect("PCIe throughput is reported"))
        .collect();
    let odd = rates.iter().find(|&&r| r % 1024 != 0);
    assert_eq!(odd, None, "a reading in whole KiB");
    assert!(
        rates.iter().filter(|&&r| r > 0).count() > rates.len() / 2,
        "traffic flows"
    );
}

#[test]
fn a_scripted_training_job_loads_its_gpus_and_leaves_the_others_idle() {
    let mut s = sim(
        "scripted",
        3,
        scenario(
            r#"
model = "h100-sxm"
random_workloads = false
xid_per_gpu_hour = 0
thermal_events_per_gpu_hour = 0
[[jobs]]
kind = "training"
gpus = [0, 1]
start = "1m"
duration = "20m"
identity = "kubernetes"
"#,
        ),
    );
    let ticks = run(&mut s, &[1_000; 30 * 60]);
    let at = |secs: usize| &ticks[secs];
    // Before the job: idle, P8 after the hold time, GPU_IDLE reason, no processes.
    let idle = &at(30).gpus[0];
    assert_eq!(idle.util_gpu_pct, Some(0));
    assert_eq!(idle.pstate, Some(8));
    assert_eq!(
        idle.throttle_reasons.map(|r| r & gpu::reasons::GPU_IDLE),
        Some(gpu::reasons::GPU_IDLE)
    );
    assert!(at(30).processes.is_empty());
    let idle_temp = idle.temp_gpu_c.expect("temp");

    // Steady training (after warm-up): busy, hot, P0, NVLink traffic, one process per GPU
    // in the same pod.
    let busy = at(60 + 300);
    for g in &busy.gpus[..2] {
        assert!(g.util_gpu_pct.expect("util") >= 80, "{g:?}");
        assert!(g.power_mw.expect("power") > 450_000, "{g:?}");
        assert_eq!(g.pstate, Some(0));
        assert!(g.nvlink_tx_bps.expect("nvlink") > 10_000_000_000);
        assert!(g.temp_gpu_c.expect("temp") > idle_temp + 15);
    }
    assert_eq!(busy.gpus[2].util_gpu_pct, Some(0));
    assert_eq!(
        busy.gpus[2].nvlink_tx_bps,
        Some(0),
        "links exist, no traffic"
    );
    assert_eq!(busy.processes.len(), 2);
    let w = &busy.processes[0].workload;
    assert_eq!(w.kind, WorkloadKind::Container);
    assert_eq!(w.runtime, "containerd");
    assert!(w.pod_uid.is_some() && w.namespace.is_some() && w.pod_name.is_some());
    assert_eq!(w.container_id.as_ref().map(String::len), Some(64));
    assert_eq!(busy.processes[1].workload, *w, "ranks share the pod");
    assert!(
        busy.processes[0]
            .command
            .as_deref()
            .is_some_and(|c| c.starts_with("python"))
    );

    // Temperature lags power: 10 s into steady load it is still far below steady state.
    let early = at(60 + 2).gpus[0].temp_gpu_c.expect("temp");
    let late = at(60 + 600).gpus[0].temp_gpu_c.expect("temp");
    assert!(early < late, "{early} !< {late}");

    // After the job: gone.
    assert!(at(60 + 20 * 60 + 5).processes.is_empty());
}

#[test]
fn a_default_cluster_shows_every_kind_of_workload_starting_and_ending() {
    let mut kinds = std::collections::BTreeSet::new();
    let mut pids_seen = std::collections::BTreeSet::new();
    let mut xids = 0;
    let mut power_capped = false;
    let mut idle_allocated = false;
    let mut empty = false;
    for node in ["gpu-a01", "gpu-a02", "gpu-b01", "gpu-b02"] {
        let mut s = sim(node, 8, Scenario::default());
        let ticks = run(&mut s, &[15_000; 4 * 240]);
        for t in &ticks {
            for p in &t.processes {
                let w = &p.workload;
                kinds.insert(match (w.kind, w.pod_name.is_some()) {
                    (WorkloadKind::Container, true) => "pod",
                    (WorkloadKind::Container, false) => "docker",
                    (WorkloadKind::Slurm, _) => "slurm",
                    (WorkloadKind::Host, _) => "host",
                });
                pids_seen.insert((node, p.pid));
            }
            for g in &t.gpus {
                let has = t.processes.iter().any(|p| p.gpu_uuid == g.gpu_uuid);
                power_capped |= g.throttle_reasons.unwrap_or(0) & gpu::reasons::SW_POWER_CAP != 0;
                idle_allocated |=
                    has && g.util_gpu_pct == Some(0) && g.mem_used_bytes > Some(4 << 30);
                empty |= !has && g.pstate == Some(8);
            }
            xids += t.events.iter().filter(|e| e.kind == EventKind::Xid).count();
        }
        check_shares(&ticks).expect("shares fit");
        check_gpm(s.model(), &ticks).expect("GPM fits");
    }
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert!(
        pids_seen.len() > 40,
        "jobs start and end: {} pids",
        pids_seen.len()
    );
    assert!(xids > 0, "an occasional Xid");
    assert!(power_capped, "some training hits the power cap");
    assert!(idle_allocated, "memory held on an idle GPU");
    assert!(empty, "some GPUs are empty");
}

#[test]
fn health_comes_first_then_every_interval_and_after_an_xid() {
    // Xids often enough that a few ticks have one.
    let mut s = sim("gpu-node-h", 2, scenario("xid_per_gpu_hour = 100"));
    let inv = s.inventory().expect("inv");
    assert_eq!(
        inv.gpus[0].temp_slowdown_c,
        Some(s.model().slowdown_c as u32)
    );
    assert!(inv.gpus[0].temp_shutdown_c > inv.gpus[0].temp_slowdown_c);
    let ticks = run(&mut s, &[1000; 120]);
    assert_eq!(ticks[0].health.len(), 2, "first tick: every GPU");
    let h = &ticks[0].health[0];
    assert_eq!(
        h.retired_pages_sbe, None,
        "rows are remapped, pages not retired"
    );
    assert!(h.remapped_rows_pending.is_some() && h.ecc_corrected_aggregate.is_some());
    for (k, t) in ticks.iter().enumerate().skip(1) {
        let after_event = ticks[k - 1].events.iter().any(|e| e.kind == EventKind::Xid);
        let last = (0..k)
            .rev()
            .find(|&j| !ticks[j].health.is_empty())
            .unwrap_or(0);
        let due = after_event || t.time_ms - ticks[last].time_ms >= HEALTH_INTERVAL_MS;
        assert_eq!(!t.health.is_empty(), due, "tick {k}");
    }
    let xids = ticks
        .iter()
        .filter(|t| t.events.iter().any(|e| e.kind == EventKind::Xid));
    assert!(xids.count() > 0, "the run had an Xid");
    let sent = ticks.iter().filter(|t| !t.health.is_empty()).count();
    assert!(sent < 30, "{sent} ticks with health");
}

#[test]
fn gpm_shows_training_on_the_tensor_cores_inference_lighter_and_notebooks_hardly() {
    let mut s = sim(
        "gpm",
        4,
        scenario(
            r#"
model = "h100-sxm"
random_workloads = false
xid_per_gpu_hour = 0
thermal_events_per_gpu_hour = 0
[[jobs]]
kind = "training"
gpus = [0]
duration = "30m"
[[jobs]]
kind = "inference"
gpus = [1]
duration = "30m"
[[jobs]]
kind = "notebook"
gpus = [2]
duration = "30m"
"#,
        ),
    );
    let ticks = run(&mut s, &[1_000; 15 * 60]);
    check_gpm(s.model(), &ticks).expect("GPM fits");
    // After every warm-up (training's is at most 2 min).
    let steady = &ticks[180..];
    let tensor = |g| gpm_mean(steady, g, |m| m.tensor_active_cpct);
    let sm = |g| gpm_mean(steady, g, |m| m.sm_active_cpct);

    // Training between checkpoints: the tensor cores busy, mostly HMMA, no IMMA or DFMA;
    // moderate occupancy, DRAM half used, FP16 ahead of FP32, no FP64.
    let busy: Vec<Tick> = steady
        .iter()
        .filter(|t| t.gpus[0].util_gpu_pct >= Some(85))
        .cloned()
        .collect();
    assert!(busy.len() > steady.len() / 2, "{} busy ticks", busy.len());
    let train_tensor = gpm_mean(&busy, 0, |m| m.tensor_active_cpct);
    assert!(
        (4_000.0..=7_500.0).contains(&train_tensor),
        "training tensor {train_tensor}"
    );
    let hmma = gpm_mean(&busy, 0, |m| m.tensor_hmma_cpct);
    assert!(hmma >= 0.9 * train_tensor, "HMMA {hmma} of {train_tensor}");
    let train_sm = gpm_mean(&busy, 0, |m| m.sm_active_cpct);
    assert!(train_sm >= 6_800.0, "training SM activity {train_sm}");
    let occupancy = gpm_mean(&busy, 0, |m| m.sm_occupancy_cpct);
    assert!(
        (2_500.0..=6_500.0).contains(&occupancy),
        "training occupancy {occupancy}"
    );
    let dram = gpm_mean(&busy, 0, |m| m.dram_bw_cpct);
    assert!((3_500.0..=8_000.0).contains(&dram), "training DRAM {dram}");
    let (fp64, fp32, fp16) = (
        gpm_mean(&busy, 0, |m| m.fp64_cpct),
        gpm_mean(&busy, 0, |m| m.fp32_cpct),
        gpm_mean(&busy, 0, |m| m.fp16_cpct),
    );
    assert!(
        fp16 > fp32 && fp32 > fp64 && fp64 < 100.0,
        "FP16 {fp16}, FP32 {fp32}, FP64 {fp64}"
    );
    for t in &busy {
        let m = &t.gpus[0].gpm;
        assert!(
            m.tensor_imma_cpct <= Some(100) && m.tensor_dfma_cpct <= Some(100),
            "{m:?}"
        );
    }

    // Inference: lighter tensor work, memory-bound.
    let infer_tensor = tensor(1);
    assert!(
        infer_tensor > 150.0 && infer_tensor < tensor(0),
        "inference tensor {infer_tensor}, training {}",
        tensor(0)
    );
    let infer_dram = gpm_mean(steady, 1, |m| m.dram_bw_cpct);
    assert!(
        infer_dram > infer_tensor,
        "inference DRAM {infer_dram} vs tensor {infer_tensor}"
    );

    // A notebook: hardly any tensor work, the SMs idle most of the time.
    let notebook = steady.iter().map(|t| &t.gpus[2].gpm);
    assert!(
        notebook.clone().all(|m| m.tensor_active_cpct <= Some(400)),
        "a notebook's tensor activity stays near 0"
    );
    let idle_ticks = notebook.filter(|m| m.sm_active_cpct == Some(0)).count();
    assert!(idle_ticks > steady.len() / 2, "{idle_ticks} idle ticks");
    assert!(
        tensor(2) < 100.0 && tensor(2) < infer_tensor,
        "notebook tensor {}",
        tensor(2)
    );
    assert!(
        sm(2) < sm(0) / 4.0,
        "notebook SM {}, training {}",
        sm(2),
        sm(0)
    );

    // An empty GPU that has GPM reads a real 0.
    for t in &ticks {
        let m = &t.gpus[3].gpm;
        for a in [
            m.sm_active_cpct,
            m.sm_occupancy_cpct,
            m.tensor_active_cpct,
            m.dram_bw_cpct,
            m.fp32_cpct,
        ] {
            assert_eq!(a, Some(0), "{m:?}");
        }
        assert!(
            m.pcie_rx_bps.is_some() && m.nvlink_tx_bps == Some(0),
            "{m:?}"
        );
    }
}

#[test]
fn products_before_hopper_have_no_gpm_at_all() {
    let older: Vec<_> = catalog::MODELS.iter().filter(|m| !m.gpm).collect();
    assert!(older.iter().any(|m| m.key == "a100-sxm4-40gb"));
    for m in older {
        let toml = format!(
            r#"
model = "{}"
random_workloads = false
xid_per_gpu_hour = 0
[[jobs]]
kind = "training"
gpus = [0, 1]
duration = "10m"
"#,
            m.key
        );
        let mut s = sim("no-gpm", 2, scenario(&toml));
        let ticks = run(&mut s, &[1_000; 300]);
        assert!(
            ticks.iter().any(|t| t.gpus[0].util_gpu_pct > Some(50)),
            "{}: the GPUs work",
            m.key
        );
        for g in ticks.iter().flat_map(|t| &t.gpus) {
            assert_eq!(g.gpm, GpmMetrics::default(), "{}: absent, never 0", m.key);
            assert!(g.mig_gpm.is_empty());
        }
    }
}

#[test]
fn gpm_replays_with_the_seed() {
    let gpm = |seed: u64| -> Vec<Vec<GpmMetrics>> {
        let opts = SimOptions {
            seed: Some(seed),
            scenario: scenario("model = \"h100-sxm\"\n"),
            ..SimOptions::new("gpm-replay", 4)
        };
        let mut s = simulator(opts).expect("valid");
        run(&mut s, &[5_000; 200])
            .into_iter()
            .map(|t| t.gpus.into_iter().map(|g| g.gpm).collect())
            .collect()
    };
    let a = gpm(1);
    assert_eq!(a, gpm(1), "same seed, same readings");
    assert_ne!(a, gpm(2), "another seed, another node");
    assert!(
        a.iter().flatten().any(|m| m.tensor_active_cpct > Some(0)),
        "the node does tensor work"
    );
}
