use super::*;
use crate::store::GpuId;
use gpufleet_core::WorkloadKind;
use proptest::prelude::*;

const T0: i64 = 1_700_000_040_000 - 1_700_000_040_000 % MINUTE_MS;

fn job(id: &str) -> Workload {
    Workload {
        kind: WorkloadKind::Slurm,
        runtime: "slurm".into(),
        job_id: Some(id.into()),
        ..Default::default()
    }
}

/// Minute `k` of job `j` on GPU 1: idle at 0 %, resident all of it, 2 GiB, 600 J active
/// 0, idle 6,000 J (100 W for 60 s), priced at 200 g/kWh, PUE 1.5.
fn minute(k: i64, j: &str) -> WasteMinute {
    WasteMinute {
        gpu: GpuId(1),
        gpu_uuid: "GPU-1".into(),
        gpu_index: 0,
        gpu_name: "NVIDIA A100".into(),
        node_name: "n1".into(),
        workload: job(j),
        minute_ms: T0 + k * MINUTE_MS,
        util_max_pct: Some(0),
        covered_ms: MINUTE_MS,
        missing_ms: 0,
        gpu_ms: MINUTE_MS,
        mem_max_bytes: Some(2 << 30),
        energy_mj: 6_000_000,
        active_mj: 0,
        idle_mj: 6_000_000,
        provisional: false,
        price: Some((200.0, 1.5)),
        gpu_last_minute_ms: T0 + 1000 * MINUTE_MS,
        max_gap_ms: 15_000,
    }
}

fn run(n: i64) -> Vec<WasteMinute> {
    (0..n).map(|k| minute(k, "7")).collect()
}

fn settings(min: u64) -> WasteSettings {
    WasteSettings {
        util_threshold_pct: 1,
        min_idle: Duration::from_secs(min * 60),
    }
}

const LATER: i64 = T0 + 2000 * MINUTE_MS;

#[test]
fn thirty_idle_minutes_make_one_episode_at_the_default_and_twenty_nine_none() {
    let e = episodes(&run(30), WasteSettings::default(), LATER);
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].since_ms, e[0].until_ms), (T0, T0 + 30 * MINUTE_MS));
    assert_eq!(e[0].minutes, 30);
    assert_eq!(e[0].idle_ms(), 30 * MINUTE_MS);
    assert!(episodes(&run(29), WasteSettings::default(), LATER).is_empty());
}

#[test]
fn energy_is_the_workloads_share_and_carbon_is_priced_like_the_rest() {
    let e = &episodes(&run(30), settings(30), LATER)[0];
    // 30 × 6,000 J = 180,000 J = 0.05 kWh; × 200 g/kWh × 1.5 = 15 g.
    assert_eq!(e.energy_mj, 180_000_000);
    assert_eq!(e.idle_mj, 180_000_000);
    assert_eq!(e.charged_mj, 180_000_000);
    assert_eq!(e.priced_mj, 180_000_000);
    assert!((e.carbon_g.expect("priced") - 15.0).abs() < 1e-9);
    assert_eq!(e.mem_max_bytes, Some(2 << 30));
    assert!(!e.ongoing);
}

#[test]
fn unpriced_energy_has_no_carbon_never_zero() {
    let mut m = run(2);
    for x in &mut m {
        x.price = None;
    }
    let e = &episodes(&m, settings(1), LATER)[0];
    assert_eq!(e.carbon_g, None);
    assert_eq!(e.priced_mj, 0);
    m[0].price = Some((100.0, 1.0));
    let e = &episodes(&m, settings(1), LATER)[0];
    assert_eq!(e.priced_mj, 6_000_000);
    assert!(e.carbon_g.is_some_and(|g| g > 0.0));
}

#[test]
fn separate_policy_counts_the_idle_share_not_only_what_was_charged() {
    let mut m = run(2);
    for x in &mut m {
        x.energy_mj = 1_000; // charged: active only
        x.active_mj = 1_000;
        x.idle_mj = 5_000_000;
    }
    let e = &episodes(&m, settings(1), LATER)[0];
    assert_eq!(e.energy_mj, 2 * 5_001_000);
    assert_eq!(e.charged_mj, 2_000);
}

#[test]
fn the_threshold_is_inclusive_and_unknown_utilization_is_never_idle() {
    let mut m = run(3);
    m[1].util_max_pct = Some(1);
    assert_eq!(episodes(&m, settings(3), LATER).len(), 1);
    m[1].util_max_pct = Some(2);
    assert!(episodes(&m, settings(2), LATER).is_empty());
    m[1].util_max_pct = None;
    assert!(episodes(&m, settings(2), LATER).is_empty());
    let strict = WasteSettings {
        util_threshold_pct: 0,
        ..settings(1)
    };
    m[1].util_max_pct = Some(1);
    assert_eq!(episodes(&m, strict, LATER).len(), 2);
}

#[test]
fn a_minute_partly_held_missing_or_at_zero_bytes_breaks_the_episode() {
    for breaks in [
        |m: &mut WasteMinute| m.gpu_ms = MINUTE_MS - 1_000,
        |m: &mut WasteMinute| m.missing_ms = 5_000,
        |m: &mut WasteMinute| m.mem_max_bytes = Some(0),
        // Nothing measured: held the whole (zero) measured time, but not known idle.
        |m: &mut WasteMinute| {
            m.covered_ms = 0;
            m.gpu_ms = 0;
        },
    ] {
        let mut m = run(3);
        breaks(&mut m[1]);
        let e = episodes(&m, settings(1), LATER);
        assert_eq!(e.len(), 2, "{m:?}");
        assert!(e.iter().all(|e| e.minutes == 1));
    }
    // Memory never reported: still held (a listed process has a context).
    let mut m = run(3);
    m[1].mem_max_bytes = None;
    assert_eq!(episodes(&m, settings(3), LATER).len(), 1);
}

#[test]
fn a_missing_minute_row_splits_and_workloads_are_separate() {
    let mut m = run(5);
    m.remove(2);
    m.extend((0..5).map(|k| minute(k, "8")));
    let e = episodes(&m, settings(2), LATER);
    let got: Vec<(String, i64, u32)> = e
        .iter()
        .map(|e| (e.workload.key(), e.since_ms, e.minutes))
        .collect();
    assert_eq!(
        got,
        [
            ("slurm:7".to_owned(), T0, 2),
            ("slurm:8".to_owned(), T0, 5),
            ("slurm:7".to_owned(), T0 + 3 * MINUTE_MS, 2),
        ]
    );
    let t = totals(&e);
    assert_eq!(t[0].workload.key(), "slurm:8");
    assert_eq!((t[1].episodes, t[1].idle_ms), (2, 4 * MINUTE_MS));
}

#[test]
fn ongoing_when_its_last_minute_is_the_gpus_newest_and_recent() {
    let mut m = run(31);
    for x in &mut m {
        x.gpu_last_minute_ms = T0 + 30 * MINUTE_MS;
    }
    // Now: 20 s into minute 30 (open, provisional): until is capped at now.
    let now = T0 + 30 * MINUTE_MS + 20_000;
    let e = &episodes(&m, settings(30), now)[0];
    assert!(e.ongoing);
    assert_eq!(e.until_ms, now);
    // The GPU went on to a busy minute after it: over.
    for x in &mut m {
        x.gpu_last_minute_ms = T0 + 31 * MINUTE_MS;
    }
    assert!(!episodes(&m, settings(30), now + MINUTE_MS)[0].ongoing);
    // The node stopped reporting long ago: not ongoing either.
    for x in &mut m {
        x.gpu_last_minute_ms = T0 + 30 * MINUTE_MS;
    }
    let late = T0 + 31 * MINUTE_MS + MINUTE_MS + 15_000;
    assert!(episodes(&m, settings(30), late)[0].ongoing);
    assert!(!episodes(&m, settings(30), late + 1)[0].ongoing);
    // The slack follows the gap limit the minute was computed with.
    for x in &mut m {
        x.max_gap_ms = 5 * MINUTE_MS;
    }
    assert!(episodes(&m, settings(30), late + 4 * MINUTE_MS)[0].ongoing);
}

proptest! {
    /// Whatever the minutes, every episode is a run of idle-allocated minutes at least
    /// `min_idle` long, and its energy is exactly theirs.
    #[test]
    fn episodes_are_runs_of_idle_minutes_and_carry_exactly_their_energy(
        flags in proptest::collection::vec((any::<bool>(), 0u32..4, 0u64..10_000_000), 1..90),
        min in 1u64..10,
    ) {
        let minutes: Vec<WasteMinute> = flags
            .iter()
            .enumerate()
            .filter(|(_, (present, _, _))| *present)
            .map(|(k, (_, util, mj))| WasteMinute {
                util_max_pct: Some(*util),
                active_mj: mj / 3,
                idle_mj: mj - mj / 3,
                energy_mj: *mj,
                ..minute(k as i64, "7")
            })
            .collect();
        let s = settings(min);
        let eps = episodes(&minutes, s, LATER);
        let idle: Vec<&WasteMinute> = minutes.iter().filter(|m| idle_allocated(m, 1)).collect();
        for e in &eps {
            prop_assert!(e.idle_ms() >= (min as i64) * MINUTE_MS);
            let inside: Vec<&&WasteMinute> = idle
                .iter()
                .filter(|m| m.minute_ms >= e.since_ms && m.minute_ms < e.until_ms)
                .collect();
            prop_assert_eq!(inside.len() as u32, e.minutes);
            prop_assert_eq!(e.idle_ms(), i64::from(e.minutes) * MINUTE_MS);
            let mj: u64 = inside.iter().map(|m| m.active_mj + m.idle_mj).sum();
            prop_assert_eq!(mj, e.energy_mj);
        }
        // Episodes never overlap, and every long-enough run is one.
        for w in eps.windows(2) {
            prop_assert!(w[0].until_ms < w[1].since_ms);
        }
        let runs = idle
            .chunk_by(|a, b| b.minute_ms == a.minute_ms + MINUTE_MS)
            .filter(|r| r.len() as u64 >= min)
            .count();
        prop_assert_eq!(runs, eps.len());
    }
}

/// A store of minutes that records what is read of it.
#[derive(Default)]
struct Fake {
    minutes: Vec<WasteMinute>,
    reads: std::sync::Mutex<Vec<(TimeRange, bool)>>,
    starts: std::sync::Mutex<u32>,
}

impl WasteSource for Fake {
    async fn minutes(
        &self,
        range: TimeRange,
        scope: WasteScope<'_>,
        thr: u32,
    ) -> Result<Vec<WasteMinute>, StoreError> {
        let series = matches!(scope, WasteScope::Series(..));
        self.reads.lock().expect("lock").push((range, series));
        Ok(self
            .minutes
            .iter()
            .filter(|m| (range.from_ms..=range.to_ms).contains(&m.minute_ms))
            .filter(|m| match scope {
                WasteScope::Series(g, k) => m.gpu == g && m.workload.key() == k,
                _ => true,
            })
            .filter(|m| idle_allocated(m, thr))
            .cloned()
            .collect())
    }

    async fn run_start(
        &self,
        gpu: GpuId,
        key: &str,
        last_ms: UnixMs,
        horizon_ms: UnixMs,
        thr: u32,
    ) -> Result<Option<UnixMs>, StoreError> {
        *self.starts.lock().expect("lock") += 1;
        let idle = |t: i64| {
            self.minutes.iter().any(|m| {
                m.gpu == gpu
                    && m.workload.key() == key
                    && m.minute_ms == t
                    && idle_allocated(m, thr)
            })
        };
        let mut t = last_ms;
        if !idle(t) {
            return Ok(None);
        }
        while t - MINUTE_MS >= horizon_ms && idle(t - MINUTE_MS) {
            t -= MINUTE_MS;
        }
        Ok(Some(t))
    }
}

#[tokio::test]
async fn the_tracker_finds_a_long_episodes_start_once_then_reads_only_new_minutes() {
    // Job 7 idle for two days (still going on); job 8 idle for 40 min, then busy.
    let days = 2 * 24 * 60;
    let now_at = |k: i64| T0 + k * MINUTE_MS + 20_000;
    let fake = |upto: i64| {
        let mut minutes: Vec<WasteMinute> = (0..=upto)
            .map(|k| WasteMinute {
                gpu_last_minute_ms: T0 + upto * MINUTE_MS,
                ..minute(k, "7")
            })
            .collect();
        minutes.extend((upto - 50..upto - 10).map(|k| WasteMinute {
            gpu: GpuId(2),
            gpu_last_minute_ms: T0 + upto * MINUTE_MS,
            ..minute(k, "8")
        }));
        Fake {
            minutes,
            ..Fake::default()
        }
    };
    let mut tracker = OngoingTracker::default();
    let store = fake(days);
    let got = tracker
        .refresh_from(&store, settings(30), now_at(days))
        .await
        .expect("first");
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].since_ms, got[0].minutes), (T0, days as u32 + 1));
    assert_eq!(*store.starts.lock().expect("lock"), 1);
    same(&got, &store, now_at(days));

    // Later refreshes: no look-back, only the minutes since the last one (and the overlap).
    for k in [days + 1, days + 2, days + 7] {
        let store = fake(k);
        let got = tracker
            .refresh_from(&store, settings(30), now_at(k))
            .await
            .expect("refresh");
        assert_eq!(*store.starts.lock().expect("lock"), 0);
        let reads = store.reads.lock().expect("lock").clone();
        assert_eq!(reads.len(), 1, "{reads:?}");
        assert!(!reads[0].1);
        assert!(now_at(k) - reads[0].0.from_ms <= ONGOING_OVERLAP_MS + 8 * MINUTE_MS);
        same(&got, &store, now_at(k));
    }
    // The free function agrees.
    let store = fake(days + 7);
    let all = ongoing_from(&store, settings(30), now_at(days + 7)).await;
    assert_eq!(all[0].since_ms, T0);
}

/// `got` is exactly the ongoing episodes of reading every minute (carbon to rounding).
fn same(got: &[Episode], store: &Fake, now: UnixMs) {
    let mut want = episodes(&store.minutes, settings(30), now);
    want.retain(|e| e.ongoing);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        let (gc, wc) = (g.carbon_g.expect("priced"), w.carbon_g.expect("priced"));
        assert!((gc - wc).abs() < 1e-6, "{gc} {wc}");
        assert_eq!(
            Episode {
                carbon_g: None,
                ..g.clone()
            },
            Episode {
                carbon_g: None,
                ..w
            }
        );
    }
}

async fn ongoing_from(store: &Fake, s: WasteSettings, now: UnixMs) -> Vec<Episode> {
    OngoingTracker::default()
        .refresh_from(store, s, now)
        .await
        .expect("ongoing")
}
