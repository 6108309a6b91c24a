//! Reports from a seeded store: the same energy as the energy API, GPU metrics from the
//! samples where the workload ran, every format, the plot, the CLI.

use crate::common::*;
use gpufleet_collector::accounting::accountant::{
    Accountant, EnergyOptions, IdleConfig, IdleWatts,
};
use gpufleet_collector::accounting::energy::IdlePolicy;
use gpufleet_collector::live::status::Clock;
use gpufleet_collector::store::Store;
use gpufleet_core::*;
use gpufleet_report::Report;
use gpufleet_sim::{SimOptions, simulator};
use std::sync::Arc;

const MIN: i64 = 60_000;
const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn clock_at(t: UnixMs) -> Clock {
    Arc::new(move || t)
}

fn process(uuid: &str, pid: u32, sm: u32, workload: Workload) -> ProcessSample {
    ProcessSample {
        gpu_uuid: uuid.into(),
        pid,
        sm_util_pct: Some(sm),
        gpu_mem_bytes: Some(4 << 30),
        workload,
        ..Default::default()
    }
}

/// Two minutes and a second of one GPU at 200 W, util 80 %, no temperature or memory
/// reported; container A (SM 60 %) throughout, B (SM 20 %) only in the first minute.
async fn seeded() -> (tempfile::TempDir, Arc<dyn Store>) {
    let (dir, store) = sqlite_store().await;
    let node = store
        .register_node(
            &hello("n1"),
            &inventory(vec![gpu_info_sparse("GPU-r", 0)]),
            T0,
        )
        .await
        .expect("register");
    let ticks = (0..=121)
        .map(|k: i64| {
            let mut processes = vec![process(
                "GPU-r",
                100,
                60,
                container_workload(A, Some("trainer")),
            )];
            if k < 60 {
                processes.push(process(
                    "GPU-r",
                    200,
                    20,
                    container_workload(B, Some("inference")),
                ));
            }
            Tick {
                time_ms: T0 + k * 1000,
                gpus: vec![GpuSample {
                    gpu_uuid: "GPU-r".into(),
                    util_gpu_pct: Some(if k < 60 { 80 } else { 40 }),
                    power_mw: Some(200_000),
                    power_limit_mw: Some(300_000),
                    energy_mj: Some(k as u64 * 200_000),
                    // GPM: tensor 60 % while both share the GPU (3 : 1), 20 % after.
                    gpm: GpmMetrics {
                        tensor_active_cpct: Some(if k < 60 { 6_000 } else { 2_000 }),
                        ..GpmMetrics::default()
                    },
                    ..Default::default()
                }],
                processes,
                ..Default::default()
            }
        })
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    let options = EnergyOptions {
        idle_policy: IdlePolicy::Spread,
        idle: IdleConfig {
            default: IdleWatts::Milliwatts(40_000),
            per_model: vec![],
        },
        ..Default::default()
    };
    Accountant::new(store.clone(), options, clock_at(T0))
        .pass()
        .await
        .expect("pass");
    (dir, store)
}

async fn get(store: &Arc<dyn Store>, uri: &str) -> (u16, String, Vec<u8>) {
    api_get(store, T0 + 10 * MIN, uri).await
}

async fn get_json(store: &Arc<dyn Store>, uri: &str) -> serde_json::Value {
    let (status, _, body) = get(store, uri).await;
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(status, 200, "{uri}: {v}");
    v
}

#[tokio::test]
async fn the_report_has_the_energy_api_figures_and_the_metrics_of_the_resident_samples() {
    let (_dir, store) = seeded().await;
    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    for key in [format!("container:{A}"), format!("container:{B}")] {
        let api = get_json(&store, &format!("/api/v1/containers/{key}?{range}")).await;
        let v = get_json(&store, &format!("/api/v1/report?container={key}&{range}")).await;
        let r: Report = serde_json::from_value(v).expect("a report");
        assert_eq!(r.subject.key, key);
        assert_eq!(r.energy.energy_j, api["energy_j"].as_f64(), "{key}");
        assert_eq!(r.energy.energy_kwh, api["energy_kwh"].as_f64());
        assert_eq!(r.energy.counter_j, api["method"]["counter_j"].as_f64());
        assert_eq!(r.energy.idle_j, api["idle_j"].as_f64());
        assert_eq!(
            r.energy.provisional_j,
            api["provisional_j"].as_f64(),
            "{key}: the open minute's energy, marked as the API marks it"
        );
        assert_eq!(r.gpus.len(), 1);
        assert_eq!(r.subject.nodes, ["n1"]);
        // No carbon provider, no temperature, no memory: absent, not 0.
        assert_eq!(r.carbon.carbon_g, None);
        assert_eq!(r.metrics.temp_gpu_avg_c, None);
        assert_eq!(r.metrics.mem_used_avg_bytes, None);
        assert_eq!(r.metrics.power_avg_w, Some(200.0));
        assert_eq!(r.metrics.power_limit_w, Some(300.0));
    }
    // B ran only in the first minute, when util was 80 %; A saw both 80 % and 40 %.
    let b: Report = serde_json::from_value(
        get_json(
            &store,
            &format!("/api/v1/report?container=container:{B}&{range}"),
        )
        .await,
    )
    .expect("report");
    assert_eq!(b.metrics.util_gpu_avg_pct, Some(80.0));
    assert_eq!(b.metrics.samples, 60);
    // GPM: the GPU's average over its samples; B's share ¼ of 60 % over its 59 s.
    assert_eq!(b.metrics.tensor_active_avg_pct, Some(60.0));
    assert_eq!(b.metrics.sm_active_avg_pct, None, "not reported: absent");
    assert_eq!(b.tensor_active_pct, Some(15.0));
    assert_eq!(b.sm_occupancy_pct, None);
    let a: Report = serde_json::from_value(
        get_json(&store, &format!("/api/v1/report?container={A}&{range}")).await,
    )
    .expect("report");
    assert_eq!(a.subject.name.as_deref(), Some("trainer"));
    let util = a.metrics.util_gpu_avg_pct.expect("util");
    assert!(util > 40.0 && util < 80.0, "{util}");

    // The pod holds A and B: their sum. The node: the GPU's whole energy, as /api/v1/energy.
    let pod: Report = serde_json::from_value(
        get_json(
            &store,
            &format!("/api/v1/report?pod=pod:0f7c2a8e-1111-2222-3333-444455556666&{range}"),
        )
        .await,
    )
    .expect("report");
    let sum = a.energy.energy_j.expect("a") + b.energy.energy_j.expect("b");
    assert!((pod.energy.energy_j.expect("pod") - sum).abs() < 1e-6);
    assert_eq!(pod.subject.name.as_deref(), Some("ml/trainer-0"));
    let energy = get_json(&store, &format!("/api/v1/energy?{range}")).await;
    let node: Report =
        serde_json::from_value(get_json(&store, &format!("/api/v1/report?node=n1&{range}")).await)
            .expect("report");
    assert_eq!(
        node.energy.energy_j,
        energy["nodes"]["n1"]["energy_j"].as_f64()
    );
    // 121 s at 200 W: the two closed minutes and the open one (provisional).
    assert_eq!(node.energy.energy_j, Some(24_200.0));
    assert_eq!(
        node.energy.provisional_j,
        Some(400.0),
        "the intervals ending at 120 s and 121 s"
    );
    assert_eq!(
        node.energy.provisional_j,
        energy["nodes"]["n1"]["provisional_j"].as_f64()
    );
    assert_eq!(a.energy.provisional_j, Some(400.0), "A alone holds the GPU");
    // Every format says so.
    let q = format!("node=n1&{range}");
    let (_, _, body) = get(&store, &format!("/api/v1/report?{q}&format=table")).await;
    let table = String::from_utf8(body).expect("utf-8");
    assert!(
        table.contains("400.0 J of it in minutes still open"),
        "{table}"
    );
    let (_, _, body) = get(&store, &format!("/api/v1/report?{q}&format=csv")).await;
    let csv = String::from_utf8(body).expect("utf-8");
    let (header, row) = csv.split_once('\n').expect("two lines");
    let i = header
        .split(',')
        .position(|h| h == "provisional_j")
        .expect("a provisional_j column");
    assert_eq!(row.split(',').nth(i), Some("400.000"), "{csv}");
    let (_, _, body) = get(&store, &format!("/api/v1/report?{q}&format=yaml")).await;
    let yaml = String::from_utf8(body).expect("utf-8");
    assert!(yaml.contains("provisional_j: 400.0"), "{yaml}");
}

#[tokio::test]
async fn every_format_the_plot_and_clear_errors_from_the_api() {
    let (_dir, store) = seeded().await;
    let q = format!("container={A}&from={T0}&to={}", T0 + 10 * MIN);
    let (status, ctype, body) = get(&store, &format!("/api/v1/report?{q}&format=yaml")).await;
    assert_eq!((status, ctype.as_str()), (200, "application/yaml"));
    let yaml = String::from_utf8(body).expect("utf-8");
    assert!(yaml.contains("carbon_g: null"), "{yaml}");
    assert!(
        !yaml.contains("series:"),
        "the series only on request: {yaml}"
    );
    let (_, _, body) = get(&store, &format!("/api/v1/report?{q}&series=true")).await;
    let r: Report = serde_json::from_slice(&body).expect("report");
    assert_eq!(r.series.len(), 1);
    assert!(r.series[0].points.len() > 100, "1 s buckets over 2 minutes");
    let (status, ctype, body) = get(&store, &format!("/api/v1/report?{q}&format=csv")).await;
    assert_eq!((status, ctype.as_str()), (200, "text/csv; charset=utf-8"));
    let csv = String::from_utf8(body).expect("utf-8");
    assert_eq!(csv.lines().count(), 2, "{csv}");
    assert!(csv.starts_with("subject_kind,subject_key,"), "{csv}");
    let (status, _, body) = get(&store, &format!("/api/v1/report?{q}&format=table")).await;
    assert_eq!(status, 200);
    let table = String::from_utf8(body).expect("utf-8");
    assert!(table.contains("Carbon           n/a"), "{table}");
    let (status, ctype, png) = get(
        &store,
        &format!("/api/v1/report/plot.png?{q}&width=640&height=800"),
    )
    .await;
    assert_eq!((status, ctype.as_str()), (200, "image/png"));
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    // Width and height in the IHDR chunk.
    assert_eq!(u32::from_be_bytes(png[16..20].try_into().expect("4")), 640);
    assert_eq!(u32::from_be_bytes(png[20..24].try_into().expect("4")), 800);

    for (uri, want) in [
        (format!("/api/v1/report?{q}&format=xml"), 400),
        (format!("/api/v1/report?{q}&node=n1"), 400),
        ("/api/v1/report".to_owned(), 400),
        (format!("/api/v1/report?container=nope&from={T0}"), 404),
        (format!("/api/v1/report?job=123&from={T0}"), 404),
        (format!("/api/v1/report/plot.png?{q}&width=5"), 400),
    ] {
        let (status, _, body) = get(&store, &uri).await;
        assert_eq!(status, want, "{uri}: {}", String::from_utf8_lossy(&body));
    }
}

#[tokio::test]
async fn the_cli_prints_the_report_and_writes_the_plot() {
    let (dir, store) = seeded().await;
    store.close().await;
    let db = format!("sqlite://{}", dir.path().join("test.db").display());
    let plot = dir.path().join("r.png");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args([
            "report",
            "--container",
            &format!("container:{A}"),
            "--db",
            &db,
        ])
        .args([
            "--from",
            &T0.to_string(),
            "--to",
            &(T0 + 10 * MIN).to_string(),
        ])
        .args(["--format", "json", "--plot"])
        .arg(&plot)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Report = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert!(r.energy.energy_j.expect("energy") > 0.0);
    assert!(std::fs::metadata(&plot).expect("plot").len() > 1000);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args([
            "report",
            "--job",
            "42",
            "--db",
            &db,
            "--from",
            "0",
            "--to",
            &T0.to_string(),
        ])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no energy for Slurm job \"42\""));
}

/// A simulated node (the demo's workloads) for five minutes: every workload's report
/// equals the energy API's row for it.
#[tokio::test]
async fn on_a_simulated_node_every_workload_report_matches_the_energy_api() {
    let (_dir, store) = sqlite_store().await;
    let mut sim = simulator(SimOptions::new("gpu-node-00", 4)).expect("sim");
    let inv = sim.inventory().expect("inventory");
    let node = store
        .register_node(&hello("gpu-node-00"), &inv, T0)
        .await
        .expect("register");
    let ticks: Vec<Tick> = (0..300)
        .map(|k| sim.sample(T0 + k * 1000).expect("tick"))
        .collect();
    for (i, chunk) in ticks.chunks(30).enumerate() {
        write_ticks(&store, &node, i as u64 + 1, chunk.to_vec()).await;
    }
    Accountant::new(store.clone(), EnergyOptions::default(), clock_at(T0))
        .pass()
        .await
        .expect("pass");
    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    let rows = get_json(&store, &format!("/api/v1/containers?{range}")).await;
    let rows = rows["rows"].as_array().expect("rows");
    assert!(rows.len() >= 2, "the simulator runs workloads");
    for row in rows {
        let key = row["key"].as_str().expect("key");
        let r: Report = serde_json::from_value(
            get_json(&store, &format!("/api/v1/report?container={key}&{range}")).await,
        )
        .expect("report");
        assert_eq!(r.energy.energy_j, row["energy_j"].as_f64(), "{key}");
        assert_eq!(r.gpus.len(), row["gpus"].as_array().expect("gpus").len());
        assert!(r.metrics.samples > 0, "{key} has resident samples");
    }
}

/// Priced by the carbon task (static 250 g/kWh, PUE 1.3): the report's carbon is the
/// energy API's, with its provenance, and the plot gets the intensity.
#[tokio::test]
async fn the_report_carries_the_stored_carbon_prices() {
    use gpufleet_carbon::{CarbonConfig, CarbonSettings, config::CarbonFile};
    use gpufleet_collector::accounting::carbon::{CarbonOptions, Pricer};
    let (_dir, store) = seeded().await;
    let config = CarbonConfig::new(
        CarbonSettings {
            carbon_g_per_kwh: Some(250.0),
            pue: 1.3,
            ..Default::default()
        },
        CarbonFile::default(),
    )
    .expect("carbon config");
    let options = CarbonOptions {
        config: Arc::new(config),
        ..Default::default()
    };
    Pricer::new(
        store.clone(),
        store.clone(),
        options,
        clock_at(T0 + 10 * MIN),
    )
    .run_once()
    .await
    .expect("pricing pass");
    let range = format!("from={T0}&to={}", T0 + 10 * MIN);
    for (q, api) in [
        (
            format!("container={A}"),
            format!("/api/v1/containers/container:{A}?{range}"),
        ),
        ("node=n1".to_owned(), format!("/api/v1/energy?{range}")),
    ] {
        let api = get_json(&store, &api).await;
        let api_g = api["carbon_g"]
            .as_f64()
            .or_else(|| api["total"]["carbon_g"].as_f64())
            .expect("the API has carbon");
        let r: Report = serde_json::from_value(
            get_json(&store, &format!("/api/v1/report?{q}&{range}&series=true")).await,
        )
        .expect("report");
        let g = r.carbon.carbon_g.expect("carbon");
        assert!((g - api_g).abs() < 1e-9, "{q}: {g} vs {api_g}");
        let kwh = r.energy.energy_kwh.expect("kwh");
        assert!(
            (g - kwh * 250.0 * 1.3).abs() < 1e-9,
            "{q}: {g} vs {}",
            kwh * 325.0
        );
        assert!((r.carbon.pue.expect("pue") - 1.3).abs() < 1e-12);
        assert_eq!(r.carbon.avg_intensity_g_per_kwh, Some(250.0));
        assert_eq!(r.carbon.sources, ["static"]);
        assert_eq!(r.carbon.priced_share, Some(1.0));
        assert_eq!(r.carbon.estimated_share, Some(0.0));
        assert!(!r.intensity.is_empty());
    }
}
