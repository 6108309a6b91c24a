//! The expensive calls at their own cadence: the energy counter on the last tick of each
//! slot (and absent between), per-process utilization fetched from the driver's buffered
//! samples every few ticks with each tick completed from its own window, and PCIe and
//! ECC carried between their reads.

use super::*;

/// Waits until the wall clock is `from..to` ms into a `period` after `after` (ms; the
/// fake driver stamps its process samples at multiples of the period, so a tick taken
/// there has one newest sample whichever moment its lists are read in the next few ms),
/// and answers it in ms.
fn at_phase(after: i64, period: i64, from: i64, to: i64) -> i64 {
    loop {
        let now = gpufleet_core::config::now_ms();
        let phase = now.rem_euclid(period);
        if (from..to).contains(&phase) && now.div_euclid(period) > after.div_euclid(period) {
            return now;
        }
        let wait = (from - phase).rem_euclid(period).max(1);
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
}

fn sm_by_time(ticks: &[Tick]) -> BTreeMap<i64, Vec<(u32, Option<u32>)>> {
    ticks
        .iter()
        .map(|t| {
            let sm = t.processes.iter().map(|p| (p.pid, p.sm_util_pct)).collect();
            (t.time_ms, sm)
        })
        .collect()
}

/// The same machine read two ways, tick by tick at the same moments: per-process
/// utilization fetched at every tick, and fetched once a second from the driver's
/// buffer (ticks 200 ms apart). Every tick's per-process SM shares are the same, the
/// second way holds ticks until their samples come and asks the driver a fifth as often.
#[test]
fn buffered_process_utilization_gives_every_tick_the_shares_of_fetching_each_tick() {
    const PERIOD: i64 = 200;
    let busy = Gpu {
        process_sample_ms: PERIOD as u64,
        compute_processes: vec![
            Process {
                sm_pct_seq: vec![10, 25, 40, 55, 70, 85, 5],
                ..proc_(1101, 2, None)
            },
            Process {
                sm_pct_seq: vec![60, 0, 30],
                ..proc_(1102, 1, None)
            },
        ],
        ..gpu("GPU-busy")
    };
    let every_tick = Fake::new(Scenario {
        gpus: vec![busy.clone()],
        ..Scenario::default()
    });
    let buffered = Fake::new(Scenario {
        gpus: vec![busy],
        ..Scenario::default()
    });
    let interval = Duration::from_millis(PERIOD as u64);
    let mut a = every_tick.open_with_cadence(interval, Cadence::EVERY_TICK);
    let cadence = Cadence {
        process_util: Duration::from_secs(1),
        ..Cadence::EVERY_TICK
    };
    let mut b = buffered.open_with_cadence(interval, cadence);
    let (mut got_a, mut got_b, mut held_calls) = (Vec::new(), Vec::new(), 0);
    const TICKS: usize = 16;
    let mut now = 0;
    for _ in 0..TICKS {
        now = at_phase(now, PERIOD, 60, 100);
        got_a.extend(a.sample_ready(now).expect("tick"));
        let ready = b.sample_ready(now).expect("tick");
        held_calls += usize::from(ready.is_empty());
        got_b.extend(ready);
    }
    got_b.extend(b.flush(at_phase(now, PERIOD, 60, 100)).expect("flush"));
    assert_eq!(got_a.len(), TICKS);
    assert!(
        held_calls >= 8,
        "ticks were held for their samples: {held_calls}"
    );
    let (a_sm, b_sm) = (sm_by_time(&got_a), sm_by_time(&got_b));
    for (t, shares) in &a_sm {
        assert_eq!(b_sm.get(t), Some(shares), "tick {t}");
        assert!(shares.iter().all(|(_, sm)| sm.is_some()), "{shares:?}");
    }
    let times: Vec<i64> = got_b.iter().map(|t| t.time_ms).collect();
    assert!(times.is_sorted(), "held ticks leave in order: {times:?}");
    drop((a, b));
    let fetches = |f: &Fake| count(&f.counts(), "gpu0.nvmlDeviceGetProcessUtilization");
    let (fa, fb) = (fetches(&every_tick), fetches(&buffered));
    // A fetch that finds more samples than the room its last count suggested is asked
    // again (NVML's INSUFFICIENT_SIZE): one more call here or there.
    assert!(fa >= TICKS as u64, "{fa}");
    assert!(
        fb <= 8 && fb * 2 < fa,
        "one fetch a second, and one to flush: {fb} against {fa}"
    );
}

/// The counter on the first tick and on the last tick of each 10 s slot, absent on the
/// others (not repeated: the collector spreads each delta over them); PCIe, ECC and the
/// per-link NVLink counters read every 5 s and carried between; the cheap values and the
/// NVLink sums every tick.
#[test]
fn the_energy_counter_is_read_on_each_slots_last_tick_and_the_rest_carried() {
    let g = Gpu {
        pcie_tx_kib: Value::Ramp {
            start: 10,
            step: 10,
        },
        ecc_corrected: Value::Ramp { start: 1, step: 1 },
        power_mw: Value::Ramp {
            start: 100_000,
            step: 1,
        },
        ..gpu("GPU-0")
    };
    let fake = Fake::new(Scenario {
        gpus: vec![g],
        ..Scenario::default()
    });
    let cadence = Cadence {
        energy: Duration::from_secs(10),
        pcie: Duration::from_secs(5),
        ecc: Duration::from_secs(5),
        process_util: Duration::ZERO,
        nvlink_links: Duration::from_secs(5),
        gpm: Duration::from_secs(5),
    };
    let mut src = fake.open_with_cadence(Duration::from_secs(1), cadence);
    // Ticks at :00.250 … :24.250 of a minute.
    let base = 1_790_000_040_000 + 250;
    let ticks: Vec<Tick> = (0..25)
        .flat_map(|k| src.sample_ready(base + k * 1000).expect("tick"))
        .collect();
    assert_eq!(ticks.len(), 25, "no process: nothing is held");
    let read: Vec<i64> = ticks
        .iter()
        .filter(|t| sample(t, "GPU-0").energy_mj.is_some())
        .map(|t| (t.time_ms - base) / 1000)
        .collect();
    assert_eq!(read, [0, 9, 19], "the first tick and each slot's last");
    let powers: Vec<Option<u32>> = ticks.iter().map(|t| sample(t, "GPU-0").power_mw).collect();
    assert!(powers.iter().all(Option::is_some), "power every tick");
    let pcie: Vec<Option<u64>> = ticks
        .iter()
        .map(|t| sample(t, "GPU-0").pcie_tx_bps)
        .collect();
    assert_eq!(pcie[0], pcie[4], "carried between reads");
    assert_ne!(pcie[4], pcie[5], "read again 5 s later");
    let links: Vec<usize> = ticks
        .iter()
        .map(|t| sample(t, "GPU-0").nvlinks.len())
        .collect();
    assert_eq!(links[0], 0, "no rate before two readings");
    assert!(
        links[5..].iter().all(|n| *n == 12),
        "carried between: {links:?}"
    );
    let ecc: Vec<Option<u64>> = ticks
        .iter()
        .map(|t| sample(t, "GPU-0").ecc_corrected_volatile)
        .collect();
    assert_eq!(ecc[..5], [Some(1); 5]);
    assert_eq!(ecc[5], Some(2));
    drop(src);
    let counts = fake.counts();
    assert_eq!(
        count(&counts, "gpu0.nvmlDeviceGetTotalEnergyConsumption"),
        3
    );
    assert_eq!(count(&counts, "gpu0.nvmlDeviceGetPowerUsage"), 25);
    assert_eq!(
        count(&counts, "gpu0.nvmlDeviceGetPcieThroughput"),
        10,
        "TX and RX, 5 times"
    );
}

/// A GPU whose driver answers per-process utilization NOT_SUPPORTED: asked once, its
/// processes' utilization absent, and no tick is held for samples that will not come.
#[test]
fn without_per_process_utilization_nothing_is_held() {
    let g = Gpu {
        compute_processes: vec![proc_(1101, 1, Some(40))],
        unsupported: vec!["nvmlDeviceGetProcessUtilization".into()],
        ..gpu("GPU-0")
    };
    let fake = Fake::new(Scenario {
        gpus: vec![g],
        ..Scenario::default()
    });
    let cadence = Cadence {
        process_util: Duration::from_secs(5),
        ..Cadence::EVERY_TICK
    };
    let mut src = fake.open_with_cadence(Duration::from_secs(1), cadence);
    for k in 0..12 {
        let ready = src.sample_ready(T0 + k * 1000).expect("tick");
        assert_eq!(ready.len(), 1, "tick {k} leaves at once");
        let p = &ready[0].processes[0];
        assert_eq!((p.pid, p.sm_util_pct), (1101, None), "absent, not 0");
    }
    drop(src);
    assert_eq!(
        count(&fake.counts(), "gpu0.nvmlDeviceGetProcessUtilization"),
        1,
        "asked once"
    );
}
