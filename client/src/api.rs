//! The collector's API answers `top` reads: the collector's own response types
//! ([`gpufleet_api`]), so the client decodes exactly what the server encodes. Serde skips
//! fields a newer collector adds; an absent value stays `None`, never 0. Names and units are
//! the API's (`/api/v1/openapi.json`).
//!
//! | answer | type |
//! |---|---|
//! | `GET /api/v1/fleet` | `Vec<`[`FleetNode`]`>` |
//! | `GET /api/v1/nodes/{name}` | [`NodeView`] |
//! | `GET /api/v1/nodes/{name}/events` | [`EventsView`] |
//! | `GET /api/v1/containers` | [`ContainersView`] |
//! | `/api/v1/live`: `tick`, `status` | [`TickView`], [`StatusView`] |
//! | any error | [`ErrorBody`] |

pub use gpufleet_api::{
    ContainerRow, ContainersView, ErrorBody, EventView, EventsView, FleetGpu, FleetGpuLatest,
    FleetHealth, FleetHost, FleetHostLatest, FleetNode, FleetReason, GpuHealth, GpuLatestView,
    GpuView, HealthReason, HealthState, HostLatestView, HostView, NodeHealth, NodeStatus, NodeView,
    Severity, StatusNode, StatusView, TickGpu, TickView, XidInfo,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_node_with_absent_values_stays_absent() {
        let j = r#"[{"name":"n1","status":"online","connected":true,"last_seen_ms":5,
            "labels":{"rack":"r1"},"interval_ms":1000,"health":{"state":"ok","reasons":[]},
            "host":{"latest":null},
            "gpus":[{"uuid":"GPU-1","index":0,"name":"H100","latest":{"time_ms":5,
            "util_gpu_pct":null,"mem_used_bytes":1,"mem_total_bytes":2,"power_mw":null,
            "power_limit_mw":700000,"temp_gpu_c":40},"health":{"state":"ok","reasons":[]}}]}]"#;
        let nodes: Vec<FleetNode> = serde_json::from_str(j).expect("parses");
        let g = nodes[0].gpus[0].latest.as_ref().expect("latest");
        assert_eq!(g.util_gpu_pct, None);
        assert_eq!(g.power_mw, None);
        assert_eq!(g.temp_gpu_c, Some(40));
        assert_eq!(nodes[0].status, NodeStatus::Online);
    }

    #[test]
    fn health_and_explained_events_parse() {
        let j = r#"{"name":"n1","status":"online","connected":true,"last_seen":null,
            "last_seen_ms":5,"labels":{},"agent_version":"0.1.0","boot_id":"b","source":"nvml",
            "interval_ms":1000,"last_acked_seq":1,"dropped_samples":0,
            "spool_backlog":{"batches":0,"bytes":0},"rejected_batches":0,"stored_samples":1,
            "health":{"state":"critical","reasons":[],"gpus_warning":0,"gpus_critical":1},
            "host":{"hostname":"n1","kernel":null,"os":null,"cpu_count":null,
              "memory_total_bytes":null,"driver_version":null,"cuda_driver_version":null,
              "nvml_version":null,"latest":null},
            "gpus":[{"uuid":"GPU-1","index":0,"name":"H100","inventory":{"index":0,
              "uuid":"GPU-1","name":"H100","mig_instances":[]},"latest":null,"processes":[],
              "health":{"state":"critical","reasons":[{"code":"xid_79","severity":"critical",
              "summary":"Xid 79: GPU has fallen off the bus","action":"Reboot","since_ms":5}]},
              "throttle":null}]}"#;
        let n: NodeView = serde_json::from_str(j).expect("parses");
        let h = &n.gpus[0].health;
        assert_eq!(
            (h.state, h.reasons[0].code.as_str()),
            (HealthState::Critical, "xid_79")
        );
        let e: EventsView = serde_json::from_str(
            r#"{"node":"n1","from_ms":0,"to_ms":3,"truncated":false,"events":[
              {"time":"1970-01-01T00:00:00.001Z","time_ms":1,"gpu_uuid":"GPU-1","kind":"xid",
              "code":79,"detail":"x","explanation":{"code":79,
              "name":"GPU has fallen off the bus","meaning":"m","cause":"c","action":"Reboot",
              "severity":"critical","known":true}},
              {"time":"1970-01-01T00:00:00.002Z","time_ms":2,"gpu_uuid":"","kind":"spool_drop",
              "code":null,"detail":"y","explanation":null}]}"#,
        )
        .expect("parses");
        assert_eq!(e.events[0].event.code, Some(79));
        assert_eq!(
            e.events[0].explanation.as_ref().map(|x| x.name.as_str()),
            Some("GPU has fallen off the bus")
        );
        assert_eq!(e.events[1].explanation, None);
    }

    #[test]
    fn an_unknown_status_is_refused_not_guessed() {
        assert!(serde_json::from_str::<NodeStatus>("\"draining\"").is_err());
        assert!(serde_json::from_str::<HealthState>("\"degraded\"").is_err());
    }

    #[test]
    fn a_live_tick_flattens_the_gpu_sample() {
        let j = r#"{"node":"n1","time_ms":7,"gpus":[{"uuid":"GPU-1","gpu_uuid":"GPU-1",
            "util_gpu_pct":93,"power_mw":250000,"nvlinks":[]}],"host":null,"processes":[]}"#;
        let t: TickView<'static> = serde_json::from_str(j).expect("parses");
        assert_eq!(t.gpus[0].uuid, "GPU-1");
        assert_eq!(t.gpus[0].sample.util_gpu_pct, Some(93));
        assert_eq!(t.gpus[0].sample.mem_used_bytes, None);
    }
}
