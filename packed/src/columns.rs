//! Integer columns: LEB128 varints of zigzag-mapped differences under whichever of three
//! transforms makes them shortest, or a long column compressed by pcodec, with a presence
//! map for absent values.
//!
//! A column of `n` values is written as
//! - for optional columns, its presence: `0` none present, `1` all present, or `2`
//!   followed by a bitmap of `n` bits (LSB first) of which values are present;
//! - a transform byte and the present values under it: [`Transform::Delta`] (each value
//!   minus the previous one, the first minus 0: counters and slowly moving levels),
//!   [`Transform::DeltaOfDelta`] (the change of that difference: timestamps, energy
//!   counters at constant power) or [`Transform::Xor`] (bits that changed: floats, bit
//!   masks), or, when the values step evenly (timestamps at a steady interval, a
//!   constant), [`Transform::Linear`] (the first value and the step).
//!   Differences wrap in 64 bits, so every `u64` survives exactly.
//! - a long column (an hour of a metric; in a minute, the NVLink columns of a GPU with
//!   many links or the ticks of three or more processes) may instead be
//!   [`Transform::Pco`]: the values
//!   compressed by pcodec (which finds deltas, common factors and distributions itself),
//!   written as their length and pco's standalone bytes. It is taken when it is shorter
//!   than the best varint transform after deflate, as the payload will be deflated: noisy
//!   columns (power, PCIe and memory readings, energy counters) come out about 10 %
//!   smaller, while deflate keeps the repetitive ones.

use super::{PackError, deflate};

/// How a column's values are turned into small numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transform {
    Delta = 0,
    DeltaOfDelta = 1,
    Xor = 2,
    Linear = 3,
    Pco = 4,
}

/// Columns shorter than this are not tried with pco: its header and tables outweigh what
/// it saves on a minute of one value per second. An hour of samples 15 s apart (240) is
/// tried; the merged hours are where the bytes are.
const PCO_MIN_VALUES: usize = 128;

/// Most values a reader decodes from one packed value, all columns together: a minute of
/// a GPU's samples 1 ms apart, every field and 18 links each, is below it. A corrupt
/// count must not make the reader allocate gigabytes.
pub const MAX_VALUES: usize = 1 << 23;

const TRANSFORMS: [Transform; 3] = [Transform::Delta, Transform::DeltaOfDelta, Transform::Xor];

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: u64) -> u64 {
    let v = v as i64;
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> u64 {
    ((v >> 1) as i64 ^ -((v & 1) as i64)) as u64
}

/// The words of `values` under `t` (before zigzag for the differences).
fn transformed(values: &[u64], t: Transform, out: &mut Vec<u8>) {
    let (mut prev, mut prev_delta) = (0u64, 0u64);
    for (i, &v) in values.iter().enumerate() {
        let word = match t {
            Transform::Delta => zigzag(v.wrapping_sub(prev)),
            Transform::DeltaOfDelta => {
                let delta = v.wrapping_sub(prev);
                let w = zigzag(delta.wrapping_sub(prev_delta));
                // The first value is written whole; differences start with the second.
                prev_delta = if i == 0 { 0 } else { delta };
                w
            }
            Transform::Xor | Transform::Linear | Transform::Pco => v ^ prev,
        };
        put_varint(out, word);
        prev = v;
    }
}

/// Writes `values` (all present) in the shortest of the transforms.
pub fn put_values(out: &mut Vec<u8>, values: &[u64]) {
    if let [first, second, ..] = values {
        let step = second.wrapping_sub(*first);
        if values.windows(2).all(|w| w[1].wrapping_sub(w[0]) == step) {
            out.push(Transform::Linear as u8);
            put_varint(out, *first);
            put_varint(out, zigzag(step));
            return;
        }
    }
    let best = best_varints(values);
    if values.len() >= PCO_MIN_VALUES
        && let Some(pco) = pco_column(values)
        && pco.len() < deflated_len(&best)
    {
        out.extend_from_slice(&pco);
        return;
    }
    out.extend_from_slice(&best);
}

/// `values` under the varint transform that makes them shortest, after its byte.
fn best_varints(values: &[u64]) -> Vec<u8> {
    let mut best: Option<Vec<u8>> = None;
    for t in TRANSFORMS {
        let mut buf = vec![t as u8];
        transformed(values, t, &mut buf);
        if best.as_ref().is_none_or(|b| buf.len() < b.len()) {
            best = Some(buf);
        }
    }
    best.unwrap_or_default()
}

/// `values` as a [`Transform::Pco`] column: the transform byte, the length, pco's bytes.
fn pco_column(values: &[u64]) -> Option<Vec<u8>> {
    let bytes = pco::standalone::simple_compress(values, &pco::ChunkConfig::default()).ok()?;
    let mut out = vec![Transform::Pco as u8];
    put_varint(&mut out, bytes.len() as u64);
    out.extend_from_slice(&bytes);
    Some(out)
}

/// About what `bytes` adds to a deflated payload.
fn deflated_len(bytes: &[u8]) -> usize {
    deflate(Vec::new(), bytes).map_or(bytes.len(), |d| d.len())
}

/// Writes an optional column: its presence, then its present values.
pub fn put_column(out: &mut Vec<u8>, values: impl Iterator<Item = Option<u64>>) {
    let values: Vec<Option<u64>> = values.collect();
    let present: Vec<u64> = values.iter().flatten().copied().collect();
    if present.is_empty() {
        out.push(0);
        return;
    }
    if present.len() == values.len() {
        out.push(1);
    } else {
        out.push(2);
        let mut bits = vec![0u8; values.len().div_ceil(8)];
        for (i, v) in values.iter().enumerate() {
            if v.is_some() {
                bits[i / 8] |= 1 << (i % 8);
            }
        }
        out.extend_from_slice(&bits);
    }
    put_values(out, &present);
}

/// Reads what the `put_*` functions wrote, from the front of a byte slice, at most
/// [`MAX_VALUES`] values in all.
pub struct Reader<'a> {
    bytes: &'a [u8],
    budget: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            budget: MAX_VALUES,
        }
    }

    /// Takes `n` values from the budget (readers also take it for what they build from a
    /// count, before they build it).
    pub fn spend(&mut self, n: usize) -> Result<(), PackError> {
        self.budget = self
            .budget
            .checked_sub(n)
            .ok_or(PackError::Corrupt("more values than a packed value holds"))?;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn byte(&mut self) -> Result<u8, PackError> {
        let (&b, rest) = self.bytes.split_first().ok_or(PackError::Truncated)?;
        self.bytes = rest;
        Ok(b)
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8], PackError> {
        if n > self.bytes.len() {
            return Err(PackError::Truncated);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    pub fn varint(&mut self) -> Result<u64, PackError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return Err(PackError::Corrupt("a varint longer than 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(PackError::Corrupt("a varint longer than 64 bits"))
    }

    /// A count of at most `max`.
    pub fn count(&mut self, max: usize) -> Result<usize, PackError> {
        usize::try_from(self.varint()?)
            .ok()
            .filter(|n| *n <= max)
            .ok_or(PackError::Corrupt("a count beyond the limit"))
    }

    /// `n` values written by [`put_values`].
    pub fn values(&mut self, n: usize) -> Result<Vec<u64>, PackError> {
        self.spend(n)?;
        let t = match self.byte()? {
            0 => Transform::Delta,
            1 => Transform::DeltaOfDelta,
            2 => Transform::Xor,
            3 => {
                let (first, step) = (self.varint()?, unzigzag(self.varint()?));
                return Ok((0..n as u64)
                    .map(|i| first.wrapping_add(step.wrapping_mul(i)))
                    .collect());
            }
            4 => {
                // The values are allocated from the budget just spent, not from pco's own
                // count. (pco itself may reserve up to a few hundred MiB of zeroed memory
                // for a crafted header; the value's CRC-32C stops random corruption first.)
                let len = self.count(self.bytes.len())?;
                let bytes = self.take(len)?;
                let mut out = vec![0u64; n];
                let progress = pco::standalone::simple_decompress_into(bytes, &mut out)
                    .map_err(|_| PackError::Corrupt("a pco column that does not decode"))?;
                if progress.n_processed != n || !progress.finished {
                    return Err(PackError::Corrupt("a pco column of another length"));
                }
                return Ok(out);
            }
            _ => return Err(PackError::Corrupt("unknown column transform")),
        };
        if n > self.bytes.len() {
            return Err(PackError::Truncated);
        }
        let mut out = Vec::with_capacity(n);
        let (mut prev, mut prev_delta) = (0u64, 0u64);
        for i in 0..n {
            let word = self.varint()?;
            let v = match t {
                Transform::Delta => prev.wrapping_add(unzigzag(word)),
                Transform::DeltaOfDelta => {
                    let delta = prev_delta.wrapping_add(unzigzag(word));
                    prev_delta = if i == 0 { 0 } else { delta };
                    prev.wrapping_add(delta)
                }
                Transform::Xor | Transform::Linear | Transform::Pco => prev ^ word,
            };
            out.push(v);
            prev = v;
        }
        Ok(out)
    }

    /// An optional column of `n` values written by [`put_column`].
    pub fn column(&mut self, n: usize) -> Result<Vec<Option<u64>>, PackError> {
        self.spend(n)?;
        let present: Vec<bool> = match self.byte()? {
            0 => return Ok(vec![None; n]),
            1 => vec![true; n],
            2 => {
                let bits = self.take(n.div_ceil(8))?;
                (0..n).map(|i| bits[i / 8] & (1 << (i % 8)) != 0).collect()
            }
            _ => return Err(PackError::Corrupt("unknown presence marker")),
        };
        let mut values = self
            .values(present.iter().filter(|p| **p).count())?
            .into_iter();
        Ok(present
            .into_iter()
            .map(|p| if p { values.next() } else { None })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Columns as samples make them: anything, runs of a few values, or all one value.
    fn column() -> impl Strategy<Value = Vec<Option<u64>>> {
        let value = prop_oneof![any::<u64>(), 0u64..3, Just(u64::MAX)];
        prop_oneof![
            proptest::collection::vec(proptest::option::of(value), 0..200),
            (proptest::option::of(any::<u64>()), 0usize..100).prop_map(|(v, n)| vec![v; n]),
        ]
    }

    proptest! {
        #[test]
        fn every_column_survives(values in column()) {
            let mut out = Vec::new();
            put_column(&mut out, values.iter().copied());
            let mut r = Reader::new(&out);
            prop_assert_eq!(r.column(values.len()).expect("decodes"), values);
            prop_assert!(r.is_empty());
        }

        #[test]
        fn evenly_stepping_columns_survive(
            first in any::<u64>(),
            step in any::<u64>(),
            n in 0u64..100,
        ) {
            let values: Vec<u64> =
                (0..n).map(|i| first.wrapping_add(step.wrapping_mul(i))).collect();
            let mut out = Vec::new();
            put_values(&mut out, &values);
            prop_assert!(n < 2 || out[0] == Transform::Linear as u8);
            let back = Reader::new(&out).values(values.len()).expect("decodes");
            prop_assert_eq!(back, values);
        }

        #[test]
        fn long_columns_survive_whichever_transform_wins(
            level in any::<u64>(),
            noise in proptest::collection::vec(any::<u64>(), PCO_MIN_VALUES..2000),
            bits in 0u32..64,
            absent in proptest::collection::vec(any::<bool>(), 0..40),
        ) {
            // A level with noise of `bits` bits, some values absent.
            let values: Vec<Option<u64>> = noise
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let v = level.wrapping_add(n.checked_shr(64 - bits).unwrap_or(0));
                    (!absent.get(i % 97).copied().unwrap_or(false)).then_some(v)
                })
                .collect();
            let mut out = Vec::new();
            put_column(&mut out, values.iter().copied());
            let mut r = Reader::new(&out);
            prop_assert_eq!(r.column(values.len()).expect("decodes"), values);
            prop_assert!(r.is_empty());
        }

        #[test]
        fn varints_and_zigzag_are_exact(v in any::<u64>()) {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            prop_assert_eq!(Reader::new(&out).varint().expect("decodes"), v);
            prop_assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn the_shortest_transform_is_chosen() {
        // Timestamps at a steady interval: the first and the step.
        let ts: Vec<u64> = (0..60).map(|i| 1_793_491_200_000 + i * 1000).collect();
        let mut out = Vec::new();
        put_values(&mut out, &ts);
        assert_eq!(out[0], Transform::Linear as u8);
        assert_eq!(out.len(), 1 + 6 + 2);
        assert_eq!(Reader::new(&out).values(60).expect("decodes"), ts);
        // One late tick: every difference of differences but two is 0.
        let mut late = ts.clone();
        late[30] += 7;
        let mut out = Vec::new();
        put_values(&mut out, &late);
        assert_eq!(out[0], Transform::DeltaOfDelta as u8);
        assert!(out.len() <= 1 + 6 + 2 + 3 * 2 + 55, "{} bytes", out.len());
        // A constant column is its value once.
        let mut out = Vec::new();
        put_values(&mut out, &[300_000; 60]);
        assert_eq!(out, [Transform::Linear as u8, 0xe0, 0xa7, 0x12, 0]);
        assert_eq!(
            Reader::new(&out).values(60).expect("decodes"),
            [300_000; 60]
        );
    }

    /// An hour of a noisy power reading in mW around 300 W, from a fixed seed, and that
    /// column as written (pco's).
    fn noisy_hour() -> (Vec<u64>, Vec<u8>) {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let values: Vec<u64> = (0..3600)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                300_000 + x % 20_000
            })
            .collect();
        let mut out = Vec::new();
        put_values(&mut out, &values);
        assert_eq!(out[0], Transform::Pco as u8);
        (values, out)
    }

    #[test]
    fn pco_takes_long_noisy_columns_and_deflate_keeps_repetitive_ones() {
        let (noisy, out) = noisy_hour();
        let best = best_varints(&noisy);
        assert!(
            out.len() * 100 < deflated_len(&best) * 90,
            "pco {} bytes, varints deflated {}",
            out.len(),
            deflated_len(&best)
        );
        assert_eq!(Reader::new(&out).values(3600).expect("decodes"), noisy);
        // A temperature that steps now and then: varints, which deflate shrinks.
        let steps: Vec<u64> = (0..3600).map(|i| 40 + (i / 600) % 3).collect();
        let mut out = Vec::new();
        put_values(&mut out, &steps);
        assert_ne!(out[0], Transform::Pco as u8);
        assert_eq!(Reader::new(&out).values(3600).expect("decodes"), steps);
        // A minute is not tried.
        let mut out = Vec::new();
        put_values(&mut out, &noisy[..60]);
        assert_ne!(out[0], Transform::Pco as u8);
    }

    #[test]
    fn corrupt_pco_columns_are_errors_not_panics() {
        let (_, out) = noisy_hour();
        // Another count than was written, either way.
        assert!(Reader::new(&out).values(3599).is_err());
        assert!(Reader::new(&out).values(3601).is_err());
        // Cut short: by our length, and with the length saying so (pco sees too few bytes).
        assert!(Reader::new(&out[..out.len() - 1]).values(3600).is_err());
        let mut r = Reader::new(&out[1..]);
        let len = r.varint().expect("length") as usize;
        let body = &out[out.len() - len..];
        let mut short = vec![Transform::Pco as u8];
        put_varint(&mut short, (len / 2) as u64);
        short.extend_from_slice(&body[..len / 2]);
        assert!(Reader::new(&short).values(3600).is_err());
        // A length beyond the bytes.
        assert!(Reader::new(&[4, 0x7f, 1, 2]).values(3).is_err());
        // Every byte flipped in turn: an error or other values, never a panic.
        for i in 1..out.len() {
            for mask in [0x01, 0x80, 0xff] {
                let mut bad = out.clone();
                bad[i] ^= mask;
                let _ = Reader::new(&bad).values(3600);
            }
        }
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        assert!(Reader::new(&[]).column(3).is_err());
        assert!(Reader::new(&[9]).column(3).is_err());
        assert!(Reader::new(&[1, 7]).column(3).is_err());
        assert!(Reader::new(&[0xff; 11]).varint().is_err());
        assert!(Reader::new(&[0x81, 0x80, 0x04]).count(1 << 16).is_err());
        assert!(Reader::new(&[3, 1, 0]).values(MAX_VALUES + 1).is_err());
        // The budget is for all columns together.
        let mut r = Reader::new(&[3, 1, 0, 3, 1, 0]);
        assert_eq!(
            r.values(MAX_VALUES - 1).map(|v| v.len()),
            Ok(MAX_VALUES - 1)
        );
        assert!(r.values(2).is_err());
        // Bits beyond 64 in a varint's tenth byte.
        let mut ten = vec![0xff; 9];
        ten.push(0x02);
        assert!(Reader::new(&ten).varint().is_err());
        ten[9] = 0x01;
        assert_eq!(Reader::new(&ten).varint(), Ok(u64::MAX));
    }
}
