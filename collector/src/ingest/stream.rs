//! gRPC ingest: the server side of `gpufleet.v1.Ingest/Stream`.
//!
//! One bidirectional stream per agent connection:
//! 1. The first message must be a Hello. It is validated (`decode_hello`), the node and its
//!    GPUs are registered in the store, and the stream answers `Welcome` (with the highest
//!    seq already stored, so the agent can trim its spool). A missing or malformed Hello
//!    ends the call with `INVALID_ARGUMENT` and a message saying why; a Hello listing a
//!    GPU another node registered ends it with `PERMISSION_DENIED` naming the GPU.
//! 2. Each Batch is validated against [`Limits`] and the node's inventory. An invalid batch
//!    is answered `Reject { retryable: false }` naming the offending field; the stream stays
//!    open. A valid batch goes to the group-commit writer ([`crate::ingest::writer`]) and is
//!    answered `Ack` only after its transaction committed, or `Reject { UNAVAILABLE,
//!    retryable: true }` when the store failed, or `Reject { CONFLICT }` when its samples
//!    collide with stored ones of other values (not a replay). A seq more than
//!    [`IngestOptions::max_seq_ahead`] above the node's stored seq is refused
//!    (`OUT_OF_ORDER`). Answers come in the order batches arrived.
//!
//! Backpressure: a stream has at most `max_in_flight` batches waiting for their commit;
//! beyond that it stops reading, and when the writer's queue is full, submitting waits.
//! Either way HTTP/2 flow control slows the agent down; nothing is dropped.
//!
//! On shutdown a stream stops reading, answers the batches it already handed to the writer
//! (which commits them), and ends with `UNAVAILABLE` so the agent reconnects later.

use crate::ingest::writer::{WriteResult, WriterHandle};
use crate::live::state::Live;
use crate::metrics::Metrics;
use crate::store::{IngestWrites, NodeBatch, NodeKeys, StoreError, TokenStore};
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use gpufleet_core::config::now_ms;
use gpufleet_core::wire::{Invalid, Limits, decode_batch, decode_hello};
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::agent_message::Msg as AgentMsg;
use gpufleet_proto::v1::collector_message::Msg as CollectorMsg;
use gpufleet_proto::v1::ingest_server::{Ingest, IngestServer};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, error, info, warn};

/// Default of [`IngestOptions::max_seq_ahead`]: 2^32 batches, decades of an agent's
/// batches at several a second, far below where a u64 seq could overflow.
pub const DEFAULT_MAX_SEQ_AHEAD: u64 = 1 << 32;

/// How the ingest service treats agents.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// What a batch may contain (and how old / far in the future its samples may be).
    pub limits: Limits,
    /// Largest gRPC message accepted (also announced in `Welcome`).
    pub max_message_bytes: usize,
    /// Batches of one stream waiting for their commit before the stream stops reading.
    pub max_in_flight: usize,
    /// How long a new stream may take to send its Hello.
    pub hello_timeout: Duration,
    /// How far above the node's highest stored seq (as of its Hello) a batch's seq may
    /// be. An agent numbers new batches just above it (plus what it spooled while
    /// disconnected); a seq beyond this is refused, so no batch can push the node's
    /// `last_acked_seq` to an absurd value that its agent's later seqs could not pass.
    pub max_seq_ahead: u64,
    /// Whether agents must present a token or client certificate ([`crate::ingest::identity`]).
    pub agent_auth: crate::ingest::identity::AgentAuth,
}

impl Default for IngestOptions {
    fn default() -> Self {
        IngestOptions {
            limits: Limits::default(),
            max_message_bytes: 16 << 20,
            max_in_flight: 16,
            hello_timeout: Duration::from_secs(30),
            max_seq_ahead: DEFAULT_MAX_SEQ_AHEAD,
            agent_auth: crate::ingest::identity::AgentAuth::Auto,
        }
    }
}

/// The `gpufleet.v1.Ingest` service.
#[derive(Debug, Clone)]
pub struct IngestService {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Node registrations.
    store: Arc<dyn IngestWrites>,
    /// Agent tokens, checked at Hello.
    tokens: Arc<dyn TokenStore>,
    writer: WriterHandle,
    live: Arc<Live>,
    metrics: Arc<Metrics>,
    options: IngestOptions,
    /// Cancelled when the collector shuts down: streams stop reading and end.
    shutdown: CancellationToken,
}

type Outbound = mpsc::Sender<Result<pb::CollectorMessage, Status>>;

impl IngestService {
    pub fn new(
        store: Arc<dyn IngestWrites>,
        tokens: Arc<dyn TokenStore>,
        writer: WriterHandle,
        live: Arc<Live>,
        metrics: Arc<Metrics>,
        options: IngestOptions,
        shutdown: CancellationToken,
    ) -> IngestService {
        IngestService {
            shared: Arc::new(Shared {
                store,
                tokens,
                writer,
                live,
                metrics,
                options,
                shutdown,
            }),
        }
    }

    /// The tonic service, with the message size limit applied.
    pub fn into_server(self) -> IngestServer<IngestService> {
        let max = self.shared.options.max_message_bytes;
        IngestServer::new(self).max_decoding_message_size(max)
    }
}

#[tonic::async_trait]
impl Ingest for IngestService {
    type StreamStream = ReceiverStream<Result<pb::CollectorMessage, Status>>;

    async fn stream(
        &self,
        mut request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let s = &self.shared;
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let peer_certs = request.peer_certs();
        let metadata = std::mem::take(request.metadata_mut());
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(s.options.hello_timeout, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "no Hello within {} s of opening the stream",
                    s.options.hello_timeout.as_secs()
                ))
            })??;
        let hello = match first {
            Some(pb::AgentMessage {
                msg: Some(AgentMsg::Hello(h)),
            }) => h,
            Some(pb::AgentMessage {
                msg: Some(AgentMsg::Batch(b)),
            }) => {
                return Err(Status::invalid_argument(format!(
                    "the first message on a stream must be Hello, got Batch seq {}",
                    b.seq
                )));
            }
            Some(pb::AgentMessage { msg: None }) => {
                return Err(Status::invalid_argument(
                    "the first message on a stream must be Hello, got an empty message",
                ));
            }
            None => {
                return Err(Status::invalid_argument(
                    "the stream ended before its Hello",
                ));
            }
        };
        let (info, inventory) = decode_hello(hello, &s.options.limits)
            .map_err(|e| Status::invalid_argument(format!("malformed Hello: {e}")))?;
        if info.node.trim().is_empty() {
            return Err(Status::invalid_argument(
                "malformed Hello: node is empty; the agent must name its node",
            ));
        }
        crate::ingest::identity::authorize(
            s.tokens.as_ref(),
            s.options.agent_auth,
            &metadata,
            peer_certs.as_deref().map(Vec::as_slice),
            &info.node,
        )
        .await?;
        let record = s
            .store
            .register_node(&info, &inventory, now_ms())
            .await
            .map_err(|e| {
                if let StoreError::GpuOwned { uuid, owner } = &e {
                    warn!(node = %info.node, peer = %peer, gpu = %uuid, owner = %owner, "node refused: it claims another node's GPU");
                } else {
                    error!(node = %info.node, error = %e, "cannot register node");
                }
                store_status(&e)
            })?;
        let welcome = pb::Welcome {
            node: record.name.clone(),
            last_acked_seq: record.last_acked_seq,
            max_ticks_per_batch: u32::try_from(s.options.limits.max_ticks_per_batch)
                .unwrap_or(u32::MAX),
            max_message_bytes: u32::try_from(s.options.max_message_bytes).unwrap_or(u32::MAX),
            collector_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let keys = Arc::new(record.keys());
        let welcome_seq = record.last_acked_seq;
        info!(
            node = %record.name,
            peer = %peer,
            gpus = record.gpus.len(),
            agent_version = %record.agent_version,
            last_acked_seq = record.last_acked_seq,
            "node connected"
        );
        s.live.connected(record);
        s.metrics.streams_active.fetch_add(1, Relaxed);

        // Room for every in-flight answer plus the Welcome and a final status, so the
        // session only waits on sending when the agent does not read its answers.
        let (out, rx) = mpsc::channel(s.options.max_in_flight + 2);
        let _ = out.send(Ok(message(CollectorMsg::Welcome(welcome)))).await;
        let session = Session {
            shared: Arc::clone(&self.shared),
            keys,
            welcome_seq,
        };
        tokio::spawn(session.run(inbound, out));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One agent's stream after its Hello.
struct Session {
    shared: Arc<Shared>,
    keys: Arc<NodeKeys>,
    /// The node's highest stored seq when the stream began (its Welcome): seqs more than
    /// [`IngestOptions::max_seq_ahead`] above it are refused.
    welcome_seq: u64,
}

impl Session {
    async fn run(self, mut inbound: Streaming<pb::AgentMessage>, out: Outbound) {
        let s = Arc::clone(&self.shared);
        let mut pending = FuturesOrdered::new();
        let mut end: Option<Status> = None;
        loop {
            tokio::select! {
                biased;
                () = s.shutdown.cancelled() => {
                    end = Some(Status::unavailable(
                        "the collector is shutting down; reconnect and resend unacknowledged batches",
                    ));
                    break;
                }
                Some((seq, result)) = pending.next(), if !pending.is_empty() => {
                    if self.answer(&out, seq, result).await.is_err() {
                        break; // the agent is gone
                    }
                }
                msg = inbound.message(), if pending.len() < s.options.max_in_flight => match msg {
                    Ok(Some(pb::AgentMessage { msg: Some(AgentMsg::Batch(b)) })) => {
                        let seq = b.seq;
                        match self.batch(b, &out).await {
                            Ok(Some(rx)) => pending.push_back(async move { (seq, rx.await) }),
                            Ok(None) => {}
                            Err(()) => break,
                        }
                    }
                    Ok(Some(pb::AgentMessage { msg: Some(AgentMsg::Hello(_)) })) => {
                        end = Some(Status::invalid_argument("Hello may be sent only once per stream"));
                        break;
                    }
                    Ok(Some(pb::AgentMessage { msg: None })) => {
                        end = Some(Status::invalid_argument("empty AgentMessage: expected a Batch"));
                        break;
                    }
                    Ok(None) => break, // the agent finished sending
                    Err(status) => {
                        debug!(node = %self.keys.name, status = %status, "stream read failed");
                        end = Some(status);
                        break;
                    }
                }
            }
        }
        // The writer commits what it was given whatever happens here; answer it.
        while let Some((seq, result)) = pending.next().await {
            let _ = self.answer(&out, seq, result).await;
        }
        if let Some(status) = end {
            let _ = out.send(Err(status)).await;
        }
        s.live.disconnected(&self.keys.name);
        s.metrics.streams_active.fetch_sub(1, Relaxed);
        info!(node = %self.keys.name, "node disconnected");
    }

    /// Validates a batch and hands it to the writer. Returns the receiver of its commit
    /// result, `None` when it was refused here, `Err` when the agent is gone.
    async fn batch(
        &self,
        b: pb::Batch,
        out: &Outbound,
    ) -> Result<Option<oneshot::Receiver<WriteResult>>, ()> {
        let s = &self.shared;
        let seq = b.seq;
        let keys = &self.keys;
        let max_seq = self.welcome_seq.saturating_add(s.options.max_seq_ahead);
        if seq > max_seq {
            s.metrics.batches_rejected_seq.fetch_add(1, Relaxed);
            s.live.rejected(&keys.name);
            warn!(node = %keys.name, seq, max_seq, "batch rejected: seq out of range");
            let reject = pb::Reject {
                seq,
                code: pb::RejectCode::OutOfOrder as i32,
                reason: format!(
                    "seq {seq} is more than {} above {}, this node's highest stored seq when \
                     the stream began; number batches upwards from Welcome.last_acked_seq",
                    s.options.max_seq_ahead, self.welcome_seq
                ),
                retryable: false,
            };
            return send(out, CollectorMsg::Reject(reject)).await.map(|()| None);
        }
        let known = |uuid: &str| keys.gpus.contains_key(uuid);
        let batch = match decode_batch(b, &s.options.limits, now_ms(), &known) {
            Ok(batch) => batch,
            Err(invalid) => {
                let (code, counter) = match &invalid {
                    Invalid::Invalid(_) => {
                        (pb::RejectCode::Invalid, &s.metrics.batches_rejected_invalid)
                    }
                    Invalid::TooLarge(_) => (
                        pb::RejectCode::TooLarge,
                        &s.metrics.batches_rejected_too_large,
                    ),
                };
                counter.fetch_add(1, Relaxed);
                s.live.rejected(&keys.name);
                warn!(node = %keys.name, seq, reason = %invalid, "batch rejected");
                let reject = pb::Reject {
                    seq,
                    code: code as i32,
                    reason: invalid.to_string(),
                    retryable: false,
                };
                return send(out, CollectorMsg::Reject(reject)).await.map(|()| None);
            }
        };
        match s
            .writer
            .submit(NodeBatch {
                keys: Arc::clone(keys),
                batch,
            })
            .await
        {
            Ok(rx) => Ok(Some(rx)),
            Err(_closed) => {
                s.metrics.batches_rejected_unavailable.fetch_add(1, Relaxed);
                let reject = unavailable(seq, "the collector is shutting down; resend later");
                send(out, CollectorMsg::Reject(reject)).await.map(|()| None)
            }
        }
    }

    /// Answers a batch whose commit finished: Ack, or a retryable Reject.
    async fn answer(
        &self,
        out: &Outbound,
        seq: u64,
        result: Result<WriteResult, oneshot::error::RecvError>,
    ) -> Result<(), ()> {
        let s = &self.shared;
        let msg = match result {
            Ok(Ok(())) => {
                s.metrics.batches_acked.fetch_add(1, Relaxed);
                CollectorMsg::Ack(pb::Ack { seq })
            }
            Ok(Err(e)) if matches!(*e, StoreError::Conflict { .. }) => {
                s.metrics.batches_rejected_conflict.fetch_add(1, Relaxed);
                s.live.rejected(&self.keys.name);
                CollectorMsg::Reject(pb::Reject {
                    seq,
                    code: pb::RejectCode::Conflict as i32,
                    reason: e.to_string(),
                    retryable: false,
                })
            }
            Ok(Err(e)) => {
                s.metrics.batches_rejected_unavailable.fetch_add(1, Relaxed);
                warn!(node = %self.keys.name, seq, error = %e, "batch not stored; refused as retryable");
                CollectorMsg::Reject(unavailable(
                    seq,
                    "the collector could not store this batch (storage unavailable); retry later",
                ))
            }
            Err(_) => {
                s.metrics.batches_rejected_unavailable.fetch_add(1, Relaxed);
                CollectorMsg::Reject(unavailable(
                    seq,
                    "the collector is shutting down; resend later",
                ))
            }
        };
        send(out, msg).await
    }
}

fn message(msg: CollectorMsg) -> pb::CollectorMessage {
    pb::CollectorMessage { msg: Some(msg) }
}

async fn send(out: &Outbound, msg: CollectorMsg) -> Result<(), ()> {
    out.send(Ok(message(msg))).await.map_err(|_| ())
}

fn unavailable(seq: u64, reason: &str) -> pb::Reject {
    pb::Reject {
        seq,
        code: pb::RejectCode::Unavailable as i32,
        reason: reason.to_owned(),
        retryable: true,
    }
}

/// A store error as agents see it: what to do, without the database's details (those are
/// in the collector's log).
fn store_status(e: &StoreError) -> Status {
    if let StoreError::GpuOwned { .. } = e {
        return Status::permission_denied(e.to_string());
    }
    if e.is_transient() {
        Status::unavailable("the collector's storage is unavailable; retry later")
    } else {
        Status::internal("the collector could not register this node; see the collector's log")
    }
}
