//! A minute of one node's host rows (host metrics, when read, and the sampler's cost).
//! Payload: the count, the timestamps, the eight host metric columns (the two floats as
//! their bits), the three cost columns, then the slowest calls: the names this minute
//! uses (once each), a column of how many calls each row names, and the calls as a
//! column of name indexes and a column of microseconds.

use super::columns::{Reader, put_column, put_values, put_varint};
use super::{Field, MAX_CALL_NAME, MAX_CALLS, MAX_ROWS, PackError, narrow, open, seal};
use crate::HostRow;
use gpufleet_core::{HostSample, SamplerCost};
use std::collections::BTreeMap;

/// The host metrics in storage order.
const METRICS: &[Field<HostSample>] = fields!(HostSample;
    cpu_util_pct: f32,
    mem_used_bytes: u64,
    mem_total_bytes: u64,
    disk_read_bps: u64,
    disk_write_bps: u64,
    net_rx_bps: u64,
    net_tx_bps: u64,
    load1: f32,
);

/// The cost figures in storage order (the slowest calls follow them).
const COSTS: &[Field<SamplerCost>] =
    fields!(SamplerCost; cpu_us: u32, wall_us: u32, source_us: u32);

/// The slowest calls of a row's cost.
fn calls(r: &HostRow) -> impl Iterator<Item = (&String, &u32)> {
    r.cost.iter().flat_map(|c| c.slowest_calls_us.iter())
}

/// Packs `rows` (one node's: at most [`MAX_ROWS`], each naming at most [`MAX_CALLS`]
/// calls of at most [`MAX_CALL_NAME`] bytes).
pub fn pack(rows: &[HostRow]) -> Result<Vec<u8>, PackError> {
    if rows.len() > MAX_ROWS {
        return Err(PackError::TooLarge("host rows"));
    }
    if rows.iter().any(|r| calls(r).count() > MAX_CALLS) {
        return Err(PackError::TooLarge("slowest calls of a row"));
    }
    if rows
        .iter()
        .flat_map(calls)
        .any(|(name, _)| name.len() > MAX_CALL_NAME)
    {
        return Err(PackError::TooLarge("a call name"));
    }
    let mut out = Vec::new();
    put_varint(&mut out, rows.len() as u64);
    put_values(
        &mut out,
        &rows.iter().map(|r| r.time_ms as u64).collect::<Vec<_>>(),
    );
    for (get, _) in METRICS {
        put_column(
            &mut out,
            rows.iter().map(|r| r.sample.as_ref().and_then(get)),
        );
    }
    for (get, _) in COSTS {
        put_column(&mut out, rows.iter().map(|r| r.cost.as_ref().and_then(get)));
    }
    let mut names: BTreeMap<&str, u64> = rows
        .iter()
        .flat_map(|r| calls(r).map(|(name, _)| (name.as_str(), 0)))
        .collect();
    put_varint(&mut out, names.len() as u64);
    for (i, (name, index)) in names.iter_mut().enumerate() {
        *index = i as u64;
        put_varint(&mut out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
    }
    put_values(
        &mut out,
        &rows
            .iter()
            .map(|r| calls(r).count() as u64)
            .collect::<Vec<_>>(),
    );
    let (indexes, micros): (Vec<u64>, Vec<u64>) = rows
        .iter()
        .flat_map(calls)
        .map(|(name, us)| (names[name.as_str()], u64::from(*us)))
        .unzip();
    put_values(&mut out, &indexes);
    put_values(&mut out, &micros);
    seal(&out)
}

/// The rows of a value written by [`pack`], in the order they were packed.
pub fn unpack(packed: &[u8]) -> Result<Vec<HostRow>, PackError> {
    let payload = open(packed)?;
    let mut r = Reader::new(&payload);
    let n = r.count(MAX_ROWS)?;
    let times = r.values(n)?;
    let mut samples = vec![HostSample::default(); n];
    for (_, set) in METRICS {
        for (s, v) in samples.iter_mut().zip(r.column(n)?) {
            set(s, v)?;
        }
    }
    let mut costs = vec![SamplerCost::default(); n];
    for (_, set) in COSTS {
        for (c, v) in costs.iter_mut().zip(r.column(n)?) {
            set(c, v)?;
        }
    }
    let mut names: Vec<String> = Vec::new();
    // Each name costs at least its length byte: the input bounds their number.
    for _ in 0..r.count(usize::MAX)? {
        let len = r.count(MAX_CALL_NAME)?;
        let name = std::str::from_utf8(r.take(len)?)
            .map_err(|_| PackError::Corrupt("a call name is not UTF-8"))?;
        if names.last().is_some_and(|last| last.as_str() >= name) {
            return Err(PackError::Corrupt("call names out of order"));
        }
        names.push(name.to_owned());
    }
    let counts = r.values(n)?;
    if counts.iter().any(|c| *c > MAX_CALLS as u64) {
        return Err(PackError::Corrupt("a row with too many calls"));
    }
    // At most MAX_ROWS × MAX_CALLS: no overflow. Each call's copy of its name costs as
    // much as a few values.
    let total = counts.iter().sum::<u64>() as usize;
    r.spend(total * (MAX_CALL_NAME / 8))?;
    let mut indexes = r.values(total)?.into_iter();
    let mut micros = r.values(total)?.into_iter();
    for (c, count) in costs.iter_mut().zip(&counts) {
        for _ in 0..*count {
            let (Some(i), Some(us)) = (indexes.next(), micros.next()) else {
                return Err(PackError::Truncated);
            };
            let name = usize::try_from(i)
                .ok()
                .and_then(|i| names.get(i))
                .ok_or(PackError::Corrupt("a call name index out of range"))?;
            let us = narrow(Some(us))?.unwrap_or_default();
            if c.slowest_calls_us.insert(name.clone(), us).is_some() {
                return Err(PackError::Corrupt("a call named twice in a row"));
            }
        }
    }
    if !r.is_empty() {
        return Err(PackError::Corrupt("bytes after the last column"));
    }
    Ok(times
        .into_iter()
        .zip(samples)
        .zip(costs)
        .map(|((t, sample), cost)| HostRow {
            time_ms: t as i64,
            sample: (sample != HostSample::default()).then_some(sample),
            cost: (cost != SamplerCost::default()).then_some(cost),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{corruptions, frame_raw};
    use super::*;
    use proptest::option::of;
    use proptest::prelude::*;

    fn row() -> impl Strategy<Value = HostRow> {
        let sample = (
            of(any::<f32>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<f32>()),
        )
            .prop_map(|h| HostSample {
                cpu_util_pct: h.0,
                mem_used_bytes: h.1,
                mem_total_bytes: h.2,
                disk_read_bps: h.3,
                disk_write_bps: h.4,
                net_rx_bps: h.5,
                net_tx_bps: h.6,
                load1: h.7,
            });
        let calls = proptest::collection::btree_map("[a-zA-Z_]{0,12}", any::<u32>(), 0..4);
        let cost = (of(any::<u32>()), of(any::<u32>()), of(any::<u32>()), calls).prop_map(
            |(cpu_us, wall_us, source_us, slowest_calls_us)| SamplerCost {
                cpu_us,
                wall_us,
                source_us,
                slowest_calls_us,
            },
        );
        (any::<i64>(), of(sample), of(cost)).prop_map(|(time_ms, sample, cost)| HostRow {
            time_ms,
            // As the row table stores them: a reading with every metric absent, or a cost
            // with no figure, is none.
            sample: sample.filter(|s| *s != HostSample::default()),
            cost: cost.filter(|c| *c != SamplerCost::default()),
        })
    }

    /// A host row with its metrics as their column values (floats by their bits).
    type Bits = (i64, Option<Vec<Option<u64>>>, Option<SamplerCost>);

    /// Rows compared with floats by their bits (NaN included).
    fn bits(rows: &[HostRow]) -> Vec<Bits> {
        rows.iter()
            .map(|r| {
                let metrics = r
                    .sample
                    .as_ref()
                    .map(|s| METRICS.iter().map(|(get, _)| get(s)).collect());
                (r.time_ms, metrics, r.cost.clone())
            })
            .collect()
    }

    proptest! {
        #[test]
        fn every_field_of_every_row_survives(rows in proptest::collection::vec(row(), 0..70)) {
            let got = unpack(&pack(&rows).expect("packs")).expect("unpacks");
            prop_assert_eq!(bits(&got), bits(&rows));
        }

        #[test]
        fn no_corrupt_payload_panics_the_reader(
            rows in proptest::collection::vec(row(), 1..20),
            flips in proptest::collection::vec((any::<usize>(), 1u8..), 1..6),
            cut in any::<usize>(),
        ) {
            for bad in corruptions(&pack(&rows).expect("packs"), &flips, cut) {
                let _ = unpack(&bad);
            }
        }
    }

    #[test]
    fn what_cannot_be_unpacked_is_not_packed_nor_built() {
        let calls = |n: usize, len: usize| HostRow {
            time_ms: 0,
            sample: None,
            cost: Some(SamplerCost {
                slowest_calls_us: (0..n).map(|i| (format!("{i:0len$}"), 1)).collect(),
                ..SamplerCost::default()
            }),
        };
        assert!(pack(&[calls(MAX_CALLS, MAX_CALL_NAME)]).is_ok());
        assert!(pack(&[calls(MAX_CALLS + 1, 2)]).is_err());
        assert!(pack(&[calls(1, MAX_CALL_NAME + 1)]).is_err());
        assert!(pack(&vec![calls(0, 0); MAX_ROWS + 1]).is_err());
        // The most rows, each naming the most calls: a few bytes that would copy names
        // millions of times are refused before any is copied.
        let mut payload = Vec::new();
        put_varint(&mut payload, MAX_ROWS as u64);
        put_values(&mut payload, &vec![0; MAX_ROWS]);
        // Every metric and cost absent.
        payload.extend(std::iter::repeat_n(0, METRICS.len() + COSTS.len()));
        put_varint(&mut payload, 1);
        put_varint(&mut payload, MAX_CALL_NAME as u64);
        payload.extend_from_slice(&[b'a'; MAX_CALL_NAME]);
        put_values(&mut payload, &vec![MAX_CALLS as u64; MAX_ROWS]);
        assert!(payload.len() < 200);
        assert_eq!(
            unpack(&frame_raw(&payload)),
            Err(PackError::Corrupt("more values than a packed value holds"))
        );
    }

    #[test]
    fn every_field_of_the_row_types_is_packed() {
        // Spelled out without `..`: a field added to either fails to compile here until
        // it is packed (METRICS, COSTS or the calls).
        let HostSample {
            cpu_util_pct: _,
            mem_used_bytes: _,
            mem_total_bytes: _,
            disk_read_bps: _,
            disk_write_bps: _,
            net_rx_bps: _,
            net_tx_bps: _,
            load1: _,
        } = HostSample::default();
        let SamplerCost {
            cpu_us: _,
            wall_us: _,
            source_us: _,
            slowest_calls_us: _,
        } = SamplerCost::default();
        assert_eq!((METRICS.len(), COSTS.len()), (8, 3));
    }
}
