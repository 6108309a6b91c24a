//! What `top` knows about the fleet: the last `/api/v1/fleet` answer kept current by the
//! live stream's `tick` and `status` events, the open node's detail, today's energy per
//! workload, and the connection state. Pure: the network code feeds it, the UI reads it.

use crate::api::{
    ContainersView, EventsView, FleetGpu, FleetGpuLatest, FleetHostLatest, FleetNode, HealthState,
    NodeStatus, NodeView, StatusView, TickView,
};
use serde::Serialize;
use std::collections::HashMap;

/// The state of the live stream.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Link {
    /// Not connected yet.
    #[default]
    Connecting,
    /// Following `/api/v1/live`.
    Live,
    /// Lost; reconnecting. Holds why.
    Down(String),
    /// One frame read once (`--once`), not following.
    Snapshot,
}

/// The fleet, by node, in the collector's order (by name).
#[derive(Debug, Default)]
pub struct Fleet {
    nodes: Vec<FleetNode>,
    by_name: HashMap<String, usize>,
    /// The collector's clock as of its last `status` event (0 before one came).
    pub now_ms: i64,
}

/// What a live event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Applied to a known node.
    Updated,
    /// It names a node or GPU the fleet list does not have: reload the list.
    Unknown,
}

impl Fleet {
    /// A fleet from a `/api/v1/fleet` answer.
    pub fn new(nodes: Vec<FleetNode>) -> Fleet {
        let mut f = Fleet::default();
        f.replace(nodes);
        f
    }

    /// Replaces every node with a fresh `/api/v1/fleet` answer.
    pub fn replace(&mut self, mut nodes: Vec<FleetNode>) {
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        self.by_name = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), i))
            .collect();
        self.nodes = nodes;
    }

    pub fn nodes(&self) -> &[FleetNode] {
        &self.nodes
    }

    pub fn get(&self, name: &str) -> Option<&FleetNode> {
        self.by_name.get(name).and_then(|&i| self.nodes.get(i))
    }

    /// A `tick`: the node's GPUs' and host's newest values.
    pub fn apply_tick(&mut self, t: TickView<'static>) -> Applied {
        let Some(n) = self
            .by_name
            .get(&*t.node)
            .and_then(|&i| self.nodes.get_mut(i))
        else {
            return Applied::Unknown;
        };
        let mut unknown = false;
        for g in &t.gpus {
            match n.gpus.iter_mut().find(|x| x.uuid == g.uuid) {
                // What the collector's fleet answer would now say.
                Some(x) => x.latest = Some(FleetGpuLatest::of(t.time_ms, &g.sample)),
                None => unknown = true,
            }
        }
        if let Some(h) = &t.host {
            n.host.latest = Some(FleetHostLatest::of(t.time_ms, Some(&*h.sample)));
        }
        n.last_seen_ms = Some(n.last_seen_ms.map_or(t.time_ms, |s| s.max(t.time_ms)));
        if unknown {
            Applied::Unknown
        } else {
            Applied::Updated
        }
    }

    /// A `status`: every node's status, and the collector's clock.
    pub fn apply_status(&mut self, s: StatusView) -> Applied {
        self.now_ms = s.now_ms;
        let mut unknown = s.nodes.len() != self.nodes.len();
        for st in s.nodes {
            match self
                .by_name
                .get(&st.name)
                .and_then(|&i| self.nodes.get_mut(i))
            {
                Some(n) => {
                    n.status = st.status;
                    n.connected = st.connected;
                    n.last_seen_ms = st.last_seen_ms;
                    // Health states follow the status event (reasons come with the next
                    // fleet or node reload); it lists only the GPUs that are not ok.
                    n.health.state = st.health;
                    for g in &mut n.gpus {
                        g.health.state = st
                            .gpu_health
                            .get(&g.uuid)
                            .copied()
                            .unwrap_or(HealthState::Ok);
                    }
                }
                None => unknown = true,
            }
        }
        if unknown {
            Applied::Unknown
        } else {
            Applied::Updated
        }
    }

    /// Totals over the whole fleet.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        let mut util_sum = 0.0;
        let mut util_n = 0u32;
        for n in &self.nodes {
            t.nodes += 1;
            match n.status {
                NodeStatus::Online => t.online += 1,
                NodeStatus::Stale => t.stale += 1,
                NodeStatus::Offline => t.offline += 1,
            }
            for g in &n.gpus {
                t.gpus += 1;
                let Some(l) = &g.latest else { continue };
                if let Some(u) = l.util_gpu_pct {
                    util_sum += f64::from(u);
                    util_n += 1;
                }
                if let (Some(u), Some(m)) = (l.mem_used_bytes, l.mem_total_bytes) {
                    *t.mem_used_bytes.get_or_insert(0) += u;
                    *t.mem_total_bytes.get_or_insert(0) += m;
                }
                if let Some(p) = l.power_mw {
                    *t.power_mw.get_or_insert(0) += u64::from(p);
                }
                if let Some(p) = l.power_limit_mw {
                    *t.power_limit_mw.get_or_insert(0) += u64::from(p);
                }
                if idle_but_allocated(g) {
                    t.idle_allocated += 1;
                }
            }
        }
        t.util_avg_pct = (util_n > 0).then(|| util_sum / f64::from(util_n));
        t
    }
}

/// A GPU holding memory while doing nothing: the waste an operator hunts.
pub fn idle_but_allocated(g: &FleetGpu) -> bool {
    g.latest.as_ref().is_some_and(|l| {
        l.util_gpu_pct == Some(0) && l.mem_used_bytes.is_some_and(|m| m >= 1024 * 1024 * 1024)
    })
}

/// Fleet totals (absent where no GPU reports the value).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    pub nodes: u32,
    pub online: u32,
    pub stale: u32,
    pub offline: u32,
    pub gpus: u32,
    pub util_avg_pct: Option<f64>,
    pub mem_used_bytes: Option<u64>,
    pub mem_total_bytes: Option<u64>,
    pub power_mw: Option<u64>,
    pub power_limit_mw: Option<u64>,
    /// GPUs at 0 % utilization holding at least 1 GiB.
    pub idle_allocated: u32,
}

/// A node's figures in the fleet list (what its row shows and sorts by).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NodeFigures {
    pub util_avg_pct: Option<f64>,
    pub mem_frac: Option<f64>,
    pub power_mw: Option<f64>,
    pub power_limit_mw: Option<f64>,
    pub temp_max_c: Option<u32>,
}

impl NodeFigures {
    pub fn of(n: &FleetNode) -> NodeFigures {
        let mut f = NodeFigures::default();
        let (mut us, mut un) = (0.0, 0u32);
        let (mut mu, mut mt) = (0u64, 0u64);
        for l in n.gpus.iter().filter_map(|g| g.latest.as_ref()) {
            if let Some(u) = l.util_gpu_pct {
                us += f64::from(u);
                un += 1;
            }
            if let (Some(u), Some(t)) = (l.mem_used_bytes, l.mem_total_bytes) {
                mu += u;
                mt += t;
            }
            if let Some(p) = l.power_mw {
                *f.power_mw.get_or_insert(0.0) += f64::from(p);
            }
            if let Some(p) = l.power_limit_mw {
                *f.power_limit_mw.get_or_insert(0.0) += f64::from(p);
            }
            if let Some(t) = l.temp_gpu_c {
                f.temp_max_c = Some(f.temp_max_c.map_or(t, |m| m.max(t)));
            }
        }
        f.util_avg_pct = (un > 0).then(|| us / f64::from(un));
        f.mem_frac = (mt > 0).then(|| mu as f64 / mt as f64);
        f
    }
}

/// The open node: its detail and events, refreshed while it is shown.
#[derive(Debug, Default)]
pub struct NodePane {
    pub name: String,
    pub detail: Option<NodeView>,
    pub events: Option<EventsView>,
    /// Why the last refresh failed (e.g. the node was removed).
    pub error: Option<String>,
    /// Why the last events fetch failed (the last events read stay shown).
    pub events_error: Option<String>,
}

/// Everything the UI draws.
#[derive(Debug, Default)]
pub struct Model {
    /// The collector's URL, as given.
    pub url: String,
    pub fleet: Fleet,
    pub link: Link,
    pub node: Option<NodePane>,
    /// Today's energy and CO2 per workload.
    pub energy: Option<ContainersView>,
    /// Why the last fetch failed, if it did.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{FleetHealth, StatusNode, TickGpu};
    use gpufleet_core::GpuSample;
    use std::borrow::Cow;

    fn node(name: &str, gpus: &[(&str, Option<u32>)]) -> FleetNode {
        FleetNode {
            name: name.into(),
            status: NodeStatus::Online,
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, (uuid, util))| FleetGpu {
                    uuid: (*uuid).into(),
                    index: u32::try_from(i).unwrap_or(0),
                    name: "H100".into(),
                    latest: Some(FleetGpuLatest {
                        util_gpu_pct: *util,
                        ..Default::default()
                    }),
                    health: FleetHealth::default(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn ticks_update_their_gpus_and_unknown_names_ask_for_a_reload() {
        let mut f = Fleet::new(vec![
            node("b", &[("G2", Some(1))]),
            node("a", &[("G1", None)]),
        ]);
        assert_eq!(f.nodes()[0].name, "a", "sorted by name");
        let tick = |node: &str, uuid: &str| TickView {
            node: Cow::Owned(node.to_owned()),
            time_ms: 9,
            gpus: vec![TickGpu {
                uuid: Cow::Owned(uuid.to_owned()),
                sample: Cow::Owned(GpuSample {
                    gpu_uuid: uuid.to_owned(),
                    util_gpu_pct: Some(80),
                    ..Default::default()
                }),
            }],
            ..Default::default()
        };
        assert_eq!(f.apply_tick(tick("a", "G1")), Applied::Updated);
        let g = f.get("a").and_then(|n| n.gpus[0].latest.clone());
        assert_eq!(g.map(|l| (l.util_gpu_pct, l.time_ms)), Some((Some(80), 9)));
        assert_eq!(f.apply_tick(tick("c", "G9")), Applied::Unknown);
        assert_eq!(f.apply_tick(tick("a", "G9")), Applied::Unknown);
    }

    #[test]
    fn status_events_mark_nodes_and_a_new_node_asks_for_a_reload() {
        let mut f = Fleet::new(vec![node("a", &[])]);
        let st = |names: &[&str]| StatusView {
            now_ms: 100,
            nodes: names
                .iter()
                .map(|n| StatusNode {
                    name: (*n).into(),
                    status: NodeStatus::Stale,
                    last_seen_ms: Some(5),
                    connected: false,
                    health: HealthState::Warning,
                    gpu_health: Default::default(),
                })
                .collect(),
        };
        assert_eq!(f.apply_status(st(&["a"])), Applied::Updated);
        assert_eq!(f.get("a").map(|n| n.status), Some(NodeStatus::Stale));
        assert_eq!(
            f.get("a").map(|n| n.health.state),
            Some(HealthState::Warning)
        );
        assert_eq!(f.now_ms, 100);
        assert_eq!(f.apply_status(st(&["a", "b"])), Applied::Unknown);
    }

    #[test]
    fn status_events_carry_health_states() {
        let mut f = Fleet::new(vec![node("a", &[("G1", Some(50)), ("G2", None)])]);
        f.nodes[0].gpus[0].health.state = HealthState::Warning;
        let mut gpu_health = std::collections::BTreeMap::new();
        gpu_health.insert("G2".to_owned(), HealthState::Critical);
        let status = StatusView {
            now_ms: 100,
            nodes: vec![StatusNode {
                name: "a".into(),
                status: NodeStatus::Online,
                last_seen_ms: Some(5),
                connected: true,
                health: HealthState::Critical,
                gpu_health,
            }],
        };
        assert_eq!(f.apply_status(status), Applied::Updated);
        let n = f.get("a").expect("a");
        assert_eq!(n.health.state, HealthState::Critical);
        assert_eq!(n.gpus[0].health.state, HealthState::Ok, "not listed: ok");
        assert_eq!(n.gpus[1].health.state, HealthState::Critical);
    }

    #[test]
    fn totals_leave_out_absent_values() {
        let f = Fleet::new(vec![node("a", &[("G1", Some(50)), ("G2", None)])]);
        let t = f.totals();
        assert_eq!(t.gpus, 2);
        assert_eq!(t.util_avg_pct, Some(50.0), "the absent GPU is not a 0");
        assert_eq!(t.power_mw, None);
        let nf = NodeFigures::of(&f.nodes()[0]);
        assert_eq!(nf.util_avg_pct, Some(50.0));
        assert_eq!(nf.temp_max_c, None);
    }
}
