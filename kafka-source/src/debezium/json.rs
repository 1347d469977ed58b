//! Debezium events written by Kafka Connect's JSON converter, decoded straight into rows: the envelope read for
//! its operation, source and the one row image the operation needs, that image decoded into the declared columns
//! ([`crate::json_rows`]) the way the event's Kafka Connect schema says its values are written.

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use arrow_array::RecordBatch;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{ChangeBuilders, ChangeValues, DebeziumDecoding, Envelope, Op, bad, semantic};
use crate::json_rows::{JsonRows, RowContext, Semantic};
use crate::record::{RecordAt, bad_record};
use connector_api::{Error, Phase, Result};

/// The JSON converter's wrapper with `schemas.enable=true`.
#[derive(Deserialize)]
struct Wrapped<'a> {
    #[serde(borrow, default)]
    schema: Option<&'a RawValue>,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct EventJson<'a> {
    #[serde(borrow, default)]
    before: Option<&'a RawValue>,
    #[serde(borrow, default)]
    after: Option<&'a RawValue>,
    #[serde(borrow, default)]
    op: Option<Cow<'a, str>>,
    #[serde(default)]
    ts_ms: Option<i64>,
    #[serde(borrow, default)]
    source: Option<SourceJson<'a>>,
}

#[derive(Deserialize, Default)]
struct SourceJson<'a> {
    #[serde(default)]
    ts_ms: Option<i64>,
    #[serde(borrow, default)]
    db: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    table: Option<Cow<'a, str>>,
    #[serde(default)]
    lsn: Option<i64>,
    #[serde(rename = "txId", default)]
    tx_id: Option<i64>,
}

/// The rows of one batch of JSON events.
pub(crate) struct DebeziumJsonRows {
    decoding: DebeziumDecoding,
    wrapped: bool,
    rows: JsonRows,
    changes: ChangeBuilders,
    /// The semantic types of the row images, by the hash of the Kafka Connect schema text and the image.
    semantics: HashMap<(u64, bool), Arc<HashMap<String, Semantic>>>,
}

impl DebeziumJsonRows {
    /// Builders for about `capacity` events of `decoding` (which must be a JSON one).
    pub(crate) fn new(decoding: &DebeziumDecoding, capacity: usize) -> Self {
        let wrapped = matches!(decoding.envelope(), Envelope::Json { wrapped: true });
        Self {
            rows: JsonRows::new(decoding.columns.fields(), decoding.unknown_fields, capacity),
            changes: ChangeBuilders::new(capacity),
            decoding: decoding.clone(),
            wrapped,
            semantics: HashMap::new(),
        }
    }

    /// Appends the event `value`.
    ///
    /// # Errors
    /// [`BadRecord`](connector_api::ErrorKind::BadRecord) naming the record: not an envelope, an operation that is
    /// refused, a row image without what its operation needs, a value that does not fit its column.
    pub(crate) fn append(&mut self, at: RecordAt<'_>, value: &[u8]) -> Result<()> {
        let not_json = |e: serde_json::Error| {
            bad_record(at, &format!("is not a Debezium change event in JSON: {e}"))
        };
        let (schema, payload) = match self.wrapped {
            true => {
                let wrapped: Wrapped<'_> = serde_json::from_slice(value).map_err(not_json)?;
                let payload = wrapped
                    .payload
                    .ok_or_else(|| bad_record(at, "is not a Debezium envelope (no `payload`)"))?;
                (wrapped.schema, payload.get())
            }
            false => (
                None,
                std::str::from_utf8(value).map_err(|_| bad_record(at, "is not UTF-8"))?,
            ),
        };
        let event: EventJson<'_> = serde_json::from_str(payload).map_err(not_json)?;
        let op = self
            .decoding
            .operation(
                event.op.as_deref(),
                event.before.is_some(),
                event.after.is_some(),
            )
            .map_err(|why| event_error(at, &why))?;
        let image_name = if op == Op::Delete { "before" } else { "after" };
        let semantics = match schema {
            Some(schema) if op != Op::Truncate => Some(self.semantics_of(schema.get(), image_name)),
            _ => None,
        };
        let mut context = RowContext {
            placeholder: Some(&self.decoding.placeholder),
            semantics: semantics.as_deref(),
            json_in_strings: true,
            ..RowContext::default()
        };
        match op {
            Op::Truncate => self
                .rows
                .append_null_row()
                .map_err(|why| event_error(at, &why))?,
            Op::Upsert | Op::Delete => {
                let (image, name) = match op {
                    Op::Delete => (event.before, "before"),
                    _ => (event.after, "after"),
                };
                let image = image.map(RawValue::get).unwrap_or("null");
                self.rows.append(image.as_bytes(), &mut context).map_err(|why| {
                    bad_record(at, &format!("has a row image (`{name}`) that does not fit the declared columns: {why}"))
                })?;
            }
        }
        let source = event.source.unwrap_or_default();
        self.changes.append(&ChangeValues {
            op: event.op.as_deref().unwrap_or_default(),
            ts_ms: event.ts_ms,
            source_ts_ms: source.ts_ms,
            db: source.db.as_deref(),
            table: source.table.as_deref(),
            lsn: source.lsn,
            tx_id: source.tx_id,
            unavailable: &context.unavailable,
        });
        Ok(())
    }

    /// The rows' schema.
    pub(crate) fn schema(&self) -> arrow_schema::SchemaRef {
        self.decoding.schema()
    }

    /// The semantic types of row image `image` under the Kafka Connect schema `schema`, parsed once per schema.
    fn semantics_of(&mut self, schema: &str, image: &str) -> Arc<HashMap<String, Semantic>> {
        let mut hasher = DefaultHasher::new();
        schema.hash(&mut hasher);
        let key = (hasher.finish(), image == "after");
        self.semantics
            .entry(key)
            .or_insert_with(|| Arc::new(semantic::of_connect_schema(schema, image)))
            .clone()
    }

    /// The batch of every event appended.
    ///
    /// # Errors
    /// [`BadRecord`](connector_api::ErrorKind::BadRecord) when the columns do not finish (the reader then sorts the
    /// batch out record by record).
    pub(crate) fn finish(self) -> Result<RecordBatch> {
        let rows = self.rows.len();
        let mut columns = self
            .rows
            .finish()
            .map_err(|why| bad(&format!("does not fit its columns: {why}")))?;
        columns.extend(self.changes.finish());
        RecordBatch::try_new_with_options(
            self.decoding.schema(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| {
            Error::bug(Phase::Write, "the change rows do not match their schema").with_source(e)
        })
    }
}

/// A bad record at `at`: a Debezium change event that `why`.
fn event_error(at: RecordAt<'_>, why: &str) -> Error {
    bad_record(at, &format!("(a Debezium change event) {why}"))
}
