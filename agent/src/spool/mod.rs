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
//!
//! Layout: `config` (options, errors, the default folder), `record` (the segment
//! record format and its checksum, scanning a segment), `trim` (the watermark, trimming
//! and the size bound), `outbox` (the [`Outbox`] implementation); this module holds the
//! spool's state and opening, appending and rotating.
//!
//! [`EncodedTick`]: gpufleet_uplink::encoded::EncodedTick

mod config;
mod outbox;
mod record;
#[cfg(test)]
mod tests;
mod trim;

pub use config::{ACKED_GRACE, FsyncPolicy, SpoolConfig, SpoolError, config_for};

use config::io_err;
use gpufleet_uplink::encoded::wire_bytes;
use gpufleet_uplink::queue::{Outbox, Summary};
use prost::bytes::Bytes;
use record::{Scanned, fsync_dir, scan_segment, seg_path};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, Instant};
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
    /// Ticks appended to the active segment since its last fsync, with when, oldest first
    /// (for [`FsyncPolicy::Acked`]: fsynced once one is still unacked after
    /// [`config::ACKED_GRACE`]).
    unsynced: VecDeque<(u64, Instant)>,
    /// Bytes at the start of the active segment known to be on disk (fsynced).
    synced_bytes: u64,
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
            unsynced: VecDeque::new(),
            synced_bytes: 0,
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

    /// Appends the record of tick `id` to the active segment; returns its offset.
    fn append(&mut self, id: u64, rec: &[u8], now: Instant) -> io::Result<u64> {
        let Some(seg) = self.segments.back_mut() else {
            return Err(io::Error::other("no active segment"));
        };
        let offset = seg.bytes;
        self.active.write_all(rec)?;
        seg.bytes += rec.len() as u64;
        self.dirty = true;
        let sync = match self.cfg.fsync {
            FsyncPolicy::Acked => {
                self.unsynced.push_back((id, now));
                false
            }
            FsyncPolicy::Batch => true,
            FsyncPolicy::Interval => {
                now.saturating_duration_since(self.last_sync) >= Duration::from_secs(1)
            }
            FsyncPolicy::Never => false,
        };
        if sync {
            self.sync_active(now)?;
        }
        Ok(offset)
    }

    /// Fsyncs the active segment: everything appended to it so far is on disk.
    fn sync_active(&mut self, now: Instant) -> io::Result<()> {
        self.active.sync_data()?;
        self.last_sync = now;
        self.dirty = false;
        self.unsynced.clear();
        self.synced_bytes = self.segments.back().map_or(0, |s| s.bytes);
        Ok(())
    }

    fn rotate(&mut self) -> Result<(), SpoolError> {
        if self.dirty && self.sync_policy() {
            let _ = self.sync_active(Instant::now());
        }
        self.unsynced.clear();
        self.synced_bytes = 0;
        self.active = Self::create_segment(&self.cfg.dir, self.next_id)?;
        self.segments.push_back(Segment {
            first: self.next_id,
            bytes: 0,
        });
        Ok(())
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
