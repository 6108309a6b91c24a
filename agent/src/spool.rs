//! The on-disk spool: an [`Outbox`] that survives agent crashes and restarts.
//!
//! Every tick is appended to the spool **before** it can be sent, as one record in an
//! append-only segment file (`seg-<first tick id>.log`):
//!
//! ```text
//! record = len: u32 LE | crc32c(payload): u32 LE | payload
//! payload = tick id: u64 LE | protobuf gpufleet.v1.Tick
//! ```
//!
//! Tick ids only grow. Batches are formed from consecutive unacked ticks when there is a
//! session to send them on (like [`MemoryQueue`](gpufleet_uplink::queue::MemoryQueue)); their seqs
//! come from a persisted reservation, so a restarted agent never reuses a seq.
//!
//! The payload's tick bytes are the encoded tick the sampler produced
//! ([`EncodedTick`]): the spool keeps them in memory while held (up to [`CACHE_BYTES`];
//! beyond, it reads them back from the segment) and hands them to the uplink as they
//! are — nothing is decoded or re-encoded on the way out.
//!
//! **Trimmed only on ack.** When the oldest held ticks are all acked (or dropped), the
//! watermark (`meta.json`: last trimmed tick id and the counters of everything trimmed)
//! moves in memory. It is persisted lazily — rewritten atomically (temp file, fsync,
//! rename) at most every [`META_EVERY`], before wholly trimmed segments are deleted, and on
//! close — by [`Outbox::maintain`], which the sampling thread calls, so no ack costs a
//! file rewrite. A watermark older than the acks (after a crash) costs a resend of what
//! the collector already holds, never a loss: its writes are idempotent. The collector's `Welcome.last_acked_seq` trims nothing: it is the highest seq
//! the collector committed, not a contiguous watermark, so it only places new seqs above it.
//!
//! **Recovery.** On open, segments are read in order; records at or below the watermark are
//! skipped; a record whose length or checksum is wrong (a crash mid-write) ends its
//! segment: the file is truncated there, with a warning. Everything else is unacked and is
//! sent again, oldest first.
//!
//! **Full** (more than `max_bytes` on disk): the oldest segment is dropped and its unacked
//! GPU samples are counted as dropped (and persisted with the watermark, so the count
//! survives restarts). A batch that had ticks in it is dropped whole. A segment with a
//! batch in flight is kept until that batch is answered (so "dropped" means "not
//! stored"); the bound is then exceeded by at most the in-flight window.
//!
//! **Counters** are over the spool's lifetime, across restarts: `sampled` is every GPU
//! sample that reached the spool; `sampled == acked + dropped + unacked` at all times.

use gpufleet_core::wire::{Limits, decode_batch};
use gpufleet_core::{DeliveryStats, Tick};
use gpufleet_proto::v1 as pb;
use gpufleet_uplink::encoded::{EncodedTick, OutBatch, wire_bytes};
use gpufleet_uplink::queue::{BatchLimits, Outbox, Summary};
use prost::Message;
use prost::bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;
use tracing::{error, info, warn};

/// Default bound on the spool's size: 1 GiB. A tick of 8 simulated GPUs with their
/// processes is at most 2.8 KiB on disk, so 24 h at 1 Hz is 233 MiB; 1 GiB holds about
/// 4 days (checked by a test, which requires at least 2 days).
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// Record header: length and checksum.
const HEADER: usize = 8;
/// Largest record accepted on read (a longer length field is corruption).
const MAX_RECORD: usize = 64 << 20;
/// Seqs reserved per write of `meta.json`.
const SEQ_BLOCK: u64 = 1024;
/// Longest time the persisted watermark lags behind the acks (unless a segment is
/// deleted sooner, which persists it first).
pub const META_EVERY: Duration = Duration::from_secs(30);
/// Most bytes of held ticks kept in memory for sending; older ones are read back from
/// their segment (a backlog after an outage).
pub const CACHE_BYTES: usize = 4 << 20;
/// The checksum (CRC-32C).
const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// When the spool calls fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FsyncPolicy {
    /// After every appended tick and every watermark update (an ack survives power loss).
    #[default]
    Batch,
    /// At most once a second (a power cut loses at most the last second).
    Interval,
    /// Never; the OS writes back (survives process crashes, not power loss).
    Never,
}

/// The spool settings for node `node`: `dir`, else the default one under the state dir
/// (`<state dir>/spool/<node>`).
pub fn config_for(
    node: &str,
    dir: Option<PathBuf>,
    max_bytes: u64,
    fsync: FsyncPolicy,
) -> SpoolConfig {
    let dir = dir.unwrap_or_else(|| {
        gpufleet_core::config::default_state_dir()
            .join("spool")
            .join(spool_dir_name(node))
    });
    SpoolConfig {
        dir,
        max_bytes,
        fsync,
    }
}

/// A directory name for `node`'s default spool that stays inside the spool folder:
/// letters, digits, `-`, `_` and `.` are kept; anything else (a `/`, `..`, spaces) is
/// replaced, and a hash of the original name is appended so two names never share a spool.
fn spool_dir_name(node: &str) -> String {
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe == node && !node.is_empty() && !node.starts_with('.') {
        return safe;
    }
    // FNV-1a: stable across runs and versions (unlike std's hasher).
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("node-{}-{hash:016x}", safe.trim_start_matches('.'))
}

/// Where and how the spool lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolConfig {
    /// Its directory (created if missing; locked while open).
    pub dir: PathBuf,
    /// Most bytes of segment files.
    pub max_bytes: u64,
    /// The fsync policy.
    pub fsync: FsyncPolicy,
}

/// Why the spool could not be opened.
#[derive(Debug, Error)]
pub enum SpoolError {
    /// A file operation failed.
    #[error("spool {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Another process holds the spool.
    #[error("spool {0} is in use by another agent (each agent needs its own --spool-dir)")]
    Locked(PathBuf),
    /// `meta.json` cannot be read.
    #[error(
        "spool {path}: unreadable meta.json ({reason}); move the directory away to start afresh"
    )]
    Meta {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What survives in `meta.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    /// Every tick id up to this one is trimmed (acked or dropped).
    trimmed_through: u64,
    /// GPU samples trimmed because acked.
    acked_samples: u64,
    /// GPU samples trimmed because dropped.
    dropped_samples: u64,
    /// Seqs below this may have been used; a restarted agent starts here.
    seq_reserved: u64,
    /// Batches settled (acked or dropped) above the watermark, out of order: `(first tick
    /// id, last tick id, acked)`. Applied on open; removed once trimmed.
    #[serde(default)]
    settled: Vec<(u64, u64, bool)>,
}

/// A tick's delivery state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not in a batch yet.
    Pending,
    /// In the batch with this seq.
    Batched,
    /// Acked; trimmed once everything older is gone.
    Acked,
    /// Dropped (counted); trimmed likewise.
    Dropped,
}

/// A tick held in the spool.
#[derive(Debug, Clone)]
struct Entry {
    /// Its id (increasing).
    id: u64,
    /// The segment file holding it (its first tick id).
    seg: u64,
    /// Offset of its payload in the segment.
    offset: u64,
    /// Payload length.
    len: u32,
    /// GPU samples in it.
    samples: u64,
    /// Its size in a batch message.
    wire_bytes: usize,
    /// The encoded tick, while held and within [`CACHE_BYTES`]; else read from the segment.
    bytes: Option<Bytes>,
    /// Delivery state.
    state: State,
}

/// A batch formed and not yet acked: a run of consecutive tick ids.
#[derive(Debug, Clone)]
struct HeldBatch {
    /// Its seq.
    seq: u64,
    /// First tick id.
    lo: u64,
    /// Last tick id.
    hi: u64,
    /// GPU samples in it.
    samples: u64,
    /// Sent in the current session.
    sent: bool,
}

/// A segment file.
#[derive(Debug)]
struct Segment {
    /// First tick id it may hold (its name).
    first: u64,
    /// Its size.
    bytes: u64,
}

/// The on-disk [`Outbox`]. See the module docs.
#[derive(Debug)]
pub struct Spool {
    cfg: SpoolConfig,
    /// Rotation size of a segment.
    segment_bytes: u64,
    /// The lock on `dir/lock`, held while open.
    _lock: File,
    /// Segments, oldest first; the last one is appended to.
    segments: VecDeque<Segment>,
    /// The open last segment.
    active: File,
    /// Held ticks, by id.
    entries: VecDeque<Entry>,
    /// Batches, by seq (and so by tick id).
    batches: VecDeque<HeldBatch>,
    /// Next tick id.
    next_id: u64,
    /// Next batch seq.
    next_seq: u64,
    /// Persisted state.
    meta: Meta,
    /// Counters (`unacked` included).
    counts: Summary,
    /// Ticks pending or batched (not acked, not dropped); ticks without GPUs count too.
    live: usize,
    /// Last fsync of the active segment (for [`FsyncPolicy::Interval`]).
    last_sync: Instant,
    /// Appended since the last fsync.
    dirty: bool,
    /// The watermark or counters moved since `meta.json` was written.
    meta_dirty: bool,
    /// When `meta.json` was last written.
    meta_written: Instant,
    /// Trimmed segments (first tick ids) to delete once the watermark is persisted.
    doomed: Vec<u64>,
    /// Bytes of tick payloads held in memory (`Entry::bytes`).
    cached: usize,
    /// The record being appended (reused, so a tick costs no allocation here).
    record: Vec<u8>,
}

fn seg_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("seg-{first:020}.log"))
}

/// Writes the record of tick `id` with encoded tick `tick` into `rec` (cleared first).
fn encode_record(rec: &mut Vec<u8>, id: u64, tick: &[u8]) {
    let id = id.to_le_bytes();
    let mut crc = CRC.digest();
    crc.update(&id);
    crc.update(tick);
    rec.clear();
    rec.extend_from_slice(&((id.len() + tick.len()) as u32).to_le_bytes());
    rec.extend_from_slice(&crc.finalize().to_le_bytes());
    rec.extend_from_slice(&id);
    rec.extend_from_slice(tick);
}

/// Decodes a record's payload (after its checksum matched). `Err` carries the tick id and
/// GPU samples of a record that does not convert (counted as dropped).
fn decode_payload(payload: &[u8]) -> Result<(u64, Tick), (u64, u64)> {
    let id = payload
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or((0, 0))?;
    let t = pb::Tick::decode(payload.get(8..).unwrap_or_default()).map_err(|_| (id, 0))?;
    let samples = t.gpus.len() as u64;
    let limits = Limits {
        max_future_skew_ms: i64::MAX / 4,
        max_age_ms: i64::MAX / 4,
        ..Limits::default()
    };
    let b = pb::Batch {
        seq: 1,
        ticks: vec![t],
        delivery: None,
    };
    let mut batch = decode_batch(b, &limits, 0, &|_| true).map_err(|_| (id, samples))?;
    batch.ticks.pop().map(|t| (id, t)).ok_or((id, samples))
}

/// A record read back while scanning a segment.
struct Scanned {
    id: u64,
    offset: u64,
    len: u32,
    /// The tick, or the GPU samples of a record that does not convert.
    tick: Result<Tick, u64>,
}

/// Reads every valid record of a segment; returns them and the length of the valid prefix.
fn scan_segment(path: &Path) -> Result<(Vec<Scanned>, u64, u64), SpoolError> {
    let mut data = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(io_err(path))?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + HEADER <= data.len() {
        let len = u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize;
        let crc = u32::from_le_bytes([data[at + 4], data[at + 5], data[at + 6], data[at + 7]]);
        let start = at + HEADER;
        if len > MAX_RECORD || start + len > data.len() {
            break;
        }
        let payload = &data[start..start + len];
        if CRC.checksum(payload) != crc {
            break;
        }
        let (id, tick) = match decode_payload(payload) {
            Ok((id, t)) => (id, Ok(t)),
            Err((0, _)) => break,
            Err((id, samples)) => (id, Err(samples)),
        };
        out.push(Scanned {
            id,
            offset: start as u64,
            len: len as u32,
            tick,
        });
        at = start + len;
    }
    Ok((out, at as u64, data.len() as u64))
}

fn fsync_dir(dir: &Path) {
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        warn!(dir = %dir.display(), error = %e, "cannot fsync the spool directory");
    }
}

impl Spool {
    /// Opens (or creates) the spool in `cfg.dir`, recovering what a previous run left.
    pub fn open(cfg: SpoolConfig) -> Result<Self, SpoolError> {
        let dir = cfg.dir.clone();
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        if lock.try_lock().is_err() {
            return Err(SpoolError::Locked(dir));
        }
        let meta_path = dir.join("meta.json");
        let meta: Meta = match fs::read(&meta_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| SpoolError::Meta {
                path: meta_path.clone(),
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(io_err(&meta_path)(e)),
        };
        let mut firsts = Vec::new();
        for ent in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let ent = ent.map_err(io_err(&dir))?;
            let name = ent.file_name();
            let name = name.to_string_lossy();
            if let Some(n) = name
                .strip_prefix("seg-")
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                firsts.push(n);
            }
        }
        firsts.sort_unstable();
        let mut segments = VecDeque::new();
        let mut entries = VecDeque::new();
        let mut next_id = meta.trimmed_through + 1;
        let mut unacked = 0u64;
        let mut bad = 0u64;
        let mut settled_acked = 0u64;
        for first in firsts {
            let path = seg_path(&dir, first);
            let (records, valid, total) = scan_segment(&path)?;
            if valid < total {
                warn!(segment = %path.display(), valid_bytes = valid, total_bytes = total,
                      "spool segment has a torn or corrupt tail (a crash mid-write?); truncating it");
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(valid).and_then(|()| f.sync_all()))
                    .map_err(io_err(&path))?;
            }
            let live: Vec<Scanned> = records
                .into_iter()
                .filter(|r| r.id > meta.trimmed_through && r.id >= next_id)
                .collect();
            if live.is_empty() {
                let _ = fs::remove_file(&path);
                continue;
            }
            for r in live {
                next_id = r.id + 1;
                let wire = wire_bytes((r.len as usize).saturating_sub(8));
                let (samples, wire_bytes, state) = match &r.tick {
                    Ok(t) => (t.gpus.len() as u64, wire, State::Pending),
                    Err(samples) => {
                        warn!(
                            tick = r.id,
                            dropped_samples = samples,
                            "spooled tick does not convert; dropping it"
                        );
                        bad += samples;
                        (*samples, 0, State::Dropped)
                    }
                };
                let state = match meta
                    .settled
                    .iter()
                    .find(|(lo, hi, _)| (*lo..=*hi).contains(&r.id))
                {
                    Some((_, _, true)) if state == State::Pending => {
                        settled_acked += samples;
                        State::Acked
                    }
                    Some((_, _, false)) if state == State::Pending => {
                        bad += samples;
                        State::Dropped
                    }
                    _ => state,
                };
                if state == State::Pending {
                    unacked += samples;
                }
                entries.push_back(Entry {
                    id: r.id,
                    seg: first,
                    offset: r.offset,
                    len: r.len,
                    samples,
                    wire_bytes,
                    bytes: None,
                    state,
                });
            }
            segments.push_back(Segment {
                first,
                bytes: valid,
            });
        }
        let segment_bytes = (cfg.max_bytes / 16).clamp(4096, 64 << 20);
        let live = entries
            .iter()
            .filter(|e: &&Entry| e.state == State::Pending)
            .count();
        let mut spool = Spool {
            segment_bytes,
            _lock: lock,
            active: Self::create_segment(&dir, next_id)?,
            segments,
            entries,
            batches: VecDeque::new(),
            next_id,
            next_seq: meta.seq_reserved.max(1),
            meta: meta.clone(),
            counts: Summary {
                sampled: meta.acked_samples + meta.dropped_samples + bad + settled_acked + unacked,
                acked: meta.acked_samples + settled_acked,
                dropped: meta.dropped_samples + bad,
                unacked,
            },
            live,
            last_sync: Instant::now(),
            dirty: false,
            meta_dirty: false,
            meta_written: Instant::now(),
            doomed: Vec::new(),
            cached: 0,
            record: Vec::new(),
            cfg,
        };
        spool.segments.push_back(Segment {
            first: next_id,
            bytes: 0,
        });
        spool.reserve_seq();
        spool.trim();
        spool.maintain();
        info!(spool = %dir.display(), unacked_samples = unacked, ticks = spool.entries.len(),
              dropped_samples = meta.dropped_samples, "spool opened");
        Ok(spool)
    }

    fn create_segment(dir: &Path, first: u64) -> Result<File, SpoolError> {
        let path = seg_path(dir, first);
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        fsync_dir(dir);
        Ok(f)
    }

    /// Bytes of segment files.
    pub fn disk_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    fn sync_policy(&self) -> bool {
        self.cfg.fsync != FsyncPolicy::Never
    }

    /// Makes sure the next seqs are reserved in `meta.json`.
    fn reserve_seq(&mut self) {
        if self.next_seq >= self.meta.seq_reserved {
            self.meta.seq_reserved = self.next_seq + SEQ_BLOCK;
            self.write_meta();
        }
    }

    /// Rewrites `meta.json` atomically. A failure is logged: the spool still works, but a
    /// restart would resend (never lose) what was trimmed since.
    fn write_meta(&mut self) {
        self.meta_dirty = false;
        self.meta_written = Instant::now();
        let path = self.cfg.dir.join("meta.json");
        let tmp = self.cfg.dir.join("meta.json.tmp");
        let result = (|| -> io::Result<()> {
            let bytes = serde_json::to_vec(&self.meta).map_err(io::Error::other)?;
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            if self.sync_policy() {
                f.sync_all()?;
            }
            fs::rename(&tmp, &path)
        })();
        match result {
            Ok(()) if self.sync_policy() => fsync_dir(&self.cfg.dir),
            Ok(()) => {}
            Err(e) => {
                error!(path = %path.display(), error = %e, "cannot write the spool watermark")
            }
        }
    }

    fn append(&mut self, rec: &[u8]) -> io::Result<u64> {
        let Some(seg) = self.segments.back_mut() else {
            return Err(io::Error::other("no active segment"));
        };
        let offset = seg.bytes;
        self.active.write_all(rec)?;
        seg.bytes += rec.len() as u64;
        self.dirty = true;
        let sync = match self.cfg.fsync {
            FsyncPolicy::Batch => true,
            FsyncPolicy::Interval => self.last_sync.elapsed() >= Duration::from_secs(1),
            FsyncPolicy::Never => false,
        };
        if sync {
            self.active.sync_data()?;
            self.last_sync = Instant::now();
            self.dirty = false;
        }
        Ok(offset)
    }

    fn rotate(&mut self) -> Result<(), SpoolError> {
        if self.dirty && self.sync_policy() {
            let _ = self.active.sync_data();
            self.dirty = false;
        }
        self.active = Self::create_segment(&self.cfg.dir, self.next_id)?;
        self.segments.push_back(Segment {
            first: self.next_id,
            bytes: 0,
        });
        Ok(())
    }

    /// Marks the ticks of held batches overlapping ids `..=hi` dropped, and unbatched ticks
    /// up to `hi` too; counts them.
    fn drop_through(&mut self, hi: u64) {
        let mut upto = hi;
        while self.batches.front().is_some_and(|b| b.lo <= upto) {
            if let Some(b) = self.batches.pop_front() {
                upto = upto.max(b.hi);
            }
        }
        for e in self.entries.iter_mut() {
            if e.id > upto {
                break;
            }
            if matches!(e.state, State::Pending | State::Batched) {
                e.state = State::Dropped;
                Self::release(&mut self.cached, e);
                self.live -= 1;
                self.counts.unacked -= e.samples;
                self.counts.dropped += e.samples;
            }
        }
    }

    /// Trims acked/dropped ticks at the front and moves the watermark (in memory); every
    /// segment but the active one whose ticks are all trimmed is doomed: deleted by
    /// [`Outbox::maintain`] once the watermark is persisted.
    fn trim(&mut self) {
        let before = self.meta.trimmed_through;
        while let Some(e) = self.entries.front() {
            match e.state {
                State::Acked => self.meta.acked_samples += e.samples,
                State::Dropped => self.meta.dropped_samples += e.samples,
                State::Pending | State::Batched => break,
            }
            self.meta.trimmed_through = e.id;
            if let Some(e) = self.entries.pop_front()
                && let Some(b) = e.bytes
            {
                self.cached -= b.len();
            }
        }
        if self.meta.trimmed_through == before {
            return;
        }
        let through = self.meta.trimmed_through;
        self.meta.settled.retain(|(_, hi, _)| *hi > through);
        self.meta_dirty = true;
        while self.segments.len() > 1 {
            let next_first = self.segments[1].first;
            if next_first > self.meta.trimmed_through + 1 {
                break;
            }
            if let Some(s) = self.segments.pop_front() {
                self.doomed.push(s.first);
            }
        }
    }

    /// Persists the watermark, then deletes the doomed segments.
    fn persist(&mut self) {
        self.write_meta();
        for first in std::mem::take(&mut self.doomed) {
            let path = seg_path(&self.cfg.dir, first);
            if let Err(e) = fs::remove_file(&path) {
                warn!(segment = %path.display(), error = %e, "cannot delete a trimmed spool segment");
            }
        }
    }

    /// Forgets the in-memory copy of a settled tick.
    fn release(cached: &mut usize, e: &mut Entry) {
        if let Some(b) = e.bytes.take() {
            *cached -= b.len();
        }
    }

    /// Drops the oldest segment while over the size bound. A segment holding a batch that
    /// is in flight waits for its answer (the collector may be committing it, and a drop
    /// must mean "not stored"): the bound is exceeded by at most the in-flight window.
    fn enforce_bound(&mut self) {
        while self.disk_bytes() > self.cfg.max_bytes && self.segments.len() > 1 {
            let last_id_in_oldest = self.segments[1].first.saturating_sub(1);
            if self
                .batches
                .iter()
                .take_while(|b| b.lo <= last_id_in_oldest)
                .any(|b| b.sent)
            {
                return;
            }
            let before = self.counts.dropped;
            self.drop_through(last_id_in_oldest);
            let dropped = self.counts.dropped - before;
            warn!(
                dropped_samples = dropped,
                total_dropped = self.counts.dropped,
                max_bytes = self.cfg.max_bytes,
                "spool full: dropped the oldest samples"
            );
            let first = self.segments[0].first;
            self.trim();
            // trim() dooms it when everything in it is gone; it is, unless acks of
            // later ticks are missing — then it goes now.
            if self.segments.front().is_some_and(|s| s.first == first)
                && let Some(s) = self.segments.pop_front()
            {
                self.doomed.push(s.first);
                self.meta_dirty = true;
            }
        }
    }

    /// Reads the encoded tick of `e` back from its segment (no decoding: the checksum was
    /// checked when the segment was opened); `open` caches the segment last opened.
    fn read_payload(&self, e: &Entry, open: &mut Option<(u64, File)>) -> Option<Bytes> {
        let path = seg_path(&self.cfg.dir, e.seg);
        let mut buf = vec![0u8; e.len as usize];
        let read = (|| -> io::Result<()> {
            if open.as_ref().is_none_or(|(seg, _)| *seg != e.seg) {
                *open = Some((e.seg, File::open(&path)?));
            }
            let Some((_, f)) = open.as_mut() else {
                return Err(io::Error::other("segment not open"));
            };
            f.seek(SeekFrom::Start(e.offset))?;
            f.read_exact(&mut buf)
        })();
        if let Err(err) = read {
            error!(segment = %path.display(), tick = e.id, error = %err, "cannot read a spooled tick");
            return None;
        }
        if buf.get(..8) != Some(&e.id.to_le_bytes()[..]) {
            error!(segment = %path.display(), tick = e.id, "a spooled record holds another tick id");
            return None;
        }
        Some(Bytes::from(buf).slice(8..))
    }

    fn index_of(&self, id: u64) -> Option<usize> {
        let front = self.entries.front()?.id;
        let at = usize::try_from(id.checked_sub(front)?).ok()?;
        // Ids are consecutive in `entries`, except across a recovery gap; check.
        match self.entries.get(at) {
            Some(e) if e.id == id => Some(at),
            _ => self.entries.binary_search_by_key(&id, |e| e.id).ok(),
        }
    }

    /// The encoded ticks of `b`, from memory or read back from disk; `None` (then dropped,
    /// counted) if unreadable.
    fn load(&mut self, b: &HeldBatch) -> Option<Vec<Bytes>> {
        let lo = self.index_of(b.lo)?;
        let mut ticks = Vec::new();
        let mut open = None;
        for e in self.entries.range(lo..) {
            if e.id > b.hi {
                break;
            }
            match &e.bytes {
                Some(bytes) => ticks.push(bytes.clone()),
                None => ticks.push(self.read_payload(e, &mut open)?),
            }
        }
        Some(ticks)
    }

    fn stats(&self) -> DeliveryStats {
        DeliveryStats {
            dropped_samples: self.counts.dropped,
            spool_backlog_batches: self.batches.len() as u64,
            spool_backlog_bytes: self.disk_bytes(),
        }
    }

    fn find_batch(&self, seq: u64) -> Option<usize> {
        self.batches.binary_search_by_key(&seq, |b| b.seq).ok()
    }

    fn settle(&mut self, at: usize, state: State) -> Option<u64> {
        let b = self.batches.remove(at)?;
        // A held batch's ticks are never trimmed, so `lo` is found; the counters move
        // regardless.
        let lo = self.index_of(b.lo).unwrap_or(self.entries.len());
        for e in self.entries.range_mut(lo..) {
            if e.id > b.hi {
                break;
            }
            if e.state == State::Batched {
                e.state = state;
                Self::release(&mut self.cached, e);
                self.live -= 1;
            }
        }
        self.counts.unacked -= b.samples;
        match state {
            State::Acked => self.counts.acked += b.samples,
            _ => self.counts.dropped += b.samples,
        }
        self.meta.settled.push((b.lo, b.hi, state == State::Acked));
        self.meta_dirty = true;
        self.trim();
        self.enforce_bound();
        Some(b.samples)
    }
}

impl Drop for Spool {
    /// A clean close persists everything: the watermark and counters are exact on reopen.
    fn drop(&mut self) {
        if self.dirty && self.sync_policy() {
            let _ = self.active.sync_data();
        }
        if self.meta_dirty || !self.doomed.is_empty() {
            self.persist();
        }
    }
}

impl Outbox for Spool {
    fn push_encoded(&mut self, tick: EncodedTick) {
        let samples = tick.samples;
        let mut rec = std::mem::take(&mut self.record);
        encode_record(&mut rec, self.next_id, &tick.bytes);
        if self
            .segments
            .back()
            .is_some_and(|s| s.bytes > 0 && s.bytes + rec.len() as u64 > self.segment_bytes)
            && let Err(e) = self.rotate()
        {
            error!(error = %e, "cannot start a new spool segment; appending to the current one");
        }
        let appended = self.append(&rec);
        self.record = rec;
        match appended {
            Ok(offset) => {
                let len = tick.bytes.len();
                let bytes = (self.cached + len <= CACHE_BYTES).then_some(tick.bytes);
                if bytes.is_some() {
                    self.cached += len;
                }
                self.entries.push_back(Entry {
                    id: self.next_id,
                    seg: self.segments.back().map_or(0, |s| s.first),
                    offset: offset + HEADER as u64,
                    len: (len + 8) as u32,
                    samples,
                    wire_bytes: wire_bytes(len),
                    bytes,
                    state: State::Pending,
                });
                self.next_id += 1;
                self.live += 1;
                self.counts.sampled += samples;
                self.counts.unacked += samples;
                self.enforce_bound();
            }
            Err(e) => {
                // Not in the spool: it cannot be delivered. Counted as sampled and dropped,
                // persisted with the next watermark.
                error!(error = %e, dropped_samples = samples, "cannot append to the spool; tick dropped");
                self.counts.sampled += samples;
                self.counts.dropped += samples;
                self.meta.dropped_samples += samples;
                self.write_meta();
            }
        }
    }

    fn maintain(&mut self) {
        if !self.doomed.is_empty() || (self.meta_dirty && self.meta_written.elapsed() >= META_EVERY)
        {
            self.persist();
        }
        if self.dirty
            && self.cfg.fsync == FsyncPolicy::Interval
            && self.last_sync.elapsed() >= Duration::from_secs(1)
        {
            if let Err(e) = self.active.sync_data() {
                warn!(error = %e, "cannot fsync the spool");
            }
            self.last_sync = Instant::now();
            self.dirty = false;
        }
    }

    fn start_session(&mut self, last_acked_seq: u64) {
        self.next_seq = self.next_seq.max(last_acked_seq.saturating_add(1));
        self.reserve_seq();
        for b in &mut self.batches {
            b.sent = false;
        }
        self.enforce_bound();
    }

    fn next_batch(&mut self, limits: BatchLimits, partial: bool) -> Option<OutBatch> {
        loop {
            let stats = self.stats();
            if let Some(at) = self.batches.iter().position(|b| !b.sent) {
                let b = self.batches[at].clone();
                match self.load(&b) {
                    Some(ticks) => {
                        self.batches[at].sent = true;
                        return Some(OutBatch {
                            seq: b.seq,
                            ticks,
                            delivery: stats,
                        });
                    }
                    None => {
                        warn!(seq = b.seq, "spooled batch unreadable; dropping it");
                        self.settle(at, State::Dropped);
                        continue;
                    }
                }
            }
            let start = self
                .entries
                .iter()
                .position(|e| e.state == State::Pending)?;
            let (n, full) = limits.fit(
                self.entries
                    .range(start..)
                    .take_while(|e| e.state == State::Pending)
                    .map(|e| e.wire_bytes),
            );
            if !(full || partial) {
                return None;
            }
            let samples = self
                .entries
                .range(start..start + n)
                .map(|e| e.samples)
                .sum();
            let lo = self.entries[start].id;
            let hi = self.entries[start + n - 1].id;
            for e in self.entries.range_mut(start..start + n) {
                e.state = State::Batched;
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            self.reserve_seq();
            self.batches.push_back(HeldBatch {
                seq,
                lo,
                hi,
                samples,
                sent: false,
            });
        }
    }

    fn ack(&mut self, seq: u64) -> bool {
        match self.find_batch(seq) {
            Some(at) => self.settle(at, State::Acked).is_some(),
            None => false,
        }
    }

    fn reject(&mut self, seq: u64, retryable: bool) -> Option<u64> {
        let at = self.find_batch(seq)?;
        if retryable {
            self.batches[at].sent = false;
            return Some(self.batches[at].samples);
        }
        self.settle(at, State::Dropped)
    }

    fn in_flight(&self) -> usize {
        self.batches.iter().filter(|b| b.sent).count()
    }

    fn is_empty(&self) -> bool {
        self.live == 0
    }

    fn waiting(&self) -> bool {
        self.entries
            .back()
            .is_some_and(|e| e.state == State::Pending)
    }

    fn summary(&self) -> Summary {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_cannot_move_the_default_spool_out_of_its_folder() {
        assert_eq!(spool_dir_name("gpu-node-01.lab"), "gpu-node-01.lab");
        for hostile in [
            "../../etc",
            "/abs/path",
            "a/b",
            "..",
            ".",
            "",
            "</script> x",
        ] {
            let name = spool_dir_name(hostile);
            assert!(name.starts_with("node-"), "{hostile:?} -> {name:?}");
            assert!(!name.contains('/') && !name.contains(' ') && !name.starts_with('.'));
            let dir = std::path::Path::new("/state/spool").join(&name);
            assert_eq!(
                dir.parent(),
                Some(std::path::Path::new("/state/spool")),
                "{hostile:?}"
            );
        }
        assert_ne!(
            spool_dir_name("a/b"),
            spool_dir_name("a_b"),
            "distinct names, distinct spools"
        );
    }
    use gpufleet_core::GpuSample;
    use proptest::prelude::*;

    const LIMITS: BatchLimits = BatchLimits {
        max_ticks: 100,
        max_bytes: 4 << 20,
    };
    const ONE: BatchLimits = BatchLimits {
        max_ticks: 1,
        max_bytes: 4 << 20,
    };

    fn tick(ms: i64, gpus: usize) -> Tick {
        Tick {
            time_ms: 1_790_000_000_000 + ms,
            gpus: (0..gpus)
                .map(|g| GpuSample {
                    gpu_uuid: format!("GPU-{g}"),
                    power_mw: Some(100_000 + ms as u32),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn cfg(dir: &Path, max_bytes: u64) -> SpoolConfig {
        SpoolConfig {
            dir: dir.to_owned(),
            max_bytes,
            fsync: FsyncPolicy::Never,
        }
    }

    fn holds(s: &Spool) {
        let c = s.summary();
        assert_eq!(c.sampled, c.acked + c.dropped + c.unacked, "{c:?}");
    }

    fn segments(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(dir)
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_string_lossy().ends_with(".log"))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn unacked_ticks_survive_a_restart_and_acked_ones_do_not_come_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let seqs;
        {
            let mut s = Spool::open(cfg(dir.path(), 1 << 20)).expect("open");
            for i in 0..10 {
                s.push(tick(i, 2));
            }
            s.start_session(0);
            let b1 = s
                .next_to_send(BatchLimits {
                    max_ticks: 4,
                    ..LIMITS
                })
                .expect("b1");
            let b2 = s
                .next_to_send(BatchLimits {
                    max_ticks: 4,
                    ..LIMITS
                })
                .expect("b2");
            assert_eq!((b1.seq, b2.seq), (1, 2));
            assert_eq!(
                b1.decoded(),
                (0..4).map(|i| tick(i, 2)).collect::<Vec<_>>(),
                "read back exactly"
            );
            assert!(s.ack(1));
            assert!(!s.ack(1), "a second ack is ignored");
            seqs = b2.seq;
            holds(&s);
            // Dropped without an ack for seq 2: a crash.
        }
        let mut s = Spool::open(cfg(dir.path(), 1 << 20)).expect("reopen");
        assert_eq!(
            s.summary(),
            Summary {
                sampled: 20,
                acked: 8,
                dropped: 0,
                unacked: 12
            },
            "counts persist across restarts"
        );
        s.start_session(0);
        let b = s.next_to_send(LIMITS).expect("replay");
        assert!(
            b.seq > seqs,
            "a restarted spool never reuses a seq: {} <= {seqs}",
            b.seq
        );
        assert_eq!(
            b.decoded(),
            (4..10).map(|i| tick(i, 2)).collect::<Vec<_>>(),
            "oldest first, nothing lost"
        );
        assert!(s.ack(b.seq));
        assert!(s.is_empty());
        assert_eq!(s.summary().acked, 20);
        drop(s);
        let s = Spool::open(cfg(dir.path(), 1 << 20)).expect("reopen");
        assert_eq!(
            s.summary(),
            Summary {
                sampled: 20,
                acked: 20,
                dropped: 0,
                unacked: 0
            }
        );
    }

    /// A copy of the spool's files as a crash would leave them (the original stays open).
    fn crash_copy(from: &Path, to: &Path) {
        for e in fs::read_dir(from).expect("dir") {
            let p = e.expect("entry").path();
            if p.file_name().is_some_and(|n| n != "lock") {
                fs::copy(&p, to.join(p.file_name().expect("name"))).expect("copy");
            }
        }
    }

    #[test]
    fn acks_rewrite_no_file_and_a_crash_before_the_lazy_watermark_resends_never_loses() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Spool::open(cfg(dir.path(), 1 << 20)).expect("open");
        for i in 0..4 {
            s.push(tick(i, 2));
        }
        s.maintain();
        let meta = dir.path().join("meta.json");
        let before = fs::read(&meta).expect("meta.json");
        let seqs: Vec<u64> = std::iter::from_fn(|| s.next_to_send(ONE))
            .map(|b| b.seq)
            .collect();
        assert!(s.ack(seqs[0]) && s.ack(seqs[1]));
        s.maintain();
        assert_eq!(
            fs::read(&meta).expect("meta.json"),
            before,
            "acks and the next ticks rewrite no watermark"
        );

        // A crash now: the two acked ticks come back and are sent again (the collector
        // ignores them), nothing is lost and the counters add up.
        let crashed = tempfile::tempdir().expect("tempdir");
        crash_copy(dir.path(), crashed.path());
        let mut c = Spool::open(cfg(crashed.path(), 1 << 20)).expect("reopen");
        assert_eq!(
            c.summary(),
            Summary {
                sampled: 8,
                acked: 0,
                dropped: 0,
                unacked: 8
            }
        );
        let resent = c.next_to_send(LIMITS).expect("resent");
        assert_eq!(
            resent.decoded(),
            (0..4).map(|i| tick(i, 2)).collect::<Vec<_>>()
        );
        drop(c);

        // Once the watermark is due, the next housekeeping persists it.
        s.meta_written -= META_EVERY;
        s.maintain();
        let later = tempfile::tempdir().expect("tempdir");
        crash_copy(dir.path(), later.path());
        let l = Spool::open(cfg(later.path(), 1 << 20)).expect("reopen");
        assert_eq!(l.summary().acked, 4, "the acks are persisted");
        assert_eq!(l.summary().unacked, 4);
    }

    #[test]
    fn the_welcome_watermark_trims_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Spool::open(cfg(dir.path(), 1 << 20)).expect("open");
        for i in 0..3 {
            s.push(tick(i, 1));
            s.next_to_send(ONE).expect("batch");
        }
        // Seq 1 refused as retryable; 2 committed, its ack lost; the stream broke.
        assert_eq!(s.reject(1, true), Some(1));
        s.start_session(2);
        assert_eq!(s.summary().acked, 0);
        let seqs: Vec<u64> = std::iter::from_fn(|| s.next_to_send(LIMITS))
            .map(|b| b.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3], "seq 1 is resent, not trimmed");
        s.push(tick(9, 1));
        assert!(s.next_to_send(LIMITS).is_some_and(|b| b.seq > 3));
        holds(&s);
    }

    #[test]
    fn a_torn_tail_is_truncated_and_the_rest_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut s = Spool::open(cfg(dir.path(), 1 << 20)).expect("open");
            for i in 0..5 {
                s.push(tick(i, 2));
            }
        }
        let seg = segments(dir.path()).pop().expect("a segment");
        let len = fs::metadata(&seg).expect("meta").len();
        // A crash mid-write: the last record is cut short.
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .expect("open")
            .set_len(len - 7)
            .expect("cut");
        let mut s = Spool::open(cfg(dir.path(), 1 << 20)).expect("a torn tail is not fatal");
        assert_eq!(s.summary().unacked, 8, "four whole ticks remain");
        assert!(
            fs::metadata(&seg).expect("meta").len() < len - 7,
            "truncated to the valid prefix"
        );
        let b = s.next_to_send(LIMITS).expect("batch");
        assert_eq!(b.decoded(), (0..4).map(|i| tick(i, 2)).collect::<Vec<_>>());
        s.push(tick(5, 2));
        assert!(s.ack(b.seq));
        drop(s);
        let s = Spool::open(cfg(dir.path(), 1 << 20)).expect("reopen");
        assert_eq!(s.summary().unacked, 2, "appending after recovery works");
    }

    #[test]
    fn a_corrupt_record_ends_its_segment_without_failing_the_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let mut s = Spool::open(cfg(dir.path(), 1 << 20)).expect("open");
            for i in 0..5 {
                s.push(tick(i, 1));
            }
        }
        let seg = segments(dir.path()).pop().expect("a segment");
        let mut data = fs::read(&seg).expect("read");
        let rec = data.len() / 5;
        data[rec * 2 + HEADER + 10] ^= 0xff; // a bit flip inside the third record
        fs::write(&seg, &data).expect("write");
        let s = Spool::open(cfg(dir.path(), 1 << 20)).expect("corruption is not fatal");
        assert_eq!(
            s.summary().unacked,
            2,
            "records before the bad one are kept"
        );
        holds(&s);
    }

    #[test]
    fn when_full_the_oldest_are_dropped_counted_and_the_count_persists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let max = 16 << 10;
        let dropped;
        {
            let mut s = Spool::open(cfg(dir.path(), max)).expect("open");
            for i in 0..400 {
                s.push(tick(i, 4));
                assert!(s.disk_bytes() <= max + 4096, "bounded: {}", s.disk_bytes());
                holds(&s);
            }
            let c = s.summary();
            assert!(c.dropped > 0 && c.unacked > 0, "{c:?}");
            assert_eq!(c.sampled, 1600);
            dropped = c.dropped;
            let b = s.next_to_send(LIMITS).expect("batch");
            let first = b.decoded()[0].time_ms - 1_790_000_000_000;
            assert_eq!(first as u64 * 4, dropped, "exactly the oldest ticks went");
            assert_eq!(
                b.delivery.dropped_samples, dropped,
                "the collector hears about drops"
            );
        }
        let s = Spool::open(cfg(dir.path(), max)).expect("reopen");
        assert_eq!(s.summary().dropped, dropped, "drops survive a restart");
        assert_eq!(s.summary().sampled, 1600);
    }

    #[test]
    fn a_batch_in_flight_is_not_dropped_for_space_until_answered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let max = 16 << 10;
        let mut s = Spool::open(cfg(dir.path(), max)).expect("open");
        s.push(tick(0, 4));
        let b = s.next_to_send(LIMITS).expect("in flight");
        for i in 1..400 {
            s.push(tick(i, 4));
        }
        assert!(
            s.disk_bytes() > max,
            "over the bound while seq {} is in flight: {} bytes",
            b.seq,
            s.disk_bytes()
        );
        assert!(s.ack(b.seq), "still held: its ack counts");
        assert_eq!(s.summary().acked, 4);
        assert!(s.disk_bytes() <= max + 4096, "bound restored after the ack");
        assert!(s.summary().dropped > 0);
        holds(&s);
    }

    #[test]
    fn one_agent_per_spool() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _a = Spool::open(cfg(dir.path(), 1 << 20)).expect("open");
        let err = Spool::open(cfg(dir.path(), 1 << 20)).expect_err("locked");
        assert!(err.to_string().contains("in use"), "{err}");
    }

    #[test]
    fn the_default_bound_holds_a_day_of_eight_gpus_at_one_hertz() {
        use gpufleet_core::GpuSource;
        let mut sim =
            gpufleet_sim::simulator(gpufleet_sim::SimOptions::new("size", 8)).expect("sim");
        let mut t = 1_790_000_000_000;
        let mut biggest = 0;
        for _ in 0..200 {
            t += 1000;
            let tick = sim.sample(t).expect("tick");
            let mut rec = Vec::new();
            encode_record(&mut rec, u64::MAX, &EncodedTick::new(tick).bytes);
            biggest = biggest.max(rec.len() as u64);
        }
        let day = 86_400 * biggest;
        eprintln!("8 simulated GPUs: largest record {biggest} B, 24 h at 1 Hz = {day} B");
        assert!(
            DEFAULT_MAX_BYTES >= 2 * day,
            "a day is {day} bytes; the default must hold two"
        );
    }

    proptest! {
        // Each case writes files; 64 cases keep it to a few seconds.
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn counts_always_add_up_across_restarts(
            ops in proptest::collection::vec((0u8..7, 0u64..20), 1..200),
            max in 4096u64..20_000,
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let mut s = Spool::open(cfg(dir.path(), max)).expect("open");
            let mut t = 0;
            let mut seqs = Vec::new();
            for (op, arg) in ops {
                match op {
                    0 | 1 => { t += 1; s.push(tick(t, (arg % 4) as usize)); }
                    2 => if let Some(b) = s.next_to_send(BatchLimits { max_ticks: 1 + arg as usize, max_bytes: 1 << 20 }) {
                        prop_assert!(!b.ticks.is_empty());
                        seqs.push(b.seq);
                    },
                    3 => if !seqs.is_empty() { s.ack(seqs[arg as usize % seqs.len()]); },
                    4 => if !seqs.is_empty() { s.reject(seqs[arg as usize % seqs.len()], arg % 2 == 0); },
                    5 => s.start_session(arg),
                    _ => {
                        let before = s.summary();
                        drop(s);
                        s = Spool::open(cfg(dir.path(), max)).expect("reopen");
                        let after = s.summary();
                        // Everything, out-of-order acks and drops included, survives.
                        prop_assert_eq!(after, before);
                        seqs.clear();
                    }
                }
                let c = s.summary();
                prop_assert_eq!(c.sampled, c.acked + c.dropped + c.unacked);
                prop_assert_eq!(
                    s.is_empty(),
                    s.entries.iter().all(|e| matches!(e.state, State::Acked | State::Dropped))
                );
                if s.in_flight() == 0 {
                    prop_assert!(s.disk_bytes() <= max + 4096, "bounded when nothing is in flight");
                }
            }
        }
    }
}
