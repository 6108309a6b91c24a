//! Hand-computed traces: counter vs trapezoid, late data behind the watermark, the
//! start-up recheck, an exclusive container under `separate`.

use super::*;

#[tokio::test]
async fn two_containers_sm_three_to_one_get_the_hand_computed_joules_by_counter() {
    let (_dir, store) = sqlite_store().await;
    two_containers_sm_three_to_one_get_the_hand_computed_joules_by_counter_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_two_containers_get_the_hand_computed_joules() {
    let (_schema, store) = pg_store().await;
    two_containers_sm_three_to_one_get_the_hand_computed_joules_by_counter_on(store).await;
}

async fn two_containers_sm_three_to_one_get_the_hand_computed_joules_by_counter_on(
    store: Arc<dyn Store>,
) {
    let node = one_gpu_node(&store, "GPU-e").await;
    // A known power trace at 1 Hz for 3 minutes and 1 s; the counter is its exact integral.
    let power = |k: i64| 150_000 + ((k * 37_123) % 200_000) as u32;
    let mut counter = 7_000_000u64;
    let mut ticks = Vec::new();
    for k in 0..=181 {
        if k > 0 {
            counter += (u64::from(power(k - 1)) + u64::from(power(k))) / 2;
        }
        ticks.push(shared_tick("GPU-e", T0 + k * 1000, power(k), Some(counter)));
    }
    write_ticks(&store, &node, 1, ticks).await;
    let mut acc = Accountant::new(store.clone(), options(60, IdlePolicy::Spread), clock_at(T0));
    acc.pass().await.expect("pass");

    // By hand: minutes 0..3 are closed (the newest sample is in minute 3) and minute 3 is
    // open (provisional), i.e. the intervals ending at 1 s ..= 181 s. Idle 60 W over the
    // 20 % of the time the GPU was not busy (80 % utilization), split by memory (equal);
    // active 3 : 1.
    let mut e_total = 0.0f64;
    for k in 1..=181 {
        e_total += (f64::from(power(k - 1)) + f64::from(power(k))) / 2.0 / 1000.0; // J
    }
    let idle = 60.0 * 181.0 * 0.2;
    let want_a = 0.75 * (e_total - idle) + idle / 2.0;
    let want_b = 0.25 * (e_total - idle) + idle / 2.0;
    let got_a = stored_mj(&store, &format!("container:{A}")).await as f64 / 1000.0;
    let got_b = stored_mj(&store, &format!("container:{B}")).await as f64 / 1000.0;
    assert!(
        (got_a - want_a).abs() / want_a < 0.001,
        "A: {got_a} J vs {want_a} J"
    );
    assert!(
        (got_b - want_b).abs() / want_b < 0.001,
        "B: {got_b} J vs {want_b} J"
    );
    let gpus = store.gpu_energy(all_time()).await.expect("gpu energy");
    assert_eq!(gpus.len(), 1);
    assert_eq!(gpus[0].trapezoid_mj, 0, "every interval by counter");
    assert_eq!(gpus[0].energy_mj, gpus[0].counter_mj);
    assert_eq!(
        gpus[0].attributed_mj + gpus[0].idle_mj + gpus[0].unattributed_mj,
        gpus[0].energy_mj
    );
    assert_eq!(gpus[0].covered_ms, 181_000);
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.minutes, 4, "3 closed, 1 provisional");
}

#[tokio::test]
async fn without_a_counter_the_trapezoid_matches_the_exact_integral_at_1hz() {
    let (_dir, store) = sqlite_store().await;
    let node = one_gpu_node(&store, "GPU-t").await;
    // P(t) = 250 W + 100 W · sin(2π t / 37 s), sampled at 1 Hz, no energy counter.
    let p = |t_s: f64| 250.0 + 100.0 * (2.0 * std::f64::consts::PI * t_s / 37.0).sin();
    let ticks: Vec<Tick> = (0..=181)
        .map(|k| {
            let mw = (p(k as f64) * 1000.0).round() as u32;
            shared_tick("GPU-t", T0 + k * 1000, mw, None)
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    let mut acc = Accountant::new(
        store.clone(),
        options(50, IdlePolicy::Separate),
        clock_at(T0),
    );
    acc.pass().await.expect("pass");
    // ∫₀^181 P dt, exactly.
    let w = 2.0 * std::f64::consts::PI / 37.0;
    let exact_j = 250.0 * 181.0 + 100.0 / w * (1.0 - (w * 181.0).cos());
    let gpus = store.gpu_energy(all_time()).await.expect("gpu energy");
    let got_j = gpus[0].energy_mj as f64 / 1000.0;
    assert!(
        (got_j - exact_j).abs() / exact_j < 0.005,
        "trapezoid {got_j} J vs exact {exact_j} J"
    );
    assert_eq!(gpus[0].counter_mj, 0);
    assert_eq!(gpus[0].trapezoid_mj, gpus[0].energy_mj);
    // Separate: the idle bucket holds 50 W × the 20 % of 181 s the GPU was not busy; the
    // containers the rest.
    assert_eq!(gpus[0].idle_mj, 50 * 181_000 / 5);
    let a = stored_mj(&store, &format!("container:{A}")).await;
    let b = stored_mj(&store, &format!("container:{B}")).await;
    assert_eq!(a + b + gpus[0].idle_mj, gpus[0].energy_mj);
}

#[tokio::test]
async fn late_data_behind_the_watermark_is_recomputed_and_a_gap_shows_as_missing() {
    let (_dir, store) = sqlite_store().await;
    late_data_behind_the_watermark_is_recomputed_and_a_gap_shows_as_missing_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_late_data_behind_the_watermark_is_recomputed() {
    let (_schema, store) = pg_store().await;
    late_data_behind_the_watermark_is_recomputed_and_a_gap_shows_as_missing_on(store).await;
}

async fn late_data_behind_the_watermark_is_recomputed_and_a_gap_shows_as_missing_on(
    store: Arc<dyn Store>,
) {
    let node = one_gpu_node(&store, "GPU-l").await;
    let live = Live::new();
    live.connected(node.clone());
    let tick = |k: i64| {
        shared_tick(
            "GPU-l",
            T0 + k * 1000,
            200_000,
            Some(1_000_000 + k as u64 * 200_000),
        )
    };
    // Minute 1 has a hole from 70 s to 100 s (the agent's spool still holds it).
    let early: Vec<Tick> = (0..=150)
        .filter(|k| !(71..100).contains(k))
        .map(tick)
        .collect();
    write_ticks(&store, &node, 1, early).await;
    let mut acc = Accountant::new(store.clone(), options(0, IdlePolicy::Spread), clock_at(T0));
    acc.pass().await.expect("pass");
    let gpu = store.gpu_energy(all_time()).await.expect("energy")[0].clone();
    assert_eq!(gpu.missing_ms, 30_000, "the hole is missing time");
    assert_eq!(
        gpu.energy_mj,
        120 * 200_000,
        "no energy bridged over the hole"
    );

    // The spool replays the hole (and re-sends some ticks already stored).
    let late: Vec<Tick> = (65..100).map(tick).collect();
    let batch = Batch {
        seq: 2,
        ticks: late,
        delivery: DeliveryStats::default(),
    };
    store
        .write_batches(&[node_batch(&node, batch.clone())])
        .await
        .expect("late write");
    acc.note_commit(
        &live,
        &Committed {
            node: "n1".into(),
            batch,
        },
    );
    acc.pass().await.expect("pass");
    let gpu = store.gpu_energy(all_time()).await.expect("energy")[0].clone();
    assert_eq!(gpu.missing_ms, 0);
    assert_eq!(
        gpu.energy_mj,
        150 * 200_000,
        "0 s..150 s at 200 W, counted once"
    );
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
}

#[tokio::test]
async fn late_data_found_without_announcements_by_the_start_up_recheck() {
    let (_dir, store) = sqlite_store().await;
    let node = one_gpu_node(&store, "GPU-r").await;
    let tick = |k: i64| shared_tick("GPU-r", T0 + k * 1000, 100_000, Some(k as u64 * 100_000));
    write_ticks(
        &store,
        &node,
        1,
        (0..=130).filter(|k| *k != 30).map(tick).collect(),
    )
    .await;
    let clock = clock_at(T0 + 10 * MIN);
    let mut acc = Accountant::new(store.clone(), options(0, IdlePolicy::Spread), clock.clone());
    acc.pass().await.expect("pass");
    write_ticks(&store, &node, 2, vec![tick(30)]).await;
    let stale = store.stale_energy_minutes(0).await.expect("stale");
    assert_eq!(
        stale.len(),
        1,
        "minute 0 now has one more sample than accounted"
    );
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(report.violations.len(), 1, "{report:?}");
    // A restarted collector rechecks at start-up.
    let mut restarted = Accountant::new(store.clone(), options(0, IdlePolicy::Spread), clock);
    restarted.pass().await.expect("pass");
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
}

#[tokio::test]
async fn an_exclusive_container_gets_the_whole_energy_minus_idle_under_separate() {
    for (policy, want_idle_bucket) in [(IdlePolicy::Spread, false), (IdlePolicy::Separate, true)] {
        let (_dir, store) = sqlite_store().await;
        let node = one_gpu_node(&store, "GPU-x").await;
        let ticks = (0..=61)
            .map(|k| Tick {
                time_ms: T0 + k * 1000,
                gpus: vec![GpuSample {
                    gpu_uuid: "GPU-x".into(),
                    power_mw: Some(300_000),
                    energy_mj: Some(k as u64 * 300_000),
                    util_gpu_pct: Some(99),
                    ..Default::default()
                }],
                processes: vec![process("GPU-x", 1, 99, container_workload(A, None))],
                ..Default::default()
            })
            .collect();
        write_ticks(&store, &node, 1, ticks).await;
        Accountant::new(store.clone(), options(40, policy), clock_at(T0))
            .pass()
            .await
            .expect("pass");
        let gpu = store.gpu_energy(all_time()).await.expect("energy")[0].clone();
        let a = stored_mj(&store, &format!("container:{A}")).await;
        assert_eq!(gpu.energy_mj, 61 * 300_000);
        if want_idle_bucket {
            // 40 W over the 1 % of the time the GPU was not busy.
            assert_eq!(gpu.idle_mj, 61 * 400);
            assert_eq!(a, gpu.energy_mj - 61 * 400);
        } else {
            assert_eq!((a, gpu.idle_mj), (gpu.energy_mj, 0));
        }
    }
}
