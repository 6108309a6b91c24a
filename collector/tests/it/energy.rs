//! Energy accounting through the real store: known traces, late data, the check, the CLI.

use crate::common::*;
use gpufleet_collector::accounting::accountant::{
    Accountant, EnergyOptions, IdleConfig, IdleWatts,
};
use gpufleet_collector::accounting::check as energy_check;
use gpufleet_collector::accounting::energy::IdlePolicy;
use gpufleet_collector::live::state::{Committed, Live};
use gpufleet_collector::live::status::Clock;
use gpufleet_collector::store::{NodeRecord, Store, TimeRange};
use gpufleet_core::GpuSource;
use gpufleet_core::*;
use gpufleet_sim::{SimOptions, simulator};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

const MIN: i64 = 60_000;

fn clock_at(t: UnixMs) -> Clock {
    Arc::new(move || t)
}

fn all_time() -> TimeRange {
    TimeRange {
        from_ms: 0,
        to_ms: T0 + 1000 * MIN,
    }
}

fn process(uuid: &str, pid: u32, sm: u32, workload: Workload) -> ProcessSample {
    ProcessSample {
        gpu_uuid: uuid.into(),
        pid,
        process_type: ProcessType::Compute,
        user: Some("lena".into()),
        command: Some("python serve.py".into()),
        gpu_mem_bytes: Some(4 << 30),
        sm_util_pct: Some(sm),
        mem_util_pct: None,
        enc_util_pct: None,
        dec_util_pct: None,
        workload,
        mig_uuid: None,
    }
}

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// One tick of GPU `uuid` at `t` with power `power_mw`, counter `energy_mj`, and
/// containers A (SM 60 %) and B (SM 20 %).
fn shared_tick(uuid: &str, t: UnixMs, power_mw: u32, energy_mj: Option<u64>) -> Tick {
    Tick {
        time_ms: t,
        gpus: vec![GpuSample {
            gpu_uuid: uuid.into(),
            util_gpu_pct: Some(80),
            power_mw: Some(power_mw),
            energy_mj,
            ..Default::default()
        }],
        processes: vec![
            process(uuid, 100, 60, container_workload(A, Some("trainer"))),
            process(uuid, 200, 20, container_workload(B, Some("inference"))),
        ],
        ..Default::default()
    }
}

async fn one_gpu_node(store: &Arc<dyn Store>, uuid: &str) -> NodeRecord {
    store
        .register_node(&hello("n1"), &inventory(vec![gpu_info_sparse(uuid, 0)]), T0)
        .await
        .expect("register")
}

fn options(idle_w: u32, policy: IdlePolicy) -> EnergyOptions {
    EnergyOptions {
        idle_policy: policy,
        idle: IdleConfig {
            default: IdleWatts::Milliwatts(idle_w * 1000),
            per_model: vec![],
        },
        ..Default::default()
    }
}

/// mJ of workload `key` in the stored rollups.
async fn stored_mj(store: &Arc<dyn Store>, key: &str) -> u64 {
    store
        .workload_energy(all_time(), None, Some(key))
        .await
        .expect("workload energy")
        .iter()
        .map(|r| r.energy_mj)
        .sum()
}

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

/// A simulated node (the demo's simulator and workloads) for five minutes, accounted.
async fn demo_database(dir: &tempfile::TempDir) -> (String, Arc<dyn Store>) {
    let url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let store = gpufleet_collector::store::open(&url).await.expect("open");
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

async fn get_json(store: &Arc<dyn Store>, uri: &str) -> (u16, serde_json::Value) {
    get_json_live(store, Arc::new(Live::new()), uri).await
}

async fn get_json_live(
    store: &Arc<dyn Store>,
    live: Arc<Live>,
    uri: &str,
) -> (u16, serde_json::Value) {
    let (status, _, body) = api_get_live(store, live, T0 + 10 * MIN, uri).await;
    (status, serde_json::from_slice(&body).expect("json"))
}

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
    // 200 W for 2 minutes and 1 s, idle 40 W, shares 3 : 1.
    let ticks = (0..=121)
        .map(|k| shared_tick("GPU-api", T0 + k * 1000, 200_000, Some(k as u64 * 200_000)))
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

const GIB: u64 = 1 << 30;

/// A process of `workload` with its own SM share, memory and type.
fn proc_with(
    uuid: &str,
    pid: u32,
    sm: u32,
    mem: u64,
    kind: ProcessType,
    workload: Workload,
) -> ProcessSample {
    ProcessSample {
        gpu_mem_bytes: Some(mem),
        process_type: kind,
        ..process(uuid, pid, sm, workload)
    }
}

/// A node `name` with GPUs `uuids`, all of model `model`.
async fn node_of(store: &Arc<dyn Store>, name: &str, model: &str, uuids: &[&str]) -> NodeRecord {
    let gpus = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| GpuInfo {
            name: model.into(),
            ..gpu_info_sparse(u, i as u32)
        })
        .collect();
    store
        .register_node(&hello(name), &inventory(gpus), T0)
        .await
        .expect("register")
}

/// mJ per workload key on one GPU in the stored rollups.
async fn mj_on(store: &Arc<dyn Store>, key: &str, gpu: &str) -> u64 {
    store
        .workload_energy(all_time(), None, Some(key))
        .await
        .expect("workload energy")
        .iter()
        .filter(|r| r.gpu_uuid == gpu)
        .map(|r| r.energy_mj)
        .sum()
}

const C: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
const D: &str = "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd";
const X: &str = "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";

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

#[tokio::test]
async fn a_job_that_ends_on_a_live_node_shows_whole_within_15_s_of_its_end() {
    let (_dir, store) = sqlite_store().await;
    job_end_on_a_live_node_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_a_job_that_ends_on_a_live_node_shows_whole_within_15_s_of_its_end() {
    let (_schema, store) = pg_store().await;
    job_end_on_a_live_node_on(store).await;
}

/// The node keeps sampling (1 Hz, batches every 5 s, as an agent sends them) after a 20 s
/// job ends mid-minute; the accountant passes every 5 s. The job's whole energy must be
/// in the API no later than 15 s after its last sample, though its minute is still open.
async fn job_end_on_a_live_node_on(store: Arc<dyn Store>) {
    let node = node_of(&store, "n1", "NVIDIA A10", &["GPU-live"]).await;
    let job = |k: i64| (11..=30).contains(&k);
    let tick = |k: i64| Tick {
        time_ms: T0 + k * 1000,
        gpus: vec![GpuSample {
            gpu_uuid: "GPU-live".into(),
            util_gpu_pct: Some(if job(k) { 100 } else { 0 }),
            power_mw: Some(if job(k) { 250_000 } else { 40_000 }),
            // 40 J per idle second, 250 J per busy one.
            energy_mj: Some(
                (0..=k)
                    .filter(|i| *i > 0)
                    .map(|i| if job(i) { 250_000 } else { 40_000 })
                    .sum(),
            ),
            ..Default::default()
        }],
        processes: if job(k) {
            vec![process(
                "GPU-live",
                9,
                97,
                container_workload(A, Some("job")),
            )]
        } else {
            vec![]
        },
        ..Default::default()
    };
    let options = options(40, IdlePolicy::Spread);
    let clock_now = Arc::new(AtomicI64::new(T0));
    let clock: Clock = {
        let n = Arc::clone(&clock_now);
        Arc::new(move || n.load(Ordering::SeqCst))
    };
    let mut acc = Accountant::new(store.clone(), options, clock);
    let job_end = T0 + 30_000;
    let mut whole_at = None;
    for batch in 0..11 {
        let ticks = (batch * 5..batch * 5 + 5).map(tick).collect();
        write_ticks(&store, &node, batch as u64 + 1, ticks).await;
        let now = T0 + (batch * 5 + 5) * 1000;
        clock_now.store(now, Ordering::SeqCst);
        acc.pass().await.expect("pass");
        if whole_at.is_none() && stored_mj(&store, &format!("container:{A}")).await == 20 * 250_000
        {
            whole_at = Some(now);
        }
    }
    let whole_at = whole_at.expect("the job's energy was never whole");
    assert!(
        whole_at - job_end <= 15_000,
        "whole {} s after the job ended",
        (whole_at - job_end) / 1000
    );
    assert!(whole_at < T0 + MIN, "while its minute was still open");
}

/// `gpufleet-agent exec` and the collector measure the same run: exec counts a GPU's
/// energy from the tick that first lists the command's process until the command exits;
/// the collector gives the container the intervals that end at ticks listing it. On an
/// exclusive GPU under `spread` they differ by the interval between the last tick listing
/// the process and the command's exit.
#[tokio::test]
async fn exec_and_the_collector_agree_on_an_exclusive_job_but_for_the_interval_before_exit() {
    use gpufleet_exec::Measure;
    for job_s in [20i64, 300] {
        let (_dir, store) = sqlite_store().await;
        let node = node_of(&store, "n1", "NVIDIA A10", &["GPU-x0"]).await;
        // The command starts at 0 s; its process is listed from 2 s (CUDA context) to
        // `job_s + 2` s, busy from 3 s; it exits at `job_s + 3` s. Power varies.
        let listed = |k: i64| (2..=job_s + 2).contains(&k);
        let busy = |k: i64| (3..=job_s + 2).contains(&k);
        let power = |k: i64| -> u32 {
            if busy(k) {
                200_000 + ((k * 7_919) % 100_000) as u32
            } else if listed(k) {
                60_000
            } else {
                40_000
            }
        };
        let mut counter = 0u64;
        let ticks: Vec<Tick> = (0..=job_s + 3)
            .map(|k| {
                if k > 0 {
                    counter += u64::from(power(k));
                }
                Tick {
                    time_ms: T0 + k * 1000,
                    gpus: vec![GpuSample {
                        gpu_uuid: "GPU-x0".into(),
                        util_gpu_pct: Some(if busy(k) { 100 } else { 0 }),
                        power_mw: Some(power(k)),
                        energy_mj: Some(counter),
                        ..Default::default()
                    }],
                    processes: if listed(k) {
                        vec![process(
                            "GPU-x0",
                            4242,
                            95,
                            container_workload(A, Some("job")),
                        )]
                    } else {
                        vec![]
                    },
                    ..Default::default()
                }
            })
            .collect();
        let inventory = inventory(vec![GpuInfo {
            name: "NVIDIA A10".into(),
            ..gpu_info_sparse("GPU-x0", 0)
        }]);
        let mut exec = Measure::new("n1", inventory, false, None);
        let tree = std::collections::BTreeSet::from([4242u32]);
        for t in &ticks {
            exec.add(t, &tree);
        }
        let exec_j = exec
            .report(Default::default(), None)
            .energy
            .energy_j
            .expect("exec measured energy");
        write_ticks(&store, &node, 1, ticks).await;
        Accountant::new(
            store.clone(),
            options(40, IdlePolicy::Spread),
            clock_at(T0 + 60 * MIN),
        )
        .pass()
        .await
        .expect("pass");
        let collector_j = stored_mj(&store, &format!("container:{A}")).await as f64 / 1000.0;
        let diff = (exec_j - collector_j).abs();
        // Both count the interval ending at the first tick listing the process; exec also
        // counts the one after the last listing, until the command exits (40 W × 1 s).
        assert_eq!(
            exec_j - collector_j,
            f64::from(power(job_s + 3)) / 1000.0,
            "{job_s} s job: exec {exec_j} J, collector {collector_j} J"
        );
        println!(
            "{job_s} s job: exec {exec_j:.0} J, collector {collector_j:.0} J, differ by \
             {diff:.0} J ({:.2} %)",
            100.0 * diff / exec_j
        );
    }
}

/// Minutes stored before an upgrade (computed by earlier attribution rules) are checked
/// for conservation only: their raw recomputation under today's rules would differ.
#[tokio::test]
async fn minutes_of_earlier_rules_are_checked_for_conservation_only() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("old.db").display());
    let store = gpufleet_collector::store::open(&url).await.expect("open");
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
/// cargo test --release -p gpufleet-collector --test it energy::open_minute_cost -- --ignored --nocapture
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

/// As a user sees it: a served collector (real accountant task, real clock) gets a 20 s
/// job from an agent that then stops. Its whole energy is in `/api/v1/containers` and in
/// `report` within 15 s (the accountant's period is 5 s), whatever second of the minute
/// the job ended in.
#[tokio::test]
async fn a_served_collector_shows_a_20_s_job_within_15_s_of_its_agent_stopping() {
    use gpufleet_proto::v1 as pb;
    use gpufleet_proto::v1::ingest_client::IngestClient;
    let c = start_collector(Default::default()).await;
    let mut client = IngestClient::connect(format!("http://{}", c.grpc))
        .await
        .expect("connect");
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(hello_message("job-node", vec![gpu_info_full("GPU-s", 0)]))
        .await
        .expect("hello");
    let mut answers = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(std::time::Duration::from_secs(10), answers.message())
            .await
            .expect("an answer")
            .expect("healthy")
            .expect("open")
            .msg
            .expect("a message")
    };
    assert!(matches!(
        next().await,
        pb::collector_message::Msg::Welcome(_)
    ));
    let end = gpufleet_core::config::now_ms() - 500;
    let ticks: Vec<Tick> = (0..=20u32)
        .map(|k| tick(end - 20_000 + i64::from(k) * 1000, &["GPU-s"], k))
        .collect();
    let batch = Batch {
        seq: 1,
        ticks,
        delivery: DeliveryStats::default(),
    };
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Batch(batch.into())),
    })
    .await
    .expect("send");
    assert!(matches!(next().await, pb::collector_message::Msg::Ack(_)));
    // The agent stops.
    drop(tx);
    drop(answers);
    let stopped = std::time::Instant::now();
    let key = format!("container:{}", "ab".repeat(32));
    // From the minute holding the job's first sample.
    let range = TimeRange {
        from_ms: gpufleet_collector::accounting::energy::minute_of(end - 20_000),
        to_ms: end + MIN,
    };
    let (row, waited) = loop {
        let rows = c
            .store
            .workload_energy(range, None, Some(&key))
            .await
            .expect("energy");
        let resident_ms: i64 = rows.iter().map(|r| r.gpu_ms).sum();
        if resident_ms == 20_000 {
            break (rows[0].clone(), stopped.elapsed());
        }
        assert!(
            stopped.elapsed() < std::time::Duration::from_secs(30),
            "not whole after 30 s: {rows:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        waited <= std::time::Duration::from_secs(15),
        "the job's energy took {waited:?}"
    );
    let (status, v) = api_get_json(
        &c.store,
        end + 15_000,
        &format!(
            "/api/v1/containers?from={}&to={}",
            range.from_ms, range.to_ms
        ),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["rows"][0]["key"], key);
    assert_eq!(v["rows"][0]["energy_mj"], row.energy_mj);
    let report = gpufleet_collector::accounting::report::build(
        c.store.as_ref(),
        &gpufleet_collector::accounting::report::ReportSubject::Container(key.clone()),
        range,
    )
    .await
    .expect("report");
    assert_eq!(
        report.energy.energy_j,
        Some(row.energy_mj as f64 / 1000.0),
        "{:?}",
        report.energy
    );
    println!("a 20 s job was whole {waited:?} after its agent stopped");
    c.stop().await;
}
