//! The spool's configuration, its default folder per node, and its errors.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// Under [`FsyncPolicy::Acked`], how long a tick may stay unacked and unsynced.
pub const ACKED_GRACE: Duration = Duration::from_secs(1);

/// When the spool calls fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FsyncPolicy {
    /// Only for ticks the collector has not acked within [`ACKED_GRACE`]: one fsync then
    /// covers all of them. A tick acked sooner is durable in the collector's database and
    /// never costs a disk flush here; a power cut loses at most the last second of
    /// unacked ticks.
    #[default]
    Acked,
    /// After every appended tick and every watermark update (an ack survives power loss).
    Batch,
    /// At most once a second (a power cut loses at most the last second).
    Interval,
    /// Never; the OS writes back (survives process crashes, not power loss).
    Never,
}

/// The spool settings for node `node`: `dir`, else the default one under the state dir
/// (`<state dir>/spool/<node>`).
pub fn config_for(
    node: &str,
    dir: Option<PathBuf>,
    max_bytes: u64,
    fsync: FsyncPolicy,
) -> SpoolConfig {
    let dir = dir.unwrap_or_else(|| {
        gpufleet_core::config::default_state_dir()
            .join("spool")
            .join(spool_dir_name(node))
    });
    SpoolConfig {
        dir,
        max_bytes,
        fsync,
    }
}

/// A directory name for `node`'s default spool that stays inside the spool folder:
/// letters, digits, `-`, `_` and `.` are kept; anything else (a `/`, `..`, spaces) is
/// replaced, and a hash of the original name is appended so two names never share a spool.
pub(super) fn spool_dir_name(node: &str) -> String {
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe == node && !node.is_empty() && !node.starts_with('.') {
        return safe;
    }
    // FNV-1a: stable across runs and versions (unlike std's hasher).
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("node-{}-{hash:016x}", safe.trim_start_matches('.'))
}

/// Where and how the spool lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolConfig {
    /// Its directory (created if missing; locked while open).
    pub dir: PathBuf,
    /// Most bytes of segment files.
    pub max_bytes: u64,
    /// The fsync policy.
    pub fsync: FsyncPolicy,
}

/// Why the spool could not be opened.
#[derive(Debug, Error)]
pub enum SpoolError {
    /// A file operation failed.
    #[error("spool {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the spool.
    #[error("spool {0} is in use by another agent (each agent needs its own --spool-dir)")]
    Locked(PathBuf),
    /// `meta.json` cannot be read.
    #[error(
        "spool {path}: unreadable meta.json ({reason}); move the directory away to start afresh"
    )]
    Meta {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_cannot_move_the_default_spool_out_of_its_folder() {
        assert_eq!(spool_dir_name("gpu-node-01.lab"), "gpu-node-01.lab");
        for hostile in [
            "../../etc",
            "/abs/path",
            "a/b",
            "..",
            ".",
            "",
            "</script> x",
        ] {
            let name = spool_dir_name(hostile);
            assert!(name.starts_with("node-"), "{hostile:?} -> {name:?}");
            assert!(!name.contains('/') && !name.contains(' ') && !name.starts_with('.'));
            let dir = std::path::Path::new("/state/spool").join(&name);
            assert_eq!(
                dir.parent(),
                Some(std::path::Path::new("/state/spool")),
                "{hostile:?}"
            );
        }
        assert_ne!(
            spool_dir_name("a/b"),
            spool_dir_name("a_b"),
            "distinct names, distinct spools"
        );
    }
}
