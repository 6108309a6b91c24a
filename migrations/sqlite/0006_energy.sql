-- Energy accounting (issue 6): per-minute rollups computed from gpu_samples and
-- process_samples by the collector's accountant, and its progress per GPU.
--
-- Every row records how its numbers were obtained: energy by method (counter / trapezoid),
-- the idle power and where it came from, the idle policy and the gap limit. Conservation
-- holds per row: sum(energy_workload_minutes.energy_mj) + idle_mj + unattributed_mj =
-- energy_mj (`gpufleet-collector check-energy` verifies it, and recomputes from raw).
-- Carbon (a later migration) prices these minutes: it adds its own columns or table keyed
-- the same way, with the intensity's source, region and forecast/actual.

-- One row per GPU per minute that has samples. An interval (t0, t1] belongs to the minute
-- holding t1; a gap (an interval longer than max_gap_ms) adds its length to missing_ms and
-- no energy.
CREATE TABLE energy_gpu_minutes (
    gpu_id          INTEGER NOT NULL, -- gpus.id
    minute_ms       INTEGER NOT NULL, -- start of the minute, Unix ms
    energy_mj       INTEGER NOT NULL, -- measured energy of the GPU
    counter_mj      INTEGER NOT NULL, -- of which from the energy counter
    trapezoid_mj    INTEGER NOT NULL, -- of which integrated from power
    attributed_mj   INTEGER NOT NULL, -- given to workloads (incl. spread idle)
    idle_mj         INTEGER NOT NULL, -- the idle bucket (policy separate, or no process)
    unattributed_mj INTEGER NOT NULL, -- active energy with no process listed
    covered_ms      INTEGER NOT NULL, -- measured time
    missing_ms      INTEGER NOT NULL, -- gap time (no energy)
    samples         INTEGER NOT NULL, -- GPU samples in the minute when computed
    min_power_mw    INTEGER,          -- lowest power in the minute; NULL if none reported
    idle_mw         INTEGER NOT NULL, -- idle power used
    idle_source     TEXT    NOT NULL, -- min | watts
    idle_policy     TEXT    NOT NULL, -- spread | separate
    max_gap_ms      INTEGER NOT NULL, -- gap limit used
    PRIMARY KEY (gpu_id, minute_ms)
) STRICT, WITHOUT ROWID;

CREATE INDEX energy_gpu_minutes_by_time ON energy_gpu_minutes (minute_ms);

-- One row per workload per GPU per minute in which it was resident.
CREATE TABLE energy_workload_minutes (
    gpu_id       INTEGER NOT NULL, -- gpus.id
    minute_ms    INTEGER NOT NULL,
    workload_id  INTEGER NOT NULL, -- workloads.id
    energy_mj    INTEGER NOT NULL, -- everything attributed (active share + spread idle)
    idle_mj      INTEGER NOT NULL, -- of which idle (policy spread)
    counter_mj   INTEGER NOT NULL, -- of which measured by the counter
    trapezoid_mj INTEGER NOT NULL, -- of which integrated from power
    gpu_ms       INTEGER NOT NULL, -- time resident on the GPU in measured intervals
    share_ppm_ms INTEGER NOT NULL, -- sum of (active share in ppm x interval ms)
    sm_ms        INTEGER NOT NULL, -- time split by SM utilization
    memory_ms    INTEGER NOT NULL, -- time split by GPU memory
    equal_ms     INTEGER NOT NULL, -- time split equally
    PRIMARY KEY (gpu_id, minute_ms, workload_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX energy_workload_minutes_by_time ON energy_workload_minutes (minute_ms);
CREATE INDEX energy_workload_minutes_by_workload ON energy_workload_minutes (workload_id, minute_ms);

-- The accountant's watermark: every minute before done_to_ms with samples has rows.
CREATE TABLE energy_progress (
    gpu_id     INTEGER PRIMARY KEY, -- gpus.id
    done_to_ms INTEGER NOT NULL
) STRICT;
