//! Process lists and per-process utilization.

use super::{
    INSUFFICIENT_SIZE, MEM_NOT_AVAILABLE, NO_ID, NOT_FOUND, code, dev, get, handle, put, u32v, with,
};
use crate::function::Function;
use crate::sampling;
use crate::scenario::{Gpu, Process};
use crate::state::{self, Reading, State};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_uint, c_ulonglong};

/// The `_v3` process-list protocol: a call whose buffer is null or smaller than the list
/// answers INSUFFICIENT_SIZE with the needed count (SUCCESS with 0 for an empty list).
pub(super) fn process_list(
    device: nvmlDevice_t,
    function: Function,
    calls: Reading,
    list: fn(&Gpu) -> &Vec<Process>,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    code(with(|s| {
        let (i, mig) = s.device_or_mig_call(handle(device), function)?;
        let call = s.nth(i, calls);
        let visible = State::visible(list(s.gpu(i)), call, mig);
        let n = visible.len();
        let instances = &s.gpu(i).mig_instances;
        let capacity = get(count)? as usize;
        put(count, u32v(n as u64))?;
        if n == 0 {
            return Ok(());
        }
        if infos.is_null() || capacity < n {
            return Err(INSUFFICIENT_SIZE);
        }
        for (k, p) in visible.into_iter().enumerate() {
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
        Function::nvmlDeviceGetComputeRunningProcesses_v3,
        Reading::ComputeProcesses,
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
        Function::nvmlDeviceGetGraphicsRunningProcesses_v3,
        Reading::GraphicsProcesses,
        |g| &g.graphics_processes,
        count,
        infos,
    )
}

/// Samples newer than `last_seen` for every process with a utilization (one fresh sample
/// per process, or the driver's buffered samples: see [`crate::sampling`]); NOT_FOUND when
/// there are none; the size protocol as for the process lists (a fill that finds a sample
/// more than its count query answers INSUFFICIENT_SIZE with the new count, as NVML does).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: nvmlDevice_t,
    samples: *mut nvmlProcessUtilizationSample_t,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> nvmlReturn_t {
    dev(device, Function::nvmlDeviceGetProcessUtilization, |s, i| {
        // Fresh samples get a strictly increasing stamp of their own; buffered ones sit on
        // the wall clock's period boundaries.
        let now = if s.gpu(i).process_sample_ms == 0 {
            s.timestamp()
        } else {
            state::wall_clock_us()
        };
        // Counted, then written: no list to allocate per call.
        let (n, busy) = sampling::process_samples(s.gpu(i), now, last_seen);
        if n == 0 {
            put(count, 0)?;
            return Err(NOT_FOUND);
        }
        let capacity = get(count)? as usize;
        put(count, u32v(n as u64))?;
        if samples.is_null() || capacity < n {
            return Err(INSUFFICIENT_SIZE);
        }
        for (k, b) in busy.enumerate() {
            // SAFETY: `samples` holds `capacity` entries; k < n <= capacity.
            put(unsafe { samples.add(k) }, b)?;
        }
        Ok(())
    })
}
