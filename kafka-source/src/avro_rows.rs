//! [`AvroRows`]: one batch of Avro records under construction. arrow-avro's decoder switches writer schema
//! between rows only at a batch boundary, so when a record's schema id differs from the previous record's, the
//! rows so far are flushed into a part of the batch, and the parts are joined at the end (every part has the
//! reader schema's columns). A registry-backed decoding looks up an id the decoder does not know yet before the
//! record is decoded, and builds a decoder that knows it; the rows keep the reader schema generation they started
//! with (the reader cuts the batch when the decoding's reader schema is widened).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_avro::reader::Decoder;
use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result};

use crate::avro::{AvroDecoding, Writers};
use crate::record::{RecordAt, bad_record};
use crate::registry_lookup::confluent_id;
use crate::writer_schemas::{Generation, WriterSchemas, reading_as};

/// What a registry-backed batch reads with: the decoding's schemas, the reader generation of these rows, and the
/// ids the decoder knows.
struct RegistryRows {
    schemas: Arc<WriterSchemas>,
    generation: Arc<Generation>,
    known: BTreeMap<u32, usize>,
    /// The writer whose reader of its own the decoder reads with (`None`: the generation's reader).
    reading: Option<u32>,
}

/// The rows of one batch, decoded so far.
pub(crate) struct AvroRows {
    decoder: Decoder,
    batch_size: usize,
    schema: SchemaRef,
    /// Rows of earlier writer schemas, flushed.
    parts: Vec<RecordBatch>,
    flushed_rows: usize,
    /// A registry-backed decoding's schemas.
    registry: Option<RegistryRows>,
}

impl AvroRows {
    /// Builders for `capacity` rows of `avro`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when no decoder can be built (the schemas were checked when the decoding was
    /// made, so this is not expected).
    pub(crate) fn new(avro: &AvroDecoding, capacity: usize) -> Result<Self> {
        let batch_size = capacity.max(1);
        let unusable = |e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "the Avro schema of the Kafka source is not decodable",
            )
            .with_source(e)
        };
        let (decoder, registry) = match avro.writers() {
            Writers::Declared {
                store, fingerprint, ..
            } => (
                Writers::declared_decoder(store, *fingerprint, batch_size).map_err(unusable)?,
                None,
            ),
            Writers::Registry(schemas) => {
                let generation = schemas.current();
                let (store, known) = schemas.snapshot();
                let decoder =
                    reading_as(store, &generation.reader, batch_size).map_err(unusable)?;
                let rows = RegistryRows {
                    schemas: schemas.clone(),
                    generation,
                    known,
                    reading: None,
                };
                (decoder, Some(rows))
            }
        };
        let schema = match &registry {
            Some(rows) => rows.generation.arrow.clone(),
            None => avro.schema(),
        };
        Ok(Self {
            decoder,
            batch_size,
            schema,
            parts: Vec::new(),
            flushed_rows: 0,
            registry,
        })
    }

    /// The schema of these rows: the reader schema generation they started with.
    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Whether the decoding's reader schema was widened since these rows began.
    pub(crate) fn outdated(&self) -> bool {
        self.registry
            .as_ref()
            .is_some_and(|r| r.schemas.current().number != r.generation.number)
    }

    fn rows(&self) -> usize {
        self.flushed_rows + (self.batch_size - self.decoder.capacity())
    }

    /// Moves the decoder's rows into `parts`, in the batch's schema: rows a writer's own reader decoded are
    /// converted to the generation's types exactly (checked when the writer was accepted).
    fn flush(&mut self) -> Result<()> {
        if let Some(part) = self.decoder.flush().map_err(batch_failed)? {
            let part = match part.schema() == self.schema {
                true => part,
                false => self.in_batch_schema(&part)?,
            };
            self.flushed_rows += part.num_rows();
            self.parts.push(part);
        }
        Ok(())
    }

    /// `part` (decoded by a writer's own reader) in the batch's schema, column by column.
    fn in_batch_schema(&self, part: &RecordBatch) -> Result<RecordBatch> {
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|field| match part.column_by_name(field.name()) {
                Some(column) => connector_api::types::exact::convert(column, field.data_type()).map_err(|e| {
                    Error::new(
                        ErrorKind::BadRecord,
                        Phase::Write,
                        format!("a value of field `{}` does not convert exactly to the reader's type: {e}", field.name()),
                    )
                }),
                None => Ok(arrow_array::new_null_array(field.data_type(), part.num_rows())),
            })
            .collect::<Result<Vec<_>>>()?;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(part.num_rows())),
        )
        .map_err(|e| {
            Error::bug(
                Phase::Write,
                "converted Avro rows do not fit the reader schema",
            )
            .with_source(e)
        })
    }

    /// Appends one framed Avro record; `role` (value or key) names it in errors.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) naming the record when it is not exactly one framed record of an
    /// accepted writer schema (the builder is unusable afterwards); a registry lookup's own error
    /// ([`crate::writer_schemas`]).
    pub(crate) fn append(&mut self, at: RecordAt<'_>, value: &[u8], role: &str) -> Result<()> {
        self.learn_schema(at, value)?;
        let before = self.rows();
        let not_decoded = |e| {
            bad_record(
                at,
                &format!("has a {role} that is not an Avro record of its writer schema"),
            )
            .with_source(e)
        };
        let mut read = self.decoder.decode(value).map_err(not_decoded)?;
        if read < value.len() && self.decoder.capacity() == 0 {
            // A new writer schema: the decoder read the prefix and waits for the rows so far to be flushed.
            self.flush()?;
            read += self.decoder.decode(&value[read..]).map_err(not_decoded)?;
        }
        // Exactly one row from exactly this value: an empty value or a bare framing prefix adds no row (and a
        // prefix would take the next record's bytes as its body).
        if read != value.len() || self.rows() != before + 1 {
            return Err(bad_record(
                at,
                &format!("has a {role} that is not exactly one framed Avro record"),
            ));
        }
        Ok(())
    }

    /// For a registry-backed decoding: makes sure the decoder knows the writer schema the record carries.
    fn learn_schema(&mut self, at: RecordAt<'_>, value: &[u8]) -> Result<()> {
        let Some(rows) = &self.registry else {
            return Ok(());
        };
        // Not Confluent-framed: the decoder refuses it, naming the record.
        let Some(id) = confluent_id(value) else {
            return Ok(());
        };
        if rows.schemas.drops_fields(id) {
            metrics::counter!("ratchet_source_dropped_column_records_total", "topic" => at.topic.to_string())
                .increment(1);
        }
        let wanted = rows.schemas.variant_of(id).map(|_| id);
        if rows.known.contains_key(&id) && wanted == rows.reading {
            return Ok(());
        }
        rows.schemas.resolve(id, at)?;
        let needs = rows.schemas.generation_of(id).unwrap_or_default();
        if needs > rows.generation.number {
            return Err(Error::bug(
                Phase::Write,
                format!(
                    "record {}/{}@{} needs reader schema generation {needs}, its batch reads with {}: the batch \
                     should have ended before it",
                    at.topic, at.partition, at.offset, rows.generation.number
                ),
            ));
        }
        self.flush()?;
        let Some(rows) = &mut self.registry else {
            return Ok(());
        };
        let (store, known) = rows.schemas.snapshot();
        let variant = rows.schemas.variant_of(id);
        let decoder = match &variant {
            Some(variant) => reading_as(variant.store.clone(), &variant.reader, self.batch_size),
            None => reading_as(store, &rows.generation.reader, self.batch_size),
        };
        self.decoder = decoder.map_err(|e| {
            bad_record(at, "has a writer schema arrow-avro cannot decode").with_source(e)
        })?;
        rows.reading = variant.map(|_| id);
        rows.known = known;
        Ok(())
    }

    /// The batch of every row appended.
    ///
    /// # Errors
    /// [`BadRecord`](ErrorKind::BadRecord) when the rows do not convert (the reader then sorts the batch out
    /// record by record).
    pub(crate) fn finish(mut self) -> Result<RecordBatch> {
        self.flush()?;
        match self.parts.len() {
            0 => Ok(RecordBatch::new_empty(self.schema)),
            1 => Ok(self.parts.pop().expect("one part")),
            _ => arrow_select::concat::concat_batches(&self.schema, &self.parts).map_err(|e| {
                Error::bug(Phase::Write, "Avro rows of two writer schemas do not join")
                    .with_source(e)
            }),
        }
    }
}

/// A batch of Avro records that does not convert.
fn batch_failed(e: arrow_avro::errors::AvroError) -> Error {
    Error::new(
        ErrorKind::BadRecord,
        Phase::Write,
        "a batch of Avro records does not fit the reader schema",
    )
    .with_source(e)
}
