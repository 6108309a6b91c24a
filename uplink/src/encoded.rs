//! A tick encoded once: the sampling thread turns each tick into its protobuf bytes
//! (`gpufleet.v1.Tick`), the outbox keeps (and the spool writes) those bytes, and the
//! uplink sends them as they are. Nothing decodes or re-encodes a tick on its way out.
//!
//! The uplink's messages are [`RawAgentMessage`] / [`RawBatch`]: wire-identical to
//! `gpufleet.v1.AgentMessage` / `Batch` (a `repeated bytes` field and a `repeated Tick`
//! field are both length-delimited records under the same tag), so the collector reads
//! them as the generated types.

use gpufleet_core::{DeliveryStats, Tick};
use gpufleet_proto::v1 as pb;
use prost::Message;
use prost::bytes::Bytes;

/// A tick's protobuf bytes and what the outbox needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedTick {
    /// The encoded `gpufleet.v1.Tick`.
    pub bytes: Bytes,
    /// GPU samples in it (the unit of the delivery counters).
    pub samples: u64,
}

impl EncodedTick {
    /// Encodes `tick` (consumed: no copy of its strings).
    pub fn new(tick: Tick) -> Self {
        let samples = tick.gpus.len() as u64;
        let bytes = Bytes::from(pb::Tick::from(tick).encode_to_vec());
        Self { bytes, samples }
    }

    /// Bytes it adds to a batch message: the record, its tag and its length.
    pub fn wire_bytes(&self) -> usize {
        wire_bytes(self.bytes.len())
    }
}

/// Bytes a tick record of `len` bytes adds to a batch message (tag, varint length, record).
pub fn wire_bytes(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// A batch ready to send: its seq, its ticks' bytes (oldest first) and the delivery state.
#[derive(Debug, Clone, PartialEq)]
pub struct OutBatch {
    /// The batch's seq.
    pub seq: u64,
    /// The encoded ticks.
    pub ticks: Vec<Bytes>,
    /// The agent's delivery counters when it was sent.
    pub delivery: DeliveryStats,
}

impl OutBatch {
    /// The message the uplink sends.
    pub fn into_message(self) -> RawAgentMessage {
        RawAgentMessage {
            hello: None,
            batch: Some(RawBatch {
                seq: self.seq,
                ticks: self.ticks,
                delivery: Some(pb::DeliveryStats {
                    dropped_samples: self.delivery.dropped_samples,
                    spool_backlog_batches: self.delivery.spool_backlog_batches,
                    spool_backlog_bytes: self.delivery.spool_backlog_bytes,
                }),
            }),
        }
    }

    /// The ticks decoded (for tests and diagnostics; the send path never decodes).
    pub fn decoded(&self) -> Vec<Tick> {
        self.ticks
            .iter()
            .map(|b| {
                let t = pb::Tick::decode(b.as_ref()).unwrap_or_default();
                let batch = pb::Batch {
                    seq: 1,
                    ticks: vec![t],
                    delivery: None,
                };
                let limits = gpufleet_core::wire::Limits {
                    max_future_skew_ms: i64::MAX / 4,
                    max_age_ms: i64::MAX / 4,
                    ..Default::default()
                };
                gpufleet_core::wire::decode_batch(batch, &limits, 0, &|_| true)
                    .ok()
                    .and_then(|mut b| b.ticks.pop())
                    .unwrap_or_default()
            })
            .collect()
    }
}

/// `gpufleet.v1.AgentMessage` with the batch's ticks as pre-encoded bytes.
#[derive(Clone, PartialEq, Message)]
pub struct RawAgentMessage {
    /// `AgentMessage.hello` (oneof member 1).
    #[prost(message, optional, tag = "1")]
    pub hello: Option<pb::Hello>,
    /// `AgentMessage.batch` (oneof member 2).
    #[prost(message, optional, tag = "2")]
    pub batch: Option<RawBatch>,
}

/// `gpufleet.v1.Batch` with `ticks` as the encoded `Tick` records.
#[derive(Clone, PartialEq, Message)]
pub struct RawBatch {
    /// `Batch.seq`.
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// `Batch.ticks`, each an encoded `gpufleet.v1.Tick`.
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub ticks: Vec<Bytes>,
    /// `Batch.delivery`.
    #[prost(message, optional, tag = "3")]
    pub delivery: Option<pb::DeliveryStats>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::GpuSource;

    fn ticks(n: usize) -> Vec<Tick> {
        let mut sim =
            gpufleet_sim::simulator(gpufleet_sim::SimOptions::new("enc", 8)).expect("sim");
        (0..n)
            .map(|i| {
                sim.sample(1_790_000_000_000 + i as i64 * 1000)
                    .expect("tick")
            })
            .collect()
    }

    #[test]
    fn a_raw_batch_is_byte_for_byte_the_generated_batch() {
        let ticks = ticks(3);
        let delivery = DeliveryStats {
            dropped_samples: 4,
            spool_backlog_batches: 2,
            spool_backlog_bytes: 9000,
        };
        let generated = pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Batch(
                gpufleet_core::Batch {
                    seq: 7,
                    ticks: ticks.clone(),
                    delivery,
                }
                .into(),
            )),
        };
        let encoded: Vec<EncodedTick> = ticks.iter().cloned().map(EncodedTick::new).collect();
        let raw = OutBatch {
            seq: 7,
            ticks: encoded.iter().map(|e| e.bytes.clone()).collect(),
            delivery,
        };
        assert_eq!(raw.decoded(), ticks, "the bytes hold the ticks");
        let raw = raw.into_message();
        assert_eq!(raw.encode_to_vec(), generated.encode_to_vec());
        assert_eq!(
            pb::AgentMessage::decode(raw.encode_to_vec().as_slice()).expect("decodes"),
            generated
        );
        let body: usize = encoded.iter().map(EncodedTick::wire_bytes).sum();
        let pb::agent_message::Msg::Batch(b) = generated.msg.expect("batch") else {
            unreachable!()
        };
        assert_eq!(
            body,
            b.encoded_len() - pb::Batch { ticks: vec![], ..b }.encoded_len(),
            "wire_bytes is exact"
        );
        assert_eq!(encoded[0].samples, 8);
    }

    #[test]
    fn a_hello_is_the_generated_hello() {
        let hello = pb::Hello {
            node: "n".into(),
            ..Default::default()
        };
        let raw = RawAgentMessage {
            hello: Some(hello.clone()),
            batch: None,
        };
        let generated = pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Hello(hello)),
        };
        assert_eq!(raw.encode_to_vec(), generated.encode_to_vec());
    }
}
