//! A fake `libnvidia-ml.so` for tests: it exports the NVML C functions the gpufleet agent
//! calls (through `nvml-wrapper`), with NVML's signatures, struct layouts (taken from
//! `nvml-wrapper-sys`, so they are exactly what the wrapper expects), versioned names
//! (`nvmlInit_v2`, `nvmlDeviceGetMemoryInfo_v2`, `…RunningProcesses_v3`) and return-code
//! protocol (`NVML_ERROR_NOT_SUPPORTED`; `NVML_ERROR_INSUFFICIENT_SIZE` with the needed
//! count; `NVML_ERROR_GPU_IS_LOST`; `NVML_ERROR_TIMEOUT` from an empty event wait).
//!
//! It answers from a [`Scenario`] (JSON) read by `nvmlInit_v2` from
//! `$FAKE_NVML_SCENARIO`, or else from `fake-nvml.json` in the folder the library was
//! loaded from: copy the library into a temporary folder next to a scenario and each copy
//! is its own fake machine (the dynamic loader loads each copy separately), so tests in
//! one process do not share state.
//!
//! `nvmlShutdown` writes how often each function was called to the scenario's
//! `counts_file`, so tests can check that an unsupported metric is asked only once.
//!
//! A cost model (`cost_model: "h200"`, per-function and per-field `costs`) makes each
//! per-device call cost what it costs on a real driver: CPU spun on the calling thread and
//! a wait, paid after the fake's lock is released so calls on several threads overlap; the
//! counts file shows what each GPU was charged (`gpu0.charged_cpu_us`, `…_wait_us`).
//!
//! Per-process utilization can follow a real driver's ring buffer (`process_sample_ms`,
//! `process_buffer_ms`): samples on wall-clock period boundaries, each answered to every
//! caller whose `lastSeenTimeStamp` is older, instead of one fresh sample per call.
//!
//! GPM (`nvmlGpm*`, Hopper's performance counters) answers from a GPU's `gpm`: metrics
//! between two samples, a support query that can lie, injected sampling failures; the
//! counts file's `gpm_samples_live` shows the sample handles a caller did not free.
//!
//! Test-only: never installed, never published.

pub mod scenario;

mod cost;
mod ffi;
mod function;
mod gpm;
mod sampling;
mod state;
mod unsupported;

pub use cost::CallCost;
pub use scenario::{EventKind, EventSpec, GpmSpec, Gpu, MigSpec, Process, Scenario, Value};

/// The file name the fake looks for beside itself when `FAKE_NVML_SCENARIO` is unset.
pub const SCENARIO_FILE: &str = "fake-nvml.json";

/// The environment variable naming the scenario file.
pub const SCENARIO_ENV: &str = "FAKE_NVML_SCENARIO";

/// The file name cargo gives the built library (`lib` + crate name + `.so`).
pub const LIBRARY_FILE: &str = "libfake_nvml.so";

/// The built library for a test or example executable: cargo puts it in
/// `target/<profile>/deps` (the crate is a dev-dependency), next to test executables and
/// one folder up from examples. `None` if it was not built.
pub fn built_library(exe: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = exe.parent()?;
    [
        dir.to_path_buf(),
        dir.join("../deps"),
        dir.parent()?.to_path_buf(),
    ]
    .into_iter()
    .map(|d| d.join(LIBRARY_FILE))
    .find(|lib| lib.is_file())
}
