-- Energy people can trust on busy, shared GPUs (the learned idle baseline, the
-- memory-weighted idle split, active and idle under both policies, provisional minutes).
--
-- energy_gpu_minutes:
--   active_mj     the active part of energy_mj (the rest is idle: charged to workloads
--                 under `spread`, or in the idle bucket idle_mj);
--   seen_idle_ms, seen_idle_mj  intervals of the minute in which the GPU did no work
--                 (0 % utilization, no compute process): the evidence the idle baseline
--                 is learned from;
--   learned_idle_ms, learned_idle_mj  the evidence carried to the next minute: the GPU's
--                 most recent hour of seen-idle time and its energy;
--   provisional   1 while the minute is open (computed from the samples so far).
--   rules         the attribution rules the row was computed with: 1 older rows (baseline
--                 `min` or watts over the whole interval, idle split equally), 2 now.
-- idle_source now also says `learned`, `model` or `fallback` (`min`: older rows).
-- energy_workload_minutes:
--   active_mj     its active share; idle_mj is now its idle share by GPU memory held under
--                 both policies, charged (part of energy_mj) only under `spread`;
--   idle_memory_ms, idle_equal_ms  how its idle share was split;
--   provisional   as above.
ALTER TABLE energy_gpu_minutes ADD COLUMN active_mj INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_gpu_minutes ADD COLUMN seen_idle_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_gpu_minutes ADD COLUMN seen_idle_mj INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_gpu_minutes ADD COLUMN provisional INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_gpu_minutes ADD COLUMN rules INTEGER NOT NULL DEFAULT 1;
ALTER TABLE energy_gpu_minutes ADD COLUMN learned_idle_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_gpu_minutes ADD COLUMN learned_idle_mj INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_workload_minutes ADD COLUMN active_mj INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_workload_minutes ADD COLUMN idle_memory_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_workload_minutes ADD COLUMN idle_equal_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE energy_workload_minutes ADD COLUMN provisional INTEGER NOT NULL DEFAULT 0;

-- Older rows: idle_mj was the charged idle (0 under `separate`), split equally.
UPDATE energy_workload_minutes
   SET active_mj = energy_mj - idle_mj, idle_equal_ms = gpu_ms;
UPDATE energy_gpu_minutes
   SET active_mj = unattributed_mj + coalesce((SELECT sum(w.active_mj)
         FROM energy_workload_minutes w
        WHERE w.gpu_id = energy_gpu_minutes.gpu_id
          AND w.minute_ms = energy_gpu_minutes.minute_ms), 0);
