//! The waste report: idle-but-allocated episodes (a workload holding GPU memory on a GPU
//! that does no work) over a range, as `table`, `json`, `yaml` or `csv` (one row per
//! episode). Absent figures are `n/a` in the table, `null` in JSON / YAML, an empty cell
//! in CSV.

use crate::render::{Format, RenderError};
use serde::Serialize;
use std::fmt::Write as _;

/// Episodes over a range and the rule that found them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WasteReport {
    pub from: String,
    pub to: String,
    /// A GPU at or below this utilization did no work.
    pub util_threshold_pct: u32,
    /// Shortest episode reported, seconds.
    pub min_idle_s: u64,
    pub episodes: Vec<WasteEpisodeRow>,
}

/// One episode: who held which GPU idle, from when, and what it burned.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WasteEpisodeRow {
    pub node: String,
    pub gpu_uuid: String,
    pub gpu_index: u32,
    /// The workload key (`container:<id>`, `slurm:<job>`, `host:<unit or uid>`).
    pub workload: String,
    pub kind: String,
    /// Pod, container or unit name, when known.
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub job_id: Option<String>,
    pub uid: Option<u32>,
    pub since: String,
    pub until: String,
    pub ongoing: bool,
    pub idle_minutes: u32,
    pub memory_bytes: Option<u64>,
    /// Its share of the GPU's energy while idle, mJ (exact) and kWh.
    pub energy_mj: u64,
    pub energy_kwh: f64,
    /// `None` while none of it is priced.
    pub carbon_g: Option<f64>,
    pub unpriced_mj: u64,
}

fn columns(r: &WasteEpisodeRow) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("node", Some(r.node.clone())),
        ("gpu_uuid", Some(r.gpu_uuid.clone())),
        ("gpu_index", Some(r.gpu_index.to_string())),
        ("workload", Some(r.workload.clone())),
        ("kind", Some(r.kind.clone())),
        ("name", r.name.clone()),
        ("namespace", r.namespace.clone()),
        ("job_id", r.job_id.clone()),
        ("uid", r.uid.map(|u| u.to_string())),
        ("since", Some(r.since.clone())),
        ("until", Some(r.until.clone())),
        ("ongoing", Some(r.ongoing.to_string())),
        ("idle_minutes", Some(r.idle_minutes.to_string())),
        ("memory_bytes", r.memory_bytes.map(|b| b.to_string())),
        (
            "energy_j",
            Some(format!("{:.3}", r.energy_mj as f64 / 1000.0)),
        ),
        ("energy_kwh", Some(format!("{:.9}", r.energy_kwh))),
        ("carbon_g", r.carbon_g.map(|g| format!("{g:.4}"))),
        (
            "unpriced_j",
            Some(format!("{:.3}", r.unpriced_mj as f64 / 1000.0)),
        ),
    ]
}

/// Renders `report` in `format`.
pub fn render(report: &WasteReport, format: Format) -> Result<String, RenderError> {
    Ok(match format {
        Format::Table => table(report),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(report)?;
            s.push('\n');
            s
        }
        Format::Yaml => serde_norway::to_string(report)?,
        Format::Csv => {
            let mut w = csv::Writer::from_writer(Vec::new());
            let header: Vec<&str> = columns(&WasteEpisodeRow::default())
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            w.write_record(&header)?;
            for r in &report.episodes {
                w.write_record(columns(r).into_iter().map(|(_, v)| v.unwrap_or_default()))?;
            }
            let bytes = w
                .into_inner()
                .map_err(|e| csv::Error::from(e.into_error()))?;
            String::from_utf8_lossy(&bytes).into_owned()
        }
    })
}

/// The table: a heading with the rule, then one aligned line per episode and a total.
pub fn table(r: &WasteReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Idle but allocated: utilization <= {} % for >= {} min, {} .. {}",
        r.util_threshold_pct,
        r.min_idle_s / 60,
        r.from,
        r.to
    );
    if r.episodes.is_empty() {
        out.push_str("no episodes\n");
        return out;
    }
    let head = [
        "NODE", "GPU", "WORKLOAD", "NAME", "SINCE", "IDLE", "MEMORY", "ENERGY", "CO2",
    ];
    let rows: Vec<[String; 9]> = r
        .episodes
        .iter()
        .map(|e| {
            [
                e.node.clone(),
                e.gpu_index.to_string(),
                e.workload.clone(),
                e.name.clone().unwrap_or_else(|| "n/a".into()),
                e.since.clone(),
                format!(
                    "{} min{}",
                    e.idle_minutes,
                    if e.ongoing { " (ongoing)" } else { "" }
                ),
                e.memory_bytes.map_or_else(
                    || "n/a".into(),
                    |b| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
                ),
                format!("{:.6} kWh", e.energy_kwh),
                e.carbon_g
                    .map_or_else(|| "n/a".into(), |g| format!("{g:.2} g")),
            ]
        })
        .collect();
    let mut widths = head.map(str::len);
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(c.chars().count());
            s.push_str(c);
            if i + 1 < cells.len() {
                s.push_str(&" ".repeat(pad + 2));
            }
        }
        s.push('\n');
        s
    };
    out.push_str(&line(&head));
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells));
    }
    let kwh: f64 = r.episodes.iter().map(|e| e.energy_kwh).sum();
    let carbon: Option<f64> = r
        .episodes
        .iter()
        .filter_map(|e| e.carbon_g)
        .reduce(|a, b| a + b);
    let _ = writeln!(
        out,
        "Total: {} episodes, {kwh:.6} kWh, {}",
        r.episodes.len(),
        carbon.map_or_else(|| "CO2 n/a".into(), |g| format!("{g:.2} gCO2"))
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> WasteReport {
        WasteReport {
            from: "2026-01-01T00:00:00Z".into(),
            to: "2026-01-02T00:00:00Z".into(),
            util_threshold_pct: 1,
            min_idle_s: 1800,
            episodes: vec![WasteEpisodeRow {
                node: "n1".into(),
                gpu_uuid: "GPU-1".into(),
                gpu_index: 0,
                workload: "slurm:7".into(),
                kind: "slurm".into(),
                job_id: Some("7".into()),
                since: "2026-01-01T10:00:00Z".into(),
                until: "2026-01-01T10:31:00Z".into(),
                idle_minutes: 31,
                energy_mj: 186_000_000,
                energy_kwh: 186_000_000.0 / 3.6e9,
                carbon_g: None,
                unpriced_mj: 186_000_000,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn csv_has_one_row_per_episode_and_absent_is_an_empty_cell() {
        let text = render(&report(), Format::Csv).expect("csv");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("node,gpu_uuid,gpu_index,workload"));
        assert!(
            lines[1].contains(",186000.000,0.051666667,,186000.000"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn table_says_n_a_for_unknown_carbon_never_zero() {
        let text = render(&report(), Format::Table).expect("table");
        assert!(text.contains("31 min"), "{text}");
        assert!(text.contains("CO2 n/a"), "{text}");
        assert!(!text.contains("0.00 g"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&report(), Format::Json).expect("json"))
                .expect("valid JSON");
        assert!(json["episodes"][0]["carbon_g"].is_null());
    }
}
