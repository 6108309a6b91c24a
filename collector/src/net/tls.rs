//! TLS on the collector's listeners (rustls, `ring` provider), with certificates reloaded
//! on SIGHUP or when their files change, without dropping the service.
//!
//! We terminate TLS ourselves (tokio-rustls) instead of letting tonic or axum do it, so
//! one code path serves both listeners and the [`ServerConfig`] can be swapped at run
//! time: every new connection takes the current config; open connections keep theirs.
//! An accept task per listener admits connections within the per-address limit
//! ([`crate::net::conn_limit`]) and hands each to its own handshake task (bounded by a timeout
//! and a semaphore), so a client that never finishes its handshake holds up nobody else;
//! finished handshakes go to the server through a bounded channel.
//!
//! mTLS (`--client-ca`): the client must present a certificate signed by that CA; rustls
//! refuses the handshake otherwise. Which node the certificate may write as is decided in
//! [`crate::ingest::identity`] from the certificate's DNS names.

use crate::net::conn_limit::{Limited, PerIpLimit, accept_one};
use futures::future::BoxFuture;
use rustls::RootCertStore;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// The TLS command-line options of `serve` (flattened into its arguments).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain the collector presents, on gRPC and (unless --http-tls-cert
    /// is given) on HTTP. Reloaded on SIGHUP or when the file changes.
    #[arg(
        long,
        env = "GPUFLEET_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(
        long,
        env = "GPUFLEET_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) agents' client certificates must chain to (mTLS on gRPC):
    /// an agent without such a certificate cannot connect.
    #[arg(
        long,
        env = "GPUFLEET_CLIENT_CA",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    pub client_ca: Option<PathBuf>,
    /// PEM certificate chain for the HTTP listener, when it differs from --tls-cert.
    #[arg(
        long,
        env = "GPUFLEET_HTTP_TLS_CERT",
        value_name = "FILE",
        requires = "http_tls_key"
    )]
    pub http_tls_cert: Option<PathBuf>,
    /// PEM private key of --http-tls-cert.
    #[arg(
        long,
        env = "GPUFLEET_HTTP_TLS_KEY",
        value_name = "FILE",
        requires = "http_tls_cert"
    )]
    pub http_tls_key: Option<PathBuf>,
    /// Accept agents without a token or client certificate even when the gRPC listener
    /// is not on loopback (by default they must authenticate there).
    #[arg(long, env = "GPUFLEET_ALLOW_UNAUTHENTICATED_AGENTS")]
    pub allow_unauthenticated_agents: bool,
    /// Serve the dashboard and API without login even when the HTTP listener is not on
    /// loopback (by default viewers must log in there).
    #[arg(long, env = "GPUFLEET_ALLOW_ANONYMOUS_VIEWERS")]
    pub allow_anonymous_viewers: bool,
    /// Most connections open at once from one client address, per listener; more are
    /// closed at once (a flood from one address cannot starve the others).
    #[arg(long, env = "GPUFLEET_MAX_CONNECTIONS_PER_IP", default_value_t = crate::net::conn_limit::DEFAULT_MAX_PER_IP, value_name = "N")]
    pub max_connections_per_ip: usize,
}

impl TlsArgs {
    /// The viewer authentication policy these options ask for.
    pub fn web_auth(&self) -> crate::auth::web::WebAuthMode {
        if self.allow_anonymous_viewers {
            crate::auth::web::WebAuthMode::Off
        } else {
            crate::auth::web::WebAuthMode::Auto
        }
    }

    /// The agent authentication policy these options ask for.
    pub fn agent_auth(&self) -> crate::ingest::identity::AgentAuth {
        if self.allow_unauthenticated_agents {
            crate::ingest::identity::AgentAuth::Optional
        } else {
            crate::ingest::identity::AgentAuth::Auto
        }
    }

    /// What each listener serves: gRPC takes `--tls-*` and `--client-ca`; HTTP takes
    /// `--http-tls-*`, else `--tls-*` (never client certificates: browsers log in).
    pub fn options(&self) -> TlsOptions {
        let grpc = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.client_ca.clone(),
            }),
            _ => None,
        };
        let http = match (&self.http_tls_cert, &self.http_tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: None,
            }),
            _ => grpc.as_ref().map(|g| TlsFiles {
                client_ca: None,
                ..g.clone()
            }),
        };
        TlsOptions {
            grpc,
            http,
            ..TlsOptions::default()
        }
    }
}

/// TLS settings of both listeners; `None`: plain TCP.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    pub grpc: Option<TlsFiles>,
    pub http: Option<TlsFiles>,
    /// How often the certificate files are checked for changes (SIGHUP reloads at once).
    pub reload_poll: Duration,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            grpc: None,
            http: None,
            reload_poll: Duration::from_secs(10),
        }
    }
}

/// The PEM files one listener's TLS is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// When set, clients must present a certificate chaining to one of these CAs.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> impl Iterator<Item = &Path> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }
}

/// Why a TLS configuration could not be built. Never carries key material.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{what} {path} holds no PEM {kind}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("invalid TLS configuration: {0}")]
    Config(String),
}

/// Which ALPN protocols a listener offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// gRPC: HTTP/2 only.
    Grpc,
    /// HTTP API and page: HTTP/2 or HTTP/1.1.
    Http,
}

/// A listener's TLS configuration that can be reloaded while it serves.
#[derive(Debug)]
pub struct ReloadableTls {
    files: TlsFiles,
    alpn: Alpn,
    current: RwLock<Arc<ServerConfig>>,
    /// Modification times and sizes of the files when last loaded.
    stamp: Mutex<Vec<Option<(SystemTime, u64)>>>,
}

impl ReloadableTls {
    /// Loads the files now; fails with a message naming the bad file.
    pub fn load(files: TlsFiles, alpn: Alpn) -> Result<Arc<ReloadableTls>, TlsError> {
        let stamp = stamps(&files);
        let config = build_config(&files, alpn)?;
        Ok(Arc::new(ReloadableTls {
            files,
            alpn,
            current: RwLock::new(Arc::new(config)),
            stamp: Mutex::new(stamp),
        }))
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        let config = match self.current.read() {
            Ok(c) => Arc::clone(&c),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        };
        TlsAcceptor::from(config)
    }

    /// Whether a file changed (time or size) since it was last loaded.
    pub fn changed(&self) -> bool {
        let now = stamps(&self.files);
        match self.stamp.lock() {
            Ok(s) => *s != now,
            Err(_) => true,
        }
    }

    /// Reloads the files. On error the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamp = stamps(&self.files);
        let config = build_config(&self.files, self.alpn)?;
        match self.current.write() {
            Ok(mut c) => *c = Arc::new(config),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(config),
        }
        if let Ok(mut s) = self.stamp.lock() {
            *s = stamp;
        }
        Ok(())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
    files
        .paths()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read_err = |e: rustls_pki_types::pem::Error| TlsError::Read {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_err)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_owned(),
            kind: "certificate",
        });
    }
    Ok(certs)
}

/// Builds a rustls server configuration from PEM files, with the `ring` provider.
pub fn build_config(files: &TlsFiles, alpn: Alpn) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs("certificate file", &files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "key file",
            path: files.key.clone(),
            kind: "private key",
        },
        // The error may quote the file's content: say only that it is unreadable.
        _ => TlsError::Read {
            what: "key file",
            path: files.key.clone(),
            reason: "not a readable PEM private key".into(),
        },
    })?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs("client CA file", ca)? {
                roots.add(cert).map_err(|e| {
                    TlsError::Config(format!("client CA file {}: {e}", ca.display()))
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Config(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        TlsError::Config(format!(
            "certificate {} and key {} do not form a usable pair: {e}",
            files.cert.display(),
            files.key.display()
        ))
    })?;
    config.alpn_protocols = match alpn {
        Alpn::Grpc => vec![b"h2".to_vec()],
        Alpn::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    Ok(config)
}

/// Limits of the TLS accept loop.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeLimits {
    /// A client must finish its handshake within this time.
    pub timeout: Duration,
    /// Handshakes in progress at once; beyond, new connections wait to be accepted.
    pub max_in_progress: usize,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            timeout: Duration::from_secs(10),
            max_in_progress: 256,
        }
    }
}

/// A connection that finished its TLS handshake.
pub type Accepted = (TlsStream<Limited>, SocketAddr);

/// Accepts connections on `listener` (within the per-address `limit`) and performs their
/// handshakes concurrently; yields the finished ones. Stops when `shutdown` is cancelled
/// or the receiver is dropped.
pub fn accept_tls(
    listener: TcpListener,
    tls: Arc<ReloadableTls>,
    limits: HandshakeLimits,
    limit: Arc<PerIpLimit>,
    shutdown: CancellationToken,
) -> mpsc::Receiver<Accepted> {
    let (tx, rx) = mpsc::channel(64);
    let permits = Arc::new(Semaphore::new(limits.max_in_progress.max(1)));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                () = shutdown.cancelled() => break,
                p = Arc::clone(&permits).acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => break,
                },
            };
            let accepted = tokio::select! {
                () = tx.closed() => None,
                c = accept_one(&listener, &limit, &shutdown) => c,
            };
            let Some((tcp, peer)) = accepted else { break };
            let acceptor = tls.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(limits.timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send((stream, peer)).await;
                    }
                    Ok(Err(e)) => debug!(peer = %peer, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(peer = %peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}

/// Reloads `configs` on SIGHUP, and when one of their files changed (checked every
/// `poll`), until `shutdown`. A failed reload keeps the previous configuration and logs
/// why. The SIGHUP handler is installed before this returns (and only when there is
/// something to reload).
pub fn spawn_reloader(
    configs: Vec<Arc<ReloadableTls>>,
    poll: Duration,
    shutdown: CancellationToken,
) -> BoxFuture<'static, ()> {
    if configs.is_empty() {
        return Box::pin(async {});
    }
    reloader(configs, poll, shutdown, hangups())
}

/// SIGHUPs, as a stream; never yields where there are none (or the handler cannot be
/// installed, which is logged).
fn hangups() -> futures::stream::BoxStream<'static, ()> {
    use futures::StreamExt as _;
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => {
            return futures::stream::unfold(signal, |mut s| async move {
                s.recv().await.map(|()| ((), s))
            })
            .boxed();
        }
        Err(e) => {
            warn!(error = %e, "cannot install the SIGHUP handler; certificates reload only when their files change")
        }
    }
    futures::stream::pending().boxed()
}

/// The reload loop of [`spawn_reloader`], with the forced-reload trigger (SIGHUP there)
/// given as a stream: each item reloads every config now, changed or not.
pub fn reloader(
    configs: Vec<Arc<ReloadableTls>>,
    poll: Duration,
    shutdown: CancellationToken,
    mut triggers: futures::stream::BoxStream<'static, ()>,
) -> BoxFuture<'static, ()> {
    use futures::StreamExt as _;
    Box::pin(async move {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut triggers_open = true;
        loop {
            let forced = tokio::select! {
                () = shutdown.cancelled() => return,
                t = triggers.next(), if triggers_open => match t {
                    Some(()) => true,
                    None => {
                        triggers_open = false;
                        continue;
                    }
                },
                _ = tick.tick() => false,
            };
            if forced {
                info!("reloading TLS certificates (SIGHUP)");
            }
            for tls in &configs {
                if !forced && !tls.changed() {
                    continue;
                }
                let cert = tls.files().cert.display().to_string();
                match tls.reload() {
                    Ok(()) => info!(cert = %cert, "TLS certificate reloaded"),
                    Err(e) => {
                        warn!(cert = %cert, error = %e, "TLS reload failed; keeping the previous certificate")
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_takes_its_own_pair_or_the_grpc_one_never_the_client_ca() {
        let mut args = TlsArgs {
            tls_cert: Some("g.pem".into()),
            tls_key: Some("g.key".into()),
            client_ca: Some("ca.pem".into()),
            ..TlsArgs::default()
        };
        let o = args.options();
        let grpc = o.grpc.expect("grpc tls");
        assert_eq!(grpc.client_ca.as_deref(), Some(Path::new("ca.pem")));
        let http = o.http.expect("http tls");
        assert_eq!(http.cert, Path::new("g.pem"));
        assert_eq!(
            http.client_ca, None,
            "browsers are not asked for certificates"
        );
        args.http_tls_cert = Some("h.pem".into());
        args.http_tls_key = Some("h.key".into());
        assert_eq!(args.options().http.expect("http").cert, Path::new("h.pem"));
        let none = TlsArgs::default().options();
        assert!(none.grpc.is_none() && none.http.is_none());
    }

    #[test]
    fn a_bad_key_file_is_named_without_quoting_it() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = crate::net::certs::DevCa::new(crate::net::certs::Validity::days(1)).expect("ca");
        let server = ca
            .server(&["localhost".into()], crate::net::certs::Validity::days(1))
            .expect("cert");
        let cert = dir.path().join("s.pem");
        let key = dir.path().join("s.key");
        std::fs::write(&cert, &server.cert).expect("write");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
        )
        .expect("write");
        let files = TlsFiles {
            cert,
            key,
            client_ca: None,
        };
        let err = build_config(&files, Alpn::Grpc).expect_err("bad key");
        let text = err.to_string();
        assert!(text.contains("s.key") || text.contains("s.pem"), "{text}");
        assert!(
            !text.contains("c2VjcmV0"),
            "key material never in messages: {text}"
        );
    }
}
