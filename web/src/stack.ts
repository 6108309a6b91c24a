// A stacked area chart (uPlot) of bands over time: each band's values are drawn on top of
// the bands below it, so the top edge is the whole. Colours are CSS custom properties
// (chart.ts themeVar); a click on a band picks it (the page filters by it). The root
// carries data-buckets and data-bands for tests.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { el } from './dom';
import { themedAxes, themeVar, themed } from './chart';

export interface StackBand {
  key: string;
  label: string;
  /** A custom property (`--series-1`, `--band-idle`). */
  color: string;
  /** One value per x, in the chart's unit. */
  values: number[];
}

export class StackChart {
  readonly root: HTMLElement;
  private plot: uPlot | null = null;

  constructor(readonly title: string, readonly unit: string, readonly id: string) {
    this.root = el('section', { class: 'stack', id, 'data-title': title },
      el('h3', {}, title, el('span', { class: 'muted' }, ` (${unit})`)));
  }

  /** Draws `bands` (bottom first) over `xsMs`; `pick(i)` is called with the band clicked. */
  mount(xsMs: number[], bands: StackBand[], fmt: (v: number) => string, pick: (i: number) => void, height = 240): void {
    this.destroy();
    const stacked: number[][] = [];
    let below = xsMs.map(() => 0);
    for (const b of bands) {
      const top = below.map((v, j) => v + (b.values[j] ?? 0));
      stacked.push(top);
      below = top;
    }
    const width = Math.max(300, this.root.clientWidth - 16);
    const opts: uPlot.Options = {
      width,
      height,
      legend: { show: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.05 : 1] } },
      axes: themedAxes(fmt),
      series: [
        {},
        ...bands.map((b, i) => ({
          label: b.label,
          stroke: () => themeVar(b.color),
          fill: () => themeVar(b.color),
          width: 1,
          points: { show: false },
          value: (_u: uPlot, _v: number | null, _s: number, idx: number | null) => (idx === null ? '–' : fmt(bands[i].values[idx] ?? 0)),
        })),
      ],
      // Each band fills down to the one below it, not to zero.
      bands: bands.slice(1).map((_, i) => ({ series: [i + 2, i + 1] as [number, number] })),
    };
    this.root.dataset.buckets = String(xsMs.length);
    this.root.dataset.bands = String(bands.length);
    const u = new uPlot(opts, [xsMs.map((x) => x / 1000), ...stacked] as uPlot.AlignedData, this.root);
    u.over.addEventListener('click', () => {
      const idx = u.cursor.idx;
      const top = u.cursor.top;
      if (idx === null || idx === undefined || top === null || top === undefined || top < 0) return;
      const y = u.posToVal(top, 'y');
      // The lowest band whose top edge is above the click and that has energy there.
      const i = stacked.findIndex((s, k) => (s[idx] ?? 0) >= y && (bands[k].values[idx] ?? 0) > 0);
      if (i >= 0) pick(i);
    });
    this.plot = u;
    themed.add(u);
  }

  destroy(): void {
    if (this.plot) themed.delete(this.plot);
    this.plot?.destroy();
    this.plot = null;
  }
}
