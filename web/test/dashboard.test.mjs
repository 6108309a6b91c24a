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
import { mkdirSync, mkdtempSync } from 'node:fs';
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

let demo;
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
  const d = startAndWait(`${bins}/gpufleet-collector`, [
    'demo', '--http-listen', '127.0.0.1:0', '--nodes', String(NODES.length),
    '--gpus-per-node', String(GPUS_PER_NODE), '--interval', '200ms', '--stale-after', '2s',
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
  await page.click('#gpu-table tbody tr:first-child a');
  await page.waitForURL(/\/gpu\/GPU-/);
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

test('the pages run under a strict CSP (no inline scripts or styles) without errors', () => {
  assert.deepEqual(cspViolations, []);
});
