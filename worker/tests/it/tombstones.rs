//! Tombstones (records whose value is null) are records, never errors, black-box through the `ratchet` binary:
//! with the JSON decoding and a dead-letter topic configured, the Kafka sink writes each as a tombstone (the
//! source's key, a null value), an upsert-mode table deletes the rows of their keys after the rows they follow, and
//! the sinks that cannot express a deletion (files, the xa-mode table, Iceberg) skip them, counted in
//! `ratchet_tombstones_total`; a key the upsert table cannot read goes to the dead-letter topic for that sink
//! only, and the job does not stop. Every sink is read back by its independent reader.

use crate::common;

use std::time::Duration;

use common::{Job, free_port, scrape, total};
use test_support::Services;

#[tokio::test(flavor = "multi_thread")]
async fn tombstones_reach_the_kafka_sink_and_are_skipped_by_the_others() {
    let mut job = Job::with_sections("tombstones", 1, 1, "3s", |name| {
        let pg = Services::get().pg_url();
        format!(
            "\n[[sinks]]\ntype = \"jdbc\"\nid = \"latest\"\nurl = \"{pg}\"\ntable = \"{name}_latest\"\n\
             mode = {{ kind = \"upsert\", key = [\"id\"] }}\ncreate_table = true\n\
             \n[dead_letter]\ntopic = \"{name}-dead\"\n"
        )
    })
    .await;
    common::create_topic(&format!("{}-dead", job.name), 1).await;
    job.produce(50).await;
    job.produce_tombstones(&["7", "8"]).await;
    job.produce(50).await;
    // A key the upsert table cannot read (its key column is an integer): a dead letter, for that sink only.
    job.produce_tombstones(&["abc"]).await;
    let port = free_port();
    let mut worker = job.spawn_worker(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    job.wait_copied(100, Duration::from_secs(90));
    // The last tombstone follows the rows: wait until its dead letter is counted too.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let body = loop {
        let body = scrape(port).unwrap_or_default();
        if total(&body, "ratchet_dead_letters_total") >= 1.0 {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the refused tombstone never reached the dead-letter topic:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    worker.stop(Duration::from_secs(60));

    let written: f64 = body
        .lines()
        .filter(|l| l.starts_with("ratchet_tombstones_total") && l.contains("outcome=\"written\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // The Kafka sink writes all three, the upsert table two; files, the xa table and Iceberg skip them.
    assert_eq!(written, 5.0, "{body}");
    assert_eq!(total(&body, "ratchet_tombstones_total"), 14.0, "{body}");
    assert_eq!(total(&body, "ratchet_dead_letters_total"), 1.0, "{body}");

    // Every row once in every sink; the tombstones are no rows.
    job.assert_exactly_once();
    let services = Services::get();
    let copy = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &job.copy_topic],
    );
    let mut tombstones: Vec<&str> = copy["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["value"].is_null())
        .filter_map(|r| r["key"].as_str())
        .collect();
    tombstones.sort_unstable();
    assert_eq!(tombstones, ["7", "8", "abc"], "{copy}");
    let dead = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &format!("{}-dead", job.name)],
    );
    let letters = dead["records"].as_array().unwrap();
    assert_eq!(letters.len(), 1, "{dead}");
    assert_eq!(letters[0]["key"], "abc", "{dead}");
    assert_eq!(letters[0]["headers"]["ratchet.sink"], "latest", "{dead}");
    // The upsert table applied the deletes after the rows they follow.
    let latest = services.verify(
        "sql_table.py",
        &[
            "pg",
            services.pg_url(),
            &format!("{}_latest", job.name),
            "id",
        ],
    );
    let expected: Vec<i64> = (0..100).filter(|i| ![7, 8].contains(i)).collect();
    assert_eq!(common::sorted_ids(&latest["ids"]), expected, "{latest}");
}
