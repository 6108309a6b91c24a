//! Collector memory under a flood, measured on the real binary: `rounds` floods of large
//! batches from many streams (each acked before the next is sent) with a quiet period
//! after each; the collector's RSS is read from /proc after each flood and each quiet
//! period. Bounded memory means the RSS after the quiet periods does not climb round
//! after round, and comes back near where it started.
//!
//! A benchmark, not a timed test: `cargo test -p gpufleet-collector --test it memory:: --
//! --ignored --nocapture` (knobs: GPUFLEET_MEM_STREAMS, GPUFLEET_MEM_SECS,
//! GPUFLEET_MEM_ROUNDS). Figures are in BENCHMARKS.md.

use crate::harness;

use crate::common::*;
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::ingest_client::IngestClient;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kb / 1024.0
}

/// One flooding agent: node `node`, 8 GPUs, batches of 100 ticks as fast as acks come,
/// until `until`.
async fn flood(grpc: String, node: String, first_seq: u64, until: Instant) -> u64 {
    let gpus: Vec<String> = (0..8).map(|i| format!("{node}-GPU-{i}")).collect();
    let refs: Vec<&str> = gpus.iter().map(String::as_str).collect();
    let mut client = IngestClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect")
        .max_decoding_message_size(64 << 20);
    let (tx, rx) = mpsc::channel(4);
    let infos = refs
        .iter()
        .enumerate()
        .map(|(i, g)| gpu_info_full(g, i as u32))
        .collect();
    tx.send(hello_message(&node, infos)).await.expect("hello");
    let mut answers = client
        .stream(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    answers.message().await.expect("welcome");
    let mut seq = first_seq;
    let start = gpufleet_core::config::now_ms() - 2 * 86_400_000;
    while Instant::now() < until {
        let mut b = batch(1, start + (seq as i64) * 100_000, 100, &refs);
        b.seq = seq;
        tx.send(pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Batch(b.into())),
        })
        .await
        .expect("send");
        answers.message().await.expect("answer");
        seq += 1;
    }
    seq
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn memory_comes_back_after_floods() {
    let dir = tempfile::tempdir().expect("dir");
    let db = format!("sqlite://{}", dir.path().join("mem.db").display());
    let c = harness::start_collector(&db, "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let pid = c.child.id().expect("pid");
    let streams = knob("GPUFLEET_MEM_STREAMS", 16);
    let secs = knob("GPUFLEET_MEM_SECS", 20);
    let rounds = knob("GPUFLEET_MEM_ROUNDS", 3);
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("start: {:.1} MiB", rss_mib(pid));
    let mut seqs = vec![1u64; streams as usize];
    for round in 1..=rounds {
        let until = Instant::now() + Duration::from_secs(u64::from(secs));
        let tasks: Vec<_> = (0..streams)
            .map(|i| {
                tokio::spawn(flood(
                    c.grpc.clone(),
                    format!("flood-{i}"),
                    seqs[i as usize],
                    until,
                ))
            })
            .collect();
        let mut peak = 0f64;
        while tasks.iter().any(|t| !t.is_finished()) {
            peak = peak.max(rss_mib(pid));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (i, t) in tasks.into_iter().enumerate() {
            seqs[i] = t.await.expect("flood");
        }
        let after = rss_mib(pid);
        tokio::time::sleep(Duration::from_secs(15)).await;
        println!(
            "round {round}: peak {peak:.1} MiB, after flood {after:.1} MiB, after 15 s quiet {:.1} MiB ({} batches)",
            rss_mib(pid),
            seqs.iter().map(|s| s - 1).sum::<u64>()
        );
    }
}
