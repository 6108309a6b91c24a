//! Running the collector: store, live state, group-commit writer, gRPC ingest and HTTP,
//! and the background jobs, under one shutdown token.
//!
//! The listeners are bound by the caller (so tests and `demo` can use port 0 and learn the
//! real address first); `endpoints` reads their addresses and loads their TLS (and starts
//! the certificate reloader), `serve_grpc` and `serve_http` accept and serve on them.
//!
//! The background jobs are one table, `background_jobs`: a row per job, with the name logs
//! give it, how it runs (`Run`: a task started once on every collector, or one term per
//! leadership of a lease, so once across the collectors sharing the database:
//! [`crate::accounting::leader`]) and the `Stage` it stops in. A job that is not
//! configured (remote-write, the store follower) has no row. The rows start in table order,
//! after the group-commit writer and before the servers.
//!
//! Shutdown order, once the token is cancelled: both servers stop accepting; ingest streams
//! stop reading, get the answers for what they already handed to the writer, and end with
//! `UNAVAILABLE`; then the writer commits and answers whatever is still queued; then the
//! jobs stop stage by stage, each stage's token cancelled and its jobs awaited in table
//! order; and the store is closed.

use crate::accounting::accountant::{self, EnergyOptions};
use crate::accounting::counters::WorkloadCounters;
use crate::accounting::leader::{self, LeadOptions};
use crate::api::router::{self, AppState};
use crate::ingest::stream::{IngestOptions, IngestService};
use crate::ingest::writer::{self, WriterOptions};
use crate::live::state::Live;
use crate::live::status::{StatusPolicy, system_clock};
use crate::metrics::Metrics;
use crate::net::conn_limit::{self, ConnStats, Listener, PerIpLimit};
use crate::net::refuse;
use crate::net::tls::{self, Alpn, HandshakeLimits, ReloadableTls, TlsOptions};
use crate::store::{self, JobLeases, Store, StoreError};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
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
    let (grpc, http) = endpoints(grpc, http, &options.tls, &shutdown)?;
    let (grpc_addr, http_addr) = (grpc.addr, http.addr);

    let live = Arc::new(Live::new());
    live.seed(
        store.nodes().await?,
        store.latest_gpu_samples().await?,
        store.latest_host_samples().await?,
        store.latest_gpu_health().await?,
    );
    crate::health::seed_memory(store.as_ref(), &live, gpufleet_core::config::now_ms()).await?;
    let metrics = Arc::new(Metrics::default());
    // Every collector serves /metrics, so each refreshes its own counters (reads only);
    // the alerts job reads the ongoing idle-but-allocated episodes from them.
    let workloads = Arc::new(WorkloadCounters::new(options.counters.max_workloads));
    let scheme = if http.tls.is_some() { "https" } else { "http" };
    let alerts_url = (options.alerts.settings.external_url.clone())
        .unwrap_or_else(|| format!("{scheme}://{http_addr}"));
    let jobs = background_jobs(&store, &live, &metrics, &workloads, &options, alerts_url)?;

    // The writer is ingest's commit path rather than a job of the table: the servers hand
    // it their batches, so it starts before them and stops first once they have stopped.
    let writer_stop = CancellationToken::new();
    let (writer, writer_task) = writer::spawn(
        store.clone(),
        Arc::clone(&live),
        Arc::clone(&metrics),
        options.writer,
        writer_stop.clone(),
    );
    let jobs = Running::start(jobs, store.clone(), &metrics, options.lead);

    let mut ingest_options = options.ingest.clone();
    ingest_options.agent_auth = ingest_options
        .agent_auth
        .resolve(grpc_addr.ip().is_loopback());
    let web_auth = options.web_auth.resolve(http_addr.ip().is_loopback());
    let warnings = crate::net::exposure::warnings(&crate::net::exposure::Exposure {
        grpc: grpc_addr,
        grpc_tls: grpc.tls.is_some(),
        http: http_addr,
        http_tls: http.tls.is_some(),
        agents_unauthenticated: ingest_options.agent_auth
            == crate::ingest::identity::AgentAuth::Optional,
        viewers_anonymous: web_auth == crate::auth::web::WebAuthMode::Off,
    });
    for w in &warnings {
        warn!("{w}");
    }

    let ingest = IngestService::new(
        store.clone(),
        store.clone(),
        writer.clone(),
        Arc::clone(&live),
        Arc::clone(&metrics),
        ingest_options,
        shutdown.clone(),
    );
    let conns = Arc::clone(&metrics.connections);
    let grpc_server = serve_grpc(
        grpc,
        grpc_router(ingest, &options),
        &options,
        Arc::clone(&conns),
        &shutdown,
    );

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
    let auth = crate::auth::web::WebAuth::new(store.clone(), web_auth, http.tls.is_some());
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
    let app = http_app(state, warnings, auth, &options);
    let http_server = serve_http(http, app, &options, conns, &shutdown);

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
    jobs.stop().await;
    grpc_result?;
    http_result.map_err(ServeError::Http)?;
    info!("collector stopped");
    Ok(())
}

/// A listener the caller bound, with its address and its TLS (`None`: plain TCP).
struct Endpoint {
    listener: TcpListener,
    addr: SocketAddr,
    tls: Option<Arc<ReloadableTls>>,
}

/// The gRPC and HTTP endpoints: each listener's address, and its certificates loaded where
/// `options` names some. Starts the task that reloads them (when their files change, or on
/// SIGHUP) until `shutdown`.
fn endpoints(
    grpc: TcpListener,
    http: TcpListener,
    options: &TlsOptions,
    shutdown: &CancellationToken,
) -> Result<(Endpoint, Endpoint), ServeError> {
    let grpc_addr = grpc.local_addr().map_err(ServeError::Listener)?;
    let http_addr = http.local_addr().map_err(ServeError::Listener)?;
    let load = |files: &Option<tls::TlsFiles>, alpn| {
        files
            .clone()
            .map(|f| ReloadableTls::load(f, alpn))
            .transpose()
    };
    let grpc = Endpoint {
        listener: grpc,
        addr: grpc_addr,
        tls: load(&options.grpc, Alpn::Grpc)?,
    };
    let http = Endpoint {
        listener: http,
        addr: http_addr,
        tls: load(&options.http, Alpn::Http)?,
    };
    tokio::spawn(tls::spawn_reloader(
        grpc.tls.iter().chain(http.tls.iter()).cloned().collect(),
        options.reload_poll,
        shutdown.clone(),
    ));
    Ok((grpc, http))
}

/// Serves `router` on `endpoint` until `shutdown` (the future returns once the open streams
/// have ended). Connections are limited per client address (loopback spared with
/// `spare_loopback_agents`), refused ones answered `UNAVAILABLE`; the admitted ones go
/// through TLS where configured and must open with the HTTP/2 preface in time.
fn serve_grpc(
    endpoint: Endpoint,
    router: tonic::transport::server::Router,
    options: &ServeOptions,
    conns: Arc<ConnStats>,
    shutdown: &CancellationToken,
) -> BoxFuture<'static, Result<(), tonic::transport::Error>> {
    let per_ip = {
        let limit = PerIpLimit::new(Listener::Grpc, options.max_connections_per_ip, conns);
        Arc::new(if options.spare_loopback_agents {
            limit.sparing_loopback()
        } else {
            limit
        })
    };
    let preface_timeout = options.limits.grpc_handshake_timeout;
    let stop = shutdown.clone().cancelled_owned();
    match endpoint.tls {
        None => {
            // Nodelay is set on accept: acks are small and latency-bound.
            let rx = refuse::admitted(conn_limit::require_h2_preface(
                conn_limit::accept(endpoint.listener, per_ip, shutdown.clone()),
                preface_timeout,
            ));
            let incoming =
                ReceiverStream::new(rx).map(|(stream, _peer)| Ok::<_, std::io::Error>(stream));
            Box::pin(router.serve_with_incoming_shutdown(incoming, stop))
        }
        Some(tls) => {
            let rx = refuse::admitted(conn_limit::require_h2_preface(
                tls::accept_tls(
                    endpoint.listener,
                    tls,
                    HandshakeLimits::default(),
                    per_ip,
                    shutdown.clone(),
                ),
                preface_timeout,
            ));
            let incoming =
                ReceiverStream::new(rx).map(|(stream, _peer)| Ok::<_, std::io::Error>(stream));
            Box::pin(router.serve_with_incoming_shutdown(incoming, stop))
        }
    }
}

/// Serves `app` on `endpoint` until `shutdown` ([`crate::net::http::serve`]: header
/// deadline, graceful end). Connections are limited per client address, live streams get
/// their budget, and they go through TLS where configured.
fn serve_http(
    endpoint: Endpoint,
    app: axum::Router,
    options: &ServeOptions,
    conns: Arc<ConnStats>,
    shutdown: &CancellationToken,
) -> BoxFuture<'static, std::io::Result<()>> {
    let per_ip = Arc::new(
        PerIpLimit::new(Listener::Http, options.max_connections_per_ip, conns)
            .with_live_budget(options.limits.live),
    );
    let header_timeout = options.limits.http_header_timeout;
    let stop = shutdown.clone().cancelled_owned();
    match endpoint.tls {
        None => {
            let rx = conn_limit::accept(endpoint.listener, per_ip, shutdown.clone());
            Box::pin(crate::net::http::serve(rx, app, header_timeout, stop))
        }
        Some(tls) => {
            let rx = tls::accept_tls(
                endpoint.listener,
                tls,
                HandshakeLimits::default(),
                per_ip,
                shutdown.clone(),
            );
            Box::pin(crate::net::http::serve(rx, app, header_timeout, stop))
        }
    }
}

/// The gRPC service: ingest, with keepalives and the per-address stream rate.
fn grpc_router(ingest: IngestService, options: &ServeOptions) -> tonic::transport::server::Router {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            ingest.into_server(),
            crate::net::rate_limit::grpc_interceptor(
                crate::net::rate_limit::PerIpRate::new(options.limits.grpc_stream_rate),
                options.spare_loopback_agents,
            ),
        ))
}

/// The HTTP app: the API and dashboard with the exposure warnings and alert rules they
/// show, behind login, the per-address request rate and the security headers.
fn http_app(
    state: AppState,
    warnings: Vec<String>,
    auth: Arc<crate::auth::web::WebAuth>,
    options: &ServeOptions,
) -> axum::Router {
    crate::auth::security_headers::with_security_headers(
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
    )
}

/// One background job: a row of [`background_jobs`].
struct Job {
    /// The job as logs name it ("the carbon task").
    name: &'static str,
    run: Run,
    stage: Stage,
}

/// How a job runs.
enum Run {
    /// On every collector: started once, with its stage's stop token; the task returns
    /// soon after that is cancelled. (The energy accountant is one: it takes its lease
    /// itself, [`accountant::spawn`].)
    Task(StartTask),
    /// Once across the collectors sharing the database: [`leader::spawn`] asks for the
    /// lease `lease` until the stage's stop token is cancelled, and calls `term` at the
    /// start of each term of leadership with a token cancelled when the term ends; the
    /// future must finish soon after.
    Leased {
        lease: &'static str,
        term: StartTerm,
    },
}

type StartTask = Box<dyn FnOnce(CancellationToken) -> JoinHandle<()> + Send>;
type StartTerm = Box<dyn FnMut(CancellationToken) -> BoxFuture<'static, ()> + Send>;

/// When a job stops, after the servers and the writer: each stage's token is cancelled and
/// its jobs awaited before the next stage's, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Accounting, carbon, remote-write, alerts, counters, the store follower.
    Jobs,
    /// After every other job: the rollup task, so that its retention and packing (which
    /// go only behind the energy watermarks) come after the accountant's final pass.
    Last,
}

impl Job {
    fn task(
        name: &'static str,
        stage: Stage,
        start: impl FnOnce(CancellationToken) -> JoinHandle<()> + Send + 'static,
    ) -> Job {
        Job {
            name,
            run: Run::Task(Box::new(start)),
            stage,
        }
    }

    fn leased<F, Fut>(name: &'static str, lease: &'static str, stage: Stage, mut term: F) -> Job
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let term = move |t: CancellationToken| -> BoxFuture<'static, ()> { Box::pin(term(t)) };
        Job {
            name,
            run: Run::Leased {
                lease,
                term: Box::new(term),
            },
            stage,
        }
    }
}

/// The collector's background jobs, one row each, in the order they start and (within a
/// stage) stop; a job that is not configured has no row. Fails when the alerts' webhooks
/// cannot be set up, before any job has started.
fn background_jobs(
    store: &Arc<dyn Store>,
    live: &Arc<Live>,
    metrics: &Arc<Metrics>,
    workloads: &Arc<WorkloadCounters>,
    options: &ServeOptions,
    alerts_url: String,
) -> Result<Vec<Job>, ServeError> {
    use crate::accounting::{carbon, counters, rollups};

    let rows = [
        // Carbon pricing (and its provider fetches) run once across collectors.
        Some(Job::leased("the carbon task", carbon::JOB, Stage::Jobs, {
            let (store, carbon_options) = (Arc::clone(store), options.carbon.clone());
            move |term| {
                let task = carbon::spawn(
                    store.clone(),
                    store.clone(),
                    carbon_options.clone(),
                    system_clock(),
                    term,
                );
                joined(carbon::JOB, task)
            }
        })),
        // Remote-write pushes once across collectors too; its positions are in the database.
        options.remote_write.clone().map(|rw| {
            metrics
                .remote_write
                .enabled
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let (store, stats) = (Arc::clone(store), Arc::clone(&metrics.remote_write));
            Job::leased(
                "the remote-write task",
                crate::remote_write::JOB,
                Stage::Jobs,
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
        }),
        // Alert rules are evaluated once across collectors; alerts live in the database.
        Some(Job::leased(
            "the alerts task",
            crate::alerts::JOB,
            Stage::Jobs,
            {
                let t = crate::alerts::Term {
                    external_url: alerts_url,
                    options: options.alerts.clone(),
                    posts: options.alerts.posts().map_err(ServeError::Alerts)?,
                    status: options.status,
                    stats: Arc::clone(&metrics.alerts),
                    workloads: Arc::clone(workloads),
                };
                let (store, live) = (Arc::clone(store), Arc::clone(live));
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
        )),
        // Every collector refreshes its own `/metrics` counters (reads only).
        Some(Job::task("the workload counters task", Stage::Jobs, {
            let (store, live) = (Arc::clone(store), Arc::clone(live));
            let (carbon_config, workloads) =
                (Arc::clone(&options.carbon.config), Arc::clone(workloads));
            let counter_options = counters::CounterOptions {
                waste: options.waste,
                ..options.counters
            };
            move |stop| {
                counters::spawn(
                    store,
                    live,
                    carbon_config,
                    workloads,
                    counter_options,
                    system_clock(),
                    stop,
                )
            }
        })),
        // Energy accounting runs once across collectors: it takes its `energy` lease itself.
        Some(Job::task("the energy accountant", Stage::Jobs, {
            let (store, live, metrics) = (Arc::clone(store), Arc::clone(live), Arc::clone(metrics));
            let (energy, lead) = (options.energy.clone(), options.lead);
            move |stop| {
                accountant::spawn(
                    store.clone(),
                    store,
                    live,
                    energy,
                    system_clock(),
                    metrics,
                    lead,
                    stop,
                )
            }
        })),
        // Following what other collectors commit to the database (`--follow-store`; by
        // default where the database can be shared), on every collector.
        options.follow.period(store.shared()).map(|period| {
            let (store, live) = (Arc::clone(store), Arc::clone(live));
            Job::task("the store follower", Stage::Jobs, move |stop| {
                crate::live::follow::spawn(store, live, period, stop)
            })
        }),
        // Rollups and retention run once across collectors, like the energy accountant:
        // each term of leadership starts the task afresh.
        Some(Job::leased("the rollup task", rollups::JOB, Stage::Last, {
            let (store, live, metrics) = (Arc::clone(store), Arc::clone(live), Arc::clone(metrics));
            let retention = options.retention.clone();
            move |term| {
                let task = rollups::spawn(
                    store.clone(),
                    Arc::clone(&live),
                    retention.clone(),
                    system_clock(),
                    Arc::clone(&metrics),
                    term,
                );
                joined(rollups::JOB, task)
            }
        })),
    ];
    Ok(rows.into_iter().flatten().collect())
}

/// The jobs of the table, started: per stage, its stop token and its jobs' tasks.
#[derive(Default)]
struct Running {
    jobs: Started,
    last: Started,
}

/// A stage's stop token and its jobs' names and tasks, in table order.
#[derive(Default)]
struct Started {
    stop: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

impl Running {
    /// Starts `jobs` in order; leased ones ask `leases` for their lease.
    fn start(
        jobs: Vec<Job>,
        leases: Arc<dyn JobLeases>,
        metrics: &Arc<Metrics>,
        lead: LeadOptions,
    ) -> Running {
        let mut running = Running::default();
        for job in jobs {
            let stage = match job.stage {
                Stage::Jobs => &mut running.jobs,
                Stage::Last => &mut running.last,
            };
            let stop = stage.stop.clone();
            let task = match job.run {
                Run::Task(start) => start(stop),
                Run::Leased { lease, term } => leader::spawn(
                    Arc::clone(&leases),
                    lease,
                    Arc::clone(metrics),
                    lead,
                    stop,
                    term,
                ),
            };
            stage.tasks.push((job.name, task));
        }
        running
    }

    /// Stops the jobs stage by stage ([`Stage`]), and waits for each.
    async fn stop(self) {
        for stage in [self.jobs, self.last] {
            stage.stop.cancel();
            for (name, task) in stage.tasks {
                if let Err(e) = task.await {
                    warn!(error = %e, "{name} ended abnormally");
                }
            }
        }
    }
}

/// A background job's term as a future: the spawned task, with an abnormal end logged.
async fn joined(job: &'static str, task: JoinHandle<()>) {
    if let Err(e) = task.await {
        warn!(job, error = %e, "a background task ended abnormally");
    }
}
