//! The accountant's passes: earlier rules checked for conservation only, the per-pass
//! budget of open minutes, and its cost (benchmark).

use super::*;

/// Minutes stored before an upgrade (computed by earlier attribution rules) are checked
/// for conservation only: their raw recomputation under today's rules would differ.
#[tokio::test]
async fn minutes_of_earlier_rules_are_checked_for_conservation_only() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let store = gpufleet_collector::store::open(&url).await.expect("open");
    store.set_arrival_clock(None);
    let node = one_gpu_node(&store, "GPU-old").await;
    let ticks = (0..=121)
        .map(|k| shared_tick("GPU-old", T0 + k * 1000, 200_000, Some(k as u64 * 200_000)))
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    Accountant::new(
        store.clone(),
        options(40, IdlePolicy::Spread),
        clock_at(T0 + 60 * MIN),
    )
    .pass()
    .await
    .expect("pass");
    let pool = sqlx::SqlitePool::connect(&url).await.expect("pool");
    let sql = |q: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query(q).execute(&pool).await.expect("update") }
    };
    // As an older collector left them: another idle power, rules 1.
    sql("UPDATE energy_gpu_minutes SET idle_mw = idle_mw + 20000, rules = 1").await;
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(
        (report.earlier_rules, report.violations.len()),
        (3, 0),
        "{report:?}"
    );
    sql(
        "UPDATE energy_workload_minutes SET energy_mj = energy_mj + 1 \
         WHERE minute_ms = (SELECT min(minute_ms) FROM energy_workload_minutes)",
    )
    .await;
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(
        report.violations.len(),
        1,
        "conservation still holds them: {report:?}"
    );
    pool.close().await;
}

/// Rows written before the waste columns (rules 2) may hold NULL there; rows of today's
/// rules must hold what the raw samples say.
#[tokio::test]
async fn waste_columns_are_checked_on_rows_of_todays_rules_only() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("waste.db").display());
    let store = gpufleet_collector::store::open(&url).await.expect("open");
    store.set_arrival_clock(None);
    let node = one_gpu_node(&store, "GPU-w").await;
    let ticks = (0..=121)
        .map(|k| shared_tick("GPU-w", T0 + k * 1000, 200_000, Some(k as u64 * 200_000)))
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    Accountant::new(
        store.clone(),
        options(40, IdlePolicy::Spread),
        clock_at(T0 + 60 * MIN),
    )
    .pass()
    .await
    .expect("pass");
    let pool = sqlx::SqlitePool::connect(&url).await.expect("pool");
    let sql = |q: &'static str| {
        let pool = pool.clone();
        async move { sqlx::query(q).execute(&pool).await.expect("update") }
    };
    let violations = async || {
        energy_check::check(store.as_ref(), all_time())
            .await
            .expect("check")
            .violations
            .len()
    };
    assert_eq!(violations().await, 0);
    sql("UPDATE energy_gpu_minutes SET util_max_pct = NULL").await;
    sql("UPDATE energy_workload_minutes SET mem_max_bytes = NULL").await;
    assert_eq!(violations().await, 3, "today's rules: NULL is a difference");
    sql("UPDATE energy_gpu_minutes SET rules = 2").await;
    assert_eq!(
        violations().await,
        0,
        "rows from before the columns: unknown"
    );
    pool.close().await;
}

/// On a fleet larger than a pass's budget of open minutes, a pass recomputes only that
/// many: GPUs whose samples stopped first (so a job that ended shows whole at once), then
/// the longest since computed; the others come in later passes.
#[tokio::test]
async fn a_pass_recomputes_at_most_its_budget_of_open_minutes_quiet_gpus_first() {
    let (_dir, store) = sqlite_store().await;
    let node = node_of(&store, "n1", "NVIDIA H100 80GB HBM3", &["GPU-p", "GPU-q"]).await;
    let (p, q) = (node.gpus[0].id, node.gpus[1].id);
    let mut seq = 0;
    // 1 Hz samples in [from, to) s of the given GPUs, busy, one process each.
    let mut write = async |from: i64, to: i64, uuids: &[&str]| {
        seq += 1;
        let ticks = (from..to)
            .map(|k| Tick {
                time_ms: T0 + k * 1000,
                gpus: uuids
                    .iter()
                    .map(|u| GpuSample {
                        gpu_uuid: (*u).into(),
                        util_gpu_pct: Some(90),
                        power_mw: Some(300_000),
                        energy_mj: Some(k as u64 * 300_000),
                        ..Default::default()
                    })
                    .collect(),
                processes: uuids
                    .iter()
                    .map(|u| process(u, 100, 80, container_workload(A, None)))
                    .collect(),
                ..Default::default()
            })
            .collect();
        write_ticks(&store, &node, seq, ticks).await;
    };
    let now = Arc::new(AtomicI64::new(T0));
    let clock: Clock = {
        let n = Arc::clone(&now);
        Arc::new(move || n.load(Ordering::SeqCst))
    };
    let options = EnergyOptions {
        provisional_per_pass: 1,
        ..Default::default()
    };
    let mut acc = Accountant::new(store.clone(), options, clock);
    // The samples in each GPU's stored open minute (None: none stored).
    let stored = async |gpu| {
        let m = store
            .energy_minutes(Some(gpu), all_time())
            .await
            .expect("minutes");
        assert!(m.iter().all(|(_, m)| m.provisional), "{m:?}");
        m.first().map(|(_, m)| m.samples)
    };
    let mut pass_at = async |s: i64| {
        now.store(T0 + s * 1000, Ordering::SeqCst);
        acc.pass().await.expect("pass");
    };
    write(0, 30, &["GPU-p", "GPU-q"]).await;
    pass_at(30).await;
    assert_eq!(
        (stored(p).await, stored(q).await),
        (Some(30), None),
        "one a pass"
    );
    write(30, 35, &["GPU-p", "GPU-q"]).await;
    pass_at(35).await;
    assert_eq!(
        (stored(p).await, stored(q).await),
        (Some(30), Some(35)),
        "then the other"
    );
    write(35, 38, &["GPU-p", "GPU-q"]).await;
    pass_at(38).await;
    assert_eq!(
        (stored(p).await, stored(q).await),
        (Some(30), Some(35)),
        "neither due"
    );
    // GPU-q stops at 37 s; GPU-p, computed longer ago, keeps sending: q goes first.
    write(38, 40, &["GPU-p"]).await;
    pass_at(40).await;
    assert_eq!(
        (stored(p).await, stored(q).await),
        (Some(30), Some(38)),
        "quiet first"
    );
    pass_at(41).await;
    assert_eq!(
        (stored(p).await, stored(q).await),
        (Some(40), Some(38)),
        "then p"
    );
}

/// What the accountant's open-minute work costs: `GPUS` GPUs (default 400) on nodes of 8,
/// each with 90 s of 1 Hz samples and a process; one pass that closes minute 0 and stores
/// open minutes, then a pass after 10 more seconds of samples (open minutes recomputed, at
/// most `PROVISIONAL_PER_PASS`). A benchmark, not a timed test:
///
/// ```text
/// cargo test --release -p gpufleet-collector --test it energy::passes::open_minute_cost -- --ignored --nocapture
/// ```
#[tokio::test]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
async fn open_minute_cost() {
    let gpus: usize = std::env::var("GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let (_dir, store) = sqlite_store().await;
    let mut nodes = Vec::new();
    for n in 0..gpus.div_ceil(8) {
        let uuids: Vec<String> = (0..8).map(|i| format!("GPU-{n}-{i}")).collect();
        let refs: Vec<&str> = uuids.iter().map(String::as_str).collect();
        nodes.push((
            node_of(&store, &format!("n{n}"), "NVIDIA H100 80GB HBM3", &refs).await,
            uuids,
        ));
    }
    let write = |from: i64, to: i64, seq: u64| {
        let (store, nodes) = (Arc::clone(&store), nodes.clone());
        async move {
            for (node, uuids) in &nodes {
                let ticks = (from..to)
                    .map(|k| {
                        let mut t = shared_tick(
                            &uuids[0],
                            T0 + k * 1000,
                            300_000,
                            Some(k as u64 * 300_000),
                        );
                        t.gpus = uuids
                            .iter()
                            .map(|u| GpuSample {
                                gpu_uuid: u.clone(),
                                util_gpu_pct: Some(90),
                                power_mw: Some(300_000),
                                energy_mj: Some(k as u64 * 300_000),
                                ..Default::default()
                            })
                            .collect();
                        t.processes = uuids
                            .iter()
                            .enumerate()
                            .map(|(i, u)| {
                                process(u, 100 + i as u32, 80, container_workload(A, None))
                            })
                            .collect();
                        t
                    })
                    .collect();
                write_ticks(&store, node, seq, ticks).await;
            }
        }
    };
    write(0, 90, 1).await;
    let now = Arc::new(AtomicI64::new(T0 + 90_000));
    let clock: Clock = {
        let n = Arc::clone(&now);
        Arc::new(move || n.load(Ordering::SeqCst))
    };
    let mut acc = Accountant::new(store.clone(), EnergyOptions::default(), clock);
    let t = std::time::Instant::now();
    acc.pass().await.expect("pass");
    let first = t.elapsed();
    write(90, 100, 2).await;
    now.store(T0 + 100_000, Ordering::SeqCst);
    let t = std::time::Instant::now();
    acc.pass().await.expect("pass");
    let open = t.elapsed();
    // Of which listing the GPUs with their sample spans and watermarks.
    let t = std::time::Instant::now();
    store.energy_gpus().await.expect("gpus");
    let listing = t.elapsed();
    // A pass recomputes at most PROVISIONAL_PER_PASS open minutes.
    let recomputed = gpus.min(gpufleet_collector::accounting::accountant::PROVISIONAL_PER_PASS);
    println!(
        "{gpus} GPUs: first pass (close minute 0 of every GPU, store {recomputed} open \
         minutes) {first:?}; a refresh pass ({recomputed} open minutes recomputed) {open:?} \
         ({:?} per open minute; of which listing the GPUs {listing:?})",
        open / recomputed as u32
    );
}
