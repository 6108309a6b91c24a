//! The spool as an [`Outbox`]: appending ticks, forming batches from unacked ticks,
//! reading held ticks back, and settling acks and rejects.

use super::config::{ACKED_GRACE, FsyncPolicy};
use super::record::{encode_record, seg_path};
use super::{CACHE_BYTES, Entry, HEADER, HeldBatch, META_EVERY, Spool, State};
use gpufleet_core::DeliveryStats;
use gpufleet_uplink::encoded::{EncodedTick, OutBatch, wire_bytes};
use gpufleet_uplink::queue::{BatchLimits, Outbox, Summary};
use prost::bytes::Bytes;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::time::{Duration, Instant};
use tracing::{error, warn};

impl Spool {
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

    /// Whether tick `id` is still held and neither acked nor dropped.
    fn is_live(&self, id: u64) -> bool {
        self.index_of(id)
            .is_some_and(|at| matches!(self.entries[at].state, State::Pending | State::Batched))
    }

    /// [`Outbox::maintain`] at `now`: persists the watermark when due, and fsyncs what the
    /// policy says is due — under [`FsyncPolicy::Acked`], once the oldest tick appended
    /// since the last fsync and still unacked is [`ACKED_GRACE`] old (one fsync for all
    /// of them; ticks acked sooner need none).
    pub(super) fn maintain_at(&mut self, now: Instant) {
        if !self.doomed.is_empty()
            || (self.meta_dirty && now.saturating_duration_since(self.meta_written) >= META_EVERY)
        {
            self.persist();
        }
        let due = match self.cfg.fsync {
            FsyncPolicy::Acked => loop {
                let Some(&(id, at)) = self.unsynced.front() else {
                    break false;
                };
                if self.is_live(id) {
                    break now.saturating_duration_since(at) >= ACKED_GRACE;
                }
                self.unsynced.pop_front();
            },
            FsyncPolicy::Interval => {
                self.dirty
                    && now.saturating_duration_since(self.last_sync) >= Duration::from_secs(1)
            }
            FsyncPolicy::Batch | FsyncPolicy::Never => false,
        };
        if due && let Err(e) = self.sync_active(now) {
            warn!(error = %e, "cannot fsync the spool");
            self.last_sync = now;
        }
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
        let appended = self.append(self.next_id, &rec, Instant::now());
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
        self.maintain_at(Instant::now());
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
