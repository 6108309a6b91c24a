-- Retention and per-minute rollups (issue 8).
--
-- gpu_minutes / host_minutes: per GPU (node) and minute, computed from gpu_samples
-- (host_samples) by the collector's rollup task and kept for --retain-rollups, long after the
-- raw samples are gone (--retain-raw). Per metric: <m>_n samples of the minute that reported
-- it, and avg / min / max over those samples only. A metric no sample of the minute reported
-- has <m>_n = 0 and NULL avg / min / max: absent is not zero. Integer metrics keep the raw
-- table's encoding (u64 as the i64 with the same bits). A bucket of several minutes is
-- sum(<m>_avg * <m>_n) / sum(<m>_n), which equals the average over the raw samples.

CREATE TABLE gpu_minutes (
    gpu_id                            INTEGER NOT NULL, -- gpus.id
    minute_ms                         INTEGER NOT NULL, -- start of the minute, Unix ms
    samples                           INTEGER NOT NULL, -- GPU samples in the minute when computed
    util_gpu_pct_n                    INTEGER NOT NULL,
    util_gpu_pct_avg                  REAL,
    util_gpu_pct_min                  INTEGER,
    util_gpu_pct_max                  INTEGER,
    util_mem_pct_n                    INTEGER NOT NULL,
    util_mem_pct_avg                  REAL,
    util_mem_pct_min                  INTEGER,
    util_mem_pct_max                  INTEGER,
    mem_used_bytes_n                  INTEGER NOT NULL,
    mem_used_bytes_avg                REAL,
    mem_used_bytes_min                INTEGER,
    mem_used_bytes_max                INTEGER,
    mem_total_bytes_n                 INTEGER NOT NULL,
    mem_total_bytes_avg               REAL,
    mem_total_bytes_min               INTEGER,
    mem_total_bytes_max               INTEGER,
    mem_reserved_bytes_n              INTEGER NOT NULL,
    mem_reserved_bytes_avg            REAL,
    mem_reserved_bytes_min            INTEGER,
    mem_reserved_bytes_max            INTEGER,
    power_mw_n                        INTEGER NOT NULL,
    power_mw_avg                      REAL,
    power_mw_min                      INTEGER,
    power_mw_max                      INTEGER,
    power_instant_mw_n                INTEGER NOT NULL,
    power_instant_mw_avg              REAL,
    power_instant_mw_min              INTEGER,
    power_instant_mw_max              INTEGER,
    power_limit_mw_n                  INTEGER NOT NULL,
    power_limit_mw_avg                REAL,
    power_limit_mw_min                INTEGER,
    power_limit_mw_max                INTEGER,
    energy_mj_n                       INTEGER NOT NULL,
    energy_mj_avg                     REAL,
    energy_mj_min                     INTEGER,
    energy_mj_max                     INTEGER,
    temp_gpu_c_n                      INTEGER NOT NULL,
    temp_gpu_c_avg                    REAL,
    temp_gpu_c_min                    INTEGER,
    temp_gpu_c_max                    INTEGER,
    temp_mem_c_n                      INTEGER NOT NULL,
    temp_mem_c_avg                    REAL,
    temp_mem_c_min                    INTEGER,
    temp_mem_c_max                    INTEGER,
    fan_pct_n                         INTEGER NOT NULL,
    fan_pct_avg                       REAL,
    fan_pct_min                       INTEGER,
    fan_pct_max                       INTEGER,
    clock_sm_mhz_n                    INTEGER NOT NULL,
    clock_sm_mhz_avg                  REAL,
    clock_sm_mhz_min                  INTEGER,
    clock_sm_mhz_max                  INTEGER,
    clock_mem_mhz_n                   INTEGER NOT NULL,
    clock_mem_mhz_avg                 REAL,
    clock_mem_mhz_min                 INTEGER,
    clock_mem_mhz_max                 INTEGER,
    clock_graphics_mhz_n              INTEGER NOT NULL,
    clock_graphics_mhz_avg            REAL,
    clock_graphics_mhz_min            INTEGER,
    clock_graphics_mhz_max            INTEGER,
    pstate_n                          INTEGER NOT NULL,
    pstate_avg                        REAL,
    pstate_min                        INTEGER,
    pstate_max                        INTEGER,
    pcie_tx_bps_n                     INTEGER NOT NULL,
    pcie_tx_bps_avg                   REAL,
    pcie_tx_bps_min                   INTEGER,
    pcie_tx_bps_max                   INTEGER,
    pcie_rx_bps_n                     INTEGER NOT NULL,
    pcie_rx_bps_avg                   REAL,
    pcie_rx_bps_min                   INTEGER,
    pcie_rx_bps_max                   INTEGER,
    nvlink_tx_bps_n                   INTEGER NOT NULL,
    nvlink_tx_bps_avg                 REAL,
    nvlink_tx_bps_min                 INTEGER,
    nvlink_tx_bps_max                 INTEGER,
    nvlink_rx_bps_n                   INTEGER NOT NULL,
    nvlink_rx_bps_avg                 REAL,
    nvlink_rx_bps_min                 INTEGER,
    nvlink_rx_bps_max                 INTEGER,
    ecc_corrected_volatile_n          INTEGER NOT NULL,
    ecc_corrected_volatile_avg        REAL,
    ecc_corrected_volatile_min        INTEGER,
    ecc_corrected_volatile_max        INTEGER,
    ecc_uncorrected_volatile_n        INTEGER NOT NULL,
    ecc_uncorrected_volatile_avg      REAL,
    ecc_uncorrected_volatile_min      INTEGER,
    ecc_uncorrected_volatile_max      INTEGER,
    enc_util_pct_n                    INTEGER NOT NULL,
    enc_util_pct_avg                  REAL,
    enc_util_pct_min                  INTEGER,
    enc_util_pct_max                  INTEGER,
    dec_util_pct_n                    INTEGER NOT NULL,
    dec_util_pct_avg                  REAL,
    dec_util_pct_min                  INTEGER,
    dec_util_pct_max                  INTEGER,
    PRIMARY KEY (gpu_id, minute_ms)
) STRICT, WITHOUT ROWID;

CREATE TABLE host_minutes (
    node_id                           INTEGER NOT NULL, -- nodes.id
    minute_ms                         INTEGER NOT NULL,
    samples                           INTEGER NOT NULL, -- host rows in the minute when computed
    cpu_util_pct_n                    INTEGER NOT NULL,
    cpu_util_pct_avg                  REAL,
    cpu_util_pct_min                  REAL,
    cpu_util_pct_max                  REAL,
    mem_used_bytes_n                  INTEGER NOT NULL,
    mem_used_bytes_avg                REAL,
    mem_used_bytes_min                INTEGER,
    mem_used_bytes_max                INTEGER,
    mem_total_bytes_n                 INTEGER NOT NULL,
    mem_total_bytes_avg               REAL,
    mem_total_bytes_min               INTEGER,
    mem_total_bytes_max               INTEGER,
    disk_read_bps_n                   INTEGER NOT NULL,
    disk_read_bps_avg                 REAL,
    disk_read_bps_min                 INTEGER,
    disk_read_bps_max                 INTEGER,
    disk_write_bps_n                  INTEGER NOT NULL,
    disk_write_bps_avg                REAL,
    disk_write_bps_min                INTEGER,
    disk_write_bps_max                INTEGER,
    net_rx_bps_n                      INTEGER NOT NULL,
    net_rx_bps_avg                    REAL,
    net_rx_bps_min                    INTEGER,
    net_rx_bps_max                    INTEGER,
    net_tx_bps_n                      INTEGER NOT NULL,
    net_tx_bps_avg                    REAL,
    net_tx_bps_min                    INTEGER,
    net_tx_bps_max                    INTEGER,
    load1_n                           INTEGER NOT NULL,
    load1_avg                         REAL,
    load1_min                         REAL,
    load1_max                         REAL,
    PRIMARY KEY (node_id, minute_ms)
) STRICT, WITHOUT ROWID;

-- The rollup task's watermark: every minute before done_to_ms of this GPU ('gpu', gpus.id)
-- or node's host metrics ('host', nodes.id) with samples has its rollup row.
CREATE TABLE rollup_progress (
    kind       TEXT    NOT NULL CHECK (kind IN ('gpu', 'host')),
    id         INTEGER NOT NULL,
    done_to_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
) STRICT, WITHOUT ROWID;

-- Retention's raw horizon: raw samples of this GPU / node are complete from raw_from_ms
-- (a minute start) on. Before it only rollups and energy minutes remain (plus, for a GPU,
-- the one sample just before raw_from_ms: the start of the first interval of that minute).
-- Minutes before it are never recomputed from raw: their raw samples are gone.
CREATE TABLE raw_horizon (
    kind        TEXT    NOT NULL CHECK (kind IN ('gpu', 'host')),
    id          INTEGER NOT NULL,
    raw_from_ms INTEGER NOT NULL,
    PRIMARY KEY (kind, id)
) STRICT, WITHOUT ROWID;
