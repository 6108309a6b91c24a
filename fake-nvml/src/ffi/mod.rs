//! The exported C functions. Each one turns its pointers into values, asks [`State`], and
//! writes the answer back.
//!
//! `unsafe` is allowed here only (the workspace denies it): exporting `extern "C"`
//! symbols needs `#[unsafe(no_mangle)]`, and NVML's contract is pointers in and out.
//! Every write goes through [`put`], which checks for null first.
//!
//! One module per NVML area: `system` (init, shutdown, driver facts, device handles),
//! `device` (static device facts), `values` (per-tick readings), `processes`,
//! `fields` (field values), `health` (retired pages, ECC aggregates, PCIe replays,
//! NVLink errors, temperature thresholds), `events` and `gpm` (GPU Performance
//! Monitoring: sample handles, samples, metrics).
//!
//! Every call reaches the state through [`with`], which pays what the call owes under the
//! scenario's cost model once the state's lock is released ([`pay`]: spin on this
//! thread's CPU clock, then sleep).
#![allow(unsafe_code)]
// The safety contract of every function is NVML's own (nvml.h): valid pointers, buffers
// of the stated length.
#![allow(clippy::missing_safety_doc)]
// The exported names and NVML's constants are the C names.
#![allow(non_snake_case, non_upper_case_globals)]

use crate::cost::CallCost;
use crate::function::Function;
use crate::state::{self, NvmlResult, State};
use nvml_wrapper_sys::bindings::*;
use std::ffi::{c_char, c_uint, c_ulonglong};
use std::time::Duration;

mod device;
mod events;
mod fields;
mod gpm;
mod health;
mod processes;
mod system;
mod values;

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

/// Runs `f` on the initialised state (or answers `NVML_ERROR_UNINITIALIZED`), then, with
/// the lock released, pays what the call owes under the cost model (nothing without one).
fn with<R>(f: impl FnOnce(&mut State) -> NvmlResult<R>) -> NvmlResult<R> {
    let (r, owed) = state::with_owed(f);
    if !owed.is_free() {
        pay(owed);
    }
    r
}

/// Pays `cost` on this thread, as a real driver's call costs it: spins until the thread's
/// CPU time has advanced by `cpu_us` (CPU a monitor's thread really spends), then sleeps
/// `wait_us` (the driver waiting on the GPU). A CPU clock that cannot be read skips the
/// spin.
fn pay(cost: CallCost) {
    if cost.cpu_us > 0
        && let Some(start) = thread_cpu_ns()
    {
        let until = start.saturating_add(cost.cpu_us.saturating_mul(1_000));
        while thread_cpu_ns().is_some_and(|now| now < until) {
            std::hint::spin_loop();
        }
    }
    if cost.wait_us > 0 {
        std::thread::sleep(Duration::from_micros(cost.wait_us));
    }
}

/// This thread's CPU time in ns (`CLOCK_THREAD_CPUTIME_ID`); `None` if it cannot be read.
fn thread_cpu_ns() -> Option<u64> {
    // SAFETY: `timespec` is plain data; zeroed is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid, writable `timespec`.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u64::try_from(ts.tv_nsec).ok()?;
    Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
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

/// A per-device call: counts it, applies lost / unsupported, then runs `f`; pays its
/// cost (see [`with`]) after.
fn dev(
    d: nvmlDevice_t,
    function: Function,
    f: impl FnOnce(&mut State, usize) -> NvmlResult<()>,
) -> nvmlReturn_t {
    code(with(|s| {
        let i = s.device_call(handle(d), function)?;
        f(s, i)
    }))
}

/// A per-device call answering one value.
fn dev_value<T>(
    d: nvmlDevice_t,
    function: Function,
    out: *mut T,
    f: impl FnOnce(&mut State, usize) -> T,
) -> nvmlReturn_t {
    dev(d, function, |s, i| put(out, f(s, i)))
}
