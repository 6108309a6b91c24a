//! Configuration shared by both binaries: the `--config FILE` (TOML) layer, durations as
//! users type them (timestamps: [`crate::times`], re-exported here), and logging set-up.
//!
//! Precedence is CLI > environment (`GPUFLEET_*`, declared on each clap arg) > file >
//! default. clap already does CLI > env > default; [`args_with_config_file`] adds the file
//! layer by inserting `--flag=value` for each file key whose flag was given neither on the
//! command line nor through its environment variable. Unknown keys are an error
//! (`deny_unknown_fields` semantics), naming the keys that are valid.

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

/// Returns `args` with the config file's settings inserted for flags that the command line
/// and the environment left unset. `cmd` is the binary's clap command
/// (`Cli::command()`); the file is named by `--config` or `GPUFLEET_CONFIG`.
///
/// The file's top-level keys apply to the subcommand being run; a table named after a
/// subcommand (`[serve]`, `[run]`) applies only to it. Keys are flag names, with `-` or `_`.
pub fn args_with_config_file(
    args: Vec<OsString>,
    cmd: &clap::Command,
) -> Result<Vec<OsString>, ConfigError> {
    let strs: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let Some(path) = config_path(&strs) else {
        return Ok(args);
    };
    // Position of the subcommand name: settings are inserted right after it, so that
    // trailing positional arguments (`-- COMMAND ...`) are left alone.
    let Some((pos, sub)) = strs
        .iter()
        .enumerate()
        .skip(1)
        .find_map(|(i, a)| cmd.find_subcommand(a).map(|s| (i, s)))
    else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.clone(),
        source: Box::new(source),
    })?;

    let sub_name = sub.get_name().to_owned();
    let mut settings: Vec<(String, toml::Value)> = Vec::new();
    for (key, value) in table {
        match value {
            // Structured sections are read by their owners (`config_file_section`).
            toml::Value::Table(_) if SECTIONS.contains(&key.as_str()) => {}
            toml::Value::Table(t) if cmd.find_subcommand(&key).is_some() => {
                if key == sub_name {
                    settings.extend(t);
                }
            }
            v => settings.push((key, v)),
        }
    }

    let mut inserted: Vec<OsString> = Vec::new();
    for (key, value) in settings {
        let long = key.replace('_', "-");
        if long == "config" {
            continue;
        }
        let Some(arg) = sub
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
        else {
            let valid: Vec<String> = sub
                .get_arguments()
                .filter_map(|a| a.get_long())
                .filter(|l| *l != "help" && *l != "config")
                .map(|l| l.replace('-', "_"))
                .collect();
            return Err(ConfigError::UnknownKey {
                path,
                key,
                command: sub_name,
                valid: valid.join(", "),
            });
        };
        let on_cli = strs.iter().any(|a| {
            a == &format!("--{long}")
                || a.starts_with(&format!("--{long}="))
                || arg.get_short().is_some_and(|s| a == &format!("-{s}"))
        });
        let in_env = arg.get_env().is_some_and(|e| std::env::var_os(e).is_some());
        if on_cli || in_env {
            continue;
        }
        let values = match value {
            toml::Value::Array(items) => items,
            v => vec![v],
        };
        for v in values {
            match v {
                toml::Value::Boolean(true) if !arg.get_action().takes_values() => {
                    inserted.push(format!("--{long}").into());
                }
                toml::Value::Boolean(false) if !arg.get_action().takes_values() => {}
                toml::Value::String(s) => inserted.push(format!("--{long}={s}").into()),
                toml::Value::Integer(n) => inserted.push(format!("--{long}={n}").into()),
                toml::Value::Float(f) => inserted.push(format!("--{long}={f}").into()),
                toml::Value::Boolean(b) => inserted.push(format!("--{long}={b}").into()),
                _ => return Err(ConfigError::BadValue { path, key }),
            }
        }
    }
    let mut out = args;
    let tail = out.split_off(pos + 1);
    out.extend(inserted);
    out.extend(tail);
    Ok(out)
}

/// Top-level tables of the config file that are not flags: settings with structure (lists
/// of per-node overrides), read with [`config_file_section`] by the code that owns them.
pub const SECTIONS: &[&str] = &["carbon"];

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

fn config_path(args: &[String]) -> Option<PathBuf> {
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
    use clap::{Parser, Subcommand};

    #[derive(Parser, Debug)]
    struct Cli {
        #[arg(long, global = true)]
        config: Option<PathBuf>,
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Subcommand, Debug)]
    enum Cmd {
        Serve {
            #[arg(long, env = "GPUFLEET_TEST_DB", default_value = "sqlite://default.db")]
            db: String,
            #[arg(long, env = "GPUFLEET_TEST_LISTEN_XYZ", default_value = "127.0.0.1:1")]
            http_listen: String,
            #[arg(long)]
            verbose: bool,
            #[arg(long)]
            label: Vec<String>,
        },
    }

    fn run(file: &str, argv: &[&str]) -> Result<Cli, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, file).map_err(|e| e.to_string())?;
        let mut args: Vec<OsString> = vec!["bin".into()];
        args.extend(argv.iter().map(OsString::from));
        args.push("--config".into());
        args.push(path.as_os_str().to_owned());
        use clap::CommandFactory;
        let args = args_with_config_file(args, &Cli::command()).map_err(|e| e.to_string())?;
        Cli::try_parse_from(args).map_err(|e| e.to_string())
    }

    #[test]
    fn file_fills_what_cli_left_unset_and_cli_wins() {
        let cli = run(
            "db = \"sqlite://file.db\"\nhttp_listen = \"0.0.0.0:9\"\nverbose = true\nlabel = [\"a=1\", \"b=2\"]\n",
            &["serve", "--db", "sqlite://cli.db"],
        )
        .expect("parses");
        let Cmd::Serve {
            db,
            http_listen,
            verbose,
            label,
        } = cli.cmd;
        assert_eq!(db, "sqlite://cli.db");
        assert_eq!(http_listen, "0.0.0.0:9");
        assert!(verbose);
        assert_eq!(label, vec!["a=1", "b=2"]);
    }

    #[test]
    fn subcommand_table_applies() {
        let cli = run("[serve]\ndb = \"sqlite://t.db\"\n", &["serve"]).expect("parses");
        let Cmd::Serve { db, .. } = cli.cmd;
        assert_eq!(db, "sqlite://t.db");
    }

    #[test]
    fn unknown_key_is_an_error_that_lists_valid_keys() {
        let err = run("dbb = 1\n", &["serve"]).expect_err("unknown key");
        assert!(
            err.contains("unknown key `dbb`") && err.contains("http_listen"),
            "{err}"
        );
    }

    #[test]
    fn sections_are_skipped_by_flags_and_read_by_their_owner() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "db = \"sqlite://f.db\"\n[[carbon.nodes]]\nnode = \"a\"\ng_per_kwh = 5\n",
        )
        .expect("write");
        let args: Vec<OsString> = vec![
            "bin".into(),
            "serve".into(),
            "--config".into(),
            path.as_os_str().to_owned(),
        ];
        use clap::CommandFactory;
        let with = args_with_config_file(args.clone(), &Cli::command()).expect("carbon skipped");
        let Cmd::Serve { db, .. } = Cli::try_parse_from(with).expect("parses").cmd;
        assert_eq!(db, "sqlite://f.db");
        let carbon = config_file_section(&args, "carbon")
            .expect("reads")
            .expect("has [carbon]");
        assert_eq!(carbon["nodes"][0]["node"].as_str(), Some("a"));
        assert!(
            config_file_section(&args, "other")
                .expect("reads")
                .is_none()
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("fast").is_err());
    }
}
