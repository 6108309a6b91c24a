//! Following `GET /api/v1/live` (Server-Sent Events): `tick` and `status` events decoded
//! into [`LiveEvent`]s, reconnecting with backoff whenever the stream fails or goes quiet.
//!
//! After every (re)connection a [`LiveEvent::Connected`] tells the caller to reload the
//! fleet list: ticks missed while disconnected are not replayed. The channel to the
//! caller is bounded; when it is full this task waits, the collector's buffer for this
//! client fills, and the collector sends `resync` (reload the list) instead of buffering.

use crate::api::{StatusView, TickView};
use crate::net::Api;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The collector sends `status` every second: this long without any event is a dead link.
pub const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// First wait before reconnecting; doubled up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(500);
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The most bytes read for one event: a `status` of 1,000 nodes is a few hundred KB, so
/// a stream that sends more without finishing an event is not the collector's.
pub const EVENT_LIMIT: usize = 16 << 20;

/// Why reading the live stream failed.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("an event is larger than {} MiB, the most this client reads", EVENT_LIMIT >> 20)]
    TooLarge,
}

/// What the live stream says.
#[derive(Debug, Clone)]
pub enum LiveEvent {
    /// (Re)connected: reload the fleet list.
    Connected,
    Tick(TickView<'static>),
    Status(StatusView),
    /// The collector skipped events for this client: reload the fleet list.
    Resync,
    /// The stream failed; reconnecting. Says why.
    Down(String),
}

/// One SSE event as a [`LiveEvent`]; `None` for events this client does not use.
pub fn decode(event: &str, data: &str) -> Option<Result<LiveEvent, String>> {
    let r = match event {
        "tick" => serde_json::from_str(data).map(LiveEvent::Tick),
        "status" => serde_json::from_str(data).map(LiveEvent::Status),
        "resync" => Ok(LiveEvent::Resync),
        _ => return None,
    };
    Some(r.map_err(|e| format!("cannot decode a live {event} event: {e}")))
}

/// Follows the live stream until `stop` is cancelled or the receiver is dropped.
pub async fn follow(api: Api, tx: mpsc::Sender<LiveEvent>, stop: CancellationToken) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let why = tokio::select! {
            () = stop.cancelled() => return,
            why = session(&api, &tx, &mut backoff) => why,
        };
        let Some(why) = why else { return };
        if tx.send(LiveEvent::Down(why)).await.is_err() {
            return;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection: why it ended, or `None` when the receiver is gone.
async fn session(
    api: &Api,
    tx: &mpsc::Sender<LiveEvent>,
    backoff: &mut Duration,
) -> Option<String> {
    let resp = match api.send(api.live_url(), None).await {
        Ok(r) => r,
        Err(e) => return Some(e.to_string()),
    };
    // Bytes read since the last whole event, bounded by EVENT_LIMIT.
    let pending = Arc::new(AtomicUsize::new(0));
    let bytes = resp.bytes_stream().map({
        let pending = Arc::clone(&pending);
        move |chunk| {
            let chunk = chunk?;
            if pending.fetch_add(chunk.len(), Relaxed) + chunk.len() > EVENT_LIMIT {
                return Err(ReadError::TooLarge);
            }
            Ok(chunk)
        }
    });
    let mut events = bytes.eventsource();
    let mut connected = false;
    loop {
        let next = match tokio::time::timeout(IDLE_LIMIT, events.next()).await {
            Err(_) => return Some(format!("no live event for {}s", IDLE_LIMIT.as_secs())),
            Ok(None) => return Some("the collector closed the live stream".into()),
            Ok(Some(Err(e))) => return Some(format!("live stream: {e}")),
            Ok(Some(Ok(ev))) => ev,
        };
        pending.store(0, Relaxed);
        if !connected {
            // The first event proves the stream works: only then is the backoff reset.
            connected = true;
            *backoff = MIN_BACKOFF;
            tx.send(LiveEvent::Connected).await.ok()?;
        }
        match decode(&next.event, &next.data) {
            None => {}
            Some(Ok(ev)) => tx.send(ev).await.ok()?,
            Some(Err(why)) => return Some(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_by_name() {
        let t = decode(
            "tick",
            r#"{"node":"n","time_ms":1,"gpus":[],"host":null,"processes":[]}"#,
        );
        assert!(matches!(t, Some(Ok(LiveEvent::Tick(t))) if t.node == "n"));
        let s = decode("status", r#"{"now_ms":5,"nodes":[]}"#);
        assert!(matches!(s, Some(Ok(LiveEvent::Status(s))) if s.now_ms == 5));
        assert!(matches!(
            decode("resync", r#"{"skipped":3}"#),
            Some(Ok(LiveEvent::Resync))
        ));
        assert!(decode("something-new", "{}").is_none());
        let bad = decode("tick", "{");
        assert!(matches!(bad, Some(Err(why)) if why.contains("tick")));
    }
}
