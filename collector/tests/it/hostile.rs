//! Hostile clients against a real collector on loopback: garbage bytes and an oversized
//! message on the gRPC port, slowloris connections on the HTTP port, a node name made of
//! markup and SQL. Each time the assertion is that the collector keeps serving everyone
//! else, and that what a node sends is stored literally and shown escaped.

use crate::common::*;
use gpufleet_collector::ServeOptions;
use gpufleet_collector::ingest::stream::IngestOptions;
use gpufleet_core::config::now_ms;
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::collector_message::Msg;
use prost::Message as _;
use std::time::Duration;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tonic::Code;

const HOSTILE_NAME: &str = "<script>alert(1)</script>'; DROP TABLE nodes;--";
const MAX_MESSAGE: usize = 64 * 1024;

async fn start() -> TestCollector {
    start_collector(ServeOptions {
        ingest: IngestOptions {
            max_message_bytes: MAX_MESSAGE,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
}

/// A stream from `node` with one GPU, welcomed.
async fn connect(c: &TestCollector, node: &str, gpu: &str) -> AgentStream {
    open_stream(c, None, node, &[gpu]).await.expect("welcomed")
}

/// Sends one tick of `gpu` as batch `seq` and returns the answer.
async fn send_batch(agent: &mut AgentStream, seq: u64, gpu: &str) -> Msg {
    agent.send(batch(seq, now_ms() - 1_000, 1, &[gpu])).await
}

#[tokio::test]
async fn garbage_and_oversized_messages_leave_other_agents_streaming() {
    let c = start().await;
    let mut good = connect(&c, "good-node", "GPU-good").await;
    assert_eq!(
        send_batch(&mut good, 1, "GPU-good").await,
        Msg::Ack(pb::Ack { seq: 1 })
    );

    // Garbage bytes on the gRPC port (not HTTP/2 at all).
    for _ in 0..5 {
        let mut tcp = TcpStream::connect(c.grpc).await.expect("connect");
        let garbage: Vec<u8> = (0..64 * 1024).map(|i| (i * 7919 % 251) as u8).collect();
        let _ = tcp.write_all(&garbage).await;
    }

    // A message over the limit: refused with a status, the connection's other streams and
    // other agents are unaffected.
    let mut big = connect(&c, "big-node", "GPU-big").await;
    // Thousands of ticks: far over the byte limit, which is checked before anything else.
    let huge = batch(1, now_ms() - 3_000_000, 3_000, &["GPU-big"]);
    assert!(pb::Batch::from(huge.clone()).encoded_len() > MAX_MESSAGE);
    big.tx
        .send(pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Batch(huge.into())),
        })
        .await
        .expect("send");
    let status = next(&mut big.rx)
        .await
        .expect_err("oversized message refused");
    assert!(
        matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted),
        "{status:?}"
    );
    assert!(status.message().contains("too large"), "{status:?}");

    // The well-behaved agent still gets its batches acked.
    assert_eq!(
        send_batch(&mut good, 2, "GPU-good").await,
        Msg::Ack(pb::Ack { seq: 2 })
    );
    let nodes = c.store.nodes().await.expect("nodes");
    let good_node = nodes.iter().find(|n| n.name == "good-node").expect("good");
    assert_eq!(good_node.last_acked_seq, 2);
    let big_node = nodes.iter().find(|n| n.name == "big-node").expect("big");
    assert_eq!(
        big_node.stored_samples, 0,
        "nothing of the oversized batch stored"
    );
    c.shutdown.cancel();
}

/// A message whose encoding is the given bytes, protobuf or not.
#[derive(Debug, Default, Clone, PartialEq)]
struct RawMessage(Vec<u8>);

impl prost::Message for RawMessage {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Says Hello as `node` with `gpu`, then sends `then` as the next message in a well-formed
/// gRPC frame; the status the stream ends with.
async fn hello_then(c: &TestCollector, node: &str, gpu: &str, then: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", c.grpc))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.expect("ready");
    let hello = hello_message(node, vec![gpu_info_full(gpu, 0)]).encode_to_vec();
    let messages = tokio_stream::iter([RawMessage(hello), RawMessage(then)]);
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/gpufleet.v1.Ingest/Stream");
    let codec = gpufleet_proto::codec::SliceCodec::<RawMessage, pb::CollectorMessage>::default();
    let mut rx = client
        .streaming(tonic::Request::new(messages), path, codec)
        .await
        .expect("stream opened")
        .into_inner();
    assert!(matches!(next(&mut rx).await, Ok(Msg::Welcome(_))));
    next(&mut rx)
        .await
        .expect_err("the stream ends with a status")
}

#[tokio::test]
async fn a_message_that_is_not_protobuf_ends_only_its_stream() {
    let c = start().await;
    let mut good = connect(&c, "good-node", "GPU-good").await;
    let whole = pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Batch(
            batch(1, now_ms() - 1_000, 1, &["GPU-bad"]).into(),
        )),
    }
    .encode_to_vec();
    // A batch whose GPU UUID is not UTF-8, as a protobuf `string` must be.
    let uuid = whole
        .windows(7)
        .position(|w| w == b"GPU-bad")
        .expect("the UUID is in the message");
    let mut not_utf8 = whole.clone();
    not_utf8[uuid] = 0xff;
    let broken = [
        whole[..whole.len() - 1].to_vec(), // cut short inside a field
        not_utf8,
        vec![0x12, 0x02, 0x0a, 0xff], // Batch.seq with the wire type of a string
    ];
    for (i, bytes) in broken.into_iter().enumerate() {
        let status = hello_then(&c, "bad-node", "GPU-bad", bytes).await;
        assert_eq!(status.code(), Code::Internal, "{i}: {status:?}");
        assert!(
            status
                .message()
                .contains("failed to decode Protobuf message"),
            "{i}: {status:?}"
        );
        // Everyone else streams on.
        assert_eq!(
            send_batch(&mut good, i as u64 + 1, "GPU-good").await,
            Msg::Ack(pb::Ack { seq: i as u64 + 1 })
        );
    }
    // The same node, well-formed, is welcomed and stored from its first batch; nothing of
    // the broken messages was.
    let nodes = c.store.nodes().await.expect("nodes");
    let bad = nodes.iter().find(|n| n.name == "bad-node").expect("bad");
    assert_eq!((bad.stored_samples, bad.last_acked_seq), (0, 0));
    let mut bad = connect(&c, "bad-node", "GPU-bad").await;
    assert_eq!(
        send_batch(&mut bad, 1, "GPU-bad").await,
        Msg::Ack(pb::Ack { seq: 1 })
    );
    c.shutdown.cancel();
}

#[tokio::test]
async fn slowloris_connections_do_not_starve_other_http_clients() {
    let c = start().await;
    // Many connections that send half a request and then nothing.
    let mut idle = Vec::new();
    for _ in 0..64 {
        let mut tcp = TcpStream::connect(c.http).await.expect("connect");
        tcp.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .expect("write");
        idle.push(tcp);
    }
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        reqwest::get(format!("http://{}/api/v1/health", c.http)),
    )
    .await
    .expect("answered within 10 s despite the idle connections")
    .expect("request");
    assert_eq!(response.status(), 200);
    drop(idle);
    c.shutdown.cancel();
}

#[tokio::test]
async fn a_hostile_node_name_is_stored_literally_and_shown_escaped() {
    let c = start().await;
    let mut agent = connect(&c, HOSTILE_NAME, "GPU-x").await;
    assert_eq!(
        send_batch(&mut agent, 1, "GPU-x").await,
        Msg::Ack(pb::Ack { seq: 1 })
    );
    let names: Vec<String> = c
        .store
        .nodes()
        .await
        .expect("nodes table still there")
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, [HOSTILE_NAME], "stored literally");

    // The page at `/` is the static dashboard shell: no node string is ever rendered into
    // HTML on the server. The front end inserts node strings as text (textContent); the
    // browser test (web/test/dashboard.test.mjs) checks that a label carrying <script>
    // and SQL shows literally and never runs.
    let page = reqwest::get(format!("http://{}/", c.http))
        .await
        .expect("page");
    let headers = page.headers().clone();
    let html = page.text().await.expect("html");
    assert!(
        !html.contains("alert(1)"),
        "no node string in the served HTML: {html}"
    );
    assert!(
        !html.contains("<script>"),
        "no inline script in the page: {html}"
    );
    let csp = headers
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(
        headers
            .get("x-content-type-options")
            .and_then(|v| v.to_str().ok()),
        Some("nosniff")
    );

    // The JSON API returns the name as a JSON string, served as JSON.
    let api = reqwest::get(format!("http://{}/api/v1/nodes", c.http))
        .await
        .expect("api");
    assert!(
        api.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"))
    );
    let json: serde_json::Value = api.json().await.expect("json");
    assert_eq!(json[0]["name"], HOSTILE_NAME);
    c.shutdown.cancel();
}

#[tokio::test]
async fn a_flood_from_one_address_does_not_starve_another() {
    use tokio::io::AsyncReadExt as _;
    let c = start_collector(ServeOptions {
        max_connections_per_ip: 8,
        ..Default::default()
    })
    .await;
    // 127.0.0.1 holds its 8 connections open on both listeners.
    let mut held = Vec::new();
    for addr in [c.http, c.grpc] {
        for _ in 0..8 {
            held.push(TcpStream::connect(addr).await.expect("connect"));
        }
    }
    // Its 9th is answered 503 with the reason, and nothing of it is served.
    let mut ninth = TcpStream::connect(c.http).await.expect("connect");
    let _ = ninth
        .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), ninth.read_to_end(&mut buf))
        .await
        .expect("closed within 10 s")
        .expect("read");
    let answer = String::from_utf8_lossy(&buf);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("too many connections from your address (8 open, the limit is 8)"),
        "{answer}"
    );

    // Another address is served on both listeners.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .expect("client");
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        other.get(format!("http://{}/api/v1/health", c.http)).send(),
    )
    .await
    .expect("answered within 10 s")
    .expect("request from 127.0.0.2");
    assert_eq!(r.status(), 200);
    // On gRPC, an HTTP/2 preface from 127.0.0.2 gets the server's SETTINGS back; a call
    // from 127.0.0.1 (over its limit) is answered UNAVAILABLE with the reason.
    assert!(!h2_answer(c.grpc, [127, 0, 0, 2]).await.is_empty());
    let mut agent =
        gpufleet_proto::v1::ingest_client::IngestClient::connect(format!("http://{}", c.grpc))
            .await
            .expect("connect");
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(hello_message("over", vec![])).await.expect("hello");
    let status = tokio::time::timeout(
        Duration::from_secs(10),
        agent.stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
    .await
    .expect("answered within 10 s")
    .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("too many connections from your address"),
        "{status:?}"
    );

    // Closing the flood frees its slots.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = reqwest::get(format!("http://{}/api/v1/health", c.http)).await;
        if r.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "slots not freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.stop().await;
}

/// Sends an HTTP/2 client preface from `from` and returns the first bytes answered.
async fn h2_answer(to: std::net::SocketAddr, from: [u8; 4]) -> Vec<u8> {
    use tokio::io::AsyncReadExt as _;
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((from, 0)))
        .expect("bind");
    let mut tcp = socket.connect(to).await.expect("connect");
    let _ = tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let mut buf = vec![0u8; 64];
    match tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await {
        Ok(Ok(n)) => buf[..n].to_vec(),
        Ok(Err(_)) => Vec::new(),
        Err(_) => panic!("no answer and not closed within 10 s"),
    }
}

/// Times that no RFC 3339 text or no `i64` of milliseconds can hold, on every route that
/// takes `from` / `to`: each is a 400 whose message names the parameter, no connection is
/// dropped (a panicking handler closes it), and the route keeps answering. The extremes of
/// the accepted range are answered too (200 or 404), not crashed on.
#[tokio::test]
async fn out_of_range_times_are_400s_naming_the_parameter_on_every_route() {
    let c = start().await;
    let gpu = "GPU-times-0";
    let mut agent = connect(&c, "tnode", gpu).await;
    assert!(matches!(
        send_batch(&mut agent, 1, gpu).await,
        Msg::Ack(pb::Ack { seq: 1 })
    ));
    let routes = [
        "/api/v1/containers?",
        "/api/v1/containers/container:abc?",
        "/api/v1/energy?",
        "/api/v1/energy/series?",
        "/api/v1/report?node=tnode&",
        "/api/v1/report/plot.png?node=tnode&",
        "/api/v1/nodes/tnode/series?metric=power_mw&",
        "/api/v1/nodes/tnode/host/series?",
        "/api/v1/nodes/tnode/events?",
        "/api/v1/gpus/GPU-times-0/series?metric=power_mw&",
        "/api/v1/carbon/intensity?region=13&",
    ];
    let hostile = [
        "300000000000000",
        "9223372036854775807",
        "-9223372036854775808",
        "99999999999999999999",
        "-1",
        "now-1000000000y",
        "now-584942417y",
        "now%2B10000y",
        "0000-01-01T00:00:00Z",
    ];
    let client = reqwest::Client::new();
    let get = async |url: &str| -> (u16, String) {
        let r = client
            .get(url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: no response (handler died?): {e}"));
        let status = r.status().as_u16();
        let body = r.bytes().await.expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    for route in routes {
        for param in ["from", "to"] {
            for v in hostile {
                let url = format!("http://{}{route}{param}={v}", c.http);
                let (status, body) = get(&url).await;
                assert_eq!(status, 400, "{url}: {body}");
                assert!(
                    body.contains(&format!("\"error\":\"{param}: time ")),
                    "{url}: {body}"
                );
            }
        }
        for range in [
            "from=0&to=9999-12-31T23:59:59.999Z",
            "from=253402300799999&to=253402300799999",
            "from=0&to=0",
        ] {
            let url = format!("http://{}{route}{range}", c.http);
            let (status, body) = get(&url).await;
            assert!(matches!(status, 200 | 400 | 404), "{url}: {status} {body}");
        }
        // From after to, both at the edges: the message formats both without panicking.
        let url = format!("http://{}{route}from=253402300799999&to=0", c.http);
        let (status, body) = get(&url).await;
        assert_eq!(status, 400, "{url}: {body}");
        let (status, body) = get(&format!("http://{}{route}", c.http)).await;
        assert!(
            matches!(status, 200 | 404),
            "{route} after hostile times: {status} {body}"
        );
    }
    c.stop().await;
}
