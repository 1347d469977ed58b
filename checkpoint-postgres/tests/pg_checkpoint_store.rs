//! The shared PostgreSQL checkpoint store against the real server: records round-trip, a second worker cannot
//! overwrite a decision, a newer claim fences the older one and waits for its recovery, the store reconnects after
//! its connections are killed, retention prunes, a damaged newest row falls back to the previous one. Grey
//! failures through Toxiproxy: a save against a silent server fails within the call limit and its connection is
//! never reused; an orphaned claim guard (its client gone silent, the server side left open) is ended by the
//! server after `guard_idle`, so the next claim gets through, and the orphan's claim check then reports it lapsed;
//! a guard whose session the server terminated fails its check. Rows and sessions are checked with psql.

use std::collections::BTreeMap;
use std::time::Duration;

use checkpoint_postgres::{PgCheckpointStore, PgStoreLimits};
use connector_api::{
    CheckpointId, CheckpointRecord, CheckpointStore, ErrorKind, SourceOffset, SubtaskId,
};
use test_support::Services;

fn record(id: u64) -> CheckpointRecord {
    CheckpointRecord {
        id: CheckpointId(id),
        positions: vec![SourceOffset::new("orders", 0, id as i64 * 100)],
        committables: BTreeMap::new(),
    }
}

/// A store for `job`, subtask 0, with the default limits.
async fn store(job: &str) -> PgCheckpointStore {
    store_at(Services::get().pg_url(), job, PgStoreLimits::default()).await
}

async fn store_at(url: &str, job: &str, limits: PgStoreLimits) -> PgCheckpointStore {
    PgCheckpointStore::connect(url, job, SubtaskId(0), 3, limits)
        .await
        .unwrap()
}

/// The store's sessions of `job` (pooled and claim guards) as `pg_stat_activity` shows them: their
/// `application_name` is `ratchet store <job>/<subtask>` or `ratchet guard <job>/<subtask> <host>:<pid>`.
fn sessions_of(job: &str) -> String {
    format!("a.application_name LIKE 'ratchet % {job}/%'")
}

/// Whether every connection of `job` is encrypted, and how many there are, as the server sees them
/// (`pg_stat_ssl`, read with psql).
fn encrypted_connections(job: &str) -> String {
    Services::get().psql(&format!(
        "SELECT bool_and(s.ssl)::text || ' ' || count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE {}",
        sessions_of(job)
    ))
}

#[tokio::test]
async fn sslmode_verify_full_encrypts_and_checks_the_server_and_disable_does_not_encrypt() {
    let services = Services::get();
    let (cert, key) = services.tls_client_identity();
    let ca = services.var("RATCHET_TLS_CA");
    let job = test_support::unique_name("tls-job");
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={ca}&sslcert={cert}&sslkey={key}",
        services.pg_url()
    );
    let tls = store_at(&url, &job, PgStoreLimits::default()).await;
    let claim = tls.claim().await.unwrap();
    tls.save(claim.epoch, &record(1)).await.unwrap();
    assert_eq!(tls.load().await.unwrap().record, Some(record(1)));
    // The pool's connections and the claim guard's: all TLS.
    let seen = encrypted_connections(&job);
    assert!(seen.starts_with("true ") && seen != "true 0", "{seen}");
    drop(claim);

    // The server's certificate is checked: without the test CA (system trust store only) verify-full refuses.
    let untrusted = format!("{}?sslmode=verify-full", services.pg_url());
    let err =
        PgCheckpointStore::connect(&untrusted, &job, SubtaskId(0), 3, PgStoreLimits::default())
            .await
            .err()
            .expect("a server certificate from an unknown CA must be refused");
    let report = connector_api::Report(&err).to_string();
    assert!(report.to_lowercase().contains("certificate"), "{report}");

    let plain_job = test_support::unique_name("plain-job");
    let plain = format!("{}?sslmode=disable", services.pg_url());
    let store = store_at(&plain, &plain_job, PgStoreLimits::default()).await;
    let _claim = store.claim().await.unwrap();
    assert!(encrypted_connections(&plain_job).starts_with("false "));
}

#[tokio::test]
async fn shared_store_keeps_decisions_and_falls_back_from_damage() {
    let services = Services::get();
    let job = test_support::unique_name("job");
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
    let job = test_support::unique_name("job");
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
    let job = test_support::unique_name("job");
    let store = store(&job).await;
    let owner = store.claim().await.unwrap().epoch;
    store.save(owner, &record(1)).await.unwrap();

    let killed = services.psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity a WHERE {}",
        sessions_of(&job)
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

/// Short limits for the grey-failure tests.
fn short_limits() -> PgStoreLimits {
    PgStoreLimits {
        call: Duration::from_secs(2),
        claim_round: Duration::from_secs(1),
        guard_idle: Duration::from_secs(3),
    }
}

#[tokio::test]
async fn a_save_against_a_silent_server_fails_in_doubt_in_time_and_its_connection_is_never_reused()
{
    let services = Services::get();
    let proxy = services
        .toxiproxy()
        .proxy("pg-save", services.pg_host_port())
        .await;
    let url = services
        .pg_url()
        .replace(services.pg_host_port(), proxy.address());
    let job = test_support::unique_name("silent-save");
    let store = store_at(&url, &job, short_limits()).await;
    let claim = store.claim().await.unwrap();
    drop(claim.guard);
    store.save(claim.epoch, &record(1)).await.unwrap();

    proxy.blackhole().await;
    let started = std::time::Instant::now();
    let err = store.save(claim.epoch, &record(2)).await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert!(err.to_string().contains("did not answer"), "{err}");
    // Bounded by the call limit (2 s), with slack for a loaded machine; without a limit it never returns.
    assert!(waited < Duration::from_secs(10), "the save took {waited:?}");

    // Healed, the next save goes through on a new connection: the hung one (its bytes dropped by the blackhole,
    // so it would never answer again) is not handed out again.
    proxy.heal().await;
    store.save(claim.epoch, &record(2)).await.unwrap();
    assert_eq!(
        services.psql(&format!(
            "SELECT max(id) FROM ratchet_checkpoint_records WHERE job = '{job}'"
        )),
        "2"
    );
    proxy.delete().await;
}

#[tokio::test]
async fn an_orphaned_claim_guard_is_ended_by_the_server_and_the_next_claim_gets_through() {
    let services = Services::get();
    let proxy = services
        .toxiproxy()
        .proxy("pg-guard", services.pg_host_port())
        .await;
    let url = services
        .pg_url()
        .replace(services.pg_host_port(), proxy.address());
    let job = test_support::unique_name("orphan");
    let orphan = store_at(&url, &job, short_limits()).await;
    let held = orphan.claim().await.unwrap();
    // The orphan's machine goes silent: its guard session stays open on the server, idle in its transaction,
    // holding the owner row's lock (with the server's default keepalive, for about two hours).
    proxy.blackhole().await;
    let started = std::time::Instant::now();
    let replacement = store_at(services.pg_url(), &job, short_limits()).await;
    let claimed = tokio::time::timeout(Duration::from_secs(60), replacement.claim())
        .await
        .expect("the claim still waits for the orphaned guard after 60 s")
        .unwrap();
    assert!(claimed.epoch > held.epoch);
    // It had to wait for the server to end the orphan (guard_idle = 3 s).
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the claim did not wait for the orphan's guard: {:?}",
        started.elapsed()
    );
    let orphans = services.psql(&format!(
        "SELECT count(*) FROM pg_stat_activity a WHERE {} AND a.application_name LIKE 'ratchet guard%' \
         AND a.state = 'idle in transaction'",
        sessions_of(&job)
    ));
    assert_eq!(orphans, "1", "only the new claim's guard holds the row");

    // The orphan's machine comes back: its claim check reports the lapse, so its recovery touches nothing.
    proxy.heal().await;
    let err = held.guard.check().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    assert!(err.to_string().contains("lapsed"), "{err}");
    claimed.guard.check().await.unwrap();
    proxy.delete().await;
}

#[tokio::test]
async fn a_claim_guard_whose_session_the_server_terminated_fails_its_check() {
    let services = Services::get();
    let job = test_support::unique_name("terminated-guard");
    let store = store(&job).await;
    let claim = store.claim().await.unwrap();
    claim.guard.check().await.unwrap();
    let killed = services.psql(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity a WHERE {} \
         AND a.application_name LIKE 'ratchet guard%'",
        sessions_of(&job)
    ));
    assert_eq!(killed, "1");
    let err = claim.guard.check().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    assert!(err.to_string().contains("guard session ended"), "{err}");
    // The store knows the epoch is still this claim's: nobody took over, only the guard is gone.
    assert_eq!(store.owner().await.unwrap(), Some(claim.epoch));
}
