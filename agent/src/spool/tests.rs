//! The spool's behaviour as a whole: restarts, crashes, torn records, the bound.

use super::record::encode_record;
use super::*;
use gpufleet_core::GpuSample;
use gpufleet_core::Tick;
use gpufleet_uplink::encoded::EncodedTick;
use gpufleet_uplink::queue::BatchLimits;
use proptest::prelude::*;
use std::path::PathBuf;

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

/// A copy of the spool's files as a power cut would leave them: the active segment
/// holds only what was fsynced.
fn power_cut_copy(s: &Spool, from: &Path, to: &Path) {
    crash_copy(from, to);
    let active = s.segments.back().expect("active segment").first;
    let seg = fs::OpenOptions::new()
        .write(true)
        .open(record::seg_path(to, active))
        .expect("segment copy");
    seg.set_len(s.synced_bytes).expect("truncate");
}

#[test]
fn acked_policy_fsyncs_once_for_ticks_unacked_after_a_second_and_a_power_cut_keeps_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = Spool::open(SpoolConfig {
        fsync: FsyncPolicy::Acked,
        ..cfg(dir.path(), 1 << 20)
    })
    .expect("open");
    // Acked within the grace: never fsynced.
    for i in 0..3 {
        s.push(tick(i, 2));
    }
    let b = s.next_to_send(LIMITS).expect("batch");
    assert!(s.ack(b.seq));
    s.maintain_at(Instant::now() + ACKED_GRACE * 2);
    assert_eq!(s.synced_bytes, 0, "acked ticks cost no fsync");
    assert!(s.unsynced.is_empty());

    // Unacked: one fsync covers them all, once the oldest is a second old.
    let start = Instant::now();
    for i in 3..8 {
        s.push(tick(i, 2));
    }
    let sent = s.next_to_send(LIMITS).expect("in flight");
    s.maintain_at(start + ACKED_GRACE / 2);
    assert_eq!(s.synced_bytes, 0, "not due yet");
    s.maintain_at(start + ACKED_GRACE + Duration::from_millis(100));
    let active = s.segments.back().expect("active").bytes;
    assert_eq!(s.synced_bytes, active, "one fsync for everything appended");
    assert!(s.unsynced.is_empty());

    let cut = tempfile::tempdir().expect("tempdir");
    power_cut_copy(&s, dir.path(), cut.path());
    let mut c = Spool::open(cfg(cut.path(), 1 << 20)).expect("reopen");
    assert_eq!(
        c.summary().unacked,
        16,
        "all eight ticks survive: the five unacked ones fsynced, the acked ones with them"
    );
    let resent = c.next_to_send(LIMITS).expect("resent");
    assert_eq!(
        resent.decoded(),
        (0..8).map(|i| tick(i, 2)).collect::<Vec<_>>(),
        "the acked ones come back too (the watermark is lazy): a resend, not a loss"
    );
    drop(sent);
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
    let mut sim = gpufleet_sim::simulator(gpufleet_sim::SimOptions::new("size", 8)).expect("sim");
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
