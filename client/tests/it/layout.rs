//! Layout on ratatui's test backend: what each screen shows, at several sizes.

use gpufleet::api::{
    ContainerRow, ContainersView, FleetGpu, FleetGpuLatest, FleetHealth, FleetNode, GpuLatestView,
    GpuView, NodeStatus, NodeView,
};
use gpufleet::app::{App, View};
use gpufleet::model::{Fleet, Link, Model, NodePane};
use gpufleet::ui::{self, Theme};
use gpufleet_core::{GpuSample, ProcessSample, Workload, WorkloadKind};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::style::Color;
use std::collections::BTreeMap;

const GIB: u64 = 1024 * 1024 * 1024;

/// GPU `i` of node `node`'s sample at `util` % (absent: `None`).
fn sample(node: u32, i: u32, util: Option<u32>) -> GpuSample {
    GpuSample {
        gpu_uuid: format!("GPU-{node}-{i}"),
        util_gpu_pct: util,
        mem_used_bytes: Some(u64::from(util.unwrap_or(0)) * 800_000_000),
        mem_total_bytes: Some(80 * GIB),
        power_mw: util.map(|u| 100_000 + u * 5000),
        power_limit_mw: Some(700_000),
        temp_gpu_c: Some(40 + util.unwrap_or(0) / 3),
        ..Default::default()
    }
}

fn gpu(node: u32, i: u32, util: Option<u32>) -> FleetGpu {
    FleetGpu {
        uuid: format!("GPU-{node}-{i}"),
        index: i,
        name: "NVIDIA H100 80GB HBM3".into(),
        latest: Some(FleetGpuLatest::of(1_000, &sample(node, i, util))),
        health: FleetHealth::default(),
    }
}

/// `n` nodes of 8 GPUs; node 3 is stale, node 5 offline, node 7's GPUs report no util.
fn fleet(n: u32) -> Fleet {
    Fleet::new(
        (0..n)
            .map(|k| FleetNode {
                name: format!("gpu-node-{:04}", k + 1),
                status: match k {
                    3 => NodeStatus::Stale,
                    5 => NodeStatus::Offline,
                    _ => NodeStatus::Online,
                },
                connected: true,
                last_seen_ms: Some(1_000),
                labels: BTreeMap::from([("rack".to_owned(), format!("r{}", k / 4 + 1))]),
                gpus: (0..8)
                    .map(|i| gpu(k, i, (k != 7).then_some((k * 7 + i * 13) % 101)))
                    .collect(),
                ..Default::default()
            })
            .collect(),
    )
}

fn model(n: u32) -> Model {
    let mut m = Model {
        url: "http://127.0.0.1:8080".into(),
        fleet: fleet(n),
        link: Link::Live,
        ..Default::default()
    };
    m.fleet.now_ms = 3_000;
    m
}

fn draw(
    app: &mut App,
    model: &Model,
    w: u16,
    h: u16,
    theme: Theme,
) -> (String, Terminal<TestBackend>) {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    t.draw(|f| {
        let area = f.area();
        ui::draw(area, f.buffer_mut(), app, model, theme);
    })
    .expect("draw");
    let text = ui::buffer_text(t.backend().buffer());
    (text, t)
}

const COLOR: Theme = Theme { color: true };

#[test]
fn the_fleet_shows_totals_one_row_per_node_a_page_at_a_time_and_the_keys() {
    let m = model(1000);
    let mut app = App::new();
    let (text, _) = draw(&mut app, &m, 160, 30, COLOR);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains("gpufleet top") && lines[0].contains("live"),
        "{text}"
    );
    assert!(
        lines[1].contains("Nodes 1000 (998 online, 1 stale, 1 offline)")
            && lines[1].contains("GPUs 8000"),
        "{text}"
    );
    assert!(lines[2].contains("NODE") && lines[2].contains("UTIL") && lines[2].contains("TEMP"));
    // 30 rows: 2 header, 1 column titles, 1 footer: 26 nodes.
    assert_eq!(app.page, 26);
    let rows: Vec<&&str> = lines.iter().filter(|l| l.contains("gpu-node-")).collect();
    assert_eq!(rows.len(), 26, "{text}");
    assert!(
        rows[0].starts_with("> gpu-node-0001"),
        "selection marked: {}",
        rows[0]
    );
    assert!(rows[3].contains("stale") && rows[5].contains("offline"));
    assert!(
        rows[7].contains("n/a"),
        "absent util is n/a, not 0%: {}",
        rows[7]
    );
    assert!(
        rows[7].contains("········"),
        "absent per-GPU cells: {}",
        rows[7]
    );
    assert!(lines[29].contains("q") && lines[29].contains("quit") && lines[29].contains("filter"));
}

#[test]
fn paging_reaches_the_last_of_1000_nodes() {
    let m = model(1000);
    let mut app = App::new();
    draw(&mut app, &m, 160, 30, COLOR);
    let visible: Vec<String> = app
        .visible(&m.fleet)
        .into_iter()
        .map(|i| m.fleet.nodes()[i].name.clone())
        .collect();
    let names: Vec<&str> = visible.iter().map(String::as_str).collect();
    app.key(key(KeyCode::End), &names);
    let (text, _) = draw(&mut app, &m, 160, 30, COLOR);
    assert!(text.contains("> gpu-node-1000"), "{text}");
    assert!(!text.contains("gpu-node-0974 "), "one page only");
}

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
fn key(c: KeyCode) -> KeyEvent {
    KeyEvent::new(c, KeyModifiers::NONE)
}

#[test]
fn any_size_draws_without_panicking_and_nothing_wraps() {
    let mut m = model(40);
    m.node = Some(node_pane());
    m.energy = Some(energy());
    for view in [
        View::Fleet,
        View::Node("gpu-node-0002".into()),
        View::Energy,
    ] {
        for (w, h) in [(1, 1), (10, 3), (40, 10), (80, 24), (250, 80)] {
            let mut app = App::new();
            app.view = view.clone();
            let (text, _) = draw(&mut app, &m, w, h, COLOR);
            assert_eq!(text.lines().count(), usize::from(h));
        }
    }
}

fn node_pane() -> NodePane {
    let process = |pid: u32, w: Workload| ProcessSample {
        gpu_uuid: "GPU-1-0".into(),
        pid,
        user: Some("alice".into()),
        command: Some("python train.py".into()),
        gpu_mem_bytes: Some(40 * GIB),
        sm_util_pct: Some(97),
        workload: w,
        ..Default::default()
    };
    NodePane {
        name: "gpu-node-0002".into(),
        detail: Some(NodeView {
            name: "gpu-node-0002".into(),
            status: NodeStatus::Online,
            last_seen_ms: Some(2_000),
            gpus: vec![GpuView {
                uuid: "GPU-1-0".into(),
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                latest: Some(GpuLatestView {
                    time: "1970-01-01T00:00:01Z".into(),
                    time_ms: 1_000,
                    sample: sample(1, 0, Some(97)),
                }),
                processes: vec![
                    process(
                        4242,
                        Workload {
                            kind: WorkloadKind::Container,
                            runtime: "containerd".into(),
                            container_name: Some("trainer".into()),
                            namespace: Some("ml".into()),
                            pod_name: Some("llama-ft-0".into()),
                            ..Default::default()
                        },
                    ),
                    process(
                        777,
                        Workload {
                            kind: WorkloadKind::Slurm,
                            runtime: "slurm".into(),
                            job_id: Some("9001".into()),
                            ..Default::default()
                        },
                    ),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }),
        events: Some(gpufleet::api::EventsView::default()),
        error: None,
        events_error: None,
    }
}

fn energy() -> ContainersView {
    ContainersView {
        from_ms: 0,
        to_ms: 3_600_000,
        rows: vec![ContainerRow {
            key: "container:abc".into(),
            identity: Workload {
                kind: WorkloadKind::Container,
                container_name: Some("trainer".into()),
                namespace: Some("ml".into()),
                pod_name: Some("llama-ft-0".into()),
                ..Default::default()
            },
            nodes: vec!["gpu-node-0002".into()],
            energy_j: 7.2e6,
            idle_j: 0.72e6,
            gpu_seconds: 7200.0,
            carbon_g: Some(500.0),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn the_node_view_is_an_nvidia_smi_table_with_processes_and_their_owners() {
    let mut m = model(4);
    m.node = Some(node_pane());
    let mut app = App::new();
    app.view = View::Node("gpu-node-0002".into());
    let (text, _) = draw(&mut app, &m, 160, 30, COLOR);
    assert!(
        text.contains("gpu-node-0002") && text.contains("online"),
        "{text}"
    );
    assert!(text.contains("NVIDIA H100 80GB HBM3"), "{text}");
    assert!(
        text.contains("97%") && text.contains("585W / 700W"),
        "{text}"
    );
    let p = text
        .lines()
        .find(|l| l.contains("4242"))
        .expect("process row");
    assert!(
        p.contains("alice") && p.contains("trainer") && p.contains("ml/llama-ft-0"),
        "{p}"
    );
    let j = text.lines().find(|l| l.contains("777")).expect("slurm row");
    assert!(j.contains("job 9001"), "{j}");
    assert!(text.contains("no events in the last hour"), "{text}");
}

#[test]
fn the_energy_view_shows_today_per_workload() {
    let mut m = model(4);
    m.energy = Some(energy());
    let mut app = App::new();
    app.view = View::Energy;
    let (text, _) = draw(&mut app, &m, 160, 20, COLOR);
    assert!(
        text.contains("2.00 kWh") && text.contains("500 g"),
        "{text}"
    );
    let row = text.lines().find(|l| l.contains("trainer")).expect("row");
    assert!(
        row.contains("ml/llama-ft-0") && row.contains("10%") && row.contains("2.0"),
        "{row}"
    );
}

#[test]
fn without_colour_nothing_is_coloured_and_states_still_read() {
    let m = model(10);
    let mut app = App::new();
    let (_, t) = draw(&mut app, &m, 160, 20, Theme { color: false });
    let buf = t.backend().buffer();
    for c in &buf.content {
        assert_eq!((c.fg, c.bg), (Color::Reset, Color::Reset), "{c:?}");
    }
    let (_, t) = draw(&mut app, &m, 160, 20, COLOR);
    assert!(
        t.backend()
            .buffer()
            .content
            .iter()
            .any(|c| c.fg == Color::Green),
        "with colour, online is green"
    );
}

#[test]
fn a_failed_events_fetch_says_why_instead_of_loading_forever() {
    let mut m = model(4);
    let mut pane = node_pane();
    pane.events = None;
    pane.events_error =
        Some("GET /api/v1/nodes/gpu-node-0002/events: the collector answered 503".into());
    m.node = Some(pane);
    let mut app = App::new();
    app.view = View::Node("gpu-node-0002".into());
    let (text, _) = draw(&mut app, &m, 160, 30, COLOR);
    assert!(text.contains("answered 503"), "{text}");
    assert!(!text.contains("loading events"), "{text}");
}

#[test]
fn health_shows_on_the_fleet_and_the_node_with_reasons_and_explained_xids() {
    use gpufleet::api::{
        EventView, EventsView, FleetReason, GpuHealth, HealthReason, HealthState, NodeHealth,
        Severity, XidInfo,
    };
    let mut m = model(4);
    let mut nodes = m.fleet.nodes().to_vec();
    nodes[1].health = FleetHealth {
        state: HealthState::Critical,
        reasons: vec![FleetReason {
            code: "xid_79".into(),
            severity: HealthState::Critical,
            summary: "Xid 79".into(),
        }],
    };
    m.fleet = Fleet::new(nodes);
    let mut app = App::new();
    let (text, _) = draw(&mut app, &m, 160, 30, COLOR);
    let row = text
        .lines()
        .find(|l| l.contains("gpu-node-0002"))
        .expect("row");
    assert!(row.contains("critical"), "{row}");
    let other = text
        .lines()
        .find(|l| l.contains("gpu-node-0001"))
        .expect("row");
    assert!(other.contains("online  ok "), "a healthy node: ok, {other}");

    let mut pane = node_pane();
    let detail = pane.detail.as_mut().expect("detail");
    detail.health = NodeHealth {
        state: HealthState::Critical,
        gpus_critical: 1,
        ..Default::default()
    };
    detail.gpus[0].health = GpuHealth {
        state: HealthState::Critical,
        reasons: vec![HealthReason {
            code: "xid_79".into(),
            severity: HealthState::Critical,
            summary: "Xid 79: GPU has fallen off the bus (last at 12:00:00Z)".into(),
            action: "Drain the node and reboot it".into(),
            since_ms: Some(1_000),
        }],
    };
    pane.events = Some(EventsView {
        node: "gpu-node-0002".into(),
        events: vec![EventView {
            time: "1970-01-01T00:00:01Z".into(),
            event: gpufleet_core::Event {
                time_ms: 1_000,
                gpu_uuid: "GPU-1-0".into(),
                kind: gpufleet_core::EventKind::Xid,
                code: Some(79),
                detail: "NVRM: Xid 79".into(),
            },
            explanation: Some(XidInfo {
                code: 79,
                name: "GPU has fallen off the bus".into(),
                meaning: "The GPU stopped answering on PCIe.".into(),
                cause: "Hardware, power or thermal.".into(),
                action: "Reboot the node".into(),
                severity: Severity::Critical,
                known: true,
            }),
        }],
        ..Default::default()
    });
    m.node = Some(pane);
    app.view = View::Node("gpu-node-0002".into());
    let (text, _) = draw(&mut app, &m, 200, 30, COLOR);
    assert!(text.contains("health critical"), "{text}");
    let gpu_row = text
        .lines()
        .find(|l| l.contains("NVIDIA H100 80GB HBM3"))
        .expect("GPU row");
    assert!(gpu_row.contains("critical"), "{gpu_row}");
    let reason = text
        .lines()
        .find(|l| l.contains("fallen off the bus (last"))
        .expect("reason line");
    assert!(
        reason.contains("critical") && reason.contains("→ Drain the node and reboot it"),
        "{reason}"
    );
    let event = text
        .lines()
        .find(|l| l.contains("NVRM: Xid 79"))
        .expect("event row");
    assert!(
        event.contains("GPU has fallen off the bus — Reboot the node"),
        "{event}"
    );
}
