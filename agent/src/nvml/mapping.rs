//! The NVML → domain mappings: pure functions, tested without NVML.

use super::{ALL_LINKS, FIELDS};
use gpufleet_core::{NvLinkSample, ProcessType, UnixMs};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Brand, ComputeMode, PerformanceState};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{FieldValueSample, MemoryInfo, ProcessInfo};
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_POWER_INSTANT, NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC,
};
use std::collections::BTreeMap;

/// What an NVML call's result means for the value.
#[derive(Debug, PartialEq)]
pub enum Reading<T> {
    /// A value.
    Value(T),
    /// The device (or this driver / library) cannot report it: absent, and not asked again.
    Unsupported(String),
    /// The GPU fell off the bus.
    Lost,
    /// A transient failure: absent this tick, asked again next tick.
    Failed(String),
}

/// Classifies an NVML result. NOT_SUPPORTED, a function missing from the driver or the
/// library, and no permission do not change at run time: they make the value absent for
/// good. GPU_LOST is its own case. Anything else is transient.
pub fn classify<T>(r: Result<T, NvmlError>) -> Reading<T> {
    match r {
        Ok(v) => Reading::Value(v),
        Err(
            e @ (NvmlError::NotSupported
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::NoPermission),
        ) => Reading::Unsupported(e.to_string()),
        Err(NvmlError::GpuLost) => Reading::Lost,
        Err(e) => Reading::Failed(e.to_string()),
    }
}

/// P-state number (0 = highest performance); `None` for NVML's "unknown".
pub fn pstate_number(p: PerformanceState) -> Option<u32> {
    use PerformanceState as P;
    Some(match p {
        P::Zero => 0,
        P::One => 1,
        P::Two => 2,
        P::Three => 3,
        P::Four => 4,
        P::Five => 5,
        P::Six => 6,
        P::Seven => 7,
        P::Eight => 8,
        P::Nine => 9,
        P::Ten => 10,
        P::Eleven => 11,
        P::Twelve => 12,
        P::Thirteen => 13,
        P::Fourteen => 14,
        P::Fifteen => 15,
        P::Unknown => return None,
    })
}

/// One entry of the field-value batch: NVML field id and `scopeId` (the link for NVLink
/// fields, [`ALL_LINKS`] for their sum, 0 for device-wide fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldKey {
    /// `NVML_FI_*`.
    pub field: u32,
    /// `scopeId`.
    pub scope: u32,
}

/// The batch for a GPU with these active NVLink links: instant power, memory
/// temperature and, with links, NVLink data TX and RX summed and per link.
pub fn field_batch(links: &[u32]) -> Vec<FieldKey> {
    let mut keys: Vec<FieldKey> = FIELDS
        .iter()
        .map(|&field| FieldKey { field, scope: 0 })
        .collect();
    if !links.is_empty() {
        for scope in std::iter::once(ALL_LINKS).chain(links.iter().copied()) {
            for field in [
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            ] {
                keys.push(FieldKey { field, scope });
            }
        }
    }
    keys
}

/// The row-remapping field values (`nvmlDeviceGetRemappedRows` is not wrapped by
/// nvml-wrapper 0.13; these fields answer the same counts): correctable, uncorrectable,
/// pending, failure.
pub const REMAP_FIELDS: [u32; 4] = [
    NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_UNC,
    NVML_FI_DEV_REMAPPED_PENDING,
    NVML_FI_DEV_REMAPPED_FAILURE,
];

/// Row remapping as read from [`REMAP_FIELDS`]: each absent where its entry gave nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Remap {
    pub correctable: Option<u32>,
    pub uncorrectable: Option<u32>,
    pub pending: Option<bool>,
    pub failed: Option<bool>,
}

/// [`Remap`] from the readings of the [`REMAP_FIELDS`] batch (see [`field_readings`]).
pub fn remap_from(values: &BTreeMap<FieldKey, u64>) -> Remap {
    let get = |field| values.get(&FieldKey { field, scope: 0 }).copied();
    let count = |field| get(field).map(|v| u32::try_from(v).unwrap_or(u32::MAX));
    Remap {
        correctable: count(NVML_FI_DEV_REMAPPED_COR),
        uncorrectable: count(NVML_FI_DEV_REMAPPED_UNC),
        pending: get(NVML_FI_DEV_REMAPPED_PENDING).map(|v| v != 0),
        failed: get(NVML_FI_DEV_REMAPPED_FAILURE).map(|v| v != 0),
    }
}

/// An NVLink error count summed over its parts' (link, counter) readings, saturating.
/// Readings the device does not support are left out (Hopper answers NOT_SUPPORTED for
/// the data CRC while the flit CRC counts): absent when none remains (a board without
/// NVLink, or counters it does not support). Absent as well when any reading failed or
/// the GPU was lost: a sum missing one link would read lower than the last, as a reset.
pub fn link_total<'a>(readings: impl IntoIterator<Item = &'a Reading<u64>>) -> Option<u64> {
    let mut total = None;
    for r in readings {
        match r {
            Reading::Value(v) => total = Some(total.unwrap_or(0u64).saturating_add(*v)),
            Reading::Unsupported(_) => {}
            Reading::Lost | Reading::Failed(_) => return None,
        }
    }
    total
}

/// The values of a field-value batch (entry → value; `samples[k]` answers `keys[k]`) and
/// the entries the device answered NOT_SUPPORTED (or no permission) for. Other per-entry
/// failures are absent this tick and asked again.
pub fn field_readings(
    keys: &[FieldKey],
    samples: &[Result<FieldValueSample, NvmlError>],
) -> (BTreeMap<FieldKey, u64>, Vec<FieldKey>) {
    let mut values = BTreeMap::new();
    let mut unsupported = Vec::new();
    for (key, s) in keys.iter().zip(samples) {
        let Ok(s) = s else { continue };
        match &s.value {
            Ok(v) => {
                if let Some(v) = sample_u64(v) {
                    values.insert(*key, v);
                }
            }
            Err(NvmlError::NotSupported | NvmlError::NoPermission) => unsupported.push(*key),
            Err(_) => {}
        }
    }
    (values, unsupported)
}

/// A field value as an unsigned number, if it is one (negative, NaN and out-of-range
/// values are absent).
pub fn sample_u64(v: &SampleValue) -> Option<u64> {
    match *v {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        // `u64::MAX as f64` is 2^64, the first value past u64's range.
        SampleValue::F64(v) if v.is_finite() && (0.0..u64::MAX as f64).contains(&v) => {
            Some(v.round() as u64)
        }
        SampleValue::F64(_) => None,
    }
}

/// A field value as an unsigned 32-bit number, if it is one.
pub fn sample_u32(v: &SampleValue) -> Option<u32> {
    sample_u64(v).and_then(|v| u32::try_from(v).ok())
}

/// The byte rate of a KiB counter read `kib` at `now_ms`, from its previous reading;
/// `None` on the first reading, when no time passed, or when the counter went backwards
/// (reset): a rate is never made up.
pub fn counter_rate_bps(prev: Option<(u64, UnixMs)>, kib: u64, now_ms: UnixMs) -> Option<u64> {
    let (prev_kib, prev_ms) = prev?;
    let dt_ms = u64::try_from(now_ms.checked_sub(prev_ms)?)
        .ok()
        .filter(|d| *d > 0)?;
    let delta = kib.checked_sub(prev_kib)?;
    u64::try_from(u128::from(delta) * 1024 * 1000 / u128::from(dt_ms)).ok()
}

/// What the batched field values gave this tick.
#[derive(Debug, Default, PartialEq)]
pub struct FieldValues {
    pub power_instant_mw: Option<u32>,
    pub temp_mem_c: Option<u32>,
    pub nvlink_tx_bps: Option<u64>,
    pub nvlink_rx_bps: Option<u64>,
    pub nvlinks: Vec<NvLinkSample>,
}

/// One tick's field-value batch in one pass: `answers[i]` is the answer to `keys[i]`,
/// `prev[i]` the previous reading of that entry (KiB, tick time) when it is an NVLink
/// counter, updated here. Instant power and memory temperature are taken as read; the
/// NVLink counters become rates (bytes/s; see [`counter_rate_bps`]): the summed ones and
/// one sample per link that has a rate (a link with neither is left out: absent, not
/// zero), in the batch's link order. An entry not read this tick keeps its older
/// reading, so its next rate spans both ticks. Also returns the positions of the entries
/// the device does not support (not to be asked again).
pub fn tick_fields(
    keys: &[FieldKey],
    answers: impl IntoIterator<Item = Result<FieldValueSample, NvmlError>>,
    prev: &mut [Option<(u64, UnixMs)>],
    now_ms: UnixMs,
) -> (FieldValues, Vec<usize>) {
    let mut out = FieldValues {
        // At most one sample per link: two entries (TX, RX) per link in the batch.
        nvlinks: Vec::with_capacity(keys.len() / 2),
        ..FieldValues::default()
    };
    let mut unsupported = Vec::new();
    for (i, (key, answer)) in keys.iter().zip(answers).enumerate() {
        let value = match answer.map(|s| s.value) {
            Ok(Ok(v)) => sample_u64(&v),
            Ok(Err(NvmlError::NotSupported | NvmlError::NoPermission)) => {
                unsupported.push(i);
                continue;
            }
            Ok(Err(_)) | Err(_) => None,
        };
        let Some(value) = value else { continue };
        let tx = key.field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
        if !tx && key.field != NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX {
            let value = u32::try_from(value).ok();
            match key.field {
                NVML_FI_DEV_POWER_INSTANT if key.scope == 0 => out.power_instant_mw = value,
                NVML_FI_DEV_MEMORY_TEMP if key.scope == 0 => out.temp_mem_c = value,
                _ => {}
            }
            continue;
        }
        let Some(slot) = prev.get_mut(i) else {
            continue;
        };
        let rate = counter_rate_bps(*slot, value, now_ms);
        *slot = Some((value, now_ms));
        let Some(rate) = rate else { continue };
        if key.scope == ALL_LINKS {
            if tx {
                out.nvlink_tx_bps = Some(rate);
            } else {
                out.nvlink_rx_bps = Some(rate);
            }
            continue;
        }
        let at = match out.nvlinks.iter().position(|s| s.link == key.scope) {
            Some(at) => at,
            None => {
                out.nvlinks.push(NvLinkSample {
                    link: key.scope,
                    tx_bps: None,
                    rx_bps: None,
                });
                out.nvlinks.len() - 1
            }
        };
        if let Some(link) = out.nvlinks.get_mut(at) {
            if tx {
                link.tx_bps = Some(rate);
            } else {
                link.rx_bps = Some(rate);
            }
        }
    }
    (out, unsupported)
}

/// A MIG device's profile from its name: `NVIDIA A100-SXM4-80GB MIG 3g.40gb` → `3g.40gb`.
pub fn mig_profile(name: &str) -> Option<String> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    let profile = profile.trim();
    (!profile.is_empty()).then(|| profile.to_owned())
}

/// The clock event (throttle) reason bit mask, as NVML defines the bits.
pub fn throttle_bits(r: ThrottleReasons) -> u64 {
    r.bits()
}

/// The process type from which lists the pid appeared in.
pub fn process_type(in_compute: bool, in_graphics: bool) -> ProcessType {
    match (in_compute, in_graphics) {
        (true, true) => ProcessType::ComputeAndGraphics,
        (false, true) => ProcessType::Graphics,
        _ => ProcessType::Compute,
    }
}

/// Memory as reported: used / total / reserved bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemFields {
    /// Allocated by processes and the driver (v2: excludes reserved).
    pub used: u64,
    /// Installed.
    pub total: u64,
    /// Reserved by the driver, never allocatable.
    pub reserved: u64,
}

/// The fields of NVML's v2 memory info.
pub fn memory_fields(m: &MemoryInfo) -> MemFields {
    MemFields {
        used: m.used.min(m.total),
        total: m.total,
        reserved: m.reserved,
    }
}

/// A process's GPU memory; `None` when NVML says it is not available (e.g. under WDDM).
pub fn used_memory(m: &UsedGpuMemory) -> Option<u64> {
    match m {
        UsedGpuMemory::Used(b) => Some(*b),
        UsedGpuMemory::Unavailable => None,
    }
}

/// PCIe throughput: NVML reports KiB/s over the last 20 ms.
pub fn pcie_kib_to_bps(kib: u32) -> u64 {
    u64::from(kib) * 1024
}

/// A percentage clamped to 100 (a few boards report fan speeds above 100 %).
pub fn pct(v: u32) -> u32 {
    v.min(100)
}

/// `12040` → `"12.4"`.
pub fn cuda_version_string(v: i32) -> String {
    format!(
        "{}.{}",
        nvml_wrapper::cuda_driver_version_major(v),
        nvml_wrapper::cuda_driver_version_minor(v)
    )
}

/// The brand as users know it.
pub fn brand_name(b: Brand) -> String {
    match b {
        Brand::Nvidia => "NVIDIA".into(),
        Brand::Tesla => "Tesla".into(),
        Brand::Quadro => "Quadro".into(),
        Brand::GeForce => "GeForce".into(),
        Brand::NvidiaRTX => "NVIDIA RTX".into(),
        Brand::Titan => "Titan".into(),
        Brand::Unknown => "Unknown".into(),
        other => format!("{other:?}"),
    }
}

/// The compute mode's name.
pub fn compute_mode_name(m: ComputeMode) -> &'static str {
    match m {
        ComputeMode::Default => "Default",
        ComputeMode::ExclusiveThread => "Exclusive_Thread",
        ComputeMode::Prohibited => "Prohibited",
        ComputeMode::ExclusiveProcess => "Exclusive_Process",
    }
}

/// One process on one GPU, merged from NVML's lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u32,
    /// Which lists it was in.
    pub process_type: ProcessType,
    /// GPU memory it holds.
    pub used_bytes: Option<u64>,
}

/// Merges the compute and graphics process lists (a pid in both is
/// compute-and-graphics), ordered by pid. Their utilization is not here: a tick takes
/// it from the driver's samples of its own window when they are fetched (`held`).
pub fn merge_processes(compute: &[ProcessInfo], graphics: &[ProcessInfo]) -> Vec<GpuProcess> {
    let mut by_pid: BTreeMap<u32, (bool, bool, Option<u64>)> = BTreeMap::new();
    for (list, is_compute) in [(compute, true), (graphics, false)] {
        for p in list {
            let e = by_pid.entry(p.pid).or_insert((false, false, None));
            if is_compute {
                e.0 = true;
            } else {
                e.1 = true;
            }
            e.2 = match (e.2, used_memory(&p.used_gpu_memory)) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
    }
    by_pid
        .into_iter()
        .map(|(pid, (c, g, used))| GpuProcess {
            pid,
            process_type: process_type(c, g),
            used_bytes: used,
        })
        .collect()
}

#[cfg(test)]
mod health_tests {
    use super::*;

    #[test]
    fn remap_fields_map_to_counts_and_flags_absent_stays_absent() {
        let key = |field| FieldKey { field, scope: 0 };
        let values = BTreeMap::from([
            (key(NVML_FI_DEV_REMAPPED_COR), 3),
            (key(NVML_FI_DEV_REMAPPED_PENDING), 1),
            (key(NVML_FI_DEV_REMAPPED_FAILURE), 0),
        ]);
        assert_eq!(
            remap_from(&values),
            Remap {
                correctable: Some(3),
                uncorrectable: None,
                pending: Some(true),
                failed: Some(false),
            }
        );
        assert_eq!(remap_from(&BTreeMap::new()), Remap::default());
    }

    #[test]
    fn link_totals_leave_unsupported_parts_out_and_a_failed_read_gives_none() {
        use Reading::{Failed, Lost, Unsupported, Value};
        let total = |r: &[Reading<u64>]| link_total(r);
        assert_eq!(total(&[]), None, "no link");
        assert_eq!(
            total(&[Unsupported("no".into()), Unsupported("no".into())]),
            None
        );
        assert_eq!(total(&[Value(0), Unsupported("no".into())]), Some(0));
        assert_eq!(total(&[Value(2), Value(5)]), Some(7));
        assert_eq!(total(&[Value(u64::MAX), Value(1)]), Some(u64::MAX));
        assert_eq!(
            total(&[Value(2), Failed("timeout".into()), Value(5)]),
            None,
            "never a partial sum"
        );
        assert_eq!(total(&[Value(2), Lost]), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper::structs::device::FieldId;

    fn proc_info(pid: u32, used: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used.map_or(UsedGpuMemory::Unavailable, UsedGpuMemory::Used),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn errors_classify_into_absent_for_good_lost_or_transient() {
        assert_eq!(classify(Ok(5)), Reading::Value(5));
        for e in [
            NvmlError::NotSupported,
            NvmlError::FunctionNotFound,
            NvmlError::FailedToLoadSymbol("nvmlDeviceGetFanSpeed_v2".into()),
            NvmlError::NoPermission,
        ] {
            assert!(matches!(classify::<u32>(Err(e)), Reading::Unsupported(_)));
        }
        assert_eq!(classify::<u32>(Err(NvmlError::GpuLost)), Reading::Lost);
        for e in [
            NvmlError::Unknown,
            NvmlError::Timeout,
            NvmlError::InsufficientSize(None),
        ] {
            assert!(matches!(classify::<u32>(Err(e)), Reading::Failed(_)));
        }
    }

    #[test]
    fn field_values_map_to_numbers_and_unsupported_entries() {
        let sample = |id: u32, value: Result<SampleValue, NvmlError>| {
            Ok(FieldValueSample {
                field: FieldId(id),
                timestamp: 0,
                latency: 0,
                value,
            })
        };
        let key = |field, scope| FieldKey { field, scope };
        let keys = [
            key(186, 0),
            key(82, 0),
            key(90, 0),
            key(91, 0),
            key(92, 0),
            key(138, ALL_LINKS),
            key(138, 3),
            key(139, 3),
        ];
        let samples = [
            sample(186, Ok(SampleValue::U32(231_000))),
            sample(82, Err(NvmlError::NotSupported)),
            sample(90, Err(NvmlError::Unknown)),
            sample(91, Ok(SampleValue::I64(-1))),
            Err(NvmlError::UnexpectedVariant(9)),
            sample(138, Ok(SampleValue::U64(1 << 40))),
            sample(138, Ok(SampleValue::U64(7))),
            sample(139, Err(NvmlError::NotSupported)),
        ];
        let (values, unsupported) = field_readings(&keys, &samples);
        assert_eq!(
            values.into_iter().collect::<Vec<_>>(),
            [
                (key(138, 3), 7),
                (key(138, ALL_LINKS), 1 << 40),
                (key(186, 0), 231_000)
            ],
            "keyed by field and scope, 64-bit counters kept whole"
        );
        assert_eq!(
            unsupported,
            [key(82, 0), key(139, 3)],
            "transient failures are asked again"
        );
        assert_eq!(sample_u32(&SampleValue::U64(7)), Some(7));
        assert_eq!(sample_u32(&SampleValue::U64(u64::MAX)), None);
        assert_eq!(sample_u64(&SampleValue::U64(u64::MAX)), Some(u64::MAX));
        assert_eq!(sample_u32(&SampleValue::F64(41.6)), Some(42));
        assert_eq!(sample_u32(&SampleValue::F64(f64::NAN)), None);
        assert_eq!(sample_u64(&SampleValue::F64(-1.0)), None);
    }

    #[test]
    fn the_batch_asks_nvlink_summed_and_per_active_link() {
        let keys = field_batch(&[0, 2]);
        let pairs: Vec<(u32, u32)> = keys.iter().map(|k| (k.field, k.scope)).collect();
        assert_eq!(
            pairs,
            [
                (NVML_FI_DEV_POWER_INSTANT, 0),
                (NVML_FI_DEV_MEMORY_TEMP, 0),
                (138, ALL_LINKS),
                (139, ALL_LINKS),
                (138, 0),
                (139, 0),
                (138, 2),
                (139, 2),
            ]
        );
        assert_eq!(field_batch(&[]).len(), 2, "no links: no NVLink entries");
    }

    #[test]
    fn counter_rates_come_from_deltas_and_are_never_made_up() {
        assert_eq!(counter_rate_bps(None, 500, 1000), None, "first reading");
        assert_eq!(
            counter_rate_bps(Some((1000, 1000)), 3000, 3000),
            Some(1024 * 1000),
            "2000 KiB over 2 s"
        );
        assert_eq!(counter_rate_bps(Some((1000, 1000)), 1000, 2000), Some(0));
        assert_eq!(
            counter_rate_bps(Some((5000, 1000)), 10, 2000),
            None,
            "reset"
        );
        assert_eq!(counter_rate_bps(Some((1, 2000)), 9, 2000), None, "no time");
        assert_eq!(
            counter_rate_bps(Some((1, 3000)), 9, 2000),
            None,
            "clock back"
        );
        assert_eq!(
            counter_rate_bps(Some((0, 0)), u64::MAX, 1),
            None,
            "out of range"
        );
    }

    #[test]
    fn a_tick_of_field_values_gives_readings_rates_per_link_and_the_unsupported() {
        let tx = |scope| FieldKey {
            field: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            scope,
        };
        let rx = |scope| FieldKey {
            field: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
            scope,
        };
        let scalar = |field| FieldKey { field, scope: 0 };
        let keys = [
            scalar(NVML_FI_DEV_POWER_INSTANT),
            scalar(NVML_FI_DEV_MEMORY_TEMP),
            tx(ALL_LINKS),
            rx(ALL_LINKS),
            tx(0),
            rx(0),
            tx(1),
            rx(1),
            tx(2),
            rx(2),
        ];
        let answer = |key: &FieldKey, value: Result<SampleValue, NvmlError>| {
            Ok(FieldValueSample {
                field: FieldId(key.field),
                timestamp: 0,
                latency: 0,
                value,
            })
        };
        // Each tick: one value (KiB for the counters) or an error per key.
        let tick =
            |values: [Result<u64, NvmlError>; 10]| -> Vec<Result<FieldValueSample, NvmlError>> {
                keys.iter()
                    .zip(values)
                    .map(|(k, v)| answer(k, v.map(SampleValue::U64)))
                    .collect()
            };
        let failed = || Err(NvmlError::Unknown);
        let mut prev = vec![None; keys.len()];

        let (first, unsupported) = tick_fields(
            &keys,
            tick([
                Ok(231_000),
                Err(NvmlError::NotSupported),
                Ok(100),
                Ok(50),
                Ok(60),
                Ok(10),
                Ok(1),
                failed(),
                Ok(7),
                Ok(7),
            ]),
            &mut prev,
            1000,
        );
        assert_eq!(
            first,
            FieldValues {
                power_instant_mw: Some(231_000),
                ..FieldValues::default()
            },
            "no rate from a first reading"
        );
        assert_eq!(unsupported, [1], "the position of the unsupported entry");
        assert_eq!(prev[0], None, "instant power is not a counter");
        assert_eq!(prev[7], None, "a failed read leaves no reading");

        // rx(1) failed in the first tick: this first reading gives no rate yet; a counter
        // that went back (tx(2)) has none; link 0 was not read.
        let (second, _) = tick_fields(
            &keys,
            tick([
                failed(),
                failed(),
                Ok(300),
                Ok(2050),
                failed(),
                failed(),
                Ok(1025),
                Ok(10),
                Ok(3),
                Ok(2007),
            ]),
            &mut prev,
            2000,
        );
        assert_eq!(
            second,
            FieldValues {
                power_instant_mw: None,
                temp_mem_c: None,
                nvlink_tx_bps: Some(200 * 1024),
                nvlink_rx_bps: Some(2000 * 1024),
                nvlinks: vec![
                    NvLinkSample {
                        link: 1,
                        tx_bps: Some(1024 * 1024),
                        rx_bps: None,
                    },
                    NvLinkSample {
                        link: 2,
                        tx_bps: None,
                        rx_bps: Some(2000 * 1024),
                    },
                ],
            },
            "link 0 has no rate: left out, not zero"
        );
        // Link 0 not read in the second tick: its rate spans two ticks.
        let (third, _) = tick_fields(
            &keys,
            tick([
                Ok(1),
                Ok(2),
                failed(),
                failed(),
                Ok(2060),
                Ok(10),
                failed(),
                failed(),
                failed(),
                failed(),
            ]),
            &mut prev,
            3000,
        );
        assert_eq!(
            third.nvlinks,
            [NvLinkSample {
                link: 0,
                tx_bps: Some(1000 * 1024),
                rx_bps: Some(0),
            }],
            "2000 KiB over 2 s"
        );
        assert_eq!(
            (third.power_instant_mw, third.temp_mem_c),
            (Some(1), Some(2))
        );
        // Each reading replaces the previous one: the summed TX rate comes from the second
        // tick's reading (300 KiB at 2 s), not the first's.
        let (fourth, _) = tick_fields(
            &keys,
            tick([
                failed(),
                failed(),
                Ok(500),
                failed(),
                failed(),
                failed(),
                failed(),
                failed(),
                failed(),
                failed(),
            ]),
            &mut prev,
            4000,
        );
        assert_eq!(fourth.nvlink_tx_bps, Some(100 * 1024), "200 KiB over 2 s");
    }

    #[test]
    fn mig_profiles_come_from_the_device_name() {
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-80GB MIG 3g.40gb").as_deref(),
            Some("3g.40gb")
        );
        assert_eq!(
            mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me").as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(mig_profile("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(mig_profile("X MIG "), None);
    }

    #[test]
    fn pstates_map_to_numbers_and_unknown_to_absent() {
        assert_eq!(pstate_number(PerformanceState::Zero), Some(0));
        assert_eq!(pstate_number(PerformanceState::Eight), Some(8));
        assert_eq!(pstate_number(PerformanceState::Fifteen), Some(15));
        assert_eq!(pstate_number(PerformanceState::Unknown), None);
    }

    #[test]
    fn throttle_reasons_keep_nvml_bits() {
        let r = ThrottleReasons::GPU_IDLE
            | ThrottleReasons::SW_POWER_CAP
            | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        assert_eq!(throttle_bits(r), 0x1 | 0x4 | 0x40);
        assert_eq!(throttle_bits(ThrottleReasons::empty()), 0);
        assert_eq!(
            throttle_bits(ThrottleReasons::SW_THERMAL_SLOWDOWN),
            gpufleet_sim::reasons::SW_THERMAL_SLOWDOWN,
            "the simulator uses the same bits"
        );
    }

    #[test]
    fn memory_and_small_conversions() {
        let m = MemoryInfo {
            free: 70,
            reserved: 5,
            total: 100,
            used: 25,
            version: 0,
        };
        assert_eq!(
            memory_fields(&m),
            MemFields {
                used: 25,
                total: 100,
                reserved: 5
            }
        );
        assert_eq!(used_memory(&UsedGpuMemory::Used(42)), Some(42));
        assert_eq!(used_memory(&UsedGpuMemory::Unavailable), None);
        assert_eq!(pcie_kib_to_bps(1000), 1_024_000);
        assert_eq!(pct(130), 100);
        assert_eq!(cuda_version_string(12040), "12.4");
        assert_eq!(cuda_version_string(11080), "11.8");
        assert_eq!(brand_name(Brand::Nvidia), "NVIDIA");
        assert_eq!(
            compute_mode_name(ComputeMode::ExclusiveProcess),
            "Exclusive_Process"
        );
        assert_eq!(process_type(true, false), ProcessType::Compute);
        assert_eq!(process_type(false, true), ProcessType::Graphics);
        assert_eq!(process_type(true, true), ProcessType::ComputeAndGraphics);
    }

    #[test]
    fn processes_merge_by_pid_with_the_larger_memory() {
        let compute = [proc_info(300, Some(4 << 30)), proc_info(100, Some(1 << 30))];
        let graphics = [proc_info(100, Some(2 << 30)), proc_info(200, None)];
        let merged = merge_processes(&compute, &graphics);
        let pids: Vec<u32> = merged.iter().map(|p| p.pid).collect();
        assert_eq!(pids, [100, 200, 300]);
        assert_eq!(merged[0].process_type, ProcessType::ComputeAndGraphics);
        assert_eq!(merged[0].used_bytes, Some(2 << 30));
        assert_eq!(merged[1].process_type, ProcessType::Graphics);
        assert_eq!(
            merged[1].used_bytes, None,
            "memory not available stays absent"
        );
    }
}
