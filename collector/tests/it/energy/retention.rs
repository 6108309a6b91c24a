//! Reports after raw samples expire (from rollups), and the retention flags.

use super::*;

#[tokio::test]
async fn after_raw_expiry_reports_stay_exact_and_series_come_from_rollups() {
    let (_dir, store) = sqlite_store().await;
    after_raw_expiry_reports_stay_exact_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn pg_after_raw_expiry_reports_stay_exact_and_series_come_from_rollups() {
    let (_schema, store) = pg_store().await;
    after_raw_expiry_reports_stay_exact_on(store).await;
}

async fn after_raw_expiry_reports_stay_exact_on(store: Arc<dyn Store>) {
    use gpufleet_collector::accounting::rollups::{RetentionOptions, Rollups};
    let node = one_gpu_node(&store, "GPU-ret").await;
    // 200 W for 6 minutes and 1 s, shares 3 : 1.
    let ticks = (0..=361)
        .map(|k| shared_tick("GPU-ret", T0 + k * 1000, 200_000, Some(k as u64 * 200_000)))
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    Accountant::new(store.clone(), options(40, IdlePolicy::Spread), clock_at(T0))
        .pass()
        .await
        .expect("account");
    let mut rollups = Rollups::new(store.clone(), RetentionOptions::default(), clock_at(T0));
    rollups.pass().await.expect("roll up");
    let live = Arc::new(Live::new());
    live.seed(
        store.nodes().await.expect("nodes"),
        store.latest_gpu_samples().await.expect("latest"),
        store.latest_host_samples().await.expect("host"),
        store.latest_gpu_health().await.expect("health"),
    );
    let get = |uri: String| {
        let (store, live) = (Arc::clone(&store), Arc::clone(&live));
        async move { get_json_live(&store, live, &uri).await }
    };
    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    let reports = || async {
        let (s1, containers) = get(format!("/api/v1/containers?{range}")).await;
        let (s2, energy) = get(format!("/api/v1/energy?{range}")).await;
        assert_eq!((s1, s2), (200, 200));
        (containers, energy)
    };
    let before = reports().await;
    let series = |q: String| get(format!("/api/v1/gpus/GPU-ret/series?metric=power_mw&{q}"));
    let (status, raw) = series(format!("from={T0}&to={}", T0 + 6 * MIN)).await;
    assert_eq!((status, raw["tier"].as_str()), (200, Some("raw")), "{raw}");
    assert_eq!(raw["points"].as_array().map(Vec::len), Some(361));
    let (_, minutes) = series(format!("from={T0}&to={}&step=1m", T0 + 6 * MIN)).await;
    assert_eq!(
        minutes["tier"], "rollup",
        "a step of a minute or more reads rollups"
    );
    assert_eq!(minutes["points"][0], serde_json::json!([T0, 200_000.0]));

    // A week later, raw before minute 4 is gone.
    let out = rollups
        .expire(T0 + 7 * 86_400_000 + 4 * MIN)
        .await
        .expect("expire");
    assert_eq!(out.deleted.get("gpu_samples"), Some(&239), "{out:?}");
    // A restarted accountant rechecks the minutes around the horizon: nothing changes.
    Accountant::new(
        store.clone(),
        options(40, IdlePolicy::Spread),
        clock_at(T0 + 5 * MIN),
    )
    .pass()
    .await
    .expect("account");
    assert_eq!(
        reports().await,
        before,
        "/api/v1/containers and /api/v1/energy unchanged"
    );
    let (status, old) = series(format!("from={T0}&to={}", T0 + 6 * MIN)).await;
    assert_eq!(
        (status, old["tier"].as_str()),
        (200, Some("rollup")),
        "{old}"
    );
    assert_eq!(old["step_ms"], 60_000);
    let points = old["points"].as_array().expect("points");
    assert_eq!(points.len(), 6, "minutes 0..5 from the rollups: {old}");
    assert!(points.iter().all(|p| p[1] == 200_000.0));
    let (_, recent) = series(format!("from={}&to={}", T0 + 4 * MIN, T0 + 6 * MIN)).await;
    assert_eq!(recent["tier"], "raw", "after the horizon raw still answers");
    assert_eq!(recent["points"].as_array().map(Vec::len), Some(121));
    let report = energy_check::check(store.as_ref(), all_time())
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
}

#[test]
fn retention_flags_come_from_the_config_file_and_are_checked() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("collector.toml");
    std::fs::write(
        &config,
        "[serve]\nretain_raw = \"30d\"\nretain_rollups = \"10d\"\n",
    )
    .expect("write config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .arg("--config")
        .arg(&config)
        .args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .arg("--db")
        .arg(format!("sqlite://{}", dir.path().join("c.db").display()))
        .env_remove("GPUFLEET_RETAIN_RAW")
        .env_remove("GPUFLEET_RETAIN_ROLLUPS")
        .output()
        .expect("run serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--retain-rollups (10days) must not be shorter than --retain-raw (30days)"),
        "{stderr}"
    );
}
