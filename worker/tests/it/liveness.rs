//! Liveness is one question, asked in every mode: `resolve`, `rescale` and a `run` with a changed subtask count
//! refuse while any process of the job runs, whatever its membership (static members, the Kafka group, leases on
//! the PostgreSQL store; the local store's lock), naming the processes and their modes. The running processes are
//! left alone (none is fenced), and every record lands once.

use crate::common;

use std::time::Duration;

use common::{Job, Worker};

fn said(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs every layout-changing operation against the running `workers` and checks each is refused naming
/// `expected` (the processes' mode, or the local lock); then the workers go on and deliver everything once.
async fn every_change_is_refused(mut job: Job, mut workers: Vec<Worker>, expected: &str) {
    job.produce(300).await;
    job.wait_delivered(Duration::from_secs(120));
    for command in [vec!["resolve"], vec!["rescale", "--to", "3"]] {
        let out = job.ratchet_with(&command);
        assert!(
            !out.status.success() && said(&out).contains(expected),
            "{command:?} against running processes:\n{}",
            said(&out)
        );
    }
    // A process started with another count (an older job file) does not rescale the running job.
    job.edit_config("subtasks = 2", "subtasks = 3");
    let mut older = job.spawn_worker(&[]);
    let log = older.wait_failed(Duration::from_secs(60));
    assert!(log.contains(expected), "{log}");
    job.edit_config("subtasks = 3", "subtasks = 2");

    job.produce(300).await;
    job.wait_delivered(Duration::from_secs(120));
    for worker in &mut workers {
        let log = worker.log_text();
        assert!(
            !log.contains("claimed by another process") && !log.contains("another process took"),
            "a running process was fenced:\n{log}"
        );
        worker.stop(Duration::from_secs(60));
    }
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn layout_changes_refuse_while_static_members_run() {
    let mut job = Job::new("live_static", 4, 2, "3s").await;
    let workers = vec![
        job.spawn_worker(&["--member", "0", "--of", "2"]),
        job.spawn_worker(&["--member", "1", "--of", "2"]),
    ];
    every_change_is_refused(job, workers, "(static member 1 of 2)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn layout_changes_refuse_while_kafka_group_members_run() {
    let mut job = Job::new("live_group", 4, 2, "6s").await;
    job.edit_config(
        "lease = \"6s\"",
        "lease = \"6s\"\nmembership = \"kafka-group\"",
    );
    let workers = vec![
        job.spawn_worker(&["--member", "a"]),
        job.spawn_worker(&["--member", "b"]),
    ];
    every_change_is_refused(job, workers, "(kafka group)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn layout_changes_refuse_while_lease_members_run() {
    let mut job = Job::new("live_leases", 4, 2, "3s").await;
    let workers = vec![job.spawn_worker(&[]), job.spawn_worker(&[])];
    every_change_is_refused(job, workers, "(leases)").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn layout_changes_refuse_while_a_worker_runs_on_the_local_store() {
    let mut job = Job::new("live_local", 4, 2, "3s").await;
    job.store_locally();
    let workers = vec![job.spawn_worker(&[])];
    every_change_is_refused(job, workers, "another ratchet process runs job").await;
}
