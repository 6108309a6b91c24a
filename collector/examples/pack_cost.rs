//! What packing one value costs, on the CPU: a minute of one GPU's samples and of its
//! process ticks, packed and unpacked many times over (`store::packed`, as the packer
//! writes minute values). A benchmark, not a test (BENCHMARKS.md):
//!
//! ```text
//! cargo run --release -p gpufleet-collector --example pack_cost
//! ```
//!
//! Knobs (environment): `TICKS` samples per value (60: a minute of 1 s ticks), `ROUNDS`
//! (5,000). The samples are the simulator's (`gpufleet-sim`, seeded: a GPU running jobs),
//! 1 s apart; two processes per tick share the GPU's memory and utilization, as in
//! `storage_bytes`.

use anyhow::{Context, Result};
use gpufleet_collector::store::packed::{gpu, process};
use gpufleet_core::{GpuSample, GpuSource, UnixMs};
use gpufleet_sim::{SimOptions, Simulator};
use std::time::Instant;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A GPU's samples and its process ticks.
type Minute = (Vec<(UnixMs, GpuSample)>, Vec<process::ProcessTick>);

/// `n` ticks of one simulated GPU: its samples, and two process ticks per sample.
fn minute(n: usize) -> Result<Minute> {
    let mut sim = Simulator::new(SimOptions::new("bench", 1))?;
    let (mut samples, mut ticks) = (Vec::with_capacity(n), Vec::with_capacity(2 * n));
    for i in 0..n {
        let time_ms = 1_700_000_000_000 + i as i64 * 1000;
        let mut tick = sim.sample(time_ms).context("simulate")?;
        let s = tick.gpus.pop().context("the simulator has a GPU")?;
        ticks.extend((0..2u32).map(|p| process::ProcessTick {
            ts_ms: time_ms,
            pid: 1000 + p,
            life_id: 7 + i64::from(p),
            gpu_mem_bytes: s.mem_used_bytes.map(|m| m / 2),
            sm_util_pct: s.util_gpu_pct.map(|u| u / 2),
            mem_util_pct: s.util_mem_pct.map(|u| u / 2),
            ..Default::default()
        }));
        samples.push((time_ms, s));
    }
    Ok((samples, ticks))
}

/// Mean µs per call of `f` over `rounds`.
fn time<T>(rounds: usize, mut f: impl FnMut() -> Result<T>) -> Result<f64> {
    let began = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(f()?);
    }
    Ok(began.elapsed().as_secs_f64() * 1e6 / rounds as f64)
}

fn main() -> Result<()> {
    let (n, rounds) = (knob("TICKS", 60), knob("ROUNDS", 5_000).max(1));
    let (samples, ticks) = minute(n)?;
    let packed = gpu::pack(&samples).context("pack GPU samples")?;
    let pack = time(rounds, || Ok(gpu::pack(&samples)?))?;
    let unpack = time(rounds, || Ok(gpu::unpack(&packed)?))?;
    let packed_ticks = process::pack(&ticks).context("pack process ticks")?;
    let pack_ticks = time(rounds, || Ok(process::pack(&ticks)?))?;
    println!(
        "{n} GPU samples: {} bytes packed, pack {pack:.1} µs ({:.2} µs per sample), unpack \
         {unpack:.1} µs; {} process ticks: {} bytes packed, pack {pack_ticks:.1} µs",
        packed.len(),
        pack / n.max(1) as f64,
        ticks.len(),
        packed_ticks.len(),
    );
    Ok(())
}
