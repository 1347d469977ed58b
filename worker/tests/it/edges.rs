//! `ratchet run` at the edges of real operation, black-box through the binary, every sink read back by its
//! independent reader (pyarrow, a read_committed Kafka consumer, psql, pyiceberg and DuckDB): records removed by
//! retention before they were read (a partition never read starts at its log start; a saved position below the log
//! start stops the job naming it, or is skipped and counted with `on_gap = "earliest"`), and partitions added while
//! the job runs.

use crate::common;

use std::time::{Duration, Instant};

use common::{Job, free_port, scrape, total};

const IDLE: &str = "--exit-when-idle";

/// Runs the job until it is idle for 3 s, asserting a clean exit.
fn run_until_idle(job: &mut Job, env: &[(&str, &str)]) {
    let mut worker = job.spawn_worker_with_env(&[IDLE, "3s"], env);
    worker.wait_exit(Duration::from_secs(180));
}

#[tokio::test(flavor = "multi_thread")]
async fn records_arriving_on_a_partition_never_read_are_delivered_after_retention_removed_the_oldest()
 {
    let mut job = Job::new("unread", 2, 1, "3s").await;
    // Partition 1 is empty during the first run.
    job.produce_to(0, 20).await;
    run_until_idle(&mut job, &[]);
    // While the job is stopped, 50 records arrive on partition 1 and retention removes the oldest 10.
    job.produce_to(1, 50).await;
    job.delete_records_before(1, 10).await;
    run_until_idle(&mut job, &[]);
    let expected: Vec<i64> = (0..20).chain(30..70).collect();
    job.assert_holds(&expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_saved_position_below_the_log_start_stops_the_job_naming_it_or_is_skipped_and_counted() {
    let mut job = Job::new("gap", 1, 1, "3s").await;
    job.produce_to(0, 20).await;
    run_until_idle(&mut job, &[]);
    // Read up to offset 20; then 20 more arrive and retention removes offsets below 30 before the job reads them.
    job.produce_to(0, 20).await;
    job.delete_records_before(0, 30).await;

    let mut worker = job.spawn_worker(&[IDLE, "3s"]);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = worker.exited() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the job did not stop on the gap:\n{}",
            worker.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = worker.log_text();
    assert!(
        !status.success(),
        "the job exited cleanly over a gap:\n{log}"
    );
    assert!(
        log.contains(&job.topic)
            && log.contains("partition 0")
            && log.contains("20, is below the log start offset 30")
            && log.contains("on_gap"),
        "{log}"
    );
    // Stopped at once: a restart would meet the same gap.
    assert!(!log.contains("restarting it in"), "{log}");

    let port = free_port();
    let mut worker = job.spawn_worker_with_env(
        &["--metrics-listen", &format!("127.0.0.1:{port}")],
        &[("RATCHET__SOURCE__ON_GAP", "earliest")],
    );
    job.wait_copied(30, Duration::from_secs(90));
    let body = scrape(port).unwrap_or_default();
    assert_eq!(
        total(&body, "ratchet_source_gap_records_total"),
        10.0,
        "{body}"
    );
    worker.stop(Duration::from_secs(60));
    assert!(
        worker
            .log_text()
            .contains("records were removed from the log before the job read them"),
        "{}",
        worker.log_text()
    );
    let expected: Vec<i64> = (0..20).chain(30..40).collect();
    job.assert_holds(&expected);
}

/// `--exit-when-idle` reads the metadata again before it says the job is done: partitions added while the job
/// waited (with the default 30 s `metadata_refresh`, far longer than the idle time) are read first.
#[tokio::test(flavor = "multi_thread")]
async fn exit_when_idle_finds_partitions_added_while_it_waited() {
    let mut job = Job::new("idlegrow", 1, 2, "3s").await;
    job.produce_to(0, 10).await;
    // Idle for 15 s (far less than the default 30 s metadata refresh, far more than adding partitions takes): the
    // partitions come while it waits.
    let mut worker = job.spawn_worker(&["--exit-when-idle", "15s"]);
    job.wait_delivered(Duration::from_secs(90));
    job.add_partitions(3).await;
    for partition in 1..3 {
        job.produce_to(partition, 10).await;
    }
    worker.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn partitions_added_while_the_job_runs_are_read_from_their_beginning() {
    let mut job = Job::new("grow", 1, 2, "3s").await;
    job.produce_to(0, 10).await;
    let port = free_port();
    let mut worker = job.spawn_worker_with_env(
        &["--metrics-listen", &format!("127.0.0.1:{port}")],
        &[("RATCHET__SOURCE__METADATA_REFRESH", "1s")],
    );
    job.wait_delivered(Duration::from_secs(90));
    job.add_partitions(4).await;
    for partition in 1..4 {
        job.produce_to(partition, 10).await;
    }
    job.wait_delivered(Duration::from_secs(90));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = scrape(port).unwrap_or_default();
        if total(&body, "ratchet_source_partitions") == 4.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics do not show the 4 partitions:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    worker.stop(Duration::from_secs(60));
    job.assert_exactly_once();
}
