//! The `--config FILE` layer under clap: the file's keys become `--flag=value` arguments
//! for the flags that the command line and the environment left unset, so precedence is
//! CLI > environment (`GPUFLEET_*`, declared on each clap arg) > file > default (clap
//! already does CLI > env > default). Unknown keys are an error
//! ([`ConfigError::UnknownKey`], `deny_unknown_fields` semantics), naming the keys that are
//! valid. Structured tables ([`SECTIONS`], e.g. `[carbon]`) are skipped here and read by
//! their owners ([`config_file_section`](gpufleet_core::config::config_file_section)).

use gpufleet_core::config::{ConfigError, SECTIONS, config_path};
use std::ffi::OsString;
use std::path::PathBuf;

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
    let strs = strings(&args);
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
    let is_command = |key: &str| cmd.find_subcommand(key).is_some();
    layer(args, &strs, path, pos, sub, sub.get_name(), &is_command)
}

/// [`args_with_config_file`] for a binary that is one command of another's family, run
/// by it git-style (`gpufleet-exec` is `gpufleet-agent exec`): `cmd` is the whole binary,
/// taken as the command `name`; the file's top-level keys and its `[name]` table apply,
/// and the tables of its `siblings` (`[run]`, `[snapshot]`) are the other commands' and
/// are skipped, so one config file serves the whole family as before.
pub fn args_with_config_file_as(
    args: Vec<OsString>,
    cmd: &clap::Command,
    name: &str,
    siblings: &[&str],
) -> Result<Vec<OsString>, ConfigError> {
    let strs = strings(&args);
    let Some(path) = config_path(&strs) else {
        return Ok(args);
    };
    let is_command = |key: &str| key == name || siblings.contains(&key);
    layer(args, &strs, path, 0, cmd, name, &is_command)
}

fn strings(args: &[OsString]) -> Vec<String> {
    args.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Inserts the file's settings for command `sub` (named `sub_name`) right after
/// `args[pos]`; `is_command` says which top-level tables are commands' tables.
fn layer(
    args: Vec<OsString>,
    strs: &[String],
    path: PathBuf,
    pos: usize,
    sub: &clap::Command,
    sub_name: &str,
    is_command: &dyn Fn(&str) -> bool,
) -> Result<Vec<OsString>, ConfigError> {
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.clone(),
        source: Box::new(source),
    })?;

    let sub_name = sub_name.to_owned();
    let mut settings: Vec<(String, toml::Value)> = Vec::new();
    for (key, value) in table {
        match value {
            // Structured sections are read by their owners (`config_file_section`).
            toml::Value::Table(_) if SECTIONS.contains(&key.as_str()) => {}
            toml::Value::Table(t) if is_command(&key) => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Parser, Subcommand};
    use gpufleet_core::config::config_file_section;

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

    /// A binary that is one command of a family (`gpufleet-exec` as `gpufleet-agent exec`).
    #[derive(Parser, Debug)]
    struct ExecCli {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value = "1s")]
        interval: String,
        #[arg(long)]
        all_gpus: bool,
        #[arg(last = true)]
        command: Vec<String>,
    }

    #[test]
    fn a_family_binary_takes_its_table_and_skips_its_siblings() {
        use clap::CommandFactory;
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "interval = \"2s\"\n[exec]\nall_gpus = true\n[run]\ncollector = \"http://c:1\"\n",
        )
        .expect("write");
        let args: Vec<OsString> = ["bin", "--config"]
            .iter()
            .map(OsString::from)
            .chain([path.as_os_str().to_owned()])
            .chain(["--", "true", "--verbose"].iter().map(OsString::from))
            .collect();
        let with = args_with_config_file_as(args, &ExecCli::command(), "exec", &["run"])
            .expect("[run] skipped");
        let cli = ExecCli::try_parse_from(with).expect("parses");
        assert_eq!(cli.interval, "2s");
        assert!(cli.all_gpus);
        assert_eq!(
            cli.command,
            vec!["true", "--verbose"],
            "the command is left alone"
        );
    }
}
