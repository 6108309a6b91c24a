//! How a GPU's energy is split: always-busy GPUs by SM, the learned idle baseline, a short
//! job on a node that stops mid-minute.

use super::*;

#[tokio::test]
async fn always_busy_gpus_split_by_sm_and_a_display_server_gets_almost_nothing() {
    let (_dir, store) = sqlite_store().await;
    always_busy_gpus_split_by_sm_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_always_busy_gpus_split_by_sm_and_a_display_server_gets_almost_nothing() {
    let (_schema, store) = pg_store().await;
    always_busy_gpus_split_by_sm_on(store).await;
}

/// Two H100s that never idle: 300 W at 90 % utilization. On the first, workloads at 45 %
/// and 15 % SM; on the second the same plus a display server (graphics, 1 % SM, 32 MiB).
/// The default options: no baseline configured, none learnable (never idle).
async fn always_busy_gpus_split_by_sm_on(store: Arc<dyn Store>) {
    let node = node_of(&store, "n1", "NVIDIA H100 80GB HBM3", &["GPU-b0", "GPU-b1"]).await;
    let ticks = (0..=181)
        .map(|k| {
            let gpu = |uuid: &str| GpuSample {
                gpu_uuid: uuid.into(),
                util_gpu_pct: Some(90),
                power_mw: Some(300_000),
                energy_mj: Some(k as u64 * 300_000),
                ..Default::default()
            };
            let compute = ProcessType::Compute;
            Tick {
                time_ms: T0 + k * 1000,
                gpus: vec![gpu("GPU-b0"), gpu("GPU-b1")],
                processes: vec![
                    proc_with(
                        "GPU-b0",
                        10,
                        45,
                        20 * GIB,
                        compute,
                        container_workload(A, None),
                    ),
                    proc_with(
                        "GPU-b0",
                        11,
                        15,
                        20 * GIB,
                        compute,
                        container_workload(B, None),
                    ),
                    proc_with(
                        "GPU-b1",
                        20,
                        45,
                        20 * GIB,
                        compute,
                        container_workload(C, None),
                    ),
                    proc_with(
                        "GPU-b1",
                        21,
                        15,
                        20 * GIB,
                        compute,
                        container_workload(D, None),
                    ),
                    proc_with(
                        "GPU-b1",
                        22,
                        1,
                        32 << 20,
                        ProcessType::Graphics,
                        container_workload(X, Some("xorg")),
                    ),
                ],
                ..Default::default()
            }
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    let key = |id: &str| format!("container:{id}");
    for policy in [IdlePolicy::Spread, IdlePolicy::Separate] {
        let options = EnergyOptions {
            idle_policy: policy,
            ..Default::default()
        };
        // Long after: every minute closed.
        let mut acc = Accountant::new(store.clone(), options.clone(), clock_at(T0 + 60 * MIN));
        acc.pass().await.expect("pass");
        gpufleet_collector::accounting::accountant::recompute(store.as_ref(), all_time(), &options)
            .await
            .expect("recompute with the policy");
        let gpus = store.gpu_energy(all_time()).await.expect("gpu energy");
        assert_eq!(gpus.len(), 2);
        for (g, big, small) in [("GPU-b0", A, B), ("GPU-b1", C, D)] {
            let gpu = gpus.iter().find(|x| x.uuid == g).expect("gpu");
            assert_eq!(gpu.energy_mj, 181 * 300_000);
            let (a, b) = (
                mj_on(&store, &key(big), g).await,
                mj_on(&store, &key(small), g).await,
            );
            let ratio = a as f64 / b as f64;
            assert!(
                (ratio - 3.0).abs() / 3.0 < 0.05,
                "{policy:?} {g}: 45 % vs 15 % SM got {ratio:.3} : 1"
            );
            // Idle is the baseline over the 10 % of the time the GPU was not busy: small
            // but not zero.
            let idle = gpu.energy_mj - gpu.active_mj;
            assert!(
                idle > 0 && idle * 20 < gpu.energy_mj,
                "{policy:?} {g}: idle {idle}"
            );
        }
        let xorg = mj_on(&store, &key(X), "GPU-b1").await as f64 / f64::from(181 * 300_000);
        assert!(
            xorg <= 0.02,
            "{policy:?}: the display server got {:.2} %",
            xorg * 100.0
        );
        let report = energy_check::check(store.as_ref(), all_time())
            .await
            .expect("check");
        assert_eq!(report.violations, vec![], "{policy:?}");
    }
    // The baseline in force: the H100's datasheet default (never seen idle).
    let (status, v) = get_json(
        &store,
        &format!("/api/v1/energy?from={T0}&to={}", T0 + 10 * MIN),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let baseline = &v["gpus"][0]["baseline"];
    assert_eq!(baseline["source"], "model", "{v}");
    assert_eq!(baseline["idle_w"], 49.0, "7 % of 700 W");
    assert_eq!(baseline["model_max_power_w"], 700);
    assert_eq!(baseline["seen_idle_seconds"], 0.0);
}

#[tokio::test]
async fn an_idle_then_busy_gpu_learns_its_baseline_from_the_idle_part_only() {
    let (_dir, store) = sqlite_store().await;
    idle_then_busy_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_an_idle_then_busy_gpu_learns_its_baseline_from_the_idle_part_only() {
    let (_schema, store) = pg_store().await;
    idle_then_busy_on(store).await;
}

/// An L40S idle at 38 W for two minutes (0 %, no process), then busy at 330 W (95 %) with
/// two workloads for three minutes.
async fn idle_then_busy_on(store: Arc<dyn Store>) {
    let node = node_of(&store, "n1", "NVIDIA L40S", &["GPU-i"]).await;
    let mut counter = 0u64;
    let ticks: Vec<Tick> = (0..=300)
        .map(|k| {
            let busy = k > 120;
            let power = if busy { 330_000 } else { 38_000 };
            if k > 0 {
                counter += u64::from(power);
            }
            let compute = ProcessType::Compute;
            Tick {
                time_ms: T0 + k * 1000,
                gpus: vec![GpuSample {
                    gpu_uuid: "GPU-i".into(),
                    util_gpu_pct: Some(if busy { 95 } else { 0 }),
                    power_mw: Some(power),
                    energy_mj: Some(counter),
                    ..Default::default()
                }],
                processes: if busy {
                    vec![
                        proc_with(
                            "GPU-i",
                            1,
                            60,
                            30 * GIB,
                            compute,
                            container_workload(A, None),
                        ),
                        proc_with(
                            "GPU-i",
                            2,
                            20,
                            10 * GIB,
                            compute,
                            container_workload(B, None),
                        ),
                    ]
                } else {
                    vec![]
                },
                ..Default::default()
            }
        })
        .collect();
    // In two passes, as an agent delivers it: the busy minutes' baseline then comes from
    // the evidence stored with the idle ones.
    let (first, rest) = ticks.split_at(131);
    write_ticks(&store, &node, 1, first.to_vec()).await;
    Accountant::new(
        store.clone(),
        EnergyOptions::default(),
        clock_at(T0 + 131_000),
    )
    .pass()
    .await
    .expect("pass");
    write_ticks(&store, &node, 2, rest.to_vec()).await;
    Accountant::new(
        store.clone(),
        EnergyOptions::default(),
        clock_at(T0 + 60 * MIN),
    )
    .pass()
    .await
    .expect("pass");
    let minutes = store
        .energy_minutes(None, all_time())
        .await
        .expect("minutes");
    let by_minute: Vec<(i64, u32, &str)> = minutes
        .iter()
        .map(|(_, m)| ((m.minute_ms - T0) / MIN, m.idle_mw, m.idle_source.as_str()))
        .collect();
    assert_eq!(
        by_minute,
        vec![
            (0, 24_500, "model"),
            (1, 38_000, "learned"),
            (2, 38_000, "learned"),
            (3, 38_000, "learned"),
            (4, 38_000, "learned"),
            (5, 38_000, "learned"),
        ],
        "minute 0 has seen nothing yet (7 % of 350 W); from minute 1 on the idle part's 38 W, \
         never the busy part's power"
    );
    let (status, v) = get_json(
        &store,
        &format!("/api/v1/energy?from={T0}&to={}", T0 + 10 * MIN),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let baseline = &v["gpus"][0]["baseline"];
    assert_eq!(baseline["source"], "learned", "{v}");
    assert_eq!(baseline["idle_w"], 38.0);
    assert_eq!(
        baseline["seen_idle_seconds"], 120.0,
        "the intervals ending at 1 s ..= 120 s"
    );
    assert_eq!(baseline["seen_idle_avg_w"], 38.0);
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
}

#[tokio::test]
async fn a_20_s_job_on_a_node_that_stops_mid_minute_is_fully_accounted_within_one_pass() {
    let (_dir, store) = sqlite_store().await;
    short_job_then_silence_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_a_20_s_job_on_a_node_that_stops_mid_minute_is_fully_accounted() {
    let (_schema, store) = pg_store().await;
    short_job_then_silence_on(store).await;
}

/// A node samples at 1 Hz from 0 s to 95 s; a job (one container) runs from 70 s to 90 s
/// at 250 W; otherwise the GPU idles at 40 W. Then the agent stops (mid-minute 1). The
/// accountant runs every 5 s: one pass 5 s after the last sample must show everything.
async fn short_job_then_silence_on(store: Arc<dyn Store>) {
    assert!(EnergyOptions::default().period <= std::time::Duration::from_secs(5));
    let node = node_of(&store, "n1", "NVIDIA A10", &["GPU-j"]).await;
    let mut counter = 5_000_000u64;
    let job = |k: i64| (71..=90).contains(&k);
    let ticks: Vec<Tick> = (0..=95)
        .map(|k| {
            let power = if job(k) { 250_000 } else { 40_000 };
            if k > 0 {
                counter += u64::from(power);
            }
            Tick {
                time_ms: T0 + k * 1000,
                gpus: vec![GpuSample {
                    gpu_uuid: "GPU-j".into(),
                    util_gpu_pct: Some(if job(k) { 100 } else { 0 }),
                    power_mw: Some(power),
                    energy_mj: Some(counter),
                    ..Default::default()
                }],
                processes: if job(k) {
                    vec![process("GPU-j", 7, 97, container_workload(A, Some("job")))]
                } else {
                    vec![]
                },
                ..Default::default()
            }
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    let last = T0 + 95_000;
    let options = options(40, IdlePolicy::Spread);
    let mut acc = Accountant::new(store.clone(), options.clone(), clock_at(last + 5_000));
    acc.pass().await.expect("pass");

    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    let live = Arc::new(Live::new());
    let at = |now: UnixMs, uri: String| {
        let (store, live) = (Arc::clone(&store), Arc::clone(&live));
        async move {
            let (status, _, body) = api_get_live(&store, live, now, &uri).await;
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(status, 200, "{v}");
            v
        }
    };
    // All of the node's energy, up to its last sample: 95 intervals.
    let all_j = (75.0 * 40.0) + (20.0 * 250.0);
    let v = at(last + 5_000, format!("/api/v1/energy?{range}")).await;
    assert_eq!(v["total"]["energy_j"], all_j, "{v}");
    assert_eq!(v["total"]["missing_seconds"], 0.0);
    assert_eq!(
        v["total"]["provisional_j"],
        16.0 * 40.0 + 20.0 * 250.0,
        "minute 1 (intervals ending at 60 s ..= 95 s) is open"
    );
    // The job: its 20 s at 250 W, busy all along (no idle time), visible now.
    let v = at(last + 5_000, format!("/api/v1/containers?{range}")).await;
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(rows[0]["key"], format!("container:{A}"));
    assert_eq!(rows[0]["energy_j"], 5_000.0);
    assert_eq!(rows[0]["gpu_seconds"], 20.0);
    assert_eq!(rows[0]["provisional_j"], 5_000.0);
    let report = gpufleet_collector::accounting::report::build(
        store.as_ref(),
        &gpufleet_collector::accounting::report::ReportSubject::Container(format!("container:{A}")),
        TimeRange {
            from_ms: T0,
            to_ms: last + 5_000,
        },
    )
    .await
    .expect("report");
    assert_eq!(report.energy.energy_j, Some(5_000.0), "{:?}", report.energy);

    // A grace period after minute 1 ends, it is closed without a later sample: final,
    // with the same figures, and the watermark moved past it.
    let closed = T0 + 2 * MIN + options.grace_ms(1000);
    let mut acc = Accountant::new(store.clone(), options, clock_at(closed));
    acc.pass().await.expect("pass");
    let v = at(closed, format!("/api/v1/energy?{range}")).await;
    assert_eq!(v["total"]["energy_j"], all_j);
    assert_eq!(v["total"]["provisional_j"], 0.0, "{v}");
    let gpu = store.energy_gpus().await.expect("gpus")[0].clone();
    assert_eq!(gpu.done_to_ms, Some(T0 + 2 * MIN));
    let check = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(check.violations, vec![]);
}
