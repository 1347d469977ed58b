//! The job's dead-letter topic (`[dead_letter]`): records the source cannot decode, and rows a sink refuses, go
//! there with the reason and where they came from, instead of stopping the job.
//!
//! Exactly once like everything else: the dead-letter topic is written by a Kafka sink of its own in the
//! subtask's checkpoints (transactional, id `dead-letter`), so a dead letter becomes visible with the checkpoint
//! that moved the source past its record, and a replay never writes it twice.
//!
//! A dead-letter record's key and value are the source record's bytes (undecodable records, and tombstones a sink
//! refused: their key, a null value) or the refused row as a JSON object (rows a sink refused, found by splitting
//! the refused batch until single rows remain; the other sinks still get the row). Headers: the source record's own
//! headers first (undecodable records; a refused row carries its metadata columns, headers included, in its JSON),
//! then `ratchet.error` (why), `ratchet.sink` (the sink that refused the row or tombstone; absent for
//! decoding failures), `ratchet.source.topic`, and `ratchet.source.partition` / `ratchet.source.offset` (for rows a
//! sink refused, when the rows carry them: the text and binary decodings do, other rows when `[source.metadata]`
//! adds `partition` and `offset` under those names).

use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, MapBuilder, StringBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use connector_api::{
    DeliveryGuarantee, DynSink, Error, ErrorKind, Phase, Result, SinkId, SubtaskId,
};
use kafka_sink::{KafkaSink, KafkaSinkConfig, RecordMapping};
use kafka_source::{RejectedRecord, Tombstone};

use crate::config::{DEAD_LETTER_SINK_ID, DeadLetterConfig, JobConfig};

/// Why the record was refused.
pub const ERROR_HEADER: &str = "ratchet.error";
/// The sink that refused the row.
pub const SINK_HEADER: &str = "ratchet.sink";
/// The source record's topic.
pub const TOPIC_HEADER: &str = "ratchet.source.topic";
/// The source record's partition.
pub const PARTITION_HEADER: &str = "ratchet.source.partition";
/// The source record's offset.
pub const OFFSET_HEADER: &str = "ratchet.source.offset";

const HEADERS: [&str; 5] = [
    ERROR_HEADER,
    SINK_HEADER,
    TOPIC_HEADER,
    PARTITION_HEADER,
    OFFSET_HEADER,
];

/// The column of the source record's own headers in a dead-letter batch.
const SOURCE_HEADERS: &str = "source_headers";

/// The batches the dead-letter sink takes: `key`, `value` (bytes), the source record's headers (a map) and one
/// text column per Ratchet header.
pub fn schema() -> SchemaRef {
    let mut fields = vec![
        Field::new("key", DataType::Binary, true),
        Field::new("value", DataType::Binary, true),
        Field::new(
            SOURCE_HEADERS,
            kafka_source::headers_field().data_type().clone(),
            false,
        ),
    ];
    fields.extend(HEADERS.iter().map(|h| Field::new(*h, DataType::Utf8, true)));
    Arc::new(Schema::new(fields))
}

/// The exactly-once Kafka sink of subtask `subtask` writing `config`'s topic on the source's cluster (with the
/// source's connection settings); transactional ids `<prefix>-<subtask>-<slot>`, prefix `<job>-dead-letter` unless
/// configured.
///
/// # Errors
/// As [`KafkaSink::new`].
pub fn sink(job: &JobConfig, config: &DeadLetterConfig, subtask: SubtaskId) -> Result<DynSink> {
    let prefix = config
        .transactional_id_prefix
        .clone()
        .unwrap_or_else(|| format!("{}-dead-letter", job.job.name));
    let mut sink = KafkaSinkConfig::new(&job.source.bootstrap_servers, &config.topic, prefix);
    sink.job = Some(job.job.name.clone());
    sink.client = job
        .source
        .client
        .iter()
        .filter(|(k, _)| kafka_source::is_connection_setting(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    sink.records = RecordMapping {
        key_column: Some("key".into()),
        value_column: Some("value".into()),
        header_columns: HEADERS.iter().map(|h| h.to_string()).collect(),
        headers_column: Some(SOURCE_HEADERS.into()),
        ..RecordMapping::default()
    };
    let id = SinkId::new(DEAD_LETTER_SINK_ID)?;
    Ok(DynSink::new(
        KafkaSink::new(sink, id, subtask)?,
        DeliveryGuarantee::ExactlyOnce,
    ))
}

/// One dead letter before it becomes a row.
struct Letter<'a> {
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    /// The source record's headers.
    headers: Vec<(&'a str, Option<&'a [u8]>)>,
    error: &'a str,
    sink: Option<&'a str>,
    topic: &'a str,
    partition: Option<i32>,
    offset: Option<i64>,
}

fn batch(letters: &[Letter<'_>]) -> Result<RecordBatch> {
    let mut keys = BinaryBuilder::new();
    let mut values = BinaryBuilder::new();
    let mut headers = MapBuilder::new(None, StringBuilder::new(), BinaryBuilder::new());
    let mut text: Vec<StringBuilder> = HEADERS.iter().map(|_| StringBuilder::new()).collect();
    for letter in letters {
        keys.append_option(letter.key);
        values.append_option(letter.value);
        for (name, value) in &letter.headers {
            headers.keys().append_value(name);
            headers.values().append_option(*value);
        }
        headers.append(true).map_err(|e| {
            Error::new(ErrorKind::Bug, Phase::Write, "cannot build dead letters").with_source(e)
        })?;
        text[0].append_value(letter.error);
        text[1].append_option(letter.sink);
        text[2].append_value(letter.topic);
        text[3].append_option(letter.partition.map(|p| p.to_string()));
        text[4].append_option(letter.offset.map(|o| o.to_string()));
    }
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(keys.finish()),
        Arc::new(values.finish()),
        Arc::new(headers.finish()),
    ];
    columns.extend(text.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
    RecordBatch::try_new(schema(), columns).map_err(|e| {
        Error::new(ErrorKind::Bug, Phase::Write, "cannot build dead letters").with_source(e)
    })
}

/// Dead letters for records the source could not decode.
///
/// # Errors
/// Only a bug.
pub fn from_rejected(records: &[RejectedRecord]) -> Result<RecordBatch> {
    let letters: Vec<Letter<'_>> = records
        .iter()
        .map(|r| Letter {
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers: r
                .headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_deref()))
                .collect(),
            error: &r.reason,
            sink: None,
            topic: &r.topic,
            partition: Some(r.partition),
            offset: Some(r.offset),
        })
        .collect();
    batch(&letters)
}

/// Dead letters for tombstones `sink` refused (a key it cannot read), and why: the tombstone as it was read (its
/// key, a null value) with the sink and the source coordinates in headers.
///
/// # Errors
/// Only a bug.
pub fn from_refused_tombstones(
    refused: &[(Tombstone, String)],
    sink: &SinkId,
) -> Result<RecordBatch> {
    let sink = sink.to_string();
    let letters: Vec<Letter<'_>> = refused
        .iter()
        .map(|(tombstone, error)| Letter {
            key: tombstone.key.as_deref(),
            value: None,
            headers: Vec::new(),
            error,
            sink: Some(&sink),
            topic: &tombstone.topic,
            partition: Some(tombstone.partition),
            offset: Some(tombstone.offset),
        })
        .collect();
    batch(&letters)
}

/// Dead letters for rows `sink` refused (`refused`: single-row batches and why), read from `topic`.
///
/// # Errors
/// A row that cannot be written as JSON (a bug).
pub fn from_refused_rows(
    refused: &[(RecordBatch, String)],
    sink: &SinkId,
    topic: &str,
) -> Result<RecordBatch> {
    let rows = refused
        .iter()
        .map(|(row, _)| row_json(row))
        .collect::<Result<Vec<_>>>()?;
    let sink = sink.to_string();
    let letters: Vec<Letter<'_>> = refused
        .iter()
        .zip(&rows)
        .map(|((row, error), json)| Letter {
            key: None,
            value: Some(json),
            headers: Vec::new(),
            error,
            sink: Some(&sink),
            topic,
            partition: row
                .column_by_name("partition")
                .and_then(|c| c.as_primitive_opt::<Int32Type>())
                .map(|c| c.value(0)),
            offset: row
                .column_by_name("offset")
                .and_then(|c| c.as_primitive_opt::<Int64Type>())
                .map(|c| c.value(0)),
        })
        .collect();
    batch(&letters)
}

/// Dead letters for the rows of `input` (the source's rows as the transforms saw them, read from `topic`) that a
/// transform failed on: the row as a JSON object, the transform and expression in `ratchet.error`, the sink whose
/// `select` failed in `ratchet.sink` (absent when a `[[transforms]]` entry failed: no sink got the row), and the
/// record's partition and offset.
///
/// # Errors
/// A row that cannot be written as JSON (a bug).
pub fn from_failed_transforms(
    input: &RecordBatch,
    failures: &[crate::job::shaping::ShapingFailure],
    topic: &str,
) -> Result<RecordBatch> {
    let rows = failures
        .iter()
        .map(|f| row_json(&input.slice(f.row, 1)))
        .collect::<Result<Vec<_>>>()?;
    let texts: Vec<(String, Option<String>)> = failures
        .iter()
        .map(|f| {
            (
                f.failure.to_string(),
                f.sink.as_ref().map(|s| s.to_string()),
            )
        })
        .collect();
    let letters: Vec<Letter<'_>> = failures
        .iter()
        .zip(&rows)
        .zip(&texts)
        .map(|((f, json), (error, sink))| Letter {
            key: None,
            value: Some(json),
            headers: Vec::new(),
            error,
            sink: sink.as_deref(),
            topic,
            partition: f.position.map(|(p, _)| p),
            offset: f.position.map(|(_, o)| o),
        })
        .collect();
    batch(&letters)
}

/// A one-row batch as a JSON object.
fn row_json(row: &RecordBatch) -> Result<Vec<u8>> {
    let mut writer = arrow_json::LineDelimitedWriter::new(Vec::new());
    writer
        .write(row)
        .and_then(|()| writer.finish())
        .map_err(|e| {
            Error::new(ErrorKind::Bug, Phase::Write, "cannot write a row as JSON").with_source(e)
        })?;
    let mut json = writer.into_inner();
    while json.last() == Some(&b'\n') {
        json.pop();
    }
    Ok(json)
}
