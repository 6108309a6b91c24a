//! `gpufleet-agent`: `run` streams this node's GPU samples to a collector; `snapshot`
//! prints one local reading; `exec` measures one command (it runs the `gpufleet-exec`
//! binary, git-style, so this long-running one links no HTTP client or plotting). Every
//! flag also reads `GPUFLEET_<FLAG>` and the `--config` TOML file (precedence: command
//! line > environment > file > default).

use anyhow::{Context, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};
use gpufleet_agent::cli::{CredentialArgs, NameArgs, SourceArgs, SpoolArgs};
use gpufleet_agent::host::HostReader;
use gpufleet_agent::snapshot::{self, Spacing};
use gpufleet_agent::spool::Spool;
use gpufleet_cli::args_with_config_file;
use gpufleet_core::HostSource;
use gpufleet_core::config::{init_tracing, now_ms, parse_duration};
use gpufleet_uplink::sampler::Sampler;
use gpufleet_uplink::tls::Credentials;
use gpufleet_uplink::{OpenOutbox, OutboxError, RunOptions, run_agent_with};
use std::collections::BTreeMap;
use std::ffi::OsString;
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
    /// TOML file with flag values (keys are flag names; a [run], [snapshot] or [exec] table
    /// applies to that command only).
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
    Snapshot(Box<SnapshotArgs>),
    /// Run a command and measure the GPUs its processes use while it runs; at its exit
    /// print the energy / carbon report (to stderr) and write it as JSON / YAML / CSV
    /// (+ a PNG plot). Exits with the command's exit code. Runs `gpufleet-exec` (next to
    /// this binary, else on PATH): `gpufleet-agent exec --help` shows its flags.
    #[command(disable_help_flag = true)]
    Exec {
        /// gpufleet-exec's flags, then `--` and the command.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<OsString>,
    },
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
    /// Node name [default: $NODE_NAME (a Kubernetes pod's downward API), else the host
    /// name].
    #[arg(long, env = "GPUFLEET_NODE", value_name = "NAME")]
    node: Option<String>,
    /// Sampling interval (200ms, 1s, 5m).
    #[arg(long, env = "GPUFLEET_INTERVAL", value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
    /// How often host metrics (CPU, memory, load, disk and network I/O from /proc) are
    /// read, whatever the interval; the ticks between carry none (0: every tick).
    #[arg(long, env = "GPUFLEET_HOST_INTERVAL", value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    host_interval: Duration,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    names: NameArgs,
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
    credentials: CredentialArgs,
}

#[derive(Debug, Args)]
struct SnapshotArgs {
    /// Print JSON ({"inventory": …, "tick": …}) instead of a table.
    #[arg(long, env = "GPUFLEET_JSON")]
    json: bool,
    /// Node name [default: $NODE_NAME, else the host name].
    #[arg(long, env = "GPUFLEET_NODE", value_name = "NAME")]
    node: Option<String>,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    names: NameArgs,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.trim().to_owned())),
        _ => Err(format!("invalid label {s:?}: write key=value")),
    }
}

fn main() -> ExitCode {
    // `exec` is another binary's: hand it the command line before anything here reads it
    // (its flags and its table of the config file are gpufleet-exec's to check).
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(rest) = exec_args(&args) {
        eprintln!("error: {:#}", run_exec_binary(rest));
        return ExitCode::FAILURE;
    }
    init_tracing("info");
    match real_main(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(args: Vec<OsString>) -> anyhow::Result<()> {
    let args = args_with_config_file(args, &Cli::command())?;
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Run(args) => run(*args),
        Command::Snapshot(args) => snapshot_cmd(*args),
        // `main` hands `exec` on before parsing; were it to get here, hand it on too.
        Command::Exec { args } => {
            let mut rest = Vec::new();
            if let Some(config) = cli.config {
                rest.push(OsString::from("--config"));
                rest.push(config.into_os_string());
            }
            rest.extend(args);
            Err(run_exec_binary(rest))
        }
    }
}

/// When the command line runs `exec`: gpufleet-exec's arguments (a `--config` given before
/// `exec`, then everything after it). `None` for any other command, `--help` or `--version`.
fn exec_args(args: &[OsString]) -> Option<Vec<OsString>> {
    let mut config: Vec<OsString> = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let text = a.to_string_lossy();
        if text == "--config" {
            config.push(a.clone());
            config.push(it.next()?.clone());
        } else if text.starts_with("--config=") {
            config.push(a.clone());
        } else if text == "exec" {
            config.extend(it.cloned());
            return Some(config);
        } else {
            return None;
        }
    }
    None
}

/// Runs `gpufleet-exec` with `args` in place of this process (same pid, stdio and exit
/// code; signals reach it directly): the one next to this binary, else the first on PATH
/// in an absolute directory (never the current directory, whatever PATH says). It is told
/// this agent's version and refuses to run if its own differs. Returns only if it could
/// not be started, with why.
fn run_exec_binary(args: Vec<OsString>) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    const EXEC: &str = "gpufleet-exec";
    let beside = std::env::current_exe()
        .ok()
        .and_then(|me| me.parent().map(|dir| dir.join(EXEC)))
        .filter(|path| path.is_file());
    let Some(program) = beside.or_else(|| on_path(EXEC)) else {
        return anyhow::anyhow!(
            "`gpufleet-agent exec` needs the gpufleet-exec binary next to gpufleet-agent or \
             in an absolute directory on PATH (cargo build --release -p gpufleet-exec)"
        );
    };
    let err = std::process::Command::new(&program)
        .args(args)
        .env(
            gpufleet_agent::cli::AGENT_VERSION_ENV,
            env!("CARGO_PKG_VERSION"),
        )
        .exec();
    anyhow::anyhow!("cannot run {}: {err}", program.display())
}

/// The first file `name` in an absolute directory of PATH. Empty and relative entries
/// (which would mean the current directory) are skipped.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn node_name(given: Option<String>, proc_root: &Path) -> anyhow::Result<String> {
    match gpufleet_agent::cli::node_name(given, proc_root) {
        Some(n) => Ok(n),
        None => bail!("cannot determine the host name; pass --node NAME"),
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let node = node_name(args.node, &args.source.proc_root)?;
    let cadence = args.source.cadence()?;
    let source = args.source.open(&node, args.interval, Some(cadence))?;
    let (source, _names) =
        (args.names).attach(source, args.source.simulate, &node, &args.source.proc_root);
    let labels: BTreeMap<String, String> = args.labels.into_iter().collect();
    let host_interval = args.host_interval;
    // A simulated node must not report this machine's CPU and memory as its own.
    let host: Option<Box<dyn HostSource>> = (!args.source.simulate)
        .then(|| Box::new(HostReader::new(&args.source.proc_root)) as Box<dyn HostSource>);
    let spool = args.spool.config(&node);
    let open_spool: OpenOutbox = Box::new(move || {
        Spool::open(spool)
            .map(|s| Box::new(s) as _)
            .map_err(OutboxError::new)
    });
    let opts = RunOptions {
        interval: args.interval,
        labels,
        boot_id: None,
        shutdown_timeout: args.shutdown_timeout,
        batch_max_ticks: args.batch_max_ticks as usize,
        credentials: Credentials::load(&args.credentials.files())?,
        ..RunOptions::new(node, args.collector)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let summary = runtime.block_on(async move {
        let shutdown = CancellationToken::new();
        let signals = watch_signals(shutdown.clone())?;
        let sampler = Sampler::new(source, host).with_host_interval(host_interval);
        // Under systemd (`Type=notify`): the source is open and sampling starts now.
        notify_systemd(&[sd_notify::NotifyState::Ready]);
        tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                shutdown.cancelled().await;
                notify_systemd(&[sd_notify::NotifyState::Stopping]);
            }
        });
        let summary = run_agent_with(opts, sampler, Some(open_spool), shutdown).await;
        signals.abort();
        anyhow::Ok(summary?)
    })?;
    println!("{summary}");
    Ok(())
}

/// Tells systemd (when it started us with `NOTIFY_SOCKET`) how the agent is doing; a
/// failure to tell is logged, never fatal.
fn notify_systemd(state: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(state) {
        warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)");
    }
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

fn snapshot_cmd(args: SnapshotArgs) -> anyhow::Result<()> {
    // A local reading names no node: the name only labels the table.
    let node = gpufleet_agent::cli::node_name(args.node, &args.source.proc_root)
        .unwrap_or_else(|| "localhost".into());
    // Both readings make every call (one-off: no cadence to save on).
    let source = args.source.open(&node, Duration::from_millis(500), None)?;
    // The first reading asks for the names; the answers are waited for (at most
    // --names-timeout) and written into the reading shown.
    let (source, names) =
        (args.names).attach(source, args.source.simulate, &node, &args.source.proc_root);
    let host = (!args.source.simulate)
        .then(|| Box::new(HostReader::new(&args.source.proc_root)) as Box<dyn HostSource>);
    // Both readings carry host metrics (the CPU share is their difference).
    let mut sampler = Sampler::new(source, host).with_host_interval(Duration::ZERO);
    let spacing = if args.source.simulate {
        Spacing::Simulated
    } else {
        Spacing::Wait(Duration::from_millis(500))
    };
    let (inventory, mut tick) = snapshot::take(&mut sampler, now_ms(), spacing)?;
    if let Some(names) = names {
        names.wait_settled(args.names.names_timeout);
        names.fill_tick(&mut tick);
    }
    if args.json {
        println!("{}", snapshot::to_json(&inventory, &tick)?);
    } else {
        print!("{}", snapshot::to_table(&inventory, &tick));
    }
    Ok(())
}
