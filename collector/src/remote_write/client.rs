//! The HTTP side of remote-write: one POST per request with the spec's headers, auth
//! (bearer token or basic), TLS with an optional CA; the receiver's answer is sorted by
//! [`crate::outbound`] into a [`Delivery`], what the queue does next.

use crate::outbound::{self, Delivery};
use async_trait::async_trait;
use reqwest::header::{self, HeaderMap, HeaderValue};
use std::time::Duration;

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

#[async_trait]
impl Sink for HttpSink {
    async fn send(&self, body: Vec<u8>) -> Delivery {
        let mut request = self.client.post(self.url.clone()).body(body);
        request = match &self.auth {
            Auth::None => request,
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Basic { user, password } => request.basic_auth(user, Some(password)),
        };
        outbound::send(request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
