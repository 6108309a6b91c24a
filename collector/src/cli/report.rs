//! `gpufleet-collector report`: the report of [`crate::accounting::report`] for a
//! container, pod, Slurm job or node, printed as a table, JSON, YAML or CSV, with an
//! optional plot; `report waste`: the idle-but-allocated episodes of a range
//! ([`crate::cli::waste`]).

use crate::accounting::report::{ReportError, ReportSubject, build};
use crate::cli::energy::{EnergyCliError, EnergyRangeArgs};
use crate::cli::waste::{WasteReportArgs, run_waste_report};
use crate::store;
use gpufleet_report::Format;
use std::io::Write;
use std::path::PathBuf;

/// `gpufleet-collector report` arguments.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("subject").required(true).args(["container", "pod", "job", "node"])))]
#[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
pub struct ReportArgs {
    /// `waste`: the idle-but-allocated episodes of a range instead of one subject's report.
    #[command(subcommand)]
    pub what: Option<ReportCommand>,
    /// A workload key (`container:<id>`, `slurm:<job>`, `host:<unit>`; a bare id means a
    /// container), as listed by /api/v1/containers.
    #[arg(long, value_name = "KEY")]
    pub container: Option<String>,
    /// A Kubernetes pod, by UID (`pod:<uid>`) or name.
    #[arg(long, value_name = "UID|NAME")]
    pub pod: Option<String>,
    /// A Slurm job as sacct writes it: `123` (with its array tasks and heterogeneous
    /// components, as `sacct -j 123`), `123_4` (an array task), `123+1` (a heterogeneous
    /// job component).
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// A node (every GPU's energy).
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    #[command(flatten)]
    pub range: EnergyRangeArgs,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = Format::parse, value_name = "table|json|yaml|csv")]
    pub format: Format,
    /// Also write the time-series plot (PNG) to this file.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Include the per-GPU time series and the intensities in JSON / YAML (long).
    #[arg(long)]
    pub series: bool,
}

/// Reports other than one subject's.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ReportCommand {
    /// Idle-but-allocated episodes: workloads holding GPU memory on a GPU that does no
    /// work, with the energy and CO2 they burned meanwhile.
    Waste(WasteReportArgs),
}

impl ReportArgs {
    fn subject(&self) -> Option<ReportSubject> {
        let s = if let Some(c) = &self.container {
            ReportSubject::Container(c.clone())
        } else if let Some(p) = &self.pod {
            ReportSubject::Pod(p.clone())
        } else if let Some(j) = &self.job {
            ReportSubject::Job(j.clone())
        } else {
            ReportSubject::Node(self.node.clone()?)
        };
        Some(s.normalized())
    }
}

/// Runs `report`: prints the report in the asked format to `out` and writes the plot.
pub async fn run_report(args: &ReportArgs, out: &mut dyn Write) -> Result<(), EnergyCliError> {
    if let Some(ReportCommand::Waste(w)) = &args.what {
        return run_waste_report(w, out).await;
    }
    let subject = args.subject().ok_or_else(|| {
        EnergyCliError::Args("give one of --container, --pod, --job or --node".into())
    })?;
    let mut range = args.range.range()?;
    range.from_ms = crate::accounting::energy::minute_of(range.from_ms);
    let store = store::open(&args.range.db).await?;
    let report = build(store.as_ref(), &subject, range).await;
    store.close().await;
    let report = match report {
        Ok(r) => r,
        Err(ReportError::Store(e)) => return Err(e.into()),
        Err(ReportError::NotFound(m) | ReportError::Invalid(m)) => {
            return Err(EnergyCliError::Args(m));
        }
    };
    if let Some(path) = &args.plot {
        gpufleet_report::plot::write_png(&report, path)
            .map_err(|e| EnergyCliError::Output(e.to_string()))?;
    }
    let report = if args.series {
        report
    } else {
        report.without_series()
    };
    let text = gpufleet_report::render(&report, args.format)
        .map_err(|e| EnergyCliError::Output(e.to_string()))?;
    out.write_all(text.as_bytes())?;
    Ok(())
}
