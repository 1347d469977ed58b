//! Debezium change events: each value an envelope (`before`, `after`, `op`, `ts_ms`, `source`) written by
//! Kafka Connect's JSON converter (with or without its `schema`/`payload` wrapper) or its Avro converter through a
//! schema registry, decoded into one row per change: the table's columns (the row after the change, or before it
//! for a delete) followed by the change columns a sink applies or keeps ([`connector_api::ChangeColumns`]).
//!
//! | column | type | from |
//! |---|---|---|
//! | `__op` | string | `op`: `c` insert, `u` update, `r` snapshot read, `d` delete, `t` truncate |
//! | `__ts_ms` | int64 | `ts_ms`: when the connector processed the change |
//! | `__source_ts_ms` | int64 | `source.ts_ms`: when the database made the change |
//! | `__source_db` | string | `source.db` |
//! | `__source_table` | string | `source.table` |
//! | `__source_lsn` | int64 | `source.lsn` (PostgreSQL; null from other connectors) |
//! | `__source_tx_id` | int64 | `source.txId` (PostgreSQL; null from other connectors) |
//! | `__unavailable` | list of strings | the columns whose value the event does not carry (see below); null when none |
//!
//! **Values as they were.** Debezium's semantic types become the Arrow types that hold them exactly
//! ([`semantic`]): `Decimal` a decimal of its precision and scale, `VariableScaleDecimal` (a `numeric` without a
//! scale) decimal text, `Date` a date, `Time` / `MicroTime` / `NanoTime` times and `Timestamp` /
//! `MicroTimestamp` / `NanoTimestamp` local date-times in their unit, `ZonedTimestamp` an instant, `Json` JSON
//! text, `Uuid` a UUID. The Avro converter's schemas say so in `connect.name`; the JSON converter's in each
//! event's `schema` (with `schemas.enable=true`), which then also decides how a declared column reads its value.
//!
//! **Unavailable values.** Under PostgreSQL's default `REPLICA IDENTITY`, an update that does not change a TOASTed
//! column carries Debezium's placeholder (`__debezium_unavailable_value`, the connector's
//! `unavailable.value.placeholder`) instead of its value. The placeholder never becomes a value: the column is
//! null in the row and named in `__unavailable`, so a keyed sink leaves the column as it is and a changelog says
//! the value was not sent.
//!
//! The tombstone Debezium writes after each delete (`tombstones.on.delete`, so log compaction can drop the key)
//! carries nothing the delete event before it did not: it is read and counted, and yields no row and no deletion
//! (so a changelog holds every change once). A truncate (`t`) is a row of nulls with `__op = "t"` (keyed sinks
//! delete every row where they can), or a bad record with `truncate = "refuse"`; a message event (`m`) changes no
//! row: a bad record.

mod avro;
mod json;
pub(crate) mod semantic;

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{CHANGE_COLUMN, Error, ErrorKind, OP_COLUMN, Phase, Result};

use crate::avro::AvroDecoding;
use crate::json_rows::UnknownFields;

pub(crate) use json::DebeziumJsonRows;

/// Debezium's default placeholder of a value the event does not carry.
pub const DEFAULT_PLACEHOLDER: &str = "__debezium_unavailable_value";

pub use connector_api::UNAVAILABLE_COLUMN;

/// The source fields the change columns come from, and their columns.
const SOURCE_COLUMNS: [(&str, &str, DataType); 5] = [
    ("ts_ms", "__source_ts_ms", DataType::Int64),
    ("db", "__source_db", DataType::Utf8),
    ("table", "__source_table", DataType::Utf8),
    ("lsn", "__source_lsn", DataType::Int64),
    ("txId", "__source_tx_id", DataType::Int64),
];

/// What a truncate event does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Truncate {
    /// A row of nulls with `__op = "t"`: keyed sinks delete every row of the table (in the checkpoint's
    /// transaction, in order), changelogs keep it.
    #[default]
    Apply,
    /// A bad record (the job stops, or the event goes to the dead-letter topic).
    Refuse,
}

/// How envelopes arrive.
#[derive(Debug, Clone)]
pub(crate) enum Envelope {
    /// Kafka Connect's JSON converter; `wrapped` with `schemas.enable=true` (`{"schema": .., "payload": ..}`).
    Json { wrapped: bool },
    /// The Avro converter through a schema registry.
    Avro(AvroDecoding),
}

/// The Debezium decoding: how envelopes arrive, the table's columns, and what unavailable values and truncates
/// become.
#[derive(Debug, Clone)]
pub struct DebeziumDecoding {
    envelope: Envelope,
    /// The table's columns (every one nullable: a delete's row may hold only the key).
    columns: SchemaRef,
    /// The table's columns, then the change columns.
    schema: SchemaRef,
    placeholder: String,
    truncate: Truncate,
    unknown_fields: UnknownFields,
}

impl DebeziumDecoding {
    /// Envelopes written by Kafka Connect's JSON converter, the table's `columns` declared (the JSON decoding's
    /// types, [`crate::JsonField`]: declare each column as the type that holds it; with `schemas`, each event's
    /// Kafka Connect schema says how its values are written, e.g. a `Decimal` as base64 bytes or a `Timestamp` in
    /// milliseconds). `schemas` is the converter's `schemas.enable` (Kafka Connect's default is `true`).
    pub fn json(columns: SchemaRef, schemas: bool) -> Self {
        Self::with(Envelope::Json { wrapped: schemas }, nullable(&columns))
    }

    /// Envelopes written by the Avro converter through a schema registry (`avro` reads them: its reader schema
    /// is the topic's `Envelope` record); the table's columns are the fields of its `after` record, in the types
    /// their semantic types say (the `semantic` module). Make `avro` with [`AvroDecoding::for_change_events`], so that
    /// events written before a column was dropped are still read.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema is not a Debezium envelope (no `op`, or no `after`
    /// record).
    pub fn avro(avro: AvroDecoding) -> Result<Self> {
        let columns = row_columns(&avro.schema()).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "the Avro reader schema is not a Debezium change event envelope (a record with `op` and an \
                 `after` record): check the topic and subject the Debezium decoding reads",
            )
        })?;
        Ok(Self::with(Envelope::Avro(avro), columns))
    }

    fn with(envelope: Envelope, columns: SchemaRef) -> Self {
        Self {
            envelope,
            schema: with_change_columns(&columns),
            columns,
            placeholder: DEFAULT_PLACEHOLDER.to_string(),
            truncate: Truncate::Apply,
            unknown_fields: UnknownFields::Ignore,
        }
    }

    /// The table's columns and the rows' schema of envelopes of `envelope`'s schema: a generation of the Avro
    /// reader widened with a column added to the table while the job runs has one more column (the decoding's own,
    /// otherwise).
    pub(crate) fn columns_of(&self, envelope: &Schema) -> (SchemaRef, SchemaRef) {
        match row_columns(envelope) {
            Some(columns) if columns != self.columns => {
                let schema = with_change_columns(&columns);
                (columns, schema)
            }
            _ => (self.columns.clone(), self.schema.clone()),
        }
    }

    /// The placeholder the connector writes for a value it does not have (its `unavailable.value.placeholder`).
    pub fn with_placeholder(mut self, placeholder: impl Into<String>) -> Self {
        self.placeholder = placeholder.into();
        self
    }

    /// What a truncate event does.
    pub fn with_truncate(mut self, truncate: Truncate) -> Self {
        self.truncate = truncate;
        self
    }

    /// JSON converter: what a column in the row images that is not declared means.
    pub fn with_unknown_fields(mut self, unknown_fields: UnknownFields) -> Self {
        self.unknown_fields = unknown_fields;
        self
    }

    /// The rows' schema: the table's columns (all nullable), then the change columns; for Avro envelopes, those
    /// of the reader schema's current generation.
    pub fn schema(&self) -> SchemaRef {
        match &self.envelope {
            Envelope::Avro(avro) => self.columns_of(&avro.schema()).1,
            Envelope::Json { .. } => self.schema.clone(),
        }
    }

    /// The decoding of the envelopes themselves.
    pub(crate) fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Checks an event's operation: whether it deletes, is a truncate, or upserts; refuses the others.
    ///
    /// # Errors
    /// A message about the event (as the end of "a Debezium change event ...").
    pub(crate) fn operation(
        &self,
        op: Option<&str>,
        before: bool,
        after: bool,
    ) -> std::result::Result<Op, String> {
        match op {
            Some("d") if before => Ok(Op::Delete),
            Some("d") => Err("is a delete without `before` (the deleted row's key)".into()),
            Some("c" | "u" | "r") if after => Ok(Op::Upsert),
            Some(op @ ("c" | "u" | "r")) => Err(format!("is a change {op:?} without `after`")),
            Some("t") if self.truncate == Truncate::Apply => Ok(Op::Truncate),
            Some("t") => Err(
                "is a truncate event (`op` \"t\"), which this job refuses (truncate = \"refuse\"): skip it in the \
                 connector (skipped.operations=t) or let it go to the dead-letter topic"
                    .into(),
            ),
            Some("m") => Err(
                "is a message event (`op` \"m\"), which changes no row: skip it in the connector or let it go \
                 to the dead-letter topic"
                    .into(),
            ),
            other => Err(format!("has the unknown operation {other:?}")),
        }
    }
}

/// What an event does to its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Upsert,
    Delete,
    Truncate,
}

/// The type of [`UNAVAILABLE_COLUMN`].
fn unavailable_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, true)))
}

/// The change columns of a batch under construction.
pub(crate) struct ChangeBuilders {
    ops: StringBuilder,
    ts_ms: Int64Builder,
    source_ts_ms: Int64Builder,
    db: StringBuilder,
    table: StringBuilder,
    lsn: Int64Builder,
    tx_id: Int64Builder,
    unavailable: ListBuilder<StringBuilder>,
}

/// One event's change column values.
#[derive(Debug, Default)]
pub(crate) struct ChangeValues<'a> {
    pub(crate) op: &'a str,
    pub(crate) ts_ms: Option<i64>,
    pub(crate) source_ts_ms: Option<i64>,
    pub(crate) db: Option<&'a str>,
    pub(crate) table: Option<&'a str>,
    pub(crate) lsn: Option<i64>,
    pub(crate) tx_id: Option<i64>,
    pub(crate) unavailable: &'a [String],
}

impl ChangeBuilders {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            ops: StringBuilder::with_capacity(capacity, capacity),
            ts_ms: Int64Builder::with_capacity(capacity),
            source_ts_ms: Int64Builder::with_capacity(capacity),
            db: StringBuilder::new(),
            table: StringBuilder::new(),
            lsn: Int64Builder::with_capacity(capacity),
            tx_id: Int64Builder::with_capacity(capacity),
            unavailable: ListBuilder::new(StringBuilder::new()),
        }
    }

    pub(crate) fn append(&mut self, values: &ChangeValues<'_>) {
        self.ops.append_value(values.op);
        self.ts_ms.append_option(values.ts_ms);
        self.source_ts_ms.append_option(values.source_ts_ms);
        self.db.append_option(values.db);
        self.table.append_option(values.table);
        self.lsn.append_option(values.lsn);
        self.tx_id.append_option(values.tx_id);
        if values.unavailable.is_empty() {
            self.unavailable.append_null();
        } else {
            for column in values.unavailable {
                self.unavailable.values().append_value(column);
            }
            self.unavailable.append(true);
        }
    }

    /// The change columns, in the schema's order.
    pub(crate) fn finish(mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.ops.finish()),
            Arc::new(self.ts_ms.finish()),
            Arc::new(self.source_ts_ms.finish()),
            Arc::new(self.db.finish()),
            Arc::new(self.table.finish()),
            Arc::new(self.lsn.finish()),
            Arc::new(self.tx_id.finish()),
            Arc::new(self.unavailable.finish()),
        ]
    }
}

/// The table's columns of a Debezium Avro envelope's schema: the fields of its `after` record in the types their
/// semantic types say, every one nullable; `None` when the schema is not an envelope (no `op`, or no `after`
/// record).
fn row_columns(envelope: &Schema) -> Option<SchemaRef> {
    envelope.field_with_name("op").ok()?;
    let DataType::Struct(fields) = envelope.field_with_name("after").ok()?.data_type() else {
        return None;
    };
    let columns: Vec<Field> = fields.iter().map(|f| semantic::field(f)).collect();
    Some(nullable(&Schema::new(columns)))
}

/// `columns`, then the change columns.
fn with_change_columns(columns: &Schema) -> SchemaRef {
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
    fields.push(change_column(
        UNAVAILABLE_COLUMN,
        unavailable_type(),
        true,
        "unavailable",
    ));
    Arc::new(Schema::new(fields))
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
mod tests;
