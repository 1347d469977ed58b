//! The subject a Kafka sink registers its value schemas under (`<topic>-value`, Confluent's TopicNameStrategy),
//! shared by the registry formats (`records.value_format = "avro"`, `"json-schema"` and `"protobuf"`). Registering is idempotent
//! (the registry returns the id a subject already has for a schema); a new schema becomes the subject's next
//! version if its compatibility rule accepts it.

use connector_api::{Error, ErrorKind, Phase, Result};
use schema_registry::{RegisteredSchema, RegistrySettings, SchemaRegistry, SchemaType};

/// The registry client and the subject.
pub(crate) struct RegisteredSubject {
    registry: SchemaRegistry,
    subject: String,
}

impl RegisteredSubject {
    /// The value subject of `topic` in the registry `settings` describe.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) for registry settings that cannot make a client.
    pub(crate) fn new(settings: &RegistrySettings, topic: &str) -> Result<Self> {
        let registry = SchemaRegistry::new(settings).map_err(|e| {
            Error::new(
                ErrorKind::Config,
                Phase::Setup,
                "[registry] of the Kafka sink",
            )
            .with_source(e)
        })?;
        Ok(Self {
            registry,
            subject: format!("{topic}-value"),
        })
    }

    /// The subject's name.
    pub(crate) fn name(&self) -> &str {
        &self.subject
    }

    /// The registry client.
    pub(crate) fn registry(&self) -> &SchemaRegistry {
        &self.registry
    }

    /// The subject's latest version, if it has one.
    ///
    /// # Errors
    /// [`Retryable`](ErrorKind::Retryable) when the registry cannot be reached; the registry error's own kind when
    /// it refuses.
    pub(crate) async fn latest(&self) -> Result<Option<RegisteredSchema>> {
        match self.registry.latest(&self.subject).await {
            Ok(latest) => Ok(Some(latest)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(Error::new(
                e.kind(),
                Phase::Write,
                format!("cannot read the latest schema of subject {}", self.subject),
            )
            .with_source(e)),
        }
    }

    /// Registers `schema` (of kind `schema_type`) under the subject and returns its id.
    ///
    /// # Errors
    /// [`Config`](ErrorKind::Config) when the registry refuses the schema (409: the subject's compatibility rule;
    /// 422: not a valid schema); [`Retryable`](ErrorKind::Retryable) when the registry cannot be reached.
    pub(crate) async fn register(&self, schema: &str, schema_type: SchemaType) -> Result<u32> {
        let id = self
            .registry
            .register_as(&self.subject, schema, schema_type)
            .await
            .map_err(|e| {
                Error::new(
                    e.kind(),
                    Phase::Write,
                    format!(
                        "cannot register the records' {schema_type} schema under subject {}",
                        self.subject
                    ),
                )
                .with_source(e)
            })?;
        tracing::info!(subject = %self.subject, id, %schema_type, "Kafka sink: value schema registered");
        Ok(id)
    }
}
