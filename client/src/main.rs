//! The `gpufleet` binary: `gpufleet top`.

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use gpufleet::app::{App, Sort};
use gpufleet::net::{Api, ApiOptions};
use gpufleet::top;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "gpufleet",
    version,
    about = "gpufleet client: the fleet in a terminal"
)]
struct Cli {
    /// TOML file with flag values (keys are flag names; a [top] table applies to `top`).
    #[arg(long, global = true, env = "GPUFLEET_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The fleet live, like htop: nodes with per-GPU bars, a node's GPUs, processes and
    /// events, today's energy and CO2 per workload.
    Top(TopArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SortArg {
    Name,
    Status,
    Util,
    Mem,
    Power,
    Temp,
}

#[derive(Debug, clap::Args)]
struct TopArgs {
    /// The collector's HTTP address.
    #[arg(
        long,
        env = "GPUFLEET_URL",
        default_value = "http://127.0.0.1:8080",
        value_name = "URL"
    )]
    url: String,
    /// A file holding a viewer token (`gft_…`), sent as `Authorization: Bearer`; needed
    /// when the collector requires viewers to log in.
    #[arg(long, env = "GPUFLEET_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// PEM file of the CA that signed the collector's certificate (trusted beside the
    /// system's roots).
    #[arg(long, env = "GPUFLEET_CA", value_name = "PEM")]
    ca: Option<PathBuf>,
    /// Print one frame and exit (for scripts).
    #[arg(long)]
    once: bool,
    /// With --once: the frame as JSON.
    #[arg(long, requires = "once")]
    json: bool,
    /// With --once: the frame's width in columns (default: the terminal's, else 160).
    #[arg(long, requires = "once", value_parser = clap::value_parser!(u16).range(20..=1000), value_name = "N")]
    width: Option<u16>,
    /// Show only nodes whose name or a `label=value` contains this.
    #[arg(long, value_name = "TEXT")]
    filter: Option<String>,
    /// Sort the nodes by this (figures: busiest first).
    #[arg(long, value_enum, default_value = "name")]
    sort: SortArg,
}

fn main() -> anyhow::Result<()> {
    let args = gpufleet_cli::args_with_config_file(std::env::args_os().collect(), &Cli::command())?;
    let cli = Cli::parse_from(args);
    let Command::Top(args) = cli.command;
    let token = match &args.token_file {
        None => None,
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read --token-file {}", p.display()))?,
        ),
    };
    let ca_pem = match &args.ca {
        None => None,
        Some(p) => {
            Some(std::fs::read(p).with_context(|| format!("cannot read --ca {}", p.display()))?)
        }
    };
    let api = Api::new(&ApiOptions {
        url: args.url.clone(),
        token,
        ca_pem,
    })?;
    let mut app = App::new();
    app.filter = args.filter.unwrap_or_default();
    app.sort = match args.sort {
        SortArg::Name => Sort::Name,
        SortArg::Status => Sort::Status,
        SortArg::Util => Sort::Util,
        SortArg::Mem => Sort::Mem,
        SortArg::Power => Sort::Power,
        SortArg::Temp => Sort::Temp,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    if args.once {
        let width = args
            .width
            .or_else(|| ratatui::crossterm::terminal::size().ok().map(|(w, _)| w))
            .unwrap_or(160);
        let text = runtime.block_on(top::once(&api, &args.url, args.json, width, &mut app))?;
        top::print(&text).context("cannot write to stdout")?;
        return Ok(());
    }
    runtime.block_on(top::interactive(api, args.url, app))?;
    Ok(())
}
