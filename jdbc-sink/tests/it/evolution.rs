//! Schema evolution against PostgreSQL and MariaDB, read back with psql and mariadb. `evolution = "add-columns"`:
//! at a checkpoint boundary the sink adds the new column (`ALTER TABLE .. ADD COLUMN IF NOT EXISTS`) before any
//! row of it is written, in xa and upsert mode; an instance still on the old schema goes on writing into the
//! evolved table; a sink opening with a schema the table lacks adds the column, or with `evolution = "none"`
//! refuses naming it. `evolution = "evolve"`: a column widened and made nullable at the boundary while a killed
//! instance's prepared transaction holds the table; a PostgreSQL array column's items widened (`integer[]` to
//! `bigint[]`).

use crate::common;

use std::sync::Arc;

use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use common::{Db, cli, config, short_name};
use connector_api::{
    Driver, DriverConfig, ErrorKind, Evolution, LocalCheckpointStore, SinkId, SourceOffset,
};
use jdbc_sink::{JdbcSink, JdbcSinkConfig, WriteMode};
use ratchet_conformance::conformance_schema;

/// The conformance schema with a nullable `qty` (Int64) added.
fn with_qty() -> SchemaRef {
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("qty", DataType::Int64, true));
    Arc::new(Schema::new(fields))
}

/// Rows `ids` of `schema` (`payload` = "p<id>", `qty` = id when the schema has it).
fn rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let mut columns: Vec<arrow_array::ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(ids.clone())),
        Arc::new(StringArray::from_iter_values(
            ids.clone().map(|i| format!("p{i}")),
        )),
    ];
    if schema.fields().len() == 3 {
        columns.push(Arc::new(Int64Array::from_iter_values(ids)));
    }
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

fn positions(next: i64) -> Vec<SourceOffset> {
    vec![SourceOffset {
        topic: "t".into(),
        partition: 0,
        next_offset: next,
        topic_id: None,
    }]
}

fn sink_config(db: Db, unique: &str, mode: WriteMode, evolution: Evolution) -> JdbcSinkConfig {
    let sink = SinkId::new("evolving").unwrap();
    JdbcSinkConfig {
        evolution,
        ..config(
            db,
            &sink,
            0,
            &short_name("evolve_", &[unique]),
            &short_name("e", &[unique]),
            mode,
        )
    }
}

async fn evolves_at_a_checkpoint_boundary(db: Db, mode: WriteMode) {
    let unique = test_support::unique_name("jdbc-evolve");
    let config = sink_config(db, &unique, mode, Evolution::AddColumns);
    let table = config.table.clone();
    let state = tempfile::tempdir().unwrap();
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state.path(), 3).unwrap(),
        DriverConfig::default(),
    );
    let sink = driver
        .add_sink(JdbcSink::new(config.clone()).await.unwrap())
        .unwrap();
    driver.start().await.unwrap();
    driver
        .write(sink, &rows(&conformance_schema(), 0..3))
        .await
        .unwrap();
    driver.checkpoint(positions(3)).await.unwrap();
    let has_qty = || {
        cli(
            db,
            &format!(
                "SELECT count(*) FROM information_schema.columns WHERE table_name = '{table}' AND column_name = 'qty'"
            ),
        )
    };
    assert_eq!(has_qty(), "0", "no qty column before the change");

    driver.evolve(&[sink], with_qty()).await.unwrap();
    // The column is there before any row of the new schema is written (and the old rows read as null).
    assert_eq!(
        cli(db, &format!("SELECT count(*), count(qty) FROM {table}")).replace('\t', "|"),
        "3|0"
    );
    driver.write(sink, &rows(&with_qty(), 3..6)).await.unwrap();
    driver.checkpoint(positions(6)).await.unwrap();

    // Another instance still on the old schema writes into the evolved table (its rows: null qty).
    let old = JdbcSinkConfig {
        subtask: connector_api::SubtaskId(1),
        ..config.clone()
    };
    let state_old = tempfile::tempdir().unwrap();
    let mut other = Driver::new(
        LocalCheckpointStore::open(state_old.path(), 3).unwrap(),
        DriverConfig::default(),
    );
    let old_sink = other.add_sink(JdbcSink::new(old).await.unwrap()).unwrap();
    other.start().await.unwrap();
    other
        .write(old_sink, &rows(&conformance_schema(), 6..8))
        .await
        .unwrap();
    other.checkpoint(positions(8)).await.unwrap();
    other.close().await.unwrap();
    driver.close().await.unwrap();

    assert_eq!(
        cli(
            db,
            &format!(
                "SELECT count(*), sum(CASE WHEN qty = id THEN 1 ELSE 0 END), \
                 sum(CASE WHEN qty IS NULL AND (id < 3 OR id >= 6) THEN 1 ELSE 0 END) FROM {table}"
            )
        )
        .replace('\t', "|"),
        "8|3|5"
    );
    let (ids, prepared) = common::read(db, &table, &[config.scope.as_str()]);
    assert_eq!(ids.len(), 8);
    assert!(prepared.is_empty(), "{prepared:?}");
}

#[tokio::test]
async fn postgres_xa_adds_the_column_at_the_boundary() {
    evolves_at_a_checkpoint_boundary(Db::Postgres, WriteMode::Xa).await;
}

#[tokio::test]
async fn mariadb_xa_adds_the_column_at_the_boundary() {
    evolves_at_a_checkpoint_boundary(Db::MariaDb, WriteMode::Xa).await;
}

#[tokio::test]
async fn postgres_upsert_adds_the_column_at_the_boundary() {
    let key = vec!["id".to_string()];
    evolves_at_a_checkpoint_boundary(Db::Postgres, WriteMode::Upsert { key }).await;
}

#[tokio::test]
async fn mariadb_upsert_adds_the_column_at_the_boundary() {
    let key = vec!["id".to_string()];
    evolves_at_a_checkpoint_boundary(Db::MariaDb, WriteMode::Upsert { key }).await;
}

#[tokio::test]
async fn a_table_lacking_a_column_is_extended_at_open_or_refused_without_evolution() {
    for db in [Db::Postgres, Db::MariaDb] {
        let unique = test_support::unique_name("jdbc-evolve-open");
        // The table as an earlier schema made it.
        let old = sink_config(db, &unique, WriteMode::Xa, Evolution::None);
        drop(JdbcSink::new(old.clone()).await.unwrap());

        let refused = JdbcSink::new(JdbcSinkConfig {
            schema: with_qty(),
            ..old.clone()
        })
        .await
        .unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Config, "{refused}");
        assert!(refused.to_string().contains(&old.table), "{refused}");

        JdbcSink::new(JdbcSinkConfig {
            schema: with_qty(),
            evolution: Evolution::AddColumns,
            ..old.clone()
        })
        .await
        .unwrap();
        assert_eq!(
            cli(db, &format!("SELECT count(qty) FROM {}", old.table)),
            "0"
        );

        // A running sink with evolution = "none" refuses the change, naming the column and the setting.
        let state = tempfile::tempdir().unwrap();
        let mut driver = Driver::new(
            LocalCheckpointStore::open(state.path(), 3).unwrap(),
            DriverConfig::default(),
        );
        let sink = driver
            .add_sink(JdbcSink::new(old.clone()).await.unwrap())
            .unwrap();
        driver.start().await.unwrap();
        let grown = Schema::new(
            with_qty()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .chain([Field::new("tag", DataType::Utf8, true)])
                .collect::<Vec<_>>(),
        );
        let err = driver.evolve(&[sink], Arc::new(grown)).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("tag") && text.contains("add-columns"),
            "{text}"
        );
    }
}

/// The conformance schema with `qty` as each side of the widening types it.
fn with_qty_typed(qty: DataType, nullable: bool) -> SchemaRef {
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("qty", qty, nullable));
    Arc::new(Schema::new(fields))
}

/// Rows `ids` of `schema`: `qty` the id as an int, or, widened, the id times ten billion and null for odd ids.
fn typed_rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let base = rows(&conformance_schema(), ids.clone());
    let qty: arrow_array::ArrayRef = match schema.field(2).data_type() {
        DataType::Int32 => Arc::new(arrow_array::Int32Array::from_iter_values(
            ids.map(|i| i as i32),
        )),
        _ => Arc::new(Int64Array::from_iter(
            ids.map(|i| (i % 2 == 0).then_some(i * 10_000_000_000)),
        )),
    };
    let mut columns = base.columns().to_vec();
    columns.push(qty);
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

/// A driver of the sink `config`, crashing after its checkpoint record is durable when `crash` (its prepared
/// transaction stays on the server, holding the table).
async fn evolving_driver(
    config: JdbcSinkConfig,
    state: &std::path::Path,
    crash: bool,
) -> (Driver<LocalCheckpointStore>, connector_api::SinkHandle) {
    let crashes: connector_api::FaultInjector = Arc::new(
        move |_: connector_api::CheckpointId, point: &connector_api::FaultPoint| {
            crash && matches!(point, connector_api::FaultPoint::AfterRecordDurable)
        },
    );
    let mut driver = Driver::new(
        LocalCheckpointStore::open(state, 3).unwrap(),
        DriverConfig::default(),
    )
    .with_fault_injector(crashes);
    let sink = driver
        .add_sink(JdbcSink::new(config).await.unwrap())
        .unwrap();
    driver.start().await.unwrap();
    (driver, sink)
}

/// `evolution = "evolve"` on a table the user made (`qty integer NOT NULL`; on MariaDB with a default and a comment):
/// at a checkpoint boundary the sink widens `qty` to bigint and lets it take nulls, while a killed instance's
/// prepared transaction still holds the table: the change waits (each try bounded by `lock_timeout`, retried by
/// the driver) until that instance's recovery commits it. Every row once with its own value; MariaDB keeps the
/// column's default and comment; the primary key keeps NOT NULL though the batches' `id` admits null.
async fn widens_at_a_checkpoint_boundary(db: Db) {
    let unique = test_support::unique_name("jdbc-widen");
    let narrow = with_qty_typed(DataType::Int32, false);
    // `id` nullable in the batches too: the table's primary key keeps NOT NULL all the same.
    let wide = Arc::new(Schema::new(
        with_qty_typed(DataType::Int64, true)
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let config = JdbcSinkConfig {
        schema: narrow.clone(),
        ..sink_config(db, &unique, WriteMode::Xa, Evolution::Evolve)
    };
    let table = config.table.clone();
    cli(
        db,
        &match db {
            Db::Postgres => format!(
                "CREATE TABLE {table} (id bigint PRIMARY KEY, payload text NOT NULL, qty integer NOT NULL)"
            ),
            Db::MariaDb => format!(
                "CREATE TABLE {table} (id BIGINT PRIMARY KEY, payload LONGTEXT NOT NULL, \
                 qty INT NOT NULL DEFAULT 0 COMMENT 'the order''s count')"
            ),
        },
    );
    let killed_config = JdbcSinkConfig {
        subtask: connector_api::SubtaskId(1),
        ..config.clone()
    };
    let killed_state = tempfile::tempdir().unwrap();
    let (mut killed, killed_sink) =
        evolving_driver(killed_config.clone(), killed_state.path(), true).await;
    killed
        .write(killed_sink, &typed_rows(&narrow, 10..12))
        .await
        .unwrap();
    let crashed = killed.checkpoint(positions(12)).await.unwrap_err();
    assert!(crashed.to_string().contains("injected crash"), "{crashed}");
    drop(killed);

    let state = tempfile::tempdir().unwrap();
    let (mut driver, sink) = evolving_driver(config.clone(), state.path(), false).await;
    driver
        .write(sink, &typed_rows(&narrow, 0..3))
        .await
        .unwrap();
    driver.checkpoint(positions(3)).await.unwrap();
    // The killed instance comes back after a few lock timeouts: its recovery commits the prepared transaction.
    let recovery = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let (recovered, _) = evolving_driver(killed_config, killed_state.path(), false).await;
        recovered.close().await.unwrap();
    });
    driver.evolve(&[sink], wide.clone()).await.unwrap();
    recovery.await.unwrap();
    driver.write(sink, &typed_rows(&wide, 3..6)).await.unwrap();
    driver.checkpoint(positions(6)).await.unwrap();
    driver.close().await.unwrap();

    let values = cli(
        db,
        &format!("SELECT id, COALESCE(CAST(qty AS CHAR(20)), 'null') FROM {table} ORDER BY id")
            .replace(
                "CHAR(20)",
                if db == Db::Postgres {
                    "text"
                } else {
                    "CHAR(20)"
                },
            ),
    );
    assert_eq!(
        values.replace('\t', "|"),
        "0|0\n1|1\n2|2\n3|null\n4|40000000000\n5|null\n10|10\n11|11"
    );
    let column = match db {
        Db::Postgres => cli(
            db,
            &format!(
                "SELECT data_type, is_nullable FROM information_schema.columns \
                 WHERE table_name = '{table}' AND column_name = 'qty'"
            ),
        ),
        Db::MariaDb => cli(
            db,
            &format!(
                "SELECT COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, COLUMN_COMMENT FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' AND COLUMN_NAME = 'qty'"
            ),
        ),
    };
    let expected = match db {
        Db::Postgres => "bigint|YES",
        Db::MariaDb => "bigint(20)|YES|0|the order's count",
    };
    assert_eq!(column.replace('\t', "|"), expected);
    let (mut ids, prepared) = common::read(db, &table, &[config.scope.as_str()]);
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5, 10, 11]);
    assert!(prepared.is_empty(), "{prepared:?}");
}

#[tokio::test]
async fn postgres_widens_the_column_while_a_prepared_transaction_holds_the_table() {
    widens_at_a_checkpoint_boundary(Db::Postgres).await;
}

#[tokio::test]
async fn mariadb_widens_the_column_while_a_prepared_transaction_holds_the_table() {
    widens_at_a_checkpoint_boundary(Db::MariaDb).await;
}

/// The conformance schema with `counts`, a nullable list of `item`.
fn with_counts(item: DataType) -> SchemaRef {
    let mut fields: Vec<Field> = conformance_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new_list(
        "counts",
        Field::new_list_field(item, true),
        true,
    ));
    Arc::new(Schema::new(fields))
}

/// Rows `ids` of `schema`: `counts` = [id, null, id * 10^10 when the items are wide], null for id 4.
fn counted_rows(schema: &SchemaRef, ids: std::ops::Range<i64>) -> RecordBatch {
    let base = rows(&conformance_schema(), ids.clone());
    let wide = matches!(schema.field(2).data_type(), DataType::List(item) if item.data_type() == &DataType::Int64);
    let counts: arrow_array::ArrayRef = if wide {
        let mut list =
            arrow_array::builder::ListBuilder::new(arrow_array::builder::Int64Builder::new());
        for i in ids {
            if i == 4 {
                list.append_null();
                continue;
            }
            list.values().append_value(i);
            list.values().append_null();
            list.values().append_value(i * 10_000_000_000);
            list.append(true);
        }
        Arc::new(list.finish())
    } else {
        let mut list =
            arrow_array::builder::ListBuilder::new(arrow_array::builder::Int32Builder::new());
        for i in ids {
            list.values().append_value(i as i32);
            list.values().append_null();
            list.append(true);
        }
        Arc::new(list.finish())
    };
    let mut columns = base.columns().to_vec();
    columns.push(counts);
    RecordBatch::try_new(schema.clone(), columns).unwrap()
}

/// `evolution = "evolve"`: a list of int32 widened to a list of int64 widens the table's array column
/// (`integer[]` to `bigint[]`, each item cast) at a checkpoint boundary: the rows before keep their items, the rows
/// after carry items beyond int32, read back by psql.
#[tokio::test]
async fn postgres_widens_an_array_column_s_items() {
    let unique = test_support::unique_name("jdbc-widen-array");
    let narrow = with_counts(DataType::Int32);
    let wide = with_counts(DataType::Int64);
    let config = JdbcSinkConfig {
        schema: narrow.clone(),
        create_table: true,
        ..sink_config(Db::Postgres, &unique, WriteMode::Xa, Evolution::Evolve)
    };
    let table = config.table.clone();
    let state = tempfile::tempdir().unwrap();
    let (mut driver, sink) = evolving_driver(config.clone(), state.path(), false).await;
    driver
        .write(sink, &counted_rows(&narrow, 0..2))
        .await
        .unwrap();
    driver.checkpoint(positions(2)).await.unwrap();
    driver.evolve(&[sink], wide.clone()).await.unwrap();
    driver
        .write(sink, &counted_rows(&wide, 2..5))
        .await
        .unwrap();
    driver.checkpoint(positions(5)).await.unwrap();
    driver.close().await.unwrap();

    let values = cli(
        Db::Postgres,
        &format!("SELECT id, COALESCE(counts::text, 'null') FROM {table} ORDER BY id"),
    );
    assert_eq!(
        values.replace('\t', "|"),
        "0|{0,NULL}\n1|{1,NULL}\n2|{2,NULL,20000000000}\n3|{3,NULL,30000000000}\n4|null"
    );
    let column = cli(
        Db::Postgres,
        &format!(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = '{table}'::regclass AND attname = 'counts'"
        ),
    );
    assert_eq!(column, "bigint[]");
}
