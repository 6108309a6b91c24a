//! Static device facts: names, UUIDs, MIG devices, PCI, power limits, clocks, NVLink state.

use super::{
    INVALID_ARGUMENT, MAX_NVLINKS, NOT_FOUND, NOT_SUPPORTED, code, dev, dev_value, fill_array,
    handle, put, put_str, with,
};
use crate::function::Function;
use crate::scenario::{Gpu, MigSpec};
use crate::state;
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_char, c_int, c_uint};

macro_rules! string_fn {
    ($name:ident, $field:ident) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device: nvmlDevice_t,
            buf: *mut c_char,
            length: c_uint,
        ) -> nvmlReturn_t {
            dev(device, Function::$name, |s, i| {
                put_str(buf, length, &s.gpu(i).$field)
            })
        }
    };
}

/// A string of a GPU or of a MIG device.
pub(super) fn gpu_or_mig_string(
    d: nvmlDevice_t,
    f: Function,
    buf: *mut c_char,
    length: c_uint,
    pick: fn(&Gpu, Option<&MigSpec>) -> String,
) -> nvmlReturn_t {
    code(with(|s| {
        let (i, k) = s.device_or_mig_call(handle(d), f)?;
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
    gpu_or_mig_string(device, Function::nvmlDeviceGetUUID, buf, length, |g, m| {
        m.map_or_else(|| g.uuid.clone(), |m| m.uuid.clone())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    buf: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    gpu_or_mig_string(device, Function::nvmlDeviceGetName, buf, length, |g, m| {
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
    dev(device, Function::nvmlDeviceGetMaxMigDeviceCount, |s, i| {
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
    dev(
        device,
        Function::nvmlDeviceGetMigDeviceHandleByIndex,
        |s, i| {
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
        },
    )
}
string_fn!(nvmlDeviceGetSerial, serial);
string_fn!(nvmlDeviceGetVbiosVersion, vbios_version);

macro_rules! static_u32_fn {
    ($name:ident, $ty:ty, |$g:ident| $e:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, out: *mut $ty) -> nvmlReturn_t {
            dev_value(device, Function::$name, out, |s, i| {
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
static_u32_fn!(nvmlDeviceGetNumFans, c_uint, |g| g.fans);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetPciInfo_v3, |s, i| {
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
        Function::nvmlDeviceGetPowerManagementLimitConstraints,
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
    dev(device, Function::nvmlDeviceGetMaxClockInfo, |s, i| {
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
    dev(device, Function::nvmlDeviceGetNvLinkState, |s, i| {
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
    dev(device, Function::nvmlDeviceGetMigMode, |s, i| {
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
    dev(
        device,
        Function::nvmlDeviceGetCudaComputeCapability,
        |s, i| {
            let (a, b) = s.gpu(i).cuda_capability;
            put(major, a)?;
            put(minor, b)
        },
    )
}
