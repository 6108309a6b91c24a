// The time range of a view, kept in the URL's query string (?range=1h, or
// ?from=ISO&to=ISO) so a view can be shared.
import { el } from './dom';

export const RANGES: [string, number][] = [
  ['live', 5 * 60_000],
  ['15m', 15 * 60_000],
  ['1h', 3_600_000],
  ['24h', 86_400_000],
  ['7d', 7 * 86_400_000],
];

/** The energy pages' choices: "today" (since UTC midnight, the API's default) first. */
export const ENERGY_RANGES: [string, number][] = [
  ['today', 0],
  ['1h', 3_600_000],
  ['24h', 86_400_000],
  ['7d', 7 * 86_400_000],
];

const DAY_MS = 86_400_000;

/** A view's time range (client-side: from the URL's query). */
export interface Range {
  key: string; // live, 15m, ..., custom
  fromMs: number;
  toMs: number;
  live: boolean;
}

/** Points a chart should get at most: the step keeps every range at about this many. */
const TARGET_POINTS = 600;

export function currentRange(now = Date.now(), choices: [string, number][] = RANGES): Range {
  const q = new URLSearchParams(location.search);
  const from = q.get('from');
  const to = q.get('to');
  if (from && to) {
    const f = Date.parse(from);
    const t = Date.parse(to);
    if (Number.isFinite(f) && Number.isFinite(t) && f < t) return { key: 'custom', fromMs: f, toMs: t, live: false };
  }
  const key = q.get('range') ?? choices[0][0];
  const found = choices.find(([k]) => k === key) ?? choices[0];
  const fromMs = found[0] === 'today' ? Math.floor(now / DAY_MS) * DAY_MS : now - found[1];
  return { key: found[0], fromMs, toMs: now, live: found[0] === 'live' };
}

/** The step (ms, whole seconds) for a range: at least the sampling interval. */
export function stepFor(r: Range, intervalMs: number): number {
  const span = r.toMs - r.fromMs;
  const raw = Math.max(intervalMs, Math.ceil(span / TARGET_POINTS));
  return Math.max(1000, Math.ceil(raw / 1000) * 1000);
}

export function rangeQuery(r: Range, intervalMs: number): string {
  const step = r.live ? Math.max(intervalMs, 1) : stepFor(r, intervalMs);
  return `from=${r.fromMs}&to=${r.toMs}&step=${step}`;
}

function toLocalInput(ms: number): string {
  const d = new Date(ms - new Date(ms).getTimezoneOffset() * 60_000);
  return d.toISOString().slice(0, 16);
}

/** The range picker; `go` navigates to the same page with the new query (the first
 * choice is the default, so it has no query). */
export function rangePicker(r: Range, go: (query: string) => void, choices: [string, number][] = RANGES): HTMLElement {
  const bar = el('div', { class: 'ranges', role: 'toolbar', 'aria-label': 'time range' });
  for (const [k] of choices) {
    const b = el('button', { type: 'button', class: k === r.key ? 'active' : '', 'data-range': k, 'aria-pressed': String(k === r.key) }, k);
    b.addEventListener('click', () => go(k === choices[0][0] ? '' : `?range=${k}`));
    bar.append(b);
  }
  const from = el('input', { type: 'datetime-local', 'aria-label': 'from', value: toLocalInput(r.fromMs) });
  const to = el('input', { type: 'datetime-local', 'aria-label': 'to', value: toLocalInput(r.toMs) });
  const apply = el('button', { type: 'button', class: r.key === 'custom' ? 'active' : '', 'data-range': 'custom',
    'aria-pressed': String(r.key === 'custom') }, 'custom');
  apply.addEventListener('click', () => {
    const f = new Date(from.value).getTime();
    const t = new Date(to.value).getTime();
    if (Number.isFinite(f) && Number.isFinite(t) && f < t) {
      go(`?from=${new Date(f).toISOString()}&to=${new Date(t).toISOString()}`);
    }
  });
  bar.append(from, to, apply);
  return bar;
}
