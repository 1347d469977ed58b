//! Debezium change events: each value an envelope (`before`, `after`, `op`, `ts_ms`, `source`) written by
//! Kafka Connect's JSON converter (with or without its `schema`/`payload` wrapper) or its Avro converter through a
//! schema registry, decoded into one row per change: the table's columns (the row after the change, or before it
//! for a delete) followed by the change columns a sink applies or keeps ([`connector_api::ChangeColumns`]).
//!
//! | column | type | from |
//! |---|---|---|
//! | `__op` | string | `op`: `c` insert, `u` update, `r` snapshot read, `d` delete |
//! | `__ts_ms` | int64 | `ts_ms`: when the connector processed the change |
//! | `__source_ts_ms` | int64 | `source.ts_ms`: when the database made the change |
//! | `__source_db` | string | `source.db` |
//! | `__source_table` | string | `source.table` |
//! | `__source_lsn` | int64 | `source.lsn` (PostgreSQL; null from other connectors) |
//! | `__source_tx_id` | int64 | `source.txId` (PostgreSQL; null from other connectors) |
//!
//! The tombstone Debezium writes after each delete (`tombstones.on.delete`, so log compaction can drop the key)
//! carries nothing the delete event before it did not: it is read and counted, and yields no row and no deletion
//! (so a changelog holds every change once). Truncate (`t`) and message (`m`) events are bad records naming the
//! record (Debezium skips truncates by default: `skipped.operations=t`).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StructArray, new_null_array};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use connector_api::{CHANGE_COLUMN, Error, ErrorKind, OP_COLUMN, Phase, Result};

use crate::avro::AvroDecoding;

/// The source fields the change columns come from, and their columns.
const SOURCE_COLUMNS: [(&str, &str, DataType); 5] = [
    ("ts_ms", "__source_ts_ms", DataType::Int64),
    ("db", "__source_db", DataType::Utf8),
    ("table", "__source_table", DataType::Utf8),
    ("lsn", "__source_lsn", DataType::Int64),
    ("txId", "__source_tx_id", DataType::Int64),
];

/// How the envelopes themselves are decoded, before they become rows.
#[derive(Debug, Clone)]
pub(crate) enum Envelope {
    /// Kafka Connect's JSON converter: the envelope's (or its `payload` wrapper's) JSON schema.
    Json(SchemaRef),
    /// The Avro converter through a schema registry.
    Avro(AvroDecoding),
}

/// The Debezium decoding: how envelopes arrive, and the table's columns.
#[derive(Debug, Clone)]
pub struct DebeziumDecoding {
    /// Decodes the envelopes (or the JSON converter's wrapper around them).
    envelope: Envelope,
    /// The JSON converter with `schemas.enable=true`: each envelope is the `payload` field of the value.
    wrapped: bool,
    /// The table's columns (every one nullable: a delete's row may hold only the key).
    columns: SchemaRef,
    /// The table's columns, then the change columns.
    schema: SchemaRef,
}

impl DebeziumDecoding {
    /// Envelopes written by Kafka Connect's JSON converter, the table's `columns` declared (their names are the
    /// row's field names; Debezium's JSON encodes integers and floats as numbers, text and
    /// `decimal.handling.mode=string` decimals as strings, `MicroTimestamp` as microseconds). `schemas` is the
    /// converter's `schemas.enable` (Kafka Connect's default is `true`: each value is `{"schema": .., "payload":
    /// <envelope>}`).
    pub fn json(columns: SchemaRef, schemas: bool) -> Self {
        let columns = nullable(&columns);
        let row = DataType::Struct(columns.fields().clone());
        let source: Fields = SOURCE_COLUMNS
            .iter()
            .map(|(name, _, ty)| Field::new(*name, ty.clone(), true))
            .collect();
        let envelope = Fields::from(vec![
            Field::new("before", row.clone(), true),
            Field::new("after", row, true),
            Field::new("op", DataType::Utf8, true),
            Field::new("ts_ms", DataType::Int64, true),
            Field::new("source", DataType::Struct(source), true),
        ]);
        let value = match schemas {
            true => Schema::new(vec![Field::new(
                "payload",
                DataType::Struct(envelope),
                true,
            )]),
            false => Schema::new(envelope),
        };
        Self::with(Envelope::Json(Arc::new(value)), schemas, columns)
    }

    /// Envelopes written by the Avro converter through a schema registry (`avro` reads them: its reader schema
    /// is the topic's `Envelope` record); the table's columns are the fields of its `after` record.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema is not a Debezium envelope (no `op`, or no `after`
    /// record).
    pub fn avro(avro: AvroDecoding) -> Result<Self> {
        let envelope = avro.schema();
        let after = envelope
            .field_with_name("after")
            .ok()
            .map(|f| f.data_type());
        let (Some(DataType::Struct(fields)), Ok(_)) = (after, envelope.field_with_name("op"))
        else {
            return Err(Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "the Avro reader schema is not a Debezium change event envelope (a record with `op` and an \
                 `after` record): check the topic and subject the Debezium decoding reads",
            ));
        };
        let columns = nullable(&Schema::new(fields.clone()));
        Ok(Self::with(Envelope::Avro(avro), false, columns))
    }

    fn with(envelope: Envelope, wrapped: bool, columns: SchemaRef) -> Self {
        let mut fields: Vec<Field> = columns
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.push(change_column(OP_COLUMN, DataType::Utf8, false, "op"));
        fields.push(change_column("__ts_ms", DataType::Int64, true, "source"));
        for (_, column, ty) in &SOURCE_COLUMNS {
            fields.push(change_column(column, ty.clone(), true, "source"));
        }
        Self {
            envelope,
            wrapped,
            columns,
            schema: Arc::new(Schema::new(fields)),
        }
    }

    /// The rows' schema: the table's columns (all nullable), then the change columns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The decoding of the envelopes themselves.
    pub(crate) fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// One row per envelope of `decoded` (a batch of [`envelope`](Self::envelope)'s schema).
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) when an envelope has no `op`, an operation other than `c`, `u`, `r`,
    /// `d`, or lacks the row image its operation needs (`after`; `before` for a delete), naming what; the reader
    /// then sorts the batch out record by record.
    pub(crate) fn rows(&self, decoded: &RecordBatch) -> Result<RecordBatch> {
        let envelope = match self.wrapped {
            true => decoded
                .column_by_name("payload")
                .and_then(|c| c.as_struct_opt())
                .filter(|payload| payload.null_count() == 0)
                .cloned()
                .ok_or_else(|| bad("is not a Debezium envelope (no `payload`)"))?,
            false => StructArray::from(decoded.clone()),
        };
        let op = envelope
            .column_by_name("op")
            .ok_or_else(|| bad("has no `op`"))?;
        let op = arrow_cast::cast(op, &DataType::Utf8)
            .map_err(|e| bad("has an unreadable `op`").with_source(e))?;
        let ops = op.as_string::<i32>();
        let image = |name: &str| {
            envelope
                .column_by_name(name)
                .and_then(|c| c.as_struct_opt())
        };
        let (before, after) = (image("before"), image("after"));
        let present = |image: Option<&StructArray>, i: usize| image.is_some_and(|s| s.is_valid(i));
        let mut deleted = Vec::with_capacity(ops.len());
        for i in 0..ops.len() {
            match (!ops.is_null(i)).then(|| ops.value(i)) {
                Some("d") if present(before, i) => deleted.push(true),
                Some("d") => {
                    return Err(bad("is a delete without `before` (the deleted row's key)"));
                }
                Some("c" | "u" | "r") if present(after, i) => deleted.push(false),
                Some(op @ ("c" | "u" | "r")) => {
                    return Err(bad(&format!("is a change {op:?} without `after`")));
                }
                Some(op @ ("t" | "m")) => {
                    return Err(bad(&format!(
                        "is a {} event (`op` {op:?}), which changes no row: skip it in the connector \
                         (skipped.operations) or let it go to the dead-letter topic",
                        if op == "t" { "truncate" } else { "message" }
                    )));
                }
                other => return Err(bad(&format!("has the unknown operation {other:?}"))),
            }
        }
        let deleted = BooleanArray::from(deleted);
        let rows = envelope.len();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for field in self.columns.fields() {
            let side = |image: Option<&StructArray>| -> Result<ArrayRef> {
                let column = image
                    .and_then(|s| s.column_by_name(field.name()))
                    .cloned()
                    .unwrap_or_else(|| new_null_array(field.data_type(), rows));
                fitted(&column, field.data_type(), field.name())
            };
            let picked = arrow_select::zip::zip(&deleted, &side(before)?, &side(after)?)
                .map_err(|e| bad("has row images of different types").with_source(e))?;
            columns.push(picked);
        }
        columns.push(op.clone());
        columns.push(fitted(
            &envelope
                .column_by_name("ts_ms")
                .cloned()
                .unwrap_or_else(|| new_null_array(&DataType::Int64, rows)),
            &DataType::Int64,
            "ts_ms",
        )?);
        let source = envelope
            .column_by_name("source")
            .and_then(|c| c.as_struct_opt());
        for (name, _, ty) in &SOURCE_COLUMNS {
            let column = source
                .and_then(|s| s.column_by_name(name))
                .cloned()
                .unwrap_or_else(|| new_null_array(ty, rows));
            columns.push(fitted(&column, ty, &format!("source.{name}"))?);
        }
        RecordBatch::try_new(self.schema.clone(), columns)
            .map_err(|e| bad("does not fit the change rows' schema").with_source(e))
    }
}

/// `column` as `ty` (Avro strings may decode to another string type, a long to an int column).
fn fitted(column: &ArrayRef, ty: &DataType, name: &str) -> Result<ArrayRef> {
    if column.data_type() == ty {
        return Ok(column.clone());
    }
    arrow_cast::cast(column, ty)
        .map_err(|e| bad(&format!("has a field {name:?} that is not {ty}")).with_source(e))
}

fn bad(what: &str) -> Error {
    Error::new(
        ErrorKind::BadRecord,
        Phase::Write,
        format!("a Debezium change event {what}"),
    )
}

fn nullable(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ))
}

fn change_column(name: &str, ty: DataType, nullable: bool, what: &str) -> Field {
    Field::new(name, ty, nullable).with_metadata(HashMap::from([(
        CHANGE_COLUMN.to_string(),
        what.to_string(),
    )]))
}

#[cfg(test)]
mod tests {
    use arrow_array::types::Int64Type;

    use super::*;
    use crate::decode::BatchBuilder;
    use crate::decoding::Decoding;
    use crate::metadata::MetadataColumns;
    use crate::record::{RecordAt, RecordParts};

    fn columns() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("qty", DataType::Int64, true),
        ]))
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
            let decoding = DebeziumDecoding::json(columns(), schemas);
            let wrap = |envelope: &str| match schemas {
                true => format!(
                    r#"{{"schema":{{"type":"struct","optional":false}},"payload":{envelope}}}"#
                ),
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
                    "__source_tx_id"
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
            let changes = connector_api::ChangeColumns::of(&batch.schema()).unwrap();
            assert!(changes.is_some(), "the change columns are marked");
        }
    }

    #[test]
    fn events_that_change_no_row_are_bad_records() {
        let decoding = DebeziumDecoding::json(columns(), false);
        for (value, expected) in [
            (
                r#"{"before":null,"after":null,"op":"t","source":{}}"#,
                "truncate",
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
        let wrapped = DebeziumDecoding::json(columns(), true);
        let err = decode(&wrapped, &[INSERT]).unwrap_err();
        assert!(err.to_string().contains("payload"), "{err}");
    }
}
