// The waste page: idle-but-allocated episodes (/api/v1/waste): workloads holding GPU
// memory on a GPU that does no work (utilization at or below the collector's threshold)
// for at least the minimum idle time, with the energy and CO2 they burned meanwhile.
// Range, minimum idle time and threshold live in the URL (?range=, ?from=&to=,
// ?min_idle=30m, ?threshold=1). Below them, workloads holding GPUs with GPM (Hopper and
// newer) whose tensor cores stay all but idle (/api/v1/containers' tensor figures).
import { enc, getJson, type ContainerRow, type ContainersView, type WasteView, type Workload } from './api';
import { co2, kwh } from './carbon';
import { bytes, clear, el, NA, num, scrollBox } from './dom';
import { pct1 } from './gpm';
import { currentRange, ENERGY_RANGES, rangePicker } from './range';
import { workloadCell } from './workload';

/** Who it is, as a person would name it: its name, what places it, its ids and key on
 * hover (a host workload known by neither unit nor uid: its key). */
function who(w: Workload, key: string): HTMLTableCellElement {
  if (w.kind === 'host' && w.unit == null && w.uid == null) return el('td', { 'data-col': 'workload', title: key }, key);
  return workloadCell(w, key);
}

function idleText(s: number): string {
  const m = Math.floor(s / 60);
  return m >= 120 ? `${(m / 60).toFixed(1)} h` : `${m} min`;
}

const MIN_IDLE = ['30m', '15m', '1h', '4h'];

/** GPU time with GPM a workload needs (s) before its tensor figure counts here. */
const TENSOR_MIN_GPM_SECONDS = 600;
/** Tensor-core activity (percent) below which a workload holds its tensor cores idle. */
const TENSOR_IDLE_PCT = 1;

/** The GPUs a row held, each linked to its page (the model on hover). */
function gpusCell(r: ContainerRow): HTMLTableCellElement {
  const td = el('td', { 'data-col': 'gpus', title: r.gpus.map((g) => `${g.node} GPU ${g.index} · ${g.name}`).join('\n') || undefined });
  const shown = r.gpus.slice(0, 3);
  shown.forEach((g, i) => td.append(i ? ', ' : '', el('a', { href: `/gpu/${enc(g.uuid)}` }, `${g.node} GPU ${g.index}`)));
  if (r.gpus.length > shown.length) td.append(` +${r.gpus.length - shown.length}`);
  if (r.gpus.length === 0) td.append(NA);
  return td;
}

/** "Holding tensor cores idle": workloads with at least TENSOR_MIN_GPM_SECONDS of GPU
 * time on GPUs with GPM whose tensor activity stayed under TENSOR_IDLE_PCT, most GPU time
 * first (`rows`: /api/v1/containers over the page's range, or why it could not load). */
function tensorIdleSection(rows: ContainerRow[] | Error): HTMLElement {
  const section = el('section', { id: 'tensor-idle', 'aria-labelledby': 'tensor-idle-title' },
    el('h2', { id: 'tensor-idle-title' }, 'Holding tensor cores idle'),
    el('p', { class: 'muted', id: 'tensor-idle-rule' },
      `Workloads with at least ${TENSOR_MIN_GPM_SECONDS / 60} minutes of GPU time on GPUs that report GPM and a tensor-core activity `
      + `under ${TENSOR_IDLE_PCT} %. GPM (GPU Performance Monitoring) exists only on Hopper and newer, large datacenter GPUs; a job `
      + 'that holds one with its tensor cores near zero is a candidate for a smaller GPU, or for a fix (mixed precision, a '
      + 'library that uses the tensor cores). On shared GPUs the figure is an estimate.'));
  if (rows instanceof Error) {
    section.append(el('p', { class: 'error' }, `tensor activity: ${rows.message}`));
    return section;
  }
  const idle = rows.filter((r) => r.gpm_seconds >= TENSOR_MIN_GPM_SECONDS && typeof r.tensor_active_pct === 'number'
    && r.tensor_active_pct < TENSOR_IDLE_PCT).sort((a, b) => b.gpu_seconds - a.gpu_seconds || (a.key < b.key ? -1 : 1));
  if (idle.length === 0) {
    section.append(el('p', { class: 'muted', id: 'no-tensor-idle' }, 'No workload held a GPU with GPM while leaving its tensor cores idle in this range.'));
    return section;
  }
  const table = el('table', { id: 'tensor-idle-table', class: 'energy' },
    el('thead', {}, el('tr', {}, ...['workload', 'GPUs', 'GPU hours', 'tensor active', 'SM occupancy', 'energy']
      .map((h, i) => el('th', { scope: 'col', class: i >= 2 ? 'num' : undefined }, h)))));
  const body = el('tbody');
  for (const r of idle) {
    body.append(el('tr', {
      'data-key': r.key, 'data-gpu-seconds': String(r.gpu_seconds), 'data-gpm-seconds': String(r.gpm_seconds),
      'data-tensor-pct': String(r.tensor_active_pct),
    },
    who(r.identity, r.key),
    gpusCell(r),
    el('td', { class: 'num', 'data-col': 'gpu-hours' }, num(r.gpu_seconds / 3600, 2)),
    el('td', { class: 'num', 'data-col': 'tensor', title: `over ${num(r.gpm_seconds / 3600, 2)} GPU hours with GPM` }, pct1(r.tensor_active_pct)),
    el('td', { class: 'num', 'data-col': 'sm-occupancy' }, pct1(r.sm_occupancy_pct)),
    el('td', { class: 'num', 'data-col': 'energy' }, kwh(r.energy_kwh))));
  }
  table.append(body);
  section.append(scrollBox('workloads holding tensor cores idle', table));
  return section;
}

export async function wastePage(app: HTMLElement, navigate: (url: string) => void): Promise<() => void> {
  const q = new URLSearchParams(location.search);
  const r = currentRange(Date.now(), ENERGY_RANGES);
  const minIdle = q.get('min_idle');
  // ?threshold= (percent) overrides the collector's threshold, like the API's parameter.
  const threshold = q.get('threshold');
  const [v, containers] = await Promise.all([
    getJson<WasteView>(`/api/v1/waste?from=${r.fromMs}&to=${r.toMs}`
      + `${minIdle ? `&min_idle=${enc(minIdle)}` : ''}${threshold ? `&threshold=${enc(threshold)}` : ''}`),
    // The tensor section is an addition: the episodes stand without it.
    getJson<ContainersView>(`/api/v1/containers?from=${r.fromMs}&to=${r.toMs}`)
      .then((c) => c.rows)
      .catch((e: unknown) => (e instanceof Error ? e : new Error(String(e)))),
  ]);

  const urlWith = (changes: Record<string, string | null>): string => {
    const n = new URLSearchParams(location.search);
    for (const [k, val] of Object.entries(changes)) {
      if (val === null) n.delete(k);
      else n.set(k, val);
    }
    const s = n.toString();
    return `/waste${s ? '?' + s : ''}`;
  };
  // A new range keeps the rule asked for (min_idle, threshold).
  const withRule = (query: string): string => {
    const n = new URLSearchParams(query);
    for (const k of ['min_idle', 'threshold']) {
      const val = q.get(k);
      if (val !== null) n.set(k, val);
    }
    const s = n.toString();
    return `/waste${s ? '?' + s : ''}`;
  };
  const minSel = el('select', { id: 'min-idle', 'aria-label': 'minimum idle time' },
    ...[...new Set([minIdle ?? '', ...MIN_IDLE])].filter(Boolean).map((m) => el('option', { value: m }, `idle ≥ ${m}`)));
  minSel.value = minIdle ?? `${Math.round(v.min_idle_seconds / 60)}m`;
  if (!minIdle) {
    // The collector's own minimum, as the first choice.
    const own = `${Math.round(v.min_idle_seconds / 60)}m`;
    if (![...minSel.options].some((o) => o.value === own)) minSel.prepend(el('option', { value: own }, `idle ≥ ${own}`));
    minSel.value = own;
  }
  minSel.addEventListener('change', () => navigate(urlWith({ min_idle: minSel.value })));

  const total = (key: string, name: string, value: string, exact?: number | null) =>
    el('div', { class: 'total', 'data-total': key, 'data-value': exact === undefined || exact === null ? undefined : String(exact) },
      el('span', { class: 'muted' }, name), el('strong', {}, value));
  const totals = el('div', { class: 'energy-totals', id: 'waste-totals' },
    total('episodes', 'episodes', String(v.episodes.length), v.episodes.length),
    total('ongoing', 'ongoing now', String(v.episodes.filter((e) => e.ongoing).length)),
    total('energy', 'energy burned idle', kwh(v.energy_kwh), v.energy_mj),
    total('co2', 'CO2', co2(v.carbon_g), v.carbon_g));

  const table = el('table', { id: 'waste-table', class: 'energy' });
  table.append(el('thead', {}, el('tr', {}, ...['workload', 'GPU', 'since', 'idle', 'memory held', 'energy', 'CO2'].map((h) => el('th', { scope: 'col' }, h)))));
  const body = el('tbody');
  for (const e of v.episodes) {
    body.append(el('tr', {
      'data-key': `${e.workload_key}@${e.gpu.uuid}@${e.since_ms}`,
      'data-energy-mj': String(e.energy_mj),
      'data-carbon-g': e.carbon_g === null || e.carbon_g === undefined ? undefined : String(e.carbon_g),
      class: e.ongoing ? 'ongoing' : '',
    },
    who(e.workload, e.workload_key),
    el('td', { 'data-col': 'gpu' }, el('a', { href: `/node/${enc(e.gpu.node)}` }, e.gpu.node), ' · ', el('a', { href: `/gpu/${enc(e.gpu.uuid)}` }, `GPU ${e.gpu.index}`)),
    el('td', { 'data-col': 'since' }, new Date(e.since_ms).toLocaleString()),
    el('td', { 'data-col': 'idle', 'data-idle-s': String(e.idle_seconds) }, idleText(e.idle_seconds),
      e.ongoing ? el('span', { class: 'mark', 'data-mark': 'ongoing', title: 'still idle and allocated' }, 'ongoing') : null),
    el('td', { 'data-col': 'memory' }, e.memory_bytes === null || e.memory_bytes === undefined ? NA : bytes(e.memory_bytes)),
    el('td', { 'data-col': 'energy' }, kwh(e.energy_kwh)),
    el('td', { 'data-col': 'co2' }, co2(e.carbon_g))));
  }
  table.append(body);

  const per = el('table', { id: 'waste-workloads', class: 'energy' });
  per.append(el('thead', {}, el('tr', {}, ...['workload', 'episodes', 'idle', 'energy', 'CO2'].map((h) => el('th', { scope: 'col' }, h)))));
  const pbody = el('tbody');
  for (const w of v.workloads) {
    pbody.append(el('tr', { 'data-key': w.workload_key, 'data-energy-mj': String(w.energy_mj) },
      who(w.workload, w.workload_key),
      el('td', {}, String(w.episodes)),
      el('td', {}, idleText(w.idle_seconds)),
      el('td', {}, kwh(w.energy_kwh)),
      el('td', { 'data-col': 'co2' }, co2(w.carbon_g))));
  }
  per.append(pbody);

  clear(app);
  app.append(
    el('h2', {}, 'Idle but allocated'),
    el('p', { class: 'muted', id: 'waste-rule' },
      `A workload holding GPU memory on a GPU at or below ${v.threshold_pct} % utilization for at least ${Math.round(v.min_idle_seconds / 60)} minutes; `
      + 'its energy is its share of the GPU\'s energy meanwhile, as the energy accounting split it.'),
    el('div', { class: 'toolbar' }, rangePicker(r, (query) => navigate(withRule(query)), ENERGY_RANGES), minSel),
    totals,
    v.episodes.length === 0 ? el('p', { id: 'no-episodes', class: 'muted' }, 'No idle-but-allocated GPUs in this range.') : scrollBox('episodes', table),
    el('h3', {}, 'Per workload'),
    scrollBox('per workload', per),
    tensorIdleSection(containers));
  return () => {};
}
