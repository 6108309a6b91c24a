// The node page: NVDashboard's panels for one node plus nvidia-smi's GPU and process
// tables, and the tensor-core activity (GPM) of its GPUs that report it. History comes
// from the downsampled series API; in live view the charts and tables follow the node's
// live stream.
import {
  enc, getJson, type EnergyTotals, type EnergyView, type GpuView, type HostSeries, type LiveTick, type NodeSeries, type NodeView,
} from './api';
import { align, Chart, pairs } from './chart';
import { carbonG, co2, kwh } from './carbon';
import { ago, bytes, clear, el, NA, num, patch, rate, scrollBox, watts } from './dom';
import { cpctToPct, hasGpm, seriesName, tensorNote } from './gpm';
import { healthBadge, reasonList } from './health';
import { openLive } from './live';
import { currentRange, rangePicker, rangeQuery, type Range } from './range';
import { workloadCell } from './workload';

const pct = (v: number) => `${Math.round(v)}%`;
const gib = (v: number) => `${(v / 2 ** 30).toFixed(1)} GiB`;
const bps = (v: number) => rate(v);

/** The GPUs' energy in the page's range (absent until loaded, or when not accounted);
 * client-side: /api/v1/energy's GPUs by UUID. */
type EnergyByGpu = Map<string, EnergyTotals>;

function gpuTable(n: NodeView, energy: EnergyByGpu | null): HTMLTableElement {
  const head = ['GPU', 'name', 'health', 'bus id', 'temp', 'perf', 'power / cap', 'memory', 'util', 'ECC corr / uncorr', 'fan', 'SM / mem clock',
    'energy (range)', 'CO2 (range)'];
  const tbody = el('tbody');
  for (const g of n.gpus) {
    const l = n.status === 'offline' ? null : g.latest;
    tbody.append(el('tr', { 'data-uuid': g.uuid },
      el('td', {}, el('a', { href: `/gpu/${enc(g.uuid)}` }, String(g.index))),
      el('td', {}, g.name),
      el('td', { 'data-col': 'health' }, healthBadge(g.health?.state)),
      el('td', {}, g.inventory.pci_bus_id ?? NA),
      el('td', {}, num(l?.temp_gpu_c, 0, '°C')),
      el('td', {}, l?.pstate === null || l?.pstate === undefined ? NA : `P${l.pstate}`),
      el('td', {}, `${watts(l?.power_mw)} / ${watts(l?.power_limit_mw)}`),
      el('td', {}, `${bytes(l?.mem_used_bytes)} / ${bytes(l?.mem_total_bytes)}`),
      el('td', { 'data-col': 'util' }, num(l?.util_gpu_pct, 0, '%'), l ? tensorNote(l.gpm, ' · ') : null),
      el('td', {}, `${num(l?.ecc_corrected_volatile)} / ${num(l?.ecc_uncorrected_volatile)}`),
      el('td', {}, num(l?.fan_pct, 0, '%')),
      el('td', {}, `${num(l?.clock_sm_mhz, 0, ' MHz')} / ${num(l?.clock_mem_mhz, 0, ' MHz')}`),
      el('td', { 'data-col': 'energy' }, energy ? kwh(energy.get(g.uuid)?.energy_kwh) : '…'),
      el('td', { 'data-col': 'co2' }, energy ? co2(carbonG(energy.get(g.uuid))) : '…')));
  }
  return el('table', { class: 'smi', id: 'gpu-table' }, el('thead', {}, el('tr', {}, ...head.map((h) => el('th', { scope: 'col' }, h)))), tbody);
}

function processTable(n: NodeView): HTMLElement {
  const tbody = el('tbody');
  const byUuid = new Map(n.gpus.map((g) => [g.uuid, g.index]));
  const procs = n.status === 'offline' ? [] : n.gpus.flatMap((g) => g.processes);
  for (const p of procs) {
    tbody.append(el('tr', { 'data-pid': String(p.pid) },
      el('td', {}, String(byUuid.get(p.gpu_uuid) ?? NA)),
      el('td', {}, String(p.pid)),
      el('td', {}, p.user ?? NA),
      workloadCell(p.workload),
      el('td', { class: 'cmd' }, p.command ?? NA),
      el('td', {}, bytes(p.gpu_mem_bytes)),
      el('td', {}, num(p.sm_util_pct, 0, '%'))));
  }
  if (procs.length === 0) tbody.append(el('tr', {}, el('td', { colspan: '7' }, 'no processes')));
  const head = ['GPU', 'pid', 'user', 'workload', 'command', 'GPU mem', 'SM'];
  return el('table', { class: 'procs', id: 'process-table' }, el('thead', {}, el('tr', {}, ...head.map((h) => el('th', { scope: 'col' }, h)))), tbody);
}

/** What is wrong on the node: its own reasons, then each GPU's that are not only informational. */
function healthSection(n: NodeView): HTMLElement {
  const box = el('div', { id: 'health' });
  if (n.health && n.health.reasons.length > 0) box.append(reasonList(n.health.reasons, 'node-reasons'));
  for (const g of n.gpus) {
    const reasons = g.health?.reasons ?? [];
    if (reasons.length === 0) continue;
    box.append(el('div', { class: 'gpu-health', 'data-uuid': g.uuid },
      el('a', { href: `/gpu/${enc(g.uuid)}` }, `GPU ${g.index}`), ' ', healthBadge(g.health?.state),
      reasonList(reasons)));
  }
  if (!box.firstChild) box.append(el('p', { class: 'muted' }, 'no problems found'));
  return box;
}

function hostInfo(n: NodeView, now: number): HTMLElement {
  const h = n.host;
  const labels = Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(' ');
  return el('div', { class: 'nodeinfo' },
    el('h2', {}, n.name, ' ', el('span', { class: `badge ${n.status}`, id: 'node-status' }, n.status),
      ' ', healthBadge(n.health?.state, 'node-health')),
    el('p', {},
      `last sample ${ago(n.last_seen_ms, now)} · ${n.gpus.length} GPUs · driver ${h.driver_version ?? NA} · CUDA ${h.cuda_driver_version ?? NA}`,
      ` · ${h.os ?? NA} · kernel ${h.kernel ?? NA} · ${h.cpu_count ?? NA} CPUs · ${bytes(h.memory_total_bytes)} RAM`,
      labels ? ` · ${labels}` : ''));
}

interface Panels {
  util: Chart;
  mem: Chart;
  resUtil: Chart;
  resMem: Chart;
  resPcie: Chart;
  resNvlink: Chart;
  pcie: Chart;
  nvlink: Chart;
  cpu: Chart;
  hostMem: Chart;
  disk: Chart;
  net: Chart;
  /** Tensor-core activity (GPM) of the GPUs that report it; none without such a GPU. */
  tensor: Chart | null;
  /** The UUIDs of the tensor chart's series, in order (fixed when the page opened). */
  tensorGpus: string[];
}

/** Every chart of the panels. */
function allCharts(p: Panels): Chart[] {
  return Object.values(p).filter((c): c is Chart => c instanceof Chart);
}

/** The node's GPUs with GPM (Hopper and newer), as their latest sample shows. */
function gpmGpus(n: NodeView): GpuView[] {
  return n.gpus.filter((g) => hasGpm(g.latest?.gpm));
}

function makePanels(n: NodeView): Panels {
  const withGpm = gpmGpus(n);
  const perGpu = n.gpus.map((g) => ({ label: `GPU ${g.index}` }));
  const perGpuDir = n.gpus.flatMap((g) => [{ label: `GPU ${g.index} tx` }, { label: `GPU ${g.index} rx` }]);
  return {
    util: new Chart({ title: 'GPU Utilization', unit: '%', series: perGpu, fmt: pct, yRange: [0, 100] }),
    mem: new Chart({ title: 'GPU Memory', unit: 'GiB used', series: perGpu, fmt: gib }),
    resUtil: new Chart({ title: 'GPU Resources: utilization', unit: '% (mean of GPUs)', series: [{ label: 'util' }, { label: 'memory used' }], fmt: pct, yRange: [0, 100], height: 110, sync: 'res' }),
    resMem: new Chart({ title: 'GPU Resources: memory', unit: 'GiB (sum)', series: [{ label: 'used' }], fmt: gib, height: 110, sync: 'res' }),
    resPcie: new Chart({ title: 'GPU Resources: PCIe', unit: 'sum', series: [{ label: 'tx' }, { label: 'rx' }], fmt: bps, height: 110, sync: 'res' }),
    resNvlink: new Chart({ title: 'GPU Resources: NVLink', unit: 'sum', series: [{ label: 'tx' }, { label: 'rx' }], fmt: bps, height: 110, sync: 'res' }),
    pcie: new Chart({ title: 'PCIe Throughput', unit: 'per GPU', series: perGpuDir, fmt: bps }),
    nvlink: new Chart({ title: 'NVLink Throughput', unit: 'per GPU', series: perGpuDir, fmt: bps }),
    cpu: new Chart({ title: 'Machine Resources: CPU', unit: '%', series: [{ label: 'cpu' }], fmt: pct, yRange: [0, 100] }),
    hostMem: new Chart({ title: 'Machine Resources: memory', unit: 'GiB', series: [{ label: 'used' }, { label: 'total' }], fmt: gib }),
    disk: new Chart({ title: 'Machine Resources: disk', unit: '', series: [{ label: 'read' }, { label: 'write' }], fmt: bps }),
    net: new Chart({ title: 'Machine Resources: network', unit: '', series: [{ label: 'rx' }, { label: 'tx' }], fmt: bps }),
    tensor: withGpm.length === 0 ? null
      : new Chart({ title: 'Tensor Core Activity', unit: '% of peak (GPM)', series: withGpm.map((g) => ({ label: `GPU ${g.index}` })),
        fmt: (v) => `${v.toFixed(1)}%`, yRange: [0, 100] }),
    tensorGpus: withGpm.map((g) => g.uuid),
  };
}

const sum = (vs: (number | null | undefined)[]): number | null => {
  let s = 0;
  let any = false;
  for (const v of vs) if (typeof v === 'number') { s += v; any = true; }
  return any ? s : null;
};
const mean = (vs: (number | null | undefined)[]): number | null => {
  const xs = vs.filter((v): v is number => typeof v === 'number');
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
};

/** Mean over GPUs of mem used / total, in %. */
function memPct(used: (number | null)[], total: (number | null)[]): number | null {
  return mean(used.map((u, i) => (u !== null && total[i] ? (100 * u) / (total[i] as number) : null)));
}

async function loadHistory(name: string, n: NodeView, r: Range, p: Panels): Promise<void> {
  const q = rangeQuery(r, n.interval_ms || 1000);
  const base = `/api/v1/nodes/${enc(name)}`;
  const metrics = ['util_gpu_pct', 'mem_used_bytes', 'mem_total_bytes', 'pcie_tx_bps', 'pcie_rx_bps', 'nvlink_tx_bps', 'nvlink_rx_bps'];
  const tensorMetric = seriesName('tensor_active_cpct');
  const [series, host, tensor] = await Promise.all([
    Promise.all(metrics.map((m) => getJson<NodeSeries>(`${base}/series?metric=${m}&${q}`))),
    getJson<HostSeries>(`${base}/host/series?${q}`).catch(() => null),
    p.tensor ? getJson<NodeSeries>(`${base}/series?metric=${tensorMetric}&${q}`).catch(() => null) : Promise.resolve(null),
  ]);
  const by = Object.fromEntries(metrics.map((m, i) => [m, series[i]]));
  const pts = (m: string) => n.gpus.map((g) => pairs(by[m].gpus.find((x) => x.uuid === g.uuid)?.points ?? []));
  const all = align([...pts('util_gpu_pct'), ...pts('mem_used_bytes'), ...pts('mem_total_bytes'),
    ...pts('pcie_tx_bps'), ...pts('pcie_rx_bps'), ...pts('nvlink_tx_bps'), ...pts('nvlink_rx_bps')]);
  const k = n.gpus.length;
  const col = (block: number) => all.ys.slice(block * k, (block + 1) * k);
  const [util, used, total, ptx, prx, ntx, nrx] = [0, 1, 2, 3, 4, 5, 6].map(col);
  const row = (cols: (number | null)[][], i: number) => cols.map((c) => c[i]);
  const xs = all.xs;
  p.util.setData(xs, util);
  p.mem.setData(xs, used);
  p.resUtil.setData(xs, [xs.map((_, i) => mean(row(util, i))), xs.map((_, i) => memPct(row(used, i), row(total, i)))]);
  p.resMem.setData(xs, [xs.map((_, i) => sum(row(used, i)))]);
  p.resPcie.setData(xs, [xs.map((_, i) => sum(row(ptx, i))), xs.map((_, i) => sum(row(prx, i)))]);
  p.resNvlink.setData(xs, [xs.map((_, i) => sum(row(ntx, i))), xs.map((_, i) => sum(row(nrx, i)))]);
  p.pcie.setData(xs, ptx.flatMap((c, i) => [c, prx[i]]));
  p.nvlink.setData(xs, ntx.flatMap((c, i) => [c, nrx[i]]));
  const hp = host?.points ?? [];
  const hx = hp.map((h) => h.time_ms);
  p.cpu.setData(hx, [hp.map((h) => h.cpu_util_pct)]);
  p.hostMem.setData(hx, [hp.map((h) => h.mem_used_bytes), hp.map((h) => h.mem_total_bytes)]);
  p.disk.setData(hx, [hp.map((h) => h.disk_read_bps), hp.map((h) => h.disk_write_bps)]);
  p.net.setData(hx, [hp.map((h) => h.net_rx_bps), hp.map((h) => h.net_tx_bps)]);
  if (p.tensor && tensor) {
    const t = align(p.tensorGpus.map((uuid) => pairs(tensor.gpus.find((x) => x.uuid === uuid)?.points ?? [])
      .map(([at, v]) => [at, cpctToPct(v)] as [number, number | null])));
    p.tensor.setData(t.xs, t.ys);
  }
}

function appendTick(n: NodeView, t: LiveTick, p: Panels): void {
  const s = n.gpus.map((g) => t.gpus.find((x) => x.uuid === g.uuid));
  const f = (k: 'util_gpu_pct' | 'mem_used_bytes' | 'mem_total_bytes' | 'pcie_tx_bps' | 'pcie_rx_bps' | 'nvlink_tx_bps' | 'nvlink_rx_bps') =>
    s.map((x) => x?.[k] ?? null);
  const util = f('util_gpu_pct');
  const used = f('mem_used_bytes');
  const total = f('mem_total_bytes');
  const ptx = f('pcie_tx_bps');
  const prx = f('pcie_rx_bps');
  const ntx = f('nvlink_tx_bps');
  const nrx = f('nvlink_rx_bps');
  p.util.append(t.time_ms, util);
  p.mem.append(t.time_ms, used);
  p.resUtil.append(t.time_ms, [mean(util), memPct(used, total)]);
  p.resMem.append(t.time_ms, [sum(used)]);
  p.resPcie.append(t.time_ms, [sum(ptx), sum(prx)]);
  p.resNvlink.append(t.time_ms, [sum(ntx), sum(nrx)]);
  p.pcie.append(t.time_ms, ptx.flatMap((v, i) => [v, prx[i]]));
  p.nvlink.append(t.time_ms, ntx.flatMap((v, i) => [v, nrx[i]]));
  p.tensor?.append(t.time_ms, p.tensorGpus.map((uuid) => cpctToPct(t.gpus.find((x) => x.uuid === uuid)?.gpm?.tensor_active_cpct)));
  if (t.host) {
    const h = t.host;
    p.cpu.append(t.time_ms, [h.cpu_util_pct]);
    p.hostMem.append(t.time_ms, [h.mem_used_bytes, h.mem_total_bytes]);
    p.disk.append(t.time_ms, [h.disk_read_bps, h.disk_write_bps]);
    p.net.append(t.time_ms, [h.net_rx_bps, h.net_tx_bps]);
  }
}

export async function nodePage(app: HTMLElement, name: string, navigate: (url: string) => void): Promise<() => void> {
  const base = `/api/v1/nodes/${enc(name)}`;
  let n = await getJson<NodeView>(base);
  const r = currentRange();
  const info = el('div', { id: 'info' });
  const tables = el('div', { id: 'tables' });
  const panels = makePanels(n);
  const grid = el('div', { class: 'panels', id: 'panels' },
    panels.util.root, panels.mem.root,
    el('div', { class: 'timeline', id: 'resources' }, panels.resUtil.root, panels.resMem.root, panels.resPcie.root, panels.resNvlink.root),
    panels.pcie.root, panels.nvlink.root, panels.tensor?.root,
    panels.cpu.root, panels.hostMem.root, panels.disk.root, panels.net.root);
  let energy: EnergyByGpu | null = null;
  const showTables = () => {
    patch(info, hostInfo(n, Date.now()));
    patch(tables, el('h3', {}, 'Health'), healthSection(n), el('h3', {}, 'GPUs'), scrollBox('GPUs', gpuTable(n, energy)),
      el('h3', {}, 'Processes'), scrollBox('processes', processTable(n)));
  };
  void getJson<EnergyView>(`/api/v1/energy?from=${r.fromMs}&to=${r.toMs}&node=${enc(name)}`)
    .then((e) => {
      energy = new Map(e.gpus.map((g) => [g.uuid, g]));
      showTables();
    })
    .catch(() => {
      energy = new Map();
      showTables();
    });
  clear(app);
  app.append(info, rangePicker(r, (q) => navigate(`/node/${enc(name)}${q}`)), tables, grid);
  showTables();
  for (const c of allCharts(panels)) c.mount();
  await loadHistory(name, n, r, panels);
  if (!r.live) return () => allCharts(panels).forEach((c) => c.destroy());

  const windowMs = r.toMs - r.fromMs;
  for (const c of allCharts(panels)) c.setWindow(windowMs);
  let pending = false;
  const close = openLive(name, {
    tick: (t) => {
      // The tick's time as the API writes a view's `time` (RFC 3339, milliseconds, UTC).
      const time = new Date(t.time_ms).toISOString();
      for (const s of t.gpus) {
        const g: GpuView | undefined = n.gpus.find((x) => x.uuid === s.uuid);
        if (!g) continue;
        g.latest = { ...s, time, time_ms: t.time_ms };
        g.processes = t.processes.filter((p) => p.gpu_uuid === s.uuid);
      }
      if (t.host) n.host.latest = { ...t.host, time };
      n.last_seen_ms = Math.max(n.last_seen_ms ?? 0, t.time_ms);
      appendTick(n, t, panels);
      if (!pending) {
        pending = true;
        requestAnimationFrame(() => { pending = false; showTables(); });
      }
    },
    status: async (s) => {
      const x = s.nodes.find((y) => y.name === name);
      if (x && x.status !== n.status) {
        n.status = x.status;
        showTables();
      }
      // A GPU's health changed: reload the node for its reasons.
      const changed = x && n.gpus.some((g) => g.health && (x.gpu_health?.[g.uuid] ?? 'ok') !== g.health.state);
      if (changed) {
        n = await getJson<NodeView>(base);
        showTables();
      }
    },
    resync: async () => {
      n = await getJson<NodeView>(base);
      showTables();
    },
  });
  return () => {
    close();
    allCharts(panels).forEach((c) => c.destroy());
  };
}
