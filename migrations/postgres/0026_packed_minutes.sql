-- Closed minutes packed; the same tables as migrations/sqlite/0026_packed_minutes.sql
-- (see there for how they are used). The values are compressed already: stored out of
-- line without a second compression.
CREATE TABLE packed_host_minutes (
    node_id   bigint NOT NULL, -- nodes.id
    minute_ms bigint NOT NULL,
    packed    bytea  NOT NULL,
    PRIMARY KEY (node_id, minute_ms)
);
ALTER TABLE packed_host_minutes ALTER COLUMN packed SET STORAGE EXTERNAL;

CREATE TABLE packed_process_minutes (
    gpu_id    bigint NOT NULL, -- gpus.id
    minute_ms bigint NOT NULL,
    packed    bytea  NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms)
);
ALTER TABLE packed_process_minutes ALTER COLUMN packed SET STORAGE EXTERNAL;
