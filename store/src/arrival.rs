//! Packing on arrival: a write's GPU samples and process ticks for a minute the store's
//! clock has closed ([`PACK_ON_ARRIVAL_AFTER_MS`] after its end: a replay after an
//! outage, an agent emptying its spool) go straight into the minute's packed values
//! instead of the row tables. The open minutes of live agents stay rows.
//!
//! - [`super::packing::reopen_minutes`] *holds* such a minute's values (decoded, left
//!   packed, [`Held`]) instead of unpacking them into rows; [`pack_arriving`] adds the
//!   write's samples and ticks to them, or starts new ones. A sample or tick already
//!   stored (same time; same time and pid) stays as it was, as an insert would skip it.
//! - A closed minute that holds rows of a tier (written while it was open) takes that
//!   tier's data as rows, so a minute is in one form at a time per tier; so does a value
//!   that would be too large.
//! - What the row tables' readers would have recomputed is done here, in the same
//!   transaction: a GPU minute's rollup row is computed from all its samples (the same
//!   figures as the rollup task's SQL over rows, [`rollup_row`]), and the GPU's energy
//!   watermark goes back to a minute that gained samples behind it, so the accountant
//!   recomputes it (after a restart too). Energy, charts, followers and remote-write read
//!   both forms.

use super::backend::{Backend, Dialect, Get, Table, sql};
use super::held::Held;
use super::packed::{self, PackError, process::ProcessTick};
use super::packing::{Value, delete_value, insert_unpacked};
use super::rollup::kinds::{RollupKey, RollupKind, spec};
use super::rollup_hours;
use super::series;
use super::tiers::{Tier, corrupt};
use super::write::sent::Samples;
use super::{GpuId, GpuMetric, StoreError};
use gpufleet_core::times::{HOUR_MS, hour_of};
use gpufleet_core::times::{MINUTE_MS, minute_of};
use gpufleet_core::{GpuSample, UnixMs};
use std::borrow::{Borrow, Cow};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::OnceLock;

/// How long after its end a minute is closed to a write: its samples and process ticks
/// arriving later go straight into its packed values. Longer than a live agent's batches
/// take to arrive and than followers look back (30 s), so the live minutes stay rows.
pub const PACK_ON_ARRIVAL_AFTER_MS: i64 = 2 * MINUTE_MS;

/// A GPU minute packed on arrival: (GPU, minute, all its samples, oldest first; those
/// the write brought are borrowed from it).
type PackedMinute<'b> = (i64, UnixMs, Vec<(UnixMs, Cow<'b, GpuSample>)>);

/// A write's GPU sample for a closed minute: (node group, time, sample).
type Arriving<'b> = (usize, UnixMs, &'b GpuSample);

/// What [`pack_arriving`] did with a write's GPU samples.
#[derive(Debug, Default)]
pub(crate) struct Arrived {
    /// Samples new to the store, by the node group of [`super::write::GpuRow::group`].
    pub inserted: HashMap<usize, u64>,
    /// The samples whose key was stored already (replays, or conflicts): the stored
    /// sample, by (GPU, time).
    pub repeated: HashMap<(i64, UnixMs), GpuSample>,
}

impl Arrived {
    /// The GPUs some of whose samples were stored already.
    pub(crate) fn repeated_gpus(&self) -> HashSet<i64> {
        self.repeated.keys().map(|(gpu, _)| *gpu).collect()
    }
}

/// Packs what a write brings for closed minutes (ending at or before `closed_before`)
/// into the minutes' values (see the module docs), and takes it out of `samples`; the
/// rest is inserted as rows by the caller. `held` is what reopening held.
pub(crate) async fn pack_arriving<DB: Backend>(
    conn: &mut DB::Connection,
    samples: &mut Samples<'_>,
    mut held: Held,
    closed_before: UnixMs,
) -> Result<Arrived, StoreError> {
    let mut out = Arrived::default();
    let closed = |ts: UnixMs| minute_of(ts).saturating_add(MINUTE_MS) <= closed_before;
    // The ingest path: a live write brings nothing for a closed minute.
    if held.process.is_empty()
        && held.gpu.is_empty()
        && !samples.process.iter().any(|r| closed(r.ts))
        && !samples.gpu.iter().any(|r| closed(r.ts))
    {
        return Ok(out);
    }
    let with_rows = closed_minutes_with_rows::<DB>(conn, samples, &held, closed).await?;
    let mut process_values: Vec<(i64, Value)> = Vec::new();
    let mut gpu_values: Vec<(i64, Value)> = Vec::new();

    // Process ticks.
    let mut arriving: BTreeMap<(i64, UnixMs), Vec<ProcessTick>> = BTreeMap::new();
    samples.process.retain(|r| {
        let key = (r.gpu, minute_of(r.ts));
        if !closed(r.ts) || with_rows.contains(&(Tier::Process, key.0, key.1)) {
            return true;
        }
        arriving.entry(key).or_default().push(ProcessTick {
            ts_ms: r.ts,
            pid: r.p.pid,
            life_id: r.life,
            gpu_mem_bytes: r.p.gpu_mem_bytes,
            sm_util_pct: r.p.sm_util_pct,
            mem_util_pct: r.p.mem_util_pct,
            enc_util_pct: r.p.enc_util_pct,
            dec_util_pct: r.p.dec_util_pct,
        });
        false
    });
    let mut process_rows: Vec<(i64, ProcessTick)> = Vec::new();
    for ((gpu, minute), new) in arriving {
        let held_ticks = held
            .process
            .get(&(gpu, minute))
            .map_or(&[][..], |h| &h.items[..]);
        // Hashed per tick: foldhash, not SipHash.
        let mut seen: foldhash::HashSet<(UnixMs, u32)> =
            held_ticks.iter().map(|t| (t.ts_ms, t.pid)).collect();
        let new: Vec<ProcessTick> = (new.into_iter())
            .filter(|t| seen.insert((t.ts_ms, t.pid)))
            .collect();
        if new.is_empty() {
            continue; // only replays: a held minute stays as it was (below)
        }
        let (mut ticks, stored) = match held.process.remove(&(gpu, minute)) {
            Some(h) => (h.items, h.stored),
            None => (Vec::new(), false),
        };
        ticks.extend(new);
        match packed::process::pack(&ticks) {
            Ok(value) => process_values.push((gpu, (minute, value))),
            Err(PackError::TooLarge(_)) => {
                if stored {
                    delete_value::<DB>(conn, Tier::Process, gpu, minute).await?;
                }
                process_rows.extend(ticks.into_iter().map(|t| (gpu, t)));
            }
            Err(e) => return Err(corrupt(Tier::Process, gpu, minute)(e)),
        }
    }

    // GPU samples: the first stored of a key wins, as an insert that skips it.
    let mut arriving: BTreeMap<(i64, UnixMs), Vec<Arriving>> = BTreeMap::new();
    samples.gpu.retain(|r| {
        let key = (r.gpu, minute_of(r.ts));
        if !closed(r.ts) || with_rows.contains(&(Tier::Gpu, key.0, key.1)) {
            return true;
        }
        arriving.entry(key).or_default().push((r.group, r.ts, r.s));
        false
    });
    let mut gpu_rows: Vec<(i64, UnixMs, GpuSample)> = Vec::new();
    let mut minutes: Vec<PackedMinute> = Vec::new();
    for ((gpu, minute), new) in arriving {
        // The samples new to the minute; a key stored already (or earlier in this write)
        // is handed to the conflict check with the sample that has it.
        let mut fresh: Vec<(UnixMs, Cow<GpuSample>)> = Vec::new();
        {
            let held_items = held
                .gpu
                .get(&(gpu, minute))
                .map_or(&[][..], |h| &h.items[..]);
            let mut at: foldhash::HashMap<UnixMs, &GpuSample> =
                held_items.iter().map(|(t, s)| (*t, s)).collect();
            for (group, ts, s) in new {
                if let Some(stored) = at.get(&ts) {
                    out.repeated.insert((gpu, ts), (*stored).clone());
                    continue;
                }
                at.insert(ts, s);
                fresh.push((ts, Cow::Borrowed(s)));
                *out.inserted.entry(group).or_default() += 1;
            }
        }
        if fresh.is_empty() {
            continue; // only replays: a held minute stays as it was (below)
        }
        let (mut items, stored) = match held.gpu.remove(&(gpu, minute)) {
            Some(h) => {
                let items = h.items.into_iter().map(|(t, s)| (t, Cow::Owned(s)));
                (items.collect::<Vec<_>>(), h.stored)
            }
            None => (Vec::new(), false),
        };
        items.append(&mut fresh);
        items.sort_by_key(|(t, _)| *t);
        match packed::gpu::pack(&items) {
            Ok(value) => gpu_values.push((gpu, (minute, value))),
            Err(PackError::TooLarge(_)) => {
                if stored {
                    delete_value::<DB>(conn, Tier::Gpu, gpu, minute).await?;
                }
                gpu_rows.extend(items.iter().map(|(t, s)| (gpu, *t, s.clone().into_owned())));
            }
            Err(e) => return Err(corrupt(Tier::Gpu, gpu, minute)(e)),
        }
        minutes.push((gpu, minute, items));
    }

    // Held minutes the write brought nothing new to: as they were.
    for ((gpu, minute), h) in held.process {
        if !h.stored {
            process_values.push((gpu, (minute, h.value)));
        }
    }
    for ((gpu, minute), h) in held.gpu {
        if !h.stored {
            gpu_values.push((gpu, (minute, h.value)));
        }
    }
    if !process_rows.is_empty() || !gpu_rows.is_empty() {
        insert_unpacked::<DB>(conn, &[], &process_rows, &gpu_rows).await?;
    }
    upsert_values::<DB>(conn, Tier::Process, &process_values).await?;
    upsert_values::<DB>(conn, Tier::Gpu, &gpu_values).await?;
    write_rollups::<DB>(conn, &minutes).await?;
    lower_energy_watermarks::<DB>(conn, &minutes).await?;
    Ok(out)
}

/// The closed minutes a write brings data for, not held, that hold rows: as (tier, GPU,
/// minute). One statement finds the GPUs with rows anywhere in their span of such
/// minutes (none, for a write that catches up); the minutes of those GPUs are then looked
/// up one by one (an indexed look-up per minute and tier).
async fn closed_minutes_with_rows<DB: Backend>(
    conn: &mut DB::Connection,
    samples: &Samples<'_>,
    held: &Held,
    closed: impl Fn(UnixMs) -> bool,
) -> Result<HashSet<(Tier, i64, UnixMs)>, StoreError> {
    let process = (samples.process.iter())
        .filter(|r| closed(r.ts))
        .map(|r| (r.gpu, minute_of(r.ts)))
        .filter(|key| !held.process.contains_key(key));
    let gpu = (samples.gpu.iter())
        .filter(|r| closed(r.ts))
        .map(|r| (r.gpu, minute_of(r.ts)))
        .filter(|key| !held.gpu.contains_key(key));
    let minutes: BTreeSet<(i64, UnixMs)> = process.chain(gpu).collect();
    let mut out = HashSet::new();
    if minutes.is_empty() {
        return Ok(out);
    }
    let exists = |tier: Tier, from: &str, to: &str| {
        format!(
            "CASE WHEN EXISTS (SELECT 1 FROM {} x WHERE x.gpu_id = v.id \
               AND x.ts_ms >= {from} AND x.ts_ms < {to}) THEN 1 ELSE 0 END",
            tier.rows()
        )
    };
    let mut spans: BTreeMap<i64, (UnixMs, UnixMs)> = BTreeMap::new();
    for &(gpu, minute) in &minutes {
        let end = minute.saturating_add(MINUTE_MS);
        let span = spans.entry(gpu).or_insert((minute, end));
        span.1 = span.1.max(end);
    }
    let table = Table::default()
        .int("id", spans.keys().copied())
        .int("from_ms", spans.values().map(|s| s.0))
        .int("to_ms", spans.values().map(|s| s.1));
    let found = sql::<DB>(
        "find the GPUs with rows in the closed minutes a write falls in",
        format!(
            "SELECT v.id AS gpu_id, {} AS p, {} AS g FROM {}",
            exists(Tier::Process, "v.from_ms", "v.to_ms"),
            exists(Tier::Gpu, "v.from_ms", "v.to_ms"),
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    let mut with_rows: HashSet<i64> = HashSet::new();
    for row in &found {
        if row.get::<i64>("p")? != 0 || row.get::<i64>("g")? != 0 {
            with_rows.insert(row.get("gpu_id")?);
        }
    }
    let minutes: Vec<(i64, UnixMs)> = (minutes.into_iter())
        .filter(|(gpu, _)| with_rows.contains(gpu))
        .collect();
    if minutes.is_empty() {
        return Ok(out);
    }
    let table = Table::default()
        .int("id", minutes.iter().map(|m| m.0))
        .int("minute_ms", minutes.iter().map(|m| m.1));
    let end = format!("v.minute_ms + {MINUTE_MS}");
    let found = sql::<DB>(
        "find the closed minutes a write falls in that hold rows",
        format!(
            "SELECT v.id AS gpu_id, v.minute_ms, {} AS p, {} AS g FROM {}",
            exists(Tier::Process, "v.minute_ms", &end),
            exists(Tier::Gpu, "v.minute_ms", &end),
            DB::DIALECT.over(&table, "v")
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    for row in &found {
        let (gpu, minute): (i64, UnixMs) = (row.get("gpu_id")?, row.get("minute_ms")?);
        for (tier, col) in [(Tier::Process, "p"), (Tier::Gpu, "g")] {
            if row.get::<i64>(col)? != 0 {
                out.insert((tier, gpu, minute));
            }
        }
    }
    Ok(out)
}

/// Most packed values one statement of [`upsert_values`] stores.
const UPSERT_VALUES: usize = 64;

/// Stores minute values of GPUs' process ticks or samples, replacing those already
/// stored.
async fn upsert_values<DB: Backend>(
    conn: &mut DB::Connection,
    tier: Tier,
    values: &[(i64, Value)],
) -> Result<(), StoreError> {
    for chunk in values.chunks(UPSERT_VALUES) {
        // SQLite: anonymous parameters, which it binds without looking each one up among
        // the named (a linear scan per parameter).
        let rows: Vec<String> = (0..chunk.len())
            .map(|i| match DB::DIALECT {
                Dialect::Sqlite => format!("(?, ?, {MINUTE_MS}, ?)"),
                Dialect::Postgres => format!(
                    "(${}, ${}, {MINUTE_MS}, ${})",
                    3 * i + 1,
                    3 * i + 2,
                    3 * i + 3
                ),
            })
            .collect();
        let text = format!(
            "INSERT INTO {} (gpu_id, minute_ms, span_ms, packed) VALUES {} \
             ON CONFLICT (gpu_id, minute_ms) DO UPDATE SET span_ms = excluded.span_ms, \
             packed = excluded.packed",
            tier.packed(),
            rows.join(", ")
        );
        let mut query = sql::<DB>("store packed minutes", text);
        for (gpu, (minute, value)) in chunk {
            query = query.bind(*gpu).bind(*minute).bind(value);
        }
        query.execute(&mut *conn).await?;
    }
    Ok(())
}

/// A metric's value as its `gpu_samples` column holds it, which is what SQL aggregates:
/// SQLite keeps the value itself; PostgreSQL keeps a u32 as the bits of an `int4` (see
/// the schemas); 64-bit values are the bits of a `bigint` on both.
fn column_value(dialect: Dialect, metric: GpuMetric, v: u64) -> i64 {
    use GpuMetric::*;
    match metric {
        PowerMw | PowerInstantMw | PowerLimitMw | TempGpuC | TempMemC | ClockSmMhz
        | ClockMemMhz | ClockGraphicsMhz
            if dialect == Dialect::Postgres =>
        {
            i64::from(v as u32 as i32)
        }
        _ => v as i64,
    }
}

/// One metric's figures over a minute before the average: the database divides, as its
/// `avg` does (SQLite: the integer sum as a double over the count; PostgreSQL: a numeric
/// quotient), so the row equals what the rollup task's SQL computes from rows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Figures {
    n: u32,
    /// The integer sum, when it fits 64 bits (SQLite then approximates; so does this).
    sum: Option<i64>,
    /// The average for a sum that does not fit.
    approx: Option<f64>,
    min: Option<i64>,
    max: Option<i64>,
}

/// The rollup figures of a GPU minute's samples, metric by metric in
/// [`GpuMetric::ALL`] order (the rollup table's), and its sample count.
fn rollup_row<S: Borrow<GpuSample>>(
    dialect: Dialect,
    samples: &[(UnixMs, S)],
) -> (u32, Vec<Figures>) {
    let figures = GpuMetric::ALL
        .iter()
        .map(|&metric| {
            let values = samples.iter().filter_map(|(_, s)| metric.value(s.borrow()));
            let (mut n, mut sum, mut min, mut max) = (0u32, 0i128, i64::MAX, i64::MIN);
            for v in values.map(|v| column_value(dialect, metric, v)) {
                n += 1;
                sum += i128::from(v);
                min = min.min(v);
                max = max.max(v);
            }
            if n == 0 {
                return Figures::default();
            }
            let exact = i64::try_from(sum).ok();
            Figures {
                n,
                sum: exact,
                approx: exact.is_none().then(|| sum as f64 / f64::from(n)),
                min: Some(min),
                max: Some(max),
            }
        })
        .collect();
    (u32::try_from(samples.len()).unwrap_or(u32::MAX), figures)
}

/// The columns [`write_rollups`] binds per metric, in [`GpuMetric::ALL`] order: the
/// count, the integer sum, the approximate average, the minimum and the maximum.
fn figure_columns() -> &'static [[&'static str; 5]] {
    static COLS: OnceLock<Vec<[&'static str; 5]>> = OnceLock::new();
    COLS.get_or_init(|| {
        let name = |m: GpuMetric, suffix: &str| -> &'static str {
            Box::leak(format!("{}_{suffix}", m.name()).into_boxed_str())
        };
        (GpuMetric::ALL.iter())
            .map(|&m| ["n", "sum", "approx", "min", "max"].map(|suffix| name(m, suffix)))
            .collect()
    })
}

/// The upsert of [`write_rollups`]'s rows from `source`, a FROM item `v` with the
/// [`figure_columns`].
fn rollup_upsert(dialect: Dialect, source: &str) -> String {
    let s = spec(RollupKind::Gpu);
    let mut names = vec!["gpu_id, minute_ms, samples".to_owned()];
    let mut values = vec!["v.gpu_id, v.minute_ms, CAST(v.samples AS INTEGER)".to_owned()];
    let mut updates = vec!["samples = excluded.samples".to_owned()];
    for (&(c, _), [n, sum, approx, min, max]) in s.cols.iter().zip(figure_columns()) {
        names.push(format!("{c}_n, {c}_avg, {c}_min, {c}_max"));
        let avg = match dialect {
            Dialect::Sqlite => format!("coalesce(CAST(v.{sum} AS REAL) / v.{n}, v.{approx})"),
            Dialect::Postgres => format!(
                "coalesce(CAST(CAST(v.{sum} AS NUMERIC) / v.{n} AS DOUBLE PRECISION), v.{approx})"
            ),
        };
        values.push(format!("CAST(v.{n} AS INTEGER), {avg}, v.{min}, v.{max}"));
        for suffix in ["n", "avg", "min", "max"] {
            updates.push(format!("{c}_{suffix} = excluded.{c}_{suffix}"));
        }
    }
    format!(
        "INSERT INTO {} ({}) SELECT {} FROM {} WHERE true \
         ON CONFLICT (gpu_id, minute_ms) DO UPDATE SET {}",
        s.minutes,
        names.join(", "),
        values.join(", "),
        source,
        updates.join(", ")
    )
}

/// Most rows one SQLite statement of [`write_rollups`] stores (123 parameters each).
const ROLLUP_ROWS: usize = 16;

/// The SQLite upsert of [`write_rollups`] for `rows` rows (1 to [`ROLLUP_ROWS`]), bound
/// row after row as (GPU, minute, sample count, the [`figure_columns`]): built once per
/// row count.
fn sqlite_rollup_upsert(rows: usize) -> &'static str {
    static TEXTS: [OnceLock<String>; ROLLUP_ROWS] = [const { OnceLock::new() }; ROLLUP_ROWS];
    let rows = rows.clamp(1, ROLLUP_ROWS);
    TEXTS[rows - 1].get_or_init(|| {
        let cols = figure_columns();
        let names = ["gpu_id", "minute_ms", "samples"]
            .into_iter()
            .chain(cols.iter().flatten().copied());
        let names: Vec<&str> = names.collect();
        let row = format!("({})", vec!["?"; names.len()].join(", "));
        format!(
            "WITH v({}) AS (VALUES {}) {}",
            names.join(", "),
            vec![row; rows].join(", "),
            rollup_upsert(Dialect::Sqlite, "v")
        )
    })
}

/// Writes the rollup row of every GPU minute packed on arrival, from all its samples,
/// replacing the one stored: a minute in a packed rollup hour has its hour reopened
/// first, and a minute behind the GPU's raw horizon keeps its row (its other samples are
/// gone; the row counted them).
async fn write_rollups<DB: Backend>(
    conn: &mut DB::Connection,
    minutes: &[PackedMinute<'_>],
) -> Result<(), StoreError> {
    if minutes.is_empty() {
        return Ok(());
    }
    let gpus: BTreeSet<i64> = minutes.iter().map(|(gpu, _, _)| *gpu).collect();
    series::GPU_ROLLUP
        .lock::<DB>(conn, gpus.iter().copied())
        .await?;
    let hours: BTreeSet<(i64, UnixMs)> = (minutes.iter())
        .map(|(gpu, minute, _)| (*gpu, hour_of(*minute)))
        .collect();
    let table = Table::default()
        .int("id", hours.iter().map(|h| h.0))
        .int("hour_ms", hours.iter().map(|h| h.1));
    let found = sql::<DB>(
        "find the packed rollup hours and raw horizons of minutes packed on arrival",
        format!(
            "SELECT v.id, v.hour_ms, \
               CASE WHEN EXISTS (SELECT 1 FROM {packed} p WHERE p.gpu_id = v.id \
                 AND p.hour_ms = v.hour_ms) THEN 1 ELSE 0 END AS packed, \
               (SELECT h.raw_from_ms FROM raw_horizon h WHERE h.kind = 'gpu' \
                 AND h.id = v.id) AS horizon FROM {v}",
            packed = rollup_hours::table(RollupKind::Gpu),
            v = DB::DIALECT.over(&table, "v"),
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    let mut horizons: HashMap<i64, UnixMs> = HashMap::new();
    for row in &found {
        let (gpu, hour): (i64, UnixMs) = (row.get("id")?, row.get("hour_ms")?);
        if let Some(h) = row.get::<Option<i64>>("horizon")? {
            horizons.insert(gpu, h);
        }
        if row.get::<i64>("packed")? != 0 {
            let key = RollupKey::gpu(GpuId(gpu));
            rollup_hours::reopen::<DB>(conn, key, hour, hour.saturating_add(HOUR_MS)).await?;
        }
    }
    let rows: Vec<(i64, UnixMs, u32, Vec<Figures>)> = (minutes.iter())
        .filter(|(gpu, minute, _)| horizons.get(gpu).is_none_or(|h| minute >= h))
        .map(|(gpu, minute, samples)| {
            let (count, figures) = rollup_row(DB::DIALECT, samples);
            (*gpu, *minute, count, figures)
        })
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    let cols = figure_columns();
    if DB::DIALECT == Dialect::Sqlite {
        // Up to ROLLUP_ROWS rows per statement, their parameters anonymous (`?`): SQLite
        // finds a numbered parameter by a linear scan of the named ones, so binding
        // hundreds of `$N` costs the square.
        for chunk in rows.chunks(ROLLUP_ROWS) {
            let mut query = sql::<DB>(
                "store the rollups of minutes packed on arrival",
                sqlite_rollup_upsert(chunk.len()),
            );
            for (gpu, minute, count, figures) in chunk {
                query = query.bind(*gpu).bind(*minute).bind(i64::from(*count));
                for f in figures {
                    query = (query.bind(i64::from(f.n)).bind(f.sum).bind(f.approx))
                        .bind(f.min)
                        .bind(f.max);
                }
            }
            query.execute(&mut *conn).await?;
        }
        return Ok(());
    }
    let mut table = Table::default()
        .int("gpu_id", rows.iter().map(|r| r.0))
        .int("minute_ms", rows.iter().map(|r| r.1))
        .int("samples", rows.iter().map(|r| i64::from(r.2)));
    for (m, names) in cols.iter().enumerate() {
        let f = |get: fn(&Figures) -> Option<i64>| rows.iter().map(move |r| get(&r.3[m]));
        table = (table.int(names[0], f(|f| Some(i64::from(f.n)))))
            .int(names[1], f(|f| f.sum))
            .float(names[2], rows.iter().map(|r| r.3[m].approx))
            .int(names[3], f(|f| f.min))
            .int(names[4], f(|f| f.max));
    }
    let text = rollup_upsert(DB::DIALECT, &DB::DIALECT.over(&table, "v"));
    sql::<DB>("store the rollups of minutes packed on arrival", text)
        .bind_table(table)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Moves each GPU's energy watermark back to the oldest minute packed on arrival that
/// gained samples behind it: the accountant recomputes from there, after a restart too
/// (the row tables' late samples are found by counting rows instead).
async fn lower_energy_watermarks<DB: Backend>(
    conn: &mut DB::Connection,
    minutes: &[PackedMinute<'_>],
) -> Result<(), StoreError> {
    let mut oldest: BTreeMap<i64, UnixMs> = BTreeMap::new();
    for (gpu, minute, _) in minutes {
        let m = oldest.entry(*gpu).or_insert(*minute);
        *m = (*m).min(*minute);
    }
    if oldest.is_empty() {
        return Ok(());
    }
    let table = Table::default()
        .int("id", oldest.keys().copied())
        .int("minute_ms", oldest.values().copied());
    // The write's GPUs are found by key (`gpu_id IN` a list that does not depend on the
    // row), not by a scan of every GPU's watermark.
    let minute = "(SELECT r.minute_ms FROM r WHERE r.id = energy_progress.gpu_id)";
    sql::<DB>(
        "move energy watermarks back to minutes packed on arrival",
        format!(
            "{} UPDATE energy_progress SET done_to_ms = {minute} \
             WHERE gpu_id IN (SELECT r.id FROM r) AND done_to_ms > {minute}",
            DB::DIALECT.request_rows(&table)
        ),
    )
    .bind_table(table)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(power_mw: Option<u32>, energy_mj: Option<u64>) -> GpuSample {
        GpuSample {
            power_mw,
            energy_mj,
            ..GpuSample::default()
        }
    }

    fn figures(dialect: Dialect, samples: &[GpuSample], metric: GpuMetric) -> Figures {
        let timed: Vec<(UnixMs, GpuSample)> = (samples.iter().cloned().enumerate())
            .map(|(i, s)| (i as UnixMs, s))
            .collect();
        let (count, all) = rollup_row(dialect, &timed);
        assert_eq!(count as usize, samples.len());
        let at = GpuMetric::ALL
            .iter()
            .position(|m| *m == metric)
            .expect("a metric");
        all[at]
    }

    #[test]
    fn absent_values_are_not_counted_and_a_metric_without_any_has_no_figures() {
        let samples = [
            sample(Some(100), None),
            sample(None, None),
            sample(Some(300), None),
        ];
        let power = figures(Dialect::Sqlite, &samples, GpuMetric::PowerMw);
        assert_eq!(
            power,
            Figures {
                n: 2,
                sum: Some(400),
                approx: None,
                min: Some(100),
                max: Some(300)
            }
        );
        assert_eq!(
            figures(Dialect::Sqlite, &samples, GpuMetric::EnergyMj),
            Figures::default()
        );
    }

    #[test]
    fn u32_metrics_are_aggregated_as_each_database_stores_them() {
        // PostgreSQL keeps a u32 as an int4's bits: above 2^31 it is negative there.
        let samples = [sample(Some(u32::MAX), None), sample(Some(1), None)];
        let sqlite = figures(Dialect::Sqlite, &samples, GpuMetric::PowerMw);
        assert_eq!(
            (sqlite.min, sqlite.max),
            (Some(1), Some(i64::from(u32::MAX)))
        );
        let pg = figures(Dialect::Postgres, &samples, GpuMetric::PowerMw);
        assert_eq!((pg.min, pg.max, pg.sum), (Some(-1), Some(1), Some(0)));
    }

    #[test]
    fn a_sum_beyond_64_bits_is_averaged_approximately() {
        let samples = [
            sample(None, Some(u64::MAX / 2)),
            sample(None, Some(u64::MAX / 2)),
        ];
        let f = figures(Dialect::Sqlite, &samples, GpuMetric::EnergyMj);
        assert_eq!(f.sum, None);
        assert_eq!(f.approx, Some((u64::MAX / 2) as f64));
    }
}
