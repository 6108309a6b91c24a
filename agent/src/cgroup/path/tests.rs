//! The parser against one example path per runtime shape, and properties over arbitrary
//! input.

use super::*;
use crate::cgroup::MAX_FIELD_BYTES;
use proptest::prelude::*;

const ID_A: &str = "a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4a1b2c3d4";
const ID_B: &str = "0f9e8d7c0f9e8d7c0f9e8d7c0f9e8d7c0f9e8d7c0f9e8d7c0f9e8d7c0f9e8d7c";
const POD: &str = "3f1c2a9e-77b4-4c1e-9a0d-5b6e7f8a9b0c";
const POD_SLICE: &str = "3f1c2a9e_77b4_4c1e_9a0d_5b6e7f8a9b0c";

fn v2(path: &str) -> Workload {
    workload_from_cgroup(&format!("0::{path}\n"))
}

fn container(runtime: &str, id: &str) -> Workload {
    Workload {
        kind: WorkloadKind::Container,
        runtime: runtime.to_owned(),
        container_id: Some(id.to_owned()),
        ..Workload::default()
    }
}

fn in_pod(mut w: Workload, qos: &str) -> Workload {
    w.pod_uid = Some(POD.to_owned());
    w.qos = Some(qos.to_owned());
    w
}

fn host(unit: Option<&str>, uid: Option<u32>) -> Workload {
    Workload {
        kind: WorkloadKind::Host,
        runtime: if unit.is_some() { "systemd" } else { "" }.to_owned(),
        unit: unit.map(str::to_owned),
        uid,
        ..Workload::default()
    }
}

fn slurm(job: &str, step: Option<&str>, uid: Option<u32>) -> Workload {
    Workload {
        kind: WorkloadKind::Slurm,
        runtime: "slurm".to_owned(),
        job_id: Some(job.to_owned()),
        step: step.map(str::to_owned),
        uid,
        ..Workload::default()
    }
}

// ---- Docker

#[test]
fn docker_systemd_driver() {
    assert_eq!(
        v2(&format!("/system.slice/docker-{ID_A}.scope")),
        container("docker", ID_A)
    );
}

#[test]
fn docker_cgroupfs_v1_every_line() {
    let content = format!(
        "12:pids:/docker/{ID_B}\n11:memory:/docker/{ID_B}\n1:name=systemd:/docker/{ID_B}\n0::/system.slice/containerd.service\n"
    );
    assert_eq!(workload_from_cgroup(&content), container("docker", ID_B));
}

#[test]
fn docker_trailing_init_and_nested_systemd() {
    assert_eq!(
        v2(&format!("/system.slice/docker-{ID_A}.scope/init")),
        container("docker", ID_A)
    );
    assert_eq!(
        v2(&format!(
            "/system.slice/docker-{ID_A}.scope/system.slice/nginx.service"
        )),
        container("docker", ID_A)
    );
}

#[test]
fn docker_in_docker_takes_the_innermost() {
    assert_eq!(
        v2(&format!("/docker/{ID_A}/docker/{ID_B}")),
        container("docker", ID_B)
    );
}

#[test]
fn rootless_docker_carries_the_uid() {
    let path =
        format!("/user.slice/user-1001.slice/user@1001.service/user.slice/docker-{ID_A}.scope");
    let mut expected = container("docker", ID_A);
    expected.uid = Some(1001);
    assert_eq!(v2(&path), expected);
}

#[test]
fn upper_case_ids_are_reported_lower_case() {
    let upper = ID_A.to_ascii_uppercase();
    assert_eq!(v2(&format!("/docker/{upper}")), container("docker", ID_A));
}

// ---- containerd / Kubernetes

#[test]
fn containerd_kubernetes_systemd() {
    let path = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SLICE}.slice/cri-containerd-{ID_A}.scope"
    );
    assert_eq!(
        v2(&path),
        in_pod(container("containerd", ID_A), "burstable")
    );
}

#[test]
fn kubernetes_cgroupfs_names_no_runtime() {
    let content = format!(
        "11:memory:/kubepods/besteffort/pod{POD}/{ID_A}\n1:name=systemd:/kubepods/besteffort/pod{POD}/{ID_A}\n"
    );
    assert_eq!(
        workload_from_cgroup(&content),
        in_pod(container("unknown", ID_A), "besteffort")
    );
    // cgroup v2 without systemd (k3s, GKE COS), and guaranteed QoS (no qos level).
    assert_eq!(
        v2(&format!("/kubepods/burstable/pod{POD}/{ID_A}")),
        in_pod(container("unknown", ID_A), "burstable")
    );
    assert_eq!(
        v2(&format!("/kubepods/pod{POD}/{ID_A}")),
        in_pod(container("unknown", ID_A), "guaranteed")
    );
}

#[test]
fn containerd_with_mismatched_cgroup_drivers() {
    let path = format!(
        "/system.slice/containerd.service/kubepods-besteffort-pod{POD_SLICE}.slice:cri-containerd:{ID_A}"
    );
    assert_eq!(
        v2(&path),
        in_pod(container("containerd", ID_A), "besteffort")
    );
}

#[test]
fn nerdctl_is_containerd() {
    assert_eq!(
        v2(&format!("/system.slice/nerdctl-{ID_A}.scope")),
        container("containerd", ID_A)
    );
}

#[test]
fn dockershim_under_kubepods() {
    let path = format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD_SLICE}.slice/docker-{ID_A}.scope"
    );
    assert_eq!(v2(&path), in_pod(container("docker", ID_A), "besteffort"));
}

#[test]
fn kind_node_inside_docker_reports_the_pod_container() {
    let path = format!(
        "/system.slice/docker-{ID_B}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{POD_SLICE}.slice/cri-containerd-{ID_A}.scope"
    );
    assert_eq!(
        v2(&path),
        in_pod(container("containerd", ID_A), "besteffort")
    );
    let cgroupfs = format!("/docker/{ID_B}/kubepods/burstable/pod{POD}/{ID_A}");
    assert_eq!(
        v2(&cgroupfs),
        in_pod(container("unknown", ID_A), "burstable")
    );
}

#[test]
fn static_pod_uid_is_a_32_digit_hash() {
    let hash = "6f0d3f2ce4b0b93a5c5fcfb9b1a5a8f0";
    let path = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{hash}.slice/cri-containerd-{ID_A}.scope"
    );
    assert_eq!(v2(&path).pod_uid.as_deref(), Some(hash));
}

#[test]
fn malformed_pod_uid_keeps_the_container_without_a_pod() {
    let path = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podnot_a_uid.slice/cri-containerd-{ID_A}.scope"
    );
    assert_eq!(v2(&path), container("containerd", ID_A));
}

#[test]
fn pod_without_a_container_is_host() {
    let path =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SLICE}.slice");
    assert_eq!(v2(&path), host(None, None));
}

// ---- CRI-O

#[test]
fn crio_guaranteed_has_no_qos_slice() {
    let path = format!("/kubepods.slice/kubepods-pod{POD_SLICE}.slice/crio-{ID_A}.scope");
    assert_eq!(v2(&path), in_pod(container("cri-o", ID_A), "guaranteed"));
    // With a trailing sub-cgroup, and under the cgroupfs manager.
    assert_eq!(
        v2(&format!("{path}/container")),
        in_pod(container("cri-o", ID_A), "guaranteed")
    );
    assert_eq!(
        v2(&format!("/kubepods/burstable/pod{POD}/crio-{ID_A}")),
        in_pod(container("cri-o", ID_A), "burstable")
    );
}

#[test]
fn conmon_is_not_the_container() {
    let unit = format!("crio-conmon-{ID_A}.scope");
    let path = format!("/kubepods.slice/kubepods-pod{POD_SLICE}.slice/{unit}");
    assert_eq!(v2(&path), host(Some(&unit), None));
    let unit = format!("libpod-conmon-{ID_A}.scope");
    assert_eq!(
        v2(&format!("/machine.slice/{unit}")),
        host(Some(&unit), None)
    );
}

// ---- Podman

#[test]
fn podman_rootful_with_and_without_container_leaf() {
    assert_eq!(
        v2(&format!("/machine.slice/libpod-{ID_A}.scope/container")),
        container("podman", ID_A)
    );
    assert_eq!(
        v2(&format!("/machine.slice/libpod-{ID_A}.scope")),
        container("podman", ID_A)
    );
    // Inside a podman pod.
    let path =
        format!("/machine.slice/machine-libpod_pod_{ID_B}.slice/libpod-{ID_A}.scope/container");
    assert_eq!(v2(&path), container("podman", ID_A));
    // cgroupfs manager.
    assert_eq!(
        v2(&format!("/libpod_parent/libpod-{ID_A}")),
        container("podman", ID_A)
    );
}

#[test]
fn podman_rootless_carries_the_uid() {
    let path = format!(
        "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID_A}.scope/container"
    );
    let mut expected = container("podman", ID_A);
    expected.uid = Some(1000);
    assert_eq!(v2(&path), expected);
}

// ---- other container parents

#[test]
fn unknown_parents_give_unknown_runtime() {
    // Amazon ECS (task id, then container id); a GitHub Actions cgroup parent.
    let path = format!("/ecs/6f0d3f2ce4b0b93a5c5fcfb9b1a5a8f0/{ID_A}");
    assert_eq!(v2(&path), container("unknown", ID_A));
    assert_eq!(
        v2(&format!("/actions_job/{ID_A}")),
        container("unknown", ID_A)
    );
}

#[test]
fn ids_of_the_wrong_shape_are_not_containers() {
    let short = &ID_A[..63];
    let long = format!("{ID_A}a");
    let not_hex = format!("{}g", &ID_A[..63]);
    for bad in [short, long.as_str(), not_hex.as_str()] {
        let unit = format!("docker-{bad}.scope");
        assert_eq!(
            v2(&format!("/system.slice/{unit}")),
            host(Some(&unit), None),
            "{bad}"
        );
        assert_eq!(v2(&format!("/docker/{bad}")), host(None, None), "{bad}");
    }
}

// ---- Slurm

#[test]
fn slurm_v2() {
    assert_eq!(
        v2("/system.slice/slurmstepd.scope/job_48213/step_0/user/task_0"),
        slurm("48213", Some("0"), None)
    );
    // pam_slurm_adopt's extern step, multiple-slurmd node names, the job level itself.
    assert_eq!(
        v2("/system.slice/node7_slurmstepd.scope/job_5/step_extern/user/task_special"),
        slurm("5", Some("extern"), None)
    );
    assert_eq!(
        v2("/system.slice/slurmstepd.scope/job_5"),
        slurm("5", None, None)
    );
}

#[test]
fn slurmstepd_itself_is_host() {
    assert_eq!(
        v2("/system.slice/slurmstepd.scope/system"),
        host(Some("slurmstepd.scope"), None)
    );
    assert_eq!(
        v2("/system.slice/slurmd.service"),
        host(Some("slurmd.service"), None)
    );
}

#[test]
fn slurm_v1() {
    let content = "7:memory:/slurm/uid_1000/job_90210/step_batch/task_0\n3:cpuset:/slurm/uid_1000/job_90210/step_batch/task_0\n1:name=systemd:/user.slice/user-1000.slice/session-1.scope\n";
    assert_eq!(
        workload_from_cgroup(content),
        slurm("90210", Some("batch"), Some(1000))
    );
    assert_eq!(
        v2("/slurm_node3/uid_0/job_17/step_2"),
        slurm("17", Some("2"), Some(0))
    );
}

#[test]
fn job_components_outside_slurm_are_not_jobs() {
    assert_eq!(
        v2("/system.slice/cron.service/job_12/step_1"),
        host(Some("cron.service"), None)
    );
    assert_eq!(v2("/slurm/uid_1000/job_abc/step_0"), host(None, None));
}

// ---- host

#[test]
fn login_session() {
    assert_eq!(
        v2("/user.slice/user-1000.slice/session-3.scope"),
        host(Some("session-3.scope"), Some(1000))
    );
}

#[test]
fn systemd_service() {
    assert_eq!(
        v2("/system.slice/jupyterhub.service"),
        host(Some("jupyterhub.service"), None)
    );
    assert_eq!(v2("/init.scope"), host(Some("init.scope"), None));
    assert_eq!(
        v2("/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service"),
        host(Some("jupyter.service"), Some(1000))
    );
}

#[test]
fn root_empty_and_garbage_are_host() {
    for content in [
        "",
        "0::/\n",
        "0::\n",
        "\n\n",
        "garbage",
        "::::",
        "12:memory",
        "\u{0}\u{0}\u{0}",
        "0::/system.slice/",
        "3:cpuset:/\n2:memory:/\n",
    ] {
        assert_eq!(
            workload_from_cgroup(content),
            host(None, None),
            "{content:?}"
        );
    }
}

#[test]
fn v1_prefers_the_container_line_and_then_systemd() {
    // cpuset not delegated (still at /), the rest in a container.
    let content = format!("3:cpuset:/\n2:memory:/docker/{ID_A}\n1:name=systemd:/docker/{ID_A}\n");
    assert_eq!(workload_from_cgroup(&content), container("docker", ID_A));
    // Two host readings: systemd's hierarchy wins over an odd controller.
    let content =
        "5:net_cls:/system.slice/other.service\n1:name=systemd:/system.slice/jupyterhub.service\n";
    assert_eq!(
        workload_from_cgroup(content),
        host(Some("jupyterhub.service"), None)
    );
}

#[test]
fn crlf_and_bare_paths_are_accepted() {
    let content = format!("0::/system.slice/docker-{ID_A}.scope\r\n");
    assert_eq!(workload_from_cgroup(&content), container("docker", ID_A));
    assert_eq!(
        workload_from_cgroup(&format!("/docker/{ID_A}")),
        container("docker", ID_A)
    );
}

#[test]
fn units_too_long_or_with_control_characters_are_dropped() {
    let long = format!("/system.slice/{}.service", "x".repeat(MAX_FIELD_BYTES));
    assert_eq!(v2(&long), host(None, None));
    assert_eq!(v2("/system.slice/a\u{7}b.service"), host(None, None));
}

// ---- properties

/// What every result must satisfy, whatever the input.
fn assert_valid(w: &Workload) -> Result<(), TestCaseError> {
    for field in [
        Some(&w.runtime),
        w.container_id.as_ref(),
        w.pod_uid.as_ref(),
        w.qos.as_ref(),
        w.job_id.as_ref(),
        w.step.as_ref(),
        w.unit.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        prop_assert!(field.len() <= MAX_FIELD_BYTES);
        prop_assert!(!field.chars().any(char::is_control));
    }
    prop_assert!(WorkloadKind::parse(w.kind.as_str()) == Some(w.kind));
    match w.kind {
        WorkloadKind::Container => {
            let id = w.container_id.as_deref().unwrap_or_default();
            prop_assert!(
                id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            );
            prop_assert!(
                ["docker", "containerd", "cri-o", "podman", "unknown"]
                    .contains(&w.runtime.as_str())
            );
            prop_assert!(w.job_id.is_none() && w.unit.is_none());
            prop_assert_eq!(w.pod_uid.is_some(), w.qos.is_some());
        }
        WorkloadKind::Slurm => {
            prop_assert!(w.job_id.as_deref().is_some_and(is_decimal));
            prop_assert_eq!(w.runtime.as_str(), "slurm");
            prop_assert!(w.container_id.is_none() && w.pod_uid.is_none() && w.unit.is_none());
        }
        WorkloadKind::Host => {
            prop_assert!(w.container_id.is_none() && w.job_id.is_none() && w.pod_uid.is_none());
            prop_assert_eq!(
                w.runtime.as_str(),
                if w.unit.is_some() { "systemd" } else { "" }
            );
        }
    }
    Ok(())
}

/// Path components real hierarchies are made of, to reach deep into the parser.
fn component() -> impl Strategy<Value = String> {
    let id = "[0-9a-fA-F]{62,66}";
    prop_oneof![
        Just("system.slice".to_owned()),
        Just("kubepods".to_owned()),
        Just("kubepods.slice".to_owned()),
        Just("burstable".to_owned()),
        Just("slurm".to_owned()),
        Just("slurmstepd.scope".to_owned()),
        Just("docker".to_owned()),
        Just("container".to_owned()),
        Just("init".to_owned()),
        "(docker|cri-containerd|crio|crio-conmon|libpod|x)-"
            .prop_flat_map(move |p| id.prop_map(move |i| format!("{p}{i}.scope"))),
        id,
        "pod[0-9a-f_-]{30,40}",
        "kubepods-(burstable-|besteffort-)?pod[0-9a-f_]{32,36}\\.slice",
        "(job|step|uid)_[0-9a-z]{0,6}",
        "user(-|@)[0-9]{1,12}\\.(slice|service)",
        "[a-z.:@_-]{0,12}",
        any::<String>(),
    ]
}

proptest! {
    #[test]
    fn never_panics_on_arbitrary_text(content in any::<String>()) {
        assert_valid(&workload_from_cgroup(&content))?;
    }

    #[test]
    fn never_panics_on_cgroup_like_lines(
        lines in prop::collection::vec(
            ("[0-9]{1,2}", "(|name=systemd|memory|cpu,cpuacct|pids|devices|cpuset)",
             prop::collection::vec(component(), 0..8)),
            0..5,
        )
    ) {
        let content: String = lines
            .iter()
            .map(|(id, controllers, parts)| format!("{id}:{controllers}:/{}\n", parts.join("/")))
            .collect();
        assert_valid(&workload_from_cgroup(&content))?;
    }

    #[test]
    fn any_docker_id_round_trips(id in "[0-9a-f]{64}", depth in 0usize..4) {
        let parents = "/x".repeat(depth);
        let w = workload_from_cgroup(&format!("0::{parents}/system.slice/docker-{id}.scope\n"));
        prop_assert_eq!(w, container("docker", &id));
    }
}
