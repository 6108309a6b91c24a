//! Fault tests: the real `gpufleet-collector` and `gpufleet-agent` binaries, temp SQLite,
//! loopback ports, and the failures gpufleet promises to survive without losing a sample
//! (RELIABILITY.md):
//!
//! - the collector SIGKILLed three times at seeded random moments and restarted on the
//!   same ports and database while three agents stream at 50 ms, then SIGTERMed (it must
//!   drain, commit, ack and exit within 5 s) and restarted once more;
//! - an agent SIGKILLed and restarted on its spool while the collector is unreachable
//!   for far longer than the interval;
//! - a spool too small for an outage: the agent's counted drops equal what is missing.
//!
//! (A store slower than the fleet is the writer's business: `tests/writer.rs` runs it over
//! a slow fake of the store's writes.)
//!
//! Every test ends with the agents stopped cleanly and asserts, from their own summary
//! lines against the database: stored GPU samples == sampled − dropped, and no duplicates.

use crate::harness::{Collector, sigterm, stop_agent, wait_stored};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::process::Child;

use crate::harness;

const GPUS: u32 = 2;

/// A tiny seeded generator (splitmix64): the kill moments are random but reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

/// Starts the collector on `grpc`/`http` with the SQLite file `db`.
async fn start_collector(db: &Path, grpc: &str, http: &str, extra: &[&str]) -> Collector {
    let url = format!("sqlite://{}", db.display());
    harness::start_collector(&url, grpc, http, extra).await
}

/// Extra controls for the fault tests.
trait Faults {
    async fn kill(self);
    async fn stop(self);
}

impl Faults for Collector {
    /// SIGKILL: no drain, no commit of what is queued, no acks.
    async fn kill(mut self) {
        self.child.kill().await.expect("SIGKILL the collector");
    }

    /// SIGTERM, then waits (bounded) for a clean exit.
    async fn stop(mut self) {
        sigterm(&self.child);
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the collector exits within 30 s of SIGTERM")
            .expect("wait");
        assert!(status.success(), "collector exit: {status}");
    }
}

/// Starts a simulated agent (2 GPUs, 50 ms unless `extra` says otherwise).
fn start_agent(collector_grpc: &str, node: &str, spool: &Path, extra: &[&str]) -> Child {
    harness::start_sim_agent(collector_grpc, node, spool, GPUS, extra)
}

/// `(rows, distinct (gpu, ts) keys)` of GPU samples stored for `node`.
async fn stored(db: &Path, node: &str) -> (u64, u64) {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the collector's db");
    let (rows, distinct): (i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT s.gpu_id || ':' || s.ts_ms) FROM gpu_samples s
         JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id WHERE n.name = ?",
    )
    .bind(node)
    .fetch_one(&pool)
    .await
    .expect("count");
    pool.close().await;
    (rows as u64, distinct as u64)
}

/// Stored timestamps of `node`'s first GPU.
async fn stored_times(db: &Path, node: &str) -> Vec<i64> {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the collector's db");
    let ts: Vec<(i64,)> = sqlx::query_as(
        "SELECT s.ts_ms FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id
         JOIN nodes n ON n.id = g.node_id WHERE n.name = ? AND g.gpu_index = 0 ORDER BY s.ts_ms",
    )
    .bind(node)
    .fetch_all(&pool)
    .await
    .expect("times");
    pool.close().await;
    ts.into_iter().map(|t| t.0).collect()
}

async fn nodes_json(http: &str) -> Value {
    let resp = reqwest::get(format!("http://{http}/api/v1/nodes"))
        .await
        .expect("GET /api/v1/nodes");
    assert!(resp.status().is_success());
    resp.json().await.expect("JSON")
}

/// Stops every agent cleanly and checks, for each, that nothing was dropped or left
/// unacked and that the database and the API hold exactly what it sampled, once.
/// Returns the GPU samples stored in all.
async fn stop_all_and_check(agents: Vec<Child>, nodes: &[&str], db: &Path, http: &str) -> u64 {
    let mut total = 0;
    for (a, n) in agents.into_iter().zip(nodes) {
        let s = stop_agent(a, n).await;
        assert_eq!((s.dropped, s.unacked), (0, 0), "{n}: {s:?}");
        let (rows, distinct) = stored(db, n).await;
        assert_eq!(
            rows, s.sampled,
            "{n}: stored GPU samples == sampled ({s:?})"
        );
        assert_eq!(rows, distinct, "{n}: no duplicates");
        let listed = nodes_json(http).await;
        let listed = listed
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["name"] == *n)
            .cloned()
            .expect("node listed");
        assert_eq!(
            listed["stored_samples"].as_u64(),
            Some(rows),
            "{n}: API agrees"
        );
        total += rows;
    }
    total
}

fn now_ms() -> i64 {
    gpufleet_core::config::now_ms()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collector_sigkilled_three_times_loses_and_duplicates_nothing() {
    const NODES: [&str; 3] = ["fault-a", "fault-b", "fault-c"];
    const KILLS: usize = 3;
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("faults.db");
    let mut rng = Rng(0x5EED_0004);
    let mut collector = start_collector(&db, "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let (grpc, http) = (collector.grpc.clone(), collector.http.clone());
    let agents: Vec<Child> = NODES
        .iter()
        .map(|n| start_agent(&grpc, n, &dir.path().join(n), &[]))
        .collect();
    wait_stored(&http, &NODES, GPUS as u64).await;
    let started = Instant::now();
    for _ in 0..KILLS {
        tokio::time::sleep(rng.millis(300, 1200)).await;
        collector.kill().await;
        tokio::time::sleep(rng.millis(100, 800)).await;
        collector = start_collector(&db, &grpc, &http, &[]).await;
    }
    // One graceful restart under load: SIGTERM drains, commits, acks and exits in time.
    tokio::time::sleep(rng.millis(300, 800)).await;
    let t = Instant::now();
    collector.stop().await;
    let graceful = t.elapsed();
    assert!(
        graceful < Duration::from_secs(5),
        "SIGTERM took {graceful:?}"
    );
    collector = start_collector(&db, &grpc, &http, &[]).await;
    // Let every agent reconnect and deliver after the last restart.
    wait_stored(&http, &NODES, GPUS as u64).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = stop_all_and_check(agents, &NODES, &db, &http).await;
    collector.stop().await;
    eprintln!(
        "fault run: {KILLS} collector SIGKILLs + 1 SIGTERM ({} ms) over {:.1} s, {} agents, {total} GPU samples stored == sampled, 0 lost, 0 duplicates",
        graceful.as_millis(),
        started.elapsed().as_secs_f64(),
        NODES.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sigkilled_during_a_long_outage_replays_everything_it_spooled() {
    const NODE: &str = "fault-spool";
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("faults.db");
    let spool = dir.path().join("spool");
    let collector = start_collector(&db, "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let (grpc, http) = (collector.grpc.clone(), collector.http.clone());
    let agent = start_agent(&grpc, NODE, &spool, &[]);
    wait_stored(&http, &[NODE], GPUS as u64).await;

    // The collector goes away for 2.5 s: 50 intervals.
    collector.kill().await;
    let outage_from = now_ms();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The agent dies too, with 30 intervals spooled and unacked, and comes back.
    let mut agent = agent;
    agent.kill().await.expect("SIGKILL the agent");
    let agent = start_agent(&grpc, NODE, &spool, &[]);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let outage_to = now_ms();
    let collector = start_collector(&db, &grpc, &http, &[]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let s = stop_agent(agent, NODE).await;
    assert_eq!((s.dropped, s.unacked), (0, 0), "{s:?}");
    let (rows, distinct) = stored(&db, NODE).await;
    assert_eq!(
        rows, s.sampled,
        "stored == sampled across both agent runs ({s:?})"
    );
    assert_eq!(rows, distinct, "no duplicates");
    // Full replay: the outage is covered, both by the killed run's spool and the new one.
    let times = stored_times(&db, NODE).await;
    let during = times
        .iter()
        .filter(|t| (outage_from..outage_to).contains(*t))
        .count();
    // Bounds with room for a loaded machine (a slow agent restart samples fewer ticks):
    // without the spool the killed run's ticks are lost and `before_kill` is 0.
    assert!(
        during >= 20,
        "only {during} ticks of the 2.5 s outage were stored (50 at 50 ms, minus the restart)"
    );
    let before_kill = times
        .iter()
        .filter(|t| (outage_from..outage_from + 1500).contains(*t))
        .count();
    assert!(
        before_kill >= 10,
        "only {before_kill} ticks spooled by the SIGKILLed agent reached the store"
    );
    collector.stop().await;
    eprintln!(
        "agent SIGKILL in a {} ms outage: {} GPU samples sampled == stored, {during} ticks of the outage replayed",
        outage_to - outage_from,
        s.sampled
    );
}

/// An address nothing listens on (yet).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_counts_exactly_what_is_missing() {
    const NODE: &str = "fault-full";
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("faults.db");
    let (grpc, http) = (free_addr(), free_addr());
    // No collector yet: the agent spools into 16 KiB (a few dozen ticks) for 2 s.
    let agent = start_agent(
        &grpc,
        NODE,
        &dir.path().join("spool"),
        &["--spool-max-bytes", "16384", "--interval", "20ms"],
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let collector = start_collector(&db, &grpc, &http, &[]).await;
    wait_stored(&http, &[NODE], GPUS as u64).await;
    let s = stop_agent(agent, NODE).await;
    assert!(s.dropped > 0, "the spool must have overflowed: {s:?}");
    assert_eq!(s.unacked, 0, "{s:?}");
    let (rows, distinct) = stored(&db, NODE).await;
    assert_eq!(rows, distinct, "no duplicates");
    assert_eq!(
        rows,
        s.sampled - s.dropped,
        "missing == counted drops ({s:?})"
    );
    assert_eq!(rows, s.acked);
    let nodes = nodes_json(&http).await;
    let listed = &nodes[0];
    assert_eq!(
        listed["dropped_samples"].as_u64(),
        Some(s.dropped),
        "the collector shows the agent's drops: {listed}"
    );
    collector.stop().await;
    eprintln!(
        "full spool: sampled {}, dropped {}, stored {rows} == sampled - dropped",
        s.sampled, s.dropped
    );
}
