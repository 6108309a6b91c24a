// The collector's JSON API, as the dashboard uses it. Every response type is the API's own
// description: src/generated/api.ts is generated from openapi.json (the collector's
// /api/v1/openapi.json, committed) by `npm run gen:api`, and CI fails when the two drift
// (`npm run check:api`). Do not write a server shape by hand here: give its Rust type a
// utoipa::ToSchema instead, then regenerate.
import type { components } from './generated/api';

type Schemas = components['schemas'];

// ---- Nodes and GPUs: /api/v1/nodes, /api/v1/nodes/{name}, /api/v1/gpus/{uuid}
export type Status = Schemas['NodeStatus'];
export type NodeView = Schemas['NodeView'];
export type HostView = Schemas['HostView'];
export type HostLatestView = Schemas['HostLatestView'];
export type HostSample = Schemas['HostSample'];
export type GpuView = Schemas['GpuView'];
export type GpuDetailView = Schemas['GpuDetailView'];
export type GpuLatestView = Schemas['GpuLatestView'];
export type GpuSample = Schemas['GpuSample'];
/** GPU Performance Monitoring (Hopper and newer): activities in hundredths of a percent,
 * every field absent on a GPU without GPM (never 0). */
export type GpmMetrics = Schemas['GpmMetrics'];
export type MigGpm = Schemas['MigGpm'];
export type Process = Schemas['ProcessSample'];
export type Workload = Schemas['Workload'];

// ---- The fleet's brief listing: /api/v1/fleet
export type FleetNode = Schemas['FleetNode'];
export type FleetGpu = Schemas['FleetGpu'];
export type FleetReason = Schemas['FleetReason'];

// ---- Health: /api/v1/health, the health in node and GPU views, /api/v1/health/xid/{code}
export type HealthView = Schemas['HealthView'];
export type HealthState = Schemas['HealthState'];
/** One reason a GPU or node is not (entirely) ok; severity `ok` is informational.
 * /api/v1/fleet lists only warning and critical reasons, without action or since
 * ({@link FleetReason}). */
export type HealthReason = Schemas['HealthReason'];
export type GpuHealth = Schemas['GpuHealth'];
export type NodeHealth = Schemas['NodeHealth'];
/** The Xid catalogue's entry for an Xid event. */
export type XidInfo = Schemas['XidInfo'];

// ---- Series and events: /api/v1/nodes/{name}/series, …/host/series, /api/v1/gpus/{uuid}/series,
// /api/v1/nodes/{name}/events
export type NodeSeries = Schemas['NodeSeriesView'];
export type HostSeries = Schemas['HostSeriesView'];
export type GpuSeries = Schemas['SeriesView'];
export type EventsView = Schemas['EventsView'];
export type EventView = Schemas['EventView'];

// ---- Energy, carbon and waste: /api/v1/energy, /api/v1/containers[/{key}],
// /api/v1/carbon/intensity, /api/v1/waste
export type EnergyView = Schemas['EnergyView'];
export type EnergyTotals = Schemas['EnergyTotals'];
export type GpuEnergyView = Schemas['GpuEnergyView'];
export type Baseline = Schemas['BaselineView'];
export type MethodMix = Schemas['MethodMix'];
export type CarbonView = Schemas['CarbonView'];
export type ContainersView = Schemas['ContainersView'];
export type ContainerRow = Schemas['ContainerRow'];
export type ContainerView = Schemas['ContainerView'];
export type MinutePoint = Schemas['MinutePoint'];
export type IntensityView = Schemas['IntensityView'];
export type IntensitySlot = Schemas['SlotView'];
export type WasteView = Schemas['WasteView'];
export type Episode = Schemas['EpisodeView'];
export type WorkloadTotal = Schemas['WorkloadTotalView'];

// ---- Energy over time: /api/v1/energy/series
export type EnergySeriesView = Schemas['EnergySeriesView'];
export type EnergyBand = Schemas['EnergyBand'];

// ---- Alerts: /api/v1/alerts, /api/v1/alerts/history, /api/v1/alerts/rules
export type AlertState = Schemas['AlertState'];
export type AlertsView = Schemas['AlertsView'];
export type AlertView = Schemas['AlertView'];
export type HistoryView = Schemas['HistoryView'];
export type TransitionView = Schemas['TransitionView'];
export type RulesView = Schemas['RulesView'];
export type RuleView = Schemas['RuleView'];

// ---- The live stream: /api/v1/live (Server-Sent Events).
// NOT IN THE SPEC: the OpenAPI document describes this endpoint's body only as
// `text/event-stream` (a string), so its events' envelopes below are written by hand
// (from collector/src/api/live.rs: TickView, TickGpu, HostView, StatusNode), built from
// the generated parts they flatten. Replace them with generated types once those Rust
// types derive utoipa::ToSchema and are listed among the document's components.

/** A `tick` event: the newest tick of one node's committed batch. */
export interface LiveTick {
  node: string;
  time_ms: Schemas['i64'];
  gpus: (GpuSample & { uuid: string })[];
  host: (HostSample & { time_ms: Schemas['i64'] }) | null;
  processes: Process[];
}

/** A `status` event, every second. */
export interface LiveStatus {
  now_ms: Schemas['i64'];
  nodes: {
    name: string;
    status: Status;
    last_seen_ms: Schemas['i64'] | null;
    connected: boolean;
    health: HealthState;
    /** GPUs that are not ok, by UUID. */
    gpu_health: Record<string, HealthState>;
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
