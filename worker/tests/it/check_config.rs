//! `ratchet check-config` is true and read-only, and `ratchet run` refuses a sink's configuration error at once,
//! black-box through the binary against the real servers: on a fresh store of either kind (a local directory, a
//! PostgreSQL database with no table) every check passes and nothing is created (no checkpoint directory or table,
//! no sink directory, catalog or table), after which `run` works with several subtasks; a Kafka sink whose broker
//! does not answer fails its line; a misspelt sink key stops `run` at once, without restarts. A failing command
//! prints its error as a message chain, never a backtrace.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use test_support::Services;

/// A job file of the four sink kinds, each to be created on first run, with `store` and `kafka_sink_bootstrap`.
fn job_file(
    dir: &Path,
    name: &str,
    topic: &str,
    store: &str,
    kafka_sink_bootstrap: &str,
) -> std::path::PathBuf {
    let services = Services::get();
    let path = dir.join("job.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[job]
name = "{name}"
subtasks = 2
checkpoint_interval = "500ms"

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
decoding = {{ kind = "json", fields = [ {{ name = "id", type = "int64", nullable = false }} ] }}

{store}

[[sinks]]
type = "file"
id = "archive"
storage = {{ kind = "local", path = "{out}" }}

[[sinks]]
type = "kafka"
id = "copy"
bootstrap_servers = "{kafka_sink_bootstrap}"
topic = "{topic}-copy"

[[sinks]]
type = "jdbc"
id = "db"
url = "{pg}"
table = "{name}"
create_table = true

[[sinks]]
type = "iceberg"
id = "lake"
catalog = {{ kind = "sql", uri = "sqlite://{catalog}?mode=rwc", warehouse = "file://{warehouse}" }}
table = "{name}.orders"
create_table = true
"#,
            bootstrap = services.kafka_bootstrap(),
            pg = services.pg_url(),
            out = dir.join("out").display(),
            catalog = dir.join("catalog.db").display(),
            warehouse = dir.join("warehouse").display(),
        ),
    )
    .unwrap();
    path
}

fn ratchet(command: &str, config: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .arg(command)
        .args(extra)
        .arg("--config")
        .arg(config)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

async fn topic(name: &str) -> String {
    let topic = test_support::unique_name(name);
    common::create_topic(&topic, 2).await;
    topic
}

/// A job file of the four sink kinds ([`job_file`]) named after `label` on a fresh topic, with a local store under
/// `state/`, in a directory that lives as long as the returned guard; and the job's name.
async fn local_job(label: &str) -> (tempfile::TempDir, String, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let name = test_support::unique_name(label).replace('-', "_");
    let topic = topic(&name).await;
    let store = format!(
        "[store]\nkind = \"local\"\npath = \"{}\"",
        dir.path().join("state").display()
    );
    let config = job_file(
        dir.path(),
        &name,
        &topic,
        &store,
        Services::get().kafka_bootstrap(),
    );
    (dir, name, config)
}

fn table_exists(table: &str) -> bool {
    Services::get()
        .psql(&format!("SELECT to_regclass('\"{table}\"') IS NOT NULL"))
        .trim()
        == "t"
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_fresh_local_store_check_config_passes_writes_nothing_and_run_works() {
    let (dir, name, config) = local_job("fresh_local").await;
    let state = dir.path().join("state");
    let out = ratchet("check-config", &config, &[]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert_eq!(said.matches("\nok    sink ").count(), 4, "{said}");
    // The Iceberg table the first run creates compacts by default, and check-config says so.
    assert!(
        said.contains(
            "compacts its small files and files with many deleted rows inside the commits \
             (target_file_size = \"128MB\", min_input_files = 8, delete_ratio_threshold = 0.3, \
             delete_file_threshold = 16)"
        ),
        "{said}"
    );
    for created in [
        &state,
        &dir.path().join("out"),
        &dir.path().join("catalog.db"),
    ] {
        assert!(
            !created.exists(),
            "check-config created {}: {said}",
            created.display()
        );
    }
    assert!(!table_exists(&name), "check-config created table {name}");
    // And the job it checked runs, two subtasks on the fresh local store.
    let out = ratchet("run", &config, &["--exit-when-idle", "2s"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_fresh_postgres_store_check_config_passes_and_writes_nothing() {
    let services = Services::get();
    let dir = tempfile::tempdir().unwrap();
    let name = test_support::unique_name("fresh_pg").replace('-', "_");
    let topic = topic(&name).await;
    services.psql(&format!("CREATE DATABASE \"{name}\""));
    let (base, _) = services.pg_url().rsplit_once('/').unwrap();
    let store = format!("[store]\nkind = \"postgres\"\nurl = \"{base}/{name}\"");
    let config = job_file(
        dir.path(),
        &name,
        &topic,
        &store,
        services.kafka_bootstrap(),
    );
    let out = ratchet("check-config", &config, &[]);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("no checkpoint of this job yet"), "{said}");
    let tables = Command::new("psql")
        .args([
            &format!("{base}/{name}"),
            "-tAc",
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&tables.stdout).trim(),
        "0",
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kafka_sink_whose_broker_does_not_answer_fails_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let name = test_support::unique_name("deaf_sink").replace('-', "_");
    let topic = topic(&name).await;
    let store = format!(
        "[store]\nkind = \"local\"\npath = \"{}\"",
        dir.path().join("state").display()
    );
    let config = job_file(dir.path(), &name, &topic, &store, "127.0.0.1:1");
    let started = Instant::now();
    let out = ratchet("check-config", &config, &[]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(started.elapsed() < Duration::from_secs(60), "{said}");
    let line = said
        .lines()
        .find(|l| l.contains("sink copy"))
        .unwrap_or_default();
    assert!(
        line.starts_with("FAIL") && line.contains("127.0.0.1:1"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_misspelt_sink_key_stops_run_at_once() {
    let (_dir, _, config) = local_job("typo").await;
    let text_before = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text_before.replace(
            "create_table = true\n\n[[sinks]]\ntype = \"iceberg\"",
            "create_tabel = true\n\n[[sinks]]\ntype = \"iceberg\"",
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = ratchet("run", &config, &["--exit-when-idle", "2s"]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("create_tabel") && said.contains("did you mean `create_table`?"),
        "{said}"
    );
    assert!(
        !said.contains("restarting it in"),
        "retried a config error: {said}"
    );
    assert!(started.elapsed() < Duration::from_secs(20), "{said}");
}

/// `compact` on an Iceberg entry: a policy that cannot work or one on an upsert table deleting by equality is
/// refused by `check-config` naming the sink and the key, before anything runs.
#[tokio::test(flavor = "multi_thread")]
async fn check_config_refuses_a_compaction_it_cannot_do_naming_the_key() {
    let (_dir, _, config) = local_job("compact").await;
    let base = std::fs::read_to_string(&config).unwrap();
    for (entry, expected) in [
        (
            "compact = { target_file_size = \"128MB\", min_input_files = 1 }",
            "min_input_files = 1",
        ),
        (
            "compact = {}\nupsert_key = [\"id\"]\nupsert_deletes = \"equality\"",
            "upsert_deletes = \"position\"",
        ),
        (
            "compact = { delete_ratio_threshold = 1.5 }",
            "delete_ratio_threshold = 1.5",
        ),
    ] {
        std::fs::write(&config, format!("{base}{entry}\n")).unwrap();
        let out = ratchet("check-config", &config, &[]);
        let said = text(&out);
        assert!(!out.status.success(), "{entry}: {said}");
        assert!(
            said.contains("lake") && said.contains("compact") && said.contains(expected),
            "{entry}: {said}"
        );
    }
}

#[test]
fn a_command_that_fails_prints_its_message_chain_never_a_backtrace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.toml");
    std::fs::write(&path, "[job]\nname = \"x\"\nsubtask = 2\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ratchet"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains(&path.display().to_string()),
        "{stderr}"
    );
    assert!(
        !stderr.to_lowercase().contains("backtrace") && !stderr.contains("Caused by"),
        "{stderr}"
    );
}
