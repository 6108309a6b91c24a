//! `cgroup::identify` against the miniature `/proc` in `shared/cgroups/` (one GPU process
//! per way real clusters run them), compared field by field with `expected.json`.

use crate::common::cgroup_fixtures;
use gpufleet_agent::cgroup::{ProcessIdentity, identify};
use gpufleet_core::sample::WorkloadKind;
use serde_json::{Map, Value};

fn expected() -> Map<String, Value> {
    let path = cgroup_fixtures().join("expected.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => map,
        other => panic!("{} is not a JSON object of pids: {other:?}", path.display()),
    }
}

/// The identity fields a workload may carry; any that `expected.json` does not list for a
/// pid must be absent.
const OPTIONAL_FIELDS: &[&str] = &[
    "container_id",
    "pod_uid",
    "qos",
    "job_id",
    "step",
    "unit",
    "uid",
    "container_name",
    "image",
    "pod_name",
    "namespace",
];

fn identify_fixture(pid: &str) -> ProcessIdentity {
    let pid: u32 = pid
        .parse()
        .unwrap_or_else(|e| panic!("expected.json key {pid:?} is not a pid: {e}"));
    identify(&cgroup_fixtures().join("proc"), pid)
}

#[test]
fn every_fixture_pid_has_an_expectation() {
    let expected = expected();
    let mut on_disk: Vec<String> = std::fs::read_dir(cgroup_fixtures().join("proc"))
        .expect("fixture proc dir is readable")
        .map(|entry| {
            entry
                .expect("fixture entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = expected.keys().cloned().collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    assert_eq!(listed.len(), 11);
}

#[test]
fn workloads_match_expected_json_field_by_field() {
    let mut failures = Vec::new();
    for (pid, want) in expected() {
        let want = want
            .as_object()
            .unwrap_or_else(|| panic!("expected.json[{pid}] is not an object"));
        let got_workload = identify_fixture(&pid).workload;
        let got = match serde_json::to_value(&got_workload) {
            Ok(Value::Object(map)) => map,
            other => panic!("workload of {pid} did not serialize to an object: {other:?}"),
        };
        for (field, want_value) in want {
            let got_value = got.get(field).unwrap_or(&Value::Null);
            if got_value != want_value {
                failures.push(format!(
                    "pid {pid}: {field}: want {want_value}, got {got_value}"
                ));
            }
        }
        for field in OPTIONAL_FIELDS {
            if !want.contains_key(*field) && got.contains_key(*field) {
                failures.push(format!(
                    "pid {pid}: {field}: want absent, got {}",
                    got[*field]
                ));
            }
        }
        if !want.contains_key("runtime") {
            // The documented convention where expected.json leaves runtime open.
            let convention = match got_workload.kind {
                WorkloadKind::Slurm => "slurm",
                WorkloadKind::Host if got_workload.unit.is_some() => "systemd",
                WorkloadKind::Host => "",
                WorkloadKind::Container => "<listed in expected.json>",
            };
            if got_workload.runtime != convention {
                failures.push(format!(
                    "pid {pid}: runtime: want {convention:?}, got {:?}",
                    got_workload.runtime
                ));
            }
        }
    }
    assert!(failures.is_empty(), "mismatches:\n{}", failures.join("\n"));
}

#[test]
fn users_and_commands() {
    // A proc root other than /proc resolves no names: the user is the real uid.
    let want = [
        ("1101", "1000", "python train.py"),
        (
            "1102",
            "0",
            "/usr/bin/python3 -m vllm.entrypoints.openai.api_server",
        ),
        ("1103", "1000", "python serve.py"),
        ("1104", "0", "torchrun --nproc_per_node=8 train.py"),
        ("1105", "1000", "python infer.py"),
        ("1106", "0", "python bench.py"),
        ("1107", "1000", "python rootless.py"),
        ("1108", "1000", "python lm.py"),
        (
            "1109",
            "1000",
            "bash /var/spool/slurmd/job90210/slurm_script",
        ),
        ("1110", "1000", "python notebook_kernel.py"),
        ("1111", "0", "/opt/jupyterhub/bin/python -m jupyterhub"),
    ];
    for (pid, user, command) in want {
        let identity = identify_fixture(pid);
        assert_eq!(identity.user.as_deref(), Some(user), "pid {pid} user");
        assert_eq!(
            identity.command.as_deref(),
            Some(command),
            "pid {pid} command"
        );
    }
}

#[test]
fn a_pid_that_is_not_there_is_an_empty_host_identity() {
    let identity = identify(&cgroup_fixtures().join("proc"), 999_999);
    assert_eq!(identity, ProcessIdentity::default());
    assert_eq!(identity.workload.kind, WorkloadKind::Host);
}
