//! The renderers and the plot, on a report with every figure present and on one where
//! nothing was measured.

use gpufleet_core::GpuSample;
use gpufleet_report::plot;
use gpufleet_report::{
    CarbonSummary, EnergySummary, Format, GpuRef, IntensityPoint, MetricsBuilder, Report, Subject,
    render,
};

const T0: i64 = 1_782_000_000_000;

fn subject() -> Subject {
    Subject {
        kind: "container".into(),
        key: "container:4f1c".into(),
        name: Some("trainer".into()),
        nodes: vec!["gpu-node-01".into()],
        exit_code: None,
    }
}

/// Two GPUs over ten minutes, every figure present.
fn full() -> Report {
    let mut r = Report::new(subject(), T0, T0 + 600_000);
    r.elapsed_s = Some(600.0);
    let mut b = MetricsBuilder::new(None);
    for g in 0..2u32 {
        r.gpus.push(GpuRef {
            node: "gpu-node-01".into(),
            index: g,
            uuid: format!("GPU-{g}"),
            name: "NVIDIA H100 80GB HBM3".into(),
        });
        for k in 0..=60i64 {
            b.add(
                &format!("gpu-node-01/{g}"),
                T0 + k * 10_000,
                &GpuSample {
                    util_gpu_pct: Some(50 + (k as u32 % 40) + g * 5),
                    power_mw: Some(300_000 + (k as u32 % 7) * 20_000 + g * 10_000),
                    power_limit_mw: Some(700_000),
                    mem_used_bytes: Some((40 + k as u64 % 10) << 30),
                    mem_total_bytes: Some(80 << 30),
                    temp_gpu_c: Some(55 + (k as u32 % 12)),
                    ..Default::default()
                },
            );
        }
    }
    r.metrics = b.summary();
    r.series = b.series();
    r.energy = EnergySummary::from_mj(Some(400_000_000), Some(4_000_000));
    r.carbon = CarbonSummary {
        carbon_g: Some(12.5),
        avg_intensity_g_per_kwh: Some(111.4),
        priced_share: Some(1.0),
        sources: vec!["uk".into()],
        regions: vec!["13".into()],
        forecast_share: Some(0.25),
        estimated_share: Some(0.0),
        pue: Some(1.2),
    };
    r.intensity = vec![
        IntensityPoint {
            time_ms: T0 - 60_000,
            g_per_kwh: 120.0,
            region: "13".into(),
            kind: "actual".into(),
        },
        IntensityPoint {
            time_ms: T0 + 300_000,
            g_per_kwh: 95.0,
            region: "13".into(),
            kind: "forecast".into(),
        },
    ];
    r
}

#[test]
fn absent_figures_are_na_null_and_empty_never_zero() {
    let r = Report::new(subject(), T0, T0 + 60_000);
    let table = render(&r, Format::Table).expect("table");
    for label in ["GPU energy", "Carbon", "Avg intensity", "PUE", "Elapsed"] {
        let line = table
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line in\n{table}"));
        assert!(line.ends_with("n/a"), "{line}");
    }
    assert!(table.contains("avg n/a  max n/a  limit n/a"), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&render(&r, Format::Json).expect("json")).expect("valid JSON");
    assert!(json["energy"]["energy_kwh"].is_null());
    assert!(json["carbon"]["carbon_g"].is_null());
    assert!(json["metrics"]["power_avg_w"].is_null());
    assert!(json["elapsed_s"].is_null());
    let yaml = render(&r, Format::Yaml).expect("yaml");
    assert!(yaml.contains("carbon_g: null"), "{yaml}");
    assert!(yaml.contains("energy_kwh: null"), "{yaml}");
    let csv = render(&r, Format::Csv).expect("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let row: Vec<&str> = lines.next().expect("row").split(',').collect();
    assert_eq!(header.len(), row.len());
    let i = header
        .iter()
        .position(|h| *h == "energy_kwh")
        .expect("column");
    assert_eq!(row[i], "");
}

#[test]
fn every_format_carries_the_figures() {
    let r = full();
    let table = render(&r, Format::Table).expect("table");
    assert!(
        table.contains(
            "GPU energy       0.112222 kWh = 404.000 kJ (energy counter 99.0 %, power integrated 1.0 %)"
        ),
        "{table}"
    );
    assert!(table.contains("Carbon           12.50 gCO2"), "{table}");
    assert!(table.contains("111.4 gCO2/kWh (uk, region 13)"), "{table}");
    assert!(
        table.contains("GPUs             2 × NVIDIA H100 80GB HBM3"),
        "{table}"
    );
    assert!(table.contains("limit 700 W"), "{table}");
    assert!(table.contains("total 80.00 GiB"), "{table}");
    // JSON and YAML round-trip to the same report.
    let json = render(&r, Format::Json).expect("json");
    let back: Report = serde_json::from_str(&json).expect("JSON parses back");
    assert!(back.energy.energy_j == r.energy.energy_j && back.carbon == r.carbon);
    assert_eq!(back.gpus, r.gpus);
    assert_eq!(back.series.len(), 2);
    let yaml = render(&r, Format::Yaml).expect("yaml");
    let back: Report = serde_norway::from_str(&yaml).expect("YAML parses back");
    assert!(back.energy.energy_j == r.energy.energy_j && back.carbon == r.carbon);
    let csv = render(&r, Format::Csv).expect("csv");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let row: Vec<&str> = lines.next().expect("row").split(',').collect();
    let cell = |n: &str| row[header.iter().position(|h| *h == n).expect(n)];
    assert_eq!(cell("energy_kwh"), "0.112222222");
    assert_eq!(cell("carbon_g"), "12.5000");
    assert_eq!(cell("pue"), "1.200");
    assert_eq!(cell("power_limit_w"), "700.00");
    assert_eq!(cell("samples"), "122");
}

/// The PNG decodes, has the asked size, and each of the five panels has drawn lines
/// (saturated pixels, not just the white background, gray grid and black text).
#[test]
fn the_plot_is_a_png_with_five_drawn_panels() {
    let (w, h) = (900u32, 1100u32);
    let bytes = plot::png(&full(), w, h).expect("plot");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("PNG header");
    let mut buf = vec![0u8; reader.output_buffer_size().expect("size")];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    assert_eq!((info.width, info.height), (w, h));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let colored = |buf: &[u8], y0: u32, y1: u32| {
        let mut n = 0;
        for y in y0..y1 {
            for x in 0..w {
                let i = ((y * w + x) * 3) as usize;
                let (r, g, b) = (buf[i] as i32, buf[i + 1] as i32, buf[i + 2] as i32);
                if r.max(g).max(b) - r.min(g).min(b) > 60 {
                    n += 1;
                }
            }
        }
        n
    };
    let panel = (h - 40) / 5;
    for p in 0..5 {
        let y0 = 40 + p * panel;
        let n = colored(&buf, y0, y0 + panel);
        assert!(n > 200, "panel {p} has only {n} colored pixels");
    }
    // An empty report still plots (panels say "no data"): no colored lines at all.
    let empty = Report::new(subject(), T0, T0 + 60_000);
    let bytes = plot::png(&empty, w, h).expect("empty plot");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .expect("PNG header");
    let mut buf2 = vec![0; reader.output_buffer_size().expect("size")];
    reader.next_frame(&mut buf2).expect("PNG data");
    assert_eq!(colored(&buf2, 40, h), 0);
    assert!(plot::png(&empty, 10, 10).is_err());
}

/// Writes the sample plot when `GPUFLEET_PLOT_SAMPLE` names a file (for looking at it).
#[test]
fn sample_plot_on_request() {
    if let Some(path) = std::env::var_os("GPUFLEET_PLOT_SAMPLE") {
        plot::write_png(&full(), std::path::Path::new(&path)).expect("write");
    }
}
