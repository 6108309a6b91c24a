// The energy page: who spent the GPUs' energy and carbon over a range (default: today).
// Fleet totals (/api/v1/energy), a sortable table per container / pod / namespace / job /
// user (/api/v1/containers?group_by=) or node (/api/v1/energy's nodes), a workload's energy
// per minute (/api/v1/containers/{key}), and each region's carbon intensity with its
// forecast. View state (range, group, sort, selected workload) lives in the URL.
import {
  enc, getJson, type ContainerRow, type ContainersView, type ContainerView, type EnergyTotals, type EnergyView, type MethodMix,
} from './api';
import { carbonG, co2, kwh, provenanceMarks, sourcesText, type CarbonFields } from './carbon';
import { Chart } from './chart';
import { clear, el, NA, num } from './dom';
import { intensitySection } from './intensity';
import { currentRange, ENERGY_RANGES, rangePicker, type Range } from './range';
import { nameOf } from './workload';

const GROUPS: [string, string][] = [
  ['container', 'containers'],
  ['pod', 'pods'],
  ['namespace', 'namespaces'],
  ['job', 'Slurm jobs'],
  ['account', 'Slurm accounts'],
  ['user', 'users'],
  ['node', 'nodes'],
];

/** One table row, whatever it groups (client-side: built from ContainerRow or a node's
 * EnergyTotals). */
interface Row extends CarbonFields {
  key: string;
  label: string;
  sub: string;
  kind: string;
  nodes: string[];
  gpus: number;
  gpuNames: string;
  energyJ: number;
  energyKwh: number;
  /** Allocated but idle: idle energy of the GPUs while held (workloads), or all idle (nodes). */
  idleJ: number;
  gpuSeconds: number;
  method: MethodMix;
  /** Workload keys for the detail chart (empty: not a workload, e.g. a node). */
  workloads: string[];
}

type SortKey = 'label' | 'energy' | 'idle' | 'carbon' | 'gpu_seconds' | 'gpus';
const COLUMNS: [SortKey | null, string][] = [
  ['label', 'workload'],
  [null, 'kind'],
  [null, 'nodes'],
  ['gpus', 'GPUs'],
  ['energy', 'energy'],
  ['idle', 'idle'],
  ['carbon', 'CO2'],
  ['gpu_seconds', 'GPU time'],
  [null, 'marks'],
  [null, 'measured by'],
];

function label(r: ContainerRow): [string, string] {
  const w = r.identity;
  const [prefix, rest] = [r.key.slice(0, r.key.indexOf(':')), r.key.slice(r.key.indexOf(':') + 1)];
  switch (prefix) {
    case 'pod':
      return [w.pod_name ?? `pod ${rest.slice(0, 8)}`, w.namespace ? `namespace ${w.namespace}` : `pod ${rest}`];
    case 'namespace':
      return [rest, 'namespace'];
    case 'account':
      return [rest, 'Slurm account'];
    case 'user':
      return [rest, 'user'];
    case 'slurm': {
      const n = nameOf(w);
      return [n.name, ['Slurm', n.detail].filter(Boolean).join(' · ')];
    }
    case 'host':
      return [rest, 'host'];
    case 'container': {
      const n = nameOf(w);
      return [n.name, [w.runtime, n.detail].filter(Boolean).join(' · ')];
    }
    default:
      return [r.key, ''];
  }
}

function workloadRows(rows: ContainerRow[]): Row[] {
  return rows.map((r) => {
    const [l, sub] = label(r);
    return {
      key: r.key,
      label: l,
      sub,
      kind: r.identity.kind,
      nodes: r.nodes,
      gpus: r.gpus.length,
      gpuNames: r.gpus.map((g) => `${g.node} GPU ${g.index} (${g.name})`).join('\n'),
      energyJ: r.energy_j,
      energyKwh: r.energy_kwh,
      idleJ: r.idle_j,
      gpuSeconds: r.gpu_seconds,
      method: r.method,
      workloads: r.workloads,
      carbon_g: r.carbon_g,
      carbon: r.carbon,
    };
  });
}

function nodeRows(e: EnergyView): Row[] {
  return Object.entries(e.nodes).map(([name, t]) => {
    const gpus = e.gpus.filter((g) => g.node === name);
    return {
      key: `node:${name}`,
      label: name,
      sub: 'node',
      kind: 'node',
      nodes: [name],
      gpus: gpus.length,
      gpuNames: gpus.map((g) => `GPU ${g.index} (${g.name})`).join('\n'),
      energyJ: t.energy_j,
      energyKwh: t.energy_kwh,
      idleJ: t.idle_j,
      gpuSeconds: t.covered_seconds,
      method: t.method,
      workloads: [],
      carbon_g: t.carbon_g,
      carbon: t.carbon,
    };
  });
}

function sortRows(rows: Row[], key: SortKey, dir: 'asc' | 'desc'): Row[] {
  const v = (r: Row): number | string | null => {
    switch (key) {
      case 'label': return r.label.toLowerCase();
      case 'energy': return r.energyJ;
      case 'idle': return r.idleJ;
      case 'carbon': return carbonG(r);
      case 'gpu_seconds': return r.gpuSeconds;
      case 'gpus': return r.gpus;
    }
  };
  const sign = dir === 'asc' ? 1 : -1;
  return [...rows].sort((a, b) => {
    const x = v(a);
    const y = v(b);
    if (x === null || y === null) return x === y ? 0 : x === null ? 1 : -1; // n/a last
    if (x < y) return -sign;
    if (x > y) return sign;
    return a.key < b.key ? -1 : 1;
  });
}

function duration(s: number): string {
  if (s < 120) return `${s.toFixed(0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function methodText(m: MethodMix): string {
  const all = m.counter_j + m.trapezoid_j;
  if (all <= 0) return NA;
  const c = Math.round((100 * m.counter_j) / all);
  return c === 100 ? 'counter' : c === 0 ? 'power (integrated)' : `counter ${c}% · power ${100 - c}%`;
}

function share(part: number, whole: number): string {
  return whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : NA;
}

function totalsBox(t: EnergyTotals, r: Range): HTMLElement {
  const item = (key: string, name: string, value: string, title?: string, exact?: number | null) =>
    el('div', { class: 'total', 'data-total': key, 'data-value': exact === undefined || exact === null ? undefined : String(exact), title },
      el('span', { class: 'muted' }, name), el('strong', {}, value));
  const when = r.key === 'today' ? 'today (UTC)' : r.key === 'custom' ? 'in range' : `last ${r.key}`;
  return el('div', { class: 'energy-totals', id: 'energy-totals' },
    item('energy', `energy ${when}`, kwh(t.energy_kwh), undefined, t.energy_j),
    item('co2', 'CO2', co2(carbonG(t)), sourcesText(t) ?? undefined, carbonG(t)),
    item('intensity', 'average intensity', t.carbon?.avg_g_per_kwh == null ? NA : `${Math.round(t.carbon.avg_g_per_kwh)} g/kWh`, sourcesText(t) ?? undefined, t.carbon?.avg_g_per_kwh),
    item('gpu-hours', 'GPU-hours measured', num(t.covered_seconds / 3600, 2)),
    item('avg-power', 'average power per GPU', t.avg_power_w === null || t.avg_power_w === undefined ? NA : `${t.avg_power_w.toFixed(0)} W`),
    item('idle', 'idle', share(t.idle_j, t.energy_j), `${(t.idle_j / 3.6e6).toFixed(4)} kWh: the idle baseline over the time GPUs did no work; ${(t.idle_charged_j / 3.6e6).toFixed(4)} kWh charged to the workloads holding them, ${(t.idle_bucket_j / 3.6e6).toFixed(4)} kWh to no one`, t.idle_j),
    item('unattributed', 'unattributed', share(t.unattributed_j, t.energy_j), `${(t.unattributed_j / 3.6e6).toFixed(4)} kWh of activity with no process listed`, t.unattributed_j),
    item('provisional', 'provisional', share(t.provisional_j, t.energy_j), `${(t.provisional_j / 3.6e6).toFixed(4)} kWh in minutes still open: final a few seconds after each minute ends`, t.provisional_j),
    item('missing', 'missing time', duration(t.missing_seconds), 'GPU time not measured (agent down, gaps): no energy is invented for it'),
    el('div', { class: 'total marks' }, ...provenanceMarks(t)));
}

export async function energyPage(app: HTMLElement, navigate: (url: string) => void): Promise<() => void> {
  const q = new URLSearchParams(location.search);
  const r = currentRange(Date.now(), ENERGY_RANGES);
  const groupBy = GROUPS.some(([g]) => g === q.get('group_by')) ? (q.get('group_by') as string) : 'container';
  let sortKey = (COLUMNS.some(([k]) => k && k === q.get('sort')) ? q.get('sort') : 'energy') as SortKey;
  let sortDir: 'asc' | 'desc' = q.get('dir') === 'asc' ? 'asc' : 'desc';
  const range = `from=${r.fromMs}&to=${r.toMs}`;

  /** The same page with some query parameters changed (null: removed). */
  const urlWith = (changes: Record<string, string | null>): string => {
    const n = new URLSearchParams(location.search);
    for (const [k, v] of Object.entries(changes)) {
      if (v === null) n.delete(k);
      else n.set(k, v);
    }
    const s = n.toString();
    return `/energy${s ? '?' + s : ''}`;
  };

  const [energy, containers] = await Promise.all([
    getJson<EnergyView>(`/api/v1/energy?${range}`),
    groupBy === 'node' ? Promise.resolve(null)
      : getJson<ContainersView>(`/api/v1/containers?${range}&group_by=${enc(groupBy)}`),
  ]);
  const rows = containers ? workloadRows(containers.rows) : nodeRows(energy);

  const groupSel = el('select', { id: 'group-by', 'aria-label': 'group by' },
    ...GROUPS.map(([g, text]) => el('option', { value: g }, `per ${text.replace(/s$/, '')}`)));
  groupSel.value = groupBy;
  groupSel.addEventListener('change', () => navigate(urlWith({ group_by: groupSel.value === 'container' ? null : groupSel.value, workload: null })));

  const table = el('table', { id: 'energy-table', class: 'energy', 'data-group-by': groupBy });
  const detail = el('section', { id: 'workload-detail', class: 'detail' });
  let detailChart: Chart[] = [];
  const closeDetail = () => {
    detailChart.forEach((c) => c.destroy());
    detailChart = [];
    clear(detail);
  };

  const showDetail = async (row: Row): Promise<void> => {
    closeDetail();
    for (const tr of table.querySelectorAll('tr.selected')) tr.classList.remove('selected');
    table.querySelector(`tr[data-key="${CSS.escape(row.key)}"]`)?.classList.add('selected');
    detail.append(el('h3', {}, row.label, ' ', el('span', { class: 'muted' }, row.key)));
    const keys = row.workloads.slice(0, 50);
    const parts = await Promise.all(keys.map((k) => getJson<ContainerView>(`/api/v1/containers/${enc(k)}?${range}`)
      .catch(() => null)));
    // All GPUs and workloads of the row, per minute. The API prices carbon per row, not per
    // minute (MinutePoint has no carbon_g): the row's CO2 is in the line above the chart.
    const byMinute = new Map<number, number>();
    for (const p of parts) {
      for (const m of p?.series ?? []) byMinute.set(m.minute_ms, (byMinute.get(m.minute_ms) ?? 0) + m.energy_j);
    }
    const xs = [...byMinute.keys()].sort((a, b) => a - b);
    const gpus = [...new Set(parts.flatMap((p) => p?.gpus ?? []).map((g) => `${g.node} GPU ${g.index} · ${g.name}`))];
    detail.append(el('p', { class: 'muted' },
      `${kwh(row.energyKwh)} · CO2 ${co2(carbonG(row))} · ${duration(row.gpuSeconds)} of GPU time · `,
      `${gpus.length} GPU${gpus.length === 1 ? '' : 's'}: ${gpus.join(', ') || NA}`));
    const energyChart = new Chart({ title: 'energy per minute', unit: 'Wh', series: [{ label: 'energy' }], fmt: (v) => `${v.toFixed(2)} Wh`, height: 200 });
    detailChart = [energyChart];
    detail.append(el('div', { class: 'panels' }, ...detailChart.map((c) => c.root)));
    for (const c of detailChart) c.mount();
    energyChart.setData(xs, [xs.map((x) => (byMinute.get(x) as number) / 3600)]);
  };

  const renderTable = (): void => {
    clear(table);
    const head = el('tr', {});
    for (const [k, text] of COLUMNS) {
      if (!k) {
        head.append(el('th', {}, text));
        continue;
      }
      const arrow = k === sortKey ? (sortDir === 'asc' ? ' ▲' : ' ▼') : '';
      const th = el('th', { class: 'sortable', 'data-sort': k, 'aria-sort': k === sortKey ? (sortDir === 'asc' ? 'ascending' : 'descending') : 'none' },
        groupBy === 'node' && k === 'label' ? 'node' : text, arrow);
      th.addEventListener('click', () => {
        sortDir = k === sortKey ? (sortDir === 'asc' ? 'desc' : 'asc') : k === 'label' ? 'asc' : 'desc';
        sortKey = k;
        history.replaceState(null, '', urlWith({ sort: sortKey === 'energy' ? null : sortKey, dir: sortDir === 'desc' ? null : sortDir }));
        renderTable();
      });
      head.append(th);
    }
    const body = el('tbody');
    let sumJ = 0;
    let sumG: number | null = null;
    for (const row of sortRows(rows, sortKey, sortDir)) {
      sumJ += row.energyJ;
      const g = carbonG(row);
      if (g !== null) sumG = (sumG ?? 0) + g;
      const name = row.workloads.length > 0
        ? el('a', { href: urlWith({ workload: row.key }), class: 'workload', title: row.key }, row.label)
        : el('a', { href: `/node/${enc(row.label)}`, title: row.key }, row.label);
      const tr = el('tr', { 'data-key': row.key, 'data-energy-j': String(row.energyJ), 'data-carbon-g': g === null ? '' : String(g) },
        el('td', {}, name, row.sub ? el('div', { class: 'muted' }, row.sub) : null),
        el('td', {}, row.kind),
        el('td', {}, row.nodes.join(', ')),
        el('td', { title: row.gpuNames }, String(row.gpus)),
        el('td', { class: 'num', 'data-col': 'energy' }, kwh(row.energyKwh)),
        el('td', { class: 'num', 'data-col': 'idle', 'data-idle-j': String(row.idleJ), title: 'allocated but idle: the idle energy of the GPUs while held (by GPU memory held)' }, kwh(row.idleJ / 3.6e6)),
        el('td', { class: 'num', 'data-col': 'co2', title: sourcesText(row) ?? undefined }, co2(g)),
        el('td', { class: 'num' }, duration(row.gpuSeconds)),
        el('td', { 'data-col': 'marks' }, ...provenanceMarks(row)),
        el('td', {}, methodText(row.method)));
      body.append(tr);
    }
    if (rows.length === 0) body.append(el('tr', {}, el('td', { colspan: String(COLUMNS.length) }, 'no energy accounted in this range yet')));
    const foot = el('tfoot', {}, el('tr', { id: 'energy-sum', 'data-energy-j': String(sumJ), 'data-carbon-g': sumG === null ? '' : String(sumG) },
      el('td', { colspan: '4' }, `${rows.length} ${groupBy === 'node' ? 'nodes' : 'rows'}`),
      el('td', { class: 'num', 'data-col': 'energy' }, kwh(sumJ / 3.6e6)),
      el('td', {}),
      el('td', { class: 'num', 'data-col': 'co2' }, co2(sumG)),
      el('td', { colspan: '3', class: 'note' }, groupBy === 'node' ? 'all GPUs' : 'attributed to workloads (the rest: idle, unattributed)')));
    table.append(el('thead', {}, head), body, foot);
  };

  const intensity = await intensitySection(r, energy.total);
  const conn = document.getElementById('conn');
  if (conn) {
    conn.textContent = '';
    conn.className = 'conn';
  }
  clear(app);
  app.append(
    el('h2', {}, 'Energy and carbon'),
    rangePicker(r, (qs) => {
      const n = new URLSearchParams(qs);
      navigate(urlWith({ range: n.get('range'), from: n.get('from'), to: n.get('to'), workload: null }));
    }, ENERGY_RANGES),
    totalsBox(energy.total, r),
    el('div', { class: 'toolbar' }, groupSel),
    table,
    detail,
    intensity.root);
  renderTable();
  intensity.mount();

  // A click anywhere on a workload's row opens its detail (a node's name links to its page).
  table.addEventListener('click', (e) => {
    const target = e.target as Element | null;
    const tr = target?.closest('tbody tr[data-key]');
    const row = tr ? rows.find((x) => x.key === tr.getAttribute('data-key')) : undefined;
    if (!row || row.workloads.length === 0) return;
    e.preventDefault();
    e.stopPropagation();
    history.pushState(null, '', urlWith({ workload: row.key }));
    void showDetail(row);
  });
  const selected = q.get('workload');
  const sel = selected ? rows.find((x) => x.key === selected) : undefined;
  if (sel) void showDetail(sel);
  return () => {
    closeDetail();
    intensity.destroy();
  };
}
