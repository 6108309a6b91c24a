//! A GPU's or node's judged health (ok / warning / critical) and the reasons behind it, each
//! with a summary and what to do. The collector's judge (`gpufleet_collector::health`)
//! makes them; this is their shape on the wire.

use crate::xid::Severity;
use gpufleet_core::UnixMs;
use serde::{Deserialize, Serialize};

/// How healthy a GPU or node is; ordered, so the worst of several is their `max`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    #[default]
    Ok,
    Warning,
    Critical,
}

impl HealthState {
    pub const ALL: [HealthState; 3] =
        [HealthState::Ok, HealthState::Warning, HealthState::Critical];

    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Ok => "ok",
            HealthState::Warning => "warning",
            HealthState::Critical => "critical",
        }
    }

    /// The Prometheus gauge value: 0 ok, 1 warning, 2 critical.
    pub fn level(self) -> u64 {
        self as u64
    }

    pub fn parse(s: &str) -> Option<HealthState> {
        Self::ALL.into_iter().find(|h| h.as_str() == s)
    }
}

impl From<Severity> for HealthState {
    fn from(s: Severity) -> HealthState {
        match s {
            Severity::Info => HealthState::Ok,
            Severity::Warning => HealthState::Warning,
            Severity::Critical => HealthState::Critical,
        }
    }
}

/// One reason a GPU or node is not (entirely) ok. A reason with severity `ok` is
/// informational: listed, but the state does not change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthReason {
    /// A stable id: `xid_79`, `gpu_lost`, `ecc_dbe`, `ecc_uncorrected`, `row_remap_pending`,
    /// `row_remap_failed`, `retired_pages_pending`, `temp_near_slowdown`, `temp_at_slowdown`,
    /// `temp_near_shutdown`, `temp_over_max`, `temp_mem_near_max`, `temp_mem_at_max`,
    /// `throttle_thermal`, `throttle_hw_slowdown`, `throttle_power_brake`,
    /// `throttle_power_cap`, `persistence_off`, `pcie_replays`, `nvlink_errors`,
    /// `node_offline`, `node_stale`.
    pub code: String,
    pub severity: HealthState,
    /// What is wrong, with the numbers.
    pub summary: String,
    /// What to do about it.
    pub action: String,
    /// Since when (the first occurrence of an event in memory; absent for a condition
    /// read from the newest sample).
    pub since_ms: Option<UnixMs>,
}

/// A GPU's judged health.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuHealth {
    pub state: HealthState,
    /// Worst first.
    pub reasons: Vec<HealthReason>,
}

/// A node's judged health: its own reasons (offline, stale) and its GPUs' worst.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeHealth {
    pub state: HealthState,
    /// The node's own reasons (each GPU's are on the GPU).
    pub reasons: Vec<HealthReason>,
    /// How many of its GPUs are warning / critical.
    pub gpus_warning: usize,
    pub gpus_critical: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_their_names_and_order_by_badness() {
        for h in HealthState::ALL {
            assert_eq!(HealthState::parse(h.as_str()), Some(h));
            let back: HealthState =
                serde_json::from_str(&format!("\"{}\"", h.as_str())).expect("decodes");
            assert_eq!(back, h);
        }
        assert_eq!(HealthState::parse("degraded"), None);
        assert!(
            HealthState::Ok < HealthState::Warning && HealthState::Warning < HealthState::Critical
        );
        assert_eq!(HealthState::Critical.level(), 2);
        assert_eq!(HealthState::from(Severity::Info), HealthState::Ok);
    }

    #[test]
    fn a_reason_round_trips_with_and_without_since() {
        let r = HealthReason {
            code: "xid_79".into(),
            severity: HealthState::Critical,
            summary: "Xid 79".into(),
            action: "Reboot".into(),
            since_ms: None,
        };
        let json = serde_json::to_string(&r).expect("encodes");
        assert!(json.contains("\"since_ms\":null"), "{json}");
        let back: HealthReason = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, r);
    }
}
