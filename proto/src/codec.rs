//! The gRPC codec of every generated service: prost's encoder, and a decoder that reads a
//! message from one contiguous slice.
//!
//! tonic hands a decoder the whole message in one buffer, but behind a `Buf` whose every
//! `advance` also moves a `BytesMut`'s cursor. prost calls `chunk` and `advance` for every
//! varint and field: through that `Buf` each call goes through the `BytesMut`'s
//! bookkeeping, from a `&[u8]` it is a pointer bump (a batch of process samples has tens
//! of thousands of fields; BENCHMARKS.md has the measurements). The bytes, the result and
//! the errors are those of `tonic_prost::ProstCodec`.

use prost::Message;
use prost::bytes::Buf;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// `tonic_prost::ProstCodec` with [`SliceDecoder`] in place of its decoder.
#[derive(Debug, Clone)]
pub struct SliceCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for SliceCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for SliceCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder { _pd: PhantomData }
    }
}

/// Decodes a `U` from the message's bytes as one slice when tonic holds them in one
/// chunk (it always has: its buffer is a `BytesMut`), and through the `Buf` otherwise.
#[derive(Debug, Clone)]
pub struct SliceDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let len = buf.remaining();
        let item = if buf.chunk().len() == len {
            let item = U::decode(buf.chunk());
            buf.advance(len);
            item
        } else {
            U::decode(buf)
        };
        // As ProstCodec: a message that does not parse is INTERNAL, per gRPC's status codes.
        item.map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1 as pb;
    use http_body::{Body, Frame};
    use prost::bytes::Bytes;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tonic::codec::Streaming;

    /// A request body that yields its bytes in the given pieces.
    struct Pieces(Vec<Bytes>);

    impl Body for Pieces {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            let next = (!self.0.is_empty()).then(|| Ok(Frame::data(self.0.remove(0))));
            Poll::Ready(next)
        }
    }

    /// gRPC's length-prefixed framing of each message, cut into pieces of `cut` bytes.
    fn framed(messages: &[Vec<u8>], cut: usize) -> Pieces {
        let mut all = Vec::new();
        for m in messages {
            all.push(0u8);
            let len = u32::try_from(m.len()).expect("a test message is under 4 GiB");
            all.extend_from_slice(&len.to_be_bytes());
            all.extend_from_slice(m);
        }
        Pieces(all.chunks(cut).map(Bytes::copy_from_slice).collect())
    }

    /// Every message of the body, or the first error, decoded by `D`.
    async fn decode_all<D>(decoder: D, body: Pieces) -> Result<Vec<pb::AgentMessage>, Status>
    where
        D: Decoder<Item = pb::AgentMessage, Error = Status> + Send + 'static,
    {
        let mut stream = Streaming::new_request(decoder, body, None, None);
        let mut out = Vec::new();
        while let Some(m) = stream.message().await? {
            out.push(m);
        }
        Ok(out)
    }

    fn batch(seq: u64) -> pb::AgentMessage {
        let process = |pid: u32| pb::ProcessSample {
            gpu_uuid: "GPU-0000".into(),
            pid,
            user: Some("ålice".into()),
            command: Some("python train.py".into()),
            gpu_mem_bytes: Some(1 << 30),
            sm_util_pct: pid.is_multiple_of(2).then_some(50),
            workload: Some(pb::Workload {
                kind: pb::WorkloadKind::Container.into(),
                runtime: "containerd".into(),
                container_id: Some(format!("{pid:064x}")),
                ..Default::default()
            }),
            ..Default::default()
        };
        let tick = |t: i64| pb::Tick {
            time_ms: 1_700_000_000_000 + t * 1000,
            gpus: vec![pb::GpuSample {
                gpu_uuid: "GPU-0000".into(),
                power_mw: Some(250_000 + t as u32),
                ..Default::default()
            }],
            processes: (0..3).map(|p| process(1000 + p)).collect(),
            ..Default::default()
        };
        pb::AgentMessage {
            msg: Some(pb::agent_message::Msg::Batch(pb::Batch {
                seq,
                ticks: (0..4).map(tick).collect(),
                ..Default::default()
            })),
        }
    }

    #[tokio::test]
    async fn decodes_each_message_of_a_stream_as_prost_does() {
        let sent: Vec<pb::AgentMessage> = (1..=5).map(batch).collect();
        let bytes: Vec<Vec<u8>> = sent.iter().map(Message::encode_to_vec).collect();
        // Pieces that split the frames and messages at every kind of boundary.
        for cut in [1, 7, 64, 1 << 20] {
            let ours = decode_all(SliceDecoder { _pd: PhantomData }, framed(&bytes, cut)).await;
            let prost = decode_all(tonic_prost::ProstDecoder::default(), framed(&bytes, cut)).await;
            assert_eq!(ours.as_ref().ok(), Some(&sent), "cut {cut}");
            assert_eq!(ours.ok(), prost.ok(), "cut {cut}");
        }
    }

    #[tokio::test]
    async fn a_message_that_does_not_parse_is_the_status_prost_gives() {
        let good = batch(1).encode_to_vec();
        let broken: [&[u8]; 3] = [
            &good[..good.len() - 1],   // cut short inside a field
            &[0x12, 0x02, 0x0a, 0xff], // Batch.seq with the wire type of a string
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ], // varint over 64 bits
        ];
        for b in broken {
            let body = || framed(&[good.clone(), b.to_vec()], 5);
            let ours = decode_all(SliceDecoder { _pd: PhantomData }, body()).await;
            let prost = decode_all(tonic_prost::ProstDecoder::default(), body()).await;
            let (Err(ours), Err(prost)) = (ours, prost) else {
                panic!("{b:?} decoded");
            };
            assert_eq!(ours.code(), tonic::Code::Internal);
            assert_eq!(
                (ours.code(), ours.message()),
                (prost.code(), prost.message())
            );
        }
    }
}
