//! The group commit, written once ([`SqlStore::write_rounds`]): its rows collected once
//! ([`collect_rows`]), the sample rows written by the backend, the rest over a [`Table`],
//! and the conflict check that tells replays from conflicts ([`conflicts_of`]).

use super::backend::{Backend, Get, Table, insert_rows, sql};
use super::{BatchConflict, HostRow, NodeBatch, NodeId, SqlStore, StoreError, WriteOutcome, rows};
use gpufleet_core::{
    DeliveryStats, Event, GpuHealthSample, GpuSample, HostSample, ProcessSample, SamplerCost,
    UnixMs, Workload,
};
use std::collections::{BTreeMap, HashMap, HashSet};

pub mod sent;

pub use sent::{GpuRow, HostTick, NodeUpdate, ProcessRow, Samples, Written};

/// One distinct workload of a write.
pub struct WorkloadSlot<'b> {
    pub workload: &'b Workload,
    /// The first tick it appears in (recorded as `first_seen_ms` for a new workload).
    pub first_ms: UnixMs,
    /// Its id: from the cache, or from the upsert.
    pub id: Option<i64>,
}

/// A process lifetime as `process_lives` keys it: the process (GPU, pid) and its identity.
/// A pid reused by another command, or a process seen in another workload, is another
/// lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LifeKey {
    pub gpu: i64,
    pub pid: u32,
    pub workload: i64,
    pub process_type: i16,
    pub user: Option<String>,
    pub command: Option<String>,
    pub mig_uuid: Option<String>,
}

/// One distinct process lifetime of a write.
pub struct LifeSlot<'b> {
    pub gpu: i64,
    /// Its workload's index in [`Collected::workloads`].
    pub workload: usize,
    /// Its first process sample in the write (the identity fields are what count).
    pub p: &'b ProcessSample,
    /// The first tick it appears in (`first_ms` of a new lifetime).
    pub first_ms: UnixMs,
    /// Its id: from the cache, or from the upsert.
    pub id: Option<i64>,
}

/// A process sample's lifetime before workload ids are known, for finding the lifetimes
/// of a write: GPU id, workload slot and the identity fields of the sample.
struct LifeRef<'b> {
    gpu: i64,
    workload: usize,
    p: &'b ProcessSample,
}

impl LifeRef<'_> {
    fn fields(&self) -> impl PartialEq + std::hash::Hash + '_ {
        let p = self.p;
        (
            self.gpu,
            self.workload,
            p.pid,
            p.process_type,
            &p.user,
            &p.command,
            &p.mig_uuid,
        )
    }
}

impl PartialEq for LifeRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl Eq for LifeRef<'_> {}

impl std::hash::Hash for LifeRef<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.fields().hash(state);
    }
}

/// Whether two samples of one process (same position in consecutive ticks) have the same
/// identity, so the same lifetime (their workloads were compared already).
fn same_life(a: &ProcessSample, b: &ProcessSample) -> bool {
    a.gpu_uuid == b.gpu_uuid
        && a.pid == b.pid
        && a.process_type == b.process_type
        && a.user == b.user
        && a.command == b.command
        && a.mig_uuid == b.mig_uuid
}

/// An event of a write, with its node's and GPU's ids.
pub(crate) struct EventRow<'b> {
    node: i64,
    gpu: Option<i64>,
    e: &'b Event,
}

/// A health sample of a write, with its GPU's id and its tick's time.
pub(crate) struct HealthRow<'b> {
    gpu: i64,
    ts: UnixMs,
    h: &'b GpuHealthSample,
}

/// The rows of one write.
pub(crate) struct Collected<'b> {
    pub samples: Samples<'b>,
    /// One per node, in node id order.
    pub nodes: Vec<NodeUpdate>,
    pub workloads: Vec<WorkloadSlot<'b>>,
    pub lives: Vec<LifeSlot<'b>>,
    pub events: Vec<EventRow<'b>>,
    pub health: Vec<HealthRow<'b>>,
}

/// Every row of one write (without the `skip`ped batches), grouped by node in id order
/// (a node's batches keep their order); workloads are numbered once each, with their ids
/// from `cache` where known.
pub(crate) fn collect_rows<'b>(
    batches: &'b [NodeBatch],
    skip: &HashSet<usize>,
    cache: &HashMap<Workload, i64>,
) -> Result<Collected<'b>, StoreError> {
    let mut order: Vec<usize> = (0..batches.len()).filter(|i| !skip.contains(i)).collect();
    order.sort_by_key(|&i| batches[i].keys.id);
    let mut out = Collected {
        samples: Samples::default(),
        nodes: Vec::new(),
        workloads: Vec::new(),
        lives: Vec::new(),
        events: Vec::new(),
        health: Vec::new(),
    };
    let ticks = order.iter().flat_map(|&i| &batches[i].batch.ticks);
    let (gpus, processes) = ticks.fold((0, 0), |(g, p), t| {
        (g + t.gpus.len(), p + t.processes.len())
    });
    out.samples.gpu.reserve(gpus);
    out.samples.process.reserve(processes);
    let mut distinct: HashMap<&'b Workload, usize> = HashMap::new();
    let mut distinct_lives: HashMap<LifeRef<'b>, usize> = HashMap::new();
    // Per position in the previous and the current tick: (workload slot, life slot).
    type Slots = Vec<(usize, usize)>;
    let (mut prev_slots, mut slots): (Slots, Slots) = (Vec::new(), Vec::new());
    for group in order.chunk_by(|&a, &b| batches[a].keys.id == batches[b].keys.id) {
        let keys = &batches[group[0]].keys;
        let g = out.nodes.len();
        let mut update = NodeUpdate {
            id: keys.id.0,
            newest_ms: i64::MIN,
            seq: 0,
            delivery: DeliveryStats::default(),
            inserted: 0,
        };
        for &i in group {
            let batch = &batches[i].batch;
            if batch.seq >= update.seq {
                update.seq = batch.seq;
                update.delivery = batch.delivery;
            }
            let gpu_id = |uuid: &str| {
                keys.gpus
                    .get(uuid)
                    .map(|g| g.0)
                    .ok_or_else(|| StoreError::UnknownGpu {
                        node: keys.name.clone(),
                        seq: batch.seq,
                        uuid: uuid.to_owned(),
                    })
            };
            // Processes usually repeat tick after tick: comparing with the process at the
            // same position in the previous tick avoids hashing the workload.
            let mut prev: &[ProcessSample] = &[];
            for t in &batch.ticks {
                update.newest_ms = update.newest_ms.max(t.time_ms);
                for s in &t.gpus {
                    let (gpu, ts) = (gpu_id(&s.gpu_uuid)?, t.time_ms);
                    out.samples.gpu.push(GpuRow {
                        group: g,
                        gpu,
                        ts,
                        s,
                    });
                }
                slots.clear();
                for (j, p) in t.processes.iter().enumerate() {
                    let (gpu, ts) = (gpu_id(&p.gpu_uuid)?, t.time_ms);
                    let (workload, life) = match prev.get(j) {
                        Some(q) if q.workload == p.workload && same_life(q, p) => prev_slots[j],
                        same => {
                            let workload = match same {
                                Some(q) if q.workload == p.workload => prev_slots[j].0,
                                _ => *distinct.entry(&p.workload).or_insert_with(|| {
                                    out.workloads.push(WorkloadSlot {
                                        workload: &p.workload,
                                        first_ms: ts,
                                        id: cache.get(&p.workload).copied(),
                                    });
                                    out.workloads.len() - 1
                                }),
                            };
                            let life = LifeRef { gpu, workload, p };
                            let life = *distinct_lives.entry(life).or_insert_with(|| {
                                out.lives.push(LifeSlot {
                                    gpu,
                                    workload,
                                    p,
                                    first_ms: ts,
                                    id: None,
                                });
                                out.lives.len() - 1
                            });
                            (workload, life)
                        }
                    };
                    slots.push((workload, life));
                    (out.samples.process).push(ProcessRow {
                        gpu,
                        ts,
                        slot: life,
                        life: 0,
                        p,
                    });
                }
                prev = &t.processes;
                std::mem::swap(&mut prev_slots, &mut slots);
                if t.host.is_some() || t.cost.is_some() {
                    let (node, ts) = (keys.id.0, t.time_ms);
                    out.samples.host.push(HostTick { node, ts, tick: t });
                }
                for e in &t.events {
                    let gpu = if e.gpu_uuid.is_empty() {
                        None
                    } else {
                        Some(gpu_id(&e.gpu_uuid)?)
                    };
                    let node = keys.id.0;
                    out.events.push(EventRow { node, gpu, e });
                }
                for h in &t.health {
                    let (gpu, ts) = (gpu_id(&h.gpu_uuid)?, t.time_ms);
                    out.health.push(HealthRow { gpu, ts, h });
                }
            }
        }
        out.nodes.push(update);
    }
    Ok(out)
}

/// A collected workload's id, once the upsert gave it one.
pub(crate) fn workload_id(slot: &WorkloadSlot<'_>) -> Result<i64, StoreError> {
    slot.id
        .ok_or_else(|| StoreError::Corrupt(format!("workload {} has no id", slot.workload.key())))
}

/// What a committed write reports: GPU samples inserted per node.
pub(crate) fn outcome(nodes: &[NodeUpdate]) -> WriteOutcome {
    let mut outcome = WriteOutcome::default();
    for node in nodes {
        *outcome
            .inserted_gpu_samples
            .entry(NodeId(node.id))
            .or_default() += node.inserted;
    }
    outcome
}

impl<DB: Backend> SqlStore<DB> {
    /// A group commit: one transaction per round, until one commits. A round may fall back
    /// to the backend's slower way of writing samples, or find that skipped rows were not
    /// all replays and redo the write checking conflicts first (leaving out the batches
    /// that conflict): only a concurrent writer could make the checked rounds repeat.
    pub(crate) async fn write_rounds(
        &self,
        batches: &[NodeBatch],
    ) -> Result<WriteOutcome, StoreError> {
        let (mut fallback, mut checked) = (false, false);
        let mut skip = HashSet::new();
        let mut conflicts = Vec::new();
        // The first round's rows are collected before its transaction, outside the write
        // turn (on SQLite one writer at a time); a later round collects again.
        let mut first = Some(collect_rows(batches, &skip, &self.cached_workloads())?);
        let closed_before = self.closed_before();
        for _ in 0..=MAX_WRITE_ROUNDS {
            let mut tx = self.begin_write("begin a write transaction").await?;
            // Packed minutes this write falls in become rows again before anything is
            // compared or inserted, except closed minutes of process ticks (held).
            let held =
                super::packing::reopen_minutes::<DB>(tx.conn(), batches, &skip, closed_before)
                    .await?;
            if checked {
                let stored = held.gpu_samples().map(|(k, s)| (k, s.clone())).collect();
                let found = conflicts_of::<DB>(tx.conn(), batches, &skip, None, stored).await?;
                skip.extend(found.iter().map(|c| c.index));
                conflicts.extend(found);
            }
            let Collected {
                mut samples,
                mut nodes,
                mut workloads,
                mut lives,
                events,
                health,
            } = match first.take() {
                Some(rows) => rows,
                None => collect_rows(batches, &skip, &self.cached_workloads())?,
            };
            upsert_workloads::<DB>(tx.conn(), &mut workloads).await?;
            let keys = life_keys(&lives, &workloads)?;
            {
                let cache = self.cached_lives();
                for (slot, key) in lives.iter_mut().zip(&keys) {
                    slot.id = cache.get(key).copied();
                }
            }
            let new_lives = upsert_lives::<DB>(tx.conn(), &mut lives, &keys).await?;
            for r in &mut samples.process {
                r.life = lives[r.slot].id.ok_or_else(|| {
                    StoreError::Corrupt("a process lifetime has no id after upsert".into())
                })?;
            }
            let arrived =
                super::arrival::pack_arriving::<DB>(tx.conn(), &mut samples, held, closed_before)
                    .await?;
            let (mut skipped, mut gpus) =
                match DB::write_samples(tx.conn(), &samples, &mut nodes, fallback).await? {
                    Written::Rows { skipped, gpus } => (skipped, gpus),
                    Written::Fallback => {
                        tx.rollback().await?;
                        fallback = true;
                        continue;
                    }
                };
            for (group, n) in &arrived.inserted {
                if let Some(node) = nodes.get_mut(*group) {
                    node.inserted += n;
                }
            }
            if !arrived.repeated.is_empty() {
                skipped = true;
                if let Some(gpus) = gpus.as_mut() {
                    gpus.extend(arrived.repeated_gpus());
                }
            }
            if skipped
                && !conflicts_of::<DB>(tx.conn(), batches, &skip, gpus.as_ref(), arrived.repeated)
                    .await?
                    .is_empty()
            {
                // Some skipped rows were not replays: decide which batches conflict before
                // inserting, in a new transaction.
                tx.rollback().await?;
                checked = true;
                continue;
            }
            insert_events::<DB>(tx.conn(), &events).await?;
            insert_health::<DB>(tx.conn(), &health).await?;
            update_nodes::<DB>(tx.conn(), &nodes).await?;
            tx.commit("commit").await?;
            self.cache_workloads(workloads.iter().map(|s| (s.workload, s.id)));
            self.cache_lives(new_lives);
            let mut outcome = outcome(&nodes);
            outcome.conflicts = conflicts;
            return Ok(outcome);
        }
        Err(StoreError::Corrupt(
            "conflicting GPU samples kept appearing while writing; nothing was written".into(),
        ))
    }
}

/// Upserts the workloads that have no id yet (one row per key, in key order so that
/// concurrent collectors lock rows alike) and fills their ids in. Variants of one
/// workload (names learned later) share a key and are merged as row-by-row upserts
/// would: the first variant's identity, the latest names.
async fn upsert_workloads<DB: Backend>(
    conn: &mut DB::Connection,
    slots: &mut [WorkloadSlot<'_>],
) -> Result<(), StoreError> {
    let mut by_key: BTreeMap<String, (Workload, UnixMs)> = BTreeMap::new();
    for s in slots.iter().filter(|s| s.id.is_none()) {
        let (w, first) = by_key
            .entry(s.workload.key())
            .or_insert_with(|| (s.workload.clone(), s.first_ms));
        w.merge_names(s.workload);
        *first = (*first).min(s.first_ms);
    }
    if by_key.is_empty() {
        return Ok(());
    }
    let w = || by_key.values().map(|(w, _)| w);
    let table = Table::default()
        .text("key", by_key.keys().cloned())
        .text("kind", w().map(|w| w.kind.as_str().to_owned()))
        .text("runtime", w().map(|w| w.runtime.clone()))
        .text("container_id", w().map(|w| w.container_id.clone()))
        .text("pod_uid", w().map(|w| w.pod_uid.clone()))
        .text("qos", w().map(|w| w.qos.clone()))
        .text("job_id", w().map(|w| w.job_id.clone()))
        .text("step", w().map(|w| w.step.clone()))
        .text("unit", w().map(|w| w.unit.clone()))
        .int("uid", w().map(|w| w.uid.map(i64::from)))
        .text("container_name", w().map(|w| w.container_name.clone()))
        .text("image", w().map(|w| w.image.clone()))
        .text("pod_name", w().map(|w| w.pod_name.clone()))
        .text("namespace", w().map(|w| w.namespace.clone()))
        .text("job_name", w().map(|w| w.job_name.clone()))
        .text("account", w().map(|w| w.account.clone()))
        .text("partition", w().map(|w| w.partition.clone()))
        .text("job_user", w().map(|w| w.job_user.clone()))
        .text("array_task", w().map(|w| w.array_task.clone()))
        .text("het_component", w().map(|w| w.het_component.clone()))
        .text("labels", w().map(|w| labels_json(&w.labels)))
        .int("first_seen_ms", by_key.values().map(|(_, t)| *t));
    let d = DB::DIALECT;
    let rows = sql::<DB>(
        "upsert workloads",
        format!(
            "INSERT INTO workloads ({names}) SELECT {names} FROM {} WHERE true ORDER BY v.o \
             ON CONFLICT (key) DO UPDATE SET \
             container_name = coalesce(excluded.container_name, workloads.container_name), \
             image = coalesce(excluded.image, workloads.image), \
             pod_name = coalesce(excluded.pod_name, workloads.pod_name), \
             namespace = coalesce(excluded.namespace, workloads.namespace), \
             job_name = coalesce(excluded.job_name, workloads.job_name), \
             account = coalesce(excluded.account, workloads.account), \
             partition = coalesce(excluded.partition, workloads.partition), \
             job_user = coalesce(excluded.job_user, workloads.job_user), \
             array_task = coalesce(excluded.array_task, workloads.array_task), \
             het_component = coalesce(excluded.het_component, workloads.het_component), \
             labels = coalesce(excluded.labels, workloads.labels), \
             first_seen_ms = {} RETURNING id, key",
            d.over(&table, "v"),
            d.least("workloads.first_seen_ms", "excluded.first_seen_ms"),
            names = table.names(),
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    // Rows come back in no particular order: match them by key.
    let mut ids: HashMap<String, i64> = HashMap::with_capacity(rows.len());
    for row in &rows {
        ids.insert(row.get("key")?, row.get("id")?);
    }
    for s in slots.iter_mut().filter(|s| s.id.is_none()) {
        let key = s.workload.key();
        s.id = Some(*ids.get(&key).ok_or_else(|| {
            StoreError::Corrupt(format!("workload {key} has no id after upsert"))
        })?);
    }
    Ok(())
}

/// A workload's labels as stored: a JSON object, `None` when there are none (so an
/// upsert without labels keeps the stored ones).
fn labels_json(labels: &BTreeMap<String, String>) -> Option<String> {
    (!labels.is_empty()).then(|| serde_json::to_string(labels).unwrap_or_default())
}

/// The lifetime key of every slot, once its workload has an id.
fn life_keys(
    lives: &[LifeSlot<'_>],
    workloads: &[WorkloadSlot<'_>],
) -> Result<Vec<LifeKey>, StoreError> {
    lives
        .iter()
        .map(|l| {
            Ok(LifeKey {
                gpu: l.gpu,
                pid: l.p.pid,
                workload: workload_id(&workloads[l.workload])?,
                process_type: rows::process_type(l.p.process_type),
                user: l.p.user.clone(),
                command: l.p.command.clone(),
                mig_uuid: l.p.mig_uuid.clone(),
            })
        })
        .collect()
}

/// Upserts the lifetimes that have no id yet (one row per key, in key order so that
/// concurrent collectors lock rows alike) and fills their ids in; returns the new keys
/// and ids, to be cached once the write commits. Slots whose workloads turned out to be
/// one (a variant with names learned later) share a key, so a row.
async fn upsert_lives<DB: Backend>(
    conn: &mut DB::Connection,
    slots: &mut [LifeSlot<'_>],
    keys: &[LifeKey],
) -> Result<Vec<(LifeKey, i64)>, StoreError> {
    let mut first: BTreeMap<&LifeKey, UnixMs> = BTreeMap::new();
    for (slot, key) in slots.iter().zip(keys).filter(|(s, _)| s.id.is_none()) {
        let t = first.entry(key).or_insert(slot.first_ms);
        *t = (*t).min(slot.first_ms);
    }
    if first.is_empty() {
        return Ok(Vec::new());
    }
    let k = || first.keys();
    let table = Table::default()
        .int("gpu_id", k().map(|k| k.gpu))
        .int("pid", k().map(|k| i64::from(k.pid)))
        .int("workload_id", k().map(|k| k.workload))
        .int("process_type", k().map(|k| i64::from(k.process_type)))
        .text("user_name", k().map(|k| k.user.clone()))
        .text("command", k().map(|k| k.command.clone()))
        .text("mig_uuid", k().map(|k| k.mig_uuid.clone()))
        .int("first_ms", first.values().copied());
    let d = DB::DIALECT;
    let rows = sql::<DB>(
        "upsert process lifetimes",
        format!(
            "INSERT INTO process_lives (ident, {names}) SELECT {}, {names} FROM {}              WHERE true ORDER BY v.o              ON CONFLICT (gpu_id, pid, ident) DO UPDATE SET first_ms = {}              RETURNING id, gpu_id, pid, workload_id, process_type, user_name, command, mig_uuid",
            d.process_ident("v"),
            d.over(&table, "v"),
            d.least("process_lives.first_ms", "excluded.first_ms"),
            names = table.names(),
        ),
    )
    .bind_table(table)
    .all(&mut *conn)
    .await?;
    // Rows come back in no particular order: match them by identity.
    let mut ids: HashMap<LifeKey, i64> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let process_type: i64 = row.get("process_type")?;
        let key = LifeKey {
            gpu: row.get("gpu_id")?,
            pid: row.get("pid")?,
            workload: row.get("workload_id")?,
            process_type: i16::try_from(process_type).map_err(|_| {
                StoreError::Corrupt(format!("process_lives.process_type {process_type}"))
            })?,
            user: row.get("user_name")?,
            command: row.get("command")?,
            mig_uuid: row.get("mig_uuid")?,
        };
        ids.insert(key, row.get("id")?);
    }
    let mut new = Vec::with_capacity(ids.len());
    for (slot, key) in slots.iter_mut().zip(keys).filter(|(s, _)| s.id.is_none()) {
        let id = *ids.get(key).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "process {} on GPU {} has no lifetime after upsert",
                key.pid, key.gpu
            ))
        })?;
        slot.id = Some(id);
        new.push((key.clone(), id));
    }
    Ok(new)
}

/// Inserts a write's events (ids follow the batches' order: reads order by time, then id).
async fn insert_events<DB: Backend>(
    conn: &mut DB::Connection,
    events: &[EventRow<'_>],
) -> Result<(), StoreError> {
    let table = Table::default()
        .int("node_id", events.iter().map(|r| r.node))
        .int("ts_ms", events.iter().map(|r| r.e.time_ms))
        .int("gpu_id", events.iter().map(|r| r.gpu))
        .text("kind", events.iter().map(|r| r.e.kind.as_str().to_owned()))
        .int("code", events.iter().map(|r| r.e.code.map(rows::to_i64)))
        .text("detail", events.iter().map(|r| r.e.detail.clone()));
    let tail = "ORDER BY v.o ON CONFLICT DO NOTHING";
    insert_rows::<DB>(conn, "insert events", "events", table, tail).await?;
    Ok(())
}

/// Inserts a write's health samples. A replay is skipped: a health row at a stored
/// (GPU, time) key comes only with the GPU sample of the same tick, whose replay or
/// conflict the sample check already decided.
async fn insert_health<DB: Backend>(
    conn: &mut DB::Connection,
    health: &[HealthRow<'_>],
) -> Result<(), StoreError> {
    let count = |f: fn(&GpuHealthSample) -> Option<u64>| {
        // Validated to be at most 2^53 (`core::wire`), so the value fits.
        health
            .iter()
            .map(move |r| f(r.h).map(|v| i64::try_from(v).unwrap_or(i64::MAX)))
    };
    let rows =
        |f: fn(&GpuHealthSample) -> Option<u32>| health.iter().map(move |r| f(r.h).map(i64::from));
    let flag = |f: fn(&GpuHealthSample) -> Option<bool>| health.iter().map(move |r| f(r.h));
    let table = Table::default()
        .int("gpu_id", health.iter().map(|r| r.gpu))
        .int("ts_ms", health.iter().map(|r| r.ts))
        .int("retired_pages_sbe", rows(|h| h.retired_pages_sbe))
        .int("retired_pages_dbe", rows(|h| h.retired_pages_dbe))
        .flag("retired_pages_pending", flag(|h| h.retired_pages_pending))
        .int(
            "remapped_rows_correctable",
            rows(|h| h.remapped_rows_correctable),
        )
        .int(
            "remapped_rows_uncorrectable",
            rows(|h| h.remapped_rows_uncorrectable),
        )
        .flag("remapped_rows_pending", flag(|h| h.remapped_rows_pending))
        .flag("remapped_rows_failed", flag(|h| h.remapped_rows_failed))
        .int(
            "ecc_corrected_aggregate",
            count(|h| h.ecc_corrected_aggregate),
        )
        .int(
            "ecc_uncorrected_aggregate",
            count(|h| h.ecc_uncorrected_aggregate),
        )
        .int("pcie_replay_count", count(|h| h.pcie_replay_count))
        .int("nvlink_crc_errors", count(|h| h.nvlink_crc_errors))
        .int("nvlink_replay_errors", count(|h| h.nvlink_replay_errors))
        .int(
            "nvlink_recovery_errors",
            count(|h| h.nvlink_recovery_errors),
        )
        .flag("persistence_mode", flag(|h| h.persistence_mode));
    let tail = "ORDER BY v.o ON CONFLICT DO NOTHING";
    insert_rows::<DB>(conn, "insert GPU health", "gpu_health", table, tail).await?;
    Ok(())
}

/// Every node's delivery state in one statement (nodes in id order). Right-hand sides see
/// each row as it was before the UPDATE.
async fn update_nodes<DB: Backend>(
    conn: &mut DB::Connection,
    nodes: &[NodeUpdate],
) -> Result<(), StoreError> {
    let col = |f: fn(&NodeUpdate) -> i64| nodes.iter().map(f).collect::<Vec<i64>>();
    let table = Table::default()
        .int("id", col(|n| n.id))
        .int("newest", col(|n| n.newest_ms))
        .int("seq", col(|n| rows::to_i64(n.seq)))
        .int("dropped", col(|n| rows::to_i64(n.delivery.dropped_samples)))
        .int(
            "batches",
            col(|n| rows::to_i64(n.delivery.spool_backlog_batches)),
        )
        .int(
            "bytes",
            col(|n| rows::to_i64(n.delivery.spool_backlog_bytes)),
        )
        .int("inserted", col(|n| rows::to_i64(n.inserted)));
    let (d, newer) = (DB::DIALECT, "v.seq >= nodes.last_acked_seq");
    sql::<DB>(
        "update the nodes' delivery state",
        format!(
            "UPDATE nodes SET last_seen_ms = {}, \
               dropped_samples = CASE WHEN {newer} THEN v.dropped ELSE nodes.dropped_samples END, \
               spool_backlog_batches = CASE WHEN {newer} \
                 THEN v.batches ELSE nodes.spool_backlog_batches END, \
               spool_backlog_bytes = CASE WHEN {newer} \
                 THEN v.bytes ELSE nodes.spool_backlog_bytes END, \
               last_acked_seq = {}, stored_samples = nodes.stored_samples + v.inserted \
             FROM {} WHERE nodes.id = v.id",
            d.greatest("coalesce(nodes.last_seen_ms, v.newest)", "v.newest"),
            d.greatest("nodes.last_acked_seq", "v.seq"),
            d.over(&table, "v"),
        ),
    )
    .bind_table(table)
    .execute(conn)
    .await?;
    Ok(())
}

/// The batches of a write whose GPU samples (of the GPUs in `only`; all when `None`) or
/// host rows conflict with the stored ones ([`find_conflicts`]): every such GPU's and
/// node's rows are read back over the span the write covers; `packed` are the stored
/// samples of packed minutes the write met (see [`super::arrival`]).
pub(crate) async fn conflicts_of<DB: Backend>(
    conn: &mut DB::Connection,
    batches: &[NodeBatch],
    skip: &HashSet<usize>,
    only: Option<&HashSet<i64>>,
    packed: HashMap<(i64, UnixMs), GpuSample>,
) -> Result<Vec<BatchConflict>, StoreError> {
    let mut check = incoming(batches, skip, |gpu| only.is_none_or(|o| o.contains(&gpu)));
    check.stored_gpu.extend(packed);
    for (gpu, from, to) in spans(check.gpu.iter().map(|r| (r.gpu, r.ts))) {
        let stored = sql::<DB>(
            "read back GPU samples",
            "SELECT '' AS gpu_uuid, * FROM gpu_samples \
             WHERE gpu_id = $1 AND ts_ms BETWEEN $2 AND $3",
        )
        .bind(gpu)
        .bind(from)
        .bind(to)
        .all(&mut *conn)
        .await?;
        for row in &stored {
            check
                .stored_gpu
                .insert((gpu, row.get("ts_ms")?), rows::gpu_sample(row)?);
        }
    }
    for (node, from, to) in spans(check.host.iter().map(|r| (r.node, r.ts))) {
        let stored = sql::<DB>(
            "read back host samples",
            "SELECT * FROM host_samples WHERE node_id = $1 AND ts_ms BETWEEN $2 AND $3",
        )
        .bind(node)
        .bind(from)
        .bind(to)
        .all(&mut *conn)
        .await?;
        for row in &stored {
            let host = rows::host(row)?;
            check.stored_host.insert((node, host.time_ms), host);
        }
    }
    Ok(find_conflicts(batches, check))
}

/// One GPU sample a write tried to store, with where it came from: what the conflict
/// check compares with the stored row of the same key.
#[derive(Debug)]
struct IncomingGpuRow<'b> {
    /// Index of its batch in the write.
    pub batch: usize,
    pub gpu: i64,
    pub ts: UnixMs,
    pub sample: &'b GpuSample,
}

/// The GPU samples of `batches` (except the `skip`ped ones) whose GPU id passes `want`,
/// and their host rows, in batch order.
fn incoming<'b>(
    batches: &'b [NodeBatch],
    skip: &HashSet<usize>,
    want: impl Fn(i64) -> bool,
) -> ConflictCheck<'b> {
    let mut out = ConflictCheck::default();
    for (i, nb) in batches
        .iter()
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
    {
        for t in &nb.batch.ticks {
            for s in &t.gpus {
                if let Some(gpu) = nb.keys.gpus.get(&s.gpu_uuid).map(|g| g.0)
                    && want(gpu)
                {
                    let (batch, ts, sample) = (i, t.time_ms, s);
                    out.gpu.push(IncomingGpuRow {
                        batch,
                        gpu,
                        ts,
                        sample,
                    });
                }
            }
            if t.host.is_some() || t.cost.is_some() {
                out.host.push(IncomingHostRow {
                    batch: i,
                    node: nb.keys.id.0,
                    ts: t.time_ms,
                    sample: t.host.clone().filter(|h| *h != HostSample::default()),
                    cost: t.cost.as_ref().filter(|c| {
                        c.cpu_us.is_some()
                            || c.wall_us.is_some()
                            || c.source_us.is_some()
                            || !c.slowest_calls_us.is_empty()
                    }),
                });
            }
        }
    }
    out
}

/// Per series id (GPU or node), the time span of `keys`: what the conflict check reads
/// back.
fn spans(keys: impl Iterator<Item = (i64, UnixMs)>) -> Vec<(i64, UnixMs, UnixMs)> {
    let mut spans: BTreeMap<i64, (UnixMs, UnixMs)> = BTreeMap::new();
    for (id, ts) in keys {
        let span = spans.entry(id).or_insert((ts, ts));
        span.0 = span.0.min(ts);
        span.1 = span.1.max(ts);
    }
    spans.into_iter().map(|(id, (a, b))| (id, a, b)).collect()
}

/// One host row (host metrics and sampler cost of a tick) a write tried to store.
#[derive(Debug)]
struct IncomingHostRow<'b> {
    /// Index of its batch in the write.
    pub batch: usize,
    pub node: i64,
    pub ts: UnixMs,
    /// As the store keeps it: absent when every host metric is absent.
    pub sample: Option<HostSample>,
    /// As the store keeps it: absent when it has no figure.
    pub cost: Option<&'b SamplerCost>,
}

/// What a write's conflict check compares: the rows the write tries to store, and the
/// stored ones with the same keys.
#[derive(Debug, Default)]
struct ConflictCheck<'b> {
    pub gpu: Vec<IncomingGpuRow<'b>>,
    /// By (GPU id, time).
    pub stored_gpu: HashMap<(i64, UnixMs), GpuSample>,
    pub host: Vec<IncomingHostRow<'b>>,
    /// By (node id, time).
    pub stored_host: HashMap<(i64, UnixMs), HostRow>,
}

/// Write rounds before giving up on settling conflicts (a round redoes the write when a
/// concurrent writer stored conflicting rows between its check and its inserts).
pub(crate) const MAX_WRITE_ROUNDS: usize = 4;

/// The batches that conflict, given the stored rows in `check`. Batches are taken in
/// arrival order, as if written one by one: a batch conflicts when one of its GPU samples
/// or host rows differs from the stored one or from one of an earlier accepted batch; an
/// accepted batch's rows join the known ones. Read before the write's inserts this
/// decides; read after them it tells whether every skipped row was a replay (then
/// nothing conflicts).
fn find_conflicts(batches: &[NodeBatch], check: ConflictCheck<'_>) -> Vec<BatchConflict> {
    let ConflictCheck {
        gpu,
        stored_gpu: mut known_gpu,
        host,
        stored_host: mut known_host,
    } = check;
    let mut out: Vec<BatchConflict> = Vec::new();
    let (mut gpu_runs, mut host_runs) = (
        gpu.chunk_by(|a, b| a.batch == b.batch).peekable(),
        host.chunk_by(|a, b| a.batch == b.batch).peekable(),
    );
    loop {
        let next = match (gpu_runs.peek(), host_runs.peek()) {
            (Some(g), Some(h)) => g[0].batch.min(h[0].batch),
            (Some(g), None) => g[0].batch,
            (None, Some(h)) => h[0].batch,
            (None, None) => break,
        };
        let g_run = gpu_runs.next_if(|r| r[0].batch == next).unwrap_or(&[]);
        let h_run = host_runs.next_if(|r| r[0].batch == next).unwrap_or(&[]);
        let gpu_differs = g_run.iter().find(|r| {
            known_gpu.get_mut(&(r.gpu, r.ts)).is_some_and(|s| {
                // A stored row carries no UUID: compare everything else.
                s.gpu_uuid.clone_from(&r.sample.gpu_uuid);
                s != r.sample
            })
        });
        let host_differs = h_run.iter().find(|r| {
            known_host
                .get(&(r.node, r.ts))
                .is_some_and(|s| s.sample != r.sample || s.cost.as_ref() != r.cost)
        });
        let name = &batches[next].keys.name;
        let reason = match (gpu_differs, host_differs) {
            (Some(r), _) => format!(
                "GPU {} at {} ms is already stored with other values (another agent writing \
                 as node {name:?}, or the node's clock went back); a replay must resend what \
                 was sent",
                r.sample.gpu_uuid, r.ts
            ),
            (None, Some(r)) => format!(
                "the host sample of node {name:?} at {} ms is already stored with other \
                 values (another agent writing as the node, or its clock went back); a \
                 replay must resend what was sent",
                r.ts
            ),
            (None, None) => {
                for r in g_run {
                    known_gpu
                        .entry((r.gpu, r.ts))
                        .or_insert_with(|| r.sample.clone());
                }
                for r in h_run {
                    known_host.entry((r.node, r.ts)).or_insert_with(|| HostRow {
                        time_ms: r.ts,
                        sample: r.sample.clone(),
                        cost: r.cost.cloned(),
                    });
                }
                continue;
            }
        };
        out.push(BatchConflict {
            index: next,
            reason,
        });
    }
    out
}
