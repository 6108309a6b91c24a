-- Alerts (collector/src/alerts): the current alert of each rule and series, written by the
-- collector that holds the `alerts` job's lease, so a new leader continues from them (a
-- pending alert keeps its start, a firing one is not announced twice); and the history of
-- their state changes, for the API and the dashboard.
--   fingerprint   of the alert's labels (alerts::eval::fingerprint).
--   state         pending | firing | resolved.
--   labels, annotations  JSON objects of strings.
--   *_ms          Unix ms (collector clock); fired / resolved / keep_firing_since /
--                 last_sent NULL until they happen.
CREATE TABLE alerts (
    rule                 TEXT NOT NULL,
    fingerprint          TEXT NOT NULL,
    state                TEXT NOT NULL,
    labels               TEXT NOT NULL,
    annotations          TEXT NOT NULL,
    value                REAL NOT NULL,
    active_at_ms         INTEGER NOT NULL,
    fired_at_ms          INTEGER,
    resolved_at_ms       INTEGER,
    keep_firing_since_ms INTEGER,
    last_sent_ms         INTEGER,
    PRIMARY KEY (rule, fingerprint)
) STRICT;

--   from_state, to_state  inactive | pending | firing | resolved.
CREATE TABLE alert_history (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms       INTEGER NOT NULL,
    rule        TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    labels      TEXT NOT NULL,
    from_state  TEXT NOT NULL,
    to_state    TEXT NOT NULL,
    value       REAL NOT NULL
) STRICT;
CREATE INDEX alert_history_at ON alert_history (at_ms);
