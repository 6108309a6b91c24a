//! The raw tiers (a node's host rows, a GPU's process ticks and samples): their
//! descriptions in [`series`], what one packed value spans, and their values decoded and
//! checked to lie in that span. A leaf of packing: the packer, packing on arrival and the
//! held minutes read values through it.

use super::HostRow;
use super::StoreError;
use super::backend::Get;
use super::packed::{self, PackError, process::ProcessTick};
use super::rollup::kinds::RollupKind;
use super::series::{self, Series};
use gpufleet_core::times::{HOUR_MS, MINUTE_MS, hour_of, minute_of};
use gpufleet_core::{GpuSample, UnixMs};

/// The packed tiers: which tables, and how a lock on one series is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Tier {
    /// A node's host rows.
    Host,
    /// A GPU's process ticks.
    Process,
    /// A GPU's samples.
    Gpu,
}

impl Tier {
    /// The tier's description ([`series`]).
    pub(super) fn series(self) -> &'static Series {
        match self {
            Tier::Host => &series::HOST,
            Tier::Process => &series::PROCESS,
            Tier::Gpu => &series::GPU,
        }
    }

    pub(super) fn packed(self) -> &'static str {
        self.series().packed
    }

    pub(super) fn rows(self) -> &'static str {
        self.series().rows
    }

    pub(super) fn id(self) -> &'static str {
        self.series().id
    }

    /// The series whose raw horizon bounds this tier's values.
    pub(crate) fn kind(self) -> RollupKind {
        match self {
            Tier::Host => RollupKind::Host,
            Tier::Process | Tier::Gpu => RollupKind::Gpu,
        }
    }
}

pub(super) fn corrupt(tier: Tier, id: i64, minute: UnixMs) -> impl FnOnce(PackError) -> StoreError {
    tier.series().corrupt(id, minute)
}

fn outside(tier: Tier, id: i64, span: Span) -> StoreError {
    (tier.series()).unreadable(
        id,
        span.start,
        &format!("a row outside its {} ms", span.len),
    )
}

/// Where a packed value starts (`minute_ms`) and how long it is (`span_ms`): a minute, or
/// an hour that holds nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) start: UnixMs,
    pub(super) len: i64,
}

impl Span {
    pub(super) fn minute(start: UnixMs) -> Span {
        Span {
            start,
            len: MINUTE_MS,
        }
    }

    /// The span of a packed value's row, checked: a minute on a minute boundary or an
    /// hour on an hour boundary.
    pub(crate) fn of<R: Get>(tier: Tier, id: i64, row: &R) -> Result<Span, StoreError> {
        let span = Span {
            start: row.get("minute_ms")?,
            len: row.get("span_ms")?,
        };
        let aligned = match span.len {
            MINUTE_MS => minute_of(span.start) == span.start,
            HOUR_MS => hour_of(span.start) == span.start,
            _ => false,
        };
        if !aligned {
            return Err(StoreError::Unreadable(format!(
                "{} of {id}: a value at {} spans {} ms",
                tier.packed(),
                span.start,
                span.len
            )));
        }
        Ok(span)
    }

    pub(crate) fn end(self) -> UnixMs {
        self.start.saturating_add(self.len)
    }

    pub(crate) fn contains(self, t: UnixMs) -> bool {
        (self.start..self.end()).contains(&t)
    }
}

/// The host rows of a packed value.
pub(crate) fn unpack_host(node: i64, span: Span, value: &[u8]) -> Result<Vec<HostRow>, StoreError> {
    let rows = packed::host::unpack(value).map_err(corrupt(Tier::Host, node, span.start))?;
    if rows.iter().any(|r| !span.contains(r.time_ms)) {
        return Err(outside(Tier::Host, node, span));
    }
    Ok(rows)
}

/// The process ticks of a packed value.
pub(super) fn unpack_process(
    gpu: i64,
    span: Span,
    value: &[u8],
) -> Result<Vec<ProcessTick>, StoreError> {
    let ticks = packed::process::unpack(value).map_err(corrupt(Tier::Process, gpu, span.start))?;
    if ticks.iter().any(|t| !span.contains(t.ts_ms)) {
        return Err(outside(Tier::Process, gpu, span));
    }
    Ok(ticks)
}

/// The samples of a packed value (without their UUID).
pub(super) fn unpack_gpu(
    gpu: i64,
    span: Span,
    value: &[u8],
) -> Result<Vec<(UnixMs, GpuSample)>, StoreError> {
    let samples = packed::gpu::unpack(value).map_err(corrupt(Tier::Gpu, gpu, span.start))?;
    if samples.iter().any(|(t, _)| !span.contains(*t)) {
        return Err(outside(Tier::Gpu, gpu, span));
    }
    Ok(samples)
}
