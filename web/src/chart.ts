// A thin wrapper over uPlot: a titled time-series panel whose data can be replaced (a
// range was loaded) or extended (a live tick arrived). The container carries
// data-last-ms (the newest x) so tests and users can see it advance.
//
// Colours come from the CSS custom properties of style.css (--fg, --grid, --series-N, …),
// read when a chart draws: a change of the system's colour scheme redraws every chart in
// the other palette. Axes are as wide as their widest label.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { el } from './dom';

/** How many --series-N colours style.css defines. */
const PALETTE_SIZE = 10;

/** A CSS custom property of the document (its light or dark value, as the scheme is). */
export function themeVar(name: string, fallback = '#888'): string {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

/** The i-th series colour of the palette (--series-1 …). */
export function seriesColor(i: number): string {
  return themeVar(`--series-${(i % PALETTE_SIZE) + 1}`);
}

/** A series' colour: a custom property (`--good`), a colour, or the palette's i-th. */
export function colorOf(color: string | undefined, i: number): string {
  if (!color) return seriesColor(i);
  return color.startsWith('--') ? themeVar(color) : color;
}

/** The font of axis values, as the canvas draws it (CSS px). */
const AXIS_FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
const TICK_PX = 6;
const GAP_PX = 5;
let measurer: CanvasRenderingContext2D | null = null;

function textWidth(s: string): number {
  measurer ??= document.createElement('canvas').getContext('2d');
  if (!measurer) return s.length * 7;
  measurer.font = AXIS_FONT;
  return measurer.measureText(s).width;
}

/** An axis sized to its labels: the widest value (y) or as many lines of text as its
 * tallest label (x: uPlot puts the date under the first time of a day), so no label is
 * clipped ("1.389 kWh", "11/29/26"). */
function axisSize(_u: uPlot, values: string[] | null | undefined, axisIdx: number): number {
  if (axisIdx === 0) {
    const lines = Math.max(1, ...(values ?? []).map((v) => String(v ?? '').split('\n').length));
    return 14 * lines + TICK_PX + GAP_PX + 8;
  }
  const widest = Math.max(0, ...(values ?? []).map((v) => textWidth(String(v ?? ''))));
  return Math.max(32, Math.ceil(widest + TICK_PX + GAP_PX + 6));
}

/** The x (time) and y axes, in the theme's colours, y formatted by `fmt`. */
export function themedAxes(fmt: (v: number) => string): uPlot.Axis[] {
  const common = {
    font: AXIS_FONT,
    gap: GAP_PX,
    size: axisSize,
    stroke: () => themeVar('--fg'),
    grid: { stroke: () => themeVar('--grid'), width: 1 },
    ticks: { stroke: () => themeVar('--grid'), width: 1, size: TICK_PX },
  };
  return [
    { ...common },
    { ...common, values: (_u, vals) => vals.map((v) => (v === null ? '' : fmt(v))) },
  ];
}

/** Redraws every chart when the system's colour scheme changes. */
export const themed = new Set<uPlot>();
if (typeof window !== 'undefined' && window.matchMedia) {
  window.matchMedia('(prefers-color-scheme: dark)').addEventListener('change', () => {
    for (const u of themed) u.redraw(false, true);
  });
}

export interface SeriesSpec {
  label: string;
  /** A CSS custom property (`--good`) or a colour; default: the palette's next. */
  color?: string;
  /** Draw the line across samples without a value: a counter read every few seconds
   * (the energy counter) has none between its readings, and is not absent there. */
  spanGaps?: boolean;
}

export interface ChartSpec {
  title: string;
  unit: string;
  series: SeriesSpec[];
  /** Formats a y value for the axis and legend. */
  fmt?: (v: number) => string;
  yRange?: [number, number];
  height?: number;
  /** Charts with the same key share the cursor (aligned timelines). */
  sync?: string;
  /** Event times (ms) drawn as vertical red lines. */
  marks?: number[];
  /** Per series: drawn dashed (e.g. a forecast). */
  dashed?: boolean[];
  /** A time (ms) drawn as a grey vertical line labelled "now". */
  now?: number;
}

export class Chart {
  readonly root: HTMLElement;
  private plot: uPlot | null = null;
  private data: (number | null)[][];
  private marks: number[];
  private windowMs: number | null = null;

  constructor(private spec: ChartSpec) {
    this.root = el('section', { class: 'panel', 'data-title': spec.title, 'data-last-ms': '' },
      el('h3', {}, spec.title, spec.unit ? el('span', { class: 'unit' }, ` (${spec.unit})`) : null));
    this.data = [[], ...spec.series.map(() => [])];
    this.marks = spec.marks ?? [];
  }

  /** Creates the plot once the panel is in the document (uPlot measures it). */
  mount(): void {
    const width = Math.max(300, this.root.clientWidth - 16);
    const fmt = this.spec.fmt ?? ((v: number) => String(Math.round(v * 10) / 10));
    const marks = () => this.marks;
    const opts: uPlot.Options = {
      width,
      height: this.spec.height ?? 180,
      cursor: this.spec.sync ? { sync: { key: this.spec.sync } } : {},
      scales: { x: { time: true }, y: this.spec.yRange ? { range: this.spec.yRange } : {} },
      axes: themedAxes(fmt),
      series: [
        {},
        ...this.spec.series.map((s, i) => ({
          label: s.label,
          stroke: () => colorOf(s.color, i),
          width: 1.5,
          dash: this.spec.dashed?.[i] ? [6, 4] : undefined,
          spanGaps: s.spanGaps ?? false,
          value: (_u: uPlot, v: number | null, _s: number, idx: number | null) => (idx === null ? '–' : v === null ? 'n/a' : fmt(v)),
        })),
      ],
      hooks: {
        draw: [
          (u: uPlot) => {
            const ctx = u.ctx;
            ctx.save();
            ctx.strokeStyle = themeVar('--bad', '#d62728');
            ctx.lineWidth = 2;
            for (const t of marks()) {
              const x = u.valToPos(t / 1000, 'x', true);
              if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
              ctx.beginPath();
              ctx.moveTo(x, u.bbox.top);
              ctx.lineTo(x, u.bbox.top + u.bbox.height);
              ctx.stroke();
            }
            if (this.spec.now !== undefined) {
              const x = u.valToPos(this.spec.now / 1000, 'x', true);
              if (x >= u.bbox.left && x <= u.bbox.left + u.bbox.width) {
                ctx.strokeStyle = themeVar('--muted', '#8e8e93');
                ctx.lineWidth = 1;
                ctx.setLineDash([2, 3]);
                ctx.beginPath();
                ctx.moveTo(x, u.bbox.top);
                ctx.lineTo(x, u.bbox.top + u.bbox.height);
                ctx.stroke();
              }
            }
            ctx.restore();
          },
        ],
      },
    };
    this.plot = new uPlot(opts, this.data as uPlot.AlignedData, this.root);
    themed.add(this.plot);
  }

  /** Replaces the data: xs in ms, one array of values per series (a value the API left
   * out, `undefined`, is absent like `null`: a gap). */
  setData(xsMs: number[], ys: (number | null | undefined)[][]): void {
    this.data = [xsMs.map((x) => x / 1000), ...ys.map((y) => y.map(absent))];
    this.redraw();
  }

  setMarks(times: number[]): void {
    this.marks = times;
    this.plot?.redraw(false);
  }

  /** Keeps only the last `ms` of data when points are appended (live view). */
  setWindow(ms: number | null): void {
    this.windowMs = ms;
  }

  /** Appends one point per series at time `tMs` (ignored if not newer than the last). */
  append(tMs: number, values: (number | null | undefined)[]): void {
    const xs = this.data[0];
    const t = tMs / 1000;
    if (xs.length > 0 && (xs[xs.length - 1] as number) >= t) return;
    xs.push(t);
    for (let i = 0; i < values.length && i + 1 < this.data.length; i++) this.data[i + 1].push(absent(values[i]));
    if (this.windowMs !== null) {
      const min = t - this.windowMs / 1000;
      let drop = 0;
      while (drop < xs.length && (xs[drop] as number) < min) drop++;
      if (drop > 0) for (const arr of this.data) arr.splice(0, drop);
    }
    this.redraw();
  }

  private redraw(): void {
    const xs = this.data[0];
    this.root.dataset.lastMs = xs.length ? String(Math.round((xs[xs.length - 1] as number) * 1000)) : '';
    this.root.dataset.points = String(xs.length);
    // Per series, the points drawn (not null): "12,30".
    this.root.dataset.seriesPoints = this.data.slice(1).map((ys) => ys.filter((v) => v !== null).length).join(',');
    this.plot?.setData(this.data as uPlot.AlignedData);
  }

  destroy(): void {
    if (this.plot) themed.delete(this.plot);
    this.plot?.destroy();
    this.plot = null;
  }
}

/** A value the API left out is absent, as `null` is (uPlot draws a gap for `null`). */
function absent(v: number | null | undefined): number | null {
  return v ?? null;
}

/** A series' points as the API gives them, `[time_ms, value]` (its description types each
 * as a list of numbers or nulls): those that have a time, as pairs. */
export function pairs(points: (number | null)[][]): [number, number | null][] {
  const out: [number, number | null][] = [];
  for (const [t, v] of points) if (typeof t === 'number') out.push([t, v ?? null]);
  return out;
}

/** Aligns per-series point lists on one sorted x axis (null where a series has no point). */
export function align(series: [number, number | null][][]): { xs: number[]; ys: (number | null)[][] } {
  const set = new Set<number>();
  for (const s of series) for (const [t] of s) set.add(t);
  const xs = [...set].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const ys = series.map((s) => {
    const col: (number | null)[] = new Array(xs.length).fill(null);
    for (const [t, v] of s) col[index.get(t) as number] = v;
    return col;
  });
  return { xs, ys };
}
