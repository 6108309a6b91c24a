//! Carbon configuration: what the `--carbon-*` and `--pue` flags set ([`CarbonSettings`]),
//! the config file's `[carbon]` table with per-node overrides, and
//! what one node resolves to ([`NodeCarbon`]).
//!
//! ```toml
//! carbon_provider = "uk"          # flags, as top-level keys (or in [serve])
//! carbon_region = "13"            # London
//! carbon_g_per_kwh = 200          # used, marked estimated, when the API is unreachable
//! pue = 1.2
//!
//! [[carbon.nodes]]                # first match wins: exact node names, then selectors
//! node = "gpu-fra-01"
//! provider = "electricitymaps"
//! region = "DE"
//! token_file = "/etc/gpufleet/em-token"
//!
//! [[carbon.nodes]]
//! selector = "site=lab,room=b"    # every label must match (agents' --label K=V)
//! provider = "static"
//! g_per_kwh = 35
//! pue = 1.4
//! ```
//!
//! Without a provider (and without `--carbon-g-per-kwh`) carbon is off: figures are absent
//! (null), never 0. PUE defaults to 1.0 (GPU energy only, no facility overhead).

use crate::csv_series::CsvProvider;
use crate::electricitymaps::{self, ElectricityMapsProvider};
use crate::fixed::StaticProvider;
use crate::http::HttpOptions;
use crate::provider::IntensityProvider;
use crate::slot::{CarbonError, FactorType, ProviderKind};
use crate::uk::{self, UkProvider, UkRegion};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The carbon settings the `--carbon-*` and `--pue` flags give (the binaries' parser, in
/// `gpufleet-cli`, fills them): the defaults for every node.
#[derive(Debug, Clone)]
pub struct CarbonSettings {
    /// Where carbon intensities come from. Default: none (carbon figures absent), or
    /// `static` when --carbon-g-per-kwh is given.
    pub carbon_provider: Option<ProviderKind>,
    /// gCO2/kWh: the figure of the `static` provider, and for the others the value used
    /// (marked estimated) when the provider is unreachable and nothing is known yet.
    pub carbon_g_per_kwh: Option<f64>,
    /// Region: UK region id 1-17 or `national` (uk); zone such as DE (electricitymaps);
    /// a name recorded with the figures (static, csv).
    pub carbon_region: Option<String>,
    /// Base URL of the provider's API (default: the public one).
    pub carbon_url: Option<String>,
    /// File holding the Electricity Maps API token (sent as `auth-token`; never logged).
    pub carbon_token_file: Option<PathBuf>,
    /// CSV series for the `csv` provider: `from,to,g_per_kwh[,kind]`, RFC 3339 or Unix ms.
    pub carbon_csv: Option<PathBuf>,
    /// Emission factors: `direct` (operational) or `lifecycle`. Asked of Electricity Maps
    /// (default lifecycle there); recorded for static and CSV figures (default direct).
    /// The UK API is always direct.
    pub carbon_factor_type: Option<FactorType>,
    /// Power usage effectiveness: facility energy / IT energy. Carbon = GPU energy ×
    /// intensity × PUE. 1.0 counts the GPUs' energy only.
    pub pue: f64,
    /// Limit on one request to the provider.
    pub carbon_timeout: Duration,
    /// Retries of a failed request (unreachable, HTTP 429/5xx), with exponential backoff
    /// from 500ms.
    pub carbon_retries: u32,
}

impl Default for CarbonSettings {
    fn default() -> Self {
        CarbonSettings {
            carbon_provider: None,
            carbon_g_per_kwh: None,
            carbon_region: None,
            carbon_url: None,
            carbon_token_file: None,
            carbon_csv: None,
            carbon_factor_type: None,
            pue: 1.0,
            carbon_timeout: Duration::from_secs(10),
            carbon_retries: 3,
        }
    }
}

/// Parses a gCO2/kWh figure (a number >= 0), as `--carbon-g-per-kwh` takes it.
pub fn parse_g_per_kwh(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|g| g.is_finite() && *g >= 0.0)
        .ok_or_else(|| format!("{s:?} is not a gCO2/kWh figure (a number >= 0)"))
}

/// Parses a PUE (a number from 1.0 to 5.0), as `--pue` takes it.
pub fn parse_pue(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|p| valid_pue(*p))
        .ok_or_else(|| format!("PUE {s:?} must be a number from 1.0 to 5.0"))
}

fn valid_pue(p: f64) -> bool {
    (1.0..=5.0).contains(&p)
}

/// One `[[carbon.nodes]]` entry: settings for the nodes it matches; unset fields fall back
/// to the flags.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeOverride {
    /// Exact node name.
    pub node: Option<String>,
    /// `key=value[,key=value…]`: every label must match.
    pub selector: Option<String>,
    pub provider: Option<ProviderKind>,
    pub g_per_kwh: Option<f64>,
    pub region: Option<String>,
    pub url: Option<String>,
    pub token_file: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub factor_type: Option<FactorType>,
    pub pue: Option<f64>,
}

impl NodeOverride {
    fn selector_matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let Some(sel) = &self.selector else {
            return false;
        };
        sel.split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .all(|term| {
                term.split_once('=')
                    .is_some_and(|(k, v)| labels.get(k.trim()).is_some_and(|l| l == v.trim()))
            })
    }
}

/// The config file's `[carbon]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarbonFile {
    #[serde(default)]
    pub nodes: Vec<NodeOverride>,
}

impl CarbonFile {
    /// The `[carbon]` table of a config file's text (empty without one).
    pub fn from_toml_str(text: &str) -> Result<Self, CarbonError> {
        let mut table: toml::Table = toml::from_str(text)
            .map_err(|e| CarbonError::Config(format!("config file is not valid TOML: {e}")))?;
        match table.remove("carbon") {
            None => Ok(CarbonFile::default()),
            Some(v) => v
                .try_into()
                .map_err(|e| CarbonError::Config(format!("config file, [carbon]: {e}"))),
        }
    }

    /// Reads the `[carbon]` table from the config file named on the command line
    /// (`--config`) or by `GPUFLEET_CONFIG`; empty without one.
    pub fn from_config_file(args: &[std::ffi::OsString]) -> Result<Self, CarbonError> {
        let table = gpufleet_core::config::config_file_section(args, "carbon")
            .map_err(|e| CarbonError::Config(e.to_string()))?;
        match table {
            None => Ok(CarbonFile::default()),
            Some(v) => v
                .try_into()
                .map_err(|e| CarbonError::Config(format!("config file, [carbon]: {e}"))),
        }
    }
}

/// What builds one provider instance; nodes with equal settings share it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSettings {
    pub kind: ProviderKind,
    /// Static figure, or the fallback of the others.
    pub g_per_kwh: Option<f64>,
    pub url: Option<String>,
    pub token_file: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub factor_type: Option<FactorType>,
    pub timeout: Duration,
    pub retries: u32,
}

impl ProviderSettings {
    fn key(&self) -> String {
        format!("{self:?}")
    }

    /// The factor type the provider's figures will have.
    pub fn effective_factor_type(&self) -> FactorType {
        match self.kind {
            ProviderKind::Uk => FactorType::Direct,
            ProviderKind::Electricitymaps => self.factor_type.unwrap_or(FactorType::Lifecycle),
            ProviderKind::Static | ProviderKind::Csv => {
                self.factor_type.unwrap_or(FactorType::Direct)
            }
        }
    }

    /// Builds the provider (reads the token / CSV file).
    pub fn build(&self) -> Result<Arc<dyn IntensityProvider>, CarbonError> {
        let http = |default: &str| HttpOptions {
            timeout: self.timeout,
            retries: self.retries,
            ..HttpOptions::new(self.url.as_deref().unwrap_or(default))
        };
        let factor_type = self.effective_factor_type();
        Ok(match self.kind {
            ProviderKind::Static => {
                let g = self.g_per_kwh.ok_or_else(|| {
                    CarbonError::Config(
                        "the static provider needs --carbon-g-per-kwh (or g_per_kwh)".into(),
                    )
                })?;
                Arc::new(StaticProvider::new(g, factor_type)?)
            }
            ProviderKind::Csv => {
                let path = self.csv.as_ref().ok_or_else(|| {
                    CarbonError::Config("the csv provider needs --carbon-csv FILE (or csv)".into())
                })?;
                Arc::new(CsvProvider::open(path, factor_type)?)
            }
            ProviderKind::Uk => Arc::new(UkProvider::new(http(uk::DEFAULT_BASE_URL))?),
            ProviderKind::Electricitymaps => {
                let path = self.token_file.as_ref().ok_or_else(|| {
                    CarbonError::Config(
                        "the electricitymaps provider needs --carbon-token-file FILE".into(),
                    )
                })?;
                let token = std::fs::read_to_string(path).map_err(|e| {
                    CarbonError::Config(format!(
                        "cannot read the token file {}: {e}",
                        path.display()
                    ))
                })?;
                if token.trim().is_empty() {
                    return Err(CarbonError::Config(format!(
                        "the token file {} is empty",
                        path.display()
                    )));
                }
                Arc::new(ElectricityMapsProvider::new(
                    http(electricitymaps::DEFAULT_BASE_URL),
                    &token,
                    factor_type,
                )?)
            }
        })
    }
}

/// What one node's energy is priced with.
#[derive(Debug, Clone)]
pub struct NodeCarbon {
    pub provider: Arc<dyn IntensityProvider>,
    pub settings: ProviderSettings,
    /// The provider's region / zone (for static and CSV: a name, default `default`).
    pub region: String,
    /// Power usage effectiveness applied to this node's energy.
    pub pue: f64,
}

/// The whole carbon configuration: flags plus per-node overrides. Providers are built
/// once per distinct settings and shared.
#[derive(Debug, Default)]
pub struct CarbonConfig {
    pub settings: CarbonSettings,
    pub file: CarbonFile,
    built: Mutex<HashMap<String, Arc<dyn IntensityProvider>>>,
}

impl CarbonConfig {
    /// Checks the settings (every override names a node or a selector, PUEs in range,
    /// regions valid for their provider) without reading files or the network.
    pub fn new(settings: CarbonSettings, file: CarbonFile) -> Result<Self, CarbonError> {
        for (i, o) in file.nodes.iter().enumerate() {
            if o.node.is_none() == o.selector.is_none() {
                return Err(CarbonError::Config(format!(
                    "[[carbon.nodes]] entry {}: give exactly one of `node` or `selector`",
                    i + 1
                )));
            }
            if let Some(sel) = &o.selector
                && sel.split(',').any(|t| !t.contains('='))
            {
                return Err(CarbonError::Config(format!(
                    "[[carbon.nodes]] entry {}: selector {sel:?} must be key=value[,key=value]",
                    i + 1
                )));
            }
            if let Some(p) = o.pue
                && !valid_pue(p)
            {
                return Err(CarbonError::Config(format!(
                    "[[carbon.nodes]] entry {}: pue {p} must be from 1.0 to 5.0",
                    i + 1
                )));
            }
            if let Some(g) = o.g_per_kwh
                && !(g.is_finite() && g >= 0.0)
            {
                return Err(CarbonError::Config(format!(
                    "[[carbon.nodes]] entry {}: g_per_kwh {g} must be a number >= 0",
                    i + 1
                )));
            }
        }
        let config = CarbonConfig {
            settings,
            file,
            built: Mutex::new(HashMap::new()),
        };
        // Every reachable combination must make sense.
        config.check(None)?;
        for o in &config.file.nodes {
            config.check(Some(o))?;
        }
        Ok(config)
    }

    /// Whether any node can have carbon figures.
    pub fn enabled(&self) -> bool {
        self.settings.carbon_provider.is_some()
            || self.settings.carbon_g_per_kwh.is_some()
            || self
                .file
                .nodes
                .iter()
                .any(|o| o.provider.is_some() || o.g_per_kwh.is_some())
    }

    /// The override that applies to a node: its name first, then the first selector.
    pub fn override_for(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<&NodeOverride> {
        self.file
            .nodes
            .iter()
            .find(|o| o.node.as_deref() == Some(node))
            .or_else(|| self.file.nodes.iter().find(|o| o.selector_matches(labels)))
    }

    fn settings(&self, o: Option<&NodeOverride>) -> Option<(ProviderSettings, String, f64)> {
        let a = &self.settings;
        let g_per_kwh = o.and_then(|o| o.g_per_kwh).or(a.carbon_g_per_kwh);
        let kind = o
            .and_then(|o| o.provider)
            .or(a.carbon_provider)
            .or(g_per_kwh.map(|_| ProviderKind::Static))?;
        let settings = ProviderSettings {
            kind,
            g_per_kwh,
            url: o
                .and_then(|o| o.url.clone())
                .or_else(|| a.carbon_url.clone()),
            token_file: o
                .and_then(|o| o.token_file.clone())
                .or_else(|| a.carbon_token_file.clone()),
            csv: o
                .and_then(|o| o.csv.clone())
                .or_else(|| a.carbon_csv.clone()),
            factor_type: o.and_then(|o| o.factor_type).or(a.carbon_factor_type),
            timeout: a.carbon_timeout,
            retries: a.carbon_retries,
        };
        let region = o
            .and_then(|o| o.region.clone())
            .or_else(|| a.carbon_region.clone())
            .unwrap_or_else(|| match kind {
                ProviderKind::Uk => "national".to_owned(),
                _ => String::new(),
            });
        let pue = o.and_then(|o| o.pue).unwrap_or(a.pue);
        Some((settings, region, pue))
    }

    fn check(&self, o: Option<&NodeOverride>) -> Result<(), CarbonError> {
        let Some((s, region, _)) = self.settings(o) else {
            return Ok(());
        };
        let what = match o {
            None => "the --carbon-* flags".to_owned(),
            Some(o) => format!(
                "[[carbon.nodes]] {}",
                o.node
                    .as_deref()
                    .or(o.selector.as_deref())
                    .unwrap_or_default()
            ),
        };
        let fail = |m: &str| Err(CarbonError::Config(format!("{what}: {m}")));
        match s.kind {
            ProviderKind::Static if s.g_per_kwh.is_none() => {
                fail("the static provider needs --carbon-g-per-kwh (g_per_kwh)")
            }
            ProviderKind::Csv if s.csv.is_none() => {
                fail("the csv provider needs --carbon-csv (csv)")
            }
            ProviderKind::Uk if s.factor_type == Some(FactorType::Lifecycle) => {
                fail("the UK API reports direct (operational) intensities only")
            }
            ProviderKind::Uk => match UkRegion::parse(&region) {
                Ok(_) => Ok(()),
                Err(CarbonError::Config(m)) => fail(&m),
                Err(e) => fail(&e.to_string()),
            },
            ProviderKind::Electricitymaps if region.is_empty() => {
                fail("the electricitymaps provider needs a zone (--carbon-region, e.g. DE)")
            }
            ProviderKind::Electricitymaps if s.token_file.is_none() => {
                fail("the electricitymaps provider needs --carbon-token-file")
            }
            _ => Ok(()),
        }
    }

    /// The carbon settings of a node, or `None` when carbon is off for it. Builds (once)
    /// the provider it uses.
    pub fn node(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<NodeCarbon>, CarbonError> {
        let Some((settings, region, pue)) = self.settings(self.override_for(node, labels)) else {
            return Ok(None);
        };
        let key = settings.key();
        let cached = self
            .built
            .lock()
            .map_err(|_| CarbonError::Config("provider cache poisoned".into()))?
            .get(&key)
            .cloned();
        let provider = match cached {
            Some(p) => p,
            None => {
                let p = settings.build()?;
                self.built
                    .lock()
                    .map_err(|_| CarbonError::Config("provider cache poisoned".into()))?
                    .insert(key, p.clone());
                p
            }
        };
        let region = if region.is_empty() {
            "default".to_owned()
        } else if settings.kind == ProviderKind::Uk {
            UkRegion::parse(&region)?.key()
        } else {
            region
        };
        Ok(Some(NodeCarbon {
            provider,
            settings,
            region,
            pue,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn file(toml_text: &str) -> CarbonFile {
        let v: toml::Table = toml::from_str(toml_text).expect("toml");
        toml::Value::Table(v)
            .get("carbon")
            .cloned()
            .expect("[carbon]")
            .try_into()
            .expect("valid [carbon]")
    }

    #[test]
    fn off_without_a_provider() {
        let c = CarbonConfig::new(CarbonSettings::default(), CarbonFile::default()).expect("valid");
        assert!(!c.enabled());
        assert!(c.node("n1", &labels(&[])).expect("ok").is_none());
    }

    #[test]
    fn g_per_kwh_alone_means_static_and_pue_defaults_to_one() {
        let args = CarbonSettings {
            carbon_g_per_kwh: Some(120.0),
            ..Default::default()
        };
        let c = CarbonConfig::new(args, CarbonFile::default()).expect("valid");
        let n = c.node("n1", &labels(&[])).expect("ok").expect("on");
        assert_eq!(n.settings.kind, ProviderKind::Static);
        assert_eq!((n.pue, n.region.as_str()), (1.0, "default"));
    }

    #[test]
    fn per_node_and_selector_overrides() {
        let dir = tempfile::tempdir().expect("tmp");
        let token = dir.path().join("tok");
        std::fs::write(&token, "secret\n").expect("write");
        let args = CarbonSettings {
            carbon_provider: Some(ProviderKind::Uk),
            carbon_region: Some("13".into()),
            carbon_url: Some("http://127.0.0.1:9".into()),
            pue: 1.1,
            ..Default::default()
        };
        let f = file(&format!(
            r#"
            [[carbon.nodes]]
            selector = "site=fra"
            provider = "electricitymaps"
            region = "DE"
            token_file = "{}"
            [[carbon.nodes]]
            node = "lab-1"
            provider = "static"
            g_per_kwh = 35
            pue = 1.4
            "#,
            token.display()
        ));
        let c = CarbonConfig::new(args, f).expect("valid");
        let uk = c
            .node("lon-1", &labels(&[("site", "lon")]))
            .expect("ok")
            .expect("on");
        assert_eq!(
            (uk.settings.kind, uk.region.as_str(), uk.pue),
            (ProviderKind::Uk, "13", 1.1)
        );
        let de = c
            .node("fra-1", &labels(&[("site", "fra")]))
            .expect("ok")
            .expect("on");
        assert_eq!(
            (de.settings.kind, de.region.as_str()),
            (ProviderKind::Electricitymaps, "DE")
        );
        assert_eq!(de.settings.effective_factor_type(), FactorType::Lifecycle);
        // A node name beats a selector.
        let lab = c
            .node("lab-1", &labels(&[("site", "fra")]))
            .expect("ok")
            .expect("on");
        assert_eq!((lab.settings.kind, lab.pue), (ProviderKind::Static, 1.4));
        // Two nodes with the same settings share one provider.
        let uk2 = c.node("lon-2", &labels(&[])).expect("ok").expect("on");
        assert!(Arc::ptr_eq(&uk.provider, &uk2.provider));
    }

    #[test]
    fn bad_settings_are_clear_errors() {
        let uk_bad_region = CarbonSettings {
            carbon_provider: Some(ProviderKind::Uk),
            carbon_region: Some("London".into()),
            ..Default::default()
        };
        let e = CarbonConfig::new(uk_bad_region, CarbonFile::default()).expect_err("region");
        assert!(e.to_string().contains("region id 1-17"), "{e}");
        let em_no_token = CarbonSettings {
            carbon_provider: Some(ProviderKind::Electricitymaps),
            carbon_region: Some("DE".into()),
            ..Default::default()
        };
        let e = CarbonConfig::new(em_no_token, CarbonFile::default()).expect_err("token");
        assert!(e.to_string().contains("--carbon-token-file"), "{e}");
        let e = CarbonConfig::new(
            CarbonSettings::default(),
            file("[[carbon.nodes]]\nselector = \"site\"\ng_per_kwh = 1\n"),
        )
        .expect_err("selector");
        assert!(e.to_string().contains("key=value"), "{e}");
        let e = CarbonConfig::new(
            CarbonSettings::default(),
            file("[[carbon.nodes]]\nnode = \"a\"\ng_per_kwh = 1\npue = 0.5\n"),
        )
        .expect_err("pue");
        assert!(e.to_string().contains("pue"), "{e}");
        let v: toml::Table = toml::from_str("[carbon]\nnodez = []\n").expect("toml");
        let bad: Result<CarbonFile, _> = v["carbon"].clone().try_into();
        assert!(bad.is_err());
    }
}
