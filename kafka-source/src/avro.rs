//! Avro values with a declared writer schema, in either standard framing: Confluent's wire format (`0x00`, a
//! 4-byte big-endian schema id, the Avro body) or Avro's single-object encoding (`0xC3 0x01`, the schema's 64-bit
//! Rabin fingerprint, the body). Decoded by arrow-avro straight into Arrow columns.

use arrow_avro::reader::{Decoder, ReaderBuilder};
use arrow_avro::schema::{AvroSchema, Fingerprint, FingerprintAlgorithm, SchemaStore};
use arrow_schema::SchemaRef;
use connector_api::{Error, ErrorKind, Phase, Result};

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

/// The Avro decoding: the declared writer schema, the framing, and the Arrow schema they give.
#[derive(Debug, Clone)]
pub struct AvroDecoding {
    store: SchemaStore,
    fingerprint: Fingerprint,
    schema: SchemaRef,
}

impl AvroDecoding {
    /// The decoding of values written with `writer_schema` (Avro schema JSON), framed as `framing`.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the schema does not parse or has no Arrow equivalent.
    pub fn new(writer_schema: &str, framing: AvroFraming) -> Result<Self> {
        let config = |what: &str, e: arrow_schema::ArrowError| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                format!("the Kafka source's Avro schema {what}"),
            )
            .with_source(e)
        };
        let schema = AvroSchema::new(writer_schema.to_string());
        let (store, fingerprint) = match framing {
            AvroFraming::Confluent { schema_id } => {
                let mut store = SchemaStore::new_with_type(FingerprintAlgorithm::Id);
                let fingerprint = store
                    .set(Fingerprint::Id(schema_id), schema)
                    .map_err(|e| config("cannot be registered", e))?;
                (store, fingerprint)
            }
            AvroFraming::SingleObject => {
                let mut store = SchemaStore::new();
                let fingerprint = store
                    .register(schema)
                    .map_err(|e| config("does not parse", e))?;
                (store, fingerprint)
            }
        };
        let mut decoding = Self {
            store,
            fingerprint,
            schema: std::sync::Arc::new(arrow_schema::Schema::empty()),
        };
        decoding.schema = decoding
            .decoder(1)
            .map_err(|e| config("has no Arrow equivalent", e))?
            .schema();
        Ok(decoding)
    }

    /// The Arrow schema of the decoded rows.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// A decoder for batches of up to `rows` rows.
    pub(crate) fn decoder(
        &self,
        rows: usize,
    ) -> std::result::Result<Decoder, arrow_schema::ArrowError> {
        ReaderBuilder::new()
            .with_writer_schema_store(self.store.clone())
            .with_active_fingerprint(self.fingerprint)
            .with_batch_size(rows.max(1))
            .build_decoder()
    }
}
