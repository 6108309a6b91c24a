//! Following the store: with several collectors on one database, each learns what the
//! others committed, so its dashboard, API, `/metrics` and live stream show every node.
//!
//! Every [`FollowMode`] period one task reads the node table ([`FleetReads::nodes`]: small, one
//! row per node, maintained in each write transaction) and compares each node with the
//! live state. A node whose agent streams to this collector is skipped: its own commits
//! keep it current. For any other node whose newest tick time or stored-sample count moved,
//! it reads the node's new ticks (at most [`WINDOW_MS`] back from the newest; all moved
//! nodes' in one [`FleetReads::nodes_ticks`], a constant number of queries per pass), feeds
//! them to the live state ([`Live::followed`]) and announces them like a
//! commit of its own (`/api/v1/live`, the energy accountant). More samples stored than
//! ticks read means another collector stored older data (a replayed spool): the energy
//! accountant is told to recheck recent minutes ([`Live::note_late_data`]).
//!
//! With one collector nothing moves behind its back, and a pass is one read of the node
//! table; on SQLite (one collector per file) it does not run unless asked for.

use crate::live::state::{Committed, Live};
use crate::store::{FleetReads, NodeRecord, StoreError, TimeRange};
use gpufleet_core::{Batch, UnixMs};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// How far back from a node's newest tick a pass reads (older new ticks are stored and
/// accounted, but not replayed to live streams).
pub const WINDOW_MS: i64 = 30_000;
/// Most ticks per node per pass.
pub const MAX_TICKS: usize = 600;
/// The period of `--follow-store auto` on a shared database.
pub const AUTO_EVERY: Duration = Duration::from_millis(500);

/// `--follow-store`: whether and how often to follow what other collectors commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FollowMode {
    /// Every [`AUTO_EVERY`] on a database several collectors may share (PostgreSQL); off
    /// on SQLite.
    #[default]
    Auto,
    Off,
    Every(Duration),
}

impl FollowMode {
    /// Parses `auto`, `off` or a period (`500ms`, `1s`).
    pub fn parse(s: &str) -> Result<FollowMode, String> {
        match s.trim() {
            "auto" => Ok(FollowMode::Auto),
            "off" => Ok(FollowMode::Off),
            d => match gpufleet_core::config::parse_duration(d) {
                Ok(p) if !p.is_zero() => Ok(FollowMode::Every(p)),
                _ => Err(format!(
                    "{s:?}: expected auto, off or a period such as 500ms or 1s"
                )),
            },
        }
    }

    /// The period to follow at, for a database that is `shared` or not; `None`: off.
    pub fn period(self, shared: bool) -> Option<Duration> {
        match self {
            FollowMode::Auto => shared.then_some(AUTO_EVERY),
            FollowMode::Off => None,
            FollowMode::Every(p) => Some(p),
        }
    }
}

/// Starts following the store every `period` until `stop` is cancelled.
pub fn spawn(
    store: Arc<dyn FleetReads>,
    live: Arc<Live>,
    period: Duration,
    stop: CancellationToken,
) -> JoinHandle<()> {
    info!(
        period_ms = period.as_millis() as u64,
        "following what other collectors commit to the database"
    );
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticker.tick() => match follow_once(store.as_ref(), &live).await {
                    Ok(_) if failing => {
                        info!("following the database works again");
                        failing = false;
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        warn!(error = %e, "cannot follow the database; nodes served by other collectors may look stale until it answers");
                        failing = true;
                    }
                    Err(e) => debug!(error = %e, "following the database still fails"),
                },
            }
        }
        debug!("store follower stopped");
    })
}

/// One pass (see the module docs). Returns the ticks taken from the store.
pub async fn follow_once(store: &dyn FleetReads, live: &Live) -> Result<usize, StoreError> {
    let records = store.nodes().await?;
    // The nodes that moved, with what this collector knew of them.
    let mut moved = Vec::new();
    for record in &records {
        let known = live.follow_view(&record.name);
        let (seen, stored) = match known {
            None => {
                live.adopt(record.clone());
                (None, 0)
            }
            Some((connections, _, _, _)) if connections > 0 => continue,
            Some((_, hello, seen, stored)) => {
                if hello != record.last_hello_ms {
                    live.adopt(record.clone()); // re-registered elsewhere: new inventory
                }
                (seen, stored)
            }
        };
        let newer = match (record.last_seen_ms, seen) {
            (Some(r), Some(s)) => r > s,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if !newer && record.stored_samples == stored {
            continue;
        }
        let range = match record.last_seen_ms {
            Some(last) if newer => {
                let from = seen.map_or(UnixMs::MIN, |s| s.saturating_add(1));
                Some(TimeRange {
                    from_ms: from.max(last.saturating_sub(WINDOW_MS)),
                    to_ms: last,
                })
            }
            _ => None,
        };
        moved.push((record, known.is_some(), stored, range));
    }
    // The new ticks of all of them in one read.
    let wanted: Vec<(&NodeRecord, TimeRange)> = moved
        .iter()
        .filter_map(|&(record, _, _, range)| range.map(|r| (record, r)))
        .collect();
    let mut read = store.nodes_ticks(&wanted, MAX_TICKS).await?.into_iter();
    let mut taken = 0;
    for (record, known, stored, range) in moved {
        let ticks = match range {
            Some(_) => read.next().ok_or_else(|| {
                StoreError::Corrupt("the store answered fewer nodes than asked".into())
            })?,
            None => Vec::new(),
        };
        let samples: u64 = ticks.iter().map(|t| t.gpus.len() as u64).sum();
        if known && record.stored_samples > stored.saturating_add(samples) {
            live.note_late_data();
        }
        live.followed(record, &ticks);
        taken += ticks.len();
        if !ticks.is_empty() && live.has_subscribers() {
            live.announce(Committed {
                node: record.name.clone(),
                batch: Batch {
                    seq: record.last_acked_seq,
                    ticks,
                    delivery: record.delivery,
                },
            });
        }
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_resolve() {
        assert_eq!(FollowMode::parse("auto"), Ok(FollowMode::Auto));
        assert_eq!(FollowMode::parse("off"), Ok(FollowMode::Off));
        assert_eq!(
            FollowMode::parse("250ms"),
            Ok(FollowMode::Every(Duration::from_millis(250)))
        );
        assert!(FollowMode::parse("0s").is_err());
        assert!(FollowMode::parse("often").is_err());
        assert_eq!(FollowMode::Auto.period(true), Some(AUTO_EVERY));
        assert_eq!(FollowMode::Auto.period(false), None);
        assert_eq!(FollowMode::Off.period(true), None);
        assert_eq!(
            FollowMode::Every(Duration::from_secs(1)).period(false),
            Some(Duration::from_secs(1))
        );
    }
}
