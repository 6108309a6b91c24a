// One EventSource on /api/v1/live for the whole page (optionally filtered to one node).
// Only a page fed by it shows the header's badge ("connecting…", "live", "reconnecting…");
// the router clears the badge on every page change, so a past range shows none.
import type { LiveStatus, LiveTick } from './api';

export interface LiveHandlers {
  tick?: (t: LiveTick) => void;
  status?: (s: LiveStatus) => void;
  /** The server skipped ticks for us (we were too slow): reload the full state. */
  resync?: () => void;
}

export function openLive(node: string | null, h: LiveHandlers): () => void {
  const url = '/api/v1/live' + (node ? `?node=${encodeURIComponent(node)}` : '');
  const es = new EventSource(url);
  const conn = document.getElementById('conn');
  const setConn = (text: string, cls: string) => {
    if (conn) {
      conn.textContent = text;
      conn.className = 'conn ' + cls;
    }
  };
  setConn('connecting…', 'wait');
  es.addEventListener('open', () => setConn('live', 'ok'));
  es.addEventListener('error', () => setConn('reconnecting…', 'bad'));
  es.addEventListener('tick', (e) => h.tick?.(JSON.parse((e as MessageEvent).data) as LiveTick));
  es.addEventListener('status', (e) => h.status?.(JSON.parse((e as MessageEvent).data) as LiveStatus));
  es.addEventListener('resync', () => h.resync?.());
  return () => es.close();
}
