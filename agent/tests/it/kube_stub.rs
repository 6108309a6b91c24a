//! A local Kubernetes API server for the pod watcher's tests: HTTPS with its own CA (rcgen),
//! a bearer token, and the real v1 shapes of `Pod`, `PodList`, `Status` and watch events.
//!
//! It serves `GET /api/v1/pods` only (the cluster-scoped list the agent makes with
//! `fieldSelector=spec.nodeName=<node>`), as a list or, with `watch=true`, as a chunked
//! stream of newline-delimited watch events, and keeps what the API server does:
//! a global resourceVersion bumped on every change, field-selector filtering on
//! `spec.nodeName` (no selector: every pod of the cluster), replay of the events after a
//! watch's resourceVersion, `sendInitialEvents` (streaming lists), bookmarks, `410 Expired`
//! as an `ERROR` event on a `200` watch, and `Status` bodies for 401/403/404/405.

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use serde_json::{Value, json};
use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

/// The one path the stub serves: pods of every namespace (narrowed by a field selector).
const PODS_PATH: &str = "/api/v1/pods";

/// The resourceVersion of an empty cluster (the API server's are etcd revisions: never 0).
const FIRST_RESOURCE_VERSION: u64 = 1000;

/// How the stub answers list and watch requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// As the API server does.
    #[default]
    Serve,
    /// `403 Forbidden` with the API server's `Status` (a service account without RBAC).
    Forbidden,
    /// Accept the connection and read the request, never answer (until the stub is dropped).
    Hang,
}

/// One line of a watch stream.
type Line = Result<String, Infallible>;

/// An open watch.
struct Watch {
    /// The `spec.nodeName` of its field selector; `None`: every node.
    node: Option<String>,
    /// `allowWatchBookmarks=true`.
    bookmarks: bool,
    tx: mpsc::UnboundedSender<Line>,
}

struct Cluster {
    resource_version: u64,
    /// Every pod, in order of creation; each with its current resourceVersion.
    pods: Vec<Value>,
    /// Every change: (resourceVersion, event type, object), for watches that resume.
    history: Vec<(u64, &'static str, Value)>,
    watches: Vec<Watch>,
    expire_next_watch: bool,
    mode: Mode,
    /// Every request's `path?query`, as sent.
    requests: Vec<String>,
    lists: usize,
    watches_made: usize,
}

struct Inner {
    token: String,
    cluster: Mutex<Cluster>,
    shutdown: CancellationToken,
}

/// A running stub; shut down when dropped.
pub struct KubeStub {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA that signed the server's certificate (for 127.0.0.1 and localhost), PEM.
    pub ca_pem: String,
    /// The bearer token every request must carry.
    pub token: String,
    /// The node the agent under test runs on.
    pub node: String,
    inner: Arc<Inner>,
    accept_task: JoinHandle<()>,
}

impl KubeStub {
    /// Starts a stub on a free loopback port: a fresh CA, a server certificate for
    /// 127.0.0.1 and localhost, a random token, no pods, [`Mode::Serve`].
    pub async fn start(node: &str) -> KubeStub {
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca_params = CertificateParams::default();
        let mut ca_name = DistinguishedName::new();
        ca_name.push(DnType::CommonName, "kube-stub CA");
        ca_params.distinguished_name = ca_name;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).expect("the CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().expect("a server key");
        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("the server's names");
        let mut server_name = DistinguishedName::new();
        server_name.push(DnType::CommonName, "kube-apiserver");
        server_params.distinguished_name = server_name;
        server_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        server_params.use_authority_key_identifier_extension = true;
        let server_cert = server_params
            .signed_by(&server_key, &issuer)
            .expect("the server certificate");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![server_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )
            .expect("the server's TLS config");
        let acceptor = TlsAcceptor::from(Arc::new(tls));

        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("the stub's address");

        let token = random_token();
        let inner = Arc::new(Inner {
            token: token.clone(),
            cluster: Mutex::new(Cluster {
                resource_version: FIRST_RESOURCE_VERSION,
                pods: Vec::new(),
                history: Vec::new(),
                watches: Vec::new(),
                expire_next_watch: false,
                mode: Mode::Serve,
                requests: Vec::new(),
                lists: 0,
                watches_made: 0,
            }),
            shutdown: CancellationToken::new(),
        });

        // TLS handshakes run in tasks of their own (one stuck client does not hold up the
        // others); the finished streams go to axum through `TlsListener`.
        let (conn_tx, conn_rx) = mpsc::unbounded_channel();
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((tcp, peer)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let conn_tx = conn_tx.clone();
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        let _ = conn_tx.send((stream, peer));
                    }
                });
            }
        });

        let app: Router = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        let shutdown = inner.shutdown.clone();
        tokio::spawn(async move {
            let listener = TlsListener { rx: conn_rx, addr };
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
        });

        KubeStub {
            url: format!("https://127.0.0.1:{}", addr.port()),
            ca_pem: ca_cert.pem(),
            token,
            node: node.to_owned(),
            inner,
            accept_task,
        }
    }

    /// A kubeconfig for the stub: its URL, its CA (`certificate-authority-data`), its token.
    pub fn kubeconfig_yaml(&self) -> String {
        [
            "apiVersion: v1".to_owned(),
            "kind: Config".to_owned(),
            "clusters:".to_owned(),
            "- name: kube-stub".to_owned(),
            "  cluster:".to_owned(),
            format!("    server: \"{}\"", self.url),
            format!(
                "    certificate-authority-data: \"{}\"",
                base64(self.ca_pem.as_bytes())
            ),
            "users:".to_owned(),
            "- name: gpufleet-agent".to_owned(),
            "  user:".to_owned(),
            format!("    token: \"{}\"", self.token),
            "contexts:".to_owned(),
            "- name: kube-stub".to_owned(),
            "  context:".to_owned(),
            "    cluster: kube-stub".to_owned(),
            "    user: gpufleet-agent".to_owned(),
            "    namespace: gpufleet".to_owned(),
            "current-context: kube-stub".to_owned(),
            String::new(),
        ]
        .join("\n")
    }

    /// A kube client for the stub, made the way a kubeconfig is read (kube's defaults: no
    /// read timeout).
    pub async fn client(&self) -> kube::Client {
        self.client_with_read_timeout(None).await
    }

    /// As [`KubeStub::client`], with kube's `read_timeout` set: a request that gets no
    /// bytes back for that long fails (kube's default is none: a silent server holds a
    /// request forever).
    pub async fn client_with_read_timeout(&self, read_timeout: Option<Duration>) -> kube::Client {
        // The workspace's one crypto provider. kube builds its rustls config with the
        // process default; this is a no-op when one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig =
            Kubeconfig::from_yaml(&self.kubeconfig_yaml()).expect("the stub's kubeconfig parses");
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("a kube config from the stub's kubeconfig");
        // kube takes HTTPS_PROXY from the environment: loopback must not go through a proxy.
        config.proxy_url = None;
        config.read_timeout = read_timeout;
        kube::Client::try_from(config).expect("a kube client for the stub")
    }

    /// Creates `pod` (or replaces the pod of the same uid): a new resourceVersion, and an
    /// `ADDED` (`MODIFIED`) event on the open watches that select its node.
    pub fn add_pod(&self, mut pod: Value) {
        let mut cluster = self.inner.cluster();
        cluster.resource_version += 1;
        let resource_version = cluster.resource_version;
        pod["metadata"]["resourceVersion"] = Value::from(resource_version.to_string());
        let uid = uid_of(&pod);
        let existing = cluster.pods.iter().position(|p| uid_of(p) == uid);
        let kind = match existing {
            Some(i) => {
                cluster.pods[i] = pod.clone();
                "MODIFIED"
            }
            None => {
                cluster.pods.push(pod.clone());
                "ADDED"
            }
        };
        cluster.publish(resource_version, kind, pod);
    }

    /// Deletes the pod of `uid` (if any): a `DELETED` event with its last state.
    pub fn delete_pod(&self, uid: &str) {
        let mut cluster = self.inner.cluster();
        let Some(i) = cluster.pods.iter().position(|p| uid_of(p) == uid) else {
            return;
        };
        let mut pod = cluster.pods.remove(i);
        cluster.resource_version += 1;
        let resource_version = cluster.resource_version;
        pod["metadata"]["resourceVersion"] = Value::from(resource_version.to_string());
        pod["metadata"]["deletionTimestamp"] = Value::from("2025-06-01T13:00:00Z");
        pod["metadata"]["deletionGracePeriodSeconds"] = Value::from(0);
        cluster.publish(resource_version, "DELETED", pod);
    }

    /// Sends a `BOOKMARK` at the current resourceVersion on the open watches that asked for
    /// bookmarks.
    pub fn bookmark(&self) {
        let cluster = self.inner.cluster();
        let line = event_line(
            "BOOKMARK",
            &json!({
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": cluster.resource_version.to_string()},
            }),
        );
        for watch in cluster.watches.iter().filter(|w| w.bookmarks) {
            let _ = watch.tx.send(Ok(line.clone()));
        }
    }

    /// Ends every open watch cleanly (the last chunk, as the API server does at
    /// `timeoutSeconds`).
    pub fn end_watches(&self) {
        self.inner.cluster().watches.clear();
    }

    /// The next watch request is answered `200` with one `ERROR` event (`410 Expired`, "too
    /// old resource version"), then ends: the client must list again.
    pub fn expire_next_watch(&self) {
        self.inner.cluster().expire_next_watch = true;
    }

    /// How list and watch requests are answered from now on (open watches stay open).
    pub fn set_mode(&self, mode: Mode) {
        self.inner.cluster().mode = mode;
    }

    /// Every request's `path?query`, as sent (URL-encoded), in order of arrival.
    pub fn requests(&self) -> Vec<String> {
        self.inner.cluster().requests.clone()
    }

    /// List requests to `/api/v1/pods` so far, whatever their answer.
    pub fn lists(&self) -> usize {
        self.inner.cluster().lists
    }

    /// Watch requests to `/api/v1/pods` so far, whatever their answer.
    pub fn watches(&self) -> usize {
        self.inner.cluster().watches_made
    }

    /// Watches open now (a client that went away closes its own).
    pub fn open_watches(&self) -> usize {
        let mut cluster = self.inner.cluster();
        cluster.watches.retain(|w| !w.tx.is_closed());
        cluster.watches.len()
    }
}

impl Drop for KubeStub {
    fn drop(&mut self) {
        self.inner.shutdown.cancel();
        self.inner.cluster().watches.clear();
        self.accept_task.abort();
    }
}

impl Inner {
    fn cluster(&self) -> MutexGuard<'_, Cluster> {
        self.cluster.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer to one request, decided under the lock (never held across an await).
    fn reply(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Reply {
        let target = uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned());
        let pairs = query_pairs(&target);
        let is_pods = uri.path() == PODS_PATH;
        let is_watch = matches!(param(&pairs, "watch"), Some("true" | "1"));
        let verb = if is_watch { "watch" } else { "list" };

        let mut cluster = self.cluster();
        cluster.requests.push(target);
        if is_pods {
            if is_watch {
                cluster.watches_made += 1;
            } else {
                cluster.lists += 1;
            }
        }
        let mode = cluster.mode;
        if mode == Mode::Hang {
            return Reply::Hang;
        }
        let authorized = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t == self.token);
        if !authorized {
            return Reply::Now(status_response(401, "Unauthorized", "Unauthorized", None));
        }
        if !is_pods {
            return Reply::Now(status_response(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            ));
        }
        if *method != Method::GET {
            return Reply::Now(status_response(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
                None,
            ));
        }
        if mode == Mode::Forbidden {
            let message = format!(
                "pods is forbidden: User \"system:serviceaccount:gpufleet:gpufleet-agent\" \
                 cannot {verb} resource \"pods\" in API group \"\" at the cluster scope"
            );
            return Reply::Now(status_response(
                403,
                "Forbidden",
                &message,
                Some(json!({"kind": "pods"})),
            ));
        }
        let node = node_selector(&pairs);
        if is_watch {
            Reply::Now(cluster.watch(&pairs, node))
        } else {
            Reply::Now(cluster.list(node.as_deref()))
        }
    }
}

enum Reply {
    Now(Response),
    Hang,
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let reply = inner.reply(&method, &uri, &headers);
    match reply {
        Reply::Now(response) => response,
        Reply::Hang => {
            inner.shutdown.cancelled().await;
            status_response(
                503,
                "ServiceUnavailable",
                "the server is shutting down",
                None,
            )
        }
    }
}

impl Cluster {
    /// Records a change and sends it on the open watches that select the object's node.
    fn publish(&mut self, resource_version: u64, kind: &'static str, object: Value) {
        let line = event_line(kind, &object);
        self.watches.retain(|w| !w.tx.is_closed());
        for watch in &self.watches {
            if selects(watch.node.as_deref(), &object) {
                let _ = watch.tx.send(Ok(line.clone()));
            }
        }
        self.history.push((resource_version, kind, object));
    }

    fn list(&self, node: Option<&str>) -> Response {
        let items: Vec<Value> = self
            .pods
            .iter()
            .filter(|p| selects(node, p))
            .cloned()
            .collect();
        let list = json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": self.resource_version.to_string()},
            "items": items,
        });
        json_response(StatusCode::OK, &list)
    }

    fn watch(&mut self, pairs: &[(String, String)], node: Option<String>) -> Response {
        let (tx, rx) = mpsc::unbounded_channel::<Line>();
        let since = param(pairs, "resourceVersion").unwrap_or("");

        if std::mem::take(&mut self.expire_next_watch) {
            let message = format!(
                "too old resource version: {since} ({})",
                self.resource_version
            );
            let status = status_json(410, "Expired", &message, None);
            let _ = tx.send(Ok(event_line("ERROR", &status)));
            drop(tx);
            return stream_response(rx);
        }

        let send_initial_events = param(pairs, "sendInitialEvents") == Some("true");
        if send_initial_events || since.is_empty() || since == "0" {
            // "Any" version: the current state as synthetic ADDED events.
            for pod in self.pods.iter().filter(|p| selects(node.as_deref(), p)) {
                let _ = tx.send(Ok(event_line("ADDED", pod)));
            }
            if send_initial_events {
                let end = json!({
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "metadata": {
                        "resourceVersion": self.resource_version.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                });
                let _ = tx.send(Ok(event_line("BOOKMARK", &end)));
            }
        } else {
            let Ok(since) = since.parse::<u64>() else {
                let message = format!("invalid resource version: {since}");
                return status_response(400, "BadRequest", &message, None);
            };
            for (resource_version, kind, object) in &self.history {
                if *resource_version > since && selects(node.as_deref(), object) {
                    let _ = tx.send(Ok(event_line(kind, object)));
                }
            }
        }

        let bookmarks = param(pairs, "allowWatchBookmarks") == Some("true");
        self.watches.push(Watch {
            node,
            bookmarks,
            tx,
        });
        stream_response(rx)
    }
}

/// Hands the TLS streams that finished their handshake to `axum::serve`.
struct TlsListener {
    rx: mpsc::UnboundedReceiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

/// A faithful v1 Pod, running on `node`: `containers` are (name, image, 64-hex container
/// id); each gets a running `containerStatuses` entry with `containerID:
/// "containerd://<id>"`.
pub fn pod(
    uid: &str,
    name: &str,
    namespace: &str,
    node: &str,
    containers: &[(&str, &str, &str)],
    labels: &[(&str, &str)],
) -> Value {
    const CREATED: &str = "2025-06-01T12:00:00Z";
    const STARTED: &str = "2025-06-01T12:00:05Z";
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    let specs: Vec<Value> = containers
        .iter()
        .map(|(name, image, _)| {
            json!({
                "name": name,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "resources": {},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
            })
        })
        .collect();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|(name, image, id)| {
            let repository = image.rsplit_once(':').map_or(*image, |(repo, _)| repo);
            json!({
                "name": name,
                "image": image,
                "imageID": format!("{repository}@sha256:{id}"),
                "containerID": format!("containerd://{id}"),
                "ready": true,
                "restartCount": 0,
                "started": true,
                "lastState": {},
                "state": {"running": {"startedAt": STARTED}},
            })
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": CREATED,
            "labels": labels,
        },
        "spec": {
            "nodeName": node,
            "containers": specs,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "schedulerName": "default-scheduler",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": CREATED},
                {"type": "Ready", "status": "True", "lastTransitionTime": STARTED},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": STARTED},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": CREATED},
            ],
            "hostIP": "10.0.0.11",
            "podIP": "10.244.1.7",
            "startTime": CREATED,
            "qosClass": "BestEffort",
            "containerStatuses": statuses,
        },
    })
}

/// The (key, value) pairs of a request target's query, URL-decoded.
pub fn query_pairs(target: &str) -> Vec<(String, String)> {
    let query = target.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (url_decode(k), url_decode(v))
        })
        .collect()
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space, `%XX` a byte).
pub fn url_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k.as_str() == key)
        .map(|(_, v)| v.as_str())
}

/// The node of a `spec.nodeName=<node>` (or `==`) term of the field selector; other terms
/// are not filtered on.
fn node_selector(pairs: &[(String, String)]) -> Option<String> {
    let selector = param(pairs, "fieldSelector")?;
    selector.split(',').find_map(|term| {
        term.strip_prefix("spec.nodeName==")
            .or_else(|| term.strip_prefix("spec.nodeName="))
            .map(str::to_owned)
    })
}

/// Whether a watch or list for `node` (`None`: all) includes `pod`.
fn selects(node: Option<&str>, pod: &Value) -> bool {
    node.is_none_or(|n| pod["spec"]["nodeName"].as_str() == Some(n))
}

fn uid_of(pod: &Value) -> String {
    pod["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn event_line(kind: &str, object: &Value) -> String {
    format!("{}\n", json!({"type": kind, "object": object}))
}

fn status_json(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

fn status_response(code: u16, reason: &str, message: &str, details: Option<Value>) -> Response {
    let status = StatusCode::from_u16(code).expect("a valid HTTP status");
    json_response(status, &status_json(code, reason, message, details))
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A `200` chunked stream of the watch events sent on `rx`; it ends when every sender is
/// gone.
fn stream_response(rx: mpsc::UnboundedReceiver<Line>) -> Response {
    let body = Body::from_stream(UnboundedReceiverStream::new(rx));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn random_token() -> String {
    let state = RandomState::new();
    format!("{:016x}{:016x}", state.hash_one(1u8), state.hash_one(2u8))
}

/// Standard base64 with padding (kubeconfig's `*-data` fields).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b1 = chunk.get(1).copied().unwrap_or(0);
        let b2 = chunk.get(2).copied().unwrap_or(0);
        let n = (u32::from(chunk[0]) << 16) | (u32::from(b1) << 8) | u32::from(b2);
        for i in 0..4usize {
            if i <= chunk.len() {
                let sextet = (n >> (18 - 6 * i)) & 0x3f;
                out.push(char::from(ALPHABET[sextet as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
