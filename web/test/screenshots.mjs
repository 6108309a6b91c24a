// The README's pictures: starts the real collector's demo (6 nodes x 8 GPUs, 2 h of
// history), opens the energy page (/energy?range=1h) in Debian's chromium at 1400 x 1000 in
// each colour scheme, then the fleet and a node page (light), and writes
// docs/img/{energy-light,energy-dark,fleet,node}.png.
//
//   GPUFLEET_BIN_DIR   folder with gpufleet-collector (default target/debug)
//   CHROMIUM           the browser (default /usr/bin/chromium)
//
//   node web/test/screenshots.mjs
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const repo = fileURLToPath(new URL('../..', import.meta.url));
const bins = process.env.GPUFLEET_BIN_DIR ?? `${repo}target/debug`;
const out = `${repo}docs/img`;
mkdirSync(out, { recursive: true });

const demo = spawn(`${bins}/gpufleet-collector`, [
  'demo', '--http-listen', '127.0.0.1:0', '--nodes', '6', '--gpus-per-node', '8', '--history', '2h',
], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, RUST_LOG: 'warn' } });
const http = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error('the demo printed no address within 120 s')), 120_000);
  createInterface({ input: demo.stdout }).on('line', (l) => {
    const m = /^listening grpc=(\S+) http=(\S+)$/.exec(l);
    if (m) {
      clearTimeout(timer);
      resolve(`http://${m[2]}`);
    }
  });
  demo.on('exit', (code) => reject(new Error(`the demo exited (${code})`)));
});

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--no-first-run'],
});
try {
  // The history is accounted at start-up: wait until the last hour has energy.
  const deadline = Date.now() + 60_000;
  for (;;) {
    const e = await (await fetch(`${http}/api/v1/energy?from=now-1h`)).json();
    if (e.total?.covered_seconds > 6 * 8 * 3000 || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 1000));
  }
  for (const colorScheme of ['light', 'dark']) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    await page.emulateMedia({ colorScheme });
    await page.goto(`${http}/energy?range=1h`);
    await page.locator('#energy-chart canvas').waitFor({ timeout: 30_000 });
    await page.locator('#energy-table tbody tr[data-key]').first().waitFor();
    await page.waitForTimeout(500);
    await page.screenshot({ path: `${out}/energy-${colorScheme}.png` });
    await page.close();
    console.log(`wrote ${out}/energy-${colorScheme}.png`);
  }
  for (const [name, path, ready] of [
    ['fleet', '/', '.tile'],
    ['node', '/node/gpu-node-01', '#panels canvas'],
  ]) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
    await page.emulateMedia({ colorScheme: 'light' });
    await page.goto(`${http}${path}`);
    await page.locator(ready).first().waitFor({ timeout: 30_000 });
    await page.waitForTimeout(1500);
    await page.screenshot({ path: `${out}/${name}.png` });
    await page.close();
    console.log(`wrote ${out}/${name}.png`);
  }
} finally {
  await browser.close();
  demo.kill('SIGKILL');
}
