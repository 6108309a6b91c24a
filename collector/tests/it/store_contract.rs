//! The store contract: what every `Store` implementation must do, written against
//! `Arc<dyn Store>` only. `contract_tests!` instantiates the suite per backend: SQLite in
//! a temporary file, PostgreSQL in a schema of its own on `GPUFLEET_TEST_PG_URL`.

use crate::common;

use crate::common::*;
use gpufleet_carbon::{FactorType, IntensityKind, IntensitySlot, ProviderKind};
use gpufleet_collector::accounting::accountant::{self, Accountant, EnergyOptions};
use gpufleet_collector::accounting::check as energy_check;
use gpufleet_collector::accounting::energy::GpuMinute;
use gpufleet_collector::accounting::rollups::{RetentionOptions, Rollups};
use gpufleet_collector::store::carbon::{CarbonMinute, PriceBasis};
use gpufleet_collector::store::energy::{EnergyInputs, EnergyRange, MinuteReplacement, WasteScope};
use gpufleet_collector::store::rollup::{MetricStats, RollupKey, RollupMinute};
use gpufleet_collector::store::{
    GpuId, GpuMetric, HostRow, NodeRecord, Rehomed, Store, StoreError, TimeRange,
};
use gpufleet_core::*;
use std::sync::Arc;

const ALL_TIME: TimeRange = TimeRange {
    from_ms: 0,
    to_ms: i64::MAX,
};

mod contract {
    use super::*;

    async fn register(store: &Arc<dyn Store>, node: &str, gpus: Vec<GpuInfo>) -> NodeRecord {
        store
            .register_node(&hello(node), &inventory(gpus), T0)
            .await
            .expect("register node")
    }

    pub async fn registration_round_trips_inventory(store: Arc<dyn Store>) {
        let gpus = vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)];
        let rec = register(&store, "node-a", gpus.clone()).await;
        assert_eq!(rec.name, "node-a");
        assert_eq!(rec.labels, hello("node-a").labels);
        assert_eq!((rec.first_seen_ms, rec.last_hello_ms), (T0, T0));
        assert_eq!(rec.last_seen_ms, None, "no sample yet");
        assert_eq!(rec.last_acked_seq, 0);
        assert_eq!(
            rec.inventory(),
            inventory(gpus.clone()),
            "every fact, absent ones as None"
        );

        // A second Hello updates facts, keeps ids and first_seen.
        let mut changed = gpus.clone();
        changed[1].vbios_version = Some("80.21".into());
        changed[0].serial = None;
        let mut h = hello("node-a");
        h.agent_version = "0.2.0".into();
        let again = store
            .register_node(&h, &inventory(changed.clone()), T0 + 5000)
            .await
            .expect("re-register");
        assert_eq!(again.id, rec.id);
        assert_eq!(
            again.gpus.iter().map(|g| g.id).collect::<Vec<_>>(),
            rec.gpus.iter().map(|g| g.id).collect::<Vec<_>>()
        );
        assert_eq!((again.first_seen_ms, again.last_hello_ms), (T0, T0 + 5000));
        assert_eq!(again.agent_version, "0.2.0");
        assert_eq!(again.inventory().gpus, changed);
        let listed = store.nodes().await.expect("nodes");
        assert_eq!(listed, vec![again]);
    }

    pub async fn gpu_of_another_node_is_refused_until_rehomed(store: Arc<dyn Store>) {
        let a = register(
            &store,
            "node-a",
            vec![gpu_info_sparse("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        store
            .write_batches(&[node_batch(&a, batch(1, T0, 2, &["GPU-a", "GPU-b"]))])
            .await
            .expect("a writes its GPUs");
        let refused = store
            .register_node(
                &hello("node-b"),
                &inventory(vec![
                    gpu_info_sparse("GPU-x", 0),
                    gpu_info_sparse("GPU-b", 1),
                ]),
                T0 + 1000,
            )
            .await
            .expect_err("node-b claims node-a's GPU");
        assert!(
            matches!(&refused, StoreError::GpuOwned { uuid, owner } if uuid == "GPU-b" && owner == "node-a"),
            "{refused:?}"
        );
        let nodes = store.nodes().await.expect("nodes");
        assert_eq!(
            nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["node-a"],
            "the refused Hello registered nothing, not even node-b"
        );
        assert_eq!(nodes[0].gpus, a.gpus, "node-a keeps both GPUs");
        // Re-registering node-a (same GPUs) is fine.
        let again = register(
            &store,
            "node-a",
            vec![gpu_info_sparse("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        assert_eq!(again.gpus.len(), 2);

        // The GPU really moved: the admin re-homes it, with its history.
        register(&store, "node-b", vec![gpu_info_sparse("GPU-x", 0)]).await;
        assert_eq!(
            store.rehome_gpu("GPU-b", "node-c").await.expect("rehome"),
            Rehomed::UnknownNode
        );
        assert_eq!(
            store.rehome_gpu("GPU-zz", "node-b").await.expect("rehome"),
            Rehomed::UnknownGpu
        );
        assert_eq!(
            store.rehome_gpu("GPU-b", "node-b").await.expect("rehome"),
            Rehomed::Moved {
                from: "node-a".into()
            }
        );
        assert_eq!(
            store.rehome_gpu("GPU-b", "node-b").await.expect("rehome"),
            Rehomed::Unchanged
        );
        let b = store
            .register_node(
                &hello("node-b"),
                &inventory(vec![
                    gpu_info_sparse("GPU-x", 0),
                    gpu_info_sparse("GPU-b", 1),
                ]),
                T0 + 2000,
            )
            .await
            .expect("node-b may declare it now");
        let moved = b
            .gpus
            .iter()
            .find(|g| g.info.uuid == "GPU-b")
            .expect("GPU-b");
        assert_eq!(moved.id, a.gpus[1].id, "same GPU, same id");
        assert_eq!(
            store
                .gpu_samples(moved.id, ALL_TIME, 10)
                .await
                .expect("history")
                .len(),
            2,
            "its history moved with it"
        );
        let err = store
            .register_node(
                &hello("node-a"),
                &inventory(vec![
                    gpu_info_sparse("GPU-a", 0),
                    gpu_info_sparse("GPU-b", 1),
                ]),
                T0 + 3000,
            )
            .await
            .expect_err("now node-a may not claim it back");
        assert!(matches!(err, StoreError::GpuOwned { .. }), "{err:?}");
    }

    pub async fn conflicts_are_left_out_and_replays_are_not(store: Arc<dyn Store>) {
        let a = register(&store, "node-a", vec![gpu_info_full("GPU-a", 0)]).await;
        let c = register(&store, "node-c", vec![gpu_info_full("GPU-c", 0)]).await;
        let first = batch(1, T0, 3, &["GPU-a"]);
        let out = store
            .write_batches(&[node_batch(&a, first.clone())])
            .await
            .expect("first write");
        assert!(out.conflicts.is_empty());

        // Same keys, other values (a second agent writing as node-a), next to a replay of
        // batch 1, a new batch of node-a and another node's batch, all in one write.
        let mut forged = batch(7, T0 + 1000, 3, &["GPU-a"]);
        for t in &mut forged.ticks {
            t.gpus[0].power_mw = Some(1);
        }
        let next = batch(2, T0 + 3000, 2, &["GPU-a"]);
        let other = batch(1, T0, 2, &["GPU-c"]);
        let out = store
            .write_batches(&[
                node_batch(&a, first.clone()),
                node_batch(&a, forged),
                node_batch(&a, next),
                node_batch(&c, other),
            ])
            .await
            .expect("write");
        assert_eq!(
            out.conflicts.iter().map(|c| c.index).collect::<Vec<_>>(),
            [1],
            "only the forged batch conflicts: {:?}",
            out.conflicts
        );
        assert!(
            out.conflicts[0].reason.contains("GPU-a")
                && out.conflicts[0].reason.contains("other values"),
            "{}",
            out.conflicts[0].reason
        );
        assert_eq!(
            out.inserted_gpu_samples.get(&a.id),
            Some(&2),
            "batch 2 only"
        );
        assert_eq!(out.inserted_gpu_samples.get(&c.id), Some(&2));

        let stored = store
            .gpu_samples(a.gpus[0].id, ALL_TIME, 100)
            .await
            .expect("read");
        assert_eq!(
            stored.len(),
            5,
            "3 + 2: nothing of the forged batch, though its last tick was new"
        );
        let expected: Vec<(UnixMs, GpuSample)> = first
            .ticks
            .iter()
            .chain(batch(2, T0 + 3000, 2, &["GPU-a"]).ticks.iter())
            .map(|t| (t.time_ms, t.gpus[0].clone()))
            .collect();
        assert_eq!(
            stored, expected,
            "the stored samples are the first writer's"
        );
        let nodes = store.nodes().await.expect("nodes");
        let node_a = nodes.iter().find(|n| n.name == "node-a").expect("a");
        assert_eq!(
            node_a.last_acked_seq, 2,
            "the forged seq 7 was not recorded"
        );
        assert_eq!(node_a.stored_samples, 5);

        // The same GPU samples with another host sample at a tick: a conflict too.
        let mut host_forged = first.clone();
        host_forged.seq = 8;
        if let Some(h) = host_forged.ticks[0].host.as_mut() {
            h.cpu_util_pct = Some(99.5);
        }
        let out = store
            .write_batches(&[node_batch(&a, host_forged)])
            .await
            .expect("write");
        assert_eq!(out.conflicts.len(), 1, "{:?}", out.conflicts);
        assert!(
            out.conflicts[0].reason.contains("host sample"),
            "{}",
            out.conflicts[0].reason
        );
        let hosts = store
            .host_samples(a.id, ALL_TIME, 100)
            .await
            .expect("hosts");
        assert_eq!(
            hosts[0].sample, first.ticks[0].host,
            "the stored host row is kept"
        );

        // Rows the store keeps in another shape (a host sample with no metric is stored as
        // none, a cost without figures too) replay as replays.
        let mut empty = batch(9, T0 + 10_000, 2, &["GPU-a"]);
        empty.ticks[0].host = Some(HostSample::default());
        empty.ticks[1].cost = Some(SamplerCost::default());
        for _ in 0..2 {
            let out = store
                .write_batches(&[node_batch(&a, empty.clone())])
                .await
                .expect("write");
            assert!(out.conflicts.is_empty(), "{:?}", out.conflicts);
        }

        // A write made only of a conflict commits nothing and reports it.
        let mut forged = batch(3, T0, 1, &["GPU-a"]);
        forged.ticks[0].gpus[0].energy_mj = Some(5);
        let out = store
            .write_batches(&[node_batch(&a, forged)])
            .await
            .expect("write");
        assert_eq!(out.conflicts.len(), 1);
        assert_eq!(out.inserted_gpu_samples.get(&a.id).copied().unwrap_or(0), 0);
    }

    pub async fn batches_read_back_field_for_field(store: Arc<dyn Store>) {
        let rec = register(
            &store,
            "node-a",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let mut b = batch(1, T0, 3, &["GPU-a", "GPU-b"]);
        b.ticks[1].host = None; // cost only: the host row has no metrics
        b.ticks[2].cost = None;
        b.ticks[2].events = vec![
            Event {
                time_ms: T0 + 2000,
                gpu_uuid: "GPU-a".into(),
                kind: EventKind::Xid,
                code: Some(79),
                detail: "GPU has fallen off the bus".into(),
            },
            Event {
                time_ms: T0 + 2000,
                gpu_uuid: String::new(),
                kind: EventKind::SpoolDrop,
                code: None,
                detail: "spool full".into(),
            },
        ];
        let outcome = store
            .write_batches(&[node_batch(&rec, b.clone())])
            .await
            .expect("write");
        assert_eq!(outcome.inserted_gpu_samples.get(&rec.id), Some(&6));

        let gpu_a = rec.gpus[0].id;
        let gpu_b = rec.gpus[1].id;
        let samples = store
            .gpu_samples(gpu_a, ALL_TIME, 100)
            .await
            .expect("read gpu a");
        let expected: Vec<(UnixMs, GpuSample)> = b
            .ticks
            .iter()
            .map(|t| (t.time_ms, t.gpus[0].clone()))
            .collect();
        assert_eq!(
            samples, expected,
            "every field of a full sample, in time order"
        );
        let sparse = store
            .gpu_samples(gpu_b, ALL_TIME, 100)
            .await
            .expect("read gpu b");
        assert_eq!(sparse[0].1, b.ticks[0].gpus[1]);
        assert_eq!(sparse[0].1.temp_gpu_c, None, "absent stays absent");
        assert_eq!(sparse[0].1.fan_pct, None);
        assert!(sparse[0].1.nvlinks.is_empty());

        let procs = store
            .process_samples(gpu_a, ALL_TIME, 100)
            .await
            .expect("processes a");
        let expected: Vec<(UnixMs, ProcessSample)> = b
            .ticks
            .iter()
            .map(|t| (t.time_ms, t.processes[0].clone()))
            .collect();
        assert_eq!(
            procs, expected,
            "process fields and workload identity with names"
        );
        let procs_b = store
            .process_samples(gpu_b, ALL_TIME, 100)
            .await
            .expect("processes b");
        assert_eq!(
            procs_b[0].1, b.ticks[0].processes[1],
            "absent process fields stay absent"
        );

        let hosts = store
            .host_samples(rec.id, ALL_TIME, 100)
            .await
            .expect("hosts");
        assert_eq!(hosts.len(), 3);
        assert_eq!(hosts[0].time_ms, T0);
        assert_eq!(hosts[0].sample, b.ticks[0].host);
        assert_eq!(hosts[0].cost, b.ticks[0].cost);
        assert_eq!(
            (hosts[1].sample.clone(), hosts[1].cost.clone()),
            (None, b.ticks[1].cost.clone())
        );
        assert_eq!(
            (hosts[2].sample.clone(), hosts[2].cost.clone()),
            (b.ticks[2].host.clone(), None)
        );

        let events = store.events(rec.id, ALL_TIME, 100).await.expect("events");
        assert_eq!(events, b.ticks[2].events);

        let node = &store.nodes().await.expect("nodes")[0];
        assert_eq!(node.last_seen_ms, Some(T0 + 2000), "newest tick time");
        assert_eq!(node.last_acked_seq, 1);
        assert_eq!(node.delivery, b.delivery);
        assert_eq!(node.stored_samples, 6);
    }

    pub async fn replaying_a_batch_changes_nothing(store: Arc<dyn Store>) {
        let rec = register(
            &store,
            "node-a",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let mut b = batch(1, T0, 4, &["GPU-a", "GPU-b"]);
        b.ticks[0].events = vec![
            Event {
                time_ms: T0,
                gpu_uuid: String::new(),
                kind: EventKind::GpuLost,
                code: None,
                detail: String::new(),
            },
            Event {
                time_ms: T0,
                gpu_uuid: "GPU-b".into(),
                kind: EventKind::Xid,
                code: Some(48),
                detail: "DBE".into(),
            },
        ];
        let nb = node_batch(&rec, b);
        store
            .write_batches(std::slice::from_ref(&nb))
            .await
            .expect("first write");
        let replay = store
            .write_batches(&[nb.clone(), nb.clone()])
            .await
            .expect("replay, twice in one transaction");
        assert_eq!(replay.inserted_gpu_samples.get(&rec.id), Some(&0));

        assert_eq!(
            store
                .gpu_samples(rec.gpus[0].id, ALL_TIME, 100)
                .await
                .expect("a")
                .len(),
            4
        );
        assert_eq!(
            store
                .gpu_samples(rec.gpus[1].id, ALL_TIME, 100)
                .await
                .expect("b")
                .len(),
            4
        );
        assert_eq!(
            store
                .process_samples(rec.gpus[0].id, ALL_TIME, 100)
                .await
                .expect("p")
                .len(),
            4
        );
        assert_eq!(
            store
                .host_samples(rec.id, ALL_TIME, 100)
                .await
                .expect("h")
                .len(),
            4
        );
        assert_eq!(
            store.events(rec.id, ALL_TIME, 100).await.expect("e").len(),
            2,
            "node-level and code-less events too"
        );
        let node = &store.nodes().await.expect("nodes")[0];
        assert_eq!(
            node.stored_samples, 8,
            "the counter counts rows, not writes"
        );
        assert_eq!(node.last_acked_seq, 1);

        // New samples in one transaction beside old ones, or twice in it: each new
        // sample is stored and counted once.
        let fresh = node_batch(&rec, batch(2, T0 + 4_000, 3, &["GPU-a", "GPU-b"]));
        let mixed = store
            .write_batches(&[nb.clone(), fresh.clone(), fresh.clone()])
            .await
            .expect("old and new in one transaction");
        assert_eq!(mixed.inserted_gpu_samples.get(&rec.id), Some(&6));
        assert_eq!(
            store
                .gpu_samples(rec.gpus[0].id, ALL_TIME, 100)
                .await
                .expect("a")
                .len(),
            7
        );
        let twice = node_batch(&rec, batch(3, T0 + 7_000, 2, &["GPU-a", "GPU-b"]));
        let doubled = store
            .write_batches(&[twice.clone(), twice])
            .await
            .expect("a new batch twice in one transaction");
        assert_eq!(doubled.inserted_gpu_samples.get(&rec.id), Some(&4));
        let node = &store.nodes().await.expect("nodes")[0];
        assert_eq!(node.stored_samples, 18);
        assert_eq!(node.last_acked_seq, 3);

        // Ticks without GPU samples (every GPU's reading failed) still carry process and
        // host rows; replayed, those alone are what was stored before.
        let mut bare = batch(4, T0 + 9_000, 2, &["GPU-a", "GPU-b"]);
        for t in &mut bare.ticks {
            t.gpus.clear();
        }
        let bare = node_batch(&rec, bare);
        for write in ["first write", "replay"] {
            let out = store
                .write_batches(std::slice::from_ref(&bare))
                .await
                .expect(write);
            assert_eq!(out.inserted_gpu_samples.get(&rec.id), Some(&0), "{write}");
        }
        let procs = store
            .process_samples(rec.gpus[0].id, ALL_TIME, 100)
            .await
            .expect("p");
        assert_eq!(procs.len(), 11, "9 with GPU samples, 2 without");
        let hosts = store.host_samples(rec.id, ALL_TIME, 100).await.expect("h");
        assert_eq!(hosts.len(), 11);
        assert_eq!(store.nodes().await.expect("nodes")[0].last_acked_seq, 4);
    }

    pub async fn last_acked_seq_and_last_seen_only_grow(store: Arc<dyn Store>) {
        let rec = register(&store, "node-a", vec![gpu_info_sparse("GPU-a", 0)]).await;
        let b5 = batch(5, T0 + 10_000, 2, &["GPU-a"]);
        let b3 = batch(3, T0, 2, &["GPU-a"]);
        store
            .write_batches(&[node_batch(&rec, b5.clone())])
            .await
            .expect("seq 5");
        store
            .write_batches(&[node_batch(&rec, b3)])
            .await
            .expect("older seq 3");
        let node = &store.nodes().await.expect("nodes")[0];
        assert_eq!(node.last_acked_seq, 5);
        assert_eq!(node.last_seen_ms, Some(T0 + 11_000));
        assert_eq!(
            node.delivery, b5.delivery,
            "delivery stats come from the highest seq"
        );
        assert_eq!(node.stored_samples, 4);

        // Several batches of several nodes in one transaction.
        let other = register(&store, "node-b", vec![gpu_info_sparse("GPU-z", 0)]).await;
        let outcome = store
            .write_batches(&[
                node_batch(&other, batch(1, T0, 1, &["GPU-z"])),
                node_batch(&rec, batch(6, T0 + 20_000, 1, &["GPU-a"])),
                node_batch(&other, batch(2, T0, 2, &["GPU-z"])),
            ])
            .await
            .expect("mixed write");
        assert_eq!(outcome.inserted_gpu_samples.get(&rec.id), Some(&1));
        assert_eq!(
            outcome.inserted_gpu_samples.get(&other.id),
            Some(&2),
            "tick T0 is in both batches"
        );
        let nodes = store.nodes().await.expect("nodes");
        assert_eq!(nodes[0].last_acked_seq, 6);
        assert_eq!(nodes[1].last_acked_seq, 2);
        assert_eq!(nodes[1].stored_samples, 2);
    }

    pub async fn latest_samples_seed_the_live_state(store: Arc<dyn Store>) {
        let rec = register(
            &store,
            "node-a",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        register(&store, "node-empty", vec![gpu_info_sparse("GPU-c", 0)]).await;
        assert!(store.latest_gpu_samples().await.expect("latest").is_empty());
        let b1 = batch(1, T0, 3, &["GPU-a", "GPU-b"]);
        let mut b2 = batch(2, T0 + 3000, 2, &["GPU-a"]); // GPU-b stopped reporting
        b2.ticks[1].processes.clear();
        store
            .write_batches(&[node_batch(&rec, b1.clone()), node_batch(&rec, b2.clone())])
            .await
            .expect("write");
        let mut latest = store.latest_gpu_samples().await.expect("latest");
        latest.sort_by_key(|l| l.gpu);
        assert_eq!(latest.len(), 2);
        assert_eq!(
            (latest[0].gpu, latest[0].time_ms),
            (rec.gpus[0].id, T0 + 4000)
        );
        assert_eq!(latest[0].sample, b2.ticks[1].gpus[0]);
        assert!(
            latest[0].processes.is_empty(),
            "the newest tick had no processes"
        );
        assert_eq!(
            (latest[1].gpu, latest[1].time_ms),
            (rec.gpus[1].id, T0 + 2000)
        );
        assert_eq!(latest[1].processes, vec![b1.ticks[2].processes[1].clone()]);
        let hosts = store.latest_host_samples().await.expect("hosts");
        assert_eq!(hosts.len(), 1);
        assert_eq!((hosts[0].node, hosts[0].time_ms), (rec.id, T0 + 4000));
        assert_eq!(hosts[0].sample, b2.ticks[1].host);
    }

    pub async fn health_round_trips_and_the_latest_seeds_the_live_state(store: Arc<dyn Store>) {
        let rec = register(
            &store,
            "node-h",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
        assert!(store.latest_gpu_health().await.expect("latest").is_empty());
        // Health in ticks 0 (both GPUs; GPU-b supports nothing) and 2 (GPU-a), none in 1.
        let mut b1 = batch(1, T0, 3, &["GPU-a", "GPU-b"]);
        b1.ticks[0].health = vec![health_full("GPU-a", 1), health_sparse("GPU-b")];
        b1.ticks[2].health = vec![health_full("GPU-a", 2)];
        store
            .write_batches(&[node_batch(&rec, b1.clone())])
            .await
            .expect("write");
        // A replay changes nothing.
        store
            .write_batches(&[node_batch(&rec, b1.clone())])
            .await
            .expect("replay");

        let read = store.gpu_health(a, ALL_TIME, 10).await.expect("read");
        assert_eq!(
            read,
            vec![
                (T0, health_full("GPU-a", 1)),
                (T0 + 2000, health_full("GPU-a", 2))
            ],
            "every value, true and false, 2^53 - 1, stored once"
        );
        let read = store.gpu_health(b, ALL_TIME, 10).await.expect("read");
        assert_eq!(read, vec![(T0, health_sparse("GPU-b"))], "absent as None");

        let mut latest = store.latest_gpu_health().await.expect("latest");
        latest.sort_by_key(|l| l.gpu);
        let latest: Vec<_> = latest
            .into_iter()
            .map(|l| (l.gpu, l.time_ms, l.sample))
            .collect();
        assert_eq!(
            latest,
            vec![
                (a, T0 + 2000, health_full("GPU-a", 2)),
                (b, T0, health_sparse("GPU-b"))
            ]
        );

        // The follower's read puts health back into its ticks.
        let ticks = store.node_ticks(&rec, ALL_TIME, 10).await.expect("ticks");
        let health: Vec<_> = ticks.iter().map(|t| t.health.clone()).collect();
        let expected: Vec<_> = b1.ticks.iter().map(|t| t.health.clone()).collect();
        assert_eq!(health, expected);
        let many = store
            .nodes_ticks(&[(&rec, ALL_TIME)], 10)
            .await
            .expect("ticks");
        assert_eq!(many, vec![ticks]);
    }

    pub async fn sparse_health_and_events_never_push_gpu_ticks_out(store: Arc<dyn Store>) {
        let rec = register(&store, "node-s", vec![gpu_info_full("GPU-a", 0)]).await;
        // Five ticks; health in the first and the last, an Xid in the last: read with a
        // limit of 2, the rows past the GPU rows kept must not make ticks of their own.
        let mut b = batch(1, T0, 5, &["GPU-a"]);
        b.ticks[0].health = vec![health_full("GPU-a", 1)];
        b.ticks[4].health = vec![health_full("GPU-a", 2)];
        b.ticks[4].events = vec![Event {
            time_ms: T0 + 4000,
            gpu_uuid: "GPU-a".into(),
            kind: EventKind::Xid,
            code: Some(79),
            detail: "fell off the bus".into(),
        }];
        store
            .write_batches(&[node_batch(&rec, b.clone())])
            .await
            .expect("write");
        let one = store.node_ticks(&rec, ALL_TIME, 2).await.expect("ticks");
        let mut many = store
            .nodes_ticks(&[(&rec, ALL_TIME)], 2)
            .await
            .expect("ticks");
        for ticks in [one, many.pop().unwrap_or_default()] {
            let times: Vec<UnixMs> = ticks.iter().map(|t| t.time_ms).collect();
            assert_eq!(ticks.len(), 2, "{times:?}");
            for t in &ticks {
                let k = usize::try_from((t.time_ms - T0) / 1000).expect("tick");
                assert_eq!(t.gpus, b.ticks[k].gpus, "a real tick at {}", t.time_ms);
                assert_eq!(t.health, b.ticks[k].health, "its own health");
                assert_eq!(t.events, b.ticks[k].events, "its own events");
            }
        }
    }

    pub async fn series_raw_and_downsampled(store: Arc<dyn Store>) {
        let rec = register(&store, "node-a", vec![gpu_info_sparse("GPU-a", 0)]).await;
        let gpu = rec.gpus[0].id;
        // Samples at T0 + 0, 1, 2, ... 9 s; power 100, 200, ... W; util absent at 5 s.
        let ticks = (0..10u32)
            .map(|i| {
                let mut s = gpu_sample_sparse("GPU-a", 0);
                s.power_mw = Some((i + 1) * 100_000);
                s.util_gpu_pct = (i != 5).then_some(i * 10);
                Tick {
                    time_ms: T0 + i64::from(i) * 1000,
                    gpus: vec![s],
                    ..Default::default()
                }
            })
            .collect();
        let b = Batch {
            seq: 1,
            ticks,
            delivery: DeliveryStats::default(),
        };
        store
            .write_batches(&[node_batch(&rec, b)])
            .await
            .expect("write");

        let range = TimeRange {
            from_ms: T0 + 1000,
            to_ms: T0 + 6000,
        };
        let raw = store
            .gpu_series(gpu, GpuMetric::UtilGpuPct, range, None, 100)
            .await
            .expect("raw");
        assert_eq!(
            raw,
            vec![
                (T0 + 1000, Some(10.0)),
                (T0 + 2000, Some(20.0)),
                (T0 + 3000, Some(30.0)),
                (T0 + 4000, Some(40.0)),
                (T0 + 5000, None),
                (T0 + 6000, Some(60.0)),
            ],
            "from and to are inclusive; absent is null"
        );
        let limited = store
            .gpu_series(gpu, GpuMetric::PowerMw, ALL_TIME, None, 3)
            .await
            .expect("limit");
        assert_eq!(limited.len(), 3);

        // Buckets of 4 s aligned to multiples of 4 s (T0 is a multiple of 4000).
        let all = TimeRange {
            from_ms: T0,
            to_ms: T0 + 9000,
        };
        let stepped = store
            .gpu_series(gpu, GpuMetric::PowerMw, all, Some(4000), 100)
            .await
            .expect("step");
        assert_eq!(
            stepped,
            vec![
                (T0, Some(250_000.0)),        // 100..400 W
                (T0 + 4000, Some(650_000.0)), // 500..800 W
                (T0 + 8000, Some(950_000.0)), // 900, 1000 W
            ]
        );
        let util = store
            .gpu_series(
                gpu,
                GpuMetric::UtilGpuPct,
                TimeRange {
                    from_ms: T0 + 5000,
                    to_ms: T0 + 5999,
                },
                Some(1000),
                100,
            )
            .await
            .expect("all-absent bucket");
        assert_eq!(
            util,
            vec![(T0 + 5000, None)],
            "a bucket whose samples all lack the metric is null"
        );
        let edge = store
            .gpu_series(
                gpu,
                GpuMetric::PowerMw,
                TimeRange {
                    from_ms: T0 + 3000,
                    to_ms: T0 + 4000,
                },
                Some(4000),
                100,
            )
            .await
            .expect("partial buckets");
        assert_eq!(
            edge,
            vec![(T0, Some(400_000.0)), (T0 + 4000, Some(500_000.0))],
            "edge buckets hold only in-range samples"
        );
        let none = store
            .gpu_series(gpu, GpuMetric::TempGpuC, all, Some(4000), 100)
            .await
            .expect("absent metric");
        assert_eq!(none, vec![(T0, None), (T0 + 4000, None), (T0 + 8000, None)]);
        let empty = store
            .gpu_series(
                gpu,
                GpuMetric::PowerMw,
                TimeRange {
                    from_ms: 0,
                    to_ms: T0 - 1,
                },
                None,
                100,
            )
            .await
            .expect("empty range");
        assert!(empty.is_empty());
    }

    pub async fn workload_names_learned_later_are_kept(store: Arc<dyn Store>) {
        let rec = register(&store, "node-a", vec![gpu_info_sparse("GPU-a", 0)]).await;
        let mut b1 = batch(1, T0, 1, &["GPU-a"]);
        b1.ticks[0].processes[0].workload = container_workload("c0ffee", None);
        let mut b2 = batch(2, T0 + 1000, 1, &["GPU-a"]);
        b2.ticks[0].processes[0].workload = container_workload("c0ffee", Some("trainer"));
        let mut b3 = batch(3, T0 + 2000, 1, &["GPU-a"]);
        b3.ticks[0].processes[0].workload = container_workload("c0ffee", None);
        for b in [b1, b2, b3] {
            store
                .write_batches(&[node_batch(&rec, b)])
                .await
                .expect("write");
        }
        let procs = store
            .process_samples(rec.gpus[0].id, ALL_TIME, 100)
            .await
            .expect("procs");
        assert_eq!(procs.len(), 3);
        for (_, p) in &procs {
            assert_eq!(p.workload.key(), "container:c0ffee");
            assert_eq!(
                p.workload.container_name.as_deref(),
                Some("trainer"),
                "one workload row, names kept"
            );
        }
    }

    /// Variants of one workload within one group commit (names learned, then lost) are
    /// one workload row holding the latest names, as if written one by one.
    pub async fn workload_renames_take_the_latest_names(store: Arc<dyn Store>) {
        let rec = register(&store, "node-a", vec![gpu_info_sparse("GPU-a", 0)]).await;
        let names = [Some("old"), Some("new"), None];
        let group: Vec<_> = (names.iter().enumerate())
            .map(|(i, name)| {
                let mut b = batch(i as u64 + 1, T0 + i as i64 * 1000, 1, &["GPU-a"]);
                b.ticks[0].processes[0].workload = container_workload("c0ffee", *name);
                node_batch(&rec, b)
            })
            .collect();
        store.write_batches(&group).await.expect("write");
        let names: Vec<Option<String>> = (store.process_samples(rec.gpus[0].id, ALL_TIME, 100))
            .await
            .expect("procs")
            .into_iter()
            .map(|(_, p)| p.workload.container_name)
            .collect();
        assert_eq!(names, vec![Some("new".to_owned()); 3]);
    }

    /// A Slurm job's names and a pod's labels round-trip, arrive later than the ids, and
    /// the latest win; a batch without them erases nothing.
    pub async fn job_names_and_labels_are_kept_and_the_latest_win(store: Arc<dyn Store>) {
        let rec = register(&store, "node-a", vec![gpu_info_sparse("GPU-a", 0)]).await;
        let job = |name: Option<&str>, account: Option<&str>, labels: &[(&str, &str)]| Workload {
            kind: WorkloadKind::Slurm,
            runtime: "slurm".into(),
            job_id: Some("48213".into()),
            job_name: name.map(Into::into),
            account: account.map(Into::into),
            partition: name.map(|_| "gpu".into()),
            job_user: name.map(|_| "alice".into()),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        };
        let variants = [
            job(None, None, &[]),
            job(Some("train"), Some("physics"), &[("team", "vision")]),
            job(Some("train-v2"), None, &[]),
        ];
        for (i, w) in variants.into_iter().enumerate() {
            let mut b = batch(i as u64 + 1, T0 + i as i64 * 1000, 1, &["GPU-a"]);
            b.ticks[0].processes[0].workload = w;
            store
                .write_batches(&[node_batch(&rec, b)])
                .await
                .expect("write");
        }
        let procs = store
            .process_samples(rec.gpus[0].id, ALL_TIME, 100)
            .await
            .expect("procs");
        assert_eq!(procs.len(), 3);
        for (_, p) in &procs {
            let w = &p.workload;
            assert_eq!(w.key(), "slurm:48213");
            assert_eq!(w.job_name.as_deref(), Some("train-v2"), "the latest name");
            assert_eq!(
                w.account.as_deref(),
                Some("physics"),
                "kept when not resent"
            );
            assert_eq!(w.partition.as_deref(), Some("gpu"));
            assert_eq!(w.job_user.as_deref(), Some("alice"));
            assert_eq!(
                w.labels.get("team").map(String::as_str),
                Some("vision"),
                "labels kept when a later sample has none"
            );
        }
    }

    // ---------------------------------------------------------------- rollups

    const MIN: i64 = 60_000;

    pub fn clock_at(t: UnixMs) -> gpufleet_collector::live::status::Clock {
        Arc::new(move || t)
    }

    /// A tick of one GPU with only the given utilization and power, and optionally a host
    /// row with only the given CPU utilization.
    fn util_tick(
        t: UnixMs,
        util: Option<u32>,
        power: Option<u32>,
        cpu: Option<Option<f32>>,
    ) -> Tick {
        Tick {
            time_ms: t,
            gpus: vec![GpuSample {
                gpu_uuid: "GPU-r".into(),
                util_gpu_pct: util,
                power_mw: power,
                // GPM's tensor activity (hundredths of a percent) a tenth of util.
                gpm: GpmMetrics {
                    tensor_active_cpct: util.map(|u| u * 10),
                    ..GpmMetrics::default()
                },
                ..Default::default()
            }],
            host: cpu.map(|c| HostSample {
                cpu_util_pct: c,
                mem_used_bytes: Some(1 << 30),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub async fn write(store: &Arc<dyn Store>, rec: &NodeRecord, seq: u64, ticks: Vec<Tick>) {
        let b = Batch {
            seq,
            ticks,
            delivery: DeliveryStats::default(),
        };
        store
            .write_batches(&[node_batch(rec, b)])
            .await
            .expect("write");
    }

    pub fn rollups(store: &Arc<dyn Store>, now: UnixMs) -> Rollups {
        let options = RetentionOptions {
            batch_rows: 50,
            ..Default::default()
        };
        Rollups::new(store.clone(), options, clock_at(now))
    }

    pub async fn rollups_hold_avg_min_max_and_absent_is_null(store: Arc<dyn Store>) {
        let rec = register(&store, "node-r", vec![gpu_info_sparse("GPU-r", 0)]).await;
        let (gpu, node) = (RollupKey::gpu(rec.gpus[0].id), RollupKey::host(rec.id));
        write(
            &store,
            &rec,
            1,
            vec![
                util_tick(T0, Some(10), Some(100_000), Some(Some(10.0))),
                util_tick(T0 + 20_000, Some(20), Some(300_000), Some(Some(30.0))),
                util_tick(T0 + 40_000, None, Some(200_000), Some(None)),
                util_tick(T0 + MIN, Some(100), None, None),
                util_tick(T0 + 2 * MIN, Some(50), None, Some(Some(5.0))),
            ],
        )
        .await;
        let mut r = rollups(&store, T0);
        r.pass().await.expect("pass");
        let cursor = store
            .rollup_cursors()
            .await
            .expect("cursors")
            .into_iter()
            .find(|c| c.key == gpu)
            .expect("gpu cursor");
        assert_eq!(
            cursor.done_to_ms,
            Some(T0 + 2 * MIN),
            "minutes close when a later sample exists"
        );
        let minutes = store.rollup_minutes(gpu, ALL_TIME).await.expect("minutes");
        assert_eq!(
            minutes
                .iter()
                .map(|m| (m.minute_ms, m.samples))
                .collect::<Vec<_>>(),
            vec![(T0, 3), (T0 + MIN, 1)],
            "the open minute is not rolled up"
        );
        let stats = |n, avg: Option<f64>, min: Option<f64>, max: Option<f64>| MetricStats {
            n,
            avg,
            min,
            max,
        };
        // By hand: util 10, 20, (absent) -> over the two samples that had it.
        assert_eq!(
            minutes[0].gpu(GpuMetric::UtilGpuPct),
            stats(2, Some(15.0), Some(10.0), Some(20.0))
        );
        assert_eq!(
            minutes[0].gpu(GpuMetric::PowerMw),
            stats(3, Some(200_000.0), Some(100_000.0), Some(300_000.0))
        );
        assert_eq!(
            minutes[0].gpu(GpuMetric::TempGpuC),
            stats(0, None, None, None),
            "a metric no sample reported is null, not 0"
        );
        assert_eq!(
            minutes[0].gpu(GpuMetric::GpmTensorActive),
            stats(2, Some(150.0), Some(100.0), Some(200.0)),
            "GPM rolls up like every GPU metric"
        );
        assert_eq!(
            minutes[0].gpu(GpuMetric::GpmSmOccupancy),
            stats(0, None, None, None)
        );
        assert_eq!(
            minutes[1].gpu(GpuMetric::PowerMw),
            stats(0, None, None, None)
        );
        assert_eq!(
            minutes[1].gpu(GpuMetric::UtilGpuPct),
            stats(1, Some(100.0), Some(100.0), Some(100.0))
        );
        let host = store
            .rollup_minutes(node, ALL_TIME)
            .await
            .expect("host minutes");
        assert_eq!(
            host.len(),
            1,
            "minute 0 (minute 1 has no host row, 2 is open)"
        );
        assert_eq!(host[0].samples, 3);
        assert_eq!(
            host[0].host("cpu_util_pct"),
            stats(2, Some(20.0), Some(10.0), Some(30.0))
        );
        assert_eq!(host[0].host("load1"), stats(0, None, None, None));

        // Buckets of several minutes weigh each minute by the samples that had the metric:
        // (10 + 20 + 100) / 3, not the mean of the minute averages (57.5).
        let range = TimeRange {
            from_ms: T0,
            to_ms: T0 + 2 * MIN - 1,
        };
        let two = store
            .gpu_rollup_series(rec.gpus[0].id, GpuMetric::UtilGpuPct, range, 2 * MIN, 100)
            .await
            .expect("series");
        assert_eq!(two.len(), 1);
        assert!(
            (two[0].1.expect("value") - 130.0 / 3.0).abs() < 1e-9,
            "{two:?}"
        );
        let power = store
            .gpu_rollup_series(rec.gpus[0].id, GpuMetric::PowerMw, range, 2 * MIN, 100)
            .await
            .expect("series");
        assert_eq!(power, vec![(T0, Some(200_000.0))]);
        let temp = store
            .gpu_rollup_series(rec.gpus[0].id, GpuMetric::TempGpuC, range, MIN, 100)
            .await
            .expect("series");
        assert_eq!(temp, vec![(T0, None), (T0 + MIN, None)], "absent is null");
        let host_series = store
            .host_rollup_series(rec.id, range, MIN, 100)
            .await
            .expect("host series");
        assert_eq!(host_series.len(), 1);
        assert_eq!(host_series[0].1[0], Some(20.0));
        assert_eq!(host_series[0].1[7], None, "load1 absent");
    }

    pub async fn rollups_are_incremental_and_late_data_is_recomputed(store: Arc<dyn Store>) {
        let rec = register(&store, "node-r", vec![gpu_info_sparse("GPU-r", 0)]).await;
        let gpu = RollupKey::gpu(rec.gpus[0].id);
        let t = |k: i64, u: u32| util_tick(T0 + k * 10_000, Some(u), Some(100_000), None);
        write(&store, &rec, 1, (0..=12).map(|k| t(k, 10)).collect()).await;
        let mut r = rollups(&store, T0 + 10 * MIN);
        r.recheck = false;
        r.pass().await.expect("pass");
        let before = store.rollup_minutes(gpu, ALL_TIME).await.expect("minutes");
        assert_eq!(before.len(), 2);

        // New minutes: only they are added; the old ones stay as they are.
        write(&store, &rec, 2, (13..=24).map(|k| t(k, 30)).collect()).await;
        assert_eq!(r.pass().await.expect("pass"), 2, "two new minutes");
        let after = store.rollup_minutes(gpu, ALL_TIME).await.expect("minutes");
        assert_eq!(&after[..2], &before[..]);
        // Minute 2 holds one sample of the first write (10) and five of the second (30).
        assert_eq!(after[2].gpu(GpuMetric::UtilGpuPct).avg, Some(160.0 / 6.0));

        // A late sample in minute 0, announced: recomputed.
        write(
            &store,
            &rec,
            3,
            vec![util_tick(T0 + 5_000, Some(80), None, None)],
        )
        .await;
        r.mark(gpu, T0 + 5_000);
        r.pass().await.expect("pass");
        let m0 = &store.rollup_minutes(gpu, ALL_TIME).await.expect("minutes")[0];
        assert_eq!(m0.samples, 7);
        assert_eq!(m0.gpu(GpuMetric::UtilGpuPct).avg, Some(140.0 / 7.0));
        assert_eq!(m0.gpu(GpuMetric::UtilGpuPct).max, Some(80.0));
        assert_eq!(
            m0.gpu(GpuMetric::PowerMw).n,
            6,
            "the late sample had no power"
        );

        // Another, not announced: found by the start-up recheck of a new task.
        write(
            &store,
            &rec,
            4,
            vec![util_tick(T0 + MIN + 5_000, Some(0), None, None)],
        )
        .await;
        let stale = store.stale_rollup_minutes(0).await.expect("stale");
        assert_eq!(stale, vec![(gpu, T0 + MIN)]);
        rollups(&store, T0 + 10 * MIN).pass().await.expect("pass");
        assert_eq!(store.stale_rollup_minutes(0).await.expect("stale"), vec![]);
        let m1 = &store.rollup_minutes(gpu, ALL_TIME).await.expect("minutes")[1];
        assert_eq!(
            (m1.samples, m1.gpu(GpuMetric::UtilGpuPct).min),
            (7, Some(0.0))
        );
    }

    /// What a bucketed series must be: per bucket of whole minutes (at most `limit`), the
    /// average over the samples that had the metric, from the minutes as read.
    fn expected_series(
        ms: &[RollupMinute],
        stats: &dyn Fn(&RollupMinute) -> Vec<MetricStats>,
        range: TimeRange,
        step: i64,
        limit: usize,
    ) -> Series {
        let from = range.from_ms - range.from_ms.rem_euclid(MIN);
        let mut buckets: std::collections::BTreeMap<UnixMs, Vec<(f64, u32)>> = Default::default();
        for m in ms
            .iter()
            .filter(|m| (from..=range.to_ms).contains(&m.minute_ms))
        {
            let stats = stats(m);
            let cells = (buckets.entry(m.minute_ms / step * step))
                .or_insert_with(|| vec![(0.0, 0); stats.len()]);
            for (cell, st) in cells.iter_mut().zip(stats) {
                cell.0 += st.avg.unwrap_or(0.0) * f64::from(st.n);
                cell.1 += st.n;
            }
        }
        (buckets.into_iter().take(limit))
            .map(|(t, cells)| {
                let values = cells
                    .into_iter()
                    .map(|(sum, n)| (n > 0).then(|| sum / f64::from(n)));
                (t, values.collect())
            })
            .collect()
    }

    /// Every rollup read of one GPU and its node: minutes (all, and a range inside two
    /// hours) and bucketed series at several steps and limits, from the start and from
    /// inside an hour.
    async fn rollup_reads(
        store: &Arc<dyn Store>,
        rec: &NodeRecord,
    ) -> (Vec<Vec<RollupMinute>>, Vec<Series>) {
        let (gpu, node) = (RollupKey::gpu(rec.gpus[0].id), RollupKey::host(rec.id));
        let inside = TimeRange {
            from_ms: T0 + 25 * MIN + 1,
            to_ms: T0 + 95 * MIN,
        };
        let mut minutes = Vec::new();
        for (key, range) in [
            (gpu, ALL_TIME),
            (node, ALL_TIME),
            (gpu, inside),
            (node, inside),
        ] {
            minutes.push(store.rollup_minutes(key, range).await.expect("minutes"));
        }
        let mut series = Vec::new();
        let mut expected = Vec::new();
        let from_inside = TimeRange {
            from_ms: T0 + 30 * MIN + 7,
            to_ms: T0 + 10 * HOUR_MS,
        };
        let steps = [
            (MIN, 1000),
            (7 * MIN, 1000),
            (2 * HOUR_MS, 10),
            (MIN, 5),
            (25 * MIN, 3),
        ];
        for range in [ALL_TIME, from_inside] {
            for (step, limit) in steps {
                for metric in [
                    GpuMetric::UtilGpuPct,
                    GpuMetric::PowerMw,
                    GpuMetric::TempGpuC,
                ] {
                    let s = store
                        .gpu_rollup_series(rec.gpus[0].id, metric, range, step, limit)
                        .await
                        .expect("series");
                    series.push(s.into_iter().map(|(t, v)| (t, vec![v])).collect());
                    let one = move |m: &RollupMinute| vec![m.gpu(metric)];
                    expected.push(expected_series(&minutes[0], &one, range, step, limit));
                }
                let host = store.host_rollup_series(rec.id, range, step, limit).await;
                series.push(host.expect("host series"));
                let all = |m: &RollupMinute| m.metrics.clone();
                expected.push(expected_series(&minutes[1], &all, range, step, limit));
            }
        }
        same_series(&series, &expected);
        (minutes, series)
    }

    /// A bucketed rollup series: bucket starts and values.
    type Series = Vec<(UnixMs, Vec<Option<f64>>)>;

    /// `a` and `b` hold the same buckets with the same values, to the last few bits (the
    /// databases sum floats in their own ways).
    fn same_series(a: &[Series], b: &[Series]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            let times =
                |s: &[(UnixMs, Vec<Option<f64>>)]| s.iter().map(|p| p.0).collect::<Vec<_>>();
            assert_eq!(times(x), times(y));
            for ((_, u), (_, v)) in x.iter().zip(y) {
                assert_eq!(u.len(), v.len());
                for (p, q) in u.iter().zip(v) {
                    match (p, q) {
                        (Some(p), Some(q)) => {
                            assert!((p - q).abs() <= 1e-12 * p.abs().max(1.0), "{x:?}\n{y:?}")
                        }
                        _ => assert_eq!(p, q, "{x:?}\n{y:?}"),
                    }
                }
            }
        }
    }

    const HOUR_MS: i64 = 3_600_000;

    pub async fn rollup_minutes_are_packed_by_the_hour_and_read_back(store: Arc<dyn Store>) {
        let rec = register(&store, "node-h", vec![gpu_info_sparse("GPU-r", 0)]).await;
        let (gpu, node) = (RollupKey::gpu(rec.gpus[0].id), RollupKey::host(rec.id));
        // Three hours at a tick every 10 s: utilization and power vary and are sometimes
        // absent; a host row on most ticks, its CPU sometimes absent.
        let ticks = (0..3 * 360i64).map(|k| {
            let util = (k % 7 != 3).then_some(((k * 37) % 101) as u32);
            let power = (k % 11 != 5).then_some(100_000 + ((k * 7919) % 250_000) as u32);
            let cpu = match k % 5 {
                0 => None,
                1 => Some(None),
                _ => Some(Some((k % 400) as f32 / 4.0 + 0.1)),
            };
            util_tick(T0 + k * 10_000, util, power, cpu)
        });
        write(&store, &rec, 1, ticks.collect()).await;
        let now = T0 + 4 * HOUR_MS;
        let mut acc = Accountant::new(store.clone(), EnergyOptions::default(), clock_at(now));
        acc.pass().await.expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");
        let (minutes, series) = rollup_reads(&store, &rec).await;
        assert_eq!(minutes[0].len(), 179, "minute 179 is open");
        assert_eq!(minutes[1].len(), 179, "host minutes");

        let out = r.pack(now).await.expect("pack");
        // Hours 0 and 1 of the GPU and of the node; hour 2 holds the newest raw rows.
        assert_eq!(out.rollup_minutes, 4 * 60, "{out:?}");
        let (packed_minutes, packed_series) = rollup_reads(&store, &rec).await;
        assert_eq!(packed_minutes, minutes);
        same_series(&packed_series, &series);
        assert_eq!(
            r.pack(now).await.expect("pack").rollup_minutes,
            0,
            "packed once"
        );
        assert_eq!(store.stale_rollup_minutes(0).await.expect("stale"), vec![]);

        // A late sample in minute 30 reopens its raw minute; recomputing its rollup minute
        // reopens the GPU's hour 0, which is packed again once the raw minute is.
        let late = T0 + 30 * MIN + 5_000;
        write(
            &store,
            &rec,
            2,
            vec![util_tick(late, Some(100), None, None)],
        )
        .await;
        acc.mark(rec.gpus[0].id, late);
        acc.pass().await.expect("account");
        r.mark(gpu, late);
        r.pass().await.expect("roll up");
        let mut expected = minutes.clone();
        let m30 = &mut expected[0][30];
        let util = m30.gpu(GpuMetric::UtilGpuPct);
        m30.samples += 1;
        m30.metrics[0] = MetricStats {
            n: util.n + 1,
            avg: util
                .avg
                .map(|a| (a * f64::from(util.n) + 100.0) / f64::from(util.n + 1)),
            max: Some(100.0),
            ..util
        };
        let (late_minutes, late_series) = rollup_reads(&store, &rec).await;
        assert_eq!(late_minutes[0].len(), 179);
        for (i, (a, b)) in late_minutes[0].iter().zip(&expected[0]).enumerate() {
            if i == 30 {
                assert_eq!(
                    (a.samples, a.metrics[0].n, a.metrics[0].max),
                    (7, b.metrics[0].n, b.metrics[0].max)
                );
                let (x, y) = (
                    a.metrics[0].avg.expect("avg"),
                    b.metrics[0].avg.expect("avg"),
                );
                assert!((x - y).abs() < 1e-9, "{x} {y}");
            } else {
                assert_eq!(a, b, "minute {i}");
            }
        }
        assert_eq!(
            late_minutes[1], minutes[1],
            "the node's minutes are as they were"
        );
        assert_ne!(late_series, series);
        let out = r.pack(now).await.expect("pack");
        assert_eq!((out.minutes, out.rollup_minutes), (1, 60), "{out:?}");
        let (repacked_minutes, repacked_series) = rollup_reads(&store, &rec).await;
        assert_eq!(repacked_minutes, late_minutes);
        same_series(&repacked_series, &late_series);

        // Retention to the middle of hour 0 keeps its minutes from there on; to the end of
        // hour 0, none of them.
        let from = |cutoff: UnixMs| {
            let keep = |ms: &Vec<RollupMinute>| {
                ms.iter()
                    .filter(|m| m.minute_ms >= cutoff)
                    .cloned()
                    .collect::<Vec<_>>()
            };
            vec![keep(&late_minutes[0]), keep(&late_minutes[1])]
        };
        let out = store
            .expire_rollups_before(T0 + 30 * MIN, 50)
            .await
            .expect("expire");
        assert_eq!(
            out.deleted.get("packed_gpu_rollup_hours"),
            Some(&1),
            "{out:?}"
        );
        assert_eq!(
            out.deleted.get("packed_host_rollup_hours"),
            Some(&1),
            "{out:?}"
        );
        let read = |key| store.rollup_minutes(key, ALL_TIME);
        let kept = vec![
            read(gpu).await.expect("gpu"),
            read(node).await.expect("node"),
        ];
        assert_eq!(kept, from(T0 + 30 * MIN));
        assert_eq!(kept[0][0].minute_ms, T0 + 30 * MIN);
        store
            .expire_rollups_before(T0 + HOUR_MS, 50)
            .await
            .expect("expire");
        let kept = vec![
            read(gpu).await.expect("gpu"),
            read(node).await.expect("node"),
        ];
        assert_eq!(kept, from(T0 + HOUR_MS));
        let series = store
            .gpu_rollup_series(
                rec.gpus[0].id,
                GpuMetric::UtilGpuPct,
                ALL_TIME,
                2 * HOUR_MS,
                10,
            )
            .await
            .expect("series");
        // T0 is on an even hour: the first bucket now holds hour 1 alone.
        let times: Vec<UnixMs> = series.iter().map(|p| p.0).collect();
        assert_eq!(times, vec![T0, T0 + 2 * HOUR_MS]);
    }

    /// Two GPUs' ticks (utilization and power only), three hours at one every 30 s, with
    /// their rollups and energy computed as of `now`: GPU-a's hours come first in every
    /// pass (the lower id).
    pub async fn two_gpu_hours(
        store: &Arc<dyn Store>,
        node: &str,
    ) -> (NodeRecord, Rollups, Accountant) {
        let rec = register(
            store,
            node,
            vec![gpu_info_sparse("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let ticks = (0..3 * 120i64)
            .map(|k| two_gpu_tick(T0 + k * 30_000, &["GPU-a", "GPU-b"], (k % 100) as u32))
            .collect();
        write(store, &rec, 1, ticks).await;
        let now = T0 + 4 * HOUR_MS;
        let mut acc = Accountant::new(store.clone(), EnergyOptions::default(), clock_at(now));
        acc.pass().await.expect("account");
        let mut r = rollups(store, now);
        r.pass().await.expect("roll up");
        (rec, r, acc)
    }

    pub fn two_gpu_tick(t: UnixMs, uuids: &[&str], util: u32) -> Tick {
        Tick {
            time_ms: t,
            gpus: (uuids.iter())
                .map(|u| GpuSample {
                    gpu_uuid: (*u).into(),
                    util_gpu_pct: Some(util),
                    power_mw: Some(100_000 + util * 1000),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Packs with a budget of one until a call packs nothing; the rollup minutes packed.
    pub async fn pack_in_small_steps(store: &Arc<dyn Store>, before: UnixMs) -> usize {
        let mut rollup_minutes = 0;
        for _ in 0..1000 {
            let out = store.pack_closed_minutes(before, 1).await.expect("pack");
            rollup_minutes += out.rollup_minutes;
            if out.minutes == 0 && out.rollup_minutes == 0 {
                return rollup_minutes;
            }
        }
        panic!("packing never ended");
    }

    /// An hour that must wait for its raw rows costs no budget: the other series' hours
    /// are packed meanwhile, and its own once its raw minutes are.
    pub async fn an_hour_waiting_for_raw_rows_does_not_starve_the_others(store: Arc<dyn Store>) {
        let (rec, mut r, mut acc) = two_gpu_hours(&store, "node-w").await;
        let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
        // GPU-a's late sample in minute 30, not yet accounted: its raw minute cannot be
        // packed, so neither can its hour 0.
        let late = T0 + 30 * MIN + 5_000;
        write(&store, &rec, 2, vec![two_gpu_tick(late, &["GPU-a"], 100)]).await;
        let before = T0 + 4 * HOUR_MS;
        let minutes = |g| store.rollup_minutes(RollupKey::gpu(g), ALL_TIME);
        let b_minutes = minutes(b).await.expect("b");
        // GPU-b's hours 0 and 1 and GPU-a's hour 1; hour 2 holds the newest raw rows.
        assert_eq!(pack_in_small_steps(&store, before).await, 3 * 60);
        assert_eq!(minutes(b).await.expect("b"), b_minutes);

        acc.mark(a, late);
        acc.pass().await.expect("account");
        r.mark(RollupKey::gpu(a), late);
        r.pass().await.expect("roll up");
        let a_minutes = minutes(a).await.expect("a");
        assert_eq!(a_minutes[30].samples, 3, "the late sample is counted");
        assert_eq!(
            pack_in_small_steps(&store, before).await,
            60,
            "GPU-a's hour 0"
        );
        assert_eq!(minutes(a).await.expect("a"), a_minutes);
    }

    /// Buckets longer than a page of packed hours are summed whole, however few buckets
    /// are asked for.
    pub async fn long_buckets_over_packed_hours_are_summed_whole(store: Arc<dyn Store>) {
        let rec = register(&store, "node-l", vec![gpu_info_sparse("GPU-r", 0)]).await;
        let (gpu, node) = (RollupKey::gpu(rec.gpus[0].id), RollupKey::host(rec.id));
        // 110 hours at a tick a minute.
        let ticks: Vec<Tick> = (0..110 * 60i64)
            .map(|k| {
                let power = 100_000 + (k % 13) as u32 * 1000;
                util_tick(
                    T0 + k * MIN,
                    Some((k % 89) as u32),
                    Some(power),
                    Some(Some((k % 50) as f32)),
                )
            })
            .collect();
        for (i, chunk) in ticks.chunks(300).enumerate() {
            write(&store, &rec, i as u64 + 1, chunk.to_vec()).await;
        }
        let now = T0 + 112 * HOUR_MS;
        let mut acc = Accountant::new(store.clone(), EnergyOptions::default(), clock_at(now));
        acc.pass().await.expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");
        let out = r.pack(now).await.expect("pack");
        // Hours 0 to 108 of the GPU and of the node; hour 109 holds the newest raw rows.
        assert_eq!(out.rollup_minutes, 2 * 109 * 60, "{out:?}");
        let minutes = store.rollup_minutes(gpu, ALL_TIME).await.expect("gpu");
        let host = store.rollup_minutes(node, ALL_TIME).await.expect("node");
        assert_eq!((minutes.len(), host.len()), (110 * 60 - 1, 110 * 60 - 1));
        for (step, limit) in [
            (7 * 24 * HOUR_MS, 1),
            (50 * HOUR_MS, 1),
            (24 * HOUR_MS, 2),
            (MIN, 3),
        ] {
            let got = store
                .gpu_rollup_series(rec.gpus[0].id, GpuMetric::PowerMw, ALL_TIME, step, limit)
                .await
                .expect("series");
            let got: Series = got.into_iter().map(|(t, v)| (t, vec![v])).collect();
            let one = |m: &RollupMinute| vec![m.gpu(GpuMetric::PowerMw)];
            same_series(
                &[got],
                &[expected_series(&minutes, &one, ALL_TIME, step, limit)],
            );
            let got = store
                .host_rollup_series(rec.id, ALL_TIME, step, limit)
                .await;
            let all = |m: &RollupMinute| m.metrics.clone();
            let want = expected_series(&host, &all, ALL_TIME, step, limit);
            same_series(&[got.expect("host series")], &[want]);
        }
    }

    /// Everything the reports read, to compare before and after retention.
    pub async fn accounted(store: &Arc<dyn Store>, rec: &NodeRecord) -> String {
        let mut out = format!(
            "{:?}\n{:?}\n{:?}\n",
            store.gpu_energy(ALL_TIME).await.expect("gpu energy"),
            store
                .workload_energy(ALL_TIME, None, None)
                .await
                .expect("workloads"),
            store.energy_minutes(None, ALL_TIME).await.expect("minutes"),
        );
        for g in &rec.gpus {
            let m = store.rollup_minutes(RollupKey::gpu(g.id), ALL_TIME).await;
            out += &format!("{:?}\n", m.expect("rollups"));
        }
        let h = store
            .rollup_minutes(RollupKey::host(rec.id), ALL_TIME)
            .await;
        out + &format!("{:?}", h.expect("host rollups"))
    }

    /// A seeded xorshift generator: random test data that is the same on every run.
    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    /// A tick of GPU-r whose host metrics and sampler cost are each present or absent at
    /// random, with random values (`next`: a seeded generator).
    fn random_host_tick(t: UnixMs, next: &mut impl FnMut() -> u64) -> Tick {
        let mut bits = next();
        let mut some = |v: u64| {
            bits >>= 1;
            (bits & 1 == 1).then_some(v)
        };
        let host = HostSample {
            cpu_util_pct: some(0).map(|_| (next() % 10_000) as f32 / 100.0),
            mem_used_bytes: some(next() >> 4),
            mem_total_bytes: some(512 << 30),
            disk_read_bps: some(next() % 1_000_000_000),
            disk_write_bps: some(next() >> 1),
            net_rx_bps: some(next() % 10_000),
            net_tx_bps: some(0),
            load1: some(0).map(|_| (next() % 50_000) as f32 / 64.0),
        };
        let calls = (0..next() % 4)
            .map(|i| (format!("nvmlCall{i}"), (next() % 100_000) as u32))
            .collect();
        let cost = SamplerCost {
            cpu_us: some(next() % 5_000).map(|v| v as u32),
            wall_us: some(next() % 50_000).map(|v| v as u32),
            source_us: some(u64::from(u32::MAX)).map(|v| v as u32),
            slowest_calls_us: calls,
        };
        Tick {
            host: some(0).map(|_| host),
            cost: some(0).map(|_| cost),
            ..util_tick(t, Some(50), Some(100_000), None)
        }
    }

    /// Closed host minutes are packed and read back field for field (absent stays absent);
    /// a write into a packed minute (replay, conflict, late row) is judged against the
    /// stored rows, the minute is packed again once its rollup counts the late row, and
    /// retention deletes packed minutes behind the raw horizon.
    pub async fn host_rows_are_packed_read_back_and_reopened_by_writes(store: Arc<dyn Store>) {
        const HOUR: i64 = 3_600_000;
        let rec = register(&store, "node-p", vec![gpu_info_sparse("GPU-r", 0)]).await;
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15_u64);
        // Five minutes at 1 Hz, then one tick an hour later (its minute stays open).
        let mut ticks: Vec<Tick> = (0..300)
            .map(|k| random_host_tick(T0 + k * 1000, &mut next))
            .collect();
        ticks.push(common::tick(T0 + HOUR, &["GPU-r"], 1));
        write(&store, &rec, 1, ticks.clone()).await;
        let mut r = rollups(&store, T0 + 2 * HOUR);
        r.pass().await.expect("roll up");
        let before = store
            .host_samples(rec.id, ALL_TIME, 10_000)
            .await
            .expect("hosts");
        let with_row = ticks
            .iter()
            .filter(|t| t.host.is_some() || t.cost.is_some());
        assert_eq!(before.len(), with_row.count());
        assert!(
            before
                .iter()
                .any(|h| h.sample.is_none() && h.cost.is_some())
        );
        assert!(
            before
                .iter()
                .any(|h| h.sample.is_some() && h.cost.is_none())
        );
        let in_minutes = |rows: &[HostRow], m: std::ops::Range<i64>| {
            (rows.iter())
                .filter(|h| (T0 + m.start * MIN..T0 + m.end * MIN).contains(&h.time_ms))
                .count() as u64
        };

        // Nothing `pack_after` old yet: nothing is packed.
        let pack_after = RetentionOptions::default().pack_after.as_millis() as i64;
        assert_eq!(r.pack(T0 + pack_after).await.expect("pack").minutes, 0);
        let out = r.pack(T0 + 2 * HOUR).await.expect("pack");
        assert_eq!(out.minutes, 5, "{out:?}");
        assert_eq!(out.rows, in_minutes(&before, 0..5));
        assert_eq!(r.pack(T0 + 2 * HOUR).await.expect("pack").minutes, 0);
        let read = |range| {
            let store = store.clone();
            async move { store.host_samples(rec.id, range, 10_000).await.expect("h") }
        };
        assert_eq!(
            read(ALL_TIME).await,
            before,
            "every row read back as stored"
        );
        let inside = TimeRange {
            from_ms: T0 + 30_500,
            to_ms: T0 + 250_000,
        };
        let want: Vec<HostRow> = (before.iter())
            .filter(|h| (inside.from_ms..=inside.to_ms).contains(&h.time_ms))
            .cloned()
            .collect();
        assert_eq!(read(inside).await, want);
        let first_70 = store.host_samples(rec.id, ALL_TIME, 70).await.expect("h");
        assert_eq!(first_70, before[..70]);
        let latest = store.latest_host_samples().await.expect("latest");
        assert_eq!(latest.len(), 1);
        assert_eq!(latest[0].time_ms, T0 + HOUR, "the newest row stays a row");

        // Replaying packed ticks changes nothing; another host sample at a packed tick is
        // a conflict; a late tick lands in its packed minute.
        let replay = Batch {
            seq: 2,
            ticks: ticks[..100].to_vec(),
            delivery: DeliveryStats::default(),
        };
        let out = store
            .write_batches(&[node_batch(&rec, replay)])
            .await
            .expect("replay");
        assert!(out.conflicts.is_empty(), "{:?}", out.conflicts);
        // (In minute 3, which the replay did not reopen.)
        let stored = (ticks[180..].iter()).position(|t| t.host.is_some());
        let mut forged = ticks[180 + stored.expect("a tick with host metrics")].clone();
        forged.host = Some(HostSample {
            cpu_util_pct: Some(99.5),
            ..Default::default()
        });
        let forged = Batch {
            seq: 3,
            ticks: vec![forged],
            delivery: DeliveryStats::default(),
        };
        let out = store
            .write_batches(&[node_batch(&rec, forged)])
            .await
            .expect("forged");
        assert_eq!(out.conflicts.len(), 1);
        assert!(out.conflicts[0].reason.contains("host sample"));
        assert_eq!(read(ALL_TIME).await, before);
        let late = common::tick(T0 + MIN + 500, &["GPU-r"], 2);
        write(&store, &rec, 4, vec![late.clone()]).await;
        let mut after = before.clone();
        after.push(HostRow {
            time_ms: late.time_ms,
            sample: late.host.clone(),
            cost: late.cost.clone(),
        });
        after.sort_by_key(|h| h.time_ms);
        assert_eq!(read(ALL_TIME).await, after);
        let host = RollupKey::host(rec.id);
        assert!(
            (store.stale_rollup_minutes(0).await.expect("stale")).contains(&(host, T0 + MIN)),
            "the reopened minute holds all its rows again"
        );
        // Minutes 0 and 3 are packed again at once; minute 1 only once its rollup counts the
        // late row.
        let out = r.pack(T0 + 2 * HOUR).await.expect("pack");
        assert_eq!(out.minutes, 2, "{out:?}");
        r.mark(host, late.time_ms);
        r.mark(RollupKey::gpu(rec.gpus[0].id), late.time_ms);
        r.pass().await.expect("roll up");
        assert_eq!(r.pack(T0 + 2 * HOUR).await.expect("pack").minutes, 1);
        let minutes = store.rollup_minutes(host, ALL_TIME).await.expect("m");
        assert_eq!(
            minutes[1].samples as usize,
            in_minutes(&after, 1..2) as usize
        );
        assert_eq!(read(ALL_TIME).await, after);
        assert_eq!(store.stale_rollup_minutes(0).await.expect("stale"), vec![]);

        // Retention three minutes past a week: the packed minutes 0..3 go.
        let out = r
            .expire(T0 + 7 * 86_400_000 + 3 * MIN)
            .await
            .expect("expire");
        assert_eq!(out.deleted.get("packed_host_minutes"), Some(&3), "{out:?}");
        let kept: Vec<HostRow> = (after.iter())
            .filter(|h| h.time_ms >= T0 + 3 * MIN)
            .cloned()
            .collect();
        assert_eq!(read(ALL_TIME).await, kept);
    }

    /// After a late tick of `gpu` at `late_ms` reopened its minutes: none is packed again
    /// until the energy is recomputed, then the process minute; the host and GPU minutes
    /// once the rollups are recomputed too.
    async fn repack_after_late(
        rec: &NodeRecord,
        gpu: GpuId,
        late_ms: UnixMs,
        (acc, r): (&mut Accountant, &mut Rollups),
        now: UnixMs,
    ) {
        assert_eq!(r.pack(now).await.expect("pack").minutes, 0);
        acc.mark(gpu, late_ms);
        acc.pass().await.expect("account");
        assert_eq!(
            r.pack(now).await.expect("pack").minutes,
            1,
            "the process minute"
        );
        r.mark(RollupKey::gpu(gpu), late_ms);
        r.mark(RollupKey::host(rec.id), late_ms);
        r.pass().await.expect("roll up");
        assert_eq!(r.pack(now).await.expect("pack").minutes, 2, "host and GPU");
    }

    /// Energy recomputed over packed minutes is `totals` (what [`accounted`] read), and
    /// `check-energy` finds no violation.
    async fn energy_recomputes_unchanged(
        store: &Arc<dyn Store>,
        rec: &NodeRecord,
        energy: &EnergyOptions,
        totals: &str,
    ) {
        accountant::recompute(store.as_ref(), ALL_TIME, energy)
            .await
            .expect("recompute");
        assert_eq!(accounted(store, rec).await, totals);
        let report = energy_check::check(store.as_ref(), ALL_TIME)
            .await
            .expect("check");
        assert_eq!(report.violations, vec![]);
    }

    /// Closed minutes of process ticks are packed once energy-accounted, and read back
    /// exactly (process samples with their identities, energy inputs); a late tick
    /// reopens its minute, which waits for its energy to be recomputed; recomputing energy
    /// over packed minutes changes nothing and `check-energy` passes; retention deletes
    /// packed minutes behind the raw horizon.
    pub async fn process_ticks_are_packed_and_energy_stays_exact(store: Arc<dyn Store>) {
        const HOUR: i64 = 3_600_000;
        let rec = register(
            &store,
            "node-q",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        write(&store, &rec, 1, ticks_with_processes(&["GPU-a", "GPU-b"])).await;
        let now = T0 + 2 * HOUR;
        let energy = EnergyOptions::default();
        let mut acc = Accountant::new(store.clone(), energy.clone(), clock_at(now));
        acc.pass().await.expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");
        let ids: Vec<GpuId> = rec.gpus.iter().map(|g| g.id).collect();
        let reads = |store: Arc<dyn Store>, ids: Vec<GpuId>| async move {
            let mut out = Vec::new();
            for g in ids {
                let p = store
                    .process_samples(g, ALL_TIME, 100_000)
                    .await
                    .expect("p");
                let e = (store.energy_inputs(g, T0, T0 + 2 * HOUR).await).expect("e");
                let mid = TimeRange {
                    from_ms: T0 + 70_500,
                    to_ms: T0 + 200_000,
                };
                let some = store.process_samples(g, mid, 77).await.expect("p");
                out.push(format!("{p:?}\n{e:?}\n{some:?}"));
            }
            out
        };
        let before = reads(store.clone(), ids.clone()).await;
        let totals = accounted(&store, &rec).await;
        assert!(before[0].contains("pid: 5000"));
        let ticks_before = store.node_ticks(&rec, ALL_TIME, 1000).await.expect("ticks");

        let out = r.pack(now).await.expect("pack");
        assert_eq!(
            out.minutes,
            5 + 2 * 5 + 2 * 5,
            "host, process and GPU minutes: {out:?}"
        );
        assert_eq!(reads(store.clone(), ids.clone()).await, before);
        let ticks = store.node_ticks(&rec, ALL_TIME, 1000).await.expect("ticks");
        assert_eq!(
            ticks, ticks_before,
            "a node's ticks, processes and host rows included"
        );

        // A late tick of GPU-a in minute 1: its process minute (and the node's host minute)
        // become rows again, and wait for the energy (and rollup) recomputation.
        let late = common::tick(T0 + MIN + 250, &["GPU-a"], 9);
        write(&store, &rec, 2, vec![late.clone()]).await;
        let p = (store.process_samples(ids[0], ALL_TIME, 100_000).await).expect("p");
        assert!(p.iter().any(|(t, _)| *t == late.time_ms));
        repack_after_late(&rec, ids[0], late.time_ms, (&mut acc, &mut r), now).await;
        let with_late = reads(store.clone(), ids.clone()).await;
        assert_ne!(with_late[0], before[0]);
        assert_eq!(with_late[1], before[1]);
        let totals_late = accounted(&store, &rec).await;
        assert_ne!(totals_late, totals);
        energy_recomputes_unchanged(&store, &rec, &energy, &totals_late).await;

        let out = r
            .expire(T0 + 7 * 86_400_000 + 3 * MIN)
            .await
            .expect("expire");
        assert_eq!(
            out.deleted.get("packed_process_minutes"),
            Some(&6),
            "{out:?}"
        );
        let left = (store.process_samples(ids[1], ALL_TIME, 100_000).await).expect("p");
        assert_eq!(left.first().map(|p| p.0), Some(T0 + 3 * MIN));
    }

    /// Five minutes of ticks of two GPUs and an hour later one more, processes coming and
    /// going (none at some ticks, a third one for a while).
    fn ticks_with_processes(gpus: &[&str; 2]) -> Vec<Tick> {
        const HOUR: i64 = 3_600_000;
        let mut ticks = batch(1, T0, 300, gpus).ticks;
        for (k, t) in ticks.iter_mut().enumerate() {
            if k % 17 == 3 {
                t.processes.clear();
            } else if (100..160).contains(&k) {
                let mut extra = t.processes[0].clone();
                extra.pid = 5000;
                extra.sm_util_pct = None;
                extra.gpu_mem_bytes = Some(k as u64 * 1_000_003);
                t.processes.push(extra);
            }
        }
        ticks.push(common::tick(T0 + HOUR, gpus, 1));
        ticks
    }

    /// The items of `ticks` (`items`: a tick's samples or processes) whose GPU (`uuid_of`)
    /// is `uuid`, each with its tick's time.
    fn of_gpu<T: Clone>(
        ticks: &[Tick],
        items: fn(&Tick) -> &Vec<T>,
        uuid_of: fn(&T) -> &String,
        uuid: &str,
    ) -> Vec<(UnixMs, T)> {
        (ticks.iter())
            .flat_map(|t| {
                let mine = items(t).iter().filter(|x| uuid_of(x) == uuid);
                mine.map(|x| (t.time_ms, x.clone()))
            })
            .collect()
    }

    /// `ticks` with the GPU UUIDs `from` named `to` instead (their order matched).
    fn renamed(ticks: &[Tick], from: [&str; 2], to: [&str; 2]) -> Vec<Tick> {
        let name = |u: &mut String| {
            if let Some(i) = from.iter().position(|f| f == u) {
                *u = to[i].to_owned();
            }
        };
        let mut out = ticks.to_vec();
        for t in &mut out {
            t.gpus.iter_mut().for_each(|g| name(&mut g.gpu_uuid));
            t.processes.iter_mut().for_each(|p| name(&mut p.gpu_uuid));
            t.health.iter_mut().for_each(|h| name(&mut h.gpu_uuid));
        }
        out
    }

    pub async fn samples_and_process_ticks_of_closed_minutes_are_packed_as_they_arrive(
        store: Arc<dyn Store>,
    ) {
        const HOUR: i64 = 3_600_000;
        let now = T0 + 2 * HOUR;
        // The same ticks for two nodes: one written as rows, one packed as it arrives,
        // as a spool is emptied after an outage (50 ticks a batch: batches split minutes).
        let (rows_gpus, packed_gpus) = (["GPU-c", "GPU-d"], ["GPU-a", "GPU-b"]);
        let mut recs = Vec::new();
        for (node, gpus, clock) in [
            ("node-rows", rows_gpus, None),
            ("node-packed", packed_gpus, Some(clock_at(now))),
        ] {
            let infos = vec![gpu_info_full(gpus[0], 0), gpu_info_sparse(gpus[1], 1)];
            let rec = register(&store, node, infos).await;
            store.set_arrival_clock(clock);
            let ticks = ticks_with_processes(&gpus);
            for (i, chunk) in ticks.chunks(50).enumerate() {
                write(&store, &rec, i as u64 + 1, chunk.to_vec()).await;
            }
            // A replay of the second batch whose processes now read otherwise: the ticks
            // stored stay as they were, as a row insert would leave them.
            let mut replay = ticks[50..100].to_vec();
            for p in replay.iter_mut().flat_map(|t| &mut t.processes) {
                p.sm_util_pct = Some(1);
            }
            write(&store, &rec, 2, replay.clone()).await;
            // One whose GPU sample differs is a conflict: the batch is left out, reported.
            replay[7].gpus[0].util_gpu_pct = Some(1);
            let clash = Batch {
                seq: 2,
                ticks: replay,
                delivery: DeliveryStats::default(),
            };
            let out = store.write_batches(&[node_batch(&rec, clash)]).await;
            assert_eq!(out.expect("write").conflicts.len(), 1, "{node}");
            // Every sample and tick once, as first written, identities joined back.
            for (g, uuid) in rec.gpus.iter().zip(gpus) {
                let read = store.process_samples(g.id, ALL_TIME, 100_000).await;
                let expected = of_gpu(&ticks, |t| &t.processes, |p| &p.gpu_uuid, uuid);
                assert_eq!(read.expect("read"), expected, "{node} {uuid}");
                let read = store.gpu_samples(g.id, ALL_TIME, 100_000).await;
                let expected = of_gpu(&ticks, |t| &t.gpus, |s| &s.gpu_uuid, uuid);
                assert_eq!(read.expect("read"), expected, "{node} {uuid}");
            }
            recs.push(rec);
        }
        // A follower reading both nodes' ticks sees the same ticks.
        let followed = store
            .nodes_ticks(&[(&recs[0], ALL_TIME), (&recs[1], ALL_TIME)], 1000)
            .await
            .expect("follow");
        assert_eq!(followed[1].len(), 301);
        assert_eq!(renamed(&followed[1], packed_gpus, rows_gpus), followed[0]);
        // So does one that follows the packed node's newest 30 s only.
        let newest = TimeRange {
            from_ms: T0 + HOUR - 30_000,
            to_ms: T0 + HOUR,
        };
        let followed = store
            .nodes_ticks(&[(&recs[0], newest), (&recs[1], newest)], 1000)
            .await
            .expect("follow");
        assert_eq!(followed[1].len(), 1);
        assert_eq!(renamed(&followed[1], packed_gpus, rows_gpus), followed[0]);
        // The newest sample of a GPU whose newest minute was packed on arrival, with its
        // processes.
        let latest = store.latest_gpu_samples().await.expect("latest");
        let newest_of = |id: GpuId| {
            let l = latest.iter().find(|l| l.gpu == id).expect("newest sample");
            let mut s = l.sample.clone();
            s.gpu_uuid.clear();
            let pids = l.processes.iter().map(|p| p.pid).collect::<Vec<_>>();
            (l.time_ms, s, pids)
        };
        for (r, p) in recs[0].gpus.iter().zip(&recs[1].gpus) {
            assert_eq!(newest_of(p.id), newest_of(r.id));
            assert!(!newest_of(p.id).2.is_empty());
        }

        let energy = EnergyOptions::default();
        let mut acc = Accountant::new(store.clone(), energy.clone(), clock_at(now));
        acc.pass().await.expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");
        // Energy split alike from rows and from packed ticks.
        let minutes = |id: GpuId| {
            let store = store.clone();
            async move {
                let m = store.energy_minutes(Some(id), ALL_TIME).await;
                m.expect("minutes")
                    .into_iter()
                    .map(|(_, m)| m)
                    .collect::<Vec<_>>()
            }
        };
        // Rollups alike, where the rows' are computed: the packed minutes' by the write,
        // the newest one too (its minute is closed); the rows' by the rollup task, up to
        // the newest minute.
        let rolled = |id: GpuId| {
            let store = store.clone();
            async move {
                let m = store.rollup_minutes(RollupKey::gpu(id), ALL_TIME).await;
                m.expect("rollups")
            }
        };
        for (r, p) in recs[0].gpus.iter().zip(&recs[1].gpus) {
            let from_rows = minutes(r.id).await;
            assert!(from_rows.iter().any(|m| m.attributed_mj > 0));
            assert_eq!(minutes(p.id).await, from_rows);
            let (from_rows, packed) = (rolled(r.id).await, rolled(p.id).await);
            assert_eq!(from_rows.len(), 5);
            assert_eq!(packed[..5], from_rows[..]);
            assert_eq!(packed.len(), 6);
            assert_eq!((packed[5].minute_ms, packed[5].samples), (T0 + HOUR, 1));
        }
        // The packer finds the packed node's samples and process ticks packed already:
        // of its minutes before the newest, it packs host rows only.
        let out = r.pack(now).await.expect("pack");
        assert_eq!(out.minutes, (5 + 2 * 5 + 2 * 5) + 5, "{out:?}");
        let totals = accounted(&store, &recs[1]).await;
        energy_recomputes_unchanged(&store, &recs[1], &energy, &totals).await;
        for (g, uuid) in recs[1].gpus.iter().zip(packed_gpus) {
            let read = store.process_samples(g.id, ALL_TIME, 100_000).await;
            let ticks = ticks_with_processes(&packed_gpus);
            let n = (ticks.iter().flat_map(|t| &t.processes)).filter(|p| p.gpu_uuid == uuid);
            assert_eq!(read.expect("read").len(), n.count());
        }
        // A late tick in a packed closed minute joins its packed values; its rollup row
        // counts it, and the accountant recomputes the minute's energy (its watermark went
        // back: nothing else tells it here).
        let late = common::tick(T0 + 60_250, &packed_gpus, 9);
        write(&store, &recs[1], 99, vec![late.clone()]).await;
        let gpu_a = recs[1].gpus[0].id;
        let read = store.process_samples(gpu_a, ALL_TIME, 100_000).await;
        let at_late: Vec<u32> = (read.expect("read").iter())
            .filter(|(t, _)| *t == late.time_ms)
            .map(|(_, p)| p.pid)
            .collect();
        assert_eq!(at_late, vec![4242]);
        let read = store.gpu_samples(gpu_a, ALL_TIME, 100_000).await;
        assert!(read.expect("read").iter().any(|(t, _)| *t == late.time_ms));
        let packed = rolled(gpu_a).await;
        let from_rows = rolled(recs[0].gpus[0].id).await;
        assert_eq!(packed[1].samples, from_rows[1].samples + 1);
        acc.pass().await.expect("account");
        let energy_minute = |m: Vec<GpuMinute>| m[1].samples;
        assert_eq!(
            energy_minute(minutes(gpu_a).await),
            energy_minute(minutes(recs[0].gpus[0].id).await) + 1
        );
        let totals = accounted(&store, &recs[1]).await;
        energy_recomputes_unchanged(&store, &recs[1], &energy, &totals).await;
    }

    /// A write that catches up on many closed minutes at once (an agent emptying a long
    /// spool in one batch) rolls up each of them as the rollup task does from rows; the
    /// write stores its rollup rows several to a statement.
    pub async fn a_write_catching_up_on_many_minutes_rolls_each_one_up(store: Arc<dyn Store>) {
        let now = T0 + 2 * 3_600_000;
        let mut recs = Vec::new();
        for (node, gpus, clock) in [
            ("node-rows", ["GPU-c", "GPU-d"], None),
            ("node-packed", ["GPU-a", "GPU-b"], Some(clock_at(now))),
        ] {
            let infos = vec![gpu_info_full(gpus[0], 0), gpu_info_sparse(gpus[1], 1)];
            let rec = register(&store, node, infos).await;
            store.set_arrival_clock(clock);
            // 45 minutes, a tick every 20 s, in one write: 90 GPU minutes.
            let ticks = (0..135u32).map(|k| tick(T0 + i64::from(k) * 20_000, &gpus, k));
            write(&store, &rec, 1, ticks.collect()).await;
            recs.push(rec);
        }
        store.set_arrival_clock(None);
        let mut acc = Accountant::new(store.clone(), EnergyOptions::default(), clock_at(now));
        acc.pass().await.expect("account");
        rollups(&store, now).pass().await.expect("roll up");
        for (r, p) in recs[0].gpus.iter().zip(&recs[1].gpus) {
            let rolled = |id: GpuId| store.rollup_minutes(RollupKey::gpu(id), ALL_TIME);
            // The rollup task leaves the rows' newest minute to a later pass; the write
            // rolled up every closed minute.
            let (from_rows, packed) = (rolled(r.id).await, rolled(p.id).await);
            let (from_rows, packed) = (from_rows.expect("rollups"), packed.expect("rollups"));
            assert_eq!((from_rows.len(), packed.len()), (44, 45));
            assert_eq!(packed[..44], from_rows[..]);
        }
    }

    /// A follower reads a catching-up node's ticks whose GPU samples were packed as they
    /// arrived, though no row of them is left to show there are ticks: no host metrics,
    /// no processes.
    pub async fn a_follower_reads_samples_packed_on_arrival(store: Arc<dyn Store>) {
        let gpus = ["GPU-f", "GPU-g"];
        let infos = vec![gpu_info_full(gpus[0], 0), gpu_info_sparse(gpus[1], 1)];
        let rec = register(&store, "node-f", infos).await;
        store.set_arrival_clock(Some(clock_at(T0 + 3_600_000)));
        let mut ticks = batch(1, T0, 150, &gpus).ticks;
        for t in &mut ticks {
            (t.host, t.cost) = (None, None);
            t.processes.clear();
        }
        for (i, chunk) in ticks.chunks(50).enumerate() {
            write(&store, &rec, i as u64 + 1, chunk.to_vec()).await;
        }
        let read = store.nodes_ticks(&[(&rec, ALL_TIME)], 1000).await;
        assert_eq!(read.expect("follow"), vec![ticks.clone()]);
        // A live follower's range: the 30 s up to the node's newest tick.
        let newest = ticks.last().map_or(T0, |t| t.time_ms);
        let range = TimeRange {
            from_ms: newest - 30_000,
            to_ms: newest,
        };
        let read = store.nodes_ticks(&[(&rec, range)], 1000).await;
        let expected: Vec<Tick> = (ticks.iter())
            .filter(|t| t.time_ms >= range.from_ms)
            .cloned()
            .collect();
        assert_eq!(read.expect("follow"), vec![expected]);
    }

    /// `s` with every field but the energy counter and the power of a counter-metered
    /// GPU (what check-energy judges) present or absent at random, with random values,
    /// and 0–3 NVLink links, each rate present or absent (`next`: a seeded generator).
    fn randomize_gpu_sample(s: &mut GpuSample, metered: bool, next: &mut impl FnMut() -> u64) {
        let mut bits = next();
        let mut some = |v: u64| {
            bits >>= 1;
            (bits & 1 == 1).then_some(v)
        };
        let pct = |v: u64| (v % 101) as u32;
        s.util_gpu_pct = some(next()).map(pct);
        s.util_mem_pct = some(next()).map(pct);
        s.mem_used_bytes = some(next() >> 20);
        s.mem_total_bytes = some(80 << 30);
        s.mem_reserved_bytes = some(next() % 1_000_000_000);
        if !metered {
            s.power_mw = some(next() % 700_000).map(|v| v as u32);
        }
        s.power_instant_mw = some(next() % 700_000).map(|v| v as u32);
        s.power_limit_mw = some(700_000).map(|v| v as u32);
        s.temp_gpu_c = some(next() % 100).map(|v| v as u32);
        s.temp_mem_c = some(u64::from(u32::MAX)).map(|v| v as u32);
        s.fan_pct = some(next()).map(pct);
        s.clock_sm_mhz = some(next() % 2_000).map(|v| v as u32);
        s.clock_mem_mhz = some(2_619).map(|v| v as u32);
        s.clock_graphics_mhz = some(next() % 2_000).map(|v| v as u32);
        s.pstate = some(next() % 16).map(|v| v as u32);
        s.pcie_tx_bps = some(next() >> 30);
        s.pcie_rx_bps = some(next());
        s.nvlink_tx_bps = some(next() >> 8);
        s.nvlink_rx_bps = some(0);
        s.ecc_corrected_volatile = some(next() % 5);
        s.ecc_uncorrected_volatile = some(u64::MAX);
        s.throttle_reasons = some(next() & 0x1ff);
        s.enc_util_pct = some(next()).map(pct);
        s.dec_util_pct = some(next()).map(pct);
        s.nvlinks = (0..next() % 4)
            .map(|l| NvLinkSample {
                link: l as u32 * 2,
                tx_bps: some(next() >> 12),
                rx_bps: some(next() >> 40),
            })
            .collect();
    }

    /// What is read of a node's GPU samples, every way they are read: the samples (all,
    /// a middle range, the first few), raw and downsampled series, energy inputs (one
    /// starting inside a minute), the next sample, remote-write reads after positions,
    /// the node's ticks.
    async fn gpu_reads(store: &Arc<dyn Store>, rec: &NodeRecord) -> Vec<String> {
        let mid = TimeRange {
            from_ms: T0 + 70_500,
            to_ms: T0 + 250_000,
        };
        let mut out = Vec::new();
        for g in &rec.gpus {
            let id = g.id;
            let mut line = format!(
                "{:?}\n{:?}\n{:?}\n",
                store.gpu_samples(id, ALL_TIME, 100_000).await.expect("s"),
                store.gpu_samples(id, mid, 77).await.expect("s"),
                store.gpu_samples(id, ALL_TIME, 10).await.expect("s"),
            );
            for metric in [
                GpuMetric::MemUsedBytes,
                GpuMetric::PowerMw,
                GpuMetric::FanPct,
            ] {
                for step in [None, Some(7_000), Some(1)] {
                    let s = store.gpu_series(id, metric, mid, step, 10_000).await;
                    line += &format!("{metric:?} {step:?} {:?}\n", s.expect("series"));
                }
            }
            for (from, to) in [(T0, T0 + 7_200_000), (T0 + 90_500, T0 + 200_000)] {
                let e = store.energy_inputs(id, from, to).await.expect("energy");
                line += &format!("{e:?}\n");
            }
            for at in [T0 - 5, T0 + 61_000, T0 + 119_999, T0 + 300_000] {
                let next = store.next_sample_ms(id, at).await.expect("next");
                line += &format!("{at} {next:?}\n");
            }
            out.push(line);
        }
        let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
        // Both GPUs behind; one behind, one past every packed minute.
        for wanted in [
            [(a, T0 + 100_000), (b, T0 - 1)],
            [(a, T0 + 100_000), (b, T0 + 3_599_999)],
        ] {
            for (per_gpu, total) in [(50, 80), (1_000, 100_000)] {
                let after = store.gpu_samples_after(&wanted, per_gpu, total).await;
                out.push(format!("{:?}", after.expect("after")));
            }
        }
        let ticks = store.node_ticks(rec, ALL_TIME, 1000).await.expect("ticks");
        out.push(format!("{ticks:?}"));
        out
    }

    /// Closed minutes of GPU samples are packed once rolled up, energy-accounted and their
    /// process ticks packed, and every reader answers as from the rows: every field of
    /// random samples (absent stays absent), series, energy inputs, remote-write reads. A
    /// late sample reopens its minute, which waits for its recomputation; recomputed
    /// energy is unchanged and `check-energy` passes; retention keeps exactly the newest
    /// sample before the horizon.
    pub async fn gpu_samples_are_packed_and_every_reader_agrees(store: Arc<dyn Store>) {
        const HOUR: i64 = 3_600_000;
        let rec = register(
            &store,
            "node-g",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let gpus = ["GPU-a", "GPU-b"];
        let mut next = xorshift(0x2545_f491_4f6c_dd1d_u64);
        let mut ticks = batch(1, T0, 300, &gpus).ticks;
        for t in &mut ticks {
            randomize_gpu_sample(&mut t.gpus[0], true, &mut next);
            randomize_gpu_sample(&mut t.gpus[1], false, &mut next);
        }
        ticks.push(common::tick(T0 + HOUR, &gpus, 1));
        write(&store, &rec, 1, ticks).await;
        let now = T0 + 2 * HOUR;
        let energy = EnergyOptions::default();
        let mut acc = Accountant::new(store.clone(), energy.clone(), clock_at(now));
        acc.pass().await.expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");
        let before = gpu_reads(&store, &rec).await;
        assert!(
            before[0].contains("nvlinks: [NvLinkSample"),
            "{}",
            &before[0][..300]
        );
        let totals = accounted(&store, &rec).await;

        let out = r.pack(now).await.expect("pack");
        assert_eq!(
            out.minutes,
            5 + 2 * 5 + 2 * 5,
            "host, process, GPU: {out:?}"
        );
        let after = gpu_reads(&store, &rec).await;
        for (b, a) in before.iter().zip(&after) {
            assert!(
                a == b,
                "read back differs:\n{}\n---\n{}",
                &b[..b.len().min(2000)],
                &a[..a.len().min(2000)]
            );
        }
        let latest = store.latest_gpu_samples().await.expect("latest");
        assert!(
            latest.iter().all(|l| l.time_ms == T0 + HOUR),
            "the newest stays a row"
        );

        // A late sample of GPU-a in minute 1 reopens its minutes (GPU and process; the
        // node's host minute): packed again only once recomputed.
        let late = common::tick(T0 + MIN + 250, &["GPU-a"], 9);
        write(&store, &rec, 2, vec![late.clone()]).await;
        let a = rec.gpus[0].id;
        let s = store.gpu_samples(a, ALL_TIME, 100_000).await.expect("s");
        assert_eq!(s.len(), 302);
        assert!(s.iter().any(|(t, _)| *t == late.time_ms));
        repack_after_late(&rec, a, late.time_ms, (&mut acc, &mut r), now).await;
        assert_eq!(store.gpu_samples(a, ALL_TIME, 100_000).await.expect("s"), s);
        let totals_late = accounted(&store, &rec).await;
        assert_ne!(totals_late, totals);
        energy_recomputes_unchanged(&store, &rec, &energy, &totals_late).await;

        // Retention three minutes past a week: of the packed minutes 0..3 the newest
        // sample before the horizon stays, alone.
        let out = r
            .expire(T0 + 7 * 86_400_000 + 3 * MIN)
            .await
            .expect("expire");
        assert_eq!(out.deleted.get("packed_gpu_minutes"), Some(&4), "{out:?}");
        let horizon = T0 + 3 * MIN;
        for g in &rec.gpus {
            let early = TimeRange {
                from_ms: 0,
                to_ms: horizon - 1,
            };
            let kept = store.gpu_samples(g.id, early, 10).await.expect("s");
            let times: Vec<UnixMs> = kept.iter().map(|(t, _)| *t).collect();
            assert_eq!(times, vec![horizon - 1000]);
            assert_eq!(kept[0].1.gpu_uuid, g.info.uuid);
        }
        assert_eq!(accounted(&store, &rec).await, totals_late, "energy kept");
        let again = r
            .expire(T0 + 7 * 86_400_000 + 3 * MIN)
            .await
            .expect("expire");
        assert_eq!(again.total(), 0, "{again:?}");
    }

    /// Windows across hour ends, for [`closed_hours_are_merged_split_and_read_back`].
    fn hour_windows() -> [TimeRange; 4] {
        const HOUR: i64 = 3_600_000;
        [
            ALL_TIME,
            TimeRange {
                from_ms: T0 + HOUR - 20_500,
                to_ms: T0 + HOUR + 44_999,
            },
            TimeRange {
                from_ms: T0 + 30 * MIN + 1,
                to_ms: T0 + 2 * HOUR + 7 * MIN,
            },
            TimeRange {
                from_ms: T0 + 2 * HOUR + 59 * MIN,
                to_ms: T0 + 5 * HOUR,
            },
        ]
    }

    /// Every raw reader of `rec` over [`hour_windows`]: GPU and process samples (with
    /// limits), series, energy inputs, next samples, remote-write reads and node ticks.
    async fn hour_reads(store: &Arc<dyn Store>, rec: &NodeRecord) -> Vec<String> {
        const HOUR: i64 = 3_600_000;
        let mut out = Vec::new();
        for g in &rec.gpus {
            let id = g.id;
            let mut line = String::new();
            for w in hour_windows() {
                for limit in [100_000, 7, 250] {
                    line += &format!(
                        "{:?}\n{:?}\n",
                        store.gpu_samples(id, w, limit).await.expect("s"),
                        store.process_samples(id, w, limit).await.expect("p"),
                    );
                }
                for step in [None, Some(7_000), Some(600_000)] {
                    let s = store
                        .gpu_series(id, GpuMetric::PowerMw, w, step, 10_000)
                        .await;
                    line += &format!("{step:?} {:?}\n", s.expect("series"));
                }
            }
            for (from, to) in [
                (T0, T0 + 5 * HOUR),
                (T0 + HOUR - 7_500, T0 + HOUR + 61_000),
                (T0 + HOUR + 95_000, T0 + HOUR + 200_000),
                (T0 + 2 * HOUR, T0 + 2 * HOUR + 1),
            ] {
                let e = store.energy_inputs(id, from, to).await.expect("energy");
                line += &format!("{e:?}\n");
            }
            for at in [
                T0 - 5,
                T0 + HOUR - 1,
                T0 + HOUR,
                T0 + HOUR + 1,
                T0 + 3 * HOUR - 14_000,
                T0 + 3 * HOUR,
            ] {
                let next = store.next_sample_ms(id, at).await.expect("next");
                line += &format!("{at} {next:?}\n");
            }
            out.push(line);
        }
        let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
        for wanted in [
            [(a, T0 + HOUR - 1), (b, T0 + 2 * HOUR + 30_000)],
            [(a, T0 + 3 * HOUR), (b, T0 - 1)],
        ] {
            for (per_gpu, total) in [(50, 80), (10_000, 100_000)] {
                let after = store.gpu_samples_after(&wanted, per_gpu, total).await;
                out.push(format!("{:?}", after.expect("after")));
            }
        }
        // Not cut by a limit: on PostgreSQL, with nothing packed, the follower's row-only
        // read answers, which keeps the newest ticks, where the merged read keeps the oldest.
        for w in hour_windows() {
            let ticks = store.node_ticks(rec, w, 100_000).await.expect("ticks");
            out.push(format!("{ticks:?}"));
        }
        out
    }

    /// `rec`'s GPU and process samples and node ticks in `range`, whole.
    async fn raw_reads(store: &Arc<dyn Store>, rec: &NodeRecord, range: TimeRange) -> Vec<String> {
        let mut out = Vec::new();
        for g in &rec.gpus {
            let s = store.gpu_samples(g.id, range, 100_000).await.expect("s");
            let p = store.process_samples(g.id, range, 100_000).await;
            out.push(format!("{s:?}\n{:?}", p.expect("p")));
        }
        let ticks = store.node_ticks(rec, range, 100_000).await.expect("ticks");
        out.push(format!("{ticks:?}"));
        out
    }

    fn assert_reads_equal(before: &[String], after: &[String], what: &str) {
        assert_eq!(before.len(), after.len());
        for (b, a) in before.iter().zip(after) {
            assert!(
                a == b,
                "{what}: read back differs:\n{}\n---\n{}",
                &b[..b.len().min(2000)],
                &a[..a.len().min(2000)]
            );
        }
    }

    /// Registers `node` with GPU-a (every field) and GPU-b (sparse) and writes three hours
    /// at 15 s of random samples, processes (none at some ticks) and host rows, none for
    /// the first 90 s of hour 1; the newest tick an hour later.
    pub async fn three_hours(store: &Arc<dyn Store>, node: &str) -> NodeRecord {
        const HOUR: i64 = 3_600_000;
        let rec = register(
            store,
            node,
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let gpus = ["GPU-a", "GPU-b"];
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15_u64);
        let mut ticks: Vec<Tick> = (0..720u32)
            .filter(|k| !(240..=246).contains(k))
            .map(|k| {
                let mut t = common::tick(T0 + i64::from(k) * 15_000, &gpus, k);
                randomize_gpu_sample(&mut t.gpus[0], true, &mut next);
                randomize_gpu_sample(&mut t.gpus[1], false, &mut next);
                if k % 13 == 5 {
                    t.processes.clear();
                }
                t
            })
            .collect();
        ticks.push(common::tick(T0 + 4 * HOUR, &gpus, 1));
        write(store, &rec, 1, ticks).await;
        rec
    }

    /// Closed hours of packed minutes are merged into one value an hour long, and every
    /// reader answers as from the minutes, across hour ends. A late sample splits its
    /// hours back into minutes and reopens only its own minute; the hours are merged
    /// again once the minute is packed. Retention splits the hour holding the horizon and
    /// keeps every sample after it (and each GPU's newest before it); energy stays exact.
    pub async fn closed_hours_are_merged_split_and_read_back(store: Arc<dyn Store>) {
        const HOUR: i64 = 3_600_000;
        let rec = three_hours(&store, "node-h").await;
        let now = T0 + 5 * HOUR;
        let energy = EnergyOptions::default();
        let mut acc = Accountant::new(store.clone(), energy.clone(), clock_at(now));
        acc.pass().await.expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");
        let before = hour_reads(&store, &rec).await;
        let totals = accounted(&store, &rec).await;

        // 180 minutes of the node's host rows and of each GPU's process ticks and samples.
        let out = r.pack(now).await.expect("pack");
        assert_eq!((out.minutes, out.hours), (5 * 180 - 5, 5 * 3), "{out:?}");
        assert_reads_equal(&before, &hour_reads(&store, &rec).await, "merged");
        assert_eq!(accounted(&store, &rec).await, totals);
        energy_recomputes_unchanged(&store, &rec, &energy, &totals).await;
        let again = r.pack(now).await.expect("pack");
        assert_eq!((again.minutes, again.hours), (0, 0), "{again:?}");

        // A late sample of GPU-a in hour 1 splits its hours (the GPU's samples and process
        // ticks, the node's host rows) and reopens minute 70 only.
        let late_ms = T0 + HOUR + 10 * MIN + 7_500;
        let late = common::tick(late_ms, &["GPU-a"], 9);
        write(&store, &rec, 2, vec![late.clone()]).await;
        let a = rec.gpus[0].id;
        let s = store.gpu_samples(a, ALL_TIME, 100_000).await.expect("s");
        assert_eq!(s.len(), 722 - 7);
        assert!(s.iter().any(|(t, _)| *t == late_ms));
        let late_reads = hour_reads(&store, &rec).await;
        let p = r.pack(now).await.expect("pack");
        assert_eq!(
            (p.minutes, p.hours),
            (0, 0),
            "waits for recomputation: {p:?}"
        );
        acc.mark(a, late_ms);
        acc.pass().await.expect("account");
        let p = r.pack(now).await.expect("pack");
        assert_eq!(
            (p.minutes, p.hours),
            (1, 1),
            "the process minute and its hour: {p:?}"
        );
        r.mark(RollupKey::gpu(a), late_ms);
        r.mark(RollupKey::host(rec.id), late_ms);
        r.pass().await.expect("roll up");
        let p = r.pack(now).await.expect("pack");
        assert_eq!(
            (p.minutes, p.hours),
            (2, 2),
            "host and GPU minutes and hours: {p:?}"
        );
        assert_reads_equal(&late_reads, &hour_reads(&store, &rec).await, "merged again");
        let totals_late = accounted(&store, &rec).await;
        assert_ne!(totals_late, totals);
        energy_recomputes_unchanged(&store, &rec, &energy, &totals_late).await;

        // Retention 90 minutes past a week: the horizon is in hour 1.
        let horizon = T0 + HOUR + 30 * MIN;
        let behind = TimeRange {
            from_ms: 0,
            to_ms: horizon - 1,
        };
        let ahead = TimeRange {
            from_ms: horizon,
            to_ms: UnixMs::MAX,
        };
        let kept = raw_reads(&store, &rec, ahead).await;
        let out = r
            .expire(T0 + 7 * 86_400_000 + HOUR + 30 * MIN)
            .await
            .expect("expire");
        // Per GPU hour 0, and of hour 1 (split) minutes 61 to 88; minute 89 holds the newest
        // sample before the horizon, alone.
        assert_eq!(out.deleted.get("packed_gpu_minutes"), Some(&58), "{out:?}");
        for g in &rec.gpus {
            let early = store.gpu_samples(g.id, behind, 10).await.expect("s");
            let times: Vec<UnixMs> = early.iter().map(|(t, _)| *t).collect();
            assert_eq!(
                times,
                vec![horizon - 15_000],
                "the newest before the horizon"
            );
            let p = store.process_samples(g.id, behind, 10).await.expect("p");
            assert_eq!(p, vec![]);
        }
        let kept_now = raw_reads(&store, &rec, ahead).await;
        assert_reads_equal(&kept, &kept_now, "after the horizon");
        let early = store.node_ticks(&rec, behind, 100).await.expect("ticks");
        assert!(
            early
                .iter()
                .all(|t| t.host.is_none() && t.processes.is_empty()),
            "{early:?}"
        );
        assert_eq!(accounted(&store, &rec).await, totals_late, "energy kept");
        // What is left of the horizon's hour stays minutes; nothing more to expire.
        let p = r.pack(now).await.expect("pack");
        assert_eq!((p.minutes, p.hours), (0, 0), "{p:?}");
        let again = r
            .expire(T0 + 7 * 86_400_000 + HOUR + 30 * MIN)
            .await
            .expect("expire");
        assert_eq!(again.total(), 0, "{again:?}");
    }

    /// Health every 30 s for 2.5 hours: GPU-a with every field (changing every 10th
    /// reading), GPU-b with none, on every other reading.
    fn health_ticks() -> Vec<Tick> {
        (0..300u32)
            .map(|k| {
                let mut t = common::tick(T0 + i64::from(k) * 30_000, &["GPU-a", "GPU-b"], k);
                t.health = vec![health_full("GPU-a", k / 10)];
                if k % 2 == 0 {
                    t.health.push(health_sparse("GPU-b"));
                }
                t
            })
            .collect()
    }

    /// Every health reading of `rec`'s GPUs: whole, and in windows across hour ends.
    async fn health_reads(store: &Arc<dyn Store>, rec: &NodeRecord) -> Vec<String> {
        const HOUR: i64 = 3_600_000;
        let mut out = Vec::new();
        for g in &rec.gpus {
            let all = store
                .gpu_health(g.id, ALL_TIME, 100_000)
                .await
                .expect("all");
            out.push(format!("{all:?}"));
            for (from, to, limit) in [
                (T0 + 50 * MIN, T0 + 70 * MIN, 1000),
                (T0 + HOUR - 15_000, T0 + 2 * HOUR, 3),
                (T0 + HOUR, T0 + HOUR, 10),
                (0, T0 + 3 * HOUR, 150),
            ] {
                let range = TimeRange {
                    from_ms: from,
                    to_ms: to,
                };
                let read = store.gpu_health(g.id, range, limit).await.expect("range");
                out.push(format!("{read:?}"));
            }
        }
        out
    }

    /// Closed hours of health readings are packed once the GPU has a newer reading, and
    /// every read (whole, windows across hour ends, limits, a node's ticks) answers as
    /// from the rows; a late reading is read at once and packed in later, a replayed time
    /// keeps the first reading; retention keeps exactly the newest reading before the
    /// horizon and trims the hour holding it.
    pub async fn health_hours_are_packed_read_back_and_expired(store: Arc<dyn Store>) {
        const HOUR: i64 = 3_600_000;
        let rec = register(
            &store,
            "node-h",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
        let ticks = health_ticks();
        write(&store, &rec, 1, ticks.clone()).await;
        let before = health_reads(&store, &rec).await;
        assert!(before[0].contains("Some(true)") && before[5].contains("None"));
        let latest_health = || async {
            let mut latest = store.latest_gpu_health().await.expect("latest");
            latest.sort_by_key(|l| l.gpu);
            latest
        };
        let latest = latest_health().await;

        // Ten minutes into hour 1, only hour 0 is closed behind the horizon.
        let out = store
            .pack_closed_minutes(T0 + HOUR + 10 * MIN, 100)
            .await
            .expect("pack");
        assert_eq!(
            out.health_readings,
            120 + 60,
            "hour 0 of GPU-a and GPU-b: {out:?}"
        );
        assert_eq!(health_reads(&store, &rec).await, before);
        let hour0 = TimeRange {
            from_ms: T0,
            to_ms: T0 + HOUR - 1,
        };
        let node_ticks = store.node_ticks(&rec, hour0, 1000).await.expect("ticks");
        assert_eq!(
            node_ticks.iter().map(|t| t.health.len()).sum::<usize>(),
            180,
            "a node's ticks carry the packed readings"
        );
        // Hour 1 next; hour 2 holds each GPU's newest reading and stays rows.
        let out = store
            .pack_closed_minutes(T0 + 3 * HOUR, 100)
            .await
            .expect("pack");
        assert_eq!(out.health_readings, 120 + 60, "hour 1: {out:?}");
        let again = store
            .pack_closed_minutes(T0 + 3 * HOUR, 100)
            .await
            .expect("pack");
        assert_eq!(again.health_readings, 0, "{again:?}");
        assert_eq!(health_reads(&store, &rec).await, before);
        assert_eq!(
            latest_health().await,
            latest,
            "the newest readings stay rows"
        );

        // A late reading into packed hour 0 is read at once, and packed in by the next
        // pass; a replayed tick whose health differs changes nothing, packed or not.
        let mut late = common::tick(T0 + 15_000, &["GPU-a"], 7);
        late.health = vec![health_full("GPU-a", 99)];
        let mut replay = ticks[1].clone();
        replay.health = vec![health_full("GPU-a", 98)];
        write(&store, &rec, 2, vec![late.clone(), replay]).await;
        let read = store.gpu_health(a, ALL_TIME, 100_000).await.expect("read");
        assert_eq!(read.len(), 301);
        assert_eq!(read[1], (T0 + 15_000, late.health[0].clone()));
        assert_eq!(read[2], (T0 + 30_000, health_full("GPU-a", 0)));
        let out = store
            .pack_closed_minutes(T0 + 3 * HOUR, 100)
            .await
            .expect("pack");
        assert_eq!(out.health_readings, 2, "{out:?}");
        assert_eq!(
            store.gpu_health(a, ALL_TIME, 100_000).await.expect("read"),
            read
        );

        // Retention 70 minutes past a week, once energy and rollups are past it: GPU-a
        // keeps its newest reading before the horizon (packed in hour 1), GPU-b its
        // reading at minute 69; hour 0 goes and hour 1 keeps the rest.
        let now = T0 + 3 * HOUR;
        Accountant::new(store.clone(), EnergyOptions::default(), clock_at(now))
            .pass()
            .await
            .expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");
        let out = r
            .expire(T0 + 7 * 86_400_000 + 70 * MIN)
            .await
            .expect("expire");
        let horizon = T0 + 70 * MIN;
        assert_eq!(
            out.deleted.get("packed_gpu_health_hours"),
            Some(&4),
            "hour 0 deleted and hour 1 trimmed, of each GPU: {out:?}"
        );
        for (gpu, kept) in [(a, T0 + 70 * MIN - 30_000), (b, T0 + 69 * MIN)] {
            let early = TimeRange {
                from_ms: 0,
                to_ms: horizon - 1,
            };
            let health = store.gpu_health(gpu, early, 10).await.expect("health");
            let times: Vec<UnixMs> = health.iter().map(|h| h.0).collect();
            assert_eq!(
                times,
                vec![kept],
                "the newest health before the horizon stays"
            );
            let rest = TimeRange {
                from_ms: horizon,
                to_ms: i64::MAX,
            };
            let full = store.gpu_health(gpu, ALL_TIME, 100_000).await.expect("all");
            let from_horizon = store.gpu_health(gpu, rest, 100_000).await.expect("rest");
            assert_eq!(full.len(), from_horizon.len() + 1);
        }
        let again = r
            .expire(T0 + 7 * 86_400_000 + 70 * MIN)
            .await
            .expect("expire");
        assert_eq!(again.total(), 0, "{again:?}");
    }

    pub async fn health_retention_finds_the_newest_reading_across_a_gap(store: Arc<dyn Store>) {
        const HOUR: i64 = 3_600_000;
        let rec = register(&store, "node-h", vec![gpu_info_full("GPU-a", 0)]).await;
        let a = rec.gpus[0].id;
        // Health every 30 s in hour 0 and from 1:40 to 2:10; the GPU is away in between.
        let times = (0..120).chain(200..=260).map(|k| T0 + k * 30_000);
        let ticks: Vec<Tick> = times
            .enumerate()
            .map(|(k, t)| {
                let mut tick = common::tick(t, &["GPU-a"], k as u32);
                tick.health = vec![health_full("GPU-a", k as u32)];
                tick
            })
            .collect();
        write(&store, &rec, 1, ticks).await;
        let now = T0 + 3 * HOUR;
        let out = store.pack_closed_minutes(now, 100).await.expect("pack");
        assert_eq!(out.health_readings, 120 + 40, "hours 0 and 1: {out:?}");
        Accountant::new(store.clone(), EnergyOptions::default(), clock_at(now))
            .pass()
            .await
            .expect("account");
        let mut r = rollups(&store, now);
        r.pass().await.expect("roll up");

        // The horizon at 1:30: hour 1 holds no reading before it, hour 0's last one is
        // the newest before it.
        let out = r
            .expire(T0 + 7 * 86_400_000 + 90 * MIN)
            .await
            .expect("expire");
        assert_eq!(
            out.deleted.get("packed_gpu_health_hours"),
            Some(&1),
            "{out:?}"
        );
        let early = TimeRange {
            from_ms: 0,
            to_ms: T0 + 90 * MIN - 1,
        };
        let kept = store.gpu_health(a, early, 1000).await.expect("health");
        assert_eq!(
            kept.iter().map(|h| h.0).collect::<Vec<_>>(),
            vec![T0 + HOUR - 30_000],
            "the newest health before the horizon stays, alone"
        );
        let all = store.gpu_health(a, ALL_TIME, 1000).await.expect("health");
        assert_eq!(all.len(), 1 + 61);
    }

    pub async fn retention_expires_raw_behind_the_watermarks_and_keeps_totals(
        store: Arc<dyn Store>,
    ) {
        let rec = register(
            &store,
            "node-x",
            vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)],
        )
        .await;
        let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
        // 5.5 minutes at 1 Hz: GPU-a by energy counter, GPU-b by trapezoid; processes and
        // host rows on every tick.
        // Health every 30 s on GPU-a.
        let mut ticks = batch(1, T0, 330, &["GPU-a", "GPU-b"]).ticks;
        for (k, t) in ticks.iter_mut().enumerate().step_by(30) {
            t.health = vec![health_full("GPU-a", k as u32)];
        }
        write(&store, &rec, 1, ticks).await;
        let energy = EnergyOptions::default();
        Accountant::new(store.clone(), energy.clone(), clock_at(T0))
            .pass()
            .await
            .expect("account");
        let mut r = rollups(&store, T0);
        r.pass().await.expect("roll up");
        let before = accounted(&store, &rec).await;
        assert!(before.contains("Container"), "workloads were accounted");

        // A week and 3 minutes later: raw before minute 3 expires.
        let week = 7 * 86_400_000;
        let out = r.expire(T0 + week + 3 * MIN).await.expect("expire");
        let horizon = T0 + 3 * MIN;
        let horizons = store.raw_horizons().await.expect("horizons");
        assert_eq!(horizons.get(&RollupKey::gpu(a)), Some(&horizon));
        assert_eq!(horizons.get(&RollupKey::gpu(b)), Some(&horizon));
        assert_eq!(horizons.get(&RollupKey::host(rec.id)), Some(&horizon));
        assert_eq!(out.deleted.get("gpu_samples"), Some(&(2 * 179)), "{out:?}");
        assert_eq!(out.deleted.get("process_samples"), Some(&(2 * 180)));
        assert_eq!(out.deleted.get("host_samples"), Some(&180));
        // Health at 0, 30 .. 150 s is before the horizon: the newest of those stays.
        assert_eq!(out.deleted.get("gpu_health"), Some(&5), "{out:?}");
        assert!(out.transactions > 15, "batches of ~50 rows: {out:?}");
        let early = TimeRange {
            from_ms: 0,
            to_ms: horizon - 1,
        };
        let kept = store.gpu_samples(a, early, 10).await.expect("samples");
        assert_eq!(
            kept.iter().map(|s| s.0).collect::<Vec<_>>(),
            vec![horizon - 1000],
            "only the start of the horizon minute's first interval stays"
        );
        let health = store.gpu_health(a, early, 10).await.expect("health");
        assert_eq!(
            health.iter().map(|h| h.0).collect::<Vec<_>>(),
            vec![T0 + 150_000],
            "the newest health before the horizon stays"
        );
        assert!(
            store
                .process_samples(a, early, 10)
                .await
                .expect("p")
                .is_empty()
        );
        assert!(
            store
                .host_samples(rec.id, early, 10)
                .await
                .expect("h")
                .is_empty()
        );
        let late = TimeRange {
            from_ms: horizon,
            to_ms: i64::MAX,
        };
        assert_eq!(
            store.gpu_samples(b, late, 1000).await.expect("s").len(),
            150
        );
        assert_eq!(
            accounted(&store, &rec).await,
            before,
            "rollups and energy unchanged"
        );

        // Nothing before the horizon looks stale, nothing is recomputed to zero: not by a
        // restarted accountant or rollup task, nor by recompute-energy or late data.
        assert_eq!(store.stale_energy_minutes(0).await.expect("stale"), vec![]);
        assert_eq!(store.stale_rollup_minutes(0).await.expect("stale"), vec![]);
        let mut acc = Accountant::new(store.clone(), energy.clone(), clock_at(T0));
        acc.mark(a, T0 + 30_000);
        acc.mark(b, T0 + 2 * MIN);
        acc.pass().await.expect("account");
        let mut r2 = rollups(&store, T0);
        r2.mark(RollupKey::gpu(a), T0);
        r2.pass().await.expect("roll up");
        accountant::recompute(store.as_ref(), ALL_TIME, &energy)
            .await
            .expect("recompute");
        write(
            &store,
            &rec,
            2,
            vec![common::tick(T0 + 30_500, &["GPU-a"], 7)],
        )
        .await;
        acc.mark(a, T0 + 30_500);
        acc.pass().await.expect("account");
        r2.mark(RollupKey::gpu(a), T0 + 30_500);
        r2.pass().await.expect("roll up");
        assert_eq!(accounted(&store, &rec).await, before, "still unchanged");
        let report = energy_check::check(store.as_ref(), ALL_TIME)
            .await
            .expect("check");
        assert_eq!(
            report.violations,
            vec![],
            "check-energy passes after expiry"
        );
        assert_eq!(
            report.minutes,
            2 * 6,
            "5 closed minutes and the open one per GPU"
        );
        assert_eq!(
            report.compared_with_raw,
            2 * 2,
            "minutes 3 and 4 against raw"
        );
        // The late sample behind the horizon goes with the next retention run.
        let again = r.expire(T0 + week + 3 * MIN).await.expect("expire");
        let one = |t: &str| again.deleted.get(t).copied();
        assert_eq!(
            (
                one("gpu_samples"),
                one("process_samples"),
                one("host_samples")
            ),
            (Some(1), Some(1), Some(1)),
            "{again:?}"
        );

        // 400 days later: rollups, energy minutes and events before minute 2 go too.
        r.expire(T0 + 400 * 86_400_000 + 2 * MIN)
            .await
            .expect("expire");
        let left = store
            .rollup_minutes(RollupKey::gpu(a), ALL_TIME)
            .await
            .expect("m");
        assert_eq!(left.first().map(|m| m.minute_ms), Some(T0 + 2 * MIN));
        let energy_left = store.energy_minutes(Some(a), ALL_TIME).await.expect("e");
        assert_eq!(
            energy_left.first().map(|m| m.1.minute_ms),
            Some(T0 + 2 * MIN)
        );
        assert_eq!(
            store
                .raw_horizons()
                .await
                .expect("h")
                .get(&RollupKey::gpu(a)),
            Some(&(T0 + 5 * MIN)),
            "raw is expired up to the watermarks"
        );

        // Raw goes only behind both watermarks: each task in turn holds it back.
        let far = T0 + 800 * 86_400_000;
        let horizon_a = || async {
            let h = store.raw_horizons().await.expect("horizons");
            h.get(&RollupKey::gpu(a)).copied()
        };
        write(
            &store,
            &rec,
            3,
            batch(3, T0 + 330_000, 170, &["GPU-a"]).ticks,
        )
        .await;
        let mut acc = Accountant::new(store.clone(), energy.clone(), clock_at(far));
        acc.pass().await.expect("account");
        r.expire(far).await.expect("expire");
        assert_eq!(horizon_a().await, Some(T0 + 5 * MIN), "held by the rollups");
        r.pass().await.expect("roll up");
        r.expire(far).await.expect("expire");
        assert_eq!(horizon_a().await, Some(T0 + 8 * MIN));
        write(
            &store,
            &rec,
            4,
            batch(4, T0 + 500_000, 200, &["GPU-a"]).ticks,
        )
        .await;
        r.pass().await.expect("roll up");
        r.expire(far).await.expect("expire");
        // The energy watermark: batch 3's last minute (8) closed by the clock, long past;
        // batch 4 not yet accounted.
        assert_eq!(horizon_a().await, Some(T0 + 9 * MIN), "held by energy");
        acc.pass().await.expect("account");
        r.expire(far).await.expect("expire");
        assert_eq!(horizon_a().await, Some(T0 + 11 * MIN));
    }

    // ---- carbon

    fn slot(region: &str, from_ms: i64, g: f64, kind: IntensityKind) -> IntensitySlot {
        IntensitySlot {
            from_ms,
            to_ms: from_ms + 30 * 60_000,
            g_per_kwh: g,
            kind,
            factor_type: FactorType::Direct,
            provider: ProviderKind::Uk,
            region: region.into(),
            fetched_at_ms: T0,
            estimated: false,
        }
    }

    fn price(
        gpu: GpuId,
        minute_ms: i64,
        energy_mj: u64,
        g: f64,
        kind: IntensityKind,
        basis: PriceBasis,
    ) -> CarbonMinute {
        CarbonMinute {
            gpu,
            minute_ms,
            energy_mj,
            g_per_kwh: g,
            pue: 1.5,
            carbon_g: energy_mj as f64 / 3.6e9 * g * 1.5,
            provider: ProviderKind::Uk,
            region: "13".into(),
            kind,
            factor_type: FactorType::Direct,
            estimated: basis != PriceBasis::Slot,
            basis,
            priced_at_ms: T0 + 1,
        }
    }

    /// `waste_minutes`: the idle-allocated minutes of waste detection, every field read
    /// back, the threshold inclusive, unknown utilization never idle, a minute with a gap,
    /// held part of the time, at 0 bytes or unmeasured left out (in SQL), the price
    /// joined, the node and series scopes; `waste_run_start` finds a run's first minute.
    pub async fn waste_minutes_read_idle_candidates_with_their_price(store: Arc<dyn Store>) {
        use gpufleet_collector::accounting::energy::WorkloadMinute;
        let a = register(&store, "node-a", vec![gpu_info_sparse("GPU-a", 0)]).await;
        let b = register(&store, "node-b", vec![gpu_info_sparse("GPU-b", 0)]).await;
        let w = container_workload(&"c".repeat(64), Some("nb"));
        for (rec, uuid) in [(&a, "GPU-a"), (&b, "GPU-b")] {
            let tick = Tick {
                time_ms: T0,
                gpus: vec![gpu_sample_sparse(uuid, 0)],
                processes: vec![ProcessSample {
                    gpu_uuid: uuid.into(),
                    pid: 7,
                    process_type: ProcessType::Compute,
                    user: None,
                    command: None,
                    gpu_mem_bytes: Some(1),
                    sm_util_pct: None,
                    mem_util_pct: None,
                    enc_util_pct: None,
                    dec_util_pct: None,
                    workload: w.clone(),
                    mig_uuid: None,
                }],
                ..Default::default()
            };
            write_ticks(&store, rec, 1, vec![tick]).await;
        }
        let (ga, gb) = (a.gpus[0].id, b.gpus[0].id);
        let inputs = store.energy_inputs(ga, T0, T0 + 1).await.expect("inputs");
        let wid = inputs.samples[0].processes[0].workload;
        let minute = |k: i64, util: Option<u32>, mem: Option<u64>| GpuMinute {
            minute_ms: T0 + k * 60_000,
            energy_mj: 6_000,
            counter_mj: 6_000,
            attributed_mj: 6_000,
            active_mj: 1_000,
            covered_ms: 60_000,
            missing_ms: 0,
            samples: 60,
            util_max_pct: util,
            provisional: k == 3,
            workloads: vec![WorkloadMinute {
                workload: wid,
                energy_mj: 6_000,
                active_mj: 1_000,
                idle_mj: 5_000,
                counter_mj: 6_000,
                gpu_ms: 60_000,
                mem_max_bytes: mem,
                ..Default::default()
            }],
            ..Default::default()
        };
        let minutes = [
            minute(0, Some(0), Some(5 << 30)),
            minute(1, Some(1), None),
            minute(2, Some(2), Some(1)),
            minute(3, None, Some(1)),
            // Idle, but a gap / held part of the time / at 0 bytes / nothing measured.
            GpuMinute {
                missing_ms: 5_000,
                ..minute(4, Some(0), Some(1))
            },
            {
                let mut m = minute(5, Some(0), Some(1));
                m.workloads[0].gpu_ms = 59_000;
                m
            },
            minute(6, Some(0), Some(0)),
            {
                let mut m = minute(7, Some(0), Some(1));
                m.covered_ms = 0;
                m.workloads[0].gpu_ms = 0;
                m
            },
        ];
        store
            .replace_energy_minutes(ga, T0, T0 + 8 * 60_000, &minutes, None)
            .await
            .expect("minutes");
        store
            .replace_energy_minutes(gb, T0, T0 + 60_000, &minutes[..1], None)
            .await
            .expect("minutes");
        // The accountant's fields read back as written.
        let back = store
            .energy_minutes(Some(ga), ALL_TIME)
            .await
            .expect("read");
        assert_eq!(
            back.iter().map(|(_, m)| m.clone()).collect::<Vec<_>>(),
            minutes
        );
        store
            .replace_carbon_minutes(&[price(
                ga,
                T0,
                6_000,
                90.0,
                IntensityKind::Actual,
                PriceBasis::Slot,
            )])
            .await
            .expect("price");

        let read = |threshold: u32, node: Option<&'static str>| {
            let store = Arc::clone(&store);
            async move {
                store
                    .waste_minutes(
                        ALL_TIME,
                        node.map_or(WasteScope::Fleet, WasteScope::Node),
                        threshold,
                    )
                    .await
                    .expect("waste minutes")
            }
        };
        let got = read(1, Some("node-a")).await;
        assert_eq!(got.len(), 2, "minute 2 above, minute 3 unknown: {got:?}");
        let m = &got[0];
        assert_eq!((m.gpu, m.gpu_uuid.as_str(), m.gpu_index), (ga, "GPU-a", 0));
        assert_eq!((m.node_name.as_str(), m.minute_ms), ("node-a", T0));
        assert_eq!(m.workload, w);
        assert_eq!(
            (m.util_max_pct, m.covered_ms, m.missing_ms, m.gpu_ms),
            (Some(0), 60_000, 0, 60_000)
        );
        assert_eq!(
            (m.mem_max_bytes, m.energy_mj, m.active_mj, m.idle_mj),
            (Some(5 << 30), 6_000, 1_000, 5_000)
        );
        assert!(!m.provisional);
        assert_eq!(m.price, Some((90.0, 1.5)));
        assert_eq!(m.gpu_last_minute_ms, T0 + 7 * 60_000);
        assert_eq!(m.max_gap_ms, minutes[0].max_gap_ms);
        let m = &got[1];
        assert_eq!(
            (m.minute_ms, m.util_max_pct, m.mem_max_bytes, m.price),
            (T0 + 60_000, Some(1), None, None)
        );
        // The series scope; the start of the run ending at minute 1.
        let key = w.key();
        let series = store
            .waste_minutes(ALL_TIME, WasteScope::Series(ga, &key), 1)
            .await
            .expect("series");
        assert_eq!(series.len(), 2);
        let start = |last: i64| {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move {
                store
                    .waste_run_start(ga, &key, last, T0 - 60_000, 1)
                    .await
                    .expect("run start")
            }
        };
        assert_eq!(start(T0 + 60_000).await, Some(T0));
        assert_eq!(start(T0).await, Some(T0));
        assert_eq!(start(T0 + 2 * 60_000).await, None, "minute 2 is busy");
        assert_eq!(start(T0 + 4 * 60_000).await, None, "minute 4 has a gap");
        // Inclusive thresholds; absent utilization never passes; the range bounds.
        assert_eq!(read(0, Some("node-a")).await.len(), 1);
        assert_eq!(read(100, Some("node-a")).await.len(), 3);
        let one = store
            .waste_minutes(
                TimeRange {
                    from_ms: T0 + 60_000,
                    to_ms: T0 + 60_000,
                },
                WasteScope::Fleet,
                100,
            )
            .await
            .expect("one minute");
        assert_eq!(
            one.iter().map(|m| m.minute_ms).collect::<Vec<_>>(),
            [T0 + 60_000]
        );
        // Node filter; all nodes ordered by GPU.
        let nb = read(1, Some("node-b")).await;
        assert_eq!(
            nb.iter()
                .map(|m| (m.gpu, m.gpu_last_minute_ms))
                .collect::<Vec<_>>(),
            [(gb, T0)]
        );
        let all = read(1, None).await;
        assert_eq!(all.iter().map(|m| m.gpu).collect::<Vec<_>>(), [ga, ga, gb]);
        assert!(read(1, Some("node-c")).await.is_empty());
    }

    pub async fn carbon_cache_and_minute_prices(store: Arc<dyn Store>) {
        use IntensityKind::{Actual, Forecast};
        // The cache: an actual replaces a forecast, never the reverse; regions apart.
        store
            .upsert_intensity(&[slot("13", T0, 100.0, Forecast)])
            .await
            .expect("upsert");
        store
            .upsert_intensity(&[slot("13", T0, 90.0, Actual)])
            .await
            .expect("upsert");
        store
            .upsert_intensity(&[
                slot("13", T0, 120.0, Forecast),
                slot("7", T0, 55.0, Forecast),
            ])
            .await
            .expect("upsert");
        let half = 30 * 60_000;
        store
            .upsert_intensity(&[slot("13", T0 + half, 80.0, Forecast)])
            .await
            .expect("upsert");
        let got = store
            .intensity_slots(
                ProviderKind::Uk,
                "13",
                TimeRange {
                    from_ms: T0 + 1,
                    to_ms: T0 + half + 1,
                },
            )
            .await
            .expect("slots");
        assert_eq!(
            got,
            vec![
                slot("13", T0, 90.0, Actual),
                slot("13", T0 + half, 80.0, Forecast)
            ]
        );
        let none = store
            .intensity_slots(ProviderKind::Electricitymaps, "13", ALL_TIME)
            .await
            .expect("slots");
        assert!(none.is_empty(), "providers apart");
        let last = store
            .last_intensity_before(ProviderKind::Uk, "7", T0 + 10 * half)
            .await
            .expect("last");
        assert_eq!(last, Some(slot("7", T0, 55.0, Forecast)));
        assert_eq!(
            store
                .last_intensity_before(ProviderKind::Uk, "13", T0 - 1)
                .await
                .expect("last"),
            None
        );
        // One call holding the same slot several times acts as those writes in order.
        store
            .upsert_intensity(&[
                slot("9", T0, 70.0, Forecast),
                slot("9", T0, 60.0, Actual),
                slot("9", T0, 65.0, Forecast),
                slot("9", T0 + half, 50.0, Forecast),
                slot("9", T0 + half, 45.0, Forecast),
            ])
            .await
            .expect("upsert with repeats");
        assert_eq!(
            store
                .intensity_slots(ProviderKind::Uk, "9", ALL_TIME)
                .await
                .expect("slots"),
            vec![
                slot("9", T0, 60.0, Actual),
                slot("9", T0 + half, 45.0, Forecast)
            ]
        );

        // Energy minutes to price, and what stays pending once priced.
        let rec = register(&store, "node-a", vec![gpu_info_sparse("GPU-a", 0)]).await;
        let gpu = rec.gpus[0].id;
        let minute = |k: i64, e: u64| GpuMinute {
            minute_ms: T0 + k * 60_000,
            energy_mj: e,
            counter_mj: e,
            attributed_mj: 0,
            idle_mj: e,
            covered_ms: 60_000,
            samples: 60,
            ..Default::default()
        };
        let e = 36_000_000; // 0.01 kWh
        store
            .replace_energy_minutes(
                gpu,
                T0,
                T0 + 3 * 60_000,
                &[minute(0, e), minute(1, e), minute(2, e)],
                None,
            )
            .await
            .expect("energy");
        let pending = store.pending_carbon_minutes(0, 100).await.expect("pending");
        assert_eq!(pending.len(), 3);
        assert!(
            pending
                .iter()
                .all(|p| p.priced.is_none() && p.energy_mj == e && p.node_name == "node-a")
        );
        let prices = vec![
            price(gpu, T0, e, 90.0, Actual, PriceBasis::Slot),
            price(gpu, T0 + 60_000, e, 80.0, Forecast, PriceBasis::Slot),
            price(gpu, T0 + 120_000, e, 200.0, Actual, PriceBasis::Default),
        ];
        // A GPU-minute priced twice in one call keeps the later price.
        let mut twice = vec![price(gpu, T0, e, 999.0, Forecast, PriceBasis::Slot)];
        twice.extend(prices.iter().cloned());
        store.replace_carbon_minutes(&twice).await.expect("prices");
        assert_eq!(
            store
                .carbon_minutes(Some(gpu), ALL_TIME)
                .await
                .expect("read"),
            prices,
            "field for field"
        );
        let pending = store.pending_carbon_minutes(0, 100).await.expect("pending");
        let minutes: Vec<i64> = pending.iter().map(|p| p.minute_ms - T0).collect();
        assert_eq!(
            minutes,
            vec![60_000, 120_000],
            "forecast and estimated prices stay pending"
        );
        assert_eq!(pending[0].priced.as_ref(), Some(&prices[1]));
        // Recomputed energy makes a priced minute pending again.
        store
            .replace_energy_minutes(gpu, T0, T0 + 60_000, &[minute(0, e + 1)], None)
            .await
            .expect("energy");
        let pending = store.pending_carbon_minutes(0, 100).await.expect("pending");
        assert_eq!(pending.len(), 3);
        assert!(
            store
                .pending_carbon_minutes(T0 + 60_000, 100)
                .await
                .expect("since")
                .len()
                == 2
        );

        // Totals per GPU: Σ energy × g × PUE, with the forecast and estimated energy.
        let totals = &store.gpu_carbon(ALL_TIME).await.expect("gpu carbon")[0].totals;
        let want = 0.01 * (90.0 + 80.0 + 200.0) * 1.5;
        assert!(
            (totals.carbon_g - want).abs() < 1e-9,
            "{} vs {want}",
            totals.carbon_g
        );
        assert_eq!(
            (totals.priced_mj, totals.forecast_mj, totals.estimated_mj),
            (3 * e, e, e)
        );
        assert_eq!(totals.sources, vec!["uk:13:direct".to_owned()]);
        assert_eq!(totals.avg_g_per_kwh(), Some((90.0 + 80.0 + 200.0) / 3.0));

        // Retention of rollups takes prices and cached slots older than the cutoff.
        store
            .expire_rollups_before(T0 + 60_000, 10)
            .await
            .expect("expire");
        let kept = store.carbon_minutes(None, ALL_TIME).await.expect("read");
        assert_eq!(kept, prices[1..].to_vec(), "minute 0's price is gone");
        store
            .expire_rollups_before(T0 + half + 60_000, 10)
            .await
            .expect("expire");
        let slots = store
            .intensity_slots(ProviderKind::Uk, "13", ALL_TIME)
            .await
            .expect("slots");
        assert_eq!(
            slots,
            vec![slot("13", T0 + half, 80.0, Forecast)],
            "a slot that ended before the cutoff is gone"
        );
    }

    /// The accountant's batched reads answer what one GPU at a time answers, range for
    /// range (a GPU twice, a GPU without samples, a range without a sample before it), and
    /// the batched replace acts as one replace per GPU.
    pub async fn batched_energy_reads_and_writes_match_one_gpu_at_a_time(store: Arc<dyn Store>) {
        let rec = register(
            &store,
            "node-a",
            vec![
                gpu_info_full("GPU-a", 0),
                gpu_info_sparse("GPU-b", 1),
                gpu_info_sparse("GPU-c", 2),
            ],
        )
        .await;
        let (a, b, c) = (rec.gpus[0].id, rec.gpus[1].id, rec.gpus[2].id);
        // 150 ticks from T0 + 30 s: minute 0 half full, minutes 1 and 2 full, processes
        // on GPU-a and GPU-b; GPU-c has none of them.
        let start = T0 + 30_000;
        store
            .write_batches(&[node_batch(&rec, batch(1, start, 150, &["GPU-a", "GPU-b"]))])
            .await
            .expect("write");
        let m = |k: i64| T0 + k * 60_000;
        let range = |gpu, from, to| EnergyRange {
            gpu,
            from_ms: from,
            to_ms: to,
        };
        let ranges = [
            range(a, m(1), m(2)),
            range(b, m(0), m(3)),
            range(c, m(0), m(1)),
            range(a, m(0), m(1)),
            range(b, m(2), m(2) + 10_000),
        ];
        let many = store.energy_inputs_many(&ranges).await.expect("many");
        assert_eq!(many.len(), ranges.len());
        for (r, got) in ranges.iter().zip(&many) {
            let one = store
                .energy_inputs(r.gpu, r.from_ms, r.to_ms)
                .await
                .expect("one");
            assert_eq!(got, &one, "{r:?}");
        }
        assert_eq!(many[0].samples.len(), 60);
        assert!(many[0].prev.is_some() && many[3].prev.is_none());
        assert!(many[0].samples[0].processes.len() == 1, "GPU-a's process");
        assert!(many[2] == EnergyInputs::default(), "GPU-c has nothing");
        assert!(
            store
                .energy_inputs_many(&[])
                .await
                .expect("none")
                .is_empty()
        );

        // One transaction replacing minutes of two GPUs, raising one watermark.
        let minute = |k: i64, e: u64, learned: (u64, i64)| GpuMinute {
            minute_ms: m(k),
            energy_mj: e,
            counter_mj: e,
            idle_mj: e,
            covered_ms: 60_000,
            samples: 60,
            learned_idle_mj: learned.0,
            learned_idle_ms: learned.1,
            ..Default::default()
        };
        store
            .replace_energy_minutes_many(&[
                MinuteReplacement {
                    range: range(a, m(0), m(2)),
                    minutes: vec![minute(0, 10, (5, 500)), minute(1, 20, (7, 700))],
                    done_to_ms: Some(m(2)),
                },
                MinuteReplacement {
                    range: range(b, m(0), m(1)),
                    minutes: vec![minute(0, 30, (9, 900))],
                    done_to_ms: None,
                },
            ])
            .await
            .expect("replace many");
        let stored = store.energy_minutes(None, ALL_TIME).await.expect("read");
        let energies: Vec<(GpuId, i64, u64)> = stored
            .iter()
            .map(|(g, x)| (*g, x.minute_ms, x.energy_mj))
            .collect();
        assert_eq!(energies, vec![(a, m(0), 10), (a, m(1), 20), (b, m(0), 30)]);
        let done = |gpu| {
            let store = Arc::clone(&store);
            async move {
                store
                    .energy_gpus()
                    .await
                    .expect("gpus")
                    .into_iter()
                    .find(|g| g.gpu == gpu)
                    .expect("gpu")
                    .done_to_ms
            }
        };
        assert_eq!((done(a).await, done(b).await), (Some(m(2)), None));
        let before = store
            .energy_learned_before_many(&ranges)
            .await
            .expect("learned many");
        for (r, got) in ranges.iter().zip(&before) {
            let one = store
                .energy_learned_before(r.gpu, r.from_ms)
                .await
                .expect("one");
            assert_eq!(*got, one, "{r:?}");
        }
        assert_eq!(before, vec![(5, 500), (0, 0), (0, 0), (0, 0), (9, 900)]);
    }
}

mod remote_write_contract {
    use super::*;
    use gpufleet_collector::store::remote_write::{STREAM_ENERGY, STREAM_GPU, WorkloadNodeEnergy};
    use std::collections::BTreeMap;

    const MIN: i64 = 60_000;

    /// Positions per stream and series, never moving back; closed workload energy per
    /// minute and summed, provisional minutes left out, agreeing with the energy API's sums.
    pub async fn remote_write_positions_and_closed_energy(store: Arc<dyn Store>) {
        assert!(
            store
                .remote_write_positions(STREAM_GPU)
                .await
                .expect("read")
                .is_empty()
        );
        async fn save(store: &Arc<dyn Store>, stream: &str, positions: &[(&str, i64)]) {
            let positions: Vec<(String, i64)> = positions
                .iter()
                .map(|(s, p)| ((*s).to_owned(), *p))
                .collect();
            store
                .save_remote_write_positions(stream, &positions)
                .await
                .expect("save");
        }
        save(&store, STREAM_GPU, &[("GPU-a", 10), ("GPU-b", 20)]).await;
        save(&store, STREAM_GPU, &[("GPU-a", 5), ("GPU-b", 30)]).await;
        save(&store, STREAM_ENERGY, &[("", T0)]).await;
        let gpu = store
            .remote_write_positions(STREAM_GPU)
            .await
            .expect("read");
        assert_eq!(
            gpu,
            BTreeMap::from([("GPU-a".to_owned(), 10), ("GPU-b".to_owned(), 30)]),
            "a position never moves back"
        );
        let energy = store
            .remote_write_positions(STREAM_ENERGY)
            .await
            .expect("read");
        assert_eq!(energy, BTreeMap::from([(String::new(), T0)]));

        let rec = store
            .register_node(
                &hello("node-a"),
                &inventory(vec![gpu_info_full("GPU-a", 0), gpu_info_sparse("GPU-b", 1)]),
                T0,
            )
            .await
            .expect("register");
        let b = batch(1, T0, 330, &["GPU-a", "GPU-b"]);
        store
            .write_batches(&[node_batch(&rec, b)])
            .await
            .expect("write");
        // The clock inside minute 5: the newest minutes are still open (provisional).
        Accountant::new(
            store.clone(),
            EnergyOptions::default(),
            contract::clock_at(T0 + 5 * MIN + 40_000),
        )
        .pass()
        .await
        .expect("account");
        let minutes = store.energy_minutes(None, ALL_TIME).await.expect("minutes");
        let open: Vec<i64> = minutes
            .iter()
            .filter(|(_, m)| m.provisional)
            .map(|(_, m)| m.minute_ms)
            .collect();
        let first_open = *open.iter().min().expect("an open minute");
        let last_closed = first_open - MIN;
        assert!(last_closed > T0, "closed minutes too: {open:?}");

        let per_minute = store
            .workload_energy_minutes(T0 - MIN, T0 + 60 * MIN)
            .await
            .expect("minutes");
        assert!(
            per_minute
                .windows(2)
                .all(|w| w[0].minute_ms <= w[1].minute_ms)
        );
        assert!(
            per_minute
                .iter()
                .all(|r| r.minute_ms <= last_closed && r.node == "node-a")
        );
        let mut summed: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for r in &per_minute {
            let e = summed.entry(r.workload.key()).or_default();
            e.0 += r.active_mj;
            e.1 += r.idle_mj;
        }
        let totals: BTreeMap<String, (u64, u64)> = store
            .workload_energy_totals(T0 + 60 * MIN)
            .await
            .expect("totals")
            .into_iter()
            .map(|t| (t.workload.key(), (t.active_mj, t.idle_mj)))
            .collect();
        assert_eq!(totals, summed);
        let mut api: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let closed = TimeRange {
            from_ms: 0,
            to_ms: last_closed,
        };
        for w in store
            .workload_energy(closed, None, None)
            .await
            .expect("api")
        {
            let e = api.entry(w.workload.key()).or_default();
            e.0 += w.active_mj;
            e.1 += w.idle_mj;
        }
        assert_eq!(totals, api);
        assert!(totals.values().any(|(a, _)| *a > 0), "energy was accounted");

        // (after, to]: one minute.
        let one = store
            .workload_energy_minutes(T0 + MIN, T0 + 2 * MIN)
            .await
            .expect("one minute");
        assert!(!one.is_empty());
        assert!(one.iter().all(|r| r.minute_ms == T0 + 2 * MIN));
    }

    /// The pushed energy totals are saved with the energy position in one transaction and
    /// read back with the workload's labels; neither ever goes down. The accountant's
    /// watermark bounds how far the energy stream may go, counting only GPUs with samples
    /// at or after the asked time.
    pub async fn remote_write_energy_totals_never_go_down(store: Arc<dyn Store>) {
        assert!(
            store
                .remote_write_energy_totals()
                .await
                .expect("none yet")
                .is_empty()
        );
        let rec = store
            .register_node(
                &hello("node-a"),
                &inventory(vec![gpu_info_full("GPU-a", 0)]),
                T0,
            )
            .await
            .expect("register");
        let b = batch(1, T0, 330, &["GPU-a"]);
        store
            .write_batches(&[node_batch(&rec, b)])
            .await
            .expect("write");
        assert_eq!(
            store.energy_closed_to(T0).await.expect("progress"),
            Some(T0),
            "samples not accounted yet: no minute is closed"
        );
        Accountant::new(
            store.clone(),
            EnergyOptions::default(),
            contract::clock_at(T0 + 5 * MIN + 40_000),
        )
        .pass()
        .await
        .expect("account");
        let minutes = store.energy_minutes(None, ALL_TIME).await.expect("minutes");
        let first_open = minutes
            .iter()
            .filter(|(_, m)| m.provisional)
            .map(|(_, m)| m.minute_ms)
            .min()
            .expect("an open minute");
        assert_eq!(
            store.energy_closed_to(T0).await.expect("progress"),
            Some(first_open),
            "the watermark: every minute before the open one is closed"
        );
        assert_eq!(
            store
                .energy_closed_to(T0 + 60 * MIN)
                .await
                .expect("progress"),
            None,
            "no GPU has samples that late"
        );

        let last_closed = first_open - MIN;
        let totals = store
            .workload_energy_totals(last_closed)
            .await
            .expect("totals");
        assert!(
            totals.iter().any(|t| t.active_mj > 0),
            "energy was accounted"
        );
        store
            .save_remote_write_energy(last_closed, &totals)
            .await
            .expect("save");
        let read = store.remote_write_energy_totals().await.expect("read");
        assert_eq!(read, totals, "labels, node, joules and the position");
        // Lower figures and an older position (a stale sender) change nothing.
        let lower: Vec<_> = totals
            .iter()
            .map(|t| WorkloadNodeEnergy {
                active_mj: t.active_mj / 2,
                idle_mj: 0,
                ..t.clone()
            })
            .collect();
        store
            .save_remote_write_energy(T0, &lower)
            .await
            .expect("save");
        assert_eq!(
            store.remote_write_energy_totals().await.expect("read"),
            totals
        );
        // Higher ones raise them; a workload no longer stored is left out on reading.
        let mut higher: Vec<_> = totals
            .iter()
            .map(|t| WorkloadNodeEnergy {
                minute_ms: last_closed + MIN,
                active_mj: t.active_mj + 7,
                idle_mj: t.idle_mj + 3,
                ..t.clone()
            })
            .collect();
        let mut gone = higher[0].clone();
        gone.workload.unit = Some("gone.service".into());
        gone.workload.kind = WorkloadKind::Host;
        gone.workload.container_id = None;
        gone.workload.job_id = None;
        store
            .save_remote_write_energy(last_closed + MIN, &[higher.clone(), vec![gone]].concat())
            .await
            .expect("save");
        assert_eq!(
            store
                .remote_write_positions(STREAM_ENERGY)
                .await
                .expect("position"),
            BTreeMap::from([(String::new(), last_closed + MIN)])
        );
        higher.sort_by_key(|t| (t.workload.key(), t.node.clone()));
        assert_eq!(
            store.remote_write_energy_totals().await.expect("read"),
            higher
        );
    }

    /// The pusher's batched read: per GPU the samples after its own position, oldest
    /// first, at most `per_gpu` each and `total` together (every GPU's oldest before any
    /// GPU's next); reading on from each answer's newest sample skips nothing. Positions
    /// of one call saved in one go, the newest per series kept.
    pub async fn remote_write_reads_after_per_gpu_positions(store: Arc<dyn Store>) {
        let rec = store
            .register_node(
                &hello("node-a"),
                &inventory(vec![
                    gpu_info_full("GPU-a", 0),
                    gpu_info_sparse("GPU-b", 1),
                    gpu_info_sparse("GPU-c", 2),
                ]),
                T0,
            )
            .await
            .expect("register");
        let b = batch(1, T0, 20, &["GPU-a", "GPU-b"]);
        store
            .write_batches(&[node_batch(&rec, b)])
            .await
            .expect("write");
        let id = |uuid: &str| {
            rec.gpus
                .iter()
                .find(|g| g.info.uuid == uuid)
                .expect("registered")
                .id
        };
        let (a, b, c) = (id("GPU-a"), id("GPU-b"), id("GPU-c"));
        let all_a = store.gpu_samples(a, ALL_TIME, 100).await.expect("a");
        let all_b = store.gpu_samples(b, ALL_TIME, 100).await.expect("b");
        assert_eq!((all_a.len(), all_b.len()), (20, 20));

        // Each after its own position, at most `per_gpu`, field for field.
        let got = store
            .gpu_samples_after(&[(a, T0 - 1), (b, T0 + 2_000), (c, 0)], 3, 100)
            .await
            .expect("read");
        assert_eq!(got, vec![all_a[..3].to_vec(), all_b[3..6].to_vec(), vec![]]);
        // The total shared out oldest first: a, b, a, b, a.
        let got = store
            .gpu_samples_after(&[(a, 0), (b, 0)], 10, 5)
            .await
            .expect("read");
        assert_eq!(got, vec![all_a[..3].to_vec(), all_b[..2].to_vec()]);
        // A GPU past its newest sample gets nothing; an empty request reads nothing.
        let newest = all_a.last().expect("samples").0;
        let got = store
            .gpu_samples_after(&[(a, newest), (b, newest - 1)], 10, 10)
            .await
            .expect("read");
        assert_eq!(got, vec![vec![], all_b[19..].to_vec()]);
        assert!(
            store
                .gpu_samples_after(&[], 10, 10)
                .await
                .expect("read")
                .is_empty()
        );

        // Rounds reading on from each answer's newest sample: everything, once, in order.
        let mut positions = [(a, T0 - 1), (b, T0 + 4_500)];
        let mut seen = [Vec::new(), Vec::new()];
        for round in 0.. {
            assert!(round < 20, "rounds do not end");
            let got = store
                .gpu_samples_after(&positions, 4, 7)
                .await
                .expect("read");
            if got.iter().all(Vec::is_empty) {
                break;
            }
            for ((position, seen), samples) in positions.iter_mut().zip(&mut seen).zip(got) {
                if let Some(&(last, _)) = samples.last() {
                    position.1 = last;
                }
                seen.extend(samples);
            }
        }
        assert_eq!(seen, [all_a.clone(), all_b[5..].to_vec()]);

        // Positions: many series and repeats in one call, the newest kept, never back.
        let positions: Vec<(String, i64)> =
            [("GPU-x", 10), ("GPU-y", 7), ("GPU-x", 40), ("GPU-x", 20)]
                .iter()
                .map(|(s, p)| ((*s).to_owned(), *p))
                .collect();
        store
            .save_remote_write_positions(STREAM_GPU, &positions)
            .await
            .expect("save");
        store
            .save_remote_write_positions(
                STREAM_GPU,
                &[("GPU-x".to_owned(), 30), ("GPU-y".to_owned(), 8)],
            )
            .await
            .expect("save");
        assert_eq!(
            store
                .remote_write_positions(STREAM_GPU)
                .await
                .expect("read"),
            BTreeMap::from([("GPU-x".to_owned(), 40), ("GPU-y".to_owned(), 8)])
        );
    }
}
/// Instantiates every contract test for one backend: `$open` returns `(guard, store)`.
macro_rules! contract_tests {
    ($backend:ident, $open:path) => {
        mod $backend {
            use super::*;
            contract_tests!(@each $open;
                registration_round_trips_inventory,
                gpu_of_another_node_is_refused_until_rehomed,
                conflicts_are_left_out_and_replays_are_not,
                batches_read_back_field_for_field,
                replaying_a_batch_changes_nothing,
                last_acked_seq_and_last_seen_only_grow,
                latest_samples_seed_the_live_state,
                health_round_trips_and_the_latest_seeds_the_live_state,
                sparse_health_and_events_never_push_gpu_ticks_out,
                series_raw_and_downsampled,
                workload_names_learned_later_are_kept,
                workload_renames_take_the_latest_names,
                job_names_and_labels_are_kept_and_the_latest_win,
                rollups_hold_avg_min_max_and_absent_is_null,
                rollups_are_incremental_and_late_data_is_recomputed,
                rollup_minutes_are_packed_by_the_hour_and_read_back,
                long_buckets_over_packed_hours_are_summed_whole,
                an_hour_waiting_for_raw_rows_does_not_starve_the_others,
                retention_expires_raw_behind_the_watermarks_and_keeps_totals,
                host_rows_are_packed_read_back_and_reopened_by_writes,
                process_ticks_are_packed_and_energy_stays_exact,
                samples_and_process_ticks_of_closed_minutes_are_packed_as_they_arrive,
                a_follower_reads_samples_packed_on_arrival,
                a_write_catching_up_on_many_minutes_rolls_each_one_up,
                gpu_samples_are_packed_and_every_reader_agrees,
                closed_hours_are_merged_split_and_read_back,
                health_hours_are_packed_read_back_and_expired,
                health_retention_finds_the_newest_reading_across_a_gap,
                carbon_cache_and_minute_prices,
                batched_energy_reads_and_writes_match_one_gpu_at_a_time,
                waste_minutes_read_idle_candidates_with_their_price,
            );
            #[tokio::test]
            async fn remote_write_positions_and_closed_energy() {
                let (_guard, store) = $open().await;
                remote_write_contract::remote_write_positions_and_closed_energy(Arc::clone(&store)).await;
                store.close().await;
            }
            #[tokio::test]
            async fn remote_write_energy_totals_never_go_down() {
                let (_guard, store) = $open().await;
                remote_write_contract::remote_write_energy_totals_never_go_down(Arc::clone(&store)).await;
                store.close().await;
            }
            #[tokio::test]
            async fn remote_write_reads_after_per_gpu_positions() {
                let (_guard, store) = $open().await;
                remote_write_contract::remote_write_reads_after_per_gpu_positions(Arc::clone(&store)).await;
                store.close().await;
            }
        }
    };
    (@each $open:path; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                let (_guard, store) = $open().await;
                contract::$name(Arc::clone(&store)).await;
                store.close().await;
            }
        )*
    };
}

contract_tests!(sqlite, sqlite_store);
contract_tests!(postgres, pg_store);

// ------------------------------------------------------------------ SQLite specifics

/// Reopening a database keeps its data and does not re-run migrations.
#[tokio::test]
async fn sqlite_reopen_keeps_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("nested.db").display());
    let store = gpufleet_collector::store::open(&url).await.expect("create");
    let rec = store
        .register_node(
            &hello("n"),
            &inventory(vec![gpu_info_sparse("GPU-a", 0)]),
            T0,
        )
        .await
        .expect("register");
    store
        .write_batches(&[node_batch(&rec, batch(1, T0, 2, &["GPU-a"]))])
        .await
        .expect("write");
    store.close().await;
    let store = gpufleet_collector::store::open(&url).await.expect("reopen");
    let nodes = store.nodes().await.expect("nodes");
    assert_eq!(
        (
            nodes.len(),
            nodes[0].stored_samples,
            nodes[0].last_acked_seq
        ),
        (1, 2, 1)
    );
    store.close().await;
}

#[tokio::test]
async fn unsupported_urls_say_what_to_use() {
    let err = gpufleet_collector::store::open("mysql://u:secret@localhost/db")
        .await
        .expect_err("not supported");
    let msg = err.to_string();
    assert!(
        msg.contains("sqlite://") && msg.contains("postgres://") && !msg.contains("secret"),
        "{msg}"
    );
}

/// The on-disk size of a raw GPU sample, measured with SQLite's dbstat table over
/// realistic samples from 8 GPUs: an A100's, and an H100's with its 14 GPM values. The
/// design's budget was 120 bytes for the 25 values every GPU has (117 measured); the GPM
/// columns cost a GPU without GPM one header byte each (NULL: 15 bytes, 132 measured) and
/// an H100 ~45 bytes of values more. Raw rows live only until their minute is packed.
#[tokio::test]
async fn sqlite_gpu_sample_rows_fit_the_size_budget() {
    for (gpm, budget) in [(false, 135.0), (true, 180.0)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("size.db");
        let store = gpufleet_collector::store::open(&format!("sqlite://{}", path.display()))
            .await
            .expect("open");
        let rows = write_size_fixture(&store, gpm).await;
        store.close().await;

        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("connect");
        let bytes: i64 =
            sqlx::query_scalar("SELECT sum(pgsize) FROM dbstat WHERE name = 'gpu_samples'")
                .fetch_one(&pool)
                .await
                .expect("dbstat");
        let per_row = bytes as f64 / rows as f64;
        println!(
            "gpu_samples (GPM {gpm}): {rows} rows, {bytes} bytes on disk, {per_row:.1} bytes per sample"
        );
        assert!(
            per_row <= budget,
            "{per_row:.1} bytes per GPU sample (GPM {gpm}) exceeds the {budget}-byte budget"
        );
        pool.close().await;
    }
}

/// Samples and process ticks arriving for a closed minute go into its packed values,
/// except where the minute holds rows (written while it was open): there they are rows
/// too, so a minute is in one form at a time.
#[tokio::test]
async fn a_closed_minute_takes_late_samples_in_the_form_it_holds() {
    let (dir, store) = sqlite_store().await;
    let rec = register_gpus(&store, "node-m", &["GPU-a"], T0).await;
    let tick = |t: UnixMs| common::tick(t, &["GPU-a"], 1);
    // Minute 0 written while open (no clock): rows.
    contract::write(&store, &rec, 1, vec![tick(T0)]).await;
    store.set_arrival_clock(Some(contract::clock_at(T0 + 3_600_000)));
    // Minute 0 again, and minute 1 for the first time, both closed now.
    contract::write(&store, &rec, 2, vec![tick(T0 + 1_000), tick(T0 + 61_000)]).await;
    let pool = sqlx::SqlitePool::connect(&format!(
        "sqlite://{}",
        dir.path().join("test.db").display()
    ))
    .await
    .expect("connect");
    let rows: Vec<i64> = sqlx::query_scalar("SELECT ts_ms FROM process_samples ORDER BY ts_ms")
        .fetch_all(&pool)
        .await
        .expect("rows");
    assert_eq!(rows, vec![T0, T0 + 1_000], "minute 0 stays rows");
    let rows: Vec<i64> = sqlx::query_scalar("SELECT ts_ms FROM gpu_samples ORDER BY ts_ms")
        .fetch_all(&pool)
        .await
        .expect("rows");
    assert_eq!(rows, vec![T0, T0 + 1_000], "minute 0's samples stay rows");
    for (table, text) in [
        (
            "processes",
            "SELECT minute_ms FROM packed_process_minutes ORDER BY minute_ms",
        ),
        (
            "samples",
            "SELECT minute_ms FROM packed_gpu_minutes ORDER BY minute_ms",
        ),
    ] {
        let packed: Vec<i64> = sqlx::query_scalar(text)
            .fetch_all(&pool)
            .await
            .expect("packed");
        assert_eq!(
            packed,
            vec![T0 + 60_000],
            "minute 1 is packed as it arrives: {table}"
        );
    }
    pool.close().await;
    let read = store.process_samples(rec.gpus[0].id, ALL_TIME, 100).await;
    let times: Vec<UnixMs> = read.expect("read").iter().map(|(t, _)| *t).collect();
    assert_eq!(times, vec![T0, T0 + 1_000, T0 + 61_000]);
    let read = store.gpu_samples(rec.gpus[0].id, ALL_TIME, 100).await;
    let times: Vec<UnixMs> = read.expect("read").iter().map(|(t, _)| *t).collect();
    assert_eq!(times, vec![T0, T0 + 1_000, T0 + 61_000]);
}

/// A packed rollup hour that cannot be read stops packing and retention for its series
/// only: the other series' minutes are still packed and trimmed.
#[tokio::test]
async fn a_corrupt_packed_hour_stops_only_its_own_series() {
    let (dir, store) = sqlite_store().await;
    let (rec, _r, _acc) = contract::two_gpu_hours(&store, "node-c").await;
    let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
    const HOUR: i64 = 3_600_000;
    // Hour 0 of both GPUs: hour 1's raw minutes are not behind `before` yet.
    let before = T0 + HOUR + 60_000;
    assert_eq!(contract::pack_in_small_steps(&store, before).await, 2 * 60);

    let db = dir.path().join("test.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("connect");
    let hit = sqlx::query("UPDATE packed_gpu_rollup_hours SET packed = x'0102' WHERE gpu_id = ?")
        .bind(a.0)
        .execute(&pool)
        .await
        .expect("corrupt")
        .rows_affected();
    assert_eq!(hit, 1, "GPU-a's packed hour 0");
    pool.close().await;
    assert!(matches!(
        store.rollup_minutes(RollupKey::gpu(a), ALL_TIME).await,
        Err(StoreError::Unreadable(_))
    ));
    // A late sample reopens GPU-a's raw minute 30: judging it reads the corrupt hour.
    let late = T0 + 30 * 60_000 + 5_000;
    let tick = contract::two_gpu_tick(late, &["GPU-a"], 100);
    contract::write(&store, &rec, 2, vec![tick]).await;

    // GPU-b's hour 1 is packed; GPU-a's raw minutes are left as they are.
    let before = T0 + 4 * HOUR;
    assert_eq!(contract::pack_in_small_steps(&store, before).await, 60);
    let b_minutes = store
        .rollup_minutes(RollupKey::gpu(b), ALL_TIME)
        .await
        .expect("b");
    assert_eq!(b_minutes.len(), 179);

    // Retention into hour 0: GPU-a's hour 0 cannot be trimmed, GPU-b's is.
    let cutoff = T0 + 30 * 60_000;
    let out = store
        .expire_rollups_before(cutoff, 50)
        .await
        .expect("retention goes on past GPU-a");
    assert_eq!(
        out.deleted.get("packed_gpu_rollup_hours"),
        Some(&1),
        "{out:?}"
    );
    let kept = store
        .rollup_minutes(RollupKey::gpu(b), ALL_TIME)
        .await
        .expect("b");
    let want: Vec<RollupMinute> = b_minutes
        .into_iter()
        .filter(|m| m.minute_ms >= cutoff)
        .collect();
    assert_eq!(kept, want);
    store.close().await;
}

/// Retention whose horizon falls inside an hour-long packed value that cannot be split
/// (here unreadable; on PostgreSQL also one another collector merged after the split was
/// looked for) leaves that value whole: nothing at or after the horizon goes early, and
/// every other series is expired as usual.
#[tokio::test]
async fn an_hour_holding_the_horizon_goes_only_once_split() {
    const HOUR: i64 = 3_600_000;
    let (dir, store) = sqlite_store().await;
    let rec = contract::three_hours(&store, "node-x").await;
    let (a, b) = (rec.gpus[0].id, rec.gpus[1].id);
    let now = T0 + 5 * HOUR;
    let mut acc = Accountant::new(
        store.clone(),
        EnergyOptions::default(),
        contract::clock_at(now),
    );
    acc.pass().await.expect("account");
    let mut r = contract::rollups(&store, now);
    r.pass().await.expect("roll up");
    assert_eq!(r.pack(now).await.expect("pack").hours, 5 * 3);

    let db = dir.path().join("test.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("connect");
    let hit = sqlx::query(
        "UPDATE packed_process_minutes SET packed = x'0102' \
         WHERE gpu_id = ? AND minute_ms = ? AND span_ms = 3600000",
    )
    .bind(a.0)
    .bind(T0 + HOUR)
    .execute(&pool)
    .await
    .expect("corrupt")
    .rows_affected();
    assert_eq!(hit, 1, "GPU-a's process hour 1");
    let horizon = T0 + HOUR + 30 * 60_000;
    let ahead = TimeRange {
        from_ms: horizon,
        to_ms: UnixMs::MAX,
    };
    let b_ahead = store.process_samples(b, ahead, 100_000).await.expect("b");

    r.expire(T0 + 7 * 86_400_000 + HOUR + 30 * 60_000)
        .await
        .expect("retention goes on past GPU-a's hour");
    let left: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT minute_ms, span_ms FROM packed_process_minutes WHERE gpu_id = ? \
         ORDER BY minute_ms",
    )
    .bind(a.0)
    .fetch_all(&pool)
    .await
    .expect("read");
    assert_eq!(left, vec![(T0 + HOUR, HOUR), (T0 + 2 * HOUR, HOUR)]);
    let b_left: Vec<(i64,)> =
        sqlx::query_as("SELECT min(minute_ms) FROM packed_process_minutes WHERE gpu_id = ?")
            .bind(b.0)
            .fetch_all(&pool)
            .await
            .expect("read");
    assert_eq!(
        b_left,
        vec![(horizon,)],
        "GPU-b's hour 1 split, expired to the horizon"
    );
    assert_eq!(
        store.process_samples(b, ahead, 100_000).await.expect("b"),
        b_ahead
    );
    pool.close().await;
    store.close().await;
}

// ------------------------------------------------------------------ PostgreSQL specifics

/// Batches for days without a partition get one on demand (a day long past and one in the
/// future); retention drops whole days before the cutoff and nothing newer.
/// Packing empties a past day's process and host partitions: they are dropped (the space
/// of deleted rows in a past partition is never reused), the day's GPU partition stays,
/// every answer stays, and late data for the day brings its partitions back.
#[tokio::test]
async fn postgres_partitions_emptied_by_packing_are_dropped() {
    use gpufleet_collector::accounting::accountant::{Accountant, EnergyOptions};
    use gpufleet_collector::store::postgres::{DAY_MS, PgStore};
    const HOUR: i64 = 3_600_000;
    let schema = PgSchema::create().await;
    let store: Arc<dyn Store> = Arc::new(PgStore::open(&schema.url()).await.expect("open"));
    // Every write as rows, as T0's day was written live (the wall clock will close it).
    store.set_arrival_clock(None);
    let rec = store
        .register_node(&hello("n"), &inventory(vec![gpu_info_full("GPU-a", 0)]), T0)
        .await
        .expect("register");
    let gpu = rec.gpus[0].id;
    // The last three minutes of T0's day (2027-01-15), and a tick in the next day's
    // second minute: the newest, which stays a row.
    let end = T0 - T0.rem_euclid(DAY_MS) + DAY_MS;
    let mut ticks = batch(1, end - 3 * 60_000, 180, &["GPU-a"]).ticks;
    ticks.push(common::tick(end + 60_000, &["GPU-a"], 1));
    let b = Batch {
        seq: 1,
        ticks,
        delivery: DeliveryStats::default(),
    };
    store
        .write_batches(&[node_batch(&rec, b)])
        .await
        .expect("write");
    let reads = || async {
        format!(
            "{:?}\n{:?}\n{:?}",
            store.host_samples(rec.id, ALL_TIME, 1000).await.expect("h"),
            store.process_samples(gpu, ALL_TIME, 1000).await.expect("p"),
            store.gpu_samples(gpu, ALL_TIME, 1000).await.expect("s")
        )
    };
    let before = reads().await;
    let now = end + 3 * HOUR;
    Accountant::new(
        store.clone(),
        EnergyOptions::default(),
        contract::clock_at(now),
    )
    .pass()
    .await
    .expect("account");
    let mut r = contract::rollups(&store, now);
    r.pass().await.expect("roll up");
    let out = r.pack(now).await.expect("pack");
    assert_eq!(out.minutes, 3 + 3 + 3, "{out:?}");
    for table in ["host_samples", "process_samples", "gpu_samples"] {
        let name = format!("{table}_p20270115");
        assert!(out.partitions_dropped.contains(&name), "{out:?}");
    }
    // The next day's partitions hold the newest tick's rows.
    assert!(
        !(out.partitions_dropped.iter()).any(|n| n.ends_with("_p20270116")),
        "{out:?}"
    );
    assert_eq!(reads().await, before);
    let partitions = || async {
        let pg = PgStore::open(&schema.url()).await.expect("reopen");
        let names: Vec<String> = (pg.raw_partitions().await.expect("partitions"))
            .into_iter()
            .map(|p| p.name)
            .collect();
        pg.close().await;
        names
    };
    let names = partitions().await;
    assert!(
        !names.iter().any(|n| n.ends_with("_p20270115")),
        "{names:?}"
    );

    // A late tick in a packed minute of that day: the partitions come back, its minute is
    // unpacked into them, and every answer has the late tick too.
    let late = common::tick(end - 90_500, &["GPU-a"], 5);
    write_ticks(&store, &rec, 2, vec![late.clone()]).await;
    let names = partitions().await;
    assert!(
        names.iter().any(|n| n == "host_samples_p20270115"),
        "{names:?}"
    );
    let hosts = store.host_samples(rec.id, ALL_TIME, 1000).await.expect("h");
    assert_eq!(hosts.len(), 182);
    assert!(hosts.iter().any(|h| h.time_ms == late.time_ms));
    let procs = store.process_samples(gpu, ALL_TIME, 1000).await.expect("p");
    assert!(procs.iter().any(|p| p.0 == late.time_ms));
    let samples = store.gpu_samples(gpu, ALL_TIME, 1000).await.expect("s");
    assert_eq!(samples.len(), 182);
    assert!(samples.iter().any(|s| s.0 == late.time_ms));
    // Its minute waits for its recomputation: the partitions hold rows and stay.
    let out = r.pack(now).await.expect("pack");
    assert_eq!(out.minutes, 0, "{out:?}");
    assert!(
        !(out.partitions_dropped.iter()).any(|n| n.ends_with("_p20270115")),
        "{out:?}"
    );
    assert_eq!(
        store.host_samples(rec.id, ALL_TIME, 1000).await.expect("h"),
        hosts
    );
    store.close().await;
}

#[tokio::test]
async fn postgres_partitions_are_created_on_demand_and_dropped_by_day() {
    use gpufleet_collector::store::postgres::{DAY_MS, PgStore};
    let schema = PgSchema::create().await;
    let pg = PgStore::open(&schema.url()).await.expect("open");
    let at_open = pg.raw_partitions().await.expect("partitions");
    assert_eq!(
        at_open.len(),
        6,
        "today and tomorrow, three tables: {at_open:?}"
    );

    let store: Arc<dyn Store> = Arc::new(pg);
    // Every write as rows: the wall clock would close the old day to writes and pack it.
    store.set_arrival_clock(None);
    let rec = store
        .register_node(&hello("n"), &inventory(vec![gpu_info_full("GPU-a", 0)]), T0)
        .await
        .expect("register");
    let old = T0 - 400 * DAY_MS; // 2025-12-11
    let new = T0; // 2027-01-15
    for (seq, start) in [(1, old), (2, new)] {
        store
            .write_batches(&[node_batch(&rec, batch(seq, start, 3, &["GPU-a"]))])
            .await
            .expect("write into a day without a partition yet");
    }
    let gpu = rec.gpus[0].id;
    assert_eq!(
        store
            .gpu_samples(gpu, ALL_TIME, 100)
            .await
            .expect("read")
            .len(),
        6
    );

    // The store is behind the trait now: reopen the same schema for the inherent methods.
    let pg = PgStore::open(&schema.url()).await.expect("reopen");
    let names: Vec<String> = pg
        .raw_partitions()
        .await
        .expect("partitions")
        .into_iter()
        .map(|p| p.name)
        .collect();
    for want in [
        "gpu_samples_p20251211",
        "process_samples_p20251211",
        "host_samples_p20251211",
        "gpu_samples_p20270115",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }

    let cutoff = new - DAY_MS;
    let dropped = pg.drop_raw_before(cutoff).await.expect("drop");
    for want in [
        "gpu_samples_p20251211",
        "host_samples_p20251211",
        "process_samples_p20251211",
    ] {
        assert!(dropped.iter().any(|n| n == want), "{want} in {dropped:?}");
    }
    let kept = pg.raw_partitions().await.expect("partitions");
    assert!(
        kept.iter().all(|p| p.to_ms.is_some_and(|to| to > cutoff)),
        "only days ending after the cutoff are kept: {kept:?}"
    );
    assert!(kept.iter().any(|p| p.name == "gpu_samples_p20270115"));
    let left = store.gpu_samples(gpu, ALL_TIME, 100).await.expect("read");
    assert_eq!(left.len(), 3, "the newer day is untouched");
    assert!(left.iter().all(|(t, _)| *t >= T0));
    assert!(
        pg.drop_raw_before(new - DAY_MS)
            .await
            .expect("again")
            .is_empty()
    );

    // Late data for the dropped day: the partition is created again, by the store that
    // dropped it and by one whose cache still believes it exists.
    store
        .write_batches(&[node_batch(&rec, batch(3, old, 1, &["GPU-a"]))])
        .await
        .expect("late write after retention");
    assert_eq!(
        store
            .gpu_samples(gpu, ALL_TIME, 100)
            .await
            .expect("read")
            .len(),
        4
    );
    pg.close().await;
    store.close().await;
}

/// Retention on PostgreSQL drops the raw day partitions that hold nothing to keep and
/// deletes the rest behind the horizons; rollups and energy stay as they were.
#[tokio::test]
async fn postgres_retention_drops_whole_days_behind_the_watermarks() {
    use gpufleet_collector::store::postgres::{DAY_MS, PgStore};
    let (schema, store) = pg_store().await;
    let rec = store
        .register_node(&hello("n"), &inventory(vec![gpu_info_full("GPU-a", 0)]), T0)
        .await
        .expect("register");
    // 100 s of samples on each of three days: 2027-01-13, -14 and -15 (T0 is 08:00 UTC).
    for (seq, start) in [(1, T0 - 2 * DAY_MS), (2, T0 - DAY_MS), (3, T0)] {
        store
            .write_batches(&[node_batch(&rec, batch(seq, start, 100, &["GPU-a"]))])
            .await
            .expect("write");
    }
    Accountant::new(
        store.clone(),
        EnergyOptions::default(),
        contract::clock_at(T0),
    )
    .pass()
    .await
    .expect("account");
    let mut r = contract::rollups(&store, T0);
    r.pass().await.expect("roll up");
    let before = contract::accounted(&store, &rec).await;

    // A week after T0: raw before T0 may go (the watermarks are past it).
    let out = r.expire(T0 + 7 * DAY_MS).await.expect("expire");
    // (The empty partitions made at open for the wall clock's today, before T0, go too.)
    let mut dropped = out.partitions_dropped.clone();
    dropped.retain(|n| n.contains("_p2027"));
    dropped.sort();
    assert_eq!(
        dropped,
        [
            "gpu_samples_p20270113",
            "host_samples_p20270113",
            "process_samples_p20270113"
        ],
        "the day before the kept sample goes whole"
    );
    // 2027-01-14 keeps its last GPU sample (where the first interval after it starts):
    // the rest of that day is deleted row by row.
    assert_eq!(out.deleted.get("gpu_samples"), Some(&99), "{out:?}");
    assert_eq!(out.deleted.get("process_samples"), Some(&100));
    assert_eq!(out.deleted.get("host_samples"), Some(&100));
    let pg = PgStore::open(&schema.url()).await.expect("reopen");
    let names: Vec<String> = pg
        .raw_partitions()
        .await
        .expect("partitions")
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert!(!names.iter().any(|n| n.ends_with("20270113")), "{names:?}");
    assert!(names.iter().any(|n| n == "gpu_samples_p20270114"));
    let left = store
        .gpu_samples(rec.gpus[0].id, ALL_TIME, 1000)
        .await
        .expect("read");
    assert_eq!(left.len(), 101);
    assert_eq!(left[0].0, T0 - DAY_MS + 99_000);
    assert_eq!(contract::accounted(&store, &rec).await, before);
    let report = energy_check::check(store.as_ref(), ALL_TIME)
        .await
        .expect("check");
    assert_eq!(report.violations, vec![]);
    pg.close().await;
    store.close().await;
}

/// A password in the URL never reaches an error message.
#[tokio::test]
async fn postgres_errors_do_not_show_the_password() {
    // Port 1: nothing listens there.
    let err = gpufleet_collector::store::open("postgres://postgres:sekrit@127.0.0.1:1/test")
        .await
        .expect_err("nothing listens on port 1");
    let msg = err.to_string();
    assert!(!msg.contains("sekrit"), "{msg}");
    assert!(
        msg.contains("postgres://postgres:***@127.0.0.1:1/test"),
        "{msg}"
    );
    assert!(
        err.is_transient(),
        "an unreachable server may come back: {err:?}"
    );
}

/// The on-disk size of a raw GPU sample on PostgreSQL (heap, TOAST and primary key), over
/// the same realistic samples as the SQLite test.
#[tokio::test]
async fn postgres_gpu_sample_rows_have_a_known_size() {
    for (gpm, budget) in [(false, 240.0), (true, 300.0)] {
        let (schema, store) = pg_store().await;
        let rows = write_size_fixture(&store, gpm).await;
        store.close().await;
        let mut conn = pg_connect(&schema.url()).await;
        let bytes: i64 = sqlx::query_scalar(
            "SELECT sum(pg_total_relation_size(i.inhrelid))::int8 FROM pg_inherits i \
             WHERE i.inhparent = 'gpu_samples'::regclass",
        )
        .fetch_one(&mut conn)
        .await
        .expect("relation size");
        let per_row = bytes as f64 / rows as f64;
        println!(
            "gpu_samples (PostgreSQL, GPM {gpm}): {rows} rows, {bytes} bytes, {per_row:.1} bytes per sample"
        );
        // A heap row is ~180 bytes (24-byte tuple header, 12 bigints, 8 integers, 6
        // smallints, 4-byte line pointer); the primary key adds ~32; GPM 10 smallints and
        // 4 bigints more.
        assert!(
            per_row <= budget,
            "{per_row:.1} bytes per GPU sample (GPM {gpm}) exceeds the {budget}-byte PostgreSQL budget"
        );
    }
}

/// Writes 2,500 ticks of 8 realistic samples (no per-link NVLink, no MIG), with GPM (an
/// H100's) or without (an A100's); returns the rows.
async fn write_size_fixture(store: &Arc<dyn Store>, gpm: bool) -> u64 {
    let uuids: Vec<String> = (0..8)
        .map(|i| format!("GPU-{i:08x}-aaaa-bbbb-cccc-0123456789ab"))
        .collect();
    let infos = uuids
        .iter()
        .enumerate()
        .map(|(i, u)| gpu_info_full(u, i as u32))
        .collect();
    let rec = store
        .register_node(&hello("n"), &inventory(infos), T0)
        .await
        .expect("register");
    let ticks_per_batch = 100;
    let batches = 25;
    for b in 0..batches {
        let ticks = (0..ticks_per_batch)
            .map(|t| {
                let k = b * ticks_per_batch + t;
                let gpus = uuids
                    .iter()
                    .map(|u| {
                        let mut s = gpu_sample_full(u, k);
                        s.nvlinks.clear(); // per-link NVLink is optional; sums are kept
                        s.ecc_uncorrected_volatile = Some(0);
                        s.mig_gpm.clear();
                        s.gpm = if gpm {
                            let v = |base: u32| Some(base + (k * 37) % 700);
                            GpmMetrics {
                                sm_active_cpct: v(8_900),
                                sm_occupancy_cpct: v(4_200),
                                tensor_active_cpct: v(5_800),
                                tensor_hmma_cpct: v(5_600),
                                tensor_imma_cpct: Some(0),
                                tensor_dfma_cpct: Some(0),
                                dram_bw_cpct: v(5_100),
                                fp64_cpct: Some(k % 3),
                                fp32_cpct: v(1_900),
                                fp16_cpct: v(3_300),
                                pcie_tx_bps: Some(1_200_000_000 + u64::from(k) * 4_099),
                                pcie_rx_bps: Some(3_400_000_000 + u64::from(k) * 7_919),
                                nvlink_tx_bps: Some(90_000_000_000 + u64::from(k) * 104_729),
                                nvlink_rx_bps: Some(88_000_000_000 + u64::from(k) * 99_991),
                            }
                        } else {
                            GpmMetrics::default()
                        };
                        s
                    })
                    .collect();
                Tick {
                    time_ms: T0 + i64::from(k) * 1000,
                    gpus,
                    ..Default::default()
                }
            })
            .collect();
        let batch = Batch {
            seq: u64::from(b) + 1,
            ticks,
            delivery: DeliveryStats::default(),
        };
        store
            .write_batches(&[node_batch(&rec, batch)])
            .await
            .expect("write");
    }
    u64::from(batches * ticks_per_batch) * 8
}
