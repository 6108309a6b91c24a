// The dashboard's entry: a tiny client-side router over /, /node/NAME, /gpu/UUID,
// /energy, /waste and /alerts.
import './style.css';
import { alertsPage } from './alerts';
import { getJson, type HealthView } from './api';
import { clear, el } from './dom';
import { energyPage } from './energy';
import { fleetPage } from './fleet';
import { gpuPage } from './gpu';
import { nodePage } from './node';
import { wastePage } from './waste';

let teardown: (() => void) | null = null;

function crumbs(parts: [string, string][]): void {
  const nav = document.getElementById('crumbs');
  if (!nav) return;
  clear(nav);
  for (const [text, href] of parts) nav.append(' / ', el('a', { href }, text));
}

/** The connection badge says nothing until a page opens a live stream (`openLive`): a
 * page showing a past range has none, and must not claim to be connecting. */
function resetConn(): void {
  const conn = document.getElementById('conn');
  if (!conn) return;
  conn.textContent = '';
  conn.className = 'conn';
  conn.removeAttribute('title');
}

async function route(): Promise<void> {
  teardown?.();
  teardown = null;
  resetConn();
  const app = document.getElementById('app') as HTMLElement;
  const path = location.pathname;
  try {
    const node = /^\/node\/([^/]+)$/.exec(path);
    const gpu = /^\/gpu\/([^/]+)$/.exec(path);
    if (node) {
      const name = decodeURIComponent(node[1]);
      crumbs([[name, path]]);
      teardown = await nodePage(app, name, navigate);
    } else if (path === '/energy') {
      crumbs([['energy', path]]);
      teardown = await energyPage(app, navigate);
    } else if (path === '/waste') {
      crumbs([['waste', path]]);
      teardown = await wastePage(app, navigate);
    } else if (path === '/alerts') {
      crumbs([['alerts', path]]);
      teardown = await alertsPage(app);
    } else if (gpu) {
      const uuid = decodeURIComponent(gpu[1]);
      crumbs([[uuid, path]]);
      teardown = await gpuPage(app, uuid, navigate);
    } else {
      crumbs([]);
      teardown = await fleetPage(app);
    }
  } catch (e) {
    clear(app);
    app.append(el('p', { class: 'error', id: 'error' }, `cannot show this page: ${e instanceof Error ? e.message : String(e)}`));
  }
}

function navigate(url: string): void {
  history.pushState(null, '', url);
  markNav();
  void route();
}

// Same-origin links are handled here, without reloading the page.
document.addEventListener('click', (e) => {
  const a = (e.target as Element | null)?.closest('a');
  // In-page links (the skip link) are the browser's.
  if (a?.getAttribute('href')?.startsWith('#')) return;
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith('/api/') || url.pathname === '/metrics') return;
  e.preventDefault();
  navigate(url.pathname + url.search);
});
window.addEventListener('popstate', () => void route());
// The header's links, marked when their page is shown.
function markNav(): void {
  for (const a of document.querySelectorAll<HTMLAnchorElement>('#nav a')) {
    a.classList.toggle('active', new URL(a.href).pathname === location.pathname);
  }
}
window.addEventListener('popstate', markNav);
void route().then(markNav);
void showWarnings();

// The collector's exposure warnings (e.g. listening on the network without TLS or login),
// from /api/v1/health, as a banner on every page: an operator must not miss them.
async function showWarnings(): Promise<void> {
  let warnings: string[] = [];
  try {
    warnings = (await getJson<HealthView>('/api/v1/health')).warnings ?? [];
  } catch {
    return; // the pages say themselves when the collector cannot be reached
  }
  if (warnings.length === 0) return;
  const box = el('div', { id: 'warnings', class: 'warnings', role: 'alert' });
  for (const w of warnings) box.append(el('p', {}, `⚠ ${w}`));
  document.getElementById('top')?.after(box);
}
