//! The JDBC sink's half of the type contract against the real servers (docs/types.md), each value read back by the
//! databases' own client libraries (psycopg, pymysql: `sql_values.py`) and compared value by value:
//! - real types into tables `create_table` makes: decimals at the edges of their precision, timestamps before 1970
//!   and far ahead in every unit, dates, times, UUIDs, bytes, JSON, enums, lists, structs and maps, unicode;
//! - the same into tables created with a source database's own DDL (PostgreSQL `numeric`, `timestamp(3)`,
//!   `time`, `uuid`, `jsonb`, `bytea`, `text[]`, an enum; MariaDB `DECIMAL`, `DATETIME(3)`, `TIMESTAMP(6)`,
//!   `TIME(6)`, `BINARY(16)`, `JSON`), including MariaDB dates and times that would have been read as digits;
//! - what would be changed is refused: at start naming the field (a narrower decimal, nanoseconds), per row as a
//!   bad record (a finer fraction than the column keeps, text longer than the column, a character outside the
//!   column's character set);
//! - MariaDB keeps keys apart (`abc`, `ABC`, `abc ` and 300-character message ids), refuses key columns that
//!   compare case-insensitively, and runs XA for any valid job name;
//! - change streams keep what they did not change, apply changes in source order under a second unique index,
//!   and truncate.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{ListBuilder, StringBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array, Decimal256Array,
    DictionaryArray, FixedSizeBinaryArray, Float64Array, Int32Array, Int64Array, ListArray,
    RecordBatch, StringArray, StructArray, Time32MillisecondArray, Time64MicrosecondArray,
    TimestampMicrosecondArray, TimestampMillisecondArray,
};
use arrow_buffer::i256;
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use common::{Db, cli, short_name};
use connector_api::types::marks::{Mark, marked};
use connector_api::{
    CHANGE_COLUMN, CheckpointId, Committer, ErrorKind, OP_COLUMN, SinkId, SubtaskId,
    TwoPhaseCommit, UNAVAILABLE_COLUMN,
};
use jdbc_sink::{ConnectionConfig, JdbcSink, JdbcSinkConfig, WriteMode};
use serde_json::{Value, json};
use test_support::Services;

fn sink_config(
    db: Db,
    table: &str,
    scope: &str,
    mode: WriteMode,
    schema: SchemaRef,
) -> JdbcSinkConfig {
    JdbcSinkConfig {
        sink: SinkId::new("types").unwrap(),
        scope: SinkId::new(scope).unwrap().into(),
        subtask: SubtaskId(0),
        schema,
        connection: ConnectionConfig::new(db.url()),
        table: table.to_string(),
        mode,
        create_table: true,
        evolution: connector_api::Evolution::None,
        lock_timeout: std::time::Duration::from_secs(5),
    }
}

/// One checkpoint of `batches` through a new sink of `config`, committed (also in xa mode).
async fn write_checkpoint(
    config: JdbcSinkConfig,
    batches: &[RecordBatch],
) -> connector_api::Result<()> {
    let mut sink = JdbcSink::new(config).await?;
    sink.recover(None).await?;
    sink.begin(CheckpointId(1)).await?;
    for batch in batches {
        sink.write(batch).await?;
    }
    let committable = sink.pre_commit(CheckpointId(1)).await?;
    sink.committer().commit(vec![committable]).await
}

/// Every row of `table` as the database's client library reads it (`sql_values.py`).
fn read(db: Db, table: &str, key: &str) -> Value {
    let kind = match db {
        Db::Postgres => "pg",
        Db::MariaDb => "mysql",
    };
    Services::get().verify("sql_values.py", &[kind, &db.url(), table, key])
}

fn unique(db: Db, what: &str) -> (String, String) {
    let unique = test_support::unique_name(&format!("{what}-{db:?}"));
    (short_name("ty_", &[&unique]), short_name("s", &[&unique]))
}

fn uuid_bytes() -> [u8; 16] {
    connector_api::types::marks::parse_uuid("123e4567-e89b-12d3-a456-426614174000").unwrap()
}

/// The columns `create_table` makes for every real type, and a batch at their edges (three rows, the third
/// mostly null).
fn rich() -> RecordBatch {
    let item = |name: &str, ty: DataType| Arc::new(Field::new(name, ty, true));
    let line = Fields::from(vec![
        Field::new("sku", DataType::Utf8, false),
        Field::new("qty", DataType::Int32, true),
    ]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("amount", DataType::Decimal128(38, 10), true),
        Field::new("big", DataType::Decimal256(60, 20), true),
        Field::new("price", DataType::Decimal128(10, 2), true),
        Field::new(
            "at_ms",
            DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into())),
            true,
        ),
        Field::new(
            "local_us",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            true,
        ),
        Field::new("day", DataType::Date32, true),
        Field::new("t_ms", DataType::Time32(TimeUnit::Millisecond), true),
        Field::new("t_us", DataType::Time64(TimeUnit::Microsecond), true),
        marked(
            Field::new("ref", DataType::FixedSizeBinary(16), true),
            Mark::Uuid,
        ),
        Field::new("blob", DataType::Binary, true),
        marked(Field::new("doc", DataType::Utf8, true), Mark::Json),
        Field::new(
            "status",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        ),
        Field::new("note", DataType::Utf8, true),
        Field::new("ratio", DataType::Float64, true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("tags", DataType::List(item("item", DataType::Utf8)), true),
        Field::new("line", DataType::Struct(line.clone()), true),
    ]));
    let mut tags = ListBuilder::new(StringBuilder::new());
    tags.values().append_value("a");
    tags.values().append_value("b,\"c\"");
    tags.append(true);
    tags.append(true);
    tags.append_null();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2, 3])),
        Arc::new(
            Decimal128Array::from(vec![
                Some(99_999_999_999_999_999_999_999_999_999_999_999_999i128),
                Some(-1),
                None,
            ])
            .with_precision_and_scale(38, 10)
            .unwrap(),
        ),
        Arc::new(
            Decimal256Array::from(vec![
                Some(
                    i256::from_string(
                        "123456789012345678901234567890123456789012345678901234567890",
                    )
                    .unwrap(),
                ),
                Some(i256::from_i128(5)),
                None,
            ])
            .with_precision_and_scale(60, 20)
            .unwrap(),
        ),
        Arc::new(
            Decimal128Array::from(vec![Some(1050), Some(-99_999_999), None])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        ),
        Arc::new(
            TimestampMillisecondArray::from(vec![Some(-1), Some(253_402_300_799_999), None])
                .with_timezone("+00:00"),
        ),
        Arc::new(TimestampMicrosecondArray::from(vec![
            Some(-62_135_596_800_000_000),
            Some(1_700_000_000_123_456),
            None,
        ])),
        Arc::new(Date32Array::from(vec![
            Some(-719_162),
            Some(2_932_896),
            None,
        ])),
        Arc::new(Time32MillisecondArray::from(vec![
            Some(0),
            Some(86_399_999),
            None,
        ])),
        Arc::new(Time64MicrosecondArray::from(vec![
            Some(1),
            Some(86_399_999_999),
            None,
        ])),
        Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vec![Some(uuid_bytes()), Some([0u8; 16]), None].into_iter(),
                16,
            )
            .unwrap(),
        ),
        Arc::new(BinaryArray::from(vec![
            Some(&b"\x00\xff\x10"[..]),
            Some(&b""[..]),
            None,
        ])),
        Arc::new(StringArray::from(vec![
            Some(r#"{"a": [1, 2.5, null], "b": "x"}"#),
            Some("[]"),
            None,
        ])),
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![Some(1), Some(0), None]),
                Arc::new(StringArray::from(vec!["NEW", "PAID"])),
            )
            .unwrap(),
        ),
        Arc::new(StringArray::from(vec![Some("日本語 😀 ü"), Some(""), None])),
        Arc::new(Float64Array::from(vec![Some(0.1), Some(-1e300), None])),
        Arc::new(BooleanArray::from(vec![Some(true), Some(false), None])),
        Arc::new(tags.finish()) as ArrayRef,
        Arc::new(StructArray::new(
            line,
            vec![
                Arc::new(StringArray::from(vec!["x", "y", "z"])),
                Arc::new(Int32Array::from(vec![Some(7), None, Some(0)])),
            ],
            Some(vec![true, true, false].into()),
        )),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

fn text(value: &Value) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not text: {value}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_real_type_reaches_a_table_create_table_made_exactly() {
    for db in [Db::Postgres, Db::MariaDb] {
        let (table, scope) = unique(db, "rich");
        let batch = rich();
        // MariaDB's DECIMAL holds 65 digits: decimal(60, 20) fits.
        let config = sink_config(db, &table, &scope, WriteMode::Xa, batch.schema());
        write_checkpoint(config, std::slice::from_ref(&batch))
            .await
            .unwrap();
        let read = read(db, &table, "id");
        let rows = read["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3, "{db:?}: {read}");
        let (first, second, third) = (&rows[0], &rows[1], &rows[2]);
        assert_eq!(
            text(&first["amount"]),
            "9999999999999999999999999999.9999999999",
            "{db:?}"
        );
        assert_eq!(text(&second["amount"]), "-0.0000000001", "{db:?}");
        assert_eq!(
            text(&first["big"]),
            "1234567890123456789012345678901234567890.12345678901234567890",
            "{db:?}"
        );
        assert_eq!(text(&second["price"]), "-999999.99", "{db:?}");
        let (before_1970, far_ahead) = match db {
            Db::Postgres => (
                "1969-12-31T23:59:59.999000+00:00",
                "9999-12-31T23:59:59.999000+00:00",
            ),
            Db::MariaDb => ("1969-12-31T23:59:59.999000", "9999-12-31T23:59:59.999000"),
        };
        assert_eq!(text(&first["at_ms"]), before_1970, "{db:?}");
        assert_eq!(text(&second["at_ms"]), far_ahead, "{db:?}");
        assert_eq!(text(&first["local_us"]), "0001-01-01T00:00:00", "{db:?}");
        assert_eq!(
            text(&second["local_us"]),
            "2023-11-14T22:13:20.123456",
            "{db:?}"
        );
        assert_eq!(text(&first["day"]), "0001-01-01", "{db:?}");
        assert_eq!(text(&second["day"]), "9999-12-31", "{db:?}");
        match db {
            Db::Postgres => {
                assert_eq!(text(&second["t_ms"]), "23:59:59.999000");
                assert_eq!(text(&first["t_us"]), "00:00:00.000001");
                assert_eq!(text(&first["ref"]), "123e4567-e89b-12d3-a456-426614174000");
                assert_eq!(first["doc"]["json"], json!({"a": [1, 2.5, null], "b": "x"}));
                assert_eq!(first["tags"], json!(["a", "b,\"c\""]));
                assert_eq!(first["line"]["json"], json!({"sku": "x", "qty": 7}));
            }
            Db::MariaDb => {
                // pymysql reads TIME as a timedelta.
                assert_eq!(second["t_ms"], json!({"interval_us": 86_399_999_000i64}));
                assert_eq!(first["t_us"], json!({"interval_us": 1}));
                assert_eq!(text(&first["ref"]), "123e4567-e89b-12d3-a456-426614174000");
                let doc: Value = serde_json::from_str(&text(&first["doc"])).unwrap();
                assert_eq!(doc, json!({"a": [1, 2.5, null], "b": "x"}));
                let tags: Value = serde_json::from_str(&text(&first["tags"])).unwrap();
                assert_eq!(tags, json!(["a", "b,\"c\""]));
                let line: Value = serde_json::from_str(&text(&first["line"])).unwrap();
                assert_eq!(line, json!({"sku": "x", "qty": 7}));
            }
        }
        assert_eq!(text(&first["blob"]), "base64:AP8Q", "{db:?}");
        assert_eq!(text(&second["blob"]), "base64:", "{db:?}");
        assert_eq!(text(&first["status"]), "PAID", "{db:?}");
        assert_eq!(text(&first["note"]), "日本語 😀 ü", "{db:?}");
        assert_eq!(first["ratio"], json!({"float": "0.1"}), "{db:?}");
        assert_eq!(second["ratio"], json!({"float": "-1e+300"}), "{db:?}");
        for column in read["columns"].as_array().unwrap() {
            let column = column.as_str().unwrap();
            if column != "id" && column != "line" {
                assert!(
                    third[column].is_null(),
                    "{db:?}: {column} = {}",
                    third[column]
                );
            }
        }
    }
}

/// A source's own DDL for the columns, and a batch whose Arrow types are what the decodings make of them.
fn precreated(db: Db, table: &str) -> RecordBatch {
    let ddl = match db {
        Db::Postgres => format!(
            "DROP TYPE IF EXISTS {table}_mood; CREATE TYPE {table}_mood AS ENUM ('happy', 'sad'); \
             CREATE TABLE {table} (id integer PRIMARY KEY, amount numeric(12, 2), exact numeric, \
             at timestamp(3), at_tz timestamptz, day date, clock time, ref uuid, doc jsonb, bin bytea, \
             tags text[], nums bigint[], mood {table}_mood, code varchar(10))"
        ),
        Db::MariaDb => format!(
            "CREATE TABLE {table} (id INT PRIMARY KEY, amount DECIMAL(12, 2), exact DECIMAL(30, 10), \
             at DATETIME(3), at_tz TIMESTAMP(6) NULL, day DATE, clock TIME(6), ref BINARY(16), doc JSON, \
             bin BLOB, tags JSON, nums JSON, mood ENUM('happy', 'sad'), code VARCHAR(10)) \
             DEFAULT CHARSET = latin1"
        ),
    };
    cli(db, &ddl);
    let list = |item: DataType| DataType::List(Arc::new(Field::new("item", item, true)));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("amount", DataType::Decimal128(10, 2), true),
        marked(Field::new("exact", DataType::Utf8, true), Mark::DecimalText),
        Field::new("at", DataType::Timestamp(TimeUnit::Millisecond, None), true),
        Field::new(
            "at_tz",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("day", DataType::Date32, true),
        Field::new("clock", DataType::Time64(TimeUnit::Microsecond), true),
        marked(
            Field::new("ref", DataType::FixedSizeBinary(16), true),
            Mark::Uuid,
        ),
        marked(Field::new("doc", DataType::Utf8, true), Mark::Json),
        Field::new("bin", DataType::Binary, true),
        Field::new("tags", list(DataType::Utf8), true),
        Field::new("nums", list(DataType::Int64), true),
        Field::new("mood", DataType::Utf8, true),
        Field::new("code", DataType::Utf8, true),
    ]));
    let mut tags = ListBuilder::new(StringBuilder::new());
    tags.values().append_value("x");
    tags.values().append_null();
    tags.append(true);
    let nums =
        ListArray::from_iter_primitive::<arrow_array::types::Int64Type, _, _>(vec![Some(vec![
            Some(i64::MIN),
            Some(42),
        ])]);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int32Array::from(vec![7])),
        Arc::new(
            Decimal128Array::from(vec![12_345])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        ),
        Arc::new(StringArray::from(vec!["-1234567890.0123456789"])),
        Arc::new(TimestampMillisecondArray::from(vec![-86_400_001])),
        Arc::new(TimestampMicrosecondArray::from(vec![1_700_000_000_654_321]).with_timezone("UTC")),
        Arc::new(Date32Array::from(vec![19_000])),
        Arc::new(Time64MicrosecondArray::from(vec![45_296_789_012])),
        Arc::new(FixedSizeBinaryArray::try_from_iter(vec![uuid_bytes()].into_iter()).unwrap()),
        Arc::new(StringArray::from(vec![r#"{"k": "v"}"#])),
        Arc::new(BinaryArray::from(vec![&b"\xde\xad"[..]])),
        Arc::new(tags.finish()),
        Arc::new(nums),
        Arc::new(StringArray::from(vec!["sad"])),
        Arc::new(StringArray::from(vec!["ten chars."])),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_made_with_the_source_databases_own_ddl_takes_every_value_exactly() {
    for db in [Db::Postgres, Db::MariaDb] {
        for mode in [
            WriteMode::Xa,
            WriteMode::Upsert {
                key: vec!["id".into()],
            },
        ] {
            let (table, scope) = unique(db, &format!("pre-{mode:?}"));
            let batch = precreated(db, &table);
            let mut config = sink_config(db, &table, &scope, mode.clone(), batch.schema());
            config.create_table = false;
            write_checkpoint(config, std::slice::from_ref(&batch))
                .await
                .unwrap_or_else(|e| panic!("{db:?} {mode:?}: {e}"));
            let read = read(db, &table, "id");
            let row = &read["rows"][0];
            let at = "{db:?} {mode:?}";
            assert_eq!(text(&row["amount"]), "123.45", "{at}");
            assert_eq!(text(&row["exact"]), "-1234567890.0123456789", "{at}");
            assert_eq!(text(&row["at"]), "1969-12-30T23:59:59.999000", "{at}");
            assert_eq!(text(&row["day"]), "2022-01-08", "{at}");
            match db {
                Db::Postgres => {
                    assert_eq!(
                        text(&row["at_tz"]),
                        "2023-11-14T22:13:20.654321+00:00",
                        "{at}"
                    );
                    assert_eq!(text(&row["clock"]), "12:34:56.789012", "{at}");
                    assert_eq!(
                        text(&row["ref"]),
                        "123e4567-e89b-12d3-a456-426614174000",
                        "{at}"
                    );
                    assert_eq!(row["doc"]["json"], json!({"k": "v"}), "{at}");
                    assert_eq!(row["tags"], json!(["x", null]), "{at}");
                    assert_eq!(row["nums"], json!([i64::MIN, 42]), "{at}");
                }
                Db::MariaDb => {
                    assert_eq!(text(&row["at_tz"]), "2023-11-14T22:13:20.654321", "{at}");
                    assert_eq!(
                        row["clock"],
                        json!({"interval_us": 45_296_789_012i64}),
                        "{at}"
                    );
                    assert_eq!(text(&row["ref"]), "base64:Ej5FZ+ibEtOkVkJmFBdAAA==", "{at}");
                    assert_eq!(
                        serde_json::from_str::<Value>(&text(&row["doc"])).unwrap(),
                        json!({"k": "v"})
                    );
                    assert_eq!(
                        serde_json::from_str::<Value>(&text(&row["tags"])).unwrap(),
                        json!(["x", null])
                    );
                }
            }
            assert_eq!(text(&row["bin"]), "base64:3q0=", "{at}");
            assert_eq!(text(&row["mood"]), "sad", "{at}");
            assert_eq!(text(&row["code"]), "ten chars.", "{at}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_column_would_change_is_refused_naming_the_field_or_the_row() {
    for db in [Db::Postgres, Db::MariaDb] {
        // At start: a decimal the column would round, a timestamp with a zone into one without.
        let (table, scope) = unique(db, "narrow");
        let ddl = match db {
            Db::Postgres => {
                format!("CREATE TABLE {table} (id integer PRIMARY KEY, amount numeric(10, 2))")
            }
            Db::MariaDb => {
                format!("CREATE TABLE {table} (id INT PRIMARY KEY, amount DECIMAL(10, 2))")
            }
        };
        cli(db, &ddl);
        let wide = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("amount", DataType::Decimal128(12, 4), true),
        ]));
        let mut config = sink_config(db, &table, &scope, WriteMode::Xa, wide);
        config.create_table = false;
        let err = JdbcSink::new(config).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{db:?}: {err}");
        assert!(err.to_string().contains("field `amount`"), "{db:?}: {err}");

        // Per row: a finer fraction than time(3) / TIME(3) keeps, text longer than the column.
        let (table, scope) = unique(db, "rows");
        let ddl = match db {
            Db::Postgres => format!(
                "CREATE TABLE {table} (id integer PRIMARY KEY, at timestamp(3), code varchar(3))"
            ),
            Db::MariaDb => format!(
                "CREATE TABLE {table} (id INT PRIMARY KEY, at DATETIME(3), code VARCHAR(3))"
            ),
        };
        cli(db, &ddl);
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("code", DataType::Utf8, true),
        ]));
        for (at, code) in [(1_000_001i64, "ok"), (1_000_000, "four")] {
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int32Array::from(vec![1])),
                    Arc::new(TimestampMicrosecondArray::from(vec![at])),
                    Arc::new(StringArray::from(vec![code])),
                ],
            )
            .unwrap();
            let mut config = sink_config(db, &table, &scope, WriteMode::Xa, schema.clone());
            config.create_table = false;
            let err = write_checkpoint(config, &[batch]).await.unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::BadRecord,
                "{db:?} {at} {code}: {err}"
            );
        }
        assert_eq!(
            cli(db, &format!("SELECT count(*) FROM {table}")),
            "0",
            "{db:?}"
        );
    }
    // MariaDB: a character the column's character set cannot hold is a bad record, not a stuck job.
    let db = Db::MariaDb;
    let (table, scope) = unique(db, "latin1");
    cli(
        db,
        &format!("CREATE TABLE {table} (id INT PRIMARY KEY, note TEXT) DEFAULT CHARSET = latin1"),
    );
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int32, false),
        Field::new("note", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int32Array::from(vec![1])),
            Arc::new(StringArray::from(vec!["😀"])),
        ],
    )
    .unwrap();
    let mut config = sink_config(db, &table, &scope, WriteMode::Xa, schema);
    config.create_table = false;
    let err = write_checkpoint(config, &[batch]).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_keeps_keys_apart_and_refuses_keys_that_compare_loosely() {
    let db = Db::MariaDb;
    let schema = Arc::new(Schema::new(vec![
        Field::new("code", DataType::Utf8, false),
        Field::new("n", DataType::Int64, true),
    ]));
    let rows = |codes: &[&str]| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(codes.iter().copied())),
                Arc::new(Int64Array::from_iter_values(0..codes.len() as i64)),
            ],
        )
        .unwrap()
    };
    // Upsert keys that a case-, accent- or space-insensitive collation would merge.
    let (table, scope) = unique(db, "keys");
    let upsert = WriteMode::Upsert {
        key: vec!["code".into()],
    };
    write_checkpoint(
        sink_config(db, &table, &scope, upsert.clone(), schema.clone()),
        &[rows(&["abc", "ABC", "abc ", "äbc"])],
    )
    .await
    .unwrap();
    assert_eq!(cli(db, &format!("SELECT count(*) FROM {table}")), "4");
    // Dedup ids longer than 255 characters and differing in case: all five kept, none cut.
    let (table, scope) = unique(db, "dedup");
    let long = "x".repeat(300);
    let longer = format!("{long}y");
    let append = WriteMode::Append {
        dedup: jdbc_sink::DedupConfig {
            message_id: "code".into(),
            table: None,
            retention: std::time::Duration::from_secs(3600),
        },
    };
    write_checkpoint(
        sink_config(db, &table, &scope, append, schema.clone()),
        &[rows(&["Ab", "aB", &long, &longer, "Ab "])],
    )
    .await
    .unwrap();
    assert_eq!(cli(db, &format!("SELECT count(*) FROM {table}")), "5");
    // An existing table whose key compares case-insensitively is refused at start, naming the collation.
    let (table, scope) = unique(db, "ci");
    cli(
        db,
        &format!(
            "CREATE TABLE {table} (code VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci PRIMARY KEY, \
             n BIGINT)"
        ),
    );
    let mut config = sink_config(db, &table, &scope, upsert, schema);
    config.create_table = false;
    let err = JdbcSink::new(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(
        err.to_string().contains("field `code`") && err.to_string().contains("utf8mb4_general_ci"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xa_ids_fit_any_valid_job_name_and_sink_id() {
    let db = Db::MariaDb;
    let (table, _) = unique(db, "longscope");
    // A job name of 40 characters and a sink id of 30, new on every run (markers of earlier runs stay).
    let job = connector_api::JobId::new(format!("{:x<40}", short_name("job-", &[&table]))).unwrap();
    let sink = SinkId::new(format!("{:y<30}", short_name("sink-", &[&table]))).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let mut config = sink_config(db, &table, "unused", WriteMode::Xa, schema.clone());
    config.scope = connector_api::SinkScope::new(Some(&job), &sink);
    let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
    write_checkpoint(config, &[batch]).await.unwrap();
    assert_eq!(cli(db, &format!("SELECT count(*) FROM {table}")), "2");
}

fn change_schema(columns: Vec<Field>) -> SchemaRef {
    let marked = |name: &str, ty: DataType, what: &str| {
        Field::new(name, ty, true).with_metadata(HashMap::from([(
            CHANGE_COLUMN.to_string(),
            what.to_string(),
        )]))
    };
    let mut fields = columns;
    fields.push(marked(OP_COLUMN, DataType::Utf8, "op"));
    fields.push(marked(
        UNAVAILABLE_COLUMN,
        DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
        "unavailable",
    ));
    Arc::new(Schema::new(fields))
}

/// One change: `(op, id, email, body, columns the change did not carry)`.
type Change<'a> = (
    &'a str,
    i64,
    Option<&'a str>,
    Option<&'a str>,
    &'a [&'a str],
);

/// Changes of [`Change`]s.
fn changes(schema: &SchemaRef, rows: &[Change<'_>]) -> RecordBatch {
    let mut unavailable = ListBuilder::new(StringBuilder::new());
    for row in rows {
        match row.4 {
            [] => unavailable.append_null(),
            names => {
                for name in names {
                    unavailable.values().append_value(name);
                }
                unavailable.append(true);
            }
        }
    }
    RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter(
                rows.iter().map(|r| (r.0 != "t").then_some(r.1)),
            )),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(unavailable.finish()),
        ],
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_streams_keep_what_they_did_not_change_in_source_order_and_truncate() {
    for db in [Db::Postgres, Db::MariaDb] {
        for mode in [
            WriteMode::Upsert {
                key: vec!["id".into()],
            },
            WriteMode::XaUpsert {
                key: vec!["id".into()],
            },
        ] {
            let at = format!("{db:?} {mode:?}");
            let (table, scope) = unique(db, &format!("chg-{mode:?}"));
            let ddl = match db {
                Db::Postgres => format!(
                    "CREATE TABLE {table} (id bigint PRIMARY KEY, email text UNIQUE, body text)"
                ),
                Db::MariaDb => format!(
                    "CREATE TABLE {table} (id BIGINT PRIMARY KEY, email VARCHAR(100) CHARACTER SET utf8mb4 \
                     COLLATE utf8mb4_nopad_bin UNIQUE, body LONGTEXT)"
                ),
            };
            cli(db, &ddl);
            let schema = change_schema(vec![
                Field::new("id", DataType::Int64, true),
                Field::new("email", DataType::Utf8, true),
                Field::new("body", DataType::Utf8, true),
            ]);
            let long = "t".repeat(20_000);
            let mut config = sink_config(db, &table, &scope, mode.clone(), schema.clone());
            config.create_table = false;
            let mut sink = JdbcSink::new(config).await.unwrap();
            sink.recover(None).await.unwrap();
            sink.begin(CheckpointId(1)).await.unwrap();
            sink.write(&changes(
                &schema,
                &[
                    ("c", 1, Some("a@x"), Some(&long), &[]),
                    ("c", 2, Some("b@x"), Some("short"), &[]),
                ],
            ))
            .await
            .unwrap();
            let committable = sink.pre_commit(CheckpointId(1)).await.unwrap();
            sink.committer().commit(vec![committable]).await.unwrap();
            sink.begin(CheckpointId(2)).await.unwrap();
            // An update that did not carry the TOASTed body; a primary-key change (delete of 1, insert of 3 with
            // its unique email) that only works in source order; a delete and re-insert of 2 in one batch.
            sink.write(&changes(
                &schema,
                &[
                    ("u", 1, Some("a2@x"), None, &["body"]),
                    ("d", 1, None, None, &[]),
                    ("c", 3, Some("a2@x"), Some("moved"), &[]),
                    ("d", 2, None, None, &[]),
                    ("c", 2, Some("b@x"), Some("again"), &[]),
                    ("u", 3, Some("a2@x"), None, &["body"]),
                ],
            ))
            .await
            .unwrap_or_else(|e| panic!("{at}: {e}"));
            let committable = sink.pre_commit(CheckpointId(2)).await.unwrap();
            sink.committer().commit(vec![committable]).await.unwrap();
            let rows = read(db, &table, "id")["rows"].clone();
            assert_eq!(
                rows,
                json!([
                    {"id": 2, "email": "b@x", "body": "again"},
                    {"id": 3, "email": "a2@x", "body": "moved"},
                ]),
                "{at}"
            );
            // A value kept across checkpoints: the update carries no body, the table's stays.
            sink.begin(CheckpointId(3)).await.unwrap();
            sink.write(&changes(
                &schema,
                &[("u", 2, Some("b2@x"), None, &["body"])],
            ))
            .await
            .unwrap();
            let committable = sink.pre_commit(CheckpointId(3)).await.unwrap();
            sink.committer().commit(vec![committable]).await.unwrap();
            let rows = read(db, &table, "id")["rows"].clone();
            assert_eq!(
                rows[0],
                json!({"id": 2, "email": "b2@x", "body": "again"}),
                "{at}"
            );
            // A truncate deletes every row inside the checkpoint's transaction; a change after it stays.
            sink.begin(CheckpointId(4)).await.unwrap();
            sink.write(&changes(
                &schema,
                &[
                    ("t", 0, None, None, &[]),
                    ("c", 9, Some("n@x"), Some("after"), &[]),
                ],
            ))
            .await
            .unwrap();
            let committable = sink.pre_commit(CheckpointId(4)).await.unwrap();
            sink.committer().commit(vec![committable]).await.unwrap();
            let rows = read(db, &table, "id")["rows"].clone();
            assert_eq!(
                rows,
                json!([{"id": 9, "email": "n@x", "body": "after"}]),
                "{at}"
            );
            // A change that did not carry the body, of a key the table has no row of: refused, not written null.
            sink.begin(CheckpointId(5)).await.unwrap();
            let err = sink
                .write(&changes(
                    &schema,
                    &[("u", 77, Some("z@x"), None, &["body"])],
                ))
                .await
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRecord, "{at}: {err}");
            assert!(
                err.to_string().contains("REPLICA IDENTITY FULL"),
                "{at}: {err}"
            );
            sink.abort().await.unwrap();
            // A change without its key is a bad record.
            sink.begin(CheckpointId(6)).await.unwrap();
            let keyless = changes(&schema, &[("u", 0, Some("q@x"), Some("q"), &[])]);
            let keyless = RecordBatch::try_new(
                schema.clone(),
                std::iter::once(Arc::new(Int64Array::from(vec![None::<i64>])) as ArrayRef)
                    .chain(keyless.columns()[1..].iter().cloned())
                    .collect(),
            )
            .unwrap();
            let err = sink.write(&keyless).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRecord, "{at}: {err}");
            sink.abort().await.unwrap();
        }
    }
}
