//! TLS and mTLS with real certificates made in the test (rcgen, `gpufleet_collector::net::certs`):
//! a real collector (`serve_with_store`) on loopback, real agents (`run_agent`) or a raw
//! client from the proto. Every refusal is asserted on both sides: the status the client
//! sees, and a store with nothing written.

use crate::common;

use crate::common::*;
use gpufleet_collector::ServeOptions;
use gpufleet_collector::auth::tokens::{self, TokensCommand};
use gpufleet_collector::ingest::identity::AgentAuth;
use gpufleet_collector::ingest::stream::IngestOptions;
use gpufleet_collector::net::certs::{DevCa, Pem, Validity};
use gpufleet_collector::net::tls::{self as ctls, Alpn, ReloadableTls, TlsFiles, TlsOptions};
use gpufleet_core::config::now_ms;
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::ingest_client::IngestClient;
use gpufleet_sim::{SimOptions, simulator};
use gpufleet_uplink::tls::Credentials;
use gpufleet_uplink::{RunOptions, run_agent};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The certificates of one test: the collector's CA and another one nobody trusts.
struct Pki {
    dir: tempfile::TempDir,
    ca: DevCa,
    other_ca: DevCa,
}

impl Pki {
    fn new() -> Pki {
        Pki {
            dir: tempfile::tempdir().expect("tempdir"),
            ca: DevCa::new(Validity::days(1)).expect("ca"),
            other_ca: DevCa::new(Validity::days(1)).expect("other ca"),
        }
    }

    fn write(&self, name: &str, pem: &Pem) -> (PathBuf, PathBuf) {
        let cert = self.dir.path().join(format!("{name}.pem"));
        let key = self.dir.path().join(format!("{name}.key"));
        std::fs::write(&cert, &pem.cert).expect("write cert");
        std::fs::write(&key, &pem.key).expect("write key");
        (cert, key)
    }

    /// Server files signed by our CA; `client_ca`: require client certificates.
    fn server_files(&self, client_ca: bool) -> TlsFiles {
        let server = self
            .ca
            .server(&["localhost".into()], Validity::days(1))
            .expect("server cert");
        let (cert, key) = self.write("server", &server);
        let ca = self.dir.path().join("ca.pem");
        std::fs::write(&ca, &self.ca.pem.cert).expect("write ca");
        TlsFiles {
            cert,
            key,
            client_ca: client_ca.then_some(ca),
        }
    }

    /// Renews the server certificate in `files`: the same name, now signed by the other
    /// CA (written beside and renamed, as certificate managers do).
    fn renew_with_other_ca(&self, files: &TlsFiles) {
        let renewed = self
            .other_ca
            .server(&["localhost".into()], Validity::days(1))
            .expect("renewed");
        replace(&files.key, &renewed.key);
        replace(&files.cert, &renewed.cert);
    }

    /// A client TLS config trusting only the other CA (a renewed certificate).
    fn client_trusting_other_ca(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.other_ca.pem.cert))
            .domain_name("localhost")
    }

    /// A client TLS config trusting our CA, presenting `identity` if given.
    fn client(&self, identity: Option<&Pem>) -> ClientTlsConfig {
        let mut c = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca.pem.cert))
            .domain_name("localhost");
        if let Some(p) = identity {
            c = c.identity(Identity::from_pem(&p.cert, &p.key));
        }
        c
    }
}

fn https_url(c: &TestCollector) -> String {
    format!("https://localhost:{}", c.grpc.port())
}

async fn start_tls(tls: TlsOptions) -> TestCollector {
    start_collector(ServeOptions {
        tls,
        ..Default::default()
    })
    .await
}

fn grpc_only(files: TlsFiles) -> TlsOptions {
    TlsOptions {
        grpc: Some(files),
        ..TlsOptions::default()
    }
}

/// An open stream after its Welcome.
struct Stream {
    _tx: mpsc::Sender<pb::AgentMessage>,
    rx: tonic::Streaming<pb::CollectorMessage>,
}

/// Connects over TLS and says Hello as `node`; the error is the client's view of the
/// refusal (a gRPC status, or a transport error before any).
async fn hello(url: &str, tls: ClientTlsConfig, node: &str) -> Result<Stream, (Code, String)> {
    hello_with(url, Some(tls), None, node).await
}

/// Like [`hello`], optionally without TLS, with `authorization` set to `auth`.
async fn hello_with(
    url: &str,
    tls: Option<ClientTlsConfig>,
    auth: Option<&str>,
    node: &str,
) -> Result<Stream, (Code, String)> {
    let mut endpoint = Endpoint::from_shared(url.to_owned())
        .expect("url")
        .connect_timeout(Duration::from_secs(10));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).expect("tls config");
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| (Code::Unavailable, format!("{e:?}")))?;
    let mut client = IngestClient::new(channel);
    let (tx, rx) = mpsc::channel(8);
    // A GPU of its own per node: a GPU belongs to the node that registered it.
    let msg = hello_message(node, vec![gpu_info_full(&format!("GPU-tls-{node}"), 0)]);
    tx.send(msg).await.expect("queue hello");
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(auth) = auth {
        request
            .metadata_mut()
            .insert("authorization", auth.parse().expect("ascii"));
    }
    let fut = client.stream(request);
    let response = tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("answer within 10 s")
        .map_err(|s| (s.code(), format!("{s:?}")))?;
    let mut rx = response.into_inner();
    match rx.message().await {
        Ok(Some(pb::CollectorMessage {
            msg: Some(pb::collector_message::Msg::Welcome(_)),
        })) => Ok(Stream { _tx: tx, rx }),
        Ok(other) => panic!("expected a Welcome, got {other:?}"),
        Err(s) => Err((s.code(), s.message().to_owned())),
    }
}

#[tokio::test]
async fn an_agent_over_tls_is_stored() {
    let pki = Pki::new();
    let c = start_tls(grpc_only(pki.server_files(false))).await;
    hello(&https_url(&c), pki.client(None), "tls-node")
        .await
        .expect("TLS without client certificate is accepted when no --client-ca is set");
    assert_eq!(c.node_names().await, ["tls-node"]);
    // A client trusting another CA refuses the collector's certificate.
    let untrusted = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.other_ca.pem.cert))
        .domain_name("localhost");
    let Err((_, why)) = hello(&https_url(&c), untrusted, "tls-node-2").await else {
        panic!("a collector certificate from an untrusted CA must be refused");
    };
    assert!(why.contains("InvalidCertificate"), "{why}");
    assert_eq!(c.node_names().await, ["tls-node"], "nothing else stored");
    c.stop().await;
}

#[tokio::test]
async fn a_real_agent_over_mtls_gets_its_samples_acked_and_stored() {
    let pki = Pki::new();
    let c = start_tls(grpc_only(pki.server_files(true))).await;
    let node_pem = pki
        .ca
        .client("mtls-node", Validity::days(1))
        .expect("client");
    let shutdown = CancellationToken::new();
    let opts = RunOptions {
        interval: Duration::from_millis(50),
        batch_max_ticks: 1,
        credentials: Credentials::none().with_tls(pki.client(Some(&node_pem))),
        ..RunOptions::new("mtls-node", vec![https_url(&c)])
    };
    let sim = simulator(SimOptions::new("mtls-node", 2)).expect("simulator");
    let agent = tokio::spawn(run_agent(opts, Box::new(sim), shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = c.store.nodes().await.expect("nodes");
        if nodes
            .iter()
            .any(|n| n.name == "mtls-node" && n.last_acked_seq >= 3)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no acked batch over mTLS within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    assert!(summary.acked >= 3, "{summary}");
    assert_eq!(summary.dropped, 0, "{summary}");
    c.stop().await;
}

#[tokio::test]
async fn mtls_refuses_missing_untrusted_and_expired_client_certificates() {
    let pki = Pki::new();
    let c = start_tls(grpc_only(pki.server_files(true))).await;
    let other = pki
        .other_ca
        .client("node-x", Validity::days(1))
        .expect("cert");
    let expired = pki
        .ca
        .client(
            "node-x",
            Validity {
                not_before: rcgen::date_time_ymd(2020, 1, 1),
                not_after: rcgen::date_time_ymd(2020, 2, 1),
            },
        )
        .expect("cert");
    for (what, tls) in [
        ("no client certificate", pki.client(None)),
        (
            "a certificate from an untrusted CA",
            pki.client(Some(&other)),
        ),
        ("an expired certificate", pki.client(Some(&expired))),
    ] {
        let Err((_, why)) = hello(&https_url(&c), tls, "node-x").await else {
            panic!("{what} must be refused");
        };
        // rustls refuses in the handshake and says why in its alert (certificate
        // required / bad certificate / decrypt error for a signature that does not verify).
        assert!(
            why.contains("alert") || why.contains("Certificate"),
            "{what}: the error should come from the TLS handshake: {why}"
        );
    }
    assert!(c.node_names().await.is_empty(), "nothing stored");
    c.stop().await;
}

#[tokio::test]
async fn a_client_certificate_for_one_node_cannot_write_as_another() {
    let pki = Pki::new();
    let c = start_tls(grpc_only(pki.server_files(true))).await;
    let a = pki.ca.client("node-a", Validity::days(1)).expect("cert");
    let Err((code, why)) = hello(&https_url(&c), pki.client(Some(&a)), "node-b").await else {
        panic!("node-a's certificate must not write as node-b");
    };
    assert_eq!(code, Code::PermissionDenied, "{why}");
    assert!(why.contains("node-b"), "{why}");
    assert!(c.node_names().await.is_empty(), "nothing stored");
    hello(&https_url(&c), pki.client(Some(&a)), "node-a")
        .await
        .expect("node-a writes as itself");
    assert_eq!(c.node_names().await, ["node-a"]);
    c.stop().await;
}

fn replace(path: &Path, text: &str) {
    // Write beside and rename, as certificate managers do, so a reader never sees half.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_dropping_open_streams() {
    let pki = Pki::new();
    let files = pki.server_files(false);
    let tls = TlsOptions {
        grpc: Some(files.clone()),
        http: None,
        reload_poll: Duration::from_millis(100),
    };
    let c = start_tls(tls).await;
    let mut open = hello(&https_url(&c), pki.client(None), "reload-node")
        .await
        .expect("first connection");
    pki.renew_with_other_ca(&files);
    let trusts_new = pki.client_trusting_other_ca();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if hello(&https_url(&c), trusts_new.clone(), "reload-node-2")
            .await
            .is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served within 15 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stream opened before the renewal still works: a batch on it is acked.
    let uuid = "GPU-tls-reload-node";
    let batch = common::batch(1, now_ms() - 1_000, 1, &[uuid]);
    open._tx
        .send(pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Batch(batch.into())),
        })
        .await
        .expect("send on the old stream");
    let answer = tokio::time::timeout(Duration::from_secs(10), open.rx.message())
        .await
        .expect("answer within 10 s")
        .expect("old stream still open");
    assert!(
        matches!(
            answer.and_then(|m| m.msg),
            Some(pb::collector_message::Msg::Ack(pb::Ack { seq: 1 }))
        ),
        "the batch on the pre-renewal stream is acked"
    );
    c.stop().await;
}

/// A rustls client config (ring) trusting only `ca`.
fn rustls_client_trusting(ca: &DevCa) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let ca: rustls_pki_types::CertificateDer<'static> =
        rustls_pki_types::pem::PemObject::from_pem_slice(ca.pem.cert.as_bytes()).expect("ca der");
    roots.add(ca).expect("root");
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// Whether a client trusting only `ca` completes a handshake with `tls`'s current config.
async fn handshake_trusting(tls: &ReloadableTls, ca: &DevCa) -> bool {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let connector = tokio_rustls::TlsConnector::from(rustls_client_trusting(ca));
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let (client, _server) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(
            connector.connect(name, client_io),
            tls.acceptor().accept(server_io)
        )
    })
    .await
    .expect("handshake ends within 10 s");
    client.is_ok()
}

#[tokio::test]
async fn the_sighup_trigger_reloads_the_certificate_at_once() {
    use futures::StreamExt as _;
    let pki = Pki::new();
    let files = pki.server_files(false);
    let tls = ReloadableTls::load(files.clone(), Alpn::Grpc).expect("load");
    let (trigger, triggers) = mpsc::channel(1);
    let shutdown = CancellationToken::new();
    // A poll interval far beyond the test: only the trigger can reload.
    let task = tokio::spawn(ctls::reloader(
        vec![Arc::clone(&tls)],
        Duration::from_secs(3600),
        shutdown.clone(),
        ReceiverStream::new(triggers).boxed(),
    ));
    pki.renew_with_other_ca(&files);
    assert!(
        handshake_trusting(&tls, &pki.ca).await,
        "old certificate until the trigger"
    );
    assert!(!handshake_trusting(&tls, &pki.other_ca).await);

    trigger.send(()).await.expect("trigger");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !handshake_trusting(&tls, &pki.other_ca).await {
        assert!(
            Instant::now() < deadline,
            "not reloaded within 10 s of the trigger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !handshake_trusting(&tls, &pki.ca).await,
        "the old certificate is gone"
    );

    // A broken file on the next trigger keeps the renewed certificate in use.
    replace(&files.cert, "not a certificate");
    trigger.send(()).await.expect("trigger");
    trigger
        .send(())
        .await
        .expect("second trigger: the first was handled");
    assert!(
        handshake_trusting(&tls, &pki.other_ca).await,
        "previous config kept"
    );
    shutdown.cancel();
    task.await.expect("reloader stops");
}

/// Reads `lines` until one contains `needle`; panics at EOF or after 30 s.
async fn wait_for_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
    needle: &str,
) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match lines.next_line().await.expect("read log") {
                Some(line) if line.contains(needle) => return,
                Some(_) => {}
                None => panic!("the collector's log ended before {needle:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {needle:?} in the collector's log within 30 s"));
}

#[tokio::test]
async fn sighup_makes_the_collector_binary_serve_the_renewed_certificate() {
    use tokio::io::AsyncBufReadExt as _;
    let pki = Pki::new();
    let files = pki.server_files(false);
    let db = format!("sqlite://{}", pki.dir.path().join("sighup.db").display());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args(["serve", "--db", &db, "--grpc-listen", "127.0.0.1:0"])
        .args(["--http-listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&files.cert)
        .arg("--tls-key")
        .arg(&files.key)
        .env("GPUFLEET_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-collector");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut log = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("address line in time")
        .expect("read")
        .expect("a line");
    let grpc = first
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("grpc="))
        .expect("grpc=")
        .to_owned();
    // The SIGHUP handler is installed before the collector says it serves.
    wait_for_line(&mut log, "collector serving").await;

    pki.renew_with_other_ca(&files);
    let pid = child.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    wait_for_line(&mut log, "reloading TLS certificates (SIGHUP)").await;
    wait_for_line(&mut log, "TLS certificate reloaded").await;
    let trusts_new = pki.client_trusting_other_ca();
    hello(&format!("https://{grpc}"), trusts_new, "sighup-node")
        .await
        .expect("the renewed certificate is served after SIGHUP");

    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    // Drain the log so the collector never blocks on a full pipe while stopping.
    tokio::spawn(async move { while let Ok(Some(_)) = log.next_line().await {} });
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stops within 30 s")
        .expect("wait");
    assert!(
        exit.success(),
        "the collector survived SIGHUP and stopped cleanly: {exit}"
    );
}

fn required(tls: TlsOptions) -> ServeOptions {
    ServeOptions {
        tls,
        ingest: IngestOptions {
            agent_auth: AgentAuth::Required,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn tokens_bind_agents_to_their_node_and_bad_ones_store_nothing() {
    let pki = Pki::new();
    let c = start_collector(required(grpc_only(pki.server_files(false)))).await;
    let url = https_url(&c);
    let tls = || Some(pki.client(None));
    let revoked = add_token(&c, "node-a").await;
    let valid = add_token(&c, "node-a").await;
    let (id, _) = tokens::parse(&revoked).expect("token shape");
    tokens::run_on(
        c.store.as_ref(),
        TokensCommand::Revoke { id: id.to_owned() },
    )
    .await
    .expect("revoke");
    let (valid_id, _) = tokens::parse(&valid).expect("token shape");
    let viewer = tokens::run_on(
        c.store.as_ref(),
        TokensCommand::Add {
            node: "node-a".into(),
            role: tokens::Role::Viewer,
        },
    )
    .await
    .expect("viewer token");
    let viewer = viewer.lines().next().expect("token").to_owned();
    let wrong_secret = format!("Bearer gft_{valid_id}_{}", "0".repeat(64));
    let cases: [(&str, Option<String>, &str, Code, &str); 6] = [
        (
            "a viewer token",
            Some(format!("Bearer {viewer}")),
            "node-a",
            Code::PermissionDenied,
            "agents need an agent token",
        ),
        (
            "no credential",
            None,
            "node-a",
            Code::Unauthenticated,
            "requires agent credentials",
        ),
        (
            "not a token",
            Some("Bearer hunter2".into()),
            "node-a",
            Code::Unauthenticated,
            "malformed",
        ),
        (
            "wrong secret",
            Some(wrong_secret),
            "node-a",
            Code::Unauthenticated,
            "unknown agent token",
        ),
        (
            "revoked token",
            Some(format!("Bearer {revoked}")),
            "node-a",
            Code::Unauthenticated,
            "revoked",
        ),
        (
            "another node's token",
            Some(format!("Bearer {valid}")),
            "node-b",
            Code::PermissionDenied,
            "belongs to node",
        ),
    ];
    for (what, auth, node, code, says) in cases {
        let Err((got, why)) = hello_with(&url, tls(), auth.as_deref(), node).await else {
            panic!("{what} must be refused");
        };
        assert_eq!(got, code, "{what}: {why}");
        assert!(why.contains(says), "{what}: {why}");
        assert!(
            !why.contains(valid.as_str()),
            "{what}: the token is never echoed"
        );
    }
    assert!(c.node_names().await.is_empty(), "nothing stored");
    hello_with(&url, tls(), Some(&format!("Bearer {valid}")), "node-a")
        .await
        .expect("the valid token writes as its node");
    assert_eq!(c.node_names().await, ["node-a"]);
    let list = tokens::run_on(c.store.as_ref(), TokensCommand::List)
        .await
        .expect("list");
    assert_eq!(list.lines().count(), 4, "header + 3 tokens: {list}");
    assert!(list.contains(valid_id) && list.contains(id), "{list}");
    let (_, secret) = tokens::parse(&valid).expect("shape");
    assert!(!list.contains(secret), "list never shows secrets");
    c.stop().await;
}

#[tokio::test]
async fn a_real_agent_with_a_token_over_tls_gets_acked() {
    let pki = Pki::new();
    let c = start_collector(required(grpc_only(pki.server_files(false)))).await;
    let token = add_token(&c, "token-node").await;
    let shutdown = CancellationToken::new();
    let opts = RunOptions {
        interval: Duration::from_millis(50),
        batch_max_ticks: 1,
        credentials: Credentials::none()
            .with_tls(pki.client(None))
            .with_token(&token)
            .expect("token"),
        ..RunOptions::new("token-node", vec![https_url(&c)])
    };
    let sim = simulator(SimOptions::new("token-node", 1)).expect("simulator");
    let agent = tokio::spawn(run_agent(opts, Box::new(sim), shutdown.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c
        .store
        .nodes()
        .await
        .expect("nodes")
        .iter()
        .any(|n| n.name == "token-node" && n.last_acked_seq >= 2)
    {
        assert!(Instant::now() < deadline, "no acked batch within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let summary = agent.await.expect("join").expect("agent ran");
    assert!(summary.acked >= 2, "{summary}");
    c.stop().await;
}

#[tokio::test]
async fn on_loopback_credentials_are_optional_but_checked_when_given() {
    let c = start_collector(ServeOptions::default()).await;
    let url = format!("http://{}", c.grpc);
    hello_with(&url, None, None, "local-node")
        .await
        .expect("loopback default: no credential needed");
    let Err((code, why)) = hello_with(&url, None, Some("Bearer gft_00_00"), "local-node-2").await
    else {
        panic!("a presented token is checked even on loopback");
    };
    assert_eq!(code, Code::Unauthenticated, "{why}");
    assert_eq!(c.node_names().await, ["local-node"]);
    c.stop().await;
}

#[tokio::test]
async fn the_http_api_is_served_over_tls_and_refuses_plain_text() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let pki = Pki::new();
    let files = pki.server_files(false);
    let c = start_tls(TlsOptions {
        http: Some(files),
        ..TlsOptions::default()
    })
    .await;
    let connector = tokio_rustls::TlsConnector::from(rustls_client_trusting(&pki.ca));
    let tcp = tokio::net::TcpStream::connect(c.http)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = connector.connect(name, tcp).await.expect("handshake");
    tls.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_string(&mut response))
        .await
        .expect("answer within 10 s")
        .expect("read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#""status":"ok""#), "{response}");

    // Plain HTTP on the TLS port gets no answer from the API.
    let mut plain = tokio::net::TcpStream::connect(c.http)
        .await
        .expect("connect");
    plain
        .write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut buf)).await;
    assert!(
        !String::from_utf8_lossy(&buf).contains("status"),
        "no API answer over plain text"
    );
    c.stop().await;
}

#[tokio::test]
async fn a_tls_connection_that_never_starts_http2_is_closed() {
    use tokio::io::AsyncReadExt as _;
    let pki = Pki::new();
    let c = start_collector(ServeOptions {
        tls: grpc_only(pki.server_files(false)),
        limits: gpufleet_collector::net::limits::LimitOptions {
            grpc_handshake_timeout: Duration::from_millis(300),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let connector = tokio_rustls::TlsConnector::from(rustls_client_trusting(&pki.ca));
    let tcp = tokio::net::TcpStream::connect(c.grpc)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("localhost").expect("name");
    let mut silent = connector.connect(name, tcp).await.expect("handshake");
    // It finished TLS and then says nothing: closed after the deadline.
    let started = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await {
            Err(_) => panic!("still open after 10 s"),
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(_)) => {}
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // An agent that speaks at once is served, and its stream outlives the deadline.
    let mut open = hello(&https_url(&c), pki.client(None), "tls-node")
        .await
        .expect("welcome");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let batch = common::batch(1, now_ms() - 1_000, 1, &["GPU-tls-tls-node"]);
    open._tx
        .send(pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Batch(batch.into())),
        })
        .await
        .expect("send");
    let answer = tokio::time::timeout(Duration::from_secs(10), open.rx.message())
        .await
        .expect("an answer")
        .expect("stream healthy")
        .and_then(|m| m.msg);
    assert!(
        matches!(answer, Some(pb::collector_message::Msg::Ack(_))),
        "{answer:?}"
    );
    c.stop().await;
}

/// Remote-write's client trusts the CA it is given (`--remote-write-ca`) and refuses a
/// server signed by another one; the collector's own HTTPS listener stands in for the
/// receiver.
#[tokio::test]
async fn remote_write_trusts_the_ca_it_is_given() {
    use gpufleet_collector::remote_write::{Auth, Delivery, HttpSink, Sink};
    let pki = Pki::new();
    let c = start_tls(TlsOptions {
        http: Some(pki.server_files(false)),
        ..TlsOptions::default()
    })
    .await;
    let url = format!("https://localhost:{}/api/v1/write", c.http.port());
    let sink = |ca: &DevCa| {
        HttpSink::new(
            &url,
            Auth::None,
            Some(("ca.pem", ca.pem.cert.as_bytes())),
            Duration::from_secs(10),
        )
        .expect("client")
    };
    // Past the handshake the collector answers (it has no such route) with a 404.
    let trusted = sink(&pki.ca).send(vec![0]).await;
    assert!(
        matches!(&trusted, Delivery::Retry { why, .. } if why.starts_with("404")),
        "{trusted:?}"
    );
    let untrusted = sink(&pki.other_ca).send(vec![0]).await;
    assert!(
        matches!(&untrusted, Delivery::Retry { why, .. } if why.contains("invalid peer certificate")),
        "{untrusted:?}"
    );
    c.stop().await;
}
