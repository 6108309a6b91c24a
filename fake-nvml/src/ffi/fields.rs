//! Field values (`nvmlDeviceGetFieldValues`), NVLink counters by scope included.

use super::{INVALID_ARGUMENT, NOT_SUPPORTED, SUCCESS, dev, get, put, u32v};
use crate::function::Function;
use crate::scenario::Value;
use crate::state::Reading;
use nvml_wrapper_sys::bindings::field_id::{
    NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT,
    NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING,
    NVML_FI_DEV_REMAPPED_UNC,
};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_int, c_uint};

/// Fills each requested field; the call succeeds and each entry carries its own return
/// code (NOT_SUPPORTED for fields this GPU or this fake does not have). NVLink throughput
/// fields honour `scopeId`: a link's counter, or (UINT_MAX) the sum over active links.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    values_count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetFieldValues, |s, i| {
        if values.is_null() || values_count < 0 {
            return Err(INVALID_ARGUMENT);
        }
        // Every NVLink entry of this call reads the same index of its counter (a call
        // without one, e.g. the remapped-row fields, does not count as a read).
        // SAFETY: `values` holds `values_count` entries (NVML's contract), checked non-null.
        let asked = unsafe { std::slice::from_raw_parts(values, values_count as usize) };
        let nvlink_read = if asked.iter().any(|v| {
            v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
                || v.fieldId == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
        }) {
            s.nth(i, Reading::FieldNvlink)
        } else {
            0
        };
        for k in 0..values_count as usize {
            // SAFETY: `values` holds `values_count` entries (NVML's contract).
            let slot = unsafe { values.add(k) };
            let mut fv = get(slot)?;
            let (id, scope) = (fv.fieldId, fv.scopeId);
            s.field_asked(i, id, scope);
            let unsupported = s.unsupported(i).field(id, scope);
            let read: Option<(u64, bool)> = if unsupported {
                None
            } else {
                match id {
                    NVML_FI_DEV_POWER_INSTANT => Some((
                        s.read(i, Reading::FieldPowerInstant, |g| &g.power_instant_mw),
                        false,
                    )),
                    NVML_FI_DEV_POWER_AVERAGE => Some((
                        s.read(i, Reading::FieldPowerAverage, |g| &g.power_mw),
                        false,
                    )),
                    NVML_FI_DEV_MEMORY_TEMP => {
                        Some((s.read(i, Reading::FieldTempMem, |g| &g.temp_mem_c), false))
                    }
                    NVML_FI_DEV_REMAPPED_COR => Some((
                        s.read(i, Reading::RemappedCorrectable, |g| {
                            &g.remapped_rows_correctable
                        }),
                        false,
                    )),
                    NVML_FI_DEV_REMAPPED_UNC => Some((
                        s.read(i, Reading::RemappedUncorrectable, |g| {
                            &g.remapped_rows_uncorrectable
                        }),
                        false,
                    )),
                    NVML_FI_DEV_REMAPPED_PENDING => Some((
                        s.read(i, Reading::RemappedPending, |g| &g.remapped_rows_pending),
                        false,
                    )),
                    NVML_FI_DEV_REMAPPED_FAILURE => Some((
                        s.read(i, Reading::RemappedFailed, |g| &g.remapped_rows_failed),
                        false,
                    )),
                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => {
                        let g = s.gpu(i);
                        nvlink_kib(g.nvlinks, &g.nvlink_tx_kib, scope, nvlink_read)
                            .map(|v| (v, true))
                    }
                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => {
                        let g = s.gpu(i);
                        nvlink_kib(g.nvlinks, &g.nvlink_rx_kib, scope, nvlink_read)
                            .map(|v| (v, true))
                    }
                    _ => None,
                }
            };
            let ts = if k == 0 {
                s.timestamp()
            } else {
                s.next_timestamp()
            };
            fv.timestamp = i64::try_from(ts).unwrap_or(i64::MAX);
            fv.latencyUsec = 0;
            match read {
                Some((v, true)) => {
                    fv.nvmlReturn = SUCCESS;
                    fv.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
                    fv.value = nvmlValue_t { ullVal: v };
                }
                Some((v, false)) => {
                    fv.nvmlReturn = SUCCESS;
                    fv.valueType = nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT;
                    fv.value = nvmlValue_t { uiVal: u32v(v) };
                }
                None => fv.nvmlReturn = NOT_SUPPORTED,
            }
            put(slot, fv)?;
        }
        Ok(())
    })
}

/// An NVLink KiB counter at read `n` of a GPU with `active` links: link `scope`'s, or
/// the sum over the active links for UINT_MAX; `None` (NOT_SUPPORTED) for a link that is not active.
pub(super) fn nvlink_kib(active: c_uint, counters: &[Value], scope: c_uint, n: u64) -> Option<u64> {
    let link = |l: c_uint| counters.get(l as usize).map_or(0, |v| v.at(n));
    if scope == c_uint::MAX {
        Some((0..active).map(link).fold(0, u64::saturating_add))
    } else if scope < active {
        Some(link(scope))
    } else {
        None
    }
}
