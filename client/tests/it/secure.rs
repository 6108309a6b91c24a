//! TLS (`--ca`) and viewer tokens (`--token-file`) against a collector that requires both.

use gpufleet::net::{Api, ApiOptions, NetError};
use gpufleet_collector::auth::tokens::{self, Role, TokensCommand};
use gpufleet_collector::auth::web::WebAuthMode;
use gpufleet_collector::net::certs::{DevCa, Validity};
use gpufleet_collector::net::tls::{TlsFiles, TlsOptions};
use gpufleet_collector::server::{ServeOptions, serve_with_store};
use std::process::Command;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_reaches_a_collector_over_tls_with_a_viewer_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store =
        gpufleet_collector::store::open(&format!("sqlite://{}", dir.path().join("c.db").display()))
            .await
            .expect("store");
    let out = tokens::run_on(
        store.as_ref(),
        TokensCommand::Add {
            node: "ops".into(),
            role: Role::Viewer,
        },
    )
    .await
    .expect("token");
    let token = out.lines().next().expect("token line").to_owned();
    let ca = DevCa::new(Validity::days(1)).expect("ca");
    let server = ca
        .server(&["localhost".into()], Validity::days(1))
        .expect("server cert");
    let path = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let tls = TlsOptions {
        http: Some(TlsFiles {
            cert: path("server.pem", &server.cert),
            key: path("server.key", &server.key),
            client_ca: None,
        }),
        ..Default::default()
    };
    let ca_file = path("ca.pem", &ca.pem.cert);
    let token_file = path("viewer.token", &format!("{token}\n"));

    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("grpc");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("http");
    let port = http.local_addr().expect("addr").port();
    let options = ServeOptions {
        tls,
        web_auth: WebAuthMode::Required,
        ..Default::default()
    };
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(serve_with_store(store, options, grpc, http, stop));
    let url = format!("https://localhost:{port}");
    let api = |token: Option<&str>, ca: bool| {
        Api::new(&ApiOptions {
            url: url.clone(),
            token: token.map(str::to_owned),
            ca_pem: ca.then(|| std::fs::read(&ca_file).expect("ca")),
        })
        .expect("api")
    };

    let untrusted = api(Some(&token), false)
        .fleet()
        .await
        .expect_err("untrusted");
    assert!(
        matches!(untrusted, NetError::Unreachable { .. }),
        "{untrusted}"
    );
    let anonymous = api(None, true).fleet().await.expect_err("401");
    assert!(
        matches!(&anonymous, NetError::Status { status: 401, message, .. } if message.contains("--token-file")),
        "{anonymous}"
    );
    let wrong = api(Some("gft_nope_nope"), true)
        .fleet()
        .await
        .expect_err("401");
    assert!(
        matches!(wrong, NetError::Status { status: 401, .. }),
        "{wrong}"
    );
    let fleet = api(Some(&token), true).fleet().await.expect("fleet");
    assert!(fleet.is_empty());

    let run = move || {
        Command::new(env!("CARGO_BIN_EXE_gpufleet"))
            .args(["top", "--once", "--url", &url])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--ca")
            .arg(&ca_file)
            .output()
            .expect("run")
    };
    let out = tokio::task::spawn_blocking(run).await.expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Nodes 0"));
}
