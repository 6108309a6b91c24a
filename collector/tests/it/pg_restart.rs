//! PostgreSQL restarted under load: the real collector and agent binaries on a throwaway
//! cluster of the test's own (`scripts/pg-cluster`: initdb + pg_ctl in a temp folder on a
//! free port; the system's server is never touched). While three agents stream at 50 ms,
//! the cluster is restarted (`pg_ctl restart -m fast`, which ends every connection), then
//! stopped for longer than the store's connection timeout (commits fail meanwhile and
//! batches are refused as retryable) and started again. Afterwards, per agent: stored GPU samples == sampled, no duplicates, nothing
//! dropped or left unacked; and the collector logged that the database came back.

use crate::harness::{stop_agent, wait_stored};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Child;

use crate::harness;

const GPUS: u32 = 2;

/// A throwaway cluster, stopped and deleted when dropped.
struct Cluster {
    dir: PathBuf,
    url: String,
}

fn pg_cluster(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-cluster");
    std::process::Command::new(script)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/pg-cluster")
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let dir = dir.join("pg");
        let out = pg_cluster(&["start", &dir.display().to_string()]);
        assert!(
            out.status.success(),
            "scripts/pg-cluster start failed: a throwaway PostgreSQL is needed (initdb, pg_ctl)"
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(url.starts_with("postgres://"), "{url:?}");
        Cluster { dir, url }
    }

    /// `pg-cluster restart|halt|resume`.
    fn ctl(&self, what: &str) {
        let out = pg_cluster(&[what, &self.dir.display().to_string()]);
        assert!(out.status.success(), "pg-cluster {what} failed");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = pg_cluster(&["stop", &self.dir.display().to_string()]);
    }
}

/// `(rows, distinct (gpu, ts) keys)` of GPU samples stored for `node`.
async fn stored(url: &str, node: &str) -> (u64, u64) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    let (rows, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT (s.gpu_id, s.ts_ms)) FROM gpu_samples s \
         JOIN gpus g ON g.id = s.gpu_id JOIN nodes n ON n.id = g.node_id WHERE n.name = $1",
    )
    .bind(node)
    .fetch_one(&mut conn)
    .await
    .expect("count");
    (rows as u64, distinct as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_and_stopped_during_ingest_loses_and_duplicates_nothing() {
    const NODES: [&str; 3] = ["pg-a", "pg-b", "pg-c"];
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let log_path = dir.path().join("collector.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut collector = harness::start_collector_logging(
        &cluster.url,
        "127.0.0.1:0",
        "127.0.0.1:0",
        &[],
        "info",
        Stdio::from(log),
    )
    .await;
    let (grpc, http) = (collector.grpc.clone(), collector.http.clone());
    let agents: Vec<Child> = NODES
        .iter()
        .map(|n| harness::start_sim_agent(&grpc, n, &dir.path().join(n), GPUS, &[]))
        .collect();
    wait_stored(&http, &NODES, u64::from(GPUS) * 10).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.ctl("restart");
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.ctl("halt");
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.ctl("resume");
    // Every node stores again after the last restart.
    let (before, _) = stored(&cluster.url, NODES[0]).await;
    wait_stored(&http, &NODES, before + u64::from(GPUS) * 10).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut total = 0;
    for (a, n) in agents.into_iter().zip(NODES) {
        let s = stop_agent(a, n).await;
        assert_eq!((s.dropped, s.unacked), (0, 0), "{n}: {s:?}");
        let (rows, distinct) = stored(&cluster.url, n).await;
        assert_eq!(
            rows, s.sampled,
            "{n}: stored GPU samples == sampled ({s:?})"
        );
        assert_eq!(rows, distinct, "{n}: no duplicates");
        total += rows;
    }
    harness::sigterm(&collector.child);
    let status = tokio::time::timeout(Duration::from_secs(30), collector.child.wait())
        .await
        .expect("the collector exits within 30 s of SIGTERM")
        .expect("wait");
    assert!(status.success(), "collector exit: {status}");
    let log = std::fs::read_to_string(&log_path).expect("read the log");
    assert!(
        log.contains("database is back"),
        "the collector logs the database's return:\n{log}"
    );
    eprintln!(
        "PostgreSQL restarted, then down 8 s, over {:.1} s under {} agents: {total} GPU \
         samples stored == sampled, 0 lost, 0 duplicates",
        started.elapsed().as_secs_f64(),
        NODES.len()
    );
}
