//! The shared PostgreSQL checkpoint store against the real server: records round-trip, a second worker cannot
//! overwrite a decision, a newer claim fences the older one and waits for its recovery, the store reconnects after
//! its connections are killed, retention prunes, a damaged newest row falls back to the previous one. Rows are
//! checked with psql.

use std::collections::BTreeMap;
use std::time::Duration;

use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, ErrorKind, PgCheckpointStore, SourceOffset,
    SubtaskId,
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

/// A store for `job`, subtask 0, whose connections carry `application_name` = `job` (to find them in psql).
async fn store(job: &str) -> PgCheckpointStore {
    let url = format!("{}?application_name={job}", Services::get().pg_url());
    PgCheckpointStore::connect(&url, job, SubtaskId(0), 3)
        .await
        .unwrap()
}

#[tokio::test]
async fn shared_store_keeps_decisions_and_falls_back_from_damage() {
    let services = Services::get();
    let job = integration::unique_name("job");
    let worker_a = store(&job).await;
    let worker_b = store(&job).await;

    let owner = worker_a.claim().await.unwrap().epoch;
    assert_eq!(worker_a.load().await.unwrap().record, None);
    for id in 1..=4 {
        worker_a.save(owner, &record(id)).await.unwrap();
    }
    worker_a.save(owner, &record(4)).await.unwrap(); // a retried save
    assert_eq!(worker_b.load().await.unwrap().record, Some(record(4)));

    let mut other = record(4);
    other.positions[0].next_offset = 1;
    let err = worker_a.save(owner, &other).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");

    let ids = services.psql(&format!(
        "SELECT string_agg(id::text, ',' ORDER BY id) FROM ratchet_checkpoint_records WHERE job = '{job}'"
    ));
    assert_eq!(ids, "2,3,4", "retention keeps the newest 3");

    services.psql(&format!(
        "UPDATE ratchet_checkpoint_records SET record = substring(record from 1 for 20) \
         WHERE job = '{job}' AND id = 4"
    ));
    let loaded = worker_b.load().await.unwrap();
    assert_eq!(loaded.record, Some(record(3)));
    assert_eq!(loaded.highest_id, Some(CheckpointId(4)));
}

#[tokio::test]
async fn a_newer_claim_fences_the_older_one_and_waits_for_its_recovery() {
    let services = Services::get();
    let job = integration::unique_name("job");
    let zombie = store(&job).await;
    let replacement = store(&job).await;

    let old = zombie.claim().await.unwrap();
    zombie.save(old.epoch, &record(1)).await.unwrap();

    // While the old claim's guard is held (it is recovering), the new claim waits.
    let claiming = tokio::spawn(async move {
        let claim = replacement.claim().await.unwrap();
        (replacement, claim)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !claiming.is_finished(),
        "a claim overtook a recovery in progress"
    );
    drop(old.guard);
    let (replacement, new) = claiming.await.unwrap();
    assert!(new.epoch > old.epoch);
    drop(new.guard);

    let err = zombie.save(old.epoch, &record(2)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    let err = zombie
        .mark_committed(old.epoch, CheckpointId(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    replacement.save(new.epoch, &record(2)).await.unwrap();
    replacement
        .mark_committed(new.epoch, CheckpointId(2))
        .await
        .unwrap();
    let loaded = zombie.load().await.unwrap();
    assert_eq!(loaded.record, Some(record(2)));
    assert_eq!(loaded.committed_through, Some(CheckpointId(2)));
    let owner_rows = services.psql(&format!(
        "SELECT epoch || ':' || committed_through FROM ratchet_checkpoint_owners WHERE job = '{job}'"
    ));
    assert_eq!(owner_rows, format!("{}:2", new.epoch));
}

#[tokio::test]
async fn the_store_reconnects_after_its_connections_are_killed() {
    let services = Services::get();
    let job = integration::unique_name("job");
    let store = store(&job).await;
    let owner = store.claim().await.unwrap().epoch;
    store.save(owner, &record(1)).await.unwrap();

    let killed = services.psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{job}'"
    ));
    assert_ne!(killed, "0", "no connection of the store was found to kill");

    // At most one attempt sees the dead connection; it is never reported as a decision failure.
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        match store.save(owner, &record(2)).await {
            Ok(()) => break,
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::Retryable | ErrorKind::InDoubt),
                    "{e}"
                );
                outcomes.push(e.to_string());
            }
        }
    }
    assert!(outcomes.len() <= 1, "{outcomes:?}");
    assert_eq!(store.load().await.unwrap().record, Some(record(2)));
}
