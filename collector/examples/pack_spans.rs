//! How much the packed raw tiers would shrink if a value held more than a minute: reads
//! the packed minutes of a SQLite database written by `storage_bytes` (`DB=PATH`), merges
//! each series' runs of `SPAN` consecutive minutes (aligned to the span) into one value of
//! the same format, and compares their bytes. A probe for BENCHMARKS.md, not a test:
//!
//! ```text
//! DB=/tmp/week.db STEADY=1 HOST_EVERY=5 \
//!   cargo run --release -p gpufleet-collector --example storage_bytes -- week sqlite
//! cargo run --release -p gpufleet-collector --example pack_spans -- /tmp/week.db 60
//! ```
//!
//! Only spans whose every minute is packed are compared (the newest, still in rows, and a
//! span cut by the week's ends are left out). With `PG` set (a PostgreSQL URL), both forms
//! are also written to two tables shaped like the packed tables (key, start, `bytea`
//! stored out of line uncompressed) in a schema of their own (dropped afterwards), and
//! their `pg_total_relation_size` (heap, TOAST, index) after `VACUUM` is reported.

use anyhow::{Context, Result};
use gpufleet_collector::store::packed;
use sqlx::Connection;
use std::collections::BTreeMap;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .context("usage: pack_spans DB_PATH [SPAN_MINUTES]")?;
    let span: i64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(60);
    let span = span.max(1);
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{path}")).await?;
    let mut pg = match std::env::var("PG") {
        Ok(url) => {
            let mut c = sqlx::PgConnection::connect(&url).await?;
            let ddl = "DROP SCHEMA IF EXISTS pack_spans CASCADE; CREATE SCHEMA pack_spans; \
                SET search_path = pack_spans; \
                CREATE TABLE minutes (id bigint, start_ms bigint, packed bytea, PRIMARY KEY (id, start_ms)); \
                CREATE TABLE spans (id bigint, start_ms bigint, packed bytea, PRIMARY KEY (id, start_ms)); \
                ALTER TABLE minutes ALTER COLUMN packed SET STORAGE EXTERNAL; \
                ALTER TABLE spans ALTER COLUMN packed SET STORAGE EXTERNAL;";
            sqlx::raw_sql(ddl).execute(&mut c).await?;
            Some(c)
        }
        Err(_) => None,
    };
    for (table, id) in [
        ("packed_gpu_minutes", "gpu_id"),
        ("packed_host_minutes", "node_id"),
        ("packed_process_minutes", "gpu_id"),
    ] {
        let rows: Vec<(i64, i64, Vec<u8>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {id}, minute_ms, packed FROM {table} ORDER BY {id}, minute_ms"
        )))
        .fetch_all(&mut conn)
        .await?;
        let mut spans: BTreeMap<(i64, i64), Vec<Vec<u8>>> = BTreeMap::new();
        for (series, minute, value) in rows {
            let key = (series, minute.div_euclid(span * 60_000));
            spans.entry(key).or_default().push(value);
        }
        let (mut whole, mut as_minutes, mut as_spans) = (0, 0, 0);
        if let Some(c) = pg.as_mut() {
            sqlx::raw_sql("TRUNCATE pack_spans.minutes, pack_spans.spans")
                .execute(&mut *c)
                .await?;
        }
        for (&(series, start), values) in spans.iter().filter(|(_, v)| v.len() == span as usize) {
            whole += 1;
            as_minutes += values.iter().map(Vec::len).sum::<usize>();
            let merged = repack(table, values)?;
            as_spans += merged.len();
            if let Some(c) = pg.as_mut() {
                for (k, v) in values.iter().enumerate() {
                    sqlx::query("INSERT INTO pack_spans.minutes VALUES ($1, $2, $3)")
                        .bind(series)
                        .bind(start * span + k as i64)
                        .bind(v)
                        .execute(&mut *c)
                        .await?;
                }
                sqlx::query("INSERT INTO pack_spans.spans VALUES ($1, $2, $3)")
                    .bind(series)
                    .bind(start)
                    .bind(&merged)
                    .execute(&mut *c)
                    .await?;
            }
        }
        println!(
            "{table}: {whole} spans of {span} min: {as_minutes} B as minutes, {as_spans} B \
             as spans ({:.1} %)",
            100.0 * as_spans as f64 / as_minutes.max(1) as f64
        );
        if let Some(c) = pg.as_mut() {
            for vacuum in ["VACUUM pack_spans.minutes", "VACUUM pack_spans.spans"] {
                sqlx::raw_sql(vacuum).execute(&mut *c).await?;
            }
            let (m, s): (i64, i64) = sqlx::query_as(
                "SELECT pg_total_relation_size('pack_spans.minutes'), \
                        pg_total_relation_size('pack_spans.spans')",
            )
            .fetch_one(&mut *c)
            .await?;
            println!("  PostgreSQL: {m} B as minutes, {s} B as spans");
        }
    }
    if let Some(mut c) = pg {
        sqlx::raw_sql("DROP SCHEMA pack_spans CASCADE")
            .execute(&mut c)
            .await?;
    }
    Ok(())
}

/// `values` (packed minutes of `table`) packed as one value.
fn repack(table: &str, values: &[Vec<u8>]) -> Result<Vec<u8>> {
    Ok(match table {
        "packed_gpu_minutes" => {
            let mut all = Vec::new();
            for v in values {
                all.extend(packed::gpu::unpack(v)?);
            }
            packed::gpu::pack(&all)?
        }
        "packed_host_minutes" => {
            let mut all = Vec::new();
            for v in values {
                all.extend(packed::host::unpack(v)?);
            }
            packed::host::pack(&all)?
        }
        _ => {
            let mut all = Vec::new();
            for v in values {
                all.extend(packed::process::unpack(v)?);
            }
            packed::process::pack(&all)?
        }
    })
}
