//! Against the real PostgreSQL server, checked with psql: prepared rows are invisible until COMMIT PREPARED from
//! another session; commit is idempotent; a rolled-back transaction is reported, never taken for committed.

use connector_api::{CheckpointId, ErrorKind, SinkId, SubtaskId};
use integration::Services;
use jdbc_sink::{CommitOutcome, PgPreparedTransactions, Xid};

#[tokio::test]
async fn prepared_rows_become_visible_only_at_commit_from_another_session() {
    let services = Services::get();
    let table = integration::unique_name("jdbc_prepared").replace('-', "_");
    services.psql(&format!("CREATE TABLE {table} (id bigint PRIMARY KEY)"));
    let sink = SinkId::new(integration::unique_name("pg")).unwrap();
    let xid = Xid {
        sink: sink.clone(),
        subtask: SubtaskId(0),
        checkpoint: CheckpointId(1),
    };

    let writer = PgPreparedTransactions::connect(services.pg_url())
        .await
        .unwrap();
    writer.begin(&xid).await.unwrap();
    writer
        .client()
        .execute(
            &format!("INSERT INTO {table} SELECT generate_series(1, 100)"),
            &[],
        )
        .await
        .unwrap();
    writer.prepare(&xid).await.unwrap();
    drop(writer); // the writing session ends: the prepared transaction lives on in the server

    assert_eq!(services.psql(&format!("SELECT count(*) FROM {table}")), "0");
    let committer = PgPreparedTransactions::connect(services.pg_url())
        .await
        .unwrap();
    assert_eq!(
        committer.list_prepared(&sink, SubtaskId(0)).await.unwrap(),
        vec![xid.clone()]
    );
    assert!(!committer.is_committed(&xid).await.unwrap());

    assert_eq!(
        committer.commit_prepared(&xid).await.unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        committer.commit_prepared(&xid).await.unwrap(),
        CommitOutcome::AlreadyCommitted
    );
    assert_eq!(
        services.psql(&format!("SELECT count(*) FROM {table}")),
        "100"
    );
    assert!(
        committer
            .list_prepared(&sink, SubtaskId(0))
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn committing_a_rolled_back_transaction_is_a_loud_error() {
    let services = Services::get();
    let table = integration::unique_name("jdbc_rolled_back").replace('-', "_");
    services.psql(&format!("CREATE TABLE {table} (id bigint)"));
    let xid = Xid {
        sink: SinkId::new(integration::unique_name("pg")).unwrap(),
        subtask: SubtaskId(1),
        checkpoint: CheckpointId(7),
    };
    let pg = PgPreparedTransactions::connect(services.pg_url())
        .await
        .unwrap();
    pg.begin(&xid).await.unwrap();
    pg.client()
        .execute(&format!("INSERT INTO {table} VALUES (1)"), &[])
        .await
        .unwrap();
    pg.prepare(&xid).await.unwrap();
    pg.rollback_prepared(&xid).await.unwrap();
    pg.rollback_prepared(&xid).await.unwrap(); // idempotent

    let err = pg.commit_prepared(&xid).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fatal);
    let message = err.to_string();
    assert!(
        message.contains("at checkpoint 7") && message.contains("never committed"),
        "{message}"
    );
    assert_eq!(services.psql(&format!("SELECT count(*) FROM {table}")), "0");
}
