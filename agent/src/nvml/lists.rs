//! The per-tick lists (compute processes, graphics processes, per-process utilization) in
//! one NVML call each. nvml-wrapper asks for a list's size with a null buffer and then
//! fills it: two calls per list per tick. Here the buffer is sized from the count the
//! previous tick saw plus [`HEADROOM`], and asked again larger only when NVML answers
//! INSUFFICIENT_SIZE (the list grew), at most [`LIST_ATTEMPTS`] times.

use super::LIST_ATTEMPTS;
use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::struct_wrappers::device::{ProcessInfo, ProcessUtilizationSample};
use nvml_wrapper_sys::bindings::{
    nvmlProcessInfo_t, nvmlProcessUtilizationSample_t,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
    nvmlReturn_t,
};
use std::ffi::c_uint;

/// Entries allocated beyond the count the previous tick saw.
const HEADROOM: c_uint = 8;
/// The most entries a list may need: a count NVML asks for beyond it is refused, not
/// allocated (a GPU runs far fewer processes; utilization samples are per process).
const MAX_ENTRIES: c_uint = 4096;

/// Which running-process list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProcessList {
    Compute,
    Graphics,
}

/// Calls `fill(buffer, count)` with a buffer of `count` entries, `count` starting at
/// `*hint + HEADROOM`; on INSUFFICIENT_SIZE (NVML wrote the needed count) again with room
/// for that many plus the headroom. Returns the entries NVML filled and keeps their count
/// in `hint` for the next tick. `NOT_FOUND` (no utilization sample since the timestamp)
/// is an empty list.
fn one_call<T: Clone>(
    hint: &mut c_uint,
    empty: T,
    mut fill: impl FnMut(&mut Vec<T>, &mut c_uint) -> nvmlReturn_t,
) -> Result<Vec<T>, NvmlError> {
    let mut capacity = hint.saturating_add(HEADROOM);
    for _ in 0..LIST_ATTEMPTS {
        let mut buffer = vec![empty.clone(); capacity as usize];
        let mut count = capacity;
        let code = fill(&mut buffer, &mut count);
        if code == nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE {
            capacity = count.max(capacity).saturating_add(HEADROOM);
            if capacity > MAX_ENTRIES {
                return Err(NvmlError::InsufficientSize(Some(count as usize)));
            }
            continue;
        }
        if code == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
            *hint = 0;
            return Ok(Vec::new());
        }
        nvml_try(code)?;
        buffer.truncate(count as usize);
        *hint = buffer.len() as c_uint;
        return Ok(buffer);
    }
    Err(NvmlError::InsufficientSize(Some(capacity as usize)))
}

/// The device's running compute or graphics processes (`…RunningProcesses_v3`), in one
/// call when the list fits the room the last tick's count suggests.
#[allow(unsafe_code)]
pub(super) fn running_processes(
    device: &Device<'_>,
    list: ProcessList,
    hint: &mut c_uint,
) -> Result<Vec<ProcessInfo>, NvmlError> {
    let lib = device.nvml().lib();
    let sym = nvml_sym(match list {
        ProcessList::Compute => lib.nvmlDeviceGetComputeRunningProcesses_v3.as_ref(),
        ProcessList::Graphics => lib.nvmlDeviceGetGraphicsRunningProcesses_v3.as_ref(),
    })?;
    let empty = nvmlProcessInfo_t {
        pid: 0,
        usedGpuMemory: 0,
        gpuInstanceId: 0,
        computeInstanceId: 0,
    };
    let raw = one_call(hint, empty, |buffer, count| {
        // SAFETY: `sym` is the `_v3` list function of the library `device`'s `Nvml` loaded
        // and initialised, with nvml-wrapper-sys's binding of nvml.h (the one nvml-wrapper
        // calls); `device.handle()` is valid while `device` borrows that `Nvml`. `count` holds the
        // length of `buffer`, a live, exclusively borrowed array of `nvmlProcessInfo_t`
        // (the `#[repr(C)]` layout of the C struct): NVML writes at most `*count` entries
        // and then the number it wrote (or needs) into `count`.
        unsafe { sym(device.handle(), count, buffer.as_mut_ptr()) }
    })?;
    Ok(raw.into_iter().map(ProcessInfo::from).collect())
}

/// The device's per-process utilization samples newer than `since` (µs), in one call when
/// they fit the room the last tick's count suggests; none since then is an empty list.
#[allow(unsafe_code)]
pub(super) fn process_utilization(
    device: &Device<'_>,
    since: u64,
    hint: &mut c_uint,
) -> Result<Vec<ProcessUtilizationSample>, NvmlError> {
    let sym = nvml_sym(device.nvml().lib().nvmlDeviceGetProcessUtilization.as_ref())?;
    let empty = nvmlProcessUtilizationSample_t {
        pid: 0,
        timeStamp: 0,
        smUtil: 0,
        memUtil: 0,
        encUtil: 0,
        decUtil: 0,
    };
    let raw = one_call(hint, empty, |buffer, count| {
        // SAFETY: as in `running_processes`: `sym` is `nvmlDeviceGetProcessUtilization`
        // of this device's loaded library, `device.handle()` is valid, and `buffer` is a live,
        // exclusively borrowed array of `*count` `nvmlProcessUtilizationSample_t`, which
        // NVML fills up to `*count` entries before writing the number of samples there.
        unsafe { sym(device.handle(), buffer.as_mut_ptr(), count, since) }
    })?;
    Ok(raw
        .into_iter()
        .map(ProcessUtilizationSample::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_SUCCESS;

    /// A fake list call over `sizes` (the list's length at each call): fills what fits,
    /// else answers INSUFFICIENT_SIZE with the needed count.
    fn list(sizes: &[c_uint]) -> impl FnMut(&mut Vec<u32>, &mut c_uint) -> nvmlReturn_t + '_ {
        let mut call = 0;
        move |buffer, count| {
            let n = sizes[call.min(sizes.len() - 1)];
            call += 1;
            let room = *count;
            *count = n;
            if n > room {
                return nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for (k, slot) in buffer.iter_mut().take(n as usize).enumerate() {
                *slot = k as u32 + 1;
            }
            nvmlReturn_enum_NVML_SUCCESS
        }
    }

    /// A count past any real list (a broken driver, a bad fake) is refused, never
    /// allocated: one call, an error, and the buffer never grew.
    #[test]
    fn an_absurd_count_is_refused_not_allocated() {
        let mut hint = 0;
        let mut largest = 0;
        let mut f = list(&[1_000_000]);
        let got = one_call(&mut hint, 0u32, |b, c| {
            largest = largest.max(b.len());
            f(b, c)
        });
        assert!(got.is_err(), "{got:?}");
        assert!(largest <= MAX_ENTRIES as usize, "{largest}");
    }

    #[test]
    fn a_list_is_one_call_when_it_fits_and_grows_only_on_insufficient_size() {
        let mut hint = 0;
        let mut calls = 0;
        let mut f = list(&[3]);
        let got = one_call(&mut hint, 0u32, |b, c| {
            calls += 1;
            f(b, c)
        });
        assert_eq!((got.ok(), calls, hint), (Some(vec![1, 2, 3]), 1, 3));

        // 20 > 3 + 8: asked again with room for 28.
        let mut calls = 0;
        let mut f = list(&[20]);
        let got = one_call(&mut hint, 0u32, |b, c| {
            calls += 1;
            f(b, c)
        });
        assert_eq!((got.map(|v| v.len()).ok(), calls, hint), (Some(20), 2, 20));

        // Growing faster than it is asked: bounded, then an error (the value is absent).
        let mut calls = 0;
        let mut f = list(&[100, 200, 300, 400]);
        let got = one_call(&mut hint, 0u32, |b, c| {
            calls += 1;
            f(b, c)
        });
        assert!(matches!(got, Err(NvmlError::InsufficientSize(_))));
        assert_eq!(calls, LIST_ATTEMPTS);

        let got = one_call(&mut hint, 0u32, |_, _| nvmlReturn_enum_NVML_ERROR_NOT_FOUND);
        assert_eq!((got.ok(), hint), (Some(vec![]), 0), "none since: empty");
    }
}
