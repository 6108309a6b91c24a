//! A minute of the process ticks of one GPU (a `process_samples` row each: what changes
//! per tick, and the lifetime holding the process's identity). Payload: the count, then
//! the rows ordered by process (pid, lifetime, time), so each column is a run per process
//! that barely changes: times, pids, lifetime ids, then the optional memory and
//! utilization columns.

use super::columns::{Reader, put_column, put_values, put_varint};
use super::{Field, MAX_PROCESS_ROWS, PackError, narrow, open, seal};
use gpufleet_core::UnixMs;

/// One process on one GPU at one tick, as `process_samples` holds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProcessTick {
    pub ts_ms: UnixMs,
    pub pid: u32,
    /// `process_lives.id`.
    pub life_id: i64,
    pub gpu_mem_bytes: Option<u64>,
    pub sm_util_pct: Option<u32>,
    pub mem_util_pct: Option<u32>,
    pub enc_util_pct: Option<u32>,
    pub dec_util_pct: Option<u32>,
}

/// The optional columns in storage order, after time, pid and lifetime.
const VALUES: &[Field<ProcessTick>] = fields!(ProcessTick;
    gpu_mem_bytes: u64,
    sm_util_pct: u32,
    mem_util_pct: u32,
    enc_util_pct: u32,
    dec_util_pct: u32,
);

/// Packs `ticks` (one GPU's, at most [`MAX_PROCESS_ROWS`]).
pub fn pack(ticks: &[ProcessTick]) -> Result<Vec<u8>, PackError> {
    if ticks.len() > MAX_PROCESS_ROWS {
        return Err(PackError::TooLarge("process ticks"));
    }
    let mut rows: Vec<&ProcessTick> = ticks.iter().collect();
    rows.sort_by_key(|p| (p.pid, p.life_id, p.ts_ms));
    let mut out = Vec::new();
    put_varint(&mut out, rows.len() as u64);
    let column = |f: fn(&ProcessTick) -> u64| rows.iter().map(|&p| f(p)).collect::<Vec<_>>();
    put_values(&mut out, &column(|p| p.ts_ms as u64));
    put_values(&mut out, &column(|p| u64::from(p.pid)));
    put_values(&mut out, &column(|p| p.life_id as u64));
    for (get, _) in VALUES {
        put_column(&mut out, rows.iter().map(|&p| get(p)));
    }
    seal(&out)
}

/// The ticks of a value written by [`pack`], by time, then pid, then lifetime.
pub fn unpack(packed: &[u8]) -> Result<Vec<ProcessTick>, PackError> {
    let payload = open(packed)?;
    let mut r = Reader::new(&payload);
    let n = r.count(MAX_PROCESS_ROWS)?;
    let ts = r.values(n)?;
    let pids = r.values(n)?;
    let lives = r.values(n)?;
    let mut out = Vec::with_capacity(n);
    for ((t, pid), life) in ts.into_iter().zip(pids).zip(lives) {
        out.push(ProcessTick {
            ts_ms: t as UnixMs,
            pid: narrow(Some(pid))?.unwrap_or_default(),
            life_id: life as i64,
            ..ProcessTick::default()
        });
    }
    for (_, set) in VALUES {
        for (p, v) in out.iter_mut().zip(r.column(n)?) {
            set(p, v)?;
        }
    }
    if !r.is_empty() {
        return Err(PackError::Corrupt("bytes after the last column"));
    }
    out.sort_by_key(|p| (p.ts_ms, p.pid, p.life_id));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::tests::corruptions;
    use super::*;
    use proptest::option::of;
    use proptest::prelude::*;

    fn tick() -> impl Strategy<Value = ProcessTick> {
        (
            any::<i64>(),
            any::<u32>(),
            any::<i64>(),
            of(any::<u64>()),
            (
                of(any::<u32>()),
                of(any::<u32>()),
                of(any::<u32>()),
                of(any::<u32>()),
            ),
        )
            .prop_map(|(ts_ms, pid, life_id, gpu_mem_bytes, u)| ProcessTick {
                ts_ms,
                pid,
                life_id,
                gpu_mem_bytes,
                sm_util_pct: u.0,
                mem_util_pct: u.1,
                enc_util_pct: u.2,
                dec_util_pct: u.3,
            })
    }

    proptest! {
        #[test]
        fn every_field_of_every_tick_survives(ticks in proptest::collection::vec(tick(), 0..130)) {
            let mut want = ticks.clone();
            want.sort_by_key(|p| (p.ts_ms, p.pid, p.life_id));
            let got = unpack(&pack(&ticks).expect("packs")).expect("unpacks");
            // Rows equal in (time, pid, lifetime) may come back in either order.
            let key = |v: &[ProcessTick]| {
                let mut v = v.to_vec();
                v.sort();
                v
            };
            prop_assert_eq!(key(&got), key(&want));
            prop_assert!(got.windows(2).all(|w| (w[0].ts_ms, w[0].pid) <= (w[1].ts_ms, w[1].pid)));
        }

        #[test]
        fn no_corrupt_payload_panics_the_reader(
            ticks in proptest::collection::vec(tick(), 1..20),
            flips in proptest::collection::vec((any::<usize>(), 1u8..), 1..6),
            cut in any::<usize>(),
        ) {
            for bad in corruptions(&pack(&ticks).expect("packs"), &flips, cut) {
                let _ = unpack(&bad);
            }
        }
    }

    #[test]
    fn more_ticks_than_a_value_holds_are_not_packed() {
        let ticks = vec![ProcessTick::default(); MAX_PROCESS_ROWS + 1];
        assert_eq!(pack(&ticks), Err(PackError::TooLarge("process ticks")));
    }
}
