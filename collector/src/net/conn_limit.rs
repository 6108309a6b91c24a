//! Per-address connection limits on both listeners: one address (a flood, a client stuck
//! in a loop, a slowloris) can hold at most `max_per_ip` connections, so it cannot starve
//! the others. Connections over the limit are closed at once, before any TLS or HTTP work.
//!
//! Our own accept loops ([`accept`], and [`crate::net::tls::accept_tls`]) hand the servers
//! [`Limited`] streams; each holds a slot that is given back when the connection closes.
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
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Default for `--max-connections-per-ip`.
pub const DEFAULT_MAX_PER_IP: usize = 256;

/// Open connections per client address, bounded.
#[derive(Debug)]
pub struct PerIpLimit {
    max: usize,
    /// Loopback addresses are not bounded: the demo's simulated agents, which all
    /// connect from 127.0.0.1 (a thousand of them in a large demo). Off everywhere else.
    spare_loopback: bool,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerIpLimit {
    pub fn new(max: usize) -> Arc<PerIpLimit> {
        Arc::new(PerIpLimit {
            max: max.max(1),
            spare_loopback: false,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A limit that bounds every address but loopback ones (the demo's own agents).
    pub fn sparing_loopback(max: usize) -> Arc<PerIpLimit> {
        Arc::new(PerIpLimit {
            max: max.max(1),
            spare_loopback: true,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A slot for one more connection from `ip`, or `None` when it has `max` open.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().ok()?;
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max && !(self.spare_loopback && ip.is_loopback()) {
            return None;
        }
        *n += 1;
        Some(Slot {
            limit: Arc::clone(self),
            ip,
        })
    }
}

/// One admitted connection; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    limit: Arc<PerIpLimit>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.limit.open.lock()
            && let Some(n) = open.get_mut(&self.ip)
        {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// A TCP connection that holds its address's slot while open.
#[derive(Debug)]
pub struct Limited {
    inner: TcpStream,
    _slot: Slot,
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

/// Accepts one connection from `listener` within the per-address limit; connections over
/// it are closed at once. `None` when `shutdown` is cancelled.
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
        match limit.admit(peer.ip()) {
            Some(slot) => {
                let _ = tcp.set_nodelay(true);
                return Some((
                    Limited {
                        inner: tcp,
                        _slot: slot,
                    },
                    peer,
                ));
            }
            None => debug!(peer = %peer, "connection refused: too many open from this address"),
        }
    }
}

/// Plain TCP connections within the per-address limit, until `shutdown`.
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

    #[test]
    fn slots_are_counted_per_address_and_given_back() {
        let limit = PerIpLimit::new(2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let s1 = limit.admit(a).expect("1st");
        let _s2 = limit.admit(a).expect("2nd");
        assert!(limit.admit(a).is_none(), "3rd from a refused");
        assert!(limit.admit(b).is_some(), "b unaffected");
        drop(s1);
        assert!(limit.admit(a).is_some(), "slot given back");
    }

    #[test]
    fn sparing_loopback_bounds_every_other_address() {
        let limit = PerIpLimit::sparing_loopback(1);
        let lo: IpAddr = [127, 0, 0, 1].into();
        let lo6: IpAddr = std::net::Ipv6Addr::LOCALHOST.into();
        let other: IpAddr = [10, 0, 0, 1].into();
        let held: Vec<Slot> = (0..300).filter_map(|_| limit.admit(lo)).collect();
        assert_eq!(held.len(), 300, "loopback unbounded");
        assert!(limit.admit(lo6).is_some());
        let _one = limit.admit(other).expect("1st from elsewhere");
        assert!(limit.admit(other).is_none(), "others keep the limit");
        assert!(PerIpLimit::new(1).admit(lo).is_some());
        let plain = PerIpLimit::new(1);
        let _s = plain.admit(lo);
        assert!(
            plain.admit(lo).is_none(),
            "a real deployment limits loopback too"
        );
    }
}
