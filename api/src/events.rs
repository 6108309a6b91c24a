//! `GET /api/v1/nodes/{name}/events`: a node's events (Xid, ECC, …), oldest first, each
//! Xid with the catalogue's explanation.

use crate::xid::XidInfo;
use gpufleet_core::{Event, UnixMs};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventView {
    pub time: String,
    #[serde(flatten)]
    pub event: Event,
    /// For an Xid event: what the code means, its likely cause, what to do, how bad it
    /// is (the catalogue, `/api/v1/health/xid/{code}`); `null` for other events.
    pub explanation: Option<XidInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventsView {
    pub node: String,
    pub from_ms: UnixMs,
    pub to_ms: UnixMs,
    /// Whether there were more than the limit (the newest are left out).
    pub truncated: bool,
    pub events: Vec<EventView>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xid::Severity;

    #[test]
    fn explained_and_plain_events_decode() {
        let e: EventsView = serde_json::from_str(
            r#"{"node":"n1","from_ms":0,"to_ms":9,"truncated":false,"events":[
              {"time":"1970-01-01T00:00:00.001Z","time_ms":1,"gpu_uuid":"GPU-1","kind":"xid",
              "code":79,"detail":"x","explanation":{"code":79,"name":"GPU has fallen off the bus",
              "meaning":"m","cause":"c","action":"Reboot","severity":"critical","known":true}},
              {"time":"1970-01-01T00:00:00.002Z","time_ms":2,"gpu_uuid":"","kind":"spool_drop",
              "code":null,"detail":"y","explanation":null}]}"#,
        )
        .expect("decodes");
        assert_eq!(e.events[0].event.code, Some(79));
        let x = e.events[0].explanation.as_ref().expect("explained");
        assert_eq!(
            (x.name.as_str(), x.severity),
            ("GPU has fallen off the bus", Severity::Critical)
        );
        assert_eq!(e.events[1].explanation, None);
        let again: EventsView =
            serde_json::from_str(&serde_json::to_string(&e).expect("encodes")).expect("decodes");
        assert_eq!(again, e);
    }
}
