//! The JDBC sink from a job file's `[[sinks]]` entry through the registry, on PostgreSQL over verified TLS and on
//! MariaDB, with the password taken from the environment (`password_env`, never printed), checked with the
//! independent verifier; misspelt keys and a missing password variable are refused naming the key or variable.

use crate::common;

use common::{Db, read, short_name};
use connector_api::{ErrorKind, SinkRegistry, SinkSpec, SubtaskId};
use jdbc_sink::JdbcSinkFactory;
use ratchet_conformance::{conformance_schema, run_one_checkpoint};
use test_support::Services;

/// The variable `scripts/services.sh env` exports with the test databases' password.
const PASSWORD_VARIABLE: &str = "RATCHET_DB_PASSWORD";

fn registry() -> SinkRegistry {
    let mut registry = SinkRegistry::new();
    registry.register(JdbcSinkFactory);
    registry
}

/// `url` without its password.
fn without_password(url: &str) -> String {
    let mut parsed = url::Url::parse(url).unwrap();
    parsed.set_password(None).unwrap();
    parsed.to_string()
}

async fn job_file_round_trip(db: Db) {
    let password = std::env::var(PASSWORD_VARIABLE).unwrap_or_else(|_| {
        panic!("{PASSWORD_VARIABLE} is not set: run through scripts/test.sh or eval \"$(scripts/services.sh env)\"")
    });
    let table = short_name(
        "job_",
        &[&test_support::unique_name("factory"), &format!("{db:?}")],
    );
    let url = match db {
        Db::Postgres => format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            without_password(&db.url()),
            Services::get().var("RATCHET_TLS_CA")
        ),
        Db::MariaDb => without_password(&db.url()),
    };
    let spec: SinkSpec = toml::from_str(&format!(
        r#"
        type = "jdbc"
        id = "orders-db"
        url = "{url}"
        password_env = "{PASSWORD_VARIABLE}"
        table = "{table}"
        scope = "{table}"
        create_table = true
        mode = {{ kind = "upsert", key = ["id"] }}
        "#
    ))
    .unwrap();
    let sink = registry()
        .build(&spec, None, SubtaskId(0), conformance_schema())
        .await
        .unwrap();
    let shown = format!("{sink:?} {spec:?}");
    assert!(!shown.contains(&format!(":{password}@")), "{shown}");

    run_one_checkpoint(sink, 25).await;

    let (mut ids, _) = read(db, &table, &[&table]);
    ids.sort_unstable();
    assert_eq!(ids, (0..25).collect::<Vec<_>>(), "{db:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_file_entry_writes_through_the_registry_on_both_databases() {
    job_file_round_trip(Db::Postgres).await;
    job_file_round_trip(Db::MariaDb).await;
}

#[tokio::test]
async fn misspelt_keys_and_missing_password_variables_are_refused_by_name() {
    let spec: SinkSpec = toml::from_str(
        r#"
        type = "jdbc"
        id = "orders-db"
        url = "postgres://ratchet@127.0.0.1:1/ratchet"
        tabel = "orders"
        "#,
    )
    .unwrap();
    let err = registry()
        .build(&spec, None, SubtaskId(0), conformance_schema())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(err.to_string().contains("tabel"), "{err}");

    let spec: SinkSpec = toml::from_str(
        r#"
        type = "jdbc"
        id = "orders-db"
        url = "mysql://ratchet@127.0.0.1:1/ratchet"
        password_env = "RATCHET_TEST_NO_SUCH_VARIABLE"
        table = "orders"
        "#,
    )
    .unwrap();
    let err = registry()
        .build(&spec, None, SubtaskId(0), conformance_schema())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert!(
        err.to_string().contains("RATCHET_TEST_NO_SUCH_VARIABLE"),
        "{err}"
    );
}
