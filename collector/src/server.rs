//! Running the collector: store, live state, group-commit writer, gRPC ingest and HTTP,
//! under one shutdown token.
//!
//! The listeners are bound by the caller (so tests and `demo` can use port 0 and learn the
//! real address first). Shutdown order, once the token is cancelled: both servers stop
//! accepting; ingest streams stop reading, get the answers for what they already handed
//! to the writer, and end with `UNAVAILABLE`; then the writer commits and answers whatever
//! is still queued, and the store is closed.

use crate::accountant::{self, EnergyOptions};
use crate::http::{self, AppState};
use crate::ingest::{IngestOptions, IngestService};
use crate::live::Live;
use crate::metrics::Metrics;
use crate::status::{StatusPolicy, system_clock};
use crate::store::{self, Store, StoreError};
use crate::writer::{self, WriterOptions};
use futures::StreamExt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Everything `serve` needs besides the listeners.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `sqlite://PATH` (created if missing) or `sqlite::memory:`.
    pub db_url: String,
    /// When nodes count as stale / offline.
    pub status: StatusPolicy,
    pub ingest: IngestOptions,
    pub writer: WriterOptions,
    /// After shutdown is requested, how long open streams and HTTP requests get to finish
    /// before the servers are dropped (the writer still commits what it has).
    pub shutdown_grace: Duration,
    /// Energy accounting: idle policy, idle power, gap limit.
    pub energy: EnergyOptions,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            db_url: "sqlite://gpufleet.db".into(),
            status: StatusPolicy::default(),
            ingest: IngestOptions::default(),
            writer: WriterOptions::default(),
            shutdown_grace: Duration::from_secs(10),
            energy: EnergyOptions::default(),
        }
    }
}

/// Why the collector stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read a listener's address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("the gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    #[error("the HTTP server failed: {0}")]
    Http(#[source] std::io::Error),
}

/// Opens the store `options.db_url` names and runs the collector on the given listeners
/// until `shutdown` is cancelled. Returns after a clean shutdown (everything acked is
/// committed, the store is closed).
pub async fn serve(
    options: ServeOptions,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let store = store::open(&options.db_url).await?;
    let result = serve_with_store(Arc::clone(&store), options, grpc, http, shutdown).await;
    store.close().await;
    result
}

/// Like [`serve`], with a store the caller opened (and closes). `options.db_url` is
/// ignored.
pub async fn serve_with_store(
    store: Arc<dyn Store>,
    options: ServeOptions,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let grpc_addr = grpc.local_addr().map_err(ServeError::Listener)?;
    let http_addr = http.local_addr().map_err(ServeError::Listener)?;
    warn_if_exposed("gRPC ingest", grpc_addr);
    warn_if_exposed("HTTP API", http_addr);

    let live = Arc::new(Live::new());
    live.seed(
        store.nodes().await?,
        store.latest_gpu_samples().await?,
        store.latest_host_samples().await?,
    );
    let metrics = Arc::new(Metrics::default());
    let writer_stop = CancellationToken::new();
    let (writer, writer_task) = writer::spawn(
        Arc::clone(&store),
        Arc::clone(&live),
        Arc::clone(&metrics),
        options.writer,
        writer_stop.clone(),
    );
    let accountant_stop = CancellationToken::new();
    let accountant_task = accountant::spawn(
        Arc::clone(&store),
        Arc::clone(&live),
        options.energy.clone(),
        system_clock(),
        accountant_stop.clone(),
    );
    let ingest = IngestService::new(
        Arc::clone(&store),
        writer.clone(),
        Arc::clone(&live),
        Arc::clone(&metrics),
        options.ingest.clone(),
        shutdown.clone(),
    );
    let incoming = TcpListenerStream::new(grpc).map(|conn| {
        conn.inspect(|tcp| {
            // Acks are small and latency-bound.
            let _ = tcp.set_nodelay(true);
        })
    });
    let grpc_server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(ingest.into_server())
        .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
    let state = AppState {
        store: Arc::clone(&store),
        live,
        metrics,
        writer: Some(writer),
        status: options.status,
        clock: system_clock(),
    };
    let http_server = axum::serve(http, http::app(state))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
    info!(grpc = %grpc_addr, http = %http_addr, db = store.backend(), "collector serving");

    let servers = async {
        tokio::join!(
            async {
                let r = grpc_server.await;
                shutdown.cancel(); // one server failing stops the other
                r
            },
            async {
                let r = http_server.await;
                shutdown.cancel();
                r
            },
        )
    };
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(options.shutdown_grace).await;
    };
    let (grpc_result, http_result) = tokio::select! {
        results = servers => results,
        () = grace => {
            warn!(grace_s = options.shutdown_grace.as_secs(), "streams or requests still open after the shutdown grace period; closing them");
            (Ok(()), Ok(()))
        }
    };
    info!("servers stopped; committing what is queued");
    writer_stop.cancel();
    if let Err(e) = writer_task.await {
        warn!(error = %e, "the writer task ended abnormally");
    }
    accountant_stop.cancel();
    if let Err(e) = accountant_task.await {
        warn!(error = %e, "the energy accountant ended abnormally");
    }
    grpc_result?;
    http_result.map_err(ServeError::Http)?;
    info!("collector stopped");
    Ok(())
}

fn warn_if_exposed(what: &str, addr: SocketAddr) {
    if !addr.ip().is_loopback() {
        warn!(
            listen = %addr,
            "{what} listens on a non-loopback address without TLS or authentication \
             (they come in a later release): anyone who can reach it can use it"
        );
    }
}
