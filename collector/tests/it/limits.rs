//! Per-client limits against a real collector on loopback: the HTTP header deadline
//! (slowloris), and per-address request rates on HTTP and gRPC. 127.0.0.2 is a second
//! client address (Linux routes all of 127.0.0.0/8 to loopback). Also: exposure
//! warnings in `/api/v1/health`.

use crate::common::*;
use gpufleet_collector::ServeOptions;
use gpufleet_collector::net::limits::LimitOptions;
use gpufleet_collector::net::rate_limit::RateQuota;
use gpufleet_proto::v1::collector_message::Msg;
use gpufleet_proto::v1::ingest_client::IngestClient;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

const OTHER_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

fn limits(f: impl FnOnce(&mut LimitOptions)) -> ServeOptions {
    let mut limits = LimitOptions::default();
    f(&mut limits);
    ServeOptions {
        limits,
        ..Default::default()
    }
}

/// Reads until the server closes the connection; `false` if it is still open after
/// `within`.
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(within, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn connections_that_do_not_finish_their_headers_are_closed_and_others_served() {
    let c = start_collector(limits(|l| {
        l.http_header_timeout = Duration::from_millis(300);
    }))
    .await;
    let mut half = TcpStream::connect(c.http).await.expect("connect");
    half.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .expect("write");
    let mut silent = TcpStream::connect(c.http).await.expect("connect");

    let response = reqwest::get(format!("http://{}/api/v1/health", c.http))
        .await
        .expect("request");
    assert_eq!(response.status(), 200, "another client is served");

    assert!(
        closed_within(&mut half, Duration::from_secs(5)).await,
        "a half-sent request's connection is closed after the header timeout"
    );
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)).await,
        "a connection that sends nothing is closed after the header timeout"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_keep_alive_connection_is_not_cut_after_its_first_request() {
    let c = start_collector(limits(|l| {
        l.http_header_timeout = Duration::from_millis(300);
    }))
    .await;
    // One connection, three requests spread over longer than the header timeout.
    let mut tcp = TcpStream::connect(c.http).await.expect("connect");
    for i in 0..3 {
        tcp.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        tokio::time::timeout(Duration::from_secs(10), async {
            while !String::from_utf8_lossy(&got).ends_with("\"warnings\":[]}") {
                let n = tcp.read(&mut buf).await.expect("read");
                assert!(n > 0, "request {i}: connection closed");
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .expect("answered within 10 s");
        assert!(got.starts_with(b"HTTP/1.1 200"), "request {i}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.stop().await;
}

#[tokio::test]
async fn one_address_flooding_http_gets_429_while_another_is_served() {
    let c = start_collector(limits(|l| {
        l.http_rate = RateQuota {
            per_second: 1,
            burst: 5,
        };
    }))
    .await;
    let url = format!("http://{}/api/v1/health", c.http);
    let flooder = reqwest::Client::new();
    let mut ok = 0;
    let mut refused = None;
    for _ in 0..20 {
        let r = flooder.get(&url).send().await.expect("request");
        match r.status().as_u16() {
            200 => ok += 1,
            429 => refused = Some(r),
            s => panic!("unexpected status {s}"),
        }
    }
    assert!((5..=6).contains(&ok), "the burst is served: {ok}");
    let refused = refused.expect("the flood is refused with 429");
    let retry_after: u64 = refused
        .headers()
        .get("retry-after")
        .expect("Retry-After")
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
    let body: serde_json::Value = refused.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .expect("error")
            .contains("too many requests")
    );

    let other = reqwest::Client::builder()
        .local_address(OTHER_CLIENT)
        .build()
        .expect("client");
    let r = other.get(&url).send().await.expect("request");
    assert_eq!(r.status(), 200, "another address keeps its own rate");
    c.stop().await;
}

async fn open_stream(
    c: &TestCollector,
    from: Option<IpAddr>,
    node: &str,
) -> Result<tonic::Streaming<gpufleet_proto::v1::CollectorMessage>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.grpc))
        .expect("endpoint")
        .local_address(from)
        .connect()
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(8);
    tx.send(hello_message(
        node,
        vec![gpu_info_full(&format!("GPU-{node}"), 0)],
    ))
    .await
    .expect("queue hello");
    let mut stream = IngestClient::new(channel)
        .stream(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an answer within 10 s")?;
    assert!(matches!(first.and_then(|m| m.msg), Some(Msg::Welcome(_))));
    // Keep the stream open for the test's length.
    std::mem::forget(tx);
    Ok(stream)
}

#[tokio::test]
async fn one_address_opening_streams_too_fast_is_refused_while_another_is_served() {
    let c = start_collector(limits(|l| {
        l.grpc_stream_rate = RateQuota {
            per_second: 1,
            burst: 2,
        };
    }))
    .await;
    let mut open = Vec::new();
    for i in 0..2 {
        open.push(
            open_stream(&c, None, &format!("node-{i}"))
                .await
                .expect("within the burst"),
        );
    }
    let refused = open_stream(&c, None, "node-x")
        .await
        .expect_err("over the rate");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("too many new streams"),
        "{refused:?}"
    );

    open.push(
        open_stream(&c, Some(OTHER_CLIENT), "node-other")
            .await
            .expect("another address keeps its own rate"),
    );
    drop(open);
    c.stop().await;
}

#[tokio::test]
async fn exposed_listeners_are_warned_about_in_health() {
    // Both listeners on all addresses, without TLS, viewers allowed in anonymously.
    let c = start_collector_on(
        ServeOptions {
            web_auth: gpufleet_collector::auth::web::WebAuthMode::Off,
            ..Default::default()
        },
        "0.0.0.0:0",
    )
    .await;
    let base = format!("http://127.0.0.1:{}", c.http.port());
    let health: serde_json::Value = reqwest::get(format!("{base}/api/v1/health"))
        .await
        .expect("health")
        .json()
        .await
        .expect("json");
    let warnings: Vec<&str> = health["warnings"]
        .as_array()
        .expect("warnings array")
        .iter()
        .map(|w| w.as_str().expect("string"))
        .collect();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("gRPC") && w.contains("without TLS"))
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("HTTP") && w.contains("without TLS"))
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("--allow-anonymous-viewers"))
    );

    c.stop().await;
}

#[tokio::test]
async fn loopback_listeners_have_no_warnings() {
    let c = start_collector(ServeOptions::default()).await;
    let health: serde_json::Value = reqwest::get(format!("http://{}/api/v1/health", c.http))
        .await
        .expect("health")
        .json()
        .await
        .expect("json");
    assert_eq!(health["warnings"], serde_json::json!([]));
    c.stop().await;
}

/// Periods that would spin a task (a zero ticker panics, a zero sleep is a busy loop) are
/// refused on the command line, naming the flag; the collector never starts with them (an
/// unusable listen address makes one that got past parsing exit at once, not run).
#[test]
fn zero_periods_are_refused_naming_the_flag() {
    for (command, flag) in [
        ("serve", "--metrics-refresh"),
        ("demo", "--metrics-refresh"),
        ("serve", "--remote-write-interval"),
        ("serve", "--grpc-handshake-timeout"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
            .args([command, flag, "0s", "--grpc-listen", "256.0.0.0:1"])
            .output()
            .expect("run gpufleet-collector");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command} {flag} 0s: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("longer than 0"),
            "{command} {flag} 0s: {stderr}"
        );
    }
}
