//! Alert rules and webhooks as configured: the config file's `[alerts]` table, checked
//! once at start-up ([`AlertsFile::resolve`]) into [`AlertSettings`], with the default
//! rules ([`default_rules`]) merged in by name.
//!
//! ```toml
//! [alerts]
//! evaluation_interval = "15s"   # how often rules are evaluated (default 15s)
//! resend_delay = "1m"           # firing alerts are sent again this often (default 1m)
//! external_url = "https://gpufleet.example.org"  # generatorURL's base (default: the HTTP address)
//!
//! [[alerts.rules]]
//! name = "GpuHot"
//! condition = "gpu_temp_c > 85"  # SIGNAL OP NUMBER, or a flag signal alone ("gpu_lost")
//! for = "2m"                     # true for this long before it fires (default 0s)
//! keep_firing_for = "1m"         # keeps firing this long after it stops being true (default 0s)
//! severity = "warning"           # critical | warning | info (default warning)
//! labels = { team = "infra" }
//! annotations = { summary = "{{ $labels.node }} GPU {{ $labels.gpu_index }} at {{ $value }} °C" }
//!
//! [[alerts.rules]]
//! name = "NodeOffline"           # a default rule's name: replaces it ...
//! enabled = false                # ... or, with enabled = false, turns it off
//!
//! [[alerts.webhooks]]
//! kind = "alertmanager"          # POST {url}/api/v2/alerts (Alertmanager API v2)
//! url = "http://alertmanager:9093"
//!
//! [[alerts.webhooks]]
//! kind = "json"                  # gpufleet's own JSON (see `notify.rs`), POST url
//! name = "ops-hook"              # in /metrics and logs (default: the URL's host[:port])
//! url = "https://hooks.example.org/gpufleet"
//! bearer_token_file = "/etc/gpufleet/hook-token"   # or bearer_token = "..." (never logged)
//! timeout = "10s"
//! max_attempts = 5
//! ```
//!
//! Templates in annotations: `{{ $labels.NAME }}` (a label of the alert: the signal's,
//! `alertname`, `severity`, the rule's) and `{{ $value }}` (the signal's value). Every
//! error names the rule (or webhook) and the field.

use super::signals::{self, SignalKind};
use gpufleet_core::config::parse_duration;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The config file's `[alerts]` table as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsFile {
    pub evaluation_interval: Option<String>,
    pub resend_delay: Option<String>,
    pub external_url: Option<String>,
    /// Whether the default rules apply (default true); each can also be replaced or
    /// turned off by name.
    pub default_rules: Option<bool>,
    #[serde(default)]
    pub rules: Vec<RuleFile>,
    #[serde(default)]
    pub webhooks: Vec<WebhookFile>,
}

/// One `[[alerts.rules]]` entry as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    pub name: String,
    pub condition: Option<String>,
    #[serde(rename = "for")]
    pub for_: Option<String>,
    pub keep_firing_for: Option<String>,
    pub severity: Option<String>,
    pub enabled: Option<bool>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// One `[[alerts.webhooks]]` entry as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookFile {
    pub kind: String,
    pub name: Option<String>,
    pub url: String,
    pub bearer_token: Option<String>,
    pub bearer_token_file: Option<PathBuf>,
    pub timeout: Option<String>,
    pub max_attempts: Option<u32>,
}

/// A comparison of a rule's condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

impl Op {
    const ALL: [(&'static str, Op); 6] = [
        (">=", Op::Ge),
        ("<=", Op::Le),
        ("==", Op::Eq),
        ("!=", Op::Ne),
        (">", Op::Gt),
        ("<", Op::Lt),
    ];

    pub fn as_str(self) -> &'static str {
        Op::ALL
            .iter()
            .find(|(_, o)| *o == self)
            .map_or("?", |(s, _)| s)
    }

    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Op::Gt => value > threshold,
            Op::Ge => value >= threshold,
            Op::Lt => value < threshold,
            Op::Le => value <= threshold,
            Op::Eq => value == threshold,
            Op::Ne => value != threshold,
        }
    }
}

/// When a rule's series is "true".
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// A numeric signal compared with a threshold.
    Compare {
        signal: &'static str,
        op: Op,
        threshold: f64,
    },
    /// A flag signal that is set.
    Flag { signal: &'static str },
}

impl Condition {
    pub fn signal(&self) -> &'static str {
        match self {
            Condition::Compare { signal, .. } | Condition::Flag { signal } => signal,
        }
    }

    /// Whether a series with `value` meets the condition.
    pub fn holds(&self, value: f64) -> bool {
        match self {
            Condition::Compare { op, threshold, .. } => op.holds(value, *threshold),
            Condition::Flag { .. } => value != 0.0,
        }
    }

    /// The condition as written back (`gpu_temp_c > 85`, `gpu_lost`).
    pub fn text(&self) -> String {
        match self {
            Condition::Compare {
                signal,
                op,
                threshold,
            } => format!("{signal} {} {threshold}", op.as_str()),
            Condition::Flag { signal } => (*signal).to_owned(),
        }
    }

    /// Parses `SIGNAL OP NUMBER` or `FLAG_SIGNAL`.
    pub fn parse(text: &str) -> Result<Condition, String> {
        let text = text.trim();
        if let Some((at, op)) = Op::ALL
            .iter()
            .find_map(|(s, op)| text.find(s).map(|at| ((at, s.len()), *op)))
        {
            let (name, rest) = (text[..at.0].trim(), text[at.0 + at.1..].trim());
            let signal = signals::find(name).ok_or_else(|| unknown_signal(name))?;
            if signal.kind == SignalKind::Flag {
                return Err(format!(
                    "signal {name:?} is a flag: write it alone ({name:?}), without a comparison"
                ));
            }
            let threshold = rest
                .parse::<f64>()
                .ok()
                .filter(|t| t.is_finite())
                .ok_or_else(|| format!("{rest:?} is not a number (write e.g. `{name} > 85`)"))?;
            return Ok(Condition::Compare {
                signal: signal.name,
                op,
                threshold,
            });
        }
        let signal = signals::find(text).ok_or_else(|| unknown_signal(text))?;
        if signal.kind != SignalKind::Flag {
            return Err(format!(
                "signal {text:?} is a number: compare it (write e.g. `{text} > 85`)"
            ));
        }
        Ok(Condition::Flag {
            signal: signal.name,
        })
    }
}

fn unknown_signal(name: &str) -> String {
    let names: Vec<&str> = signals::SIGNALS.iter().map(|s| s.name).collect();
    format!(
        "unknown signal {name:?}; the signals are: {}",
        names.join(", ")
    )
}

/// How urgent an alert is (its `severity` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

impl Severity {
    pub const ALL: [Severity; 3] = [Severity::Info, Severity::Warning, Severity::Critical];

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    fn parse(s: &str) -> Option<Severity> {
        [Severity::Info, Severity::Warning, Severity::Critical]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// A checked rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub name: String,
    pub condition: Condition,
    /// How long the condition holds before the alert fires.
    pub hold: Duration,
    /// How long a firing alert keeps firing after the condition stopped holding.
    pub keep_firing_for: Duration,
    pub severity: Severity,
    /// Added to every alert of the rule (after the signal's labels, `alertname` and
    /// `severity`, which they cannot replace).
    pub labels: BTreeMap<String, String>,
    /// Templates (see the module doc).
    pub annotations: BTreeMap<String, String>,
}

/// A checked webhook.
#[derive(Clone, PartialEq)]
pub struct Webhook {
    pub kind: WebhookKind,
    /// Names it in `/metrics` and in the log: the `name` given, else the URL's host and
    /// port (never its path or query, which may hold a secret).
    pub name: String,
    /// Where alerts are POSTed (for Alertmanager: its `/api/v2/alerts`).
    pub url: String,
    /// Sent as `Authorization: Bearer`; never logged.
    pub bearer_token: Option<String>,
    /// Limit on one request.
    pub timeout: Duration,
    /// Tries of one notification before it is given up (and counted).
    pub max_attempts: u32,
}

// The token never reaches a log.
impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("url", &crate::store::redact_url(&self.url))
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("max_attempts", &self.max_attempts)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookKind {
    /// Alertmanager's API v2: a JSON array of `{labels, annotations, startsAt, endsAt,
    /// generatorURL}`.
    Alertmanager,
    /// gpufleet's own JSON ([`super::notify::JsonPayload`]).
    Json,
}

/// Everything the alerts job needs from the configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertSettings {
    pub evaluation_interval: Duration,
    pub resend_delay: Duration,
    /// Base of each alert's `generatorURL` (`{external_url}/alerts`); `None`: the
    /// collector's HTTP address.
    pub external_url: Option<String>,
    pub rules: Vec<Rule>,
    pub webhooks: Vec<Webhook>,
}

impl Default for AlertSettings {
    fn default() -> Self {
        AlertsFile::default()
            .resolve()
            .unwrap_or_else(|_| AlertSettings {
                evaluation_interval: DEFAULT_EVALUATION_INTERVAL,
                resend_delay: DEFAULT_RESEND_DELAY,
                external_url: None,
                rules: Vec::new(),
                webhooks: Vec::new(),
            })
    }
}

pub const DEFAULT_EVALUATION_INTERVAL: Duration = Duration::from_secs(15);
pub const DEFAULT_RESEND_DELAY: Duration = Duration::from_secs(60);
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// A default rule as shipped: name, condition, `for`, severity, summary, description.
struct DefaultRule {
    name: &'static str,
    condition: &'static str,
    hold: &'static str,
    severity: &'static str,
    summary: &'static str,
    description: &'static str,
}

/// The rules that apply unless turned off (`default_rules = false`, or one by name with
/// `enabled = false`) or replaced by a rule of the same name. README lists them.
const DEFAULT_RULES: &[DefaultRule] = &[
    DefaultRule {
        name: "NodeOffline",
        condition: "node_offline",
        hold: "1m",
        severity: "critical",
        summary: "node {{ $labels.node }} is offline",
        description: "No sample from {{ $labels.node }} for longer than the offline threshold: \
            the agent stopped, the node is down, or the network between them is.",
    },
    DefaultRule {
        name: "GpuLost",
        condition: "gpu_lost",
        hold: "0s",
        severity: "critical",
        summary: "GPU {{ $labels.gpu_index }} of {{ $labels.node }} is lost",
        description: "{{ $labels.node }} still reports, but GPU {{ $labels.gpu_index }} \
            ({{ $labels.gpu }}) has no new sample: it fell off the bus or the driver lost it. \
            Drain the node and reset or reseat the GPU.",
    },
    DefaultRule {
        name: "XidCritical",
        condition: "xid_critical",
        hold: "0s",
        severity: "critical",
        summary: "GPU {{ $labels.gpu_index }} of {{ $labels.node }} reported a critical Xid",
        description: "GPU {{ $labels.gpu_index }} ({{ $labels.gpu }}) on {{ $labels.node }} \
            reported an Xid error rated critical: see the GPU's page for what it means and \
            what to do (often: drain the node, reset the GPU or reboot).",
    },
    DefaultRule {
        name: "GpuTemperatureNearSlowdown",
        condition: "gpu_temp_margin_c <= 5",
        hold: "2m",
        severity: "warning",
        summary: "GPU {{ $labels.gpu_index }} of {{ $labels.node }} is {{ $value }} °C from its slowdown temperature",
        description: "GPU {{ $labels.gpu_index }} ({{ $labels.gpu }}) on {{ $labels.node }} runs \
            within 5 °C of the temperature at which it slows its clocks down. Check the \
            cooling (fans, airflow, inlet temperature) and the GPU's load.",
    },
    DefaultRule {
        name: "GpuRowRemapFailed",
        condition: "gpu_row_remap_failed",
        hold: "0s",
        severity: "critical",
        summary: "GPU {{ $labels.gpu_index }} of {{ $labels.node }}: a memory row remap failed",
        description: "GPU {{ $labels.gpu_index }} ({{ $labels.gpu }}) on {{ $labels.node }} could \
            not remap a failing memory row: its memory can no longer be repaired in the field. \
            Drain the node and have the GPU serviced (RMA).",
    },
    DefaultRule {
        name: "GpuIdleButAllocated",
        condition: "gpu_idle_allocated_min >= 30",
        hold: "0s",
        severity: "warning",
        summary: "{{ $labels.workload }} holds GPU {{ $labels.gpu_index }} of {{ $labels.node }} idle for {{ $value }} min",
        description: "{{ $labels.workload }} has held memory on GPU {{ $labels.gpu_index }} \
            ({{ $labels.gpu }}) of {{ $labels.node }} at about 0 % utilization for over 30 \
            minutes: the GPU is allocated but does no work. Ask its owner to release it \
            (/api/v1/waste has the energy and CO2 burned while idle).",
    },
];

/// The default rules, checked.
pub fn default_rules() -> Vec<Rule> {
    DEFAULT_RULES
        .iter()
        .filter_map(|d| {
            let file = RuleFile {
                name: d.name.to_owned(),
                condition: Some(d.condition.to_owned()),
                for_: Some(d.hold.to_owned()),
                severity: Some(d.severity.to_owned()),
                annotations: BTreeMap::from([
                    ("summary".to_owned(), d.summary.to_owned()),
                    ("description".to_owned(), d.description.to_owned()),
                ]),
                ..RuleFile::default()
            };
            // The shipped rules are checked by a test; one that failed would be a bug,
            // left out rather than stopping the collector.
            file.resolve().ok()
        })
        .collect()
}

fn duration(
    what: &str,
    field: &str,
    value: Option<&str>,
    default: Duration,
) -> Result<Duration, String> {
    match value {
        None => Ok(default),
        Some(v) => parse_duration(v).map_err(|e| format!("{what}: `{field}`: {e}")),
    }
}

/// A label or annotation name as Prometheus accepts it: `[a-zA-Z_][a-zA-Z0-9_]*`.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl RuleFile {
    /// The checked rule; errors name the rule and the field.
    pub fn resolve(&self) -> Result<Rule, String> {
        let what = format!("[[alerts.rules]] {:?}", self.name);
        if !valid_name(&self.name) {
            return Err(format!(
                "{what}: `name` must be letters, digits and _ (not starting with a digit), e.g. GpuHot"
            ));
        }
        let condition = self
            .condition
            .as_deref()
            .ok_or_else(|| format!("{what}: `condition` is missing (e.g. \"gpu_temp_c > 85\")"))?;
        let condition =
            Condition::parse(condition).map_err(|e| format!("{what}: `condition`: {e}"))?;
        let severity = match self.severity.as_deref() {
            None => Severity::Warning,
            Some(s) => Severity::parse(s).ok_or_else(|| {
                format!("{what}: `severity` {s:?}: expected critical, warning or info")
            })?,
        };
        for key in self.labels.keys() {
            if !valid_name(key) {
                return Err(format!("{what}: `labels`: {key:?} is not a label name"));
            }
            if matches!(key.as_str(), "alertname" | "severity") {
                return Err(format!(
                    "{what}: `labels`: {key:?} is set by gpufleet (the rule's name, `severity`)"
                ));
            }
        }
        let signal =
            signals::find(condition.signal()).ok_or_else(|| format!("{what}: no signal"))?;
        // A rule label named like one of the signal's would give every series the same
        // label set: the GPUs would collapse into one alert and the others never fire.
        if let Some(key) = self
            .labels
            .keys()
            .find(|k| signal.labels.contains(&k.as_str()))
        {
            return Err(format!(
                "{what}: `labels`: {key:?} is a label of signal `{}` (it tells its series apart)",
                condition.signal()
            ));
        }
        let mut known: Vec<&str> = signal.labels.to_vec();
        known.extend(["alertname", "severity"]);
        known.extend(self.labels.keys().map(String::as_str));
        for (key, template) in &self.annotations {
            if !valid_name(key) {
                return Err(format!("{what}: `annotations`: {key:?} is not a name"));
            }
            check_template(template, &known)
                .map_err(|e| format!("{what}: `annotations.{key}`: {e}"))?;
        }
        Ok(Rule {
            name: self.name.clone(),
            condition,
            hold: duration(&what, "for", self.for_.as_deref(), Duration::ZERO)?,
            keep_firing_for: duration(
                &what,
                "keep_firing_for",
                self.keep_firing_for.as_deref(),
                Duration::ZERO,
            )?,
            severity,
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
        })
    }
}

impl WebhookFile {
    fn resolve(&self, n: usize) -> Result<Webhook, String> {
        let what = format!(
            "[[alerts.webhooks]] #{n} ({})",
            crate::store::redact_url(&self.url)
        );
        let kind = match self.kind.as_str() {
            "alertmanager" => WebhookKind::Alertmanager,
            "json" => WebhookKind::Json,
            other => {
                return Err(format!(
                    "{what}: `kind` {other:?}: expected \"alertmanager\" or \"json\""
                ));
            }
        };
        let parsed = reqwest::Url::parse(&self.url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| format!("{what}: `url` is not an http:// or https:// URL"))?;
        let url = match kind {
            WebhookKind::Alertmanager if !parsed.path().ends_with("/api/v2/alerts") => {
                format!("{}/api/v2/alerts", self.url.trim_end_matches('/'))
            }
            _ => self.url.clone(),
        };
        let bearer_token = match (&self.bearer_token, &self.bearer_token_file) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{what}: give `bearer_token` or `bearer_token_file`, not both"
                ));
            }
            (Some(t), None) => Some(t.trim().to_owned()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("{what}: `bearer_token_file` {}: {e}", path.display()))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        if bearer_token
            .as_deref()
            .is_some_and(|t| t.is_empty() || t.chars().any(|c| c.is_control() || c == ' '))
        {
            return Err(format!(
                "{what}: the bearer token is empty or holds spaces or control characters"
            ));
        }
        let name = match &self.name {
            Some(n) if n.trim().is_empty() || n.len() > 64 || n.chars().any(char::is_control) => {
                return Err(format!(
                    "{what}: `name` must be 1 to 64 characters, without control characters"
                ));
            }
            Some(n) => n.trim().to_owned(),
            None => match (parsed.host_str(), parsed.port()) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                (Some(h), None) => h.to_owned(),
                (None, _) => format!("webhook-{n}"),
            },
        };
        let timeout = duration(&what, "timeout", self.timeout.as_deref(), DEFAULT_TIMEOUT)?;
        if timeout.is_zero() {
            return Err(format!("{what}: `timeout` must be longer than 0s"));
        }
        let max_attempts = self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if max_attempts == 0 {
            return Err(format!("{what}: `max_attempts` must be at least 1"));
        }
        Ok(Webhook {
            kind,
            name,
            url,
            bearer_token,
            timeout,
            max_attempts,
        })
    }
}

/// The longest `evaluation_interval` or `resend_delay` taken: longer ones are surely typos,
/// and Alertmanager's expiry (4 × the longer of the two) must stay representable.
const MAX_PERIOD: Duration = Duration::from_secs(86_400);

impl AlertsFile {
    /// The `[alerts]` table of the config file named on the command line (`--config`) or
    /// by `GPUFLEET_CONFIG`; empty without one.
    pub fn from_config_file(args: &[std::ffi::OsString]) -> Result<AlertsFile, String> {
        match gpufleet_core::config::config_file_section(args, "alerts")
            .map_err(|e| e.to_string())?
        {
            None => Ok(AlertsFile::default()),
            Some(v) => v
                .try_into()
                .map_err(|e| format!("config file, [alerts]: {e}")),
        }
    }

    /// The checked settings: the default rules (unless `default_rules = false`), each
    /// replaced by a configured rule of its name or removed by `enabled = false`, then the
    /// other configured rules.
    pub fn resolve(&self) -> Result<AlertSettings, String> {
        let evaluation_interval = duration(
            "[alerts]",
            "evaluation_interval",
            self.evaluation_interval.as_deref(),
            DEFAULT_EVALUATION_INTERVAL,
        )?;
        if evaluation_interval < Duration::from_millis(100) {
            return Err("[alerts]: `evaluation_interval` must be at least 100ms".into());
        }
        if evaluation_interval > MAX_PERIOD {
            return Err("[alerts]: `evaluation_interval` must be at most 1d".into());
        }
        let resend_delay = duration(
            "[alerts]",
            "resend_delay",
            self.resend_delay.as_deref(),
            DEFAULT_RESEND_DELAY,
        )?;
        if resend_delay.is_zero() {
            return Err("[alerts]: `resend_delay` must be longer than 0s".into());
        }
        if resend_delay > MAX_PERIOD {
            return Err("[alerts]: `resend_delay` must be at most 1d".into());
        }
        if let Some(url) = &self.external_url
            && reqwest::Url::parse(url).is_err()
        {
            return Err(format!("[alerts]: `external_url` {url:?} is not a URL"));
        }
        let mut rules: Vec<Rule> = if self.default_rules.unwrap_or(true) {
            default_rules()
        } else {
            Vec::new()
        };
        let mut seen = std::collections::BTreeSet::new();
        for file in &self.rules {
            if !seen.insert(file.name.as_str()) {
                return Err(format!(
                    "[[alerts.rules]] {:?}: `name` is used twice; each rule needs its own",
                    file.name
                ));
            }
            let enabled = file.enabled.unwrap_or(true);
            let is_default = rules.iter().position(|r| r.name == file.name);
            if !enabled {
                match is_default {
                    Some(i) => {
                        rules.remove(i);
                    }
                    None if DEFAULT_RULES.iter().any(|d| d.name == file.name) => {}
                    None => {
                        return Err(format!(
                            "[[alerts.rules]] {:?}: `enabled = false` names no default rule ({})",
                            file.name,
                            DEFAULT_RULES
                                .iter()
                                .map(|d| d.name)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                }
                continue;
            }
            let rule = file.resolve()?;
            match is_default {
                Some(i) => rules[i] = rule,
                None => rules.push(rule),
            }
        }
        let mut webhooks: Vec<Webhook> = Vec::with_capacity(self.webhooks.len());
        for (i, file) in self.webhooks.iter().enumerate() {
            let mut hook = file.resolve(i + 1)?;
            if webhooks.iter().any(|w| w.name == hook.name) {
                if file.name.is_some() {
                    return Err(format!(
                        "[[alerts.webhooks]] #{}: `name` {:?} is taken by an earlier webhook",
                        i + 1,
                        hook.name
                    ));
                }
                // Two webhooks on one host: the later one is told apart by its place.
                hook.name = format!("{}#{}", hook.name, i + 1);
            }
            webhooks.push(hook);
        }
        Ok(AlertSettings {
            evaluation_interval,
            resend_delay,
            external_url: self.external_url.clone(),
            rules,
            webhooks,
        })
    }
}

/// Checks a template's `{{ ... }}` parts: `$value` or `$labels.NAME` with NAME in `known`.
fn check_template(template: &str, known: &[&str]) -> Result<(), String> {
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or_else(|| "a `{{` without its `}}`".to_owned())?;
        let expr = after[..end].trim();
        if expr != "$value" {
            match expr.strip_prefix("$labels.") {
                Some(name) if known.contains(&name) => {}
                Some(name) => {
                    return Err(format!(
                        "`{{{{ {expr} }}}}`: the alert has no label {name:?} (it has: {})",
                        known.join(", ")
                    ));
                }
                None => {
                    return Err(format!(
                        "`{{{{ {expr} }}}}`: write `{{{{ $value }}}}` or `{{{{ $labels.NAME }}}}`"
                    ));
                }
            }
        }
        rest = &after[end + 2..];
    }
    Ok(())
}

/// Fills a template checked by [`check_template`]: labels missing from `labels` become
/// empty, `$value` is written with at most 2 decimals.
pub fn expand(template: &str, labels: &BTreeMap<String, String>, value: f64) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let expr = after[..end].trim();
        if expr == "$value" {
            out.push_str(&format_value(value));
        } else if let Some(name) = expr.strip_prefix("$labels.") {
            out.push_str(labels.get(name).map_or("", String::as_str));
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A value as annotations show it: an integer as is, else at most 2 decimals.
pub fn format_value(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        let s = format!("{value:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AlertSettings, String> {
        let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        let file: AlertsFile = table
            .get("alerts")
            .cloned()
            .map(|v| v.try_into().map_err(|e: toml::de::Error| e.to_string()))
            .transpose()?
            .unwrap_or_default();
        file.resolve()
    }

    #[test]
    fn a_rule_label_may_not_shadow_a_signal_label() {
        let e = parse(
            "[[alerts.rules]]\nname = \"Hot\"\ncondition = \"gpu_temp_c > 80\"\nlabels = { gpu = \"x\" }\n",
        )
        .expect_err("a rule label named like the signal's is refused");
        assert!(
            e.contains("\"gpu\" is a label of signal `gpu_temp_c`"),
            "{e}"
        );
        parse(
            "[[alerts.rules]]\nname = \"Hot\"\ncondition = \"gpu_temp_c > 80\"\nlabels = { team = \"ml\" }\n",
        )
        .expect("another label is fine");
    }

    #[test]
    fn absurd_periods_are_refused_not_overflowed() {
        // humantime takes this; 4 × it overflowed `Duration` and panicked the alerts task.
        let e = parse("[alerts]\nresend_delay = \"200000000000y\"\n")
            .expect_err("a resend_delay over 1d is refused");
        assert!(e.contains("`resend_delay` must be at most 1d"), "{e}");
        let e = parse("[alerts]\nevaluation_interval = \"2d\"\n")
            .expect_err("an evaluation_interval over 1d is refused");
        assert!(
            e.contains("`evaluation_interval` must be at most 1d"),
            "{e}"
        );
        let s = parse("[alerts]\nresend_delay = \"1d\"\nevaluation_interval = \"1d\"\n")
            .expect("1d is allowed");
        assert_eq!(s.resend_delay, Duration::from_secs(86_400));
    }

    #[test]
    fn default_rules_all_check() {
        assert_eq!(default_rules().len(), DEFAULT_RULES.len());
        let s = parse("").expect("no [alerts] is fine");
        assert_eq!(s.evaluation_interval, Duration::from_secs(15));
        assert_eq!(s.resend_delay, Duration::from_secs(60));
        let names: Vec<&str> = s.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "NodeOffline",
                "GpuLost",
                "XidCritical",
                "GpuTemperatureNearSlowdown",
                "GpuRowRemapFailed",
                "GpuIdleButAllocated"
            ]
        );
    }

    #[test]
    fn rules_parse_and_defaults_are_replaced_or_disabled_by_name() {
        let s = parse(
            r#"
            [alerts]
            evaluation_interval = "1s"
            [[alerts.rules]]
            name = "GpuHot"
            condition = "gpu_temp_c >= 85.5"
            for = "2m"
            keep_firing_for = "30s"
            severity = "critical"
            labels = { team = "infra" }
            annotations = { summary = "{{ $labels.node }}/{{$labels.gpu_index}} at {{ $value }}" }
            [[alerts.rules]]
            name = "NodeOffline"
            enabled = false
            [[alerts.rules]]
            name = "GpuLost"
            condition = "gpu_lost"
            for = "30s"
            [[alerts.webhooks]]
            kind = "alertmanager"
            url = "http://am:9093/"
            bearer_token = "s3cret"
            "#,
        )
        .expect("valid");
        assert_eq!(s.evaluation_interval, Duration::from_secs(1));
        let names: Vec<&str> = s.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "GpuLost",
                "XidCritical",
                "GpuTemperatureNearSlowdown",
                "GpuRowRemapFailed",
                "GpuIdleButAllocated",
                "GpuHot"
            ],
            "NodeOffline off, GpuLost replaced"
        );
        assert_eq!(s.rules[0].hold, Duration::from_secs(30));
        let hot = &s.rules[5];
        assert_eq!(
            hot.condition,
            Condition::Compare {
                signal: "gpu_temp_c",
                op: Op::Ge,
                threshold: 85.5
            }
        );
        assert_eq!(
            (hot.hold, hot.keep_firing_for, hot.severity),
            (
                Duration::from_secs(120),
                Duration::from_secs(30),
                Severity::Critical
            )
        );
        assert_eq!(s.webhooks[0].url, "http://am:9093/api/v2/alerts");
        assert!(
            !format!("{:?}", s.webhooks[0]).contains("s3cret"),
            "token never in Debug"
        );
        let labels = BTreeMap::from([
            ("node".to_owned(), "n1".to_owned()),
            ("gpu_index".to_owned(), "3".to_owned()),
        ]);
        assert_eq!(
            expand(&hot.annotations["summary"], &labels, 86.257),
            "n1/3 at 86.26"
        );
    }

    #[test]
    fn errors_name_the_rule_and_the_field() {
        let cases = [
            (
                "name = \"A\"\ncondition = \"gpu_temp > 1\"",
                "\"A\": `condition`: unknown signal \"gpu_temp\"",
            ),
            (
                "name = \"A\"\ncondition = \"gpu_temp_c > hot\"",
                "\"A\": `condition`: \"hot\" is not a number",
            ),
            (
                "name = \"A\"\ncondition = \"gpu_lost > 0\"",
                "\"A\": `condition`: signal \"gpu_lost\" is a flag",
            ),
            (
                "name = \"A\"\ncondition = \"gpu_temp_c\"",
                "\"A\": `condition`: signal \"gpu_temp_c\" is a number",
            ),
            ("name = \"A\"", "\"A\": `condition` is missing"),
            (
                "name = \"A\"\ncondition = \"gpu_lost\"\nfor = \"soon\"",
                "\"A\": `for`: invalid duration",
            ),
            (
                "name = \"A\"\ncondition = \"gpu_lost\"\nseverity = \"page\"",
                "\"A\": `severity` \"page\"",
            ),
            (
                "name = \"A\"\ncondition = \"node_offline\"\nannotations = { summary = \"{{ $labels.gpu }}\" }",
                "\"A\": `annotations.summary`: `{{ $labels.gpu }}`: the alert has no label \"gpu\"",
            ),
            (
                "name = \"A\"\ncondition = \"node_offline\"\nlabels = { severity = \"x\" }",
                "\"A\": `labels`: \"severity\" is set by gpufleet",
            ),
            (
                "name = \"A b\"\ncondition = \"node_offline\"",
                "\"A b\": `name` must be",
            ),
            (
                "name = \"Nope\"\nenabled = false",
                "\"Nope\": `enabled = false` names no default rule",
            ),
        ];
        for (rule, want) in cases {
            let err = parse(&format!("[[alerts.rules]]\n{rule}")).expect_err(rule);
            assert!(err.contains(want), "{rule}: {err}");
        }
        let err = parse("[[alerts.rules]]\nname = \"A\"\ncondition = \"gpu_lost\"\n[[alerts.rules]]\nname = \"A\"\ncondition = \"gpu_lost\"")
            .expect_err("twice");
        assert!(err.contains("used twice"), "{err}");
        let err =
            parse("[[alerts.webhooks]]\nkind = \"slack\"\nurl = \"http://x\"").expect_err("kind");
        assert!(err.contains("#1 (http://x): `kind` \"slack\""), "{err}");
        let err =
            parse("[[alerts.webhooks]]\nkind = \"json\"\nurl = \"ftp://x\"").expect_err("url");
        assert!(err.contains("`url` is not an http"), "{err}");
        let err = parse("[alerts]\nevaluation_interval = \"0s\"").expect_err("zero");
        assert!(err.contains("`evaluation_interval`"), "{err}");
        let err = parse("[alerts]\nbogus = 1").expect_err("unknown key");
        assert!(err.contains("bogus"), "{err}");
    }
}
