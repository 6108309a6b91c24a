//! Init, shutdown, system facts and device handles.

use super::{
    INVALID_ARGUMENT, NOT_FOUND, SUCCESS, UNINITIALIZED, UNKNOWN, code, device_handle, put,
    put_str, u32v, with,
};
use crate::function::Function;
use crate::scenario::Scenario;
use crate::state::{self, State};
use crate::{SCENARIO_ENV, SCENARIO_FILE};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{CStr, OsStr, c_char, c_int, c_uint};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Where this copy of the library was loaded from.
pub(super) fn own_path() -> Option<PathBuf> {
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

pub(super) fn load_scenario() -> Result<Scenario, String> {
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
pub(super) fn init(f: Function) -> nvmlReturn_t {
    let mut guard = state::lock();
    if let Some(s) = guard.as_mut() {
        s.inits += 1;
        s.system_call(f);
        return SUCCESS;
    }
    // A scenario that parses but does not load (an unknown cost model) fails init too.
    match load_scenario().and_then(State::new) {
        Ok(mut s) => {
            s.system_call(f);
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
    init(Function::nvmlInit_v2)
}

/// What pynvml's `nvmlInit()` calls (flags 0); the fake has no flag to honour.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init(Function::nvmlInitWithFlags)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    let mut guard = state::lock();
    let Some(s) = guard.as_mut() else {
        return UNINITIALIZED;
    };
    s.system_call(Function::nvmlShutdown);
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
            code(with(|s| {
                s.system_call(Function::$name);
                put_str(version, length, &s.scenario.$field)
            }))
        }
    };
}

system_string_fn!(nvmlSystemGetDriverVersion, driver_version);
system_string_fn!(nvmlSystemGetNVMLVersion, nvml_version);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlSystemGetCudaDriverVersion_v2);
        put(version, s.scenario.cuda_driver_version)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlDeviceGetCount_v2);
        put(count, u32v(s.scenario.gpus.len() as u64))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlDeviceGetHandleByIndex_v2);
        let i = s.gpu_of(index as usize + 1)?;
        put(device, device_handle(i))
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlDeviceGetHandleByUUID);
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
