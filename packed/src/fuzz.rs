//! The fuzz target's entry function (`fuzz/fuzz_targets/unpack_packed.rs`), also run by
//! `cargo test` over the committed seed corpus (`fuzz/corpus/unpack_packed`).
//!
//! The first byte picks the payload kind, the rest is a packed value as it could come back
//! from the database: corrupt, cut short, or from another collector. Unpacking must answer
//! an error or values without panicking or allocating past the limits; what unpacks must
//! pack again and unpack to the same values (a value the reader accepts is one the writer
//! could have written).

/// Unpacks what `data` holds as the kind `data[0]` names; panics only on a broken round
/// trip. `data[1]` even: the rest is a payload, framed with a correct checksum (the
/// payload readers are where the parsing is; a fuzzer would rarely get past the checksum
/// on its own). Odd: the rest is a whole value (header, checksum, compression).
pub fn unpack(data: &[u8]) {
    let [kind, framing, rest @ ..] = data else {
        return;
    };
    let framed;
    let value = if framing % 2 == 0 {
        match crate::seal(rest) {
            Ok(v) => {
                framed = v;
                &framed[..]
            }
            Err(_) => return,
        }
    } else {
        rest
    };
    match kind % 6 {
        0 => round_trip(value, crate::gpu::unpack, crate::gpu::pack),
        1 => round_trip(value, crate::process::unpack, crate::process::pack),
        2 => round_trip(value, crate::host::unpack, crate::host::pack),
        3 => round_trip(value, crate::health::unpack, crate::health::pack),
        4 => round_trip(value, crate::rollup::unpack, crate::rollup::pack),
        _ => {
            // A chart's read of some metrics only: the same checks, fewer columns kept.
            let _ = crate::rollup::unpack_metrics(value, &[0, 3]);
        }
    }
}

/// Values compare by their `Debug` text: a NaN that came in must come back as NaN.
fn round_trip<T: std::fmt::Debug>(
    value: &[u8],
    unpack: fn(&[u8]) -> Result<Vec<T>, crate::PackError>,
    pack: impl Fn(&[T]) -> Result<Vec<u8>, crate::PackError>,
) {
    let Ok(values) = unpack(value) else {
        return;
    };
    let packed = pack(&values)
        .unwrap_or_else(|e| panic!("{} values unpacked but do not pack: {e}", values.len()));
    let again =
        unpack(&packed).unwrap_or_else(|e| panic!("a value packed anew does not unpack: {e}"));
    assert_eq!(
        format!("{values:?}"),
        format!("{again:?}"),
        "the round trip changed values"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed corpus, each seed and each of its prefixes (cut-short payloads are the
    /// commonest garbage).
    #[test]
    fn the_seed_corpus_unpacks_without_a_panic() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/unpack_packed");
        let mut seeds = 0;
        for entry in std::fs::read_dir(&dir).expect("the seed corpus") {
            let data = std::fs::read(entry.expect("corpus entry").path()).expect("corpus file");
            seeds += 1;
            for end in 0..=data.len() {
                unpack(&data[..end]);
            }
        }
        assert!(seeds >= 5, "{}: the seed corpus is missing", dir.display());
    }

    /// Writes the seed corpus: a packed value of each kind, as a payload (framing 0) and
    /// whole (framing 1). Run by hand after a format change:
    /// `cargo test -p gpufleet-packed -- --ignored write_the_seed_corpus`.
    #[test]
    #[ignore = "writes fuzz/corpus/unpack_packed"]
    fn write_the_seed_corpus() {
        use gpufleet_core::{GpuHealthSample, GpuSample, HostSample, NvLinkSample};
        let gpu = |t: i64| GpuSample {
            util_gpu_pct: Some(40 + t as u32 % 7),
            power_mw: Some(300_000 + t as u32),
            energy_mj: Some(9_000_000 + 300 * t as u64),
            temp_gpu_c: Some(61),
            nvlinks: vec![NvLinkSample {
                link: 0,
                tx_bps: Some(7),
                rx_bps: None,
            }],
            ..GpuSample::default()
        };
        let gpus: Vec<_> = (0..6).map(|t| (t * 10_000, gpu(t))).collect();
        let process: Vec<_> = (0..6)
            .map(|t| crate::process::ProcessTick {
                ts_ms: t * 10_000,
                pid: 4242,
                life_id: 3,
                gpu_mem_bytes: Some(1 << 30),
                sm_util_pct: Some(55),
                ..Default::default()
            })
            .collect();
        let host: Vec<_> = (0..6)
            .map(|t| crate::HostRow {
                time_ms: t * 10_000,
                sample: Some(HostSample {
                    cpu_util_pct: Some(12.5),
                    ..HostSample::default()
                }),
                cost: None,
            })
            .collect();
        let health: Vec<_> = (0..4)
            .map(|t| {
                (
                    t * 30_000,
                    GpuHealthSample {
                        retired_pages_sbe: Some(1),
                        ..Default::default()
                    },
                )
            })
            .collect();
        let rollup = vec![crate::rollup::RollupRow {
            minute_ms: 60_000,
            samples: 6,
            metrics: vec![
                crate::rollup::Stats {
                    n: 6,
                    avg: Some(42.5),
                    min: Some(40),
                    max: Some(46)
                };
                4
            ],
        }];
        let values = [
            crate::gpu::pack(&gpus),
            crate::process::pack(&process),
            crate::host::pack(&host),
            crate::health::pack(&health),
            crate::rollup::pack(&rollup),
            crate::rollup::pack(&rollup),
        ];
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/unpack_packed");
        std::fs::create_dir_all(&dir).expect("corpus folder");
        for (kind, value) in values.into_iter().enumerate() {
            let value = value.expect("packs");
            let payload = crate::open(&value).expect("opens");
            let kind = kind as u8;
            let seeds = [([kind, 0], payload), ([kind, 1], value)];
            for (head, body) in seeds {
                let name = format!("kind{kind}_framing{}", head[1]);
                std::fs::write(dir.join(name), [&head[..], &body].concat()).expect("seed");
            }
        }
    }
}
