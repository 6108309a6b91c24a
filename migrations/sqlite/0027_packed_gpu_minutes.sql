-- Closed minutes of a GPU's gpu_samples rows, packed like the host rows and process ticks
-- of 0026 (collector/src/store/packed/gpu.rs: every field of every sample, absent values
-- absent, NVLink links per sample). The rollup task packs a GPU's minute once it is an
-- hour old, behind the GPU's rollup and energy watermarks, its rollup and energy minutes
-- both count exactly its rows, and its process ticks are packed already (a minute
-- without process rows); the newest minute of a GPU stays in rows. A write that lands in
-- a packed minute unpacks it (and the GPU's process minute) back into rows first.
-- Retention deletes packed minutes behind the raw horizon but the newest sample before
-- it (a row, or its minute packed again holding it alone). A database before this keeps working: its rows are packed, oldest
-- first, by the rollup task's next passes.
CREATE TABLE packed_gpu_minutes (
    gpu_id    INTEGER NOT NULL, -- gpus.id
    minute_ms INTEGER NOT NULL,
    packed    BLOB    NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms)
) STRICT;
