//! Per-tick readings: utilization, memory, temperature, fan, clocks, PCIe, ECC, codecs.

use super::{
    INVALID_ARGUMENT, NOT_SUPPORTED, VERSION_MISMATCH, code, dev, dev_value, get, handle, put,
    u32v, with,
};
use crate::function::Function;
use crate::state::Reading;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};

macro_rules! value_fn {
    ($name:ident, $ty:ty, $key:ident, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, out: *mut $ty) -> nvmlReturn_t {
            dev_value(device, Function::$name, out, |s, i| {
                <$ty>::try_from(s.read(i, Reading::$key, |g| &g.$field)).unwrap_or(<$ty>::MAX)
            })
        }
    };
}

value_fn!(nvmlDeviceGetPowerUsage, c_uint, Power, power_mw);
value_fn!(
    nvmlDeviceGetTotalEnergyConsumption,
    c_ulonglong,
    Energy,
    energy_mj
);
value_fn!(nvmlDeviceGetPerformanceState, nvmlPstates_t, Pstate, pstate);
value_fn!(
    nvmlDeviceGetCurrentClocksThrottleReasons,
    c_ulonglong,
    ThrottleReasons,
    throttle_reasons
);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetUtilizationRates, |s, i| {
        let gpu = u32v(s.read(i, Reading::UtilGpu, |g| &g.util_gpu_pct));
        let memory = u32v(s.read(i, Reading::UtilMem, |g| &g.util_mem_pct));
        put(out, nvmlUtilization_t { gpu, memory })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    code(with(|s| {
        let (i, mig) =
            s.device_or_mig_call(handle(device), Function::nvmlDeviceGetMemoryInfo_v2)?;
        let given = get(out)?;
        let expected = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);
        if given.version != expected {
            return Err(VERSION_MISMATCH);
        }
        if let Some(m) = mig.and_then(|k| s.gpu(i).mig_instances.get(k)) {
            let total = m.memory_total_bytes;
            return put(
                out,
                nvmlMemory_v2_t {
                    version: given.version,
                    total,
                    reserved: 0,
                    free: total,
                    used: 0,
                },
            );
        }
        let used = s.read(i, Reading::MemUsed, |g| &g.mem_used_bytes);
        let g = s.gpu(i);
        let total = g.memory_total_bytes;
        let reserved = g.memory_reserved_bytes.min(total);
        let used = used.min(total - reserved);
        put(
            out,
            nvmlMemory_v2_t {
                version: given.version,
                total,
                reserved,
                free: total - reserved - used,
                used,
            },
        )
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetTemperature, |s, i| {
        if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        put(out, u32v(s.read(i, Reading::TempGpu, |g| &g.temp_gpu_c)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: nvmlDevice_t,
    fan: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetFanSpeed_v2, |s, i| {
        if fan != 0 || s.gpu(i).fans == 0 {
            return Err(INVALID_ARGUMENT);
        }
        put(out, u32v(s.read(i, Reading::Fan, |g| &g.fan_pct)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock: nvmlClockType_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetClockInfo, |s, i| {
        let v = match clock {
            nvmlClockType_enum_NVML_CLOCK_GRAPHICS => {
                s.read(i, Reading::ClockGraphics, |g| &g.clock_graphics_mhz)
            }
            nvmlClockType_enum_NVML_CLOCK_SM => s.read(i, Reading::ClockSm, |g| &g.clock_sm_mhz),
            nvmlClockType_enum_NVML_CLOCK_MEM => s.read(i, Reading::ClockMem, |g| &g.clock_mem_mhz),
            _ => return Err(NOT_SUPPORTED),
        };
        put(out, u32v(v))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: nvmlDevice_t,
    counter: nvmlPcieUtilCounter_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    let mut wait_ms = 0;
    let code = dev(device, Function::nvmlDeviceGetPcieThroughput, |s, i| {
        let v = match counter {
            nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => {
                s.read(i, Reading::PcieTx, |g| &g.pcie_tx_kib)
            }
            nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => {
                s.read(i, Reading::PcieRx, |g| &g.pcie_rx_kib)
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        wait_ms = s.gpu(i).pcie_sample_ms;
        if wait_ms > 0 {
            s.pcie_in_flight += 1;
            s.pcie_in_flight_max = s.pcie_in_flight_max.max(s.pcie_in_flight);
        }
        put(out, u32v(v))
    });
    if wait_ms > 0 {
        // The driver's sampling window, with the lock released.
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        let _ = with(|s| {
            s.pcie_in_flight = s.pcie_in_flight.saturating_sub(1);
            Ok(())
        });
    }
    code
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetTotalEccErrors, |s, i| {
        if counter == nvmlEccCounterType_enum_NVML_AGGREGATE_ECC {
            if s.unsupported(i).ecc_aggregate {
                return Err(NOT_SUPPORTED);
            }
            let v = match error_type {
                nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED => {
                    s.read(i, Reading::EccCorrectedAggregate, |g| {
                        &g.ecc_corrected_aggregate
                    })
                }
                nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED => {
                    s.read(i, Reading::EccUncorrectedAggregate, |g| {
                        &g.ecc_uncorrected_aggregate
                    })
                }
                _ => return Err(INVALID_ARGUMENT),
            };
            return put(out, v);
        }
        if counter != nvmlEccCounterType_enum_NVML_VOLATILE_ECC {
            return Err(NOT_SUPPORTED);
        }
        let v = match error_type {
            nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED => {
                s.read(i, Reading::EccCorrected, |g| &g.ecc_corrected)
            }
            nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED => {
                s.read(i, Reading::EccUncorrected, |g| &g.ecc_uncorrected)
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        put(out, v)
    })
}

macro_rules! codec_fn {
    ($name:ident, $key:ident, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            util: *mut c_uint,
            period_us: *mut c_uint,
        ) -> nvmlReturn_t {
            dev(device, Function::$name, |s, i| {
                put(util, u32v(s.read(i, Reading::$key, |g| &g.$field)))?;
                put(period_us, 167_000)
            })
        }
    };
}

codec_fn!(nvmlDeviceGetEncoderUtilization, EncoderUtil, enc_util_pct);
codec_fn!(nvmlDeviceGetDecoderUtilization, DecoderUtil, dec_util_pct);
