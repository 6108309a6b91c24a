//! Remote-write against a real Prometheus (Debian's `prometheus`, started with
//! `--web.enable-remote-write-receiver`; `scripts/need-deb` installs it when missing and
//! the test fails if it cannot): the real collector binary with simulated agents pushes
//! to it; the receiver is stopped and restarted mid-run, then the collector; PromQL reads
//! back that every stored sample arrived with its timestamp and value, that the workload
//! energy counters equal the store's, and that the restarted collector resumed from its
//! saved positions instead of sending everything again. Beside it: the client's headers
//! and credentials at a stand-in receiver, and two collectors on one database handing
//! the push over at its saved positions.

use crate::harness::{self, sigterm, start_sim_agent};
use gpufleet_collector::store::remote_write::{STREAM_ENERGY, STREAM_GPU};
use gpufleet_collector::store::{Store, TimeRange};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, Command};

/// Requests hold at most this many samples (the collector's default).
const MAX_SAMPLES_PER_SEND: f64 = 2_000.0;

/// A Prometheus receiving remote-write on `port`, its data kept in `dir` across restarts.
struct Prometheus {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Prometheus {
    async fn start(bin: PathBuf, dir: &Path, port: u16) -> Prometheus {
        std::fs::write(
            dir.join("prometheus.yml"),
            "global:\n  scrape_interval: 1h\n",
        )
        .expect("config");
        let mut p = Prometheus {
            bin,
            dir: dir.to_owned(),
            port,
            child: None,
        };
        p.restart().await;
        p
    }

    async fn restart(&mut self) {
        let child = Command::new(&self.bin)
            .arg(format!(
                "--config.file={}",
                self.dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .arg("--web.enable-remote-write-receiver")
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start prometheus");
        self.child = Some(child);
        let url = format!("http://127.0.0.1:{}/-/ready", self.port);
        crate::common::wait_until(
            "Prometheus to be ready",
            Duration::from_secs(60),
            async || match reqwest::get(&url).await {
                Ok(r) if r.status().is_success() => Some(()),
                _ => None,
            },
        )
        .await;
    }

    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            sigterm(&child);
            let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
                .await
                .expect("Prometheus stopped in time")
                .expect("wait");
            assert!(status.success(), "Prometheus exited with {status}");
        }
    }

    /// An instant query's result vector or matrix at `time_s`.
    async fn query(&self, promql: &str, time_s: f64) -> Vec<Value> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let v: Value = reqwest::Client::new()
            .get(url)
            .query(&[("query", promql), ("time", &format!("{time_s:.3}"))])
            .send()
            .await
            .expect("query")
            .json()
            .await
            .expect("json");
        assert_eq!(v["status"], "success", "{promql}: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

/// A GPU family's value in a stored sample, as remote-write sends it.
type FamilyValue = fn(&gpufleet_core::GpuSample) -> Option<f64>;

/// `(timestamp ms, value)` of a matrix series' samples.
fn points(series: &Value) -> Vec<(i64, f64)> {
    series["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|p| {
            let t = p[0].as_f64().expect("time");
            let v: f64 = p[1].as_str().expect("value").parse().expect("float");
            ((t * 1000.0).round() as i64, v)
        })
        .collect()
}

/// The collector's remote-write counter `name` from its /metrics.
async fn self_metric(http: &str, name: &str) -> f64 {
    let text = crate::common::scrape_metrics(http).await;
    crate::common::metric_value(&text, name)
        .unwrap_or_else(|| panic!("{name} missing from /metrics, or not a number"))
}

/// Waits until every GPU's saved position is its newest stored sample.
async fn wait_delivered(store: &Arc<dyn Store>) {
    crate::common::wait_until(
        "every stored sample to be delivered",
        Duration::from_secs(90),
        async || {
            let latest = store.latest_gpu_samples().await.ok()?;
            let nodes = store.nodes().await.ok()?;
            let saved = store.remote_write_positions(STREAM_GPU).await.ok()?;
            let uuid = |id| {
                nodes
                    .iter()
                    .flat_map(|n| &n.gpus)
                    .find(|g| g.id == id)
                    .map(|g| g.info.uuid.clone())
            };
            latest
                .iter()
                .all(|l| uuid(l.gpu).and_then(|u| saved.get(&u).copied()) == Some(l.time_ms))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_write_to_a_real_prometheus_survives_outages_and_restarts() {
    let prometheus = crate::common::prometheus_bin();
    let dir = tempfile::tempdir().expect("dir");
    let prom_port = crate::common::free_port();
    let mut prom = Prometheus::start(prometheus, dir.path(), prom_port).await;

    let db_url = format!("sqlite://{}", dir.path().join("gpufleet.db").display());
    let grpc = format!("127.0.0.1:{}", crate::common::free_port());
    let rw_url = format!("http://127.0.0.1:{prom_port}/api/v1/write");
    let flags = [
        "--remote-write-url",
        rw_url.as_str(),
        "--remote-write-interval",
        "200ms",
        "--remote-write-energy-delay",
        "20s",
    ];
    let collector = harness::start_collector(&db_url, &grpc, "127.0.0.1:0", &flags).await;
    let nodes = ["rw-node-0", "rw-node-1"];
    let agents: Vec<Child> = nodes
        .iter()
        .map(|n| {
            let spool = dir.path().join(format!("spool-{n}"));
            start_sim_agent(&grpc, n, &spool, 2, &["--interval", "100ms"])
        })
        .collect();
    harness::wait_stored(&collector.http, &nodes, 20).await;
    // Opened once the collector has migrated it (two migrating at once would clash).
    let store = gpufleet_collector::store::open(&db_url)
        .await
        .expect("open the collector's database");

    // The receiver goes away for a while, then comes back with its data.
    tokio::time::sleep(Duration::from_secs(2)).await;
    prom.stop().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        self_metric(&collector.http, "gpufleet_remote_write_retries_total").await > 0.0,
        "the pusher retried while the receiver was down"
    );
    prom.restart().await;

    // Workload energy: wait for a closed minute to be pushed, then compare each series'
    // newest value with the store's total up to that minute (no late data so far).
    let minute = crate::common::wait_until(
        "a closed energy minute to be pushed",
        Duration::from_secs(120),
        async || {
            let saved = store.remote_write_positions(STREAM_ENERGY).await.ok()?;
            let at = *saved.get("")?;
            let energy = store.workload_energy_minutes(0, at).await.ok()?;
            energy.last().map(|e| e.minute_ms)
        },
    )
    .await;
    let totals = store
        .workload_energy_totals(minute)
        .await
        .expect("energy totals");
    assert!(!totals.is_empty(), "simulated workloads used energy");
    let now_s = gpufleet_core::config::now_ms() as f64 / 1000.0;
    let series = prom
        .query("gpufleet_workload_energy_joules_total[15m]", now_s)
        .await;
    let mut compared = 0;
    for t in &totals {
        for (state, mj) in [("active", t.active_mj), ("idle", t.idle_mj)] {
            let s = series
                .iter()
                .find(|s| {
                    s["metric"]["workload"] == t.workload.key()
                        && s["metric"]["node"] == t.node
                        && s["metric"]["state"] == state
                })
                .unwrap_or_else(|| panic!("no energy series for {} {state}", t.workload.key()));
            let at_minute_end = points(s).into_iter().find(|(ts, _)| *ts == minute + 60_000);
            if let Some((_, joules)) = at_minute_end {
                assert_eq!(joules, mj as f64 / 1000.0, "{} {state}", t.workload.key());
                compared += 1;
            }
        }
    }
    assert!(compared > 0, "the newest pushed minute had workloads");

    // The collector restarts; the agents keep sampling into their spools meanwhile.
    let sent_before =
        self_metric(&collector.http, "gpufleet_remote_write_sent_samples_total").await;
    sigterm(&collector.child);
    harness::wait_stdout(collector.child, "collector").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let collector = harness::start_collector(&db_url, &grpc, "127.0.0.1:0", &flags).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    harness::stop_agents(agents, &nodes).await;
    wait_delivered(&store).await;
    let sent_after = self_metric(&collector.http, "gpufleet_remote_write_sent_samples_total").await;
    let failed = self_metric(
        &collector.http,
        "gpufleet_remote_write_failed_samples_total",
    )
    .await;
    assert_eq!(failed, 0.0, "nothing refused");

    // Every stored sample arrived, timestamp and value.
    let now_s = gpufleet_core::config::now_ms() as f64 / 1000.0;
    let mut gpus = 0;
    for node in store.nodes().await.expect("nodes") {
        for gpu in &node.gpus {
            let range = TimeRange {
                from_ms: 0,
                to_ms: i64::MAX,
            };
            let stored = store
                .gpu_samples(gpu.id, range, 1_000_000)
                .await
                .expect("samples");
            assert!(
                stored.len() > 50,
                "{}: {} samples",
                gpu.info.uuid,
                stored.len()
            );
            let want = |f: FamilyValue| -> Vec<(i64, f64)> {
                stored
                    .iter()
                    .filter_map(|(t, s)| f(s).map(|v| (*t, v)))
                    .collect()
            };
            let checks: [(&str, FamilyValue); 2] = [
                ("gpufleet_gpu_power_watts", |s| {
                    s.power_mw.map(|mw| f64::from(mw) / 1000.0)
                }),
                ("gpufleet_gpu_utilization_ratio", |s| {
                    s.util_gpu_pct.map(|p| f64::from(p) / 100.0)
                }),
            ];
            for (name, value) in checks {
                let q = format!(
                    "{name}{{uuid=\"{}\",node=\"{}\"}}[1h]",
                    gpu.info.uuid, node.name
                );
                let got = prom.query(&q, now_s).await;
                assert_eq!(got.len(), 1, "{q}");
                assert_eq!(got[0]["metric"]["gpu"], gpu.info.index.to_string());
                let expected = want(value);
                assert!(!expected.is_empty(), "{name} present in the simulation");
                let received = points(&got[0]);
                assert_eq!(
                    received.len(),
                    expected.len(),
                    "{q}: every stored sample, no more"
                );
                assert_eq!(received, expected, "{q}");
            }
            gpus += 1;
        }
    }
    assert_eq!(gpus, 4);

    // No flood: what both collectors sent is what Prometheus holds, plus at most the
    // request in flight when the first one stopped (sent again by the second).
    let held: usize = prom
        .query("{__name__=~\"gpufleet_.+\"}[1h]", now_s)
        .await
        .iter()
        .map(|s| points(s).len())
        .sum();
    let held = held as f64;
    let sent = sent_before + sent_after;
    assert!(
        sent >= held && sent <= held + MAX_SAMPLES_PER_SEND * 2.0,
        "sent {sent} (before the restart {sent_before}, after {sent_after}), Prometheus holds {held}"
    );
    eprintln!(
        "remote-write: {held} samples in Prometheus; sent {sent_before} before the restart and {sent_after} after"
    );

    sigterm(&collector.child);
    harness::wait_stdout(collector.child, "collector").await;
    prom.stop().await;
    store.close().await;
}

/// The client's requests carry the spec's headers, the credentials it was given, and a
/// snappy-compressed protobuf body (a stand-in receiver records them).
#[tokio::test]
async fn the_client_sends_the_spec_headers_and_credentials() {
    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode};
    use gpufleet_collector::remote_write::encode;
    use gpufleet_collector::remote_write::{Auth, Delivery, HttpSink, Sink};
    use gpufleet_proto::prometheus::{Label, Sample, TimeSeries, WriteRequest};
    use std::sync::Mutex;

    type Seen = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;
    let seen: Seen = Arc::default();
    let app = axum::Router::new().route(
        "/api/v1/write",
        axum::routing::post({
            let seen = Arc::clone(&seen);
            move |headers: HeaderMap, body: Bytes| async move {
                seen.lock().expect("lock").push((headers, body));
                StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let url = format!("http://{addr}/api/v1/write");
    let request = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![Label {
                name: "__name__".into(),
                value: "gpufleet_gpu_power_watts".into(),
            }],
            samples: vec![Sample {
                value: 250.5,
                timestamp: 1_000,
            }],
        }],
    };
    let basic = Auth::Basic {
        user: "gpufleet".into(),
        password: "pw".into(),
    };
    for auth in [basic, Auth::Bearer("tok".into())] {
        let sink = HttpSink::new(&url, auth, None, Duration::from_secs(10)).expect("client");
        assert_eq!(sink.send(encode::encode(&request)).await, Delivery::Sent);
    }
    server.abort();

    let seen = seen.lock().expect("lock");
    assert_eq!(seen.len(), 2);
    for (headers, body) in seen.iter() {
        let h = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        assert_eq!(h("content-encoding"), "snappy");
        assert_eq!(h("content-type"), "application/x-protobuf");
        assert_eq!(h("x-prometheus-remote-write-version"), "0.1.0");
        assert!(h("user-agent").starts_with("gpufleet-collector/"));
        assert_eq!(encode::decode(body).expect("decodes"), request);
    }
    let auth = |i: usize| seen[i].0.get("authorization").and_then(|v| v.to_str().ok());
    // base64("gpufleet:pw")
    assert_eq!(auth(0), Some("Basic Z3B1ZmxlZXQ6cHc="));
    assert_eq!(auth(1), Some("Bearer tok"));
}

/// A receiver in memory: the power samples it was sent, per GPU UUID.
#[derive(Debug, Default)]
struct Recorder(std::sync::Mutex<BTreeMap<String, Vec<i64>>>);

#[async_trait::async_trait]
impl gpufleet_collector::remote_write::Sink for Recorder {
    async fn send(&self, body: Vec<u8>) -> gpufleet_collector::remote_write::Delivery {
        let request = gpufleet_collector::remote_write::encode::decode(&body).expect("decodes");
        let mut seen = self.0.lock().expect("lock");
        for ts in request.timeseries {
            let label = |name: &str| {
                ts.labels
                    .iter()
                    .find(|l| l.name == name)
                    .map(|l| l.value.clone())
            };
            if label("__name__").as_deref() == Some("gpufleet_gpu_power_watts")
                && let Some(uuid) = label("uuid")
            {
                seen.entry(uuid)
                    .or_default()
                    .extend(ts.samples.iter().map(|s| s.timestamp));
            }
        }
        gpufleet_collector::remote_write::Delivery::Sent
    }
}

/// Two collectors on one database: one pushes (the `remote-write` lease); when it stops,
/// the other takes over from the saved positions, sending only what is new.
#[tokio::test]
async fn the_other_collector_takes_over_from_the_saved_positions() {
    use crate::common::{register_gpus, tick, wait_until, write_ticks};
    use gpufleet_collector::remote_write::RemoteWriteOptions;
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("g.db").display());
    let start = async |sink: Arc<Recorder>| {
        let store = gpufleet_collector::store::open(&url).await.expect("open");
        let mut rw = RemoteWriteOptions::new(sink);
        rw.interval = Duration::from_millis(20);
        let options = gpufleet_collector::ServeOptions {
            remote_write: Some(rw),
            lead: gpufleet_collector::accounting::leader::LeadOptions {
                retry: Duration::from_millis(20),
            },
            ..Default::default()
        };
        let bind = async || {
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind")
        };
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(gpufleet_collector::serve_with_store(
            Arc::clone(&store),
            options,
            bind().await,
            bind().await,
            shutdown.clone(),
        ));
        (store, shutdown, task)
    };
    let (a_sink, b_sink) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
    let (store, a_stop, a_task) = start(Arc::clone(&a_sink)).await;
    let now = gpufleet_core::config::now_ms();
    let gpus = ["GPU-rw-0", "GPU-rw-1"];
    let node = register_gpus(&store, "rw-node", &gpus, now).await;
    let ticks = |from: i64, n: i64| -> Vec<gpufleet_core::Tick> {
        (0..n)
            .map(|i| tick(from + i * 100, &gpus, i as u32))
            .collect()
    };
    write_ticks(&store, &node, 1, ticks(now - 10_000, 50)).await;
    let first: Vec<i64> = (0..50).map(|i| now - 10_000 + i * 100).collect();
    wait_until(
        "the first collector to push and save",
        Duration::from_secs(30),
        async || {
            let saved = store.remote_write_positions(STREAM_GPU).await.ok()?;
            gpus.iter()
                .all(|g| saved.get(*g) == first.last())
                .then_some(())
        },
    )
    .await;
    let (_b_store, b_stop, b_task) = start(Arc::clone(&b_sink)).await;
    a_stop.cancel();
    a_task.await.expect("join").expect("clean stop");

    write_ticks(&store, &node, 2, ticks(now - 5_000, 30)).await;
    let second: Vec<i64> = (0..30).map(|i| now - 5_000 + i * 100).collect();
    let b_seen = wait_until(
        "the second collector to push",
        Duration::from_secs(30),
        async || {
            let seen = b_sink.0.lock().expect("lock").clone();
            gpus.iter()
                .all(|g| {
                    seen.get(*g)
                        .is_some_and(|s| s.contains(&second[second.len() - 1]))
                })
                .then_some(seen)
        },
    )
    .await;
    let a_seen = a_sink.0.lock().expect("lock").clone();
    for g in gpus {
        assert_eq!(a_seen.get(g), Some(&first), "{g}: the leader sent batch 1");
        assert_eq!(
            b_seen.get(g),
            Some(&second),
            "{g}: its successor only batch 2"
        );
    }
    b_stop.cancel();
    b_task.await.expect("join").expect("clean stop");
}
