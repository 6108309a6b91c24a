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
//!
//! Layout: `path` parses a cgroup file or path into a [`Workload`]; `process` reads a
//! process's `/proc` files into its [`ProcessIdentity`] and resolves user names.
//!
//! [`Workload`]: gpufleet_core::sample::Workload
//! [`Workload::uid`]: gpufleet_core::sample::Workload::uid
//! [`Workload::unit`]: gpufleet_core::sample::Workload::unit

mod path;
mod process;

pub use path::{workload_from_cgroup, workload_from_path};
pub use process::{ProcessIdentity, UserNames, identify, identify_with};

/// The longest string this module produces, in bytes. The collector refuses strings longer
/// than its `max_string_len` (512 by default); a long command line is truncated to this,
/// an identity field longer than this is dropped.
pub const MAX_FIELD_BYTES: usize = 512;

/// The most bytes read from one `/proc` file. `cgroup` and `status` are far smaller; a
/// `cmdline` may be megabytes, of which only the first [`MAX_FIELD_BYTES`] are kept.
const MAX_READ_BYTES: u64 = 64 * 1024;

/// The length of a container id (Docker, containerd, CRI-O and Podman all use 256-bit ids).
const CONTAINER_ID_LEN: usize = 64;

/// An identity field (unit, step, user name) as read, or `None` when it would not pass the
/// collector's checks (empty, too long, control characters). Identity is never mangled.
pub(crate) fn clean_identity(s: &str) -> Option<String> {
    (!s.is_empty() && s.len() <= MAX_FIELD_BYTES && !s.chars().any(char::is_control))
        .then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_limit_fits_the_collector() {
        assert!(MAX_FIELD_BYTES <= gpufleet_core::wire::Limits::default().max_string_len);
    }
}
