//! A real Prometheus (Debian's package, installed by `scripts/need-deb` when missing; the
//! test fails when it cannot be had) scraping a demo collector every second, read back
//! through its HTTP API:
//! - a GPU's power in Prometheus equals the collector's latest value;
//! - a workload's `gpufleet_workload_energy_joules_total` equals what
//!   `/api/v1/containers/{key}` says it spent since the counters' start (exactly, once a
//!   scrape has caught up), and its `increase()` over 30 s matches the API's figure for
//!   the stretch within the counter's lag and step (a scrape, a refresh, an accountant
//!   pass);
//! - every PromQL expression of `deploy/grafana/gpufleet.json` parses and evaluates
//!   without error, its template variables substituted.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Prometheus' scrape interval here, and the collector's counter refresh.
const SCRAPE_S: f64 = 1.0;
const REFRESH_S: f64 = 1.0;
/// The energy accountant's period (its default): the counter moves in steps this long.
const ACCOUNTANT_S: f64 = 5.0;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the collector crate sits in the workspace")
        .to_path_buf()
}

/// `gpufleet-collector demo` on ephemeral ports; returns it and its HTTP address.
async fn start_demo() -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpufleet-collector"))
        .args(["demo", "--nodes", "2", "--gpus-per-node", "2"])
        .args(["--http-listen", "127.0.0.1:0", "--history", "0s"])
        .args(["--interval", "2s", "--metrics-refresh", "1s"])
        .env("GPUFLEET_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-collector demo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let http = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read the demo's stdout") {
            if let Some(http) = line
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix("http="))
            {
                return http.to_owned();
            }
        }
        panic!("the demo ended before printing its address");
    })
    .await
    .expect("the demo printed its address in time");
    (child, http)
}

async fn start_prometheus(dir: &Path, target: &str) -> (Child, String) {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n\
             scrape_configs:\n  - job_name: gpufleet\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let listen = format!("127.0.0.1:{}", crate::common::free_port());
    let child = Command::new(crate::common::prometheus_bin())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    (child, listen)
}

async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// Runs a PromQL instant query (at `time`, default now); the answer's `data.result`.
async fn query(client: &reqwest::Client, prom: &str, q: &str, time: Option<f64>) -> Value {
    let mut params = vec![("query", q.to_owned())];
    if let Some(t) = time {
        params.push(("time", format!("{t:.3}")));
    }
    let v: Value = client
        .get(format!("http://{prom}/api/v1/query"))
        .query(&params)
        .send()
        .await
        .expect("query prometheus")
        .json()
        .await
        .expect("prometheus answers JSON");
    assert_eq!(v["status"], "success", "query {q:?} failed: {v}");
    v["data"]["result"].clone()
}

/// The value of a one-element vector result.
fn scalar(result: &Value) -> Option<f64> {
    result.get(0)?["value"][1].as_str()?.parse().ok()
}

/// Polls `f` until it answers `Some`, or panics after `limit`.
async fn poll<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A workload's energy (J) per `/api/v1/containers/{key}` from `from_ms` to now.
async fn api_energy(client: &reqwest::Client, http: &str, key: &str, from_ms: i64) -> f64 {
    let v = get_json(
        client,
        &format!("http://{http}/api/v1/containers/{key}?from={from_ms}&to=now"),
    )
    .await;
    v["energy_j"].as_f64().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_collector_and_the_dashboard_queries_work() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_demo, http) = start_demo().await;
    let (_prom, prom) = start_prometheus(dir.path(), &http).await;
    let client = reqwest::Client::new();
    let limit = Duration::from_secs(120);

    // Prometheus is up and its scrapes of the collector succeed (`up` is 1).
    poll("Prometheus to scrape the collector", limit, || async {
        let ready = client
            .get(format!("http://{prom}/-/ready"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if !ready {
            return None;
        }
        let up = query(&client, &prom, "up{job=\"gpufleet\"}", None).await;
        (scalar(&up) == Some(1.0)).then_some(())
    })
    .await;

    // 1. A GPU's power in Prometheus is the collector's latest value: read the collector,
    //    Prometheus, and the collector again; they agree once a scrape has caught up.
    let nodes = get_json(&client, &format!("http://{http}/api/v1/nodes")).await;
    let node = nodes[0]["name"].as_str().expect("a node").to_owned();
    let latest = |nodes: &Value| -> Option<f64> {
        let n = nodes
            .as_array()?
            .iter()
            .find(|n| n["name"] == node.as_str())?;
        let gpu = n["gpus"].as_array()?.iter().find(|g| g["index"] == 0)?;
        Some(gpu["latest"]["power_mw"].as_f64()? / 1000.0)
    };
    let (collector_w, prom_w) = poll("Prometheus to hold the latest power", limit, || async {
        let before = latest(&get_json(&client, &format!("http://{http}/api/v1/nodes")).await)?;
        let q = format!("gpufleet_gpu_power_watts{{node=\"{node}\",gpu=\"0\"}}");
        let p = scalar(&query(&client, &prom, &q, None).await)?;
        let after = latest(&get_json(&client, &format!("http://{http}/api/v1/nodes")).await)?;
        (before == after && (p - after).abs() < 1e-9).then_some((after, p))
    })
    .await;
    assert_eq!(collector_w, prom_w);

    // A Slurm workload's job id reaches Prometheus as `exported_job` (its `job` is the
    // scrape job's), which is what the dashboard groups by.
    let slurm = poll("a Slurm workload in Prometheus", limit, || async {
        let q = "gpufleet_workload_energy_joules_total{kind=\"slurm\"}";
        let r = query(&client, &prom, q, None).await;
        r.as_array()?.first().map(|s| s["metric"].clone())
    })
    .await;
    assert_eq!(slurm["job"], "gpufleet", "{slurm}");
    assert_eq!(
        slurm["workload"].as_str(),
        slurm["exported_job"]
            .as_str()
            .map(|j| format!("slurm:{j}"))
            .as_deref(),
        "{slurm}"
    );

    // 2. Workload energy: the counter's increase over a stretch matches the API's figure
    //    for the same stretch.
    let since_ms = poll("the workload counters to start", limit, || async {
        let r = query(
            &client,
            &prom,
            "gpufleet_workload_counters_start_timestamp_seconds",
            None,
        )
        .await;
        scalar(&r).map(|s| (s * 1000.0).round() as i64)
    })
    .await;
    let key = poll("a workload with energy", limit, || async {
        let q = "topk(1, sum by (workload) (gpufleet_workload_energy_joules_total)) > 0";
        let r = query(&client, &prom, q, None).await;
        r.get(0)?["metric"]["workload"].as_str().map(str::to_owned)
    })
    .await;
    // 2a. The counter equals the API's figure since the counters' start: the API moves in
    //     the accountant's steps, and between two steps (API read before and after the
    //     query unchanged) the scraped counter catches up with it exactly.
    let counter_q = format!("sum(gpufleet_workload_energy_joules_total{{workload=\"{key}\"}})");
    let (counter, api) = poll("the counter to equal the API", limit, || async {
        let before = api_energy(&client, &http, &key, since_ms).await;
        let counter = scalar(&query(&client, &prom, &counter_q, None).await)?;
        let after = api_energy(&client, &http, &key, since_ms).await;
        (before == after && (counter - after).abs() <= 0.01).then_some((counter, after))
    })
    .await;
    eprintln!("workload {key}: counter {counter:.1} J, API since the counters' start {api:.1} J");

    // 2b. Its increase() over a stretch matches what the API says was spent over it.
    let mut last = String::new();
    let mut matched = false;
    for _ in 0..3 {
        let t1 = now_s();
        let a1 = api_energy(&client, &http, &key, since_ms).await;
        // The stretch measured (not a synchronisation wait).
        tokio::time::sleep(Duration::from_secs(30)).await;
        let a2 = api_energy(&client, &http, &key, since_ms).await;
        let t2 = now_s();
        let window = (t2 - t1).ceil();
        let q = format!(
            "sum(increase(gpufleet_workload_energy_joules_total{{workload=\"{key}\"}}[{window}s]))"
        );
        let inc = scalar(&query(&client, &prom, &q, Some(t2)).await).unwrap_or(f64::NAN);
        let spent = a2 - a1;
        let rate = spent / window;
        // The counter lags by up to a scrape and a refresh, and moves in the accountant's
        // steps (increase() extrapolates from the samples inside the window).
        let tolerance = rate * (SCRAPE_S + REFRESH_S + ACCOUNTANT_S);
        last = format!(
            "workload {key}: increase() {inc:.1} J vs API {spent:.1} J over {window} s \
             (tolerance {tolerance:.1} J)"
        );
        eprintln!("{last}");
        if spent > 0.0 && (inc - spent).abs() <= tolerance {
            matched = true;
            break;
        }
    }
    assert!(matched, "{last}");

    // 3. Every PromQL expression of the Grafana dashboard evaluates without error.
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/grafana/gpufleet.json"))
            .expect("read deploy/grafana/gpufleet.json"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dash, &mut exprs);
    assert!(exprs.len() >= 20, "dashboard queries found: {exprs:?}");
    let mut with_data = 0;
    for e in &exprs {
        let q = e
            .replace("$__rate_interval", "1m")
            .replace("$__interval", "15s")
            .replace("$__range", "5m")
            .replace("$node", &node)
            .replace("$gpu", "0");
        let r = query(&client, &prom, &q, None).await;
        if r.as_array().is_some_and(|a| !a.is_empty()) {
            with_data += 1;
        }
    }
    eprintln!(
        "{} dashboard queries evaluated, {with_data} with data",
        exprs.len()
    );
}

/// Every `expr` of the dashboard's panels, and its variables' `label_values(SELECTOR, l)`
/// selectors.
fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    ("definition", Value::String(s)) => {
                        if let Some(inner) = s
                            .strip_prefix("label_values(")
                            .and_then(|r| r.rsplit_once(','))
                        {
                            out.push(inner.0.to_owned());
                        }
                    }
                    _ => collect_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}
