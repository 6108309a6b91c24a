-- Packed raw values an hour long. Each closed hour of a series' packed minutes (0026,
-- 0027) is merged into one value of the same format once the hour has no row left, so
-- one deflate stream and one row cover the hour's 60 minutes. minute_ms is where a value
-- starts, span_ms how long it is:
--
--   60000    a minute's value (minute_ms on a minute boundary);
--   3600000  an hour's value (minute_ms on an hour boundary; the hour holds nothing else).
--
-- A write into an hour-long value splits it back into minute values (and reopens the
-- minutes it writes); retention splits the one that holds the raw horizon. Readers find
-- the values that overlap a range by start and span. Values written before this are
-- minutes.
ALTER TABLE packed_host_minutes ADD COLUMN span_ms INTEGER NOT NULL DEFAULT 60000;
ALTER TABLE packed_process_minutes ADD COLUMN span_ms INTEGER NOT NULL DEFAULT 60000;
ALTER TABLE packed_gpu_minutes ADD COLUMN span_ms INTEGER NOT NULL DEFAULT 60000;

-- The minute values alone, for the pass that looks for hours to merge.
CREATE INDEX packed_host_minutes_unmerged ON packed_host_minutes (node_id, minute_ms)
    WHERE span_ms = 60000;
CREATE INDEX packed_process_minutes_unmerged ON packed_process_minutes (gpu_id, minute_ms)
    WHERE span_ms = 60000;
CREATE INDEX packed_gpu_minutes_unmerged ON packed_gpu_minutes (gpu_id, minute_ms)
    WHERE span_ms = 60000;
