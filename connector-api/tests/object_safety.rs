//! `TwoPhaseCommit` stays object safe: a sink can be boxed behind the trait (compile-time check, exercised once).

use connector_api::{CheckpointId, SinkId, TwoPhaseCommit};
use ratchet_conformance::reference::{ReferenceCommittable, ReferenceCommitter, ReferenceSystem};

type DynSink =
    Box<dyn TwoPhaseCommit<Committable = ReferenceCommittable, Committer = ReferenceCommitter>>;

#[tokio::test]
async fn a_sink_works_through_a_trait_object() {
    let system = ReferenceSystem::new();
    let sink_id = SinkId::new("boxed").unwrap();
    let mut sink: DynSink = Box::new(system.sink("object-safety", &sink_id));
    sink.recover(None).await.unwrap();
    sink.begin(CheckpointId(1)).await.unwrap();
    sink.write(&ratchet_conformance::conformance_batch(0..3))
        .await
        .unwrap();
    let committable = sink.pre_commit(CheckpointId(1)).await.unwrap();
    sink.commit(vec![committable.clone()]).await.unwrap();
    assert!(sink.is_committed(&committable).await.unwrap());
    assert_eq!(system.visible("object-safety", &sink_id), vec![0, 1, 2]);
}
