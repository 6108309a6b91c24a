//! Reading an HTTP response body with a ceiling: every client gpufleet runs (`gpufleet
//! top`, the carbon providers, remote-write and the alert webhooks) reads what a server
//! sends through here, so a server whose answer never ends costs at most the ceiling.
//!
//! Generic over a stream of byte chunks (`reqwest::Response::bytes_stream()`), so this
//! crate needs no HTTP client.

use futures::{Stream, StreamExt as _};

/// Why a body was not read whole.
#[derive(Debug, thiserror::Error)]
pub enum BodyError<E> {
    /// The body is longer than the ceiling; nothing beyond it was read.
    #[error("the answer is larger than {limit} bytes (the most this client reads)")]
    TooLarge { limit: usize },
    /// Reading failed (the connection broke, a timeout).
    #[error(transparent)]
    Read(E),
}

/// The whole body, if it holds at most `limit` bytes; else [`BodyError::TooLarge`] as
/// soon as it goes past them.
pub async fn read_limited<S, B, E>(body: S, limit: usize) -> Result<Vec<u8>, BodyError<E>>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(BodyError::Read)?;
        let chunk = chunk.as_ref();
        if out.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        out.extend_from_slice(chunk);
    }
    Ok(out)
}

/// The body's first `limit` bytes at most (an error answer, for its message): reading
/// stops there, or at the first read error, with what arrived until then.
pub async fn read_prefix<S, B, E>(body: S, limit: usize) -> Vec<u8>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
{
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while out.len() < limit {
        match body.next().await {
            Some(Ok(chunk)) => {
                let chunk = chunk.as_ref();
                out.extend_from_slice(&chunk[..chunk.len().min(limit - out.len())]);
            }
            Some(Err(_)) | None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(n: usize, size: usize) -> impl Stream<Item = Result<Vec<u8>, String>> {
        futures::stream::iter((0..n).map(move |i| Ok(vec![i as u8; size])))
    }

    fn endless() -> impl Stream<Item = Result<Vec<u8>, String>> {
        futures::stream::repeat_with(|| Ok(vec![b'x'; 1000]))
    }

    #[tokio::test]
    async fn a_body_within_the_ceiling_is_read_whole() {
        let body = read_limited(chunks(3, 10), 30).await.expect("fits");
        assert_eq!(body.len(), 30);
        assert_eq!(body[29], 2);
    }

    #[tokio::test]
    async fn an_endless_body_stops_at_the_ceiling() {
        let e = read_limited(endless(), 10_000)
            .await
            .expect_err("too large");
        assert!(matches!(e, BodyError::TooLarge { limit: 10_000 }));
        assert!(e.to_string().contains("larger than 10000 bytes"));
        assert_eq!(read_prefix(endless(), 1500).await.len(), 1500);
    }

    #[tokio::test]
    async fn a_read_error_is_returned_or_ends_the_prefix() {
        let broken = futures::stream::iter([Ok(vec![1u8; 5]), Err("reset".to_owned())]);
        let e = read_limited(broken, 100).await.expect_err("broken");
        assert!(matches!(e, BodyError::Read(ref m) if m == "reset"));
        let broken = futures::stream::iter([Ok(vec![1u8; 5]), Err("reset".to_owned())]);
        assert_eq!(read_prefix(broken, 100).await, vec![1u8; 5]);
    }
}
