use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};

use super::*;
use crate::decode::BatchBuilder;
use crate::decoding::Decoding;
use crate::json_types::JsonField;
use crate::metadata::MetadataColumns;
use crate::record::{RecordAt, RecordParts};

fn columns(declared: &[JsonField]) -> SchemaRef {
    Arc::new(Schema::new(
        declared
            .iter()
            .map(|f| f.field().unwrap())
            .collect::<Vec<_>>(),
    ))
}

fn items() -> SchemaRef {
    columns(&[
        JsonField::new("id", "int32", false),
        JsonField::new("name", "string", true),
        JsonField::new("qty", "int64", true),
    ])
}

fn decode(decoding: &DebeziumDecoding, values: &[&str]) -> Result<RecordBatch> {
    let decoding = Decoding::Debezium(decoding.clone());
    let mut builder = BatchBuilder::new(&decoding, &MetadataColumns::none(), 4)?;
    for (offset, value) in values.iter().enumerate() {
        builder.append(&RecordParts::<rdkafka::message::OwnedHeaders> {
            at: RecordAt {
                topic: "pg.public.items",
                partition: 0,
                offset: offset as i64,
            },
            timestamp: None,
            key: None,
            value: Some(value.as_bytes()),
            headers: None,
        })?;
    }
    builder.finish()
}

/// As Debezium 3.6's PostgreSQL connector writes them (trimmed source blocks).
const INSERT: &str = r#"{"before":null,"after":{"id":1,"name":"a","qty":5},"source":{"version":"3.6.1.Final","connector":"postgresql","name":"pg","ts_ms":1764680000000,"snapshot":"false","db":"ratchet","sequence":"[null,\"26\"]","schema":"public","table":"items","txId":771,"lsn":26,"xmin":null},"op":"c","ts_ms":1764680000100,"transaction":null}"#;
const UPDATE: &str = r#"{"before":null,"after":{"id":1,"name":"b","qty":6},"source":{"ts_ms":1764680001000,"db":"ratchet","table":"items","txId":772,"lsn":27},"op":"u","ts_ms":1764680001100}"#;
const DELETE: &str = r#"{"before":{"id":1,"name":null,"qty":null},"after":null,"source":{"ts_ms":1764680002000,"db":"ratchet","table":"items","txId":773,"lsn":28},"op":"d","ts_ms":1764680002100}"#;

#[test]
fn json_envelopes_become_rows_with_change_columns() {
    for schemas in [false, true] {
        let decoding = DebeziumDecoding::json(items(), schemas);
        let wrap = |envelope: &str| match schemas {
            true => {
                format!(r#"{{"schema":{{"type":"struct","optional":false}},"payload":{envelope}}}"#)
            }
            false => envelope.to_string(),
        };
        let values: Vec<String> = [INSERT, UPDATE, DELETE].iter().map(|e| wrap(e)).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let batch = decode(&decoding, &values).unwrap();
        assert_eq!(batch.num_rows(), 3);
        let schema = batch.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "id",
                "name",
                "qty",
                "__op",
                "__ts_ms",
                "__source_ts_ms",
                "__source_db",
                "__source_table",
                "__source_lsn",
                "__source_tx_id",
                "__unavailable"
            ]
        );
        let ops = batch.column(3).as_string::<i32>();
        assert_eq!((ops.value(0), ops.value(1), ops.value(2)), ("c", "u", "d"));
        let names = batch.column(1).as_string::<i32>();
        assert_eq!((names.value(1), names.is_null(2)), ("b", true));
        let ids = batch
            .column(0)
            .as_primitive::<arrow_array::types::Int32Type>();
        assert_eq!(
            ids.values().to_vec(),
            vec![1, 1, 1],
            "the delete's row is its before image"
        );
        let lsn = batch.column(8).as_primitive::<Int64Type>();
        assert_eq!(lsn.values().to_vec(), vec![26, 27, 28]);
        assert_eq!(batch.column(10).null_count(), 3, "every value was sent");
        let changes = connector_api::ChangeColumns::of(&batch.schema()).unwrap();
        assert!(changes.is_some(), "the change columns are marked");
    }
}

#[test]
fn events_that_change_no_row_are_bad_records_and_truncates_follow_the_setting() {
    let decoding = DebeziumDecoding::json(items(), false);
    for (value, expected) in [
        (
            r#"{"before":null,"after":null,"op":"m","source":{}}"#,
            "message",
        ),
        (
            r#"{"before":null,"after":null,"op":"d"}"#,
            "without `before`",
        ),
        (
            r#"{"before":null,"after":null,"op":"c"}"#,
            "without `after`",
        ),
        (r#"{"after":{"id":1},"op":"x"}"#, "unknown operation"),
    ] {
        let err = decode(&decoding, &[value]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadRecord, "{err}");
        assert!(err.to_string().contains(expected), "{value}: {err}");
    }
    let truncate = r#"{"before":null,"after":null,"op":"t","source":{"table":"items"}}"#;
    let batch = decode(&decoding, &[truncate]).unwrap();
    assert_eq!(batch.column(3).as_string::<i32>().value(0), "t");
    assert!(batch.column(0).is_null(0));
    let refusing = DebeziumDecoding::json(items(), false).with_truncate(Truncate::Refuse);
    let err = decode(&refusing, &[truncate]).unwrap_err();
    assert!(err.to_string().contains("truncate = \"refuse\""), "{err}");
    let wrapped = DebeziumDecoding::json(items(), true);
    let err = decode(&wrapped, &[INSERT]).unwrap_err();
    assert!(err.to_string().contains("payload"), "{err}");
}

#[test]
fn semantic_types_are_read_as_written_and_placeholders_never_become_values() {
    let table = columns(&[
        JsonField::new("id", "int32", false),
        JsonField::new("amount", "decimal(10, 2)", true),
        JsonField::new("at", "timestamp(us)", true),
        JsonField::new("body", "string", true),
    ]);
    let decoding = DebeziumDecoding::json(table, true);
    let schema = r#"{"type":"struct","fields":[{"type":"struct","field":"after","fields":[
        {"type":"int32","field":"id"},
        {"type":"bytes","name":"org.apache.kafka.connect.data.Decimal","parameters":{"scale":"2","connect.decimal.precision":"10"},"field":"amount"},
        {"type":"int64","name":"io.debezium.time.Timestamp","field":"at"},
        {"type":"string","field":"body"}]}]}"#;
    let event = format!(
        r#"{{"schema":{schema},"payload":{{"before":null,"after":{{"id":7,"amount":"MDk=","at":1700000000123,"body":"__debezium_unavailable_value"}},"op":"u","ts_ms":1}}}}"#
    );
    let batch = decode(&decoding, &[&event]).unwrap();
    assert_eq!(
        batch
            .column(1)
            .as_primitive::<Decimal128Type>()
            .value_as_string(0),
        "123.45"
    );
    assert_eq!(
        batch
            .column(2)
            .as_primitive::<TimestampMicrosecondType>()
            .value(0),
        1_700_000_000_123_000,
        "milliseconds read as milliseconds"
    );
    assert!(batch.column(3).is_null(0), "the placeholder is not a value");
    let unavailable = batch
        .column_by_name(UNAVAILABLE_COLUMN)
        .unwrap()
        .as_list::<i32>();
    assert_eq!(unavailable.value(0).as_string::<i32>().value(0), "body");

    // A precise decimal declared as a string would land as base64 text: refused, saying what to declare.
    let as_text = DebeziumDecoding::json(
        columns(&[
            JsonField::new("id", "int32", false),
            JsonField::new("amount", "string", true),
        ]),
        true,
    );
    let err = decode(&as_text, &[&event]).unwrap_err();
    assert!(err.to_string().contains("declare it decimal"), "{err}");
}
