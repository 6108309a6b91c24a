-- Closed minutes of a GPU's samples packed; the same table as
-- migrations/sqlite/0027_packed_gpu_minutes.sql (see there for how it is used). The
-- values are compressed already: stored out of line without a second compression.
CREATE TABLE packed_gpu_minutes (
    gpu_id    bigint NOT NULL, -- gpus.id
    minute_ms bigint NOT NULL,
    packed    bytea  NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms)
);
ALTER TABLE packed_gpu_minutes ALTER COLUMN packed SET STORAGE EXTERNAL;
