//! A minute of one node's host rows (host metrics, when read, and the sampler's cost).
//! Payload: the count, the timestamps, the eight host metric columns (the two floats as
//! their bits), the three cost columns, then the slowest calls: the names this minute
//! uses (once each), a column of how many calls each row names, and the calls as a
//! column of name indexes and a column of microseconds.

use super::columns::{MAX_ROWS, MAX_VALUES, Reader, put_column, put_values, put_varint};
use super::{PackError, narrow, open, seal};
use crate::store::HostRow;
use gpufleet_core::{HostSample, SamplerCost};
use std::collections::BTreeMap;

type Metric = (
    fn(&HostSample) -> Option<u64>,
    fn(&mut HostSample, Option<u64>) -> Result<(), PackError>,
);

const METRICS: [Metric; 8] = [
    (
        |h| h.cpu_util_pct.map(|f| u64::from(f.to_bits())),
        |h, v| {
            h.cpu_util_pct = narrow(v)?.map(f32::from_bits);
            Ok(())
        },
    ),
    (
        |h| h.mem_used_bytes,
        |h, v| {
            h.mem_used_bytes = v;
            Ok(())
        },
    ),
    (
        |h| h.mem_total_bytes,
        |h, v| {
            h.mem_total_bytes = v;
            Ok(())
        },
    ),
    (
        |h| h.disk_read_bps,
        |h, v| {
            h.disk_read_bps = v;
            Ok(())
        },
    ),
    (
        |h| h.disk_write_bps,
        |h, v| {
            h.disk_write_bps = v;
            Ok(())
        },
    ),
    (
        |h| h.net_rx_bps,
        |h, v| {
            h.net_rx_bps = v;
            Ok(())
        },
    ),
    (
        |h| h.net_tx_bps,
        |h, v| {
            h.net_tx_bps = v;
            Ok(())
        },
    ),
    (
        |h| h.load1.map(|f| u64::from(f.to_bits())),
        |h, v| {
            h.load1 = narrow(v)?.map(f32::from_bits);
            Ok(())
        },
    ),
];

type Cost = fn(&SamplerCost) -> Option<u32>;
const COSTS: [Cost; 3] = [|c| c.cpu_us, |c| c.wall_us, |c| c.source_us];

/// The slowest calls of a row's cost.
fn calls(r: &HostRow) -> impl Iterator<Item = (&String, &u32)> {
    r.cost.iter().flat_map(|c| c.slowest_calls_us.iter())
}

/// Packs `rows` (one node's).
pub fn pack(rows: &[HostRow]) -> Vec<u8> {
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
    for get in COSTS {
        let column = rows.iter().map(|r| r.cost.as_ref().and_then(get));
        put_column(&mut out, column.map(|v| v.map(u64::from)));
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
    let mut cost_columns = Vec::with_capacity(COSTS.len());
    for _ in COSTS {
        cost_columns.push(r.column(n)?);
    }
    for (i, c) in costs.iter_mut().enumerate() {
        c.cpu_us = narrow(cost_columns[0][i])?;
        c.wall_us = narrow(cost_columns[1][i])?;
        c.source_us = narrow(cost_columns[2][i])?;
    }
    let mut names = Vec::new();
    for _ in 0..r.count(MAX_VALUES)? {
        let len = r.count(MAX_VALUES)?;
        let name = std::str::from_utf8(r.take(len)?)
            .map_err(|_| PackError::Corrupt("a call name is not UTF-8"))?;
        names.push(name.to_owned());
    }
    let counts = r.values(n)?;
    let total = counts
        .iter()
        .try_fold(0usize, |a, c| a.checked_add(usize::try_from(*c).ok()?))
        .ok_or(PackError::Corrupt("call count"))?;
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
            c.slowest_calls_us.insert(name.clone(), us);
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

    /// Rows compared with floats by their bits (NaN included).
    fn bits(rows: &[HostRow]) -> Vec<(i64, Option<Vec<Option<u64>>>, Option<SamplerCost>)> {
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
            let got = unpack(&pack(&rows)).expect("unpacks");
            prop_assert_eq!(bits(&got), bits(&rows));
        }

        #[test]
        fn no_input_panics_the_reader(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut framed = vec![1, 0];
            framed.extend_from_slice(&bytes);
            let _ = unpack(&framed);
        }
    }
}
