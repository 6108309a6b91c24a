-- Prometheus remote-write: how far each stream has been delivered, so a restarted (or a
-- newly leading) collector resumes where the last push ended: nothing lost, nothing sent
-- twice beyond the batch that was in flight.
--   stream       'gpu' (one row per GPU, series = its UUID) or 'energy' (series '').
--   position_ms  the newest sample time (GPU) or energy minute delivered (2xx) or dropped
--                (refused with a 4xx other than 429, and counted). Only moves forward.
CREATE TABLE remote_write_positions (
    stream      TEXT NOT NULL,
    series      TEXT NOT NULL,
    position_ms INTEGER NOT NULL,
    PRIMARY KEY (stream, series)
);
