//! `slurm-epilog` and `slurm-backfill`: each Slurm job's GPU energy and CO2, written into
//! the job's `AdminComment` in Slurm's accounting, so `sacct -o AdminComment` (and the
//! tools built on it) show it.
//!
//! - **`slurm-epilog`** is meant for `EpilogSlurmctld` (Slurm gives it `SLURM_JOB_ID` and,
//!   for an array task or a heterogeneous job's component, `SLURM_ARRAY_*` /
//!   `SLURM_HET_JOB_*`), or is run by hand with `--job`. It waits, bounded by `--wait`,
//!   until the job's energy is accounted: `--settle` after the job's end (the time samples
//!   take to reach the collector), then until its GPUs' accounting has passed its end
//!   (`accounted_to_ms` of the report: the minute holding the end has closed, within a
//!   minute and the energy tail) and then, for up to [`CARBON_WAIT`], until all of it is
//!   priced in CO2. At the deadline it writes what there is, with a still-open part as
//!   `provisional_j`. A job without GPU energy gets nothing written. Whatever fails, it
//!   says so on stderr (slurmctld's log) and exits 0: a job's accounting never fails the
//!   job.
//! - **`slurm-backfill`**: every job that ended in a range and has no summary yet (all of
//!   them with `--redo`), for epilogs that did not run (a controller restart).
//!
//! **Where the figures come from.** The collector's report of the job's workload
//! (`/api/v1/report?container=slurm:<raw id>`, with a viewer token) or the database itself
//! (`--db`): the same figures as `report --job` gives for the job, so the joules agree.
//!
//! **What is written.** A compact, versioned JSON object, `{"gpufleet":{"v":1,…}}`, with
//! lower-case keys and numbers only ([`Summary`]): Slurm 22.05's `sacctmgr` lower-cases an
//! `AdminComment` it sets and stores `"` as `` ` `` (measured here), so `sacct` shows
//! ``{`gpufleet`:{`v`:1,…}}``; [`read_summary`] reads both. Another tool's text in the
//! field is kept byte for byte, ours is put after it (a space between) or replaces our
//! earlier one. Text that `sacctmgr` would alter on the way back (upper case, quotes) is
//! never rewritten: the job is then left alone and the reason logged. The whole field
//! stays under [`MAX_ADMIN_COMMENT_BYTES`] (the database's `TEXT` column).
//!
//! **Which job.** Always as sacct writes it (`123`, `123_4`, `123+1`), never by its raw
//! id: `sacctmgr … where jobid=<raw id>` of an array task whose raw id is the array's id
//! changes every task of the array (measured on 22.05), `jobid=123_4` only that task.
//! `sacct -j` gives the times and the current `AdminComment`.

use crate::accounting::report::{ReportSubject, build};
use crate::store::{self, Store, TimeRange};
use gpufleet_core::UnixMs;
use gpufleet_core::config::{now_ms, parse_duration, parse_time};
use gpufleet_report::Report;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tracing::{error, info, warn};

/// The most bytes of an `AdminComment`: slurmdbd keeps it in a MySQL `TEXT` column.
pub const MAX_ADMIN_COMMENT_BYTES: usize = 65_535;
/// The version of [`Summary`]'s layout.
pub const SUMMARY_VERSION: u32 = 1;
/// How long one `sacct` / `sacctmgr` run may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two tries while waiting.
const RETRY: Duration = Duration::from_secs(2);
/// How long, once a job's energy is final, to wait for all of it to be priced in CO2
/// (the collector's carbon pass runs every 30 s; with no carbon provider it never is).
const CARBON_WAIT: Duration = Duration::from_secs(45);

/// Where the job's figures come from.
#[derive(Debug, Clone, clap::Args)]
pub struct SourceArgs {
    /// The collector's HTTP address (`http://collector:8080`); the report is asked there.
    #[arg(long, env = "GPUFLEET_API", value_name = "URL", conflicts_with = "db")]
    pub api: Option<String>,
    /// A file holding a viewer token for `--api` (`gpufleet-collector tokens add --role viewer slurm`);
    /// needed when the collector's HTTP listener is not on loopback.
    #[arg(long, env = "GPUFLEET_API_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The collector's database instead of its API (sqlite://PATH or postgres://…).
    #[arg(long, env = "GPUFLEET_DB", value_name = "URL")]
    pub db: Option<String>,
    /// How long one request to the collector may take.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub request_timeout: Duration,
    /// Slurm's `sacct`.
    #[arg(long, default_value = "sacct", value_name = "PATH")]
    pub sacct: PathBuf,
    /// Slurm's `sacctmgr` (needs an operator or admin of the accounting: run by
    /// slurmctld as SlurmUser, it is).
    #[arg(long, default_value = "sacctmgr", value_name = "PATH")]
    pub sacctmgr: PathBuf,
}

/// `slurm-epilog` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct EpilogArgs {
    /// The job, as sacct writes it (`123`, `123_4`, `123+1`). Default: the job of the
    /// environment Slurm gives `EpilogSlurmctld`.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// The longest the whole command may take; then it gives up (and exits 0).
    #[arg(long, default_value = "120s", value_parser = parse_duration, value_name = "DURATION")]
    pub wait: Duration,
    /// How long after the job's end its last samples take to be accounted.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub settle: Duration,
    #[command(flatten)]
    pub source: SourceArgs,
}

/// `slurm-backfill` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct BackfillArgs {
    /// Jobs that ended at or after this time (RFC 3339, Unix ms, `now-1d`).
    #[arg(long, value_name = "TIME")]
    pub from: String,
    /// … and before this time. Default: now.
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
    /// Also jobs that already have a summary (rewritten with today's figures).
    #[arg(long)]
    pub redo: bool,
    #[command(flatten)]
    pub source: SourceArgs,
}

/// Why a job's summary could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error("{0}")]
    Args(String),
    #[error("{what}: {why}")]
    Command { what: String, why: String },
    #[error("the collector: {0}")]
    Source(String),
    #[error("job {job}: {why}")]
    Refused { job: String, why: String },
}

/// One job as `sacct -X -P` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SacctJob {
    /// As sacct writes it: `123`, `123_4`, `123+1`.
    pub id: String,
    /// The raw id (`JobIDRaw`).
    pub raw: String,
    pub state: String,
    /// Unix seconds; `None` while unknown.
    pub start_s: Option<i64>,
    pub end_s: Option<i64>,
    pub admin_comment: String,
}

/// The fields asked of sacct, in order; `AdminComment` last, as it may hold the separator.
const SACCT_FIELDS: &str = "JobID,JobIDRaw,State,Start,End,AdminComment";

/// Parses `sacct -n -P -o` [`SACCT_FIELDS`] run with `SLURM_TIME_FORMAT=%s`.
pub fn parse_sacct(text: &str) -> Vec<SacctJob> {
    let seconds = |s: &str| s.trim().parse::<i64>().ok().filter(|t| *t > 0);
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(6, '|');
            let (id, raw, state, start, end) =
                (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
            let admin_comment = f.next()?;
            (!id.is_empty()).then(|| SacctJob {
                id: id.to_owned(),
                raw: raw.to_owned(),
                state: state.to_owned(),
                start_s: seconds(start),
                end_s: seconds(end),
                admin_comment: admin_comment.to_owned(),
            })
        })
        .collect()
}

/// The summary written into `AdminComment`: lower-case keys, numbers only.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// [`SUMMARY_VERSION`].
    pub v: u32,
    /// GPU energy charged to the job (active plus its idle share), J.
    pub energy_j: f64,
    /// Of which active, J.
    pub active_j: f64,
    /// Of which idle (the GPUs it held while they did no work), J.
    pub idle_j: f64,
    /// CO2 of that energy, g; absent when no intensity priced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub co2_g: Option<f64>,
    /// GPU time held, GPU-hours.
    pub gpu_h: f64,
    /// GPUs and nodes it used.
    pub gpus: usize,
    pub nodes: usize,
    /// Its average share of its GPUs (0..1), the share its energy was split by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_share: Option<f64>,
    /// Of `energy_j`, the part in minutes still open when written (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisional_j: Option<f64>,
    /// Written at the deadline before the job's GPUs were accounted past its end: some of
    /// its energy may be missing (`slurm-backfill --redo` rewrites it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

/// Rounds to `digits` decimals, so the JSON stays short.
fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

impl Summary {
    /// The summary of a job's report; `None` when it holds no energy.
    pub fn of(report: &Report) -> Option<Summary> {
        let energy = report.energy.energy_j?;
        let idle = report.energy.idle_j.unwrap_or(0.0);
        Some(Summary {
            v: SUMMARY_VERSION,
            energy_j: round(energy, 3),
            active_j: round((energy - idle).max(0.0), 3),
            idle_j: round(idle, 3),
            co2_g: report.carbon.carbon_g.map(|g| round(g, 4)),
            gpu_h: round(report.gpu_seconds.unwrap_or(0.0) / 3600.0, 6),
            gpus: report.gpus.len(),
            nodes: report.subject.nodes.len(),
            sm_share: report.avg_share.map(|s| round(s, 4)),
            provisional_j: report
                .energy
                .provisional_j
                .filter(|p| *p > 0.0)
                .map(|p| round(p, 3)),
            partial: false,
        })
    }

    /// `{"gpufleet":{…}}`, as written.
    pub fn segment(&self) -> String {
        let inner = serde_json::to_string(self).unwrap_or_default();
        format!("{{\"gpufleet\":{inner}}}")
    }
}

/// Where our segment is in an `AdminComment` (with `"` or, as Slurm 22.05 stores it,
/// `` ` `` for quotes): its byte range, from `{` to the matching `}`.
pub fn find_segment(text: &str) -> Option<std::ops::Range<usize>> {
    let start = ["{\"gpufleet\":", "{`gpufleet`:"]
        .iter()
        .filter_map(|head| text.find(head))
        .min()?;
    let mut depth = 0usize;
    for (i, b) in text.bytes().enumerate().skip(start) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(start..i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// Our summary in an `AdminComment`, as sacct shows it; `None` when there is none.
pub fn read_summary(text: &str) -> Option<Summary> {
    let segment = &text[find_segment(text)?];
    let json: serde_json::Value = serde_json::from_str(&segment.replace('`', "\"")).ok()?;
    serde_json::from_value(json.get("gpufleet")?.clone()).ok()
}

/// The `AdminComment` to write: `existing` with our earlier segment taken out and
/// `segment` after it. Refused when the rest (another tool's text) holds characters
/// `sacctmgr` would alter (upper case, quotes, newlines), or when the whole would be
/// over [`MAX_ADMIN_COMMENT_BYTES`].
pub fn merge_admin_comment(existing: &str, segment: &str) -> Result<String, String> {
    let others = match find_segment(existing) {
        Some(r) => format!("{}{}", existing[..r.start].trim_end(), &existing[r.end..]),
        None => existing.to_owned(),
    };
    let others = others.trim();
    if let Some(c) = others
        .chars()
        .find(|c| c.is_uppercase() || matches!(c, '"' | '\'' | '\n' | '\r'))
    {
        return Err(format!(
            "its AdminComment holds another tool's text with {c:?}, which sacctmgr would alter (it lower-cases the field and rewrites quotes); left alone"
        ));
    }
    let merged = if others.is_empty() {
        segment.to_owned()
    } else {
        format!("{others} {segment}")
    };
    if merged.len() > MAX_ADMIN_COMMENT_BYTES {
        return Err(format!(
            "its AdminComment would be {} bytes, over Slurm's {MAX_ADMIN_COMMENT_BYTES}; left alone",
            merged.len()
        ));
    }
    Ok(merged)
}

/// The job `EpilogSlurmctld`'s environment names, as sacct writes it.
pub fn job_from_env(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let pair = |a: &str, sep: char, b: &str| Some(format!("{}{sep}{}", get(a)?, get(b)?));
    pair("SLURM_ARRAY_JOB_ID", '_', "SLURM_ARRAY_TASK_ID")
        .or_else(|| pair("SLURM_HET_JOB_ID", '+', "SLURM_HET_JOB_OFFSET"))
        .or_else(|| get("SLURM_JOB_ID"))
        .filter(|j| !j.is_empty())
}

/// Runs a Slurm command with a timeout; its stdout.
async fn slurm_command(program: &PathBuf, args: &[String]) -> Result<String, SlurmError> {
    let what = format!("{} {}", program.display(), args.join(" "));
    let failed = |why: String| SlurmError::Command {
        what: what.clone(),
        why,
    };
    let child = tokio::process::Command::new(program)
        .args(args)
        .env("SLURM_TIME_FORMAT", "%s")
        // Times given to sacct (`-S`, `-E`) are read in this zone.
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    let out = tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| failed(format!("no answer in {}s", COMMAND_TIMEOUT.as_secs())))?
        .map_err(|e| failed(e.to_string()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(failed(format!(
            "{}: {}",
            out.status,
            stderr.trim().chars().take(500).collect::<String>()
        )));
    }
    Ok(stdout)
}

/// `sacct -X -n -P` with `args`.
async fn sacct(source: &SourceArgs, args: &[&str]) -> Result<Vec<SacctJob>, SlurmError> {
    let mut all: Vec<String> = ["-X", "-n", "-P", "-o", SACCT_FIELDS]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    all.extend(args.iter().map(|s| (*s).to_owned()));
    Ok(parse_sacct(&slurm_command(&source.sacct, &all).await?))
}

/// One job's row (the exact id, or the raw id).
async fn sacct_job(source: &SourceArgs, job: &str) -> Result<Option<SacctJob>, SlurmError> {
    Ok(sacct(source, &["-j", job])
        .await?
        .into_iter()
        .find(|j| j.id == job || j.raw == job))
}

/// Where reports come from.
enum Reports {
    Api {
        client: reqwest::Client,
        base: String,
        token: Option<String>,
    },
    Db(std::sync::Arc<dyn Store>),
}

impl Reports {
    async fn open(source: &SourceArgs) -> Result<Reports, SlurmError> {
        match (&source.api, &source.db) {
            (Some(api), None) => {
                let token = match &source.token_file {
                    Some(f) => Some(
                        std::fs::read_to_string(f)
                            .map_err(|e| {
                                SlurmError::Args(format!("--token-file {}: {e}", f.display()))
                            })?
                            .trim()
                            .to_owned(),
                    ),
                    None => None,
                };
                let client = reqwest::Client::builder()
                    .timeout(source.request_timeout)
                    .connect_timeout(source.request_timeout)
                    .build()
                    .map_err(|e| SlurmError::Source(e.to_string()))?;
                Ok(Reports::Api {
                    client,
                    base: api.trim_end_matches('/').to_owned(),
                    token,
                })
            }
            (None, Some(db)) => Ok(Reports::Db(
                store::open(db)
                    .await
                    .map_err(|e| SlurmError::Source(e.to_string()))?,
            )),
            _ => Err(SlurmError::Args("give one of --api or --db".into())),
        }
    }

    /// The job's report over `range`; `None` when the collector has no energy for it.
    ///
    /// Asked by its workload key, `slurm:<raw id>` (the id its cgroup gives the agent):
    /// exactly this job, whether or not the agent learned its array task or heterogeneous
    /// component (names arrive after the first samples, and a short job may end first).
    async fn report(&self, job: &SacctJob, range: TimeRange) -> Result<Option<Report>, SlurmError> {
        let key = format!("slurm:{}", job.raw);
        match self {
            Reports::Api {
                client,
                base,
                token,
            } => {
                let mut req = client.get(format!("{base}/api/v1/report")).query(&[
                    ("container", key),
                    ("from", range.from_ms.to_string()),
                    ("to", range.to_ms.to_string()),
                    ("format", "json".to_owned()),
                ]);
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                let resp = req
                    .send()
                    .await
                    .map_err(|e| SlurmError::Source(e.to_string()))?;
                match resp.status() {
                    s if s.is_success() => resp
                        .json::<Report>()
                        .await
                        .map(Some)
                        .map_err(|e| SlurmError::Source(format!("the report: {e}"))),
                    reqwest::StatusCode::NOT_FOUND => Ok(None),
                    s => Err(SlurmError::Source(format!(
                        "{s}: {}",
                        resp.text()
                            .await
                            .unwrap_or_default()
                            .chars()
                            .take(300)
                            .collect::<String>()
                    ))),
                }
            }
            Reports::Db(store) => {
                match build(store.as_ref(), &ReportSubject::Container(key), range).await {
                    Ok(r) => Ok(Some(r)),
                    Err(crate::accounting::report::ReportError::NotFound(_)) => Ok(None),
                    Err(e) => Err(SlurmError::Source(e.to_string())),
                }
            }
        }
    }

    async fn close(self) {
        if let Reports::Db(store) = self {
            store.close().await;
        }
    }
}

/// The range a job's report covers: from the minute before it started to two minutes
/// after it ended (its minutes, whatever the clocks' skew).
fn job_range(job: &SacctJob, now: UnixMs) -> TimeRange {
    let start = job.start_s.map_or(now, |s| s * 1000);
    let end = job.end_s.map_or(now, |s| s * 1000);
    TimeRange {
        from_ms: gpufleet_core::times::minute_of(start) - gpufleet_core::times::MINUTE_MS,
        to_ms: end + 2 * gpufleet_core::times::MINUTE_MS,
    }
}

/// What became of one job.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its summary was written.
    Written(Summary),
    /// The collector has no GPU energy for it: nothing written.
    NoEnergy,
    /// It already had a summary (backfill without `--redo`).
    Skipped,
}

impl Outcome {
    /// One line for the log.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Written(s) => format!("written: {}", s.segment()),
            Outcome::NoEnergy => "no GPU energy for this job; nothing written".to_owned(),
            Outcome::Skipped => "already has a summary; skipped (--redo rewrites)".to_owned(),
        }
    }
}

/// Writes `summary` into the job's `AdminComment`, keeping what other tools put there,
/// and checks it reads back.
async fn write_summary(
    source: &SourceArgs,
    job: &SacctJob,
    summary: &Summary,
) -> Result<(), SlurmError> {
    let merged = merge_admin_comment(&job.admin_comment, &summary.segment()).map_err(|why| {
        SlurmError::Refused {
            job: job.id.clone(),
            why,
        }
    })?;
    let args = [
        "-i".to_owned(),
        "update".to_owned(),
        "job".to_owned(),
        "where".to_owned(),
        format!("jobid={}", job.id),
        "set".to_owned(),
        format!("AdminComment={merged}"),
    ];
    slurm_command(&source.sacctmgr, &args).await?;
    let back = sacct_job(source, &job.id).await?;
    match back.as_ref().and_then(|j| read_summary(&j.admin_comment)) {
        Some(s) if s == *summary => Ok(()),
        _ => Err(SlurmError::Refused {
            job: job.id.clone(),
            why: format!(
                "sacct does not show what was written (it shows {:?})",
                back.map(|j| j.admin_comment).unwrap_or_default()
            ),
        }),
    }
}

/// Accounts one ended job without waiting: its report now, written if it has energy.
async fn account_now(
    source: &SourceArgs,
    reports: &Reports,
    job: &SacctJob,
) -> Result<Outcome, SlurmError> {
    let Some(report) = reports.report(job, job_range(job, now_ms())).await? else {
        return Ok(Outcome::NoEnergy);
    };
    let Some(summary) = Summary::of(&report) else {
        return Ok(Outcome::NoEnergy);
    };
    write_summary(source, job, &summary).await?;
    Ok(Outcome::Written(summary))
}

/// `slurm-epilog`: waits (bounded) for the job's energy, then writes its summary.
pub async fn run_epilog(args: &EpilogArgs) -> Result<Outcome, SlurmError> {
    let started = tokio::time::Instant::now();
    let deadline = started + args.wait;
    let job_id = match &args.job {
        Some(j) => j.clone(),
        None => job_from_env(|k| std::env::var(k).ok()).ok_or_else(|| {
            SlurmError::Args("no --job and no SLURM_JOB_ID in the environment".into())
        })?,
    };
    crate::accounting::report::JobSpec::parse(&job_id)
        .map_err(|e| SlurmError::Args(e.to_string()))?;
    let reports = Reports::open(&args.source).await?;
    let outcome = epilog_loop(args, &reports, &job_id, deadline).await;
    reports.close().await;
    outcome
}

async fn epilog_loop(
    args: &EpilogArgs,
    reports: &Reports,
    job_id: &str,
    deadline: tokio::time::Instant,
) -> Result<Outcome, SlurmError> {
    let past_deadline = || tokio::time::Instant::now() >= deadline;
    // The job's accounting record, with its end once slurmdbd has it.
    let mut job = loop {
        match sacct_job(&args.source, job_id).await {
            Ok(Some(j)) if j.end_s.is_some() || past_deadline() => break j,
            Ok(None) if past_deadline() => {
                return Err(SlurmError::Args(format!(
                    "job {job_id}: not in Slurm's accounting"
                )));
            }
            Err(e) if past_deadline() => return Err(e),
            Err(e) => warn!(job = job_id, error = %e, "sacct failed; trying again"),
            _ => {}
        }
        tokio::time::sleep(RETRY).await;
    };
    // Its last samples reach the collector and are accounted within `settle`.
    let end_ms = job.end_s.map_or_else(now_ms, |s| s * 1000);
    let settled_at = end_ms + args.settle.as_millis() as i64;
    let wait = Duration::from_millis(settled_at.saturating_sub(now_ms()).max(0) as u64);
    tokio::time::sleep_until((tokio::time::Instant::now() + wait).min(deadline)).await;
    let mut last: Option<Summary> = None;
    let mut last_error: Option<SlurmError> = None;
    let mut final_since: Option<tokio::time::Instant> = None;
    let mut is_final = false;
    loop {
        match reports.report(&job, job_range(&job, now_ms())).await {
            Ok(Some(report)) => {
                let summary = Summary::of(&report);
                // Final: every minute up to the job's end is accounted on its GPUs.
                is_final = summary.as_ref().is_some_and(|s| s.provisional_j.is_none())
                    && report.accounted_to_ms.is_some_and(|t| t >= end_ms);
                let priced = report.carbon.priced_share.is_some_and(|p| p >= 0.999_999);
                last = summary;
                if last.is_none() {
                    final_since = None;
                } else if is_final {
                    let since = *final_since.get_or_insert_with(tokio::time::Instant::now);
                    if priced || since.elapsed() >= CARBON_WAIT {
                        break;
                    }
                }
            }
            Ok(None) => last = None,
            Err(e) => {
                warn!(job = job_id, error = %e, "the collector did not answer; trying again");
                last_error = Some(e);
            }
        }
        if past_deadline() {
            break;
        }
        tokio::time::sleep(
            RETRY.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
        )
        .await;
    }
    let Some(mut summary) = last else {
        return match last_error {
            Some(e) => Err(e),
            None => Ok(Outcome::NoEnergy),
        };
    };
    summary.partial = !is_final;
    // The current AdminComment, as close to the write as can be.
    if let Ok(Some(now)) = sacct_job(&args.source, &job.id).await {
        job.admin_comment = now.admin_comment;
    }
    write_summary(&args.source, &job, &summary).await?;
    Ok(Outcome::Written(summary))
}

/// `slurm-backfill`: every job that ended in the range; `(job, outcome)` per job, in
/// sacct's order. A job that fails is logged and counted, the others go on.
pub async fn run_backfill(
    args: &BackfillArgs,
) -> Result<Vec<(String, Result<Outcome, SlurmError>)>, SlurmError> {
    let now = now_ms();
    let time = |t: &str| parse_time(t, now).map_err(|e| SlurmError::Args(e.to_string()));
    let from = time(&args.from)?;
    let to = match &args.to {
        Some(t) => time(t)?,
        None => now,
    };
    // `YYYY-MM-DDTHH:MM:SS`, UTC (sacct runs with TZ=UTC).
    let secs = |ms: UnixMs| {
        gpufleet_core::config::format_time(ms)
            .chars()
            .take(19)
            .collect::<String>()
    };
    // Every user's jobs that ended in the range (`-s` the end states, `-E` their end).
    let jobs = sacct(
        &args.source,
        &[
            "-a",
            "-S",
            &secs(from),
            "-E",
            &secs(to),
            "-s",
            "CD,F,TO,CA,NF,OOM,PR,DL,BF",
        ],
    )
    .await?;
    let reports = Reports::open(&args.source).await?;
    let mut out = Vec::new();
    for job in jobs {
        let ended_in_range = job.end_s.is_some_and(|e| e * 1000 >= from && e * 1000 < to);
        if !ended_in_range {
            continue;
        }
        let outcome = if !args.redo && read_summary(&job.admin_comment).is_some() {
            Ok(Outcome::Skipped)
        } else {
            account_now(&args.source, &reports, &job).await
        };
        match &outcome {
            Ok(o) => info!(job = %job.id, outcome = ?o, "backfill"),
            Err(e) => error!(job = %job.id, error = %e, "backfill: not written"),
        }
        out.push((job.id.clone(), outcome));
    }
    reports.close().await;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        Summary {
            v: 1,
            energy_j: 1234.5,
            active_j: 1000.25,
            idle_j: 234.25,
            co2_g: Some(0.0857),
            gpu_h: 0.5,
            gpus: 2,
            nodes: 1,
            sm_share: Some(0.75),
            provisional_j: None,
            partial: false,
        }
    }

    #[test]
    fn the_segment_is_lower_case_json_with_numbers_only() {
        let s = summary().segment();
        assert_eq!(s, s.to_lowercase());
        assert!(s.starts_with("{\"gpufleet\":{\"v\":1,"), "{s}");
        assert!(s.len() < 300, "{}", s.len());
        let v: serde_json::Value = serde_json::from_str(&s).expect("JSON");
        for (_, x) in v["gpufleet"].as_object().expect("object") {
            assert!(x.is_number(), "{x}");
        }
    }

    #[test]
    fn a_summary_reads_back_as_written_and_as_slurm_2205_stores_it() {
        let s = summary();
        let written = s.segment();
        assert_eq!(read_summary(&written), Some(s.clone()));
        // sacctmgr (22.05) stores quotes as backticks.
        let stored = format!("js1:abcd {}", written.replace('"', "`"));
        assert_eq!(read_summary(&stored), Some(s));
        assert_eq!(read_summary("js1:abcd"), None);
        assert_eq!(read_summary("{`gpufleet`:{`v`:1"), None, "cut short");
    }

    #[test]
    fn merging_keeps_other_tools_text_and_replaces_our_earlier_summary() {
        let ours = summary().segment();
        assert_eq!(merge_admin_comment("", &ours).as_deref(), Ok(ours.as_str()));
        assert_eq!(
            merge_admin_comment("js1:h4siaaa=", &ours),
            Ok(format!("js1:h4siaaa= {ours}"))
        );
        // Our older summary (as stored by 22.05) is replaced, the other text stays.
        let old = "js1:h4siaaa= {`gpufleet`:{`v`:1,`energy_j`:5}} tail";
        assert_eq!(
            merge_admin_comment(old, &ours),
            Ok(format!("js1:h4siaaa= tail {ours}"))
        );
        // Idempotent: merging again changes nothing.
        let once = merge_admin_comment("x", &ours).expect("merged");
        assert_eq!(merge_admin_comment(&once, &ours), Ok(once));
    }

    #[test]
    fn text_sacctmgr_would_alter_and_oversized_fields_are_refused() {
        let ours = summary().segment();
        for other in ["JS1:H4sIAAA=", "note \"quoted\"", "it's", "a\nb"] {
            assert!(merge_admin_comment(other, &ours).is_err(), "{other:?}");
        }
        let big = "x".repeat(MAX_ADMIN_COMMENT_BYTES);
        assert!(merge_admin_comment(&big, &ours).is_err());
    }

    #[test]
    fn sacct_lines_parse_with_an_admin_comment_holding_the_separator() {
        let text = "7|7|COMPLETED|1764400000|1764400060|\n\
                    2_3|5|COMPLETED|1764400001|Unknown|a|b\n\
                    3+1|4|PENDING|Unknown|Unknown|\n";
        let jobs = parse_sacct(text);
        assert_eq!(jobs.len(), 3);
        assert_eq!(jobs[0].end_s, Some(1_764_400_060));
        assert_eq!(
            (jobs[1].id.as_str(), jobs[1].raw.as_str(), jobs[1].end_s),
            ("2_3", "5", None)
        );
        assert_eq!(jobs[1].admin_comment, "a|b");
        assert_eq!(jobs[2].start_s, None);
    }

    #[test]
    fn the_epilogs_environment_names_array_tasks_and_het_components_as_sacct_does() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            job_from_env(env(&[("SLURM_JOB_ID", "7")])),
            Some("7".into())
        );
        assert_eq!(
            job_from_env(env(&[
                ("SLURM_JOB_ID", "5"),
                ("SLURM_ARRAY_JOB_ID", "2"),
                ("SLURM_ARRAY_TASK_ID", "3")
            ])),
            Some("2_3".into())
        );
        assert_eq!(
            job_from_env(env(&[
                ("SLURM_JOB_ID", "4"),
                ("SLURM_HET_JOB_ID", "3"),
                ("SLURM_HET_JOB_OFFSET", "1")
            ])),
            Some("3+1".into())
        );
        assert_eq!(job_from_env(env(&[])), None);
    }
}
