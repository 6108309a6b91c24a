//! gpufleet's reports: what a container, pod, Slurm job, node — or one command run under
//! `gpufleet-agent exec` — spent in energy and carbon over a range, and how its GPUs ran.
//! Shared by the collector (`gpufleet-collector report`, `/api/v1/report`) and the agent
//! (`gpufleet-agent exec`), so both print the same thing.
//!
//! - [`model`]: the [`Report`] and [`MetricsBuilder`] (GPU samples → averages, maxima,
//!   per-GPU series).
//! - [`render`](mod@render): `table`, `json`, `yaml`, `csv`.
//! - [`plot`]: the PNG time-series plot.
//! - [`waste`]: the idle-but-allocated episodes of a range (`gpufleet-collector report waste`).

pub mod model;
pub mod plot;
pub mod render;
pub mod waste;

pub use model::{
    CarbonSummary, EnergySummary, GpuRef, GpuSeries, IntensityPoint, MetricSummary, MetricsBuilder,
    Report, SeriesPoint, Subject,
};
pub use render::{Format, RenderError, render};
