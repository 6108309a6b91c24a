//! End to end, several collectors on one database: two real `gpufleet-collector`
//! binaries on one database and two real `gpufleet-agent` binaries, each agent listing
//! both collectors (in opposite orders, so they start split across them).
//!
//! Asserts: `/api/v1/fleet` and `/api/v1/nodes` on either collector list both nodes
//! online, their latest samples advancing; the energy job is led by exactly one collector
//! (`gpufleet_collector_job_leader` on `/metrics`); after the leader is killed (SIGKILL)
//! its agent fails over to the survivor, which also takes the energy job over; once the
//! agents stop, everything they sampled is acked, and the database holds exactly that
//! (stored == sampled, no duplicate (GPU, time) rows).
//!
//! Run on the supported setup, PostgreSQL (the test server, a schema of its own;
//! `--follow-store auto` follows there, the leases are advisory locks), and on a SQLite
//! file in WAL mode shared by both processes on this host (the leases are lock files,
//! `--follow-store 200ms` turns following on).

use crate::common::wait_until;
use crate::harness::{agent_bin, sigterm, start_collector, stop_agents};
use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

use crate::common;

const GPUS: u32 = 2;
const NODES: [&str; 2] = ["multi-e2e-a", "multi-e2e-b"];

async fn get(client: &reqwest::Client, url: &str) -> Option<String> {
    let resp = client
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    serde_json::from_str(&get(client, url).await?).ok()
}

/// Per node listed online with a latest sample on every GPU by `endpoint`
/// (`nodes` or `fleet`): (name, newest GPU sample time, connected here).
async fn online(client: &reqwest::Client, http: &str, endpoint: &str) -> Vec<(String, i64, bool)> {
    let Some(nodes) = get_json(client, &format!("http://{http}/api/v1/{endpoint}")).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for n in nodes.as_array().into_iter().flatten() {
        let times = n["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| g["latest"]["time_ms"].as_i64())
            .collect::<Option<Vec<i64>>>()
            .unwrap_or_default();
        if n["status"] == "online" && times.len() == GPUS as usize {
            out.push((
                n["name"].as_str().unwrap_or_default().to_owned(),
                times.into_iter().max().unwrap_or(0),
                n["connected"] == true,
            ));
        }
    }
    out
}

/// Whether `/metrics` of `http` says this collector leads the energy job.
async fn leads_energy(client: &reqwest::Client, http: &str) -> Option<bool> {
    let m = get(client, &format!("http://{http}/metrics")).await?;
    m.lines()
        .find_map(|l| l.strip_prefix("gpufleet_collector_job_leader{job=\"energy\"} "))
        .map(|v| v.trim() == "1")
}

fn agent(collectors: [&str; 2], node: &str, spool: &std::path::Path) -> Child {
    Command::new(agent_bin())
        .args(["run", "--node", node])
        .args(["--collector", &format!("http://{}", collectors[0])])
        .args(["--collector", &format!("http://{}", collectors[1])])
        .arg("--spool-dir")
        .arg(spool)
        .args(["--interval", "150ms", "--simulate", "--sim-gpus"])
        .arg(GPUS.to_string())
        .env("GPUFLEET_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-agent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_one_sqlite_file_agents_fail_over_and_the_job_moves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = format!("sqlite://{}", dir.path().join("shared.db").display());
    // Create the schema once, so the two collectors do not race to migrate it.
    gpufleet_collector::store::open(&db_url)
        .await
        .expect("create the database")
        .close()
        .await;
    let sampled = fail_over(&db_url, &["--follow-store", "200ms"], dir.path()).await;
    let pool = sqlx::SqlitePool::connect(&db_url)
        .await
        .expect("open the db");
    for (name, want) in NODES.iter().zip(&sampled) {
        let (rows, distinct): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COUNT(DISTINCT s.gpu_id || ':' || s.ts_ms) FROM gpu_samples s
             JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id WHERE n.name = ?",
        )
        .bind(*name)
        .fetch_one(&pool)
        .await
        .expect("count");
        assert_eq!(rows as u64, *want, "{name}: stored == sampled");
        assert_eq!(rows, distinct, "{name}: no duplicate (GPU, time) rows");
    }
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_one_postgres_database_agents_fail_over_and_the_job_moves() {
    let schema = common::PgSchema::create().await;
    let url = schema.url();
    // Migrate once up front (concurrent migrations would only wait on sqlx's lock).
    gpufleet_collector::store::open(&url)
        .await
        .expect("migrate the test schema")
        .close()
        .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let sampled = fail_over(&url, &[], dir.path()).await;
    let mut conn = common::pg_connect(&url).await;
    for (name, want) in NODES.iter().zip(&sampled) {
        let (rows, distinct): (i64, i64) = sqlx::query_as(
            "SELECT COUNT(*), COUNT(DISTINCT (s.gpu_id, s.ts_ms)) FROM gpu_samples s
             JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id WHERE n.name = $1",
        )
        .bind(*name)
        .fetch_one(&mut conn)
        .await
        .expect("count");
        assert_eq!(rows as u64, *want, "{name}: stored == sampled");
        assert_eq!(rows, distinct, "{name}: no duplicate (GPU, time) rows");
    }
}

/// Two collectors on `db_url` (with `extra` flags), two agents split across them; kills
/// the energy leader and checks failover (see the module docs). Returns the GPU samples
/// each agent (in [`NODES`] order) sampled, all acked, for the caller to count in the
/// database.
async fn fail_over(db_url: &str, extra: &[&str], dir: &std::path::Path) -> Vec<u64> {
    let mut collectors = vec![
        start_collector(db_url, "127.0.0.1:0", "127.0.0.1:0", extra).await,
        start_collector(db_url, "127.0.0.1:0", "127.0.0.1:0", extra).await,
    ];
    let grpc = [collectors[0].grpc.clone(), collectors[1].grpc.clone()];
    let http = [collectors[0].http.clone(), collectors[1].http.clone()];
    let agents = [
        agent([&grpc[0], &grpc[1]], NODES[0], &dir.join("spool-a")),
        agent([&grpc[1], &grpc[0]], NODES[1], &dir.join("spool-b")),
    ];

    // --- either collector lists both nodes live, the latest samples advancing
    let client = reqwest::Client::new();
    for (i, h) in http.iter().enumerate() {
        for endpoint in ["fleet", "nodes"] {
            let first = wait_until(
                &format!("both nodes online in /api/v1/{endpoint} of collector {i}"),
                Duration::from_secs(30),
                async || {
                    let n = online(&client, h, endpoint).await;
                    (n.len() == 2).then_some(n)
                },
            )
            .await;
            assert_eq!(
                first.iter().filter(|n| n.2).count(),
                1,
                "collector {i}: one node streams here, the other to the other: {first:?}"
            );
            wait_until(
                &format!("the latest samples to advance in /api/v1/{endpoint} of collector {i}"),
                Duration::from_secs(10),
                async || {
                    let now = online(&client, h, endpoint).await;
                    (now.len() == 2 && now.iter().zip(&first).all(|(n, f)| n.0 == f.0 && n.1 > f.1))
                        .then_some(())
                },
            )
            .await;
        }
    }

    // --- the energy job runs on exactly one collector
    let leader = wait_until(
        "exactly one energy leader",
        Duration::from_secs(15),
        async || match [
            leads_energy(&client, &http[0]).await,
            leads_energy(&client, &http[1]).await,
        ] {
            [Some(true), Some(false)] => Some(0),
            [Some(false), Some(true)] => Some(1),
            _ => None,
        },
    )
    .await;
    let survivor = 1 - leader;

    // --- kill the leader: its agent fails over, the survivor takes the job over
    let mut gone = collectors.remove(leader);
    gone.child
        .start_kill()
        .expect("SIGKILL the leading collector");
    gone.child.wait().await.expect("reap");
    let killed_at = gpufleet_core::config::now_ms();
    let killed = Instant::now();
    let alive = &http[survivor];
    wait_until(
        "both agents streaming to the survivor, samples newer than the kill",
        Duration::from_secs(30),
        async || {
            let n = online(&client, alive, "nodes").await;
            (n.len() == 2
                && n.iter()
                    .all(|(_, t, connected)| *connected && *t > killed_at))
            .then_some(())
        },
    )
    .await;
    let failed_over = killed.elapsed();
    wait_until(
        "the survivor to lead the energy job",
        Duration::from_secs(15),
        async || (leads_energy(&client, alive).await == Some(true)).then_some(()),
    )
    .await;

    let took_over = killed.elapsed();
    eprintln!(
        "leader SIGKILLed: agents streaming to the survivor after {} ms, energy job led there after {} ms",
        failed_over.as_millis(),
        took_over.as_millis()
    );

    // --- stop the agents: all they sampled is acked and stored exactly once
    let sampled = stop_agents(agents, &NODES).await;
    for (s, name) in sampled.iter().zip(NODES) {
        assert!(*s > 0, "{name} sampled");
    }
    let nodes = get_json(&client, &format!("http://{alive}/api/v1/nodes"))
        .await
        .expect("nodes");
    for (name, want) in NODES.iter().zip(&sampled) {
        let listed = nodes
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"] == *name)
            .unwrap_or_else(|| panic!("{name} listed: {nodes}"));
        assert_eq!(
            listed["stored_samples"].as_u64(),
            Some(*want),
            "{name}: the survivor's API counts what is stored"
        );
    }

    let mut last = collectors.remove(0).child;
    sigterm(&last);
    let status = tokio::time::timeout(Duration::from_secs(30), last.wait())
        .await
        .expect("the survivor stops within 30 s")
        .expect("wait");
    assert!(status.success(), "the survivor exited with {status}");
    eprintln!("GPU samples sampled == acked == stored per node: {sampled:?}");
    sampled
}
