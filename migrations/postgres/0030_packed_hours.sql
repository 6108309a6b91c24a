-- Packed raw values an hour long; the same columns as migrations/sqlite/0030_packed_hours.sql
-- (see there for how they are used): minute_ms is where a value starts, span_ms how long
-- it is (60000: a minute's value, 3600000: an hour's).
ALTER TABLE packed_host_minutes ADD COLUMN span_ms bigint NOT NULL DEFAULT 60000;
ALTER TABLE packed_process_minutes ADD COLUMN span_ms bigint NOT NULL DEFAULT 60000;
ALTER TABLE packed_gpu_minutes ADD COLUMN span_ms bigint NOT NULL DEFAULT 60000;

-- The minute values alone, for the pass that looks for hours to merge.
CREATE INDEX packed_host_minutes_unmerged ON packed_host_minutes (node_id, minute_ms)
    WHERE span_ms = 60000;
CREATE INDEX packed_process_minutes_unmerged ON packed_process_minutes (gpu_id, minute_ms)
    WHERE span_ms = 60000;
CREATE INDEX packed_gpu_minutes_unmerged ON packed_gpu_minutes (gpu_id, minute_ms)
    WHERE span_ms = 60000;
