//! The report's time-series plot as a PNG: five panels stacked over the report's range —
//! GPU utilization, power (with the limit), memory used (with the total), temperature,
//! carbon intensity — one line per GPU. Drawn by plotters into an RGB buffer (text in
//! DejaVu Sans, embedded: no system fonts needed) and encoded by `png`.

use crate::model::{Report, SeriesPoint};
use gpufleet_core::UnixMs;
use gpufleet_core::config::format_time;
use plotters::prelude::*;
use std::sync::Once;

/// Why the plot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the plot must be between 200×300 and 4000×4000 pixels, not {0}×{1}")]
    Size(u32, u32),
    #[error("cannot draw the plot: {0}")]
    Draw(String),
    #[error("cannot encode the plot as PNG: {0}")]
    Png(#[from] png::EncodingError),
    #[error("cannot write the plot to {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The default size.
pub const WIDTH: u32 = 1200;
pub const HEIGHT: u32 = 1400;
/// The largest size: its RGB buffer is 48 MB, and the encoded PNG at most about as much,
/// whatever the report holds (its series have a bounded number of points).
pub const MAX_WIDTH: u32 = 4000;
pub const MAX_HEIGHT: u32 = 4000;
/// The smallest size the five panels fit in.
pub const MIN_WIDTH: u32 = 200;
pub const MIN_HEIGHT: u32 = 300;

/// Checks a size before any work: [`PlotError::Size`] outside
/// [`MIN_WIDTH`]×[`MIN_HEIGHT`] ..= [`MAX_WIDTH`]×[`MAX_HEIGHT`].
pub fn check_size(width: u32, height: u32) -> Result<(), PlotError> {
    if (MIN_WIDTH..=MAX_WIDTH).contains(&width) && (MIN_HEIGHT..=MAX_HEIGHT).contains(&height) {
        Ok(())
    } else {
        Err(PlotError::Size(width, height))
    }
}

const FONT: &str = "sans-serif";

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The embedded font is a valid TTF; if it were not, text would fail to draw and
        // the error would say so.
        let _ = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular());
    });
}

fn draw_err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

struct Panel<'a> {
    title: &'a str,
    unit: &'a str,
    /// (label, points) per line.
    lines: Vec<(String, Vec<(f64, f64)>)>,
    /// A dashed reference (limit, total), if known.
    reference: Option<f64>,
    /// Lines are steps (intensity slots) rather than straight segments.
    steps: bool,
}

fn gpu_lines(
    r: &Report,
    f: impl Fn(&SeriesPoint) -> Option<f64>,
    x: &dyn Fn(UnixMs) -> f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    r.series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .filter_map(|p| f(p).map(|v| (x(p.time_ms), v)))
                .collect();
            (s.gpu.clone(), pts)
        })
        .collect()
}

/// Renders the plot of `report` as PNG bytes, `width` × `height` pixels.
pub fn png(report: &Report, width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    check_size(width, height)?;
    register_font();
    let (t0, t1) = (report.from_ms, report.to_ms.max(report.from_ms + 1000));
    let span_s = (t1 - t0) as f64 / 1000.0;
    // x in minutes for ranges over 20 minutes, else seconds.
    let scale = if span_s > 1200.0 { 60_000.0 } else { 1000.0 };
    let x = move |t: UnixMs| (t - t0) as f64 / scale;
    let gib = (1u64 << 30) as f64;
    let m = &report.metrics;
    let mut intensity: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for p in &report.intensity {
        let label = format!("region {}", p.region);
        let pt = (x(p.time_ms.max(t0)), p.g_per_kwh);
        match intensity
            .iter_mut()
            .find(|(l, _)| *l == format!("region {}", p.region))
        {
            Some((_, pts)) => pts.push(pt),
            None => intensity.push((label, vec![pt])),
        }
    }
    // A step line runs to the end of the range.
    for (_, pts) in &mut intensity {
        if let Some(&(_, v)) = pts.last() {
            pts.push((x(t1), v));
        }
    }
    let panels = [
        Panel {
            title: "GPU utilization",
            unit: "%",
            lines: gpu_lines(report, |p| p.util_gpu_pct, &x),
            reference: Some(100.0),
            steps: false,
        },
        Panel {
            title: "Power",
            unit: "W",
            lines: gpu_lines(report, |p| p.power_w, &x),
            reference: m.power_limit_w,
            steps: false,
        },
        Panel {
            title: "Memory used",
            unit: "GiB",
            lines: gpu_lines(report, |p| p.mem_used_bytes.map(|b| b / gib), &x),
            reference: m.mem_total_bytes.map(|b| b / gib),
            steps: false,
        },
        Panel {
            title: "Temperature",
            unit: "°C",
            lines: gpu_lines(report, |p| p.temp_gpu_c, &x),
            reference: None,
            steps: false,
        },
        Panel {
            title: "Carbon intensity",
            unit: "gCO2/kWh",
            lines: intensity,
            reference: None,
            steps: true,
        },
    ];
    let mut buf = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (title_area, body) = root.split_vertically(40);
        let title = format!(
            "{} {}  ·  {} .. {}",
            report.subject.kind, report.subject.key, report.from, report.to
        );
        title_area
            .draw(&Text::new(
                title,
                (10, 10),
                (FONT, 18).into_font().color(&BLACK),
            ))
            .map_err(draw_err)?;
        let areas = body.split_evenly((panels.len(), 1));
        for (area, panel) in areas.iter().zip(&panels) {
            draw_panel(area, panel, x(t1), t0, scale)?;
        }
        root.present().map_err(draw_err)?;
    }
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header()?;
        w.write_image_data(&buf)?;
        w.finish()?;
    }
    Ok(out)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel<'_>,
    x_max: f64,
    t0: UnixMs,
    scale: f64,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let values = panel
        .lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, v)| v));
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.chain(panel.reference) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let empty = panel.lines.iter().all(|(_, p)| p.is_empty());
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    // Utilization, power, memory and intensity start at 0; temperature hugs its data.
    let lo = if panel.unit == "°C" {
        (lo - 5.0).floor()
    } else {
        0.0_f64.min(lo)
    };
    let hi = if hi <= lo {
        lo + 1.0
    } else {
        hi + (hi - lo) * 0.08
    };
    let caption = format!("{} ({})", panel.title, panel.unit);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 16))
        .margin(8)
        .margin_right(36)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max.max(1e-9), lo..hi)
        .map_err(draw_err)?;
    let label_x = move |v: &f64| {
        let t = t0 + (v * scale) as i64;
        let s = format_time(t);
        s.get(11..19).map_or(s.clone(), str::to_owned)
    };
    chart
        .configure_mesh()
        .x_labels(8)
        .y_labels(5)
        .x_label_formatter(&label_x)
        .x_desc("time (UTC)")
        .label_style((FONT, 12))
        .draw()
        .map_err(draw_err)?;
    if let Some(r) = panel.reference {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, r), (x_max, r)],
                6,
                4,
                RGBColor(150, 150, 150).stroke_width(1),
            ))
            .map_err(draw_err)?;
    }
    if empty {
        area.draw(&Text::new(
            "no data",
            (
                area.dim_in_pixel().0 as i32 / 2 - 30,
                area.dim_in_pixel().1 as i32 / 2,
            ),
            (FONT, 16).into_font().color(&RGBColor(120, 120, 120)),
        ))
        .map_err(draw_err)?;
        return Ok(());
    }
    for (i, (label, pts)) in panel.lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = if panel.steps {
            let mut s = Vec::with_capacity(pts.len() * 2);
            for (k, &(x, v)) in pts.iter().enumerate() {
                if k > 0 {
                    s.push((x, pts[k - 1].1));
                }
                s.push((x, v));
            }
            s
        } else {
            pts.clone()
        };
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(draw_err)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(RGBColor(200, 200, 200))
        .label_font((FONT, 12))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Writes the plot of `report` to `path`.
pub fn write_png(report: &Report, path: &std::path::Path) -> Result<(), PlotError> {
    let bytes = png(report, WIDTH, HEIGHT)?;
    std::fs::write(path, bytes).map_err(|source| PlotError::Io {
        path: path.display().to_string(),
        source,
    })
}
