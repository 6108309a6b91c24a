// Carbon figures as the API gives them beside energy: `carbon_g` (null or absent when no
// intensity is known: shown as "n/a", never 0) and where it came from.
import type { EnergyTotals } from './api';
import { el, NA } from './dom';

/** What this module reads of a figure the API gives with its carbon: `carbon_g` and its
 * provenance `carbon`, where the figure has them (EnergyTotals, GpuEnergyView, ContainerRow
 * have both; EpisodeView, WorkloadTotalView only `carbon_g`). */
export type CarbonFields = Partial<Pick<EnergyTotals, 'carbon_g' | 'carbon'>>;

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
  const p = c?.priced_share;
  if (carbonG(x) !== null && typeof p === 'number' && p < 0.9995) {
    marks.push(el('span', { class: 'mark partial', 'data-mark': 'partial', title: `CO2 of ${Math.round(p * 100)}% of the energy: the rest has no price (its node has no carbon provider, or the minutes are not priced yet)` }, 'partly priced'));
  }
  return marks;
}

/** A source of intensities: `provider:region:factor_type` split (client-side: parsed from
 * CarbonView's `sources`). */
export interface Source {
  provider: string;
  region: string;
  factorType: string;
}

export function sources(x: CarbonFields | null | undefined): Source[] {
  const s = x?.carbon?.sources;
  if (!Array.isArray(s)) return [];
  return s.filter((v): v is string => typeof v === 'string').map((v) => {
    const [provider, ...rest] = v.split(':');
    const factorType = rest.length > 1 ? (rest.pop() as string) : '';
    return { provider, region: rest.join(':'), factorType };
  });
}

/** "uk 13 (direct), static demo (direct)" and the average intensity; null without sources. */
export function sourcesText(x: CarbonFields | null | undefined): string | null {
  const s = sources(x);
  if (s.length === 0) return null;
  const avg = x?.carbon?.avg_g_per_kwh;
  return s.map((v) => `${v.provider} ${v.region}${v.factorType ? ` (${v.factorType})` : ''}`).join(', ') +
    (typeof avg === 'number' ? ` · average ${Math.round(avg)} gCO2/kWh` : '');
}
