//! Ingest throughput, end to end over loopback gRPC into a temporary SQLite file or a fresh
//! PostgreSQL schema (`GPUFLEET_TEST_PG_URL`): several agents stream pre-built batches as
//! fast as acks allow, their ticks pre-encoded as an agent's are (`RawAgentMessage`). Reports GPU-samples/s acked, the p99 time from handing a batch to
//! the stream to its ack, and the bytes per GPU sample on disk. A benchmark, not a timed
//! test:
//!
//! ```text
//! cargo test --release -p gpufleet-collector --test it throughput:: -- --ignored --nocapture --test-threads 1
//! ```
//!
//! Knobs (environment): `AGENTS` (4), `GPUS` (8), `TICKS` per batch (50), `BATCHES` per
//! agent (200), `PROCS` processes per GPU per tick (0), `RATE` GPU samples/s offered by all
//! agents together (0: as fast as acks allow, i.e. saturation; with a rate, the latency is
//! the one a fleet of that size sees), `COMMIT_ROWS` the writer's rows per transaction (0:
//! the default), `NO_ACCOUNT=1` to keep the energy accountant to its first pass (its share
//! of the two cores: the benchmark's ticks are a day old, so every minute closes at once),
//! `NO_ARRIVAL=1` to write every GPU sample and process tick as a row (by default, as in a
//! collector, the wall clock closes the benchmark's day-old minutes, and their samples and
//! process ticks are packed as they arrive), `PACK_EVERY` seconds between the packer's passes (0: the collector's 10 minutes, which a
//! run this short never reaches; with a few seconds, the run also packs what it wrote, as a
//! collector that never stops must). After the run it prints what the collector's
//! background tasks did meanwhile (passes finished by then and their seconds per task,
//! rows packed, from its `/metrics`).

use crate::common::*;
use gpufleet_collector::{ServeOptions, serve_with_store};
use gpufleet_core::config::now_ms;
use gpufleet_core::*;
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::collector_message::Msg;
use gpufleet_uplink::encoded::{EncodedTick, OutBatch, RawAgentMessage};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::codegen::http::uri::PathAndQuery;
use tonic_prost::ProstCodec;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
async fn ingest_throughput() {
    let (dir, store) = sqlite_store().await;
    let rows = ingest(Arc::clone(&store), "sqlite").await;
    store.close().await;
    let pool = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        dir.path().join("test.db").display()
    ))
    .await
    .expect("connect");
    let bytes: i64 =
        sqlx::query_scalar("SELECT sum(pgsize) FROM dbstat WHERE name = 'gpu_samples'")
            .fetch_one(&pool)
            .await
            .expect("dbstat");
    println!(
        "sqlite: gpu_samples {bytes} bytes on disk = {:.1} bytes per GPU sample",
        bytes as f64 / rows as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
async fn ingest_throughput_postgres() {
    let (schema, store) = pg_store().await;
    let rows = ingest(Arc::clone(&store), "postgres").await;
    store.close().await;
    let mut conn = pg_connect(&schema.url()).await;
    let bytes: i64 = sqlx::query_scalar(
        "SELECT sum(pg_total_relation_size(i.inhrelid))::int8 FROM pg_inherits i \
         WHERE i.inhparent = 'gpu_samples'::regclass",
    )
    .fetch_one(&mut conn)
    .await
    .expect("relation size");
    println!(
        "postgres: gpu_samples {bytes} bytes on disk (heap + primary key) = {:.1} bytes per GPU sample",
        bytes as f64 / rows as f64
    );
}

/// Streams the pre-built batches of `AGENTS` agents into a collector on `store`, prints the
/// rate and ack latency, and returns the GPU samples stored.
async fn ingest(store: Arc<dyn gpufleet_collector::store::Store>, backend: &str) -> u64 {
    closed_by_the_wall_clock(&store);
    let (agents, gpus, ticks, batches, procs, offered) = (
        knob("AGENTS", 4),
        knob("GPUS", 8),
        knob("TICKS", 50),
        knob("BATCHES", 200),
        knob("PROCS", 0),
        knob("RATE", 0),
    );
    // With a rate, each agent sends one batch per `every`.
    let every = (offered > 0)
        .then(|| Duration::from_secs_f64(f64::from(agents * gpus * ticks) / f64::from(offered)));
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = grpc.local_addr().expect("addr");
    let http_addr = http.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve_with_store(
        Arc::clone(&store),
        {
            let mut options = ServeOptions::default();
            let rows = knob("COMMIT_ROWS", 0);
            if rows > 0 {
                options.writer.max_rows_per_commit = rows as usize;
            }
            if knob("NO_ACCOUNT", 0) > 0 {
                options.energy.period = Duration::from_secs(3600);
            }
            let pack_every = knob("PACK_EVERY", 0);
            if pack_every > 0 {
                options.retention.pack_period = Duration::from_secs(pack_every.into());
            }
            options
        },
        grpc,
        http,
        shutdown.clone(),
    ));

    let start_ms = now_ms() - 86_400_000;
    let mut prepared = Vec::new();
    for a in 0..agents {
        let uuids: Vec<String> = (0..gpus)
            .map(|g| format!("GPU-{a:04}-{g:04}-0000-0000-000000000000"))
            .collect();
        // Pre-encode the ticks, as an agent's sampling thread does, so the clients cost
        // what an agent's uplink costs (a copy of each tick's bytes into the message).
        let wire: Vec<RawAgentMessage> = (0..batches)
            .map(|b| {
                let ticks: Vec<Tick> = (0..ticks)
                    .map(|t| {
                        let k = b * ticks + t;
                        let time_ms = start_ms + i64::from(k) * 1000;
                        let samples = uuids.iter().map(|u| {
                            let mut s = gpu_sample_full(u, k);
                            s.nvlinks.clear();
                            s.ecc_uncorrected_volatile = Some(0);
                            s
                        });
                        let processes = uuids.iter().flat_map(|u| {
                            (0..procs).map(move |p| ProcessSample {
                                gpu_uuid: u.clone(),
                                pid: 1000 + p,
                                user: Some("alice".into()),
                                command: Some("python train.py".into()),
                                gpu_mem_bytes: Some(1 << 30),
                                sm_util_pct: Some(50),
                                workload: container_workload(&format!("{p:064x}"), Some("trainer")),
                                ..Default::default()
                            })
                        });
                        Tick {
                            time_ms,
                            gpus: samples.collect(),
                            processes: processes.collect(),
                            ..Default::default()
                        }
                    })
                    .collect();
                OutBatch {
                    seq: u64::from(b) + 1,
                    ticks: ticks
                        .into_iter()
                        .map(|t| EncodedTick::new(t).bytes)
                        .collect(),
                    delivery: DeliveryStats::default(),
                }
                .into_message()
            })
            .collect();
        let infos: Vec<GpuInfo> = uuids
            .iter()
            .enumerate()
            .map(|(i, u)| gpu_info_full(u, i as u32))
            .collect();
        let h = hello(&format!("bench-{a}"));
        let hello = RawAgentMessage {
            hello: Some(pb::Hello {
                node: h.node,
                inventory: Some(inventory(infos).into()),
                interval_ms: 1000,
                ..Default::default()
            }),
            batch: None,
        };
        prepared.push((hello, wire));
    }
    // The clock starts once every batch is built: only the pipeline is measured.
    let began = Instant::now();
    let mut handles = Vec::new();
    for (hello, wire) in prepared {
        handles.push(tokio::spawn(async move {
            // When each batch was handed to the stream, by seq - 1.
            let sent: Arc<Mutex<Vec<Option<Instant>>>> =
                Arc::new(Mutex::new(vec![None; wire.len()]));
            let mut latencies = Vec::with_capacity(wire.len());
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            // `Ingest/Stream` by hand, as the agent's uplink calls it: requests are
            // `RawAgentMessage`, answers the generated `CollectorMessage`.
            let mut client = tonic::client::Grpc::new(channel)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
            client.ready().await.expect("ready");
            let (tx, rx) = mpsc::channel(8);
            tx.send(hello).await.expect("hello");
            let path = PathAndQuery::from_static("/gpufleet.v1.Ingest/Stream");
            let codec = ProstCodec::<RawAgentMessage, pb::CollectorMessage>::default();
            let mut inbound = client
                .streaming(tonic::Request::new(ReceiverStream::new(rx)), path, codec)
                .await
                .expect("stream")
                .into_inner();
            let sent_by_sender = Arc::clone(&sent);
            let sender = tokio::spawn(async move {
                let mut pace = every.map(|e| {
                    let mut i = tokio::time::interval(e);
                    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    i
                });
                for (i, m) in wire.into_iter().enumerate() {
                    if let Some(p) = pace.as_mut() {
                        p.tick().await;
                    }
                    let permit = match tx.reserve().await {
                        Ok(p) => p,
                        Err(_) => break,
                    };
                    sent_by_sender.lock().expect("lock")[i] = Some(Instant::now());
                    permit.send(m);
                }
                tx
            });
            let mut acked = 0;
            while acked < batches {
                match inbound
                    .message()
                    .await
                    .expect("healthy")
                    .and_then(|m| m.msg)
                {
                    Some(Msg::Ack(a)) => {
                        acked += 1;
                        let at = sent.lock().expect("lock")[a.seq as usize - 1];
                        latencies.push(at.expect("acked after sent").elapsed());
                    }
                    Some(Msg::Welcome(_)) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            drop(sender.await);
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for h in handles {
        latencies.extend(h.await.expect("agent"));
    }
    let took = began.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let samples = u64::from(agents * gpus * ticks * batches);
    let rate = samples as f64 / took.as_secs_f64();
    println!(
        "{backend}: {agents} agents x {gpus} GPUs, {ticks} ticks/batch, {batches} batches each, {procs} processes/GPU, offered {}: \
         {samples} GPU samples acked in {:.2} s = {rate:.0} samples/s; ack latency p50 {} ms, p99 {} ms, max {} ms",
        if offered > 0 {
            format!("{offered}/s")
        } else {
            "as fast as acked".into()
        },
        took.as_secs_f64(),
        pct(0.50).as_millis(),
        pct(0.99).as_millis(),
        pct(1.0).as_millis(),
    );
    println!("{}", background_tasks(&http_addr.to_string()).await);
    let stored: u64 = store
        .nodes()
        .await
        .expect("nodes")
        .iter()
        .map(|n| n.stored_samples)
        .sum();
    assert_eq!(stored, samples);
    shutdown.cancel();
    server.await.expect("server").expect("clean shutdown");
    samples
}

/// What the collector's background tasks did during the run, from its `/metrics`: passes
/// and seconds per task, and the raw rows packed.
async fn background_tasks(http: &str) -> String {
    let body = scrape_metrics(http).await;
    let value = |series: &str| metric_value(&body, series);
    let mut out = String::from("background tasks during the run:");
    for task in ["energy", "rollups", "retention", "packing"] {
        let passes = value(&format!(
            "gpufleet_collector_background_passes_total{{task=\"{task}\",result=\"ok\"}}"
        ));
        let secs = value(&format!(
            "gpufleet_collector_background_pass_seconds_total{{task=\"{task}\"}}"
        ));
        if let (Some(n), Some(s)) = (passes, secs) {
            out.push_str(&format!(" {task} {n} passes {s:.2} s;"));
        }
    }
    let packed = value("gpufleet_collector_packed_rows_total").unwrap_or(0.0);
    out.push_str(&format!(" {packed} raw rows packed"));
    out
}

/// The store alone: `write_batches` with groups of pre-built domain batches, as the
/// group-commit writer calls it (no gRPC, no validation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
async fn store_write_throughput() {
    let (_dir, store) = sqlite_store().await;
    store_write(store, "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run in release with --ignored --nocapture"]
async fn store_write_throughput_postgres() {
    let (_schema, store) = pg_store().await;
    store_write(Arc::clone(&store), "postgres").await;
    store.close().await;
}

/// As a collector's store, the wall clock closes minutes to writes: the benchmarks' ticks
/// are a day old, so their samples and process ticks are packed as they arrive, unless
/// `NO_ARRIVAL=1` (every sample and tick a row).
fn closed_by_the_wall_clock(store: &Arc<dyn gpufleet_collector::store::Store>) {
    if knob("NO_ARRIVAL", 0) == 0 {
        store.set_arrival_clock(Some(Arc::new(now_ms)));
    }
}

async fn store_write(store: Arc<dyn gpufleet_collector::store::Store>, backend: &str) {
    closed_by_the_wall_clock(&store);
    use gpufleet_collector::store::NodeBatch;
    let (gpus, ticks, batches, procs, group) = (
        knob("GPUS", 8),
        knob("TICKS", 50),
        knob("BATCHES", 800),
        knob("PROCS", 0),
        knob("GROUP", 16),
    );
    let uuids: Vec<String> = (0..gpus)
        .map(|g| format!("GPU-{g:04}-0000-0000-000000000000"))
        .collect();
    let rec = register_gpus(&store, "bench", &uuids, now_ms()).await;
    let keys = Arc::new(rec.keys());
    let start_ms = now_ms() - 86_400_000;
    let all: Vec<NodeBatch> = (0..batches)
        .map(|b| {
            let ticks = (0..ticks)
                .map(|t| {
                    let k = b * ticks + t;
                    let samples = uuids.iter().map(|u| gpu_sample_full(u, k)).collect();
                    let processes = uuids
                        .iter()
                        .flat_map(|u| {
                            (0..procs).map(move |p| ProcessSample {
                                gpu_uuid: u.clone(),
                                pid: 1000 + p,
                                user: Some("alice".into()),
                                command: Some("python train.py".into()),
                                gpu_mem_bytes: Some(1 << 30),
                                sm_util_pct: Some(50),
                                workload: container_workload(&format!("{p:064x}"), Some("trainer")),
                                ..Default::default()
                            })
                        })
                        .collect();
                    Tick {
                        time_ms: start_ms + i64::from(k) * 1000,
                        gpus: samples,
                        processes,
                        ..Default::default()
                    }
                })
                .collect();
            NodeBatch {
                keys: Arc::clone(&keys),
                batch: Batch {
                    seq: u64::from(b) + 1,
                    ticks,
                    delivery: DeliveryStats::default(),
                },
            }
        })
        .collect();
    let began = Instant::now();
    for chunk in all.chunks(group as usize) {
        store.write_batches(chunk).await.expect("write");
    }
    let took = began.elapsed();
    let samples = u64::from(gpus * ticks * batches);
    println!(
        "{backend} store: {samples} GPU samples ({procs} processes/GPU), {group} batches of {ticks} ticks per \
         transaction: {:.2} s = {:.0} samples/s",
        took.as_secs_f64(),
        samples as f64 / took.as_secs_f64()
    );
}
