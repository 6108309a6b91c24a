//! Slurm job names: the job's name, account, partition and user, for a job whose id the
//! cgroup path gave (`job_<id>`).
//!
//! Two sources, cheapest first:
//!
//! - **The process's environment** (`/proc/<pid>/environ`): slurmstepd gives every task
//!   of a job `SLURM_JOB_ID`, `SLURM_JOB_NAME`, `SLURM_JOB_ACCOUNT`,
//!   `SLURM_JOB_PARTITION` and `SLURM_JOB_USER`. Reading a file costs no round trip to
//!   the controller, which matters on a node running hundreds of short jobs. The names are
//!   only taken when the environment's `SLURM_JOB_ID` is the cgroup's job id: a process
//!   can carry another job's variables (an `srun` nested in another job's step, a process
//!   started from a shell that had them), and such a process must not lend them to the
//!   job its cgroup names.
//! - **`scontrol show job -o <id>`**, for processes without `SLURM_*` variables: an ssh
//!   session adopted into a job by `pam_slurm_adopt`, a daemon a job started with a clean
//!   environment. It asks the controller, so it runs off the sampling path, bounded by a
//!   timeout, and only for a job id that is digits (an array task's `<job>_<task>` too):
//!   nothing else ever reaches the command line.
//!
//! Nothing here logs; the caller logs a [`NameError`] once per cause. Every name passes
//! through [`clean_name`](super::clean_name), so none can get a batch refused.

use std::ffi::OsStr;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::{NameError, RuntimeNames, cut, whole_secs};

/// The `source_name` of every [`NameError`] from this module.
const SOURCE: &str = "slurm";

/// The most bytes read from one `/proc/<pid>/environ`. Environments are a few KiB; the
/// kernel caps argv + environ at a quarter of the stack limit, which can be far more than
/// anything worth reading on a resolver pass.
pub const ENVIRON_MAX_BYTES: u64 = 1 << 20;

/// The most characters of a command's message kept in a [`NameError`].
const WHY_MAX_CHARS: usize = 200;

/// Reads `<proc_root>/<pid>/environ`: the process's initial environment, `KEY=VALUE`
/// entries each ended by a NUL. At most [`ENVIRON_MAX_BYTES`] are read; when the file is
/// longer, the entry cut by the limit is dropped, so a value is never read half.
///
/// Reading another user's `environ` needs the agent to be root (or to hold
/// `CAP_SYS_PTRACE`); the error is then `PermissionDenied`.
pub fn read_environ(proc_root: &Path, pid: u32) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(proc_root.join(pid.to_string()).join("environ"))?;
    let mut environ = Vec::new();
    file.take(ENVIRON_MAX_BYTES).read_to_end(&mut environ)?;
    if environ.len() as u64 == ENVIRON_MAX_BYTES {
        // Possibly cut: keep whole entries only.
        let whole = environ
            .iter()
            .rposition(|&b| b == 0)
            .map_or(0, |nul| nul + 1);
        environ.truncate(whole);
    }
    Ok(environ)
}

/// The job's names from a process's environment (NUL-separated `KEY=VALUE` entries, as
/// [`read_environ`] returns them), or `None` when the environment says nothing about job
/// `job_id`:
///
/// - `None` when there is no `SLURM_JOB_ID` (a process outside any job's environment, or
///   adopted by `pam_slurm_adopt`: ask [`scontrol_show_job`]);
/// - `None` when `SLURM_JOB_ID` is another job's id. Both `SLURM_JOB_ID` and the
///   cgroup's `job_<n>` are the raw job id (for an array task too, never
///   `<array>_<task>`), so they are compared as they are;
/// - `None` when none of `SLURM_JOB_NAME`, `SLURM_JOB_ACCOUNT`, `SLURM_JOB_PARTITION`,
///   `SLURM_JOB_USER`, the array task (`SLURM_ARRAY_JOB_ID` + `SLURM_ARRAY_TASK_ID`) and
///   the heterogeneous job component (`SLURM_HET_JOB_ID` + `SLURM_HET_JOB_OFFSET`) gives
///   a name; otherwise the names that are there.
///
/// Entries are read one by one: a value that is not UTF-8, or that
/// [`clean_name`](super::clean_name) refuses, is dropped (never mangled) and the others
/// are kept. When a key appears twice, the first one counts, as for `getenv(3)`.
pub fn names_from_environ(environ: &[u8], job_id: &str) -> Option<RuntimeNames> {
    if environ_value(environ, b"SLURM_JOB_ID")? != job_id.as_bytes() {
        return None;
    }
    let names = RuntimeNames {
        job_name: environ_name(environ, b"SLURM_JOB_NAME"),
        account: environ_name(environ, b"SLURM_JOB_ACCOUNT"),
        partition: environ_name(environ, b"SLURM_JOB_PARTITION"),
        job_user: environ_name(environ, b"SLURM_JOB_USER"),
        array_task: job_pair(
            environ_text(environ, b"SLURM_ARRAY_JOB_ID"),
            '_',
            environ_text(environ, b"SLURM_ARRAY_TASK_ID"),
        ),
        het_component: job_pair(
            environ_text(environ, b"SLURM_HET_JOB_ID"),
            '+',
            environ_text(environ, b"SLURM_HET_JOB_OFFSET"),
        ),
        ..RuntimeNames::default()
    };
    (names != RuntimeNames::default()).then_some(names)
}

/// The value of `key` as a name: `None` when absent, not UTF-8, or refused by
/// [`clean_name`](super::clean_name).
fn environ_name(environ: &[u8], key: &[u8]) -> Option<String> {
    environ_value(environ, key)
        .and_then(|value| std::str::from_utf8(value).ok())
        .and_then(super::clean_name)
}

/// The value of `key` as UTF-8 text, `None` when absent or not UTF-8.
fn environ_text<'a>(environ: &'a [u8], key: &[u8]) -> Option<&'a str> {
    environ_value(environ, key).and_then(|value| std::str::from_utf8(value).ok())
}

/// `<job><sep><n>` as `sacct` writes an array task (`_`) or a heterogeneous job's
/// component (`+`), when both parts are given and are decimal numbers (at most 10
/// digits, as Slurm's 32-bit ids); anything else is no name.
pub fn job_pair(job: Option<&str>, sep: char, n: Option<&str>) -> Option<String> {
    let number = |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    let (job, n) = (job?, n?);
    (number(job) && number(n)).then(|| format!("{job}{sep}{n}"))
}

/// The value of the first `key=` entry of a NUL-separated environment.
fn environ_value<'a>(environ: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(key)?.strip_prefix(b"="))
}

/// The job's names from the output of `scontrol show job -o <id>`, or `None` when it holds
/// no job record (no `JobId=`) or none of the names below.
///
/// `-o` prints one job per line as space-separated `Key=Value` pairs. Values are not
/// quoted, and a job name may hold spaces (`JobName=train llama`), so a value runs up to
/// the next ` Key=`: a space, then a key of ASCII letters, `_`, `:` and `/` (scontrol's
/// keys include `AllocNode:Sid`, `CPUs/Task`, `ReqB:S:C:T`), then `=`. A `=` inside a
/// value is kept (`JobName=lr=0.1`); a job name that itself holds ` word=` is cut there,
/// which no reading of unquoted output can avoid.
///
/// Fields: `JobName` → job name, `Account` → account, `Partition` → partition, `UserId`
/// (`alice(1000)`) → the user name before the parenthesis, `ArrayJobId` + `ArrayTaskId`
/// → the array task, `HetJobId` + `HetJobOffset` → the heterogeneous job component.
/// `(null)` and empty values are
/// absent. A heterogeneous job prints one line per component; the first is used.
pub fn names_from_scontrol(text: &str) -> Option<RuntimeNames> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    let fields = scontrol_fields(line);
    let field = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == key)
            .map(|&(_, value)| value)
    };
    field("JobId")?;
    let names = RuntimeNames {
        job_name: field("JobName").and_then(scontrol_value),
        account: field("Account").and_then(scontrol_value),
        partition: field("Partition").and_then(scontrol_value),
        job_user: field("UserId")
            .map(|user| user.split_once('(').map_or(user, |(name, _uid)| name))
            .and_then(scontrol_value),
        array_task: job_pair(field("ArrayJobId"), '_', field("ArrayTaskId")),
        het_component: job_pair(field("HetJobId"), '+', field("HetJobOffset")),
        ..RuntimeNames::default()
    };
    (names != RuntimeNames::default()).then_some(names)
}

/// Splits one `scontrol -o` line into its `(key, value)` pairs, by the rule
/// [`names_from_scontrol`] documents.
fn scontrol_fields(line: &str) -> Vec<(&str, &str)> {
    let bytes = line.as_bytes();
    let is_key_byte = |b: u8| b.is_ascii_alphabetic() || matches!(b, b'_' | b':' | b'/');
    // (where the key starts, where its `=` is)
    let keys: Vec<(usize, usize)> = (0..bytes.len())
        .filter(|&start| start == 0 || bytes[start - 1] == b' ')
        .filter_map(|start| {
            let key_len = bytes[start..]
                .iter()
                .take_while(|&&b| is_key_byte(b))
                .count();
            (key_len > 0 && bytes.get(start + key_len) == Some(&b'='))
                .then_some((start, start + key_len))
        })
        .collect();
    keys.iter()
        .enumerate()
        .map(|(n, &(start, eq))| {
            let end = keys.get(n + 1).map_or(line.len(), |&(next, _)| next);
            (&line[start..eq], line[eq + 1..end].trim_end_matches(' '))
        })
        .collect()
}

/// A value as scontrol printed it, or `None` for `(null)`, empty, or a value
/// [`clean_name`](super::clean_name) refuses.
fn scontrol_value(value: &str) -> Option<String> {
    if value == "(null)" {
        None
    } else {
        super::clean_name(value)
    }
}

/// Asks the controller for a job's names: runs `<scontrol> show job -o <job_id>` and reads
/// its answer with [`names_from_scontrol`].
///
/// `job_id` must be a job id (digits) or an array task (`<digits>_<digits>`); anything
/// else is [`NameError::Malformed`] and runs nothing. The command gets no stdin and is
/// killed when `timeout` passes ([`NameError::TimedOut`]) or the future is dropped.
///
/// Errors: scontrol could not be started, or it failed for another reason (the controller
/// is down, …) → [`NameError::Unreachable`] with the first line of its message; "Invalid
/// job id" (the job ended and left the controller's memory) → [`NameError::NotFound`];
/// "Access/permission denied" (`PrivateData=jobs` and an agent not running as root or
/// SlurmUser) → [`NameError::Forbidden`]; an answer without the job's names →
/// [`NameError::Malformed`].
pub async fn scontrol_show_job(
    scontrol: &Path,
    job_id: &str,
    timeout: Duration,
) -> Result<RuntimeNames, NameError> {
    if !is_job_id(job_id) {
        return Err(NameError::Malformed {
            source_name: SOURCE,
            why: format!(
                "{:?} is not a Slurm job id (digits, or <job>_<task>); scontrol was not run",
                cut(job_id, 64)
            ),
        });
    }
    let mut command = tokio::process::Command::new(scontrol);
    command
        .args(["show", "job", "-o", job_id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(timeout, command.output()).await {
        Err(_elapsed) => {
            return Err(NameError::TimedOut {
                source_name: SOURCE,
                secs: whole_secs(timeout),
            });
        }
        Ok(Err(error)) => {
            return Err(NameError::Unreachable {
                source_name: SOURCE,
                why: format!(
                    "cannot run {}: {error}; is Slurm's scontrol installed on this node?",
                    scontrol.display()
                ),
            });
        }
        Ok(Ok(output)) => output,
    };
    if !output.status.success() {
        return Err(scontrol_failure(
            &String::from_utf8_lossy(&output.stderr),
            output.status,
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    if stdout.trim_start().starts_with("No jobs in the system") {
        return Err(NameError::NotFound {
            source_name: SOURCE,
        });
    }
    names_from_scontrol(&stdout).ok_or_else(|| NameError::Malformed {
        source_name: SOURCE,
        why: format!(
            "scontrol show job -o {job_id} printed no job name, account, partition or user: {:?}",
            cut(stdout.lines().next().unwrap_or_default(), WHY_MAX_CHARS)
        ),
    })
}

/// The error for a scontrol that exited unsuccessfully, from what it wrote to stderr.
fn scontrol_failure(stderr: &str, status: std::process::ExitStatus) -> NameError {
    let first_line = stderr
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .map(|line| cut(line, WHY_MAX_CHARS));
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("invalid job id") {
        NameError::NotFound {
            source_name: SOURCE,
        }
    } else if lower.contains("permission denied") || lower.contains("access denied") {
        NameError::Forbidden {
            source_name: SOURCE,
            why: first_line.unwrap_or_else(|| format!("scontrol ended with {status}")),
        }
    } else {
        NameError::Unreachable {
            source_name: SOURCE,
            why: first_line
                .unwrap_or_else(|| format!("scontrol ended with {status} and printed nothing")),
        }
    }
}

/// Whether `s` is a job id scontrol may be asked about: digits, or `<digits>_<digits>`
/// for an array task (a job id is a 32-bit number: at most 10 digits each).
fn is_job_id(s: &str) -> bool {
    let digits = |part: &str| {
        !part.is_empty() && part.len() <= 10 && part.bytes().all(|b| b.is_ascii_digit())
    };
    match s.split_once('_') {
        Some((job, task)) => digits(job) && digits(task),
        None => digits(s),
    }
}

/// The first `scontrol` on `PATH` (the value of the `PATH` variable, as given) that is an
/// executable file, or `None`. Relative and empty `PATH` entries are skipped: the agent's
/// working directory is no place to find a command it runs as root.
pub fn find_scontrol(path_env: Option<&OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path_env?)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("scontrol"))
        .find(|candidate| is_executable_file(candidate))
}

/// Whether `path` is a regular file (after symlinks) with an execute bit set.
fn is_executable_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    use std::time::Instant;

    use super::*;

    const BATCH: &[u8] = include_bytes!("../../tests/fixtures/names/slurm-environ-batch");
    const ADOPTED: &[u8] = include_bytes!("../../tests/fixtures/names/slurm-environ-adopted");
    const SCONTROL: &str = include_str!("../../tests/fixtures/names/scontrol-show-job-o.txt");

    fn some(s: &str) -> Option<String> {
        Some(s.to_owned())
    }

    #[test]
    fn a_step_environment_gives_the_jobs_names() {
        let names =
            names_from_environ(BATCH, "48213").expect("the step's environment names job 48213");
        assert_eq!(
            names,
            RuntimeNames {
                job_name: some("train-llama"),
                account: some("physics"),
                partition: some("gpu"),
                job_user: some("alice"),
                ..RuntimeNames::default()
            }
        );
    }

    #[test]
    fn an_array_tasks_and_a_het_components_environment_name_them_as_sacct_does() {
        let environ = b"SLURM_JOB_ID=5\0SLURM_ARRAY_JOB_ID=2\0SLURM_ARRAY_TASK_ID=3\0\
            SLURM_HET_JOB_ID=9\0SLURM_HET_JOB_OFFSET=1\0";
        let names = names_from_environ(environ, "5").expect("names");
        assert_eq!(names.array_task, some("2_3"));
        assert_eq!(names.het_component, some("9+1"));
        // Half a pair, or a part that is not a number, is no name.
        let odd = b"SLURM_JOB_ID=5\0SLURM_ARRAY_JOB_ID=2\0SLURM_HET_JOB_ID=9\0\
            SLURM_HET_JOB_OFFSET=1;rm\0SLURM_JOB_NAME=x\0";
        let names = names_from_environ(odd, "5").expect("names");
        assert_eq!((names.array_task, names.het_component), (None, None));
        assert_eq!(job_pair(Some("12345678901"), '_', Some("1")), None);
        assert_eq!(job_pair(Some(""), '_', Some("1")), None);
    }

    #[test]
    fn an_scontrol_line_names_the_array_task() {
        let line = "JobId=5 ArrayJobId=2 ArrayTaskId=3 JobName=sweep UserId=alice(1000) \
            HetJobId=9 HetJobOffset=0 Partition=gpu";
        let names = names_from_scontrol(line).expect("a job record");
        assert_eq!(names.array_task, some("2_3"));
        assert_eq!(names.het_component, some("9+0"));
        assert_eq!(names.job_name, some("sweep"));
    }

    #[test]
    fn an_adopted_process_has_no_slurm_variables() {
        assert_eq!(names_from_environ(ADOPTED, "48213"), None);
    }

    #[test]
    fn another_jobs_environment_lends_no_names() {
        // The cgroup says job 5, the environment says job 48213 (a nested srun).
        assert_eq!(names_from_environ(BATCH, "5"), None);
        // Not a prefix match either.
        assert_eq!(names_from_environ(BATCH, "4821"), None);
        assert_eq!(names_from_environ(BATCH, "482130"), None);
    }

    #[test]
    fn an_odd_value_is_dropped_and_the_others_kept() {
        let environ = b"HOME=/root\0SLURM_JOB_ID=7\0SLURM_JOB_NAME=caf\xe9\0\
            SLURM_JOB_ACCOUNT=phys\x07ics\0SLURM_JOB_PARTITION=gpu\0SLURM_JOB_USER=\0";
        assert_eq!(
            names_from_environ(environ, "7"),
            Some(RuntimeNames {
                partition: some("gpu"),
                ..RuntimeNames::default()
            })
        );
    }

    #[test]
    fn a_job_id_without_names_gives_none() {
        assert_eq!(
            names_from_environ(b"SLURM_JOB_ID=7\0PATH=/bin\0", "7"),
            None
        );
        assert_eq!(names_from_environ(b"", "7"), None);
    }

    #[test]
    fn the_first_of_two_entries_counts_and_keys_match_whole() {
        let environ = b"SLURM_JOB_ID_X=9\0SLURM_JOB_ID=7\0SLURM_JOB_ID=9\0\
            SLURM_JOB_NAMES=wrong\0SLURM_JOB_NAME=right\0";
        assert_eq!(
            names_from_environ(environ, "7").and_then(|names| names.job_name),
            some("right")
        );
        assert_eq!(names_from_environ(environ, "9"), None);
    }

    #[test]
    fn read_environ_reads_the_process_file() {
        let root = tempfile::tempdir().expect("a temporary /proc");
        let dir = root.path().join("731822");
        std::fs::create_dir(&dir).expect("the process's directory");
        std::fs::write(dir.join("environ"), BATCH).expect("its environ");
        assert_eq!(read_environ(root.path(), 731822).expect("readable"), BATCH);
        assert_eq!(
            read_environ(root.path(), 1)
                .expect_err("no such process")
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn read_environ_keeps_whole_entries_of_a_huge_environment() {
        let root = tempfile::tempdir().expect("a temporary /proc");
        let dir = root.path().join("42");
        std::fs::create_dir(&dir).expect("the process's directory");
        let filler = format!("FILLER={}\0", "x".repeat(4096));
        let mut environ = b"SLURM_JOB_ID=7\0".to_vec();
        while environ.len() < 2 * ENVIRON_MAX_BYTES as usize {
            environ.extend_from_slice(filler.as_bytes());
        }
        std::fs::write(dir.join("environ"), &environ).expect("its environ");
        let read = read_environ(root.path(), 42).expect("readable");
        assert!(read.len() as u64 <= ENVIRON_MAX_BYTES);
        assert!(
            read.ends_with(filler.as_bytes()),
            "the cut entry is dropped"
        );
        assert!(read.starts_with(b"SLURM_JOB_ID=7\0"));
    }

    #[test]
    fn an_scontrol_line_gives_the_jobs_names() {
        let names = names_from_scontrol(SCONTROL).expect("a job record");
        assert_eq!(
            names,
            RuntimeNames {
                job_name: some("train llama"),
                account: some("physics"),
                partition: some("gpu"),
                job_user: some("alice"),
                ..RuntimeNames::default()
            }
        );
    }

    #[test]
    fn scontrol_keys_with_colons_and_slashes_end_the_value_before_them() {
        let fields: BTreeMap<&str, &str> =
            scontrol_fields(SCONTROL.trim_end()).into_iter().collect();
        assert_eq!(fields.get("JobName"), Some(&"train llama"));
        assert_eq!(fields.get("Partition"), Some(&"gpu"));
        assert_eq!(fields.get("AllocNode:Sid"), Some(&"login1:12345"));
        assert_eq!(fields.get("CPUs/Task"), Some(&"8"));
        assert_eq!(fields.get("ReqB:S:C:T"), Some(&"0:0:*:*"));
        assert_eq!(
            fields.get("ReqTRES"),
            Some(&"cpu=8,mem=64G,node=1,billing=8,gres/gpu=2")
        );
        assert_eq!(fields.get("Power"), Some(&""));
        assert_eq!(fields.get("TresPerNode"), Some(&"gres/gpu:2"));
    }

    #[test]
    fn null_and_empty_scontrol_values_are_absent() {
        let names = names_from_scontrol(
            "JobId=12 JobName=lr=0.1 sweep UserId=bob(1001) GroupId=bob(1001) Account=(null) QOS=normal Partition= AllocNode:Sid=login1:1",
        )
        .expect("a job record");
        assert_eq!(
            names,
            RuntimeNames {
                job_name: some("lr=0.1 sweep"),
                job_user: some("bob"),
                ..RuntimeNames::default()
            }
        );
    }

    #[test]
    fn a_heterogeneous_job_uses_its_first_component() {
        let text = "JobId=100 HetJobId=100 HetJobOffset=0 JobName=pipeline UserId=alice(1000) Account=physics Partition=cpu\n\
                    JobId=101 HetJobId=100 HetJobOffset=1 JobName=pipeline UserId=alice(1000) Account=physics Partition=gpu\n";
        assert_eq!(
            names_from_scontrol(text).and_then(|names| names.partition),
            some("cpu")
        );
    }

    #[test]
    fn text_without_a_job_record_gives_none() {
        assert_eq!(names_from_scontrol(""), None);
        assert_eq!(names_from_scontrol("No jobs in the system\n"), None);
        assert_eq!(names_from_scontrol("JobName=x Account=y"), None);
        assert_eq!(
            names_from_scontrol("JobId=5 JobName=(null) Account=(null)"),
            None
        );
    }

    #[test]
    fn job_ids_are_digits_or_array_tasks() {
        for good in ["1", "48213", "48213_7", "4294967294"] {
            assert!(is_job_id(good), "{good}");
        }
        for bad in [
            "",
            "_",
            "1_",
            "_1",
            "1_2_3",
            "12a",
            "-1",
            "1 2",
            "1; rm -rf /",
            "12345678901",
        ] {
            assert!(!is_job_id(bad), "{bad}");
        }
    }

    #[test]
    fn find_scontrol_takes_the_first_executable_file() {
        let root = tempfile::tempdir().expect("a temporary directory");
        let (plain, as_dir, good) = (
            root.path().join("plain"),
            root.path().join("as-dir"),
            root.path().join("good"),
        );
        for dir in [&plain, &as_dir, &good] {
            std::fs::create_dir(dir).expect("a PATH directory");
        }
        std::fs::write(plain.join("scontrol"), "not executable").expect("a plain file");
        std::fs::create_dir(as_dir.join("scontrol")).expect("a directory named scontrol");
        let expected = fake_scontrol(&good, "scontrol", "exit 0");
        let path = std::env::join_paths([
            plain.as_path(),
            Path::new("relative"),
            as_dir.as_path(),
            good.as_path(),
        ])
        .expect("a PATH value");
        assert_eq!(find_scontrol(Some(path.as_os_str())), Some(expected));
        assert_eq!(find_scontrol(Some(plain.as_os_str())), None);
        assert_eq!(find_scontrol(None), None);
    }

    #[test]
    fn whole_secs_rounds_up() {
        assert_eq!(whole_secs(Duration::from_millis(200)), 1);
        assert_eq!(whole_secs(Duration::from_secs(2)), 2);
        assert_eq!(whole_secs(Duration::from_millis(2001)), 3);
    }

    /// Writes an executable `#!/bin/sh` script into `dir`.
    fn fake_scontrol(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&path)
            .expect("create the fake scontrol");
        file.write_all(format!("#!/bin/sh\n{body}\n").as_bytes())
            .expect("write the fake scontrol");
        file.sync_all().expect("flush the fake scontrol");
        path
    }

    /// [`scontrol_show_job`], retried while the script cannot start because it is "busy":
    /// a script written a moment ago fails with ETXTBSY while another test thread's fork
    /// still holds a copy of the descriptor it was written through.
    async fn show_job(
        scontrol: &Path,
        job_id: &str,
        timeout: Duration,
    ) -> Result<RuntimeNames, NameError> {
        for _ in 0..50 {
            match scontrol_show_job(scontrol, job_id, timeout).await {
                Err(NameError::Unreachable { why, .. }) if why.contains("Text file busy") => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
        scontrol_show_job(scontrol, job_id, timeout).await
    }

    #[tokio::test]
    async fn scontrol_answers_with_the_jobs_names() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let scontrol = fake_scontrol(
            dir.path(),
            "scontrol",
            &format!(
                "[ \"$*\" = \"show job -o 48213\" ] || {{ echo \"unexpected arguments: $*\" >&2; exit 2; }}\n\
                 cat <<'EOF'\n{SCONTROL}EOF"
            ),
        );
        let names = show_job(&scontrol, "48213", Duration::from_secs(10))
            .await
            .expect("names from the fake scontrol");
        assert_eq!(names.job_name, some("train llama"));
        assert_eq!(names.job_user, some("alice"));
        assert_eq!(names.account, some("physics"));
        assert_eq!(names.partition, some("gpu"));
    }

    #[tokio::test]
    async fn a_silent_scontrol_times_out() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let scontrol = fake_scontrol(dir.path(), "scontrol", "exec sleep 10");
        let started = Instant::now();
        let result = show_job(&scontrol, "48213", Duration::from_millis(200)).await;
        assert_eq!(
            result,
            Err(NameError::TimedOut {
                source_name: "slurm",
                secs: 1
            })
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "did not wait for the command"
        );
    }

    #[tokio::test]
    async fn scontrol_failures_map_to_causes() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cases = [
            (
                "invalid",
                "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1",
                "not_found",
            ),
            (
                "denied",
                "echo 'slurm_load_jobs error: Access/permission denied' >&2; exit 1",
                "forbidden",
            ),
            (
                "down",
                "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
                "unreachable",
            ),
            ("mute", "exit 1", "unreachable"),
            ("empty", "exit 0", "malformed"),
            ("none", "echo 'No jobs in the system'", "not_found"),
        ];
        for (name, body, cause) in cases {
            let scontrol = fake_scontrol(dir.path(), name, body);
            let error = show_job(&scontrol, "48213", Duration::from_secs(10))
                .await
                .expect_err(name);
            assert_eq!(error.cause(), cause, "{name}: {error}");
        }
        let scontrol = fake_scontrol(
            dir.path(),
            "down-why",
            "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1",
        );
        assert_eq!(
            show_job(&scontrol, "48213", Duration::from_secs(10)).await,
            Err(NameError::Unreachable {
                source_name: "slurm",
                why: "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
                    .to_owned()
            })
        );
    }

    #[tokio::test]
    async fn a_missing_scontrol_is_unreachable() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let error = scontrol_show_job(
            &dir.path().join("scontrol"),
            "48213",
            Duration::from_secs(10),
        )
        .await
        .expect_err("nothing to run");
        assert_eq!(error.cause(), "unreachable", "{error}");
    }

    #[tokio::test]
    async fn a_bad_job_id_runs_nothing() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        // Running this would fail with `unreachable` (no such file), not `malformed`.
        let scontrol = dir.path().join("scontrol");
        let error = scontrol_show_job(&scontrol, "1; rm -rf /", Duration::from_secs(10))
            .await
            .expect_err("not a job id");
        assert!(
            matches!(
                error,
                NameError::Malformed {
                    source_name: "slurm",
                    ..
                }
            ),
            "{error}"
        );
    }
}
