//! A client of the Confluent Schema Registry REST API, as Confluent's registry, Apicurio Registry's
//! Confluent-compatible API (`/apis/ccompat/v7`), Redpanda and Karapace serve it: a schema by its global id
//! (`GET /schemas/ids/{id}`, cached: an id never changes meaning) and the latest version of a subject
//! (`GET /subjects/{subject}/versions/latest`, never cached), over HTTP or HTTPS (rustls, CA file, client
//! certificate), with basic or bearer authentication.
//!
//! Every request is bounded ([`RegistrySettings::request_timeout`]) and retried while the registry is unreachable
//! or answers with a server error (at most 30 s of waiting, [`connector_api::RetryPolicy::default`]); an answer
//! that refuses (bad credentials, a malformed request) is not retried. Errors name the registry's URL (never its
//! credentials) and the request.
//!
//! [`SubjectStrategy`] names the subject a topic's key or value schema is registered under, as the serializers
//! of Confluent's clients do.
//!
//! ```no_run
//! # async fn f() -> Result<(), schema_registry::RegistryError> {
//! use schema_registry::{RegistrySettings, SchemaRegistry, SubjectStrategy};
//! let registry = SchemaRegistry::new(&RegistrySettings::new("http://127.0.0.1:8081"))?;
//! let subject = SubjectStrategy::TopicName.subject("orders", false, None)?;
//! let latest = registry.latest(&subject).await?;
//! let same = registry.schema(latest.id).await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod client;
mod error;
pub mod protobuf;
mod schema;
mod settings;
mod subject;

pub use client::SchemaRegistry;
pub use error::RegistryError;
pub use schema::{RegisteredSchema, SchemaType};
pub use settings::{RegistrySettings, ServerCheckSetting};
pub use subject::SubjectStrategy;
