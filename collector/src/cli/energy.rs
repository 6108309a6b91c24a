//! The energy part of the command line: the accounting flags `serve` and `demo` take
//! (flattened into their args), and the `check-energy` / `recompute-energy` commands.

use crate::accounting::accountant::{self, EnergyOptions, IdleConfig};
use crate::accounting::check::{self, CheckReport};
use crate::accounting::energy::IdlePolicy;
use crate::store::{self, StoreError, TimeRange};
use gpufleet_core::config::{format_time, now_ms, parse_duration, parse_time};
use std::io::Write;
use std::time::Duration;

/// Energy accounting flags.
#[derive(Debug, Clone, clap::Args)]
pub struct EnergyArgs {
    /// Where idle energy goes while workloads are on a GPU: `spread` (split over them: an
    /// allocated-but-idle GPU is charged to whoever holds it) or `separate` (a per-GPU
    /// `idle` bucket).
    #[arg(long, env = "GPUFLEET_ENERGY_IDLE_POLICY", default_value = "spread", value_parser = parse_policy, value_name = "spread|separate")]
    pub energy_idle_policy: IdlePolicy,
    /// A GPU's idle power: `auto` (learned from the time the GPU did no work; until then
    /// the model's datasheet default, else a fallback), watts for every GPU (`45`), or per
    /// model (`H100=60,L40S=35`; unlisted models use the default). `min` is read as `auto`.
    #[arg(long, env = "GPUFLEET_ENERGY_IDLE", default_value = "auto", value_parser = IdleConfig::parse, value_name = "auto|WATTS|MODEL=WATTS,…")]
    pub energy_idle: IdleConfig,
    /// Intervals between two samples longer than this are `missing` (no energy is
    /// invented for them). Default: 3 × the node's sampling interval.
    #[arg(long, env = "GPUFLEET_ENERGY_MAX_GAP", value_parser = parse_duration, value_name = "DURATION")]
    pub energy_max_gap: Option<Duration>,
}

fn parse_policy(s: &str) -> Result<IdlePolicy, String> {
    IdlePolicy::parse(s).ok_or_else(|| format!("{s:?}: expected `spread` or `separate`"))
}

impl EnergyArgs {
    pub fn options(&self) -> EnergyOptions {
        EnergyOptions {
            idle_policy: self.energy_idle_policy,
            idle: self.energy_idle.clone(),
            max_gap: self.energy_max_gap,
            ..Default::default()
        }
    }
}

/// `check-energy` / `recompute-energy` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct EnergyRangeArgs {
    /// Database URL: sqlite://PATH or postgres://USER:PASSWORD@HOST:PORT/DATABASE.
    #[arg(
        long,
        env = "GPUFLEET_DB",
        default_value = "sqlite://gpufleet.db",
        value_name = "URL"
    )]
    pub db: String,
    /// Start of the range (RFC 3339, Unix ms, `now-1h`). Default: the beginning.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// End of the range (inclusive). Default: now.
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
}

/// `recompute-energy` arguments: the range and the policy to recompute with.
#[derive(Debug, Clone, clap::Args)]
pub struct RecomputeArgs {
    #[command(flatten)]
    pub range: EnergyRangeArgs,
    #[command(flatten)]
    pub energy: EnergyArgs,
}

/// Why an energy command failed.
#[derive(Debug, thiserror::Error)]
pub enum EnergyCliError {
    #[error("{0}")]
    Args(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot write the report: {0}")]
    Io(#[from] std::io::Error),
    /// A report could not be rendered or its plot written.
    #[error("{0}")]
    Output(String),
}

impl EnergyRangeArgs {
    /// The range the flags give (default: the beginning .. now).
    pub fn range(&self) -> Result<TimeRange, EnergyCliError> {
        let now = now_ms();
        let to = match &self.to {
            Some(t) => {
                parse_time(t, now).map_err(|e| EnergyCliError::Args(format!("--to: {e}")))?
            }
            None => now,
        };
        let from = match &self.from {
            Some(f) => {
                parse_time(f, now).map_err(|e| EnergyCliError::Args(format!("--from: {e}")))?
            }
            None => 0,
        };
        if from > to {
            return Err(EnergyCliError::Args(format!(
                "--from ({}) is after --to ({})",
                format_time(from),
                format_time(to)
            )));
        }
        Ok(TimeRange {
            from_ms: from,
            to_ms: to,
        })
    }
}

/// Runs `check-energy`: prints every violation and a summary to `out`; returns whether
/// the stored energy is consistent.
pub async fn run_check(
    args: &EnergyRangeArgs,
    out: &mut dyn Write,
) -> Result<bool, EnergyCliError> {
    let range = args.range()?;
    let store = store::open(&args.db).await?;
    let report = check::check(store.as_ref(), range).await;
    store.close().await;
    let report = report?;
    print_report(&report, out)?;
    Ok(report.violations.is_empty())
}

fn print_report(r: &CheckReport, out: &mut dyn Write) -> std::io::Result<()> {
    for v in &r.violations {
        writeln!(
            out,
            "VIOLATION node={} gpu={} minute={} {}",
            v.node,
            v.gpu_uuid,
            format_time(v.minute_ms),
            v.what
        )?;
    }
    writeln!(
        out,
        "checked {} GPU-minutes ({} against raw samples, {} pending, {} by earlier rules: \
         conservation only, `recompute-energy` rebuilds them), {:.6} kWh: {} violations",
        r.minutes,
        r.compared_with_raw,
        r.pending_minutes,
        r.earlier_rules,
        r.energy_mj as f64 / 3.6e9,
        r.violations.len()
    )
}

/// Runs `recompute-energy`: rebuilds the accounted minutes of the range with the given
/// policy; prints how many.
pub async fn run_recompute(
    args: &RecomputeArgs,
    out: &mut dyn Write,
) -> Result<(), EnergyCliError> {
    let range = args.range.range()?;
    let store = store::open(&args.range.db).await?;
    let n = accountant::recompute(store.as_ref(), range, &args.energy.options()).await;
    store.close().await;
    writeln!(
        out,
        "recomputed {} GPU-minutes with idle policy {}",
        n?,
        args.energy.energy_idle_policy.as_str()
    )?;
    Ok(())
}
