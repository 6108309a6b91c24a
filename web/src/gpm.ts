// GPU Performance Monitoring (GPM: Hopper and newer) as the pages show it: how much of
// the SMs, the tensor cores and the memory system the work used, which utilization (the
// share of time any kernel ran) cannot say. The API gives activities in hundredths of a
// percent (0–10 000); a GPU without GPM has every field absent, never 0, and its pages
// say so instead of drawing zeros. Used by the GPU page (its chart group and MIG table),
// the node page (tensor activity per GPU) and the tiles (tensor beside utilization).
import { enc, getJson, type GpmMetrics, type GpuSeries, type MigGpm } from './api';
import { align, Chart, pairs } from './chart';
import { clear, el, num, patch, scrollBox } from './dom';

/** A GPM activity field (hundredths of a percent). */
export type Activity = { [K in keyof GpmMetrics]-?: K extends `${string}_cpct` ? K : never }[keyof GpmMetrics];

/** An activity in percent (absent stays absent). */
export function cpctToPct(v: number | null | undefined): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v / 100 : null;
}

/** A percentage with one decimal, "n/a" when absent. */
export function pct1(v: number | null | undefined): string {
  return num(v, 1, '%');
}

/** Whether a sample's GPM shows the GPU has GPM (its SM or tensor activity is there). */
export function hasGpm(g: GpmMetrics | null | undefined): boolean {
  return typeof g?.sm_active_cpct === 'number' || typeof g?.tensor_active_cpct === 'number';
}

/** "tensor 42%" for a tile or a table's utilization cell, beside the utilization (after
 * `lead`, e.g. " · "); nothing on a GPU without GPM (absent is not 0). */
export function tensorNote(g: GpmMetrics | null | undefined, lead = ''): HTMLElement | null {
  const v = cpctToPct(g?.tensor_active_cpct);
  if (v === null) return null;
  return el('span', { class: 'tensor', title: 'tensor-core activity (GPM): any tensor pipe active, of its peak' },
    `${lead}tensor ${Math.round(v)}%`);
}

/** The API's series name of an activity (`gpm_tensor_active_cpct`). */
export function seriesName(a: Activity): string {
  return `gpm_${a}`;
}

interface Group {
  title: string;
  series: [Activity, string][];
  /** Per series: dashed (the FP pipes, beside the tensor pipes). */
  dashed?: boolean[];
}

const GROUPS: Group[] = [
  {
    title: 'GPM: SM, tensor and DRAM activity',
    series: [['sm_active_cpct', 'SM active'], ['sm_occupancy_cpct', 'SM occupancy'], ['tensor_active_cpct', 'tensor active'],
      ['dram_bw_cpct', 'DRAM bandwidth']],
  },
  {
    title: 'GPM: tensor and FP pipes',
    series: [['tensor_hmma_cpct', 'tensor HMMA'], ['tensor_imma_cpct', 'tensor IMMA'], ['tensor_dfma_cpct', 'tensor DFMA'],
      ['fp64_cpct', 'FP64'], ['fp32_cpct', 'FP32'], ['fp16_cpct', 'FP16']],
    dashed: [false, false, false, true, true, true],
  },
];

const NO_GPM = 'No GPM on this GPU (Hopper and newer report SM occupancy and tensor activity)';

/** The MIG instances' GPM now, a row each. */
function migRows(migs: MigGpm[]): HTMLElement[] {
  return [...migs].sort((a, b) => a.gpu_instance_id - b.gpu_instance_id).map((m) => el('tr', { 'data-mig': m.mig_uuid },
    el('td', {}, String(m.gpu_instance_id)),
    el('td', { class: 'cmd' }, m.mig_uuid),
    el('td', { class: 'num', 'data-col': 'sm-active' }, pct1(cpctToPct(m.gpm.sm_active_cpct))),
    el('td', { class: 'num', 'data-col': 'sm-occupancy' }, pct1(cpctToPct(m.gpm.sm_occupancy_cpct))),
    el('td', { class: 'num', 'data-col': 'tensor' }, pct1(cpctToPct(m.gpm.tensor_active_cpct))),
    el('td', { class: 'num', 'data-col': 'dram' }, pct1(cpctToPct(m.gpm.dram_bw_cpct)))));
}

/** What a GPU sample carries for this section. */
interface GpmSample {
  gpm?: GpmMetrics;
  mig_gpm?: MigGpm[];
}

/** The GPU page's "GPU performance (GPM)" group: two charts and, with MIG, a table of the
 * instances (updated live); on a GPU whose latest sample has no GPM (neither for the GPU
 * nor for a MIG instance), one line saying so. */
export class GpmSection {
  readonly root: HTMLElement;
  readonly charts: Chart[];
  private readonly migBody = el('tbody');
  private readonly migBox: HTMLElement;

  constructor(private readonly uuid: string, latest: GpmSample | null | undefined, marks: number[]) {
    const present = hasGpm(latest?.gpm);
    // A GPU in MIG mode may report GPM per instance only.
    const migs = latest?.mig_gpm ?? [];
    this.charts = present
      ? GROUPS.map((g) => new Chart({
        title: g.title, unit: '% of peak', series: g.series.map(([, label]) => ({ label })), dashed: g.dashed,
        fmt: (v) => `${v.toFixed(1)}%`, yRange: [0, 100], marks, height: 160, sync: 'gpu',
      }))
      : [];
    this.migBox = el('div', { id: 'gpm-mig' });
    this.root = el('section', { id: 'gpm', class: 'gpm', 'data-gpm': present ? 'true' : migs.length ? 'mig' : 'false' },
      el('h3', {}, 'GPU performance (GPM)'));
    if (!present && migs.length === 0) {
      this.root.append(el('p', { class: 'muted', id: 'no-gpm' }, latest ? NO_GPM : `${NO_GPM}; no sample yet`));
      return;
    }
    if (present) {
      this.root.append(
        el('p', { class: 'muted' }, 'Of each unit\'s peak: SM active (SMs with a warp resident), SM occupancy (resident warps '
          + 'of the maximum), tensor active (any tensor pipe) and DRAM bandwidth; then the tensor pipes (HMMA half precision, '
          + 'IMMA integer, DFMA double) and the FP64 / FP32 / FP16 pipes, dashed.'),
        el('div', { class: 'panels small' }, ...this.charts.map((c) => c.root)));
    } else {
      this.root.append(el('p', { class: 'muted' }, 'This GPU reports GPM per MIG instance only.'));
    }
    this.root.append(this.migBox);
    this.showMig(migs);
  }

  mount(): void {
    for (const c of this.charts) c.mount();
  }

  /** Loads the range (`q`: the series query) into the charts. */
  async load(q: string): Promise<void> {
    await Promise.all(GROUPS.map(async (g, i) => {
      const chart = this.charts[i];
      if (!chart) return;
      try {
        const all = await Promise.all(g.series.map(([a]) =>
          getJson<GpuSeries>(`/api/v1/gpus/${enc(this.uuid)}/series?metric=${seriesName(a)}&${q}`)));
        const { xs, ys } = align(all.map((s) => pairs(s.points).map(([t, v]) => [t, cpctToPct(v)] as [number, number | null])));
        chart.setData(xs, ys);
      } catch (e) {
        chart.root.append(el('p', { class: 'error' }, String(e)));
      }
    }));
  }

  setWindow(ms: number): void {
    for (const c of this.charts) c.setWindow(ms);
  }

  /** A live sample of the GPU. */
  append(tMs: number, s: GpmSample): void {
    GROUPS.forEach((g, i) => this.charts[i]?.append(tMs, g.series.map(([a]) => cpctToPct(s.gpm?.[a]))));
    if (this.migBox.isConnected) this.showMig(s.mig_gpm ?? []);
  }

  private showMig(migs: MigGpm[]): void {
    if (migs.length === 0) {
      clear(this.migBox);
      return;
    }
    if (!this.migBox.firstChild) {
      this.migBox.append(el('h4', {}, 'MIG instances now'), scrollBox('MIG instances', el('table', { id: 'gpm-mig-table', class: 'mig' },
        el('thead', {}, el('tr', {}, ...['GPU instance', 'MIG device', 'SM active', 'SM occupancy', 'tensor active', 'DRAM bandwidth']
          .map((h, i) => el('th', { scope: 'col', class: i >= 2 ? 'num' : undefined }, h)))),
        this.migBody)));
    }
    patch(this.migBody, ...migRows(migs));
  }

  destroy(): void {
    for (const c of this.charts) c.destroy();
  }
}
