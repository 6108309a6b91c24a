//! The simulator's random source and the draws every part of it shares (a leaf: the
//! workloads, the GPUs and GPM all draw from it).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The simulator's random source (seeded; never the OS's).
pub(super) type SimRng = ChaCha8Rng;

/// A standard normal draw (Box–Muller), clipped to ±4 so no tick is absurd.
pub(super) fn normal(rng: &mut SimRng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()).clamp(-4.0, 4.0)
}

/// Whether an event of `per_hour` rate happens within `dt_ms` (Poisson, first order).
pub(super) fn chance(rng: &mut SimRng, per_hour: f64, dt_ms: i64) -> bool {
    let p = (per_hour * dt_ms as f64 / 3_600_000.0).clamp(0.0, 1.0);
    rng.random_bool(p)
}
