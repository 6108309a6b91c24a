//! A GPU's idle baseline: the power it draws when it does no work.
//!
//! In order of preference:
//! 1. configured (`--energy-idle`): an operator's figure overrides everything;
//! 2. **learned**: the average power of the intervals in which this GPU was *seen idle*
//!    (0 % utilization at both ends, no compute process) — over its most recent
//!    [`LEARN_HORIZON_MS`] of seen-idle time — once at least [`MIN_SEEN_IDLE_MS`] of it
//!    was seen. Each stored minute records what it saw (`seen_idle_ms`, `seen_idle_mj`)
//!    and the evidence carried to the next (`learned_idle_ms`, `learned_idle_mj`), so the
//!    figure is persisted with its evidence, costs one row to read, and recomputing a
//!    minute never counts it twice;
//! 3. **model**: a share ([`IDLE_SHARE_PCT`]) of the maximum board power NVIDIA's datasheet
//!    gives for the model ([`MODELS`]);
//! 4. **fallback**: the same share of the power limit the GPU reported, or 0 W when it
//!    reported none (no energy is called idle that was not seen idle).
//!
//! Never the power of busy intervals: the old `min` rule (lowest power of the last 24 h)
//! took an always-busy GPU's working power for idle and split its whole energy as idle.
//! The model and fallback figures are deliberately low: on the boards below, the idle
//! draw `nvidia-smi` shows is 7–20 % of the maximum board power, and a baseline set too
//! low only hands a little idle energy to the SM split, while one set too high turns work
//! into idle.

use super::IdleSource;

/// Seen-idle time needed before a learned baseline is trusted.
pub const MIN_SEEN_IDLE_MS: i64 = 30_000;

/// How much of its most recent seen-idle time a learned baseline averages over.
pub const LEARN_HORIZON_MS: i64 = 3_600_000;

/// The evidence `(mJ, ms)` after a minute that saw `seen` on top of `before`: at most
/// [`LEARN_HORIZON_MS`] of the most recent seen-idle time (older evidence is scaled down
/// to make room, keeping its average).
pub fn carry(before: (u64, i64), seen: (u64, i64)) -> (u64, i64) {
    let (seen_mj, seen_ms) = (seen.0, seen.1.clamp(0, LEARN_HORIZON_MS));
    let (old_mj, old_ms) = (before.0, before.1.max(0));
    let room = LEARN_HORIZON_MS - seen_ms;
    if old_ms <= room {
        return (old_mj.saturating_add(seen_mj), old_ms + seen_ms);
    }
    // Keep `room` ms of the older evidence at its average power.
    let kept = u128::from(old_mj) * room as u128 / old_ms as u128;
    (
        u64::try_from(kept)
            .unwrap_or(u64::MAX)
            .saturating_add(seen_mj),
        LEARN_HORIZON_MS,
    )
}

/// The share of the maximum board power taken as idle when nothing was learned.
pub const IDLE_SHARE_PCT: u32 = 7;

/// A GPU model's datasheet figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPower {
    /// Words that must all appear in the name NVML reports (case-insensitive, whole
    /// words: `A10` does not match `A100`). The first entry that matches wins, so
    /// variants come before the family.
    pub words: &'static [&'static str],
    /// Maximum board power (TDP) of the datasheet, watts.
    pub max_power_w: u32,
    /// Where the figure is published.
    pub source: &'static str,
}

/// Datasheet maximum board power of the GPUs people run.
pub const MODELS: &[ModelPower] = &[
    ModelPower {
        words: &["H200", "NVL"],
        max_power_w: 600,
        source: "https://www.nvidia.com/en-us/data-center/h200/ (H200 NVL: up to 600 W)",
    },
    ModelPower {
        words: &["H200"],
        max_power_w: 700,
        source: "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM: up to 700 W)",
    },
    ModelPower {
        words: &["H100", "NVL"],
        max_power_w: 400,
        source: "https://www.nvidia.com/en-us/data-center/h100/ (H100 NVL: 350-400 W)",
    },
    ModelPower {
        words: &["H100", "PCIE"],
        max_power_w: 350,
        source: "https://www.nvidia.com/en-us/data-center/h100/ (H100 PCIe: 350 W)",
    },
    ModelPower {
        words: &["H100"],
        max_power_w: 700,
        source: "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM: up to 700 W)",
    },
    ModelPower {
        words: &["A100", "PCIE"],
        max_power_w: 250,
        source: "https://www.nvidia.com/en-us/data-center/a100/ (A100 PCIe: 250-300 W)",
    },
    ModelPower {
        words: &["A100"],
        max_power_w: 400,
        source: "https://www.nvidia.com/en-us/data-center/a100/ (A100 SXM: 400 W)",
    },
    ModelPower {
        words: &["L40S"],
        max_power_w: 350,
        source: "https://www.nvidia.com/en-us/data-center/l40s/ (350 W)",
    },
    ModelPower {
        words: &["L40"],
        max_power_w: 300,
        source: "https://www.nvidia.com/en-us/data-center/l40/ (300 W)",
    },
    ModelPower {
        words: &["L4"],
        max_power_w: 72,
        source: "https://www.nvidia.com/en-us/data-center/l4/ (72 W)",
    },
    ModelPower {
        words: &["A10"],
        max_power_w: 150,
        source: "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (150 W)",
    },
    ModelPower {
        words: &["A30"],
        max_power_w: 165,
        source: "https://www.nvidia.com/en-us/data-center/products/a30-gpu/ (165 W)",
    },
    ModelPower {
        words: &["A40"],
        max_power_w: 300,
        source: "https://www.nvidia.com/en-us/data-center/a40/ (300 W)",
    },
    ModelPower {
        words: &["T4"],
        max_power_w: 70,
        source: "https://www.nvidia.com/en-us/data-center/tesla-t4/ (70 W)",
    },
    ModelPower {
        words: &["V100", "PCIE"],
        max_power_w: 250,
        source: "https://www.nvidia.com/en-us/data-center/v100/ (V100 PCIe: 250 W)",
    },
    ModelPower {
        words: &["V100"],
        max_power_w: 300,
        source: "https://www.nvidia.com/en-us/data-center/v100/ (V100 SXM2: 300 W)",
    },
    ModelPower {
        words: &["RTX", "6000", "ADA"],
        max_power_w: 300,
        source: "https://www.nvidia.com/en-us/design-visualization/rtx-6000/ (300 W)",
    },
    ModelPower {
        words: &["RTX", "A6000"],
        max_power_w: 300,
        source: "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/ (300 W)",
    },
];

/// The datasheet entry for a model name as NVML reports it (`NVIDIA H100 80GB HBM3`).
pub fn model(name: &str) -> Option<&'static ModelPower> {
    let words: Vec<String> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_uppercase)
        .collect();
    MODELS
        .iter()
        .find(|m| m.words.iter().all(|w| words.iter().any(|x| x == w)))
}

/// [`IDLE_SHARE_PCT`] of a power, in mW.
fn share_mw(max_mw: u64) -> u32 {
    u32::try_from(max_mw * u64::from(IDLE_SHARE_PCT) / 100).unwrap_or(u32::MAX)
}

/// The conservative fallback: [`IDLE_SHARE_PCT`] of the GPU's reported power limit, or
/// 0 W without one.
pub fn fallback_mw(power_limit_mw: Option<u32>) -> u32 {
    power_limit_mw.map_or(0, |l| share_mw(u64::from(l)))
}

/// The learned baseline from seen-idle evidence, once there is enough of it (mW).
pub fn learned_mw(seen_idle_mj: u64, seen_idle_ms: i64) -> Option<u32> {
    if seen_idle_ms < MIN_SEEN_IDLE_MS {
        return None;
    }
    // mJ / ms = W; × 1000 = mW, rounded to nearest.
    let ms = u128::try_from(seen_idle_ms).ok()?;
    let mw = (u128::from(seen_idle_mj) * 1000 + ms / 2) / ms;
    Some(u32::try_from(mw).unwrap_or(u32::MAX))
}

/// The baseline in force and where it came from.
pub fn resolve(
    configured_mw: Option<u32>,
    seen_idle_mj: u64,
    seen_idle_ms: i64,
    model_name: &str,
    power_limit_mw: Option<u32>,
) -> (u32, IdleSource) {
    if let Some(mw) = configured_mw {
        return (mw, IdleSource::Watts);
    }
    if let Some(mw) = learned_mw(seen_idle_mj, seen_idle_ms) {
        return (mw, IdleSource::Learned);
    }
    if let Some(m) = model(model_name) {
        return (share_mw(u64::from(m.max_power_w) * 1000), IdleSource::Model);
    }
    (fallback_mw(power_limit_mw), IdleSource::Fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_match_whole_words_and_variants_first() {
        let w = |n: &str| model(n).map(|m| m.max_power_w);
        assert_eq!(w("NVIDIA H100 80GB HBM3"), Some(700));
        assert_eq!(w("NVIDIA H100 PCIe"), Some(350));
        assert_eq!(w("NVIDIA H100 NVL"), Some(400));
        assert_eq!(w("NVIDIA H200"), Some(700));
        assert_eq!(w("NVIDIA A100-SXM4-40GB"), Some(400));
        assert_eq!(w("NVIDIA A100-PCIE-40GB"), Some(250));
        assert_eq!(w("NVIDIA A10"), Some(150), "A10 is not A100");
        assert_eq!(w("NVIDIA L4"), Some(72));
        assert_eq!(w("NVIDIA L40S"), Some(350));
        assert_eq!(w("Tesla T4"), Some(70));
        assert_eq!(w("Tesla V100-SXM2-16GB"), Some(300));
        assert_eq!(w("NVIDIA RTX 6000 Ada Generation"), Some(300));
        assert_eq!(w("NVIDIA GeForce RTX 4090"), None);
    }

    #[test]
    fn carried_evidence_keeps_the_most_recent_hour_at_its_average() {
        assert_eq!(carry((0, 0), (60_000, 1_000)), (60_000, 1_000));
        // An hour at 50 W, then a minute at 80 W: 59 min of the old average stay.
        let hour = (50 * 3_600_000, 3_600_000);
        let (mj, ms) = carry(hour, (80 * 60_000, 60_000));
        assert_eq!(ms, 3_600_000);
        assert_eq!(mj, 50 * 3_540_000 + 80 * 60_000);
        assert_eq!(learned_mw(mj, ms), Some(50_500));
    }

    #[test]
    fn learned_beats_model_beats_fallback_and_configured_beats_all() {
        // 60 W for 40 s seen idle.
        let (mj, ms) = (60 * 40_000, 40_000);
        assert_eq!(
            resolve(None, mj, ms, "NVIDIA H100 80GB HBM3", None),
            (60_000, IdleSource::Learned)
        );
        assert_eq!(
            resolve(None, mj, 20_000, "NVIDIA H100 80GB HBM3", None),
            (49_000, IdleSource::Model),
            "too little seen: 7 % of 700 W"
        );
        assert_eq!(
            resolve(None, 0, 0, "Mystery GPU", Some(300_000)),
            (21_000, IdleSource::Fallback)
        );
        assert_eq!(
            resolve(None, 0, 0, "Mystery GPU", None),
            (0, IdleSource::Fallback)
        );
        assert_eq!(
            resolve(Some(45_000), mj, ms, "NVIDIA H100 80GB HBM3", None),
            (45_000, IdleSource::Watts)
        );
    }
}
