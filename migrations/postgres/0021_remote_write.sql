-- Prometheus remote-write: how far each stream has been delivered, so a restarted (or a
-- newly leading) collector resumes where the last push ended: nothing lost, nothing sent
-- twice beyond the batch that was in flight.
--   stream       'gpu' (one row per GPU, series = its UUID) or 'energy' (series '').
--   position_ms  the newest sample time (GPU) or energy minute delivered (2xx) or dropped
--                (refused with a 4xx other than 429, and counted). Only moves forward.
CREATE TABLE remote_write_positions (
    stream      TEXT NOT NULL,
    series      TEXT NOT NULL,
    position_ms BIGINT NOT NULL,
    PRIMARY KEY (stream, series)
);

-- The cumulative energy last pushed per workload and node (gpufleet_workload_energy_joules_total),
-- saved with the energy position once delivered: a new term continues from these, so the
-- counter never goes back even when retention has deleted the minutes it was summed from
-- or a pushed minute was later recomputed lower. Each value only grows.
--   workload_key  workloads.key;  node_name  nodes.name.
CREATE TABLE remote_write_energy_totals (
    workload_key TEXT NOT NULL,
    node_name    TEXT NOT NULL,
    active_mj    BIGINT NOT NULL,
    idle_mj      BIGINT NOT NULL,
    PRIMARY KEY (workload_key, node_name)
);
