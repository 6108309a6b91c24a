// The carbon intensity of each region the fleet's nodes are in, over the range and the
// next 24 h: measured / provider-actual slots as a solid line, forecast slots dashed, and
// the lowest-intensity window ahead where a forecast exists.
import { getJson } from './api';
import { Chart } from './chart';
import { el, NA } from './dom';
import type { Range } from './range';

/** One slot of intensity (gCO2/kWh) from a provider. */
export interface IntensitySlot {
  from_ms: number;
  to_ms: number;
  g_per_kwh: number | null;
  /** "actual" or "forecast" (absent: actual). */
  kind?: string;
  estimated?: boolean;
}

export interface RegionIntensity {
  region: string;
  source: string;
  nodes?: string[];
  slots: IntensitySlot[];
  /** The lowest-intensity window in the next 24 h (a forecast exists), else null. */
  lowest_window?: { from_ms: number; to_ms: number; avg_g_per_kwh: number } | null;
}

const HOUR_MS = 3_600_000;

function hhmm(ms: number): string {
  return new Date(ms).toISOString().slice(11, 16) + ' UTC';
}

/** Splits slots into two series on one x axis: actual and forecast (null elsewhere), joined
 * where one turns into the other so the curve has no hole. */
export function splitSeries(slots: IntensitySlot[]): { xs: number[]; actual: (number | null)[]; forecast: (number | null)[] } {
  const sorted = [...slots].sort((a, b) => a.from_ms - b.from_ms);
  const xs: number[] = [];
  const actual: (number | null)[] = [];
  const forecast: (number | null)[] = [];
  let prevKind: string | null = null;
  for (const s of sorted) {
    const isF = s.kind === 'forecast';
    // A step curve: a point at the start and one at the end of each slot.
    for (const x of [s.from_ms, s.to_ms - 1]) {
      xs.push(x);
      actual.push(isF ? null : s.g_per_kwh);
      forecast.push(isF ? s.g_per_kwh : null);
    }
    if (prevKind === 'actual' && isF) forecast[xs.length - 3] = actual[xs.length - 3]; // join
    prevKind = isF ? 'forecast' : 'actual';
  }
  return { xs, actual, forecast };
}

export interface Section {
  root: HTMLElement;
  /** Draws the charts; call once `root` is in the document. */
  mount: () => void;
  destroy: () => void;
}

export async function intensitySection(r: Range): Promise<Section> {
  const box = el('section', { id: 'intensity', class: 'intensity' }, el('h3', {}, 'Carbon intensity by region'));
  let regions: RegionIntensity[] | null = null;
  try {
    const to = Math.max(r.toMs, Date.now()) + 24 * HOUR_MS;
    regions = (await getJson<{ regions: RegionIntensity[] }>(`/api/v1/carbon/intensity?from=${r.fromMs}&to=${to}`)).regions;
  } catch (e) {
    box.append(el('p', { class: 'muted', 'data-na': '' }, `${NA}: no carbon intensity available (${e instanceof Error ? e.message : String(e)})`));
    return { root: box, mount: () => {}, destroy: () => {} };
  }
  if (regions.length === 0) {
    box.append(el('p', { class: 'muted', 'data-na': '' }, `${NA}: no carbon-intensity provider is configured`));
    return { root: box, mount: () => {}, destroy: () => {} };
  }
  const grid = el('div', { class: 'panels' });
  box.append(grid);
  const charts: Chart[] = [];
  for (const reg of regions) {
    const chart = new Chart({
      title: `${reg.region} (${reg.source})`,
      unit: 'gCO2/kWh',
      series: [{ label: 'actual', color: '#2e7d32' }, { label: 'forecast', color: '#8e8e93' }],
      fmt: (v) => `${Math.round(v)} g/kWh`,
      height: 160,
      dashed: [false, true],
      now: Date.now(),
    });
    chart.root.dataset.region = reg.region;
    const w = reg.lowest_window;
    const hint = w
      ? el('p', { class: 'hint', 'data-lowest': '' },
        `lowest in the next 24 h: ${hhmm(w.from_ms)}–${hhmm(w.to_ms)}, ${Math.round(w.avg_g_per_kwh)} g/kWh on average`)
      : el('p', { class: 'muted' }, 'no forecast for this region: no lowest-intensity hint');
    if (reg.nodes?.length) chart.root.append(el('p', { class: 'muted' }, `nodes: ${reg.nodes.join(', ')}`));
    chart.root.append(hint);
    grid.append(chart.root);
    charts.push(chart);
  }
  const list = regions;
  return {
    root: box,
    mount: () => list.forEach((reg, i) => {
      charts[i].mount();
      const s = splitSeries(reg.slots);
      charts[i].setData(s.xs, [s.actual, s.forecast]);
      charts[i].root.dataset.forecastPoints = String(s.forecast.filter((v) => v !== null).length);
    }),
    destroy: () => charts.forEach((c) => c.destroy()),
  };
}
