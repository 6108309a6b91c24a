//! `gpufleet-collector`: the central collector binary.

use anyhow::Context as _;
use clap::{Args, CommandFactory, Parser, Subcommand};
use gpufleet_cli::args_with_config_file;
use gpufleet_collector::cli::demo::{DemoOptions, run_demo as run_demo_on};
use gpufleet_collector::cli::energy::{
    EnergyArgs, EnergyRangeArgs, RecomputeArgs, run_check, run_recompute,
};
use gpufleet_collector::ingest::stream::IngestOptions;
use gpufleet_collector::ingest::writer::WriterOptions;
use gpufleet_collector::live::status::StatusPolicy;
use gpufleet_collector::{ServeOptions, serve};
use gpufleet_core::config::{init_tracing, parse_duration};
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// mimalloc, not glibc's malloc: ingest allocates and frees small strings and buffers at
/// a high rate, and the allocator was a fifth of a saturated collector's throughput.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// gpufleet collector: receives GPU samples from agents over gRPC, stores them, and
/// serves the fleet's state (JSON API, Prometheus metrics).
#[derive(Debug, Parser)]
#[command(name = "gpufleet-collector", version, about)]
struct Cli {
    /// TOML file with settings (keys are flag names; a `[serve]` table applies to `serve`
    /// only). Precedence: command line > environment > file > default.
    #[arg(long, global = true, env = "GPUFLEET_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the collector: gRPC ingest for agents, HTTP API and /metrics.
    Serve(Box<ServeArgs>),
    /// Run the collector on an embedded SQLite file plus simulated agents that stream to
    /// it over real loopback gRPC; prints the dashboard URL.
    Demo(Box<DemoArgs>),
    /// Make a development CA, a server certificate and per-node client certificates
    /// (PEM) for TLS and mTLS; see SECURITY.md.
    Certs(gpufleet_collector::net::certs::CertsArgs),
    /// Manage agent tokens: `add NODE` (prints the token once), `list`, `revoke ID`.
    Tokens(gpufleet_collector::auth::tokens::TokensArgs),
    /// Give a GPU that really moved to another node (a GPU belongs to the node that
    /// registered it; other nodes claiming it are refused): `rehome-gpu UUID --to NODE`.
    RehomeGpu(gpufleet_collector::cli::rehome::RehomeArgs),
    /// Verify stored energy: conservation in every GPU-minute, and rollups equal to what
    /// the raw samples give. Prints every violation; exits non-zero if there is any.
    CheckEnergy(EnergyRangeArgs),
    /// Rebuild the energy rollups of a range from raw samples (after a policy change).
    RecomputeEnergy(RecomputeArgs),
    /// Print the energy / carbon report of a container, pod, Slurm job or node over a
    /// range (table, JSON, YAML or CSV), optionally with its time-series plot (PNG).
    Report(Box<gpufleet_collector::cli::report::ReportArgs>),
    /// For Slurm's `EpilogSlurmctld` (or by hand with `--job`): wait until the job's GPU
    /// energy is accounted, then write its summary (energy, CO2, GPU-hours) into the
    /// job's `AdminComment` with `sacctmgr`, keeping other tools' text. Always exits 0.
    SlurmEpilog(Box<gpufleet_collector::cli::slurm::EpilogArgs>),
    /// Write the `AdminComment` summary of every Slurm job that ended in a range and has
    /// none (epilogs that did not run); `--redo` rewrites them all.
    SlurmBackfill(Box<gpufleet_collector::cli::slurm::BackfillArgs>),
}

#[derive(Debug, Args)]
struct DemoArgs {
    /// Simulated GPU nodes.
    #[arg(long, env = "GPUFLEET_NODES", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    nodes: u32,
    /// GPUs per simulated node.
    #[arg(long, env = "GPUFLEET_GPUS_PER_NODE", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus_per_node: u32,
    /// Address of the dashboard, API and /metrics.
    #[arg(
        long,
        env = "GPUFLEET_HTTP_LISTEN",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    http_listen: String,
    /// Address the simulated agents stream to (port 0: a free port).
    #[arg(
        long,
        env = "GPUFLEET_GRPC_LISTEN",
        default_value = "127.0.0.1:0",
        value_name = "ADDR"
    )]
    grpc_listen: String,
    /// Database URL; default: a fresh SQLite file in a temporary folder, removed at exit.
    #[arg(long, env = "GPUFLEET_DB", value_name = "URL")]
    db: Option<String>,
    /// Sampling interval of the simulated agents.
    #[arg(long, env = "GPUFLEET_INTERVAL", default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    interval: Duration,
    /// Base seed of the simulated fleet (each node mixes in its name).
    #[arg(long, env = "GPUFLEET_SIM_SEED")]
    sim_seed: Option<u64>,
    /// A node whose newest sample is older than this is "stale" (short values show the
    /// dashboard's stale marking quickly).
    #[arg(long, env = "GPUFLEET_STALE_AFTER", default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    stale_after: Duration,
    /// Simulated past written before the agents start (the same simulators, at the same
    /// interval), so energy and carbon pages have figures at once; 0s for none.
    #[arg(long, env = "GPUFLEET_HISTORY", default_value = "30m", value_parser = parse_duration, value_name = "DURATION")]
    history: Duration,
    /// Carbon intensity, as for `serve` (and the config file's `[carbon]` table). With
    /// none of them the demo prices energy at a static 250 gCO2/kWh (region `demo`).
    /// How often /metrics' per-workload energy and carbon counters are re-read from the
    /// energy accounting.
    #[arg(long, env = "GPUFLEET_METRICS_REFRESH", default_value = "2s", value_parser = gpufleet_collector::net::limits::positive_duration, value_name = "DURATION")]
    metrics_refresh: Duration,
    /// Most per-workload (and per-process) series on /metrics; beyond it series are left
    /// out and counted in gpufleet_metrics_series_dropped_total.
    #[arg(
        long,
        env = "GPUFLEET_METRICS_MAX_WORKLOADS",
        default_value_t = 5000,
        value_name = "N"
    )]
    metrics_max_workloads: usize,
    #[command(flatten)]
    carbon: gpufleet_cli::CarbonArgs,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Database URL: sqlite://PATH (the file is created if missing) or
    /// postgres://USER:PASSWORD@HOST:PORT/DATABASE.
    #[arg(
        long,
        env = "GPUFLEET_DB",
        default_value = "sqlite://gpufleet.db",
        value_name = "URL"
    )]
    db: String,
    /// Address agents connect to (gRPC). Port 0 picks a free port.
    #[arg(
        long,
        env = "GPUFLEET_GRPC_LISTEN",
        default_value = "127.0.0.1:50051",
        value_name = "ADDR"
    )]
    grpc_listen: String,
    /// Address of the HTTP API, /metrics and the page. Port 0 picks a free port.
    #[arg(
        long,
        env = "GPUFLEET_HTTP_LISTEN",
        default_value = "127.0.0.1:8080",
        value_name = "ADDR"
    )]
    http_listen: String,
    /// A node whose newest sample is older than this is "stale".
    #[arg(long, env = "GPUFLEET_STALE_AFTER", default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    stale_after: Duration,
    /// A node whose newest sample is older than this is "offline".
    #[arg(long, env = "GPUFLEET_OFFLINE_AFTER", default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    offline_after: Duration,
    /// Largest gRPC message (batch) accepted from an agent, in bytes.
    #[arg(long, env = "GPUFLEET_MAX_MESSAGE_BYTES", default_value_t = 16 << 20, value_name = "BYTES")]
    max_message_bytes: usize,
    #[command(flatten)]
    tls: gpufleet_collector::net::tls::TlsArgs,
    #[command(flatten)]
    limits: gpufleet_collector::net::limits::LimitArgs,
    #[command(flatten)]
    energy: EnergyArgs,
    /// Follow what other collectors sharing the database commit, so this one's dashboard,
    /// API and /metrics show every node live: `auto` (every 500ms on PostgreSQL, off on
    /// SQLite), `off`, or a period such as `1s`.
    #[arg(long, env = "GPUFLEET_FOLLOW_STORE", default_value = "auto", value_parser = gpufleet_collector::live::follow::FollowMode::parse, value_name = "auto|off|DURATION")]
    follow_store: gpufleet_collector::live::follow::FollowMode,
    #[command(flatten)]
    retention: gpufleet_collector::accounting::rollups::RetentionArgs,
    /// How often /metrics' per-workload energy and carbon counters are re-read from the
    /// energy accounting.
    #[arg(long, env = "GPUFLEET_METRICS_REFRESH", default_value = "15s", value_parser = gpufleet_collector::net::limits::positive_duration, value_name = "DURATION")]
    metrics_refresh: Duration,
    /// Most per-workload (and per-process) series on /metrics; beyond it series are left
    /// out and counted in gpufleet_metrics_series_dropped_total.
    #[arg(
        long,
        env = "GPUFLEET_METRICS_MAX_WORKLOADS",
        default_value_t = 5000,
        value_name = "N"
    )]
    metrics_max_workloads: usize,
    #[command(flatten)]
    carbon: gpufleet_cli::CarbonArgs,
    #[command(flatten)]
    remote_write: gpufleet_collector::remote_write::RemoteWriteArgs,
    #[command(flatten)]
    waste: gpufleet_collector::cli::waste::WasteArgs,
}

fn main() -> anyhow::Result<()> {
    let raw_args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let args = args_with_config_file(raw_args.clone(), &Cli::command())?;
    let cli = Cli::parse_from(args);
    init_tracing("info");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Command::Serve(args) => {
            // The config file's `[carbon]` table: per-node / per-label overrides.
            let file = gpufleet_carbon::config::CarbonFile::from_config_file(&raw_args)?;
            let alerts = alert_settings(&raw_args)?;
            runtime.block_on(run_serve(*args, file, alerts))
        }
        Command::Demo(args) => {
            let file = gpufleet_carbon::config::CarbonFile::from_config_file(&raw_args)?;
            let alerts = alert_settings(&raw_args)?;
            runtime.block_on(run_demo(*args, file, alerts))
        }
        Command::Certs(args) => run_certs(args),
        Command::Tokens(args) => {
            let out = runtime.block_on(gpufleet_collector::auth::tokens::run(args))?;
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(out.as_bytes())?;
            Ok(())
        }
        Command::RehomeGpu(args) => {
            let out = runtime.block_on(gpufleet_collector::cli::rehome::run(args))?;
            std::io::stdout().lock().write_all(out.as_bytes())?;
            Ok(())
        }
        Command::CheckEnergy(args) => {
            let ok = runtime.block_on(run_check(&args, &mut std::io::stdout().lock()))?;
            if !ok {
                anyhow::bail!("check-energy found violations (listed above)");
            }
            Ok(())
        }
        Command::RecomputeEnergy(args) => {
            runtime.block_on(run_recompute(&args, &mut std::io::stdout().lock()))?;
            Ok(())
        }
        Command::SlurmEpilog(args) => {
            // A job's accounting never fails the job: what went wrong goes to stderr
            // (slurmctld's log) and the exit status is 0.
            match runtime.block_on(gpufleet_collector::cli::slurm::run_epilog(&args)) {
                Ok(outcome) => println!("gpufleet slurm-epilog: {}", outcome.describe()),
                Err(e) => eprintln!("gpufleet slurm-epilog: error: {e}"),
            }
            Ok(())
        }
        Command::SlurmBackfill(args) => {
            let done = runtime.block_on(gpufleet_collector::cli::slurm::run_backfill(&args))?;
            let mut failed = 0;
            for (job, outcome) in &done {
                match outcome {
                    Ok(o) => println!("{job}: {}", o.describe()),
                    Err(e) => {
                        failed += 1;
                        println!("{job}: error: {e}");
                    }
                }
            }
            if failed > 0 {
                anyhow::bail!("{failed} of {} jobs not written (listed above)", done.len());
            }
            Ok(())
        }
        Command::Report(args) => {
            runtime.block_on(gpufleet_collector::cli::report::run_report(
                &args,
                &mut std::io::stdout().lock(),
            ))?;
            Ok(())
        }
    }
}

/// The config file's `[alerts]` table, checked (the default rules without one).
fn alert_settings(
    raw_args: &[std::ffi::OsString],
) -> anyhow::Result<gpufleet_collector::alerts::AlertOptions> {
    let settings = gpufleet_collector::alerts::AlertsFile::from_config_file(raw_args)
        .and_then(|f| f.resolve())
        .map_err(|e| anyhow::anyhow!("config file: {e}"))?;
    Ok(gpufleet_collector::alerts::AlertOptions {
        settings: std::sync::Arc::new(settings),
        ..Default::default()
    })
}

async fn run_serve(
    args: ServeArgs,
    carbon_file: gpufleet_carbon::config::CarbonFile,
    alerts: gpufleet_collector::alerts::AlertOptions,
) -> anyhow::Result<()> {
    let carbon = gpufleet_carbon::CarbonConfig::new(args.carbon.clone().into(), carbon_file)?;
    if args.offline_after < args.stale_after {
        anyhow::bail!(
            "--offline-after ({}) must not be shorter than --stale-after ({})",
            humantime::format_duration(args.offline_after),
            humantime::format_duration(args.stale_after)
        );
    }
    let retention = args.retention.options().map_err(anyhow::Error::msg)?;
    let remote_write = args.remote_write.options().map_err(anyhow::Error::msg)?;
    let grpc = TcpListener::bind(&args.grpc_listen)
        .await
        .with_context(|| format!("cannot listen on --grpc-listen {}", args.grpc_listen))?;
    let http = TcpListener::bind(&args.http_listen)
        .await
        .with_context(|| format!("cannot listen on --http-listen {}", args.http_listen))?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "listening grpc={} http={}",
            grpc.local_addr()?,
            http.local_addr()?
        )?;
        stdout.flush()?;
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let options = ServeOptions {
        db_url: args.db,
        status: StatusPolicy {
            stale_after: args.stale_after,
            offline_after: args.offline_after,
        },
        ingest: IngestOptions {
            max_message_bytes: args.max_message_bytes,
            agent_auth: args.tls.agent_auth(),
            ..Default::default()
        },
        tls: args.tls.options(),
        web_auth: args.tls.web_auth(),
        max_connections_per_ip: args.tls.max_connections_per_ip,
        limits: args.limits.options(),
        writer: WriterOptions::default(),
        energy: args.energy.options(),
        follow: args.follow_store,
        retention,
        remote_write,
        waste: args.waste.settings(),
        counters: gpufleet_collector::accounting::counters::CounterOptions {
            refresh: args.metrics_refresh,
            max_workloads: args.metrics_max_workloads,
            ..Default::default()
        },
        carbon: gpufleet_collector::accounting::carbon::CarbonOptions {
            config: std::sync::Arc::new(carbon),
            ..Default::default()
        },
        alerts,
        ..Default::default()
    };
    serve(options, grpc, http, shutdown).await?;
    Ok(())
}

fn run_certs(args: gpufleet_collector::net::certs::CertsArgs) -> anyhow::Result<()> {
    let written = gpufleet_collector::net::certs::write_plan(&args.into())?;
    let mut stdout = std::io::stdout().lock();
    for path in written {
        writeln!(stdout, "wrote {}", path.display())?;
    }
    Ok(())
}

/// The demo's carbon intensity when none is configured (gCO2/kWh, `static`, region
/// `demo`): about a European grid average, so every energy figure has its CO2 beside it.
const DEMO_G_PER_KWH: f64 = 250.0;

async fn run_demo(
    args: DemoArgs,
    carbon_file: gpufleet_carbon::config::CarbonFile,
    alerts: gpufleet_collector::alerts::AlertOptions,
) -> anyhow::Result<()> {
    let mut carbon_args: gpufleet_carbon::CarbonSettings = args.carbon.clone().into();
    if !gpufleet_carbon::CarbonConfig::new(carbon_args.clone(), carbon_file.clone())?.enabled() {
        carbon_args.carbon_provider = Some(gpufleet_carbon::ProviderKind::Static);
        carbon_args.carbon_g_per_kwh = Some(DEMO_G_PER_KWH);
        carbon_args
            .carbon_region
            .get_or_insert_with(|| "demo".to_owned());
    }
    let carbon = gpufleet_carbon::CarbonConfig::new(carbon_args, carbon_file)?;
    // Keeps the temporary database alive for the whole run; removed on drop.
    let mut _tmp = None;
    let db_url = match args.db {
        Some(url) => url,
        None => {
            let dir = tempfile::Builder::new()
                .prefix("gpufleet-demo-")
                .tempdir()
                .context("cannot create a temporary folder for the demo database")?;
            let url = format!("sqlite://{}", dir.path().join("demo.db").display());
            _tmp = Some(dir);
            url
        }
    };
    let grpc = TcpListener::bind(&args.grpc_listen)
        .await
        .with_context(|| format!("cannot listen on --grpc-listen {}", args.grpc_listen))?;
    let http = TcpListener::bind(&args.http_listen).await.with_context(|| {
        format!(
            "cannot listen on --http-listen {} (in use? try --http-listen 127.0.0.1:0 for a free port)",
            args.http_listen
        )
    })?;
    let http_addr = http.local_addr()?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "gpufleet demo: {} simulated nodes x {} GPUs, database {}",
            args.nodes,
            args.gpus_per_node,
            gpufleet_collector::store::redact_url(&db_url)
        )?;
        writeln!(stdout, "dashboard: http://{http_addr}/   (Ctrl-C to stop)")?;
        writeln!(
            stdout,
            "listening grpc={} http={http_addr}",
            grpc.local_addr()?
        )?;
        stdout.flush()?;
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let demo = DemoOptions {
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        interval: args.interval,
        seed: args.sim_seed,
        history: args.history,
    };
    let default_status = StatusPolicy::default();
    let options = ServeOptions {
        db_url,
        status: StatusPolicy {
            stale_after: args.stale_after,
            offline_after: default_status.offline_after.max(args.stale_after),
        },
        carbon: gpufleet_collector::accounting::carbon::CarbonOptions {
            config: std::sync::Arc::new(carbon),
            // Short, so the demo's history is priced within seconds of the start.
            interval: Duration::from_secs(2),
            ..Default::default()
        },
        counters: gpufleet_collector::accounting::counters::CounterOptions {
            refresh: args.metrics_refresh,
            max_workloads: args.metrics_max_workloads,
            ..Default::default()
        },
        alerts,
        ..Default::default()
    };
    run_demo_on(demo, options, grpc, http, shutdown).await?;
    Ok(())
}

/// Cancels `shutdown` on SIGINT or SIGTERM.
async fn cancel_on_signal(shutdown: CancellationToken) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => info!("SIGINT received; shutting down"),
        () = term => info!("SIGTERM received; shutting down"),
    }
    shutdown.cancel();
}
