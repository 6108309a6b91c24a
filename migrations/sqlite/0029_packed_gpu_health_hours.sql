-- Closed hours of GPU health readings packed: one value per GPU per hour holding that
-- hour's gpu_health rows column by column (collector/src/store/packed/health.rs: every
-- field of every reading, absent values absent). The agent reads health every 30 s, so a
-- GPU-week is 20,160 rows whose values barely change; an hour of them packs into a few
-- dozen bytes. The rollup task packs an hour once it ends behind the packing horizon and
-- the GPU has a reading after it (its newest reading stays a row, to seed the live
-- state). A reading written later into a packed hour is a row until the next pass packs
-- it in; at a time both forms hold, the packed reading (the one written first) is the
-- reading, as a second insert of a stored time changes nothing. Readers merge rows and
-- packed hours. A database before this keeps working: its health rows are packed, oldest
-- first, by the rollup task's next passes.
CREATE TABLE packed_gpu_health_hours (
    gpu_id  INTEGER NOT NULL, -- gpus.id
    hour_ms INTEGER NOT NULL, -- start of the hour, Unix ms
    packed  BLOB    NOT NULL,
    PRIMARY KEY (gpu_id, hour_ms)
) STRICT;
