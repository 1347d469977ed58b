//! A checkpoint the store notes committed stays recognisable as committed after the next recovery. The driver
//! restores nothing of such a checkpoint (its transaction is done), so the sink's recovery sees no restored
//! checkpoint; it used to delete every commit marker of the subtask then, as on a fresh start, and a later
//! question about that checkpoint (a zombie's commit retry, a takeover, `inspect`) found its transaction neither
//! prepared nor marked: "lost" for rows that are in the table. Seen in the conformance harness when the crashed
//! driver's note "committed" reached the store after the harness had inspected it.

use crate::common;

use common::{Db, cli, read, short_name, xa_driver};
use connector_api::{
    CheckpointStore, Committer, LocalCheckpointStore, SinkId, TwoPhaseCommit, committables_in,
};
use jdbc_sink::{JdbcSink, WriteMode};
use ratchet_conformance::{conformance_batch as batch, conformance_positions};

fn sink_id() -> SinkId {
    SinkId::new("markers").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_noted_committed_is_still_known_committed_after_a_restart() {
    for db in [Db::Postgres, Db::MariaDb] {
        check(db).await;
    }
}

async fn check(db: Db) {
    let unique = test_support::unique_name("markers");
    let table = short_name("markers_", &[&unique]);
    let scope = short_name("m", &[&unique]);
    let state = tempfile::tempdir().unwrap();

    let (mut job, sink) = xa_driver(db, &sink_id(), 0, &table, &scope, state.path()).await;
    job.start().await.unwrap();
    job.write(sink, &batch(0..50)).await.unwrap();
    let decided = job.checkpoint(conformance_positions(50)).await.unwrap();
    job.finish_commit().await.unwrap();
    drop(job);
    let loaded = LocalCheckpointStore::open(state.path(), 3)
        .unwrap()
        .load()
        .await
        .unwrap();
    let record = loaded.record.expect("the decided checkpoint's record");
    assert_eq!(record.id, decided);
    assert!(
        loaded.committed_through >= Some(decided),
        "{db:?}: the store should note checkpoint {decided} committed"
    );

    // The restart: the store notes the checkpoint committed, so the sink's recovery is handed nothing.
    let (mut job, _) = xa_driver(db, &sink_id(), 0, &table, &scope, state.path()).await;
    job.start().await.unwrap();
    job.close().await.unwrap();

    let markers = cli(
        db,
        &format!(
            "SELECT checkpoint FROM ratchet_xa_commits WHERE sink = '{scope}' AND subtask = 0 AND checkpoint = {}",
            decided.0
        ),
    );
    assert_eq!(
        markers,
        decided.0.to_string(),
        "{db:?}: the commit marker of checkpoint {decided} after the restart"
    );
    // Asked about it again, as a zombie's commit retry or a takeover would: committed, not lost.
    let mut probe = JdbcSink::new(common::config(
        db,
        &sink_id(),
        0,
        &table,
        &scope,
        WriteMode::Xa,
    ))
    .await
    .unwrap();
    let committables = committables_in(&probe, &record)
        .unwrap()
        .expect("the sink's entry");
    let plan = probe
        .plan_recovery(Some((decided, committables.clone())))
        .await
        .unwrap()
        .summary();
    assert_eq!(
        (plan.commits, plan.already_committed),
        (0, 1),
        "{db:?}: the plan for checkpoint {decided} after the restart"
    );
    probe
        .committer()
        .commit(committables)
        .await
        .unwrap_or_else(|e| panic!("{db:?}: committing checkpoint {decided} again: {e}"));
    let (mut ids, prepared) = read(db, &table, &[&scope]);
    ids.sort_unstable();
    assert_eq!(ids, (0..50).collect::<Vec<_>>(), "{db:?}: rows");
    assert!(prepared.is_empty(), "{db:?}: prepared left: {prepared:?}");
}
