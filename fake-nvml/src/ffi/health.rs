//! Health: retired pages (count query and fill), pages pending retirement, the PCIe
//! replay counter, NVLink error counters per link, temperature thresholds. (Row
//! remapping is in `fields`, lifetime ECC in `values`' `nvmlDeviceGetTotalEccErrors`.)

use super::{INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_SUPPORTED, dev, dev_value, get, put, u32v};
use crate::function::Function;
use crate::scenario::{Gpu, Value};
use crate::state::Reading;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};

/// A scenario value: its read key and where it is.
type Picked = (Reading, fn(&Gpu) -> &Value);

/// The retired-page count `cause` picks.
fn retired(cause: nvmlPageRetirementCause_t) -> Option<Picked> {
    match cause {
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS => {
            Some((Reading::RetiredSbe, |g| &g.retired_pages_sbe))
        }
        nvmlPageRetirementCause_enum_NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR => {
            Some((Reading::RetiredDbe, |g| &g.retired_pages_dbe))
        }
        _ => None,
    }
}

/// Fills `addresses` (and `timestamps`, when not null) with `n` made-up pages.
fn fill_pages(
    n: u64,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Result<(), nvmlReturn_t> {
    let room = u64::from(get(count)?);
    put(count, u32v(n))?;
    if room < n {
        return Err(INSUFFICIENT_SIZE);
    }
    if n > 0 && addresses.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    for k in 0..n as usize {
        // SAFETY: the caller's arrays hold `room` >= `n` entries (NVML's contract).
        put(unsafe { addresses.add(k) }, 0x1000 * (k as u64 + 1))?;
        if !timestamps.is_null() {
            // SAFETY: as above.
            put(unsafe { timestamps.add(k) }, 1_700_000_000 + k as u64)?;
        }
    }
    Ok(())
}

/// The count query (a buffer too small answers INSUFFICIENT_SIZE with the count): each
/// call is one read of the scenario's count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetRetiredPages, |s, i| {
        let (key, pick) = retired(cause).ok_or(INVALID_ARGUMENT)?;
        let n = s.read(i, key, pick);
        fill_pages(n, count, addresses, std::ptr::null_mut())
    })
}

/// The fill: answers as many pages as the latest count query said.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: nvmlDevice_t,
    cause: nvmlPageRetirementCause_t,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetRetiredPages_v2, |s, i| {
        let (key, pick) = retired(cause).ok_or(INVALID_ARGUMENT)?;
        fill_pages(s.last_read(i, key, pick), count, addresses, timestamps)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: nvmlDevice_t,
    out: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    dev_value(
        device,
        Function::nvmlDeviceGetRetiredPagesPendingStatus,
        out,
        |s, i| u32::from(s.read(i, Reading::RetiredPending, |g| &g.retired_pages_pending) != 0),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev_value(
        device,
        Function::nvmlDeviceGetPcieReplayCounter,
        out,
        |s, i| u32v(s.read(i, Reading::PcieReplay, |g| &g.pcie_replay_count)),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkErrorCounter(
    device: nvmlDevice_t,
    link: c_uint,
    counter: nvmlNvLinkErrorCounter_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetNvLinkErrorCounter, |s, i| {
        let (name, pick): (&str, fn(&Gpu) -> &[Value]) = match counter {
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_FLIT => {
                ("crc_flit", |g| &g.nvlink_crc_flit_errors)
            }
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_CRC_DATA => {
                ("crc_data", |g| &g.nvlink_crc_data_errors)
            }
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_REPLAY => {
                ("replay", |g| &g.nvlink_replay_errors)
            }
            nvmlNvLinkErrorCounter_enum_NVML_NVLINK_ERROR_DL_RECOVERY => {
                ("recovery", |g| &g.nvlink_recovery_errors)
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        if s.unsupported(i).nvlink_error(name, link) {
            return Err(NOT_SUPPORTED);
        }
        let v = s.read_link(i, counter, link, pick).ok_or(NOT_SUPPORTED)?;
        put(out, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: nvmlDevice_t,
    threshold: nvmlTemperatureThresholds_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev(
        device,
        Function::nvmlDeviceGetTemperatureThreshold,
        |s, i| {
            let g = s.gpu(i);
            let v = match threshold {
                nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => {
                    g.temp_slowdown_c
                }
                nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => {
                    g.temp_shutdown_c
                }
                nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_GPU_MAX => {
                    g.temp_gpu_max_c
                }
                nvmlTemperatureThresholds_enum_NVML_TEMPERATURE_THRESHOLD_MEM_MAX => {
                    g.temp_mem_max_c
                }
                _ => return Err(NOT_SUPPORTED),
            };
            put(out, v)
        },
    )
}
