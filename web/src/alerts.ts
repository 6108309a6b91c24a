// The alerts page: firing and pending alerts (/api/v1/alerts), the recent state changes
// (/api/v1/alerts/history) and the rules evaluated (/api/v1/alerts/rules). Refreshed every
// few seconds while shown. Label and annotation values are text, never markup.
import { getJson, type AlertsView, type AlertView, type HistoryView, type RulesView, type RuleView, type TransitionView } from './api';
import { ago, clear, el, scrollBox } from './dom';
import { WORKLOAD_LABELS, workloadCell, workloadOfLabels } from './workload';

/** Labels other than the ones shown in their own columns. */
const OWN_COLUMNS = new Set(['alertname', 'severity']);

/** The labels, less those shown in their own columns (a workload's identity labels are
 * shown as its name, in the workload column). */
function labelList(labels: Record<string, string>): HTMLElement {
  const span = el('span', { class: 'labels' });
  const named = workloadOfLabels(labels) !== null;
  for (const [k, v] of Object.entries(labels)) {
    if (OWN_COLUMNS.has(k) || (named && WORKLOAD_LABELS.has(k))) continue;
    span.append(el('span', { class: 'label' }, `${k}=${v}`), ' ');
  }
  return span;
}

/** The workload an alert is about, by its name (ids on hover); empty when none. */
function workloadOf(labels: Record<string, string>): HTMLTableCellElement {
  const w = workloadOfLabels(labels);
  return w ? workloadCell(w, labels.workload) : el('td', { 'data-col': 'workload' });
}

function fmtValue(v: number): string {
  return Number.isInteger(v) ? String(v) : v.toFixed(2);
}

function alertsTable(alerts: AlertView[], now: number): HTMLElement {
  const table = el('table', { id: 'alerts-table', class: 'alerts' },
    el('thead', {}, el('tr', {}, ...['state', 'alert', 'severity', 'summary', 'workload', 'labels', 'value', 'since'].map((h) => el('th', { scope: 'col' }, h)))));
  const body = el('tbody');
  for (const a of alerts) {
    const since = a.state === 'firing' ? a.fired_at_ms ?? a.active_at_ms : a.active_at_ms;
    body.append(el('tr', { 'data-state': a.state, 'data-rule': a.rule, 'data-fingerprint': a.fingerprint },
      el('td', {}, el('span', { class: `badge alert-${a.state}` }, a.state)),
      el('td', {}, a.rule),
      el('td', { class: `sev-${a.severity ?? 'none'}` }, a.severity ?? ''),
      el('td', { class: 'summary' }, a.annotations.summary ?? ''),
      workloadOf(a.labels),
      el('td', {}, labelList(a.labels)),
      el('td', { class: 'num' }, fmtValue(a.value)),
      el('td', {}, ago(since, now))));
  }
  table.append(body);
  if (alerts.length === 0) body.append(el('tr', {}, el('td', { colspan: '8', id: 'alerts-none' }, 'no firing or pending alert')));
  return table;
}

function historyTable(rows: TransitionView[], now: number): HTMLElement {
  const table = el('table', { id: 'alerts-history', class: 'alerts' },
    el('thead', {}, el('tr', {}, ...['when', 'alert', 'change', 'workload', 'labels', 'value'].map((h) => el('th', { scope: 'col' }, h)))));
  const body = el('tbody');
  for (const t of rows) {
    body.append(el('tr', { 'data-to': t.to, 'data-rule': t.rule },
      el('td', { title: new Date(t.at_ms).toISOString() }, ago(t.at_ms, now)),
      el('td', {}, t.rule),
      el('td', {}, `${t.from} → ${t.to}`),
      workloadOf(t.labels),
      el('td', {}, labelList(t.labels)),
      el('td', { class: 'num' }, fmtValue(t.value))));
  }
  table.append(body);
  return table;
}

function rulesTable(rules: RuleView[]): HTMLElement {
  const table = el('table', { id: 'alerts-rules', class: 'alerts' },
    el('thead', {}, el('tr', {}, ...['rule', 'condition', 'for', 'severity'].map((h) => el('th', { scope: 'col' }, h)))));
  const body = el('tbody');
  for (const r of rules) {
    body.append(el('tr', { 'data-rule': r.name },
      el('td', {}, r.name), el('td', { class: 'cmd' }, r.condition), el('td', {}, `${r.for_seconds}s`), el('td', {}, r.severity)));
  }
  table.append(body);
  return table;
}

export async function alertsPage(app: HTMLElement): Promise<() => void> {
  const draw = async (): Promise<void> => {
    const [current, history, rules] = await Promise.all([
      getJson<AlertsView>('/api/v1/alerts?state=firing,pending'),
      getJson<HistoryView>('/api/v1/alerts/history?limit=200'),
      getJson<RulesView>('/api/v1/alerts/rules'),
    ]);
    const now = Date.now();
    const firing = current.alerts.filter((a) => a.state === 'firing').length;
    const pending = current.alerts.length - firing;
    clear(app);
    app.append(
      el('h1', {}, 'Alerts'),
      el('p', { id: 'alerts-counts' },
        el('strong', { 'data-firing': String(firing) }, `${firing} firing`), ', ',
        el('span', { 'data-pending': String(pending) }, `${pending} pending`)),
      scrollBox('current alerts', alertsTable(current.alerts, now)),
      el('h2', {}, 'History'),
      scrollBox('alert history', historyTable(history.transitions, now)),
      el('h2', {}, 'Rules'),
      scrollBox('alert rules', rulesTable(rules.rules)));
  };
  await draw();
  const timer = setInterval(() => void draw().catch(() => undefined), 5000);
  return () => clearInterval(timer);
}
