//! Shared by the JDBC sink's tests: the test databases, sink configs, and the independent verifier.
#![allow(dead_code)] // each test binary uses its part

use std::time::Duration;

use connector_api::{Driver, DriverConfig, LocalCheckpointStore, SinkHandle, SinkId, SubtaskId};
use jdbc_sink::{ConnectionConfig, JdbcSink, JdbcSinkConfig, WriteMode};
use ratchet_conformance::conformance_schema;
use test_support::Services;

/// One of the two test databases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Postgres,
    MariaDb,
}

impl Db {
    pub fn url(self) -> String {
        let services = Services::get();
        match self {
            Db::Postgres => services.pg_url().to_string(),
            Db::MariaDb => services.mysql_url().to_string(),
        }
    }

    fn verifier_kind(self) -> &'static str {
        match self {
            Db::Postgres => "pg",
            Db::MariaDb => "mysql",
        }
    }
}

/// A short name derived from `parts` (table names and scopes; MySQL XA ids allow 64 bytes in all).
pub fn short_name(prefix: &str, parts: &[&str]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parts.join("/").bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{prefix}{:012x}", hash & 0xffff_ffff_ffff)
}

/// A sink config for the conformance schema, writing table `table` under scope `scope`.
pub fn config(
    db: Db,
    sink: &SinkId,
    subtask: u32,
    table: &str,
    scope: &str,
    mode: WriteMode,
) -> JdbcSinkConfig {
    JdbcSinkConfig {
        sink: sink.clone(),
        scope: SinkId::new(scope).unwrap().into(),
        subtask: SubtaskId(subtask),
        schema: conformance_schema(),
        connection: ConnectionConfig::new(db.url()),
        table: table.to_string(),
        mode,
        create_table: true,
        evolution: connector_api::Evolution::None,
        lock_timeout: Duration::from_secs(1),
    }
}

/// What the independent verifier (psycopg / pymysql) reads: the `id` column of every committed row, and the
/// prepared transactions of `scopes` still on the server.
pub fn read(db: Db, table: &str, scopes: &[&str]) -> (Vec<i64>, Vec<String>) {
    let url = db.url();
    let mut args = vec![db.verifier_kind(), url.as_str(), table, "id"];
    args.extend_from_slice(scopes);
    let out = Services::get().verify("sql_table.py", &args);
    let ids = out["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_i64().expect("integer id"))
        .collect();
    let prepared = out["prepared"]
        .as_array()
        .expect("prepared")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    (ids, prepared)
}

/// Runs `statements` with the database's own command-line client (psql / mariadb), an independent session, and
/// returns its tab-separated output.
pub fn cli(db: Db, statements: &str) -> String {
    match db {
        Db::Postgres => Services::get().psql(statements),
        Db::MariaDb => {
            let url = url::Url::parse(&db.url()).expect("mysql url");
            let out = std::process::Command::new("mariadb")
                .args([
                    "--no-defaults",
                    "-h",
                    url.host_str().unwrap(),
                    "-P",
                    &url.port().unwrap().to_string(),
                    "-u",
                    url.username(),
                    &format!("-p{}", url.password().unwrap_or("")),
                    "-N",
                    "-B",
                    url.path().trim_start_matches('/'),
                    "-e",
                    statements,
                ])
                .output()
                .unwrap_or_else(|e| panic!("cannot run the mariadb client: {e}"));
            assert!(
                out.status.success(),
                "mariadb {statements:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }
    }
}

/// A driver over the checkpoint directory `state` with one JDBC sink in xa mode for `subtask`.
pub async fn xa_driver(
    db: Db,
    sink: &SinkId,
    subtask: u32,
    table: &str,
    scope: &str,
    state: &std::path::Path,
) -> (Driver<LocalCheckpointStore>, SinkHandle) {
    sink_driver(db, sink, subtask, table, scope, state, WriteMode::Xa).await
}

/// A driver over the checkpoint directory `state` with one JDBC sink in `mode` for `subtask`.
pub async fn sink_driver(
    db: Db,
    sink: &SinkId,
    subtask: u32,
    table: &str,
    scope: &str,
    state: &std::path::Path,
    mode: WriteMode,
) -> (Driver<LocalCheckpointStore>, SinkHandle) {
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state, 3).unwrap(),
        DriverConfig::default(),
    );
    let jdbc = JdbcSink::new(config(db, sink, subtask, table, scope, mode))
        .await
        .unwrap();
    let handle = driver.add_sink(jdbc).unwrap();
    (driver, handle)
}

/// Creates `table (id <bigint> PRIMARY KEY, payload <text>)` with the database's client.
pub fn create_keyed_table(db: Db, table: &str) {
    let columns = match db {
        Db::Postgres => "id bigint PRIMARY KEY, payload text",
        Db::MariaDb => "id BIGINT PRIMARY KEY, payload LONGTEXT",
    };
    cli(db, &format!("CREATE TABLE {table} ({columns})"));
}
