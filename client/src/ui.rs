//! Drawing: the fleet list, the node view, the energy view, header and footer, into any
//! ratatui buffer (the terminal's, a test backend's, or `--once`'s). Lines longer than
//! the area are cut, and every part takes only the rows it is given, so any terminal
//! size (and a resize) draws without wrapping or panicking.

use crate::api::{FleetGpuLatest, FleetNode, HealthReason, HealthState, NodeStatus};
use crate::app::{App, Sort, View};
use crate::format::{self, NA, ago, bytes, carbon_g, celsius, energy_j, fit, frac, pct, watts_mw};
use crate::model::{Link, Model, NodeFigures};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

/// Colours, or none (`NO_COLOR`, `TERM=dumb`): then only bold / reverse, and every state
/// also reads from its text (`online`, `>` for the selection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    /// From the environment: no colour when `NO_COLOR` is set (non-empty) or `TERM` is
    /// `dumb` or unset.
    pub fn from_env() -> Theme {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let dumb = std::env::var("TERM").map_or(true, |t| t == "dumb" || t.is_empty());
        Theme {
            color: !no_color && !dumb,
        }
    }

    fn fg(self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }

    fn status(self, s: NodeStatus) -> Style {
        match s {
            NodeStatus::Online => self.fg(Color::Green),
            NodeStatus::Stale => self.fg(Color::Yellow),
            NodeStatus::Offline => self.fg(Color::Red).add_modifier(Modifier::BOLD),
        }
    }

    fn health(self, h: HealthState) -> Style {
        match h {
            HealthState::Ok => self.fg(Color::Green),
            HealthState::Warning => self.fg(Color::Yellow),
            HealthState::Critical => self.fg(Color::Red).add_modifier(Modifier::BOLD),
        }
    }

    /// Green, yellow, red by how full `f` (0..=1) is.
    fn level(self, f: Option<f64>) -> Style {
        match f {
            None => self.fg(Color::DarkGray),
            Some(f) if f >= 0.85 => self.fg(Color::Red),
            Some(f) if f >= 0.5 => self.fg(Color::Yellow),
            Some(_) => self.fg(Color::Green),
        }
    }

    fn title(self) -> Style {
        if self.color {
            Style::default().fg(Color::Black).bg(Color::Cyan)
        } else {
            Style::default().add_modifier(Modifier::REVERSED)
        }
    }

    fn dim(self) -> Style {
        self.fg(Color::DarkGray)
    }
}

/// Most health reasons the node view lists (the worst first).
const MAX_REASON_LINES: usize = 6;
/// Most per-GPU cells a fleet row shows per metric (more GPUs: the first ones, then `+`).
const MAX_GPU_CELLS: usize = 8;
/// Temperature drawn full in a bar.
const TEMP_FULL_C: f64 = 90.0;

/// Draws the whole screen into `buf` over `area`; sets `app.page` to the rows the list
/// (or the scrolled table) shows.
pub fn draw(area: Rect, buf: &mut Buffer, app: &mut App, model: &Model, theme: Theme) {
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    header(head, buf, model, theme);
    match app.view.clone() {
        View::Fleet => fleet(body, buf, app, model, theme),
        View::Node(name) => node(body, buf, app, model, &name, theme),
        View::Energy => energy(body, buf, app, model, theme, None),
    }
    footer(foot, buf, app, theme);
}

fn header(area: Rect, buf: &mut Buffer, model: &Model, theme: Theme) {
    let t = model.fleet.totals();
    let link = match &model.link {
        Link::Live => Span::styled("live", theme.fg(Color::Green)),
        Link::Connecting => Span::styled("connecting…", theme.fg(Color::Yellow)),
        Link::Snapshot => Span::raw("snapshot"),
        Link::Down(why) => Span::styled(format!("reconnecting: {why}"), theme.fg(Color::Red)),
    };
    let mut first = vec![
        Span::styled(" gpufleet top ", theme.title()),
        Span::raw(format!(" {}  ", model.url)),
        link,
    ];
    if let Some(e) = &model.error {
        first.push(Span::styled(format!("  {e}"), theme.fg(Color::Red)));
    }
    let mem = match (t.mem_used_bytes, t.mem_total_bytes) {
        (Some(u), Some(m)) => format!("{}/{}", bytes(Some(u)), bytes(Some(m))),
        _ => NA.to_owned(),
    };
    let power = match t.power_limit_mw {
        Some(l) => format!(
            "{}/{}",
            watts_mw(t.power_mw.map(|p| p as f64)),
            watts_mw(Some(l as f64))
        ),
        None => watts_mw(t.power_mw.map(|p| p as f64)),
    };
    let mut second = vec![
        Span::raw(format!(" Nodes {} (", t.nodes)),
        Span::styled(
            format!("{} online", t.online),
            theme.status(NodeStatus::Online),
        ),
        Span::raw(", "),
        Span::styled(
            format!("{} stale", t.stale),
            theme.status(NodeStatus::Stale),
        ),
        Span::raw(", "),
        Span::styled(
            format!("{} offline", t.offline),
            theme.status(NodeStatus::Offline),
        ),
        Span::raw(format!(
            ")  GPUs {}  Util {}  Mem {mem}  Power {power}  Idle-allocated {}",
            t.gpus,
            pct(t.util_avg_pct),
            t.idle_allocated
        )),
    ];
    // No row yet (nothing accounted today): say nothing rather than "0 Wh".
    if let Some(e) = model.energy.as_ref().filter(|e| !e.rows.is_empty()) {
        let j: f64 = e.rows.iter().map(|r| r.energy_j).fold(0.0, |a, b| a + b);
        let g = e
            .rows
            .iter()
            .filter_map(|r| r.carbon_g)
            .reduce(|a, b| a + b);
        second.push(Span::raw(format!(
            "  Today {} {} CO2",
            energy_j(j),
            carbon_g(g)
        )));
    }
    Paragraph::new(vec![Line::from(first), Line::from(second)]).render(area, buf);
}

fn footer(area: Rect, buf: &mut Buffer, app: &App, theme: Theme) {
    let keys: &[(&str, &str)] = match (&app.view, app.editing_filter) {
        (_, true) => &[
            ("Enter", "apply"),
            ("Esc", "clear"),
            ("", "type a name or label=value"),
        ],
        (View::Fleet, false) => &[
            ("q", "quit"),
            ("/", "filter"),
            ("Enter", "node"),
            ("e", "energy"),
            ("n s u m p t", "sort (again: reverse)"),
            ("↑↓ PgUp PgDn", "move"),
        ],
        (View::Node(_), false) => &[
            ("q", "quit"),
            ("Esc", "back"),
            ("↑↓", "scroll processes"),
            ("e", "energy"),
        ],
        (View::Energy, false) => &[("q", "quit"), ("Esc", "back"), ("↑↓ PgUp PgDn", "scroll")],
    };
    let mut spans = Vec::new();
    for (k, what) in keys {
        if !k.is_empty() {
            spans.push(Span::styled(format!(" {k} "), theme.title()));
        }
        spans.push(Span::raw(format!(" {what} ")));
    }
    if app.view == View::Fleet && !app.editing_filter {
        spans.push(Span::styled(
            format!(
                " sorted by {}{}",
                app.sort.label(),
                if app.reverse { " (reversed)" } else { "" }
            ),
            theme.dim(),
        ));
    }
    Paragraph::new(Line::from(spans)).render(area, buf);
}

/// One metric of every GPU as cells: one eighth-block each, coloured by level.
fn gpu_cells(
    n: &FleetNode,
    theme: Theme,
    width: usize,
    f: impl Fn(&FleetGpuLatest) -> Option<f64>,
) -> Vec<Span<'static>> {
    let mut spans: Vec<Span<'static>> = n
        .gpus
        .iter()
        .take(width)
        .map(|g| {
            let v = g.latest.as_ref().and_then(&f);
            Span::styled(format::block(v).to_string(), theme.level(v))
        })
        .collect();
    let shown = n.gpus.len().min(width);
    if n.gpus.len() > width {
        spans.push(Span::raw("+"));
    } else {
        spans.push(Span::raw(" ".repeat(width + 1 - shown)));
    }
    spans
}

fn fleet(area: Rect, buf: &mut Buffer, app: &mut App, model: &Model, theme: Theme) {
    let visible = app.visible(&model.fleet);
    let show_filter = app.editing_filter || !app.filter.is_empty();
    let [filter_area, head_area, list_area] = Layout::vertical([
        Constraint::Length(u16::from(show_filter)),
        Constraint::Length(1),
        Constraint::Min(0),
    ])
    .areas(area);
    if show_filter {
        let cursor = if app.editing_filter { "_" } else { "" };
        Paragraph::new(Line::from(vec![
            Span::styled(" Filter: ", theme.title()),
            Span::raw(format!(" {}{cursor}", app.filter)),
            Span::styled(
                format!(
                    "  ({} of {} nodes)",
                    visible.len(),
                    model.fleet.nodes().len()
                ),
                theme.dim(),
            ),
        ]))
        .render(filter_area, buf);
    }
    let cells = model
        .fleet
        .nodes()
        .iter()
        .map(|n| n.gpus.len())
        .max()
        .unwrap_or(1)
        .clamp(1, MAX_GPU_CELLS);
    let col = |title: &str, w: usize| format!("{title:<w$}");
    let heads = [
        (Some(Sort::Name), col("  NODE", 18)),
        (Some(Sort::Status), col("STATUS", 8)),
        (None, col("HEALTH", 9)),
        (None, col("SEEN", 5)),
        (None, col("GPU", 4)),
        (Some(Sort::Util), col("UTIL", cells + 6)),
        (Some(Sort::Mem), col("MEM", cells + 6)),
        (Some(Sort::Power), col("POWER", cells + 9)),
        (Some(Sort::Temp), col("TEMP", cells + 6)),
        (None, col("CPU", 5)),
        (None, "LABELS".to_owned()),
    ];
    let head: Vec<Span> = heads
        .into_iter()
        .map(|(s, t)| {
            // The sorted column is marked in its text too, for terminals without styles.
            if s == Some(app.sort) {
                let mark = if app.reverse { "^" } else { "v" };
                let width = t.chars().count();
                let t = format!("{}{mark}", t.trim_end());
                Span::styled(
                    format!("{t:<width$}"),
                    theme
                        .title()
                        .add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
                )
            } else {
                Span::styled(t, theme.title())
            }
        })
        .collect();
    Paragraph::new(Line::from(head))
        .style(theme.title())
        .render(head_area, buf);

    app.page = usize::from(list_area.height).max(1);
    app.clamp(visible.len());
    let now = model.fleet.now_ms;
    let mut lines = Vec::with_capacity(app.page);
    for (row, &i) in visible.iter().enumerate().skip(app.offset).take(app.page) {
        let Some(n) = model.fleet.nodes().get(i) else {
            continue;
        };
        let f = NodeFigures::of(n);
        let selected = app.select && row == app.selected;
        let mut spans = vec![
            Span::raw(if selected { "> " } else { "  " }),
            Span::raw(fit(&n.name, 16)),
            Span::raw(" "),
            Span::styled(fit(n.status.as_str(), 8), theme.status(n.status)),
            health_cell(n.health.state, 9, theme),
            Span::raw(fit(
                &if now > 0 {
                    ago(n.last_seen_ms, now)
                } else {
                    String::new()
                },
                5,
            )),
            Span::raw(format!("{:<4}", n.gpus.len())),
        ];
        spans.extend(gpu_cells(n, theme, cells, |l| {
            l.util_gpu_pct.map(|u| f64::from(u) / 100.0)
        }));
        spans.push(Span::styled(
            format!("{:<5}", pct(f.util_avg_pct)),
            theme.level(f.util_avg_pct.map(|u| u / 100.0)),
        ));
        spans.extend(gpu_cells(n, theme, cells, |l| {
            frac(
                l.mem_used_bytes.map(|u| u as f64),
                l.mem_total_bytes.map(|t| t as f64),
            )
        }));
        spans.push(Span::styled(
            format!("{:<5}", pct(f.mem_frac.map(|m| m * 100.0))),
            theme.level(f.mem_frac),
        ));
        spans.extend(gpu_cells(n, theme, cells, |l| {
            frac(l.power_mw.map(f64::from), l.power_limit_mw.map(f64::from))
        }));
        spans.push(Span::styled(
            format!("{:<8}", watts_mw(f.power_mw)),
            theme.level(frac(f.power_mw, f.power_limit_mw)),
        ));
        spans.extend(gpu_cells(n, theme, cells, |l| {
            l.temp_gpu_c.map(|t| f64::from(t) / TEMP_FULL_C)
        }));
        spans.push(Span::styled(
            format!("{:<5}", celsius(f.temp_max_c)),
            theme.level(f.temp_max_c.map(|t| f64::from(t) / TEMP_FULL_C)),
        ));
        let cpu = n
            .host
            .latest
            .as_ref()
            .and_then(|h| h.cpu_util_pct)
            .map(f64::from);
        spans.push(Span::raw(format!("{:<5}", pct(cpu))));
        let labels: Vec<String> = n.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        spans.push(Span::styled(labels.join(","), theme.dim()));
        let mut line = Line::from(spans);
        if selected {
            line = line.style(Style::default().add_modifier(Modifier::REVERSED));
        }
        lines.push(line);
    }
    if visible.is_empty() {
        let msg = if model.fleet.nodes().is_empty() {
            "  no nodes yet (waiting for the collector's fleet list)"
        } else {
            "  no node matches the filter (Esc clears it)"
        };
        lines.push(Line::styled(msg, theme.dim()));
    }
    Paragraph::new(lines).render(list_area, buf);
}

/// A health state in `width` columns, coloured.
fn health_cell(h: HealthState, width: usize, theme: Theme) -> Span<'static> {
    Span::styled(fit(h.as_str(), width), theme.health(h))
}

/// `HH:MM:SS` (UTC) of a Unix-ms time.
fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn node(area: Rect, buf: &mut Buffer, app: &mut App, model: &Model, name: &str, theme: Theme) {
    let pane = model.node.as_ref().filter(|p| p.name == name);
    let Some(detail) = pane.and_then(|p| p.detail.as_ref()) else {
        let msg = match pane.and_then(|p| p.error.as_deref()) {
            Some(e) => format!("  {name}: {e}"),
            None => format!("  loading {name}…"),
        };
        Paragraph::new(Line::raw(msg)).render(area, buf);
        return;
    };
    let gpus = u16::try_from(detail.gpus.len()).unwrap_or(u16::MAX);
    // What is wrong, GPU by GPU (informational reasons left out), at most MAX_REASON_LINES.
    let mut reasons: Vec<(u32, &HealthReason)> = detail
        .health
        .reasons
        .iter()
        .map(|r| (u32::MAX, r))
        .chain(
            detail
                .gpus
                .iter()
                .flat_map(|g| g.health.reasons.iter().map(move |r| (g.index, r))),
        )
        .filter(|(_, r)| r.severity != HealthState::Ok)
        .collect();
    reasons.sort_by_key(|(_, r)| std::cmp::Reverse(r.severity));
    let reason_lines = u16::try_from(reasons.len().min(MAX_REASON_LINES)).unwrap_or(0);
    let [info, gpu_area, health_area, proc_area, event_area] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(gpus.saturating_add(2)),
        Constraint::Length(if reason_lines > 0 {
            reason_lines + 1
        } else {
            0
        }),
        Constraint::Fill(2),
        Constraint::Fill(1),
    ])
    .areas(area);

    let labels: Vec<String> = detail
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let now = model.fleet.now_ms;
    let h = &detail.host;
    let host_now = h.latest.as_ref().map(|l| &l.sample);
    Paragraph::new(vec![
        Line::from(vec![
            Span::styled(
                format!(" {} ", detail.name),
                theme.title().add_modifier(Modifier::BOLD),
            ),
            Span::raw(" "),
            Span::styled(detail.status.as_str(), theme.status(detail.status)),
            Span::raw("  health "),
            health_cell(detail.health.state, 8, theme),
            Span::raw(format!(
                "  seen {} ago  {}  {}",
                ago(
                    detail.last_seen_ms,
                    now.max(detail.last_seen_ms.unwrap_or(0))
                ),
                labels.join(","),
                if error_of(model).is_some() {
                    "(refresh failed)"
                } else {
                    ""
                }
            )),
        ]),
        Line::raw(format!(
            " host {}  driver {}  CUDA {}  CPUs {}  CPU {}  RAM {}/{}  agent {} ({})",
            h.hostname,
            h.driver_version.as_deref().unwrap_or(NA),
            h.cuda_driver_version.as_deref().unwrap_or(NA),
            h.cpu_count.map_or_else(|| NA.to_owned(), |c| c.to_string()),
            pct(host_now.and_then(|l| l.cpu_util_pct).map(f64::from)),
            bytes(host_now.and_then(|l| l.mem_used_bytes)),
            bytes(host_now.and_then(|l| l.mem_total_bytes)),
            detail.agent_version,
            detail.source,
        )),
    ])
    .render(info, buf);

    // The GPU table, like nvidia-smi's.
    let mut lines = vec![Line::styled(
        format!(
            "{:<5}{:<22}{:<9}{:<17}{:<7}{:<7}{:<17}{:<17}{:<6}{:<5}{:<5}{:<9}{}",
            " GPU",
            "NAME",
            "HEALTH",
            "UTIL",
            "SMACT",
            "TENSOR",
            "MEMORY",
            "POWER / CAP",
            "TEMP",
            "FAN",
            "PERF",
            "SM CLK",
            "ECC"
        ),
        theme.title(),
    )];
    for g in &detail.gpus {
        let l = g.latest.as_ref().map(|l| &l.sample);
        let util = l.and_then(|l| l.util_gpu_pct).map(f64::from);
        let mem = (
            l.and_then(|l| l.mem_used_bytes),
            l.and_then(|l| l.mem_total_bytes),
        );
        let mem_f = frac(mem.0.map(|u| u as f64), mem.1.map(|t| t as f64));
        let power = l.and_then(|l| l.power_mw).map(f64::from);
        let cap = l.and_then(|l| l.power_limit_mw).map(f64::from);
        let temp = l.and_then(|l| l.temp_gpu_c);
        lines.push(Line::from(vec![
            Span::raw(format!(" {:<4}", g.index)),
            Span::raw(fit(&g.name, 21)),
            Span::raw(" "),
            health_cell(g.health.state, 9, theme),
            Span::styled(
                format!(
                    "[{}]{:>5} ",
                    format::bar(util.map(|u| u / 100.0), 10),
                    pct(util)
                ),
                theme.level(util.map(|u| u / 100.0)),
            ),
            // GPM (Hopper and newer): SMs active and tensor-core activity; n/a before.
            Span::raw(fit(&pct(gpm_pct(l.and_then(|l| l.gpm.sm_active_cpct))), 7)),
            Span::styled(
                fit(&pct(gpm_pct(l.and_then(|l| l.gpm.tensor_active_cpct))), 7),
                theme.level(gpm_pct(l.and_then(|l| l.gpm.tensor_active_cpct)).map(|t| t / 100.0)),
            ),
            Span::styled(
                fit(&format!("{} / {}", bytes(mem.0), bytes(mem.1)), 17),
                theme.level(mem_f),
            ),
            Span::styled(
                fit(&format!("{} / {}", watts_mw(power), watts_mw(cap)), 17),
                theme.level(frac(power, cap)),
            ),
            Span::styled(
                fit(&celsius(temp), 6),
                theme.level(temp.map(|t| f64::from(t) / TEMP_FULL_C)),
            ),
            Span::raw(fit(&pct(l.and_then(|l| l.fan_pct).map(f64::from)), 5)),
            Span::raw(fit(
                &l.and_then(|l| l.pstate)
                    .map_or_else(|| NA.to_owned(), |p| format!("P{p}")),
                5,
            )),
            Span::raw(fit(
                &l.and_then(|l| l.clock_sm_mhz)
                    .map_or_else(|| NA.to_owned(), |c| format!("{c}MHz")),
                9,
            )),
            Span::raw(
                l.and_then(|l| l.ecc_uncorrected_volatile)
                    .map_or_else(|| NA.to_owned(), |e| e.to_string()),
            ),
        ]));
    }
    Paragraph::new(lines).render(gpu_area, buf);

    if reason_lines > 0 {
        let mut lines = vec![Line::styled(
            format!(
                "{:<5}{:<10}{}",
                " GPU", "HEALTH", "WHAT IS WRONG → WHAT TO DO"
            ),
            theme.title(),
        )];
        for (gpu, r) in reasons.iter().take(MAX_REASON_LINES) {
            let gpu = if *gpu == u32::MAX {
                "node".to_owned()
            } else {
                gpu.to_string()
            };
            lines.push(Line::from(vec![
                Span::raw(format!(" {gpu:<4}")),
                Span::styled(fit(r.severity.as_str(), 10), theme.health(r.severity)),
                Span::raw(format!("{} → {}", r.summary, r.action)),
            ]));
        }
        Paragraph::new(lines).render(health_area, buf);
    }

    // Processes, with who they belong to.
    let index_of = |uuid: &str| {
        detail
            .gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .map_or_else(|| "?".to_owned(), |g| g.index.to_string())
    };
    let procs: Vec<&gpufleet_core::ProcessSample> = detail
        .gpus
        .iter()
        .flat_map(|g| g.processes.iter())
        .collect();
    let rows = usize::from(proc_area.height.saturating_sub(1)).max(1);
    app.page = rows;
    app.scroll = app.scroll.min(procs.len().saturating_sub(rows));
    let mut lines = vec![Line::styled(
        format!(
            "{:<5}{:<8}{:<10}{:<10}{:<24}{:<26}{:<9}{:<5}{}",
            " GPU",
            "PID",
            "USER",
            "KIND",
            "CONTAINER / UNIT",
            "POD / JOB",
            "GPU MEM",
            "SM",
            "COMMAND"
        ),
        theme.title(),
    )];
    for p in procs.iter().skip(app.scroll).take(rows) {
        let w = &p.workload;
        let place = match (&w.namespace, &w.pod_name, &w.job_id) {
            (Some(ns), Some(pod), _) => format!("{ns}/{pod}"),
            (None, Some(pod), _) => pod.clone(),
            (_, None, Some(job)) => format!(
                "job {job}{}{}",
                w.step
                    .as_deref()
                    .map(|s| format!(".{s}"))
                    .unwrap_or_default(),
                w.account
                    .as_deref()
                    .map(|a| format!(" {a}"))
                    .unwrap_or_default()
            ),
            _ => String::new(),
        };
        lines.push(Line::raw(format!(
            " {:<4}{:<8}{}{}{}{}{:<9}{:<5}{}",
            index_of(&p.gpu_uuid),
            p.pid,
            fit(p.user.as_deref().unwrap_or(NA), 9) + " ",
            fit(w.kind.as_str(), 9) + " ",
            fit(&w.label(), 23) + " ",
            fit(&place, 25) + " ",
            bytes(p.gpu_mem_bytes),
            pct(p.sm_util_pct.map(f64::from)),
            p.command.as_deref().unwrap_or(NA),
        )));
    }
    if procs.is_empty() {
        lines.push(Line::styled(
            "  no processes on this node's GPUs",
            theme.dim(),
        ));
    } else if procs.len() > rows {
        lines.push(Line::styled(
            format!("  … {} processes (↑↓ to scroll)", procs.len()),
            theme.dim(),
        ));
    }
    Paragraph::new(lines).render(proc_area, buf);

    // Events of the last hour, newest first.
    let mut lines = vec![Line::styled(
        format!(
            "{:<11}{:<5}{:<16}{:<7}{}",
            " TIME UTC", "GPU", "EVENT (last 1h)", "CODE", "DETAIL"
        ),
        theme.title(),
    )];
    if let Some(e) = pane.and_then(|p| p.events_error.as_deref()) {
        lines.push(Line::styled(format!("  {e}"), theme.fg(Color::Red)));
    }
    match pane.and_then(|p| p.events.as_ref()) {
        None if pane.is_some_and(|p| p.events_error.is_some()) => {}
        None => lines.push(Line::styled("  loading events…", theme.dim())),
        Some(ev) if ev.events.is_empty() => {
            lines.push(Line::styled("  no events in the last hour", theme.dim()));
        }
        Some(ev) => {
            for e in ev.events.iter().rev() {
                let gpu = if e.event.gpu_uuid.is_empty() {
                    "-".to_owned()
                } else {
                    index_of(&e.event.gpu_uuid)
                };
                // An Xid says what it is and what to do before the driver's text.
                let what = e
                    .explanation
                    .as_ref()
                    .map_or_else(String::new, |x| format!("{} — {} | ", x.name, x.action));
                lines.push(Line::styled(
                    format!(
                        " {:<10}{:<5}{:<16}{:<7}{what}{}",
                        clock(e.event.time_ms),
                        gpu,
                        e.event.kind.as_str(),
                        e.event.code.map_or_else(String::new, |c| c.to_string()),
                        e.event.detail
                    ),
                    theme.fg(Color::Yellow),
                ));
            }
        }
    }
    Paragraph::new(lines).render(event_area, buf);
}

fn error_of(model: &Model) -> Option<&str> {
    model.node.as_ref().and_then(|p| p.error.as_deref())
}

/// Today's energy per workload; `rows` caps the table (`--once`), else it scrolls.
pub fn energy(
    area: Rect,
    buf: &mut Buffer,
    app: &mut App,
    model: &Model,
    theme: Theme,
    rows: Option<usize>,
) {
    let Some(e) = &model.energy else {
        Paragraph::new(Line::styled("  loading today's energy…", theme.dim())).render(area, buf);
        return;
    };
    let total_j: f64 = e.rows.iter().map(|r| r.energy_j).fold(0.0, |a, b| a + b);
    let total_g = e
        .rows
        .iter()
        .filter_map(|r| r.carbon_g)
        .reduce(|a, b| a + b);
    let mut lines = vec![
        Line::raw(format!(
            " Today since {} UTC: {} · {} CO2 · {} workloads",
            clock(e.from_ms),
            energy_j(total_j),
            carbon_g(total_g),
            e.rows.len()
        )),
        Line::styled(
            format!(
                "{:<26}{:<10}{:<28}{:<8}{:<10}{:<12}{:<7}{:<8}{:<10}",
                " WORKLOAD",
                "KIND",
                "POD / JOB",
                "NODES",
                "GPU-HOURS",
                "ENERGY",
                "IDLE",
                "TENSOR",
                "CO2"
            ),
            theme.title(),
        ),
    ];
    let fits = usize::from(area.height.saturating_sub(2)).max(1);
    let shown = rows.unwrap_or(fits);
    if rows.is_none() {
        app.page = fits;
        app.scroll = app.scroll.min(e.rows.len().saturating_sub(fits));
    }
    let skip = if rows.is_some() { 0 } else { app.scroll };
    for r in e.rows.iter().skip(skip).take(shown) {
        let w = &r.identity;
        let place = match (&w.namespace, &w.pod_name, &w.job_id) {
            (Some(ns), Some(pod), _) => format!("{ns}/{pod}"),
            (_, Some(pod), _) => pod.clone(),
            (_, None, Some(job)) => match &w.account {
                Some(a) => format!("job {job} {a}"),
                None => format!("job {job}"),
            },
            _ => String::new(),
        };
        let idle = (r.energy_j > 0.0).then(|| 100.0 * r.idle_j / r.energy_j);
        lines.push(Line::raw(format!(
            " {}{}{}{:<8}{:<10}{:<12}{:<7}{:<8}{}",
            fit(&w.label(), 24) + " ",
            fit(w.kind.as_str(), 9) + " ",
            fit(&place, 27) + " ",
            r.nodes.len(),
            format!("{:.1}", r.gpu_seconds / 3600.0),
            energy_j(r.energy_j),
            pct(idle),
            pct(r.tensor_active_pct),
            carbon_g(r.carbon_g),
        )));
    }
    if e.rows.is_empty() {
        lines.push(Line::styled(
            "  no workload has used energy today yet",
            theme.dim(),
        ));
    }
    Paragraph::new(lines).render(area, buf);
}

/// A GPM activity (hundredths of a percent) in percent.
fn gpm_pct(cpct: Option<u32>) -> Option<f64> {
    cpct.map(|c| f64::from(c) / 100.0)
}

/// The lines `--once` prints: the header, every node (`filter` and sort applied), and
/// today's energy per workload (top 20), `width` columns wide, without colour.
pub fn once_text(app: &mut App, model: &Model, width: u16) -> String {
    let nodes = u16::try_from(app.visible(&model.fleet).len()).unwrap_or(u16::MAX / 2);
    let energy_rows = model
        .energy
        .as_ref()
        .map_or(1, |e| e.rows.len().clamp(1, 20));
    let energy_h = u16::try_from(energy_rows).unwrap_or(20) + 2;
    let filter_h = u16::from(!app.filter.is_empty());
    let list_h = nodes.max(1).saturating_add(1 + filter_h);
    let height = list_h.saturating_add(2 + 1 + energy_h);
    let area = Rect::new(0, 0, width.max(20), height);
    let mut buf = Buffer::empty(area);
    let theme = Theme { color: false };
    let [head, list, gap, en] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(list_h),
        Constraint::Length(1),
        Constraint::Length(energy_h),
    ])
    .areas(area);
    header(head, &mut buf, model, theme);
    let mut a = app.clone();
    a.select = false;
    fleet(list, &mut buf, &mut a, model, theme);
    let _ = gap;
    energy(en, &mut buf, app, model, theme, Some(energy_rows));
    buffer_text(&buf)
}

/// A buffer's text, one line per row, trailing blanks cut.
pub fn buffer_text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut line = String::new();
        for x in area.left()..area.right() {
            if let Some(c) = buf.cell((x, y)) {
                line.push_str(c.symbol());
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
