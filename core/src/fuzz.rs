//! Entry points for coverage-guided fuzzing (`fuzz/`, `cargo fuzz`) and for the test that
//! runs the same functions over the committed seed corpus on every `cargo test`. Each takes
//! arbitrary bytes, decodes them as an agent would send them, and must neither panic nor
//! accept what validation refuses.

use crate::wire::{Limits, decode_batch, decode_hello};
use gpufleet_proto::v1 as pb;
use prost::Message as _;

/// The collector's "now" for batches decoded here (2026-11-23), fixed so runs repeat.
pub const NOW_MS: i64 = 1_795_900_000_000;

/// A `Hello` as protobuf bytes, through [`decode_hello`] with the default limits.
pub fn hello(data: &[u8]) {
    let Ok(h) = pb::Hello::decode(data) else {
        return;
    };
    let limits = Limits::default();
    if let Ok((info, inventory)) = decode_hello(h, &limits) {
        // What validation accepts stays within the limits.
        assert!(info.labels.len() <= limits.max_labels);
        assert!(inventory.gpus.len() <= limits.max_gpus_per_node);
    }
}

/// A `Batch` as protobuf bytes, through [`decode_batch`] with the default limits; GPUs
/// named `GPU-…` are the node's own.
pub fn batch(data: &[u8]) {
    let Ok(b) = pb::Batch::decode(data) else {
        return;
    };
    let limits = Limits::default();
    let known = |uuid: &str| uuid.starts_with("GPU-");
    if let Ok(batch) = decode_batch(b, &limits, NOW_MS, &known) {
        assert!(batch.ticks.len() <= limits.max_ticks_per_batch);
    }
}

/// A timestamp as a user types it, through [`crate::times::parse_time`] and back.
pub fn time(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    if let Ok(ms) = crate::times::parse_time(&s, NOW_MS) {
        assert_eq!(
            crate::times::parse_time(&crate::times::format_time(ms), NOW_MS),
            Ok(ms)
        );
    }
}
