-- GPU health signals: the same tables as migrations/sqlite/0022_gpu_health.sql.
--
-- The NVML temperature thresholds of each GPU, from the inventory of the latest Hello
-- (degrees C; NULL when NVML does not report them). Inventory u32s are kept as their value.
ALTER TABLE gpus ADD COLUMN temp_slowdown_c bigint;
ALTER TABLE gpus ADD COLUMN temp_shutdown_c bigint;
ALTER TABLE gpus ADD COLUMN temp_gpu_max_c bigint;
ALTER TABLE gpus ADD COLUMN temp_mem_max_c bigint;

-- One row per GPU per tick that carried its health counters (agents read them every
-- health interval, 30 s by default, and after an Xid / ECC / GPU-lost event), written by
-- the group commit. NULL: NVML does not support the counter on this GPU. Not partitioned:
-- a row every 30 s per GPU is a thirtieth of gpu_samples; retention deletes it behind the
-- GPU's raw horizon (the newest row before it kept: the live state is seeded from it).
-- Counts are kept as their value (validated below 2^53).
CREATE TABLE gpu_health (
    gpu_id                      bigint  NOT NULL, -- gpus.id
    ts_ms                       bigint  NOT NULL,
    retired_pages_sbe           bigint,
    retired_pages_dbe           bigint,
    retired_pages_pending       boolean,
    remapped_rows_correctable   bigint,
    remapped_rows_uncorrectable bigint,
    remapped_rows_pending       boolean,
    remapped_rows_failed        boolean,
    ecc_corrected_aggregate     bigint,
    ecc_uncorrected_aggregate   bigint,
    pcie_replay_count           bigint,
    nvlink_crc_errors           bigint,
    nvlink_replay_errors        bigint,
    nvlink_recovery_errors      bigint,
    persistence_mode            boolean,
    PRIMARY KEY (gpu_id, ts_ms)
);
