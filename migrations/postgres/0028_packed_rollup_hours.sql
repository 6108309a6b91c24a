-- Closed hours of rollup minutes packed; the same tables as
-- migrations/sqlite/0028_packed_rollup_hours.sql (see there for how they are used). The
-- values are compressed already: stored out of line without a second compression.
CREATE TABLE packed_gpu_rollup_hours (
    gpu_id  bigint NOT NULL, -- gpus.id
    hour_ms bigint NOT NULL, -- start of the hour, Unix ms
    packed  bytea  NOT NULL,
    PRIMARY KEY (gpu_id, hour_ms)
);
ALTER TABLE packed_gpu_rollup_hours ALTER COLUMN packed SET STORAGE EXTERNAL;

CREATE TABLE packed_host_rollup_hours (
    node_id bigint NOT NULL, -- nodes.id
    hour_ms bigint NOT NULL,
    packed  bytea  NOT NULL,
    PRIMARY KEY (node_id, hour_ms)
);
ALTER TABLE packed_host_rollup_hours ALTER COLUMN packed SET STORAGE EXTERNAL;
