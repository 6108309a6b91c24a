//! Batched field values (`nvmlDeviceGetFieldValues`): instant power, memory temperature
//! and NVLink throughput counters, with the scoped batch nvml-wrapper cannot send.

use super::device::read;
use super::device::{DeviceState, Metric};
use super::mapping::{FieldKey, FieldValues, tick_fields};
use super::{ALL_LINKS, MAX_NVLINKS};
use gpufleet_core::UnixMs;
use gpufleet_uplink::cost::CallTimer;
use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
};
use nvml_wrapper_sys::bindings::{nvmlFieldValue_t, nvmlValue_t};
use std::ffi::c_int;
use tracing::debug;

/// The batched field values: instant power (mW), memory temperature (°C) and the NVLink
/// data counters (summed and, when `links` is due, per active link), turned into rates
/// ([`tick_fields`]). The per-link entries end the batch: on the other ticks they are
/// left out, their rates carried from the last reading (a counter's next rate spans the
/// ticks it was not read). Entries the device does not support are dropped from the
/// batch; once none is left, the call is not made again. The call's buffer and the
/// counters' previous readings are kept in the device state (no allocation per tick but
/// the tick's own values).
pub(super) fn read_fields(
    dev: &mut DeviceState<'_>,
    timer: &mut CallTimer,
    now_ms: UnixMs,
    links: bool,
) -> FieldValues {
    if dev.fields.is_empty() {
        return FieldValues::default();
    }
    // Taken out for the call (which borrows the device state) and put back after.
    let mut keys = std::mem::take(&mut dev.fields);
    let mut buf = std::mem::take(&mut dev.field_buf);
    let asked = if links {
        keys.len()
    } else {
        keys.iter().take_while(|k| !is_per_link(k)).count()
    };
    let answered = asked > 0
        && read(dev, timer, Metric::FieldValues, |d| {
            field_values_into(d, &keys[..asked], &mut buf)
        })
        .is_some();
    if !answered {
        if !dev.unsupported.contains(Metric::FieldValues) {
            dev.fields = keys;
            dev.field_buf = buf;
        }
        let mut values = FieldValues::default();
        if links {
            // A failed reading of the links: none is carried, not an older one.
            dev.nvlinks_last.clear();
        } else if !dev.lost {
            values.nvlinks.clone_from(&dev.nvlinks_last);
        }
        return values;
    }
    let answers = buf.iter().map(|raw| FieldValueSample::try_from(*raw));
    let (mut values, unsupported) = tick_fields(
        &keys[..asked],
        answers,
        &mut dev.field_prev[..asked],
        now_ms,
    );
    if links {
        dev.nvlinks_last.clone_from(&values.nvlinks);
    } else {
        values.nvlinks.clone_from(&dev.nvlinks_last);
    }
    if !unsupported.is_empty() {
        let dropped: Vec<FieldKey> = unsupported
            .iter()
            .filter_map(|&i| keys.get(i))
            .copied()
            .collect();
        debug!(gpu = dev.index, fields = ?dropped, "field values not supported; not asked again");
        // The same positions out of the batch and of the readings kept beside it.
        let mut i = 0;
        keys.retain(|_| {
            i += 1;
            !unsupported.contains(&(i - 1))
        });
        let mut i = 0;
        dev.field_prev.retain(|_| {
            i += 1;
            !unsupported.contains(&(i - 1))
        });
    }
    dev.fields = keys;
    dev.field_buf = buf;
    values
}

/// A per-link NVLink throughput entry (the batch's tail; the sums come before).
fn is_per_link(k: &FieldKey) -> bool {
    k.scope != ALL_LINKS
        && (k.field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
            || k.field == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)
}

/// `nvmlDeviceGetFieldValues` with each entry's `scopeId` set: nvml-wrapper 0.13's
/// `Device::field_values_for` always sends 0, and NVLink fields take the link there. The
/// raw answers are left in `raw` (cleared first), in the order of `keys`; a failure of
/// the whole call is the error. The ids are sent as they are: nvml-wrapper's
/// driver-dependent id remapping touches only ids 251–273, none of ours.
#[allow(unsafe_code)]
pub(super) fn field_values_into(
    device: &Device<'_>,
    keys: &[FieldKey],
    raw: &mut Vec<nvmlFieldValue_t>,
) -> Result<(), NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetFieldValues.as_ref())?;
    let count = c_int::try_from(keys.len()).map_err(|_| NvmlError::InvalidArg)?;
    raw.clear();
    raw.extend(keys.iter().map(|k| nvmlFieldValue_t {
        fieldId: k.field,
        scopeId: k.scope,
        timestamp: 0,
        latencyUsec: 0,
        valueType: 0,
        nvmlReturn: 0,
        value: nvmlValue_t { ullVal: 0 },
    }));
    // SAFETY: `sym` is `nvmlDeviceGetFieldValues` from the library `device`'s `Nvml`
    // loaded and initialised, and its signature is nvml-wrapper-sys's binding of nvml.h
    // (the same one nvml-wrapper calls). `device.handle()` is valid: `Device<'_>` borrows
    // that `Nvml`, so NVML is not shut down while the handle lives. `raw` is a live,
    // exclusively borrowed array of exactly `count` `nvmlFieldValue_t` (nvml-wrapper-sys's
    // `#[repr(C)]` layout of the C struct), which NVML reads and writes only within those
    // `count` entries; nothing else aliases it during the call.
    let code = unsafe { sym(device.handle(), count, raw.as_mut_ptr()) };
    nvml_try(code)
}

/// [`field_values_into`] answering each entry converted (as nvml-wrapper does): a failure
/// of the whole call is the error, and each entry carries its own result.
pub(super) fn field_values_scoped(
    device: &Device<'_>,
    keys: &[FieldKey],
) -> Result<Vec<Result<FieldValueSample, NvmlError>>, NvmlError> {
    let mut raw = Vec::with_capacity(keys.len());
    field_values_into(device, keys, &mut raw)?;
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
