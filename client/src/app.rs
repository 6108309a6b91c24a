//! The UI's own state (view, filter, sort, selection, scrolling) and what each key does.
//! Pure: no I/O, so key handling is tested without a terminal.

use crate::api::FleetNode;
use crate::model::{Fleet, NodeFigures};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use std::cmp::Ordering;

/// Which screen is shown.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum View {
    /// Every node, one row each.
    #[default]
    Fleet,
    /// One node: GPU table, processes, events.
    Node(String),
    /// Today's energy and CO2 per workload.
    Energy,
}

/// What the fleet list is sorted by (each has its key, shown in the footer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sort {
    #[default]
    Name,
    Status,
    Util,
    Mem,
    Power,
    Temp,
}

impl Sort {
    pub fn label(self) -> &'static str {
        match self {
            Sort::Name => "name",
            Sort::Status => "status",
            Sort::Util => "util",
            Sort::Mem => "memory",
            Sort::Power => "power",
            Sort::Temp => "temperature",
        }
    }
}

/// What the caller must do after a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// Fetch this node's detail and events (the node view opened).
    OpenNode(String),
    /// The node view closed.
    CloseNode,
    /// Fetch today's energy per workload (the energy view opened).
    OpenEnergy,
}

/// The UI state.
#[derive(Debug, Clone, Default)]
pub struct App {
    pub view: View,
    /// The filter (`/`): a node is shown when its name, or one of its labels as
    /// `key=value`, contains it (case-insensitive).
    pub filter: String,
    /// Whether keys go to the filter line.
    pub editing_filter: bool,
    pub sort: Sort,
    /// Descending (the default for figures: busiest first) or not.
    pub reverse: bool,
    /// Index of the selected row in the visible list.
    pub selected: usize,
    /// First visible row of the list.
    pub offset: usize,
    /// Rows the list shows at once (set by the renderer from the terminal's height).
    pub page: usize,
    /// First row of the node view's process table / of the energy table.
    pub scroll: usize,
    /// Whether the selected row is marked (not in `--once`).
    pub select: bool,
}

/// Whether node `n` matches `filter` (already lower-case).
fn matches(n: &FleetNode, filter: &str) -> bool {
    if filter.is_empty() || n.name.to_lowercase().contains(filter) {
        return true;
    }
    n.labels
        .iter()
        .any(|(k, v)| format!("{k}={v}").to_lowercase().contains(filter))
}

fn cmp_opt<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Ordering {
    // Absent sorts after every value, whatever the direction.
    match (a, b) {
        (Some(a), Some(b)) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

impl App {
    pub fn new() -> App {
        App {
            page: 20,
            select: true,
            ..App::default()
        }
    }

    /// The nodes shown, filtered and sorted: indices into `fleet.nodes()`.
    pub fn visible(&self, fleet: &Fleet) -> Vec<usize> {
        let filter = self.filter.to_lowercase();
        let nodes = fleet.nodes();
        let mut rows: Vec<(usize, NodeFigures)> = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| matches(n, &filter))
            .map(|(i, n)| (i, NodeFigures::of(n)))
            .collect();
        let sort = self.sort;
        // Figures sort busiest first; names and statuses A to Z (online first).
        let desc =
            matches!(sort, Sort::Util | Sort::Mem | Sort::Power | Sort::Temp) != self.reverse;
        let name = |i: usize| nodes.get(i).map(|n| n.name.as_str()).unwrap_or("");
        rows.sort_by(|(ia, a), (ib, b)| {
            let by = match sort {
                Sort::Name => Ordering::Equal,
                Sort::Status => {
                    let s = |i: usize| nodes.get(i).map(|n| n.status);
                    s(*ia).cmp(&s(*ib))
                }
                Sort::Util => cmp_opt(a.util_avg_pct, b.util_avg_pct),
                Sort::Mem => cmp_opt(a.mem_frac, b.mem_frac),
                Sort::Power => cmp_opt(a.power_mw, b.power_mw),
                Sort::Temp => cmp_opt(a.temp_max_c, b.temp_max_c),
            };
            let present = |f: &NodeFigures| match sort {
                Sort::Util => f.util_avg_pct.is_some(),
                Sort::Mem => f.mem_frac.is_some(),
                Sort::Power => f.power_mw.is_some(),
                Sort::Temp => f.temp_max_c.is_some(),
                Sort::Name | Sort::Status => true,
            };
            let by = if desc && present(a) && present(b) {
                by.reverse()
            } else {
                by
            };
            let by = by.then_with(|| name(*ia).cmp(name(*ib)));
            if sort == Sort::Name && self.reverse {
                by.reverse()
            } else {
                by
            }
        });
        rows.into_iter().map(|(i, _)| i).collect()
    }

    /// Keeps the selection inside `len` rows and on the page.
    pub fn clamp(&mut self, len: usize) {
        self.selected = self.selected.min(len.saturating_sub(1));
        let page = self.page.max(1);
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + page {
            self.offset = self.selected + 1 - page;
        }
        self.offset = self.offset.min(len.saturating_sub(page));
    }

    fn move_by(&mut self, delta: isize, len: usize) {
        self.selected = self.selected.saturating_add_signed(delta);
        self.clamp(len);
    }

    /// Handles one key; `visible` is the fleet list as shown (node names, in order).
    pub fn key(&mut self, key: KeyEvent, visible: &[&str]) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::None;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if self.editing_filter {
            match key.code {
                KeyCode::Enter => self.editing_filter = false,
                KeyCode::Esc => {
                    self.editing_filter = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => {
                    self.filter.push(c);
                    self.selected = 0;
                    self.offset = 0;
                }
                _ => {}
            }
            return Action::None;
        }
        let len = visible.len();
        let page = isize::try_from(self.page.max(1)).unwrap_or(1);
        match (&self.view, key.code) {
            (_, KeyCode::Char('q')) => return Action::Quit,
            (View::Fleet, KeyCode::Char('/')) => {
                self.editing_filter = true;
            }
            (View::Fleet, KeyCode::Esc) => {
                self.filter.clear();
            }
            (View::Fleet, KeyCode::Enter) => {
                if let Some(name) = visible.get(self.selected) {
                    self.view = View::Node((*name).to_owned());
                    self.scroll = 0;
                    return Action::OpenNode((*name).to_owned());
                }
            }
            (View::Fleet, KeyCode::Up | KeyCode::Char('k')) => self.move_by(-1, len),
            (View::Fleet, KeyCode::Down | KeyCode::Char('j')) => self.move_by(1, len),
            (View::Fleet, KeyCode::PageUp) => self.move_by(-page, len),
            (View::Fleet, KeyCode::PageDown | KeyCode::Char(' ')) => self.move_by(page, len),
            (View::Fleet, KeyCode::Home | KeyCode::Char('g')) => {
                self.selected = 0;
                self.clamp(len);
            }
            (View::Fleet, KeyCode::End | KeyCode::Char('G')) => {
                self.selected = len.saturating_sub(1);
                self.clamp(len);
            }
            (View::Fleet, KeyCode::Char(c)) if sort_key(c).is_some() => {
                if let Some(s) = sort_key(c) {
                    if self.sort == s {
                        self.reverse = !self.reverse;
                    } else {
                        self.sort = s;
                        self.reverse = false;
                    }
                }
            }
            (View::Fleet, KeyCode::Char('r')) => self.reverse = !self.reverse,
            (View::Fleet | View::Node(_), KeyCode::Char('e')) => {
                self.view = View::Energy;
                self.scroll = 0;
                return Action::OpenEnergy;
            }
            (
                View::Node(_),
                KeyCode::Esc | KeyCode::Backspace | KeyCode::Left | KeyCode::Char('h'),
            ) => {
                self.view = View::Fleet;
                return Action::CloseNode;
            }
            (
                View::Energy,
                KeyCode::Esc
                | KeyCode::Backspace
                | KeyCode::Left
                | KeyCode::Char('h')
                | KeyCode::Char('e'),
            ) => {
                self.view = View::Fleet;
            }
            (View::Node(_) | View::Energy, KeyCode::Down | KeyCode::Char('j')) => {
                self.scroll = self.scroll.saturating_add(1);
            }
            (View::Node(_) | View::Energy, KeyCode::Up | KeyCode::Char('k')) => {
                self.scroll = self.scroll.saturating_sub(1);
            }
            (View::Node(_) | View::Energy, KeyCode::PageDown) => {
                self.scroll = self.scroll.saturating_add(self.page.max(1));
            }
            (View::Node(_) | View::Energy, KeyCode::PageUp) => {
                self.scroll = self.scroll.saturating_sub(self.page.max(1));
            }
            _ => {}
        }
        Action::None
    }
}

/// The sort each key selects (pressing it again reverses the order).
fn sort_key(c: char) -> Option<Sort> {
    match c {
        'n' => Some(Sort::Name),
        's' => Some(Sort::Status),
        'u' => Some(Sort::Util),
        'm' => Some(Sort::Mem),
        'p' => Some(Sort::Power),
        't' => Some(Sort::Temp),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{FleetGpu, FleetGpuLatest, NodeStatus};
    use std::collections::BTreeMap;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    fn node(name: &str, util: Option<u32>, rack: &str) -> FleetNode {
        FleetNode {
            name: name.into(),
            status: NodeStatus::Online,
            labels: BTreeMap::from([("rack".to_owned(), rack.to_owned())]),
            gpus: vec![FleetGpu {
                uuid: format!("GPU-{name}"),
                latest: Some(FleetGpuLatest {
                    util_gpu_pct: util,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn names(app: &App, f: &Fleet) -> Vec<String> {
        app.visible(f)
            .into_iter()
            .filter_map(|i| f.nodes().get(i).map(|n| n.name.clone()))
            .collect()
    }

    fn fleet() -> Fleet {
        Fleet::new(vec![
            node("a", Some(10), "r1"),
            node("b", None, "r2"),
            node("c", Some(90), "r2"),
        ])
    }

    #[test]
    fn the_filter_matches_names_and_labels() {
        let f = fleet();
        let mut app = App::new();
        for k in [KeyCode::Char('/'), KeyCode::Char('R'), KeyCode::Char('2')] {
            app.key(key(k), &[]);
        }
        assert_eq!(names(&app, &f), ["b", "c"], "rack=r2, case-insensitive");
        app.key(key(KeyCode::Enter), &[]);
        assert!(!app.editing_filter);
        app.filter = "b".into();
        assert_eq!(names(&app, &f), ["b"]);
        app.key(key(KeyCode::Esc), &[]);
        assert_eq!(names(&app, &f).len(), 3);
    }

    #[test]
    fn sort_keys_sort_busiest_first_absent_last_and_again_reverses() {
        let f = fleet();
        let mut app = App::new();
        app.key(key(KeyCode::Char('u')), &[]);
        assert_eq!(names(&app, &f), ["c", "a", "b"]);
        app.key(key(KeyCode::Char('u')), &[]);
        assert_eq!(names(&app, &f), ["a", "c", "b"], "absent stays last");
        app.key(key(KeyCode::Char('n')), &[]);
        assert_eq!(names(&app, &f), ["a", "b", "c"]);
        app.key(key(KeyCode::Char('n')), &[]);
        assert_eq!(names(&app, &f), ["c", "b", "a"]);
    }

    #[test]
    fn paging_keeps_the_selection_on_screen() {
        let names: Vec<String> = (0..1000).map(|i| format!("n{i:04}")).collect();
        let visible: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut app = App::new();
        app.page = 10;
        app.key(key(KeyCode::PageDown), &visible);
        assert_eq!((app.selected, app.offset), (10, 1));
        app.key(key(KeyCode::End), &visible);
        assert_eq!((app.selected, app.offset), (999, 990));
        app.key(key(KeyCode::PageUp), &visible);
        assert_eq!((app.selected, app.offset), (989, 989));
        app.key(key(KeyCode::Home), &visible);
        assert_eq!((app.selected, app.offset), (0, 0));
    }

    #[test]
    fn enter_opens_the_selected_node_and_esc_comes_back() {
        let mut app = App::new();
        app.key(key(KeyCode::Down), &["a", "b"]);
        assert_eq!(
            app.key(key(KeyCode::Enter), &["a", "b"]),
            Action::OpenNode("b".into())
        );
        assert_eq!(app.view, View::Node("b".into()));
        assert_eq!(
            app.key(key(KeyCode::Char('/')), &[]),
            Action::None,
            "no filter in a node"
        );
        assert!(!app.editing_filter);
        assert_eq!(app.key(key(KeyCode::Esc), &[]), Action::CloseNode);
        assert_eq!(app.view, View::Fleet);
        assert_eq!(app.key(key(KeyCode::Char('q')), &[]), Action::Quit);
        assert_eq!(
            app.key(key(KeyCode::Enter), &[]),
            Action::None,
            "empty list"
        );
    }
}
