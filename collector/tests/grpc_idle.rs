//! Connections that never start HTTP/2 on the plaintext gRPC port are closed after the
//! handshake deadline, so bare TCP connections cannot hold an address's connection slots
//! and lock its agents out.

mod common;

use common::*;
use gpufleet_collector::ServeOptions;
use gpufleet_collector::net::limits::LimitOptions;
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::ingest_client::IngestClient;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const PER_IP: usize = 6;
const DEADLINE: Duration = Duration::from_millis(300);

/// Waits until the collector closes `conn` (end of stream or reset); how long it took.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(limit, conn.read(&mut buf)).await {
            Err(_) => panic!("connection still open after {limit:?}"),
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            // The server may write (HTTP/2 SETTINGS) before it gives up: keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

/// Opens a stream as `node` and returns whether it was welcomed.
async fn hello(c: &TestCollector, node: &str) -> Result<(), String> {
    let mut client = IngestClient::connect(format!("http://{}", c.grpc))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (tx, rx) = mpsc::channel(4);
    tx.send(hello_message(node, vec![gpu_info_full("GPU-1", 0)]))
        .await
        .expect("hello");
    let mut answers = client
        .stream(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("stream: {s}"))?
        .into_inner();
    match answers.message().await {
        Ok(Some(pb::CollectorMessage {
            msg: Some(pb::collector_message::Msg::Welcome(_)),
        })) => Ok(()),
        other => Err(format!("no Welcome: {other:?}")),
    }
}

#[tokio::test]
async fn connections_that_never_start_http2_are_closed_and_free_their_slots() {
    let c = start_collector(ServeOptions {
        max_connections_per_ip: PER_IP,
        limits: LimitOptions {
            grpc_handshake_timeout: DEADLINE,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    // Fill every slot of 127.0.0.1: silent connections, a dribbled half preface, and
    // bytes that are not HTTP/2.
    let mut bare = Vec::new();
    for i in 0..PER_IP {
        let mut conn = TcpStream::connect(c.grpc).await.expect("connect");
        match i {
            0 => conn.write_all(b"PRI * HTTP/2.0\r\n").await.expect("half"),
            1 => conn
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .expect("http/1"),
            _ => {}
        }
        bare.push(conn);
    }
    // Meanwhile no agent from this address gets in.
    let locked_out = hello(&c, "node-a").await;
    assert!(locked_out.is_err(), "every slot is held: {locked_out:?}");

    for conn in &mut bare {
        let took = closed_within(conn, Duration::from_secs(10)).await;
        assert!(took < Duration::from_secs(5), "closed after {took:?}");
    }
    // The slots are free again: a real agent from the same address is welcome, and its
    // stream outlives the deadline (it sent the preface at once).
    hello(&c, "node-a")
        .await
        .expect("welcome once the bare connections are closed");
    c.stop().await;
}
