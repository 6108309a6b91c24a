//! The events of `GET /api/v1/live` (Server-Sent Events) that carry data:
//!
//! - `tick` ([`TickView`]): after every commit, the committed batch's newest tick of one
//!   node, each GPU's sample flattened beside its UUID;
//! - `status` ([`StatusView`]): every second, every node's status and health state.
//!
//! (`resync`, `{"skipped": N}`, asks the client to reload; it has no type here.) The
//! stream is described in prose in the OpenAPI document, not by these types.
//!
//! A tick is encoded once per client for every commit, so [`TickView`] borrows the
//! collector's samples (`Cow::Borrowed`); a client decodes an owned one (`TickView<'static>`).

use crate::health::HealthState;
use crate::status::NodeStatus;
use gpufleet_core::{GpuSample, HostSample, ProcessSample, UnixMs};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TickGpu<'a> {
    pub uuid: Cow<'a, str>,
    #[serde(flatten)]
    pub sample: Cow<'a, GpuSample>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TickView<'a> {
    pub node: Cow<'a, str>,
    pub time_ms: UnixMs,
    pub gpus: Vec<TickGpu<'a>>,
    pub host: Option<HostView<'a>>,
    pub processes: Cow<'a, [ProcessSample]>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostView<'a> {
    pub time_ms: UnixMs,
    #[serde(flatten)]
    pub sample: Cow<'a, HostSample>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusNode {
    pub name: String,
    pub status: NodeStatus,
    pub last_seen_ms: Option<UnixMs>,
    pub connected: bool,
    /// The node's health state (its worst GPU, or offline / stale).
    pub health: HealthState,
    /// Each GPU's health state by UUID, only GPUs that are not ok.
    pub gpu_health: BTreeMap<String, HealthState>,
}

/// A `status` event. The collector encodes it through a `serde_json::Value`, so its keys
/// (and its nodes' keys) come in sorted order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusView {
    pub nodes: Vec<StatusNode>,
    pub now_ms: UnixMs,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_flattens_the_gpu_sample_and_decodes_owned() {
        let sample = GpuSample {
            gpu_uuid: "GPU-1".into(),
            util_gpu_pct: Some(93),
            ..Default::default()
        };
        let host = HostSample::default();
        let tick = TickView {
            node: Cow::Borrowed("n1"),
            time_ms: 7,
            gpus: vec![TickGpu {
                uuid: Cow::Borrowed("GPU-1"),
                sample: Cow::Borrowed(&sample),
            }],
            host: Some(HostView {
                time_ms: 7,
                sample: Cow::Borrowed(&host),
            }),
            processes: Cow::Owned(Vec::new()),
        };
        let json = serde_json::to_string(&tick).expect("encodes");
        assert!(
            json.contains("\"uuid\":\"GPU-1\",\"gpu_uuid\":\"GPU-1\",\"util_gpu_pct\":93"),
            "{json}"
        );
        let back: TickView<'static> = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, tick);
        assert_eq!(back.gpus[0].sample.mem_used_bytes, None, "absent, not 0");
    }

    #[test]
    fn a_status_decodes() {
        let s: StatusView = serde_json::from_str(
            r#"{"nodes":[{"connected":true,"gpu_health":{"GPU-2":"critical"},"health":"critical",
              "last_seen_ms":5,"name":"a","status":"online"}],"now_ms":100}"#,
        )
        .expect("decodes");
        assert_eq!(s.now_ms, 100);
        assert_eq!(
            s.nodes[0].gpu_health.get("GPU-2"),
            Some(&HealthState::Critical)
        );
    }
}
