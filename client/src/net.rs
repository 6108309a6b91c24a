//! The HTTP client of the collector's API: TLS (rustls; `--ca` adds a root), the viewer
//! token as `Authorization: Bearer`, and one typed call per endpoint `top` reads.

use crate::api::{ContainersView, ErrorBody, EventsView, FleetNode, NodeView};
use gpufleet_core::body::BodyError;
use reqwest::header::{ACCEPT, AUTHORIZATION, HeaderValue};
use reqwest::{Client, Response, Url};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// How long one API call may take (the live stream has its own idle limit).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The most of an error answer's body read (its message is cut to 200 characters).
const ERROR_BODY_LIMIT: usize = 4096;
/// The most of an answer's body read: the fleet of 1,000 nodes × 8 GPUs is a few MB, so
/// an answer past this is not the collector's (or is broken), and is refused whole.
pub const BODY_LIMIT: usize = 64 << 20;
/// How long an error answer's body may take to arrive (the live stream has no timeout).
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the collector is and how to reach it.
#[derive(Clone, Default)]
pub struct ApiOptions {
    /// Its base URL, e.g. `http://127.0.0.1:8080`.
    pub url: String,
    /// A viewer (or admin) token, sent as `Authorization: Bearer`.
    pub token: Option<String>,
    /// PEM certificates trusted beside the system's roots (a private CA).
    pub ca_pem: Option<Vec<u8>>,
}

/// Without the token: options may be logged or printed.
impl std::fmt::Debug for ApiOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiOptions")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .finish()
    }
}

/// At most `limit` bytes of an error answer's body, within [`ERROR_BODY_TIMEOUT`]: a
/// stalled or endless answer must not hang the caller (the live stream reconnects).
async fn error_body(resp: Response, limit: usize) -> Vec<u8> {
    use futures::StreamExt as _;
    // What arrived by the deadline is kept: the stream simply ends there.
    let body = resp
        .bytes_stream()
        .take_until(tokio::time::sleep(ERROR_BODY_TIMEOUT));
    gpufleet_core::body::read_prefix(body, limit).await
}

/// Why a call failed; each message says what to check.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("--url {url:?} is not an http(s) URL: {why}")]
    BadUrl { url: String, why: String },
    #[error("--ca: {0} (expected a PEM file with -----BEGIN CERTIFICATE----- blocks)")]
    BadCa(String),
    #[error("the token is not a valid header value (a stray character in the token file?)")]
    BadToken,
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    #[error("{what}: cannot reach the collector: {source}")]
    Unreachable {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{what}: the collector answered {status}: {message}")]
    Status {
        what: String,
        status: u16,
        message: String,
    },
    #[error(
        "{what}: the answer is larger than {} MiB, the most this client reads (is --url a \
         gpufleet collector?)", limit >> 20
    )]
    TooLarge { what: String, limit: usize },
    #[error("{what}: unexpected answer (is --url a gpufleet collector?): {source}")]
    Decode {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The collector's API.
#[derive(Debug, Clone)]
pub struct Api {
    http: Client,
    base: Url,
    auth: Option<HeaderValue>,
}

impl Api {
    pub fn new(opts: &ApiOptions) -> Result<Api, NetError> {
        let bad = |why: String| NetError::BadUrl {
            url: opts.url.clone(),
            why,
        };
        let base = Url::parse(&opts.url).map_err(|e| bad(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(bad("expected http://HOST:PORT or https://HOST:PORT".into()));
        }
        let mut b = Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("gpufleet-top/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = &opts.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| NetError::BadCa(format!("cannot read it: {e}")))?;
            if certs.is_empty() {
                return Err(NetError::BadCa("no certificate in it".into()));
            }
            for cert in certs {
                b = b.add_root_certificate(cert);
            }
        }
        let auth = match &opts.token {
            None => None,
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {}", t.trim()))
                    .map_err(|_| NetError::BadToken)?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        Ok(Api {
            http: b.build().map_err(NetError::Client)?,
            base,
            auth,
        })
    }

    /// The URL of `segments` below the base (each segment percent-encoded).
    fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut u = self.base.clone();
        if let Ok(mut p) = u.path_segments_mut() {
            p.pop_if_empty().extend(segments);
        }
        if !query.is_empty() {
            u.query_pairs_mut().extend_pairs(query);
        }
        u
    }

    fn what(u: &Url) -> String {
        format!("GET {}", u.path())
    }

    /// Sends GET `u`; a non-2xx answer becomes [`NetError::Status`] with the API's message.
    pub(crate) async fn send(
        &self,
        u: Url,
        timeout: Option<Duration>,
    ) -> Result<Response, NetError> {
        let what = Self::what(&u);
        let mut req = self.http.get(u);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        if let Some(a) = &self.auth {
            req = req.header(AUTHORIZATION, a.clone());
        }
        let resp = req
            .header(ACCEPT, "application/json, text/event-stream")
            .send()
            .await
            .map_err(|source| NetError::Unreachable {
                what: what.clone(),
                source,
            })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = error_body(resp, ERROR_BODY_LIMIT).await;
        let message = serde_json::from_slice::<ErrorBody>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
        let message = match status.as_u16() {
            401 | 403 => format!("{message} (give a viewer token with --token-file)"),
            _ => message,
        };
        Err(NetError::Status {
            what,
            status: status.as_u16(),
            message,
        })
    }

    async fn get<T: DeserializeOwned>(&self, u: Url) -> Result<T, NetError> {
        let what = Self::what(&u);
        let resp = self.send(u, Some(REQUEST_TIMEOUT)).await?;
        let body = gpufleet_core::body::read_limited(resp.bytes_stream(), BODY_LIMIT)
            .await
            .map_err(|e| match e {
                BodyError::TooLarge { limit } => NetError::TooLarge {
                    what: what.clone(),
                    limit,
                },
                BodyError::Read(source) => NetError::Unreachable {
                    what: what.clone(),
                    source,
                },
            })?;
        serde_json::from_slice(&body).map_err(|source| NetError::Decode { what, source })
    }

    /// `GET /api/v1/fleet`: every node in brief.
    pub async fn fleet(&self) -> Result<Vec<FleetNode>, NetError> {
        self.get(self.url(&["api", "v1", "fleet"], &[])).await
    }

    /// `GET /api/v1/nodes/{name}`.
    pub async fn node(&self, name: &str) -> Result<NodeView, NetError> {
        self.get(self.url(&["api", "v1", "nodes", name], &[])).await
    }

    /// `GET /api/v1/nodes/{name}/events` over the last hour.
    pub async fn events(&self, name: &str) -> Result<EventsView, NetError> {
        self.get(self.url(
            &["api", "v1", "nodes", name, "events"],
            &[("from", "now-1h")],
        ))
        .await
    }

    /// `GET /api/v1/containers`: energy and CO2 per workload, today (UTC).
    pub async fn energy_today(&self) -> Result<ContainersView, NetError> {
        self.get(self.url(&["api", "v1", "containers"], &[])).await
    }

    /// The URL of `/api/v1/live`.
    pub(crate) fn live_url(&self) -> Url {
        self.url(&["api", "v1", "live"], &[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_node_names_and_keep_a_base_path() {
        let api = Api::new(&ApiOptions {
            url: "http://127.0.0.1:8080/gpufleet/".into(),
            ..Default::default()
        })
        .expect("api");
        assert_eq!(
            api.url(&["api", "v1", "nodes", "a/b c"], &[]).as_str(),
            "http://127.0.0.1:8080/gpufleet/api/v1/nodes/a%2Fb%20c"
        );
    }

    #[test]
    fn bad_urls_and_tokens_are_refused_with_a_reason() {
        for url in ["ftp://x", "not a url", "mailto:a@b"] {
            let e = Api::new(&ApiOptions {
                url: url.into(),
                ..Default::default()
            });
            assert!(matches!(e, Err(NetError::BadUrl { .. })), "{url}");
        }
        let e = Api::new(&ApiOptions {
            url: "http://x".into(),
            token: Some("a\nb".into()),
            ..Default::default()
        });
        assert!(matches!(e, Err(NetError::BadToken)));
        let e = Api::new(&ApiOptions {
            url: "https://x".into(),
            ca_pem: Some(b"not a certificate\n".to_vec()),
            ..Default::default()
        });
        assert!(matches!(e, Err(NetError::BadCa(_))));
    }

    /// A server that answers 500 with a body it never finishes: the call fails with the
    /// status and what arrived, within the error body's time limit, instead of hanging.
    #[tokio::test]
    async fn a_stalled_error_answer_does_not_hang() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request).await;
            let head = "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 100000\r\n\r\n";
            conn.write_all(head.as_bytes()).await.expect("head");
            conn.write_all(b"partial answer").await.expect("body");
            // Hold the connection open, sending nothing more.
            let _ = conn.read(&mut request).await;
        });
        let api = Api::new(&ApiOptions {
            url: format!("http://{addr}"),
            ..Default::default()
        })
        .expect("api");
        let started = std::time::Instant::now();
        let url = api.url(&["api", "v1", "live"], &[]);
        let e = tokio::time::timeout(Duration::from_secs(30), api.send(url, None))
            .await
            .expect("the call returns instead of hanging")
            .expect_err("a 500");
        assert!(
            started.elapsed() < ERROR_BODY_TIMEOUT + Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(&e, NetError::Status { status: 500, message, .. } if message == "partial answer"),
            "{e:?}"
        );
        server.abort();
    }

    #[test]
    fn debug_output_hides_the_token() {
        let opts = ApiOptions {
            url: "http://x".into(),
            token: Some("gft_secret".into()),
            ..Default::default()
        };
        assert!(!format!("{opts:?}").contains("gft_secret"));
    }
}
