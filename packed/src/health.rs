//! An hour of one GPU's health readings (a `gpu_health` row each). The agent reads them
//! every 30 s and they rarely change, so an hour is the span that packs: a minute would
//! hold two. Payload: the count, the times, then each optional field as a column
//! (counters as integers, flags as 0 or 1). The readings come back without their GPU's
//! UUID (the GPU is the row's key, as in `gpu_health`).

use super::columns::{Reader, put_column, put_values, put_varint};
use super::{Field, MAX_ROWS, PackError, open, seal};
use gpufleet_core::{GpuHealthSample, UnixMs};

/// The optional fields in storage order.
const VALUES: &[Field<GpuHealthSample>] = fields!(GpuHealthSample;
    retired_pages_sbe: u32,
    retired_pages_dbe: u32,
    retired_pages_pending: bool,
    remapped_rows_correctable: u32,
    remapped_rows_uncorrectable: u32,
    remapped_rows_pending: bool,
    remapped_rows_failed: bool,
    ecc_corrected_aggregate: u64,
    ecc_uncorrected_aggregate: u64,
    pcie_replay_count: u64,
    nvlink_crc_errors: u64,
    nvlink_replay_errors: u64,
    nvlink_recovery_errors: u64,
    persistence_mode: bool,
);

/// Packs `readings` (one GPU's, distinct times, at most [`MAX_ROWS`]).
pub fn pack(readings: &[(UnixMs, GpuHealthSample)]) -> Result<Vec<u8>, PackError> {
    if readings.len() > MAX_ROWS {
        return Err(PackError::TooLarge("health readings"));
    }
    let mut rows: Vec<&(UnixMs, GpuHealthSample)> = readings.iter().collect();
    rows.sort_by_key(|(t, _)| *t);
    // What unpacking would refuse.
    if rows.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(PackError::Corrupt("health readings at one time"));
    }
    let mut out = Vec::new();
    put_varint(&mut out, rows.len() as u64);
    put_values(
        &mut out,
        &rows.iter().map(|(t, _)| *t as u64).collect::<Vec<_>>(),
    );
    for (get, _) in VALUES {
        put_column(&mut out, rows.iter().map(|(_, h)| get(h)));
    }
    seal(&out)
}

/// The readings of a value written by [`pack`], by time, each with an empty UUID.
pub fn unpack(packed: &[u8]) -> Result<Vec<(UnixMs, GpuHealthSample)>, PackError> {
    let payload = open(packed)?;
    let mut r = Reader::new(&payload);
    let n = r.count(MAX_ROWS)?;
    let mut out: Vec<(UnixMs, GpuHealthSample)> = r
        .values(n)?
        .into_iter()
        .map(|t| (t as UnixMs, GpuHealthSample::default()))
        .collect();
    for (_, set) in VALUES {
        for ((_, h), v) in out.iter_mut().zip(r.column(n)?) {
            set(h, v)?;
        }
    }
    if !r.is_empty() {
        return Err(PackError::Corrupt("bytes after the last column"));
    }
    if out.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(PackError::Corrupt("health readings out of order"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{corruptions, frame_raw};
    use super::*;
    use proptest::option::of;
    use proptest::prelude::*;

    fn reading() -> impl Strategy<Value = GpuHealthSample> {
        (
            (of(any::<u32>()), of(any::<u32>()), of(any::<bool>())),
            (of(any::<u32>()), of(any::<u32>())),
            (of(any::<bool>()), of(any::<bool>())),
            (of(any::<u64>()), of(any::<u64>()), of(any::<u64>())),
            (of(any::<u64>()), of(any::<u64>()), of(any::<u64>())),
            of(any::<bool>()),
        )
            .prop_map(|(pages, rows, remap, ecc, nvlink, persistence_mode)| {
                GpuHealthSample {
                    gpu_uuid: String::new(),
                    retired_pages_sbe: pages.0,
                    retired_pages_dbe: pages.1,
                    retired_pages_pending: pages.2,
                    remapped_rows_correctable: rows.0,
                    remapped_rows_uncorrectable: rows.1,
                    remapped_rows_pending: remap.0,
                    remapped_rows_failed: remap.1,
                    ecc_corrected_aggregate: ecc.0,
                    ecc_uncorrected_aggregate: ecc.1,
                    pcie_replay_count: ecc.2,
                    nvlink_crc_errors: nvlink.0,
                    nvlink_replay_errors: nvlink.1,
                    nvlink_recovery_errors: nvlink.2,
                    persistence_mode,
                }
            })
    }

    /// Readings at distinct times, in any order.
    fn readings() -> impl Strategy<Value = Vec<(UnixMs, GpuHealthSample)>> {
        proptest::collection::btree_map(any::<i64>(), reading(), 0..150)
            .prop_map(|m| m.into_iter().rev().collect())
    }

    proptest! {
        #[test]
        fn every_field_of_every_reading_survives(readings in readings()) {
            let mut want = readings.clone();
            want.sort_by_key(|(t, _)| *t);
            prop_assert_eq!(unpack(&pack(&readings).expect("packs")).expect("unpacks"), want);
        }

        #[test]
        fn no_corrupt_payload_panics_the_reader(
            readings in readings().prop_filter("some", |r| !r.is_empty()),
            flips in proptest::collection::vec((any::<usize>(), 1u8..), 1..6),
            cut in any::<usize>(),
        ) {
            for bad in corruptions(&pack(&readings).expect("packs"), &flips, cut) {
                let _ = unpack(&bad);
            }
        }
    }

    #[test]
    fn an_hour_of_readings_every_30_s_packs_into_a_few_dozen_bytes() {
        let steady = GpuHealthSample {
            retired_pages_sbe: Some(0),
            retired_pages_dbe: Some(0),
            retired_pages_pending: Some(false),
            remapped_rows_correctable: Some(2),
            remapped_rows_uncorrectable: Some(0),
            remapped_rows_pending: Some(false),
            remapped_rows_failed: Some(false),
            ecc_corrected_aggregate: Some(17),
            ecc_uncorrected_aggregate: Some(0),
            pcie_replay_count: Some(3),
            persistence_mode: Some(true),
            ..GpuHealthSample::default()
        };
        let hour: Vec<_> = (0..120)
            .map(|k| (1_700_000_000_000 + k * 30_000, steady.clone()))
            .collect();
        let packed = pack(&hour).expect("packs");
        assert!(packed.len() < 60, "{} bytes", packed.len());
        assert_eq!(unpack(&packed), Ok(hour));
    }

    #[test]
    fn flags_other_than_0_or_1_and_repeated_times_are_corrupt() {
        let mut payload = Vec::new();
        put_varint(&mut payload, 1);
        put_values(&mut payload, &[5]);
        for k in 0..VALUES.len() {
            // The third column is a flag.
            put_column(&mut payload, std::iter::once((k == 2).then_some(2)));
        }
        assert_eq!(
            unpack(&frame_raw(&payload)),
            Err(PackError::Corrupt("a flag out of range"))
        );
        let mut payload = Vec::new();
        put_varint(&mut payload, 2);
        put_values(&mut payload, &[5, 5]);
        for _ in VALUES {
            put_column(&mut payload, [None, None].into_iter());
        }
        assert_eq!(
            unpack(&frame_raw(&payload)),
            Err(PackError::Corrupt("health readings out of order"))
        );
        let many = vec![(0, GpuHealthSample::default()); MAX_ROWS + 1];
        assert_eq!(pack(&many), Err(PackError::TooLarge("health readings")));
        let twice = vec![(5, GpuHealthSample::default()); 2];
        assert_eq!(
            pack(&twice),
            Err(PackError::Corrupt("health readings at one time"))
        );
    }
}
