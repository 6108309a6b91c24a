//! The exported C functions. Each one turns its pointers into values, asks [`State`], and
//! writes the answer back.
//!
//! `unsafe` is allowed here only (the workspace denies it): exporting `extern "C"`
//! symbols needs `#[unsafe(no_mangle)]`, and NVML's contract is pointers in and out.
//! Every write goes through [`put`], which checks for null first.
#![allow(unsafe_code)]
// The safety contract of every function is NVML's own (nvml.h): valid pointers, buffers
// of the stated length.
#![allow(clippy::missing_safety_doc)]
// The exported names and NVML's constants are the C names.
#![allow(non_snake_case, non_upper_case_globals)]

use crate::scenario::{Gpu, MigSpec, Process, Scenario, Value};
use crate::state::{self, NvmlResult, State};
use crate::{SCENARIO_ENV, SCENARIO_FILE};
use nvml_wrapper_sys::bindings::field_id::{
    NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT,
};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, OsStr, c_char, c_int, c_uint, c_ulonglong};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const SUCCESS: nvmlReturn_t = nvmlReturn_enum_NVML_SUCCESS;
const INVALID_ARGUMENT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const INSUFFICIENT_SIZE: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const NOT_FOUND: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const TIMEOUT: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_TIMEOUT;
const UNKNOWN: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNKNOWN;
const UNINITIALIZED: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const VERSION_MISMATCH: nvmlReturn_t = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;

/// NVML's "no value" for 32-bit ids (GPU / compute instance of a non-MIG process).
const NO_ID: c_uint = 0xFFFF_FFFF;
/// NVML's `NVML_VALUE_NOT_AVAILABLE` for a process's used memory.
const MEM_NOT_AVAILABLE: c_ulonglong = c_ulonglong::MAX;
/// NVML's maximum number of NVLink links.
const MAX_NVLINKS: c_uint = 18;

fn code(r: NvmlResult<()>) -> nvmlReturn_t {
    r.err().unwrap_or(SUCCESS)
}

/// Writes `v` through `p`.
fn put<T>(p: *mut T, v: T) -> NvmlResult<()> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes the caller pass a valid, aligned pointer.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads `*p`.
fn get<T: Copy>(p: *const T) -> NvmlResult<T> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: as for `put`.
    Ok(unsafe { p.read() })
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes.
fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> NvmlResult<()> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: the caller's buffer holds `len` bytes (NVML's contract), checked above.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// A fixed C string field of a struct.
fn fill_array<const N: usize>(dst: &mut [c_char; N], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
}

fn u32v(v: u64) -> c_uint {
    c_uint::try_from(v).unwrap_or(c_uint::MAX)
}

fn handle(d: nvmlDevice_t) -> usize {
    d as usize
}

fn device_handle(i: usize) -> nvmlDevice_t {
    (i + 1) as nvmlDevice_t
}

/// A per-device call: counts it, applies lost / unsupported, then runs `f`.
fn dev(
    d: nvmlDevice_t,
    name: &'static str,
    f: impl FnOnce(&mut State, usize) -> NvmlResult<()>,
) -> nvmlReturn_t {
    code(state::with(|s| {
        let i = s.device_call(handle(d), name)?;
        f(s, i)
    }))
}

/// A per-device call answering one value.
fn dev_value<T>(
    d: nvmlDevice_t,
    name: &'static str,
    out: *mut T,
    f: impl FnOnce(&mut State, usize) -> T,
) -> nvmlReturn_t {
    dev(d, name, |s, i| put(out, f(s, i)))
}

// ------------------------------------------------------------------ init / system

/// Where this copy of the library was loaded from.
fn own_path() -> Option<PathBuf> {
    // SAFETY: `Dl_info` is plain data; zeroed is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = nvmlInit_v2 as *const libc::c_void;
    // SAFETY: `addr` is a function of this library; `info` is a valid out pointer.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated path that lives as long as the mapping.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}

fn load_scenario() -> Result<Scenario, String> {
    let path = match std::env::var_os(SCENARIO_ENV) {
        Some(p) => PathBuf::from(p),
        None => own_path()
            .and_then(|p| p.parent().map(|d| d.join(SCENARIO_FILE)))
            .ok_or_else(|| {
                format!("{SCENARIO_ENV} is unset and the library's folder is unknown")
            })?,
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read scenario {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("bad scenario {}: {e}", path.display()))
}

/// Both init functions: the first loads the scenario, later ones count a reference.
fn init(name: &'static str) -> nvmlReturn_t {
    let mut guard = state::lock();
    if let Some(s) = guard.as_mut() {
        s.inits += 1;
        s.system_call(name);
        return SUCCESS;
    }
    match load_scenario() {
        Ok(scenario) => {
            let mut s = State::new(scenario);
            s.system_call(name);
            *guard = Some(s);
            SUCCESS
        }
        Err(e) => {
            eprintln!("fake-nvml: {e}");
            UNKNOWN
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init("nvmlInit_v2")
}

/// What pynvml's `nvmlInit()` calls (flags 0); the fake has no flag to honour.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init("nvmlInitWithFlags")
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut guard = state::lock();
    let Some(s) = guard.as_mut() else {
        return UNINITIALIZED;
    };
    s.system_call("nvmlShutdown");
    s.inits = s.inits.saturating_sub(1);
    if s.inits == 0 {
        if let Some(path) = &s.scenario.counts_file
            && let Err(e) = std::fs::write(path, s.counts_json())
        {
            eprintln!("fake-nvml: cannot write {}: {e}", path.display());
        }
        *guard = None;
    }
    SUCCESS
}

macro_rules! system_string_fn {
    ($name:ident, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(version: *mut c_char, length: c_uint) -> nvmlReturn_t {
            code(state::with(|s| {
                s.system_call(stringify!($name));
                put_str(version, length, &s.scenario.$field)
            }))
        }
    };
}

system_string_fn!(nvmlSystemGetDriverVersion, driver_version);
system_string_fn!(nvmlSystemGetNVMLVersion, nvml_version);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    code(state::with(|s| {
        s.system_call("nvmlSystemGetCudaDriverVersion_v2");
        put(version, s.scenario.cuda_driver_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    code(state::with(|s| {
        s.system_call("nvmlDeviceGetCount_v2");
        put(count, u32v(s.scenario.gpus.len() as u64))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    code(state::with(|s| {
        s.system_call("nvmlDeviceGetHandleByIndex_v2");
        let i = s.gpu_of(index as usize + 1)?;
        put(device, device_handle(i))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    code(state::with(|s| {
        s.system_call("nvmlDeviceGetHandleByUUID");
        if uuid.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: a NUL-terminated string, per NVML's contract.
        let wanted = unsafe { CStr::from_ptr(uuid) };
        let i = s
            .scenario
            .gpus
            .iter()
            .position(|g| g.uuid.as_bytes() == wanted.to_bytes())
            .ok_or(NOT_FOUND)?;
        put(device, device_handle(i))
    }))
}

// ------------------------------------------------------------------ static facts

macro_rules! string_fn {
    ($name:ident, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            buf: *mut c_char,
            length: c_uint,
        ) -> nvmlReturn_t {
            dev(device, stringify!($name), |s, i| {
                put_str(buf, length, &s.gpu(i).$field)
            })
        }
    };
}

/// A string of a GPU or of a MIG device.
fn gpu_or_mig_string(
    d: nvmlDevice_t,
    name: &'static str,
    buf: *mut c_char,
    length: c_uint,
    pick: fn(&Gpu, Option<&MigSpec>) -> String,
) -> nvmlReturn_t {
    code(state::with(|s| {
        let (i, k) = s.device_or_mig_call(handle(d), name)?;
        let g = s.gpu(i);
        put_str(
            buf,
            length,
            &pick(g, k.and_then(|k| g.mig_instances.get(k))),
        )
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    gpu_or_mig_string(device, "nvmlDeviceGetUUID", buf, length, |g, m| {
        m.map_or_else(|| g.uuid.clone(), |m| m.uuid.clone())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    gpu_or_mig_string(device, "nvmlDeviceGetName", buf, length, |g, m| {
        m.map_or_else(
            || g.name.clone(),
            |m| format!("{} MIG {}", g.name, m.profile),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetMaxMigDeviceCount", |s, i| {
        if s.gpu(i).mig_mode == 0 {
            return Err(NOT_SUPPORTED);
        }
        put(count, 7)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetMigDeviceHandleByIndex", |s, i| {
        let g = s.gpu(i);
        if g.mig_mode == 0 {
            return Err(NOT_SUPPORTED);
        }
        if index >= 7 {
            return Err(INVALID_ARGUMENT);
        }
        if index as usize >= g.mig_instances.len() {
            return Err(NOT_FOUND);
        }
        put(
            mig,
            (state::MIG_HANDLES + i * 256 + index as usize) as nvmlDevice_t,
        )
    })
}
string_fn!(nvmlDeviceGetSerial, serial);
string_fn!(nvmlDeviceGetVbiosVersion, vbios_version);

macro_rules! static_u32_fn {
    ($name:ident, $ty:ty, |$g:ident| $e:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, out: *mut $ty) -> nvmlReturn_t {
            dev_value(device, stringify!($name), out, |s, i| {
                let $g: &Gpu = s.gpu(i);
                $e
            })
        }
    };
}

static_u32_fn!(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, |g| g
    .architecture);
static_u32_fn!(nvmlDeviceGetBrand, nvmlBrandType_t, |g| g.brand);
static_u32_fn!(nvmlDeviceGetPowerManagementDefaultLimit, c_uint, |g| g
    .power_limit_default_mw);
static_u32_fn!(nvmlDeviceGetEnforcedPowerLimit, c_uint, |g| g
    .power_limit_enforced_mw);
static_u32_fn!(nvmlDeviceGetComputeMode, nvmlComputeMode_t, |g| g
    .compute_mode);
static_u32_fn!(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, |g| {
    u32::from(g.persistence_mode)
});
static_u32_fn!(nvmlDeviceGetMaxPcieLinkGeneration, c_uint, |g| g
    .pcie_link_gen_max);
static_u32_fn!(nvmlDeviceGetMaxPcieLinkWidth, c_uint, |g| g
    .pcie_link_width_max);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetPciInfo_v3", |s, i| {
        let id = &s.gpu(i).pci_bus_id;
        // "DDDDDDDD:BB:DD.F"
        let mut parts = id.split([':', '.']);
        let mut hex = || {
            parts
                .next()
                .and_then(|p| u32::from_str_radix(p, 16).ok())
                .unwrap_or(0)
        };
        let (domain, bus, dev_no) = (hex(), hex(), hex());
        // SAFETY: plain-data C struct; zeroed is valid.
        let mut info: nvmlPciInfo_t = unsafe { std::mem::zeroed() };
        info.domain = domain;
        info.bus = bus;
        info.device = dev_no;
        info.pciDeviceId = 0x20B2_10DE;
        fill_array(&mut info.busId, id);
        fill_array(
            &mut info.busIdLegacy,
            &format!("{:04x}:{bus:02x}:{dev_no:02x}.0", domain & 0xFFFF),
        );
        put(pci, info)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device: nvmlDevice_t,
    min: *mut c_uint,
    max: *mut c_uint,
) -> nvmlReturn_t {
    dev(
        device,
        "nvmlDeviceGetPowerManagementLimitConstraints",
        |s, i| {
            let g = s.gpu(i);
            put(min, g.power_limit_min_mw)?;
            put(max, g.power_limit_max_mw)
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    clock: nvmlClockType_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetMaxClockInfo", |s, i| {
        let g = s.gpu(i);
        let v = match clock {
            nvmlClockType_enum_NVML_CLOCK_GRAPHICS => g.max_clock_graphics_mhz,
            nvmlClockType_enum_NVML_CLOCK_SM => g.max_clock_sm_mhz,
            nvmlClockType_enum_NVML_CLOCK_MEM => g.max_clock_mem_mhz,
            _ => return Err(NOT_SUPPORTED),
        };
        put(out, v)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetNvLinkState", |s, i| {
        let n = s.gpu(i).nvlinks;
        if n == 0 {
            return Err(NOT_SUPPORTED);
        }
        if link >= MAX_NVLINKS {
            return Err(INVALID_ARGUMENT);
        }
        put(active, u32::from(link < n))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetMigMode", |s, i| {
        let m = s.gpu(i).mig_mode;
        put(current, m)?;
        put(pending, m)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetCudaComputeCapability", |s, i| {
        let (a, b) = s.gpu(i).cuda_capability;
        put(major, a)?;
        put(minor, b)
    })
}

// ------------------------------------------------------------------ per-tick values

macro_rules! value_fn {
    ($name:ident, $ty:ty, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, out: *mut $ty) -> nvmlReturn_t {
            dev_value(device, stringify!($name), out, |s, i| {
                <$ty>::try_from(s.read(i, stringify!($field), |g| &g.$field)).unwrap_or(<$ty>::MAX)
            })
        }
    };
}

value_fn!(nvmlDeviceGetPowerUsage, c_uint, power_mw);
value_fn!(nvmlDeviceGetTotalEnergyConsumption, c_ulonglong, energy_mj);
value_fn!(nvmlDeviceGetPerformanceState, nvmlPstates_t, pstate);
value_fn!(
    nvmlDeviceGetCurrentClocksThrottleReasons,
    c_ulonglong,
    throttle_reasons
);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    out: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetUtilizationRates", |s, i| {
        let gpu = u32v(s.read(i, "util_gpu_pct", |g| &g.util_gpu_pct));
        let memory = u32v(s.read(i, "util_mem_pct", |g| &g.util_mem_pct));
        put(out, nvmlUtilization_t { gpu, memory })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    out: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    code(state::with(|s| {
        let (i, mig) = s.device_or_mig_call(handle(device), "nvmlDeviceGetMemoryInfo_v2")?;
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
        let used = s.read(i, "mem_used_bytes", |g| &g.mem_used_bytes);
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
    dev(device, "nvmlDeviceGetTemperature", |s, i| {
        if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        put(out, u32v(s.read(i, "temp_gpu_c", |g| &g.temp_gpu_c)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: nvmlDevice_t,
    fan: c_uint,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetFanSpeed_v2", |s, i| {
        if fan != 0 {
            return Err(INVALID_ARGUMENT);
        }
        put(out, u32v(s.read(i, "fan_pct", |g| &g.fan_pct)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock: nvmlClockType_t,
    out: *mut c_uint,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetClockInfo", |s, i| {
        let v = match clock {
            nvmlClockType_enum_NVML_CLOCK_GRAPHICS => {
                s.read(i, "clock_graphics_mhz", |g| &g.clock_graphics_mhz)
            }
            nvmlClockType_enum_NVML_CLOCK_SM => s.read(i, "clock_sm_mhz", |g| &g.clock_sm_mhz),
            nvmlClockType_enum_NVML_CLOCK_MEM => s.read(i, "clock_mem_mhz", |g| &g.clock_mem_mhz),
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
    dev(device, "nvmlDeviceGetPcieThroughput", |s, i| {
        let v = match counter {
            nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_TX_BYTES => {
                s.read(i, "pcie_tx_kib", |g| &g.pcie_tx_kib)
            }
            nvmlPcieUtilCounter_enum_NVML_PCIE_UTIL_RX_BYTES => {
                s.read(i, "pcie_rx_kib", |g| &g.pcie_rx_kib)
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        put(out, u32v(v))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: nvmlDevice_t,
    error_type: nvmlMemoryErrorType_t,
    counter: nvmlEccCounterType_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetTotalEccErrors", |s, i| {
        if counter != nvmlEccCounterType_enum_NVML_VOLATILE_ECC {
            return Err(NOT_SUPPORTED);
        }
        let v = match error_type {
            nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_CORRECTED => {
                s.read(i, "ecc_corrected", |g| &g.ecc_corrected)
            }
            nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED => {
                s.read(i, "ecc_uncorrected", |g| &g.ecc_uncorrected)
            }
            _ => return Err(INVALID_ARGUMENT),
        };
        put(out, v)
    })
}

macro_rules! codec_fn {
    ($name:ident, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            util: *mut c_uint,
            period_us: *mut c_uint,
        ) -> nvmlReturn_t {
            dev(device, stringify!($name), |s, i| {
                put(util, u32v(s.read(i, stringify!($field), |g| &g.$field)))?;
                put(period_us, 167_000)
            })
        }
    };
}

codec_fn!(nvmlDeviceGetEncoderUtilization, enc_util_pct);
codec_fn!(nvmlDeviceGetDecoderUtilization, dec_util_pct);

// ------------------------------------------------------------------ processes

/// The `_v3` process-list protocol: a call whose buffer is null or smaller than the list
/// answers INSUFFICIENT_SIZE with the needed count (SUCCESS with 0 for an empty list).
fn process_list(
    device: nvmlDevice_t,
    name: &'static str,
    list: fn(&Gpu) -> &Vec<Process>,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    code(state::with(|s| {
        let (i, mig) = s.device_or_mig_call(handle(device), name)?;
        let call = s.nth(i, name);
        let visible = State::visible(list(s.gpu(i)), call, mig);
        let instances = &s.gpu(i).mig_instances;
        let capacity = get(count)? as usize;
        put(count, u32v(visible.len() as u64))?;
        if visible.is_empty() {
            return Ok(());
        }
        if infos.is_null() || capacity < visible.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        for (k, p) in visible.iter().enumerate() {
            let instance = p.mig.and_then(|m| instances.get(m));
            let info = nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_bytes.unwrap_or(MEM_NOT_AVAILABLE),
                gpuInstanceId: instance.map_or(NO_ID, |m| m.gpu_instance_id),
                computeInstanceId: instance.map_or(NO_ID, |m| m.compute_instance_id),
            };
            // SAFETY: `infos` holds `capacity` entries (NVML's contract); k < capacity.
            put(unsafe { infos.add(k) }, info)?;
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    process_list(
        device,
        "nvmlDeviceGetComputeRunningProcesses_v3",
        |g| &g.compute_processes,
        count,
        infos,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    process_list(
        device,
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        |g| &g.graphics_processes,
        count,
        infos,
    )
}

/// Samples newer than `last_seen` for every process with a utilization; NOT_FOUND when
/// there are none; the size protocol as for the process lists.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetProcessUtilization", |s, i| {
        let ts = s.timestamp();
        let g = s.gpu(i);
        let mut busy: Vec<nvmlProcessUtilizationSample_t> = Vec::new();
        for p in g.compute_processes.iter().chain(&g.graphics_processes) {
            if let Some(sm) = p.sm_pct
                && ts > last_seen
                && !busy.iter().any(|b| b.pid == p.pid)
            {
                busy.push(nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: ts,
                    smUtil: sm,
                    memUtil: p.mem_pct,
                    encUtil: p.enc_pct,
                    decUtil: p.dec_pct,
                });
            }
        }
        if busy.is_empty() {
            put(count, 0)?;
            return Err(NOT_FOUND);
        }
        let capacity = get(count)? as usize;
        put(count, u32v(busy.len() as u64))?;
        if samples.is_null() || capacity < busy.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        for (k, b) in busy.into_iter().enumerate() {
            // SAFETY: `samples` holds `capacity` entries; k < capacity.
            put(unsafe { samples.add(k) }, b)?;
        }
        Ok(())
    })
}

// ------------------------------------------------------------------ field values

/// Fills each requested field; the call succeeds and each entry carries its own return
/// code (NOT_SUPPORTED for fields this GPU or this fake does not have). NVLink throughput
/// fields honour `scopeId`: a link's counter, or (UINT_MAX) the sum over active links.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    values_count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceGetFieldValues", |s, i| {
        if values.is_null() || values_count < 0 {
            return Err(INVALID_ARGUMENT);
        }
        // Every NVLink entry of this call reads the same index of its counter.
        let nvlink_read = s.nth(i, "field_nvlink");
        for k in 0..values_count as usize {
            // SAFETY: `values` holds `values_count` entries (NVML's contract).
            let slot = unsafe { values.add(k) };
            let mut fv = get(slot)?;
            let (id, scope) = (fv.fieldId, fv.scopeId);
            s.field_asked(i, id, scope);
            let g = s.gpu(i);
            // (No names to build when nothing is unsupported: the fake's own cost per
            // entry stays small next to the monitors measured against it.)
            let unsupported = !g.unsupported.is_empty()
                && (g.is_unsupported(&format!("field:{id}"))
                    || g.is_unsupported(&format!("field:{id}:{scope}")));
            let read: Option<(u64, bool)> = if unsupported {
                None
            } else {
                match id {
                    NVML_FI_DEV_POWER_INSTANT => Some((
                        s.read(i, "field_power_instant", |g| &g.power_instant_mw),
                        false,
                    )),
                    NVML_FI_DEV_POWER_AVERAGE => {
                        Some((s.read(i, "field_power_avg", |g| &g.power_mw), false))
                    }
                    NVML_FI_DEV_MEMORY_TEMP => {
                        Some((s.read(i, "field_temp_mem", |g| &g.temp_mem_c), false))
                    }
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
            fv.timestamp = i64::try_from(s.timestamp()).unwrap_or(i64::MAX);
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
fn nvlink_kib(active: c_uint, counters: &[Value], scope: c_uint, n: u64) -> Option<u64> {
    let link = |l: c_uint| counters.get(l as usize).map_or(0, |v| v.at(n));
    if scope == c_uint::MAX {
        Some((0..active).map(link).fold(0, u64::saturating_add))
    } else if scope < active {
        Some(link(scope))
    } else {
        None
    }
}

// ------------------------------------------------------------------ events

/// What this fake can deliver.
fn supported_events() -> c_ulonglong {
    c_ulonglong::from(
        nvmlEventTypeXidCriticalError
            | nvmlEventTypeDoubleBitEccError
            | nvmlEventTypeSingleBitEccError,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    out: *mut c_ulonglong,
) -> nvmlReturn_t {
    dev_value(device, "nvmlDeviceGetSupportedEventTypes", out, |_, _| {
        supported_events()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    code(state::with(|s| {
        s.system_call("nvmlEventSetCreate");
        s.sets.push(Some(state::EventSet::default()));
        put(set, s.sets.len() as nvmlEventSet_t)
    }))
}

fn set_index(s: &State, set: nvmlEventSet_t) -> NvmlResult<usize> {
    (set as usize)
        .checked_sub(1)
        .filter(|k| s.sets.get(*k).is_some_and(Option::is_some))
        .ok_or(INVALID_ARGUMENT)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    dev(device, "nvmlDeviceRegisterEvents", |s, i| {
        let k = set_index(s, set)?;
        if types & !supported_events() != 0 {
            return Err(NOT_SUPPORTED);
        }
        if let Some(Some(es)) = s.sets.get_mut(k) {
            es.registered.push((i, types));
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    // Blocks like the driver's wait (no polling: a monitor waiting here costs no CPU),
    // woken when a device call makes an event pending.
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    let mut guard = state::lock();
    loop {
        let Some(s) = guard.as_mut() else {
            return UNINITIALIZED;
        };
        s.system_call("nvmlEventSetWait_v2");
        let k = match set_index(s, set) {
            Ok(k) => k,
            Err(e) => return e,
        };
        if let Some(d) = s.take_event(k) {
            return code(put(
                data,
                nvmlEventData_t {
                    device: device_handle(d.gpu),
                    eventType: d.event_type,
                    eventData: d.data,
                    gpuInstanceId: NO_ID,
                    computeInstanceId: NO_ID,
                },
            ));
        }
        let now = Instant::now();
        if now >= deadline {
            return TIMEOUT;
        }
        guard = state::wait_for_event(guard, deadline - now);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    code(state::with(|s| {
        s.system_call("nvmlEventSetFree");
        let k = set_index(s, set)?;
        s.sets[k] = None;
        Ok(())
    }))
}
