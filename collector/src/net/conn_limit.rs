//! Per-address connection limits on both listeners: one address (a flood, a client stuck
//! in a loop, a slowloris) can hold at most `max_per_ip` connections, so it cannot starve
//! the others.
//!
//! A connection over the limit is not dropped in silence: it is handed to
//! [`crate::net::refuse`], which answers it (HTTP 503 with `Retry-After` and the reason;
//! gRPC `UNAVAILABLE`) and closes it. At most [`MAX_REFUSALS_IN_FLIGHT`] refusals are
//! answered at once per listener; beyond that a refused connection is closed unanswered.
//! Both are counted per listener on `/metrics` ([`ConnStats`]), and logged at `warn` at
//! most once per [`WARN_EVERY`] per listener.
//!
//! Live streams (the dashboard's `/api/v1/live`, one per open tab) have a budget of their
//! own ([`LiveBudget`]): while a connection carries one, it counts against the live
//! budget of its address and the listener's total, not against the connection limit, so
//! a page of open tabs cannot lock its address out of the API.
//!
//! Our own accept loops ([`accept`], and [`crate::net::tls::accept_tls`]) hand the servers
//! [`Limited`] streams; each holds a slot (or its refusal) that is given back when the
//! connection closes.
//!
//! On the gRPC port, [`require_h2_preface`] also closes a connection that has not sent
//! the HTTP/2 client preface within a deadline (a bare TCP or TLS connection would
//! otherwise sit in the HTTP/2 server forever, holding its address's slots: keep-alive
//! pings only start once the preface arrived). After the preface, the gRPC server's
//! keep-alive pings with a timeout close connections whose peer stopped answering.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Default for `--max-connections-per-ip`.
pub const DEFAULT_MAX_PER_IP: usize = 256;
/// Default for `--max-live-streams-per-ip`: a NAT full of dashboards, one stream per tab.
pub const DEFAULT_LIVE_PER_IP: usize = 256;
/// Default for `--max-live-streams`: every live stream serializes every commit's ticks,
/// so their total is bounded whatever the number of addresses.
pub const DEFAULT_LIVE_TOTAL: usize = 1024;
/// Most refusals answered at once per listener (each holds a socket and, with TLS, a
/// handshake); beyond, a refused connection is closed without an answer (still counted).
pub const MAX_REFUSALS_IN_FLIGHT: usize = 64;
/// How long a refused connection gets to send its request and read the answer.
pub const REFUSAL_DEADLINE: Duration = Duration::from_secs(5);
/// At most one `warn` line per listener this often about refused connections (the
/// others are counted in it, and on `/metrics`).
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Which listener a limit guards: named in refusals, logs and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Http,
    Grpc,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Http => "http",
            Listener::Grpc => "grpc",
        }
    }
}

/// How many live streams may be open: per client address, and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBudget {
    pub per_ip: usize,
    pub total: usize,
}

impl Default for LiveBudget {
    fn default() -> Self {
        LiveBudget {
            per_ip: DEFAULT_LIVE_PER_IP,
            total: DEFAULT_LIVE_TOTAL,
        }
    }
}

/// One listener's refusals since start-up, and its live streams now.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Connections over the per-address limit that were answered (503 / `UNAVAILABLE`).
    pub refused_answered: AtomicU64,
    /// Connections over the limit closed unanswered: too many refusals at once.
    pub refused_unanswered: AtomicU64,
    /// Live streams refused by the live budget (503).
    pub live_refused: AtomicU64,
    /// Live streams open now.
    pub live_open: AtomicU64,
}

/// Both listeners' [`ListenerStats`], shown on `/metrics`
/// ([`crate::api::prometheus::connections`]).
#[derive(Debug, Default)]
pub struct ConnStats {
    pub http: ListenerStats,
    pub grpc: ListenerStats,
}

impl ConnStats {
    pub fn of(&self, listener: Listener) -> &ListenerStats {
        match listener {
            Listener::Http => &self.http,
            Listener::Grpc => &self.grpc,
        }
    }
}

/// What is open, per address.
#[derive(Debug, Default)]
struct Counts {
    /// Connections counted against the per-address limit.
    open: HashMap<IpAddr, usize>,
    /// Live streams per address.
    live: HashMap<IpAddr, usize>,
    /// Live streams in all.
    live_total: usize,
}

fn decrement(map: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = map.get_mut(&ip) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(&ip);
        }
    }
}

/// Open connections per client address, bounded, and the live streams they carry.
#[derive(Debug)]
pub struct PerIpLimit {
    listener: Listener,
    max: usize,
    /// Loopback addresses are not bounded: the demo's simulated agents, which all
    /// connect from 127.0.0.1 (a thousand of them in a large demo). Off everywhere else.
    spare_loopback: bool,
    live: LiveBudget,
    counts: Mutex<Counts>,
    /// Refusals being answered now, at most [`MAX_REFUSALS_IN_FLIGHT`].
    refusals: Arc<Semaphore>,
    stats: Arc<ConnStats>,
    /// When a refusal was last logged, and how many were not logged since.
    warned: Mutex<(Option<Instant>, u64)>,
}

/// The outcome of [`PerIpLimit::admit`].
#[derive(Debug)]
pub enum Admission {
    Admitted(Slot),
    /// Over the limit: to be answered with the reason, then closed.
    Refused(Refusal),
    /// Over the limit, with too many refusals in flight: to be closed unanswered.
    Dropped,
}

impl PerIpLimit {
    /// At most `max` connections per address on `listener`, counted into `stats`.
    pub fn new(listener: Listener, max: usize, stats: Arc<ConnStats>) -> PerIpLimit {
        PerIpLimit {
            listener,
            max: max.max(1),
            spare_loopback: false,
            live: LiveBudget::default(),
            counts: Mutex::new(Counts::default()),
            refusals: Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT)),
            stats,
            warned: Mutex::new((None, 0)),
        }
    }

    /// Bounds every address but loopback ones (the demo's own agents).
    pub fn sparing_loopback(mut self) -> PerIpLimit {
        self.spare_loopback = true;
        self
    }

    /// Live streams get `budget`.
    pub fn with_live_budget(mut self, budget: LiveBudget) -> PerIpLimit {
        self.live = budget;
        self
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for one more connection from `ip`, or its refusal when it has `max` open.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Admission {
        let open = {
            let mut counts = self.counts();
            let n = counts.open.entry(ip).or_insert(0);
            if *n < self.max || (self.spare_loopback && ip.is_loopback()) {
                *n += 1;
                return Admission::Admitted(Slot {
                    conn: ConnHandle(Arc::new(ConnShared {
                        limit: Arc::clone(self),
                        ip,
                        state: Mutex::new(ConnState::default()),
                    })),
                });
            }
            *n
        };
        let stats = self.stats.of(self.listener);
        let admission = match Arc::clone(&self.refusals).try_acquire_owned() {
            Ok(permit) => {
                stats.refused_answered.fetch_add(1, Relaxed);
                Admission::Refused(Refusal {
                    _permit: permit,
                    listener: self.listener,
                    reason: format!(
                        "too many connections from your address ({open} open, the limit is \
                         {}); close some (each dashboard tab holds one) and retry",
                        self.max
                    ),
                })
            }
            Err(_) => {
                stats.refused_unanswered.fetch_add(1, Relaxed);
                Admission::Dropped
            }
        };
        self.warn_refused(ip, open);
        admission
    }

    /// One `warn` per [`WARN_EVERY`] per listener; the refusals in between are summed
    /// into the next one.
    fn warn_refused(&self, ip: IpAddr, open: usize) {
        let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match warned.0 {
            Some(at) if now.duration_since(at) < WARN_EVERY => warned.1 += 1,
            _ => {
                let since = std::mem::take(&mut warned.1);
                warned.0 = Some(now);
                drop(warned);
                warn!(
                    listener = self.listener.as_str(),
                    peer = %ip,
                    open,
                    limit = self.max,
                    more_refused_since_last_warning = since,
                    "connection refused: too many open from this address \
                     (--max-connections-per-ip); the client is told so"
                );
            }
        }
    }
}

/// A connection's share of the books, under its limit's lock.
#[derive(Debug, Default)]
struct ConnState {
    /// Live streams it carries now; while above 0 it counts as live, not as open.
    live: usize,
    /// The connection is closed (its [`Slot`] dropped).
    closed: bool,
}

#[derive(Debug)]
struct ConnShared {
    limit: Arc<PerIpLimit>,
    ip: IpAddr,
    state: Mutex<ConnState>,
}

/// A handle on an admitted connection, handed to its requests (as an extension) so a
/// live stream can move the connection onto the live budget.
#[derive(Debug, Clone)]
pub struct ConnHandle(Arc<ConnShared>);

/// Why a live stream was refused; the message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LiveRefused(pub String);

impl ConnHandle {
    /// Counts one more live stream on this connection against its address's and the
    /// listener's live budget (and no longer against the connection limit), or says why
    /// not. The stream ends the count by dropping the guard.
    pub fn start_live(&self) -> Result<LiveGuard, LiveRefused> {
        let shared = &self.0;
        let limit = &shared.limit;
        let mut counts = limit.counts();
        let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        let here = counts.live.get(&shared.ip).copied().unwrap_or(0);
        let refused = if here >= limit.live.per_ip {
            Some(format!(
                "too many live streams from your address ({here} open, the limit is {}); \
                 close some dashboard tabs and retry",
                limit.live.per_ip
            ))
        } else if counts.live_total >= limit.live.total {
            Some(format!(
                "too many live streams open on this collector ({}, the limit is {}); retry \
                 later",
                counts.live_total, limit.live.total
            ))
        } else {
            None
        };
        let stats = limit.stats.of(limit.listener);
        if let Some(why) = refused {
            stats.live_refused.fetch_add(1, Relaxed);
            return Err(LiveRefused(why));
        }
        if state.live == 0 && !state.closed {
            decrement(&mut counts.open, shared.ip);
        }
        state.live += 1;
        *counts.live.entry(shared.ip).or_insert(0) += 1;
        counts.live_total += 1;
        stats.live_open.fetch_add(1, Relaxed);
        Ok(LiveGuard(self.clone()))
    }
}

/// One live stream counted by [`ConnHandle::start_live`]; dropping it gives it back, and
/// the connection counts as open again once it carries none.
#[derive(Debug)]
pub struct LiveGuard(ConnHandle);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let shared = &(self.0).0;
        let limit = &shared.limit;
        let mut counts = limit.counts();
        let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.live = state.live.saturating_sub(1);
        decrement(&mut counts.live, shared.ip);
        counts.live_total = counts.live_total.saturating_sub(1);
        let _ = limit
            .stats
            .of(limit.listener)
            .live_open
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        if state.live == 0 && !state.closed {
            *counts.open.entry(shared.ip).or_insert(0) += 1;
        }
    }
}

/// One admitted connection; dropping it (the connection closed) frees its slot.
#[derive(Debug)]
pub struct Slot {
    conn: ConnHandle,
}

impl Slot {
    /// A handle for the connection's requests.
    pub fn handle(&self) -> ConnHandle {
        self.conn.clone()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let shared = &self.conn.0;
        let mut counts = shared.limit.counts();
        let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        // A connection carrying live streams is counted there; their guards give it back.
        if state.live == 0 {
            decrement(&mut counts.open, shared.ip);
        }
    }
}

/// A connection over the limit, to be answered with `reason` and closed; it holds one of
/// the listener's refusal permits until then.
#[derive(Debug)]
pub struct Refusal {
    _permit: OwnedSemaphorePermit,
    pub listener: Listener,
    /// What the client is told.
    pub reason: String,
}

/// A TCP connection that holds its address's slot while open, or its refusal.
#[derive(Debug)]
pub struct Limited {
    inner: TcpStream,
    admission: LimitedAs,
}

#[derive(Debug)]
enum LimitedAs {
    Admitted(Slot),
    Refused(Refusal),
}

impl Limited {
    /// The handle of an admitted connection; `None` for a refused one.
    pub fn handle(&self) -> Option<ConnHandle> {
        match &self.admission {
            LimitedAs::Admitted(slot) => Some(slot.handle()),
            LimitedAs::Refused(_) => None,
        }
    }

    /// The refusal of a connection over the limit; `None` for an admitted one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match &self.admission {
            LimitedAs::Admitted(_) => None,
            LimitedAs::Refused(r) => Some(r),
        }
    }
}

/// A connection that came through our accept loop, under whatever wraps it (TLS, the
/// HTTP/2 preface check): the servers ask it whether it was admitted or refused.
pub trait LimitedConn {
    fn limited(&self) -> &Limited;
}

impl LimitedConn for Limited {
    fn limited(&self) -> &Limited {
        self
    }
}

impl<S: LimitedConn> LimitedConn for Preface<S> {
    fn limited(&self) -> &Limited {
        self.inner.limited()
    }
}

impl LimitedConn for tokio_rustls::server::TlsStream<Limited> {
    fn limited(&self) -> &Limited {
        self.get_ref().0
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Limited {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Accepts one connection from `listener`, admitted within the per-address limit or
/// refused over it (to be answered); one over the limit with too many refusals in flight
/// is closed at once. `None` when `shutdown` is cancelled.
pub async fn accept_one(
    listener: &TcpListener,
    limit: &Arc<PerIpLimit>,
    shutdown: &CancellationToken,
) -> Option<(Limited, SocketAddr)> {
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => return None,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Usually out of file descriptors: wait instead of spinning.
                    warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let admission = match limit.admit(peer.ip()) {
            Admission::Admitted(slot) => LimitedAs::Admitted(slot),
            Admission::Refused(refusal) => LimitedAs::Refused(refusal),
            Admission::Dropped => {
                debug!(peer = %peer, "connection closed unanswered: over the limit, with too many refusals in flight");
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        return Some((
            Limited {
                inner: tcp,
                admission,
            },
            peer,
        ));
    }
}

/// Plain TCP connections, admitted or to be refused, until `shutdown`.
pub fn accept(
    listener: TcpListener,
    limit: Arc<PerIpLimit>,
    shutdown: CancellationToken,
) -> mpsc::Receiver<(Limited, SocketAddr)> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        while let Some(conn) = tokio::select! {
            () = tx.closed() => None,
            c = accept_one(&listener, &limit, &shutdown) => c,
        } {
            if tx.send(conn).await.is_err() {
                break;
            }
        }
    });
    rx
}

/// The first bytes of every HTTP/2 connection a client opens with prior knowledge (RFC
/// 9113 §3.4), as gRPC clients do on a plaintext port.
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Default for `--grpc-handshake-timeout`.
pub const DEFAULT_H2_PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection whose HTTP/2 client preface was read and checked; the server reads the
/// preface from here first, then the connection.
#[derive(Debug)]
pub struct Preface<S> {
    inner: S,
    /// How much of [`H2_PREFACE`] the server has read.
    replayed: usize,
}

impl<S: AsyncRead + Unpin> AsyncRead for Preface<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(rest) = H2_PREFACE.get(this.replayed..)
            && !rest.is_empty()
        {
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Preface<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Preface<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// For an HTTP/2-only server (gRPC): hands on each connection `rx` yields (plain TCP from
/// [`accept`], or after its TLS handshake) only once it sent the HTTP/2 client preface,
/// within `deadline`; one that is silent, too slow, or sends anything else is closed. The
/// wait happens in a task per connection (their number is bounded by the per-address
/// limit), so a silent client holds up nobody else.
pub fn require_h2_preface<S>(
    mut rx: mpsc::Receiver<(S, SocketAddr)>,
    deadline: Duration,
) -> mpsc::Receiver<(Preface<S>, SocketAddr)>
where
    S: AsyncRead + Unpin + Send + 'static,
{
    let (tx, out) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                () = tx.closed() => None,
                c = rx.recv() => c,
            };
            let Some((mut conn, peer)) = conn else { break };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut preface = [0u8; H2_PREFACE.len()];
                let read = tokio::time::timeout(deadline, conn.read_exact(&mut preface));
                match read.await {
                    Ok(Ok(_)) if &preface == H2_PREFACE => {
                        let conn = Preface {
                            inner: conn,
                            replayed: 0,
                        };
                        let _ = tx.send((conn, peer)).await;
                    }
                    Ok(Ok(_)) => debug!(peer = %peer, "connection closed: not HTTP/2"),
                    Ok(Err(e)) => {
                        debug!(peer = %peer, error = %e, "connection closed before its HTTP/2 preface")
                    }
                    Err(_) => debug!(peer = %peer, "connection closed: no HTTP/2 preface in time"),
                }
            });
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(max: usize) -> Arc<PerIpLimit> {
        Arc::new(PerIpLimit::new(Listener::Http, max, Arc::default()))
    }

    fn slot(a: Admission) -> Option<Slot> {
        match a {
            Admission::Admitted(s) => Some(s),
            _ => None,
        }
    }

    #[test]
    fn slots_are_counted_per_address_and_given_back() {
        let limit = limit(2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let s1 = slot(limit.admit(a)).expect("1st");
        let _s2 = slot(limit.admit(a)).expect("2nd");
        assert!(slot(limit.admit(a)).is_none(), "3rd from a refused");
        assert!(slot(limit.admit(b)).is_some(), "b unaffected");
        drop(s1);
        assert!(slot(limit.admit(a)).is_some(), "slot given back");
    }

    #[test]
    fn a_refusal_says_why_and_is_counted_and_bounded() {
        let stats = Arc::new(ConnStats::default());
        let limit = Arc::new(PerIpLimit::new(Listener::Grpc, 1, Arc::clone(&stats)));
        let a: IpAddr = [10, 0, 0, 1].into();
        let _held = slot(limit.admit(a)).expect("1st");
        let mut refusals = Vec::new();
        for _ in 0..MAX_REFUSALS_IN_FLIGHT {
            match limit.admit(a) {
                Admission::Refused(r) => refusals.push(r),
                other => panic!("expected a refusal, got {other:?}"),
            }
        }
        assert_eq!(refusals[0].listener, Listener::Grpc);
        assert!(refusals[0].reason.contains("1 open, the limit is 1"));
        assert!(matches!(limit.admit(a), Admission::Dropped));
        assert_eq!(stats.grpc.refused_answered.load(Relaxed), 64);
        assert_eq!(stats.grpc.refused_unanswered.load(Relaxed), 1);
        assert_eq!(stats.http.refused_answered.load(Relaxed), 0);
        refusals.pop();
        assert!(
            matches!(limit.admit(a), Admission::Refused(_)),
            "a refusal answered frees its permit"
        );
    }

    #[test]
    fn a_connection_carrying_live_streams_leaves_the_connection_limit() {
        let limit = Arc::new(
            PerIpLimit::new(Listener::Http, 2, Arc::default()).with_live_budget(LiveBudget {
                per_ip: 3,
                total: 4,
            }),
        );
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let c1 = slot(limit.admit(a)).expect("1st");
        let c2 = slot(limit.admit(a)).expect("2nd");
        assert!(slot(limit.admit(a)).is_none(), "a is at its limit");
        // Two connections become live streams: a can open two more plain connections.
        let l1 = c1.handle().start_live().expect("live 1");
        let l2 = c2.handle().start_live().expect("live 2");
        let c3 = slot(limit.admit(a)).expect("3rd, beside the live ones");
        let _c4 = slot(limit.admit(a)).expect("4th");
        assert!(slot(limit.admit(a)).is_none());
        // The per-address live budget (3), then the total (4).
        let l3 = c3.handle().start_live().expect("live 3");
        let refused = _c4.handle().start_live().expect_err("a's 4th live stream");
        assert!(
            refused
                .0
                .contains("from your address (3 open, the limit is 3)")
        );
        let b1 = slot(limit.admit(b)).expect("b");
        let _lb = b1.handle().start_live().expect("b's live stream: 4 in all");
        let b2 = slot(limit.admit(b)).expect("b's 2nd");
        let refused = b2.handle().start_live().expect_err("5th in all");
        assert!(refused.0.contains("on this collector (4, the limit is 4)"));
        // A stream that ends puts its connection back under the connection limit.
        drop(l3);
        assert!(slot(limit.admit(a)).is_none(), "c3 counts as open again");
        // A connection that closes while streaming is given back once, by its guard,
        // and never comes back under the connection limit.
        drop(c1);
        drop(l1);
        assert!(
            slot(limit.admit(a)).is_none(),
            "c3 and c4 still hold a's slots"
        );
        drop((l2, c2));
        let counts = limit.counts();
        assert_eq!(counts.open.get(&a), Some(&2), "c3 and c4 remain");
        assert_eq!(counts.live.get(&a), None);
        assert_eq!(counts.live_total, 1, "b's stream");
    }

    #[test]
    fn sparing_loopback_bounds_every_other_address() {
        let limit = Arc::new(PerIpLimit::new(Listener::Grpc, 1, Arc::default()).sparing_loopback());
        let lo: IpAddr = [127, 0, 0, 1].into();
        let lo6: IpAddr = std::net::Ipv6Addr::LOCALHOST.into();
        let other: IpAddr = [10, 0, 0, 1].into();
        let held: Vec<Slot> = (0..300).filter_map(|_| slot(limit.admit(lo))).collect();
        assert_eq!(held.len(), 300, "loopback unbounded");
        assert!(slot(limit.admit(lo6)).is_some());
        let _one = slot(limit.admit(other)).expect("1st from elsewhere");
        assert!(slot(limit.admit(other)).is_none(), "others keep the limit");
        let plain = self::limit(1);
        let _s = slot(plain.admit(lo));
        assert!(
            slot(plain.admit(lo)).is_none(),
            "a real deployment limits loopback too"
        );
    }
}
