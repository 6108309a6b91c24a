//! Live nodes: a job's energy shows whole soon after it ends, in-process and served.

use super::*;

#[tokio::test]
async fn a_job_that_ends_on_a_live_node_shows_whole_within_15_s_of_its_end() {
    let (_dir, store) = sqlite_store().await;
    job_end_on_a_live_node_on(store).await;
}

/// The same on PostgreSQL.
#[tokio::test]
async fn postgres_a_job_that_ends_on_a_live_node_shows_whole_within_15_s_of_its_end() {
    let (_schema, store) = pg_store().await;
    job_end_on_a_live_node_on(store).await;
}

/// The node keeps sampling (1 Hz, batches every 5 s, as an agent sends them) after a 20 s
/// job ends mid-minute; the accountant passes every 5 s. The job's whole energy must be
/// in the API no later than 15 s after its last sample, though its minute is still open.
async fn job_end_on_a_live_node_on(store: Arc<dyn Store>) {
    let node = node_of(&store, "n1", "NVIDIA A10", &["GPU-live"]).await;
    let job = |k: i64| (11..=30).contains(&k);
    let tick = |k: i64| Tick {
        time_ms: T0 + k * 1000,
        gpus: vec![GpuSample {
            gpu_uuid: "GPU-live".into(),
            util_gpu_pct: Some(if job(k) { 100 } else { 0 }),
            power_mw: Some(if job(k) { 250_000 } else { 40_000 }),
            // 40 J per idle second, 250 J per busy one.
            energy_mj: Some(
                (0..=k)
                    .filter(|i| *i > 0)
                    .map(|i| if job(i) { 250_000 } else { 40_000 })
                    .sum(),
            ),
            ..Default::default()
        }],
        processes: if job(k) {
            vec![process(
                "GPU-live",
                9,
                97,
                container_workload(A, Some("job")),
            )]
        } else {
            vec![]
        },
        ..Default::default()
    };
    let options = options(40, IdlePolicy::Spread);
    let clock_now = Arc::new(AtomicI64::new(T0));
    let clock: Clock = {
        let n = Arc::clone(&clock_now);
        Arc::new(move || n.load(Ordering::SeqCst))
    };
    let mut acc = Accountant::new(store.clone(), options, clock);
    let job_end = T0 + 30_000;
    let mut whole_at = None;
    for batch in 0..11 {
        let ticks = (batch * 5..batch * 5 + 5).map(tick).collect();
        write_ticks(&store, &node, batch as u64 + 1, ticks).await;
        let now = T0 + (batch * 5 + 5) * 1000;
        clock_now.store(now, Ordering::SeqCst);
        acc.pass().await.expect("pass");
        if whole_at.is_none() && stored_mj(&store, &format!("container:{A}")).await == 20 * 250_000
        {
            whole_at = Some(now);
        }
    }
    let whole_at = whole_at.expect("the job's energy was never whole");
    assert!(
        whole_at - job_end <= 15_000,
        "whole {} s after the job ended",
        (whole_at - job_end) / 1000
    );
    assert!(whole_at < T0 + MIN, "while its minute was still open");
}

/// As a user sees it: a served collector (real accountant task, real clock) gets a 20 s
/// job from an agent that then stops. Its whole energy is in `/api/v1/containers` and in
/// `report` within 15 s (the accountant's period is 5 s), whatever second of the minute
/// the job ended in.
#[tokio::test]
async fn a_served_collector_shows_a_20_s_job_within_15_s_of_its_agent_stopping() {
    use gpufleet_proto::v1 as pb;
    use gpufleet_proto::v1::ingest_client::IngestClient;
    let c = start_collector(Default::default()).await;
    let mut client = IngestClient::connect(format!("http://{}", c.grpc))
        .await
        .expect("connect");
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(hello_message("job-node", vec![gpu_info_full("GPU-s", 0)]))
        .await
        .expect("hello");
    let mut answers = client
        .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(std::time::Duration::from_secs(10), answers.message())
            .await
            .expect("an answer")
            .expect("healthy")
            .expect("open")
            .msg
            .expect("a message")
    };
    assert!(matches!(
        next().await,
        pb::collector_message::Msg::Welcome(_)
    ));
    let end = gpufleet_core::config::now_ms() - 500;
    let ticks: Vec<Tick> = (0..=20u32)
        .map(|k| tick(end - 20_000 + i64::from(k) * 1000, &["GPU-s"], k))
        .collect();
    let batch = Batch {
        seq: 1,
        ticks,
        delivery: DeliveryStats::default(),
    };
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Batch(batch.into())),
    })
    .await
    .expect("send");
    assert!(matches!(next().await, pb::collector_message::Msg::Ack(_)));
    // The agent stops.
    drop(tx);
    drop(answers);
    let stopped = std::time::Instant::now();
    let key = format!("container:{}", "ab".repeat(32));
    // From the minute holding the job's first sample.
    let range = TimeRange {
        from_ms: gpufleet_collector::accounting::energy::minute_of(end - 20_000),
        to_ms: end + MIN,
    };
    let (row, waited) = loop {
        let rows = c
            .store
            .workload_energy(range, None, Some(&key))
            .await
            .expect("energy");
        let resident_ms: i64 = rows.iter().map(|r| r.gpu_ms).sum();
        if resident_ms == 20_000 {
            break (rows[0].clone(), stopped.elapsed());
        }
        assert!(
            stopped.elapsed() < std::time::Duration::from_secs(30),
            "not whole after 30 s: {rows:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        waited <= std::time::Duration::from_secs(15),
        "the job's energy took {waited:?}"
    );
    let (status, v) = api_get_json(
        &c.store,
        end + 15_000,
        &format!(
            "/api/v1/containers?from={}&to={}",
            range.from_ms, range.to_ms
        ),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["rows"][0]["key"], key);
    assert_eq!(v["rows"][0]["energy_mj"], row.energy_mj);
    let report = gpufleet_collector::accounting::report::build(
        c.store.as_ref(),
        &gpufleet_collector::accounting::report::ReportSubject::Container(key.clone()),
        range,
    )
    .await
    .expect("report");
    assert_eq!(
        report.energy.energy_j,
        Some(row.energy_mj as f64 / 1000.0),
        "{:?}",
        report.energy
    );
    println!("a 20 s job was whole {waited:?} after its agent stopped");
    c.stop().await;
}
