//! Bounded under abuse, as a client with read access would try it: parallel maximum-size
//! plot renders on the real binary (its RSS read from /proc), a connection cap reached by
//! live streams, and refusals over the cap that say why and are counted.

use crate::common::*;
use crate::harness;
use gpufleet_collector::ServeOptions;
use gpufleet_collector::net::conn_limit::LiveBudget;
use gpufleet_core::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Resident and peak resident memory of `pid`, in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("a VmRSS / VmHWM line")
    };
    (kb("VmRSS:") / 1024.0, kb("VmHWM:") / 1024.0)
}

/// Ten minutes of one node with 8 GPUs at 1 s, written into a SQLite file the binary
/// then serves.
async fn seeded_db() -> (tempfile::TempDir, String) {
    let (dir, store) = sqlite_store().await;
    let uuids: Vec<String> = (0..8).map(|i| format!("GPU-abuse-{i}")).collect();
    let gpus = (uuids.iter().enumerate())
        .map(|(i, u)| gpu_info_full(u, i as u32))
        .collect();
    let node = store
        .register_node(&hello("n1"), &inventory(gpus), T0)
        .await
        .expect("register");
    let refs: Vec<&str> = uuids.iter().map(String::as_str).collect();
    let ticks: Vec<Tick> = (0..600)
        .map(|k| tick(T0 + k * 1000, &refs, k as u32))
        .collect();
    write_ticks(&store, &node, 1, ticks).await;
    let clock: gpufleet_collector::live::status::Clock = std::sync::Arc::new(|| T0 + 1_200_000);
    gpufleet_collector::accounting::accountant::Accountant::new(
        store.clone(),
        Default::default(),
        clock,
    )
    .pass()
    .await
    .expect("energy pass");
    store.close().await;
    let url = format!("sqlite://{}", dir.path().join("test.db").display());
    (dir, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_max_size_renders_keep_memory_bounded_and_the_rest_get_503() {
    let (_dir, db) = seeded_db().await;
    let c = harness::start_collector(
        &db,
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--max-renders", "2", "--render-queue", "2"],
    )
    .await;
    let pid = c.child.id().expect("pid");
    let base = format!("http://{}", c.http);
    let plot = |w: u32| {
        format!(
            "{base}/api/v1/report/plot.png?node=n1&from={T0}&to={}&width={w}&height=4000",
            T0 + 600_000
        )
    };
    let http = reqwest::Client::new();
    // Warm up: one render at the default size, so the baseline holds the font and the
    // allocator's arenas.
    let warm = http
        .get(format!(
            "{base}/api/v1/report/plot.png?node=n1&from={T0}&to={}",
            T0 + 600_000
        ))
        .send()
        .await
        .expect("warm-up");
    assert_eq!(warm.status(), 200, "{:?}", warm.text().await);
    let (before, _) = rss_mib(pid);

    // A size over the maximum is refused before any work: even for a node that does not
    // exist (no store read), and at once.
    let started = Instant::now();
    let r = http
        .get(format!(
            "{base}/api/v1/report/plot.png?node=nobody&width=8000&height=8000"
        ))
        .send()
        .await
        .expect("oversize");
    assert_eq!(r.status(), 400);
    let msg = r.text().await.expect("body");
    assert!(msg.contains("4000×4000"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Eight maximum-size renders at once: 2 render, 2 wait, the rest are refused.
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (http, url) = (http.clone(), plot(4000));
            tokio::spawn(async move {
                let r = http.get(&url).send().await.expect("request");
                let status = r.status().as_u16();
                let retry_after = r.headers().get("retry-after").cloned();
                let body = r.bytes().await.expect("body");
                (status, retry_after, body)
            })
        })
        .collect();
    let mut peak = 0f64;
    while tasks.iter().any(|t| !t.is_finished()) {
        peak = peak.max(rss_mib(pid).0);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, hwm) = rss_mib(pid);
    let mut ok = 0;
    let mut refused = 0;
    for t in tasks {
        let (status, retry_after, body) = t.await.expect("task");
        match status {
            200 => {
                assert_eq!(&body[..8], b"\x89PNG\r\n\x1a\n");
                assert_eq!(
                    u32::from_be_bytes(body[16..20].try_into().expect("4")),
                    4000
                );
                ok += 1;
            }
            503 => {
                assert_eq!(retry_after.expect("Retry-After"), "2");
                let text = String::from_utf8_lossy(&body);
                assert!(text.contains("retry in a few seconds"), "{text}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {}", String::from_utf8_lossy(&body)),
        }
    }
    let growth = peak.max(hwm) - before;
    println!(
        "8 renders of 4000×4000: {ok} drawn, {refused} refused; RSS {before:.0} MiB before, \
         peak {:.0} MiB (+{growth:.0})",
        peak.max(hwm)
    );
    assert!(ok >= 2, "the first two render: {ok}");
    assert!(
        refused >= 1,
        "over 2 rendering and 2 waiting, some are refused"
    );
    // Two images of 48 MB each and their PNGs at once, with the allocator's slack.
    assert!(
        growth < 300.0,
        "RSS grew {growth:.0} MiB for 2 renders at once (8 unbounded took over 1 GB)"
    );
    let metrics = scrape_metrics(&c.http).await;
    let counted = metric_value(&metrics, "gpufleet_http_renders_refused_total");
    assert_eq!(counted, Some(f64::from(refused)), "{metrics}");
}

/// Opens `/api/v1/live` on a connection of its own and waits for its first event.
async fn live_stream(http: std::net::SocketAddr) -> TcpStream {
    let mut tcp = TcpStream::connect(http).await.expect("connect");
    tcp.write_all(b"GET /api/v1/live HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
        .await
        .expect("write");
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tcp
}

/// Sends one GET on a new connection and reads the whole answer (the server closes).
async fn raw_get(http: std::net::SocketAddr, path: &str) -> String {
    let mut tcp = TcpStream::connect(http).await.expect("connect");
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out))
        .await
        .expect("closed within 10 s")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn live_streams_have_their_own_budget_and_refusals_say_why() {
    let mut options = ServeOptions {
        max_connections_per_ip: 4,
        ..Default::default()
    };
    options.limits.live = LiveBudget {
        per_ip: 6,
        total: 100,
    };
    let c = start_collector(options).await;
    // Four open tabs: as many live streams as the connection cap.
    let mut tabs = Vec::new();
    for _ in 0..4 {
        tabs.push(live_stream(c.http).await);
    }
    // The same address still reaches the API.
    let health = raw_get(c.http, "/api/v1/health").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // Two more tabs fit the live budget (6); the seventh is refused with a reason.
    tabs.push(live_stream(c.http).await);
    tabs.push(live_stream(c.http).await);
    let seventh = raw_get(c.http, "/api/v1/live").await;
    assert!(seventh.starts_with("HTTP/1.1 503"), "{seventh}");
    assert!(
        seventh.to_ascii_lowercase().contains("retry-after: 5"),
        "{seventh}"
    );
    assert!(
        seventh.contains("too many live streams from your address (6 open, the limit is 6)"),
        "{seventh}"
    );

    // Four plain connections reach the connection cap; the fifth is answered 503 with
    // the reason, before any request of it is served.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(c.http).await.expect("connect"));
    }
    let fifth = raw_get(c.http, "/api/v1/health").await;
    assert!(fifth.starts_with("HTTP/1.1 503"), "{fifth}");
    assert!(
        fifth.contains("too many connections from your address (4 open, the limit is 4)"),
        "{fifth}"
    );
    // The refusal is counted per listener, and the live streams are shown.
    drop(idle);
    let metrics = wait_until(
        "/metrics to answer again",
        Duration::from_secs(10),
        async || {
            let r = reqwest::get(format!("http://{}/metrics", c.http))
                .await
                .ok()?;
            if r.status() != 200 {
                return None;
            }
            r.text().await.ok()
        },
    )
    .await;
    let refused = r#"gpufleet_connections_refused_total{listener="http",answered="true"}"#;
    assert!(
        metric_value(&metrics, refused).is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert_eq!(metric_value(&metrics, "gpufleet_live_streams"), Some(6.0));
    assert_eq!(
        metric_value(&metrics, "gpufleet_live_streams_refused_total"),
        Some(1.0)
    );
    // Closed tabs give their budget back.
    drop(tabs);
    let http = c.http.to_string();
    wait_until(
        "the live streams to close",
        Duration::from_secs(10),
        async || {
            let m = scrape_metrics(&http).await;
            (metric_value(&m, "gpufleet_live_streams") == Some(0.0)).then_some(())
        },
    )
    .await;
    c.stop().await;
}

#[tokio::test]
async fn unknown_nodes_and_regions_are_404_and_echoes_are_short() {
    let c = start_collector(ServeOptions::default()).await;
    let live = raw_get(c.http, "/api/v1/live?node=nobody").await;
    assert!(live.starts_with("HTTP/1.1 404"), "{live}");
    let carbon = raw_get(c.http, "/api/v1/carbon/intensity?region=atlantis").await;
    assert!(carbon.starts_with("HTTP/1.1 404"), "{carbon}");
    assert!(carbon.contains("region \\\"atlantis\\\""), "{carbon}");
    let long = "9".repeat(10_000);
    let echo = raw_get(c.http, &format!("/api/v1/containers?from={long}")).await;
    assert!(echo.starts_with("HTTP/1.1 400"), "{echo}");
    assert!(echo.contains("…("), "cut: {echo}");
    assert!(echo.len() < 2_000, "{} bytes: {echo}", echo.len());
    c.stop().await;
}
