//! Scenario files (`--sim-scenario FILE`, TOML): what a simulated node runs. Every key is
//! optional; unknown keys are an error.
//!
//! ```toml
//! model = "h100-sxm"            # h100-sxm, a100-sxm4-40gb, l40s, rtx-a6000; default: from the seed
//! random_workloads = true       # free GPUs get workloads drawn from `mix`
//! mean_gap = "5m"               # mean pause before a free GPU gets its next workload
//! training_duration = ["15m", "90m"]
//! inference_duration = ["20m", "3h"]
//! notebook_duration = ["10m", "2h"]
//! xid_per_gpu_hour = 0.2
//! thermal_events_per_gpu_hour = 0.05
//! ambient_c = 27.0
//!
//! [mix]                         # relative weights of what a free GPU gets next
//! training = 4.0
//! inference = 3.0
//! notebook = 1.0
//! empty = 3.0
//!
//! [[jobs]]                      # scripted workloads, relative to the first sample
//! kind = "training"             # training, inference, notebook
//! gpus = [0, 1, 2, 3]
//! start = "0s"
//! duration = "30m"
//! identity = "kubernetes"       # kubernetes, docker, slurm, host; default: drawn
//! ```

use super::catalog;
use serde::{Deserialize, Deserializer};
use std::path::Path;
use std::time::Duration;
use thiserror::Error;

/// A simulated node's workload settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// GPU model of every GPU on the node; drawn from the seed when absent.
    pub model: Option<String>,
    /// Whether free GPUs get workloads drawn at random (scripted `jobs` run either way).
    pub random_workloads: bool,
    /// Relative weights of what a free GPU gets next.
    pub mix: Mix,
    /// Mean pause before a free GPU gets its next workload.
    #[serde(deserialize_with = "duration")]
    pub mean_gap: Duration,
    /// Length range of training jobs.
    #[serde(deserialize_with = "duration_range")]
    pub training_duration: [Duration; 2],
    /// Length range of inference pods.
    #[serde(deserialize_with = "duration_range")]
    pub inference_duration: [Duration; 2],
    /// Length range of notebooks (memory held, GPU mostly idle).
    #[serde(deserialize_with = "duration_range")]
    pub notebook_duration: [Duration; 2],
    /// Rate of Xid errors per GPU.
    pub xid_per_gpu_hour: f64,
    /// Rate of cooling faults (hot inlet for a few minutes: thermal throttling) per GPU.
    pub thermal_events_per_gpu_hour: f64,
    /// Inlet air temperature.
    pub ambient_c: f64,
    /// Scripted workloads.
    pub jobs: Vec<ScriptedJob>,
}

/// Relative weights of the workloads a free GPU gets.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mix {
    /// Multi-GPU (or single-GPU) training: high steady load, NVLink traffic.
    pub training: f64,
    /// An inference pod; up to three share a GPU. Bursty.
    pub inference: f64,
    /// A notebook holding memory on an otherwise idle GPU: the waste operators hunt.
    pub notebook: f64,
    /// Nothing: the GPU stays free until the next decision.
    pub empty: f64,
}

/// What a workload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// See [`Mix::training`].
    Training,
    /// See [`Mix::inference`].
    Inference,
    /// See [`Mix::notebook`].
    Notebook,
}

/// Who runs a workload, which decides its [`Workload`](gpufleet_core::Workload) identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityKind {
    /// A pod (containerd), with namespace, pod name and QoS class.
    Kubernetes,
    /// A plain Docker container.
    Docker,
    /// A Slurm job step.
    Slurm,
    /// A user's login session on the host.
    Host,
}

/// A workload placed by the scenario author.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedJob {
    /// What runs.
    pub kind: JobKind,
    /// GPU indexes it runs on (one process per GPU).
    pub gpus: Vec<u32>,
    /// When it starts, after the first sample.
    #[serde(default, deserialize_with = "duration")]
    pub start: Duration,
    /// How long it runs.
    #[serde(deserialize_with = "duration")]
    pub duration: Duration,
    /// Who runs it; drawn from the seed when absent.
    #[serde(default)]
    pub identity: Option<IdentityKind>,
}

impl Default for Scenario {
    fn default() -> Self {
        let min = |m: u64| Duration::from_secs(m * 60);
        Self {
            model: None,
            random_workloads: true,
            mix: Mix::default(),
            mean_gap: min(5),
            training_duration: [min(15), min(90)],
            inference_duration: [min(20), min(180)],
            notebook_duration: [min(10), min(120)],
            xid_per_gpu_hour: 0.2,
            thermal_events_per_gpu_hour: 0.05,
            ambient_c: 27.0,
            jobs: Vec::new(),
        }
    }
}

impl Default for Mix {
    fn default() -> Self {
        Self {
            training: 4.0,
            inference: 3.0,
            notebook: 1.0,
            empty: 3.0,
        }
    }
}

/// Why a scenario was refused.
#[derive(Debug, Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys.
    #[error("scenario {origin} is invalid: {message}")]
    Parse {
        /// The file, or "text".
        origin: String,
        /// What TOML/serde said.
        message: String,
    },
    /// The values are inconsistent.
    #[error("scenario: {0}")]
    Invalid(String),
}

impl Scenario {
    /// Reads and parses a scenario file.
    pub fn from_file(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses scenario TOML; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ScenarioError> {
        toml::from_str(text).map_err(|e| ScenarioError::Parse {
            origin: origin.to_owned(),
            message: e.to_string(),
        })
    }

    /// Checks the values against a node with `gpus` GPUs.
    pub fn validate(&self, gpus: u32) -> Result<(), ScenarioError> {
        let bad = |m: String| Err(ScenarioError::Invalid(m));
        if let Some(model) = &self.model
            && catalog::by_key(model).is_none()
        {
            return bad(format!(
                "unknown model {model:?}; known: {}",
                catalog::keys()
            ));
        }
        let m = self.mix;
        let weights = [m.training, m.inference, m.notebook, m.empty];
        if weights.iter().any(|w| !w.is_finite() || *w < 0.0) || weights.iter().sum::<f64>() <= 0.0
        {
            return bad("mix weights must be non-negative and not all zero".into());
        }
        for (name, [lo, hi]) in [
            ("training_duration", self.training_duration),
            ("inference_duration", self.inference_duration),
            ("notebook_duration", self.notebook_duration),
        ] {
            if lo.is_zero() || lo > hi {
                return bad(format!("{name} must be [min, max] with 0 < min <= max"));
            }
        }
        if self.mean_gap.is_zero() {
            return bad("mean_gap must be positive".into());
        }
        for (name, v) in [
            ("xid_per_gpu_hour", self.xid_per_gpu_hour),
            (
                "thermal_events_per_gpu_hour",
                self.thermal_events_per_gpu_hour,
            ),
        ] {
            if !v.is_finite() || !(0.0..=3600.0).contains(&v) {
                return bad(format!("{name} must be between 0 and 3600"));
            }
        }
        if !self.ambient_c.is_finite() || !(-10.0..=60.0).contains(&self.ambient_c) {
            return bad("ambient_c must be between -10 and 60".into());
        }
        for (i, job) in self.jobs.iter().enumerate() {
            if job.gpus.is_empty() {
                return bad(format!("jobs[{i}] has no gpus"));
            }
            if let Some(g) = job.gpus.iter().find(|g| **g >= gpus) {
                return bad(format!(
                    "jobs[{i}] uses gpu {g}, but the node has {gpus} GPUs"
                ));
            }
            let mut sorted = job.gpus.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if sorted.len() != job.gpus.len() {
                return bad(format!("jobs[{i}] lists a gpu twice"));
            }
            if job.duration.is_zero() {
                return bad(format!("jobs[{i}] has a zero duration"));
            }
        }
        Ok(())
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    gpufleet_core::config::parse_duration(&s).map_err(serde::de::Error::custom)
}

fn duration_range<'de, D: Deserializer<'de>>(d: D) -> Result<[Duration; 2], D::Error> {
    let [lo, hi] = <[String; 2]>::deserialize(d)?;
    let p = |s: &str| gpufleet_core::config::parse_duration(s).map_err(serde::de::Error::custom);
    Ok([p(&lo)?, p(&hi)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_parses_and_validates() {
        let s = Scenario::parse(
            r#"
model = "a100-sxm4-40gb"
random_workloads = false
mean_gap = "90s"
training_duration = ["5m", "10m"]
xid_per_gpu_hour = 0
[mix]
training = 1.0
empty = 0.0
[[jobs]]
kind = "training"
gpus = [0, 1]
duration = "10m"
identity = "slurm"
[[jobs]]
kind = "inference"
gpus = [2]
start = "1m"
duration = "1h"
"#,
            "test",
        )
        .expect("parses");
        assert_eq!(s.model.as_deref(), Some("a100-sxm4-40gb"));
        assert!(!s.random_workloads);
        assert_eq!(s.mean_gap, Duration::from_secs(90));
        assert_eq!(s.mix.inference, 3.0, "unset keys keep their defaults");
        assert_eq!(s.jobs[0].identity, Some(IdentityKind::Slurm));
        assert_eq!(s.jobs[1].start, Duration::from_secs(60));
        s.validate(4).expect("valid for 4 GPUs");
        let err = s.validate(2).expect_err("gpu 2 on a 2-GPU node");
        assert!(err.to_string().contains("uses gpu 2"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let err = Scenario::parse("modle = \"h100-sxm\"\n", "f.toml").expect_err("typo");
        assert!(err.to_string().contains("modle"), "{err}");
        let err = Scenario::parse("[mix]\ntraning = 1.0\n", "f.toml").expect_err("typo");
        assert!(err.to_string().contains("traning"), "{err}");
        let err = Scenario::parse("mean_gap = \"soon\"\n", "f.toml").expect_err("bad duration");
        assert!(err.to_string().contains("soon"), "{err}");
        let s = Scenario::parse("model = \"h200\"\n", "f.toml").expect("parses");
        assert!(
            s.validate(8)
                .expect_err("unknown")
                .to_string()
                .contains("h100-sxm")
        );
        let s = Scenario::parse(
            "[mix]\ntraining = 0.0\ninference = 0.0\nnotebook = 0.0\nempty = 0.0\n",
            "t",
        )
        .expect("parses");
        assert!(s.validate(8).is_err());
    }
}
