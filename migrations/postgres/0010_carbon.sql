-- Carbon accounting (issue 7): the same tables as migrations/sqlite/0010_carbon.sql
-- (see there for what each column means). Flags are boolean, figures double precision.

-- Intensities as the providers gave them. A forecast is replaced by the actual when the
-- provider later gives one; an actual is never replaced by a forecast.
CREATE TABLE carbon_intensity (
    provider      text             NOT NULL, -- static | csv | uk | electricitymaps
    region        text             NOT NULL,
    from_ms       bigint           NOT NULL, -- slot start, Unix ms (inclusive)
    to_ms         bigint           NOT NULL, -- slot end (exclusive)
    g_per_kwh     double precision NOT NULL,
    kind          text             NOT NULL, -- forecast | actual
    factor_type   text             NOT NULL, -- direct | lifecycle
    fetched_at_ms bigint           NOT NULL,
    estimated     boolean          NOT NULL, -- the provider marked it estimated
    PRIMARY KEY (provider, region, from_ms)
);

-- One row per energy_gpu_minutes row that has been priced.
CREATE TABLE carbon_gpu_minutes (
    gpu_id       bigint           NOT NULL, -- gpus.id
    minute_ms    bigint           NOT NULL, -- as energy_gpu_minutes
    energy_mj    bigint           NOT NULL, -- the energy priced
    g_per_kwh    double precision NOT NULL,
    pue          double precision NOT NULL,
    carbon_g     double precision NOT NULL, -- energy_mj / 3.6e9 x g_per_kwh x pue
    provider     text             NOT NULL,
    region       text             NOT NULL,
    kind         text             NOT NULL, -- forecast | actual
    factor_type  text             NOT NULL, -- direct | lifecycle
    estimated    boolean          NOT NULL, -- not the provider's figure for the slot
    basis        text             NOT NULL, -- slot | last_known | default
    priced_at_ms bigint           NOT NULL,
    PRIMARY KEY (gpu_id, minute_ms)
);

CREATE INDEX carbon_gpu_minutes_by_time ON carbon_gpu_minutes (minute_ms);
