// How a workload is named on every page: the names its runtime gave it (pod, namespace,
// container, image; a Slurm job's name and account), its ids one hover away (`title`).
// Absent fields (left out, or null) are not known.
import type { Workload } from './api';
import { el } from './dom';

/** Its name (`name`), what places it (`detail`: namespace, image, account …) and its
 * ids for a hover (`ids`). Client-side: what the pages show of a Workload. */
export interface Named {
  name: string;
  detail: string;
  ids: string;
}

const short = (id: string | null | undefined) => (id ? id.slice(0, 12) : undefined);

export function nameOf(w: Workload): Named {
  const labels = Object.entries(w.labels ?? {}).map(([k, v]) => `${k}=${v}`);
  switch (w.kind) {
    case 'slurm': {
      const job = `job ${w.job_id ?? '?'}${w.step ? ' step ' + w.step : ''}`;
      return {
        name: w.job_name ?? job,
        detail: [w.job_name ? job : null, w.account && `account ${w.account}`, w.partition, w.job_user].filter(Boolean).join(' · '),
        ids: `Slurm job ${w.job_id ?? '?'}`,
      };
    }
    case 'container': {
      const pod = w.pod_name ? `${w.namespace ? w.namespace + '/' : ''}${w.pod_name}` : null;
      const container = w.container_name ?? short(w.container_id) ?? 'container';
      const ids = [w.runtime, w.pod_uid && `pod ${w.pod_uid}`, w.container_id && `container ${w.container_id}`].filter(Boolean).join('\n');
      return {
        name: pod ? `${pod} · ${container}` : container,
        detail: [w.image, ...labels].filter(Boolean).join(' · ') || (w.pod_uid && !pod ? `pod ${w.pod_uid.slice(0, 8)}` : ''),
        ids,
      };
    }
    default:
      return {
        name: w.unit ?? (w.uid != null ? `uid ${w.uid}` : 'host'),
        detail: '',
        ids: [w.unit, w.uid != null ? `uid ${w.uid}` : null].filter(Boolean).join('\n'),
      };
  }
}

/** A workload as a table cell: its name, what places it on a line below, its ids (and
 * `key`, its `Workload::key()`, when given) in the cell's `title`. The one place pages
 * (node, GPU, waste, alerts) make a workload's cell. */
export function workloadCell(w: Workload, key?: string, attrs: Record<string, string> = {}): HTMLTableCellElement {
  const n = nameOf(w);
  const title = [n.ids, key && !n.ids.includes(key) ? key : null].filter(Boolean).join('\n');
  return el('td', { 'data-col': 'workload', title: title || undefined, ...attrs },
    n.name, n.detail ? el('span', { class: 'muted sub' }, n.detail) : '');
}

const HEX_ID = /^[0-9a-f]{32,}$/i;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** The workload an alert's labels describe (the workload series' labels: `workload`,
 * `kind`, `namespace`, `pod`, `container`, `job`, `job_name`, `account`, `user`), or null
 * when they name none. A `pod` or `container` label holding an id (no name was known) is
 * taken as that id. Client-side: what the alerts page reads of AlertView's labels. */
export function workloadOfLabels(labels: Record<string, string>): Workload | null {
  const key = labels.workload;
  if (!key) return null;
  const kind = labels.kind === 'container' || labels.kind === 'slurm' || labels.kind === 'host' ? labels.kind
    : key.startsWith('container:') ? 'container' : key.startsWith('slurm:') ? 'slurm' : 'host';
  const pod = labels.pod;
  const container = labels.container;
  const uid = Number(labels.user);
  return {
    kind,
    runtime: kind === 'slurm' ? 'slurm' : '',
    namespace: labels.namespace || undefined,
    pod_name: pod && !UUID.test(pod) ? pod : undefined,
    pod_uid: pod && UUID.test(pod) ? pod : undefined,
    container_name: container && !HEX_ID.test(container) ? container : undefined,
    container_id: container && HEX_ID.test(container) ? container : kind === 'container' ? key.slice('container:'.length) : undefined,
    job_id: labels.job || (kind === 'slurm' ? key.slice('slurm:'.length) : undefined),
    job_name: labels.job_name || undefined,
    account: labels.account || undefined,
    unit: kind === 'host' && key.startsWith('host:') && !key.startsWith('host:uid-') ? key.slice('host:'.length) : undefined,
    uid: labels.user && Number.isInteger(uid) ? uid : undefined,
  };
}

/** The labels {@link workloadOfLabels} reads (shown as the workload's name instead). */
export const WORKLOAD_LABELS = new Set(['workload', 'kind', 'namespace', 'pod', 'container', 'job', 'job_name', 'account', 'user']);
