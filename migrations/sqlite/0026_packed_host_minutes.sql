-- Closed minutes of host rows, packed: one row per node per minute holding that minute's
-- host_samples rows column by column (collector/src/store/packed/host.rs: delta / XOR
-- coded varints, absent values in a presence map, deflated, with a CRC-32C).
--
-- The rollup task packs a minute once it is an hour old, rolled up, and its rollup row
-- counts exactly the rows it holds; the rows then leave host_samples in the same
-- transaction. A minute is in one form at a time: a write that lands in a packed minute
-- unpacks it back into host_samples first (late data, replays), and it is packed again
-- once its rollup is recomputed. The newest minute of a node always stays in rows.
-- Readers merge both forms. Retention deletes packed minutes behind the raw horizon.
--
-- A database of the layout before this keeps working unchanged: its host rows are
-- packed, oldest first, by the rollup task's next passes.
CREATE TABLE packed_host_minutes (
    node_id   INTEGER NOT NULL, -- nodes.id
    minute_ms INTEGER NOT NULL,
    packed    BLOB    NOT NULL,
    PRIMARY KEY (node_id, minute_ms)
) STRICT;
