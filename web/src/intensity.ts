// The carbon intensity of each region the fleet's nodes are in, over the range and the
// next 24 h: measured / provider-actual slots as a solid line, forecast slots dashed, and
// the lowest-intensity window ahead where a forecast exists.
import { enc, getJson, type IntensitySlot, type IntensityView } from './api';
import { sources, type CarbonFields } from './carbon';
import { Chart } from './chart';
import { el, NA } from './dom';
import type { Range } from './range';

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

const none: Omit<Section, 'root'> = { mount: () => {}, destroy: () => {} };

/** The regions whose intensities priced the fleet's energy (`fleet`: /api/v1/energy's
 * total): a curve for providers with a time series (uk, electricitymaps), a line of text
 * for local figures (static, csv). */
export async function intensitySection(r: Range, fleet: CarbonFields): Promise<Section> {
  const box = el('section', { id: 'intensity', class: 'intensity' }, el('h3', {}, 'Carbon intensity by region'));
  const used = sources(fleet);
  if (used.length === 0) {
    box.append(el('p', { class: 'muted', 'data-na': '' },
      `${NA}: no energy in this range was priced with a carbon intensity (no provider configured, or not priced yet)`));
    return { root: box, ...none };
  }
  const now = Date.now();
  const from = Math.min(r.fromMs, now - 24 * HOUR_MS);
  const to = now + 24 * HOUR_MS;
  const grid = el('div', { class: 'panels' });
  box.append(grid);
  const drawn: [Chart, IntensityView][] = [];
  const seen = new Set<string>();
  for (const s of used) {
    const id = `${s.provider}:${s.region}`;
    if (seen.has(id)) continue;
    seen.add(id);
    if (s.provider !== 'uk' && s.provider !== 'electricitymaps') {
      grid.append(el('section', { class: 'panel', 'data-region': s.region, 'data-provider': s.provider },
        el('h3', {}, `${s.region} (${s.provider})`),
        el('p', { class: 'muted' }, `${s.provider === 'static' ? 'a fixed figure' : 'a local CSV series'} (${s.factorType || 'direct'}): no provider curve or forecast`)));
      continue;
    }
    let reg: IntensityView;
    try {
      reg = await getJson<IntensityView>(`/api/v1/carbon/intensity?region=${enc(s.region)}&provider=${enc(s.provider)}&from=${from}&to=${to}`);
    } catch (e) {
      grid.append(el('section', { class: 'panel', 'data-region': s.region },
        el('h3', {}, `${s.region} (${s.provider})`), el('p', { class: 'error' }, String(e))));
      continue;
    }
    const chart = new Chart({
      title: `${reg.region} (${s.provider})`,
      unit: 'gCO2/kWh',
      series: [{ label: 'actual', color: '--good' }, { label: 'forecast', color: '--muted' }],
      fmt: (v) => `${Math.round(v)} g/kWh`,
      height: 160,
      dashed: [false, true],
      now,
    });
    chart.root.dataset.region = reg.region;
    chart.root.dataset.provider = s.provider;
    const w = reg.lowest_window;
    chart.root.append(w
      ? el('p', { class: 'hint', 'data-lowest': '' },
        `lowest in the next 24 h: ${hhmm(w.from_ms)}–${hhmm(w.to_ms)}, ${Math.round(w.avg_g_per_kwh)} g/kWh on average`)
      : el('p', { class: 'muted' }, 'no forecast for the next 24 h: no lowest-intensity hint'));
    grid.append(chart.root);
    drawn.push([chart, reg]);
  }
  return {
    root: box,
    mount: () => drawn.forEach(([chart, reg]) => {
      chart.mount();
      const sp = splitSeries(reg.slots);
      chart.setData(sp.xs, [sp.actual, sp.forecast]);
    }),
    destroy: () => drawn.forEach(([c]) => c.destroy()),
  };
}
