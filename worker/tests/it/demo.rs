//! `ratchet demo` end to end against the real servers: it kills its worker with SIGKILL mid-run, restarts it,
//! and prints a verdict per sink; the verdicts must say exactly once, and the independent readers (pyarrow,
//! pyiceberg and DuckDB, psycopg, a read_committed confluent-kafka consumer) must agree, with nothing hidden,
//! prepared or open left behind.

use crate::common;

use std::process::Command;

use test_support::Services;

const RECORDS: i64 = 20_000;

#[test]
fn the_demo_proves_exactly_once_in_all_four_sinks_across_a_sigkill() {
    let services = Services::get();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(["demo", "--records", &RECORDS.to_string()])
        .args(["--bootstrap", services.kafka_bootstrap()])
        .args(["--pg-url", services.pg_url()])
        .arg("--dir")
        .arg(dir.path())
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("killed the worker with SIGKILL"),
        "{stdout}"
    );
    for sink in ["files", "iceberg", "postgres", "kafka"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{sink} ")))
            .unwrap_or_else(|| panic!("no verdict for {sink}:\n{stdout}"));
        assert!(line.ends_with("exactly once"), "{line}");
    }

    // The names the demo chose, from its job file.
    let job: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.path().join("job.toml")).unwrap()).unwrap();
    let sinks = job["sinks"].as_array().unwrap();
    let setting = |i: usize, key: &str| sinks[i][key].as_str().unwrap().to_string();
    let expected: Vec<i64> = (0..RECORDS).collect();
    let sorted = common::sorted_ids;

    let files = services.verify(
        "visible_ids.py",
        &[
            "local",
            &dir.path().join("files").display().to_string(),
            "id",
        ],
    );
    assert_eq!(sorted(&files["ids"]), expected, "files");
    assert_eq!(files["strays"], serde_json::json!([]), "files left behind");

    let lake = services.verify(
        "iceberg_table.py",
        &[
            "ratchet",
            &format!("sqlite:///{}/catalog.db", dir.path().display()),
            &format!("file://{}/warehouse", dir.path().display()),
            &setting(1, "table"),
            "id",
        ],
    );
    assert_eq!(sorted(&lake["ids"]), expected, "iceberg (pyiceberg)");
    assert_eq!(sorted(&lake["duckdb_ids"]), expected, "iceberg (DuckDB)");
    assert_eq!(
        lake["unreferenced"],
        serde_json::json!([]),
        "iceberg files left behind"
    );

    let table = services.verify(
        "sql_table.py",
        &[
            "pg",
            services.pg_url(),
            &setting(2, "table"),
            "id",
            &setting(2, "scope"),
        ],
    );
    assert_eq!(sorted(&table["ids"]), expected, "postgres");
    assert_eq!(
        table["prepared"],
        serde_json::json!([]),
        "prepared left behind"
    );

    let (kafka, partitions) = services.kafka_ids(services.kafka_bootstrap(), &setting(3, "topic"));
    assert_eq!(kafka, expected, "kafka");
    for (p, offsets) in partitions.as_object().unwrap() {
        assert_eq!(
            offsets["lso"], offsets["high_watermark"],
            "open transaction on partition {p}"
        );
    }
}
