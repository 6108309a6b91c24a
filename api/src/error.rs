//! The body of every error answer of the API: `{"error": "..."}`.

use serde::{Deserialize, Serialize};

/// The body of every error answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What went wrong and what to do; never database details.
    pub error: String,
}
