//! What a new user's job gets by default: an Iceberg sink that creates its table compacts the table's small files
//! inside its own commits (`compact` left out: docs/worker.md), through the `ratchet` binary with a SIGKILL in the
//! middle, read back by pyiceberg and DuckDB.

use crate::common;

use std::time::Duration;

use common::Job;

/// Rounds of records, each waited for (so each is at least one checkpoint of its own, one small data file).
/// Compaction looks for small files at a fresh instance's first checkpoint with data and then every 8th
/// (`min_input_files`): the instance started after the kill (round 3) looks at rounds 3 and 11 or earlier, and
/// finds at least 8 small files at the second look.
const ROUNDS: usize = 14;
/// The round after which the worker is killed with SIGKILL and replaced.
const KILLED_AFTER: usize = 2;

#[tokio::test(flavor = "multi_thread")]
async fn a_table_the_sink_created_is_compacted_by_default_across_a_kill() {
    let mut job = Job::new("compacting", 1, 1, "3s").await;
    let mut worker = job.spawn_worker(&[]);
    for round in 0..ROUNDS {
        job.produce(25).await;
        job.wait_delivered(Duration::from_secs(60));
        if round == KILLED_AFTER {
            worker.kill9();
            worker = job.spawn_worker(&[]);
        }
    }
    worker.stop(Duration::from_secs(60));
    // One last run recovers what the kill left undecided, then the readers check.
    let mut last = job.spawn_worker(&["--exit-when-idle", "2s"]);
    last.wait_exit(Duration::from_secs(120));
    job.assert_exactly_once();

    let lake = job.read_lake(&[]);
    let summaries: Vec<&serde_json::Map<String, serde_json::Value>> = lake["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["summary"].as_object().unwrap())
        .collect();
    let count = |summary: &serde_json::Map<String, serde_json::Value>, key: &str| -> i64 {
        summary
            .get(key)
            .and_then(|v| v.as_str())
            .map_or(0, |v| v.parse().unwrap())
    };
    // Appends never delete a data file: a snapshot of the sink's that does replaced small files with compacted
    // ones.
    assert!(
        summaries
            .iter()
            .any(|s| count(s, "deleted-data-files") > 0 && s.contains_key("ratchet.checkpoint")),
        "no snapshot of the sink compacted, in {ROUNDS} checkpoints of one small file each: {summaries:#?}"
    );
    let live = count(summaries.last().unwrap(), "total-data-files");
    assert!(
        (live as usize) < ROUNDS,
        "{live} live data files after {ROUNDS} checkpoints: {summaries:#?}"
    );
}
