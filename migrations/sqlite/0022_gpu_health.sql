-- GPU health signals (issue: GPU health explained).
--
-- The NVML temperature thresholds of each GPU, from the inventory of the latest Hello
-- (degrees C; NULL when NVML does not report them).
ALTER TABLE gpus ADD COLUMN temp_slowdown_c INTEGER;
ALTER TABLE gpus ADD COLUMN temp_shutdown_c INTEGER;
ALTER TABLE gpus ADD COLUMN temp_gpu_max_c INTEGER;
ALTER TABLE gpus ADD COLUMN temp_mem_max_c INTEGER;

-- One row per GPU per tick that carried its health counters (agents read them every
-- health interval, 30 s by default, and after an Xid / ECC / GPU-lost event), written by
-- the group commit. NULL: NVML does not support the counter on this GPU. Flags are 0 / 1.
-- Kept like the raw samples: deleted behind the GPU's raw horizon, the newest row before
-- it kept (the live state is seeded with each GPU's newest row).
CREATE TABLE gpu_health (
    gpu_id                      INTEGER NOT NULL, -- gpus.id
    ts_ms                       INTEGER NOT NULL,
    retired_pages_sbe           INTEGER,
    retired_pages_dbe           INTEGER,
    retired_pages_pending       INTEGER,
    remapped_rows_correctable   INTEGER,
    remapped_rows_uncorrectable INTEGER,
    remapped_rows_pending       INTEGER,
    remapped_rows_failed        INTEGER,
    ecc_corrected_aggregate     INTEGER,
    ecc_uncorrected_aggregate   INTEGER,
    pcie_replay_count           INTEGER,
    nvlink_crc_errors           INTEGER,
    nvlink_replay_errors        INTEGER,
    nvlink_recovery_errors      INTEGER,
    persistence_mode            INTEGER,
    PRIMARY KEY (gpu_id, ts_ms)
) STRICT, WITHOUT ROWID;
