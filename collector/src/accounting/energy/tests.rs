use super::*;
use proptest::prelude::*;

fn proc(workload: WorkloadRef, sm: Option<u32>, mem: Option<u64>) -> EnergyProcess {
    EnergyProcess {
        workload,
        sm_util_pct: sm,
        gpu_mem_bytes: mem,
        compute: true,
    }
}

fn sample(
    t: UnixMs,
    power_w: u32,
    energy_mj: Option<u64>,
    procs: Vec<EnergyProcess>,
) -> EnergySample {
    EnergySample {
        time_ms: t,
        power_mw: Some(power_w * 1000),
        energy_mj,
        util_gpu_pct: Some(if procs.is_empty() { 0 } else { 50 }),
        tensor_cpct: None,
        occupancy_cpct: None,
        processes: procs,
    }
}

#[test]
fn counter_delta_is_the_energy() {
    let a = sample(0, 100, Some(1_000), vec![]);
    let b = sample(1000, 300, Some(251_000), vec![]);
    assert_eq!(interval_energy(&a, &b, 3000), (Method::Counter, 250_000));
}

#[test]
fn trapezoid_when_the_counter_is_absent() {
    let a = sample(0, 100, None, vec![]);
    let b = sample(1000, 300, None, vec![]);
    // (100 W + 300 W) / 2 × 1 s = 200 J.
    assert_eq!(interval_energy(&a, &b, 3000), (Method::Trapezoid, 200_000));
}

#[test]
fn counter_reset_mid_run_falls_back_to_trapezoid_for_that_interval_only() {
    let s = [
        sample(0, 200, Some(5_000_000), vec![]),
        sample(1000, 200, Some(5_200_000), vec![]),
        sample(2000, 200, Some(150), vec![]), // driver reload: the counter restarted
        sample(3000, 200, Some(200_150), vec![]),
    ];
    let iv = account(None, &s, 3000, 0, IdlePolicy::Spread);
    let got: Vec<(Method, u64)> = iv.iter().map(|i| (i.method, i.energy_mj)).collect();
    assert_eq!(
        got,
        vec![
            (Method::Counter, 200_000),
            (Method::Trapezoid, 200_000),
            (Method::Counter, 200_000)
        ]
    );
}

#[test]
fn a_gap_is_missing_not_zero_and_not_a_spike() {
    // 1 Hz, then the agent is down for 40 s; the counter kept running meanwhile.
    let s = [
        sample(0, 200, Some(0), vec![]),
        sample(1000, 200, Some(200_000), vec![]),
        sample(41_000, 200, Some(8_200_000), vec![]),
        sample(42_000, 200, Some(8_400_000), vec![]),
    ];
    let m = rollup_minute(0, None, &s, 3000, 0, IdleSource::Min, IdlePolicy::Spread);
    assert_eq!(m.missing_ms, 40_000, "the gap is shown as missing time");
    assert_eq!(m.covered_ms, 2000);
    assert_eq!(
        m.energy_mj, 400_000,
        "no energy invented for the gap, no spike after it"
    );
    assert_eq!(m.conservation_error(), None);
    // The same with the counter unsupported: still no bridging by trapezoid.
    let s: Vec<EnergySample> = s
        .iter()
        .map(|x| EnergySample {
            energy_mj: None,
            ..x.clone()
        })
        .collect();
    let m = rollup_minute(0, None, &s, 3000, 0, IdleSource::Min, IdlePolicy::Spread);
    assert_eq!((m.missing_ms, m.energy_mj), (40_000, 400_000));
}

#[test]
fn no_counter_and_no_power_is_missing() {
    let a = EnergySample {
        time_ms: 0,
        power_mw: None,
        energy_mj: None,
        util_gpu_pct: None,
        tensor_cpct: None,
        occupancy_cpct: None,
        processes: vec![],
    };
    let b = EnergySample {
        time_ms: 1000,
        ..a.clone()
    };
    assert_eq!(interval_energy(&a, &b, 3000), (Method::Missing, 0));
}

#[test]
fn exclusive_container_gets_everything_under_spread_and_all_but_idle_under_separate() {
    let a = sample(0, 300, Some(0), vec![proc(7, Some(90), Some(1 << 30))]);
    let b = sample(
        1000,
        300,
        Some(300_000),
        vec![proc(7, Some(90), Some(1 << 30))],
    );
    // 60 W idle, but the GPU was busy half of the second: 30 J of it is idle.
    let spread = attribute(0, &b, Method::Counter, 300_000, 60_000, IdlePolicy::Spread);
    assert_eq!(spread.parts.len(), 1);
    assert_eq!(spread.parts[0].energy_mj, 300_000);
    assert_eq!(spread.parts[0].idle_mj, 30_000);
    assert_eq!(spread.parts[0].active_mj, 270_000);
    assert_eq!(spread.idle_bucket_mj, 0);
    let separate = attribute(
        0,
        &b,
        Method::Counter,
        300_000,
        60_000,
        IdlePolicy::Separate,
    );
    assert_eq!(separate.parts[0].energy_mj, 270_000);
    assert_eq!(
        separate.parts[0].idle_mj, 30_000,
        "its idle share is reported, not charged"
    );
    assert_eq!(separate.idle_bucket_mj, 30_000);
    let _ = a;
}

#[test]
fn sm_shares_three_to_one() {
    let b = EnergySample {
        util_gpu_pct: Some(0),
        ..sample(
            1000,
            0,
            None,
            vec![proc(1, Some(60), Some(100)), proc(2, Some(20), Some(100))],
        )
    };
    // 260 J with 60 W idle for 1 s: 200 J active, split 150 / 50; idle 30 / 30 (equal
    // memory).
    let iv = attribute(0, &b, Method::Counter, 260_000, 60_000, IdlePolicy::Spread);
    assert_eq!(iv.split, Some(SplitMethod::Sm));
    let e: Vec<(i64, u64, u64, u32)> = iv
        .parts
        .iter()
        .map(|p| (p.workload, p.energy_mj, p.idle_mj, p.share_ppm))
        .collect();
    assert_eq!(
        e,
        vec![(1, 180_000, 30_000, 750_000), (2, 80_000, 30_000, 250_000)]
    );
}

#[test]
fn processes_of_one_workload_are_summed() {
    let b = sample(
        1000,
        0,
        None,
        vec![
            proc(1, Some(30), None),
            proc(2, Some(20), None),
            proc(1, Some(30), None),
        ],
    );
    let iv = attribute(0, &b, Method::Counter, 80_000, 0, IdlePolicy::Spread);
    let e: Vec<(i64, u64)> = iv.parts.iter().map(|p| (p.workload, p.energy_mj)).collect();
    assert_eq!(e, vec![(1, 60_000), (2, 20_000)]);
}

#[test]
fn falls_back_to_memory_then_equal() {
    // One process without an SM reading: SM shares are unusable (absent is not zero).
    let b = sample(
        1000,
        0,
        None,
        vec![proc(1, Some(90), Some(300)), proc(2, None, Some(100))],
    );
    let iv = attribute(0, &b, Method::Counter, 100_000, 0, IdlePolicy::Spread);
    assert_eq!(iv.split, Some(SplitMethod::Memory));
    assert_eq!(iv.parts[0].energy_mj, 75_000);
    // SM all zero and memory unknown: equal.
    let b = sample(
        1000,
        0,
        None,
        vec![
            proc(1, Some(0), None),
            proc(2, Some(0), Some(5)),
            proc(3, Some(0), None),
        ],
    );
    let iv = attribute(0, &b, Method::Counter, 100_000, 0, IdlePolicy::Spread);
    assert_eq!(iv.split, Some(SplitMethod::Equal));
    let e: Vec<u64> = iv.parts.iter().map(|p| p.energy_mj).collect();
    assert_eq!(
        e,
        vec![33_334, 33_333, 33_333],
        "remainder to the lowest id"
    );
}

#[test]
fn no_process_is_idle_but_busy_without_process_is_unattributed() {
    let quiet = sample(1000, 0, None, vec![]);
    let iv = attribute(
        0,
        &quiet,
        Method::Counter,
        100_000,
        30_000,
        IdlePolicy::Spread,
    );
    assert_eq!((iv.idle_bucket_mj, iv.unattributed_mj), (100_000, 0));
    let busy = EnergySample {
        util_gpu_pct: Some(80),
        ..quiet
    };
    let iv = attribute(
        0,
        &busy,
        Method::Counter,
        100_000,
        30_000,
        IdlePolicy::Spread,
    );
    // Busy 80 % of the second: idle is 30 W × 20 % of it.
    assert_eq!((iv.idle_bucket_mj, iv.unattributed_mj), (6_000, 94_000));
}

#[test]
fn idle_never_exceeds_the_energy() {
    let b = sample(1000, 0, None, vec![proc(1, Some(10), None)]);
    let iv = attribute(0, &b, Method::Counter, 10_000, 60_000, IdlePolicy::Separate);
    assert_eq!((iv.idle_bucket_mj, iv.parts[0].energy_mj), (10_000, 0));
}

#[test]
fn split_proportional_is_exact_and_deterministic() {
    assert_eq!(split_proportional(10, &[1, 1, 1]), vec![4, 3, 3]);
    assert_eq!(split_proportional(0, &[5, 0]), vec![0, 0]);
    assert_eq!(split_proportional(7, &[0, 0]), vec![4, 3]);
    assert_eq!(
        split_proportional(u64::MAX, &[u128::from(u64::MAX), 1])
            .iter()
            .sum::<u64>(),
        u64::MAX
    );
}

fn arb_process() -> impl Strategy<Value = EnergyProcess> {
    (
        0i64..6,
        proptest::option::weighted(0.8, 0u32..=100),
        proptest::option::weighted(0.8, 0u64..(1 << 36)),
    )
        .prop_map(|(workload, sm, mem)| EnergyProcess {
            workload,
            sm_util_pct: sm,
            gpu_mem_bytes: mem,
            compute: workload % 2 == 0,
        })
}

/// A random trace: irregular intervals (some beyond the gap limit), power present or not,
/// a counter that is sometimes unsupported and sometimes resets.
fn arb_trace() -> impl Strategy<Value = Vec<EnergySample>> {
    proptest::collection::vec(
        (
            1i64..8_000,
            proptest::option::weighted(0.9, 0u32..1_500_000),
            0u8..10,
            0u64..2_000_000,
            // Often 0 % (idle GPUs, the baseline's evidence), sometimes absent.
            prop_oneof![Just(Some(0u32)), proptest::option::of(0u32..=100)],
            proptest::collection::vec(arb_process(), 0..5),
        ),
        1..120,
    )
    .prop_map(|steps| {
        let mut t = 1_800_000_000_000i64;
        let mut counter = 10_000_000u64;
        steps
            .into_iter()
            .map(|(dt, power, counter_mode, inc, util, processes)| {
                t += dt;
                counter = match counter_mode {
                    0 => inc % 1000, // reset
                    _ => counter + inc,
                };
                EnergySample {
                    time_ms: t,
                    power_mw: power,
                    energy_mj: (counter_mode != 1).then_some(counter),
                    util_gpu_pct: util,
                    tensor_cpct: None,
                    occupancy_cpct: None,
                    processes,
                }
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn energy_is_conserved_for_every_interval_and_minute(
        trace in arb_trace(),
        idle_mw in 0u32..400_000,
        separate in any::<bool>(),
        max_gap_ms in 1_000i64..10_000,
    ) {
        let policy = if separate { IdlePolicy::Separate } else { IdlePolicy::Spread };
        let intervals = account(None, &trace, max_gap_ms, idle_mw, policy);
        prop_assert_eq!(intervals.len(), trace.len() - 1);
        for iv in &intervals {
            prop_assert_eq!(iv.accounted_mj(), iv.energy_mj, "interval {:?}", iv);
            if iv.method == Method::Missing {
                prop_assert_eq!(iv.energy_mj, 0);
            }
            if iv.duration_ms() > max_gap_ms {
                prop_assert_eq!(iv.method, Method::Missing);
            }
            // Idle is conserved too: workloads' idle shares + the bucket = the idle part
            // (spread); the bucket = the idle part, shares reported beside (separate).
            let shares: u64 = iv.parts.iter().map(|p| p.idle_mj).sum();
            let charged = policy == IdlePolicy::Spread;
            for p in &iv.parts {
                prop_assert_eq!(p.energy_mj, p.active_mj + if charged { p.idle_mj } else { 0 });
            }
            if !iv.parts.is_empty() {
                prop_assert_eq!(shares, iv.idle_mj);
            }
            if charged {
                prop_assert_eq!(shares + iv.idle_bucket_mj, iv.idle_mj);
            } else {
                prop_assert_eq!(iv.idle_bucket_mj, iv.idle_mj);
            }
            prop_assert!(iv.idle_mj <= iv.energy_mj);
        }
        // Minute rollups: every minute conserves, and together they hold every interval.
        let mut by_minute: BTreeMap<UnixMs, Vec<EnergySample>> = BTreeMap::new();
        for s in &trace {
            by_minute.entry(minute_of(s.time_ms)).or_default().push(s.clone());
        }
        let mut prev: Option<EnergySample> = None;
        let (mut energy, mut covered, mut missing) = (0u64, 0i64, 0i64);
        for (minute, samples) in &by_minute {
            let m = rollup_minute(*minute, prev.as_ref(), samples, max_gap_ms, idle_mw, IdleSource::Min, policy);
            prop_assert_eq!(m.conservation_error(), None);
            energy += m.energy_mj;
            covered += m.covered_ms;
            missing += m.missing_ms;
            prev = samples.last().cloned();
        }
        prop_assert_eq!(energy, intervals.iter().map(|i| i.energy_mj).sum::<u64>());
        let span = trace[trace.len() - 1].time_ms - trace[0].time_ms;
        prop_assert_eq!(covered + missing, span);
    }
}

/// 300 W at 90 % utilization, two workloads at 45 % and 15 % SM holding the same memory,
/// a 70 W baseline: only the 10 % idle time is idle energy, so the split stays ~3 : 1.
#[test]
fn an_always_busy_gpu_splits_by_sm_not_by_idle() {
    let gib = 1u64 << 30;
    let b = EnergySample {
        util_gpu_pct: Some(90),
        ..sample(
            1000,
            300,
            None,
            vec![
                proc(1, Some(45), Some(20 * gib)),
                proc(2, Some(15), Some(20 * gib)),
            ],
        )
    };
    for policy in [IdlePolicy::Spread, IdlePolicy::Separate] {
        let iv = attribute(0, &b, Method::Counter, 300_000, 70_000, policy);
        assert_eq!(iv.idle_mj, 7_000, "70 W × 10 % of the second");
        let ratio = iv.parts[0].energy_mj as f64 / iv.parts[1].energy_mj as f64;
        assert!((ratio - 3.0).abs() / 3.0 < 0.05, "{policy:?}: {ratio}");
        assert_eq!(iv.parts[0].active_mj, 219_750);
        assert_eq!(iv.parts[1].active_mj, 73_250);
    }
}

/// A display server at 1 % SM with 32 MiB beside two large workloads gets almost nothing,
/// even on an idle-heavy interval: idle goes by memory held.
#[test]
fn a_tiny_process_gets_almost_nothing() {
    let gib = 1u64 << 30;
    let procs = vec![
        proc(1, Some(45), Some(30 * gib)),
        proc(2, Some(15), Some(10 * gib)),
        EnergyProcess {
            compute: false,
            ..proc(3, Some(1), Some(32 << 20))
        },
    ];
    for util in [90, 30, 0] {
        let b = EnergySample {
            util_gpu_pct: Some(util),
            ..sample(1000, 300, None, procs.clone())
        };
        for policy in [IdlePolicy::Spread, IdlePolicy::Separate] {
            let iv = attribute(0, &b, Method::Counter, 300_000, 70_000, policy);
            let tiny = iv.parts[2].energy_mj as f64 / iv.energy_mj as f64;
            assert!(tiny <= 0.02, "util {util} {policy:?}: {tiny}");
            assert_eq!(iv.idle_split, Some(SplitMethod::Memory));
        }
    }
}

#[test]
fn seen_idle_needs_zero_utilization_at_both_ends_and_no_compute_process() {
    let idle = |t, procs| EnergySample {
        util_gpu_pct: Some(0),
        ..sample(t, 60, None, procs)
    };
    let display = EnergyProcess {
        compute: false,
        ..proc(3, Some(0), Some(32 << 20))
    };
    assert!(seen_idle(&idle(0, vec![]), &idle(1000, vec![])));
    assert!(seen_idle(&idle(0, vec![]), &idle(1000, vec![display])));
    assert!(!seen_idle(
        &idle(0, vec![]),
        &idle(1000, vec![proc(1, Some(0), Some(1))])
    ));
    let busy = EnergySample {
        util_gpu_pct: Some(5),
        ..idle(0, vec![])
    };
    assert!(!seen_idle(&busy, &idle(1000, vec![])));
    let unknown = EnergySample {
        util_gpu_pct: None,
        ..idle(1000, vec![])
    };
    assert!(!seen_idle(&idle(0, vec![]), &unknown), "absent is not 0 %");
    // A gap is not evidence.
    let m = rollup_minute(
        0,
        None,
        &[idle(0, vec![]), idle(1000, vec![]), idle(9000, vec![])],
        3000,
        0,
        IdleSource::Fallback,
        IdlePolicy::Spread,
    );
    assert_eq!((m.seen_idle_ms, m.seen_idle_mj), (1000, 60_000));
}

proptest! {
    /// Minute by minute with the baseline the accountant would use (learned from the
    /// minutes before, else the model default): every minute conserves, the baseline only
    /// ever comes from seen-idle intervals, and those had 0 % utilization.
    #[test]
    fn conservation_holds_with_learned_baselines_and_memory_weighted_idle(
        trace in arb_trace(),
        separate in any::<bool>(),
        max_gap_ms in 1_000i64..10_000,
    ) {
        let policy = if separate { IdlePolicy::Separate } else { IdlePolicy::Spread };
        for iv in account(None, &trace, max_gap_ms, 50_000, policy) {
            if iv.seen_idle {
                let end = trace.iter().find(|s| s.time_ms == iv.end_ms).expect("end sample");
                prop_assert_eq!(end.util_gpu_pct, Some(0));
                prop_assert!(end.processes.iter().all(|p| !p.compute));
                prop_assert!(iv.method != Method::Missing);
            }
        }
        let mut by_minute: BTreeMap<UnixMs, Vec<EnergySample>> = BTreeMap::new();
        for s in &trace {
            by_minute.entry(minute_of(s.time_ms)).or_default().push(s.clone());
        }
        let mut evidence = (0u64, 0i64);
        let mut prev: Option<EnergySample> = None;
        for (minute, samples) in &by_minute {
            let (idle_mw, source) =
                baseline::resolve(None, evidence.0, evidence.1, "NVIDIA H100 80GB HBM3", None);
            let m = rollup_minute(*minute, prev.as_ref(), samples, max_gap_ms, idle_mw, source, policy);
            prop_assert_eq!(m.conservation_error(), None);
            prop_assert!(m.seen_idle_mj <= m.energy_mj && m.seen_idle_ms <= m.covered_ms);
            evidence = baseline::carry(evidence, (m.seen_idle_mj, m.seen_idle_ms));
            prop_assert!(evidence.1 <= baseline::LEARN_HORIZON_MS);
            prev = samples.last().cloned();
        }
    }
}

#[test]
fn a_minute_keeps_its_highest_utilization_and_each_workloads_most_memory_held() {
    let at = |t: UnixMs, util: Option<u32>, procs| EnergySample {
        util_gpu_pct: util,
        ..sample(t, 100, None, procs)
    };
    let samples = vec![
        at(
            60_000,
            Some(0),
            vec![proc(1, None, Some(3)), proc(1, None, Some(4))],
        ),
        at(
            70_000,
            Some(2),
            vec![proc(1, None, Some(5)), proc(2, None, None)],
        ),
        at(80_000, Some(1), vec![proc(1, None, Some(1))]),
    ];
    let prev = at(50_000, None, vec![]);
    let m = rollup_minute(
        60_000,
        Some(&prev),
        &samples,
        30_000,
        50_000,
        IdleSource::Watts,
        IdlePolicy::Spread,
    );
    // The start sample's utilization is not an interval's: only ends count.
    assert_eq!(m.util_max_pct, Some(2));
    // Workload 1: 3 + 4 = 7 bytes together at 60 s beats 5 and 1; workload 2 never said.
    let mem: Vec<(WorkloadRef, Option<u64>)> = m
        .workloads
        .iter()
        .map(|w| (w.workload, w.mem_max_bytes))
        .collect();
    assert_eq!(mem, [(1, Some(7)), (2, None)]);
    // One interval without utilization: the minute's idleness is unknown.
    let mut s2 = samples.clone();
    s2[1].util_gpu_pct = None;
    let m = rollup_minute(
        60_000,
        Some(&prev),
        &s2,
        30_000,
        50_000,
        IdleSource::Watts,
        IdlePolicy::Spread,
    );
    assert_eq!(m.util_max_pct, None);
    // No measured interval (the first sample only): unknown, not 0.
    let m = rollup_minute(
        60_000,
        None,
        &samples[..1],
        30_000,
        50_000,
        IdleSource::Watts,
        IdlePolicy::Spread,
    );
    assert_eq!(m.util_max_pct, None);
}

/// The agent reads the counter every 5 s and the ticks between carry none: each run of
/// intervals from one reading to the next adds up to the counter's delta exactly, split
/// by the trapezoid energy of each interval.
#[test]
fn a_counter_read_every_few_ticks_is_spread_over_the_run_by_power() {
    let e = |t: UnixMs, w: u32, mj: Option<u64>| sample(t, w, mj, vec![]);
    let s = [
        e(0, 100, Some(1_000_000)),
        e(1000, 100, None),
        e(2000, 300, None),
        e(3000, 300, None),
        e(4000, 100, Some(2_000_000)),
        // A trailing run: its closing reading has not come (an open minute).
        e(5000, 100, None),
    ];
    let got: Vec<(Method, u64)> = account(None, &s, 3000, 0, IdlePolicy::Spread)
        .iter()
        .map(|i| (i.method, i.energy_mj))
        .collect();
    // Trapezoids 100, 200, 300, 200 J (800 J); the counter says 1,000 J: × 1.25.
    assert_eq!(
        got,
        [
            (Method::Counter, 125_000),
            (Method::Counter, 250_000),
            (Method::Counter, 375_000),
            (Method::Counter, 250_000),
            (Method::Trapezoid, 100_000),
        ]
    );
}

/// A gap inside a run (the agent was down), or a counter that went back, leaves the run
/// to each interval's own method: no energy is spread over a gap.
#[test]
fn a_run_with_a_gap_or_a_reset_is_not_spread() {
    let e = |t: UnixMs, mj: Option<u64>| sample(t, 200, mj, vec![]);
    let gap = [
        e(0, Some(0)),
        e(1000, None),
        e(9000, None),
        e(10_000, Some(5_000_000)),
    ];
    let got: Vec<Method> = account(None, &gap, 3000, 0, IdlePolicy::Spread)
        .iter()
        .map(|i| i.method)
        .collect();
    assert_eq!(got, [Method::Trapezoid, Method::Missing, Method::Trapezoid]);
    let reset = [e(0, Some(9_000_000)), e(1000, None), e(2000, Some(100))];
    let got: Vec<(Method, u64)> = account(None, &reset, 3000, 0, IdlePolicy::Spread)
        .iter()
        .map(|i| (i.method, i.energy_mj))
        .collect();
    assert_eq!(
        got,
        [(Method::Trapezoid, 200_000), (Method::Trapezoid, 200_000)]
    );
}

proptest! {
    /// Minutes whose last sample carries the counter (what the agent's aligned reads
    /// give) total the counter's delta exactly, however many ticks between readings
    /// carry none and whatever the power between.
    #[test]
    fn sparse_counter_readings_keep_every_minute_exact(
        every in 1usize..=12,
        powers in proptest::collection::vec(50u32..=700, 120),
        step_mj in proptest::collection::vec(0u64..=700_000, 120),
    ) {
        // 120 one-second ticks over two minutes; the counter advances by `step_mj`.
        let mut counter = 7_000_000u64;
        let mut trace = Vec::new();
        let mut truth = Vec::new();
        for k in 0..120usize {
            counter += step_mj[k];
            truth.push(counter);
            let t = 60_000 + k as i64 * 1000 + 500;
            let last_of_minute = k % 60 == 59;
            let read = k == 0 || last_of_minute || k % every == every - 1;
            trace.push(sample(t, powers[k], read.then_some(counter), vec![]));
        }
        let intervals = account(None, &trace, 3000, 0, IdlePolicy::Spread);
        for minute in [60_000, 120_000] {
            let total: u64 = intervals
                .iter()
                .zip(&trace[1..])
                .filter(|(_, s)| minute_of(s.time_ms) == minute)
                .map(|(iv, _)| iv.energy_mj)
                .sum();
            let k_end = ((minute - 60_000) / 1000 + 59) as usize;
            let start = if minute == 60_000 { truth[0] } else { truth[59] };
            prop_assert_eq!(total, truth[k_end] - start, "minute {}", minute);
        }
    }
}

/// A sample with GPM: tensor activity and SM occupancy, hundredths of a percent.
fn with_gpm(mut s: EnergySample, tensor: Option<u32>, occupancy: Option<u32>) -> EnergySample {
    s.tensor_cpct = tensor;
    s.occupancy_cpct = occupancy;
    s
}

/// The per-workload GPM estimate on a known trace, checked by hand.
///
/// Samples at 0, 1, 2, 3, 4 s (intervals end at 1 … 4 s):
/// - (0, 1] and (1, 2]: workloads 1 and 2 share the GPU, SM 60 % : 20 % (shares ¾ : ¼);
///   the GPU's tensor activity is 60.00 % (6000) then 40.00 % (4000), occupancy 50 %.
/// - (2, 3]: workload 2 alone, tensor 10.00 % (1000); occupancy not reported.
/// - (3, 4]: workload 2 alone, the GPU reports no GPM at all (absent, not zero).
///
/// Workload 1: tensor ms 2000, Σ = ¾·6000·1000 + ¾·4000·1000 = 7 500 000 → 37.50 %.
///   Occupancy ms 2000, Σ = ¾·5000·1000 · 2 = 7 500 000 → 37.50 %.
/// Workload 2: tensor ms 3000 (the interval without GPM is not counted),
///   Σ = ¼·6000·1000 + ¼·4000·1000 + 1·1000·1000 = 1 500 000 + 1 000 000 + 1 000 000
///   = 3 500 000 → 11.67 %. Occupancy ms 2000, Σ = ¼·5000·1000 · 2 = 2 500 000 → 12.50 %.
/// Per interval the parts add up to the GPU's figure (¾ + ¼ of 60 % is 60 %).
#[test]
fn gpm_is_split_per_workload_by_the_energy_share() {
    let both = || {
        vec![
            proc(1, Some(60), Some(1 << 30)),
            proc(2, Some(20), Some(1 << 30)),
        ]
    };
    let alone = || vec![proc(2, Some(30), Some(1 << 30))];
    let s = [
        with_gpm(sample(0, 300, None, both()), Some(9_000), Some(5_000)),
        with_gpm(sample(1000, 300, None, both()), Some(6_000), Some(5_000)),
        with_gpm(sample(2000, 300, None, both()), Some(4_000), Some(5_000)),
        with_gpm(sample(3000, 200, None, alone()), Some(1_000), None),
        with_gpm(sample(4000, 200, None, alone()), None, None),
    ];
    let m = rollup_minute(0, None, &s, 3000, 0, IdleSource::Min, IdlePolicy::Spread);
    let w = |id: WorkloadRef| {
        m.workloads
            .iter()
            .find(|w| w.workload == id)
            .expect("workload minute")
    };
    let (w1, w2) = (w(1), w(2));
    assert_eq!(
        (
            w1.tensor_ms,
            w1.tensor_cpct_ms,
            w1.occupancy_ms,
            w1.occupancy_cpct_ms
        ),
        (2000, 7_500_000, 2000, 7_500_000)
    );
    assert_eq!(
        (
            w2.tensor_ms,
            w2.tensor_cpct_ms,
            w2.occupancy_ms,
            w2.occupancy_cpct_ms
        ),
        (3000, 3_500_000, 2000, 2_500_000)
    );
    let pct = |sum: u64, ms: i64| sum as f64 / ms as f64 / 100.0;
    assert_eq!(pct(w1.tensor_cpct_ms, w1.tensor_ms), 37.5);
    assert!((pct(w2.tensor_cpct_ms, w2.tensor_ms) - 11.666).abs() < 0.001);
    // Without GPM nothing is counted: absent, not zero.
    let plain: Vec<EnergySample> = s.iter().map(|x| with_gpm(x.clone(), None, None)).collect();
    let m = rollup_minute(
        0,
        None,
        &plain,
        3000,
        0,
        IdleSource::Min,
        IdlePolicy::Spread,
    );
    assert!(
        m.workloads
            .iter()
            .all(|w| w.tensor_ms == 0 && w.tensor_cpct_ms == 0)
    );
}
