// Manual measurement (not part of CI): the fleet page against a large demo fleet.
//
//   cargo build --release -p gpufleet-collector
//   GPUFLEET_BIN_DIR=target/release NODES=1000 node web/bench/scale.mjs
//
// Prints how long the first render takes, the live events received per second, and how
// long a filter keystroke takes to show its result. `npm test`
// does not run it (it lives outside test/).
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const repo = fileURLToPath(new URL('../..', import.meta.url));
const bins = process.env.GPUFLEET_BIN_DIR ?? `${repo}target/release`;
const nodes = Number(process.env.NODES ?? 1000);
const gpus = Number(process.env.GPUS ?? 8);

const demo = spawn(`${bins}/gpufleet-collector`, ['demo', '--http-listen', '127.0.0.1:0', '--nodes', String(nodes),
  '--gpus-per-node', String(gpus), '--interval', '1s'], { stdio: ['ignore', 'pipe', 'ignore'] });
const http = await new Promise((resolve, reject) => {
  createInterface({ input: demo.stdout }).on('line', (l) => {
    const m = /^listening grpc=\S+ http=(\S+)$/.exec(l);
    if (m) resolve(`http://${m[1]}`);
  });
  demo.on('exit', (c) => reject(new Error(`demo exited ${c}`)));
});
try {
  // Let every simulated agent connect and send a few ticks.
  for (;;) {
    const list = await (await fetch(`${http}/api/v1/fleet`)).json();
    if (list.length === nodes && list.every((n) => n.last_seen_ms)) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
  });
  const page = await browser.newPage({ viewport: { width: 1280, height: 860 } });
  await page.addInitScript(() => {
    window.__events = 0;
    const Orig = window.EventSource;
    window.EventSource = class extends Orig {
      constructor(...a) {
        super(...a);
        this.addEventListener('tick', () => { window.__events++; });
      }
    };
  });
  const t0 = Date.now();
  await page.goto(`${http}/`);
  await page.waitForFunction((n) => document.querySelector('[data-total=nodes]')?.textContent === `${n} nodes`, nodes,
    { timeout: 60_000 });
  const firstRender = Date.now() - t0;
  const e0 = await page.evaluate(() => window.__events);
  await page.waitForTimeout(10_000);
  const perSecond = ((await page.evaluate(() => window.__events)) - e0) / 10;
  const t1 = Date.now();
  await page.fill('#filter', `gpu-node-${nodes}`);
  await page.waitForFunction(() => document.querySelectorAll('article.node').length === 1, undefined, { timeout: 10_000 });
  const filterMs = Date.now() - t1;
  const cards = await page.evaluate(() => document.querySelectorAll('article.node').length);
  await page.fill('#filter', '');
  const heap = await page.evaluate(() => (performance.memory ? Math.round(performance.memory.usedJSHeapSize / 2 ** 20) : null));
  console.log(`fleet page, ${nodes} nodes x ${gpus} GPUs: first render ${firstRender} ms (load to totals shown); ` +
    `${perSecond.toFixed(0)} live tick events/s received; filter to one node ${filterMs} ms (${cards} card); ` +
    `JS heap ${heap ?? 'n/a'} MiB`);
  await page.screenshot({ path: `${repo}web/test-results/fleet-${nodes}.png` });
  await browser.close();
} finally {
  demo.kill('SIGKILL');
}
