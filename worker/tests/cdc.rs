//! Change data capture end to end, under SIGKILL: Debezium's PostgreSQL connector (Kafka Connect, the `connect`
//! service) captures a PostgreSQL table while a workload inserts, updates and deletes in small transactions;
//! `ratchet run` processes, killed with SIGKILL at random moments and replaced, run the documented example job
//! (docs/examples/cdc-postgres-iceberg.toml: a PostgreSQL replica in `xa_upsert` mode, an Iceberg table kept by key
//! with row deltas (`upsert_key`) and an Iceberg changelog) with a MariaDB replica (`upsert` mode) and a Parquet
//! changelog (file sink) added. Afterwards, read by independent readers (psycopg, pymysql, pyiceberg, Iceberg's Java
//! library, a read_committed confluent-kafka consumer):
//! - both replicas and the Iceberg table kept by key equal the source table row for row;
//! - the Iceberg changelog holds every change event of the topic exactly once (by Kafka offset), and applying it
//!   (the last change per key, deletes removing) gives the source table too; the Parquet changelog holds every
//!   change event once as well;
//! - no prepared transaction is left behind.
//!
//! `RATCHET_CDC_OPS` sets the workload's operations (1200 by default, as CI runs it), `RATCHET_CDC_KILLS` the
//! kills (3 by default; the long run is recorded in docs/benchmarks.md, "Chaos"), `RATCHET_CHAOS_SEED` replays a
//! run (the seed is printed).
#![allow(clippy::disallowed_methods)] // tests, benches and examples read the services' endpoints and their modes from the environment

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Job, Rng, Worker, env_u64, seed};
use serde_json::Value;
use test_support::Services;
use test_support::cdc::{Converter, DebeziumConnector};

/// The captured table's columns, in the order the readers compare them.
const COLUMNS: [&str; 5] = ["id", "name", "qty", "price", "active"];

/// How the worker is killed while a workload runs: `kills` SIGKILLs, each after `pause_ms.0` plus a random part
/// of `pause_ms.1` milliseconds (from the run's seed).
struct Chaos {
    kills: u64,
    pause_ms: (u64, u64),
}

/// Kills the running `worker` as `chaos` says while `workload` runs (starting a replacement after each kill),
/// waits for the workload, then until `caught_up` holds (the worker must keep running; bounded by `within`), stops
/// the worker and runs one last process until it is idle, which recovers what the killed ones left. Returns the
/// workload's result and the last process.
async fn kill_during_then_settle(
    job: &mut Job,
    mut worker: Worker,
    chaos: Chaos,
    rng: &mut Rng,
    workload: std::thread::JoinHandle<Value>,
    within: Duration,
    caught_up: impl Fn() -> Result<(), String>,
) -> (Value, Worker) {
    for _ in 0..chaos.kills {
        tokio::time::sleep(Duration::from_millis(
            chaos.pause_ms.0 + rng.below(chaos.pause_ms.1),
        ))
        .await;
        worker.kill9();
        worker = job.spawn_worker(&[]);
    }
    let done = tokio::task::spawn_blocking(move || workload.join().expect("the workload"))
        .await
        .unwrap();
    let deadline = Instant::now() + within;
    while let Err(behind) = caught_up() {
        assert!(
            worker.exited().is_none(),
            "the worker stopped:\n{}",
            worker.log_text()
        );
        assert!(
            Instant::now() < deadline,
            "{behind} within {within:?}:\n{}",
            worker.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    worker.stop(Duration::from_secs(60));
    let mut last = job.spawn_worker(&["--exit-when-idle", "2s"]);
    last.wait_exit(Duration::from_secs(120));
    (done, last)
}

/// Replaces `from` (which must be in `text`) with `to`.
fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the example job file has no {from:?}");
    text.replace(from, to)
}

/// The documented example job file, made to read `topic` into tables named after `name`.
fn job_file(name: &str, topic: &str, warehouse: &std::path::Path) -> String {
    let services = Services::get();
    let example = std::fs::read_to_string(
        test_support::repo_root().join("docs/examples/cdc-postgres-iceberg.toml"),
    )
    .unwrap();
    let mut text = replaced(&example, "\"items-cdc\"", &format!("\"{name}\""));
    text = replaced(&text, "pg.public.items", topic);
    text = replaced(&text, "items_replica", &format!("{name}_pg"));
    text = replaced(&text, "cdc.items_changes", &format!("{name}.changes"));
    text = replaced(&text, "cdc.items_state", &format!("{name}.state"));
    text = replaced(
        &text,
        "file:///var/tmp/ratchet-lake",
        &format!("file://{}", warehouse.display()),
    );
    text = replaced(&text, "127.0.0.1:19092", services.kafka_bootstrap());
    text = replaced(
        &text,
        "postgres://ratchet:ratchet@127.0.0.1:15432/ratchet",
        services.pg_url(),
    );
    // Kills are frequent: a killed process's subtask is taken over once its lease expires.
    text = replaced(&text, "lease = \"10s\"", "lease = \"3s\"");
    text + &format!(
        r#"
[[sinks]]
type = "jdbc"
id = "mariadb"
url = "{mysql}"
table = "{name}_my"
create_table = true
mode = {{ kind = "upsert", key = ["id"] }}

[[sinks]]
type = "file"
id = "files"
storage = {{ kind = "local", path = "{files}" }}
"#,
        mysql = services.mysql_url(),
        files = warehouse.with_file_name("changes").display(),
    )
}

/// The rows of `table` as the independent reader sees them, ordered by id.
fn rows(kind: &str, url: &str, table: &str) -> Vec<Value> {
    let mut args = vec![kind, url, table, "id"];
    args.extend(COLUMNS);
    Services::get().verify("sql_rows.py", &args)["rows"]
        .as_array()
        .unwrap()
        .clone()
}

/// The Iceberg table `table` of the job's lake as the verifier reads it (`iceberg_table.py` with `flags`).
fn read_table(job: &Job, table: &str, flags: &[&str]) -> Value {
    let services = Services::get();
    let uri = services
        .pg_url()
        .replacen("postgres://", "postgresql+psycopg://", 1);
    let warehouse = format!("file://{}", job.dir.path().join("warehouse").display());
    let mut args = vec!["ratchet", &uri, &warehouse, table, "id"];
    args.extend(flags);
    services.verify("iceberg_table.py", &args)
}

/// The changelog as pyiceberg reads it, checked against the topic: every change event (a record with a value)
/// exactly once by offset; returns the table it describes (the last change per id, deletes removed), ordered by
/// id, in [`COLUMNS`] order. `last_log` (the last worker's log) goes into a failure's message.
fn applied_changelog(job: &Job, name: &str, topic: &str, last_log: &str) -> Vec<Value> {
    let services = Services::get();
    let read = read_table(job, &format!("{name}.changes"), &["--rows"]);
    let names: Vec<&str> = read["column_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let at = |column: &str| names.iter().position(|n| *n == column).unwrap();
    let changes = read["rows"].as_array().unwrap();

    let topic_records = services.verify(
        "kafka_read_committed.py",
        &[services.kafka_bootstrap(), topic],
    );
    let mut events: Vec<i64> = topic_records["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["value"].is_null())
        .map(|r| r["offset"].as_i64().unwrap())
        .collect();
    events.sort_unstable();
    let mut offsets: Vec<i64> = changes
        .iter()
        .map(|row| row[at("kafka_offset")].as_i64().unwrap())
        .collect();
    offsets.sort_unstable();
    assert_eq!(
        offsets.len(),
        events.len(),
        "the changelog holds {} changes, the topic {} change events (table exists: {}, snapshots: {}; the \
         last run's log:\n{})",
        offsets.len(),
        events.len(),
        read["exists"],
        read["snapshots"].as_array().map_or(0, Vec::len),
        last_log
    );
    assert_eq!(offsets, events, "every change event once in the changelog");

    let files = services.verify(
        "visible_ids.py",
        &[
            "local",
            &job.dir.path().join("changes").display().to_string(),
            "kafka_offset",
        ],
    );
    let mut in_files: Vec<i64> = files["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_i64().unwrap())
        .collect();
    in_files.sort_unstable();
    assert_eq!(
        in_files, events,
        "every change event once in the Parquet changelog"
    );
    assert_eq!(files["strays"], Value::Array(vec![]), "files left behind");

    let mut last: BTreeMap<i64, (i64, &Vec<Value>)> = BTreeMap::new();
    for row in changes.iter().map(|r| r.as_array().unwrap()) {
        let (id, offset) = (
            row[at("id")].as_i64().unwrap(),
            row[at("kafka_offset")].as_i64().unwrap(),
        );
        if last.get(&id).is_none_or(|(seen, _)| *seen < offset) {
            last.insert(id, (offset, row));
        }
    }
    last.values()
        .filter(|(_, row)| row[at("__op")] != "d")
        .map(|(_, row)| {
            Value::Array(
                COLUMNS
                    .iter()
                    .map(|c| match &row[at(c)] {
                        Value::Bool(b) => Value::from(i64::from(*b)),
                        Value::Number(n) if n.is_f64() => Value::from(
                            format!("{:.9e}", n.as_f64().unwrap())
                                .parse::<f64>()
                                .unwrap(),
                        ),
                        other => other.clone(),
                    })
                    .collect(),
            )
        })
        .collect()
}

/// `value` of column `column` as the SQL readers give it: booleans as 0/1, floats to 10 significant digits (the
/// Java reader gives every non-integer as its string form).
fn comparable(column: &str, value: &Value) -> Value {
    match (column, value) {
        (_, Value::Null) => Value::Null,
        ("active", Value::Bool(b)) => Value::from(i64::from(*b)),
        ("active", Value::String(s)) => Value::from(i64::from(s == "true")),
        ("price", Value::String(s)) => comparable(column, &Value::from(s.parse::<f64>().unwrap())),
        ("price", Value::Number(n)) => Value::from(
            format!("{:.9e}", n.as_f64().unwrap())
                .parse::<f64>()
                .unwrap(),
        ),
        _ => value.clone(),
    }
}

/// The Iceberg table the upsert sink keeps (`upsert_key = ["id"]`), ordered by id in [`COLUMNS`] order: as
/// Iceberg's Java library reads it (merge-on-read), after checking that pyiceberg (or the verifier's own
/// merge-on-read of the manifests, for equality deletes) and DuckDB (for position deletes) agree.
fn iceberg_state(job: &Job, name: &str) -> Vec<Value> {
    let read = read_table(job, &format!("{name}.state"), &["--rows", "--java-rows"]);
    let table = |names: &Value, rows: &Value| -> Vec<Value> {
        let names: Vec<&str> = names
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        let mut table: Vec<Value> = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                Value::Array(
                    COLUMNS
                        .iter()
                        .map(|c| {
                            let at = names.iter().position(|n| n == c).unwrap();
                            comparable(c, &row[at])
                        })
                        .collect(),
                )
            })
            .collect();
        table.sort_by_key(|row| row[0].as_i64().unwrap());
        table
    };
    let java = table(&read["java_column_names"], &read["java_rows"]);
    assert_eq!(
        table(&read["column_names"], &read["rows"]),
        java,
        "pyiceberg (the verifier's merge-on-read where equality deletes are live) and Iceberg's Java library agree"
    );
    // Position deletes (the default): DuckDB reads them too (it misreads equality deletes).
    if read["equality_deletes"] == Value::Bool(false) {
        let ids: Vec<Value> = java.iter().map(|row| row[0].clone()).collect();
        assert_eq!(read["duckdb_ids"], Value::from(ids), "DuckDB agrees");
    }
    java
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_changes_under_sigkill_reach_postgres_mariadb_and_iceberg_exactly_once() {
    let services = Services::get();
    let ops = env_u64("RATCHET_CDC_OPS").unwrap_or(1200);
    let kills = env_u64("RATCHET_CDC_KILLS").unwrap_or(3);
    let seed = seed();
    eprintln!("cdc: {ops} operations, {kills} kills, RATCHET_CHAOS_SEED={seed}");
    let mut rng = Rng(seed);

    let mut job = Job::new("cdc", 1, 1, "3s").await;
    let name = job.name.clone();
    let source = format!("public.{name}_src");
    // Rows before the connector starts reach the topic as its snapshot (`r`), the rest as changes.
    services.cdc(&[
        "workload",
        "--table",
        &source,
        "--ops",
        "80",
        "--seed",
        &seed.to_string(),
        "--create",
    ]);
    let connector = DebeziumConnector::register(&name, &source, Converter::Json { schemas: true });
    let topic = connector.topic().to_string();
    std::fs::write(
        &job.config,
        job_file(&name, &topic, &job.dir.path().join("warehouse")),
    )
    .unwrap();
    let checked = job.ratchet("check-config");
    assert!(
        checked.status.success(),
        "check-config refuses the example job:\n{}\n{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let worker = job.spawn_worker(&[]);
    let workload = {
        let (source, seed) = (source.clone(), (seed + 1).to_string());
        std::thread::spawn(move || {
            Services::get().cdc(&[
                "workload",
                "--table",
                &source,
                "--ops",
                &ops.to_string(),
                "--seed",
                &seed,
            ])
        })
    };
    let (done, last) = kill_during_then_settle(
        &mut job,
        worker,
        Chaos {
            kills,
            pause_ms: (1000, 3000),
        },
        &mut rng,
        workload,
        Duration::from_secs(180),
        || {
            // The source no longer changes: the replica catches up with the connector's last change.
            match rows("pg", services.pg_url(), &format!("{name}_src"))
                == rows("pg", services.pg_url(), &format!("{name}_pg"))
            {
                true => Ok(()),
                false => Err("the PostgreSQL replica has not reached the source table".into()),
            }
        },
    )
    .await;
    eprintln!("cdc: workload {done}");
    let expected = rows("pg", services.pg_url(), &format!("{name}_src"));
    assert!(!expected.is_empty(), "the workload left rows");
    assert_eq!(
        rows("pg", services.pg_url(), &format!("{name}_pg")),
        expected,
        "PostgreSQL replica"
    );
    assert_eq!(
        rows("mysql", services.mysql_url(), &format!("{name}_my")),
        expected,
        "MariaDB replica"
    );
    assert_eq!(
        applied_changelog(&job, &name, &topic, &last.log_text()),
        expected,
        "the Iceberg changelog, applied"
    );
    assert_eq!(
        iceberg_state(&job, &name),
        expected,
        "the Iceberg table kept by key (row deltas)"
    );
    let (_, prepared) = {
        let read = services.verify(
            "sql_table.py",
            &["pg", services.pg_url(), &format!("{name}_pg"), "id", &name],
        );
        ((), read["prepared"].clone())
    };
    assert_eq!(
        prepared,
        Value::Array(vec![]),
        "prepared transactions left behind"
    );
}

/// A transform in front of the replicas (`[[transforms]]`: every third key filtered out, `name` upper-cased,
/// the key and the change columns passed through by `SELECT * REPLACE`), under SIGKILL: each replica and the
/// Iceberg table kept by key equal the source table with the same filter and function applied, read by psycopg,
/// pymysql and Iceberg's Java library. A filter on the key keeps the replica a function of the source; the docs
/// say what a filter on a changing column means (a filtered change is not applied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtering_transform_in_front_of_the_replicas_applies_each_kept_change_once_under_sigkill()
 {
    let services = Services::get();
    let seed = seed();
    eprintln!("cdc transform: RATCHET_CHAOS_SEED={seed}");
    let mut rng = Rng(seed);
    let mut job = Job::new("cdcshape", 1, 1, "3s").await;
    let name = job.name.clone();
    let source = format!("public.{name}_src");
    services.cdc(&[
        "workload",
        "--table",
        &source,
        "--ops",
        "60",
        "--seed",
        &seed.to_string(),
        "--create",
    ]);
    let connector = DebeziumConnector::register(&name, &source, Converter::Json { schemas: true });
    let topic = connector.topic().to_string();
    let text = job_file(&name, &topic, &job.dir.path().join("warehouse"))
        + r#"
[[transforms]]
name = "kept"
sql = "SELECT * REPLACE (upper(name) AS name) FROM input WHERE id % 3 <> 0"
"#;
    std::fs::write(&job.config, text).unwrap();
    let checked = job.ratchet("check-config");
    assert!(
        checked.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let expected = || -> Vec<Value> {
        rows("pg", services.pg_url(), &format!("{name}_src"))
            .into_iter()
            .filter(|row| row[0].as_i64().unwrap() % 3 != 0)
            .map(|mut row| {
                if let Some(name) = row[1].as_str() {
                    row[1] = Value::from(name.to_uppercase());
                }
                row
            })
            .collect()
    };
    let worker = job.spawn_worker(&[]);
    let workload = {
        let source = source.clone();
        let seed = (seed + 1).to_string();
        std::thread::spawn(move || {
            Services::get().cdc(&[
                "workload", "--table", &source, "--ops", "400", "--seed", &seed,
            ])
        })
    };
    let (_, _last) = kill_during_then_settle(
        &mut job,
        worker,
        Chaos {
            kills: 2,
            pause_ms: (1000, 2000),
        },
        &mut rng,
        workload,
        Duration::from_secs(180),
        || match rows("pg", services.pg_url(), &format!("{name}_pg")) == expected() {
            true => Ok(()),
            false => Err("the PostgreSQL replica has not reached the filtered source".into()),
        },
    )
    .await;
    let expected = expected();
    assert!(!expected.is_empty(), "the workload left rows");
    assert_eq!(
        rows("pg", services.pg_url(), &format!("{name}_pg")),
        expected,
        "PostgreSQL replica"
    );
    assert_eq!(
        rows("mysql", services.mysql_url(), &format!("{name}_my")),
        expected,
        "MariaDB replica"
    );
    assert_eq!(
        iceberg_state(&job, &name),
        expected,
        "the Iceberg table kept by key"
    );
}

/// The CDC fidelity run: Debezium's PostgreSQL connector (precise decimals, the Avro converter through the
/// registry) on a table with the column types CDC users have and a TOASTed column under the default `REPLICA
/// IDENTITY`, a workload of primary-key changes, deletes and re-inserts in one transaction, updates to NULL, a swap
/// of unique values and a 5,000-row transaction, while `ratchet run` processes are killed with SIGKILL; replicas
/// made with the source's own DDL (PostgreSQL `xa_upsert`, MariaDB `upsert`) and an Iceberg table kept by key
/// (`upsert_key`) then equal the source value by value (`cdc_fidelity.py compare`), nothing left prepared. The job
/// is checked and started before the connector exists: it waits for the topic and the registry subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_types_toast_and_key_changes_reach_every_replica_value_by_value_under_sigkill() {
    fidelity(Converter::Avro).await;
}

/// The CDC fidelity run with Kafka Connect's JsonConverter (`schemas.enable`): each event's own schema says how
/// its values are written (precise decimals as base64 bytes, `timestamp(3)` in milliseconds, bytea in base64),
/// read into the job's declared columns exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_json_with_schemas_reaches_every_replica_value_by_value_under_sigkill() {
    fidelity(Converter::Json { schemas: true }).await;
}

/// The columns of `cdc_fidelity.py`'s table as a JSON Debezium job declares them.
const FIDELITY_FIELDS: &str = r#"[
    { name = "id", type = "int32", nullable = false },
    { name = "amount", type = "decimal(12, 2)" },
    { name = "exact", type = "decimal" },
    { name = "ts", type = "timestamptz" },
    { name = "ts3", type = "timestamp" },
    { name = "ts6", type = "timestamp" },
    { name = "day", type = "date" },
    { name = "clock", type = "time" },
    { name = "ref", type = "uuid" },
    { name = "doc", type = "json" },
    { name = "blob", type = "binary" },
    { name = "tags", type = "list", items = { type = "string" } },
    { name = "body", type = "string" },
    { name = "email", type = "string" },
]"#;

async fn fidelity(converter: Converter) {
    let services = Services::get();
    let ops = env_u64("RATCHET_CDC_OPS").unwrap_or(600);
    let kills = env_u64("RATCHET_CDC_KILLS").unwrap_or(3);
    let seed = seed();
    eprintln!(
        "cdc fidelity ({converter:?}): {ops} operations, {kills} kills, RATCHET_CHAOS_SEED={seed}"
    );
    let mut rng = Rng(seed);
    let mut job = Job::new("fidelity", 1, 1, "3s").await;
    let name = job.name.clone();
    let source = format!("public.{name}_src");
    services.verify(
        "cdc_fidelity.py",
        &["create", services.pg_url(), &source, "40"],
    );
    services.verify(
        "cdc_fidelity.py",
        &[
            "replicas",
            services.pg_url(),
            &format!("{name}_pg"),
            services.mysql_url(),
            &format!("{name}_my"),
        ],
    );
    // The job starts before the connector: no topic, no registry subject yet.
    let topic = DebeziumConnector::topic_of(&name, &source);
    let decoding = match converter {
        Converter::Avro => {
            let registry = services.registry();
            format!(
                "decoding = {{ kind = \"debezium\", converter = \"avro\" }}\n\n[source.registry]\nurl = \"{}/\"\n\
                 username = \"{}\"\npassword = \"{}\"",
                registry.url, registry.user, registry.password
            )
        }
        Converter::Json { schemas } => format!(
            "decoding = {{ kind = \"debezium\", converter = \"json\", schemas = {schemas}, fields = {FIDELITY_FIELDS} }}"
        ),
    };
    let warehouse = job.dir.path().join("warehouse");
    std::fs::write(
        &job.config,
        format!(
            r#"
[job]
name = "{name}"
checkpoint_interval = "1s"
lease = "3s"

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
{decoding}

[store]
kind = "postgres"
url = "{pg}"

[[sinks]]
type = "jdbc"
id = "replica"
url = "{pg}"
table = "{name}_pg"
mode = {{ kind = "xa_upsert", key = ["id"] }}

[[sinks]]
type = "jdbc"
id = "mariadb"
url = "{mysql}"
table = "{name}_my"
mode = {{ kind = "upsert", key = ["id"] }}

[[sinks]]
type = "iceberg"
id = "lake"
catalog = {{ kind = "sql", uri = "{pg}", warehouse = "file://{warehouse}" }}
table = "{name}.state"
create_table = true
upsert_key = ["id"]
"#,
            bootstrap = services.kafka_bootstrap(),
            pg = services.pg_url(),
            mysql = services.mysql_url(),
            warehouse = warehouse.display(),
        ),
    )
    .unwrap();
    let checked = job.ratchet("check-config");
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(
        checked.status.success() && said.contains("does not exist yet: `ratchet run` waits for it"),
        "check-config before the connector:\n{said}\n{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let worker = job.spawn_worker(&[]);
    worker.wait_logged(
        "the change stream does not exist yet: waiting for it",
        1,
        Duration::from_secs(60),
    );
    let _connector = DebeziumConnector::register_with(
        &name,
        &source,
        converter,
        &[("decimal.handling.mode", "precise")],
    );
    let workload = {
        let (source, seed) = (source.clone(), (seed + 1).to_string());
        std::thread::spawn(move || {
            let services = Services::get();
            services.verify(
                "cdc_fidelity.py",
                &[
                    "workload",
                    services.pg_url(),
                    &source,
                    &seed,
                    &ops.to_string(),
                ],
            )
        })
    };
    let compare = |all: bool| {
        let services = Services::get();
        let (pg_table, my_table, state) = (
            format!("{name}_pg"),
            format!("{name}_my"),
            format!("{name}.state"),
        );
        let uri = services
            .pg_url()
            .replacen("postgres://", "postgresql+psycopg://", 1);
        let warehouse = format!("file://{}", warehouse.display());
        let mut args = vec![
            "compare",
            services.pg_url(),
            source.as_str(),
            services.pg_url(),
            pg_table.as_str(),
        ];
        if all {
            args.extend([
                services.mysql_url(),
                my_table.as_str(),
                uri.as_str(),
                warehouse.as_str(),
                state.as_str(),
            ]);
        }
        services.verify("cdc_fidelity.py", &args)
    };
    let (done, last) = kill_during_then_settle(
        &mut job,
        worker,
        Chaos {
            kills,
            pause_ms: (1500, 3000),
        },
        &mut rng,
        workload,
        Duration::from_secs(240),
        || {
            // The source no longer changes: the PostgreSQL replica catches up with the connector's last change.
            let compared = compare(false);
            match compared["pg"]["mismatch_count"] == 0 {
                true => Ok(()),
                false => Err(format!(
                    "the PostgreSQL replica has not reached the source: {compared}"
                )),
            }
        },
    )
    .await;
    eprintln!("cdc fidelity: workload {done}");
    let compared = compare(true);
    assert!(
        compared["source_rows"].as_u64().unwrap() > 5000,
        "{compared}"
    );
    for replica in ["pg", "mysql", "iceberg"] {
        assert_eq!(
            compared[replica]["mismatch_count"],
            0,
            "{replica} differs from the source: {}\n{}",
            compared[replica],
            last.log_text()
        );
    }
    let prepared = services.verify(
        "sql_table.py",
        &["pg", services.pg_url(), &format!("{name}_pg"), "id", &name],
    )["prepared"]
        .clone();
    assert_eq!(
        prepared,
        Value::Array(vec![]),
        "prepared transactions left behind"
    );
}

/// The columns the column-adding test's source table ends with.
const GROWN_COLUMNS: [&str; 4] = ["id", "name", "qty", "tag"];

/// Columns added to the captured table while the job runs (Debezium's Avro converter registers a new version of
/// the envelope at the first event after each `ALTER TABLE .. ADD COLUMN`), every sink with `evolution =
/// "evolve"`: the worker is killed at the first change before any sink took it, and at the second after the
/// first sink did; each restart opens on the latest version and the sinks add what their tables lack. Then a
/// column's type is widened (`ALTER COLUMN qty TYPE bigint`) while the last process runs: every replica widens it.
/// The PostgreSQL replica (`xa_upsert`), the MariaDB replica (`upsert`) and the Iceberg table kept by key then equal
/// the source row for row, the new columns included (null where the row predates them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_columns_added_while_running_reach_every_replica_across_kills() {
    let services = Services::get();
    let mut job = Job::new("cdcgrow", 1, 1, "3s").await;
    let name = job.name.clone();
    let source = format!("public.{name}_src");
    services.psql(&format!(
        "CREATE TABLE {source} (id int PRIMARY KEY, name text); \
         INSERT INTO {source} SELECT i, 'n' || i FROM generate_series(1, 20) i"
    ));
    let topic = DebeziumConnector::topic_of(&name, &source);
    let registry = services.registry();
    let warehouse = job.dir.path().join("warehouse");
    std::fs::write(
        &job.config,
        format!(
            r#"
[job]
name = "{name}"
checkpoint_interval = "1s"
lease = "3s"

[source]
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
decoding = {{ kind = "debezium", converter = "avro" }}

[source.registry]
url = "{registry_url}/"
username = "{user}"
password = "{password}"

[store]
kind = "postgres"
url = "{pg}"

[[sinks]]
type = "jdbc"
id = "replica"
url = "{pg}"
table = "{name}_pg"
create_table = true
evolution = "evolve"
mode = {{ kind = "xa_upsert", key = ["id"] }}

[[sinks]]
type = "jdbc"
id = "mariadb"
url = "{mysql}"
table = "{name}_my"
create_table = true
evolution = "evolve"
mode = {{ kind = "upsert", key = ["id"] }}

[[sinks]]
type = "iceberg"
id = "lake"
catalog = {{ kind = "sql", uri = "{pg}", warehouse = "file://{warehouse}" }}
table = "{name}.state"
create_table = true
evolution = "evolve"
upsert_key = ["id"]
"#,
            bootstrap = services.kafka_bootstrap(),
            pg = services.pg_url(),
            mysql = services.mysql_url(),
            registry_url = registry.url,
            user = registry.user,
            password = registry.password,
            warehouse = warehouse.display(),
        ),
    )
    .unwrap();
    let _connector = DebeziumConnector::register(&name, &source, Converter::Avro);
    // Whether the replica has `column` and a row where `filter` holds (polled: both appear as the job goes on).
    let replica_rows = |column: &str, filter: &str| {
        let services = Services::get();
        services
            .psql(&format!(
                "SELECT count(*) FROM information_schema.columns WHERE table_name = '{name}_pg' \
                 AND column_name = '{column}'"
            ))
            .trim()
            == "1"
            && services
                .psql(&format!("SELECT count(*) FROM {name}_pg WHERE {filter}"))
                .trim()
                != "0"
    };
    let wait_for = |what: &str, ready: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !ready() {
            assert!(Instant::now() < deadline, "{what} within 90 s");
            std::thread::sleep(Duration::from_millis(300));
        }
    };

    // The first column: killed before any sink took it.
    let mut worker = job.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", "before-evolve:1")]);
    wait_for("the snapshot in the replica", &|| {
        replica_rows("id", "id = 20")
    });
    services.psql(&format!(
        "ALTER TABLE {source} ADD COLUMN qty int; UPDATE {source} SET qty = id * 10 WHERE id <= 5; \
         INSERT INTO {source} SELECT i, 'n' || i, i * 10 FROM generate_series(21, 30) i"
    ));
    worker.wait_killed(Duration::from_secs(90));
    assert!(
        worker.log_text().contains("the source's schema changed"),
        "{}",
        worker.log_text()
    );

    // The second: killed after the first sink took it (the restart opened on the version with `qty`).
    let mut worker = job.spawn_worker_with_env(&[], &[("RATCHET_KILL_AT", "after-evolve:1")]);
    wait_for("the rows with qty in the replica", &|| {
        replica_rows("qty", "id = 30 AND qty = 300")
    });
    services.psql(&format!(
        "ALTER TABLE {source} ADD COLUMN tag text; UPDATE {source} SET tag = 't' || id WHERE id % 3 = 0; \
         DELETE FROM {source} WHERE id = 2; INSERT INTO {source} VALUES (31, 'n31', 310, 't31')"
    ));
    worker.wait_killed(Duration::from_secs(90));

    let mut last = job.spawn_worker(&[]);
    wait_for("the last insert in the replica", &|| {
        replica_rows("tag", "id = 31")
    });
    last.stop(Duration::from_secs(60));

    let read = |kind: &str, url: &str, table: &str| {
        let mut args = vec![kind, url, table, "id"];
        args.extend(GROWN_COLUMNS);
        Services::get().verify("sql_rows.py", &args)["rows"]
            .as_array()
            .unwrap()
            .clone()
    };
    let expected_grown = read("pg", services.pg_url(), &source);
    assert_eq!(expected_grown.len(), 30, "{expected_grown:?}");
    assert_eq!(
        read("pg", services.pg_url(), &format!("{name}_pg")),
        expected_grown
    );
    assert_eq!(
        read("mysql", services.mysql_url(), &format!("{name}_my")),
        expected_grown
    );
    let lake = read_table(&job, &format!("{name}.state"), &["--rows"]);
    let names: Vec<&str> = lake["column_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let positions: Vec<usize> = GROWN_COLUMNS
        .iter()
        .map(|c| names.iter().position(|n| n == c).unwrap())
        .collect();
    let mut iceberg: Vec<Value> = lake["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            Value::from(
                positions
                    .iter()
                    .map(|p| row[*p].clone())
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    iceberg.sort_by_key(|row| row[0].as_i64());
    assert_eq!(
        Value::from(iceberg),
        Value::from(expected_grown.clone()),
        "Iceberg"
    );
}
