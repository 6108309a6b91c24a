//! Collector URLs as logs show them: without credentials.

/// `url` without credentials (`http://user:secret@host` → `http://***@host`), for logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_the_logs() {
        assert_eq!(
            redact("https://agent:s3cret@c:443/x"),
            "https://***@c:443/x"
        );
        assert_eq!(redact("http://c:50051"), "http://c:50051");
        assert_eq!(redact("http://c:1/a@b"), "http://c:1/a@b");
    }
}
