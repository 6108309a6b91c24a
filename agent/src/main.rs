//! `gpufleet-agent`: `run` streams this node's GPU samples to a collector; `snapshot`
//! prints one local reading; `exec` measures one command. Every flag also reads
//! `GPUFLEET_<FLAG>` and the `--config` TOML file (precedence: command line > environment
//! > file > default).

use anyhow::{Context, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};
use gpufleet_agent::host::{self, HostReader};
use gpufleet_agent::nvml::{NvmlOptions, NvmlSource};
use gpufleet_agent::sampler::Sampler;
use gpufleet_agent::snapshot::{self, Spacing};
use gpufleet_agent::spool::SpoolArgs;
use gpufleet_agent::{GpuSource, RunOptions, Scenario, SimOptions, run_agent, simulator};
use gpufleet_core::config::{args_with_config_file, init_tracing, now_ms, parse_duration};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

#[derive(Debug, Parser)]
#[command(
    name = "gpufleet-agent",
    version,
    about = "gpufleet node agent: samples NVIDIA GPUs and streams them to a collector"
)]
struct Cli {
    /// TOML file with flag values (keys are flag names; a [run] or [snapshot] table applies
    /// to that command only).
    #[arg(long, global = true, env = "GPUFLEET_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Sample every interval, spool to disk and stream to the collector until SIGTERM /
    /// SIGINT; then print `summary sampled=N acked=N dropped=N unacked=N` (GPU samples,
    /// over the spool's lifetime: a restarted agent counts what earlier runs spooled).
    Run(Box<RunArgs>),
    /// Print one local reading, like nvidia-smi / gpustat.
    Snapshot(SnapshotArgs),
    /// Run a command and measure the GPUs its processes use while it runs; at its exit
    /// print the energy / carbon report (to stderr) and write it as JSON / YAML / CSV
    /// (+ a PNG plot). Exits with the command's exit code.
    Exec(Box<ExecArgs>),
}

#[derive(Debug, Args)]
struct ExecArgs {
    /// Node name in the report [default: the host name].
    #[arg(long, env = "GPUFLEET_NODE", value_name = "NAME")]
    node: Option<String>,
    /// Sampling interval (200ms, 1s).
    #[arg(long, env = "GPUFLEET_INTERVAL", value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
    /// Measure every GPU of the node for the whole run, not only those the command's
    /// processes use (needed with --simulate: simulated processes are not the command's).
    #[arg(long, env = "GPUFLEET_ALL_GPUS")]
    all_gpus: bool,
    /// Write the report to FILE; the extension picks the format: .json, .yaml/.yml,
    /// .csv, .txt (the table).
    #[arg(long, env = "GPUFLEET_REPORT", value_name = "FILE")]
    report: Option<PathBuf>,
    /// Write the time-series plot (utilization, power, memory, temperature, carbon
    /// intensity) to FILE.png.
    #[arg(long, env = "GPUFLEET_PLOT", value_name = "FILE.png")]
    plot: Option<PathBuf>,
    /// Average the report's series over buckets of this length [default: every sample].
    #[arg(long, env = "GPUFLEET_SERIES_STEP", value_name = "DURATION", value_parser = parse_duration)]
    series_step: Option<Duration>,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    carbon: gpufleet_carbon::CarbonArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Where readings come from.
#[derive(Debug, Args)]
struct SourceArgs {
    /// Simulate a GPU node instead of reading NVML.
    #[arg(long, env = "GPUFLEET_SIMULATE")]
    simulate: bool,
    /// Number of simulated GPUs.
    #[arg(long, env = "GPUFLEET_SIM_GPUS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    sim_gpus: u32,
    /// Scenario file for the simulator (TOML).
    #[arg(long, env = "GPUFLEET_SIM_SCENARIO", value_name = "FILE")]
    sim_scenario: Option<PathBuf>,
    /// Simulator seed [default: derived from the node name].
    #[arg(long, env = "GPUFLEET_SIM_SEED", value_name = "N")]
    sim_seed: Option<u64>,
    /// NVML library to load [default: the system's libnvidia-ml.so.1].
    #[arg(long, env = "GPUFLEET_NVML_LIB", value_name = "PATH")]
    nvml_lib: Option<PathBuf>,
    /// Where /proc is (processes, host metrics, boot id).
    #[arg(
        long,
        env = "GPUFLEET_PROC_ROOT",
        value_name = "DIR",
        default_value = "/proc"
    )]
    proc_root: PathBuf,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Collector address (repeat, or separate with commas, for failover).
    #[arg(
        long,
        env = "GPUFLEET_COLLECTOR",
        value_name = "URL",
        value_delimiter = ',',
        required = true
    )]
    collector: Vec<String>,
    /// Node name [default: the host name].
    #[arg(long, env = "GPUFLEET_NODE", value_name = "NAME")]
    node: Option<String>,
    /// Sampling interval (200ms, 1s, 5m).
    #[arg(long, env = "GPUFLEET_INTERVAL", value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    spool: SpoolArgs,
    /// A label sent to the collector, k=v (repeat, or separate with commas).
    #[arg(long = "label", env = "GPUFLEET_LABEL", value_name = "K=V", value_delimiter = ',', value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// How long to keep delivering unacked samples after SIGTERM / SIGINT.
    #[arg(long, env = "GPUFLEET_SHUTDOWN_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    shutdown_timeout: Duration,
    /// Most ticks per batch.
    #[arg(long, env = "GPUFLEET_BATCH_MAX_TICKS", value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    batch_max_ticks: u32,
    #[command(flatten)]
    credentials: gpufleet_agent::tls::CredentialArgs,
}

#[derive(Debug, Args)]
struct SnapshotArgs {
    /// Print JSON ({"inventory": …, "tick": …}) instead of a table.
    #[arg(long, env = "GPUFLEET_JSON")]
    json: bool,
    /// Node name [default: the host name].
    #[arg(long, env = "GPUFLEET_NODE", value_name = "NAME")]
    node: Option<String>,
    #[command(flatten)]
    source: SourceArgs,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
        _ => Err(format!("invalid label {s:?}: write key=value")),
    }
}

fn main() -> ExitCode {
    init_tracing("info");
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    let args = args_with_config_file(std::env::args_os().collect(), &Cli::command())?;
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Snapshot(args) => snapshot_cmd(args),
        Command::Exec(args) => {
            let code = exec_cmd(*args)?;
            std::process::exit(code);
        }
    }
}

fn node_name(given: Option<String>, proc_root: &Path) -> anyhow::Result<String> {
    match given.or_else(|| host::hostname(proc_root)) {
        Some(n) => Ok(n),
        None => bail!("cannot determine the host name; pass --node NAME"),
    }
}

/// Builds the source the flags ask for.
fn source(args: &SourceArgs, node: &str) -> anyhow::Result<Box<dyn GpuSource>> {
    if args.simulate {
        if args.nvml_lib.is_some() {
            warn!("--nvml-lib is ignored with --simulate");
        }
        let scenario = match &args.sim_scenario {
            Some(path) => Scenario::from_file(path)?,
            None => Scenario::default(),
        };
        let sim = simulator(SimOptions {
            node: node.to_owned(),
            gpus: args.sim_gpus,
            seed: args.sim_seed,
            scenario,
        })?;
        info!(
            node,
            gpus = args.sim_gpus,
            seed = sim.seed(),
            model = sim.model().key,
            "simulating"
        );
        Ok(Box::new(sim))
    } else {
        let nvml = NvmlSource::open(NvmlOptions {
            lib_path: args.nvml_lib.clone(),
            proc_root: args.proc_root.clone(),
            hostname: node.to_owned(),
        })?;
        Ok(Box::new(nvml))
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let node = node_name(args.node, &args.source.proc_root)?;
    let source = source(&args.source, &node)?;
    let labels: BTreeMap<String, String> = args.labels.into_iter().collect();
    let opts = RunOptions {
        interval: args.interval,
        labels,
        // A simulated node must not report this machine's CPU and memory as its own.
        proc_root: (!args.source.simulate).then(|| args.source.proc_root.clone()),
        boot_id: None,
        shutdown_timeout: args.shutdown_timeout,
        batch_max_ticks: args.batch_max_ticks as usize,
        spool: Some(args.spool.config(&node)),
        credentials: gpufleet_agent::tls::Credentials::load(&args.credentials)?,
        ..RunOptions::new(node, args.collector)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let summary = runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = watch_signals(shutdown.clone())?;
        let summary = run_agent(opts, source, shutdown).await;
        signals.abort();
        anyhow::Ok(summary?)
    })?;
    println!("{summary}");
    Ok(())
}

/// Cancels `shutdown` on the first SIGTERM or SIGINT; a second one exits at once.
fn watch_signals(shutdown: CancellationToken) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!(signal = name, "shutdown requested");
        shutdown.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        warn!("second signal: exiting without delivering");
        std::process::exit(130);
    }))
}

/// Runs `exec`; returns the exit code to leave with (the command's).
fn exec_cmd(args: ExecArgs) -> anyhow::Result<i32> {
    use gpufleet_agent::exec::{ExecOptions, run_exec};
    use gpufleet_report::{Format, plot, render};
    if args.source.simulate && !args.all_gpus {
        bail!(
            "with --simulate, the simulated GPU processes are not the command's: add --all-gpus \
             to measure every simulated GPU"
        );
    }
    let report_format = match &args.report {
        Some(path) => Some(Format::from_path(path).with_context(|| {
            format!(
                "--report {}: name the file .json, .yaml, .yml, .csv or .txt",
                path.display()
            )
        })?),
        None => None,
    };
    let node = node_name(args.node, &args.source.proc_root)?;
    let carbon_file = gpufleet_carbon::config::CarbonFile::from_config_file(
        &std::env::args_os().collect::<Vec<_>>(),
    )?;
    let carbon = gpufleet_carbon::CarbonConfig::new(args.carbon, carbon_file)?
        .node(&node, &BTreeMap::new())?;
    let source = source(&args.source, &node)?;
    let opts = ExecOptions {
        carbon,
        node,
        command: args.command,
        interval: args.interval,
        all_gpus: args.all_gpus,
        proc_root: args.source.proc_root.clone(),
        series_step: args.series_step,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(run_exec(opts, source))?;
    let report = outcome.report;
    eprint!("{}", render(&report, Format::Table)?);
    if let (Some(path), Some(format)) = (&args.report, report_format) {
        std::fs::write(path, render(&report, format)?)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        plot::write_png(&report, path)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(outcome.exit_code)
}

fn snapshot_cmd(args: SnapshotArgs) -> anyhow::Result<()> {
    // A local reading names no node: the host name only labels the table.
    let node = args
        .node
        .or_else(|| host::hostname(&args.source.proc_root))
        .unwrap_or_else(|| "localhost".into());
    let source = source(&args.source, &node)?;
    let host = (!args.source.simulate).then(|| HostReader::new(&args.source.proc_root));
    let mut sampler = Sampler::new(source, host);
    let spacing = if args.source.simulate {
        Spacing::Simulated
    } else {
        Spacing::Wait(Duration::from_millis(500))
    };
    let (inventory, tick) = snapshot::take(&mut sampler, now_ms(), spacing)?;
    if args.json {
        println!("{}", snapshot::to_json(&inventory, &tick)?);
    } else {
        print!("{}", snapshot::to_table(&inventory, &tick));
    }
    Ok(())
}
