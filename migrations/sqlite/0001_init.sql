-- gpufleet SQLite schema, version 1.
--
-- Conventions
-- - Integer units named in the column: _mw milliwatts, _mj millijoules, _bytes, _bps bytes per
--   second, _mhz, _c degrees Celsius, _pct percent 0..100, _ms Unix milliseconds (UTC), _us µs.
-- - NULL means "the agent could not measure it" (NVML NOT_SUPPORTED, a missing /proc file).
--   It is never replaced by 0.
-- - Unsigned 64-bit values are stored as the signed 64-bit integer with the same bits (values
--   above 2^63 read back as negative in raw SQL; the store converts them back losslessly).
-- - Sample tables are WITHOUT ROWID with their natural key as PRIMARY KEY: one B-tree in key
--   order, no hidden rowid, and a replayed batch (INSERT OR IGNORE, i.e. ON CONFLICT DO
--   NOTHING) is a no-op. They declare no FOREIGN KEY: their ids are issued by the store itself, and a parent
--   lookup per inserted row would be a measurable share of the ingest path.
-- - Tables are STRICT: a value of the wrong type is an error, not a silent conversion.

-- One row per agent node, keyed by the name it registered under.
CREATE TABLE nodes (
    id                    INTEGER PRIMARY KEY,
    name                  TEXT    NOT NULL UNIQUE,
    -- JSON object of the agent's labels (rack, site, region ...).
    labels                TEXT    NOT NULL DEFAULT '{}',
    agent_version         TEXT    NOT NULL DEFAULT '',
    -- Changes on every reboot of the node (energy counters restart with it).
    boot_id               TEXT    NOT NULL DEFAULT '',
    -- What produced the samples: "nvml", "simulator".
    source                TEXT    NOT NULL DEFAULT '',
    interval_ms           INTEGER NOT NULL DEFAULT 0,
    -- Collector clock at the first and at the latest Hello.
    first_seen_ms         INTEGER NOT NULL,
    last_hello_ms         INTEGER NOT NULL,
    -- Newest tick time stored for this node (agent clock); NULL before the first sample.
    -- Status (online / stale / offline) is derived from it, capped at "now".
    last_seen_ms          INTEGER,
    -- Highest batch seq committed for this node (a maximum, not a contiguous watermark).
    last_acked_seq        INTEGER NOT NULL DEFAULT 0,
    -- Delivery stats as of the highest-seq batch committed.
    dropped_samples       INTEGER NOT NULL DEFAULT 0,
    spool_backlog_batches INTEGER NOT NULL DEFAULT 0,
    spool_backlog_bytes   INTEGER NOT NULL DEFAULT 0,
    -- GPU samples stored for this node, maintained in the inserting transaction so the API
    -- never counts rows.
    stored_samples        INTEGER NOT NULL DEFAULT 0,
    -- Inventory, from the latest Hello.
    driver_version        TEXT,
    cuda_driver_version   TEXT,
    nvml_version          TEXT,
    hostname              TEXT    NOT NULL DEFAULT '',
    kernel                TEXT,
    os                    TEXT,
    cpu_count             INTEGER,
    memory_total_bytes    INTEGER
) STRICT;

-- One row per physical GPU, keyed by UUID; node_id is the node that last declared it.
CREATE TABLE gpus (
    id                      INTEGER PRIMARY KEY,
    node_id                 INTEGER NOT NULL REFERENCES nodes (id),
    uuid                    TEXT    NOT NULL UNIQUE,
    gpu_index               INTEGER NOT NULL,
    name                    TEXT    NOT NULL,
    serial                  TEXT,
    pci_bus_id              TEXT,
    architecture            TEXT,
    brand                   TEXT,
    memory_total_bytes      INTEGER,
    power_limit_default_mw  INTEGER,
    power_limit_enforced_mw INTEGER,
    power_limit_min_mw      INTEGER,
    power_limit_max_mw      INTEGER,
    max_clock_sm_mhz        INTEGER,
    max_clock_mem_mhz       INTEGER,
    max_clock_graphics_mhz  INTEGER,
    nvlink_count            INTEGER,
    mig_enabled             INTEGER, -- 0 / 1
    compute_mode            TEXT,
    persistence_mode        INTEGER, -- 0 / 1
    cuda_capability_major   INTEGER,
    cuda_capability_minor   INTEGER,
    pcie_link_gen_max       INTEGER,
    pcie_link_width_max     INTEGER,
    vbios_version           TEXT,
    -- JSON array of MIG instances ({uuid, gpu_instance_id, compute_instance_id, ...}).
    mig_instances           TEXT    NOT NULL DEFAULT '[]',
    first_seen_ms           INTEGER NOT NULL
) STRICT;

CREATE INDEX gpus_by_node ON gpus (node_id);

-- One row per GPU per tick: the hot table (target <= 120 bytes per row on disk).
CREATE TABLE gpu_samples (
    gpu_id                   INTEGER NOT NULL, -- gpus.id
    ts_ms                    INTEGER NOT NULL,
    util_gpu_pct             INTEGER,
    util_mem_pct             INTEGER,
    mem_used_bytes           INTEGER,
    mem_total_bytes          INTEGER,
    mem_reserved_bytes       INTEGER,
    power_mw                 INTEGER,
    power_instant_mw         INTEGER,
    power_limit_mw           INTEGER,
    energy_mj                INTEGER,
    temp_gpu_c               INTEGER,
    temp_mem_c               INTEGER,
    fan_pct                  INTEGER,
    clock_sm_mhz             INTEGER,
    clock_mem_mhz            INTEGER,
    clock_graphics_mhz       INTEGER,
    pstate                   INTEGER,
    pcie_tx_bps              INTEGER,
    pcie_rx_bps              INTEGER,
    nvlink_tx_bps            INTEGER,
    nvlink_rx_bps            INTEGER,
    -- Per-link NVLink throughput, NULL when the GPU reported no links. Compact encoding: per
    -- link, LEB128 varints `link << 2 | has_tx | has_rx << 1`, then tx_bps and/or rx_bps when
    -- present (gpufleet_collector::store::encode_nvlinks).
    nvlinks                  BLOB,
    ecc_corrected_volatile   INTEGER,
    ecc_uncorrected_volatile INTEGER,
    throttle_reasons         INTEGER, -- NVML clock event reason bit mask
    enc_util_pct             INTEGER,
    dec_util_pct             INTEGER,
    PRIMARY KEY (gpu_id, ts_ms)
) STRICT, WITHOUT ROWID;

-- Who a process belongs to (container, Slurm job, host user / unit), deduplicated by key.
CREATE TABLE workloads (
    id             INTEGER PRIMARY KEY,
    -- Workload::key(): container:<id>, slurm:<job>, host:<unit> or host:uid-<uid>.
    key            TEXT    NOT NULL UNIQUE,
    kind           TEXT    NOT NULL, -- host, container, slurm
    runtime        TEXT    NOT NULL DEFAULT '',
    container_id   TEXT,
    pod_uid        TEXT,
    qos            TEXT,
    job_id         TEXT,
    step           TEXT,
    unit           TEXT,
    uid            INTEGER,
    -- Names, when the runtime was reachable; filled in when a later sample knows them.
    container_name TEXT,
    image          TEXT,
    pod_name       TEXT,
    namespace      TEXT,
    first_seen_ms  INTEGER NOT NULL
) STRICT;

-- One row per process per GPU per tick.
CREATE TABLE process_samples (
    gpu_id        INTEGER NOT NULL, -- gpus.id
    ts_ms         INTEGER NOT NULL,
    pid           INTEGER NOT NULL,
    workload_id   INTEGER NOT NULL, -- workloads.id
    -- 1 compute, 2 graphics, 3 compute + graphics (the proto ProcessType numbers).
    process_type  INTEGER NOT NULL,
    user_name     TEXT,
    command       TEXT,
    gpu_mem_bytes INTEGER,
    sm_util_pct   INTEGER,
    mem_util_pct  INTEGER,
    enc_util_pct  INTEGER,
    dec_util_pct  INTEGER,
    mig_uuid      TEXT,
    PRIMARY KEY (gpu_id, ts_ms, pid)
) STRICT, WITHOUT ROWID;

-- One row per node per tick that carried host metrics or the sampler's cost.
CREATE TABLE host_samples (
    node_id            INTEGER NOT NULL, -- nodes.id
    ts_ms              INTEGER NOT NULL,
    cpu_util_pct       REAL,
    mem_used_bytes     INTEGER,
    mem_total_bytes    INTEGER,
    disk_read_bps      INTEGER,
    disk_write_bps     INTEGER,
    net_rx_bps         INTEGER,
    net_tx_bps         INTEGER,
    load1              REAL,
    -- What sampling this tick cost the agent.
    cost_cpu_us        INTEGER,
    cost_wall_us       INTEGER,
    cost_source_us     INTEGER,
    cost_slowest_calls TEXT, -- JSON object: call name -> µs; NULL when empty
    PRIMARY KEY (node_id, ts_ms)
) STRICT, WITHOUT ROWID;

-- Xid errors, ECC, GPU lost / recovered, throttling, spool drops.
CREATE TABLE events (
    id      INTEGER PRIMARY KEY,
    node_id INTEGER NOT NULL REFERENCES nodes (id),
    ts_ms   INTEGER NOT NULL,
    gpu_id  INTEGER REFERENCES gpus (id), -- NULL for node-level events
    kind    TEXT    NOT NULL,             -- xid, ecc_double_bit, gpu_lost ...
    code    INTEGER,                      -- Xid number for Xid events
    detail  TEXT    NOT NULL DEFAULT ''
) STRICT;

-- An event is stored once however often its batch is replayed. NULLs are distinct in a
-- UNIQUE index, hence the ifnull() for node-level events and events without a code.
CREATE UNIQUE INDEX events_once ON events (node_id, ts_ms, ifnull(gpu_id, 0), kind, ifnull(code, -1));
CREATE INDEX events_by_time ON events (ts_ms);
