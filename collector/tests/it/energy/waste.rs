//! Idle-but-allocated waste on a known trace: stored samples through the real store,
//! accountant and carbon pricer, read back through `/api/v1/waste`, the report and
//! `waste::ongoing`, each figure equal to the hand computation below, on both backends.
//!
//! The trace (GPU `GPU-w` on node n1, one tick every 10 s from T0 to T0 + 45 min, energy
//! counter advancing by the tick's power × 10 s, so each interval's energy is its end
//! tick's power × 10 s; an interval belongs to the minute holding its end):
//! - Slurm job 4242 (uid 1000) holds 8 GiB from the first tick to the last;
//! - utilization 90 % and 250 W before 5:00 (ticks at 0:10 .. 4:50), 0 % and 100 W from
//!   5:00 to 39:50, except 1 % at 16:40 (still idle: the threshold is inclusive), 70 %
//!   and 250 W from 40:00 on;
//! - container `notebook` (pod nb-0) holds 24 GiB from 20:00 to 39:50.
//!
//! Hand computation (idle baseline configured at 100 W, policy spread):
//! - Minute m is idle when all six intervals ending in it (m:00 .. m:50) say ≤ 1 %:
//!   minutes 5 .. 39 (minute 4 ends at 4:50, busy; minute 40 starts busy at 40:00).
//!   The job: one episode 5:00 .. 40:00 = 35 min ≥ 30 min.
//!   The notebook: minutes 20 .. 39 = 20 min < 30 min: not reported at the default.
//! - Each idle interval: 100 W × 10 s = 1,000 J, all idle (100 W × 10 s × 100 %), except
//!   the one ending at 16:40: idle 100 W × 10 s × 99 % = 990 J, active 10 J (both the
//!   job's: alone then). A GPU-minute: 6 × 1,000 J = 6,000 J.
//! - Shares by GPU memory held, 8 : 24 GiB = 1 : 3 from minute 20 (active too: SM 0 %
//!   everywhere, so by memory).
//!   The job: minutes 5 .. 19 alone, 15 × 6,000 = 90,000 J; minutes 20 .. 39 a quarter,
//!   20 × 1,500 = 30,000 J; total 120,000 J = 0.0333… kWh.
//!   The notebook: 20 × 4,500 = 90,000 J = 0.025 kWh.
//! - Carbon at 200 gCO2/kWh × PUE 1.5 = 300 g per kWh: the job 120,000 / 3.6e6 × 300 =
//!   10 g; the notebook 90,000 / 3.6e6 × 300 = 7.5 g. Unpriced (no provider): `null`.

use super::*;
use gpufleet_carbon::config::CarbonFile;
use gpufleet_carbon::{CarbonConfig, CarbonSettings, ProviderKind};
use gpufleet_collector::accounting::carbon::{CarbonOptions, Pricer};
use gpufleet_collector::accounting::waste::{self, WasteSettings};

const GPU: &str = "GPU-w";
const NB: &str = "9999999999999999999999999999999999999999999999999999999999999999";

fn job() -> Workload {
    Workload {
        kind: WorkloadKind::Slurm,
        runtime: "slurm".into(),
        job_id: Some("4242".into()),
        uid: Some(1000),
        ..Default::default()
    }
}

fn notebook() -> Workload {
    Workload {
        pod_name: Some("nb-0".into()),
        ..container_workload(NB, Some("notebook"))
    }
}

/// Ticks `k` in `ks` (at T0 + k × 10 s) of the trace in the module doc.
fn trace(ks: std::ops::RangeInclusive<i64>) -> Vec<Tick> {
    let power = |k: i64| {
        if (30..240).contains(&k) {
            100_000
        } else {
            250_000
        }
    };
    let util = |k: i64| match k {
        100 => 1,
        30..240 => 0,
        k if k < 30 => 90,
        _ => 70,
    };
    // Counter: the sum of each tick's power × 10 s (mW × 10 s = 10 mJ per mW).
    let counter = |k: i64| (1..=k).map(|i| u64::from(power(i)) * 10).sum::<u64>();
    ks.map(|k| {
        let mut processes = vec![proc_with(GPU, 10, 0, 8 * GIB, ProcessType::Compute, job())];
        if (120..240).contains(&k) {
            processes.push(proc_with(
                GPU,
                20,
                0,
                24 * GIB,
                ProcessType::Compute,
                notebook(),
            ));
        }
        Tick {
            time_ms: T0 + k * 10_000,
            gpus: vec![GpuSample {
                gpu_uuid: GPU.into(),
                util_gpu_pct: Some(util(k)),
                power_mw: Some(power(k)),
                energy_mj: Some(counter(k)),
                ..Default::default()
            }],
            processes,
            ..Default::default()
        }
    })
    .collect()
}

fn energy_options() -> EnergyOptions {
    EnergyOptions {
        max_gap: Some(std::time::Duration::from_secs(30)),
        ..options(100, IdlePolicy::Spread)
    }
}

async fn account(store: &Arc<dyn Store>, now: UnixMs) {
    Accountant::new(store.clone(), energy_options(), clock_at(now))
        .pass()
        .await
        .expect("energy pass");
}

async fn price(store: &Arc<dyn Store>, now: UnixMs) {
    let settings = CarbonSettings {
        carbon_provider: Some(ProviderKind::Static),
        carbon_g_per_kwh: Some(200.0),
        carbon_region: Some("lab".into()),
        pue: 1.5,
        ..Default::default()
    };
    let config = CarbonConfig::new(settings, CarbonFile::default()).expect("carbon config");
    let options = CarbonOptions {
        config: Arc::new(config),
        ..Default::default()
    };
    let mut p = Pricer::new(store.clone(), store.clone(), options, clock_at(now));
    let r = p.run_once().await.expect("pricing pass");
    assert_eq!(r.unpriced, 0, "{r:?}");
}

async fn waste_json(store: &Arc<dyn Store>, now: UnixMs, query: &str) -> serde_json::Value {
    let uri = format!("/api/v1/waste?from={T0}&to={}{query}", T0 + 50 * MIN);
    let (status, v) = api_get_json(store, now, &uri).await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn waste_figures_equal_the_hand_computation() {
    let (dir, store) = sqlite_store().await;
    hand_computation_on(&store).await;
    store.close().await;
    // `gpufleet-collector report waste` on the same database prints the same figures.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args(["report", "waste", "--db"])
        .arg(format!("sqlite://{}", dir.path().join("test.db").display()))
        .args([
            "--from",
            &T0.to_string(),
            "--to",
            &(T0 + 50 * MIN).to_string(),
        ])
        .args(["--node", "n1", "--format", "csv"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let csv = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 2, "{csv}");
    assert!(
        rows[1].ends_with(",35,8589934592,120000.000,0.033333333,10.0000,0.000"),
        "{csv}"
    );
    // The flags of the rule: 15 minutes brings the notebook in.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args(["report", "waste", "--db"])
        .arg(format!("sqlite://{}", dir.path().join("test.db").display()))
        .args([
            "--from",
            &T0.to_string(),
            "--to",
            &(T0 + 50 * MIN).to_string(),
        ])
        .args(["--waste-min-idle", "15m"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("Total: 2 episodes, 0.058333 kWh, 17.50 gCO2"),
        "{table}"
    );
    assert!(table.contains("nb-0"), "{table}");
}

#[tokio::test]
async fn postgres_waste_figures_equal_the_hand_computation() {
    let (_schema, store) = pg_store().await;
    hand_computation_on(&store).await;
}

async fn hand_computation_on(store: &Arc<dyn Store>) {
    let node = one_gpu_node(store, GPU).await;
    // First 36:40 only: the job has been idle since 5:00 and still is.
    write_ticks(store, &node, 1, trace(0..=220)).await;
    let now = T0 + 36 * MIN + 45_000;
    account(store, now).await;
    let going = waste::ongoing(store.as_ref(), WasteSettings::default(), now)
        .await
        .expect("ongoing");
    assert_eq!(going.len(), 1, "{going:?}");
    // Minutes 5 .. 36 (36 open): 5:00 .. now = 31 min 45 s.
    assert_eq!(going[0].workload.key(), "slurm:4242");
    assert!(going[0].ongoing);
    assert_eq!((going[0].since_ms, going[0].until_ms), (T0 + 5 * MIN, now));
    assert_eq!(going[0].idle_ms(), 31 * MIN + 45_000);
    assert_eq!(going[0].minutes, 32);

    // The rest of the trace; every minute closed and priced.
    write_ticks(store, &node, 2, trace(221..=270)).await;
    let now = T0 + 50 * MIN;
    account(store, now).await;
    let v = waste_json(store, now, "").await;
    assert_eq!(v["threshold_pct"], 1);
    assert_eq!(v["min_idle_seconds"], 1800.0);
    let eps = v["episodes"].as_array().expect("episodes");
    assert_eq!(eps.len(), 1, "{v}");
    let e = &eps[0];
    assert_eq!(e["workload_key"], "slurm:4242");
    assert_eq!(e["workload"]["job_id"], "4242");
    assert_eq!(e["workload"]["uid"], 1000);
    assert_eq!(e["gpu"]["uuid"], GPU);
    assert_eq!(e["gpu"]["node"], "n1");
    assert_eq!(e["since_ms"], T0 + 5 * MIN);
    assert_eq!(e["until_ms"], T0 + 40 * MIN);
    assert_eq!(e["idle_minutes"], 35);
    assert_eq!(e["idle_seconds"], 2100.0);
    assert_eq!(e["ongoing"], false);
    assert_eq!(e["memory_bytes"], 8 * GIB);
    assert_eq!(e["energy_mj"], 120_000_000);
    assert_eq!(e["energy_j"], 120_000.0);
    assert_eq!(e["idle_j"], 119_990.0, "10 J active at 16:40");
    assert_eq!(e["charged_j"], 120_000.0, "spread: all charged");
    assert!(e["carbon_g"].is_null(), "not priced yet: null, never 0");
    assert_eq!(e["unpriced_j"], 120_000.0);

    price(store, now).await;
    let v = waste_json(store, now, "").await;
    let g = v["episodes"][0]["carbon_g"].as_f64().expect("priced");
    assert!((g - 10.0).abs() < 1e-9, "{g}");
    assert_eq!(v["episodes"][0]["unpriced_j"], 0.0);
    assert_eq!(v["workloads"][0]["workload_key"], "slurm:4242");
    assert_eq!(v["workloads"][0]["energy_mj"], 120_000_000);
    assert_eq!(v["energy_mj"], 120_000_000);

    // A shorter minimum brings the notebook's 20 minutes in, at its 3/4 share.
    let v = waste_json(store, now, "&min_idle=15m").await;
    let eps = v["episodes"].as_array().expect("episodes");
    assert_eq!(eps.len(), 2, "{v}");
    let nb = &eps[1];
    assert_eq!(nb["workload_key"], format!("container:{NB}"));
    assert_eq!(nb["workload"]["pod_name"], "nb-0");
    assert_eq!(nb["workload"]["namespace"], "ml");
    assert_eq!(
        (nb["since_ms"].clone(), nb["idle_minutes"].clone()),
        (serde_json::json!(T0 + 20 * MIN), serde_json::json!(20))
    );
    assert_eq!(nb["energy_mj"], 90_000_000);
    assert_eq!(nb["memory_bytes"], 24 * GIB);
    assert!((nb["carbon_g"].as_f64().expect("priced") - 7.5).abs() < 1e-9);
    assert_eq!(v["energy_mj"], 210_000_000);
    assert!((v["carbon_g"].as_f64().expect("priced") - 17.5).abs() < 1e-9);
    // A range starting mid-episode reports it whole, min_idle judged on the whole.
    let uri = format!(
        "/api/v1/waste?from={}&to={}&min_idle=15m",
        T0 + 35 * MIN,
        T0 + 50 * MIN
    );
    let (status, v) = api_get_json(store, now, &uri).await;
    assert_eq!(status, 200, "{v}");
    let eps = v["episodes"].as_array().expect("episodes");
    let nb = eps
        .iter()
        .find(|e| e["workload_key"] == format!("container:{NB}"))
        .expect("the notebook's episode");
    assert_eq!(
        (nb["since_ms"].clone(), nb["idle_minutes"].clone()),
        (serde_json::json!(T0 + 20 * MIN), serde_json::json!(20)),
        "{v}"
    );
    assert_eq!(nb["energy_mj"], 90_000_000);
    // 36 minutes is too long for either; threshold 0 % splits the job's run at 16:40.
    let v = waste_json(store, now, "&min_idle=36m").await;
    assert_eq!(v["episodes"], serde_json::json!([]));
    let v = waste_json(store, now, "&threshold=0&min_idle=20m").await;
    let eps = v["episodes"].as_array().expect("episodes");
    let got: Vec<(i64, i64)> = eps
        .iter()
        .map(|e| {
            (
                e["since_ms"].as_i64().unwrap_or(0),
                e["idle_minutes"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    // Minute 16 (16:40 at 1 %) breaks: 17 .. 39 (23 min) for the job, 20 .. 39 for the notebook.
    assert_eq!(got, [(T0 + 17 * MIN, 23), (T0 + 20 * MIN, 20)], "{v}");
    // Bad input: a clear 400.
    let (status, _) = api_get_json(store, now, "/api/v1/waste?min_idle=soon").await;
    assert_eq!(status, 400);
    let (status, _) = api_get_json(store, now, "/api/v1/waste?threshold=101").await;
    assert_eq!(status, 400);
    // At most 31 days in one request.
    let (status, v) = api_get_json(store, now, "/api/v1/waste?from=now-32d").await;
    assert_eq!(status, 400, "{v}");
    let (status, _) = api_get_json(store, now, "/api/v1/waste?from=now-30d").await;
    assert_eq!(status, 200);

    // The report renders the same figures.
    let episodes = waste::find(
        store.as_ref(),
        TimeRange {
            from_ms: T0,
            to_ms: now,
        },
        Some("n1"),
        WasteSettings::default(),
        now,
    )
    .await
    .expect("episodes");
    let report = gpufleet_collector::cli::waste::waste_report(
        &episodes,
        WasteSettings::default(),
        TimeRange {
            from_ms: T0,
            to_ms: now,
        },
    );
    let csv = gpufleet_report::waste::render(&report, gpufleet_report::Format::Csv).expect("csv");
    let row = csv.lines().nth(1).expect("a row");
    assert!(
        row.starts_with("n1,GPU-w,0,slurm:4242,slurm,,,4242,1000,"),
        "{row}"
    );
    assert!(
        row.ends_with(",false,35,8589934592,120000.000,0.033333333,10.0000,0.000"),
        "{row}"
    );
    // Another node's filter finds nothing.
    let none = waste::find(
        store.as_ref(),
        TimeRange {
            from_ms: T0,
            to_ms: now,
        },
        Some("n2"),
        WasteSettings::default(),
        now,
    )
    .await
    .expect("episodes");
    assert!(none.is_empty());
}

/// The `/metrics` gauge through the real refresh task: the ongoing episode of the trace's
/// first 36:40 (idle since 5:00, 31 min 45 s at 36:45), and nothing once it is over.
#[tokio::test]
async fn the_idle_allocated_gauge_shows_the_ongoing_episode() {
    use gpufleet_collector::accounting::counters::{self, CounterOptions, WorkloadCounters};
    use tower::ServiceExt as _;
    let (_dir, store) = sqlite_store().await;
    let node = one_gpu_node(&store, GPU).await;
    write_ticks(&store, &node, 1, trace(0..=220)).await;
    let now = Arc::new(AtomicI64::new(T0 + 36 * MIN + 45_000));
    account(&store, now.load(Ordering::SeqCst)).await;
    let workloads = Arc::new(WorkloadCounters::new(10));
    let stop = tokio_util::sync::CancellationToken::new();
    let clock: Clock = {
        let now = Arc::clone(&now);
        Arc::new(move || now.load(Ordering::SeqCst))
    };
    let config =
        CarbonConfig::new(CarbonSettings::default(), CarbonFile::default()).expect("config");
    let task = counters::spawn(
        store.clone(),
        Arc::new(Live::new()),
        Arc::new(config),
        Arc::clone(&workloads),
        CounterOptions {
            refresh: std::time::Duration::from_millis(20),
            ..Default::default()
        },
        Arc::clone(&clock),
        stop.clone(),
    );
    let metrics = async || {
        let state = gpufleet_collector::api::router::AppState {
            store: Arc::clone(&store),
            live: Arc::new(Live::new()),
            metrics: Arc::new(gpufleet_collector::metrics::Metrics::default()),
            writer: None,
            status: Default::default(),
            clock: Arc::clone(&clock),
            workloads: Arc::clone(&workloads),
            waste: Default::default(),
            renders: Default::default(),
        };
        let request = axum::http::Request::builder()
            .uri("/metrics")
            .body(axum::body::Body::empty())
            .expect("request");
        let response = gpufleet_collector::api::router::app(state)
            .oneshot(request)
            .await
            .expect("response");
        let body = axum::body::to_bytes(response.into_body(), 1 << 24)
            .await
            .expect("body");
        String::from_utf8_lossy(&body).into_owned()
    };
    let want = r#"gpufleet_gpu_idle_allocated_seconds{node="n1",workload="slurm:4242",kind="slurm",namespace="",pod="",container="",job="4242",job_name="",account="",user="1000",gpu="GPU-w"} 1905.0"#;
    wait_until(
        "the gauge",
        std::time::Duration::from_secs(30),
        async || metrics().await.lines().any(|l| l == want).then_some(()),
    )
    .await;
    // The job goes back to work at 40:00: the episode is over, the series leaves.
    write_ticks(&store, &node, 2, trace(221..=270)).await;
    now.store(T0 + 50 * MIN, Ordering::SeqCst);
    account(&store, T0 + 50 * MIN).await;
    wait_until(
        "the gauge gone",
        std::time::Duration::from_secs(30),
        async || {
            (!metrics()
                .await
                .contains("gpufleet_gpu_idle_allocated_seconds{"))
            .then_some(())
        },
    )
    .await;
    stop.cancel();
    task.await.expect("the refresh task ends");
}

/// An episode longer than `ongoing`'s first window is found whole: the node's history is
/// read further back until the episode's start. The job holds the GPU idle (0 %, 100 W)
/// from the first tick, for 3 hours: since T0 (minute 0's five intervals, 0:10 .. 0:50,
/// are all idle and held), 181 minutes, ongoing at 3:00:30.
#[tokio::test]
async fn an_ongoing_episode_longer_than_the_first_window_is_found_whole() {
    let (_dir, store) = sqlite_store().await;
    let node = one_gpu_node(&store, GPU).await;
    let ticks: Vec<Tick> = (0..=1080)
        .map(|k| {
            let mut t = trace(40..=40).remove(0);
            t.time_ms = T0 + k * 10_000;
            t.gpus[0].energy_mj = Some(k as u64 * 1_000_000);
            t.processes.truncate(1);
            t
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    let now = T0 + 180 * MIN + 30_000;
    account(&store, now).await;
    let going = waste::ongoing(store.as_ref(), WasteSettings::default(), now)
        .await
        .expect("ongoing");
    assert_eq!(going.len(), 1, "{going:?}");
    assert_eq!((going[0].since_ms, going[0].until_ms), (T0, now));
    assert_eq!(going[0].minutes, 181);
    // The same as a whole-range read.
    let all = waste::find(
        store.as_ref(),
        TimeRange {
            from_ms: T0,
            to_ms: now,
        },
        None,
        WasteSettings::default(),
        now,
    )
    .await
    .expect("find");
    assert_eq!(going, all);
}
