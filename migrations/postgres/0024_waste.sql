-- Idle-but-allocated waste (collector/src/accounting/waste.rs): what the accountant
-- already sees per interval, kept per minute so waste is found from the energy minutes
-- alone (exact, already split, kept as long as energy is) and survives raw retention.
--
-- energy_gpu_minutes.util_max_pct     the highest GPU utilization reported at the end of
--                                     the minute's measured intervals; NULL when one of
--                                     them did not report it (or none was measured): a
--                                     minute is idle only when every interval says so.
-- energy_workload_minutes.mem_max_bytes  the most GPU memory the workload's processes held
--                                     together at the end of one of its intervals of the
--                                     minute; NULL when none of them reported memory.
--
-- Rows computed before this migration keep NULL (unknown, never idle) until recomputed.
ALTER TABLE energy_gpu_minutes ADD COLUMN util_max_pct bigint;
ALTER TABLE energy_workload_minutes ADD COLUMN mem_max_bytes bigint;
