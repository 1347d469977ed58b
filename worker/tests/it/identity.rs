//! What a job owns, black-box through the `ratchet` binary and read back by independent readers (pyiceberg and
//! DuckDB, a read_committed consumer, pyarrow, psycopg): two jobs whose sinks have the same ids write one Iceberg
//! table, one Kafka topic, one directory and one SQL table without skipping or touching each other's checkpoints;
//! a job from before job scoping keeps its sink-id names; a job restarted on a fresh checkpoint store is refused,
//! naming the table's checkpoint and the store's, instead of skipping; a warehouse given with a trailing `/` keeps
//! every committed file through later recoveries.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use test_support::Services;

/// A topic holding `{"id": n}` for `ids`.
async fn topic_with(prefix: &str, ids: std::ops::Range<i64>) -> String {
    let topic = test_support::unique_name(prefix);
    common::create_topic(&topic, 1).await;
    produce(&topic, ids).await;
    topic
}

async fn produce(topic: &str, ids: std::ops::Range<i64>) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", Services::get().kafka_bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for id in ids {
        let value = format!(r#"{{"id":{id}}}"#);
        producer
            .send(
                FutureRecord::<str, str>::to(topic).payload(&value),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
}

/// A job file: `topic` into the Iceberg table `table` of the SQLite catalog `catalog` with `warehouse`, sink id
/// `lake`, checkpoints in the local store `state` (named after the job and the store).
fn job_file(dir: &Path, name: &str, topic: &str, lake: &Lake, state: &Path) -> PathBuf {
    let store = state.file_name().unwrap().to_string_lossy();
    let path = dir.join(format!("{name}-{store}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
[job]
name = "{name}"
checkpoint_interval = "500ms"

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
decoding = {{ kind = "json", fields = [ {{ name = "id", type = "int64", nullable = false }} ] }}

[store]
kind = "local"
path = "{state}"

[[sinks]]
type = "iceberg"
id = "lake"
catalog = {{ kind = "sql", uri = "sqlite://{catalog}?mode=rwc", warehouse = "{warehouse}" }}
table = "{table}"
create_table = true
"#,
            bootstrap = Services::get().kafka_bootstrap(),
            catalog = lake.catalog.display(),
            warehouse = lake.warehouse,
            table = lake.table,
            state = state.display(),
        ) + &lake.others,
    )
    .unwrap();
    path
}

/// A SQLite catalog and warehouse in a directory, and one table in it; optionally more sinks after it.
struct Lake {
    catalog: PathBuf,
    warehouse: String,
    table: String,
    /// More `[[sinks]]` entries.
    others: String,
}

impl Lake {
    fn new(dir: &Path, warehouse_suffix: &str) -> Self {
        Self {
            catalog: dir.join("catalog.db"),
            warehouse: format!(
                "file://{}{warehouse_suffix}",
                dir.join("warehouse").display()
            ),
            table: format!(
                "{}.orders",
                test_support::unique_name("lake").replace('-', "_")
            ),
            others: String::new(),
        }
    }

    /// The ids pyiceberg reads (asserting DuckDB reads the same and no file of Ratchet's is left unreferenced).
    fn ids(&self) -> Vec<i64> {
        let seen = Services::get().verify(
            "iceberg_table.py",
            &[
                "ratchet",
                &format!("sqlite:///{}", self.catalog.display()),
                self.warehouse.trim_end_matches('/'),
                &self.table,
                "id",
            ],
        );
        let ids = common::sorted_ids(&seen["ids"]);
        assert_eq!(
            ids,
            common::sorted_ids(&seen["duckdb_ids"]),
            "DuckDB disagrees"
        );
        assert_eq!(seen["unreferenced"], serde_json::json!([]), "{seen}");
        ids
    }
}

/// Runs `ratchet run` on `config` until idle for 2 s; its output.
fn run_until_idle(config: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(["run", "--exit-when-idle", "2s", "--config"])
        .arg(config)
        .env("RUST_LOG", "info")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn assert_clean(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "ratchet run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_jobs_whose_sinks_share_their_ids_write_one_table_topic_directory_without_interfering()
{
    let services = Services::get();
    let dir = tempfile::tempdir().unwrap();
    let mut lake = Lake::new(dir.path(), "");
    let eu = topic_with("orders-eu", 0..200).await;
    let us = topic_with("orders-us", 1000..1300).await;
    // One copy topic, one directory, one SQL table for both jobs; no prefix, scope or job setting anywhere.
    let copy = topic_with("orders-copy", 0..0).await;
    let sql_table = test_support::unique_name("orders").replace('-', "_");
    let out = dir.path().join("out");
    lake.others = format!(
        r#"
[[sinks]]
type = "kafka"
id = "copy"
bootstrap_servers = "{bootstrap}"
topic = "{copy}"

[[sinks]]
type = "file"
id = "archive"
storage = {{ kind = "local", path = "{out}" }}

[[sinks]]
type = "jdbc"
id = "db"
url = "{pg}"
table = "{sql_table}"
create_table = true
"#,
        bootstrap = services.kafka_bootstrap(),
        pg = services.pg_url(),
        out = out.display(),
    );
    let state = dir.path().join("state");
    // Names no earlier run used: the SQL table's owner rows outlive a test's directory.
    let (name_eu, name_us) = (
        test_support::unique_name("orders-eu"),
        test_support::unique_name("orders-us"),
    );
    // Run each twice, so each recovers (and cleans up) after the other wrote.
    for _ in 0..2 {
        for (name, topic) in [(&name_eu, &eu), (&name_us, &us)] {
            let config = job_file(dir.path(), name, topic, &lake, &state);
            assert_clean(&run_until_idle(&config));
        }
    }
    let expected: Vec<i64> = (0..200).chain(1000..1300).collect();
    assert_eq!(lake.ids(), expected, "iceberg");
    let (kafka, _) = services.kafka_ids(services.kafka_bootstrap(), &copy);
    assert_eq!(kafka, expected, "kafka");
    let files = services.verify(
        "visible_ids.py",
        &["local", &out.display().to_string(), "id"],
    );
    assert_eq!(files["strays"], serde_json::json!([]), "{files}");
    assert_eq!(common::sorted_ids(&files["ids"]), expected, "files");
    let table = services.verify(
        "sql_table.py",
        &[
            "pg",
            services.pg_url(),
            &sql_table,
            "id",
            &format!("{name_eu}~db"),
            &format!("{name_us}~db"),
        ],
    );
    assert_eq!(table["prepared"], serde_json::json!([]), "{table}");
    assert_eq!(common::sorted_ids(&table["ids"]), expected, "jdbc");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_from_before_job_scoping_keeps_its_sink_id_names() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::new(dir.path(), "");
    let topic = topic_with("legacy", 0..50).await;
    let state = dir.path().join("state");
    // What an older release left: the subtask's checkpoint directory, no record of the job's identity.
    std::fs::create_dir_all(state.join("legacy").join("subtask-0")).unwrap();
    let config = job_file(dir.path(), "legacy", &topic, &lake, &state);
    assert_clean(&run_until_idle(&config));
    let seen = Services::get().verify(
        "iceberg_table.py",
        &[
            "ratchet",
            &format!("sqlite:///{}", lake.catalog.display()),
            &lake.warehouse,
            &lake.table,
            "id",
        ],
    );
    let summaries: Vec<&serde_json::Value> = seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["summary"]["ratchet.job"])
        .collect();
    // The ledger key stays the sink id, as the older release wrote it.
    assert!(
        !summaries.is_empty() && summaries.iter().all(|j| *j == "lake"),
        "{summaries:?}"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("legacy").join("identity")).unwrap(),
        "sink"
    );
    assert_eq!(lake.ids(), (0..50).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_restarted_on_a_fresh_store_is_refused_naming_both_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::new(dir.path(), "");
    let topic = topic_with("restarted", 0..100).await;
    let config = job_file(
        dir.path(),
        "restarted",
        &topic,
        &lake,
        &dir.path().join("state"),
    );
    assert_clean(&run_until_idle(&config));
    produce(&topic, 100..150).await;

    let fresh = job_file(
        dir.path(),
        "restarted",
        &topic,
        &lake,
        &dir.path().join("another-state"),
    );
    let out = run_until_idle(&fresh);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ran on a fresh store:\n{said}");
    assert!(
        said.contains("records checkpoint")
            && said.contains("store's newest is none")
            && said.contains("lake"),
        "{said}"
    );
    // Nothing was skipped or doubled: the job on its own store delivers the rest.
    assert_clean(&run_until_idle(&config));
    assert_eq!(lake.ids(), (0..150).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_warehouse_with_a_trailing_slash_keeps_every_committed_file() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::new(dir.path(), "/");
    let topic = topic_with("slash", 0..100).await;
    let config = job_file(
        dir.path(),
        "slash",
        &topic,
        &lake,
        &dir.path().join("state"),
    );
    assert_clean(&run_until_idle(&config));
    produce(&topic, 100..200).await;
    // The second start recovers (and cleans up) before reading on.
    assert_clean(&run_until_idle(&config));
    assert_clean(&run_until_idle(&config));
    assert_eq!(lake.ids(), (0..200).collect::<Vec<_>>());
}
