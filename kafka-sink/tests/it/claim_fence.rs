//! The claim is the fence, against the real broker and the PostgreSQL checkpoint store: an instance paused while
//! recovering, whose claim guard's session the server terminated (a PostgreSQL restart, a failover,
//! `pg_terminate_backend`), must not touch anything when it resumes. Meanwhile a second instance claimed the
//! subtask and decided a checkpoint whose Kafka transaction is pre-committed, waiting for its commit: the first
//! one's recovery would fence the transactional ids (`init_transactions` aborts the open transaction), losing the
//! decided checkpoint. Checked with the independent read_committed verifier: every record of the decided
//! checkpoint once, and no transaction left open.

use std::sync::Arc;
use std::time::Duration;

use checkpoint_postgres::{PgCheckpointStore, PgStoreLimits};
use connector_api::{Driver, DriverConfig, ErrorKind, SinkId, SourceOffset, Step, SubtaskId};
use kafka_sink::{KafkaSink, KafkaSinkConfig};
use ratchet_conformance::conformance_batch;
use test_support::Services;
use test_support::pause::PauseAt;

const ROWS: i64 = 100;

async fn instance(job: &str, topic: &str, pause: Arc<PauseAt>) -> Driver<PgCheckpointStore> {
    let store = PgCheckpointStore::connect(
        Services::get().pg_url(),
        job,
        SubtaskId(0),
        3,
        PgStoreLimits::default(),
    )
    .await
    .unwrap();
    let mut driver = Driver::new(store, DriverConfig::default()).with_fault_injector(pause);
    let config = KafkaSinkConfig::new(Services::get().kafka_bootstrap(), topic, topic);
    let sink = KafkaSink::new(config, SinkId::new("kafka").unwrap(), SubtaskId(0)).unwrap();
    driver.add_sink(sink).unwrap();
    driver
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_whose_claim_lapsed_touches_nothing_of_the_next_owners_decided_checkpoint() {
    let services = Services::get();
    let job = test_support::unique_name("claim-fence");
    let topic = test_support::unique_name("claim-fence");

    // The first instance claims the subtask and pauses before recovering its sinks.
    let first_pause = PauseAt::new(Step::AfterLoad);
    let mut first = instance(&job, &topic, first_pause.clone()).await;
    let first_run = tokio::spawn(async move { first.start().await.map(|_| ()) });
    first_pause.reached().await;

    // Its guard's session is ended by the server.
    let killed = services.psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name LIKE 'ratchet guard {job}/0 %'"
    ));
    assert_eq!(killed, "1", "the first instance's claim guard session");

    // A second instance claims, recovers, and decides a checkpoint; it pauses before committing it, its Kafka
    // transaction pre-committed and open.
    let second_pause = PauseAt::new(Step::AfterRecordDurable);
    let mut second = instance(&job, &topic, second_pause.clone()).await;
    let handle = second.handle_of(&SinkId::new("kafka").unwrap()).unwrap();
    tokio::time::timeout(Duration::from_secs(60), second.start())
        .await
        .expect("the second claim waits for nothing: the first guard is gone")
        .unwrap();
    second
        .write(handle, &conformance_batch(0..ROWS))
        .await
        .unwrap();
    let decided = tokio::spawn(async move {
        let id = second
            .checkpoint(vec![SourceOffset::new("source", 0, ROWS)])
            .await?;
        second.close().await.map(|()| id)
    });
    second_pause.reached().await;

    // The first instance resumes: its claim lapsed, so its recovery stops before fencing anything.
    first_pause.resume();
    let err = tokio::time::timeout(Duration::from_secs(60), first_run)
        .await
        .expect("the first instance's recovery returns")
        .unwrap()
        .expect_err("a recovery whose claim lapsed must not run");
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    assert!(
        connector_api::Report(&err).to_string().contains("lapsed"),
        "{}",
        connector_api::Report(&err)
    );

    // The second instance commits its decided checkpoint.
    second_pause.resume();
    decided
        .await
        .unwrap()
        .expect("the decided checkpoint commits: nobody fenced its transaction");

    let (ids, partitions) = services.kafka_ids(services.kafka_bootstrap(), &topic);
    assert_eq!(
        ids,
        (0..ROWS).collect::<Vec<_>>(),
        "every decided record once"
    );
    for (partition, offsets) in partitions.as_object().unwrap() {
        assert_eq!(
            offsets["lso"], offsets["high_watermark"],
            "partition {partition} is held by an open transaction"
        );
    }
}
