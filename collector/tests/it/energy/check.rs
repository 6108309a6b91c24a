//! `check-energy` on a demo database, and a planted violation it must catch.

use super::*;

/// A simulated node (the demo's simulator and workloads) for five minutes, accounted.
async fn demo_database(dir: &tempfile::TempDir) -> (String, Arc<dyn Store>) {
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let store = gpufleet_collector::store::open(&url).await.expect("open");
    store.set_arrival_clock(None);
    for n in 0..2 {
        let name = format!("gpu-node-{n:02}");
        let mut sim = simulator(SimOptions::new(name.clone(), 4)).expect("sim");
        let inv = sim.inventory().expect("inventory");
        let node = store
            .register_node(&hello(&name), &inv, T0)
            .await
            .expect("register");
        let mut ticks = Vec::new();
        for k in 0..300 {
            ticks.push(sim.sample(T0 + k * 1000).expect("tick"));
        }
        for (i, chunk) in ticks.chunks(30).enumerate() {
            write_ticks(&store, &node, i as u64 + 1, chunk.to_vec()).await;
        }
    }
    Accountant::new(store.clone(), EnergyOptions::default(), clock_at(T0))
        .pass()
        .await
        .expect("pass");
    (url, store)
}

#[tokio::test]
async fn check_energy_passes_on_a_demo_database_and_catches_a_planted_violation() {
    let dir = tempfile::tempdir().expect("dir");
    let (url, store) = demo_database(&dir).await;
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
    assert_eq!(
        report.minutes,
        2 * 4 * 5,
        "2 nodes × 4 GPUs × (4 closed minutes + 1 provisional)"
    );
    assert!(report.energy_mj > 0);
    let containers = store
        .workload_energy(all_time(), None, None)
        .await
        .expect("workloads");
    assert!(
        !containers.is_empty(),
        "the demo's workloads were attributed energy"
    );
    store.close().await;

    // The binary agrees, then a planted error (1 mJ moved into a workload) is caught.
    let bin = env!("CARGO_BIN_EXE_gpufleet-collector");
    let to = (T0 + 1000 * MIN).to_string();
    let run = || {
        std::process::Command::new(bin)
            .args(["check-energy", "--db", &url, "--from", "0", "--to", &to])
            .env_remove("GPUFLEET_CONFIG")
            .output()
            .expect("run check-energy")
    };
    let ok = run();
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.contains(": 0 violations"), "{stdout}");

    let pool = sqlx::SqlitePool::connect(&url).await.expect("pool");
    sqlx::query(
        "UPDATE energy_workload_minutes SET energy_mj = energy_mj + 1 \
         WHERE (gpu_id, minute_ms, workload_id) = \
         (SELECT gpu_id, minute_ms, workload_id FROM energy_workload_minutes LIMIT 1)",
    )
    .execute(&pool)
    .await
    .expect("plant");
    pool.close().await;
    let bad = run();
    let stdout = String::from_utf8_lossy(&bad.stdout);
    assert!(!bad.status.success(), "{stdout}");
    assert!(stdout.contains("VIOLATION"), "{stdout}");
    assert!(!stdout.contains(": 0 violations"), "{stdout}");

    // recompute-energy rebuilds it from raw samples.
    let re = std::process::Command::new(bin)
        .args(["recompute-energy", "--db", &url, "--from", "0", "--to", &to])
        .args(["--energy-idle-policy", "separate"])
        .env_remove("GPUFLEET_CONFIG")
        .output()
        .expect("run recompute-energy");
    assert!(
        re.status.success(),
        "{}",
        String::from_utf8_lossy(&re.stderr)
    );
    let fixed = run();
    assert!(
        fixed.status.success(),
        "{}",
        String::from_utf8_lossy(&fixed.stdout)
    );
}
