//! Energy through the HTTP API: per container, per GPU and in total.

use super::*;

#[tokio::test]
async fn the_api_reports_energy_per_container_per_gpu_and_in_total() {
    let (_dir, store) = sqlite_store().await;
    the_api_reports_energy_per_container_per_gpu_and_in_total_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_the_api_reports_energy_per_container() {
    let (_schema, store) = pg_store().await;
    the_api_reports_energy_per_container_per_gpu_and_in_total_on(store).await;
}

async fn the_api_reports_energy_per_container_per_gpu_and_in_total_on(store: Arc<dyn Store>) {
    let node = one_gpu_node(&store, "GPU-api").await;
    // 200 W for 2 minutes and 1 s, idle 40 W, shares 3 : 1; GPM: tensor 40 %, SM
    // occupancy 60 %.
    let ticks = (0..=121)
        .map(|k| {
            let mut t = shared_tick("GPU-api", T0 + k * 1000, 200_000, Some(k as u64 * 200_000));
            t.gpus[0].gpm = GpmMetrics {
                tensor_active_cpct: Some(4_000),
                sm_occupancy_cpct: Some(6_000),
                ..GpmMetrics::default()
            };
            t
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    Accountant::new(store.clone(), options(40, IdlePolicy::Spread), clock_at(T0))
        .pass()
        .await
        .expect("pass");
    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    let (status, v) = get_json(&store, &format!("/api/v1/containers?{range}")).await;
    assert_eq!(status, 200, "{v}");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    // 121 s × 200 W = 24,200 J; idle 40 W × 20 % of 121 s = 968 J, half each (equal
    // memory); active 3 : 1.
    let active = 24_200.0 - 968.0;
    assert_eq!(rows[0]["key"], format!("container:{A}"));
    assert_eq!(rows[0]["identity"]["container_id"], A);
    assert_eq!(rows[0]["identity"]["container_name"], "trainer");
    assert_eq!(rows[0]["energy_j"], 0.75 * active + 484.0);
    assert_eq!(rows[1]["energy_j"], 0.25 * active + 484.0);
    assert_eq!(rows[0]["gpu_seconds"], 121.0);
    assert_eq!(rows[0]["active_j"], 0.75 * active);
    assert_eq!(rows[0]["idle_j"], 484.0);
    assert_eq!(rows[0]["idle_charged_j"], 484.0, "spread: charged");
    assert_eq!(rows[0]["split"]["idle_memory_s"], 121.0);
    assert_eq!(rows[0]["avg_share"], 0.75);
    // Its GPM share: ¾ of the GPU's 40 % tensor and 60 % occupancy, ¼ for the other.
    assert_eq!(rows[0]["tensor_active_pct"], 30.0);
    assert_eq!(rows[0]["sm_occupancy_pct"], 45.0);
    assert_eq!(rows[1]["tensor_active_pct"], 10.0);
    assert_eq!(rows[0]["gpm_seconds"], 121.0);
    assert_eq!(rows[0]["method"]["counter_j"], rows[0]["energy_j"]);
    assert_eq!(rows[0]["gpus"][0]["uuid"], "GPU-api");
    assert_eq!(rows[0]["nodes"][0], "n1");
    let kwh = rows[0]["energy_kwh"].as_f64().expect("kwh");
    assert!((kwh - (0.75 * active + 484.0) / 3.6e6).abs() < 1e-12);

    let (status, v) = get_json(&store, &format!("/api/v1/containers/container:{B}?{range}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["energy_j"], 0.25 * active + 484.0);
    let series = v["series"].as_array().expect("series");
    assert_eq!(series.len(), 3, "two closed minutes and the open one");
    assert_eq!(series[0]["provisional_j"], 0.0);
    assert!(
        series[2]["provisional_j"].as_f64() > Some(0.0),
        "{series:?}"
    );
    assert_eq!(series[0]["minute_ms"], T0);

    let (status, v) = get_json(&store, &format!("/api/v1/energy?{range}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["total"]["energy_j"], 24_200.0);
    assert_eq!(v["total"]["idle_j"], 968.0);
    assert_eq!(v["total"]["active_j"], active);
    assert_eq!(v["total"]["idle_charged_j"], 968.0);
    assert_eq!(v["total"]["idle_bucket_j"], 0.0);
    assert_eq!(
        v["total"]["provisional_j"], 400.0,
        "120 s and 121 s: the open minute"
    );
    assert_eq!(v["gpus"][0]["baseline"]["source"], "watts");
    assert_eq!(v["gpus"][0]["baseline"]["idle_w"], 40.0);
    assert_eq!(v["total"]["avg_power_w"], 200.0);
    assert_eq!(v["total"]["missing_seconds"], 0.0);
    assert_eq!(v["gpus"][0]["uuid"], "GPU-api");
    assert_eq!(v["nodes"]["n1"]["energy_j"], 24_200.0);

    let (status, _) = get_json(&store, &format!("/api/v1/containers?{range}&group_by=pet")).await;
    assert_eq!(status, 400);
    let (status, _) = get_json(
        &store,
        &format!("/api/v1/containers/container:nope?{range}"),
    )
    .await;
    assert_eq!(status, 404);
}

/// Chargeback: `group_by=account` sums each Slurm account's jobs, and the job rows carry
/// the names the job's environment gave (name, account, partition, user).
#[tokio::test]
async fn energy_groups_by_slurm_account_with_the_jobs_names() {
    let (_dir, store) = sqlite_store().await;
    let node = one_gpu_node(&store, "GPU-acct").await;
    let job = |id: &str, name: &str, account: &str| Workload {
        kind: WorkloadKind::Slurm,
        runtime: "slurm".into(),
        job_id: Some(id.into()),
        job_name: Some(name.into()),
        account: Some(account.into()),
        partition: Some("gpu".into()),
        job_user: Some("alice".into()),
        ..Default::default()
    };
    // Three workloads at SM 40 / 20 / 20 %: two jobs of `physics`, one container.
    let ticks = (0..=121)
        .map(|k| {
            let mut t = shared_tick("GPU-acct", T0 + k * 1000, 200_000, Some(k as u64 * 200_000));
            t.processes = vec![
                process("GPU-acct", 100, 40, job("101", "train", "physics")),
                process("GPU-acct", 200, 20, job("102", "eval", "physics")),
                process("GPU-acct", 300, 20, container_workload(A, Some("trainer"))),
            ];
            t
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    Accountant::new(store.clone(), options(40, IdlePolicy::Spread), clock_at(T0))
        .pass()
        .await
        .expect("pass");
    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    let (status, v) = get_json(&store, &format!("/api/v1/containers?{range}")).await;
    assert_eq!(status, 200, "{v}");
    let rows = v["rows"].as_array().expect("rows");
    let train = rows
        .iter()
        .find(|r| r["key"] == "slurm:101")
        .expect("job 101");
    assert_eq!(train["identity"]["job_name"], "train");
    // No GPM on its GPU: no figure, never 0.
    assert!(train["tensor_active_pct"].is_null(), "{train}");
    assert_eq!(train["gpm_seconds"], 0.0);
    assert_eq!(train["identity"]["account"], "physics");
    assert_eq!(train["identity"]["partition"], "gpu");
    assert_eq!(train["identity"]["job_user"], "alice");
    let energy = |key: &str| -> f64 {
        rows.iter()
            .find(|r| r["key"] == key)
            .and_then(|r| r["energy_j"].as_f64())
            .unwrap_or_else(|| panic!("no row {key}"))
    };
    let physics = energy("slurm:101") + energy("slurm:102");
    let (status, v) = get_json(
        &store,
        &format!("/api/v1/containers?{range}&group_by=account"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let groups = v["rows"].as_array().expect("rows");
    assert_eq!(groups.len(), 2, "{groups:?}");
    let group = |key: &str| groups.iter().find(|r| r["key"] == key).expect(key);
    let acct = group("account:physics");
    assert!((acct["energy_j"].as_f64().expect("j") - physics).abs() < 1e-6);
    assert_eq!(acct["workloads"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        group("account:(none)")["energy_j"].as_f64(),
        Some(energy(&format!("container:{A}")))
    );
    assert_eq!(v["group_by"], "account");
    // A job's report is titled with its name.
    let (status, v) = get_json(&store, &format!("/api/v1/report?job=101&{range}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["subject"]["name"], "train (job 101, account physics)");
}

/// Energy over time: every band has a value per bucket, each group's band sums to its
/// `/api/v1/containers` row and all bands to `/api/v1/energy`'s total, exactly (mJ).
#[tokio::test]
async fn the_energy_series_bands_add_up_to_the_rows_and_the_total() {
    let (_dir, store) = sqlite_store().await;
    the_energy_series_bands_add_up_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_the_energy_series_bands_add_up() {
    let (_schema, store) = pg_store().await;
    the_energy_series_bands_add_up_on(store).await;
}

async fn the_energy_series_bands_add_up_on(store: Arc<dyn Store>) {
    let node = one_gpu_node(&store, "GPU-series").await;
    let ticks = (0..=121)
        .map(|k| {
            shared_tick(
                "GPU-series",
                T0 + k * 1000,
                200_000,
                Some(k as u64 * 200_000),
            )
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    Accountant::new(store.clone(), options(40, IdlePolicy::Spread), clock_at(T0))
        .pass()
        .await
        .expect("pass");
    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    let (status, total) = get_json(&store, &format!("/api/v1/energy?{range}")).await;
    assert_eq!(status, 200, "{total}");
    let (status, rows) = get_json(&store, &format!("/api/v1/containers?{range}")).await;
    assert_eq!(status, 200, "{rows}");
    let (status, v) = get_json(&store, &format!("/api/v1/energy/series?{range}")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["step_ms"], 60_000, "10 minutes: per minute");
    let buckets = v["buckets_ms"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 11, "{buckets:?}");
    let bands = v["bands"].as_array().expect("bands");
    let kinds: Vec<&str> = bands.iter().filter_map(|b| b["kind"].as_str()).collect();
    assert_eq!(kinds, ["group", "group", "other", "unattributed", "idle"]);
    let mut all = 0;
    for b in bands {
        let values: Vec<u64> = (b["values_mj"].as_array().expect("values").iter())
            .filter_map(serde_json::Value::as_u64)
            .collect();
        assert_eq!(values.len(), buckets.len(), "{b}");
        let sum: u64 = values.iter().sum();
        assert_eq!(b["energy_mj"].as_u64(), Some(sum), "{b}");
        all += sum;
        if b["kind"] == "group" {
            let row = (rows["rows"].as_array().expect("rows").iter())
                .find(|r| r["key"] == b["key"])
                .unwrap_or_else(|| panic!("no row for band {b}"));
            assert_eq!(row["energy_mj"].as_u64(), Some(sum), "{}", b["key"]);
            assert_eq!(
                b["identity"]["container_id"],
                row["identity"]["container_id"]
            );
        }
    }
    assert_eq!(Some(all), total["total"]["energy_mj"].as_u64());
    assert_eq!(v["energy_mj"], total["total"]["energy_mj"]);
    // The biggest first: trainer (3 : 1).
    assert_eq!(bands[0]["key"], format!("container:{A}"));
    // By node: one band (and an empty `other`), the node's energy, no idle band.
    let (status, v) = get_json(
        &store,
        &format!("/api/v1/energy/series?{range}&group_by=node&top=1"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["bands"][0]["key"], "node:n1");
    assert_eq!(
        v["bands"][0]["energy_mj"],
        total["nodes"]["n1"]["energy_mj"]
    );
    assert_eq!(v["bands"].as_array().map(Vec::len), Some(2));
    for bad in ["group_by=pet", "top=0", "top=51", "top=x"] {
        let (status, v) = get_json(&store, &format!("/api/v1/energy/series?{range}&{bad}")).await;
        assert_eq!(status, 400, "{bad}: {v}");
    }
    // A year is per hour; ten thousand years of hours are too many.
    let (status, v) = get_json(
        &store,
        &format!(
            "/api/v1/energy/series?from={T0}&to={}",
            T0 + 365 * 24 * 60 * MIN
        ),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["step_ms"], 3_600_000);
    let (status, _) = get_json(
        &store,
        "/api/v1/energy/series?from=0&to=9999-12-31T23:59:59Z",
    )
    .await;
    assert_eq!(status, 400);
}
