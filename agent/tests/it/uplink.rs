//! `run_agent` against an in-process fake collector over real loopback gRPC: delivery,
//! validation by the collector's own decoder, reconnect and resend without loss or
//! duplicates, rejects, and overflow counting while the collector is unreachable.

use gpufleet_agent::spool::{FsyncPolicy, Spool, SpoolConfig};
use gpufleet_core::wire::{Limits, decode_batch, decode_hello};
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::ingest_server::{Ingest, IngestServer};
use gpufleet_sim::{SimOptions, simulator};
use gpufleet_uplink::sampler::Sampler;
use gpufleet_uplink::{OutboxError, RunOptions, Summary, run_agent, run_agent_with};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

/// How the fake collector misbehaves.
#[derive(Debug, Clone, Default)]
struct Behaviour {
    /// In the first session, store this many batches, ack all but the last, then end the
    /// stream (a crash after commit, before the ack).
    break_first_session_after: Option<usize>,
    /// Reject this seq (not retryable).
    reject_seq: Option<u64>,
    /// In the first session, refuse this seq as retryable every time, store the batches
    /// after it, and end the stream right after storing the first of them, unacked: the
    /// next Welcome's `last_acked_seq` is then above a seq the collector does not hold.
    retry_reject_in_first_session: Option<u64>,
    /// Delay the Welcome of later sessions (lets ticks pile up while "connecting").
    welcome_delay: Duration,
}

#[derive(Debug, Default)]
struct Store {
    /// Batches stored, by arrival: (seq, ticks, GPU samples).
    batches: Vec<(u64, usize, u64)>,
    /// Every stored tick time.
    times: Vec<i64>,
    /// GPU samples rejected.
    rejected_samples: u64,
    /// Sessions opened.
    sessions: usize,
    /// Problems the fake saw (invalid batches, duplicates).
    errors: Vec<String>,
}

impl Store {
    fn samples(&self) -> u64 {
        self.batches.iter().map(|b| b.2).sum()
    }
}

#[derive(Clone, Default)]
struct Fake {
    store: Arc<Mutex<Store>>,
    behaviour: Behaviour,
}

#[tonic::async_trait]
impl Ingest for Fake {
    type StreamStream = ReceiverStream<Result<pb::CollectorMessage, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let store = self.store.clone();
        let behaviour = self.behaviour.clone();
        tokio::spawn(async move {
            let Ok(Some(pb::AgentMessage {
                msg: Some(pb::agent_message::Msg::Hello(hello)),
            })) = inbound.message().await
            else {
                let _ = tx
                    .send(Err(Status::invalid_argument("expected a Hello")))
                    .await;
                return;
            };
            let (info, inventory) = match decode_hello(hello, &Limits::default()) {
                Ok(v) => v,
                Err(e) => {
                    let _ = tx.send(Err(Status::invalid_argument(e.to_string()))).await;
                    return;
                }
            };
            let known: HashSet<String> = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
            let (session, last) = {
                let mut s = store.lock().expect("lock");
                s.sessions += 1;
                (s.sessions, s.batches.iter().map(|b| b.0).max().unwrap_or(0))
            };
            if session > 1 {
                tokio::time::sleep(behaviour.welcome_delay).await;
            }
            let welcome = pb::Welcome {
                node: info.node,
                last_acked_seq: last,
                max_ticks_per_batch: 1000,
                max_message_bytes: 4 << 20,
                collector_version: "fake".into(),
            };
            let msg = |m| Ok(pb::CollectorMessage { msg: Some(m) });
            if tx
                .send(msg(pb::collector_message::Msg::Welcome(welcome)))
                .await
                .is_err()
            {
                return;
            }
            let mut in_session = 0;
            while let Ok(Some(m)) = inbound.message().await {
                let Some(pb::agent_message::Msg::Batch(b)) = m.msg else {
                    continue;
                };
                let seq = b.seq;
                let now = gpufleet_core::config::now_ms();
                let batch =
                    match decode_batch(b, &Limits::default(), now, &|u: &str| known.contains(u)) {
                        Ok(batch) => batch,
                        Err(e) => {
                            store
                                .lock()
                                .expect("lock")
                                .errors
                                .push(format!("seq {seq}: {e}"));
                            continue;
                        }
                    };
                let refusal =
                    if session == 1 && behaviour.retry_reject_in_first_session == Some(seq) {
                        Some((pb::RejectCode::Unavailable, "test: busy", true))
                    } else if behaviour.reject_seq == Some(seq) {
                        store.lock().expect("lock").rejected_samples += batch.gpu_samples() as u64;
                        Some((pb::RejectCode::Invalid, "test: refused", false))
                    } else {
                        None
                    };
                if let Some((code, reason, retryable)) = refusal {
                    let reject = pb::Reject {
                        seq,
                        code: code as i32,
                        reason: reason.into(),
                        retryable,
                    };
                    let _ = tx
                        .send(msg(pb::collector_message::Msg::Reject(reject)))
                        .await;
                    continue;
                }
                {
                    let mut s = store.lock().expect("lock");
                    if s.batches.iter().any(|x| x.0 == seq) {
                        // Idempotent like the real store: a replay is acked, not stored twice.
                    } else {
                        s.batches
                            .push((seq, batch.ticks.len(), batch.gpu_samples() as u64));
                        s.times.extend(batch.ticks.iter().map(|t| t.time_ms));
                    }
                }
                in_session += 1;
                if session == 1
                    && behaviour
                        .retry_reject_in_first_session
                        .is_some_and(|r| seq > r)
                {
                    return; // committed above the refused seq, ack lost, stream ends
                }
                if session == 1 && Some(in_session) == behaviour.break_first_session_after {
                    return; // committed, ack lost, stream ends
                }
                if tx
                    .send(msg(pb::collector_message::Msg::Ack(pb::Ack { seq })))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Starts the fake on an ephemeral port; returns its URL and the store.
async fn start(behaviour: Behaviour, stop: CancellationToken) -> (String, Arc<Mutex<Store>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let fake = Fake {
        behaviour,
        ..Fake::default()
    };
    let store = fake.store.clone();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(IngestServer::new(fake))
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stop.cancelled_owned())
            .await;
    });
    (format!("http://{addr}"), store)
}

fn options(node: &str, url: String) -> RunOptions {
    RunOptions {
        interval: Duration::from_millis(20),
        shutdown_timeout: Duration::from_secs(10),
        ..RunOptions::new(node, vec![url])
    }
}

/// Waits until `done(store)` or panics after 30 s.
async fn until(store: &Arc<Mutex<Store>>, what: &str, done: impl Fn(&Store) -> bool) {
    for _ in 0..3000 {
        if done(&store.lock().expect("lock")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "timed out waiting for {what}: {:?}",
        store.lock().expect("lock")
    );
}

fn check_store(store: &Store, summary: Summary) {
    assert!(
        store.errors.is_empty(),
        "the collector's decoder refused batches: {:?}",
        store.errors
    );
    let mut times = store.times.clone();
    let n = times.len();
    times.sort_unstable();
    times.dedup();
    assert_eq!(times.len(), n, "no tick stored twice");
    assert_eq!(
        summary.sampled,
        summary.acked + summary.dropped + summary.unacked,
        "{summary:?}"
    );
    assert_eq!(
        summary.acked,
        store.samples(),
        "acked == stored, {summary:?}"
    );
    let mut seqs: Vec<u64> = store.batches.iter().map(|b| b.0).collect();
    seqs.sort_unstable();
    assert_eq!(seqs.first(), Some(&1), "seqs start at 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_sample_and_the_collector_accepts_them() {
    let stop = CancellationToken::new();
    let (url, store) = start(Behaviour::default(), stop.clone()).await;
    let sim = simulator(SimOptions::new("fake-a", 2)).expect("sim");
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(run_agent(
        options("fake-a", url),
        Box::new(sim),
        shutdown.clone(),
    ));
    until(&store, "30 stored samples", |s| s.samples() >= 30).await;
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    stop.cancel();
    let s = store.lock().expect("lock");
    check_store(&s, summary);
    assert_eq!((summary.dropped, summary.unacked), (0, 0), "{summary:?}");
    assert_eq!(summary.acked, summary.sampled);
    let mut seqs: Vec<u64> = s.batches.iter().map(|b| b.0).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "no gaps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticks_taken_faster_than_twice_a_second_travel_several_per_batch() {
    let stop = CancellationToken::new();
    let (url, store) = start(Behaviour::default(), stop.clone()).await;
    let sim = simulator(SimOptions::new("fake-b", 1)).expect("sim");
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(run_agent(
        options("fake-b", url),
        Box::new(sim),
        shutdown.clone(),
    ));
    until(&store, "60 stored ticks", |s| s.times.len() >= 60).await;
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    stop.cancel();
    let s = store.lock().expect("lock");
    check_store(&s, summary);
    assert_eq!(summary.acked, summary.sampled, "{summary:?}");
    // Ticks every 20 ms, a partial batch at most every 500 ms: about 25 ticks a message
    // (never fewer than 4 on average, however loaded the machine).
    assert!(
        s.batches.len() * 4 <= s.times.len(),
        "{} batches for {} ticks",
        s.batches.len(),
        s.times.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stream_is_resumed_without_loss_or_duplicates() {
    let stop = CancellationToken::new();
    let behaviour = Behaviour {
        break_first_session_after: Some(5),
        welcome_delay: Duration::from_millis(300),
        ..Behaviour::default()
    };
    let (url, store) = start(behaviour, stop.clone()).await;
    let sim = simulator(SimOptions::new("fake-b", 2)).expect("sim");
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(run_agent(
        options("fake-b", url),
        Box::new(sim),
        shutdown.clone(),
    ));
    until(&store, "a second session and 60 samples", |s| {
        s.sessions >= 2 && s.samples() >= 60
    })
    .await;
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    stop.cancel();
    let s = store.lock().expect("lock");
    check_store(&s, summary);
    assert_eq!((summary.dropped, summary.unacked), (0, 0), "{summary:?}");
    assert!(
        s.batches.iter().any(|b| b.1 > 1),
        "ticks that piled up during the reconnect were merged: {:?}",
        s.batches
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_batch_is_dropped_and_counted() {
    let stop = CancellationToken::new();
    let behaviour = Behaviour {
        reject_seq: Some(2),
        ..Behaviour::default()
    };
    let (url, store) = start(behaviour, stop.clone()).await;
    let sim = simulator(SimOptions::new("fake-c", 3)).expect("sim");
    let shutdown = CancellationToken::new();
    let agent = tokio::spawn(run_agent(
        options("fake-c", url),
        Box::new(sim),
        shutdown.clone(),
    ));
    until(&store, "a reject and 30 samples", |s| {
        s.rejected_samples > 0 && s.samples() >= 30
    })
    .await;
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    stop.cancel();
    let s = store.lock().expect("lock");
    check_store(&s, summary);
    assert_eq!(summary.dropped, s.rejected_samples, "{summary:?}");
    assert_eq!(summary.unacked, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_bounds_the_queue_and_counts_drops() {
    let sim = simulator(SimOptions::new("fake-d", 4)).expect("sim");
    let shutdown = CancellationToken::new();
    let opts = RunOptions {
        interval: Duration::from_millis(10),
        queue_max_ticks: 5,
        shutdown_timeout: Duration::from_millis(200),
        ..RunOptions::new("fake-d", vec!["http://127.0.0.1:1".into()])
    };
    let agent = tokio::spawn(run_agent(opts, Box::new(sim), shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(600)).await;
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    assert_eq!(
        summary.sampled,
        summary.acked + summary.dropped + summary.unacked,
        "{summary:?}"
    );
    assert_eq!(summary.acked, 0);
    assert!(
        summary.unacked <= 5 * 4,
        "at most 5 ticks of 4 GPUs held: {summary:?}"
    );
    assert!(summary.dropped > 0, "overflow was counted: {summary:?}");
}

/// Runs a simulated 2-GPU agent `node` with a spool in a temp dir against `urls` (the
/// fake's URL is appended) until `done`; then stops it cleanly and checks that everything
/// sampled was acked and stored once.
async fn run_spooled_until(
    behaviour: Behaviour,
    node: &str,
    urls: &[&str],
    what: &str,
    done: impl Fn(&Store) -> bool,
) {
    let stop = CancellationToken::new();
    let (url, store) = start(behaviour, stop.clone()).await;
    let sim = simulator(SimOptions::new(node, 2)).expect("sim");
    let shutdown = CancellationToken::new();
    let spool = tempfile::tempdir().expect("tempdir");
    let collectors = urls.iter().map(|u| u.to_string()).chain([url]).collect();
    let opts = RunOptions {
        collectors,
        ..options(node, String::new())
    };
    let config = SpoolConfig {
        dir: spool.path().to_owned(),
        max_bytes: 1 << 20,
        fsync: FsyncPolicy::Batch,
    };
    let agent = tokio::spawn(run_agent_with(
        opts,
        Sampler::new(Box::new(sim), None),
        Some(Box::new(move || {
            Spool::open(config)
                .map(|s| Box::new(s) as _)
                .map_err(OutboxError::new)
        })),
        shutdown.clone(),
    ));
    until(&store, what, done).await;
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    stop.cancel();
    check_store(&store.lock().expect("lock"), summary);
    assert_eq!((summary.dropped, summary.unacked), (0, 0), "{summary:?}");
    assert_eq!(
        summary.acked, summary.sampled,
        "nothing trimmed without its ack"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seq_refused_below_the_welcome_watermark_is_resent_not_trimmed() {
    let behaviour = Behaviour {
        retry_reject_in_first_session: Some(1),
        ..Behaviour::default()
    };
    run_spooled_until(
        behaviour,
        "fake-w",
        &[],
        "a second session that stored seq 1",
        |s| s.sessions >= 2 && s.batches.iter().any(|b| b.0 == 1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_over_to_the_next_collector_and_spools_meanwhile() {
    // The first collector refuses connections; the agent moves on to the second.
    run_spooled_until(
        Behaviour::default(),
        "fake-f",
        &["http://127.0.0.1:1"],
        "30 stored samples",
        |s| s.samples() >= 30,
    )
    .await;
}

#[tokio::test]
async fn bad_options_fail_fast() {
    let sim = simulator(SimOptions::new("x", 1)).expect("sim");
    let err = run_agent(
        RunOptions::new("x", vec!["http://bad host:1".into()]),
        Box::new(sim),
        CancellationToken::new(),
    )
    .await
    .expect_err("bad URL");
    assert!(err.to_string().contains("bad host"), "{err}");
}
