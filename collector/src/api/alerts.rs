//! The alerts API, read from the store (so every collector answers it, whichever one
//! evaluates the rules):
//!
//! | route | what |
//! |---|---|
//! | `GET /api/v1/alerts?state=firing,pending` | current alerts, firing first; `state`: any of `pending`, `firing`, `resolved` (default all) |
//! | `GET /api/v1/alerts/history?from=&to=&limit=` | state changes, newest first (default the last 24 hours, 500 at most) |
//! | `GET /api/v1/alerts/rules` | the rules this collector evaluates when it leads, with the signals they can use |

use crate::alerts::eval::{Alert, AlertState, Transition};
use crate::alerts::rules::AlertSettings;
use crate::alerts::signals;
use crate::api::error::{AccessResponses, ApiError, ErrorResponses, time_param};
use crate::api::state::{AppState, Route};
use crate::store::TimeRange;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::{Extension, Json};
use gpufleet_core::UnixMs;
use gpufleet_core::config::format_time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most history entries one request returns.
pub const MAX_HISTORY: usize = 5_000;
const DEFAULT_HISTORY: usize = 500;
const DAY_MS: i64 = 24 * 3_600_000;

/// The routes, in [`crate::api::router::routes`].
pub fn routes() -> Vec<Route> {
    vec![
        Route::get("/api/v1/alerts", "current alerts, firing first", alerts),
        Route::get(
            "/api/v1/alerts/history",
            "alert state changes, newest first",
            history,
        ),
        Route::get(
            "/api/v1/alerts/rules",
            "the rules this collector evaluates when it leads, with the signals they can use",
            rules,
        ),
    ]
}

/// The configured rules, given to the router as an extension.
#[derive(Debug, Clone)]
pub struct AlertRules(pub Arc<AlertSettings>);

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AlertParams {
    /// Comma-separated states: `pending`, `firing`, `resolved`; default all.
    #[param(example = "firing,pending")]
    state: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct AlertView {
    rule: String,
    fingerprint: String,
    state: AlertState,
    severity: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    /// The signal's latest value while the condition held.
    value: f64,
    /// When the condition started holding.
    active_at: String,
    active_at_ms: UnixMs,
    fired_at: Option<String>,
    fired_at_ms: Option<UnixMs>,
    resolved_at: Option<String>,
    resolved_at_ms: Option<UnixMs>,
    /// When it was last sent to the webhooks; `null` if never.
    last_sent_at_ms: Option<UnixMs>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct AlertsView {
    alerts: Vec<AlertView>,
}

fn view(a: Alert) -> AlertView {
    AlertView {
        severity: a.labels.get("severity").cloned(),
        rule: a.rule,
        fingerprint: a.fingerprint,
        state: a.state,
        labels: a.labels,
        annotations: a.annotations,
        value: a.value,
        active_at: format_time(a.active_at_ms),
        active_at_ms: a.active_at_ms,
        fired_at: a.fired_at_ms.map(format_time),
        fired_at_ms: a.fired_at_ms,
        resolved_at: a.resolved_at_ms.map(format_time),
        resolved_at_ms: a.resolved_at_ms,
        last_sent_at_ms: a.last_sent_ms,
    }
}

fn parse_states(text: Option<&str>) -> Result<Vec<AlertState>, ApiError> {
    let Some(text) = text.filter(|t| !t.trim().is_empty()) else {
        return Ok(vec![
            AlertState::Pending,
            AlertState::Firing,
            AlertState::Resolved,
        ]);
    };
    text.split(',')
        .map(|s| {
            AlertState::parse(s.trim())
                .filter(|s| *s != AlertState::Inactive)
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "state {s:?}: expected pending, firing or resolved (comma-separated)"
                    ))
                })
        })
        .collect()
}

/// The current alerts, firing first, then pending, then resolved; newest first within.
#[utoipa::path(get, path = "/api/v1/alerts", tag = "alerts", params(AlertParams),
    responses((status = 200, description = "current alerts", body = AlertsView), ErrorResponses, AccessResponses))]
async fn alerts(
    State(st): State<AppState>,
    params: Result<Query<AlertParams>, QueryRejection>,
) -> Result<Json<AlertsView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let states = parse_states(p.state.as_deref())?;
    let mut alerts: Vec<Alert> = (st.store.alerts().await?.into_iter())
        .filter(|a| states.contains(&a.state))
        .collect();
    let rank = |s: AlertState| match s {
        AlertState::Firing => 0,
        AlertState::Pending => 1,
        _ => 2,
    };
    alerts.sort_by(|a, b| {
        (
            rank(a.state),
            std::cmp::Reverse(a.active_at_ms),
            &a.rule,
            &a.fingerprint,
        )
            .cmp(&(
                rank(b.state),
                std::cmp::Reverse(b.active_at_ms),
                &b.rule,
                &b.fingerprint,
            ))
    });
    Ok(Json(AlertsView {
        alerts: alerts.into_iter().map(view).collect(),
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct HistoryParams {
    /// RFC 3339, Unix ms, `now` or `now-1h`; default 24 hours before `to`.
    #[param(example = "now-1h")]
    from: Option<String>,
    /// RFC 3339, Unix ms or `now`; default now.
    to: Option<String>,
    /// Most entries (1 to 5000); default 500.
    limit: Option<usize>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct TransitionView {
    at: String,
    at_ms: UnixMs,
    rule: String,
    fingerprint: String,
    labels: BTreeMap<String, String>,
    from: AlertState,
    to: AlertState,
    value: f64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct HistoryView {
    from: String,
    to: String,
    transitions: Vec<TransitionView>,
}

/// Alerts' state changes, newest first.
#[utoipa::path(get, path = "/api/v1/alerts/history", tag = "alerts", params(HistoryParams),
    responses((status = 200, description = "state changes", body = HistoryView), ErrorResponses, AccessResponses))]
async fn history(
    State(st): State<AppState>,
    params: Result<Query<HistoryParams>, QueryRejection>,
) -> Result<Json<HistoryView>, ApiError> {
    let Query(p) = params.map_err(|e| ApiError::BadRequest(format!("bad query string: {e}")))?;
    let now = (st.clock)();
    let to = time_param("to", p.to.as_deref(), now)?.unwrap_or(now);
    let from = time_param("from", p.from.as_deref(), now)?.unwrap_or(to.saturating_sub(DAY_MS));
    if from > to {
        return Err(ApiError::BadRequest("from is after to".into()));
    }
    let limit = p.limit.unwrap_or(DEFAULT_HISTORY);
    if !(1..=MAX_HISTORY).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_HISTORY}"
        )));
    }
    let rows = st
        .store
        .alert_history(
            TimeRange {
                from_ms: from,
                to_ms: to,
            },
            limit,
        )
        .await?;
    Ok(Json(HistoryView {
        from: format_time(from),
        to: format_time(to),
        transitions: rows
            .into_iter()
            .map(|t: Transition| TransitionView {
                at: format_time(t.at_ms),
                at_ms: t.at_ms,
                rule: t.rule,
                fingerprint: t.fingerprint,
                labels: t.labels,
                from: t.from,
                to: t.to,
                value: t.value,
            })
            .collect(),
    }))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RuleView {
    name: String,
    /// `SIGNAL OP NUMBER`, or a flag signal alone.
    condition: String,
    /// How long the condition holds before it fires, in seconds.
    for_seconds: f64,
    keep_firing_for_seconds: f64,
    severity: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SignalView {
    name: String,
    /// `number` or `flag`.
    kind: String,
    unit: String,
    help: String,
    labels: Vec<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct RulesView {
    evaluation_interval_seconds: f64,
    resend_delay_seconds: f64,
    /// Webhooks configured (their addresses are not shown).
    webhooks: usize,
    rules: Vec<RuleView>,
    signals: Vec<SignalView>,
}

/// The configured rules and the signals rules can use.
#[utoipa::path(get, path = "/api/v1/alerts/rules", tag = "alerts",
    responses((status = 200, description = "rules and signals", body = RulesView), AccessResponses))]
async fn rules(rules: Option<Extension<AlertRules>>) -> Json<RulesView> {
    let settings = rules.map_or_else(
        || Arc::new(AlertSettings::default()),
        |r| Arc::clone(&r.0.0),
    );
    Json(RulesView {
        evaluation_interval_seconds: settings.evaluation_interval.as_secs_f64(),
        resend_delay_seconds: settings.resend_delay.as_secs_f64(),
        webhooks: settings.webhooks.len(),
        rules: (settings.rules.iter())
            .map(|r| RuleView {
                name: r.name.clone(),
                condition: r.condition.text(),
                for_seconds: r.hold.as_secs_f64(),
                keep_firing_for_seconds: r.keep_firing_for.as_secs_f64(),
                severity: r.severity.as_str().to_owned(),
                labels: r.labels.clone(),
                annotations: r.annotations.clone(),
            })
            .collect(),
        signals: (signals::SIGNALS.iter())
            .map(|s| SignalView {
                name: s.name.to_owned(),
                kind: match s.kind {
                    signals::SignalKind::Number => "number",
                    signals::SignalKind::Flag => "flag",
                }
                .to_owned(),
                unit: s.unit.to_owned(),
                help: s.help.to_owned(),
                labels: s.labels.iter().map(|l| (*l).to_owned()).collect(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_and_bad_ones_are_named() {
        assert_eq!(
            parse_states(Some("firing, pending")).expect("ok"),
            [AlertState::Firing, AlertState::Pending]
        );
        assert_eq!(parse_states(None).expect("all").len(), 3);
        let err = parse_states(Some("firing,inactive")).expect_err("inactive is history only");
        assert!(err.to_string().contains("\"inactive\""), "{err}");
    }
}
