-- Closed hours of GPU health readings packed; the same table as
-- migrations/sqlite/0029_packed_gpu_health_hours.sql (see there for how it is used). The
-- values are compressed already: stored out of line without a second compression.
CREATE TABLE packed_gpu_health_hours (
    gpu_id  bigint NOT NULL, -- gpus.id
    hour_ms bigint NOT NULL, -- start of the hour, Unix ms
    packed  bytea  NOT NULL,
    PRIMARY KEY (gpu_id, hour_ms)
);
ALTER TABLE packed_gpu_health_hours ALTER COLUMN packed SET STORAGE EXTERNAL;
