//! Notifications: alerts POSTed to each configured webhook, in Alertmanager's API v2
//! format or gpufleet's own JSON, with retries.
//!
//! **Alertmanager** (`kind = "alertmanager"`): `POST {url}/api/v2/alerts` with a JSON
//! array of `{labels, annotations, startsAt, endsAt, generatorURL}`
//! (<https://prometheus.io/docs/alerting/latest/clients/>). As Prometheus does, a firing
//! alert's `endsAt` is a deadline (`now + 4 × max(resend_delay, evaluation_interval)`) and
//! it is sent again every `resend_delay`, so Alertmanager keeps it until it is resolved,
//! and resolves it on its own if gpufleet stops; a resolved alert carries its resolution
//! time as `endsAt`.
//!
//! **JSON** (`kind = "json"`): `POST url` with [`JsonPayload`]:
//!
//! ```json
//! {"version": "1", "source": "gpufleet", "external_url": "http://collector:8080",
//!  "alerts": [{"status": "firing", "rule": "GpuHot", "fingerprint": "…",
//!              "severity": "warning", "labels": {…}, "annotations": {…}, "value": 91,
//!              "starts_at": "2026-…Z", "starts_at_ms": 1790000000000,
//!              "ends_at": null, "ends_at_ms": null, "generator_url": "…"}]}
//! ```
//! `status` is `firing` or `resolved`; `ends_at` is the resolution time, `null` while
//! firing.
//!
//! Each webhook has a bounded queue ([`QUEUE_CAPACITY`] notifications) and one sender:
//! when the queue is full the new notification is dropped and counted (the next re-send
//! carries the firing alerts again). Delivery goes through [`crate::outbound`]: a
//! notification is retried after a 5xx, a 429 (after its `Retry-After`), no answer, or a
//! 401/403/404/407/408, with exponential backoff, up to the webhook's `max_attempts`; then
//! it is given up and counted, as is one refused with another 4xx.

use super::eval::{Alert, AlertState};
use super::rules::{Webhook, WebhookKind};
use crate::outbound::{self, BackoffOptions, Delivery, Policy, RetryAfter};
use async_trait::async_trait;
use gpufleet_core::UnixMs;
use gpufleet_core::config::format_time;
use reqwest::header::{self, HeaderValue};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Notifications waiting per webhook at most.
pub const QUEUE_CAPACITY: usize = 64;

/// Where a notification goes (the HTTP client, or a test's fake).
#[async_trait]
pub trait Post: Send + Sync + std::fmt::Debug {
    /// POSTs one JSON body.
    async fn post(&self, body: Vec<u8>) -> Delivery;
}

/// Counters since start-up, per collector (only the leader sends).
#[derive(Debug, Default)]
pub struct NotifyStats {
    /// Notifications the webhook accepted (2xx).
    pub sent: AtomicU64,
    /// Notifications given up (refused, or out of attempts).
    pub failed: AtomicU64,
    /// Notifications dropped because the webhook's queue was full.
    pub dropped: AtomicU64,
    /// Notifications sent again.
    pub retries: AtomicU64,
    /// The same four, per webhook (by its name), for `/metrics`.
    pub by_webhook: std::sync::Mutex<BTreeMap<Arc<str>, HookCounts>>,
    /// Alerts now, per state and severity, while this collector evaluates the rules
    /// (absent on the others: they do not know).
    pub active: std::sync::Mutex<Option<ActiveAlerts>>,
}

/// One webhook's notifications since start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookCounts {
    pub sent: u64,
    pub failed: u64,
    pub dropped: u64,
    pub retries: u64,
}

/// What became of a notification (or one attempt of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Sent,
    Failed,
    Dropped,
    Retried,
}

impl NotifyStats {
    /// Counts `outcome` in all and for webhook `hook`.
    fn count(&self, hook: &Arc<str>, outcome: Outcome) {
        let all = match outcome {
            Outcome::Sent => &self.sent,
            Outcome::Failed => &self.failed,
            Outcome::Dropped => &self.dropped,
            Outcome::Retried => &self.retries,
        };
        all.fetch_add(1, Relaxed);
        let mut by = self
            .by_webhook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let c = by.entry(Arc::clone(hook)).or_default();
        match outcome {
            Outcome::Sent => c.sent += 1,
            Outcome::Failed => c.failed += 1,
            Outcome::Dropped => c.dropped += 1,
            Outcome::Retried => c.retries += 1,
        }
    }

    /// Each webhook's counts, by name.
    pub fn by_webhook(&self) -> Vec<(Arc<str>, HookCounts)> {
        let by = self
            .by_webhook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        by.iter().map(|(k, v)| (Arc::clone(k), *v)).collect()
    }
}

/// How many alerts are firing and pending, per severity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActiveAlerts {
    /// Per [`crate::alerts::rules::Severity::ALL`], in its order.
    pub firing: [u64; 3],
    pub pending: [u64; 3],
}

impl NotifyStats {
    /// Publishes the alerts now (`None`: this collector stopped evaluating).
    pub fn set_active(&self, active: Option<ActiveAlerts>) {
        *self
            .active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = active;
    }

    pub fn active(&self) -> Option<ActiveAlerts> {
        *self
            .active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One alert in Alertmanager's API v2 (`postableAlert`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct AmAlert<'a> {
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    starts_at: String,
    ends_at: String,
    #[serde(rename = "generatorURL")]
    generator_url: &'a str,
}

/// The body of a `json` webhook.
#[derive(Debug, Serialize, PartialEq, serde::Deserialize)]
pub struct JsonPayload {
    /// `"1"`: the version of this shape.
    pub version: String,
    pub source: String,
    pub external_url: String,
    pub alerts: Vec<JsonAlert>,
}

/// One alert of a [`JsonPayload`].
#[derive(Debug, Serialize, PartialEq, serde::Deserialize)]
pub struct JsonAlert {
    /// `firing` or `resolved`.
    pub status: String,
    pub rule: String,
    pub fingerprint: String,
    pub severity: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub value: f64,
    pub starts_at: String,
    pub starts_at_ms: UnixMs,
    /// When it resolved; `null` while firing.
    pub ends_at: Option<String>,
    pub ends_at_ms: Option<UnixMs>,
    pub generator_url: String,
}

/// What the bodies need besides the alerts.
#[derive(Debug, Clone)]
pub struct Context {
    /// The collector's address as users reach it (no trailing `/`).
    pub external_url: String,
    /// How long a firing alert stays valid in Alertmanager without being sent again.
    pub valid_for: Duration,
}

impl Context {
    fn generator_url(&self) -> String {
        format!("{}/alerts", self.external_url)
    }
}

fn starts_at(a: &Alert) -> UnixMs {
    a.fired_at_ms.unwrap_or(a.active_at_ms)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The Alertmanager body for `alerts` sent at `now_ms`.
pub fn alertmanager_body(alerts: &[Alert], ctx: &Context, now_ms: UnixMs) -> Vec<u8> {
    let url = ctx.generator_url();
    let body: Vec<AmAlert<'_>> = alerts
        .iter()
        .map(|a| AmAlert {
            labels: &a.labels,
            annotations: &a.annotations,
            starts_at: format_time(starts_at(a)),
            ends_at: format_time(match (a.state, a.resolved_at_ms) {
                (AlertState::Resolved, Some(r)) => r,
                _ => now_ms.saturating_add(ms(ctx.valid_for)),
            }),
            generator_url: &url,
        })
        .collect();
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The `json` webhook's body for `alerts`.
pub fn json_body(alerts: &[Alert], ctx: &Context) -> Vec<u8> {
    let url = ctx.generator_url();
    let payload = JsonPayload {
        version: "1".into(),
        source: "gpufleet".into(),
        external_url: ctx.external_url.clone(),
        alerts: alerts
            .iter()
            .map(|a| {
                let ends = (a.state == AlertState::Resolved)
                    .then_some(a.resolved_at_ms)
                    .flatten();
                JsonAlert {
                    status: if a.state == AlertState::Resolved {
                        "resolved"
                    } else {
                        "firing"
                    }
                    .into(),
                    rule: a.rule.clone(),
                    fingerprint: a.fingerprint.clone(),
                    severity: a.labels.get("severity").cloned().unwrap_or_default(),
                    labels: a.labels.clone(),
                    annotations: a.annotations.clone(),
                    value: a.value,
                    starts_at: format_time(starts_at(a)),
                    starts_at_ms: starts_at(a),
                    ends_at: ends.map(format_time),
                    ends_at_ms: ends,
                    generator_url: url.clone(),
                }
            })
            .collect(),
    };
    serde_json::to_vec(&payload).unwrap_or_default()
}

/// A webhook over HTTP(S).
pub struct HttpPost {
    client: reqwest::Client,
    url: reqwest::Url,
    token: Option<String>,
}

// The token never reaches a log; the URL's password neither.
impl std::fmt::Debug for HttpPost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpPost")
            .field("url", &crate::store::redact_url(self.url.as_str()))
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish()
    }
}

impl HttpPost {
    pub fn new(hook: &Webhook) -> Result<HttpPost, String> {
        let url = reqwest::Url::parse(&hook.url)
            .map_err(|e| format!("webhook {}: {e}", crate::store::redact_url(&hook.url)))?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("gpufleet-collector/", env!("CARGO_PKG_VERSION")))
            .timeout(hook.timeout)
            .connect_timeout(hook.timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| format!("cannot build the webhook HTTP client: {e}"))?;
        Ok(HttpPost {
            client,
            url,
            token: hook.bearer_token.clone(),
        })
    }
}

#[async_trait]
impl Post for HttpPost {
    async fn post(&self, body: Vec<u8>) -> Delivery {
        let mut request = self
            .client
            .post(self.url.clone())
            .header(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .body(body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        outbound::send(request).await
    }
}

/// One webhook's queue, as the job sees it.
#[derive(Debug)]
struct Queue {
    kind: WebhookKind,
    /// The webhook's name ([`Webhook::name`]).
    name: Arc<str>,
    tx: mpsc::Sender<Vec<u8>>,
}

/// Hands notifications to every webhook's queue.
#[derive(Debug)]
pub struct Notifier {
    queues: Vec<Queue>,
    ctx: Context,
    stats: Arc<NotifyStats>,
}

impl Notifier {
    /// Starts a sender per webhook (`posts[i]` delivers to `hooks[i]`), running until
    /// `term` is cancelled.
    pub fn spawn(
        hooks: &[Webhook],
        posts: Vec<Arc<dyn Post>>,
        ctx: Context,
        backoff: BackoffOptions,
        stats: Arc<NotifyStats>,
        term: &CancellationToken,
    ) -> (Notifier, Vec<JoinHandle<()>>) {
        let mut queues = Vec::new();
        let mut tasks = Vec::new();
        for (hook, post) in hooks.iter().zip(posts) {
            let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
            let name: Arc<str> = Arc::from(hook.name.as_str());
            queues.push(Queue {
                kind: hook.kind,
                name: Arc::clone(&name),
                tx,
            });
            tasks.push(tokio::spawn(run_sender(
                rx,
                name,
                post,
                hook.max_attempts,
                backoff,
                Arc::clone(&stats),
                term.clone(),
            )));
        }
        (Notifier { queues, ctx, stats }, tasks)
    }

    /// Queues `alerts` (firing and resolved) for every webhook; never waits.
    pub fn notify(&self, alerts: &[Alert], now_ms: UnixMs) {
        if alerts.is_empty() {
            return;
        }
        for q in &self.queues {
            let body = match q.kind {
                WebhookKind::Alertmanager => alertmanager_body(alerts, &self.ctx, now_ms),
                WebhookKind::Json => json_body(alerts, &self.ctx),
            };
            if q.tx.try_send(body).is_err() {
                self.stats.count(&q.name, Outcome::Dropped);
                warn!(
                    webhook = %q.name,
                    "an alert webhook's queue is full: notification dropped (firing alerts are sent again)"
                );
            }
        }
    }
}

/// Sends one webhook's notifications in order until `term` is cancelled.
async fn run_sender(
    mut rx: mpsc::Receiver<Vec<u8>>,
    name: Arc<str>,
    post: Arc<dyn Post>,
    max_attempts: u32,
    options: BackoffOptions,
    stats: Arc<NotifyStats>,
    term: CancellationToken,
) {
    // Bounded attempts, so `Retry-After` is taken as given; a request in flight does not
    // hold the term's end (a webhook that hangs until its timeout would).
    let policy = Policy {
        backoff: options,
        max_attempts: Some(max_attempts),
        retry_after: RetryAfter::AsGiven,
        abandon_in_flight: true,
    };
    loop {
        let body = tokio::select! {
            () = term.cancelled() => return,
            next = rx.recv() => match next {
                Some(body) => body,
                None => return,
            },
        };
        let (hook, body) = (&*post, &body);
        let outcome = outbound::deliver(
            policy,
            &term,
            move || hook.post(body.clone()),
            |r| {
                warn!(
                    webhook = %name,
                    ?post,
                    attempt = r.attempt,
                    why = r.why,
                    "alert notification not delivered; retrying"
                );
                stats.count(&name, Outcome::Retried);
            },
        )
        .await;
        match outcome {
            outbound::Outcome::Sent => {
                stats.count(&name, Outcome::Sent);
                debug!(webhook = %name, ?post, "alert notification delivered");
            }
            outbound::Outcome::Refused { status, why } => {
                stats.count(&name, Outcome::Failed);
                warn!(
                    webhook = %name,
                    ?post,
                    status, why, "alert webhook refused a notification; given up"
                );
            }
            outbound::Outcome::GaveUp { attempts, why } => {
                stats.count(&name, Outcome::Failed);
                warn!(
                    webhook = %name,
                    ?post,
                    attempts,
                    why,
                    "alert notification not delivered; given up"
                );
            }
            outbound::Outcome::Cancelled => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn alert(state: AlertState) -> Alert {
        Alert {
            rule: "GpuHot".into(),
            fingerprint: "00ff".into(),
            state,
            labels: BTreeMap::from([
                ("alertname".to_owned(), "GpuHot".to_owned()),
                ("severity".to_owned(), "warning".to_owned()),
                ("node".to_owned(), "n1".to_owned()),
            ]),
            annotations: BTreeMap::from([("summary".to_owned(), "hot".to_owned())]),
            value: 91.0,
            active_at_ms: 1_000,
            fired_at_ms: Some(61_000),
            resolved_at_ms: (state == AlertState::Resolved).then_some(121_000),
            keep_firing_since_ms: None,
            last_sent_ms: None,
        }
    }

    fn ctx() -> Context {
        Context {
            external_url: "http://c:8080".into(),
            valid_for: Duration::from_secs(240),
        }
    }

    #[test]
    fn alertmanager_body_is_postable_alerts() {
        let body = alertmanager_body(
            &[alert(AlertState::Firing), alert(AlertState::Resolved)],
            &ctx(),
            100_000,
        );
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        let expected = serde_json::json!([
            {"labels": {"alertname": "GpuHot", "severity": "warning", "node": "n1"},
             "annotations": {"summary": "hot"},
             "startsAt": "1970-01-01T00:01:01.000Z", "endsAt": "1970-01-01T00:05:40.000Z",
             "generatorURL": "http://c:8080/alerts"},
            {"labels": {"alertname": "GpuHot", "severity": "warning", "node": "n1"},
             "annotations": {"summary": "hot"},
             "startsAt": "1970-01-01T00:01:01.000Z", "endsAt": "1970-01-01T00:02:01.000Z",
             "generatorURL": "http://c:8080/alerts"},
        ]);
        assert_eq!(v, expected);
    }

    #[test]
    fn json_body_says_firing_or_resolved() {
        let body = json_body(
            &[alert(AlertState::Firing), alert(AlertState::Resolved)],
            &ctx(),
        );
        let p: JsonPayload = serde_json::from_slice(&body).expect("our shape");
        assert_eq!(p.version, "1");
        assert_eq!(p.alerts[0].status, "firing");
        assert_eq!(
            (p.alerts[0].ends_at.as_deref(), p.alerts[0].ends_at_ms),
            (None, None)
        );
        assert_eq!(p.alerts[1].status, "resolved");
        assert_eq!(p.alerts[1].ends_at_ms, Some(121_000));
        assert_eq!(p.alerts[1].severity, "warning");
        assert_eq!(p.alerts[1].starts_at_ms, 61_000);
    }

    /// Answers from a script, recording what was posted.
    #[derive(Debug)]
    struct Scripted {
        answers: Mutex<Vec<Delivery>>,
        posted: Mutex<Vec<Vec<u8>>>,
    }

    #[async_trait]
    impl Post for Scripted {
        async fn post(&self, body: Vec<u8>) -> Delivery {
            self.posted.lock().expect("lock").push(body);
            let mut a = self.answers.lock().expect("lock");
            if a.is_empty() {
                Delivery::Sent
            } else {
                a.remove(0)
            }
        }
    }

    fn retry() -> Delivery {
        Delivery::Retry {
            after: None,
            why: "500".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_backoff_then_gives_up_and_counts() {
        let post = Arc::new(Scripted {
            answers: Mutex::new(vec![retry(), retry(), retry(), retry()]),
            posted: Mutex::new(Vec::new()),
        });
        let hook = Webhook {
            kind: WebhookKind::Json,
            name: "x".into(),
            url: "http://x".into(),
            bearer_token: None,
            timeout: Duration::from_secs(1),
            max_attempts: 3,
        };
        let stats = Arc::new(NotifyStats::default());
        let term = CancellationToken::new();
        let backoff = BackoffOptions {
            min: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        let (n, tasks) = Notifier::spawn(
            std::slice::from_ref(&hook),
            vec![post.clone() as Arc<dyn Post>],
            ctx(),
            backoff,
            Arc::clone(&stats),
            &term,
        );
        let start = tokio::time::Instant::now();
        n.notify(&[alert(AlertState::Firing)], 0);
        n.notify(&[alert(AlertState::Resolved)], 0);
        // First: 3 attempts (waits 1 s, 2 s), given up; second: 1 more 500, then sent.
        // Virtual time: bounded, so a sender that never delivers fails instead of hanging.
        for _ in 0..600 {
            if stats.sent.load(Relaxed) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(stats.sent.load(Relaxed), 1, "the second was delivered");
        assert_eq!(post.posted.lock().expect("lock").len(), 5);
        assert_eq!(stats.failed.load(Relaxed), 1);
        assert_eq!(stats.retries.load(Relaxed), 3);
        let by = stats.by_webhook();
        assert_eq!(by.len(), 1);
        assert_eq!(&*by[0].0, "x");
        assert_eq!(
            by[0].1,
            HookCounts {
                sent: 1,
                failed: 1,
                dropped: 0,
                retries: 3
            }
        );
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(4) && waited < Duration::from_secs(5),
            "1 s + 2 s of backoff for the first, 1 s for the second: {waited:?}"
        );
        term.cancel();
        for t in tasks {
            t.await.expect("sender");
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts() {
        #[derive(Debug)]
        struct Stuck;
        #[async_trait]
        impl Post for Stuck {
            async fn post(&self, _: Vec<u8>) -> Delivery {
                std::future::pending().await
            }
        }
        let hook = Webhook {
            kind: WebhookKind::Alertmanager,
            name: "am".into(),
            url: "http://x".into(),
            bearer_token: None,
            timeout: Duration::from_secs(1),
            max_attempts: 3,
        };
        let stats = Arc::new(NotifyStats::default());
        let term = CancellationToken::new();
        let (n, tasks) = Notifier::spawn(
            std::slice::from_ref(&hook),
            vec![Arc::new(Stuck) as Arc<dyn Post>],
            ctx(),
            BackoffOptions::default(),
            Arc::clone(&stats),
            &term,
        );
        for _ in 0..QUEUE_CAPACITY + 10 {
            n.notify(&[alert(AlertState::Firing)], 0);
        }
        // One is in flight (taken off the queue) or not yet: 9 or 10 dropped.
        let dropped = stats.dropped.load(Relaxed);
        assert!((9..=10).contains(&dropped), "{dropped}");
        term.cancel();
        for t in tasks {
            t.await.expect("sender");
        }
    }
}
