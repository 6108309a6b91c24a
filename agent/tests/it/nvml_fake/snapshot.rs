//! A library that cannot load its scenario, and `gpufleet-agent snapshot --nvml-lib`.

use super::*;

#[test]
fn a_library_that_cannot_load_its_scenario_fails_with_a_clear_error() {
    let fake = Fake::new(Scenario::default());
    std::fs::write(fake.dir.path().join(fake_nvml::SCENARIO_FILE), "{not json").expect("write");
    let err = NvmlSource::open(NvmlOptions {
        lib_path: Some(fake.lib()),
        proc_root: cgroup_fixtures().join("proc"),
        hostname: "x".into(),
        health_interval: DEFAULT_HEALTH_INTERVAL,
        interval: std::time::Duration::from_secs(1),
        cadence: gpufleet_agent::nvml::Cadence::EVERY_TICK,
    })
    .expect_err("init fails");
    assert!(
        err.to_string().contains("cannot initialise NVML from"),
        "{err}"
    );
}

fn snapshot_scenario() -> Scenario {
    Scenario {
        gpus: vec![
            Gpu {
                util_gpu_pct: 93.into(),
                mem_used_bytes: (61 * GIB).into(),
                power_mw: 388_000.into(),
                temp_gpu_c: 67.into(),
                compute_processes: (1101..=1106).map(|p| proc_(p, 10, Some(15))).collect(),
                ..gpu("GPU-0")
            },
            Gpu {
                util_gpu_pct: 41.into(),
                pci_bus_id: "00000000:0B:00.0".into(),
                unsupported: vec!["nvmlDeviceGetTemperature".into()],
                compute_processes: (1107..=1111).map(|p| proc_(p, 5, Some(8))).collect(),
                ..gpu("GPU-1")
            },
        ],
        ..Scenario::default()
    }
}

fn snapshot(fake: &Fake, json: bool) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
    cmd.arg("snapshot")
        .arg("--nvml-lib")
        .arg(fake.lib())
        .arg("--proc-root")
        .arg(cgroup_fixtures().join("proc"))
        .args(["--node", "fake-node"]);
    if json {
        cmd.arg("--json");
    }
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GPUFLEET_") {
            cmd.env_remove(&k);
        }
    }
    let out = cmd.output().expect("the agent binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn snapshot_with_nvml_lib_shows_gpus_and_processes_with_containers() {
    let fake = Fake::new(snapshot_scenario());
    let table = snapshot(&fake, false);
    assert!(
        table.starts_with("fake-node  driver 550.54.15  CUDA 12.4"),
        "{table}"
    );
    let rows: Vec<&str> = table.lines().filter(|l| l.contains("A100-SXM4")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].contains("67C") && rows[0].contains("93%"),
        "{table}"
    );
    assert!(
        rows[1].contains(" n/a ") && rows[1].contains("41%"),
        "{table}"
    );
    for shown in [
        "container 5e6f7a8b5e6f",
        "slurm job 48213 step 0",
        "container a1b2c3d4a1b2",
        "host session-3.scope",
    ] {
        assert!(table.contains(shown), "{shown:?} missing:\n{table}");
    }
    assert_eq!(
        table
            .lines()
            .filter(|l| l.contains("MiB") && !l.contains("MEMORY"))
            .count(),
        11,
        "one row per process:\n{table}"
    );

    let v: Json = serde_json::from_str(&snapshot(&fake, true)).expect("JSON");
    assert_eq!(v["inventory"]["gpus"].as_array().map(Vec::len), Some(2));
    assert!(
        v["tick"]["gpus"][1]["temp_gpu_c"].is_null(),
        "absent, not 0"
    );
    let procs = v["tick"]["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 11);
    assert_eq!(procs[0]["workload"]["runtime"], "docker");
}

/// The real binary against a Kubernetes API (the local stub: HTTPS, its own CA, a bearer
/// token, found through KUBECONFIG): the pod and container of process 1103 (the fixture's
/// containerd pod) are named in the snapshot, with the allowed label only; the agent
/// listed its own node's pods only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_names_a_pods_process_from_the_kubernetes_api() {
    use crate::kube_stub::{KubeStub, pod};
    let stub = KubeStub::start("fake-node").await;
    let container = "5e6f7a8b".repeat(8);
    stub.add_pod(pod(
        "3f1c2a9e-77b4-4c1e-9a0d-5b6e7f8a9b0c",
        "trainer-0",
        "ml-research",
        "fake-node",
        &[(
            "pytorch",
            "nvcr.io/nvidia/pytorch:24.05-py3",
            container.as_str(),
        )],
        &[("team", "vision"), ("pod-template-hash", "7f9c")],
    ));
    let fake = Fake::new(snapshot_scenario());
    let kubeconfig = fake.dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, stub.kubeconfig_yaml()).expect("kubeconfig");
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gpufleet-agent"));
    cmd.args([
        "snapshot",
        "--json",
        "--node",
        "fake-node",
        "--kube-label",
        "team",
    ])
    .arg("--nvml-lib")
    .arg(fake.lib())
    .arg("--proc-root")
    .arg(cgroup_fixtures().join("proc"));
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("GPUFLEET_") || k.starts_with("KUBERNETES_") || k.ends_with("_PROXY") {
            cmd.env_remove(&k);
        }
    }
    let out = cmd
        .env("KUBECONFIG", &kubeconfig)
        .env_remove("DOCKER_HOST")
        .output()
        .await
        .expect("the agent binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Json = serde_json::from_slice(&out.stdout).expect("JSON");
    let procs = v["tick"]["processes"].as_array().expect("processes");
    let w = &procs.iter().find(|p| p["pid"] == 1103).expect("pid 1103")["workload"];
    assert_eq!(w["pod_uid"], "3f1c2a9e-77b4-4c1e-9a0d-5b6e7f8a9b0c");
    assert_eq!(w["pod_name"], "trainer-0");
    assert_eq!(w["namespace"], "ml-research");
    assert_eq!(w["container_name"], "pytorch");
    assert_eq!(w["image"], "nvcr.io/nvidia/pytorch:24.05-py3");
    assert_eq!(w["labels"], serde_json::json!({"team": "vision"}));
    let requests = stub.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert!(
            crate::kube_stub::url_decode(r).contains("fieldSelector=spec.nodeName=fake-node"),
            "a request beyond this node's pods: {r}"
        );
    }
}

/// The bundled Hopper scenario: `snapshot` shows the H100's GPM (its two readings make one
/// window) and n/a for the A100's; `--json` has every GPM field, null on the A100.
#[test]
fn snapshot_shows_gpm_on_hopper_and_na_before_it() {
    let scenario: Scenario = serde_json::from_str(include_str!(
        "../../../../fake-nvml/scenarios/h100-gpm.json"
    ))
    .expect("the bundled scenario parses");
    let fake = Fake::new(scenario);
    let table = snapshot(&fake, false);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{table}"))
            .to_owned()
    };
    assert!(
        table.contains("SMACT") && table.contains("TENSOR"),
        "{table}"
    );
    // The second reading's window: tensor 61.4 %, SMs 91.5 %, DRAM 54.1 %.
    let h100 = row("H100");
    assert!(h100.contains(" 61% ") && h100.contains(" 54% "), "{table}");
    assert_eq!(row("A100").matches(" n/a ").count(), 3, "{table}");
    let v: Json = serde_json::from_str(&snapshot(&fake, true)).expect("JSON");
    let gpm = &v["tick"]["gpus"][0]["gpm"];
    assert_eq!(gpm["tensor_active_cpct"], 6140);
    assert_eq!(gpm["sm_active_cpct"], 9150);
    assert_eq!(gpm["tensor_imma_cpct"], 0, "a present 0");
    let a100 = &v["tick"]["gpus"][1]["gpm"];
    assert!(a100["tensor_active_cpct"].is_null(), "{a100}");
    assert!(a100["sm_active_cpct"].is_null());
}
