-- Closed minutes packed: one row per node (host rows) or GPU (process ticks) per minute,
-- holding that minute's rows column by column (collector/src/store/packed/: delta / XOR
-- coded varints, absent values in a presence map, deflated, with a CRC-32C).
--
--   packed_host_minutes     a node's host_samples rows of the minute
--   packed_process_minutes  a GPU's process_samples rows of the minute (per tick what
--                           changes, and the lifetime id: identities stay in process_lives)
--
-- The rollup task packs a minute once it is an hour old and nothing will recompute it
-- from these rows: a host minute behind the node's rollup watermark whose rollup row
-- counts exactly its rows; a process minute behind the GPU's energy watermark whose
-- energy minute counts exactly the GPU's samples in it. The rows leave their table in
-- the same transaction; the newest minute of a node or GPU always stays in rows. A minute
-- is in one form at a time: a write that lands in a packed minute (late data, replays)
-- unpacks it back into rows first, and it is packed again once it is recomputed. Readers
-- merge both forms. Retention deletes packed minutes behind the raw horizon.
--
-- A database of the layout before this keeps working unchanged: its rows are packed,
-- oldest first, by the rollup task's next passes.
CREATE TABLE packed_host_minutes (
    node_id   INTEGER NOT NULL, -- nodes.id
    minute_ms INTEGER NOT NULL,
    packed    BLOB    NOT NULL,
    PRIMARY KEY (node_id, minute_ms)
) STRICT;

CREATE TABLE packed_process_minutes (
    gpu_id    INTEGER NOT NULL, -- gpus.id
    minute_ms INTEGER NOT NULL,
    packed    BLOB    NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms)
) STRICT;
