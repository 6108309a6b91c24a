// The collector's JSON API, as the dashboard uses it (see the README's API section).

export type Status = 'online' | 'stale' | 'offline';

export interface GpuSample {
  util_gpu_pct: number | null;
  util_mem_pct: number | null;
  mem_used_bytes: number | null;
  mem_total_bytes: number | null;
  power_mw: number | null;
  power_limit_mw: number | null;
  energy_mj: number | null;
  temp_gpu_c: number | null;
  fan_pct: number | null;
  clock_sm_mhz: number | null;
  clock_mem_mhz: number | null;
  pstate: number | null;
  pcie_tx_bps: number | null;
  pcie_rx_bps: number | null;
  nvlink_tx_bps: number | null;
  nvlink_rx_bps: number | null;
  ecc_corrected_volatile: number | null;
  ecc_uncorrected_volatile: number | null;
  [k: string]: unknown;
}

export interface GpuLatest extends GpuSample {
  time_ms: number;
}

export interface Workload {
  kind: 'host' | 'container' | 'slurm';
  [k: string]: unknown;
}

export interface Process {
  gpu_uuid: string;
  pid: number;
  type: string;
  user: string | null;
  command: string | null;
  gpu_mem_bytes: number | null;
  sm_util_pct: number | null;
  workload: Workload;
}

export type HealthState = 'ok' | 'warning' | 'critical';

/** One reason a GPU or node is not (entirely) ok; severity `ok` is informational.
 * /api/v1/fleet lists only warning and critical reasons, without action or since. */
export interface HealthReason {
  code: string;
  severity: HealthState;
  summary: string;
  action?: string;
  since_ms?: number | null;
}

export interface GpuHealth {
  state: HealthState;
  reasons: HealthReason[];
}

export interface NodeHealth extends GpuHealth {
  gpus_warning: number;
  gpus_critical: number;
}

/** The Xid catalogue's entry for an Xid event. */
export interface XidInfo {
  code: number;
  name: string;
  meaning: string;
  cause: string;
  action: string;
  severity: 'info' | 'warning' | 'critical';
  known: boolean;
}

export interface GpuView {
  uuid: string;
  index: number;
  name: string;
  inventory: { pci_bus_id?: string | null; [k: string]: unknown };
  latest: GpuLatest | null;
  processes: Process[];
  health?: GpuHealth;
  /** The latest sample's throttle reasons by name (absent: no mask). */
  throttle?: string[] | null;
}

export interface HostLatest {
  time_ms: number;
  cpu_util_pct: number | null;
  mem_used_bytes: number | null;
  mem_total_bytes: number | null;
  disk_read_bps: number | null;
  disk_write_bps: number | null;
  net_rx_bps: number | null;
  net_tx_bps: number | null;
  load1: number | null;
}

export interface NodeView {
  name: string;
  status: Status;
  connected: boolean;
  last_seen_ms: number | null;
  labels: Record<string, string>;
  agent_version: string;
  interval_ms: number;
  health?: NodeHealth;
  host: {
    hostname: string;
    kernel: string | null;
    os: string | null;
    cpu_count: number | null;
    memory_total_bytes: number | null;
    driver_version: string | null;
    cuda_driver_version: string | null;
    latest: HostLatest | null;
  };
  gpus: GpuView[];
}

export type Point = [number, number | null];

export interface NodeSeries {
  metric: string;
  unit: string;
  step_ms: number | null;
  gpus: { uuid: string; index: number; points: Point[] }[];
}

export interface HostSeries {
  step_ms: number | null;
  points: ({ time_ms: number } & Omit<HostLatest, 'time_ms'>)[];
}

export interface GpuSeries {
  metric: string;
  unit: string;
  points: Point[];
}

export interface EventView {
  time_ms: number;
  gpu_uuid: string;
  kind: string;
  code: number | null;
  detail: string;
  /** For Xid events: the catalogue's entry. */
  explanation?: XidInfo | null;
}

/** A tick pushed by /api/v1/live. */
export interface LiveTick {
  node: string;
  time_ms: number;
  gpus: (GpuSample & { uuid: string })[];
  host: HostLatest | null;
  processes: Process[];
}

export interface LiveStatus {
  now_ms: number;
  nodes: {
    name: string;
    status: Status;
    last_seen_ms: number | null;
    connected: boolean;
    health?: HealthState;
    /** GPUs that are not ok, by UUID. */
    gpu_health?: Record<string, HealthState>;
  }[];
}

export class ApiError extends Error {}

export async function getJson<T>(path: string): Promise<T> {
  const r = await fetch(path, { headers: { accept: 'application/json' } });
  if (!r.ok) {
    let msg = `${r.status} ${r.statusText}`;
    try {
      const body = await r.json();
      if (body && typeof body.error === 'string') msg = body.error;
    } catch {
      /* not JSON */
    }
    throw new ApiError(msg);
  }
  return (await r.json()) as T;
}

export const enc = encodeURIComponent;
