//! The `--remote-write-*` flags of `serve`. Secrets are read from files (never from the
//! command line, where `ps` shows them) and never logged.

use super::RemoteWriteOptions;
use super::client::{Auth, HttpSink};
use gpufleet_core::config::parse_duration;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Remote-write: off unless `--remote-write-url` is given.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RemoteWriteArgs {
    /// Push every GPU sample and each workload's energy to this Prometheus remote-write
    /// endpoint (e.g. http://prometheus:9090/api/v1/write). One collector of those
    /// sharing a database pushes (the `remote-write` job's lease).
    #[arg(long, env = "GPUFLEET_REMOTE_WRITE_URL", value_name = "URL")]
    pub remote_write_url: Option<String>,
    /// A file holding the bearer token sent as `Authorization: Bearer`.
    #[arg(
        long,
        env = "GPUFLEET_REMOTE_WRITE_BEARER_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "remote_write_basic_auth_user"
    )]
    pub remote_write_bearer_token_file: Option<PathBuf>,
    /// The user for HTTP basic auth (with --remote-write-basic-auth-password-file).
    #[arg(
        long,
        env = "GPUFLEET_REMOTE_WRITE_BASIC_AUTH_USER",
        value_name = "USER",
        requires = "remote_write_basic_auth_password_file"
    )]
    pub remote_write_basic_auth_user: Option<String>,
    /// A file holding the basic-auth password.
    #[arg(
        long,
        env = "GPUFLEET_REMOTE_WRITE_BASIC_AUTH_PASSWORD_FILE",
        value_name = "FILE",
        requires = "remote_write_basic_auth_user"
    )]
    pub remote_write_basic_auth_password_file: Option<PathBuf>,
    /// PEM CA certificate(s) to trust for an https:// endpoint, besides the public roots.
    #[arg(long, env = "GPUFLEET_REMOTE_WRITE_CA", value_name = "FILE")]
    pub remote_write_ca: Option<PathBuf>,
    /// How often new samples are read and pushed.
    #[arg(long, env = "GPUFLEET_REMOTE_WRITE_INTERVAL", default_value = "1s", value_parser = crate::net::limits::positive_duration, value_name = "DURATION")]
    pub remote_write_interval: Duration,
    /// How long after a minute ends its workload energy is pushed at the earliest (room
    /// for late samples). A minute the energy accountant has not closed by then waits
    /// for it; it is not skipped.
    #[arg(long, env = "GPUFLEET_REMOTE_WRITE_ENERGY_DELAY", default_value = "2m", value_parser = parse_duration, value_name = "DURATION")]
    pub remote_write_energy_delay: Duration,
    /// How long one push may take, connecting, sending and reading the answer; a push
    /// that takes longer is retried with backoff.
    #[arg(long, env = "GPUFLEET_REMOTE_WRITE_TIMEOUT", default_value = "30s", value_parser = crate::net::limits::positive_duration, value_name = "DURATION")]
    pub remote_write_timeout: Duration,
}

/// A secret file's content without surrounding white space.
fn secret(path: &Path, flag: &str) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("{flag} {} is empty", path.display()));
    }
    Ok(text.to_owned())
}

impl RemoteWriteArgs {
    /// The options (`None`: remote-write off), or why the flags cannot be used.
    pub fn options(&self) -> Result<Option<RemoteWriteOptions>, String> {
        let Some(url) = &self.remote_write_url else {
            let stray = self.remote_write_bearer_token_file.is_some()
                || self.remote_write_basic_auth_user.is_some()
                || self.remote_write_ca.is_some();
            if stray {
                return Err("--remote-write-* options need --remote-write-url".into());
            }
            return Ok(None);
        };
        let auth = match (
            &self.remote_write_bearer_token_file,
            &self.remote_write_basic_auth_user,
            &self.remote_write_basic_auth_password_file,
        ) {
            (Some(file), _, _) => Auth::Bearer(secret(file, "--remote-write-bearer-token-file")?),
            (None, Some(user), Some(file)) => Auth::Basic {
                user: user.clone(),
                password: secret(file, "--remote-write-basic-auth-password-file")?,
            },
            _ => Auth::None,
        };
        let ca = match &self.remote_write_ca {
            Some(path) => Some((
                path.display().to_string(),
                std::fs::read(path)
                    .map_err(|e| format!("--remote-write-ca {}: {e}", path.display()))?,
            )),
            None => None,
        };
        let sink = HttpSink::new(
            url,
            auth,
            ca.as_ref().map(|(p, pem)| (p.as_str(), pem.as_slice())),
            self.remote_write_timeout,
        )
        .map_err(|e| e.to_string())?;
        let mut options = RemoteWriteOptions::new(Arc::new(sink));
        options.interval = self.remote_write_interval;
        options.energy_delay = self.remote_write_energy_delay;
        Ok(Some(options))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_without_a_url_or_with_bad_files_say_why() {
        assert!(matches!(RemoteWriteArgs::default().options(), Ok(None)));
        let stray = RemoteWriteArgs {
            remote_write_ca: Some("/x".into()),
            ..Default::default()
        };
        assert!(stray.options().is_err());
        let dir = tempfile::tempdir().expect("dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").expect("write");
        let ok = RemoteWriteArgs {
            remote_write_url: Some("http://127.0.0.1:9/api/v1/write".into()),
            remote_write_bearer_token_file: Some(token),
            ..Default::default()
        };
        let options = ok.options().expect("valid").expect("on");
        assert!(
            !format!("{options:?}").contains("s3cret"),
            "no secret in Debug"
        );
        let missing = RemoteWriteArgs {
            remote_write_url: Some("http://127.0.0.1:9/api/v1/write".into()),
            remote_write_ca: Some(dir.path().join("nope.pem")),
            ..Default::default()
        };
        assert!(
            missing
                .options()
                .expect_err("no CA file")
                .contains("nope.pem")
        );
    }
}
