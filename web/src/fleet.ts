// The fleet page: every node as a card of GPU tiles, filtered, sorted and paginated
// (PAGE_SIZE nodes per page, so 1,000 nodes x 8 GPUs stay fast). One /api/v1/nodes load,
// then one live stream for everything.
import { getJson, type FleetGpu, type FleetNode, type GpmMetrics, type LiveStatus, type LiveTick } from './api';
import { ago, bytes, clear, el, loadClass, num, patch, watts } from './dom';
import { tensorNote } from './gpm';
import { healthBadge, reasonsText } from './health';
import { openLive } from './live';

const PAGE_SIZE = 48;
const RENDER_EVERY_MS = 250;
/** At most this often, a change of some GPU's health reloads the list (for its reasons). */
const RELOAD_REASONS_MS = 10_000;
/** A GPU counts as busy at or above this utilization. */
export const BUSY_PCT = 10;

/** Memory a GPU must hold, at 0 % utilization, to count as idle but allocated. */
export const IDLE_HELD_BYTES = 1024 ** 3;

type SortKey = 'name' | 'load' | 'status' | 'health';

/** A GPU holding memory while doing nothing, the waste an operator hunts: 0 % utilization
 * and at least 1 GiB held (`gpufleet top`'s rule, client/src/model.rs). An offline node's
 * GPUs show no values, so none of them counts. */
export function idleButAllocated(n: FleetNode, g: FleetGpu): boolean {
  const l = g.latest;
  return n.status !== 'offline' && !!l && l.util_gpu_pct === 0 && typeof l.mem_used_bytes === 'number' && l.mem_used_bytes >= IDLE_HELD_BYTES;
}

const HEALTH_RANK = { critical: 0, warning: 1, ok: 2 } as const;

function nodeLoad(n: FleetNode): number {
  const vals = n.gpus.map((g) => g.latest?.util_gpu_pct).filter((v): v is number => typeof v === 'number');
  return vals.length ? vals.reduce((a, b) => a + b, 0) / vals.length : -1;
}

function matches(n: FleetNode, q: string): boolean {
  if (!q) return true;
  const terms = q.toLowerCase().split(/\s+/).filter(Boolean);
  const hay = [n.name, ...Object.entries(n.labels).flatMap(([k, v]) => [k, v, `${k}=${v}`]), n.status,
    n.health?.state ?? 'ok', n.gpus.some((g) => idleButAllocated(n, g)) ? 'idle-allocated' : '']
    .map((s) => s.toLowerCase());
  return terms.every((t) => hay.some((h) => h.includes(t)));
}

function tile(n: FleetNode, g: FleetGpu): HTMLElement {
  // The listing's latest has no GPM; a live tick's sample (all of it) has.
  const l: (FleetGpu['latest'] & { gpm?: GpmMetrics }) | null | undefined = n.status === 'offline' ? null : g.latest;
  const util = l?.util_gpu_pct ?? null;
  const memPct = l && l.mem_used_bytes != null && l.mem_total_bytes ? (100 * l.mem_used_bytes) / l.mem_total_bytes : null;
  const health = g.health?.state ?? 'ok';
  const why = reasonsText(g.health?.reasons.filter((r) => r.severity !== 'ok'));
  const idle = idleButAllocated(n, g);
  const held = idle ? `idle but allocated: 0% utilization, ${bytes(l?.mem_used_bytes)} held` : '';
  const t = el('a', {
    class: `tile ${loadClass(util)} health-${health}${idle ? ' idle-alloc' : ''}`,
    href: `/gpu/${encodeURIComponent(g.uuid)}`,
    title: [`${g.name} ${g.uuid}`, held, why].filter(Boolean).join('\n'),
    'data-uuid': g.uuid,
    'data-health': health,
    'data-idle-allocated': idle ? 'true' : undefined,
  },
  // Its accessible name is its visible text, with the node (said, not shown) first.
  el('span', { class: 'sr-only' }, `${n.name} `),
  el('span', { class: 'idx' }, `GPU ${g.index}`, health !== 'ok' ? healthBadge(health) : null,
    idle ? el('span', { class: 'idle-mark' }, 'idle') : null),
  el('span', { class: 'util' }, num(util, 0, '%')),
  tensorNote(l?.gpm),
  el('span', { class: 'mem' }, 'mem ', num(memPct, 0, '%')),
  el('span', { class: 'pow' }, watts(l?.power_mw), ' / ', watts(l?.power_limit_mw)),
  el('span', { class: 'temp' }, num(l?.temp_gpu_c, 0, '°C')));
  return t;
}

function card(n: FleetNode, now: number): HTMLElement {
  const labels = el('div', { class: 'labels' });
  for (const [k, v] of Object.entries(n.labels)) labels.append(el('span', { class: 'label' }, `${k}=${v}`));
  const tiles = el('div', { class: 'tiles' });
  for (const g of n.gpus) tiles.append(tile(n, g));
  const host = n.host.latest;
  return el('article', { class: `node ${n.status}`, 'data-node': n.name, 'data-status': n.status },
    el('header', {},
      el('a', { class: 'name', href: `/node/${encodeURIComponent(n.name)}` }, n.name),
      el('span', { class: `badge ${n.status}` }, n.status),
      n.health && n.health.state !== 'ok' ? healthBadge(n.health.state) : null,
      el('span', { class: 'seen' }, ago(n.last_seen_ms, now)),
      host ? el('span', { class: 'host' }, 'cpu ', num(host.cpu_util_pct, 0, '%'), ' · mem ', bytes(host.mem_used_bytes)) : null),
    labels,
    tiles);
}

export async function fleetPage(app: HTMLElement): Promise<() => void> {
  let nodes = new Map<string, FleetNode>();
  let now = Date.now();
  const q = new URLSearchParams(location.search);
  let filter = q.get('q') ?? '';
  let sort = (q.get('sort') as SortKey) ?? 'name';
  let page = Math.max(0, Number(q.get('page') ?? '0') || 0);
  /** Only nodes with an idle-but-allocated GPU (`?idle=1`). */
  let onlyIdle = q.get('idle') === '1';

  const totals = el('div', { class: 'totals', id: 'totals' });
  const search = el('input', { type: 'search', id: 'filter', 'aria-label': 'filter nodes', placeholder: 'filter: name, label (rack=r1), status, idle-allocated', value: filter });
  const idleBtn = el('button', { type: 'button', id: 'only-idle', class: 'toggle', 'aria-pressed': String(onlyIdle),
    title: 'only nodes with a GPU at 0% utilization holding at least 1 GiB' }, 'idle but allocated only');
  const sortSel = el('select', { id: 'sort', 'aria-label': 'sort' },
    el('option', { value: 'name' }, 'sort by name'),
    el('option', { value: 'load' }, 'sort by load'),
    el('option', { value: 'status' }, 'sort by status'),
    el('option', { value: 'health' }, 'sort by health'));
  sortSel.value = sort;
  const pager = el('div', { class: 'pager' });
  const grid = el('div', { class: 'fleet', id: 'fleet' });
  clear(app);
  app.append(el('div', { class: 'toolbar' }, search, sortSel, idleBtn, pager), totals, grid);

  const keepUrl = () => {
    const p = new URLSearchParams();
    if (filter) p.set('q', filter);
    if (sort !== 'name') p.set('sort', sort);
    if (page) p.set('page', String(page));
    if (onlyIdle) p.set('idle', '1');
    const s = p.toString();
    history.replaceState(null, '', s ? `/?${s}` : '/');
  };

  let scheduled = false;
  const render = () => {
    scheduled = false;
    const all = [...nodes.values()];
    let gpus = 0;
    let busy = 0;
    let idleAllocated = 0;
    let powerMw = 0;
    let powerKnown = false;
    const counts = { online: 0, stale: 0, offline: 0 };
    const health = { ok: 0, warning: 0, critical: 0 };
    for (const n of all) {
      counts[n.status]++;
      gpus += n.gpus.length;
      for (const g of n.gpus) health[g.health?.state ?? 'ok']++;
      if (n.status === 'offline') continue;
      for (const g of n.gpus) {
        const u = g.latest?.util_gpu_pct;
        if (typeof u === 'number' && u >= BUSY_PCT) busy++;
        if (idleButAllocated(n, g)) idleAllocated++;
        const p = g.latest?.power_mw;
        if (typeof p === 'number') {
          powerMw += p;
          powerKnown = true;
        }
      }
    }
    clear(totals);
    totals.append(
      el('span', { 'data-total': 'nodes' }, `${all.length} nodes`),
      el('span', {}, `${counts.online} online · ${counts.stale} stale · ${counts.offline} offline`),
      el('span', { 'data-total': 'gpus' }, `${gpus} GPUs`),
      el('span', { 'data-total': 'health' }, `${health.critical} critical · ${health.warning} warning`),
      el('span', { 'data-total': 'busy' }, `${busy} busy (≥ ${BUSY_PCT}%)`),
      el('span', { 'data-total': 'idle-allocated', 'data-value': String(idleAllocated), class: idleAllocated > 0 ? 'idle-total' : undefined,
        title: 'GPUs at 0% utilization holding at least 1 GiB of memory' }, `${idleAllocated} idle but allocated`),
      el('span', { 'data-total': 'power' }, `power now ${powerKnown ? (powerMw / 1e6).toFixed(2) + ' kW' : 'n/a'}`));

    const shown = all.filter((n) => matches(n, filter) && (!onlyIdle || n.gpus.some((g) => idleButAllocated(n, g))));
    if (sort === 'load') shown.sort((a, b) => nodeLoad(b) - nodeLoad(a) || a.name.localeCompare(b.name));
    else if (sort === 'status') {
      const rank = { offline: 0, stale: 1, online: 2 };
      shown.sort((a, b) => rank[a.status] - rank[b.status] || a.name.localeCompare(b.name));
    } else if (sort === 'health') {
      const h = (n: FleetNode) => HEALTH_RANK[n.health?.state ?? 'ok'];
      shown.sort((a, b) => h(a) - h(b) || a.name.localeCompare(b.name));
    }
    const pages = Math.max(1, Math.ceil(shown.length / PAGE_SIZE));
    page = Math.min(page, pages - 1);
    clear(pager);
    const prev = el('button', { type: 'button', id: 'prev', 'aria-label': 'previous page' }, '‹');
    const next = el('button', { type: 'button', id: 'next', 'aria-label': 'next page' }, '›');
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
    prev.addEventListener('click', () => { page--; keepUrl(); render(); });
    next.addEventListener('click', () => { page++; keepUrl(); render(); });
    pager.append(prev, el('span', {}, `page ${page + 1} / ${pages} (${shown.length} nodes)`), next);

    const cards = shown.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE).map((n) => card(n, now));
    if (all.length === 0) patch(grid, el('p', {}, 'No nodes yet. Start an agent: gpufleet-agent run --collector URL'));
    else patch(grid, ...cards);
  };
  // At most one render per RENDER_EVERY_MS however many ticks arrive (1,000 nodes at 1 Hz
  // are 1,000 ticks a second); only the current page's cards are rebuilt.
  const schedule = () => {
    if (!scheduled) {
      scheduled = true;
      setTimeout(() => requestAnimationFrame(render), RENDER_EVERY_MS);
    }
  };

  search.addEventListener('input', () => { filter = search.value; page = 0; keepUrl(); schedule(); });
  sortSel.addEventListener('change', () => { sort = sortSel.value as SortKey; keepUrl(); schedule(); });
  idleBtn.addEventListener('click', () => {
    onlyIdle = !onlyIdle;
    idleBtn.setAttribute('aria-pressed', String(onlyIdle));
    page = 0;
    keepUrl();
    schedule();
  });

  let staleReasons = false;
  let loadedAt = 0;
  const load = async () => {
    // The brief listing (a fraction of /api/v1/nodes): what the tiles show.
    staleReasons = false;
    loadedAt = Date.now();
    const list = await getJson<FleetNode[]>('/api/v1/fleet');
    nodes = new Map(list.map((n) => [n.name, n]));
    now = Date.now();
    schedule();
  };
  await load();

  const onTick = (t: LiveTick) => {
    const n = nodes.get(t.node);
    if (!n) {
      void load(); // a new node: one reload of the list
      return;
    }
    for (const s of t.gpus) {
      const g = n.gpus.find((x) => x.uuid === s.uuid);
      if (!g) continue;
      g.latest = { ...s, time_ms: t.time_ms };
    }
    if (t.host) n.host.latest = t.host;
    n.last_seen_ms = Math.max(n.last_seen_ms ?? 0, t.time_ms);
    schedule();
  };
  const onStatus = (s: LiveStatus) => {
    now = s.now_ms;
    for (const x of s.nodes) {
      const n = nodes.get(x.name);
      if (!n) continue;
      n.status = x.status;
      n.last_seen_ms = x.last_seen_ms;
      n.connected = x.connected;
      // Health states follow the status event; a GPU whose state changed gets its
      // reasons at the next reload of the list.
      let changed = false;
      if (x.health && n.health && n.health.state !== x.health) {
        n.health.state = x.health;
        changed = true;
      }
      for (const g of n.gpus) {
        const st = x.gpu_health?.[g.uuid] ?? 'ok';
        if (g.health && g.health.state !== st) {
          g.health.state = st;
          changed = true;
        }
      }
      if (changed) staleReasons = true;
    }
    if (s.nodes.length !== nodes.size || (staleReasons && Date.now() - loadedAt > RELOAD_REASONS_MS)) void load();
    schedule();
  };
  return openLive(null, { tick: onTick, status: onStatus, resync: () => void load() });
}
