-- Carbon accounting (issue 7): the intensity cache and the price of every GPU-minute.
--
-- Carbon of a GPU-minute = energy (kWh) x intensity (gCO2/kWh) of the slot holding the
-- minute, for the node's region x PUE. Each row records where its figures came from; a
-- workload's carbon is its energy_workload_minutes energy priced at its GPU-minute's
-- intensity and PUE (a join on gpu_id, minute_ms), so carbon splits exactly like energy.

-- Intensities as the providers gave them. A forecast is replaced by the actual when the
-- provider later gives one; an actual is never replaced by a forecast.
CREATE TABLE carbon_intensity (
    provider      TEXT    NOT NULL, -- static | csv | uk | electricitymaps
    region        TEXT    NOT NULL, -- UK region id / national, zone, or a configured name
    from_ms       INTEGER NOT NULL, -- slot start, Unix ms (inclusive)
    to_ms         INTEGER NOT NULL, -- slot end (exclusive)
    g_per_kwh     REAL    NOT NULL,
    kind          TEXT    NOT NULL, -- forecast | actual
    factor_type   TEXT    NOT NULL, -- direct | lifecycle
    fetched_at_ms INTEGER NOT NULL,
    estimated     INTEGER NOT NULL, -- 1: the provider marked it estimated
    PRIMARY KEY (provider, region, from_ms)
) STRICT, WITHOUT ROWID;

-- One row per energy_gpu_minutes row that has been priced.
CREATE TABLE carbon_gpu_minutes (
    gpu_id       INTEGER NOT NULL, -- gpus.id
    minute_ms    INTEGER NOT NULL, -- as energy_gpu_minutes
    energy_mj    INTEGER NOT NULL, -- the energy priced (a changed energy row is re-priced)
    g_per_kwh    REAL    NOT NULL, -- intensity used
    pue          REAL    NOT NULL, -- PUE applied
    carbon_g     REAL    NOT NULL, -- energy_mj / 3.6e9 x g_per_kwh x pue
    provider     TEXT    NOT NULL,
    region       TEXT    NOT NULL,
    kind         TEXT    NOT NULL, -- forecast | actual (of the intensity used)
    factor_type  TEXT    NOT NULL, -- direct | lifecycle
    estimated    INTEGER NOT NULL, -- 1: not the provider's figure for the slot
    basis        TEXT    NOT NULL, -- slot | last_known | default (the last two: provider unreachable)
    priced_at_ms INTEGER NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms)
) STRICT, WITHOUT ROWID;

CREATE INDEX carbon_gpu_minutes_by_time ON carbon_gpu_minutes (minute_ms);
