//! Events: Xid and double-bit ECC delivered once; a lost GPU reported and recovered.

use super::*;

/// Samples (1 s of simulated time apart, 10 ms of real time) until `done` holds for the
/// ticks so far, or fails after a deadline.
pub(super) fn sample_until(
    src: &mut NvmlSource,
    ticks: &mut Vec<Tick>,
    what: &str,
    done: impl Fn(&[Tick]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(ticks) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {ticks:#?}"
        );
        let t = T0 + ticks.len() as i64 * 1000;
        ticks.push(src.sample(t).expect("tick"));
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(super) fn events_of(ticks: &[Tick], kind: Kind) -> Vec<(String, Option<u64>)> {
    ticks
        .iter()
        .flat_map(|t| &t.events)
        .filter(|e| e.kind == kind)
        .map(|e| (e.gpu_uuid.clone(), e.code))
        .collect()
}

#[test]
fn xid_and_double_bit_ecc_events_are_delivered_once() {
    let fake = Fake::new(Scenario {
        gpus: vec![
            gpu("GPU-quiet"),
            Gpu {
                events: vec![
                    EventSpec {
                        kind: EventKind::Xid,
                        code: 79,
                        after_calls: 60,
                    },
                    EventSpec {
                        kind: EventKind::EccDoubleBit,
                        code: 0,
                        after_calls: 60,
                    },
                ],
                ..gpu("GPU-xid")
            },
        ],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let mut ticks = Vec::new();
    sample_until(&mut src, &mut ticks, "the Xid and ECC events", |t| {
        !events_of(t, Kind::Xid).is_empty() && !events_of(t, Kind::EccDoubleBit).is_empty()
    });
    let seen = ticks.len();
    sample_until(&mut src, &mut ticks, "five more ticks", |t| {
        t.len() >= seen + 5
    });
    assert_eq!(
        events_of(&ticks, Kind::Xid),
        [("GPU-xid".to_owned(), Some(79))]
    );
    assert_eq!(
        events_of(&ticks, Kind::EccDoubleBit),
        [("GPU-xid".to_owned(), None)]
    );
    for t in &ticks {
        for e in &t.events {
            assert!(
                e.time_ms <= t.time_ms,
                "an event is not from the future: {e:?}"
            );
        }
    }
    drop(src);
    let c = fake.counts();
    assert_eq!(count(&c, "gpu0.nvmlDeviceRegisterEvents"), 1);
    assert_eq!(count(&c, "gpu1.nvmlDeviceRegisterEvents"), 1);
    assert!(
        count(&c, "nvmlEventSetFree") >= 1,
        "the set is freed: {c:?}"
    );
}

#[test]
fn events_of_one_gpu_in_one_tick_get_distinct_times() {
    let xid13 = EventSpec {
        kind: EventKind::Xid,
        code: 13,
        after_calls: 60,
    };
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            events: vec![xid13.clone(), xid13],
            ..gpu("GPU-twice")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let mut ticks = Vec::new();
    sample_until(&mut src, &mut ticks, "both Xids", |t| {
        events_of(t, Kind::Xid).len() == 2
    });
    let tick = ticks.last().expect("a tick");
    let times: Vec<i64> = tick.events.iter().map(|e| e.time_ms).collect();
    assert_eq!(
        times,
        [tick.time_ms - 1, tick.time_ms],
        "two Xid 13s of one GPU in one tick: one millisecond apart, none after the tick \
         (the collector keeps one event per node, time, GPU, kind and code)"
    );
}

#[test]
fn an_xid_from_a_gpu_that_falls_off_the_bus_at_once_still_names_it() {
    // The event is pending from the GPU's 60th call on, and from then on every call to
    // the GPU answers GPU_IS_LOST: the event's GPU cannot be asked for its UUID.
    let fake = Fake::new(Scenario {
        gpus: vec![Gpu {
            events: vec![EventSpec {
                kind: EventKind::Xid,
                code: 79,
                after_calls: 60,
            }],
            lost_after_calls: Some(60),
            ..gpu("GPU-falls")
        }],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let mut ticks = Vec::new();
    sample_until(&mut src, &mut ticks, "the Xid and the loss", |t| {
        !events_of(t, Kind::Xid).is_empty() && !events_of(t, Kind::GpuLost).is_empty()
    });
    assert_eq!(
        events_of(&ticks, Kind::Xid),
        [("GPU-falls".to_owned(), Some(79))],
        "the event names its GPU from its device handle, not by asking the lost GPU"
    );
}

#[test]
fn a_lost_gpu_is_reported_the_others_keep_sampling_and_it_recovers() {
    let fake = Fake::new(Scenario {
        gpus: vec![
            Gpu {
                lost_after_calls: Some(60),
                lost_for_calls: Some(3),
                power_mw: 300_000.into(),
                ..gpu("GPU-flaky")
            },
            gpu("GPU-steady"),
        ],
        ..Scenario::default()
    });
    let mut src = fake.open();
    let mut ticks = Vec::new();
    sample_until(&mut src, &mut ticks, "the GPU to be lost", |t| {
        !events_of(t, Kind::GpuLost).is_empty()
    });
    let lost_at = ticks.len() - 1;
    sample_until(&mut src, &mut ticks, "the GPU to recover", |t| {
        !events_of(t, Kind::GpuRecovered).is_empty()
    });
    let back_at = ticks.len() - 1;
    assert!(back_at > lost_at + 1, "lost for at least one whole tick");
    for t in &ticks[lost_at + 1..back_at] {
        let s = sample(t, "GPU-flaky");
        assert_eq!(
            (s.power_mw, s.util_gpu_pct, s.energy_mj, s.power_limit_mw),
            (None, None, None, None),
            "a lost GPU's values are absent, the cached power limit too"
        );
        assert_eq!(
            sample(t, "GPU-steady").power_mw,
            Some(60_000),
            "others keep sampling"
        );
    }
    assert_eq!(sample(&ticks[back_at], "GPU-flaky").power_mw, Some(300_000));
    sample_until(&mut src, &mut ticks, "two more ticks", |t| {
        t.len() >= back_at + 3
    });
    assert_eq!(events_of(&ticks, Kind::GpuLost).len(), 1);
    assert_eq!(
        events_of(&ticks, Kind::GpuRecovered),
        [("GPU-flaky".to_owned(), None)]
    );
    assert_eq!(
        sample(ticks.last().expect("ticks"), "GPU-flaky").power_mw,
        Some(300_000)
    );
}
