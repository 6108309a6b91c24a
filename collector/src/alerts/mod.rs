//! Alerts: rules over live signals, evaluated once across collectors, kept in the store
//! with their history, and sent to webhooks (Alertmanager or gpufleet's JSON).
//!
//! - `rules.rs`: the config file's `[alerts]` table, checked; the default rules.
//! - `signals.rs`: what rules are written over (a table: a name, a kind, labels, a
//!   function of the live state).
//! - `eval.rs` (pure): pending → firing → resolved per rule and series, as Prometheus.
//! - `notify.rs`: the webhooks' bodies, queues, retries.
//!
//! [`run_term`] is the background job [`JOB`], run under its lease
//! ([`crate::accounting::leader`]): it starts from the alerts stored by the previous
//! leader, evaluates every `evaluation_interval` over this collector's live state (which
//! follows every node when collectors share a PostgreSQL database), saves what changed
//! and the transitions ([`crate::store::AlertStore`]), and hands due alerts to the
//! notifier.

pub mod eval;
pub mod notify;
pub mod rules;
pub mod signals;

use crate::live::state::Live;
use crate::live::status::{Clock, StatusPolicy};
use crate::outbound::BackoffOptions;
use crate::store::AlertStore;
use eval::{Alert, Evaluator};
use notify::{Context, Notifier, NotifyStats, Post};
use rules::AlertSettings;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use rules::AlertsFile;

/// The background job's lease name.
pub const JOB: &str = "alerts";

/// How long state changes are kept in the history.
pub const HISTORY_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// How the alerts job runs.
#[derive(Debug, Clone)]
pub struct AlertOptions {
    pub settings: Arc<AlertSettings>,
    /// The webhooks' clients, one per `settings.webhooks`; `None`: HTTP clients built
    /// from the settings (tests put fakes here).
    pub posts: Option<Vec<Arc<dyn Post>>>,
    /// Between a notification's attempts.
    pub backoff: BackoffOptions,
}

impl Default for AlertOptions {
    fn default() -> Self {
        AlertOptions {
            settings: Arc::new(AlertSettings::default()),
            posts: None,
            backoff: BackoffOptions {
                min: Duration::from_millis(500),
                max: Duration::from_secs(30),
            },
        }
    }
}

impl AlertOptions {
    /// The webhooks' clients.
    pub fn posts(&self) -> Result<Vec<Arc<dyn Post>>, String> {
        match &self.posts {
            Some(p) => Ok(p.clone()),
            None => (self.settings.webhooks.iter())
                .map(|w| notify::HttpPost::new(w).map(|p| Arc::new(p) as Arc<dyn Post>))
                .collect(),
        }
    }
}

/// What one term needs besides the store and the live state.
#[derive(Debug, Clone)]
pub struct Term {
    pub options: AlertOptions,
    pub posts: Vec<Arc<dyn Post>>,
    pub status: StatusPolicy,
    /// The collector's address as users reach it (`generatorURL`'s base).
    pub external_url: String,
    pub stats: Arc<NotifyStats>,
    /// The published workload counters (the ongoing idle-but-allocated episodes).
    pub workloads: Arc<crate::accounting::counters::WorkloadCounters>,
}

type Key = (String, String);

/// State changes kept for the history while the database cannot take them.
const MAX_UNSAVED_TRANSITIONS: usize = 10_000;

fn snapshot(e: &Evaluator) -> BTreeMap<Key, Alert> {
    e.alerts()
        .map(|a| ((a.rule.clone(), a.fingerprint.clone()), a.clone()))
        .collect()
}

/// Firing and pending alerts per severity (an alert's `severity` label).
fn count_active<'a>(alerts: impl Iterator<Item = &'a Alert>) -> notify::ActiveAlerts {
    let mut out = notify::ActiveAlerts::default();
    for a in alerts {
        let counts = match a.state {
            eval::AlertState::Firing => &mut out.firing,
            eval::AlertState::Pending => &mut out.pending,
            _ => continue,
        };
        let severity = a.labels.get("severity").map(String::as_str);
        if let Some(i) = (rules::Severity::ALL.iter()).position(|s| Some(s.as_str()) == severity) {
            counts[i] += 1;
        }
    }
    out
}

/// One term of leadership: evaluates, saves and notifies until `term` ends.
pub async fn run_term(
    store: Arc<dyn AlertStore>,
    live: Arc<Live>,
    t: Term,
    clock: Clock,
    term: CancellationToken,
) {
    let settings = Arc::clone(&t.options.settings);
    let stored = loop {
        match store.alerts().await {
            Ok(a) => break a,
            Err(e) => warn!(error = %e, "cannot read the stored alerts; retrying"),
        }
        tokio::select! {
            () = term.cancelled() => return,
            () = tokio::time::sleep(settings.evaluation_interval) => {}
        }
    };
    info!(
        rules = settings.rules.len(),
        webhooks = settings.webhooks.len(),
        continued = stored.len(),
        "evaluating alert rules"
    );
    let mut evaluator = Evaluator::from_alerts(stored);
    let mut saved = snapshot(&evaluator);
    let ctx = Context {
        external_url: t.external_url.trim_end_matches('/').to_owned(),
        valid_for: settings
            .resend_delay
            .max(settings.evaluation_interval)
            .saturating_mul(4),
    };
    let (notifier, senders) = Notifier::spawn(
        &settings.webhooks,
        t.posts.clone(),
        ctx,
        t.options.backoff,
        Arc::clone(&t.stats),
        &term,
    );
    let signals: BTreeSet<&'static str> = settings
        .rules
        .iter()
        .map(|r| r.condition.signal())
        .collect();
    let mut ticker = tokio::time::interval(settings.evaluation_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending_transitions = Vec::new();
    let mut last_prune: Option<i64> = None;
    loop {
        tokio::select! {
            () = term.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let now = clock();
        let published = t.workloads.current();
        // Series are read under the live state's lock, evaluated after it.
        let mut series: BTreeMap<&str, Vec<signals::Series>> = live.read(|state| {
            let snap = signals::Snapshot {
                state,
                now_ms: now,
                status: t.status,
                idle_allocated: &published.idle_allocated,
            };
            (signals.iter())
                .filter_map(|name| signals::find(name).map(|s| (*name, (s.eval)(&snap))))
                .collect()
        });
        pending_transitions.extend(evaluator.evaluate(
            &settings.rules,
            &mut |name| series.remove(name).unwrap_or_default(),
            now,
        ));
        let due = evaluator.due(now, settings.resend_delay);
        let current = snapshot(&evaluator);
        t.stats.set_active(Some(count_active(current.values())));
        let changed: Vec<Alert> = (current.iter())
            .filter(|(k, a)| saved.get(*k) != Some(*a))
            .map(|(_, a)| a.clone())
            .collect();
        let removed: Vec<Key> = (saved.keys())
            .filter(|k| !current.contains_key(*k))
            .cloned()
            .collect();
        match store
            .save_alerts(&changed, &removed, &pending_transitions)
            .await
        {
            Ok(()) => {
                saved = current;
                pending_transitions.clear();
            }
            // Kept for the next round: it saves the difference to what is stored.
            Err(e) => {
                warn!(error = %e, "cannot save alerts; retrying at the next evaluation");
                // Bounded while the database is away: the oldest changes go first.
                let over = pending_transitions
                    .len()
                    .saturating_sub(MAX_UNSAVED_TRANSITIONS);
                pending_transitions.drain(..over);
            }
        }
        notifier.notify(&due, now);
        if last_prune.is_none_or(|p| now - p >= 3_600_000) {
            last_prune = Some(now);
            let before = now
                .saturating_sub(i64::try_from(HISTORY_RETENTION.as_millis()).unwrap_or(i64::MAX));
            if let Err(e) = store.prune_alert_history(before).await {
                warn!(error = %e, "cannot prune the alert history");
            }
        }
    }
    t.stats.set_active(None);
    drop(notifier);
    for s in senders {
        if let Err(e) = s.await {
            warn!(error = %e, "an alert webhook sender ended abnormally");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eval::AlertState;

    fn alert(state: AlertState, severity: Option<&str>) -> Alert {
        Alert {
            rule: "R".into(),
            fingerprint: String::new(),
            state,
            labels: severity
                .map(|s| BTreeMap::from([("severity".to_owned(), s.to_owned())]))
                .unwrap_or_default(),
            annotations: BTreeMap::new(),
            value: 1.0,
            active_at_ms: 0,
            fired_at_ms: None,
            resolved_at_ms: None,
            keep_firing_since_ms: None,
            last_sent_ms: None,
        }
    }

    #[test]
    fn active_alerts_are_counted_per_state_and_severity() {
        let alerts = [
            alert(AlertState::Firing, Some("critical")),
            alert(AlertState::Firing, Some("critical")),
            alert(AlertState::Firing, Some("warning")),
            alert(AlertState::Pending, Some("info")),
            alert(AlertState::Resolved, Some("critical")),
            alert(AlertState::Firing, None),
        ];
        let n = count_active(alerts.iter());
        assert_eq!(
            n.firing,
            [0, 1, 2],
            "resolved and severity-less ones are not counted"
        );
        assert_eq!(n.pending, [1, 0, 0]);
    }
}
