//! Grey failures through the `ratchet` binary, every sink read back by its independent verifier:
//!
//! - a process that goes silent while holding a subtask's claim guard (the pause drill stops it with SIGSTOP after
//!   its claim: its connections stay open and its kernel answers TCP keepalives, so the server sees an "idle in
//!   transaction" session holding the owner row's lock, as it would for a machine that lost its network). Another
//!   process takes the subtask over within `lease + lease / 5 + max_recovery_time` plus recovery: its claim waits,
//!   naming the holder, until the server ends the orphan (`idle_in_transaction_session_timeout`), and the wait is
//!   not counted as a failure;
//! - the checkpoint store blackholed (Toxiproxy: bytes vanish, nothing is closed) for longer than the lease while
//!   checkpoints are being saved, then healed: every call fails within `max_call_time`, hung connections are
//!   dropped, and the job goes on; blackholed again, a SIGTERM still ends the process within a bound, and the next
//!   run delivers the rest. Every record exactly once in every sink;
//! - S3 (the file sink) and the Iceberg catalog (a SQL catalog on PostgreSQL) slow (latency on both links), with
//!   a Kafka sink in the same job: the budget holds (check-config says so, every commit finishes, no restart),
//!   every record once; and a lease long enough that the take-over of a silent process could outlast the Kafka
//!   transaction timeout is refused at start-up, naming the term;
//! - one of two processes cut off from the store (its link blackholed): it stops its subtasks by its own clock
//!   once its lease lapses (within the lease plus one call bound), without waiting out the store's retries, while
//!   the other takes them over; healed, the two share the job again. Every record exactly once.

mod common;

use std::time::{Duration, Instant};

use common::Job;
use test_support::Services;

/// The job's lease; the renewal period is a fifth of it.
const LEASE: Duration = Duration::from_secs(3);
/// `[job] max_recovery_time`: also how long the server keeps an orphaned claim guard.
const GUARD_IDLE: Duration = Duration::from_secs(8);

/// Waits until `what` holds, polling every 200 ms, at most `within`.
fn wait_until(what: &str, within: Duration, mut holds: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !holds() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_gone_silent_holding_the_claim_is_taken_over_within_the_bound() {
    let services = Services::get();
    let mut job = Job::new("orphan", 2, 1, "3s").await;
    job.edit_config(
        "lease = \"3s\"",
        // Claim rounds of 2 s (max_call_time): the successor logs who holds the claim while it waits.
        "lease = \"3s\"\nmax_call_time = \"2s\"\nmax_recovery_time = \"8s\"",
    );
    job.produce(300).await;
    let mut silent = job.spawn_worker_with_env(&[], &[("RATCHET_PAUSE_AT", "after-load")]);
    let guard = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'ratchet guard {}/0 %' \
         AND state = 'idle in transaction'",
        job.name
    );
    wait_until(
        "the paused process holds the claim guard",
        Duration::from_secs(60),
        || {
            services.psql(&guard) == "1"
                && silent
                    .log_text()
                    .contains("stopping this process (SIGSTOP)")
        },
    );
    let went_silent = Instant::now();

    let mut successor = job.spawn_worker(&[]);
    job.wait_delivered(Duration::from_secs(90));
    let took = went_silent.elapsed();
    // Lease expiry + one renewal period + the orphaned guard's idle limit + claim rounds and recovery.
    let bound = LEASE + LEASE / 5 + GUARD_IDLE + Duration::from_secs(30);
    assert!(
        took < bound,
        "the subtask of the silent process ran again after {took:?} (bound {bound:?})"
    );
    let log = successor.log_text();
    assert!(
        log.contains("another session holds this subtask's claim") && log.contains("ratchet guard"),
        "the waiting claim did not name the holder:\n{log}"
    );
    assert!(
        !log.contains("subtask failed; restarting"),
        "waiting for the claim counted as a failure:\n{log}"
    );

    silent.kill9();
    job.produce(300).await;
    job.wait_delivered(Duration::from_secs(60));
    successor.stop(Duration::from_secs(60));
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_cut_off_from_the_store_stops_its_subtasks_when_its_lease_lapses_by_its_clock() {
    let services = Services::get();
    let proxy = services
        .toxiproxy()
        .proxy("store-cut", services.pg_host_port())
        .await;
    let mut job = Job::new("lapsed", 4, 2, "3s").await;
    job.edit_config("lease = \"3s\"", "lease = \"3s\"\nmax_call_time = \"2s\"");
    let proxied = services
        .pg_url()
        .replace(services.pg_host_port(), proxy.address());
    // Only this process reaches the store through the proxy (its sinks reach PostgreSQL directly).
    let mut cut = job.spawn_worker_with_env(&[], &[("RATCHET__STORE__URL", proxied.as_str())]);
    let mut other = job.spawn_worker(&[]);
    job.wait_spread(2, 2, Duration::from_secs(60));
    job.produce(400).await;
    job.wait_delivered(Duration::from_secs(60));

    job.produce(400).await;
    proxy.blackhole().await;
    let blackholed = Instant::now();
    // Its lease lapses `LEASE` after its last renewal; a renewal under way ends within its call bound (lease / 2).
    cut.wait_logged("membership lapsed by its own clock", 1, LEASE * 3);
    let took = blackholed.elapsed();
    let bound = LEASE + LEASE / 2 + LEASE / 5;
    assert!(
        took <= bound + Duration::from_secs(2),
        "the cut-off process stopped its subtasks {took:?} after the blackhole (bound {bound:?})"
    );
    job.wait_spread(2, 1, Duration::from_secs(60));
    job.wait_delivered(Duration::from_secs(120));

    proxy.heal().await;
    job.wait_spread(2, 2, Duration::from_secs(60));
    job.produce(400).await;
    job.wait_delivered(Duration::from_secs(60));
    cut.stop(Duration::from_secs(60));
    other.stop(Duration::from_secs(60));
    job.assert_exactly_once();
    proxy.delete().await;
    println!("the cut-off process stopped its subtasks {took:?} after the blackhole");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_blackholed_past_the_lease_during_saves_then_healed_loses_and_doubles_nothing() {
    let services = Services::get();
    let proxy = services
        .toxiproxy()
        .proxy("store", services.pg_host_port())
        .await;
    let mut job = Job::new("blackhole", 2, 1, "3s").await;
    job.store_through(proxy.address());
    job.edit_config("lease = \"3s\"", "lease = \"3s\"\nmax_call_time = \"2s\"");
    let mut worker = job.spawn_worker(&[]);
    job.produce(300).await;
    job.wait_delivered(Duration::from_secs(60));

    // Checkpoints every 500 ms: the blackhole lands on saves, lease renewals and the commit marks.
    job.produce(300).await;
    proxy.blackhole().await;
    job.produce(300).await;
    tokio::time::sleep(LEASE * 3).await;
    proxy.heal().await;
    job.produce(300).await;
    job.wait_delivered(Duration::from_secs(120));
    assert!(
        worker.exited().is_none(),
        "the worker gave up on a store that came back:\n{}",
        worker.log_text()
    );
    assert!(
        worker.log_text().contains("did not answer within"),
        "no call ran into its limit:\n{}",
        worker.log_text()
    );

    // Blackholed again, a SIGTERM still ends the process (its last checkpoint cannot be saved: the next run
    // replays it).
    job.produce(300).await;
    proxy.blackhole().await;
    worker.signal(nix::sys::signal::Signal::SIGTERM);
    let stopping = Instant::now();
    wait_until(
        "the worker exits after SIGTERM with its store blackholed",
        Duration::from_secs(120),
        || worker.exited().is_some(),
    );
    let took = stopping.elapsed();
    worker.child = None;
    proxy.heal().await;

    let mut next = job.spawn_worker(&[]);
    job.produce(300).await;
    job.wait_delivered(Duration::from_secs(120));
    next.stop(Duration::from_secs(60));
    job.assert_exactly_once();
    proxy.delete().await;
    println!("stopped {took:?} after SIGTERM with the store blackholed");
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_s3_and_a_slow_catalog_stay_within_the_budget_and_a_budget_that_cannot_is_refused() {
    let services = Services::get();
    let toxiproxy = services.toxiproxy();
    let s3_server = services
        .s3()
        .endpoint
        .trim_start_matches("http://")
        .to_string();
    let s3 = toxiproxy.proxy("slow-s3", &s3_server).await;
    let pg = toxiproxy
        .proxy("slow-catalog", services.pg_host_port())
        .await;
    let mut job = Job::new("slow", 2, 1, "3s").await;
    job.archive_on_s3(s3.address());
    // The Iceberg catalog, the JDBC sink and the store all reach PostgreSQL through the slow link.
    let text = std::fs::read_to_string(&job.config).unwrap();
    std::fs::write(
        &job.config,
        text.replace(services.pg_host_port(), pg.address()),
    )
    .unwrap();
    s3.latency(150, 50).await;
    pg.latency(40, 10).await;

    let checked = job.ratchet("check-config");
    let said = String::from_utf8_lossy(&checked.stdout).to_string();
    assert!(
        checked.status.success() && said.contains("in all"),
        "check-config: {said}\n{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let mut worker = job.spawn_worker(&[]);
    for _ in 0..3 {
        job.produce(300).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    job.wait_delivered(Duration::from_secs(180));
    worker.stop(Duration::from_secs(120));
    let log = worker.log_text();
    assert!(
        !log.contains("subtask failed"),
        "a slow link made a subtask fail:\n{log}"
    );
    s3.heal().await;
    pg.heal().await;
    job.assert_exactly_once();

    // A lease of 10 minutes: the take-over of a silent process (12 min + the orphaned guard) outlasts the Kafka
    // sink's 10 min transaction timeout. Refused before anything runs.
    job.edit_config("lease = \"3s\"", "lease = \"10m\"");
    let checked = job.ratchet("check-config");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(!checked.status.success(), "{said}");
    assert!(
        said.contains("take-over") && said.contains("sink copy"),
        "{said}"
    );
    s3.delete().await;
    pg.delete().await;
}
