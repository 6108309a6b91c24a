//! The ingest path end to end inside one process: a real tonic server on 127.0.0.1:0 with
//! a temporary SQLite store, and a raw client generated from the proto.

mod common;

use common::*;
use gpufleet_collector::ingest::stream::IngestOptions;
use gpufleet_collector::store::{Store, TimeRange};
use gpufleet_collector::{ServeOptions, serve_with_store};
use gpufleet_core::config::now_ms;
use gpufleet_core::{Batch, GpuInfo};
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::collector_message::Msg;
use gpufleet_proto::v1::ingest_client::IngestClient;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming};

const ALL_TIME: TimeRange = TimeRange {
    from_ms: 0,
    to_ms: i64::MAX,
};

struct Collector {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    grpc: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), gpufleet_collector::ServeError>>,
}

async fn start() -> Collector {
    let (dir, store) = sqlite_store().await;
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind grpc");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
    let addr = grpc.local_addr().expect("grpc addr");
    let shutdown = CancellationToken::new();
    let options = ServeOptions {
        ingest: IngestOptions {
            max_in_flight: 4,
            ..Default::default()
        },
        ..Default::default()
    };
    let task = tokio::spawn(serve_with_store(
        Arc::clone(&store),
        options,
        grpc,
        http,
        shutdown.clone(),
    ));
    Collector {
        _dir: dir,
        store,
        grpc: addr,
        shutdown,
        task,
    }
}

/// One agent connection: the outbound queue and the inbound answers.
struct Agent {
    tx: mpsc::Sender<pb::AgentMessage>,
    rx: Streaming<pb::CollectorMessage>,
}

fn hello_msg(node: &str, gpus: Vec<GpuInfo>) -> pb::AgentMessage {
    hello_message(node, gpus)
}

fn batch_msg(b: Batch) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Batch(b.into())),
    }
}

/// Opens a stream whose first message is `first`; returns the call's status on refusal.
async fn open(c: &Collector, first: pb::AgentMessage) -> Result<Agent, Status> {
    let mut client = IngestClient::connect(format!("http://{}", c.grpc))
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(64);
    tx.send(first).await.expect("queue first message");
    let response = client.stream(ReceiverStream::new(rx)).await?;
    Ok(Agent {
        tx,
        rx: response.into_inner(),
    })
}

async fn connect(c: &Collector, node: &str, gpus: &[&str]) -> (Agent, pb::Welcome) {
    let infos = gpus
        .iter()
        .enumerate()
        .map(|(i, u)| gpu_info_full(u, i as u32))
        .collect();
    let mut agent = open(c, hello_msg(node, infos))
        .await
        .expect("stream accepted");
    match next(&mut agent).await {
        Msg::Welcome(w) => (agent, w),
        other => panic!("expected Welcome, got {other:?}"),
    }
}

async fn next(agent: &mut Agent) -> Msg {
    let msg = tokio::time::timeout(Duration::from_secs(10), agent.rx.message())
        .await
        .expect("an answer within 10 s")
        .expect("stream healthy")
        .expect("stream open");
    msg.msg.expect("a message")
}

/// Ticks ending one second ago, so they pass the timestamp checks.
fn recent_batch(seq: u64, ticks: u32, gpus: &[&str]) -> Batch {
    batch(seq, now_ms() - i64::from(ticks) * 1000, ticks, gpus)
}

#[tokio::test]
async fn ack_comes_only_after_the_data_is_queryable() {
    let c = start().await;
    let (mut agent, welcome) = connect(&c, "node-a", &["GPU-a", "GPU-b"]).await;
    assert_eq!(welcome.node, "node-a");
    assert_eq!(welcome.last_acked_seq, 0);
    assert!(welcome.max_message_bytes >= 16 << 20 && welcome.max_ticks_per_batch > 0);
    assert!(!welcome.collector_version.is_empty());

    let b = recent_batch(1, 3, &["GPU-a", "GPU-b"]);
    agent.tx.send(batch_msg(b.clone())).await.expect("send");
    assert_eq!(next(&mut agent).await, Msg::Ack(pb::Ack { seq: 1 }));

    // Acked means durable: the store answers with the data as soon as the ack arrives.
    let node = &c.store.nodes().await.expect("nodes")[0];
    assert_eq!((node.last_acked_seq, node.stored_samples), (1, 6));
    assert_eq!(node.last_seen_ms, b.ticks.last().map(|t| t.time_ms));
    let samples = c
        .store
        .gpu_samples(node.gpus[0].id, ALL_TIME, 100)
        .await
        .expect("samples");
    assert_eq!(
        samples.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>(),
        b.ticks
            .iter()
            .map(|t| t.gpus[0].clone())
            .collect::<Vec<_>>()
    );

    // A replay is acked again and stores nothing twice; a new stream learns the seq.
    agent.tx.send(batch_msg(b)).await.expect("send replay");
    assert_eq!(next(&mut agent).await, Msg::Ack(pb::Ack { seq: 1 }));
    assert_eq!(c.store.nodes().await.expect("nodes")[0].stored_samples, 6);
    let (_again, welcome) = connect(&c, "node-a", &["GPU-a", "GPU-b"]).await;
    assert_eq!(welcome.last_acked_seq, 1);
}

#[tokio::test]
async fn invalid_batches_are_rejected_and_the_stream_stays_usable() {
    let c = start().await;
    let (mut agent, _) = connect(&c, "node-a", &["GPU-a"]).await;

    let mut hot = recent_batch(1, 1, &["GPU-a"]);
    hot.ticks[0].gpus[0].power_mw = Some(90_000_000);
    agent.tx.send(batch_msg(hot)).await.expect("send");
    let Msg::Reject(r) = next(&mut agent).await else {
        panic!("90 kW must be rejected")
    };
    assert_eq!(
        (r.seq, r.code, r.retryable),
        (1, pb::RejectCode::Invalid as i32, false)
    );
    assert!(
        r.reason.contains("power_mw") && r.reason.contains("90000000"),
        "{}",
        r.reason
    );

    let stranger = recent_batch(2, 1, &["GPU-not-mine"]);
    agent.tx.send(batch_msg(stranger)).await.expect("send");
    let Msg::Reject(r) = next(&mut agent).await else {
        panic!("unknown GPU must be rejected")
    };
    assert_eq!(r.seq, 2);
    assert!(
        r.reason.contains("GPU-not-mine") && r.reason.contains("inventory"),
        "{}",
        r.reason
    );

    agent
        .tx
        .send(batch_msg(recent_batch(3, 2, &["GPU-a"])))
        .await
        .expect("send");
    assert_eq!(next(&mut agent).await, Msg::Ack(pb::Ack { seq: 3 }));
    let node = &c.store.nodes().await.expect("nodes")[0];
    assert_eq!(
        (node.last_acked_seq, node.stored_samples),
        (3, 2),
        "nothing of the rejected batches"
    );
}

#[tokio::test]
async fn a_stream_must_start_with_a_valid_hello() {
    let c = start().await;
    let err = open(&c, batch_msg(recent_batch(1, 1, &["GPU-a"])))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("Hello"), "{}", err.message());

    let dup = vec![gpu_info_sparse("GPU-a", 0), gpu_info_sparse("GPU-a", 1)];
    let err = open(&c, hello_msg("node-a", dup))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("GPU-a") && err.message().contains("twice"),
        "{}",
        err.message()
    );

    let err = open(&c, hello_msg(" ", vec![]))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("node"), "{}", err.message());

    assert!(
        c.store.nodes().await.expect("nodes").is_empty(),
        "nothing registered"
    );
}

#[tokio::test]
async fn a_second_hello_ends_the_stream() {
    let c = start().await;
    let (mut agent, _) = connect(&c, "node-a", &["GPU-a"]).await;
    agent
        .tx
        .send(hello_msg("node-a", vec![]))
        .await
        .expect("send");
    let status = agent.rx.message().await.expect_err("stream ends");
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn shutdown_answers_what_it_took_and_commits_it() {
    let c = start().await;
    let (mut agent, _) = connect(&c, "node-a", &["GPU-a", "GPU-b"]).await;
    // Batch `seq` holds 5 ticks of its own, so every batch adds 10 GPU samples.
    let base = now_ms() - 60_000;
    let gpus = ["GPU-a", "GPU-b"];
    agent
        .tx
        .send(batch_msg(batch(1, base, 5, &gpus)))
        .await
        .expect("send");
    assert_eq!(next(&mut agent).await, Msg::Ack(pb::Ack { seq: 1 }));
    for seq in 2..=6 {
        let start = base + (seq as i64 - 1) * 5000;
        agent
            .tx
            .send(batch_msg(batch(seq, start, 5, &gpus)))
            .await
            .expect("send");
    }
    c.shutdown.cancel();
    let mut acked = vec![1];
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), agent.rx.message())
            .await
            .expect("ends")
        {
            Ok(Some(pb::CollectorMessage {
                msg: Some(Msg::Ack(a)),
            })) => acked.push(a.seq),
            Ok(Some(other)) => panic!("unexpected {other:?}"),
            Ok(None) => panic!("the stream must end with a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    c.task.await.expect("serve task").expect("clean shutdown");
    let node = &c.store.nodes().await.expect("nodes")[0];
    let max_acked = *acked.iter().max().expect("acks");
    assert!(
        node.last_acked_seq >= max_acked,
        "every ack is durable: {acked:?} vs {}",
        node.last_acked_seq
    );
    assert!(
        node.stored_samples >= acked.len() as u64 * 10,
        "{acked:?}: {}",
        node.stored_samples
    );
}

#[tokio::test]
async fn the_served_collector_accounts_the_energy_of_what_agents_send() {
    let c = start().await;
    let gpus = ["GPU-a", "GPU-b"];
    let (mut agent, _) = connect(&c, "node-a", &gpus).await;
    // 150 s of ticks from a minute boundary three minutes ago: minutes 0 and 1 close, and
    // minute 2 (its last sample 30 s or more ago) is accounted too, provisionally or,
    // once the clock is a grace period past its end, closed.
    let start_ms = (now_ms() / 60_000 - 3) * 60_000;
    let ticks: Vec<_> = (0..150u32)
        .map(|i| tick(start_ms + i64::from(i) * 1000, &gpus, i))
        .collect();
    for (seq, chunk) in (1u64..).zip(ticks.chunks(50)) {
        let b = Batch {
            seq,
            ticks: chunk.to_vec(),
            delivery: Default::default(),
        };
        agent.tx.send(batch_msg(b)).await.expect("send");
        assert_eq!(next(&mut agent).await, Msg::Ack(pb::Ack { seq }));
    }
    // The accountant runs every 5 s; 30 s is only a failure deadline.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let energy = loop {
        let e = c.store.gpu_energy(ALL_TIME).await.expect("energy");
        if e.len() == 2 && e.iter().all(|g| g.covered_ms == 149_000) {
            break e;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not accounted in 30 s: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // GPU-a has a counter (+250 mJ per tick); GPU-b only power (trapezoid).
    let a = energy.iter().find(|g| g.uuid == "GPU-a").expect("GPU-a");
    assert_eq!((a.energy_mj, a.counter_mj), (149 * 250, 149 * 250));
    let b = energy.iter().find(|g| g.uuid == "GPU-b").expect("GPU-b");
    assert_eq!((b.counter_mj, b.trapezoid_mj), (0, b.energy_mj));
    assert!(b.energy_mj > 0);
    let report = gpufleet_collector::accounting::check::check(c.store.as_ref(), ALL_TIME)
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
    assert_eq!(report.minutes, 6, "2 GPUs × 3 minutes");
    c.shutdown.cancel();
    c.task.await.expect("join").expect("clean shutdown");
}
