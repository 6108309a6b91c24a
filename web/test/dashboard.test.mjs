// Browser tests of the dashboard: the real gpufleet-collector demo (built by cargo) and a
// real gpufleet-agent, driven through Debian's chromium by playwright-core.
//
//   GPUFLEET_BIN_DIR   folder with gpufleet-collector and gpufleet-agent (default target/debug)
//   CHROMIUM           the browser (default /usr/bin/chromium)
//
// Screenshots go to web/test-results/.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const repo = fileURLToPath(new URL('../..', import.meta.url));
const bins = process.env.GPUFLEET_BIN_DIR ?? `${repo}target/debug`;
const shots = `${repo}web/test-results`;
mkdirSync(shots, { recursive: true });

const NODES = ['gpu-node-01', 'gpu-node-02', 'gpu-node-03'];
const GPUS_PER_NODE = 4;
const CSP = "default-src 'self'";
/** The demo's carbon: gpu-node-01 a static intensity, gpu-node-03 the UK Carbon Intensity
 * API (national; a local stub below), gpu-node-02 none, so its energy must show "n/a". */
const G_PER_KWH = 180;
const STATIC_NODE = 'gpu-node-01';
const UK_NODE = 'gpu-node-03';
const PRICED_NODES = [STATIC_NODE, UK_NODE];

// ---- A stub of the UK Carbon Intensity API (national endpoints), answering in the real
// JSON shape (shared/carbon/uk-intensity.json) with half-hour slots on a daily curve:
// slots that ended before the energy page's test range (see historyRange) carry an
// actual, later ones a forecast only, so that range is always priced by a forecast.
const HALF_HOUR_MS = 1_800_000;
const sharedCarbon = existsSync(`${repo}../shared/carbon`) ? `${repo}../shared/carbon` : `${repo}shared/carbon`;
const ukTemplate = JSON.parse(readFileSync(`${sharedCarbon}/uk-intensity.json`, 'utf8')).data[0];
const ukTime = (ms) => new Date(ms).toISOString().slice(0, 16) + 'Z';
const ukValue = (ms) => Math.round(200 + 120 * Math.sin((2 * Math.PI * ms) / 86_400_000));
function ukSlots(fromMs, toMs) {
  const out = [];
  for (let t = Math.floor(fromMs / HALF_HOUR_MS) * HALF_HOUR_MS; t < toMs && out.length < 2000; t += HALF_HOUR_MS) {
    const ended = t + HALF_HOUR_MS <= demoStartMs - 3 * 60_000;
    const forecast = ukValue(t);
    out.push({
      ...ukTemplate, from: ukTime(t), to: ukTime(t + HALF_HOUR_MS),
      intensity: { ...ukTemplate.intensity, forecast, actual: ended ? forecast - 3 : null },
    });
  }
  return out;
}
function startUkStub() {
  const server = createServer((req, res) => {
    const p = new URL(req.url, 'http://stub').pathname.split('/').filter(Boolean).map(decodeURIComponent);
    let data = null;
    if (p[0] === 'intensity' && p.length === 1) data = ukSlots(Date.now(), Date.now() + 1);
    else if (p[0] === 'intensity' && p[2] === 'fw24h') data = ukSlots(Date.parse(p[1]), Date.parse(p[1]) + 86_400_000);
    else if (p[0] === 'intensity' && p.length === 3) data = ukSlots(Date.parse(p[1]), Date.parse(p[2]));
    res.writeHead(data ? 200 : 404, { 'content-type': 'application/json' });
    res.end(JSON.stringify(data ? { data } : { error: { code: '404', message: 'no such endpoint in the stub' } }));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}
let ukStub;

let demo;
/** When the demo started: its simulated history (--history) ends here. */
let demoStartMs;
let agent;
let http;
let grpc;
let browser;
const cspViolations = [];

/** Starts a process and resolves with the first stdout line matching `re`. */
function startAndWait(bin, args, re, what) {
  const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, RUST_LOG: 'warn' } });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr = (stderr + d).slice(-4000); });
  const lines = createInterface({ input: child.stdout });
  const found = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} printed no ${re} within 60 s; stderr:\n${stderr}`)), 60_000);
    lines.on('line', (l) => {
      const m = re.exec(l);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited (${code}) before printing ${re}; stderr:\n${stderr}`));
    });
  });
  return { child, found };
}

function stop(child) {
  if (child && child.exitCode === null) child.kill('SIGKILL');
}

before(async () => {
  const config = `${mkdtempSync(`${tmpdir()}/gpufleet-demo-conf-`)}/demo.toml`;
  demoStartMs = Date.now();
  ukStub = await startUkStub();
  writeFileSync(config, [
    '[[carbon.nodes]]', `node = "${STATIC_NODE}"`, 'provider = "static"', `g_per_kwh = ${G_PER_KWH}`, 'region = "lab-east"',
    '[[carbon.nodes]]', `node = "${UK_NODE}"`, 'provider = "uk"', 'region = "national"',
    `url = "http://127.0.0.1:${ukStub.address().port}"`,
    // Alerts: one rule every demo GPU meets at once, one that stays pending for an hour.
    '[alerts]', 'evaluation_interval = "1s"',
    '[[alerts.rules]]', 'name = "DemoGpuWarm"', 'condition = "gpu_temp_c > 0"', 'severity = "info"',
    'annotations = { summary = "{{ $labels.node }} GPU {{ $labels.gpu_index }} at {{ $value }} C" }',
    '[[alerts.rules]]', 'name = "DemoGpuBusyAnHour"', 'condition = "gpu_util_pct >= 0"', 'for = "1h"', ''].join('\n'));
  const d = startAndWait(`${bins}/gpufleet-collector`, [
    'demo', '--config', config, '--http-listen', '127.0.0.1:0', '--nodes', String(NODES.length),
    '--gpus-per-node', String(GPUS_PER_NODE), '--interval', '200ms', '--stale-after', '2s',
    '--history', '35m', // covers an ended half-hour slot (actual intensity) and two whole minutes before the start
  ], /^listening grpc=(\S+) http=(\S+)$/, 'gpufleet-collector demo');
  demo = d.child;
  const m = await d.found;
  grpc = m[1];
  http = `http://${m[2]}`;
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
  });
});

after(async () => {
  await browser?.close();
  ukStub?.close();
  stop(agent);
  stop(demo);
});

/** A page whose responses carry the strict CSP the collector may be deployed with. */
async function newPage() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  // Only documents: the CSP of the page is the document's (and a live stream never ends,
  // so it cannot be fetched whole by the route).
  await page.route('**/*', async (route) => {
    if (route.request().resourceType() !== 'document') return route.continue();
    const res = await route.fetch();
    return route.fulfill({ response: res, headers: { ...res.headers(), 'content-security-policy': CSP } });
  });
  page.on('console', (msg) => {
    if (/Content Security Policy/i.test(msg.text())) cspViolations.push(msg.text());
  });
  page.on('pageerror', (e) => cspViolations.push(`page error: ${e.message}`));
  return page;
}

test('the fleet page shows every demo node with its GPUs and totals', async () => {
  const page = await newPage();
  await page.goto(`${http}/`);
  for (const n of NODES) {
    await page.locator(`article.node[data-node="${n}"]`).waitFor({ timeout: 15_000 });
  }
  // Tiles get live values (not n/a) once samples arrive.
  await page.waitForFunction(() => [...document.querySelectorAll('.tile .util')].some((e) => /\d+%/.test(e.textContent ?? '')));
  assert.equal(await page.locator('article.node').count(), NODES.length);
  assert.equal(await page.locator('.tile').count(), NODES.length * GPUS_PER_NODE);
  assert.match(await page.locator('[data-total=gpus]').innerText(), new RegExp(`^${NODES.length * GPUS_PER_NODE} GPUs`));
  assert.match(await page.locator('[data-total=power]').innerText(), /power now \d+\.\d\d kW/);

  // Filtering by a label narrows the list, and the URL keeps it.
  await page.fill('#filter', 'site=lab-east');
  await page.waitForFunction(() => document.querySelectorAll('article.node').length === 2);
  assert.match(page.url(), /\?q=site%3Dlab-east$/);
  await page.fill('#filter', '');
  await page.waitForFunction((n) => document.querySelectorAll('article.node').length === n, NODES.length);
  await page.screenshot({ path: `${shots}/fleet.png` });
  await page.context().close();
});

test('a node page shows its panels, GPU and process tables, and its charts advance live', async () => {
  const page = await newPage();
  await page.goto(`${http}/`);
  await page.click(`article.node[data-node="${NODES[0]}"] a.name`);
  await page.waitForURL(`${http}/node/${NODES[0]}`);
  for (const title of ['GPU Utilization', 'GPU Memory', 'GPU Resources: utilization', 'GPU Resources: PCIe',
    'GPU Resources: NVLink', 'PCIe Throughput', 'NVLink Throughput', 'Machine Resources: CPU',
    'Machine Resources: memory', 'Machine Resources: disk', 'Machine Resources: network']) {
    await page.locator(`.panel[data-title="${title}"] canvas`).waitFor({ timeout: 10_000 });
  }
  assert.equal(await page.locator('#gpu-table tbody tr').count(), GPUS_PER_NODE);
  await page.waitForFunction(() => document.querySelectorAll('#process-table tbody tr[data-pid]').length > 0);
  // Workloads are named as their runtime names them, ids one hover away: every process
  // the API gives a pod, container or Slurm job name shows that name, never a hash.
  const node = await api(`/api/v1/nodes/${NODES[0]}`);
  const cells = await page.$$eval('#process-table tbody tr[data-pid]', (trs) => trs.map((tr) => {
    const td = tr.querySelector('[data-col=workload]');
    return [Number(tr.getAttribute('data-pid')), td?.textContent ?? '', td?.getAttribute('title') ?? ''];
  }));
  let named = 0;
  for (const g of node.gpus) {
    for (const p of g.processes) {
      const cell = cells.find(([pid]) => pid === p.pid);
      if (!cell) continue;
      const w = p.workload;
      const name = w.pod_name ?? w.job_name ?? w.container_name;
      if (!name) continue;
      named += 1;
      assert.ok(cell[1].includes(name), `pid ${p.pid}: ${JSON.stringify(cell[1])} names ${name}`);
      if (w.namespace) assert.ok(cell[1].includes(w.namespace), `pid ${p.pid}: namespace ${w.namespace} in ${cell[1]}`);
      if (w.container_id) {
        assert.ok(!cell[1].includes(w.container_id.slice(0, 12)), `pid ${p.pid}: no hash in ${cell[1]}`);
        assert.ok(cell[2].includes(w.container_id), `pid ${p.pid}: the id on hover`);
      }
    }
  }
  assert.ok(named > 0, 'the demo node runs named workloads');

  // The utilization chart's newest point moves forward within 2 s (samples every 200 ms).
  const chart = page.locator('.panel[data-title="GPU Utilization"]');
  await page.waitForFunction(() => document.querySelector('.panel[data-title="GPU Utilization"]')?.getAttribute('data-last-ms'));
  const first = Number(await chart.getAttribute('data-last-ms'));
  await page.waitForFunction(
    (t) => Number(document.querySelector('.panel[data-title="GPU Utilization"]')?.getAttribute('data-last-ms')) > t,
    first, { timeout: 2000 });
  await page.screenshot({ path: `${shots}/node.png` });
  await page.screenshot({ path: `${shots}/node-full.png`, fullPage: true });

  // A range is part of the URL, and reloading keeps it.
  await page.click('.ranges button[data-range="1h"]');
  await page.waitForURL(`${http}/node/${NODES[0]}?range=1h`);
  await page.reload();
  await page.locator('.ranges button.active[data-range="1h"]').waitFor();
  await page.locator('.panel[data-title="GPU Utilization"][data-points]').waitFor();
  await page.context().close();
});

test('a GPU page shows every metric over the range', async () => {
  const page = await newPage();
  await page.goto(`${http}/node/${NODES[1]}`);
  // The tables follow the live stream; a click whose press and release straddle an
  // update still follows the link it was pressed on.
  const util = '.panel[data-title="GPU Utilization"]';
  await page.waitForFunction((sel) => document.querySelector(sel)?.getAttribute('data-last-ms'), util);
  const box = await page.locator('#gpu-table tbody tr:first-child a').boundingBox();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
  await page.mouse.down();
  const pressedAt = Number(await page.locator(util).getAttribute('data-last-ms'));
  await page.waitForFunction(
    ([sel, t]) => Number(document.querySelector(sel)?.getAttribute('data-last-ms')) > t, [util, pressedAt]);
  await page.evaluate(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
  await page.mouse.up();
  await page.waitForURL(/\/gpu\/GPU-/, { timeout: 5000 });
  await page.locator('.panel[data-title="GPU utilization"][data-points]').waitFor({ timeout: 10_000 });
  assert.ok((await page.locator('.panel').count()) >= 20);
  // The simulated H100 has no fan: its chart says n/a instead of drawing zeros.
  await page.locator('.panel[data-title="fan"] [data-na]').waitFor();
  // Live view follows the stream here too.
  const chart = page.locator('.panel[data-title="power"]');
  const first = Number(await chart.getAttribute('data-last-ms'));
  await page.waitForFunction(
    (t) => Number(document.querySelector('.panel[data-title="power"]')?.getAttribute('data-last-ms')) > t,
    first, { timeout: 2000 });
  await page.locator('#events').waitFor();
  await page.screenshot({ path: `${shots}/gpu.png`, fullPage: true });
  await page.context().close();
});

// ---- GPM (GPU Performance Monitoring): only Hopper and newer report it. The simulator
// draws each demo node's model from its name (h100-sxm, a100-sxm4-40gb or l40s), so the
// GPUs are found by the names the API gives them.
const HOPPER = /H100|H200|H800|GH200/;

/** The demo nodes' GPUs (with their node), from the fleet listing. */
async function demoGpus() {
  const fleet = await api('/api/v1/fleet');
  return fleet.filter((n) => NODES.includes(n.name)).flatMap((n) => n.gpus.map((g) => ({ ...g, node: n.name })));
}

/** A GPU with GPM (an H100) and one without (an A100, else any older model), or
 * undefined; and the demo nodes whose GPUs have GPM. */
async function gpmGpus() {
  const gpus = await demoGpus();
  const older = gpus.filter((g) => !HOPPER.test(g.name));
  return {
    hopper: gpus.find((g) => /H100/.test(g.name)),
    older: older.find((g) => /A100/.test(g.name)) ?? older[0],
    gpmNodes: new Set(gpus.filter((g) => HOPPER.test(g.name)).map((g) => g.node)),
  };
}

const GPM_CHARTS = ['GPM: SM, tensor and DRAM activity', 'GPM: tensor and FP pipes'];

test('GPM: an H100 shows its SM, tensor and DRAM activity (GPU page, node page, tile); an A100 says it has none', async () => {
  const { hopper, older } = await gpmGpus();
  // The demo's seeded nodes have both (the sim draws each node's model from its name).
  assert.ok(hopper, 'the demo has an H100');
  assert.ok(older, 'the demo has a GPU older than Hopper');
  const page = await newPage();
  {
    const d = await api(`/api/v1/gpus/${encodeURIComponent(hopper.uuid)}`);
    assert.equal(typeof d.latest?.gpm?.sm_active_cpct, 'number', `${hopper.name} reports GPM`);
    await page.goto(`${http}/gpu/${encodeURIComponent(hopper.uuid)}`);
    await page.locator('#gpm[data-gpm="true"]').waitFor({ timeout: 10_000 });
    assert.equal(await page.locator('#gpm h3').first().innerText(), 'GPU performance (GPM)');
    for (const title of GPM_CHARTS) await page.locator(`#gpm .panel[data-title="${title}"][data-points] canvas`).waitFor({ timeout: 10_000 });
    assert.equal(await page.locator('#no-gpm').count(), 0);
    // Values are drawn (GPM's 0 on an idle GPU is a value, not a gap), and live ticks extend them.
    const sel = `#gpm .panel[data-title="${GPM_CHARTS[0]}"]`;
    await page.waitForFunction((s) => Number(document.querySelector(s)?.getAttribute('data-series-points')?.split(',')[0]) > 0, sel);
    const first = Number(await page.locator(sel).getAttribute('data-last-ms'));
    await page.waitForFunction(([s, at]) => Number(document.querySelector(s)?.getAttribute('data-last-ms')) > at, [sel, first], { timeout: 2000 });
    await page.screenshot({ path: `${shots}/gpu-gpm.png`, fullPage: true });

    // Its node compares the GPUs' tensor activity, and its table puts tensor beside util.
    await page.goto(`${http}/node/${hopper.node}`);
    await page.locator('.panel[data-title="Tensor Core Activity"][data-points] canvas').waitFor({ timeout: 10_000 });
    await page.locator(`#gpu-table tr[data-uuid="${hopper.uuid}"] [data-col=util] .tensor`).waitFor({ timeout: 5000 });
    assert.match(await page.locator(`#gpu-table tr[data-uuid="${hopper.uuid}"] [data-col=util]`).innerText(), /^\d+% · tensor \d+%$/);

    // Its fleet tile says "tensor N%" beside utilization once a live sample arrived.
    await page.goto(`${http}/`);
    await page.locator(`.tile[data-uuid="${hopper.uuid}"] .tensor`).waitFor({ timeout: 10_000 });
    assert.match(await page.locator(`.tile[data-uuid="${hopper.uuid}"] .tensor`).innerText(), /^tensor \d+%$/);
    assert.equal(await page.locator(`.tile[data-uuid="${older.uuid}"] .tensor`).count(), 0, 'no GPM: nothing shown, never 0');
  }
  {
    await page.goto(`${http}/gpu/${encodeURIComponent(older.uuid)}`);
    await page.locator('#no-gpm').waitFor({ timeout: 10_000 });
    assert.equal(await page.locator('#no-gpm').innerText(),
      'No GPM on this GPU (Hopper and newer report SM occupancy and tensor activity)', older.name);
    assert.equal(await page.locator('#gpm .panel').count(), 0, 'no GPM charts of zeros');
    // Its node (one model per demo node) has no tensor chart.
    await page.goto(`${http}/node/${older.node}`);
    await page.locator('.panel[data-title="GPU Utilization"][data-points]').waitFor({ timeout: 10_000 });
    assert.equal(await page.locator('.panel[data-title="Tensor Core Activity"]').count(), 0);
    assert.equal(await page.locator('#gpu-table .tensor').count(), 0);
  }
  await page.context().close();
});

test('a node whose agent stops is marked stale; its strings are shown as text', async () => {
  agent = spawn(`${bins}/gpufleet-agent`, [
    'run', '--simulate', '--sim-gpus', '2', '--node', 'zz-lost-node', '--collector', `http://${grpc}`,
    '--interval', '200ms', '--spool-dir', mkdtempSync(`${tmpdir()}/gpufleet-spool-`),
    '--label', 'note=<img src=x id=injected>',
    '--label', "sql=<script>window.pwned=1</script>'; DROP TABLE nodes;--",
  ], { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, RUST_LOG: 'warn' } });
  const page = await newPage();
  await page.goto(`${http}/?sort=status`);
  const card = page.locator('article.node[data-node="zz-lost-node"]');
  await page.waitForFunction(
    () => document.querySelector('article.node[data-node="zz-lost-node"]')?.getAttribute('data-status') === 'online',
    undefined, { timeout: 20_000 });
  assert.equal(await card.locator('.label').first().innerText(), 'note=<img src=x id=injected>');
  assert.equal(await page.locator('#injected').count(), 0, 'label text must not become markup');
  assert.equal(await card.locator('.label').nth(1).innerText(), "sql=<script>window.pwned=1</script>'; DROP TABLE nodes;--");
  assert.equal(await page.evaluate(() => window.pwned), undefined, 'a node string must never run as script');

  agent.kill('SIGKILL');
  await page.waitForFunction(
    () => document.querySelector('article.node[data-node="zz-lost-node"]')?.getAttribute('data-status') === 'stale',
    undefined, { timeout: 10_000 });
  assert.equal(await card.locator('.badge').innerText(), 'stale');
  await page.screenshot({ path: `${shots}/stale.png` });
  await page.context().close();
});

test('a node named with markup and SQL is shown literally and never runs', async () => {
  const name = "<script>window.pwned=1</script>'; DROP TABLE nodes;--";
  const hostile = spawn(`${bins}/gpufleet-agent`, [
    'run', '--simulate', '--sim-gpus', '1', '--node', name, '--collector', `http://${grpc}`,
    '--interval', '200ms', '--spool-dir', mkdtempSync(`${tmpdir()}/gpufleet-spool-`),
  ], { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, RUST_LOG: 'warn' } });
  try {
    const page = await newPage();
    await page.goto(`${http}/?q=${encodeURIComponent('DROP TABLE')}`);
    const card = page.locator('article.node').filter({ hasText: 'DROP TABLE' });
    await card.first().waitFor({ timeout: 20_000 });
    assert.equal(await card.first().getAttribute('data-node'), name, 'stored and served literally');
    assert.equal(await card.first().locator('.name').innerText(), name, 'shown as text');
    assert.equal(await page.evaluate(() => window.pwned), undefined, 'never runs');
    // Its node page opens by the encoded name and shows it as text too.
    await card.first().locator('.name').click();
    await page.waitForFunction((n) => document.getElementById('crumbs')?.textContent?.includes(n), name);
    assert.equal(await page.evaluate(() => window.pwned), undefined, 'never runs');
    await page.context().close();
  } finally {
    stop(hostile);
  }
});

test('exposure warnings are shown as a banner; a loopback demo shows none', async () => {
  const page = await newPage();
  await page.goto(`${http}/`);
  await page.locator('article.node').first().waitFor();
  assert.equal(await page.locator('#warnings').count(), 0, 'loopback demo: no warning');
  await page.context().close();

  // gRPC on every address without TLS or agent credentials: the collector warns.
  const dir = mkdtempSync(`${tmpdir()}/gpufleet-warn-`);
  const s = startAndWait(`${bins}/gpufleet-collector`, [
    'serve', '--db', `sqlite://${dir}/w.db`, '--grpc-listen', '0.0.0.0:0', '--http-listen', '127.0.0.1:0',
    '--allow-unauthenticated-agents',
  ], /^listening grpc=(\S+) http=(\S+)$/, 'gpufleet-collector serve');
  try {
    const m = await s.found;
    const exposed = await newPage();
    await exposed.goto(`http://${m[2]}/`);
    const banner = exposed.locator('#warnings');
    await banner.waitFor({ timeout: 10_000 });
    assert.match(await banner.innerText(), /0\.0\.0\.0/);
    await exposed.screenshot({ path: `${shots}/warnings.png` });
    await exposed.context().close();
  } finally {
    stop(s.child);
  }
});

// ---- The energy page. Its range is two whole minutes of the demo's simulated history
// (written before the collector started, accounted at start-up), so the figures are fixed
// while the test compares them with the API.
const MINUTE_MS = 60_000;
function historyRange() {
  const to = Math.floor(demoStartMs / MINUTE_MS) * MINUTE_MS - 1;
  const from = to + 1 - 2 * MINUTE_MS;
  return { from, to, query: `from=${new Date(from).toISOString()}&to=${new Date(to).toISOString()}` };
}

async function api(path) {
  const r = await fetch(`${http}${path}`);
  assert.equal(r.status, 200, `${path}: ${r.status}`);
  return r.json();
}

/** The API's view of the history range, once the start-up accounting and carbon pricing
 * have produced it. */
async function historyFigures(groupBy = 'container') {
  const { from, to } = historyRange();
  const deadline = Date.now() + 15_000;
  for (;;) {
    const energy = await api(`/api/v1/energy?from=${from}&to=${to}`);
    const rows = (await api(`/api/v1/containers?from=${from}&to=${to}&group_by=${groupBy}`)).rows;
    const accounted = energy.total.covered_seconds >= 2 * 60 * NODES.length * GPUS_PER_NODE * 0.99;
    const priced = PRICED_NODES.every((n) => energy.nodes[n]?.carbon?.priced_share === 1);
    if ((accounted && priced) || Date.now() > deadline) return { energy, rows };
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** What the energy table shows: [key, exact energy J, carbon cell text, exact carbon g or
 * null] per row, in order. */
function tableRows(page) {
  return page.$$eval('#energy-table tbody tr[data-key]', (trs) => trs.map((tr) => [
    tr.getAttribute('data-key'), Number(tr.getAttribute('data-energy-j')),
    tr.querySelector('[data-col=co2]')?.textContent ?? '',
    tr.getAttribute('data-carbon-g') ? Number(tr.getAttribute('data-carbon-g')) : null]));
}

test('the energy page lists the demo\'s workloads with their energy, and its totals are the API\'s', async () => {
  const { energy, rows } = await historyFigures();
  assert.ok(energy.total.energy_j > 0, 'the history range has energy');
  assert.ok(rows.filter((r) => r.key.startsWith('container:')).length >= 4, 'the demo runs containers');

  const page = await newPage();
  await page.goto(`${http}/`);
  await page.click('#nav-energy');
  await page.waitForURL(`${http}/energy`);
  await page.locator('#energy-table').waitFor();
  await page.goto(`${http}/energy?${historyRange().query}`);
  await page.locator('#energy-table tbody tr[data-key]').first().waitFor({ timeout: 10_000 });

  const shown = await tableRows(page);
  assert.deepEqual(shown.map((r) => r[0]), rows.map((r) => r.key), 'one row per workload, biggest first');
  for (const [key, j] of shown) {
    assert.ok(j > 0, `${key} has energy`);
    assert.equal(j, rows.find((r) => r.key === key).energy_j, `${key}: the API's joules`);
  }
  const names = await page.$$eval('#energy-table tbody tr[data-key^="container:"] td:first-child a', (as) => as.map((a) => a.textContent));
  assert.ok(names.includes('pytorch') || names.length >= 4, `container names shown: ${names}`);

  // Totals: the fleet's energy and shares are the API's; the table's sum is its rows' sum,
  // and with idle and unattributed it makes up the fleet's energy (conservation).
  const total = (k) => page.locator(`[data-total=${k}]`).getAttribute('data-value').then(Number);
  assert.equal(await total('energy'), energy.total.energy_j);
  assert.equal(await total('idle'), energy.total.idle_j);
  assert.equal(await total('unattributed'), energy.total.unattributed_j);
  const sum = Number(await page.locator('#energy-sum').getAttribute('data-energy-j'));
  const apiSum = rows.reduce((a, r) => a + r.energy_j, 0);
  assert.ok(Math.abs(sum - apiSum) < 1e-6, `table sum ${sum} == API rows ${apiSum}`);
  assert.ok(Math.abs(apiSum + energy.total.idle_bucket_j + energy.total.unattributed_j - energy.total.energy_j) < 0.01);
  // Idle is shown truthfully: the GPUs' idle energy is active's complement, and each row
  // shows its allocated-but-idle energy as the API gives it.
  assert.ok(Math.abs(energy.total.active_j + energy.total.idle_j - energy.total.energy_j) < 0.01);
  const idles = await page.$$eval('#energy-table tbody tr[data-key] [data-col=idle]', (tds) => tds.map((td) => [td.closest('tr').getAttribute('data-key'), Number(td.getAttribute('data-idle-j'))]));
  assert.ok(idles.length > 0, 'an idle column');
  for (const [key, j] of idles) assert.equal(j, rows.find((r) => r.key === key).idle_j, `${key}: the API's idle joules`);
  assert.match(await page.locator('[data-total=energy] strong').innerText(), /^\d+\.\d+ kWh$/);

  // Carbon: workloads on the priced nodes show their CO2 (energy x the static intensity);
  // those on gpu-node-02, which has no carbon provider, show "n/a" (never 0).
  let priced = 0;
  let unpriced = 0;
  for (const [key, , cell, g] of shown) {
    const row = rows.find((r) => r.key === key);
    if (row.nodes.every((n) => PRICED_NODES.includes(n))) {
      priced++;
      assert.match(cell, /^\d+(\.\d+)? k?g$/, `${key}: CO2 shown`);
      assert.equal(g, row.carbon_g, `${key}: the API's grams`);
      if (row.nodes.every((n) => n === STATIC_NODE)) {
        assert.ok(Math.abs(g - row.energy_kwh * G_PER_KWH) < 1e-6 * Math.max(1, g), `${key}: ${g} g = kWh x ${G_PER_KWH}`);
      }
      // Priced (partly) with a forecast: marked so.
      const marks = await page.locator(`#energy-table tr[data-key="${key}"] [data-mark]`).evaluateAll((ms) => ms.map((m) => m.getAttribute('data-mark')));
      assert.equal(marks.includes('forecast'), (row.carbon.forecast_share ?? 0) > 0, `${key}: forecast mark ${marks}`);
    } else if (row.nodes.every((n) => !PRICED_NODES.includes(n))) {
      unpriced++;
      assert.equal(cell, 'n/a', `${key}: no carbon figure is n/a`);
      assert.equal(g, null);
    }
  }
  assert.ok(priced > 0 && unpriced > 0, `rows with CO2 (${priced}) and without (${unpriced})`);
  assert.equal(await total('co2'), energy.total.carbon_g);
  assert.ok(energy.total.carbon_g > 0);
  assert.ok(shown.some(([key]) => rows.find((r) => r.key === key).carbon.forecast_share > 0), 'some energy priced by a forecast');
  // The intensity section: the static region as a fixed figure; the UK one as a curve of
  // actuals and a dashed forecast, with the lowest-intensity window of the next 24 h.
  await page.locator('#intensity .panel[data-provider=static][data-region=lab-east]').waitFor();
  const uk = page.locator('#intensity .panel[data-provider=uk][data-region=national]');
  await uk.locator('canvas').waitFor();
  const intensity = await api('/api/v1/carbon/intensity?region=national&provider=uk');
  assert.ok(intensity.lowest_window, 'the stub has a forecast');
  const hhmm = (ms) => new Date(ms).toISOString().slice(11, 16) + ' UTC';
  assert.equal(await uk.locator('[data-lowest]').innerText(),
    `lowest in the next 24 h: ${hhmm(intensity.lowest_window.from_ms)}–${hhmm(intensity.lowest_window.to_ms)}, ${Math.round(intensity.lowest_window.avg_g_per_kwh)} g/kWh on average`);
  // Two points (start, end) per half-hour slot, each in its own series.
  const count = (kind) => 2 * intensity.slots.filter((x) => x.kind === kind).length;
  assert.ok(count('forecast') > 0);
  assert.ok(count('actual') > 0, 'the history reaches an ended slot');
  const [actualDrawn, forecastDrawn] = (await uk.getAttribute('data-series-points')).split(',').map(Number);
  assert.equal(actualDrawn, count('actual'), 'actuals drawn');
  // The forecast series also repeats the last actual point, so the curve has no hole.
  assert.ok(forecastDrawn === count('forecast') || forecastDrawn === count('forecast') + 1, `forecast drawn: ${forecastDrawn}`);

  // Sorting by a column reorders the rows and is kept in the URL.
  await page.click('#energy-table th[data-sort=gpu_seconds] button');
  await page.waitForURL(/sort=gpu_seconds/);
  const secs = await page.$$eval('#energy-table tbody tr[data-key]', (trs) => trs.map((tr) => tr.getAttribute('data-key')));
  const bySecs = [...rows].sort((a, b) => b.gpu_seconds - a.gpu_seconds || (a.key < b.key ? -1 : 1)).map((r) => r.key);
  assert.deepEqual(secs, bySecs);
  await page.context().close();
});

test('energy group-by changes the rows and is kept in the URL', async () => {
  const page = await newPage();
  const { query } = historyRange();
  await page.goto(`${http}/energy?${query}`);
  await page.locator('#energy-table tbody tr[data-key]').first().waitFor({ timeout: 10_000 });
  const before = (await tableRows(page)).map((r) => r[0]);

  await page.selectOption('#group-by', 'namespace');
  await page.waitForURL(/group_by=namespace/);
  await page.locator('#energy-table[data-group-by=namespace] tbody tr[data-key]').first().waitFor();
  const { rows } = await historyFigures('namespace');
  const after = (await tableRows(page)).map((r) => r[0]);
  assert.deepEqual(after, rows.map((r) => r.key));
  assert.ok(after.every((k) => k.startsWith('namespace:')), `namespace rows: ${after}`);
  assert.notDeepEqual(after, before);

  // Kept across a reload; and per node the rows are the fleet's nodes.
  await page.reload();
  await page.locator('#energy-table[data-group-by=namespace] tbody tr[data-key]').first().waitFor();
  assert.equal(await page.locator('#group-by').inputValue(), 'namespace');
  await page.selectOption('#group-by', 'node');
  await page.waitForURL(/group_by=node/);
  await page.locator('#energy-table[data-group-by=node] tbody tr[data-key]').first().waitFor();
  const nodes = (await tableRows(page)).map((r) => r[0]).sort();
  assert.deepEqual(nodes, NODES.map((n) => `node:${n}`));
  await page.context().close();
});

test('the energy table\'s Tensor active column shows GPM\'s figure and sorts, n/a last either way', async () => {
  const { rows } = await historyFigures();
  // A workload that ran only on GPUs with GPM has a figure; one that never touched such a
  // GPU has none (absent, never 0). One model per demo node.
  const { gpmNodes } = await gpmGpus();
  for (const r of rows) {
    if (r.nodes.length > 0 && r.nodes.every((n) => gpmNodes.has(n))) assert.equal(typeof r.tensor_active_pct, 'number', `${r.key} on ${r.nodes}`);
    if (!r.nodes.some((n) => gpmNodes.has(n))) assert.equal(r.tensor_active_pct ?? null, null, `${r.key} on ${r.nodes}`);
  }
  const page = await newPage();
  await page.goto(`${http}/energy?${historyRange().query}`);
  await page.locator('#energy-table tbody tr[data-key]').first().waitFor({ timeout: 10_000 });
  const th = page.locator('#energy-table th[data-sort="tensor"]');
  assert.equal((await th.locator('button').innerText()).trim(), 'Tensor active');
  assert.match(await th.getAttribute('title'), /tensor-core activity/i);
  assert.match(await th.getAttribute('title'), /estimate on shared GPUs/);
  assert.equal(await th.getAttribute('aria-sort'), 'none');
  // Each cell: the API's percent with one decimal, or n/a (never 0) where there is none.
  const cells = await page.$$eval('#energy-table tbody tr[data-key]', (trs) => trs.map((tr) => [
    tr.getAttribute('data-key'), tr.querySelector('[data-col=tensor]')?.textContent ?? '']));
  for (const [key, text] of cells) {
    const v = rows.find((r) => r.key === key)?.tensor_active_pct;
    assert.equal(text, typeof v === 'number' ? `${v.toFixed(1)}%` : 'n/a', key);
  }
  const order = () => page.$$eval('#energy-table tbody tr[data-key]', (trs) => trs.map((tr) => tr.getAttribute('data-tensor-pct')));
  const sortedWithNullsLast = (vals, dir) => {
    const firstNa = vals.indexOf('');
    if (firstNa >= 0) assert.ok(vals.slice(firstNa).every((v) => v === ''), `n/a last (${dir}): ${vals}`);
    const nums = vals.filter((v) => v !== '').map(Number);
    for (let i = 1; i < nums.length; i++) {
      assert.ok(dir === 'desc' ? nums[i - 1] >= nums[i] : nums[i - 1] <= nums[i], `${dir}: ${nums}`);
    }
  };
  await th.locator('button').click();
  await page.waitForFunction(() => document.querySelector('#energy-table th[data-sort="tensor"]')?.getAttribute('aria-sort') === 'descending');
  sortedWithNullsLast(await order(), 'desc');
  assert.equal(new URL(page.url()).searchParams.get('sort'), 'tensor');
  await th.locator('button').click();
  await page.waitForFunction(() => document.querySelector('#energy-table th[data-sort="tensor"]')?.getAttribute('aria-sort') === 'ascending');
  sortedWithNullsLast(await order(), 'asc');
  assert.equal(new URL(page.url()).searchParams.get('dir'), 'asc');
  // By keyboard too: the header's button takes the focus and Enter.
  await th.locator('button').focus();
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.querySelector('#energy-table th[data-sort="tensor"]')?.getAttribute('aria-sort') === 'descending');
  // Nodes have no tensor figure: their table leaves the column out.
  await page.goto(`${http}/energy?${historyRange().query}&group_by=node`);
  await page.locator('#energy-table tbody tr[data-key]').first().waitFor({ timeout: 10_000 });
  assert.equal(await page.locator('#energy-table th[data-sort="tensor"]').count(), 0);
  await page.context().close();
});

test('a workload\'s detail shows its energy per minute', async () => {
  const page = await newPage();
  const { from, to, query } = historyRange();
  await page.goto(`${http}/energy?${query}`);
  const row = page.locator('#energy-table tbody tr[data-key^="container:"]').first();
  await row.waitFor({ timeout: 10_000 });
  const key = await row.getAttribute('data-key');
  await row.locator('td').nth(2).click();
  await page.waitForURL((u) => new URL(u).searchParams.get('workload') === key);
  const chart = page.locator('#workload-detail .panel[data-title="energy per minute"]');
  await chart.locator('canvas').waitFor();
  await page.waitForFunction(() => Number(document.querySelector('#workload-detail .panel[data-title="energy per minute"]')?.getAttribute('data-points')) > 0);
  const detail = await api(`/api/v1/containers/${encodeURIComponent(key)}?from=${from}&to=${to}`);
  assert.equal(Number(await chart.getAttribute('data-points')), detail.series.length);
  assert.ok(detail.series.length >= 2, 'two minutes of history');
  // The selected workload is part of the URL: a reload shows it again.
  await page.reload();
  await page.locator('#workload-detail .panel[data-title="energy per minute"][data-points]').waitFor();
  // The README's picture (docs/energy.png): today, with the workload selected.
  await page.goto(`${http}/energy?workload=${encodeURIComponent(key)}`);
  await page.locator('#workload-detail .panel[data-title="energy per minute"][data-points]').waitFor();
  await page.locator('#intensity canvas').first().waitFor();
  await page.screenshot({ path: `${shots}/energy.png`, fullPage: true });
  await page.context().close();
});

test('the GPU and node pages show energy and CO2 beside each other', async () => {
  const page = await newPage();
  const { query } = historyRange();
  await page.goto(`${http}/node/${NODES[0]}?${query}`);
  await page.waitForFunction(() => /kWh$/.test(document.querySelector('#gpu-table tbody tr [data-col=energy]')?.textContent ?? ''));
  const co2Cells = await page.$$eval('#gpu-table tbody [data-col=co2]', (tds) => tds.map((t) => t.textContent));
  assert.equal(co2Cells.length, GPUS_PER_NODE);
  // gpu-node-01 has a carbon intensity: every GPU's CO2 is a figure.
  for (const c of co2Cells) assert.match(c, /^\d+(\.\d+)? k?g$/);
  await page.click('#gpu-table tbody tr:first-child a');
  await page.waitForURL(/\/gpu\/GPU-/);
  const row = page.locator('#gpu-energy');
  await row.waitFor({ timeout: 10_000 });
  assert.match(await row.locator('[data-col=energy]').innerText(), /kWh$/);
  assert.match(await row.locator('[data-col=co2]').innerText(), /^\d+(\.\d+)? k?g$/);
  // The idle baseline in force and where it came from.
  const baseline = page.locator('#gpu-baseline');
  assert.match(await baseline.locator('[data-col=baseline]').innerText(), /^\d+\.\d W$/);
  assert.match(await baseline.getAttribute('data-source'), /^(learned|model|fallback)$/);
  await page.context().close();
});

test('a GPU logging hardware Xids is marked on the fleet, node and GPU pages, with reasons and what to do', async () => {
  // A simulated node with no workloads (so every Xid is a hardware one: 48, 63, 74, 92,
  // 94 or 119, each at least a warning) and about one Xid a second.
  const dir = mkdtempSync(`${tmpdir()}/gpufleet-xid-`);
  writeFileSync(`${dir}/xid.toml`, 'random_workloads = false\nxid_per_gpu_hour = 3600\n');
  const xidAgent = spawn(`${bins}/gpufleet-agent`, [
    'run', '--simulate', '--sim-gpus', '1', '--sim-scenario', `${dir}/xid.toml`, '--node', 'zz-xid-node',
    '--collector', `http://${grpc}`, '--interval', '200ms', '--spool-dir', mkdtempSync(`${tmpdir()}/gpufleet-spool-`),
  ], { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, RUST_LOG: 'warn' } });
  try {
    const page = await newPage();
    await page.goto(`${http}/?q=zz-xid-node`);
    // The tile turns warning or critical from the live status stream (or a reload).
    await page.waitForFunction(
      () => ['warning', 'critical'].includes(document.querySelector('article.node[data-node="zz-xid-node"] .tile')?.getAttribute('data-health') ?? ''),
      undefined, { timeout: 30_000 });
    const tile = page.locator('article.node[data-node="zz-xid-node"] .tile').first();
    assert.match(await tile.getAttribute('class'), /health-(warning|critical)/);
    const uuid = await tile.getAttribute('data-uuid');

    await page.goto(`${http}/node/zz-xid-node`);
    const gpuReasons = page.locator(`#health .gpu-health[data-uuid="${uuid}"] li[data-code^="xid_"]`).first();
    await gpuReasons.waitFor({ timeout: 10_000 });
    assert.match(await page.locator('#node-health').innerText(), /^(warning|critical)$/);
    assert.match(await page.locator('#gpu-table [data-col=health]').first().innerText(), /^(warning|critical)$/);

    await page.goto(`${http}/gpu/${encodeURIComponent(uuid)}`);
    await page.locator('#gpu-reasons li[data-code^="xid_"]').first().waitFor({ timeout: 10_000 });
    assert.match(await page.locator('#gpu-health').innerText(), /^(warning|critical)$/);
    const reason = page.locator('#gpu-reasons li[data-code^="xid_"]').first();
    assert.match(await reason.locator('.summary').innerText(), /^Xid \d+: /);
    assert.match(await reason.locator('.action').innerText(), /^→ \S/, 'each reason says what to do');
    // The events list names each Xid and what to do about it.
    const xidRow = page.locator('#events tr[data-kind="xid"]').first();
    await xidRow.waitFor({ timeout: 10_000 });
    const what = await xidRow.locator('[data-col=xid]').innerText();
    assert.ok(what.includes(' — ') && what.length > 20, `an explained Xid: ${what}`);
    await page.screenshot({ path: `${shots}/health.png`, fullPage: true });
    await page.context().close();
  } finally {
    xidAgent.kill('SIGKILL');
  }
});

test('the real agent names a Slurm job from its environment, on the node and energy pages', async () => {
  // The real agent on the fake libnvidia-ml (two-gpus.json), its GPU process 1103 a step
  // of Slurm job 48213 whose environment (the real format) names it; no names come from
  // the simulator here.
  const dir = mkdtempSync(`${tmpdir()}/gpufleet-named-`);
  mkdirSync(`${dir}/nvml`);
  // Where cargo leaves the cdylib: beside the binaries, or in deps/ (as fake_nvml::built_library looks).
  const fakeLib = [`${bins}/libfake_nvml.so`, `${bins}/deps/libfake_nvml.so`].find((f) => existsSync(f));
  assert.ok(fakeLib, `the fake libnvidia-ml is not built in ${bins} (cargo test --workspace builds it)`);
  copyFileSync(fakeLib, `${dir}/nvml/libnvidia-ml.so.1`);
  copyFileSync(`${repo}fake-nvml/scenarios/two-gpus.json`, `${dir}/nvml/fake-nvml.json`);
  const pid = `${dir}/proc/1103`;
  mkdirSync(pid, { recursive: true });
  writeFileSync(`${pid}/cgroup`, '0::/system.slice/slurmstepd.scope/job_48213/step_0/user/task_0\n');
  writeFileSync(`${pid}/status`, 'Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n');
  writeFileSync(`${pid}/cmdline`, 'python\0train.py\0');
  copyFileSync(`${repo}agent/tests/fixtures/names/slurm-environ-batch`, `${pid}/environ`);
  const env = { PATH: '/usr/bin:/bin', HOME: dir, RUST_LOG: 'warn' };
  const named = spawn(`${bins}/gpufleet-agent`, [
    'run', '--node', 'zz-named-node', '--collector', `http://${grpc}`, '--interval', '200ms',
    '--nvml-lib', `${dir}/nvml/libnvidia-ml.so.1`, '--proc-root', `${dir}/proc`, '--spool-dir', `${dir}/spool`,
  ], { stdio: ['ignore', 'ignore', 'inherit'], env });
  try {
    const page = await newPage();
    await page.goto(`${http}/node/zz-named-node`);
    const cell = page.locator('#process-table tr[data-pid="1103"] [data-col=workload]');
    await page.waitForFunction(
      () => document.querySelector('#process-table tr[data-pid="1103"] [data-col=workload]')?.textContent?.includes('train-llama'),
      undefined, { timeout: 30_000 });
    const text = await cell.innerText();
    assert.match(text, /^train-llama/, text);
    assert.match(text, /job 48213 step 0 · account physics · gpu · alice/, text);
    assert.equal(await cell.getAttribute('title'), 'Slurm job 48213');

    // The energy page names the job once its energy is accounted (reloaded until then),
    // and its account groups it with the account's other jobs.
    const job = page.locator('#energy-table tr[data-key="slurm:48213"]');
    const deadline = Date.now() + 60_000;
    for (;;) {
      await page.goto(`${http}/energy?range=1h`);
      await page.locator('#energy-table tbody tr[data-key]').first().waitFor({ timeout: 15_000 });
      if (await job.count() > 0 || Date.now() > deadline) break;
      await page.waitForTimeout(2000);
    }
    const row = await job.innerText();
    assert.match(row, /train-llama/, row);
    assert.match(row, /account physics/, row);
    const groups = await api(`/api/v1/containers?from=now-1h&group_by=account`);
    const physics = groups.rows.find((r) => r.key === 'account:physics');
    assert.ok(physics?.workloads.includes('slurm:48213'), JSON.stringify(physics?.workloads));
    await page.goto(`${http}/energy?range=1h&group_by=account`);
    await page.locator('#energy-table[data-group-by=account] tr[data-key="account:physics"]').waitFor({ timeout: 15_000 });
    await page.context().close();
  } finally {
    named.kill('SIGKILL');
  }
});

test('the waste page lists the idle-but-allocated episodes the API gives, linked from the nav', async () => {
  // The last 30 minutes of the demo's simulated history (fixed once accounted). This small
  // fleet's draw holds no notebook (the simulator's idle-but-allocated workload), so the
  // page is asked for quiet stretches of bursty work instead: at most 30 % for a minute.
  const to = Math.floor(demoStartMs / MINUTE_MS) * MINUTE_MS - 1;
  const from = to + 1 - 30 * MINUTE_MS;
  const rule = 'min_idle=1m&threshold=30';
  await historyFigures();
  const v = await api(`/api/v1/waste?from=${from}&to=${to}&${rule}`);
  assert.ok(v.episodes.length > 0, 'quiet minutes in the history');
  assert.equal(v.min_idle_seconds, 60);
  assert.equal(v.threshold_pct, 30);
  const page = await newPage();
  await page.goto(`${http}/`);
  await page.click('#nav-waste');
  await page.waitForURL(`${http}/waste`);
  await page.locator('#waste-totals').waitFor({ timeout: 10_000 });
  assert.match(await page.locator('#waste-rule').innerText(), /at or below 1 % utilization for at least 30 minutes/);
  await page.goto(`${http}/waste?from=${new Date(from).toISOString()}&to=${new Date(to).toISOString()}&${rule}`);
  await page.locator('#waste-table tbody tr[data-key]').first().waitFor({ timeout: 10_000 });
  assert.equal(await page.locator('#min-idle').inputValue(), '1m');
  assert.match(await page.locator('#waste-rule').innerText(), /at or below 30 % utilization for at least 1 minutes/);
  // Row for row, the API's episodes with their exact energy.
  const rows = await page.$$eval('#waste-table tbody tr[data-key]', (trs) => trs.map((tr) => [
    tr.getAttribute('data-key'), Number(tr.getAttribute('data-energy-mj'))]));
  assert.deepEqual(rows, v.episodes.map((e) => [`${e.workload_key}@${e.gpu.uuid}@${e.since_ms}`, e.energy_mj]));
  assert.equal(Number(await page.locator('[data-total=energy]').getAttribute('data-value')), v.energy_mj);
  assert.equal(await page.locator('[data-total=episodes] strong').innerText(), String(v.episodes.length));
  // CO2: a figure where the node has an intensity, "n/a" (never 0) where it has none.
  const co2 = await page.$$eval('#waste-table tbody tr[data-key]', (trs) => trs.map((tr) => [
    tr.getAttribute('data-key'), tr.querySelector('[data-col=co2]')?.textContent ?? '']));
  for (const [i, [, text]] of co2.entries()) {
    const e = v.episodes[i];
    if (e.gpu.node === 'gpu-node-02') assert.equal(text, 'n/a', `${e.workload_key} on an unpriced node`);
    else if (e.carbon_g !== null) assert.match(text, /^\d+(\.\d+)? k?g$/);
  }
  // Per workload: the API's totals, biggest first.
  const per = await page.$$eval('#waste-workloads tbody tr[data-key]', (trs) => trs.map((tr) => tr.getAttribute('data-key')));
  assert.deepEqual(per, v.workloads.map((w) => w.workload_key));
  await page.screenshot({ path: `${shots}/waste.png`, fullPage: true });
  // Another range keeps the rule in the URL (and in the page's request).
  await page.click('.ranges button[data-range]:not(.active):not([data-range="custom"])');
  await page.waitForURL((u) => u.searchParams.has('range') || !u.searchParams.has('from'));
  const after = new URL(page.url());
  assert.equal(after.searchParams.get('min_idle'), '1m', page.url());
  assert.equal(after.searchParams.get('threshold'), '30', page.url());
  await page.locator('#waste-rule').waitFor();
  assert.match(await page.locator('#waste-rule').innerText(), /at or below 30 % utilization for at least 1 minutes/);
  await page.context().close();
});

test('the waste page lists the workloads holding tensor cores idle, as the API\'s GPM figures say', async () => {
  // The last 30 minutes of the simulated history (fixed once accounted).
  const to = Math.floor(demoStartMs / MINUTE_MS) * MINUTE_MS - 1;
  const from = to + 1 - 30 * MINUTE_MS;
  await historyFigures();
  const { rows } = await api(`/api/v1/containers?from=${from}&to=${to}`);
  const expected = rows.filter((r) => r.gpm_seconds >= 600 && typeof r.tensor_active_pct === 'number' && r.tensor_active_pct < 1)
    .sort((a, b) => b.gpu_seconds - a.gpu_seconds || (a.key < b.key ? -1 : 1)).map((r) => r.key);
  const page = await newPage();
  await page.goto(`${http}/waste?from=${new Date(from).toISOString()}&to=${new Date(to).toISOString()}`);
  const section = page.locator('#tensor-idle');
  await section.waitFor({ timeout: 10_000 });
  assert.equal(await section.locator('h2').innerText(), 'Holding tensor cores idle');
  const rule = await page.locator('#tensor-idle-rule').innerText();
  assert.match(rule, /Hopper and newer/);
  assert.match(rule, /smaller GPU/);
  const shown = await page.$$eval('#tensor-idle-table tbody tr[data-key]', (trs) => trs.map((tr) => tr.getAttribute('data-key')));
  assert.deepEqual(shown, expected, 'the API\'s workloads with GPM time and tensor activity under 1 %, most GPU time first');
  if (expected.length === 0) {
    assert.match(await page.locator('#no-tensor-idle').innerText(), /No workload/);
  } else {
    for (const text of await page.$$eval('#tensor-idle-table [data-col=tensor]', (tds) => tds.map((td) => td.textContent))) {
      assert.match(text, /^(0\.\d|1\.0)%$/, 'under 1 % (one decimal)');
    }
  }
  await page.screenshot({ path: `${shots}/waste-tensor.png`, fullPage: true });
  await page.context().close();
});

test('the energy chart\'s bands add up to the table\'s totals, and a band filters the table', async () => {
  const { energy, rows } = await historyFigures();
  const { from, to, query } = historyRange();
  const s = await api(`/api/v1/energy/series?from=${from}&to=${to}`);
  assert.equal(s.step_ms, 60_000, 'a short range is bucketed per minute');
  assert.deepEqual(s.buckets_ms, [from, from + 60_000]);
  for (const b of s.bands) assert.equal(b.values_mj.length, s.buckets_ms.length, b.key);
  assert.equal(s.energy_mj, energy.total.energy_mj);

  const page = await newPage();
  await page.goto(`${http}/energy?${query}`);
  await page.locator('#energy-chart canvas').waitFor({ timeout: 10_000 });
  await page.locator('#energy-table tbody tr[data-key]').first().waitFor();
  const bands = await page.$$eval('#energy-bands button[data-band]', (bs) => bs.map((b) => [
    b.getAttribute('data-band'), b.getAttribute('data-kind'), Number(b.getAttribute('data-energy-mj'))]));
  assert.deepEqual(bands.map((b) => b[0]), s.bands.map((b) => b.key), 'one legend entry per band, in order');
  const mj = (kind) => bands.filter((b) => b[1] === kind).reduce((a, b) => a + b[2], 0);
  // All bands together: the fleet's energy, exactly; idle and unattributed: the totals'.
  assert.equal(bands.reduce((a, b) => a + b[2], 0), energy.total.energy_mj);
  assert.equal(Number(await page.locator('#energy-chart').getAttribute('data-total-mj')), energy.total.energy_mj);
  assert.ok(Math.abs(mj('idle') / 1000 - energy.total.idle_bucket_j) < 0.01, `idle ${mj('idle')} mJ`);
  assert.ok(Math.abs(mj('unattributed') / 1000 - energy.total.unattributed_j) < 0.01);
  // The groups and the rest: the table's sum; each group's band: its row.
  const sumJ = Number(await page.locator('#energy-sum').getAttribute('data-energy-j'));
  assert.ok(Math.abs((mj('group') + mj('other')) / 1000 - sumJ) < 0.01, `${mj('group') + mj('other')} mJ vs ${sumJ} J`);
  const shown = await tableRows(page);
  const groups = bands.filter((b) => b[1] === 'group');
  assert.ok(groups.length >= 4, 'the demo\'s biggest workloads have bands');
  for (const [key, , e] of groups) {
    const row = rows.find((r) => r.key === key);
    assert.ok(row, `${key} is a row`);
    assert.equal(e, row.energy_mj, `${key}: its band is its row`);
    assert.equal(shown.find((r) => r[0] === key)?.[1], row.energy_j);
  }
  // A band (its legend entry, by keyboard) filters the table to its row; again shows all.
  const first = groups[0][0];
  await page.focus(`#energy-bands button[data-band="${first}"]`);
  await page.keyboard.press('Enter');
  await page.waitForURL((u) => new URL(u).searchParams.get('band') === first);
  assert.deepEqual((await tableRows(page)).map((r) => r[0]), [first]);
  await page.click(`#energy-bands button[data-band="${first}"]`);
  await page.waitForURL((u) => !new URL(u).searchParams.has('band'));
  assert.equal((await tableRows(page)).length, rows.length);

  // Grouped by namespace, the bands are namespaces and still add up.
  await page.selectOption('#group-by', 'namespace');
  await page.waitForURL(/group_by=namespace/);
  await page.locator('#energy-table[data-group-by=namespace] tbody tr[data-key]').first().waitFor();
  await page.locator('#energy-chart canvas').waitFor();
  const ns = await page.$$eval('#energy-bands button[data-band]', (bs) => bs.map((b) => [
    b.getAttribute('data-band'), b.getAttribute('data-kind'), Number(b.getAttribute('data-energy-mj'))]));
  assert.ok(ns.filter((b) => b[1] === 'group').every((b) => b[0].startsWith('namespace:')), JSON.stringify(ns));
  assert.equal(ns.reduce((a, b) => a + b[2], 0), energy.total.energy_mj);
  await page.context().close();
});

// ---- Every page: accessible (axe-core: no serious or critical violation, light and
// dark), no console error or failed request, no wider than a 1400-pixel window, and a
// "connecting" or "live" badge only where a live stream feeds the page.
const AXE = `${repo}web/node_modules/axe-core/axe.min.js`;

async function everyPage() {
  const fleet = await api('/api/v1/fleet');
  const gpu = encodeURIComponent(fleet.find((n) => n.name === NODES[0]).gpus[0].uuid);
  const { hopper } = await gpmGpus();
  const { query } = historyRange();
  // [what, path, a live stream feeds it, what to wait for]
  return [
    ['fleet', '/', true, '.tile'],
    ['node', `/node/${NODES[0]}`, true, '#process-table tbody tr'],
    ['node, 1 h', `/node/${NODES[0]}?range=1h`, false, '.panel[data-title="GPU Utilization"][data-points]'],
    ['GPU', `/gpu/${gpu}`, true, '#gpu-processes tbody tr'],
    ['GPU, 7 d', `/gpu/${gpu}?range=7d`, false, '.panel[data-title="power"][data-points]'],
    ...(hopper ? [['GPU with GPM', `/gpu/${encodeURIComponent(hopper.uuid)}`, true, '#gpm .panel[data-points]']] : []),
    ['energy', `/energy?${query}`, false, '#energy-chart canvas'],
    ['energy per node', `/energy?${query}&group_by=node`, false, '#energy-chart canvas'],
    ['energy today', '/energy', false, '#energy-table tbody tr'],
    ['waste', '/waste', false, '#waste-totals'],
    ['alerts', '/alerts', false, '#alerts-table tbody tr'],
  ];
}

test('every page is accessible, quiet in the console, fits 1400 pixels and badges only live pages', async () => {
  await historyFigures();
  const pages = await everyPage();
  // axe is injected as a script: this context bypasses the CSP the other pages carry.
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, bypassCSP: true });
  const problems = [];
  for (const scheme of ['light', 'dark']) {
    for (const [what, path, live, ready] of pages) {
      const page = await context.newPage();
      await page.emulateMedia({ colorScheme: scheme });
      const where = `${what} (${path}, ${scheme})`;
      page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`${where}: console: ${msg.text()}`); });
      page.on('pageerror', (e) => problems.push(`${where}: page error: ${e.message}`));
      page.on('response', (r) => { if (r.status() >= 400) problems.push(`${where}: ${r.status()} ${r.url()}`); });
      page.on('requestfailed', (r) => {
        // A live stream cut when the page closes is not a failure.
        if (!r.url().includes('/api/v1/live')) problems.push(`${where}: failed ${r.url()} ${r.failure()?.errorText}`);
      });
      await page.goto(`${http}${path}`);
      await page.locator(ready).first().waitFor({ timeout: 15_000 });
      if (live) {
        await page.waitForFunction(() => document.getElementById('conn')?.textContent === 'live', undefined, { timeout: 10_000 });
      } else {
        // Past ranges: no stream, no badge, never "connecting".
        await page.waitForTimeout(1500);
        const badge = await page.locator('#conn').textContent();
        assert.equal(badge, '', `${where}: badge ${JSON.stringify(badge)}`);
      }
      assert.ok(!/connecting/i.test(await page.locator('#top').innerText()) || live, `${where}: says connecting`);
      const width = await page.evaluate(() => document.documentElement.scrollWidth);
      assert.ok(width <= 1400, `${where}: ${width} px wide in a 1400 px window`);
      await page.addScriptTag({ path: AXE });
      const result = await page.evaluate(async () => {
        const r = await window.axe.run(document, { resultTypes: ['violations'] });
        return r.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' ')) }));
      });
      for (const v of result.filter((x) => x.impact === 'serious' || x.impact === 'critical')) {
        problems.push(`${where}: axe ${v.impact} ${v.id} (${v.help}): ${v.nodes.join(', ')}`);
      }
      if (scheme === 'light') await page.screenshot({ path: `${shots}/a11y-${what.replace(/\W+/g, '-')}.png` });
      await page.close();
    }
  }
  await context.close();
  assert.deepEqual(problems, []);
});

test('the fleet page marks, counts and filters idle-but-allocated GPUs as gpufleet top does', async () => {
  const page = await newPage();
  await page.goto(`${http}/`);
  await page.waitForFunction(() => [...document.querySelectorAll('.tile .util')].some((e) => /\d+%/.test(e.textContent ?? '')));
  await page.waitForTimeout(500);
  // The tiles marked are those the rule picks from the values they show.
  const tiles = await page.$$eval('.tile', (ts) => ts.map((t) => [t.getAttribute('data-uuid'), t.getAttribute('data-idle-allocated') === 'true',
    t.querySelector('.util')?.textContent ?? '']));
  for (const [uuid, idle, util] of tiles) if (idle) assert.equal(util, '0%', `${uuid} marked idle at ${util}`);
  const marked = tiles.filter((t) => t[1]).length;
  const counted = Number(await page.locator('[data-total=idle-allocated]').getAttribute('data-value'));
  assert.ok(Math.abs(counted - marked) <= 1, `counted ${counted}, marked ${marked} (a tick may fall between)`);
  // The filter keeps only nodes with such a GPU, and the URL keeps it.
  await page.click('#only-idle');
  await page.waitForURL(/idle=1/);
  await page.waitForFunction(() => [...document.querySelectorAll('article.node')].every((n) => n.querySelector('.tile[data-idle-allocated=true]')));
  assert.equal(await page.locator('#only-idle').getAttribute('aria-pressed'), 'true');
  await page.click('#only-idle');
  await page.waitForURL((u) => !new URL(u).searchParams.has('idle'));
  await page.context().close();
});

test('the pages run under a strict CSP (no inline scripts or styles) without errors', () => {
  assert.deepEqual(cspViolations, []);
});

// ---- The alerts page: the demo's rules (see `before`) fire on every GPU, or stay pending.
test('the alerts page shows firing and pending alerts as the API does, and their history', async () => {
  const api = async (path) => (await fetch(`${http}${path}`)).json();
  const all = NODES.length * GPUS_PER_NODE;
  const deadline = Date.now() + 30_000;
  let current;
  for (;;) {
    current = (await api('/api/v1/alerts?state=firing,pending')).alerts;
    const warm = current.filter((a) => a.rule === 'DemoGpuWarm' && a.state === 'firing');
    const busy = current.filter((a) => a.rule === 'DemoGpuBusyAnHour' && a.state === 'pending');
    if ((warm.length >= all && busy.length >= all) || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  const firing = current.filter((a) => a.state === 'firing');
  assert.ok(firing.filter((a) => a.rule === 'DemoGpuWarm').length >= all, 'every demo GPU fires DemoGpuWarm');
  const page = await newPage();
  await page.goto(http);
  await page.click('#nav-alerts');
  await page.waitForURL(`${http}/alerts`);
  await page.locator('#alerts-table tbody tr[data-state=firing]').first().waitFor({ timeout: 10_000 });
  const shownFiring = Number(await page.locator('#alerts-counts [data-firing]').getAttribute('data-firing'));
  assert.ok(shownFiring >= all, `${shownFiring} firing shown`);
  assert.equal(await page.locator('#alerts-table tbody tr[data-state=firing][data-rule=DemoGpuWarm]').count() >= all, true);
  assert.ok(await page.locator('#alerts-table tbody tr[data-state=pending][data-rule=DemoGpuBusyAnHour]').count() >= all);
  // Firing rows come first, and a summary is filled in from the alert's labels.
  assert.equal(await page.locator('#alerts-table tbody tr').first().getAttribute('data-state'), 'firing');
  const summary = await page.locator('#alerts-table tbody tr[data-rule=DemoGpuWarm] td.summary').first().innerText();
  // Any node's GPU: other tests add nodes (zz-xid-node) to the same collector.
  assert.match(summary, /^[\w-]+ GPU \d at \d+ C$/);
  // The history holds each firing alert's pending → firing change.
  assert.ok(await page.locator('#alerts-history tbody tr[data-to=firing][data-rule=DemoGpuWarm]').count() >= all);
  assert.ok(await page.locator('#alerts-rules tbody tr[data-rule=NodeOffline]').count() === 1, 'default rules listed');
  await page.screenshot({ path: `${shots}/alerts.png` });
  await page.context().close();
});
