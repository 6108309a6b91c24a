//! The carbon flags (`--carbon-*`, `--pue`), for `#[command(flatten)]` in the collector's
//! and `gpufleet-exec`'s commands; they fill `gpufleet-carbon`'s plain [`CarbonSettings`].

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use gpufleet_carbon::config::{parse_g_per_kwh, parse_pue};
use gpufleet_carbon::{CarbonSettings, FactorType, ProviderKind};
use gpufleet_core::config::parse_duration;
use std::path::PathBuf;
use std::time::Duration;

/// The carbon flags, for `#[command(flatten)]`.
#[derive(Debug, Clone, clap::Args)]
pub struct CarbonArgs {
    /// Where carbon intensities come from. Default: none (carbon figures absent), or
    /// `static` when --carbon-g-per-kwh is given.
    #[arg(
        long,
        env = "GPUFLEET_CARBON_PROVIDER",
        value_parser = provider_kinds(),
        value_name = "PROVIDER"
    )]
    pub carbon_provider: Option<ProviderKind>,
    /// gCO2/kWh: the figure of the `static` provider, and for the others the value used
    /// (marked estimated) when the provider is unreachable and nothing is known yet.
    #[arg(long, env = "GPUFLEET_CARBON_G_PER_KWH", value_name = "G", value_parser = parse_g_per_kwh)]
    pub carbon_g_per_kwh: Option<f64>,
    /// Region: UK region id 1-17 or `national` (uk); zone such as DE (electricitymaps);
    /// a name recorded with the figures (static, csv).
    #[arg(long, env = "GPUFLEET_CARBON_REGION", value_name = "REGION")]
    pub carbon_region: Option<String>,
    /// Base URL of the provider's API (default: the public one).
    #[arg(long, env = "GPUFLEET_CARBON_URL", value_name = "URL")]
    pub carbon_url: Option<String>,
    /// File holding the Electricity Maps API token (sent as `auth-token`; never logged).
    #[arg(long, env = "GPUFLEET_CARBON_TOKEN_FILE", value_name = "FILE")]
    pub carbon_token_file: Option<PathBuf>,
    /// CSV series for the `csv` provider: `from,to,g_per_kwh[,kind]`, RFC 3339 or Unix ms.
    #[arg(long, env = "GPUFLEET_CARBON_CSV", value_name = "FILE")]
    pub carbon_csv: Option<PathBuf>,
    /// Emission factors: `direct` (operational) or `lifecycle`. Asked of Electricity Maps
    /// (default lifecycle there); recorded for static and CSV figures (default direct).
    /// The UK API is always direct.
    #[arg(
        long,
        env = "GPUFLEET_CARBON_FACTOR_TYPE",
        value_parser = factor_types(),
        value_name = "TYPE"
    )]
    pub carbon_factor_type: Option<FactorType>,
    /// Power usage effectiveness: facility energy / IT energy. Carbon = GPU energy ×
    /// intensity × PUE. 1.0 counts the GPUs' energy only.
    #[arg(long, env = "GPUFLEET_PUE", default_value_t = 1.0, value_parser = parse_pue, value_name = "RATIO")]
    pub pue: f64,
    /// Limit on one request to the provider.
    #[arg(long, env = "GPUFLEET_CARBON_TIMEOUT", default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub carbon_timeout: Duration,
    /// Retries of a failed request (unreachable, HTTP 429/5xx), with exponential backoff
    /// from 500ms.
    #[arg(
        long,
        env = "GPUFLEET_CARBON_RETRIES",
        default_value_t = 3,
        value_name = "N"
    )]
    pub carbon_retries: u32,
}

impl From<CarbonArgs> for CarbonSettings {
    fn from(a: CarbonArgs) -> Self {
        CarbonSettings {
            carbon_provider: a.carbon_provider,
            carbon_g_per_kwh: a.carbon_g_per_kwh,
            carbon_region: a.carbon_region,
            carbon_url: a.carbon_url,
            carbon_token_file: a.carbon_token_file,
            carbon_csv: a.carbon_csv,
            carbon_factor_type: a.carbon_factor_type,
            pue: a.pue,
            carbon_timeout: a.carbon_timeout,
            carbon_retries: a.carbon_retries,
        }
    }
}

/// `--carbon-provider`'s values, with what each is (shown by `--help`).
fn provider_kinds() -> impl TypedValueParser<Value = ProviderKind> {
    let help = |kind: ProviderKind| match kind {
        ProviderKind::Static => "One configured g/kWh (`--carbon-g-per-kwh`), at every time",
        ProviderKind::Csv => "A CSV time series `from,to,g_per_kwh[,kind]` (`--carbon-csv`)",
        ProviderKind::Uk => "The UK Carbon Intensity API (regional by region id, or national)",
        ProviderKind::Electricitymaps => "Electricity Maps (a zone; needs a token)",
    };
    PossibleValuesParser::new(
        ProviderKind::ALL.map(|k| PossibleValue::new(k.as_str()).help(help(k))),
    )
    .try_map(|s| s.parse::<ProviderKind>())
}

/// `--carbon-factor-type`'s values, with what each is (shown by `--help`).
fn factor_types() -> impl TypedValueParser<Value = FactorType> {
    let help = |kind: FactorType| match kind {
        FactorType::Direct => "Operational (combustion) emissions only; what the UK API reports",
        FactorType::Lifecycle => {
            "Life-cycle emissions (construction, fuel supply, …); Electricity Maps' default"
        }
    };
    PossibleValuesParser::new(FactorType::ALL.map(|k| PossibleValue::new(k.as_str()).help(help(k))))
        .try_map(|s| s.parse::<FactorType>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        carbon: CarbonArgs,
    }

    #[test]
    fn the_flags_default_to_the_settings_default() {
        let parsed: CarbonSettings = Cli::try_parse_from(["bin"]).expect("parses").carbon.into();
        let default = CarbonSettings::default();
        assert_eq!(
            (parsed.pue, parsed.carbon_timeout, parsed.carbon_retries),
            (default.pue, default.carbon_timeout, default.carbon_retries)
        );
        assert!(parsed.carbon_provider.is_none() && parsed.carbon_factor_type.is_none());
    }

    #[test]
    fn providers_and_factor_types_parse_by_name_and_others_are_refused() {
        let cli = Cli::try_parse_from([
            "bin",
            "--carbon-provider",
            "electricitymaps",
            "--carbon-factor-type",
            "lifecycle",
        ])
        .expect("parses");
        assert_eq!(
            cli.carbon.carbon_provider,
            Some(ProviderKind::Electricitymaps)
        );
        assert_eq!(cli.carbon.carbon_factor_type, Some(FactorType::Lifecycle));
        let err = Cli::try_parse_from(["bin", "--carbon-provider", "coal"]).expect_err("refused");
        assert!(err.to_string().contains("possible values"), "{err}");
        assert!(Cli::try_parse_from(["bin", "--pue", "0.5"]).is_err());
    }
}
