//! What a node may write, over real gRPC against a collector on loopback: a GPU belongs to
//! the node that registered it (another node's Hello or batch naming it is refused, even
//! with a valid token of its own), a seq cannot jump to an absurd value, and a second
//! agent writing different samples as the same node is refused as a conflict (counted in
//! `/metrics`) instead of being acked while nothing is stored.

use crate::common::*;
use gpufleet_collector::ServeOptions;
use gpufleet_core::config::now_ms;
use gpufleet_proto::v1 as pb;
use gpufleet_proto::v1::collector_message::Msg;
use tonic::Code;

fn reject_code(msg: &Msg) -> Option<(pb::RejectCode, &str)> {
    match msg {
        Msg::Reject(r) => Some((
            pb::RejectCode::try_from(r.code).expect("known code"),
            r.reason.as_str(),
        )),
        _ => None,
    }
}

#[tokio::test]
async fn a_node_cannot_take_another_nodes_gpu() {
    let c = start_collector(ServeOptions::default()).await;
    let (token_a, token_b) = (add_token(&c, "node-a").await, add_token(&c, "node-b").await);
    // Samples a little in the past, so every tick is inside the accepted time window.
    let t0 = now_ms() - 60_000;

    let mut a = open_stream(&c, Some(&token_a), "node-a", &["GPU-A1", "GPU-A2"])
        .await
        .expect("node-a welcome");
    for seq in 1..=3 {
        let start = t0 + (seq as i64 - 1) * 5_000;
        let answer = a.send(batch(seq, start, 5, &["GPU-A1", "GPU-A2"])).await;
        assert!(
            matches!(answer, Msg::Ack(pb::Ack { seq: s }) if s == seq),
            "{answer:?}"
        );
    }

    // Node B holds a valid token of its own and claims A's GPU in its Hello: refused,
    // naming the GPU, and nothing of B is registered.
    for token in [Some(token_b.as_str()), None] {
        let refused = open_stream(&c, token, "node-b", &["GPU-B1", "GPU-A1"])
            .await
            .err()
            .expect("node-b may not register GPU-A1");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert!(
            refused.message().contains("GPU-A1") && refused.message().contains("node-a"),
            "names the GPU and its owner: {}",
            refused.message()
        );
    }
    assert_eq!(c.node_names().await, ["node-a"]);

    // With only its own GPU, B is welcome, but a batch about A's GPU is refused, and so
    // is a batch sent ahead at A's next timestamps.
    let mut b = open_stream(&c, Some(&token_b), "node-b", &["GPU-B1"])
        .await
        .expect("node-b welcome");
    let forged = batch(1, t0 + 15_000, 5, &["GPU-A1"]);
    let answer = b.send(forged).await;
    let (code, reason) = reject_code(&answer).expect("rejected");
    assert_eq!(code, pb::RejectCode::Invalid);
    assert!(reason.contains("GPU-A1"), "{reason}");
    let answer = b.send(batch(1, t0 + 15_000, 5, &["GPU-B1"])).await;
    assert!(
        matches!(answer, Msg::Ack(_)),
        "B's own GPU is fine: {answer:?}"
    );

    // A goes on; every one of its samples is stored and its GPUs are still its own.
    for seq in 4..=6 {
        let start = t0 + (seq as i64 - 1) * 5_000;
        let answer = a.send(batch(seq, start, 5, &["GPU-A1", "GPU-A2"])).await;
        assert!(
            matches!(answer, Msg::Ack(pb::Ack { seq: s }) if s == seq),
            "{answer:?}"
        );
    }
    let nodes = c.store.nodes().await.expect("nodes");
    let node_a = nodes.iter().find(|n| n.name == "node-a").expect("node-a");
    let node_b = nodes.iter().find(|n| n.name == "node-b").expect("node-b");
    let uuids = |n: &gpufleet_collector::store::NodeRecord| {
        n.gpus
            .iter()
            .map(|g| g.info.uuid.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(uuids(node_a), ["GPU-A1", "GPU-A2"]);
    assert_eq!(uuids(node_b), ["GPU-B1"]);
    assert_eq!(node_a.stored_samples, 6 * 5 * 2, "all of A's samples");
    let range = gpufleet_collector::store::TimeRange {
        from_ms: 0,
        to_ms: i64::MAX,
    };
    let a1 = c
        .store
        .gpu_samples(node_a.gpus[0].id, range, 1000)
        .await
        .expect("read GPU-A1");
    let expected: Vec<_> = (1..=6u64)
        .flat_map(|seq| batch(seq, t0 + (seq as i64 - 1) * 5_000, 5, &["GPU-A1", "GPU-A2"]).ticks)
        .map(|t| (t.time_ms, t.gpus[0].clone()))
        .collect();
    assert_eq!(a1, expected, "GPU-A1 holds A's samples, exactly");
    drop((a, b));
    c.stop().await;
}

#[tokio::test]
async fn an_absurd_seq_is_refused_and_does_not_move_the_nodes_seq() {
    let c = start_collector(ServeOptions::default()).await;
    let t0 = now_ms() - 60_000;
    let mut a = open_stream(&c, None, "node-a", &["GPU-A1"])
        .await
        .expect("welcome");
    assert!(matches!(
        a.send(batch(1, t0, 2, &["GPU-A1"])).await,
        Msg::Ack(_)
    ));
    let mut absurd = batch(2, t0 + 2_000, 2, &["GPU-A1"]);
    absurd.seq = u64::MAX - 1;
    let answer = a.send(absurd).await;
    let (code, reason) = reject_code(&answer).expect("rejected");
    assert_eq!(code, pb::RejectCode::OutOfOrder);
    assert!(
        reason.contains("above 0, this node's highest stored seq"),
        "{reason}"
    );
    // A seq within reach of the agent's own numbering is fine.
    assert!(matches!(
        a.send(batch(5_000, t0 + 4_000, 2, &["GPU-A1"])).await,
        Msg::Ack(_)
    ));
    drop(a);
    let again = open_stream(&c, None, "node-a", &["GPU-A1"])
        .await
        .expect("welcome again");
    assert_eq!(again.welcome.last_acked_seq, 5_000);
    drop(again);
    c.stop().await;
}

#[tokio::test]
async fn a_second_agent_writing_other_samples_as_the_node_is_refused_and_counted() {
    let c = start_collector(ServeOptions::default()).await;
    let token = add_token(&c, "node-a").await;
    let t0 = now_ms() - 60_000;
    let mut first = open_stream(&c, Some(&token), "node-a", &["GPU-A1"])
        .await
        .expect("welcome");
    let original = batch(1, t0, 5, &["GPU-A1"]);
    assert!(matches!(first.send(original.clone()).await, Msg::Ack(_)));
    // A replay of the same batch (a lost ack) is acked again and changes nothing.
    assert!(matches!(first.send(original.clone()).await, Msg::Ack(_)));

    let mut second = open_stream(&c, Some(&token), "node-a", &["GPU-A1"])
        .await
        .expect("welcome");
    let mut other = batch(2, t0 + 2_000, 5, &["GPU-A1"]);
    for t in &mut other.ticks {
        t.gpus[0].power_mw = Some(42_000);
    }
    let answer = second.send(other).await;
    let (code, reason) = reject_code(&answer).expect("refused, not acked");
    assert_eq!(code, pb::RejectCode::Conflict);
    assert!(
        reason.contains("GPU-A1") && reason.contains("other values"),
        "{reason}"
    );
    if let Msg::Reject(r) = &answer {
        assert!(!r.retryable, "resending the same conflict cannot help");
    }

    let node = &c.store.nodes().await.expect("nodes")[0];
    assert_eq!(node.stored_samples, 5, "only the first agent's samples");
    assert_eq!(node.last_acked_seq, 1);
    let metrics = reqwest::get(format!("http://{}/metrics", c.http))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("body");
    assert!(
        metrics.contains("gpufleet_collector_batches_rejected_total{reason=\"conflict\"} 1"),
        "{metrics}"
    );
    drop((first, second));
    c.stop().await;
}
