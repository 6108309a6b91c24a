//! The client against a real demo collector: the typed API, the live stream, `--once`.

use crate::common::{start_demo, wait_until};
use gpufleet::model::{Applied, Fleet};
use gpufleet::net::{Api, ApiOptions};
use gpufleet::sse::{self, LiveEvent};
use std::process::Command;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn api(url: &str) -> Api {
    Api::new(&ApiOptions {
        url: url.into(),
        ..Default::default()
    })
    .expect("api")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_is_kept_current_by_the_live_stream() {
    let demo = start_demo(3, 2).await;
    let api = api(&demo.url);
    let mut fleet = Fleet::new(api.fleet().await.expect("fleet"));
    assert_eq!(fleet.nodes().len(), 3);
    assert!(fleet.nodes().iter().all(|n| n.gpus.len() == 2));

    let (tx, mut rx) = mpsc::channel(64);
    let stop = CancellationToken::new();
    tokio::spawn(sse::follow(api.clone(), tx, stop.clone()));
    let first = rx.recv().await.expect("an event");
    assert!(matches!(first, LiveEvent::Connected), "{first:?}");
    // A tick moves a GPU's sample time forward; a status sets the collector's clock.
    let before = fleet.nodes()[0].gpus[0].latest.as_ref().map(|l| l.time_ms);
    let (mut ticked, mut statused) = (false, false);
    while !(ticked && statused) {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(LiveEvent::Tick(t))) => {
                let node = t.node.clone();
                assert_eq!(fleet.apply_tick(t), Applied::Updated);
                ticked |= node == fleet.nodes()[0].name;
            }
            Ok(Some(LiveEvent::Status(s))) => {
                assert_eq!(fleet.apply_status(s), Applied::Updated);
                statused = true;
            }
            Ok(Some(other)) => panic!("unexpected {other:?}"),
            Ok(None) | Err(_) => panic!("the live stream went quiet"),
        }
    }
    let after = fleet.nodes()[0].gpus[0].latest.as_ref().map(|l| l.time_ms);
    assert!(after > before, "{before:?} -> {after:?}");
    assert!(fleet.now_ms > 0);

    let name = fleet.nodes()[1].name.clone();
    let node = api.node(&name).await.expect("node");
    assert_eq!(node.gpus.len(), 2);
    assert!(
        node.gpus.iter().any(|g| !g.processes.is_empty()),
        "the demo's workloads have processes"
    );
    api.events(&name).await.expect("events");
    let missing = api.node("no-such-node").await.expect_err("404");
    assert!(missing.to_string().contains("404"), "{missing}");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_reconnects_after_the_collector_comes_back() {
    // A port nothing listens on yet: the stream reports it is down, then connects once a
    // collector answers there.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let addr = probe.local_addr().expect("addr");
    drop(probe);
    let api = api(&format!("http://{addr}"));
    let (tx, mut rx) = mpsc::channel(64);
    let stop = CancellationToken::new();
    tokio::spawn(sse::follow(api, tx, stop.clone()));
    let down = rx.recv().await.expect("event");
    assert!(
        matches!(&down, LiveEvent::Down(why) if why.contains("reach")),
        "{down:?}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("grpc");
    let http = tokio::net::TcpListener::bind(addr)
        .await
        .expect("same port");
    let options = gpufleet_collector::server::ServeOptions {
        db_url: format!("sqlite://{}", dir.path().join("c.db").display()),
        ..Default::default()
    };
    let serve_stop = CancellationToken::new();
    tokio::spawn(gpufleet_collector::server::serve(
        options,
        grpc,
        http,
        serve_stop.clone(),
    ));
    let connected = wait_until("a reconnection", Duration::from_secs(30), async || match rx
        .recv()
        .await?
    {
        LiveEvent::Connected => Some(true),
        _ => None,
    })
    .await;
    assert!(connected);
    stop.cancel();
    serve_stop.cancel();
}

fn gpufleet() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpufleet"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_prints_one_frame_as_text_and_as_json() {
    let demo = start_demo(4, 2).await;
    let url = demo.url.clone();
    // The URL from the config file (`--config`, a [top] table), as for the other binaries.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("gpufleet.toml");
    std::fs::write(&config, format!("[top]\nurl = \"{url}\"\nwidth = 150\n")).expect("config");
    let out = tokio::task::spawn_blocking(move || {
        let text = gpufleet()
            .arg("--config")
            .arg(&config)
            .args(["top", "--once"])
            .output()
            .expect("run");
        let json = gpufleet()
            .args(["top", "--once", "--json", "--sort", "util", "--url", &url])
            .output()
            .expect("run");
        (text, json)
    })
    .await
    .expect("join");
    let (text, json) = out;
    assert!(
        text.status.success(),
        "{}",
        String::from_utf8_lossy(&text.stderr)
    );
    let text = String::from_utf8(text.stdout).expect("utf-8");
    for i in 1..=4 {
        assert!(text.contains(&format!("gpu-node-0{i}")), "{text}");
    }
    assert!(text.contains("Nodes 4 (4 online"), "{text}");
    assert!(
        text.lines().next().is_some_and(|l| l.contains("snapshot")),
        "{text}"
    );
    assert!(text.contains("GPUs 8"), "{text}");
    assert!(
        text.contains("WORKLOAD"),
        "today's energy per workload: {text}"
    );
    assert!(text.lines().all(|l| l.chars().count() <= 150), "{text}");
    assert!(!text.contains('\u{1b}'), "no escape codes in --once");

    assert!(
        json.status.success(),
        "{}",
        String::from_utf8_lossy(&json.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(v["totals"]["nodes"], 4);
    assert_eq!(v["totals"]["gpus"], 8);
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(4));
    let utils: Vec<f64> = v["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let u: Vec<f64> = n["gpus"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g["latest"]["util_gpu_pct"].as_f64())
                .collect();
            u.iter().sum::<f64>() / (u.len().max(1) as f64)
        })
        .collect();
    assert!(
        utils.windows(2).all(|w| w[0] >= w[1]),
        "sorted by util: {utils:?}"
    );
}

#[test]
fn once_against_nothing_fails_with_a_clear_message() {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe");
    let addr = probe.local_addr().expect("addr");
    drop(probe);
    let out = gpufleet()
        .args(["top", "--once", "--url", &format!("http://{addr}")])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach the collector"), "{err}");
    let out = gpufleet()
        .args(["top", "--once", "--url", "ftp://x"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an http(s) URL"));
}

/// A server whose `/api/v1/fleet` answer never ends: `top --once` stops reading at its
/// ceiling and fails with a message, its memory bounded (read from /proc while it runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_against_an_endless_body_fails_with_bounded_memory() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Each connection: a 200 with a JSON body that goes on, up to 2 GiB (a bound for the
    // test, far past the client's ceiling) or until the client goes.
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                let _ = tcp.read(&mut head).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[")
                    .await;
                let chunk = vec![b' '; 1 << 20];
                for _ in 0..2048 {
                    if tcp.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpufleet"))
        .args(["top", "--once", "--url", &format!("http://{addr}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run gpufleet");
    let pid = child.id().expect("pid");
    let mut peak_kb = 0u64;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
            && let Some(kb) = s
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        {
            peak_kb = peak_kb.max(kb);
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err).await.expect("stderr");
    }
    assert!(!status.success(), "top --once must fail: {err}");
    assert!(
        err.contains("the answer is larger than 64 MiB"),
        "says why: {err}"
    );
    let peak_mib = peak_kb / 1024;
    println!("top --once against an endless body: peak RSS {peak_mib} MiB");
    // The 64 MiB ceiling, read once, with the allocator's and the runtime's own.
    assert!(peak_mib < 256, "peak RSS {peak_mib} MiB");
}
