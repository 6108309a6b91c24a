//! GPU Performance Monitoring as the simulator plays it: what each workload's kernels do
//! with the SMs, the tensor cores and the memory while they run, summed over a GPU.
//!
//! Every figure hangs off the utilization the simulator already plays: a process's share
//! of the GPU (its SM %, scaled so the shares fit in 100 %) times what its kind of work
//! does per unit of that share ([`Profile`], drawn when the job starts). So SM activity
//! never exceeds utilization, no pipe exceeds SM activity, the GPU's value is the sum of
//! its processes' (capped at 100 %), and a GPU with nothing running reads 0: a real 0, on
//! a product that has GPM. Products without it ([`GpuModel::gpm`]: before Hopper) leave
//! every metric absent.
//!
//! Its draws come from a stream of their own, so adding GPM left every other value of a
//! seeded run as it was.

use super::catalog::GpuModel;
use super::rng::{SimRng, normal};
use super::scenario::JobKind;
use gpufleet_core::GpmMetrics;
use rand::Rng;

/// What one job's kernels do per unit of GPU share, drawn when it starts. Each activity
/// is a fraction (0..1) of its unit's peak while the job has the whole GPU to itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Profile {
    /// SMs with a warp resident: kernels rarely fill every SM.
    sm_active: f64,
    /// Resident warps of the SMs' maximum.
    occupancy: f64,
    /// Any tensor pipe active.
    tensor: f64,
    /// Shares of the tensor activity on the half-precision, integer and double-precision
    /// pipes (together at most 1).
    hmma_share: f64,
    imma_share: f64,
    dfma_share: f64,
    /// DRAM bandwidth used.
    dram: f64,
    /// The FP64, FP32 and FP16 (non-tensor) pipes.
    fp64: f64,
    fp32: f64,
    fp16: f64,
    /// Relative spread of the tensor work from one tick to the next (inference batches
    /// vary; a training step is the same step again).
    wobble: f64,
}

impl Profile {
    /// The constants of a new job of `kind`.
    pub fn draw(rng: &mut SimRng, kind: JobKind) -> Self {
        match kind {
            // Mixed-precision training: matrix multiplies on the HMMA pipe most of the
            // time, optimizer and norms in FP32, no FP64.
            JobKind::Training => Self {
                sm_active: rng.random_range(0.84..0.96),
                occupancy: rng.random_range(0.34..0.62),
                tensor: rng.random_range(0.50..0.73),
                hmma_share: rng.random_range(0.94..0.99),
                imma_share: rng.random_range(0.0..0.004),
                dfma_share: rng.random_range(0.0..0.002),
                dram: rng.random_range(0.45..0.74),
                fp64: rng.random_range(0.0..0.003),
                fp32: rng.random_range(0.12..0.28),
                fp16: rng.random_range(0.30..0.50),
                wobble: 0.04,
            },
            // Serving: smaller batches, memory-bound (DRAM ahead of the tensor cores),
            // some of it quantised to INT8 (IMMA).
            JobKind::Inference => {
                let hmma_share: f64 = rng.random_range(0.70..0.97);
                Self {
                    sm_active: rng.random_range(0.72..0.90),
                    occupancy: rng.random_range(0.22..0.45),
                    tensor: rng.random_range(0.42..0.62),
                    hmma_share,
                    imma_share: (1.0 - hmma_share) * rng.random_range(0.3..0.9),
                    dfma_share: rng.random_range(0.0..0.002),
                    dram: rng.random_range(0.70..0.92),
                    fp64: rng.random_range(0.0..0.002),
                    fp32: rng.random_range(0.10..0.25),
                    fp16: rng.random_range(0.12..0.30),
                    wobble: 0.12,
                }
            }
            // A notebook's cells: small FP32 kernels, the odd FP64 one, hardly any tensor
            // work, few warps.
            JobKind::Notebook => Self {
                sm_active: rng.random_range(0.25..0.55),
                occupancy: rng.random_range(0.08..0.25),
                tensor: rng.random_range(0.0..0.03),
                hmma_share: rng.random_range(0.60..0.95),
                imma_share: 0.0,
                dfma_share: rng.random_range(0.0..0.05),
                dram: rng.random_range(0.10..0.35),
                fp64: rng.random_range(0.0..0.04),
                fp32: rng.random_range(0.10..0.35),
                fp16: rng.random_range(0.0..0.05),
                wobble: 0.08,
            },
        }
    }
}

/// Activities as fractions of the whole GPU (uncapped while processes are added up).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Activity {
    sm_active: f64,
    occupancy: f64,
    tensor: f64,
    hmma: f64,
    imma: f64,
    dfma: f64,
    dram: f64,
    fp64: f64,
    fp32: f64,
    fp16: f64,
}

impl Activity {
    /// What a process of a job with `profile` does this tick in `share` (0..1) of the GPU.
    /// Draws nothing when the process is idle.
    pub fn of(rng: &mut SimRng, profile: &Profile, share: f64) -> Self {
        let share = share.clamp(0.0, 1.0);
        if share <= 0.0 {
            return Self::default();
        }
        // How well this tick's kernels filled the SMs, how much of it was tensor work,
        // how hard it pulled on memory.
        let fill = 1.0 + 0.03 * normal(rng);
        let mix = 1.0 + profile.wobble * normal(rng);
        let mem = 1.0 + 0.05 * normal(rng);
        let sm_active = (share * profile.sm_active * fill).clamp(0.0, share);
        let pipe = |f: f64, jitter: f64| (share * f * jitter).clamp(0.0, sm_active);
        let tensor = pipe(profile.tensor, mix);
        Self {
            sm_active,
            occupancy: pipe(profile.occupancy, fill),
            tensor,
            hmma: tensor * profile.hmma_share,
            imma: tensor * profile.imma_share,
            dfma: tensor * profile.dfma_share,
            dram: (share * profile.dram * mem).clamp(0.0, 1.0),
            fp64: pipe(profile.fp64, fill),
            fp32: pipe(profile.fp32, fill),
            fp16: pipe(profile.fp16, fill),
        }
    }

    /// Adds another process's activity on the same GPU.
    pub fn add(&mut self, other: &Self) {
        self.sm_active += other.sm_active;
        self.occupancy += other.occupancy;
        self.tensor += other.tensor;
        self.hmma += other.hmma;
        self.imma += other.imma;
        self.dfma += other.dfma;
        self.dram += other.dram;
        self.fp64 += other.fp64;
        self.fp32 += other.fp32;
        self.fp16 += other.fp16;
    }

    /// The GPU's GPM reading: every metric absent on a `model` without GPM; otherwise the
    /// summed activities, capped at 100 %, and the link traffic the board measured this
    /// tick (`pcie`: tx, rx; `nvlink`: tx, rx), which GPM counts too.
    pub fn metrics(
        &self,
        model: &GpuModel,
        pcie: (u64, u64),
        nvlink: (Option<u64>, Option<u64>),
    ) -> GpmMetrics {
        if !model.gpm {
            return GpmMetrics::default();
        }
        GpmMetrics {
            sm_active_cpct: cpct(self.sm_active),
            sm_occupancy_cpct: cpct(self.occupancy),
            tensor_active_cpct: cpct(self.tensor),
            tensor_hmma_cpct: cpct(self.hmma),
            tensor_imma_cpct: cpct(self.imma),
            tensor_dfma_cpct: cpct(self.dfma),
            dram_bw_cpct: cpct(self.dram),
            fp64_cpct: cpct(self.fp64),
            fp32_cpct: cpct(self.fp32),
            fp16_cpct: cpct(self.fp16),
            pcie_tx_bps: Some(pcie.0),
            pcie_rx_bps: Some(pcie.1),
            nvlink_tx_bps: nvlink.0,
            nvlink_rx_bps: nvlink.1,
        }
    }
}

/// A fraction as hundredths of a percent, capped at 100 %. Rounding is monotonic, so an
/// order between fractions (tensor ≤ SM activity) survives it.
fn cpct(fraction: f64) -> Option<u32> {
    Some((fraction.clamp(0.0, 1.0) * 10_000.0).round() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use rand::SeedableRng;

    #[test]
    fn a_process_never_does_more_than_its_share_allows() {
        let mut rng = SimRng::seed_from_u64(11);
        for kind in [JobKind::Training, JobKind::Inference, JobKind::Notebook] {
            for _ in 0..200 {
                let p = Profile::draw(&mut rng, kind);
                let share: f64 = rng.random_range(0.0..1.0);
                let a = Activity::of(&mut rng, &p, share);
                assert!(a.sm_active <= share, "{kind:?}: {a:?}");
                for pipe in [a.occupancy, a.tensor, a.fp64, a.fp32, a.fp16] {
                    assert!((0.0..=a.sm_active).contains(&pipe), "{kind:?}: {a:?}");
                }
                assert!(
                    a.hmma + a.imma + a.dfma <= a.tensor + 1e-12,
                    "{kind:?}: {a:?}"
                );
                assert!((0.0..=1.0).contains(&a.dram), "{kind:?}: {a:?}");
            }
        }
        let p = Profile::draw(&mut rng, JobKind::Training);
        assert_eq!(Activity::of(&mut rng, &p, 0.0), Activity::default());
    }

    #[test]
    fn sums_are_capped_and_products_without_gpm_report_nothing() {
        let full = Activity {
            sm_active: 0.7,
            tensor: 0.6,
            dram: 0.9,
            ..Activity::default()
        };
        let mut sum = full;
        sum.add(&full);
        let h100 = catalog::by_key("h100-sxm").expect("in the catalog");
        let m = sum.metrics(h100, (1024, 2048), (Some(5), Some(6)));
        assert_eq!(m.sm_active_cpct, Some(10_000));
        assert_eq!(m.tensor_active_cpct, Some(10_000));
        assert_eq!(m.fp64_cpct, Some(0), "a real 0 on a GPU with GPM");
        assert_eq!((m.pcie_tx_bps, m.pcie_rx_bps), (Some(1024), Some(2048)));
        assert_eq!((m.nvlink_tx_bps, m.nvlink_rx_bps), (Some(5), Some(6)));
        let a100 = catalog::by_key("a100-sxm4-40gb").expect("in the catalog");
        assert!(
            full.metrics(a100, (1024, 2048), (Some(5), Some(6)))
                .is_empty()
        );
        assert_eq!(cpct(0.123_44), Some(1234));
        assert_eq!(cpct(-0.5), Some(0));
    }
}
