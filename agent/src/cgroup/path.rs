//! The cgroup path parser: one `/proc/<pid>/cgroup` file or path → a [`Workload`], by the
//! structure of the path (container ids, pod slices, Slurm jobs, systemd units).

use super::{CONTAINER_ID_LEN, clean_identity};
use gpufleet_core::sample::{Workload, WorkloadKind};

/// The workload named by the content of a `/proc/<pid>/cgroup` file, v1 or v2.
///
/// Each `hierarchy-id:controllers:path` line is parsed with [`workload_from_path`] and the
/// most informative result wins (see the module doc). A line that is just a path (starts
/// with `/`) is accepted too. Empty or unparseable content gives a host workload with no
/// unit. Pure; never panics.
pub fn workload_from_cgroup(content: &str) -> Workload {
    let mut best: Option<((u8, usize, u8), Workload)> = None;
    for line in content.lines() {
        let line = line.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        let (controllers, path) = if line.starts_with('/') {
            ("", line)
        } else {
            let mut parts = line.splitn(3, ':');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(_id), Some(controllers), Some(path)) => (controllers, path),
                _ => continue,
            }
        };
        let workload = workload_from_path(path);
        let score = (
            kind_rank(&workload),
            field_count(&workload),
            controller_rank(controllers),
        );
        if best
            .as_ref()
            .is_none_or(|(best_score, _)| score > *best_score)
        {
            best = Some((score, workload));
        }
    }
    best.map(|(_, workload)| workload).unwrap_or_default()
}

/// The workload named by one cgroup path (the third field of a `/proc/<pid>/cgroup` line),
/// e.g. `/system.slice/docker-<id>.scope`. Pure; never panics; an unrecognised path gives a
/// host workload.
pub fn workload_from_path(path: &str) -> Workload {
    // `:` separates parts of one component in the `<slice>:<prefix>:<id>` shape that
    // containerd writes when its cgroup driver and the kubelet's disagree.
    let components: Vec<&str> = path.split(['/', ':']).filter(|c| !c.is_empty()).collect();

    let mut scan = Scan::default();
    for (index, &component) in components.iter().enumerate() {
        let previous = index
            .checked_sub(1)
            .and_then(|i| components.get(i))
            .copied();
        scan.visit(index, component, previous);
    }
    scan.finish()
}

/// What a walk down one cgroup path has seen so far.
#[derive(Default)]
pub(super) struct Scan {
    /// The deepest container seen: its depth, id, runtime, and the pod it sits in.
    container: Option<(usize, String, &'static str, Option<Pod>)>,
    /// The innermost Kubernetes pod seen so far (attached to containers found below it).
    pod: Option<Pod>,
    /// Inside a cgroupfs `kubepods` tree, with the QoS class its path names so far.
    kubepods_qos: Option<&'static str>,
    /// Below a component that names Slurm, so `job_` / `step_` / `uid_` mean Slurm's.
    in_slurm: bool,
    /// The Slurm job seen: its depth, id and step.
    job: Option<(usize, String, Option<String>)>,
    /// Slurm's `uid_<uid>` component.
    slurm_uid: Option<u32>,
    /// The uid of a `user-<uid>.slice` / `user@<uid>.service` component.
    user_uid: Option<u32>,
    /// The last `.service` / `.scope` component: the host unit.
    unit: Option<String>,
}

/// A Kubernetes pod as its cgroup names it.
#[derive(Clone)]
pub(super) struct Pod {
    /// The pod UID with `-` separators, lower case.
    uid: String,
    /// `besteffort`, `burstable` or `guaranteed`.
    qos: &'static str,
}

impl Scan {
    fn visit(&mut self, index: usize, component: &str, previous: Option<&str>) {
        if component.ends_with(".service") || component.ends_with(".scope") {
            self.unit = Some(component.to_owned());
        }
        if let Some(uid) = user_uid(component) {
            self.user_uid = Some(uid);
        }

        // Kubernetes: systemd slices describe themselves; cgroupfs needs context.
        if let Some(stem) = component.strip_suffix(".slice") {
            if let Some(pod) = pod_from_slice(stem) {
                self.pod = Some(pod);
            }
        } else if component == "kubepods" {
            self.kubepods_qos = Some("guaranteed");
        } else if let Some(qos) = self.kubepods_qos {
            if previous == Some("kubepods") && matches!(component, "besteffort" | "burstable") {
                self.kubepods_qos = Some(qos_name(component));
            } else if let Some(uid) = component.strip_prefix("pod").and_then(pod_uid) {
                self.pod = Some(Pod { uid, qos });
            }
        }

        if let Some((id, runtime)) = container_from_component(component, previous) {
            self.container = Some((index, id, runtime, self.pod.clone()));
        }

        // Slurm.
        if component.contains("slurm") {
            self.in_slurm = true;
        } else if self.in_slurm {
            if let Some(uid) = component.strip_prefix("uid_").and_then(parse_decimal) {
                self.slurm_uid = Some(uid);
            } else if let Some(job) = component.strip_prefix("job_").filter(|j| is_decimal(j)) {
                self.job = Some((index, job.to_owned(), None));
            } else if let (Some(step), Some((_, _, slot @ None))) =
                (component.strip_prefix("step_"), self.job.as_mut())
            {
                *slot = clean_identity(step);
            }
        }
    }

    fn finish(self) -> Workload {
        let job_depth = self.job.as_ref().map(|(depth, _, _)| *depth);
        let container_depth = self.container.as_ref().map(|(depth, ..)| *depth);
        match (self.job, self.container) {
            (Some((_, job_id, step)), _) if job_depth > container_depth => Workload {
                kind: WorkloadKind::Slurm,
                runtime: "slurm".to_owned(),
                job_id: Some(job_id),
                step,
                uid: self.slurm_uid.or(self.user_uid),
                ..Workload::default()
            },
            (_, Some((_, container_id, runtime, pod))) => Workload {
                kind: WorkloadKind::Container,
                runtime: runtime.to_owned(),
                container_id: Some(container_id),
                pod_uid: pod.as_ref().map(|p| p.uid.clone()),
                qos: pod.map(|p| p.qos.to_owned()),
                uid: self.user_uid,
                ..Workload::default()
            },
            _ => {
                let unit = self.unit.and_then(|u| clean_identity(&u));
                Workload {
                    kind: WorkloadKind::Host,
                    runtime: if unit.is_some() { "systemd" } else { "" }.to_owned(),
                    unit,
                    uid: self.user_uid,
                    ..Workload::default()
                }
            }
        }
    }
}

/// A container id and runtime named by one path component, if it names one.
pub(super) fn container_from_component(
    component: &str,
    previous: Option<&str>,
) -> Option<(String, &'static str)> {
    let stem = component.strip_suffix(".scope").unwrap_or(component);
    if is_container_id(stem) {
        let runtime = previous.map_or("unknown", runtime_for_prefix);
        return Some((stem.to_ascii_lowercase(), runtime));
    }
    let (prefix, id) = stem.rsplit_once('-')?;
    if !is_container_id(id) || prefix.is_empty() || prefix.ends_with("conmon") {
        return None;
    }
    Some((id.to_ascii_lowercase(), runtime_for_prefix(prefix)))
}

/// The runtime a container-id prefix (or the parent of a bare id) names.
pub(super) fn runtime_for_prefix(prefix: &str) -> &'static str {
    match prefix {
        "docker" => "docker",
        "cri-containerd" | "containerd" | "nerdctl" => "containerd",
        "crio" | "cri-o" => "cri-o",
        "libpod" => "podman",
        _ => "unknown",
    }
}

/// Exactly 64 ASCII hex digits.
pub(super) fn is_container_id(s: &str) -> bool {
    s.len() == CONTAINER_ID_LEN && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod named by a systemd slice stem like `kubepods-burstable-pod<uid_with_>`, where the
/// `kubepods` segment may itself be prefixed (`kubelet-kubepods-…`).
pub(super) fn pod_from_slice(stem: &str) -> Option<Pod> {
    let segments: Vec<&str> = stem.split('-').collect();
    let at = segments.iter().position(|s| *s == "kubepods")?;
    let rest = segments.get(at + 1..)?;
    let (qos, pod) = match rest {
        [pod] => ("guaranteed", *pod),
        [qos @ ("besteffort" | "burstable"), pod] => (qos_name(qos), *pod),
        _ => return None,
    };
    let uid = pod_uid(pod.strip_prefix("pod")?)?;
    Some(Pod { uid, qos })
}

pub(super) fn qos_name(qos: &str) -> &'static str {
    match qos {
        "besteffort" => "besteffort",
        "burstable" => "burstable",
        _ => "guaranteed",
    }
}

/// A pod UID in the form Kubernetes reports it: `_` turned into `-`, lower case. Accepts
/// hex digits and separators with 32 hex digits in all (UUIDs, and static pods' hashes).
pub(super) fn pod_uid(raw: &str) -> Option<String> {
    let uid: String = raw
        .chars()
        .map(|c| {
            if c == '_' {
                '-'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    let hex_digits = uid.chars().filter(char::is_ascii_hexdigit).count();
    let only_hex_and_dashes = uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit());
    (only_hex_and_dashes && hex_digits == 32 && !uid.starts_with('-') && !uid.ends_with('-'))
        .then_some(uid)
}

/// The uid of a systemd `user-<uid>.slice` or `user@<uid>.service` component.
pub(super) fn user_uid(component: &str) -> Option<u32> {
    component
        .strip_prefix("user-")
        .and_then(|rest| rest.strip_suffix(".slice"))
        .or_else(|| {
            component
                .strip_prefix("user@")
                .and_then(|rest| rest.strip_suffix(".service"))
        })
        .and_then(parse_decimal)
}

pub(super) fn is_decimal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

pub(super) fn parse_decimal(s: &str) -> Option<u32> {
    if is_decimal(s) { s.parse().ok() } else { None }
}

/// Ranks a result's kind: a container or job says more than a host unit, which says more
/// than nothing.
pub(super) fn kind_rank(workload: &Workload) -> u8 {
    match workload.kind {
        WorkloadKind::Container | WorkloadKind::Slurm => 2,
        WorkloadKind::Host if workload.unit.is_some() || workload.uid.is_some() => 1,
        WorkloadKind::Host => 0,
    }
}

/// How many identity fields a result carries.
pub(super) fn field_count(workload: &Workload) -> usize {
    [
        workload.container_id.is_some(),
        workload.pod_uid.is_some(),
        workload.qos.is_some(),
        workload.job_id.is_some(),
        workload.step.is_some(),
        workload.unit.is_some(),
        workload.uid.is_some(),
    ]
    .into_iter()
    .filter(|present| *present)
    .count()
}

/// Prefers the hierarchies that track every process: systemd's (v1 `name=systemd`, or
/// the unified `0::` line), then memory, cpu, pids, devices.
pub(super) fn controller_rank(controllers: &str) -> u8 {
    controllers
        .split(',')
        .map(|controller| match controller {
            "" | "name=systemd" => 5,
            "memory" => 4,
            "cpu" | "cpuacct" => 3,
            "pids" => 2,
            "devices" => 1,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
