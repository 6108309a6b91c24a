//! The agent's credentials: which CA it trusts for `https://` collectors (`--ca`), the
//! client certificate it presents under mTLS (`--cert`/`--key`), and its node token
//! (`--token-file`), sent as `authorization: Bearer …` on every stream.
//!
//! Loaded once at start, so a missing or unreadable file fails at start, not at connect.
//! Nothing here is ever logged: `Debug` shows only which credentials are present.

use std::path::{Path, PathBuf};
use thiserror::Error;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The credential files of `gpufleet-agent run` (`--ca`, `--cert`, `--key`,
/// `--token-file`); each absent when not given.
#[derive(Debug, Clone, Default)]
pub struct CredentialFiles {
    /// PEM CA certificate(s) that sign the collector's certificate; needed for https://
    /// collectors.
    pub ca: Option<PathBuf>,
    /// PEM client certificate presented to the collector (mTLS).
    pub cert: Option<PathBuf>,
    /// PEM private key of `cert`.
    pub key: Option<PathBuf>,
    /// File holding this node's agent token.
    pub token_file: Option<PathBuf>,
}

/// Why credentials could not be loaded or used.
#[derive(Debug, Error)]
pub enum CredentialError {
    #[error("cannot read {what} {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("the token in {0} is empty or holds characters a token cannot have")]
    BadToken(PathBuf),
    #[error(
        "collector {url} uses https:// but no CA was given: pass --ca with the CA that signed the collector's certificate"
    )]
    NoCa { url: String },
    #[error(
        "collector {url} uses http:// while TLS credentials (--ca/--cert) are given: use https://"
    )]
    PlainWithTls { url: String },
    #[error("cannot configure TLS for {url}: {reason}")]
    Tls { url: String, reason: String },
}

/// Loaded credentials. Cheap to clone.
#[derive(Clone, Default)]
pub struct Credentials {
    tls: Option<ClientTlsConfig>,
    /// `Bearer <token>`, ready for the `authorization` header.
    bearer: Option<AsciiMetadataValue>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("tls", &self.tls.is_some())
            .field("token", &self.bearer.as_ref().map(|_| "***"))
            .finish()
    }
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, CredentialError> {
    std::fs::read(path).map_err(|e| CredentialError::Read {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

impl Credentials {
    /// No TLS, no token.
    pub fn none() -> Credentials {
        Credentials::default()
    }

    /// Reads the files the options name.
    pub fn load(args: &CredentialFiles) -> Result<Credentials, CredentialError> {
        let mut tls = None;
        if args.ca.is_some() || args.cert.is_some() {
            let mut config = ClientTlsConfig::new();
            if let Some(ca) = &args.ca {
                config = config.ca_certificate(Certificate::from_pem(read("CA file", ca)?));
            }
            if let (Some(cert), Some(key)) = (&args.cert, &args.key) {
                let identity =
                    Identity::from_pem(read("certificate file", cert)?, read("key file", key)?);
                config = config.identity(identity);
            }
            tls = Some(config);
        }
        let bearer = match &args.token_file {
            Some(path) => {
                let raw = read("token file", path)?;
                Some(bearer(&raw).ok_or_else(|| CredentialError::BadToken(path.clone()))?)
            }
            None => None,
        };
        Ok(Credentials { tls, bearer })
    }

    /// Credentials with a token given directly (tests, in-process agents).
    pub fn with_token(mut self, token: &str) -> Result<Credentials, CredentialError> {
        self.bearer =
            Some(bearer(token.as_bytes()).ok_or_else(|| CredentialError::BadToken("-".into()))?);
        Ok(self)
    }

    /// Credentials with a TLS configuration (tests, in-process agents).
    pub fn with_tls(mut self, tls: ClientTlsConfig) -> Credentials {
        self.tls = Some(tls);
        self
    }

    /// Checks that every collector URL fits these credentials: `https://` needs a CA;
    /// TLS credentials with `http://` would be silently unused.
    pub fn check_urls(&self, urls: &[String]) -> Result<(), CredentialError> {
        for url in urls {
            let https = url.starts_with("https://");
            if https && self.tls.is_none() {
                return Err(CredentialError::NoCa {
                    url: crate::redact::redact(url),
                });
            }
            if !https && self.tls.is_some() {
                return Err(CredentialError::PlainWithTls {
                    url: crate::redact::redact(url),
                });
            }
        }
        Ok(())
    }

    /// Applies TLS to `endpoint` when `url` is `https://`.
    pub fn configure(&self, endpoint: Endpoint, url: &str) -> Result<Endpoint, CredentialError> {
        match (&self.tls, url.starts_with("https://")) {
            (Some(tls), true) => {
                endpoint
                    .tls_config(tls.clone())
                    .map_err(|e| CredentialError::Tls {
                        url: crate::redact::redact(url),
                        reason: e.to_string(),
                    })
            }
            (None, true) => Err(CredentialError::NoCa {
                url: crate::redact::redact(url),
            }),
            _ => Ok(endpoint),
        }
    }

    /// Adds the token (if any) to a request's metadata.
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(b) = &self.bearer {
            request.metadata_mut().insert("authorization", b.clone());
        }
    }
}

fn bearer(raw: &[u8]) -> Option<AsciiMetadataValue> {
    let token = std::str::from_utf8(raw).ok()?.trim();
    if token.is_empty() || !token.chars().all(|c| c.is_ascii_graphic()) {
        return None;
    }
    let mut value: AsciiMetadataValue = MetadataValue::try_from(format!("Bearer {token}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_trimmed_and_never_shown() {
        let c = Credentials::none()
            .with_token(" gft_abc \n")
            .expect("token");
        let mut req = tonic::Request::new(());
        c.authorize(&mut req);
        assert_eq!(
            req.metadata().get("authorization").map(|v| v.to_str().ok()),
            Some(Some("Bearer gft_abc"))
        );
        assert!(!format!("{c:?}").contains("gft_abc"));
        assert!(Credentials::none().with_token("a b").is_err());
        assert!(Credentials::none().with_token("").is_err());
    }

    #[test]
    fn https_needs_a_ca_and_tls_needs_https() {
        let plain = Credentials::none();
        assert!(plain.check_urls(&["http://c:1".into()]).is_ok());
        let err = plain
            .check_urls(&["https://c:1".into()])
            .expect_err("no CA");
        assert!(err.to_string().contains("--ca"), "{err}");
        let tls = Credentials::none().with_tls(ClientTlsConfig::new());
        assert!(tls.check_urls(&["https://c:1".into()]).is_ok());
        assert!(tls.check_urls(&["http://c:1".into()]).is_err());
    }
}
