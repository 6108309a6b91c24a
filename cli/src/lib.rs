//! gpufleet's command-line layer, shared by the binaries (`gpufleet-agent`,
//! `gpufleet-exec`, `gpufleet-collector`), so that the library crates carry no parser:
//!
//! - [`config_file`]: the `--config FILE` (TOML) layer under clap's flags; precedence
//!   CLI > environment > file > default.
//! - `carbon` (feature `carbon`): the `--carbon-*` / `--pue` flags, filling the carbon
//!   crate's plain settings; the collector and `gpufleet-exec` turn it on, the agent not.

#[cfg(feature = "carbon")]
pub mod carbon;
pub mod config_file;

#[cfg(feature = "carbon")]
pub use carbon::CarbonArgs;
pub use config_file::{args_with_config_file, args_with_config_file_as};
