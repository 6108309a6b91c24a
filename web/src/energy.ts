// The energy page: who spent the GPUs' energy and carbon over a range (default: today).
// Fleet totals (/api/v1/energy), a sortable table per container / pod / namespace / job /
// user (/api/v1/containers?group_by=, with GPM's tensor activity where the GPUs report
// it) or node (/api/v1/energy's nodes), a workload's energy
// per minute (/api/v1/containers/{key}), and each region's carbon intensity with its
// forecast. Above the table, the range's energy over time (/api/v1/energy/series) as a
// stacked chart: the biggest groups, the rest, idle and unattributed; a band (clicked on
// the chart or its legend) filters the table. View state (range, group, sort, band,
// selected workload) lives in the URL.
import {
  enc, getJson, type ContainerRow, type ContainersView, type ContainerView, type EnergyBand, type EnergySeriesView, type EnergyTotals,
  type EnergyView, type MethodMix,
} from './api';
import { carbonG, co2, kwh, provenanceMarks, sourcesText, type CarbonFields } from './carbon';
import { Chart } from './chart';
import { clear, el, NA, num, scrollBox } from './dom';
import { pct1 } from './gpm';
import { intensitySection } from './intensity';
import { currentRange, ENERGY_RANGES, rangePicker, type Range } from './range';
import { StackChart, type StackBand } from './stack';
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
  /** GPM (Hopper and newer): its tensor-core activity and SM occupancy (percent) over
   * `gpmSeconds` of GPU time; null where none of its GPUs reports GPM (nodes: not given). */
  tensorPct: number | null;
  smOccupancyPct: number | null;
  gpmSeconds: number;
}

type SortKey = 'label' | 'energy' | 'idle' | 'carbon' | 'gpu_seconds' | 'gpus' | 'tensor';
/** The columns that matter, so the table fits the window; a row's kind and carbon marks
 * are under its name, how it was measured on the energy cell's hover, the rest on its own
 * page (the row's detail). */
const COLUMNS: [SortKey | null, string][] = [
  ['label', 'workload'],
  [null, 'nodes'],
  ['gpus', 'GPUs'],
  ['energy', 'energy'],
  ['idle', 'idle'],
  ['carbon', 'CO2'],
  ['gpu_seconds', 'GPU time'],
  ['tensor', 'Tensor active'],
];
const NUMERIC = new Set<SortKey | null>(['gpus', 'energy', 'idle', 'carbon', 'gpu_seconds', 'tensor']);
/** What a column's header says on hover. */
const COLUMN_TITLES: Partial<Record<SortKey, string>> = {
  tensor: 'Tensor-core activity from GPM (GPU Performance Monitoring, Hopper and newer GPUs): the workload\'s time-weighted '
    + 'share of its GPUs\' tensor activity, of the tensor cores\' peak. Exact on a GPU of its own, an estimate on shared GPUs; '
    + 'n/a where none of its GPUs reports GPM.',
};

/** The table's columns for a grouping: nodes have no tensor figure (the API gives it per
 * workload), so their table leaves that column out. */
function columnsFor(groupBy: string): [SortKey | null, string][] {
  return groupBy === 'node' ? COLUMNS.filter(([k]) => k !== 'tensor') : COLUMNS;
}

/** The chart's pseudo-bands: their colours and names. */
const BAND_STYLE: Record<string, [string, string]> = {
  other: ['--band-other', 'other'],
  unattributed: ['--band-unattributed', 'unattributed (no process listed)'],
  idle: ['--band-idle', 'idle (charged to no workload)'],
};

/** A band's name: a group's as its table row names it (the rows hold the group's
 * identity), else the API's key. */
function bandLabel(b: EnergyBand, rows: Row[]): string {
  if (b.kind !== 'group') return BAND_STYLE[b.kind]?.[1] ?? b.key;
  return rows.find((r) => r.key === b.key)?.label ?? (b.key.startsWith('node:') ? b.key.slice(5) : b.key);
}

/** kWh per bucket, with the precision its size needs. */
function kwhAxis(v: number): string {
  const a = Math.abs(v);
  return `${v.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : a >= 0.1 ? 3 : 4)} kWh`;
}

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
      tensorPct: r.tensor_active_pct ?? null,
      smOccupancyPct: r.sm_occupancy_pct ?? null,
      gpmSeconds: r.gpm_seconds,
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
      tensorPct: null,
      smOccupancyPct: null,
      gpmSeconds: 0,
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
      case 'tensor': return r.tensorPct;
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

/** A tensor cell's hover: its SM occupancy and the GPU time the GPM figures cover. */
function tensorTitle(r: Row): string {
  if (r.tensorPct === null) return 'n/a: none of its GPUs reports GPM (Hopper and newer do)';
  return `tensor-core activity ${pct1(r.tensorPct)}, SM occupancy ${pct1(r.smOccupancyPct)} (GPM), over ${duration(r.gpmSeconds)} of GPU time; `
    + 'an estimate on shared GPUs';
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
  const columns = columnsFor(groupBy);
  let sortKey = (columns.some(([k]) => k && k === q.get('sort')) ? q.get('sort') : 'energy') as SortKey;
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

  const [energy, containers, series] = await Promise.all([
    getJson<EnergyView>(`/api/v1/energy?${range}`),
    groupBy === 'node' ? Promise.resolve(null)
      : getJson<ContainersView>(`/api/v1/containers?${range}&group_by=${enc(groupBy)}`),
    // The chart is an addition: the table stands without it.
    getJson<EnergySeriesView>(`/api/v1/energy/series?${range}&group_by=${enc(groupBy)}`).catch((e: unknown) => e instanceof Error ? e : new Error(String(e))),
  ]);
  const rows = containers ? workloadRows(containers.rows) : nodeRows(energy);
  /** The band the table is filtered by (`?band=`): a group's key, or `other`. */
  const bands = series instanceof Error ? [] : series.bands;
  let band = bands.some((b) => b.key === q.get('band') && (b.kind === 'group' || b.kind === 'other')) ? q.get('band') : null;

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

  /** The rows a band stands for: its group's, or (`other`) those without a band. */
  const inBand = (row: Row): boolean => {
    if (!band) return true;
    if (band === 'other') return !bands.some((b) => b.kind === 'group' && b.key === row.key);
    return row.key === band;
  };
  const bandNote = el('p', { class: 'filtered muted', id: 'band-filter', role: 'status' });

  const renderTable = (): void => {
    clear(table);
    clear(bandNote);
    const head = el('tr', {});
    for (const [k, text] of columns) {
      const numCls = NUMERIC.has(k) ? 'num' : '';
      if (!k) {
        head.append(el('th', { scope: 'col', class: numCls }, text));
        continue;
      }
      const arrow = k === sortKey ? (sortDir === 'asc' ? ' ▲' : ' ▼') : '';
      // A button in the header: sorting by keyboard too.
      const button = el('button', { type: 'button' }, groupBy === 'node' && k === 'label' ? 'node' : text, arrow);
      const th = el('th', { scope: 'col', class: `sortable ${numCls}`, 'data-sort': k, 'aria-sort': k === sortKey ? (sortDir === 'asc' ? 'ascending' : 'descending') : 'none',
        title: COLUMN_TITLES[k] }, button);
      button.addEventListener('click', () => {
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
    const shown = rows.filter(inBand);
    if (band) {
      const b = bands.find((x) => x.key === band);
      const clearBtn = el('button', { type: 'button', id: 'band-clear' }, 'show all');
      clearBtn.addEventListener('click', () => pickBand(null));
      bandNote.append(`showing ${shown.length} of ${rows.length} rows: ${b ? bandLabel(b, rows) : band} `, clearBtn);
    }
    for (const row of sortRows(shown, sortKey, sortDir)) {
      sumJ += row.energyJ;
      const g = carbonG(row);
      if (g !== null) sumG = (sumG ?? 0) + g;
      const name = row.workloads.length > 0
        ? el('a', { href: urlWith({ workload: row.key }), class: 'workload', title: row.key }, row.label)
        : el('a', { href: `/node/${enc(row.label)}`, title: row.key }, row.label);
      const marks = provenanceMarks(row);
      const sub = [row.kind !== 'node' ? row.kind : '', row.sub].filter(Boolean).join(' · ');
      const tr = el('tr', { 'data-key': row.key, 'data-energy-j': String(row.energyJ), 'data-carbon-g': g === null ? '' : String(g),
        'data-tensor-pct': row.tensorPct === null ? '' : String(row.tensorPct) },
        el('td', { class: 'name' }, name, sub ? el('div', { class: 'muted' }, sub) : null,
          marks.length ? el('div', { 'data-col': 'marks' }, ...marks) : null),
        el('td', { class: 'name', title: row.nodes.join('\n') }, row.nodes.length > 2 ? `${row.nodes.slice(0, 2).join(', ')} +${row.nodes.length - 2}` : row.nodes.join(', ')),
        el('td', { class: 'num', title: row.gpuNames }, String(row.gpus)),
        el('td', { class: 'num', 'data-col': 'energy', title: `measured by ${methodText(row.method)}` }, kwh(row.energyKwh)),
        el('td', { class: 'num', 'data-col': 'idle', 'data-idle-j': String(row.idleJ), title: 'allocated but idle: the idle energy of the GPUs while held (by GPU memory held)' }, kwh(row.idleJ / 3.6e6)),
        el('td', { class: 'num', 'data-col': 'co2', title: sourcesText(row) ?? undefined }, co2(g)),
        el('td', { class: 'num' }, duration(row.gpuSeconds)),
        groupBy === 'node' ? null : el('td', { class: 'num', 'data-col': 'tensor', title: tensorTitle(row) }, pct1(row.tensorPct)));
      body.append(tr);
    }
    if (shown.length === 0) body.append(el('tr', {}, el('td', { colspan: String(columns.length) }, rows.length ? 'no row in this band' : 'no energy accounted in this range yet')));
    const foot = el('tfoot', {}, el('tr', { id: 'energy-sum', 'data-energy-j': String(sumJ), 'data-carbon-g': sumG === null ? '' : String(sumG) },
      el('td', { colspan: '3' }, `${shown.length} ${groupBy === 'node' ? 'nodes' : 'rows'}`),
      el('td', { class: 'num', 'data-col': 'energy' }, kwh(sumJ / 3.6e6)),
      el('td', {}),
      el('td', { class: 'num', 'data-col': 'co2' }, co2(sumG)),
      el('td', { class: 'note', colspan: String(columns.length - 6) },
        groupBy === 'node' ? 'all GPUs' : 'attributed to workloads (the rest: idle, unattributed)')));
    table.append(el('thead', {}, head), body, foot);
  };

  // Energy over time: the stacked chart and its legend, a button per band.
  const perHour = !(series instanceof Error) && series.step_ms >= 3_600_000;
  const stack = new StackChart(`energy per ${perHour ? 'hour' : 'minute'}`, 'kWh', 'energy-chart');
  const legend = el('ul', { class: 'bands', id: 'energy-bands', 'aria-label': 'bands: choose one to filter the table' });
  const stackBands: StackBand[] = [];
  let groupIndex = 0;
  for (const b of bands) {
    const color = b.kind === 'group' ? `--series-${(groupIndex++ % 10) + 1}` : (BAND_STYLE[b.kind]?.[0] ?? '--band-other');
    stackBands.push({ key: b.key, label: bandLabel(b, rows), color, values: b.values_mj.map((v) => v / 3.6e9) });
  }
  const pickBand = (key: string | null): void => {
    // Idle and unattributed are no one's: they filter nothing, and say so.
    const b = bands.find((x) => x.key === key);
    band = key && b && (b.kind === 'group' || b.kind === 'other') ? key : null;
    history.replaceState(null, '', urlWith({ band }));
    for (const btn of legend.querySelectorAll('button')) btn.setAttribute('aria-pressed', String(btn.dataset.band === band));
    renderTable();
    if (key && b && !band) bandNote.append(`${bandLabel(b, rows)}: ${kwh(b.energy_mj / 3.6e9)}, charged to no row of the table`);
  };
  // A band's legend entry, in the chart's order (biggest group first; idle last).
  bands.forEach((b, i) => {
    const btn = el('button', {
      type: 'button', 'data-band': b.key, 'data-kind': b.kind, 'data-energy-mj': String(b.energy_mj), 'aria-pressed': String(b.key === band),
    }, el('span', { class: 'swatch', 'data-color': stackBands[i].color }), stackBands[i].label, ' ', el('span', { class: 'value' }, kwh(b.energy_mj / 3.6e9)));
    btn.addEventListener('click', () => pickBand(b.key === band ? null : b.key));
    legend.append(el('li', {}, btn));
  });
  if (series instanceof Error) stack.root.append(el('p', { class: 'error' }, `energy over time: ${series.message}`));
  else {
    stack.root.dataset.totalMj = String(series.energy_mj);
    stack.root.dataset.stepMs = String(series.step_ms);
    stack.root.append(legend);
  }

  const intensity = await intensitySection(r, energy.total);
  clear(app);
  app.append(
    el('h2', {}, 'Energy and carbon'),
    rangePicker(r, (qs) => {
      const n = new URLSearchParams(qs);
      navigate(urlWith({ range: n.get('range'), from: n.get('from'), to: n.get('to'), workload: null }));
    }, ENERGY_RANGES),
    totalsBox(energy.total, r),
    el('div', { class: 'toolbar' }, groupSel),
    stack.root,
    bandNote,
    scrollBox('energy per row', table),
    detail,
    intensity.root);
  renderTable();
  intensity.mount();
  if (!(series instanceof Error)) {
    stack.mount(series.buckets_ms, stackBands, kwhAxis, (i) => pickBand(bands[i].key === band ? null : bands[i].key));
    // The swatches' colours, from the same custom properties (no inline style: CSP).
    for (const sw of legend.querySelectorAll<HTMLElement>('.swatch')) {
      const c = sw.dataset.color;
      if (c) sw.classList.add(`sw${c.replace(/^--/, '-')}`);
    }
  }

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
    stack.destroy();
    intensity.destroy();
  };
}
