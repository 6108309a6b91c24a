//! What one GPU-sample costs the agent's NVML source, measured against the fake
//! libnvidia-ml (see BENCHMARKS.md):
//!
//! ```sh
//! cargo run --release -p gpufleet-agent --example nvml_cost -- [GPUS] [TICKS] [PROCS_PER_GPU]
//! ```
//!
//! Prints the sampler thread's CPU time per GPU-sample (all of it, and without the time
//! spent inside NVML calls), the NVML calls per GPU-sample and the process's peak RSS.

use fake_nvml::{Gpu, Process, Scenario, Value};
use gpufleet_agent::nvml::{NvmlOptions, NvmlSource};
use gpufleet_core::GpuSource;
use gpufleet_uplink::cost::{micros, thread_cpu_time};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn arg(n: usize, default: u32) -> u32 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    fake_nvml::built_library(&exe).unwrap_or_else(|| {
        panic!(
            "{} not built for {}",
            fake_nvml::LIBRARY_FILE,
            exe.display()
        )
    })
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let gpus = arg(1, 8);
    let ticks = arg(2, 2000);
    let procs = arg(3, 4);
    let dir = tempfile::tempdir().expect("temp dir");
    let lib = dir.path().join("libnvidia-ml.so.1");
    std::fs::copy(library(), &lib).expect("copy the fake library");
    let scenario = Scenario {
        counts_file: Some(dir.path().join("counts.json")),
        gpus: (0..gpus)
            .map(|g| Gpu {
                uuid: format!("GPU-bench-{g}"),
                util_gpu_pct: Value::Seq(vec![90, 95, 99]),
                power_mw: Value::Ramp {
                    start: 300_000,
                    step: 1,
                },
                compute_processes: (0..procs)
                    .map(|p| Process {
                        pid: 1101 + (g * procs + p) % 11,
                        used_bytes: Some(1 << 30),
                        sm_pct: Some(20),
                        ..Process::default()
                    })
                    .collect(),
                ..Gpu::default()
            })
            .collect(),
        ..Scenario::default()
    };
    std::fs::write(
        dir.path().join(fake_nvml::SCENARIO_FILE),
        serde_json::to_string(&scenario).expect("scenario"),
    )
    .expect("write scenario");
    let proc_root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/cgroups/proc");
    let mut src = NvmlSource::open(NvmlOptions {
        lib_path: Some(lib),
        proc_root,
        hostname: "bench".into(),
        health_interval: gpufleet_agent::nvml::DEFAULT_HEALTH_INTERVAL,
        interval: std::time::Duration::from_secs(1),
        cadence: gpufleet_agent::nvml::Cadence::EVERY_TICK,
    })
    .expect("open the fake NVML");
    src.inventory().expect("inventory");
    // Warm-up: first-tick work (identities, unsupported probing) is not steady state.
    for t in 0..10 {
        src.sample(1_790_000_000_000 + t).expect("tick");
    }
    let (mut cpu, mut nvml) = (0u64, 0u64);
    for t in 0..ticks {
        let start = thread_cpu_time();
        let tick = src
            .sample(1_790_000_100_000 + i64::from(t) * 1000)
            .expect("tick");
        cpu += u64::from(micros(thread_cpu_time().saturating_sub(start)));
        let cost = tick.cost.expect("the source reports its cost");
        nvml += u64::from(cost.source_us.unwrap_or(0));
    }
    drop(src);
    let counts: BTreeMap<String, u64> = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("counts.json")).expect("counts"),
    )
    .expect("counts JSON");
    let device_calls: u64 = counts
        .iter()
        // Device calls; `gpuN.field:…` counts the entries of the field-value batch.
        .filter(|(k, _)| k.starts_with("gpu") && !k.contains(".field:"))
        .map(|(_, n)| n)
        .sum();
    let samples = f64::from(gpus) * f64::from(ticks);
    let all_ticks = f64::from(gpus) * f64::from(ticks + 10);
    println!("gpus={gpus} ticks={ticks} processes_per_gpu={procs}");
    println!(
        "cpu_us_per_gpu_sample={:.2} (including the time inside NVML calls)",
        cpu as f64 / samples
    );
    println!(
        "cpu_us_per_gpu_sample_excluding_nvml={:.2}",
        cpu.saturating_sub(nvml) as f64 / samples
    );
    println!("nvml_us_per_gpu_sample={:.2}", nvml as f64 / samples);
    println!(
        "nvml_calls_per_gpu_sample={:.1} (including inventory and warm-up)",
        device_calls as f64 / all_ticks
    );
    if let Some(kib) = peak_rss_kib() {
        println!("peak_rss_mib={:.1}", kib as f64 / 1024.0);
    }
}
