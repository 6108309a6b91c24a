//! What the deployment artefacts (deploy/) rely on: the probes answer without a
//! credential where viewers must log in, and the binary tells systemd it is ready
//! (`Type=notify`) once it serves.

use crate::common::*;
use gpufleet_collector::ServeOptions;
use gpufleet_collector::auth::web::WebAuthMode;
use std::time::Duration;

#[tokio::test]
async fn probes_answer_without_a_credential_and_the_api_still_needs_one() {
    let c = start_collector(ServeOptions {
        web_auth: WebAuthMode::Required,
        ..Default::default()
    })
    .await;
    for probe in ["/livez", "/readyz"] {
        let r = reqwest::get(format!("http://{}{probe}", c.http))
            .await
            .expect("probe");
        assert_eq!(r.status(), 200, "{probe}");
        assert_eq!(r.text().await.expect("body"), "ok\n");
    }
    let api = reqwest::get(format!("http://{}/api/v1/health", c.http))
        .await
        .expect("api");
    assert_eq!(api.status(), 401, "the API itself still needs a token");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_tells_systemd_it_is_ready_once_it_serves() {
    let dir = tempfile::tempdir().expect("dir");
    let socket_path = dir.path().join("notify.sock");
    let socket = tokio::net::UnixDatagram::bind(&socket_path).expect("bind");
    let db = format!("sqlite://{}", dir.path().join("c.db").display());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args(["serve", "--db", &db, "--grpc-listen", "127.0.0.1:0"])
        .args(["--http-listen", "127.0.0.1:0"])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("GPUFLEET_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-collector");
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(30), socket.recv(&mut buf))
        .await
        .expect("READY=1 within 30 s")
        .expect("recv");
    assert_eq!(String::from_utf8_lossy(&buf[..n]), "READY=1\n");
    // Ready means serving: the address it printed answers /readyz.
    use tokio::io::AsyncBufReadExt as _;
    let stdout = child.stdout.take().expect("stdout");
    let first = tokio::io::BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .expect("read")
        .expect("a line");
    let http = first
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("http="))
        .expect("http=");
    let r = reqwest::get(format!("http://{http}/readyz"))
        .await
        .expect("readyz");
    assert_eq!(r.status(), 200);
    child.kill().await.expect("kill");
}
