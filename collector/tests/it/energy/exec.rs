//! `gpufleet-agent exec` and the collector measure the same run.

use super::*;

/// `gpufleet-agent exec` and the collector measure the same run: exec counts a GPU's
/// energy from the tick that first lists the command's process until the command exits;
/// the collector gives the container the intervals that end at ticks listing it. On an
/// exclusive GPU under `spread` they differ by the interval between the last tick listing
/// the process and the command's exit.
#[tokio::test]
async fn exec_and_the_collector_agree_on_an_exclusive_job_but_for_the_interval_before_exit() {
    use gpufleet_exec::Measure;
    for job_s in [20i64, 300] {
        let (_dir, store) = sqlite_store().await;
        let node = node_of(&store, "n1", "NVIDIA A10", &["GPU-x0"]).await;
        // The command starts at 0 s; its process is listed from 2 s (CUDA context) to
        // `job_s + 2` s, busy from 3 s; it exits at `job_s + 3` s. Power varies.
        let listed = |k: i64| (2..=job_s + 2).contains(&k);
        let busy = |k: i64| (3..=job_s + 2).contains(&k);
        let power = |k: i64| -> u32 {
            if busy(k) {
                200_000 + ((k * 7_919) % 100_000) as u32
            } else if listed(k) {
                60_000
            } else {
                40_000
            }
        };
        let mut counter = 0u64;
        let ticks: Vec<Tick> = (0..=job_s + 3)
            .map(|k| {
                if k > 0 {
                    counter += u64::from(power(k));
                }
                Tick {
                    time_ms: T0 + k * 1000,
                    gpus: vec![GpuSample {
                        gpu_uuid: "GPU-x0".into(),
                        util_gpu_pct: Some(if busy(k) { 100 } else { 0 }),
                        power_mw: Some(power(k)),
                        energy_mj: Some(counter),
                        ..Default::default()
                    }],
                    processes: if listed(k) {
                        vec![process(
                            "GPU-x0",
                            4242,
                            95,
                            container_workload(A, Some("job")),
                        )]
                    } else {
                        vec![]
                    },
                    ..Default::default()
                }
            })
            .collect();
        let inventory = inventory(vec![GpuInfo {
            name: "NVIDIA A10".into(),
            ..gpu_info_sparse("GPU-x0", 0)
        }]);
        let mut exec = Measure::new("n1", inventory, false, None);
        let tree = std::collections::BTreeSet::from([4242u32]);
        for t in &ticks {
            exec.add(t, &tree);
        }
        let exec_j = exec
            .report(Default::default(), None)
            .energy
            .energy_j
            .expect("exec measured energy");
        write_ticks(&store, &node, 1, ticks).await;
        Accountant::new(
            store.clone(),
            options(40, IdlePolicy::Spread),
            clock_at(T0 + 60 * MIN),
        )
        .pass()
        .await
        .expect("pass");
        let collector_j = stored_mj(&store, &format!("container:{A}")).await as f64 / 1000.0;
        let diff = (exec_j - collector_j).abs();
        // Both count the interval ending at the first tick listing the process; exec also
        // counts the one after the last listing, until the command exits (40 W × 1 s).
        assert_eq!(
            exec_j - collector_j,
            f64::from(power(job_s + 3)) / 1000.0,
            "{job_s} s job: exec {exec_j} J, collector {collector_j} J"
        );
        println!(
            "{job_s} s job: exec {exec_j:.0} J, collector {collector_j:.0} J, differ by \
             {diff:.0} J ({:.2} %)",
            100.0 * diff / exec_j
        );
    }
}
