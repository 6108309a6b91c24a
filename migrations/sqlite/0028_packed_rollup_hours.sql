-- Closed hours of rollup minutes packed: one value per GPU (node) per hour holding that
-- hour's gpu_minutes (host_minutes) rows column by column (collector/src/store/packed/
-- rollup.rs: every column of every row, absent values absent, averages bit for bit).
-- Rollups are kept for --retain-rollups (400 days by default), and a packed hour takes a
-- few percent of its rows. The rollup task packs an hour once it ends behind the series'
-- rollup watermark and the packing horizon, and no raw row of the series is left in it;
-- recomputing a minute (late data) unpacks its hour back into rows first, so a minute is
-- in one form at a time. Readers merge rows and packed hours. A database before this keeps
-- working: its rollup rows are packed, oldest first, by the rollup task's next passes.
CREATE TABLE packed_gpu_rollup_hours (
    gpu_id  INTEGER NOT NULL, -- gpus.id
    hour_ms INTEGER NOT NULL, -- start of the hour, Unix ms
    packed  BLOB    NOT NULL,
    PRIMARY KEY (gpu_id, hour_ms)
) STRICT;

CREATE TABLE packed_host_rollup_hours (
    node_id INTEGER NOT NULL, -- nodes.id
    hour_ms INTEGER NOT NULL,
    packed  BLOB    NOT NULL,
    PRIMARY KEY (node_id, hour_ms)
) STRICT;
