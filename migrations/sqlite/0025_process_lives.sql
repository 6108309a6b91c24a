-- A process's identity once per lifetime, not per tick. A lifetime is one process (GPU,
-- pid) with one identity (workload, type, user, command, MIG instance): a pid reused by
-- another command, or a process that moves to another container, starts a new one.
-- process_samples keeps per tick only what changes (memory, SM / memory / encoder /
-- decoder utilization) and the lifetime's id.
--
--   ident     the identity as one value, computed by the database from the columns below
--             (SQLite: json_array(workload_id, process_type, user_name, command, mig_uuid),
--             which tells NULL from ''), so that writers on any collector find the same row.
--   first_ms  the first tick stored of the lifetime.
CREATE TABLE process_lives (
    id           INTEGER PRIMARY KEY,
    gpu_id       INTEGER NOT NULL, -- gpus.id
    pid          INTEGER NOT NULL,
    ident        TEXT    NOT NULL,
    workload_id  INTEGER NOT NULL, -- workloads.id
    -- 1 compute, 2 graphics, 3 compute + graphics (the proto ProcessType numbers).
    process_type INTEGER NOT NULL,
    user_name    TEXT,
    command      TEXT,
    mig_uuid     TEXT,
    first_ms     INTEGER NOT NULL,
    UNIQUE (gpu_id, pid, ident)
) STRICT;

INSERT INTO process_lives (gpu_id, pid, ident, workload_id, process_type, user_name, command,
                           mig_uuid, first_ms)
SELECT gpu_id, pid, json_array(workload_id, process_type, user_name, command, mig_uuid),
       workload_id, process_type, user_name, command, mig_uuid, min(ts_ms)
FROM process_samples
GROUP BY gpu_id, pid, workload_id, process_type, user_name, command, mig_uuid;

-- One row per process per GPU per tick: what changes, and the lifetime it belongs to.
CREATE TABLE process_ticks (
    gpu_id        INTEGER NOT NULL, -- gpus.id
    ts_ms         INTEGER NOT NULL,
    pid           INTEGER NOT NULL,
    life_id       INTEGER NOT NULL, -- process_lives.id
    gpu_mem_bytes INTEGER,
    sm_util_pct   INTEGER,
    mem_util_pct  INTEGER,
    enc_util_pct  INTEGER,
    dec_util_pct  INTEGER,
    PRIMARY KEY (gpu_id, ts_ms, pid)
) STRICT, WITHOUT ROWID;

INSERT INTO process_ticks (gpu_id, ts_ms, pid, life_id, gpu_mem_bytes, sm_util_pct,
                           mem_util_pct, enc_util_pct, dec_util_pct)
SELECT p.gpu_id, p.ts_ms, p.pid, l.id, p.gpu_mem_bytes, p.sm_util_pct, p.mem_util_pct,
       p.enc_util_pct, p.dec_util_pct
FROM process_samples p
JOIN process_lives l ON l.gpu_id = p.gpu_id AND l.pid = p.pid
 AND l.ident = json_array(p.workload_id, p.process_type, p.user_name, p.command, p.mig_uuid);

DROP TABLE process_samples;
ALTER TABLE process_ticks RENAME TO process_samples;
