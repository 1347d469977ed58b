//! Changing a job file between runs never drops a decided checkpoint, black-box through the `ratchet` binary and
//! read back by the independent readers: the Iceberg sink's `commit_every` lowered (and its delivery switched to
//! at-least-once) while the last record carries files not yet in the table; a sink removed while the store's last
//! checkpoint holds work not yet committed in it is refused at start, naming it, until `ratchet resolve` (with the
//! sink put back) finished it.

use crate::common;

use std::time::{Duration, Instant};

use common::Job;

/// The ids pyiceberg reads in the job's Iceberg table (files carried for a later snapshot are in none yet).
fn lake_ids(job: &Job) -> Vec<i64> {
    let services = test_support::Services::get();
    let seen = services.verify(
        "iceberg_table.py",
        &[
            "ratchet",
            &services
                .pg_url()
                .replacen("postgres://", "postgresql+psycopg://", 1),
            &format!("file://{}", job.dir.path().join("warehouse").display()),
            &format!("{}.orders", job.name),
            "id",
        ],
    );
    common::sorted_ids(&seen["ids"])
}

/// Runs the job until it is idle for 3 s, asserting a clean exit.
fn run_until_idle(job: &mut Job) {
    job.spawn_worker(&["--exit-when-idle", "3s"])
        .wait_exit(Duration::from_secs(180));
}

#[tokio::test(flavor = "multi_thread")]
async fn lowering_commit_every_or_weakening_delivery_keeps_the_files_a_record_carries() {
    let mut job = Job::new("commit-every", 1, 1, "3s").await;
    let lake = "create_table = true\n";
    let table_line = format!("table = \"{}.orders\"\n", job.name);
    job.edit_config(
        &format!("{table_line}{lake}"),
        &format!("{table_line}{lake}commit_every = 100\n"),
    );
    job.produce(100).await;
    run_until_idle(&mut job);
    // One checkpoint of data: carried for a later snapshot, in the store's last record only.
    assert!(
        lake_ids(&job).len() < 100,
        "nothing was carried: the test means nothing"
    );

    job.edit_config("commit_every = 100\n", "commit_every = 1\n");
    run_until_idle(&mut job);
    job.assert_exactly_once();

    job.edit_config("commit_every = 1\n", "commit_every = 100\n");
    job.produce(100).await;
    run_until_idle(&mut job);
    assert!(
        lake_ids(&job).len() < 200,
        "nothing was carried: the test means nothing"
    );
    job.edit_config(
        "commit_every = 100\n",
        "commit_every = 1\ndelivery = \"at-least-once\"\n",
    );
    run_until_idle(&mut job);
    job.assert_exactly_once();
}

/// A job whose Iceberg sink commits every third checkpoint goes on checkpointing while no record arrives, so
/// the files of the last checkpoints become visible within three intervals instead of waiting for the next
/// record (before: never, while the input stayed quiet).
#[tokio::test(flavor = "multi_thread")]
async fn deferred_iceberg_files_become_visible_while_no_record_arrives() {
    let mut job = Job::new("deferred", 1, 1, "3s").await;
    let table_line = format!("table = \"{}.orders\"\n", job.name);
    job.edit_config(&table_line, &format!("{table_line}commit_every = 3\n"));
    job.produce(100).await;
    let mut worker = job.spawn_worker(&[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while lake_ids(&job).len() < 100 {
        assert!(
            Instant::now() < deadline,
            "the last checkpoints' files are still not visible after 30 s of 500 ms checkpoints"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    worker.stop(Duration::from_secs(60));
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_removed_sink_with_decided_work_pending_is_refused_until_resolved() {
    let mut job = Job::new("removed", 1, 1, "3s").await;
    job.produce(500).await;
    job.run_until_drill("after-record-durable:3").await;

    let full = std::fs::read_to_string(&job.config).unwrap();
    let archive = full
        .split("[[sinks]]")
        .find(|block| block.contains("id = \"archive\""))
        .unwrap()
        .to_string();
    std::fs::write(
        &job.config,
        full.replace(&format!("[[sinks]]{archive}"), ""),
    )
    .unwrap();
    let mut refused = job.spawn_worker(&["--exit-when-idle", "3s"]);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = refused.exited() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "a job without its pending sink ran on:\n{}",
            refused.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = refused.log_text();
    refused.child = None;
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("sink archive")
            && log.contains("no longer has")
            && log.contains("ratchet resolve"),
        "{log}"
    );

    // Put it back, resolve, run on: nothing lost anywhere, nothing twice.
    std::fs::write(&job.config, &full).unwrap();
    let resolved = job.ratchet("resolve");
    assert!(
        resolved.status.success(),
        "{}",
        String::from_utf8_lossy(&resolved.stderr)
    );
    run_until_idle(&mut job);
    job.assert_exactly_once();
}
