//! Tombstones (records whose value is null) are records, never errors, black-box through the `ratchet` binary:
//! with the JSON decoding and a dead-letter topic configured, the Kafka sink writes each as a tombstone (the
//! source's key, a null value) and the sinks that cannot express a deletion (files, the xa-mode table, Iceberg)
//! skip them, counted in `ratchet_tombstones_total`; nothing goes to the dead-letter topic and the job does not
//! stop. Every sink is read back by its independent reader.

mod common;

use std::time::Duration;

use common::{Job, free_port, scrape, total};
use integration::Services;

#[tokio::test(flavor = "multi_thread")]
async fn tombstones_reach_the_kafka_sink_and_are_skipped_by_the_others() {
    let mut job = Job::with_sections("tombstones", 1, 1, "3s", |name| {
        format!("\n[dead_letter]\ntopic = \"{name}-dead\"\n")
    })
    .await;
    common::create_topic(&format!("{}-dead", job.name), 1).await;
    job.produce(50).await;
    job.produce_tombstones(&["7", "8"]).await;
    job.produce(50).await;
    let port = free_port();
    let mut worker = job.spawn_worker(&["--metrics-listen", &format!("127.0.0.1:{port}")]);
    job.wait_copied(100, Duration::from_secs(90));
    let body = scrape(port).unwrap_or_default();
    worker.stop(Duration::from_secs(60));

    let written: f64 = body
        .lines()
        .filter(|l| l.starts_with("ratchet_tombstones_total") && l.contains("outcome=\"written\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(written, 2.0, "{body}");
    assert_eq!(total(&body, "ratchet_tombstones_total"), 8.0, "{body}");
    assert_eq!(total(&body, "ratchet_dead_letters_total"), 0.0, "{body}");

    // Every row once in every sink; the tombstones are no rows.
    job.assert_exactly_once();
    let services = Services::get();
    let copy = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &job.copy_topic],
    );
    let tombstones: Vec<&serde_json::Value> = copy["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["value"].is_null())
        .map(|r| &r["key"])
        .collect();
    assert_eq!(tombstones, ["7", "8"], "{copy}");
    let dead = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &format!("{}-dead", job.name)],
    );
    assert_eq!(dead["records"], serde_json::json!([]), "{dead}");
}
