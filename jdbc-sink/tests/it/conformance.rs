//! The conformance harness on the JDBC sink against the real PostgreSQL and MariaDB servers, in the xa mode
//! (prepared transactions) and the idempotent modes (upsert; append with a dedup table), verified
//! from Python (psycopg, pymysql) reading committed rows and the servers' prepared-transaction lists.

use crate::common;

use async_trait::async_trait;
use common::{Db, config, read, short_name};
use connector_api::{Result, SinkId, SubtaskId};
use jdbc_sink::{DedupConfig, JdbcSink, WriteMode};
use ratchet_conformance::{Conformance, ConformanceTarget, run_conformance};

struct Table {
    db: Db,
    mode: WriteMode,
}

fn names(run: &str, sink: &SinkId) -> (String, String) {
    (
        short_name("conf_", &[run, sink.as_str()]),
        short_name("c", &[run, sink.as_str()]),
    )
}

#[async_trait]
impl ConformanceTarget for Table {
    type Sink = JdbcSink;

    async fn create_sink(&self, run: &str, sink: &SinkId, subtask: SubtaskId) -> Result<JdbcSink> {
        let (table, scope) = names(run, sink);
        JdbcSink::new(config(
            self.db,
            sink,
            subtask.0,
            &table,
            &scope,
            self.mode.clone(),
        ))
        .await
    }

    async fn visible_ids(&self, run: &str, sink: &SinkId) -> Result<Vec<i64>> {
        let (table, scope) = names(run, sink);
        let db = self.db;
        Ok(
            tokio::task::spawn_blocking(move || read(db, &table, &[&scope]).0)
                .await
                .unwrap(),
        )
    }

    async fn leftovers(&self, run: &str, sink: &SinkId) -> Result<Vec<String>> {
        let (table, scope) = names(run, sink);
        let db = self.db;
        Ok(
            tokio::task::spawn_blocking(move || read(db, &table, &[&scope]).1)
                .await
                .unwrap(),
        )
    }
}

fn upsert() -> WriteMode {
    WriteMode::Upsert {
        key: vec!["id".into()],
    }
}

fn idempotent() -> Conformance {
    Conformance {
        visible_at_pre_commit: true,
        ..Conformance::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_xa_passes_the_conformance_harness() {
    let target = Table {
        db: Db::Postgres,
        mode: WriteMode::Xa,
    };
    run_conformance(
        "jdbc-sink xa on PostgreSQL",
        &target,
        &Conformance::default(),
    )
    .await
    .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_upsert_passes_the_conformance_harness() {
    let target = Table {
        db: Db::Postgres,
        mode: upsert(),
    };
    run_conformance("jdbc-sink upsert on PostgreSQL", &target, &idempotent())
        .await
        .assert_passed();
}

fn dedup_append() -> WriteMode {
    WriteMode::Append {
        dedup: DedupConfig {
            message_id: "id".into(),
            table: None,
            retention: std::time::Duration::from_secs(3600),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dedup_append_passes_the_conformance_harness() {
    let target = Table {
        db: Db::Postgres,
        mode: dedup_append(),
    };
    run_conformance(
        "jdbc-sink dedup append on PostgreSQL",
        &target,
        &idempotent(),
    )
    .await
    .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_dedup_append_passes_the_conformance_harness() {
    let target = Table {
        db: Db::MariaDb,
        mode: dedup_append(),
    };
    run_conformance("jdbc-sink dedup append on MariaDB", &target, &idempotent())
        .await
        .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_xa_passes_the_conformance_harness() {
    let target = Table {
        db: Db::MariaDb,
        mode: WriteMode::Xa,
    };
    run_conformance("jdbc-sink xa on MariaDB", &target, &Conformance::default())
        .await
        .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_upsert_passes_the_conformance_harness() {
    let target = Table {
        db: Db::MariaDb,
        mode: upsert(),
    };
    run_conformance("jdbc-sink upsert on MariaDB", &target, &idempotent())
        .await
        .assert_passed();
}
