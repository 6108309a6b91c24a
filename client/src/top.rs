//! `gpufleet top`: the loop that ties the network to the screen.
//!
//! One current-thread runtime: the live stream ([`crate::sse::follow`]) and the API calls
//! run as tasks and report over bounded channels; keys come from a thread blocked in
//! crossterm's `read`. The screen is redrawn at most [`FRAME`] apart when something
//! changed, and at once after a key, so 1,000 nodes ticking every second cost one draw
//! per frame, not one per tick.

use crate::api::{ContainersView, EventsView, FleetNode, NodeView};
use crate::app::{Action, App, View};
use crate::model::{Applied, Fleet, Link, Model, NodePane};
use crate::net::{Api, NetError};
use crate::sse::{self, LiveEvent};
use crate::ui::{self, Theme};
use ratatui::crossterm::event::{self as term, Event as TermEvent};
use serde::Serialize;
use std::io::Write as _;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Shortest time between two draws caused by live data.
pub const FRAME: Duration = Duration::from_millis(250);
/// How often the open node's detail and events are fetched again.
pub const NODE_REFRESH: Duration = Duration::from_secs(2);
/// How often today's energy per workload is fetched again.
pub const ENERGY_REFRESH: Duration = Duration::from_secs(30);

/// Why `top` stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TopError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("terminal: {0}")]
    Terminal(#[source] std::io::Error),
    #[error("cannot encode the JSON frame: {0}")]
    Json(#[source] serde_json::Error),
}

/// A fetch finished.
enum Fetched {
    Fleet(Result<Vec<FleetNode>, NetError>),
    /// Boxed: a node's detail is far bigger than the other answers.
    Node(Box<NodeFetch>),
    Energy(Result<ContainersView, NetError>),
}

/// A node's detail and events, fetched together.
struct NodeFetch {
    name: String,
    detail: Result<NodeView, NetError>,
    events: Result<EventsView, NetError>,
}

/// What `--once --json` prints.
#[derive(Serialize)]
struct JsonFrame<'a> {
    url: &'a str,
    totals: crate::model::Totals,
    nodes: Vec<&'a FleetNode>,
    /// Today's energy and CO2 per workload; `null` when the collector could not say.
    energy_today: Option<&'a [crate::api::ContainerRow]>,
}

/// `--once`: one frame, as text `width` columns wide or as JSON, on stdout.
pub async fn once(
    api: &Api,
    url: &str,
    json: bool,
    width: u16,
    app: &mut App,
) -> Result<String, TopError> {
    let (fleet, energy) = tokio::join!(api.fleet(), api.energy_today());
    let model = Model {
        url: url.to_owned(),
        fleet: Fleet::new(fleet?),
        link: Link::Snapshot,
        node: None,
        // The fleet is the frame; energy the collector cannot give is shown as missing.
        error: energy.as_ref().err().map(ToString::to_string),
        energy: energy.ok(),
    };
    if json {
        let visible = app.visible(&model.fleet);
        let frame = JsonFrame {
            url,
            totals: model.fleet.totals(),
            nodes: visible
                .iter()
                .filter_map(|&i| model.fleet.nodes().get(i))
                .collect(),
            energy_today: model.energy.as_ref().map(|e| e.rows.as_slice()),
        };
        let mut s = serde_json::to_string_pretty(&frame).map_err(TopError::Json)?;
        s.push('\n');
        return Ok(s);
    }
    Ok(ui::once_text(app, &model, width))
}

/// The interactive screen, until `q`.
pub async fn interactive(api: Api, url: String, mut app: App) -> Result<(), TopError> {
    let theme = Theme::from_env();
    let mut terminal = ratatui::try_init().map_err(TopError::Terminal)?;
    let result = run(&mut terminal, api, url, &mut app, theme).await;
    ratatui::try_restore().map_err(TopError::Terminal)?;
    result
}

fn spawn_keys() -> mpsc::Receiver<TermEvent> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        while let Ok(ev) = term::read() {
            if tx.blocking_send(ev).is_err() {
                break;
            }
        }
    });
    rx
}

async fn run(
    terminal: &mut ratatui::DefaultTerminal,
    api: Api,
    url: String,
    app: &mut App,
    theme: Theme,
) -> Result<(), TopError> {
    let stop = CancellationToken::new();
    let _stop_on_exit = stop.clone().drop_guard();
    let (live_tx, mut live_rx) = mpsc::channel(1024);
    tokio::spawn(sse::follow(api.clone(), live_tx, stop.clone()));
    let (fetch_tx, mut fetch_rx) = mpsc::channel(16);
    let mut keys = spawn_keys();

    let mut model = Model {
        url,
        ..Model::default()
    };
    let fetch_fleet = |tx: mpsc::Sender<Fetched>| {
        let api = api.clone();
        tokio::spawn(async move {
            let _ = tx.send(Fetched::Fleet(api.fleet().await)).await;
        });
    };
    let fetch_node = |tx: mpsc::Sender<Fetched>, name: String| {
        let api = api.clone();
        tokio::spawn(async move {
            let (detail, events) = tokio::join!(api.node(&name), api.events(&name));
            let fetched = NodeFetch {
                name,
                detail,
                events,
            };
            let _ = tx.send(Fetched::Node(Box::new(fetched))).await;
        });
    };
    let fetch_energy = |tx: mpsc::Sender<Fetched>| {
        let api = api.clone();
        tokio::spawn(async move {
            let _ = tx.send(Fetched::Energy(api.energy_today().await)).await;
        });
    };
    // Whether a fleet reload is in flight, and whether another was asked for meanwhile.
    let mut fleet_loading = true;
    let mut fleet_again = false;
    fetch_fleet(fetch_tx.clone());
    fetch_energy(fetch_tx.clone());

    let mut frame = tokio::time::interval(FRAME);
    frame.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut node_timer = tokio::time::interval_at(Instant::now() + NODE_REFRESH, NODE_REFRESH);
    node_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut energy_timer =
        tokio::time::interval_at(Instant::now() + ENERGY_REFRESH, ENERGY_REFRESH);
    energy_timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut dirty = true;
    let mut draw_now = true;

    loop {
        if draw_now {
            terminal
                .draw(|f| {
                    let area = f.area();
                    ui::draw(area, f.buffer_mut(), app, &model, theme);
                })
                .map_err(TopError::Terminal)?;
            dirty = false;
            draw_now = false;
        }
        let mut reload = false;
        tokio::select! {
            ev = keys.recv() => match ev {
                None => return Ok(()),
                Some(TermEvent::Key(k)) => {
                    let visible: Vec<&str> = app
                        .visible(&model.fleet)
                        .into_iter()
                        .filter_map(|i| model.fleet.nodes().get(i).map(|n| n.name.as_str()))
                        .collect();
                    match app.key(k, &visible) {
                        Action::Quit => return Ok(()),
                        Action::OpenNode(name) => {
                            model.node = Some(NodePane { name: name.clone(), ..NodePane::default() });
                            fetch_node(fetch_tx.clone(), name);
                        }
                        Action::CloseNode => model.node = None,
                        Action::OpenEnergy => fetch_energy(fetch_tx.clone()),
                        Action::None => {}
                    }
                    draw_now = true;
                }
                Some(TermEvent::Resize(..)) => draw_now = true,
                Some(_) => {}
            },
            ev = live_rx.recv() => {
                let Some(ev) = ev else { return Ok(()) };
                dirty = true;
                match ev {
                    LiveEvent::Connected => {
                        model.link = Link::Live;
                        reload = true;
                    }
                    LiveEvent::Resync => reload = true,
                    LiveEvent::Down(why) => model.link = Link::Down(why),
                    LiveEvent::Tick(t) => reload = model.fleet.apply_tick(t) == Applied::Unknown,
                    LiveEvent::Status(s) => reload = model.fleet.apply_status(s) == Applied::Unknown,
                }
            },
            f = fetch_rx.recv() => {
                dirty = true;
                match f {
                    None => return Ok(()),
                    Some(Fetched::Fleet(r)) => {
                        fleet_loading = false;
                        match r {
                            Ok(nodes) => {
                                let now = model.fleet.now_ms;
                                model.fleet.replace(nodes);
                                model.fleet.now_ms = now;
                                model.error = None;
                            }
                            Err(e) => model.error = Some(e.to_string()),
                        }
                        if fleet_again {
                            fleet_again = false;
                            reload = true;
                        }
                    }
                    Some(Fetched::Node(f)) => {
                        let NodeFetch { name, detail, events } = *f;
                        if let Some(p) = model.node.as_mut().filter(|p| p.name == name) {
                            match detail {
                                Ok(d) => {
                                    p.detail = Some(d);
                                    p.error = None;
                                }
                                Err(e) => p.error = Some(e.to_string()),
                            }
                            match events {
                                Ok(e) => {
                                    p.events = Some(e);
                                    p.events_error = None;
                                }
                                Err(e) => p.events_error = Some(e.to_string()),
                            }
                        }
                    }
                    Some(Fetched::Energy(r)) => match r {
                        Ok(e) => model.energy = Some(e),
                        Err(e) => model.error = Some(e.to_string()),
                    },
                }
            },
            _ = node_timer.tick() => {
                if let View::Node(name) = &app.view {
                    fetch_node(fetch_tx.clone(), name.clone());
                }
            },
            _ = energy_timer.tick() => fetch_energy(fetch_tx.clone()),
            _ = frame.tick() => draw_now = dirty,
        }
        if reload {
            if fleet_loading {
                fleet_again = true;
            } else {
                fleet_loading = true;
                fetch_fleet(fetch_tx.clone());
            }
        }
    }
}

/// Writes `text` to stdout (a closed pipe is not an error worth a message).
pub fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
