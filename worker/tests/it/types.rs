//! The type matrix (issue "every value as it was"): one schema with every type of the type contract
//! (docs/types.md), nested two levels deep, with nulls, empty strings, lists and maps and values at the edges
//! (decimals of 38 digits, timestamps before 1970 and in year 9999, unicode), produced once by confluent-kafka's
//! AvroSerializer through the schema registry and once as JSON, run by `ratchet run` on the defaults a new user
//! starts with (the local checkpoint store, tables and topics the sinks create) into every sink: Parquet files,
//! Iceberg (appended, and upserted by `id` into a format-version 3 table: deletion vectors), PostgreSQL, MariaDB, Kafka JSON values and Kafka Avro values. Each is read back by its independent
//! reader (pyarrow, Apache Iceberg's Java library, psycopg, pymysql, read_committed confluent-kafka consumers, the
//! last with the AvroDeserializer) and compared value by value (`test-support/verifiers/type_matrix.py`). The
//! fields some sink cannot hold exactly (nanosecond timestamps, a 60-digit decimal) are refused by `check-config`,
//! each by the sinks that cannot hold it and no other.

use crate::common;

use std::time::Duration;

use common::{Worker, create_topic};
use serde_json::Value;
use test_support::Services;

/// Rows of the matrix per run.
const ROWS: u64 = 60;

struct Matrix {
    dir: tempfile::TempDir,
    name: String,
    topic: String,
    config: std::path::PathBuf,
}

impl Matrix {
    fn ratchet(&self, command: &str) -> std::process::Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_ratchet"))
            .args([command, "--config"])
            .arg(&self.config)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap()
    }

    fn check(&self, sink: &str, args: &[&str]) -> Value {
        let services = Services::get();
        let rows = ROWS.to_string();
        let mut all = vec!["check", rows.as_str(), sink];
        all.extend_from_slice(args);
        services.verify("type_matrix.py", &all)
    }
}

/// A job reading `form` ("avro" through the registry, or "json") from a new topic into every sink kind.
async fn matrix(form: &str) -> Matrix {
    let services = Services::get();
    let registry = services.registry();
    let name = test_support::unique_name(&format!("matrix_{form}")).replace('-', "_");
    let topic = format!("{name}-in");
    create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let decoding = match form {
        "avro" => format!(
            "decoding = {{ kind = \"avro\" }}\n\n[source.registry]\nurl = \"{}/\"\nusername = \"{}\"\npassword = \"{}\"",
            registry.url, registry.user, registry.password
        ),
        _ => {
            let fields = services.verify("type_matrix.py", &["json-fields-json"]);
            format!(
                "decoding = {{ kind = \"json\", unknown_fields = \"fail\", fields = {} }}",
                fields["toml"].as_str().unwrap()
            )
        }
    };
    let config = dir.path().join("job.toml");
    let text = format!(
        r#"
[job]
name = "{name}"
subtasks = 2
checkpoint_interval = "500ms"

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
{decoding}

[store]
kind = "local"
path = "{state}"

[[sinks]]
type = "file"
id = "files"
storage = {{ kind = "local", path = "{files}" }}

[[sinks]]
type = "iceberg"
id = "lake"
catalog = {{ kind = "sql", uri = "sqlite://{catalog}?mode=rwc", warehouse = "file://{warehouse}" }}
table = "matrix.{name}"
create_table = true

[[sinks]]
type = "iceberg"
id = "lake3"
catalog = {{ kind = "sql", uri = "sqlite://{catalog}?mode=rwc", warehouse = "file://{warehouse}" }}
table = "matrix.{name}_v3"
create_table = true
format_version = 3
upsert_key = ["id"]

[[sinks]]
type = "jdbc"
id = "pg"
url = "{pg}"
table = "{name}"
create_table = true

[[sinks]]
type = "jdbc"
id = "mariadb"
url = "{mysql}"
table = "{name}"
create_table = true

[[sinks]]
type = "kafka"
id = "json"
bootstrap_servers = "{bootstrap}"
topic = "{name}-json"

[[sinks]]
type = "kafka"
id = "avro"
bootstrap_servers = "{bootstrap}"
topic = "{name}-avro"
records = {{ value_format = "avro" }}
registry = {{ url = "{registry_url}/", username = "{user}", password = "{password}" }}
"#,
        bootstrap = services.kafka_bootstrap(),
        state = dir.path().join("state").display(),
        files = dir.path().join("files").display(),
        catalog = dir.path().join("catalog.db").display(),
        warehouse = dir.path().join("warehouse").display(),
        pg = services.pg_url(),
        mysql = services.mysql_url(),
        registry_url = registry.url,
        user = registry.user,
        password = registry.password,
    );
    std::fs::write(&config, text).unwrap();
    for output in [format!("{name}-json"), format!("{name}-avro")] {
        create_topic(&output, 2).await;
    }
    Matrix {
        dir,
        name,
        topic,
        config,
    }
}

fn assert_exact(sink: &str, checked: &Value) {
    assert_eq!(
        checked["mismatches"],
        Value::Array(vec![]),
        "{sink}: values differ from what was produced: {checked}"
    );
    assert_eq!(checked["ids"], ROWS, "{sink}: {checked}");
    assert_eq!(checked["rows"], ROWS, "{sink}: every row once: {checked}");
}

async fn run_matrix(form: &str) {
    let services = Services::get();
    let matrix = matrix(form).await;
    services.verify(
        "type_matrix.py",
        &[
            "produce",
            form,
            services.kafka_bootstrap(),
            &matrix.topic,
            &ROWS.to_string(),
        ],
    );
    let check = matrix.ratchet("check-config");
    let said = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{form}: check-config:\n{said}");
    let log = matrix.dir.path().join("worker.log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(["run", "--config"])
        .arg(&matrix.config)
        .args(["--exit-when-idle", "3s"])
        .env("RUST_LOG", "info")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut worker = Worker {
        child: Some(child),
        log,
    };
    worker.wait_exit(Duration::from_secs(180));
    let dir = matrix.dir.path();
    let name = &matrix.name;
    let files = dir.join("files").display().to_string();
    assert_exact("parquet", &matrix.check("parquet", &[&files]));
    let catalog = format!("sqlite:///{}", dir.join("catalog.db").display());
    let warehouse = format!("file://{}", dir.join("warehouse").display());
    let table = format!("matrix.{name}");
    assert_exact(
        "iceberg",
        &matrix.check("iceberg", &[&catalog, &warehouse, &table]),
    );
    let upserted = format!("matrix.{name}_v3");
    assert_exact(
        "iceberg format-version 3, upserts by id (deletion vectors)",
        &matrix.check("iceberg", &[&catalog, &warehouse, &upserted]),
    );
    assert_exact(
        "postgresql",
        &matrix.check("pg", &[services.pg_url(), name]),
    );
    assert_exact(
        "mariadb",
        &matrix.check("mysql", &[services.mysql_url(), name]),
    );
    let bootstrap = services.kafka_bootstrap();
    assert_exact(
        "kafka json",
        &matrix.check("kafka-json", &[bootstrap, &format!("{name}-json")]),
    );
    assert_exact(
        "kafka avro",
        &matrix.check("kafka-avro", &[bootstrap, &format!("{name}-avro")]),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_type_matrix_in_avro_reaches_every_sink_value_by_value() {
    run_matrix("avro").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_type_matrix_in_json_reaches_every_sink_value_by_value() {
    run_matrix("json").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn check_config_refuses_each_field_exactly_where_a_sink_cannot_hold_it() {
    let services = Services::get();
    let matrix = matrix("avro").await;
    // The subject's latest version is the schema with the refused fields (one record of it registers it).
    services.verify(
        "type_matrix.py",
        &["produce-refused", services.kafka_bootstrap(), &matrix.topic],
    );
    let check = matrix.ratchet("check-config");
    let said = String::from_utf8_lossy(&check.stdout).to_string();
    assert!(!check.status.success(), "{said}");
    let refused = services.verify("type_matrix.py", &["refused"]);
    // A sink's report: its line and the lines that follow it up to the next check's.
    let line = |sink: &str| {
        let lines: Vec<&str> = said.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.contains(&format!("sink {sink} (")))
            .unwrap_or_else(|| panic!("no line for sink {sink}:\n{said}"));
        let end = lines[start + 1..]
            .iter()
            .position(|l| l.starts_with("ok ") || l.starts_with("FAIL") || l.starts_with("wait"))
            .map_or(lines.len(), |n| start + 1 + n);
        lines[start..end].join("\n")
    };
    for (sink, kind) in [
        ("files", "parquet"),
        ("lake", "iceberg"),
        ("lake3", "iceberg"),
        ("pg", "pg"),
        ("mariadb", "mysql"),
        ("json", "kafka-json"),
        ("avro", "kafka-avro"),
    ] {
        let line = line(sink);
        for (field, refusing) in refused.as_object().unwrap() {
            let refuses = refusing.as_array().unwrap().iter().any(|s| s == kind);
            let named = line.contains(&format!("field `{field}`"));
            assert_eq!(
                refuses,
                named,
                "sink {sink}: field {field} should {}be refused:\n{line}",
                if refuses { "" } else { "not " }
            );
        }
        assert_eq!(
            line.starts_with("FAIL"),
            refused.as_object().unwrap().values().any(|s| s
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == kind)),
            "{line}"
        );
    }
}
