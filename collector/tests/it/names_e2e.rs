//! Workload names end to end, through real parts: the real agent on the fake
//! libnvidia-ml, its GPU processes described by a `/proc` fixture (a Slurm job step with
//! a real `environ`, a Podman container), a real Podman answering the Docker Engine API on
//! its socket, and the real collector. The names reach the collector's API and
//! `gpufleet-agent snapshot --json`.
//!
//! Podman (Debian's `podman`, which `scripts/test` installs) creates and inspects the
//! container in a storage of the test's own; the container is never started.

use crate::common::wait_until;
use crate::harness;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;

/// The Slurm job of the environ fixture.
const JOB: &str = "48213";

/// `podman` with a storage of its own under `dir`.
fn podman(dir: &Path) -> std::process::Command {
    let mut c = std::process::Command::new("podman");
    c.arg("--root")
        .arg(dir.join("root"))
        .arg("--runroot")
        .arg(dir.join("run"))
        .args(["--storage-driver", "vfs", "--cgroup-manager", "cgroupfs"])
        .arg("--tmpdir")
        .arg(dir.join("tmp"));
    c
}

fn run(mut c: std::process::Command, what: &str) -> String {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run podman ({e}); scripts/test installs it"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A container named `name` with labels, of an image imported from a one-file root
/// file system (no registry is reachable); its full id.
fn podman_container(dir: &Path, name: &str) -> String {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).expect("rootfs");
    std::fs::write(rootfs.join("train"), "#!/bin/sh\n").expect("file");
    let tar = dir.join("rootfs.tar");
    let status = std::process::Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .expect("tar");
    assert!(status.success());
    let mut import = podman(dir);
    import
        .arg("import")
        .arg(&tar)
        .arg("localhost/gpufleet-e2e:1");
    run(import, "podman import");
    let mut create = podman(dir);
    create.args([
        "create",
        "--name",
        name,
        "--label",
        "team=vision",
        "--label",
    ]);
    create.args(["secret-ish=no", "localhost/gpufleet-e2e:1", "/train"]);
    run(create, "podman create")
}

/// A `/proc` with the fake library's processes (two-gpus.json): 1103 a step of Slurm job
/// [`JOB`] (its environ: the real format, from the agent's fixtures), 1108 the Podman
/// container `container_id`, 1110 a step of job 777 with no Slurm variables; the others
/// are absent (host processes).
fn proc_fixture(root: &Path, container_id: &str) {
    let environ = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures/names/slurm-environ-batch");
    let procs = [
        (
            1103,
            format!("0::/system.slice/slurmstepd.scope/job_{JOB}/step_0/user/task_0\n"),
            Some(environ),
        ),
        (
            1108,
            format!("0::/machine.slice/libpod-{container_id}.scope/container\n"),
            None,
        ),
        // A job step adopted without its environment, and no scontrol on the node: its
        // names cannot be had, which the agent counts.
        (
            1110,
            "0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n".to_owned(),
            None,
        ),
    ];
    for (pid, cgroup, environ) in procs {
        let d = root.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("pid dir");
        std::fs::write(d.join("cgroup"), cgroup).expect("cgroup");
        std::fs::write(
            d.join("status"),
            "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\n",
        )
        .expect("status");
        std::fs::write(d.join("cmdline"), b"python\0train.py\0").expect("cmdline");
        if let Some(e) = environ {
            std::fs::copy(e, d.join("environ")).expect("environ");
        }
    }
}

/// The fake libnvidia-ml and its scenario in `dir/nvml`; the library's path.
fn fake_nvml(dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().expect("own path");
    let library = fake_nvml::built_library(&exe).expect("the fake libnvidia-ml is built");
    let nvml = dir.join("nvml");
    std::fs::create_dir_all(&nvml).expect("mkdir");
    std::fs::copy(library, nvml.join("libnvidia-ml.so.1")).expect("copy lib");
    let scenario =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fake-nvml/scenarios/two-gpus.json");
    std::fs::copy(scenario, nvml.join(fake_nvml::SCENARIO_FILE)).expect("copy scenario");
    nvml.join("libnvidia-ml.so.1")
}

/// The workload of process `pid` in a node view or a snapshot tick's processes.
fn workload_of(processes: &[serde_json::Value], pid: u64) -> Option<serde_json::Value> {
    processes
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .map(|p| p["workload"].clone())
}

fn check_names(job: &serde_json::Value, container: &serde_json::Value, name: &str) {
    assert_eq!(job["kind"], "slurm");
    assert_eq!(job["job_id"], JOB);
    assert_eq!(job["job_name"], "train-llama");
    assert_eq!(job["account"], "physics");
    assert_eq!(job["partition"], "gpu");
    assert_eq!(job["job_user"], "alice");
    assert_eq!(container["kind"], "container");
    assert_eq!(container["runtime"], "podman");
    assert_eq!(container["container_name"], name);
    assert_eq!(container["image"], "localhost/gpufleet-e2e:1");
    assert_eq!(
        container["labels"],
        serde_json::json!({"team": "vision"}),
        "only the allowed label"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_from_slurm_and_podman_reach_the_api_and_the_snapshot() {
    let dir = tempfile::tempdir().expect("dir");
    let pod = dir.path().join("podman");
    std::fs::create_dir_all(pod.join("tmp")).expect("podman dirs");
    let name = format!("trainer-{}", std::process::id());
    let container_id = podman_container(&pod, &name);
    assert_eq!(container_id.len(), 64, "{container_id}");
    let socket = dir.path().join("podman.sock");
    let mut service = podman(&pod);
    service
        .args(["system", "service", "--time", "0"])
        .arg(format!("unix://{}", socket.display()));
    let mut service = Command::from(service)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("podman system service");
    wait_until("the Podman socket", Duration::from_secs(30), async || {
        socket.exists().then_some(())
    })
    .await;

    let proc_root = dir.path().join("proc");
    proc_fixture(&proc_root, &container_id);
    // A node without Slurm's commands: `scripts/test` installs Slurm on this machine, and
    // an `scontrol` that cannot reach a controller fails otherwise than "not found".
    let no_scontrol = dir.path().join("bin");
    std::fs::create_dir_all(&no_scontrol).expect("an empty PATH folder");
    let lib = fake_nvml(dir.path());
    let docker_host = format!("unix://{}", socket.display());
    let db = format!("sqlite://{}", dir.path().join("c.db").display());
    let c = harness::start_collector(&db, "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let agent = Command::new(harness::agent_bin())
        .args(["run", "--collector", &format!("http://{}", c.grpc)])
        .args(["--node", "named-node", "--interval", "200ms"])
        .arg("--nvml-lib")
        .arg(&lib)
        .arg("--proc-root")
        .arg(&proc_root)
        .arg("--spool-dir")
        .arg(dir.path().join("spool"))
        .args(["--docker-label", "team"])
        .env("DOCKER_HOST", &docker_host)
        .env("PATH", &no_scontrol)
        .env("GPUFLEET_LOG", "warn")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start gpufleet-agent");

    // The collector's node view: the processes carry the runtimes' names.
    let url = format!("http://{}/api/v1/nodes/named-node", c.http);
    let (job, container) = wait_until(
        "the names in the API",
        Duration::from_secs(60),
        async || {
            let v: serde_json::Value = reqwest::get(&url).await.ok()?.json().await.ok()?;
            let procs: Vec<serde_json::Value> = v["gpus"]
                .as_array()?
                .iter()
                .flat_map(|g| g["processes"].as_array().cloned().unwrap_or_default())
                .collect();
            let job = workload_of(&procs, 1103)?;
            let container = workload_of(&procs, 1108)?;
            (job.get("job_name").is_some() && container.get("container_name").is_some())
                .then_some((job, container))
        },
    )
    .await;
    check_names(&job, &container, &name);
    // The look-up that cannot succeed is counted on the collector's /metrics, per node,
    // source and cause.
    let series = r#"gpufleet_agent_name_lookup_failures_total{node="named-node",source="slurm",cause="not_found"}"#;
    let http = c.http.clone();
    let failures = wait_until(
        "the failed look-up on /metrics",
        Duration::from_secs(30),
        async || crate::common::metric_value(&crate::common::scrape_metrics(&http).await, series),
    )
    .await;
    assert!(failures >= 1.0, "{failures}");
    harness::stop_agent(agent, "agent").await;

    // One local reading names them too.
    let out = Command::new(harness::agent_bin())
        .args(["snapshot", "--json", "--node", "named-node"])
        .arg("--nvml-lib")
        .arg(&lib)
        .arg("--proc-root")
        .arg(&proc_root)
        .args(["--docker-label", "team"])
        .env("DOCKER_HOST", &docker_host)
        .env("PATH", &no_scontrol)
        .env("GPUFLEET_LOG", "warn")
        .output()
        .await
        .expect("snapshot");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let procs = snap["tick"]["processes"].as_array().expect("processes");
    check_names(
        &workload_of(procs, 1103).expect("1103"),
        &workload_of(procs, 1108).expect("1108"),
        &name,
    );
    // And its table.
    let out = Command::new(harness::agent_bin())
        .args(["snapshot", "--node", "named-node"])
        .arg("--nvml-lib")
        .arg(&lib)
        .arg("--proc-root")
        .arg(&proc_root)
        .env("DOCKER_HOST", &docker_host)
        .env("PATH", &no_scontrol)
        .output()
        .await
        .expect("snapshot");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&format!("slurm job {JOB} train-llama physics step 0")),
        "{table}"
    );
    assert!(table.contains(&format!("container {name}")), "{table}");

    let _ = service.kill().await;
    let mut rm = podman(&pod);
    rm.args(["rm", "--force", &name]);
    let _ = rm.output();
}
