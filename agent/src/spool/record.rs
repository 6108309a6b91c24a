//! The segment record format (`len | crc32c | tick id | tick`), its encoding and
//! decoding, and scanning a segment on open.

use super::config::{SpoolError, io_err};
use super::{CRC, HEADER, MAX_RECORD};
use gpufleet_core::Tick;
use gpufleet_core::wire::{Limits, decode_batch};
use gpufleet_proto::v1 as pb;
use prost::Message;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use tracing::warn;

pub(super) fn seg_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("seg-{first:020}.log"))
}

/// Writes the record of tick `id` with encoded tick `tick` into `rec` (cleared first).
pub(super) fn encode_record(rec: &mut Vec<u8>, id: u64, tick: &[u8]) {
    let id = id.to_le_bytes();
    let mut crc = CRC.digest();
    crc.update(&id);
    crc.update(tick);
    rec.clear();
    rec.extend_from_slice(&((id.len() + tick.len()) as u32).to_le_bytes());
    rec.extend_from_slice(&crc.finalize().to_le_bytes());
    rec.extend_from_slice(&id);
    rec.extend_from_slice(tick);
}

/// Decodes a record's payload (after its checksum matched). `Err` carries the tick id and
/// GPU samples of a record that does not convert (counted as dropped).
pub(super) fn decode_payload(payload: &[u8]) -> Result<(u64, Tick), (u64, u64)> {
    let id = payload
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or((0, 0))?;
    let t = pb::Tick::decode(payload.get(8..).unwrap_or_default()).map_err(|_| (id, 0))?;
    let samples = t.gpus.len() as u64;
    let limits = Limits {
        max_future_skew_ms: i64::MAX / 4,
        max_age_ms: i64::MAX / 4,
        ..Limits::default()
    };
    let b = pb::Batch {
        seq: 1,
        ticks: vec![t],
        delivery: None,
    };
    let mut batch = decode_batch(b, &limits, 0, &|_| true).map_err(|_| (id, samples))?;
    batch.ticks.pop().map(|t| (id, t)).ok_or((id, samples))
}

/// A record read back while scanning a segment.
pub(super) struct Scanned {
    pub(super) id: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
    /// The tick, or the GPU samples of a record that does not convert.
    pub(super) tick: Result<Tick, u64>,
}

/// Reads every valid record of a segment; returns them and the length of the valid prefix.
pub(super) fn scan_segment(path: &Path) -> Result<(Vec<Scanned>, u64, u64), SpoolError> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(io_err(path))?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= data.len() {
        let len = u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize;
        let crc = u32::from_le_bytes([data[at + 4], data[at + 5], data[at + 6], data[at + 7]]);
        let start = at + HEADER;
        if len > MAX_RECORD || start + len > data.len() {
            break;
        }
        let payload = &data[start..start + len];
        if CRC.checksum(payload) != crc {
            break;
        }
        let (id, tick) = match decode_payload(payload) {
            Ok((id, t)) => (id, Ok(t)),
            Err((0, _)) => break,
            Err((id, samples)) => (id, Err(samples)),
        };
        out.push(Scanned {
            id,
            offset: start as u64,
            len: len as u32,
            tick,
        });
        at = start + len;
    }
    Ok((out, at as u64, data.len() as u64))
}

pub(super) fn fsync_dir(dir: &Path) {
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        warn!(dir = %dir.display(), error = %e, "cannot fsync the spool directory");
    }
}
