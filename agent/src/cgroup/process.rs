//! A process's identity from `/proc/<pid>/`: its cgroup's workload, real uid, user name
//! (from `/etc/passwd`) and command line.

use super::path::{parse_decimal, workload_from_cgroup};
use super::{MAX_FIELD_BYTES, MAX_READ_BYTES, clean_identity};
use gpufleet_core::sample::{Workload, WorkloadKind};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Who a process is: its workload and, for display, its user and command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// The container, Slurm job or host unit the process's cgroup says it belongs to.
    pub workload: Workload,
    /// The real user: a login name when the uid resolves (see [`UserNames`]), else the uid
    /// as decimal. `None` when `status` could not be read.
    pub user: Option<String>,
    /// The command line, arguments joined by spaces (control characters replaced by
    /// spaces, truncated to [`MAX_FIELD_BYTES`]); the `comm` name when the command line is
    /// empty (kernel threads, zombies). `None` when neither could be read.
    pub command: Option<String>,
}

/// A uid → login name table, parsed from a `passwd` file. Pure and cheap to clone; build
/// it once and pass it to [`identify_with`] rather than re-reading `/etc/passwd` per pid.
///
/// Only the local `passwd` file is consulted (no NSS: LDAP/SSSD users resolve to their
/// uid as a string), and a uid that does not resolve is reported as its decimal value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserNames {
    /// Login name per uid; the first entry wins, as with `getpwuid`.
    by_uid: HashMap<u32, String>,
}

impl UserNames {
    /// A table that resolves nothing: every user is reported as its uid.
    pub fn numeric() -> Self {
        Self::default()
    }

    /// Parses `passwd(5)` content (`name:password:uid:gid:gecos:home:shell`). Malformed
    /// lines, comments and names that would not fit the wire are skipped.
    pub fn from_passwd(content: &str) -> Self {
        let mut by_uid = HashMap::new();
        for line in content.lines() {
            let mut fields = line.split(':');
            let (Some(name), Some(_password), Some(uid)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let name = name.trim();
            if name.is_empty() || name.starts_with('#') {
                continue;
            }
            let (Ok(uid), Some(name)) = (uid.trim().parse::<u32>(), clean_identity(name)) else {
                continue;
            };
            by_uid.entry(uid).or_insert(name);
        }
        Self { by_uid }
    }

    /// Reads a `passwd` file; an unreadable file gives [`UserNames::numeric`].
    pub fn from_file(path: &Path) -> Self {
        read_text(path, MAX_READ_BYTES * 16)
            .map(|content| Self::from_passwd(&content))
            .unwrap_or_default()
    }

    /// The table for processes read under `proc_root`: the host's `/etc/passwd` when
    /// `proc_root` is `/proc`, otherwise (fixtures, a host `/proc` mounted elsewhere)
    /// numeric, since this machine's `/etc/passwd` says nothing about those uids. An agent
    /// that sees the host's `/proc` under another root should pass
    /// `UserNames::from_file(<host root>/etc/passwd)` to [`identify_with`] itself.
    pub fn for_proc_root(proc_root: &Path) -> Self {
        if proc_root == Path::new("/proc") {
            Self::from_file(Path::new("/etc/passwd"))
        } else {
            Self::numeric()
        }
    }

    /// The login name of `uid`, or the uid in decimal when it does not resolve.
    pub fn name(&self, uid: u32) -> String {
        self.by_uid
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }
}

/// Identifies process `pid` from the files under `<proc_root>/<pid>/`, resolving its user
/// with [`UserNames::for_proc_root`]. Convenient for one-off lookups; a sampler that
/// identifies many processes should build the [`UserNames`] once and call
/// [`identify_with`]. Never fails: see [`identify_with`].
pub fn identify(proc_root: &Path, pid: u32) -> ProcessIdentity {
    identify_with(proc_root, pid, &UserNames::for_proc_root(proc_root))
}

/// Identifies process `pid` from `<proc_root>/<pid>/{cgroup,cmdline,comm,status}`.
///
/// Never fails and never panics: a missing or unreadable `cgroup` gives a host workload,
/// a missing `status` a `None` user (and no uid), missing `cmdline` and `comm` a `None`
/// command. A host workload whose path names no uid gets the process's real uid.
pub fn identify_with(proc_root: &Path, pid: u32, users: &UserNames) -> ProcessIdentity {
    let dir = proc_root.join(pid.to_string());
    let mut workload = read_text(&dir.join("cgroup"), MAX_READ_BYTES)
        .map(|content| workload_from_cgroup(&content))
        .unwrap_or_default();
    let uid = read_text(&dir.join("status"), MAX_READ_BYTES).and_then(|s| real_uid(&s));
    if workload.kind == WorkloadKind::Host && workload.uid.is_none() {
        workload.uid = uid;
    }
    let command = read_bytes(&dir.join("cmdline"), MAX_READ_BYTES)
        .and_then(|raw| command_from_cmdline(&raw))
        .or_else(|| {
            read_bytes(&dir.join("comm"), MAX_READ_BYTES).and_then(|raw| clean_command(&raw))
        });
    ProcessIdentity {
        workload,
        user: uid.map(|uid| users.name(uid)),
        command,
    }
}

/// The real uid: the first number on `status`'s `Uid:` line.
pub(super) fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(parse_decimal)
}

/// `cmdline`'s NUL-separated arguments joined by spaces; `None` when there are none.
pub(super) fn command_from_cmdline(raw: &[u8]) -> Option<String> {
    let joined: Vec<u8> = raw.iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
    clean_command(&joined)
}

/// Lossy UTF-8, control characters as spaces, trimmed, cut to [`MAX_FIELD_BYTES`] on a
/// character boundary; `None` when empty.
pub(super) fn clean_command(raw: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(raw);
    let mut cleaned: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned();
    if cleaned.len() > MAX_FIELD_BYTES {
        let mut end = MAX_FIELD_BYTES;
        while !cleaned.is_char_boundary(end) {
            end -= 1;
        }
        cleaned.truncate(end);
        cleaned.truncate(cleaned.trim_end().len());
    }
    (!cleaned.is_empty()).then_some(cleaned)
}

/// Reads at most `limit` bytes of a file; `None` when it cannot be opened or read.
pub(super) fn read_bytes(path: &Path, limit: u64) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(limit)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// [`read_bytes`] as lossy UTF-8.
pub(super) fn read_text(path: &Path, limit: u64) -> Option<String> {
    read_bytes(path, limit).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    // ---- users and commands

    #[test]
    fn passwd_resolves_names_and_falls_back_to_the_uid() {
        let users = UserNames::from_passwd(
            "# comment\nroot:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\nalias:x:1000:1000::/:/bin/sh\nbroken\nbad:x:notanumber:0::/:/bin/sh\n",
        );
        assert_eq!(users.name(0), "root");
        assert_eq!(users.name(1000), "alice");
        assert_eq!(users.name(4242), "4242");
        assert_eq!(UserNames::numeric().name(0), "0");
        assert_eq!(
            UserNames::for_proc_root(Path::new("/tmp/fixtures")),
            UserNames::numeric()
        );
    }

    #[test]
    fn status_real_uid() {
        assert_eq!(real_uid("Name:\tx\nUid:\t1000\t0\t0\t0\n"), Some(1000));
        assert_eq!(real_uid("Name:\tx\n"), None);
        assert_eq!(real_uid("Uid:\tnope\n"), None);
    }

    #[test]
    fn cmdline_joins_arguments_and_cleans_them() {
        assert_eq!(
            command_from_cmdline(b"python\0train.py\0").as_deref(),
            Some("python train.py")
        );
        assert_eq!(command_from_cmdline(b"").as_deref(), None);
        assert_eq!(command_from_cmdline(b"\0\0").as_deref(), None);
        assert_eq!(
            command_from_cmdline(b"python\0-c\0import os\nprint(1)\0").as_deref(),
            Some("python -c import os print(1)")
        );
        let long = format!("python\0{}", "é".repeat(MAX_FIELD_BYTES));
        let command = command_from_cmdline(long.as_bytes()).unwrap_or_default();
        assert!(command.len() <= MAX_FIELD_BYTES && command.starts_with("python é"));
        assert_eq!(clean_command(b"python\n").as_deref(), Some("python"));
    }

    #[test]
    fn missing_process_is_an_empty_host_identity() {
        let identity = identify(Path::new("/nonexistent/proc"), 1);
        assert_eq!(identity, ProcessIdentity::default());
    }
}
