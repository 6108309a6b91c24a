//! What the health judge remembers of a GPU between ticks: its recent error events
//! ([`RecentEvents`]) and how its error counters moved ([`CounterTrend`]).
//!
//! The live state keeps one [`GpuMemory`] per GPU, fills it after each commit (its own and
//! followed ones) and seeds it from the store's events at start-up. Both parts are bounded:
//! events are folded per (kind, Xid code), at most [`MAX_ENTRIES`] kinds per GPU, each
//! forgotten [`KEEP_MS`] after it last happened (an event noted again, same time, kind
//! and code, as in a replayed batch, is counted once: the last [`MAX_SEEN`] are kept to
//! tell); a trend holds at most
//! [`TREND_POINTS`] points.

use gpufleet_core::{Event, EventKind, GpuHealthSample, UnixMs};
use serde::Serialize;
use std::collections::VecDeque;

/// Most distinct (kind, code) entries remembered per GPU.
pub const MAX_ENTRIES: usize = 64;
/// How long an event is remembered after it last happened (the longest judge window).
pub const KEEP_MS: i64 = 24 * 3_600_000;
/// Most characters of an event's detail kept.
const MAX_DETAIL: usize = 200;

/// One kind of event on a GPU (an Xid code, a double-bit ECC error, GPU lost or recovered),
/// folded: when it first and last happened, and how often.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RecentEvent {
    pub kind: EventKind,
    /// The Xid code for Xid events.
    pub code: Option<u64>,
    pub first_ms: UnixMs,
    pub last_ms: UnixMs,
    pub count: u32,
    /// The newest occurrence's detail (shortened).
    pub detail: String,
}

/// A GPU's recent events, folded per (kind, code).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentEvents {
    entries: Vec<RecentEvent>,
    /// The newest reset that is not an event: the node's latest Hello (an agent restart,
    /// a driver reload, a reboot). Errors before it were cleared.
    reset_ms: Option<UnixMs>,
    /// The newest GPU sample with real readings (power or temperature): a GPU that
    /// answers is no longer lost.
    answered_ms: Option<UnixMs>,
    /// The (time, kind, code) of the last [`MAX_SEEN`] events noted: a batch an agent
    /// sends again (after a lost ack) is not counted twice.
    seen: VecDeque<(UnixMs, EventKind, Option<u64>)>,
}

/// Most events remembered per GPU to recognise one sent again.
pub const MAX_SEEN: usize = 256;

/// Whether the health judge looks at events of this kind.
pub fn remembered(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Xid | EventKind::EccDoubleBit | EventKind::GpuLost | EventKind::GpuRecovered
    )
}

impl RecentEvents {
    /// Remembers `e` (events of other kinds are ignored). When [`MAX_ENTRIES`] kinds are
    /// held, the one that happened least recently is forgotten.
    pub fn note(&mut self, e: &Event) {
        if !remembered(e.kind) {
            return;
        }
        let code = if e.kind == EventKind::Xid {
            e.code
        } else {
            None
        };
        let key = (e.time_ms, e.kind, code);
        if self.seen.contains(&key) {
            return;
        }
        if self.seen.len() >= MAX_SEEN {
            self.seen.pop_front();
        }
        self.seen.push_back(key);
        if let Some(x) = self
            .entries
            .iter_mut()
            .find(|x| x.kind == e.kind && x.code == code)
        {
            x.first_ms = x.first_ms.min(e.time_ms);
            if e.time_ms >= x.last_ms {
                x.last_ms = e.time_ms;
                x.detail = shorten(&e.detail);
            }
            x.count = x.count.saturating_add(1);
            return;
        }
        if self.entries.len() >= MAX_ENTRIES
            && let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, x)| x.last_ms)
                .map(|(i, _)| i)
        {
            self.entries.swap_remove(oldest);
        }
        self.entries.push(RecentEvent {
            kind: e.kind,
            code,
            first_ms: e.time_ms,
            last_ms: e.time_ms,
            count: 1,
            detail: shorten(&e.detail),
        });
    }

    /// Forgets what last happened before `now_ms - keep_ms`, except a GPU-lost event not
    /// followed by a recovery (the GPU is still lost however long ago it went).
    pub fn prune(&mut self, now_ms: UnixMs, keep_ms: i64) {
        let cutoff = now_ms.saturating_sub(keep_ms);
        let still_lost = self.lost_since();
        self.entries.retain(|x| {
            x.last_ms >= cutoff || (x.kind == EventKind::GpuLost && still_lost.is_some())
        });
    }

    /// Notes a reset at `time_ms` that is not an event (the node said Hello again: the
    /// agent restarted, the driver was reloaded or the node rebooted).
    pub fn note_reset(&mut self, time_ms: UnixMs) {
        self.reset_ms = self.reset_ms.max(Some(time_ms));
    }

    /// Notes a GPU sample with real readings taken at `time_ms`: the GPU answers.
    pub fn note_answered(&mut self, time_ms: UnixMs) {
        self.answered_ms = self.answered_ms.max(Some(time_ms));
    }

    /// When the GPU was last reported lost, if it neither recovered, was reset nor answered
    /// with real readings after that (the agent of a rebooted node never reports a
    /// recovery: its GPUs simply answer again).
    pub fn lost_since(&self) -> Option<UnixMs> {
        let lost = self.last(EventKind::GpuLost)?;
        let cleared = self.reset_at().is_some_and(|r| r >= lost)
            || self.answered_ms.is_some_and(|a| a > lost);
        (!cleared).then_some(lost)
    }

    /// The newest reset: a reported recovery or a Hello. Errors before it are cleared.
    pub fn reset_at(&self) -> Option<UnixMs> {
        self.last(EventKind::GpuRecovered).max(self.reset_ms)
    }

    fn last(&self, kind: EventKind) -> Option<UnixMs> {
        self.entries
            .iter()
            .filter(|x| x.kind == kind)
            .map(|x| x.last_ms)
            .max()
    }

    /// Every entry, in no particular order.
    pub fn entries(&self) -> &[RecentEvent] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn shorten(s: &str) -> String {
    match s.char_indices().nth(MAX_DETAIL) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Most points a [`CounterTrend`] holds.
pub const TREND_POINTS: usize = 10;

/// A cumulative counter (PCIe replays, NVLink errors) over the last `window`: how much it
/// rose. Points are kept at least `window / 8` apart, so the rise is measured over between
/// one window and one window and an eighth.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CounterTrend {
    points: VecDeque<(UnixMs, u64)>,
    latest: Option<(UnixMs, u64)>,
}

impl CounterTrend {
    /// Takes a reading (older readings than the newest are ignored; a value below the
    /// previous one is a reset: the trend starts again from it).
    pub fn note(&mut self, time_ms: UnixMs, value: u64, window_ms: i64) {
        if let Some((t, v)) = self.latest {
            if time_ms <= t {
                return;
            }
            if value < v {
                self.points.clear();
            }
        }
        self.latest = Some((time_ms, value));
        let spacing = (window_ms / 8).max(1);
        if self
            .points
            .back()
            .is_none_or(|&(t, _)| time_ms.saturating_sub(t) >= spacing)
        {
            self.points.push_back((time_ms, value));
        }
        // Keep one point at or before the window's start as the baseline.
        let start = time_ms.saturating_sub(window_ms);
        while self.points.len() > 1 && self.points[1].0 <= start {
            self.points.pop_front();
        }
        while self.points.len() > TREND_POINTS {
            self.points.pop_front();
        }
    }

    /// How much the counter rose from the baseline to the newest reading; `None` before
    /// any reading, and once the newest reading is older than `window_ms` before `now_ms`
    /// (the GPU stopped reporting the counter: nothing is known of the last window).
    pub fn rise(&self, now_ms: UnixMs, window_ms: i64) -> Option<u64> {
        let (t, now) = self.latest?;
        if t < now_ms.saturating_sub(window_ms) {
            return None;
        }
        let (_, base) = self.points.front().copied().unwrap_or((0, now));
        Some(now.saturating_sub(base))
    }

    /// When the baseline was read (the rise is measured from there).
    pub fn since_ms(&self) -> Option<UnixMs> {
        self.points.front().map(|p| p.0)
    }
}

/// The window over which error counters must not rise ([`crate::health::HealthPolicy`]'s
/// default `counter_window_ms`).
pub const COUNTER_WINDOW_MS: i64 = 3_600_000;

/// What the live state keeps per GPU for the health judge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuMemory {
    pub events: RecentEvents,
    pub pcie_replays: CounterTrend,
    /// CRC, replay and recovery errors summed over the GPU's links.
    pub nvlink_errors: CounterTrend,
}

impl GpuMemory {
    /// Takes a health sample's error counters (read at `time_ms`) into the trends; absent
    /// counters leave their trend as it is.
    pub fn note_counters(&mut self, time_ms: UnixMs, h: &GpuHealthSample) {
        if let Some(v) = h.pcie_replay_count {
            self.pcie_replays.note(time_ms, v, COUNTER_WINDOW_MS);
        }
        let nvlink = [
            h.nvlink_crc_errors,
            h.nvlink_replay_errors,
            h.nvlink_recovery_errors,
        ]
        .into_iter()
        .flatten()
        .reduce(u64::saturating_add);
        if let Some(v) = nvlink {
            self.nvlink_errors.note(time_ms, v, COUNTER_WINDOW_MS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(t: UnixMs, kind: EventKind, code: Option<u64>) -> Event {
        Event {
            time_ms: t,
            gpu_uuid: "GPU-1".into(),
            kind,
            code,
            detail: format!("at {t}"),
        }
    }

    #[test]
    fn events_fold_per_kind_and_code() {
        let mut r = RecentEvents::default();
        r.note(&ev(20, EventKind::Xid, Some(79)));
        r.note(&ev(10, EventKind::Xid, Some(79)));
        r.note(&ev(30, EventKind::Xid, Some(13)));
        r.note(&ev(40, EventKind::Throttle, None));
        assert_eq!(r.entries().len(), 2, "throttle events are not remembered");
        let x = r.entries().iter().find(|x| x.code == Some(79)).expect("79");
        assert_eq!((x.first_ms, x.last_ms, x.count), (10, 20, 2));
        assert_eq!(x.detail, "at 20", "the newest occurrence's detail");
    }

    #[test]
    fn an_event_sent_again_is_counted_once() {
        let mut r = RecentEvents::default();
        let batch = [
            ev(10, EventKind::Xid, Some(79)),
            ev(20, EventKind::Xid, Some(79)),
            ev(20, EventKind::Xid, Some(48)),
        ];
        for e in batch.iter().chain(&batch) {
            r.note(e);
        }
        let x = r.entries().iter().find(|x| x.code == Some(79)).expect("79");
        assert_eq!(x.count, 2, "the replayed batch is not counted again");
        r.note(&ev(30, EventKind::Xid, Some(79)));
        let x = r.entries().iter().find(|x| x.code == Some(79)).expect("79");
        assert_eq!(x.count, 3, "a new occurrence is");
    }

    #[test]
    fn memory_is_bounded_and_forgets_the_least_recent() {
        let mut r = RecentEvents::default();
        for code in 0..(MAX_ENTRIES as u64 + 10) {
            r.note(&ev(code as i64, EventKind::Xid, Some(code)));
        }
        assert_eq!(r.entries().len(), MAX_ENTRIES);
        assert!(r.entries().iter().all(|x| x.code >= Some(10)));
        let long = "x".repeat(10_000);
        r.note(&Event {
            detail: long,
            ..ev(1_000, EventKind::GpuLost, None)
        });
        assert!(
            r.entries()
                .iter()
                .all(|x| x.detail.chars().count() <= MAX_DETAIL + 1)
        );
    }

    #[test]
    fn lost_lasts_until_recovered_and_outlives_the_window() {
        let mut r = RecentEvents::default();
        r.note(&ev(100, EventKind::GpuLost, None));
        r.note(&ev(150, EventKind::Xid, Some(79)));
        assert_eq!(r.lost_since(), Some(100));
        r.prune(100 + 2 * KEEP_MS, KEEP_MS);
        assert_eq!(r.lost_since(), Some(100), "still lost");
        assert_eq!(r.entries().len(), 1, "the Xid was forgotten");
        r.note(&ev(200 + 2 * KEEP_MS, EventKind::GpuRecovered, None));
        assert_eq!(r.lost_since(), None);
        r.prune(300 + 4 * KEEP_MS, KEEP_MS);
        assert!(r.is_empty());
    }

    #[test]
    fn a_trend_goes_stale_a_window_after_its_newest_reading() {
        let w = 80;
        let mut t = CounterTrend::default();
        t.note(0, 5, w);
        t.note(20, 9, w);
        assert_eq!(t.rise(100, w), Some(4), "newest reading within the window");
        assert_eq!(t.rise(101, w), None, "stale: the counter is no longer read");
    }

    #[test]
    fn a_trend_measures_the_rise_over_the_window() {
        let w = 80;
        // Read right after the newest reading.
        let rise = |t: &CounterTrend| t.rise(t.latest.map_or(0, |l| l.0), w);
        let mut t = CounterTrend::default();
        assert_eq!(rise(&t), None, "absent before any reading");
        t.note(0, 5, w);
        assert_eq!(rise(&t), Some(0));
        for s in 1..=10 {
            t.note(s * 10, 5, w);
        }
        assert_eq!(rise(&t), Some(0), "flat");
        t.note(110, 7, w);
        assert_eq!(rise(&t), Some(2));
        // A window later without new errors: no rise.
        for s in 12..=25 {
            t.note(s * 10, 7, w);
        }
        assert_eq!(rise(&t), Some(0));
        assert!(t.points.len() <= TREND_POINTS);
        t.note(260, 1, w);
        assert_eq!(rise(&t), Some(0), "a reset starts again");
        t.note(270, 4, w);
        assert_eq!(rise(&t), Some(3), "from the value after the reset");
        t.note(250, 100, w);
        assert_eq!(rise(&t), Some(3), "an older reading is ignored");
    }
}
