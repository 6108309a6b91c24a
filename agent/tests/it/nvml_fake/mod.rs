//! The agent's real NVML source, through nvml-wrapper, against the fake libnvidia-ml
//! (`fake-nvml`): every metric read back with the scenario's values, unsupported ones
//! absent and asked once, process lists growing under NVML's INSUFFICIENT_SIZE protocol,
//! the fixture pids mapped to their containers, an Xid event delivered once, a GPU lost
//! and recovered, health counters on their interval and after events (every bundled
//! health scenario), and `gpufleet-agent snapshot --nvml-lib`.
//!
//! Each test copies the built library into its own temporary folder beside its scenario,
//! so each test has its own fake machine (the loader loads each copy separately).
//!
//! Shared here: the fake machine (built library + scenario in a temporary folder) and
//! scenario and tick helpers.

mod cadence;
mod events;
mod gpm;
mod health;
mod metrics;
mod processes;
mod snapshot;

use crate::common::cgroup_fixtures;
use fake_nvml::{EventKind, EventSpec, Gpu, MigSpec, Process, Scenario, Value};
use gpufleet_agent::nvml::{Cadence, DEFAULT_HEALTH_INTERVAL, NvmlOptions, NvmlSource};
use gpufleet_core::GpuSource;
use gpufleet_core::{EventKind as Kind, GpuSample, ProcessType, Tick};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Unix ms of the first tick; ticks are 1 s apart.
const T0: i64 = 1_790_000_000_000;
const GIB: u64 = 1 << 30;

/// The fake library cargo built for this test binary (a dev-dependency: it sits in
/// `target/<profile>/deps` next to this test executable).
fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    fake_nvml::built_library(&exe).unwrap_or_else(|| {
        panic!(
            "{} not found next to {}: build the workspace (`cargo test --workspace`)",
            fake_nvml::LIBRARY_FILE,
            exe.display()
        )
    })
}

/// One fake machine: a private copy of the library, its scenario and its counts file.
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new(mut scenario: Scenario) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::copy(built_library(), dir.path().join("libnvidia-ml.so.1")).expect("copy lib");
        scenario.counts_file = Some(dir.path().join("counts.json"));
        let json = serde_json::to_string_pretty(&scenario).expect("scenario serializes");
        std::fs::write(dir.path().join(fake_nvml::SCENARIO_FILE), json).expect("write scenario");
        Self { dir }
    }

    fn lib(&self) -> PathBuf {
        self.dir.path().join("libnvidia-ml.so.1")
    }

    fn open(&self) -> NvmlSource {
        self.open_with_health_every(DEFAULT_HEALTH_INTERVAL)
    }

    /// Opens the source sampled every `interval` at `cadence`.
    fn open_with_cadence(&self, interval: Duration, cadence: Cadence) -> NvmlSource {
        NvmlSource::open(NvmlOptions {
            lib_path: Some(self.lib()),
            proc_root: cgroup_fixtures().join("proc"),
            hostname: "fake-node".into(),
            health_interval: DEFAULT_HEALTH_INTERVAL,
            interval,
            cadence,
        })
        .expect("the agent opens the fake NVML")
    }

    /// Opens the source with `--health-interval` `every`.
    fn open_with_health_every(&self, every: Duration) -> NvmlSource {
        NvmlSource::open(NvmlOptions {
            lib_path: Some(self.lib()),
            proc_root: cgroup_fixtures().join("proc"),
            hostname: "fake-node".into(),
            health_interval: every,
            interval: std::time::Duration::from_secs(1),
            cadence: gpufleet_agent::nvml::Cadence::EVERY_TICK,
        })
        .expect("the agent opens the fake NVML")
    }

    /// Per-function call counts, written by `nvmlShutdown` (drop the source first).
    fn counts(&self) -> BTreeMap<String, u64> {
        let path = self.dir.path().join("counts.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} (was the source dropped?): {e}", path.display()));
        serde_json::from_str(&text).expect("counts are JSON")
    }
}

fn count(counts: &BTreeMap<String, u64>, key: &str) -> u64 {
    counts.get(key).copied().unwrap_or(0)
}

fn gpu(uuid: &str) -> Gpu {
    Gpu {
        uuid: uuid.into(),
        ..Gpu::default()
    }
}

fn proc_(pid: u32, used_gib: u64, sm: Option<u32>) -> Process {
    Process {
        pid,
        used_bytes: Some(used_gib * GIB),
        sm_pct: sm,
        mem_pct: sm.map_or(0, |s| s / 2),
        ..Process::default()
    }
}

fn seq(v: &[u64]) -> Value {
    Value::Seq(v.to_vec())
}

fn ticks(src: &mut NvmlSource, n: usize) -> Vec<Tick> {
    (0..n)
        .map(|k| src.sample(T0 + k as i64 * 1000).expect("tick"))
        .collect()
}

fn sample<'t>(tick: &'t Tick, uuid: &str) -> &'t GpuSample {
    tick.gpus
        .iter()
        .find(|g| g.gpu_uuid == uuid)
        .unwrap_or_else(|| panic!("{uuid} missing from {tick:?}"))
}
