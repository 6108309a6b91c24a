//! What every store keeps of alerts: the current ones, replaced and removed in one
//! transaction with the history appended; the history read newest first within a range,
//! and pruned.

use crate::common::{T0, pg_store, sqlite_store};
use gpufleet_collector::alerts::eval::{Alert, AlertState, Transition};
use gpufleet_collector::store::{Store, TimeRange};
use std::collections::BTreeMap;
use std::sync::Arc;

fn alert(rule: &str, fp: &str, state: AlertState) -> Alert {
    Alert {
        rule: rule.into(),
        fingerprint: fp.into(),
        state,
        labels: BTreeMap::from([
            ("alertname".to_owned(), rule.to_owned()),
            ("node".to_owned(), "n'1\"; DROP TABLE alerts;--".to_owned()),
        ]),
        annotations: BTreeMap::from([("summary".to_owned(), "héllo {x}".to_owned())]),
        value: 85.25,
        active_at_ms: T0,
        fired_at_ms: None,
        resolved_at_ms: None,
        keep_firing_since_ms: None,
        last_sent_ms: None,
    }
}

fn transition(at_ms: i64, fp: &str, from: AlertState, to: AlertState) -> Transition {
    Transition {
        at_ms,
        rule: "Hot".into(),
        fingerprint: fp.into(),
        labels: BTreeMap::from([("gpu".to_owned(), fp.to_owned())]),
        from,
        to,
        value: 1.5,
    }
}

async fn alerts_round_trip_with_their_history(store: Arc<dyn Store>) {
    use AlertState::*;
    assert_eq!(store.alerts().await.expect("none yet"), []);
    let a = alert("Hot", "aa", Pending);
    let b = alert("Hot", "bb", Pending);
    let c = alert("Lost", "aa", Firing);
    store
        .save_alerts(
            &[b.clone(), a.clone(), c.clone()],
            &[],
            &[
                transition(T0, "aa", Inactive, Pending),
                transition(T0, "bb", Inactive, Pending),
            ],
        )
        .await
        .expect("save");
    assert_eq!(
        store.alerts().await.expect("read"),
        [a.clone(), b.clone(), c.clone()],
        "every field, by rule then fingerprint"
    );
    // One fires (every optional field set), one ends, one is untouched.
    let mut fired = a.clone();
    fired.state = Firing;
    fired.fired_at_ms = Some(T0 + 30_000);
    fired.resolved_at_ms = Some(T0 + 90_000);
    fired.keep_firing_since_ms = Some(T0 + 60_000);
    fired.last_sent_ms = Some(T0 + 30_001);
    fired.value = -0.5;
    store
        .save_alerts(
            &[fired.clone()],
            &[("Hot".into(), "bb".into())],
            &[
                transition(T0 + 30_000, "aa", Pending, Firing),
                transition(T0 + 30_000, "bb", Pending, Inactive),
            ],
        )
        .await
        .expect("save");
    assert_eq!(store.alerts().await.expect("read"), [fired, c]);

    let all = TimeRange {
        from_ms: 0,
        to_ms: i64::MAX,
    };
    let h = store.alert_history(all, 10).await.expect("history");
    let seen: Vec<(i64, &str, AlertState)> = h
        .iter()
        .map(|t| (t.at_ms, t.fingerprint.as_str(), t.to))
        .collect();
    assert_eq!(
        seen,
        [
            (T0 + 30_000, "bb", Inactive),
            (T0 + 30_000, "aa", Firing),
            (T0, "bb", Pending),
            (T0, "aa", Pending)
        ],
        "newest first; one instant in the order written, reversed"
    );
    assert_eq!(h[1], transition(T0 + 30_000, "aa", Pending, Firing));
    assert_eq!(store.alert_history(all, 1).await.expect("limit").len(), 1);
    let early = TimeRange {
        from_ms: 0,
        to_ms: T0,
    };
    assert_eq!(
        store.alert_history(early, 10).await.expect("range").len(),
        2
    );
    assert_eq!(store.prune_alert_history(T0 + 1).await.expect("prune"), 2);
    assert_eq!(
        store.alert_history(all, 10).await.expect("history").len(),
        2
    );
    // Nothing to do is fine.
    store.save_alerts(&[], &[], &[]).await.expect("empty save");
}

#[tokio::test]
async fn sqlite_alerts_round_trip_with_their_history() {
    let (_dir, store) = sqlite_store().await;
    alerts_round_trip_with_their_history(Arc::clone(&store)).await;
    store.close().await;
}

#[tokio::test]
async fn postgres_alerts_round_trip_with_their_history() {
    let (_schema, store) = pg_store().await;
    alerts_round_trip_with_their_history(Arc::clone(&store)).await;
    store.close().await;
}
