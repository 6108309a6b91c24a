//! Running the collector: store, live state, group-commit writer, gRPC ingest and HTTP,
//! background jobs under leases ([`crate::accounting::leader`]) and the store follower
//! ([`crate::live::follow`]), under one shutdown token.
//!
//! The listeners are bound by the caller (so tests and `demo` can use port 0 and learn the
//! real address first). Shutdown order, once the token is cancelled: both servers stop
//! accepting; ingest streams stop reading, get the answers for what they already handed
//! to the writer, and end with `UNAVAILABLE`; then the writer commits and answers whatever
//! is still queued, and the store is closed.

use crate::accounting::accountant::{self, EnergyOptions};
use crate::api::router::{self, AppState};
use crate::ingest::stream::{IngestOptions, IngestService};
use crate::ingest::writer::{self, WriterOptions};
use crate::live::state::Live;
use crate::live::status::{StatusPolicy, system_clock};
use crate::metrics::Metrics;
use crate::net::conn_limit::{self, Listener, PerIpLimit};
use crate::net::refuse;
use crate::net::tls::{self, Alpn, HandshakeLimits, ReloadableTls, TlsOptions};
use crate::store::{self, Store, StoreError};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Everything `serve` needs besides the listeners.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// `sqlite://PATH` (created if missing), `sqlite::memory:` or `postgres://...`.
    pub db_url: String,
    /// When nodes count as stale / offline.
    pub status: StatusPolicy,
    pub ingest: IngestOptions,
    pub writer: WriterOptions,
    /// After shutdown is requested, how long open streams and HTTP requests get to finish
    /// before the servers are dropped (the writer still commits what it has).
    pub shutdown_grace: Duration,
    /// TLS on the gRPC and HTTP listeners; `None` each: plain TCP.
    pub tls: TlsOptions,
    /// Whether dashboard and API viewers must log in ([`crate::auth::web`]).
    pub web_auth: crate::auth::web::WebAuthMode,
    /// Most connections open at once from one client address, per listener.
    pub max_connections_per_ip: usize,
    /// Whether loopback clients of the gRPC listener are spared the per-address
    /// connection limit and stream rate: the demo's simulated agents, all connecting from
    /// 127.0.0.1. Off for real deployments (the HTTP listener is always limited).
    pub spare_loopback_agents: bool,
    /// Header deadline and per-address request rates ([`crate::net::limits`]).
    pub limits: crate::net::limits::LimitOptions,
    /// Energy accounting: idle policy, idle power, gap limit.
    pub energy: EnergyOptions,
    /// Whether to follow what other collectors on the same database commit
    /// ([`crate::live::follow`]; default: on PostgreSQL only).
    pub follow: crate::live::follow::FollowMode,
    /// How background jobs' leases are asked for ([`crate::accounting::leader`]).
    pub lead: crate::accounting::leader::LeadOptions,
    /// Per-minute rollups and retention.
    pub retention: crate::accounting::rollups::RetentionOptions,
    /// Carbon accounting: providers, regions, PUE ([`crate::accounting::carbon`]).
    pub carbon: crate::accounting::carbon::CarbonOptions,
    /// Prometheus remote-write ([`crate::remote_write`]); `None`: off.
    pub remote_write: Option<crate::remote_write::RemoteWriteOptions>,
    /// `/metrics` per-workload counters: refresh period, series cap.
    pub counters: crate::accounting::counters::CounterOptions,
    /// Alert rules and webhooks ([`crate::alerts`]); the default rules unless configured.
    pub alerts: crate::alerts::AlertOptions,
    /// The idle-but-allocated rule: `/api/v1/waste`'s defaults and `/metrics`' gauge
    /// ([`crate::accounting::waste`]).
    pub waste: crate::accounting::waste::WasteSettings,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            db_url: "sqlite://gpufleet.db".into(),
            status: StatusPolicy::default(),
            ingest: IngestOptions::default(),
            writer: WriterOptions::default(),
            shutdown_grace: Duration::from_secs(10),
            tls: TlsOptions::default(),
            web_auth: crate::auth::web::WebAuthMode::Auto,
            max_connections_per_ip: crate::net::conn_limit::DEFAULT_MAX_PER_IP,
            spare_loopback_agents: false,
            limits: crate::net::limits::LimitOptions::default(),
            energy: EnergyOptions::default(),
            follow: crate::live::follow::FollowMode::default(),
            lead: crate::accounting::leader::LeadOptions::default(),
            retention: crate::accounting::rollups::RetentionOptions::default(),
            carbon: crate::accounting::carbon::CarbonOptions::default(),
            remote_write: None,
            counters: crate::accounting::counters::CounterOptions::default(),
            alerts: crate::alerts::AlertOptions::default(),
            waste: crate::accounting::waste::WasteSettings::default(),
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
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("alerts: {0}")]
    Alerts(String),
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
    let result = serve_with_store(store.clone(), options, grpc, http, shutdown).await;
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
    let load = |files: &Option<tls::TlsFiles>, alpn| {
        files
            .clone()
            .map(|f| ReloadableTls::load(f, alpn))
            .transpose()
    };
    let grpc_tls = load(&options.tls.grpc, Alpn::Grpc)?;
    let http_tls = load(&options.tls.http, Alpn::Http)?;
    let (grpc_has_tls, http_has_tls) = (grpc_tls.is_some(), http_tls.is_some());
    let reloader = tls::spawn_reloader(
        grpc_tls.iter().chain(http_tls.iter()).cloned().collect(),
        options.tls.reload_poll,
        shutdown.clone(),
    );
    tokio::spawn(reloader);

    let live = Arc::new(Live::new());
    live.seed(
        store.nodes().await?,
        store.latest_gpu_samples().await?,
        store.latest_host_samples().await?,
        store.latest_gpu_health().await?,
    );
    crate::health::seed_memory(store.as_ref(), &live, gpufleet_core::config::now_ms()).await?;
    let metrics = Arc::new(Metrics::default());
    let writer_stop = CancellationToken::new();
    let (writer, writer_task) = writer::spawn(
        store.clone(),
        Arc::clone(&live),
        Arc::clone(&metrics),
        options.writer,
        writer_stop.clone(),
    );
    let mut ingest_options = options.ingest.clone();
    ingest_options.agent_auth = ingest_options
        .agent_auth
        .resolve(grpc_addr.ip().is_loopback());
    let agent_auth_optional =
        ingest_options.agent_auth == crate::ingest::identity::AgentAuth::Optional;
    let accountant_stop = CancellationToken::new();
    let accountant_task = accountant::spawn(
        store.clone(),
        store.clone(),
        Arc::clone(&live),
        options.energy.clone(),
        system_clock(),
        Arc::clone(&metrics),
        options.lead,
        accountant_stop.clone(),
    );
    let follower_task = options.follow.period(store.shared()).map(|period| {
        crate::live::follow::spawn(
            store.clone(),
            Arc::clone(&live),
            period,
            accountant_stop.clone(),
        )
    });
    let rollups_stop = CancellationToken::new();
    // Rollups and retention run once across collectors sharing the database, like the
    // energy accountant: each term of leadership starts the task afresh.
    let rollups_task = crate::accounting::leader::spawn(
        store.clone(),
        crate::accounting::rollups::JOB,
        Arc::clone(&metrics),
        options.lead,
        rollups_stop.clone(),
        {
            let (store, live, retention, metrics) = (
                store.clone(),
                Arc::clone(&live),
                options.retention.clone(),
                Arc::clone(&metrics),
            );
            move |term| {
                let task = crate::accounting::rollups::spawn(
                    store.clone(),
                    Arc::clone(&live),
                    retention.clone(),
                    system_clock(),
                    Arc::clone(&metrics),
                    term,
                );
                joined(crate::accounting::rollups::JOB, task)
            }
        },
    );
    // Carbon pricing (and its provider fetches) also run once across collectors.
    let carbon_task = crate::accounting::leader::spawn(
        store.clone(),
        crate::accounting::carbon::JOB,
        Arc::clone(&metrics),
        options.lead,
        accountant_stop.clone(),
        {
            let (store, carbon) = (store.clone(), options.carbon.clone());
            move |term| {
                let task = crate::accounting::carbon::spawn(
                    store.clone(),
                    store.clone(),
                    carbon.clone(),
                    system_clock(),
                    term,
                );
                joined(crate::accounting::carbon::JOB, task)
            }
        },
    );
    // Remote-write pushes once across collectors too; its positions are in the database.
    let remote_write_task = options.remote_write.clone().map(|rw| {
        metrics
            .remote_write
            .enabled
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let (store, stats) = (store.clone(), Arc::clone(&metrics.remote_write));
        crate::accounting::leader::spawn(
            store.clone(),
            crate::remote_write::JOB,
            Arc::clone(&metrics),
            options.lead,
            accountant_stop.clone(),
            move |term| {
                crate::remote_write::run_term(
                    store.clone(),
                    store.clone(),
                    rw.clone(),
                    Arc::clone(&stats),
                    system_clock(),
                    term,
                )
            },
        )
    });
    // Every collector serves /metrics, so each refreshes its own counters (reads only);
    // the alerts job reads the ongoing idle-but-allocated episodes from them.
    let workloads = Arc::new(crate::accounting::counters::WorkloadCounters::new(
        options.counters.max_workloads,
    ));
    // Alert rules are evaluated once across collectors; alerts live in the database.
    let alert_posts = options.alerts.posts().map_err(ServeError::Alerts)?;
    let alerts_task = crate::accounting::leader::spawn(
        store.clone(),
        crate::alerts::JOB,
        Arc::clone(&metrics),
        options.lead,
        accountant_stop.clone(),
        {
            let scheme = if http_has_tls { "https" } else { "http" };
            let t = crate::alerts::Term {
                external_url: (options.alerts.settings.external_url.clone())
                    .unwrap_or_else(|| format!("{scheme}://{http_addr}")),
                options: options.alerts.clone(),
                posts: alert_posts,
                status: options.status,
                stats: Arc::clone(&metrics.alerts),
                workloads: Arc::clone(&workloads),
            };
            let (store, live) = (store.clone(), Arc::clone(&live));
            move |term| {
                crate::alerts::run_term(
                    store.clone(),
                    Arc::clone(&live),
                    t.clone(),
                    system_clock(),
                    term,
                )
            }
        },
    );
    let counters_task = crate::accounting::counters::spawn(
        store.clone(),
        Arc::clone(&live),
        Arc::clone(&options.carbon.config),
        Arc::clone(&workloads),
        crate::accounting::counters::CounterOptions {
            waste: options.waste,
            ..options.counters
        },
        system_clock(),
        accountant_stop.clone(),
    );
    let ingest = IngestService::new(
        store.clone(),
        store.clone(),
        writer.clone(),
        Arc::clone(&live),
        Arc::clone(&metrics),
        ingest_options,
        shutdown.clone(),
    );
    let grpc_router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            ingest.into_server(),
            crate::net::rate_limit::grpc_interceptor(
                crate::net::rate_limit::PerIpRate::new(options.limits.grpc_stream_rate),
                options.spare_loopback_agents,
            ),
        ));
    let stop = shutdown.clone().cancelled_owned();
    let conn_stats = Arc::clone(&metrics.connections);
    let http_per_ip = Arc::new(
        PerIpLimit::new(
            Listener::Http,
            options.max_connections_per_ip,
            Arc::clone(&conn_stats),
        )
        .with_live_budget(options.limits.live),
    );
    let grpc_per_ip = {
        let limit = PerIpLimit::new(Listener::Grpc, options.max_connections_per_ip, conn_stats);
        Arc::new(if options.spare_loopback_agents {
            limit.sparing_loopback()
        } else {
            limit
        })
    };
    let grpc_server: BoxFuture<'static, Result<(), tonic::transport::Error>> = match grpc_tls {
        None => {
            // Nodelay is set on accept: acks are small and latency-bound.
            let rx = refuse::admitted(conn_limit::require_h2_preface(
                conn_limit::accept(grpc, grpc_per_ip, shutdown.clone()),
                options.limits.grpc_handshake_timeout,
            ));
            let incoming =
                ReceiverStream::new(rx).map(|(stream, _peer)| Ok::<_, std::io::Error>(stream));
            Box::pin(grpc_router.serve_with_incoming_shutdown(incoming, stop))
        }
        Some(tls) => {
            let rx = refuse::admitted(conn_limit::require_h2_preface(
                tls::accept_tls(
                    grpc,
                    tls,
                    HandshakeLimits::default(),
                    grpc_per_ip,
                    shutdown.clone(),
                ),
                options.limits.grpc_handshake_timeout,
            ));
            let incoming =
                ReceiverStream::new(rx).map(|(stream, _peer)| Ok::<_, std::io::Error>(stream));
            Box::pin(grpc_router.serve_with_incoming_shutdown(incoming, stop))
        }
    };
    // Live dashboard streams end at shutdown, or they would hold the HTTP server open.
    tokio::spawn({
        let (live, shutdown) = (Arc::clone(&live), shutdown.clone());
        async move {
            shutdown.cancelled().await;
            live.close();
        }
    });
    let renders = Arc::new(crate::api::renders::Renders::new(
        options.limits.renders,
        Arc::clone(&metrics),
    ));
    let state = AppState {
        store: store.clone(),
        live,
        metrics,
        writer: Some(writer),
        status: options.status,
        clock: system_clock(),
        workloads,
        waste: options.waste,
        renders,
    };
    let web_auth = options.web_auth.resolve(http_addr.ip().is_loopback());
    let warnings = crate::net::exposure::warnings(&crate::net::exposure::Exposure {
        grpc: grpc_addr,
        grpc_tls: grpc_has_tls,
        http: http_addr,
        http_tls: http_has_tls,
        agents_unauthenticated: agent_auth_optional,
        viewers_anonymous: web_auth == crate::auth::web::WebAuthMode::Off,
    });
    for w in &warnings {
        warn!("{w}");
    }
    let auth = crate::auth::web::WebAuth::new(store.clone(), web_auth, http_tls.is_some());
    let app = crate::auth::security_headers::with_security_headers(
        crate::net::rate_limit::with_http_rate_limit(
            crate::auth::web::with_auth(
                router::app(state)
                    .layer(axum::Extension(crate::net::exposure::ExposureWarnings(
                        Arc::new(warnings),
                    )))
                    .layer(axum::Extension(crate::api::alerts::AlertRules(Arc::clone(
                        &options.alerts.settings,
                    )))),
                auth,
            ),
            crate::net::rate_limit::PerIpRate::new(options.limits.http_rate),
        ),
    );
    let header_timeout = options.limits.http_header_timeout;
    let stop = shutdown.clone().cancelled_owned();
    let http_server: BoxFuture<'static, std::io::Result<()>> = match http_tls {
        None => {
            let rx = conn_limit::accept(http, http_per_ip, shutdown.clone());
            Box::pin(crate::net::http::serve(rx, app, header_timeout, stop))
        }
        Some(tls) => {
            let rx = tls::accept_tls(
                http,
                tls,
                HandshakeLimits::default(),
                http_per_ip,
                shutdown.clone(),
            );
            Box::pin(crate::net::http::serve(rx, app, header_timeout, stop))
        }
    };
    info!(grpc = %grpc_addr, http = %http_addr, db = store.backend(), "collector serving");
    // Under systemd (`Type=notify`): the store is open and both listeners serve.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)");
    }

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
    if let Err(e) = carbon_task.await {
        warn!(error = %e, "the carbon task ended abnormally");
    }
    if let Some(task) = remote_write_task
        && let Err(e) = task.await
    {
        warn!(error = %e, "the remote-write task ended abnormally");
    }
    if let Err(e) = alerts_task.await {
        warn!(error = %e, "the alerts task ended abnormally");
    }
    if let Err(e) = counters_task.await {
        warn!(error = %e, "the workload counters task ended abnormally");
    }
    if let Err(e) = accountant_task.await {
        warn!(error = %e, "the energy accountant ended abnormally");
    }
    if let Some(task) = follower_task
        && let Err(e) = task.await
    {
        warn!(error = %e, "the store follower ended abnormally");
    }
    rollups_stop.cancel();
    if let Err(e) = rollups_task.await {
        warn!(error = %e, "the rollup task ended abnormally");
    }
    grpc_result?;
    http_result.map_err(ServeError::Http)?;
    info!("collector stopped");
    Ok(())
}

/// A background job's term as a future: the spawned task, with an abnormal end logged.
async fn joined(job: &'static str, task: tokio::task::JoinHandle<()>) {
    if let Err(e) = task.await {
        warn!(job, error = %e, "a background task ended abnormally");
    }
}
