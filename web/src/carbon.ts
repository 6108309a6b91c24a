// Carbon figures as the API gives them beside energy: `carbon_g` (null or absent when no
// intensity is known: shown as "n/a", never 0) and where it came from.
import { el, NA } from './dom';

/** Provenance of a carbon figure (fields absent when the collector does not say). */
export interface CarbonFields {
  carbon_g?: number | null;
  carbon?: {
    /** Share (0..1) of the energy priced with a forecast intensity. */
    forecast_share?: number | null;
    /** Share (0..1) priced with a fallback (provider unreachable: last known / default). */
    estimated_share?: number | null;
    sources?: { source: string; region: string }[];
    [k: string]: unknown;
  } | null;
  [k: string]: unknown;
}

export function carbonG(x: CarbonFields | null | undefined): number | null {
  const v = x?.carbon_g;
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** gCO2 as "812 g" or "3.41 kg"; absent is "n/a". */
export function co2(g: number | null | undefined): string {
  if (g === null || g === undefined || !Number.isFinite(g)) return NA;
  if (Math.abs(g) >= 1000) return `${(g / 1000).toFixed(2)} kg`;
  if (Math.abs(g) >= 10) return `${g.toFixed(0)} g`;
  return `${g.toFixed(2)} g`;
}

/** kWh with a sensible precision ("0.0312 kWh", "12.4 kWh"); absent is "n/a". */
export function kwh(v: number | null | undefined): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return NA;
  if (v === 0) return '0 kWh';
  const digits = Math.abs(v) >= 100 ? 0 : Math.abs(v) >= 10 ? 1 : Math.abs(v) >= 1 ? 2 : Math.max(2, 1 - Math.floor(Math.log10(Math.abs(v))) + 2);
  return `${v.toFixed(Math.min(digits, 6))} kWh`;
}

/** Marks for a figure that is not plain measured actuals: "forecast", "estimated". */
export function provenanceMarks(x: CarbonFields | null | undefined): HTMLElement[] {
  const marks: HTMLElement[] = [];
  const c = x?.carbon;
  const share = (v: number | null | undefined) => (typeof v === 'number' && v > 0 ? v : null);
  const f = share(c?.forecast_share);
  const e = share(c?.estimated_share);
  if (e !== null) {
    marks.push(el('span', { class: 'mark estimated', 'data-mark': 'estimated', title: `${Math.round(e * 100)}% priced with a fallback intensity (provider unreachable)` }, 'estimated'));
  }
  if (f !== null) {
    marks.push(el('span', { class: 'mark forecast', 'data-mark': 'forecast', title: `${Math.round(f * 100)}% priced with a forecast intensity` }, 'forecast'));
  }
  return marks;
}

/** "uk/13, static/lab" from the sources of a figure; null when none. */
export function sourcesText(x: CarbonFields | null | undefined): string | null {
  const s = x?.carbon?.sources;
  if (!Array.isArray(s) || s.length === 0) return null;
  return s.map((v) => `${v.source}${v.region ? '/' + v.region : ''}`).join(', ');
}
