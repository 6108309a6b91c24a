//! End to end: the real `gpufleet-collector` and two real `gpufleet-agent` binaries
//! (simulated, 4 GPUs each) on ephemeral loopback ports with a temp SQLite file.
//!
//! Asserts: both nodes listed with 4 GPUs; stored GPU samples == what each agent says it
//! sampled (from its exit summary), in the API and in the database; every stored metric
//! value equals what a fresh simulator with the same seed produces for the same
//! timestamps; a metric the simulated boards do not support (fan) is absent in the store
//! and the API, never 0.

use crate::harness::{agent_bin, sigterm, start_collector, stop_agents, wait_stored};
use gpufleet_core::GpuSource;
use gpufleet_sim::{SimOptions, simulator};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

use crate::harness;

const SEED: u64 = 4242;
const GPUS: u32 = 4;
const NODES: [&str; 2] = ["e2e-node-a", "e2e-node-b"];
/// Ticks per node to wait for before stopping the agents.
const MIN_TICKS: u64 = 15;

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    let resp = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert!(resp.status().is_success(), "GET {url}: {}", resp.status());
    resp.json().await.expect("JSON body")
}

fn node<'a>(nodes: &'a Value, name: &str) -> &'a Value {
    nodes
        .as_array()
        .expect("nodes is an array")
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("node {name} not listed: {nodes}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_stream_into_sqlite_and_every_value_reads_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_path = dir.path().join("e2e.db");
    let db_url = format!("sqlite://{}", db_path.display());

    // --- collector on ephemeral ports
    let harness::Collector {
        child: mut collector,
        grpc,
        http,
    } = start_collector(&db_url, "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let http_addr = http;
    let http = format!("http://{http_addr}");

    // --- two simulated agents
    let agents: Vec<Child> = NODES
        .iter()
        .map(|name| {
            Command::new(agent_bin())
                .args([
                    "run",
                    "--collector",
                    &format!("http://{grpc}"),
                    "--node",
                    name,
                ])
                .arg("--spool-dir")
                .arg(dir.path().join(format!("spool-{name}")))
                .args([
                    "--interval",
                    "150ms",
                    "--simulate",
                    "--sim-gpus",
                    &GPUS.to_string(),
                ])
                .args(["--sim-seed", &SEED.to_string()])
                .env("GPUFLEET_LOG", "warn")
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("start gpufleet-agent")
        })
        .collect();

    // --- wait until both nodes have enough stored
    wait_stored(&http_addr, &NODES, MIN_TICKS * GPUS as u64).await;
    let client = reqwest::Client::new();

    // --- stop the agents cleanly; each reports what it sampled
    let sampled = stop_agents(agents, &NODES).await;
    for (s, name) in sampled.iter().zip(NODES) {
        assert_eq!(s % GPUS as u64, 0, "{name}: whole ticks");
    }

    // --- the API lists both nodes with 4 GPUs and the exact stored counts
    let nodes = get_json(&client, &format!("{http}/api/v1/nodes")).await;
    for (name, s) in NODES.iter().zip(&sampled) {
        let n = node(&nodes, name);
        assert_eq!(
            n["gpus"].as_array().map(Vec::len),
            Some(GPUS as usize),
            "{name}: {n}"
        );
        assert_eq!(
            n["stored_samples"].as_u64(),
            Some(*s),
            "{name}: stored == sampled"
        );
        for g in n["gpus"].as_array().into_iter().flatten() {
            assert!(
                g["latest"]["fan_pct"].is_null(),
                "unsupported fan must be null: {g}"
            );
            assert!(
                g["latest"]["power_mw"].as_u64().is_some_and(|p| p > 0),
                "power present: {g}"
            );
        }
    }

    // --- the database agrees, and the unsupported metric is NULL there too
    let pool = sqlx::SqlitePool::connect(&db_url)
        .await
        .expect("open the collector's db");
    for (name, s) in NODES.iter().zip(&sampled) {
        let (rows, fan_not_null): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COUNT(s.fan_pct) FROM gpu_samples s
             JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id WHERE n.name = ?",
        )
        .bind(*name)
        .fetch_one(&pool)
        .await
        .expect("count");
        assert_eq!(rows as u64, *s, "{name}: rows in gpu_samples == sampled");
        assert_eq!(fan_not_null, 0, "{name}: fan stored as NULL, never 0");
    }
    pool.close().await;

    // --- every value read back equals what the simulator produced at those instants
    for name in NODES {
        let mut opts = SimOptions::new(name, GPUS);
        opts.seed = Some(SEED);
        let mut sim = simulator(opts).expect("simulator");
        let inventory = sim.inventory().expect("inventory");
        let n = node(&nodes, name);
        for (g, gpu) in inventory.gpus.iter().enumerate() {
            let listed = &n["gpus"][g];
            assert_eq!(
                listed["uuid"],
                gpu.uuid.as_str(),
                "{name}: inventory uuid of GPU {g}"
            );
            assert_eq!(listed["name"], gpu.name.as_str());
        }
        let metrics: Vec<String> = {
            let err = client
                .get(format!(
                    "{http}/api/v1/gpus/{}/series?metric=nope",
                    inventory.gpus[0].uuid
                ))
                .send()
                .await
                .expect("GET");
            assert_eq!(err.status(), 400);
            // The 400 lists the valid metrics; compare them all.
            let body: Value = err.json().await.expect("json");
            let msg = body["error"].as_str().expect("error message").to_owned();
            let list = msg
                .rsplit("valid metrics: ")
                .next()
                .expect("list")
                .to_owned();
            list.split(", ").map(str::to_owned).collect()
        };
        assert!(
            metrics.len() >= 20 && metrics.contains(&"energy_mj".to_owned()),
            "{metrics:?}"
        );

        // Stored timestamps, from one metric of GPU 0 over all time.
        let uuid0 = &inventory.gpus[0].uuid;
        let series = |uuid: &str, metric: &str| {
            format!("{http}/api/v1/gpus/{uuid}/series?metric={metric}&from=0&to=now")
        };
        let ts: Vec<i64> = get_json(&client, &series(uuid0, "power_mw")).await["points"]
            .as_array()
            .expect("points")
            .iter()
            .map(|p| p[0].as_i64().expect("t"))
            .collect();
        let ticks: Vec<_> = ts.iter().map(|t| sim.sample(*t).expect("sample")).collect();
        let mut compared = 0usize;
        for gpu in &inventory.gpus {
            for metric in &metrics {
                let got = get_json(&client, &series(&gpu.uuid, metric)).await;
                let points = got["points"].as_array().expect("points");
                assert_eq!(
                    points.len(),
                    ticks.len(),
                    "{name} {} {metric}: one point per tick",
                    gpu.uuid
                );
                for (p, tick) in points.iter().zip(&ticks) {
                    let expected = tick
                        .gpus
                        .iter()
                        .find(|s| s.gpu_uuid == gpu.uuid)
                        .expect("gpu in tick");
                    let want =
                        serde_json::to_value(expected).expect("json")[metric.as_str()].clone();
                    assert_eq!(p[0].as_i64(), Some(tick.time_ms));
                    assert_eq!(
                        p[1].as_f64(),
                        want.as_f64(),
                        "{name} {} {metric} at {}: stored {} vs simulated {}",
                        gpu.uuid,
                        tick.time_ms,
                        p[1],
                        want
                    );
                    compared += 1;
                }
            }
        }
        assert!(compared > 1000, "compared {compared} values");
    }

    // --- clean collector shutdown
    sigterm(&collector);
    let status = tokio::time::timeout(Duration::from_secs(30), collector.wait())
        .await
        .expect("collector exits after SIGTERM")
        .expect("wait");
    assert!(status.success(), "collector exit: {status}");
}
