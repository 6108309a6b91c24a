// GPU and node health as the dashboard shows it: a badge per state and the reasons, each
// with its summary and what to do (from the collector's judge; see /api/v1/health/gpus).
import type { FleetReason, HealthReason, HealthState, XidInfo } from './api';
import { el } from './dom';

/** A badge for a health state; `ok` is quiet. */
export function healthBadge(state: HealthState | undefined, id?: string): HTMLElement {
  const s = state ?? 'ok';
  return el('span', { class: `health ${s}`, 'data-health': s, id }, s);
}

/** A reason's severity badge: an `ok` reason is informational (listed, not a problem). */
export function reasonBadge(severity: HealthState): HTMLElement {
  const s = severity === 'ok' ? 'info' : severity;
  return el('span', { class: `health ${s}`, 'data-health': severity }, s);
}

/** The reasons as a list: severity, summary, and the action on its own line. */
export function reasonList(reasons: HealthReason[], id?: string): HTMLElement {
  const ul = el('ul', { class: 'reasons', id });
  for (const r of reasons) {
    ul.append(el('li', { 'data-code': r.code, 'data-severity': r.severity },
      reasonBadge(r.severity), ' ',
      el('span', { class: 'summary' }, r.summary),
      r.action ? el('div', { class: 'action' }, '→ ', r.action) : null));
  }
  if (reasons.length === 0) ul.append(el('li', { class: 'muted' }, 'no problems found'));
  return ul;
}

/** The reasons in one line, for a tooltip (/api/v1/fleet's brief reasons will do). */
export function reasonsText(reasons: FleetReason[] | undefined): string {
  return (reasons ?? [])
    .map((r) => `${r.severity === 'ok' ? 'info' : r.severity}: ${r.summary}`)
    .join('\n');
}

/** An Xid's name and what to do, for an events table cell. */
export function xidCell(x: XidInfo | null | undefined): HTMLElement | string {
  if (!x) return '';
  return el('span', { class: `xid ${x.severity}`, title: `${x.meaning} Likely cause: ${x.cause}` },
    el('strong', {}, x.name), ' — ', x.action);
}
