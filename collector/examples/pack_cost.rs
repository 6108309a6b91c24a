//! What packing one value costs, on the CPU: a minute of one GPU's samples and of its
//! process ticks, packed and unpacked many times over (`store::packed`, as the packer
//! writes minute values). A benchmark, not a test (BENCHMARKS.md):
//!
//! ```text
//! cargo run --release -p gpufleet-collector --example pack_cost
//! ```
//!
//! Knobs (environment): `TICKS` samples per value (60: a minute of 1 s ticks), `ROUNDS`
//! (5,000). The samples move as a busy GPU's do (power, utilization, memory, clocks and
//! PCIe readings vary from tick to tick, the energy counter climbs); two processes per
//! tick, as the ingest benchmark sends.

use anyhow::{Context, Result};
use gpufleet_collector::store::packed::{gpu, process};
use gpufleet_core::{GpuSample, UnixMs};
use std::time::Instant;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A seeded stream of readings below `m`.
struct Noise(u64);

impl Noise {
    fn below(&mut self, m: u64) -> u64 {
        self.0 = (self.0)
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % m
    }
}

fn samples(ticks: usize) -> Vec<(UnixMs, GpuSample)> {
    let mut n = Noise(12345);
    let mut energy_mj = 1_000_000_000u64;
    (0..ticks)
        .map(|t| {
            let power_mw = 300_000 + n.below(50_000) as u32;
            energy_mj += u64::from(power_mw);
            let sample = GpuSample {
                util_gpu_pct: Some(n.below(100) as u32),
                util_mem_pct: Some(n.below(100) as u32),
                mem_used_bytes: Some((40 << 30) | (n.below(1 << 20) << 12)),
                mem_total_bytes: Some(80 << 30),
                mem_reserved_bytes: Some(500 << 20),
                power_mw: Some(power_mw),
                power_instant_mw: Some(power_mw + n.below(10_000) as u32),
                power_limit_mw: Some(700_000),
                energy_mj: Some(energy_mj),
                temp_gpu_c: Some(60 + n.below(5) as u32),
                temp_mem_c: Some(70 + n.below(5) as u32),
                clock_sm_mhz: Some(1980 - n.below(100) as u32),
                clock_mem_mhz: Some(2619),
                clock_graphics_mhz: Some(1980 - n.below(100) as u32),
                pstate: Some(0),
                pcie_tx_bps: Some(n.below(1 << 30) & !1023),
                pcie_rx_bps: Some(n.below(1 << 30) & !1023),
                ecc_corrected_volatile: Some(0),
                ecc_uncorrected_volatile: Some(0),
                throttle_reasons: Some(0),
                enc_util_pct: Some(0),
                dec_util_pct: Some(0),
                ..Default::default()
            };
            (1_700_000_000_000 + t as i64 * 1000, sample)
        })
        .collect()
}

fn ticks(ticks: usize) -> Vec<process::ProcessTick> {
    (0..ticks)
        .flat_map(|t| {
            (0..2u32).map(move |p| process::ProcessTick {
                ts_ms: 1_700_000_000_000 + t as i64 * 1000,
                pid: 1000 + p,
                life_id: 7 + i64::from(p),
                gpu_mem_bytes: Some(1 << 30),
                sm_util_pct: Some(50),
                ..Default::default()
            })
        })
        .collect()
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
    let (samples, ticks) = (samples(n), ticks(n));
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
