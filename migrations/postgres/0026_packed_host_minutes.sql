-- Closed minutes of host rows, packed; the same table as
-- migrations/sqlite/0026_packed_host_minutes.sql (see there for how it is used).
-- The value is compressed already: stored out of line without a second compression.
CREATE TABLE packed_host_minutes (
    node_id   bigint NOT NULL, -- nodes.id
    minute_ms bigint NOT NULL,
    packed    bytea  NOT NULL,
    PRIMARY KEY (node_id, minute_ms)
);
ALTER TABLE packed_host_minutes ALTER COLUMN packed SET STORAGE EXTERNAL;
