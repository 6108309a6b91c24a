//! An hour of one series' rollup minutes (a GPU's `gpu_minutes` rows or a node's
//! `host_minutes` rows) as one value. Payload: the number of minutes and of metrics, the
//! minute starts, the sample counts, then per metric a block, preceded by its length (so a
//! chart of one metric skips the others): its count column, its averages, and its minimum
//! and maximum columns (the 64 bits the row holds: an integer's two's complement, or a
//! float's bits).
//!
//! An average is what the database computed, `sum / n` rounded to a double. Where every
//! average of a metric's column is exactly the rounded quotient of an integer sum (an
//! integer metric, as the GPU's all are), the column holds those sums, which delta-code
//! into a few bytes, instead of the doubles' bits, which XOR-code into seven or eight; a
//! mode byte says which. The averages read back are bit for bit those packed.

use super::columns::{Reader, put_column, put_values, put_varint};
use super::{PackError, narrow, open, seal};
use gpufleet_core::UnixMs;

/// Most minutes one value holds: an hour.
pub const MAX_MINUTES: usize = 60;
/// Most metrics a rollup minute has (a GPU's 24, a node's 8).
pub const MAX_METRICS: usize = 64;
/// The largest integer sum an average may be rebuilt from: every integer up to it is a
/// double, so the quotient is rounded once.
const MAX_EXACT_SUM: u64 = 1 << 53;

/// Averages stored as their doubles' bits.
const AVG_BITS: u8 = 0;
/// Averages stored as the integer sums they are the rounded quotients of.
const AVG_SUMS: u8 = 1;

/// One metric of one rollup minute, as its row holds it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub n: u32,
    pub avg: Option<f64>,
    /// The stored minimum and maximum, as 64 bits (see the module docs).
    pub min: Option<u64>,
    pub max: Option<u64>,
}

/// One rollup minute as its row holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RollupRow {
    pub minute_ms: UnixMs,
    pub samples: u32,
    pub metrics: Vec<Stats>,
}

/// The integer sum `avg` is the rounded quotient of over `n` samples, if there is one.
fn exact_sum(avg: f64, n: u32) -> Option<i64> {
    if n == 0 || !avg.is_finite() {
        return None;
    }
    let sum = (avg * f64::from(n)).round();
    if sum.abs() > MAX_EXACT_SUM as f64 {
        return None;
    }
    let sum = sum as i64;
    (sum as f64 / f64::from(n))
        .to_bits()
        .eq(&avg.to_bits())
        .then_some(sum)
}

/// Packs `rows` (one series', at most [`MAX_MINUTES`], each with the same number of
/// metrics, at most [`MAX_METRICS`]).
pub fn pack(rows: &[RollupRow]) -> Result<Vec<u8>, PackError> {
    if rows.len() > MAX_MINUTES {
        return Err(PackError::TooLarge("rollup minutes"));
    }
    let width = rows.first().map_or(0, |r| r.metrics.len());
    if width > MAX_METRICS {
        return Err(PackError::TooLarge("rollup metrics"));
    }
    if rows.iter().any(|r| r.metrics.len() != width) {
        return Err(PackError::TooLarge("rollup minutes of different widths"));
    }
    if !minutes_in_order(rows.iter().map(|r| r.minute_ms)) {
        return Err(PackError::Corrupt("rollup minutes out of order"));
    }
    let mut out = Vec::new();
    put_varint(&mut out, rows.len() as u64);
    put_varint(&mut out, width as u64);
    let column = |f: &dyn Fn(&RollupRow) -> u64| rows.iter().map(f).collect::<Vec<_>>();
    put_values(&mut out, &column(&|r| r.minute_ms as u64));
    put_values(&mut out, &column(&|r| u64::from(r.samples)));
    for m in 0..width {
        let stats = || rows.iter().map(move |r| r.metrics[m]);
        let mut block = Vec::new();
        put_values(
            &mut block,
            &stats().map(|s| u64::from(s.n)).collect::<Vec<_>>(),
        );
        let sums: Option<Vec<Option<u64>>> = stats()
            .map(|s| match s.avg {
                None => Some(None),
                Some(avg) => exact_sum(avg, s.n).map(|sum| Some(sum as u64)),
            })
            .collect();
        match sums {
            Some(sums) => {
                block.push(AVG_SUMS);
                put_column(&mut block, sums.into_iter());
            }
            None => {
                block.push(AVG_BITS);
                put_column(&mut block, stats().map(|s| s.avg.map(f64::to_bits)));
            }
        }
        put_column(&mut block, stats().map(|s| s.min));
        put_column(&mut block, stats().map(|s| s.max));
        put_varint(&mut out, block.len() as u64);
        out.extend_from_slice(&block);
    }
    seal(&out)
}

/// The minutes of a value written by [`pack`], in the order they were packed.
pub fn unpack(packed: &[u8]) -> Result<Vec<RollupRow>, PackError> {
    decode(packed, None)
}

/// The minutes of a value written by [`pack`] with only the metrics at `wanted` (indexes
/// into the packed minutes' metrics), in that order: what a chart reads. A metric past
/// those the value holds (one added to the series after it was packed) is absent.
pub fn unpack_metrics(packed: &[u8], wanted: &[usize]) -> Result<Vec<RollupRow>, PackError> {
    decode(packed, Some(wanted))
}

fn decode(packed: &[u8], wanted: Option<&[usize]>) -> Result<Vec<RollupRow>, PackError> {
    let payload = open(packed)?;
    let mut r = Reader::new(&payload);
    let n = r.count(MAX_MINUTES)?;
    let width = r.count(MAX_METRICS)?;
    if wanted.is_some_and(|w| w.len() > MAX_METRICS) {
        return Err(PackError::TooLarge("rollup metrics"));
    }
    let kept = wanted.map_or(width, <[usize]>::len);
    let minutes = r.values(n)?;
    // Readers count a minute once per value: two alike would be counted twice.
    if !minutes_in_order(minutes.iter().map(|&m| m as i64)) {
        return Err(PackError::Corrupt("rollup minutes out of order"));
    }
    let samples = r.values(n)?;
    let mut rows = Vec::with_capacity(n);
    for (minute, samples) in minutes.into_iter().zip(samples) {
        rows.push(RollupRow {
            minute_ms: minute as i64,
            samples: narrow(Some(samples))?.unwrap_or_default(),
            metrics: vec![Stats::default(); kept],
        });
    }
    for m in 0..width {
        let len = r.count(payload.len())?;
        let block = r.take(len)?;
        let slots: Vec<usize> = match wanted {
            None => vec![m],
            Some(w) => (0..w.len()).filter(|&i| w[i] == m).collect(),
        };
        if slots.is_empty() {
            continue;
        }
        let mut b = Reader::new(block);
        let stats = metric(&mut b, n)?;
        if !b.is_empty() {
            return Err(PackError::Corrupt("bytes after a rollup metric"));
        }
        for (row, st) in rows.iter_mut().zip(stats) {
            for &slot in &slots {
                row.metrics[slot] = st;
            }
        }
    }
    if !r.is_empty() {
        return Err(PackError::Corrupt("bytes after the rollup minutes"));
    }
    Ok(rows)
}

/// Whether each minute start is after the one before.
fn minutes_in_order(mut minutes: impl Iterator<Item = UnixMs>) -> bool {
    let mut before: Option<UnixMs> = None;
    minutes.all(|m| {
        let ok = before.is_none_or(|b| b < m);
        before = Some(m);
        ok
    })
}

/// One metric's block: its `n` minutes' stats.
fn metric(r: &mut Reader<'_>, n: usize) -> Result<Vec<Stats>, PackError> {
    let mut stats = vec![Stats::default(); n];
    for (s, v) in stats.iter_mut().zip(r.values(n)?) {
        s.n = narrow(Some(v))?.unwrap_or_default();
    }
    let mode = r.byte()?;
    if mode != AVG_BITS && mode != AVG_SUMS {
        return Err(PackError::Corrupt("unknown average mode"));
    }
    for (s, v) in stats.iter_mut().zip(r.column(n)?) {
        s.avg = match (mode, v) {
            (_, None) => None,
            (AVG_BITS, Some(bits)) => Some(f64::from_bits(bits)),
            (AVG_SUMS, Some(sum)) if s.n > 0 => Some(sum as i64 as f64 / f64::from(s.n)),
            (AVG_SUMS, Some(_)) => return Err(PackError::Corrupt("an average of no samples")),
            _ => return Err(PackError::Corrupt("unknown average mode")),
        };
    }
    for (s, v) in stats.iter_mut().zip(r.column(n)?) {
        s.min = v;
    }
    for (s, v) in stats.iter_mut().zip(r.column(n)?) {
        s.max = v;
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{corruptions, frame_raw};
    use super::*;
    use proptest::prelude::*;

    /// A metric with its average as bits.
    type StatBits = (u32, Option<u64>, Option<u64>, Option<u64>);

    /// Bits compare floats exactly (NaN, -0.0) where `==` would not.
    fn bits(rows: &[RollupRow]) -> Vec<(i64, u32, Vec<StatBits>)> {
        rows.iter()
            .map(|r| {
                let m = r.metrics.iter();
                let m = m.map(|s| (s.n, s.avg.map(f64::to_bits), s.min, s.max));
                (r.minute_ms, r.samples, m.collect())
            })
            .collect()
    }

    /// A metric as the database writes it: absent (no sample had it), or the stats of
    /// `n` integer samples (average rounded from their sum), or of floats.
    fn stats() -> impl Strategy<Value = Stats> {
        let ints = (1u32..=3600, any::<i64>(), any::<i64>()).prop_map(|(n, a, b)| {
            let (lo, hi) = (a.min(b), a.max(b));
            // Samples between lo and hi: the sum of n of them, as the database takes it.
            let sum = (i128::from(lo) * i128::from(n) + i128::from(hi.wrapping_sub(lo) % 7)) as f64;
            Stats {
                n,
                avg: Some(sum / f64::from(n)),
                min: Some(lo as u64),
                max: Some(hi as u64),
            }
        });
        let small = (1u32..=60, 0i64..400_000, 0i64..5_000).prop_map(|(n, lo, spread)| Stats {
            n,
            avg: Some((lo * i64::from(n) + spread) as f64 / f64::from(n)),
            min: Some(lo as u64),
            max: Some((lo + spread) as u64),
        });
        let floats =
            (1u32..=60, any::<f64>(), any::<u64>(), any::<u64>()).prop_map(|(n, avg, min, max)| {
                Stats {
                    n,
                    avg: Some(avg),
                    min: Some(min),
                    max: Some(max),
                }
            });
        prop_oneof![Just(Stats::default()), ints, small, floats]
    }

    fn rows(width: usize) -> impl Strategy<Value = Vec<RollupRow>> {
        proptest::collection::vec(
            (0u32..=3600, proptest::collection::vec(stats(), width)),
            0..=MAX_MINUTES,
        )
        .prop_map(|minutes| {
            (minutes.into_iter().enumerate())
                .map(|(i, (samples, metrics))| RollupRow {
                    minute_ms: 1_700_000_000_000 + 60_000 * i as i64,
                    samples,
                    metrics,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn every_minute_survives_bit_for_bit(rows in (0usize..30).prop_flat_map(rows)) {
            let packed = pack(&rows).expect("packs");
            prop_assert_eq!(bits(&unpack(&packed).expect("unpacks")), bits(&rows));
        }

        #[test]
        fn a_chart_reads_the_metrics_it_asks_for(
            rows in rows(5),
            wanted in proptest::collection::vec(0usize..5, 0..4),
        ) {
            let packed = pack(&rows).expect("packs");
            let some = unpack_metrics(&packed, &wanted).expect("unpacks");
            let want: Vec<RollupRow> = (rows.iter())
                .map(|r| RollupRow {
                    metrics: wanted.iter().map(|&i| r.metrics[i]).collect(),
                    ..r.clone()
                })
                .collect();
            prop_assert_eq!(bits(&some), bits(&want));
            // A metric added after the value was packed: absent in every minute.
            let later = unpack_metrics(&packed, &[5, 0]).expect("unpacks");
            let want: Vec<RollupRow> = (rows.iter())
                .map(|r| RollupRow {
                    metrics: vec![Stats::default(), r.metrics[0]],
                    ..r.clone()
                })
                .collect();
            prop_assert_eq!(bits(&later), bits(&want));
        }

        #[test]
        fn no_corrupt_payload_panics_the_reader(
            rows in rows(3),
            flips in proptest::collection::vec((any::<usize>(), 1u8..), 1..6),
            cut in any::<usize>(),
        ) {
            prop_assume!(!rows.is_empty());
            for bad in corruptions(&pack(&rows).expect("packs"), &flips, cut) {
                let _ = unpack(&bad);
                let _ = unpack_metrics(&bad, &[2, 0]);
            }
        }
    }

    #[test]
    fn integer_averages_are_stored_as_sums() {
        // 60 one-second samples of power around 250 W: the averages are quotients of sums.
        let minute = |i: i64| RollupRow {
            minute_ms: 60_000 * i,
            samples: 60,
            metrics: vec![Stats {
                n: 60,
                avg: Some((15_000_000 + 997 * i) as f64 / 60.0),
                min: Some(240_000),
                max: Some(260_000 + i as u64),
            }],
        };
        let rows: Vec<RollupRow> = (0..60).map(minute).collect();
        let packed = pack(&rows).expect("packs");
        assert_eq!(bits(&unpack(&packed).expect("unpacks")), bits(&rows));
        let payload = open(&packed).expect("opens");
        // count, width, linear minutes, linear samples, block length, linear n, then the
        // mode.
        let mode_at = payload.iter().position(|&b| b == AVG_SUMS);
        assert!(mode_at.is_some(), "sums mode in {payload:?}");
        assert!(packed.len() < 60 * 2, "{} bytes for an hour", packed.len());
        // An average that is no quotient of an integer sum keeps its bits.
        let mut odd = rows.clone();
        odd[7].metrics[0].avg = Some(250_000.123_456_789);
        let packed = pack(&odd).expect("packs");
        assert_eq!(bits(&unpack(&packed).expect("unpacks")), bits(&odd));
    }

    #[test]
    fn what_a_value_cannot_hold_is_refused() {
        let row = |w: usize| RollupRow {
            metrics: vec![Stats::default(); w],
            ..RollupRow::default()
        };
        let many = vec![row(1); MAX_MINUTES + 1];
        assert_eq!(pack(&many), Err(PackError::TooLarge("rollup minutes")));
        assert_eq!(
            pack(&[row(MAX_METRICS + 1)]),
            Err(PackError::TooLarge("rollup metrics"))
        );
        assert!(pack(&[row(2), row(3)]).is_err());
        assert_eq!(unpack(&pack(&[]).expect("packs")), Ok(vec![]));
    }

    #[test]
    fn minutes_must_be_in_order() {
        let at = |minute_ms: i64| RollupRow {
            minute_ms,
            samples: 1,
            metrics: vec![Stats::default()],
        };
        let bad = || PackError::Corrupt("rollup minutes out of order");
        for minutes in [[0, 0], [60_000, 0], [120_000, 60_000]] {
            assert_eq!(pack(&[at(minutes[0]), at(minutes[1])]), Err(bad()));
            // The same minutes in a payload that passed its checksum.
            let mut payload = Vec::new();
            put_varint(&mut payload, 2);
            put_varint(&mut payload, 0);
            put_values(&mut payload, &minutes.map(|m| m as u64));
            put_values(&mut payload, &[1, 1]);
            assert_eq!(unpack(&frame_raw(&payload)), Err(bad()), "{minutes:?}");
        }
        assert!(pack(&[at(-60_000), at(0), at(120_000)]).is_ok());
    }

    #[test]
    fn an_unknown_average_mode_is_refused_even_with_no_average() {
        // One minute of one metric, every value absent, with the mode byte given.
        let value = |mode: u8| {
            let mut block = Vec::new();
            put_values(&mut block, &[0]);
            block.push(mode);
            for _ in 0..3 {
                put_column(&mut block, std::iter::once(None));
            }
            let mut payload = Vec::new();
            put_varint(&mut payload, 1);
            put_varint(&mut payload, 1);
            put_values(&mut payload, &[0]);
            put_values(&mut payload, &[0]);
            put_varint(&mut payload, block.len() as u64);
            payload.extend_from_slice(&block);
            frame_raw(&payload)
        };
        let absent = RollupRow {
            minute_ms: 0,
            samples: 0,
            metrics: vec![Stats::default()],
        };
        assert_eq!(
            pack(std::slice::from_ref(&absent)).map(|p| unpack(&p)),
            Ok(Ok(vec![absent.clone()]))
        );
        for mode in [AVG_BITS, AVG_SUMS] {
            assert_eq!(unpack(&value(mode)), Ok(vec![absent.clone()]));
        }
        assert_eq!(
            unpack(&value(7)),
            Err(PackError::Corrupt("unknown average mode"))
        );
    }
}
