//! Process → workload identity: which container, Kubernetes pod, Slurm job or host unit a
//! GPU process belongs to, read from `/proc/<pid>/cgroup` (plus `cmdline`, `comm` and
//! `status` for the command and the user).
//!
//! The parser works on the *structure* of a cgroup path, not on exact strings, so shapes
//! that differ in a prefix, a nesting level or a trailing component still map correctly.
//! One example path per shape (ids shortened to `<id>`; real ones are 64 hex characters):
//!
//! | shape | example path | result |
//! |-------|--------------|--------|
//! | Docker, systemd driver | `/system.slice/docker-<id>.scope` | container, `docker` |
//! | Docker, cgroupfs driver (v1) | `/docker/<id>` | container, `docker` |
//! | Docker in Docker | `/docker/<outer>/docker/<inner>` | container `<inner>` |
//! | containerd (CRI), systemd | `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_>.slice/cri-containerd-<id>.scope` | container, `containerd`, pod, qos |
//! | containerd, cgroupfs / mixed drivers | `/system.slice/containerd.service/kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>` | container, `containerd`, pod |
//! | nerdctl (containerd) | `/system.slice/nerdctl-<id>.scope` | container, `containerd` |
//! | Kubernetes, cgroupfs (any runtime) | `/kubepods/besteffort/pod<uid>/<id>` | container, `unknown`, pod, qos |
//! | dockershim (Docker under kubelet) | `/kubepods.slice/…/kubepods-pod<uid>.slice/docker-<id>.scope` | container, `docker`, pod |
//! | CRI-O | `/kubepods.slice/kubepods-pod<uid>.slice/crio-<id>.scope` | container, `cri-o`, pod, `guaranteed` |
//! | Podman rootful | `/machine.slice/libpod-<id>.scope/container` | container, `podman` |
//! | Podman rootless | `/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-<id>.scope/container` | container, `podman`, uid 1000 |
//! | Podman, cgroupfs | `/libpod_parent/libpod-<id>` | container, `podman` |
//! | kind / k3s-in-Docker | `/system.slice/docker-<node>.scope/kubelet.slice/kubelet-kubepods.slice/…-pod<uid>.slice/cri-containerd-<id>.scope` | the inner container, with its pod |
//! | Slurm, cgroup v2 | `/system.slice/slurmstepd.scope/job_48213/step_0/user/task_0` | slurm job 48213, step 0 |
//! | Slurm, cgroup v1 | `/slurm/uid_1000/job_90210/step_batch/task_0` | slurm job 90210, step batch, uid 1000 |
//! | login session | `/user.slice/user-1000.slice/session-3.scope` | host, unit `session-3.scope`, uid 1000 |
//! | systemd service | `/system.slice/jupyterhub.service` | host, unit `jupyterhub.service` |
//! | root / unknown | `/`, garbage | host, no unit |
//!
//! Rules, in the order they matter:
//!
//! - **Container ids** are exactly 64 hex characters (reported in lower case), either a
//!   whole path component (`/docker/<id>`, `/kubepods/…/pod<uid>/<id>`) or the last
//!   `-`-separated part of one (`<prefix>-<id>[.scope]`). The prefix, or the component just
//!   before a bare id, names the runtime: `docker`; `cri-containerd`/`containerd`/`nerdctl`
//!   → `containerd`; `crio` → `cri-o`; `libpod` → `podman`; anything else → `unknown`.
//!   A prefix ending in `conmon` (`crio-conmon-<id>`, `libpod-conmon-<id>`) is the
//!   runtime's monitor process, not the container. When several containers nest, the
//!   innermost (deepest) one wins. A container kind always carries a `container_id`.
//! - **Kubernetes pods**: a systemd slice `…kubepods[-<qos>]-pod<uid>.slice` or a cgroupfs
//!   component `pod<uid>` under `kubepods[/<qos>]`. The pod UID is reported with `-` (slice
//!   names spell it with `_`); both UUIDs and the 32-hex-digit hashes of static pods are
//!   accepted. QoS is `besteffort` or `burstable` when named, else `guaranteed`. Pod fields
//!   are only attached to a container found below the pod.
//! - **Slurm**: a `job_<digits>` component below a component containing `slurm`
//!   (`slurm`, `slurm_<node>`, `slurmstepd.scope`, `<node>_slurmstepd.scope`), with the
//!   optional `step_<step>` after it and `uid_<uid>` before it. A Slurm kind always carries a
//!   `job_id`. If a container and a job both appear, the deeper one wins.
//! - **uid** in the path (`user-<uid>.slice`, `user@<uid>.service`, Slurm's `uid_<uid>`) goes
//!   to [`Workload::uid`] for every kind. [`identify`] additionally fills a *host* workload's
//!   uid from the process's real uid (`status`) when the path names none; containers and
//!   Slurm jobs only carry a uid their path states (a uid inside a container is namespaced,
//!   and a job's owner is its Slurm identity, not the uid of one of its processes).
//! - **Host** is everything else: [`Workload::unit`] is the last `.service` / `.scope`
//!   component, if any.
//! - **runtime** is `docker`, `containerd`, `cri-o`, `podman` or `unknown` for containers,
//!   `slurm` for Slurm jobs, `systemd` for host processes in a systemd unit, and empty for
//!   host processes in no known unit.
//!
//! cgroup v1 lists one line per hierarchy; each line is parsed and the most informative
//! result wins (a container or job over a host; then more fields; then the hierarchy, in
//! the order `name=systemd` / unified, `memory`, `cpu`/`cpuacct`, `pids`, `devices`).
//!
//! Nothing here fails or panics: unreadable files give `None` fields, an unrecognised path
//! gives a host workload. Every string produced fits the collector's wire limits
//! ([`MAX_FIELD_BYTES`], no control characters), so an odd process can never get a batch
//! refused.

use gpufleet_core::sample::{Workload, WorkloadKind};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// The longest string this module produces, in bytes. The collector refuses strings longer
/// than its `max_string_len` (512 by default); a long command line is truncated to this,
/// an identity field longer than this is dropped.
pub const MAX_FIELD_BYTES: usize = 512;

/// The most bytes read from one `/proc` file. `cgroup` and `status` are far smaller; a
/// `cmdline` may be megabytes, of which only the first [`MAX_FIELD_BYTES`] are kept.
const MAX_READ_BYTES: u64 = 64 * 1024;

/// The length of a container id (Docker, containerd, CRI-O and Podman all use 256-bit ids).
const CONTAINER_ID_LEN: usize = 64;

/// Who a process is: its workload and, for display, its user and command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// The container, Slurm job or host unit the process's cgroup says it belongs to.
    pub workload: Workload,
    /// The real user: a login name when the uid resolves (see [`UserNames`]), else the uid
    /// as decimal. `None` when `status` could not be read.
    pub user: Option<String>,
    /// The command line, arguments joined by spaces (control characters replaced by
    /// spaces, truncated to [`MAX_FIELD_BYTES`]); the `comm` name when the command line is
    /// empty (kernel threads, zombies). `None` when neither could be read.
    pub command: Option<String>,
}

/// A uid → login name table, parsed from a `passwd` file. Pure and cheap to clone; build
/// it once and pass it to [`identify_with`] rather than re-reading `/etc/passwd` per pid.
///
/// Only the local `passwd` file is consulted (no NSS: LDAP/SSSD users resolve to their
/// uid as a string), and a uid that does not resolve is reported as its decimal value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserNames {
    /// Login name per uid; the first entry wins, as with `getpwuid`.
    by_uid: HashMap<u32, String>,
}

impl UserNames {
    /// A table that resolves nothing: every user is reported as its uid.
    pub fn numeric() -> Self {
        Self::default()
    }

    /// Parses `passwd(5)` content (`name:password:uid:gid:gecos:home:shell`). Malformed
    /// lines, comments and names that would not fit the wire are skipped.
    pub fn from_passwd(content: &str) -> Self {
        let mut by_uid = HashMap::new();
        for line in content.lines() {
            let mut fields = line.split(':');
            let (Some(name), Some(_password), Some(uid)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let name = name.trim();
            if name.is_empty() || name.starts_with('#') {
                continue;
            }
            let (Ok(uid), Some(name)) = (uid.trim().parse::<u32>(), clean_identity(name)) else {
                continue;
            };
            by_uid.entry(uid).or_insert(name);
        }
        Self { by_uid }
    }

    /// Reads a `passwd` file; an unreadable file gives [`UserNames::numeric`].
    pub fn from_file(path: &Path) -> Self {
        read_text(path, MAX_READ_BYTES * 16)
            .map(|content| Self::from_passwd(&content))
            .unwrap_or_default()
    }

    /// The table for processes read under `proc_root`: the host's `/etc/passwd` when
    /// `proc_root` is `/proc`, otherwise (fixtures, a host `/proc` mounted elsewhere)
    /// numeric, since this machine's `/etc/passwd` says nothing about those uids. An agent
    /// that sees the host's `/proc` under another root should pass
    /// `UserNames::from_file(<host root>/etc/passwd)` to [`identify_with`] itself.
    pub fn for_proc_root(proc_root: &Path) -> Self {
        if proc_root == Path::new("/proc") {
            Self::from_file(Path::new("/etc/passwd"))
        } else {
            Self::numeric()
        }
    }

    /// The login name of `uid`, or the uid in decimal when it does not resolve.
    pub fn name(&self, uid: u32) -> String {
        self.by_uid
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }
}

/// Identifies process `pid` from the files under `<proc_root>/<pid>/`, resolving its user
/// with [`UserNames::for_proc_root`]. Convenient for one-off lookups; a sampler that
/// identifies many processes should build the [`UserNames`] once and call
/// [`identify_with`]. Never fails: see [`identify_with`].
pub fn identify(proc_root: &Path, pid: u32) -> ProcessIdentity {
    identify_with(proc_root, pid, &UserNames::for_proc_root(proc_root))
}

/// Identifies process `pid` from `<proc_root>/<pid>/{cgroup,cmdline,comm,status}`.
///
/// Never fails and never panics: a missing or unreadable `cgroup` gives a host workload,
/// a missing `status` a `None` user (and no uid), missing `cmdline` and `comm` a `None`
/// command. A host workload whose path names no uid gets the process's real uid.
pub fn identify_with(proc_root: &Path, pid: u32, users: &UserNames) -> ProcessIdentity {
    let dir = proc_root.join(pid.to_string());
    let mut workload = read_text(&dir.join("cgroup"), MAX_READ_BYTES)
        .map(|content| workload_from_cgroup(&content))
        .unwrap_or_default();
    let uid = read_text(&dir.join("status"), MAX_READ_BYTES).and_then(|s| real_uid(&s));
    if workload.kind == WorkloadKind::Host && workload.uid.is_none() {
        workload.uid = uid;
    }
    let command = read_bytes(&dir.join("cmdline"), MAX_READ_BYTES)
        .and_then(|raw| command_from_cmdline(&raw))
        .or_else(|| {
            read_bytes(&dir.join("comm"), MAX_READ_BYTES).and_then(|raw| clean_command(&raw))
        });
    ProcessIdentity {
        workload,
        user: uid.map(|uid| users.name(uid)),
        command,
    }
}

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
struct Scan {
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
struct Pod {
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
fn container_from_component(
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
fn runtime_for_prefix(prefix: &str) -> &'static str {
    match prefix {
        "docker" => "docker",
        "cri-containerd" | "containerd" | "nerdctl" => "containerd",
        "crio" | "cri-o" => "cri-o",
        "libpod" => "podman",
        _ => "unknown",
    }
}

/// Exactly 64 ASCII hex digits.
fn is_container_id(s: &str) -> bool {
    s.len() == CONTAINER_ID_LEN && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod named by a systemd slice stem like `kubepods-burstable-pod<uid_with_>`, where the
/// `kubepods` segment may itself be prefixed (`kubelet-kubepods-…`).
fn pod_from_slice(stem: &str) -> Option<Pod> {
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

fn qos_name(qos: &str) -> &'static str {
    match qos {
        "besteffort" => "besteffort",
        "burstable" => "burstable",
        _ => "guaranteed",
    }
}

/// A pod UID in the form Kubernetes reports it: `_` turned into `-`, lower case. Accepts
/// hex digits and separators with 32 hex digits in all (UUIDs, and static pods' hashes).
fn pod_uid(raw: &str) -> Option<String> {
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
fn user_uid(component: &str) -> Option<u32> {
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

fn is_decimal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn parse_decimal(s: &str) -> Option<u32> {
    if is_decimal(s) { s.parse().ok() } else { None }
}

/// Ranks a result's kind: a container or job says more than a host unit, which says more
/// than nothing.
fn kind_rank(workload: &Workload) -> u8 {
    match workload.kind {
        WorkloadKind::Container | WorkloadKind::Slurm => 2,
        WorkloadKind::Host if workload.unit.is_some() || workload.uid.is_some() => 1,
        WorkloadKind::Host => 0,
    }
}

/// How many identity fields a result carries.
fn field_count(workload: &Workload) -> usize {
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
fn controller_rank(controllers: &str) -> u8 {
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

/// The real uid: the first number on `status`'s `Uid:` line.
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(parse_decimal)
}

/// `cmdline`'s NUL-separated arguments joined by spaces; `None` when there are none.
fn command_from_cmdline(raw: &[u8]) -> Option<String> {
    let joined: Vec<u8> = raw.iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
    clean_command(&joined)
}

/// Lossy UTF-8, control characters as spaces, trimmed, cut to [`MAX_FIELD_BYTES`] on a
/// character boundary; `None` when empty.
fn clean_command(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned();
    if cleaned.len() > MAX_FIELD_BYTES {
        let mut end = MAX_FIELD_BYTES;
        while !cleaned.is_char_boundary(end) {
            end -= 1;
        }
        cleaned.truncate(end);
        cleaned.truncate(cleaned.trim_end().len());
    }
    (!cleaned.is_empty()).then_some(cleaned)
}

/// An identity field (unit, step, user name) as read, or `None` when it would not pass the
/// collector's checks (empty, too long, control characters). Identity is never mangled.
fn clean_identity(s: &str) -> Option<String> {
    (!s.is_empty() && s.len() <= MAX_FIELD_BYTES && !s.chars().any(char::is_control))
        .then(|| s.to_owned())
}

/// Reads at most `limit` bytes of a file; `None` when it cannot be opened or read.
fn read_bytes(path: &Path, limit: u64) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(limit)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// [`read_bytes`] as lossy UTF-8.
fn read_text(path: &Path, limit: u64) -> Option<String> {
    read_bytes(path, limit).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_SLICE}.slice"
        );
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
        let content =
            format!("3:cpuset:/\n2:memory:/docker/{ID_A}\n1:name=systemd:/docker/{ID_A}\n");
        assert_eq!(workload_from_cgroup(&content), container("docker", ID_A));
        // Two host readings: systemd's hierarchy wins over an odd controller.
        let content = "5:net_cls:/system.slice/other.service\n1:name=systemd:/system.slice/jupyterhub.service\n";
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

    // ---- users and commands

    #[test]
    fn passwd_resolves_names_and_falls_back_to_the_uid() {
        let users = UserNames::from_passwd(
            "# comment\nroot:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\nalias:x:1000:1000::/:/bin/sh\nbroken\nbad:x:notanumber:0::/:/bin/sh\n",
        );
        assert_eq!(users.name(0), "root");
        assert_eq!(users.name(1000), "alice");
        assert_eq!(users.name(4242), "4242");
        assert_eq!(UserNames::numeric().name(0), "0");
        assert_eq!(
            UserNames::for_proc_root(Path::new("/tmp/fixtures")),
            UserNames::numeric()
        );
    }

    #[test]
    fn status_real_uid() {
        assert_eq!(real_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n"), Some(1000));
        assert_eq!(real_uid("Name:\tx\n"), None);
        assert_eq!(real_uid("Uid:\tnope\n"), None);
    }

    #[test]
    fn cmdline_joins_arguments_and_cleans_them() {
        assert_eq!(
            command_from_cmdline(b"python\0train.py\0").as_deref(),
            Some("python train.py")
        );
        assert_eq!(command_from_cmdline(b"").as_deref(), None);
        assert_eq!(command_from_cmdline(b"\0\0").as_deref(), None);
        assert_eq!(
            command_from_cmdline(b"python\0-c\0import os\nprint(1)\0").as_deref(),
            Some("python -c import os print(1)")
        );
        let long = format!("python\0{}", "é".repeat(MAX_FIELD_BYTES));
        let command = command_from_cmdline(long.as_bytes()).unwrap_or_default();
        assert!(command.len() <= MAX_FIELD_BYTES && command.starts_with("python é"));
        assert_eq!(clean_command(b"python\n").as_deref(), Some("python"));
    }

    #[test]
    fn missing_process_is_an_empty_host_identity() {
        let identity = identify(Path::new("/nonexistent/proc"), 1);
        assert_eq!(identity, ProcessIdentity::default());
    }

    #[test]
    fn field_limit_fits_the_collector() {
        assert!(MAX_FIELD_BYTES <= gpufleet_core::wire::Limits::default().max_string_len);
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
}
