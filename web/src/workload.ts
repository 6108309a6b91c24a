// How a workload is named on every page: the names its runtime gave it (pod, namespace,
// container, image; a Slurm job's name and account), its ids one hover away (`title`).
// Absent fields (left out, or null) are not known.
import type { Workload } from './api';

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
