//! Rule evaluation, as Prometheus does it (pure: no clock, no I/O).
//!
//! Per rule and series (its full label set, identified by [`fingerprint`]), an alert is
//! inactive (absent), `pending` (the condition holds, for less than the rule's `for`),
//! `firing`, or `resolved` (it fired, then the condition stopped holding, or its series
//! vanished). A pending alert whose condition stops holding becomes inactive again without
//! ever being notified. A resolved alert stays known for [`RESOLVED_RETENTION`] (so its
//! notification can be sent), and a condition that holds again in that time starts a new
//! alert at `pending` (Prometheus' behaviour: a flapping series does not fire before its
//! `for` again). `keep_firing_for` keeps a firing alert firing that long after its
//! condition stopped holding, which is Prometheus' answer to flapping.
//!
//! Notifications ([`Evaluator::due`]): a firing alert is sent when it starts firing and
//! again every `resend_delay` (Alertmanager expires an alert that is not re-sent before its
//! `endsAt`); a resolved one is sent once.

use super::rules::{Rule, expand};
use super::signals::Series;
use gpufleet_core::UnixMs;
use std::collections::BTreeMap;
use std::time::Duration;

pub use gpufleet_store::alerts::records::{Alert, AlertState, Transition};

/// How long a resolved alert is kept (and visible as such) before it is forgotten.
pub const RESOLVED_RETENTION: Duration = Duration::from_secs(15 * 60);

/// A stable id of a label set: FNV-1a 64 over `name=value` pairs in order, in hex.
pub fn fingerprint(labels: &BTreeMap<String, String>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in labels {
        for b in k.bytes().chain([0xff]).chain(v.bytes()).chain([0xfe]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The alerts of every rule, by (rule, fingerprint).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluator {
    alerts: BTreeMap<(String, String), Alert>,
}

impl Evaluator {
    /// Continues from alerts as stored (a new leader loads them).
    pub fn from_alerts(alerts: impl IntoIterator<Item = Alert>) -> Evaluator {
        Evaluator {
            alerts: alerts
                .into_iter()
                .map(|a| ((a.rule.clone(), a.fingerprint.clone()), a))
                .collect(),
        }
    }

    pub fn alerts(&self) -> impl Iterator<Item = &Alert> {
        self.alerts.values()
    }

    /// Evaluates every rule at `now_ms` over its signal's series (`series(signal)`);
    /// returns the transitions, in rule order. Alerts of rules no longer configured
    /// resolve (or end, when pending).
    pub fn evaluate(
        &mut self,
        rules: &[Rule],
        series: &mut dyn FnMut(&str) -> Vec<Series>,
        now_ms: UnixMs,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        for rule in rules {
            let holding: Vec<Series> = series(rule.condition.signal())
                .into_iter()
                .filter(|s| rule.condition.holds(s.value))
                .collect();
            self.evaluate_rule(rule, holding, now_ms, &mut out);
        }
        let gone: Vec<(String, String)> = (self.alerts.keys())
            .filter(|(r, _)| !rules.iter().any(|x| &x.name == r))
            .cloned()
            .collect();
        for key in gone {
            self.let_go(&key, Duration::ZERO, now_ms, &mut out);
        }
        out
    }

    fn evaluate_rule(
        &mut self,
        rule: &Rule,
        holding: Vec<Series>,
        now_ms: UnixMs,
        out: &mut Vec<Transition>,
    ) {
        let mut seen = std::collections::BTreeSet::new();
        for s in holding {
            let mut labels = s.labels;
            labels.extend(rule.labels.clone());
            labels.insert("alertname".into(), rule.name.clone());
            labels.insert("severity".into(), rule.severity.as_str().into());
            let fp = fingerprint(&labels);
            let key = (rule.name.clone(), fp.clone());
            if !seen.insert(key.clone()) {
                continue;
            }
            let annotations = (rule.annotations.iter())
                .map(|(k, t)| (k.clone(), expand(t, &labels, s.value)))
                .collect();
            match self.alerts.get_mut(&key) {
                Some(a) if a.state != AlertState::Resolved => {
                    a.value = s.value;
                    a.annotations = annotations;
                    a.keep_firing_since_ms = None;
                }
                _ => {
                    out.push(Transition {
                        at_ms: now_ms,
                        rule: rule.name.clone(),
                        fingerprint: fp.clone(),
                        labels: labels.clone(),
                        from: AlertState::Inactive,
                        to: AlertState::Pending,
                        value: s.value,
                    });
                    self.alerts.insert(
                        key.clone(),
                        Alert {
                            rule: rule.name.clone(),
                            fingerprint: fp,
                            state: AlertState::Pending,
                            labels,
                            annotations,
                            value: s.value,
                            active_at_ms: now_ms,
                            fired_at_ms: None,
                            resolved_at_ms: None,
                            keep_firing_since_ms: None,
                            last_sent_ms: None,
                        },
                    );
                }
            }
            if let Some(a) = self.alerts.get_mut(&key)
                && a.state == AlertState::Pending
                && now_ms.saturating_sub(a.active_at_ms) >= ms(rule.hold)
            {
                a.state = AlertState::Firing;
                a.fired_at_ms = Some(now_ms);
                out.push(transition(a, AlertState::Pending, now_ms));
            }
        }
        let stopped: Vec<(String, String)> = (self.alerts.keys())
            .filter(|k| k.0 == rule.name && !seen.contains(*k))
            .cloned()
            .collect();
        for key in stopped {
            self.let_go(&key, rule.keep_firing_for, now_ms, out);
        }
    }

    /// The condition of alert `key` no longer holds (or its series vanished).
    fn let_go(
        &mut self,
        key: &(String, String),
        keep_firing_for: Duration,
        now_ms: UnixMs,
        out: &mut Vec<Transition>,
    ) {
        let Some(a) = self.alerts.get_mut(key) else {
            return;
        };
        match a.state {
            AlertState::Pending | AlertState::Inactive => {
                let mut ended = transition(a, a.state, now_ms);
                ended.to = AlertState::Inactive;
                out.push(ended);
                self.alerts.remove(key);
            }
            AlertState::Firing => {
                let since = *a.keep_firing_since_ms.get_or_insert(now_ms);
                if now_ms.saturating_sub(since) >= ms(keep_firing_for) {
                    a.state = AlertState::Resolved;
                    a.resolved_at_ms = Some(now_ms);
                    a.keep_firing_since_ms = None;
                    out.push(transition(a, AlertState::Firing, now_ms));
                }
            }
            AlertState::Resolved => {
                if a.resolved_at_ms
                    .is_none_or(|r| now_ms.saturating_sub(r) >= ms(RESOLVED_RETENTION))
                {
                    self.alerts.remove(key);
                }
            }
        }
    }

    /// The alerts to notify at `now_ms`, marked as sent: firing ones not sent for
    /// `resend_delay`, resolved ones not sent since they resolved.
    pub fn due(&mut self, now_ms: UnixMs, resend_delay: Duration) -> Vec<Alert> {
        let mut out = Vec::new();
        for a in self.alerts.values_mut() {
            let due = match a.state {
                AlertState::Firing => a
                    .last_sent_ms
                    .is_none_or(|t| now_ms.saturating_sub(t) >= ms(resend_delay)),
                AlertState::Resolved => match (a.last_sent_ms, a.resolved_at_ms) {
                    // Never sent while firing: nobody was told, so nothing to resolve.
                    (None, _) => false,
                    (Some(sent), Some(resolved)) => sent < resolved,
                    (Some(_), None) => false,
                },
                AlertState::Pending | AlertState::Inactive => false,
            };
            if due {
                a.last_sent_ms = Some(now_ms);
                out.push(a.clone());
            }
        }
        out
    }
}

/// The transition of `a` into its current state from `from`.
fn transition(a: &Alert, from: AlertState, now_ms: UnixMs) -> Transition {
    Transition {
        at_ms: now_ms,
        rule: a.rule.clone(),
        fingerprint: a.fingerprint.clone(),
        labels: a.labels.clone(),
        from,
        to: a.state,
        value: a.value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::rules::RuleFile;
    use AlertState::*;

    fn rule(condition: &str, hold: &str, keep: &str) -> Rule {
        RuleFile {
            name: "Hot".into(),
            condition: Some(condition.into()),
            for_: Some(hold.into()),
            keep_firing_for: Some(keep.into()),
            annotations: BTreeMap::from([(
                "summary".into(),
                "{{ $labels.gpu }} at {{ $value }}".into(),
            )]),
            ..RuleFile::default()
        }
        .resolve()
        .expect("rule")
    }

    fn temps(values: &[(&str, f64)]) -> Vec<Series> {
        values
            .iter()
            .map(|(gpu, v)| Series {
                labels: BTreeMap::from([
                    ("node".to_owned(), "n".to_owned()),
                    ("gpu".to_owned(), (*gpu).to_owned()),
                ]),
                value: *v,
            })
            .collect()
    }

    /// Runs one evaluation at `t` seconds; returns the transitions as (gpu, from, to).
    fn step(
        e: &mut Evaluator,
        r: &Rule,
        t: i64,
        values: &[(&str, f64)],
    ) -> Vec<(String, AlertState, AlertState)> {
        let series = temps(values);
        e.evaluate(std::slice::from_ref(r), &mut |_| series.clone(), t * 1000)
            .into_iter()
            .map(|x| (x.labels["gpu"].clone(), x.from, x.to))
            .collect()
    }

    fn tr(gpu: &str, from: AlertState, to: AlertState) -> (String, AlertState, AlertState) {
        (gpu.to_owned(), from, to)
    }

    #[test]
    fn pending_then_firing_after_for_then_resolved_and_notified_once() {
        let r = rule("gpu_temp_c > 80", "30s", "0s");
        let mut e = Evaluator::default();
        assert_eq!(step(&mut e, &r, 0, &[("a", 70.0)]), []);
        assert_eq!(
            step(&mut e, &r, 10, &[("a", 85.0)]),
            [tr("a", Inactive, Pending)]
        );
        assert_eq!(
            e.due(10_000, Duration::from_secs(60)),
            [],
            "pending is not sent"
        );
        assert_eq!(step(&mut e, &r, 39, &[("a", 86.0)]), [], "29 s < for");
        assert_eq!(
            step(&mut e, &r, 40, &[("a", 87.0)]),
            [tr("a", Pending, Firing)]
        );
        let a = e.alerts().next().expect("alert").clone();
        assert_eq!((a.active_at_ms, a.fired_at_ms), (10_000, Some(40_000)));
        assert_eq!(a.annotations["summary"], "a at 87");
        assert_eq!(a.labels["alertname"], "Hot");
        assert_eq!(a.labels["severity"], "warning");
        let sent = e.due(40_000, Duration::from_secs(60));
        assert_eq!(sent.len(), 1);
        assert_eq!(
            e.due(41_000, Duration::from_secs(60)),
            [],
            "not again before resend_delay"
        );
        assert_eq!(
            e.due(100_000, Duration::from_secs(60)).len(),
            1,
            "re-sent after it"
        );
        assert_eq!(
            step(&mut e, &r, 110, &[("a", 60.0)]),
            [tr("a", Firing, Resolved)]
        );
        let sent = e.due(110_000, Duration::from_secs(60));
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].state, Resolved);
        assert_eq!(sent[0].resolved_at_ms, Some(110_000));
        assert_eq!(
            e.due(200_000, Duration::from_secs(60)),
            [],
            "a resolved alert is sent once"
        );
        // Kept for RESOLVED_RETENTION, then forgotten.
        assert_eq!(step(&mut e, &r, 110 + 899, &[]), []);
        assert_eq!(e.alerts().count(), 1);
        assert_eq!(step(&mut e, &r, 110 + 900, &[]), []);
        assert_eq!(e.alerts().count(), 0);
    }

    #[test]
    fn pending_that_stops_holding_ends_without_a_notification() {
        let r = rule("gpu_temp_c > 80", "30s", "0s");
        let mut e = Evaluator::default();
        step(&mut e, &r, 0, &[("a", 85.0)]);
        assert_eq!(
            step(&mut e, &r, 10, &[("a", 75.0)]),
            [tr("a", Pending, Inactive)]
        );
        assert_eq!(e.alerts().count(), 0);
        assert_eq!(e.due(10_000, Duration::from_secs(1)), []);
        // Holding again starts the `for` over.
        assert_eq!(
            step(&mut e, &r, 20, &[("a", 85.0)]),
            [tr("a", Inactive, Pending)]
        );
        assert_eq!(step(&mut e, &r, 45, &[("a", 85.0)]), []);
        assert_eq!(
            step(&mut e, &r, 50, &[("a", 85.0)]),
            [tr("a", Pending, Firing)]
        );
    }

    #[test]
    fn vanished_series_resolve_and_each_series_is_its_own_alert() {
        let r = rule("gpu_temp_c > 80", "0s", "0s");
        let mut e = Evaluator::default();
        assert_eq!(
            step(&mut e, &r, 0, &[("a", 85.0), ("b", 90.0), ("c", 10.0)]),
            [
                tr("a", Inactive, Pending),
                tr("a", Pending, Firing),
                tr("b", Inactive, Pending),
                tr("b", Pending, Firing)
            ],
            "for = 0s fires at once"
        );
        assert_eq!(
            step(&mut e, &r, 15, &[("a", 85.0)]),
            [tr("b", Firing, Resolved)]
        );
        // Rules removed from the configuration resolve their alerts.
        let none: &[Rule] = &[];
        let t = e.evaluate(none, &mut |_| Vec::new(), 30_000);
        assert_eq!(
            t.iter()
                .map(|x| (x.labels["gpu"].as_str(), x.to))
                .collect::<Vec<_>>(),
            [("a", Resolved)]
        );
    }

    #[test]
    fn flapping_a_resolved_alert_that_holds_again_is_new_and_waits_for_for_again() {
        let r = rule("gpu_temp_c > 80", "20s", "0s");
        let mut e = Evaluator::default();
        step(&mut e, &r, 0, &[("a", 85.0)]);
        step(&mut e, &r, 20, &[("a", 85.0)]);
        assert_eq!(e.due(20_000, Duration::from_secs(60)).len(), 1);
        assert_eq!(step(&mut e, &r, 30, &[]), [tr("a", Firing, Resolved)]);
        assert_eq!(
            step(&mut e, &r, 40, &[("a", 85.0)]),
            [tr("a", Inactive, Pending)]
        );
        let a = e.alerts().next().expect("alert");
        assert_eq!(
            (a.state, a.active_at_ms, a.last_sent_ms),
            (Pending, 40_000, None)
        );
        // The resolution was never sent: it is lost with the new alert, as in Prometheus,
        // but the new alert re-fires after `for` and is sent then.
        assert_eq!(
            step(&mut e, &r, 60, &[("a", 85.0)]),
            [tr("a", Pending, Firing)]
        );
    }

    #[test]
    fn keep_firing_for_rides_out_short_gaps() {
        let r = rule("gpu_temp_c > 80", "0s", "30s");
        let mut e = Evaluator::default();
        step(&mut e, &r, 0, &[("a", 85.0)]);
        assert_eq!(step(&mut e, &r, 10, &[]), [], "still firing");
        assert_eq!(
            step(&mut e, &r, 20, &[("a", 85.0)]),
            [],
            "back: the clock restarts"
        );
        assert_eq!(step(&mut e, &r, 30, &[]), []);
        assert_eq!(step(&mut e, &r, 59, &[]), []);
        assert_eq!(step(&mut e, &r, 60, &[]), [tr("a", Firing, Resolved)]);
    }

    #[test]
    fn a_new_leader_continues_from_the_stored_alerts() {
        let r = rule("gpu_temp_c > 80", "30s", "0s");
        let mut first = Evaluator::default();
        step(&mut first, &r, 0, &[("a", 85.0)]);
        let mut second = Evaluator::from_alerts(first.alerts().cloned());
        assert_eq!(
            step(&mut second, &r, 30, &[("a", 85.0)]),
            [tr("a", Pending, Firing)]
        );
    }

    #[test]
    fn fingerprints_are_stable_and_tell_label_sets_apart() {
        let a = BTreeMap::from([("a".to_owned(), "bc".to_owned())]);
        let b = BTreeMap::from([("ab".to_owned(), "c".to_owned())]);
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_eq!(fingerprint(&a).len(), 16);
    }
}
