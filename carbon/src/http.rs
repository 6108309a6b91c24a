//! The HTTP side of the internet providers: one client with a timeout, retries with
//! exponential backoff on transient failures, and errors that name the provider and the
//! URL (never a token). An answer is read up to [`BODY_LIMIT`] bytes at most.

use crate::slot::{CarbonError, ProviderKind};
use gpufleet_core::body::BodyError;
use std::time::Duration;

/// The most of a provider's answer read: a day of half-hourly slots for every UK region
/// is well under 1 MB; an answer past this is refused as malformed.
pub const BODY_LIMIT: usize = 8 << 20;

/// How a provider talks HTTP.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Base URL, without a trailing `/` (e.g. `https://api.carbonintensity.org.uk`).
    pub base_url: String,
    /// Limit on one request (connect + answer).
    pub timeout: Duration,
    /// Attempts after the first one, for transient failures only (unreachable, HTTP 429
    /// and 5xx). A malformed answer or an HTTP 4xx is not retried.
    pub retries: u32,
    /// Wait before the first retry; doubled for each following one.
    pub backoff: Duration,
}

impl HttpOptions {
    pub fn new(base_url: &str) -> Self {
        HttpOptions {
            base_url: base_url.trim_end_matches('/').to_owned(),
            timeout: Duration::from_secs(10),
            retries: 3,
            backoff: Duration::from_millis(500),
        }
    }
}

/// A JSON-over-HTTP client for one provider.
#[derive(Debug, Clone)]
pub struct JsonClient {
    provider: ProviderKind,
    options: HttpOptions,
    client: reqwest::Client,
    /// Sent with every request (the Electricity Maps `auth-token`); marked sensitive so
    /// it is never printed.
    headers: reqwest::header::HeaderMap,
}

impl JsonClient {
    pub fn new(
        provider: ProviderKind,
        options: HttpOptions,
        headers: reqwest::header::HeaderMap,
    ) -> Result<Self, CarbonError> {
        let client = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout)
            .user_agent(concat!("gpufleet/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| CarbonError::Config(format!("cannot build an HTTP client: {e}")))?;
        Ok(JsonClient {
            provider,
            options,
            client,
            headers,
        })
    }

    /// The full URL of `path_and_query` (which starts with `/`).
    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.options.base_url)
    }

    /// GETs `path_and_query` and parses the body as JSON, retrying transient failures.
    pub async fn get_json(&self, path_and_query: &str) -> Result<serde_json::Value, CarbonError> {
        let url = self.url(path_and_query);
        let mut delay = self.options.backoff;
        let mut attempt = 0;
        loop {
            match self.get_once(&url).await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && attempt < self.options.retries => {
                    attempt += 1;
                    tracing::debug!(provider = %self.provider, %url, attempt, error = %e, "retrying carbon provider");
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn get_once(&self, url: &str) -> Result<serde_json::Value, CarbonError> {
        let provider = self.provider;
        let response = self
            .client
            .get(url)
            .headers(self.headers.clone())
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| CarbonError::Unreachable {
                provider,
                url: url.to_owned(),
                reason: describe(e),
            })?;
        let status = response.status();
        let body = gpufleet_core::body::read_limited(response.bytes_stream(), BODY_LIMIT)
            .await
            .map_err(|e| match e {
                BodyError::TooLarge { .. } => CarbonError::Malformed {
                    provider,
                    url: url.to_owned(),
                    reason: e.to_string(),
                },
                BodyError::Read(e) => CarbonError::Unreachable {
                    provider,
                    url: url.to_owned(),
                    reason: describe(e),
                },
            })?;
        if !status.is_success() {
            return Err(CarbonError::Http {
                provider,
                url: url.to_owned(),
                status: status.as_u16(),
                message: error_message(&body),
            });
        }
        serde_json::from_slice(&body).map_err(|e| CarbonError::Malformed {
            provider,
            url: url.to_owned(),
            reason: format!("not JSON: {e}"),
        })
    }
}

/// The message of an error body: the UK API's `{"error":{"code","message"}}`, Electricity
/// Maps' `{"message"}` / `{"error"}`, else the start of the text.
fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let err = v.get("error");
        let code = err.and_then(|e| e.get("code")).and_then(|c| c.as_str());
        let msg = err
            .and_then(|e| e.get("message"))
            .or_else(|| v.get("message"))
            .or(err)
            .and_then(|m| m.as_str());
        match (code, msg) {
            (Some(c), Some(m)) => return format!("{c}: {m}"),
            (None, Some(m)) => return m.to_owned(),
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(body);
    let text: String = text.chars().take(200).collect();
    if text.trim().is_empty() {
        "(empty body)".to_owned()
    } else {
        text
    }
}

fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "connection failed".to_owned()
    } else {
        // reqwest's Display includes the URL, which we already name; keep the cause.
        let e = e.without_url();
        let mut s = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(inner) = source {
            s.push_str(": ");
            s.push_str(&inner.to_string());
            source = inner.source();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies() {
        let uk =
            br#"{"error":{"code":"400 Bad Request","message":"Please enter a valid region ID"}}"#;
        assert_eq!(
            error_message(uk),
            "400 Bad Request: Please enter a valid region ID"
        );
        assert_eq!(error_message(br#"{"message":"bad token"}"#), "bad token");
        assert_eq!(error_message(b""), "(empty body)");
        assert_eq!(error_message(b"Bad Gateway"), "Bad Gateway");
    }
}
