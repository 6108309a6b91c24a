//! Configuration shared by the binaries, without their command-line parser: the config
//! file (TOML; where it is, its structured sections, its errors), durations as users type
//! them (timestamps: [`crate::times`], re-exported here), and logging set-up.
//!
//! Precedence is CLI > environment (`GPUFLEET_*`) > file > default. The flags' layer over
//! the file (inserting `--flag=value` for each file key the command line and the
//! environment left unset) lives with the parser, in `gpufleet-cli`; unknown keys are an
//! error ([`ConfigError::UnknownKey`], `deny_unknown_fields` semantics).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("config file {path}: unknown key `{key}` for `{command}`; valid keys: {valid}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        command: String,
        valid: String,
    },
    #[error(
        "config file {path}: key `{key}` has an unsupported value (use a string, number, boolean or array of them)"
    )]
    BadValue { path: PathBuf, key: String },
}

/// Top-level tables of the config file that are not flags: settings with structure (lists
/// of per-node overrides), read with [`config_file_section`] by the code that owns them.
pub const SECTIONS: &[&str] = &["carbon", "alerts"];

/// The top-level table `name` (one of [`SECTIONS`]) of the config file named by `--config`
/// or `GPUFLEET_CONFIG`; `None` without a file or without that table.
pub fn config_file_section(
    args: &[OsString],
    name: &str,
) -> Result<Option<toml::Value>, ConfigError> {
    let strs: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let Some(path) = config_path(&strs) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.clone(),
        source: Box::new(source),
    })?;
    Ok(table.remove(name))
}

/// The config file named by `--config FILE` / `--config=FILE` (before any `--`), else by
/// `GPUFLEET_CONFIG`.
pub fn config_path(args: &[String]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("GPUFLEET_CONFIG").map(PathBuf::from)
}

/// Parses a duration as users write it: `200ms`, `1s`, `5m`, `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid duration {s:?} ({e}); write e.g. 200ms, 1s, 5m"))
}

pub use crate::times::{TimeError, format_time, parse_time};

/// Converts a `SystemTime` to Unix milliseconds.
pub fn unix_ms(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    unix_ms(std::time::SystemTime::now())
}

/// Sets up `tracing` to stderr. The filter comes from `GPUFLEET_LOG` or `RUST_LOG`, else
/// `default_filter` (e.g. `info`).
pub fn init_tracing(default_filter: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("GPUFLEET_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// The default state directory for a binary: `$STATE_DIRECTORY` (systemd), else
/// `$XDG_STATE_HOME/gpufleet`, else `~/.local/state/gpufleet`, else `./.gpufleet`.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STATE_DIRECTORY") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return Path::new(&d).join("gpufleet");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return Path::new(&h).join(".local/state/gpufleet");
    }
    PathBuf::from(".gpufleet")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("fast").is_err());
    }
}
