//! Bytes on disk per GPU-week, through the real store: writes simulated ticks (the
//! simulator's GPU and host values, two processes per GPU, the agent's sampler cost on
//! every host row) with `IngestWrites::write_batches`, as the collector's group commit
//! would, then measures what the database holds. A benchmark, not a test (BENCHMARKS.md):
//!
//! ```text
//! cargo run --release -p gpufleet-collector --example storage_bytes -- week sqlite
//! cargo run --release -p gpufleet-collector --example storage_bytes -- week postgres
//! cargo run --release -p gpufleet-collector --example storage_bytes -- fleet-hour sqlite
//! cargo run --release -p gpufleet-collector --example storage_bytes -- file gpufleet.db [packed.db]
//! ```
//!
//! `file DB [PACKED]`: a SQLite database a running collector wrote (from real agents, say),
//! left alone: a copy of it (kept at `PACKED` if given) is measured, packed as below and
//! measured again, and the bytes of its packed values are given per row they hold, to
//! set real GPUs' values beside the simulator's.
//!
//! `week`: 1 node, 1 GPU, one tick a second for 7 days (604,800 ticks), 60 ticks per batch,
//! one batch per write. `fleet-hour`: 125 nodes × 8 GPUs for one hour, 10 ticks per batch,
//! one batch of every node per write. SQLite: a temporary file, checkpointed and vacuumed,
//! then its size and `dbstat` per table. PostgreSQL (`GPUFLEET_TEST_PG_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`): a schema of its own (dropped afterwards
//! unless `KEEP=1`, which keeps it to look into and prints its name),
//! `pg_total_relation_size` of every table in it (heap, indexes, TOAST), partitions counted
//! under their parent. Knobs (environment): `DAYS` (7, `week`), `NODES` (125) and `GPUS`
//! (8, `fleet-hour`), `MODEL` (every node this simulator model, e.g. `h100-sxm` with GPM;
//! drawn per node by default), `GPM_EVERY` (5: seconds between GPM readings, carried
//! between as the agent does; 0 drops GPM), `PROCS` per GPU (2), `HOST_EVERY` (1: host metrics on every tick, as
//! the simulator gives them; 5 is what the agent sends at 1 s ticks by default,
//! `--host-interval 5s`; the sampler cost is on every tick either way), `DB` (SQLite: a new
//! file to write and keep, instead of a temporary one), `STEADY` (1: run the collector's
//! background jobs while writing, as a running collector does: accounting, rollups and
//! packing every simulated 10 minutes, and on PostgreSQL a `VACUUM` of the schema's tables
//! after each of those runs, standing in for autovacuum: a packing pass deletes more than
//! the 20 % of a partition's live rows past which autovacuum runs within its one-minute
//! naptime; the first measurement is then the database a running collector holds at the
//! end of the week, not the rows alone), `VACUUM_EVERY` (simulated minutes between those
//! `VACUUM`s, a multiple of 10: 10 by default; 60 was the default before), `PACK_AFTER_S`
//! (seconds: how old a closed minute must be to be packed; 0, the default, takes the
//! collector's `pack_after`), `CATCH_UP` (1: the ticks arrive late, as from a spool emptied
//! after an outage, so their process ticks are packed as they arrive; by default each
//! batch arrives live, when its last tick is taken).
//!
//! Then it runs the collector's background jobs over what it wrote, two hours after the
//! last tick (`Accountant::pass`, `Rollups::pass`, then `Rollups::pack`: the store packs
//! every closed minute of host rows, process ticks and GPU samples into
//! `packed_host_minutes`, `packed_process_minutes` and `packed_gpu_minutes` and merges
//! every closed hour of them into one value, every closed hour of rollup minutes into `packed_gpu_rollup_hours` and `packed_host_rollup_hours`,
//! and every closed hour of GPU health readings into `packed_gpu_health_hours`), checks
//! that every GPU sample, host row, process sample, health reading and rollup minute reads
//! back as it did before, and measures again: the database as the
//! collector keeps it, energy and rollup minutes included. Last, it times one GPU's charts as the series API reads them (15 minutes of
//! raw samples, packed and newest; the whole range from the rollups).

use anyhow::{Context, Result, bail};
use gpufleet_collector::accounting::accountant::{Accountant, EnergyOptions};
use gpufleet_collector::accounting::rollups::{RetentionOptions, Rollups};
use gpufleet_collector::live::status::Clock;
use gpufleet_collector::store::rollup::RollupKey;
use gpufleet_collector::store::{self, GpuMetric, NodeBatch, NodeKeys, Store, TimeRange};
use gpufleet_core::wire::HelloInfo;
use gpufleet_core::{
    Batch, DeliveryStats, GpmMetrics, GpuSource, ProcessSample, ProcessType, SamplerCost, Tick,
    Workload, WorkloadKind,
};
use gpufleet_sim::{SimOptions, Simulator};
use sqlx::Connection;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

/// 2026-11-01T00:00:00Z: a fixed start, so every run writes the same rows.
const START_MS: i64 = 1_793_491_200_000;
/// How long a simulated job (and so its processes' identities) lives.
const JOB_MS: i64 = 6 * 3_600_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (shape, backend) = match args.as_slice() {
        [s, path] if s == "file" => return existing(path.as_ref(), None).await,
        [s, path, keep] if s == "file" => {
            return existing(path.as_ref(), Some(keep.as_ref())).await;
        }
        [s, b] => (s.as_str(), b.as_str()),
        _ => bail!("usage: storage_bytes week|fleet-hour sqlite|postgres, or file DB [PACKED]"),
    };
    let procs = knob("PROCS", 2);
    let host_every = knob("HOST_EVERY", 1).max(1);
    let steady = knob("STEADY", 0) == 1;
    let (nodes, gpus, ticks, per_batch) = match shape {
        "week" => (1, 1, knob("DAYS", 7) * 86_400, 60),
        "fleet-hour" => (knob("NODES", 125), knob("GPUS", 8), 3_600, 10),
        _ => bail!("unknown shape {shape:?}: week or fleet-hour"),
    };
    let gpu_samples = u64::from(nodes * gpus * ticks);
    println!(
        "{shape} on {backend}: {nodes} node(s) × {gpus} GPU(s) × {ticks} ticks, \
         {procs} processes per GPU"
    );
    match backend {
        "sqlite" => {
            let dir = tempfile::tempdir()?;
            // `DB=PATH` keeps the database there, to look into afterwards.
            let path = match std::env::var_os("DB").filter(|p| !p.is_empty()) {
                Some(p) => std::path::PathBuf::from(p),
                None => dir.path().join("bytes.db"),
            };
            if path.exists() {
                bail!("{} exists: DB names a new file", path.display());
            }
            let url = format!("sqlite://{}", path.display());
            let store = store::open(&url).await?;
            let jobs = steady.then_some(Jobs {
                vacuum: None,
                vacuum_every_s: 0,
            });
            let keys = write(
                &store, nodes, gpus, ticks, per_batch, procs, host_every, jobs,
            )
            .await?;
            report(&sqlite_sizes(&url, &path).await?, gpu_samples, shape);
            pack_as_the_collector(&store, &keys, ticks).await?;
            println!("as the collector keeps it (closed minutes packed):");
            report(&sqlite_sizes(&url, &path).await?, gpu_samples, shape);
            store.close().await;
        }
        "postgres" => {
            let base = std::env::var("GPUFLEET_TEST_PG_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            let schema = format!("bytes_bench_{}", std::process::id());
            let mut admin = sqlx::PgConnection::connect(&base).await?;
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                .execute(&mut admin)
                .await?;
            let sep = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{sep}options=-c%20search_path%3D{schema}");
            let result = async {
                let store = store::open(&url).await?;
                let jobs = steady.then(|| Jobs {
                    vacuum: Some(url.clone()),
                    vacuum_every_s: knob("VACUUM_EVERY", 10).max(10) * 60,
                });
                let keys = write(
                    &store, nodes, gpus, ticks, per_batch, procs, host_every, jobs,
                )
                .await?;
                report(&pg_sizes(&url).await?, gpu_samples, shape);
                pack_as_the_collector(&store, &keys, ticks).await?;
                println!("as the collector keeps it (closed minutes packed):");
                report(&pg_sizes(&url).await?, gpu_samples, shape);
                store.close().await;
                anyhow::Ok(())
            }
            .await;
            if knob("KEEP", 0) == 1 {
                println!("kept: schema {schema}");
            } else {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
                    .execute(&mut admin)
                    .await?;
            }
            result?;
        }
        _ => bail!("unknown backend {backend:?}: sqlite or postgres"),
    }
    Ok(())
}

fn knob(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A running collector's background jobs, run while the ticks are written (`STEADY=1`).
struct Jobs {
    /// PostgreSQL: where to `VACUUM` the schema's tables (every `VACUUM_EVERY` simulated
    /// minutes), as autovacuum would (so the space of packed rows is reused, not only left
    /// dead).
    vacuum: Option<String>,
    /// Simulated seconds between those `VACUUM`s.
    vacuum_every_s: u32,
}

impl Jobs {
    /// Accounting, rollups and packing as of `now_ms`; the `VACUUM` too if `vacuum`.
    async fn run(&self, store: &Arc<dyn Store>, now_ms: i64, vacuum: bool) -> Result<()> {
        account_and_roll_up(store, now_ms)
            .await?
            .pack(now_ms)
            .await?;
        if let Some(url) = &self.vacuum
            && vacuum
        {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            // Tables and partitioned parents (a parent's VACUUM covers its partitions).
            let tables: Vec<String> = sqlx::query_scalar(
                "SELECT format('%I', c.relname) FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') \
                   AND NOT c.relispartition",
            )
            .fetch_all(&mut conn)
            .await?;
            if !tables.is_empty() {
                let vacuum = format!("VACUUM {}", tables.join(", "));
                sqlx::raw_sql(sqlx::AssertSqlSafe(vacuum))
                    .execute(&mut conn)
                    .await?;
            }
            conn.close().await?;
        }
        Ok(())
    }
}

/// The collector's energy and rollup passes as of `now_ms`; returns the rollup task, to
/// pack with (no packing budget: everything closed is packed at once).
async fn account_and_roll_up(store: &Arc<dyn Store>, now_ms: i64) -> Result<Rollups> {
    let clock: Clock = Arc::new(move || now_ms);
    Accountant::new(store.clone(), EnergyOptions::default(), clock.clone())
        .pass()
        .await?;
    let defaults = RetentionOptions::default();
    let pack_after = u64::from(knob("PACK_AFTER_S", 0));
    let options = RetentionOptions {
        pack_budget: usize::MAX,
        pack_after: match pack_after {
            0 => defaults.pack_after,
            s => std::time::Duration::from_secs(s),
        },
        ..defaults
    };
    let mut rollups = Rollups::new(store.clone(), options, clock);
    rollups.pass().await?;
    Ok(rollups)
}

/// `file DB`: what a running collector wrote (a SQLite file, from real agents say), packed.
/// A copy is measured, accounted, rolled up and packed two hours after its newest tick, as
/// the collector would; every value must read back as before. Reports the bytes of the
/// packed values per row they hold. The packed copy is kept at `keep`
/// if given (a new file), to look into or check afterwards.
async fn existing(path: &std::path::Path, keep: Option<&std::path::Path>) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let copy = keep.map_or_else(|| dir.path().join("copy.db"), std::path::Path::to_path_buf);
    if copy.exists() {
        bail!("{} exists: PACKED names a new file", copy.display());
    }
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=ro", path.display()))
        .await
        .with_context(|| format!("open {}", path.display()))?;
    sqlx::query("VACUUM INTO ?")
        .bind(copy.display().to_string())
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    let url = format!("sqlite://{}", copy.display());
    let store = store::open(&url).await?;
    let nodes = store.nodes().await?;
    let gpu_samples: u64 = nodes.iter().map(|n| n.stored_samples).sum();
    let (Some(from_ms), Some(to_ms)) = (
        nodes.iter().map(|n| n.first_seen_ms).min(),
        nodes.iter().filter_map(|n| n.last_seen_ms).max(),
    ) else {
        bail!("{}: no node has a sample", path.display());
    };
    println!(
        "{}: {} node(s), {} GPU(s), {gpu_samples} GPU samples",
        path.display(),
        nodes.len(),
        nodes.iter().map(|n| n.gpus.len()).sum::<usize>()
    );
    report(&sqlite_sizes(&url, &copy).await?, gpu_samples, "file");
    let keys: Vec<Arc<NodeKeys>> = nodes.iter().map(|n| Arc::new(n.keys())).collect();
    // From an hour before the first Hello (agent clocks may lag the collector's).
    let all = TimeRange {
        from_ms: from_ms - 3_600_000,
        to_ms: to_ms + 1000,
    };
    pack_and_check(&store, &keys, all).await?;
    println!("as the collector keeps it (closed minutes packed):");
    report(&sqlite_sizes(&url, &copy).await?, gpu_samples, "file");
    // What the packed values hold: every row read back that is not a raw row (the
    // collector may have packed some before the copy was made).
    let read = read_counts(&store, &keys, all).await?;
    let raw = raw_row_counts(&url).await?;
    let mut conn = sqlx::SqliteConnection::connect(&url).await?;
    for ((table, raw), read) in raw.iter().zip(read) {
        let packed = format!("packed_{}_minutes", table.trim_end_matches("_samples"));
        let (values, bytes): (i64, Option<i64>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT count(*), sum(length(packed)) FROM {packed}"
        )))
        .fetch_one(&mut conn)
        .await?;
        let (bytes, held) = (bytes.unwrap_or(0), read - raw);
        println!(
            "  {packed:<24} {values:>6} values, {bytes:>10} bytes, holding {held} of {read} \
             rows: {:.1} B per row",
            bytes as f64 / held.max(1) as f64
        );
    }
    conn.close().await?;
    store.close().await;
    Ok(())
}

/// GPU samples, process samples and host rows read back in `all` (raw and packed), in
/// that order.
async fn read_counts(
    store: &Arc<dyn Store>,
    keys: &[Arc<NodeKeys>],
    all: TimeRange,
) -> Result<[i64; 3]> {
    let mut n = [0usize; 3];
    for k in keys {
        n[2] += store.host_samples(k.id, all, usize::MAX).await?.len();
        for gpu in k.gpus.values() {
            n[0] += store.gpu_samples(*gpu, all, usize::MAX).await?.len();
            n[1] += store.process_samples(*gpu, all, usize::MAX).await?.len();
        }
    }
    Ok(n.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
}

/// Rows in the raw GPU, process and host tables, in that order.
async fn raw_row_counts(url: &str) -> Result<Vec<(&'static str, i64)>> {
    let mut conn = sqlx::SqliteConnection::connect(url).await?;
    let mut out = Vec::new();
    for table in ["gpu_samples", "process_samples", "host_samples"] {
        let n: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&mut conn)
                .await?;
        out.push((table, n));
    }
    conn.close().await?;
    Ok(out)
}

/// Registers the nodes and writes `ticks` ticks of each, `per_batch` ticks per batch, one
/// batch of every node per write, running `jobs` every simulated 10 minutes; returns the
/// nodes' keys.
#[allow(clippy::too_many_arguments)]
async fn write(
    store: &Arc<dyn Store>,
    nodes: u32,
    gpus: u32,
    ticks: u32,
    per_batch: u32,
    procs: u32,
    host_every: u32,
    jobs: Option<Jobs>,
) -> Result<Vec<Arc<NodeKeys>>> {
    let mut sims = Vec::new();
    for n in 0..nodes {
        let name = format!("node-{n:04}");
        let mut opts = SimOptions::new(name.clone(), gpus);
        // `MODEL=h100-sxm`: every node that model (GPM included), else drawn per node.
        opts.scenario.model = std::env::var("MODEL").ok();
        let mut sim = Simulator::new(opts)?;
        let inventory = sim.inventory()?;
        let hello = HelloInfo {
            node: name.clone(),
            agent_version: "bench".into(),
            boot_id: "boot-1".into(),
            labels: BTreeMap::new(),
            interval_ms: 1000,
            source: "simulator".into(),
        };
        let record = store.register_node(&hello, &inventory, START_MS).await?;
        sims.push((sim, Arc::new(record.keys())));
    }
    // The store's clock is the simulation's: each batch arrives as its last tick is taken,
    // so every tick is written as a row, as a running collector writes live agents'.
    // `CATCH_UP=1` leaves the wall clock: the whole range arrives late, as a spool emptied
    // after an outage, and its process ticks are packed as they arrive.
    let sim_now = Arc::new(AtomicI64::new(START_MS));
    if knob("CATCH_UP", 0) == 0 {
        let now = Arc::clone(&sim_now);
        store.set_arrival_clock(Some(Arc::new(move || now.load(Ordering::Relaxed))));
    }
    let began = Instant::now();
    let (mut seq, mut written, mut in_jobs) = (0u64, 0u32, 0.0);
    let mut gpm_held: Vec<HashMap<String, GpmMetrics>> = vec![HashMap::new(); sims.len()];
    while written < ticks {
        let n = per_batch.min(ticks - written);
        seq += 1;
        let mut batches = Vec::with_capacity(sims.len());
        for ((sim, keys), held) in sims.iter_mut().zip(&mut gpm_held) {
            let ticks = (written..written + n)
                .map(|k| {
                    let mut t = tick(
                        sim,
                        START_MS + i64::from(k) * 1000,
                        procs,
                        k % host_every == 0,
                    )?;
                    hold_gpm(&mut t, held, k);
                    Ok(t)
                })
                .collect::<Result<Vec<Tick>>>()?;
            batches.push(NodeBatch {
                keys: Arc::clone(keys),
                batch: Batch {
                    seq,
                    ticks,
                    delivery: DeliveryStats::default(),
                },
            });
        }
        sim_now.store(START_MS + i64::from(written + n) * 1000, Ordering::Relaxed);
        let outcome = store.write_batches(&batches).await?;
        if !outcome.conflicts.is_empty() {
            bail!("conflicts: {:?}", outcome.conflicts);
        }
        written += n;
        // Every simulated 10 minutes (whatever the batch size).
        if let Some(jobs) = &jobs
            && (written - n) / 600 != written / 600
        {
            let started = Instant::now();
            let every = jobs.vacuum_every_s.max(1);
            let vacuum = (written - n) / every != written / every;
            jobs.run(store, START_MS + i64::from(written) * 1000, vacuum)
                .await?;
            in_jobs += started.elapsed().as_secs_f64();
        }
    }
    let secs = began.elapsed().as_secs_f64() - in_jobs;
    let also = if jobs.is_some() {
        format!(" (and ran the collector's jobs for {in_jobs:.1} s)")
    } else {
        String::new()
    };
    println!(
        "wrote {} GPU samples in {secs:.1} s{also}",
        u64::from(nodes * gpus * ticks)
    );
    Ok(sims.into_iter().map(|(_, keys)| keys).collect())
}

/// The collector's background jobs over the written ticks ([`pack_and_check`]), then one
/// GPU's charts timed.
async fn pack_as_the_collector(
    store: &Arc<dyn Store>,
    keys: &[Arc<NodeKeys>],
    ticks: u32,
) -> Result<()> {
    let all = TimeRange {
        from_ms: START_MS,
        to_ms: START_MS + i64::from(ticks) * 1000,
    };
    pack_and_check(store, keys, all).await?;
    charts(store, keys, all).await
}

/// The collector's background jobs over every node's data in `all`, two hours after its
/// end: every closed minute energy-accounted and rolled up, then every closed minute
/// packed; every host row, GPU sample, process sample, health reading and rollup minute
/// must read back as it did before.
async fn pack_and_check(
    store: &Arc<dyn Store>,
    keys: &[Arc<NodeKeys>],
    all: TimeRange,
) -> Result<()> {
    let before = raw_answers(store, keys, all).await?;
    let began = Instant::now();
    let now = all.to_ms + 2 * 3_600_000;
    let mut rollups = account_and_roll_up(store, now).await?;
    let accounted = began.elapsed().as_secs_f64();
    let rollups_before = rollup_answers(store, keys, all).await?;
    let began = Instant::now();
    let out = rollups.pack(now).await?;
    println!(
        "accounted and rolled up in {accounted:.1} s; packed {} minutes ({} rows), merged \
         {} hours of them, {} rollup minutes and {} health readings in {:.1} s",
        out.minutes,
        out.rows,
        out.hours,
        out.rollup_minutes,
        out.health_readings,
        began.elapsed().as_secs_f64()
    );
    if raw_answers(store, keys, all).await? != before {
        bail!("the samples read back differ once packed");
    }
    if rollup_answers(store, keys, all).await? != rollups_before {
        bail!("the rollup minutes read back differ once packed");
    }
    println!(
        "every host row, GPU sample, process sample, health reading and rollup minute reads \
         back as before"
    );
    Ok(())
}

/// Times what a GPU's charts read, as the series API reads it (the store's answer, without
/// HTTP): a 15-minute raw chart of packed minutes (a day in) and of the newest 15 minutes,
/// and a chart of the whole range from the rollups (10-minute steps); 20 runs each of
/// every GPU metric, median and max per chart.
async fn charts(store: &Arc<dyn Store>, keys: &[Arc<NodeKeys>], all: TimeRange) -> Result<()> {
    let Some(gpu) = keys.first().and_then(|k| k.gpus.values().next()).copied() else {
        return Ok(());
    };
    let quarter = 15 * 60_000;
    let day_in = all.from_ms + 86_400_000.min((all.to_ms - all.from_ms) / 2);
    // (what, range, rollup step: `None` for raw samples)
    let charts = [
        (
            "15-minute raw chart, packed minutes",
            day_in,
            day_in + quarter,
            None,
        ),
        (
            "15-minute raw chart, the newest",
            all.to_ms - quarter,
            all.to_ms,
            None,
        ),
        (
            "the whole range from the rollups",
            all.from_ms,
            all.to_ms,
            Some(600_000),
        ),
    ];
    for (what, from_ms, to_ms, step) in charts {
        let range = TimeRange { from_ms, to_ms };
        let mut ms = Vec::new();
        for _ in 0..20 {
            let began = Instant::now();
            for metric in GpuMetric::ALL {
                match step {
                    None => store.gpu_series(gpu, metric, range, None, 11_000).await?,
                    Some(step) => {
                        (store.gpu_rollup_series(gpu, metric, range, step, 11_000)).await?
                    }
                };
            }
            ms.push(began.elapsed().as_secs_f64() * 1e3);
        }
        report_ms(what, ms);
    }
    Ok(())
}

fn report_ms(what: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let n = GpuMetric::ALL.len();
    println!(
        "{what}, all {n} metrics: median {:.1} ms, max {:.1} ms ({:.2} ms per metric)",
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        ms[ms.len() / 2] / n as f64
    );
}

/// Every node's host rows and every GPU's samples, process samples and health readings in
/// `all`, as read.
async fn raw_answers(
    store: &Arc<dyn Store>,
    keys: &[Arc<NodeKeys>],
    all: TimeRange,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for k in keys {
        out.push(format!(
            "{:?}",
            store.host_samples(k.id, all, usize::MAX).await?
        ));
        for gpu in k.gpus.values() {
            let s = store.gpu_samples(*gpu, all, usize::MAX).await?;
            let p = store.process_samples(*gpu, all, usize::MAX).await?;
            let h = store.gpu_health(*gpu, all, usize::MAX).await?;
            out.push(format!("{s:?}\n{p:?}\n{h:?}"));
        }
    }
    Ok(out)
}

/// Every GPU's and node's rollup minutes in `all`, as read.
async fn rollup_answers(
    store: &Arc<dyn Store>,
    keys: &[Arc<NodeKeys>],
    all: TimeRange,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for k in keys {
        let node = store.rollup_minutes(RollupKey::host(k.id), all).await?;
        out.push(format!("{node:?}"));
        for gpu in k.gpus.values() {
            let gpu = store.rollup_minutes(RollupKey::gpu(*gpu), all).await?;
            out.push(format!("{gpu:?}"));
        }
    }
    Ok(out)
}

/// GPM as the agent sends it: read every `GPM_EVERY` seconds (knob; the agent's default
/// `--gpm-every`) and carried by the ticks between (the simulator gives a fresh reading
/// every tick); `GPM_EVERY=0` drops GPM (a board's cost without it).
fn hold_gpm(t: &mut Tick, held: &mut HashMap<String, GpmMetrics>, k: u32) {
    let every = knob("GPM_EVERY", 5);
    for g in &mut t.gpus {
        if every == 0 {
            g.gpm = GpmMetrics::default();
        } else if k.is_multiple_of(every) {
            held.insert(g.gpu_uuid.clone(), g.gpm);
        } else if let Some(h) = held.get(&g.gpu_uuid) {
            g.gpm = *h;
        }
    }
}

/// One tick: the simulator's GPU samples and host metrics, `procs` processes per GPU
/// (a job of that many processes, replaced every [`JOB_MS`], sharing the GPU's
/// utilization and memory), and a sampler cost like the agent's; host metrics only if
/// `host`.
fn tick(sim: &mut Simulator, time_ms: i64, procs: u32, host: bool) -> Result<Tick> {
    let mut t = sim.sample(time_ms).context("simulate")?;
    if !host {
        t.host = None;
    }
    let job = (time_ms - START_MS) / JOB_MS;
    t.processes = t
        .gpus
        .iter()
        .enumerate()
        .flat_map(|(g, s)| {
            (0..procs).map(move |p| {
                let share = |v: Option<u64>| v.map(|v| v / u64::from(procs.max(1)));
                let container = format!("{:016x}{:048x}", job, g as u64 * 16 + u64::from(p));
                ProcessSample {
                    gpu_uuid: s.gpu_uuid.clone(),
                    pid: 100_000 + (job as u32 % 1000) * 100 + g as u32 * 10 + p,
                    process_type: ProcessType::Compute,
                    user: Some("alice".into()),
                    command: Some(format!("python train.py --config configs/run-{job}.yaml")),
                    gpu_mem_bytes: share(s.mem_used_bytes),
                    sm_util_pct: s.util_gpu_pct.map(|u| u / procs.max(1)),
                    mem_util_pct: s.util_mem_pct.map(|u| u / procs.max(1)),
                    enc_util_pct: None,
                    dec_util_pct: None,
                    workload: Workload {
                        kind: WorkloadKind::Container,
                        runtime: "containerd".into(),
                        container_id: Some(container),
                        pod_uid: Some(format!("{job:08x}-0000-4000-8000-{g:012x}")),
                        qos: Some("guaranteed".into()),
                        container_name: Some("trainer".into()),
                        image: Some("nvcr.io/nvidia/pytorch:24.05-py3".into()),
                        pod_name: Some(format!("train-{job}-worker-{g}")),
                        namespace: Some("research".into()),
                        ..Default::default()
                    },
                    mig_uuid: None,
                }
            })
        })
        .collect();
    let k = (time_ms / 1000) as u32;
    t.cost = Some(SamplerCost {
        cpu_us: Some(300 + k % 97),
        wall_us: Some(900 + k % 331),
        source_us: Some(500 + k % 211),
        slowest_calls_us: BTreeMap::from([
            ("nvmlDeviceGetFieldValues".into(), 120 + k % 37),
            ("nvmlDeviceGetProcessUtilization".into(), 80 + k % 23),
            ("nvmlDeviceGetComputeRunningProcesses".into(), 40 + k % 11),
        ]),
    });
    Ok(t)
}

/// Bytes per table (partitions under their parent) and the whole database.
struct Sizes {
    total: i64,
    tables: Vec<(String, i64)>,
}

async fn sqlite_sizes(url: &str, path: &std::path::Path) -> Result<Sizes> {
    let mut conn = sqlx::SqliteConnection::connect(url).await?;
    sqlx::raw_sql("PRAGMA wal_checkpoint(TRUNCATE); VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
        .execute(&mut conn)
        .await?;
    let tables: Vec<(String, i64)> = sqlx::query_as(
        "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat d \
         LEFT JOIN sqlite_schema m ON m.name = d.name \
         GROUP BY 1 ORDER BY 2 DESC",
    )
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    let total = i64::try_from(std::fs::metadata(path)?.len())?;
    Ok(Sizes { total, tables })
}

async fn pg_sizes(url: &str) -> Result<Sizes> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    sqlx::raw_sql("VACUUM").execute(&mut conn).await?;
    let tables: Vec<(String, i64)> = sqlx::query_as(
        "SELECT coalesce(p.relname, c.relname)::text, \
           sum(pg_total_relation_size(c.oid))::int8 \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         LEFT JOIN pg_inherits i ON i.inhrelid = c.oid \
         LEFT JOIN pg_class p ON p.oid = i.inhparent \
         WHERE n.nspname = current_schema() AND c.relkind = 'r' \
         GROUP BY 1 ORDER BY 2 DESC",
    )
    .fetch_all(&mut conn)
    .await?;
    let total = tables.iter().map(|(_, b)| b).sum();
    Ok(Sizes { total, tables })
}

fn report(sizes: &Sizes, gpu_samples: u64, shape: &str) {
    let per_sample = |b: i64| b as f64 / gpu_samples as f64;
    for (table, bytes) in sizes.tables.iter().filter(|(_, b)| *b > 0) {
        println!(
            "  {table:<24} {bytes:>14} bytes  {:>8.1} B / GPU-sample",
            per_sample(*bytes)
        );
    }
    let week = per_sample(sizes.total) * 604_800.0 / 1e6;
    println!(
        "total {} bytes = {:.1} B per GPU-sample = {week:.1} MB per GPU-week ({shape})",
        sizes.total,
        per_sample(sizes.total)
    );
}
