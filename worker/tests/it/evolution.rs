//! Schema evolution through `ratchet run`, exactly once across the change: Avro through the schema registry, every
//! sink with `evolution = "add-columns"`. A writer schema that adds a field while the job runs becomes a column of
//! every sink (PostgreSQL `ALTER TABLE`, an Iceberg schema update, new Parquet files, JSON records) at a checkpoint
//! boundary. The process is killed at the first change before any sink evolved, and at a second change after the
//! first sink did; each restart reads the subject's latest schema and the sinks add what they lack when they
//! open. At the end every record is in every sink once (read back by the independent readers), with its own values
//! in the new columns and null where its schema had no such field. With `evolution = "none"` (the default) such a
//! record stops the job, naming the field and both schema ids. Two processes that started on different schema
//! versions write into the same tables at once, each record once.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{Job, order_schema};
use serde_json::{Value, json};
use test_support::Services;

/// Runs the worker with `RATCHET_KILL_AT=<step>:1`; once everything produced so far reached the Kafka copy,
/// produces `count` records of `schema`, and waits until the drill kills the worker at the schema change.
async fn killed_at_the_change(
    job: &mut Job,
    step: &str,
    schema: &str,
    count: u64,
    extra: impl Fn(u64) -> Value,
) {
    let at = format!("{step}:1");
    let mut worker = job.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", at.as_str())]);
    job.wait_copied(job.produced as usize, Duration::from_secs(60));
    job.produce_avro(schema, count, extra);
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = worker.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the {step} drill never fired:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.signal(), Some(9), "{}", worker.log_text());
    assert!(
        worker.log_text().contains("the source's schema changed"),
        "{}",
        worker.log_text()
    );
    worker.child = None;
}

#[tokio::test(flavor = "multi_thread")]
async fn new_fields_become_columns_of_every_sink_exactly_once_across_kills() {
    let mut job = Job::new("evolve", 2, 2, "3s").await;
    job.read_registry_avro();
    job.evolve_every_sink();
    job.produce_avro(&order_schema(&[]), 100, |_| json!({}));

    let with_qty = order_schema(&[("qty", "long")]);
    killed_at_the_change(
        &mut job,
        "before-evolve",
        &with_qty,
        100,
        |id| json!({ "qty": id }),
    )
    .await;
    let with_tag = order_schema(&[("qty", "long"), ("tag", "string")]);
    killed_at_the_change(
        &mut job,
        "after-evolve",
        &with_tag,
        100,
        |id| json!({ "qty": id, "tag": format!("t{id}") }),
    )
    .await;

    // The last process opens on the latest schema, then meets one more change, which every sink takes while it
    // runs: the checkpoint before it commits, the columns are added, the new batches are written.
    let mut worker = job.spawn_worker(&["--exit-when-idle", "5s"]);
    job.wait_copied(job.produced as usize, Duration::from_secs(60));
    let with_price = order_schema(&[("qty", "long"), ("tag", "string"), ("price", "double")]);
    job.produce_avro(
        &with_price,
        100,
        |id| json!({ "qty": id, "tag": format!("t{id}"), "price": id as f64 / 2.0 }),
    );
    worker.wait_exit(Duration::from_secs(120));
    assert!(
        worker.log_text().contains("sink took the new schema"),
        "{}",
        worker.log_text()
    );
    job.assert_exactly_once();

    // Each row has its own values in the new columns, null where its record's schema had no such field.
    let summary = Services::get().psql(&format!(
        "SELECT count(*) FILTER (WHERE id < 100 AND qty IS NULL AND tag IS NULL AND price IS NULL), \
                count(*) FILTER (WHERE id >= 100 AND id < 200 AND qty = id AND tag IS NULL), \
                count(*) FILTER (WHERE id >= 200 AND id < 300 AND qty = id AND tag = 't' || id AND price IS NULL), \
                count(*) FILTER (WHERE id >= 300 AND price = id / 2.0), \
                count(*) FILTER (WHERE note = 'n' || id) FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "100|100|100|100|400");
    // pyiceberg reads the Iceberg table the same way: each new column holds exactly the ids whose record had it.
    let lake = job.read_lake(&["--columns"]);
    let ids = |from: i64| Value::from((from..400).collect::<Vec<i64>>());
    assert_eq!(lake["columns"]["qty"], ids(100));
    assert_eq!(lake["columns"]["tag"], ids(200));
    assert_eq!(lake["columns"]["price"], ids(300));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_evolution_a_new_field_stops_the_job_naming_it_and_both_ids() {
    let mut job = Job::new("no_evolve", 1, 1, "3s").await;
    job.read_registry_avro();
    job.produce_avro(&order_schema(&[]), 10, |_| json!({}));
    let mut worker = job.spawn_worker(&[]);
    job.wait_copied(10, Duration::from_secs(60));
    job.produce_avro(
        &order_schema(&[("qty", "long")]),
        1,
        |id| json!({ "qty": id }),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = worker.exited() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the job went on:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = worker.log_text();
    assert!(!status.success(), "{log}");
    for expected in [
        "`qty`",
        "schema id",
        "reader schema id",
        "evolution = \"add-columns\"",
    ] {
        assert!(log.contains(expected), "{expected:?} in:\n{log}");
    }
    worker.child = None;
    job.produced = 10;
    job.assert_exactly_once();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_processes_on_different_schema_versions_write_each_record_once() {
    let mut job = Job::new("evolve_two", 2, 2, "3s").await;
    job.read_registry_avro();
    job.evolve_every_sink();
    job.produce_avro(&order_schema(&[]), 100, |_| json!({}));
    // The first process reads with version 1 and takes both subtasks.
    let mut first = job.spawn_worker(&[]);
    job.wait_spread(2, 1, Duration::from_secs(60));
    job.wait_copied(100, Duration::from_secs(60));

    // Version 2 is registered before any record of it: the second process starts on it (its sinks add `qty` to
    // the tables while the first process goes on writing version-1 rows into them) and takes one subtask.
    let with_qty = order_schema(&[("qty", "long")]);
    let endpoint = Services::get().registry();
    let registry = schema_registry::SchemaRegistry::new(&schema_registry::RegistrySettings {
        username: Some(endpoint.user.clone()),
        password: Some(endpoint.password.clone().into()),
        ..schema_registry::RegistrySettings::new(&endpoint.url)
    })
    .unwrap();
    registry
        .register(&format!("{}-value", job.topic), &with_qty)
        .await
        .unwrap();
    let mut second = job.spawn_worker(&[]);
    job.wait_spread(2, 2, Duration::from_secs(60));

    // Records of version 2 reach both: the first process widens its reader and finds the columns there.
    job.produce_avro(&with_qty, 100, |id| json!({ "qty": id }));
    job.wait_copied(200, Duration::from_secs(90));
    first.stop(Duration::from_secs(60));
    second.stop(Duration::from_secs(60));
    assert!(
        first.log_text().contains("the source's schema changed"),
        "the first process met the change:\n{}",
        first.log_text()
    );
    job.assert_exactly_once();
    let summary = Services::get().psql(&format!(
        "SELECT count(*) FILTER (WHERE id < 100 AND qty IS NULL), count(*) FILTER (WHERE id >= 100 AND qty = id) \
         FROM \"{}\"",
        job.table
    ));
    assert_eq!(summary.trim(), "100|100");
}
