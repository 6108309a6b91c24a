//! The health judge: from a GPU's signals (its newest sample, temperature thresholds,
//! health counters, recent events) to a state (ok / warning / critical) and the reasons
//! behind it, each with a summary and what to do. Pure: the caller gathers the signals
//! ([`GpuSignals`]) and the time; nothing here reads a clock or the live state.
//!
//! The rules, and why:
//! - **Xid** (see [`crate::health::xid`]): a catalogued critical Xid keeps the GPU critical
//!   for [`HealthPolicy::critical_xid_ms`] (24 h) or until a reset: the GPU reported
//!   recovered, or a new Hello from its node (agent restart, driver reload, reboot); a
//!   warning Xid makes it warning for [`HealthPolicy::warning_xid_ms`]; an informational
//!   one (13, 31, 43, 45: the application's doing) is listed for
//!   [`HealthPolicy::info_xid_ms`] without changing the state. 48 and 95 (uncontained
//!   ECC) are critical, 94 (contained ECC) a warning.
//! - **GPU lost** (fell off the bus) is critical until it is reported recovered, its node
//!   says Hello again, or it sends a sample with real readings (power or temperature)
//!   newer than the loss: a rebooted node's agent never reports a recovery.
//! - **Double-bit ECC** events are critical like Xid 48, a warning when the driver logged
//!   Xid 94 (contained) next to it and no 48 / 95; uncorrectable errors counted
//!   since the driver loaded without such an event (contained errors) are a warning.
//! - **Row remapping**: a pending remap is a warning (the GPU needs a reset for it to take
//!   effect), a failed one critical (the memory cannot be repaired: service). A page
//!   retirement pending is a warning (needs a reboot).
//! - **Temperature** against the GPU's own thresholds (absent thresholds judge nothing):
//!   within [`HealthPolicy::temp_margin_c`] of the slowdown threshold, or at or over it
//!   (the GPU protects itself by slowing down), is a warning; at or over slowdown and
//!   within the margin of shutdown (at most half the slowdown-shutdown gap: 89 and 92 °C
//!   on A100 / H100) critical; over the maximum operating
//!   temperature a warning; memory at its maximum critical, near it a warning.
//! - **Clock-event (throttle) reasons**: thermal slowdown (software or hardware), an
//!   unexplained hardware slowdown and the hardware power brake are warnings: the GPU runs
//!   slower than it should for a physical reason. Power capping, idle, application clocks,
//!   sync boost and display clocks are what a healthy GPU does and only listed (power cap)
//!   or ignored.
//! - **Persistence mode off** is listed, not a warning: it costs start-up latency and
//!   forgets settings between jobs, it does not make the GPU unhealthy.
//! - **PCIe replays / NVLink errors rising** over [`HealthPolicy::counter_window_ms`] are
//!   warnings: the link is retrying, a precursor of Xid 79 / 74.
//!
//! A node ([`judge_node`]) is as bad as its worst GPU, and critical when offline (no
//! sample for `--offline-after`: nothing about it is known now), warning when stale.

use crate::health::recent::RecentEvents;
use crate::health::xid::{self, Severity};
use crate::live::status::NodeStatus;
use gpufleet_core::times::format_time;
use gpufleet_core::{EventKind, GpuSample, UnixMs};
// The judged health as the API shows it: the API's own types, shared with its clients
// (`HealthState`'s names and order, and `From<Severity>`, live with it).
pub use gpufleet_api::{GpuHealth, HealthReason, HealthState, NodeHealth};

/// The judge's knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// How long a critical Xid (or a double-bit ECC event) keeps the GPU critical, unless
    /// the GPU is reported recovered after it.
    pub critical_xid_ms: i64,
    /// How long a warning Xid keeps the GPU warning.
    pub warning_xid_ms: i64,
    /// How long an informational Xid is listed.
    pub info_xid_ms: i64,
    /// "Near" a temperature threshold: within this many °C below it.
    pub temp_margin_c: u32,
    /// The window over which PCIe replays and NVLink errors must not rise.
    pub counter_window_ms: i64,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy {
            critical_xid_ms: 24 * 3_600_000,
            warning_xid_ms: 6 * 3_600_000,
            info_xid_ms: 3_600_000,
            temp_margin_c: 5,
            counter_window_ms: crate::health::recent::COUNTER_WINDOW_MS,
        }
    }
}

/// A GPU's temperature thresholds (NVML's, per GPU); absent ones judge nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TempThresholds {
    pub slowdown_c: Option<u32>,
    pub shutdown_c: Option<u32>,
    pub gpu_max_c: Option<u32>,
    pub mem_max_c: Option<u32>,
}

/// A GPU's health counters and flags as the judge needs them (absent: unknown).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthFlags {
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows_pending: Option<bool>,
    pub remapped_rows_failed: Option<bool>,
    pub persistence_mode: Option<bool>,
    /// How much the PCIe replay counter rose over the counter window, and since when.
    pub pcie_replay_rise: Option<(u64, Option<UnixMs>)>,
    /// How much the NVLink error counters (CRC, replay, recovery) rose, and since when.
    pub nvlink_error_rise: Option<(u64, Option<UnixMs>)>,
}

/// Everything the judge looks at for one GPU.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuSignals<'a> {
    /// The newest sample (absent: none received yet).
    pub sample: Option<&'a GpuSample>,
    pub thresholds: TempThresholds,
    pub flags: HealthFlags,
    pub events: Option<&'a RecentEvents>,
}

/// NVML clock-event (throttle) reason bits and their names, in bit order.
pub const THROTTLE_BITS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
];

/// The names of the reasons set in an NVML clock-event reason mask, in bit order; any
/// bit NVML may add later is `other`.
pub fn decode_throttle(mask: u64) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = THROTTLE_BITS
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|&(_, name)| name)
        .collect();
    let known: u64 = THROTTLE_BITS.iter().map(|(b, _)| b).sum();
    if mask & !known != 0 {
        out.push("other");
    }
    out
}

fn reason(
    code: impl Into<String>,
    severity: HealthState,
    summary: String,
    action: &str,
    since_ms: Option<UnixMs>,
) -> HealthReason {
    HealthReason {
        code: code.into(),
        severity,
        summary,
        action: action.to_owned(),
        since_ms,
    }
}

/// Judges one GPU at `now_ms`.
pub fn judge_gpu(s: &GpuSignals<'_>, policy: &HealthPolicy, now_ms: UnixMs) -> GpuHealth {
    let mut reasons = Vec::new();
    if let Some(events) = s.events {
        event_reasons(events, policy, now_ms, s.sample, &mut reasons);
    } else if let Some(n) = s.sample.and_then(|x| x.ecc_uncorrected_volatile) {
        uncorrected(n, &mut reasons);
    }
    flag_reasons(&s.flags, &mut reasons);
    if let Some(sample) = s.sample {
        temp_reasons(sample, &s.thresholds, policy.temp_margin_c, &mut reasons);
        if let Some(mask) = sample.throttle_reasons {
            throttle_reasons(mask, &mut reasons);
        }
    }
    finish(reasons)
}

fn finish(mut reasons: Vec<HealthReason>) -> GpuHealth {
    // Worst first; ties by code so the order is stable.
    reasons.sort_by(|a, b| b.severity.cmp(&a.severity).then(a.code.cmp(&b.code)));
    GpuHealth {
        state: reasons.iter().map(|r| r.severity).max().unwrap_or_default(),
        reasons,
    }
}

fn event_reasons(
    events: &RecentEvents,
    policy: &HealthPolicy,
    now_ms: UnixMs,
    sample: Option<&GpuSample>,
    out: &mut Vec<HealthReason>,
) {
    if let Some(since) = events.lost_since() {
        out.push(reason(
            "gpu_lost",
            HealthState::Critical,
            format!("the GPU stopped answering (lost since {})", format_time(since)),
            "Drain the node and reboot it; check power, cooling and the PCIe slot. Service the GPU if it happens again.",
            Some(since),
        ));
    }
    // Errors before a reset (a reported recovery, or a Hello: agent restart, driver
    // reload, reboot) were cleared by it.
    let reset = events.reset_at().unwrap_or(UnixMs::MIN);
    let mut dbe = false;
    for e in events.entries() {
        if e.last_ms <= reset {
            continue;
        }
        let age = now_ms.saturating_sub(e.last_ms);
        match e.kind {
            EventKind::Xid => {
                let Some(code) = e.code else { continue };
                let info = xid::explain(code);
                let window = match info.severity {
                    Severity::Critical => policy.critical_xid_ms,
                    Severity::Warning => policy.warning_xid_ms,
                    Severity::Info => policy.info_xid_ms,
                };
                if age > window {
                    continue;
                }
                let times = if e.count > 1 {
                    format!(", {} times", e.count)
                } else {
                    String::new()
                };
                out.push(reason(
                    format!("xid_{code}"),
                    info.severity.into(),
                    format!(
                        "Xid {code}: {} (last at {}{times})",
                        info.name,
                        format_time(e.last_ms)
                    ),
                    &info.action,
                    Some(e.first_ms),
                ));
            }
            EventKind::EccDoubleBit if age <= policy.critical_xid_ms => {
                dbe = true;
                let contained = dbe_contained(events, e.last_ms, reset);
                let (severity, what, code) = if contained {
                    (
                        HealthState::Warning,
                        "contained: the affected process was ended",
                        94,
                    )
                } else {
                    (HealthState::Critical, "uncontained", 48)
                };
                out.push(reason(
                    "ecc_dbe",
                    severity,
                    format!(
                        "double-bit (uncorrectable) ECC error in GPU memory, {what} (last at {})",
                        format_time(e.last_ms)
                    ),
                    &xid::explain(code).action,
                    Some(e.first_ms),
                ));
            }
            _ => {}
        }
    }
    if !dbe && let Some(n) = sample.and_then(|x| x.ecc_uncorrected_volatile) {
        uncorrected(n, out);
    }
}

/// How far apart a double-bit ECC event and the Xid the driver logs for the same error
/// may be.
const DBE_XID_PAIRING_MS: i64 = 60_000;

/// Whether the double-bit ECC error last seen at `dbe_ms` was contained: an Xid 94
/// (contained ECC) was logged next to it and no Xid 48 / 95 (uncontained) was. Without
/// any of them it is taken as uncontained (critical), as older drivers log only Xid 48.
fn dbe_contained(events: &RecentEvents, dbe_ms: UnixMs, reset: UnixMs) -> bool {
    let near = |code: u64| {
        events.entries().iter().any(|x| {
            x.kind == EventKind::Xid
                && x.code == Some(code)
                && x.last_ms > reset
                && x.last_ms.abs_diff(dbe_ms) <= DBE_XID_PAIRING_MS.unsigned_abs()
        })
    };
    near(94) && !near(48) && !near(95)
}

fn uncorrected(n: u64, out: &mut Vec<HealthReason>) {
    if n > 0 {
        out.push(reason(
            "ecc_uncorrected",
            HealthState::Warning,
            format!("{n} uncorrectable ECC errors since the driver loaded"),
            "Drain the GPU when convenient and reset it so the affected memory is remapped; service it if the count keeps growing.",
            None,
        ));
    }
}

fn flag_reasons(f: &HealthFlags, out: &mut Vec<HealthReason>) {
    if f.remapped_rows_failed == Some(true) {
        out.push(reason(
            "row_remap_failed",
            HealthState::Critical,
            "a memory row remap failed: the GPU's memory cannot be repaired in the field".into(),
            &xid::explain(64).action,
            None,
        ));
    }
    if f.remapped_rows_pending == Some(true) {
        out.push(reason(
            "row_remap_pending",
            HealthState::Warning,
            "a memory row remap is pending: it takes effect at the next GPU reset".into(),
            "Drain the GPU and reset it (nvidia-smi -r, or reboot the node) so the remap takes effect.",
            None,
        ));
    }
    if f.retired_pages_pending == Some(true) {
        out.push(reason(
            "retired_pages_pending",
            HealthState::Warning,
            "a memory page retirement is pending: it takes effect at the next reboot".into(),
            "Drain the node and reboot it (or reload the driver) so the page is retired.",
            None,
        ));
    }
    if f.persistence_mode == Some(false) {
        out.push(reason(
            "persistence_off",
            HealthState::Ok,
            "persistence mode is off: the driver unloads between jobs (slower starts, settings lost)".into(),
            "Run nvidia-persistenced (or nvidia-smi -pm 1) on the node.",
            None,
        ));
    }
    if let Some((n, since)) = f.pcie_replay_rise.filter(|r| r.0 > 0) {
        out.push(reason(
            "pcie_replays",
            HealthState::Warning,
            format!("{n} PCIe replays in the last hour: the link is retrying transfers"),
            "Check the PCIe link (width, speed, AER messages in dmesg); reseat the GPU or riser if it keeps rising.",
            since,
        ));
    }
    if let Some((n, since)) = f.nvlink_error_rise.filter(|r| r.0 > 0) {
        out.push(reason(
            "nvlink_errors",
            HealthState::Warning,
            format!("{n} NVLink errors (CRC, replay, recovery) in the last hour"),
            "Check the NVLink error counters per link (nvidia-smi nvlink -e); service the link or GPU if one link keeps erring.",
            since,
        ));
    }
}

fn temp_reasons(s: &GpuSample, t: &TempThresholds, margin: u32, out: &mut Vec<HealthReason>) {
    const COOL: &str = "Check the node's cooling (fans, airflow, inlet temperature) and the GPU's load; the GPU slows itself down at the slowdown threshold.";
    if let Some(temp) = s.temp_gpu_c {
        let near = |limit: u32| temp.saturating_add(margin) >= limit;
        // Slowdown and shutdown can be a few °C apart (A100 / H100: 89 and 92 °C): near
        // shutdown is judged only at or over slowdown, and within half the gap.
        let shutdown_margin = match (t.slowdown_c, t.shutdown_c) {
            (Some(slow), Some(shut)) => margin.min(shut.saturating_sub(slow) / 2),
            _ => margin,
        };
        let near_shutdown = |limit: u32| {
            temp.saturating_add(shutdown_margin) >= limit
                && t.slowdown_c.is_none_or(|slow| temp >= slow)
        };
        if let Some(shutdown) = t.shutdown_c.filter(|&l| near_shutdown(l)) {
            out.push(reason(
                "temp_near_shutdown",
                HealthState::Critical,
                format!("GPU at {temp} °C, shutdown at {shutdown} °C"),
                "Drain the GPU now and fix the cooling: at the shutdown threshold the GPU turns itself off.",
                None,
            ));
        } else if let Some(slow) = t.slowdown_c.filter(|&l| temp >= l) {
            // The GPU protects itself by slowing down: degraded, not yet in danger.
            out.push(reason(
                "temp_at_slowdown",
                HealthState::Warning,
                format!("GPU at {temp} °C, at or over its slowdown threshold ({slow} °C): clocks are cut"),
                COOL,
                None,
            ));
        } else if let Some(slow) = t.slowdown_c.filter(|&l| near(l)) {
            out.push(reason(
                "temp_near_slowdown",
                HealthState::Warning,
                format!(
                    "GPU at {temp} °C, within {margin} °C of its slowdown threshold ({slow} °C)"
                ),
                COOL,
                None,
            ));
        } else if let Some(max) = t.gpu_max_c.filter(|&l| temp >= l) {
            out.push(reason(
                "temp_over_max",
                HealthState::Warning,
                format!("GPU at {temp} °C, over its maximum operating temperature ({max} °C)"),
                COOL,
                None,
            ));
        }
    }
    if let (Some(temp), Some(max)) = (s.temp_mem_c, t.mem_max_c) {
        if temp >= max {
            out.push(reason(
                "temp_mem_at_max",
                HealthState::Critical,
                format!("GPU memory at {temp} °C, at or over its maximum ({max} °C)"),
                COOL,
                None,
            ));
        } else if temp.saturating_add(margin) >= max {
            out.push(reason(
                "temp_mem_near_max",
                HealthState::Warning,
                format!("GPU memory at {temp} °C, within {margin} °C of its maximum ({max} °C)"),
                COOL,
                None,
            ));
        }
    }
}

fn throttle_reasons(mask: u64, out: &mut Vec<HealthReason>) {
    let has = |bit: u64| mask & bit != 0;
    if has(0x20) || has(0x40) {
        let which = match (has(0x20), has(0x40)) {
            (true, true) => "software and hardware",
            (false, true) => "hardware",
            _ => "software",
        };
        out.push(reason(
            "throttle_thermal",
            HealthState::Warning,
            format!("clocks reduced by {which} thermal slowdown"),
            "Check the node's cooling (fans, airflow, inlet temperature); the GPU is running slower than it can.",
            None,
        ));
    }
    if has(0x80) {
        out.push(reason(
            "throttle_power_brake",
            HealthState::Warning,
            "clocks reduced by the hardware power brake (an external signal, e.g. from the power supply)".into(),
            "Check the node's power supplies and power-brake signalling with the platform's BMC.",
            None,
        ));
    }
    // Hardware slowdown is also set by thermal or power-brake slowdown; alone, its cause
    // is outside what NVML says.
    if has(0x8) && !has(0x40) && !has(0x80) {
        out.push(reason(
            "throttle_hw_slowdown",
            HealthState::Warning,
            "clocks reduced by hardware slowdown (temperature, power brake or an unsafe power draw)".into(),
            "Check the node's cooling and power delivery; look at the BMC's event log.",
            None,
        ));
    }
    if has(0x4) {
        out.push(reason(
            "throttle_power_cap",
            HealthState::Ok,
            "clocks held at the power limit (normal under full load)".into(),
            "Nothing, unless the power limit was set lower than intended.",
            None,
        ));
    }
}

/// Judges a node from its status and its GPUs' health.
pub fn judge_node(status: NodeStatus, gpus: &[&GpuHealth], offline_after: &str) -> NodeHealth {
    let mut reasons = Vec::new();
    match status {
        NodeStatus::Online => {}
        NodeStatus::Stale => reasons.push(reason(
            "node_stale",
            HealthState::Warning,
            "no fresh sample from the node: its agent is late or its link is slow".into(),
            "Check the agent on the node (systemctl status gpufleet-agent) and its network path to the collector.",
            None,
        )),
        NodeStatus::Offline => reasons.push(reason(
            "node_offline",
            HealthState::Critical,
            format!("no sample from the node for more than {offline_after}: its GPUs' state is unknown"),
            "Check that the node is up and its agent runs and can reach the collector.",
            None,
        )),
    }
    let count = |s: HealthState| gpus.iter().filter(|g| g.state == s).count();
    let worst = gpus.iter().map(|g| g.state).max().unwrap_or_default();
    NodeHealth {
        state: reasons
            .iter()
            .map(|r| r.severity)
            .max()
            .unwrap_or_default()
            .max(worst),
        reasons,
        gpus_warning: count(HealthState::Warning),
        gpus_critical: count(HealthState::Critical),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufleet_core::Event;
    use proptest::prelude::*;

    const NOW: UnixMs = 1_800_000_000_000;
    const H: i64 = 3_600_000;

    fn events(list: &[(i64, EventKind, Option<u64>)]) -> RecentEvents {
        let mut r = RecentEvents::default();
        for &(t, kind, code) in list {
            r.note(&Event {
                time_ms: t,
                gpu_uuid: "GPU-1".into(),
                kind,
                code,
                detail: String::new(),
            });
        }
        r
    }

    fn judge_events(r: &RecentEvents) -> GpuHealth {
        let s = GpuSignals {
            events: Some(r),
            ..Default::default()
        };
        judge_gpu(&s, &HealthPolicy::default(), NOW)
    }

    fn codes(h: &GpuHealth) -> Vec<(&str, HealthState)> {
        h.reasons
            .iter()
            .map(|r| (r.code.as_str(), r.severity))
            .collect()
    }

    #[test]
    fn a_healthy_gpu_is_ok_with_no_reasons() {
        let sample = GpuSample {
            temp_gpu_c: Some(60),
            throttle_reasons: Some(0x1),
            ecc_uncorrected_volatile: Some(0),
            ..Default::default()
        };
        let s = GpuSignals {
            sample: Some(&sample),
            thresholds: TempThresholds {
                slowdown_c: Some(90),
                shutdown_c: Some(95),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            judge_gpu(&s, &HealthPolicy::default(), NOW),
            GpuHealth::default()
        );
    }

    #[test]
    fn xids_count_by_severity_within_their_windows() {
        use EventKind::Xid;
        let h = judge_events(&events(&[
            (NOW - 23 * H, Xid, Some(79)),
            (NOW - 2 * H, Xid, Some(13)),
            (NOW - 5 * H, Xid, Some(94)),
        ]));
        assert_eq!(h.state, HealthState::Critical);
        assert_eq!(
            codes(&h),
            [
                ("xid_79", HealthState::Critical),
                ("xid_94", HealthState::Warning)
            ],
            "the Xid 13 is older than its hour"
        );
        assert!(h.reasons[0].summary.contains("fallen off the bus"));
        assert_eq!(h.reasons[0].since_ms, Some(NOW - 23 * H));
        let old = judge_events(&events(&[(NOW - 25 * H, Xid, Some(79))]));
        assert_eq!(old.state, HealthState::Ok, "a day later");
        let info = judge_events(&events(&[(NOW - 60_000, Xid, Some(43))]));
        assert_eq!(codes(&info), [("xid_43", HealthState::Ok)], "listed only");
        let unknown = judge_events(&events(&[(NOW - 60_000, Xid, Some(999))]));
        assert_eq!(unknown.state, HealthState::Warning);
    }

    #[test]
    fn a_hello_after_a_critical_xid_resets_it_and_ends_lost() {
        use EventKind::*;
        let mut r = events(&[(NOW - H, Xid, Some(79)), (NOW - H, GpuLost, None)]);
        r.note_reset(NOW - 2 * H);
        assert_eq!(
            judge_events(&r).state,
            HealthState::Critical,
            "Hello before"
        );
        r.note_reset(NOW - H + 1);
        assert_eq!(
            judge_events(&r),
            GpuHealth::default(),
            "agent restarted after"
        );
        r.note(&Event {
            time_ms: NOW - 60_000,
            gpu_uuid: "GPU-1".into(),
            kind: Xid,
            code: Some(48),
            detail: String::new(),
        });
        assert_eq!(
            codes(&judge_events(&r)),
            [("xid_48", HealthState::Critical)]
        );
    }

    #[test]
    fn ecc_xids_48_95_are_critical_94_is_a_warning() {
        use EventKind::Xid;
        for (code, state) in [
            (48, HealthState::Critical),
            (95, HealthState::Critical),
            (94, HealthState::Warning),
        ] {
            let h = judge_events(&events(&[(NOW - H, Xid, Some(code))]));
            assert_eq!(h.state, state, "Xid {code}");
        }
    }

    #[test]
    fn a_recovery_clears_what_came_before_it_and_ends_lost() {
        use EventKind::*;
        let lost = judge_events(&events(&[
            (NOW - 3 * H, Xid, Some(79)),
            (NOW - 3 * H, GpuLost, None),
        ]));
        assert_eq!(
            codes(&lost),
            [
                ("gpu_lost", HealthState::Critical),
                ("xid_79", HealthState::Critical)
            ]
        );
        let back = judge_events(&events(&[
            (NOW - 3 * H, Xid, Some(79)),
            (NOW - 3 * H, GpuLost, None),
            (NOW - H, GpuRecovered, None),
            (NOW - 60_000, Xid, Some(94)),
        ]));
        assert_eq!(codes(&back), [("xid_94", HealthState::Warning)]);
    }

    #[test]
    fn double_bit_events_are_critical_and_counted_errors_a_warning() {
        let sample = GpuSample {
            ecc_uncorrected_volatile: Some(3),
            ..Default::default()
        };
        let r = events(&[(NOW - H, EventKind::EccDoubleBit, None)]);
        let s = GpuSignals {
            sample: Some(&sample),
            events: Some(&r),
            ..Default::default()
        };
        let h = judge_gpu(&s, &HealthPolicy::default(), NOW);
        assert_eq!(codes(&h), [("ecc_dbe", HealthState::Critical)]);
        // The driver's Xid next to the event says whether the error was contained.
        let dbe_with = |code: u64, at: i64| {
            let r = events(&[
                (NOW - H, EventKind::EccDoubleBit, None),
                (NOW - H + at, EventKind::Xid, Some(code)),
            ]);
            let s = GpuSignals {
                sample: Some(&sample),
                events: Some(&r),
                ..Default::default()
            };
            judge_gpu(&s, &HealthPolicy::default(), NOW)
                .reasons
                .iter()
                .find(|x| x.code == "ecc_dbe")
                .map(|x| x.severity)
        };
        assert_eq!(dbe_with(94, 10), Some(HealthState::Warning), "contained");
        assert_eq!(dbe_with(48, 10), Some(HealthState::Critical));
        assert_eq!(dbe_with(95, -10), Some(HealthState::Critical));
        assert_eq!(
            dbe_with(94, 10 * 60_000),
            Some(HealthState::Critical),
            "an Xid 94 long after is another error"
        );
        let s = GpuSignals {
            sample: Some(&sample),
            ..Default::default()
        };
        let h = judge_gpu(&s, &HealthPolicy::default(), NOW);
        assert_eq!(codes(&h), [("ecc_uncorrected", HealthState::Warning)]);
        assert!(h.reasons[0].summary.starts_with("3 "));
    }

    #[test]
    fn remaps_retirements_persistence_and_links() {
        let s = GpuSignals {
            flags: HealthFlags {
                retired_pages_pending: Some(true),
                remapped_rows_pending: Some(true),
                remapped_rows_failed: Some(false),
                persistence_mode: Some(false),
                pcie_replay_rise: Some((0, None)),
                nvlink_error_rise: Some((4, Some(NOW - H))),
            },
            ..Default::default()
        };
        let h = judge_gpu(&s, &HealthPolicy::default(), NOW);
        assert_eq!(
            codes(&h),
            [
                ("nvlink_errors", HealthState::Warning),
                ("retired_pages_pending", HealthState::Warning),
                ("row_remap_pending", HealthState::Warning),
                ("persistence_off", HealthState::Ok),
            ]
        );
        let failed = GpuSignals {
            flags: HealthFlags {
                remapped_rows_failed: Some(true),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            judge_gpu(&failed, &HealthPolicy::default(), NOW).state,
            HealthState::Critical
        );
    }

    fn temps(gpu: u32, mem: Option<u32>) -> Vec<(String, HealthState)> {
        let sample = GpuSample {
            temp_gpu_c: Some(gpu),
            temp_mem_c: mem,
            ..Default::default()
        };
        let s = GpuSignals {
            sample: Some(&sample),
            thresholds: TempThresholds {
                slowdown_c: Some(90),
                shutdown_c: Some(100),
                gpu_max_c: Some(85),
                mem_max_c: Some(95),
            },
            ..Default::default()
        };
        judge_gpu(&s, &HealthPolicy::default(), NOW)
            .reasons
            .into_iter()
            .map(|r| (r.code, r.severity))
            .collect()
    }

    #[test]
    fn close_slowdown_and_shutdown_thresholds_are_not_critical_below_slowdown() {
        use HealthState::*;
        // A100 / H100: maximum operating 85 °C, slowdown 89 °C, shutdown 92 °C.
        let at = |gpu: u32| {
            let sample = GpuSample {
                temp_gpu_c: Some(gpu),
                ..Default::default()
            };
            let s = GpuSignals {
                sample: Some(&sample),
                thresholds: TempThresholds {
                    slowdown_c: Some(89),
                    shutdown_c: Some(92),
                    gpu_max_c: Some(85),
                    mem_max_c: None,
                },
                ..Default::default()
            };
            let h = judge_gpu(&s, &HealthPolicy::default(), NOW);
            (h.state, h.reasons.first().map(|r| r.code.clone()))
        };
        let r = |s, c: &str| (s, Some(c.to_owned()));
        assert_eq!(at(83), (Ok, None));
        assert_eq!(at(85), r(Warning, "temp_near_slowdown"));
        assert_eq!(
            at(87),
            r(Warning, "temp_near_slowdown"),
            "not near shutdown"
        );
        assert_eq!(at(89), r(Warning, "temp_at_slowdown"), "the GPU slows down");
        assert_eq!(at(90), r(Warning, "temp_at_slowdown"));
        assert_eq!(at(91), r(Critical, "temp_near_shutdown"));
        assert_eq!(at(92), r(Critical, "temp_near_shutdown"));
    }

    #[test]
    fn temperature_against_the_gpus_own_thresholds() {
        use HealthState::*;
        let w = |c: &str, s| vec![(c.to_owned(), s)];
        assert_eq!(temps(84, Some(80)), []);
        assert_eq!(temps(85, None), w("temp_near_slowdown", Warning));
        assert_eq!(temps(90, None), w("temp_at_slowdown", Warning));
        assert_eq!(temps(95, None), w("temp_near_shutdown", Critical));
        assert_eq!(temps(70, Some(90)), w("temp_mem_near_max", Warning));
        assert_eq!(temps(70, Some(95)), w("temp_mem_at_max", Critical));
        let sample = GpuSample {
            temp_gpu_c: Some(120),
            ..Default::default()
        };
        let s = GpuSignals {
            sample: Some(&sample),
            ..Default::default()
        };
        assert_eq!(
            judge_gpu(&s, &HealthPolicy::default(), NOW).state,
            Ok,
            "no thresholds, no judgement"
        );
    }

    fn throttles(mask: u64) -> Vec<(String, HealthState)> {
        let sample = GpuSample {
            throttle_reasons: Some(mask),
            ..Default::default()
        };
        let s = GpuSignals {
            sample: Some(&sample),
            ..Default::default()
        };
        judge_gpu(&s, &HealthPolicy::default(), NOW)
            .reasons
            .into_iter()
            .map(|r| (r.code, r.severity))
            .collect()
    }

    #[test]
    fn throttle_reasons_that_matter_are_warnings() {
        use HealthState::*;
        let w = |c: &str, s| (c.to_owned(), s);
        assert_eq!(throttles(0x1 | 0x2 | 0x10 | 0x100), []);
        assert_eq!(throttles(0x4), [w("throttle_power_cap", Ok)]);
        assert_eq!(throttles(0x20), [w("throttle_thermal", Warning)]);
        assert_eq!(
            throttles(0x40 | 0x8),
            [w("throttle_thermal", Warning)],
            "hardware slowdown explained by thermal"
        );
        assert_eq!(throttles(0x80 | 0x8), [w("throttle_power_brake", Warning)]);
        assert_eq!(throttles(0x8), [w("throttle_hw_slowdown", Warning)]);
    }

    #[test]
    fn throttle_masks_decode_to_names() {
        assert_eq!(decode_throttle(0), Vec::<&str>::new());
        assert_eq!(decode_throttle(0x4 | 0x40), ["sw_power_cap", "hw_thermal"]);
        assert_eq!(decode_throttle(0x1FF).len(), 9);
        assert_eq!(decode_throttle(0x200), ["other"]);
    }

    #[test]
    fn a_node_is_its_worst_gpu_and_critical_when_offline() {
        let ok = GpuHealth::default();
        let warn = GpuHealth {
            state: HealthState::Warning,
            reasons: Vec::new(),
        };
        let n = judge_node(NodeStatus::Online, &[&ok, &warn], "2m");
        assert_eq!(
            (n.state, n.gpus_warning, n.gpus_critical),
            (HealthState::Warning, 1, 0)
        );
        assert!(n.reasons.is_empty());
        let n = judge_node(NodeStatus::Offline, &[&ok], "2m");
        assert_eq!(n.state, HealthState::Critical);
        assert_eq!(n.reasons[0].code, "node_offline");
        let n = judge_node(NodeStatus::Stale, &[], "2m");
        assert_eq!(n.state, HealthState::Warning);
    }

    fn arb_kind() -> impl Strategy<Value = EventKind> {
        prop_oneof![
            Just(EventKind::Xid),
            Just(EventKind::EccDoubleBit),
            Just(EventKind::GpuLost),
            Just(EventKind::GpuRecovered),
            Just(EventKind::Throttle),
        ]
    }

    fn arb_sample() -> impl Strategy<Value = GpuSample> {
        (
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(|(t, m, ecc, mask)| GpuSample {
                temp_gpu_c: t,
                temp_mem_c: m,
                ecc_uncorrected_volatile: ecc,
                throttle_reasons: mask,
                ..Default::default()
            })
    }

    fn arb_thresholds() -> impl Strategy<Value = TempThresholds> {
        (
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u32>()),
        )
            .prop_map(|(a, b, c, d)| TempThresholds {
                slowdown_c: a,
                shutdown_c: b,
                gpu_max_c: c,
                mem_max_c: d,
            })
    }

    fn arb_events() -> impl Strategy<Value = Vec<(i64, EventKind, Option<u64>)>> {
        proptest::collection::vec(
            (
                -48 * H..H,
                arb_kind(),
                proptest::option::of(prop_oneof![0u64..160, any::<u64>()]),
            ),
            0..20,
        )
    }

    proptest! {
        #[test]
        fn the_state_is_the_worst_reason_and_reasons_come_worst_first(
            sample in arb_sample(),
            thresholds in arb_thresholds(),
            evs in arb_events(),
            pending in proptest::option::of(any::<bool>()),
            failed in proptest::option::of(any::<bool>()),
            rise in proptest::option::of(any::<u64>()),
        ) {
            let r = events(&evs.iter().map(|&(t, k, c)| (NOW + t, k, c)).collect::<Vec<_>>());
            let s = GpuSignals {
                sample: Some(&sample),
                thresholds,
                flags: HealthFlags {
                    remapped_rows_pending: pending,
                    remapped_rows_failed: failed,
                    pcie_replay_rise: rise.map(|r| (r, None)),
                    ..Default::default()
                },
                events: Some(&r),
            };
            let h = judge_gpu(&s, &HealthPolicy::default(), NOW);
            let worst = h.reasons.iter().map(|r| r.severity).max().unwrap_or_default();
            prop_assert_eq!(h.state, worst);
            prop_assert!(h.reasons.windows(2).all(|w| w[0].severity >= w[1].severity));
            for r in &h.reasons {
                prop_assert!(!r.code.is_empty() && !r.summary.is_empty() && !r.action.is_empty());
            }
            if failed == Some(true) {
                prop_assert_eq!(h.state, HealthState::Critical);
            }
        }

        #[test]
        fn a_critical_xid_never_makes_a_gpu_healthier(
            sample in arb_sample(),
            thresholds in arb_thresholds(),
            evs in arb_events(),
            age in 0..24 * H,
        ) {
            let mut list: Vec<_> = evs.iter().map(|&(t, k, c)| (NOW + t, k, c)).collect();
            let r = events(&list);
            let before = judge_gpu(&GpuSignals { sample: Some(&sample), thresholds, events: Some(&r), ..Default::default() }, &HealthPolicy::default(), NOW);
            list.push((NOW - age, EventKind::Xid, Some(79)));
            let r = events(&list);
            let after = judge_gpu(&GpuSignals { sample: Some(&sample), thresholds, events: Some(&r), ..Default::default() }, &HealthPolicy::default(), NOW);
            prop_assert!(after.state >= before.state);
            // Unless a later recovery cleared it, the GPU is now critical.
            let recovered_after = list.iter().any(|&(t, k, _)| k == EventKind::GpuRecovered && t >= NOW - age);
            if !recovered_after {
                prop_assert_eq!(after.state, HealthState::Critical);
            }
        }

        #[test]
        fn every_known_throttle_bit_has_one_name(mask in any::<u64>()) {
            let names = decode_throttle(mask);
            let known = THROTTLE_BITS.iter().filter(|(b, _)| mask & b != 0).count();
            let other = usize::from(mask & !0x1FF != 0);
            prop_assert_eq!(names.len(), known + other);
        }
    }
}
