//! The HTTP side of remote-write: one POST per request with the spec's headers, auth
//! (bearer token or basic), TLS with an optional CA, and the receiver's answer sorted into
//! what the queue does next ([`Delivery`]).

use async_trait::async_trait;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap, HeaderValue};
use std::time::{Duration, SystemTime};

/// What became of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// 2xx: the receiver has it.
    Sent,
    /// 5xx, 429 or no answer: send it again, after `after` if the receiver said
    /// (`Retry-After`), else after the queue's backoff.
    Retry {
        after: Option<Duration>,
        why: String,
    },
    /// Refused for good (4xx other than 429): sending it again would be refused again.
    Refused { status: u16, why: String },
}

/// Where requests go (the HTTP client, or a test's fake).
#[async_trait]
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// Sends one encoded (protobuf + snappy) `WriteRequest`.
    async fn send(&self, body: Vec<u8>) -> Delivery;
}

/// How requests are authenticated.
#[derive(Clone, Default)]
pub enum Auth {
    #[default]
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `Authorization: Basic` with a user and password.
    Basic { user: String, password: String },
}

// Secrets never reach a log: Debug names the scheme only.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Bearer(_) => f.write_str("Bearer(***)"),
            Auth::Basic { user, .. } => write!(f, "Basic({user}:***)"),
        }
    }
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--remote-write-ca {path}: {why}")]
    Ca { path: String, why: String },
    #[error("cannot build the remote-write HTTP client: {0}")]
    Build(#[source] reqwest::Error),
    #[error("--remote-write-url {0:?} is not an http:// or https:// URL")]
    Url(String),
}

/// The remote-write HTTP client.
pub struct HttpSink {
    client: reqwest::Client,
    url: reqwest::Url,
    auth: Auth,
}

// The URL may carry user info: Debug shows it redacted.
impl std::fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSink")
            .field("url", &redact(self.url.as_str()))
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// Longest `Retry-After` honoured; a receiver asking for more is retried after this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

impl HttpSink {
    /// A client for `url`, trusting `ca_pem` (PEM certificates) besides the usual roots
    /// when given. `timeout` bounds each request.
    pub fn new(
        url: &str,
        auth: Auth,
        ca: Option<(&str, &[u8])>,
        timeout: Duration,
    ) -> Result<HttpSink, ClientError> {
        let parsed = reqwest::Url::parse(url).map_err(|_| ClientError::Url(redact(url)))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ClientError::Url(redact(url)));
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("snappy"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        headers.insert(
            "X-Prometheus-Remote-Write-Version",
            HeaderValue::from_static("0.1.0"),
        );
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("gpufleet-collector/", env!("CARGO_PKG_VERSION")))
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)));
        if let Some((path, pem)) = ca {
            let certs =
                reqwest::Certificate::from_pem_bundle(pem).map_err(|e| ClientError::Ca {
                    path: path.to_owned(),
                    why: e.to_string(),
                })?;
            if certs.is_empty() {
                return Err(ClientError::Ca {
                    path: path.to_owned(),
                    why: "no PEM certificate in it".into(),
                });
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(HttpSink {
            client: builder.build().map_err(ClientError::Build)?,
            url: parsed,
            auth,
        })
    }
}

/// `url` with any password removed, for messages.
pub fn redact(url: &str) -> String {
    crate::store::redact_url(url)
}

/// A `Retry-After`, in seconds or as an HTTP date (a date in the past: at once), at most
/// [`MAX_RETRY_AFTER`]; `None` when absent or unreadable (the backoff applies).
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(value)
            .ok()?
            .duration_since(now)
            .unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// 4xx answers that say nothing about the samples (credentials, address, proxy, timeout):
/// retried, so a rotated token or a wrong path loses nothing once fixed. Only the rest
/// (400 out of order, 422, ...) drop the request.
fn retry_refusal(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::NOT_FOUND
            | StatusCode::PROXY_AUTHENTICATION_REQUIRED
            | StatusCode::REQUEST_TIMEOUT
    )
}

/// What the queue does with an answer of `status` received at `now`.
pub fn classify(status: StatusCode, headers: &HeaderMap, body: &str, now: SystemTime) -> Delivery {
    let why = format!("{status}: {}", body.trim());
    if status.is_success() {
        Delivery::Sent
    } else if status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
        || retry_refusal(status)
    {
        Delivery::Retry {
            after: retry_after(headers, now),
            why,
        }
    } else {
        Delivery::Refused {
            status: status.as_u16(),
            why,
        }
    }
}

/// An error with its causes (`error sending request: ...: Connection refused`).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// The first bytes of an error answer, for the log.
const ERROR_BODY_MAX: usize = 512;

/// Sends `request` and says what became of it: the answer [`classify`]d (with the first
/// bytes of an error answer), or a retry when nothing answered (the error without the URL:
/// reqwest's message may name it, with its user info). Remote-write and the alert
/// webhooks deliver through it.
pub async fn deliver(request: reqwest::RequestBuilder) -> Delivery {
    match request.send().await {
        Ok(response) => {
            let status = response.status();
            let headers = response.headers().clone();
            // A success's body is not read; an error's only its first bytes, so a
            // receiver whose answer never ends costs nothing.
            let text = if status.is_success() {
                String::new()
            } else {
                let bytes =
                    gpufleet_core::body::read_prefix(response.bytes_stream(), ERROR_BODY_MAX).await;
                String::from_utf8_lossy(&bytes).into_owned()
            };
            classify(status, &headers, &text, SystemTime::now())
        }
        Err(e) => Delivery::Retry {
            after: None,
            why: format!("no answer: {}", with_causes(&e.without_url())),
        },
    }
}

#[async_trait]
impl Sink for HttpSink {
    async fn send(&self, body: Vec<u8>) -> Delivery {
        let mut request = self.client.post(self.url.clone()).body(body);
        request = match &self.auth {
            Auth::None => request,
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Basic { user, password } => request.basic_auth(user, Some(password)),
        };
        deliver(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_sorted_per_spec() {
        // Wed, 21 Oct 2015 07:28:00 GMT
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let none = HeaderMap::new();
        let answer = |status, headers: &HeaderMap, body| classify(status, headers, body, now);
        assert_eq!(answer(StatusCode::NO_CONTENT, &none, ""), Delivery::Sent);
        let retry_after = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::RETRY_AFTER, HeaderValue::from_static(v));
            match answer(StatusCode::TOO_MANY_REQUESTS, &h, "") {
                Delivery::Retry { after, .. } => after,
                other => panic!("429 is retried, not {other:?}"),
            }
        };
        assert_eq!(retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:30 GMT"),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:00:00 GMT"),
            Some(Duration::ZERO),
            "a date in the past: at once"
        );
        assert_eq!(retry_after("86400"), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after("soon"), None);
        assert!(matches!(
            answer(StatusCode::SERVICE_UNAVAILABLE, &none, ""),
            Delivery::Retry { after: None, .. }
        ));
        for status in [
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
            StatusCode::NOT_FOUND,
        ] {
            assert!(
                matches!(answer(status, &none, ""), Delivery::Retry { .. }),
                "{status} says nothing about the samples: retried, not dropped"
            );
        }
        assert!(matches!(
            answer(StatusCode::BAD_REQUEST, &none, "out of order sample"),
            Delivery::Refused { status: 400, ref why } if why.contains("out of order")
        ));
    }

    #[test]
    fn secrets_stay_out_of_debug_and_urls() {
        let auth = Auth::Basic {
            user: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{auth:?}").contains("hunter2"));
        assert!(!format!("{:?}", Auth::Bearer("tok".into())).contains("tok"));
        assert!(matches!(
            HttpSink::new("ftp://u:pw@x", Auth::None, None, Duration::from_secs(1)),
            Err(ClientError::Url(u)) if !u.contains("pw")
        ));
    }
}
