//! One HTTP attempt and its answer sorted into a [`Delivery`], with the same rules for
//! every receiver: remote-write's spec (5xx and 429 retried, other 4xx dropped), plus the
//! 4xx that say nothing about the request retried too.

use super::Delivery;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};
use std::time::{Duration, SystemTime};

/// Longest `Retry-After` honoured; a receiver asking for more is retried after this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The first bytes of an error answer, for the log.
const ERROR_BODY_MAX: usize = 512;

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

/// 4xx answers that say nothing about the request (credentials, address, proxy, timeout):
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

/// What to do with an answer of `status` received at `now` (`body`: the start of an error
/// answer, for `why`).
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

/// Sends `request` once and says what became of it: the answer [`classify`]d (with the
/// first bytes of an error answer), or a retry when nothing answered (the error without
/// the URL: reqwest's message may name it, with its user info). Remote-write and the alert
/// webhooks send through it.
pub async fn send(request: reqwest::RequestBuilder) -> Delivery {
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

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

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

    /// The whole table: every 2xx sent, every 5xx and 429 retried, the five 4xx that say
    /// nothing about the request retried, every other status refused with its code.
    #[test]
    fn every_status_has_one_verdict() {
        let now = SystemTime::UNIX_EPOCH;
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("3"));
        let retried_4xx = [401, 403, 404, 407, 408, 429];
        for code in 200..600u16 {
            let status = StatusCode::from_u16(code).expect("a status");
            let verdict = classify(status, &h, " busy\n", now);
            match code {
                200..=299 => assert_eq!(verdict, Delivery::Sent, "{code}"),
                500..=599 => assert_eq!(
                    verdict,
                    Delivery::Retry {
                        after: Some(Duration::from_secs(3)),
                        why: format!("{status}: busy"),
                    },
                    "{code}"
                ),
                c if retried_4xx.contains(&c) => {
                    assert!(matches!(verdict, Delivery::Retry { .. }), "{code}");
                }
                _ => assert_eq!(
                    verdict,
                    Delivery::Refused {
                        status: code,
                        why: format!("{status}: busy"),
                    },
                    "{code}"
                ),
            }
        }
    }
}
