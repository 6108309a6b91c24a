//! gpufleet's command-line layer, shared by the binaries (`gpufleet-agent`,
//! `gpufleet-exec`, `gpufleet-collector`), so that the library crates carry no parser:
//!
//! - [`config_file`]: the `--config FILE` (TOML) layer under clap's flags; precedence
//!   CLI > environment > file > default.
//! - [`carbon`]: the `--carbon-*` / `--pue` flags, filling the carbon crate's plain settings.

pub mod carbon;
pub mod config_file;

pub use carbon::CarbonArgs;
pub use config_file::{args_with_config_file, args_with_config_file_as};
