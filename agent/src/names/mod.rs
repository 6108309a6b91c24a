//! Names people know for the workloads the cgroup parser finds by id: a Kubernetes pod's
//! name, namespace and allow-listed labels and its containers' names and images (the
//! Kubernetes API, [`kube`]); a Docker or Podman container's name, image and labels (the
//! Docker Engine API on its socket, [`docker`]); a Slurm job's name, account, partition
//! and user (the job's environment, else `scontrol`, [`slurm`]).
//!
//! **Never at the sampler's expense.** The sampler only reads the [`NameCache`]
//! ([`NameCache::fill`]: a read lock, no I/O) and asks for what it lacks through a
//! bounded queue it never waits on. Look-ups run on a thread of their own
//! ([`spawn_resolver`]), each bounded in time; the caches are bounded in size. A sample
//! goes out on time with the ids it has; the names fill in when a source answers. Each
//! source's failures are counted per cause and warned about once per cause.
//! Names are never logged at info.

pub mod docker;
pub mod kube;
pub mod slurm;

use gpufleet_core::sample::{Tick, Workload, WorkloadKind};
use gpufleet_core::{GpuSource, Inventory, SourceError, UnixMs};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Names a runtime gives a workload; absent is `None` / empty, never `""`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeNames {
    pub container_name: Option<String>,
    pub image: Option<String>,
    pub pod_name: Option<String>,
    pub namespace: Option<String>,
    pub job_name: Option<String>,
    pub account: Option<String>,
    pub partition: Option<String>,
    /// The Slurm job's user (`SLURM_JOB_USER` / scontrol's `UserId` name).
    pub job_user: Option<String>,
    /// The Slurm array task (`<array job id>_<task id>`) the job is.
    pub array_task: Option<String>,
    /// The heterogeneous Slurm job component (`<het job id>+<offset>`) the job is.
    pub het_component: Option<String>,
    /// Allow-listed labels (Kubernetes pod labels, Docker container labels).
    pub labels: BTreeMap<String, String>,
}

/// The names as a workload that holds nothing else: how the cache keeps them, so the
/// sampler writes them with [`Workload::merge_names`], the one merge rule.
impl From<RuntimeNames> for Workload {
    fn from(n: RuntimeNames) -> Workload {
        Workload {
            container_name: n.container_name,
            image: n.image,
            pod_name: n.pod_name,
            namespace: n.namespace,
            job_name: n.job_name,
            account: n.account,
            partition: n.partition,
            job_user: n.job_user,
            array_task: n.array_task,
            het_component: n.het_component,
            labels: n.labels,
            ..Default::default()
        }
    }
}

impl From<&Workload> for RuntimeNames {
    fn from(w: &Workload) -> RuntimeNames {
        RuntimeNames {
            container_name: w.container_name.clone(),
            image: w.image.clone(),
            pod_name: w.pod_name.clone(),
            namespace: w.namespace.clone(),
            job_name: w.job_name.clone(),
            account: w.account.clone(),
            partition: w.partition.clone(),
            job_user: w.job_user.clone(),
            array_task: w.array_task.clone(),
            het_component: w.het_component.clone(),
            labels: w.labels.clone(),
        }
    }
}

/// Why a look-up gave no names. [`NameError::cause`] is a short stable word, used to warn
/// once per cause and as a counter's label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{source_name} is unreachable: {why}")]
    Unreachable {
        source_name: &'static str,
        why: String,
    },
    #[error("{source_name} refused the look-up (permission): {why}")]
    Forbidden {
        source_name: &'static str,
        why: String,
    },
    #[error("{source_name} knows no such workload")]
    NotFound { source_name: &'static str },
    #[error("{source_name} answered something unexpected: {why}")]
    Malformed {
        source_name: &'static str,
        why: String,
    },
    #[error("{source_name} did not answer within {secs} s")]
    TimedOut {
        source_name: &'static str,
        secs: u64,
    },
}

impl NameError {
    /// `unreachable`, `forbidden`, `not_found`, `malformed` or `timeout`.
    pub fn cause(&self) -> &'static str {
        match self {
            NameError::Unreachable { .. } => "unreachable",
            NameError::Forbidden { .. } => "forbidden",
            NameError::NotFound { .. } => "not_found",
            NameError::Malformed { .. } => "malformed",
            NameError::TimedOut { .. } => "timeout",
        }
    }

    /// The source that failed.
    pub fn source_name(&self) -> &'static str {
        match self {
            NameError::Unreachable { source_name, .. }
            | NameError::Forbidden { source_name, .. }
            | NameError::NotFound { source_name }
            | NameError::Malformed { source_name, .. }
            | NameError::TimedOut { source_name, .. } => source_name,
        }
    }
}

/// A name as a runtime gave it, trimmed, or `None` when it would not pass the collector's
/// wire checks (the cgroup identities' rule: empty, too long, control characters): a
/// source answering junk never gets a batch refused.
pub(crate) fn clean_name(s: &str) -> Option<String> {
    crate::cgroup::clean_identity(s.trim())
}

/// `d` in whole seconds, rounded up (a 200 ms timeout is "1 s", not "0 s").
pub(crate) fn whole_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The first `max_chars` characters of `s` (an error message quoted in ours).
pub(crate) fn cut(s: &str, max_chars: usize) -> String {
    s.chars().take(max_chars).collect()
}

/// Most workloads of each kind the cache holds names for; past it, nothing new is kept
/// until the cache is cleared (a node runs far fewer containers than this).
pub const MAX_CACHED: usize = 16_384;
/// Look-ups waiting at most; the sampler's asks beyond it are dropped and asked again
/// later.
pub const QUEUE: usize = 256;
/// How long a failed or unanswered look-up waits before it is asked again.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// A look-up the sampler asks the resolver for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NameRequest {
    /// A container outside Kubernetes, by its 64-hex id (Docker, Podman).
    Container(String),
    /// A Slurm job, through one of its processes.
    Job { id: String, pid: u32 },
}

/// The names known, each as a workload holding only names (`From<RuntimeNames>`).
#[derive(Debug, Default)]
struct Known {
    /// By pod UID: the pod's names and labels.
    pods: HashMap<String, Workload>,
    /// By container id: its names, with its pod's.
    containers: HashMap<String, Workload>,
    /// By Slurm job id.
    jobs: HashMap<String, Workload>,
}

/// The names known so far, written by the sources and read by the sampler.
#[derive(Debug, Default)]
pub struct NameCache {
    known: RwLock<Known>,
    /// When each look-up was last asked for, so it is asked once per [`RETRY_AFTER`].
    asked: Mutex<HashMap<NameRequest, Instant>>,
    requests: Mutex<Option<mpsc::Sender<NameRequest>>>,
    /// Failures per (source, cause), and whether each was warned about.
    errors: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Look-ups asked for and not answered yet, and a Kubernetes initial list not done
    /// yet: what [`NameCache::wait_settled`] waits for.
    pending: std::sync::atomic::AtomicUsize,
}

fn put(map: &mut HashMap<String, Workload>, key: &str, names: RuntimeNames) {
    if map.len() >= MAX_CACHED && !map.contains_key(key) {
        return;
    }
    map.insert(key.to_owned(), names.into());
}

impl NameCache {
    pub fn new() -> NameCache {
        NameCache::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Known> {
        self.known.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Known> {
        self.known.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The names of pod `uid`.
    pub fn pod(&self, uid: &str) -> Option<RuntimeNames> {
        self.read().pods.get(uid).map(RuntimeNames::from)
    }

    /// The names of container `id`, with its pod's.
    pub fn container(&self, id: &str) -> Option<RuntimeNames> {
        self.read().containers.get(id).map(RuntimeNames::from)
    }

    /// The names of Slurm job `id`.
    pub fn job(&self, id: &str) -> Option<RuntimeNames> {
        self.read().jobs.get(id).map(RuntimeNames::from)
    }

    /// Keeps `names` for pod `uid` and for each of `containers` (id, names): a pod seen
    /// by the Kubernetes watcher.
    pub fn put_pod(&self, uid: &str, names: RuntimeNames, containers: Vec<(String, RuntimeNames)>) {
        let mut k = self.write();
        put(&mut k.pods, uid, names);
        for (id, c) in containers {
            put(&mut k.containers, &id, c);
        }
    }

    /// Keeps `names` for container `id`.
    pub fn put_container(&self, id: &str, names: RuntimeNames) {
        put(&mut self.write().containers, id, names);
    }

    /// Keeps `names` for Slurm job `id`.
    pub fn put_job(&self, id: &str, names: RuntimeNames) {
        put(&mut self.write().jobs, id, names);
    }

    /// Counts a failure of a source; `true` the first time this source failed for this
    /// cause (the caller warns then, and only then).
    pub fn record_error(&self, e: &NameError) -> bool {
        let mut errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        let n = errors.entry((e.source_name(), e.cause())).or_insert(0);
        *n += 1;
        *n == 1
    }

    /// Failures so far: (source, cause, count).
    pub fn source_errors(&self) -> Vec<(&'static str, &'static str, u64)> {
        let errors = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        errors.iter().map(|(&(s, c), &n)| (s, c, n)).collect()
    }

    /// Connects the queue the sampler asks through.
    fn connect(&self, tx: mpsc::Sender<NameRequest>) {
        *self.requests.lock().unwrap_or_else(PoisonError::into_inner) = Some(tx);
    }

    /// Asks for `request` unless it was asked within [`RETRY_AFTER`]; never waits (a full
    /// queue drops the ask, which comes again on a later tick).
    fn ask(&self, request: NameRequest) {
        let now = Instant::now();
        let requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(tx) = requests.as_ref() else { return };
        let mut asked = self.asked.lock().unwrap_or_else(PoisonError::into_inner);
        if asked
            .get(&request)
            .is_some_and(|at| now.duration_since(*at) < RETRY_AFTER)
        {
            return;
        }
        if asked.len() >= MAX_CACHED {
            asked.retain(|_, at| now.duration_since(*at) < RETRY_AFTER);
        }
        if tx.try_send(request.clone()).is_ok() {
            self.pending
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            asked.insert(request, now);
        }
    }

    /// Writes the names known for `w` (process `pid`) into it, and asks for those it
    /// lacks. A read lock and a map look-up: no I/O, never waits on a source.
    pub fn fill(&self, w: &mut Workload, pid: u32) {
        let ask = {
            let k = self.read();
            let known = match w.kind {
                // The pod is known before its container statuses are.
                WorkloadKind::Container => (w.container_id.as_ref())
                    .and_then(|id| k.containers.get(id))
                    .or_else(|| w.pod_uid.as_ref().and_then(|uid| k.pods.get(uid))),
                WorkloadKind::Slurm => w.job_id.as_ref().and_then(|id| k.jobs.get(id)),
                WorkloadKind::Host => return,
            };
            match known {
                Some(names) => {
                    w.merge_names(names);
                    return;
                }
                // A pod's containers are named by the watcher, not by asking.
                None if w.pod_uid.is_some() => return,
                None => match (w.kind, &w.container_id, &w.job_id) {
                    (WorkloadKind::Container, Some(id), _) => NameRequest::Container(id.clone()),
                    (WorkloadKind::Slurm, _, Some(id)) => NameRequest::Job {
                        id: id.clone(),
                        pid,
                    },
                    _ => return,
                },
            }
        };
        self.ask(ask);
    }

    /// Counts one more thing [`NameCache::wait_settled`] waits for.
    pub(crate) fn begin(&self) {
        self.pending
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// One thing waited for is done (answered or failed).
    pub(crate) fn done(&self) {
        let _ = self.pending.fetch_update(
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
            |n| Some(n.saturating_sub(1)),
        );
    }

    /// Waits (blocking, at most `timeout`) until every look-up asked for was answered or
    /// failed: for a one-off reading (`snapshot`), never for the sampler.
    pub fn wait_settled(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.pending.load(std::sync::atomic::Ordering::SeqCst) > 0
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`NameCache::fill`] for every process of `tick`.
    pub fn fill_tick(&self, tick: &mut Tick) {
        for p in &mut tick.processes {
            self.fill(&mut p.workload, p.pid);
        }
    }
}

/// Which sources the resolver uses, and how.
#[derive(Debug, Clone)]
pub struct NameSources {
    /// This node's name, to watch its pods only.
    pub node: String,
    /// Where `/proc` is (a Slurm job's environment).
    pub proc_root: PathBuf,
    /// The Kubernetes watcher, when a client configuration was found.
    pub kubernetes: Option<kube::KubeSource>,
    /// The Docker Engine API socket, when one exists.
    pub docker_socket: Option<PathBuf>,
    /// `scontrol`, when it is on the node.
    pub scontrol: Option<PathBuf>,
    /// Pod labels kept (`--kube-label`).
    pub kube_labels: Vec<String>,
    /// Container labels kept (`--docker-label`).
    pub docker_labels: Vec<String>,
    /// Longest a single look-up may take.
    pub timeout: Duration,
}

/// Look-ups at once.
const CONCURRENT: usize = 4;

/// Starts the resolver on a thread of its own (with its own runtime, so a slow source
/// holds up neither the sampler nor the uplink) and connects `cache`'s queue to it. The
/// thread runs until the process ends.
pub fn spawn_resolver(cache: Arc<NameCache>, sources: NameSources) -> std::io::Result<()> {
    let (tx, rx) = mpsc::channel(QUEUE);
    cache.connect(tx);
    std::thread::Builder::new()
        .name("names".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    warn!(error = %e, "workload names: cannot start their runtime; workloads keep their ids");
                    return;
                }
            };
            runtime.block_on(resolve(cache, sources, rx));
        })
        .map(|_| ())
}

async fn resolve(cache: Arc<NameCache>, sources: NameSources, mut rx: mpsc::Receiver<NameRequest>) {
    if let Some(k) = &sources.kubernetes {
        cache.begin();
        kube::spawn_from_source(
            k.clone(),
            kube::KubeOptions {
                node: sources.node.clone(),
                allowed_labels: sources.kube_labels.clone(),
            },
            Arc::clone(&cache),
        );
    }
    let docker = match &sources.docker_socket {
        Some(socket) => {
            match docker::DockerNames::connect(
                socket,
                sources.docker_labels.clone(),
                sources.timeout,
            ) {
                Ok(d) => Some(Arc::new(d)),
                Err(e) => {
                    report(&cache, &e);
                    None
                }
            }
        }
        None => None,
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    let sources = Arc::new(sources);
    while let Some(request) = rx.recv().await {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (cache, sources, docker) = (Arc::clone(&cache), Arc::clone(&sources), docker.clone());
        tokio::spawn(async move {
            let _slot = slot;
            match request {
                NameRequest::Container(id) => {
                    if let Some(docker) = &docker {
                        match docker.names(&id).await {
                            Ok(names) => cache.put_container(&id, names),
                            Err(e) => report(&cache, &e),
                        }
                    }
                }
                NameRequest::Job { id, pid } => match job_names(&sources, &id, pid).await {
                    Ok(names) => cache.put_job(&id, names),
                    Err(e) => report(&cache, &e),
                },
            }
            cache.done();
        });
    }
}

/// A Slurm job's names: from the process's environment, else from `scontrol`.
async fn job_names(sources: &NameSources, id: &str, pid: u32) -> Result<RuntimeNames, NameError> {
    let from_env = slurm::read_environ(&sources.proc_root, pid)
        .ok()
        .and_then(|env| slurm::names_from_environ(&env, id));
    match (from_env, &sources.scontrol) {
        (Some(names), _) => Ok(names),
        (None, Some(scontrol)) => slurm::scontrol_show_job(scontrol, id, sources.timeout).await,
        (None, None) => Err(NameError::NotFound {
            source_name: "slurm",
        }),
    }
}

/// Counts a failure; warns the first time its source fails for its cause.
pub(crate) fn report(cache: &NameCache, e: &NameError) {
    if cache.record_error(e) {
        warn!(
            source = e.source_name(),
            cause = e.cause(),
            error = %e,
            "workload names: a source failed; workloads keep their ids until it answers \
             (further failures of this kind are counted, not logged)"
        );
    } else {
        debug!(source = e.source_name(), cause = e.cause(), error = %e, "workload names: look-up failed");
    }
}

/// A GPU source whose ticks carry the names the cache knows.
pub struct Named {
    inner: Box<dyn GpuSource>,
    cache: Arc<NameCache>,
}

impl Named {
    pub fn new(inner: Box<dyn GpuSource>, cache: Arc<NameCache>) -> Named {
        Named { inner, cache }
    }

    /// Names the tick's workloads from the cache, and carries the look-ups that failed.
    fn name(&self, tick: &mut Tick) {
        self.cache.fill_tick(tick);
        // The collector shows them per node (`/metrics`); empty while none failed.
        tick.name_failures = (self.cache.source_errors().into_iter())
            .map(
                |(source, cause, count)| gpufleet_core::sample::NameFailures {
                    source: source.into(),
                    cause: cause.into(),
                    count,
                },
            )
            .collect();
    }
}

impl GpuSource for Named {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn inventory(&mut self) -> Result<Inventory, SourceError> {
        self.inner.inventory()
    }

    fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
        let mut tick = self.inner.sample(now_ms)?;
        self.name(&mut tick);
        Ok(tick)
    }

    fn sample_ready(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        let mut ticks = self.inner.sample_ready(now_ms)?;
        ticks.iter_mut().for_each(|t| self.name(t));
        Ok(ticks)
    }

    fn flush(&mut self, now_ms: UnixMs) -> Result<Vec<Tick>, SourceError> {
        let mut ticks = self.inner.flush(now_ms)?;
        ticks.iter_mut().for_each(|t| self.name(t));
        Ok(ticks)
    }

    fn boot_id(&self) -> Option<String> {
        self.inner.boot_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str, pod: Option<&str>) -> Workload {
        Workload {
            kind: WorkloadKind::Container,
            runtime: "docker".into(),
            container_id: Some(id.into()),
            pod_uid: pod.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn names_never_pass_junk_to_the_wire() {
        assert_eq!(clean_name("  trainer "), Some("trainer".into()));
        assert_eq!(clean_name(""), None);
        assert_eq!(clean_name("a\nb"), None);
        assert_eq!(clean_name(&"x".repeat(513)), None);
    }

    #[test]
    fn fill_applies_what_is_known_and_asks_once_for_the_rest() {
        let cache = NameCache::new();
        let (tx, mut rx) = mpsc::channel(8);
        cache.connect(tx);
        let mut w = container("c1", None);
        cache.fill(&mut w, 10);
        cache.fill(&mut w, 10);
        assert_eq!(w.container_name, None, "unknown yet: the ids go out");
        assert_eq!(
            rx.try_recv().ok(),
            Some(NameRequest::Container("c1".into()))
        );
        assert!(rx.try_recv().is_err(), "asked once");
        cache.put_container(
            "c1",
            RuntimeNames {
                container_name: Some("trainer".into()),
                image: Some("pytorch:24".into()),
                ..Default::default()
            },
        );
        cache.fill(&mut w, 10);
        assert_eq!(w.container_name.as_deref(), Some("trainer"));
        assert_eq!(w.image.as_deref(), Some("pytorch:24"));
    }

    #[test]
    fn a_pod_container_is_named_by_the_watcher_not_asked_for() {
        let cache = NameCache::new();
        let (tx, mut rx) = mpsc::channel(8);
        cache.connect(tx);
        let mut w = container("c2", Some("uid-1"));
        cache.fill(&mut w, 1);
        assert!(
            rx.try_recv().is_err(),
            "no Docker look-up for a pod's container"
        );
        let pod = RuntimeNames {
            pod_name: Some("web-0".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        };
        cache.put_pod("uid-1", pod, vec![]);
        cache.fill(&mut w, 1);
        assert_eq!(
            w.pod_name.as_deref(),
            Some("web-0"),
            "the pod before its container"
        );
    }

    #[test]
    fn a_full_queue_never_blocks_and_the_ask_comes_again() {
        let cache = NameCache::new();
        let (tx, mut rx) = mpsc::channel(1);
        cache.connect(tx);
        let job = |id: &str| Workload {
            kind: WorkloadKind::Slurm,
            job_id: Some(id.into()),
            ..Default::default()
        };
        cache.fill(&mut job("1"), 5);
        cache.fill(&mut job("2"), 6);
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err(), "the second did not fit");
        cache.fill(&mut job("2"), 6);
        assert_eq!(
            rx.try_recv().ok(),
            Some(NameRequest::Job {
                id: "2".into(),
                pid: 6
            }),
            "a dropped ask is not remembered as asked"
        );
    }

    #[test]
    fn each_cause_is_warned_once_and_counted() {
        let cache = NameCache::new();
        let e = NameError::Forbidden {
            source_name: "kubernetes",
            why: "403".into(),
        };
        assert!(cache.record_error(&e));
        assert!(!cache.record_error(&e));
        assert_eq!(cache.source_errors(), vec![("kubernetes", "forbidden", 2)]);
    }
}

#[cfg(test)]
mod stall_tests {
    use super::*;
    use gpufleet_core::sample::ProcessSample;

    /// A source whose every tick holds one Docker container's process.
    struct OneContainer;

    impl GpuSource for OneContainer {
        fn name(&self) -> &'static str {
            "one-container"
        }

        fn inventory(&mut self) -> Result<Inventory, SourceError> {
            Ok(Inventory::default())
        }

        fn sample(&mut self, now_ms: UnixMs) -> Result<Tick, SourceError> {
            Ok(Tick {
                time_ms: now_ms,
                processes: vec![ProcessSample {
                    pid: 42,
                    workload: Workload {
                        kind: WorkloadKind::Container,
                        runtime: "docker".into(),
                        container_id: Some("c".repeat(64)),
                        ..Default::default()
                    },
                    ..Default::default()
                }],
                ..Default::default()
            })
        }
    }

    /// A Docker socket that takes connections and never answers, a look-up allowed a
    /// minute: a minute of ticks is sampled without waiting for it, with the ids.
    #[test]
    fn a_stalled_source_delays_no_tick() {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("docker.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        // Accept and hold every connection, never answering.
        let held = std::thread::spawn(move || {
            let mut conns = Vec::new();
            for c in listener.incoming().take(4) {
                conns.push(c);
            }
            std::thread::sleep(Duration::from_secs(120));
        });
        let cache = Arc::new(NameCache::new());
        spawn_resolver(
            Arc::clone(&cache),
            NameSources {
                node: "n".into(),
                proc_root: dir.path().into(),
                kubernetes: None,
                docker_socket: Some(socket),
                scontrol: None,
                kube_labels: vec![],
                docker_labels: vec![],
                timeout: Duration::from_secs(60),
            },
        )
        .expect("resolver");
        let mut source = Named::new(Box::new(OneContainer), Arc::clone(&cache));
        // A minute of ticks at 1 s, taken back to back while the look-up hangs.
        let started = Instant::now();
        for k in 0..60 {
            let tick = source.sample(1_000 + k * 1000).expect("tick");
            assert_eq!(tick.processes[0].workload.container_name, None, "ids only");
            assert_eq!(
                tick.processes[0].workload.container_id.as_deref(),
                Some("c".repeat(64).as_str())
            );
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "60 ticks took {took:?} while a look-up was stalled for a minute"
        );
        assert!(
            cache.pending.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "the look-up is still waiting on the silent socket"
        );
        drop(held);
    }
}
