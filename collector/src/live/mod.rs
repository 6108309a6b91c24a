//! The live view: the fleet's latest state in memory, kept current from this collector's
//! own commits and, with several collectors on one database, from the others' commits.
//!
//! - [`state`]: every node's identity, inventory and newest samples, seeded from the store.
//! - [`follow`]: learns what other collectors sharing the database committed.
//! - [`status`]: online / stale / offline from the newest sample time; the injectable clock.

pub mod follow;
pub mod state;
pub mod status;
