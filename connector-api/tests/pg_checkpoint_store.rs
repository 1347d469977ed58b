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
        positions: vec![SourceOffset::new("orders", 0, id as i64 * 100)],
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

/// Whether every connection of `job` (by `application_name`) is encrypted, and how many there are, as the server
/// sees them (`pg_stat_ssl`, read with psql).
fn encrypted_connections(job: &str) -> String {
    Services::get().psql(&format!(
        "SELECT bool_and(s.ssl)::text || ' ' || count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = '{job}'"
    ))
}

#[tokio::test]
async fn sslmode_verify_full_encrypts_and_checks_the_server_and_disable_does_not_encrypt() {
    let services = Services::get();
    let (cert, key) = services.tls_client_identity();
    let ca = services.var("RATCHET_TLS_CA");
    let job = integration::unique_name("tls-job");
    let url = format!(
        "{}?application_name={job}&sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}",
        services.pg_url()
    );
    let tls = PgCheckpointStore::connect(&url, &job, SubtaskId(0), 3)
        .await
        .unwrap();
    let claim = tls.claim().await.unwrap();
    tls.save(claim.epoch, &record(1)).await.unwrap();
    assert_eq!(tls.load().await.unwrap().record, Some(record(1)));
    // The pool's connections and the claim guard's: all TLS.
    let seen = encrypted_connections(&job);
    assert!(seen.starts_with("true ") && seen != "true 0", "{seen}");
    drop(claim);

    // The server's certificate is checked: without the test CA (system trust store only) verify-full refuses.
    let untrusted = format!("{}?sslmode=verify-full", services.pg_url());
    let err = PgCheckpointStore::connect(&untrusted, &job, SubtaskId(0), 3)
        .await
        .err()
        .expect("a server certificate from an unknown CA must be refused");
    let report = connector_api::Report(&err).to_string();
    assert!(report.to_lowercase().contains("certificate"), "{report}");

    let plain_job = integration::unique_name("plain-job");
    let plain = format!(
        "{}?application_name={plain_job}&sslmode=disable",
        services.pg_url()
    );
    let store = PgCheckpointStore::connect(&plain, &plain_job, SubtaskId(0), 3)
        .await
        .unwrap();
    let _claim = store.claim().await.unwrap();
    assert!(encrypted_connections(&plain_job).starts_with("false "));
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
