//! The uplink: one gRPC `gpufleet.v1.Ingest/Stream` session at a time to a collector,
//! fed from the [`Outbox`], reconnecting with backoff when it breaks.
//!
//! One task owns the session and the timers and reacts to one thing at a time: a new tick
//! in the outbox, a collector message, a connection attempt finishing, a timer. The
//! sampling thread puts encoded ticks into the shared outbox and wakes this task once a
//! partial batch's worth is in ([`ticks_per_wake`]; a [`Notify`]: one pending wake-up at
//! most, however many ticks arrived). Sampling never
//! waits for the network: while disconnected, ticks pile up in the outbox (bounded; see
//! [`crate::queue`]) and go out, merged into larger batches, once a session is up again.
//! Batches go out as the encoded ticks the outbox holds ([`crate::encoded`]).
//!
//! Session protocol: Hello → Welcome (new seqs go above its `last_acked_seq`; only acks
//! trim) → batches, each
//! answered by an Ack (delete) or a Reject (logged with its reason; dropped and counted
//! unless retryable). At most [`WINDOW`] batches are in flight. On any failure: back off
//! (exponential with jitter, capped at [`BACKOFF_CAP`]), try the next collector in the
//! list, resend everything unacked, oldest first.

use crate::encoded::RawAgentMessage;
use crate::queue::{BatchLimits, Outbox, SharedOutbox, Summary, lock};
pub use crate::redact::redact;
use futures::future::BoxFuture;
use gpufleet_core::Inventory;
use gpufleet_proto::v1 as pb;
use rand::Rng;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, sleep_until};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};

/// Most batches sent and not yet acked on one session.
pub const WINDOW: usize = 64;
/// First reconnect delay.
pub const BACKOFF_BASE: Duration = Duration::from_millis(200);
/// Longest reconnect delay.
pub const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// Batch size limit when the collector states none (tonic's default limit is 4 MiB).
const DEFAULT_MAX_BATCH_BYTES: usize = 3 << 20;
/// Pause before resending after a retryable reject (the collector is overloaded).
const RETRY_AFTER_REJECT: Duration = Duration::from_secs(1);
/// Least time between two partial batches (fewer ticks than a batch holds): ticks taken
/// more often than this travel several per message, which costs the agent far less than
/// one message (and one ack) per tick. Full batches (a backlog) and resends go at once;
/// at intervals of 500 ms and more every tick still goes as soon as it is spooled.
pub const PARTIAL_BATCH_GAP: Duration = Duration::from_millis(500);

/// How many ticks the sampling thread spools between two wake-ups of the uplink: one
/// partial batch's worth at `interval` (1 at 500 ms and more, 5 at 100 ms), so the uplink
/// is not woken for ticks it would only hold back.
pub fn ticks_per_wake(interval: Duration) -> usize {
    let per_gap = PARTIAL_BATCH_GAP.as_nanos() / interval.as_nanos().max(1);
    usize::try_from(per_gap).unwrap_or(usize::MAX).max(1)
}

/// Why a session could not be opened or ended.
#[derive(Debug, Error)]
pub enum UplinkError {
    /// The credentials do not fit a collector (e.g. https:// without --ca).
    #[error(transparent)]
    Credentials(#[from] crate::tls::CredentialError),
    /// A `--collector` value is not a usable URL.
    #[error("invalid collector address {url:?}: {reason} (expected e.g. http://collector:50051)")]
    BadUrl {
        /// The address as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be made.
    #[error("cannot connect to collector {url}: {reason}")]
    Connect {
        /// The collector.
        url: String,
        /// The transport error.
        reason: String,
    },
    /// The collector refused or broke the stream with a gRPC status.
    #[error("collector {url} ended the stream: {code:?}: {message}")]
    Status {
        /// The collector.
        url: String,
        /// gRPC status code.
        code: tonic::Code,
        /// The status message (says what and why).
        message: String,
    },
    /// No Welcome in time.
    #[error("collector {url} did not answer the Hello within {secs} s")]
    NoWelcome {
        /// The collector.
        url: String,
        /// The timeout.
        secs: u64,
    },
    /// The first answer was not a Welcome, or the stream ended before it.
    #[error("collector {url} broke the protocol: {what}")]
    Protocol {
        /// The collector.
        url: String,
        /// What it did.
        what: String,
    },
}

/// Normalises `--collector` values: comma-separated lists are split, a missing scheme
/// means `http://`. Every URL is checked now, so a typo fails at start, not at connect.
pub fn parse_collectors(values: &[String]) -> Result<Vec<String>, UplinkError> {
    let mut urls = Vec::new();
    for v in values.iter().flat_map(|v| v.split(',')) {
        let v = v.trim();
        if v.is_empty() {
            continue;
        }
        let url = if v.contains("://") {
            v.to_owned()
        } else {
            format!("http://{v}")
        };
        Endpoint::from_shared(url.clone()).map_err(|e| UplinkError::BadUrl {
            url: redact(v),
            reason: e.to_string(),
        })?;
        urls.push(url);
    }
    if urls.is_empty() {
        return Err(UplinkError::BadUrl {
            url: String::new(),
            reason: "no collector given".into(),
        });
    }
    Ok(urls)
}

/// The reconnect delay before attempt `attempt` (0-based): `base · 2^attempt` capped at
/// `cap`, scaled by `jitter` in `[0.5, 1]` so agents that lost the same collector do not
/// come back in lockstep.
pub fn backoff_delay(attempt: u32, base: Duration, cap: Duration, jitter: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(20)).min(cap);
    exp.mul_f64(jitter.clamp(0.5, 1.0))
}

/// What the agent says about itself in every Hello.
#[derive(Debug, Clone)]
pub struct HelloFacts {
    /// Node name.
    pub node: String,
    /// Boot id of the node.
    pub boot_id: String,
    /// Labels (`--label k=v`).
    pub labels: BTreeMap<String, String>,
    /// The source's inventory.
    pub inventory: Inventory,
    /// Nominal sampling interval.
    pub interval: Duration,
    /// The source's name.
    pub source: &'static str,
}

impl HelloFacts {
    fn to_pb(&self) -> pb::Hello {
        pb::Hello {
            node: self.node.clone(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            boot_id: self.boot_id.clone(),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            inventory: Some(self.inventory.clone().into()),
            sent_ms: gpufleet_core::config::now_ms(),
            interval_ms: u32::try_from(self.interval.as_millis()).unwrap_or(u32::MAX),
            source: self.source.into(),
        }
    }
}

/// An open stream to one collector.
struct Session {
    /// The collector's URL, for logs.
    url: String,
    /// Outgoing messages (the request stream); capacity covers the window.
    out: mpsc::Sender<RawAgentMessage>,
    /// The collector's answers.
    inbound: tonic::Streaming<pb::CollectorMessage>,
    /// Batch limits for this session (ours, tightened by the Welcome's).
    limits: BatchLimits,
    /// The client; kept so the connection lives as long as the session.
    _client: tonic::client::Grpc<Channel>,
}

/// Connects, says Hello and waits for the Welcome.
async fn open_session(
    url: String,
    hello: pb::Hello,
    timeout: Duration,
    batch_max_ticks: usize,
    credentials: crate::tls::Credentials,
) -> Result<(Session, pb::Welcome), UplinkError> {
    let shown = redact(&url);
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| UplinkError::BadUrl {
            url: shown.clone(),
            reason: e.to_string(),
        })?
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let endpoint = credentials.configure(endpoint, &url)?;
    let channel = endpoint.connect().await.map_err(|e| UplinkError::Connect {
        url: shown.clone(),
        reason: error_chain(&e),
    })?;
    // `gpufleet.v1.Ingest/Stream` by hand rather than through the generated client: the
    // request messages are `RawAgentMessage` (ticks already encoded), the answers the
    // generated `CollectorMessage`.
    let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(16 << 20);
    client.ready().await.map_err(|e| UplinkError::Connect {
        url: shown.clone(),
        reason: error_chain(&e),
    })?;
    let (out, rx) = mpsc::channel(WINDOW + 2);
    let hello = RawAgentMessage {
        hello: Some(hello),
        batch: None,
    };
    // The receiver is alive and the channel empty: this cannot fail.
    let _ = out.try_send(hello);
    let no_welcome = || UplinkError::NoWelcome {
        url: shown.clone(),
        secs: timeout.as_secs(),
    };
    let status = |s: tonic::Status| UplinkError::Status {
        url: shown.clone(),
        code: s.code(),
        message: s.message().to_owned(),
    };
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    credentials.authorize(&mut request);
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/gpufleet.v1.Ingest/Stream");
    let codec =
        gpufleet_proto::codec::SliceCodec::<RawAgentMessage, pb::CollectorMessage>::default();
    let response = tokio::time::timeout(timeout, client.streaming(request, path, codec))
        .await
        .map_err(|_| no_welcome())?
        .map_err(status)?;
    let mut inbound = response.into_inner();
    let first = tokio::time::timeout(timeout, inbound.message())
        .await
        .map_err(|_| no_welcome())?
        .map_err(status)?;
    let welcome = match first.and_then(|m| m.msg) {
        Some(pb::collector_message::Msg::Welcome(w)) => w,
        other => {
            return Err(UplinkError::Protocol {
                url: shown,
                what: format!("expected a Welcome, got {other:?}"),
            });
        }
    };
    let mut limits = BatchLimits {
        max_ticks: batch_max_ticks.max(1),
        max_bytes: DEFAULT_MAX_BATCH_BYTES,
    };
    if welcome.max_ticks_per_batch > 0 {
        limits.max_ticks = limits.max_ticks.min(welcome.max_ticks_per_batch as usize);
    }
    if welcome.max_message_bytes > 0 {
        // Leave room for the estimate's error and the envelope.
        limits.max_bytes = (welcome.max_message_bytes as usize / 10) * 9;
    }
    let session = Session {
        url: shown,
        out,
        inbound,
        limits,
        _client: client,
    };
    Ok((session, welcome))
}

/// `e` and its sources, joined (tonic's transport errors hide the cause in the chain).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

/// The connection state.
enum Link {
    /// No session; try again at `retry_at`.
    Down { retry_at: Instant },
    /// A session is being opened.
    Connecting(BoxFuture<'static, Result<(Session, pb::Welcome), UplinkError>>),
    /// A session is up.
    Up(Box<Session>),
}

/// What woke the uplink.
enum Wake {
    Tick,
    SamplerDone,
    Shutdown,
    Deadline,
    Resume,
    Retry,
    Connected(Box<Result<(Session, pb::Welcome), UplinkError>>),
    Inbound(Result<Option<pb::CollectorMessage>, tonic::Status>),
}

async fn next_link_event(link: &mut Link) -> Wake {
    match link {
        Link::Down { retry_at } => {
            sleep_until(*retry_at).await;
            Wake::Retry
        }
        Link::Connecting(fut) => Wake::Connected(Box::new(fut.await)),
        Link::Up(s) => Wake::Inbound(s.inbound.message().await),
    }
}

/// Settings of the uplink.
#[derive(Debug, Clone)]
pub struct UplinkConfig {
    /// Collector URLs (normalised by [`parse_collectors`]), tried round-robin.
    pub collectors: Vec<String>,
    /// What to say in the Hello.
    pub hello: HelloFacts,
    /// Most ticks per batch (`--batch-max-ticks`).
    pub batch_max_ticks: usize,
    /// Limit on connecting and on waiting for the Welcome.
    pub connect_timeout: Duration,
    /// After shutdown is requested, how long to keep delivering.
    pub shutdown_timeout: Duration,
    /// TLS trust, client certificate and token ([`crate::tls`]).
    pub credentials: crate::tls::Credentials,
}

/// Streams the ticks the sampling thread puts into `outbox` (waking `ticks`) to the
/// collectors until `shutdown` is cancelled, `sampler_done` says no tick will come, and
/// either everything is acked or `shutdown_timeout` has passed. Returns the summary.
pub async fn run(
    cfg: UplinkConfig,
    outbox: SharedOutbox,
    ticks: Arc<Notify>,
    sampler_done: CancellationToken,
    shutdown: CancellationToken,
) -> Summary {
    let mut link = Link::Down {
        retry_at: Instant::now(),
    };
    let mut attempt: u32 = 0;
    let mut next_collector = 0usize;
    let mut ticks_open = true;
    let mut deadline: Option<Instant> = None;
    let mut paused_until: Option<Instant> = None;
    let mut partial_at = Instant::now();
    let far = || Instant::now() + Duration::from_secs(86_400 * 365);
    loop {
        if deadline.is_none() && shutdown.is_cancelled() {
            deadline = Some(Instant::now() + cfg.shutdown_timeout);
            partial_at = Instant::now();
            info!(
                unacked = lock(&outbox).summary().unacked,
                timeout = ?cfg.shutdown_timeout,
                "stopping: delivering what is not acked yet"
            );
        }
        if deadline.is_some() && !ticks_open && lock(&outbox).is_empty() {
            break;
        }
        if paused_until.is_some_and(|p| Instant::now() >= p) {
            paused_until = None;
        }
        if let (Link::Up(session), None) = (&mut link, paused_until)
            && let Err(why) = pump(session, lock(&outbox).as_mut(), &mut partial_at)
        {
            warn!(collector = %session.url, reason = why, "session lost while sending");
            link = down(&mut attempt);
        }
        // Woken for a held-back partial batch only when ticks wait for one.
        let partial_due = partial_at > Instant::now() && lock(&outbox).waiting();
        let wake = tokio::select! {
            _ = ticks.notified(), if ticks_open => Wake::Tick,
            _ = sampler_done.cancelled(), if ticks_open => Wake::SamplerDone,
            _ = shutdown.cancelled(), if deadline.is_none() => Wake::Shutdown,
            _ = sleep_until(deadline.unwrap_or_else(far)), if deadline.is_some() => Wake::Deadline,
            _ = sleep_until(paused_until.unwrap_or_else(far)), if paused_until.is_some() => Wake::Resume,
            _ = sleep_until(partial_at), if partial_due => Wake::Resume,
            w = next_link_event(&mut link) => w,
        };
        match wake {
            // The sampling thread wakes the uplink once per partial batch's worth of ticks
            // (`ticks_per_wake`): that batch is due now; so is the last tick.
            Wake::Tick => partial_at = Instant::now(),
            Wake::SamplerDone => {
                ticks_open = false;
                partial_at = Instant::now();
            }
            Wake::Shutdown | Wake::Resume => {}
            Wake::Deadline => {
                let s = lock(&outbox).summary();
                if s.unacked > 0 {
                    warn!(
                        unacked = s.unacked,
                        "shutdown timeout: leaving samples undelivered"
                    );
                }
                break;
            }
            Wake::Retry => {
                let url = cfg.collectors[next_collector % cfg.collectors.len()].clone();
                next_collector = next_collector.wrapping_add(1);
                debug!(collector = %redact(&url), "connecting");
                link = Link::Connecting(Box::pin(open_session(
                    url,
                    cfg.hello.to_pb(),
                    cfg.connect_timeout,
                    cfg.batch_max_ticks,
                    cfg.credentials.clone(),
                )));
            }
            Wake::Connected(result) => match *result {
                Ok((session, welcome)) => {
                    info!(
                        collector = %session.url,
                        node = %welcome.node,
                        last_acked_seq = welcome.last_acked_seq,
                        collector_version = %welcome.collector_version,
                        "connected"
                    );
                    lock(&outbox).start_session(welcome.last_acked_seq);
                    paused_until = None;
                    link = Link::Up(Box::new(session));
                }
                Err(e) => {
                    // The first failure and every tenth after it at warn; the rest at debug.
                    let failures = attempt + 1;
                    if attempt.is_multiple_of(10) {
                        warn!(error = %e, failures, "cannot reach the collector; samples are kept and sent on reconnect");
                    } else {
                        debug!(error = %e, failures, "cannot reach the collector");
                    }
                    link = down(&mut attempt);
                }
            },
            Wake::Inbound(Ok(Some(msg))) => {
                // The backoff resets on the first ack, not on the Welcome: a collector
                // that accepts streams but fails before storing anything is backed off.
                if matches!(msg.msg, Some(pb::collector_message::Msg::Ack(_))) {
                    attempt = 0;
                }
                if let Some(pause) = handle(msg, lock(&outbox).as_mut()) {
                    paused_until = Some(Instant::now() + pause);
                }
            }
            Wake::Inbound(Ok(None)) => {
                info!("the collector closed the stream; reconnecting");
                link = down(&mut attempt);
            }
            Wake::Inbound(Err(status)) => {
                warn!(code = ?status.code(), message = %status.message(), "the stream to the collector failed; reconnecting");
                link = down(&mut attempt);
            }
        }
    }
    lock(&outbox).summary()
}

/// The link after a failure: down, retrying after the next backoff delay.
fn down(attempt: &mut u32) -> Link {
    let delay = backoff_delay(
        *attempt,
        BACKOFF_BASE,
        BACKOFF_CAP,
        rand::rng().random_range(0.5..=1.0),
    );
    *attempt = attempt.saturating_add(1);
    debug!(retry_in = ?delay, "backing off");
    Link::Down {
        retry_at: Instant::now() + delay,
    }
}

/// Sends what the window allows: resends and full batches, and a partial batch when
/// `partial_at` has passed (then the next one waits [`PARTIAL_BATCH_GAP`]). Fails when the
/// session's request stream is gone.
fn pump(
    session: &mut Session,
    outbox: &mut dyn Outbox,
    partial_at: &mut Instant,
) -> Result<(), &'static str> {
    while outbox.in_flight() < WINDOW {
        let now = Instant::now();
        let partial = now >= *partial_at;
        let Some(batch) = outbox.next_batch(session.limits, partial) else {
            return Ok(());
        };
        if partial {
            *partial_at = now + PARTIAL_BATCH_GAP;
        }
        let seq = batch.seq;
        debug!(seq, ticks = batch.ticks.len(), "sending batch");
        match session.out.try_send(batch.into_message()) {
            Ok(()) => {}
            // Cannot happen while the channel holds the window; if it does, the session is
            // wedged: reconnecting resends everything in order.
            Err(mpsc::error::TrySendError::Full(_)) => return Err("send buffer full"),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err("request stream closed"),
        }
    }
    Ok(())
}

/// Applies one collector message; returns a pause before sending again, if any.
fn handle(msg: pb::CollectorMessage, outbox: &mut dyn Outbox) -> Option<Duration> {
    match msg.msg {
        Some(pb::collector_message::Msg::Ack(a)) => {
            if !outbox.ack(a.seq) {
                debug!(seq = a.seq, "ack for a batch no longer held");
            }
            None
        }
        Some(pb::collector_message::Msg::Reject(r)) => {
            let code = pb::RejectCode::try_from(r.code).map_or("unknown", |c| c.as_str_name());
            let samples = outbox.reject(r.seq, r.retryable);
            if r.retryable {
                warn!(seq = r.seq, code, reason = %r.reason, "collector rejected a batch; will resend");
                Some(RETRY_AFTER_REJECT)
            } else {
                warn!(seq = r.seq, code, reason = %r.reason, dropped_samples = samples.unwrap_or(0), "collector rejected a batch; dropping it");
                None
            }
        }
        Some(pb::collector_message::Msg::Welcome(_)) => {
            debug!("ignoring a second Welcome");
            None
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uplink_is_woken_once_per_partial_batch() {
        let ms = Duration::from_millis;
        assert_eq!(ticks_per_wake(ms(1000)), 1);
        assert_eq!(ticks_per_wake(ms(500)), 1);
        assert_eq!(ticks_per_wake(ms(300)), 1);
        assert_eq!(ticks_per_wake(ms(100)), 5);
        assert_eq!(ticks_per_wake(ms(20)), 25);
    }

    #[test]
    fn collectors_are_split_and_given_a_scheme() {
        let urls = parse_collectors(&["a:50051,http://b:1".into(), " https://c:2 ".into()])
            .expect("valid");
        assert_eq!(urls, ["http://a:50051", "http://b:1", "https://c:2"]);
        assert!(parse_collectors(&[]).is_err());
        assert!(parse_collectors(&[",".into()]).is_err());
        let err = parse_collectors(&["http://bad host:1".into()]).expect_err("space in host");
        assert!(err.to_string().contains("bad host"), "{err}");
    }

    #[test]
    fn backoff_grows_exponentially_to_the_cap_with_jitter() {
        let base = Duration::from_millis(200);
        let cap = Duration::from_secs(10);
        assert_eq!(backoff_delay(0, base, cap, 1.0), base);
        assert_eq!(
            backoff_delay(3, base, cap, 1.0),
            Duration::from_millis(1600)
        );
        assert_eq!(backoff_delay(3, base, cap, 0.5), Duration::from_millis(800));
        assert_eq!(backoff_delay(10, base, cap, 1.0), cap);
        assert_eq!(backoff_delay(u32::MAX, base, cap, 1.0), cap);
        assert_eq!(
            backoff_delay(2, base, cap, 7.0),
            Duration::from_millis(800),
            "jitter clamped"
        );
    }
}
