//! Docker and Podman names: a container's name, its image as the user asked for it
//! (`nvcr.io/nvidia/pytorch:24.05-py3`, not the `sha256:` id) and allow-listed labels,
//! read from the Docker Engine API (`GET /containers/{id}/json`) on a local unix socket.
//!
//! Podman serves the same API on its own socket (`podman system service`, the
//! `podman.socket` unit), so one client covers both. Only unix sockets are used: a
//! `DOCKER_HOST` of `tcp://…` or `ssh://…` names a daemon on another machine, whose
//! containers are not this node's processes; the agent then asks nothing rather than fall
//! back to a local socket the operator pointed away from.
//!
//! A look-up is one request, bounded by a timeout, made off the sampling path. The first
//! look-up also asks the daemon's API version (`GET /version`) and keeps the client at or
//! below it, so an older daemon is never sent a version it refuses. Labels are only kept when their key is on the
//! allow-list: labels can hold anything, secrets included, and each one kept is a string
//! sent with every sample of the container.
//!
//! Nothing here logs; the caller logs a [`NameError`] once per cause. Every name passes
//! through [`clean_name`](super::clean_name), so none can get a batch refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::ContainerInspectResponse;
use tokio::sync::OnceCell;

use super::{NameError, RuntimeNames, cut, whole_secs};

/// The `source_name` of every [`NameError`] from this module (Podman's answers too: it is
/// the Docker API that answered).
const SOURCE: &str = "docker";

/// Docker's socket, tried first when `DOCKER_HOST` is unset.
pub const DOCKER_SOCKET: &str = "/var/run/docker.sock";

/// Rootful Podman's API socket, tried when Docker's is absent.
pub const PODMAN_SOCKET: &str = "/run/podman/podman.sock";

/// The most characters of a daemon's message kept in a [`NameError`].
const WHY_MAX_CHARS: usize = 200;

/// The socket to ask, or `None` when there is none to ask:
///
/// - `DOCKER_HOST` (`docker_host`), when set and not empty, decides alone: `unix:///path`
///   gives `/path` (whether or not it exists yet: the operator chose it); any other
///   scheme, or a relative path, gives `None` (only a local unix socket is used);
/// - otherwise [`DOCKER_SOCKET`] if `exists`, else [`PODMAN_SOCKET`] if `exists`, else
///   `None`.
///
/// `exists` is injected so that this is a pure function; pass `|p| p.exists()`.
pub fn socket_path(docker_host: Option<&str>, exists: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    match docker_host.filter(|host| !host.is_empty()) {
        Some(host) => host
            .strip_prefix("unix://")
            .map(PathBuf::from)
            .filter(|path| path.is_absolute()),
        None => [DOCKER_SOCKET, PODMAN_SOCKET]
            .into_iter()
            .map(PathBuf::from)
            .find(|path| exists(path.as_path())),
    }
}

/// A client for one Docker (or Podman) socket, answering [`DockerNames::names`].
#[derive(Debug)]
pub struct DockerNames {
    /// The client as connected, speaking bollard's default API version.
    docker: Docker,
    /// The client after the first look-up that reached the daemon asked its API version;
    /// every later look-up uses it.
    negotiated: OnceCell<Docker>,
    /// Label keys copied into [`RuntimeNames::labels`]; others are never read.
    allowed_labels: Vec<String>,
    /// The longest one look-up (version negotiation included) may take.
    timeout: Duration,
}

impl DockerNames {
    /// A client for the API on `socket` (see [`socket_path`]). Nothing is sent yet; the
    /// socket file must exist ([`NameError::Unreachable`] otherwise: start Docker or
    /// Podman's API service, or point `DOCKER_HOST` at its socket, and connect again).
    pub fn connect(
        socket: &Path,
        allowed_labels: Vec<String>,
        timeout: Duration,
    ) -> Result<DockerNames, NameError> {
        let Some(path) = socket.to_str() else {
            return Err(NameError::Unreachable {
                source_name: SOURCE,
                why: format!(
                    "the socket path {} is not UTF-8; give the socket a UTF-8 path",
                    socket.display()
                ),
            });
        };
        // bollard's own per-request timeout, in whole seconds; the look-up's own (shorter
        // or equal) `timeout` is what callers see.
        let docker = Docker::connect_with_unix(
            path,
            whole_secs(timeout).max(1),
            bollard::API_DEFAULT_VERSION,
        )
        .map_err(|error| from_bollard(error, timeout))?;
        Ok(DockerNames {
            docker,
            negotiated: OnceCell::new(),
            allowed_labels,
            timeout,
        })
    }

    /// The names of container `container_id` (64 lower-case hex digits, as the cgroup
    /// path gives it; anything else is [`NameError::Malformed`] and sends nothing).
    ///
    /// Errors: no such container (it already exited and was removed) →
    /// [`NameError::NotFound`]; HTTP 401 / 403 (an authorization plugin) →
    /// [`NameError::Forbidden`]; the socket refuses the connection, or the agent may not
    /// open it, or the daemon fails (HTTP 5xx) → [`NameError::Unreachable`]; no answer
    /// within the timeout → [`NameError::TimedOut`]; an answer that is not a container
    /// → [`NameError::Malformed`].
    pub async fn names(&self, container_id: &str) -> Result<RuntimeNames, NameError> {
        if !is_container_id(container_id) {
            return Err(NameError::Malformed {
                source_name: SOURCE,
                why: format!(
                    "{:?} is not a container id (64 lower-case hex digits); nothing was asked",
                    cut(container_id, 80)
                ),
            });
        }
        match tokio::time::timeout(self.timeout, self.inspect(container_id)).await {
            Ok(inspect) => Ok(names_from_inspect(&inspect?, &self.allowed_labels)),
            Err(_elapsed) => Err(NameError::TimedOut {
                source_name: SOURCE,
                secs: whole_secs(self.timeout),
            }),
        }
    }

    /// `GET /containers/{id}/json`, on the negotiated client.
    async fn inspect(&self, container_id: &str) -> Result<ContainerInspectResponse, NameError> {
        let docker = self.client().await?;
        docker
            .inspect_container(container_id, None)
            .await
            .map_err(|error| from_bollard(error, self.timeout))
    }

    /// The client speaking the daemon's API version, asked once. A daemon that answers
    /// `/version` with something unreadable is spoken to in bollard's default version
    /// (requests it refuses then fail on their own); one that cannot be reached is asked
    /// again on the next look-up.
    async fn client(&self) -> Result<&Docker, NameError> {
        self.negotiated
            .get_or_try_init(move || async move {
                match self.docker.clone().negotiate_version().await {
                    Ok(docker) => Ok(docker),
                    Err(error) => match from_bollard(error, self.timeout) {
                        NameError::NotFound { .. } | NameError::Malformed { .. } => {
                            Ok(self.docker.clone())
                        }
                        other => Err(other),
                    },
                }
            })
            .await
    }
}

/// The names in an inspect answer: the container's name without the leading `/` that
/// Docker (and Podman's compatible API) put there (a name without one is taken as it is),
/// the image reference from its configuration, and the labels whose key is in
/// `allowed_labels`. Each goes through [`clean_name`](super::clean_name); a label is kept
/// only when both its key and its value pass.
pub fn names_from_inspect(
    inspect: &ContainerInspectResponse,
    allowed_labels: &[String],
) -> RuntimeNames {
    let config = inspect.config.as_ref();
    let container_name = inspect
        .name
        .as_deref()
        .map(|name| name.strip_prefix('/').unwrap_or(name))
        .and_then(super::clean_name);
    let image = config
        .and_then(|config| config.image.as_deref())
        .and_then(super::clean_name);
    let labels: BTreeMap<String, String> = config
        .and_then(|config| config.labels.as_ref())
        .map(|labels| {
            allowed_labels
                .iter()
                .filter_map(|key| {
                    let value = labels.get(key)?;
                    Some((super::clean_name(key)?, super::clean_name(value)?))
                })
                .collect()
        })
        .unwrap_or_default();
    RuntimeNames {
        container_name,
        image,
        labels,
        ..RuntimeNames::default()
    }
}

/// Whether `id` is a full container id: 64 lower-case hex digits.
fn is_container_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A bollard error as a [`NameError`]; `timeout` is the look-up's, for bollard's own
/// request timeout.
fn from_bollard(error: BollardError, timeout: Duration) -> NameError {
    match error {
        BollardError::DockerResponseServerError {
            status_code: 404, ..
        } => NameError::NotFound {
            source_name: SOURCE,
        },
        BollardError::DockerResponseServerError {
            status_code: status @ (401 | 403),
            message,
        } => NameError::Forbidden {
            source_name: SOURCE,
            why: cut(
                &format!("HTTP {status}: {message}; allow the agent to inspect containers"),
                WHY_MAX_CHARS,
            ),
        },
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } if status_code >= 500 => NameError::Unreachable {
            source_name: SOURCE,
            why: cut(&format!("HTTP {status_code}: {message}"), WHY_MAX_CHARS),
        },
        BollardError::DockerResponseServerError {
            status_code,
            message,
        } => NameError::Malformed {
            source_name: SOURCE,
            why: cut(&format!("HTTP {status_code}: {message}"), WHY_MAX_CHARS),
        },
        BollardError::RequestTimeoutError => NameError::TimedOut {
            source_name: SOURCE,
            secs: whole_secs(timeout),
        },
        BollardError::SocketNotFoundError(path) => NameError::Unreachable {
            source_name: SOURCE,
            why: cut(
                &format!(
                    "no socket at {path}: start Docker or Podman's API service, or set DOCKER_HOST"
                ),
                WHY_MAX_CHARS,
            ),
        },
        error @ (BollardError::HyperLegacyError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::IOError { .. }) => NameError::Unreachable {
            source_name: SOURCE,
            why: cut(
                &format!(
                    "{}; is the daemon running, and may the agent's user open its socket?",
                    error_chain(&error)
                ),
                WHY_MAX_CHARS,
            ),
        },
        other => NameError::Malformed {
            source_name: SOURCE,
            why: cut(&error_chain(&other), WHY_MAX_CHARS),
        },
    }
}

/// An error and its sources, `: `-separated, each source only when its text adds to the
/// text so far (hyper's "client error (Connect)" says little; its source says what).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::UnixListener;

    use super::*;

    const DOCKER_INSPECT: &str = include_str!("../../tests/fixtures/names/docker-inspect.json");
    const PODMAN_INSPECT: &str = include_str!("../../tests/fixtures/names/podman-inspect.json");
    /// The container in `docker-inspect.json`.
    const TRAINER_ID: &str = "4f66ad9a0b2e6e7c3b1f8e3f2c9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f";
    /// A container an authorization plugin will not show.
    const GUARDED_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    /// A container the daemon does not know.
    const GONE_ID: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    fn parse(json: &str) -> ContainerInspectResponse {
        serde_json::from_str(json).expect("the fixture is an inspect answer bollard reads")
    }

    fn allow(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|&key| key.to_owned()).collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|&(key, value)| (key.to_owned(), value.to_owned()))
            .collect()
    }

    #[test]
    fn a_docker_answer_gives_name_image_and_allowed_labels() {
        let names = names_from_inspect(
            &parse(DOCKER_INSPECT),
            &allow(&[
                "team",
                "com.docker.compose.project",
                // Present but empty: dropped.
                "com.docker.compose.depends_on",
                // Absent.
                "cost-center",
            ]),
        );
        assert_eq!(
            names,
            RuntimeNames {
                container_name: Some("trainer-7".to_owned()),
                image: Some("nvcr.io/nvidia/pytorch:24.05-py3".to_owned()),
                labels: labels(&[("com.docker.compose.project", "ml"), ("team", "vision")]),
                ..RuntimeNames::default()
            }
        );
    }

    #[test]
    fn the_fixture_is_the_container_it_claims() {
        let inspect = parse(DOCKER_INSPECT);
        assert_eq!(inspect.id.as_deref(), Some(TRAINER_ID));
        assert_eq!(inspect.state.and_then(|state| state.running), Some(true));
    }

    #[test]
    fn a_podman_answer_reads_the_same() {
        let names = names_from_inspect(&parse(PODMAN_INSPECT), &allow(&["team"]));
        assert_eq!(
            names,
            RuntimeNames {
                container_name: Some("inference".to_owned()),
                image: Some("nvcr.io/nvidia/tritonserver:24.08-py3".to_owned()),
                labels: labels(&[("team", "inference")]),
                ..RuntimeNames::default()
            }
        );
    }

    #[test]
    fn a_name_without_a_slash_is_taken_as_it_is() {
        let mut inspect = parse(PODMAN_INSPECT);
        inspect.name = Some("inference".to_owned());
        assert_eq!(
            names_from_inspect(&inspect, &[]).container_name.as_deref(),
            Some("inference")
        );
    }

    #[test]
    fn no_allow_list_keeps_no_labels() {
        let names = names_from_inspect(&parse(DOCKER_INSPECT), &[]);
        assert!(names.labels.is_empty());
        assert_eq!(names.container_name.as_deref(), Some("trainer-7"));
    }

    #[test]
    fn odd_values_are_dropped() {
        let mut inspect = parse(DOCKER_INSPECT);
        inspect.name = Some("/".to_owned());
        let config = inspect.config.as_mut().expect("the fixture has a config");
        config.image = Some(String::new());
        config.labels = Some(
            [
                ("team".to_owned(), "vi\u{7}sion".to_owned()),
                ("owner".to_owned(), "alice".to_owned()),
            ]
            .into_iter()
            .collect(),
        );
        let names = names_from_inspect(&inspect, &allow(&["team", "owner"]));
        assert_eq!(
            names,
            RuntimeNames {
                labels: labels(&[("owner", "alice")]),
                ..RuntimeNames::default()
            }
        );
    }

    #[test]
    fn an_empty_answer_gives_no_names() {
        assert_eq!(
            names_from_inspect(&ContainerInspectResponse::default(), &allow(&["team"])),
            RuntimeNames::default()
        );
    }

    #[test]
    fn docker_host_decides_alone_when_set() {
        let everything = |_: &Path| true;
        assert_eq!(
            socket_path(Some("unix:///run/user/1000/docker.sock"), everything),
            Some(PathBuf::from("/run/user/1000/docker.sock"))
        );
        assert_eq!(
            socket_path(Some("unix:///srv/missing.sock"), |_| false),
            Some(PathBuf::from("/srv/missing.sock"))
        );
        for other in [
            "tcp://10.0.0.5:2375",
            "ssh://admin@gpu-node-07",
            "npipe:////./pipe/docker_engine",
            "unix://relative.sock",
            "/var/run/docker.sock",
        ] {
            assert_eq!(socket_path(Some(other), everything), None, "{other}");
        }
    }

    #[test]
    fn without_docker_host_docker_then_podman() {
        assert_eq!(
            socket_path(None, |_| true),
            Some(PathBuf::from(DOCKER_SOCKET))
        );
        assert_eq!(
            socket_path(Some(""), |path| path == Path::new(PODMAN_SOCKET)),
            Some(PathBuf::from(PODMAN_SOCKET))
        );
        assert_eq!(socket_path(None, |_| false), None);
    }

    #[test]
    fn container_ids_are_64_lower_case_hex_digits() {
        assert!(is_container_id(TRAINER_ID));
        assert!(!is_container_id(&TRAINER_ID.to_uppercase()));
        assert!(!is_container_id(&TRAINER_ID[..63]));
        assert!(!is_container_id("trainer-7"));
        assert!(!is_container_id(&format!("{}/../x", &TRAINER_ID[..59])));
    }

    #[test]
    fn a_missing_socket_is_unreachable() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let error = DockerNames::connect(
            &dir.path().join("docker.sock"),
            vec![],
            Duration::from_secs(1),
        )
        .expect_err("no socket there");
        assert_eq!(error.cause(), "unreachable", "{error}");
    }

    /// One HTTP/1.1 answer per connection, as a fake daemon: `/version`, the trainer's
    /// inspect answer, 403 for the guarded container, 404 for anything else.
    async fn fake_daemon(listener: UnixListener) {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0_u8; 4096];
                while !request.windows(4).any(|window| window == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let request = String::from_utf8_lossy(&request);
                let target = request.split_whitespace().nth(1).unwrap_or_default();
                let path = target.split('?').next().unwrap_or_default();
                let (status, body) = if path.ends_with("/version") {
                    ("200 OK", r#"{"Version":"26.1.3","ApiVersion":"1.45","MinAPIVersion":"1.24","Os":"linux","Arch":"amd64"}"#.to_owned())
                } else if path.ends_with(&format!("/containers/{TRAINER_ID}/json")) {
                    ("200 OK", DOCKER_INSPECT.to_owned())
                } else if path.ends_with(&format!("/containers/{GUARDED_ID}/json")) {
                    (
                        "403 Forbidden",
                        r#"{"message":"authorization denied by plugin opa-docker-authz: request rejected by administrative policy"}"#.to_owned(),
                    )
                } else {
                    (
                        "404 Not Found",
                        format!(r#"{{"message":"No such container: {path}"}}"#),
                    )
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                // The client may have gone; nothing to do then.
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    }

    #[tokio::test]
    async fn a_daemon_answers_names_and_not_found() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let socket = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&socket).expect("a fake daemon's socket");
        tokio::spawn(fake_daemon(listener));
        let docker = DockerNames::connect(&socket, allow(&["team"]), Duration::from_secs(10))
            .expect("the socket exists");

        let names = docker.names(TRAINER_ID).await.expect("the trainer's names");
        assert_eq!(names.container_name.as_deref(), Some("trainer-7"));
        assert_eq!(
            names.image.as_deref(),
            Some("nvcr.io/nvidia/pytorch:24.05-py3")
        );
        assert_eq!(names.labels, labels(&[("team", "vision")]));

        assert_eq!(
            docker.names(GONE_ID).await,
            Err(NameError::NotFound {
                source_name: "docker"
            })
        );
        let error = docker
            .names(GUARDED_ID)
            .await
            .expect_err("a plugin refuses");
        assert_eq!(error.cause(), "forbidden", "{error}");
        let error = docker.names("trainer-7").await.expect_err("not an id");
        assert_eq!(error.cause(), "malformed", "{error}");
    }

    #[tokio::test]
    async fn a_socket_nobody_listens_on_is_unreachable() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let socket = dir.path().join("docker.sock");
        // Bound and closed: the file stays, connections are refused.
        drop(std::os::unix::net::UnixListener::bind(&socket).expect("a socket file"));
        let docker = DockerNames::connect(&socket, vec![], Duration::from_secs(10))
            .expect("the socket file exists");
        let error = docker.names(TRAINER_ID).await.expect_err("refused");
        assert_eq!(error.cause(), "unreachable", "{error}");
    }

    #[tokio::test]
    async fn a_silent_daemon_times_out() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let socket = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&socket).expect("a fake daemon's socket");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                // Never answer, never close.
                held.push(stream);
            }
        });
        let docker = DockerNames::connect(&socket, vec![], Duration::from_millis(200))
            .expect("the socket exists");
        assert_eq!(
            docker.names(TRAINER_ID).await,
            Err(NameError::TimedOut {
                source_name: "docker",
                secs: 1
            })
        );
    }
}
