//! `gpufleet-exec`, run as `gpufleet-agent exec [OPTIONS] -- COMMAND [ARGS…]`: measures one
//! command (see the library). Every flag also reads `GPUFLEET_<FLAG>` and the agent's
//! `--config` TOML file (precedence: command line > environment > file > default).

use anyhow::{Context, bail};
use clap::{CommandFactory, Parser};
use gpufleet_agent::cli::SourceArgs;
use gpufleet_cli::args_with_config_file_as;
use gpufleet_core::config::{init_tracing, parse_duration};
use gpufleet_exec::{ExecOptions, run_exec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "gpufleet-exec",
    bin_name = "gpufleet-agent exec",
    version,
    about = "Run a command and measure the GPUs its processes use while it runs; at its exit \
             print the energy / carbon report (to stderr) and write it as JSON / YAML / CSV \
             (+ a PNG plot). Exits with the command's exit code."
)]
struct ExecArgs {
    /// TOML file with flag values (keys are flag names; an [exec] table applies to exec
    /// only; the agent's [run] and [snapshot] tables are skipped).
    #[arg(long, env = "GPUFLEET_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
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
    carbon: gpufleet_cli::CarbonArgs,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn main() -> ExitCode {
    init_tracing("info");
    match real_main() {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<i32> {
    // Run as `gpufleet-agent exec`: both binaries must come from the same release.
    if let Some(agent) = std::env::var_os(gpufleet_agent::cli::AGENT_VERSION_ENV) {
        let ours = env!("CARGO_PKG_VERSION");
        if agent != ours {
            bail!(
                "gpufleet-agent {} ran gpufleet-exec {ours}: install both from the same release",
                agent.to_string_lossy()
            );
        }
    }
    // One config file serves the agent's whole family: this is its `exec` command.
    let args = args_with_config_file_as(
        std::env::args_os().collect(),
        &ExecArgs::command(),
        "exec",
        &["run", "snapshot"],
    )?;
    exec_cmd(ExecArgs::parse_from(args))
}

fn node_name(given: Option<String>, proc_root: &Path) -> anyhow::Result<String> {
    match gpufleet_agent::cli::node_name(given, proc_root) {
        Some(n) => Ok(n),
        None => bail!("cannot determine the host name; pass --node NAME"),
    }
}

/// Runs `exec`; returns the exit code to leave with (the command's).
fn exec_cmd(args: ExecArgs) -> anyhow::Result<i32> {
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
    let carbon = gpufleet_carbon::CarbonConfig::new(args.carbon.into(), carbon_file)?
        .node(&node, &BTreeMap::new())?;
    // Every reading of the command's life counts: every call every tick.
    let source = args.source.open(&node, args.interval, None)?;
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
