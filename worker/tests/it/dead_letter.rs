//! Bad input with a dead-letter topic: records that are not JSON or do not fit the declared fields, and a row the
//! PostgreSQL table refuses (a CHECK constraint), go to the dead-letter topic with the reason and their source
//! coordinates in headers (an undecodable record with its own headers too), exactly once; every other record reaches every sink, the refused row reaches the sinks
//! that took it. Without a dead-letter topic the same bad record stops the job at once, named.

use crate::common;

use std::time::{Duration, Instant};

use common::Job;
use test_support::Services;

#[tokio::test(flavor = "multi_thread")]
async fn bad_records_and_refused_rows_go_to_the_dead_letter_topic_once() {
    let mut job = Job::with_sections("dlq", 2, 2, "3s", |name| {
        format!("\n[dead_letter]\ntopic = \"{name}-dead\"\n")
    })
    .await;
    let services = Services::get();
    // The table exists with a constraint the sink cannot know about: row 13 is refused.
    services.psql(&format!(
        "CREATE TABLE \"{}\" (id bigint NOT NULL CHECK (id <> 13))",
        job.table
    ));
    job.produce(100).await;
    job.produce_raw(&["not json", r#"{"id":"abc"}"#]).await;
    job.produce(100).await;
    let mut worker = job.spawn_worker(&[]);
    job.wait_delivered(Duration::from_secs(90));
    // A SIGKILL and a restart must not write any dead letter twice.
    worker.kill9();
    let mut worker = job.spawn_worker(&["--exit-when-idle", "3s"]);
    worker.wait_exit(Duration::from_secs(120));

    let expected: Vec<i64> = (0..200).collect();
    for (sink, ids) in job.read_back() {
        if sink == "table" {
            let without_13: Vec<i64> = expected.iter().copied().filter(|&i| i != 13).collect();
            assert_eq!(ids, without_13, "table");
        } else {
            assert_eq!(ids, expected, "{sink}");
        }
    }

    let dead = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), &format!("{}-dead", job.name)],
    );
    let letters = dead["records"].as_array().unwrap();
    assert_eq!(letters.len(), 3, "{dead}");
    let header = |letter: &serde_json::Value, name: &str| {
        letter["headers"][name].as_str().map(str::to_string)
    };
    let undecodable: Vec<_> = letters
        .iter()
        .filter(|l| header(l, "ratchet.sink").is_none())
        .collect();
    assert_eq!(undecodable.len(), 2, "{dead}");
    let values: Vec<&str> = undecodable
        .iter()
        .map(|l| l["value"].as_str().unwrap())
        .collect();
    assert!(
        values.contains(&"not json") && values.contains(&r#"{"id":"abc"}"#),
        "{dead}"
    );
    for letter in &undecodable {
        // The source record's own headers are kept.
        assert_eq!(header(letter, "origin").as_deref(), Some("raw"), "{letter}");
        assert_eq!(
            header(letter, "ratchet.source.topic"),
            Some(job.topic.clone())
        );
        assert!(
            header(letter, "ratchet.source.partition").is_some(),
            "{letter}"
        );
        assert!(
            header(letter, "ratchet.source.offset").is_some(),
            "{letter}"
        );
        assert!(
            header(letter, "ratchet.error").is_some_and(|e| e.contains(&job.topic)),
            "{letter}"
        );
    }
    let refused = letters
        .iter()
        .find(|l| header(l, "ratchet.sink").as_deref() == Some("db"))
        .unwrap_or_else(|| panic!("no dead letter from the table sink: {dead}"));
    assert_eq!(refused["value"].as_str(), Some(r#"{"id":13}"#), "{refused}");
    assert!(
        header(refused, "ratchet.error").is_some_and(|e| e.contains("13")),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_dead_letter_topic_a_bad_record_stops_the_job_named() {
    let mut job = Job::new("no-dlq", 1, 1, "3s").await;
    job.produce(10).await;
    job.produce_raw(&[r#"{"id":"abc"}"#]).await;
    let mut worker = job.spawn_worker(&[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = worker.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the job did not stop:\n{}",
            worker.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    worker.child = None;
    let log = worker.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!("{}/0@10", job.topic)),
        "the record is not named:\n{log}"
    );
    assert!(log.contains("[dead_letter]"), "{log}");
    assert!(
        !log.contains("restarting"),
        "a bad record must not be retried:\n{log}"
    );
}
