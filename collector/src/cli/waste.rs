//! Idle-but-allocated waste on the command line: the rule's flags `serve` takes
//! ([`WasteArgs`]) and `report waste` ([`run_waste_report`]), the episodes of a range as a
//! table, JSON, YAML or CSV.

use crate::accounting::waste::{self, WasteSettings};
use crate::cli::energy::{EnergyCliError, EnergyRangeArgs};
use crate::store;
use gpufleet_core::config::{now_ms, parse_duration};
use gpufleet_report::Format;
use gpufleet_report::waste::{WasteEpisodeRow, WasteReport};
use std::io::Write;
use std::time::Duration;

/// The idle-but-allocated rule (`/api/v1/waste`'s defaults, `/metrics`' gauge).
#[derive(Debug, Clone, clap::Args)]
pub struct WasteArgs {
    /// A GPU at or below this utilization (percent) does no work: a workload holding it
    /// then wastes it.
    #[arg(long, env = "GPUFLEET_WASTE_UTIL_THRESHOLD", default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=100), value_name = "PERCENT")]
    pub waste_util_threshold: u32,
    /// Shortest idle-but-allocated episode reported (and shown on /metrics).
    #[arg(long, env = "GPUFLEET_WASTE_MIN_IDLE", default_value = "30m", value_parser = parse_duration, value_name = "DURATION")]
    pub waste_min_idle: Duration,
}

impl WasteArgs {
    pub fn settings(&self) -> WasteSettings {
        WasteSettings {
            util_threshold_pct: self.waste_util_threshold,
            min_idle: self.waste_min_idle,
        }
    }
}

/// How far back `report waste` looks without `--from`: a day.
pub const REPORT_DEFAULT_SPAN_MS: i64 = 24 * 3600 * 1000;

/// `report waste` arguments (`--from` defaults to a day before `--to`).
#[derive(Debug, Clone, clap::Args)]
pub struct WasteReportArgs {
    #[command(flatten)]
    pub range: EnergyRangeArgs,
    /// Only this node's GPUs.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    #[command(flatten)]
    pub rule: WasteArgs,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = Format::parse, value_name = "table|json|yaml|csv")]
    pub format: Format,
}

/// Runs `report waste`: the range's episodes, in the asked format, to `out`.
pub async fn run_waste_report(
    args: &WasteReportArgs,
    out: &mut dyn Write,
) -> Result<(), EnergyCliError> {
    let mut range = args.range.range()?;
    // The episodes of the last day unless asked for more (an unbounded range reads the
    // whole history).
    if args.range.from.is_none() {
        range.from_ms = range.to_ms.saturating_sub(REPORT_DEFAULT_SPAN_MS);
    }
    range.from_ms = crate::accounting::energy::minute_of(range.from_ms);
    let store = store::open(&args.range.db).await?;
    let episodes = waste::find(
        store.as_ref(),
        range,
        args.node.as_deref(),
        args.rule.settings(),
        now_ms(),
    )
    .await;
    store.close().await;
    let report = waste_report(&episodes?, args.rule.settings(), range);
    let text = gpufleet_report::waste::render(&report, args.format)
        .map_err(|e| EnergyCliError::Output(e.to_string()))?;
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// The report model of episodes.
pub fn waste_report(
    episodes: &[waste::Episode],
    settings: WasteSettings,
    range: store::TimeRange,
) -> WasteReport {
    use gpufleet_core::config::format_time;
    let rows = episodes
        .iter()
        .map(|e| {
            let w = &e.workload;
            WasteEpisodeRow {
                node: e.node.clone(),
                gpu_uuid: e.gpu_uuid.clone(),
                gpu_index: e.gpu_index,
                workload: w.key(),
                kind: w.kind.as_str().to_owned(),
                name: w
                    .pod_name
                    .clone()
                    .or_else(|| w.container_name.clone())
                    .or_else(|| w.unit.clone()),
                namespace: w.namespace.clone(),
                job_id: w.job_id.clone(),
                uid: w.uid,
                since: format_time(e.since_ms),
                until: format_time(e.until_ms),
                ongoing: e.ongoing,
                idle_minutes: e.minutes,
                memory_bytes: e.mem_max_bytes,
                energy_mj: e.energy_mj,
                energy_kwh: e.energy_mj as f64 / 3.6e9,
                carbon_g: e.carbon_g,
                unpriced_mj: e.energy_mj.saturating_sub(e.priced_mj),
            }
        })
        .collect();
    WasteReport {
        from: format_time(range.from_ms),
        to: format_time(range.to_ms),
        util_threshold_pct: settings.util_threshold_pct,
        min_idle_s: settings.min_idle.as_secs(),
        episodes: rows,
    }
}
