//! Fuzzing the untrusted edge: arbitrary bytes → `prost` decode → `decode_hello` /
//! `decode_batch`, and arbitrary mutations of a valid batch. Nothing may panic; whatever
//! is accepted must satisfy the limits. Case counts are bounded so this runs in seconds
//! in CI (`PROPTEST_CASES` raises them for a longer local run).

use gpufleet_core::wire::{Limits, decode_batch, decode_hello};
use gpufleet_proto::v1 as pb;
use proptest::prelude::*;
use prost::Message as _;

const NOW_MS: i64 = 1_800_000_000_000;

fn check(bytes: &[u8]) {
    let limits = Limits::default();
    if let Ok(msg) = pb::AgentMessage::decode(bytes) {
        match msg.msg {
            Some(pb::agent_message::Msg::Hello(h)) => {
                if let Ok((_, inv)) = decode_hello(h, &limits) {
                    assert!(inv.gpus.len() <= limits.max_gpus_per_node);
                }
            }
            Some(pb::agent_message::Msg::Batch(b)) => {
                if let Ok(batch) = decode_batch(b, &limits, NOW_MS, &|_| true) {
                    assert!(batch.ticks.len() <= limits.max_ticks_per_batch);
                }
            }
            None => {}
        }
    }
    // The same bytes read directly as each message type.
    if let Ok(h) = pb::Hello::decode(bytes) {
        let _ = decode_hello(h, &limits);
    }
    if let Ok(b) = pb::Batch::decode(bytes) {
        let _ = decode_batch(b.clone(), &limits, NOW_MS, &|_| true);
        let _ = decode_batch(b, &limits, NOW_MS, &|_| false);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check(&bytes);
    }

    /// Random edits of a well-formed batch reach deeper into validation than random bytes.
    #[test]
    fn mutated_batches_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        gpus in 1usize..4,
        ticks in 1usize..4,
    ) {
        let mut bytes = seed_batch(gpus, ticks);
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        check(&bytes);
    }
}

/// A valid batch message, encoded.
fn seed_batch(gpus: usize, ticks: usize) -> Vec<u8> {
    let batch = pb::Batch {
        seq: 7,
        ticks: (0..ticks)
            .map(|t| pb::Tick {
                time_ms: NOW_MS - 1_000 + t as i64,
                gpus: (0..gpus)
                    .map(|g| pb::GpuSample {
                        gpu_uuid: format!("GPU-{g}"),
                        power_mw: Some(250_000),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Batch(batch)),
    }
    .encode_to_vec()
}

#[test]
fn the_seed_batch_is_valid_so_mutations_start_deep() {
    let msg = pb::AgentMessage::decode(seed_batch(2, 3).as_slice()).expect("decodes");
    let Some(pb::agent_message::Msg::Batch(b)) = msg.msg else {
        panic!("a batch");
    };
    let batch = decode_batch(b, &Limits::default(), NOW_MS, &|_| true).expect("valid");
    assert_eq!(batch.ticks.len(), 3);
}
