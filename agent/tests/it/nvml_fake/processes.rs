//! Process lists: fixture pids mapped to their containers through a growing list, and
//! MIG devices with the processes running in them.

use super::*;

/// The identity fields `expected.json` may list; any it does not list must be absent
/// (`runtime` is compared only where it is listed).
const IDENTITY_FIELDS: &[&str] = &[
    "kind",
    "container_id",
    "pod_uid",
    "qos",
    "job_id",
    "step",
    "unit",
    "uid",
];

#[test]
fn all_fixture_pids_map_to_their_containers_through_a_growing_process_list() {
    let expected: BTreeMap<String, Json> = serde_json::from_str(
        &std::fs::read_to_string(cgroup_fixtures().join("expected.json")).expect("expected.json"),
    )
    .expect("expected.json is an object");
    assert_eq!(expected.len(), 11);
    // 11 processes: more than the first call's room (8), so it answers INSUFFICIENT_SIZE
    // and the list is asked again with room for all; the next tick asks once.
    let compute: Vec<Process> = (1101..=1111)
        .map(|pid| proc_(pid, 1, Some(pid % 100)))
        .collect();
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            compute_processes: compute,
            ..gpu("GPU-busy")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let tick = src.sample(T0).expect("tick");
    let pids: Vec<u32> = tick.processes.iter().map(|p| p.pid).collect();
    assert_eq!(
        pids,
        (1101..=1111).collect::<Vec<_>>(),
        "all 11 in the first tick"
    );
    for p in &tick.processes {
        let want = &expected[&p.pid.to_string()];
        let got = serde_json::to_value(&p.workload).expect("workload serializes");
        if let Some(runtime) = want.get("runtime") {
            assert_eq!(got.get("runtime"), Some(runtime), "pid {}: runtime", p.pid);
        }
        for field in IDENTITY_FIELDS {
            assert_eq!(
                got.get(*field),
                want.get(*field),
                "pid {}: {field}\n got {got}\nwant {want}",
                p.pid
            );
        }
        assert_eq!(p.sm_util_pct, Some(p.pid % 100));
    }
    assert!(tick.processes.iter().all(|p| p.command.is_some()));
    let next = src.sample(T0 + 1000).expect("tick");
    assert_eq!(next.processes.len(), 11);
    drop(src);
    let c = fake.counts();
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetComputeRunningProcesses_v3"),
        3,
        "INSUFFICIENT_SIZE then the fill; the next tick, one call"
    );
    assert_eq!(
        count(&c, "gpu0.nvmlDeviceGetProcessUtilization"),
        3,
        "the same for the utilization samples"
    );
}

#[test]
fn mig_devices_are_in_the_inventory_and_their_processes_carry_the_mig_uuid() {
    let mig = |uuid: &str, profile: &str, gi: u32, gib: u64| MigSpec {
        uuid: uuid.into(),
        profile: profile.into(),
        memory_total_bytes: gib * GIB,
        gpu_instance_id: gi,
        compute_instance_id: 0,
    };
    let in_mig = |pid: u32, m: usize| Process {
        mig: Some(m),
        ..proc_(pid, 2, None)
    };
    let fake = Fake::new(Scenario {
        gpus: vec![
            Gpu {
                mig_mode: 1,
                mig_instances: vec![
                    mig("MIG-aaaa", "3g.40gb", 1, 40),
                    mig("MIG-bbbb", "2g.20gb", 2, 20),
                    mig("MIG-empty", "1g.10gb", 5, 10),
                ],
                compute_processes: vec![in_mig(1103, 0), in_mig(1104, 1), in_mig(1105, 1)],
                unsupported: vec!["nvmlDeviceGetUtilizationRates".into()],
                ..gpu("GPU-mig")
            },
            Gpu {
                compute_processes: vec![proc_(1101, 1, None)],
                ..gpu("GPU-plain")
            },
        ],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let inv = src.inventory().expect("inventory");
    assert_eq!(inv.gpus[0].mig_enabled, Some(true));
    let migs: Vec<_> = inv.gpus[0]
        .mig_instances
        .iter()
        .map(|m| {
            (
                m.uuid.as_str(),
                m.profile.as_deref(),
                m.memory_total_bytes,
                m.gpu_instance_id,
                m.compute_instance_id,
            )
        })
        .collect();
    assert_eq!(
        migs,
        [
            ("MIG-aaaa", Some("3g.40gb"), Some(40 * GIB), 1, 0),
            ("MIG-bbbb", Some("2g.20gb"), Some(20 * GIB), 2, 0),
            (
                "MIG-empty",
                Some("1g.10gb"),
                Some(10 * GIB),
                0xFFFF_FFFF,
                0xFFFF_FFFF
            ),
        ],
        "ids from a process in the instance; NVML's no-value when it has none"
    );
    assert_eq!(inv.gpus[1].mig_enabled, Some(false));
    assert!(inv.gpus[1].mig_instances.is_empty());
    let tick = &ticks(&mut src, 2)[1];
    let by_pid: Vec<_> = tick
        .processes
        .iter()
        .map(|p| (p.pid, p.gpu_uuid.as_str(), p.mig_uuid.as_deref()))
        .collect();
    assert_eq!(
        by_pid,
        [
            (1103, "GPU-mig", Some("MIG-aaaa")),
            (1104, "GPU-mig", Some("MIG-bbbb")),
            (1105, "GPU-mig", Some("MIG-bbbb")),
            (1101, "GPU-plain", None),
        ]
    );
    assert_eq!(sample(tick, "GPU-mig").util_gpu_pct, None);
}
