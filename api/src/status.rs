//! A node's liveness: `online`, `stale` or `offline` (the collector classifies it from the
//! age of the node's newest sample).

use serde::{Deserialize, Serialize};

/// A node's liveness as the API and `/metrics` report it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Online,
    Stale,
    // The default: a node without any sample is offline.
    #[default]
    Offline,
}

impl NodeStatus {
    pub const ALL: [NodeStatus; 3] = [NodeStatus::Online, NodeStatus::Stale, NodeStatus::Offline];

    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Online => "online",
            NodeStatus::Stale => "stale",
            NodeStatus::Offline => "offline",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_their_names_both_ways() {
        for s in NodeStatus::ALL {
            let json = serde_json::to_string(&s).expect("encodes");
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            let back: NodeStatus = serde_json::from_str(&json).expect("decodes");
            assert_eq!(back, s);
        }
        assert!(
            NodeStatus::Online < NodeStatus::Offline,
            "online sorts first"
        );
    }
}
