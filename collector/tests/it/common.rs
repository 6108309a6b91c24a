//! Fixtures shared by the collector's integration tests: temporary stores (SQLite, a
//! PostgreSQL schema), inventories, samples and batches with every field set (and with most
//! fields absent), an in-process collector with agent streams to it, the API called without
//! a socket, and `wait_until`.

use gpufleet_collector::store::{self, NodeBatch, NodeRecord, Store};
use gpufleet_core::wire::HelloInfo;
use gpufleet_core::*;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A fixed instant for store tests (2027-01-15).
pub const T0: UnixMs = 1_800_000_000_000;

/// A temporary SQLite store; keep the `TempDir` alive as long as the store.
/// A store in a temporary SQLite file. Like [`pg_store`]'s, it packs nothing as it
/// arrives ([`IngestWrites::set_arrival_clock`]): tests write at [`T0`], which the wall
/// clock would one day close; tests of packing on arrival set a clock of their own.
pub async fn sqlite_store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("test.db").display());
    let store = store::open(&url).await.expect("open sqlite store");
    store.set_arrival_clock(None);
    (dir, store)
}

/// The PostgreSQL server tests use: `GPUFLEET_TEST_PG_URL`, by default the local one
/// (`scripts/test` starts a throwaway cluster when none answers there).
pub fn pg_url() -> String {
    std::env::var("GPUFLEET_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A schema of its own on the test PostgreSQL server, dropped (with everything in it) when
/// the guard is dropped. Panics, naming the URL, when the server cannot be reached: a
/// missing server fails the tests rather than skipping them.
pub struct PgSchema {
    /// The server URL without a schema.
    pub base_url: String,
    pub name: String,
}

impl PgSchema {
    pub async fn create() -> PgSchema {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let base_url = pg_url();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "t_{}_{}_{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = pg_connect(&base_url).await;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await
            .expect("create a test schema");
        PgSchema { base_url, name }
    }

    /// The URL of the schema: every connection's search_path is the schema.
    pub fn url(&self) -> String {
        let sep = if self.base_url.contains('?') {
            '&'
        } else {
            '?'
        };
        format!(
            "{}{sep}options=-c%20search_path%3D{}",
            self.base_url, self.name
        )
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, name) = (self.base_url.clone(), self.name.clone());
        // A test that panicked may leave a pooled connection inside a transaction whose
        // rollback would run on the runtime this drop is blocking: the DROP would wait for
        // its locks for ever. Give up after a while then (the schema stays, the test has
        // failed anyway) instead of hanging the run.
        // A passing test that left a transaction open fails here, loudly, too.
        let limit = if std::thread::panicking() {
            "SET lock_timeout = '5s'; "
        } else {
            "SET lock_timeout = '60s'; "
        };
        // Drop runs inside the test's runtime: do the async work on a thread of its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut conn = pg_connect(&url).await;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "{limit}DROP SCHEMA IF EXISTS {name} CASCADE"
                )))
                .execute(&mut conn)
                .await
                .map(|_| ())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) && !std::thread::panicking() {
            panic!("could not drop test schema {}", self.name);
        }
    }
}

/// One connection to the test server; panics with what to do when there is none.
pub async fn pg_connect(url: &str) -> sqlx::PgConnection {
    use sqlx::Connection;
    match sqlx::PgConnection::connect(url).await {
        Ok(conn) => conn,
        Err(e) => panic!(
            "cannot connect to the test PostgreSQL at {}: {e}. Start one (scripts/test does) \
             or point GPUFLEET_TEST_PG_URL at one.",
            store::redact_url(url)
        ),
    }
}

/// A PostgreSQL store in a fresh schema; keep the guard alive as long as the store.
pub async fn pg_store() -> (PgSchema, Arc<dyn Store>) {
    let schema = PgSchema::create().await;
    let store = store::open(&schema.url())
        .await
        .expect("open PostgreSQL store");
    store.set_arrival_clock(None);
    (schema, store)
}

pub fn hello(node: &str) -> HelloInfo {
    HelloInfo {
        node: node.into(),
        agent_version: "0.1.0-test".into(),
        boot_id: "boot-1".into(),
        labels: BTreeMap::from([("rack".into(), "r1".into()), ("site".into(), "lab".into())]),
        interval_ms: 1000,
        source: "simulator".into(),
    }
}

/// A GPU with every inventory fact known (index `i`).
pub fn gpu_info_full(uuid: &str, index: u32) -> GpuInfo {
    GpuInfo {
        index,
        uuid: uuid.into(),
        name: "NVIDIA H100 80GB HBM3".into(),
        serial: Some(format!("SN{index}")),
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + index)),
        architecture: Some("Hopper".into()),
        brand: Some("NVIDIA".into()),
        memory_total_bytes: Some(85_899_345_920),
        power_limit_default_mw: Some(700_000),
        power_limit_enforced_mw: Some(650_000),
        power_limit_min_mw: Some(200_000),
        power_limit_max_mw: Some(700_000),
        max_clock_sm_mhz: Some(1980),
        max_clock_mem_mhz: Some(2619),
        max_clock_graphics_mhz: Some(1980),
        nvlink_count: Some(18),
        mig_enabled: Some(true),
        compute_mode: Some("Default".into()),
        persistence_mode: Some(false),
        cuda_capability_major: Some(9),
        cuda_capability_minor: Some(0),
        pcie_link_gen_max: Some(5),
        pcie_link_width_max: Some(16),
        vbios_version: Some("96.00.89.00.01".into()),
        mig_instances: vec![MigInstance {
            uuid: format!("MIG-{uuid}-1"),
            gpu_instance_id: 1,
            compute_instance_id: 0,
            profile: Some("1g.10gb".into()),
            memory_total_bytes: None,
        }],
        temp_slowdown_c: Some(87),
        temp_shutdown_c: Some(92),
        temp_gpu_max_c: Some(85),
        temp_mem_max_c: Some(95),
    }
}

/// A GPU about which nothing optional is known.
pub fn gpu_info_sparse(uuid: &str, index: u32) -> GpuInfo {
    GpuInfo {
        index,
        uuid: uuid.into(),
        name: "Tesla K80".into(),
        ..Default::default()
    }
}

pub fn inventory(gpus: Vec<GpuInfo>) -> Inventory {
    Inventory {
        driver_version: Some("550.54.15".into()),
        cuda_driver_version: Some("12.4".into()),
        nvml_version: None,
        gpus,
        host: HostInfo {
            hostname: "node-a.example".into(),
            kernel: Some("6.8.0".into()),
            os: None,
            cpu_count: Some(64),
            memory_total_bytes: Some(512 << 30),
        },
    }
}

/// A GPU sample with every metric set; `k` varies the values.
pub fn gpu_sample_full(uuid: &str, k: u32) -> GpuSample {
    GpuSample {
        gpu_uuid: uuid.into(),
        util_gpu_pct: Some(k % 101),
        util_mem_pct: Some((k * 3) % 101),
        mem_used_bytes: Some(40_000_000_000 + u64::from(k)),
        mem_total_bytes: Some(85_899_345_920),
        mem_reserved_bytes: Some(500_000_000),
        power_mw: Some(250_000 + k),
        power_instant_mw: Some(260_000 + k),
        power_limit_mw: Some(650_000),
        energy_mj: Some(123_456_789_000 + u64::from(k) * 250),
        temp_gpu_c: Some(65),
        temp_mem_c: Some(70),
        fan_pct: Some(0),
        clock_sm_mhz: Some(1755),
        clock_mem_mhz: Some(2619),
        clock_graphics_mhz: Some(1755),
        pstate: Some(0),
        pcie_tx_bps: Some(1_200_000_000),
        pcie_rx_bps: Some(800_000_000),
        nvlink_tx_bps: Some(90_000_000_000),
        nvlink_rx_bps: Some(88_000_000_000),
        nvlinks: vec![
            NvLinkSample {
                link: 0,
                tx_bps: Some(25_000_000_000),
                rx_bps: Some(24_000_000_000),
            },
            NvLinkSample {
                link: 1,
                tx_bps: None,
                rx_bps: Some(1),
            },
        ],
        ecc_corrected_volatile: Some(0),
        ecc_uncorrected_volatile: Some(u64::MAX), // extreme u64 survives the round trip
        throttle_reasons: Some(0x4),
        enc_util_pct: Some(0),
        dec_util_pct: Some(12),
        gpm: GpmMetrics {
            sm_active_cpct: Some(9_000 + k % 1000),
            sm_occupancy_cpct: Some(4_500),
            tensor_active_cpct: Some(0), // a present 0 stays 0
            tensor_hmma_cpct: Some(5_900),
            tensor_imma_cpct: None,
            tensor_dfma_cpct: Some(1),
            dram_bw_cpct: Some(10_000),
            fp64_cpct: Some(2),
            fp32_cpct: Some(2_000),
            fp16_cpct: Some(3_500),
            pcie_tx_bps: Some(1_100_000_000),
            pcie_rx_bps: Some(5_000_000_000_000),
            nvlink_tx_bps: Some(0),
            nvlink_rx_bps: None,
        },
        mig_gpm: vec![MigGpm {
            mig_uuid: "MIG-4b1e7c52-0000-5000-8000-000000000001".into(),
            gpu_instance_id: 1,
            gpm: GpmMetrics {
                tensor_active_cpct: Some(6_100 + k % 100),
                ..GpmMetrics::default()
            },
        }],
    }
}

/// A GPU sample where only utilization and power are known: the rest must stay absent.
pub fn gpu_sample_sparse(uuid: &str, k: u32) -> GpuSample {
    GpuSample {
        gpu_uuid: uuid.into(),
        util_gpu_pct: Some(k % 101),
        power_mw: Some(60_000 + k),
        ..Default::default()
    }
}

pub fn container_workload(id: &str, name: Option<&str>) -> Workload {
    Workload {
        kind: WorkloadKind::Container,
        runtime: "containerd".into(),
        container_id: Some(id.into()),
        pod_uid: Some("0f7c2a8e-1111-2222-3333-444455556666".into()),
        qos: Some("burstable".into()),
        container_name: name.map(Into::into),
        image: name.map(|_| "nvcr.io/nvidia/pytorch:24.01-py3".into()),
        pod_name: name.map(|_| "trainer-0".into()),
        namespace: name.map(|_| "ml".into()),
        ..Default::default()
    }
}

pub fn host_workload(uid: u32) -> Workload {
    Workload {
        kind: WorkloadKind::Host,
        runtime: String::new(),
        uid: Some(uid),
        ..Default::default()
    }
}

/// A tick at `time_ms` with one sample per GPU (full for the first, sparse for the
/// rest), processes, host metrics, cost and events.
pub fn tick(time_ms: UnixMs, gpus: &[&str], k: u32) -> Tick {
    let samples = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            if i == 0 {
                gpu_sample_full(g, k)
            } else {
                gpu_sample_sparse(g, k)
            }
        })
        .collect();
    let mut processes = vec![ProcessSample {
        gpu_uuid: gpus[0].into(),
        pid: 4242,
        process_type: ProcessType::Compute,
        user: Some("alice".into()),
        command: Some("python train.py --epochs 3".into()),
        gpu_mem_bytes: Some(30_000_000_000),
        sm_util_pct: Some(80),
        mem_util_pct: Some(40),
        enc_util_pct: None,
        dec_util_pct: None,
        workload: container_workload(&"ab".repeat(32), Some("trainer")),
        mig_uuid: None,
    }];
    if let Some(g) = gpus.get(1) {
        processes.push(ProcessSample {
            gpu_uuid: (*g).into(),
            pid: 777,
            process_type: ProcessType::ComputeAndGraphics,
            user: None,
            command: None,
            gpu_mem_bytes: None,
            sm_util_pct: None,
            mem_util_pct: None,
            enc_util_pct: None,
            dec_util_pct: None,
            workload: host_workload(1001),
            mig_uuid: Some("MIG-x".into()),
        });
    }
    Tick {
        time_ms,
        gpus: samples,
        processes,
        host: Some(HostSample {
            cpu_util_pct: Some(12.5),
            mem_used_bytes: Some(100 << 30),
            mem_total_bytes: Some(512 << 30),
            disk_read_bps: None,
            disk_write_bps: Some(1_000_000),
            net_rx_bps: Some(2_000),
            net_tx_bps: Some(3_000),
            load1: Some(3.25),
        }),
        events: vec![],
        cost: Some(SamplerCost {
            cpu_us: Some(150),
            wall_us: Some(900),
            source_us: None,
            slowest_calls_us: BTreeMap::from([("nvmlDeviceGetPowerUsage".into(), 120)]),
        }),
        health: Vec::new(),
        // Shown live, never stored: a tick read back has none.
        name_failures: Vec::new(),
    }
}

/// A health sample with every counter known (values vary with `k`; flags set when `k` is
/// odd, so both `true` and `false` are stored).
pub fn health_full(uuid: &str, k: u32) -> GpuHealthSample {
    let odd = k % 2 == 1;
    GpuHealthSample {
        gpu_uuid: uuid.into(),
        retired_pages_sbe: Some(k),
        retired_pages_dbe: Some(0),
        retired_pages_pending: Some(odd),
        remapped_rows_correctable: Some(2 + k),
        remapped_rows_uncorrectable: Some(k),
        remapped_rows_pending: Some(!odd),
        remapped_rows_failed: Some(odd),
        ecc_corrected_aggregate: Some(1 << 40),
        ecc_uncorrected_aggregate: Some(u64::from(k)),
        pcie_replay_count: Some((1 << 53) - 1),
        nvlink_crc_errors: Some(7),
        nvlink_replay_errors: Some(0),
        nvlink_recovery_errors: Some(1),
        persistence_mode: Some(!odd),
    }
}

/// A health sample of a GPU that supports none of the health counters.
pub fn health_sparse(uuid: &str) -> GpuHealthSample {
    GpuHealthSample {
        gpu_uuid: uuid.into(),
        ..Default::default()
    }
}

/// A batch of `ticks` ticks, one second apart from `start_ms`.
pub fn batch(seq: u64, start_ms: UnixMs, ticks: u32, gpus: &[&str]) -> Batch {
    Batch {
        seq,
        ticks: (0..ticks)
            .map(|i| tick(start_ms + i64::from(i) * 1000, gpus, i))
            .collect(),
        delivery: DeliveryStats {
            dropped_samples: seq * 10,
            spool_backlog_batches: seq,
            spool_backlog_bytes: seq * 1000,
        },
    }
}

pub fn node_batch(record: &NodeRecord, batch: Batch) -> NodeBatch {
    NodeBatch {
        keys: Arc::new(record.keys()),
        batch,
    }
}

/// A collector (`serve_with_store`) on loopback ports with a temporary SQLite store.
pub struct TestCollector {
    pub _dir: tempfile::TempDir,
    pub store: Arc<dyn Store>,
    pub grpc: std::net::SocketAddr,
    pub http: std::net::SocketAddr,
    pub shutdown: tokio_util::sync::CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), gpufleet_collector::ServeError>>,
}

/// Starts a collector with `options` on 127.0.0.1:0 (gRPC and HTTP).
pub async fn start_collector(options: gpufleet_collector::ServeOptions) -> TestCollector {
    start_collector_on(options, "127.0.0.1:0").await
}

/// Starts a collector with `options`, both listeners bound to `addr` (port 0: a free one).
pub async fn start_collector_on(
    options: gpufleet_collector::ServeOptions,
    addr: &str,
) -> TestCollector {
    let (dir, store) = sqlite_store().await;
    let grpc = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind grpc");
    let http = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind http");
    let grpc_addr = grpc.local_addr().expect("grpc addr");
    let http_addr = http.local_addr().expect("http addr");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(gpufleet_collector::serve_with_store(
        Arc::clone(&store),
        options,
        grpc,
        http,
        shutdown.clone(),
    ));
    TestCollector {
        _dir: dir,
        store,
        grpc: grpc_addr,
        http: http_addr,
        shutdown,
        task,
    }
}

impl TestCollector {
    /// The names of the stored nodes.
    pub async fn node_names(&self) -> Vec<String> {
        let nodes = self.store.nodes().await.expect("nodes");
        nodes.into_iter().map(|n| n.name).collect()
    }

    /// Stops the collector and checks that it shut down cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let r = tokio::time::timeout(std::time::Duration::from_secs(20), self.task)
            .await
            .expect("collector stops")
            .expect("join");
        r.expect("clean shutdown");
    }
}

/// One agent's stream to a [`TestCollector`]: what it sends and what it is answered.
pub struct AgentStream {
    pub tx: tokio::sync::mpsc::Sender<gpufleet_proto::v1::AgentMessage>,
    pub rx: tonic::Streaming<gpufleet_proto::v1::CollectorMessage>,
    pub welcome: gpufleet_proto::v1::Welcome,
}

/// Opens a stream with `token` (a bearer credential) and says Hello as `node` with `gpus`:
/// the stream after its Welcome, or the status the stream was refused with.
pub async fn open_stream(
    c: &TestCollector,
    token: Option<&str>,
    node: &str,
    gpus: &[&str],
) -> Result<AgentStream, tonic::Status> {
    use gpufleet_proto::v1::collector_message::Msg;
    let mut client =
        gpufleet_proto::v1::ingest_client::IngestClient::connect(format!("http://{}", c.grpc))
            .await
            .expect("connect");
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let infos = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| gpu_info_full(g, i as u32))
        .collect();
    tx.send(hello_message(node, infos)).await.expect("hello");
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    let mut rx = client.stream(request).await?.into_inner();
    match next(&mut rx).await? {
        Msg::Welcome(welcome) => Ok(AgentStream { tx, rx, welcome }),
        other => panic!("expected Welcome, got {other:?}"),
    }
}

impl AgentStream {
    /// Sends `b` and returns the answer to it.
    pub async fn send(&mut self, b: Batch) -> gpufleet_proto::v1::collector_message::Msg {
        self.tx
            .send(gpufleet_proto::v1::AgentMessage {
                msg: Some(gpufleet_proto::v1::agent_message::Msg::Batch(b.into())),
            })
            .await
            .expect("send");
        next(&mut self.rx).await.expect("stream healthy")
    }
}

/// `tokens add NODE` (an agent token) on the collector's store; returns the token.
pub async fn add_token(c: &TestCollector, node: &str) -> String {
    use gpufleet_collector::auth::tokens::{self, Role, TokensCommand};
    let out = tokens::run_on(
        c.store.as_ref(),
        TokensCommand::Add {
            node: node.to_owned(),
            role: Role::Agent,
        },
    )
    .await
    .expect("tokens add");
    out.lines().next().expect("token line").to_owned()
}

/// The Hello an agent for `node` with these GPUs sends.
pub fn hello_message(node: &str, gpus: Vec<GpuInfo>) -> gpufleet_proto::v1::AgentMessage {
    use gpufleet_proto::v1 as pb;
    let h = hello(node);
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Hello(pb::Hello {
            node: h.node,
            agent_version: h.agent_version,
            boot_id: h.boot_id,
            labels: h.labels.into_iter().collect(),
            inventory: Some(inventory(gpus).into()),
            sent_ms: gpufleet_core::config::now_ms(),
            interval_ms: h.interval_ms,
            source: h.source,
        })),
    }
}

/// Registers node `name` with one GPU (every inventory field set) per UUID, at `at`.
pub async fn register_gpus<S: AsRef<str>>(
    store: &Arc<dyn Store>,
    name: &str,
    uuids: &[S],
    at: UnixMs,
) -> NodeRecord {
    let infos = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| gpu_info_full(u.as_ref(), i as u32))
        .collect();
    store
        .register_node(&hello(name), &inventory(infos), at)
        .await
        .expect("register")
}

/// Writes `ticks` as batch `seq` of `node`, straight into the store.
pub async fn write_ticks(store: &Arc<dyn Store>, node: &NodeRecord, seq: u64, ticks: Vec<Tick>) {
    let b = Batch {
        seq,
        ticks,
        delivery: DeliveryStats::default(),
    };
    store
        .write_batches(&[node_batch(node, b)])
        .await
        .expect("write");
}

/// Polls `f` every 50 ms until it gives a value, and returns it; fails the test with
/// `what` after `within` (the bound only fails a hung run).
pub async fn wait_until<T>(
    what: &str,
    within: std::time::Duration,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A benchmark knob: the environment variable `name` as a number, else `default`.
pub fn knob(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Calls the HTTP API in-process (no socket) with the clock fixed at `now`: the status,
/// the content type and the body.
pub async fn api_get(store: &Arc<dyn Store>, now: UnixMs, uri: &str) -> (u16, String, Vec<u8>) {
    let live = Arc::new(gpufleet_collector::live::state::Live::new());
    api_get_live(store, live, now, uri).await
}

/// [`api_get`] answered as JSON: the status and the parsed body.
pub async fn api_get_json(
    store: &Arc<dyn Store>,
    now: UnixMs,
    uri: &str,
) -> (u16, serde_json::Value) {
    let (status, _, body) = api_get(store, now, uri).await;
    (status, serde_json::from_slice(&body).expect("json"))
}

/// [`api_get`] with a given live state (what `/api/v1/nodes` and friends read).
pub async fn api_get_live(
    store: &Arc<dyn Store>,
    live: Arc<gpufleet_collector::live::state::Live>,
    now: UnixMs,
    uri: &str,
) -> (u16, String, Vec<u8>) {
    use tower::ServiceExt as _;
    let state = gpufleet_collector::api::router::AppState {
        store: Arc::clone(store),
        live,
        metrics: Arc::new(gpufleet_collector::metrics::Metrics::default()),
        writer: None,
        status: Default::default(),
        clock: Arc::new(move || now),
        workloads: Default::default(),
        waste: Default::default(),
        renders: Default::default(),
    };
    let response = gpufleet_collector::api::router::app(state)
        .oneshot(
            axum::http::Request::builder()
                .uri(uri)
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await
        .expect("response");
    let status = response.status().as_u16();
    let ctype = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = axum::body::to_bytes(response.into_body(), 1 << 24)
        .await
        .expect("body");
    (status, ctype, body.to_vec())
}

/// The next message on an agent's stream (10 s at most), or the status it ended with.
pub async fn next(
    rx: &mut tonic::Streaming<gpufleet_proto::v1::CollectorMessage>,
) -> Result<gpufleet_proto::v1::collector_message::Msg, tonic::Status> {
    let msg = tokio::time::timeout(std::time::Duration::from_secs(10), rx.message())
        .await
        .expect("an answer within 10 s")?;
    Ok(msg.and_then(|m| m.msg).expect("a message"))
}

/// Debian's `prometheus` binary, installed by `scripts/need-deb` when missing; panics (never
/// skips) when it cannot be had.
pub fn prometheus_bin() -> std::path::PathBuf {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/need-deb");
    let out = std::process::Command::new(script)
        .args(["prometheus", "prometheus"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/need-deb");
    assert!(
        out.status.success(),
        "Prometheus is needed by this test and could not be installed (scripts/need-deb prometheus prometheus)"
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// A port nobody listens on now (for a peer that takes a port number, not a listener).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A collector's `/metrics` exposition, over HTTP at `http` (host:port).
pub async fn scrape_metrics(http: &str) -> String {
    reqwest::get(format!("http://{http}/metrics"))
        .await
        .expect("scrape /metrics")
        .text()
        .await
        .expect("the /metrics body")
}

/// The value of one series (`name{labels}`, as the exposition writes it) in a `/metrics`
/// body, if present.
pub fn metric_value(body: &str, series: &str) -> Option<f64> {
    let line = body
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))?;
    line.trim().parse().ok()
}
