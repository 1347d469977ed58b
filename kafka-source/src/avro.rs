//! Avro values (or keys), in either standard framing: Confluent's wire format (`0x00`, a 4-byte big-endian schema
//! id, the Avro body) or Avro's single-object encoding (`0xC3 0x01`, the schema's 64-bit Rabin fingerprint, the
//! body), decoded by arrow-avro straight into Arrow columns. The writer schema is either declared (one schema,
//! one id or fingerprint) or looked up in a schema registry by the id each record carries
//! ([`AvroDecoding::from_registry`]), every record then read as one reader schema.

use std::sync::Arc;

use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{ArrowError, SchemaRef};
use connector_api::{Error, ErrorKind, Evolution, Phase, Result};
use schema_registry::SchemaRegistry;

use crate::record::RecordAt;
use crate::registry_lookup::{RegistryLookup, confluent_id};
use crate::writer_schemas::{ReaderSchema, WriterSchemas};

/// How each Kafka value frames its Avro body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvroFraming {
    /// Confluent Schema Registry's wire format with this schema id.
    Confluent {
        /// The id the declared schema has in the registry (the values must carry it).
        schema_id: u32,
    },
    /// Avro's single-object encoding (the fingerprint is computed from the declared schema).
    SingleObject,
}

/// The Avro decoding: where writer schemas come from, and the Arrow schema of the rows.
#[derive(Debug, Clone)]
pub struct AvroDecoding {
    writers: Writers,
}

#[derive(Debug, Clone)]
pub(crate) enum Writers {
    /// One declared schema.
    Declared {
        store: SchemaStore,
        fingerprint: Fingerprint,
        schema: SchemaRef,
    },
    /// Schemas by id from a registry, read as one reader schema (widened as writers add fields, when allowed).
    Registry(Arc<WriterSchemas>),
}

fn config(what: String, e: ArrowError) -> Error {
    Error::new(ErrorKind::Config, Phase::Setup, what).with_source(e)
}

impl AvroDecoding {
    /// The decoding of values written with `writer_schema` (Avro schema JSON), framed as `framing`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the schema does not parse or has no Arrow equivalent.
    pub fn new(writer_schema: &str, framing: AvroFraming) -> Result<Self> {
        let what = |what: &str| format!("the Kafka source's Avro schema {what}");
        let schema = AvroSchema::new(writer_schema.to_string());
        let (store, fingerprint) = match framing {
            AvroFraming::Confluent { schema_id } => {
                let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
                let fingerprint = store
                    .set(Fingerprint::Id(schema_id), schema)
                    .map_err(|e| config(what("cannot be registered"), e))?;
                (store, fingerprint)
            }
            AvroFraming::SingleObject => {
                let mut store = SchemaStore::new();
                let fingerprint = store
                    .register(schema)
                    .map_err(|e| config(what("does not parse"), e))?;
                (store, fingerprint)
            }
        };
        let schema = Writers::declared_decoder(&store, fingerprint, 1)
            .map_err(|e| config(what("has no Arrow equivalent"), e))?
            .schema();
        Ok(Self {
            writers: Writers::Declared {
                store,
                fingerprint,
                schema,
            },
        })
    }

    /// The decoding of Confluent-framed values whose writer schemas are in `registry`, each record read as
    /// `reader` (its fields are the columns). With `evolution` `add-columns`, a writer schema with new top-level
    /// fields widens the reader (the batches from then on have the new columns, nullable) instead of being refused;
    /// with `evolve`, so does a writer schema that widens a field's type (int to long, float to double, a decimal's
    /// precision up at the same scale) or makes a required field optional (a union with null). A job reading
    /// with it must follow [`KafkaSource::schema_change`](crate::KafkaSource::schema_change) (the source holds the
    /// first batch of the new schema until the job accepts it). Must be called inside a tokio runtime: the
    /// consumer thread looks up new schema ids through it.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema does not parse or has no Arrow equivalent.
    pub fn from_registry(
        registry: SchemaRegistry,
        reader: ReaderSchema,
        evolution: Evolution,
    ) -> Result<Self> {
        let writers = WriterSchemas::new(RegistryLookup::new(registry)?, reader, evolution, false)?;
        Ok(Self {
            writers: Writers::Registry(Arc::new(writers)),
        })
    }

    /// As [`from_registry`](Self::from_registry), for change events (Debezium's envelopes): a writer schema older
    /// than the reader (a smaller id) whose row images (`before`, `after`) have fields the reader lacks, a column
    /// dropped from the table since, is read without them (they are left out, and the records counted in
    /// `ratchet_source_dropped_column_records_total`) instead of refused, so a backlog written before the column
    /// was dropped is still read. A newer writer whose row images have new fields (a column added to the table
    /// while the job runs) widens the reader like a new top-level field when `evolution` adds columns: they are
    /// new columns of the rows.
    ///
    /// # Errors
    /// As [`from_registry`](Self::from_registry).
    pub fn for_change_events(
        registry: SchemaRegistry,
        reader: ReaderSchema,
        evolution: Evolution,
    ) -> Result<Self> {
        let writers = WriterSchemas::new(RegistryLookup::new(registry)?, reader, evolution, true)?;
        Ok(Self {
            writers: Writers::Registry(Arc::new(writers)),
        })
    }

    /// The Arrow schema of the decoded rows (for a registry-backed decoding that evolves: of the current reader
    /// schema).
    pub fn schema(&self) -> SchemaRef {
        match &self.writers {
            Writers::Declared { schema, .. } => schema.clone(),
            Writers::Registry(writers) => writers.current().arrow.clone(),
        }
    }

    /// The current reader schema of a registry-backed decoding.
    pub fn reader_schema(&self) -> Option<ReaderSchema> {
        match &self.writers {
            Writers::Declared { .. } => None,
            Writers::Registry(writers) => Some(writers.current().reader.clone()),
        }
    }

    pub(crate) fn writers(&self) -> &Writers {
        &self.writers
    }

    /// Looks up the writer schema of a Confluent-framed `value` in the registry, if it is new (a no-op for a
    /// declared schema).
    ///
    /// # Errors
    /// As `WriterSchemas::resolve`.
    pub(crate) fn learn_schema(&self, at: RecordAt<'_>, value: &[u8]) -> Result<()> {
        match (&self.writers, confluent_id(value)) {
            (Writers::Registry(writers), Some(id)) => writers.resolve(id, at),
            _ => Ok(()),
        }
    }
}

impl Writers {
    /// A decoder of a declared schema for batches of up to `rows` rows.
    pub(crate) fn declared_decoder(
        store: &SchemaStore,
        fingerprint: Fingerprint,
        rows: usize,
    ) -> std::result::Result<Decoder, ArrowError> {
        ReaderBuilder::new()
            .with_batch_size(rows.max(1))
            .with_writer_schema_store(store.clone())
            .with_active_fingerprint(fingerprint)
            .build_decoder()
    }
}
