//! Alerts in the store ([`AlertStore`]): the current alert of each rule and series, and
//! the history of their state changes (migration 0023), with their SQL once for both
//! backends. The evaluation is in `alerts` (collector).

use super::backend::{Backend, Get, Table, sql};
use super::rows::limit_i64;
use super::{SqlStore, StoreError, TimeRange};
pub mod records;

use async_trait::async_trait;
use gpufleet_core::UnixMs;
use records::{Alert, AlertState, Transition};
use std::collections::BTreeMap;

/// What the alerts job keeps and the API reads.
#[async_trait]
pub trait AlertStore: Send + Sync + std::fmt::Debug {
    /// Every current alert (pending, firing, or resolved and not yet forgotten), by rule
    /// then fingerprint.
    async fn alerts(&self) -> Result<Vec<Alert>, StoreError>;

    /// In one transaction: stores `changed` alerts (replacing those of the same rule and
    /// fingerprint), removes the `removed` ones (rule, fingerprint), and appends
    /// `transitions` to the history.
    async fn save_alerts(
        &self,
        changed: &[Alert],
        removed: &[(String, String)],
        transitions: &[Transition],
    ) -> Result<(), StoreError>;

    /// State changes in `range`, newest first, at most `limit`.
    async fn alert_history(
        &self,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<Transition>, StoreError>;

    /// Forgets state changes older than `before_ms`; returns how many.
    async fn prune_alert_history(&self, before_ms: UnixMs) -> Result<u64, StoreError>;
}

fn to_json(map: &BTreeMap<String, String>) -> String {
    serde_json::to_string(map).unwrap_or_else(|_| "{}".to_owned())
}

fn from_json(column: &str, text: &str) -> Result<BTreeMap<String, String>, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("alerts: {column} is not a JSON object: {e}")))
}

fn state(column: &str, text: &str) -> Result<AlertState, StoreError> {
    AlertState::parse(text)
        .ok_or_else(|| StoreError::Corrupt(format!("alerts: {column} {text:?} is no state")))
}

fn alert_row<R: Get>(row: &R) -> Result<Alert, StoreError> {
    Ok(Alert {
        rule: row.get("rule")?,
        fingerprint: row.get("fingerprint")?,
        state: state("state", &row.get::<String>("state")?)?,
        labels: from_json("labels", &row.get::<String>("labels")?)?,
        annotations: from_json("annotations", &row.get::<String>("annotations")?)?,
        value: row.get("value")?,
        active_at_ms: row.get("active_at_ms")?,
        fired_at_ms: row.get("fired_at_ms")?,
        resolved_at_ms: row.get("resolved_at_ms")?,
        keep_firing_since_ms: row.get("keep_firing_since_ms")?,
        last_sent_ms: row.get("last_sent_ms")?,
    })
}

fn transition_row<R: Get>(row: &R) -> Result<Transition, StoreError> {
    Ok(Transition {
        at_ms: row.get("at_ms")?,
        rule: row.get("rule")?,
        fingerprint: row.get("fingerprint")?,
        labels: from_json("labels", &row.get::<String>("labels")?)?,
        from: state("from_state", &row.get::<String>("from_state")?)?,
        to: state("to_state", &row.get::<String>("to_state")?)?,
        value: row.get("value")?,
    })
}

const ALERT_COLS: &str = "rule, fingerprint, state, labels, annotations, value, active_at_ms, \
     fired_at_ms, resolved_at_ms, keep_firing_since_ms, last_sent_ms";

#[async_trait]
impl<DB: Backend> AlertStore for SqlStore<DB> {
    async fn alerts(&self) -> Result<Vec<Alert>, StoreError> {
        let query = sql::<DB>(
            "read the current alerts",
            format!("SELECT {ALERT_COLS} FROM alerts ORDER BY rule, fingerprint"),
        );
        self.fetch(query, alert_row).await
    }

    async fn save_alerts(
        &self,
        changed: &[Alert],
        removed: &[(String, String)],
        transitions: &[Transition],
    ) -> Result<(), StoreError> {
        if changed.is_empty() && removed.is_empty() && transitions.is_empty() {
            return Ok(());
        }
        let d = DB::DIALECT;
        let op = "save alerts";
        let mut tx = self.begin_write(op).await?;
        if !changed.is_empty() {
            let table = Table::default()
                .text("rule", changed.iter().map(|a| a.rule.clone()))
                .text("fingerprint", changed.iter().map(|a| a.fingerprint.clone()))
                .text("state", changed.iter().map(|a| a.state.as_str().to_owned()))
                .text("labels", changed.iter().map(|a| to_json(&a.labels)))
                .text(
                    "annotations",
                    changed.iter().map(|a| to_json(&a.annotations)),
                )
                .float("value", changed.iter().map(|a| a.value))
                .int("active_at_ms", changed.iter().map(|a| a.active_at_ms))
                .int("fired_at_ms", changed.iter().map(|a| a.fired_at_ms))
                .int("resolved_at_ms", changed.iter().map(|a| a.resolved_at_ms))
                .int(
                    "keep_firing_since_ms",
                    changed.iter().map(|a| a.keep_firing_since_ms),
                )
                .int("last_sent_ms", changed.iter().map(|a| a.last_sent_ms));
            let sets: Vec<String> = ALERT_COLS
                .split(", ")
                .skip(2)
                .map(|c| format!("{c} = excluded.{c}"))
                .collect();
            let cols: Vec<String> = ALERT_COLS.split(", ").map(|c| format!("v.{c}")).collect();
            sql::<DB>(
                "save changed alerts",
                format!(
                    "INSERT INTO alerts ({ALERT_COLS}) SELECT {} FROM {} WHERE true ORDER BY v.o \
                     ON CONFLICT (rule, fingerprint) DO UPDATE SET {}",
                    cols.join(", "),
                    d.over(&table, "v"),
                    sets.join(", "),
                ),
            )
            .bind_table(table)
            .execute(tx.conn())
            .await?;
        }
        if !removed.is_empty() {
            let table = Table::default()
                .text("rule", removed.iter().map(|r| r.0.clone()))
                .text("fingerprint", removed.iter().map(|r| r.1.clone()));
            sql::<DB>(
                "remove ended alerts",
                format!(
                    "DELETE FROM alerts WHERE (rule, fingerprint) IN \
                     (SELECT v.rule, v.fingerprint FROM {})",
                    d.over(&table, "v")
                ),
            )
            .bind_table(table)
            .execute(tx.conn())
            .await?;
        }
        if !transitions.is_empty() {
            let t = transitions;
            let table = Table::default()
                .int("at_ms", t.iter().map(|x| x.at_ms))
                .text("rule", t.iter().map(|x| x.rule.clone()))
                .text("fingerprint", t.iter().map(|x| x.fingerprint.clone()))
                .text("labels", t.iter().map(|x| to_json(&x.labels)))
                .text("from_state", t.iter().map(|x| x.from.as_str().to_owned()))
                .text("to_state", t.iter().map(|x| x.to.as_str().to_owned()))
                .float("value", t.iter().map(|x| x.value));
            sql::<DB>(
                "record alert state changes",
                format!(
                    "INSERT INTO alert_history \
                     (at_ms, rule, fingerprint, labels, from_state, to_state, value) \
                     SELECT v.at_ms, v.rule, v.fingerprint, v.labels, v.from_state, v.to_state, \
                     v.value FROM {} ORDER BY v.o",
                    d.over(&table, "v")
                ),
            )
            .bind_table(table)
            .execute(tx.conn())
            .await?;
        }
        tx.commit(op).await
    }

    async fn alert_history(
        &self,
        range: TimeRange,
        limit: usize,
    ) -> Result<Vec<Transition>, StoreError> {
        let query = sql::<DB>(
            "read the alert history",
            "SELECT at_ms, rule, fingerprint, labels, from_state, to_state, value \
             FROM alert_history WHERE at_ms BETWEEN $1 AND $2 ORDER BY at_ms DESC, id DESC \
             LIMIT $3",
        )
        .bind(range.from_ms)
        .bind(range.to_ms)
        .bind(limit_i64(limit));
        self.fetch(query, transition_row).await
    }

    async fn prune_alert_history(&self, before_ms: UnixMs) -> Result<u64, StoreError> {
        self.write_one(
            sql::<DB>(
                "prune the alert history",
                "DELETE FROM alert_history WHERE at_ms < $1",
            )
            .bind(before_ms),
        )
        .await
    }
}
