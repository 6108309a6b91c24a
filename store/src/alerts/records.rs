//! The alert records the store keeps: alerts in their state, and the history of their
//! changes. Evaluating rules is the collector's (`alerts::eval`); the store only holds them.

use gpufleet_core::UnixMs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An alert's state.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// The condition does not hold (only in history: the end of a pending alert).
    Inactive,
    Pending,
    Firing,
    Resolved,
}

impl AlertState {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::Inactive => "inactive",
            AlertState::Pending => "pending",
            AlertState::Firing => "firing",
            AlertState::Resolved => "resolved",
        }
    }

    pub fn parse(s: &str) -> Option<AlertState> {
        [
            AlertState::Inactive,
            AlertState::Pending,
            AlertState::Firing,
            AlertState::Resolved,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

/// One alert: a rule's series in a state.
#[derive(Debug, Clone, PartialEq)]
pub struct Alert {
    pub rule: String,
    /// Of its labels (`alerts::eval::fingerprint` in the collector).
    pub fingerprint: String,
    pub state: AlertState,
    /// The signal's labels, `alertname`, `severity` and the rule's labels.
    pub labels: BTreeMap<String, String>,
    /// The rule's annotations, filled in with the labels and the latest value.
    pub annotations: BTreeMap<String, String>,
    /// The signal's latest value while the condition held.
    pub value: f64,
    /// When the condition started holding (the alert became pending).
    pub active_at_ms: UnixMs,
    pub fired_at_ms: Option<UnixMs>,
    pub resolved_at_ms: Option<UnixMs>,
    /// Since when a firing alert's condition no longer holds (`keep_firing_for`).
    pub keep_firing_since_ms: Option<UnixMs>,
    /// When it was last handed to the notifier.
    pub last_sent_ms: Option<UnixMs>,
}

/// A change of state, as kept in the history.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub at_ms: UnixMs,
    pub rule: String,
    pub fingerprint: String,
    pub labels: BTreeMap<String, String>,
    pub from: AlertState,
    pub to: AlertState,
    pub value: f64,
}
