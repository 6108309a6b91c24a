//! Event sets: registering, waiting, freeing.

use super::{
    INVALID_ARGUMENT, NO_ID, NOT_SUPPORTED, TIMEOUT, UNINITIALIZED, code, dev, dev_value,
    device_handle, put, with,
};
use crate::function::Function;
use crate::state::{self, NvmlResult, State};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

/// What this fake can deliver.
pub(super) fn supported_events() -> c_ulonglong {
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
    dev_value(
        device,
        Function::nvmlDeviceGetSupportedEventTypes,
        out,
        |_, _| supported_events(),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    code(with(|s| {
        s.system_call(Function::nvmlEventSetCreate);
        s.sets.push(Some(state::EventSet::default()));
        put(set, s.sets.len() as nvmlEventSet_t)
    }))
}

pub(super) fn set_index(s: &State, set: nvmlEventSet_t) -> NvmlResult<usize> {
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
    dev(device, Function::nvmlDeviceRegisterEvents, |s, i| {
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
        s.system_call(Function::nvmlEventSetWait_v2);
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
    code(with(|s| {
        s.system_call(Function::nvmlEventSetFree);
        let k = set_index(s, set)?;
        s.sets[k] = None;
        Ok(())
    }))
}
