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
//! Layout of a packed value: format version (1), compression (0 none, 1 deflate), then the
//! payload. Payloads: [`gpu`], [`process`], [`host`].

mod columns;
pub mod gpu;
pub mod host;
pub mod process;

use flate2::Compression;
use flate2::read::DeflateDecoder;
use flate2::write::DeflateEncoder;
use std::io::{Read, Write};
use thiserror::Error;

const FORMAT: u8 = 1;
const RAW: u8 = 0;
const DEFLATE: u8 = 1;
/// Most bytes a packed value may expand to: far above a minute of 10 ms ticks of a GPU
/// with every field and link, far below what would hurt the collector.
const MAX_PAYLOAD: u64 = 16 << 20;

/// A packed value that cannot be read back.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PackError {
    #[error("packed samples end early")]
    Truncated,
    #[error("packed samples are corrupt: {0}")]
    Corrupt(&'static str),
    #[error("packed samples of format {0}, this collector reads format 1")]
    Format(u8),
}

/// `payload` with the header, compressed when that makes it smaller.
fn seal(payload: &[u8]) -> Vec<u8> {
    let mut enc = DeflateEncoder::new(vec![FORMAT, DEFLATE], Compression::default());
    let deflated = enc.write_all(payload).and_then(|()| enc.finish());
    match deflated {
        Ok(out) if out.len() < payload.len() + 2 => out,
        _ => {
            let mut out = Vec::with_capacity(payload.len() + 2);
            out.extend_from_slice(&[FORMAT, RAW]);
            out.extend_from_slice(payload);
            out
        }
    }
}

/// The payload of a value written by [`seal`].
fn open(packed: &[u8]) -> Result<Vec<u8>, PackError> {
    let (&format, rest) = packed.split_first().ok_or(PackError::Truncated)?;
    if format != FORMAT {
        return Err(PackError::Format(format));
    }
    let (&compression, body) = rest.split_first().ok_or(PackError::Truncated)?;
    match compression {
        RAW => Ok(body.to_vec()),
        DEFLATE => {
            let mut out = Vec::new();
            DeflateDecoder::new(body)
                .take(MAX_PAYLOAD + 1)
                .read_to_end(&mut out)
                .map_err(|_| PackError::Corrupt("deflate stream"))?;
            if out.len() as u64 > MAX_PAYLOAD {
                return Err(PackError::Corrupt("payload too large"));
            }
            Ok(out)
        }
        _ => Err(PackError::Corrupt("unknown compression")),
    }
}

/// A `u64` column value as a `u32` field (a larger one is corruption, not truncation).
fn narrow(v: Option<u64>) -> Result<Option<u32>, PackError> {
    v.map(|v| u32::try_from(v).map_err(|_| PackError::Corrupt("a 32-bit field out of range")))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_payloads_stay_raw_and_others_are_compressed() {
        assert_eq!(seal(&[5]), vec![FORMAT, RAW, 5]);
        let big = vec![0u8; 1000];
        let sealed = seal(&big);
        assert_eq!(sealed[1], DEFLATE);
        assert!(sealed.len() < 50);
        assert_eq!(open(&sealed), Ok(big));
    }

    #[test]
    fn bad_headers_and_streams_are_errors() {
        assert_eq!(open(&[]), Err(PackError::Truncated));
        assert_eq!(open(&[2, 0]), Err(PackError::Format(2)));
        assert_eq!(open(&[1]), Err(PackError::Truncated));
        assert!(open(&[1, 7, 0]).is_err());
        assert!(open(&[1, DEFLATE, 0xff, 0xff, 0xff]).is_err());
        // A deflate bomb is cut off, not expanded into memory.
        let mut enc = DeflateEncoder::new(vec![FORMAT, DEFLATE], Compression::default());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..17 {
            enc.write_all(&zeros).expect("deflate");
        }
        let bomb = enc.finish().expect("deflate");
        assert_eq!(open(&bomb), Err(PackError::Corrupt("payload too large")));
    }
}
