// The GPU page: every metric of one GPU over the chosen range, with its events (Xid, ECC,
// ...) drawn as red lines on every chart and listed below; above them, on a GPU with GPM
// (Hopper and newer), its SM, tensor and memory activity (gpm.ts).
import {
  enc, getJson, type Baseline, type EnergyView, type EventsView, type EventView, type GpuDetailView, type GpuSample, type GpuSeries,
  type Process,
} from './api';
import { Chart, pairs } from './chart';
import { carbonG, co2, kwh, provenanceMarks, sourcesText } from './carbon';
import { bytes, clear, el, NA, patch, rate, scrollBox, watts } from './dom';
import { GpmSection } from './gpm';
import { healthBadge, reasonList, xidCell } from './health';
import { openLive } from './live';
import { currentRange, rangePicker, rangeQuery } from './range';
import { workloadCell } from './workload';

/** A GPU sample's numeric fields: the metrics a GPU's series can be asked for
 * (client-side: derived from the API's GpuSample). */
type Metric = { [K in keyof GpuSample]-?: NonNullable<GpuSample[K]> extends number ? K : never }[keyof GpuSample];

const METRICS: [Metric, string, (v: number) => string][] = [
  ['util_gpu_pct', 'GPU utilization', (v) => `${Math.round(v)}%`],
  ['util_mem_pct', 'memory controller utilization', (v) => `${Math.round(v)}%`],
  ['mem_used_bytes', 'memory used', (v) => bytes(v)],
  ['power_mw', 'power', (v) => watts(v)],
  ['power_limit_mw', 'power limit', (v) => watts(v)],
  ['energy_mj', 'energy counter', (v) => `${(v / 3.6e9).toFixed(3)} kWh`],
  ['temp_gpu_c', 'temperature', (v) => `${Math.round(v)}°C`],
  ['temp_mem_c', 'memory temperature', (v) => `${Math.round(v)}°C`],
  ['fan_pct', 'fan', (v) => `${Math.round(v)}%`],
  ['clock_sm_mhz', 'SM clock', (v) => `${Math.round(v)} MHz`],
  ['clock_mem_mhz', 'memory clock', (v) => `${Math.round(v)} MHz`],
  ['clock_graphics_mhz', 'graphics clock', (v) => `${Math.round(v)} MHz`],
  ['pstate', 'performance state', (v) => `P${Math.round(v)}`],
  ['pcie_tx_bps', 'PCIe tx', (v) => rate(v)],
  ['pcie_rx_bps', 'PCIe rx', (v) => rate(v)],
  ['nvlink_tx_bps', 'NVLink tx', (v) => rate(v)],
  ['nvlink_rx_bps', 'NVLink rx', (v) => rate(v)],
  ['ecc_corrected_volatile', 'ECC corrected (volatile)', (v) => String(Math.round(v))],
  ['ecc_uncorrected_volatile', 'ECC uncorrected (volatile)', (v) => String(Math.round(v))],
  ['enc_util_pct', 'encoder utilization', (v) => `${Math.round(v)}%`],
  ['dec_util_pct', 'decoder utilization', (v) => `${Math.round(v)}%`],
];

/** Where a GPU's idle baseline came from, in words. */
function baselineText(b: Baseline): string {
  const seen = `seen idle ${Math.round(b.seen_idle_seconds)} s, the most recent hour of it kept`;
  switch (b.source) {
    case 'learned': return `learned from the time it did no work (${seen})`;
    case 'model': return `datasheet default: 7% of ${b.model_max_power_w ?? NA} W (${seen}; learned after ${b.learn_after_seconds} s)`;
    case 'fallback': return `fallback: 7% of its power limit (${seen}; learned after ${b.learn_after_seconds} s)`;
    case 'watts': return 'configured (--energy-idle)';
    default: return `${b.source} (older minutes)`;
  }
}

/** The GPU's processes in its latest tick, each workload by its name (ids on hover). */
function processRows(procs: Process[]): HTMLElement[] {
  if (procs.length === 0) return [el('tr', {}, el('td', { colspan: '6' }, 'no processes'))];
  return procs.map((p) => el('tr', { 'data-pid': String(p.pid) },
    el('td', {}, String(p.pid)),
    el('td', {}, p.user ?? NA),
    workloadCell(p.workload),
    el('td', { class: 'cmd' }, p.command ?? NA),
    el('td', {}, bytes(p.gpu_mem_bytes)),
    el('td', {}, p.sm_util_pct === null || p.sm_util_pct === undefined ? NA : `${p.sm_util_pct}%`)));
}

export async function gpuPage(app: HTMLElement, uuid: string, navigate: (url: string) => void): Promise<() => void> {
  const g = await getJson<GpuDetailView>(`/api/v1/gpus/${enc(uuid)}`);
  const r = currentRange();
  const q = rangeQuery(r, g.interval_ms || 1000);
  const events = await getJson<EventsView>(`/api/v1/nodes/${enc(g.node)}/events?from=${r.fromMs}&to=${r.toMs}`)
    .then((e) => e.events.filter((x) => x.gpu_uuid === uuid || x.gpu_uuid === ''))
    .catch(() => [] as EventView[]);
  const marks = events.map((e) => e.time_ms);
  // The agent reads the energy counter every few seconds: its line spans the ticks between.
  const charts = METRICS.map(([m, title, fmt]) => new Chart({
    title, unit: m, series: [{ label: title, spanGaps: m === 'energy_mj' }], fmt, marks, height: 140, sync: 'gpu',
  }));
  const evBody = el('tbody');
  for (const e of events) {
    evBody.append(el('tr', { 'data-kind': e.kind }, el('td', {}, new Date(e.time_ms).toISOString()), el('td', {}, e.kind),
      el('td', {}, e.code === null || e.code === undefined ? NA : String(e.code)), el('td', { 'data-col': 'xid' }, xidCell(e.explanation)),
      el('td', {}, e.detail)));
  }
  if (events.length === 0) evBody.append(el('tr', {}, el('td', { colspan: '5' }, 'no events in this range')));
  const procBody = el('tbody', {}, ...processRows(g.node_status === 'offline' ? [] : g.processes));
  // GPM (Hopper and newer): its own group, or a line saying this GPU has none.
  const gpm = new GpmSection(uuid, g.latest, marks);
  clear(app);
  app.append(
    el('h2', {}, el('a', { href: `/node/${enc(g.node)}` }, g.node), ` / GPU ${g.index} · ${g.name}`),
    el('p', { class: 'muted' }, `${g.uuid} · bus ${g.inventory.pci_bus_id ?? NA}`),
    el('h3', {}, 'Health ', healthBadge(g.health?.state, 'gpu-health')),
    reasonList(g.health?.reasons ?? [], 'gpu-reasons'),
    el('p', { class: 'muted', id: 'throttle' },
      g.throttle && g.throttle.length > 0 ? `clock-event reasons now: ${g.throttle.join(', ')}` : ''),
    el('h3', {}, 'Processes now'),
    scrollBox('processes', el('table', { id: 'gpu-processes', class: 'procs' }, el('thead', {}, el('tr', {}, ...['pid', 'user', 'workload', 'command', 'GPU mem', 'SM']
      .map((h) => el('th', { scope: 'col' }, h)))), procBody)),
    rangePicker(r, (qs) => navigate(`/gpu/${enc(uuid)}${qs}`)),
    gpm.root,
    el('div', { class: 'panels small', id: 'panels' }, ...charts.map((c) => c.root)),
    el('h3', {}, 'Events'),
    scrollBox('events', el('table', { id: 'events' }, el('thead', {}, el('tr', {}, ...['time', 'kind', 'code', 'what it means / what to do', 'detail'].map((h) => el('th', { scope: 'col' }, h)))), evBody)));
  for (const c of charts) c.mount();
  gpm.mount();
  // The energy counter's panel also says what the GPU spent in the range, and its CO2.
  const counter = charts[METRICS.findIndex(([m]) => m === 'energy_mj')];
  void getJson<EnergyView>(`/api/v1/energy?from=${r.fromMs}&to=${r.toMs}&node=${enc(g.node)}`).then((e) => {
    const mine = e.gpus.find((x) => x.uuid === uuid);
    counter.root.append(el('p', { class: 'energy-row', id: 'gpu-energy' },
      'accounted in range: ', el('strong', { 'data-col': 'energy' }, mine ? kwh(mine.energy_kwh) : NA),
      ' · CO2 ', el('strong', { 'data-col': 'co2', title: sourcesText(mine) ?? undefined }, co2(carbonG(mine))),
      ' ', ...provenanceMarks(mine)));
    const b = mine?.baseline;
    counter.root.append(el('p', { class: 'energy-row', id: 'gpu-baseline', 'data-source': b?.source ?? '' },
      'idle baseline: ', el('strong', { 'data-col': 'baseline' }, b ? `${b.idle_w.toFixed(1)} W` : NA),
      ' ', el('span', { class: 'muted', title: b?.model_source ?? undefined }, b ? baselineText(b) : 'no energy accounted yet')));
  }).catch((err) => counter.root.append(el('p', { class: 'error' }, `energy: ${String(err)}`)));
  const gpmLoaded = gpm.load(q);
  await Promise.all(METRICS.map(async ([m], i) => {
    try {
      const s = await getJson<GpuSeries>(`/api/v1/gpus/${enc(uuid)}/series?metric=${m}&${q}`);
      const points = pairs(s.points);
      charts[i].setData(points.map((p) => p[0]), [points.map((p) => p[1])]);
      if (points.length > 0 && points.every((p) => p[1] === null)) {
        charts[i].root.append(el('p', { class: 'muted', 'data-na': '' }, `${NA}: this GPU does not report it`));
      }
    } catch (e) {
      charts[i].root.append(el('p', { class: 'error' }, String(e)));
    }
  }));
  await gpmLoaded;
  const destroy = () => {
    charts.forEach((c) => c.destroy());
    gpm.destroy();
  };
  if (!r.live) return destroy;
  // Live view: the node's stream extends every chart.
  for (const c of charts) c.setWindow(r.toMs - r.fromMs);
  gpm.setWindow(r.toMs - r.fromMs);
  const close = openLive(g.node, {
    tick: (t) => {
      const s = t.gpus.find((x) => x.uuid === uuid);
      if (!s) return;
      patch(procBody, ...processRows(t.processes.filter((p) => p.gpu_uuid === uuid)));
      METRICS.forEach(([m], i) => {
        const v = s[m];
        charts[i].append(t.time_ms, [typeof v === 'number' ? v : null]);
      });
      gpm.append(t.time_ms, s);
    },
  });
  return () => {
    close();
    destroy();
  };
}
