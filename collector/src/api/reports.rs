//! The report API: the same report as `gpufleet-collector report`.
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/report?container=KEY\|pod=\|job=\|node=&from=&to=&format=&series=` | the report: `json` (default), `yaml`, `csv`, `table`; `series=true` adds the time series |
//! | `GET /api/v1/report/plot.png?…&width=&height=` | its time-series plot (PNG), at most [`plot::MAX_WIDTH`] × [`plot::MAX_HEIGHT`] pixels |
//!
//! Both build at most `--max-renders` at once ([`crate::api::renders`]); the rest wait a
//! bounded time in a bounded queue, then get 503 with `Retry-After`.
//!
//! `from` / `to` as for `/api/v1/containers` (default: today, UTC). Absent figures are
//! `null` (JSON / YAML), empty cells (CSV), `n/a` (table).

use crate::accounting::report::{ReportError, ReportSubject, build};
use crate::api::energy::{RangeParams, range};
use crate::api::error::{AccessResponses, ApiError, ErrorResponses};
use crate::api::state::{AppState, Route};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use gpufleet_report::{Format, Report, plot, render};
use serde::Deserialize;

/// The routes, in [`crate::api::router::routes`].
pub fn routes() -> Vec<Route> {
    vec![
        Route::get(
            "/api/v1/report",
            "the report per container, pod, job or node (`json`, `yaml`, `csv`, `table`)",
            report,
        ),
        Route::get(
            "/api/v1/report/plot.png",
            "the report's time-series plot (PNG)",
            report_plot,
        ),
    ]
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ReportParams {
    /// A container (`container:<id>` or the bare id); exactly one of container, pod, job,
    /// node.
    pub(crate) container: Option<String>,
    /// A pod UID.
    pub(crate) pod: Option<String>,
    /// A Slurm job as sacct writes it: `123` (with its array tasks and heterogeneous
    /// components), `123_4` (an array task) or `123+1` (a heterogeneous job component).
    #[param(example = "123_4")]
    pub(crate) job: Option<String>,
    /// A node name.
    #[param(example = "gpu-node-01")]
    pub(crate) node: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default today (UTC midnight).
    #[param(example = "now-10m")]
    pub(crate) from: Option<String>,
    /// RFC 3339, Unix ms, `now` or `now-15m`; default now.
    #[param(example = "now")]
    pub(crate) to: Option<String>,
    /// `json` (default), `yaml`, `csv` or `table`.
    #[param(example = "csv")]
    pub(crate) format: Option<String>,
    /// The plot's width in pixels (200–4000, default 1200).
    pub(crate) width: Option<u32>,
    /// The plot's height in pixels (300–4000, default 1400).
    pub(crate) height: Option<u32>,
    /// `true`: include the per-GPU series and the intensities.
    pub(crate) series: Option<bool>,
}

async fn load(st: &AppState, p: &ReportParams) -> Result<Report, ApiError> {
    let given = [
        p.container.clone().map(ReportSubject::Container),
        p.pod.clone().map(ReportSubject::Pod),
        p.job.clone().map(ReportSubject::Job),
        p.node.clone().map(ReportSubject::Node),
    ];
    let mut subjects = given.into_iter().flatten();
    let (Some(subject), None) = (subjects.next(), subjects.next()) else {
        return Err(ApiError::BadRequest(
            "give exactly one of container=, pod=, job= or node=".into(),
        ));
    };
    let r = range(
        st,
        &RangeParams {
            from: p.from.clone(),
            to: p.to.clone(),
            ..Default::default()
        },
    )?;
    build(st.store.as_ref(), &subject.normalized(), r)
        .await
        .map_err(|e| match e {
            ReportError::NotFound(m) => ApiError::NotFound(m),
            ReportError::Invalid(m) => ApiError::BadRequest(m),
            ReportError::Store(e) => ApiError::Store(e),
        })
}

/// The report of one container, pod, job or node over a range. Its JSON fields are
/// described in the README ("Reports").
#[utoipa::path(get, path = "/api/v1/report", tag = "reports", params(ReportParams),
    responses((status = 200, description = "the report in the format asked for", content(
        (Object = "application/json"),
        (String = "application/yaml"),
        (String = "text/csv; charset=utf-8"),
        (String = "text/plain; charset=utf-8"),
    )), ErrorResponses, AccessResponses, AccessResponses))]
async fn report(
    State(st): State<AppState>,
    params: Result<Query<ReportParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let format =
        Format::parse(p.format.as_deref().unwrap_or("json")).map_err(ApiError::BadRequest)?;
    let slot = st.renders.slot().await?;
    let mut report = load(&st, &p).await?;
    if p.series != Some(true) {
        report = report.without_series();
    }
    let body = render(&report, format).map_err(|e| ApiError::Internal(e.to_string()))?;
    drop(slot);
    Ok(([(header::CONTENT_TYPE, format.content_type())], body).into_response())
}

/// The report's time-series plot.
#[utoipa::path(get, path = "/api/v1/report/plot.png", tag = "reports", params(ReportParams),
    responses((status = 200, description = "the plot", content_type = "image/png", body = Vec<u8>),
        ErrorResponses, AccessResponses))]
async fn report_plot(
    State(st): State<AppState>,
    params: Result<Query<ReportParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let (w, h) = (
        p.width.unwrap_or(plot::WIDTH),
        p.height.unwrap_or(plot::HEIGHT),
    );
    // The size first: a refused size costs no store read and no slot.
    plot::check_size(w, h).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let slot = st.renders.slot().await?;
    let report = load(&st, &p).await?;
    // Drawing takes tens of milliseconds: off the async workers. The slot is held until
    // the image is encoded (and its buffer freed).
    let png = tokio::task::spawn_blocking(move || {
        let png = plot::png(&report, w, h);
        drop(slot);
        png
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the plot task failed: {e}")))?
    .map_err(|e| match e {
        plot::PlotError::Size(..) => ApiError::BadRequest(e.to_string()),
        other => ApiError::Internal(other.to_string()),
    })?;
    Ok(([(header::CONTENT_TYPE, "image/png")], png).into_response())
}
