//! Renderers: `table` (aligned, for people), `json`, `yaml`, `csv` (one header row and one
//! row per report). Absent figures are `n/a` in the table, `null` in JSON and YAML, and an
//! empty cell in CSV.

use crate::model::Report;
use std::fmt::Write as _;

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Yaml,
    Csv,
}

impl Format {
    /// `table`, `json`, `yaml` (or `yml`), `csv`.
    pub fn parse(s: &str) -> Result<Format, String> {
        match s {
            "table" => Ok(Format::Table),
            "json" => Ok(Format::Json),
            "yaml" | "yml" => Ok(Format::Yaml),
            "csv" => Ok(Format::Csv),
            other => Err(format!(
                "format {other:?}: expected table, json, yaml or csv"
            )),
        }
    }

    /// The format a file name asks for by its extension (`.json`, `.yaml`/`.yml`, `.csv`,
    /// `.txt` for the table).
    pub fn from_path(path: &std::path::Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            "csv" => Some(Format::Csv),
            "txt" => Some(Format::Table),
            _ => None,
        }
    }

    /// The HTTP content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Table => "text/plain; charset=utf-8",
            Format::Json => "application/json",
            Format::Yaml => "application/yaml",
            Format::Csv => "text/csv; charset=utf-8",
        }
    }
}

/// Why a report could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cannot encode the report as JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot encode the report as YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
    #[error("cannot encode the report as CSV: {0}")]
    Csv(#[from] csv::Error),
}

/// Renders `report` in `format`.
pub fn render(report: &Report, format: Format) -> Result<String, RenderError> {
    Ok(match format {
        Format::Table => table(report),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(report)?;
            s.push('\n');
            s
        }
        Format::Yaml => serde_norway::to_string(report)?,
        Format::Csv => csv(std::slice::from_ref(report))?,
    })
}

const NA: &str = "n/a";

fn num(v: Option<f64>, decimals: usize) -> Option<String> {
    v.map(|v| format!("{v:.decimals$}"))
}

fn pct(v: Option<f64>) -> Option<String> {
    v.map(|v| format!("{:.1}", v * 100.0))
}

fn join(v: &[String]) -> Option<String> {
    (!v.is_empty()).then(|| v.join(";"))
}

/// The CSV columns of a report: (name, value); `None` is an empty cell.
fn columns(r: &Report) -> Vec<(&'static str, Option<String>)> {
    let (e, c, m) = (&r.energy, &r.carbon, &r.metrics);
    vec![
        ("subject_kind", Some(r.subject.kind.clone())),
        ("subject_key", Some(r.subject.key.clone())),
        ("subject_name", r.subject.name.clone()),
        ("nodes", join(&r.subject.nodes)),
        ("exit_code", r.subject.exit_code.map(|c| c.to_string())),
        ("from", Some(r.from.clone())),
        ("to", Some(r.to.clone())),
        ("elapsed_s", num(r.elapsed_s, 3)),
        ("gpu_count", Some(r.gpus.len().to_string())),
        ("gpu_names", join(&r.gpu_names())),
        ("energy_kwh", num(e.energy_kwh, 9)),
        ("energy_j", num(e.energy_j, 3)),
        ("counter_j", num(e.counter_j, 3)),
        ("trapezoid_j", num(e.trapezoid_j, 3)),
        ("provisional_j", num(e.provisional_j, 3)),
        ("carbon_g", num(c.carbon_g, 4)),
        ("avg_intensity_g_per_kwh", num(c.avg_intensity_g_per_kwh, 2)),
        ("priced_share", num(c.priced_share, 4)),
        ("intensity_sources", join(&c.sources)),
        ("intensity_regions", join(&c.regions)),
        ("forecast_share", num(c.forecast_share, 4)),
        ("estimated_share", num(c.estimated_share, 4)),
        ("pue", num(c.pue, 3)),
        ("util_gpu_avg_pct", num(m.util_gpu_avg_pct, 2)),
        ("util_gpu_max_pct", num(m.util_gpu_max_pct, 2)),
        ("power_avg_w", num(m.power_avg_w, 2)),
        ("power_max_w", num(m.power_max_w, 2)),
        ("power_limit_w", num(m.power_limit_w, 2)),
        ("temp_gpu_avg_c", num(m.temp_gpu_avg_c, 2)),
        ("temp_gpu_max_c", num(m.temp_gpu_max_c, 2)),
        ("mem_used_avg_bytes", num(m.mem_used_avg_bytes, 0)),
        ("mem_used_max_bytes", num(m.mem_used_max_bytes, 0)),
        ("mem_total_bytes", num(m.mem_total_bytes, 0)),
        ("sm_active_avg_pct", num(m.sm_active_avg_pct, 2)),
        ("sm_occupancy_avg_pct", num(m.sm_occupancy_avg_pct, 2)),
        ("tensor_active_avg_pct", num(m.tensor_active_avg_pct, 2)),
        ("dram_bw_avg_pct", num(m.dram_bw_avg_pct, 2)),
        ("tensor_active_pct", num(r.tensor_active_pct, 2)),
        ("sm_occupancy_pct", num(r.sm_occupancy_pct, 2)),
        ("samples", Some(m.samples.to_string())),
    ]
}

/// Several reports as CSV: a header row, then one row each.
pub fn csv(reports: &[Report]) -> Result<String, RenderError> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let header: Vec<&str> = columns(&Report::default())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    w.write_record(&header)?;
    for r in reports {
        w.write_record(columns(r).into_iter().map(|(_, v)| v.unwrap_or_default()))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| csv::Error::from(e.into_error()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn or_na(v: Option<String>) -> String {
    v.unwrap_or_else(|| NA.to_owned())
}

const GIB: f64 = (1u64 << 30) as f64;

fn gib(v: Option<f64>) -> Option<String> {
    v.map(|b| format!("{:.2} GiB", b / GIB))
}

fn with_unit(v: Option<f64>, decimals: usize, unit: &str) -> Option<String> {
    v.map(|v| format!("{v:.decimals$} {unit}"))
}

fn joules(j: f64) -> String {
    if j >= 1e6 {
        format!("{:.3} MJ", j / 1e6)
    } else if j >= 1e3 {
        format!("{:.3} kJ", j / 1e3)
    } else {
        format!("{j:.1} J")
    }
}

fn duration(s: f64) -> String {
    let total = s.round() as u64;
    let (h, m, sec) = (total / 3600, total / 60 % 60, total % 60);
    if h > 0 {
        format!("{h}h {m:02}m {sec:02}s ({s:.1} s)")
    } else if m > 0 {
        format!("{m}m {sec:02}s ({s:.1} s)")
    } else {
        format!("{s:.1} s")
    }
}

/// The table form: one aligned `label  value` line per figure, like iris-gpubench's
/// results table.
pub fn table(r: &Report) -> String {
    let (e, c, m) = (&r.energy, &r.carbon, &r.metrics);
    let subject = match &r.subject.name {
        Some(n) => format!("{} {} ({n})", r.subject.kind, r.subject.key),
        None => format!("{} {}", r.subject.kind, r.subject.key),
    };
    let mut rows: Vec<(&str, String)> = vec![
        ("Subject", subject),
        (
            "Nodes",
            or_na(join(&r.subject.nodes).map(|s| s.replace(';', ", "))),
        ),
        ("Range", format!("{} .. {}", r.from, r.to)),
        ("Elapsed", or_na(r.elapsed_s.map(duration))),
    ];
    if r.subject.kind == "command" {
        rows.push((
            "Exit code",
            r.subject
                .exit_code
                .map_or_else(|| "killed by a signal".to_owned(), |c| c.to_string()),
        ));
    }
    let gpus = if r.gpus.is_empty() {
        "none".to_owned()
    } else {
        r.gpu_names().join(", ")
    };
    let method = match (e.counter_share, e.energy_j) {
        (Some(share), _) => format!(
            " (energy counter {:.1} %, power integrated {:.1} %)",
            share * 100.0,
            (1.0 - share) * 100.0
        ),
        (None, Some(_)) => String::new(),
        (None, None) => String::new(),
    };
    let sources = if c.sources.is_empty() {
        String::new()
    } else {
        let regions = if c.regions.is_empty() {
            String::new()
        } else {
            format!(", region {}", c.regions.join(", "))
        };
        format!(" ({}{regions})", c.sources.join(", "))
    };
    rows.extend([
        ("GPUs", gpus),
        (
            "GPU energy",
            or_na(
                e.energy_kwh
                    .zip(e.energy_j)
                    .map(|(k, j)| format!("{k:.6} kWh = {}{method}", joules(j))),
            ),
        ),
    ]);
    // Energy of minutes still open: shown only when there is some (it may still change).
    if let Some(p) = e.provisional_j.filter(|&p| p > 0.0) {
        rows.push((
            "  provisional",
            format!(
                "{} of it in minutes still open (final when they close)",
                joules(p)
            ),
        ));
    }
    rows.extend([
        (
            "Carbon",
            or_na(c.carbon_g.map(|g| {
                let d = if g < 10.0 { 4 } else { 2 };
                format!("{g:.d$} gCO2")
            })),
        ),
        (
            "Avg intensity",
            or_na(
                c.avg_intensity_g_per_kwh
                    .map(|i| format!("{i:.1} gCO2/kWh{sources}")),
            ),
        ),
        (
            "Priced share",
            or_na(pct(c.priced_share).map(|p| format!("{p} % of the energy"))),
        ),
        (
            "Forecast share",
            or_na(pct(c.forecast_share).map(|p| format!("{p} %"))),
        ),
        (
            "Estimated share",
            or_na(pct(c.estimated_share).map(|p| format!("{p} %"))),
        ),
        ("PUE", or_na(num(c.pue, 2))),
        (
            "GPU utilization",
            format!(
                "avg {}  max {}",
                or_na(with_unit(m.util_gpu_avg_pct, 1, "%")),
                or_na(with_unit(m.util_gpu_max_pct, 0, "%"))
            ),
        ),
        (
            "GPM (GPUs)",
            if [
                m.sm_active_avg_pct,
                m.tensor_active_avg_pct,
                m.dram_bw_avg_pct,
            ]
            .iter()
            .all(Option::is_none)
            {
                "n/a (no GPM: before Hopper)".to_owned()
            } else {
                format!(
                    "SMs active {}  occupancy {}  tensor {}  DRAM {}",
                    or_na(with_unit(m.sm_active_avg_pct, 1, "%")),
                    or_na(with_unit(m.sm_occupancy_avg_pct, 1, "%")),
                    or_na(with_unit(m.tensor_active_avg_pct, 1, "%")),
                    or_na(with_unit(m.dram_bw_avg_pct, 1, "%"))
                )
            },
        ),
        (
            "Its GPM share",
            match (r.tensor_active_pct, r.sm_occupancy_pct) {
                (None, None) => "n/a".to_owned(),
                (t, o) => format!(
                    "tensor {}  occupancy {} (estimate on shared GPUs)",
                    or_na(with_unit(t, 1, "%")),
                    or_na(with_unit(o, 1, "%"))
                ),
            },
        ),
        (
            "Power (per GPU)",
            format!(
                "avg {}  max {}  limit {}",
                or_na(with_unit(m.power_avg_w, 1, "W")),
                or_na(with_unit(m.power_max_w, 1, "W")),
                or_na(with_unit(m.power_limit_w, 0, "W"))
            ),
        ),
        (
            "Temperature",
            format!(
                "avg {}  max {}",
                or_na(with_unit(m.temp_gpu_avg_c, 1, "°C")),
                or_na(with_unit(m.temp_gpu_max_c, 0, "°C"))
            ),
        ),
        (
            "Memory used",
            format!(
                "avg {}  max {}  total {}",
                or_na(gib(m.mem_used_avg_bytes)),
                or_na(gib(m.mem_used_max_bytes)),
                or_na(gib(m.mem_total_bytes))
            ),
        ),
        ("GPU samples", m.samples.to_string()),
    ]);
    let width = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (label, value) in rows {
        let _ = writeln!(out, "{label:<width$}  {value}");
    }
    for g in &r.gpus {
        let _ = writeln!(out, "  GPU {}/{}  {}  {}", g.node, g.index, g.name, g.uuid);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GpuRef, Subject};

    fn bare() -> Report {
        Report::new(
            Subject {
                kind: "container".into(),
                key: "container:abc".into(),
                name: None,
                nodes: vec!["n1".into()],
                exit_code: None,
            },
            0,
            60_000,
        )
    }

    #[test]
    fn format_names() {
        assert_eq!(Format::parse("yml"), Ok(Format::Yaml));
        assert!(Format::parse("xml").is_err());
        assert_eq!(
            Format::from_path(std::path::Path::new("r.yaml")),
            Some(Format::Yaml)
        );
    }

    #[test]
    fn provisional_energy_is_marked_in_every_format() {
        let mut r = bare();
        r.energy = crate::EnergySummary::from_mj(Some(5_000_000), Some(0));
        r.energy.provisional_j = Some(1_500.0);
        let t = table(&r);
        assert!(
            t.lines().any(|l| l.starts_with("  provisional ")
                && l.ends_with(" 1.500 kJ of it in minutes still open (final when they close)")),
            "{t}"
        );
        let s = csv(std::slice::from_ref(&r)).expect("csv");
        let mut rd = csv::Reader::from_reader(s.as_bytes());
        let header = rd.headers().expect("header").clone();
        let row = rd.records().next().expect("a row").expect("row");
        let i = header
            .iter()
            .position(|h| h == "provisional_j")
            .expect("a provisional_j column");
        assert_eq!(row.get(i), Some("1500.000"));
        let json: serde_json::Value =
            serde_json::from_str(&render(&r, Format::Json).expect("json")).expect("parse");
        assert_eq!(json["energy"]["provisional_j"], 1500.0);
        let yaml = render(&r, Format::Yaml).expect("yaml");
        assert!(yaml.contains("provisional_j: 1500.0"), "{yaml}");
        // Nothing open: no line; not applicable (exec): not in JSON either.
        r.energy.provisional_j = Some(0.0);
        assert!(!table(&r).contains("provisional"));
        r.energy.provisional_j = None;
        assert!(
            !render(&r, Format::Json)
                .expect("json")
                .contains("provisional")
        );
    }

    #[test]
    fn csv_has_one_header_and_empty_cells_for_absent() {
        let mut r = bare();
        r.gpus.push(GpuRef {
            node: "n1".into(),
            index: 0,
            uuid: "GPU-1".into(),
            name: "NVIDIA L40S".into(),
        });
        let s = csv(&[r]).expect("csv");
        let mut rd = csv::Reader::from_reader(s.as_bytes());
        let header = rd.headers().expect("header").clone();
        let row = rd.records().next().expect("a row").expect("row");
        let cell = |name: &str| {
            let i = header.iter().position(|h| h == name).expect(name);
            row.get(i).expect("cell").to_owned()
        };
        assert_eq!(cell("energy_kwh"), "");
        assert_eq!(cell("carbon_g"), "");
        assert_eq!(cell("gpu_names"), "1 × NVIDIA L40S");
        assert_eq!(cell("samples"), "0");
    }
}
