//! Avro values (or keys), in either standard framing: Confluent's wire format (`0x00`, a 4-byte big-endian schema
//! id, the Avro body) or Avro's single-object encoding (`0xC3 0x01`, the schema's 64-bit Rabin fingerprint, the
//! body), decoded by arrow-avro straight into Arrow columns. The writer schema is either declared (one schema,
//! one id or fingerprint) or looked up in a schema registry by the id each record carries
//! ([`AvroDecoding::from_registry`]), every record then read as one reader schema.

use std::sync::Arc;

use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::{ArrowError, SchemaRef};
use connector_api::{Error, ErrorKind, Phase, Result};
use schema_registry::SchemaRegistry;

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
    schema: SchemaRef,
}

#[derive(Debug, Clone)]
pub(crate) enum Writers {
    /// One declared schema.
    Declared {
        store: SchemaStore,
        fingerprint: Fingerprint,
    },
    /// Schemas by id from a registry, read as one reader schema.
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
        Self::with_writers(
            Writers::Declared { store, fingerprint },
            &what("has no Arrow equivalent"),
        )
    }

    /// The decoding of Confluent-framed values whose writer schemas are in `registry`, each record read as
    /// `reader` (its fields are the columns). Must be called inside a tokio runtime: the consumer thread looks
    /// up new schema ids through it.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the reader schema does not parse or has no Arrow equivalent.
    pub fn from_registry(registry: SchemaRegistry, reader: ReaderSchema) -> Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::bug(
                Phase::Setup,
                "a registry-backed Avro decoding is made outside a tokio runtime",
            )
            .with_source(e)
        })?;
        let what = format!("{} has no Arrow equivalent", reader.origin);
        let writers = WriterSchemas::new(registry, runtime, reader)?;
        Self::with_writers(Writers::Registry(Arc::new(writers)), &what)
    }

    fn with_writers(writers: Writers, unusable: &str) -> Result<Self> {
        let schema = writers
            .decoder(1)
            .map_err(|e| config(unusable.to_string(), e))?
            .schema();
        Ok(Self { writers, schema })
    }

    /// The Arrow schema of the decoded rows.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The reader schema of a registry-backed decoding.
    pub fn reader_schema(&self) -> Option<&ReaderSchema> {
        match &self.writers {
            Writers::Declared { .. } => None,
            Writers::Registry(writers) => Some(writers.reader()),
        }
    }

    pub(crate) fn writers(&self) -> &Writers {
        &self.writers
    }
}

impl Writers {
    /// A decoder for batches of up to `rows` rows, knowing every writer schema accepted so far.
    pub(crate) fn decoder(&self, rows: usize) -> std::result::Result<Decoder, ArrowError> {
        let builder = ReaderBuilder::new().with_batch_size(rows.max(1));
        match self {
            Self::Declared { store, fingerprint } => builder
                .with_writer_schema_store(store.clone())
                .with_active_fingerprint(*fingerprint),
            Self::Registry(writers) => builder
                .with_writer_schema_store(writers.snapshot().0)
                .with_reader_schema(AvroSchema::new(writers.reader().schema.clone())),
        }
        .build_decoder()
    }
}
