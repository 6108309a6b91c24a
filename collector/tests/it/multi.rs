//! Several collectors, one database: job leases and following the store.
//!
//! - `postgres_leases_*`: the PostgreSQL advisory-lock lease on the test server
//!   (`GPUFLEET_TEST_PG_URL`, default 127.0.0.1:5432, user postgres, database test):
//!   exclusive, released when dropped, lost (and taken over) when its session is
//!   terminated, and separate per schema.
//! - `the_follower_*`: one pass of the store follower against commits that did not go
//!   through this live state (another collector's).
//! - `two_collectors_on_one_sqlite_file_*`: two in-process collectors on one SQLite file
//!   (WAL), a simulated agent on each: both show both nodes live, the energy job runs on
//!   exactly one, and moves to the other when it stops.

use crate::common::{
    T0, batch, gpu_info_full, hello, inventory, metric_value, node_batch, register_gpus, wait_until,
};
use gpufleet_collector::accounting::leader::LeadOptions;
use gpufleet_collector::live::follow::FollowMode;
use gpufleet_collector::live::follow::follow_once;
use gpufleet_collector::live::state::Live;
use gpufleet_collector::store::{self, TimeRange, lease};
use gpufleet_collector::{ServeOptions, serve_with_store};
use gpufleet_sim::{SimOptions, simulator};
use gpufleet_uplink::{RunOptions, run_agent};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::common;

async fn pg_pool(url: &str, app: &str) -> sqlx::PgPool {
    use std::str::FromStr;
    let options = sqlx::postgres::PgConnectOptions::from_str(url)
        .expect("url")
        .application_name(app);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "this test needs the test PostgreSQL server ({}, trust auth): {e}. \
                 Start it (e.g. `pg_ctlcluster 15 main start`) or set GPUFLEET_TEST_PG_URL.",
                store::redact_url(url)
            )
        })
}

/// A name no other test run uses.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_leases_are_exclusive_released_on_drop_and_lost_with_their_session() {
    let app_a = unique("gpufleet-lease-a");
    let app_b = unique("gpufleet-lease-b");
    let url = common::pg_url();
    let (pool_a, pool_b) = (pg_pool(&url, &app_a).await, pg_pool(&url, &app_b).await);
    let job = unique("test-job");

    let a = lease::postgres(&pool_a, &job)
        .await
        .expect("ask")
        .expect("the first asker leads");
    assert!(
        lease::postgres(&pool_b, &job).await.expect("ask").is_none(),
        "held by a"
    );
    assert!(
        lease::postgres(&pool_b, &unique("other-job"))
            .await
            .expect("ask")
            .is_some(),
        "another job is free"
    );
    drop(a);
    let b = wait_until(
        "b to lead once a dropped its lease",
        Duration::from_secs(10),
        async || lease::postgres(&pool_b, &job).await.expect("ask"),
    )
    .await;
    assert!(!b.is_lost());
    assert!(lease::postgres(&pool_a, &job).await.expect("ask").is_none());

    // The leader's database sessions end (a crashed collector, a failover): the lease is
    // lost there and free for the next asker.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&app_b)
    .fetch_all(&pool_a)
    .await
    .expect("terminate b's sessions");
    assert!(!killed.is_empty(), "b's sessions found");
    tokio::time::timeout(lease::PG_CHECK_EVERY * 3, b.lost())
        .await
        .expect("b notices that its lease is lost");
    let _a = wait_until(
        "a to take the lease over",
        Duration::from_secs(10),
        async || lease::postgres(&pool_a, &job).await.expect("ask"),
    )
    .await;
}

#[tokio::test]
async fn postgres_leases_of_different_schemas_are_independent() {
    let (one, two) = (
        common::PgSchema::create().await,
        common::PgSchema::create().await,
    );
    let a = pg_pool(&one.url(), &unique("gpufleet-schema-a")).await;
    let b = pg_pool(&two.url(), &unique("gpufleet-schema-b")).await;
    let _held = lease::postgres(&a, "energy")
        .await
        .expect("ask")
        .expect("leads");
    assert!(
        lease::postgres(&b, "energy").await.expect("ask").is_some(),
        "another schema (another deployment) has its own lease"
    );
    assert!(
        lease::postgres(&a, "energy").await.expect("ask").is_none(),
        "the same schema shares it"
    );
}

async fn get_json(client: &reqwest::Client, url: &str) -> Option<Value> {
    let resp = client.get(url).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.json().await.ok()
}

async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .expect("body")
}

/// Every node `http` lists as online with a latest sample per GPU: name -> newest GPU
/// sample time.
async fn live_nodes(client: &reqwest::Client, http: &str) -> Vec<(String, i64)> {
    let Some(nodes) = get_json(client, &format!("http://{http}/api/v1/nodes")).await else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for n in nodes.as_array().into_iter().flatten() {
        let gpus = n["gpus"].as_array().cloned().unwrap_or_default();
        let newest = gpus
            .iter()
            .map(|g| g["latest"]["time_ms"].as_i64())
            .collect::<Option<Vec<i64>>>();
        if let (Some(name), "online", Some(times)) = (
            n["name"].as_str(),
            n["status"].as_str().unwrap_or(""),
            newest,
        ) && !times.is_empty()
        {
            out.push((name.to_owned(), times.into_iter().max().unwrap_or(0)));
        }
    }
    out
}

fn leads(metrics: &str, job: &str) -> Option<bool> {
    let line = format!("gpufleet_collector_job_leader{{job=\"{job}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .map(|v| v.trim() == "1")
}

/// Passes of `task` that this collector ran and that succeeded, if it ran any.
fn passes_ok(metrics: &str, task: &str) -> Option<f64> {
    let series =
        format!("gpufleet_collector_background_passes_total{{task=\"{task}\",result=\"ok\"}}");
    metric_value(metrics, &series)
}

struct Running {
    http: String,
    grpc: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), gpufleet_collector::ServeError>>,
}

async fn start(db_url: &str) -> Running {
    let store = store::open(db_url)
        .await
        .expect("open the shared SQLite file");
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let http = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let (grpc_addr, http_addr) = (
        grpc.local_addr().expect("addr"),
        http.local_addr().expect("addr"),
    );
    let stop = CancellationToken::new();
    let options = ServeOptions {
        follow: FollowMode::Every(Duration::from_millis(100)),
        lead: LeadOptions {
            retry: Duration::from_millis(100),
        },
        ..Default::default()
    };
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            let r = serve_with_store(Arc::clone(&store), options, grpc, http, stop).await;
            store.close().await;
            r
        }
    });
    Running {
        http: http_addr.to_string(),
        grpc: grpc_addr.to_string(),
        stop,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_collectors_on_one_sqlite_file_show_every_node_and_run_the_job_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db_url = format!("sqlite://{}", dir.path().join("shared.db").display());
    // Open once first so the two collectors do not race to create the schema.
    store::open(&db_url).await.expect("create").close().await;
    let collectors = [start(&db_url).await, start(&db_url).await];

    let agents_stop = CancellationToken::new();
    let mut agents = Vec::new();
    for (i, node) in ["multi-a", "multi-b"].iter().enumerate() {
        let sim = simulator(SimOptions::new(*node, 2)).expect("simulator");
        let mut run = RunOptions::new(*node, vec![format!("http://{}", collectors[i].grpc)]);
        run.interval = Duration::from_millis(200);
        agents.push(tokio::spawn(run_agent(
            run,
            Box::new(sim),
            agents_stop.clone(),
        )));
    }

    let client = reqwest::Client::new();
    // Both collectors list both nodes online with samples, and the samples advance.
    for c in &collectors {
        let first = wait_until(
            "both nodes live on each collector",
            Duration::from_secs(20),
            async || {
                let nodes = live_nodes(&client, &c.http).await;
                (nodes.len() == 2).then_some(nodes)
            },
        )
        .await;
        wait_until(
            "the latest samples to advance",
            Duration::from_secs(10),
            async || {
                let now = live_nodes(&client, &c.http).await;
                (now.len() == 2 && now.iter().zip(&first).all(|(n, f)| n.0 == f.0 && n.1 > f.1))
                    .then_some(())
            },
        )
        .await;
        let fleet = get_json(&client, &format!("http://{}/api/v1/fleet", c.http))
            .await
            .expect("fleet");
        assert_eq!(
            fleet.as_array().map(Vec::len),
            Some(2),
            "the fleet lists both nodes: {fleet}"
        );
    }

    // The energy job runs on exactly one of them.
    let leader = wait_until("one energy leader", Duration::from_secs(10), async || {
        let mut flags = Vec::new();
        for c in &collectors {
            flags.push(leads(
                &get_text(&client, &format!("http://{}/metrics", c.http)).await,
                "energy",
            ));
        }
        match flags.as_slice() {
            [Some(true), Some(false)] => Some(0),
            [Some(false), Some(true)] => Some(1),
            _ => None,
        }
    })
    .await;
    // Each task's passes are counted where it runs, and only there: the energy job's on
    // its leader; the rollup task's, with its retention and packing (both due at its
    // first pass), on the rollups leader.
    let rollups = wait_until(
        "the rollup task's passes",
        Duration::from_secs(10),
        async || {
            for (i, c) in collectors.iter().enumerate() {
                let m = get_text(&client, &format!("http://{}/metrics", c.http)).await;
                if leads(&m, "rollups") == Some(true)
                    && ["rollups", "retention", "packing"]
                        .iter()
                        .all(|task| passes_ok(&m, task).is_some_and(|n| n >= 1.0))
                {
                    return Some(i);
                }
            }
            None
        },
    )
    .await;
    for (i, c) in collectors.iter().enumerate() {
        let m = get_text(&client, &format!("http://{}/metrics", c.http)).await;
        let energy = passes_ok(&m, "energy");
        assert_eq!(
            energy.is_some_and(|n| n >= 1.0),
            i == leader,
            "energy passes: {m}"
        );
        assert_eq!(
            passes_ok(&m, "rollups").is_some(),
            i == rollups,
            "rollup passes: {m}"
        );
    }
    let [first, second] = collectors;
    let (gone, survivor) = if leader == 0 {
        (first, second)
    } else {
        (second, first)
    };
    gone.stop.cancel();
    gone.task.await.expect("join").expect("clean stop");
    wait_until(
        "the survivor to take the energy job over",
        Duration::from_secs(10),
        async || {
            let m = get_text(&client, &format!("http://{}/metrics", survivor.http)).await;
            (leads(&m, "energy") == Some(true)).then_some(())
        },
    )
    .await;

    agents_stop.cancel();
    for a in agents {
        let _ = a.await;
    }
    survivor.stop.cancel();
    survivor.task.await.expect("join").expect("clean stop");
}

#[tokio::test]
async fn the_follower_takes_new_nodes_and_ticks_flags_late_data_and_leaves_own_nodes_alone() {
    let (_dir, store) = common::sqlite_store().await;
    follower_contract(store).await;
}

#[tokio::test]
async fn the_follower_on_postgres_takes_new_nodes_and_ticks_and_flags_late_data() {
    let (_schema, store) = common::pg_store().await;
    follower_contract(store).await;
}

async fn follower_contract(store: Arc<dyn store::Store>) {
    let live = Live::new();
    let gpus = ["GPU-follow-0", "GPU-follow-1"];
    let inv = inventory(vec![gpu_info_full(gpus[0], 0), gpu_info_full(gpus[1], 1)]);
    let rec = store
        .register_node(&hello("elsewhere"), &inv, T0)
        .await
        .expect("register");

    // A node registered through another collector appears, without samples yet.
    assert_eq!(follow_once(store.as_ref(), &live).await.expect("pass"), 0);
    live.read(|s| {
        let n = &s.nodes["elsewhere"];
        assert_eq!(
            (n.connections, n.record.gpus.len(), n.gpus.len()),
            (0, 2, 0)
        );
    });

    // Its ticks arrive: the newest become the latest samples and are announced.
    let mut rx = live.subscribe();
    store
        .write_batches(&[node_batch(&rec, batch(1, T0 + 10_000, 3, &gpus))])
        .await
        .expect("write");
    assert_eq!(follow_once(store.as_ref(), &live).await.expect("pass"), 3);
    live.read(|s| {
        let n = &s.nodes["elsewhere"];
        assert_eq!(n.record.last_seen_ms, Some(T0 + 12_000));
        assert_eq!((n.record.stored_samples, n.record.last_acked_seq), (6, 1));
        assert_eq!(n.gpus.len(), 2);
        assert!(n.gpus.values().all(|g| g.time_ms == T0 + 12_000));
        assert_eq!(n.host.as_ref().map(|h| h.time_ms), Some(T0 + 12_000));
    });
    let announced = rx.try_recv().expect("announced");
    assert_eq!(announced.node, "elsewhere");
    assert_eq!(announced.batch.ticks.len(), 3);
    let written = batch(1, T0 + 10_000, 3, &gpus);
    assert_eq!(
        announced.batch.ticks, written.ticks,
        "the ticks read back are the ticks written"
    );
    assert!(!live.take_late_data());
    // Nothing new: nothing read, nothing announced.
    assert_eq!(follow_once(store.as_ref(), &live).await.expect("pass"), 0);
    assert!(rx.try_recv().is_err());

    // Older data stored elsewhere (a replayed spool): counted, and the accountant is told.
    store
        .write_batches(&[node_batch(&rec, batch(2, T0, 2, &gpus))])
        .await
        .expect("write");
    assert_eq!(follow_once(store.as_ref(), &live).await.expect("pass"), 0);
    assert!(live.take_late_data(), "late data noted");
    live.read(|s| {
        let n = &s.nodes["elsewhere"];
        assert_eq!((n.record.stored_samples, n.record.last_acked_seq), (10, 2));
        assert_eq!(n.record.last_seen_ms, Some(T0 + 12_000));
    });

    // Once the node streams to this collector, its own commits keep it current.
    live.connected(rec.clone());
    store
        .write_batches(&[node_batch(&rec, batch(3, T0 + 20_000, 1, &gpus))])
        .await
        .expect("write");
    assert_eq!(follow_once(store.as_ref(), &live).await.expect("pass"), 0);
    live.read(|s| assert_eq!(s.nodes["elsewhere"].record.last_seen_ms, Some(T0 + 12_000)));
}

#[tokio::test]
async fn many_nodes_ticks_in_one_read_are_the_newest_written_on_sqlite() {
    let (_dir, store) = common::sqlite_store().await;
    nodes_ticks_contract(store).await;
}

#[tokio::test]
async fn many_nodes_ticks_in_one_read_are_the_newest_written_on_postgres() {
    let (_schema, store) = common::pg_store().await;
    nodes_ticks_contract(store).await;
}

/// `Store::nodes_ticks` (the follower's one read per pass) answers, node for node, the
/// newest ticks written in the node's own range, up to the per-node limit: nodes of
/// different GPU counts, one without ticks, events and processes.
async fn nodes_ticks_contract(store: Arc<dyn store::Store>) {
    use gpufleet_core::{Event, EventKind};
    let shapes: [(&str, &[&str], u32); 3] = [
        ("wide", &["GPU-w-0", "GPU-w-1", "GPU-w-2"], 6),
        ("narrow", &["GPU-n-0"], 4),
        ("quiet", &["GPU-q-0", "GPU-q-1"], 0),
    ];
    let mut records = Vec::new();
    let mut written = Vec::new();
    for (name, gpus, ticks) in shapes {
        let rec = register_gpus(&store, name, gpus, T0).await;
        let mut b = batch(1, T0 + 1000, ticks, gpus);
        if ticks > 0 {
            let at = b.ticks[2].time_ms;
            b.ticks[2].events.push(Event {
                time_ms: at,
                gpu_uuid: gpus[0].into(),
                kind: EventKind::Xid,
                code: Some(79),
                detail: "fell off the bus".into(),
            });
            store
                .write_batches(&[node_batch(&rec, b.clone())])
                .await
                .expect("write");
        }
        written.push(b.ticks);
        records.push(rec);
    }
    assert!(store.nodes_ticks(&[], 600).await.expect("none").is_empty());
    let ranges = [
        TimeRange {
            from_ms: T0,
            to_ms: T0 + 60_000,
        },
        TimeRange {
            from_ms: T0 + 2000,
            to_ms: T0 + 3000,
        },
        TimeRange {
            from_ms: T0,
            to_ms: T0 + 60_000,
        },
    ];
    for limit in [600, 2] {
        let wanted: Vec<(&store::NodeRecord, TimeRange)> = records.iter().zip(ranges).collect();
        let together = store.nodes_ticks(&wanted, limit).await.expect("together");
        assert_eq!(together.len(), 3);
        for (((node, range), got), ticks) in wanted.iter().zip(&together).zip(&written) {
            // The newest `limit` of the ticks written in its range, as written.
            let mut want: Vec<_> = ticks
                .iter()
                .filter(|t| (range.from_ms..=range.to_ms).contains(&t.time_ms))
                .cloned()
                .collect();
            want.drain(..want.len().saturating_sub(limit));
            assert_eq!(got, &want, "{} at limit {limit}", node.name);
        }
        assert_eq!(together[0].len(), limit.min(6));
        assert_eq!(together[1].len(), 2);
        assert!(together[2].is_empty());
    }
    // The event and the processes come back with their tick.
    let wanted = [(&records[0], ranges[0])];
    let wide = &store.nodes_ticks(&wanted, 600).await.expect("wide")[0];
    assert_eq!(wide[2].events.len(), 1);
    assert_eq!(wide[2].events[0].code, Some(79));
    assert!(
        wide.iter()
            .all(|t| t.processes.len() == 2 && t.gpus.len() == 3)
    );
}

/// What one follower pass costs at 1,000 nodes × 8 GPUs (`--ignored`; figures in
/// BENCHMARKS.md): with nothing new (one collector, or nothing committed elsewhere), and
/// with one new tick on every node (what a second collector sees each second when the
/// other one receives the whole fleet at 1 Hz).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run with --ignored --nocapture"]
async fn follow_pass_cost_at_1000_nodes() {
    let (_dir, sqlite) = common::sqlite_store().await;
    let (_schema, pg) = common::pg_store().await;
    for (backend, store) in [("sqlite", sqlite), ("postgres", pg)] {
        let nodes = 1000u32;
        let mut records = Vec::new();
        for n in 0..nodes {
            let uuids: Vec<String> = (0..8).map(|g| format!("GPU-bench-{n}-{g}")).collect();
            let rec = register_gpus(&store, &format!("bench-{n:04}"), &uuids, T0).await;
            records.push((rec, uuids));
        }
        let write_tick = async |k: u32| {
            let batches: Vec<_> = records
                .iter()
                .map(|(rec, uuids)| {
                    let gpus: Vec<&str> = uuids.iter().map(String::as_str).collect();
                    node_batch(rec, batch(u64::from(k), T0 + i64::from(k) * 1000, 1, &gpus))
                })
                .collect();
            store.write_batches(&batches).await.expect("write");
        };
        write_tick(1).await;
        let live = Live::new();
        follow_once(store.as_ref(), &live)
            .await
            .expect("first pass");
        let started = Instant::now();
        let rounds = 5;
        for _ in 0..rounds {
            assert_eq!(follow_once(store.as_ref(), &live).await.expect("pass"), 0);
        }
        let idle = started.elapsed() / rounds;
        let mut busy = Duration::ZERO;
        let mut by_node = Duration::ZERO;
        for k in 2..2 + rounds {
            write_tick(k).await;
            let started = Instant::now();
            let taken = follow_once(store.as_ref(), &live).await.expect("pass");
            busy += started.elapsed();
            assert_eq!(taken, nodes as usize);
            // The same reads node by node (`Store::node_ticks`, what a pass did before
            // `Store::nodes_ticks`), after the pass so they find warm caches.
            let at = T0 + i64::from(k) * 1000;
            let range = TimeRange {
                from_ms: at,
                to_ms: at,
            };
            let started = Instant::now();
            for (rec, _) in &records {
                let ticks = store.node_ticks(rec, range, 600).await.expect("node");
                assert_eq!(ticks.len(), 1);
            }
            by_node += started.elapsed();
        }
        let busy = busy / rounds;
        let by_node = by_node / rounds;
        eprintln!(
            "{backend}: follower pass, 1000 nodes x 8 GPUs: nothing new {:.1} ms; one new tick on every node {:.1} ms (the same ticks read node by node: {:.1} ms)",
            idle.as_secs_f64() * 1e3,
            busy.as_secs_f64() * 1e3,
            by_node.as_secs_f64() * 1e3
        );
    }
}
