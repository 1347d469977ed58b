//! The database restarts while a transaction of a durable checkpoint is prepared: the prepared transaction
//! survives the restart (checked by the independent verifier), and the next start commits it; nothing is lost,
//! nothing doubled, nothing prepared is left. Restarts the test servers through `scripts/services.sh`, so this
//! binary holds only this test (test binaries run one after another).

mod common;

use std::sync::Arc;

use common::{Db, read, short_name, xa_driver};
use connector_api::{CheckpointId, FaultPoint, SinkId, Step};
use ratchet_conformance::{conformance_batch as batch, conformance_positions};

fn sink_id() -> SinkId {
    SinkId::new("restarted").unwrap()
}

fn restart_server(service: &str) {
    let script = test_support::repo_root().join("scripts/services.sh");
    for action in ["down", "up"] {
        let status = std::process::Command::new(&script)
            .args([action, service])
            .status()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        assert!(
            status.success(),
            "{} {action} {service} failed",
            script.display()
        );
    }
}

async fn prepared_survives_a_server_restart(db: Db, service: &str) {
    let unique = test_support::unique_name("restart");
    let table = short_name("restart_", &[&unique, service]);
    let scope = short_name("r", &[&unique, service]);
    let state = tempfile::tempdir().unwrap();

    // Checkpoint 2 commits; checkpoint 3's record is durable, then the job stops before committing it.
    let (job, sink) = xa_driver(db, &sink_id(), 0, &table, &scope, state.path()).await;
    let mut job =
        job.with_fault_injector(Arc::new(|checkpoint: CheckpointId, point: &FaultPoint| {
            checkpoint.0 == 3 && point.step() == Step::AfterRecordDurable
        }));
    job.start().await.unwrap();
    job.write(sink, &batch(0..50)).await.unwrap();
    job.checkpoint(conformance_positions(50)).await.unwrap();
    job.write(sink, &batch(50..120)).await.unwrap();
    job.checkpoint(conformance_positions(120))
        .await
        .unwrap_err();
    drop(job);

    restart_server(service);
    let (ids, prepared) = read(db, &table, &[&scope]);
    assert_eq!(
        ids.len(),
        50,
        "{service}: only checkpoint 2 is visible before recovery"
    );
    assert_eq!(
        prepared.len(),
        1,
        "{service}: checkpoint 3's prepared transaction should survive the restart"
    );

    let (mut job, _) = xa_driver(db, &sink_id(), 0, &table, &scope, state.path()).await;
    let restored = job.start().await.unwrap();
    job.close().await.unwrap();
    assert_eq!(restored.positions[0].next_offset, 120);
    let (mut ids, prepared) = read(db, &table, &[&scope]);
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..120).collect::<Vec<_>>(),
        "{service}: rows after recovery"
    );
    assert!(
        prepared.is_empty(),
        "{service}: prepared left: {prepared:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_transactions_survive_database_restarts() {
    prepared_survives_a_server_restart(Db::Postgres, "postgres").await;
    prepared_survives_a_server_restart(Db::MariaDb, "mariadb").await;
}
