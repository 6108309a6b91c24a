//! A minute of one GPU's samples. Payload: the sample count, the timestamps, one optional
//! column per scalar field (in [`FIELDS`] order), then the NVLink links: a column of how
//! many each sample has, their link numbers (sample by sample), and their TX and RX rates
//! link by link (all samples of the lowest link first), so that each rate is a
//! difference from the same link's previous one. Then, only when a sample has GPM, its
//! block: one column per [`GpmMetrics::NAMES`], a column of how many MIG instances each
//! sample has GPM for, their UUIDs (length and bytes) and GPU instance ids (sample by
//! sample), and one column per GPM metric over them. A value ending before the block (all
//! values packed before GPM was kept) reads as samples without GPM.

use super::columns::{Reader, put_column, put_values, put_varint};
use super::{Field, MAX_LINKS, MAX_ROWS, PackError, narrow, open, seal};
use gpufleet_core::{GpmMetrics, GpuSample, MigGpm, NvLinkSample, UnixMs};
use std::borrow::Borrow;

/// The scalar fields in storage order.
const FIELDS: &[Field<GpuSample>] = fields!(GpuSample;
    util_gpu_pct: u32,
    util_mem_pct: u32,
    mem_used_bytes: u64,
    mem_total_bytes: u64,
    mem_reserved_bytes: u64,
    power_mw: u32,
    power_instant_mw: u32,
    power_limit_mw: u32,
    energy_mj: u64,
    temp_gpu_c: u32,
    temp_mem_c: u32,
    fan_pct: u32,
    clock_sm_mhz: u32,
    clock_mem_mhz: u32,
    clock_graphics_mhz: u32,
    pstate: u32,
    pcie_tx_bps: u64,
    pcie_rx_bps: u64,
    nvlink_tx_bps: u64,
    nvlink_rx_bps: u64,
    ecc_corrected_volatile: u64,
    ecc_uncorrected_volatile: u64,
    throttle_reasons: u64,
    enc_util_pct: u32,
    dec_util_pct: u32,
);

/// The positions of every link of every sample, link by link (then sample by sample).
fn link_order<S: Borrow<GpuSample>>(samples: &[(UnixMs, S)]) -> Vec<(usize, usize)> {
    let mut order: Vec<(u32, usize, usize)> = samples
        .iter()
        .enumerate()
        .flat_map(|(i, (_, s))| {
            s.borrow()
                .nvlinks
                .iter()
                .enumerate()
                .map(move |(j, l)| (l.link, i, j))
        })
        .collect();
    order.sort_unstable();
    order.into_iter().map(|(_, i, j)| (i, j)).collect()
}

/// Packs `samples` (one GPU's, any order of time; their UUIDs are not kept): at most
/// [`MAX_ROWS`], each with at most [`MAX_LINKS`] links.
pub fn pack<S: Borrow<GpuSample>>(samples: &[(UnixMs, S)]) -> Result<Vec<u8>, PackError> {
    if samples.len() > MAX_ROWS {
        return Err(PackError::TooLarge("GPU samples"));
    }
    let samples: Vec<(UnixMs, &GpuSample)> =
        samples.iter().map(|(t, s)| (*t, s.borrow())).collect();
    if samples.iter().any(|(_, s)| s.nvlinks.len() > MAX_LINKS) {
        return Err(PackError::TooLarge("NVLink links of a sample"));
    }
    let mut out = Vec::new();
    put_varint(&mut out, samples.len() as u64);
    let ts: Vec<u64> = samples.iter().map(|(t, _)| *t as u64).collect();
    put_values(&mut out, &ts);
    for (get, _) in FIELDS {
        put_column(&mut out, samples.iter().map(|(_, s)| get(s)));
    }
    let counts: Vec<u64> = samples
        .iter()
        .map(|(_, s)| s.nvlinks.len() as u64)
        .collect();
    put_values(&mut out, &counts);
    let links: Vec<u64> = samples
        .iter()
        .flat_map(|(_, s)| s.nvlinks.iter().map(|l| u64::from(l.link)))
        .collect();
    put_values(&mut out, &links);
    let order = link_order(&samples);
    let link = |(i, j): (usize, usize)| &samples[i].1.nvlinks[j];
    put_column(&mut out, order.iter().map(|&at| link(at).tx_bps));
    put_column(&mut out, order.iter().map(|&at| link(at).rx_bps));
    if samples
        .iter()
        .any(|(_, s)| !s.gpm.is_empty() || !s.mig_gpm.is_empty())
    {
        pack_gpm(&mut out, &samples)?;
    }
    seal(&out)
}

/// Most MIG instances a sample has GPM for (an H100 makes at most 7).
const MAX_MIGS: usize = 8;
/// Longest MIG UUID kept.
const MAX_UUID: usize = 256;

fn pack_gpm(out: &mut Vec<u8>, samples: &[(UnixMs, &GpuSample)]) -> Result<(), PackError> {
    let migs: Vec<&MigGpm> = samples.iter().flat_map(|(_, s)| &s.mig_gpm).collect();
    if samples.iter().any(|(_, s)| s.mig_gpm.len() > MAX_MIGS)
        || migs.iter().any(|m| m.mig_uuid.len() > MAX_UUID)
    {
        return Err(PackError::TooLarge("MIG GPM of a sample"));
    }
    let whole: Vec<[Option<u64>; 14]> = samples.iter().map(|(_, s)| s.gpm.values()).collect();
    for k in 0..GpmMetrics::NAMES.len() {
        put_column(out, whole.iter().map(|v| v[k]));
    }
    let counts: Vec<u64> = samples
        .iter()
        .map(|(_, s)| s.mig_gpm.len() as u64)
        .collect();
    put_values(out, &counts);
    for m in &migs {
        put_varint(out, m.mig_uuid.len() as u64);
        out.extend_from_slice(m.mig_uuid.as_bytes());
    }
    let ids: Vec<u64> = migs.iter().map(|m| u64::from(m.gpu_instance_id)).collect();
    put_values(out, &ids);
    let values: Vec<[Option<u64>; 14]> = migs.iter().map(|m| m.gpm.values()).collect();
    for k in 0..GpmMetrics::NAMES.len() {
        put_column(out, values.iter().map(|v| v[k]));
    }
    Ok(())
}

fn unpack_gpm(r: &mut Reader<'_>, samples: &mut [(UnixMs, GpuSample)]) -> Result<(), PackError> {
    let n = samples.len();
    let corrupt = || PackError::Corrupt("a GPM activity out of range");
    let mut whole = vec![[None; 14]; n];
    for k in 0..GpmMetrics::NAMES.len() {
        for (v, x) in whole.iter_mut().zip(r.column(n)?) {
            v[k] = x;
        }
    }
    for ((_, s), v) in samples.iter_mut().zip(whole) {
        s.gpm = GpmMetrics::from_values(v).ok_or_else(corrupt)?;
    }
    let counts = r.values(n)?;
    if counts.iter().any(|c| *c > MAX_MIGS as u64) {
        return Err(PackError::Corrupt("a sample with too many MIG instances"));
    }
    // At most MAX_ROWS × MAX_MIGS: no overflow.
    let total = counts.iter().sum::<u64>() as usize;
    r.spend(total)?;
    let mut uuids = Vec::with_capacity(total);
    for _ in 0..total {
        let len = r.count(MAX_UUID)?;
        let bytes = r.take(len)?;
        uuids.push(
            String::from_utf8(bytes.to_vec())
                .map_err(|_| PackError::Corrupt("a MIG UUID that is not UTF-8"))?,
        );
    }
    let ids = r.values(total)?;
    let mut values = vec![[None; 14]; total];
    for k in 0..GpmMetrics::NAMES.len() {
        for (v, x) in values.iter_mut().zip(r.column(total)?) {
            v[k] = x;
        }
    }
    let mut migs = uuids.into_iter().zip(ids).zip(values);
    for ((_, s), count) in samples.iter_mut().zip(&counts) {
        for _ in 0..*count {
            let ((mig_uuid, id), v) = migs.next().ok_or(PackError::Truncated)?;
            s.mig_gpm.push(MigGpm {
                mig_uuid,
                gpu_instance_id: narrow(Some(id))?.ok_or(PackError::Truncated)?,
                gpm: GpmMetrics::from_values(v).ok_or_else(corrupt)?,
            });
        }
    }
    Ok(())
}

/// The samples of a value written by [`pack`], in the order they were packed.
pub fn unpack(packed: &[u8]) -> Result<Vec<(UnixMs, GpuSample)>, PackError> {
    let payload = open(packed)?;
    let mut r = Reader::new(&payload);
    let n = r.count(MAX_ROWS)?;
    let mut samples: Vec<(UnixMs, GpuSample)> = r
        .values(n)?
        .into_iter()
        .map(|t| (t as UnixMs, GpuSample::default()))
        .collect();
    for (_, set) in FIELDS {
        for ((_, s), v) in samples.iter_mut().zip(r.column(n)?) {
            set(s, v)?;
        }
    }
    let counts = r.values(n)?;
    if counts.iter().any(|c| *c > MAX_LINKS as u64) {
        return Err(PackError::Corrupt("a sample with too many links"));
    }
    // At most MAX_ROWS × MAX_LINKS: no overflow. The links and their order cost two
    // values each.
    let total = counts.iter().sum::<u64>() as usize;
    r.spend(2 * total)?;
    let mut links = r.values(total)?.into_iter();
    for ((_, s), count) in samples.iter_mut().zip(&counts) {
        for _ in 0..*count {
            let link = narrow(links.next())?.ok_or(PackError::Truncated)?;
            s.nvlinks.push(NvLinkSample {
                link,
                tx_bps: None,
                rx_bps: None,
            });
        }
    }
    let order = link_order(&samples);
    for (&(i, j), v) in order.iter().zip(r.column(order.len())?) {
        samples[i].1.nvlinks[j].tx_bps = v;
    }
    for (&(i, j), v) in order.iter().zip(r.column(order.len())?) {
        samples[i].1.nvlinks[j].rx_bps = v;
    }
    if !r.is_empty() {
        unpack_gpm(&mut r, &mut samples)?;
    }
    if !r.is_empty() {
        return Err(PackError::Corrupt("bytes after the last column"));
    }
    Ok(samples)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::tests::{corruptions, frame_raw};
    use super::*;
    use proptest::prelude::*;

    pub fn gpu_sample() -> impl Strategy<Value = GpuSample> {
        use proptest::option::of;
        let a = (
            of(any::<u32>()),
            of(0u32..=100),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u32>()),
            of(any::<u32>()),
            of(any::<u32>()),
            of(any::<u64>()),
            of(any::<u32>()),
            of(any::<u32>()),
            of(any::<u32>()),
        );
        let b = (
            of(any::<u32>()),
            of(any::<u32>()),
            of(any::<u32>()),
            of(0u32..16),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u64>()),
            of(any::<u32>()),
        );
        let links = proptest::collection::vec((0u32..18, of(any::<u64>()), of(any::<u64>())), 0..4);
        let gpm = proptest::array::uniform14(of(0u64..=u64::from(u32::MAX)))
            .prop_map(|v| GpmMetrics::from_values(v).expect("activities fit"));
        let migs =
            proptest::collection::vec(("[A-Za-z0-9-]{0,40}", any::<u32>(), gpm.clone()), 0..3)
                .prop_map(|m| {
                    m.into_iter()
                        .map(|(mig_uuid, gpu_instance_id, gpm)| MigGpm {
                            mig_uuid,
                            gpu_instance_id,
                            gpm,
                        })
                        .collect::<Vec<_>>()
                });
        let gpm = (any::<bool>(), gpm, migs).prop_map(|(on, g, m)| {
            if on {
                (g, m)
            } else {
                (GpmMetrics::default(), Vec::new())
            }
        });
        (a, b, (of(any::<u32>()), gpm), links).prop_map(|(a, b, (dec, (gpm, mig_gpm)), links)| {
            GpuSample {
                gpm,
                mig_gpm,
                gpu_uuid: String::new(),
                util_gpu_pct: a.0,
                util_mem_pct: a.1,
                mem_used_bytes: a.2,
                mem_total_bytes: a.3,
                mem_reserved_bytes: a.4,
                power_mw: a.5,
                power_instant_mw: a.6,
                power_limit_mw: a.7,
                energy_mj: a.8,
                temp_gpu_c: a.9,
                temp_mem_c: a.10,
                fan_pct: a.11,
                clock_sm_mhz: b.0,
                clock_mem_mhz: b.1,
                clock_graphics_mhz: b.2,
                pstate: b.3,
                pcie_tx_bps: b.4,
                pcie_rx_bps: b.5,
                nvlink_tx_bps: b.6,
                nvlink_rx_bps: b.7,
                ecc_corrected_volatile: b.8,
                ecc_uncorrected_volatile: b.9,
                throttle_reasons: b.10,
                enc_util_pct: b.11,
                dec_util_pct: dec,
                nvlinks: links
                    .into_iter()
                    .map(|(link, tx_bps, rx_bps)| NvLinkSample {
                        link,
                        tx_bps,
                        rx_bps,
                    })
                    .collect(),
            }
        })
    }

    proptest! {
        #[test]
        fn every_field_of_every_sample_survives(
            samples in proptest::collection::vec((any::<i64>(), gpu_sample()), 0..70),
        ) {
            let packed = pack(&samples).expect("packs");
            prop_assert_eq!(unpack(&packed).expect("unpacks"), samples);
        }

        #[test]
        fn no_corrupt_payload_panics_the_reader(
            samples in proptest::collection::vec((any::<i64>(), gpu_sample()), 1..20),
            flips in proptest::collection::vec((any::<usize>(), 1u8..), 1..6),
            cut in any::<usize>(),
        ) {
            for bad in corruptions(&pack(&samples).expect("packs"), &flips, cut) {
                let _ = unpack(&bad);
            }
        }
    }

    #[test]
    fn what_cannot_be_unpacked_is_not_packed_nor_built() {
        let sample = |links: usize| GpuSample {
            nvlinks: vec![NvLinkSample::default(); links],
            ..GpuSample::default()
        };
        assert!(pack(&vec![(0, sample(0)); MAX_ROWS + 1]).is_err());
        assert!(pack(&[(0, sample(MAX_LINKS + 1))]).is_err());
        // The most samples with the most links each: a few bytes that would make
        // millions of links are refused before any is built.
        let mut payload = Vec::new();
        put_varint(&mut payload, MAX_ROWS as u64);
        put_values(&mut payload, &vec![0; MAX_ROWS]);
        // Every field absent.
        payload.extend(std::iter::repeat_n(0, FIELDS.len()));
        put_values(&mut payload, &vec![MAX_LINKS as u64; MAX_ROWS]);
        assert!(payload.len() < 100);
        assert_eq!(
            unpack(&frame_raw(&payload)),
            Err(PackError::Corrupt("more values than a packed value holds"))
        );
    }

    #[test]
    fn values_packed_before_gpm_read_as_samples_without_it() {
        let old = GpuSample {
            power_mw: Some(300_000),
            ..GpuSample::default()
        };
        let packed = pack(&[(5, old.clone())]).expect("packs");
        // No GPM: the value ends after the links, as every value packed before GPM.
        let with = GpuSample {
            gpm: GpmMetrics {
                tensor_active_cpct: Some(0),
                ..GpmMetrics::default()
            },
            ..old.clone()
        };
        let longer = pack(&[(5, with.clone())]).expect("packs");
        assert!(longer.len() > packed.len());
        assert_eq!(unpack(&packed).expect("unpacks"), [(5, old)]);
        // A present 0 stays a 0 (absent is not zero, and zero is not absent).
        assert_eq!(unpack(&longer).expect("unpacks"), [(5, with)]);
    }

    #[test]
    fn every_field_of_the_sample_type_is_packed() {
        // Spelled out without `..`: a field added to GpuSample fails to compile here
        // until it is added to FIELDS (or the links) and counted below.
        let GpuSample {
            gpu_uuid: _,
            util_gpu_pct: _,
            util_mem_pct: _,
            mem_used_bytes: _,
            mem_total_bytes: _,
            mem_reserved_bytes: _,
            power_mw: _,
            power_instant_mw: _,
            power_limit_mw: _,
            energy_mj: _,
            temp_gpu_c: _,
            temp_mem_c: _,
            fan_pct: _,
            clock_sm_mhz: _,
            clock_mem_mhz: _,
            clock_graphics_mhz: _,
            pstate: _,
            pcie_tx_bps: _,
            pcie_rx_bps: _,
            nvlink_tx_bps: _,
            nvlink_rx_bps: _,
            nvlinks: _,
            ecc_corrected_volatile: _,
            ecc_uncorrected_volatile: _,
            throttle_reasons: _,
            enc_util_pct: _,
            dec_util_pct: _,
            gpm: _,
            mig_gpm: _,
        } = GpuSample::default();
        assert_eq!(FIELDS.len(), 25);
        assert_eq!(GpmMetrics::NAMES.len(), 14);
    }
}
