//! The shared PostgreSQL checkpoint store against the real server: records round-trip, a second worker cannot
//! overwrite a decision, retention prunes, a damaged newest row falls back to the previous one. Rows are checked
//! with psql.

use std::collections::BTreeMap;

use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, ErrorKind, PgCheckpointStore, SourceOffset,
};
use integration::Services;

fn record(id: u64) -> CheckpointRecord {
    CheckpointRecord {
        id: CheckpointId(id),
        positions: vec![SourceOffset {
            topic: "orders".into(),
            partition: 0,
            next_offset: id as i64 * 100,
        }],
        committables: BTreeMap::new(),
    }
}

#[tokio::test]
async fn shared_store_keeps_decisions_and_falls_back_from_damage() {
    let services = Services::get();
    let job = integration::unique_name("job");
    let worker_a = PgCheckpointStore::connect(services.pg_url(), &job, 3)
        .await
        .unwrap();
    let worker_b = PgCheckpointStore::connect(services.pg_url(), &job, 3)
        .await
        .unwrap();

    assert_eq!(worker_a.load_latest().await.unwrap(), None);
    for id in 1..=4 {
        worker_a.save(&record(id)).await.unwrap();
    }
    worker_a.save(&record(4)).await.unwrap(); // a retried save
    assert_eq!(worker_b.load_latest().await.unwrap(), Some(record(4)));

    let mut zombie = record(4);
    zombie.positions[0].next_offset = 1;
    let err = worker_b.save(&zombie).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");

    let ids = services.psql(&format!(
        "SELECT string_agg(id::text, ',' ORDER BY id) FROM ratchet_checkpoints WHERE job = '{job}'"
    ));
    assert_eq!(ids, "2,3,4", "retention keeps the newest 3");

    services.psql(&format!(
        "UPDATE ratchet_checkpoints SET record = substring(record from 1 for 20) WHERE job = '{job}' AND id = 4"
    ));
    assert_eq!(worker_b.load_latest().await.unwrap(), Some(record(3)));
}
