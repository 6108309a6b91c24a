//! Batched field values (`nvmlDeviceGetFieldValues`): instant power, memory temperature
//! and NVLink throughput counters, with the scoped batch nvml-wrapper cannot send.

use super::MAX_NVLINKS;
use super::device::{DeviceState, Metric};
use super::mapping::{FieldKey, counter_rates, field_readings, nvlink_samples};
use super::reader::read;
use gpufleet_core::{NvLinkSample, UnixMs};
use gpufleet_uplink::cost::CallTimer;
use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::sys_exports::field_id::{NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_POWER_INSTANT};
use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlValue_t};
use std::ffi::c_int;
use tracing::debug;

/// What the batched field values gave this tick.
#[derive(Debug, Default)]
pub(super) struct FieldValues {
    pub(super) power_instant_mw: Option<u32>,
    pub(super) temp_mem_c: Option<u32>,
    pub(super) nvlink_tx_bps: Option<u64>,
    pub(super) nvlink_rx_bps: Option<u64>,
    pub(super) nvlinks: Vec<NvLinkSample>,
}

/// The batched field values: instant power (mW), memory temperature (°C) and the NVLink
/// data counters (summed and per active link), turned into rates. Entries the device
/// does not support are dropped from the batch; once none is left, the call is not made
/// again.
pub(super) fn read_fields(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    now_ms: UnixMs,
) -> FieldValues {
    if dev.fields.is_empty() {
        return FieldValues::default();
    }
    // Taken out for the call (which borrows the device state) and put back after.
    let mut keys = std::mem::take(&mut dev.fields);
    let samples = read(dev, timer, Metric::FieldValues, |d| {
        field_values_scoped(d, &keys)
    });
    let Some(samples) = samples else {
        if !dev.unsupported.contains(Metric::FieldValues) {
            dev.fields = keys;
        }
        return FieldValues::default();
    };
    let (values, unsupported) = field_readings(&keys, &samples);
    if !unsupported.is_empty() {
        debug!(gpu = dev.index, fields = ?unsupported, "field values not supported; not asked again");
        keys.retain(|f| !unsupported.contains(f));
    }
    dev.fields = keys;
    let rates = counter_rates(&mut dev.nvlink_prev, &values, now_ms);
    let (nvlink_tx_bps, nvlink_rx_bps, nvlinks) = nvlink_samples(&dev.links, &rates);
    let scalar = |field| {
        values
            .get(&FieldKey { field, scope: 0 })
            .and_then(|v| u32::try_from(*v).ok())
    };
    FieldValues {
        power_instant_mw: scalar(NVML_FI_DEV_POWER_INSTANT),
        temp_mem_c: scalar(NVML_FI_DEV_MEMORY_TEMP),
        nvlink_tx_bps,
        nvlink_rx_bps,
        nvlinks,
    }
}

/// `nvmlDeviceGetFieldValues` with each entry's `scopeId` set: nvml-wrapper 0.13's
/// `Device::field_values_for` always sends 0, and NVLink fields take the link there. The
/// answers are in the order of `keys`; a failure of the whole call is the error, and each
/// entry carries its own result (as in nvml-wrapper). The ids are sent as they are:
/// nvml-wrapper's driver-dependent id remapping touches only ids 251–273, none of ours.
#[allow(unsafe_code)]
pub(super) fn field_values_scoped(
    device: &Device<'_>,
    keys: &[FieldKey],
) -> Result<Vec<Result<FieldValueSample, NvmlError>>, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetFieldValues.as_ref())?;
    let count = c_int::try_from(keys.len()).map_err(|_| NvmlError::InvalidArg)?;
    let mut raw: Vec<nvmlFieldValue_t> = keys
        .iter()
        .map(|k| nvmlFieldValue_t {
            fieldId: k.field,
            scopeId: k.scope,
            timestamp: 0,
            latencyUsec: 0,
            valueType: 0,
            nvmlReturn: 0,
            value: nvmlValue_t { ullVal: 0 },
        })
        .collect();
    // SAFETY: `sym` is `nvmlDeviceGetFieldValues` from the library `device`'s `Nvml`
    // loaded and initialised, and its signature is nvml-wrapper-sys's binding of nvml.h
    // (the same one nvml-wrapper calls). `device.handle()` is valid: `Device<'_>` borrows
    // that `Nvml`, so NVML is not shut down while the handle lives. `raw` is a live,
    // exclusively borrowed array of exactly `count` `nvmlFieldValue_t` (nvml-wrapper-sys's
    // `#[repr(C)]` layout of the C struct), which NVML reads and writes only within those
    // `count` entries; nothing else aliases it during the call.
    let code = unsafe { sym(device.handle(), count, raw.as_mut_ptr()) };
    nvml_try(code)?;
    Ok(raw.into_iter().map(FieldValueSample::try_from).collect())
}

/// The active NVLink links (none on boards without NVLink).
pub(super) fn active_nvlinks(d: &Device<'_>) -> Vec<u32> {
    let mut links = Vec::new();
    for link in 0..MAX_NVLINKS {
        match d.link_wrapper_for(link).is_active() {
            Ok(true) => links.push(link),
            Ok(false) => {}
            Err(_) => break,
        }
    }
    links
}
