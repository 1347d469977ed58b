//! The Iceberg sink's half of the type contract on a real catalog (SQLite, local warehouse), every value read back
//! by Apache Iceberg's Java library and compared value by value: the Arrow types the decodings make (millisecond
//! timestamps and times, enums as dictionaries, UUIDs, fixed, decimals, nested lists, structs and maps with their
//! own field ids, a `Map<Utf8, Binary>` like the `headers` metadata column) into a table the sink creates; what no
//! Iceberg type holds refused at start naming the field; and the upsert mode keeping a column a change did not
//! carry, from the checkpoint before and from the table.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, ListBuilder, MapBuilder, StringBuilder};
use arrow_array::types::Int32Type;
use arrow_array::{
    ArrayRef, BinaryArray, Date32Array, Decimal128Array, DictionaryArray, FixedSizeBinaryArray,
    Int32Array, Int64Array, RecordBatch, StringArray, Time32MillisecondArray,
    TimestampMillisecondArray,
};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use common::Lake;
use connector_api::types::marks::{Mark, marked};
use connector_api::{
    CHANGE_COLUMN, CheckpointId, Committer, ErrorKind, OP_COLUMN, SinkId, TwoPhaseCommit,
    UNAVAILABLE_COLUMN,
};
use iceberg_sink::IcebergSink;
use serde_json::{Value, json};

/// One checkpoint `checkpoint` of `batches` through `sink`, committed.
async fn checkpoint(sink: &mut IcebergSink, checkpoint: u64, batches: &[RecordBatch]) {
    sink.begin(CheckpointId(checkpoint)).await.unwrap();
    for batch in batches {
        sink.write(batch).await.unwrap();
    }
    let committable = sink.pre_commit(CheckpointId(checkpoint)).await.unwrap();
    sink.committer().commit(vec![committable]).await.unwrap();
}

/// Every row of `table` as Iceberg's Java library reads it, by column name, ordered by `id`.
fn java_rows(lake: &Lake, table: &str) -> Vec<Value> {
    let read = lake.read_with(table, "--java-rows");
    let names: Vec<String> = read["java_column_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    let mut rows: Vec<Value> = read["java_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let object: serde_json::Map<String, Value> = names
                .iter()
                .cloned()
                .zip(row.as_array().unwrap().iter().cloned())
                .collect();
            Value::Object(object)
        })
        .collect();
    rows.sort_by_key(|r| r["id"].as_i64());
    rows
}

fn rich() -> RecordBatch {
    let line = Fields::from(vec![
        Field::new("sku", DataType::Utf8, false),
        Field::new(
            "price",
            DataType::Struct(Fields::from(vec![
                Field::new("amount", DataType::Decimal128(12, 2), true),
                Field::new(
                    "at",
                    DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into())),
                    true,
                ),
            ])),
            true,
        ),
    ]);
    let lines_type = DataType::List(Arc::new(Field::new(
        "item",
        DataType::Struct(line.clone()),
        true,
    )));
    let mut headers = MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new());
    headers.keys().append_value("origin");
    headers.values().append_value(b"\x01\x02");
    headers.append(true).unwrap();
    headers.append(true).unwrap();
    let headers = headers.finish();
    let symbols = HashMap::from([(
        "avro.enum.symbols".to_string(),
        r#"["NEW","PAID"]"#.to_string(),
    )]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("amount", DataType::Decimal128(38, 10), true),
        Field::new(
            "at",
            DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into())),
            true,
        ),
        Field::new("day", DataType::Date32, true),
        Field::new("clock", DataType::Time32(TimeUnit::Millisecond), true),
        marked(
            Field::new("ref", DataType::FixedSizeBinary(16), true),
            Mark::Uuid,
        ),
        Field::new("code", DataType::FixedSizeBinary(4), true),
        Field::new("blob", DataType::Binary, true),
        Field::new(
            "status",
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
            true,
        )
        .with_metadata(symbols),
        Field::new("lines", lines_type, true),
        Field::new(
            "headers",
            arrow_array::Array::data_type(&headers).clone(),
            false,
        ),
    ]));
    let uuid =
        connector_api::types::marks::parse_uuid("123e4567-e89b-12d3-a456-426614174000").unwrap();
    let mut lines = ListBuilder::new(arrow_array::builder::StructBuilder::from_fields(
        line.clone(),
        2,
    ));
    {
        let item = lines.values();
        item.field_builder::<StringBuilder>(0)
            .unwrap()
            .append_value("sku-1");
        let price = item
            .field_builder::<arrow_array::builder::StructBuilder>(1)
            .unwrap();
        price
            .field_builder::<arrow_array::builder::Decimal128Builder>(0)
            .unwrap()
            .append_value(-1);
        price
            .field_builder::<arrow_array::builder::TimestampMillisecondBuilder>(1)
            .unwrap()
            .append_value(-1);
        price.append(true);
        item.append(true);
    }
    lines.append(true);
    lines.append_null();
    // The builders make default child types: relabel to the declared ones (same layout).
    let lines: ArrayRef = Arc::new(lines.finish());
    let lines = connector_api::types::exact::convert(&lines, schema.field(9).data_type()).unwrap();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2])),
        Arc::new(
            Decimal128Array::from(vec![
                Some(-99_999_999_999_999_999_999_999_999_999_999_999_999i128),
                None,
            ])
            .with_precision_and_scale(38, 10)
            .unwrap(),
        ),
        Arc::new(
            TimestampMillisecondArray::from(vec![Some(-1), Some(253_402_300_799_999)])
                .with_timezone("+00:00"),
        ),
        Arc::new(Date32Array::from(vec![Some(-719_162), None])),
        Arc::new(Time32MillisecondArray::from(vec![Some(86_399_999), None])),
        Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vec![Some(uuid), None].into_iter(),
                16,
            )
            .unwrap(),
        ),
        Arc::new(
            FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                vec![Some(*b"ABCD"), None].into_iter(),
                4,
            )
            .unwrap(),
        ),
        Arc::new(BinaryArray::from(vec![Some(&b"\x00\xff"[..]), None])),
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(
                Int32Array::from(vec![Some(1), None]),
                Arc::new(StringArray::from(vec!["NEW", "PAID"])),
            )
            .unwrap(),
        ),
        lines,
        Arc::new(headers),
    ];
    RecordBatch::try_new(schema, columns).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_types_reach_a_table_the_sink_creates_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "types");
    let table = lake.table(&["rich"]);
    let batch = rich();
    let mut sink = recovered_rich_sink(&lake, &table, Default::default()).await;
    checkpoint(&mut sink, 1, std::slice::from_ref(&batch)).await;
    let rows = tokio::task::spawn_blocking(move || java_rows(&lake, &table))
        .await
        .unwrap();
    assert_rich(&rows[0], &rows[1]);
}

/// The rich batch written in five checkpoints by a sink that compacts at 2 files: the rows the compactions rewrote
/// read back in Iceberg's Java library exactly as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_types_stay_exact_through_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "types");
    let table = lake.table(&["compacted"]);
    let batch = rich();
    let compact = iceberg_sink::Compact::On(iceberg_sink::CompactPolicy {
        target_file_size: 1 << 20,
        min_input_files: 2,
        ..Default::default()
    });
    let mut sink = recovered_rich_sink(&lake, &table, compact).await;
    for n in 1..=5 {
        checkpoint(&mut sink, n, std::slice::from_ref(&batch)).await;
    }
    let seen = crate::common::appends::metadata_files(&lake, &table).await;
    let compacting = seen["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["summary"].get("deleted-data-files").is_some())
        .count();
    assert!(compacting > 0, "no compaction in {:#}", seen["snapshots"]);
    let rows = tokio::task::spawn_blocking(move || java_rows(&lake, &table))
        .await
        .unwrap();
    assert_eq!(rows.len(), 10);
    let (ones, twos): (Vec<&Value>, Vec<&Value>) = rows.iter().partition(|r| r["id"] == json!(1));
    for (one, two) in ones.iter().zip(&twos) {
        assert_rich(one, two);
    }
}

/// The rich batch upserted by `id` into a table the sink creates, compacting at 2 files: both rows in checkpoint
/// 1, then row 1 alone in checkpoints 2-5. Checkpoint 5's compaction rewrites checkpoint 1's file without its
/// deleted row 1 (and removes the files whose rows are all replaced): row 2, copied by the compaction, and row 1
/// read back in Iceberg's Java library exactly as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_types_stay_exact_through_an_upsert_tables_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "types");
    let table = lake.table(&["upserted"]);
    let batch = rich();
    let compact = iceberg_sink::Compact::On(iceberg_sink::CompactPolicy {
        target_file_size: 1 << 20,
        min_input_files: 2,
        ..Default::default()
    });
    let mut sink = rich_sink(&lake, &table, compact, &["id"]).await;
    checkpoint(&mut sink, 1, std::slice::from_ref(&batch)).await;
    for n in 2..=5 {
        checkpoint(&mut sink, n, &[batch.slice(0, 1)]).await;
    }
    let seen = crate::common::appends::metadata_files(&lake, &table).await;
    let rewrote = seen["snapshots"].as_array().unwrap().iter().any(|s| {
        s["summary"]["deleted-data-files"]
            .as_str()
            .is_some_and(|n| n != "0")
            && s["summary"]["added-records"]
                .as_str()
                .is_some_and(|n| n != "1")
    });
    assert!(
        rewrote,
        "no compaction copied row 2: {:#}",
        seen["snapshots"]
    );
    let rows = tokio::task::spawn_blocking(move || java_rows(&lake, &table))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_rich(&rows[0], &rows[1]);
}

/// A recovered sink of job `types` writing [`rich`]'s schema into `table` (created), compacting as `compact` says.
async fn recovered_rich_sink(
    lake: &Lake,
    table: &str,
    compact: iceberg_sink::Compact,
) -> IcebergSink {
    rich_sink(lake, table, compact, &[]).await
}

/// [`recovered_rich_sink`] upserting by `upsert_key` (empty: appending).
async fn rich_sink(
    lake: &Lake,
    table: &str,
    compact: iceberg_sink::Compact,
    upsert_key: &[&str],
) -> IcebergSink {
    let config = iceberg_sink::IcebergSinkConfig {
        compact,
        upsert_key: upsert_key.iter().map(|k| k.to_string()).collect(),
        ..lake.config(
            "types",
            &SinkId::new("lake").unwrap(),
            0,
            table,
            rich().schema(),
        )
    };
    let mut sink = IcebergSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    sink
}

/// The rows of [`rich`] (ids 1 and 2) as Iceberg's Java library reads them.
fn assert_rich(one: &Value, two: &Value) {
    assert_eq!(
        *one,
        json!({
            "id": 1,
            "amount": "-9999999999999999999999999999.9999999999",
            "at": "1969-12-31T23:59:59.999000Z",
            "day": "0001-01-01",
            "clock": "23:59:59.999000",
            "ref": "123e4567-e89b-12d3-a456-426614174000",
            "code": "base64:QUJDRA==",
            "blob": "base64:AP8=",
            "status": "PAID",
            "lines": [{"sku": "sku-1", "price": {"amount": "-0.01", "at": "1969-12-31T23:59:59.999000Z"}}],
            "headers": {"origin": "base64:AQI="},
        })
    );
    assert_eq!(two["at"], "9999-12-31T23:59:59.999000Z");
    assert_eq!(two["lines"], Value::Null);
    assert_eq!(two["headers"], json!({}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_no_iceberg_type_holds_is_refused_at_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "refused");
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("big", DataType::UInt64, true),
        Field::new(
            "nested",
            DataType::Struct(Fields::from(vec![Field::new(
                "ns",
                DataType::Time64(TimeUnit::Nanosecond),
                true,
            )])),
            true,
        ),
    ]));
    let table = lake.table(&["refused"]);
    let config = lake.config("types", &SinkId::new("lake").unwrap(), 0, &table, schema);
    let err = IcebergSink::new(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("field `big`") && message.contains("field `nested.ns`"),
        "{message}"
    );

    // An existing table whose column is narrower than the batches' is refused too.
    let narrow = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("n", DataType::Int32, true),
    ]));
    let table = lake.table(&["narrow"]);
    let config = lake.config("types", &SinkId::new("lake").unwrap(), 0, &table, narrow);
    let mut sink = IcebergSink::new(config).await.unwrap();
    sink.recover(None).await.unwrap();
    let wide = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("n", DataType::Int64, true),
    ]));
    let mut config = lake.config("types", &SinkId::new("lake").unwrap(), 0, &table, wide);
    config.create_table = false;
    let err = IcebergSink::new(config).await.unwrap_err();
    assert!(err.to_string().contains("field `n`"), "{err}");
}

fn changes_schema() -> SchemaRef {
    let marked = |name: &str, ty: DataType, what: &str| {
        Field::new(name, ty, true).with_metadata(HashMap::from([(
            CHANGE_COLUMN.to_string(),
            what.to_string(),
        )]))
    };
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
        Field::new("body", DataType::Utf8, true),
        marked(OP_COLUMN, DataType::Utf8, "op"),
        marked(
            UNAVAILABLE_COLUMN,
            DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))),
            "unavailable",
        ),
    ]))
}

/// Changes `(op, id, name, body, did not carry the body)`.
fn changes(rows: &[(&str, i64, &str, Option<&str>, bool)]) -> RecordBatch {
    let mut unavailable = ListBuilder::new(StringBuilder::new());
    for row in rows {
        if row.4 {
            unavailable.values().append_value("body");
            unavailable.append(true);
        } else {
            unavailable.append_null();
        }
    }
    RecordBatch::try_new(
        changes_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
            Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
            Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(unavailable.finish()),
        ],
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upserted_row_keeps_the_value_its_change_did_not_carry() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::sqlite_local(dir.path(), "unavailable");
    let table = lake.table(&["replica"]);
    let long = "toast ".repeat(4000);
    let config = |lake: &Lake| {
        let mut config = lake.config(
            "types",
            &SinkId::new("lake").unwrap(),
            0,
            &table,
            changes_schema(),
        );
        config.upsert_key = vec!["id".into()];
        config
    };
    let mut sink = IcebergSink::new(config(&lake)).await.unwrap();
    sink.recover(None).await.unwrap();
    // 1 carries its body, then an update in the same checkpoint does not.
    checkpoint(
        &mut sink,
        1,
        &[changes(&[
            ("c", 1, "a", Some(&long), false),
            ("u", 1, "b", None, true),
            ("c", 2, "x", Some("two"), false),
        ])],
    )
    .await;
    // The previous checkpoint's row (also committed by now, but remembered) and the table's.
    checkpoint(&mut sink, 2, &[changes(&[("u", 1, "c", None, true)])]).await;
    // A new instance knows nothing of earlier checkpoints: the value comes from the table.
    drop(sink);
    let mut sink = IcebergSink::new(config(&lake)).await.unwrap();
    sink.recover(None).await.unwrap();
    checkpoint(
        &mut sink,
        3,
        &[changes(&[
            ("u", 1, "d", None, true),
            ("u", 2, "y", None, true),
        ])],
    )
    .await;
    let lake_for_read = lake.clone();
    let read_table = table.clone();
    let rows = tokio::task::spawn_blocking(move || java_rows(&lake_for_read, &read_table))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["name"], "d");
    assert_eq!(rows[0]["body"], long.as_str(), "the body of id 1 is kept");
    assert_eq!(rows[1], json!({"id": 2, "name": "y", "body": "two"}));
    // A truncate cannot be applied to an Iceberg table kept by key: a bad record.
    sink.begin(CheckpointId(4)).await.unwrap();
    let err = sink
        .write(&changes(&[("t", 0, "", None, false)]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
}
