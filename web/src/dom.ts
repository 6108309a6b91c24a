// DOM helpers. Every string from the collector (node names, labels, commands, users) is
// inserted as text (textContent / text nodes), never parsed as HTML.

export type Child = Node | string | number | null | undefined | false;

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | undefined> = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined) e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
  return e;
}

export function clear(e: Element): void {
  while (e.firstChild) e.removeChild(e.firstChild);
}

/**
 * Gives `target` the children `fresh` (built by `el`, so attributes and text only, no
 * listeners), keeping every node already there that has the same place and tag: a live
 * re-render then changes texts and attributes, not elements, so a click whose press and
 * release straddle an update still lands on the link it started on (replacing the
 * elements would lose it), and a text selection survives.
 */
export function patch(target: Element, ...fresh: Child[]): void {
  const next = el('div', {}, ...fresh);
  patchChildren(target, next);
}

function patchChildren(old: Node, fresh: Node): void {
  const had = Array.from(old.childNodes);
  const want = Array.from(fresh.childNodes);
  want.forEach((f, i) => {
    const o = had[i];
    if (o === undefined) old.appendChild(f);
    else if (o.nodeType !== f.nodeType || o.nodeName !== f.nodeName) old.replaceChild(f, o);
    else if (o instanceof Element && f instanceof Element) {
      for (const a of Array.from(o.attributes)) if (!f.hasAttribute(a.name)) o.removeAttribute(a.name);
      for (const a of Array.from(f.attributes)) if (o.getAttribute(a.name) !== a.value) o.setAttribute(a.name, a.value);
      patchChildren(o, f);
    } else if (o.nodeValue !== f.nodeValue) o.nodeValue = f.nodeValue;
  });
  for (const o of had.slice(want.length)) old.removeChild(o);
}

/** "n/a" for absent values: gpufleet never shows a missing metric as 0. */
export const NA = 'n/a';

export function num(v: number | null | undefined, digits = 0, unit = ''): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return NA;
  return v.toFixed(digits) + unit;
}

export function bytes(v: number | null | undefined): string {
  if (v === null || v === undefined) return NA;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let x = v;
  let i = 0;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i++;
  }
  return x.toFixed(i === 0 ? 0 : 1) + ' ' + units[i];
}

export function rate(v: number | null | undefined): string {
  if (v === null || v === undefined) return NA;
  return bytes(v) + '/s';
}

export function watts(mw: number | null | undefined): string {
  return mw === null || mw === undefined ? NA : (mw / 1000).toFixed(0) + ' W';
}

export function ago(ms: number | null | undefined, now: number): string {
  if (ms === null || ms === undefined) return 'never';
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** Load class 0..4 for a utilization percentage (absent: "na"). */
export function loadClass(util: number | null | undefined): string {
  if (util === null || util === undefined) return 'load-na';
  if (util < 10) return 'load-0';
  if (util < 40) return 'load-1';
  if (util < 70) return 'load-2';
  if (util < 90) return 'load-3';
  return 'load-4';
}

/** A wide table in its own horizontally scrolling box, so the page itself is never wider
 * than the window; the box takes the keyboard focus (arrow keys scroll it) and is named
 * for screen readers. */
export function scrollBox(label: string, table: HTMLElement): HTMLElement {
  return el('div', { class: 'scroll', tabindex: '0', role: 'region', 'aria-label': label }, table);
}
