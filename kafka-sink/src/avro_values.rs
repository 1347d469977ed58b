//! Record values as Avro through a schema registry (`records.value_format = "avro"`): each row encoded by
//! arrow-avro in Confluent's wire format (`0x00`, the schema's 4-byte id, the body), its schema derived from the
//! batches' Arrow schema and registered under the topic's value subject ([`RegisteredSubject`]) before any record
//! of it is sent. A new schema (the batches gained a column) is registered as the subject's next version, which
//! the subject's compatibility rule (BACKWARD by default) accepts: added columns are nullable with default null.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_avro::schema::{AvroSchema, FingerprintStrategy, SCHEMA_METADATA_KEY};
use arrow_avro::writer::WriterBuilder;
use arrow_avro::writer::format::AvroSoeFormat;
use arrow_schema::{Fields, Schema, SchemaRef};
use connector_api::{Error, ErrorKind, Phase, Result};
use schema_registry::{RegistrySettings, SchemaType};
use serde_json::Value;

use crate::registered_subject::RegisteredSubject;

/// The subject, and the schema registered last.
pub(crate) struct AvroValues {
    subject: RegisteredSubject,
    registered: Option<Registered>,
}

/// A registered schema: the batches' fields it is for, the Arrow schema the encoder takes (no metadata but the
/// Avro schema), and its id.
struct Registered {
    fields: Fields,
    schema: SchemaRef,
    id: u32,
}

impl AvroValues {
    /// Values of `topic` registered in the registry `settings` describe.
    ///
    /// # Errors
    /// As [`RegisteredSubject::new`].
    pub(crate) fn new(settings: &RegistrySettings, topic: &str) -> Result<Self> {
        Ok(Self {
            subject: RegisteredSubject::new(settings, topic)?,
            registered: None,
        })
    }

    /// Registers the Avro form of `schema` under the subject unless it is the one registered last.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when a column has no Avro form or the registry refuses the schema (409: the
    /// subject's compatibility rule); [`Retryable`](ErrorKind::Retryable) when the registry cannot be reached.
    pub(crate) async fn register(&mut self, schema: &Schema) -> Result<()> {
        if self
            .registered
            .as_ref()
            .is_some_and(|r| &r.fields == schema.fields())
        {
            return Ok(());
        }
        // Each field as the Avro writer takes it ([`crate::types::avro_field`]): enums keep their symbols, UUIDs
        // are marked as the writer recognises them, other dictionaries are their values.
        let plain = Schema::new(
            schema
                .fields()
                .iter()
                .map(|f| crate::types::avro_field(f))
                .collect::<Vec<_>>(),
        );
        let avro = AvroSchema::try_from(&plain).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "the batches' schema has no Avro form",
            )
            .with_source(e)
        })?;
        let text = optional_fields(&avro.json_string);
        let id = self.subject.register(&text, SchemaType::Avro).await?;
        let metadata = [(SCHEMA_METADATA_KEY.to_string(), text)].into();
        self.registered = Some(Registered {
            fields: schema.fields().clone(),
            schema: Arc::new(plain.with_metadata(metadata)),
            id,
        });
        Ok(())
    }

    /// Every row of `batch` as one Confluent-framed Avro value, with the schema registered last (which must be
    /// the batch's: [`register`](Self::register) first).
    pub(crate) fn encode(&self, batch: &RecordBatch) -> std::result::Result<Vec<Vec<u8>>, String> {
        let registered = self
            .registered
            .as_ref()
            .filter(|r| &r.fields == batch.schema().fields())
            .ok_or("the batch's schema is not registered")?;
        let columns = crate::types::avro_columns(batch, &registered.schema)?;
        let batch = RecordBatch::try_new(registered.schema.clone(), columns)
            .map_err(|e| format!("cannot encode the rows as Avro: {e}"))?;
        let mut encoder = WriterBuilder::new(registered.schema.as_ref().clone())
            .with_fingerprint_strategy(FingerprintStrategy::Id(registered.id))
            .build_encoder::<AvroSoeFormat>()
            .map_err(|e| format!("cannot encode the rows as Avro: {e}"))?;
        encoder
            .encode(&batch)
            .map_err(|e| format!("cannot encode the rows as Avro: {e}"))?;
        Ok(encoder.flush().iter().map(|row| row.to_vec()).collect())
    }
}

/// `avro` with every top-level field whose type is a union with `null` made optional: `null` first and
/// `"default": null`, so a schema that gains such a field stays BACKWARD compatible.
fn optional_fields(avro: &str) -> String {
    let Ok(mut schema) = serde_json::from_str::<Value>(avro) else {
        return avro.to_string();
    };
    if let Some(fields) = schema["fields"].as_array_mut() {
        for field in fields {
            if let Value::Array(branches) = &field["type"]
                && branches.iter().any(|b| b.as_str() == Some("null"))
            {
                let mut ordered: Vec<Value> = vec![Value::from("null")];
                ordered.extend(
                    branches
                        .iter()
                        .filter(|b| b.as_str() != Some("null"))
                        .cloned(),
                );
                field["type"] = Value::Array(ordered);
                field["default"] = Value::Null;
            }
        }
    }
    schema.to_string()
}
