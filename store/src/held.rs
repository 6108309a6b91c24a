//! The minutes a write holds: a closed GPU minute's packed values that the write falls in,
//! decoded and left packed for packing on arrival to add to. Reopening holds them; arrival
//! fills and stores them.

use super::StoreError;
use super::packed::process::ProcessTick;
use super::tiers::{Span, Tier, unpack_gpu, unpack_process};
use gpufleet_core::{GpuSample, UnixMs};
use std::collections::BTreeMap;

/// A GPU's packed minute that a write falls in and that stays packed (a closed minute):
/// its contents, its value as stored, and whether that value is still in the table (a
/// minute split out of an hour-long value is not).
#[derive(Debug)]
pub(crate) struct HeldMinute<T> {
    pub(crate) items: Vec<T>,
    pub(crate) value: Vec<u8>,
    pub(crate) stored: bool,
}

/// The held minutes of a write, by (GPU, minute): process ticks and GPU samples.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) process: BTreeMap<(i64, UnixMs), HeldMinute<ProcessTick>>,
    pub(crate) gpu: BTreeMap<(i64, UnixMs), HeldMinute<(UnixMs, GpuSample)>>,
}

impl Held {
    /// Holds GPU `gpu`'s minute value of `tier` at `span`, decoded.
    pub(super) fn hold(
        &mut self,
        tier: Tier,
        gpu: i64,
        span: Span,
        value: Vec<u8>,
        stored: bool,
    ) -> Result<(), StoreError> {
        let key = (gpu, span.start);
        match tier {
            Tier::Process => {
                let items = unpack_process(gpu, span, &value)?;
                self.process.insert(
                    key,
                    HeldMinute {
                        items,
                        value,
                        stored,
                    },
                );
            }
            Tier::Gpu => {
                let items = unpack_gpu(gpu, span, &value)?;
                self.gpu.insert(
                    key,
                    HeldMinute {
                        items,
                        value,
                        stored,
                    },
                );
            }
            Tier::Host => {
                return Err(StoreError::Corrupt("a host minute cannot be held".into()));
            }
        }
        Ok(())
    }

    /// The GPU samples stored in held minutes, by (GPU, time): what a conflict check
    /// compares a write's samples with, beside the rows.
    pub(crate) fn gpu_samples(&self) -> impl Iterator<Item = ((i64, UnixMs), &GpuSample)> {
        (self.gpu.iter()).flat_map(|((gpu, _), h)| h.items.iter().map(|(t, s)| ((*gpu, *t), s)))
    }
}
