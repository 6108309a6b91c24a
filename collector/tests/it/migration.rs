//! Databases left by an older collector, opened by this one: migration 0025 (process
//! identities once per lifetime) converts the process samples of a database at the schema
//! before it without losing one. Each test writes the same ticks through today's store
//! (database A), copies A's rows into a database at the old schema (B, the process samples
//! in their old layout), opens B (which migrates it) and compares every answer of both;
//! then writes more ticks to both, and B must find the lifetimes it converted rather than
//! store them again.
//!
//! Migrations 0026, 0027 (packed minutes), 0028 (packed rollup hours) and 0029 (packed
//! health hours) add tables and convert nothing themselves: a database at the schema
//! before them opens with every row in place, and the rollup task then packs its closed
//! minutes (host rows, process ticks, GPU samples), the closed hours of its rollup minutes
//! and of its GPU health readings without changing one answer.

use crate::common::*;
use gpufleet_collector::accounting::accountant::{Accountant, EnergyOptions};
use gpufleet_collector::accounting::rollups::{RetentionOptions, Rollups};
use gpufleet_collector::store::rollup::RollupKey;
use gpufleet_collector::store::{self, NodeRecord, Store, TimeRange};
use gpufleet_core::*;
use sqlx::Connection;
use std::sync::Arc;

/// The last migration before process lifetimes: the schema a database is converted from.
const BEFORE_LIVES: i64 = 24;

const ALL: TimeRange = TimeRange {
    from_ms: 0,
    to_ms: i64::MAX,
};

const GPUS: [&str; 2] = ["GPU-mig-a", "GPU-mig-b"];

/// Tick `k`: processes whose identities change in every way a lifetime can (a pid reused
/// by another command, the same pid on two GPUs, names learned later, absent and empty
/// strings, a MIG instance, every process type, absent utilizations).
fn tick_k(k: u32) -> Tick {
    let mut t = tick(T0 + i64::from(k) * 1000, &GPUS, k);
    // A database from before GPM holds none.
    for g in &mut t.gpus {
        g.gpm = GpmMetrics::default();
        g.mig_gpm.clear();
    }
    let proc = |gpu: &str, pid: u32| ProcessSample {
        gpu_uuid: gpu.into(),
        pid,
        gpu_mem_bytes: Some(1_000_000 * u64::from(k + 1)),
        sm_util_pct: Some(10 + k),
        mem_util_pct: Some(k),
        ..Default::default()
    };
    let mut ps = vec![
        ProcessSample {
            user: Some("alice".into()),
            command: Some(
                if k < 6 {
                    "python train.py"
                } else {
                    "python eval.py"
                }
                .into(),
            ),
            workload: container_workload(&"a1".repeat(32), Some("trainer")),
            ..proc(GPUS[0], 100)
        },
        ProcessSample {
            process_type: ProcessType::Graphics,
            sm_util_pct: None,
            enc_util_pct: Some(5),
            dec_util_pct: Some(7),
            workload: host_workload(1000),
            mig_uuid: Some("MIG-1".into()),
            ..proc(GPUS[0], 101)
        },
        ProcessSample {
            user: Some("bob".into()),
            command: Some("serve".into()),
            workload: container_workload(&"b2".repeat(32), (k >= 4).then_some("web")),
            ..proc(GPUS[1], 100)
        },
    ];
    if (3..9).contains(&k) {
        ps.push(ProcessSample {
            process_type: ProcessType::ComputeAndGraphics,
            user: Some(String::new()),
            command: Some(String::new()),
            gpu_mem_bytes: None,
            workload: host_workload(0),
            ..proc(GPUS[1], 200)
        });
    }
    t.processes = ps;
    t
}

fn ticks(ks: std::ops::Range<u32>) -> Vec<Tick> {
    ks.map(tick_k).collect()
}

/// Every answer that reads process samples, of both stores, equal; and B's process samples
/// equal to what was written.
async fn same_answers(a: &Arc<dyn Store>, b: &Arc<dyn Store>, node: &NodeRecord, written: &[Tick]) {
    for g in &node.gpus {
        let (pa, pb) = (
            a.process_samples(g.id, ALL, 10_000).await.expect("read A"),
            b.process_samples(g.id, ALL, 10_000).await.expect("read B"),
        );
        let mut want: Vec<(UnixMs, ProcessSample)> = written
            .iter()
            .flat_map(|t| t.processes.iter().map(move |p| (t.time_ms, p.clone())))
            .filter(|(_, p)| p.gpu_uuid == g.info.uuid)
            .collect();
        want.sort_by_key(|(t, p)| (*t, p.pid));
        let names = |v: &[(UnixMs, ProcessSample)]| -> Vec<(UnixMs, u32, Option<String>)> {
            v.iter()
                .map(|(t, p)| (*t, p.pid, p.command.clone()))
                .collect()
        };
        assert_eq!(names(&pb), names(&want), "GPU {}", g.info.uuid);
        assert_eq!(pa, pb, "process samples of GPU {}", g.info.uuid);
        for ((_, got), (_, sent)) in pb.iter().zip(&want) {
            // A workload reads back with the latest names it was sent with.
            let mut sent = sent.clone();
            assert_eq!(got.workload.key(), sent.workload.key());
            sent.workload = got.workload.clone();
            assert_eq!(*got, sent);
        }
        let (ea, eb) = (
            a.energy_inputs(g.id, T0 - 60_000, T0 + 3_600_000)
                .await
                .expect("energy A"),
            b.energy_inputs(g.id, T0 - 60_000, T0 + 3_600_000)
                .await
                .expect("energy B"),
        );
        assert!(ea.samples.iter().any(|s| !s.processes.is_empty()));
        assert_eq!(ea, eb, "energy inputs of GPU {}", g.info.uuid);
    }
    let sorted = |mut v: Vec<store::LatestGpu>| {
        v.sort_by_key(|l| l.gpu);
        v
    };
    assert_eq!(
        sorted(a.latest_gpu_samples().await.expect("latest A")),
        sorted(b.latest_gpu_samples().await.expect("latest B")),
    );
    assert_eq!(
        a.node_ticks(node, ALL, 10_000).await.expect("ticks A"),
        b.node_ticks(node, ALL, 10_000).await.expect("ticks B"),
    );
}

/// The columns `workloads` had before 0031 (which added a Slurm job's names and labels):
/// a database of today copies into an older schema through them.
const OLD_WORKLOAD_COLS: &str = "id, key, kind, runtime, container_id, pod_uid, qos, job_id, \
    step, unit, uid, container_name, image, pod_name, namespace, first_seen_ms";

/// The columns `gpu_samples` had before 0033 (which added GPM).
const OLD_GPU_COLS: &str = "gpu_id, ts_ms, util_gpu_pct, util_mem_pct, mem_used_bytes, \
    mem_total_bytes, mem_reserved_bytes, power_mw, power_instant_mw, power_limit_mw, energy_mj, \
    temp_gpu_c, temp_mem_c, fan_pct, clock_sm_mhz, clock_mem_mhz, clock_graphics_mhz, pstate, \
    pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps, nvlinks, ecc_corrected_volatile, \
    ecc_uncorrected_volatile, throttle_reasons, enc_util_pct, dec_util_pct";

/// `INSERT INTO {to}.{t} SELECT … FROM {from}.{t};` with the columns the older schema has.
fn copy_table(to: &str, from: &str, t: &str) -> String {
    let old = match t {
        "workloads" => Some(OLD_WORKLOAD_COLS),
        "gpu_samples" => Some(OLD_GPU_COLS),
        _ => None,
    };
    if let Some(cols) = old {
        format!("INSERT INTO {to}.{t} ({cols}) SELECT {cols} FROM {from}.{t};")
    } else {
        format!("INSERT INTO {to}.{t} SELECT * FROM {from}.{t};")
    }
}

/// The tables 0025 leaves alone, copied as they are.
const COPIED: [&str; 6] = [
    "nodes",
    "gpus",
    "workloads",
    "gpu_samples",
    "host_samples",
    "events",
];

/// A's process samples in the layout before 0025 (identity on every row).
const OLD_PROCESS_COLS: &str = "gpu_id, ts_ms, pid, workload_id, process_type, user_name, \
    command, gpu_mem_bytes, sm_util_pct, mem_util_pct, enc_util_pct, dec_util_pct, mig_uuid";

fn old_process_rows(a: &str) -> String {
    format!(
        "SELECT p.gpu_id, p.ts_ms, p.pid, l.workload_id, l.process_type, l.user_name, \
           l.command, p.gpu_mem_bytes, p.sm_util_pct, p.mem_util_pct, p.enc_util_pct, \
           p.dec_util_pct, l.mig_uuid \
         FROM {a}process_samples p JOIN {a}process_lives l ON l.id = p.life_id"
    )
}

#[tokio::test]
async fn sqlite_database_before_process_lives_is_converted_without_losing_a_sample() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a_path, b_path) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let (a_url, b_url) = (
        format!("sqlite://{}", a_path.display()),
        format!("sqlite://{}", b_path.display()),
    );
    let a = store::open(&a_url).await.expect("open A");
    let node = register_gpus(&a, "n1", &GPUS, T0).await;
    write_ticks(&a, &node, 1, ticks(0..12)).await;
    a.close().await;

    store::migrate_to(&b_url, BEFORE_LIVES)
        .await
        .expect("old schema");
    let mut conn = sqlx::SqliteConnection::connect(&b_url)
        .await
        .expect("connect B");
    let mut copy = format!("ATTACH DATABASE '{}' AS a;", a_path.display());
    for t in COPIED {
        copy += &copy_table("main", "a", t);
    }
    copy += &format!(
        "INSERT INTO main.process_samples ({OLD_PROCESS_COLS}) {}; DETACH DATABASE a;",
        old_process_rows("a.")
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(copy))
        .execute(&mut conn)
        .await
        .expect("copy A into the old schema");
    let old: i64 = sqlx::query_scalar("SELECT count(*) FROM process_samples")
        .fetch_one(&mut conn)
        .await
        .expect("count");
    assert_eq!(old, 12 * 3 + 6);
    conn.close().await.expect("close");

    let a = store::open(&a_url).await.expect("reopen A");
    let b = store::open(&b_url).await.expect("open and migrate B");
    same_answers(&a, &b, &node, &ticks(0..12)).await;

    // New ticks of the same processes find the converted lifetimes.
    write_ticks(&a, &node, 2, ticks(12..16)).await;
    write_ticks(&b, &node, 2, ticks(12..16)).await;
    same_answers(&a, &b, &node, &ticks(0..16)).await;
    let lives = |url: String| async move {
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("connect");
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM process_lives")
            .fetch_one(&mut conn)
            .await
            .expect("count lives");
        n
    };
    assert_eq!(lives(a_url).await, 5);
    assert_eq!(lives(b_url).await, 5);
}

/// The raw partitions of T0's day (2027-01-15) in `schema`, where the copied rows go,
/// named as the store names them.
fn raw_partitions(schema: &str) -> String {
    let day = T0.div_euclid(86_400_000);
    assert_eq!(day, 20_833);
    let mut out = String::new();
    for t in store::postgres::RAW_TABLES {
        out += &format!(
            "CREATE TABLE {schema}.{t}_p20270115 PARTITION OF {schema}.{t} \
             FOR VALUES FROM ({}) TO ({});",
            day * 86_400_000,
            (day + 1) * 86_400_000
        );
    }
    out
}

#[tokio::test]
async fn postgres_database_before_process_lives_is_converted_without_losing_a_sample() {
    let (a_schema, b_schema) = (PgSchema::create().await, PgSchema::create().await);
    let a = store::open(&a_schema.url()).await.expect("open A");
    let node = register_gpus(&a, "n1", &GPUS, T0).await;
    write_ticks(&a, &node, 1, ticks(0..12)).await;

    store::migrate_to(&b_schema.url(), BEFORE_LIVES)
        .await
        .expect("old schema");
    let (an, bn) = (&a_schema.name, &b_schema.name);
    let mut copy = raw_partitions(bn);
    for t in COPIED {
        copy += &copy_table(bn, an, t);
    }
    copy += &format!(
        "INSERT INTO {bn}.process_samples ({OLD_PROCESS_COLS}) {};",
        old_process_rows(&format!("{an}."))
    );
    for t in ["nodes", "gpus", "workloads", "events"] {
        copy += &format!(
            "SELECT setval(pg_get_serial_sequence('{bn}.{t}', 'id'), \
               (SELECT max(id) FROM {bn}.{t}));"
        );
    }
    let mut conn = pg_connect(&a_schema.base_url).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(copy))
        .execute(&mut conn)
        .await
        .expect("copy A into the old schema");
    let old: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {bn}.process_samples"
    )))
    .fetch_one(&mut conn)
    .await
    .expect("count");
    assert_eq!(old, 12 * 3 + 6);

    let b = store::open(&b_schema.url())
        .await
        .expect("open and migrate B");
    same_answers(&a, &b, &node, &ticks(0..12)).await;

    write_ticks(&a, &node, 2, ticks(12..16)).await;
    write_ticks(&b, &node, 2, ticks(12..16)).await;
    same_answers(&a, &b, &node, &ticks(0..16)).await;
    for schema in [an, bn] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {schema}.process_lives"
        )))
        .fetch_one(&mut conn)
        .await
        .expect("count lives");
        assert_eq!(n, 5, "{schema}");
    }
    a.close().await;
    b.close().await;
}

/// The last migration before packed minutes.
const BEFORE_PACKED: i64 = 25;

/// The tables of a database at [`BEFORE_PACKED`] that hold the written ticks.
const COPIED_BEFORE_PACKED: [&str; 9] = [
    "nodes",
    "gpus",
    "workloads",
    "process_lives",
    "gpu_samples",
    "process_samples",
    "host_samples",
    "events",
    "gpu_health",
];

/// The newest tick of [`five_minutes`], after T0.
const NEWEST_MS: i64 = 67 * 60_000;

/// Five minutes of ticks at 1 Hz and one at minute 67 (minutes 0 to 4 are closed, and the
/// hour holding them is closed once they are packed), health every 30 s and on the last.
fn five_minutes() -> Vec<Tick> {
    let mut out: Vec<Tick> = (0..300u32)
        .map(|k| tick(T0 + i64::from(k) * 1000, &GPUS, k))
        .collect();
    out[7].host = None; // a cost-only host row
    out[8].cost = None;
    out.push(tick(T0 + NEWEST_MS, &GPUS, 300));
    // A database from before GPM holds none.
    for g in out.iter_mut().flat_map(|t| &mut t.gpus) {
        g.gpm = GpmMetrics::default();
        g.mig_gpm.clear();
    }
    for t in out.iter_mut().step_by(30) {
        let k = u32::try_from((t.time_ms - T0) / 30_000).unwrap_or(u32::MAX);
        t.health = vec![health_full(GPUS[0], k), health_sparse(GPUS[1])];
    }
    out
}

/// Host rows, GPU samples and process samples of a store, as read.
async fn raw_answers(s: &Arc<dyn Store>, node: &NodeRecord) -> String {
    let mut out = format!(
        "{:?}",
        s.host_samples(node.id, ALL, 10_000).await.expect("h")
    );
    for g in &node.gpus {
        let samples = s.gpu_samples(g.id, ALL, 10_000).await.expect("s");
        let p = s.process_samples(g.id, ALL, 10_000).await.expect("p");
        let health = s.gpu_health(g.id, ALL, 10_000).await.expect("health");
        out += &format!("\n{samples:?}\n{p:?}\n{health:?}");
    }
    out
}

/// The rollup minutes of a node and its GPUs, as read.
async fn rollup_answers(s: &Arc<dyn Store>, node: &NodeRecord) -> String {
    let mut out = format!(
        "{:?}",
        s.rollup_minutes(RollupKey::host(node.id), ALL)
            .await
            .expect("h")
    );
    for g in &node.gpus {
        let minutes = s.rollup_minutes(RollupKey::gpu(g.id), ALL).await;
        out += &format!("\n{:?}", minutes.expect("g"));
    }
    out
}

/// B (converted from A's rows) answers A's host rows and process samples, before and
/// after its accountant and rollup task ran and its closed minutes were packed.
async fn host_rows_survive_packing(a: &Arc<dyn Store>, b: &Arc<dyn Store>, node: &NodeRecord) {
    let before = a.host_samples(node.id, ALL, 10_000).await.expect("A");
    assert_eq!(before.len(), 301);
    let answers = raw_answers(a, node).await;
    assert_eq!(raw_answers(b, node).await, answers);
    let now = T0 + 3 * 3_600_000;
    let clock: gpufleet_collector::live::status::Clock = Arc::new(move || now);
    Accountant::new(b.clone(), EnergyOptions::default(), clock.clone())
        .pass()
        .await
        .expect("account");
    let mut r = Rollups::new(b.clone(), RetentionOptions::default(), clock);
    r.pass().await.expect("roll up");
    let rollups = rollup_answers(b, node).await;
    assert!(rollups.contains(&format!("minute_ms: {}", T0 + 4 * 60_000)));
    let out = r.pack(now).await.expect("pack");
    // Five host minutes; five process minutes and five sample minutes of each GPU; then
    // hour 0's five rollup minutes of the node and of each GPU.
    assert_eq!(out.minutes, 5 + 2 * 5 + 2 * 5, "{out:?}");
    assert_eq!(out.rollup_minutes, 5 + 2 * 5, "{out:?}");
    // Hour 0's ten health readings of each GPU (the newest, at minute 67, stays a row).
    assert_eq!(out.health_readings, 2 * 10, "{out:?}");
    assert_eq!(raw_answers(b, node).await, answers);
    assert_eq!(rollup_answers(b, node).await, rollups);
    let latest = b.latest_host_samples().await.expect("latest");
    assert_eq!(latest[0].time_ms, T0 + NEWEST_MS);
}

#[tokio::test]
async fn sqlite_database_before_packed_minutes_opens_and_is_packed_without_loss() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (a_path, b_path) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let b_url = format!("sqlite://{}", b_path.display());
    let a = store::open(&format!("sqlite://{}", a_path.display()))
        .await
        .expect("open A");
    let node = register_gpus(&a, "n1", &GPUS, T0).await;
    write_ticks(&a, &node, 1, five_minutes()).await;

    store::migrate_to(&b_url, BEFORE_PACKED)
        .await
        .expect("old schema");
    let mut conn = sqlx::SqliteConnection::connect(&b_url)
        .await
        .expect("connect B");
    let mut copy = format!("ATTACH DATABASE '{}' AS a;", a_path.display());
    for t in COPIED_BEFORE_PACKED {
        copy += &copy_table("main", "a", t);
    }
    copy += "DETACH DATABASE a;";
    sqlx::raw_sql(sqlx::AssertSqlSafe(copy))
        .execute(&mut conn)
        .await
        .expect("copy A into the old schema");
    conn.close().await.expect("close");

    let b = store::open(&b_url).await.expect("open and migrate B");
    host_rows_survive_packing(&a, &b, &node).await;
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn postgres_database_before_packed_minutes_opens_and_is_packed_without_loss() {
    let (a_schema, b_schema) = (PgSchema::create().await, PgSchema::create().await);
    let a = store::open(&a_schema.url()).await.expect("open A");
    let node = register_gpus(&a, "n1", &GPUS, T0).await;
    write_ticks(&a, &node, 1, five_minutes()).await;

    store::migrate_to(&b_schema.url(), BEFORE_PACKED)
        .await
        .expect("old schema");
    let (an, bn) = (&a_schema.name, &b_schema.name);
    let mut copy = raw_partitions(bn);
    for t in COPIED_BEFORE_PACKED {
        copy += &copy_table(bn, an, t);
    }
    let mut conn = pg_connect(&a_schema.base_url).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(copy))
        .execute(&mut conn)
        .await
        .expect("copy A into the old schema");

    let b = store::open(&b_schema.url())
        .await
        .expect("open and migrate B");
    host_rows_survive_packing(&a, &b, &node).await;
    a.close().await;
    b.close().await;
}
