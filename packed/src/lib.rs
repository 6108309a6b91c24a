//! The packed form of a closed interval of raw samples: one value per GPU (or node) per
//! minute holding that minute's samples column by column, each column delta-, delta-of-
//! delta- or XOR-encoded as varints ([`columns`]), the whole deflate-compressed.
//!
//! What a packed minute gives back is exactly what the row tables give back for the same
//! samples: every field at full resolution, absent values absent (a presence map per
//! column), GPU samples without their UUID (the GPU is the row's key, as in
//! `gpu_samples`), process ticks with their lifetime id (identity in `process_lives`),
//! host rows as [`HostRow`] (a reading whose metrics are all absent is no reading).
//!
//! Layout of a packed value: format version, compression (0 none, 1 deflate), the
//! CRC-32C of the payload (4 bytes, little-endian), then the payload, compressed or not.
//! Format 2 is format 1 whose columns may also be pcodec's ([`columns`]): values written
//! before it read as they were, and a collector that knows only format 1 says so instead
//! of calling the new values corrupt.
//! Payloads: [`gpu`], [`process`], [`host`], [`health`] (an hour of a GPU's health
//! readings, not a minute: they come every 30 s). Packing refuses what unpacking would refuse
//! ([`PackError::TooLarge`]: the caller keeps those rows as they are); unpacking checks
//! every count against the limits below before it allocates.

/// A field of `T` as a column: its reader, and its writer (a value out of the field's
/// range is corruption).
type Field<T> = (
    fn(&T) -> Option<u64>,
    fn(&mut T, Option<u64>) -> Result<(), PackError>,
);

/// The [`Field`]s of a struct, each named with its kind: `u64`, `u32`, `f32` (packed as
/// its bits), or `bool` (0 or 1).
macro_rules! fields {
    ($ty:ty; $($name:ident: $kind:ident),* $(,)?) => {
        &[$((
            |s: &$ty| fields!(@get $kind, s.$name),
            |s: &mut $ty, v: Option<u64>| {
                s.$name = fields!(@set $kind, v);
                Ok(())
            },
        )),*]
    };
    (@get u64, $e:expr) => { $e };
    (@get u32, $e:expr) => { $e.map(u64::from) };
    (@get f32, $e:expr) => { $e.map(|f| u64::from(f.to_bits())) };
    (@get bool, $e:expr) => { $e.map(u64::from) };
    (@set u64, $v:ident) => { $v };
    (@set u32, $v:ident) => { $crate::narrow($v)? };
    (@set f32, $v:ident) => { $crate::narrow($v)?.map(f32::from_bits) };
    (@set bool, $v:ident) => { $crate::flag($v)? };
}

use gpufleet_core::{HostSample, SamplerCost, UnixMs};

/// One stored host row: the host metrics and the sampler's cost of one tick.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRow {
    pub time_ms: UnixMs,
    /// `None` when every host metric was absent.
    pub sample: Option<HostSample>,
    /// `None` when the tick carried no cost figures.
    pub cost: Option<SamplerCost>,
}

mod columns;
pub mod fuzz;
pub mod gpu;
pub mod health;
pub mod host;
pub mod process;
pub mod rollup;

use flate2::read::DeflateDecoder;
use flate2::{Compress, Compression, FlushCompress, Status};
use std::cell::RefCell;
use std::io::Read;
use thiserror::Error;

/// The format written; both are read.
const FORMAT: u8 = 2;
const FORMAT_WITHOUT_PCO: u8 = 1;
const RAW: u8 = 0;
const DEFLATE: u8 = 1;
const HEADER: usize = 6;
/// Slice-by-16: a chart checks every packed value it reads, and the one-byte table made
/// the checksum a fifth of a long chart's time.
const CRC: crc::Crc<u32, crc::Table<16>> = crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISCSI);
/// Most bytes a payload may have: far above a minute of 1 ms ticks of a GPU with every
/// field and 18 links, far below what would hurt the collector.
const MAX_PAYLOAD: usize = 16 << 20;
/// Most rows one packed value of GPU samples or host rows may hold: their times are
/// distinct milliseconds, so a minute holds at most 60,000.
pub const MAX_ROWS: usize = 1 << 16;
/// Most process ticks one packed value may hold (a minute of 1 s ticks of 4,096
/// processes, as many as a tick may carry).
pub const MAX_PROCESS_ROWS: usize = 1 << 18;
/// Most NVLink links one GPU sample may have (NVML knows 18).
pub const MAX_LINKS: usize = 64;
/// Most slowest calls one host row may name, and the longest name (as the wire decoder
/// keeps them).
pub const MAX_CALLS: usize = 16;
pub const MAX_CALL_NAME: usize = 64;

/// A packed value that cannot be read back.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PackError {
    #[error("packed samples end early")]
    Truncated,
    #[error("packed samples are corrupt: {0}")]
    Corrupt(&'static str),
    #[error("packed samples of format {0}, this collector reads formats 1 and 2")]
    Format(u8),
    #[error("packed samples fail their checksum")]
    Checksum,
    #[error("too much to pack in one value: {0}")]
    TooLarge(&'static str),
}

/// `payload` with the header, compressed when that makes it smaller.
fn seal(payload: &[u8]) -> Result<Vec<u8>, PackError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(PackError::TooLarge("payload"));
    }
    let header = |compression: u8| {
        let mut out = vec![FORMAT, compression];
        out.extend_from_slice(&CRC.checksum(payload).to_le_bytes());
        out
    };
    Ok(match deflate(header(DEFLATE), payload) {
        Ok(out) if out.len() < payload.len() + HEADER => out,
        _ => {
            let mut out = header(RAW);
            out.extend_from_slice(payload);
            out
        }
    })
}

thread_local! {
    /// One raw-deflate compressor per thread, reset between values: a new one allocates
    /// and zeroes some 300 KiB of tables, several times the work of compressing a
    /// minute's payload of a few KiB.
    static DEFLATER: RefCell<Compress> = RefCell::new(Compress::new(Compression::default(), false));
}

/// `bytes` deflated after `head`, as [`seal`] compresses a payload: a raw deflate stream
/// at the default level, the same bytes a new `DeflateEncoder` writes.
fn deflate(mut out: Vec<u8>, bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    DEFLATER.with_borrow_mut(|c| {
        c.reset();
        out.reserve(bytes.len() / 2 + 64);
        loop {
            let (read, written) = (c.total_in(), c.total_out());
            let rest = usize::try_from(read)
                .ok()
                .and_then(|r| bytes.get(r..))
                .unwrap_or_default();
            match c.compress_vec(rest, &mut out, FlushCompress::Finish) {
                Ok(Status::StreamEnd) => return Ok(out),
                // With room to write, finishing always moves on; a compressor that does
                // not is an error, not a loop.
                Ok(_) if (c.total_in(), c.total_out()) == (read, written) => {
                    return Err(std::io::Error::other("deflate made no progress"));
                }
                Ok(_) => out.reserve(out.capacity().max(64)),
                Err(e) => return Err(std::io::Error::other(e)),
            }
        }
    })
}

/// The payload of a value written by [`seal`], its checksum checked.
fn open(packed: &[u8]) -> Result<Vec<u8>, PackError> {
    let (&format, rest) = packed.split_first().ok_or(PackError::Truncated)?;
    if format != FORMAT && format != FORMAT_WITHOUT_PCO {
        return Err(PackError::Format(format));
    }
    let (head, body) = rest.split_at_checked(5).ok_or(PackError::Truncated)?;
    let [compression, crc @ ..] = head else {
        return Err(PackError::Truncated);
    };
    let payload = match *compression {
        RAW => body.to_vec(),
        DEFLATE => {
            let mut out = Vec::new();
            DeflateDecoder::new(body)
                .take(MAX_PAYLOAD as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|_| PackError::Corrupt("deflate stream"))?;
            out
        }
        _ => return Err(PackError::Corrupt("unknown compression")),
    };
    if payload.len() > MAX_PAYLOAD {
        return Err(PackError::Corrupt("payload too large"));
    }
    if CRC.checksum(&payload).to_le_bytes() != crc {
        return Err(PackError::Checksum);
    }
    Ok(payload)
}

/// A `u64` column value as a `u32` field (a larger one is corruption, not truncation).
fn narrow(v: Option<u64>) -> Result<Option<u32>, PackError> {
    v.map(|v| u32::try_from(v).map_err(|_| PackError::Corrupt("a 32-bit field out of range")))
        .transpose()
}

/// A `u64` column value as a flag (anything but 0 or 1 is corruption).
fn flag(v: Option<u64>) -> Result<Option<bool>, PackError> {
    v.map(|v| match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(PackError::Corrupt("a flag out of range")),
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// `payload` framed raw with a correct checksum: what a corrupt payload that passed
    /// the checksum would look like to the payload readers.
    pub fn frame_raw(payload: &[u8]) -> Vec<u8> {
        let mut out = vec![FORMAT, RAW];
        out.extend_from_slice(&CRC.checksum(payload).to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// The payload of `sealed` with bytes flipped (`flips`: position, mask), then also cut
    /// short, each framed raw with a correct checksum.
    pub fn corruptions(sealed: &[u8], flips: &[(usize, u8)], cut: usize) -> [Vec<u8>; 2] {
        let mut payload = open(sealed).expect("opens");
        for (at, mask) in flips {
            let i = at % payload.len();
            payload[i] ^= mask;
        }
        let flipped = frame_raw(&payload);
        payload.truncate(cut % payload.len());
        [flipped, frame_raw(&payload)]
    }

    /// What a new encoder writes for `bytes` after `head`.
    fn deflated_anew(head: &[u8], bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::DeflateEncoder::new(head.to_vec(), Compression::default());
        enc.write_all(bytes).expect("deflate");
        enc.finish().expect("deflate")
    }

    #[test]
    fn the_reused_compressor_writes_what_a_new_one_writes() {
        // Repetitive, empty, incompressible (its output outgrows the first reservation)
        // and long payloads, each after another: nothing of one value may leak into the
        // next.
        let mut x = 7u64;
        let noise: Vec<u8> = (0..300_000)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        let payloads: [&[u8]; 5] = [&[9; 500], &[], &noise, b"minute of a GPU", &noise[..4000]];
        for round in 0..2 {
            for p in payloads {
                let head = [FORMAT, DEFLATE, 1, 2, 3, 4];
                let got = deflate(head.to_vec(), p).expect("deflates");
                assert_eq!(
                    got,
                    deflated_anew(&head, p),
                    "round {round}, {} bytes",
                    p.len()
                );
                assert_eq!(open(&seal(p).expect("seals")).as_deref(), Ok(p));
            }
        }
    }

    #[test]
    fn small_payloads_stay_raw_and_others_are_compressed() {
        assert_eq!(seal(&[5]), Ok(frame_raw(&[5])));
        let big = vec![0u8; 1000];
        let sealed = seal(&big).expect("seals");
        assert_eq!(sealed[1], DEFLATE);
        assert!(sealed.len() < 50);
        assert_eq!(open(&sealed), Ok(big));
        assert_eq!(
            seal(&vec![0; MAX_PAYLOAD + 1]),
            Err(PackError::TooLarge("payload"))
        );
    }

    #[test]
    fn bad_headers_streams_and_checksums_are_errors() {
        assert_eq!(open(&[]), Err(PackError::Truncated));
        assert_eq!(open(&[3, 0]), Err(PackError::Format(3)));
        assert_eq!(open(&[0, 0]), Err(PackError::Format(0)));
        // A value of format 1 (before pco columns) still reads.
        let mut old = seal(&[1, 2, 3]).expect("seals");
        assert_eq!(old[0], 2);
        old[0] = 1;
        assert_eq!(open(&old), Ok(vec![1, 2, 3]));
        assert_eq!(open(&[1, 0, 0]), Err(PackError::Truncated));
        assert!(open(&[1, 7, 0, 0, 0, 0]).is_err());
        let mut sealed = seal(&[1, 2, 3]).expect("seals");
        assert_eq!(open(&sealed), Ok(vec![1, 2, 3]));
        sealed[7] ^= 4;
        assert_eq!(open(&sealed), Err(PackError::Checksum));
        let mut sealed = seal(&[9; 500]).expect("seals");
        assert_eq!(sealed[1], DEFLATE);
        // Every bit of the last byte: some of its high bits may be padding, which a
        // decoder ignores.
        let last = sealed.len() - 1;
        sealed[last] ^= 0xff;
        assert!(open(&sealed).is_err());
        // A deflate bomb is cut off, not expanded into memory.
        let mut enc = flate2::write::DeflateEncoder::new(
            vec![FORMAT, DEFLATE, 0, 0, 0, 0],
            Compression::default(),
        );
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..17 {
            enc.write_all(&zeros).expect("deflate");
        }
        let bomb = enc.finish().expect("deflate");
        assert_eq!(open(&bomb), Err(PackError::Corrupt("payload too large")));
    }
}
