//! Kubernetes names: one list and watch of the pods **of this node only**
//! (`fieldSelector=spec.nodeName=<node>`, never the whole cluster), with kube-runtime's
//! watcher, which re-lists when a watch expires (410 Gone) and re-watches when one ends;
//! failures back off exponentially (kube-runtime's default backoff, up to 30 s).
//!
//! Each pod gives its name, namespace and allow-listed labels (`--kube-label`), kept by
//! pod UID; each of its containers its name and image, kept by container id (the
//! `containerd://`, `cri-o://`, `docker://` prefix of `containerStatuses[].containerID`
//! removed, as the cgroup parser reports it). A deleted pod keeps its names: its last
//! samples may still be on their way.
//!
//! Client configuration as every Kubernetes client resolves it ([`find_config`]): the
//! in-cluster service account (`KUBERNETES_SERVICE_HOST`/`_PORT`, its token and CA) first,
//! else `KUBECONFIG`, else `~/.kube/config`. RBAC: `get`, `list` and `watch` on `pods`.

use super::{NameCache, NameError, RuntimeNames, clean_name, report};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info};

const SOURCE: &str = "kubernetes";

/// How long one API request may go unanswered: a server that never answers is a
/// timeout (counted, then retried), not a watcher stuck forever. Longer than the
/// watcher's own watch timeout (290 s) would be useless; a watch answers its headers
/// at once and then streams, so this bounds the wait for each chunk.
pub const READ_TIMEOUT: Duration = Duration::from_secs(330);

/// What the watcher needs besides a client.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// This node's name (`NODE_NAME`, `--node`): only its pods are listed.
    pub node: String,
    /// Pod labels kept (`--kube-label`); none by default.
    pub allowed_labels: Vec<String>,
}

/// Where the client configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeSource {
    /// The pod's service account (`KUBERNETES_SERVICE_HOST` is set).
    InCluster,
    /// A kubeconfig file (`KUBECONFIG`, else `~/.kube/config`).
    Kubeconfig(PathBuf),
}

/// The configuration a Kubernetes client would use here: in-cluster first, else the
/// first file of `KUBECONFIG` that exists, else `~/.kube/config`; `None` when there is
/// none (not on Kubernetes: no watcher). `env` and `exists` are injected for tests.
pub fn find_config(
    env: impl Fn(&str) -> Option<String>,
    exists: impl Fn(&std::path::Path) -> bool,
) -> Option<KubeSource> {
    if env("KUBERNETES_SERVICE_HOST").is_some_and(|h| !h.is_empty()) {
        return Some(KubeSource::InCluster);
    }
    if let Some(list) = env("KUBECONFIG") {
        return std::env::split_paths(&list)
            .find(|p| !p.as_os_str().is_empty() && exists(p))
            .map(KubeSource::Kubeconfig);
    }
    let home = PathBuf::from(env("HOME")?).join(".kube").join("config");
    exists(&home).then_some(KubeSource::Kubeconfig(home))
}

/// A client for `source`, with [`READ_TIMEOUT`].
pub async fn client(source: &KubeSource) -> Result<kube::Client, NameError> {
    let unreachable = |why: String| NameError::Unreachable {
        source_name: SOURCE,
        why,
    };
    let mut config = match source {
        KubeSource::InCluster => {
            kube::Config::incluster().map_err(|e| unreachable(e.to_string()))?
        }
        KubeSource::Kubeconfig(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| unreachable(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| unreachable(format!("{}: {e}", path.display())))?
        }
    };
    config.read_timeout = Some(READ_TIMEOUT);
    kube::Client::try_from(config).map_err(|e| unreachable(e.to_string()))
}

/// Starts the watcher of `source` on the current runtime: builds the client (a failure is
/// counted and retried every minute), then [`spawn_pod_watcher`]. The cache's initial
/// list (counted by the caller) is done at the first list, or the first failure.
pub fn spawn_from_source(source: KubeSource, options: KubeOptions, cache: Arc<NameCache>) {
    tokio::spawn(async move {
        let mut first = true;
        loop {
            match client(&source).await {
                Ok(c) => {
                    let _ = watch(c, options, cache, first).await;
                    return;
                }
                Err(e) => report(&cache, &e),
            }
            if std::mem::take(&mut first) {
                cache.done();
            }
            tokio::time::sleep(super::RETRY_AFTER).await;
        }
    });
}

/// Lists and watches this node's pods into `cache` until aborted.
pub fn spawn_pod_watcher(
    client: kube::Client,
    options: KubeOptions,
    cache: Arc<NameCache>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(watch(client, options, cache, false))
}

/// The watch loop; `initial`: tell the cache when the first list is done (or failed).
async fn watch(client: kube::Client, options: KubeOptions, cache: Arc<NameCache>, initial: bool) {
    let mut initial = initial;
    {
        let pods: kube::Api<Pod> = kube::Api::all(client);
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", options.node));
        let stream = watcher(pods, config).default_backoff();
        futures::pin_mut!(stream);
        let mut named = 0usize;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                    keep(&cache, &pod, &options.allowed_labels);
                    named += 1;
                }
                Ok(watcher::Event::InitDone) => {
                    info!(node = %options.node, pods = named, "workload names: watching this node's pods");
                    if std::mem::take(&mut initial) {
                        cache.done();
                    }
                }
                // A deleted pod keeps its names; a restart re-lists over them.
                Ok(watcher::Event::Delete(_) | watcher::Event::Init) => {}
                Err(e) => {
                    report(&cache, &classify(&e));
                    if std::mem::take(&mut initial) {
                        cache.done();
                    }
                }
            }
        }
        debug!("the pod watcher ended");
    }
}

/// Keeps `pod`'s names and its containers'.
fn keep(cache: &NameCache, pod: &Pod, allowed: &[String]) {
    let Some(uid) = pod.metadata.uid.as_deref() else {
        return;
    };
    let labels = pod
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| allowed.iter().any(|a| a == *k))
        .filter_map(|(k, v)| Some((clean_name(k)?, clean_name(v)?)))
        .collect();
    let names = RuntimeNames {
        pod_name: pod.metadata.name.as_deref().and_then(clean_name),
        namespace: pod.metadata.namespace.as_deref().and_then(clean_name),
        labels,
        ..Default::default()
    };
    let status = pod.status.as_ref();
    let statuses = [
        status.and_then(|s| s.container_statuses.as_ref()),
        status.and_then(|s| s.init_container_statuses.as_ref()),
        status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
    ];
    let containers = statuses
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|c| {
            let id = container_id(c.container_id.as_deref()?)?;
            let mut n = names.clone();
            n.container_name = clean_name(&c.name);
            n.image = clean_name(&c.image);
            Some((id, n))
        })
        .collect();
    cache.put_pod(uid, names, containers);
}

/// `containerd://<64 hex>` (or `cri-o://`, `docker://`) → the id the cgroup parser
/// reports: 64 lowercase hex characters; anything else is not an id.
pub fn container_id(status_id: &str) -> Option<String> {
    let id = status_id.rsplit("://").next()?.to_ascii_lowercase();
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// A watcher failure as a cause: the API's status code, else a timeout or an unreachable
/// server (the source chain says which).
fn classify(e: &watcher::Error) -> NameError {
    let api = match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => match k {
            kube::Error::Api(status) => Some((status.code, status.message.clone())),
            _ => None,
        },
        watcher::Error::WatchError(status) => Some((status.code, status.message.clone())),
        watcher::Error::NoResourceVersion => None,
    };
    match api {
        Some((401 | 403, why)) => NameError::Forbidden {
            source_name: SOURCE,
            why,
        },
        Some((code, why)) => NameError::Malformed {
            source_name: SOURCE,
            why: format!("HTTP {code}: {why}"),
        },
        None if timed_out(e) => NameError::TimedOut {
            source_name: SOURCE,
            secs: READ_TIMEOUT.as_secs(),
        },
        None => NameError::Unreachable {
            source_name: SOURCE,
            why: e.to_string(),
        },
    }
}

/// Whether a timeout is somewhere in `e`'s causes.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
            || c.to_string().to_ascii_lowercase().contains("timed out")
        {
            return true;
        }
        cause = c.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn in_cluster_first_then_kubeconfig_then_home() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            let m: HashMap<&str, &str> = vars.iter().copied().collect();
            move |k: &str| m.get(k).map(|v| (*v).to_owned())
        };
        let all = |_: &std::path::Path| true;
        assert_eq!(
            find_config(
                env(&[
                    ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
                    ("KUBECONFIG", "/k")
                ]),
                all
            ),
            Some(KubeSource::InCluster)
        );
        assert_eq!(
            find_config(env(&[("KUBECONFIG", "/nope:/k"), ("HOME", "/h")]), |p| p
                == std::path::Path::new("/k")),
            Some(KubeSource::Kubeconfig("/k".into()))
        );
        assert_eq!(
            find_config(env(&[("HOME", "/h")]), all),
            Some(KubeSource::Kubeconfig("/h/.kube/config".into()))
        );
        assert_eq!(find_config(env(&[("HOME", "/h")]), |_| false), None);
    }

    #[test]
    fn container_ids_lose_their_runtime_prefix() {
        let id = "a".repeat(64);
        assert_eq!(
            container_id(&format!("containerd://{id}")),
            Some(id.clone())
        );
        assert_eq!(
            container_id(&format!("cri-o://{}", id.to_uppercase())),
            Some(id)
        );
        assert_eq!(container_id("containerd://short"), None);
    }

    #[test]
    fn a_pod_names_its_containers_with_only_allowed_labels() {
        let id = "b".repeat(64);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer-0", "namespace": "ml", "uid": "u-1",
                         "labels": {"team": "vision", "secret-ish": "x"}},
            "spec": {"containers": [{"name": "pytorch", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}]},
            "status": {"containerStatuses": [{"name": "pytorch",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3", "imageID": "", "ready": true,
                "restartCount": 0, "containerID": format!("containerd://{id}")}]}
        }))
        .expect("a pod");
        let cache = NameCache::new();
        keep(&cache, &pod, &["team".to_owned()]);
        let c = cache.container(&id).expect("named");
        assert_eq!(c.container_name.as_deref(), Some("pytorch"));
        assert_eq!(c.image.as_deref(), Some("nvcr.io/nvidia/pytorch:24.05-py3"));
        assert_eq!(c.pod_name.as_deref(), Some("trainer-0"));
        assert_eq!(c.namespace.as_deref(), Some("ml"));
        assert_eq!(c.labels.len(), 1);
        assert_eq!(cache.pod("u-1").expect("pod").labels["team"], "vision");
    }
}
