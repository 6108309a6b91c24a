//! The pod watcher (`names::kube`) against a local Kubernetes API server (`kube_stub`):
//! names of the node's pods only (field selector on every request), pods that come later,
//! watches that end, a 410 that forces a re-list, RBAC refusal and recovery, a server that
//! never answers, updates and deletions.

use crate::kube_stub::{KubeStub, Mode, pod, query_pairs};
use gpufleet_agent::names::kube::{KubeOptions, spawn_pod_watcher};
use gpufleet_agent::names::{NameCache, RuntimeNames};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long anything the watcher should do may take (the first retry after an error waits
/// 1 s; a few retries fit).
const BOUND: Duration = Duration::from_secs(20);

const ALLOWED: [&str; 2] = ["app.kubernetes.io/name", "team"];

fn options(stub: &KubeStub) -> KubeOptions {
    KubeOptions {
        node: stub.node.clone(),
        allowed_labels: ALLOWED.iter().map(|l| (*l).to_owned()).collect(),
    }
}

/// A 64-hex container id, distinct per `n`.
fn container_id(n: u32) -> String {
    format!("{n:08x}").repeat(8)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Polls `probe` until it gives a value; fails the test after [`BOUND`], with what the stub
/// saw and the cache's errors.
async fn eventually<T>(
    what: &str,
    stub: &KubeStub,
    cache: &NameCache,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {BOUND:?}\nrequests: {:#?}\nsource errors: {:?}",
            stub.requests(),
            cache.source_errors(),
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The cache's error count for (source "kubernetes", `cause`), if any.
fn kube_errors(cache: &NameCache, cause: &str) -> Option<u64> {
    cache
        .source_errors()
        .into_iter()
        .find(|(source, c, count)| *source == "kubernetes" && *c == cause && *count >= 1)
        .map(|(_, _, count)| count)
}

/// Starts the watcher on a new cache.
async fn watch(stub: &KubeStub) -> (Arc<NameCache>, tokio::task::JoinHandle<()>) {
    let cache = Arc::new(NameCache::new());
    let watcher = spawn_pod_watcher(stub.client().await, options(stub), Arc::clone(&cache));
    (cache, watcher)
}

fn assert_pod(names: &RuntimeNames, pod_name: &str, namespace: &str) {
    assert_eq!(names.pod_name.as_deref(), Some(pod_name));
    assert_eq!(names.namespace.as_deref(), Some(namespace));
}

fn assert_container(names: &RuntimeNames, container: &str, image: &str) {
    assert_eq!(names.container_name.as_deref(), Some(container));
    assert_eq!(names.image.as_deref(), Some(image));
}

/// Every request is the cluster-scoped pod list or watch narrowed to `node` by its field
/// selector: none lists the pods of the whole cluster.
fn assert_node_scoped(stub: &KubeStub, node: &str) {
    let requests = stub.requests();
    assert!(!requests.is_empty(), "the watcher made no request");
    let term = format!("spec.nodeName={node}");
    let term_alt = format!("spec.nodeName=={node}");
    for request in &requests {
        let request = request.as_str();
        let (path, _) = request.split_once('?').unwrap_or((request, ""));
        assert_eq!(path, "/api/v1/pods", "an unexpected request: {request}");
        let pairs = query_pairs(request);
        let selector = pairs
            .iter()
            .find(|(k, _)| k.as_str() == "fieldSelector")
            .map(|(_, v)| v.as_str());
        assert!(
            selector.is_some_and(|s| s.split(',').any(|t| t == term || t == term_alt)),
            "a request without the node's field selector (it reads the whole cluster): {request}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_the_pods_of_its_own_node_only() {
    let stub = KubeStub::start("node-a").await;
    let (trainer, shipper, server, elsewhere) = (
        container_id(1),
        container_id(2),
        container_id(3),
        container_id(4),
    );
    stub.add_pod(pod(
        "6f1c2a9e-0001-4c1e-9d57-2a3b4c5d6e01",
        "trainer-0",
        "ml",
        "node-a",
        &[
            ("trainer", "ghcr.io/acme/trainer:1.4", trainer.as_str()),
            (
                "log-shipper",
                "docker.io/fluent/fluent-bit:3.0",
                shipper.as_str(),
            ),
        ],
        &[
            ("app.kubernetes.io/name", "trainer"),
            ("team", "vision"),
            ("pod-template-hash", "5d8f7c9b4"),
        ],
    ));
    stub.add_pod(pod(
        "6f1c2a9e-0002-4c1e-9d57-2a3b4c5d6e02",
        "triton-7f9c6d",
        "serving",
        "node-a",
        &[(
            "server",
            "nvcr.io/nvidia/tritonserver:24.05-py3",
            server.as_str(),
        )],
        &[("app.kubernetes.io/name", "triton")],
    ));
    stub.add_pod(pod(
        "6f1c2a9e-0003-4c1e-9d57-2a3b4c5d6e03",
        "elsewhere-0",
        "ml",
        "node-b",
        &[("worker", "ghcr.io/acme/worker:2", elsewhere.as_str())],
        &[("team", "nlp")],
    ));
    let (cache, watcher) = watch(&stub).await;

    let trainer_pod = eventually("the trainer pod is named", &stub, &cache, || {
        cache.pod("6f1c2a9e-0001-4c1e-9d57-2a3b4c5d6e01")
    })
    .await;
    assert_pod(&trainer_pod, "trainer-0", "ml");
    assert_eq!(
        trainer_pod.labels,
        labels(&[("app.kubernetes.io/name", "trainer"), ("team", "vision")]),
        "only the allowed labels"
    );

    let c = cache.container(&trainer).expect("the trainer container");
    assert_container(&c, "trainer", "ghcr.io/acme/trainer:1.4");
    assert_pod(&c, "trainer-0", "ml");
    assert_eq!(
        c.labels,
        labels(&[("app.kubernetes.io/name", "trainer"), ("team", "vision")])
    );
    let c = cache.container(&shipper).expect("the sidecar container");
    assert_container(&c, "log-shipper", "docker.io/fluent/fluent-bit:3.0");
    assert_pod(&c, "trainer-0", "ml");

    let triton = cache
        .pod("6f1c2a9e-0002-4c1e-9d57-2a3b4c5d6e02")
        .expect("the second pod of node-a (same list)");
    assert_pod(&triton, "triton-7f9c6d", "serving");
    assert_eq!(
        triton.labels,
        labels(&[("app.kubernetes.io/name", "triton")])
    );
    let c = cache.container(&server).expect("the triton container");
    assert_container(&c, "server", "nvcr.io/nvidia/tritonserver:24.05-py3");
    assert_pod(&c, "triton-7f9c6d", "serving");

    // node-b's pod was in no answer (the list that named node-a's pods left it out).
    assert!(
        cache.pod("6f1c2a9e-0003-4c1e-9d57-2a3b4c5d6e03").is_none(),
        "a pod of another node"
    );
    assert!(
        cache.container(&elsewhere).is_none(),
        "a container of another node"
    );

    // The list, then the watch: both narrowed to node-a.
    eventually("the watch is opened", &stub, &cache, || {
        (stub.watches() >= 1).then_some(())
    })
    .await;
    assert!(stub.lists() >= 1);
    assert_node_scoped(&stub, "node-a");
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_a_pod_that_starts_while_watching() {
    let stub = KubeStub::start("node-a").await;
    let first = container_id(11);
    stub.add_pod(pod(
        "uid-first",
        "first-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/first:1", first.as_str())],
        &[("team", "vision")],
    ));
    let (cache, watcher) = watch(&stub).await;
    eventually("the first pod is named", &stub, &cache, || {
        cache.pod("uid-first")
    })
    .await;
    eventually("the watch is open", &stub, &cache, || {
        (stub.open_watches() >= 1).then_some(())
    })
    .await;

    // A bookmark (the watcher moves its resourceVersion on), then a new pod on the open watch.
    stub.bookmark();
    let late = container_id(12);
    stub.add_pod(pod(
        "uid-late",
        "late-0",
        "batch",
        "node-a",
        &[("job", "ghcr.io/acme/job:7", late.as_str())],
        &[("app.kubernetes.io/name", "job"), ("extra", "dropped")],
    ));
    // A pod of another node on the same cluster: not for this watch.
    let other = container_id(13);
    stub.add_pod(pod(
        "uid-other-node",
        "other-0",
        "batch",
        "node-b",
        &[("job", "ghcr.io/acme/job:7", other.as_str())],
        &[],
    ));

    let c = eventually("the late pod's container is named", &stub, &cache, || {
        cache.container(&late)
    })
    .await;
    assert_container(&c, "job", "ghcr.io/acme/job:7");
    assert_pod(&c, "late-0", "batch");
    assert_eq!(c.labels, labels(&[("app.kubernetes.io/name", "job")]));
    let p = cache.pod("uid-late").expect("the late pod");
    assert_pod(&p, "late-0", "batch");
    assert!(cache.pod("uid-other-node").is_none());
    assert!(cache.container(&other).is_none());
    assert_eq!(stub.lists(), 1, "a live event needs no re-list");
    assert_node_scoped(&stub, "node-a");
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_a_watch_that_ends() {
    let stub = KubeStub::start("node-a").await;
    let first = container_id(21);
    stub.add_pod(pod(
        "uid-first",
        "first-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/first:1", first.as_str())],
        &[],
    ));
    let (cache, watcher) = watch(&stub).await;
    eventually("the first pod is named", &stub, &cache, || {
        cache.pod("uid-first")
    })
    .await;
    eventually("the watch is open", &stub, &cache, || {
        (stub.open_watches() >= 1).then_some(())
    })
    .await;

    // The API server ends the watch (its timeoutSeconds); a pod created before the watcher
    // is back comes from the events after its resourceVersion.
    stub.end_watches();
    let gap = container_id(22);
    stub.add_pod(pod(
        "uid-gap",
        "gap-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/gap:1", gap.as_str())],
        &[],
    ));
    let c = eventually(
        "the pod created between watches is named",
        &stub,
        &cache,
        || cache.container(&gap),
    )
    .await;
    assert_pod(&c, "gap-0", "ml");

    // A pod created once the new watch is open comes on it.
    eventually("the watch is resumed", &stub, &cache, || {
        (stub.watches() >= 2 && stub.open_watches() >= 1).then_some(())
    })
    .await;
    let after = container_id(23);
    stub.add_pod(pod(
        "uid-after",
        "after-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/after:1", after.as_str())],
        &[],
    ));
    let c = eventually(
        "the pod created on the resumed watch is named",
        &stub,
        &cache,
        || cache.container(&after),
    )
    .await;
    assert_container(&c, "main", "ghcr.io/acme/after:1");
    assert_pod(&c, "after-0", "ml");
    assert!(cache.pod("uid-first").is_some(), "names outlive the watch");
    assert_eq!(
        stub.lists(),
        1,
        "a watch that ends cleanly resumes from its resourceVersion, without a re-list"
    );
    assert_node_scoped(&stub, "node-a");
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_again_after_410_gone() {
    let stub = KubeStub::start("node-a").await;
    let first = container_id(31);
    stub.add_pod(pod(
        "uid-first",
        "first-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/first:1", first.as_str())],
        &[],
    ));
    let (cache, watcher) = watch(&stub).await;
    eventually("the first pod is named", &stub, &cache, || {
        cache.pod("uid-first")
    })
    .await;
    eventually("the watch is open", &stub, &cache, || {
        (stub.open_watches() >= 1).then_some(())
    })
    .await;

    // The next watch is told its resourceVersion is too old; then the current one ends.
    stub.expire_next_watch();
    stub.end_watches();
    let fresh = container_id(32);
    stub.add_pod(pod(
        "uid-fresh",
        "fresh-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/fresh:1", fresh.as_str())],
        &[("team", "vision")],
    ));

    eventually("a re-list after the 410", &stub, &cache, || {
        (stub.lists() >= 2).then_some(())
    })
    .await;
    let c = eventually(
        "the pod created around the 410 is named",
        &stub,
        &cache,
        || cache.container(&fresh),
    )
    .await;
    assert_container(&c, "main", "ghcr.io/acme/fresh:1");
    assert_pod(&c, "fresh-0", "ml");
    assert_eq!(c.labels, labels(&[("team", "vision")]));
    assert!(
        cache.pod("uid-first").is_some(),
        "a pod still running survives the re-list"
    );
    assert!(stub.watches() >= 2);
    assert_node_scoped(&stub, "node-a");
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_forbidden_then_recovers() {
    let stub = KubeStub::start("node-a").await;
    let main = container_id(41);
    stub.add_pod(pod(
        "uid-rbac",
        "rbac-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/rbac:1", main.as_str())],
        &[],
    ));
    stub.set_mode(Mode::Forbidden);
    let (cache, watcher) = watch(&stub).await;

    let count = eventually(
        "a forbidden error in the cache's status",
        &stub,
        &cache,
        || kube_errors(&cache, "forbidden"),
    )
    .await;
    assert!(count >= 1);
    assert!(stub.lists() >= 1);
    assert!(cache.pod("uid-rbac").is_none(), "no names without access");
    assert!(cache.container(&main).is_none());
    assert!(!watcher.is_finished(), "the watcher keeps trying");

    // RBAC fixed: names come after the backoff.
    stub.set_mode(Mode::Serve);
    let c = eventually("names once access is granted", &stub, &cache, || {
        cache.container(&main)
    })
    .await;
    assert_container(&c, "main", "ghcr.io/acme/rbac:1");
    assert_pod(&c, "rbac-0", "ml");
    assert_node_scoped(&stub, "node-a");
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_blocks_no_lookup() {
    let stub = KubeStub::start("node-a").await;
    let main = container_id(51);
    stub.add_pod(pod(
        "uid-silent",
        "silent-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/silent:1", main.as_str())],
        &[],
    ));
    stub.set_mode(Mode::Hang);
    let cache = Arc::new(NameCache::new());
    // kube's client has no read timeout by default: a list the server never answers is
    // held forever, and recovery would rest on the watcher's own timeout. A 2 s read
    // timeout makes the hung list fail, so recovery is tested here too.
    let client = stub
        .client_with_read_timeout(Some(Duration::from_secs(2)))
        .await;
    let watcher = spawn_pod_watcher(client, options(&stub), Arc::clone(&cache));

    // The list reached the server, which holds it.
    eventually("the list reaches the server", &stub, &cache, || {
        (stub.lists() >= 1).then_some(())
    })
    .await;

    // Look-ups do not wait on the watcher: a cheap sanity check, not a benchmark.
    let started = Instant::now();
    for _ in 0..1000 {
        assert!(cache.pod("uid-silent").is_none());
        assert!(cache.container(&main).is_none());
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(100),
        "1000 look-ups took {took:?} while the API server is silent"
    );

    let count = eventually("a timeout in the cache's status", &stub, &cache, || {
        kube_errors(&cache, "timeout")
    })
    .await;
    assert!(count >= 1);
    assert!(
        !watcher.is_finished(),
        "the watcher neither ended nor panicked"
    );

    // The server answers again: names come after the backoff.
    stub.set_mode(Mode::Serve);
    let c = eventually("names once the server answers", &stub, &cache, || {
        cache.container(&main)
    })
    .await;
    assert_pod(&c, "silent-0", "ml");
    assert_node_scoped(&stub, "node-a");
    watcher.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_updates_and_keeps_deleted_pods_names() {
    let stub = KubeStub::start("node-a").await;
    let main = container_id(61);
    let spec = |team: &str| {
        pod(
            "uid-changing",
            "changing-0",
            "ml",
            "node-a",
            &[("main", "ghcr.io/acme/changing:1", main.as_str())],
            &[("team", team)],
        )
    };
    stub.add_pod(spec("vision"));
    let (cache, watcher) = watch(&stub).await;
    let p = eventually("the pod is named", &stub, &cache, || {
        cache.pod("uid-changing")
    })
    .await;
    assert_eq!(p.labels, labels(&[("team", "vision")]));
    eventually("the watch is open", &stub, &cache, || {
        (stub.open_watches() >= 1).then_some(())
    })
    .await;

    // MODIFIED: a label changes.
    stub.add_pod(spec("speech"));
    eventually("the new label", &stub, &cache, || {
        cache
            .container(&main)
            .filter(|c| c.labels == labels(&[("team", "speech")]))
    })
    .await;

    // DELETED: the pod keeps its names (its last samples may still be on their way).
    // A pod added after the deletion is named once the watcher has seen both events.
    stub.delete_pod("uid-changing");
    let later = container_id(62);
    stub.add_pod(pod(
        "uid-later",
        "later-0",
        "ml",
        "node-a",
        &[("main", "ghcr.io/acme/later:1", later.as_str())],
        &[],
    ));
    eventually("the pod after the deletion", &stub, &cache, || {
        cache.container(&later)
    })
    .await;
    let kept = cache
        .container(&main)
        .expect("the deleted pod's names are kept");
    assert_eq!(kept.pod_name.as_deref(), Some("changing-0"));
    assert_eq!(kept.labels, labels(&[("team", "speech")]));
    assert_eq!(stub.lists(), 1);
    watcher.abort();
}
