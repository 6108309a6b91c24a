-- Energy accounting (issue 6): the same tables as migrations/sqlite/0006_energy.sql.

CREATE TABLE energy_gpu_minutes (
    gpu_id          bigint NOT NULL,
    minute_ms       bigint NOT NULL,
    energy_mj       bigint NOT NULL,
    counter_mj      bigint NOT NULL,
    trapezoid_mj    bigint NOT NULL,
    attributed_mj   bigint NOT NULL,
    idle_mj         bigint NOT NULL,
    unattributed_mj bigint NOT NULL,
    covered_ms      bigint NOT NULL,
    missing_ms      bigint NOT NULL,
    samples         bigint NOT NULL,
    min_power_mw    bigint,
    idle_mw         bigint NOT NULL,
    idle_source     text   NOT NULL,
    idle_policy     text   NOT NULL,
    max_gap_ms      bigint NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms)
);

CREATE INDEX energy_gpu_minutes_by_time ON energy_gpu_minutes (minute_ms);

CREATE TABLE energy_workload_minutes (
    gpu_id       bigint NOT NULL,
    minute_ms    bigint NOT NULL,
    workload_id  bigint NOT NULL,
    energy_mj    bigint NOT NULL,
    idle_mj      bigint NOT NULL,
    counter_mj   bigint NOT NULL,
    trapezoid_mj bigint NOT NULL,
    gpu_ms       bigint NOT NULL,
    share_ppm_ms bigint NOT NULL,
    sm_ms        bigint NOT NULL,
    memory_ms    bigint NOT NULL,
    equal_ms     bigint NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms, workload_id)
);

CREATE INDEX energy_workload_minutes_by_time ON energy_workload_minutes (minute_ms);
CREATE INDEX energy_workload_minutes_by_workload ON energy_workload_minutes (workload_id, minute_ms);

CREATE TABLE energy_progress (
    gpu_id     bigint PRIMARY KEY,
    done_to_ms bigint NOT NULL
);
