//! The live state: every node's identity, inventory and delivery counters, and the newest
//! sample of every GPU and host, in memory.
//!
//! It is updated only after a commit (so it never shows data that is not durable), seeded
//! from the store at start-up, and is what `/api/v1/nodes`, `/` and `/metrics` read: they
//! never query samples. Nodes whose agent streams to this collector are kept current by
//! its own commits ([`Live::committed`]); when several collectors share the database, the
//! others' nodes are kept current by [`crate::live::follow`] ([`Live::followed`]). Each commit is also announced on a broadcast channel
//! ([`Live::subscribe`]) for live dashboards; a subscriber that falls behind misses
//! announcements (`RecvError::Lagged`) instead of slowing ingest down.
//!
//! Announced batches stay in memory until every subscriber received them, and a lagging
//! subscriber (a dashboard that stopped reading, a background job in a long pass) leaves
//! them in the channel's ring until they are overwritten. So the ring is bounded in bytes
//! as well as in count: past [`ANNOUNCE_BUDGET_BYTES`] of batches not yet received, a
//! commit is announced without its ticks ([`Announcement::partial`]), and subscribers treat
//! that as missed announcements (resync, recheck).

use crate::health::recent::{self, GpuMemory};
use crate::store::{GpuId, LatestGpu, LatestHealth, LatestHost, NodeBatch, NodeRecord, UuidMap};
use gpufleet_core::{
    Batch, Event, GpuHealthSample, GpuSample, HostSample, NameFailures, ProcessSample, SamplerCost,
    Tick, UnixMs,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Commits announced but not yet received, per subscriber, before it starts missing some.
const ANNOUNCE_CAPACITY: usize = 1024;
/// Most bytes of announced batches held for subscribers at once (an estimate, see
/// [`batch_bytes`]). Measured (BENCHMARKS.md): with only the count bound, a flood of
/// large batches kept ~250 MiB in the ring.
pub const ANNOUNCE_BUDGET_BYTES: usize = 32 << 20;

/// The newest sample of one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveGpu {
    pub time_ms: UnixMs,
    pub sample: GpuSample,
    /// The processes seen on this GPU in the same tick.
    pub processes: Vec<ProcessSample>,
    /// The last health sample received (agents send one every health interval, not every
    /// tick): kept across ticks without one, seeded from the store at start-up.
    pub health: Option<LiveHealth>,
    /// The tick time of the energy counter reading in `sample.energy_mj`. Agents read the
    /// counter every few seconds: the ticks between carry none, and the latest sample
    /// keeps the newest reading (a counter's value stays true), so `/metrics` and the
    /// live view do not lose it between readings.
    pub energy_ms: Option<UnixMs>,
}

/// The newest health sample of one GPU, and the time of the tick that carried it.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveHealth {
    pub time_ms: UnixMs,
    pub sample: GpuHealthSample,
}

/// The newest host row of one node.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveHost {
    pub time_ms: UnixMs,
    pub sample: Option<HostSample>,
    pub cost: Option<SamplerCost>,
}

/// One node as the live state knows it.
#[derive(Debug, Clone)]
pub struct LiveNode {
    /// Identity, inventory and delivery counters; the counters (`last_seen_ms`,
    /// `last_acked_seq`, `delivery`, `stored_samples`) are kept current after each commit,
    /// exactly as the store updates them.
    pub record: NodeRecord,
    /// Open ingest streams for this node (an agent reconnecting may briefly have two).
    pub connections: u32,
    /// Batches refused since the collector started (not persisted).
    pub rejected_batches: u64,
    pub host: Option<LiveHost>,
    pub gpus: HashMap<GpuId, LiveGpu>,
    /// What the health judge remembers per GPU (recent Xid / ECC / lost / recovered
    /// events, error-counter trends): filled after each commit, seeded from the store's
    /// events at start-up ([`Live::seed_events`]); only GPUs that had some.
    pub memory: HashMap<GpuId, GpuMemory>,
    /// The agent's failed workload-name look-ups, as its newest tick that counted them
    /// said (cumulative since the agent started); not persisted.
    pub name_failures: Vec<NameFailures>,
}

/// Everything the live state holds; read it through [`Live::read`].
#[derive(Debug, Default)]
pub struct LiveState {
    /// By name, so listings come out sorted.
    pub nodes: BTreeMap<String, LiveNode>,
    /// GPU UUID -> node name, for lookups by UUID.
    gpu_owner: HashMap<String, String>,
}

impl LiveState {
    /// The node holding GPU `uuid`, and the GPU's id.
    pub fn find_gpu(&self, uuid: &str) -> Option<(&LiveNode, GpuId)> {
        let node = self.nodes.get(self.gpu_owner.get(uuid)?)?;
        let gpu = node.record.gpus.iter().find(|g| g.info.uuid == uuid)?;
        Some((node, gpu.id))
    }

    fn insert(&mut self, record: NodeRecord) -> &mut LiveNode {
        // A GPU that moved here from another node leaves that node.
        for g in &record.gpus {
            if let Some(old) = self
                .gpu_owner
                .insert(g.info.uuid.clone(), record.name.clone())
                && old != record.name
                && let Some(n) = self.nodes.get_mut(&old)
            {
                n.record.gpus.retain(|x| x.id != g.id);
                n.gpus.remove(&g.id);
            }
        }
        let name = record.name.clone();
        let node = self.nodes.entry(name).or_insert_with(|| LiveNode {
            record: record.clone(),
            connections: 0,
            rejected_batches: 0,
            host: None,
            gpus: HashMap::new(),
            memory: HashMap::new(),
            name_failures: Vec::new(),
        });
        node.gpus
            .retain(|id, _| record.gpus.iter().any(|g| g.id == *id));
        node.memory
            .retain(|id, _| record.gpus.iter().any(|g| g.id == *id));
        // The record was read in the registering transaction; a commit announced since
        // (another stream of the same node) may already be counted here: keep the newer.
        let old = std::mem::replace(&mut node.record, record);
        let r = &mut node.record;
        if old.last_acked_seq > r.last_acked_seq {
            r.last_acked_seq = old.last_acked_seq;
            r.delivery = old.delivery;
        }
        r.last_seen_ms = r.last_seen_ms.max(old.last_seen_ms);
        r.stored_samples = r.stored_samples.max(old.stored_samples);
        node
    }
}

/// A commit, as announced to subscribers.
#[derive(Debug)]
pub struct Committed {
    pub node: String,
    pub batch: Batch,
}

/// What subscribers receive: a commit (it derefs to [`Committed`]), and whether its ticks
/// were left out.
#[derive(Debug)]
pub struct Announcement {
    commit: Committed,
    /// The batch's ticks were left out (the announcement budget was spent): subscribers
    /// must treat this as missed announcements.
    pub partial: bool,
    /// Gives the batch's bytes back to the budget when the last subscriber is done.
    _budget: Option<Budgeted>,
}

impl std::ops::Deref for Announcement {
    type Target = Committed;

    fn deref(&self) -> &Committed {
        &self.commit
    }
}

/// Bytes of one announced batch, counted in [`Live::announced_bytes`] while it lives.
#[derive(Debug)]
struct Budgeted {
    bytes: usize,
    total: Arc<AtomicUsize>,
}

impl Drop for Budgeted {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// About how much memory a decoded batch holds.
pub fn batch_bytes(batch: &Batch) -> usize {
    use std::mem::size_of;
    batch
        .ticks
        .iter()
        .map(|t| {
            size_of::<Tick>()
                + t.gpus.len() * size_of::<GpuSample>()
                + t.gpus.iter().map(|g| g.gpu_uuid.len()).sum::<usize>()
                + t.health.len() * size_of::<GpuHealthSample>()
                + t.processes.len() * (size_of::<ProcessSample>() + 256)
                + t.events
                    .iter()
                    .map(|e| size_of::<gpufleet_core::Event>() + e.detail.len())
                    .sum::<usize>()
        })
        .sum()
}

/// The live state and its announcement channel. Shared as `Arc<Live>`.
#[derive(Debug)]
pub struct Live {
    state: RwLock<LiveState>,
    announce: broadcast::Sender<Arc<Announcement>>,
    /// Cancelled when the collector shuts down, so live streams end (see [`Live::close`]).
    closing: CancellationToken,
    /// Set when another collector stored samples older than a node's newest (a replayed
    /// spool): the energy accountant rechecks recent minutes ([`Live::take_late_data`]).
    late_data: AtomicBool,
    /// Bytes of announced batches some subscriber has not received yet.
    announced_bytes: Arc<AtomicUsize>,
}

impl Default for Live {
    fn default() -> Self {
        Live::new()
    }
}

impl Live {
    pub fn new() -> Live {
        Live {
            state: RwLock::new(LiveState::default()),
            announce: broadcast::channel(ANNOUNCE_CAPACITY).0,
            closing: CancellationToken::new(),
            late_data: AtomicBool::new(false),
            announced_bytes: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Fills the state from the store at start-up. A GPU's health is kept only where the
    /// GPU has a sample (a GPU without one is not shown live).
    pub fn seed(
        &self,
        nodes: Vec<NodeRecord>,
        gpus: Vec<LatestGpu>,
        hosts: Vec<LatestHost>,
        health: Vec<LatestHealth>,
    ) {
        let mut state = self.write();
        let mut owner_of: HashMap<GpuId, String> = HashMap::new();
        let mut node_of: HashMap<i64, String> = HashMap::new();
        for record in nodes {
            for g in &record.gpus {
                owner_of.insert(g.id, record.name.clone());
            }
            node_of.insert(record.id.0, record.name.clone());
            state.insert(record);
        }
        for l in gpus {
            if let Some(node) = owner_of.get(&l.gpu).and_then(|n| state.nodes.get_mut(n)) {
                node.gpus.insert(
                    l.gpu,
                    LiveGpu {
                        time_ms: l.time_ms,
                        energy_ms: l.sample.energy_mj.map(|_| l.time_ms),
                        sample: l.sample,
                        processes: l.processes,
                        health: None,
                    },
                );
            }
        }
        for h in health {
            let Some(node) = owner_of.get(&h.gpu).and_then(|n| state.nodes.get_mut(n)) else {
                continue;
            };
            if let Some(live) = node.gpus.get_mut(&h.gpu) {
                node.memory
                    .entry(h.gpu)
                    .or_default()
                    .note_counters(h.time_ms, &h.sample);
                live.health = Some(LiveHealth {
                    time_ms: h.time_ms,
                    sample: h.sample,
                });
            }
        }
        for h in hosts {
            if let Some(node) = node_of.get(&h.node.0).and_then(|n| state.nodes.get_mut(n)) {
                node.host = Some(LiveHost {
                    time_ms: h.time_ms,
                    sample: h.sample,
                    cost: h.cost,
                });
            }
        }
    }

    /// Seeds the health judge's memory of node `node` from its stored events (oldest
    /// first), at start-up: what happened before this collector started still counts.
    pub fn seed_events(&self, node: &str, events: &[Event]) {
        let mut state = self.write();
        let Some(n) = state.nodes.get_mut(node) else {
            return;
        };
        let keys: HashMap<&str, GpuId> = n
            .record
            .gpus
            .iter()
            .map(|g| (g.info.uuid.as_str(), g.id))
            .collect();
        let ids: Vec<_> = events
            .iter()
            .map(|e| keys.get(e.gpu_uuid.as_str()).copied())
            .collect();
        remember(&mut n.memory, events.iter().zip(ids));
        // The node's latest Hello came after these events where it is newer: a reset.
        let hello = n.record.last_hello_ms;
        for m in n.memory.values_mut() {
            m.events.note_reset(hello);
        }
    }

    /// A node said hello (and the store registered it): take its new identity and
    /// inventory, and count the connection.
    pub fn connected(&self, record: NodeRecord) {
        let mut state = self.write();
        let hello = record.last_hello_ms;
        let node = state.insert(record);
        node.connections += 1;
        // A Hello is an agent restart (or a driver reload, or a reboot): errors before it
        // were cleared by the reset that came with it.
        for m in node.memory.values_mut() {
            m.events.note_reset(hello);
        }
    }

    /// A node's stream ended.
    pub fn disconnected(&self, node: &str) {
        if let Some(n) = self.write().nodes.get_mut(node) {
            n.connections = n.connections.saturating_sub(1);
        }
    }

    /// A node's batch was refused.
    pub fn rejected(&self, node: &str) {
        if let Some(n) = self.write().nodes.get_mut(node) {
            n.rejected_batches += 1;
        }
    }

    /// A batch was committed; `inserted` is how many of its GPU samples were new.
    pub fn committed(&self, nb: &NodeBatch, inserted: u64) {
        let mut state = self.write();
        let Some(node) = state.nodes.get_mut(&nb.keys.name) else {
            return;
        };
        let batch = &nb.batch;
        let r = &mut node.record;
        if batch.seq >= r.last_acked_seq {
            r.delivery = batch.delivery;
        }
        r.last_acked_seq = r.last_acked_seq.max(batch.seq);
        r.stored_samples += inserted;
        apply_ticks(node, &nb.keys.gpus, &batch.ticks);
    }

    /// What [`crate::live::follow`] needs to know of a node: `None` when unknown here, else
    /// (open streams to this collector, the node's latest Hello, its newest tick time,
    /// its stored GPU samples).
    pub fn follow_view(&self, node: &str) -> Option<(u32, UnixMs, Option<UnixMs>, u64)> {
        self.read(|s| {
            s.nodes.get(node).map(|n| {
                (
                    n.connections,
                    n.record.last_hello_ms,
                    n.record.last_seen_ms,
                    n.record.stored_samples,
                )
            })
        })
    }

    /// A node registered (or re-registered) through another collector: take its identity
    /// and inventory as stored, without counting a connection here.
    pub fn adopt(&self, record: NodeRecord) {
        self.write().insert(record);
    }

    /// Another collector committed `ticks` of a node whose stored state is now `record`:
    /// take its delivery counters from the store and its newest samples from the ticks.
    /// Nothing changes for a node whose agent streams to this collector (its own commits
    /// keep it current).
    pub fn followed(&self, record: &NodeRecord, ticks: &[Tick]) {
        let mut state = self.write();
        let Some(node) = state.nodes.get_mut(&record.name) else {
            return;
        };
        if node.connections > 0 {
            return;
        }
        let r = &mut node.record;
        r.last_acked_seq = record.last_acked_seq;
        r.delivery = record.delivery;
        r.stored_samples = record.stored_samples;
        r.last_seen_ms = r.last_seen_ms.max(record.last_seen_ms);
        let keys: UuidMap<GpuId> = record
            .gpus
            .iter()
            .map(|g| (g.info.uuid.clone(), g.id))
            .collect();
        apply_ticks(node, &keys, ticks);
    }

    /// Notes that another collector stored data behind a node's newest sample.
    pub fn note_late_data(&self) {
        self.late_data.store(true, Ordering::Relaxed);
    }

    /// Whether late data was noted since the last call (and forgets it).
    pub fn take_late_data(&self) -> bool {
        self.late_data.swap(false, Ordering::Relaxed)
    }

    /// Whether anyone listens to commit announcements (so the writer can skip building them).
    pub fn has_subscribers(&self) -> bool {
        self.announce.receiver_count() > 0
    }

    /// Announces a commit to subscribers (none listening is fine); without its ticks when
    /// [`ANNOUNCE_BUDGET_BYTES`] of announced batches are still held for subscribers.
    pub fn announce(&self, mut commit: Committed) {
        let bytes = batch_bytes(&commit.batch);
        let held = self.announced_bytes.fetch_add(bytes, Ordering::Relaxed);
        let announcement = if held.saturating_add(bytes) > ANNOUNCE_BUDGET_BYTES {
            self.announced_bytes.fetch_sub(bytes, Ordering::Relaxed);
            commit.batch.ticks = Vec::new();
            Announcement {
                commit,
                partial: true,
                _budget: None,
            }
        } else {
            Announcement {
                commit,
                partial: false,
                _budget: Some(Budgeted {
                    bytes,
                    total: Arc::clone(&self.announced_bytes),
                }),
            }
        };
        let _ = self.announce.send(Arc::new(announcement));
    }

    /// Bytes of announced batches not yet received by every subscriber (an estimate).
    pub fn announced_bytes(&self) -> usize {
        self.announced_bytes.load(Ordering::Relaxed)
    }

    /// Receives every commit from now on, in commit order.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Announcement>> {
        self.announce.subscribe()
    }

    /// Ends every live stream (the collector is shutting down; an open dashboard must not
    /// hold the HTTP server's graceful shutdown).
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// Completes once [`Live::close`] was called.
    pub async fn closing(&self) {
        self.closing.cancelled().await;
    }

    /// Runs `f` with the state read-locked. Keep `f` short: commits wait for it.
    pub fn read<R>(&self, f: impl FnOnce(&LiveState) -> R) -> R {
        f(&self.state.read().unwrap_or_else(PoisonError::into_inner))
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, LiveState> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Takes each GPU's and the host's newest sample from `ticks` where it is newer than the
/// node's, and the newest tick time as the node's `last_seen_ms`.
fn apply_ticks(node: &mut LiveNode, gpu_ids: &UuidMap<GpuId>, ticks: &[Tick]) {
    if ticks.iter().any(|t| !t.events.is_empty()) {
        let events = ticks.iter().flat_map(|t| &t.events);
        remember(
            &mut node.memory,
            events.map(|e| (e, gpu_ids.get(&e.gpu_uuid).copied())),
        );
    }
    // Error-counter trends, oldest reading first.
    for t in ticks {
        for h in &t.health {
            if let Some(&id) = gpu_ids.get(&h.gpu_uuid) {
                node.memory
                    .entry(id)
                    .or_default()
                    .note_counters(t.time_ms, h);
            }
        }
    }
    let r = &mut node.record;
    // Newest tick first: each GPU's sample is cloned at most once per batch.
    for t in ticks.iter().rev() {
        r.last_seen_ms = Some(r.last_seen_ms.map_or(t.time_ms, |s| s.max(t.time_ms)));
        for s in &t.gpus {
            let Some(&id) = gpu_ids.get(&s.gpu_uuid) else {
                continue;
            };
            // A lost GPU reads nothing; one with real readings answers again (after a
            // reboot the new agent never reports a recovery).
            if (s.power_mw.is_some() || s.temp_gpu_c.is_some())
                && let Some(m) = node.memory.get_mut(&id)
            {
                m.events.note_answered(t.time_ms);
            }
            if let Some(live) = node.gpus.get_mut(&id)
                && live.time_ms >= t.time_ms
            {
                // An older tick of the batch: only a newer counter reading is taken.
                if s.energy_mj.is_some() && live.energy_ms.is_none_or(|e| e < t.time_ms) {
                    live.sample.energy_mj = s.energy_mj;
                    live.energy_ms = Some(t.time_ms);
                }
                continue;
            }
            let processes = t
                .processes
                .iter()
                .filter(|p| p.gpu_uuid == s.gpu_uuid)
                .cloned()
                .collect();
            let previous = node.gpus.remove(&id);
            let mut sample = s.clone();
            let mut energy_ms = sample.energy_mj.map(|_| t.time_ms);
            if energy_ms.is_none()
                && let Some(p) = &previous
            {
                sample.energy_mj = p.sample.energy_mj;
                energy_ms = p.energy_ms;
            }
            node.gpus.insert(
                id,
                LiveGpu {
                    time_ms: t.time_ms,
                    sample,
                    processes,
                    health: previous.and_then(|l| l.health),
                    energy_ms,
                },
            );
        }
        // After the samples of this tick, so a GPU first seen in it has its entry.
        for h in &t.health {
            let Some(live) = gpu_ids
                .get(&h.gpu_uuid)
                .and_then(|id| node.gpus.get_mut(id))
            else {
                continue;
            };
            if live.health.as_ref().is_none_or(|l| l.time_ms < t.time_ms) {
                live.health = Some(LiveHealth {
                    time_ms: t.time_ms,
                    sample: h.clone(),
                });
            }
        }
        if !t.name_failures.is_empty() {
            node.name_failures.clone_from(&t.name_failures);
        }
        if (t.host.is_some() || t.cost.is_some())
            && node.host.as_ref().is_none_or(|h| h.time_ms < t.time_ms)
        {
            // Agents read host metrics every few seconds, so this newest tick may
            // carry only its cost: the host reading is the batch's newest, else the last
            // one kept.
            let last = node.host.take().and_then(|h| h.sample);
            node.host = Some(LiveHost {
                time_ms: t.time_ms,
                sample: ticks.iter().rev().find_map(|u| u.host.clone()).or(last),
                cost: t.cost.clone(),
            });
        }
    }
}

/// Notes events in their GPUs' memories (events of unknown GPUs, node-level events and
/// kinds the judge ignores are skipped), then forgets what is older than
/// [`recent::KEEP_MS`] before the newest event.
fn remember<'a>(
    memory: &mut HashMap<GpuId, GpuMemory>,
    events: impl Iterator<Item = (&'a Event, Option<GpuId>)>,
) {
    let mut newest = None;
    for (e, id) in events {
        let Some(id) = id.filter(|_| recent::remembered(e.kind)) else {
            continue;
        };
        memory.entry(id).or_default().events.note(e);
        newest = newest.max(Some(e.time_ms));
    }
    if let Some(now) = newest {
        for m in memory.values_mut() {
            m.events.prune(now, recent::KEEP_MS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of one tick with `gpus` empty GPU samples (about `gpus` × 0.5 KB).
    fn big_batch(seq: u64, gpus: usize) -> Batch {
        Batch {
            seq,
            ticks: vec![Tick {
                time_ms: 1,
                gpus: vec![GpuSample::default(); gpus],
                ..Tick::default()
            }],
            ..Batch::default()
        }
    }

    #[test]
    fn announcements_held_for_a_subscriber_that_does_not_read_are_bounded_in_bytes() {
        let live = Live::new();
        let mut stuck = live.subscribe();
        let one = batch_bytes(&big_batch(0, 2_000));
        for seq in 0..(2 * ANNOUNCE_BUDGET_BYTES / one) as u64 {
            live.announce(Committed {
                node: "n".into(),
                batch: big_batch(seq, 2_000),
            });
            assert!(
                live.announced_bytes() <= ANNOUNCE_BUDGET_BYTES,
                "{} bytes held after {seq} announcements",
                live.announced_bytes()
            );
        }
        // The subscriber gets every commit, the later ones without their ticks.
        let first = stuck.try_recv().expect("first");
        assert!(!first.partial && first.batch.ticks.len() == 1);
        let mut partial = 0;
        while let Ok(a) = stuck.try_recv() {
            if a.partial {
                assert!(a.batch.ticks.is_empty());
                partial += 1;
            }
        }
        assert!(partial > 0, "the budget was spent");
        drop(first);
        assert_eq!(live.announced_bytes(), 0, "all given back once received");
        live.announce(Committed {
            node: "n".into(),
            batch: big_batch(9, 10),
        });
        assert!(!stuck.try_recv().expect("next").partial, "room again");
    }

    fn record_with_gpu(uuid: &str) -> NodeRecord {
        let mut r = NodeRecord::with_gpus(1, "n", &[(7, uuid)]);
        r.interval_ms = 100;
        r.gpus[0].info.temp_slowdown_c = Some(87);
        r
    }

    #[test]
    fn health_is_seeded_kept_across_ticks_without_it_and_replaced_by_a_newer_one() {
        let uuid = "GPU-h";
        let health = |pending: bool| GpuHealthSample {
            gpu_uuid: uuid.into(),
            remapped_rows_pending: Some(pending),
            ..Default::default()
        };
        let sample = || GpuSample {
            gpu_uuid: uuid.into(),
            ..Default::default()
        };
        let live = Live::new();
        live.seed(
            vec![record_with_gpu(uuid)],
            vec![LatestGpu {
                gpu: GpuId(7),
                time_ms: 10,
                sample: sample(),
                processes: Vec::new(),
            }],
            Vec::new(),
            vec![LatestHealth {
                gpu: GpuId(7),
                time_ms: 5,
                sample: health(false),
            }],
        );
        let now = |live: &Live| {
            live.read(|s| {
                let (node, id) = s.find_gpu(uuid).expect("gpu");
                let g = &node.gpus[&id];
                (
                    g.time_ms,
                    g.health.as_ref().map(|h| (h.time_ms, h.sample.clone())),
                )
            })
        };
        assert_eq!(now(&live), (10, Some((5, health(false)))), "seeded");
        let mut followed = record_with_gpu(uuid);
        followed.last_seen_ms = Some(30);
        let tick = |time_ms, health: Vec<GpuHealthSample>| Tick {
            time_ms,
            gpus: vec![sample()],
            health,
            ..Tick::default()
        };
        live.followed(&followed, &[tick(20, Vec::new()), tick(30, Vec::new())]);
        assert_eq!(now(&live), (30, Some((5, health(false)))), "kept");
        live.followed(
            &followed,
            &[tick(40, vec![health(true)]), tick(50, Vec::new())],
        );
        assert_eq!(now(&live), (50, Some((40, health(true)))), "newer one");
        live.followed(&followed, &[tick(35, vec![health(false)])]);
        assert_eq!(
            now(&live),
            (50, Some((40, health(true)))),
            "older one ignored"
        );
        let thresholds = live.read(|s| s.nodes["n"].record.gpus[0].info.temp_slowdown_c);
        assert_eq!(
            thresholds,
            Some(87),
            "thresholds reachable from the inventory"
        );
    }

    /// An agent reads the energy counter every few seconds: the latest sample keeps the
    /// newest reading across ticks without one, from this batch or an earlier one.
    #[test]
    fn the_newest_energy_reading_is_kept_across_ticks_without_one() {
        let uuid = "GPU-e";
        let live = Live::new();
        live.seed(
            vec![record_with_gpu(uuid)],
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let tick = |time_ms, energy_mj: Option<u64>| Tick {
            time_ms,
            gpus: vec![GpuSample {
                gpu_uuid: uuid.into(),
                power_mw: Some(1),
                energy_mj,
                ..Default::default()
            }],
            ..Tick::default()
        };
        let mut followed = record_with_gpu(uuid);
        followed.last_seen_ms = Some(100);
        let now = |live: &Live| {
            live.read(|s| {
                let (node, id) = s.find_gpu(uuid).expect("gpu");
                let g = &node.gpus[&id];
                (g.time_ms, g.sample.energy_mj, g.energy_ms)
            })
        };
        live.followed(
            &followed,
            &[tick(10, Some(500)), tick(20, Some(700)), tick(30, None)],
        );
        assert_eq!(now(&live), (30, Some(700), Some(20)), "from the same batch");
        live.followed(&followed, &[tick(40, None), tick(50, None)]);
        assert_eq!(
            now(&live),
            (50, Some(700), Some(20)),
            "from an earlier batch"
        );
        live.followed(&followed, &[tick(60, Some(900)), tick(70, None)]);
        assert_eq!(now(&live), (70, Some(900), Some(60)), "a newer reading");
    }

    #[test]
    fn the_judges_memory_is_seeded_and_filled_by_followed_ticks() {
        use gpufleet_core::EventKind;
        let uuid = "GPU-m";
        let event = |time_ms, kind, code, gpu: &str| Event {
            time_ms,
            gpu_uuid: gpu.into(),
            kind,
            code,
            detail: String::new(),
        };
        let live = Live::new();
        live.seed(
            vec![record_with_gpu(uuid)],
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        live.seed_events(
            "n",
            &[
                event(1, EventKind::Xid, Some(79), uuid),
                event(2, EventKind::Xid, Some(79), "GPU-elsewhere"),
                event(3, EventKind::SpoolDrop, None, ""),
            ],
        );
        let memory = |live: &Live| {
            live.read(|s| {
                let m = &s.nodes["n"].memory[&GpuId(7)];
                let mut seen: Vec<_> = m
                    .events
                    .entries()
                    .iter()
                    .map(|e| (e.kind, e.code, e.count))
                    .collect();
                seen.sort_by_key(|e| e.0.as_str());
                (seen, m.pcie_replays.rise(30, recent::COUNTER_WINDOW_MS))
            })
        };
        assert_eq!(
            memory(&live),
            (vec![(EventKind::Xid, Some(79), 1)], None),
            "seeded: only this node's GPU, only the kinds the judge reads"
        );
        // Another collector committed ticks with an ECC event and rising PCIe replays.
        let mut followed = record_with_gpu(uuid);
        followed.last_seen_ms = Some(30);
        let tick = |time_ms, replays, events| Tick {
            time_ms,
            health: vec![GpuHealthSample {
                gpu_uuid: uuid.into(),
                pcie_replay_count: Some(replays),
                ..Default::default()
            }],
            events,
            ..Tick::default()
        };
        live.followed(
            &followed,
            &[
                tick(
                    20,
                    100,
                    vec![event(20, EventKind::EccDoubleBit, None, uuid)],
                ),
                tick(30, 104, Vec::new()),
            ],
        );
        assert_eq!(
            memory(&live),
            (
                vec![
                    (EventKind::EccDoubleBit, None, 1),
                    (EventKind::Xid, Some(79), 1)
                ],
                Some(4)
            )
        );
    }

    #[test]
    fn a_lost_gpu_that_answers_after_a_reboot_or_a_hello_is_ok_again() {
        use crate::health::{HealthPolicy, HealthState, judge_gpu};
        use gpufleet_core::EventKind;
        let uuid = "GPU-m";
        let live = Live::new();
        live.seed(
            vec![record_with_gpu(uuid)],
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        let state = |live: &Live| {
            live.read(|s| {
                let n = &s.nodes["n"];
                let g = &n.record.gpus[0];
                let h = judge_gpu(
                    &crate::health::gpu_signals(n, g, 1_000),
                    &HealthPolicy::default(),
                    1_000,
                );
                (
                    h.state,
                    h.reasons.iter().map(|r| r.code.clone()).collect::<Vec<_>>(),
                )
            })
        };
        let sample = |temp: Option<u32>| GpuSample {
            gpu_uuid: uuid.into(),
            temp_gpu_c: temp,
            ..Default::default()
        };
        let tick = |time_ms, gpus, events| Tick {
            time_ms,
            gpus,
            events,
            ..Tick::default()
        };
        let mut followed = record_with_gpu(uuid);
        followed.last_seen_ms = Some(110);
        live.followed(
            &followed,
            &[
                tick(90, vec![sample(Some(50))], Vec::new()),
                tick(
                    100,
                    vec![sample(None)],
                    vec![Event {
                        time_ms: 100,
                        gpu_uuid: uuid.into(),
                        kind: EventKind::GpuLost,
                        code: None,
                        detail: String::new(),
                    }],
                ),
                tick(110, vec![sample(None)], Vec::new()),
            ],
        );
        assert_eq!(
            state(&live),
            (HealthState::Critical, vec!["gpu_lost".to_owned()]),
            "a reading from before the loss, and empty ones after it, do not recover it"
        );
        // The node rebooted; its new agent sends samples with readings, never a recovery.
        followed.last_seen_ms = Some(200);
        live.followed(&followed, &[tick(200, vec![sample(Some(40))], Vec::new())]);
        assert_eq!(state(&live), (HealthState::Ok, Vec::new()), "answers again");

        // An Xid before a new Hello (agent restart, driver reload) is cleared by it.
        followed.last_seen_ms = Some(300);
        live.followed(
            &followed,
            &[tick(
                300,
                vec![sample(Some(40))],
                vec![Event {
                    time_ms: 300,
                    gpu_uuid: uuid.into(),
                    kind: EventKind::Xid,
                    code: Some(79),
                    detail: String::new(),
                }],
            )],
        );
        assert_eq!(state(&live).0, HealthState::Critical);
        let mut hello = record_with_gpu(uuid);
        hello.last_hello_ms = 400;
        live.connected(hello);
        assert_eq!(
            state(&live),
            (HealthState::Ok, Vec::new()),
            "reset by the Hello"
        );
    }

    #[test]
    fn ticks_with_only_a_cost_keep_the_last_host_reading() {
        let host = |load: f32| {
            Some(HostSample {
                load1: Some(load),
                ..HostSample::default()
            })
        };
        let tick = |time_ms, host| Tick {
            time_ms,
            host,
            cost: Some(SamplerCost::default()),
            ..Tick::default()
        };
        let mut node = LiveNode {
            record: NodeRecord {
                gpus: Vec::new(),
                ..record_with_gpu("")
            },
            connections: 0,
            rejected_batches: 0,
            host: None,
            gpus: HashMap::new(),
            memory: HashMap::new(),
            name_failures: Vec::new(),
        };
        let ids = UuidMap::default();
        apply_ticks(
            &mut node,
            &ids,
            &[tick(1, host(1.0)), tick(2, None), tick(3, None)],
        );
        let h = node.host.as_ref().expect("host");
        assert_eq!(
            (h.time_ms, h.sample.as_ref().and_then(|s| s.load1)),
            (3, Some(1.0))
        );
        apply_ticks(&mut node, &ids, &[tick(4, None)]);
        let h = node.host.as_ref().expect("host");
        assert_eq!(
            (h.time_ms, h.sample.as_ref().and_then(|s| s.load1)),
            (4, Some(1.0))
        );
        apply_ticks(&mut node, &ids, &[tick(5, host(2.0)), tick(6, None)]);
        let h = node.host.as_ref().expect("host");
        assert_eq!(h.sample.as_ref().and_then(|s| s.load1), Some(2.0));
    }
}
