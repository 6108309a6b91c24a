//! An entry of the collector's Xid catalogue (`gpufleet_collector::health::xid`): what an
//! Xid code means, what usually causes it, what to do, and how bad it is.

use serde::{Deserialize, Serialize};

/// How bad an Xid is for the GPU that logged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Usually the application's own doing, or a consequence of another error; nothing to
    /// do on the GPU unless it keeps recurring.
    Info,
    /// Worth a look: may point at hardware, firmware or the platform; the GPU usually
    /// keeps working.
    Warning,
    /// The GPU (or its memory, bus or firmware) is in trouble: drain it, reset it, and
    /// service it if it comes back.
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// One catalogue entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct XidInfo {
    pub code: u64,
    /// A short name, e.g. "GPU has fallen off the bus".
    pub name: String,
    /// What the driver is telling us.
    pub meaning: String,
    /// What usually causes it.
    pub cause: String,
    /// What to do about it.
    pub action: String,
    pub severity: Severity,
    /// Whether the code is in the catalogue (`false`: the generic entry).
    pub known: bool,
}
